// The multi-buffer channel (Geyer et al.): byte messages of any size between the two sides of a
// Connection, moved with one-sided writes.
//
// Each side has one Send Buffer (a local staging region, split among sender threads), N Receive
// Buffers the peer writes packages into, and a Buffer-Info array (registered for remote writes)
// holding the state of its own Receive Buffers (written "ready" by the peer) and of the peer's
// (written "free" by the peer). A message larger than a Receive Buffer travels as several
// packages to the next free buffers without waiting for the first to be consumed, and each
// sender slot keeps up to `packages_in_flight` packages on the wire at once (its Send Buffer
// part is a small ring), so the data and READY writes of consecutive packages overlap. The
// receiver polls its Buffer-Info, consumes a package (copy-out or zero-copy view), and frees
// the buffer with a remote write. Single-buffer mode (one receive buffer) is the paper's
// baseline: every package waits for the previous one to be consumed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "slipstream/rdma/schedule.h"
#include "slipstream/rdma/transport.h"

namespace slipstream::rdma {

struct ChannelOptions {
  uint32_t receive_buffers = 4;             // this side's Receive Buffers, 1..7
  uint32_t receive_buffer_size = 1u << 20;  // bytes each, 4 KiB..1 GiB
  uint32_t send_buffer_size = 4u << 20;     // the Send Buffer, split among sender threads
  uint32_t sender_threads = 1;              // 1..16 threads that may Send at once
  // Packages one sender slot may have in flight, 1..8 (sender_threads x packages_in_flight at
  // most 64). Each slot's share of the Send Buffer is split into this many parts, so a package
  // carries at most send_buffer_size / (sender_threads x packages_in_flight) bytes with header.
  uint32_t packages_in_flight = 4;
};

// A received message.
struct Message {
  uint32_t opcode = 0;
  uint32_t sender = 0;  // the sending thread's slot
  std::string data;
};

// A package still in its Receive Buffer (zero-copy receive); Release() frees the buffer.
struct PackageView {
  uint32_t opcode = 0;
  uint32_t sender = 0;
  uint64_t message_size = 0;
  uint64_t offset = 0;  // of this package in its message
  std::string_view data;
  uint32_t buffer = 0;
  uint64_t sequence = 0;
};

class Channel {
 public:
  // Sets the channel up over `connection` (which it uses exclusively from now on); both sides
  // call Open. Receive Buffer counts and sizes may differ between the sides.
  static Status Open(Connection* connection, const ChannelOptions& options, int timeout_ms,
                     std::unique_ptr<Channel>* channel);
  virtual ~Channel() = default;

  // Sends `data` as one message from sender slot `sender` (0..sender_threads-1; one thread
  // per slot). Waits up to timeout_ms for free buffers (0: WouldBlock instead of waiting).
  // Returns once every package is posted (the payload was copied; up to packages_in_flight of
  // them may still be on the wire, and the channel delivers them unless the connection fails).
  virtual Status Send(uint32_t opcode, std::string_view data, uint32_t sender, int timeout_ms) = 0;
  // Zero-copy send: the payload is written straight from a region of this connection. Returns
  // only once every package has been written, so the caller may change the bytes afterwards.
  virtual Status SendRegion(uint32_t opcode, const LocalRegion& region, size_t offset,
                            size_t length, uint32_t sender, int timeout_ms) = 0;

  // Sends a declarative region (region.h) as one message: `prefix` (copied; e.g. the encoded
  // layout), then the region's wire image under `schedule`. Packed boxes are copied into the
  // Send Buffer beside each package header, the others are written straight from `source` (a
  // region of this connection, or caller memory registered with RegisterLocal). The receiver
  // finds the fragments after the prefix with LandingCursor or Unpack and the same layout and
  // options. Returns once every package has been written.
  virtual Status SendLayout(uint32_t opcode, std::string_view prefix, const LocalRegion& source,
                            const RegionLayout& layout, const Schedule& schedule, uint32_t sender,
                            int timeout_ms) = 0;

  // Waits up to timeout_ms until every package this side sent has been placed at the peer.
  virtual Status Flush(int timeout_ms) = 0;

  // Receives the next complete message (copy-out). Messages of one sender arrive in order.
  // Messages placed whole before the peer disconnected are still delivered.
  virtual Status Receive(Message* message, int timeout_ms) = 0;
  // Zero-copy: the next package in place; Release() it when done.
  virtual Status ReceivePackage(PackageView* package, int timeout_ms) = 0;
  virtual Status Release(const PackageView& package) = 0;

  // The peer's Receive Buffer size: a message larger than this needs several packages.
  virtual uint32_t peer_buffer_size() const = 0;
  virtual uint32_t package_header_size() const = 0;
};

}  // namespace slipstream::rdma
