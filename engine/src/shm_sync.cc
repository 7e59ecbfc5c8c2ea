// Robust process-shared pthread mutexes and condition variables.
#include "shm_sync.h"

#include <cerrno>
#include <ctime>

namespace slipstream::engine {

// Sets up a robust, process-shared mutex.
void SharedMutex::Init() {
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&mu_, &attr);
  pthread_mutexattr_destroy(&attr);
}

// Locks, taking over a lock whose holder died.
void SharedMutex::Lock() {
  if (pthread_mutex_lock(&mu_) == EOWNERDEAD) pthread_mutex_consistent(&mu_);
}

bool SharedMutex::TryLock() {
  int rc = pthread_mutex_trylock(&mu_);
  if (rc == EOWNERDEAD) {
    pthread_mutex_consistent(&mu_);
    return true;
  }
  return rc == 0;
}

void SharedMutex::Unlock() {
  pthread_mutex_unlock(&mu_);
}

// Sets up a process-shared condition variable on the monotonic clock.
void SharedCondVar::Init() {
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&cv_, &attr);
  pthread_condattr_destroy(&attr);
}

// Waits until notified or the timeout passes.
void SharedCondVar::WaitFor(SharedMutex* mu, int timeout_ms) {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_sec += timeout_ms / 1000;
  ts.tv_nsec += static_cast<long>(timeout_ms % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  if (pthread_cond_timedwait(&cv_, &mu->mu_, &ts) == EOWNERDEAD) pthread_mutex_consistent(&mu->mu_);
}

void SharedCondVar::NotifyAll() {
  pthread_cond_broadcast(&cv_);
}

}  // namespace slipstream::engine
