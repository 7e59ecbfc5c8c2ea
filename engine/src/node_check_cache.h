// NodeCheckCache: which B+-tree nodes this process has already verified the checksum of, so
// that a node's crc32c is computed the first time the process reads it, not on every read.
//
// The device is a memory mapping, so there is no hook when a page enters memory; instead each
// process (each EngineImpl) remembers, per index segment, the tree the segment belonged to when
// its nodes were checked and one bit per node slot. A tree's nodes are written once (by a
// compaction or an import) and never change while the tree is reachable, and a segment is given
// to another tree, which always has a larger id, only after every reader that could reach the
// old tree is gone (the epoch pins); so (segment, owner tree, node slot) names immutable bytes,
// and a bit set for one owner must be forgotten when the segment shows up with another owner.
//
// The trade-off: bytes that change in memory after this process checked them (a stray write,
// a bit flip in the page cache, a file edited behind the engine's back) are no longer noticed
// by this process; another process, a fresh attachment, or Engine::Verify still notices them.
//
// Memory: per segment one 8-byte owner word and one bit per node slot rounded up to 64-bit
// words, reserved for max_device_size up front but left untouched (anonymous mapping) until a
// segment is first marked. With the defaults (2 MiB segments, 8 KiB nodes: 256 slots, 40
// bytes a segment) that is 20 KiB per GiB of device, 5 MiB reserved for the default 256 GiB;
// at worst (1 KiB nodes) 136 KiB per GiB. Resident is only what segments read so far touched.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace slipstream::engine {

class NodeCheckCache {
 public:
  NodeCheckCache() = default;
  ~NodeCheckCache();
  NodeCheckCache(const NodeCheckCache&) = delete;
  NodeCheckCache& operator=(const NodeCheckCache&) = delete;

  // Reserves room for `segments` segments of `nodes_per_segment` node slots; once, before any
  // other call. False if the memory cannot be reserved: the cache then stays empty and every
  // node is checked on every read, as without a cache.
  bool Init(uint64_t segments, uint32_t nodes_per_segment);

  // Whether this process checked node slot `node` of `segment` while the segment belonged to
  // `tree`. Lock-free: two atomic loads.
  bool Checked(uint32_t segment, uint32_t tree, uint32_t node) const {
    if (words_ == nullptr || segment >= segments_ || node >= nodes_per_segment_) return false;
    uint64_t* base = words_ + uint64_t(segment) * stride_;
    // Acquire: pairs with MarkChecked's release of a new owner, so the bits read next are no
    // older than the reset that came with it.
    if (std::atomic_ref<uint64_t>(base[0]).load(std::memory_order_acquire) != tree) return false;
    uint64_t bits = std::atomic_ref<uint64_t>(base[1 + node / 64]).load(std::memory_order_relaxed);
    return (bits >> (node % 64)) & 1;
  }

  // Records that node slot `node` of `segment`, owned by `tree`, passed its checksum; a segment
  // last seen with another (older) owner is reset first, being reused.
  void MarkChecked(uint32_t segment, uint32_t tree, uint32_t node);

  // The bytes Init reserves for a device of `segments` segments.
  static uint64_t BytesFor(uint64_t segments, uint32_t nodes_per_segment) {
    return segments * WordsPerSegment(nodes_per_segment) * sizeof(uint64_t);
  }

 private:
  // The owner word and the bit words of one segment.
  static uint64_t WordsPerSegment(uint32_t nodes_per_segment) {
    return 1 + (uint64_t(nodes_per_segment) + 63) / 64;
  }

  // Plain words, accessed only through std::atomic_ref: an anonymous mapping reads as zeroes
  // without being touched, which an array of std::atomic (constructed element by element)
  // would not allow.
  uint64_t* words_ = nullptr;
  size_t bytes_ = 0;
  uint64_t segments_ = 0;
  uint32_t nodes_per_segment_ = 0;
  uint64_t stride_ = 0;  // words per segment
};

}  // namespace slipstream::engine
