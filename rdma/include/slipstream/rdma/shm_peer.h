// One-sided WRITEs into an shm peer's regions from another process of this host and user,
// without a connection of its own. A primary's committing backends place their own commits
// this way (docs/replication.md, "Placement by the committing backend"): the shipper owns the
// connection and exports its peer's heap as a plain ShmPeerRef, which can live in memory
// shared between processes; a backend opens the ref and WRITEs with the same checks and the
// same ordering as a connection's Post. Every WRITE reads the region's key, rights and bounds
// from the peer's table, so a key the peer revoked (a fenced primary) refuses it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "slipstream/rdma/status.h"
#include "slipstream/rdma/transport.h"

namespace slipstream::rdma {

// Where a peer's heap is: trivially copyable, no pointers.
struct ShmPeerRef {
  int32_t pid = 0;
  int32_t memfd = -1;
  uint64_t token[2] = {0, 0};
  uint64_t heap_size = 0;
  uint64_t region_space = 0;
};

// The peer heap of `connection` (Unavailable unless it is an established shm connection).
Status ExportShmPeer(const Connection* connection, ShmPeerRef* ref);

class ShmPeerWriter {
 public:
  // Maps the heap `ref` names and checks it carries that description (InvalidArgument when
  // the process, its file or the heap's header do not match: a peer that restarted).
  static Status Open(const ShmPeerRef& ref, std::unique_ptr<ShmPeerWriter>* writer);
  ~ShmPeerWriter();
  ShmPeerWriter(const ShmPeerWriter&) = delete;
  ShmPeerWriter& operator=(const ShmPeerWriter&) = delete;

  // Whether this writer maps the heap `ref` names.
  bool Maps(const ShmPeerRef& ref) const;

  // Places `length` bytes at `remote_addr` of the region with key `rkey`, in increasing
  // address order, visible before any later WRITE's bytes; RemoteAccess, placing nothing,
  // when the key is unknown or revoked, the range leaves the region or it is not writable.
  // After the copy it checks the key again (RemoteAccess if the peer revoked it meanwhile)
  // and that the peer's process still lives (Disconnected if not: its heap outlives it in
  // our mapping, and bytes placed there count for nothing).
  Status Write(uint64_t rkey, uint64_t remote_addr, const void* data, size_t length);

 private:
  ShmPeerWriter() = default;
  // Whether the process that owns the heap has not exited.
  bool PeerAlive() const;

  ShmPeerRef ref_;
  char* heap_ = nullptr;
  int pidfd_ = -1;            // the peer's process (-1: kill(pid, 0) is asked instead)
  uint32_t cached_slot_ = 0;  // the table slot the last WRITE's key was found in
};

}  // namespace slipstream::rdma
