// Bad input gets a clear error status, and on-disk damage is reported as corruption, never
// followed.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>

#include "coding.h"
#include "crc32c.h"
#include "node.h"
#include "slipstream/engine/log_scanner.h"
#include "slipstream/engine/log_writer.h"
#include "test_util.h"

namespace slipstream::engine::test {
namespace {

// Oversized keys, values and batches, and dead keyspaces, are refused without side effects.
TEST(BadInput, RefusedWithClearErrors) {
  TestEngine t;
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(1, &ks).ok());
  EXPECT_TRUE(t->CreateKeyspace(1, &ks).IsInvalidArgument());  // tag already live
  std::string big_key(t.options.max_key_size + 1, 'k');
  std::string big_value(t.options.max_value_size + 1, 'v');
  EXPECT_TRUE(t->Put(ks, big_key, "v").IsInvalidArgument());
  EXPECT_TRUE(t->Put(ks, "k", big_value).IsInvalidArgument());
  EXPECT_TRUE(t->Put(12345, "k", "v").IsInvalidArgument());
  std::string got;
  EXPECT_TRUE(t->Get(12345, "k", &got).IsInvalidArgument());
  EXPECT_TRUE(t->NewIterator(12345)->status().IsInvalidArgument());
  WriteBatch huge;
  for (int i = 0; i < 2000; i++) huge.Put(ks, "key" + std::to_string(i), std::string(90, 'x'));
  EXPECT_TRUE(t->Write(huge).IsInvalidArgument());
  EXPECT_TRUE(t->Get(ks, "key1", &got).IsNotFound());  // nothing of the refused batch landed
  ASSERT_TRUE(t->Put(ks, "a", "1").ok());
  ASSERT_TRUE(t->DropKeyspace(ks).ok());
  EXPECT_TRUE(t->DropKeyspace(ks).IsInvalidArgument());
  EXPECT_TRUE(t->Put(ks, "a", "2").IsInvalidArgument());
  EXPECT_TRUE(t->Get(ks, "a", &got).IsInvalidArgument());
  KeyspaceId again;
  ASSERT_TRUE(t->CreateKeyspace(1, &again).ok());  // the tag is free again, with a new id
  EXPECT_NE(again, ks);
  EXPECT_TRUE(t->Get(again, "a", &got).IsNotFound());  // the dropped data never reappears
  ASSERT_TRUE(t->Verify().ok());
}

// Options outside their ranges, a short arena, and attaching with other options.
TEST(BadInput, OptionsAndArenaValidated) {
  TempDir dir;
  Options o = SmallOptions(dir.path());
  Arena arena(Engine::ArenaSize(o));
  std::unique_ptr<Engine> e;
  Options bad = o;
  bad.segment_size = 3u << 20;
  EXPECT_TRUE(Engine::Open(bad, arena.base(), arena.size(), &e).IsInvalidArgument());
  bad = o;
  bad.node_size = 1024;  // cannot hold three maximal entries
  EXPECT_TRUE(Engine::Open(bad, arena.base(), arena.size(), &e).IsInvalidArgument());
  bad = o;
  bad.small_threshold = bad.large_threshold;
  EXPECT_TRUE(Engine::Open(bad, arena.base(), arena.size(), &e).IsInvalidArgument());
  bad = o;
  bad.directory.clear();
  EXPECT_TRUE(Engine::Open(bad, arena.base(), arena.size(), &e).IsInvalidArgument());
  EXPECT_TRUE(Engine::Open(o, arena.base(), arena.size() / 2, &e).IsInvalidArgument());
  ASSERT_TRUE(Engine::Open(o, arena.base(), arena.size(), &e).ok());
  std::unique_ptr<Engine> other;
  bad = o;
  bad.max_levels = 4;  // same arena size, different layout: attaching must refuse
  ASSERT_EQ(Engine::ArenaSize(bad), arena.size());
  Status s = Engine::Open(bad, arena.base(), arena.size(), &other);
  EXPECT_TRUE(s.IsInvalidArgument() && s.message().find("differ") != std::string::npos)
      << s.ToString();
}

// Flips one byte of the device file at `offset`.
void FlipByte(const std::string& path, uint64_t offset) {
  int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char c;
  ASSERT_EQ(pread(fd, &c, 1, off_t(offset)), 1);
  c = char(c ^ 0x5a);
  ASSERT_EQ(pwrite(fd, &c, 1, off_t(offset)), 1);
  close(fd);
}

// A damaged B+-tree node makes reads and Verify report Corruption instead of wrong data.
TEST(Damage, CorruptNodeIsReported) {
  TestEngine t;
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(1, &ks).ok());
  for (int i = 0; i < 5000; i++) {
    ASSERT_TRUE(t->Put(ks, "key" + std::to_string(i), std::string(40, char('a' + i % 26))).ok());
  }
  ASSERT_TRUE(t->CompactAll().ok());
  ASSERT_TRUE(t->Verify().ok());
  // Find the index segments through the stats-independent route: scan the file for leaves.
  std::string path = t.dir.path() + "/segments";
  int fd = open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  off_t size = lseek(fd, 0, SEEK_END);
  std::vector<uint64_t> leaves;
  for (off_t off = 0; off < size; off += t.options.node_size) {
    uint32_t magic = 0;
    ASSERT_EQ(pread(fd, &magic, 4, off), 4);
    if (magic == 0x4641454c) leaves.push_back(uint64_t(off));  // "LEAF"
  }
  close(fd);
  ASSERT_FALSE(leaves.empty());
  FlipByte(path, leaves[leaves.size() / 2] + 100);
  t.Reopen();
  Status v = t->Verify();
  EXPECT_TRUE(v.IsCorruption()) << v.ToString();
  int corrupt = 0, wrong = 0;
  for (int i = 0; i < 5000; i++) {
    std::string got;
    Status s = t->Get(ks, "key" + std::to_string(i), &got);
    if (s.IsCorruption()) {
      corrupt++;
    } else if (!s.ok() || got != std::string(40, char('a' + i % 26))) {
      wrong++;
    }
  }
  EXPECT_GT(corrupt, 0);
  EXPECT_EQ(wrong, 0);
  auto it = t->NewIterator(ks);
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
  }
  EXPECT_TRUE(it->status().IsCorruption()) << it->status().ToString();
}

// A damaged manifest stops Open with Corruption rather than guessing.
TEST(Damage, CorruptManifestRefusesToOpen) {
  TestEngine t;
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(1, &ks).ok());
  ASSERT_TRUE(t->Put(ks, "k", "v").ok());
  ASSERT_TRUE(t->CompactAll().ok());
  t.engine.reset();
  FlipByte(t.dir.path() + "/MANIFEST", 40);
  t.arena.Reset();
  std::unique_ptr<Engine> e;
  Status s = Engine::Open(t.options, t.arena.base(), t.arena.size(), &e);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
}

// Rewrites the MANIFEST of a closed engine through `edit` (given the image without its
// checksum) and gives it a checksum that matches, so that only the structure can object.
void EditManifest(const std::string& dir, const std::function<void(std::string*)>& edit) {
  std::string path = dir + "/MANIFEST";
  std::ifstream in(path, std::ios::binary);
  std::string image((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(image.size(), 4u);
  image.resize(image.size() - 4);
  edit(&image);
  char crc[4];
  EncodeFixed32(crc, crc32c::Value(image.data(), image.size()));
  image.append(crc, 4);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(image.data(), std::streamsize(image.size()));
}

// A manifest keyspace in a state NextManifest never records, or listed twice, is refused with
// Corruption even when the checksum matches (found by tests/fuzz/manifest_fuzz.cc).
TEST(Damage, ManifestKeyspaceInImpossibleStateRefusesToOpen) {
  for (int damage = 0; damage < 2; damage++) {
    TestEngine t;
    KeyspaceId ks;
    ASSERT_TRUE(t->CreateKeyspace(1, &ks).ok());
    ASSERT_TRUE(t->Put(ks, "k", "v").ok());
    ASSERT_TRUE(t->CompactAll().ok());  // writes a manifest that records the keyspace
    t.engine.reset();
    // The keyspaces end the manifest: count, then (tag u64, id u32, state u32) each.
    EditManifest(t.dir.path(), [&](std::string* image) {
      ASSERT_EQ(DecodeFixed32(image->data() + image->size() - 20), 1u);
      if (damage == 0) {
        EncodeFixed32(image->data() + image->size() - 4, 7);  // no such state
      } else {
        std::string record = image->substr(image->size() - 16);
        EncodeFixed32(image->data() + image->size() - 20, 2);
        image->append(record);  // the same id again
      }
    });
    t.arena.Reset();
    std::unique_ptr<Engine> e;
    Status s = Engine::Open(t.options, t.arena.base(), t.arena.size(), &e);
    EXPECT_TRUE(s.IsCorruption()) << damage << ": " << s.ToString();
  }
}

// A device file bigger than max_device_size allows is refused: the segment table and the
// mapping end there, and the manifest may name segments beyond both.
TEST(Damage, DeviceFileBeyondMaxDeviceSizeRefusesToOpen) {
  TestEngine t;
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(1, &ks).ok());
  ASSERT_TRUE(t->Put(ks, "k", "v").ok());
  t.engine.reset();
  std::filesystem::resize_file(t.dir.path() + "/segments",
                               t.options.max_device_size + 16 * uint64_t(t.options.segment_size));
  t.arena.Reset();
  std::unique_ptr<Engine> e;
  Status s = Engine::Open(t.options, t.arena.base(), t.arena.size(), &e);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.message().find("max_device_size"), std::string::npos) << s.ToString();
}

// The device file's bytes, and writing some of them back.
std::string ReadDevice(const std::string& dir) {
  std::ifstream in(dir + "/segments", std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void WriteDevice(const std::string& dir, uint64_t offset, std::string_view bytes) {
  int fd = open((dir + "/segments").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(pwrite(fd, bytes.data(), bytes.size(), off_t(offset)), ssize_t(bytes.size()));
  close(fd);
}

// The first segment of the device image whose log header is whole and of `kind`.
uint32_t FindLogSegment(const std::string& device, uint32_t segment_size, LogKind kind) {
  for (uint32_t seg = 1; uint64_t(seg + 1) * segment_size <= device.size(); seg++) {
    LogScan scan = ScanLogSegment(device.data() + uint64_t(seg) * segment_size, segment_size);
    if (scan.header_ok && scan.header.kind == uint32_t(kind)) return seg;
  }
  return 0;
}

// A large value whose segment's header is damaged did not survive, even though its own record
// is intact: recovery cuts the log before the put that points at it (the segment is started
// afresh, which would otherwise leave the put pointing at zeroes). Found by
// tests/fuzz/recovery_fuzz.cc.
TEST(Damage, LargeValueInSegmentWithDamagedHeaderIsNotReplayed) {
  TestEngine t;
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(1, &ks).ok());
  ASSERT_TRUE(t->Put(ks, "small", "v").ok());
  ASSERT_TRUE(t->Put(ks, "big", Value(5000, 3)).ok());
  ASSERT_TRUE(t->Sync(~Lsn(0)).ok());
  t.engine.reset();  // a crash: nothing compacted
  std::string device = ReadDevice(t.dir.path());
  uint32_t large = FindLogSegment(device, t.options.segment_size, LogKind::kLarge);
  ASSERT_NE(large, 0u);
  FlipByte(t.dir.path() + "/segments", uint64_t(large) * t.options.segment_size);  // the magic
  t.arena.Reset();
  t.Open();
  std::string got;
  EXPECT_TRUE(t->Get(ks, "small", &got).ok());
  Status s = t->Get(ks, "big", &got);
  EXPECT_TRUE(s.IsNotFound()) << s.ToString();
  EXPECT_TRUE(t->Verify().ok());
}

// NEXT records that lead back to a segment already in the chain make recovery stop with
// Corruption instead of following them for ever.
TEST(Damage, NextRecordsInACycleRefuseToOpen) {
  TestEngine t;
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(1, &ks).ok());
  ASSERT_TRUE(t->Put(ks, "k", "v").ok());
  ASSERT_TRUE(t->Sync(~Lsn(0)).ok());
  t.engine.reset();
  uint32_t size = t.options.segment_size;
  std::string device = ReadDevice(t.dir.path());
  uint32_t l0 = FindLogSegment(device, size, LogKind::kL0);
  ASSERT_NE(l0, 0u);
  uint32_t spare = uint32_t(device.size() / size) - 1;  // a free segment at the device's end
  ASSERT_EQ(ScanLogSegment(device.data() + uint64_t(spare) * size, size).header_ok, false);
  // Seal the L0 segment with a NEXT record naming the spare segment, as Rotate does...
  std::string first(device.data() + uint64_t(l0) * size, size);
  LogScan scan = ScanLogSegment(first.data(), size);
  LogCursor cursor{scan.valid_end, scan.chain};
  char next[12];
  EncodeFixed32(next, spare);
  EncodeFixed64(next + 4, scan.header.sequence + 1);
  AppendRecord(first.data(), &cursor, LogRecordType::kNext, 2, {std::string_view(next, 12)});
  AppendChecksum(first.data(), &cursor);
  // ...and make the spare segment's own NEXT record lead back to the first one.
  std::string second(size, '\0');
  StartLogSegment(second.data(), size, LogKind::kL0, scan.header.sequence + 1, spare, 99, &cursor);
  EncodeFixed32(next, l0);
  EncodeFixed64(next + 4, scan.header.sequence);
  AppendRecord(second.data(), &cursor, LogRecordType::kNext, 3, {std::string_view(next, 12)});
  AppendChecksum(second.data(), &cursor);
  WriteDevice(t.dir.path(), uint64_t(l0) * size, first);
  WriteDevice(t.dir.path(), uint64_t(spare) * size, second);
  t.arena.Reset();
  // In a child with a deadline: without the check, recovery never returns.
  pid_t pid = fork();
  if (pid == 0) {
    alarm(20);
    std::unique_ptr<Engine> e;
    Status s = Engine::Open(t.options, t.arena.base(), t.arena.size(), &e);
    _exit(s.IsCorruption() ? 0 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

// Copies out every segment ShipLevels reports, as a forwarder to a replica does.
class CopyingObserver : public EngineObserver {
 public:
  void OnCompactionSegment(const CompactionSegmentEvent& event) override {
    copied_ += std::string(event.bytes).size();
  }

 private:
  size_t copied_ = 0;
};

// A bloom directory (which has no checksum) listing a segment far off the device: lookups
// still find every key (the filter admits what it cannot read), Verify reports the directory,
// and ShipLevels refuses it instead of reading off the device mapping. Only levels above the
// deepest have a filter, so the load leaves rows in L1 and L2; every directory on the device
// (live or left by a retired tree) is damaged.
TEST(Damage, BloomDirectoryListingForeignSegmentIsReported) {
  TestEngine t;
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(1, &ks).ok());
  int keys = 0;
  auto level_entries = [&](uint32_t level) {
    for (const LevelStats& l : t->GetStats().levels) {
      if (l.level == level) return l.entries;
    }
    return uint64_t(0);
  };
  while (keys < 60000 && (level_entries(2) == 0 || level_entries(1) == 0)) {
    for (int i = 0; i < 1000; i++, keys++) {
      ASSERT_TRUE(t->Put(ks, "key" + std::to_string(keys), Value(300, keys)).ok());
    }
    while (t->DoBackgroundWork()) {
    }
  }
  ASSERT_GT(level_entries(1), 0u);
  ASSERT_GT(level_entries(2), 0u);
  ASSERT_TRUE(t->Verify().ok());
  t.engine.reset();
  std::string device = ReadDevice(t.dir.path());
  char far[4];
  EncodeFixed32(far, 0x7fffffff);
  int dirs = 0;
  for (uint64_t off = t.options.node_size; off + 4 <= device.size(); off += t.options.node_size) {
    if (DecodeFixed32(device.data() + off) != kBloomDirMagic) continue;
    WriteDevice(t.dir.path(), off + 32, std::string_view(far, 4));  // its first bloom segment
    dirs++;
  }
  ASSERT_GT(dirs, 0);
  t.arena.Reset();
  t.Open();
  for (int i = 0; i < keys; i += 97) {
    std::string got;
    ASSERT_TRUE(t->Get(ks, "key" + std::to_string(i), &got).ok()) << i;
  }
  Status v = t->Verify();
  EXPECT_TRUE(v.IsCorruption()) << v.ToString();
  CopyingObserver observer;
  Status s = t->ShipLevels(&observer);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
}

// A damaged large-log record is reported when its value is read, never returned.
TEST(Damage, CorruptLargeValueIsReported) {
  TestEngine t;
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(1, &ks).ok());
  std::mt19937 rng(7);
  std::string value(5000, '\0');
  for (char& c : value) c = char(rng());
  ASSERT_TRUE(t->Put(ks, "big", value).ok());
  ASSERT_TRUE(t->CompactAll().ok());
  std::string path = t.dir.path() + "/segments";
  int fd = open(path.c_str(), O_RDONLY);
  off_t size = lseek(fd, 0, SEEK_END);
  std::string file(size_t(size), '\0');
  ASSERT_EQ(pread(fd, file.data(), file.size(), 0), size);
  close(fd);
  size_t pos = file.find(value.substr(100, 64));
  ASSERT_NE(pos, std::string::npos);
  FlipByte(path, pos + 10);
  t.Reopen();
  std::string got;
  Status s = t->Get(ks, "big", &got);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_TRUE(t->Verify().IsCorruption());
}

}  // namespace
}  // namespace slipstream::engine::test
