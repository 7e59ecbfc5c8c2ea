// KeyspaceTable: the keyspaces of the engine, an open-addressing hash table in the arena keyed
// by never-reused ids. A slot goes live -> dropped (O(1), its data still in the levels) ->
// deleted (compaction has removed every entry).
#pragma once

#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "shared_state.h"
#include "slipstream/engine/observer.h"
#include "slipstream/engine/status.h"
#include "slipstream/engine/write_batch.h"

namespace slipstream::engine {

class KeyspaceTable {
 public:
  KeyspaceTable(char* arena, SharedKeyspaces* shared) : arena_(arena), shared_(shared) {}

  // Lays out an empty table at arena offset `table_offset`; ids start at 1.
  void Format(uint64_t table_offset);

  // The slot holding `id` (any state but deleted), or nullptr.
  KeyspaceSlot* Find(KeyspaceId id) const;
  // The slot for `id`, taking an empty or deleted one if it has none (nullptr: table full).
  KeyspaceSlot* Insert(KeyspaceId id);
  bool IsLive(KeyspaceId id) const;

  // Takes the next id and a slot for it (nullptr: table full). The caller holds the write
  // mutex and makes the slot live once its create record is logged.
  KeyspaceSlot* Reserve(KeyspaceId* id);
  uint32_t next_id() const { return shared_->next_id; }
  // Recovery: ids up to `id` are taken.
  void NoteUsed(KeyspaceId id) { shared_->next_id = std::max(shared_->next_id, id + 1); }
  void set_next_id(uint32_t id) { shared_->next_id = id; }

  // The live keyspace named `tag`, or NotFound. The table is keyed by id, so a tag is found by
  // a scan of every slot (1 MiB); this process remembers what it found, checked against the
  // slot (by id: one probe) on every use, so a dropped keyspace or a new one for the tag is
  // seen at once. Replay looks up the keyspace of every record it applies: the scan was most
  // of a standby's replay.
  Status Lookup(uint64_t tag, KeyspaceId* id) const;
  // Every live keyspace as (tag, id).
  void List(std::vector<std::pair<uint64_t, KeyspaceId>>* keyspaces) const;
  // Ids of dropped keyspaces whose data may still be in the levels.
  std::vector<KeyspaceId> Dropped() const;
  bool AnyDropped() const;

  // The live and dropped keyspaces, as a primary reports them to its replicas.
  std::vector<KeyspaceRecord> Records() const;
  // A replica: makes the table exactly `records` (every other keyspace deleted), with ids from
  // `next_id` on. False if the table is full.
  bool Mirror(const std::vector<KeyspaceRecord>& records, uint32_t next_id);

  // Calls fn(tag, id, state) for every live or dropped slot (what the manifest records).
  template <typename Fn>
  void ForEachRecorded(Fn&& fn) const {
    const KeyspaceSlot* slots = Slots();
    for (uint32_t i = 0; i < kKeyspaceSlots; i++) {
      uint32_t state = slots[i].state.load();
      if (state == KeyspaceSlot::kLive || state == KeyspaceSlot::kDropped) {
        fn(slots[i].tag, slots[i].id, state);
      }
    }
  }

 private:
  KeyspaceSlot* Slots() const {
    return reinterpret_cast<KeyspaceSlot*>(arena_ + shared_->table_offset);
  }

  // Whether `id`'s slot is live and named `tag` (what a remembered lookup is checked by).
  bool IsLiveWithTag(KeyspaceId id, uint64_t tag) const;

  char* arena_;
  SharedKeyspaces* shared_;
  // Lookup's memory of tags found in this process (never trusted without the slot's check).
  // As many as the table has slots, so a working set of live keyspaces always fits; dropped
  // ones' tags accumulate until then, and the map starts over.
  static constexpr size_t kRememberedTags = kKeyspaceSlots;
  mutable std::mutex found_mu_;
  mutable std::unordered_map<uint64_t, KeyspaceId> found_;
};

}  // namespace slipstream::engine
