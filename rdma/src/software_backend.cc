// Shared internals of the shm and tcp backends (see software_backend.h).
#include "software_backend.h"

#include <algorithm>
#include <cstdint>

namespace slipstream::rdma {

// Compares the offset with the room left, so no sum can wrap around.
bool Inside(const char* base, size_t size, const void* addr, uint64_t length) {
  uintptr_t b = reinterpret_cast<uintptr_t>(base);
  uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  if (a < b) return false;
  uint64_t offset = a - b;
  return offset <= size && length <= size - offset;
}

// A null or out-of-region buffer is refused; an empty Sge may point anywhere.
Status CheckSgeBounds(const Sge& sge, const char* base, size_t size) {
  if (sge.length > 0 && sge.addr == nullptr) return Status::InvalidArgument("null buffer");
  if (sge.length > 0 && !Inside(base, size, sge.addr, sge.length)) {
    return Status::InvalidArgument("buffer outside its region");
  }
  return Status::OK();
}

// Everything is checked before `out` is used, so a refused request leaves nothing behind.
Status PrepareRequest(const WorkRequest& wr, const std::function<Status(const Sge&)>& check_sge,
                      PreparedRequest* out) {
  switch (wr.opcode) {
    case Opcode::kWrite:
    case Opcode::kWriteWithImm:
    case Opcode::kRead:
    case Opcode::kSend:
      break;
    default:
      return Status::InvalidArgument("opcode cannot be posted");
  }
  if (wr.num_sge > kSoftwareMaxSge) return Status::InvalidArgument("too many Sge");
  if (wr.num_sge > 0 && wr.sg_list == nullptr) return Status::InvalidArgument("no sg_list");
  const bool is_write = wr.opcode == Opcode::kWrite || wr.opcode == Opcode::kWriteWithImm;
  if (wr.repeat == 0 || (wr.repeat > 1 && !is_write)) {
    return Status::InvalidArgument("a repeat is for WRITEs only, and at least 1");
  }
  out->wr = wr;
  out->wr.sg_list = nullptr;
  out->sges.assign(wr.sg_list, wr.sg_list + wr.num_sge);
  out->length = 0;
  // The last copy of an entry lies `reach` bytes after the first; both must lie in the
  // entry's region, and then every copy between them does.
  const uint64_t copies_after_first = uint64_t(wr.repeat) - 1;
  if (copies_after_first > 0 && wr.repeat_stride > UINT64_MAX / copies_after_first) {
    return Status::InvalidArgument("repeat_stride * repeat overflows");
  }
  const uint64_t reach = copies_after_first * wr.repeat_stride;
  for (const Sge& sge : out->sges) {
    Status s = check_sge(sge);
    if (!s.ok()) return s;
    if (reach > 0 && sge.length > 0) {
      const uintptr_t first = reinterpret_cast<uintptr_t>(sge.addr);
      if (first > UINTPTR_MAX - reach) return Status::InvalidArgument("buffer outside its region");
      s = check_sge(Sge{reinterpret_cast<const void*>(first + reach), sge.length, sge.lkey});
      if (!s.ok()) return s;
    }
    out->length += sge.length;
  }
  if (out->length > 0 && wr.repeat > kSoftwareMaxRequestBytes / out->length) {
    return Status::InvalidArgument("request too long");
  }
  out->length *= wr.repeat;
  if (out->length > kSoftwareMaxRequestBytes) return Status::InvalidArgument("request too long");
  return Status::OK();
}

// Carries the request's id and opcode.
Completion WorkCompletion(const WorkRequest& wr, WcStatus status) {
  Completion c;
  c.wr_id = wr.wr_id;
  c.opcode = wr.opcode;
  c.status = status;
  return c;
}

// Carries the receive's id and what arrived.
Completion RecvCompletion(const RecvRequest& recv, WcStatus status, uint32_t byte_len, uint32_t imm,
                          bool has_imm) {
  Completion c;
  c.wr_id = recv.wr_id;
  c.opcode = Opcode::kRecv;
  c.status = status;
  c.byte_len = byte_len;
  c.imm = imm;
  c.has_imm = has_imm;
  return c;
}

// Now plus the delay asked for at this moment.
DelayedCompletions::Clock::time_point DelayedCompletions::DueAfter(Clock::time_point now) {
  Clock::time_point due = now + std::chrono::microseconds(faults_->completion_delay_us);
  last_due_ = std::max(last_due_, due);
  return due;
}

// Appends in finishing order, so completions come out in that order.
void DelayedCompletions::Push(const Completion& completion, Clock::time_point now) {
  queue_.push_back(Timed{completion, DueAfter(now)});
}

// Only moves last_due() on.
void DelayedCompletions::NoteUnsignaled(Clock::time_point now) {
  DueAfter(now);
}

// Stops at the first completion that is not due yet, keeping the order.
void DelayedCompletions::PopDue(Completion* out, size_t max, Clock::time_point now, size_t* count) {
  while (*count < max && !queue_.empty() && queue_.front().due <= now) {
    out[(*count)++] = queue_.front().completion;
    queue_.pop_front();
  }
}

}  // namespace slipstream::rdma
