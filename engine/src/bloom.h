// A cache-line-blocked bloom filter: each key sets and tests bits in one 64-byte block, so a
// lookup costs one cache miss per level.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace slipstream::engine {

constexpr uint32_t kBloomBlockBytes = 64;

class BloomBuilder {
 public:
  explicit BloomBuilder(uint32_t bits_per_key) : bits_per_key_(bits_per_key) {}
  void AddHash(uint64_t hash) { hashes_.push_back(hash); }
  size_t count() const { return hashes_.size(); }
  // Blocks needed for the keys added so far (at least one).
  uint64_t BlockCount() const;
  // Serialises BlockCount() blocks.
  std::string Finish() const;

 private:
  uint32_t bits_per_key_;
  std::vector<uint64_t> hashes_;
};

// Which block a hash lands in.
inline uint64_t BloomBlockOf(uint64_t hash, uint64_t blocks) {
  return uint64_t((__uint128_t(hash) * blocks) >> 64);
}

// Sets (build) or tests (lookup) a hash's bits inside its block.
void BloomSet(char* block, uint64_t hash);
bool BloomTest(const char* block, uint64_t hash);

}  // namespace slipstream::engine
