// Seeds for tree_fuzz: trees of height 0, 1 and 2 written by TreeBuilder (leaves, index layers,
// bloom segment and directory) into the segments tree_fuzz.cc reads them from, each after the
// LevelDesc TreeBuilder::Finish gave it.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "btree.h"
#include "format.h"
#include "seeds.h"

namespace slipstream::fuzz {
namespace {

using namespace engine;

// The geometry and segments of tree_fuzz.cc.
constexpr uint32_t kNodeSize = 512;
constexpr uint32_t kSegmentSize = 8192;
constexpr uint32_t kTreeId = 7;
constexpr uint32_t kIndexSegment = 1;
constexpr uint32_t kBloomSegment = 2;

// Collects what TreeBuilder writes: the index segment then the bloom segment's used bytes.
class Sink : public SegmentSink {
 public:
  // Starts with a zeroed index segment.
  Sink() : index_(kSegmentSize, '\0') {}
  // Hands out the one index and the one bloom segment tree_fuzz.cc has.
  Status NewSegment(SegmentKind kind, uint32_t* segment) override {
    if (kind == SegmentKind::kIndex && !index_taken_) {
      index_taken_ = true;
      *segment = kIndexSegment;
    } else if (kind == SegmentKind::kBloom && bloom_.empty()) {
      *segment = kBloomSegment;
    } else {
      return Status::InvalidArgument("the seed tree needs more segments than tree_fuzz has");
    }
    return Status::OK();
  }
  // Keeps what the builder writes to either segment.
  Status WriteSegment(uint32_t segment, const char* data, uint32_t length) override {
    if (segment == kIndexSegment) {
      std::memcpy(index_.data(), data, length);
    } else {
      bloom_.assign(data, length);
    }
    return Status::OK();
  }
  // The index segment whole, then the bloom segment's used bytes.
  std::string Image() const { return index_ + bloom_; }

 private:
  std::string index_;
  std::string bloom_;
  bool index_taken_ = false;
};

// A tree of `count` rows whose keys are padded to `key_size` bytes, with every value kind.
Seed Make(const char* name, int count, size_t key_size) {
  Sink sink;
  TreeBuilder builder(TreeShape{kNodeSize, kSegmentSize, 10, 64, 1000}, &sink, kTreeId);
  for (int i = 0; i < count; i++) {
    char row[16];
    std::snprintf(row, sizeof(row), "%08d", 3 * i);
    std::string key = MakeInternalKey(1, std::string(row) + std::string(key_size, 'k'));
    std::string value(size_t(i % 5), char('a' + i % 26));
    LeafEntry e{key, ValueKind(1 + i % 4), value, ValuePtr{{4, uint32_t(64 + 50 * i)}, 1200, 4000}};
    if (!builder.Add(e).ok()) std::abort();
  }
  LevelDesc desc{};
  if (Status s = builder.Finish(&desc); !s.ok()) {
    std::fprintf(stderr, "tree seed %s: %s\n", name, s.ToString().c_str());
    std::abort();
  }
  std::string seed(reinterpret_cast<const char*>(&desc), sizeof(desc));
  return Seed{name, seed + sink.Image()};
}

// A root leaf, a tree of one index layer, and one of two.
std::vector<Seed> TreeSeeds() {
  return {
      Make("leaf_root", 5, 2),
      Make("height1", 40, 8),
      Make("height2", 75, 30),
  };
}

}  // namespace
SLIPSTREAM_FUZZ_SEEDS(tree, TreeSeeds);
}  // namespace slipstream::fuzz
