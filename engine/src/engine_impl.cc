// EngineImpl: opening and attaching, point reads, stats. The other units of the engine are
// listed in engine_impl.h.
#include "engine_impl.h"

#include <chrono>
#include <filesystem>
#include <thread>

#include "log_scanner.h"

namespace slipstream::engine {

namespace {

bool IsPowerOfTwo(uint64_t v) { return v && !(v & (v - 1)); }

}  // namespace

const char* SegmentKindName(SegmentKind kind) {
  switch (kind) {
    case SegmentKind::kFree: return "free";
    case SegmentKind::kL0Log: return "L0 log";
    case SegmentKind::kMediumLog: return "medium log";
    case SegmentKind::kLargeLog: return "large log";
    case SegmentKind::kIndex: return "index";
    case SegmentKind::kBloom: return "bloom";
    case SegmentKind::kReserved: return "reserved";
  }
  return "unknown";
}

// ---------------------------------------------------------------------------------------------
// Opening

size_t Engine::ArenaSize(const Options& options) { return ArenaLayout::For(options).total; }

Status Engine::Open(const Options& options, void* arena, size_t arena_size,
                    std::unique_ptr<Engine>* engine) {
  Status s = EngineImpl::ValidateOptions(options);
  if (!s.ok()) return s;
  if (arena == nullptr || arena_size < ArenaSize(options)) {
    return Status::InvalidArgument("arena is smaller than Engine::ArenaSize(options)");
  }
  auto impl = std::make_unique<EngineImpl>(options, static_cast<char*>(arena), arena_size);
  s = impl->OpenOrAttach();
  if (s.ok()) *engine = std::move(impl);
  return s;
}

// Every limit a user can set, with the reason it exists.
Status EngineImpl::ValidateOptions(const Options& o) {
  auto bad = [](const std::string& m) { return Status::InvalidArgument(m); };
  if (o.directory.empty()) return bad("directory is empty");
  if (!IsPowerOfTwo(o.segment_size) || o.segment_size < (256u << 10) || o.segment_size > (1u << 30)) {
    return bad("segment_size must be a power of two from 256 KiB to 1 GiB");
  }
  if (!IsPowerOfTwo(o.node_size) || o.node_size < 1024 || o.node_size > 65536 ||
      o.node_size > o.segment_size / 8) {
    return bad("node_size must be a power of two from 1 KiB to 64 KiB and at most segment_size/8");
  }
  if (o.max_key_size < 1 || o.max_key_size > 4096) return bad("max_key_size must be 1..4096");
  if (o.small_threshold < 1 || o.small_threshold >= o.large_threshold) {
    return bad("small_threshold must be at least 1 and below large_threshold");
  }
  // Three of the biggest in-place entries (a medium value just below large_threshold, or a
  // pointer) must fit in one node, so that every B+-tree layer shrinks.
  uint64_t biggest = 16 + o.max_key_size + kKeyspacePrefix + o.large_threshold + 16;
  if (3 * biggest + kNodeHeaderSize > o.node_size) {
    return bad("node_size too small for max_key_size and large_threshold (3 entries must fit)");
  }
  if (o.max_value_size < 1 || o.max_value_size > o.segment_size / 2) {
    return bad("max_value_size must be 1..segment_size/2 (a large value lives in one segment)");
  }
  if (o.l0_size < (1u << 20) || o.l0_size > (1ull << 30)) return bad("l0_size must be 1 MiB..1 GiB");
  if (o.memtables < 2 || o.memtables > uint32_t(kMaxMemtables)) return bad("memtables must be 2..8");
  if (o.growth_factor < 2 || o.growth_factor > 64) return bad("growth_factor must be 2..64");
  if (o.max_levels < 1 || o.max_levels > uint32_t(kMaxLevels)) return bad("max_levels must be 1..12");
  if (o.medium_inplace_level > o.max_levels) return bad("medium_inplace_level must be 0..max_levels");
  if (!(o.gc_threshold > 0.0 && o.gc_threshold <= 1.0)) return bad("gc_threshold must be in (0, 1]");
  if (o.flush_interval_ms < 1 || o.flush_interval_ms > 10000) return bad("flush_interval_ms must be 1..10000");
  if (o.bloom_bits_per_key < 1 || o.bloom_bits_per_key > 64) return bad("bloom_bits_per_key must be 1..64");
  if (o.max_device_size % o.segment_size != 0 || o.max_device_size / o.segment_size < 16 ||
      o.max_device_size / o.segment_size > (1ull << 31)) {
    return bad("max_device_size must be a multiple of segment_size, 16..2^31 segments");
  }
  return Status::OK();
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
        shared_->segment_size != options_.segment_size || shared_->node_size != options_.node_size ||
        shared_->l0_size != options_.l0_size || shared_->max_levels != options_.max_levels ||
        shared_->memtables.count != options_.memtables ||
        shared_->max_segments != options_.max_device_size / options_.segment_size) {
      return Status::InvalidArgument("options differ from those the arena was opened with");
    }
  }
  Status s = device_.Open(options_.directory + "/segments", options_.segment_size,
                          options_.max_device_size);
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
  s->write_mu.Init();
  s->compaction_mu.Init();
  background_.Format();
  segments_.Format(layout.segment_table, s->max_segments);
  keyspaces_.Format(layout.keyspace_table);
  memtables_.Format(layout.memtables, layout.memtable_stride, layout.memtable_header,
                    options_.memtables);
  reclaimer_.Format();
  logs_.Format(layout.l0_buffers, layout.large_buffers);
  levels_.Format();
}

TreeContext EngineImpl::Trees() const {
  return TreeContext{&device_, &segments_.info(0), segments_.count(),
                     options_.node_size, options_.segment_size, options_.verify_checksums};
}

Status EngineImpl::Sync(Lsn lsn) { return logs_.Sync(lsn); }

// ---------------------------------------------------------------------------------------------
// Reads

// Memtables (newest first), then each level whose bloom filter admits the key.
Status EngineImpl::FindEntry(const Version& v, std::string_view ikey, uint64_t max_lsn,
                             bool* found, LeafEntry* entry) {
  *found = false;
  for (int m : {v.active_memtable, v.immutable_memtable}) {
    if (m < 0) continue;
    const MemNode* node = memtables_.Get(m).Find(ikey, max_lsn);
    if (node == nullptr) continue;
    *found = true;
    return MemNodeEntry(node, entry);
  }
  TreeContext ctx = Trees();
  uint64_t hash = HashKey(ikey);
  for (uint32_t level = 1; level <= options_.max_levels; level++) {
    const LevelDesc& desc = v.levels[level];
    if (desc.tree_id == 0 || !TreeMayContain(ctx, desc, hash)) continue;
    Status s = TreeGet(ctx, desc, ikey, found, entry);
    if (!s.ok() || *found) return s;
  }
  return Status::OK();
}

Status EngineImpl::Get(KeyspaceId ks, std::string_view key, std::string* value) {
  if (!keyspaces_.IsLive(ks)) {
    return Status::InvalidArgument("keyspace " + std::to_string(ks) + " is not live");
  }
  if (key.size() > options_.max_key_size) return Status::InvalidArgument("key exceeds max_key_size");
  std::string ikey = MakeInternalKey(ks, key);
  EpochPin pin(&shared_->epochs);
  Version v = levels_.Current();
  bool found;
  LeafEntry entry;
  Status s = FindEntry(v, ikey, UINT64_MAX, &found, &entry);
  if (!s.ok()) return s;
  if (!found || entry.kind == ValueKind::kTombstone) return Status::NotFound();
  return logs_.ReadValue(ikey, entry, value);
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
  }
  const SharedCounters& c = shared_->counters;
  st.user_bytes_written = c.user_bytes_written;
  st.device_bytes_written = c.device_bytes_written;
  st.device_bytes_read = c.device_bytes_read;
  st.compactions = c.compactions;
  st.compaction_bytes_written = c.compaction_bytes_written;
  st.gc_runs = c.gc_runs;
  st.gc_bytes_relocated = c.gc_bytes_relocated;
  st.gc_reclaimed_bytes = c.gc_reclaimed_bytes;
  st.stall_count = c.stall_count;
  st.stall_micros = c.stall_micros;
  st.log_flushes = c.log_flushes;
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

}  // namespace slipstream::engine
