// The all-to-all exchange: a channel per pair, a hello naming the exchange on each, batches as
// declarative regions, an end message per stream. The messages themselves: exchange_wire.h.
#include "slipstream/rdma/exchange.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>

#include "exchange_wire.h"

namespace slipstream::rdma {

namespace {

using Clock = std::chrono::steady_clock;
using namespace exchange_wire;

// Milliseconds left until `deadline`, at least 0.
int Left(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return int(std::max<int64_t>(0, left.count()));
}

// `s` with the participant it concerns in front of its message.
Status About(uint32_t peer, const Status& s) {
  const std::string text = "participant " + std::to_string(peer) + ": " + s.message();
  switch (s.code()) {
    case Status::Code::kInvalidArgument:
      return Status::InvalidArgument(text);
    case Status::Code::kAuthFailed:
      return Status::AuthFailed(text);
    case Status::Code::kRemoteAccess:
      return Status::RemoteAccess(text);
    case Status::Code::kWouldBlock:
      return Status::WouldBlock(text);
    case Status::Code::kTimeout:
      return Status::Timeout(text);
    case Status::Code::kUnavailable:
      return Status::Unavailable(text);
    case Status::Code::kIOError:
      return Status::IOError(text);
    default:
      return Status::Disconnected(text);
  }
}

class ExchangeImpl : public Exchange {
 public:
  explicit ExchangeImpl(const ExchangeOptions& options)
      : options_(options), peers_(options.addresses.size()) {}
  ~ExchangeImpl() override;

  // Connects to the lower participants, then accepts the higher ones on `listener`.
  Status Connect(Listener* listener);

  Status SetSource(void* addr, size_t length) override;
  Status SetSourceFor(uint32_t target, void* addr, size_t length) override;
  Status TrySend(uint32_t target, const RegionLayout& layout, const TransferCosts& costs) override;
  Status TryEnd(uint32_t target) override;
  Status Receive(ExchangeMessage* message, int timeout_ms) override;
  bool AllEnded() const override { return ended_ == peers_.size() - 1; }
  Status Close(int timeout_ms) override;
  uint64_t max_batch_bytes() const override { return max_batch_bytes_; }
  uint32_t participants() const override { return uint32_t(peers_.size()); }
  uint32_t self() const override { return options_.self; }
  std::string backend(uint32_t peer) const override {
    return peer < peers_.size() && peers_[peer].connection ? peers_[peer].connection->backend()
                                                           : "";
  }
  ExchangeCounters counters(uint32_t peer) const override {
    return peer < peers_.size() ? peers_[peer].counters : ExchangeCounters{};
  }

 private:
  struct Peer {
    std::unique_ptr<Connection> connection;
    std::unique_ptr<Channel> channel;
    LocalRegion source{};  // the caller's source buffer, registered on this connection
    bool sent_end = false;
    bool received_end = false;
    bool sent_done = false;
    bool received_done = false;
    ExchangeCounters counters;
  };

  // Opens the channel on a fresh connection (both sides call this at once).
  Status OpenChannel(Peer* peer, Clock::time_point deadline);
  // Checks a peer's target index for sending.
  Status CheckTarget(uint32_t target) const;
  // Decodes a batch message from `from` into *message.
  Status ParseBatch(uint32_t from, Message* raw, ExchangeMessage* message);
  // Deregisters the source from every connection.
  void DropSource();

  ExchangeOptions options_;
  std::vector<Peer> peers_;
  size_t ended_ = 0;
  size_t next_poll_ = 0;
  uint64_t max_batch_bytes_ = 0;
};

// Our last packages get a moment to be placed; then every connection goes down before any
// channel frees its buffers, so no peer's late write meets a freed region.
ExchangeImpl::~ExchangeImpl() {
  for (Peer& peer : peers_) {
    if (peer.channel) (void)peer.channel->Flush(1000);
  }
  for (Peer& peer : peers_) {
    if (peer.connection) peer.connection->Disconnect();
  }
  DropSource();
  for (Peer& peer : peers_) peer.channel.reset();
}

void ExchangeImpl::DropSource() {
  for (Peer& peer : peers_) {
    if (peer.connection && peer.source.addr) peer.connection->FreeRegion(peer.source);
    peer.source = LocalRegion{};
  }
}

Status ExchangeImpl::OpenChannel(Peer* peer, Clock::time_point deadline) {
  return Channel::Open(peer->connection.get(), options_.channel, std::max(1, Left(deadline)),
                       &peer->channel);
}

Status ExchangeImpl::Connect(Listener* listener) {
  const uint32_t n = uint32_t(peers_.size());
  const uint32_t self = options_.self;
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(options_.timeout_ms);
  const std::string hello_bytes = EncodeHello(self, n, options_.exchange_id);
  for (uint32_t j = 0; j < self; j++) {
    Peer& peer = peers_[j];
    TransportOptions transport = options_.transport;
    transport.connect_timeout_ms = std::max(1, Left(deadline));
    Status s = rdma::Connect(transport, options_.addresses[j], &peer.connection);
    if (s.ok()) s = OpenChannel(&peer, deadline);
    if (s.ok()) s = peer.channel->Send(kHello, hello_bytes, 0, std::max(1, Left(deadline)));
    // The accepting side answers with its own hello once it took us: both ends know.
    Message m;
    if (s.ok()) s = peer.channel->Receive(&m, std::max(1, Left(deadline)));
    if (s.ok() && !HelloFrom(m, j, n, options_.exchange_id)) {
      s = Status::InvalidArgument("not the expected participant of this exchange");
    }
    if (!s.ok()) return About(j, s);
  }
  // The higher participants connect in any order; anything that is not one of them is dropped.
  uint32_t missing = n - 1 - self;
  while (missing > 0) {
    if (Clock::now() >= deadline) {
      std::string who;
      for (uint32_t j = self + 1; j < n; j++) {
        if (!peers_[j].channel) who += (who.empty() ? "" : ", ") + std::to_string(j);
      }
      return Status::Timeout("participants " + who + " did not join the exchange in time");
    }
    Peer candidate;
    Status s = listener->Accept(std::max(1, Left(deadline)), &candidate.connection);
    if (!s.ok()) continue;  // a peer that failed authentication, or the deadline
    if (!OpenChannel(&candidate, deadline).ok()) continue;
    Message m;
    s = candidate.channel->Receive(&m, std::max(1, Left(deadline)));
    uint32_t from = 0;
    if (!s.ok() || !HelloFrom(m, std::nullopt, n, options_.exchange_id, &from) || from <= self ||
        peers_[from].channel) {
      continue;  // someone else's exchange, or a participant twice: dropped
    }
    if (!candidate.channel->Send(kHello, hello_bytes, 0, std::max(1, Left(deadline))).ok()) {
      continue;
    }
    peers_[from] = std::move(candidate);
    missing--;
  }
  // A batch must fit one package: the peer's Receive Buffer and our Send Buffer part.
  const ChannelOptions& c = options_.channel;
  const uint64_t part = c.send_buffer_size / (c.sender_threads * c.packages_in_flight);
  max_batch_bytes_ = UINT64_MAX;
  for (uint32_t j = 0; j < n; j++) {
    if (j == self) continue;
    const Channel& ch = *peers_[j].channel;
    max_batch_bytes_ =
        std::min<uint64_t>(max_batch_bytes_, std::min<uint64_t>(ch.peer_buffer_size(), part) -
                                                 ch.package_header_size() - kBatchTrailer);
  }
  if (n == 1) max_batch_bytes_ = 0;
  return Status::OK();
}

Status ExchangeImpl::SetSource(void* addr, size_t length) {
  DropSource();
  if (addr == nullptr || length == 0) return Status::InvalidArgument("empty source buffer");
  for (uint32_t j = 0; j < peers_.size(); j++) {
    if (j == options_.self) continue;
    Status s = peers_[j].connection->RegisterLocal(addr, length, &peers_[j].source);
    if (!s.ok()) {
      DropSource();
      return About(j, s);
    }
  }
  return Status::OK();
}

Status ExchangeImpl::SetSourceFor(uint32_t target, void* addr, size_t length) {
  if (target >= peers_.size() || target == options_.self) {
    return Status::InvalidArgument("no peer " + std::to_string(target) + " in this exchange");
  }
  if (addr == nullptr || length == 0) return Status::InvalidArgument("empty source buffer");
  Peer& peer = peers_[target];
  if (peer.source.addr) peer.connection->FreeRegion(peer.source);
  peer.source = LocalRegion{};
  Status s = peer.connection->RegisterLocal(addr, length, &peer.source);
  return s.ok() ? s : About(target, s);
}

Status ExchangeImpl::CheckTarget(uint32_t target) const {
  if (target >= peers_.size() || target == options_.self) {
    return Status::InvalidArgument("no peer " + std::to_string(target) + " in this exchange");
  }
  if (peers_[target].sent_end) {
    return Status::InvalidArgument("the stream to participant " + std::to_string(target) +
                                   " has ended");
  }
  return Status::OK();
}

Status ExchangeImpl::TrySend(uint32_t target, const RegionLayout& layout,
                             const TransferCosts& costs) {
  Status s = CheckTarget(target);
  if (!s.ok()) return s;
  if (peers_[target].source.addr == nullptr || layout.extent() > peers_[target].source.length) {
    return Status::InvalidArgument("the batch's layout leaves the source buffer");
  }
  const Schedule schedule = PlanSchedule(layout, costs);
  const std::string header = EncodeBatchHeader(layout, schedule.options);
  const uint64_t bytes = header.size() + schedule.wire_bytes;
  if (bytes > max_batch_bytes_ + kBatchTrailer) {
    return Status::InvalidArgument("a batch of " + std::to_string(bytes) +
                                   " bytes exceeds the largest one message carries (" +
                                   std::to_string(max_batch_bytes_) + ")");
  }
  Peer& peer = peers_[target];
  s = peer.channel->SendLayout(kBatch, header, peer.source, layout, schedule, 0, 0);
  if (s.code() == Status::Code::kWouldBlock) return s;
  if (!s.ok()) return About(target, s);
  peer.counters.batches_sent++;
  peer.counters.payload_bytes_sent += layout.payload_bytes();
  peer.counters.wire_bytes_sent += bytes;
  return Status::OK();
}

Status ExchangeImpl::TryEnd(uint32_t target) {
  Status s = CheckTarget(target);
  if (!s.ok()) return s;
  s = peers_[target].channel->Send(kEnd, {}, 0, 0);
  if (s.code() == Status::Code::kWouldBlock) return s;
  if (!s.ok()) return About(target, s);
  peers_[target].sent_end = true;
  return Status::OK();
}

Status ExchangeImpl::ParseBatch(uint32_t from, Message* raw, ExchangeMessage* message) {
  ScheduleOptions options;
  uint64_t wire_offset = 0;
  if (!exchange_wire::ParseBatch(raw->data, &message->layout, &options, &wire_offset)) {
    return About(from, Status::InvalidArgument("malformed batch"));
  }
  message->from = from;
  message->end = false;
  message->options = options;
  message->wire_offset = wire_offset;
  message->data = std::move(raw->data);
  Peer& peer = peers_[from];
  peer.counters.batches_received++;
  peer.counters.payload_bytes_received += message->layout.payload_bytes();
  peer.counters.wire_bytes_received += message->data.size();
  return Status::OK();
}

Status ExchangeImpl::Receive(ExchangeMessage* message, int timeout_ms) {
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (int round = 0;; round++) {
    for (size_t k = 0; k < peers_.size(); k++) {
      const uint32_t j = uint32_t((next_poll_ + k) % peers_.size());
      Peer& peer = peers_[j];
      if (j == options_.self || peer.received_end) continue;
      Message raw;
      Status s = peer.channel->Receive(&raw, 0);
      if (s.code() == Status::Code::kTimeout) continue;
      if (!s.ok()) return About(j, s);
      next_poll_ = j + 1;  // the others first next time
      const StreamMessage kind = Classify(raw);
      if (kind == StreamMessage::kEnd) {
        peer.received_end = true;
        ended_++;
        *message = ExchangeMessage{};
        message->from = j;
        message->end = true;
        return Status::OK();
      }
      if (kind != StreamMessage::kBatch) {
        peer.connection->Disconnect();
        return About(j, Status::InvalidArgument("unexpected message"));
      }
      s = ParseBatch(j, &raw, message);
      if (!s.ok()) peer.connection->Disconnect();
      return s;
    }
    if (AllEnded()) return Status::Timeout("every peer has ended its stream");
    if (Clock::now() >= deadline) return Status::Timeout("no batch arrived");
    // Spin briefly for latency, then sleep: a remote write raises no event to wait on.
    if (round < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

// Done goes to every peer and comes from every peer; a peer sends it only once it has our end,
// so its Done means it holds everything we sent, and it leaves only once it has ours.
Status ExchangeImpl::Close(int timeout_ms) {
  for (uint32_t j = 0; j < peers_.size(); j++) {
    if (j != options_.self && !peers_[j].sent_end) {
      return Status::InvalidArgument("end the stream to participant " + std::to_string(j) +
                                     " before closing");
    }
  }
  if (!AllEnded()) return Status::InvalidArgument("receive every peer's end before closing");
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (int round = 0;; round++) {
    bool finished = true;
    for (uint32_t j = 0; j < peers_.size(); j++) {
      if (j == options_.self) continue;
      Peer& peer = peers_[j];
      if (!peer.sent_done) {
        Status s = peer.channel->Send(kDone, {}, 0, 0);
        if (s.ok()) {
          peer.sent_done = true;
        } else if (s.code() != Status::Code::kWouldBlock) {
          return About(j, s);
        }
      }
      if (!peer.received_done) {
        Message m;
        Status s = peer.channel->Receive(&m, 0);
        if (s.ok() && IsDone(m)) {
          peer.received_done = true;
        } else if (s.ok()) {
          peer.connection->Disconnect();
          return About(j, Status::InvalidArgument("a message after its end"));
        } else if (s.code() != Status::Code::kTimeout) {
          return About(j, s);
        }
      }
      finished = finished && peer.sent_done && peer.received_done;
    }
    if (finished) return Status::OK();
    if (Clock::now() >= deadline) {
      return Status::Timeout("the peers did not confirm the end of the exchange in time");
    }
    if (round < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

}  // namespace

Status Exchange::Open(const ExchangeOptions& options, Listener* listener,
                      std::unique_ptr<Exchange>* exchange) {
  const size_t n = options.addresses.size();
  if (n == 0 || options.self >= n) {
    return Status::InvalidArgument("an exchange needs its participants' addresses and self < N");
  }
  if (n > 1024) return Status::InvalidArgument("at most 1024 participants");
  if (options.self + 1 < n && listener == nullptr) {
    return Status::InvalidArgument("a participant with higher peers needs a listener");
  }
  if (options.timeout_ms <= 0) return Status::InvalidArgument("timeout_ms must be positive");
  auto impl = std::make_unique<ExchangeImpl>(options);
  Status s = impl->Connect(listener);
  if (!s.ok()) return s;
  *exchange = std::move(impl);
  return Status::OK();
}

}  // namespace slipstream::rdma
