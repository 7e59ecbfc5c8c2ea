// Blocked bloom filter: no false negatives, a bounded false-positive rate, block selection in
// range and reasonably even, and the key hash's sensitivity.
#include "bloom.h"

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>
#include <vector>

#include "coding.h"

namespace slipstream::engine {
namespace {

std::string PresentKey(int i) {
  return "user-key-" + std::to_string(i);
}
std::string AbsentKey(int i) {
  return "absent-" + std::to_string(i) + "-x";
}

// Builds a filter over keys [0, n) and returns its bytes.
std::string BuildFilter(int n, uint32_t bits_per_key, uint64_t* blocks) {
  BloomBuilder b(bits_per_key);
  for (int i = 0; i < n; i++) b.AddHash(HashKey(PresentKey(i)));
  EXPECT_EQ(b.count(), size_t(n));
  *blocks = b.BlockCount();
  std::string filter = b.Finish();
  EXPECT_EQ(filter.size(), *blocks * kBloomBlockBytes);
  return filter;
}

bool MayContain(const std::string& filter, uint64_t blocks, std::string_view key) {
  uint64_t h = HashKey(key);
  return BloomTest(filter.data() + BloomBlockOf(h, blocks) * kBloomBlockBytes, h);
}

// Every added key tests positive (no false negatives) for 100k keys.
TEST(Bloom, NoFalseNegatives) {
  uint64_t blocks;
  std::string filter = BuildFilter(100000, 10, &blocks);
  EXPECT_EQ(blocks, (100000ull * 10 + 511) / 512);
  for (int i = 0; i < 100000; i++) ASSERT_TRUE(MayContain(filter, blocks, PresentKey(i))) << i;
}

// At 10 bits per key, fewer than 3% of 100k absent keys test positive; fewer bits, more
// false positives.
TEST(Bloom, FalsePositiveRateIsBounded) {
  uint64_t blocks;
  std::string filter = BuildFilter(100000, 10, &blocks);
  int fp = 0;
  for (int i = 0; i < 100000; i++) fp += MayContain(filter, blocks, AbsentKey(i));
  double rate = fp / 100000.0;
  EXPECT_LT(rate, 0.03) << fp;
  EXPECT_GT(fp, 0);  // a 10-bit filter is not perfect: the probe must be doing something

  uint64_t small_blocks;
  std::string small = BuildFilter(100000, 4, &small_blocks);
  int fp4 = 0;
  for (int i = 0; i < 100000; i++) fp4 += MayContain(small, small_blocks, AbsentKey(i));
  EXPECT_GT(fp4, fp);
}

// A filter extended over an older one (a compaction that kept leaves) grows by powers of two
// and admits every key of both; within its budget (load at most 1.25 times what the blocks are
// built for), the false-positive rate stays under 4% at 10 bits per key (1.7% built fresh).
TEST(Bloom, AFilterExtendedOverAnOlderOneKeepsEveryKeyWithinItsBudget) {
  uint64_t base_blocks;
  std::string base = BuildFilter(30000, 10, &base_blocks);
  for (int added : {0, 1000, 10000, 30000, 250000}) {
    BloomBuilder b(10);
    for (int i = 0; i < added; i++) b.AddHash(HashKey(PresentKey(1000000 + i)));
    BloomExtension plan = PlanBloomExtension(base_blocks, 30000, 30000 + added, added, 10);
    std::string filter = b.FinishOver(base, plan.shift);
    uint64_t blocks = filter.size() / kBloomBlockBytes;
    ASSERT_EQ(blocks, plan.blocks);
    EXPECT_EQ(blocks, base_blocks << plan.shift);
    EXPECT_GE(blocks, BloomBlocksFor(30000 + added, 10)) << added;
    EXPECT_LT(blocks, 2 * BloomBlocksFor(30000 + added, 10)) << added;
    for (int i = 0; i < 30000; i++) ASSERT_TRUE(MayContain(filter, blocks, PresentKey(i))) << i;
    for (int i = 0; i < added; i++) {
      ASSERT_TRUE(MayContain(filter, blocks, PresentKey(1000000 + i))) << i;
    }
    int fp = 0;
    for (int i = 0; i < 100000; i++) fp += MayContain(filter, blocks, AbsentKey(i));
    EXPECT_EQ(plan.within_budget, added <= 10000) << added;
    if (plan.within_budget) EXPECT_LT(fp, 4000) << added;
  }
}

// An empty filter has one all-zero block and rejects everything.
TEST(Bloom, EmptyFilterRejectsEverything) {
  BloomBuilder b(10);
  EXPECT_EQ(b.BlockCount(), 1u);
  std::string filter = b.Finish();
  ASSERT_EQ(filter.size(), kBloomBlockBytes);
  for (char c : filter) EXPECT_EQ(c, 0);
  for (int i = 0; i < 1000; i++) EXPECT_FALSE(MayContain(filter, 1, PresentKey(i)));
}

// One key sets at most 6 bits, all inside its own block; testing it afterwards succeeds.
TEST(Bloom, SetTouchesOnlyItsBlock) {
  std::mt19937_64 rng(21);
  for (int trial = 0; trial < 1000; trial++) {
    char blocks[3 * kBloomBlockBytes] = {};
    uint64_t h = rng();
    BloomSet(blocks + kBloomBlockBytes, h);
    int bits = 0;
    for (size_t i = 0; i < sizeof(blocks); i++) {
      if (i < kBloomBlockBytes || i >= 2 * kBloomBlockBytes) {
        ASSERT_EQ(blocks[i], 0) << i;
      }
      bits += __builtin_popcount(uint8_t(blocks[i]));
    }
    EXPECT_GE(bits, 1);
    EXPECT_LE(bits, 6);
    EXPECT_TRUE(BloomTest(blocks + kBloomBlockBytes, h));
  }
}

// BloomBlockOf maps every hash into [0, blocks), extremes included, and spreads keys evenly.
TEST(Bloom, BlockOfStaysInRangeAndSpreads) {
  std::mt19937_64 rng(22);
  for (uint64_t blocks : {1ull, 2ull, 3ull, 1000ull, 1953ull, (1ull << 40) + 7, ~0ull}) {
    EXPECT_EQ(BloomBlockOf(0, blocks), 0u);
    EXPECT_EQ(BloomBlockOf(~0ull, blocks), blocks - 1);
    for (int i = 0; i < 10000; i++) ASSERT_LT(BloomBlockOf(rng(), blocks), blocks);
  }
  // 200k keys over 1000 blocks: every block gets a share near the mean of 200.
  std::vector<int> load(1000);
  for (int i = 0; i < 200000; i++) load[BloomBlockOf(HashKey(PresentKey(i)), 1000)]++;
  for (int b = 0; b < 1000; b++) {
    EXPECT_GT(load[b], 100) << b;
    EXPECT_LT(load[b], 300) << b;
  }
}

// HashKey is sensitive to every byte and to length (trailing zero bytes included).
TEST(Bloom, HashKeyDistinguishesKeys) {
  std::set<uint64_t> seen;
  std::string base(20, '\0');
  seen.insert(HashKey(""));
  for (size_t len = 1; len <= base.size(); len++) {
    ASSERT_TRUE(seen.insert(HashKey(std::string_view(base.data(), len))).second) << len;
  }
  std::string key = "0123456789abcdefXYZ";
  uint64_t h = HashKey(key);
  for (size_t i = 0; i < key.size(); i++) {
    for (int bit = 0; bit < 8; bit++) {
      std::string k = key;
      k[i] = char(k[i] ^ (1 << bit));
      EXPECT_NE(HashKey(k), h) << i << " " << bit;
    }
  }
}

// HashKey is part of the on-device format (bloom filters are persisted): its values are pinned
// so that an accidental change to the function is caught.
TEST(Bloom, HashKeyIsStable) {
  EXPECT_EQ(HashKey(""), 0x1006cc9a3fec0d7eull);
  EXPECT_EQ(HashKey("abc"), 0x78886a7108057be8ull);
  EXPECT_EQ(HashKey("0123456789abcdefXYZ"), 0x464e78e839e36e86ull);
}

}  // namespace
}  // namespace slipstream::engine
