// Engine::ApproximateSize: exact over memtables, close over levels shared by several keyspaces,
// zero for empty keyspaces, an error for keyspaces that are not live or trees that are damaged.
#include <fcntl.h>

#include <random>
#include <string>
#include <vector>

#include "test_util.h"

namespace slipstream::engine::test {
namespace {

// The bytes ApproximateSize counts for one version of a row: the key with its keyspace prefix
// and the value.
uint64_t RowBytes(const std::string& key, size_t value_size) {
  return 4 + key.size() + value_size;
}

// The estimate for `ks`, which must be available.
uint64_t SizeOf(TestEngine& t, KeyspaceId ks) {
  uint64_t bytes = 0;
  Status s = t->ApproximateSize(ks, &bytes);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return bytes;
}

// Writes `rows` rows of `value_size` bytes to `ks` and returns their bytes.
uint64_t Fill(TestEngine& t, KeyspaceId ks, int rows, size_t value_size, int seed) {
  uint64_t bytes = 0;
  for (int i = 0; i < rows; i++) {
    std::string key = "row" + std::to_string(1000000 + i);
    EXPECT_TRUE(t->Put(ks, key, Value(value_size, seed + i)).ok());
    bytes += RowBytes(key, value_size);
  }
  return bytes;
}

// Checks that an estimate is within `tolerance` (a fraction) of the truth.
void ExpectNear(uint64_t estimate, uint64_t truth, double tolerance, const char* what) {
  EXPECT_NEAR(double(estimate), double(truth), tolerance * double(truth))
      << what << ": estimate " << estimate << ", true bytes " << truth;
}

TEST(ApproximateSize, EmptyKeyspaceIsZero) {
  TestEngine t;
  KeyspaceId a, b, c;
  ASSERT_TRUE(t->CreateKeyspace(1, &a).ok());
  ASSERT_TRUE(t->CreateKeyspace(2, &b).ok());
  ASSERT_TRUE(t->CreateKeyspace(3, &c).ok());
  EXPECT_EQ(SizeOf(t, a), 0u);
  Fill(t, a, 20000, 40, 1);
  Fill(t, c, 20000, 40, 2);
  ASSERT_TRUE(t->CompactAll().ok());
  KeyspaceId d;
  ASSERT_TRUE(t->CreateKeyspace(4, &d).ok());
  // b lies between two keyspaces of the same trees, d after every key.
  EXPECT_EQ(SizeOf(t, b), 0u);
  EXPECT_EQ(SizeOf(t, d), 0u);
}

// Every version in the memtable counts: overwrites, tombstones and values of every size class
// (a large value at its own size, not that of its pointer).
TEST(ApproximateSize, MemtableIsCountedExactly) {
  TestEngine t;
  KeyspaceId before, ks, after;
  ASSERT_TRUE(t->CreateKeyspace(1, &before).ok());
  ASSERT_TRUE(t->CreateKeyspace(2, &ks).ok());
  ASSERT_TRUE(t->CreateKeyspace(3, &after).ok());
  Fill(t, before, 100, 50, 1);
  Fill(t, after, 100, 5000, 2);
  uint64_t expected = 0;
  int i = 0;
  for (size_t size : {0, 5, 90, 100, 500, 999, 1000, 5000, 30000}) {
    for (int copy = 0; copy < 3; copy++, i++) {
      std::string key = "k" + std::to_string(size) + "-" + std::to_string(copy % 2);
      ASSERT_TRUE(t->Put(ks, key, Value(size, i)).ok());
      expected += RowBytes(key, size);
    }
  }
  ASSERT_TRUE(t->Delete(ks, "k5-0").ok());
  ASSERT_TRUE(t->Delete(ks, "never-written").ok());
  expected += RowBytes("k5-0", 0) + RowBytes("never-written", 0);
  ASSERT_EQ(t->GetStats().compactions, 0u);
  EXPECT_EQ(SizeOf(t, ks), expected);
}

// Levels shared by three keyspaces: each keyspace's estimate follows its own part of the trees,
// not the trees' totals, even when its leaves hold pointers to values in the large log and its
// neighbours' hold small values inline.
TEST(ApproximateSize, LevelsFollowTheKeyspaceRange) {
  TestEngine t;
  KeyspaceId big1, small, big2;
  ASSERT_TRUE(t->CreateKeyspace(1, &big1).ok());
  ASSERT_TRUE(t->CreateKeyspace(2, &small).ok());
  ASSERT_TRUE(t->CreateKeyspace(3, &big2).ok());
  uint64_t truth1 = Fill(t, big1, 40000, 30, 1);
  uint64_t truth_small = Fill(t, small, 1000, 3000, 2);  // in the large log
  uint64_t truth2 = Fill(t, big2, 25000, 60, 3);
  ASSERT_TRUE(t->CompactAll().ok());
  Stats st = t->GetStats();
  ASSERT_GT(st.compactions, 0u);
  ASSERT_EQ(st.l0_entries, 0u);
  ExpectNear(SizeOf(t, big1), truth1, 0.25, "first big keyspace");
  ExpectNear(SizeOf(t, small), truth_small, 0.25, "small keyspace");
  ExpectNear(SizeOf(t, big2), truth2, 0.25, "second big keyspace");

  // Rows still in the memtable add to those in the levels.
  uint64_t more = Fill(t, small, 200, 50, 4);  // overwrites: a second version of each
  ExpectNear(SizeOf(t, small), truth_small + more, 0.25, "small keyspace with a memtable");
}

// With versions spread over L0 and several levels, the keyspaces' estimates add up to what the
// levels and memtables hold in all.
TEST(ApproximateSize, EstimatesAddUpToTheLevels) {
  TestEngine t;
  std::vector<KeyspaceId> keyspaces(4);
  for (size_t k = 0; k < keyspaces.size(); k++) {
    ASSERT_TRUE(t->CreateKeyspace(k + 1, &keyspaces[k]).ok());
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 100000; i++) {
    size_t k = rng() % keyspaces.size();
    std::string key = "key" + std::to_string(rng() % (6000 * (k + 1)));
    size_t size = k == 1 ? 300 + rng() % 400 : 10 + rng() % 60 * (k + 1);
    if (rng() % 20 == 0) {
      ASSERT_TRUE(t->Delete(keyspaces[k], key).ok());
    } else {
      ASSERT_TRUE(t->Put(keyspaces[k], key, Value(size, i)).ok());
    }
    if (i == 49999) {  // the last level; later writes land above it
      ASSERT_TRUE(t->CompactAll().ok());
    }
    if (i % 10000 == 9999) {
      while (t->DoBackgroundWork()) {
      }
    }
  }
  Stats st = t->GetStats();
  uint64_t held = st.l0_bytes;
  int levels = 0;
  std::string shape;
  for (const LevelStats& l : st.levels) {
    held += l.bytes;
    levels += l.entries > 0;
    shape += " L" + std::to_string(l.level) + "=" + std::to_string(l.entries);
  }
  ASSERT_GE(levels, 2) << shape;
  ASSERT_GT(st.l0_entries, 0u);
  uint64_t sum = 0;
  for (KeyspaceId ks : keyspaces) sum += SizeOf(t, ks);
  ExpectNear(sum, held, 0.1, "all keyspaces");
}

TEST(ApproximateSize, DeletesShrinkItAfterCompaction) {
  TestEngine t;
  KeyspaceId before, ks, after;
  ASSERT_TRUE(t->CreateKeyspace(1, &before).ok());
  ASSERT_TRUE(t->CreateKeyspace(2, &ks).ok());
  ASSERT_TRUE(t->CreateKeyspace(3, &after).ok());
  Fill(t, before, 20000, 40, 1);
  uint64_t truth = Fill(t, ks, 20000, 40, 2);
  Fill(t, after, 20000, 40, 3);
  ASSERT_TRUE(t->CompactAll().ok());
  uint64_t full = SizeOf(t, ks);
  ExpectNear(full, truth, 0.25, "before the deletes");
  uint64_t deleted = 0;
  for (int i = 0; i < 20000; i += 2) {
    std::string key = "row" + std::to_string(1000000 + i);
    ASSERT_TRUE(t->Delete(ks, key).ok());
    deleted += RowBytes(key, 40);
  }
  ASSERT_TRUE(t->CompactAll().ok());
  uint64_t half = SizeOf(t, ks);
  ExpectNear(half, truth - deleted, 0.25, "after deleting half");
  EXPECT_LT(half, full * 3 / 4);
  for (int i = 1; i < 20000; i += 2) {
    ASSERT_TRUE(t->Delete(ks, "row" + std::to_string(1000000 + i)).ok());
  }
  ASSERT_TRUE(t->CompactAll().ok());
  EXPECT_EQ(SizeOf(t, ks), 0u);
}

TEST(ApproximateSize, KeyspaceThatIsNotLiveIsRefused) {
  TestEngine t;
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(1, &ks).ok());
  Fill(t, ks, 100, 40, 1);
  uint64_t bytes = 1;
  EXPECT_TRUE(t->ApproximateSize(ks + 1, &bytes).IsInvalidArgument());
  ASSERT_TRUE(t->DropKeyspace(ks).ok());
  Status s = t->ApproximateSize(ks, &bytes);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_EQ(bytes, 0u);
}

// Damaged nodes on the way down are reported, not followed.
TEST(ApproximateSize, DamagedTreeIsReported) {
  TestEngine t;
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(1, &ks).ok());
  Fill(t, ks, 20000, 40, 1);
  ASSERT_TRUE(t->CompactAll().ok());
  // Every index node (leaves and inner ones) gets a flipped byte past its header.
  std::string path = t.dir.path() + "/segments";
  int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  off_t size = lseek(fd, 0, SEEK_END);
  int damaged = 0;
  for (off_t off = 0; off < size; off += t.options.node_size) {
    uint32_t magic = 0;
    ASSERT_EQ(pread(fd, &magic, 4, off), 4);
    if (magic != 0x4641454c && magic != 0x58444e49) continue;  // "LEAF", "INDX"
    char c;
    ASSERT_EQ(pread(fd, &c, 1, off + 40), 1);
    c = char(c ^ 0x5a);
    ASSERT_EQ(pwrite(fd, &c, 1, off + 40), 1);
    damaged++;
  }
  close(fd);
  ASSERT_GT(damaged, 0);
  t.Reopen();
  uint64_t bytes;
  Status s = t->ApproximateSize(ks, &bytes);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
}

}  // namespace
}  // namespace slipstream::engine::test
