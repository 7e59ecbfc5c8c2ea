// Fuzzes recovery (recovery.cc) end to end on the log segments a crash leaves: Engine::Open
// over a directory whose MANIFEST is a fresh engine's and whose device holds the input's
// segments, so that recovery follows the logs' chains (NEXT records), parses every L0 record
// (puts, deletes, keyspace records, large-value pointers) and checks the large values they
// point at. Open must succeed or refuse with Corruption, never crash or hang; a state it
// recovers must pass Verify, and recovering that state again (a second crash right after) must
// give the same contents.
//
// Input: a u32 length and the image of segment 1 (the L0 log's first segment), a u32 length
// and the image of segment 2 (the large log's), then the image of segment 3 (free: a NEXT
// record may continue either log there). Each image is zero-padded to the segment size.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "engine_fixture.h"
#include "fuzz_input.h"
#include "slipstream/engine/engine.h"

namespace {

using namespace slipstream::engine;
using slipstream::fuzz::EngineArena;
using slipstream::fuzz::FuzzFailure;
using slipstream::fuzz::FuzzInput;

constexpr uint32_t kSegmentSize = slipstream::fuzz::kRecoverySegmentSize;
constexpr uint32_t kImages = 3;  // segments 1..3
// Entries read back per keyspace at most (a segment holds far fewer).
constexpr size_t kMaxEntries = 1u << 16;

// Stops the run with a message naming the broken property.
[[noreturn]] void Fail(const char* what, const Status& s = Status::OK()) {
  FuzzFailure("recovery", what, s);
}

// Where the directory goes: /dev/shm when there is one (recovery writes and syncs its
// manifest), else the temporary directory.
std::filesystem::path DirectoryBase() {
  return std::filesystem::exists("/dev/shm") ? std::filesystem::path("/dev/shm")
                                             : std::filesystem::temp_directory_path();
}

// Everything a recovery recovers, read back through the public API: keyspaces and their
// entries.
using Contents = std::map<std::pair<uint64_t, KeyspaceId>, std::vector<std::string>>;

// A private directory (see DirectoryBase), the fresh engine's manifest, and an arena
// (engine_fixture.h: with the options the seeds were written with); made once per process.
class Harness {
 public:
  // Makes the directory and the arena, and keeps the manifest a fresh engine writes there.
  Harness()
      : dir_(slipstream::fuzz::PrivateDirectory("recovery", DirectoryBase(), "recovery-fuzz")),
        options_(slipstream::fuzz::RecoveryOptions(dir_)),
        arena_("recovery", options_) {
    // The manifest a fresh engine writes: its L0 log in segment 1, its large log in segment 2.
    std::unique_ptr<Engine> fresh;
    Status s = Open(&fresh);
    if (!s.ok()) Fail("a fresh engine does not open", s);
    fresh.reset();
    manifest_ = ReadFile(dir_ + "/MANIFEST");
  }
  // Removes the directory (the arena goes after it).
  ~Harness() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // Lays out the directory as a crash would leave it: the fresh manifest, and a device of 64
  // segments holding the images.
  void Prepare(const std::vector<std::string_view>& images) {
    WriteFile(dir_ + "/MANIFEST", manifest_);
    int fd = open((dir_ + "/segments").c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || ftruncate(fd, off_t(options_.max_device_size)) != 0) {
      Fail("cannot lay out the device file");
    }
    for (size_t i = 0; i < images.size(); i++) {
      size_t n = std::min<size_t>(images[i].size(), kSegmentSize);
      if (pwrite(fd, images[i].data(), n, off_t((i + 1) * kSegmentSize)) != ssize_t(n)) {
        Fail("cannot write the device file");
      }
    }
    close(fd);
  }

  // Opens the engine on a zeroed arena, as after a restart.
  Status Open(std::unique_ptr<Engine>* engine) { return arena_.Open(engine); }

 private:
  // The bytes of a whole file.
  static std::string ReadFile(const std::string& path) {
    std::string bytes;
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) Fail("cannot read a file");
    char buf[4096];
    for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) bytes.append(buf, size_t(n));
    close(fd);
    return bytes;
  }
  // Replaces a file's bytes (no sync: nothing here needs to survive a machine crash).
  static void WriteFile(const std::string& path, const std::string& bytes) {
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, bytes.data(), bytes.size()) != ssize_t(bytes.size())) {
      Fail("cannot write a file");
    }
    close(fd);
  }

  std::string dir_;
  Options options_;
  EngineArena arena_;
  std::string manifest_;
};

// Reads every live keyspace whole; Verify must pass first.
Contents ReadAll(Engine* engine) {
  Status s = engine->Verify();
  if (!s.ok()) Fail("Verify fails on what recovery recovered", s);
  std::vector<std::pair<uint64_t, KeyspaceId>> keyspaces;
  s = engine->ListKeyspaces(&keyspaces);
  if (!s.ok()) Fail("ListKeyspaces fails after recovery", s);
  Contents contents;
  for (const auto& ks : keyspaces) {
    std::vector<std::string>& entries = contents[ks];
    std::unique_ptr<Iterator> it = engine->NewIterator(ks.second);
    for (it->SeekToFirst(); it->Valid() && entries.size() < kMaxEntries; it->Next()) {
      entries.emplace_back(it->key());
      entries.back().push_back('\0');
      entries.back().append(it->value());
      std::string value;
      Status g = engine->Get(ks.second, it->key(), &value);
      if (!g.ok() || value != it->value()) Fail("Get disagrees with the iterator", g);
    }
    if (!it->status().ok()) Fail("a scan fails after recovery", it->status());
  }
  return contents;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Destroyed at exit, which removes its directory.
  static Harness instance;
  Harness* harness = &instance;
  FuzzInput in(data, size);
  std::vector<std::string_view> images;
  for (uint32_t i = 0; i + 1 < kImages; i++) {
    uint64_t n = 0;
    in.TakeWhole(4, &n);  // a cut length reads as zero and ends the input
    images.push_back(in.Bytes(n));
  }
  images.push_back(in.rest());
  harness->Prepare(images);

  std::unique_ptr<Engine> engine;
  Status s = harness->Open(&engine);
  if (!s.ok()) {
    if (!s.IsCorruption()) Fail("recovery failed with something other than Corruption", s);
    return 0;
  }
  Contents first = ReadAll(engine.get());
  engine.reset();
  s = harness->Open(&engine);
  if (!s.ok()) Fail("what recovery recovered does not recover again", s);
  if (ReadAll(engine.get()) != first) Fail("recovering twice changed the contents");
  return 0;
}
