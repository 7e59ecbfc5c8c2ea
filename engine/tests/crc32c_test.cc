// The hardware CRC32C against a bit-at-a-time reference, across the lengths where the
// interleaved runs start, end and leave tails.
#include "crc32c.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace slipstream::engine {
namespace {

// CRC32C one bit at a time (reflected polynomial 0x82F63B78), pre- and post-inverted.
uint32_t ReferenceCrc(uint32_t crc, const uint8_t* p, size_t n) {
  crc = ~crc;
  for (size_t i = 0; i < n; i++) {
    crc ^= p[i];
    for (int bit = 0; bit < 8; bit++) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(n);
  for (auto& b : bytes) b = uint8_t(rng());
  return bytes;
}

TEST(Crc32c, KnownValue) {
  const std::string digits = "123456789";
  EXPECT_EQ(crc32c::Value(digits.data(), digits.size()), 0xE3069283u);
  EXPECT_EQ(crc32c::Value(nullptr, 0), 0u);
}

TEST(Crc32c, MatchesTheReferenceAtEveryLengthAroundTheRunBoundaries) {
  const std::vector<uint8_t> bytes = RandomBytes(20000, 7);
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 1600; n++) lengths.push_back(n);  // short runs (3 x 256) and tails
  for (size_t base : {3 * 2048, 2 * 3 * 2048, 8192, 8192 - 8, 16384}) {
    for (size_t n = base - 24; n <= base + 24; n++) lengths.push_back(n);  // long runs (3 x 2048)
  }
  for (size_t n : lengths) {
    for (size_t offset : {0, 1, 5}) {  // unaligned starts too
      ASSERT_EQ(crc32c::Value(bytes.data() + offset, n), ReferenceCrc(0, bytes.data() + offset, n))
          << "length " << n << ", offset " << offset;
    }
  }
}

TEST(Crc32c, ExtendingInPiecesEqualsOnePass) {
  const std::vector<uint8_t> bytes = RandomBytes(30000, 11);
  std::mt19937 rng(3);
  for (int round = 0; round < 200; round++) {
    size_t n = rng() % bytes.size();
    size_t cut = n == 0 ? 0 : rng() % n;
    uint32_t pieces = crc32c::Extend(crc32c::Value(bytes.data(), cut), bytes.data() + cut, n - cut);
    ASSERT_EQ(pieces, ReferenceCrc(0, bytes.data(), n)) << "length " << n << ", cut at " << cut;
  }
}

}  // namespace
}  // namespace slipstream::engine
