// LevelSet: the current version and compaction picking (the manifest is in manifest.cc).
#include "level_set.h"

#include <cstring>
#include <thread>

namespace slipstream::engine {

void LevelSet::Format() {
  shared_->next_tree_id.store(1);
  shared_->current.active_memtable = 0;
  shared_->current.immutable_memtable = -1;
}

// Seqlock read: retries while a writer is inside Apply.
Version LevelSet::Current(uint64_t* seq) const {
  Version v;
  while (true) {
    uint64_t s1 = shared_->version_seq.load(std::memory_order_acquire);
    if (s1 & 1) {
      std::this_thread::yield();
      continue;
    }
    std::memcpy(static_cast<void*>(&v), &shared_->current, sizeof(Version));
    std::atomic_thread_fence(std::memory_order_acquire);
    if (shared_->version_seq.load(std::memory_order_relaxed) == s1) {
      if (seq) *seq = s1;
      return v;
    }
  }
}

uint32_t LevelSet::DeepestLevel(const Version& v) const {
  uint32_t deepest = 0;
  for (uint32_t level = 1; level <= options_.max_levels; level++) {
    if (v.levels[level].tree_id != 0) deepest = level;
  }
  return deepest;
}

int LevelSet::PickCompaction(const Version& v) const {
  if (v.immutable_memtable >= 0) return 0;
  double capacity = double(options_.l0_size);
  for (uint32_t level = 1; level < options_.max_levels; level++) {
    capacity *= options_.growth_factor;
    if (v.levels[level].tree_id != 0 && double(v.levels[level].bytes) > capacity) return int(level);
  }
  return -1;
}

}  // namespace slipstream::engine
