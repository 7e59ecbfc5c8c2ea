// Background work: the log flusher's turn, choosing and running compactions, installing their
// results, reclaiming dropped keyspaces, and the synchronous CompactAll and RunGC.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "clock.h"
#include "engine_impl.h"

namespace slipstream::engine {

bool EngineImpl::DoBackgroundWork() {
  bool did = false;
  uint64_t since_flush = NowMicros() - logs_.last_flush_micros();
  if (logs_.HasSealedBuffer()) {  // writers need the buffer back: everything goes out now
    Status s = logs_.WriteOut(options_.sync_background_flushes, 0);
    if (!s.ok()) RecordBackgroundError(s);
    did = true;
  } else if (logs_.HasUnflushed() && since_flush >= uint64_t(options_.flush_interval_ms) * 1000) {
    bool wrote = false;
    Status s = logs_.PeriodicWriteOut(options_.sync_background_flushes, &wrote);
    if (!s.ok()) RecordBackgroundError(s);
    did = wrote;  // a capture left waiting for the host's log is not work done
  }
  {
    SharedLock lock(&shared_->compaction_mu);
    Version v = levels_.Current();
    int next = levels_.PickCompaction(v);
    Status s;
    if (next == 0) {
      s = CompactL0Locked();
      did = true;
    } else if (next > 0) {
      s = CompactLevelLocked(uint32_t(next));
      did = true;
    } else if (shared_->reclaim_pending.exchange(0)) {
      s = ReclaimDroppedLocked(&did);
    }
    if (!s.ok()) RecordBackgroundError(s);
    reclaimer_.Reclaim();
  }
  if (!did) {
    uint32_t seg = PickGarbageSegment();
    if (seg != 0) {
      Status s = CollectGarbage(seg);
      if (!s.ok() && !s.IsBusy()) RecordBackgroundError(s);
      did = true;
    }
  }
  return did;
}

void EngineImpl::RecordBackgroundError(const Status& s) {
  std::snprintf(shared_->bg_error, sizeof(shared_->bg_error), "%s", s.ToString().c_str());
  shared_->bg_failed.store(1);
}

// The output tree's id, and how the output stores values: tombstones go at the deepest level
// in use, medium values go back in place at the configured (or the last) level.
CompactionSpec EngineImpl::SpecFor(const Version& v, uint32_t dest) {
  bool dest_is_last = levels_.DeepestLevel(v) <= dest;
  bool in_place =
      options_.medium_inplace_level == 0 ? dest_is_last : options_.medium_inplace_level <= dest;
  return CompactionSpec{levels_.NewTreeId(), dest, dest_is_last, in_place};
}

// Merges the immutable memtable into L1.
Status EngineImpl::CompactL0Locked() {
  Version v = levels_.Current();
  if (v.immutable_memtable < 0) return Status::OK();
  // The new level will point at the memtable's large values: they must be on the device
  // before the manifest names the level (the fdatasync in InstallCompaction makes them durable).
  Status flushed = logs_.WriteOut(false, 0);
  if (!flushed.ok()) return flushed;
  if (options_.persist_barrier) {  // the sealed memtable takes no more appends
    Status s = options_.persist_barrier();
    if (!s.ok()) return s;
  }
  Compaction compaction(options_, SpecFor(v, 1), &device_, &segments_, &keyspaces_, &logs_,
                        observer_);
  // The memtable adds its overwritten versions' pointers to the compaction's deltas.
  auto newer = NewMemtableSource(memtables_.Get(v.immutable_memtable), compaction.deltas());
  // Appended medium values stay in the leaves only where those leaves can later move whole
  // into the deepest level (MayMoveLeaves); elsewhere they would be copied at every merge.
  if (options_.keep_leaves && !(observer_ != nullptr && observer_->WantsWholeTrees()) &&
      options_.medium_inplace_level == 0) {
    compaction.SetAppendsOnlyProbe(
        [this, &v](KeyspaceId ks) { return MemtableAppendsOnly(v, ks); });
  }
  // Compaction inputs have every node checked (here and below): a compaction writes what it
  // reads under a fresh checksum, so bytes damaged after this process first checked them would
  // be made permanent; and a compaction reads each input tree once, so a cache would save little.
  std::unique_ptr<MergeSource> older;
  if (!MayKeepLeaves(compaction.spec(), v.levels[1])) {
    older = NewTreeSource(Trees(NodeChecks::kEveryRead), v.levels[1]);
  }
  return RunCompactionLocked(v, newer.get(), older.get(), &compaction, true, 0,
                             v.levels[1].segments);
}

// Whether every key of keyspace `ks` in v's immutable memtable lies above every key of ks in
// v's levels: a seek for the memtable's first key of ks in each level finds no key of ks. A
// keyspace the memtable does not hold counts as one (its entries in L1's merged leaves then
// keep their placement, rather than inline values going to the medium log).
bool EngineImpl::MemtableAppendsOnly(const Version& v, KeyspaceId ks) {
  const MemNode* first = memtables_.Get(v.immutable_memtable).Seek(MakeInternalKey(ks, {}));
  if (first == nullptr || KeyspaceOf(first->key()) != ks) return true;
  for (uint32_t level = 1; level <= options_.max_levels; level++) {
    if (v.levels[level].tree_id == 0) continue;
    TreeIterator it(Trees(NodeChecks::kOncePerProcess), v.levels[level]);
    it.Seek(first->key());
    if (!it.status().ok() || (it.Valid() && KeyspaceOf(it.entry().key) == ks)) return false;
  }
  return true;
}

// Whether a compaction may keep leaves of the destination's tree: not while a replica imports
// every compaction's output as a tree of its own (Send-Index), and not from a tree built with
// another placement or holding too much it no longer uses (CanKeepLeaves).
bool EngineImpl::MayKeepLeaves(const CompactionSpec& spec, const LevelDesc& dest) const {
  return options_.keep_leaves && !(observer_ != nullptr && observer_->WantsWholeTrees()) &&
         CanKeepLeaves(spec, dest, options_.segment_size);
}

// Merges all of `level` into level+1.
Status EngineImpl::CompactLevelLocked(uint32_t level) {
  Version v = levels_.Current();
  if (level < 1 || level >= options_.max_levels || v.levels[level].tree_id == 0) {
    return Status::OK();
  }
  Compaction compaction(options_, SpecFor(v, level + 1), &device_, &segments_, &keyspaces_, &logs_,
                        observer_);
  const LevelDesc& dest = v.levels[level + 1];
  std::unique_ptr<MergeSource> newer, older;
  if (MayMoveLeaves(compaction.spec()) &&
      (dest.tree_id == 0 || MayKeepLeaves(compaction.spec(), dest))) {
    auto leaves = std::make_unique<TreeLeafSource>(Trees(NodeChecks::kEveryRead), v.levels[level]);
    compaction.MoveLeavesOf(leaves.get());
    newer = std::move(leaves);
  } else {
    newer = NewTreeSource(Trees(NodeChecks::kEveryRead), v.levels[level]);
    if (!MayKeepLeaves(compaction.spec(), dest)) {
      older = NewTreeSource(Trees(NodeChecks::kEveryRead), dest);
    }
  }
  return RunCompactionLocked(v, newer.get(), older.get(), &compaction, false, level,
                             v.levels[level].segments + dest.segments);
}

// Whether a merge of a level into the next may move whole leaves of the upper level into its
// output (Compaction::MoveLeavesOf): the output is the deepest level with medium values in
// place, and no replica imports every compaction's output as a tree of its own.
bool EngineImpl::MayMoveLeaves(const CompactionSpec& spec) const {
  return options_.keep_leaves && !(observer_ != nullptr && observer_->WantsWholeTrees()) &&
         spec.drop_tombstones && spec.medium_in_place;
}

// Rewrites one level on its own: drops dropped keyspaces' entries (and, at the last level,
// tombstones), reclaiming their space without waiting for a merge from above.
Status EngineImpl::RewriteLevelLocked(uint32_t level) {
  Version v = levels_.Current();
  if (level < 1 || level > options_.max_levels || v.levels[level].tree_id == 0) {
    return Status::OK();
  }
  Compaction compaction(options_, SpecFor(v, level), &device_, &segments_, &keyspaces_, &logs_,
                        observer_);
  auto newer = NewTreeSource(Trees(NodeChecks::kEveryRead), v.levels[level]);
  auto older = NewEmptySource();
  return RunCompactionLocked(v, newer.get(), older.get(), &compaction, false, 0,
                             v.levels[level].segments);
}

// Runs the merge and installs its output. The tree of `replaced_level` (if not 0) and the old
// tree of the destination are retired (but for the segments of leaves the output kept);
// `from_l0` retires the immutable memtable too.
Status EngineImpl::RunCompactionLocked(const Version& v, MergeSource* newer, MergeSource* older,
                                       Compaction* compaction, bool from_l0,
                                       uint32_t replaced_level, uint64_t input_segments) {
  shared_->counters.device_bytes_read += input_segments * options_.segment_size;
  if (observer_ != nullptr) {
    observer_->OnCompactionBegin(CompactionBeginEvent{compaction->spec().tree_id, from_l0,
                                                      replaced_level, compaction->spec().dest,
                                                      options_.segment_size, options_.node_size});
  }
  Status s = older != nullptr ? compaction->Run(newer, older)
                              : compaction->RunKeepingLeaves(newer, Trees(NodeChecks::kEveryRead),
                                                             v.levels[compaction->spec().dest]);
  if (!s.ok()) {
    AbandonCompaction(*compaction);
    return s;
  }
  shared_->counters.device_bytes_read += compaction->bytes_read();
  shared_->counters.device_bytes_written += compaction->bytes_written();
  shared_->counters.compaction_bytes_written += compaction->bytes_written();
  for (auto [seg, leaves] : compaction->kept_segments()) {
    shared_->counters.compaction_leaves_kept += leaves;
  }
  shared_->counters.compaction_leaves_moved += compaction->leaves_moved();
  if (compaction->rebuilt_filter()) shared_->counters.compaction_filters_rebuilt++;
  return InstallCompaction(v, from_l0, replaced_level, *compaction);
}

// The end event of a compaction that installed `out` at `dest` (what retired is added by the
// caller).
CompactionInstalledEvent EngineImpl::InstalledEvent(uint64_t compaction, uint32_t dest,
                                                    const LevelDesc& out,
                                                    uint64_t manifest_number) {
  CompactionInstalledEvent e;
  e.compaction = compaction;
  e.dest_level = dest;
  e.tree_id = out.tree_id;
  e.height = out.height;
  e.root_segment = out.root.segment;
  e.root_offset = out.root.offset;
  e.bloom_segment = out.bloom_dir.segment;
  e.bloom_offset = out.bloom_dir.offset;
  e.entries = out.entries;
  e.segments = out.segments;
  e.manifest_number = manifest_number;
  e.bloom_blocks = out.bloom_blocks;
  e.bytes = out.bytes;
  e.small_entries = out.small_entries;
  e.medium_entries = out.medium_entries;
  e.large_entries = out.large_entries;
  e.tombstones = out.tombstones;
  return e;
}

// Frees what a compaction that will not be installed wrote (no manifest names it), and tells
// the observer.
void EngineImpl::AbandonCompaction(const Compaction& compaction) {
  // The abandon is reported first: a freed number may be taken (by the large log) at once, and
  // a replica must drop its copies before it hears of the number's next use.
  if (observer_ != nullptr) observer_->OnCompactionAbandoned(compaction.spec().tree_id);
  for (auto [segment, kind] : compaction.segment_kinds()) segments_.Free(segment);
}

// Marks retired the trees of `replaced_level` and `dest` in `before` (0: none) and every index
// and bloom segment they own, adding them to *trees and *segments. The caller holds the
// allocation mutex; the trees are freed when the Reclaimer retires them.
void EngineImpl::MarkTreesRetired(const Version& before, uint32_t replaced_level, uint32_t dest,
                                  std::vector<uint32_t>* trees, std::vector<uint32_t>* segments) {
  for (uint32_t level : {replaced_level, dest}) {
    uint32_t old = level ? before.levels[level].tree_id : 0;
    if (old == 0 || std::find(trees->begin(), trees->end(), old) != trees->end()) continue;
    trees->push_back(old);
    for (uint64_t seg = 1; seg < segments_.count(); seg++) {
      SegmentInfo& info = segments_.info(seg);
      if ((info.kind == uint8_t(SegmentKind::kIndex) ||
           info.kind == uint8_t(SegmentKind::kBloom)) &&
          info.owner == old) {
        info.flags |= kSegmentRetired;
        segments->push_back(uint32_t(seg));
      }
    }
  }
}

// Makes a compaction's result durable and visible: data fsync, deltas, version switch under
// the write mutex, manifest, then retirement of what the old version used.
Status EngineImpl::InstallCompaction(const Version& before, bool from_l0, uint32_t replaced_level,
                                     const Compaction& compaction) {
  const uint32_t dest = compaction.spec().dest;
  Status s = device_.Sync();
  if (!s.ok()) {
    AbandonCompaction(compaction);
    return s;
  }
  std::vector<uint32_t> retired_segments;
  std::vector<uint32_t> retired_trees;
  std::vector<uint32_t> retired_tree_segments;  // for the observer; freed with their trees
  std::string image;
  uint64_t manifest_number;
  std::vector<KeyspaceRecord> keyspaces;
  uint32_t next_keyspace_id = 0;
  {
    SharedLock w(&shared_->write_mu);
    SharedLock a(segments_.mutex());
    const SegmentDeltas& deltas = compaction.segment_deltas();
    for (auto [seg, bytes] : deltas.written) segments_.info(seg).bytes_written += bytes;
    for (auto [seg, bytes] : deltas.invalid) segments_.info(seg).invalid_bytes += bytes;
    for (uint32_t seg : compaction.medium_segments()) segments_.info(seg).flags |= kSegmentSealed;
    // Log segments whose every record is dead, and that no shared buffer still holds.
    for (uint64_t seg = 1; seg < segments_.count(); seg++) {
      SegmentInfo& info = segments_.info(seg);
      if (info.kind != uint8_t(SegmentKind::kLargeLog) &&
          info.kind != uint8_t(SegmentKind::kMediumLog)) {
        continue;
      }
      if ((info.flags & kSegmentSealed) && !(info.flags & kSegmentRetired) &&
          info.bytes_written > 0 && info.invalid_bytes >= info.bytes_written &&
          !logs_.IsBuffered(uint32_t(seg))) {
        info.flags |= kSegmentRetired;
        retired_segments.push_back(uint32_t(seg));
      }
    }
    // The output takes over the segments of the leaves it kept (readers of the old version
    // still reach them: TreeContext::OpenNode), so they are not retired with the old tree.
    for (auto [seg, leaves] : compaction.kept_segments()) {
      segments_.info(seg).owner = compaction.output().tree_id;
    }
    MarkTreesRetired(before, replaced_level, dest, &retired_trees, &retired_tree_segments);
    if (from_l0) {
      levels_.AdvanceCompactedLsn(memtables_.Header(before.immutable_memtable)->max_lsn.load());
      uint64_t first_live = levels_.Latest().active_first_log_sequence;
      for (uint64_t seg = 1; seg < segments_.count(); seg++) {
        SegmentInfo& info = segments_.info(seg);
        if (info.kind == uint8_t(SegmentKind::kL0Log) && !(info.flags & kSegmentRetired) &&
            info.sequence < first_live && !logs_.IsBuffered(uint32_t(seg))) {
          info.flags |= kSegmentRetired;
          retired_segments.push_back(uint32_t(seg));
        }
      }
    }
    const LevelDesc& out = compaction.output();
    levels_.Apply([&](Version& next) {
      if (replaced_level != 0) next.levels[replaced_level] = LevelDesc{};
      next.levels[dest] = out;
      if (from_l0) next.immutable_memtable = -1;
    });
    image = levels_.NextManifest(logs_.last_lsn(), segments_, keyspaces_, logs_);
    manifest_number = levels_.manifest_number();
    if (observer_ != nullptr) {
      keyspaces = keyspaces_.Records();  // what this manifest records
      next_keyspace_id = keyspaces_.next_id();
    }
  }
  s = levels_.WriteManifest(image);
  if (!s.ok()) return s;  // the old segments stay allocated: nothing is freed early
  if (observer_ != nullptr) {
    CompactionInstalledEvent event =
        InstalledEvent(compaction.spec().tree_id, dest, compaction.output(), manifest_number);
    event.from_l0 = from_l0;
    event.replaced_level = replaced_level;
    event.retired_segments = retired_segments;
    event.retired_segments.insert(event.retired_segments.end(), retired_tree_segments.begin(),
                                  retired_tree_segments.end());
    event.medium_segments = compaction.medium_segments();
    event.retired_log_segments = retired_segments;
    event.retired_trees = retired_trees;
    event.keyspaces = std::move(keyspaces);
    event.next_keyspace_id = next_keyspace_id;
    observer_->OnCompactionInstalled(event);
  }
  for (uint32_t tree : retired_trees) reclaimer_.Retire(RetiredItem::kTree, tree);
  for (uint32_t seg : retired_segments) reclaimer_.Retire(RetiredItem::kSegment, seg);
  if (from_l0) {
    reclaimer_.Retire(RetiredItem::kMemtable, uint32_t(before.immutable_memtable));
    // Entries of dropped keyspaces left the memtable: their slots may now be retired.
    if (keyspaces_.AnyDropped()) shared_->reclaim_pending.store(1);
  }
  shared_->counters.compactions++;
  reclaimer_.Reclaim();
  background_.NotifyProgress();
  return Status::OK();
}

// For every dropped keyspace: rewrites the levels that still hold its keys, then retires the
// keyspace's slot once no memtable or level holds any (so the table never fills up with drops).
Status EngineImpl::ReclaimDroppedLocked(bool* rewrote) {
  *rewrote = false;
  std::vector<KeyspaceId> dropped = keyspaces_.Dropped();
  if (dropped.empty()) return Status::OK();
  EpochPin pin(&shared_->epochs);
  auto level_holds = [&](const Version& v, uint32_t level, KeyspaceId id) {
    TreeIterator it(Trees(NodeChecks::kOncePerProcess), v.levels[level]);
    it.Seek(MakeInternalKey(id, {}));
    return it.Valid() && KeyspaceOf(it.entry().key) == id;
  };
  Version v = levels_.Current();
  for (uint32_t level = 1; level <= options_.max_levels; level++) {
    if (v.levels[level].tree_id == 0) continue;
    for (KeyspaceId id : dropped) {
      if (level_holds(v, level, id)) {
        Status s = RewriteLevelLocked(level);
        if (!s.ok()) return s;
        *rewrote = true;
        break;
      }
    }
  }
  SharedLock w(&shared_->write_mu);
  v = levels_.Latest();
  for (KeyspaceId id : dropped) {
    bool present = false;
    std::string prefix = MakeInternalKey(id, {});
    for (int m : {v.active_memtable, v.immutable_memtable}) {
      const MemNode* n = m < 0 ? nullptr : memtables_.Get(m).Seek(prefix);
      present = present || (n && KeyspaceOf(n->key()) == id);
    }
    for (uint32_t level = 1; level <= options_.max_levels && !present; level++) {
      present = v.levels[level].tree_id != 0 && level_holds(v, level, id);
    }
    if (!present) keyspaces_.Find(id)->state.store(KeyspaceSlot::kDeleted);
  }
  return Status::OK();
}

// Switches the memtable and compacts everything into the deepest level in use.
Status EngineImpl::CompactAll() {
  Status s = logs_.WriteOut(true, 0);
  if (!s.ok()) return s;
  for (int attempt = 0;; attempt++) {
    {
      SharedLock lock(&shared_->compaction_mu);
      s = CompactL0Locked();
      if (!s.ok()) return s;
      reclaimer_.Reclaim();
    }
    bool switched;
    {
      SharedLock w(&shared_->write_mu);
      switched =
          memtables_.Get(levels_.Latest().active_memtable).entries() == 0 || SwitchMemtable(true);
    }
    if (switched) break;
    if (attempt > 10000) return Status::Busy("memtable still pinned by open iterators");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  SharedLock lock(&shared_->compaction_mu);
  s = CompactL0Locked();
  Version v = levels_.Current();
  uint32_t deepest = levels_.DeepestLevel(v);
  for (uint32_t level = 1; s.ok() && level < deepest; level++) {
    if (levels_.Current().levels[level].tree_id != 0) s = CompactLevelLocked(level);
  }
  bool rewrote;
  if (s.ok()) s = ReclaimDroppedLocked(&rewrote);
  reclaimer_.Reclaim();
  return s;
}

// Evacuates every eligible large-log segment.
Status EngineImpl::RunGC() {
  while (uint32_t seg = PickGarbageSegment()) {
    Status s = CollectGarbage(seg);
    if (s.IsBusy()) {
      SharedLock lock(&shared_->compaction_mu);
      s = CompactL0Locked();
    }
    if (!s.ok()) return s;
  }
  SharedLock lock(&shared_->compaction_mu);
  reclaimer_.Reclaim();
  return Status::OK();
}

}  // namespace slipstream::engine
