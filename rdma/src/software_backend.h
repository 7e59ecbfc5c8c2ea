// What the two software backends (shm and tcp) share: their request limits, the validation of
// posted work requests and their buffers, the completion builders, and the completion queue
// that applies FaultInjection::completion_delay_us. The verbs backend leaves all of this to
// the NIC and does not use it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "slipstream/rdma/testing.h"
#include "slipstream/rdma/transport.h"

namespace slipstream::rdma {

// Largest gather/scatter list of one work request.
constexpr uint32_t kSoftwareMaxSge = 256;
// Largest payload of one request: Completion::byte_len is 32 bits.
constexpr uint64_t kSoftwareMaxRequestBytes = UINT32_MAX;
// Largest WorkRequest::repeat of a strided gather.
constexpr uint32_t kSoftwareMaxRepeat = UINT32_MAX;

// True when [addr, addr+length) lies inside [base, base+size), without overflow.
bool Inside(const char* base, size_t size, const void* addr, uint64_t length);

// Checks that a (non-empty) Sge lies inside the region [base, base+size) its lkey names.
Status CheckSgeBounds(const Sge& sge, const char* base, size_t size);

// A posted work request as a software backend keeps it: a copy of the request and of its
// gather/scatter list (the caller's sg_list is not used after Post), and the list's bytes.
struct PreparedRequest {
  WorkRequest wr;
  std::vector<Sge> sges;
  uint64_t length = 0;
};

// Validates a work request (opcode, list size, each Sge through `check_sge`, total length;
// for a strided gather the first and the last copy of each entry, which bound the others)
// and fills `out`; posts nothing on failure, so the caller can refuse the whole list.
Status PrepareRequest(const WorkRequest& wr, const std::function<Status(const Sge&)>& check_sge,
                      PreparedRequest* out);

// A region as its peer addresses it on shm and tcp: by its address in this process.
inline RemoteRegion DescribeSoftwareRegion(const LocalRegion& region) {
  return RemoteRegion{reinterpret_cast<uintptr_t>(region.addr), region.length, region.rkey};
}

// The checks that open every Post on shm and tcp: OK with *empty set when there is nothing to
// post, InvalidArgument for a missing list or more requests than may ever be in flight.
inline Status CheckPostBatch(const WorkRequest* requests, size_t count, uint32_t max_outstanding,
                             bool* empty) {
  *empty = count == 0;
  if (*empty) return Status::OK();
  if (requests == nullptr) return Status::InvalidArgument("no work requests");
  if (count > max_outstanding) {
    return Status::InvalidArgument("more requests than max_outstanding in one post");
  }
  return Status::OK();
}

// The initiator's completion for a work request.
Completion WorkCompletion(const WorkRequest& wr, WcStatus status);

// A receive completion.
Completion RecvCompletion(const RecvRequest& recv, WcStatus status, uint32_t byte_len, uint32_t imm,
                          bool has_imm);

// Completions waiting to be polled, each held back by the connection's completion_delay_us
// from the moment the request finished. Not thread-safe: the connection's lock guards it.
class DelayedCompletions {
 public:
  using Clock = std::chrono::steady_clock;

  // Reads the delay from `faults` whenever a request finishes.
  explicit DelayedCompletions(const FaultInjection* faults) : faults_(faults) {}

  // Queues the completion of a request that finished at `now`.
  void Push(const Completion& completion, Clock::time_point now);
  // Notes a request that finished at `now` without a completion (unsignaled): it still counts
  // for last_due().
  void NoteUnsignaled(Clock::time_point now);
  // Moves completions that are due at `now` into `out` until it holds `max`.
  void PopDue(Completion* out, size_t max, Clock::time_point now, size_t* count);

  bool empty() const { return queue_.empty(); }
  // When the oldest queued completion becomes due (call only when not empty).
  Clock::time_point next_due() const { return queue_.front().due; }
  // The latest due time of any request that finished so far (what a fence waits for).
  Clock::time_point last_due() const { return last_due_; }

 private:
  // The due time of a request that finishes at `now`, remembered in last_due_.
  Clock::time_point DueAfter(Clock::time_point now);

  struct Timed {
    Completion completion;
    Clock::time_point due;
  };
  const FaultInjection* faults_;
  std::deque<Timed> queue_;
  Clock::time_point last_due_{};
};

}  // namespace slipstream::rdma
