// Appends to a backup's open WAL buffer by processes other than the shipper: a primary's
// committing backends place their own commits this way when no shipper round is under way
// (docs/replication.md, "Placement by the committing backend"). A StreamShipper whose one
// backup is reached over shm or tcp exports its open segment as a SharedCursor, plain data that
// lives in memory shared between processes; any of them appends records with AppendDirect,
// byte for byte as StreamShipper::Append would, through a DirectTarget: over shm its own
// mapping of the backup's heap (ShmDirectTarget), over tcp its own placer link to the backup
// (PlacerLink, placer_link.h). The shipper adopts what they appended before it appends, rotates
// or flushes again. The caller serialises every use of one cursor, the shipper's own appends
// included, with a lock of its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "slipstream/rdma/shm_peer.h"
#include "slipstream/replication/wire.h"

namespace slipstream::replication {

// How a SharedCursor's buffer is reached.
enum class CursorTransport : uint32_t {
  kShm = 1,  // through `peer`, the backup's heap
  kTcp = 2,  // through a placer link to the backup the cursor belongs to
};

// The open segment of a stream on one backup. Trivially copyable, no pointers.
struct SharedCursor {
  uint32_t valid = 0;      // 1 while it describes an open buffer that direct appends may extend
  uint32_t transport = 0;  // a CursorTransport
  // Set by an appender whose WRITEs may have reached the buffer without being known placed
  // (a placer link that failed or timed out): the shipper must not append after them, so it
  // ends its link (the backup revokes and persists the valid prefix) and resumes from there.
  uint32_t broken = 0;
  uint32_t buffer_size = 0;
  uint64_t sequence = 0;     // the segment's (a rotation changes it)
  uint64_t rkey = 0;         // the backup's key for the buffer
  uint64_t remote_addr = 0;  // the buffer's first byte, in the backup's numbering
  uint32_t pos = 0;          // the next free byte of the buffer
  uint32_t chain = 0;        // the checksum chain over the record headers so far
  uint64_t end = 0;          // the stream position after the last appended byte
  rdma::ShmPeerRef peer;     // the backup's heap
};

// Where AppendDirect's WRITEs go.
class DirectTarget {
 public:
  virtual ~DirectTarget() = default;
  // WRITEs `length` bytes (records and their checksums) at `remote_addr` of the backup's
  // region `rkey`, after every earlier Write of this target. Over shm they are placed when it
  // returns; over tcp once the placer link's Finish returns OK.
  virtual Status Write(uint64_t rkey, uint64_t remote_addr, const void* data, size_t length) = 0;
};

// A DirectTarget over shm: a ShmPeerWriter's mapping of the backup's heap.
class ShmDirectTarget : public DirectTarget {
 public:
  explicit ShmDirectTarget(std::unique_ptr<rdma::ShmPeerWriter> writer)
      : writer_(std::move(writer)) {}
  Status Write(uint64_t rkey, uint64_t remote_addr, const void* data, size_t length) override {
    return writer_->Write(rkey, remote_addr, data, length);
  }
  bool Maps(const rdma::ShmPeerRef& ref) const { return writer_->Maps(ref); }

 private:
  std::unique_ptr<rdma::ShmPeerWriter> writer_;
};

// Appends the stream bytes from `position` (which must be cursor->end) as records, each
// followed by its checksum and written with it in one WRITE, until they are all in or the
// buffer has no room for another record (the shipper rotates it). *appended says how many
// bytes went, and the cursor moves past them: over shm they are placed when this returns, over
// tcp when the target's Finish says so (a caller keeps the cursor from before, to put back
// with `broken` set if it does not). A refused WRITE (the backup revoked its keys: fenced)
// leaves the cursor as it was and marks it invalid.
Status AppendDirect(SharedCursor* cursor, DirectTarget* target, uint64_t position,
                    std::string_view bytes, size_t* appended);

}  // namespace slipstream::replication
