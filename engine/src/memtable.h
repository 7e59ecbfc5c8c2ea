// The L0 memtable: a skiplist inside a shared-memory area, one writer at a time (the holder of
// the engine's write mutex) and any number of lock-free readers in any process.
//
// Entries are ordered by internal key, then newest LSN first, so overwrites keep older versions
// until compaction: an iterator with an older snapshot LSN still finds the version it saw.
//
// A hash index beside the skiplist answers point reads of random keys in a probe or two
// instead of a descent of some 4 log4(n) nodes, each likely a cache miss. The writer uses it
// too: a new version of a key already here goes right before that key's newest node, found by
// the index, and a back link at level 0 gives that node's predecessor, so most writes of a
// row the memtable holds (the table AM rewrites a version's header when it updates, deletes,
// locks or prunes it) need no descent either; a key's second node is always of height 1 for
// that. Its slots hold the offset of each key's newest node (linear probing, 0: empty), published
// with a release store after the node is linked, so a reader either finds the key there or the
// insert has not finished. A slot also carries the high bits of its key's hash above the node's
// offset (in units of 8 bytes, nodes' alignment), so a probe passes other keys' slots without
// reading their nodes: a read of a key the memtable does not hold costs the slot's cache line, not
// a node per probe. Slots are never emptied before a reset. Once 7/10 of them are taken, keys that
// find no slot are not indexed and the index stops answering for absent keys (index_complete): the
// skiplist answers those reads.
//
// A row the memtable does not hold (an older row's version rewritten, a pruned chain's root)
// has no index slot to start from. A neighbour table beside the index remembers, for each
// bucket of keys, the node inserted last there: small buckets (a key with the low four bits of
// its last byte cleared: 16 row ids) and large ones (the whole last byte: 256 row ids), tried
// when the small one gives no place. A new node of height 1 walks a few links at level 0 from it,
// forward or back by the back links, instead of descending from the top. Appends placed by a
// finger (below) leave the table alone: the rows it serves lie behind the keyspace's end. The
// table is the writer's alone, a hint that hash collisions overwrite: a node of another bucket
// there, or one too far away, means a descent.
//
// New row ids go at the end of their keyspace, where the index has nothing to say, so each
// writer thread keeps an append finger per keyspace: at every level, a node before the newest
// key it appended there (process memory, never shared: one finger per keyspace class kept in the
// memtable header, tried first, is written by every insert and measured no better). An insert after
// that key walks a few links from the finger at each of its node's levels instead of descending
// from the top; a finger more than a few nodes behind is dropped for a descent, which renews it.
#pragma once

#include <atomic>
#include <bit>
#include <cstdint>
#include <string_view>

#include "format.h"
#include "node.h"
#include "shared_state.h"

namespace slipstream::engine {

constexpr int kMemMaxHeight = 16;

// A skiplist node as laid out in the data area (offsets, never pointers).
struct MemNode {
  uint64_t lsn;
  uint32_t key_size;
  uint32_t value_size;
  uint8_t kind;  // ValueKind
  uint8_t height;
  uint16_t pad;
  // `height` links, then the back link (the level-0 predecessor, kept by the writer alone and
  // never read by readers), then the key and value bytes.
  std::atomic<uint32_t> next[1];

  const char* key_data() const {
    return reinterpret_cast<const char*>(&next[0]) + (height + 1) * sizeof(uint32_t);
  }
  uint32_t& back() { return *reinterpret_cast<uint32_t*>(&next[height]); }
  std::string_view key() const { return {key_data(), key_size}; }
  std::string_view value() const { return {key_data() + key_size, value_size}; }
  ValueKind value_kind() const { return static_cast<ValueKind>(kind); }
};

// Views a memtable node as a leaf entry; Corruption if its pointer has the wrong size.
Status MemNodeEntry(const MemNode* node, LeafEntry* entry);

class MemTable {
 public:
  // `index`: the header's index_slots slots, then the neighbour table's NeighbourSlots of them
  // (IndexWords in all; unused if there are none).
  MemTable(MemtableHeader* header, char* data, std::atomic<uint32_t>* index)
      : header_(header),
        data_(data),
        index_(index),
        neighbours_(NeighbourSlots(header->index_slots) != 0
                        ? reinterpret_cast<uint32_t*>(index + header->index_slots)
                        : nullptr),
        neighbour_mask_(NeighbourSlots(header->index_slots) - 1),
        tag_shift_(uint32_t(std::bit_width(header->capacity >> 3))) {}

  // Slots of the neighbour table beside an index of `index_slots` (a power of two or 0; none
  // for an index of fewer than 2).
  static uint32_t NeighbourSlots(uint32_t index_slots) { return index_slots / 2; }
  // 32-bit words a memtable's index and neighbour table take together.
  static uint64_t IndexWords(uint32_t index_slots) {
    return uint64_t(index_slots) + NeighbourSlots(index_slots);
  }

  // Formats an empty skiplist over the data area (writer only, with no readers left).
  void Reset();

  // Where a key's probe starts in the hash index (a slot number), and the tag its slot
  // carries; keys that differ only in the low four bits of their last byte start in one
  // 16-slot line (see memtable.cc).
  struct IndexHome {
    uint32_t start;
    uint32_t tag;
  };
  IndexHome HomeOf(std::string_view ikey) const;

  // Whether the hash index answers for every key (present or absent).
  bool IndexComplete() const {
    return header_->index_slots != 0 && header_->index_complete.load(std::memory_order_acquire);
  }

  // Bytes an entry takes in the data area (upper bound).
  static uint64_t EntrySpace(size_t key_size, size_t value_size) {
    return sizeof(MemNode) + kMemMaxHeight * 4 + 4 + key_size + value_size + 8;
  }
  bool HasRoom(uint64_t space) const { return header_->used.load() + space <= header_->capacity; }

  // Inserts an entry (the caller holds the write mutex and has checked HasRoom).
  void Insert(std::string_view ikey, uint64_t lsn, ValueKind kind, std::string_view value);

  // Newest entry for `ikey` with lsn <= max_lsn, or nullptr: by the hash index whenever it
  // can answer, else by the skiplist. Never both for one key: a key's entry in the index never
  // goes back to an older version, while the skiplist shows a new version a moment before the
  // index does, so a reader answered by each in turn could read a version, then its
  // predecessor.
  const MemNode* Find(std::string_view ikey, uint64_t max_lsn) const;

  // First node with key >= ikey (any version), or nullptr.
  const MemNode* Seek(std::string_view ikey) const;
  const MemNode* First() const { return Node(Head()->next[0].load(std::memory_order_acquire)); }
  const MemNode* Next(const MemNode* n) const {
    return Node(n->next[0].load(std::memory_order_acquire));
  }

  // Whether every level's list is in order (key ascending, newest first) and every back link
  // names its node's predecessor: a full walk, for checks and tests. Lookups tolerate a
  // disordered upper level, so only this sees one.
  bool LevelsOrdered() const;

  uint64_t entries() const { return header_->entries.load(); }
  uint64_t kv_bytes() const { return header_->kv_bytes.load(); }
  uint64_t large_bytes() const { return header_->large_bytes.load(); }
  void AddLargeBytes(uint64_t n) { header_->large_bytes.fetch_add(n, std::memory_order_relaxed); }
  uint64_t used() const { return header_->used.load(); }
  // Inserts placed by a full descent since the last Reset (not by a back link, a neighbour or
  // a finger).
  uint64_t descents() const { return header_->descents.load(std::memory_order_relaxed); }

 private:
  static constexpr uint32_t kHeadOffset = 8;  // offset 0 means "null"

  MemNode* Head() const { return reinterpret_cast<MemNode*>(data_ + kHeadOffset); }
  MemNode* Node(uint32_t off) const {
    return off ? reinterpret_cast<MemNode*>(data_ + off) : nullptr;
  }
  // True if node n orders before (ikey, lsn).
  static bool Before(const MemNode* n, std::string_view ikey, uint64_t lsn);
  // Fills prev[] with the last node before (ikey, lsn) at each level; returns the level-0 one
  // and, in *successor, the level-0 node the descent stopped at.
  MemNode* FindPrevious(std::string_view ikey, uint64_t lsn, MemNode** prev,
                        MemNode** successor) const;
  int RandomHeight() const;
  // The neighbour table's slots for the key's small and large buckets.
  struct NeighbourSpot {
    uint32_t small = 0;
    uint32_t large = 0;
  };
  NeighbourSpot LocateNeighbours(std::string_view ikey) const;
  // For a node of height 1 whose key has no node here to start from: its predecessor at level
  // 0, walked to from the node the neighbour table names for one of the key's buckets, or
  // nullptr if both name other buckets' nodes or lie too far away (then a descent finds it).
  MemNode* PredecessorNearby(std::string_view ikey, uint64_t lsn, const NeighbourSpot& spot) const;
  // The walk from one bucket's node (`bucket`: the last byte's bits that name it).
  MemNode* PredecessorNearBucket(std::string_view ikey, uint64_t lsn, uint32_t slot,
                                 uint8_t bucket) const;
  // Where a key stands in the hash index, as the writer sees it: the key's slot, or the
  // empty slot it would take. Only the writer changes slots, so an insert locates its key once
  // and the answer holds until it publishes there.
  struct IndexSpot {
    enum State : uint8_t { kNoIndex, kFound, kEmpty, kNoRoom } state = kNoIndex;
    uint32_t pos = 0;                 // the slot (kFound, kEmpty)
    uint32_t tag = 0;                 // the key's slot tag
    const MemNode* newest = nullptr;  // the key's newest node (kFound)
  };
  IndexSpot IndexLocate(std::string_view ikey) const;
  // Makes `off` (a node of the located key at `lsn`, just linked) the key's entry in the index.
  void IndexPublishAt(const IndexSpot& spot, uint64_t lsn, uint32_t off);
  // For a node of height 1 that is a newer version of `newest` (the key's newest node here, by
  // the index, or nullptr): its predecessor, the one before `newest` by that node's back link,
  // or nullptr if the key is not known so (then a descent finds it).
  MemNode* PredecessorOfNewVersion(const MemNode* newest, uint64_t lsn) const;
  // Whether this thread's append finger of the key's keyspace is in this memtable and names a
  // key before (ikey, lsn): the insert is an append after it.
  bool FingerPrecedes(std::string_view ikey, uint64_t lsn) const;
  // Whether a node at `lsn` is a newer version of `newest` (as for PredecessorOfNewVersion)
  // whose key has exactly one node here: such a node is given height 1 (see Insert), unless it
  // is an append after the finger.
  bool RewritesOnlyNode(const MemNode* newest, uint64_t lsn) const;
  // Fills prev[0..height) for (ikey, lsn) from this thread's append finger of the key's
  // keyspace, and returns how many levels of prev[] it filled (at least height); 0 if there is
  // no finger, the key is not after it, or it is too far behind.
  int PathFromFinger(std::string_view ikey, uint64_t lsn, int height, MemNode** prev) const;
  // Moves the finger to node `off` (of `height`, just linked at ikey/lsn) when that node is the
  // keyspace's newest key here; prev[height..path_levels) are the node's predecessors above
  // its own levels, which the finger takes too.
  void RememberFinger(std::string_view ikey, uint64_t lsn, uint32_t off, int height,
                      MemNode* const* prev, int path_levels) const;
  // The newest node of `ikey` by the index; *answered false if the index cannot say (no index,
  // or the key is absent from an incomplete one).
  const MemNode* IndexFind(std::string_view ikey, bool* answered) const;
  // IndexFind, walked on to the newest version at or below max_lsn.
  const MemNode* FindIndexed(std::string_view ikey, uint64_t max_lsn, bool* answered) const;
  // A slot's tag: the key hash's bits above the offset's (at least 3: the data area is below
  // 4 GiB, so an offset in 8-byte units takes at most 29 bits).
  uint32_t SlotTag(uint64_t hash) const { return uint32_t(hash >> (32 + tag_shift_)); }
  uint32_t SlotOf(uint32_t off, uint32_t tag) const { return (off >> 3) | (tag << tag_shift_); }
  uint32_t OffsetOf(uint32_t slot) const { return (slot & ((uint32_t{1} << tag_shift_) - 1)) << 3; }

  MemtableHeader* header_;
  char* data_;
  std::atomic<uint32_t>* index_;
  uint32_t* neighbours_;  // node offsets (0: none); nullptr without an index
  uint32_t neighbour_mask_;
  uint32_t tag_shift_;  // bits of an offset in 8-byte units
};

}  // namespace slipstream::engine
