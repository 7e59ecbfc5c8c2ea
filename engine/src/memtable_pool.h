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
  // Slots of one slot's hash index: a power of two, at least one per 48 bytes of data area
  // (an eighth to a sixteenth of it). At the 7/10 cap it fills only with entries below about
  // 48 bytes on average: a table row's entry takes 60 or more (node, tower, back link, row
  // id key, a tuple or a 16-byte value pointer), a deletion's tombstone 44. A memtable of mostly
  // tombstones can fill it; the keys it could not take are then found by the skiplist.
  static uint64_t IndexSlots(const Options& options) {
    uint64_t slots = 1024;
    while (slots * 48 < DataCapacity(options)) slots *= 2;
    return slots;
  }
  // Bytes of one slot after its header: the data area, then the index and neighbour table.
  static uint64_t SlotBytes(const Options& options) {
    return IndexStart(options) + MemTable::IndexWords(uint32_t(IndexSlots(options))) * 4;
  }
  // Where the index starts after the data area (cache-line aligned).
  static uint64_t IndexStart(const Options& options) {
    return (DataCapacity(options) + 63) & ~63ull;
  }

  // Lays out `count` slots of `stride` bytes from arena offset `first` (header, data area,
  // index); slot 0 starts empty and in use.
  void Format(uint64_t first, uint64_t stride, uint64_t header_bytes, uint32_t count,
              const Options& options);

  uint32_t count() const { return shared_->count; }
  MemTable Get(int slot) const {
    MemtableHeader* h = Header(slot);
    return MemTable(h, arena_ + h->data_offset,
                    reinterpret_cast<std::atomic<uint32_t>*>(arena_ + h->index_offset));
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
