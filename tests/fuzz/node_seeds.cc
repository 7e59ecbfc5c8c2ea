// Seeds for node_fuzz: leaves and index nodes written by NodeBuilder, cut after their used
// bytes (the fuzz target pads a node with zeroes to a power-of-two size, as Finish pads).
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "format.h"
#include "node.h"
#include "seeds.h"

namespace slipstream::fuzz {
namespace {

using namespace engine;

constexpr uint32_t kNodeSize = 4096;

// A row key as the engine stores it: a keyspace prefix and a decimal row id.
std::string RowKey(KeyspaceId ks, int row) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%08d", row);
  return MakeInternalKey(ks, buf);
}

// Finishes the builder's node and keeps its used bytes.
std::string Finish(NodeBuilder* b, uint16_t height, uint32_t tree_id) {
  std::string node(kNodeSize, '\0');
  b->Finish(node.data(), height, tree_id);
  NodeHeader h;
  std::memcpy(&h, node.data(), sizeof(h));
  node.resize(h.used);
  return node;
}

// A leaf of `count` entries cycling through every value kind (patches with a header's prefix),
// values of `value_size` bytes.
std::string Leaf(int count, size_t value_size) {
  NodeBuilder b(kNodeSize, /*leaf=*/true);
  for (int i = 0; i < count; i++) {
    std::string key = RowKey(1, 2 * i);
    std::string value(value_size + size_t(i % 3), char('a' + i % 26));
    ValueKind kind = ValueKind(1 + i % 5);
    if (kind == ValueKind::kLargePatch) value.resize(std::min<size_t>(value.size(), 23));
    LeafEntry e{key, kind, value, ValuePtr{{uint32_t(10 + i), uint32_t(64 + 100 * i)}, 1200, 4000},
                i % 2 == 0};
    if (!b.Fits(NodeBuilder::LeafEntrySize(e))) break;
    b.AddLeaf(e);
  }
  return Finish(&b, 0, 7);
}

// An index node of `count` children at `height`.
std::string Index(int count, uint16_t height) {
  NodeBuilder b(kNodeSize, /*leaf=*/false);
  for (int i = 0; i < count; i++) {
    std::string key = RowKey(1, 100 * i);
    if (!b.Fits(NodeBuilder::IndexEntrySize(key))) break;
    b.AddIndex(key, DevPtr{3, uint32_t(i) * kNodeSize});
  }
  return Finish(&b, height, 7);
}

// Leaves with one entry, a few, and full; index nodes small and large.
std::vector<Seed> NodeSeeds() {
  return {
      {"leaf_one", Leaf(1, 5)},
      {"leaf_kinds", Leaf(8, 20)},
      {"leaf_medium_values", Leaf(6, 200)},
      {"leaf_full", Leaf(1000, 3)},
      {"index_two", Index(2, 1)},
      {"index_full", Index(1000, 2)},
  };
}

}  // namespace
SLIPSTREAM_FUZZ_SEEDS(node, NodeSeeds);
}  // namespace slipstream::fuzz
