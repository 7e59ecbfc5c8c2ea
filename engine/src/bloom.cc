// Blocked bloom filter: 6 probes inside a 512-bit block, derived by double hashing.
#include "bloom.h"

namespace slipstream::engine {

namespace {
constexpr int kProbes = 6;

// The i-th bit position (0..511) of a hash inside its block.
inline uint32_t ProbeBit(uint64_t hash, int i) {
  uint32_t h1 = uint32_t(hash);
  uint32_t h2 = uint32_t(hash >> 32) | 1;
  return (h1 + uint32_t(i) * h2) & 511;
}
}  // namespace

uint64_t BloomBuilder::BlockCount() const {
  uint64_t bits = uint64_t(hashes_.size()) * bits_per_key_;
  uint64_t blocks = (bits + 511) / 512;
  return blocks ? blocks : 1;
}

std::string BloomBuilder::Finish() const {
  uint64_t blocks = BlockCount();
  std::string out(blocks * kBloomBlockBytes, '\0');
  for (uint64_t h : hashes_) BloomSet(out.data() + BloomBlockOf(h, blocks) * kBloomBlockBytes, h);
  return out;
}

void BloomSet(char* block, uint64_t hash) {
  for (int i = 0; i < kProbes; i++) {
    uint32_t bit = ProbeBit(hash, i);
    block[bit >> 3] = char(uint8_t(block[bit >> 3]) | (1u << (bit & 7)));
  }
}

bool BloomTest(const char* block, uint64_t hash) {
  for (int i = 0; i < kProbes; i++) {
    uint32_t bit = ProbeBit(hash, i);
    if (!(uint8_t(block[bit >> 3]) & (1u << (bit & 7)))) return false;
  }
  return true;
}

}  // namespace slipstream::engine
