// Compaction: merge sources, the merge, hybrid placement and the medium-log run. See
// compaction.h.
#include "compaction.h"

#include <algorithm>
#include <cstring>

#include "coding.h"
#include "slipstream/engine/log_writer.h"

namespace slipstream::engine {

namespace {

// Adds an entry's log record to the invalid bytes of its segment: the entry is being dropped.
void Discard(const LeafEntry& e, SegmentDeltas* deltas) {
  if (OwnsRecord(e)) deltas->invalid[e.ptr.where.segment] += e.ptr.record_bytes;
}

// Drops `older` for `newer`, a newer entry of the same key. If both name one record (newer is
// a patch of it), newer takes over older's ownership of it; otherwise older's record, if it
// owns one, is garbage now.
void Supersede(const LeafEntry& older, LeafEntry* newer, SegmentDeltas* deltas) {
  if (OwnsRecord(older) && SameRecord(older, *newer)) {
    newer->owner = true;
    return;
  }
  Discard(older, deltas);
}

// The immutable memtable: newest version of each key; older versions are discarded.
class MemSource : public MergeSource {
 public:
  MemSource(MemTable mem, SegmentDeltas* deltas) : mem_(mem), deltas_(deltas) {
    node_ = mem_.First();
    Load();
    if (node_ && entry_.kind == ValueKind::kLargePatch && !entry_.owner) TakeOverOwnership();
  }
  bool Valid() const override { return node_ != nullptr; }
  const LeafEntry& entry() const override { return entry_; }
  Status status() const override { return status_; }
  void Next() override {
    std::string_view key = node_->key();
    LeafEntry newest = entry_;
    node_ = mem_.Next(node_);
    while (node_ && node_->key() == key) {
      Load();
      Supersede(entry_, &newest, deltas_);  // (Load took over what newest could)
      node_ = mem_.Next(node_);
    }
    Load();
    if (node_ && entry_.kind == ValueKind::kLargePatch && !entry_.owner) TakeOverOwnership();
  }

 private:
  void Load() {
    if (!node_) return;
    status_ = MemNodeEntry(node_, &entry_);
    if (!status_.ok()) node_ = nullptr;
  }

  // The newest version of a key is emitted before its older ones are passed: a patch among
  // them that does not own its record looks ahead for the version that does, to own it itself.
  void TakeOverOwnership() {
    for (const MemNode* n = mem_.Next(node_); n && n->key() == node_->key(); n = mem_.Next(n)) {
      LeafEntry older;
      if (!MemNodeEntry(n, &older).ok()) return;  // reported when Next reaches it
      if (OwnsRecord(older) && SameRecord(older, entry_)) {
        entry_.owner = true;
        return;
      }
    }
  }

  MemTable mem_;
  SegmentDeltas* deltas_;
  const MemNode* node_;
  LeafEntry entry_{};
  Status status_;
};

class TreeSource : public MergeSource {
 public:
  TreeSource(const TreeContext& ctx, const LevelDesc& desc) : it_(ctx, desc) { it_.SeekToFirst(); }
  bool Valid() const override { return it_.Valid(); }
  const LeafEntry& entry() const override { return it_.entry(); }
  void Next() override { it_.Next(); }
  Status status() const override { return it_.status(); }

 private:
  TreeIterator it_;
};

class EmptySource : public MergeSource {
 public:
  bool Valid() const override { return false; }
  const LeafEntry& entry() const override { return entry_; }
  void Next() override {}
  Status status() const override { return Status::OK(); }

 private:
  LeafEntry entry_{};
};

CompactionSegmentKind ObservedKind(SegmentKind kind) {
  switch (kind) {
    case SegmentKind::kIndex:
      return CompactionSegmentKind::kIndex;
    case SegmentKind::kBloom:
      return CompactionSegmentKind::kBloom;
    default:
      return CompactionSegmentKind::kMedium;
  }
}

}  // namespace

std::unique_ptr<MergeSource> NewMemtableSource(MemTable memtable, SegmentDeltas* deltas) {
  return std::make_unique<MemSource>(memtable, deltas);
}

std::unique_ptr<MergeSource> NewTreeSource(const TreeContext& trees, const LevelDesc& level) {
  return std::make_unique<TreeSource>(trees, level);
}

std::unique_ptr<MergeSource> NewEmptySource() {
  return std::make_unique<EmptySource>();
}

Compaction::Compaction(const Options& options, const CompactionSpec& spec, Device* device,
                       SegmentTable* segments, const KeyspaceTable* keyspaces, const LogSet* values,
                       EngineObserver* observer)
    : options_(options),
      spec_(spec),
      device_(device),
      segments_(segments),
      keyspaces_(keyspaces),
      values_(values),
      observer_(observer),
      // The deepest level in use gets no bloom filter: point reads never probe it (a key no
      // upper level holds is taken to be there, EngineImpl::FindEntry), and it stops being the
      // deepest only by being merged whole into a deeper level, which empties it.
      shape_{options.node_size, options.segment_size,
             spec.drop_tombstones ? 0 : options.bloom_bits_per_key, options.small_threshold,
             options.large_threshold},
      builder_(shape_, this, spec.tree_id) {}

Status Compaction::NewSegment(SegmentKind kind, uint32_t* segment) {
  Status s =
      segments_->Allocate(kind, kind == SegmentKind::kMediumLog ? 0 : spec_.tree_id, segment);
  if (s.ok()) segment_kinds_[*segment] = kind;
  return s;
}

Status Compaction::WriteSegment(uint32_t segment, const char* data, uint32_t length) {
  bytes_written_ += length;
  Status s = device_->Write({WriteRequest{uint64_t(segment) * options_.segment_size, data, length}},
                            false);
  if (s.ok() && observer_ != nullptr) {
    observer_->OnCompactionSegment(CompactionSegmentEvent{spec_.tree_id, spec_.dest,
                                                          ObservedKind(segment_kinds_[segment]),
                                                          segment, std::string_view(data, length)});
  }
  return s;
}

Status Compaction::Run(MergeSource* newer, MergeSource* older) {
  while (newer->Valid() || older->Valid()) {
    Status s;
    if (!older->Valid() || (newer->Valid() && newer->entry().key < older->entry().key)) {
      s = Emit(newer->entry());
      newer->Next();
    } else if (!newer->Valid() || older->entry().key < newer->entry().key) {
      s = Emit(older->entry());
      older->Next();
    } else {
      LeafEntry e = newer->entry();
      Supersede(older->entry(), &e, &deltas_);
      s = Emit(e);
      newer->Next();
      older->Next();
    }
    if (!s.ok()) return s;
  }
  if (!newer->status().ok()) return newer->status();
  if (!older->status().ok()) return older->status();
  return FinishOutput();
}

Status Compaction::FinishOutput() {
  Status s = FinishMediumSegment();
  if (!s.ok()) return s;
  if (builder_.empty()) {
    output_ = LevelDesc{};
    return Status::OK();
  }
  s = builder_.Finish(&output_);
  output_.build_flags = kTreeBuildKnown | (spec_.drop_tombstones ? kTreeTombstonesDropped : 0) |
                        (spec_.medium_in_place ? kTreeMediumInPlace : 0);
  return s;
}

bool CanKeepLeaves(const CompactionSpec& spec, const LevelDesc& dest, uint32_t segment_size) {
  const uint32_t flags = dest.build_flags;
  return dest.tree_id != 0 && (flags & kTreeBuildKnown) &&
         bool(flags & kTreeMediumInPlace) == spec.medium_in_place &&
         (!spec.drop_tombstones || (flags & kTreeTombstonesDropped)) &&
         dest.dead_bytes * 4 <= dest.segments * segment_size;
}

namespace {

// Appends the leaves under the node at `p` (of `height`) to *leaves, in key order, reading
// only index nodes (and the root, if it is the only leaf).
Status ListLeaves(const TreeContext& ctx, const LevelDesc& desc, DevPtr p, uint32_t height,
                  std::vector<LeafRef>* leaves) {
  NodeView node;
  Status s = ctx.OpenNode(p, desc, &node);
  if (s.ok() && (node.height() != height || node.count() == 0)) {
    s = Status::Corruption("a node is empty or its height does not match its depth");
  }
  if (s.ok() && height == 0) {
    std::string_view first;
    s = node.KeyAt(0, &first);
    if (s.ok()) leaves->push_back(LeafRef{std::string(first), p});
    return s;
  }
  for (int i = 0; s.ok() && i < node.count(); i++) {
    std::string_view key;
    DevPtr child;
    s = node.Index(i, &key, &child);
    if (s.ok() && height == 1) {
      leaves->push_back(LeafRef{std::string(key), child});
    } else if (s.ok()) {
      s = ListLeaves(ctx, desc, child, height - 1, leaves);
    }
  }
  return s;
}

// Adds the entry counts and bytes of `from` to *to.
void AddEntryCounts(const LevelDesc& from, LevelDesc* to) {
  to->entries += from.entries;
  to->bytes += from.bytes;
  to->small_entries += from.small_entries;
  to->medium_entries += from.medium_entries;
  to->large_entries += from.large_entries;
  to->tombstones += from.tombstones;
}

// The blocks of a tree's bloom filter (checked first, as a reader does before trusting them).
Status ReadFilter(const TreeContext& ctx, const LevelDesc& desc, std::string* out) {
  Status s = CheckBloomFilter(ctx, desc);
  if (!s.ok()) return s;
  const char* dir = ctx.device->Segment(desc.bloom_dir.segment) + desc.bloom_dir.offset;
  NodeHeader h;
  std::memcpy(&h, dir, sizeof(h));
  const uint64_t per_segment = ctx.segment_size / kBloomBlockBytes;
  out->clear();
  for (uint32_t i = 0; i < h.count; i++) {
    uint32_t seg;
    std::memcpy(&seg, dir + kNodeHeaderSize + 4 * i, 4);
    uint64_t blocks = std::min<uint64_t>(desc.bloom_blocks - i * per_segment, per_segment);
    out->append(ctx.device->Segment(seg), blocks * kBloomBlockBytes);
  }
  return Status::OK();
}

}  // namespace

TreeLeafSource::TreeLeafSource(const TreeContext& ctx, const LevelDesc& desc)
    : ctx_(ctx), desc_(desc) {
  if (desc.tree_id != 0) status_ = ListLeaves(ctx_, desc_, desc_.root, desc_.height, &leaves_);
  if (status_.ok()) Load();
}

Status TreeLeafSource::OpenLeaf(size_t i, NodeView* leaf) const {
  Status s = ctx_.OpenNode(leaves_[i].where, desc_, leaf);
  if (s.ok() && (!leaf->is_leaf() || leaf->count() == 0)) {
    s = Status::Corruption("a level's leaf is empty or not a leaf");
  }
  return s;
}

void TreeLeafSource::Load() {
  if (leaf_index_ >= leaves_.size()) return;
  if (entry_index_ == 0) status_ = OpenLeaf(leaf_index_, &node_);
  if (status_.ok()) status_ = node_.Leaf(entry_index_, &entry_);
}

void TreeLeafSource::Next() {
  if (!Valid()) return;
  if (++entry_index_ >= node_.count()) {
    leaf_index_++;
    entry_index_ = 0;
  }
  Load();
}

void TreeLeafSource::SkipLeaves(size_t n) {
  leaf_index_ += n;
  entry_index_ = 0;
  Load();
}

// Walks dest's leaves in order, by their pivots, with newer's entries. A leaf that no newer
// key falls into (the next newer key is at or past the next leaf's pivot) and whose keys are
// of one live keyspace (its pivot's and the next pivot's) joins `run` unread; any other leaf
// ends the run, which is then kept if it is long enough and merged otherwise. The last leaf,
// whose end no pivot gives, is always merged. Kept leaves are never read: their statistics
// are dest's less those of the leaves merged, and the filter extends dest's. Newer's keys
// between dest's go in by EmitGap, which may move whole leaves of a tree (MoveLeavesOf).
// An empty dest (only with MoveLeavesOf) has no leaves to keep.
Status Compaction::RunKeepingLeaves(MergeSource* newer, const TreeContext& ctx,
                                    const LevelDesc& dest) {
  std::vector<LeafRef> leaves;
  Status s;
  if (dest.tree_id != 0) s = ListLeaves(ctx, dest, dest.root, dest.height, &leaves);
  std::vector<const LeafRef*> run;
  auto merge = [&](const LeafRef& ref) {
    NodeView leaf;
    Status m = ctx.OpenNode(ref.where, dest, &leaf);
    if (m.ok() && (!leaf.is_leaf() || leaf.count() == 0)) {
      m = Status::Corruption("a level's leaf is empty or not a leaf");
    }
    return m.ok() ? MergeLeaf(newer, leaf) : m;
  };
  auto end_run = [&]() -> Status {
    Status r;
    for (const LeafRef* ref : run) {
      if (run.size() >= kMinKeptLeaves) {
        r = builder_.AddExistingLeaf(ref->first, ref->where);
        kept_leaves_.push_back(ref->where);
      } else {
        r = merge(*ref);
      }
      if (!r.ok()) break;
    }
    run.clear();
    return r;
  };
  for (size_t i = 0; s.ok() && i < leaves.size(); i++) {
    const std::string& first = leaves[i].first;
    // Newer keys below the leaf go between it and the run before it, which they end.
    if (newer->Valid() && newer->entry().key < first) s = end_run();
    const std::string_view below_first = first;
    if (s.ok()) s = EmitGap(newer, &below_first);
    if (!s.ok()) break;
    const std::string* next = i + 1 < leaves.size() ? &leaves[i + 1].first : nullptr;
    if (next != nullptr && (!newer->Valid() || newer->entry().key >= *next) &&
        KeyspaceOf(first) == KeyspaceOf(*next) && KeyspaceLive(KeyspaceOf(first))) {
      run.push_back(&leaves[i]);
    } else {
      s = end_run();
      if (s.ok()) s = merge(leaves[i]);
    }
  }
  if (s.ok()) s = end_run();
  if (s.ok()) s = EmitGap(newer, nullptr);
  if (!s.ok()) return s;
  if (!newer->status().ok()) return newer->status();
  if (leaves_moved_ > 0) {
    // Moved leaves were read: their statistics are exact. (No filter: MoveLeavesOf.)
    LevelDesc kept_stats = moved_;
    uint32_t first_tree_id = mover_->desc().first_tree_id;
    if (!kept_leaves_.empty()) {
      kept_stats.entries += dest.entries - merged_.entries;
      kept_stats.bytes += dest.bytes - merged_.bytes;
      kept_stats.small_entries += dest.small_entries - merged_.small_entries;
      kept_stats.medium_entries += dest.medium_entries - merged_.medium_entries;
      kept_stats.large_entries += dest.large_entries - merged_.large_entries;
      kept_stats.tombstones += dest.tombstones - merged_.tombstones;
      first_tree_id = std::min(first_tree_id, dest.first_tree_id);
    }
    builder_.InheritFromKeptLeaves(kept_stats, first_tree_id, std::string(), BloomExtension{});
  } else if (!kept_leaves_.empty()) {
    LevelDesc kept_stats = dest;
    // Modulo 2^64: a size class of the kept leaves may come out "negative" if the thresholds
    // changed across a restart (dest counted the merged entries in their old classes); the
    // builder adds it to the output's own counts and floors the sum at 0.
    kept_stats.entries -= merged_.entries;
    kept_stats.bytes -= merged_.bytes;
    kept_stats.small_entries -= merged_.small_entries;
    kept_stats.medium_entries -= merged_.medium_entries;
    kept_stats.large_entries -= merged_.large_entries;
    kept_stats.tombstones -= merged_.tombstones;
    std::string filter;
    BloomExtension plan{};
    if (builder_.has_bloom() && dest.bloom_blocks != 0) {
      s = ReadFilter(ctx, dest, &filter);
      if (!s.ok()) return s;
      plan = PlanBloomExtension(filter.size() / kBloomBlockBytes, dest.bloom_keys,
                                builder_.added_entries() + kept_stats.entries,
                                builder_.added_entries(), options_.bloom_bits_per_key);
    }
    // (A filter its directory cannot list is built again too: that one is at most half as big.
    // So is one whose destination had none, as the deepest level.)
    const uint64_t listable = uint64_t(options_.node_size - kNodeHeaderSize) / 4 *
                              (options_.segment_size / kBloomBlockBytes);
    if (builder_.has_bloom() &&
        (dest.bloom_blocks == 0 || !plan.within_budget || plan.blocks > listable)) {
      // The inherited bits grew too dense: the filter is built from every key again, which
      // reads the kept leaves (rarely: the load grows by the share of keys added).
      rebuilt_filter_ = true;
      filter.clear();
      for (DevPtr where : kept_leaves_) {
        NodeView leaf;
        s = ctx.OpenNode(where, dest, &leaf);
        for (int i = 0; s.ok() && i < leaf.count(); i++) {
          std::string_view key;
          s = leaf.KeyAt(i, &key);
          if (s.ok()) builder_.AddKeptKeyHash(HashKey(key));
        }
        if (!s.ok()) return s;
      }
    }
    builder_.InheritFromKeptLeaves(kept_stats, dest.first_tree_id, std::move(filter), plan);
  }
  return FinishOutput();
}

Status Compaction::EmitGap(MergeSource* newer, const std::string_view* bound) {
  while (newer->Valid() && (bound == nullptr || newer->entry().key < *bound)) {
    if (mover_ != nullptr && mover_->AtLeafStart() && mover_->leaf_index() >= no_move_before_) {
      size_t n = 0;
      LevelDesc stats{};
      Status s = MovableRun(bound, &n, &stats);
      if (!s.ok()) return s;
      // A run ends the leaf being filled early, so short ones are copied (as in
      // RunKeepingLeaves), but for the last leaves when none is being filled (a trivial move).
      const size_t start = mover_->leaf_index();
      const bool to_the_end = start + n == mover_->leaf_count() && !builder_.leaf_open();
      if (n >= kMinKeptLeaves || (n > 0 && to_the_end)) {
        for (size_t i = start; s.ok() && i < start + n; i++) {
          s = builder_.AddExistingLeaf(mover_->leaf(i).first, mover_->leaf(i).where,
                                       run_last_keys_[i - start]);
        }
        if (!s.ok()) return s;
        mover_->SkipLeaves(n);
        if (!mover_->status().ok()) return mover_->status();
        leaves_moved_ += n;
        AddEntryCounts(stats, &moved_);
        continue;
      }
      // The leaves before the one that ended the run start no run long enough either; that
      // one is looked at again at its start (it may lie above this gap's bound).
      no_move_before_ = start + n;
    }
    Status s = Emit(newer->entry());
    if (!s.ok()) return s;
    newer->Next();
  }
  return Status::OK();
}

Status Compaction::MovableRun(const std::string_view* bound, size_t* count, LevelDesc* stats) {
  *count = 0;
  run_last_keys_.clear();
  for (size_t i = mover_->leaf_index(); i < mover_->leaf_count(); i++) {
    NodeView leaf;
    Status s = mover_->OpenLeaf(i, &leaf);
    if (!s.ok()) return s;
    LevelDesc leaf_stats{};
    bool movable = true;
    for (int j = 0; movable && j < leaf.count(); j++) {
      LeafEntry e;
      s = leaf.Leaf(j, &e);
      if (!s.ok()) return s;
      if (j == 0 && e.key != mover_->leaf(i).first) {
        return Status::Corruption("a leaf's first key differs from its parent's pivot");
      }
      movable = e.kind != ValueKind::kTombstone && e.kind != ValueKind::kMediumPtr &&
                KeyspaceLive(KeyspaceOf(e.key)) &&
                (j + 1 < leaf.count() || bound == nullptr || e.key < *bound);
      AccountEntry(shape_, e, &leaf_stats);
    }
    if (!movable) return Status::OK();
    std::string_view last;
    s = leaf.KeyAt(leaf.count() - 1, &last);
    if (!s.ok()) return s;
    run_last_keys_.emplace_back(last);
    AddEntryCounts(leaf_stats, stats);
    ++*count;
  }
  return Status::OK();
}

Status Compaction::MergeLeaf(MergeSource* newer, const NodeView& leaf) {
  for (int i = 0; i < leaf.count(); i++) {
    LeafEntry e;
    Status s = leaf.Leaf(i, &e);
    if (s.ok()) AccountEntry(shape_, e, &merged_);
    // (Runs of newer's leaves may fit between two of the leaf's keys: a leaf that ends one
    // keyspace and starts the next has every later row of the first between them.)
    const std::string_view below = e.key;
    if (s.ok()) s = EmitGap(newer, &below);
    if (s.ok() && newer->Valid() && newer->entry().key == e.key) {
      LeafEntry n = newer->entry();
      Supersede(e, &n, &deltas_);
      s = Emit(n);
      newer->Next();
    } else if (s.ok()) {
      s = Emit(e);
    }
    if (!s.ok()) return s;
  }
  return Status::OK();
}

bool Compaction::KeyspaceLive(KeyspaceId ks) {
  if (ks != cached_keyspace_) {
    cached_keyspace_ = ks;
    cached_live_ = keyspaces_->IsLive(ks);
  }
  return cached_live_;
}

bool Compaction::AppendsOnly(KeyspaceId ks) {
  if (!appends_only_) return false;
  if (!appends_cached_ || ks != appends_keyspace_) {
    appends_cached_ = true;
    appends_keyspace_ = ks;
    appends_only_cached_ = appends_only_(ks);
  }
  return appends_only_cached_;
}

Status Compaction::Emit(const LeafEntry& e) {
  if (!KeyspaceLive(KeyspaceOf(e.key))) {  // a dropped keyspace: its data goes away here
    Discard(e, &deltas_);
    return Status::OK();
  }
  if (e.kind == ValueKind::kTombstone && spec_.drop_tombstones) return Status::OK();
  size_t user_key = e.key.size() - kKeyspacePrefix;
  if (e.kind == ValueKind::kInline && !spec_.medium_in_place &&
      user_key + e.inline_value.size() >= options_.small_threshold &&
      !AppendsOnly(KeyspaceOf(e.key))) {
    LeafEntry out = e;
    out.kind = ValueKind::kMediumPtr;
    Status s = AppendMedium(e.key, e.inline_value, &out.ptr);
    if (!s.ok()) return s;
    return builder_.Add(out);
  }
  if (e.kind == ValueKind::kMediumPtr && spec_.medium_in_place) {
    Status s = values_->ReadValue(e.key, e, &scratch_);
    if (!s.ok()) return s;
    bytes_read_ += e.ptr.record_bytes;
    Discard(e, &deltas_);
    LeafEntry out = e;
    out.kind = ValueKind::kInline;
    out.inline_value = scratch_;
    return builder_.Add(out);
  }
  return builder_.Add(e);
}

Status Compaction::AppendMedium(std::string_view ikey, std::string_view value, ValuePtr* ptr) {
  char head[16];
  char* p = EncodeVarint32(head, uint32_t(ikey.size()));
  std::string_view key_len(head, size_t(p - head));
  char meta[5];
  meta[0] = 0;
  EncodeFixed32(meta + 1, uint32_t(value.size()));
  uint32_t space = RecordSpace(key_len.size() + ikey.size() + 5 + value.size());
  if (medium_segment_ == 0 ||
      medium_cursor_.pos + space + kChecksumEntrySize > options_.segment_size) {
    Status s = FinishMediumSegment();
    if (!s.ok()) return s;
    s = NewSegment(SegmentKind::kMediumLog, &medium_segment_);
    if (!s.ok()) return s;
    medium_segments_.push_back(medium_segment_);
    medium_buf_.assign(options_.segment_size, '\0');
    StartLogSegment(medium_buf_.data(), options_.segment_size, LogKind::kMedium,
                    medium_segments_.size(), medium_segment_,
                    (uint64_t(spec_.tree_id) << 32) | medium_segment_, &medium_cursor_);
  }
  uint32_t off = AppendRecord(medium_buf_.data(), &medium_cursor_, LogRecordType::kValue, 0,
                              {key_len, ikey, std::string_view(meta, 5), value});
  deltas_.written[medium_segment_] += space;
  *ptr = ValuePtr{{medium_segment_, off}, space, uint32_t(value.size())};
  return Status::OK();
}

Status Compaction::FinishMediumSegment() {
  if (medium_segment_ == 0) return Status::OK();
  AppendChecksum(medium_buf_.data(), &medium_cursor_);
  Status s = WriteSegment(medium_segment_, medium_buf_.data(), options_.segment_size);
  medium_segment_ = 0;
  return s;
}

}  // namespace slipstream::engine
