// The write path: keyspace records, puts, deletes and batches into the logs and the active
// memtable, with back-pressure when L0 is full.
#include <lz4.h>

#include <cstring>
#include <mutex>

#include "clock.h"
#include "coding.h"
#include "engine_impl.h"
#include "value_compression.h"

namespace slipstream::engine {

// ---------------------------------------------------------------------------------------------
// Keyspaces

// Appends a keyspace record under the write mutex (the caller made room in the L0 log).
void EngineImpl::AppendKeyspaceRecord(LogRecordType type, KeyspaceId id, uint64_t tag, Lsn* lsn) {
  char payload[12];
  EncodeFixed32(payload, id);
  EncodeFixed64(payload + 4, tag);
  *lsn = logs_.last_lsn() + 1;
  logs_.set_last_lsn(*lsn);
  logs_.Append(LogKind::kL0, type, *lsn,
               {std::string_view(payload, type == LogRecordType::kKeyspaceDrop ? 4 : 12)});
  logs_.AppendChecksum(LogKind::kL0);
  logs_.Publish(LogKind::kL0);
  shared_->counters.unflushed_records++;
}

// Makes room for a small control record in the L0 log (rotating, or flushing to free a
// buffer first); the write mutex is held on entry and on return.
Status EngineImpl::MakeL0LogRoom(std::unique_lock<SharedMutex>* lock) {
  while (!logs_.HasRoom(LogKind::kL0, 64)) {
    if (logs_.FreeBuffersAhead(LogKind::kL0) > 0) return logs_.Rotate(LogKind::kL0);
    lock->unlock();
    Status s = logs_.WriteOut(false, 0);
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
    KeyspaceId existing;
    if (keyspaces_.Lookup(tag, &existing).ok()) {
      return Status::InvalidArgument("a live keyspace already has tag " + std::to_string(tag));
    }
    KeyspaceId new_id;
    KeyspaceSlot* slot = keyspaces_.Reserve(&new_id);
    if (slot == nullptr) return Status::Busy("keyspace table is full");
    AppendKeyspaceRecord(LogRecordType::kKeyspaceCreate, new_id, tag, &lsn);
    slot->tag = tag;
    slot->state.store(KeyspaceSlot::kLive, std::memory_order_release);
    *id = new_id;
  }
  return logs_.Sync(lsn);
}

Status EngineImpl::LookupKeyspace(uint64_t tag, KeyspaceId* id) {
  return keyspaces_.Lookup(tag, id);
}

Status EngineImpl::ListKeyspaces(std::vector<std::pair<uint64_t, KeyspaceId>>* keyspaces) {
  keyspaces_.List(keyspaces);
  return Status::OK();
}

// Marks the keyspace dropped (O(1)); compaction discards its entries and frees their space.
Status EngineImpl::DropKeyspace(KeyspaceId id) {
  Lsn lsn;
  {
    std::unique_lock<SharedMutex> lock(shared_->write_mu);
    KeyspaceSlot* slot = keyspaces_.Find(id);
    if (slot == nullptr || slot->state.load() != KeyspaceSlot::kLive) {
      return Status::InvalidArgument("keyspace " + std::to_string(id) + " is not live");
    }
    Status s = MakeL0LogRoom(&lock);
    if (!s.ok()) return s;
    slot = keyspaces_.Find(id);  // the lock may have been released meanwhile
    if (slot == nullptr || slot->state.load() != KeyspaceSlot::kLive) {
      return Status::InvalidArgument("keyspace " + std::to_string(id) + " is not live");
    }
    slot->state.store(KeyspaceSlot::kDropped);
    AppendKeyspaceRecord(LogRecordType::kKeyspaceDrop, id, 0, &lsn);
  }
  row_cache_.InvalidateAll();  // the keyspace's id may come back for another tag
  shared_->reclaim_pending.store(1);
  background_.Wake();
  return logs_.Sync(lsn);
}

// ---------------------------------------------------------------------------------------------
// Puts and deletes

// Operations whose array EngineImpl::Write keeps for the thread's next batch, and the bytes of
// an encoded large value an operation keeps.
constexpr size_t kKeptWriteOps = 4096;
constexpr size_t kKeptEncodedBytes = 4096;

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
  if (batch.Count() == 0) {
    if (lsn) *lsn = logs_.last_lsn();
    return Status::OK();
  }
  // The operations' array is kept per thread, as WriteBatch keeps its buffer: a bulk load
  // writes one batch after another, and freeing the array each time returned its memory to
  // the system, to be faulted in again by the next batch.
  // The operations stay in place between batches (their views dangle, unread, until the next
  // batch overwrites them), so only a batch larger than any before constructs new ones.
  thread_local std::vector<WriteOp> ops;
  ops.resize(batch.Count());
  for (size_t i = 0; i < ops.size(); i++) {
    WriteBatch::Op op = batch.op(i);
    WriteOp& w = ops[i];
    w.type = op.is_delete            ? WriteOp::kDelete
             : op.changed_prefix > 0 ? WriteOp::kPatch
                                     : WriteOp::kPut;
    w.prefix = op.changed_prefix;
    w.relocate_patch = false;
    w.keyspace = op.keyspace;
    w.key = op.key;
    w.value = op.value;
    w.relocate_from = ValuePtr{};
    w.ikey.clear();
    w.encoded.clear();
    w.value_size = 0;
  }
  Status s = WriteOps(ops, lsn);
  if (ops.capacity() > kKeptWriteOps) {
    std::vector<WriteOp>().swap(ops);  // a huge batch's memory goes
  } else {
    for (WriteOp& w : ops) {
      if (w.encoded.capacity() > kKeptEncodedBytes) std::string().swap(w.encoded);  // large values'
    }
  }
  return s;
}

// Validates one operation and encodes what can be encoded outside the write mutex (internal
// key, LZ4 compression of large values); adds up the space it needs.
Status EngineImpl::PrepareOp(WriteOp* op, size_t* l0_bytes, size_t* large_bytes,
                             uint64_t* mem_bytes) {
  if (!keyspaces_.IsLive(op->keyspace)) {
    return Status::InvalidArgument("keyspace " + std::to_string(op->keyspace) + " is not live");
  }
  if (op->key.size() > options_.max_key_size) {
    return Status::InvalidArgument("key of " + std::to_string(op->key.size()) +
                                   " bytes exceeds max_key_size");
  }
  if ((op->type == WriteOp::kPut || op->type == WriteOp::kPatch) &&
      op->value.size() > options_.max_value_size) {
    return Status::InvalidArgument("value of " + std::to_string(op->value.size()) +
                                   " bytes exceeds max_value_size");
  }
  if (op->type == WriteOp::kPatch) {
    if (op->prefix > LargePatch::kMaxPrefix || op->prefix > op->value.size()) {
      return Status::InvalidArgument("a changed prefix of " + std::to_string(op->prefix) +
                                     " bytes: at most " + std::to_string(LargePatch::kMaxPrefix) +
                                     " and the value's size");
    }
    // Only a large value is stored apart from its entry; anything smaller is written whole.
    if (op->key.size() + op->value.size() < options_.large_threshold) op->type = WriteOp::kPut;
  }
  op->ikey = MakeInternalKey(op->keyspace, op->key);
  size_t key_part = VarintLength(uint32_t(op->ikey.size())) + op->ikey.size();
  size_t mem_value = 0;
  bool large =
      op->type == WriteOp::kRelocate ||
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
      n = CompressValue(op->value.data(), op->value.size(), p,
                        op->encoded.size() - size_t(p - op->encoded.data()), 4);
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
  if (op->type == WriteOp::kPatch) {  // (the prefix may grow to an older patch's: the most)
    *l0_bytes += RecordSpace(key_part + 1 + LargePatch::kFixedSize + LargePatch::kMaxPrefix);
    mem_value = LargePatch::kFixedSize + LargePatch::kMaxPrefix;
  } else if (large) {
    // A relocation writes a patch if the key's entry is one when it applies (GC relocates
    // patched rows' records): room for that.
    size_t entry = op->type == WriteOp::kRelocate ? LargePatch::kFixedSize + LargePatch::kMaxPrefix
                                                  : ValuePtr::kEncodedSize;
    *large_bytes += RecordSpace(op->encoded.size()) + kChecksumEntrySize;
    *l0_bytes += RecordSpace(key_part + 1 + entry);
    mem_value = entry;
  } else if (op->type == WriteOp::kPut) {
    *l0_bytes += RecordSpace(key_part + 1 + op->value.size());
    mem_value = op->value.size();
  } else {
    *l0_bytes += RecordSpace(key_part);
  }
  *mem_bytes += MemTable::EntrySpace(op->ikey.size(), mem_value);
  return Status::OK();
}

// Switches the full active memtable to immutable if another slot is free; false otherwise.
// The caller holds the write mutex.
bool EngineImpl::SwitchMemtable(bool force) {
  const Version& v = levels_.Latest();
  if (v.immutable_memtable != -1) return false;
  int other = memtables_.FindFree(v.active_memtable);
  if (other < 0) return false;  // every other slot is still pinned by readers
  if (!force && memtables_.Get(v.active_memtable).entries() == 0) return false;
  memtables_.Claim(other);
  uint64_t l0_sequence = logs_.active_sequence(LogKind::kL0);
  uint64_t large_sequence = logs_.active_sequence(LogKind::kLarge);
  levels_.Apply([&](Version& next) {
    next.immutable_memtable = next.active_memtable;
    next.active_memtable = other;
    next.active_first_log_sequence = l0_sequence;
    next.immutable_first_large_sequence = next.active_first_large_sequence;
    next.active_first_large_sequence = large_sequence;
  });
  background_.Wake();
  return true;
}

// Back-pressure: when the active memtable is full and the immutable one is still being
// compacted, the writer waits (and the wait is counted as a stall).
Status EngineImpl::EnsureMemtableRoom(uint64_t mem_bytes, std::unique_lock<SharedMutex>* lock,
                                      bool may_stall) {
  uint64_t pinned_since = 0;  // when this writer first found every free slot pinned
  while (true) {
    MemTable active = memtables_.Get(levels_.Latest().active_memtable);
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
    if (levels_.Latest().immutable_memtable >= 0) {
      pinned_since = 0;  // compaction will make room
    } else if (pinned_since == 0) {
      pinned_since = start;
    } else if (options_.pinned_wait_ms != 0 &&
               start - pinned_since >= uint64_t(options_.pinned_wait_ms) * 1000) {
      return Status::Busy(
          "every memtable is pinned by long-running readers (scans or cursors open for " +
          std::to_string(options_.pinned_wait_ms) + " ms or more); writes resume when they finish");
    }
    shared_->counters.stall_count++;
    lock->unlock();
    bool compacted = false;
    if (shared_->compaction_mu.TryLock()) {
      // Nobody is compacting: this writer does the L0 compaction it is waiting for.
      Status s;
      if (levels_.Current().immutable_memtable >= 0) {
        s = CompactL0Locked();
        compacted = true;
      }
      reclaimer_.Reclaim();
      shared_->compaction_mu.Unlock();
      if (!s.ok()) {
        RecordBackgroundError(s);
        return s;
      }
    }
    if (!compacted) {  // waiting for another compactor, or for readers to release a memtable
      background_.WakeAndWait(2);
    }
    lock->lock();
    shared_->counters.stall_micros += NowMicros() - start;
  }
}

// Appends one operation's records (large value first, then its L0 record) and inserts it
// into the active memtable.
Status EngineImpl::ApplyOp(WriteOp* op, Lsn lsn, bool* large_touched) {
  char kind_byte;
  char ptr_buf[ValuePtr::kEncodedSize];
  char varint[5];
  std::string_view key_len(varint,
                           size_t(EncodeVarint32(varint, uint32_t(op->ikey.size())) - varint));
  MemTable active = memtables_.Get(levels_.Latest().active_memtable);
  if (!op->encoded.empty()) {
    if (!logs_.HasRoom(LogKind::kLarge, RecordSpace(op->encoded.size()) + kChecksumEntrySize)) {
      Status s = logs_.Rotate(LogKind::kLarge);
      if (!s.ok()) return s;
    }
    LogSet::Appended at = logs_.Append(LogKind::kLarge, LogRecordType::kValue, lsn, {op->encoded});
    logs_.AppendChecksum(LogKind::kLarge);
    ValuePtr ptr{{at.segment, at.offset}, RecordSpace(op->encoded.size()), op->value_size};
    if (op->type == WriteOp::kRelocate) ptr.value_size = op->relocate_from.value_size;
    segments_.info(at.segment).bytes_written += ptr.record_bytes;
    active.AddLargeBytes(ptr.record_bytes);
    *large_touched = true;
    if (op->relocate_patch) {  // a relocated patch keeps its prefix and owns the new record
      return AppendPatch(op, lsn, ptr, /*owner=*/true, op->patch_prefix, &active);
    }
    ptr.EncodeTo(ptr_buf);
    kind_byte = char(ValueKind::kLargePtr);
    std::string_view ptr_view(ptr_buf, ValuePtr::kEncodedSize);
    logs_.Append(LogKind::kL0, LogRecordType::kPut, lsn,
                 {key_len, op->ikey, std::string_view(&kind_byte, 1), ptr_view});
    active.Insert(op->ikey, lsn, ValueKind::kLargePtr, ptr_view);
    return Status::OK();
  }
  if (op->type == WriteOp::kPatch) {
    shared_->counters.large_patches++;
    return AppendPatch(op, lsn, op->relocate_from, /*owner=*/false, op->value.substr(0, op->prefix),
                       &active);
  }
  if (op->type == WriteOp::kPut) {
    kind_byte = char(ValueKind::kInline);
    logs_.Append(LogKind::kL0, LogRecordType::kPut, lsn,
                 {key_len, op->ikey, std::string_view(&kind_byte, 1), op->value});
    active.Insert(op->ikey, lsn, ValueKind::kInline, op->value);
  } else {
    logs_.Append(LogKind::kL0, LogRecordType::kDelete, lsn, {key_len, op->ikey});
    active.Insert(op->ikey, lsn, ValueKind::kTombstone, {});
  }
  return Status::OK();
}

// Logs and inserts a kLargePatch entry naming `ptr`'s record with `prefix` (format.h).
Status EngineImpl::AppendPatch(const WriteOp* op, Lsn lsn, const ValuePtr& ptr, bool owner,
                               std::string_view prefix, MemTable* active) {
  char bytes[LargePatch::kFixedSize + LargePatch::kMaxPrefix];
  char varint[5];
  std::string_view key_len(varint,
                           size_t(EncodeVarint32(varint, uint32_t(op->ikey.size())) - varint));
  if (prefix.size() > LargePatch::kMaxPrefix) return Status::Corruption("patch prefix too long");
  ptr.EncodeTo(bytes);
  bytes[ValuePtr::kEncodedSize] = owner ? 1 : 0;
  std::memcpy(bytes + LargePatch::kFixedSize, prefix.data(), prefix.size());
  std::string_view value(bytes, LargePatch::kFixedSize + prefix.size());
  char kind_byte = char(ValueKind::kLargePatch);
  logs_.Append(LogKind::kL0, LogRecordType::kPut, lsn,
               {key_len, op->ikey, std::string_view(&kind_byte, 1), value});
  active->Insert(op->ikey, lsn, ValueKind::kLargePatch, value);
  return Status::OK();
}

// Finds, for each kPatch operation, the large-log record its key's entry names. An operation
// whose key names none (a value stored small, or a key deleted) becomes a plain put; false if
// any did, so that the batch is prepared again. The caller holds the write mutex.
bool EngineImpl::ResolvePatches(const Version& v, std::vector<WriteOp>& ops, Status* status) {
  bool all = true;
  for (size_t i = 0; i < ops.size(); i++) {
    WriteOp& op = ops[i];
    if (op.type != WriteOp::kPatch) continue;
    // A key the batch writes before its patch: the patch would name the record before the
    // batch (or revive a deleted key). Written whole instead.
    bool written_before = false;
    for (size_t j = 0; j < i && !written_before; j++) written_before = ops[j].ikey == op.ikey;
    if (written_before) {
      op.type = WriteOp::kPut;
      all = false;
      continue;
    }
    bool found = false;
    LeafEntry e;
    *status = FindEntry(v, op.ikey, UINT64_MAX, &found, &e);
    if (!status->ok()) return false;
    if (found && RefersToLargeLog(e.kind) && e.ptr.value_size == op.value.size()) {
      op.relocate_from = e.ptr;
      // A read applies the newest patch alone, so it carries what an older one changed too.
      if (e.kind == ValueKind::kLargePatch && e.inline_value.size() > op.prefix)
        op.prefix = uint32_t(e.inline_value.size());
    } else {
      op.type = WriteOp::kPut;
      all = false;
    }
  }
  return all;
}

// The write path: one critical section per batch; the batch lands in one L0 log segment and
// is followed by one checksum, so it is atomic across crashes.
Status EngineImpl::WriteOps(std::vector<WriteOp>& ops, Lsn* lsn, bool may_stall) {
  while (true) {
    bool again = false;
    Status s = WriteOpsOnce(ops, lsn, may_stall, &again);
    if (again) continue;  // (a batch goes again at most once: its patches became puts)
    // Whatever of the batch was applied is published by now, a failed batch's part too: a
    // lookup that began before may hold an older value, and the invalidation keeps it from
    // installing it (row_cache.h).
    for (const WriteOp& op : ops) {
      if (op.type != WriteOp::kRelocate) row_cache_.Invalidate(op.ikey);
    }
    return s;
  }
}

// One attempt of WriteOps; sets *again, having written nothing, if a patch became a put.
Status EngineImpl::WriteOpsOnce(std::vector<WriteOp>& ops, Lsn* lsn, bool may_stall, bool* again) {
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
    int l0_rotations = logs_.HasRoom(LogKind::kL0, l0_bytes) ? 0 : 1;
    int large_rotations = 0;
    uint32_t pos = logs_.position(LogKind::kLarge);
    for (const WriteOp& op : ops) {
      if (op.encoded.empty()) continue;
      uint32_t need = RecordSpace(op.encoded.size()) + kChecksumEntrySize;
      if (pos + need + LogSet::kReserve > options_.segment_size) {
        large_rotations++;
        pos = kLogHeaderSize;
      }
      pos += need;
    }
    if (logs_.FreeBuffersAhead(LogKind::kL0) >= l0_rotations &&
        logs_.FreeBuffersAhead(LogKind::kLarge) >= large_rotations) {
      break;
    }
    lock.unlock();
    s = logs_.WriteOut(false, 0);
    if (!s.ok()) return s;
    lock.lock();
  }
  if (!logs_.HasRoom(LogKind::kL0, l0_bytes)) {
    Status s = logs_.Rotate(LogKind::kL0);
    if (!s.ok()) return s;
  }
  Version v = levels_.Latest();
  Status resolved;
  if (!ResolvePatches(v, ops, &resolved)) {
    if (!resolved.ok()) return resolved;
    *again = true;
    return Status::OK();
  }
  bool large_touched = false;
  Lsn last = logs_.last_lsn();
  uint64_t user_bytes = 0, applied = 0;
  const uint32_t l0_start = logs_.position(LogKind::kL0);
  for (WriteOp& op : ops) {
    if (op.type == WriteOp::kRelocate) {
      bool found = false;
      LeafEntry e;
      Status s = FindEntry(v, op.ikey, UINT64_MAX, &found, &e);
      if (!s.ok()) return s;
      if (!found || !RefersToLargeLog(e.kind) || !(e.ptr.where == op.relocate_from.where)) {
        continue;  // overwritten or deleted since GC looked: nothing to relocate
      }
      op.relocate_patch = e.kind == ValueKind::kLargePatch;
      if (op.relocate_patch) op.patch_prefix.assign(e.inline_value);
    } else {
      user_bytes += op.key.size() + op.value.size();
    }
    Lsn op_lsn = last + 1;
    Status s = ApplyOp(&op, op_lsn, &large_touched);
    if (!s.ok()) return s;
    last = op_lsn;
    logs_.set_last_lsn(last);
    applied++;
  }
  if (applied > 0) {
    logs_.AppendChecksum(LogKind::kL0);
    // The room checked above must have held the batch (a segment's tail past the reservation
    // belongs to nothing): an estimate in PrepareOp that falls short is a bug, reported here
    // wherever in the segment the batch landed, not only where it would overrun.
    if (logs_.position(LogKind::kL0) - l0_start > l0_bytes) {
      return Status::Corruption("a write batch outgrew its L0 log reservation (" +
                                std::to_string(logs_.position(LogKind::kL0) - l0_start) +
                                " bytes against " + std::to_string(l0_bytes) + ")");
    }
    logs_.Publish(LogKind::kL0);
    if (large_touched) logs_.Publish(LogKind::kLarge);
  }
  shared_->counters.user_bytes_written += user_bytes;
  shared_->counters.unflushed_records += applied;
  lock.unlock();
  if (lsn) *lsn = last;
  return Status::OK();
}

// The first half of a write: inserted, not published (engine_impl.h).
Lsn EngineImpl::TEST_InsertUnpublished(KeyspaceId ks, std::string_view key,
                                       std::string_view value) {
  std::lock_guard<SharedMutex> lock(shared_->write_mu);
  Lsn lsn = logs_.last_lsn() + 1;
  memtables_.Get(levels_.Latest().active_memtable)
      .Insert(MakeInternalKey(ks, key), lsn, ValueKind::kInline, value);
  return lsn;
}

// The second half: what WriteOps does after each insert.
void EngineImpl::TEST_Publish(Lsn lsn) {
  {
    std::lock_guard<SharedMutex> lock(shared_->write_mu);
    logs_.set_last_lsn(lsn);
  }
  row_cache_.InvalidateAll();  // the key is not known here
}

}  // namespace slipstream::engine
