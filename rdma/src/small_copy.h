// Copies of fragments, which are often a few bytes (an int4, a date, a short field): the common
// widths get a fixed-size copy the compiler turns into one or two moves, the rest memcpy.
#pragma once

#include <cstddef>
#include <cstring>

namespace slipstream::rdma {

// Copies `length` bytes from `from` to `to` (which do not overlap).
inline void CopyFragment(char* to, const char* from, size_t length) {
  switch (length) {
    case 1:
      *to = *from;
      return;
    case 2:
      std::memcpy(to, from, 2);
      return;
    case 4:
      std::memcpy(to, from, 4);
      return;
    case 8:
      std::memcpy(to, from, 8);
      return;
    case 16:
      std::memcpy(to, from, 16);
      return;
    default:
      std::memcpy(to, from, length);
      return;
  }
}

}  // namespace slipstream::rdma
