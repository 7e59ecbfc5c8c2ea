// B+-tree node format: NodeBuilder encoding, NodeView decoding and search, and the bounds and
// checksum checks that keep a damaged node from being followed.
#include "node.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "crc32c.h"

namespace slipstream::engine {
namespace {

constexpr uint32_t kNodeSize = 4096;

struct Expected {
  std::string key;
  ValueKind kind;
  std::string value;  // kInline
  ValuePtr ptr;       // kMediumPtr, kLargePtr
};

std::string KeyOf(int i) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "key%06d", i);
  return buf;
}

// A leaf with every entry kind, keys key000000, key000002, ... (even numbers only).
std::vector<Expected> MakeLeaf(std::vector<char>* node, uint32_t tree_id, size_t max_entries) {
  NodeBuilder b(kNodeSize, /*leaf=*/true);
  std::vector<Expected> want;
  std::mt19937 rng(11);
  for (size_t i = 0; i < max_entries; i++) {
    Expected e;
    e.key = KeyOf(int(2 * i));
    e.kind = static_cast<ValueKind>(1 + i % 4);
    if (e.kind == ValueKind::kInline) {
      // Sizes across the one- and two-byte varint boundary.
      size_t len = (i % 8 == 0) ? 0 : (i % 8 == 4 ? 130 + rng() % 40 : rng() % 20);
      for (size_t j = 0; j < len; j++) e.value.push_back(char('a' + (i + j) % 26));
    } else if (e.kind != ValueKind::kTombstone) {
      e.ptr = ValuePtr{{uint32_t(rng()), uint32_t(rng())}, uint32_t(rng()), uint32_t(rng())};
    }
    LeafEntry le{e.key, e.kind, e.value, e.ptr};
    if (!b.Fits(NodeBuilder::LeafEntrySize(le))) break;
    b.AddLeaf(le);
    want.push_back(e);
  }
  EXPECT_EQ(b.count(), want.size());
  node->assign(kNodeSize, char(0x5a));  // Finish must overwrite (and zero-pad) everything
  b.Finish(node->data(), 0, tree_id);
  EXPECT_TRUE(b.empty());
  return want;
}

uint32_t UsedOf(const std::vector<char>& node) {
  NodeHeader h;
  std::memcpy(&h, node.data(), sizeof(h));
  return h.used;
}

// Recomputes the CRC after a deliberate patch, so that only the structural checks can object.
void FixCrc(std::vector<char>* node) {
  NodeHeader h;
  std::memcpy(&h, node->data(), sizeof(h));
  h.crc = crc32c::Value(node->data() + 8, h.used - 8);
  std::memcpy(node->data(), &h, sizeof(h));
}

template <typename T>
void Patch(std::vector<char>* node, size_t offset, T value) {
  std::memcpy(node->data() + offset, &value, sizeof(T));
}

// A leaf decodes to exactly the entries added, of every kind, with its header fields.
TEST(NodeLeaf, RoundTripsEveryEntryKind) {
  std::vector<char> node;
  std::vector<Expected> want = MakeLeaf(&node, 77, 10000);
  ASSERT_GT(want.size(), 50u);
  NodeView v;
  Status s = NodeView::Open(node.data(), kNodeSize, true, &v);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(v.is_leaf());
  EXPECT_EQ(v.height(), 0);
  EXPECT_EQ(v.tree_id(), 77u);
  ASSERT_EQ(v.count(), want.size());
  for (size_t i = 0; i < want.size(); i++) {
    LeafEntry e;
    s = v.Leaf(int(i), &e);
    ASSERT_TRUE(s.ok()) << i << " " << s.ToString();
    EXPECT_EQ(e.key, want[i].key);
    ASSERT_EQ(e.kind, want[i].kind) << i;
    if (e.kind == ValueKind::kInline) {
      EXPECT_EQ(e.inline_value, want[i].value) << i;
    } else if (e.kind != ValueKind::kTombstone) {
      EXPECT_EQ(e.ptr.where, want[i].ptr.where) << i;
      EXPECT_EQ(e.ptr.record_bytes, want[i].ptr.record_bytes) << i;
      EXPECT_EQ(e.ptr.value_size, want[i].ptr.value_size) << i;
    }
    std::string_view k;
    ASSERT_TRUE(v.KeyAt(int(i), &k).ok());
    EXPECT_EQ(k, want[i].key);
  }
  // The builder fills the node: one more minimal entry would not have fitted.
  uint32_t used = UsedOf(node);
  EXPECT_LE(used, kNodeSize);
  EXPECT_GT(used, kNodeSize - 200);
  // Zero padding after `used`.
  for (uint32_t i = used; i < kNodeSize; i++) ASSERT_EQ(node[i], 0) << i;
}

// LeafEntrySize is exactly the bytes an entry adds (besides its 2-byte offset).
TEST(NodeLeaf, EntrySizeMatchesEncoding) {
  const std::string long_key(200, 'k'), long_value(300, 'v');
  std::vector<LeafEntry> entries = {
      {"a", ValueKind::kInline, "", {}},
      {long_key, ValueKind::kInline, long_value, {}},
      {"m", ValueKind::kMediumPtr, {}, ValuePtr{{1, 2}, 3, 4}},
      {"t", ValueKind::kTombstone, {}, {}},
  };
  for (const LeafEntry& e : entries) {
    NodeBuilder b(kNodeSize, true);
    b.AddLeaf(e);
    std::vector<char> node(kNodeSize);
    b.Finish(node.data(), 0, 1);
    EXPECT_EQ(UsedOf(node), kNodeHeaderSize + 2 + NodeBuilder::LeafEntrySize(e));
  }
}

// LowerBound finds present keys, the successor of absent ones, 0 before the first and count()
// after the last.
TEST(NodeLeaf, LowerBoundPresentAbsentAndEnds) {
  std::vector<char> node;
  std::vector<Expected> want = MakeLeaf(&node, 1, 10000);
  NodeView v;
  ASSERT_TRUE(NodeView::Open(node.data(), kNodeSize, true, &v).ok());
  const int n = int(want.size());
  for (int i = 0; i < n; i++) {
    int idx = -1;
    ASSERT_TRUE(v.LowerBound(KeyOf(2 * i), &idx).ok());
    EXPECT_EQ(idx, i) << "present " << KeyOf(2 * i);
    ASSERT_TRUE(v.LowerBound(KeyOf(2 * i + 1), &idx).ok());
    EXPECT_EQ(idx, i + 1) << "absent " << KeyOf(2 * i + 1);
    // A proper prefix of a key orders before it.
    ASSERT_TRUE(v.LowerBound(KeyOf(2 * i).substr(0, 8), &idx).ok());
    EXPECT_LE(idx, i);
  }
  int idx = -1;
  ASSERT_TRUE(v.LowerBound("", &idx).ok());
  EXPECT_EQ(idx, 0);
  ASSERT_TRUE(v.LowerBound("a", &idx).ok());
  EXPECT_EQ(idx, 0);
  ASSERT_TRUE(v.LowerBound("zzz", &idx).ok());
  EXPECT_EQ(idx, n);
  ASSERT_TRUE(v.LowerBound(want.back().key + '\0', &idx).ok());
  EXPECT_EQ(idx, n);
}

// The interpolating search against a plain bisection over the same keys, for keys spread
// evenly (dense row ids, as the table AM writes them), with gaps and clusters, of random
// bytes and lengths, and prefixes of each other; for every key, the points between them and
// both ends, in leaves and index nodes.
TEST(NodeLeaf, LowerBoundMatchesBisectionForEveryKeySpread) {
  std::mt19937_64 rng(99);
  auto big_endian = [](uint64_t n) {
    std::string k(12, '\0');
    k[0] = 'T';
    for (int b = 0; b < 8; b++) k[4 + b] = char(n >> (56 - 8 * b));
    return k;
  };
  for (int shape = 0; shape < 6; shape++) {
    for (bool leaf : {true, false}) {
      std::set<std::string> keys;
      uint64_t base = rng() >> (shape * 8);
      for (int i = 0; keys.size() < 600 && i < 5000; i++) {
        switch (shape) {
          case 0:
            keys.insert(big_endian(base + uint64_t(i)));
            break;  // dense
          case 1:
            keys.insert(big_endian(base + uint64_t(i) * (1 + rng() % 3)));
            break;
          case 2:
            keys.insert(big_endian(i < 300 ? base + i : base + (1ull << 40) + i));
            break;
          case 3: {  // random bytes, random lengths
            std::string k(1 + rng() % 20, '\0');
            for (char& c : k) c = char(rng());
            keys.insert(k);
            break;
          }
          case 4:
            keys.insert(std::string(1 + rng() % 30, 'p'));
            break;  // prefixes
          default:
            keys.insert(big_endian(uint64_t(std::pow(1.07, double(i)))));
            break;
        }
      }
      NodeBuilder b(kNodeSize, leaf);
      std::vector<std::string> stored;
      for (const std::string& k : keys) {
        LeafEntry e{k, ValueKind::kTombstone, {}, {}};
        size_t size = leaf ? NodeBuilder::LeafEntrySize(e) : NodeBuilder::IndexEntrySize(k);
        if (!b.Fits(size)) break;
        if (leaf) {
          b.AddLeaf(e);
        } else {
          b.AddIndex(k, DevPtr{1, 0});
        }
        stored.push_back(k);
      }
      std::vector<char> node(kNodeSize);
      b.Finish(node.data(), leaf ? 0 : 1, 5);
      NodeView v;
      ASSERT_TRUE(NodeView::Open(node.data(), kNodeSize, true, &v).ok());
      std::vector<std::string> targets = {"", std::string(40, '\xff')};
      for (const std::string& k : stored) {
        targets.push_back(k);
        targets.push_back(k + '\0');
        targets.push_back(k.substr(0, k.size() - 1));
        std::string above = k;
        above.back() = char(uint8_t(above.back()) + 1);
        targets.push_back(above);
      }
      for (const std::string& t : targets) {
        int want = int(std::lower_bound(stored.begin(), stored.end(), t,
                                        [](const std::string& a, const std::string& b) {
                                          return CompareKeys(a, b) < 0;
                                        }) -
                       stored.begin());
        int got = -1;
        ASSERT_TRUE(v.LowerBound(t, &got).ok());
        ASSERT_EQ(got, want) << "shape " << shape << (leaf ? " leaf" : " index") << " of "
                             << stored.size() << " keys";
      }
    }
  }
}

// Index nodes round-trip keys and child pointers; LowerBound works on them too.
TEST(NodeIndex, RoundTripsKeysAndChildren) {
  NodeBuilder b(kNodeSize, /*leaf=*/false);
  std::vector<std::pair<std::string, DevPtr>> want;
  std::mt19937 rng(12);
  for (int i = 0;; i++) {
    std::string key = KeyOf(10 * i) + std::string(i % 5, 'x');
    if (!b.Fits(NodeBuilder::IndexEntrySize(key))) break;
    DevPtr child{uint32_t(1 + rng() % 100000), uint32_t(rng() % (1u << 20)) * 4096u};
    b.AddIndex(key, child);
    want.push_back({key, child});
  }
  ASSERT_GT(want.size(), 100u);
  std::vector<char> node(kNodeSize);
  b.Finish(node.data(), 3, 42);
  NodeView v;
  Status s = NodeView::Open(node.data(), kNodeSize, true, &v);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_FALSE(v.is_leaf());
  EXPECT_EQ(v.height(), 3);
  EXPECT_EQ(v.tree_id(), 42u);
  ASSERT_EQ(v.count(), want.size());
  for (size_t i = 0; i < want.size(); i++) {
    std::string_view key;
    DevPtr child;
    ASSERT_TRUE(v.Index(int(i), &key, &child).ok()) << i;
    EXPECT_EQ(key, want[i].first);
    EXPECT_EQ(child, want[i].second) << i;
    int idx = -1;
    ASSERT_TRUE(v.LowerBound(want[i].first, &idx).ok());
    EXPECT_EQ(idx, int(i));
    ASSERT_TRUE(v.LowerBound(KeyOf(10 * int(i) + 1), &idx).ok());
    EXPECT_EQ(idx, int(i) + 1);
  }
}

// Any single-bit flip in the node's used bytes (header included) makes Open fail with
// Corruption when checksums are verified.
TEST(NodeCorruption, AnyBitFlipInUsedBytesIsDetected) {
  std::vector<char> node;
  MakeLeaf(&node, 5, 10000);
  const uint32_t used = UsedOf(node);
  for (uint32_t byte = 0; byte < used; byte++) {
    for (int bit = 0; bit < 8; bit++) {
      node[byte] = char(node[byte] ^ (1 << bit));
      NodeView v;
      Status s = NodeView::Open(node.data(), kNodeSize, true, &v);
      node[byte] = char(node[byte] ^ (1 << bit));
      ASSERT_TRUE(s.IsCorruption()) << "byte " << byte << " bit " << bit << ": " << s.ToString();
    }
  }
  NodeView v;
  EXPECT_TRUE(NodeView::Open(node.data(), kNodeSize, true, &v).ok());
}

// The structural header checks hold even without checksum verification (and with a valid CRC).
TEST(NodeCorruption, ImpossibleHeadersAreRejected) {
  std::vector<char> good;
  MakeLeaf(&good, 5, 20);
  const uint32_t used = UsedOf(good);
  struct Case {
    const char* what;
    size_t offset;
    uint32_t value;
    int width;
  };
  const Case cases[] = {
      {"bad magic", offsetof(NodeHeader, magic), 0x12345678, 4},
      {"bloom dir magic", offsetof(NodeHeader, magic), kBloomDirMagic, 4},
      {"zero magic", offsetof(NodeHeader, magic), 0, 4},
      {"count 0", offsetof(NodeHeader, count), 0, 2},
      {"offsets past used", offsetof(NodeHeader, count), 2000, 2},
      {"used > node size", offsetof(NodeHeader, used), kNodeSize + 1, 4},
      {"used huge", offsetof(NodeHeader, used), 0xffffffffu, 4},
      {"used < header", offsetof(NodeHeader, used), 16, 4},
      {"used inside offsets", offsetof(NodeHeader, used), kNodeHeaderSize + 10, 4},
      {"leaf with height", offsetof(NodeHeader, height), 1, 2},
  };
  for (const Case& c : cases) {
    std::vector<char> node = good;
    if (c.width == 2) {
      Patch(&node, c.offset, uint16_t(c.value));
    } else {
      Patch(&node, c.offset, c.value);
    }
    // Fix the CRC when it can be computed inside the buffer.
    if (UsedOf(node) >= 8 && UsedOf(node) <= kNodeSize) FixCrc(&node);
    for (bool verify : {false, true}) {
      NodeView v;
      Status s = NodeView::Open(node.data(), kNodeSize, verify, &v);
      EXPECT_TRUE(s.IsCorruption()) << c.what << " verify=" << verify << ": " << s.ToString();
    }
  }
  // An index node must not claim height 0.
  NodeBuilder b(kNodeSize, false);
  b.AddIndex("k", DevPtr{1, 0});
  std::vector<char> index(kNodeSize);
  b.Finish(index.data(), 0, 1);
  NodeView v;
  EXPECT_TRUE(NodeView::Open(index.data(), kNodeSize, false, &v).IsCorruption());
  // The untouched node still opens, and used == node_size is allowed.
  EXPECT_TRUE(NodeView::Open(good.data(), kNodeSize, true, &v).ok());
  EXPECT_TRUE(NodeView::Open(good.data(), used, true, &v).ok());
  EXPECT_TRUE(NodeView::Open(good.data(), used - 1, true, &v).IsCorruption());
}

// Entries whose offsets or lengths point outside the node are reported by Leaf(), Index() and
// LowerBound() as Corruption instead of being read.
TEST(NodeCorruption, EntriesOutsideTheNodeAreRejected) {
  std::vector<char> good;
  std::vector<Expected> want = MakeLeaf(&good, 5, 8);
  ASSERT_EQ(want.size(), 8u);
  const uint32_t used = UsedOf(good);
  const uint32_t data_start = kNodeHeaderSize + 2 * 8;
  auto offset_of = [&](int i) {
    uint16_t off;
    std::memcpy(&off, good.data() + kNodeHeaderSize + 2 * i, 2);
    return off;
  };

  // Entry 3's offset pointing at or past `used`, into the offset array, or into the header.
  for (uint16_t bad :
       {uint16_t(used), uint16_t(used + 1), uint16_t(kNodeSize - 1), uint16_t(kNodeSize + 100),
        uint16_t(0xffff), uint16_t(data_start - 1), uint16_t(0)}) {
    std::vector<char> node = good;
    Patch(&node, kNodeHeaderSize + 2 * 3, bad);
    FixCrc(&node);
    NodeView v;
    ASSERT_TRUE(NodeView::Open(node.data(), kNodeSize, true, &v).ok());
    LeafEntry e;
    EXPECT_TRUE(v.Leaf(3, &e).IsCorruption()) << bad;
    EXPECT_TRUE(v.Leaf(2, &e).ok()) << bad;  // neighbours are unaffected
    int idx;
    std::string_view k;
    EXPECT_TRUE(v.KeyAt(3, &k).IsCorruption()) << bad;
    // A search that probes entry 3 reports the damage.
    EXPECT_TRUE(v.LowerBound(want[3].key, &idx).IsCorruption()) << bad;
  }

  // The last entry (a ValuePtr kind or inline) cut short by a smaller `used`.
  for (int cut = 1; cut <= 3; cut++) {
    std::vector<char> node = good;
    Patch(&node, offsetof(NodeHeader, used), uint32_t(used - cut));
    FixCrc(&node);
    NodeView v;
    ASSERT_TRUE(NodeView::Open(node.data(), kNodeSize, true, &v).ok());
    LeafEntry e;
    EXPECT_TRUE(v.Leaf(7, &e).IsCorruption()) << cut;
  }
  ASSERT_EQ(want[7].kind, ValueKind::kTombstone);
  ASSERT_EQ(want[6].kind, ValueKind::kLargePtr);
  {
    // Cut into entry 6's pointer: both 6 and 7 are now out of the node.
    std::vector<char> node = good;
    Patch(&node, offsetof(NodeHeader, used), uint32_t(offset_of(7) - 1));
    FixCrc(&node);
    NodeView v;
    ASSERT_TRUE(NodeView::Open(node.data(), kNodeSize, true, &v).ok());
    LeafEntry e;
    EXPECT_TRUE(v.Leaf(6, &e).IsCorruption());
    EXPECT_TRUE(v.Leaf(7, &e).IsCorruption());
    EXPECT_TRUE(v.Leaf(5, &e).ok());
  }

  // A bad value kind, a key size past the end, an unterminated varint.
  {
    std::vector<char> node = good;
    node[offset_of(2)] = 9;
    FixCrc(&node);
    NodeView v;
    ASSERT_TRUE(NodeView::Open(node.data(), kNodeSize, true, &v).ok());
    LeafEntry e;
    EXPECT_TRUE(v.Leaf(2, &e).IsCorruption());
  }
  for (int i : {0, 1, 4, 7}) {
    std::vector<char> node = good;
    // Key size 0x7f (one byte): past `used` for the later entries of this small node.
    node[offset_of(i) + 1] = char(0x7f);
    FixCrc(&node);
    NodeView v;
    ASSERT_TRUE(NodeView::Open(node.data(), kNodeSize, true, &v).ok());
    LeafEntry e;
    if (uint32_t(offset_of(i)) + 2 + 0x7f > used) {
      EXPECT_TRUE(v.Leaf(i, &e).IsCorruption()) << i;
    }
    std::vector<char> node2 = good;
    for (int j = 1; j <= 5; j++) node2[offset_of(i) + j] = char(0xff);
    FixCrc(&node2);
    ASSERT_TRUE(NodeView::Open(node2.data(), kNodeSize, true, &v).ok());
    EXPECT_TRUE(v.Leaf(i, &e).IsCorruption()) << i;
  }
  {
    // An inline value length past the end: entry 4's two-byte value size made ~16 KiB.
    ASSERT_EQ(want[4].kind, ValueKind::kInline);
    ASSERT_GE(want[4].value.size(), 128u);
    std::vector<char> node = good;
    node[offset_of(4) + 3] = char(0x7f);
    FixCrc(&node);
    NodeView v;
    ASSERT_TRUE(NodeView::Open(node.data(), kNodeSize, true, &v).ok());
    LeafEntry e;
    EXPECT_TRUE(v.Leaf(4, &e).IsCorruption());
  }

  // Index node: an offset past `used` and a key running into the child pointer's bytes.
  NodeBuilder b(kNodeSize, false);
  for (int i = 0; i < 4; i++) b.AddIndex(KeyOf(i), DevPtr{uint32_t(i + 1), 0});
  std::vector<char> index(kNodeSize);
  b.Finish(index.data(), 1, 9);
  const uint32_t index_used = UsedOf(index);
  {
    std::vector<char> node = index;
    Patch(&node, kNodeHeaderSize + 2 * 1, uint16_t(index_used));
    FixCrc(&node);
    NodeView v;
    ASSERT_TRUE(NodeView::Open(node.data(), kNodeSize, true, &v).ok());
    std::string_view key;
    DevPtr child;
    EXPECT_TRUE(v.Index(1, &key, &child).IsCorruption());
    EXPECT_TRUE(v.Index(0, &key, &child).ok());
  }
  {
    // The last entry's key made 3 bytes longer: key plus child no longer fit.
    std::vector<char> node = index;
    uint16_t last;
    std::memcpy(&last, node.data() + kNodeHeaderSize + 2 * 3, 2);
    node[last] = char(node[last] + 3);
    FixCrc(&node);
    NodeView v;
    ASSERT_TRUE(NodeView::Open(node.data(), kNodeSize, true, &v).ok());
    std::string_view key;
    DevPtr child;
    EXPECT_TRUE(v.Index(3, &key, &child).IsCorruption());
  }
}

// Random patches with a fixed-up CRC never crash the decoder and never yield views outside
// the node's used bytes.
TEST(NodeCorruption, RandomPatchedNodesStayInBounds) {
  std::vector<char> good;
  MakeLeaf(&good, 5, 60);
  std::mt19937 rng(13);
  int opened = 0;
  for (int trial = 0; trial < 20000; trial++) {
    std::vector<char> node = good;
    int patches = 1 + int(rng() % 4);
    for (int p = 0; p < patches; p++) {
      // Mostly the offsets and entry bytes; sometimes count and used.
      uint32_t at =
          (rng() % 8 == 0) ? 8 + rng() % 8 : kNodeHeaderSize + rng() % (UsedOf(good) - 32);
      node[at] = char(rng());
    }
    uint32_t used = UsedOf(node);
    if (used >= 8 && used <= kNodeSize) FixCrc(&node);
    NodeView v;
    if (!NodeView::Open(node.data(), kNodeSize, true, &v).ok()) continue;
    opened++;
    const char* lo = node.data();
    const char* hi = node.data() + used;
    for (int i = 0; i < v.count(); i++) {
      LeafEntry e;
      if (!v.Leaf(i, &e).ok()) continue;
      ASSERT_GE(e.key.data(), lo);
      ASSERT_LE(e.key.data() + e.key.size(), hi);
      if (e.kind == ValueKind::kInline) {
        ASSERT_GE(e.inline_value.data(), lo);
        ASSERT_LE(e.inline_value.data() + e.inline_value.size(), hi);
      }
    }
    int idx;
    (void)v.LowerBound("key000050", &idx);
  }
  EXPECT_GT(opened, 1000);
}

}  // namespace
}  // namespace slipstream::engine
