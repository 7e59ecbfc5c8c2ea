// MemtablePool: the memtable slots in the arena. One slot is active, at most one immutable
// (being compacted); the rest are free or still pinned by readers of older versions.
#pragma once

#include <cstdint>

#include "memtable.h"
#include "shared_state.h"
#include "slipstream/engine/options.h"

namespace slipstream::engine {

class MemtablePool {
 public:
  MemtablePool(char* arena, SharedMemtables* shared) : arena_(arena), shared_(shared) {}

  // Bytes of one slot's data area for these options (a full L0 plus slack for one batch).
  static uint64_t DataCapacity(const Options& options) {
    return options.l0_size + options.segment_size + (64u << 10);
  }

  // Lays out `count` slots of `stride` bytes from arena offset `first` (header, then data);
  // slot 0 starts empty and in use.
  void Format(uint64_t first, uint64_t stride, uint64_t header_bytes, uint32_t count);

  uint32_t count() const { return shared_->count; }
  MemTable Get(int slot) const {
    return MemTable(Header(slot), arena_ + Header(slot)->data_offset);
  }
  MemtableHeader* Header(int slot) const {
    return reinterpret_cast<MemtableHeader*>(arena_ + shared_->offset[slot]);
  }

  // A slot other than `except` that no reader can see any more, or -1.
  int FindFree(int except) const;

  // Empties a free slot and marks it in use (the caller holds the write mutex).
  void Claim(int slot);

  // Marks a slot free for reuse (no reader can see it any more).
  void Release(int slot) { Header(slot)->in_use.store(0); }

 private:
  char* arena_;
  SharedMemtables* shared_;
};

}  // namespace slipstream::engine
