// Process-shared synchronisation that can live in a shared-memory arena.
//
// Mutexes are robust: if a holder dies, the next locker takes the lock over (the engine's
// shared state is then rebuilt by the host, as PostgreSQL does after a backend crash).
#pragma once

#include <pthread.h>

#include <cstdint>

namespace slipstream::engine {

class SharedMutex {
 public:
  // Initialises the mutex in place (once, by the process that formats the arena).
  void Init();
  void Lock();
  // Takes the lock only if it is free; true if taken.
  bool TryLock();
  void Unlock();
  // BasicLockable spelling, for std::unique_lock.
  void lock() { Lock(); }
  void unlock() { Unlock(); }

 private:
  friend class SharedCondVar;
  pthread_mutex_t mu_;
};

class SharedCondVar {
 public:
  void Init();
  // Waits up to timeout_ms (the mutex is held on entry and on return).
  void WaitFor(SharedMutex* mu, int timeout_ms);
  void NotifyAll();

 private:
  pthread_cond_t cv_;
};

// RAII holder for SharedMutex; never crosses a PostgreSQL frame.
class SharedLock {
 public:
  explicit SharedLock(SharedMutex* mu) : mu_(mu) { mu_->Lock(); }
  ~SharedLock() {
    if (mu_) mu_->Unlock();
  }
  void Release() {
    mu_->Unlock();
    mu_ = nullptr;
  }
  SharedLock(const SharedLock&) = delete;
  SharedLock& operator=(const SharedLock&) = delete;

 private:
  SharedMutex* mu_;
};

}  // namespace slipstream::engine
