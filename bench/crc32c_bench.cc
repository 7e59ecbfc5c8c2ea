// crc32c_bench: the engine's CRC32C (three interleaved chains of the SSE4.2 instruction, joined
// by table lookups) against one chain of the same instruction, the plain loop it replaced,
// measured in the same run over the buffer sizes the engine checksums.
//
//   build/bench/crc32c_bench [--bytes=N]   (N bytes hashed per size and variant, default 2 GB)
#include <nmmintrin.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "slipstream/engine/crc32c.h"

namespace {

// One chain: eight bytes per instruction, each waiting for the one before. Out of line, as the
// engine's function is, so that short buffers compare call for call.
__attribute__((noinline)) uint32_t OneChain(const uint8_t* p, size_t n) {
  uint64_t c = ~uint32_t(0);
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
  }
  auto c32 = uint32_t(c);
  for (; n > 0; n--) c32 = _mm_crc32_u8(c32, *p++);
  return ~c32;
}

// GB/s of `crc` over a buffer of `size` bytes, hashing about `total` bytes.
template <typename Crc>
double Rate(const std::vector<uint8_t>& buf, size_t size, double total, Crc crc, uint32_t* sink) {
  size_t iters = size_t(total / double(size)) + 1;
  auto start = std::chrono::steady_clock::now();
  uint32_t x = 0;
  for (size_t i = 0; i < iters; i++) x += crc(buf.data() + (i & 7), size);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  *sink += x;
  return double(iters) * double(size) / seconds / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  double total = 2e9;
  for (int i = 1; i < argc; i++) {
    if (std::strncmp(argv[i], "--bytes=", 8) == 0) {
      total = std::atof(argv[i] + 8);
    } else {
      std::fprintf(stderr, "usage: %s [--bytes=N]\n", argv[0]);
      return 2;
    }
  }
  std::vector<uint8_t> buf((2u << 20) + 8);
  for (size_t i = 0; i < buf.size(); i++) buf[i] = uint8_t(i * 131 + (i >> 9));
  uint32_t sink = 0;
  std::printf("%-10s %12s %12s %8s\n", "bytes", "one chain", "engine", "ratio");
  for (size_t size : {size_t(64), size_t(300), size_t(1500), size_t(8184), size_t(2) << 20}) {
    for (size_t off = 0; off < 8; off++) {  // the variants must agree before they are timed
      if (OneChain(buf.data() + off, size) !=
          slipstream::engine::crc32c::Value(buf.data() + off, size)) {
        std::fprintf(stderr, "checksums differ at %zu bytes\n", size);
        return 1;
      }
    }
    double one = Rate(buf, size, total, OneChain, &sink);
    double engine = Rate(
        buf, size, total,
        [](const uint8_t* p, size_t n) { return slipstream::engine::crc32c::Value(p, n); }, &sink);
    std::printf("%-10zu %9.2f GB/s %9.2f GB/s %7.2fx\n", size, one, engine, engine / one);
  }
  return sink == 42 ? 3 : 0;  // keeps the checksums from being optimised away
}
