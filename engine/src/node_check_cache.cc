// NodeCheckCache: reservation and marking (see node_check_cache.h for what it is for).
#include "node_check_cache.h"

#include <sys/mman.h>

namespace slipstream::engine {

static_assert(std::atomic_ref<uint64_t>::is_always_lock_free);
static_assert(std::atomic_ref<uint64_t>::required_alignment <= alignof(uint64_t));

// Unmaps the words (a process that forked keeps its own copy-on-write copy).
NodeCheckCache::~NodeCheckCache() {
  if (words_ != nullptr) munmap(words_, bytes_);
}

// An anonymous private mapping rather than calloc: its pages are zero without being written, so
// nothing is resident until a segment is marked, however large the device may grow; and
// MAP_NORESERVE keeps the reservation out of the commit charge.
bool NodeCheckCache::Init(uint64_t segments, uint32_t nodes_per_segment) {
  if (words_ != nullptr || segments == 0 || nodes_per_segment == 0) return false;
  uint64_t bytes = BytesFor(segments, nodes_per_segment);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return false;
  words_ = static_cast<uint64_t*>(p);
  bytes_ = bytes;
  segments_ = segments;
  nodes_per_segment_ = nodes_per_segment;
  stride_ = WordsPerSegment(nodes_per_segment);
  return true;
}

// Resets the segment's bits when it last belonged to another tree, then sets the node's bit.
//
// Why the races between threads of this process are harmless: every thread that calls this or
// Checked for a segment is reading a tree it can reach (under an epoch pin, or under the locks
// that keep the tree installed), and a segment passes to a new tree only after every reader that
// could reach the old tree is gone; that hand-over (through the shared epoch words, the
// allocation mutex and the version's seqlock) orders everything the old tree's readers did
// before anything the new tree's readers do. The node read itself depends on the same rule:
// were it broken, the reader would be decoding another tree's bytes, cache or no cache. So
// the threads that race on one segment all agree on its owner, and only these races remain:
//   - two threads see the old owner and both reset: the second reset may clear a bit the first
//     thread set meanwhile, so that node is checked once more later (a lost bit costs a check,
//     never skips one);
//   - a reader loads the owner while a reset is under way: the bits are cleared before the new
//     owner is published (release, paired with Checked's acquire), so a reader that sees the new
//     owner never sees a bit of the old one; a reader that still sees the old owner answers
//     false and checks the node.
// A bit is set only after its node passed the check under the owner published here, so Checked
// answers true only for a node this process checked under that same owner.
void NodeCheckCache::MarkChecked(uint32_t segment, uint32_t tree, uint32_t node) {
  if (words_ == nullptr || segment >= segments_ || node >= nodes_per_segment_) return;
  uint64_t* base = words_ + uint64_t(segment) * stride_;
  std::atomic_ref<uint64_t> owner(base[0]);
  uint64_t have = owner.load(std::memory_order_acquire);
  if (have != tree) {
    // Tree ids only grow, so a smaller id is a reader of a tree the segment has left behind
    // (which the epoch rule rules out); leave the newer owner's bits alone rather than reset.
    if (have > tree) return;
    for (uint64_t w = 1; w < stride_; w++) {
      std::atomic_ref<uint64_t>(base[w]).store(0, std::memory_order_relaxed);
    }
    owner.store(tree, std::memory_order_release);
  }
  std::atomic_ref<uint64_t>(base[1 + node / 64])
      .fetch_or(uint64_t(1) << (node % 64), std::memory_order_relaxed);
}

}  // namespace slipstream::engine
