// ArenaLayout: where each part of the engine's shared-memory arena starts, for a set of
// options. Every part is page aligned; the header (SharedState) comes first.
#pragma once

#include <cstddef>
#include <cstdint>

#include "slipstream/engine/options.h"

namespace slipstream::engine {

struct ArenaLayout {
  size_t segment_table;   // SegmentInfo[max_segments]
  size_t keyspace_table;  // KeyspaceSlot[kKeyspaceSlots]
  size_t memtables;       // the memtable slots, memtable_stride bytes each
  size_t memtable_stride;
  size_t memtable_header;  // bytes before a slot's data area
  size_t l0_buffers;       // kL0LogBuffers segment images
  size_t large_buffers;    // kLargeLogBuffers segment images
  size_t row_cache;        // RowCache::RegionBytes(row_cache_size) bytes (maybe none)
  size_t total;

  static ArenaLayout For(const Options& options);
};

}  // namespace slipstream::engine
