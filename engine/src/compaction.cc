// Compaction: merge sources, the merge, hybrid placement and the medium-log run. See
// compaction.h.
#include "compaction.h"

#include "coding.h"
#include "slipstream/engine/log_writer.h"

namespace slipstream::engine {

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
      builder_(TreeShape{options.node_size, options.segment_size, options.bloom_bits_per_key,
                         options.small_threshold, options.large_threshold},
               this, spec.tree_id) {}

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
      Discard(older->entry(), &deltas_);
      s = Emit(newer->entry());
      newer->Next();
      older->Next();
    }
    if (!s.ok()) return s;
  }
  if (!newer->status().ok()) return newer->status();
  if (!older->status().ok()) return older->status();
  Status s = FinishMediumSegment();
  if (!s.ok()) return s;
  if (builder_.empty()) {
    output_ = LevelDesc{};
    return Status::OK();
  }
  return builder_.Finish(&output_);
}

Status Compaction::Emit(const LeafEntry& e) {
  KeyspaceId ks = KeyspaceOf(e.key);
  if (ks != cached_keyspace_) {
    cached_keyspace_ = ks;
    cached_live_ = keyspaces_->IsLive(ks);
  }
  if (!cached_live_) {  // a dropped keyspace: its data goes away here
    Discard(e, &deltas_);
    return Status::OK();
  }
  if (e.kind == ValueKind::kTombstone && spec_.drop_tombstones) return Status::OK();
  size_t user_key = e.key.size() - kKeyspacePrefix;
  if (e.kind == ValueKind::kInline && !spec_.medium_in_place &&
      user_key + e.inline_value.size() >= options_.small_threshold) {
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
