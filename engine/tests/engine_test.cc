// End-to-end behaviour of the engine API: size classes, deletes, iteration, keyspaces,
// compaction, recovery and bad input.
#include <map>
#include <random>

#include "test_util.h"

namespace slipstream::engine::test {
namespace {

std::string Value(size_t size, int seed) {
  std::string v(size, '\0');
  for (size_t i = 0; i < size; i++) v[i] = char('a' + (seed * 7 + i * 13 + (i / 7)) % 26);
  return v;
}

TEST(Engine, PutGetAcrossSizeClasses) {
  TestEngine t;
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(7, &ks).ok());
  for (size_t size : {0, 5, 90, 100, 500, 999, 1000, 5000, 30000}) {
    std::string key = "k" + std::to_string(size);
    ASSERT_TRUE(t->Put(ks, key, Value(size, int(size))).ok());
  }
  for (size_t size : {0, 5, 90, 100, 500, 999, 1000, 5000, 30000}) {
    std::string got;
    Status s = t->Get(ks, "k" + std::to_string(size), &got);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(got, Value(size, int(size)));
  }
  std::string got;
  EXPECT_TRUE(t->Get(ks, "missing", &got).IsNotFound());
  ASSERT_TRUE(t->Verify().ok());
}

TEST(Engine, SurvivesCompactionAndReopen) {
  TestEngine t;
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(1, &ks).ok());
  std::map<std::string, std::string> model;
  std::mt19937 rng(42);
  for (int i = 0; i < 20000; i++) {
    std::string key = "key" + std::to_string(rng() % 5000);
    size_t size = std::vector<size_t>{5, 150, 2000}[rng() % 3];
    if (rng() % 10 == 0) {
      ASSERT_TRUE(t->Delete(ks, key).ok());
      model.erase(key);
    } else {
      std::string v = Value(size, i);
      ASSERT_TRUE(t->Put(ks, key, v).ok());
      model[key] = v;
    }
    if (i % 5000 == 4999) {
      while (t->DoBackgroundWork()) {
      }
    }
  }
  auto check = [&] {
    for (auto& [k, v] : model) {
      std::string got;
      Status s = t->Get(ks, k, &got);
      ASSERT_TRUE(s.ok()) << k << " " << s.ToString();
      ASSERT_EQ(got, v) << k;
    }
    auto it = t->NewIterator(ks);
    auto mit = model.begin();
    for (it->SeekToFirst(); it->Valid(); it->Next(), ++mit) {
      ASSERT_NE(mit, model.end());
      ASSERT_EQ(it->key(), mit->first);
      ASSERT_EQ(it->value(), mit->second);
    }
    ASSERT_TRUE(it->status().ok()) << it->status().ToString();
    ASSERT_EQ(mit, model.end());
    Status v = t->Verify();
    ASSERT_TRUE(v.ok()) << v.ToString();
  };
  check();
  ASSERT_TRUE(t->CompactAll().ok());
  check();
  Stats st = t->GetStats();
  EXPECT_GT(st.compactions, 0u);
  ASSERT_TRUE(t->Sync(st.last_lsn).ok());
  t.Reopen();
  check();
}

// A crash right after an L0 compaction whose memtable pointed at large values that were
// still in a log buffer: the level must not name values the device never got, and the large
// log's accounting must forget values whose L0 records died with the crash. Nothing is synced:
// an embedding host (PostgreSQL) replays its own log instead.
Options RarelyFlushedOptions(const std::string& dir) {
  Options o = SmallOptions(dir);
  o.flush_interval_ms = 10000;  // only rotations and compactions write logs out
  o.segment_size = 2u << 20;    // a whole memtable's log fits in one segment: no rotation
  return o;
}

TEST(Engine, CompactionBeforeAnyFlushSurvivesACrash) {
  TestEngine t(RarelyFlushedOptions);
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(5, &ks).ok());
  std::map<std::string, std::string> written;
  int i = 0;
  // No background thread: a writer that finds L0 full compacts it itself.
  for (; t->GetStats().compactions < 2 && i < 200000; i++) {
    std::string key = "key" + std::to_string(i % 3000);
    std::string v = Value(i % 3 == 0 ? 3000 : 40, i);
    ASSERT_TRUE(t->Put(ks, key, v).ok());
    written[key] = v;
  }
  ASSERT_GE(t->GetStats().compactions, 2u);
  for (int j = 0; j < 50; j++, i++) {  // values that never reach the device
    ASSERT_TRUE(t->Put(ks, "late" + std::to_string(j), Value(3000, i)).ok());
  }
  t.Reopen();
  Status v = t->Verify();
  ASSERT_TRUE(v.ok()) << v.ToString();
  for (auto& [k, value] : written) {
    std::string got;
    Status s = t->Get(ks, k, &got);
    ASSERT_TRUE(s.ok() || s.IsNotFound()) << k << " " << s.ToString();
  }
  // Writing on reuses the recovered log tails; the accounting must still add up.
  for (int j = 0; j < 3000; j++, i++) ASSERT_TRUE(t->Put(ks, "after" + std::to_string(j), Value(3000, i)).ok());
  ASSERT_TRUE(t->CompactAll().ok());
  v = t->Verify();
  ASSERT_TRUE(v.ok()) << v.ToString();
}

// The write-ahead barrier runs before records reach the device; refusing it keeps them off.
TEST(Engine, PersistBarrierGuardsEveryWriteOut) {
  int calls = 0;
  bool refuse = false;
  TestEngine t;
  t.engine.reset();
  t.options.persist_barrier = [&]() -> Status {
    calls++;
    return refuse ? Status::IOError("host log not durable") : Status::OK();
  };
  t.Open();
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(3, &ks).ok());
  Lsn lsn = 0;
  ASSERT_TRUE(t->Put(ks, "durable", "yes", &lsn).ok());
  ASSERT_TRUE(t->Sync(lsn).ok());
  EXPECT_GE(calls, 1);

  refuse = true;
  ASSERT_TRUE(t->Put(ks, "held-back", "no", &lsn).ok());
  Status s = t->Sync(lsn);
  EXPECT_TRUE(s.IsIOError()) << s.ToString();
  calls = 0;
  t.Reopen();
  std::string got;
  EXPECT_TRUE(t->Get(ks, "durable", &got).ok());
  EXPECT_TRUE(t->Get(ks, "held-back", &got).IsNotFound());
}

// ListKeyspaces reports exactly the live keyspaces, with their tags.
TEST(Engine, ListKeyspacesShowsLiveOnes) {
  TestEngine t;
  KeyspaceId a, b;
  ASSERT_TRUE(t->CreateKeyspace(11, &a).ok());
  ASSERT_TRUE(t->CreateKeyspace(12, &b).ok());
  ASSERT_TRUE(t->DropKeyspace(a).ok());
  std::vector<std::pair<uint64_t, KeyspaceId>> live;
  ASSERT_TRUE(t->ListKeyspaces(&live).ok());
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live[0].first, 12u);
  EXPECT_EQ(live[0].second, b);
}

}  // namespace
}  // namespace slipstream::engine::test
