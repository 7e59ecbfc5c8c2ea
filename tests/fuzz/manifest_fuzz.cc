// Fuzzes manifest loading (LevelSet::LoadManifest, manifest.cc), the first thing recovery reads
// from disk: any image must be refused with Corruption or InvalidArgument (and a message) or
// loaded, never crash. The image is tried as it is and with its checksum made right, since a
// fuzzer rarely forges a CRC32C and the structure behind it must hold up on its own. What is
// loaded must be a state the engine can work from: its levels and segments lie inside the
// device, and writing it out again (NextManifest) gives a manifest that loads to the same state.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "coding.h"
#include "crc32c.h"
#include "engine_fixture.h"
#include "fuzz_input.h"
#include "keyspace_table.h"
#include "level_set.h"
#include "segment_table.h"

namespace {

using namespace slipstream::engine;
using slipstream::fuzz::FuzzFailure;
using slipstream::fuzz::ManifestArena;

// Where the manifest's manifest_number lies (after magic, version and three sizes), the one
// field NextManifest changes on every write.
constexpr size_t kManifestNumberOffset = 8 + 4 + 4 + 4 + 4;
// The fixed fields of a version-5 manifest, before the levels.
constexpr size_t kHeaderSize = kManifestNumberOffset + 8 * 3 + 4 * 2 + 8 * 5;
// A keyspace as the manifest lists it: tag, id, state.
constexpr size_t kKeyspaceRecord = 8 + 4 + 4;

// Stops the run with a message naming the broken property.
[[noreturn]] void Fail(const char* what, const Status& s = Status::OK()) {
  FuzzFailure("manifest", what, s);
}

// The arena parts that loading a manifest fills in (engine_fixture.h), made once per process
// and formatted again for every load.
class Loader {
 public:
  // Formats a fresh arena as FormatArena and Recover do, then loads `image`.
  Status Load(const std::string& image, ManifestTail* tail) {
    parts_.Format();
    return parts_.levels.LoadManifest(image, &parts_.segments, &parts_.keyspaces, &parts_.logs,
                                      tail);
  }

  // The manifest of what was loaded, as recovery writes it once it has replayed the logs
  // (which sets the first large-log sequence the manifest keeps).
  std::string Write(const ManifestTail& tail) {
    parts_.levels.Apply(
        [&](Version& v) { v.active_first_large_sequence = tail.first_large_sequence; });
    return parts_.levels.NextManifest(tail.snapshot_lsn, parts_.segments, parts_.keyspaces,
                                      parts_.logs);
  }

  // The number of levels every manifest here describes.
  uint32_t max_levels() const { return parts_.options.max_levels; }

  // What a loaded state must satisfy for the engine to run on it.
  void CheckLoaded() const {
    const Version& v = parts_.levels.Latest();
    for (uint32_t level = 1; level <= parts_.options.max_levels; level++) {
      const LevelDesc& d = v.levels[level];
      if (d.tree_id == 0) continue;
      if (d.root.segment >= parts_.segments.count()) {
        Fail("loaded a level whose root is off the device");
      }
      if (d.tree_id >= parts_.levels.next_tree_id()) {
        Fail("loaded a level with a tree id not yet given");
      }
      if (d.first_tree_id == 0 || d.first_tree_id > d.tree_id) {
        Fail("loaded a level whose lineage of kept leaves is impossible");
      }
    }
    // The manifest lists the live and dropped keyspaces, each once (ids are never reused).
    const auto* slots =
        reinterpret_cast<const KeyspaceSlot*>(parts_.arena + parts_.layout.keyspace_table);
    for (uint32_t i = 0; i < kKeyspaceSlots; i++) {
      uint32_t state = slots[i].state.load();
      if (state == KeyspaceSlot::kEmpty) continue;
      if (state != KeyspaceSlot::kLive && state != KeyspaceSlot::kDropped) {
        Fail("loaded a keyspace in a state the manifest never records");
      }
      if (parts_.keyspaces.Find(slots[i].id) != &slots[i]) Fail("loaded one keyspace id twice");
    }
    for (uint64_t seg = parts_.segments.count();
         seg < parts_.options.max_device_size / parts_.options.segment_size; seg++) {
      if (parts_.segments.info(seg).kind != uint8_t(SegmentKind::kFree)) {
        Fail("loaded accounting for a segment beyond the device file");
      }
    }
  }

 private:
  ManifestArena parts_{"manifest"};
};

// A version-5 manifest as a comparable description of its state: manifest_number (the one
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
