// The observer points replication and index shipping build on: a copy made only from
// OnLogWrite events is the log as written (and scans to every synced record), and every
// compaction reports its segments, as written, before it is installed or abandoned.
#include <fcntl.h>
#include <unistd.h>

#include <map>
#include <mutex>
#include <set>

#include "coding.h"
#include "format.h"
#include "slipstream/engine/log_scanner.h"
#include "test_util.h"

namespace slipstream::engine::test {
namespace {

// Reads `length` bytes of the device file at `offset`.
std::string ReadDevice(const std::string& dir, uint64_t offset, size_t length) {
  std::string out(length, '\0');
  int fd = open((dir + "/segments").c_str(), O_RDONLY);
  ssize_t n = fd < 0 ? -1 : pread(fd, out.data(), length, off_t(offset));
  if (fd >= 0) close(fd);
  if (n != ssize_t(length)) out.clear();
  return out;
}

// Keeps a byte copy of every log segment from OnLogWrite alone, as a passive backup would.
class LogMirror : public EngineObserver {
 public:
  explicit LogMirror(uint32_t segment_size) : segment_size_(segment_size) {}

  void OnLogWrite(const LogWriteEvent& e) override {
    std::lock_guard<std::mutex> lock(mu_);
    Segment& seg = segments_[e.segment];
    if (e.offset == 0 || seg.image.empty()) {  // a fresh segment (or a reused one) starts over
      seg.image.assign(segment_size_, '\0');
      seg.end = e.offset;
    }
    if (e.offset != seg.end) gaps_++;
    if (uint64_t(e.offset) + e.bytes.size() > segment_size_) {
      out_of_bounds_++;
      return;
    }
    std::memcpy(seg.image.data() + e.offset, e.bytes.data(), e.bytes.size());
    seg.end = e.offset + uint32_t(e.bytes.size());
    seg.log = e.log;
    seg.sequence = e.sequence;
  }

  struct Segment {
    std::string image;
    uint32_t end = 0;
    ObservedLog log = ObservedLog::kL0;
    uint64_t sequence = 0;
  };
  std::mutex mu_;
  uint32_t segment_size_;
  std::map<uint32_t, Segment> segments_;
  int gaps_ = 0;
  int out_of_bounds_ = 0;
};

TEST(Observer, LogWritesRebuildTheLogsByteForByte) {
  TestEngine t([](const std::string& dir) {
    Options o = SmallOptions(dir);
    o.l0_size = 8u << 20;      // no memtable switch: every L0 segment stays in use
    o.compress_large = false;  // the large log spans several segments
    return o;
  });
  auto mirror = std::make_shared<LogMirror>(t.options.segment_size);
  t.options.observer = mirror;
  t.Reopen();
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(1, &ks).ok());
  std::map<std::string, std::string> model;
  // Enough of both logs that each reuses its shared buffers (4 for L0, 8 for the large log),
  // which keep an earlier use's bytes past the cursor.
  for (int i = 0; i < 5000; i++) {
    std::string key = "key" + std::to_string(i);
    std::string value = Value(i % 3 == 0 ? 3000 : 40 + i % 600, i);  // large and small
    Lsn lsn;
    ASSERT_TRUE(t->Put(ks, key, value, &lsn).ok());
    model[key] = value;
    if (i % 100 == 99) {
      ASSERT_TRUE(t->Sync(lsn).ok());
    }
  }
  Lsn last;
  ASSERT_TRUE(t->Put(ks, "last", "v", &last).ok());
  model["last"] = "v";
  ASSERT_TRUE(t->Sync(last).ok());

  std::lock_guard<std::mutex> lock(mirror->mu_);
  EXPECT_EQ(mirror->gaps_, 0);
  EXPECT_EQ(mirror->out_of_bounds_, 0);
  size_t l0_segments = 0;
  for (const auto& [number, seg] : mirror->segments_) l0_segments += seg.log == ObservedLog::kL0;
  ASSERT_GT(l0_segments, 4u);
  ASSERT_GT(mirror->segments_.size() - l0_segments, 8u);
  // Byte-identical to what reached the device, and nothing of a buffer's earlier use past it.
  for (const auto& [number, seg] : mirror->segments_) {
    uint64_t base = uint64_t(number) * t.options.segment_size;
    EXPECT_EQ(ReadDevice(t.dir.path(), base, seg.end), seg.image.substr(0, seg.end))
        << "segment " << number;
    EXPECT_EQ(ReadDevice(t.dir.path(), base + seg.end, t.options.segment_size - seg.end),
              std::string(t.options.segment_size - seg.end, '\0'))
        << "segment " << number;
  }
  // The Tailwind scan of the copy finds every key, and every large value it points at.
  std::map<uint32_t, LogScan> scans;
  std::set<std::pair<uint32_t, uint32_t>> values;  // (segment, offset) of large-log records
  for (const auto& [number, seg] : mirror->segments_) {
    LogScan scan = ScanLogSegment(seg.image.data(), seg.image.size());
    ASSERT_TRUE(scan.header_ok);
    EXPECT_FALSE(scan.stopped_at_damage) << "segment " << number;
    EXPECT_EQ(scan.valid_end, seg.end);
    for (const ScannedRecord& r : scan.records) {
      if (seg.log == ObservedLog::kLarge && r.type == LogRecordType::kValue) {
        values.insert({number, r.offset});
      }
    }
    scans[number] = std::move(scan);
  }
  std::set<std::string> keys;
  int large = 0;
  for (const auto& [number, scan] : scans) {
    if (mirror->segments_[number].log != ObservedLog::kL0) continue;
    for (const ScannedRecord& r : scan.records) {
      if (r.type != LogRecordType::kPut) continue;
      uint32_t key_size = 0;
      const char* p =
          DecodeVarint32(r.payload.data(), r.payload.data() + r.payload.size(), &key_size);
      ASSERT_NE(p, nullptr);
      keys.insert(std::string(p + kKeyspacePrefix, key_size - kKeyspacePrefix));
      if (ValueKind(uint8_t(p[key_size])) == ValueKind::kLargePtr) {
        ValuePtr ptr = ValuePtr::DecodeFrom(p + key_size + 1);
        EXPECT_TRUE(values.count({ptr.where.segment, ptr.where.offset}))
            << "a large pointer leads outside the copy";
        large++;
      }
    }
  }
  EXPECT_EQ(large, 1667);
  for (const auto& [key, value] : model) EXPECT_TRUE(keys.count(key)) << key;
}

// Records compaction events and checks their order and contents as they arrive.
class CompactionRecorder : public EngineObserver {
 public:
  explicit CompactionRecorder(std::string dir, uint32_t segment_size)
      : dir_(std::move(dir)), segment_size_(segment_size) {}

  void OnCompactionSegment(const CompactionSegmentEvent& e) override {
    std::lock_guard<std::mutex> lock(mu_);
    Compaction& c = compactions_[e.compaction];
    if (c.installed || c.abandoned) problems_.push_back("segment after the end of a compaction");
    if (ReadDevice(dir_, uint64_t(e.segment) * segment_size_, e.bytes.size()) != e.bytes) {
      problems_.push_back("reported bytes differ from the device");
    }
    if (e.kind == CompactionSegmentKind::kMedium) {
      c.medium.insert(e.segment);
    } else {
      c.tree.insert(e.segment);
    }
  }

  void OnCompactionInstalled(const CompactionInstalledEvent& e) override {
    std::lock_guard<std::mutex> lock(mu_);
    Compaction& c = compactions_[e.compaction];
    c.installed = true;
    installed_++;
    if (e.tree_id == 0) return;  // an empty output: nothing to ship
    if (e.tree_id != e.compaction) problems_.push_back("compaction id is not the tree id");
    if (!c.tree.count(e.root_segment)) problems_.push_back("root in an unreported segment");
    // The deepest level has no bloom filter, and then no directory.
    if (e.bloom_blocks == 0 ? e.bloom_segment != 0 : !c.tree.count(e.bloom_segment)) {
      problems_.push_back("bloom directory unreported");
    }
    if (c.tree.size() != e.segments) problems_.push_back("tree segment count differs");
  }

  void OnCompactionAbandoned(uint64_t compaction) override {
    std::lock_guard<std::mutex> lock(mu_);
    compactions_[compaction].abandoned = true;
  }

  struct Compaction {
    std::set<uint32_t> tree, medium;
    bool installed = false, abandoned = false;
  };
  std::mutex mu_;
  std::string dir_;
  uint32_t segment_size_;
  std::map<uint64_t, Compaction> compactions_;
  std::vector<std::string> problems_;
  uint64_t installed_ = 0;
};

TEST(Observer, CompactionsReportTheirSegmentsBeforeTheyAreInstalled) {
  TestEngine t;
  auto recorder = std::make_shared<CompactionRecorder>(t.dir.path(), t.options.segment_size);
  t.options.observer = recorder;
  t.Reopen();
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(1, &ks).ok());
  for (int round = 0; round < 6; round++) {  // ~10 MB of live data: L1 and L2 in use
    for (int i = 0; i < 8000; i++) {
      std::string key = "key" + std::to_string((i * 7919 + round * 8000) % 20000);
      ASSERT_TRUE(t->Put(ks, key, Value(150 + i % 700, i + round)).ok());  // medium values
    }
    while (t->DoBackgroundWork()) {
    }
  }
  ASSERT_TRUE(t->CompactAll().ok());
  ASSERT_TRUE(t->Verify().ok());

  std::lock_guard<std::mutex> lock(recorder->mu_);
  for (const std::string& p : recorder->problems_) ADD_FAILURE() << p;
  EXPECT_EQ(recorder->installed_, t->GetStats().compactions);
  EXPECT_GE(recorder->installed_, 4u);
  bool medium_shipped = false;
  for (const auto& [id, c] : recorder->compactions_) {
    EXPECT_TRUE(c.installed) << "compaction " << id << " never ended";
    EXPECT_FALSE(c.abandoned);
    medium_shipped = medium_shipped || !c.medium.empty();
  }
  EXPECT_TRUE(medium_shipped) << "no compaction wrote a medium-log run";
}

TEST(Observer, ACompactionThatFailsIsReportedAbandoned) {
  // A device of 80 segments (20 MiB) fills up: writes and compactions start to fail.
  TestEngine t([](const std::string& dir) {
    Options o = SmallOptions(dir);
    o.max_device_size = 80ull * o.segment_size;
    return o;
  });
  auto recorder = std::make_shared<CompactionRecorder>(t.dir.path(), t.options.segment_size);
  t.options.observer = recorder;
  t.Reopen();
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(1, &ks).ok());
  Status s;
  for (int i = 0; i < 200000 && s.ok(); i++) {
    s = t->Put(ks, "key" + std::to_string(i), Value(400, i));
    if (s.ok() && i % 500 == 0) s = t->CompactAll();
  }
  ASSERT_FALSE(s.ok()) << "the device never filled up";

  std::lock_guard<std::mutex> lock(recorder->mu_);
  for (const std::string& p : recorder->problems_) ADD_FAILURE() << p;
  int abandoned = 0;
  for (const auto& [id, c] : recorder->compactions_) {
    EXPECT_TRUE(c.installed != c.abandoned)
        << "compaction " << id << " ended " << (c.installed ? "twice" : "never");
    abandoned += c.abandoned;
  }
  EXPECT_GE(abandoned, 1);
}

}  // namespace
}  // namespace slipstream::engine::test
