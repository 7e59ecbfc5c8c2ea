// KeyspaceTable: see keyspace_table.h.
#include "keyspace_table.h"

#include <algorithm>
#include <set>
#include <string>

namespace slipstream::engine {

void KeyspaceTable::Format(uint64_t table_offset) {
  shared_->table_offset = table_offset;
  shared_->next_id = 1;
}

KeyspaceSlot* KeyspaceTable::Find(KeyspaceId id) const {
  KeyspaceSlot* slots = Slots();
  uint32_t mask = kKeyspaceSlots - 1;
  for (uint32_t i = 0, idx = (id * 2654435761u) & mask; i < kKeyspaceSlots;
       i++, idx = (idx + 1) & mask) {
    uint32_t state = slots[idx].state.load(std::memory_order_acquire);
    if (state == KeyspaceSlot::kEmpty) return nullptr;
    if (state != KeyspaceSlot::kDeleted && slots[idx].id == id) return &slots[idx];
  }
  return nullptr;
}

KeyspaceSlot* KeyspaceTable::Insert(KeyspaceId id) {
  if (KeyspaceSlot* existing = Find(id)) return existing;
  KeyspaceSlot* slots = Slots();
  uint32_t mask = kKeyspaceSlots - 1;
  for (uint32_t i = 0, idx = (id * 2654435761u) & mask; i < kKeyspaceSlots;
       i++, idx = (idx + 1) & mask) {
    uint32_t state = slots[idx].state.load();
    if (state == KeyspaceSlot::kEmpty || state == KeyspaceSlot::kDeleted) {
      slots[idx].id = id;
      return &slots[idx];
    }
  }
  return nullptr;
}

bool KeyspaceTable::IsLive(KeyspaceId id) const {
  KeyspaceSlot* slot = Find(id);
  // The slot may be deleted and taken by another id between Find and the state's load: the
  // id is read again after it (a new owner writes its id before it turns the state live).
  return slot && slot->state.load(std::memory_order_acquire) == KeyspaceSlot::kLive &&
         slot->id == id;
}

KeyspaceSlot* KeyspaceTable::Reserve(KeyspaceId* id) {
  KeyspaceId new_id = shared_->next_id;
  KeyspaceSlot* slot = Insert(new_id);
  if (slot == nullptr) return nullptr;
  shared_->next_id++;
  *id = new_id;
  return slot;
}

bool KeyspaceTable::IsLiveWithTag(KeyspaceId id, uint64_t tag) const {
  const KeyspaceSlot* slot = Find(id);
  // Id and tag are written before the state turns live (release) and never change while it
  // is; the id is read again because the slot may have been deleted and taken by another
  // keyspace (a TRUNCATE's new one, with the same tag) since Find.
  return slot != nullptr && slot->state.load(std::memory_order_acquire) == KeyspaceSlot::kLive &&
         slot->id == id && slot->tag == tag;
}

Status KeyspaceTable::Lookup(uint64_t tag, KeyspaceId* id) const {
  {
    std::lock_guard<std::mutex> lock(found_mu_);
    auto it = found_.find(tag);
    if (it != found_.end()) {
      if (IsLiveWithTag(it->second, tag)) {
        *id = it->second;
        return Status::OK();
      }
      found_.erase(it);  // dropped, or deleted: the scan below finds a successor, if any
    }
  }
  const KeyspaceSlot* slots = Slots();
  for (uint32_t i = 0; i < kKeyspaceSlots; i++) {
    if (slots[i].state.load() == KeyspaceSlot::kLive && slots[i].tag == tag) {
      *id = slots[i].id;
      std::lock_guard<std::mutex> lock(found_mu_);
      if (found_.size() >= kRememberedTags) found_.clear();
      found_[tag] = *id;
      return Status::OK();
    }
  }
  return Status::NotFound("no keyspace with tag " + std::to_string(tag));
}

// A keyspace created or dropped meanwhile may or may not appear.
void KeyspaceTable::List(std::vector<std::pair<uint64_t, KeyspaceId>>* keyspaces) const {
  keyspaces->clear();
  const KeyspaceSlot* slots = Slots();
  for (uint32_t i = 0; i < kKeyspaceSlots; i++) {
    if (slots[i].state.load() == KeyspaceSlot::kLive) {
      keyspaces->emplace_back(slots[i].tag, slots[i].id);
    }
  }
}

std::vector<KeyspaceId> KeyspaceTable::Dropped() const {
  std::vector<KeyspaceId> dropped;
  const KeyspaceSlot* slots = Slots();
  for (uint32_t i = 0; i < kKeyspaceSlots; i++) {
    if (slots[i].state.load() == KeyspaceSlot::kDropped) dropped.push_back(slots[i].id);
  }
  return dropped;
}

bool KeyspaceTable::AnyDropped() const {
  const KeyspaceSlot* slots = Slots();
  for (uint32_t i = 0; i < kKeyspaceSlots; i++) {
    if (slots[i].state.load() == KeyspaceSlot::kDropped) return true;
  }
  return false;
}

// Read slot by slot: a keyspace created or dropped meanwhile may or may not appear.
std::vector<KeyspaceRecord> KeyspaceTable::Records() const {
  std::vector<KeyspaceRecord> records;
  ForEachRecorded([&](uint64_t tag, KeyspaceId id, uint32_t state) {
    records.push_back(KeyspaceRecord{tag, id, state});
  });
  return records;
}

// Deletes what the primary no longer records first, so that slots are free for what it adds.
bool KeyspaceTable::Mirror(const std::vector<KeyspaceRecord>& records, uint32_t next_id) {
  std::set<KeyspaceId> wanted;
  for (const KeyspaceRecord& r : records) wanted.insert(r.id);
  KeyspaceSlot* slots = Slots();
  for (uint32_t i = 0; i < kKeyspaceSlots; i++) {
    uint32_t state = slots[i].state.load();
    if ((state == KeyspaceSlot::kLive || state == KeyspaceSlot::kDropped) &&
        !wanted.count(slots[i].id)) {
      slots[i].state.store(KeyspaceSlot::kDeleted, std::memory_order_release);
    }
  }
  for (const KeyspaceRecord& r : records) {
    KeyspaceSlot* slot = Insert(r.id);
    if (slot == nullptr) return false;
    slot->tag = r.tag;
    slot->state.store(r.state, std::memory_order_release);
  }
  shared_->next_id = std::max(shared_->next_id, next_id);
  return true;
}

}  // namespace slipstream::engine
