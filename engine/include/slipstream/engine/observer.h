// EngineObserver: the points where replication and index shipping hook into the engine.
//
// Log replication needs to know when log bytes leave the engine for the device; index
// shipping needs every segment a compaction writes and the moment its level is installed (or
// that it was abandoned). The engine calls an observer at exactly those points, in the
// process that does the work: hosts that run the engine in several processes install an
// observer in every handle that may write out logs or compact. Callbacks run on the engine's
// own threads with engine locks held where noted, so they must be quick and must not call
// back into the engine.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace slipstream::engine {

// The logs whose bytes are observed as they are written out.
enum class ObservedLog : uint8_t { kL0 = 1, kLarge = 3 };

// Bytes [offset, offset + bytes.size()) of a log segment, about to be written to the device.
// They are a contiguous extension of what was reported for the segment before (a segment's
// first range starts at 0 with its header), already covered by the write-ahead barrier.
struct LogWriteEvent {
  ObservedLog log;
  uint32_t segment;   // device segment number on this node
  uint64_t sequence;  // the segment's position in its log's chain
  uint32_t offset;
  std::string_view bytes;  // valid only during the callback
};

// A compaction is about to write its output; its segments and its end follow. A replica that
// imports it (Engine::BeginImport) needs the shapes, which must equal its own.
struct CompactionBeginEvent {
  uint64_t compaction;  // the id of the tree it builds
  bool from_l0;
  uint32_t replaced_level;  // emptied by this compaction (0: none)
  uint32_t dest_level;
  uint32_t segment_size;
  uint32_t node_size;
};

// What a compaction writes besides the logs.
enum class CompactionSegmentKind : uint8_t { kIndex = 4, kBloom = 5, kMedium = 2 };

// A segment a compaction has written to the device, whole: its bytes from offset 0 (the rest
// of the segment is unused).
struct CompactionSegmentEvent {
  uint64_t compaction;  // identifies the compaction: the id of the tree it builds
  uint32_t dest_level;
  CompactionSegmentKind kind;
  uint32_t segment;
  std::string_view bytes;  // valid only during the callback
};

// One keyspace of a node's table, as a replica mirrors it.
struct KeyspaceRecord {
  uint64_t tag = 0;
  uint32_t id = 0;
  uint32_t state = 0;  // 1: live, 2: dropped (its entries may still be in the levels)
};

// A compaction's level, now installed and named by the manifest.
struct CompactionInstalledEvent {
  uint64_t compaction = 0;
  bool from_l0 = false;         // merged the immutable memtable (else level dest-1, or a rewrite)
  uint32_t replaced_level = 0;  // emptied by this compaction (0: none)
  uint32_t dest_level = 0;
  uint32_t tree_id = 0;  // 0: the level is now empty
  uint32_t height = 0;
  uint32_t root_segment = 0, root_offset = 0;
  uint32_t bloom_segment = 0, bloom_offset = 0;  // the node listing the bloom filter segments
  uint64_t entries = 0;
  uint64_t segments = 0;
  uint64_t manifest_number = 0;
  // Segments the new version no longer uses (old trees' index and bloom segments, dead log
  // segments): freed once no reader can see them.
  std::vector<uint32_t> retired_segments;
  // The rest of the level's descriptor, which a replica installs as it is.
  uint64_t bloom_blocks = 0;
  uint64_t bytes = 0, small_entries = 0, medium_entries = 0, large_entries = 0, tombstones = 0;
  // The medium-log segments this compaction wrote (sealed now).
  std::vector<uint32_t> medium_segments;
  // retired_segments split: dead log segments (L0, medium, large), and the trees retired whole.
  std::vector<uint32_t> retired_log_segments;
  std::vector<uint32_t> retired_trees;
  // The keyspace table when the level was installed, and its next id: the levels' keys carry
  // keyspace ids, so a replica takes the primary's table as it is (0: not reported).
  std::vector<KeyspaceRecord> keyspaces;
  uint32_t next_keyspace_id = 0;
};

class EngineObserver {
 public:
  virtual ~EngineObserver() = default;

  // Log bytes are being written out (in the process that writes them, before the write).
  virtual void OnLogWrite(const LogWriteEvent& event) { (void)event; }

  // Engine::ShipLevels is about to report this node's state: every event raised before this
  // one is reflected in what follows, none raised after it is (ShipLevels holds the locks
  // every other event is raised under). A new replica applies a stream from here on.
  virtual void OnSeedBegin() {}

  // Engine::ShipLevels has reported every level: `level_trees[L]` is the tree at level L
  // (0: empty; index 0 unused). A replica empties the levels the seed left out.
  virtual void OnSeedEnd(const std::vector<uint32_t>& level_trees) { (void)level_trees; }

  // A compaction begins (under the compaction lock, before any of its segments).
  virtual void OnCompactionBegin(const CompactionBeginEvent& event) { (void)event; }

  // A compaction finished writing a segment (before its level is installed).
  virtual void OnCompactionSegment(const CompactionSegmentEvent& event) { (void)event; }

  // A compaction's result was installed (the manifest naming it is durable).
  virtual void OnCompactionInstalled(const CompactionInstalledEvent& event) { (void)event; }

  // A compaction failed before it was installed: the segments it reported are freed.
  virtual void OnCompactionAbandoned(uint64_t compaction) { (void)compaction; }

  // Asked as a compaction begins. true (the default): its output may be imported elsewhere as
  // a tree of its own (index shipping), so it writes every segment its tree uses rather than
  // keep leaves of the tree it merges into (Options::keep_leaves). An observer that ships no
  // trees at the moment says false.
  virtual bool WantsWholeTrees() const { return true; }
};

}  // namespace slipstream::engine
