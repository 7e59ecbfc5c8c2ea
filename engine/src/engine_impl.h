// EngineImpl: the engine behind the public Engine interface. One object per process (or per
// handle); all shared state lives in the arena (shared_state.h).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "btree.h"
#include "device.h"
#include "memtable.h"
#include "shared_state.h"
#include "slipstream/engine/engine.h"

namespace slipstream::engine {

// One write as the write path sees it (views into the caller's data).
struct WriteOp {
  enum Type : uint8_t { kPut, kDelete, kRelocate };
  Type type;
  KeyspaceId keyspace;
  std::string_view key;
  std::string_view value;  // kRelocate: the encoded payload of the large-log record to copy
  ValuePtr relocate_from;  // kRelocate: only relocate if the key still points here
  std::string ikey;        // filled by the write path
  std::string encoded;     // large value record payload, filled by the write path
  uint32_t value_size = 0;
};

class MergeSource;  // compaction.cc

// Pins the reclamation epoch for as long as it lives: nothing reachable from a state read
// after the pin is reused meanwhile.
class EpochPin {
 public:
  explicit EpochPin(SharedState* s);
  ~EpochPin();
  // Declares that this reader only reads these memtable slots (a bit per slot).
  void NarrowMemtables(uint32_t mask) { slot_->memtables.store(mask); }
  EpochPin(const EpochPin&) = delete;
  EpochPin& operator=(const EpochPin&) = delete;

 private:
  ReaderSlot* slot_ = nullptr;
};

// Per-segment changes a compaction or GC makes, applied when it publishes.
struct SegmentDeltas {
  std::unordered_map<uint32_t, uint64_t> written;
  std::unordered_map<uint32_t, uint64_t> invalid;
};

class EngineImpl final : public Engine {
 public:
  EngineImpl(const Options& options, char* arena, size_t arena_size);
  ~EngineImpl() override;

  Status OpenOrAttach();

  Status CreateKeyspace(uint64_t tag, KeyspaceId* id) override;
  Status LookupKeyspace(uint64_t tag, KeyspaceId* id) override;
  Status DropKeyspace(KeyspaceId id) override;
  Status ListKeyspaces(std::vector<std::pair<uint64_t, KeyspaceId>>* keyspaces) override;
  Status Put(KeyspaceId ks, std::string_view key, std::string_view value, Lsn* lsn) override;
  Status Delete(KeyspaceId ks, std::string_view key, Lsn* lsn) override;
  Status Write(const WriteBatch& batch, Lsn* lsn) override;
  Status Sync(Lsn lsn) override;
  Status Get(KeyspaceId ks, std::string_view key, std::string* value) override;
  std::unique_ptr<Iterator> NewIterator(KeyspaceId ks) override;
  bool DoBackgroundWork() override;
  void WaitForBackgroundWork(int timeout_ms) override;
  Status CompactAll() override;
  Status RunGC() override;
  Stats GetStats() override;
  Status Verify() override;
  const Options& options() const override { return options_; }

  // --- used by the iterator, compaction, recovery and verification units ---
  SharedState* shared() const { return shared_; }
  SegmentInfo* segments() const {
    return reinterpret_cast<SegmentInfo*>(arena_ + shared_->segment_table_offset);
  }
  KeyspaceSlot* keyspace_slots() const {
    return reinterpret_cast<KeyspaceSlot*>(arena_ + shared_->keyspace_table_offset);
  }
  MemTable Memtable(int index) const;
  MemtableHeader* MemHeader(int index) const {
    return reinterpret_cast<MemtableHeader*>(arena_ + shared_->memtable_offset[index]);
  }
  char* LogBuffer(const SharedLogBuffer& b) const { return arena_ + b.data_offset; }
  TreeContext Trees() const;
  Version ReadVersion() const;
  bool KeyspaceLive(KeyspaceId id) const;

  // Newest entry for ikey across memtables and levels of `v`, newer than nothing above
  // `max_lsn` in memtables. Views point into shared memory or the device mapping.
  Status FindEntry(const Version& v, std::string_view ikey, uint64_t max_lsn, bool* found,
                   LeafEntry* entry);
  // Materialises an entry's value (inline copy, or a validated read from a log).
  Status ReadValue(std::string_view ikey, const LeafEntry& entry, std::string* value);

  // Offsets of the arena's parts for these options.
  static void Layout(const Options& options, size_t* total, size_t* segment_table,
                     size_t* keyspace_table, size_t* memtables, size_t* l0_buffers,
                     size_t* large_buffers);
  void FormatArena();
  Status Recover();
  Status ReplayLogs(const std::string& manifest_image);
  Status ResumeLog(SharedLog* log, LogKind kind, uint32_t segment, uint64_t sequence,
                   uint32_t valid_end, uint32_t chain);

  // Write path.
  // may_stall false: return Busy instead of waiting for compaction (for background callers,
  // which would otherwise wait for themselves).
  Status WriteOps(std::vector<WriteOp>& ops, Lsn* lsn, bool may_stall = true);
  Status PrepareOp(WriteOp* op, size_t* l0_bytes, size_t* large_bytes, uint64_t* mem_bytes);
  Status EnsureMemtableRoom(uint64_t mem_bytes, std::unique_lock<SharedMutex>* lock, bool may_stall);
  bool LogHasRoom(const SharedLog& log, size_t bytes) const;
  int FreeBuffersAhead(const SharedLog& log) const;
  Status RotateLog(SharedLog* log);
  Status MakeL0LogRoom(std::unique_lock<SharedMutex>* lock);
  void AppendKeyspaceRecord(LogRecordType type, KeyspaceId id, uint64_t tag, Lsn* lsn);
  Status ApplyOp(WriteOp* op, Lsn lsn, bool* large_touched);
  void PublishAppends(SharedLog* log);
  Status FlushLogs(bool sync, Lsn wait_for);
  bool HasUnflushedLog() const;
  bool HasSealedLogBuffer() const;
  void WakeBackground();

  // Compaction and GC (compaction.cc). The caller holds compaction_mu.
  Status CompactL0Locked();
  Status CompactLevelLocked(uint32_t level);
  Status RewriteLevelLocked(uint32_t level);
  Status MergeLocked(const Version& v, MergeSource* newer, MergeSource* older,
                     SegmentDeltas* deltas, bool from_l0, uint32_t replaced_level, uint32_t dest,
                     uint64_t input_segments);
  Status ReclaimDroppedLocked(bool* rewrote);
  Status PublishCompaction(const Version& before, bool from_l0, uint32_t replaced_level,
                           uint32_t dest, const LevelDesc& out, SegmentDeltas& deltas,
                           const std::vector<uint32_t>& new_medium);
  int NextCompaction(const Version& v) const;  // 0: L0, i: level i, -1: nothing
  uint32_t DeepestLevel(const Version& v) const;
  Status CollectGarbage(uint32_t segment);
  uint32_t PickGarbageSegment();
  void RecordBackgroundError(const Status& s);

  // Segments and reclamation.
  Status AllocateSegment(SegmentKind kind, uint32_t owner, uint32_t* segment);
  void Retire(RetiredItem::Kind kind, uint32_t id);
  void Reclaim();
  bool SwitchMemtable(bool force);

  // Keyspaces.
  KeyspaceSlot* FindKeyspaceSlot(KeyspaceId id) const;
  KeyspaceSlot* InsertKeyspaceSlot(KeyspaceId id);

  // Manifest.
  std::string ManifestPath() const { return options_.directory + "/MANIFEST"; }
  std::string SerializeManifest(Lsn snapshot_lsn) const;
  Status WriteManifest(const std::string& image);

  Options options_;
  char* arena_;
  size_t arena_size_;
  SharedState* shared_;
  std::unique_ptr<Device> device_;
};

}  // namespace slipstream::engine
