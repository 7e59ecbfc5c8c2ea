// B+-tree building and reading.
#include "btree.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "coding.h"

namespace slipstream::engine {

TreeBuilder::TreeBuilder(const TreeShape& shape, SegmentSink* sink, uint32_t tree_id)
    : shape_(shape),
      sink_(sink),
      tree_id_(tree_id),
      first_tree_id_(tree_id),
      leaf_(shape.node_size, true),
      bloom_(shape.bloom_bits_per_key) {}

// Hands out node-sized slots; a full segment is written out and a new one allocated.
Status TreeBuilder::NextNodeSlot(DevPtr* where, char** dst) {
  if (segment_ == 0 || segment_pos_ + shape_.node_size > shape_.segment_size) {
    Status s = FlushSegment();
    if (!s.ok()) return s;
    s = sink_->NewSegment(SegmentKind::kIndex, &segment_);
    if (!s.ok()) return s;
    stats_.segments++;
    segment_buf_.assign(shape_.segment_size, '\0');
    segment_pos_ = 0;
  }
  *where = DevPtr{segment_, segment_pos_};
  *dst = segment_buf_.data() + segment_pos_;
  segment_pos_ += shape_.node_size;
  return Status::OK();
}

// Writes the used part of the current index segment.
Status TreeBuilder::FlushSegment() {
  if (segment_ == 0 || segment_pos_ == 0) return Status::OK();
  Status s = sink_->WriteSegment(segment_, segment_buf_.data(), segment_pos_);
  segment_pos_ = 0;
  segment_ = 0;
  return s;
}

Status TreeBuilder::FlushLeaf() {
  if (leaf_.empty()) return Status::OK();
  DevPtr where;
  char* dst;
  Status s = NextNodeSlot(&where, &dst);
  if (!s.ok()) return s;
  leaf_.Finish(dst, 0, tree_id_);
  pivots_.push_back(Pivot{first_key_, where});
  return Status::OK();
}

uint64_t EntryBytes(const LeafEntry& e) {
  switch (e.kind) {
    case ValueKind::kTombstone:
      return e.key.size();
    case ValueKind::kInline:
      return e.key.size() + e.inline_value.size();
    default:
      return e.key.size() + e.ptr.value_size;
  }
}

// Appends the entry to the current leaf.
Status TreeBuilder::Add(const LeafEntry& e) {
  if ((entries_ > 0 || !kept_segments_.empty()) && e.key.compare(last_key_) <= 0) {
    return Status::InvalidArgument("tree builder input out of order");
  }
  size_t size = NodeBuilder::LeafEntrySize(e);
  if (!leaf_.Fits(size)) {
    Status s = FlushLeaf();
    if (!s.ok()) return s;
    if (!leaf_.Fits(size)) return Status::InvalidArgument("entry larger than a node");
  }
  if (leaf_.empty()) first_key_.assign(e.key);
  leaf_.AddLeaf(e);
  last_key_.assign(e.key);
  Account(e);
  return Status::OK();
}

// Ends the leaf being filled and points the tree at an older tree's leaf as it stands.
Status TreeBuilder::AddExistingLeaf(std::string_view first_key, DevPtr where,
                                    std::string_view last_key) {
  if ((entries_ > 0 || !kept_segments_.empty()) && first_key.compare(last_key_) <= 0) {
    return Status::InvalidArgument("tree builder input out of order");
  }
  Status s = FlushLeaf();
  if (!s.ok()) return s;
  pivots_.push_back(Pivot{std::string(first_key), where});
  last_key_.assign(last_key.empty() ? first_key : last_key);
  kept_segments_[where.segment]++;
  return Status::OK();
}

void TreeBuilder::InheritFromKeptLeaves(const LevelDesc& kept, uint32_t first_tree_id,
                                        std::string filter, const BloomExtension& extension) {
  kept_ = kept;
  first_tree_id_ = std::min(first_tree_id_, first_tree_id);
  base_filter_ = std::move(filter);
  extension_ = extension;
}

// Adds an entry of the tree to the bloom filter (if it has one) and the level's statistics.
void TreeBuilder::Account(const LeafEntry& e) {
  if (shape_.bloom_bits_per_key != 0) bloom_.AddHash(HashKey(e.key));
  entries_++;
  AccountEntry(shape_, e, &stats_);
}

void AccountEntry(const TreeShape& shape, const LeafEntry& e, LevelDesc* stats) {
  stats->entries++;
  uint64_t total = EntryBytes(e);
  stats->bytes += total;
  if (e.kind == ValueKind::kTombstone) {
    stats->tombstones++;
  } else if (total < shape.small_threshold) {
    stats->small_entries++;
  } else if (total < shape.large_threshold) {
    stats->medium_entries++;
  } else {
    stats->large_entries++;
  }
}

// Builds index layers until a single node remains: that node is the root.
Status TreeBuilder::BuildIndexLayers(DevPtr* root, uint32_t* height) {
  uint16_t layer = 0;
  while (pivots_.size() > 1) {
    layer++;
    std::vector<Pivot> parents;
    NodeBuilder node(shape_.node_size, false);
    std::string node_first;
    for (size_t i = 0; i < pivots_.size(); i++) {
      size_t size = NodeBuilder::IndexEntrySize(pivots_[i].key);
      if (!node.Fits(size) && !node.empty()) {
        DevPtr where;
        char* dst;
        Status s = NextNodeSlot(&where, &dst);
        if (!s.ok()) return s;
        node.Finish(dst, layer, tree_id_);
        parents.push_back(Pivot{node_first, where});
      }
      if (node.empty()) node_first = pivots_[i].key;
      node.AddIndex(pivots_[i].key, pivots_[i].node);
    }
    DevPtr where;
    char* dst;
    Status s = NextNodeSlot(&where, &dst);
    if (!s.ok()) return s;
    node.Finish(dst, layer, tree_id_);
    parents.push_back(Pivot{node_first, where});
    pivots_.swap(parents);
  }
  *root = pivots_[0].node;
  *height = layer;
  return Status::OK();
}

// Writes the filter blocks into bloom segments and a directory node listing them.
Status TreeBuilder::WriteBloom(LevelDesc* desc) {
  uint64_t blocks_per_segment = shape_.segment_size / kBloomBlockBytes;
  uint64_t max_segments = (shape_.node_size - kNodeHeaderSize) / 4;
  std::string filter =
      base_filter_.empty() ? bloom_.Finish() : bloom_.FinishOver(base_filter_, extension_.shift);
  uint64_t blocks = filter.size() / kBloomBlockBytes;
  if (blocks > max_segments * blocks_per_segment) {
    return Status::InvalidArgument("bloom filter larger than its directory can list");
  }
  std::vector<uint32_t> segments;
  for (uint64_t done = 0; done < blocks; done += blocks_per_segment) {
    uint32_t seg;
    Status s = sink_->NewSegment(SegmentKind::kBloom, &seg);
    if (!s.ok()) return s;
    stats_.segments++;
    uint64_t n = std::min(blocks - done, blocks_per_segment) * kBloomBlockBytes;
    s = sink_->WriteSegment(seg, filter.data() + done * kBloomBlockBytes, uint32_t(n));
    if (!s.ok()) return s;
    segments.push_back(seg);
  }
  DevPtr where;
  char* dst;
  Status s = NextNodeSlot(&where, &dst);
  if (!s.ok()) return s;
  NodeHeader h{};
  h.magic = kBloomDirMagic;
  h.count = uint16_t(segments.size());
  h.used = uint32_t(kNodeHeaderSize + 4 * segments.size());
  h.tree_id = tree_id_;
  std::memset(dst, 0, shape_.node_size);
  std::memcpy(dst + kNodeHeaderSize, segments.data(), 4 * segments.size());
  std::memcpy(dst, &h, sizeof(h));
  desc->bloom_dir = where;
  desc->bloom_blocks = blocks;
  return Status::OK();
}

Status TreeBuilder::Finish(LevelDesc* desc) {
  if (empty()) return Status::InvalidArgument("empty tree");
  // kept_'s counts are modulo 2^64 (InheritFromKeptLeaves); a sum below 0 is floored.
  auto add = [](uint64_t* total, uint64_t kept) {
    int64_t sum = int64_t(*total) + int64_t(kept);
    *total = sum < 0 ? 0 : uint64_t(sum);
  };
  add(&stats_.entries, kept_.entries);
  add(&stats_.bytes, kept_.bytes);
  add(&stats_.small_entries, kept_.small_entries);
  add(&stats_.medium_entries, kept_.medium_entries);
  add(&stats_.large_entries, kept_.large_entries);
  add(&stats_.tombstones, kept_.tombstones);
  stats_.bloom_keys = base_filter_.empty() ? bloom_.count() : extension_.load_keys;
  Status s = FlushLeaf();
  if (s.ok()) s = BuildIndexLayers(&stats_.root, &stats_.height);
  if (s.ok() && shape_.bloom_bits_per_key != 0) s = WriteBloom(&stats_);
  if (s.ok()) s = FlushSegment();
  stats_.tree_id = tree_id_;
  stats_.first_tree_id = first_tree_id_;
  stats_.segments += kept_segments_.size();
  for (auto [segment, leaves] : kept_segments_) {
    stats_.dead_bytes += shape_.segment_size - uint64_t(leaves) * shape_.node_size;
  }
  *desc = stats_;
  return s;
}

// Rejects pointers outside the tree's own index segments before touching memory. A tree that
// kept leaves of older trees (LevelDesc::first_tree_id) owns the segments holding them since
// its install, and a reader of the older version still reaches them: every node a tree
// reaches lies in a segment owned by the tree or by a newer one that took it over, and the
// node itself must be of the lineage.
Status TreeContext::OpenNode(DevPtr p, const LevelDesc& desc, NodeView* node) const {
  if (p.segment == 0 || p.segment >= max_segments || p.offset % node_size != 0 ||
      uint64_t(p.offset) + node_size > segment_size) {
    return Status::Corruption("node pointer out of bounds");
  }
  const SegmentInfo& info = segments[p.segment];
  const uint32_t owner = info.owner;
  if (info.kind != uint8_t(SegmentKind::kIndex) || owner < desc.tree_id) {
    return Status::Corruption("node pointer into a segment the tree does not own");
  }
  // The checksum only the first time this process opens the node (checked_nodes says why that
  // is enough: the bytes of a reachable tree never change); every other check above and in
  // NodeView::Open stays on every read, as a damaged pointer must never be followed.
  uint32_t slot = p.offset / node_size;
  bool verify = verify_crc && !(checked_nodes && checked_nodes->Checked(p.segment, owner, slot));
  Status s = NodeView::Open(device->Segment(p.segment) + p.offset, node_size, verify, node);
  if (s.ok() && (node->tree_id() < desc.first_tree_id || node->tree_id() > desc.tree_id)) {
    return Status::Corruption("node of another tree");
  }
  if (s.ok() && verify && checked_nodes) checked_nodes->MarkChecked(p.segment, owner, slot);
  return s;
}

namespace {

// A directory is one node slot of a device segment, and lists at most as many bloom segments
// as fit after its header (what TreeBuilder::WriteBloom refuses to exceed).
bool BloomDirInBounds(const TreeContext& ctx, const LevelDesc& desc) {
  const DevPtr& dir = desc.bloom_dir;
  uint64_t per_segment = ctx.segment_size / kBloomBlockBytes;
  uint64_t max_segments = (ctx.node_size - kNodeHeaderSize) / 4;
  return dir.segment < ctx.max_segments && dir.offset % ctx.node_size == 0 &&
         uint64_t(dir.offset) + ctx.node_size <= ctx.segment_size &&
         desc.bloom_blocks <= max_segments * per_segment;
}

}  // namespace

// The descriptor (from the manifest or a primary) and the directory (which has no checksum)
// are checked before they are followed: a filter that cannot be read where they say admits
// every key, which costs a descent but never hides an entry; CheckBloomFilter reports it.
bool TreeMayContain(const TreeContext& ctx, const LevelDesc& desc, uint64_t hash) {
  if (desc.bloom_blocks == 0) return true;
  if (!BloomDirInBounds(ctx, desc)) return true;
  const SegmentInfo& dir_info = ctx.segments[desc.bloom_dir.segment];
  if (dir_info.kind != uint8_t(SegmentKind::kIndex)) return true;
  const char* dir = ctx.device->Segment(desc.bloom_dir.segment) + desc.bloom_dir.offset;
  uint64_t block = BloomBlockOf(hash, desc.bloom_blocks);
  uint64_t per_segment = ctx.segment_size / kBloomBlockBytes;
  uint32_t seg = DecodeFixed32(dir + kNodeHeaderSize + 4 * (block / per_segment));
  if (seg == 0 || seg >= ctx.max_segments ||
      ctx.segments[seg].kind != uint8_t(SegmentKind::kBloom) ||
      ctx.segments[seg].owner != desc.tree_id) {
    return true;
  }
  return BloomTest(ctx.device->Segment(seg) + (block % per_segment) * kBloomBlockBytes, hash);
}

// Follows the descriptor and the directory as TreeMayContain does, reporting what it would skip.
Status CheckBloomFilter(const TreeContext& ctx, const LevelDesc& desc) {
  if (desc.bloom_blocks == 0) return Status::OK();
  if (desc.bloom_dir.segment == 0 || !BloomDirInBounds(ctx, desc)) {
    return Status::Corruption("bloom directory pointer out of bounds");
  }
  const SegmentInfo& dir_info = ctx.segments[desc.bloom_dir.segment];
  if (dir_info.kind != uint8_t(SegmentKind::kIndex) || dir_info.owner != desc.tree_id) {
    return Status::Corruption("bloom directory in a segment the tree does not own");
  }
  const char* dir = ctx.device->Segment(desc.bloom_dir.segment) + desc.bloom_dir.offset;
  NodeHeader h;
  std::memcpy(&h, dir, sizeof(h));
  uint64_t per_segment = ctx.segment_size / kBloomBlockBytes;
  if (h.magic != kBloomDirMagic || h.tree_id != desc.tree_id ||
      h.count != (desc.bloom_blocks + per_segment - 1) / per_segment) {
    return Status::Corruption("bad bloom directory");
  }
  for (uint32_t i = 0; i < h.count; i++) {
    uint32_t seg = DecodeFixed32(dir + kNodeHeaderSize + 4 * i);
    if (seg == 0 || seg >= ctx.max_segments ||
        ctx.segments[seg].kind != uint8_t(SegmentKind::kBloom) ||
        ctx.segments[seg].owner != desc.tree_id) {
      return Status::Corruption("bloom directory lists a segment that is not the tree's filter");
    }
  }
  return Status::OK();
}

bool FingerCovers(const LeafFinger& finger, std::string_view ikey) {
  return finger.valid && (!finger.has_low || CompareKeys(finger.low, ikey) <= 0) &&
         (!finger.has_high || CompareKeys(ikey, finger.high) < 0);
}

namespace {

// Opens the node at `p` that a descent expects at `height`. The check makes every descent end
// after desc.height steps, whatever the pointers say.
Status OpenAtHeight(const TreeContext& ctx, const LevelDesc& desc, DevPtr p, uint32_t height,
                    NodeView* node) {
  Status s = ctx.OpenNode(p, desc, node);
  if (s.ok() && node->height() != height) {
    return Status::Corruption("node height does not match its depth");
  }
  return s;
}

// Looks `ikey` up in one leaf whose keys lie between `low` and `high` (when `bounded`).
Status LeafGet(const NodeView& leaf, std::string_view ikey, bool bounded, std::string_view low,
               std::string_view high, bool* found, LeafEntry* entry) {
  int i;
  Status s = bounded ? leaf.LowerBoundWithin(ikey, low, high, &i) : leaf.LowerBound(ikey, &i);
  if (!s.ok() || i == leaf.count()) return s;
  s = leaf.Leaf(i, entry);
  if (s.ok() && entry->key == ikey) *found = true;
  return s;
}

}  // namespace

// Each node is searched within the bounds its parent's separators give (the keys under child
// j lie in [key j, key j+1)), which spares reading its two ends.
Status TreeGet(const TreeContext& ctx, const LevelDesc& desc, std::string_view ikey, bool* found,
               LeafEntry* entry, LeafFinger* finger) {
  *found = false;
  if (finger && FingerCovers(*finger, ikey)) {
    return LeafGet(finger->leaf, ikey, finger->has_low && finger->has_high, finger->low,
                   finger->high, found, entry);
  }
  NodeView node;
  bool has_low = false, bounded = false;  // bounded: both ends known
  std::string_view low, high;
  Status s = OpenAtHeight(ctx, desc, desc.root, desc.height, &node);
  while (s.ok() && !node.is_leaf()) {
    int i;
    s = bounded ? node.LowerBoundWithin(ikey, low, high, &i) : node.LowerBound(ikey, &i);
    if (!s.ok()) return s;
    std::string_view key, next;
    DevPtr child;
    bool has_next = false;
    if (i < node.count()) {
      s = node.Index(i, &key, &child);
      if (!s.ok()) return s;
    }
    if (i == node.count() || key != ikey) {
      if (i == 0) return Status::OK();  // smaller than every key in the tree
      next = key;
      has_next = i < node.count();
      s = node.Index(i - 1, &key, &child);
      if (!s.ok()) return s;
    } else if (i + 1 < node.count()) {
      s = node.KeyAt(i + 1, &next);
      if (!s.ok()) return s;
      has_next = true;
    }
    low = key;
    has_low = true;
    if (has_next) {
      high = next;
      bounded = true;
    }
    s = OpenAtHeight(ctx, desc, child, node.height() - 1u, &node);
  }
  if (!s.ok()) return s;
  if (finger) {
    finger->valid = true;
    finger->leaf = node;
    finger->has_low = has_low;
    finger->low = low;
    finger->has_high = bounded;
    finger->high = high;
  }
  return LeafGet(node, ikey, bounded, low, high, found, entry);
}

namespace {

// Leaves sampled inside a range besides the two at its ends.
constexpr int kSampledLeaves = 16;

// A tree's layout as its outer paths show it, counted in leaves. The builder fills every node
// but the last of its layer before starting the next, so only the nodes on the right edge may
// be partly filled (a tree that kept leaves of an older one also has part-filled leaves before
// each kept run: the estimate then counts a few leaves too many): the subtree under any other child
// is full, and holds full[h] leaves if its root has height h, taking every full node of a height to
// have as many children as the leftmost one (the fanout varies only with the length of the keys).
struct TreeOutline {
  std::vector<double> full;  // full[0] = 1
  double leaves = 0;         // in the whole tree
  DevPtr last_leaf;
};

// What part of one leaf a key range takes: the bytes of its entries there, and their share of
// the leaf (by the space they take in the node).
struct LeafShare {
  double bytes = 0;
  double leaves = 0;
};

// A leaf reached by a descent, and its number in the outline's model.
struct LeafAt {
  DevPtr ptr;
  NodeView node;
  double number = 0;
};

// The child counts of the nodes on the tree's leftmost or rightmost path, by height, and the
// leaf the path ends at.
Status OuterPath(const TreeContext& ctx, const LevelDesc& desc, bool rightmost,
                 std::vector<int>* counts, DevPtr* leaf) {
  counts->clear();
  DevPtr p = desc.root;
  for (uint32_t height = desc.height;; height--) {
    NodeView node;
    Status s = OpenAtHeight(ctx, desc, p, height, &node);
    if (!s.ok()) return s;
    // Sized by the root, whose 16-bit height has confirmed the descriptor's by now: a damaged
    // descriptor's height alone must not size an allocation.
    if (counts->empty()) counts->assign(size_t(height) + 1, 0);
    (*counts)[height] = node.count();
    if (node.is_leaf()) {  // at height 0 (NodeView::Open checks)
      *leaf = p;
      return Status::OK();
    }
    std::string_view key;
    s = node.Index(rightmost ? node.count() - 1 : 0, &key, &p);
    if (!s.ok()) return s;
  }
}

// Reads both outer paths. Below the root every layer has at least two nodes (the builder stops
// at a layer of one), so the leftmost node of each is full.
Status ReadOutline(const TreeContext& ctx, const LevelDesc& desc, TreeOutline* outline) {
  std::vector<int> left, right;
  DevPtr first_leaf;
  Status s = OuterPath(ctx, desc, false, &left, &first_leaf);
  if (s.ok()) s = OuterPath(ctx, desc, true, &right, &outline->last_leaf);
  if (!s.ok()) return s;
  outline->full.assign(size_t(desc.height) + 1, 1.0);
  for (uint32_t h = 1; h < desc.height; h++) outline->full[h] = left[h] * outline->full[h - 1];
  double edge = 1;  // leaves under the rightmost node of height h
  for (uint32_t h = 1; h <= desc.height; h++) edge += (right[h] - 1) * outline->full[h - 1];
  outline->leaves = edge;
  return Status::OK();
}

// Descends to the leaf holding the first entry >= key the way TreeIterator::Seek does, adding
// up the leaves under the children passed on the left.
Status LocateKey(const TreeContext& ctx, const LevelDesc& desc, const TreeOutline& outline,
                 std::string_view key, LeafAt* leaf) {
  DevPtr p = desc.root;
  double number = 0;
  for (uint32_t height = desc.height;; height--) {
    NodeView node;
    Status s = OpenAtHeight(ctx, desc, p, height, &node);
    if (!s.ok() || node.is_leaf()) {
      *leaf = LeafAt{p, node, number};
      return s;
    }
    int i;
    s = node.LowerBound(key, &i);
    if (!s.ok()) return s;
    std::string_view first;
    if (i < node.count()) {
      s = node.KeyAt(i, &first);
      if (!s.ok()) return s;
    }
    if (i == node.count() || first != key) i = i > 0 ? i - 1 : 0;
    s = node.Index(i, &first, &p);
    if (!s.ok()) return s;
    number += i * outline.full[height - 1];
  }
}

// Descends to the leaf the outline numbers `number` (or the nearest one a node has).
Status LocateLeaf(const TreeContext& ctx, const LevelDesc& desc, const TreeOutline& outline,
                  double number, LeafAt* leaf) {
  DevPtr p = desc.root;
  double base = 0;
  for (uint32_t height = desc.height;; height--) {
    NodeView node;
    Status s = OpenAtHeight(ctx, desc, p, height, &node);
    if (!s.ok() || node.is_leaf()) {
      *leaf = LeafAt{p, node, base};
      return s;
    }
    double child = std::floor((number - base) / outline.full[height - 1]);
    int i = int(std::clamp(child, 0.0, double(node.count() - 1)));
    std::string_view key;
    s = node.Index(i, &key, &p);
    if (!s.ok()) return s;
    base += i * outline.full[height - 1];
  }
}

// The share of the leaf that its entries in [start, end) take. The tree's last leaf may be
// partly filled, so its share is of a full node's space instead of its own.
Status ShareOf(const TreeContext& ctx, const TreeOutline& outline, const LeafAt& leaf,
               std::string_view start, std::string_view end, LeafShare* share) {
  double space = 0, covered = 0;
  *share = LeafShare{};
  for (int i = 0; i < leaf.node.count(); i++) {
    LeafEntry e;
    Status s = leaf.node.Leaf(i, &e);
    if (!s.ok()) return s;
    double entry_space = double(NodeBuilder::LeafEntrySize(e) + 2);  // and its offset
    space += entry_space;
    if (e.key >= start && e.key < end) {
      covered += entry_space;
      share->bytes += double(EntryBytes(e));
    }
  }
  if (leaf.ptr == outline.last_leaf)
    space = std::max(space, double(ctx.node_size - kNodeHeaderSize));
  share->leaves = covered / space;
  return Status::OK();
}

}  // namespace

// The leaves the range spans (from where the descents to its ends land in the outline's model),
// times the bytes a leaf of the range holds, sampled from the range's own leaves rather than
// taken as the tree's average: keyspaces sharing a tree differ, a leaf of pointers to values in
// the logs standing for far more bytes than a leaf of small inline values. The leaves at the
// ends and a few spread between them are read; a range of few leaves is read whole.
Status TreeRangeBytes(const TreeContext& ctx, const LevelDesc& desc, std::string_view start,
                      std::string_view end, double* bytes) {
  *bytes = 0;
  if (desc.tree_id == 0 || start >= end) return Status::OK();
  TreeOutline outline;
  LeafAt first, last;
  Status s = ReadOutline(ctx, desc, &outline);
  if (s.ok()) s = LocateKey(ctx, desc, outline, start, &first);
  if (s.ok()) s = LocateKey(ctx, desc, outline, end, &last);
  LeafShare before_start, before_end;
  if (s.ok()) s = ShareOf(ctx, outline, first, std::string_view(), start, &before_start);
  if (s.ok()) s = ShareOf(ctx, outline, last, std::string_view(), end, &before_end);
  if (!s.ok()) return s;
  double span = (last.number + before_end.leaves) - (first.number + before_start.leaves);
  if (span <= 0) return Status::OK();

  LeafShare sampled;
  std::vector<DevPtr> seen;
  auto sample = [&](const LeafAt& leaf) {
    for (const DevPtr& p : seen) {
      if (p == leaf.ptr) return Status::OK();
    }
    seen.push_back(leaf.ptr);
    LeafShare share;
    Status st = ShareOf(ctx, outline, leaf, start, end, &share);
    sampled.bytes += share.bytes;
    sampled.leaves += share.leaves;
    return st;
  };
  s = sample(first);
  if (s.ok()) s = sample(last);
  double between = last.number - first.number - 1;  // leaves strictly between the two
  int count = int(std::clamp(between, 0.0, double(kSampledLeaves)));
  for (int j = 0; s.ok() && j < count; j++) {
    LeafAt leaf;
    s = LocateLeaf(ctx, desc, outline, first.number + 1 + std::floor((j + 0.5) * between / count),
                   &leaf);
    if (s.ok()) s = sample(leaf);
  }
  if (!s.ok()) return s;
  double rest = std::max(0.0, span - sampled.leaves);
  double per_leaf =
      sampled.leaves > 0 ? sampled.bytes / sampled.leaves : double(desc.bytes) / outline.leaves;
  *bytes = sampled.bytes + rest * per_leaf;
  return Status::OK();
}

void TreeIterator::Fail(const Status& s) {
  status_ = s;
  valid_ = false;
  path_.clear();
}

// Heights are checked on the way down, as every descent checks them: a damaged pointer back up
// the tree must not make the path grow without end.
void TreeIterator::DescendLeftmost(DevPtr p, uint32_t height) {
  while (true) {
    NodeView node;
    Status s = OpenAtHeight(ctx_, desc_, p, height, &node);
    if (!s.ok()) return Fail(s);
    path_.push_back(Frame{node, 0});
    if (node.is_leaf()) return;
    std::string_view key;
    s = node.Index(0, &key, &p);
    if (!s.ok()) return Fail(s);
    height--;
  }
}

// Positions on the first entry >= target.
void TreeIterator::Seek(std::string_view target) {
  path_.clear();
  valid_ = false;
  if (desc_.tree_id == 0 || !status_.ok()) return;
  DevPtr p = desc_.root;
  for (uint32_t height = desc_.height;; height--) {
    NodeView node;
    Status s = OpenAtHeight(ctx_, desc_, p, height, &node);
    if (!s.ok()) return Fail(s);
    int i;
    s = node.LowerBound(target, &i);
    if (!s.ok()) return Fail(s);
    if (node.is_leaf()) {
      path_.push_back(Frame{node, i});
      break;
    }
    std::string_view key;
    if (i < node.count()) {
      s = node.Index(i, &key, &p);
      if (!s.ok()) return Fail(s);
    }
    if (i == node.count() || key != target) i = i > 0 ? i - 1 : 0;
    s = node.Index(i, &key, &p);
    if (!s.ok()) return Fail(s);
    path_.push_back(Frame{node, i});
  }
  LoadEntry();
}

// If the leaf cursor is past its last entry, climbs to the next subtree first.
void TreeIterator::LoadEntry() {
  while (!path_.empty() && path_.back().index >= path_.back().node.count()) {
    path_.pop_back();
    while (!path_.empty()) {
      Frame& f = path_.back();
      if (++f.index < f.node.count()) {
        std::string_view key;
        DevPtr child;
        Status s = f.node.Index(f.index, &key, &child);
        if (!s.ok()) return Fail(s);
        DescendLeftmost(child, f.node.height() - 1u);
        if (!status_.ok()) return;
        break;
      }
      path_.pop_back();
    }
  }
  if (path_.empty()) {
    valid_ = false;
    return;
  }
  Status s = path_.back().node.Leaf(path_.back().index, &entry_);
  if (!s.ok()) return Fail(s);
  valid_ = true;
}

// A tree's keys strictly increase, so a key that does not is damage (say, two index entries
// leading to one subtree), reported rather than returned: a scan of a damaged tree ends.
void TreeIterator::Next() {
  if (!valid_) return;
  std::string_view previous = entry_.key;  // into the device mapping, which stays
  path_.back().index++;
  LoadEntry();
  if (valid_ && CompareKeys(entry_.key, previous) <= 0) {
    Fail(Status::Corruption("tree keys out of order"));
  }
}

}  // namespace slipstream::engine
