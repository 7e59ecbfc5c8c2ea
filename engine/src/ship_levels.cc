// ShipLevels: this node's levels as they stand, reported as the events of one compaction per
// level, for a new Send-Index replica to import (see engine.h and docs/replication.md,
// "Seeding a Send-Index replica").
#include <algorithm>
#include <cstring>
#include <map>
#include <tuple>

#include "bloom.h"
#include "engine_impl.h"
#include "node.h"
#include "slipstream/engine/log_scanner.h"

namespace slipstream::engine {

namespace {

// One index segment of a tree: its used prefix, and the heights of the nodes it holds.
struct TreeSegment {
  uint32_t segment;
  uint32_t used;
  uint16_t min_height, max_height;
};

// Reads the node headers of an index segment from offset 0 while they belong to `tree` (the
// bytes after the tree's last node are left from an earlier use of the segment, of another
// tree: ids are never reused). The bloom directory does not count towards the heights.
TreeSegment MeasureIndexSegment(const char* base, uint32_t segment, uint32_t segment_size,
                                uint32_t node_size, uint32_t tree) {
  TreeSegment t{segment, 0, UINT16_MAX, 0};
  for (uint32_t off = 0; off + node_size <= segment_size; off += node_size) {
    NodeHeader h;
    std::memcpy(&h, base + off, sizeof(h));
    if (h.tree_id != tree ||
        (h.magic != kLeafMagic && h.magic != kIndexMagic && h.magic != kBloomDirMagic)) {
      break;
    }
    t.used = off + node_size;
    if (h.magic != kBloomDirMagic) {
      t.min_height = std::min(t.min_height, h.height);
      t.max_height = std::max(t.max_height, h.height);
    }
  }
  if (t.min_height == UINT16_MAX) t.min_height = 0;
  return t;
}

}  // namespace

// Reports the large log, then each level: its begin, (with the first) every medium-log
// segment, its bloom segments, its index segments children first, its end.
Status EngineImpl::ShipLevels(EngineObserver* observer) {
  SharedLock compacting(&shared_->compaction_mu);
  // A level that kept leaves of older trees is rewritten whole first: a replica imports each
  // tree from the segments shipped with it, which must hold every node of the tree and no
  // other tree's (the events of the rewrite come before the seed's, which covers them).
  for (uint32_t level = 1; level <= options_.max_levels; level++) {
    const LevelDesc d = levels_.Current().levels[level];
    if (d.tree_id != 0 && d.first_tree_id != d.tree_id) {
      Status s = RewriteLevelLocked(level);
      if (!s.ok()) return s;
    }
  }
  // No write-out runs while the large log is read: one reported before this began but not yet
  // on the device would leave a gap between what is read here and the next live range.
  SharedLock flushing(&shared_->logs.flush_mu);
  observer->OnSeedBegin();
  Version v = levels_.Current();
  std::vector<std::pair<uint64_t, uint32_t>> large;  // (sequence, segment): copies keep theirs
  std::vector<uint32_t> medium;
  std::map<uint32_t, std::vector<uint32_t>> tree_segments;  // kIndex only
  {
    SharedLock a(segments_.mutex());
    for (uint64_t seg = 1; seg < segments_.count(); seg++) {
      const SegmentInfo& info = segments_.info(seg);
      if (info.flags & (kSegmentRetired | kSegmentPending)) continue;
      if (info.kind == uint8_t(SegmentKind::kLargeLog)) large.emplace_back(info.sequence, seg);
      if (info.kind == uint8_t(SegmentKind::kMediumLog)) medium.push_back(uint32_t(seg));
      if (info.kind == uint8_t(SegmentKind::kIndex)) {
        tree_segments[info.owner].push_back(uint32_t(seg));
      }
    }
  }
  std::sort(large.begin(), large.end());
  const uint32_t size = options_.segment_size;
  for (auto [sequence, seg] : large) {
    LogScan scan = ScanLogSegment(device_.Segment(seg), size);
    if (!scan.header_ok || scan.valid_end == 0) continue;  // not written out yet
    observer->OnLogWrite(LogWriteEvent{ObservedLog::kLarge, seg, sequence, 0,
                                       std::string_view(device_.Segment(seg), scan.valid_end)});
  }
  flushing.Release();
  // Levels in the order of their trees' ids, as their compactions ran: a replica skips a
  // compaction older than one it installed.
  std::vector<uint32_t> order_of_levels;
  for (uint32_t level = 1; level <= options_.max_levels; level++) {
    if (v.levels[level].tree_id != 0) order_of_levels.push_back(level);
  }
  std::sort(order_of_levels.begin(), order_of_levels.end(),
            [&v](uint32_t a, uint32_t b) { return v.levels[a].tree_id < v.levels[b].tree_id; });
  bool medium_sent = false;
  for (uint32_t level : order_of_levels) {
    const LevelDesc& d = v.levels[level];
    observer->OnCompactionBegin(
        CompactionBeginEvent{d.tree_id, false, 0, level, size, options_.node_size});
    if (!medium_sent) {
      for (uint32_t seg : medium) {
        observer->OnCompactionSegment(
            CompactionSegmentEvent{d.tree_id, level, CompactionSegmentKind::kMedium, seg,
                                   std::string_view(device_.Segment(seg), size)});
      }
      medium_sent = true;
    }
    // Bloom segments, in the directory's order, before the segment holding the directory.
    if (d.bloom_dir.segment != 0) {
      // The directory has no checksum: where it lies and what it lists are checked before
      // either is read.
      Status bloom = d.bloom_blocks == 0 ? Status::Corruption("no bloom blocks")
                                         : CheckBloomFilter(Trees(NodeChecks::kEveryRead), d);
      if (!bloom.ok()) {
        return Status::Corruption("level " + std::to_string(level) +
                                  ": bad bloom directory: " + bloom.message());
      }
      NodeHeader h;
      const char* dir = device_.Segment(d.bloom_dir.segment) + d.bloom_dir.offset;
      std::memcpy(&h, dir, sizeof(h));
      uint64_t per_segment = size / kBloomBlockBytes;
      for (uint32_t i = 0; i < h.count; i++) {
        uint32_t seg;
        std::memcpy(&seg, dir + kNodeHeaderSize + 4 * i, 4);
        uint64_t blocks = std::min<uint64_t>(d.bloom_blocks - i * per_segment, per_segment);
        observer->OnCompactionSegment(CompactionSegmentEvent{
            d.tree_id, level, CompactionSegmentKind::kBloom, seg,
            std::string_view(device_.Segment(seg), blocks * kBloomBlockBytes)});
      }
    }
    // Index segments in the order they were written (layers are written one after the
    // other, so that is the order of their lowest, then highest, node heights): every child
    // arrives before its parent.
    std::vector<TreeSegment> order;
    for (uint32_t seg : tree_segments[d.tree_id]) {
      order.push_back(
          MeasureIndexSegment(device_.Segment(seg), seg, size, options_.node_size, d.tree_id));
    }
    std::sort(order.begin(), order.end(), [](const TreeSegment& a, const TreeSegment& b) {
      return std::tie(a.min_height, a.max_height, a.segment) <
             std::tie(b.min_height, b.max_height, b.segment);
    });
    for (const TreeSegment& t : order) {
      if (t.used == 0) return Status::Corruption("an index segment of a level holds no node");
      observer->OnCompactionSegment(
          CompactionSegmentEvent{d.tree_id, level, CompactionSegmentKind::kIndex, t.segment,
                                 std::string_view(device_.Segment(t.segment), t.used)});
    }
    CompactionInstalledEvent installed =
        InstalledEvent(d.tree_id, level, d, levels_.manifest_number());
    installed.keyspaces = keyspaces_.Records();
    installed.next_keyspace_id = keyspaces_.next_id();
    observer->OnCompactionInstalled(installed);
  }
  std::vector<uint32_t> level_trees(options_.max_levels + 1, 0);
  for (uint32_t level = 1; level <= options_.max_levels; level++) {
    level_trees[level] = v.levels[level].tree_id;
  }
  observer->OnSeedEnd(level_trees);
  return Status::OK();
}

}  // namespace slipstream::engine
