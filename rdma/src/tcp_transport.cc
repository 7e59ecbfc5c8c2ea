// The tcp backend (see tcp_transport.h for the wire format).
//
// Threads per connection:
//  * the agent receives frames with plain blocking recv() (with receive_in_poll there is no
//    agent: the thread in Poll waits for the socket itself and handles the frames that
//    arrived, one thread at a time). Payloads go straight into their
//    destination (a registered region, a posted receive buffer, or a READ's scatter list), so
//    nothing is bounced. Plain recv is enough here: the agent handles one frame at a time, and
//    a blocking read into the final buffer is already copy-free. The last 16 bytes of a WRITE
//    are received apart and stored after a fence, so that they are never visible before the
//    rest (the kernel's copy may store one recv's bytes in any order).
//  * the sender sends frames with io_uring (IORING_OP_SENDMSG with the header and the work
//    request's gather list as one iovec array: the payload is never copied into a staging
//    buffer). The sender is a thread of its own so that the agent never blocks on a send: if
//    both agents sent large READ responses while neither read, the sockets would deadlock.
//    When io_uring cannot be set up (disabled by sysctl or seccomp) it falls back to sendmsg().
//  * two shortcuts take a thread hand-off off the round trip of a small signaled WRITE (the
//    commit path of replication): a posting thread sends small requests itself, in order,
//    when no other thread is writing to the socket and no reply waits; and the agent sends an
//    ACK itself when the socket is idle. Neither ever blocks on the socket (MSG_DONTWAIT):
//    what the socket does not take is handed to the sender, which finishes the frame before
//    anything else. A posting thread that blocked there would wait as long as the peer reads
//    nothing: a backup whose process is stopped held the shipper, and every commit with it,
//    until the process resumed. One thread writes to the socket at a time (sending_).
//    The sender sleeps on send_cv_, which is signalled only when it has work: a thread woken
//    by every frame costs a futex hand-off on the round trip it does nothing for.
//
// Memory safety: a region's mapping is reference counted. The agent and the sender hold a
// reference while they touch a region, so FreeRegion never unmaps memory under a transfer; it
// removes the key first, so a later access by the peer fails.
#include "tcp_transport.h"

#include <liburing.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "backends.h"
#include "gather.h"
#include "region_table.h"
#include "software_backend.h"

namespace slipstream::rdma {

namespace {

using Clock = std::chrono::steady_clock;

// SEND payloads that arrive before a receive is posted are kept, up to this many bytes; a peer
// that sends more without the application receiving is dropped.
constexpr size_t kMaxUnmatchedBytes = 64u << 20;
constexpr size_t kDiscardChunk = 64u << 10;

// Requests whose frame payload is at most this many bytes are sent by the posting thread
// itself when the socket is idle: a small signaled WRITE then costs one network round trip and
// no hand-off to the sender thread (commit latency). Larger ones stay on the sender thread,
// which keeps the posting thread from blocking while a big payload drains.
constexpr uint64_t kInlineSendBytes = 64u << 10;
// The end of an incoming WRITE received and stored apart, after the rest (HandleWrite).
constexpr size_t kOrderedTailBytes = 16;
// A strided gather is packed this many bytes at a time before it is sent: small enough to
// stay in a core's L2 (1 MiB here) between our copy and the kernel's, large enough that a
// send carries a lot. region_bench's narrow projection on tcp: 256 KiB 0.94-1.23x copy-out,
// 512 KiB 1.18-1.47x, 1-2 MiB 1.13-1.56x (docs/benchmarks.md).
constexpr uint64_t kGatherChunkBytes = 512u << 10;

// Appends `payload_limit` bytes of a gather list to an iovec array, an entry per piece.
void AppendPayload(const std::vector<Sge>& sges, uint64_t payload_limit, std::vector<iovec>* iov) {
  for (const Sge& sge : sges) {
    if (payload_limit == 0) break;
    size_t piece = static_cast<size_t>(std::min<uint64_t>(sge.length, payload_limit));
    if (piece > 0) iov->push_back(iovec{const_cast<void*>(sge.addr), piece});
    payload_limit -= piece;
  }
}

// Skips `sent` bytes of iov[*first...]: whole entries move *first on, a partly sent entry is
// advanced in place.
void SkipSent(std::vector<iovec>* iov, size_t* first, size_t sent) {
  while (*first < iov->size() && sent >= (*iov)[*first].iov_len) {
    sent -= (*iov)[*first].iov_len;
    (*first)++;
  }
  if (sent > 0) {
    (*iov)[*first].iov_base = static_cast<char*>((*iov)[*first].iov_base) + sent;
    (*iov)[*first].iov_len -= sent;
  }
}

// An anonymous mapping; unmapped when the last holder lets go.
struct Mapping {
  char* addr = nullptr;
  size_t length = 0;
  bool owned = true;  // false: the caller's memory (RegisterLocal, RegisterShared)
  // Incoming WRITEs storing into it now (changed under regions_mu_): a revocation of shared
  // memory waits for them, since its owner reuses the memory once FreeRegion returns.
  std::atomic<uint32_t> storing{0};
  // Unmaps the memory if it is ours.
  ~Mapping() {
    if (addr != nullptr && owned) ::munmap(addr, length);
  }
};
using MappingRef = std::shared_ptr<Mapping>;

// A posted work request from the moment Post accepts it until its completion is produced.
struct PendingRequest : PreparedRequest {
  uint64_t sequence = 0;
  std::vector<MappingRef> holders;  // keep the local buffers mapped while in flight
  bool sent = false;
};

// A posted receive with its buffer kept mapped.
struct PostedRecv {
  RecvRequest request;
  MappingRef holder;
};

// A SEND or WRITE_WITH_IMM notification that arrived before a receive was posted.
struct UnmatchedMessage {
  std::string data;     // SEND payload
  uint32_t length = 0;  // byte_len to report
  uint32_t imm = 0;
  bool has_imm = false;
};

// A frame the agent asks the sender to send (responses to the peer's requests).
struct Reply {
  TcpFrameHeader header;
  const char* data = nullptr;  // READ_RESPONSE payload, inside `holder`
  MappingRef holder;
  bool close_after = false;  // a NAK: drop the socket once it is out
  size_t header_sent = 0;    // bytes of the header the agent already sent itself (an ACK)
};

// Receives exactly `length` bytes into `out`; false on EOF or error.
bool RecvAll(int fd, char* out, size_t length) {
  while (length > 0) {
    ssize_t n = ::recv(fd, out, length, MSG_WAITALL);
    if (n > 0) {
      out += n;
      length -= static_cast<size_t>(n);
    } else if (n == 0 || errno != EINTR) {
      return false;
    }
  }
  return true;
}

// Receives up to `first_length` bytes into `first`, then up to `second_length` into `second`,
// with as few recvmsg calls as the bytes' arrival allows (one, for a frame already in the
// socket), stopping early only at EOF or an error; returns how many arrived in all.
size_t RecvTwo(int fd, char* first, size_t first_length, char* second, size_t second_length) {
  iovec iov[2] = {{first, first_length}, {second, second_length}};
  size_t next = first_length > 0 ? 0 : second_length > 0 ? 1 : 2;
  size_t got = 0;
  while (next < 2) {
    msghdr message{};
    message.msg_iov = iov + next;
    message.msg_iovlen = 2 - next;
    ssize_t n = ::recvmsg(fd, &message, MSG_WAITALL);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      break;
    }
    got += static_cast<size_t>(n);
    size_t left = static_cast<size_t>(n);
    while (next < 2 && left >= iov[next].iov_len) {
      left -= iov[next].iov_len;
      iov[next].iov_len = 0;
      next++;
    }
    if (left > 0) {
      iov[next].iov_base = static_cast<char*>(iov[next].iov_base) + left;
      iov[next].iov_len -= left;
    }
  }
  return got;
}

// Reads and drops `length` bytes; false on EOF or error.
bool DiscardBytes(int fd, uint64_t length) {
  std::vector<char> scratch(std::min<uint64_t>(length, kDiscardChunk));
  while (length > 0) {
    size_t chunk = static_cast<size_t>(std::min<uint64_t>(length, scratch.size()));
    if (!RecvAll(fd, scratch.data(), chunk)) return false;
    length -= chunk;
  }
  return true;
}

class TcpConnection : public Connection, public FaultInjectable {
 public:
  // Takes over the authenticated socket and starts the agent and sender threads.
  TcpConnection(const TransportOptions& options, int fd);

  // Fails the connection, stops both threads, then releases the socket and the regions.
  ~TcpConnection() override;

  // mmap gives zeroed pages; remote rights get a random key in the region table.
  Status AllocateRegion(size_t length, uint32_t access, LocalRegion* region) override;
  Status RegisterLocal(void* addr, size_t length, LocalRegion* region) override;
  // The key goes into this connection's table beside its own random ones.
  Status RegisterShared(void* addr, size_t length, uint32_t access, uint64_t rkey,
                        LocalRegion* region) override;

  // Removes the key first (the peer's later accesses fail); the memory goes when no transfer
  // holds it any more. Shared memory is not ours to keep: a WRITE still storing into it ends
  // the connection (its recv returns) and FreeRegion waits until it has let go.
  Status FreeRegion(const LocalRegion& region) override;

  // The region's own address is its address in the peer's requests.
  RemoteRegion Describe(const LocalRegion& region) const override;

  // Validates everything first (posting nothing on bad input), then queues the requests for
  // the sender in order. On a failed connection the requests complete as kFlushed.
  Status Post(const WorkRequest* requests, size_t count) override;

  // Validates the buffers, then matches messages that arrived early, in order.
  Status PostRecv(const RecvRequest* requests, size_t count) override;

  // Returns ready completions; without any, reports a failed connection at once or waits
  // until the first completion is ready or the timeout passes (with receive_in_poll, reading
  // and handling the peer's frames meanwhile).
  Status Poll(Completion* out, size_t max, int timeout_ms, size_t* count) override;

  // OK while usable; the first error otherwise.
  Status state() const override;

  // Drops the connection; pending requests complete as kFlushed.
  void Disconnect() override { Fail(Status::Disconnected("disconnected locally")); }

  FaultInjection* faults() override { return &faults_; }

  std::string backend() const override { return "tcp"; }
  uint32_t max_sge() const override { return kSoftwareMaxSge; }
  uint32_t max_repeat() const override { return kSoftwareMaxRepeat; }
  // The agent receives a WRITE's payload into the region in order, then acknowledges.
  bool places_in_address_order() const override { return true; }
  // With receive_in_poll the socket, which the agent thread would otherwise read.
  int wait_fd() const override { return options_.receive_in_poll ? fd_ : -1; }

 private:
  struct LocalEntry {
    MappingRef mapping;
    uint64_t rkey;
  };

  // Checks that an Sge lies inside a region of this connection and returns that region.
  Status Check(const Sge& sge, MappingRef* holder);

  // Validates one work request and copies what the sender and agent need later, keeping
  // every local buffer mapped until the request is done.
  Status Prepare(const WorkRequest& wr, PendingRequest* pending);

  // Announces a change of the state under mu_ (held): to the threads in Poll, and to the
  // sender thread if it has something to do (a reply, a request not sent yet, or stopping).
  // Waking the sender for anything else cost a futex hand-off per frame on both sides.
  void NotifyLocked();

  // Wakes the sender thread if it has something to do (mu_ held), and nobody else: after a
  // frame went out, which no thread in Poll waits for (an ACK from the agent woke the
  // application's polling thread for nothing, on every WRITE it received).
  void WakeSenderLocked();

  // Queues a completion, to be delivered after completion_delay_us.
  void PushCompletionLocked(const Completion& completion);

  // Pairs early messages with posted receives, oldest with oldest. The agent may buffer a
  // message while PostRecv queues a receive (it decides without the lock held while the
  // payload arrives), so both sides call this after adding to their queue.
  void MatchLocked();

  // Fills a posted receive from an early message.
  void DeliverUnmatchedLocked(const PostedRecv& recv, const UnmatchedMessage& message);

  // Ends the connection once: records why, flushes every pending request and receive, and
  // drops the socket (after the NAK `nak` when the peer must learn of a refused access).
  void Fail(const Status& why, const TcpFrameHeader* nak = nullptr);

  // Fail() with mu_ held.
  void FailLocked(const Status& why, const TcpFrameHeader* nak);

  // Sends an iovec array completely: through the sender thread's io_uring when `use_ring`
  // (sendmsg when io_uring is missing), with plain sendmsg from any other thread.
  bool SendVector(std::vector<iovec>& iov, bool use_ring);

  // Sends the frame of `request` (its header, then `payload_limit` bytes) without blocking:
  // what the socket did not take is left in *rest for the sender. False on a send error.
  bool SendFrameWithoutBlocking(const TcpFrameHeader& header, const PreparedRequest& request,
                                uint64_t payload_limit, std::vector<char>* rest);

  // The sender finishes the frame a posting thread began (handoff_), mu_ held on entry and
  // exit; sending_ is cleared once it is out.
  void FinishHandoff(std::unique_lock<std::mutex>& lock);

  // Sends one frame: header (from byte `header_sent` on), then `payload_limit` bytes of the
  // gather list.
  bool SendFrame(const TcpFrameHeader& header, const std::vector<Sge>& sges, uint64_t payload_limit,
                 bool use_ring, size_t header_sent = 0);

  // Sends a strided gather's frame: the header, then `payload_limit` bytes of its image,
  // gathered a chunk at a time into gather_chunk_ (periods longer than a chunk go as an iovec
  // array each, straight from their buffers).
  bool SendRepeatedFrame(const TcpFrameHeader& header, const PreparedRequest& request,
                         uint64_t payload_limit, bool use_ring);

  // Sends the posted requests that are next in order and small from the posting thread, while
  // no other thread is writing to the socket and no reply waits (mu_ held).
  void SendInlineLocked(std::unique_lock<std::mutex>& lock);

  // The sender thread: responses to the peer first, then posted requests in order. The
  // target's agent places WRITEs strictly one after another, so a fenced request only waits
  // for earlier READs (whose replies the agent may still be sending from the region): the
  // IBV_SEND_FENCE rule, and no round trip per fence on the common WRITE-after-WRITE path.
  void SenderLoop();

  // SenderLoop's body.
  void SendUntilStopped();

  // Whether a READ posted before request `sequence` has not completed yet (mu_ held).
  bool ReadInFlightBefore(uint64_t sequence) const;

  // Sends one request (mu_ held on entry and exit, released while sending, with sending_
  // set), applying the injected faults to WRITEs: from the sender, blocking, through its ring;
  // from a posting thread, without blocking (what does not fit goes to handoff_, and sending_
  // stays set for the sender).
  void SendRequest(std::unique_lock<std::mutex>& lock,
                   const std::shared_ptr<PendingRequest>& pending, bool from_sender);

  // Finds the remote-accessible region for an incoming access and keeps it mapped; a WRITE is
  // counted as storing into it until EndStore.
  char* ResolveIncoming(const TcpFrameHeader& header, uint32_t right, MappingRef* holder);

  // Ends a WRITE's store into `holder` (resolved for `rkey`); whether the key still named that
  // memory when it ended, i.e. whether the WRITE landed before any revocation.
  bool EndStore(uint64_t rkey, const MappingRef& holder);

  // Queues a response frame for the sender.
  void QueueReply(Reply reply);

  // Acknowledges the peer's request `sequence`: sent at once by the agent when the socket is
  // idle and takes it without blocking (the agent must never block on a send, see the top),
  // otherwise (or for what did not fit) queued for the sender.
  void Acknowledge(uint64_t sequence);

  // Refuses the peer's request: NAK, then the connection ends with RemoteAccess.
  void Refuse(uint64_t sequence, const char* why);

  // The agent thread: one frame at a time until the connection ends.
  void AgentLoop();

  // receive_in_poll: waits until the socket is readable or `until` passes, and handles the
  // frames that arrived (by the one thread that set receiving_; false once failed). It
  // watches only the socket: a completion another thread's call pushes meanwhile (a Post to a
  // failed connection, a PostRecv matching an early message) is seen when it returns.
  bool ReceiveInPoll(Clock::time_point until);

  // Checks the fixed fields of a frame.
  static bool WellFormed(const TcpFrameHeader& header);

  // Handles one frame; false once the connection has ended.
  bool HandleFrame(const TcpFrameHeader& header);

  // Places a WRITE: check first, then receive straight into the region.
  bool HandleWrite(const TcpFrameHeader& header);

  // Answers a READ with the region's bytes (sent by the sender, straight from the region).
  bool HandleRead(const TcpFrameHeader& header);

  // Delivers a SEND into the next posted receive, or keeps it until one is posted.
  bool HandleSend(const TcpFrameHeader& header);

  // Consumes a receive for a SEND (`send` set: its payload follows on the socket) or a
  // WRITE_WITH_IMM notification. False once the connection has ended.
  bool Notify(const TcpFrameHeader* send, uint32_t length, uint32_t imm, bool has_imm);

  // Matches a response to the oldest unanswered request (responses come in request order).
  bool HandleResponse(const TcpFrameHeader& header);

  const TransportOptions options_;
  const int fd_;
  io_uring ring_{};
  bool ring_ready_ = false;  // ring_ and ring_ready_ belong to the sender thread

  // Regions (lock order: regions_mu_ before the table's own lock).
  std::mutex regions_mu_;
  RegionTable remote_table_;
  std::unordered_map<uint32_t, LocalEntry> by_lkey_;
  std::unordered_map<uint64_t, MappingRef> by_rkey_;
  uint32_t next_lkey_ = 1;
  size_t allocated_bytes_ = 0;

  // Everything below is guarded by mu_. cv_ announces any change of it to the threads in
  // Poll; send_cv_ wakes the sender thread, only when there is work for it (NotifyLocked).
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable send_cv_;
  Status state_;
  bool stopping_ = false;
  bool sender_done_ = false;  // the sender thread has left its loop (the destructor waits)
  FaultInjection faults_;
  std::deque<std::shared_ptr<PendingRequest>> in_flight_;  // posting order, oldest first
  uint64_t next_sequence_ = 0;
  uint64_t next_to_send_ = 0;
  bool sending_ = false;            // a thread is writing a frame to the socket (one at a time)
  std::vector<char> gather_chunk_;  // strided gathers' bytes on their way out (sending_ only)
  std::vector<char> handoff_;       // the rest of a frame a posting thread began, for the sender
  bool receiving_ = false;  // receive_in_poll: a thread in Poll reads the socket (one at a time)
  std::deque<Reply> replies_;
  DelayedCompletions completions_{&faults_};
  std::deque<PostedRecv> posted_recvs_;
  std::deque<UnmatchedMessage> unmatched_;
  size_t unmatched_bytes_ = 0;

  uint64_t next_peer_sequence_ = 0;  // the receiving thread (agent, or receiving_) only

  std::thread agent_;
  std::thread sender_;
};

TcpConnection::TcpConnection(const TransportOptions& options, int fd) : options_(options), fd_(fd) {
  if (options_.receive_in_poll) {
    // Poll's caller reads a frame to its end: a peer stalled in the middle of one may hold it
    // for connect_timeout_ms at most (none when negative, as for shm), then the connection
    // fails (the agent has no caller to hold).
    int ms = options_.connect_timeout_ms;
    timeval limit{ms / 1000, (ms % 1000) * 1000};
    if (ms >= 0 && ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit)) != 0) {
      state_ = Status::IOError(std::string("setsockopt SO_RCVTIMEO: ") + std::strerror(errno));
    }
  } else {
    agent_ = std::thread([this] { AgentLoop(); });
  }
  sender_ = std::thread([this] { SenderLoop(); });
}

TcpConnection::~TcpConnection() {
  Fail(Status::Disconnected("connection closed locally"));
  {
    std::unique_lock<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
    send_cv_.notify_all();
    // A connection failed by a refusal keeps its socket open so that the sender can send the
    // NAK; a sender blocked in a send to a peer that stopped reading is cut short after a
    // while instead of holding the destructor forever.
    const int bound_ms = options_.connect_timeout_ms > 0 ? options_.connect_timeout_ms : 5000;
    cv_.wait_for(lock, std::chrono::milliseconds(bound_ms), [this] { return sender_done_; });
  }
  ::shutdown(fd_, SHUT_RDWR);
  sender_.join();
  if (agent_.joinable()) agent_.join();
  ::close(fd_);
}

Status TcpConnection::AllocateRegion(size_t length, uint32_t access, LocalRegion* region) {
  if (length == 0) return Status::InvalidArgument("empty region");
  if ((access & ~uint32_t(kRemoteWrite | kRemoteRead)) != 0) {
    return Status::InvalidArgument("unknown access bits");
  }
  std::lock_guard<std::mutex> lock(regions_mu_);
  if (length > options_.region_capacity || allocated_bytes_ > options_.region_capacity - length) {
    return Status::InvalidArgument("region capacity of the connection exceeded");
  }
  void* memory =
      ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) return Status::IOError("mmap failed for a region");
  auto mapping = std::make_shared<Mapping>();
  mapping->addr = static_cast<char*>(memory);
  mapping->length = length;
  uint64_t rkey = 0;
  if (access != kLocalOnly) {
    Status s = remote_table_.Add(mapping->addr, length, access, &rkey);
    if (!s.ok()) return s;
    by_rkey_[rkey] = mapping;
  }
  uint32_t lkey = next_lkey_++;
  if (next_lkey_ == 0) next_lkey_ = 1;
  by_lkey_[lkey] = LocalEntry{mapping, rkey};
  allocated_bytes_ += length;
  region->addr = mapping->addr;
  region->length = length;
  region->rkey = rkey;
  region->lkey = lkey;
  region->access = access;
  return Status::OK();
}

// The sender gathers straight from the caller's memory; only the lkey is new.
Status TcpConnection::RegisterLocal(void* addr, size_t length, LocalRegion* region) {
  if (addr == nullptr || length == 0) return Status::InvalidArgument("empty local region");
  auto mapping = std::make_shared<Mapping>();
  mapping->addr = static_cast<char*>(addr);
  mapping->length = length;
  mapping->owned = false;
  std::lock_guard<std::mutex> lock(regions_mu_);
  uint32_t lkey = next_lkey_++;
  if (next_lkey_ == 0) next_lkey_ = 1;
  by_lkey_[lkey] = LocalEntry{mapping, 0};
  *region = LocalRegion{mapping->addr, length, 0, lkey, kLocalOnly};
  return Status::OK();
}

Status TcpConnection::RegisterShared(void* addr, size_t length, uint32_t access, uint64_t rkey,
                                     LocalRegion* region) {
  if (addr == nullptr || length == 0) return Status::InvalidArgument("empty shared region");
  if (access == kLocalOnly || (access & ~uint32_t(kRemoteWrite | kRemoteRead)) != 0) {
    return Status::InvalidArgument("a shared region needs remote rights, and only those");
  }
  auto mapping = std::make_shared<Mapping>();
  mapping->addr = static_cast<char*>(addr);
  mapping->length = length;
  mapping->owned = false;
  std::lock_guard<std::mutex> lock(regions_mu_);
  Status s = remote_table_.AddWithKey(mapping->addr, length, access, rkey);
  if (!s.ok()) return s;
  by_rkey_[rkey] = mapping;
  uint32_t lkey = next_lkey_++;
  if (next_lkey_ == 0) next_lkey_ = 1;
  by_lkey_[lkey] = LocalEntry{mapping, rkey};
  *region = LocalRegion{mapping->addr, length, rkey, lkey, access};
  return Status::OK();
}

Status TcpConnection::FreeRegion(const LocalRegion& region) {
  MappingRef shared;  // shared memory a WRITE is still storing into
  {
    std::lock_guard<std::mutex> lock(regions_mu_);
    auto it = by_lkey_.find(region.lkey);
    if (it == by_lkey_.end() || it->second.mapping->addr != region.addr) {
      return Status::InvalidArgument("not a region of this connection");
    }
    if (it->second.rkey != 0) {
      remote_table_.Remove(it->second.rkey);
      by_rkey_.erase(it->second.rkey);
    }
    const MappingRef& mapping = it->second.mapping;
    if (mapping->owned) allocated_bytes_ -= mapping->length;
    if (!mapping->owned && mapping->storing.load() > 0) shared = mapping;
    by_lkey_.erase(it);
  }
  if (shared) {
    // Normal use never gets here (the owner revokes between appends); a peer that stalls in
    // the middle of a frame must not hold the owner, so the connection ends.
    Fail(Status::RemoteAccess("a shared region was revoked while the peer wrote into it"));
    while (shared->storing.load() > 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return Status::OK();
}

RemoteRegion TcpConnection::Describe(const LocalRegion& region) const {
  return DescribeSoftwareRegion(region);
}

Status TcpConnection::Post(const WorkRequest* requests, size_t count) {
  bool empty;
  Status checked = CheckPostBatch(requests, count, options_.max_outstanding, &empty);
  if (!checked.ok() || empty) return checked;
  std::vector<std::shared_ptr<PendingRequest>> prepared;
  prepared.reserve(count);
  for (size_t i = 0; i < count; i++) {
    auto pending = std::make_shared<PendingRequest>();
    Status s = Prepare(requests[i], pending.get());
    if (!s.ok()) return s;
    prepared.push_back(std::move(pending));
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (!state_.ok()) {
    for (const auto& pending : prepared) {
      PushCompletionLocked(WorkCompletion(pending->wr, WcStatus::kFlushed));
    }
    NotifyLocked();
    return Status::OK();
  }
  if (in_flight_.size() + count > options_.max_outstanding) {
    return Status::WouldBlock("max_outstanding requests in flight");
  }
  for (auto& pending : prepared) {
    pending->sequence = next_sequence_++;
    in_flight_.push_back(std::move(pending));
  }
  SendInlineLocked(lock);
  NotifyLocked();
  return Status::OK();
}

void TcpConnection::SendInlineLocked(std::unique_lock<std::mutex>& lock) {
  while (!sending_ && !stopping_ && state_.ok() && replies_.empty() &&
         next_to_send_ < next_sequence_) {
    std::shared_ptr<PendingRequest> pending =
        in_flight_[next_to_send_ - in_flight_.front()->sequence];
    uint64_t payload = pending->wr.opcode == Opcode::kRead ? 0 : pending->length;
    if (payload > kInlineSendBytes) return;
    if (pending->wr.fence && ReadInFlightBefore(pending->sequence)) return;
    // An injected fault fails the connection after its frame: the sender sends it whole.
    if (faults_.drop_on_next_write || faults_.tear_next_write_after >= 0) return;
    SendRequest(lock, pending, /*from_sender=*/false);
  }
}

Status TcpConnection::PostRecv(const RecvRequest* requests, size_t count) {
  if (count == 0) return Status::OK();
  if (requests == nullptr) return Status::InvalidArgument("no receive requests");
  std::vector<PostedRecv> prepared(count);
  for (size_t i = 0; i < count; i++) {
    prepared[i].request = requests[i];
    Status s = Check(requests[i].sge, &prepared[i].holder);
    if (!s.ok()) return s;
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (PostedRecv& recv : prepared) {
    if (!state_.ok()) {
      PushCompletionLocked(RecvCompletion(recv.request, WcStatus::kFlushed, 0, 0, false));
    } else {
      posted_recvs_.push_back(std::move(recv));
      MatchLocked();
    }
  }
  NotifyLocked();
  return Status::OK();
}

Status TcpConnection::Poll(Completion* out, size_t max, int timeout_ms, size_t* count) {
  *count = 0;
  if (max == 0) return Status::OK();
  const Clock::time_point deadline =
      Clock::now() + std::chrono::milliseconds(std::max(timeout_ms, 0));
  std::unique_lock<std::mutex> lock(mu_);
  for (bool first = true;; first = false) {
    Clock::time_point now = Clock::now();
    completions_.PopDue(out, max, now, count);
    if (*count > 0) return Status::OK();
    if (completions_.empty() && !state_.ok()) return state_;
    // Without an agent, even Poll(0) reads what already arrived once.
    if (now >= deadline && !(options_.receive_in_poll && first)) return Status::OK();
    Clock::time_point until = deadline;
    if (!completions_.empty()) until = std::min(until, completions_.next_due());
    if (!options_.receive_in_poll) {
      cv_.wait_until(lock, until);
      continue;
    }
    if (receiving_) {
      // Another thread reads the socket: its frames' completions, or its leaving, wake this
      // one (both under mu_, which this thread holds from its check to its wait).
      cv_.wait_until(lock, until);
      continue;
    }
    receiving_ = true;
    lock.unlock();
    ReceiveInPoll(until);
    lock.lock();
    receiving_ = false;
    NotifyLocked();
  }
}

bool TcpConnection::ReceiveInPoll(Clock::time_point until) {
  auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(until - Clock::now());
  if (left.count() < 0) left = std::chrono::nanoseconds(0);
  timespec wait{time_t(left.count() / 1000000000), long(left.count() % 1000000000)};
  pollfd readable{fd_, POLLIN, 0};
  // The frames that arrived together (a round's ACKs) are handled in one call.
  constexpr int kFramesPerCall = 64;
  for (int frames = 0; frames < kFramesPerCall; frames++) {
    int rc = ::ppoll(&readable, 1, &wait, nullptr);
    if (rc < 0) return errno == EINTR;
    if (rc == 0) return true;  // nothing (more) arrived in time
    TcpFrameHeader header;
    errno = 0;
    if (!RecvAll(fd_, reinterpret_cast<char*>(&header), sizeof(header))) {
      Fail(Status::Disconnected(errno == EAGAIN || errno == EWOULDBLOCK
                                    ? "the peer stalled in the middle of a frame"
                                    : "the peer closed the connection"));
      return false;
    }
    if (!HandleFrame(header)) return false;
    wait = timespec{0, 0};
  }
  return true;
}

Status TcpConnection::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

Status TcpConnection::Check(const Sge& sge, MappingRef* holder) {
  std::lock_guard<std::mutex> lock(regions_mu_);
  auto it = by_lkey_.find(sge.lkey);
  if (it == by_lkey_.end()) return Status::InvalidArgument("unknown lkey");
  const Mapping& mapping = *it->second.mapping;
  Status s = CheckSgeBounds(sge, mapping.addr, mapping.length);
  if (s.ok()) *holder = it->second.mapping;
  return s;
}

Status TcpConnection::Prepare(const WorkRequest& wr, PendingRequest* pending) {
  return PrepareRequest(
      wr,
      [&](const Sge& sge) {
        MappingRef holder;
        Status s = Check(sge, &holder);
        if (s.ok()) pending->holders.push_back(std::move(holder));
        return s;
      },
      pending);
}

void TcpConnection::NotifyLocked() {
  cv_.notify_all();
  WakeSenderLocked();
}

void TcpConnection::WakeSenderLocked() {
  if (stopping_ || !handoff_.empty() || !replies_.empty() ||
      (state_.ok() && next_to_send_ < next_sequence_)) {
    send_cv_.notify_one();
  }
}

void TcpConnection::PushCompletionLocked(const Completion& completion) {
  completions_.Push(completion, Clock::now());
}

void TcpConnection::MatchLocked() {
  while (!unmatched_.empty() && !posted_recvs_.empty()) {
    PostedRecv recv = std::move(posted_recvs_.front());
    posted_recvs_.pop_front();
    UnmatchedMessage message = std::move(unmatched_.front());
    unmatched_.pop_front();
    unmatched_bytes_ -= message.data.size();
    DeliverUnmatchedLocked(recv, message);
  }
}

void TcpConnection::DeliverUnmatchedLocked(const PostedRecv& recv,
                                           const UnmatchedMessage& message) {
  if (message.data.size() > recv.request.sge.length) {
    PushCompletionLocked(
        RecvCompletion(recv.request, WcStatus::kLocalLengthError, 0, message.imm, message.has_imm));
    return;
  }
  if (!message.data.empty()) {
    std::memcpy(const_cast<void*>(recv.request.sge.addr), message.data.data(), message.data.size());
  }
  PushCompletionLocked(RecvCompletion(recv.request, WcStatus::kSuccess, message.length, message.imm,
                                      message.has_imm));
}

void TcpConnection::Fail(const Status& why, const TcpFrameHeader* nak) {
  std::lock_guard<std::mutex> lock(mu_);
  FailLocked(why, nak);
}

void TcpConnection::FailLocked(const Status& why, const TcpFrameHeader* nak) {
  if (!state_.ok()) return;
  state_ = why;
  for (const auto& pending : in_flight_) {
    PushCompletionLocked(WorkCompletion(pending->wr, WcStatus::kFlushed));
  }
  in_flight_.clear();
  for (const PostedRecv& recv : posted_recvs_) {
    PushCompletionLocked(RecvCompletion(recv.request, WcStatus::kFlushed, 0, 0, false));
  }
  posted_recvs_.clear();
  unmatched_.clear();
  unmatched_bytes_ = 0;
  if (nak != nullptr) {
    Reply reply;
    reply.header = *nak;
    reply.close_after = true;
    replies_.push_back(std::move(reply));
  } else {
    ::shutdown(fd_, SHUT_RDWR);  // wakes the agent's recv and the sender's send
  }
  NotifyLocked();
}

bool TcpConnection::SendVector(std::vector<iovec>& iov, bool use_ring) {
  size_t first = 0;
  while (first < iov.size()) {
    msghdr message{};
    message.msg_iov = iov.data() + first;
    message.msg_iovlen = iov.size() - first;
    ssize_t sent;
    if (use_ring && ring_ready_) {
      io_uring_sqe* sqe = ::io_uring_get_sqe(&ring_);
      ::io_uring_prep_sendmsg(sqe, fd_, &message, MSG_NOSIGNAL);
      int rc = ::io_uring_submit(&ring_);
      if (rc < 0) return false;
      io_uring_cqe* cqe = nullptr;
      do {
        rc = ::io_uring_wait_cqe(&ring_, &cqe);
      } while (rc == -EINTR);
      if (rc < 0) return false;
      sent = cqe->res;
      ::io_uring_cqe_seen(&ring_, cqe);
      if (sent < 0) {
        errno = static_cast<int>(-sent);
        sent = -1;
      }
    } else {
      sent = ::sendmsg(fd_, &message, MSG_NOSIGNAL);
    }
    if (sent < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return false;
    }
    SkipSent(&iov, &first, static_cast<size_t>(sent));
  }
  return true;
}

bool TcpConnection::SendFrame(const TcpFrameHeader& header, const std::vector<Sge>& sges,
                              uint64_t payload_limit, bool use_ring, size_t header_sent) {
  std::vector<iovec> iov;
  iov.reserve(sges.size() + 1);
  iov.push_back(iovec{reinterpret_cast<char*>(const_cast<TcpFrameHeader*>(&header)) + header_sent,
                      sizeof(header) - header_sent});
  AppendPayload(sges, payload_limit, &iov);
  return SendVector(iov, use_ring);
}

bool TcpConnection::SendFrameWithoutBlocking(const TcpFrameHeader& header,
                                             const PreparedRequest& request, uint64_t payload_limit,
                                             std::vector<char>* rest) {
  std::vector<iovec> iov;
  iov.reserve(request.sges.size() + 1);
  iov.push_back(iovec{const_cast<TcpFrameHeader*>(&header), sizeof(header)});
  if (request.wr.repeat > 1) {
    // A small strided gather is packed whole (a posting thread sends at most kInlineSendBytes).
    gather_chunk_.resize(payload_limit);
    GatherPrefix(request.sges.data(), request.sges.size(), request.wr.repeat_stride, payload_limit,
                 gather_chunk_.data());
    if (payload_limit > 0) iov.push_back(iovec{gather_chunk_.data(), payload_limit});
  } else {
    AppendPayload(request.sges, payload_limit, &iov);
  }
  size_t first = 0;
  while (first < iov.size()) {
    msghdr message{};
    message.msg_iov = iov.data() + first;
    message.msg_iovlen = iov.size() - first;
    ssize_t sent = ::sendmsg(fd_, &message, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return false;
    }
    SkipSent(&iov, &first, static_cast<size_t>(sent));
  }
  rest->clear();
  for (; first < iov.size(); first++) {
    const char* base = static_cast<const char*>(iov[first].iov_base);
    rest->insert(rest->end(), base, base + iov[first].iov_len);
  }
  return true;
}

void TcpConnection::FinishHandoff(std::unique_lock<std::mutex>& lock) {
  std::vector<char> frame = std::move(handoff_);
  handoff_.clear();
  // Finished even on a failed connection: a refusal queues its NAK behind it, and the peer
  // must read the NAK as a frame of its own (a failure without one shut the socket down, so
  // the send fails at once).
  lock.unlock();
  std::vector<iovec> iov{iovec{frame.data(), frame.size()}};
  bool ok = SendVector(iov, true);
  lock.lock();
  sending_ = false;
  NotifyLocked();
  if (!ok) FailLocked(Status::Disconnected("the peer stopped receiving"), nullptr);
}

bool TcpConnection::SendRepeatedFrame(const TcpFrameHeader& header, const PreparedRequest& request,
                                      uint64_t payload_limit, bool use_ring) {
  const WorkRequest& wr = request.wr;
  const Sge* sges = request.sges.data();
  const size_t count = request.sges.size();
  const uint64_t period_bytes = PeriodBytes(sges, count);
  std::vector<iovec> iov;
  iov.push_back(iovec{const_cast<TcpFrameHeader*>(&header), sizeof(header)});
  if (period_bytes == 0 || payload_limit == 0) return SendVector(iov, use_ring);
  if (period_bytes > kGatherChunkBytes) {
    for (uint64_t k = 0; k < wr.repeat && payload_limit > 0; k++) {
      for (size_t i = 0; i < count && payload_limit > 0; i++) {
        const uint64_t piece = std::min<uint64_t>(sges[i].length, payload_limit);
        if (piece == 0) continue;
        iov.push_back(
            iovec{const_cast<char*>(static_cast<const char*>(sges[i].addr)) + k * wr.repeat_stride,
                  piece});
        payload_limit -= piece;
      }
      if (!SendVector(iov, use_ring)) return false;
      iov.clear();
    }
    return true;
  }
  const uint64_t chunk_periods = kGatherChunkBytes / period_bytes;
  gather_chunk_.resize(chunk_periods * period_bytes);
  for (uint64_t k = 0; k < wr.repeat && payload_limit > 0; k += chunk_periods) {
    const uint64_t periods = std::min<uint64_t>(chunk_periods, wr.repeat - k);
    GatherPeriods(sges, count, wr.repeat_stride, k, periods, gather_chunk_.data());
    const uint64_t bytes = std::min(periods * period_bytes, payload_limit);
    iov.push_back(iovec{gather_chunk_.data(), bytes});
    if (!SendVector(iov, use_ring)) return false;
    iov.clear();
    payload_limit -= bytes;
  }
  return true;
}

void TcpConnection::SenderLoop() {
  // The ring belongs to this thread alone: created, used and torn down here, so any io_uring
  // task work is this thread's business and never interrupts an application thread.
  ring_ready_ = ::io_uring_queue_init(8, &ring_, 0) == 0;
  SendUntilStopped();
  if (ring_ready_) ::io_uring_queue_exit(&ring_);
  std::lock_guard<std::mutex> lock(mu_);
  sender_done_ = true;
  cv_.notify_all();
}

void TcpConnection::SendUntilStopped() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (stopping_) return;
    if (sending_) {  // a posting thread or the agent is writing a frame
      if (!handoff_.empty()) {
        FinishHandoff(lock);
      } else {
        send_cv_.wait(lock);
      }
      continue;
    }
    if (!replies_.empty()) {
      Reply reply = std::move(replies_.front());
      replies_.pop_front();
      sending_ = true;
      lock.unlock();
      std::vector<Sge> payload;
      if (reply.data != nullptr) {
        payload.push_back(Sge{reply.data, static_cast<uint32_t>(reply.header.length), 0});
      }
      bool ok = SendFrame(reply.header, payload, reply.header.length, true, reply.header_sent);
      if (reply.close_after) ::shutdown(fd_, SHUT_RDWR);
      lock.lock();
      sending_ = false;
      NotifyLocked();
      if (!ok) FailLocked(Status::Disconnected("the peer stopped receiving"), nullptr);
      continue;
    }
    if (state_.ok() && next_to_send_ < next_sequence_) {
      std::shared_ptr<PendingRequest> pending =
          in_flight_[next_to_send_ - in_flight_.front()->sequence];
      if (pending->wr.fence && ReadInFlightBefore(pending->sequence)) {
        send_cv_.wait(lock);
        continue;
      }
      SendRequest(lock, pending, /*from_sender=*/true);
      continue;
    }
    send_cv_.wait(lock);
  }
}

bool TcpConnection::ReadInFlightBefore(uint64_t sequence) const {
  for (const std::shared_ptr<PendingRequest>& p : in_flight_) {
    if (p->sequence >= sequence) break;
    if (p->wr.opcode == Opcode::kRead) return true;
  }
  return false;
}

void TcpConnection::SendRequest(std::unique_lock<std::mutex>& lock,
                                const std::shared_ptr<PendingRequest>& pending, bool from_sender) {
  const WorkRequest& wr = pending->wr;
  TcpFrameHeader header;
  header.sequence = pending->sequence;
  header.length = pending->length;
  header.rkey = wr.rkey;
  header.remote_addr = wr.remote_addr;
  uint64_t payload = pending->length;
  switch (wr.opcode) {
    case Opcode::kWrite:
      header.type = uint8_t(TcpFrameType::kWrite);
      break;
    case Opcode::kWriteWithImm:
      header.type = uint8_t(TcpFrameType::kWriteWithImm);
      header.imm = wr.imm;
      break;
    case Opcode::kRead:
      header.type = uint8_t(TcpFrameType::kReadRequest);
      payload = 0;
      break;
    default:
      header.type = uint8_t(TcpFrameType::kSend);
      header.rkey = 0;
      header.remote_addr = 0;
      break;
  }
  bool is_write = wr.opcode == Opcode::kWrite || wr.opcode == Opcode::kWriteWithImm;
  bool tear = false;
  if (is_write && faults_.drop_on_next_write) {
    faults_.drop_on_next_write = false;
    FailLocked(Status::Disconnected("fault injection: dropped before a WRITE"), nullptr);
    return;
  }
  if (is_write && faults_.tear_next_write_after >= 0) {
    payload = std::min<uint64_t>(payload, uint64_t(faults_.tear_next_write_after));
    faults_.tear_next_write_after = -1;
    tear = true;
  }
  pending->sent = true;
  next_to_send_++;
  sending_ = true;
  lock.unlock();
  std::vector<char> rest;
  bool ok;
  if (!from_sender) {
    ok = SendFrameWithoutBlocking(header, *pending, payload, &rest);
  } else if (wr.repeat > 1) {
    ok = SendRepeatedFrame(header, *pending, payload, true);
  } else {
    ok = SendFrame(header, pending->sges, payload, true);
  }
  lock.lock();
  if (ok && !rest.empty()) {
    // The socket is full (the peer reads slowly, or not at all): the sender finishes the frame
    // before anything else goes out, and sending_ stays set until it has.
    handoff_ = std::move(rest);
    WakeSenderLocked();
    return;
  }
  sending_ = false;
  WakeSenderLocked();
  if (tear) {
    FailLocked(Status::Disconnected("fault injection: torn WRITE"), nullptr);
  } else if (!ok) {
    FailLocked(Status::Disconnected("the peer stopped receiving"), nullptr);
  }
}

char* TcpConnection::ResolveIncoming(const TcpFrameHeader& header, uint32_t right,
                                     MappingRef* holder) {
  std::lock_guard<std::mutex> lock(regions_mu_);
  char* target = remote_table_.Resolve(header.rkey, header.remote_addr, header.length, right);
  if (target == nullptr) return nullptr;
  auto it = by_rkey_.find(header.rkey);
  if (it == by_rkey_.end()) return nullptr;
  *holder = it->second;
  if (right == kRemoteWrite) (*holder)->storing.fetch_add(1);
  return target;
}

bool TcpConnection::EndStore(uint64_t rkey, const MappingRef& holder) {
  std::lock_guard<std::mutex> lock(regions_mu_);
  auto it = by_rkey_.find(rkey);
  bool still = it != by_rkey_.end() && it->second == holder;
  holder->storing.fetch_sub(1);
  return still;
}

void TcpConnection::QueueReply(Reply reply) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!state_.ok()) return;
  replies_.push_back(std::move(reply));
  NotifyLocked();
}

void TcpConnection::Acknowledge(uint64_t sequence) {
  Reply reply;
  reply.header.type = uint8_t(TcpFrameType::kAck);
  reply.header.sequence = sequence;
  std::unique_lock<std::mutex> lock(mu_);
  if (!state_.ok()) return;
  if (!sending_ && replies_.empty()) {
    sending_ = true;
    lock.unlock();
    ssize_t sent;
    do {
      sent = ::send(fd_, &reply.header, sizeof(reply.header), MSG_DONTWAIT | MSG_NOSIGNAL);
    } while (sent < 0 && errno == EINTR);
    lock.lock();
    sending_ = false;
    WakeSenderLocked();
    if (sent == ssize_t(sizeof(reply.header))) return;
    // Not (all) taken: the sender finishes it before anything else goes out. A hard error
    // shows there too, as a failed send.
    reply.header_sent = sent > 0 ? size_t(sent) : 0;
    if (!state_.ok()) return;
    replies_.push_front(std::move(reply));
    WakeSenderLocked();  // the sender's work now (the call above ran before it was queued)
    return;
  }
  replies_.push_back(std::move(reply));
  NotifyLocked();
}

void TcpConnection::Refuse(uint64_t sequence, const char* why) {
  TcpFrameHeader nak;
  nak.type = uint8_t(TcpFrameType::kNak);
  nak.sequence = sequence;
  Fail(Status::RemoteAccess(why), &nak);
}

void TcpConnection::AgentLoop() {
  for (;;) {
    TcpFrameHeader header;
    if (!RecvAll(fd_, reinterpret_cast<char*>(&header), sizeof(header))) {
      Fail(Status::Disconnected("the peer closed the connection"));
      return;
    }
    if (!HandleFrame(header)) return;
  }
}

bool TcpConnection::WellFormed(const TcpFrameHeader& header) {
  if (header.magic != kTcpFrameMagic || header.reserved[0] != 0 || header.reserved[1] != 0 ||
      header.reserved[2] != 0 || header.reserved2 != 0) {
    return false;
  }
  if (header.type < uint8_t(TcpFrameType::kWrite) ||
      header.type > uint8_t(TcpFrameType::kReadResponse)) {
    return false;
  }
  if (header.length > kTcpMaxPayload) return false;
  TcpFrameType type = TcpFrameType(header.type);
  if ((type == TcpFrameType::kAck || type == TcpFrameType::kNak) && header.length != 0) {
    return false;
  }
  return true;
}

bool TcpConnection::HandleFrame(const TcpFrameHeader& header) {
  if (!WellFormed(header)) {
    Fail(Status::IOError("malformed frame from the peer"));
    return false;
  }
  TcpFrameType type = TcpFrameType(header.type);
  if (type == TcpFrameType::kAck || type == TcpFrameType::kNak ||
      type == TcpFrameType::kReadResponse) {
    return HandleResponse(header);
  }
  // A request: sequence numbers must run without gaps.
  if (header.sequence != next_peer_sequence_) {
    Fail(Status::IOError("request out of sequence from the peer"));
    return false;
  }
  next_peer_sequence_++;
  switch (type) {
    case TcpFrameType::kWrite:
    case TcpFrameType::kWriteWithImm:
      return HandleWrite(header);
    case TcpFrameType::kReadRequest:
      return HandleRead(header);
    default:
      return HandleSend(header);
  }
}

bool TcpConnection::HandleWrite(const TcpFrameHeader& header) {
  MappingRef holder;
  char* target = ResolveIncoming(header, kRemoteWrite, &holder);
  if (target == nullptr) {
    Refuse(header.sequence, "the peer wrote outside its rights");
    return false;
  }
  // One recv may store its bytes in any order (the kernel copies with fast string moves), yet a
  // WRITE's bytes must become visible in address order (places_in_address_order: a checksum
  // at its end is never seen before the records it covers). So the last kOrderedTailBytes are
  // received apart and stored after a fence; a WRITE cut short still leaves a prefix.
  const uint64_t bulk = header.length > kOrderedTailBytes ? header.length - kOrderedTailBytes : 0;
  char tail[kOrderedTailBytes];
  size_t tail_length = static_cast<size_t>(header.length - bulk);
  const size_t got = RecvTwo(fd_, target, bulk, tail, tail_length);
  const bool whole = got >= bulk;
  const size_t tail_got = whole ? got - bulk : 0;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (size_t i = 0; i < tail_got; i++) {
    reinterpret_cast<volatile char*>(target + bulk)[i] = tail[i];
  }
  // Only bytes stored while the key was registered count (RegisterShared): the owner reuses
  // revoked memory, so a WRITE that straddled a revocation is refused, not acknowledged.
  const bool registered = EndStore(header.rkey, holder);
  if (!whole || tail_got != tail_length) {
    Fail(Status::Disconnected("the peer closed the connection during a WRITE"));
    return false;
  }
  if (!registered) {
    Refuse(header.sequence, "the peer's region was revoked during its WRITE");
    return false;
  }
  if (TcpFrameType(header.type) == TcpFrameType::kWriteWithImm &&
      !Notify(nullptr, static_cast<uint32_t>(header.length), header.imm, true)) {
    return false;
  }
  Acknowledge(header.sequence);
  return true;
}

bool TcpConnection::HandleRead(const TcpFrameHeader& header) {
  Reply reply;
  const char* source = ResolveIncoming(header, kRemoteRead, &reply.holder);
  if (source == nullptr) {
    Refuse(header.sequence, "the peer read outside its rights");
    return false;
  }
  reply.header.type = uint8_t(TcpFrameType::kReadResponse);
  reply.header.sequence = header.sequence;
  reply.header.length = header.length;
  reply.data = header.length > 0 ? source : nullptr;
  QueueReply(std::move(reply));
  return true;
}

bool TcpConnection::HandleSend(const TcpFrameHeader& header) {
  if (!Notify(&header, static_cast<uint32_t>(header.length), 0, false)) return false;
  Acknowledge(header.sequence);
  return true;
}

bool TcpConnection::Notify(const TcpFrameHeader* send, uint32_t length, uint32_t imm,
                           bool has_imm) {
  PostedRecv recv;
  bool have_recv = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!state_.ok()) return false;
    if (!posted_recvs_.empty()) {
      recv = std::move(posted_recvs_.front());
      posted_recvs_.pop_front();
      have_recv = true;
    } else if (unmatched_bytes_ + (send ? length : 0) > kMaxUnmatchedBytes) {
      FailLocked(Status::IOError("the peer sent too much that nobody received"), nullptr);
      return false;
    }
  }
  UnmatchedMessage early;
  early.length = length;
  early.imm = imm;
  early.has_imm = has_imm;
  WcStatus status = WcStatus::kSuccess;
  if (send != nullptr) {
    bool received;
    if (!have_recv) {
      early.data.resize(length);
      received = RecvAll(fd_, early.data.data(), length);
    } else if (length <= recv.request.sge.length) {
      received = RecvAll(fd_, static_cast<char*>(const_cast<void*>(recv.request.sge.addr)), length);
    } else {
      status = WcStatus::kLocalLengthError;
      received = DiscardBytes(fd_, length);
    }
    if (!received) {
      if (have_recv) {
        std::lock_guard<std::mutex> lock(mu_);
        PushCompletionLocked(RecvCompletion(recv.request, WcStatus::kFlushed, 0, 0, false));
      }
      Fail(Status::Disconnected("the peer closed the connection during a SEND"));
      return false;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!state_.ok()) return false;
  if (have_recv) {
    uint32_t byte_len = status == WcStatus::kSuccess ? length : 0;
    PushCompletionLocked(RecvCompletion(recv.request, status, byte_len, imm, has_imm));
  } else {
    unmatched_bytes_ += early.data.size();
    unmatched_.push_back(std::move(early));
    MatchLocked();
  }
  NotifyLocked();
  return true;
}

bool TcpConnection::HandleResponse(const TcpFrameHeader& header) {
  TcpFrameType type = TcpFrameType(header.type);
  std::shared_ptr<PendingRequest> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!state_.ok()) return false;
    if (in_flight_.empty() || in_flight_.front()->sequence != header.sequence ||
        !in_flight_.front()->sent) {
      FailLocked(Status::IOError("response to no request from the peer"), nullptr);
      return false;
    }
    pending = in_flight_.front();
    bool is_read = pending->wr.opcode == Opcode::kRead;
    bool consistent =
        type == TcpFrameType::kNak ||
        (is_read ? type == TcpFrameType::kReadResponse && header.length == pending->length
                 : type == TcpFrameType::kAck);
    if (!consistent) {
      FailLocked(Status::IOError("response does not fit its request"), nullptr);
      return false;
    }
    if (type == TcpFrameType::kNak) {
      in_flight_.pop_front();
      PushCompletionLocked(WorkCompletion(pending->wr, WcStatus::kRemoteAccessError));
      FailLocked(Status::RemoteAccess("the peer refused an access"), nullptr);
      return false;
    }
  }
  if (type == TcpFrameType::kReadResponse) {
    // Scatter straight into the READ's destination buffers, in order.
    for (const Sge& sge : pending->sges) {
      if (!RecvAll(fd_, static_cast<char*>(const_cast<void*>(sge.addr)), sge.length)) {
        Fail(Status::Disconnected("the peer closed the connection during a READ"));
        return false;
      }
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!state_.ok()) return false;
  in_flight_.pop_front();
  if (pending->wr.signaled) PushCompletionLocked(WorkCompletion(pending->wr, WcStatus::kSuccess));
  NotifyLocked();
  return true;
}

}  // namespace

// The listening side: nothing more to exchange; the socket is ready for frames.
Status AcceptTcp(const TransportOptions& options, int fd, std::unique_ptr<Connection>* out) {
  *out = std::make_unique<TcpConnection>(options, fd);
  return Status::OK();
}

// The connecting side: same as the listening side (the protocol is symmetric).
Status ConnectTcp(const TransportOptions& options, int fd, std::unique_ptr<Connection>* out) {
  *out = std::make_unique<TcpConnection>(options, fd);
  return Status::OK();
}

}  // namespace slipstream::rdma
