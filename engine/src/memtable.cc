// Skiplist operations on the shared memtable.
#include "memtable.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <random>

#include "coding.h"

namespace slipstream::engine {

namespace {

// A writer thread's append finger into one keyspace of one memtable generation (memtable.h):
// data-area offsets, at[0] the newest key the thread appended there and at[i] a node of level
// i before it (the head where none is known).
struct AppendFinger {
  const MemtableHeader* header = nullptr;
  uint64_t generation = 0;
  uint32_t keyspace = 0;
  uint32_t at[kMemMaxHeight];
  // at[0]'s key and LSN, copied when they fit, so that deciding whether an insert comes after
  // it reads no shared memory: most inserts that are not appends are rewrites of older rows.
  uint64_t newest_lsn = 0;
  uint32_t newest_size = kNoCopy;
  char newest_key[24];
  static constexpr uint32_t kNoCopy = ~0u;
};

constexpr int kFingerSlots = 16;
// Links a finger walk may follow at one level before a descent is cheaper: a descent reads
// about four nodes a level.
constexpr int kFingerSteps = 3;
// The level a finger search starts at when the walk of the node's own levels ran too far:
// other writers' appends since this thread's last one lie between, about four times fewer at
// each level up, so three links at level 5 cover a few thousand of them.
constexpr int kFingerSearchTop = 5;
// Links a walk from a bucket's neighbour may follow: a small bucket holds at most a few more
// nodes than its 16 row ids (versions of one row follow each other), a large one is tried
// only when the small one gives no place, and a descent reads some 35 nodes of a large
// memtable, so two walks that run out still cost less.
constexpr int kNeighbourSteps = 12;
// The bits of a key's last byte that name its small and its large neighbour bucket.
constexpr uint8_t kSmallBucket = 0xF0;
constexpr uint8_t kLargeBucket = 0x00;

// Whether two keys fall in one neighbour bucket: equal but for the bits of the last byte
// outside `bucket`.
bool SameBucket(std::string_view a, std::string_view b, uint8_t bucket) {
  if (a.size() != b.size() || a.empty()) return a.size() == b.size();
  size_t last = a.size() - 1;
  return ((uint8_t(a[last]) ^ uint8_t(b[last])) & bucket) == 0 &&
         std::memcmp(a.data(), b.data(), last) == 0;
}

thread_local AppendFinger t_fingers[kFingerSlots];

// The keyspace prefix of an internal key (0 for the short keys of tests).
uint32_t PrefixOf(std::string_view ikey) {
  return ikey.size() >= kKeyspacePrefix ? KeyspaceOf(ikey) : 0;
}

AppendFinger& FingerSlot(uint32_t keyspace) {
  return t_fingers[(keyspace * 0x9E3779B1u) >> 28];
}

// Whether (ikey, lsn) orders after the finger's newest node, by the copy when there is one.
bool AfterNewest(const AppendFinger& f, const MemNode* newest, std::string_view ikey,
                 uint64_t lsn) {
  std::string_view key = f.newest_size == AppendFinger::kNoCopy
                             ? newest->key()
                             : std::string_view(f.newest_key, f.newest_size);
  uint64_t newest_lsn = f.newest_size == AppendFinger::kNoCopy ? newest->lsn : f.newest_lsn;
  int c = CompareKeys(key, ikey);
  return c < 0 || (c == 0 && newest_lsn > lsn);
}

}  // namespace

Status MemNodeEntry(const MemNode* node, LeafEntry* entry) {
  entry->key = node->key();
  entry->kind = node->value_kind();
  entry->inline_value = {};
  entry->owner = true;
  if (entry->kind == ValueKind::kInline) {
    entry->inline_value = node->value();
  } else if (entry->kind == ValueKind::kLargePatch) {
    if (!LargePatch::DecodeFrom(node->value(), &entry->ptr, &entry->owner, &entry->inline_value))
      return Status::Corruption("bad memtable patch");
  } else if (entry->kind != ValueKind::kTombstone) {
    if (node->value_size != ValuePtr::kEncodedSize)
      return Status::Corruption("bad memtable pointer");
    entry->ptr = ValuePtr::DecodeFrom(node->value().data());
  }
  return Status::OK();
}

// Lays out the head node with every link null.
void MemTable::Reset() {
  size_t head_size = sizeof(MemNode) + kMemMaxHeight * 4 + 4;
  std::memset(data_ + kHeadOffset, 0, head_size);
  Head()->height = kMemMaxHeight;
  header_->used.store(kHeadOffset + ((head_size + 7) & ~size_t(7)));
  header_->entries.store(0);
  header_->kv_bytes.store(0);
  header_->large_bytes.store(0);
  header_->max_lsn.store(0);
  header_->max_height.store(1);
  header_->descents.store(0);
  // Counted, so a slot never comes back to a generation some process's finger names (Resets
  // are serialised: the write mutex, or no other process yet); started at 64 random bits,
  // because a test's next arena may reuse this header's address.
  uint64_t generation = header_->generation.load();
  if (generation == 0) {
    std::random_device seed;
    generation = (uint64_t(seed()) << 32 | seed()) | 1;
  } else {
    generation = generation + 1 == 0 ? 1 : generation + 1;
  }
  header_->generation.store(generation);
  if (header_->index_slots != 0) {
    std::memset(static_cast<void*>(index_), 0,
                size_t(IndexWords(header_->index_slots)) * sizeof(uint32_t));
    header_->index_used.store(0);
    header_->index_complete.store(1);
  }
}

// Newest version first among equal keys.
bool MemTable::Before(const MemNode* n, std::string_view ikey, uint64_t lsn) {
  int c = CompareKeys(n->key(), ikey);
  return c < 0 || (c == 0 && n->lsn > lsn);
}

// Classic skiplist descent from the highest used level. Returns the last node before
// (ikey, lsn) at level 0 and, in *successor, the level-0 node that ended the descent: the
// first at or after (ikey, lsn) as of that moment. Callers must use that node rather than
// reload the link, which a concurrent insert may by then point at a newer node in between.
MemNode* MemTable::FindPrevious(std::string_view ikey, uint64_t lsn, MemNode** prev,
                                MemNode** successor) const {
  MemNode* x = Head();
  int level = int(header_->max_height.load(std::memory_order_acquire)) - 1;
  while (true) {
    MemNode* next = Node(x->next[level].load(std::memory_order_acquire));
    // The node a step down would compare next: its miss overlaps this one's.
    if (level > 0) __builtin_prefetch(Node(x->next[level - 1].load(std::memory_order_relaxed)));
    if (next && Before(next, ikey, lsn)) {
      x = next;
    } else {
      if (prev) prev[level] = x;
      if (level == 0) {
        if (successor) *successor = next;
        return x;
      }
      level--;
    }
  }
}

// The newest node holds the key's index slot (the writer published it); a newer version
// orders right before it. The check that the back link leads to that node costs one node and
// guards against a link the writer did not keep (it always does).
MemNode* MemTable::PredecessorOfNewVersion(const MemNode* newest, uint64_t lsn) const {
  if (newest == nullptr || newest->lsn >= lsn) return nullptr;
  MemNode* before = Node(const_cast<MemNode*>(newest)->back());
  if (before == nullptr || Node(before->next[0].load(std::memory_order_relaxed)) != newest)
    return nullptr;
  return before;
}

// Reads the finger's own copy of its newest key, so an append asks no shared memory.
bool MemTable::FingerPrecedes(std::string_view ikey, uint64_t lsn) const {
  const uint32_t keyspace = PrefixOf(ikey);
  const AppendFinger& f = FingerSlot(keyspace);
  return f.header == header_ && f.keyspace == keyspace &&
         f.generation == header_->generation.load(std::memory_order_relaxed) &&
         AfterNewest(f, Node(f.at[0]), ikey, lsn);
}

// The index names the key's newest node; a key with one node here has no run of versions that
// a height-1 node in front could lengthen.
bool MemTable::RewritesOnlyNode(const MemNode* newest, uint64_t lsn) const {
  if (newest == nullptr || newest->lsn >= lsn) return false;
  const MemNode* older = Node(newest->next[0].load(std::memory_order_relaxed));
  return older == nullptr || older->key() != newest->key();
}

// Each level starts from the finger's node there, which precedes the key: the finger's nodes
// are never unlinked in this generation and at[0] orders before (ikey, lsn), checked here.
// Only the writer changes links, and it holds the write mutex, so relaxed loads see them all.
//
// First each of the node's own levels is walked from the finger's node there. When other
// writers have appended to the keyspace since this thread last did (many backends inserting
// in turn), level 0 lies too far behind; then a finger search runs down from a higher level,
// each level starting from the later of the finger's node there and the node the level above
// ended at, which costs a few links a level however many nodes came between.
int MemTable::PathFromFinger(std::string_view ikey, uint64_t lsn, int height,
                             MemNode** prev) const {
  if (!FingerPrecedes(ikey, lsn)) return 0;
  const AppendFinger& f = FingerSlot(PrefixOf(ikey));
  // The last node before the key at `level`, walking from x; nullptr past `budget` links.
  auto walk = [&](MemNode* x, int level, int budget) -> MemNode* {
    for (int steps = 0;; steps++) {
      MemNode* next = Node(x->next[level].load(std::memory_order_relaxed));
      if (next == nullptr || !Before(next, ikey, lsn)) return x;
      if (steps == budget) return nullptr;
      x = next;
    }
  };
  int level = 0;
  while (level < height && (prev[level] = walk(Node(f.at[level]), level, kFingerSteps))) level++;
  if (level == height) return height;
  const int used = int(header_->max_height.load(std::memory_order_relaxed));
  const int top = std::max(height, std::min(used, kFingerSearchTop + 1)) - 1;
  MemNode* x = nullptr;
  for (level = top; level >= 0; level--) {
    MemNode* start = Node(f.at[level]);
    if (x == nullptr || x == Head() ||
        (start != Head() && start != x && Before(x, start->key(), start->lsn)))
      x = start;
    // Below the top, the level above bounds the walk, as in a descent.
    if ((x = walk(x, level, level == top ? kFingerSteps : INT_MAX)) == nullptr) return 0;
    prev[level] = x;
  }
  return top + 1;
}

// A rewrite of an older row leaves the finger at the keyspace's end, where the next new row
// id goes. A finger of another keyspace or generation gives way to this one.
void MemTable::RememberFinger(std::string_view ikey, uint64_t lsn, uint32_t off, int height,
                              MemNode* const* prev, int path_levels) const {
  const uint32_t keyspace = PrefixOf(ikey);
  const uint64_t generation = header_->generation.load(std::memory_order_relaxed);
  AppendFinger& f = FingerSlot(keyspace);
  if (f.header == header_ && f.keyspace == keyspace && f.generation == generation) {
    if (!AfterNewest(f, Node(f.at[0]), ikey, lsn)) return;
  } else {
    f.header = header_;
    f.keyspace = keyspace;
    f.generation = generation;
    for (uint32_t& at : f.at) at = kHeadOffset;
  }
  for (int level = 0; level < height; level++) f.at[level] = off;
  f.newest_lsn = lsn;
  f.newest_size = ikey.size() <= sizeof(f.newest_key) ? uint32_t(ikey.size()) : f.kNoCopy;
  if (f.newest_size != f.kNoCopy) std::memcpy(f.newest_key, ikey.data(), ikey.size());
  for (int level = height; level < path_levels; level++)
    f.at[level] = uint32_t(reinterpret_cast<char*>(prev[level]) - data_);
}

bool MemTable::LevelsOrdered() const {
  int max_height = int(header_->max_height.load(std::memory_order_acquire));
  for (int level = 0; level < max_height; level++) {
    MemNode* x = Head();
    for (;;) {
      MemNode* next = Node(x->next[level].load(std::memory_order_acquire));
      if (next == nullptr) break;
      if (x != Head() && !Before(x, next->key(), next->lsn)) return false;
      if (level == 0 && Node(next->back()) != x) return false;
      x = next;
    }
  }
  return true;
}

// Hashes of the key without its last byte, and of that byte's bits naming each bucket.
MemTable::NeighbourSpot MemTable::LocateNeighbours(std::string_view ikey) const {
  if (ikey.empty()) return {};
  const uint64_t prefix = HashKey(ikey.substr(0, ikey.size() - 1));
  auto slot = [&](uint8_t bucket) {
    uint64_t h = prefix ^ ((uint64_t(uint8_t(ikey.back()) & bucket) | uint64_t(bucket) << 8) + 1) *
                              0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    return uint32_t(h) & neighbour_mask_;
  };
  return {slot(kSmallBucket), slot(kLargeBucket)};
}

// The key's small bucket, else its large one (an empty small bucket is common where the
// memtable holds a table's rows sparsely).
MemNode* MemTable::PredecessorNearby(std::string_view ikey, uint64_t lsn,
                                     const NeighbourSpot& spot) const {
  MemNode* prev = PredecessorNearBucket(ikey, lsn, spot.small, kSmallBucket);
  return prev != nullptr ? prev : PredecessorNearBucket(ikey, lsn, spot.large, kLargeBucket);
}

// The walk goes forward when the neighbour precedes the key, else back by the back links; a
// node it reads is in this generation, since Reset clears the table. Only the writer reads
// the back links and the table, under the write mutex. Each step back is checked against the
// forward link, as PredecessorOfNewVersion checks its one: a writer that died between linking
// a node and setting the back links must not make a later insert link out of order.
MemNode* MemTable::PredecessorNearBucket(std::string_view ikey, uint64_t lsn, uint32_t slot,
                                         uint8_t bucket) const {
  MemNode* x = Node(neighbours_[slot]);
  if (x == nullptr || !SameBucket(x->key(), ikey, bucket)) return nullptr;
  if (Before(x, ikey, lsn)) {
    for (int steps = 0;; steps++) {
      MemNode* next = Node(x->next[0].load(std::memory_order_relaxed));
      if (next == nullptr || !Before(next, ikey, lsn)) return x;
      if (steps == kNeighbourSteps) return nullptr;
      x = next;
    }
  }
  for (int steps = 0; steps < kNeighbourSteps; steps++) {
    MemNode* after = x;
    x = Node(x->back());
    if (x == nullptr || Node(x->next[0].load(std::memory_order_relaxed)) != after) return nullptr;
    if (x == Head() || Before(x, ikey, lsn)) return x;
  }
  return nullptr;
}

// Geometric heights with p = 1/4; the generator is per thread.
// One xorshift64* draw a node: each pair of low zero bits adds a level (probability 1/4 each),
// as a loop of draws would, at a fraction of a Mersenne twister's cost per insert.
int MemTable::RandomHeight() const {
  thread_local uint64_t state = std::random_device{}() | 1;  // never 0, xorshift's fixed point
  state ^= state >> 12;
  state ^= state << 25;
  state ^= state >> 27;
  uint64_t r = state * 0x2545F4914F6CDD1DULL;
  int levels = r == 0 ? 32 : __builtin_ctzll(r) / 2;
  return std::min(1 + levels, kMemMaxHeight);
}

// Builds the node fully, then links it bottom-up with release stores so readers never see a
// half-initialised node.
void MemTable::Insert(std::string_view ikey, uint64_t lsn, ValueKind kind, std::string_view value) {
  int height = RandomHeight();
  // Located once, before the first use, and published to after the links: an append after
  // the finger needs the index only there.
  IndexSpot spot;
  bool located = false;
  auto newest = [&]() {
    if (!located) spot = IndexLocate(ikey);
    located = true;
    return spot.newest;
  };
  if (height > 1 && !FingerPrecedes(ikey, lsn) && RewritesOnlyNode(newest(), lsn)) height = 1;
  size_t size = sizeof(MemNode) + height * 4 + ikey.size() + value.size();
  uint64_t off = header_->used.load(std::memory_order_relaxed);
  header_->used.store(off + ((size + 7) & ~size_t(7)), std::memory_order_relaxed);
  auto* node = reinterpret_cast<MemNode*>(data_ + off);
  node->lsn = lsn;
  node->key_size = uint32_t(ikey.size());
  node->value_size = uint32_t(value.size());
  node->kind = static_cast<uint8_t>(kind);
  node->height = uint8_t(height);
  node->pad = 0;
  char* kv = const_cast<char*>(node->key_data());
  std::memcpy(kv, ikey.data(), ikey.size());
  if (!value.empty()) std::memcpy(kv + ikey.size(), value.data(), value.size());

  MemNode* prev[kMemMaxHeight];
  int max_height = int(header_->max_height.load(std::memory_order_relaxed));
  if (height > max_height) {
    for (int i = max_height; i < height; i++) prev[i] = Head();
    header_->max_height.store(uint32_t(height), std::memory_order_release);
  }
  // A new row id right after this thread's last one takes its path from the finger (checking
  // that against the finger's copy of its key reads no shared memory). Heights stay random (a key's
  // versions all of height 1 would make a long level-0 run of a hot key that every search passing
  // it walks): only a height-1 node skips the descent, by the index and a back link or by a
  // neighbour in the key's bucket (rows this memtable does not hold). The one exception, above: a
  // key's second node (the table AM rewrites a version's header once, when it is updated or
  // deleted) is always of height 1, so that it never needs a descent.
  int path_levels = PathFromFinger(ikey, lsn, height, prev);
  // Appends the finger placed neither use nor feed the neighbour table: the rows it serves lie
  // behind the keyspace's end, among other rewrites, so an append spares the hash and stores.
  const bool near_rows = neighbours_ != nullptr && path_levels == 0;
  const NeighbourSpot neighbour = near_rows ? LocateNeighbours(ikey) : NeighbourSpot{};
  if (path_levels == 0 &&
      (height != 1 ||
       ((prev[0] = PredecessorOfNewVersion(newest(), lsn)) == nullptr &&
        (!near_rows || (prev[0] = PredecessorNearby(ikey, lsn, neighbour)) == nullptr)))) {
    FindPrevious(ikey, lsn, prev, nullptr);
    header_->descents.store(header_->descents.load(std::memory_order_relaxed) + 1,
                            std::memory_order_relaxed);
    path_levels = int(header_->max_height.load(std::memory_order_relaxed));
  }
  for (int i = 0; i < height; i++) {
    node->next[i].store(prev[i]->next[i].load(std::memory_order_relaxed),
                        std::memory_order_relaxed);
    prev[i]->next[i].store(uint32_t(off), std::memory_order_release);
  }
  node->back() = uint32_t(reinterpret_cast<char*>(prev[0]) - data_);
  if (MemNode* successor = Node(node->next[0].load(std::memory_order_relaxed)))
    successor->back() = uint32_t(off);
  if (near_rows) neighbours_[neighbour.small] = neighbours_[neighbour.large] = uint32_t(off);
  if (!located) spot = IndexLocate(ikey);
  IndexPublishAt(spot, lsn, uint32_t(off));
  RememberFinger(ikey, lsn, uint32_t(off), height, prev, path_levels);
  header_->entries.fetch_add(1, std::memory_order_relaxed);
  header_->kv_bytes.fetch_add(ikey.size() + value.size(), std::memory_order_relaxed);
  if (lsn > header_->max_lsn.load(std::memory_order_relaxed)) header_->max_lsn.store(lsn);
}

const MemNode* MemTable::Find(std::string_view ikey, uint64_t max_lsn) const {
  bool answered;
  const MemNode* n = FindIndexed(ikey, max_lsn, &answered);
  if (answered) return n;
  MemNode* found = nullptr;
  FindPrevious(ikey, max_lsn, nullptr, &found);
  if (found && found->key() == ikey) return found;
  return nullptr;
}

// Skips versions newer than the snapshot: they follow the newest at level 0.
const MemNode* MemTable::FindIndexed(std::string_view ikey, uint64_t max_lsn,
                                     bool* answered) const {
  const MemNode* n = IndexFind(ikey, answered);
  while (*answered && n != nullptr && n->lsn > max_lsn) {
    n = Node(n->next[0].load(std::memory_order_acquire));
    if (n != nullptr && n->key() != ikey) n = nullptr;
  }
  return n;
}

// Keys equal but for the low four bits of their last byte (16 consecutive row ids of a table)
// start in one 64-byte line of the index, each at its own slot there, so that an index scan
// fetching rows in row id order reads a line per 16 rows rather than a line per row. The tag
// mixes in those four bits, so that a key displaced into a neighbour's slot is told apart
// without reading its node.
MemTable::IndexHome MemTable::HomeOf(std::string_view ikey) const {
  const uint32_t mask = header_->index_slots - 1;
  if (ikey.empty()) return {0, SlotTag(HashKey(ikey))};
  const uint8_t last = uint8_t(ikey.back());
  uint64_t line =
      HashKey(ikey.substr(0, ikey.size() - 1)) ^ (uint64_t(last >> 4) + 1) * 0x9E3779B97F4A7C15ull;
  line ^= line >> 29;
  uint64_t member = line ^ (uint64_t(last & 15) + 1) * 0xC2B2AE3D27D4EB4Full;
  member ^= member >> 31;
  return {((uint32_t(line) & ~15u) | (last & 15u)) & mask, SlotTag(member)};  // any power of two
}

// Linear probing from the key's home; the load cap leaves an empty slot to stop at.
const MemNode* MemTable::IndexFind(std::string_view ikey, bool* answered) const {
  *answered = false;
  uint32_t slots = header_->index_slots;
  if (slots == 0) return nullptr;
  bool complete = header_->index_complete.load(std::memory_order_acquire) != 0;
  uint32_t mask = slots - 1;
  const IndexHome home = HomeOf(ikey);
  const uint32_t tag = home.tag;
  uint32_t i = home.start;
  for (uint32_t probes = 0; probes < slots; probes++, i = (i + 1) & mask) {
    uint32_t slot = index_[i].load(std::memory_order_acquire);
    if (slot == 0) {
      *answered = complete;
      return nullptr;
    }
    if ((slot >> tag_shift_) != tag) continue;  // another key's
    const MemNode* n = Node(OffsetOf(slot));
    if (n->key() == ikey) {
      *answered = true;
      return n;
    }
  }
  return nullptr;
}

// The writer alone changes slots, so plain loads suffice here; readers pair with the release
// stores of IndexPublishAt.
MemTable::IndexSpot MemTable::IndexLocate(std::string_view ikey) const {
  IndexSpot spot;
  uint32_t slots = header_->index_slots;
  if (slots == 0) return spot;
  uint32_t mask = slots - 1;
  const IndexHome home = HomeOf(ikey);
  spot.tag = home.tag;
  spot.state = IndexSpot::kNoRoom;
  uint32_t i = home.start;
  for (uint32_t probes = 0; probes < slots; probes++, i = (i + 1) & mask) {
    uint32_t current = index_[i].load(std::memory_order_relaxed);
    if (current == 0) {
      spot.state = IndexSpot::kEmpty;
      spot.pos = i;
      return spot;
    }
    if ((current >> tag_shift_) != spot.tag) continue;  // another key's
    const MemNode* n = Node(OffsetOf(current));
    if (n->key() == ikey) {
      spot.state = IndexSpot::kFound;
      spot.pos = i;
      spot.newest = n;
      return spot;
    }
  }
  return spot;
}

// A newer version takes over its key's slot; a key with no room marks the index incomplete
// before the insert returns.
void MemTable::IndexPublishAt(const IndexSpot& spot, uint64_t lsn, uint32_t off) {
  switch (spot.state) {
    case IndexSpot::kNoIndex:
      return;
    case IndexSpot::kFound:
      if (lsn >= spot.newest->lsn)
        index_[spot.pos].store(SlotOf(off, spot.tag), std::memory_order_release);
      return;
    case IndexSpot::kEmpty: {
      uint32_t used = header_->index_used.load(std::memory_order_relaxed);
      if (uint64_t(used + 1) * 10 <= uint64_t(header_->index_slots) * 7) {
        header_->index_used.store(used + 1, std::memory_order_relaxed);
        index_[spot.pos].store(SlotOf(off, spot.tag), std::memory_order_release);
        return;
      }
      break;
    }
    case IndexSpot::kNoRoom:
      break;
  }
  header_->index_complete.store(0, std::memory_order_release);
}

const MemNode* MemTable::Seek(std::string_view ikey) const {
  MemNode* n = nullptr;
  FindPrevious(ikey, UINT64_MAX, nullptr, &n);
  return n;
}

}  // namespace slipstream::engine
