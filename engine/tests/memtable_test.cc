// The shared-memory skiplist memtable: ordering (key ascending, newest LSN first), snapshot
// lookups, Seek, space accounting, Reset, and lock-free readers running beside the writer.
#include "memtable.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace slipstream::engine {
namespace {

// A header plus an 8-byte aligned data area and a hash index of `index_slots` slots (a power
// of two, or 0 for none) with its neighbour table, as the engine lays them out in the arena.
class MemArea {
 public:
  explicit MemArea(size_t capacity, uint32_t index_slots = 1u << 16)
      : data_(capacity / 8), index_(MemTable::IndexWords(index_slots)) {
    header_ = std::make_unique<MemtableHeader>();
    header_->capacity = capacity;
    header_->index_slots = index_slots;
    table_ = std::make_unique<MemTable>(header_.get(), reinterpret_cast<char*>(data_.data()),
                                        index_.data());
    table_->Reset();
  }
  MemTable& table() { return *table_; }
  MemtableHeader& header() { return *header_; }

 private:
  std::unique_ptr<MemtableHeader> header_;
  std::vector<uint64_t> data_;
  std::vector<std::atomic<uint32_t>> index_;
  std::unique_ptr<MemTable> table_;
};

// A value that encodes its key and LSN, of a length that depends on both.
std::string ValueFor(std::string_view key, uint64_t lsn) {
  std::string v = std::string(key) + "@" + std::to_string(lsn) + "|";
  size_t extra = (lsn * 7 + key.size()) % 40;
  for (size_t i = 0; i < extra; i++) v.push_back(char('a' + (lsn + i) % 26));
  return v;
}

struct Version {
  ValueKind kind;
  std::string value;
};
// key -> lsn -> version
using Model = std::map<std::string, std::map<uint64_t, Version>>;

// Inserts `keys` keys with 1..4 versions each, in random order with increasing LSNs.
Model FillRandom(MemTable* t, uint32_t seed, int keys, uint64_t* last_lsn) {
  std::mt19937 rng(seed);
  std::vector<std::string> order;
  for (int k = 0; k < keys; k++) {
    std::string key = "k" + std::to_string(k * 3);  // unpadded: prefixes of each other occur
    int versions = 1 + int(rng() % 4);
    for (int v = 0; v < versions; v++) order.push_back(key);
  }
  std::shuffle(order.begin(), order.end(), rng);
  Model model;
  uint64_t lsn = *last_lsn;
  for (const std::string& key : order) {
    ++lsn;
    bool tomb = rng() % 8 == 0;
    Version v{tomb ? ValueKind::kTombstone : ValueKind::kInline, tomb ? "" : ValueFor(key, lsn)};
    uint64_t space = MemTable::EntrySpace(key.size(), v.value.size());
    EXPECT_TRUE(t->HasRoom(space));
    uint64_t before = t->used();
    t->Insert(key, lsn, v.kind, v.value);
    EXPECT_LE(t->used() - before, space);
    EXPECT_EQ((t->used() - before) % 8, 0u);
    model[key][lsn] = v;
  }
  *last_lsn = lsn;
  return model;
}

// The newest version of `key` with lsn <= max_lsn in the model, or nullptr.
const std::pair<const uint64_t, Version>* ModelFind(const Model& m, const std::string& key,
                                                    uint64_t max_lsn) {
  auto it = m.find(key);
  if (it == m.end()) return nullptr;
  auto v = it->second.upper_bound(max_lsn);
  if (v == it->second.begin()) return nullptr;
  return &*std::prev(v);
}

// Level 0 holds exactly the model's versions, by key ascending and newest LSN first.
void ExpectListMatchesModel(const MemTable& t, const Model& model) {
  const MemNode* node = t.First();
  for (auto& [key, versions] : model) {
    for (auto v = versions.rbegin(); v != versions.rend(); ++v) {
      ASSERT_NE(node, nullptr) << "missing " << key.size() << "-byte key @" << v->first;
      ASSERT_EQ(node->key(), key);
      ASSERT_EQ(node->lsn, v->first);
      ASSERT_EQ(node->value_kind(), v->second.kind);
      ASSERT_EQ(node->value(), v->second.value);
      node = t.Next(node);
    }
  }
  ASSERT_EQ(node, nullptr);
}

// Iteration visits every entry once, by key ascending and newest LSN first among equal keys.
TEST(MemTable, IteratesByKeyThenNewestFirst) {
  MemArea area(16u << 20);
  MemTable& t = area.table();
  EXPECT_EQ(t.First(), nullptr);
  uint64_t lsn = 0;
  Model model = FillRandom(&t, 31, 3000, &lsn);
  uint64_t kv = 0;
  size_t n = 0;
  const MemNode* node = t.First();
  for (auto& [key, versions] : model) {
    for (auto v = versions.rbegin(); v != versions.rend(); ++v) {
      ASSERT_NE(node, nullptr) << "missing " << key << "@" << v->first;
      ASSERT_EQ(node->key(), key);
      ASSERT_EQ(node->lsn, v->first);
      ASSERT_EQ(node->value_kind(), v->second.kind);
      ASSERT_EQ(node->value(), v->second.value);
      kv += key.size() + v->second.value.size();
      n++;
      node = t.Next(node);
    }
  }
  EXPECT_EQ(node, nullptr);
  EXPECT_EQ(t.entries(), n);
  EXPECT_EQ(t.kv_bytes(), kv);
  EXPECT_EQ(area.header().max_lsn.load(), lsn);
  EXPECT_LE(t.used(), area.header().capacity);
}

// Find returns the newest version at or below the snapshot LSN, and nullptr when every version
// is newer or the key is absent: through a complete hash index, through one that filled up
// (keys it could not take are found by the skiplist), and with no index.
class MemTableIndexes : public testing::TestWithParam<uint32_t> {};

INSTANTIATE_TEST_SUITE_P(IndexSlots, MemTableIndexes, testing::Values(1u << 16, 1024u, 0u));

TEST_P(MemTableIndexes, FindHonoursSnapshotLsn) {
  MemArea area(16u << 20, GetParam());
  MemTable& t = area.table();
  uint64_t lsn = 0;
  Model model = FillRandom(&t, 32, 2000, &lsn);
  std::mt19937 rng(33);
  for (auto& [key, versions] : model) {
    std::vector<uint64_t> probes = {0, lsn, UINT64_MAX, rng() % (lsn + 1)};
    for (auto& [l, v] : versions) {
      probes.push_back(l);
      probes.push_back(l - 1);
      probes.push_back(l + 1);
    }
    for (uint64_t max_lsn : probes) {
      const MemNode* got = t.Find(key, max_lsn);
      auto want = ModelFind(model, key, max_lsn);
      if (!want) {
        ASSERT_EQ(got, nullptr) << key << " max " << max_lsn;
        continue;
      }
      ASSERT_NE(got, nullptr) << key << " max " << max_lsn;
      ASSERT_EQ(got->key(), key);
      ASSERT_EQ(got->lsn, want->first) << key << " max " << max_lsn;
      ASSERT_EQ(got->value_kind(), want->second.kind);
      ASSERT_EQ(got->value(), want->second.value);
    }
  }
  // Absent keys: between, before and after the present ones, and prefixes of present ones.
  for (std::string absent : {"", "a", "k", "k1", "k00", "k3x", "k9999999", "l", "zzz"}) {
    EXPECT_EQ(t.Find(absent, UINT64_MAX), nullptr) << absent;
  }
  // 2000 keys fit in 65536 slots; 1024 slots fill up and stop answering for absent keys.
  EXPECT_EQ(t.IndexComplete(), GetParam() == (1u << 16));
  // After a reset the index is empty and complete again: nothing old is found.
  t.Reset();
  EXPECT_EQ(t.IndexComplete(), GetParam() != 0);
  for (auto& [key, versions] : model) ASSERT_EQ(t.Find(key, UINT64_MAX), nullptr) << key;
}

// Seek lands on the newest version of the first key >= target.
TEST(MemTable, SeekFindsFirstKeyAtOrAfter) {
  MemArea area(16u << 20);
  MemTable& t = area.table();
  uint64_t lsn = 0;
  Model model = FillRandom(&t, 34, 1500, &lsn);
  auto check = [&](const std::string& target) {
    const MemNode* got = t.Seek(target);
    auto it = model.lower_bound(target);
    if (it == model.end()) {
      ASSERT_EQ(got, nullptr) << target;
      return;
    }
    ASSERT_NE(got, nullptr) << target;
    ASSERT_EQ(got->key(), it->first) << target;
    ASSERT_EQ(got->lsn, it->second.rbegin()->first) << target;
  };
  for (auto& [key, versions] : model) {
    check(key);
    check(key + '\0');
    check(key.substr(0, key.size() - 1));
  }
  check("");
  check("zzz");
  check("k99999999");
  EXPECT_EQ(t.Seek(""), t.First());
}

// Row-id keys as the table AM writes them: a keyspace prefix and a big-endian row id.
std::string RowKey(uint32_t keyspace, uint64_t rowid) {
  std::string k(12, '\0');
  for (int i = 0; i < 4; i++) k[size_t(i)] = char(keyspace >> (24 - 8 * i));
  for (int i = 0; i < 8; i++) k[size_t(4 + i)] = char(rowid >> (56 - 8 * i));
  return k;
}

// Every insert pattern of the table AM (new row ids in many keyspaces, new versions of random
// rows and of the newest, rows a little below the newest, a Reset in the middle) leaves every
// level ordered and every back link right (LevelsOrdered: lookups would not notice a
// disordered upper level), and iteration, Find and Seek agree with a model: with a hash index
// that holds every key (new versions placed by back link), one that fills up (some keys left
// to the descent) and none.
class MemTableVersions : public testing::TestWithParam<uint32_t> {};

INSTANTIATE_TEST_SUITE_P(IndexSlots, MemTableVersions, testing::Values(1u << 18, 1u << 12, 0u));

TEST_P(MemTableVersions, EveryInsertPatternKeepsEveryLevelOrdered) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    MemArea area(32u << 20, GetParam());
    MemTable& t = area.table();
    std::mt19937 rng(seed);
    Model model;
    uint64_t lsn = 0;
    std::map<uint32_t, uint64_t> top;  // keyspace -> highest row id written
    auto put = [&](const std::string& key) {
      ++lsn;
      std::string value = ValueFor(key, lsn);
      ASSERT_TRUE(t.HasRoom(MemTable::EntrySpace(key.size(), value.size())));
      t.Insert(key, lsn, ValueKind::kInline, value);
      model[key][lsn] = Version{ValueKind::kInline, value};
    };
    for (int round = 0; round < 2; round++) {
      for (int op = 0; op < 40000; op++) {
        uint32_t keyspace = 100 + rng() % 12;
        uint64_t& high = top[keyspace];
        switch (rng() % 8) {
          case 0:  // a rewrite of a random earlier row
            put(RowKey(keyspace, high == 0 ? 0 : rng() % high));
            break;
          case 1:  // a rewrite of the newest row
            put(RowKey(keyspace, high));
            break;
          case 2:  // a little below the newest row
            put(RowKey(keyspace, high > 4 ? high - 1 - rng() % 4 : 0));
            break;
          default:  // a new row id
            high += 1 + (rng() % 16 == 0 ? rng() % 50 : 0);
            put(RowKey(keyspace, high));
        }
        if (testing::Test::HasFatalFailure()) return;
      }
      ASSERT_NO_FATAL_FAILURE(ExpectListMatchesModel(t, model));
      ASSERT_TRUE(t.LevelsOrdered());
      for (auto& [key, versions] : model) {
        const MemNode* found = t.Find(key, lsn);
        ASSERT_NE(found, nullptr);
        ASSERT_EQ(found->lsn, versions.rbegin()->first);
        const MemNode* older = t.Find(key, versions.begin()->first);
        ASSERT_NE(older, nullptr);
        ASSERT_EQ(older->lsn, versions.begin()->first);
        const MemNode* after = t.Seek(key + '\0');
        auto next = model.upper_bound(key);
        if (next == model.end()) {
          ASSERT_EQ(after, nullptr);
        } else {
          ASSERT_NE(after, nullptr);
          ASSERT_EQ(after->key(), next->first);
        }
      }
      // A reset memtable starts over: no index slot or back link may lead into what it held.
      t.Reset();
      model.clear();
    }
  }
}

// New row ids appended in order are placed by the writer's append finger, not by descents:
// to one keyspace, then to three in turn (finger slots 15, 9 and 8 by keyspace hash), then to
// two that share a slot (5: each takes it from the other, so each append descends), then,
// after a Reset, to the keyspace whose finger still names nodes of the emptied area: its
// generation must keep the finger from leading there.
TEST(MemTable, AppendsInOrderSkipTheDescent) {
  MemArea area(64u << 20, 1u << 18);
  MemTable& t = area.table();
  uint64_t lsn = 0;
  for (uint64_t row = 1; row <= 20000; row++) {
    t.Insert(RowKey(7, row), ++lsn, ValueKind::kInline, "v");
  }
  EXPECT_LT(t.descents(), 20u) << "of 20000 appends";
  uint64_t before = t.descents();
  for (uint64_t row = 1; row <= 20000; row++) {
    for (uint32_t keyspace : {21u, 22u, 30u}) {
      t.Insert(RowKey(keyspace, row), ++lsn, ValueKind::kInline, "w");
    }
  }
  EXPECT_LT(t.descents() - before, 20u) << "of 60000 appends to three keyspaces";
  before = t.descents();
  for (uint64_t row = 1; row <= 1000; row++) {
    t.Insert(RowKey(41, row), ++lsn, ValueKind::kInline, "s");
    t.Insert(RowKey(7, 20000 + row), ++lsn, ValueKind::kInline, "s");
  }
  // Their fingers evict each other; the neighbour table places the nodes of height 1 (about
  // three quarters), and the taller ones descend.
  EXPECT_GE(t.descents() - before, 400u) << "of 2000 appends to keyspaces sharing a slot";
  ASSERT_TRUE(t.LevelsOrdered());
  t.Reset();
  for (uint64_t row = 21001; row <= 30000; row++) {
    t.Insert(RowKey(7, row), ++lsn, ValueKind::kInline, "x");
  }
  EXPECT_LT(t.descents(), 20u);
  ASSERT_TRUE(t.LevelsOrdered());
  const MemNode* n = t.First();
  for (uint64_t row = 21001; row <= 30000; row++, n = t.Next(n)) {
    ASSERT_NE(n, nullptr);
    ASSERT_EQ(n->key(), RowKey(7, row));
  }
  EXPECT_EQ(n, nullptr);
}

// An index scan fetches rows in row id order: 16 row ids of a table that differ only in their
// low four bits start at 16 different slots of one 64-byte line of the index, the next 16 in
// another line. Runs of row ids from several tables and scattered keys filling the index up to
// its cap are all found, the index stays complete (it answers for absent keys too), and absent
// keys between and around the runs are not found.
TEST(MemTable, RowIdsOfSixteenShareAnIndexLine) {
  MemArea area(16u << 20, 1024);
  MemTable& t = area.table();
  for (uint64_t first : {0ull, 4096ull, 1ull << 40}) {
    std::set<uint32_t> starts, lines;
    for (uint64_t row = first; row < first + 32; row++) {
      MemTable::IndexHome home = t.HomeOf(RowKey(9, row));
      starts.insert(home.start);
      lines.insert(home.start / 16);
    }
    EXPECT_EQ(starts.size(), 32u);
    EXPECT_EQ(lines.size(), 2u);
  }

  std::mt19937 rng(12);
  std::vector<std::string> keys;
  for (uint32_t keyspace : {1u, 2u, 3u}) {
    for (uint64_t run = 0; run < 13; run++) {
      const uint64_t first = run * 1000 + (run % 3) * 5;  // runs not aligned to 16 as well
      for (uint64_t row = first; row < first + 16; row++) keys.push_back(RowKey(keyspace, row));
    }
  }
  while (keys.size() < 716) keys.push_back(RowKey(4, rng() % 100000 + 100000));  // the 7/10 cap
  std::shuffle(keys.begin(), keys.end(), rng);
  uint64_t lsn = 0;
  for (const std::string& key : keys) t.Insert(key, ++lsn, ValueKind::kInline, key);
  ASSERT_TRUE(t.IndexComplete());
  for (const std::string& key : keys) {
    const MemNode* n = t.Find(key, UINT64_MAX);
    ASSERT_NE(n, nullptr);
    ASSERT_EQ(n->value(), key);
  }
  std::set<std::string> present(keys.begin(), keys.end());
  for (uint32_t keyspace : {1u, 2u, 3u, 5u}) {
    for (uint64_t row = 0; row < 13000; row += 7) {
      std::string key = RowKey(keyspace, row);
      if (present.count(key) == 0) {
        ASSERT_EQ(t.Find(key, UINT64_MAX), nullptr) << row;
      }
    }
  }
}

// Rows the memtable does not hold (an old row's version rewritten, a pruned chain's root),
// in random order between the rows it holds: a node of height 1 is placed by a walk from the
// node inserted last in its bucket of 16 (or 256) row ids, forward or back, so only the taller
// quarter descends. With a neighbour table of 256 slots, buckets collide and more descend; the list
// stays ordered either way.
TEST(MemTable, RowsNotHeldArePlacedFromTheirBucket) {
  for (uint32_t index_slots : {1u << 18, 1024u}) {
    SCOPED_TRACE(index_slots);
    MemArea area(64u << 20, index_slots);
    MemTable& t = area.table();
    constexpr uint64_t kRows = 40000;
    uint64_t lsn = 0;
    for (uint64_t row = 0; row < kRows; row += 4) {
      t.Insert(RowKey(3, row), ++lsn, ValueKind::kInline, "held");
    }
    std::vector<uint64_t> rows;
    for (uint64_t row = 0; row < kRows; row++) {
      if (row % 4 != 0) rows.push_back(row);
    }
    std::mt19937 rng(5);
    std::shuffle(rows.begin(), rows.end(), rng);
    uint64_t before = t.descents();
    for (uint64_t row : rows) t.Insert(RowKey(3, row), ++lsn, ValueKind::kInline, "new");
    uint64_t descents = t.descents() - before;
    if (index_slots == (1u << 18)) {
      EXPECT_LT(descents, rows.size() * 35 / 100) << "of " << rows.size() << " inserts";
    } else {
      EXPECT_GT(descents, rows.size() * 35 / 100) << "of " << rows.size() << " inserts";
    }
    ASSERT_TRUE(t.LevelsOrdered());
    const MemNode* n = t.First();
    for (uint64_t row = 0; row < kRows; row++, n = t.Next(n)) {
      ASSERT_NE(n, nullptr);
      ASSERT_EQ(n->key(), RowKey(3, row));
      ASSERT_EQ(n->value(), row % 4 == 0 ? "held" : "new");
    }
    EXPECT_EQ(n, nullptr);
  }
}

// A writer that dies between linking a node and setting the back links leaves a stale back
// link behind. A walk back from a neighbour checks every step against the forward link, so
// the next insert descends instead of linking after the wrong node. Twenty rounds: a round's
// insert of height 1 (three in four) would otherwise link out of order.
TEST(MemTable, NeighbourWalksDoNotTrustAStaleBackLink) {
  MemArea area(1u << 20, 1u << 12);
  MemTable& t = area.table();
  for (int round = 0; round < 20; round++) {
    t.Reset();
    uint64_t lsn = 0;
    for (uint64_t row : {1, 2, 10}) t.Insert(RowKey(5, row), ++lsn, ValueKind::kInline, "v");
    // Row 10 (the bucket's neighbour) gets row 1 as its back link instead of row 2.
    const MemNode* first = t.First();
    auto* row10 = const_cast<MemNode*>(t.Next(t.Next(first)));
    ASSERT_EQ(row10->key(), RowKey(5, 10));
    row10->back() = row10->back() - uint32_t(reinterpret_cast<const char*>(t.Next(first)) -
                                             reinterpret_cast<const char*>(first));
    t.Insert(RowKey(5, 5), ++lsn, ValueKind::kInline, "v");
    ASSERT_TRUE(t.LevelsOrdered()) << "round " << round;
    std::vector<std::string> keys;
    for (const MemNode* n = t.First(); n != nullptr; n = t.Next(n)) keys.emplace_back(n->key());
    ASSERT_EQ(keys,
              (std::vector<std::string>{RowKey(5, 1), RowKey(5, 2), RowKey(5, 5), RowKey(5, 10)}));
  }
}

// A key's second node (a table row's header rewritten once, when it is updated or deleted) is
// placed by the index and a back link whatever height it would have drawn, so it never
// descends; the third node of a key draws its height as any other, and the taller ones descend.
TEST(MemTable, SecondNodesOfKeysSkipTheDescent) {
  MemArea area(64u << 20, 1u << 18);
  MemTable& t = area.table();
  constexpr uint64_t kRows = 20000;
  std::vector<uint64_t> rows(kRows);
  for (uint64_t i = 0; i < kRows; i++) rows[i] = i + 1;
  std::mt19937 rng(11);
  std::shuffle(rows.begin(), rows.end(), rng);
  uint64_t lsn = 0;
  for (uint64_t row : rows) t.Insert(RowKey(9, row), ++lsn, ValueKind::kInline, "first");
  std::shuffle(rows.begin(), rows.end(), rng);
  uint64_t before = t.descents();
  for (uint64_t row : rows) t.Insert(RowKey(9, row), ++lsn, ValueKind::kInline, "second");
  EXPECT_EQ(t.descents() - before, 0u) << "of " << kRows << " second nodes";
  std::shuffle(rows.begin(), rows.end(), rng);
  before = t.descents();
  for (uint64_t row : rows) t.Insert(RowKey(9, row), ++lsn, ValueKind::kInline, "third");
  // A quarter of the third nodes draw a height above 1.
  EXPECT_GT(t.descents() - before, kRows / 8) << "of " << kRows << " third nodes";
  EXPECT_LT(t.descents() - before, kRows * 3 / 8) << "of " << kRows << " third nodes";
  ASSERT_TRUE(t.LevelsOrdered());
  for (uint64_t row = 1; row <= kRows; row++) {
    const MemNode* n = t.Find(RowKey(9, row), lsn);
    ASSERT_NE(n, nullptr);
    ASSERT_EQ(n->value(), "third");
    n = t.Next(n);
    ASSERT_NE(n, nullptr);
    ASSERT_EQ(n->value(), "second");
  }
}

// Writers taking turns under a mutex (the engine's write mutex), each with its own append
// fingers, interleave new row ids, rewrites of old rows and of other writers' newest rows in
// shared keyspaces, and one of them resets the memtable now and then: every level stays
// ordered and the contents match a model; most appends still skip the descent. Six of them, so
// that a finger often lies behind other writers' appends and the finger search places them.
TEST(MemTable, WritersTakingTurnsKeepTheListOrdered) {
  MemArea area(96u << 20, 1u << 18);
  MemTable& t = area.table();
  std::mutex write_mu;
  Model model;
  uint64_t lsn = 0;
  uint64_t inserts = 0;
  uint64_t descents_before_reset = 0;
  std::map<uint32_t, uint64_t> top;  // keyspace -> highest row id written
  constexpr int kWritersHere = 6;
  std::vector<std::thread> threads;
  for (int w = 0; w < kWritersHere; w++) {
    threads.emplace_back([&, w] {
      std::mt19937 rng(100 + w);
      for (int op = 0; op < 30000; op++) {
        std::lock_guard<std::mutex> g(write_mu);
        if (w == 0 && op % 10000 == 5000) {
          // What a Reset empties is checked first: a finger gone astray before it would
          // otherwise go unseen.
          EXPECT_TRUE(t.LevelsOrdered());
          ExpectListMatchesModel(t, model);
          descents_before_reset += t.descents();
          t.Reset();
          model.clear();
          continue;
        }
        uint32_t keyspace = 300 + rng() % 3;
        uint64_t& high = top[keyspace];
        std::string key;
        switch (rng() % 6) {
          case 0:
            key = RowKey(keyspace, high == 0 ? 0 : rng() % high);
            break;
          case 1:
            key = RowKey(keyspace, high);
            break;
          default:
            key = RowKey(keyspace, ++high);
        }
        std::string value = ValueFor(key, ++lsn);
        t.Insert(key, lsn, ValueKind::kInline, value);
        model[key][lsn] = Version{ValueKind::kInline, value};
        inserts++;
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_TRUE(t.LevelsOrdered());
  ASSERT_NO_FATAL_FAILURE(ExpectListMatchesModel(t, model));
  // Two thirds of the inserts are appends, which the fingers place; a sixth are rewrites of
  // random old rows, which descend.
  EXPECT_LT(descents_before_reset + t.descents(), inserts / 3) << "of " << inserts << " inserts";
}

// Many writers appending in strict turn to shared keyspaces, as backends inserting new row ids
// of the same tables do: each writer's finger is then fifteen nodes behind at level 0, and the
// finger search from higher levels still places nearly every append without a descent (before
// it, every one of them descended).
TEST(MemTable, ManyWritersAppendingInTurnSkipTheDescent) {
  MemArea area(64u << 20, 1u << 18);
  MemTable& t = area.table();
  constexpr int kWritersHere = 16;
  constexpr int kTurns = 1500;
  std::mutex mu;
  std::condition_variable turn_changed;
  int turn = 0;
  uint64_t lsn = 0;
  uint64_t next_row[2] = {0, 0};
  Model model;
  std::vector<std::thread> threads;
  for (int w = 0; w < kWritersHere; w++) {
    threads.emplace_back([&, w] {
      for (int i = 0; i < kTurns; i++) {
        std::unique_lock<std::mutex> lock(mu);
        turn_changed.wait(lock, [&] { return turn % kWritersHere == w; });
        for (int k = 0; k < 2; k++) {
          std::string key = RowKey(500 + k, ++next_row[k]);
          std::string value = ValueFor(key, ++lsn);
          t.Insert(key, lsn, ValueKind::kInline, value);
          model[key][lsn] = Version{ValueKind::kInline, value};
        }
        turn++;
        turn_changed.notify_all();
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_TRUE(t.LevelsOrdered());
  ASSERT_NO_FATAL_FAILURE(ExpectListMatchesModel(t, model));
  const uint64_t appends = 2u * kWritersHere * kTurns;
  // Each writer's first append to each keyspace descends (32); 37 did when this was written.
  EXPECT_LT(t.descents(), appends / 100) << "of " << appends << " appends";
}

// Reset empties the list; the area is then reusable and old entries never reappear.
TEST(MemTable, ResetEmptiesAndReuses) {
  MemArea area(4u << 20);
  MemTable& t = area.table();
  uint64_t lsn = 0;
  FillRandom(&t, 35, 500, &lsn);
  uint64_t used_before = t.used();
  t.Reset();
  EXPECT_EQ(t.First(), nullptr);
  EXPECT_EQ(t.entries(), 0u);
  EXPECT_EQ(t.kv_bytes(), 0u);
  EXPECT_LT(t.used(), used_before);
  EXPECT_EQ(t.Find("k3", UINT64_MAX), nullptr);
  EXPECT_EQ(t.Seek(""), nullptr);
  t.Insert("only", 1000, ValueKind::kInline, "one");
  const MemNode* n = t.First();
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n->key(), "only");
  EXPECT_EQ(n->value(), "one");
  EXPECT_EQ(t.Next(n), nullptr);
  EXPECT_EQ(t.entries(), 1u);
}

// Empty keys and values, and keys differing only by a trailing zero byte, keep their order.
TEST(MemTable, EdgeKeysAndValues) {
  MemArea area(1u << 20);
  MemTable& t = area.table();
  const std::string keys[] = {std::string(),          std::string("a"),
                              std::string("a\0", 2),  std::string("a\0\0", 3),
                              std::string("\xff", 1), std::string(300, 'b')};
  uint64_t lsn = 0;
  for (int round = 0; round < 2; round++) {
    for (int i = 5; i >= 0; i--) t.Insert(keys[i], ++lsn, ValueKind::kInline, std::string(i, 'v'));
  }
  const MemNode* n = t.First();
  std::vector<std::string> sorted(std::begin(keys), std::end(keys));
  std::sort(sorted.begin(), sorted.end());
  for (const std::string& k : sorted) {
    for (int round = 1; round >= 0; round--) {
      ASSERT_NE(n, nullptr);
      EXPECT_EQ(n->key(), k);
      if (round == 1) {
        EXPECT_GT(n->lsn, t.Next(n)->lsn);
      }
      n = t.Next(n);
    }
  }
  EXPECT_EQ(n, nullptr);
  const MemNode* e = t.Find("", UINT64_MAX);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->key(), "");
  EXPECT_EQ(e->value(), "");
}

// One writer inserting while two readers iterate, Find and Seek continuously: readers always
// see sorted order, complete nodes, every entry already published, and exact snapshot results.
TEST(MemTable, ConcurrentReadersSeeConsistentState) {
  constexpr int kKeys = 3000;
  constexpr int kInserts = 60000;
  MemArea area(64u << 20);
  MemTable& t = area.table();

  // The writer's schedule, fixed up front so that readers can compute exact expectations.
  std::mt19937 rng(36);
  std::vector<int> key_of(kInserts + 1);  // by lsn
  std::vector<std::vector<uint64_t>> lsns_of(kKeys);
  for (uint64_t lsn = 1; lsn <= kInserts; lsn++) {
    key_of[lsn] = int(rng() % kKeys);
    lsns_of[key_of[lsn]].push_back(lsn);
  }
  auto key_name = [](int k) { return "key" + std::to_string(k); };

  std::atomic<uint64_t> published{0};  // every lsn <= published has been inserted
  std::atomic<bool> done{false};
  std::atomic<int> failures{0};
  std::atomic<uint64_t> iterations{0}, finds{0};

  auto fail = [&](const std::string& what) {
    if (failures.fetch_add(1) < 10) ADD_FAILURE() << what;
  };

  auto reader = [&](uint32_t seed) {
    std::mt19937 r(seed);
    do {
      // Full iteration.
      uint64_t p = published.load(std::memory_order_acquire);
      uint64_t seen_published = 0;
      std::string prev_key;
      uint64_t prev_lsn = 0;
      bool first = true;
      for (const MemNode* n = t.First(); n; n = t.Next(n)) {
        std::string key(n->key());
        if (n->lsn == 0 || n->lsn > kInserts || key != key_name(key_of[n->lsn]) ||
            n->value() != ValueFor(key, n->lsn) || n->value_kind() != ValueKind::kInline) {
          fail("torn node: " + key + "@" + std::to_string(n->lsn));
          break;
        }
        if (!first && (key < prev_key || (key == prev_key && n->lsn >= prev_lsn))) {
          fail("order: " + prev_key + "@" + std::to_string(prev_lsn) + " then " + key + "@" +
               std::to_string(n->lsn));
          break;
        }
        if (n->lsn <= p) seen_published++;
        prev_key = std::move(key);
        prev_lsn = n->lsn;
        first = false;
      }
      if (seen_published != p) {
        fail("iteration saw " + std::to_string(seen_published) + " of " + std::to_string(p) +
             " published entries");
      }
      iterations++;
      // Point lookups at snapshots that are fully published.
      for (int i = 0; i < 200; i++) {
        uint64_t pub = published.load(std::memory_order_acquire);
        int k = int(r() % kKeys);
        uint64_t max_lsn = pub ? r() % (pub + 1) : 0;
        const std::vector<uint64_t>& ls = lsns_of[k];
        auto it = std::upper_bound(ls.begin(), ls.end(), max_lsn);
        uint64_t want = it == ls.begin() ? 0 : *std::prev(it);
        std::string key = key_name(k);
        const MemNode* n = t.Find(key, max_lsn);
        if (want == 0) {
          if (n) fail("Find " + key + " <= " + std::to_string(max_lsn) + " found a version");
        } else if (!n || n->lsn != want || n->key() != key || n->value() != ValueFor(key, want)) {
          fail("Find " + key + " <= " + std::to_string(max_lsn) + ": want " + std::to_string(want) +
               " got " + (n ? std::to_string(n->lsn) : "null"));
        }
        // Seek returns some version of a key >= target, never a smaller key.
        const MemNode* s = t.Seek(key);
        if (s && s->key() < key) fail("Seek went backwards for " + key);
        if (want && !s) fail("Seek lost " + key);
        finds++;
      }
    } while (!done.load(std::memory_order_acquire) && failures.load() == 0);
  };

  std::thread r1(reader, 1), r2(reader, 2);
  for (uint64_t lsn = 1; lsn <= kInserts; lsn++) {
    std::string key = key_name(key_of[lsn]);
    std::string value = ValueFor(key, lsn);
    ASSERT_TRUE(t.HasRoom(MemTable::EntrySpace(key.size(), value.size())));
    t.Insert(key, lsn, ValueKind::kInline, value);
    published.store(lsn, std::memory_order_release);
    if (lsn % 10000 == 0) {
      // Let the readers complete a few passes mid-stream so that the phases really overlap.
      uint64_t target = iterations.load() + 2;
      for (int spin = 0; spin < 2000 && iterations.load() < target; spin++) {
        std::this_thread::sleep_for(std::chrono::microseconds(500));
      }
    }
  }
  done.store(true, std::memory_order_release);
  r1.join();
  r2.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GE(iterations.load(), 12u);
  EXPECT_EQ(t.entries(), uint64_t(kInserts));
  // A final single-threaded pass agrees with the schedule.
  uint64_t count = 0;
  for (const MemNode* n = t.First(); n; n = t.Next(n)) count++;
  EXPECT_EQ(count, uint64_t(kInserts));
}

}  // namespace
}  // namespace slipstream::engine

namespace slipstream::engine {
namespace {

// Several writers take turns under a mutex (the engine's write mutex) while each reads its
// own key back without it: a lookup must never miss a version already inserted.
TEST(MemTable, SerializedWritersReadTheirOwnWrites) {
  MemArea area(160u << 20);
  MemTable& t = area.table();
  std::mutex write_mu;
  std::atomic<uint64_t> next_lsn{1};
  std::atomic<int> failures{0};
  constexpr int kWritersHere = 3;
  std::vector<std::thread> threads;
  for (int w = 0; w < kWritersHere; w++) {
    threads.emplace_back([&, w] {
      std::mt19937 rng(w);
      std::string padding(400, char('a' + w));
      for (int i = 0; i < 20000 && failures.load() == 0; i++) {
        std::string own = "counter" + std::to_string(w * 5 + int(rng() % 5));
        uint64_t lsn;
        {
          std::lock_guard<std::mutex> g(write_mu);
          lsn = next_lsn.fetch_add(1);
          t.Insert(own, lsn, ValueKind::kInline, padding);
          uint64_t other = next_lsn.fetch_add(1);
          t.Insert("version-" + std::to_string(w) + "-" + std::to_string(i), other,
                   ValueKind::kInline, padding);
        }
        const MemNode* n = t.Find(own, UINT64_MAX);
        if (n == nullptr || n->lsn != lsn) {
          if (failures.fetch_add(1) == 0) {
            ADD_FAILURE() << "writer " << w << " lost " << own << "@" << lsn << ": found "
                          << (n ? std::to_string(n->lsn) : "nothing");
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace slipstream::engine

namespace slipstream::engine {
namespace {

// A lookup must not miss a key while another thread inserts keys that sort just before it:
// the descent's last link may change under the reader, which must use the node it compared.
TEST(MemTable, LookupsSurviveInsertsRightBeforeTheKey) {
  MemArea area(128u << 20);
  MemTable& t = area.table();
  constexpr int kTargets = 64;
  uint64_t lsn = 1;
  for (int i = 0; i < kTargets; i++) {
    t.Insert("key" + std::to_string(1000 + i) + "b", lsn++, ValueKind::kInline, "target");
  }
  std::atomic<bool> done{false};
  std::atomic<uint64_t> misses{0}, lookups{0};
  std::thread reader([&] {
    std::mt19937 rng(5);
    while (!done.load(std::memory_order_relaxed)) {
      std::string key = "key" + std::to_string(1000 + int(rng() % kTargets)) + "b";
      if (t.Find(key, UINT64_MAX) == nullptr) misses++;
      lookups++;
    }
  });
  std::mt19937 rng(6);
  for (int i = 0; i < 400000; i++) {
    // Ever larger "key1234a<n>" keys land right before the target "key1234b".
    char suffix[16];
    snprintf(suffix, sizeof(suffix), "a%08d", i);
    t.Insert("key" + std::to_string(1000 + int(rng() % kTargets)) + suffix, lsn++,
             ValueKind::kInline, "x");
  }
  done.store(true);
  reader.join();
  EXPECT_EQ(misses.load(), 0u) << "of " << lookups.load() << " lookups";
}

// A reader never reads a version of a key older than one it read before, while a writer adds
// versions: with a complete index, with a full one that leaves the keys to the skiplist, and
// with none. The skiplist shows a node a moment before the index does, so a Find that
// answered one key from each in turn could go back.
TEST_P(MemTableIndexes, ReadsNeverGoBack) {
  MemArea area(64u << 20, GetParam());
  MemTable& t = area.table();
  uint64_t lsn = 1;
  // Fill a small index past its cap with keys nobody reads, so later keys are not indexed.
  for (int i = 0; i < 900; i++) {
    t.Insert("filler" + std::to_string(i), lsn++, ValueKind::kInline, "f");
  }
  constexpr int kKeys = 8;
  auto key_of = [](int k) { return "key" + std::to_string(k); };
  for (int k = 0; k < kKeys; k++) t.Insert(key_of(k), lsn++, ValueKind::kInline, "v");
  std::atomic<bool> done{false};
  std::atomic<uint64_t> back{0}, reads{0};
  std::thread reader([&] {
    uint64_t seen[kKeys] = {};
    std::mt19937 rng(8);
    while (!done.load(std::memory_order_relaxed)) {
      int at = int(rng() % kKeys);
      for (int k = at; k < std::min(kKeys, at + 1 + int(rng() % 4)); k++) {
        const MemNode* n = t.Find(key_of(k), UINT64_MAX);
        if (n == nullptr || n->lsn < seen[k]) back++;
        if (n != nullptr) seen[k] = std::max(seen[k], n->lsn);
        reads++;
      }
    }
  });
  for (int i = 0; i < 300000; i++) t.Insert(key_of(i % kKeys), lsn++, ValueKind::kInline, "w");
  done.store(true);
  reader.join();
  EXPECT_EQ(back.load(), 0u) << "of " << reads.load() << " reads";
  EXPECT_EQ(t.IndexComplete(), GetParam() == (1u << 16));
}

}  // namespace
}  // namespace slipstream::engine
