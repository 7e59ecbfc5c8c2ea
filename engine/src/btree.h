// A level's B+-tree: built bottom-up from sorted input during compaction (leaves first, then
// each index layer from the first keys of the layer below), read by descent through the
// device mapping, with every node validated before it is followed.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "bloom.h"
#include "device.h"
#include "node.h"
#include "node_check_cache.h"
#include "shared_state.h"

namespace slipstream::engine {

// Where a builder gets and puts its segments.
class SegmentSink {
 public:
  virtual ~SegmentSink() = default;
  virtual Status NewSegment(SegmentKind kind, uint32_t* segment) = 0;
  virtual Status WriteSegment(uint32_t segment, const char* data, uint32_t length) = 0;
};

struct TreeShape {
  uint32_t node_size;
  uint32_t segment_size;
  uint32_t bloom_bits_per_key;  // 0: the tree has no bloom filter
  uint32_t small_threshold;
  uint32_t large_threshold;
};

class TreeBuilder {
 public:
  TreeBuilder(const TreeShape& shape, SegmentSink* sink, uint32_t tree_id);

  // Adds the next entry; keys must be strictly increasing.
  Status Add(const LeafEntry& e);
  // Makes the leaf of an older tree at `where`, whose first key is `first_key`, the tree's next
  // leaf as it stands (the leaf is not read): only the index above it and the bloom filter are
  // written. Its keys must follow every key added so far, and the caller's keys added after it
  // must follow all of its keys; the leaf being filled ends before it. A caller that read the
  // leaf passes its last key, which the keys added next are then checked against.
  Status AddExistingLeaf(std::string_view first_key, DevPtr where, std::string_view last_key = {});
  // What the kept leaves hold, for the tree's description: their statistics (`kept`: entries
  // and the classes of entries, modulo 2^64: a class may be "negative" after the size
  // thresholds changed, and Finish floors the tree's sums at 0), the oldest tree of their lineage,
  // and either the older tree's bloom filter (its blocks) and how to extend it
  // (BloomBuilder::FinishOver), or no filter: the caller then added every kept key with
  // AddKeptKeyHash.
  void InheritFromKeptLeaves(const LevelDesc& kept, uint32_t first_tree_id, std::string filter,
                             const BloomExtension& extension);
  // Puts a kept leaf's key into the new bloom filter (built from every key again).
  void AddKeptKeyHash(uint64_t hash) { bloom_.AddHash(hash); }
  // Whether the tree gets a bloom filter.
  bool has_bloom() const { return shape_.bloom_bits_per_key != 0; }
  // Entries added by Add.
  uint64_t added_entries() const { return entries_; }
  // Whether a leaf is being filled (an existing leaf added now would end it early).
  bool leaf_open() const { return !leaf_.empty(); }
  bool empty() const { return entries_ == 0 && kept_segments_.empty(); }
  // Writes the rest (index layers, bloom filter) and describes the tree.
  Status Finish(LevelDesc* desc);
  // The index segments of older trees whose leaves the tree uses, with how many of them each
  // holds: the tree takes them over when it is installed.
  const std::map<uint32_t, uint32_t>& kept_segments() const { return kept_segments_; }

 private:
  struct Pivot {
    std::string key;
    DevPtr node;
  };
  // Reserves the next node slot in the current index segment.
  Status NextNodeSlot(DevPtr* where, char** dst);
  Status FlushLeaf();
  void Account(const LeafEntry& e);
  Status BuildIndexLayers(DevPtr* root, uint32_t* height);
  Status WriteBloom(LevelDesc* desc);
  Status FlushSegment();

  TreeShape shape_;
  SegmentSink* sink_;
  uint32_t tree_id_;
  uint32_t first_tree_id_;  // the oldest tree of a kept leaf (tree_id_ if none)
  NodeBuilder leaf_;
  std::string first_key_;  // of the leaf being filled
  std::string last_key_;
  std::vector<Pivot> pivots_;
  BloomBuilder bloom_;
  std::string segment_buf_;
  uint32_t segment_ = 0;
  uint32_t segment_pos_ = 0;
  uint64_t entries_ = 0;  // added by Add
  std::map<uint32_t, uint32_t> kept_segments_;
  LevelDesc kept_{};         // statistics of the kept leaves
  std::string base_filter_;  // the older tree's filter blocks (empty: none inherited)
  BloomExtension extension_{};
  LevelDesc stats_{};
};

// What a reader needs besides the tree: the device and the segment table to check pointers.
struct TreeContext {
  const Device* device;
  const SegmentInfo* segments;
  uint64_t max_segments;
  uint32_t node_size;
  uint32_t segment_size;
  bool verify_crc;  // false: never verify node checksums
  // The nodes this process already verified, whose checksums are then skipped (verify_crc
  // still on). nullptr: verify every node on every read, for callers that must not trust what
  // an earlier read saw (Verify, and compactions, which persist what they read).
  NodeCheckCache* checked_nodes;

  // Validates that `p` may hold a node of the tree `desc` describes and opens it. Bounds,
  // ownership, magic, sizes and tree id are checked on every call; the checksum once per
  // process if checked_nodes.
  Status OpenNode(DevPtr p, const LevelDesc& desc, NodeView* node) const;
};

// The bytes an entry adds to its level's LevelDesc::bytes: its key and its value wherever the
// value is stored (a tombstone: its key alone).
uint64_t EntryBytes(const LeafEntry& e);
// Counts an entry into a level's statistics: entries, bytes and its size class.
void AccountEntry(const TreeShape& shape, const LeafEntry& e, LevelDesc* stats);

// An estimate of the bytes (as LevelDesc::bytes counts them) of the tree's entries in
// [start, end), from a few descents of O(height) node reads each: those to start and end give
// how many leaves the range spans, and the range's entries in the leaves they reach and in a
// few leaves between give how many bytes such a leaf holds (a range of few leaves is read
// whole). Corruption if a node on the way is damaged.
Status TreeRangeBytes(const TreeContext& ctx, const LevelDesc& desc, std::string_view start,
                      std::string_view end, double* bytes);

// Tests the level's bloom filter; true when the key may be present (also when the filter cannot
// be read where the descriptor and its directory say).
bool TreeMayContain(const TreeContext& ctx, const LevelDesc& desc, uint64_t hash);
// Checks that the descriptor's bloom directory and the segments it lists are the tree's own, as
// TreeBuilder wrote them; Corruption otherwise (Verify's check of the filter's structure).
Status CheckBloomFilter(const TreeContext& ctx, const LevelDesc& desc);

// The leaf a lookup in one tree ended at, with the range of keys a descent routes to it (its
// parent's separators around it; open-ended at the tree's right edge, or everything if the
// root is the leaf): a later key inside that range can only be in this leaf, so its lookup
// skips the descent. Views into the device mapping, valid while the tree is installed (its
// owner forgets them when the version changes).
struct LeafFinger {
  bool valid = false;
  uint64_t last_used = 0;  // its owner's clock, for choosing which finger to move
  NodeView leaf;
  bool has_low = false, has_high = false;
  std::string_view low, high;  // the range: [low, high)
};

// Point lookup of an internal key. The entry's views point into the device mapping. With a
// finger, a key inside its leaf's range is looked up there alone, and a descent remembers the
// leaf it reaches.
Status TreeGet(const TreeContext& ctx, const LevelDesc& desc, std::string_view ikey, bool* found,
               LeafEntry* entry, LeafFinger* finger = nullptr);
// Whether a descent for `ikey` would end at the finger's leaf.
bool FingerCovers(const LeafFinger& finger, std::string_view ikey);

// Ordered iteration over one tree.
class TreeIterator {
 public:
  TreeIterator(const TreeContext& ctx, const LevelDesc& desc) : ctx_(ctx), desc_(desc) {}
  void SeekToFirst() { Seek(std::string_view()); }
  void Seek(std::string_view target);
  void Next();
  bool Valid() const { return valid_; }
  const LeafEntry& entry() const { return entry_; }
  const Status& status() const { return status_; }

 private:
  struct Frame {
    NodeView node;
    int index;
  };
  // Pushes frames down to a leaf starting at index 0, from the node at p of `height`.
  void DescendLeftmost(DevPtr p, uint32_t height);
  void LoadEntry();  // decodes the entry under the cursor or moves on
  void Fail(const Status& s);

  TreeContext ctx_;
  LevelDesc desc_;
  std::vector<Frame> path_;
  LeafEntry entry_{};
  bool valid_ = false;
  Status status_;
};

}  // namespace slipstream::engine
