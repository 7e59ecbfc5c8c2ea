// The multi-buffer channel over one Connection.
//
// Buffer-Info words (8 bytes each): bits 0-7 the state, bits 8-63 the package sequence number.
// Entries [0, 8) describe this side's Receive Buffers (the peer writes READY, we write FREE);
// entries [8, 16) describe the peer's Receive Buffers as we know them (the peer writes FREE
// when it has consumed one; we mark BUSY while we fill it). Every package carries a header
// with its sequence number, so the receiver consumes packages exactly once and in order.
//
// The Send Buffer is split into sender_threads x packages_in_flight parts: slot s owns parts
// [s * packages_in_flight, (s + 1) * packages_in_flight) and uses them round robin. A part
// holds one package (header and, unless zero-copy, payload) from its posting until the
// package's READY write completes, which on every backend means the package was placed. Each
// part has its own READY word in the local word area, since the transport reads that word
// asynchronously too.
#include "slipstream/rdma/channel.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "small_copy.h"

namespace slipstream::rdma {

namespace {

constexpr uint32_t kMaxBuffers = 7;
constexpr uint32_t kMaxPackagesInFlight = 8;
// sender_threads x packages_in_flight at most: every package in flight is two work requests,
// and together with the FREE writes they stay well inside the transport's max_outstanding.
constexpr uint32_t kMaxPartsInFlight = 64;
// Receive reserves room for a message's claimed size when its first package arrives, but for
// no more than this: the claim is the peer's word, and a claim alone (up to 2^64 bytes) must
// not allocate gigabytes or throw. Beyond it the message grows as its bytes arrive.
constexpr uint64_t kMaxUpfrontReserve = 64u << 20;
constexpr uint32_t kInfoEntries = 16;
constexpr uint32_t kPeerInfoBase = 8;
constexpr uint64_t kFree = 0, kBusy = 1, kReady = 2;
constexpr uint32_t kPackageMagic = 0x4b504c53;  // "SLPK"
constexpr uint32_t kSetupMagic = 0x43504c53;    // "SLPC"

struct PackageHeader {
  uint32_t magic;
  uint32_t opcode;
  uint64_t sequence;
  uint64_t message_size;
  uint64_t offset;
  uint32_t length;
  uint32_t sender;
};
static_assert(sizeof(PackageHeader) == 40);
constexpr uint32_t kHeaderSize = 48;  // header padded so payloads start 16-byte aligned

// Where a message's payload comes from. Each package asks for its next bytes as gather
// entries appended after the package header's entry; what the source copies goes into
// `staging`, the Send Buffer part right after the header.
class PayloadSource {
 public:
  virtual ~PayloadSource() = default;
  // Appends the next `length` payload bytes to *sges, which may hold max_sges entries.
  virtual void Gather(uint64_t length, char* staging, uint32_t staging_lkey, std::vector<Sge>* sges,
                      uint32_t max_sges) = 0;
};

// Adds `length` bytes copied to `at` in the staging part: they extend the last entry when it
// ends right there (the header's entry, or earlier copied bytes).
void AppendStaged(std::vector<Sge>* sges, char* at, uint64_t length, uint32_t lkey) {
  Sge& last = sges->back();
  if (last.lkey == lkey && static_cast<const char*>(last.addr) + last.length == at) {
    last.length += uint32_t(length);
  } else {
    sges->push_back(Sge{at, uint32_t(length), lkey});
  }
}

// A payload copied from memory the transport cannot reach (Send).
class CopiedPayload : public PayloadSource {
 public:
  explicit CopiedPayload(std::string_view data) : data_(data) {}
  // Copies the bytes beside the header.
  void Gather(uint64_t length, char* staging, uint32_t staging_lkey, std::vector<Sge>* sges,
              uint32_t) override {
    std::memcpy(staging, data_.data() + offset_, length);
    AppendStaged(sges, staging, length, staging_lkey);
    offset_ += length;
  }

 private:
  std::string_view data_;
  uint64_t offset_ = 0;
};

// A contiguous payload written straight from a region (SendRegion).
class RegionPayload : public PayloadSource {
 public:
  RegionPayload(const LocalRegion& region, uint64_t offset) : region_(region), offset_(offset) {}
  // Points one entry at the region.
  void Gather(uint64_t length, char*, uint32_t, std::vector<Sge>* sges, uint32_t) override {
    sges->push_back(Sge{region_.addr + offset_, uint32_t(length), region_.lkey});
    offset_ += length;
  }

 private:
  const LocalRegion& region_;
  uint64_t offset_;
};

// A declarative region's wire image (SendLayout): packed boxes are copied beside the header,
// in-place boxes become entries pointing into the source. When the entries run out, the rest
// of the package is copied too; one entry is always kept free for that.
class LayoutPayload : public PayloadSource {
 public:
  LayoutPayload(std::string_view prefix, const LocalRegion& source, const Schedule& schedule)
      : prefix_(prefix), source_(source), schedule_(schedule) {}
  // Copies what is left of the prefix, then walks the runs that cover the package's bytes.
  void Gather(uint64_t length, char* staging, uint32_t staging_lkey, std::vector<Sge>* sges,
              uint32_t max_sges) override {
    uint64_t staged = 0;
    if (prefix_done_ < prefix_.size()) {
      const uint64_t take = std::min<uint64_t>(length, prefix_.size() - prefix_done_);
      std::memcpy(staging, prefix_.data() + prefix_done_, take);
      AppendStaged(sges, staging, take, staging_lkey);
      staged = take;
      prefix_done_ += take;
      length -= take;
    }
    while (length > 0) {
      if (run_ != box_index_) {
        box_ = schedule_.box(run_);
        box_index_ = run_;
      }
      const Run& run = box_;
      const uint64_t take = std::min(length, run.length - in_run_);
      const char* from = source_.addr + run.source + in_run_;
      if (run.packed || sges->size() + 1 >= max_sges) {
        CopyFragment(staging + staged, from, take);
        AppendStaged(sges, staging + staged, take, staging_lkey);
        staged += take;
      } else {
        sges->push_back(Sge{from, uint32_t(take), source_.lkey});
      }
      length -= take;
      in_run_ += take;
      if (in_run_ == run.length) {
        run_++;
        in_run_ = 0;
      }
    }
  }

 private:
  std::string_view prefix_;
  uint64_t prefix_done_ = 0;
  const LocalRegion& source_;
  const Schedule& schedule_;
  uint64_t run_ = 0;
  uint64_t box_index_ = UINT64_MAX;  // which box box_ holds
  Run box_;
  uint64_t in_run_ = 0;
};

struct SetupMessage {
  uint32_t magic;
  uint32_t buffers;
  uint32_t buffer_size;
  uint32_t pad;
  RemoteRegion receive_buffers;
  RemoteRegion info;
};

// What a work request id says about the request it belongs to.
enum WrKind : uint64_t { kWrData = 1, kWrReady = 2, kWrFree = 3, kWrSetup = 4 };
uint64_t WrId(WrKind kind, uint64_t index) {
  return (uint64_t(kind) << 56) | index;
}
WrKind WrKindOf(uint64_t id) {
  return WrKind(id >> 56);
}
uint64_t WrIndexOf(uint64_t id) {
  return id & ((1ull << 56) - 1);
}

uint64_t Word(uint64_t state, uint64_t sequence) {
  return state | (sequence << 8);
}
uint64_t StateOf(uint64_t word) {
  return word & 0xff;
}
uint64_t SequenceOf(uint64_t word) {
  return word >> 8;
}

using Clock = std::chrono::steady_clock;

class ChannelImpl : public Channel {
 public:
  ChannelImpl(Connection* c, const ChannelOptions& o) : conn_(c), options_(o) {}
  ~ChannelImpl() override;

  Status Setup(int timeout_ms);
  Status Send(uint32_t opcode, std::string_view data, uint32_t sender, int timeout_ms) override;
  Status SendRegion(uint32_t opcode, const LocalRegion& region, size_t offset, size_t length,
                    uint32_t sender, int timeout_ms) override;
  Status SendLayout(uint32_t opcode, std::string_view prefix, const LocalRegion& source,
                    const RegionLayout& layout, const Schedule& schedule, uint32_t sender,
                    int timeout_ms) override;
  Status Flush(int timeout_ms) override;
  Status Receive(Message* message, int timeout_ms) override;
  Status ReceivePackage(PackageView* package, int timeout_ms) override;
  Status Release(const PackageView& package) override;
  uint32_t peer_buffer_size() const override { return peer_buffer_size_; }
  uint32_t package_header_size() const override { return kHeaderSize; }

 private:
  std::atomic<uint64_t>* Info(uint32_t entry) {
    return reinterpret_cast<std::atomic<uint64_t>*>(info_.addr) + entry;
  }
  char* SendPart(uint32_t part) { return send_.addr + size_t(part) * send_part_size_; }
  uint64_t* WordSlot(uint32_t index) { return reinterpret_cast<uint64_t*>(words_.addr) + index; }
  uint64_t* ReadyWord(uint32_t part) { return WordSlot(kInfoEntries + part); }

  // Polls completions once (non-blocking) and applies them; an error breaks the channel.
  Status Progress();
  // Sleeps in the transport until a completion arrives (at most timeout_ms), then applies it.
  Status AwaitCompletion(int timeout_ms);
  // Marks the parts of completed READY writes free; an error breaks the channel (mu_ held).
  Status ApplyCompletions(const Completion* completions, size_t count);
  // Waits until `done` (asked with mu_ held) is true, sleeping in the transport in between;
  // fails when the channel breaks or, with may_time_out, at the deadline.
  Status AwaitParts(const std::function<bool()>& done, Clock::time_point deadline,
                    bool may_time_out);
  // Waits for the sender slot's next Send Buffer part to be free and returns its index.
  Status AcquirePart(uint32_t sender, Clock::time_point deadline, bool may_time_out,
                     uint32_t* part);
  // Whether any part of the sender slot is still in flight (mu_ held).
  bool SlotBusyLocked(uint32_t sender) const;
  // Whether any part of any slot is still in flight (mu_ held).
  bool AnyPartBusyLocked() const;
  // Sends one message of `length` bytes whose packages gather their payload from `payload`.
  Status SendMessage(uint32_t opcode, PayloadSource& payload, size_t length, uint32_t sender,
                     int timeout_ms);
  // Waits for a free peer buffer and reserves it with the next sequence number.
  Status ReserveBuffer(uint32_t* buffer, uint64_t* sequence, Clock::time_point deadline,
                       bool may_wait);
  // Waits until this side's buffer with the next sequence number is ready.
  Status NextReady(uint32_t* buffer, Clock::time_point deadline);
  Status Broken(const Status& s);

  Connection* conn_;
  ChannelOptions options_;
  std::mutex mu_;  // Post, Poll and the bookkeeping below
  Status broken_;
  LocalRegion receive_, info_, send_, words_, setup_;
  uint32_t send_part_size_ = 0;
  uint32_t parts_per_slot_ = 0;
  uint32_t peer_buffers_ = 0;
  uint32_t peer_buffer_size_ = 0;
  RemoteRegion peer_receive_, peer_info_;
  uint64_t next_send_sequence_ = 1;
  uint64_t next_receive_sequence_ = 1;
  std::vector<uint8_t> part_in_flight_;     // per Send Buffer part: its package is being written
  std::vector<uint32_t> next_part_;         // per sender slot: its part (round robin) to use next
  std::vector<std::vector<Sge>> gather_;    // per sender slot: the gather list of its package
  std::map<uint32_t, Message> assembling_;  // per sender slot: a message being reassembled
};

// Waits (briefly) for packages still in flight, so that the transport is done reading the Send
// Buffer before it is freed, then frees every region.
ChannelImpl::~ChannelImpl() {
  AwaitParts([this] { return !AnyPartBusyLocked(); }, Clock::now() + std::chrono::seconds(1),
             /*may_time_out=*/true);
  for (LocalRegion* r : {&receive_, &info_, &send_, &words_, &setup_}) {
    if (r->addr) conn_->FreeRegion(*r);
  }
}

Status ChannelImpl::Broken(const Status& s) {
  if (broken_.ok()) broken_ = s;
  return broken_;
}

// Allocates the buffers, exchanges their descriptions with a SEND each way, and checks the
// peer's description before using it.
Status ChannelImpl::Setup(int timeout_ms) {
  const ChannelOptions& o = options_;
  if (o.receive_buffers < 1 || o.receive_buffers > kMaxBuffers) {
    return Status::InvalidArgument("receive_buffers must be 1..7");
  }
  if (o.receive_buffer_size < 4096 || o.receive_buffer_size > (1u << 30)) {
    return Status::InvalidArgument("receive_buffer_size must be 4 KiB..1 GiB");
  }
  if (o.sender_threads < 1 || o.sender_threads > 16)
    return Status::InvalidArgument("sender_threads must be 1..16");
  if (o.packages_in_flight < 1 || o.packages_in_flight > kMaxPackagesInFlight ||
      o.sender_threads * o.packages_in_flight > kMaxPartsInFlight) {
    return Status::InvalidArgument(
        "packages_in_flight must be 1..8, and sender_threads x packages_in_flight at most 64");
  }
  parts_per_slot_ = o.packages_in_flight;
  const uint32_t parts = o.sender_threads * parts_per_slot_;
  send_part_size_ = o.send_buffer_size / parts;
  if (send_part_size_ < kHeaderSize + 64) {
    return Status::InvalidArgument(
        "send_buffer_size too small for sender_threads x packages_in_flight");
  }
  Status s = conn_->AllocateRegion(size_t(o.receive_buffers) * o.receive_buffer_size, kRemoteWrite,
                                   &receive_);
  if (s.ok()) s = conn_->AllocateRegion(kInfoEntries * 8, kRemoteWrite, &info_);
  if (s.ok()) s = conn_->AllocateRegion(size_t(send_part_size_) * parts, kLocalOnly, &send_);
  if (s.ok()) s = conn_->AllocateRegion(8 * (kInfoEntries + parts), kLocalOnly, &words_);
  if (s.ok()) s = conn_->AllocateRegion(2 * sizeof(SetupMessage), kLocalOnly, &setup_);
  if (!s.ok()) return s;
  part_in_flight_.assign(parts, 0);
  next_part_.assign(o.sender_threads, 0);
  gather_.assign(o.sender_threads, {});

  SetupMessage mine{kSetupMagic, o.receive_buffers,         o.receive_buffer_size,
                    0,           conn_->Describe(receive_), conn_->Describe(info_)};
  std::memcpy(setup_.addr, &mine, sizeof(mine));
  RecvRequest recv{WrId(kWrSetup, 1),
                   Sge{setup_.addr + sizeof(mine), uint32_t(sizeof(mine)), setup_.lkey}};
  s = conn_->PostRecv(&recv, 1);
  Sge out{setup_.addr, uint32_t(sizeof(mine)), setup_.lkey};
  WorkRequest send;
  send.wr_id = WrId(kWrSetup, 0);
  send.opcode = Opcode::kSend;
  send.sg_list = &out;
  send.num_sge = 1;
  if (s.ok()) s = conn_->Post(&send, 1);
  if (!s.ok()) return s;
  bool sent = false, received = false;
  Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!(sent && received)) {
    Completion wc[4];
    size_t n = 0;
    int left =
        int(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    if (left <= 0) return Status::Timeout("channel setup: no answer from the peer");
    s = conn_->Poll(wc, 4, left, &n);
    if (!s.ok()) return s;
    for (size_t i = 0; i < n; i++) {
      if (wc[i].status != WcStatus::kSuccess) return Status::Disconnected("channel setup failed");
      if (wc[i].opcode == Opcode::kRecv) {
        if (wc[i].byte_len != sizeof(SetupMessage))
          return Status::InvalidArgument("malformed channel setup");
        received = true;
      } else {
        sent = true;
      }
    }
  }
  SetupMessage peer;
  std::memcpy(&peer, setup_.addr + sizeof(mine), sizeof(peer));
  if (peer.magic != kSetupMagic || peer.buffers < 1 || peer.buffers > kMaxBuffers ||
      peer.buffer_size < 4096 ||
      peer.receive_buffers.length != uint64_t(peer.buffers) * peer.buffer_size ||
      peer.info.length < kInfoEntries * 8) {
    conn_->Disconnect();
    return Status::InvalidArgument("malformed channel setup from the peer");
  }
  peer_buffers_ = peer.buffers;
  peer_buffer_size_ = peer.buffer_size;
  peer_receive_ = peer.receive_buffers;
  peer_info_ = peer.info;
  return Status::OK();
}

// Applies completions: a finished READY write frees the Send Buffer part of its package.
Status ChannelImpl::Progress() {
  if (!broken_.ok()) return broken_;
  Completion wc[32];
  size_t n = 0;
  Status s = conn_->Poll(wc, 32, 0, &n);
  Status applied = ApplyCompletions(wc, n);  // what completed before a failure still counts
  if (!s.ok()) return Broken(s);
  return applied;
}

// Any failed completion (a flushed or refused write) ends the channel with the connection's error.
Status ChannelImpl::ApplyCompletions(const Completion* wc, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (wc[i].status != WcStatus::kSuccess) {
      return Broken(conn_->state().ok() ? Status::Disconnected("a channel write failed")
                                        : conn_->state());
    }
    if (WrKindOf(wc[i].wr_id) == kWrReady && WrIndexOf(wc[i].wr_id) < part_in_flight_.size()) {
      part_in_flight_[WrIndexOf(wc[i].wr_id)] = 0;
    }
  }
  return Status::OK();
}

// The transport's Poll is thread-safe, so the sleep happens without mu_: other slots and the
// receiving side go on meanwhile, and the CPU is left to the transport (tcp's threads).
Status ChannelImpl::AwaitCompletion(int timeout_ms) {
  Completion wc[32];
  size_t n = 0;
  Status s = conn_->Poll(wc, 32, timeout_ms, &n);
  std::lock_guard<std::mutex> lock(mu_);
  if (!s.ok()) return Broken(s);
  return ApplyCompletions(wc, n);
}

// Looks at the slot's packages_in_flight parts.
bool ChannelImpl::SlotBusyLocked(uint32_t sender) const {
  for (uint32_t k = 0; k < parts_per_slot_; k++) {
    if (part_in_flight_[sender * parts_per_slot_ + k]) return true;
  }
  return false;
}

// Looks at every part.
bool ChannelImpl::AnyPartBusyLocked() const {
  for (uint8_t busy : part_in_flight_) {
    if (busy) return true;
  }
  return false;
}

// Parts free up through completions only, so in between the thread sleeps in Poll.
Status ChannelImpl::AwaitParts(const std::function<bool()>& done, Clock::time_point deadline,
                               bool may_time_out) {
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      Status s = Progress();
      if (done()) return Status::OK();  // placed before any failure
      if (!s.ok()) return s;
    }
    if (may_time_out && Clock::now() >= deadline) return Status::Timeout("send buffer busy");
    Status s = AwaitCompletion(1);
    if (!s.ok()) return s;
  }
}

// The slot's parts are used round robin; the next one frees as soon as the transport completes
// its package's READY write (the peer's application need not act), so it is the oldest. Only
// the slot's own thread moves next_part_[sender].
Status ChannelImpl::AcquirePart(uint32_t sender, Clock::time_point deadline, bool may_time_out,
                                uint32_t* part) {
  uint32_t candidate;
  {
    std::lock_guard<std::mutex> lock(mu_);
    candidate = sender * parts_per_slot_ + next_part_[sender];
  }
  Status s = AwaitParts([&] { return !part_in_flight_[candidate]; }, deadline, may_time_out);
  if (s.ok()) *part = candidate;
  return s;
}

Status ChannelImpl::ReserveBuffer(uint32_t* buffer, uint64_t* sequence, Clock::time_point deadline,
                                  bool may_wait) {
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      Status s = Progress();
      if (!s.ok()) return s;
      for (uint32_t j = 0; j < peer_buffers_; j++) {
        std::atomic<uint64_t>* entry = Info(kPeerInfoBase + j);
        if (StateOf(entry->load(std::memory_order_acquire)) == kFree) {
          *sequence = next_send_sequence_++;
          entry->store(Word(kBusy, *sequence), std::memory_order_relaxed);
          *buffer = j;
          return Status::OK();
        }
      }
    }
    if (!may_wait) return Status::WouldBlock("every receive buffer of the peer is full");
    if (Clock::now() >= deadline)
      return Status::Timeout("no receive buffer of the peer became free");
    std::this_thread::yield();
  }
}

Status ChannelImpl::Send(uint32_t opcode, std::string_view data, uint32_t sender, int timeout_ms) {
  CopiedPayload payload(data);
  return SendMessage(opcode, payload, data.size(), sender, timeout_ms);
}

Status ChannelImpl::SendRegion(uint32_t opcode, const LocalRegion& region, size_t offset,
                               size_t length, uint32_t sender, int timeout_ms) {
  if (offset > region.length || length > region.length - offset) {
    return Status::InvalidArgument("SendRegion range outside the region");
  }
  RegionPayload payload(region, offset);
  Status s = SendMessage(opcode, payload, length, sender, timeout_ms);
  if (!s.ok()) return s;
  // The transport gathers the payload from the region until the writes complete. No deadline:
  // everything is posted, so only the transport is left, and it either completes the writes
  // or fails the connection (a timeout here would invite a retry that duplicates the message).
  return AwaitParts([&] { return !SlotBusyLocked(sender); }, Clock::time_point::max(),
                    /*may_time_out=*/false);
}

Status ChannelImpl::SendLayout(uint32_t opcode, std::string_view prefix, const LocalRegion& source,
                               const RegionLayout& layout, const Schedule& schedule,
                               uint32_t sender, int timeout_ms) {
  Status s = CheckSchedule(layout, schedule, source.addr == nullptr ? 0 : source.length);
  if (!s.ok()) return s;
  LayoutPayload payload(prefix, source, schedule);
  s = SendMessage(opcode, payload, prefix.size() + schedule.wire_bytes, sender, timeout_ms);
  if (!s.ok()) return s;
  // As SendRegion: in-place boxes are read by the transport until the writes complete.
  return AwaitParts([&] { return !SlotBusyLocked(sender); }, Clock::time_point::max(),
                    /*may_time_out=*/false);
}

Status ChannelImpl::Flush(int timeout_ms) {
  return AwaitParts([this] { return !AnyPartBusyLocked(); },
                    Clock::now() + std::chrono::milliseconds(timeout_ms), /*may_time_out=*/true);
}

// Each package: wait for the slot's next Send Buffer part, reserve a peer buffer, write header
// (and payload), then the READY word with a fence so it lands after the package. The package
// stays in flight while the slot goes on with the next one in another part.
Status ChannelImpl::SendMessage(uint32_t opcode, PayloadSource& payload, size_t length,
                                uint32_t sender, int timeout_ms) {
  if (sender >= options_.sender_threads) return Status::InvalidArgument("sender slot out of range");
  Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  size_t max_payload = std::min<size_t>(peer_buffer_size_, send_part_size_) - kHeaderSize;
  size_t offset = 0;
  // Before the first package the caller may simply retry; after it, the peer holds part of
  // the message and the rest cannot follow, so the channel ends rather than deliver it cut.
  auto abandon = [&](const Status& s) {
    if (offset == 0 || !broken_.ok()) return s;
    std::lock_guard<std::mutex> lock(mu_);
    conn_->Disconnect();
    return Broken(Status::Disconnected("message abandoned halfway: " + s.message()));
  };
  do {
    size_t chunk = std::min(max_payload, length - offset);
    uint32_t part = 0;
    Status s = AcquirePart(sender, deadline, timeout_ms > 0, &part);
    if (!s.ok()) return abandon(s);
    uint32_t buffer = 0;
    uint64_t sequence = 0;
    // timeout 0 means "WouldBlock rather than wait" for a message's first package only: once
    // part of a message is out, the rest waits for the peer (or for the connection to fail).
    Clock::time_point package_deadline =
        timeout_ms == 0 && offset > 0 ? Clock::time_point::max() : deadline;
    s = ReserveBuffer(&buffer, &sequence, package_deadline, timeout_ms > 0 || offset > 0);
    if (!s.ok()) return abandon(s);
    char* staging = SendPart(part);
    PackageHeader h{kPackageMagic, opcode, sequence, length, offset, uint32_t(chunk), sender};
    std::memset(staging, 0, kHeaderSize);
    std::memcpy(staging, &h, sizeof(h));
    // The slot's own gather list, reused: no allocation per package once it has grown.
    std::vector<Sge>& sges = gather_[sender];
    sges.assign(1, Sge{staging, kHeaderSize, send_.lkey});
    if (chunk > 0) {
      payload.Gather(chunk, staging + kHeaderSize, send_.lkey, &sges,
                     std::max<uint32_t>(2, conn_->max_sge()));
    }
    uint64_t* word = ReadyWord(part);
    *word = Word(kReady, sequence);
    Sge word_sge{word, 8, words_.lkey};
    WorkRequest wr[2];
    wr[0].wr_id = WrId(kWrData, part);
    wr[0].opcode = Opcode::kWrite;
    wr[0].sg_list = sges.data();
    wr[0].num_sge = uint32_t(sges.size());
    wr[0].remote_addr = peer_receive_.addr + uint64_t(buffer) * peer_buffer_size_;
    wr[0].rkey = peer_receive_.rkey;
    wr[0].signaled = false;
    wr[1].wr_id = WrId(kWrReady, part);
    wr[1].opcode = Opcode::kWrite;
    wr[1].sg_list = &word_sge;
    wr[1].num_sge = 1;
    wr[1].remote_addr = peer_info_.addr + 8 * buffer;
    wr[1].rkey = peer_info_.rkey;
    wr[1].fence = true;  // the package must be placed before the peer can see READY
    {
      std::lock_guard<std::mutex> lock(mu_);
      part_in_flight_[part] = 1;
      next_part_[sender] = (next_part_[sender] + 1) % parts_per_slot_;
      s = conn_->Post(wr, 2);
      if (!s.ok()) return Broken(s);
    }
    offset += chunk;
  } while (offset < length);
  return Status::OK();
}

// This side's buffers are scanned for the READY word carrying the next sequence number.
Status ChannelImpl::NextReady(uint32_t* buffer, Clock::time_point deadline) {
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      // A package whose READY word arrived was placed whole (READY is fenced behind it), so
      // it is delivered even when the connection has failed since: a peer that sends its
      // last message and leaves does not lose it. The failure shows once nothing is left.
      Status s = Progress();
      for (uint32_t j = 0; j < options_.receive_buffers; j++) {
        uint64_t word = Info(j)->load(std::memory_order_acquire);
        if (StateOf(word) == kReady && SequenceOf(word) == next_receive_sequence_) {
          *buffer = j;
          return Status::OK();
        }
      }
      if (!s.ok()) return s;
    }
    if (Clock::now() >= deadline) return Status::Timeout("no message");
    std::this_thread::yield();
  }
}

Status ChannelImpl::ReceivePackage(PackageView* package, int timeout_ms) {
  uint32_t j = 0;
  Status s = NextReady(&j, Clock::now() + std::chrono::milliseconds(timeout_ms));
  if (!s.ok()) return s;
  const char* rb = receive_.addr + size_t(j) * options_.receive_buffer_size;
  PackageHeader h;
  std::memcpy(&h, rb, sizeof(h));
  // Never trust the peer's header: a bad one ends the connection.
  if (h.magic != kPackageMagic || h.sequence != next_receive_sequence_ ||
      h.length > options_.receive_buffer_size - kHeaderSize || h.offset > h.message_size ||
      h.length > h.message_size - h.offset || h.sender >= 16) {
    conn_->Disconnect();
    return Broken(Status::InvalidArgument("malformed package from the peer"));
  }
  next_receive_sequence_++;
  *package = PackageView{
      h.opcode, h.sender,  h.message_size, h.offset, std::string_view(rb + kHeaderSize, h.length),
      j,        h.sequence};
  return Status::OK();
}

// Marks the buffer free here and tells the sender with a remote write (unless it is gone).
Status ChannelImpl::Release(const PackageView& package) {
  std::lock_guard<std::mutex> lock(mu_);
  uint32_t j = package.buffer;
  Info(j)->store(Word(kFree, package.sequence), std::memory_order_release);
  if (!broken_.ok()) return Status::OK();  // nobody to tell; the package was delivered
  uint64_t* word = WordSlot(j);
  *word = Word(kFree, package.sequence);
  Sge sge{word, 8, words_.lkey};
  WorkRequest wr;
  wr.wr_id = WrId(kWrFree, j);
  wr.opcode = Opcode::kWrite;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.remote_addr = peer_info_.addr + 8 * (kPeerInfoBase + j);
  wr.rkey = peer_info_.rkey;
  wr.signaled = false;
  Status s = conn_->Post(&wr, 1);
  return s.ok() ? s : Broken(s);
}

// Packages are appended to their sender's message until it is complete.
Status ChannelImpl::Receive(Message* message, int timeout_ms) {
  Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    int left =
        int(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    PackageView p;
    Status s = ReceivePackage(&p, std::max(left, 0));
    if (!s.ok()) return s;
    Message& m = assembling_[p.sender];
    if (p.offset != m.data.size()) {
      conn_->Disconnect();
      return Broken(Status::InvalidArgument("package out of order within a message"));
    }
    if (p.offset == 0) {
      m.opcode = p.opcode;
      m.sender = p.sender;
      m.data.reserve(std::min<uint64_t>(p.message_size, kMaxUpfrontReserve));
    }
    m.data.append(p.data);
    s = Release(p);
    if (!s.ok()) return s;
    if (m.data.size() == p.message_size) {
      *message = std::move(m);
      assembling_.erase(p.sender);
      return Status::OK();
    }
  }
}

}  // namespace

Status Channel::Open(Connection* connection, const ChannelOptions& options, int timeout_ms,
                     std::unique_ptr<Channel>* channel) {
  auto impl = std::make_unique<ChannelImpl>(connection, options);
  Status s = impl->Setup(timeout_ms);
  if (s.ok()) *channel = std::move(impl);
  return s;
}

}  // namespace slipstream::rdma
