// A clock every process agrees on (CLOCK_MONOTONIC), for times stored in shared memory.
#pragma once

#include <time.h>

#include <cstdint>

namespace slipstream::engine {

inline uint64_t NowMicros() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000u + uint64_t(ts.tv_nsec) / 1000u;
}

}  // namespace slipstream::engine
