// The engine iterator: a merge over the memtables (filtered to the snapshot LSN) and every
// level's tree, newest source first, hiding tombstones and older versions.
#include <memory>

#include "engine_impl.h"

namespace slipstream::engine {

namespace {

// One input of the merge, positioned on its newest visible version of a key.
class Source {
 public:
  virtual ~Source() = default;
  virtual void Seek(std::string_view ikey) = 0;
  virtual void Next() = 0;  // to the next distinct key
  virtual bool Valid() const = 0;
  virtual const LeafEntry& entry() const = 0;
  virtual Status status() const = 0;
};

class MemtableSource : public Source {
 public:
  MemtableSource(MemTable mem, Lsn snapshot) : mem_(mem), snapshot_(snapshot) {}
  void Seek(std::string_view ikey) override {
    node_ = mem_.Seek(ikey);
    SkipInvisible();
  }
  void Next() override {
    std::string_view key = node_->key();
    node_ = mem_.Next(node_);
    while (node_ && node_->key() == key) node_ = mem_.Next(node_);
    SkipInvisible();
  }
  bool Valid() const override { return node_ != nullptr; }
  const LeafEntry& entry() const override { return entry_; }
  Status status() const override { return status_; }

 private:
  // Versions written after the iterator was created are not part of its snapshot.
  void SkipInvisible() {
    while (node_ && node_->lsn > snapshot_) node_ = mem_.Next(node_);
    if (!node_) return;
    status_ = MemNodeEntry(node_, &entry_);
    if (!status_.ok()) node_ = nullptr;
  }

  MemTable mem_;
  Lsn snapshot_;
  const MemNode* node_ = nullptr;
  LeafEntry entry_{};
  Status status_;
};

class LevelSource : public Source {
 public:
  LevelSource(const TreeContext& ctx, const LevelDesc& desc) : it_(ctx, desc) {}
  void Seek(std::string_view ikey) override { it_.Seek(ikey); }
  void Next() override { it_.Next(); }
  bool Valid() const override { return it_.Valid(); }
  const LeafEntry& entry() const override { return it_.entry(); }
  Status status() const override { return it_.status(); }

 private:
  TreeIterator it_;
};

class EngineIterator : public Iterator {
 public:
  // Pins the epoch before anything is read, so that what Init reads stays allocated.
  EngineIterator(SharedEpochs* epochs, const LogSet* values, KeyspaceId ks)
      : values_(values), pin_(epochs), prefix_(MakeInternalKey(ks, {})) {}

  // Sets up one source per memtable (up to `snapshot`) and per level of `version`.
  void Init(const Version& version, Lsn snapshot, const MemtablePool& memtables,
            const TreeContext& trees, uint32_t max_levels) {
    version_ = version;
    uint32_t mask = 0;
    for (int m : {version_.active_memtable, version_.immutable_memtable}) {
      if (m >= 0) mask |= 1u << m;
    }
    pin_.NarrowMemtables(mask);
    for (int m : {version_.active_memtable, version_.immutable_memtable}) {
      if (m >= 0) sources_.push_back(std::make_unique<MemtableSource>(memtables.Get(m), snapshot));
    }
    for (uint32_t level = 1; level <= max_levels; level++) {
      if (version_.levels[level].tree_id != 0) {
        sources_.push_back(std::make_unique<LevelSource>(trees, version_.levels[level]));
      }
    }
  }

  bool Valid() const override { return valid_; }
  void SeekToFirst() override { Seek(std::string_view()); }
  void Seek(std::string_view key) override {
    std::string target = prefix_ + std::string(key);
    for (auto& s : sources_) s->Seek(target);
    FindVisible();
  }
  void Next() override {
    if (!valid_) return;
    Advance();
    FindVisible();
  }
  using Iterator::SkipTo;
  uint64_t SkipTo(std::string_view key, const SkipMark& mark, uint64_t* marked) override {
    std::string target = prefix_ + std::string(key);
    uint64_t passed = 0;
    while (valid_ && key_ < target) {
      passed++;
      if (marked != nullptr && MarkedInPlace(mark)) ++*marked;
      Advance();
      FindVisible(target);
    }
    return passed;
  }
  void SetUpperBound(std::string_view bound) override {
    bound_ = bound.empty() ? std::string() : prefix_ + std::string(bound);
  }
  std::string_view key() const override { return std::string_view(key_).substr(kKeyspacePrefix); }
  std::string_view value() const override { return value_; }
  Status status() const override { return status_; }

 private:
  // Whether the current entry, passed over unread, is one `mark` counts. Its bytes are at hand
  // when stored in place, as a value that short is unless the small-value threshold was set
  // below it; then it is read from its log, which only a value of exactly the mark's length
  // costs.
  bool MarkedInPlace(const SkipMark& mark) {
    if (!value_.empty() || current_ == nullptr) return Marked(mark, value_);
    const LeafEntry& e = current_->entry();
    if (e.kind == ValueKind::kInline) return Marked(mark, e.inline_value);
    if (mark.size == 0 || e.kind == ValueKind::kTombstone || e.ptr.value_size != mark.size) {
      return false;
    }
    std::string value;
    Status s = values_->ReadValue(key_, e, &value);
    if (!s.ok()) {
      status_ = s;
      valid_ = false;  // the skip stops here, as a failed read of a landing entry stops it
      return false;
    }
    return Marked(mark, value);
  }

  // Moves every source past the current smallest key.
  void Advance() {
    for (auto& s : sources_) {
      if (s->Valid() && s->entry().key == key_) s->Next();
    }
  }

  // Picks the smallest key (newest source wins ties), skipping tombstones, until a live entry
  // of this keyspace is found. Its value is read only if its key is at least `read_from`
  // (internal key; empty: always): SkipTo passes the entries below its target unread.
  void FindVisible(std::string_view read_from = {}) {
    valid_ = false;
    while (true) {
      Source* best = nullptr;
      for (auto& s : sources_) {
        if (!s->status().ok()) {
          status_ = s->status();
          return;
        }
        if (s->Valid() && (!best || s->entry().key < best->entry().key)) best = s.get();
      }
      if (!best || best->entry().key.substr(0, kKeyspacePrefix) != prefix_) return;
      if (!bound_.empty() && best->entry().key >= bound_) return;
      key_.assign(best->entry().key);
      current_ = best;
      if (best->entry().kind != ValueKind::kTombstone) {
        if (key_ < read_from) {
          value_.clear();  // passed over: never read
          valid_ = true;
          return;
        }
        Status s = values_->ReadValue(key_, best->entry(), &value_);
        if (!s.ok()) {
          status_ = s;
          return;
        }
        valid_ = true;
        return;
      }
      Advance();
    }
  }

  const LogSet* values_;
  EpochPin pin_;
  std::string prefix_;
  std::string bound_;  // internal key past the end; empty: the keyspace's end
  Version version_;
  std::vector<std::unique_ptr<Source>> sources_;
  Source* current_ = nullptr;  // the source whose entry is key_'s (while valid_)
  std::string key_;
  std::string value_;
  bool valid_ = false;
  Status status_;
};

// An iterator that only reports an error (for a keyspace that is not live).
class ErrorIterator : public Iterator {
 public:
  explicit ErrorIterator(Status s) : status_(std::move(s)) {}
  bool Valid() const override { return false; }
  void SeekToFirst() override {}
  void Seek(std::string_view) override {}
  void Next() override {}
  void SetUpperBound(std::string_view) override {}
  std::string_view key() const override { return {}; }
  std::string_view value() const override { return {}; }
  Status status() const override { return status_; }

 private:
  Status status_;
};

}  // namespace

std::unique_ptr<Iterator> EngineImpl::NewIterator(KeyspaceId ks) {
  if (!keyspaces_.IsLive(ks)) {
    return std::make_unique<ErrorIterator>(
        Status::InvalidArgument("keyspace " + std::to_string(ks) + " is not live"));
  }
  auto it = std::make_unique<EngineIterator>(&shared_->epochs, &logs_, ks);
  // The LSN first: every write up to it is then in a memtable or level of the version read
  // next (writers publish last_lsn after inserting).
  Lsn snapshot = logs_.last_lsn();
  it->Init(levels_.Current(), snapshot, memtables_, Trees(NodeChecks::kOncePerProcess),
           options_.max_levels);
  return it;
}

}  // namespace slipstream::engine
