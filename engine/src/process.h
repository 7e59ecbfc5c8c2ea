// The calling process's id without a system call per use (glibc no longer caches getpid):
// epoch pins and per-thread rings ask for it on every read and write.
#pragma once

#include <sys/types.h>

namespace slipstream::engine {

// This process's id; correct in fork()ed children too (refreshed by an atfork handler).
pid_t CurrentPid();

}  // namespace slipstream::engine
