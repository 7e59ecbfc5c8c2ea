// Epoch pins and the Reclaimer: see reclaim.h.
#include "reclaim.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <functional>
#include <thread>

#include "process.h"

namespace slipstream::engine {

namespace {

// The first reader slot this thread tries: spread by pid and thread, and computed once per
// thread and process (a pin is taken for every read; a forked child gets its own pid).
int StartSlot(pid_t pid) {
  thread_local pid_t start_pid = 0;
  thread_local int start = 0;
  if (start_pid != pid) {
    start = int((uint32_t(pid) * 2654435761u +
                 uint32_t(std::hash<std::thread::id>()(std::this_thread::get_id()))) %
                kMaxReaders);
    start_pid = pid;
  }
  return start;
}

}  // namespace

// Claims a free reader slot, starting at a spot spread by pid and thread.
EpochPin::EpochPin(SharedEpochs* s) {
  pid_t pid = CurrentPid();
  uint64_t word = ReaderSlot::Pack(s->epoch.load(), pid);
  int start = StartSlot(pid);
  while (true) {
    for (int i = 0; i < kMaxReaders; i++) {
      ReaderSlot* slot = &s->readers[(start + i) % kMaxReaders];
      uint64_t zero = 0;
      if (slot->word.load(std::memory_order_relaxed) == 0 &&
          slot->word.compare_exchange_strong(zero, word)) {
        slot_ = slot;
        return;
      }
    }
    std::this_thread::yield();  // all slots busy: wait for a reader to leave
  }
}

EpochPin::~EpochPin() {
  if (slot_) {
    slot_->memtables.store(ReaderSlot::kAllMemtables);  // a free slot claims all, see Reclaim
    slot_->word.store(0);
  }
}

void Reclaimer::Format() {
  shared_->epoch.store(1);
  for (auto& slot : shared_->readers) slot.memtables.store(ReaderSlot::kAllMemtables);
}

void Reclaimer::Retire(RetiredItem::Kind kind, uint32_t id) {
  if (shared_->retired_count == kRetireSlots) Reclaim();
  if (shared_->retired_count == kRetireSlots) return;  // leaked until restart; never freed early
  shared_->retired[shared_->retired_count++] = RetiredItem{kind, id, shared_->epoch.fetch_add(1)};
}

void Reclaimer::Reclaim() {
  uint64_t min_epoch = UINT64_MAX;
  uint64_t min_epoch_of_memtable[kMaxMemtables];
  std::fill(std::begin(min_epoch_of_memtable), std::end(min_epoch_of_memtable), UINT64_MAX);
  for (auto& slot : shared_->readers) {
    uint64_t word = slot.word.load();
    if (word == 0) continue;
    int pid = ReaderSlot::PidOf(word);
    if (pid != CurrentPid() && kill(pid, 0) != 0 && errno == ESRCH) {
      slot.memtables.store(ReaderSlot::kAllMemtables);
      slot.word.compare_exchange_strong(word, 0);  // its process died while reading
      continue;
    }
    uint64_t epoch = ReaderSlot::EpochOf(word);
    min_epoch = std::min(min_epoch, epoch);
    uint32_t mask = slot.memtables.load();
    for (int m = 0; m < kMaxMemtables; m++) {
      if (mask & (1u << m)) min_epoch_of_memtable[m] = std::min(min_epoch_of_memtable[m], epoch);
    }
  }
  uint32_t kept = 0;
  for (uint32_t i = 0; i < shared_->retired_count; i++) {
    RetiredItem item = shared_->retired[i];
    uint64_t limit =
        item.kind == RetiredItem::kMemtable ? min_epoch_of_memtable[item.id] : min_epoch;
    if (item.epoch >= limit) {
      shared_->retired[kept++] = item;
      continue;
    }
    if (item.kind == RetiredItem::kMemtable) {
      memtables_->Release(int(item.id));
    } else if (item.kind == RetiredItem::kTree) {
      segments_->FreeTree(item.id);
    } else {
      counters_->gc_reclaimed_bytes += segments_->Free(item.id);
    }
  }
  shared_->retired_count = kept;
}

}  // namespace slipstream::engine
