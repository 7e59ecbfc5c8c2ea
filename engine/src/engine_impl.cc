// EngineImpl: arena layout, attach, the write path (logs + memtable), log flushing with group
// commit, point reads, keyspaces, segment allocation and epoch-based reclamation.
#include "engine_impl.h"

#include <lz4.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>

#include "clock.h"
#include "coding.h"
#include "crc32c.h"
#include "log_scanner.h"
#include "options_internal.h"
#include "process.h"

namespace slipstream::engine {

namespace {

constexpr uint32_t kLogReserve = 64;  // room always kept for a NEXT record and its checksum
constexpr size_t kAlign = 4096;

size_t AlignUp(size_t n) { return (n + kAlign - 1) & ~(kAlign - 1); }

// A random nonce per log segment use (seeds its checksum chain).
uint64_t RandomNonce() {
  thread_local std::mt19937_64 rng(std::random_device{}() ^ uint64_t(getpid()) << 32);
  return rng();
}

uint64_t MemtableCapacity(const Options& o) { return o.l0_size + o.segment_size + (64u << 10); }

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

// Offsets of the arena's parts; every part is page aligned.
void EngineImpl::Layout(const Options& o, size_t* total, size_t* segment_table,
                        size_t* keyspace_table, size_t* memtables, size_t* l0_buffers,
                        size_t* large_buffers) {
  size_t off = AlignUp(sizeof(SharedState));
  *segment_table = off;
  off = AlignUp(off + (o.max_device_size / o.segment_size) * sizeof(SegmentInfo));
  *keyspace_table = off;
  off = AlignUp(off + kKeyspaceSlots * sizeof(KeyspaceSlot));
  *memtables = off;
  off = AlignUp(off + o.memtables * AlignUp(sizeof(MemtableHeader) + MemtableCapacity(o)));
  *l0_buffers = off;
  off += size_t(kL0LogBuffers) * o.segment_size;
  *large_buffers = off;
  off += size_t(kLargeLogBuffers) * o.segment_size;
  *total = off;
}

EngineImpl::EngineImpl(const Options& options, char* arena, size_t arena_size)
    : options_(options),
      arena_(arena),
      arena_size_(arena_size),
      shared_(reinterpret_cast<SharedState*>(arena)) {}

EngineImpl::~EngineImpl() = default;

// The first opener of a zeroed arena recovers; everyone else waits for it and attaches.
Status EngineImpl::OpenOrAttach() {
  Device* dev = nullptr;
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
        shared_->memtable_count != options_.memtables ||
        shared_->max_segments != options_.max_device_size / options_.segment_size) {
      return Status::InvalidArgument("options differ from those the arena was opened with");
    }
  }
  Status s = Device::Open(options_.directory + "/segments", options_.segment_size,
                          options_.max_device_size, &dev);
  device_.reset(dev);
  if (first) {
    if (s.ok()) {
      FormatArena();
      s = Recover();
    }
    shared_->state.store(s.ok() ? kArenaReady : kArenaFailed);
  }
  return s;
}

// Initialises locks, offsets and the log buffer descriptors of a zeroed arena.
void EngineImpl::FormatArena() {
  size_t total, seg_table, ks_table, memtables, l0_buffers, large_buffers;
  Layout(options_, &total, &seg_table, &ks_table, &memtables, &l0_buffers, &large_buffers);
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
  s->flush_mu.Init();
  s->alloc_mu.Init();
  s->compaction_mu.Init();
  s->bg_mu.Init();
  s->bg_cv.Init();
  s->epoch.store(1);
  for (auto& slot : s->readers) slot.memtables.store(ReaderSlot::kAllMemtables);
  s->next_tree_id = 1;
  s->next_keyspace_id = 1;
  s->segment_table_offset = seg_table;
  s->keyspace_table_offset = ks_table;
  size_t mem_stride = AlignUp(sizeof(MemtableHeader) + MemtableCapacity(options_));
  s->memtable_count = options_.memtables;
  for (int i = 0; i < int(options_.memtables); i++) {
    s->memtable_offset[i] = memtables + i * mem_stride;
    MemtableHeader* h = MemHeader(i);
    h->data_offset = s->memtable_offset[i] + AlignUp(sizeof(MemtableHeader));
    h->capacity = mem_stride - AlignUp(sizeof(MemtableHeader));
  }
  Memtable(0).Reset();
  MemHeader(0)->in_use.store(1);
  s->current.active_memtable = 0;
  s->current.immutable_memtable = -1;
  SharedLog* logs[2] = {&s->l0_log, &s->large_log};
  size_t bases[2] = {l0_buffers, large_buffers};
  uint32_t counts[2] = {kL0LogBuffers, kLargeLogBuffers};
  for (int l = 0; l < 2; l++) {
    logs[l]->kind = uint32_t(l == 0 ? LogKind::kL0 : LogKind::kLarge);
    logs[l]->buffer_count = counts[l];
    for (uint32_t b = 0; b < counts[l]; b++) {
      logs[l]->buffers[b].data_offset = bases[l] + size_t(b) * options_.segment_size;
    }
  }
}

MemTable EngineImpl::Memtable(int index) const {
  MemtableHeader* h = MemHeader(index);
  return MemTable(h, arena_ + h->data_offset);
}

TreeContext EngineImpl::Trees() const {
  return TreeContext{device_.get(), segments(), shared_->device_segments, options_.node_size,
                     options_.segment_size, options_.verify_checksums};
}

// Seqlock read of the current version.
Version EngineImpl::ReadVersion() const {
  Version v;
  while (true) {
    uint32_t s1 = shared_->version_seq.load(std::memory_order_acquire);
    if (s1 & 1) {
      std::this_thread::yield();
      continue;
    }
    std::memcpy(static_cast<void*>(&v), &shared_->current, sizeof(Version));
    std::atomic_thread_fence(std::memory_order_acquire);
    if (shared_->version_seq.load(std::memory_order_relaxed) == s1) return v;
  }
}

// ---------------------------------------------------------------------------------------------
// Epochs and reclamation

EpochPin::EpochPin(SharedState* s) {
  pid_t pid = CurrentPid();
  uint64_t word = ReaderSlot::Pack(s->epoch.load(), pid);
  int start = int((uint32_t(pid) * 2654435761u +
                   uint32_t(std::hash<std::thread::id>()(std::this_thread::get_id()))) %
                  kMaxReaders);
  while (true) {
    for (int i = 0; i < kMaxReaders; i++) {
      ReaderSlot* slot = &s->readers[(start + i) % kMaxReaders];
      uint64_t zero = 0;
      if (slot->word.load(std::memory_order_relaxed) == 0 &&
          slot->word.compare_exchange_strong(zero, word)) {
        slot_ = slot;
        return;
      }
    }
    std::this_thread::yield();  // all slots busy: wait for a reader to leave
  }
}

EpochPin::~EpochPin() {
  if (slot_) {
    slot_->memtables.store(ReaderSlot::kAllMemtables);  // a free slot claims all, see Reclaim
    slot_->word.store(0);
  }
}

// Queues an item to be freed once every reader that might see it has left.
void EngineImpl::Retire(RetiredItem::Kind kind, uint32_t id) {
  SharedState* s = shared_;
  if (s->retired_count == kRetireSlots) Reclaim();
  if (s->retired_count == kRetireSlots) return;  // leaked until restart; never freed early
  s->retired[s->retired_count++] = RetiredItem{kind, id, s->epoch.fetch_add(1)};
}

// Frees retired items older than every pinned epoch (called with compaction_mu held). Slots of
// processes that died are cleared first.
void EngineImpl::Reclaim() {
  SharedState* s = shared_;
  uint64_t min_epoch = UINT64_MAX;
  uint64_t min_epoch_of_memtable[kMaxMemtables];
  std::fill(std::begin(min_epoch_of_memtable), std::end(min_epoch_of_memtable), UINT64_MAX);
  for (auto& slot : s->readers) {
    uint64_t word = slot.word.load();
    if (word == 0) continue;
    int pid = ReaderSlot::PidOf(word);
    if (pid != CurrentPid() && kill(pid, 0) != 0 && errno == ESRCH) {
      slot.memtables.store(ReaderSlot::kAllMemtables);
      slot.word.compare_exchange_strong(word, 0);  // its process died while reading
      continue;
    }
    uint64_t epoch = ReaderSlot::EpochOf(word);
    min_epoch = std::min(min_epoch, epoch);
    uint32_t mask = slot.memtables.load();
    for (int m = 0; m < kMaxMemtables; m++) {
      if (mask & (1u << m)) min_epoch_of_memtable[m] = std::min(min_epoch_of_memtable[m], epoch);
    }
  }
  uint32_t kept = 0;
  for (uint32_t i = 0; i < s->retired_count; i++) {
    RetiredItem item = s->retired[i];
    uint64_t limit = item.kind == RetiredItem::kMemtable ? min_epoch_of_memtable[item.id] : min_epoch;
    if (item.epoch >= limit) {
      s->retired[kept++] = item;
      continue;
    }
    if (item.kind == RetiredItem::kMemtable) {
      MemHeader(int(item.id))->in_use.store(0);
    } else if (item.kind == RetiredItem::kTree) {
      SharedLock lock(&s->alloc_mu);
      for (uint64_t seg = 1; seg < s->device_segments; seg++) {
        SegmentInfo& info = segments()[seg];
        if ((info.kind == uint8_t(SegmentKind::kIndex) || info.kind == uint8_t(SegmentKind::kBloom)) &&
            info.owner == item.id) {
          info = SegmentInfo{};
        }
      }
    } else {
      SharedLock lock(&s->alloc_mu);
      SegmentInfo& info = segments()[item.id];
      if (info.kind == uint8_t(SegmentKind::kLargeLog) || info.kind == uint8_t(SegmentKind::kMediumLog)) {
        s->counters.gc_reclaimed_bytes += info.bytes_written;
      }
      info = SegmentInfo{};
    }
  }
  s->retired_count = kept;
}

// First free segment from the allocation hint; grows the device file when none is free.
Status EngineImpl::AllocateSegment(SegmentKind kind, uint32_t owner, uint32_t* segment) {
  SharedLock lock(&shared_->alloc_mu);
  SegmentInfo* table = segments();
  while (true) {
    uint64_t n = shared_->device_segments;
    for (uint64_t i = 0; i < n; i++) {
      uint64_t idx = (shared_->alloc_hint + i) % n;
      if (idx == 0 || table[idx].kind != uint8_t(SegmentKind::kFree)) continue;
      table[idx] = SegmentInfo{};
      table[idx].kind = uint8_t(kind);
      table[idx].owner = owner;
      shared_->alloc_hint = uint32_t(idx + 1);
      *segment = uint32_t(idx);
      return Status::OK();
    }
    uint64_t max = shared_->max_segments;
    uint64_t grown = std::min<uint64_t>(max, n + std::max<uint64_t>(64, n / 8));
    if (grown <= n) return Status::IOError("device is full: raise max_device_size");
    Status s = device_->Grow(grown);
    if (!s.ok()) return s;
    shared_->device_segments = grown;
  }
}

// ---------------------------------------------------------------------------------------------
// Keyspaces

KeyspaceSlot* EngineImpl::FindKeyspaceSlot(KeyspaceId id) const {
  KeyspaceSlot* slots = keyspace_slots();
  uint32_t mask = kKeyspaceSlots - 1;
  for (uint32_t i = 0, idx = (id * 2654435761u) & mask; i < kKeyspaceSlots; i++, idx = (idx + 1) & mask) {
    uint32_t state = slots[idx].state.load(std::memory_order_acquire);
    if (state == KeyspaceSlot::kEmpty) return nullptr;
    if (state != KeyspaceSlot::kDeleted && slots[idx].id == id) return &slots[idx];
  }
  return nullptr;
}

KeyspaceSlot* EngineImpl::InsertKeyspaceSlot(KeyspaceId id) {
  if (KeyspaceSlot* existing = FindKeyspaceSlot(id)) return existing;
  KeyspaceSlot* slots = keyspace_slots();
  uint32_t mask = kKeyspaceSlots - 1;
  for (uint32_t i = 0, idx = (id * 2654435761u) & mask; i < kKeyspaceSlots; i++, idx = (idx + 1) & mask) {
    uint32_t state = slots[idx].state.load();
    if (state == KeyspaceSlot::kEmpty || state == KeyspaceSlot::kDeleted) {
      slots[idx].id = id;
      return &slots[idx];
    }
  }
  return nullptr;
}

bool EngineImpl::KeyspaceLive(KeyspaceId id) const {
  KeyspaceSlot* slot = FindKeyspaceSlot(id);
  return slot && slot->state.load(std::memory_order_acquire) == KeyspaceSlot::kLive;
}

// Appends a keyspace record under the write mutex, making room in the L0 log first.
void EngineImpl::AppendKeyspaceRecord(LogRecordType type, KeyspaceId id, uint64_t tag,
                                          Lsn* lsn) {
  SharedLog* log = &shared_->l0_log;
  char payload[12];
  EncodeFixed32(payload, id);
  EncodeFixed64(payload + 4, tag);
  *lsn = shared_->last_lsn.load() + 1;
  shared_->last_lsn.store(*lsn);
  SharedLogBuffer& b = log->buffers[log->current];
  AppendRecord(LogBuffer(b), &log->cursor, type, *lsn,
               {std::string_view(payload, type == LogRecordType::kKeyspaceDrop ? 4 : 12)});
  AppendChecksum(LogBuffer(b), &log->cursor);
  PublishAppends(log);
  shared_->counters.unflushed_records++;
}

// Makes room for a small control record in the L0 log (rotating, or flushing to free a
// buffer first); the write mutex is held on entry and on return.
Status EngineImpl::MakeL0LogRoom(std::unique_lock<SharedMutex>* lock) {
  while (!LogHasRoom(shared_->l0_log, 64)) {
    if (FreeBuffersAhead(shared_->l0_log) > 0) return RotateLog(&shared_->l0_log);
    lock->unlock();
    Status s = FlushLogs(false, 0);
    lock->lock();
    if (!s.ok()) return s;
  }
  return Status::OK();
}

Status EngineImpl::CreateKeyspace(uint64_t tag, KeyspaceId* id) {
  Lsn lsn;
  {
    std::unique_lock<SharedMutex> lock(shared_->write_mu);
    Status s = MakeL0LogRoom(&lock);
    if (!s.ok()) return s;
    KeyspaceSlot* slots = keyspace_slots();
    for (uint32_t i = 0; i < kKeyspaceSlots; i++) {
      if (slots[i].state.load() == KeyspaceSlot::kLive && slots[i].tag == tag) {
        return Status::InvalidArgument("a live keyspace already has tag " + std::to_string(tag));
      }
    }
    KeyspaceId new_id = shared_->next_keyspace_id;
    KeyspaceSlot* slot = InsertKeyspaceSlot(new_id);
    if (slot == nullptr) return Status::Busy("keyspace table is full");
    shared_->next_keyspace_id++;
    AppendKeyspaceRecord(LogRecordType::kKeyspaceCreate, new_id, tag, &lsn);
    slot->tag = tag;
    slot->state.store(KeyspaceSlot::kLive, std::memory_order_release);
    *id = new_id;
  }
  return Sync(lsn);
}

Status EngineImpl::LookupKeyspace(uint64_t tag, KeyspaceId* id) {
  KeyspaceSlot* slots = keyspace_slots();
  for (uint32_t i = 0; i < kKeyspaceSlots; i++) {
    if (slots[i].state.load() == KeyspaceSlot::kLive && slots[i].tag == tag) {
      *id = slots[i].id;
      return Status::OK();
    }
  }
  return Status::NotFound("no keyspace with tag " + std::to_string(tag));
}

// Collects the live slots; a keyspace created or dropped meanwhile may or may not appear.
Status EngineImpl::ListKeyspaces(std::vector<std::pair<uint64_t, KeyspaceId>>* keyspaces) {
  keyspaces->clear();
  KeyspaceSlot* slots = keyspace_slots();
  for (uint32_t i = 0; i < kKeyspaceSlots; i++) {
    if (slots[i].state.load() == KeyspaceSlot::kLive) {
      keyspaces->emplace_back(slots[i].tag, slots[i].id);
    }
  }
  return Status::OK();
}

// Marks the keyspace dropped (O(1)); compaction discards its entries and frees their space.
Status EngineImpl::DropKeyspace(KeyspaceId id) {
  Lsn lsn;
  {
    std::unique_lock<SharedMutex> lock(shared_->write_mu);
    KeyspaceSlot* slot = FindKeyspaceSlot(id);
    if (slot == nullptr || slot->state.load() != KeyspaceSlot::kLive) {
      return Status::InvalidArgument("keyspace " + std::to_string(id) + " is not live");
    }
    Status s = MakeL0LogRoom(&lock);
    if (!s.ok()) return s;
    slot = FindKeyspaceSlot(id);  // the lock may have been released meanwhile
    if (slot == nullptr || slot->state.load() != KeyspaceSlot::kLive) {
      return Status::InvalidArgument("keyspace " + std::to_string(id) + " is not live");
    }
    slot->state.store(KeyspaceSlot::kDropped);
    AppendKeyspaceRecord(LogRecordType::kKeyspaceDrop, id, 0, &lsn);
  }
  shared_->reclaim_pending.store(1);
  WakeBackground();
  return Sync(lsn);
}

// ---------------------------------------------------------------------------------------------
// Write path

Status EngineImpl::Put(KeyspaceId ks, std::string_view key, std::string_view value, Lsn* lsn) {
  std::vector<WriteOp> ops(1);
  ops[0].type = WriteOp::kPut;
  ops[0].keyspace = ks;
  ops[0].key = key;
  ops[0].value = value;
  return WriteOps(ops, lsn);
}

Status EngineImpl::Delete(KeyspaceId ks, std::string_view key, Lsn* lsn) {
  std::vector<WriteOp> ops(1);
  ops[0].type = WriteOp::kDelete;
  ops[0].keyspace = ks;
  ops[0].key = key;
  return WriteOps(ops, lsn);
}

Status EngineImpl::Write(const WriteBatch& batch, Lsn* lsn) {
  std::vector<WriteOp> ops(batch.Count());
  for (size_t i = 0; i < ops.size(); i++) {
    const WriteBatch::Op& op = batch.ops()[i];
    ops[i].type = op.is_delete ? WriteOp::kDelete : WriteOp::kPut;
    ops[i].keyspace = op.keyspace;
    ops[i].key = op.key;
    ops[i].value = op.value;
  }
  if (ops.empty()) {
    if (lsn) *lsn = shared_->last_lsn.load();
    return Status::OK();
  }
  return WriteOps(ops, lsn);
}

// Validates one operation and encodes what can be encoded outside the write mutex (internal
// key, LZ4 compression of large values); adds up the space it needs.
Status EngineImpl::PrepareOp(WriteOp* op, size_t* l0_bytes, size_t* large_bytes,
                             uint64_t* mem_bytes) {
  if (!KeyspaceLive(op->keyspace)) {
    return Status::InvalidArgument("keyspace " + std::to_string(op->keyspace) + " is not live");
  }
  if (op->key.size() > options_.max_key_size) {
    return Status::InvalidArgument("key of " + std::to_string(op->key.size()) +
                                   " bytes exceeds max_key_size");
  }
  if (op->type == WriteOp::kPut && op->value.size() > options_.max_value_size) {
    return Status::InvalidArgument("value of " + std::to_string(op->value.size()) +
                                   " bytes exceeds max_value_size");
  }
  op->ikey = MakeInternalKey(op->keyspace, op->key);
  size_t key_part = VarintLength(uint32_t(op->ikey.size())) + op->ikey.size();
  size_t mem_value = 0;
  bool large = op->type == WriteOp::kRelocate ||
               (op->type == WriteOp::kPut && op->key.size() + op->value.size() >= options_.large_threshold);
  if (op->type == WriteOp::kRelocate) {
    op->encoded.assign(op->value);
  } else if (large) {
    // kValue payload: varint ikey size, ikey, flags, raw size, bytes (LZ4 if it saves space).
    op->value_size = uint32_t(op->value.size());
    op->encoded.resize(key_part + 5 + size_t(LZ4_compressBound(int(op->value.size()))));
    char* p = EncodeVarint32(op->encoded.data(), uint32_t(op->ikey.size()));
    std::memcpy(p, op->ikey.data(), op->ikey.size());
    p += op->ikey.size();
    char* flags = p++;
    EncodeFixed32(p, uint32_t(op->value.size()));
    p += 4;
    int n = 0;
    if (options_.compress_large) {
      // Acceleration 4: about twice the speed of the default for a few percent of ratio; this
      // runs on the writer's thread.
      n = LZ4_compress_fast(op->value.data(), p, int(op->value.size()),
                            int(op->encoded.size() - (p - op->encoded.data())), 4);
    }
    if (n > 0 && size_t(n) < op->value.size() - op->value.size() / 8) {
      *flags = char(kValueFlagLz4);
    } else {
      *flags = 0;
      std::memcpy(p, op->value.data(), op->value.size());
      n = int(op->value.size());
    }
    op->encoded.resize(size_t(p - op->encoded.data()) + size_t(n));
  }
  if (large) {
    *large_bytes += RecordSpace(op->encoded.size()) + kChecksumEntrySize;
    *l0_bytes += RecordSpace(key_part + 1 + ValuePtr::kEncodedSize);
    mem_value = ValuePtr::kEncodedSize;
  } else if (op->type == WriteOp::kPut) {
    *l0_bytes += RecordSpace(key_part + 1 + op->value.size());
    mem_value = op->value.size();
  } else {
    *l0_bytes += RecordSpace(key_part);
  }
  *mem_bytes += MemTable::EntrySpace(op->ikey.size(), mem_value);
  return Status::OK();
}

// True if `bytes` (plus room for a NEXT record) fit in the active segment.
bool EngineImpl::LogHasRoom(const SharedLog& log, size_t bytes) const {
  return log.cursor.pos + bytes + kLogReserve <= options_.segment_size;
}

// Buffers after the active one that are free to start a new segment in.
int EngineImpl::FreeBuffersAhead(const SharedLog& log) const {
  int n = 0;
  for (uint32_t i = 1; i < log.buffer_count; i++) {
    const SharedLogBuffer& b = log.buffers[(log.current + i) % log.buffer_count];
    if (b.state.load() != SharedLogBuffer::kFree || b.pins != 0) break;
    n++;
  }
  return n;
}

// Seals the active segment with a NEXT record naming a freshly zeroed segment, and starts that
// segment in the next buffer (which the caller made sure is free).
Status EngineImpl::RotateLog(SharedLog* log) {
  SegmentKind kind = log->kind == uint32_t(LogKind::kL0) ? SegmentKind::kL0Log : SegmentKind::kLargeLog;
  uint32_t segment;
  Status s = AllocateSegment(kind, 0, &segment);
  if (!s.ok()) return s;
  s = device_->ZeroSegment(segment);
  if (!s.ok()) return s;
  uint64_t sequence = log->next_sequence++;
  {
    SharedLock lock(&shared_->alloc_mu);
    segments()[segment].sequence = sequence;
  }
  SharedLogBuffer& cur = log->buffers[log->current];
  if (cur.state.load() == SharedLogBuffer::kActive) {
    char payload[12];
    EncodeFixed32(payload, segment);
    EncodeFixed64(payload + 4, sequence);
    AppendRecord(LogBuffer(cur), &log->cursor, LogRecordType::kNext, shared_->last_lsn.load(),
                 {std::string_view(payload, 12)});
    AppendChecksum(LogBuffer(cur), &log->cursor);
    cur.appended.store(log->cursor.pos, std::memory_order_release);
    cur.state.store(SharedLogBuffer::kSealed);
    SharedLock lock(&shared_->alloc_mu);
    segments()[cur.segment].flags |= kSegmentSealed;
  }
  uint32_t next = (log->current + 1) % log->buffer_count;
  SharedLogBuffer& nb = log->buffers[next];
  nb.generation.fetch_add(1);
  nb.segment = segment;
  nb.sequence = sequence;
  nb.written = 0;
  nb.pins = 0;
  std::memset(LogBuffer(nb), 0, options_.segment_size);
  StartLogSegment(LogBuffer(nb), options_.segment_size, LogKind(log->kind), sequence, segment,
                  RandomNonce(), &log->cursor);
  nb.appended.store(log->cursor.pos, std::memory_order_release);
  nb.state.store(SharedLogBuffer::kActive);
  log->current = next;
  WakeBackground();  // the sealed buffer should be written out before writers need it again
  return Status::OK();
}

void EngineImpl::PublishAppends(SharedLog* log) {
  log->buffers[log->current].appended.store(log->cursor.pos, std::memory_order_release);
}

// Switches the full active memtable to immutable if the other one is free; false otherwise.
bool EngineImpl::SwitchMemtable(bool force) {
  Version& v = shared_->current;
  if (v.immutable_memtable != -1) return false;
  int other = -1;
  for (int i = 0; i < int(shared_->memtable_count) && other < 0; i++) {
    if (i != v.active_memtable && MemHeader(i)->in_use.load() == 0) other = i;
  }
  if (other < 0) return false;  // every other slot is still pinned by readers
  if (!force && Memtable(v.active_memtable).entries() == 0) return false;
  Memtable(other).Reset();
  MemHeader(other)->in_use.store(1);
  shared_->version_seq.fetch_add(1);
  v.immutable_memtable = v.active_memtable;
  v.active_memtable = other;
  v.active_first_log_sequence = shared_->l0_log.buffers[shared_->l0_log.current].sequence;
  v.immutable_first_large_sequence = v.active_first_large_sequence;
  v.active_first_large_sequence = shared_->large_log.buffers[shared_->large_log.current].sequence;
  shared_->version_seq.fetch_add(1);
  WakeBackground();
  return true;
}

// Back-pressure: when the active memtable is full and the immutable one is still being
// compacted, the writer waits (and the wait is counted as a stall).
Status EngineImpl::EnsureMemtableRoom(uint64_t mem_bytes, std::unique_lock<SharedMutex>* lock,
                                      bool may_stall) {
  uint64_t pinned_since = 0;  // when this writer first found every free slot pinned
  while (true) {
    MemTable active = Memtable(shared_->current.active_memtable);
    // Large values live in the large log, but their overwritten versions only become garbage
    // once compaction sees them: bound what L0 may point at as well as its own size.
    bool full = active.used() + mem_bytes > options_.l0_size ||
                active.large_bytes() > options_.l0_size * options_.growth_factor;
    if ((!full || active.entries() == 0) && active.HasRoom(mem_bytes)) return Status::OK();
    if (SwitchMemtable(false)) continue;
    if (!may_stall) return Status::Busy("memtable full");
    if (shared_->bg_failed.load()) {
      return Status::IOError(std::string("background compaction failed: ") + shared_->bg_error);
    }
    if (options_.interrupted && options_.interrupted()) {
      return Status::Busy("interrupted while waiting for memtable room");
    }
    uint64_t start = NowMicros();
    if (shared_->current.immutable_memtable >= 0) {
      pinned_since = 0;  // compaction will make room
    } else if (pinned_since == 0) {
      pinned_since = start;
    } else if (options_.pinned_wait_ms != 0 && start - pinned_since >= uint64_t(options_.pinned_wait_ms) * 1000) {
      return Status::Busy("every memtable is pinned by long-running readers (scans or cursors open for " +
                          std::to_string(options_.pinned_wait_ms / 1000) +
                          " s or more); writes resume when they finish");
    }
    shared_->counters.stall_count++;
    lock->unlock();
    bool compacted = false;
    if (shared_->compaction_mu.TryLock()) {
      // Nobody is compacting: this writer does the L0 compaction it is waiting for.
      Status s;
      if (ReadVersion().immutable_memtable >= 0) {
        s = CompactL0Locked();
        compacted = true;
      }
      Reclaim();
      shared_->compaction_mu.Unlock();
      if (!s.ok()) {
        RecordBackgroundError(s);
        return s;
      }
    }
    if (!compacted) {  // waiting for another compactor, or for readers to release a memtable
      SharedLock bg(&shared_->bg_mu);
      shared_->bg_pending.store(1);
      shared_->bg_cv.NotifyAll();
      shared_->bg_cv.WaitFor(&shared_->bg_mu, 2);
    }
    lock->lock();
    shared_->counters.stall_micros += NowMicros() - start;
  }
}

// Appends one operation's records (large value first, then its L0 record) and inserts it
// into the active memtable.
Status EngineImpl::ApplyOp(WriteOp* op, Lsn lsn, bool* large_touched) {
  SharedLog* l0 = &shared_->l0_log;
  char kind_byte;
  char ptr_buf[ValuePtr::kEncodedSize];
  char varint[5];
  std::string_view key_len(varint, size_t(EncodeVarint32(varint, uint32_t(op->ikey.size())) - varint));
  MemTable active = Memtable(shared_->current.active_memtable);
  if (!op->encoded.empty()) {
    SharedLog* large = &shared_->large_log;
    if (!LogHasRoom(*large, RecordSpace(op->encoded.size()) + kChecksumEntrySize)) {
      Status s = RotateLog(large);
      if (!s.ok()) return s;
    }
    SharedLogBuffer& b = large->buffers[large->current];
    uint32_t off = AppendRecord(LogBuffer(b), &large->cursor, LogRecordType::kValue, lsn, {op->encoded});
    AppendChecksum(LogBuffer(b), &large->cursor);
    ValuePtr ptr{{b.segment, off}, RecordSpace(op->encoded.size()), op->value_size};
    if (op->type == WriteOp::kRelocate) ptr.value_size = op->relocate_from.value_size;
    segments()[b.segment].bytes_written += ptr.record_bytes;
    ptr.EncodeTo(ptr_buf);
    kind_byte = char(ValueKind::kLargePtr);
    SharedLogBuffer& lb = l0->buffers[l0->current];
    std::string_view ptr_view(ptr_buf, ValuePtr::kEncodedSize);
    AppendRecord(LogBuffer(lb), &l0->cursor, LogRecordType::kPut, lsn,
                 {key_len, op->ikey, std::string_view(&kind_byte, 1), ptr_view});
    active.Insert(op->ikey, lsn, ValueKind::kLargePtr, ptr_view);
    active.AddLargeBytes(ptr.record_bytes);
    *large_touched = true;
    return Status::OK();
  }
  SharedLogBuffer& lb = l0->buffers[l0->current];
  if (op->type == WriteOp::kPut) {
    kind_byte = char(ValueKind::kInline);
    AppendRecord(LogBuffer(lb), &l0->cursor, LogRecordType::kPut, lsn,
                 {key_len, op->ikey, std::string_view(&kind_byte, 1), op->value});
    active.Insert(op->ikey, lsn, ValueKind::kInline, op->value);
  } else {
    AppendRecord(LogBuffer(lb), &l0->cursor, LogRecordType::kDelete, lsn, {key_len, op->ikey});
    active.Insert(op->ikey, lsn, ValueKind::kTombstone, {});
  }
  return Status::OK();
}

// The write path: one critical section per batch; the batch lands in one L0 log segment and
// is followed by one checksum, so it is atomic across crashes.
Status EngineImpl::WriteOps(std::vector<WriteOp>& ops, Lsn* lsn, bool may_stall) {
  size_t l0_bytes = kChecksumEntrySize, large_bytes = 0;
  uint64_t mem_bytes = 0;
  for (WriteOp& op : ops) {
    Status s = PrepareOp(&op, &l0_bytes, &large_bytes, &mem_bytes);
    if (!s.ok()) return s;
  }
  if (l0_bytes > options_.segment_size / 2) {
    return Status::InvalidArgument("write batch too large: " + std::to_string(l0_bytes) +
                                   " bytes of L0 log; the limit is segment_size/2");
  }
  uint64_t large_limit = uint64_t(kLargeLogBuffers - 2) * (options_.segment_size / 2);
  if (large_bytes > large_limit) {
    return Status::InvalidArgument("write batch too large: " + std::to_string(large_bytes) +
                                   " bytes of large values in one batch");
  }
  std::unique_lock<SharedMutex> lock(shared_->write_mu);
  while (true) {
    Status s = EnsureMemtableRoom(mem_bytes, &lock, may_stall);
    if (!s.ok()) return s;
    // Count the rotations the batch needs in each log, and make sure free buffers exist.
    int l0_rotations = LogHasRoom(shared_->l0_log, l0_bytes) ? 0 : 1;
    int large_rotations = 0;
    uint32_t pos = shared_->large_log.cursor.pos;
    for (const WriteOp& op : ops) {
      if (op.encoded.empty()) continue;
      uint32_t need = RecordSpace(op.encoded.size()) + kChecksumEntrySize;
      if (pos + need + kLogReserve > options_.segment_size) {
        large_rotations++;
        pos = kLogHeaderSize;
      }
      pos += need;
    }
    if (FreeBuffersAhead(shared_->l0_log) >= l0_rotations &&
        FreeBuffersAhead(shared_->large_log) >= large_rotations) {
      break;
    }
    lock.unlock();
    s = FlushLogs(false, 0);
    if (!s.ok()) return s;
    lock.lock();
  }
  if (!LogHasRoom(shared_->l0_log, l0_bytes)) {
    Status s = RotateLog(&shared_->l0_log);
    if (!s.ok()) return s;
  }
  Version v = shared_->current;
  bool large_touched = false;
  Lsn last = shared_->last_lsn.load();
  uint64_t user_bytes = 0, applied = 0;
  for (WriteOp& op : ops) {
    if (op.type == WriteOp::kRelocate) {
      bool found = false;
      LeafEntry e;
      Status s = FindEntry(v, op.ikey, UINT64_MAX, &found, &e);
      if (!s.ok()) return s;
      if (!found || e.kind != ValueKind::kLargePtr || !(e.ptr.where == op.relocate_from.where)) {
        continue;  // overwritten or deleted since GC looked: nothing to relocate
      }
    } else {
      user_bytes += op.key.size() + op.value.size();
    }
    Lsn op_lsn = last + 1;
    Status s = ApplyOp(&op, op_lsn, &large_touched);
    if (!s.ok()) return s;
    last = op_lsn;
    shared_->last_lsn.store(last);
    applied++;
  }
  if (applied > 0) {
    SharedLog* l0 = &shared_->l0_log;
    AppendChecksum(LogBuffer(l0->buffers[l0->current]), &l0->cursor);
    PublishAppends(l0);
    if (large_touched) PublishAppends(&shared_->large_log);
  }
  shared_->counters.user_bytes_written += user_bytes;
  shared_->counters.unflushed_records += applied;
  lock.unlock();
  if (lsn) *lsn = last;
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Flushing (group commit)

// A sealed segment still in a buffer: writers need that buffer back soon.
bool EngineImpl::HasSealedLogBuffer() const {
  for (const SharedLog* log : {&shared_->l0_log, &shared_->large_log}) {
    for (uint32_t i = 0; i < log->buffer_count; i++) {
      if (log->buffers[i].state.load() == SharedLogBuffer::kSealed) return true;
    }
  }
  return false;
}

void EngineImpl::WakeBackground() {
  SharedLock lock(&shared_->bg_mu);
  shared_->bg_pending.store(1);
  shared_->bg_cv.NotifyAll();
}

bool EngineImpl::HasUnflushedLog() const {
  for (const SharedLog* log : {&shared_->l0_log, &shared_->large_log}) {
    for (uint32_t i = 0; i < log->buffer_count; i++) {
      const SharedLogBuffer& b = log->buffers[i];
      if (b.state.load() != SharedLogBuffer::kFree && b.appended.load() > b.written) return true;
      if (b.state.load() == SharedLogBuffer::kSealed) return true;
    }
  }
  return false;
}

// Writes every appended byte of both logs (large log first: an L0 record never becomes
// durable before the value it points to), then fdatasync; frees written-out sealed buffers.
// With `sync`, callers up to `wait_for` that queued behind a flush find their work done.
Status EngineImpl::FlushLogs(bool sync, Lsn wait_for) {
  SharedLock flush(&shared_->flush_mu);
  if (sync && wait_for != 0 && shared_->durable_lsn.load() >= wait_for) return Status::OK();
  struct Job {
    SharedLogBuffer* buffer;
    uint32_t end;
  };
  std::vector<Job> jobs;
  std::vector<WriteRequest> requests;
  Lsn target;
  uint64_t records;
  {
    SharedLock lock(&shared_->write_mu);
    target = shared_->last_lsn.load();
    records = shared_->counters.unflushed_records.exchange(0);
    for (SharedLog* log : {&shared_->large_log, &shared_->l0_log}) {
      for (uint32_t k = 0; k < log->buffer_count; k++) {
        // Oldest buffer first, so a sealed segment's bytes go out before its successor's.
        SharedLogBuffer& b = log->buffers[(log->current + 1 + k) % log->buffer_count];
        uint32_t state = b.state.load();
        if (state == SharedLogBuffer::kFree) continue;
        uint32_t appended = b.appended.load();
        if (appended > b.written) {
          b.pins++;
          jobs.push_back(Job{&b, appended});
          requests.push_back(WriteRequest{uint64_t(b.segment) * options_.segment_size + b.written,
                                          LogBuffer(b) + b.written, appended - b.written});
        } else if (state == SharedLogBuffer::kSealed && b.pins == 0) {
          b.state.store(SharedLogBuffer::kFree);
        }
      }
    }
  }
  uint64_t bytes = 0;
  for (const WriteRequest& r : requests) bytes += r.length;
  // Every captured record was appended before the snapshot above, so the barrier covers it.
  Status s = requests.empty() || !options_.persist_barrier ? Status::OK()
                                                            : options_.persist_barrier();
  if (s.ok()) s = device_->Write(requests, sync && options_.use_fsync);
  {
    SharedLock lock(&shared_->write_mu);
    for (const Job& j : jobs) {
      j.buffer->pins--;
      if (s.ok()) j.buffer->written = std::max(j.buffer->written, j.end);
      if (j.buffer->state.load() == SharedLogBuffer::kSealed && j.buffer->pins == 0 &&
          j.buffer->written == j.buffer->appended.load()) {
        j.buffer->state.store(SharedLogBuffer::kFree);
      }
    }
  }
  if (!s.ok()) return s;
  if (sync) {
    Lsn durable = shared_->durable_lsn.load();
    while (durable < target && !shared_->durable_lsn.compare_exchange_weak(durable, target)) {
    }
  }
  shared_->counters.device_bytes_written += bytes;
  shared_->last_flush_micros.store(NowMicros());
  if (!requests.empty() || records) {
    shared_->counters.log_flushes++;
    shared_->counters.log_records_flushed += records;
  }
  SharedLock bg(&shared_->bg_mu);
  shared_->bg_cv.NotifyAll();
  return Status::OK();
}

Status EngineImpl::Sync(Lsn lsn) {
  Lsn last = shared_->last_lsn.load();
  if (lsn > last) lsn = last;
  if (shared_->durable_lsn.load() >= lsn) return Status::OK();
  return FlushLogs(true, lsn);
}

// ---------------------------------------------------------------------------------------------
// Reads

// Memtables (newest first), then each level whose bloom filter admits the key.
Status EngineImpl::FindEntry(const Version& v, std::string_view ikey, uint64_t max_lsn,
                             bool* found, LeafEntry* entry) {
  *found = false;
  for (int m : {v.active_memtable, v.immutable_memtable}) {
    if (m < 0) continue;
    const MemNode* node = Memtable(m).Find(ikey, max_lsn);
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

// Copies a value out; log records are located, bounds-checked, checksummed and matched to the
// key before their bytes are trusted.
Status EngineImpl::ReadValue(std::string_view ikey, const LeafEntry& entry, std::string* value) {
  if (entry.kind == ValueKind::kInline) {
    value->assign(entry.inline_value);
    return Status::OK();
  }
  if (entry.kind == ValueKind::kTombstone) return Status::NotFound();
  const ValuePtr& ptr = entry.ptr;
  SegmentKind expected = entry.kind == ValueKind::kLargePtr ? SegmentKind::kLargeLog : SegmentKind::kMediumLog;
  if (ptr.where.segment == 0 || ptr.where.segment >= shared_->device_segments ||
      segments()[ptr.where.segment].kind != uint8_t(expected) ||
      ptr.where.offset < kLogHeaderSize || ptr.record_bytes < kRecordHeaderSize ||
      uint64_t(ptr.where.offset) + ptr.record_bytes > options_.segment_size) {
    return Status::Corruption("value pointer out of bounds or into a segment of another kind");
  }
  std::string record;
  bool from_buffer = false;
  if (expected == SegmentKind::kLargeLog) {
    // The record may still be only in a shared buffer; the generation check catches reuse.
    SharedLog* log = &shared_->large_log;
    for (uint32_t i = 0; i < log->buffer_count && !from_buffer; i++) {
      SharedLogBuffer& b = log->buffers[i];
      uint32_t gen = b.generation.load();
      if (b.state.load() == SharedLogBuffer::kFree || b.segment != ptr.where.segment) continue;
      record.assign(LogBuffer(b) + ptr.where.offset, ptr.record_bytes);
      std::atomic_thread_fence(std::memory_order_acquire);
      from_buffer = b.generation.load() == gen && b.segment == ptr.where.segment;
    }
  }
  if (!from_buffer) record.assign(device_->Segment(ptr.where.segment) + ptr.where.offset, ptr.record_bytes);
  RecordHeader h;
  std::memcpy(&h, record.data(), sizeof(h));
  uint32_t length = h.type_and_length >> 8;
  const char* payload = record.data() + kRecordHeaderSize;
  if ((h.type_and_length & 0xff) != uint8_t(LogRecordType::kValue) ||
      length != ptr.record_bytes - kRecordHeaderSize || crc32c::Value(payload, length) != h.payload_crc) {
    return Status::Corruption("value record damaged (bad header or checksum)");
  }
  const char* limit = payload + length;
  uint32_t key_size;
  const char* p = DecodeVarint32(payload, limit, &key_size);
  if (!p || uint64_t(limit - p) < uint64_t(key_size) + 5 || std::string_view(p, key_size) != ikey) {
    return Status::Corruption("value record belongs to another key");
  }
  p += key_size;
  uint8_t flags = uint8_t(*p++);
  uint32_t raw_size = DecodeFixed32(p);
  p += 4;
  if (raw_size > options_.max_value_size) return Status::Corruption("value record size impossible");
  if (flags & kValueFlagLz4) {
    value->resize(raw_size);
    int n = LZ4_decompress_safe(p, value->data(), int(limit - p), int(raw_size));
    if (n != int(raw_size)) return Status::Corruption("large value does not decompress");
  } else {
    if (uint32_t(limit - p) != raw_size) return Status::Corruption("value record size mismatch");
    value->assign(p, raw_size);
  }
  return Status::OK();
}

Status EngineImpl::Get(KeyspaceId ks, std::string_view key, std::string* value) {
  if (!KeyspaceLive(ks)) return Status::InvalidArgument("keyspace " + std::to_string(ks) + " is not live");
  if (key.size() > options_.max_key_size) return Status::InvalidArgument("key exceeds max_key_size");
  std::string ikey = MakeInternalKey(ks, key);
  EpochPin pin(shared_);
  Version v = ReadVersion();
  bool found;
  LeafEntry entry;
  Status s = FindEntry(v, ikey, UINT64_MAX, &found, &entry);
  if (!s.ok()) return s;
  if (!found || entry.kind == ValueKind::kTombstone) return Status::NotFound();
  return ReadValue(ikey, entry, value);
}

// ---------------------------------------------------------------------------------------------
// Background work hooks

// Sleeps until woken, but no longer than the flush interval while appends wait for the flusher.
void EngineImpl::WaitForBackgroundWork(int timeout_ms) {
  if (HasUnflushedLog()) timeout_ms = std::min(timeout_ms, int(options_.flush_interval_ms));
  SharedLock lock(&shared_->bg_mu);
  if (shared_->bg_pending.load() == 0) shared_->bg_cv.WaitFor(&shared_->bg_mu, timeout_ms);
  shared_->bg_pending.store(0);
}

Stats EngineImpl::GetStats() {
  Stats st;
  EpochPin pin(shared_);
  Version v = ReadVersion();
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
    st.l0_entries += Memtable(m).entries();
    st.l0_bytes += Memtable(m).kv_bytes();
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
  st.last_lsn = shared_->last_lsn.load();
  st.durable_lsn = shared_->durable_lsn.load();
  SharedLock lock(&shared_->alloc_mu);
  for (uint64_t i = 1; i < shared_->device_segments; i++) {
    auto kind = SegmentKind(segments()[i].kind);
    if (kind == SegmentKind::kFree) continue;
    st.segments_in_use++;
    if (kind == SegmentKind::kMediumLog) st.medium_log_segments++;
    if (kind == SegmentKind::kLargeLog) st.large_log_segments++;
    if (kind == SegmentKind::kL0Log) st.l0_log_segments++;
  }
  return st;
}

}  // namespace slipstream::engine
