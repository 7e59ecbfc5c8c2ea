// ArenaLayout: see arena_layout.h.
#include "arena_layout.h"

#include "memtable_pool.h"
#include "row_cache.h"
#include "shared_state.h"

namespace slipstream::engine {

namespace {

constexpr size_t kAlign = 4096;

size_t AlignUp(size_t n) {
  return (n + kAlign - 1) & ~(kAlign - 1);
}

}  // namespace

ArenaLayout ArenaLayout::For(const Options& o) {
  ArenaLayout l;
  size_t off = AlignUp(sizeof(SharedState));
  l.segment_table = off;
  off = AlignUp(off + (o.max_device_size / o.segment_size) * sizeof(SegmentInfo));
  l.keyspace_table = off;
  off = AlignUp(off + kKeyspaceSlots * sizeof(KeyspaceSlot));
  l.memtables = off;
  l.memtable_header = AlignUp(sizeof(MemtableHeader));
  l.memtable_stride = AlignUp(l.memtable_header + MemtablePool::SlotBytes(o));
  off = AlignUp(off + o.memtables * l.memtable_stride);
  l.l0_buffers = off;
  off += size_t(kL0LogBuffers) * o.segment_size;
  l.large_buffers = off;
  off += size_t(kLargeLogBuffers) * o.segment_size;
  l.row_cache = off;
  off += RowCache::RegionBytes(o.row_cache_size);
  l.total = off;
  return l;
}

}  // namespace slipstream::engine
