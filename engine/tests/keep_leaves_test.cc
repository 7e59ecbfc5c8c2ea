// Compactions that keep the destination's leaves no new key falls into (Options::keep_leaves):
// a load in key order writes each leaf about once, and every mix of appends, updates, deletes,
// dropped keyspaces, open iterators and restarts reads the same as with whole rewrites.
#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "slipstream/engine/engine.h"
#include "test_util.h"

namespace slipstream::engine::test {
namespace {

Options KeepingLeaves(const std::string& dir) {
  Options o = SmallOptions(dir);
  o.keep_leaves = true;
  return o;
}

Options RewritingLevels(const std::string& dir) {
  Options o = SmallOptions(dir);
  o.keep_leaves = false;
  return o;
}

std::string KeyOf(int i) {
  char key[16];
  std::snprintf(key, sizeof(key), "k%08d", i);
  return key;
}

// Checks that keyspace ks reads as the model and passes Verify, before and after a restart.
void ReadsTheModelAcrossARestart(TestEngine& t, KeyspaceId ks,
                                 const std::map<std::string, std::string>& model) {
  EXPECT_TRUE(Contents(t.engine.get(), ks) == model);
  Status v = t->Verify();
  ASSERT_TRUE(v.ok()) << v.ToString();
  ASSERT_TRUE(t->Sync(t->GetStats().last_lsn).ok());
  t.Reopen();
  EXPECT_TRUE(Contents(t.engine.get(), ks) == model);
  v = t->Verify();
  ASSERT_TRUE(v.ok()) << v.ToString();
}

// Loads `n` rows in key order, running the background work after each memtable's worth; rows
// of `size` bytes (0: 60-109, small rows as a table's).
void LoadInOrder(TestEngine& t, KeyspaceId ks, int n, std::map<std::string, std::string>* model,
                 size_t size = 0) {
  for (int i = 0; i < n; i++) {
    std::string v = Value(size != 0 ? size : 60 + i % 50, i);
    ASSERT_TRUE(t->Put(ks, KeyOf(i), v).ok());
    (*model)[KeyOf(i)] = v;
    if (i % 2000 == 1999) {
      while (t->DoBackgroundWork()) {
      }
    }
  }
  while (t->DoBackgroundWork()) {
  }
}

TEST(KeepLeaves, ALoadInKeyOrderWritesEachLeafAboutOnce) {
  TestEngine keep(KeepingLeaves), rewrite(RewritingLevels);
  KeyspaceId ks_keep, ks_rewrite;
  ASSERT_TRUE(keep->CreateKeyspace(1, &ks_keep).ok());
  ASSERT_TRUE(rewrite->CreateKeyspace(1, &ks_rewrite).ok());
  std::map<std::string, std::string> model;
  LoadInOrder(keep, ks_keep, 60000, &model);
  LoadInOrder(rewrite, ks_rewrite, 60000, &model);

  Stats a = keep->GetStats(), b = rewrite->GetStats();
  ASSERT_GE(b.compactions, 4u) << "the load should take several compactions";
  EXPECT_GT(a.compaction_leaves_kept, 0u);
  EXPECT_EQ(b.compaction_leaves_kept, 0u);
  // Filters are rebuilt rarely (and only above the deepest level, which has none).
  EXPECT_LT(a.compaction_filters_rebuilt, a.compactions);
  EXPECT_EQ(b.compaction_filters_rebuilt, 0u);
  // Whole rewrites copy the destination again at every compaction; kept leaves do not.
  EXPECT_LT(a.compaction_bytes_written * 2, b.compaction_bytes_written)
      << a.compaction_bytes_written << " vs " << b.compaction_bytes_written;
  EXPECT_TRUE(Contents(keep.engine.get(), ks_keep) == model);
  // Kept leaves are not read: their statistics are the older tree's less what was merged.
  // In one level each, both engines must count the same rows, bytes and size classes.
  ASSERT_TRUE(keep->CompactAll().ok());
  ASSERT_TRUE(rewrite->CompactAll().ok());
  auto totals = [](const Stats& s) {
    std::vector<uint64_t> t(5, 0);
    for (const LevelStats& l : s.levels) {
      t[0] += l.entries;
      t[1] += l.bytes;
      t[2] += l.small_entries;
      t[3] += l.medium_entries;
      t[4] += l.large_entries;
    }
    return t;
  };
  EXPECT_EQ(totals(keep->GetStats()), totals(rewrite->GetStats()));
  EXPECT_EQ(totals(keep->GetStats())[0], model.size());
  ReadsTheModelAcrossARestart(keep, ks_keep, model);
}

// A level above the deepest keeps leaves and extends its bloom filter as a load in key order
// grows it; the inherited bits get too dense now and then, and the filter is built again from
// every key (reading the kept leaves). Verify checks that every key passes every filter. The
// deepest level has no filter: point reads never probe it.
TEST(KeepLeaves, AFilterAboveTheDeepestLevelGrowsAndIsRebuilt) {
  TestEngine t(KeepingLeaves);
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(1, &ks).ok());
  std::map<std::string, std::string> model;
  auto level_entries = [&](uint32_t level) {
    for (const LevelStats& l : t->GetStats().levels) {
      if (l.level == level) return l.entries;
    }
    return uint64_t(0);
  };
  int n = 0;
  while (level_entries(2) == 0) {  // until L1 overflows into L2
    ASSERT_LT(n, 200000) << "L1 never moved to L2";
    for (int i = 0; i < 5000; i++, n++) {
      std::string v = Value(60 + n % 50, n);
      ASSERT_TRUE(t->Put(ks, KeyOf(n), v).ok());
      model[KeyOf(n)] = v;
    }
    while (t->DoBackgroundWork()) {
    }
  }
  const uint64_t rebuilt_before = t->GetStats().compaction_filters_rebuilt;
  const uint64_t kept_before = t->GetStats().compaction_leaves_kept;
  // L1 grows again, to just short of moving to L2 once more.
  const uint64_t l1_capacity = uint64_t(t.options.l0_size) * t.options.growth_factor;
  while (true) {
    uint64_t l1_bytes = 0;
    for (const LevelStats& l : t->GetStats().levels) {
      if (l.level == 1) l1_bytes = l.bytes;
    }
    if (l1_bytes + 2 * t.options.l0_size > l1_capacity) break;
    for (int i = 0; i < 5000; i++, n++) {
      std::string v = Value(60 + n % 50, n);
      ASSERT_TRUE(t->Put(ks, KeyOf(n), v).ok());
      model[KeyOf(n)] = v;
    }
    while (t->DoBackgroundWork()) {
    }
  }
  ASSERT_GT(level_entries(1), 0u);
  ASSERT_GT(level_entries(2), 0u);
  EXPECT_GT(t->GetStats().compaction_leaves_kept, kept_before);
  EXPECT_GT(t->GetStats().compaction_filters_rebuilt, rebuilt_before);
  Status v = t->Verify();
  ASSERT_TRUE(v.ok()) << v.ToString();
  for (int i = 0; i < n; i += 37) {
    std::string got;
    ASSERT_TRUE(t->Get(ks, KeyOf(i), &got).ok()) << i;
    EXPECT_EQ(got, model[KeyOf(i)]);
  }
  EXPECT_TRUE(Contents(t.engine.get(), ks) == model);
}

// An iterator opened before a compaction that kept its tree's leaves still reads its version:
// the new tree owns their segments now, and the old tree's nodes must still be reachable.
TEST(KeepLeaves, AnOlderVersionReadsTheLeavesANewerTreeTookOver) {
  TestEngine t(KeepingLeaves);
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(1, &ks).ok());
  std::map<std::string, std::string> model;
  LoadInOrder(t, ks, 6000, &model);
  ASSERT_TRUE(t->CompactAll().ok());
  auto early = t->NewIterator(ks);
  const std::map<std::string, std::string> early_model = model;
  for (int i = 6000; i < 9000; i++) ASSERT_TRUE(t->Put(ks, KeyOf(i), Value(70, i)).ok());
  ASSERT_TRUE(t->CompactAll().ok());
  ASSERT_GT(t->GetStats().compaction_leaves_kept, 0u);
  std::map<std::string, std::string> seen;
  for (early->SeekToFirst(); early->Valid(); early->Next()) {
    seen[std::string(early->key())] = early->value();
  }
  ASSERT_TRUE(early->status().ok()) << early->status().ToString();
  EXPECT_TRUE(seen == early_model);
  early.reset();
  Status v = t->Verify();
  ASSERT_TRUE(v.ok()) << v.ToString();
}

// The size thresholds may change across a restart: leaves kept from before count in their
// old classes, those merged in the new ones, and no class count may wrap below zero.
TEST(KeepLeaves, ThresholdsChangedAcrossARestartKeepCountsSane) {
  TestEngine t(KeepingLeaves);
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(1, &ks).ok());
  std::map<std::string, std::string> model;
  LoadInOrder(t, ks, 6000, &model, 150);  // medium rows under the first thresholds
  ASSERT_TRUE(t->CompactAll().ok());
  ASSERT_TRUE(t->Sync(t->GetStats().last_lsn).ok());
  t.options.small_threshold = 400;  // now the same rows are small
  t.Reopen();
  for (int i = 0; i < 6000; i += 1000) {  // a few merged leaves among kept runs
    model[KeyOf(i)] = Value(150, i + 1);
    ASSERT_TRUE(t->Put(ks, KeyOf(i), model[KeyOf(i)]).ok());
  }
  for (int i = 3000; i < 3200; i++) {  // and leaves whose rows are deleted: fewer re-added
    ASSERT_TRUE(t->Delete(ks, KeyOf(i)).ok());
    model.erase(KeyOf(i));
  }
  ASSERT_TRUE(t->CompactAll().ok());
  ASSERT_GT(t->GetStats().compaction_leaves_kept, 0u);
  // The classes count the kept rows in their old class and the rest in the new (here the
  // small class would fall below 0: floored, and medium counts rows merged since), so they
  // need not add up to the rows; none wraps around.
  uint64_t entries = 0;
  for (const LevelStats& l : t->GetStats().levels) {
    entries += l.entries;
    for (uint64_t c : {l.small_entries, l.medium_entries, l.large_entries, l.tombstones}) {
      EXPECT_LE(c, 2 * l.entries) << "level " << l.level;
    }
  }
  EXPECT_EQ(entries, model.size());
  EXPECT_TRUE(Contents(t.engine.get(), ks) == model);
  Status v = t->Verify();
  ASSERT_TRUE(v.ok()) << v.ToString();
}

// Appends in key order with updates and deletes of random older rows and a second table
// dropped half-way, checked against a model and Verify, after CompactAll and after a restart.
TEST(KeepLeaves, AppendsUpdatesDeletesAndDropsReadAsTheModel) {
  TestEngine t(KeepingLeaves);
  KeyspaceId ks, other;
  ASSERT_TRUE(t->CreateKeyspace(1, &ks).ok());
  ASSERT_TRUE(t->CreateKeyspace(2, &other).ok());
  std::mt19937 rng(17);
  std::map<std::string, std::string> model;
  int next = 0;
  for (int round = 0; round < 30; round++) {
    for (int i = 0; i < 1500; i++, next++) {
      std::string v = Value(40 + rng() % 400, next);  // small and medium rows
      ASSERT_TRUE(t->Put(ks, KeyOf(next), v).ok());
      model[KeyOf(next)] = v;
      if (round < 10) ASSERT_TRUE(t->Put(other, KeyOf(next), "x").ok());
    }
    for (int i = 0; i < 40; i++) {  // a few rows behind the tail: most leaves stay untouched
      std::string key = KeyOf(int(rng() % uint32_t(next)));
      if (rng() % 3 == 0) {
        ASSERT_TRUE(t->Delete(ks, key).ok());
        model.erase(key);
      } else {
        std::string v = Value(30 + rng() % 100, next + i);
        ASSERT_TRUE(t->Put(ks, key, v).ok());
        model[key] = v;
      }
    }
    if (round == 10) ASSERT_TRUE(t->DropKeyspace(other).ok());
    while (t->DoBackgroundWork()) {
    }
  }
  EXPECT_GT(t->GetStats().compaction_leaves_kept, 0u);

  auto check = [&] {
    EXPECT_TRUE(Contents(t.engine.get(), ks) == model);
    for (const std::string& key : {KeyOf(0), KeyOf(next / 2), KeyOf(next - 1)}) {
      std::string got;
      Status s = t->Get(ks, key, &got);
      ASSERT_EQ(s.ok(), model.count(key) == 1) << key << " " << s.ToString();
      if (s.ok()) EXPECT_EQ(got, model[key]);
    }
    Status v = t->Verify();
    ASSERT_TRUE(v.ok()) << v.ToString();
  };
  check();
  ASSERT_TRUE(t->CompactAll().ok());
  check();
  // The dropped table's rows left the levels too (kept leaves never hold a dropped keyspace).
  uint64_t entries = 0;
  for (const LevelStats& l : t->GetStats().levels) entries += l.entries;
  EXPECT_EQ(entries, model.size());
  ASSERT_TRUE(t->Sync(t->GetStats().last_lsn).ok());
  t.Reopen();
  check();
}

// The entries of `level` (0 if it is empty).
uint64_t LevelEntries(TestEngine& t, uint32_t level) {
  for (const LevelStats& l : t->GetStats().levels) {
    if (l.level == level) return l.entries;
  }
  return 0;
}

// Appends rows in key order, a memtable's worth at a time with the background work between,
// until `done` says so.
template <typename Done>
void AppendUntil(TestEngine& t, KeyspaceId ks, int* next, std::map<std::string, std::string>* model,
                 size_t size, Done done) {
  while (!done()) {
    ASSERT_LT(*next, 400000) << "the levels never got where the test needs them";
    for (int i = 0; i < 2000; i++, ++*next) {
      std::string v = Value(size, *next);
      ASSERT_TRUE(t->Put(ks, KeyOf(*next), v).ok());
      (*model)[KeyOf(*next)] = v;
    }
    for (int turns = 0; t->DoBackgroundWork(); turns++) {
      ASSERT_LT(turns, 1000) << "the background work never ends (a compaction keeps failing?)";
    }
  }
}

// When the only level overflows into an empty one below, its tree becomes the deeper level's
// as it stands (a trivial move): every leaf moves, only the index above them is written.
TEST(KeepLeaves, AMergeIntoAnEmptyDeepestLevelMovesEveryLeaf) {
  TestEngine t(KeepingLeaves);
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(1, &ks).ok());
  std::map<std::string, std::string> model;
  int next = 0;
  uint64_t l1_entries = 0, l1_bytes = 0, written_before = 0;
  // Stop right before the memtable flush that overflows L1 into L2.
  const uint64_t l1_capacity = uint64_t(t.options.l0_size) * t.options.growth_factor;
  AppendUntil(t, ks, &next, &model, 150, [&] {  // medium rows: in L1's leaves while deepest
    for (const LevelStats& l : t->GetStats().levels) {
      if (l.level == 1) l1_bytes = l.bytes;
    }
    return l1_bytes + t.options.l0_size > l1_capacity;
  });
  ASSERT_EQ(LevelEntries(t, 2), 0u);
  AppendUntil(t, ks, &next, &model, 150, [&] {
    if (LevelEntries(t, 2) == 0) {
      l1_entries = LevelEntries(t, 1);
      written_before = t->GetStats().compaction_bytes_written;
      return false;
    }
    return true;
  });
  // The last round flushed a memtable into L1 and then moved L1 to L2 (whose entries are the
  // ones L1 had after the flush, at least those before it).
  const Stats st = t->GetStats();
  EXPECT_GE(LevelEntries(t, 2), l1_entries);
  EXPECT_GT(st.compaction_leaves_moved, 0u);
  const uint64_t memtable_and_move = st.compaction_bytes_written - written_before;
  EXPECT_LT(memtable_and_move, 3 * uint64_t(t.options.l0_size))
      << "the move rewrote L1 (" << l1_bytes << " bytes)";
  ReadsTheModelAcrossARestart(t, ks, model);
}

// A later merge of L1 into the deepest level moves the runs of L1's leaves that lie between
// or above the deepest level's keys, unless they hold what that level may not: a tombstone
// (dropped there) or a medium-log pointer (medium values are in place there). Those leaves
// are copied entry by entry; Verify checks the level's promises. Medium values a memtable only
// appends stay in L1's leaves (no pointer), so a load of medium rows moves too. (Leaves of a
// dropped table are copied, which drops their rows; were they moved, the reclaim of dropped
// tables would rewrite the level later.)
TEST(KeepLeaves, LeavesTheDeepestLevelMayNotHoldAreCopied) {
  for (int variant = 0; variant < 5; variant++) {
    SCOPED_TRACE(variant);
    TestEngine t(KeepingLeaves);
    KeyspaceId ks, next_table;
    ASSERT_TRUE(t->CreateKeyspace(1, &ks).ok());
    ASSERT_TRUE(t->CreateKeyspace(2, &next_table).ok());
    std::map<std::string, std::string> model;
    int next = 0;
    AppendUntil(t, ks, &next, &model, 40, [&] { return LevelEntries(t, 2) > 0; });
    ASSERT_GT(t->GetStats().compaction_leaves_moved, 0u);
    // Rows far above the load, in leaves of their own: what is appended next lies between
    // L2's leaves, so the merge moves leaves into a gap below a key it holds. (Not in variant
    // 3: a memtable appends only when its keys lie above all the levels hold. In variant 4 a
    // second table's rows follow instead, in L2's last leaf, after the first table's last rows.)
    ASSERT_TRUE(t->CompactAll().ok());
    if (variant == 4) {
      for (int k = 0; k < 20; k++) ASSERT_TRUE(t->Put(next_table, KeyOf(k), "row").ok());
    }
    for (int k = 90000000; k < (variant >= 3 ? 90000000 : 90001000); k++) {
      ASSERT_TRUE(t->Put(ks, KeyOf(k), Value(40, k)).ok());
      model[KeyOf(k)] = Value(40, k);
    }
    ASSERT_TRUE(t->CompactAll().ok());  // what the memtable still holds goes to L2 as well
    ASSERT_EQ(LevelEntries(t, 1), 0u);
    const uint64_t moved_first = t->GetStats().compaction_leaves_moved;
    // Rows appended until L1 moves into L2 again: small ones (inline at every level); in
    // variant 1 every third deleted at once (a tombstone in every leaf of L1); in 2 medium ones
    // with an older row updated in each memtable (so the memtable does not only append: the
    // medium values go to the medium log, pointers in L1); in 3 and 4 medium ones alone.
    const uint64_t l2_before = LevelEntries(t, 2);
    uint64_t medium_segments = 0;  // the most the medium log used
    for (int round = 0; LevelEntries(t, 2) <= l2_before; round++) {
      ASSERT_LT(round, 300) << "L1 never moved into L2 again";
      for (int i = 0; i < 2000; i++, next++) {
        std::string v = Value(variant >= 2 ? 150 : 40, next);  // 4: between two tables
        ASSERT_TRUE(t->Put(ks, KeyOf(next), v).ok());
        model[KeyOf(next)] = v;
        if (variant == 2 && i % 500 == 0) {
          ASSERT_TRUE(t->Put(ks, KeyOf(i), Value(40, next)).ok());
          model[KeyOf(i)] = Value(40, next);
        }
        if (variant == 1 && next % 3 == 0) {
          ASSERT_TRUE(t->Delete(ks, KeyOf(next)).ok());
          model.erase(KeyOf(next));
        }
      }
      for (int k = 95000000 + round * 10; variant < 3 && k < 95000000 + round * 10 + 10; k++) {
        // A few rows above the far ones: an L1 leaf may hold keys on both sides of them.
        ASSERT_TRUE(t->Put(ks, KeyOf(k), Value(40, k)).ok());
        model[KeyOf(k)] = Value(40, k);
        if (variant == 1 && k % 3 == 0) {
          ASSERT_TRUE(t->Delete(ks, KeyOf(k)).ok());
          model.erase(KeyOf(k));
        }
      }
      for (int turns = 0; t->DoBackgroundWork(); turns++) {
        ASSERT_LT(turns, 1000) << "the background work never ends (a compaction keeps failing?)";
      }
      medium_segments = std::max(medium_segments, t->GetStats().medium_log_segments);
    }
    EXPECT_EQ(medium_segments > 0, variant == 2);
    const uint64_t moved_second = t->GetStats().compaction_leaves_moved - moved_first;
    if (variant == 0 || variant >= 3) {
      EXPECT_GT(moved_second, 0u) << "leaves appended between L2's keys should move";
    } else {
      EXPECT_EQ(moved_second, 0u) << "every appended leaf holds a tombstone or a pointer";
    }
    for (const LevelStats& l : t->GetStats().levels) {
      if (l.level == 2) EXPECT_EQ(l.tombstones, 0u);
    }
    ReadsTheModelAcrossARestart(t, ks, model);
  }
}

}  // namespace
}  // namespace slipstream::engine::test
