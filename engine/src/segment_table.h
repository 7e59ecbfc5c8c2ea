// SegmentTable: the allocator of device segments and the per-segment accounting (kind, owner,
// log sequence, written and invalid bytes, flags) that GC, retirement and the manifest use.
#pragma once

#include <cstdint>

#include "device.h"
#include "shared_state.h"

namespace slipstream::engine {

class SegmentTable {
 public:
  SegmentTable(char* arena, SharedSegments* shared, Device* device)
      : arena_(arena), shared_(shared), device_(device) {}

  // Lays out an empty table of `max_segments` entries at arena offset `table_offset`.
  void Format(uint64_t table_offset, uint64_t max_segments);

  // Guards every entry. Callers that read or change several entries at once hold it; the
  // write path updates the active large-log segment's bytes under the write mutex instead.
  SharedMutex* mutex() const { return &shared_->alloc_mu; }

  // The entry of `segment` (below count()).
  SegmentInfo& info(uint64_t segment) const { return Table()[segment]; }

  // Segments the device file holds now; entries past it are free.
  uint64_t count() const { return shared_->device_segments; }
  // Sets the device size found by recovery.
  void set_count(uint64_t segments) { shared_->device_segments = segments; }

  // Takes the first free segment after the allocation hint, growing the device file when
  // none is free (IOError when it reached max_device_size).
  Status Allocate(SegmentKind kind, uint32_t owner, uint32_t* segment);

  // Frees every index and bloom segment of a tree.
  void FreeTree(uint32_t tree);

  // Frees one segment; returns the log bytes it held (for the GC counters).
  uint64_t Free(uint32_t segment);

 private:
  SegmentInfo* Table() const {
    return reinterpret_cast<SegmentInfo*>(arena_ + shared_->table_offset);
  }

  char* arena_;
  SharedSegments* shared_;
  Device* device_;
};

}  // namespace slipstream::engine
