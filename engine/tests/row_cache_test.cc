// The row cache: on its own (hits, invalidations, tickets, the ring going round, tag collisions)
// and in the engine, where no read may return a value older than a write that returned before
// the read began, with writers and readers racing on the same keys.
#include "row_cache.h"

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

namespace slipstream::engine::test {
namespace {

// A zeroed region for a cache of `bytes`, as the arena gives one.
class Region {
 public:
  explicit Region(uint64_t bytes) : bytes_(RowCache::RegionBytes(bytes)) {
    memory_.reset(new char[bytes_ + 64]());
    cache_.Attach(memory_.get(), bytes);
  }
  RowCache& cache() { return cache_; }

 private:
  size_t bytes_;
  std::unique_ptr<char[]> memory_;
  RowCache cache_;
};

std::string Key(int i) {
  return "key-" + std::to_string(i);
}

// Looks `key` up, and on a miss installs `value` with the lookup's ticket.
void Fill(RowCache& cache, const std::string& key, const std::string& value) {
  std::string got;
  RowCache::Ticket ticket;
  if (!cache.Lookup(key, &got, &ticket)) cache.Install(key, value, ticket);
}

TEST(RowCache, MissInstallHitInvalidate) {
  Region region(1 << 20);
  RowCache& cache = region.cache();
  ASSERT_TRUE(cache.enabled());
  std::string value;
  RowCache::Ticket ticket;
  EXPECT_FALSE(cache.Lookup("a", &value, &ticket));
  cache.Install("a", "first", ticket);
  ASSERT_TRUE(cache.Lookup("a", &value, &ticket));
  EXPECT_EQ(value, "first");
  EXPECT_FALSE(cache.Lookup("b", &value, &ticket));  // another key is not "a"
  cache.Invalidate("a");
  EXPECT_FALSE(cache.Lookup("a", &value, &ticket));
  cache.Install("a", "", ticket);  // an empty value is a value
  ASSERT_TRUE(cache.Lookup("a", &value, &ticket));
  EXPECT_EQ(value, "");
  RowCacheStats stats = cache.Stats();
  EXPECT_EQ(stats.hits, 2u);
  EXPECT_EQ(stats.misses, 3u);
  EXPECT_EQ(stats.installs, 2u);
}

// An invalidation between a lookup and its install (a write published while the reader read
// the engine) makes the install a no-op, even for a key of the bucket that had no entry.
TEST(RowCache, InstallAfterAnInvalidationIsRefused) {
  Region region(1 << 20);
  RowCache& cache = region.cache();
  std::string value;
  RowCache::Ticket ticket;
  EXPECT_FALSE(cache.Lookup("k", &value, &ticket));
  cache.Invalidate("k");
  cache.Install("k", "old", ticket);
  EXPECT_FALSE(cache.Lookup("k", &value, &ticket));
  cache.Install("k", "new", ticket);
  ASSERT_TRUE(cache.Lookup("k", &value, &ticket));
  EXPECT_EQ(value, "new");
  // InvalidateAll between a lookup and its install refuses it too, and forgets every entry.
  RowCache::Ticket other;
  EXPECT_FALSE(cache.Lookup("j", &value, &other));
  cache.InvalidateAll();
  cache.Install("j", "stale", other);
  EXPECT_FALSE(cache.Lookup("j", &value, &other));
  EXPECT_FALSE(cache.Lookup("k", &value, &ticket));
}

// Values past kMaxValueSize are not kept; a size of 0 (or below 64 kB) is no cache at all.
TEST(RowCache, LimitsAndNoCache) {
  Region region(1 << 20);
  std::string big(RowCache::kMaxValueSize + 1, 'x'), value;
  Fill(region.cache(), "big", big);
  RowCache::Ticket ticket;
  EXPECT_FALSE(region.cache().Lookup("big", &value, &ticket));
  std::string most(RowCache::kMaxValueSize, 'y');
  Fill(region.cache(), "most", most);
  ASSERT_TRUE(region.cache().Lookup("most", &value, &ticket));
  EXPECT_EQ(value, most);

  EXPECT_EQ(RowCache::RegionBytes(0), 0u);
  EXPECT_EQ(RowCache::RegionBytes(1000), 0u);
  Region none(0);
  EXPECT_FALSE(none.cache().enabled());
  Fill(none.cache(), "a", "b");
  EXPECT_FALSE(none.cache().Lookup("a", &value, &ticket));
  none.cache().Invalidate("a");
  none.cache().InvalidateAll();
}

// Many times the ring's size goes through it: every hit returns exactly the value installed
// for its key, the latest keys hit, and the earliest were overwritten and miss.
TEST(RowCache, TheRingGoesRoundWithoutMixingValues) {
  Region region(256 << 10);
  RowCache& cache = region.cache();
  const int kKeys = 20000;  // about 10 ring lengths of 100-250-byte entries
  for (int i = 0; i < kKeys; i++) Fill(cache, Key(i), Value(60 + i % 150, i));
  int hits = 0;
  for (int i = 0; i < kKeys; i++) {
    std::string value;
    RowCache::Ticket ticket;
    if (cache.Lookup(Key(i), &value, &ticket)) {
      hits++;
      ASSERT_EQ(value, Value(60 + i % 150, i)) << i;
    }
  }
  EXPECT_GT(hits, 100);
  EXPECT_LT(hits, kKeys / 4);
  std::string value;
  RowCache::Ticket ticket;
  EXPECT_FALSE(cache.Lookup(Key(0), &value, &ticket));
  EXPECT_TRUE(cache.Lookup(Key(kKeys - 1), &value, &ticket));
}

// Keys that share a bucket (the smallest cache has 16 buckets of 15 slots) never answer for each
// other, and evict each other's slots as they come and go.
TEST(RowCache, KeysSharingABucketStayApart) {
  Region region(64 << 10);
  RowCache& cache = region.cache();
  for (int round = 0; round < 20; round++) {
    for (int i = 0; i < 90; i++) {
      std::string value;
      RowCache::Ticket ticket;
      if (cache.Lookup(Key(i), &value, &ticket)) {
        ASSERT_EQ(value, "v" + std::to_string(i)) << i;
      } else {
        cache.Install(Key(i), "v" + std::to_string(i), ticket);
      }
      if (i % 7 == 0) cache.Invalidate(Key(i / 2));
    }
  }
  EXPECT_GT(cache.Stats().hits, 0u);
}

// A 12-byte internal key as the table AM's rows have: a keyspace, then a big-endian row id.
std::string RowKey(uint32_t keyspace, uint64_t rowid) {
  std::string key(12, '\0');
  std::memcpy(key.data(), &keyspace, 4);
  for (int i = 0; i < 8; i++) key[4 + i] = char(rowid >> (56 - 8 * i));
  return key;
}

// The short-key hash groups 8 consecutive row ids in one bucket; their tags must still differ,
// or each install would take the slot of the one before and only the last would hit.
TEST(RowCache, ConsecutiveRowKeysAllStayCached) {
  Region region(4 << 20);
  RowCache& cache = region.cache();
  // Group by group, so that only the group's own keys compete for its bucket's 15 slots (an
  // install evicts the oldest entry, never one of the 7 installed just before).
  for (uint64_t group = 0; group < 64; group++) {
    for (uint64_t row = group * 8; row < group * 8 + 8; row++) {
      Fill(cache, RowKey(7, row), "row" + std::to_string(row));
    }
    for (uint64_t row = group * 8; row < group * 8 + 8; row++) {
      std::string value;
      RowCache::Ticket ticket;
      ASSERT_TRUE(cache.Lookup(RowKey(7, row), &value, &ticket)) << row;
      EXPECT_EQ(value, "row" + std::to_string(row));
      // Another keyspace's row of the same id is another key.
      EXPECT_FALSE(cache.Lookup(RowKey(8, row), &value, &ticket)) << row;
    }
  }
}

class RowCacheEngine : public ::testing::Test {
 protected:
  void Open(uint64_t row_cache_size) {
    options_ = SmallOptions(dir_.path());
    options_.row_cache_size = row_cache_size;
    arena_ = std::make_unique<Arena>(Engine::ArenaSize(options_));
    ASSERT_TRUE(Engine::Open(options_, arena_->base(), arena_->size(), &engine_).ok());
  }
  std::string Get(KeyspaceId ks, const std::string& key) {
    std::string value;
    Status s = engine_->Get(ks, key, &value);
    return s.ok() ? value : s.IsNotFound() ? "<none>" : "<error " + s.ToString() + ">";
  }

  TempDir dir_;
  Options options_;
  std::unique_ptr<Arena> arena_;
  std::unique_ptr<Engine> engine_;
};

// Reads after puts, deletes and patches see them; a dropped keyspace's id, reused, shows none
// of the dropped keyspace's cached values.
TEST_F(RowCacheEngine, ReadsSeeEveryWrite) {
  Open(1 << 20);
  KeyspaceId ks;
  ASSERT_TRUE(engine_->CreateKeyspace(1, &ks).ok());
  ASSERT_TRUE(engine_->Put(ks, "r", "one").ok());
  EXPECT_EQ(Get(ks, "r"), "one");
  EXPECT_EQ(Get(ks, "r"), "one");
  EXPECT_GE(engine_->GetStats().row_cache_hits, 1u);
  ASSERT_TRUE(engine_->Put(ks, "r", "two").ok());
  EXPECT_EQ(Get(ks, "r"), "two");
  WriteBatch batch;
  batch.Put(ks, "r", "three");
  batch.Put(ks, "s", "other");
  ASSERT_TRUE(engine_->Write(batch).ok());
  EXPECT_EQ(Get(ks, "r"), "three");
  ASSERT_TRUE(engine_->Delete(ks, "r").ok());
  EXPECT_EQ(Get(ks, "r"), "<none>");
  EXPECT_EQ(Get(ks, "r"), "<none>");
  // A large value, then a header change of it written as a patch of its stored record.
  std::string large = Value(3000, 9);
  ASSERT_TRUE(engine_->Put(ks, "big", large).ok());
  EXPECT_EQ(Get(ks, "big"), large);
  std::string changed = large;
  changed.replace(0, 4, "HEAD");
  WriteBatch patch;
  patch.PutChangedPrefix(ks, "big", changed, 4);
  ASSERT_TRUE(engine_->Write(patch).ok());
  EXPECT_EQ(Get(ks, "big"), changed);
  EXPECT_EQ(Get(ks, "s"), "other");
  ASSERT_TRUE(engine_->DropKeyspace(ks).ok());
  KeyspaceId again;
  ASSERT_TRUE(engine_->CreateKeyspace(2, &again).ok());
  ASSERT_TRUE(engine_->Put(again, "t", "new table").ok());
  EXPECT_EQ(Get(again, "s"), "<none>");
  EXPECT_EQ(Get(again, "big"), "<none>");
}

// A read past the memtables answers from the levels, which may hold an older version than a
// memtable does: that answer is not the key's newest and must not be cached as it. A key no
// memtable holds is cached from such a read.
TEST_F(RowCacheEngine, ReadsPastTheMemtablesInstallOnlyTheNewest) {
  Open(1 << 20);
  KeyspaceId ks;
  ASSERT_TRUE(engine_->CreateKeyspace(1, &ks).ok());
  ASSERT_TRUE(engine_->Put(ks, "r", "in a level").ok());
  ASSERT_TRUE(engine_->CompactAll().ok());
  ASSERT_TRUE(engine_->Put(ks, "r", "in the memtable").ok());
  auto reader = engine_->NewPointReader();
  std::string value;
  ASSERT_TRUE(reader->GetPastMemtables(ks, "r", &value).ok());
  EXPECT_EQ(value, "in a level");
  EXPECT_EQ(Get(ks, "r"), "in the memtable");
  EXPECT_EQ(Get(ks, "r"), "in the memtable");  // the second from the cache
  // Once cached, the newest answers a read past the memtables too.
  ASSERT_TRUE(reader->GetPastMemtables(ks, "r", &value).ok());
  EXPECT_EQ(value, "in the memtable");

  ASSERT_TRUE(engine_->Put(ks, "q", "quiet").ok());
  ASSERT_TRUE(engine_->CompactAll().ok());
  uint64_t installs = engine_->GetStats().row_cache_installs;
  ASSERT_TRUE(reader->GetPastMemtables(ks, "q", &value).ok());
  EXPECT_EQ(value, "quiet");
  EXPECT_EQ(engine_->GetStats().row_cache_installs, installs + 1);
  uint64_t hits = engine_->GetStats().row_cache_hits;
  EXPECT_EQ(Get(ks, "q"), "quiet");
  EXPECT_EQ(engine_->GetStats().row_cache_hits, hits + 1);
}

// With the cache off, reads are as before.
TEST_F(RowCacheEngine, Off) {
  Open(0);
  KeyspaceId ks;
  ASSERT_TRUE(engine_->CreateKeyspace(1, &ks).ok());
  ASSERT_TRUE(engine_->Put(ks, "r", "one").ok());
  EXPECT_EQ(Get(ks, "r"), "one");
  ASSERT_TRUE(engine_->Put(ks, "r", "two").ok());
  EXPECT_EQ(Get(ks, "r"), "two");
  EXPECT_EQ(engine_->GetStats().row_cache_hits, 0u);
}

// Writers put ever larger numbers under a few keys and publish each number once its put has
// returned; readers race them. A read that begins after a put returned must see that put or a
// later one, whether the cache, the memtable or a level answered. A small cache and flushes
// to the levels keep every path busy.
TEST_F(RowCacheEngine, NoReadIsOlderThanAWriteThatReturnedBeforeIt) {
  Open(64 << 10);
  KeyspaceId ks;
  ASSERT_TRUE(engine_->CreateKeyspace(1, &ks).ok());
  constexpr int kKeys = 8;
  constexpr int kWrites = 20000;
  std::atomic<uint64_t> returned[kKeys];
  for (int k = 0; k < kKeys; k++) {
    returned[k] = 0;
    ASSERT_TRUE(engine_->Put(ks, Key(k), "0").ok());
  }
  std::atomic<bool> done{false};
  std::atomic<int> failures{0};
  std::thread writer([&] {
    std::string pad = Value(200, 1);
    for (int n = 1; n <= kWrites; n++) {
      int k = n % kKeys;
      // Every fourth value is large, so its reads go through the large log.
      std::string value = std::to_string(n) + "|" + (n % 4 == 0 ? Value(1500, n) : pad);
      if (!engine_->Put(ks, Key(k), value).ok()) failures++;
      returned[k].store(n, std::memory_order_release);
    }
    done = true;
  });
  auto reader = [&] {
    std::string value;
    while (!done.load()) {
      for (int k = 0; k < kKeys; k++) {
        uint64_t floor = returned[k].load(std::memory_order_acquire);
        if (!engine_->Get(ks, Key(k), &value).ok()) {
          failures++;
          continue;
        }
        uint64_t seen = std::stoull(value.substr(0, value.find('|')));
        if (seen < floor) {
          ADD_FAILURE() << "key " << k << " read " << seen << " after " << floor << " returned";
          failures++;
        }
      }
    }
  };
  std::thread r1(reader), r2(reader);
  writer.join();
  r1.join();
  r2.join();
  EXPECT_EQ(failures.load(), 0);
  Stats stats = engine_->GetStats();
  EXPECT_GT(stats.row_cache_hits, 0u);
  EXPECT_GT(stats.row_cache_installs, 0u);
}

}  // namespace
}  // namespace slipstream::engine::test
