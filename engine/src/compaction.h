// Compaction: what builds a new level. A compaction merges a newer input over an older one
// (the immutable memtable over L1, level i over level i+1, or one level over nothing to
// rewrite it), applies hybrid placement to every surviving entry, and writes a new B+-tree,
// its bloom filter and its medium-log run to freshly allocated segments. It changes nothing
// that is installed: the engine installs the output (background.cc) or, on failure, the
// output's segments are simply never named by a manifest.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "btree.h"
#include "device.h"
#include "keyspace_table.h"
#include "log_set.h"
#include "memtable.h"
#include "segment_table.h"
#include "slipstream/engine/observer.h"
#include "slipstream/engine/options.h"

namespace slipstream::engine {

// Per-segment changes a compaction or GC makes, applied when it is installed.
struct SegmentDeltas {
  std::unordered_map<uint32_t, uint64_t> written;
  std::unordered_map<uint32_t, uint64_t> invalid;
};

// One sorted input of a merge.
class MergeSource {
 public:
  virtual ~MergeSource() = default;
  virtual bool Valid() const = 0;
  virtual const LeafEntry& entry() const = 0;
  virtual void Next() = 0;
  virtual Status status() const = 0;
};

// The newest version of each key of a memtable; older versions are added to `deltas` as
// discarded.
std::unique_ptr<MergeSource> NewMemtableSource(MemTable memtable, SegmentDeltas* deltas);
// Every entry of a level's tree.
std::unique_ptr<MergeSource> NewTreeSource(const TreeContext& trees, const LevelDesc& level);
// No entries (the older input of a level rewritten on its own).
std::unique_ptr<MergeSource> NewEmptySource();

// A leaf of a tree, known from its parent: where it is and its first key (the pivot).
struct LeafRef {
  std::string first;
  DevPtr where;
};

// Every entry of a level's tree, read leaf by leaf, so that a merge into the deepest level can
// take whole leaves of it into its output (Compaction::MoveLeavesOf) instead of copying their
// entries. Leaves are listed from the index nodes when it is made; status() says if that failed.
class TreeLeafSource : public MergeSource {
 public:
  TreeLeafSource(const TreeContext& ctx, const LevelDesc& desc);
  bool Valid() const override { return leaf_index_ < leaves_.size() && status_.ok(); }
  const LeafEntry& entry() const override { return entry_; }
  void Next() override;
  Status status() const override { return status_; }

  const LevelDesc& desc() const { return desc_; }
  // Whether the current entry is its leaf's first.
  bool AtLeafStart() const { return Valid() && entry_index_ == 0; }
  size_t leaf_index() const { return leaf_index_; }
  size_t leaf_count() const { return leaves_.size(); }
  const LeafRef& leaf(size_t i) const { return leaves_[i]; }
  // Opens leaf i of the tree (checked as every compaction input is).
  Status OpenLeaf(size_t i, NodeView* leaf) const;
  // Goes past `n` leaves from the current one on (the merge took them whole); the current
  // entry must be a leaf's first.
  void SkipLeaves(size_t n);

 private:
  // Loads entry entry_index_ of leaf leaf_index_, opening the leaf if it is the first.
  void Load();

  TreeContext ctx_;
  LevelDesc desc_;
  std::vector<LeafRef> leaves_;
  size_t leaf_index_ = 0;
  int entry_index_ = 0;
  NodeView node_;
  LeafEntry entry_{};
  Status status_;
};

// The shortest run of a destination's leaves RunKeepingLeaves keeps: each run ends the leaf
// being written early, so runs much shorter than this would leave many part-filled leaves.
constexpr size_t kMinKeptLeaves = 8;

// What one compaction does, decided by the engine before it runs.
struct CompactionSpec {
  uint32_t tree_id;      // of the output tree; also the compaction's id for observers
  uint32_t dest;         // level the output is installed at
  bool drop_tombstones;  // the output is the deepest level
  bool medium_in_place;  // medium values go back into the leaves
};

// Whether a compaction of `spec` may keep leaves of `dest` (RunKeepingLeaves): dest was built
// with the same placement of medium values, without tombstones if the output drops them, and
// does not already waste more than a quarter of its segments on bytes it no longer uses.
bool CanKeepLeaves(const CompactionSpec& spec, const LevelDesc& dest, uint32_t segment_size);

class Compaction : private SegmentSink {
 public:
  Compaction(const Options& options, const CompactionSpec& spec, Device* device,
             SegmentTable* segments, const KeyspaceTable* keyspaces, const LogSet* values,
             EngineObserver* observer);

  // Where inputs record what they discard (memtable sources need it at construction).
  SegmentDeltas* deltas() { return &deltas_; }
  // What the compaction wrote into and invalidated in log segments (applied on install).
  const SegmentDeltas& segment_deltas() const { return deltas_; }

  // Merges `newer` over `older` and writes the output (an empty result: an empty level).
  Status Run(MergeSource* newer, MergeSource* older);
  // Merges `newer` over the tree `dest` describes, keeping as they stand the runs of at least
  // kMinKeptLeaves of dest's leaves that no key of `newer` falls into (and that hold no
  // dropped keyspace's keys): the output points at them, and only the leaves around newer's
  // keys, the index layers and the bloom filter are written. A load in key order thus writes
  // each leaf once, not once per memtable. The caller checked that dest was built with the
  // placement this compaction applies (CanKeepLeaves).
  Status RunKeepingLeaves(MergeSource* newer, const TreeContext& ctx, const LevelDesc& dest);
  // Makes RunKeepingLeaves, whose newer input `source` then is, take runs of at least
  // kMinKeptLeaves of source's leaves into the output whole where no key of dest falls among
  // their keys (a load in key order appends above everything dest holds; an empty dest takes
  // every leaf: a trivial move). Only for an output at the deepest level with medium values
  // in place (MayMoveLeaves): a moved leaf must hold no tombstone, no medium pointer and no
  // dropped keyspace's key, which is checked by reading it, and the output has no bloom filter
  // that would need its keys.
  void MoveLeavesOf(TreeLeafSource* source) {
    mover_ =
        spec_.drop_tombstones && spec_.medium_in_place && !builder_.has_bloom() ? source : nullptr;
  }
  // Leaves of the newer input the output took whole.
  uint64_t leaves_moved() const { return leaves_moved_; }
  // Tells the compaction of a memtable which keyspaces it only appends to: `appends_only(ks)`
  // is true if every key of keyspace ks the memtable holds lies above every key of ks in the
  // levels (a load, or inserts of fresh row ids, with no change to older rows). Their medium
  // values stay in the leaves although the level is not the in-place one: those leaves are
  // written once and then kept (no key will fall into them), so a value written to the medium
  // log would only be read back and written again at the deepest level, where the leaves can
  // now move whole (MoveLeavesOf). Any other keyspace's medium values go to the medium log. (A
  // keyspace the memtable does not hold counts as appended to: its entries in the leaves the
  // merge rewrites for other keyspaces' keys keep their placement.)
  void SetAppendsOnlyProbe(std::function<bool(KeyspaceId)> appends_only) {
    appends_only_ = std::move(appends_only);
  }

  // Index segments of the destination's tree whose leaves the output keeps (it takes them
  // over when it is installed), with how many of them each holds.
  const std::map<uint32_t, uint32_t>& kept_segments() const { return builder_.kept_segments(); }
  // Whether the output kept leaves but built its bloom filter from every key again.
  bool rebuilt_filter() const { return rebuilt_filter_; }
  const CompactionSpec& spec() const { return spec_; }
  const LevelDesc& output() const { return output_; }
  // Medium-log segments the output's pointers use (sealed when it is installed).
  const std::vector<uint32_t>& medium_segments() const { return medium_segments_; }
  // Every segment it allocated, by kind (freed if it is abandoned).
  const std::unordered_map<uint32_t, SegmentKind>& segment_kinds() const { return segment_kinds_; }
  uint64_t bytes_written() const { return bytes_written_; }
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  Status NewSegment(SegmentKind kind, uint32_t* segment) override;
  Status WriteSegment(uint32_t segment, const char* data, uint32_t length) override;
  // Applies hybrid placement to one surviving entry and adds it to the output.
  Status Emit(const LeafEntry& e);
  // Emits every entry of an older leaf, with newer's entries that fall among them (a newer
  // version replaces an older one of the same key).
  Status MergeLeaf(MergeSource* newer, const NodeView& leaf);
  // Emits newer's entries below `bound` (all that are left if null), among which no key of the
  // destination falls, moving runs of whole leaves of mover_ where it can.
  Status EmitGap(MergeSource* newer, const std::string_view* bound);
  // How many of mover_'s leaves, from its current one on, may move whole into the output:
  // the run of leaves below `bound` that hold only live keyspaces' keys, no tombstone and no
  // medium pointer. Their statistics go to *stats.
  Status MovableRun(const std::string_view* bound, size_t* count, LevelDesc* stats);
  // Whether entries of keyspace `ks` survive (cached: entries come sorted by keyspace).
  bool KeyspaceLive(KeyspaceId ks);
  // Whether the memtable being compacted only appends to keyspace `ks` (cached likewise).
  bool AppendsOnly(KeyspaceId ks);
  // Describes the finished output, the way it was built included.
  Status FinishOutput();
  // Appends a medium value to this compaction's sorted run in the medium log.
  Status AppendMedium(std::string_view ikey, std::string_view value, ValuePtr* ptr);
  // Seals the run's current segment with a checksum and writes all of it (zero tail
  // included, so stale bytes of an earlier use never follow the valid prefix).
  Status FinishMediumSegment();

  const Options& options_;
  CompactionSpec spec_;
  Device* device_;
  SegmentTable* segments_;
  const KeyspaceTable* keyspaces_;
  const LogSet* values_;
  EngineObserver* observer_;
  SegmentDeltas deltas_;
  TreeShape shape_;
  TreeBuilder builder_;
  LevelDesc merged_{};               // statistics of the destination's leaves merged
  std::vector<DevPtr> kept_leaves_;  // and the leaves kept
  TreeLeafSource* mover_ = nullptr;  // newer input whose leaves may move whole (MoveLeavesOf)
  size_t no_move_before_ = 0;        // mover_'s leaves before this one start no movable run
  LevelDesc moved_{};                // statistics of the leaves moved
  std::vector<std::string> run_last_keys_;  // of the leaves of the run MovableRun found
  uint64_t leaves_moved_ = 0;
  bool rebuilt_filter_ = false;
  LevelDesc output_{};
  std::vector<uint32_t> medium_segments_;
  std::unordered_map<uint32_t, SegmentKind> segment_kinds_;  // of the segments it allocated
  uint64_t bytes_written_ = 0;
  uint64_t bytes_read_ = 0;
  KeyspaceId cached_keyspace_ = 0;
  bool cached_live_ = false;
  std::function<bool(KeyspaceId)> appends_only_;
  KeyspaceId appends_keyspace_ = 0;
  bool appends_cached_ = false;
  bool appends_only_cached_ = false;
  std::string scratch_;
  std::string medium_buf_;
  uint32_t medium_segment_ = 0;
  LogCursor medium_cursor_;
};

}  // namespace slipstream::engine
