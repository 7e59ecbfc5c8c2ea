#include "value_compression.h"

#include <gtest/gtest.h>
#include <lz4.h>

#include <random>
#include <string>
#include <thread>
#include <vector>

namespace slipstream::engine {
namespace {

// Compresses `value` with CompressValue and decodes the block alone; returns the decoded bytes.
std::string RoundTrip(const std::string& value, int* compressed_size = nullptr) {
  std::string block(size_t(LZ4_compressBound(int(value.size()))), '\0');
  int n = CompressValue(value.data(), value.size(), block.data(), block.size(), 4);
  EXPECT_GT(n, 0);
  if (compressed_size != nullptr) *compressed_size = n;
  std::string out(value.size(), '\0');
  int m = LZ4_decompress_safe(block.data(), out.data(), n, int(out.size()));
  EXPECT_EQ(m, int(value.size()));
  return out;
}

// Text LZ4 can shrink: `words` picked from a small vocabulary.
std::string Text(std::mt19937_64* rng, size_t size) {
  static const char* const kWords[] = {"slipstream ", "replica ", "segment ", "leaf ", "log "};
  std::string s;
  while (s.size() < size) s += kWords[(*rng)() % 5];
  s.resize(size);
  return s;
}

TEST(ValueCompression, EachBlockDecodesAloneAfterSimilarValues) {
  // The same and near-same values one after another: a block that referred to the previous
  // value (as a streaming compressor may) would not decode on its own.
  std::mt19937_64 rng(11);
  std::string first = Text(&rng, 1500);
  int first_size = 0;
  EXPECT_EQ(RoundTrip(first, &first_size), first);
  EXPECT_LT(first_size, 1500);
  for (int i = 0; i < 200; i++) {
    std::string value = first;
    value[size_t(i) % value.size()] = char('A' + i % 26);
    if (i % 3 == 0) value = Text(&rng, 1000 + size_t(rng() % 3000));
    ASSERT_EQ(RoundTrip(value), value) << "value " << i;
  }
}

TEST(ValueCompression, IncompressibleAndTinyOutput) {
  std::mt19937_64 rng(12);
  std::string random(4096, '\0');
  for (char& c : random) c = char(rng());
  EXPECT_EQ(RoundTrip(random), random);
  // Too little room for the block: 0, not a partial block.
  std::string text = Text(&rng, 2000);
  char small[16];
  EXPECT_EQ(CompressValue(text.data(), text.size(), small, sizeof(small), 4), 0);
  // And the stream is still usable afterwards.
  EXPECT_EQ(RoundTrip(text), text);
}

TEST(ValueCompression, ThreadsKeepTheirOwnStreams) {
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; t++) {
    threads.emplace_back([t, &failures] {
      std::mt19937_64 rng(100 + uint64_t(t));
      for (int i = 0; i < 300; i++) {
        std::string value = Text(&rng, 1000 + size_t(rng() % 2000));
        std::string block(size_t(LZ4_compressBound(int(value.size()))), '\0');
        int n = CompressValue(value.data(), value.size(), block.data(), block.size(), 1);
        std::string out(value.size(), '\0');
        if (n <= 0 ||
            LZ4_decompress_safe(block.data(), out.data(), n, int(out.size())) !=
                int(value.size()) ||
            out != value)
          failures[size_t(t)]++;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; t++) EXPECT_EQ(failures[size_t(t)], 0) << "thread " << t;
}

}  // namespace
}  // namespace slipstream::engine
