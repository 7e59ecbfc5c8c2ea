// LevelSet: what is installed. The current version (memtable roles and every level's tree),
// read lock-free by a seqlock and changed only under the write mutex; the choice of the next
// compaction; and the manifest, the durable record of the levels, the segment accounting and
// the keyspaces that recovery starts from (manifest.cc).
#pragma once

#include <cstdint>
#include <string>

#include "shared_state.h"
#include "slipstream/engine/options.h"
#include "slipstream/engine/status.h"

namespace slipstream::engine {

class SegmentTable;
class KeyspaceTable;
class LogSet;

// What the manifest holds besides the level set's own state, for recovery to go on from.
struct ManifestTail {
  Lsn snapshot_lsn = 0;               // every LSN up to it was assigned before the manifest
  uint64_t first_large_sequence = 0;  // oldest large-log segment uncompacted values may use
};

class LevelSet {
 public:
  LevelSet(const Options& options, SharedLevels* shared, SharedCounters* counters)
      : options_(options), shared_(shared), counters_(counters) {}

  // Starts the level set of a fresh arena: no levels, tree ids from 1.
  void Format();

  // A consistent copy of the current version, from any process, without locks; `seq`, if
  // given, receives the version's sequence number (see VersionSeq).
  Version Current(uint64_t* seq = nullptr) const;
  // The current version's sequence number: even, and changed by every Apply, so a copy taken
  // under an equal number is still current. Odd while a change is under way.
  uint64_t VersionSeq() const { return shared_->version_seq.load(std::memory_order_acquire); }
  // The current version itself (the caller holds the write mutex, so it cannot change).
  const Version& Latest() const { return shared_->current; }
  // Changes the current version under the seqlock (the caller holds the write mutex).
  template <typename Edit>
  void Apply(Edit&& edit) {
    shared_->version_seq.fetch_add(1);
    edit(shared_->current);
    shared_->version_seq.fetch_add(1);
  }

  // The deepest level holding a tree (0: none).
  uint32_t DeepestLevel(const Version& v) const;
  // L0 first (it blocks writers), then the shallowest level over its capacity; -1: nothing.
  int PickCompaction(const Version& v) const;
  // A tree id never used before (persisted, so ids stay unique across restarts).
  uint32_t NewTreeId() { return shared_->next_tree_id.fetch_add(1); }
  uint32_t next_tree_id() const { return shared_->next_tree_id.load(); }
  // Makes later tree ids exceed `tree_id` (one a replica imported under its primary's id).
  void ReserveTreeId(uint32_t tree_id) {
    uint32_t next = shared_->next_tree_id.load();
    while (next <= tree_id && !shared_->next_tree_id.compare_exchange_weak(next, tree_id + 1)) {
    }
  }

  Lsn compacted_lsn() const { return shared_->compacted_lsn; }
  // Where a replica's host resumes feeding imports (persisted in the manifest).
  uint64_t import_resume() const { return shared_->import_resume; }
  void set_import_resume(uint64_t position) { shared_->import_resume = position; }
  // Every record up to `lsn` is now in the levels.
  void AdvanceCompactedLsn(Lsn lsn) {
    shared_->compacted_lsn = std::max(shared_->compacted_lsn, lsn);
  }
  Lsn large_accounted_lsn() const { return shared_->large_accounted_lsn; }
  void set_large_accounted_lsn(Lsn lsn) { shared_->large_accounted_lsn = lsn; }
  uint64_t manifest_number() const { return shared_->manifest_number; }

  // --- manifest (manifest.cc) ---
  // Numbers and serialises the next manifest. The caller holds the write mutex and the
  // segment table's mutex, so the version, the accounting, the keyspaces and `snapshot_lsn`
  // agree with each other.
  std::string NextManifest(Lsn snapshot_lsn, const SegmentTable& segments,
                           const KeyspaceTable& keyspaces, const LogSet& logs);
  // Durably replaces the manifest file.
  Status WriteManifest(const std::string& image);
  // Reads the manifest file (NotFound if the engine is new).
  Status ReadManifest(std::string* image) const;
  // Loads a manifest image into a fresh arena: levels, segment accounting, keyspaces and
  // log sequences; Corruption for anything damaged or impossible.
  Status LoadManifest(const std::string& image, SegmentTable* segments, KeyspaceTable* keyspaces,
                      LogSet* logs, ManifestTail* tail);

 private:
  std::string ManifestPath() const { return options_.directory + "/MANIFEST"; }

  const Options& options_;
  SharedLevels* shared_;
  SharedCounters* counters_;
};

}  // namespace slipstream::engine
