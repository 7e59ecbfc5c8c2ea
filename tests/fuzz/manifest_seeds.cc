// Seeds for manifest_fuzz: manifests written by LevelSet::NextManifest from arena states like
// those a fresh engine, a compacted one and a replica have, with the options manifest_fuzz.cc
// loads them with.
#include <vector>

#include "engine_fixture.h"
#include "keyspace_table.h"
#include "level_set.h"
#include "log_set.h"
#include "seeds.h"
#include "segment_table.h"

namespace slipstream::fuzz {
namespace {

using namespace engine;

// A formatted arena holding the parts a manifest describes, with manifest_fuzz.cc's options
// and layout (engine_fixture.h), and the ways the seeds fill it in.
class State : public ManifestArena {
 public:
  // Formats a fresh arena as FormatArena and Recover do.
  State() : ManifestArena("manifest") { Format(); }

  // Gives segment `seg` to a log at `sequence`, with its byte accounting.
  void Log(uint32_t seg, SegmentKind kind, uint64_t sequence, uint64_t written, uint64_t invalid,
           uint16_t flags) {
    SegmentInfo& info = segments.info(seg);
    info.kind = uint8_t(kind);
    info.sequence = sequence;
    info.bytes_written = written;
    info.invalid_bytes = invalid;
    info.flags = flags;
  }

  // Installs a tree at `level` over index segment `index` and bloom segment `bloom`.
  void Tree(uint32_t level, uint32_t tree_id, uint32_t height, uint32_t index, uint32_t bloom) {
    SegmentInfo& idx = segments.info(index);
    idx.kind = uint8_t(SegmentKind::kIndex);
    idx.owner = tree_id;
    idx.level = uint8_t(level);
    SegmentInfo& blm = segments.info(bloom);
    blm.kind = uint8_t(SegmentKind::kBloom);
    blm.owner = tree_id;
    blm.level = uint8_t(level);
    LevelDesc d{};
    d.tree_id = tree_id;
    d.height = height;
    d.root = DevPtr{index, 8 * options.node_size};
    d.bloom_dir = DevPtr{index, 9 * options.node_size};
    d.bloom_blocks = 3;
    d.entries = 1000u * level;
    d.bytes = 50000u * level;
    d.small_entries = 900u * level;
    d.large_entries = 100u * level;
    d.segments = 2;
    levels.Apply([&](Version& v) { v.levels[level] = d; });
    levels.ReserveTreeId(tree_id);
  }

  // A keyspace slot in `state` (live or dropped).
  void Keyspace(uint32_t id, uint64_t tag, uint32_t state) {
    KeyspaceSlot* slot = keyspaces.Insert(id);
    slot->tag = tag;
    slot->state.store(state);
    keyspaces.NoteUsed(id);
  }
};

// A fresh engine's first manifest, one with levels, logs and keyspaces, and a replica's.
std::vector<Seed> ManifestSeeds() {
  std::vector<Seed> seeds;
  {
    State fresh;
    fresh.Log(1, SegmentKind::kL0Log, 1, 0, 0, 0);
    fresh.Log(2, SegmentKind::kLargeLog, 1, 0, 0, 0);
    fresh.logs.set_next_sequence(LogKind::kL0, 2);
    fresh.logs.set_next_sequence(LogKind::kLarge, 2);
    seeds.push_back(
        {"fresh", fresh.levels.NextManifest(0, fresh.segments, fresh.keyspaces, fresh.logs)});
  }
  {
    State busy;
    busy.Log(1, SegmentKind::kL0Log, 4, 0, 0, kSegmentSealed);
    busy.Log(2, SegmentKind::kL0Log, 5, 0, 0, 0);
    busy.Log(3, SegmentKind::kLargeLog, 2, 200000, 50000, kSegmentSealed);
    busy.Log(4, SegmentKind::kLargeLog, 3, 9000, 0, 0);
    busy.Log(5, SegmentKind::kMediumLog, 1, 120000, 3000, kSegmentSealed);
    busy.Log(6, SegmentKind::kLargeLog, 1, 100, 100, kSegmentSealed | kSegmentRetired);
    busy.Tree(1, 3, 1, 10, 11);
    busy.Tree(2, 5, 2, 12, 13);
    busy.Keyspace(1, 16384, KeyspaceSlot::kLive);
    busy.Keyspace(2, 16385, KeyspaceSlot::kDropped);
    busy.Keyspace(3, 16390, KeyspaceSlot::kLive);
    busy.logs.set_next_sequence(LogKind::kL0, 6);
    busy.logs.set_next_sequence(LogKind::kLarge, 4);
    busy.levels.AdvanceCompactedLsn(700);
    busy.levels.set_large_accounted_lsn(650);
    busy.levels.Apply([](Version& v) { v.active_first_large_sequence = 3; });
    seeds.push_back(
        {"levels", busy.levels.NextManifest(812, busy.segments, busy.keyspaces, busy.logs)});
  }
  {
    State replica;
    replica.Log(1, SegmentKind::kL0Log, 1, 0, 0, 0);
    replica.Log(2, SegmentKind::kLargeLog, 1, 0, 0, 0);
    replica.Log(7, SegmentKind::kMediumLog, 0, 80000, 0, kSegmentSealed | kSegmentImported);
    replica.segments.info(7).owner = 31;  // its number on the primary
    replica.Tree(3, 9, 0, 20, 21);
    replica.Keyspace(4, 1 << 20, KeyspaceSlot::kLive);
    replica.levels.set_import_resume(123456);
    replica.logs.set_next_sequence(LogKind::kL0, 2);
    replica.logs.set_next_sequence(LogKind::kLarge, 2);
    seeds.push_back({"replica", replica.levels.NextManifest(40, replica.segments, replica.keyspaces,
                                                            replica.logs)});
  }
  return seeds;
}

}  // namespace
SLIPSTREAM_FUZZ_SEEDS(manifest, ManifestSeeds);
}  // namespace slipstream::fuzz
