// Iterator::SkipTo: the count of entries passed and the entry it lands on, across memtables,
// levels, deletions, upper bounds and values of every size class.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>

#include "test_util.h"

namespace slipstream::engine {
namespace {

std::string Key(int i) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "k%07d", i);
  return buf;
}

// Values of the three classes: inline in leaves, in the medium log, in the large log.
std::string ValueFor(int i, int round) {
  static const size_t kSizes[] = {12, 400, 3000};
  return test::Value(kSizes[(i + round) % 3], i * 31 + round);
}

// Fills keyspace `ks` with a history (older versions compacted into levels, newer ones and
// deletions in the memtable) and returns what it holds.
std::map<std::string, std::string> Fill(test::TestEngine& t, KeyspaceId ks) {
  std::map<std::string, std::string> model;
  std::mt19937 rng(5);
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < 3000; i++) {
      if (rng() % 4 == 0) continue;
      if (round > 0 && rng() % 5 == 0) {
        EXPECT_TRUE(t->Delete(ks, Key(i)).ok());
        model.erase(Key(i));
      } else {
        std::string v = ValueFor(i, round);
        EXPECT_TRUE(t->Put(ks, Key(i), v).ok());
        model[Key(i)] = v;
      }
    }
    if (round < 2) {
      EXPECT_TRUE(t->CompactAll().ok());
    }
  }
  return model;
}

TEST(IteratorSkip, CountsThePassedEntriesAndLandsOnTheFirstKeyAtOrAfterTheTarget) {
  test::TestEngine t;
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(1, &ks).ok());
  std::map<std::string, std::string> model = Fill(t, ks);

  auto it = t->NewIterator(ks);
  it->SeekToFirst();
  auto at = model.begin();
  std::mt19937 rng(9);
  int target = 0;
  while (it->Valid()) {
    target += int(rng() % 120);
    auto want = model.lower_bound(Key(target));
    uint64_t expected = uint64_t(std::distance(at, want));
    ASSERT_EQ(it->SkipTo(Key(target)), expected) << "to " << Key(target);
    if (want == model.end()) {
      EXPECT_FALSE(it->Valid());
      break;
    }
    ASSERT_TRUE(it->Valid());
    ASSERT_EQ(it->key(), want->first);
    ASSERT_EQ(it->value(), want->second) << "the landing entry's value is read";
    at = want;
  }
  EXPECT_TRUE(it->status().ok()) << it->status().ToString();
}

TEST(IteratorSkip, NeverMovesBackwardsAndStopsAtTheUpperBound) {
  test::TestEngine t;
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(1, &ks).ok());
  std::map<std::string, std::string> model = Fill(t, ks);

  auto it = t->NewIterator(ks);
  it->Seek(Key(1000));
  auto at = model.lower_bound(Key(1000));
  ASSERT_EQ(it->key(), at->first);
  EXPECT_EQ(it->SkipTo(Key(10)), 0u);  // a target behind: nothing passed, still there
  EXPECT_EQ(it->key(), at->first);
  EXPECT_EQ(it->value(), at->second);

  it->SetUpperBound(Key(2000));
  uint64_t expected = uint64_t(std::distance(at, model.lower_bound(Key(2000))));
  EXPECT_EQ(it->SkipTo(Key(2500)), expected);  // every entry below the bound, then the end
  EXPECT_FALSE(it->Valid());
  EXPECT_TRUE(it->status().ok()) << it->status().ToString();
}

// A 24-byte value whose byte 19 has bit 0x08 set or not (a marker, as the table AM's
// redirects), the rest of the bytes from `seed`.
std::string MarkerValue(bool marked, int seed) {
  std::string v = test::Value(24, seed);
  v[19] = char(marked ? (uint8_t(v[19]) | 0x08) : (uint8_t(v[19]) & ~0x08));
  return v;
}

// Checks SkipTo's marked counts against a model over a history of markers and other values.
void CheckMarkedCounts(test::TestEngine& t) {
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(1, &ks).ok());
  // Markers, unmarked values of the marker's length, and longer values with the bit set
  // (inline, medium and large), overwritten across levels and the memtable, some deleted.
  std::map<std::string, std::string> model;
  std::mt19937 rng(11);
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < 3000; i++) {
      uint32_t r = rng();
      if (r % 4 == 0) continue;
      if (round > 0 && r % 7 == 1) {
        ASSERT_TRUE(t->Delete(ks, Key(i)).ok());
        model.erase(Key(i));
        continue;
      }
      std::string v;
      switch ((r >> 4) % 4) {
        case 0:
          v = MarkerValue(true, i + round);
          break;
        case 1:
          v = MarkerValue(false, i + round);
          break;
        default: {
          static const size_t kSizes[] = {25, 400, 3000};
          v = test::Value(kSizes[(r >> 8) % 3], i);
          v[19] = char(0xff);
        }
      }
      ASSERT_TRUE(t->Put(ks, Key(i), v).ok());
      model[Key(i)] = v;
    }
    if (round < 2) ASSERT_TRUE(t->CompactAll().ok());
  }
  Iterator::SkipMark mark;
  mark.size = 24;
  mark.offset = 19;
  mark.mask = 0x08;
  auto is_marked = [](const std::string& v) {
    return v.size() == 24 && (uint8_t(v[19]) & 0x08) != 0;
  };

  auto it = t->NewIterator(ks);
  it->SeekToFirst();
  auto at = model.begin();
  uint64_t marked_total = 0;
  int target = 0;
  while (it->Valid()) {
    target += int(rng() % 150);
    auto want = model.lower_bound(Key(target));
    uint64_t expected_marked = 0;
    for (auto m = at; m != want; ++m) expected_marked += is_marked(m->second) ? 1 : 0;
    uint64_t marked = 0;
    ASSERT_EQ(it->SkipTo(Key(target), mark, &marked), uint64_t(std::distance(at, want)));
    ASSERT_EQ(marked, expected_marked) << "to " << Key(target);
    marked_total += marked;
    if (want == model.end()) break;
    ASSERT_EQ(it->key(), want->first);
    ASSERT_EQ(it->value(), want->second);
    at = want;
  }
  EXPECT_TRUE(it->status().ok()) << it->status().ToString();
  EXPECT_GT(marked_total, 300u);
  // The plain SkipTo counts nothing apart, and neither does an empty mark.
  it->SeekToFirst();
  uint64_t marked = 0;
  EXPECT_EQ(it->SkipTo(Key(5000), Iterator::SkipMark(), &marked), model.size());
  EXPECT_EQ(marked, 0u);
}

TEST(IteratorSkip, CountsMarkedEntriesApartWhereverTheyAreStored) {
  test::TestEngine t;
  CheckMarkedCounts(t);
}

// With a small-value threshold below a marker's size, markers go to the medium log when
// compacted (and stay there: medium values in place only from a level never reached).
Options MarkersInTheMediumLog(const std::string& dir) {
  Options o = test::SmallOptions(dir);
  o.small_threshold = 16;
  o.medium_inplace_level = o.max_levels;
  return o;
}

TEST(IteratorSkip, CountsMarkedEntriesApartInTheMediumLog) {
  test::TestEngine t(MarkersInTheMediumLog);
  CheckMarkedCounts(t);
}

}  // namespace
}  // namespace slipstream::engine
