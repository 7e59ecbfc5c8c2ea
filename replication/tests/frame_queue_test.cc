// FrameQueue: order, wrap-around, overflow, and many producer processes (fork) feeding one
// consumer through shared memory while it drains, with nothing lost, reordered or torn.
#include "slipstream/replication/frame_queue.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <map>
#include <string>
#include <vector>

namespace slipstream::replication {
namespace {

// A zeroed MAP_SHARED region holding a queue of `capacity` bytes.
struct SharedQueue {
  explicit SharedQueue(uint64_t capacity) : size(FrameQueue::SizeFor(capacity)) {
    memory = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    queue = FrameQueue::Create(memory, capacity);
  }
  ~SharedQueue() { munmap(memory, size); }
  size_t size;
  void* memory;
  FrameQueue* queue;
};

// A frame naming its producer and sequence number, of a length that varies with them.
std::string FrameOf(int producer, int seq) {
  std::string head = std::to_string(producer) + ":" + std::to_string(seq) + ":";
  return head + std::string(size_t((seq * 37 + producer * 11) % 3000), char('a' + seq % 26));
}

TEST(FrameQueue, KeepsOrderAndTagsAcrossTheWrap) {
  SharedQueue s(10000);
  std::string frame;
  uint64_t tag = 0;
  EXPECT_FALSE(s.queue->Front(&frame, &tag));
  int next_in = 0, next_out = 0;
  for (int step = 0; step < 2000; step++) {
    while (s.queue->Push(FrameOf(0, next_in), 1000 + next_in)) next_in++;
    s.queue->ClearOverflow();  // (the refused push above marked it)
    // ClearOverflow dropped what was queued: start the count again from there.
    next_out = next_in;
    ASSERT_EQ(s.queue->frames(), 0u);
    for (int k = 0; k < 3; k++) ASSERT_TRUE(s.queue->Push(FrameOf(0, next_in + k), 7 + k));
    for (int k = 0; k < 3; k++) {
      ASSERT_TRUE(s.queue->Front(&frame, &tag));
      EXPECT_EQ(frame, FrameOf(0, next_out + k));
      EXPECT_EQ(tag, uint64_t(7 + k));
      s.queue->PopFront();
    }
    next_in += 3;
  }
  EXPECT_GT(s.queue->pushed(), 2000u);
}

TEST(FrameQueue, AFrameThatDoesNotFitOverflowsTheQueueUntilCleared) {
  SharedQueue s(1000);
  ASSERT_TRUE(s.queue->Push(std::string(500, 'x'), 1));
  EXPECT_FALSE(s.queue->Push(std::string(600, 'y'), 2));
  EXPECT_TRUE(s.queue->overflowed());
  EXPECT_FALSE(s.queue->Push("small", 3)) << "a push after an overflow would leave a gap";
  s.queue->ClearOverflow();
  EXPECT_FALSE(s.queue->overflowed());
  EXPECT_EQ(s.queue->frames(), 0u);
  EXPECT_TRUE(s.queue->Push("small", 4));
  // A producer that could not make its frame marks the gap the same way.
  s.queue->MarkOverflowed();
  EXPECT_TRUE(s.queue->overflowed());
  EXPECT_FALSE(s.queue->Push("after", 5));
}

TEST(FrameQueue, ManyProducerProcessesOneConsumer) {
  constexpr int kProducers = 4, kFrames = 3000;
  SharedQueue s(64 * 1024);
  std::vector<pid_t> children;
  for (int p = 0; p < kProducers; p++) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      FrameQueue* q = FrameQueue::Attach(s.memory);
      for (int seq = 0; seq < kFrames; seq++) {
        // A full queue refuses; a producer here waits and retries instead of overflowing (the
        // engine's producers cannot, which is what the overflow is for).
        std::string f = FrameOf(p, seq);
        FrameQueue::PushResult r;
        while ((r = q->TryPush(f, uint64_t(p) << 32 | uint64_t(seq))) ==
               FrameQueue::PushResult::kFull) {
          usleep(50);
        }
        if (r != FrameQueue::PushResult::kPushed) _exit(2);
      }
      _exit(0);
    }
    children.push_back(pid);
  }
  std::map<int, int> next;  // per producer, the next sequence expected
  int received = 0;
  std::string frame;
  uint64_t tag;
  while (received < kProducers * kFrames) {
    if (!s.queue->Front(&frame, &tag)) {
      ASSERT_FALSE(s.queue->overflowed());
      usleep(20);
      continue;
    }
    s.queue->PopFront();
    int p = int(tag >> 32), seq = int(tag & 0xffffffff);
    ASSERT_EQ(seq, next[p]) << "producer " << p << " reordered or lost";
    ASSERT_EQ(frame, FrameOf(p, seq)) << "a torn frame";
    next[p]++;
    received++;
  }
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "a producer found the queue overflowed";
  }
  EXPECT_EQ(s.queue->frames(), 0u);
}

TEST(FrameQueue, AProducerKilledHoldingTheLockMarksTheQueueOverflowed) {
  SharedQueue s(1 << 20);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Takes the mutex the way Push does and dies holding it.
    pthread_mutex_lock(reinterpret_cast<pthread_mutex_t*>(s.memory));
    raise(SIGKILL);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(s.queue->overflowed());
  s.queue->ClearOverflow();
  EXPECT_TRUE(s.queue->Push("after", 1)) << "the queue stayed locked";
}

}  // namespace
}  // namespace slipstream::replication
