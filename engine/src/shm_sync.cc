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

namespace {

// Tries of a lock before a locker sleeps, and pauses between tries: about 30 us in all.
constexpr int kSpinTries = 64;
constexpr int kPausesPerTry = 32;

// Tells the processor that this is a spin-wait loop.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

// Locks, taking over a lock whose holder died. The engine's critical sections (a batch's
// memtable inserts, a log append) take microseconds, while a locker that sleeps on the futex
// is woken tens of microseconds after the unlock and costs both processes a context switch;
// so a locker first spins a little while the holder, on another core, finishes.
void SharedMutex::Lock() {
  for (int i = 0; i < kSpinTries; i++) {
    if (TryLock()) return;
    for (int j = 0; j < kPausesPerTry; j++) CpuRelax();
  }
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
