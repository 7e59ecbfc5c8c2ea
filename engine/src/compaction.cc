// Compaction (L0 -> L1 and Li -> Li+1, whole-level merges that build the destination B+-tree
// bottom-up), hybrid placement decisions, large-log GC, and publishing a new version.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include "clock.h"
#include "coding.h"
#include "engine_impl.h"
#include "log_scanner.h"
#include "log_writer.h"

namespace slipstream::engine {

// One sorted input of a merge.
class MergeSource {
 public:
  virtual ~MergeSource() = default;
  virtual bool Valid() const = 0;
  virtual const LeafEntry& entry() const = 0;
  virtual void Next() = 0;
  virtual Status status() const = 0;
};

namespace {

// Adds an entry's log record to the invalid bytes of its segment: the entry is being dropped.
void Discard(const LeafEntry& e, SegmentDeltas* deltas) {
  if (e.kind == ValueKind::kMediumPtr || e.kind == ValueKind::kLargePtr) {
    deltas->invalid[e.ptr.where.segment] += e.ptr.record_bytes;
  }
}

// The immutable memtable: newest version of each key; older versions are discarded.
class MemSource : public MergeSource {
 public:
  MemSource(MemTable mem, SegmentDeltas* deltas) : mem_(mem), deltas_(deltas) {
    node_ = mem_.First();
    Load();
  }
  bool Valid() const override { return node_ != nullptr; }
  const LeafEntry& entry() const override { return entry_; }
  Status status() const override { return status_; }
  void Next() override {
    std::string_view key = node_->key();
    node_ = mem_.Next(node_);
    while (node_ && node_->key() == key) {
      Load();
      Discard(entry_, deltas_);
      node_ = mem_.Next(node_);
    }
    Load();
  }

 private:
  void Load() {
    if (!node_) return;
    status_ = MemNodeEntry(node_, &entry_);
    if (!status_.ok()) node_ = nullptr;
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

// No entries (the other input of a level rewritten on its own).
class EmptySource : public MergeSource {
 public:
  bool Valid() const override { return false; }
  const LeafEntry& entry() const override { return entry_; }
  void Next() override {}
  Status status() const override { return Status::OK(); }

 private:
  LeafEntry entry_{};
};

// Builds one output level: owns the tree builder, the medium-log run and the deltas.
class Compactor : public SegmentSink {
 public:
  Compactor(EngineImpl* engine, Device* device, uint32_t tree_id, bool drop_tombstones,
            bool medium_in_place, SegmentDeltas* deltas)
      : engine_(engine),
        device_(device),
        options_(engine->options()),
        tree_id_(tree_id),
        drop_tombstones_(drop_tombstones),
        medium_in_place_(medium_in_place),
        deltas_(deltas),
        builder_(TreeShape{options_.node_size, options_.segment_size, options_.bloom_bits_per_key,
                           options_.small_threshold, options_.large_threshold},
                 this, tree_id) {}

  Status NewSegment(SegmentKind kind, uint32_t* segment) override {
    return allocate_(kind, kind == SegmentKind::kMediumLog ? 0 : tree_id_, segment);
  }
  Status WriteSegment(uint32_t segment, const char* data, uint32_t length) override {
    bytes_written_ += length;
    return device_->Write({WriteRequest{uint64_t(segment) * options_.segment_size, data, length}}, false);
  }

  // Merges `newer` over `older` into the output tree.
  Status Merge(MergeSource* newer, MergeSource* older) {
    while (newer->Valid() || older->Valid()) {
      Status s;
      if (!older->Valid() || (newer->Valid() && newer->entry().key < older->entry().key)) {
        s = Emit(newer->entry());
        newer->Next();
      } else if (!newer->Valid() || older->entry().key < newer->entry().key) {
        s = Emit(older->entry());
        older->Next();
      } else {
        Discard(older->entry(), deltas_);
        s = Emit(newer->entry());
        newer->Next();
        older->Next();
      }
      if (!s.ok()) return s;
    }
    if (!newer->status().ok()) return newer->status();
    return older->status();
  }

  // Finishes the medium run and the tree (an empty result leaves the level empty).
  Status Finish(LevelDesc* out) {
    Status s = FinishMediumSegment();
    if (!s.ok()) return s;
    if (builder_.empty()) {
      *out = LevelDesc{};
      return Status::OK();
    }
    return builder_.Finish(out);
  }

  std::function<Status(SegmentKind, uint32_t, uint32_t*)> allocate_;
  std::vector<uint32_t> medium_segments_;
  uint64_t bytes_written_ = 0;
  uint64_t bytes_read_ = 0;

 private:
  // Applies hybrid placement to one surviving entry and adds it to the output.
  Status Emit(const LeafEntry& e) {
    KeyspaceId ks = KeyspaceOf(e.key);
    if (ks != cached_keyspace_) {
      cached_keyspace_ = ks;
      cached_live_ = engine_->KeyspaceLive(ks);
    }
    if (!cached_live_) {  // a dropped keyspace: its data goes away here
      Discard(e, deltas_);
      return Status::OK();
    }
    if (e.kind == ValueKind::kTombstone && drop_tombstones_) return Status::OK();
    size_t user_key = e.key.size() - kKeyspacePrefix;
    if (e.kind == ValueKind::kInline && !medium_in_place_ &&
        user_key + e.inline_value.size() >= options_.small_threshold) {
      LeafEntry out = e;
      out.kind = ValueKind::kMediumPtr;
      Status s = AppendMedium(e.key, e.inline_value, &out.ptr);
      if (!s.ok()) return s;
      return builder_.Add(out);
    }
    if (e.kind == ValueKind::kMediumPtr && medium_in_place_) {
      Status s = engine_->ReadValue(e.key, e, &scratch_);
      if (!s.ok()) return s;
      bytes_read_ += e.ptr.record_bytes;
      Discard(e, deltas_);
      LeafEntry out = e;
      out.kind = ValueKind::kInline;
      out.inline_value = scratch_;
      return builder_.Add(out);
    }
    return builder_.Add(e);
  }

  // Appends a medium value to this compaction's sorted run in the medium log.
  Status AppendMedium(std::string_view ikey, std::string_view value, ValuePtr* ptr) {
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
                      medium_segments_.size(), medium_segment_, (uint64_t(tree_id_) << 32) | medium_segment_,
                      &medium_cursor_);
    }
    uint32_t off = AppendRecord(medium_buf_.data(), &medium_cursor_, LogRecordType::kValue, 0,
                                {key_len, ikey, std::string_view(meta, 5), value});
    deltas_->written[medium_segment_] += space;
    *ptr = ValuePtr{{medium_segment_, off}, space, uint32_t(value.size())};
    return Status::OK();
  }

  // Seals the run's current segment with a checksum and writes all of it (zero tail included,
  // so stale bytes of an earlier use never follow the valid prefix).
  Status FinishMediumSegment() {
    if (medium_segment_ == 0) return Status::OK();
    AppendChecksum(medium_buf_.data(), &medium_cursor_);
    Status s = WriteSegment(medium_segment_, medium_buf_.data(), options_.segment_size);
    medium_segment_ = 0;
    return s;
  }

  EngineImpl* engine_;
  Device* device_;
  const Options& options_;
  uint32_t tree_id_;
  bool drop_tombstones_;
  bool medium_in_place_;
  SegmentDeltas* deltas_;
  TreeBuilder builder_;
  KeyspaceId cached_keyspace_ = 0;
  bool cached_live_ = false;
  std::string scratch_;
  std::string medium_buf_;
  uint32_t medium_segment_ = 0;
  LogCursor medium_cursor_;
};

}  // namespace

uint32_t EngineImpl::DeepestLevel(const Version& v) const {
  uint32_t deepest = 0;
  for (uint32_t level = 1; level <= options_.max_levels; level++) {
    if (v.levels[level].tree_id != 0) deepest = level;
  }
  return deepest;
}

// L0 first (it blocks writers), then the shallowest level over its capacity.
int EngineImpl::NextCompaction(const Version& v) const {
  if (v.immutable_memtable >= 0) return 0;
  double capacity = double(options_.l0_size);
  for (uint32_t level = 1; level < options_.max_levels; level++) {
    capacity *= options_.growth_factor;
    if (v.levels[level].tree_id != 0 && double(v.levels[level].bytes) > capacity) return int(level);
  }
  return -1;
}

void EngineImpl::RecordBackgroundError(const Status& s) {
  std::snprintf(shared_->bg_error, sizeof(shared_->bg_error), "%s", s.ToString().c_str());
  shared_->bg_failed.store(1);
}

// Makes a compaction's result durable and visible: data fsync, deltas, version switch under
// the write mutex, manifest, then retirement of what the old version used.
Status EngineImpl::PublishCompaction(const Version& before, bool from_l0, uint32_t replaced_level,
                                     uint32_t dest, const LevelDesc& out, SegmentDeltas& deltas,
                                     const std::vector<uint32_t>& new_medium) {
  Status s = device_->Sync();
  if (!s.ok()) return s;
  std::vector<uint32_t> retired_segments;
  std::vector<uint32_t> retired_trees;
  std::string image;
  {
    SharedLock w(&shared_->write_mu);
    SharedLock a(&shared_->alloc_mu);
    SegmentInfo* table = segments();
    for (auto [seg, bytes] : deltas.written) table[seg].bytes_written += bytes;
    for (auto [seg, bytes] : deltas.invalid) table[seg].invalid_bytes += bytes;
    for (uint32_t seg : new_medium) table[seg].flags |= kSegmentSealed;
    // Log segments whose every record is dead, and that no shared buffer still holds.
    auto buffered = [&](uint32_t seg) {
      for (const SharedLog* log : {&shared_->l0_log, &shared_->large_log}) {
        for (uint32_t i = 0; i < log->buffer_count; i++) {
          if (log->buffers[i].state.load() != SharedLogBuffer::kFree && log->buffers[i].segment == seg) return true;
        }
      }
      return false;
    };
    for (uint64_t seg = 1; seg < shared_->device_segments; seg++) {
      SegmentInfo& info = table[seg];
      if (info.kind != uint8_t(SegmentKind::kLargeLog) && info.kind != uint8_t(SegmentKind::kMediumLog)) continue;
      if ((info.flags & kSegmentSealed) && !(info.flags & kSegmentRetired) && info.bytes_written > 0 &&
          info.invalid_bytes >= info.bytes_written && !buffered(uint32_t(seg))) {
        info.flags |= kSegmentRetired;
        retired_segments.push_back(uint32_t(seg));
      }
    }
    for (uint32_t level : {replaced_level, dest}) {
      uint32_t old = level ? before.levels[level].tree_id : 0;
      if (old == 0) continue;
      if (std::find(retired_trees.begin(), retired_trees.end(), old) != retired_trees.end()) continue;
      retired_trees.push_back(old);
      for (uint64_t seg = 1; seg < shared_->device_segments; seg++) {
        if ((table[seg].kind == uint8_t(SegmentKind::kIndex) || table[seg].kind == uint8_t(SegmentKind::kBloom)) &&
            table[seg].owner == old) {
          table[seg].flags |= kSegmentRetired;
        }
      }
    }
    if (from_l0) {
      shared_->compacted_lsn = std::max(shared_->compacted_lsn,
                                        MemHeader(before.immutable_memtable)->max_lsn.load());
      for (uint64_t seg = 1; seg < shared_->device_segments; seg++) {
        SegmentInfo& info = table[seg];
        if (info.kind == uint8_t(SegmentKind::kL0Log) && !(info.flags & kSegmentRetired) &&
            info.sequence < shared_->current.active_first_log_sequence && !buffered(uint32_t(seg))) {
          info.flags |= kSegmentRetired;
          retired_segments.push_back(uint32_t(seg));
        }
      }
    }
    shared_->version_seq.fetch_add(1);
    if (replaced_level != 0) shared_->current.levels[replaced_level] = LevelDesc{};
    shared_->current.levels[dest] = out;
    if (from_l0) shared_->current.immutable_memtable = -1;
    shared_->version_seq.fetch_add(1);
    shared_->manifest_number++;
    image = SerializeManifest(shared_->last_lsn.load());
  }
  s = WriteManifest(image);
  if (!s.ok()) return s;  // the old segments stay allocated: nothing is freed early
  for (uint32_t tree : retired_trees) Retire(RetiredItem::kTree, tree);
  for (uint32_t seg : retired_segments) Retire(RetiredItem::kSegment, seg);
  if (from_l0) {
    Retire(RetiredItem::kMemtable, uint32_t(before.immutable_memtable));
    // Entries of dropped keyspaces left the memtable: their slots may now be retired.
    const KeyspaceSlot* slots = keyspace_slots();
    for (uint32_t i = 0; i < kKeyspaceSlots; i++) {
      if (slots[i].state.load() == KeyspaceSlot::kDropped) {
        shared_->reclaim_pending.store(1);
        break;
      }
    }
  }
  shared_->counters.compactions++;
  Reclaim();
  SharedLock bg(&shared_->bg_mu);
  shared_->bg_cv.NotifyAll();
  return Status::OK();
}

// Merges `newer` over `older` into a new tree for `dest` and publishes it. The tree of
// `replaced_level` (if not 0) and the old tree of `dest` are retired; `from_l0` retires the
// immutable memtable too. `input_segments` is what the merge reads from the device.
Status EngineImpl::MergeLocked(const Version& v, MergeSource* newer, MergeSource* older,
                               SegmentDeltas* deltas, bool from_l0, uint32_t replaced_level,
                               uint32_t dest, uint64_t input_segments) {
  uint32_t tree_id;
  {
    SharedLock a(&shared_->alloc_mu);
    tree_id = shared_->next_tree_id++;
  }
  bool dest_is_last = DeepestLevel(v) <= dest;
  bool in_place = options_.medium_inplace_level == 0 ? dest_is_last : options_.medium_inplace_level <= dest;
  Compactor c(this, device_.get(), tree_id, dest_is_last, in_place, deltas);
  c.allocate_ = [this](SegmentKind k, uint32_t owner, uint32_t* seg) { return AllocateSegment(k, owner, seg); };
  shared_->counters.device_bytes_read += input_segments * options_.segment_size;
  LevelDesc out;
  Status s = c.Merge(newer, older);
  if (s.ok()) s = c.Finish(&out);
  if (!s.ok()) return s;
  shared_->counters.device_bytes_read += c.bytes_read_;
  shared_->counters.device_bytes_written += c.bytes_written_;
  shared_->counters.compaction_bytes_written += c.bytes_written_;
  return PublishCompaction(v, from_l0, replaced_level, dest, out, *deltas, c.medium_segments_);
}

// Merges the immutable memtable into L1.
Status EngineImpl::CompactL0Locked() {
  Version v = ReadVersion();
  if (v.immutable_memtable < 0) return Status::OK();
  // The new level will point at the memtable's large values: they must be on the device
  // before the manifest names the level (the fdatasync in PublishCompaction makes them durable).
  Status flushed = FlushLogs(false, 0);
  if (!flushed.ok()) return flushed;
  if (options_.persist_barrier) {  // the sealed memtable takes no more appends
    Status s = options_.persist_barrier();
    if (!s.ok()) return s;
  }
  SegmentDeltas deltas;  // the memtable adds its overwritten versions' pointers to it
  MemSource newer(Memtable(v.immutable_memtable), &deltas);
  TreeSource older(Trees(), v.levels[1]);
  return MergeLocked(v, &newer, &older, &deltas, true, 0, 1, v.levels[1].segments);
}

// Merges all of `level` into level+1.
Status EngineImpl::CompactLevelLocked(uint32_t level) {
  Version v = ReadVersion();
  if (level < 1 || level >= options_.max_levels || v.levels[level].tree_id == 0) return Status::OK();
  TreeSource newer(Trees(), v.levels[level]);
  TreeSource older(Trees(), v.levels[level + 1]);
  SegmentDeltas deltas;
  return MergeLocked(v, &newer, &older, &deltas, false, level, level + 1,
                     v.levels[level].segments + v.levels[level + 1].segments);
}

// Rewrites one level on its own: drops dropped keyspaces' entries (and, at the last level,
// tombstones), reclaiming their space without waiting for a merge from above.
Status EngineImpl::RewriteLevelLocked(uint32_t level) {
  Version v = ReadVersion();
  if (level < 1 || level > options_.max_levels || v.levels[level].tree_id == 0) return Status::OK();
  TreeSource newer(Trees(), v.levels[level]);
  EmptySource older;
  SegmentDeltas deltas;
  return MergeLocked(v, &newer, &older, &deltas, false, 0, level, v.levels[level].segments);
}

// For every dropped keyspace: rewrites the levels that still hold its keys, then retires the
// keyspace's slot once no memtable or level holds any (so the table never fills up with drops).
Status EngineImpl::ReclaimDroppedLocked(bool* rewrote) {
  *rewrote = false;
  std::vector<KeyspaceId> dropped;
  KeyspaceSlot* slots = keyspace_slots();
  for (uint32_t i = 0; i < kKeyspaceSlots; i++) {
    if (slots[i].state.load() == KeyspaceSlot::kDropped) dropped.push_back(slots[i].id);
  }
  if (dropped.empty()) return Status::OK();
  EpochPin pin(shared_);
  auto level_holds = [&](const Version& v, uint32_t level, KeyspaceId id) {
    TreeIterator it(Trees(), v.levels[level]);
    it.Seek(MakeInternalKey(id, {}));
    return it.Valid() && KeyspaceOf(it.entry().key) == id;
  };
  Version v = ReadVersion();
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
  v = shared_->current;
  for (KeyspaceId id : dropped) {
    bool present = false;
    std::string prefix = MakeInternalKey(id, {});
    for (int m : {v.active_memtable, v.immutable_memtable}) {
      const MemNode* n = m < 0 ? nullptr : Memtable(m).Seek(prefix);
      present = present || (n && KeyspaceOf(n->key()) == id);
    }
    for (uint32_t level = 1; level <= options_.max_levels && !present; level++) {
      present = v.levels[level].tree_id != 0 && level_holds(v, level, id);
    }
    if (!present) FindKeyspaceSlot(id)->state.store(KeyspaceSlot::kDeleted);
  }
  return Status::OK();
}

// A sealed large-log segment past the invalid-byte threshold, not yet evacuated (0: none).
// Uses only the per-segment invalid-byte map: GC never scans the log to find work.
uint32_t EngineImpl::PickGarbageSegment() {
  SharedLock w(&shared_->write_mu);
  SharedLock a(&shared_->alloc_mu);
  SegmentInfo* table = segments();
  uint32_t best = 0;
  double best_ratio = 0;
  for (uint64_t seg = 1; seg < shared_->device_segments; seg++) {
    const SegmentInfo& info = table[seg];
    if (info.kind != uint8_t(SegmentKind::kLargeLog) || !(info.flags & kSegmentSealed) ||
        (info.flags & (kSegmentEvacuated | kSegmentRetired)) || info.bytes_written == 0 ||
        info.invalid_bytes >= info.bytes_written) {
      continue;
    }
    double ratio = double(info.invalid_bytes) / double(info.bytes_written);
    if (ratio >= options_.gc_threshold && ratio > best_ratio) {
      best = uint32_t(seg);
      best_ratio = ratio;
    }
  }
  if (best) table[best].flags |= kSegmentEvacuated;
  return best;
}

// Relocates the still-live values of a large-log segment to the head of the large log (each
// relocation is a conditional put: skipped if the key moved on meanwhile). The segment is
// freed when compaction has dropped the last stale pointer into it.
Status EngineImpl::CollectGarbage(uint32_t segment) {
  EpochPin pin(shared_);
  LogScan scan = ScanLogSegment(device_->Segment(segment), options_.segment_size);
  if (!scan.header_ok) return Status::Corruption("large-log segment " + std::to_string(segment) + " has no header");
  shared_->counters.device_bytes_read += scan.valid_end;
  std::vector<WriteOp> batch;
  size_t batch_bytes = 0;
  uint64_t relocated = 0;
  auto flush = [&]() -> Status {
    if (batch.empty()) return Status::OK();
    Status s = WriteOps(batch, nullptr, /*may_stall=*/false);
    batch.clear();
    batch_bytes = 0;
    return s;
  };
  // Busy means L0 is full and compaction must run first (possibly in this very process): the
  // segment becomes eligible again, and a later round skips the values already relocated.
  auto back_off = [&](const Status& s) {
    if (s.IsBusy()) {
      SharedLock a(&shared_->alloc_mu);
      segments()[segment].flags &= uint16_t(~kSegmentEvacuated);
    }
    return s;
  };
  for (const ScannedRecord& rec : scan.records) {
    if (rec.type != LogRecordType::kValue) continue;
    const char* p = rec.payload.data();
    const char* limit = p + rec.payload.size();
    uint32_t key_size;
    p = DecodeVarint32(p, limit, &key_size);
    if (!p || uint64_t(limit - p) < uint64_t(key_size) + 5 || key_size < kKeyspacePrefix) {
      return Status::Corruption("large-log record with a bad key in segment " + std::to_string(segment));
    }
    std::string_view ikey(p, key_size);
    KeyspaceId ks = KeyspaceOf(ikey);
    if (!KeyspaceLive(ks)) continue;
    WriteOp op;
    op.type = WriteOp::kRelocate;
    op.keyspace = ks;
    op.key = UserKeyOf(ikey);
    op.value = rec.payload;
    op.relocate_from = ValuePtr{{segment, rec.offset}, RecordSpace(rec.payload.size()),
                                DecodeFixed32(p + key_size + 1)};
    batch_bytes += rec.payload.size() + 64;
    relocated += rec.payload.size();
    batch.push_back(std::move(op));
    if (batch.size() >= 64 || batch_bytes >= options_.segment_size / 2) {
      Status s = flush();
      if (!s.ok()) return back_off(s);
    }
  }
  Status s = flush();
  if (!s.ok()) return back_off(s);
  shared_->counters.gc_runs++;
  shared_->counters.gc_bytes_relocated += relocated;
  return Status::OK();
}

bool EngineImpl::DoBackgroundWork() {
  bool did = false;
  uint64_t since_flush = NowMicros() - shared_->last_flush_micros.load();
  if (HasSealedLogBuffer() ||
      (HasUnflushedLog() && since_flush >= uint64_t(options_.flush_interval_ms) * 1000)) {
    Status s = FlushLogs(true, 0);
    if (!s.ok()) RecordBackgroundError(s);
    did = true;
  }
  {
    SharedLock lock(&shared_->compaction_mu);
    Version v = ReadVersion();
    int next = NextCompaction(v);
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
    Reclaim();
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

// Switches the memtable and compacts everything into the deepest level in use.
Status EngineImpl::CompactAll() {
  Status s = FlushLogs(true, 0);
  if (!s.ok()) return s;
  for (int attempt = 0;; attempt++) {
    {
      SharedLock lock(&shared_->compaction_mu);
      s = CompactL0Locked();
      if (!s.ok()) return s;
      Reclaim();
    }
    bool switched;
    {
      SharedLock w(&shared_->write_mu);
      switched = Memtable(shared_->current.active_memtable).entries() == 0 || SwitchMemtable(true);
    }
    if (switched) break;
    if (attempt > 10000) return Status::Busy("memtable still pinned by open iterators");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  SharedLock lock(&shared_->compaction_mu);
  s = CompactL0Locked();
  Version v = ReadVersion();
  uint32_t deepest = DeepestLevel(v);
  for (uint32_t level = 1; s.ok() && level < deepest; level++) {
    if (ReadVersion().levels[level].tree_id != 0) s = CompactLevelLocked(level);
  }
  bool rewrote;
  if (s.ok()) s = ReclaimDroppedLocked(&rewrote);
  Reclaim();
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
  Reclaim();
  return Status::OK();
}

}  // namespace slipstream::engine
