// Engine: an LSM key-value store with hybrid key-value placement, shared by many processes.
//
// The host provides a shared-memory arena (PostgreSQL shared memory, or an mmap(MAP_SHARED)
// region in tests). The first Engine::Open on a zeroed arena recovers the engine from its
// directory into the arena; later opens from any process attach to it. Every process that uses
// the engine holds its own Engine handle (its own file descriptor and mapping).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "slipstream/engine/observer.h"
#include "slipstream/engine/options.h"
#include "slipstream/engine/stats.h"
#include "slipstream/engine/status.h"
#include "slipstream/engine/write_batch.h"

namespace slipstream::engine {

// Iterator over one keyspace in key order. It sees the state of the engine at creation time,
// whatever compaction and GC do meanwhile; segments it can reach are not reused until it is
// destroyed.
class Iterator {
 public:
  virtual ~Iterator() = default;
  virtual bool Valid() const = 0;
  virtual void SeekToFirst() = 0;
  virtual void Seek(std::string_view key) = 0;  // first key >= key
  virtual void Next() = 0;
  // Keys >= `bound` lie past the end, for every move after the call (an empty bound removes
  // the limit). A bounded seek stops at the bound instead of walking the deleted keys beyond
  // it to the next live one, so that reading many short ranges stays linear.
  virtual void SetUpperBound(std::string_view bound) = 0;
  virtual std::string_view key() const = 0;
  virtual std::string_view value() const = 0;  // valid until the next move
  virtual Status status() const = 0;           // Corruption or IOError stops the iteration
  // Moves on to the first key >= `key` (never backwards) and returns how many entries it
  // passed. The passed entries' values are not read (a value in a log costs a copy and a
  // checksum), so counting keys costs only the merge of the sources.
  uint64_t SkipTo(std::string_view key) { return SkipTo(key, SkipMark(), nullptr); }

  // Entries SkipTo counts apart: a value of exactly `size` bytes, at most kMaxMarkSize, whose
  // byte at `offset` has a bit of `mask` set. A value that short is always stored in place, so
  // looking at it reads no log. A caller that stores markers beside its rows (the table AM's
  // chain redirects) counts its rows this way.
  struct SkipMark {
    size_t size = 0;  // 0: count nothing apart
    size_t offset = 0;
    uint8_t mask = 0;
  };
  static constexpr size_t kMaxMarkSize = 64;

  // SkipTo that also adds the passed entries `mark` matches to *marked (if not null).
  virtual uint64_t SkipTo(std::string_view key, const SkipMark& mark, uint64_t* marked) {
    uint64_t passed = 0;
    for (; Valid() && this->key() < key; Next()) {
      passed++;
      if (marked != nullptr && Marked(mark, value())) ++*marked;
    }
    return passed;
  }

  // Whether a value of `value`'s bytes is one `mark` counts.
  static bool Marked(const SkipMark& mark, std::string_view value) {
    return mark.size != 0 && mark.size <= kMaxMarkSize && value.size() == mark.size &&
           mark.offset < value.size() &&
           (static_cast<uint8_t>(value[mark.offset]) & mark.mask) != 0;
  }
};

// Point reads that remember where the last one ended in each memtable and level: a key near
// the previous one (the next row of an index range scan) is found in a few steps instead of a
// descent of each. Its answers are Engine::Get's. Not thread-safe (one per thread); it must
// not outlive its engine.
class PointReader {
 public:
  virtual ~PointReader() = default;
  virtual Status Get(KeyspaceId ks, std::string_view key, std::string* value) = 0;
  // The smallest key in [lo, hi) of keyspace `ks` that a memtable holds now, in *first (false
  // if they hold none): the keys below it can be read with GetPastMemtables.
  virtual bool FirstMemtableKey(KeyspaceId ks, std::string_view lo, std::string_view hi,
                                std::string* first) = 0;
  // Get, without looking in the memtables: Get's answer as of the FirstMemtableKey call that
  // found none of `key`'s range there, for a caller to whom writes since then do not matter.
  virtual Status GetPastMemtables(KeyspaceId ks, std::string_view key, std::string* value) = 0;
};

class Engine {
 public:
  // Bytes of shared memory the arena must have for these options; 0 if Open would refuse the
  // options (a setting outside its range in settings.def, or fields that contradict each other).
  static size_t ArenaSize(const Options& options);

  // Opens (recovering into a zeroed arena) or attaches (to an arena already recovered).
  static Status Open(const Options& options, void* arena, size_t arena_size,
                     std::unique_ptr<Engine>* engine);

  virtual ~Engine() = default;

  // Keyspaces: independent tables in one engine. `tag` is the host's name for it (unique
  // among live keyspaces); ids are never reused, so a dropped keyspace's data can never
  // reappear. Dropping is O(1); compaction reclaims the space.
  virtual Status CreateKeyspace(uint64_t tag, KeyspaceId* id) = 0;
  virtual Status LookupKeyspace(uint64_t tag, KeyspaceId* id) = 0;
  virtual Status DropKeyspace(KeyspaceId id) = 0;
  // Every live keyspace as (tag, id).
  virtual Status ListKeyspaces(std::vector<std::pair<uint64_t, KeyspaceId>>* keyspaces) = 0;

  // Writes. Each returns the LSN of its last record; it is durable after Sync(lsn).
  virtual Status Put(KeyspaceId ks, std::string_view key, std::string_view value,
                     Lsn* lsn = nullptr) = 0;
  virtual Status Delete(KeyspaceId ks, std::string_view key, Lsn* lsn = nullptr) = 0;
  virtual Status Write(const WriteBatch& batch, Lsn* lsn = nullptr) = 0;

  // Makes every record up to `lsn` durable. Concurrent callers share one flush.
  virtual Status Sync(Lsn lsn) = 0;

  // Reads see every write that has returned, and never a version newer than an iterator
  // created after them would show (a write still inside the engine is seen by neither).
  virtual Status Get(KeyspaceId ks, std::string_view key, std::string* value) = 0;
  virtual std::unique_ptr<PointReader> NewPointReader() = 0;
  virtual std::unique_ptr<Iterator> NewIterator(KeyspaceId ks) = 0;

  // Background work: flushes the log, compacts a full L0 and oversized levels, runs GC.
  // Returns true if it did something. Hosts call it in a loop from a worker.
  virtual bool DoBackgroundWork() = 0;
  // Waits (up to `timeout_ms`) until background work may be pending.
  virtual void WaitForBackgroundWork(int timeout_ms) = 0;
  // Compacts L0 and then every level down to the last (synchronously).
  virtual Status CompactAll() = 0;
  // Garbage-collects every large-log segment past the threshold (synchronously).
  virtual Status RunGC() = 0;

  // --- Index shipping (Send-Index), on a replica. The primary's EngineObserver events, fed
  // in the order the primary raised them, build the same levels here without compacting:
  // segments are stored under this node's numbers with every pointer rewritten, and a level is
  // installed (durably, atomically) when its compaction's end arrives. Only one process of a
  // replica imports. Large-log bytes must arrive before a level that points at them; a
  // compaction that is abandoned, or replaced by the next one's begin, leaves nothing behind.

  // Writes bytes of one of the primary's large-log segments into this node's copy of it.
  virtual Status ImportLogBytes(const LogWriteEvent& event) = 0;
  // Starts importing a compaction (InvalidArgument if the shapes differ from this node's).
  virtual Status BeginImport(const CompactionBeginEvent& event) = 0;
  // Stores one segment of the compaction being imported (Corruption if it is damaged or names
  // a segment this node lacks).
  virtual Status ImportSegment(const CompactionSegmentEvent& event) = 0;
  // Installs the imported level and retires what the primary retired. `resume_at` is the
  // host's position in its stream of events after this one: it is made durable with the level
  // (ImportResumePosition), because what was imported after an install (large-log bytes, a
  // compaction in flight) is not durable and must be fed again after a restart.
  virtual Status InstallImport(const CompactionInstalledEvent& event, uint64_t resume_at = 0) = 0;
  // The resume_at of the last install (0: none).
  virtual uint64_t ImportResumePosition() = 0;
  // Frees what the import of `compaction` wrote.
  virtual void AbandonImport(uint64_t compaction) = 0;
  // The end of a seed: empties every level of this node whose tree is not the one the
  // primary has there (`level_trees[L]`, 0: empty). A replica that missed the compaction that
  // emptied a level on the primary would otherwise keep its stale tree, whose versions shadow
  // the newer ones below. Corruption if a level the primary has is not the one installed here.
  virtual Status ImportLevels(const std::vector<uint32_t>& level_trees) = 0;
  // On a primary: reports this node's levels as they stand to `observer`, as the events a new
  // replica imports to start from: OnSeedBegin, the large log's bytes written out so far, then
  // one compaction per level in the order of their tree ids (the medium-log segments with the
  // first). It holds the compaction and log write-out locks, so no other event interleaves: a
  // host passes the observer that feeds its live stream, and a new replica applies that
  // stream from the OnSeedBegin on.
  virtual Status ShipLevels(EngineObserver* observer) = 0;

  virtual Stats GetStats() = 0;

  // An estimate of the bytes keyspace `ks` holds: keys (with their 4-byte keyspace prefix) and
  // values (medium and large values counted at their size, wherever they are stored) of every
  // version in the memtables and levels, tombstones by their keys. Memtables are walked over the
  // keyspace's range and counted exactly. Each level costs a few descents of its tree, O(height)
  // node reads each: those to the two ends of the keyspace's range give how many leaves it
  // spans, and its entries in up to 18 of those leaves (both ends and 16 spread between) give
  // how many bytes such a leaf holds; a keyspace of few leaves is counted exactly.
  // InvalidArgument if `ks` is not live; Corruption if a tree is damaged.
  virtual Status ApproximateSize(KeyspaceId ks, uint64_t* bytes) = 0;

  // Checks ordering in every B+-tree, segment accounting and that every pointer lands in an
  // allocated segment of the right kind. Returns Corruption with a description otherwise.
  virtual Status Verify() = 0;

  virtual const Options& options() const = 0;
};

}  // namespace slipstream::engine
