// fake_connection.h: what the fuzz targets' fake transport connections (a scripted backup, a
// scripted primary, a channel's peer) and the seeds' recording connections all do the same way
// as a real transport: keep regions, gather a work request's bytes and hand out queued
// completions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>

#include "slipstream/rdma/transport.h"

namespace slipstream::fuzz {

// The bytes a work request gathers from its scatter-gather list, in order: what a transport
// puts on the wire for it.
inline std::string GatheredBytes(const rdma::WorkRequest& wr) {
  std::string bytes;
  for (uint32_t i = 0; i < wr.num_sge; i++) {
    bytes.append(static_cast<const char*>(wr.sg_list[i].addr), wr.sg_list[i].length);
  }
  return bytes;
}

// Moves up to `max` queued completions into `out`, oldest first, as a transport's Poll hands
// them out; returns how many it moved.
inline size_t PopCompletions(std::deque<rdma::Completion>* queue, rdma::Completion* out,
                             size_t max) {
  size_t count = 0;
  while (count < max && !queue->empty()) {
    out[count++] = queue->front();
    queue->pop_front();
  }
  return count;
}

// The regions of a fake connection whose peer addresses them by their real addresses: memory
// AllocateRegion hands out on the heap (zeroed, never empty, so that ASan sees any access past
// it), keys counted from 1, and an rkey equal to the lkey unless the region is local-only.
class HeapRegions {
 public:
  // Allocates zeroed memory for `region` under the next key, with the given access.
  void Allocate(size_t length, uint32_t access, rdma::LocalRegion* region) {
    std::unique_ptr<char[]> memory(new char[length == 0 ? 1 : length]());
    region->addr = memory.get();
    region->length = length;
    region->lkey = next_key_++;
    region->rkey = access == rdma::kLocalOnly ? 0 : region->lkey;
    region->access = access;
    memory_[region->lkey] = std::move(memory);
  }
  // Registers the caller's memory as `region` under the next key, for local use only.
  void Register(void* addr, size_t length, rdma::LocalRegion* region) {
    region->addr = static_cast<char*>(addr);
    region->length = length;
    region->lkey = next_key_++;
    region->rkey = 0;
  }
  // Frees the memory Allocate gave `region` (nothing for a registered one).
  void Free(const rdma::LocalRegion& region) { memory_.erase(region.lkey); }
  // What the peer needs to reach `region`: its address in this process, its length and rkey.
  static rdma::RemoteRegion Describe(const rdma::LocalRegion& region) {
    return rdma::RemoteRegion{uint64_t(uintptr_t(region.addr)), region.length, region.rkey};
  }

 private:
  std::map<uint32_t, std::unique_ptr<char[]>> memory_;
  uint32_t next_key_ = 1;
};

}  // namespace slipstream::fuzz
