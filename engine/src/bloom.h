// A cache-line-blocked bloom filter: each key sets and tests bits in one 64-byte block, so a
// lookup costs one cache miss per level.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
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
  // The filter of the added keys over the older filter `base` (whole blocks), without base's
  // keys: each of base's blocks is copied 2^shift times, as a hash of base's block b lands in
  // one of those copies (BloomBlockOf of 2^shift times as many blocks). The copies keep base's
  // load of bits per block, so the new filter's false-positive rate is that of base's load
  // plus the added keys' (BloomExtension says how much that is).
  std::string FinishOver(std::string_view base, int shift) const;

 private:
  uint32_t bits_per_key_;
  std::vector<uint64_t> hashes_;
};

// Blocks of a filter built for `keys` keys at `bits_per_key` (at least one).
uint64_t BloomBlocksFor(uint64_t keys, uint32_t bits_per_key);

// How an older filter is extended for a tree that keeps part of the older tree's keys.
// Its load, counted in keys: a filter of `blocks` blocks whose bits are as dense as those of
// `load_keys` keys would make them (for a filter built from its keys: their number).
struct BloomExtension {
  int shift;           // the older filter's blocks are copied 2^shift times
  uint64_t blocks;     // blocks of the new filter
  uint64_t load_keys;  // the new filter's load
  bool within_budget;  // the load is at most 1.25 times what `blocks` are built for
};
// For an older filter of `base_blocks` and `base_load_keys`, a tree of `total_keys` keys of
// which `added_keys` are hashed into the new filter: the fewest copies that give the tree's
// keys enough blocks. Copies do not thin out the older bits (each copy has all of them), so
// the load only grows; past the budget the filter is to be built from every key again.
BloomExtension PlanBloomExtension(uint64_t base_blocks, uint64_t base_load_keys,
                                  uint64_t total_keys, uint64_t added_keys, uint32_t bits_per_key);

// Which block a hash lands in.
inline uint64_t BloomBlockOf(uint64_t hash, uint64_t blocks) {
  return uint64_t((__uint128_t(hash) * blocks) >> 64);
}

// Sets (build) or tests (lookup) a hash's bits inside its block.
void BloomSet(char* block, uint64_t hash);
bool BloomTest(const char* block, uint64_t hash);

}  // namespace slipstream::engine
