// EngineImpl: opening and attaching, point reads, stats. The other units of the engine are
// listed in engine_impl.h; option validation and ArenaSize are in options.cc.
#include "engine_impl.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <thread>

#include "options_internal.h"
#include "slipstream/engine/log_scanner.h"

namespace slipstream::engine {

const char* SegmentKindName(SegmentKind kind) {
  switch (kind) {
    case SegmentKind::kFree:
      return "free";
    case SegmentKind::kL0Log:
      return "L0 log";
    case SegmentKind::kMediumLog:
      return "medium log";
    case SegmentKind::kLargeLog:
      return "large log";
    case SegmentKind::kIndex:
      return "index";
    case SegmentKind::kBloom:
      return "bloom";
    case SegmentKind::kReserved:
      return "reserved";
  }
  return "unknown";
}

// ---------------------------------------------------------------------------------------------
// Opening

Status Engine::Open(const Options& options, void* arena, size_t arena_size,
                    std::unique_ptr<Engine>* engine) {
  Status s = ValidateOptions(options);
  if (!s.ok()) return s;
  if (arena == nullptr || arena_size < ArenaSize(options)) {
    return Status::InvalidArgument("arena is smaller than Engine::ArenaSize(options)");
  }
  auto impl = std::make_unique<EngineImpl>(options, static_cast<char*>(arena), arena_size);
  s = impl->OpenOrAttach();
  if (s.ok()) *engine = std::move(impl);
  return s;
}

EngineImpl::EngineImpl(const Options& options, char* arena, size_t arena_size)
    : options_(options),
      arena_(arena),
      arena_size_(arena_size),
      shared_(reinterpret_cast<SharedState*>(arena)),
      observer_(options_.observer.get()),
      background_(&shared_->bg_mu, &shared_->bg_cv, &shared_->bg_pending),
      segments_(arena, &shared_->segments, &device_),
      memtables_(arena, &shared_->memtables),
      keyspaces_(arena, &shared_->keyspaces),
      reclaimer_(&shared_->epochs, &segments_, &memtables_, &shared_->counters),
      logs_(options_, arena, &shared_->logs, &device_, &segments_, &shared_->counters,
            &shared_->write_mu, &background_, observer_),
      levels_(options_, &shared_->levels, &shared_->counters) {}

EngineImpl::~EngineImpl() = default;

// The first opener of a zeroed arena recovers; everyone else waits for it and attaches.
Status EngineImpl::OpenOrAttach() {
  uint32_t expected = kArenaZero;
  bool first = shared_->state.compare_exchange_strong(expected, kArenaInitializing);
  if (first) {
    std::error_code ec;
    std::filesystem::create_directories(options_.directory, ec);
    if (ec) {
      shared_->state.store(kArenaFailed);
      return Status::IOError("cannot create directory " + options_.directory + ": " + ec.message());
    }
  } else {
    while (shared_->state.load() == kArenaInitializing) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (shared_->state.load() != kArenaReady) {
      return Status::IOError("engine recovery failed in the process that opened it first");
    }
    if (shared_->magic != kArenaMagic || shared_->version != kArenaVersion ||
        shared_->segment_size != options_.segment_size ||
        shared_->node_size != options_.node_size || shared_->l0_size != options_.l0_size ||
        shared_->max_levels != options_.max_levels ||
        shared_->memtables.count != options_.memtables ||
        shared_->max_segments != options_.max_device_size / options_.segment_size ||
        shared_->row_cache_size != options_.row_cache_size) {
      return Status::InvalidArgument("options differ from those the arena was opened with");
    }
  }
  row_cache_.Attach(arena_ + ArenaLayout::For(options_).row_cache, options_.row_cache_size);
  Status s = device_.Open(options_.directory + "/segments", options_.segment_size,
                          options_.max_device_size);
  // Without room for the cache every read checks every node, as with no cache at all.
  if (s.ok() && options_.verify_checksums) {
    node_checks_.Init(options_.max_device_size / options_.segment_size,
                      options_.segment_size / options_.node_size);
  }
  if (first) {
    if (s.ok()) {
      FormatArena();
      s = Recover();
    }
    shared_->state.store(s.ok() ? kArenaReady : kArenaFailed);
  }
  return s;
}

// Initialises the header and every part of a zeroed arena.
void EngineImpl::FormatArena() {
  ArenaLayout layout = ArenaLayout::For(options_);
  SharedState* s = shared_;
  s->magic = kArenaMagic;
  s->version = kArenaVersion;
  s->arena_size = arena_size_;
  s->segment_size = options_.segment_size;
  s->node_size = options_.node_size;
  s->max_levels = options_.max_levels;
  s->l0_size = options_.l0_size;
  s->max_segments = options_.max_device_size / options_.segment_size;
  s->row_cache_size = options_.row_cache_size;
  s->write_mu.Init();
  s->compaction_mu.Init();
  background_.Format();
  segments_.Format(layout.segment_table, s->max_segments);
  keyspaces_.Format(layout.keyspace_table);
  memtables_.Format(layout.memtables, layout.memtable_stride, layout.memtable_header,
                    options_.memtables, options_);
  reclaimer_.Format();
  logs_.Format(layout.l0_buffers, layout.large_buffers);
  levels_.Format();
}

// kOncePerProcess hands out this process's cache of checked nodes, kEveryRead none.
TreeContext EngineImpl::Trees(NodeChecks checks) const {
  return TreeContext{&device_,
                     &segments_.info(0),
                     segments_.count(),
                     options_.node_size,
                     options_.segment_size,
                     options_.verify_checksums,
                     checks == NodeChecks::kOncePerProcess ? &node_checks_ : nullptr};
}

Status EngineImpl::Sync(Lsn lsn) {
  return logs_.Sync(lsn);
}

// ---------------------------------------------------------------------------------------------
// Reads

namespace {

// The leaf finger that spans the key, or nullptr.
LeafFinger* CoveringLeafFinger(LeafFinger* fingers, std::string_view ikey) {
  for (int i = 0; i < ReadFinger::kFingers; i++) {
    if (FingerCovers(fingers[i], ikey)) return &fingers[i];
  }
  return nullptr;
}

// The leaf finger to refill after a descent: the least recently used.
LeafFinger* OldestLeafFinger(LeafFinger* fingers) {
  LeafFinger* oldest = &fingers[0];
  for (int i = 1; i < ReadFinger::kFingers; i++) {
    if (fingers[i].last_used < oldest->last_used) oldest = &fingers[i];
  }
  return oldest;
}

}  // namespace

// Memtables (newest first), then each level whose bloom filter admits the key; the deepest
// level's filter is skipped, since reads are mostly of present keys and a key no upper level
// holds is then there (docs/engine.md, "Point reads").
Status EngineImpl::FindEntry(const Version& v, std::string_view ikey, uint64_t max_lsn, bool* found,
                             LeafEntry* entry, ReadFinger* finger, bool past_memtables) {
  *found = false;
  uint64_t now = finger ? ++finger->clock : 0;
  for (int m : {v.active_memtable, v.immutable_memtable}) {
    if (m < 0 || past_memtables) continue;
    const MemNode* node = memtables_.Get(m).Find(ikey, max_lsn);
    if (node == nullptr) continue;
    *found = true;
    return MemNodeEntry(node, entry);
  }
  TreeContext ctx = Trees(NodeChecks::kOncePerProcess);
  uint64_t hash = 0;
  bool hashed = false;
  uint32_t deepest = 0;
  for (uint32_t level = 1; level <= options_.max_levels; level++) {
    if (v.levels[level].tree_id != 0) deepest = level;
  }
  for (uint32_t level = 1; level <= options_.max_levels; level++) {
    const LevelDesc& desc = v.levels[level];
    if (desc.tree_id == 0) continue;
    // A remembered leaf that spans the key answers for the level; the bloom filter would
    // cost a probe of its own.
    LeafFinger* leaf = finger ? CoveringLeafFinger(finger->levels[level], ikey) : nullptr;
    if (leaf == nullptr) {
      if (!hashed) {
        hash = HashKey(ikey);
        hashed = true;
      }
      if (level != deepest && !TreeMayContain(ctx, desc, hash)) continue;
      if (finger) leaf = OldestLeafFinger(finger->levels[level]);
    }
    if (leaf) leaf->last_used = now;
    Status s = TreeGet(ctx, desc, ikey, found, entry, leaf);
    if (!s.ok() || *found) return s;
  }
  return Status::OK();
}

// Whether a memtable of `v` holds a version of ikey, published or not.
bool EngineImpl::InMemtables(const Version& v, std::string_view ikey) const {
  for (int m : {v.active_memtable, v.immutable_memtable}) {
    if (m >= 0 && memtables_.Get(m).Find(ikey, UINT64_MAX) != nullptr) return true;
  }
  return false;
}

Status EngineImpl::Get(KeyspaceId ks, std::string_view key, std::string* value) {
  return GetNear(nullptr, ks, key, value);
}

Status EngineImpl::GetNear(ReadFinger* finger, KeyspaceId ks, std::string_view key,
                           std::string* value, bool past_memtables) {
  if (!keyspaces_.IsLive(ks)) {
    return Status::InvalidArgument("keyspace " + std::to_string(ks) + " is not live");
  }
  if (key.size() > options_.max_key_size)
    return Status::InvalidArgument("key exceeds max_key_size");
  std::string ikey = MakeInternalKey(ks, key);
  // The ticket comes before the snapshot below: a write published after the snapshot was
  // taken invalidates after it published, so it moves the bucket past the ticket.
  RowCache::Ticket ticket;
  if (row_cache_.Lookup(ikey, value, &ticket)) return Status::OK();
  // Memtable versions past the published LSN are skipped, as iterators skip them: a writer
  // inserts before it publishes, and a read that saw such a version could be followed by an
  // iterator, snapshotted at the published LSN, that shows the older one.
  const Lsn snapshot = logs_.last_lsn();
  // Pinned first: a version still current after the pin cannot be reclaimed under it, so the
  // finger's copy and positions stay valid exactly while the sequence number is unchanged.
  EpochPin pin(&shared_->epochs);
  Version local;
  const Version* v = &local;
  if (finger == nullptr) {
    local = levels_.Current();
  } else {
    uint64_t seq = levels_.VersionSeq();
    if ((seq & 1) != 0 || seq != finger->version_seq) {
      *finger = ReadFinger();
      finger->version = levels_.Current(&finger->version_seq);
    }
    v = &finger->version;
  }
  bool found;
  LeafEntry entry;
  Status s = FindEntry(*v, ikey, snapshot, &found, &entry, finger, past_memtables);
  if (!s.ok()) return s;
  if (!found || entry.kind == ValueKind::kTombstone) return Status::NotFound();
  s = logs_.ReadValue(ikey, entry, value);
  if (s.ok() && row_cache_.enabled() && (!past_memtables || !InMemtables(*v, ikey))) {
    // A read past the memtables may have passed a newer version there; its answer is the
    // newest only if they hold none. They hold every write published before the ticket that
    // the levels of `v` lack, and writes published after it refuse the install.
    row_cache_.Install(ikey, *value, ticket);
  }
  return s;
}

// One seek in each memtable instead of a hash probe per key: an index range scan asks once
// for a run of row ids, then reads the ones below the answer from the levels alone. The
// memtables are those of the current version; one frozen and flushed meanwhile put its keys
// in a level, where GetPastMemtables finds them.
bool EngineImpl::FirstMemtableKey(KeyspaceId ks, std::string_view lo, std::string_view hi,
                                  std::string* first) {
  std::string ilo = MakeInternalKey(ks, lo);
  std::string ihi = MakeInternalKey(ks, hi);
  EpochPin pin(&shared_->epochs);
  Version v = levels_.Current();
  std::string_view best;
  for (int m : {v.active_memtable, v.immutable_memtable}) {
    if (m < 0) continue;
    const MemNode* n = memtables_.Get(m).Seek(ilo);
    if (n == nullptr || CompareKeys(n->key(), ihi) >= 0) continue;
    if (best.empty() || CompareKeys(n->key(), best) < 0) best = n->key();
  }
  if (best.empty()) return false;
  first->assign(UserKeyOf(best));
  return true;
}

namespace {

// Engine::NewPointReader's reader: a finger and the engine it reads.
class PointReaderImpl final : public PointReader {
 public:
  explicit PointReaderImpl(EngineImpl* engine) : engine_(engine) {}
  Status Get(KeyspaceId ks, std::string_view key, std::string* value) override {
    return engine_->GetNear(&finger_, ks, key, value);
  }
  bool FirstMemtableKey(KeyspaceId ks, std::string_view lo, std::string_view hi,
                        std::string* first) override {
    return engine_->FirstMemtableKey(ks, lo, hi, first);
  }
  Status GetPastMemtables(KeyspaceId ks, std::string_view key, std::string* value) override {
    return engine_->GetNear(&finger_, ks, key, value, true);
  }

 private:
  EngineImpl* engine_;
  ReadFinger finger_;
};

}  // namespace

std::unique_ptr<PointReader> EngineImpl::NewPointReader() {
  return std::make_unique<PointReaderImpl>(this);
}

// ---------------------------------------------------------------------------------------------
// Stats

// Sleeps until woken, but no longer than the flush interval while appends wait for the flusher.
void EngineImpl::WaitForBackgroundWork(int timeout_ms) {
  if (logs_.HasUnflushed()) timeout_ms = std::min(timeout_ms, int(options_.flush_interval_ms));
  background_.WaitForWork(timeout_ms);
}

Stats EngineImpl::GetStats() {
  Stats st;
  EpochPin pin(&shared_->epochs);
  Version v = levels_.Current();
  for (uint32_t level = 1; level <= options_.max_levels; level++) {
    const LevelDesc& d = v.levels[level];
    LevelStats ls;
    ls.level = level;
    ls.bytes = d.bytes;
    ls.segments = d.segments;
    ls.entries = d.entries;
    ls.small_entries = d.small_entries;
    ls.medium_entries = d.medium_entries;
    ls.large_entries = d.large_entries;
    ls.tombstones = d.tombstones;
    st.levels.push_back(ls);
  }
  for (int m : {v.active_memtable, v.immutable_memtable}) {
    if (m < 0) continue;
    st.l0_entries += memtables_.Get(m).entries();
    st.l0_bytes += memtables_.Get(m).kv_bytes();
    st.l0_descents += memtables_.Get(m).descents();
  }
  const SharedCounters& c = shared_->counters;
  st.user_bytes_written = c.user_bytes_written;
  st.device_bytes_written = c.device_bytes_written;
  st.device_bytes_read = c.device_bytes_read;
  st.compactions = c.compactions;
  st.compaction_bytes_written = c.compaction_bytes_written;
  st.compaction_leaves_kept = c.compaction_leaves_kept;
  st.compaction_leaves_moved = c.compaction_leaves_moved;
  st.compaction_filters_rebuilt = c.compaction_filters_rebuilt;
  st.gc_runs = c.gc_runs;
  st.large_patches = c.large_patches;
  RowCacheStats rc = row_cache_.Stats();
  st.row_cache_hits = rc.hits;
  st.row_cache_misses = rc.misses;
  st.row_cache_installs = rc.installs;
  st.gc_bytes_relocated = c.gc_bytes_relocated;
  st.gc_reclaimed_bytes = c.gc_reclaimed_bytes;
  st.stall_count = c.stall_count;
  st.stall_micros = c.stall_micros;
  st.log_flushes = c.log_flushes;
  st.log_barrier_calls = c.log_barrier_calls;
  st.log_records_flushed = c.log_records_flushed;
  st.last_lsn = logs_.last_lsn();
  st.durable_lsn = logs_.durable_lsn();
  SharedLock lock(segments_.mutex());
  for (uint64_t i = 1; i < segments_.count(); i++) {
    auto kind = SegmentKind(segments_.info(i).kind);
    if (kind == SegmentKind::kFree) continue;
    st.segments_in_use++;
    if (kind == SegmentKind::kMediumLog) st.medium_log_segments++;
    if (kind == SegmentKind::kLargeLog) st.large_log_segments++;
    if (kind == SegmentKind::kL0Log) st.l0_log_segments++;
  }
  return st;
}

namespace {

// The first internal key after every key of keyspace `ks`: the next keyspace's first key or,
// for the last possible id, a key of 0xff bytes longer than any internal key.
std::string KeyspaceEnd(KeyspaceId ks, size_t max_key_size) {
  if (ks != UINT32_MAX) return MakeInternalKey(ks + 1, {});
  return std::string(kKeyspacePrefix + max_key_size + 1, '\xff');
}

}  // namespace

// Memtables are walked, being in memory and bounded by l0_size; levels are estimated from a few
// node reads each, so that the cost does not grow with the keyspace.
Status EngineImpl::ApproximateSize(KeyspaceId ks, uint64_t* bytes) {
  *bytes = 0;
  if (!keyspaces_.IsLive(ks)) {
    return Status::InvalidArgument("keyspace " + std::to_string(ks) + " is not live");
  }
  std::string start = MakeInternalKey(ks, {});
  std::string end = KeyspaceEnd(ks, options_.max_key_size);
  EpochPin pin(&shared_->epochs);
  Version v = levels_.Current();
  uint64_t total = 0;
  for (int m : {v.active_memtable, v.immutable_memtable}) {
    if (m < 0) continue;
    MemTable mem = memtables_.Get(m);
    for (const MemNode* node = mem.Seek(start); node != nullptr && node->key() < end;
         node = mem.Next(node)) {
      LeafEntry entry;
      Status s = MemNodeEntry(node, &entry);
      if (!s.ok()) return s;
      total += EntryBytes(entry);
    }
  }
  TreeContext ctx = Trees(NodeChecks::kOncePerProcess);
  double levels = 0;
  for (uint32_t level = 1; level <= options_.max_levels; level++) {
    double level_bytes;
    Status s = TreeRangeBytes(ctx, v.levels[level], start, end, &level_bytes);
    if (!s.ok()) return s;
    levels += level_bytes;
  }
  *bytes = total + uint64_t(std::llround(levels));
  return Status::OK();
}

}  // namespace slipstream::engine
