// The shm backend (see shm_transport.h for the heap layout and the honest limits).
//
// Everything runs on the caller's threads; there is no agent. Post validates the requests,
// then the initiator itself carries them out in posting order: it looks the key up in the
// peer's region table, checks bounds and rights, and copies. A request therefore completes at
// post time, which makes WRITE ordering and `fence` trivial; the one exception is an injected
// completion delay, where a fenced request waits (in a deferred queue, driven by Post and Poll)
// until every earlier completion is due. Poll delivers completions, consumes the receive ring
// into posted receives, and watches the setup socket and the error word for the end of the
// connection, sleeping on the doorbell futex in short slices so that it never blocks past its
// timeout and notices a dead peer (whose kernel closes the socket) within one slice.
#include "shm_transport.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "backends.h"
#include "gather.h"
#include "setup.h"
#include "shm_heap.h"
#include "slipstream/rdma/shm_peer.h"
#include "software_backend.h"

namespace slipstream::rdma {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kPageBytes = 4096;
constexpr uint64_t kSmallAlign = 64;          // regions start on a cache line
constexpr uint64_t kLargeRegion = 64u << 10;  // from here on regions are page aligned
// Poll sleeps at most this long at a time, so a dead peer is noticed within one slice.
constexpr auto kWaitSlice = std::chrono::milliseconds(10);
// Post and Poll(0) in a hot loop check the socket at most this often (poll() is a syscall).
constexpr auto kLivenessInterval = std::chrono::microseconds(100);

// Rounds `value` up to a multiple of `align` (a power of two); the caller rules out overflow.
uint64_t RoundUp(uint64_t value, uint64_t align) {
  return (value + align - 1) & ~(align - 1);
}

// Text of errno for messages.
std::string ErrnoText(const char* what) {
  return std::string(what) + ": " + std::strerror(errno);
}

// Waits on a futex word shared between processes while it still holds `expected`.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  if (timeout.count() <= 0) return;
  timespec relative{};
  relative.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  relative.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  // Not FUTEX_PRIVATE: the waker is another process mapping the same memfd.
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &relative, nullptr,
            0);
}

// Wakes every waiter on a shared futex word.
void FutexWakeAll(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Free extents of the region space: first fit, coalescing on release.
class ExtentAllocator {
 public:
  // Makes [begin, end) one free extent.
  void Reset(uint64_t begin, uint64_t end) {
    free_.clear();
    if (end > begin) free_[begin] = end - begin;
  }

  // Carves `length` bytes starting at a multiple of `align`; false when no extent fits.
  bool Allocate(uint64_t length, uint64_t align, uint64_t* offset) {
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      const uint64_t start = it->first;
      const uint64_t size = it->second;
      const uint64_t aligned = RoundUp(start, align);
      const uint64_t pad = aligned - start;
      if (pad > size || length > size - pad) continue;
      free_.erase(it);
      if (pad > 0) free_[start] = pad;
      if (size - pad > length) free_[aligned + length] = size - pad - length;
      *offset = aligned;
      return true;
    }
    return false;
  }

  // Returns [offset, offset+length) and merges it with free neighbours.
  void Release(uint64_t offset, uint64_t length) {
    auto next = free_.lower_bound(offset);
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == offset) {
        offset = prev->first;
        length += prev->second;
        free_.erase(prev);
      }
    }
    if (next != free_.end() && offset + length == next->first) {
      length += next->second;
      free_.erase(next);
    }
    free_[offset] = length;
  }

 private:
  std::map<uint64_t, uint64_t> free_;  // offset -> length
};

// Rewrites an entry under its seqlock (odd while the fields change).
void WriteEntry(ShmTableEntry* entry, const EntrySnapshot& value) {
  const uint64_t sequence = entry->sequence.load(std::memory_order_relaxed);
  entry->sequence.store(sequence + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  entry->rkey.store(value.rkey, std::memory_order_relaxed);
  entry->base.store(value.base, std::memory_order_relaxed);
  entry->offset.store(value.offset, std::memory_order_relaxed);
  entry->length.store(value.length, std::memory_order_relaxed);
  entry->access.store(value.access, std::memory_order_relaxed);
  entry->state.store(value.state, std::memory_order_relaxed);
  entry->sequence.store(sequence + 2, std::memory_order_release);
}

// A posted work request until it is carried out (only more than an instant under
// completion_delay_us with a fence).
struct PendingRequest : PreparedRequest {
  uint64_t ring_bytes = 0;  // room reserved in the peer's receive ring
};

// One side of a shm connection. All state is guarded by mu_; Poll drops it while it sleeps.
class ShmConnection : public Connection, public FaultInjectable {
 public:
  // Takes over the authenticated socket; the heaps are set up by Establish().
  ShmConnection(const TransportOptions& options, int fd) : options_(options), fd_(fd) {}

  // Ends the connection, then unmaps both heaps and every local-only region.
  ~ShmConnection() override;

  // Creates our heap, exchanges descriptions with the peer, maps and checks its heap, and
  // waits until the peer has mapped ours. On failure the caller drops the connection.
  Status Establish();

  // Remote regions come from the heap (so the peer can reach them), local-only ones from a
  // private mapping the peer never sees. Both count against region_capacity.
  Status AllocateRegion(size_t length, uint32_t access, LocalRegion* region) override;
  Status RegisterLocal(void* addr, size_t length, LocalRegion* region) override;

  // Invalidates the table entry first (so the peer's next lookup fails), then gives the space
  // back with its pages released. A peer WRITE validated just before is not fenced (see the
  // header); AllocateRegion zeroes the space again before reuse.
  Status FreeRegion(const LocalRegion& region) override;

  // The region's address in this process is its address in the peer's requests.
  RemoteRegion Describe(const LocalRegion& region) const override;

  // Validates everything (posting nothing on bad input), reserves ring room for the two-sided
  // requests (so none of them can find the ring full halfway through the list), then carries
  // the requests out in order. On a failed connection they complete as kFlushed.
  Status Post(const WorkRequest* requests, size_t count) override;

  // Validates the buffers and queues them; Poll fills them from the receive ring.
  Status PostRecv(const RecvRequest* requests, size_t count) override;

  // Receives from the ring, checks the peer, runs deferred requests and delivers completions
  // that are due; without any, reports a failed connection at once or sleeps on the doorbell
  // (in slices) until something arrives or the timeout passes.
  Status Poll(Completion* out, size_t max, int timeout_ms, size_t* count) override;

  // OK while usable; the first error otherwise (after a fresh look at the peer).
  Status state() const override;

  // Drops the connection; pending requests complete as kFlushed.
  void Disconnect() override;

  // The faults the next requests will suffer (tests only).
  FaultInjection* faults() override { return &faults_; }

  // The backend's name.
  std::string backend() const override { return "shm"; }
  uint32_t max_sge() const override { return kSoftwareMaxSge; }
  uint32_t max_repeat() const override { return kSoftwareMaxRepeat; }
  // CopyAscending stores upwards, 16 bytes at a time.
  bool places_in_address_order() const override { return true; }

  // What another process of this user needs to map the peer's heap (ExportShmPeer).
  const ShmHeapDescription& peer_description() const { return peer_description_; }

 private:
  // A region of this side. slot < 0: local-only (a private mapping, not in the heap).
  struct LocalEntry {
    char* addr = nullptr;
    size_t length = 0;
    uint64_t rkey = 0;
    uint32_t access = kLocalOnly;
    int slot = -1;
    uint64_t heap_offset = 0;
    bool owned = true;  // false: the caller's memory (RegisterLocal), not counted or unmapped
  };

  // Sizes, creates, seals and maps our heap, and lays out the header, table and ring.
  Status CreateHeap();

  // Maps the peer's heap (MapShmPeerHeap: nothing from the peer is trusted) and checks that
  // its receive ring is empty, as it is at setup.
  Status MapPeerHeap(const ShmHeapDescription& theirs);

  // Zeroes [offset, offset+length) of our heap: whole pages by punching them out of the memfd
  // (which also frees them), the partial pages at the ends with memset.
  void ZeroHeapRange(uint64_t offset, uint64_t length);

  // Gives the whole pages of a freed range back to the kernel (best effort).
  void ReleasePages(uint64_t offset, uint64_t length);

  // Checks that an Sge lies inside a region of this connection.
  Status CheckSgeLocked(const Sge& sge) const;

  // Validates one work request and copies what executing it needs.
  Status PrepareLocked(const WorkRequest& wr, PendingRequest* pending) const;

  // Queues a completion, to be delivered after completion_delay_us (later fenced requests
  // wait for it to be due).
  void PushCompletionLocked(const Completion& completion, Clock::time_point now);

  // Wakes this side's threads sleeping in Poll (a completion or a failure is there for them).
  void WakeLocalWaiters();

  // Rings the peer's doorbell (a record or an error is there for it).
  void WakePeer();

  // Ends the connection once: records why, flushes every pending request and receive, and
  // shuts the setup socket down, which is how the peer learns.
  void FailLocked(const Status& why);

  // Looks at the error word (every call) and the setup socket (at most every
  // kLivenessInterval unless forced), and fails the connection when the peer has ended it.
  void CheckPeerLocked(Clock::time_point now, bool force);

  // The peer ended the connection: RemoteAccess if it said we broke its rights (it sets the
  // error word before it closes the socket), Disconnected otherwise.
  void FailPeerEndedLocked();

  // Carries out deferred requests in order while the connection is usable; a fenced request
  // waits until every earlier completion is due.
  void ProgressLocked(Clock::time_point now);

  // Finds the peer's table slot for `rkey`: the cached slot if it still holds the key, else a
  // scan of the slots the peer has used.
  bool FindPeerEntryLocked(uint64_t rkey, EntrySnapshot* snapshot);

  // The address in the peer's mapped heap for an access of `length` bytes at `remote_addr`
  // needing `right`; nullptr when the key is unknown, the range leaves the region, the right
  // is missing, or the entry points outside the peer's region space. No sum can overflow:
  // every test compares an offset with the room left.
  char* ResolvePeerLocked(uint64_t rkey, uint64_t remote_addr, uint64_t length, uint32_t right);

  // Free bytes of the peer's receive ring; false (and the connection failed) when the peer's
  // head is impossible.
  bool PeerRingFreeLocked(uint64_t* free_bytes);

  // Appends a record to the peer's ring (room was reserved by Post), publishes it with a
  // release store of the tail and rings the doorbell. False when the connection failed.
  bool AppendRecordLocked(uint32_t kind, uint32_t length, uint32_t imm,
                          const std::vector<Sge>* payload);

  // A refused access: the request fails with kRemoteAccessError, the connection fails, and the
  // peer learns through its error word (set before the socket closes, so it reads the reason).
  void RefuseLocked(const PendingRequest& pending, Clock::time_point now);

  // Reports a successful request (a completion only when signaled).
  void SucceedLocked(const PendingRequest& pending, Clock::time_point now);

  // Carries out one request, applying the injected faults to WRITEs.
  void ExecuteLocked(const PendingRequest& pending, Clock::time_point now);

  // True when a record waits in our ring and a receive is posted for it.
  bool RingConsumableLocked() const;

  // Moves records from our ring into posted receives, oldest with oldest. The peer wrote the
  // ring, so every record is checked before anything is copied out of it.
  void ConsumeRingLocked(Clock::time_point now);

  const TransportOptions options_;
  const int fd_;  // the setup socket, kept open for the connection's lifetime

  // Our heap. own_ring_head_ is our private copy of the consumer index (the shared word is
  // only published, never read back, since the peer can write it).
  int own_memfd_ = -1;
  char* own_heap_ = nullptr;
  uint64_t own_heap_size_ = 0;
  ShmHeapHeader* own_header_ = nullptr;
  ShmTableEntry* own_table_ = nullptr;
  char* own_ring_ = nullptr;
  uint64_t own_ring_head_ = 0;

  // The peer's heap as mapped here. peer_ring_tail_ is our private copy of the producer index.
  char* peer_heap_ = nullptr;
  uint64_t peer_heap_size_ = 0;
  ShmHeapDescription peer_description_{};  // as the peer sent it (ExportShmPeer)
  ShmHeapHeader* peer_header_ = nullptr;
  ShmTableEntry* peer_table_ = nullptr;
  char* peer_ring_ = nullptr;
  uint64_t peer_ring_tail_ = 0;

  // Everything below is guarded by mu_.
  mutable std::mutex mu_;
  Status state_;
  FaultInjection faults_;
  std::unordered_map<uint32_t, LocalEntry> by_lkey_;
  std::unordered_set<uint64_t> own_rkeys_;
  std::vector<uint32_t> free_slots_;
  ExtentAllocator allocator_;
  uint32_t next_lkey_ = 1;
  size_t allocated_bytes_ = 0;
  std::unordered_map<uint64_t, uint32_t> peer_slot_cache_;  // peer rkey -> its table slot
  std::deque<PendingRequest> deferred_;
  uint64_t ring_reserved_ = 0;  // ring bytes the deferred requests will need
  DelayedCompletions completions_{&faults_};
  std::deque<RecvRequest> posted_recvs_;
  Clock::time_point last_liveness_check_{};
};

ShmConnection::~ShmConnection() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (own_heap_ != nullptr) FailLocked(Status::Disconnected("connection closed locally"));
  }
  ::close(fd_);
  if (peer_heap_ != nullptr) ::munmap(peer_heap_, peer_heap_size_);
  for (const auto& [lkey, entry] : by_lkey_) {
    if (entry.slot < 0 && entry.owned) ::munmap(entry.addr, entry.length);
  }
  if (own_heap_ != nullptr) ::munmap(own_heap_, own_heap_size_);
  if (own_memfd_ >= 0) ::close(own_memfd_);
}

Status ShmConnection::Establish() {
  Status s = CreateHeap();
  if (!s.ok()) return s;
  const bool infinite = options_.connect_timeout_ms < 0;
  const Clock::time_point deadline =
      Clock::now() + std::chrono::milliseconds(std::max(options_.connect_timeout_ms, 0));
  // Milliseconds left for the exchange (-1: no limit).
  auto remaining_ms = [&]() -> int {
    if (infinite) return -1;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    return left.count() > 0 ? static_cast<int>(left.count()) : 0;
  };
  ShmHeapDescription mine{};
  mine.magic = kShmHeapMagic;
  mine.version = kShmVersion;
  mine.pid = static_cast<int32_t>(::getpid());
  mine.memfd = own_memfd_;
  mine.table_entries = kShmTableEntries;
  mine.heap_size = own_heap_size_;
  mine.region_space = own_heap_size_ - kShmRegionOffset;
  mine.ring_bytes = kShmRingBytes;
  mine.token[0] = own_header_->token[0];
  mine.token[1] = own_header_->token[1];
  s = SendSetupMessage(fd_, kShmHeapMessage,
                       std::string_view(reinterpret_cast<const char*>(&mine), sizeof(mine)));
  if (!s.ok()) return s;
  uint32_t type = 0;
  std::string payload;
  s = RecvSetupMessage(fd_, remaining_ms(), &type, &payload);
  if (!s.ok()) return s;
  if (type != kShmHeapMessage || payload.size() != sizeof(ShmHeapDescription)) {
    return Status::InvalidArgument("malformed shm heap description from the peer");
  }
  ShmHeapDescription theirs;
  std::memcpy(&theirs, payload.data(), sizeof(theirs));
  s = MapPeerHeap(theirs);
  if (!s.ok()) return s;
  s = SendSetupMessage(fd_, kShmReadyMessage, {});
  if (!s.ok()) return s;
  s = RecvSetupMessage(fd_, remaining_ms(), &type, &payload);
  if (!s.ok()) return s;
  if (type != kShmReadyMessage || !payload.empty()) {
    return Status::InvalidArgument("malformed shm ready message from the peer");
  }
  return Status::OK();
}

Status ShmConnection::AllocateRegion(size_t length, uint32_t access, LocalRegion* region) {
  if (length == 0) return Status::InvalidArgument("empty region");
  if ((access & ~uint32_t(kRemoteWrite | kRemoteRead)) != 0) {
    return Status::InvalidArgument("unknown access bits");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (length > options_.region_capacity || allocated_bytes_ > options_.region_capacity - length) {
    return Status::InvalidArgument("region capacity of the connection exceeded");
  }
  LocalEntry entry;
  entry.length = length;
  entry.access = access;
  if (access == kLocalOnly) {
    void* memory =
        ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) return Status::IOError(ErrnoText("mmap of a local region"));
    entry.addr = static_cast<char*>(memory);
  } else {
    if (free_slots_.empty()) return Status::WouldBlock("region table of the connection full");
    uint64_t offset = 0;
    const uint64_t align = length >= kLargeRegion ? kPageBytes : kSmallAlign;
    if (!allocator_.Allocate(length, align, &offset)) {
      return Status::WouldBlock("shm heap too fragmented for this region");
    }
    entry.slot = static_cast<int>(free_slots_.back());
    free_slots_.pop_back();
    entry.heap_offset = offset;
    entry.addr = own_heap_ + offset;
    ZeroHeapRange(offset, length);
    uint64_t rkey = RandomKey();
    while (own_rkeys_.count(rkey) != 0) rkey = RandomKey();
    own_rkeys_.insert(rkey);
    entry.rkey = rkey;
    EntrySnapshot published;
    published.rkey = rkey;
    published.base = reinterpret_cast<uintptr_t>(entry.addr);
    published.offset = offset;
    published.length = length;
    published.access = access;
    published.state = kShmEntryValid;
    WriteEntry(&own_table_[entry.slot], published);
    const uint32_t used = own_header_->table_used.load(std::memory_order_relaxed);
    if (uint32_t(entry.slot) >= used) {
      own_header_->table_used.store(uint32_t(entry.slot) + 1, std::memory_order_release);
    }
  }
  uint32_t lkey = next_lkey_++;
  if (next_lkey_ == 0) next_lkey_ = 1;
  by_lkey_[lkey] = entry;
  allocated_bytes_ += length;
  region->addr = entry.addr;
  region->length = length;
  region->rkey = entry.rkey;
  region->lkey = lkey;
  region->access = access;
  return Status::OK();
}

// A local-only region only needs an lkey here: the initiator copies from it itself.
Status ShmConnection::RegisterLocal(void* addr, size_t length, LocalRegion* region) {
  if (addr == nullptr || length == 0) return Status::InvalidArgument("empty local region");
  std::lock_guard<std::mutex> lock(mu_);
  LocalEntry entry;
  entry.addr = static_cast<char*>(addr);
  entry.length = length;
  entry.owned = false;
  uint32_t lkey = next_lkey_++;
  if (next_lkey_ == 0) next_lkey_ = 1;
  by_lkey_[lkey] = entry;
  *region = LocalRegion{entry.addr, length, 0, lkey, kLocalOnly};
  return Status::OK();
}

Status ShmConnection::FreeRegion(const LocalRegion& region) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_lkey_.find(region.lkey);
  if (it == by_lkey_.end() || it->second.addr != region.addr) {
    return Status::InvalidArgument("not a region of this connection");
  }
  const LocalEntry& entry = it->second;
  if (!entry.owned) {
    by_lkey_.erase(it);
    return Status::OK();
  }
  if (entry.slot < 0) {
    ::munmap(entry.addr, entry.length);
  } else {
    WriteEntry(&own_table_[entry.slot], EntrySnapshot{});
    own_rkeys_.erase(entry.rkey);
    free_slots_.push_back(static_cast<uint32_t>(entry.slot));
    ReleasePages(entry.heap_offset, entry.length);
    allocator_.Release(entry.heap_offset, entry.length);
  }
  allocated_bytes_ -= entry.length;
  by_lkey_.erase(it);
  return Status::OK();
}

RemoteRegion ShmConnection::Describe(const LocalRegion& region) const {
  return DescribeSoftwareRegion(region);
}

Status ShmConnection::Post(const WorkRequest* requests, size_t count) {
  bool empty;
  Status checked = CheckPostBatch(requests, count, options_.max_outstanding, &empty);
  if (!checked.ok() || empty) return checked;
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<PendingRequest> prepared(count);
  uint64_t ring_needed = 0;
  for (size_t i = 0; i < count; i++) {
    Status s = PrepareLocked(requests[i], &prepared[i]);
    if (!s.ok()) return s;
    ring_needed += prepared[i].ring_bytes;
  }
  const Clock::time_point now = Clock::now();
  CheckPeerLocked(now, /*force=*/false);
  if (state_.ok() && deferred_.size() + count > options_.max_outstanding) {
    return Status::WouldBlock("max_outstanding requests in flight");
  }
  uint64_t ring_free = 0;
  if (state_.ok() && ring_needed > 0 && PeerRingFreeLocked(&ring_free) &&
      ring_reserved_ + ring_needed > ring_free) {
    return Status::WouldBlock("the peer's receive ring is full");
  }
  if (!state_.ok()) {
    for (const PendingRequest& pending : prepared) {
      PushCompletionLocked(WorkCompletion(pending.wr, WcStatus::kFlushed), now);
    }
    WakeLocalWaiters();
    return Status::OK();
  }
  for (PendingRequest& pending : prepared) {
    ring_reserved_ += pending.ring_bytes;
    deferred_.push_back(std::move(pending));
  }
  ProgressLocked(now);
  WakeLocalWaiters();
  return Status::OK();
}

Status ShmConnection::PostRecv(const RecvRequest* requests, size_t count) {
  if (count == 0) return Status::OK();
  if (requests == nullptr) return Status::InvalidArgument("no receive requests");
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < count; i++) {
    Status s = CheckSgeLocked(requests[i].sge);
    if (!s.ok()) return s;
  }
  const Clock::time_point now = Clock::now();
  for (size_t i = 0; i < count; i++) {
    if (!state_.ok()) {
      PushCompletionLocked(RecvCompletion(requests[i], WcStatus::kFlushed, 0, 0, false), now);
    } else {
      posted_recvs_.push_back(requests[i]);
    }
  }
  WakeLocalWaiters();
  return Status::OK();
}

Status ShmConnection::Poll(Completion* out, size_t max, int timeout_ms, size_t* count) {
  *count = 0;
  if (max == 0) return Status::OK();
  const Clock::time_point deadline =
      Clock::now() + std::chrono::milliseconds(std::max(timeout_ms, 0));
  std::unique_lock<std::mutex> lock(mu_);
  for (bool first = true;; first = false) {
    Clock::time_point now = Clock::now();
    ConsumeRingLocked(now);
    CheckPeerLocked(now, /*force=*/!first);
    ProgressLocked(now);
    completions_.PopDue(out, max, now, count);
    if (*count > 0) return Status::OK();
    if (completions_.empty() && !state_.ok()) return state_;
    if (now >= deadline) return Status::OK();
    Clock::time_point until = std::min(deadline, now + kWaitSlice);
    if (!completions_.empty()) until = std::min(until, completions_.next_due());
    if (!deferred_.empty()) until = std::min(until, completions_.last_due());
    // Announce the sleeper before sampling the doorbell: a producer that bumps the doorbell
    // after our sample sees the waiter and wakes us (or the sample already differs).
    own_header_->waiters.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t bell = own_header_->doorbell.load(std::memory_order_seq_cst);
    if (!RingConsumableLocked() && until > now) {
      lock.unlock();
      FutexWait(&own_header_->doorbell, bell, until - now);
      lock.lock();
    }
    own_header_->waiters.fetch_sub(1, std::memory_order_seq_cst);
  }
}

Status ShmConnection::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  // Checking the peer only records what already happened; the logical state is unchanged.
  const_cast<ShmConnection*>(this)->CheckPeerLocked(Clock::now(), /*force=*/true);
  return state_;
}

void ShmConnection::Disconnect() {
  std::lock_guard<std::mutex> lock(mu_);
  FailLocked(Status::Disconnected("disconnected locally"));
}

Status ShmConnection::CreateHeap() {
  const uint64_t capacity = options_.region_capacity;
  if (capacity > kShmMaxRegionSpace / 4) {
    return Status::InvalidArgument("region_capacity too large for the shm backend");
  }
  // Twice the capacity plus a cache line per table entry: regions are aligned (at most
  // doubling a region's footprint), and the spare room absorbs fragmentation. The memfd is
  // sparse, so untouched space costs address space only.
  const uint64_t region_space = RoundUp(2 * capacity + kShmTableEntries * kSmallAlign, kPageBytes);
  own_heap_size_ = kShmRegionOffset + region_space;
  own_memfd_ = ::memfd_create("slipstream-shm-heap", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (own_memfd_ < 0) {
    if (errno == ENOSYS) return Status::Unavailable("memfd_create is not supported");
    return Status::IOError(ErrnoText("memfd_create"));
  }
  if (::ftruncate(own_memfd_, static_cast<off_t>(own_heap_size_)) != 0) {
    return Status::IOError(ErrnoText("ftruncate of the shm heap"));
  }
  // The peer refuses a heap that could shrink under it (its accesses would fault).
  if (::fcntl(own_memfd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return Status::IOError(ErrnoText("sealing the shm heap"));
  }
  void* heap = ::mmap(nullptr, own_heap_size_, PROT_READ | PROT_WRITE, MAP_SHARED, own_memfd_, 0);
  if (heap == MAP_FAILED) return Status::IOError(ErrnoText("mmap of the shm heap"));
  own_heap_ = static_cast<char*>(heap);
  own_header_ = new (own_heap_) ShmHeapHeader();
  own_header_->magic = kShmHeapMagic;
  own_header_->version = kShmVersion;
  own_header_->table_entries = kShmTableEntries;
  own_header_->heap_size = own_heap_size_;
  own_header_->region_space = region_space;
  own_header_->ring_bytes = kShmRingBytes;
  own_header_->token[0] = RandomKey();
  own_header_->token[1] = RandomKey();
  own_table_ = reinterpret_cast<ShmTableEntry*>(own_heap_ + kShmTableOffset);
  for (uint32_t i = 0; i < kShmTableEntries; i++) new (&own_table_[i]) ShmTableEntry();
  own_ring_ = own_heap_ + kShmRingOffset;
  allocator_.Reset(kShmRegionOffset, own_heap_size_);
  free_slots_.reserve(kShmTableEntries);
  // Hand out low slots first, so the peer's scans stay short.
  for (uint32_t i = kShmTableEntries; i > 0; i--) free_slots_.push_back(i - 1);
  return Status::OK();
}

Status ShmConnection::MapPeerHeap(const ShmHeapDescription& theirs) {
  char* heap = nullptr;
  Status s = MapShmPeerHeap(theirs, &heap);
  if (!s.ok()) return s;
  peer_heap_ = heap;
  peer_heap_size_ = theirs.heap_size;
  peer_description_ = theirs;
  peer_header_ = reinterpret_cast<ShmHeapHeader*>(peer_heap_);
  if (peer_header_->ring_head.load(std::memory_order_acquire) != 0 ||
      peer_header_->ring_tail.load(std::memory_order_acquire) != 0) {
    return Status::InvalidArgument("the peer's receive ring is not empty at setup");
  }
  peer_table_ = reinterpret_cast<ShmTableEntry*>(peer_heap_ + kShmTableOffset);
  peer_ring_ = peer_heap_ + kShmRingOffset;
  return Status::OK();
}

void ShmConnection::ZeroHeapRange(uint64_t offset, uint64_t length) {
  const uint64_t end = offset + length;
  const uint64_t first_page = RoundUp(offset, kPageBytes);
  const uint64_t last_page = end & ~(kPageBytes - 1);
  if (first_page >= last_page || ::fallocate(own_memfd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                                             static_cast<off_t>(first_page),
                                             static_cast<off_t>(last_page - first_page)) != 0) {
    std::memset(own_heap_ + offset, 0, length);
    return;
  }
  std::memset(own_heap_ + offset, 0, first_page - offset);
  std::memset(own_heap_ + last_page, 0, end - last_page);
}

void ShmConnection::ReleasePages(uint64_t offset, uint64_t length) {
  const uint64_t first_page = RoundUp(offset, kPageBytes);
  const uint64_t last_page = (offset + length) & ~(kPageBytes - 1);
  if (first_page < last_page) {
    ::fallocate(own_memfd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                static_cast<off_t>(first_page), static_cast<off_t>(last_page - first_page));
  }
}

Status ShmConnection::CheckSgeLocked(const Sge& sge) const {
  auto it = by_lkey_.find(sge.lkey);
  if (it == by_lkey_.end()) return Status::InvalidArgument("unknown lkey");
  return CheckSgeBounds(sge, it->second.addr, it->second.length);
}

Status ShmConnection::PrepareLocked(const WorkRequest& wr, PendingRequest* pending) const {
  Status s = PrepareRequest(
      wr, [this](const Sge& sge) { return CheckSgeLocked(sge); }, pending);
  if (!s.ok()) return s;
  if (wr.opcode == Opcode::kSend) {
    if (pending->length > kShmMaxSendBytes) {
      return Status::InvalidArgument("SEND larger than the shm receive ring");
    }
    pending->ring_bytes = ShmRecordBytes(kShmRecordSend, pending->length);
  } else if (wr.opcode == Opcode::kWriteWithImm) {
    pending->ring_bytes = ShmRecordBytes(kShmRecordWriteWithImm, 0);
  }
  return Status::OK();
}

void ShmConnection::PushCompletionLocked(const Completion& completion, Clock::time_point now) {
  completions_.Push(completion, now);
}

void ShmConnection::WakeLocalWaiters() {
  if (own_header_ == nullptr) return;
  own_header_->doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (own_header_->waiters.load(std::memory_order_seq_cst) > 0) {
    FutexWakeAll(&own_header_->doorbell);
  }
}

void ShmConnection::WakePeer() {
  peer_header_->doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (peer_header_->waiters.load(std::memory_order_seq_cst) > 0) {
    FutexWakeAll(&peer_header_->doorbell);
  }
}

void ShmConnection::FailLocked(const Status& why) {
  if (!state_.ok()) return;
  state_ = why;
  const Clock::time_point now = Clock::now();
  for (const PendingRequest& pending : deferred_) {
    PushCompletionLocked(WorkCompletion(pending.wr, WcStatus::kFlushed), now);
  }
  deferred_.clear();
  ring_reserved_ = 0;
  for (const RecvRequest& recv : posted_recvs_) {
    PushCompletionLocked(RecvCompletion(recv, WcStatus::kFlushed, 0, 0, false), now);
  }
  posted_recvs_.clear();
  // Our regions stop being reachable before the peer can learn of the end: a WRITE it (or a
  // ShmPeerWriter of its host) validates from now on fails, and one that validated earlier
  // sees the revocation when it checks again after its copy, so it is not reported placed.
  for (const auto& [lkey, entry] : by_lkey_) {
    if (entry.slot >= 0) WriteEntry(&own_table_[entry.slot], EntrySnapshot{});
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
  ::shutdown(fd_, SHUT_RDWR);
  WakeLocalWaiters();
}

void ShmConnection::CheckPeerLocked(Clock::time_point now, bool force) {
  if (!state_.ok()) return;
  if (own_header_->error.load(std::memory_order_acquire) != kShmNoError) {
    FailPeerEndedLocked();
    return;
  }
  if (!force && now - last_liveness_check_ < kLivenessInterval) return;
  last_liveness_check_ = now;
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  int rc = ::poll(&p, 1, 0);
  if (rc <= 0) return;  // nothing happened (or EINTR: look again next time)
  if ((p.revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL)) != 0) {
    FailPeerEndedLocked();
    return;
  }
  if ((p.revents & POLLIN) != 0) {
    char byte;
    ssize_t n = ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      FailPeerEndedLocked();
    } else if (n > 0) {
      FailLocked(Status::IOError("the peer sent bytes on the setup socket after setup"));
    }
  }
}

void ShmConnection::FailPeerEndedLocked() {
  uint32_t error = own_header_->error.load(std::memory_order_acquire);
  if (error == kShmErrorRemoteAccess) {
    FailLocked(Status::RemoteAccess("the peer refused one of our accesses"));
  } else if (error != kShmNoError) {
    FailLocked(Status::IOError("the peer set an unknown error"));
  } else {
    FailLocked(Status::Disconnected("the peer closed the connection"));
  }
}

void ShmConnection::ProgressLocked(Clock::time_point now) {
  while (state_.ok() && !deferred_.empty()) {
    if (deferred_.front().wr.fence && completions_.last_due() > now) return;
    PendingRequest pending = std::move(deferred_.front());
    deferred_.pop_front();
    ring_reserved_ -= pending.ring_bytes;
    ExecuteLocked(pending, now);
  }
}

bool ShmConnection::FindPeerEntryLocked(uint64_t rkey, EntrySnapshot* snapshot) {
  auto cached = peer_slot_cache_.find(rkey);
  if (cached != peer_slot_cache_.end()) {
    if (ReadEntry(peer_table_[cached->second], snapshot) && snapshot->rkey == rkey &&
        snapshot->state == kShmEntryValid) {
      return true;
    }
    peer_slot_cache_.erase(cached);
  }
  const uint32_t used = std::min<uint32_t>(peer_header_->table_used.load(std::memory_order_acquire),
                                           kShmTableEntries);
  for (uint32_t slot = 0; slot < used; slot++) {
    if (peer_table_[slot].rkey.load(std::memory_order_relaxed) != rkey) continue;
    if (ReadEntry(peer_table_[slot], snapshot) && snapshot->rkey == rkey &&
        snapshot->state == kShmEntryValid) {
      if (peer_slot_cache_.size() > kShmTableEntries) peer_slot_cache_.clear();
      peer_slot_cache_[rkey] = slot;
      return true;
    }
  }
  return false;
}

char* ShmConnection::ResolvePeerLocked(uint64_t rkey, uint64_t remote_addr, uint64_t length,
                                       uint32_t right) {
  if (rkey == 0 || right == 0) return nullptr;
  EntrySnapshot entry;
  if (!FindPeerEntryLocked(rkey, &entry)) return nullptr;
  return ResolveInShmHeap(peer_heap_, peer_heap_size_, entry, remote_addr, length, right);
}

bool ShmConnection::PeerRingFreeLocked(uint64_t* free_bytes) {
  const uint64_t head = peer_header_->ring_head.load(std::memory_order_acquire);
  if (head > peer_ring_tail_ || peer_ring_tail_ - head > kShmRingBytes) {
    FailLocked(Status::IOError("the peer's receive ring head is corrupt"));
    return false;
  }
  *free_bytes = kShmRingBytes - (peer_ring_tail_ - head);
  return true;
}

bool ShmConnection::AppendRecordLocked(uint32_t kind, uint32_t length, uint32_t imm,
                                       const std::vector<Sge>* payload) {
  const uint64_t size = ShmRecordBytes(kind, length);
  uint64_t free_bytes = 0;
  if (!PeerRingFreeLocked(&free_bytes)) return false;
  if (size > free_bytes) {
    FailLocked(Status::IOError("the peer's receive ring lost reserved room"));
    return false;
  }
  WriteShmRecord(peer_ring_, peer_ring_tail_, ShmRecordHeader{kind, length, imm, 0}, payload);
  peer_ring_tail_ += size;
  peer_header_->ring_tail.store(peer_ring_tail_, std::memory_order_release);
  WakePeer();
  return true;
}

void ShmConnection::RefuseLocked(const PendingRequest& pending, Clock::time_point now) {
  PushCompletionLocked(WorkCompletion(pending.wr, WcStatus::kRemoteAccessError), now);
  peer_header_->error.store(kShmErrorRemoteAccess, std::memory_order_release);
  WakePeer();
  FailLocked(Status::RemoteAccess("the peer refused an access"));
}

void ShmConnection::SucceedLocked(const PendingRequest& pending, Clock::time_point now) {
  if (pending.wr.signaled) {
    PushCompletionLocked(WorkCompletion(pending.wr, WcStatus::kSuccess), now);
  } else {
    completions_.NoteUnsignaled(now);
  }
}

void ShmConnection::ExecuteLocked(const PendingRequest& pending, Clock::time_point now) {
  const WorkRequest& wr = pending.wr;
  switch (wr.opcode) {
    case Opcode::kWrite:
    case Opcode::kWriteWithImm: {
      if (faults_.drop_on_next_write) {
        faults_.drop_on_next_write = false;
        PushCompletionLocked(WorkCompletion(pending.wr, WcStatus::kFlushed), now);
        FailLocked(Status::Disconnected("fault injection: dropped before a WRITE"));
        return;
      }
      char* target = ResolvePeerLocked(wr.rkey, wr.remote_addr, pending.length, kRemoteWrite);
      if (target == nullptr) {
        RefuseLocked(pending, now);
        return;
      }
      uint64_t limit = pending.length;
      const bool tear = faults_.tear_next_write_after >= 0;
      if (tear) {
        limit = std::min<uint64_t>(limit, uint64_t(faults_.tear_next_write_after));
        faults_.tear_next_write_after = -1;
      }
      if (wr.repeat > 1) {
        // A strided gather copies straight into the peer's memory: no staging copy.
        if (tear) {
          GatherPrefix(pending.sges.data(), pending.sges.size(), wr.repeat_stride, limit, target);
        } else {
          GatherPeriods(pending.sges.data(), pending.sges.size(), wr.repeat_stride, 0, wr.repeat,
                        target);
        }
      } else {
        for (const Sge& sge : pending.sges) {
          if (limit == 0) break;
          const uint64_t piece = std::min<uint64_t>(sge.length, limit);
          CopyAscending(target, static_cast<const char*>(sge.addr), piece);
          target += piece;
          limit -= piece;
        }
      }
      // A later WRITE's bytes must never become visible before this one's; and a region the
      // peer revoked while we copied (it is ending the connection, and may already have read
      // the buffer) makes the WRITE fail, since its bytes may not count.
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (!tear &&
          ResolvePeerLocked(wr.rkey, wr.remote_addr, pending.length, kRemoteWrite) == nullptr) {
        RefuseLocked(pending, now);
        return;
      }
      if (tear) {
        PushCompletionLocked(WorkCompletion(pending.wr, WcStatus::kFlushed), now);
        FailLocked(Status::Disconnected("fault injection: torn WRITE"));
        return;
      }
      if (wr.opcode == Opcode::kWriteWithImm &&
          !AppendRecordLocked(kShmRecordWriteWithImm, static_cast<uint32_t>(pending.length), wr.imm,
                              nullptr)) {
        return;
      }
      SucceedLocked(pending, now);
      return;
    }
    case Opcode::kRead: {
      const char* source = ResolvePeerLocked(wr.rkey, wr.remote_addr, pending.length, kRemoteRead);
      if (source == nullptr) {
        RefuseLocked(pending, now);
        return;
      }
      for (const Sge& sge : pending.sges) {
        if (sge.length > 0) std::memcpy(const_cast<void*>(sge.addr), source, sge.length);
        source += sge.length;
      }
      SucceedLocked(pending, now);
      return;
    }
    default:  // kSend
      if (!AppendRecordLocked(kShmRecordSend, static_cast<uint32_t>(pending.length), 0,
                              &pending.sges)) {
        return;
      }
      SucceedLocked(pending, now);
      return;
  }
}

bool ShmConnection::RingConsumableLocked() const {
  return state_.ok() && !posted_recvs_.empty() &&
         own_header_->ring_tail.load(std::memory_order_acquire) != own_ring_head_;
}

void ShmConnection::ConsumeRingLocked(Clock::time_point now) {
  bool consumed = false;
  while (state_.ok() && !posted_recvs_.empty()) {
    const uint64_t tail = own_header_->ring_tail.load(std::memory_order_acquire);
    if (tail == own_ring_head_) break;
    ShmRecordHeader header;
    Status checked = ReadShmRecordHeader(own_ring_, own_ring_head_, tail, &header);
    if (!checked.ok()) {
      FailLocked(checked);
      break;
    }
    const RecvRequest recv = posted_recvs_.front();
    posted_recvs_.pop_front();
    if (header.kind != kShmRecordSend) {
      PushCompletionLocked(
          RecvCompletion(recv, WcStatus::kSuccess, header.length, header.imm, true), now);
    } else if (header.length > recv.sge.length) {
      PushCompletionLocked(RecvCompletion(recv, WcStatus::kLocalLengthError, 0, 0, false), now);
    } else {
      CopyShmRecordPayload(own_ring_, own_ring_head_, header.length,
                           static_cast<char*>(const_cast<void*>(recv.sge.addr)));
      PushCompletionLocked(RecvCompletion(recv, WcStatus::kSuccess, header.length, 0, false), now);
    }
    // Release: our copy out of the record happens before the peer may overwrite it.
    own_ring_head_ += ShmRecordBytes(header.kind, header.length);
    own_header_->ring_head.store(own_ring_head_, std::memory_order_release);
    consumed = true;
  }
  if (consumed) WakeLocalWaiters();
}

// Builds either side (the protocol is symmetric); drops the socket on any failure.
Status EstablishShm(const TransportOptions& options, int fd, std::unique_ptr<Connection>* out) {
  auto connection = std::make_unique<ShmConnection>(options, fd);
  Status s = connection->Establish();
  if (!s.ok()) return s;  // the destructor closes the socket
  *out = std::move(connection);
  return Status::OK();
}

}  // namespace

Status ExportShmPeer(const Connection* connection, ShmPeerRef* ref) {
  const auto* shm = dynamic_cast<const ShmConnection*>(connection);
  if (shm == nullptr) return Status::Unavailable("not an shm connection");
  const ShmHeapDescription& theirs = shm->peer_description();
  if (theirs.magic != kShmHeapMagic) return Status::Unavailable("the shm connection has no peer");
  ref->pid = theirs.pid;
  ref->memfd = theirs.memfd;
  ref->token[0] = theirs.token[0];
  ref->token[1] = theirs.token[1];
  ref->heap_size = theirs.heap_size;
  ref->region_space = theirs.region_space;
  return Status::OK();
}

// A SEND's payload is padded so that the next header starts 16-byte aligned.
uint64_t ShmRecordBytes(uint32_t kind, uint64_t length) {
  if (kind != kShmRecordSend) return kShmRecordHeaderBytes;
  return kShmRecordHeaderBytes + RoundUp(length, kShmRecordHeaderBytes);
}

// Ascending stores, so a producer that dies mid-record leaves a prefix; the consumer only
// looks at the record once the tail (published after this) covers it.
void WriteShmRecord(char* ring, uint64_t tail, const ShmRecordHeader& header,
                    const std::vector<Sge>* payload) {
  uint64_t position = tail % kShmRingBytes;
  CopyAscending(ring + position, reinterpret_cast<const char*>(&header), sizeof(header));
  position = (position + sizeof(header)) % kShmRingBytes;
  if (payload == nullptr) return;
  for (const Sge& sge : *payload) {
    const char* source = static_cast<const char*>(sge.addr);
    uint64_t left = sge.length;
    while (left > 0) {
      const uint64_t piece = std::min<uint64_t>(left, kShmRingBytes - position);
      CopyAscending(ring + position, source, piece);
      source += piece;
      left -= piece;
      position = (position + piece) % kShmRingBytes;
    }
  }
}

// The tail must lie at most a ring ahead of the head on a record boundary, and the record must
// fit in what the tail covers. The header is read once into *header, so a peer that rewrites
// the ring meanwhile cannot change what was checked.
Status ReadShmRecordHeader(const char* ring, uint64_t head, uint64_t tail,
                           ShmRecordHeader* header) {
  const uint64_t available = tail - head;
  if (tail < head || available > kShmRingBytes || available % kShmRecordHeaderBytes != 0) {
    return Status::IOError("the peer corrupted our receive ring");
  }
  std::memcpy(header, ring + head % kShmRingBytes, sizeof(*header));
  const bool is_send = header->kind == kShmRecordSend;
  if ((!is_send && header->kind != kShmRecordWriteWithImm) || header->reserved != 0 ||
      (is_send && header->length > kShmMaxSendBytes) ||
      ShmRecordBytes(header->kind, header->length) > available) {
    return Status::IOError("malformed record in our receive ring");
  }
  return Status::OK();
}

// The payload starts right after the header and may wrap around the ring's end.
void CopyShmRecordPayload(const char* ring, uint64_t head, uint64_t length, char* out) {
  uint64_t position = (head % kShmRingBytes + kShmRecordHeaderBytes) % kShmRingBytes;
  while (length > 0) {
    const uint64_t piece = std::min<uint64_t>(length, kShmRingBytes - position);
    std::memcpy(out, ring + position, piece);
    out += piece;
    length -= piece;
    position = (position + piece) % kShmRingBytes;
  }
}

// The listening side.
Status AcceptShm(const TransportOptions& options, int fd, std::unique_ptr<Connection>* out) {
  return EstablishShm(options, fd, out);
}

// The connecting side.
Status ConnectShm(const TransportOptions& options, int fd, std::unique_ptr<Connection>* out) {
  return EstablishShm(options, fd, out);
}

}  // namespace slipstream::rdma
