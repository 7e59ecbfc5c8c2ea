// The layout of the engine's shared-memory arena.
//
// Everything here is addressed by offsets from the arena base, never by pointers, and is
// synchronised with process-shared primitives only, so any process that maps the arena (at any
// address) can use it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "format.h"
#include "shm_sync.h"
#include "slipstream/engine/log_writer.h"

namespace slipstream::engine {

constexpr uint64_t kArenaMagic = 0x414e455241535353ull;  // "SSSARENA"
// 2: the header split into per-owner parts; 3: memtable nodes carry a back link; 4: memtable
// headers carry a generation and count descents, and keep insert counters off lookups' line;
// 5: memtable index slots placed by MemTable::HomeOf (16 row ids a line), which a process of
// version 4 would probe elsewhere and find keys absent.
constexpr uint32_t kArenaVersion = 6;
constexpr int kMaxLevels = 12;
constexpr int kMaxReaders = 1024;
constexpr int kL0LogBuffers = 4;
constexpr int kLargeLogBuffers = 8;
constexpr uint32_t kKeyspaceSlots = 1u << 16;
constexpr int kRetireSlots = 8192;
constexpr int kMaxMemtables = 8;

enum ArenaState : uint32_t {
  kArenaZero = 0,
  kArenaInitializing = 1,
  kArenaReady = 2,
  kArenaFailed = 3
};

// One segment image of a log, kept in shared memory while it is appended to and until it has
// been written out to the device.
struct SharedLogBuffer {
  enum State : uint32_t { kFree = 0, kActive = 1, kSealed = 2 };
  std::atomic<uint32_t> state;
  std::atomic<uint32_t> generation;  // bumped whenever the buffer starts a new segment
  std::atomic<uint32_t> appended;    // bytes of complete appends (records and checksums)
  uint32_t written;                  // bytes already written to the device
  uint32_t pins;                     // flushers currently writing from this buffer
  uint32_t segment;
  uint64_t sequence;
  uint64_t data_offset;  // arena offset of the segment image
};

// One log (L0 recovery log or large log) in shared memory. Protected by the write mutex.
struct SharedLog {
  uint32_t kind;  // LogKind
  uint32_t buffer_count;
  uint32_t current;  // index of the active buffer
  uint32_t pad;
  uint64_t next_sequence;
  LogCursor cursor;  // of the active buffer
  SharedLogBuffer buffers[kLargeLogBuffers];
};

// Per-segment accounting; the allocator's table. Protected by the allocation mutex.
struct SegmentInfo {
  uint8_t kind;  // SegmentKind
  uint8_t level;
  uint16_t flags;
  uint32_t owner;          // tree id for index and bloom segments; a log segment's number on the
                           // primary it was imported from (kSegmentImported)
  uint64_t sequence;       // position in its log's chain (log segments)
  uint64_t bytes_written;  // record bytes appended (log segments)
  uint64_t invalid_bytes;  // record bytes no longer referenced (medium and large logs)
};
constexpr uint16_t kSegmentSealed = 1;     // a log segment that receives no more appends
constexpr uint16_t kSegmentEvacuated = 2;  // GC relocated its live values
constexpr uint16_t kSegmentRetired = 4;    // waiting for readers to leave before reuse
// A copy of a primary's segment, shipped to this replica (Engine::ImportSegment and
// ImportLogBytes); its log chain is the primary's, not this node's.
constexpr uint16_t kSegmentImported = 8;
// Written by an import that is not installed yet: no manifest names it, so a crash frees it.
constexpr uint16_t kSegmentPending = 16;

// How a level's tree was built (LevelDesc::build_flags): what a later compaction may rely on
// when it keeps the tree's leaves instead of rewriting them. 0: unknown (an imported tree, or
// one from an older manifest), so its leaves are always rewritten.
constexpr uint32_t kTreeBuildKnown = 1;
constexpr uint32_t kTreeTombstonesDropped = 2;  // built as the deepest level
constexpr uint32_t kTreeMediumInPlace = 4;      // medium values are in the leaves

// One level's B+-tree. A level with tree_id 0 is empty.
//
// A compaction may keep leaves of the tree it merges into (compaction.h): the new tree then
// takes over the index segments holding them, and its nodes carry the ids of every tree in
// [first_tree_id, tree_id]. A tree written whole has first_tree_id == tree_id.
struct LevelDesc {
  uint32_t tree_id;
  uint32_t height;  // 0: the root is a leaf
  DevPtr root;
  DevPtr bloom_dir;  // node listing the bloom segments
  uint64_t bloom_blocks;
  uint64_t entries, bytes, small_entries, medium_entries, large_entries, tombstones, segments;
  uint32_t first_tree_id;  // oldest tree whose leaves this one still uses
  uint32_t build_flags;    // kTree*
  // Bytes of the index segments the tree took over that hold none of its nodes (leaves a
  // later compaction replaced, older index layers): space a rewrite of the level reclaims.
  uint64_t dead_bytes;
  // Keys whose bits the bloom filter holds: entries, and for a tree that kept leaves also keys
  // the leaves it replaced held (their bits stay). The filter is sized for all of them.
  uint64_t bloom_keys;
};

// What a reader needs to see one consistent state: memtables and level trees.
struct Version {
  int32_t active_memtable;
  int32_t immutable_memtable;          // -1 if none
  uint64_t active_first_log_sequence;  // L0 log segment holding the active memtable's first record
  // Large-log segments from which the active (immutable) memtable's values may live: recovery
  // re-derives the accounting of every large segment from the oldest uncompacted one on.
  uint64_t active_first_large_sequence;
  uint64_t immutable_first_large_sequence;
  LevelDesc levels[kMaxLevels + 1];  // index 1..max_levels
};

struct KeyspaceSlot {
  enum State : uint32_t { kEmpty = 0, kLive = 1, kDropped = 2, kDeleted = 3 };
  uint64_t tag;
  uint32_t id;
  std::atomic<uint32_t> state;
};

// Two cache lines: what the writer changes at every insert, and what every lookup reads (the
// index's place and size, the height a descent starts at), which changes rarely, so that an
// insert does not take the line lookups read from the other cores' caches. (No end-to-end
// difference was measurable: docs/benchmarks.md, "Append fingers per writer thread".)
struct MemtableHeader {
  // Written by the writer at every insert.
  std::atomic<uint64_t> used;  // bytes allocated in the data area
  std::atomic<uint64_t> entries;
  std::atomic<uint64_t> kv_bytes;
  std::atomic<uint64_t> large_bytes;  // large-log bytes its entries point at
  std::atomic<uint64_t> max_lsn;
  std::atomic<uint64_t> descents;    // inserts placed by a full skiplist descent
  std::atomic<uint32_t> index_used;  // the hash index's slots in use
  // Read by every lookup.
  alignas(64) uint64_t capacity;  // bytes of the data area
  std::atomic<uint32_t> max_height;
  std::atomic<uint32_t> in_use;  // 0: free for reuse once no reader can see it
  uint64_t retired_epoch;
  uint64_t data_offset;  // arena offset of the data area
  // The hash index over the keys (memtable.h): its slots' arena offset and count (a power of
  // two; 0: none), and 1 while every key of the memtable is in it.
  uint64_t index_offset;
  uint32_t index_slots;
  std::atomic<uint32_t> index_complete;
  // Moved on by every Reset (counted from 64 random bits): a writer's append finger
  // (memtable.h) names the generation it was taken in, so it is never followed into a reused
  // data area.
  std::atomic<uint64_t> generation;
};
static_assert(sizeof(MemtableHeader) == 128, "a line of insert counters, a line of lookup fields");

struct RetiredItem {
  enum Kind : uint32_t { kNone = 0, kSegment = 1, kMemtable = 2, kTree = 3 };
  uint32_t kind;
  uint32_t id;
  uint64_t epoch;
};

// A pinned epoch and the pinning process in one word (epoch << 22 | pid; 0: free), so that a
// reclaimer clearing the slot of a dead process can never clear a live reader's slot.
struct ReaderSlot {
  static constexpr int kPidBits = 22;
  static constexpr uint32_t kAllMemtables = 0xff;
  std::atomic<uint64_t> word;
  // Memtable slots this reader may read (kAllMemtables while it does not know yet): memtables
  // are reused once no reader of an older epoch may read them, so a long-lived iterator holds
  // only its own memtables, never the ones written after it.
  std::atomic<uint32_t> memtables;
  uint32_t pad;
  static uint64_t Pack(uint64_t epoch, int pid) { return (epoch << kPidBits) | uint64_t(pid); }
  static uint64_t EpochOf(uint64_t word) { return word >> kPidBits; }
  static int PidOf(uint64_t word) { return int(word & ((1u << kPidBits) - 1)); }
};

struct SharedCounters {
  std::atomic<uint64_t> user_bytes_written, device_bytes_written, device_bytes_read;
  std::atomic<uint64_t> compactions, compaction_bytes_written, compaction_leaves_kept,
      compaction_leaves_moved, compaction_filters_rebuilt;
  std::atomic<uint64_t> gc_runs, gc_bytes_relocated, gc_reclaimed_bytes;
  std::atomic<uint64_t> large_patches;
  std::atomic<uint64_t> stall_count, stall_micros, log_flushes, log_records_flushed,
      log_barrier_calls;
  std::atomic<uint64_t> unflushed_records;
};

// The log layer's part (LogSet): both logs, LSN assignment and what is durable.
struct SharedLogs {
  SharedMutex flush_mu;                     // one log write-out at a time (group commit)
  std::atomic<uint64_t> last_flush_micros;  // CLOCK_MONOTONIC, shared by all processes
  std::atomic<uint64_t> last_lsn;           // assigned under the write mutex
  std::atomic<uint64_t> durable_lsn;
  SharedLog l0;
  SharedLog large;
};

// The segment allocator's part (SegmentTable).
struct SharedSegments {
  SharedMutex alloc_mu;   // the segment table
  uint64_t table_offset;  // arena offset of SegmentInfo[max_segments]
  uint64_t max_segments;
  uint64_t device_segments;  // segments the device file currently holds
  uint32_t alloc_hint;
  uint32_t pad;
};

// Epoch-based reclamation's part (Reclaimer). Retirement happens under compaction_mu.
struct SharedEpochs {
  std::atomic<uint64_t> epoch;
  ReaderSlot readers[kMaxReaders];
  RetiredItem retired[kRetireSlots];
  uint32_t retired_count;
  uint32_t pad;
};

// The level set's part (LevelSet): the installed version and what the manifest records.
struct SharedLevels {
  std::atomic<uint64_t> version_seq;  // seqlock over `current` (64 bits: never wraps)
  uint32_t pad;
  Version current;
  uint64_t compacted_lsn;  // every record up to it is in the levels (persisted in the manifest)
  // Large-log records up to it are in the manifest's accounting even if uncompacted (recovery
  // counted the orphans among them), so a later recovery does not count them twice.
  uint64_t large_accounted_lsn;
  uint64_t import_resume;  // a replica's host stream position after its last install
  std::atomic<uint32_t> next_tree_id;
  uint32_t pad2;
  uint64_t manifest_number;
};

// The keyspace table's part (KeyspaceTable).
struct SharedKeyspaces {
  uint64_t table_offset;  // arena offset of KeyspaceSlot[kKeyspaceSlots]
  uint32_t next_id;
  uint32_t pad;
};

// The memtable slots' part (MemtablePool).
struct SharedMemtables {
  uint32_t count;
  uint32_t pad;
  uint64_t offset[kMaxMemtables];  // arena offset of each slot's header
};

// The whole arena header. Each part is owned by one class of the engine (named above), which
// alone touches its fields; the locks here order work across the parts.
struct SharedState {
  uint64_t magic;
  uint32_t version;
  std::atomic<uint32_t> state;  // ArenaState
  uint64_t arena_size;
  // Copy of the options that fix the layout; attachers must agree.
  uint32_t segment_size, node_size, max_levels, pad0;
  uint64_t l0_size, max_segments, row_cache_size;

  SharedMutex write_mu;       // log appends, memtable inserts, memtable switches, keyspaces
  SharedMutex compaction_mu;  // compaction, GC, manifest writes, reclamation
  SharedMutex bg_mu;          // with bg_cv: wake-ups for background work and stalled writers
  SharedCondVar bg_cv;
  std::atomic<uint32_t> bg_pending;
  std::atomic<uint32_t> reclaim_pending;  // a dropped keyspace may still hold data in the levels
  std::atomic<uint32_t> bg_failed;        // a background compaction failed: writers get the error
  char bg_error[256];

  SharedLogs logs;
  SharedSegments segments;
  SharedEpochs epochs;
  SharedLevels levels;
  SharedKeyspaces keyspaces;
  SharedMemtables memtables;
  SharedCounters counters;
};

}  // namespace slipstream::engine
