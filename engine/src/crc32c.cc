// CRC32C with the SSE4.2 crc32 instruction. The instruction takes three cycles to deliver its
// result but can start one every cycle, so a single chain of them runs at a third of the
// processor's pace. Buffers long enough are therefore cut into three runs whose checksums are
// computed side by side and then joined: a run's checksum is moved past the bytes that follow it
// by a table lookup (a CRC is linear, so moving it past n bytes is a fixed 32x32-bit matrix).
#include "crc32c.h"

#include <nmmintrin.h>

#include <array>
#include <cstring>

namespace slipstream::engine::crc32c {

namespace {

// Run lengths of the two interleaved tiers: long runs for node-sized buffers, short ones for
// the rest (a 1.5-kB value, the tail of a node).
constexpr size_t kLongRun = 2048;
constexpr size_t kShortRun = 256;

// Moves a raw (not inverted) checksum past `run` zero bytes: the matrix of that move, stored as
// four tables of 256 entries, one per byte of the checksum.
class Shifter {
 public:
  explicit Shifter(size_t run) {
    // Column j is where bit j of a checksum ends up after `run` zero bytes.
    std::array<uint32_t, 32> column{};
    for (int j = 0; j < 32; j++) {
      uint64_t c = uint32_t(1) << j;
      for (size_t i = 0; i < run; i += 8) c = _mm_crc32_u64(c, 0);
      column[j] = uint32_t(c);
    }
    for (int k = 0; k < 4; k++) {
      for (uint32_t b = 0; b < 256; b++) {
        uint32_t v = 0;
        for (int bit = 0; bit < 8; bit++) {
          if (b & (1u << bit)) v ^= column[8 * k + bit];
        }
        table_[k][b] = v;
      }
    }
  }

  uint32_t Shift(uint32_t crc) const {
    return table_[0][crc & 0xff] ^ table_[1][(crc >> 8) & 0xff] ^ table_[2][(crc >> 16) & 0xff] ^
           table_[3][crc >> 24];
  }

 private:
  uint32_t table_[4][256];
};

const Shifter& LongShifter() {
  static const Shifter shifter(kLongRun);
  return shifter;
}

const Shifter& ShortShifter() {
  static const Shifter shifter(kShortRun);
  return shifter;
}

uint64_t Load64(const uint8_t* p) {
  uint64_t word;
  std::memcpy(&word, p, 8);
  return word;
}

// Consumes as many groups of three runs of `run` bytes as fit, the three chains side by side.
uint64_t ThreeWay(uint64_t crc, const uint8_t** data, size_t* n, size_t run,
                  const Shifter& shifter) {
  const uint8_t* p = *data;
  while (*n >= 3 * run) {
    uint64_t c0 = crc, c1 = 0, c2 = 0;
    for (size_t i = 0; i < run; i += 8) {
      c0 = _mm_crc32_u64(c0, Load64(p + i));
      c1 = _mm_crc32_u64(c1, Load64(p + run + i));
      c2 = _mm_crc32_u64(c2, Load64(p + 2 * run + i));
    }
    crc = shifter.Shift(uint32_t(c0)) ^ uint32_t(c1);
    crc = shifter.Shift(uint32_t(crc)) ^ uint32_t(c2);
    p += 3 * run;
    *n -= 3 * run;
  }
  *data = p;
  return crc;
}

}  // namespace

// Standard CRC32C: pre- and post-inverted, so Extend(Extend(0,a),b) == Value(a+b).
uint32_t Extend(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t c = ~crc;
  if (n >= 3 * kLongRun) c = ThreeWay(c, &p, &n, kLongRun, LongShifter());
  if (n >= 3 * kShortRun) c = ThreeWay(c, &p, &n, kShortRun, ShortShifter());
  while (n >= 8) {
    c = _mm_crc32_u64(c, Load64(p));
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
