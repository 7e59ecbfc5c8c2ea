// The readers of a level's B+-tree (btree.h) on a damaged tree or descriptor: lookups, scans,
// size estimates and bloom probes end with Corruption (or, for the bloom filter, admit the key),
// never crash, loop or allocate by a damaged number. Regressions of tests/fuzz/tree_fuzz.cc.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "btree.h"
#include "crc32c.h"
#include "test_util.h"

namespace slipstream::engine::test {
namespace {

constexpr uint32_t kNodeSize = 512;
constexpr uint32_t kSegmentSize = 8192;
constexpr uint32_t kSegments = 8;
constexpr uint32_t kTreeId = 7;

// A device file of a few small segments, a segment table, and a tree built into them by
// TreeBuilder; the tree's nodes can be patched on the device afterwards.
class TreeOnDevice : public SegmentSink {
 public:
  // Opens a device of kSegments segments; segment 0 is reserved, as in the engine.
  TreeOnDevice() : table_(kSegments, SegmentInfo{}) {
    path_ = dir_.path() + "/segments";
    EXPECT_TRUE(device_.Open(path_, kSegmentSize, uint64_t(kSegments) * kSegmentSize).ok());
    EXPECT_TRUE(device_.Grow(kSegments).ok());
    table_[0].kind = uint8_t(SegmentKind::kReserved);
  }

  // Builds a tree of `count` rows with keys padded to `key_size` bytes.
  LevelDesc Build(int count, size_t key_size) {
    TreeBuilder builder(TreeShape{kNodeSize, kSegmentSize, 10, 64, 1000}, this, kTreeId);
    for (int i = 0; i < count; i++) {
      keys_.push_back(Key(i, key_size));
      std::string value(size_t(i % 7), 'v');
      LeafEntry e{keys_.back(), ValueKind::kInline, value, {}};
      EXPECT_TRUE(builder.Add(e).ok());
    }
    LevelDesc desc{};
    EXPECT_TRUE(builder.Finish(&desc).ok());
    return desc;
  }

  // Takes the next segment of the device for the builder, owned by the tree.
  Status NewSegment(SegmentKind kind, uint32_t* segment) override {
    if (next_ == kSegments) return Status::IOError("test device is full");
    *segment = next_++;
    table_[*segment].kind = uint8_t(kind);
    table_[*segment].owner = kTreeId;
    return Status::OK();
  }
  // Writes what the builder made at the start of `segment`.
  Status WriteSegment(uint32_t segment, const char* data, uint32_t length) override {
    return device_.Write({WriteRequest{uint64_t(segment) * kSegmentSize, data, length}}, false);
  }

  // Points child `index` of the index node at `node` to `child`, with a checksum that matches.
  void Repoint(DevPtr node, int index, DevPtr child) {
    std::string bytes(device_.Segment(node.segment) + node.offset, kNodeSize);
    NodeHeader h;
    std::memcpy(&h, bytes.data(), sizeof(h));
    ASSERT_EQ(h.magic, kIndexMagic);
    uint16_t off;
    std::memcpy(&off, bytes.data() + kNodeHeaderSize + 2 * index, 2);
    uint8_t key_size = uint8_t(bytes[off]);  // keys here are short: a one-byte varint
    std::memcpy(bytes.data() + off + 1 + key_size, &child.segment, 4);
    std::memcpy(bytes.data() + off + 1 + key_size + 4, &child.offset, 4);
    h.crc = crc32c::Value(bytes.data() + 8, h.used - 8);
    std::memcpy(bytes.data(), &h, sizeof(h));
    ASSERT_TRUE(device_
                    .Write({WriteRequest{uint64_t(node.segment) * kSegmentSize + node.offset,
                                         bytes.data(), kNodeSize}},
                           false)
                    .ok());
  }

  // The child pointer `index` of the index node at `node`.
  DevPtr ChildOf(DevPtr node, int index) {
    NodeView view;
    LevelDesc tree{};
    tree.tree_id = tree.first_tree_id = kTreeId;
    EXPECT_TRUE(Context(true).OpenNode(node, tree, &view).ok());
    std::string_view key;
    DevPtr child;
    EXPECT_TRUE(view.Index(index, &key, &child).ok());
    return child;
  }

  // A reader's context, verifying node checksums or not.
  TreeContext Context(bool verify_crc) const {
    return TreeContext{&device_,     table_.data(), kSegments, kNodeSize,
                       kSegmentSize, verify_crc,    nullptr};
  }

  // Row i's internal key, padded to `key_size` bytes after its row number.
  static std::string Key(int i, size_t key_size) {
    char row[16];
    std::snprintf(row, sizeof(row), "%08d", i);
    return MakeInternalKey(1, std::string(row) + std::string(key_size, 'k'));
  }
  // Every key Build added, in order.
  const std::vector<std::string>& keys() const { return keys_; }

 private:
  TempDir dir_;
  std::string path_;
  Device device_;
  std::vector<SegmentInfo> table_;
  uint32_t next_ = 1;
  std::vector<std::string> keys_;
};

// Runs `f` in a child process with `seconds` to finish; true if it returned in time (a reader
// that loops forever is killed by the alarm instead of hanging the test binary).
bool FinishesWithin(int seconds, const std::function<void()>& f) {
  pid_t pid = fork();
  if (pid == 0) {
    alarm(unsigned(seconds));
    f();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// A bloom descriptor pointing outside the segment table, outside its segment, or listing more
// blocks than a directory can: the filter admits every key, and Verify's check reports it.
TEST(TreeDamage, BloomDescriptorOutOfBoundsAdmitsAndIsReported) {
  TreeOnDevice t;
  LevelDesc good = t.Build(40, 8);
  for (bool verify : {true, false}) {
    TreeContext ctx = t.Context(verify);
    ASSERT_TRUE(CheckBloomFilter(ctx, good).ok());
    for (int damage = 0; damage < 4; damage++) {
      LevelDesc d = good;
      if (damage == 0) d.bloom_dir.segment = 1023410177;  // far beyond the table
      if (damage == 1) d.bloom_dir.offset = 0x7ffffe00;   // far beyond the segment
      if (damage == 2) d.bloom_dir.offset += 3;           // not a node slot
      if (damage == 3) d.bloom_blocks = uint64_t(1) << 40;
      for (const std::string& key : t.keys()) {
        EXPECT_TRUE(TreeMayContain(ctx, d, HashKey(key))) << damage;
      }
      EXPECT_TRUE(CheckBloomFilter(ctx, d).IsCorruption()) << damage;
    }
  }
}

// A descriptor whose height no node can have makes the size estimate fail with Corruption
// before anything is sized by that height (it used to allocate 16 GiB).
TEST(TreeDamage, ImpossibleDescriptorHeightIsCorruption) {
  TreeOnDevice t;
  LevelDesc d = t.Build(120, 30);
  d.height = 0xffffffffu;
  // Room for the test, not for an allocation sized by the damaged height.
  rlimit old;
  ASSERT_EQ(getrlimit(RLIMIT_AS, &old), 0);
  uint64_t vm_kb = 0;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmSize:", 0) == 0) vm_kb = std::stoull(line.substr(7));
  }
  ASSERT_GT(vm_kb, 0u);
  rlimit capped = old;
  capped.rlim_cur = std::min<rlim_t>(old.rlim_cur, (vm_kb << 10) + (1ull << 30));
  ASSERT_EQ(setrlimit(RLIMIT_AS, &capped), 0);
  Status s;
  double bytes = -1;
  bool threw = false;
  try {
    s = TreeRangeBytes(t.Context(true), d, t.keys().front(), t.keys().back(), &bytes);
  } catch (...) {
    threw = true;
  }
  ASSERT_EQ(setrlimit(RLIMIT_AS, &old), 0);
  EXPECT_FALSE(threw);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
}

// An index entry pointing back up at the root (a cycle; the checksum made to match, and not
// checked at all): lookups, seeks and scans end with Corruption instead of looping forever.
TEST(TreeDamage, PointerBackUpTheTreeEndsEveryReader) {
  TreeOnDevice t;
  LevelDesc d = t.Build(120, 30);
  ASSERT_EQ(d.height, 2u);
  DevPtr inner = t.ChildOf(d.root, 0);  // at height 1, over the first leaves
  t.Repoint(inner, 1, d.root);
  const std::string& routed = t.keys()[12];  // a key under the repointed child
  for (bool verify : {true, false}) {
    TreeContext ctx = t.Context(verify);
    EXPECT_TRUE(FinishesWithin(10,
                               [&] {
                                 bool found = false;
                                 LeafEntry e;
                                 Status s = TreeGet(ctx, d, routed, &found, &e);
                                 if (!s.IsCorruption()) _exit(1);
                               }))
        << "TreeGet, verify " << verify;
    EXPECT_TRUE(FinishesWithin(10,
                               [&] {
                                 TreeIterator it(ctx, d);
                                 it.Seek(routed);
                                 if (!it.status().IsCorruption()) _exit(1);
                               }))
        << "Seek, verify " << verify;
    EXPECT_TRUE(FinishesWithin(10,
                               [&] {
                                 TreeIterator it(ctx, d);
                                 for (it.SeekToFirst(); it.Valid(); it.Next()) {
                                 }
                                 if (!it.status().IsCorruption()) _exit(1);
                               }))
        << "scan, verify " << verify;
  }
}

// Two index entries leading to the same subtree (no cycle): a scan reports Corruption at the
// first key that does not increase instead of returning the subtree's keys twice.
TEST(TreeDamage, SubtreeReachedTwiceIsCorruptionInScans) {
  TreeOnDevice t;
  LevelDesc d = t.Build(120, 30);
  ASSERT_EQ(d.height, 2u);
  DevPtr inner = t.ChildOf(d.root, 0);
  t.Repoint(inner, 2, t.ChildOf(inner, 0));  // leaf 0 is now also child 2
  for (bool verify : {true, false}) {
    TreeIterator it(t.Context(verify), d);
    std::string previous;
    for (it.SeekToFirst(); it.Valid(); it.Next()) {
      ASSERT_GT(std::string(it.entry().key), previous);
      previous.assign(it.entry().key);
    }
    EXPECT_TRUE(it.status().IsCorruption()) << it.status().ToString();
  }
}

}  // namespace
}  // namespace slipstream::engine::test
