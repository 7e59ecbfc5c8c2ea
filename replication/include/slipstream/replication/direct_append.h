// Appends to a backup's open WAL buffer by processes other than the shipper: a primary's
// committing backends place their own commits this way when no shipper round is under way
// (docs/replication.md, "Placement by the committing backend"). A StreamShipper whose one
// backup is reached over shm exports its open segment as a SharedCursor, plain data that lives
// in memory shared between processes; any of them appends records with AppendDirect through
// an rdma::ShmPeerWriter, byte for byte as StreamShipper::Append would, and the shipper adopts
// what they appended before it appends, rotates or flushes again. The caller serialises every
// use of one cursor, the shipper's own appends included, with a lock of its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "slipstream/rdma/shm_peer.h"
#include "slipstream/replication/wire.h"

namespace slipstream::replication {

// The open segment of a stream on one backup. Trivially copyable, no pointers.
struct SharedCursor {
  uint32_t valid = 0;  // 1 while it describes an open buffer that direct appends may extend
  uint32_t buffer_size = 0;
  uint64_t sequence = 0;     // the segment's (a rotation changes it)
  uint64_t rkey = 0;         // the backup's key for the buffer
  uint64_t remote_addr = 0;  // the buffer's first byte, in the backup's numbering
  uint32_t pos = 0;          // the next free byte of the buffer
  uint32_t chain = 0;        // the checksum chain over the record headers so far
  uint64_t end = 0;          // the stream position after the last appended byte
  rdma::ShmPeerRef peer;     // the backup's heap
};

// Appends the stream bytes from `position` (which must be cursor->end) as records, each
// followed by its checksum and written with it in one WRITE, until they are all in or the
// buffer has no room for another record (the shipper rotates it). *appended says how many
// bytes went; they are placed on the backup when this returns. A refused WRITE (the backup
// revoked its keys: fenced) leaves the cursor as it was and marks it invalid.
Status AppendDirect(SharedCursor* cursor, rdma::ShmPeerWriter* writer, uint64_t position,
                    std::string_view bytes, size_t* appended);

}  // namespace slipstream::replication
