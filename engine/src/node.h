// B+-tree node format (leaf and index nodes, fixed size, stored in index segments).
//
// Layout: a 32-byte header, an array of 16-bit entry offsets, then the entries. The CRC covers
// the node from byte 8 to `used`. Leaf entry: kind (u8), varint key size, [varint value size if
// inline], key, then the value bytes or a 16-byte ValuePtr. Index entry: varint key size, key,
// child DevPtr (segment u32, offset u32); the key is the smallest key under that child.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "format.h"
#include "slipstream/engine/status.h"

namespace slipstream::engine {

constexpr uint32_t kLeafMagic = 0x4641454c;      // "LEAF"
constexpr uint32_t kIndexMagic = 0x58444e49;     // "INDX"
constexpr uint32_t kBloomDirMagic = 0x52494442;  // "BDIR"
constexpr size_t kNodeHeaderSize = 32;

struct NodeHeader {
  uint32_t magic;
  uint32_t crc;
  uint16_t count;
  uint16_t height;  // 0 for leaves
  uint32_t used;    // bytes from the node start
  uint32_t tree_id;
  uint32_t reserved;
  uint64_t reserved2;
};
static_assert(sizeof(NodeHeader) == kNodeHeaderSize);

// One entry as stored in a leaf.
struct LeafEntry {
  std::string_view key;
  ValueKind kind;
  std::string_view inline_value;  // kInline; kLargePatch: the replacement prefix
  ValuePtr ptr;                   // kMediumPtr, kLargePtr, kLargePatch
  bool owner = true;              // kLargePatch: whether it owns ptr's record (format.h)
};

// Whether the entry accounts for a log record's bytes: every pointer but a patch that is not
// its record's owner.
inline bool OwnsRecord(const LeafEntry& e) {
  return e.kind == ValueKind::kMediumPtr || e.kind == ValueKind::kLargePtr ||
         (e.kind == ValueKind::kLargePatch && e.owner);
}

// Whether two entries of one key name the same log record.
inline bool SameRecord(const LeafEntry& a, const LeafEntry& b) {
  return RefersToLargeLog(a.kind) && RefersToLargeLog(b.kind) && a.ptr.where == b.ptr.where;
}

// Accumulates entries of one node and serialises it.
class NodeBuilder {
 public:
  NodeBuilder(uint32_t node_size, bool leaf) : node_size_(node_size), leaf_(leaf) {}

  static size_t LeafEntrySize(const LeafEntry& e);
  static size_t IndexEntrySize(std::string_view key) { return 5 + key.size() + 8; }

  bool Fits(size_t entry_size) const {
    return kNodeHeaderSize + 2 * (offsets_.size() + 1) + data_.size() + entry_size <= node_size_;
  }
  void AddLeaf(const LeafEntry& e);
  void AddIndex(std::string_view key, DevPtr child);
  bool empty() const { return offsets_.empty(); }
  size_t count() const { return offsets_.size(); }

  // Writes the node (zero-padded to node_size) into dst and resets the builder.
  void Finish(char* dst, uint16_t height, uint32_t tree_id);

 private:
  uint32_t node_size_;
  bool leaf_;
  std::vector<uint32_t> offsets_;  // into data_
  std::string data_;
};

// A validated read-only view of a node.
class NodeView {
 public:
  // Checks magic, sizes and (if verify_crc) the checksum.
  static Status Open(const char* node, uint32_t node_size, bool verify_crc, NodeView* view);

  bool is_leaf() const { return header_.magic == kLeafMagic; }
  uint16_t count() const { return header_.count; }
  uint16_t height() const { return header_.height; }
  uint32_t tree_id() const { return header_.tree_id; }

  // Decodes entry i; Corruption if it does not fit in the node.
  Status Leaf(int i, LeafEntry* e) const;
  Status Index(int i, std::string_view* key, DevPtr* child) const;
  Status KeyAt(int i, std::string_view* key) const;

  // Index of the first entry with key >= target (count() if none).
  Status LowerBound(std::string_view target, int* index) const;
  // The same, for a node whose keys the caller knows to lie between `low` and `high` (its
  // parent's separators, or its ends read earlier): spares reading the node's two ends. Only
  // the speed depends on the bounds being right.
  Status LowerBoundWithin(std::string_view target, std::string_view low, std::string_view high,
                          int* index) const;

 private:
  // Finds the first key >= target starting from position `guess`.
  Status Search(std::string_view target, int guess, int* index) const;

  const char* node_ = nullptr;
  NodeHeader header_{};
  uint32_t data_start_ = 0;
};

}  // namespace slipstream::engine
