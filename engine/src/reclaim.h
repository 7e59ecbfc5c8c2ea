// Epoch-based reclamation: readers pin the epoch they started in (EpochPin); retired items
// (segments, trees, memtable slots) are freed by the Reclaimer once every reader that might
// still see them has left. Slots of processes that died while reading are cleared.
#pragma once

#include <cstdint>

#include "memtable_pool.h"
#include "segment_table.h"
#include "shared_state.h"

namespace slipstream::engine {

// Pins the reclamation epoch for as long as it lives: nothing reachable from a state read
// after the pin is reused meanwhile.
class EpochPin {
 public:
  explicit EpochPin(SharedEpochs* epochs);
  ~EpochPin();
  // Declares that this reader only reads these memtable slots (a bit per slot).
  void NarrowMemtables(uint32_t mask) { slot_->memtables.store(mask); }
  EpochPin(const EpochPin&) = delete;
  EpochPin& operator=(const EpochPin&) = delete;

 private:
  ReaderSlot* slot_ = nullptr;
};

class Reclaimer {
 public:
  Reclaimer(SharedEpochs* shared, SegmentTable* segments, MemtablePool* memtables,
            SharedCounters* counters)
      : shared_(shared), segments_(segments), memtables_(memtables), counters_(counters) {}

  // Starts the epochs of a fresh arena.
  void Format();

  SharedEpochs* epochs() const { return shared_; }

  // Queues an item to be freed once every reader that might see it has left. The caller
  // holds compaction_mu, like every caller of Reclaim.
  void Retire(RetiredItem::Kind kind, uint32_t id);

  // Frees retired items older than every pinned epoch.
  void Reclaim();

 private:
  SharedEpochs* shared_;
  SegmentTable* segments_;
  MemtablePool* memtables_;
  SharedCounters* counters_;
};

}  // namespace slipstream::engine
