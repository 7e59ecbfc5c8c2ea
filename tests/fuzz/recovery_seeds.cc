// Seeds for recovery_fuzz: the log segments a real engine leaves after a crash (small, large
// compressed and raw values, deletes, keyspace records), and a chain of two L0 segments joined
// by a NEXT record written with the log writer, in the layout recovery_fuzz.cc reads.
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "coding.h"
#include "engine_fixture.h"
#include "log_payloads.h"
#include "seeds.h"
#include "slipstream/engine/engine.h"
#include "slipstream/engine/log_format.h"
#include "slipstream/engine/log_writer.h"

namespace slipstream::fuzz {
namespace {

using namespace engine;

constexpr uint32_t kSegmentSize = kRecoverySegmentSize;

// A segment's bytes up to its last non-zero one (recovery_fuzz.cc pads with zeroes again).
std::string Trimmed(const char* segment) {
  size_t n = kSegmentSize;
  while (n > 0 && segment[n - 1] == 0) n--;
  return std::string(segment, n);
}

// The input layout: two length-prefixed images, then the last one.
std::string Frame(const std::string& one, const std::string& two, const std::string& three) {
  std::string out;
  char len[4];
  EncodeFixed32(len, uint32_t(one.size()));
  out.append(len, 4);
  out += one;
  EncodeFixed32(len, uint32_t(two.size()));
  out.append(len, 4);
  out += two;
  return out + three;
}

// Runs a fresh engine through a few writes and a sync, then "crashes" (drops the handle) and
// takes its log segments from the device file.
std::string EngineSegments() {
  const std::string dir =
      PrivateDirectory("recovery", std::filesystem::temp_directory_path(), "recovery-seeds");
  EngineArena arena("recovery", RecoveryOptions(dir));
  std::unique_ptr<Engine> engine;
  if (!arena.Open(&engine).ok()) std::abort();
  KeyspaceId ks, other;
  bool ok = engine->CreateKeyspace(1, &ks).ok() && engine->CreateKeyspace(2, &other).ok();
  std::string text(3000, '\0'), noise(1500, '\0');
  for (size_t i = 0; i < text.size(); i++) text[i] = char('a' + (i * 13 + i / 7) % 26);
  for (size_t i = 0; i < noise.size(); i++) noise[i] = char((i * 2654435761u) >> 13);
  ok = ok && engine->Put(ks, "small", "value").ok() && engine->Put(ks, "big", text).ok() &&
       engine->Put(ks, "noisy", noise).ok() && engine->Put(other, "row", "x").ok();
  WriteBatch batch;
  batch.Put(ks, "a", "1");
  batch.Put(ks, "b", std::string(200, 'b'));
  batch.Delete(ks, "small");
  ok = ok && engine->Write(batch).ok() && engine->DropKeyspace(other).ok() &&
       engine->Sync(~Lsn(0)).ok();
  if (!ok) std::abort();
  engine.reset();
  std::string device;
  int fd = open((dir + "/segments").c_str(), O_RDONLY | O_CLOEXEC);
  device.resize(4 * kSegmentSize);
  if (fd < 0 || pread(fd, device.data(), device.size(), 0) != ssize_t(device.size())) std::abort();
  close(fd);
  std::filesystem::remove_all(dir);
  return Frame(Trimmed(device.data() + kSegmentSize), Trimmed(device.data() + 2 * kSegmentSize),
               std::string());
}

// The L0 log as LogSet writes it across a rotation: segment 1 (the fresh engine's, sequence 0)
// sealed by a NEXT record naming segment 3 (sequence 1), which continues the log.
std::string RotatedL0() {
  std::string first(kSegmentSize, '\0'), second(kSegmentSize, '\0');
  LogCursor a, b;
  StartLogSegment(first.data(), kSegmentSize, LogKind::kL0, 0, 1, 0x9e3779b97f4a7c15ull, &a);
  AppendRecord(first.data(), &a, LogRecordType::kKeyspaceCreate, 1, {KeyspacePayload(1, 7)});
  AppendChecksum(first.data(), &a);
  AppendRecord(first.data(), &a, LogRecordType::kPut, 2, {InlinePutPayload(1, "k1", "before")});
  AppendChecksum(first.data(), &a);
  AppendRecord(first.data(), &a, LogRecordType::kNext, 2, {NextPayload(3, 1)});
  AppendChecksum(first.data(), &a);
  StartLogSegment(second.data(), kSegmentSize, LogKind::kL0, 1, 3, 0x5eed5eed5eedull, &b);
  AppendRecord(second.data(), &b, LogRecordType::kPut, 3, {InlinePutPayload(1, "k2", "after")});
  AppendRecord(second.data(), &b, LogRecordType::kPut, 3, {InlinePutPayload(1, "k1", "again")});
  AppendChecksum(second.data(), &b);
  return Frame(Trimmed(first.data()), std::string(), Trimmed(second.data()));
}

// A crashed engine's segments, and a rotated L0 log.
std::vector<Seed> RecoverySeeds() {
  return {{"engine", EngineSegments()}, {"rotated_l0", RotatedL0()}};
}

}  // namespace
SLIPSTREAM_FUZZ_SEEDS(recovery, RecoverySeeds);
}  // namespace slipstream::fuzz
