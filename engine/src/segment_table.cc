// SegmentTable: see segment_table.h.
#include "segment_table.h"

#include <algorithm>

namespace slipstream::engine {

void SegmentTable::Format(uint64_t table_offset, uint64_t max_segments) {
  shared_->alloc_mu.Init();
  shared_->table_offset = table_offset;
  shared_->max_segments = max_segments;
}

// First free segment from the allocation hint; grows the device file when none is free.
Status SegmentTable::Allocate(SegmentKind kind, uint32_t owner, uint32_t* segment) {
  SharedLock lock(&shared_->alloc_mu);
  SegmentInfo* table = Table();
  while (true) {
    uint64_t n = shared_->device_segments;
    for (uint64_t i = 0; i < n; i++) {
      uint64_t idx = (shared_->alloc_hint + i) % n;
      if (idx == 0 || table[idx].kind != uint8_t(SegmentKind::kFree)) continue;
      table[idx] = SegmentInfo{};
      table[idx].kind = uint8_t(kind);
      table[idx].owner = owner;
      shared_->alloc_hint = uint32_t(idx + 1);
      *segment = uint32_t(idx);
      return Status::OK();
    }
    uint64_t max = shared_->max_segments;
    uint64_t grown = std::min<uint64_t>(max, n + std::max<uint64_t>(64, n / 8));
    if (grown <= n) return Status::IOError("device is full: raise max_device_size");
    Status s = device_->Grow(grown);
    if (!s.ok()) return s;
    shared_->device_segments = grown;
  }
}

void SegmentTable::FreeTree(uint32_t tree) {
  SharedLock lock(&shared_->alloc_mu);
  SegmentInfo* table = Table();
  for (uint64_t seg = 1; seg < shared_->device_segments; seg++) {
    SegmentInfo& info = table[seg];
    if ((info.kind == uint8_t(SegmentKind::kIndex) || info.kind == uint8_t(SegmentKind::kBloom)) &&
        info.owner == tree) {
      info = SegmentInfo{};
    }
  }
}

uint64_t SegmentTable::Free(uint32_t segment) {
  SharedLock lock(&shared_->alloc_mu);
  SegmentInfo& info = Table()[segment];
  uint64_t log_bytes = 0;
  if (info.kind == uint8_t(SegmentKind::kLargeLog) ||
      info.kind == uint8_t(SegmentKind::kMediumLog)) {
    log_bytes = info.bytes_written;
  }
  info = SegmentInfo{};
  return log_bytes;
}

}  // namespace slipstream::engine
