// B+-tree building and reading.
#include "btree.h"

#include <cstring>

#include "coding.h"

namespace slipstream::engine {

TreeBuilder::TreeBuilder(const TreeShape& shape, SegmentSink* sink, uint32_t tree_id)
    : shape_(shape),
      sink_(sink),
      tree_id_(tree_id),
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

// Classifies the entry for the level's statistics and appends it to the current leaf.
Status TreeBuilder::Add(const LeafEntry& e) {
  if (entries_ > 0 && e.key.compare(last_key_) <= 0) {
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
  bloom_.AddHash(HashKey(e.key));
  entries_++;
  stats_.entries++;
  if (e.kind == ValueKind::kTombstone) {
    stats_.tombstones++;
    stats_.bytes += e.key.size();
  } else {
    uint64_t value_size = e.kind == ValueKind::kInline ? e.inline_value.size() : e.ptr.value_size;
    uint64_t total = e.key.size() + value_size;
    stats_.bytes += total;
    if (total < shape_.small_threshold) {
      stats_.small_entries++;
    } else if (total < shape_.large_threshold) {
      stats_.medium_entries++;
    } else {
      stats_.large_entries++;
    }
  }
  return Status::OK();
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
  std::string filter = bloom_.Finish();
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
  if (entries_ == 0) return Status::InvalidArgument("empty tree");
  Status s = FlushLeaf();
  if (s.ok()) s = BuildIndexLayers(&stats_.root, &stats_.height);
  if (s.ok()) s = WriteBloom(&stats_);
  if (s.ok()) s = FlushSegment();
  stats_.tree_id = tree_id_;
  *desc = stats_;
  return s;
}

// Rejects pointers outside the tree's own index segments before touching memory.
Status TreeContext::OpenNode(DevPtr p, uint32_t tree_id, NodeView* node) const {
  if (p.segment == 0 || p.segment >= max_segments || p.offset % node_size != 0 ||
      uint64_t(p.offset) + node_size > segment_size) {
    return Status::Corruption("node pointer out of bounds");
  }
  const SegmentInfo& info = segments[p.segment];
  if (info.kind != uint8_t(SegmentKind::kIndex) || info.owner != tree_id) {
    return Status::Corruption("node pointer into a segment the tree does not own");
  }
  Status s = NodeView::Open(device->Segment(p.segment) + p.offset, node_size, verify_crc, node);
  if (s.ok() && node->tree_id() != tree_id) return Status::Corruption("node of another tree");
  return s;
}

bool TreeMayContain(const TreeContext& ctx, const LevelDesc& desc, uint64_t hash) {
  if (desc.bloom_blocks == 0) return true;
  const SegmentInfo& dir_info = ctx.segments[desc.bloom_dir.segment];
  if (dir_info.kind != uint8_t(SegmentKind::kIndex)) return true;  // Verify reports it
  const char* dir = ctx.device->Segment(desc.bloom_dir.segment) + desc.bloom_dir.offset;
  uint64_t block = BloomBlockOf(hash, desc.bloom_blocks);
  uint64_t per_segment = ctx.segment_size / kBloomBlockBytes;
  uint32_t seg = DecodeFixed32(dir + kNodeHeaderSize + 4 * (block / per_segment));
  if (seg == 0 || seg >= ctx.max_segments ||
      ctx.segments[seg].kind != uint8_t(SegmentKind::kBloom)) {
    return true;
  }
  return BloomTest(ctx.device->Segment(seg) + (block % per_segment) * kBloomBlockBytes, hash);
}

Status TreeGet(const TreeContext& ctx, const LevelDesc& desc, std::string_view ikey, bool* found,
               LeafEntry* entry) {
  *found = false;
  NodeView node;
  Status s = ctx.OpenNode(desc.root, desc.tree_id, &node);
  while (s.ok() && !node.is_leaf()) {
    int i;
    s = node.LowerBound(ikey, &i);
    if (!s.ok()) return s;
    std::string_view key;
    DevPtr child;
    if (i < node.count()) {
      s = node.Index(i, &key, &child);
      if (!s.ok()) return s;
    }
    if (i == node.count() || key != ikey) {
      if (i == 0) return Status::OK();  // smaller than every key in the tree
      s = node.Index(i - 1, &key, &child);
      if (!s.ok()) return s;
    }
    s = ctx.OpenNode(child, desc.tree_id, &node);
  }
  if (!s.ok()) return s;
  int i;
  s = node.LowerBound(ikey, &i);
  if (!s.ok() || i == node.count()) return s;
  s = node.Leaf(i, entry);
  if (s.ok() && entry->key == ikey) *found = true;
  return s;
}

void TreeIterator::Fail(const Status& s) {
  status_ = s;
  valid_ = false;
  path_.clear();
}

void TreeIterator::DescendLeftmost(DevPtr p) {
  while (true) {
    NodeView node;
    Status s = ctx_.OpenNode(p, desc_.tree_id, &node);
    if (!s.ok()) return Fail(s);
    path_.push_back(Frame{node, 0});
    if (node.is_leaf()) return;
    std::string_view key;
    s = node.Index(0, &key, &p);
    if (!s.ok()) return Fail(s);
  }
}

// Positions on the first entry >= target.
void TreeIterator::Seek(std::string_view target) {
  path_.clear();
  valid_ = false;
  if (desc_.tree_id == 0 || !status_.ok()) return;
  DevPtr p = desc_.root;
  while (true) {
    NodeView node;
    Status s = ctx_.OpenNode(p, desc_.tree_id, &node);
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
        DescendLeftmost(child);
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

void TreeIterator::Next() {
  if (!valid_) return;
  path_.back().index++;
  LoadEntry();
}

}  // namespace slipstream::engine
