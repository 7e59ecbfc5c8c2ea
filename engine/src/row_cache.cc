// RowCache: see row_cache.h.
#include "row_cache.h"

#include <sched.h>

#include <cstring>

#include "coding.h"

namespace slipstream::engine {

namespace {

constexpr size_t kPage = 4096;
constexpr int kSlots = 15;
constexpr int kStripes = 16;
constexpr uint64_t kPositionBits = 48;
constexpr uint64_t kPositionMask = (uint64_t(1) << kPositionBits) - 1;
// The smallest cache worth having: below it RegionBytes gives 0 and the cache is off.
constexpr uint64_t kMinBytes = 64 << 10;

enum Counter { kHits, kMisses, kInstalls, kCounters };

// An entry in the ring, followed by the key and the value, padded to 8 bytes.
struct EntryHeader {
  uint64_t position;  // absolute: where the ring's head was when it was reserved
  uint64_t epoch;
  uint32_t key_size;
  uint32_t value_size;
};

size_t AlignUp(size_t n, size_t to) {
  return (n + to - 1) / to * to;
}

uint64_t EntrySize(size_t key_size, size_t value_size) {
  return AlignUp(sizeof(EntryHeader) + key_size + value_size, 8);
}

// A slot word: the tag in the top 16 bits, the position in 8-byte units below; 0 is empty.
uint64_t SlotWord(uint16_t tag, uint64_t position) {
  return (uint64_t(tag) << kPositionBits) | ((position / 8) & kPositionMask);
}

uint16_t TagOfSlot(uint64_t word) {
  return uint16_t(word >> kPositionBits);
}

// A 64-bit finaliser (MurmurHash3's), to spread a hash with one more byte mixed in.
uint64_t Mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb93fe53a85ebull;
  return h ^ (h >> 33);
}

// Where a key is looked for. Keys equal but for the low 3 bits of their last byte (8
// consecutive row ids of a table) share a bucket, so an index range scan reads a bucket line
// per 8 rows instead of one per row (the bucket-line miss was 88% of a lookup's samples); the
// tag still tells them apart.
struct Place {
  uint64_t bucket_hash;
  uint16_t tag;  // never 0, so that no slot word of a real entry is 0
};

// Keys of 8 to 16 bytes (a row key, 12 with its keyspace, is every hot one) are hashed from
// two overlapping 8-byte loads with one finaliser: the general path below costs four times the
// instructions, a tenth of a cached read. The tag is the low 3 bits of the last byte under 13
// bits of the bucket's hash: the 8 keys a bucket line groups never share one.
Place PlaceOfShort(std::string_view ikey) {
  const uint64_t head = DecodeFixed64(ikey.data());
  // Little-endian: the key's last byte is the top byte of the last 8.
  const uint64_t tail = DecodeFixed64(ikey.data() + ikey.size() - 8);
  const uint64_t last = tail >> 56;
  const uint64_t grouped = tail & ~(uint64_t(7) << 56);
  uint64_t h = Mix(head * 0x9e3779b97f4a7c15ull ^ (grouped + ikey.size()) * 0xc6a4a7935bd1e995ull);
  uint16_t high = uint16_t(h >> 51);  // 13 bits, never 0 so that no tag is
  if (high == 0) high = 1;
  return {h, uint16_t((high << 3) | (last & 7))};
}

Place PlaceOf(std::string_view ikey) {
  if (ikey.size() >= 8 && ikey.size() <= 16) return PlaceOfShort(ikey);
  if (ikey.empty()) return {Mix(HashKey(ikey)), 1};
  uint64_t prefix = HashKey(ikey.substr(0, ikey.size() - 1));
  uint8_t last = uint8_t(ikey.back());
  return {Mix(prefix ^ (last & 0xf8)),
          uint16_t(uint16_t(Mix(prefix ^ (uint64_t(last) << 56)) >> kPositionBits) | 1)};
}

// The absolute position a slot's 48 bits stand for: the latest one at or before `head`.
uint64_t PositionOfSlot(uint64_t word, uint64_t head) {
  uint64_t head_units = head / 8;
  uint64_t behind = (head_units - (word & kPositionMask)) & kPositionMask;
  return (head_units - behind) * 8;
}

void Pause(int spins) {
  if (spins < 64) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  } else {
    sched_yield();  // the holder may have been preempted
  }
}

}  // namespace

struct RowCache::Header {
  alignas(64) std::atomic<uint64_t> head;  // bytes ever reserved in the ring
  alignas(64) std::atomic<uint64_t> epoch;
  struct alignas(64) Stripe {
    std::atomic<uint64_t> counters[kCounters];
  };
  Stripe stripes[kStripes];  // counters spread over lines, so hits on two cores seldom share one
};

struct alignas(128) RowCache::Bucket {
  std::atomic<uint64_t> version;  // even: stable; odd: locked by an install or invalidation
  std::atomic<uint64_t> slots[kSlots];
};

static_assert(sizeof(RowCache::Ticket) == 24);

size_t RowCache::RegionBytes(uint64_t bytes) {
  if (bytes < kMinBytes) return 0;
  return AlignUp(bytes, kPage);
}

void RowCache::Attach(char* base, uint64_t bytes) {
  size_t region = RegionBytes(bytes);
  if (base == nullptr || region == 0) return;
  size_t header = AlignUp(sizeof(Header), kPage);
  // A sixteenth of the rest for buckets (15 slots of 8.5 bytes each for about 136 ring bytes,
  // the entry of a row of some 100 bytes), as a power of two; the rest is ring.
  uint64_t buckets = 1;
  while (buckets * 2 * sizeof(Bucket) <= (region - header) / 16) buckets *= 2;
  header_ = reinterpret_cast<Header*>(base);
  buckets_ = reinterpret_cast<Bucket*>(base + header);
  bucket_mask_ = buckets - 1;
  ring_ = base + header + buckets * sizeof(Bucket);
  ring_size_ = (region - header - buckets * sizeof(Bucket)) / 8 * 8;
}

void RowCache::Count(int counter, uint64_t stripe) {
  header_->stripes[stripe % kStripes].counters[counter].fetch_add(1, std::memory_order_relaxed);
}

bool RowCache::Lookup(std::string_view ikey, std::string* value, Ticket* ticket) {
  if (!enabled()) return false;
  Place place = PlaceOf(ikey);
  uint16_t tag = place.tag;
  Bucket& bucket = buckets_[place.bucket_hash & bucket_mask_];
  ticket->bucket = place.bucket_hash & bucket_mask_;
  ticket->epoch = header_->epoch.load(std::memory_order_acquire);
  uint64_t version = bucket.version.load(std::memory_order_acquire);
  ticket->version = version;
  if ((version & 1) == 0) {
    for (int i = 0; i < kSlots; i++) {
      uint64_t word = bucket.slots[i].load(std::memory_order_relaxed);
      if (word == 0 || TagOfSlot(word) != tag) continue;
      if (!ReadEntry(word, ikey, ticket->epoch, value)) break;
      std::atomic_thread_fence(std::memory_order_acquire);
      if (bucket.version.load(std::memory_order_relaxed) != version) break;
      Count(kHits, ticket->bucket);
      return true;
    }
  }
  Count(kMisses, ticket->bucket);
  return false;
}

// Copies the entry `slot` names into *value if it is ikey's, of `epoch`, and intact.
bool RowCache::ReadEntry(uint64_t slot, std::string_view ikey, uint64_t epoch,
                         std::string* value) const {
  uint64_t head = header_->head.load(std::memory_order_acquire);
  uint64_t position = PositionOfSlot(slot, head);
  if (head - position > ring_size_) return false;  // overwritten already
  const char* at = ring_ + position % ring_size_;
  EntryHeader entry;
  std::memcpy(&entry, at, sizeof(entry));
  if (entry.position != position || entry.epoch != epoch || entry.key_size != ikey.size() ||
      entry.value_size > kMaxValueSize ||
      position % ring_size_ + EntrySize(entry.key_size, entry.value_size) > ring_size_) {
    return false;
  }
  if (std::memcmp(at + sizeof(entry), ikey.data(), ikey.size()) != 0) return false;
  value->assign(at + sizeof(entry) + entry.key_size, entry.value_size);
  // The head moves before anyone writes over the entry: if it has not passed the entry's end
  // by a ring's length after the copy, what was copied is what was installed.
  std::atomic_thread_fence(std::memory_order_acquire);
  return header_->head.load(std::memory_order_relaxed) - position <= ring_size_;
}

// Reserves `size` ring bytes that do not wrap round the ring's end; returns their position.
uint64_t RowCache::Reserve(uint64_t size) {
  uint64_t head = header_->head.load(std::memory_order_relaxed);
  while (true) {
    uint64_t start = head;
    uint64_t offset = start % ring_size_;
    if (offset + size > ring_size_) start += ring_size_ - offset;
    if (header_->head.compare_exchange_weak(head, start + size, std::memory_order_acq_rel)) {
      return start;
    }
  }
}

void RowCache::Install(std::string_view ikey, std::string_view value, const Ticket& ticket) {
  if (!enabled() || (ticket.version & 1) != 0 || value.size() > kMaxValueSize) return;
  uint64_t size = EntrySize(ikey.size(), value.size());
  if (size > ring_size_ / 8) return;
  if (header_->epoch.load(std::memory_order_acquire) != ticket.epoch) return;
  Bucket& bucket = buckets_[ticket.bucket];
  // Cheap refusal first: an invalidation since the lookup makes the install pointless.
  if (bucket.version.load(std::memory_order_relaxed) != ticket.version) return;
  uint64_t position = Reserve(size);
  char* at = ring_ + position % ring_size_;
  EntryHeader entry{position, ticket.epoch, uint32_t(ikey.size()), uint32_t(value.size())};
  std::memcpy(at, &entry, sizeof(entry));
  std::memcpy(at + sizeof(entry), ikey.data(), ikey.size());
  std::memcpy(at + sizeof(entry) + ikey.size(), value.data(), value.size());
  uint64_t version = ticket.version;
  if (!bucket.version.compare_exchange_strong(version, version + 1, std::memory_order_acq_rel)) {
    return;  // invalidated meanwhile: the ring bytes are simply left behind
  }
  uint16_t tag = PlaceOf(ikey).tag;
  uint64_t head = header_->head.load(std::memory_order_relaxed);
  // The key's own slot, else an empty one, else the one whose entry is oldest.
  int victim = 0;
  uint64_t victim_age = 0;
  for (int i = 0; i < kSlots; i++) {
    uint64_t word = bucket.slots[i].load(std::memory_order_relaxed);
    if (word != 0 && TagOfSlot(word) == tag) {
      victim = i;
      break;
    }
    uint64_t age = word == 0 ? UINT64_MAX : head - PositionOfSlot(word, head);
    if (age > victim_age) {
      victim = i;
      victim_age = age;
    }
  }
  bucket.slots[victim].store(SlotWord(tag, position), std::memory_order_relaxed);
  bucket.version.store(ticket.version + 2, std::memory_order_release);
  Count(kInstalls, ticket.bucket);
}

// Locks `bucket` (makes its version odd); *version is then the version it had.
void RowCache::LockBucket(Bucket* bucket, uint64_t* version) {
  uint64_t v = bucket->version.load(std::memory_order_relaxed);
  for (int spins = 0;; spins++) {
    if ((v & 1) == 0 &&
        bucket->version.compare_exchange_weak(v, v + 1, std::memory_order_acquire)) {
      *version = v;
      return;
    }
    Pause(spins);
    v = bucket->version.load(std::memory_order_relaxed);
  }
}

void RowCache::Invalidate(std::string_view ikey) {
  if (!enabled()) return;
  Place place = PlaceOf(ikey);
  uint16_t tag = place.tag;
  Bucket* bucket = &buckets_[place.bucket_hash & bucket_mask_];
  uint64_t version;
  // Even with no slot of the key, the version moves on: a lookup of it that is reading the
  // engine now must not install what it read.
  LockBucket(bucket, &version);
  for (int i = 0; i < kSlots; i++) {
    uint64_t word = bucket->slots[i].load(std::memory_order_relaxed);
    if (word != 0 && TagOfSlot(word) == tag) bucket->slots[i].store(0, std::memory_order_relaxed);
  }
  bucket->version.store(version + 2, std::memory_order_release);
}

void RowCache::InvalidateAll() {
  if (enabled()) header_->epoch.fetch_add(1, std::memory_order_acq_rel);
}

RowCacheStats RowCache::Stats() const {
  RowCacheStats stats;
  if (!enabled()) return stats;
  for (const Header::Stripe& stripe : header_->stripes) {
    stats.hits += stripe.counters[kHits].load(std::memory_order_relaxed);
    stats.misses += stripe.counters[kMisses].load(std::memory_order_relaxed);
    stats.installs += stripe.counters[kInstalls].load(std::memory_order_relaxed);
  }
  return stats;
}

}  // namespace slipstream::engine
