// Verify: a full structural check, like amcheck. Walks every level's B+-tree checking node
// checksums, key order (within nodes, across leaves, and against the parent's pivots), that
// every pointer lands in an allocated segment of the right kind, that bloom filters admit
// every key, and that each log segment's live bytes equal the bytes its referrers point to.
#include <map>
#include <mutex>
#include <unordered_map>

#include "engine_impl.h"

namespace slipstream::engine {

namespace {

class TreeChecker {
 public:
  TreeChecker(const LogSet* values, const TreeContext& ctx, const LevelDesc& desc, uint32_t level,
              std::unordered_map<uint32_t, uint64_t>* referenced)
      : values_(values), ctx_(ctx), desc_(desc), level_(level), referenced_(referenced) {}

  Status Run() {
    Status s = CheckBloomFilter(ctx_, desc_);
    if (!s.ok()) return Fail(s.message());
    s = Walk(desc_.root, desc_.height, std::string_view(), nullptr);
    if (s.ok() && entries_ != desc_.entries) {
      s = Fail("holds " + std::to_string(entries_) + " entries, its descriptor says " +
               std::to_string(desc_.entries));
    }
    return s;
  }

 private:
  Status Fail(const std::string& what) {
    return Status::Corruption("level " + std::to_string(level_) + ": " + what);
  }

  // Checks the subtree at p: its keys are >= low, < high (if given), strictly increasing.
  Status Walk(DevPtr p, uint32_t height, std::string_view low, const std::string* high) {
    NodeView node;
    Status s = ctx_.OpenNode(p, desc_, &node);
    if (!s.ok()) return Fail(s.message() + " at segment " + std::to_string(p.segment));
    if (node.height() != height) return Fail("node height does not match its depth");
    std::string prev;
    for (int i = 0; i < node.count(); i++) {
      std::string_view key;
      s = node.KeyAt(i, &key);
      if (!s.ok()) return Fail(s.message());
      if ((i > 0 && key <= prev) || key < low || (high && key >= *high)) {
        return Fail("keys out of order in segment " + std::to_string(p.segment));
      }
      if (i == 0 && !low.empty() && key != low)
        return Fail("pivot does not match child's first key");
      prev.assign(key);
      if (node.is_leaf()) {
        s = CheckLeafEntry(node, i);
      } else {
        DevPtr child;
        std::string_view pivot;
        s = node.Index(i, &pivot, &child);
        std::string next_pivot;
        const std::string* child_high = high;
        if (s.ok() && i + 1 < node.count()) {
          std::string_view np;
          s = node.KeyAt(i + 1, &np);
          next_pivot.assign(np);
          child_high = &next_pivot;
        }
        std::string pivot_copy(pivot);
        if (s.ok()) s = Walk(child, height - 1, pivot_copy, child_high);
      }
      if (!s.ok()) return s;
    }
    return Status::OK();
  }

  Status CheckLeafEntry(const NodeView& node, int i) {
    LeafEntry e;
    Status s = node.Leaf(i, &e);
    if (!s.ok()) return Fail(s.message());
    if (!last_key_.empty() && e.key <= last_key_) return Fail("leaves out of order");
    last_key_.assign(e.key);
    entries_++;
    if (!TreeMayContain(ctx_, desc_, HashKey(e.key))) return Fail("bloom filter misses a key");
    // What the level was built to hold: a compaction keeps or moves leaves on this promise.
    if ((desc_.build_flags & kTreeTombstonesDropped) && e.kind == ValueKind::kTombstone) {
      return Fail("a tombstone in a level built without them");
    }
    if ((desc_.build_flags & kTreeMediumInPlace) && e.kind == ValueKind::kMediumPtr) {
      return Fail("a medium-log pointer in a level built with medium values in place");
    }
    if (e.kind == ValueKind::kMediumPtr || RefersToLargeLog(e.kind)) {
      std::string value;
      s = values_->ReadValue(e.key, e, &value);
      if (!s.ok()) return Fail(s.message());
      if (OwnsRecord(e)) (*referenced_)[e.ptr.where.segment] += e.ptr.record_bytes;
    }
    return Status::OK();
  }

  const LogSet* values_;
  TreeContext ctx_;
  LevelDesc desc_;
  uint32_t level_;
  std::unordered_map<uint32_t, uint64_t>* referenced_;
  std::string last_key_;
  uint64_t entries_ = 0;
};

}  // namespace

Status EngineImpl::Verify() {
  SharedLock compaction(&shared_->compaction_mu);
  SharedLock write(&shared_->write_mu);
  Version v = levels_.Current();
  std::unordered_map<uint32_t, uint64_t> referenced;
  // Every checksum, every time: a node this process checked before may have changed since.
  TreeContext ctx = Trees(NodeChecks::kEveryRead);
  std::map<uint32_t, uint32_t> live_trees;  // tree id -> level
  for (uint32_t level = 1; level <= options_.max_levels; level++) {
    const LevelDesc& d = v.levels[level];
    if (d.tree_id == 0) continue;
    live_trees[d.tree_id] = level;
    Status s = TreeChecker(&logs_, ctx, d, level, &referenced).Run();
    if (!s.ok()) return s;
  }
  // Memtables: every version holds its pointer until compaction drops it.
  for (int m : {v.active_memtable, v.immutable_memtable}) {
    if (m < 0) continue;
    MemTable mem = memtables_.Get(m);
    std::string prev;
    for (const MemNode* n = mem.First(); n; n = mem.Next(n)) {
      if (!prev.empty() && n->key() < prev) return Status::Corruption("memtable out of order");
      prev.assign(n->key());
      if (RefersToLargeLog(n->value_kind())) {
        LeafEntry e;
        Status s = MemNodeEntry(n, &e);
        if (s.ok()) {
          std::string value;
          s = logs_.ReadValue(n->key(), e, &value);
        }
        if (!s.ok()) return Status::Corruption("memtable: " + s.message());
        if (OwnsRecord(e)) referenced[e.ptr.where.segment] += e.ptr.record_bytes;
      }
    }
  }
  // Segment accounting.
  SharedLock alloc(segments_.mutex());
  std::map<uint32_t, uint64_t> tree_segments;
  for (uint64_t seg = 1; seg < segments_.count(); seg++) {
    const SegmentInfo& info = segments_.info(seg);
    if (info.kind == uint8_t(SegmentKind::kFree) ||
        (info.flags & (kSegmentRetired | kSegmentPending))) {
      continue;  // (Pending: an import in flight, which no level names yet)
    }
    std::string where =
        "segment " + std::to_string(seg) + " (" + SegmentKindName(SegmentKind(info.kind)) + ")";
    switch (SegmentKind(info.kind)) {
      case SegmentKind::kIndex:
      case SegmentKind::kBloom:
        if (!live_trees.count(info.owner))
          return Status::Corruption(where + " belongs to no level");
        tree_segments[info.owner]++;
        break;
      case SegmentKind::kMediumLog:
      case SegmentKind::kLargeLog: {
        if (info.invalid_bytes > info.bytes_written)
          return Status::Corruption(where + " has more invalid than written bytes");
        uint64_t live = info.bytes_written - info.invalid_bytes;
        uint64_t refs = referenced.count(uint32_t(seg)) ? referenced[uint32_t(seg)] : 0;
        // An imported segment counts the bytes shipped, and is retired when its primary retires
        // it: the primary's memtables may still reference what this replica's levels do not.
        if ((info.flags & kSegmentImported) && refs > info.bytes_written) {
          return Status::Corruption(where + " is referenced beyond the " +
                                    std::to_string(info.bytes_written) + " bytes imported");
        }
        if (!(info.flags & kSegmentImported) && live != refs) {
          return Status::Corruption(where + " accounts " + std::to_string(live) +
                                    " live bytes but " + std::to_string(refs) + " are referenced");
        }
        referenced.erase(uint32_t(seg));
        break;
      }
      case SegmentKind::kL0Log:
      case SegmentKind::kReserved:
        break;
      default:
        return Status::Corruption(where + " has an unknown kind");
    }
  }
  if (!referenced.empty()) {
    return Status::Corruption("a value pointer lands in segment " +
                              std::to_string(referenced.begin()->first) +
                              ", which is not an allocated log segment");
  }
  for (auto [tree, level] : live_trees) {
    if (tree_segments[tree] != v.levels[level].segments) {
      return Status::Corruption(
          "level " + std::to_string(level) + " owns " + std::to_string(tree_segments[tree]) +
          " segments, its descriptor says " + std::to_string(v.levels[level].segments));
    }
  }
  return Status::OK();
}

}  // namespace slipstream::engine
