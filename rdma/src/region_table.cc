// RegionTable: random keys and overflow-safe checks of every remote access.
#include "region_table.h"

#include "setup.h"

namespace slipstream::rdma {

// Registers a region under a fresh random key (redrawn on the rare collision, so keys stay
// unique and a peer cannot guess one from another).
Status RegionTable::Add(char* addr, size_t length, uint32_t access, uint64_t* rkey) {
  if (addr == nullptr || length == 0) return Status::InvalidArgument("empty region");
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t key = RandomKey();
  while (regions_.count(key) != 0) key = RandomKey();
  regions_.emplace(key, Region{addr, length, access});
  bytes_ += length;
  *rkey = key;
  return Status::OK();
}

// A key drawn by RandomKey for another table is as hard to guess here.
Status RegionTable::AddWithKey(char* addr, size_t length, uint32_t access, uint64_t rkey) {
  if (addr == nullptr || length == 0) return Status::InvalidArgument("empty region");
  if (rkey == 0) return Status::InvalidArgument("a region key is never 0");
  std::lock_guard<std::mutex> lock(mu_);
  if (!regions_.emplace(rkey, Region{addr, length, access}).second) {
    return Status::InvalidArgument("the region key is taken on this connection");
  }
  bytes_ += length;
  return Status::OK();
}

// Forgets a region; later accesses with its key fail to resolve.
Status RegionTable::Remove(uint64_t rkey) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = regions_.find(rkey);
  if (it == regions_.end()) return Status::InvalidArgument("unknown region key");
  bytes_ -= it->second.length;
  regions_.erase(it);
  return Status::OK();
}

// Checks key, bounds and right. The bounds test never forms remote_addr + length (which could
// wrap around): it compares the offset and the remaining room instead. A zero right is
// refused, since a caller that asks for no right has a bug and must not get a pointer.
char* RegionTable::Resolve(uint64_t rkey, uint64_t remote_addr, uint64_t length,
                           uint32_t right) const {
  if (right == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = regions_.find(rkey);
  if (it == regions_.end()) return nullptr;
  const Region& region = it->second;
  if ((region.access & right) != right) return nullptr;
  const uint64_t base = reinterpret_cast<uintptr_t>(region.addr);
  if (remote_addr < base) return nullptr;
  const uint64_t offset = remote_addr - base;
  if (offset > region.length || length > region.length - offset) return nullptr;
  return region.addr + offset;
}

// Total bytes registered.
size_t RegionTable::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

}  // namespace slipstream::rdma
