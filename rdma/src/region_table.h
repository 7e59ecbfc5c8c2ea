// The regions one side has registered on a connection: random remote keys, and every remote
// access checked for key, bounds and rights before a byte is touched. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "slipstream/rdma/status.h"

namespace slipstream::rdma {

class RegionTable {
 public:
  // Registers [addr, addr+length) with `access`; returns its random, unique, non-zero key.
  Status Add(char* addr, size_t length, uint32_t access, uint64_t* rkey);
  // Registers it under `rkey`, a key drawn elsewhere (InvalidArgument if 0 or taken here).
  Status AddWithKey(char* addr, size_t length, uint32_t access, uint64_t rkey);
  Status Remove(uint64_t rkey);
  // The local address for a remote access of `length` bytes at `remote_addr` (the region's
  // own numbering: its local address) needing `right`; nullptr if the key is unknown, the range
  // is not inside the region, or the right was not granted.
  char* Resolve(uint64_t rkey, uint64_t remote_addr, uint64_t length, uint32_t right) const;
  size_t bytes() const;

 private:
  struct Region {
    char* addr;
    size_t length;
    uint32_t access;
  };
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, Region> regions_;
  size_t bytes_ = 0;
};

}  // namespace slipstream::rdma
