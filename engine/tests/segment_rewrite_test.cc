// RewriteIndexSegment: every pointer kind an index segment holds is mapped and the node
// checksums stay valid, and an image it refuses (damaged, unmapped, of another tree,
// truncated) is left byte-identical. Images come both from NodeBuilder directly and from a
// running engine through EngineObserver::OnCompactionSegment.
#include "segment_rewrite.h"

#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "coding.h"
#include "crc32c.h"
#include "node.h"
#include "test_util.h"

namespace slipstream::engine::test {
namespace {

constexpr uint32_t kNodeSize = 1024;
constexpr uint32_t kTree = 77;

// A SegmentMap over a fixed table: NotFound for a segment it does not list.
SegmentMap TableMap(const std::map<uint32_t, uint32_t>& table) {
  return [table](uint32_t primary, uint32_t* local) {
    auto it = table.find(primary);
    if (it == table.end()) return Status::NotFound("segment " + std::to_string(primary));
    *local = it->second;
    return Status::OK();
  };
}

// Maps every segment to itself.
Status Identity(uint32_t primary, uint32_t* local) {
  *local = primary;
  return Status::OK();
}

// The segment numbers a synthetic image is built with: either the primary's or the replica's.
struct Numbers {
  uint32_t medium_a, medium_b, large, index, bloom_a, bloom_b;
};
constexpr Numbers kPrimary{5, 6, 9, 12, 20, 21};
constexpr Numbers kLocal{105, 306, 1009, 412, 620, 721};

// The log and index maps that turn kPrimary into kLocal.
SegmentMap LogMap() {
  return TableMap({{kPrimary.medium_a, kLocal.medium_a},
                   {kPrimary.medium_b, kLocal.medium_b},
                   {kPrimary.large, kLocal.large}});
}
SegmentMap IndexMap() {
  return TableMap({{kPrimary.index, kLocal.index},
                   {kPrimary.bloom_a, kLocal.bloom_a},
                   {kPrimary.bloom_b, kLocal.bloom_b}});
}

// Writes a bloom directory node into `dst` exactly as TreeBuilder::WriteBloom does.
void WriteBloomDir(char* dst, const std::vector<uint32_t>& segments, uint32_t tree_id) {
  NodeHeader h{};
  h.magic = kBloomDirMagic;
  h.count = uint16_t(segments.size());
  h.used = uint32_t(kNodeHeaderSize + 4 * segments.size());
  h.tree_id = tree_id;
  std::memset(dst, 0, kNodeSize);
  std::memcpy(dst + kNodeHeaderSize, segments.data(), 4 * segments.size());
  std::memcpy(dst, &h, sizeof(h));
}

// A ValuePtr whose non-segment fields are distinct per entry, to catch shifted writes.
ValuePtr Ptr(uint32_t segment, uint32_t seed) {
  return ValuePtr{{segment, 64 * seed}, 200 + seed, 150 + seed};
}

// A four-node index segment as a compaction writes it: two leaves holding every value kind,
// their parent index node, and the bloom directory in the last slot.
std::string BuildImage(const Numbers& n, uint32_t tree_id = kTree) {
  std::string image(4 * kNodeSize, '\0');
  NodeBuilder leaf(kNodeSize, true);
  leaf.AddLeaf(LeafEntry{"a", ValueKind::kInline, "small value", {}});
  leaf.AddLeaf(LeafEntry{"b", ValueKind::kMediumPtr, {}, Ptr(n.medium_a, 1)});
  leaf.AddLeaf(LeafEntry{"c", ValueKind::kLargePtr, {}, Ptr(n.large, 2)});
  leaf.AddLeaf(LeafEntry{"d", ValueKind::kTombstone, {}, {}});
  leaf.AddLeaf(LeafEntry{"e", ValueKind::kMediumPtr, {}, Ptr(n.medium_b, 3)});
  leaf.Finish(image.data(), 0, tree_id);
  leaf.AddLeaf(LeafEntry{"f", ValueKind::kLargePtr, {}, Ptr(n.large, 4)});
  leaf.AddLeaf(LeafEntry{"g", ValueKind::kInline, "another", {}});
  leaf.AddLeaf(LeafEntry{"h", ValueKind::kMediumPtr, {}, Ptr(n.medium_a, 5)});
  leaf.Finish(image.data() + kNodeSize, 0, tree_id);
  NodeBuilder index(kNodeSize, false);
  index.AddIndex("a", DevPtr{n.index, 0});
  index.AddIndex("f", DevPtr{n.index, kNodeSize});
  index.Finish(image.data() + 2 * kNodeSize, 1, tree_id);
  WriteBloomDir(image.data() + 3 * kNodeSize, {n.bloom_a, n.bloom_b}, tree_id);
  return image;
}

// Runs the rewrite over a whole std::string image.
Status Rewrite(std::string* image, uint32_t tree_id, const SegmentMap& log, const SegmentMap& index,
               RewriteStats* stats = nullptr) {
  return RewriteIndexSegment(image->data(), image->size(), kNodeSize, tree_id, log, index, stats);
}

// Recomputes a node's crc after a test edits it on purpose, so that only the edit is wrong.
void Reseal(char* node) {
  uint32_t used = DecodeFixed32(node + 12);
  EncodeFixed32(node + 4, crc32c::Value(node + 8, used - 8));
}

TEST(SegmentRewrite, RewritesEveryPointerKind) {
  std::string image = BuildImage(kPrimary);
  ASSERT_NE(image, BuildImage(kLocal));
  RewriteStats stats;
  Status s = Rewrite(&image, kTree, LogMap(), IndexMap(), &stats);
  ASSERT_TRUE(s.ok()) << s.ToString();
  // Byte for byte what a primary with this node's segment numbers would have written.
  EXPECT_EQ(image, BuildImage(kLocal));
  EXPECT_EQ(stats.leaves, 2u);
  EXPECT_EQ(stats.index_nodes, 1u);
  EXPECT_EQ(stats.bloom_dirs, 1u);
  EXPECT_EQ(stats.value_pointers, 5u);
  EXPECT_EQ(stats.child_pointers, 2u);

  // Decoded with checksums verified, each pointer carries the mapped segment.
  NodeView leaf;
  ASSERT_TRUE(NodeView::Open(image.data(), kNodeSize, true, &leaf).ok());
  LeafEntry e;
  ASSERT_TRUE(leaf.Leaf(0, &e).ok());
  EXPECT_EQ(e.inline_value, "small value");
  ASSERT_TRUE(leaf.Leaf(1, &e).ok());
  EXPECT_EQ(e.kind, ValueKind::kMediumPtr);
  EXPECT_EQ(e.ptr.where, (DevPtr{kLocal.medium_a, 64}));
  EXPECT_EQ(e.ptr.record_bytes, 201u);
  EXPECT_EQ(e.ptr.value_size, 151u);
  ASSERT_TRUE(leaf.Leaf(2, &e).ok());
  EXPECT_EQ(e.kind, ValueKind::kLargePtr);
  EXPECT_EQ(e.ptr.where, (DevPtr{kLocal.large, 128}));
  ASSERT_TRUE(leaf.Leaf(3, &e).ok());
  EXPECT_EQ(e.kind, ValueKind::kTombstone);
  ASSERT_TRUE(leaf.Leaf(4, &e).ok());
  EXPECT_EQ(e.ptr.where, (DevPtr{kLocal.medium_b, 192}));
  ASSERT_TRUE(NodeView::Open(image.data() + kNodeSize, kNodeSize, true, &leaf).ok());
  ASSERT_TRUE(leaf.Leaf(0, &e).ok());
  EXPECT_EQ(e.ptr.where, (DevPtr{kLocal.large, 256}));
  ASSERT_TRUE(leaf.Leaf(2, &e).ok());
  EXPECT_EQ(e.ptr.where, (DevPtr{kLocal.medium_a, 320}));
  NodeView index;
  ASSERT_TRUE(NodeView::Open(image.data() + 2 * kNodeSize, kNodeSize, true, &index).ok());
  std::string_view key;
  DevPtr child;
  ASSERT_TRUE(index.Index(1, &key, &child).ok());
  EXPECT_EQ(key, "f");
  EXPECT_EQ(child, (DevPtr{kLocal.index, kNodeSize}));
  EXPECT_EQ(DecodeFixed32(image.data() + 3 * kNodeSize + kNodeHeaderSize), kLocal.bloom_a);
  EXPECT_EQ(DecodeFixed32(image.data() + 3 * kNodeSize + kNodeHeaderSize + 4), kLocal.bloom_b);
  EXPECT_EQ(DecodeFixed32(image.data() + 3 * kNodeSize + 4), 0u);  // a directory has no crc
}

TEST(SegmentRewrite, IdentityMapLeavesTheImageByteIdentical) {
  std::string image = BuildImage(kPrimary);
  std::string before = image;
  ASSERT_TRUE(Rewrite(&image, kTree, Identity, Identity).ok());
  EXPECT_EQ(image, before);
}

TEST(SegmentRewrite, AFlippedBitIsRefusedAndChangesNothing) {
  const std::string original = BuildImage(kPrimary);
  // A bit in a value pointer's segment, in a child's segment, in an inline value, in the
  // offset array, in a header's count, and in the directory's crc field (which must stay 0).
  struct Flip {
    size_t node, byte;
  };
  for (Flip f : {Flip{1, 41}, Flip{2, 49}, Flip{0, 50}, Flip{0, 33}, Flip{1, 8}, Flip{3, 4}}) {
    std::string image = original;
    image[f.node * kNodeSize + f.byte] ^= 0x10;
    std::string damaged = image;
    Status s = Rewrite(&image, kTree, LogMap(), IndexMap());
    EXPECT_TRUE(s.IsCorruption()) << f.node << ":" << f.byte << " " << s.ToString();
    EXPECT_NE(s.message().find("offset " + std::to_string(f.node * kNodeSize)), std::string::npos)
        << s.message();
    EXPECT_EQ(image, damaged) << "node " << f.node << " byte " << f.byte;
  }
}

TEST(SegmentRewrite, AnUnmappedSegmentIsRefusedAndChangesNothing) {
  const std::string original = BuildImage(kPrimary);
  // The last pointer of the image (the directory's second bloom segment), then a value pointer.
  std::string image = original;
  Status s = Rewrite(&image, kTree, LogMap(),
                     TableMap({{kPrimary.index, kLocal.index}, {kPrimary.bloom_a, 1}}));
  EXPECT_TRUE(s.IsNotFound()) << s.ToString();
  EXPECT_NE(s.message().find("offset 3072"), std::string::npos) << s.message();
  EXPECT_EQ(image, original);
  s = Rewrite(&image, kTree, TableMap({{kPrimary.medium_a, 1}, {kPrimary.large, 2}}), IndexMap());
  EXPECT_TRUE(s.IsNotFound()) << s.ToString();
  EXPECT_EQ(image, original);
}

TEST(SegmentRewrite, ANodeOfAnotherTreeIsRefused) {
  std::string image = BuildImage(kPrimary);
  const std::string original = image;
  EXPECT_TRUE(Rewrite(&image, kTree + 1, LogMap(), IndexMap()).IsCorruption());
  EXPECT_EQ(image, original);
  // One node alone of another tree, its checksum intact: the leaf, then the directory.
  for (size_t node : {size_t(1), size_t(3)}) {
    image = original;
    EncodeFixed32(image.data() + node * kNodeSize + 16, kTree + 1);
    if (node != 3) Reseal(image.data() + node * kNodeSize);
    std::string mixed = image;
    Status s = Rewrite(&image, kTree, LogMap(), IndexMap());
    EXPECT_TRUE(s.IsCorruption()) << s.ToString();
    EXPECT_NE(s.message().find("another tree"), std::string::npos) << s.message();
    EXPECT_EQ(image, mixed);
  }
}

TEST(SegmentRewrite, AnImageOfPartialOrMissingNodesIsRefused) {
  const std::string original = BuildImage(kPrimary);
  for (size_t size :
       {original.size() - 1, original.size() - kNodeSize / 2, size_t(100), size_t(0)}) {
    std::string image = original;
    Status s =
        RewriteIndexSegment(image.data(), size, kNodeSize, kTree, LogMap(), IndexMap(), nullptr);
    EXPECT_TRUE(s.IsCorruption()) << size << " " << s.ToString();
    EXPECT_EQ(image, original);
  }
  // A last slot that holds no node (all zeroes): an unknown magic.
  std::string image = original;
  std::memset(image.data() + 3 * kNodeSize, 0, kNodeSize);
  std::string zeroed = image;
  EXPECT_TRUE(Rewrite(&image, kTree, LogMap(), IndexMap()).IsCorruption());
  EXPECT_EQ(image, zeroed);
  // The writer never puts anything after the bloom directory.
  image = original + original.substr(0, kNodeSize);
  zeroed = image;
  Status s = Rewrite(&image, kTree, LogMap(), IndexMap());
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_EQ(image, zeroed);
  // A node size other than the writer's puts node boundaries inside nodes.
  image = original;
  s = RewriteIndexSegment(image.data(), image.size(), kNodeSize / 2, kTree, LogMap(), IndexMap(),
                          nullptr);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_EQ(image, original);
  EXPECT_TRUE(
      RewriteIndexSegment(image.data(), image.size(), 1000, kTree, LogMap(), IndexMap(), nullptr)
          .IsInvalidArgument());
}

TEST(SegmentRewrite, StructuralDamageUnderAValidChecksumIsRefused) {
  const std::string original = BuildImage(kPrimary);
  struct Case {
    const char* what;
    size_t node;
    bool reseal;  // false where a crc cannot be computed (used too big) or exists (BDIR)
    void (*edit)(char* node);
  };
  const Case cases[] = {
      {"used past the node", 0, false, [](char* n) { EncodeFixed32(n + 12, kNodeSize + 1); }},
      {"entry offset past used", 1, true,
       [](char* n) { std::memcpy(n + kNodeHeaderSize, "\xff\x03", 2); }},
      {"two offsets naming one entry", 0, true,
       [](char* n) { std::memcpy(n + kNodeHeaderSize + 4, n + kNodeHeaderSize + 2, 2); }},
      {"child off the node grid", 2, true,
       [](char* n) { n[kNodeHeaderSize + 2 * 2 + 2 + 4] ^= 1; }},
      {"directory used beyond its list", 3, false, [](char* n) { EncodeFixed32(n + 12, 44); }},
      {"directory with no segment", 3, false, [](char* n) { std::memset(n + 8, 0, 2); }},
      {"leaf magic with a height", 1, true, [](char* n) { n[10] = 1; }},
  };
  for (const Case& c : cases) {
    std::string image = original;
    char* node = image.data() + c.node * kNodeSize;
    c.edit(node);
    if (c.reseal) Reseal(node);
    std::string edited = image;
    Status s = Rewrite(&image, kTree, LogMap(), IndexMap());
    EXPECT_TRUE(s.IsCorruption()) << c.what << ": " << s.ToString();
    EXPECT_EQ(image, edited) << c.what;
  }
}

// Captures what the engine's compactions write, as a shipper would see it.
class SegmentCapture : public EngineObserver {
 public:
  void OnLogWrite(const LogWriteEvent& e) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (e.log == ObservedLog::kLarge) log_segments_.insert(e.segment);
  }
  void OnCompactionSegment(const CompactionSegmentEvent& e) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (e.kind == CompactionSegmentKind::kMedium) {
      log_segments_.insert(e.segment);
    } else {
      tree_segments_[e.compaction].insert(e.segment);
    }
    if (e.kind == CompactionSegmentKind::kIndex) {
      images_.push_back(Image{e.compaction, e.segment, std::string(e.bytes)});
    }
  }

  struct Image {
    uint64_t compaction;
    uint32_t segment;
    std::string bytes;
  };
  std::mutex mu_;
  std::set<uint32_t> log_segments_;
  std::map<uint64_t, std::set<uint32_t>> tree_segments_;
  std::vector<Image> images_;
};

// A replica's numbering: distinct from the primary's, defined only for `known` segments.
SegmentMap ShiftedMap(const std::set<uint32_t>& known, uint32_t shift) {
  return [&known, shift](uint32_t primary, uint32_t* local) {
    if (!known.count(primary)) return Status::NotFound("unknown segment");
    *local = primary * 3 + shift;
    return Status::OK();
  };
}

// Counts of what the captured images held, checked so the test cannot pass vacuously.
struct Seen {
  uint64_t medium = 0, large = 0, tombstones = 0, inline_values = 0, children = 0, dirs = 0;
};

// Checks node by node that `after` is `before` with every segment number mapped.
void CompareImages(const std::string& before, const std::string& after, uint32_t node_size,
                   const SegmentMap& log, const SegmentMap& index, Seen* seen) {
  auto mapped = [](const SegmentMap& map, uint32_t segment) {
    uint32_t local = 0;
    EXPECT_TRUE(map(segment, &local).ok());
    return local;
  };
  for (size_t off = 0; off < before.size(); off += node_size) {
    if (DecodeFixed32(before.data() + off) == kBloomDirMagic) {
      seen->dirs++;
      uint32_t count = DecodeFixed16(before.data() + off + 8);
      for (uint32_t i = 0; i < count; i++) {
        size_t at = off + kNodeHeaderSize + 4 * i;
        EXPECT_EQ(DecodeFixed32(after.data() + at),
                  mapped(index, DecodeFixed32(before.data() + at)));
      }
      continue;
    }
    NodeView a, b;
    ASSERT_TRUE(NodeView::Open(before.data() + off, node_size, true, &a).ok());
    Status s = NodeView::Open(after.data() + off, node_size, true, &b);
    ASSERT_TRUE(s.ok()) << "node at " << off << ": " << s.ToString();
    ASSERT_EQ(a.count(), b.count());
    for (int i = 0; i < a.count(); i++) {
      if (a.is_leaf()) {
        LeafEntry x, y;
        ASSERT_TRUE(a.Leaf(i, &x).ok() && b.Leaf(i, &y).ok());
        EXPECT_EQ(x.key, y.key);
        ASSERT_EQ(x.kind, y.kind);
        if (x.kind == ValueKind::kInline) {
          seen->inline_values++;
          EXPECT_EQ(x.inline_value, y.inline_value);
        } else if (x.kind == ValueKind::kTombstone) {
          seen->tombstones++;
        } else {
          (x.kind == ValueKind::kMediumPtr ? seen->medium : seen->large)++;
          EXPECT_EQ(y.ptr.where.segment, mapped(log, x.ptr.where.segment));
          EXPECT_NE(y.ptr.where.segment, x.ptr.where.segment);
          EXPECT_EQ(y.ptr.where.offset, x.ptr.where.offset);
          EXPECT_EQ(y.ptr.record_bytes, x.ptr.record_bytes);
          EXPECT_EQ(y.ptr.value_size, x.ptr.value_size);
        }
      } else {
        std::string_view kx, ky;
        DevPtr cx, cy;
        ASSERT_TRUE(a.Index(i, &kx, &cx).ok() && b.Index(i, &ky, &cy).ok());
        seen->children++;
        EXPECT_EQ(kx, ky);
        EXPECT_EQ(cy, (DevPtr{mapped(index, cx.segment), cx.offset}));
      }
    }
  }
}

TEST(SegmentRewrite, RewritesTheSegmentsARealCompactionWrites) {
  TestEngine t([](const std::string& dir) {
    Options o = SmallOptions(dir);
    o.node_size = 2048;  // small nodes: a tree spans several index segments
    o.max_key_size = 32;
    o.small_threshold = 50;
    o.large_threshold = 500;
    o.growth_factor = 2;  // L1 past 2 MiB moves to L2, so a later L1 keeps tombstones
    o.medium_inplace_level = o.max_levels;  // medium values stay in the medium log
    o.compress_large = false;
    return o;
  });
  auto capture = std::make_shared<SegmentCapture>();
  t.options.observer = capture;
  t.Reopen();
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(1, &ks).ok());
  auto key = [](int i) { return "key" + std::to_string(100000 + i); };
  for (int i = 0; i < 10000; i++) {  // small, medium and large values
    size_t size = i % 3 == 0 ? 20 : i % 3 == 1 ? 100 : 1000;
    ASSERT_TRUE(t->Put(ks, key(i), Value(size, i)).ok());
  }
  ASSERT_TRUE(t->CompactAll().ok());
  while (t->DoBackgroundWork()) {
  }
  for (int i = 0; i < 10000; i += 4) ASSERT_TRUE(t->Delete(ks, key(i)).ok());
  ASSERT_TRUE(t->CompactAll().ok());
  ASSERT_TRUE(t->Verify().ok());

  std::lock_guard<std::mutex> lock(capture->mu_);
  SegmentMap log = ShiftedMap(capture->log_segments_, 7);
  Seen seen;
  std::set<uint64_t> trees;
  for (const SegmentCapture::Image& img : capture->images_) {
    SCOPED_TRACE("compaction " + std::to_string(img.compaction) + " segment " +
                 std::to_string(img.segment));
    const std::set<uint32_t>& own = capture->tree_segments_[img.compaction];
    SegmentMap index = ShiftedMap(own, 11);
    auto tree = uint32_t(img.compaction);
    trees.insert(img.compaction);

    std::string image = img.bytes;
    ASSERT_TRUE(RewriteIndexSegment(image.data(), image.size(), t.options.node_size, tree, Identity,
                                    Identity, nullptr)
                    .ok());
    EXPECT_EQ(image, img.bytes);
    EXPECT_TRUE(RewriteIndexSegment(image.data(), image.size(), t.options.node_size, tree + 1, log,
                                    index, nullptr)
                    .IsCorruption());
    EXPECT_EQ(image, img.bytes);

    RewriteStats stats;
    Status s = RewriteIndexSegment(image.data(), image.size(), t.options.node_size, tree, log,
                                   index, &stats);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(uint64_t(stats.leaves + stats.index_nodes + stats.bloom_dirs) * t.options.node_size,
              image.size());
    Seen before = seen;
    CompareImages(img.bytes, image, t.options.node_size, log, index, &seen);
    EXPECT_EQ(stats.value_pointers, seen.medium + seen.large - before.medium - before.large);
    EXPECT_EQ(stats.child_pointers, seen.children - before.children);
    EXPECT_EQ(stats.bloom_dirs, seen.dirs - before.dirs);
  }
  EXPECT_GE(capture->images_.size(), 4u);
  EXPECT_GT(capture->images_.size(), trees.size()) << "no tree spanned two index segments";
  // Trees above the deepest level have one bloom directory each, the deepest level's none.
  EXPECT_LE(seen.dirs, trees.size());
  EXPECT_GT(seen.dirs, 0u) << "no tree above the deepest level";
  EXPECT_GT(seen.medium, 0u);
  EXPECT_GT(seen.large, 0u);
  EXPECT_GT(seen.tombstones, 0u);
  EXPECT_GT(seen.inline_values, 0u);
  EXPECT_GT(seen.children, 0u);
}

}  // namespace
}  // namespace slipstream::engine::test
