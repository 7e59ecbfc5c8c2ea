// RowCache: the newest values of keys read lately, kept in the arena for every process, so that
// a point read of a key read before costs one bucket probe and a copy instead of memtable
// probes, a B+-tree descent per level and a log read (docs/engine.md, "The row cache").
//
// Layout: a header, an array of buckets (two cache lines each: a version and 15 slots) and a ring
// of entries. An entry (its absolute ring position, the epoch it was read in, the internal key
// and the value) is written once where the ring's head was, and the ring overwrites its oldest
// entries as the head goes round. A slot names an entry by a 16-bit tag of the key's hash and
// the entry's position. Nothing ever moves: a reader copies an entry, then checks that the head
// has not come round over it meanwhile and that the bucket did not change.
//
// Coherence: the bucket's version is a seqlock. Installing a slot and invalidating a key both
// lock the bucket (odd version) and leave it one version later. A read takes a ticket (the
// bucket's version and the epoch) before it reads the engine, and installs what it read only
// if the bucket is still at that version; a writer invalidates the key's bucket after its write
// is published. So a value read before a write was published is never installed after the
// write's invalidation, and a hit never returns a value older than a write that had returned
// before the read began. Dropping a keyspace or importing levels moves the epoch on, which
// invalidates every entry at once.
//
// The zeroed region is a valid empty cache (the arena is zeroed before the first open), so
// nothing formats it and pages no entry reached stay untouched.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace slipstream::engine {

struct RowCacheStats {
  uint64_t hits = 0, misses = 0, installs = 0;
};

class RowCache {
 public:
  // What a lookup saw, for the install that may follow it.
  struct Ticket {
    uint64_t bucket = 0;
    uint64_t version = 1;  // odd: no install
    uint64_t epoch = 0;
  };

  // Values larger than this are never cached (they would flush the ring).
  static constexpr size_t kMaxValueSize = 16 << 10;

  // Arena bytes for a cache of `bytes` (0: none); the region starts page aligned.
  static size_t RegionBytes(uint64_t bytes);

  // Attaches to the region at `base` of RegionBytes(bytes) bytes (nullptr or 0: no cache, every
  // call a miss or a no-op).
  void Attach(char* base, uint64_t bytes);

  bool enabled() const { return ring_ != nullptr; }

  // True and *value set to the cached value of internal key `ikey`; false on a miss, *ticket
  // then allows Install after a read of the engine.
  bool Lookup(std::string_view ikey, std::string* value, Ticket* ticket);

  // Caches `value` as ikey's newest, unless an invalidation reached its bucket since `ticket`.
  void Install(std::string_view ikey, std::string_view value, const Ticket& ticket);

  // Forgets ikey's entry; called after a write of ikey is published.
  void Invalidate(std::string_view ikey);

  // Forgets every entry (a keyspace dropped, levels imported).
  void InvalidateAll();

  RowCacheStats Stats() const;

 private:
  struct Header;
  struct Bucket;

  bool ReadEntry(uint64_t slot, std::string_view ikey, uint64_t epoch, std::string* value) const;
  uint64_t Reserve(uint64_t size);
  void LockBucket(Bucket* bucket, uint64_t* version);
  void Count(int counter, uint64_t stripe);

  Header* header_ = nullptr;
  Bucket* buckets_ = nullptr;
  uint64_t bucket_mask_ = 0;
  char* ring_ = nullptr;
  uint64_t ring_size_ = 0;
};

}  // namespace slipstream::engine
