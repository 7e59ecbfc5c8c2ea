// BackgroundSignal: wakes the background worker, and lets stalled writers and waiting flushers
// sleep until something changes, across processes (a mutex and a condition variable in the
// arena).
#pragma once

#include <atomic>

#include "shm_sync.h"

namespace slipstream::engine {

class BackgroundSignal {
 public:
  BackgroundSignal(SharedMutex* mu, SharedCondVar* cv, std::atomic<uint32_t>* pending)
      : mu_(mu), cv_(cv), pending_(pending) {}

  // Initialises the shared primitives of a fresh arena.
  void Format();

  // Marks background work pending and wakes every waiter.
  void Wake();

  // Wakes every waiter without marking work pending: progress (a flush, an installed
  // compaction) that stalled writers may be waiting for.
  void NotifyProgress();

  // Sleeps up to timeout_ms unless work is pending; then clears the mark (the worker's wait).
  void WaitForWork(int timeout_ms);

  // Marks work pending and sleeps up to timeout_ms for progress (a stalled writer's wait).
  void WakeAndWait(int timeout_ms);

 private:
  SharedMutex* mu_;
  SharedCondVar* cv_;
  std::atomic<uint32_t>* pending_;
};

}  // namespace slipstream::engine
