// CompareKeys orders keys exactly as std::string_view::compare does (unsigned bytes, a prefix
// first), across the eight-byte steps and the tail.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "format.h"

namespace slipstream::engine {
namespace {

int Sign(int v) {
  return v < 0 ? -1 : v > 0 ? 1 : 0;
}

TEST(CompareKeys, MatchesStringCompareOnRandomKeys) {
  std::mt19937 rng(42);
  for (int round = 0; round < 200000; round++) {
    size_t la = rng() % 20, lb = rng() % 20;
    std::string a(la, '\0'), b(lb, '\0');
    // Few distinct byte values, so that common prefixes of every length occur.
    for (auto& c : a) c = static_cast<char>("\x00\x01\x7f\x80\xff"[rng() % 5]);
    for (size_t i = 0; i < lb; i++)
      b[i] =
          (i < la && rng() % 4 != 0) ? a[i] : static_cast<char>("\x00\x01\x7f\x80\xff"[rng() % 5]);
    ASSERT_EQ(CompareKeys(a, b), Sign(std::string_view(a).compare(b)))
        << "round " << round << " sizes " << la << " " << lb;
  }
}

TEST(CompareKeys, BigEndianRowIdsOrderNumerically) {
  auto key = [](uint64_t v) {
    std::string k(8, '\0');
    for (int i = 0; i < 8; i++) k[i] = static_cast<char>(v >> (56 - 8 * i));
    return k;
  };
  EXPECT_LT(CompareKeys(key(255), key(256)), 0);
  EXPECT_GT(CompareKeys(key(uint64_t(1) << 63), key(1)), 0);
  EXPECT_EQ(CompareKeys(key(77), key(77)), 0);
  EXPECT_LT(CompareKeys(key(5), key(5) + "x"), 0);
}

}  // namespace
}  // namespace slipstream::engine
