// CRC32C with the SSE4.2 crc32 instruction, eight bytes at a time.
#include "crc32c.h"

#include <nmmintrin.h>

#include <cstring>

namespace slipstream::engine::crc32c {

// Standard CRC32C: pre- and post-inverted, so Extend(Extend(0,a),b) == Value(a+b).
uint32_t Extend(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t c = ~crc;
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
    p += 8;
    n -= 8;
  }
  auto c32 = static_cast<uint32_t>(c);
  while (n > 0) {
    c32 = _mm_crc32_u8(c32, *p++);
    --n;
  }
  return ~c32;
}

}  // namespace slipstream::engine::crc32c
