// A node's checksum is checked the first time a process reads it, not on every read: the
// NodeCheckCache on its own, and end to end what a process that already checked a node, a
// fresh attachment, Verify and a compaction each make of a node damaged afterwards.
#include "node_check_cache.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <thread>
#include <vector>

#include "node.h"
#include "test_util.h"

namespace slipstream::engine::test {
namespace {

constexpr uint32_t kNodes = 256;  // node slots per segment: 2 MiB segments of 8 KiB nodes

// Marked nodes read as checked, and nothing else does: other slots, other segments, other
// trees, slots and segments past the end.
TEST(NodeCheckCache, MarkThenChecked) {
  NodeCheckCache cache;
  ASSERT_TRUE(cache.Init(64, kNodes));
  EXPECT_FALSE(cache.Checked(5, 7, 3));
  cache.MarkChecked(5, 7, 3);
  cache.MarkChecked(5, 7, 200);
  EXPECT_TRUE(cache.Checked(5, 7, 3));
  EXPECT_TRUE(cache.Checked(5, 7, 200));
  EXPECT_FALSE(cache.Checked(5, 7, 4));
  EXPECT_FALSE(cache.Checked(5, 7, 67));  // the same bit of the next word
  EXPECT_FALSE(cache.Checked(5, 8, 3));   // another tree
  EXPECT_FALSE(cache.Checked(5, 0, 3));
  EXPECT_FALSE(cache.Checked(64, 7, 3));  // past the last segment
  EXPECT_FALSE(cache.Checked(5, 7, kNodes));
  cache.MarkChecked(64, 7, 3);  // ignored, not written out of bounds
  cache.MarkChecked(5, 7, kNodes);
  EXPECT_FALSE(cache.Checked(64, 7, 3));
  EXPECT_FALSE(cache.Init(64, kNodes));  // once only
}

// A segment seen with a new (larger) owner forgets every bit of the old one, and a late mark
// for the old owner neither brings them back nor disturbs the new owner's bits.
TEST(NodeCheckCache, OwnerChangeResetsTheSegment) {
  NodeCheckCache cache;
  ASSERT_TRUE(cache.Init(16, kNodes));
  for (uint32_t n = 0; n < kNodes; n += 3) cache.MarkChecked(2, 10, n);
  EXPECT_TRUE(cache.Checked(2, 10, 0));
  EXPECT_TRUE(cache.Checked(2, 10, 99));
  cache.MarkChecked(2, 11, 5);  // reused by tree 11
  EXPECT_TRUE(cache.Checked(2, 11, 5));
  for (uint32_t n = 0; n < kNodes; n++) {
    EXPECT_FALSE(cache.Checked(2, 10, n)) << n;
    if (n != 5) {
      EXPECT_FALSE(cache.Checked(2, 11, n)) << n;
    }
  }
  cache.MarkChecked(2, 10, 0);  // an older tree: tree ids only grow
  EXPECT_FALSE(cache.Checked(2, 10, 0));
  EXPECT_TRUE(cache.Checked(2, 11, 5));
  EXPECT_FALSE(cache.Checked(2, 11, 0));
}

// Segments keep their own owner and bits.
TEST(NodeCheckCache, SegmentsAreIndependent) {
  NodeCheckCache cache;
  ASSERT_TRUE(cache.Init(16, kNodes));
  cache.MarkChecked(3, 20, 1);
  cache.MarkChecked(4, 21, 1);
  cache.MarkChecked(5, 20, 255);
  EXPECT_TRUE(cache.Checked(3, 20, 1));
  EXPECT_TRUE(cache.Checked(4, 21, 1));
  EXPECT_TRUE(cache.Checked(5, 20, 255));
  EXPECT_FALSE(cache.Checked(4, 20, 1));
  EXPECT_FALSE(cache.Checked(3, 21, 1));
  EXPECT_FALSE(cache.Checked(5, 20, 1));
  cache.MarkChecked(4, 22, 7);  // segment 4 changes owner; 3 and 5 keep theirs
  EXPECT_TRUE(cache.Checked(3, 20, 1));
  EXPECT_TRUE(cache.Checked(5, 20, 255));
  EXPECT_FALSE(cache.Checked(4, 21, 1));
  EXPECT_TRUE(cache.Checked(4, 22, 7));
}

// An uninitialised cache (or one that could not reserve its memory) knows no node.
TEST(NodeCheckCache, EmptyCacheChecksEverything) {
  NodeCheckCache cache;
  cache.MarkChecked(1, 1, 1);
  EXPECT_FALSE(cache.Checked(1, 1, 1));
}

// Threads of one process marking one fresh segment at once (so racing on its reset): a reset
// may drop a bit another thread set, never invent one; every thread marks every node after
// its own reset, so all are marked once all are done.
TEST(NodeCheckCache, ConcurrentMarks) {
  NodeCheckCache cache;
  ASSERT_TRUE(cache.Init(8, kNodes));
  for (uint32_t tree = 1; tree <= 20; tree++) {
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; t++) {
      threads.emplace_back([&cache, tree, t] {
        for (uint32_t i = 0; i < kNodes; i++) {
          uint32_t n = (i + uint32_t(t) * 61) % kNodes;
          cache.MarkChecked(1, tree, n);
          cache.Checked(1, tree, (n + 1) % kNodes);
        }
      });
    }
    for (auto& th : threads) th.join();
    for (uint32_t n = 0; n < kNodes; n++)
      ASSERT_TRUE(cache.Checked(1, tree, n)) << tree << " " << n;
    ASSERT_FALSE(cache.Checked(1, tree - 1, 0));
    ASSERT_FALSE(cache.Checked(2, tree, 0));
  }
}

std::string KeyOf(int i) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "key%05d", i);
  return buf;
}

std::string ValueOf(int i) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "value-%05d-abcdefghijklmnopqrstuvwxyz", i);
  return buf;
}

// Which byte of a value the damage flips: its first letter ('a' becomes '`').
constexpr size_t kDamagedByte = 12;

// Flips one byte inside `value` in every leaf node of the device file holding it (the live
// tree's leaf, and any stale copy in a freed segment), so the node still decodes and only its
// checksum tells. Returns how many leaves were changed.
int DamageValueInLeaves(const std::string& path, uint32_t node_size, const std::string& value) {
  int fd = open(path.c_str(), O_RDWR);
  EXPECT_GE(fd, 0);
  off_t size = lseek(fd, 0, SEEK_END);
  std::string node(node_size, '\0');
  int damaged = 0;
  for (off_t off = 0; off + off_t(node_size) <= size; off += node_size) {
    EXPECT_EQ(pread(fd, node.data(), node_size, off), ssize_t(node_size));
    uint32_t magic;
    std::memcpy(&magic, node.data(), 4);
    size_t at = node.find(value);
    if (magic != kLeafMagic || at == std::string::npos) continue;
    char c = char(node[at + kDamagedByte] ^ 0x01);
    EXPECT_EQ(pwrite(fd, &c, 1, off + off_t(at + kDamagedByte)), 1);
    damaged++;
  }
  close(fd);
  return damaged;
}

// End to end, with the trade-off the cache makes. A node this process has already checked is
// not checked again: if its bytes change afterwards (a stray write, a flipped bit in the page
// cache, a file edited behind the engine), this process goes on reading them unchecked (here:
// a value with one byte changed) until it closes its engine. Everything that must not trust an
// earlier read still checks each time: Verify, a compaction (which would otherwise write the
// damage out under a fresh checksum), and any other process or attachment, whose cache starts
// empty. verify_checksums = false still means never checking at all.
TEST(NodeCheckCacheEngine, ChecksumCheckedOncePerProcess) {
  // Without the row cache: it would answer the reads below from its copies of the values, and
  // this test is about what reads of the device check.
  TestEngine t([](const std::string& dir) {
    Options o = SmallOptions(dir);
    o.row_cache_size = 0;
    return o;
  });
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(1, &ks).ok());
  constexpr int kKeys = 2000;
  for (int i = 0; i < kKeys; i++) ASSERT_TRUE(t->Put(ks, KeyOf(i), ValueOf(i)).ok());
  ASSERT_TRUE(t->CompactAll().ok());  // one tree at L1, the memtables empty
  ASSERT_TRUE(t->Verify().ok());

  // Every node of the tree passes its checksum once in this engine: Gets reach each leaf
  // through the root, and the iterator walks them all.
  std::string got;
  for (int i = 0; i < kKeys; i++) {
    ASSERT_TRUE(t->Get(ks, KeyOf(i), &got).ok()) << i;
    ASSERT_EQ(got, ValueOf(i));
  }
  auto it = t->NewIterator(ks);
  int seen = 0;
  for (it->SeekToFirst(); it->Valid(); it->Next()) seen++;
  ASSERT_TRUE(it->status().ok()) << it->status().ToString();
  ASSERT_EQ(seen, kKeys);
  it.reset();

  // Damage the payload of the leaf holding key 999 (its value's bytes; header, offsets and
  // keys intact). The device is a shared mapping of the file: every attachment sees it at once.
  const int kVictim = 999;
  ASSERT_GE(DamageValueInLeaves(t.dir.path() + "/segments", t.options.node_size, ValueOf(kVictim)),
            1);
  std::string damaged = ValueOf(kVictim);
  damaged[kDamagedByte] = char(damaged[kDamagedByte] ^ 0x01);

  // (c) This engine checked that leaf before the damage and does not check it again: the read
  // succeeds with the changed byte. This is the intended trade-off, not a wish.
  ASSERT_TRUE(t->Get(ks, KeyOf(kVictim), &got).ok());
  EXPECT_EQ(got, damaged);
  it = t->NewIterator(ks);
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
  }
  EXPECT_TRUE(it->status().ok()) << it->status().ToString();
  it.reset();

  // (a) Verify checks every checksum every time, whatever this process read before.
  Status v = t->Verify();
  EXPECT_TRUE(v.IsCorruption()) << v.ToString();
  EXPECT_NE(v.message().find("checksum"), std::string::npos) << v.ToString();

  // (b) A fresh attachment (as another backend process would be) has checked nothing yet: its
  // first read of the leaf reports the damage, from Get and from an iterator alike, while
  // leaves far from it read fine.
  {
    std::unique_ptr<Engine> other;
    ASSERT_TRUE(Engine::Open(t.options, t.arena.base(), t.arena.size(), &other).ok());
    Status s = other->Get(ks, KeyOf(kVictim), &got);
    EXPECT_TRUE(s.IsCorruption()) << s.ToString();
    EXPECT_NE(s.message().find("checksum"), std::string::npos) << s.ToString();
    s = other->Get(ks, KeyOf(kVictim), &got);  // and again: a failed check marks nothing
    EXPECT_TRUE(s.IsCorruption()) << s.ToString();
    ASSERT_TRUE(other->Get(ks, KeyOf(0), &got).ok());
    EXPECT_EQ(got, ValueOf(0));
    auto oit = other->NewIterator(ks);
    for (oit->SeekToFirst(); oit->Valid(); oit->Next()) {
    }
    EXPECT_TRUE(oit->status().IsCorruption()) << oit->status().ToString();
  }

  // verify_checksums = false: never verified, by a fresh attachment either.
  {
    Options unchecked = t.options;
    unchecked.verify_checksums = false;
    std::unique_ptr<Engine> other;
    ASSERT_TRUE(Engine::Open(unchecked, t.arena.base(), t.arena.size(), &other).ok());
    ASSERT_TRUE(other->Get(ks, KeyOf(kVictim), &got).ok());
    EXPECT_EQ(got, damaged);
  }

  // A compaction that keeps the damaged leaf as it stands (no new key falls into it) does not
  // read it, and leaves it as damaged as it was: still found by Verify, not laundered.
  ASSERT_TRUE(t->Put(ks, KeyOf(kKeys), ValueOf(kKeys)).ok());
  ASSERT_TRUE(t->CompactAll().ok());
  ASSERT_GT(t->GetStats().compaction_leaves_kept, 0u);
  v = t->Verify();
  EXPECT_TRUE(v.IsCorruption()) << v.ToString();

  // A compaction reads the leaves it merges with every checksum checked, even in this engine,
  // so it refuses the damaged leaf instead of rewriting it under a new checksum.
  ASSERT_TRUE(t->Put(ks, KeyOf(kVictim), ValueOf(kVictim)).ok());
  Status c = t->CompactAll();
  EXPECT_TRUE(c.IsCorruption()) << c.ToString();
}

}  // namespace
}  // namespace slipstream::engine::test
