// MemtablePool: see memtable_pool.h.
#include "memtable_pool.h"

namespace slipstream::engine {

void MemtablePool::Format(uint64_t first, uint64_t stride, uint64_t header_bytes, uint32_t count,
                          const Options& options) {
  shared_->count = count;
  for (uint32_t i = 0; i < count; i++) {
    shared_->offset[i] = first + i * stride;
    MemtableHeader* h = Header(int(i));
    h->data_offset = shared_->offset[i] + header_bytes;
    h->capacity = DataCapacity(options);
    h->index_offset = h->data_offset + IndexStart(options);
    h->index_slots = uint32_t(IndexSlots(options));
  }
  Claim(0);
}

int MemtablePool::FindFree(int except) const {
  for (int i = 0; i < int(shared_->count); i++) {
    if (i != except && Header(i)->in_use.load() == 0) return i;
  }
  return -1;
}

void MemtablePool::Claim(int slot) {
  Get(slot).Reset();
  Header(slot)->in_use.store(1);
}

}  // namespace slipstream::engine
