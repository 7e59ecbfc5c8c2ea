// FrameQueue: frames handed from many processes to one through memory they share (PostgreSQL
// shared memory): on a primary, the index-shipping events the engine raises in whichever
// process compacts or writes out the large log reach the one shipper, in the order they were
// raised. Each frame carries a tag (the WAL position that covers it), by which the consumer
// orders it after the WAL on each backup.
//
// Bounded: a frame that does not fit is refused and the queue marked overflowed, because a
// producer runs inside engine code holding engine locks and must not wait for the consumer;
// the consumer sees the overflow and re-seeds what depended on the stream. A process-shared,
// robust mutex guards it (a producer killed while holding it marks the queue overflowed: the
// frame it was copying may be torn). Nothing in it is a pointer: every process may map it at
// its own address.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace slipstream::replication {

class FrameQueue {
 public:
  // Bytes of shared memory a queue of `capacity` bytes of frames (with their 12-byte headers)
  // takes.
  static size_t SizeFor(uint64_t capacity);
  // Lays out a queue in `memory` (SizeFor(capacity) bytes), once, before any process uses it.
  static FrameQueue* Create(void* memory, uint64_t capacity);
  // The queue laid out at `memory` by Create (in this or another process).
  static FrameQueue* Attach(void* memory) { return static_cast<FrameQueue*>(memory); }

  FrameQueue(const FrameQueue&) = delete;
  FrameQueue& operator=(const FrameQueue&) = delete;

  // Producers: appends a frame tagged `tag`. False if it does not fit, or the queue is
  // overflowed already (it then stays overflowed until ClearOverflow).
  bool Push(std::string_view frame, uint64_t tag);
  // The same for a producer that can wait: kFull (and no overflow) if there is no room now.
  enum class PushResult { kPushed, kFull, kOverflowed };
  PushResult TryPush(std::string_view frame, uint64_t tag);

  // The consumer: copies out the oldest frame and its tag without removing it (false: empty).
  bool Front(std::string* frame, uint64_t* tag);
  // Removes the oldest frame.
  void PopFront();
  // Whether a frame was refused (or torn) since the last ClearOverflow; clearing also drops
  // every queued frame, since what follows a gap is of no use to the stream it fed.
  bool overflowed();
  void ClearOverflow();
  // Marks the queue overflowed (a producer that could not make its frame); allocates nothing.
  void MarkOverflowed();

  // Frames and bytes queued now, and frames pushed since Create.
  uint64_t frames();
  uint64_t bytes();
  uint64_t pushed();

 private:
  FrameQueue() = default;
  struct Lock;
  PushResult Append(std::string_view frame, uint64_t tag, bool overflow_if_full);
  void CopyIn(uint64_t at, const void* src, size_t n);
  void CopyOut(uint64_t at, void* dst, size_t n) const;
  char* data() { return reinterpret_cast<char*>(this + 1); }
  const char* data() const { return reinterpret_cast<const char*>(this + 1); }

  alignas(64) unsigned char mutex_[64];  // a pthread_mutex_t, process-shared and robust
  uint64_t capacity_ = 0;
  uint64_t head_ = 0;  // byte counters: the oldest frame starts at head_ % capacity_
  uint64_t tail_ = 0;
  uint64_t frames_ = 0;
  uint64_t pushed_ = 0;
  uint32_t overflowed_ = 0;
};

}  // namespace slipstream::replication
