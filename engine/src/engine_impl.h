// EngineImpl: the engine behind the public Engine interface, one object per process (or per
// handle). It owns the parts, each of which owns its piece of the shared arena:
//
//   LogSet        logs, LSNs, appends, group-commit write-out, value reads   log_set.h
//   SegmentTable  device segments: allocation and accounting               segment_table.h
//   LevelSet      the installed version, compaction picking, the manifest   level_set.h
//   Compaction    builds one new level from two inputs                      compaction.h
//   MemtablePool  the memtable slots                                        memtable_pool.h
//   KeyspaceTable keyspaces                                                 keyspace_table.h
//   Reclaimer     epoch pins and deferred freeing                           reclaim.h
//
// and does what needs several of them: the write path (write_path.cc), point reads and stats
// (engine_impl.cc), scheduling and installing compactions and GC (background.cc, gc.cc),
// recovery (recovery.cc), iterators (iterator.cc) and verification (verify.cc).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "arena_layout.h"
#include "background_signal.h"
#include "btree.h"
#include "compaction.h"
#include "device.h"
#include "keyspace_table.h"
#include "level_set.h"
#include "log_set.h"
#include "memtable_pool.h"
#include "node_check_cache.h"
#include "reclaim.h"
#include "row_cache.h"
#include "segment_table.h"
#include "shared_state.h"
#include "slipstream/engine/engine.h"

namespace slipstream::engine {

// One write as the write path sees it (views into the caller's data).
struct WriteOp {
  // kPatch: a put whose value differs from the stored one in its first `prefix` bytes alone
  // (WriteBatch::PutChangedPrefix), written as a kLargePatch entry naming the stored record.
  enum Type : uint8_t { kPut, kDelete, kRelocate, kPatch };
  Type type;
  KeyspaceId keyspace;
  std::string_view key;
  std::string_view value;  // kRelocate: the encoded payload of the large-log record to copy
  ValuePtr relocate_from;  // kRelocate: only relocate if the key still points here; kPatch:
                           // the stored record, found under the write mutex
  std::string ikey;        // filled by the write path
  std::string encoded;     // large value record payload, filled by the write path
  uint32_t value_size = 0;
  uint32_t prefix = 0;          // kPatch
  bool relocate_patch = false;  // kRelocate: the key's entry is a patch, whose prefix stays
  std::string patch_prefix;     // ... this one
};

// What a PointReader remembers between reads: the version it read (valid while the level set's
// sequence number is unchanged) and, in it, the leaves where recent reads ended in each level.
// Two per level, because reads alternate between regions: an index scan fetches its rows in
// order, but a row's newer versions live elsewhere, and a join reads two tables in turn.
// (Memtables need none: their hash index answers a key in a probe or two.)
struct ReadFinger {
  static constexpr int kFingers = 2;
  uint64_t version_seq = 1;  // odd: nothing remembered
  uint64_t clock = 0;        // counts reads, for the fingers' last_used
  Version version{};
  LeafFinger levels[kMaxLevels + 1][kFingers];
};

class EngineImpl final : public Engine {
 public:
  EngineImpl(const Options& options, char* arena, size_t arena_size);
  ~EngineImpl() override;

  // Recovers a zeroed arena (the first opener) or attaches to a recovered one.
  Status OpenOrAttach();

  // --- Engine ---
  Status CreateKeyspace(uint64_t tag, KeyspaceId* id) override;
  Status LookupKeyspace(uint64_t tag, KeyspaceId* id) override;
  Status DropKeyspace(KeyspaceId id) override;
  Status ListKeyspaces(std::vector<std::pair<uint64_t, KeyspaceId>>* keyspaces) override;
  Status Put(KeyspaceId ks, std::string_view key, std::string_view value, Lsn* lsn) override;
  Status Delete(KeyspaceId ks, std::string_view key, Lsn* lsn) override;
  Status Write(const WriteBatch& batch, Lsn* lsn) override;
  Status Sync(Lsn lsn) override;
  Status Get(KeyspaceId ks, std::string_view key, std::string* value) override;
  std::unique_ptr<PointReader> NewPointReader() override;
  // Get, starting where the reads that filled `finger` ended (nullptr: from scratch).
  // With past_memtables, the memtables are not looked in (PointReader::GetPastMemtables).
  Status GetNear(ReadFinger* finger, KeyspaceId ks, std::string_view key, std::string* value,
                 bool past_memtables = false);
  // PointReader::FirstMemtableKey.
  bool FirstMemtableKey(KeyspaceId ks, std::string_view lo, std::string_view hi,
                        std::string* first);
  std::unique_ptr<Iterator> NewIterator(KeyspaceId ks) override;
  bool DoBackgroundWork() override;
  void WaitForBackgroundWork(int timeout_ms) override;
  Status ImportLogBytes(const LogWriteEvent& event) override;
  Status BeginImport(const CompactionBeginEvent& event) override;
  Status ImportSegment(const CompactionSegmentEvent& event) override;
  Status InstallImport(const CompactionInstalledEvent& event, uint64_t resume_at) override;
  uint64_t ImportResumePosition() override;
  void AbandonImport(uint64_t compaction) override;
  Status ShipLevels(EngineObserver* observer) override;
  Status ImportLevels(const std::vector<uint32_t>& level_trees) override;
  Status CompactAll() override;
  Status RunGC() override;
  Stats GetStats() override;
  Status ApproximateSize(KeyspaceId ks, uint64_t* bytes) override;
  Status Verify() override;
  const Options& options() const override { return options_; }

  // --- Tests only ---
  // Stops a write where WriteOps may be preempted: `value` is in the active memtable at the
  // next LSN, which is returned and not yet published (no log record is written).
  Lsn TEST_InsertUnpublished(KeyspaceId ks, std::string_view key, std::string_view value);
  // Ends that write: publishes `lsn`.
  void TEST_Publish(Lsn lsn);

 private:
  // How a B+-tree view checks node checksums (when options_.verify_checksums is on).
  enum class NodeChecks {
    kOncePerProcess,  // skip nodes this process already checked: reads
    kEveryRead,       // every node every time: Verify, and compactions (see background.cc)
  };
  // The B+-trees' view of the device.
  TreeContext Trees(NodeChecks checks) const;

  // --- opening (engine_impl.cc) ---
  void FormatArena();

  // --- recovery (recovery.cc) ---
  Status Recover();
  Status ReplayLogs(const std::string& manifest_image);

  // --- write path (write_path.cc) ---
  // may_stall false: return Busy instead of waiting for compaction (for background callers,
  // which would otherwise wait for themselves).
  Status WriteOps(std::vector<WriteOp>& ops, Lsn* lsn, bool may_stall = true);
  Status PrepareOp(WriteOp* op, size_t* l0_bytes, size_t* large_bytes, uint64_t* mem_bytes);
  Status EnsureMemtableRoom(uint64_t mem_bytes, std::unique_lock<SharedMutex>* lock,
                            bool may_stall);
  Status ApplyOp(WriteOp* op, Lsn lsn, bool* large_touched);
  Status AppendPatch(const WriteOp* op, Lsn lsn, const ValuePtr& ptr, bool owner,
                     std::string_view prefix, MemTable* active);
  bool ResolvePatches(const Version& v, std::vector<WriteOp>& ops, Status* status);
  Status WriteOpsOnce(std::vector<WriteOp>& ops, Lsn* lsn, bool may_stall, bool* again);
  Status MakeL0LogRoom(std::unique_lock<SharedMutex>* lock);
  void AppendKeyspaceRecord(LogRecordType type, KeyspaceId id, uint64_t tag, Lsn* lsn);
  bool SwitchMemtable(bool force);

  // --- reads (engine_impl.cc) ---
  // Newest entry for ikey across memtables and levels of `v`, newer than nothing above
  // `max_lsn` in memtables. Views point into shared memory or the device mapping. With a
  // finger (filled by earlier reads of the same version), a level whose remembered leaf spans
  // the key is searched in that leaf alone. past_memtables looks in the levels only.
  bool InMemtables(const Version& v, std::string_view ikey) const;
  Status FindEntry(const Version& v, std::string_view ikey, uint64_t max_lsn, bool* found,
                   LeafEntry* entry, ReadFinger* finger = nullptr, bool past_memtables = false);

  // --- compaction (background.cc). The caller holds compaction_mu. ---
  Status CompactL0Locked();
  Status CompactLevelLocked(uint32_t level);
  Status RewriteLevelLocked(uint32_t level);
  // Runs a compaction into `dest` and installs it; `input_segments` is what it reads. A null
  // `older` merges `newer` into dest's tree keeping the leaves it can (RunKeepingLeaves).
  Status RunCompactionLocked(const Version& v, MergeSource* newer, MergeSource* older,
                             Compaction* compaction, bool from_l0, uint32_t replaced_level,
                             uint64_t input_segments);
  Status InstallCompaction(const Version& before, bool from_l0, uint32_t replaced_level,
                           const Compaction& compaction);
  void AbandonCompaction(const Compaction& compaction);
  static CompactionInstalledEvent InstalledEvent(uint64_t compaction, uint32_t dest,
                                                 const LevelDesc& out, uint64_t manifest_number);
  void MarkTreesRetired(const Version& before, uint32_t replaced_level, uint32_t dest,
                        std::vector<uint32_t>* trees, std::vector<uint32_t>* segments);
  CompactionSpec SpecFor(const Version& v, uint32_t dest);
  bool MayKeepLeaves(const CompactionSpec& spec, const LevelDesc& dest) const;
  bool MayMoveLeaves(const CompactionSpec& spec) const;
  bool MemtableAppendsOnly(const Version& v, KeyspaceId ks);
  Status ReclaimDroppedLocked(bool* rewrote);
  void RecordBackgroundError(const Status& s);

  // --- index shipping on a replica (import.cc) ---
  // The compaction being imported: the primary's segment numbers of its index, bloom and
  // medium segments mapped to this node's (allocated Pending), and which of them arrived.
  struct Import {
    CompactionBeginEvent begin;
    std::unordered_map<uint32_t, uint32_t> index;   // index and bloom segments
    std::unordered_map<uint32_t, uint32_t> medium;  // medium segments it wrote
    std::unordered_set<uint32_t> arrived;           // primary numbers whose bytes arrived
    std::unordered_map<uint32_t, uint32_t> older;   // older log segments looked up so far
  };
  // This node's copy of a primary's log segment (0: none).
  uint32_t ImportedLogSegment(uint32_t primary_segment, SegmentKind kind);
  void FreeOrphanedImports();
  // Whether this node installed `compaction`, or a later one (ids grow on the primary).
  bool Covered(uint64_t compaction) { return compaction < levels_.next_tree_id(); }
  Status AllocatePending(SegmentKind kind, uint32_t owner, uint32_t* segment);

  // --- GC (gc.cc) ---
  uint32_t PickGarbageSegment();
  Status CollectGarbage(uint32_t segment);

  Options options_;
  char* arena_;
  size_t arena_size_;
  SharedState* shared_;
  EngineObserver* observer_;  // options_.observer, or nullptr
  Device device_;
  // The nodes this process verified (empty if verify_checksums is off). Mutable: the const
  // Trees() hands it to reads, which record in it what they checked.
  mutable NodeCheckCache node_checks_;
  BackgroundSignal background_;
  SegmentTable segments_;
  MemtablePool memtables_;
  KeyspaceTable keyspaces_;
  Reclaimer reclaimer_;
  LogSet logs_;
  LevelSet levels_;
  RowCache row_cache_;
  std::unique_ptr<Import> import_;  // the compaction being imported (process-local)
};

}  // namespace slipstream::engine
