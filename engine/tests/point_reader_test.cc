// PointReader: reads that start where the last one ended must give Engine::Get's answers, for
// every access pattern, across flushes and compactions, and while writers insert around the
// remembered positions.
#include <algorithm>
#include <atomic>
#include <map>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "engine_impl.h"
#include "test_util.h"

namespace slipstream::engine::test {
namespace {

// A fixed-width key, so that numeric order is key order.
std::string KeyOf(uint64_t n) {
  char buf[24];
  snprintf(buf, sizeof(buf), "row%012llu", static_cast<unsigned long long>(n));
  return buf;
}

// Reads `key` through the reader and through Get, and checks both against the model.
void ExpectSameAnswer(TestEngine& t, PointReader* reader, KeyspaceId ks, const std::string& key,
                      const std::map<std::string, std::string>& model) {
  std::string near_value, get_value;
  Status near_status = reader->Get(ks, key, &near_value);
  Status get_status = t->Get(ks, key, &get_value);
  auto it = model.find(key);
  if (it == model.end()) {
    ASSERT_TRUE(near_status.IsNotFound()) << key << ": " << near_status.ToString();
    ASSERT_TRUE(get_status.IsNotFound()) << key << ": " << get_status.ToString();
  } else {
    ASSERT_TRUE(near_status.ok()) << key << ": " << near_status.ToString();
    ASSERT_TRUE(get_status.ok()) << key << ": " << get_status.ToString();
    ASSERT_EQ(near_value, it->second) << key;
    ASSERT_EQ(get_value, it->second) << key;
  }
}

// A writer inserts into the memtable before it publishes the LSN. An iterator created in
// between shows what was published, so Get and PointReader::Get must too: a read that showed
// the unpublished version, followed by such an iterator, would see the key go back in time.
TEST(PointReader, ReadsSkipAVersionNotYetPublished) {
  TestEngine t;
  auto* impl = static_cast<EngineImpl*>(t.engine.get());
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(1, &ks).ok());
  ASSERT_TRUE(t->Put(ks, "row", "old").ok());
  std::unique_ptr<PointReader> reader = t->NewPointReader();
  std::string value;
  ASSERT_TRUE(reader->Get(ks, "row", &value).ok());  // the reader remembers its positions

  auto iterator_value = [&](const std::string& key) -> std::string {
    auto it = t->NewIterator(ks);
    it->Seek(key);
    if (!it->Valid() || it->key() != key) return "(none)";
    return std::string(it->value());
  };
  // A newer version of a key the memtable holds (one write is unpublished at a time: the
  // write mutex).
  Lsn lsn = impl->TEST_InsertUnpublished(ks, "row", "new");
  EXPECT_EQ(iterator_value("row"), "old");
  ASSERT_TRUE(t->Get(ks, "row", &value).ok());
  EXPECT_EQ(value, "old");
  ASSERT_TRUE(reader->Get(ks, "row", &value).ok());
  EXPECT_EQ(value, "old");
  impl->TEST_Publish(lsn);
  ASSERT_TRUE(t->Get(ks, "row", &value).ok());
  EXPECT_EQ(value, "new");
  ASSERT_TRUE(reader->Get(ks, "row", &value).ok());
  EXPECT_EQ(value, "new");
  EXPECT_EQ(iterator_value("row"), "new");

  // A key's first version.
  lsn = impl->TEST_InsertUnpublished(ks, "fresh", "first");
  EXPECT_EQ(iterator_value("fresh"), "(none)");
  EXPECT_TRUE(t->Get(ks, "fresh", &value).IsNotFound());
  EXPECT_TRUE(reader->Get(ks, "fresh", &value).IsNotFound());
  impl->TEST_Publish(lsn);
  ASSERT_TRUE(reader->Get(ks, "fresh", &value).ok());
  EXPECT_EQ(value, "first");
  EXPECT_EQ(iterator_value("fresh"), "first");
}

// Ascending and descending runs, strides, repeats and random jumps over two keyspaces, with
// overwrites, deletes, flushes and compactions between them, so that the reader's remembered
// positions outlive versions, point at keys that moved to another level, and are reused for
// keys on either side of them.
TEST(PointReader, AnswersLikeGetForEveryPattern) {
  TestEngine t;
  KeyspaceId spaces[2];
  ASSERT_TRUE(t->CreateKeyspace(1, &spaces[0]).ok());
  ASSERT_TRUE(t->CreateKeyspace(2, &spaces[1]).ok());
  std::map<std::string, std::string> model[2];
  std::unique_ptr<PointReader> reader = t->NewPointReader();
  std::mt19937_64 rng(7);
  const uint64_t kKeys = 6000;
  int version = 0;
  for (int round = 0; round < 40; round++) {
    // Writes: overwrites of every size class, and deletes.
    for (int i = 0; i < 1500; i++) {
      int s = int(rng() % 2);
      std::string key = KeyOf(rng() % kKeys);
      if (rng() % 8 == 0) {
        ASSERT_TRUE(t->Delete(spaces[s], key).ok());
        model[s].erase(key);
      } else {
        size_t size = std::vector<size_t>{8, 20, 300, 1500, 5000}[rng() % 5];
        std::string value = Value(size, ++version);
        ASSERT_TRUE(t->Put(spaces[s], key, value).ok());
        model[s][key] = value;
      }
    }
    if (round % 3 == 0) {
      while (t->DoBackgroundWork()) {
      }
    }
    if (round % 11 == 10) {
      ASSERT_TRUE(t->CompactAll().ok());
    }
    // Reads.
    for (int run = 0; run < 30; run++) {
      int s = int(rng() % 2);
      int64_t at = int64_t(rng() % kKeys);
      int64_t other = int64_t(rng() % kKeys);
      // 250: random keys; 3: two ascending runs in turn (rows and their newer versions).
      int64_t step = std::vector<int64_t>{1, 1, 1, -1, 2, 17, 0, 250, 3, 3}[rng() % 10];
      int length = 1 + int(rng() % 120);
      for (int i = 0; i < length; i++) {
        int64_t n = step == 250 ? int64_t(rng() % kKeys)
                    : step == 3 ? (i % 2 ? other : at) + i / 2
                                : at + i * step;
        if (n < 0 || n >= int64_t(kKeys)) break;
        ExpectSameAnswer(t, reader.get(), spaces[s], KeyOf(uint64_t(n)), model[s]);
      }
    }
  }
  // Keys before, between and after everything stored, and an unknown keyspace.
  std::string value;
  EXPECT_TRUE(reader->Get(spaces[0], "", &value).IsNotFound());
  EXPECT_TRUE(reader->Get(spaces[0], "zzz", &value).IsNotFound());
  EXPECT_TRUE(reader->Get(spaces[1], "row", &value).IsNotFound());
  EXPECT_TRUE(reader->Get(999, KeyOf(1), &value).IsInvalidArgument());
  ASSERT_TRUE(t->Verify().ok());
}

// Two readers of one engine keep their own positions: interleaved scans of distant ranges give
// the same answers as each alone.
TEST(PointReader, ReadersKeepTheirOwnPositions) {
  TestEngine t;
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(3, &ks).ok());
  std::map<std::string, std::string> model;
  for (uint64_t n = 0; n < 4000; n += 2) {
    model[KeyOf(n)] = Value(30, int(n));
    ASSERT_TRUE(t->Put(ks, KeyOf(n), model[KeyOf(n)]).ok());
    if (n == 2000) {
      while (t->DoBackgroundWork()) {
      }
    }
  }
  auto low = t->NewPointReader();
  auto high = t->NewPointReader();
  for (uint64_t i = 0; i < 1500; i++) {
    ExpectSameAnswer(t, low.get(), ks, KeyOf(i), model);
    ExpectSameAnswer(t, high.get(), ks, KeyOf(3999 - i), model);
  }
}

// A writer inserts keys in random order and a background thread flushes and compacts, while a
// reader scans ascending runs: every key written before its read must be found with its value,
// and no read may find a value that was never written. Inserts land right before and after the
// reader's remembered nodes, and versions change under it.
TEST(PointReader, ConcurrentInsertsAndCompactions) {
  TestEngine t;
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(4, &ks).ok());
  const uint64_t kKeys = 40000;
  std::vector<uint64_t> order(kKeys);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(11));
  std::vector<std::atomic<bool>> written(kKeys);
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (uint64_t n : order) {
      ASSERT_TRUE(t->Put(ks, KeyOf(n), Value(16 + n % 400, int(n))).ok());
      written[n].store(true, std::memory_order_release);
    }
    done = true;
  });
  std::thread background([&] {
    while (!done) {
      if (!t->DoBackgroundWork()) std::this_thread::yield();
    }
  });
  auto reader = t->NewPointReader();
  std::mt19937_64 rng(3);
  uint64_t found = 0;
  while (!done || found == 0) {
    uint64_t at = rng() % kKeys;
    for (uint64_t n = at; n < std::min(kKeys, at + 200); n++) {
      bool before = written[n].load(std::memory_order_acquire);
      std::string value;
      Status s = reader->Get(ks, KeyOf(n), &value);
      if (s.ok()) {
        ASSERT_EQ(value, Value(16 + n % 400, int(n))) << n;
        found++;
      } else {
        ASSERT_TRUE(s.IsNotFound()) << s.ToString();
        ASSERT_FALSE(before) << "key " << n << " was written before the read and not found";
      }
    }
  }
  writer.join();
  background.join();
  for (uint64_t n = 0; n < kKeys; n++) {
    std::string value;
    ASSERT_TRUE(reader->Get(ks, KeyOf(n), &value).ok()) << n;
  }
  EXPECT_GT(found, 0u);
}

// While a writer overwrites a few keys with ever higher version numbers, a reader that mixes
// ascending runs with jumps never reads a version older than one it read before.
TEST(PointReader, NeverGoesBackToAnOlderVersion) {
  TestEngine t;
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(5, &ks).ok());
  const uint64_t kKeys = 64;
  auto value_of = [](uint64_t version) {
    char buf[24];
    snprintf(buf, sizeof(buf), "v%020llu", static_cast<unsigned long long>(version));
    return std::string(buf);
  };
  for (uint64_t n = 0; n < kKeys; n++) ASSERT_TRUE(t->Put(ks, KeyOf(n), value_of(0)).ok());
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (uint64_t version = 1; version <= 20000; version++) {
      ASSERT_TRUE(t->Put(ks, KeyOf(version % kKeys), value_of(version)).ok());
    }
    done = true;
  });
  auto reader = t->NewPointReader();
  std::vector<std::string> seen(kKeys, value_of(0));
  std::mt19937_64 rng(5);
  uint64_t reads = 0;
  while (!done) {
    uint64_t at = rng() % kKeys;
    for (uint64_t n = at; n < std::min(kKeys, at + 1 + rng() % 8); n++, reads++) {
      std::string value;
      ASSERT_TRUE(reader->Get(ks, KeyOf(n), &value).ok());
      ASSERT_GE(value, seen[n]) << "key " << n << " went back after " << reads << " reads";
      seen[n] = value;
    }
  }
  writer.join();
  EXPECT_GT(reads, 0u);
}

// FirstMemtableKey names the smallest key of a range that a memtable holds (a tombstone too),
// and every key below it reads the same from the levels alone as through Get, across random
// writes, deletes, flushes and compactions.
TEST(PointReader, PastMemtablesBelowTheFirstMemtableKey) {
  TestEngine t;
  KeyspaceId ks, other;
  ASSERT_TRUE(t->CreateKeyspace(1, &ks).ok());
  ASSERT_TRUE(t->CreateKeyspace(2, &other).ok());
  std::map<std::string, std::string> model;
  std::unique_ptr<PointReader> reader = t->NewPointReader();
  std::mt19937_64 rng(11);
  const uint64_t kKeys = 4000;
  int version = 0;
  int ranges_with_memtable_keys = 0, keys_read_past = 0;
  for (int round = 0; round < 30; round++) {
    for (int i = 0; i < 400; i++) {
      std::string key = KeyOf(rng() % kKeys);
      ASSERT_TRUE(t->Put(other, key, "other").ok());  // another keyspace's keys never count
      if (rng() % 6 == 0) {
        ASSERT_TRUE(t->Delete(ks, key).ok());
        model.erase(key);
      } else {
        std::string value = Value(std::vector<size_t>{8, 300, 1500}[rng() % 3], ++version);
        ASSERT_TRUE(t->Put(ks, key, value).ok());
        model[key] = value;
      }
    }
    if (round % 4 == 3) {
      ASSERT_TRUE(t->CompactAll().ok());
    }
    for (int r = 0; r < 40; r++) {
      uint64_t lo = rng() % kKeys;
      uint64_t hi = lo + 1 + rng() % 200;
      std::string first;
      bool held = reader->FirstMemtableKey(ks, KeyOf(lo), KeyOf(hi), &first);
      uint64_t end = hi;
      if (held) {
        ranges_with_memtable_keys++;
        ASSERT_GE(first, KeyOf(lo));
        ASSERT_LT(first, KeyOf(hi));
        end = std::stoull(first.substr(3));
      }
      for (uint64_t k = lo; k < end; k++) {
        std::string key = KeyOf(k), value;
        Status s = reader->GetPastMemtables(ks, key, &value);
        auto it = model.find(key);
        if (it == model.end()) {
          ASSERT_TRUE(s.IsNotFound()) << key << ": " << s.ToString();
        } else {
          ASSERT_TRUE(s.ok()) << key << ": " << s.ToString();
          ASSERT_EQ(value, it->second) << key;
        }
        keys_read_past++;
      }
    }
  }
  // Both answers occurred: the test saw memtables hold keys and read keys past them.
  EXPECT_GT(ranges_with_memtable_keys, 100);
  EXPECT_GT(keys_read_past, 1000);
}

// A key just written is the first memtable key of its range until a compaction takes it out of
// the memtables; then the range has none and the levels give its value (or its deletion).
TEST(PointReader, FirstMemtableKeyFollowsWritesAndFlushes) {
  TestEngine t;
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(1, &ks).ok());
  std::unique_ptr<PointReader> reader = t->NewPointReader();
  std::string first, value;
  EXPECT_FALSE(reader->FirstMemtableKey(ks, KeyOf(0), KeyOf(100), &first));
  ASSERT_TRUE(t->Put(ks, KeyOf(40), "forty").ok());
  ASSERT_TRUE(t->Put(ks, KeyOf(60), "sixty").ok());
  ASSERT_TRUE(reader->FirstMemtableKey(ks, KeyOf(0), KeyOf(100), &first));
  EXPECT_EQ(first, KeyOf(40));
  ASSERT_TRUE(reader->FirstMemtableKey(ks, KeyOf(41), KeyOf(100), &first));
  EXPECT_EQ(first, KeyOf(60));
  EXPECT_FALSE(reader->FirstMemtableKey(ks, KeyOf(41), KeyOf(60), &first));
  EXPECT_TRUE(reader->GetPastMemtables(ks, KeyOf(40), &value).IsNotFound());
  ASSERT_TRUE(t->CompactAll().ok());
  EXPECT_FALSE(reader->FirstMemtableKey(ks, KeyOf(0), KeyOf(100), &first));
  ASSERT_TRUE(reader->GetPastMemtables(ks, KeyOf(40), &value).ok());
  EXPECT_EQ(value, "forty");
  ASSERT_TRUE(t->Delete(ks, KeyOf(40)).ok());
  ASSERT_TRUE(reader->FirstMemtableKey(ks, KeyOf(0), KeyOf(100), &first));
  EXPECT_EQ(first, KeyOf(40));  // the tombstone
  ASSERT_TRUE(t->CompactAll().ok());
  EXPECT_TRUE(reader->GetPastMemtables(ks, KeyOf(40), &value).IsNotFound());
}

}  // namespace
}  // namespace slipstream::engine::test
