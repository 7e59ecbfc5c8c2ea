// Blocked bloom filter: 6 probes inside a 512-bit block, derived by double hashing.
#include "bloom.h"

#include <cstring>

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

uint64_t BloomBlocksFor(uint64_t keys, uint32_t bits_per_key) {
  uint64_t blocks = (keys * bits_per_key + 511) / 512;
  return blocks ? blocks : 1;
}

BloomExtension PlanBloomExtension(uint64_t base_blocks, uint64_t base_load_keys,
                                  uint64_t total_keys, uint64_t added_keys, uint32_t bits_per_key) {
  BloomExtension e{0, base_blocks, 0, false};
  const uint64_t need = BloomBlocksFor(total_keys, bits_per_key);
  while (e.blocks < need) {
    e.shift++;
    e.blocks <<= 1;
  }
  e.load_keys = (base_load_keys << e.shift) + added_keys;
  e.within_budget = e.load_keys * bits_per_key * 4 <= e.blocks * 512 * 5;
  return e;
}

uint64_t BloomBuilder::BlockCount() const {
  return BloomBlocksFor(hashes_.size(), bits_per_key_);
}

std::string BloomBuilder::Finish() const {
  uint64_t blocks = BlockCount();
  std::string out(blocks * kBloomBlockBytes, '\0');
  for (uint64_t h : hashes_) BloomSet(out.data() + BloomBlockOf(h, blocks) * kBloomBlockBytes, h);
  return out;
}

std::string BloomBuilder::FinishOver(std::string_view base, int shift) const {
  const uint64_t blocks = (base.size() / kBloomBlockBytes) << shift;
  std::string out(blocks * kBloomBlockBytes, '\0');
  for (uint64_t b = 0; b < blocks; b++) {
    std::memcpy(out.data() + b * kBloomBlockBytes, base.data() + (b >> shift) * kBloomBlockBytes,
                kBloomBlockBytes);
  }
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
