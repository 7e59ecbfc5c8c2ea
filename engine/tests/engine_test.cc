// End-to-end behaviour of the engine API: size classes, deletes, iteration, keyspaces,
// compaction, recovery and bad input.
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <thread>
#include <type_traits>

#include "options_internal.h"
#include "test_util.h"

namespace slipstream::engine::test {
namespace {

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
  for (int j = 0; j < 3000; j++, i++)
    ASSERT_TRUE(t->Put(ks, "after" + std::to_string(j), Value(3000, i)).ok());
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

// Runs background work until a periodic log write-out has happened (flush interval 1 ms).
static void RunUntilLogFlushed(TestEngine& t) {
  uint64_t before = t->GetStats().log_flushes;
  for (int i = 0; i < 10000 && t->GetStats().log_flushes == before; i++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    t->DoBackgroundWork();
  }
  ASSERT_GT(t->GetStats().log_flushes, before);
}

// A periodic write-out syncs only if sync_background_flushes says so; Sync() always does.
TEST(Engine, BackgroundFlushesSyncOnlyWhenAsked) {
  for (bool sync_flushes : {true, false}) {
    TestEngine t;
    t.engine.reset();
    t.options.flush_interval_ms = 1;
    t.options.sync_background_flushes = sync_flushes;
    t.Open();
    KeyspaceId ks;
    ASSERT_TRUE(t->CreateKeyspace(4, &ks).ok());
    Lsn lsn = 0;
    ASSERT_TRUE(t->Put(ks, "k", "v", &lsn).ok());
    RunUntilLogFlushed(t);
    Stats st = t->GetStats();
    if (sync_flushes) {
      EXPECT_GE(st.durable_lsn, lsn);
    } else {
      EXPECT_LT(st.durable_lsn, lsn);  // written out, not yet durable
    }
    ASSERT_TRUE(t->Sync(lsn).ok());
    EXPECT_GE(t->GetStats().durable_lsn, lsn);
    t.Reopen();
    std::string got;
    ASSERT_TRUE(t->Get(ks, "k", &got).ok());
    EXPECT_EQ(got, "v");
  }
}

// A host whose log must be durable before the engine's (PostgreSQL's WAL): periodic write-outs
// wait for the host to make their captured position durable by itself instead of calling the
// barrier, and what they wait for is not on the device in between (a restart loses it, as a
// crash would, while the host's log still holds it).
TEST(Engine, PeriodicWriteOutsWaitForTheHostLog) {
  uint64_t needed = 0, durable = 0;
  int barrier_calls = 0;
  TestEngine t;
  t.engine.reset();
  t.options.flush_interval_ms = 1;
  t.options.sync_background_flushes = false;
  t.options.max_writeout_lag_ms = 3600 * 1000;
  t.options.persist_barrier = [&]() -> Status {
    barrier_calls++;
    durable = needed;
    return Status::OK();
  };
  t.options.host_log_needed = [&]() { return needed; };
  t.options.host_log_durable = [&]() { return durable; };
  t.Open();
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(5, &ks).ok());
  Lsn lsn = 0;
  ASSERT_TRUE(t->Sync(t->GetStats().last_lsn).ok());  // the keyspace, behind the barrier
  barrier_calls = 0;
  const uint64_t barrier_calls_before = t->GetStats().log_barrier_calls;
  auto run_background = [&]() {
    for (int i = 0; i < 20; i++) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      t->DoBackgroundWork();
    }
  };
  needed++;  // the host logs each change before the engine applies it
  ASSERT_TRUE(t->Put(ks, "first", "1", &lsn).ok());
  uint64_t flushes = t->GetStats().log_flushes;
  run_background();
  EXPECT_EQ(t->GetStats().log_flushes, flushes) << "written before the host's log covered it";
  durable = needed;  // the host's own flush (a commit) covers "first"
  needed++;
  ASSERT_TRUE(t->Put(ks, "second", "2", &lsn).ok());
  run_background();
  EXPECT_GT(t->GetStats().log_flushes, flushes);
  EXPECT_EQ(barrier_calls, 0);
  EXPECT_EQ(t->GetStats().log_barrier_calls, barrier_calls_before);
  t.Reopen();  // "second" was never written out: the host's log would replay it
  std::string got;
  ASSERT_TRUE(t->Get(ks, "first", &got).ok());
  EXPECT_EQ(got, "1");
  EXPECT_TRUE(t->Get(ks, "second", &got).IsNotFound());

  // A capture the host leaves waiting past max_writeout_lag_ms goes out behind the barrier.
  t.engine.reset();
  t.options.max_writeout_lag_ms = 1;
  t.arena.Reset();
  t.Open();
  needed++;
  ASSERT_TRUE(t->Put(ks, "third", "3", &lsn).ok());
  run_background();
  EXPECT_GE(barrier_calls, 1);
  EXPECT_GE(t->GetStats().log_barrier_calls, 1u);
  EXPECT_EQ(durable, needed);
  t.Reopen();
  ASSERT_TRUE(t->Get(ks, "third", &got).ok());
  EXPECT_EQ(got, "3");
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

// A tag's lookup follows the keyspace's drop and a new keyspace for the tag, before and after
// compaction deletes the dropped slot (lookups are remembered per process, and checked).
TEST(Engine, LookupFollowsDropsAndNewKeyspacesOfATag) {
  TestEngine t;
  KeyspaceId a, other, found;
  ASSERT_TRUE(t->CreateKeyspace(21, &a).ok());
  ASSERT_TRUE(t->CreateKeyspace(22, &other).ok());
  ASSERT_TRUE(t->Put(a, "k", "v").ok());
  for (int i = 0; i < 3; i++) {
    ASSERT_TRUE(t->LookupKeyspace(21, &found).ok());
    EXPECT_EQ(found, a);
  }
  ASSERT_TRUE(t->DropKeyspace(a).ok());
  EXPECT_TRUE(t->LookupKeyspace(21, &found).IsNotFound());
  KeyspaceId b;
  ASSERT_TRUE(t->CreateKeyspace(21, &b).ok());
  ASSERT_NE(b, a);
  ASSERT_TRUE(t->LookupKeyspace(21, &found).ok());
  EXPECT_EQ(found, b);
  ASSERT_TRUE(t->CompactAll().ok());  // a's entries are gone: its slot is deleted
  ASSERT_TRUE(t->LookupKeyspace(21, &found).ok());
  EXPECT_EQ(found, b);
  ASSERT_TRUE(t->DropKeyspace(b).ok());
  ASSERT_TRUE(t->CompactAll().ok());
  EXPECT_TRUE(t->LookupKeyspace(21, &found).IsNotFound());
  ASSERT_TRUE(t->LookupKeyspace(22, &found).ok());
  EXPECT_EQ(found, other);
}

// ArenaSize validates like Open: options Open would refuse have no arena size (0).
TEST(Engine, ArenaSizeIsZeroForInvalidOptions) {
  Options defaults;
  defaults.directory = "/nonexistent/slipstream";
  EXPECT_GT(Engine::ArenaSize(defaults), 0u);  // the table's defaults are valid
  const Options good = SmallOptions("/nonexistent/slipstream");
  ASSERT_GT(Engine::ArenaSize(good), 0u);
  std::vector<std::pair<const char*, void (*)(Options*)>> bad = {
      {"no directory", [](Options* o) { o->directory.clear(); }},
      {"segment_size 0", [](Options* o) { o->segment_size = 0; }},
      {"segment_size not a power of two", [](Options* o) { o->segment_size = 3u << 20; }},
      {"node_size above segment_size/8", [](Options* o) { o->node_size = 65536; }},
      {"small_threshold not below large", [](Options* o) { o->small_threshold = 1000; }},
      {"l0_size 0", [](Options* o) { o->l0_size = 0; }},
      {"max_levels 13", [](Options* o) { o->max_levels = 13; }},
      {"memtables 9", [](Options* o) { o->memtables = 9; }},
      {"gc_threshold NaN", [](Options* o) { o->gc_threshold = std::nan(""); }},
      {"medium_inplace_level above max_levels", [](Options* o) { o->medium_inplace_level = 6; }},
      {"max_device_size not a multiple", [](Options* o) { o->max_device_size += 1; }},
  };
  for (const auto& [what, change] : bad) {
    Options o = good;
    change(&o);
    EXPECT_FALSE(ValidateOptions(o).ok()) << what;
    EXPECT_EQ(Engine::ArenaSize(o), 0u) << what;
  }
}

// Checks that a setting's range (settings.def) is enforced at both ends: the values at the
// bounds pass the range check (another rule may still refuse them), the next ones outside are
// refused by it, and have no arena size.
template <typename T, typename Bound>
void CheckRange(const char* name, T Options::*field, Bound min, Bound max, uint64_t scale) {
  const Options base = SmallOptions("/nonexistent/slipstream");
  const std::string range_message = std::string(name) + " must be in ";
  auto range_refuses = [&](T value) {
    Options o = base;
    o.*field = value;
    Status s = ValidateOptions(o);
    bool refused = !s.ok() && s.message().rfind(range_message, 0) == 0;
    if (refused) {
      EXPECT_EQ(Engine::ArenaSize(o), 0u) << name;
    }
    return refused;
  };
  if constexpr (std::is_same_v<T, bool>) {
    EXPECT_FALSE(range_refuses(false)) << name;
    EXPECT_FALSE(range_refuses(true)) << name;
  } else if constexpr (std::is_floating_point_v<T>) {
    const T lo = T(min) * T(scale), hi = T(max) * T(scale);
    EXPECT_FALSE(range_refuses(lo)) << name << " at its minimum";
    EXPECT_FALSE(range_refuses(hi)) << name << " at its maximum";
    EXPECT_TRUE(range_refuses(std::nextafter(lo, -std::numeric_limits<T>::infinity()))) << name;
    EXPECT_TRUE(range_refuses(std::nextafter(hi, std::numeric_limits<T>::infinity()))) << name;
    EXPECT_TRUE(range_refuses(std::numeric_limits<T>::quiet_NaN())) << name;
  } else {
    const uint64_t lo = uint64_t(min) * scale, hi = uint64_t(max) * scale;
    EXPECT_FALSE(range_refuses(T(lo))) << name << " at its minimum";
    EXPECT_FALSE(range_refuses(T(hi))) << name << " at its maximum";
    if (lo > 0) {
      EXPECT_TRUE(range_refuses(T(lo - 1))) << name << " below its minimum";
    }
    ASSERT_LT(hi, uint64_t(std::numeric_limits<T>::max()));
    EXPECT_TRUE(range_refuses(T(hi + 1))) << name << " above its maximum";
  }
}

// One test per line of settings.def: SettingsRange.<field>.
#define SS_SETTING(NAME, FIELD, KIND, UNIT, DEFAULT, MIN, MAX, CONTEXT, DESCRIPTION) \
  TEST(SettingsRange, FIELD) {                                                       \
    CheckRange(NAME, &Options::FIELD, MIN, MAX, SS_SCALE_##UNIT);                    \
  }
#include "slipstream/engine/settings.def"

}  // namespace
}  // namespace slipstream::engine::test
