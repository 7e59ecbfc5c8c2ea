// What the shm backend's connections and ShmPeerWriter share about a peer's heap: mapping it
// from its description, reading its region table, resolving an access inside it, and the
// copy that places a WRITE's bytes in increasing address order.
#pragma once

#include <cstddef>
#include <cstdint>

#include "shm_transport.h"
#include "slipstream/rdma/status.h"

namespace slipstream::rdma {

// A consistent copy of one table entry.
struct EntrySnapshot {
  uint64_t rkey = 0;
  uint64_t base = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint32_t access = 0;
  uint32_t state = kShmEntryFree;
};

// Reads an entry under its seqlock; false if the owner kept it mid-update for too long.
bool ReadEntry(const ShmTableEntry& entry, EntrySnapshot* out);

// Checks a peer's description, opens its memfd through /proc, checks the file (size, seals,
// owner) and the header inside it (format, sizes, token), and maps the heap read-write at
// *heap (heap_size bytes). Nothing from the peer is trusted.
Status MapShmPeerHeap(const ShmHeapDescription& theirs, char** heap);

// The address in a mapped peer heap for an access of `length` bytes at `remote_addr` of the
// region `entry` describes, needing `right`; nullptr when the range leaves the region, the
// right is missing, or the entry points outside the heap's region space. No sum can
// overflow: every test compares an offset with the room left.
char* ResolveInShmHeap(char* heap, uint64_t heap_size, const EntrySnapshot& entry,
                       uint64_t remote_addr, uint64_t length, uint32_t right);

// Copies with plain stores in strictly increasing address order (see shm_heap.cc).
void CopyAscending(char* dst, const char* src, size_t length);

}  // namespace slipstream::rdma
