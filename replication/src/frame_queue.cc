// FrameQueue: see frame_queue.h. A frame is stored as u32 length, u64 tag, then its bytes,
// wrapping around the end of the data area.
#include "slipstream/replication/frame_queue.h"

#include <pthread.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

namespace slipstream::replication {

namespace {

constexpr size_t kFrameHeader = 12;  // length, tag

}  // namespace

static_assert(sizeof(pthread_mutex_t) <= 64, "the mutex slot is too small");

// Holds the queue's mutex; a holder that died left the state possibly torn: overflowed.
struct FrameQueue::Lock {
  explicit Lock(FrameQueue* q) : q_(q) {
    auto* mu = reinterpret_cast<pthread_mutex_t*>(q_->mutex_);
    if (pthread_mutex_lock(mu) == EOWNERDEAD) {
      q_->overflowed_ = 1;
      pthread_mutex_consistent(mu);
    }
  }
  ~Lock() { pthread_mutex_unlock(reinterpret_cast<pthread_mutex_t*>(q_->mutex_)); }
  FrameQueue* q_;
};

size_t FrameQueue::SizeFor(uint64_t capacity) {
  return sizeof(FrameQueue) + capacity;
}

// Lays out the header with a process-shared, robust mutex.
FrameQueue* FrameQueue::Create(void* memory, uint64_t capacity) {
  auto* q = new (memory) FrameQueue();
  q->capacity_ = capacity;
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(reinterpret_cast<pthread_mutex_t*>(q->mutex_), &attr);
  pthread_mutexattr_destroy(&attr);
  return q;
}

// Copies n bytes to the ring at byte counter `at`.
void FrameQueue::CopyIn(uint64_t at, const void* src, size_t n) {
  uint64_t off = at % capacity_;
  size_t first = size_t(std::min<uint64_t>(n, capacity_ - off));
  std::memcpy(data() + off, src, first);
  std::memcpy(data(), static_cast<const char*>(src) + first, n - first);
}

// Copies n bytes from the ring at byte counter `at`.
void FrameQueue::CopyOut(uint64_t at, void* dst, size_t n) const {
  uint64_t off = at % capacity_;
  size_t first = size_t(std::min<uint64_t>(n, capacity_ - off));
  std::memcpy(dst, data() + off, first);
  std::memcpy(static_cast<char*>(dst) + first, data(), n - first);
}

bool FrameQueue::Push(std::string_view frame, uint64_t tag) {
  return Append(frame, tag, true) == PushResult::kPushed;
}

FrameQueue::PushResult FrameQueue::TryPush(std::string_view frame, uint64_t tag) {
  return Append(frame, tag, false);
}

// Appends under the lock; a frame that does not fit overflows the queue or is only refused.
FrameQueue::PushResult FrameQueue::Append(std::string_view frame, uint64_t tag,
                                          bool overflow_if_full) {
  Lock lock(this);
  uint64_t need = kFrameHeader + frame.size();
  if (overflowed_) return PushResult::kOverflowed;
  if (frame.size() > UINT32_MAX || need > capacity_) {
    overflowed_ = 1;  // it can never fit
    return PushResult::kOverflowed;
  }
  if (tail_ - head_ + need > capacity_) {
    if (!overflow_if_full) return PushResult::kFull;
    overflowed_ = 1;
    return PushResult::kOverflowed;
  }
  uint32_t length = uint32_t(frame.size());
  CopyIn(tail_, &length, 4);
  CopyIn(tail_ + 4, &tag, 8);
  CopyIn(tail_ + kFrameHeader, frame.data(), frame.size());
  tail_ += need;
  frames_++;
  pushed_++;
  return PushResult::kPushed;
}

bool FrameQueue::Front(std::string* frame, uint64_t* tag) {
  Lock lock(this);
  if (frames_ == 0 || head_ == tail_) return false;
  uint32_t length;
  CopyOut(head_, &length, 4);
  if (length > tail_ - head_ - kFrameHeader) {  // torn by a holder that died
    overflowed_ = 1;
    return false;
  }
  CopyOut(head_ + 4, tag, 8);
  frame->resize(length);
  CopyOut(head_ + kFrameHeader, frame->data(), length);
  return true;
}

void FrameQueue::PopFront() {
  Lock lock(this);
  if (frames_ == 0) return;
  uint32_t length;
  CopyOut(head_, &length, 4);
  head_ += kFrameHeader + length;
  frames_--;
}

bool FrameQueue::overflowed() {
  Lock lock(this);
  return overflowed_ != 0;
}

void FrameQueue::MarkOverflowed() {
  Lock lock(this);
  overflowed_ = 1;
}

void FrameQueue::ClearOverflow() {
  Lock lock(this);
  overflowed_ = 0;
  head_ = tail_;
  frames_ = 0;
}

uint64_t FrameQueue::frames() {
  Lock lock(this);
  return frames_;
}

uint64_t FrameQueue::bytes() {
  Lock lock(this);
  return tail_ - head_;
}

uint64_t FrameQueue::pushed() {
  Lock lock(this);
  return pushed_;
}

}  // namespace slipstream::replication
