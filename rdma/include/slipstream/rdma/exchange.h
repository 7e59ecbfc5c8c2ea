// An all-to-all exchange of row batches between N participants (the transport under the query
// shuffle, docs/shuffle.md): one connection and one multi-buffer channel per pair, batches sent
// as declarative regions.
//
// Every participant has an index (0..N-1) and a listener; participant i connects to every j < i
// and accepts every j > i, and each connection names the exchange and the connecting index in
// its first message, so a connection from anyone else is dropped. A batch is a region of the
// caller's source buffer (typically a pointer-mapped layout over encoded rows, masked to the
// rows one target owns); it travels as one channel message: the encoded layout and the
// planner's thresholds, then the wire image written straight from the source. A batch must
// fit one of the peer's Receive Buffers (max_batch_bytes), so a send either goes out whole or
// returns WouldBlock having sent nothing: the caller then drains what arrived (Receive) and
// tries again, and two participants sending to each other never wait on each other. Each
// participant ends its stream to every peer with End; Receive reports each peer's end once, and
// Close confirms the end both ways before the exchange is destroyed.
//
// Failures: a peer that disconnects before its end, a malformed message, or a transport error
// fails the call that meets it with a status naming the participant; the caller then destroys
// the exchange, which disconnects every connection, so the other participants fail too.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "slipstream/rdma/channel.h"
#include "slipstream/rdma/region.h"
#include "slipstream/rdma/schedule.h"
#include "slipstream/rdma/transport.h"

namespace slipstream::rdma {

struct ExchangeOptions {
  TransportOptions transport;  // backend and the shared secret
  ChannelOptions channel;      // per pair; every participant should use the same sizes
  uint64_t exchange_id = 0;    // the same on every participant, different per exchange
  uint32_t self = 0;           // this participant's index
  // Every participant's listener address ("HOST:PORT"), by index; self's entry is not used.
  std::vector<std::string> addresses;
  int timeout_ms = 10000;  // for setting up, and for any one wait on a peer after that
};

// What one peer sent: a batch of rows, or the end of its stream.
struct ExchangeMessage {
  uint32_t from = 0;
  bool end = false;
  RegionLayout layout;      // in the sender's numbering
  ScheduleOptions options;  // the sender planner's thresholds
  std::string data;         // the message: the wire image starts at wire_offset
  uint64_t wire_offset = 0;
};

// Traffic with one peer.
struct ExchangeCounters {
  uint64_t batches_sent = 0;
  uint64_t payload_bytes_sent = 0;  // described bytes
  uint64_t wire_bytes_sent = 0;     // with bridged gaps and headers
  uint64_t batches_received = 0;
  uint64_t payload_bytes_received = 0;
  uint64_t wire_bytes_received = 0;
};

class Exchange {
 public:
  // Connects to every other participant (see above) within options.timeout_ms. `listener` is
  // this participant's own, already listening at options.addresses[options.self].
  static Status Open(const ExchangeOptions& options, Listener* listener,
                     std::unique_ptr<Exchange>* exchange);
  virtual ~Exchange() = default;

  // Registers the caller's buffer that batches are described in, on every connection (it
  // replaces an earlier one); the memory must stay until the next SetSource or the end.
  virtual Status SetSource(void* addr, size_t length) = 0;
  // Registers a buffer that batches to `target` alone are described in, on that connection
  // only (it replaces that peer's earlier one): a caller that keeps each peer's rows apart
  // registers (and, on verbs, pins) each byte once rather than once per peer.
  virtual Status SetSourceFor(uint32_t target, void* addr, size_t length) = 0;
  // Sends the rows `layout` describes in the source buffer to participant `target` (not self)
  // as one batch, planned for the target's transport with `costs`. WouldBlock, having sent
  // nothing, when the target has no free Receive Buffer; InvalidArgument when the batch does
  // not fit one (max_batch_bytes) or the layout leaves the source.
  virtual Status TrySend(uint32_t target, const RegionLayout& layout,
                         const TransferCosts& costs) = 0;
  // Ends this participant's stream to `target`; WouldBlock as TrySend.
  virtual Status TryEnd(uint32_t target) = 0;
  // The next message from any peer, waiting up to timeout_ms (0: do not wait): Timeout when
  // none arrived. After a peer's end nothing more comes from it.
  virtual Status Receive(ExchangeMessage* message, int timeout_ms) = 0;
  // Whether every peer has ended its stream (and every message was received).
  virtual bool AllEnded() const = 0;
  // Finishes the exchange, once every stream was ended (TryEnd to every peer) and every peer's
  // end received (AllEnded): tells every peer that everything it sent arrived here, and waits
  // up to timeout_ms until every peer says the same. After it, destroying the exchange loses
  // nothing and fails no peer. A peer lost before it confirmed fails it, naming the peer.
  virtual Status Close(int timeout_ms) = 0;

  // The largest batch, encoded layout and wire image together, that one message can carry
  // (what the message adds, the planner's thresholds, is already taken off).
  virtual uint64_t max_batch_bytes() const = 0;
  virtual uint32_t participants() const = 0;
  virtual uint32_t self() const = 0;
  virtual std::string backend(uint32_t peer) const = 0;
  virtual ExchangeCounters counters(uint32_t peer) const = 0;
};

}  // namespace slipstream::rdma
