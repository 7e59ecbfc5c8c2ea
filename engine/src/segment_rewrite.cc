// Rewriting the segment numbers inside a shipped index segment: plan every change while
// validating, then apply the plan, so that a refused image is never half rewritten.
#include "segment_rewrite.h"

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "coding.h"
#include "crc32c.h"
#include "node.h"

namespace slipstream::engine {

namespace {

// The crc is rewritten alone, as the header's second u32 (NodeBuilder::Finish stores it there).
static_assert(offsetof(NodeHeader, crc) == 4);

// One 4-byte segment field to overwrite, found and mapped while validating.
struct Patch {
  size_t node;      // offset of the node holding the field, in the image
  size_t position;  // offset of the field, in the image
  uint32_t local;   // the mapped segment number
};

// Prefixes a failure's message with the node it concerns, keeping its code (a map's NotFound
// stays NotFound).
Status AtNode(const Status& s, size_t node) {
  std::string msg = "index segment node at offset " + std::to_string(node) + ": " + s.message();
  switch (s.code()) {
    case Status::Code::kNotFound:
      return Status::NotFound(msg);
    case Status::Code::kInvalidArgument:
      return Status::InvalidArgument(msg);
    case Status::Code::kIOError:
      return Status::IOError(msg);
    case Status::Code::kBusy:
      return Status::Busy(msg);
    default:
      return Status::Corruption(msg);
  }
}

// Validates the nodes of one image and records the changes they need, without writing.
class Planner {
 public:
  Planner(const char* image, uint32_t node_size, uint32_t tree_id, const SegmentMap& map_log,
          const SegmentMap& map_large, const SegmentMap& map_index)
      : image_(image),
        node_size_(node_size),
        tree_id_(tree_id),
        map_log_(map_log),
        map_large_(map_large),
        map_index_(map_index) {}

  // Plans the node at `node`; `last` says whether it is the image's final slot.
  Status PlanNode(size_t node, bool last);

  const std::vector<Patch>& patches() const { return patches_; }
  const RewriteStats& stats() const { return stats_; }

 private:
  // Queues the segment field at `field` of the node at `node`, mapped through `map`.
  Status AddPatch(size_t node, const char* field, const SegmentMap& map);
  Status PlanLeaf(size_t node, const NodeView& view);
  Status PlanIndex(size_t node, const NodeView& view);
  Status PlanBloomDir(size_t node, const NodeHeader& h);

  const char* image_;
  uint32_t node_size_;
  uint32_t tree_id_;
  const SegmentMap& map_log_;    // medium pointers
  const SegmentMap& map_large_;  // large pointers
  const SegmentMap& map_index_;
  std::vector<Patch> patches_;
  RewriteStats stats_;
};

// The writer emits a node's entries in offset order, so its fields come strictly increasing;
// anything else (two offsets naming one entry) would patch a byte twice and is refused.
Status Planner::AddPatch(size_t node, const char* field, const SegmentMap& map) {
  size_t position = size_t(field - image_);
  if (!patches_.empty() && patches_.back().node == node &&
      position < patches_.back().position + 4) {
    return Status::Corruption("entries overlap or are out of order");
  }
  uint32_t local;
  Status s = map(DecodeFixed32(field), &local);
  if (!s.ok()) return s;
  patches_.push_back(Patch{node, position, local});
  return Status::OK();
}

// NodeView::Leaf decodes each ValuePtr from the bytes right after the key, and the key's view
// points into the image, so the segment field is found there without a second parser.
Status Planner::PlanLeaf(size_t node, const NodeView& view) {
  for (int i = 0; i < view.count(); i++) {
    LeafEntry e;
    Status s = view.Leaf(i, &e);
    if (!s.ok()) return s;
    if (e.kind != ValueKind::kMediumPtr && !RefersToLargeLog(e.kind)) continue;
    s = AddPatch(node, e.key.data() + e.key.size(),
                 RefersToLargeLog(e.kind) ? map_large_ : map_log_);
    if (!s.ok()) return s;
    stats_.value_pointers++;
  }
  stats_.leaves++;
  return Status::OK();
}

// Likewise NodeView::Index reads the child DevPtr right after the key; a child offset off the
// node grid is one the writer (NextNodeSlot) cannot produce.
Status Planner::PlanIndex(size_t node, const NodeView& view) {
  for (int i = 0; i < view.count(); i++) {
    std::string_view key;
    DevPtr child;
    Status s = view.Index(i, &key, &child);
    if (!s.ok()) return s;
    if (child.offset % node_size_ != 0) return Status::Corruption("child offset off the node grid");
    s = AddPatch(node, key.data() + key.size(), map_index_);
    if (!s.ok()) return s;
    stats_.child_pointers++;
  }
  stats_.index_nodes++;
  return Status::OK();
}

// A directory has no checksum, so its header must be exactly what WriteBloom writes: crc and
// height zero, at least one bloom segment (BloomBuilder makes at least one block), and `used`
// covering the segment list and nothing else.
Status Planner::PlanBloomDir(size_t node, const NodeHeader& h) {
  if (h.crc != 0 || h.height != 0 || h.count == 0 ||
      h.used != kNodeHeaderSize + 4 * uint32_t(h.count) || h.used > node_size_) {
    return Status::Corruption("bad bloom directory header");
  }
  for (uint32_t i = 0; i < h.count; i++) {
    Status s = AddPatch(node, image_ + node + kNodeHeaderSize + 4 * i, map_index_);
    if (!s.ok()) return s;
  }
  stats_.bloom_dirs++;
  return Status::OK();
}

// LEAF/INDX nodes go through NodeView::Open with the checksum verified (it also refuses an
// unknown magic, used > node_size and a zero count), then their entries are bounds-checked.
Status Planner::PlanNode(size_t node, bool last) {
  const char* p = image_ + node;
  NodeHeader h;
  std::memcpy(&h, p, sizeof(h));
  Status s;
  if (h.magic == kBloomDirMagic) {
    if (!last) {
      s = Status::Corruption("bloom directory before the last node");
    } else if (h.tree_id != tree_id_) {
      s = Status::Corruption("node of another tree");
    } else {
      s = PlanBloomDir(node, h);
    }
  } else {
    NodeView view;
    s = NodeView::Open(p, node_size_, true, &view);
    if (s.ok() && view.tree_id() != tree_id_) s = Status::Corruption("node of another tree");
    if (s.ok()) s = view.is_leaf() ? PlanLeaf(node, view) : PlanIndex(node, view);
  }
  return s.ok() ? s : AtNode(s, node);
}

// Recomputes a rewritten LEAF/INDX node's crc over [8, used) as NodeBuilder::Finish does; a
// bloom directory has none.
void Reseal(char* node) {
  NodeHeader h;
  std::memcpy(&h, node, sizeof(h));
  if (h.magic == kBloomDirMagic) return;
  EncodeFixed32(node + offsetof(NodeHeader, crc), crc32c::Value(node + 8, h.used - 8));
}

// Writes every planned field and reseals each node once its last field is written; the plan
// was fully validated, so nothing here can fail.
void Apply(char* image, const std::vector<Patch>& patches) {
  for (size_t i = 0; i < patches.size(); i++) {
    EncodeFixed32(image + patches[i].position, patches[i].local);
    if (i + 1 == patches.size() || patches[i + 1].node != patches[i].node) {
      Reseal(image + patches[i].node);
    }
  }
}

}  // namespace

// Plans the whole image before applying anything, so the maps are consulted and every node is
// checked while the image is still untouched.
Status RewriteIndexSegment(char* image, size_t size, uint32_t node_size, uint32_t tree_id,
                           const SegmentMap& map_log, const SegmentMap& map_index,
                           RewriteStats* stats) {
  return RewriteIndexSegment(image, size, node_size, tree_id, map_log, map_log, map_index, stats);
}

// The same with medium and large pointers mapped apart.
Status RewriteIndexSegment(char* image, size_t size, uint32_t node_size, uint32_t tree_id,
                           const SegmentMap& map_medium, const SegmentMap& map_large,
                           const SegmentMap& map_index, RewriteStats* stats) {
  if (node_size <= kNodeHeaderSize || node_size > 65536 || (node_size & (node_size - 1)) != 0) {
    return Status::InvalidArgument("node_size must be a power of two above the node header");
  }
  // FlushSegment writes segment_pos_, a whole number of node slots, and never an empty prefix.
  if (size == 0 || size % node_size != 0) {
    return Status::Corruption("index segment image of " + std::to_string(size) +
                              " bytes is not a whole number of nodes");
  }
  Planner planner(image, node_size, tree_id, map_medium, map_large, map_index);
  for (size_t node = 0; node < size; node += node_size) {
    Status s = planner.PlanNode(node, node + node_size == size);
    if (!s.ok()) return s;
  }
  Apply(image, planner.patches());
  if (stats != nullptr) *stats = planner.stats();
  return Status::OK();
}

}  // namespace slipstream::engine
