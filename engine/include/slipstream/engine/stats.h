// Stats: a plain snapshot of the engine's counters.
#pragma once

#include <cstdint>
#include <vector>

namespace slipstream::engine {

struct LevelStats {
  uint32_t level = 0;     // 1..max_levels
  uint64_t bytes = 0;     // key-value bytes stored at this level (in place or by pointer)
  uint64_t segments = 0;  // index, leaf and bloom segments owned by the level
  uint64_t entries = 0;   // entries, tombstones included
  uint64_t small_entries = 0;
  uint64_t medium_entries = 0;  // in place or pointing into the medium log
  uint64_t large_entries = 0;
  uint64_t tombstones = 0;
};

struct Stats {
  std::vector<LevelStats> levels;
  uint64_t l0_entries = 0;
  uint64_t l0_bytes = 0;
  // inserts into those memtables that descended the skiplist from its top (not placed from
  // a key's newest node, a row's neighbour or an append finger)
  uint64_t l0_descents = 0;

  uint64_t user_bytes_written = 0;    // key + value bytes of Put/Delete accepted
  uint64_t device_bytes_written = 0;  // every byte the engine wrote to its device and manifest
  uint64_t device_bytes_read = 0;     // bytes compaction and GC read from the device
  uint64_t compactions = 0;
  uint64_t compaction_bytes_written = 0;
  uint64_t compaction_leaves_kept = 0;  // leaves compactions kept instead of rewriting them
  // leaves of an upper level that merges into the deepest took whole instead of copying them
  uint64_t compaction_leaves_moved = 0;
  // compactions that kept leaves but built the bloom filter again from every key, reading the
  // kept leaves, because the inherited filter would have grown too dense
  uint64_t compaction_filters_rebuilt = 0;
  // header changes of large values written as patches naming the stored record
  uint64_t large_patches = 0;
  // point reads the row cache answered, those it did not, and values it took in
  uint64_t row_cache_hits = 0;
  uint64_t row_cache_misses = 0;
  uint64_t row_cache_installs = 0;
  uint64_t gc_runs = 0;
  uint64_t gc_bytes_relocated = 0;
  uint64_t gc_reclaimed_bytes = 0;
  uint64_t stall_count = 0;
  uint64_t stall_micros = 0;
  uint64_t log_flushes = 0;
  uint64_t log_records_flushed = 0;
  uint64_t log_barrier_calls = 0;  // write-outs that called persist_barrier first
  uint64_t segments_in_use = 0;
  uint64_t medium_log_segments = 0;
  uint64_t large_log_segments = 0;
  uint64_t l0_log_segments = 0;
  uint64_t last_lsn = 0;
  uint64_t durable_lsn = 0;

  double WriteAmplification() const {
    return user_bytes_written ? double(device_bytes_written) / double(user_bytes_written) : 0.0;
  }
  double RecordsPerFlush() const {
    return log_flushes ? double(log_records_flushed) / double(log_flushes) : 0.0;
  }
};

}  // namespace slipstream::engine
