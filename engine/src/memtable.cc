// Skiplist operations on the shared memtable.
#include "memtable.h"

#include <cstring>
#include <random>

namespace slipstream::engine {

Status MemNodeEntry(const MemNode* node, LeafEntry* entry) {
  entry->key = node->key();
  entry->kind = node->value_kind();
  entry->inline_value = {};
  if (entry->kind == ValueKind::kInline) {
    entry->inline_value = node->value();
  } else if (entry->kind != ValueKind::kTombstone) {
    if (node->value_size != ValuePtr::kEncodedSize)
      return Status::Corruption("bad memtable pointer");
    entry->ptr = ValuePtr::DecodeFrom(node->value().data());
  }
  return Status::OK();
}

// Lays out the head node with every link null.
void MemTable::Reset() {
  size_t head_size = sizeof(MemNode) + kMemMaxHeight * 4;
  std::memset(data_ + kHeadOffset, 0, head_size);
  Head()->height = kMemMaxHeight;
  header_->used.store(kHeadOffset + ((head_size + 7) & ~size_t(7)));
  header_->entries.store(0);
  header_->kv_bytes.store(0);
  header_->large_bytes.store(0);
  header_->max_lsn.store(0);
  header_->max_height.store(1);
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

// Geometric heights with p = 1/4; the generator is per thread.
int MemTable::RandomHeight() const {
  thread_local std::mt19937 rng(std::random_device{}());
  int h = 1;
  while (h < kMemMaxHeight && (rng() & 3) == 0) h++;
  return h;
}

// Builds the node fully, then links it bottom-up with release stores so readers never see a
// half-initialised node.
void MemTable::Insert(std::string_view ikey, uint64_t lsn, ValueKind kind, std::string_view value) {
  int height = RandomHeight();
  size_t size = sizeof(MemNode) + (height - 1) * 4 + ikey.size() + value.size();
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
  FindPrevious(ikey, lsn, prev, nullptr);
  for (int i = 0; i < height; i++) {
    node->next[i].store(prev[i]->next[i].load(std::memory_order_relaxed),
                        std::memory_order_relaxed);
    prev[i]->next[i].store(uint32_t(off), std::memory_order_release);
  }
  header_->entries.fetch_add(1, std::memory_order_relaxed);
  header_->kv_bytes.fetch_add(ikey.size() + value.size(), std::memory_order_relaxed);
  if (lsn > header_->max_lsn.load(std::memory_order_relaxed)) header_->max_lsn.store(lsn);
}

// Skips versions newer than the snapshot.
const MemNode* MemTable::Find(std::string_view ikey, uint64_t max_lsn) const {
  MemNode* n = nullptr;
  FindPrevious(ikey, max_lsn, nullptr, &n);
  if (n && n->key() == ikey) return n;
  return nullptr;
}

const MemNode* MemTable::Seek(std::string_view ikey) const {
  MemNode* n = nullptr;
  FindPrevious(ikey, UINT64_MAX, nullptr, &n);
  return n;
}

}  // namespace slipstream::engine
