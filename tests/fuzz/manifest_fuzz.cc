// Fuzzes manifest loading (LevelSet::LoadManifest, manifest.cc), the first thing recovery reads
// from disk: any image must be refused with Corruption or InvalidArgument (and a message) or
// loaded, never crash. The image is tried as it is and with its checksum made right, since a
// fuzzer rarely forges a CRC32C and the structure behind it must hold up on its own. What is
// loaded must be a state the engine can work from: its levels and segments lie inside the
// device, and writing it out again (NextManifest) gives a manifest that loads to the same state.
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "arena_layout.h"
#include "coding.h"
#include "crc32c.h"
#include "keyspace_table.h"
#include "level_set.h"
#include "log_set.h"
#include "segment_table.h"
#include "shared_state.h"

namespace {

using namespace slipstream::engine;

// Where the manifest's manifest_number lies (after magic, version and three sizes), the one
// field NextManifest changes on every write.
constexpr size_t kManifestNumberOffset = 8 + 4 + 4 + 4 + 4;
// The fixed fields of a version-4 manifest, before the levels.
constexpr size_t kHeaderSize = kManifestNumberOffset + 8 * 3 + 4 * 2 + 8 * 5;
// A keyspace as the manifest lists it: tag, id, state.
constexpr size_t kKeyspaceRecord = 8 + 4 + 4;

// Stops the run with a message naming the broken property.
[[noreturn]] void Fail(const char* what, const Status& s = Status::OK()) {
  std::fprintf(stderr, "manifest: %s %s\n", what, s.ToString().c_str());
  std::abort();
}

// The options the seeds were written with (test_util.h's SmallOptions): the manifest must
// repeat segment_size, node_size and max_levels.
Options FuzzOptions() {
  Options o;
  o.directory = "/nonexistent";
  o.segment_size = 256u << 10;
  o.node_size = 4096;
  o.max_levels = 5;
  o.max_device_size = 64ull * o.segment_size;
  return o;
}

// The parts of an arena that loading a manifest fills in, built the way EngineImpl builds them,
// over a zeroed arena of its own. Made once per process and zeroed again for every load.
class Loader {
 public:
  static constexpr uint64_t kDeviceSegments = 48;  // the device file's size: below the maximum

  // Lays out the parts over an arena of their own, as EngineImpl's constructor does.
  Loader()
      : options_(FuzzOptions()),
        layout_(ArenaLayout::For(options_)),
        size_(layout_.memtables),  // up to the keyspace table's end: no memtables or buffers
        arena_(static_cast<char*>(
            mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0))),
        shared_(reinterpret_cast<SharedState*>(arena_)),
        segments_(arena_, &shared_->segments, nullptr),
        keyspaces_(arena_, &shared_->keyspaces),
        logs_(options_, arena_, &shared_->logs, nullptr, &segments_, &shared_->counters,
              &shared_->write_mu, nullptr, nullptr),
        levels_(options_, &shared_->levels, &shared_->counters) {
    if (arena_ == MAP_FAILED) Fail("cannot map an arena");
  }
  // Unmaps the arena.
  ~Loader() { munmap(arena_, size_); }

  // Formats a fresh arena as FormatArena and Recover do, then loads `image`. The arena is
  // zeroed by dropping its pages, which costs only the few pages a load touched.
  Status Load(const std::string& image, ManifestTail* tail) {
    if (madvise(arena_, size_, MADV_DONTNEED) != 0) Fail("cannot zero the arena");
    segments_.Format(layout_.segment_table, options_.max_device_size / options_.segment_size);
    keyspaces_.Format(layout_.keyspace_table);
    levels_.Format();
    segments_.set_count(kDeviceSegments);
    segments_.info(0).kind = uint8_t(SegmentKind::kReserved);
    return levels_.LoadManifest(image, &segments_, &keyspaces_, &logs_, tail);
  }

  // The manifest of what was loaded, as recovery writes it once it has replayed the logs
  // (which sets the first large-log sequence the manifest keeps).
  std::string Write(const ManifestTail& tail) {
    levels_.Apply([&](Version& v) { v.active_first_large_sequence = tail.first_large_sequence; });
    return levels_.NextManifest(tail.snapshot_lsn, segments_, keyspaces_, logs_);
  }

  // The number of levels every manifest here describes.
  uint32_t max_levels() const { return options_.max_levels; }

  // What a loaded state must satisfy for the engine to run on it.
  void CheckLoaded() const {
    const Version& v = levels_.Latest();
    for (uint32_t level = 1; level <= options_.max_levels; level++) {
      const LevelDesc& d = v.levels[level];
      if (d.tree_id == 0) continue;
      if (d.root.segment >= segments_.count()) Fail("loaded a level whose root is off the device");
      if (d.tree_id >= levels_.next_tree_id()) Fail("loaded a level with a tree id not yet given");
    }
    // The manifest lists the live and dropped keyspaces, each once (ids are never reused).
    const auto* slots = reinterpret_cast<const KeyspaceSlot*>(arena_ + layout_.keyspace_table);
    for (uint32_t i = 0; i < kKeyspaceSlots; i++) {
      uint32_t state = slots[i].state.load();
      if (state == KeyspaceSlot::kEmpty) continue;
      if (state != KeyspaceSlot::kLive && state != KeyspaceSlot::kDropped) {
        Fail("loaded a keyspace in a state the manifest never records");
      }
      if (keyspaces_.Find(slots[i].id) != &slots[i]) Fail("loaded one keyspace id twice");
    }
    for (uint64_t seg = segments_.count(); seg < options_.max_device_size / options_.segment_size;
         seg++) {
      if (segments_.info(seg).kind != uint8_t(SegmentKind::kFree)) {
        Fail("loaded accounting for a segment beyond the device file");
      }
    }
  }

 private:
  Options options_;
  ArenaLayout layout_;
  size_t size_;
  char* arena_;
  SharedState* shared_;
  SegmentTable segments_;
  KeyspaceTable keyspaces_;
  LogSet logs_;
  LevelSet levels_;
};

// A version-4 manifest as a comparable description of its state: manifest_number (the one
// field NextManifest changes on every write) blanked, the checksum dropped, and the keyspaces
// sorted (their order is the hash table's, which depends on the order they were inserted in).
std::string Canonical(std::string image, uint32_t max_levels) {
  size_t segs_at = kHeaderSize + max_levels * sizeof(LevelDesc);
  if (image.size() < segs_at + 4 + 4 + 4) Fail("NextManifest wrote a short manifest");
  std::memset(image.data() + kManifestNumberOffset, 0, 8);
  image.resize(image.size() - 4);
  size_t ks_at =
      segs_at + 4 + size_t(DecodeFixed32(image.data() + segs_at)) * (4 + sizeof(SegmentInfo));
  if (ks_at + 4 > image.size()) Fail("NextManifest wrote a manifest of the wrong size");
  size_t nks = DecodeFixed32(image.data() + ks_at);
  if (ks_at + 4 + nks * kKeyspaceRecord != image.size()) {
    Fail("NextManifest wrote a manifest of the wrong size");
  }
  std::vector<std::string> keyspaces;
  for (size_t i = 0; i < nks; i++) {
    keyspaces.push_back(image.substr(ks_at + 4 + i * kKeyspaceRecord, kKeyspaceRecord));
  }
  std::sort(keyspaces.begin(), keyspaces.end());
  image.resize(ks_at + 4);
  for (const std::string& k : keyspaces) image += k;
  return image;
}

// Loads one image; when it loads, writes it back and checks that the result loads to the same.
void Check(Loader* loader, const std::string& image) {
  ManifestTail tail;
  Status s = loader->Load(image, &tail);
  if (!s.ok()) {
    if (!s.IsCorruption() && !s.IsInvalidArgument()) Fail("refused with an unclear status", s);
    if (s.message().empty()) Fail("refused without a message", s);
    return;
  }
  loader->CheckLoaded();
  std::string first = loader->Write(tail);
  ManifestTail again;
  s = loader->Load(first, &again);
  if (!s.ok()) Fail("the manifest written from a loaded one does not load", s);
  if (again.snapshot_lsn != tail.snapshot_lsn ||
      again.first_large_sequence != tail.first_large_sequence) {
    Fail("the manifest written from a loaded one has another tail");
  }
  loader->CheckLoaded();
  std::string second = loader->Write(again);
  if (Canonical(first, loader->max_levels()) != Canonical(second, loader->max_levels())) {
    Fail("a loaded manifest written twice differs");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Loader* loader = new Loader();
  std::string image(reinterpret_cast<const char*>(data), size);
  Check(loader, image);
  // The same bytes with a checksum that matches, so that the fields behind it are parsed.
  if (image.size() >= 4) {
    uint32_t crc = crc32c::Value(image.data(), image.size() - 4);
    EncodeFixed32(image.data() + image.size() - 4, crc);
    Check(loader, image);
  }
  return 0;
}
