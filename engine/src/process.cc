// CurrentPid: getpid() once per process, refreshed in the child after every fork().
#include "process.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>

namespace slipstream::engine {

namespace {

std::atomic<pid_t> cached_pid{0};

// Runs in the child of every fork(): the cached id is the parent's.
void RefreshAfterFork() {
  cached_pid.store(getpid(), std::memory_order_relaxed);
}

// Registers the fork handler once, before the first cached value is handed out.
pid_t Initialise() {
  pthread_atfork(nullptr, nullptr, RefreshAfterFork);
  pid_t pid = getpid();
  cached_pid.store(pid, std::memory_order_relaxed);
  return pid;
}

}  // namespace

pid_t CurrentPid() {
  static const bool registered = (Initialise(), true);
  (void)registered;
  return cached_pid.load(std::memory_order_relaxed);
}

}  // namespace slipstream::engine
