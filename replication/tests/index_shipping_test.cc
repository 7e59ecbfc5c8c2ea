// Index shipping end to end on the shm and tcp transports: a primary engine's compactions,
// framed into the index stream and appended to a backup with one-sided writes, are installed
// by the backup's IndexStore into a replica engine that never compacts, and the replica holds
// what the primary holds after each round; damaged frames are refused, never applied.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "slipstream/engine/engine.h"
#include "slipstream/replication/backup_link.h"
#include "slipstream/replication/backup_server.h"
#include "slipstream/replication/index_stream.h"
#include "slipstream/replication/stream_shipper.h"
#include "test_util.h"

namespace slipstream::replication {
namespace {

constexpr char kSecret[] = "index-shipping-secret";
constexpr uint32_t kBufferSize = 1u << 20;
constexpr uint32_t kIndex = uint32_t(StreamId::kEngineIndex);

using test::TempDir;

// An engine in its own directory and MAP_SHARED arena, with small shapes so that a test
// reaches several levels.
struct TestEngine {
  explicit TestEngine(std::shared_ptr<engine::EngineObserver> observer = nullptr) {
    options.directory = dir.path();
    options.segment_size = 256u << 10;
    options.node_size = 4096;
    options.l0_size = 1u << 20;
    options.growth_factor = 4;
    options.max_levels = 5;
    options.max_key_size = 256;
    options.max_value_size = 32u << 10;
    options.max_device_size = 4ull << 30;
    options.use_fsync = false;
    options.observer = std::move(observer);
    size = engine::Engine::ArenaSize(options);
    arena = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    engine::Status s = engine::Engine::Open(options, arena, size, &handle);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  ~TestEngine() {
    handle.reset();
    munmap(arena, size);
  }
  // A crash and a restart: the handle goes, shared memory is lost, the engine recovers.
  void Restart() {
    handle.reset();
    munmap(arena, size);
    arena = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    engine::Status s = engine::Engine::Open(options, arena, size, &handle);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  engine::Engine* operator->() { return handle.get(); }

  TempDir dir;
  engine::Options options;
  size_t size = 0;
  void* arena = nullptr;
  std::unique_ptr<engine::Engine> handle;
};

std::map<std::string, std::string> Contents(engine::Engine* e, engine::KeyspaceId ks) {
  std::map<std::string, std::string> out;
  auto it = e->NewIterator(ks);
  for (it->SeekToFirst(); it->Valid(); it->Next()) out[std::string(it->key())] = it->value();
  return out;
}

std::string Value(std::mt19937& rng, int seed) {
  static const size_t kSizes[] = {40, 400, 3000};  // small, medium, large
  std::string v(kSizes[rng() % 3] + rng() % 30, '\0');
  for (size_t i = 0; i < v.size(); i++) v[i] = char('a' + (seed * 7 + i * 13) % 26);
  return v;
}

rdma::TransportOptions Transport(const std::string& backend) {
  rdma::TransportOptions t;
  t.backend = backend;
  t.secret = kSecret;
  t.connect_timeout_ms = 5000;
  return t;
}

// (transport, LZ4 on shipped segments)
class IndexShipping : public ::testing::TestWithParam<std::tuple<std::string, bool>> {
 protected:
  std::string backend() const { return std::get<0>(GetParam()); }
  bool lz4() const { return std::get<1>(GetParam()); }
};

TEST_P(IndexShipping, TheReplicaInstallsEveryCompactionAndEqualsThePrimary) {
  TestEngine replica;
  TempDir images;
  IndexStore store(images.path(), replica.handle.get(), "p1", 0);
  BackupOptions bo;
  bo.transport = Transport(backend());
  bo.buffers = 8;
  bo.buffers_per_primary = 4;
  bo.buffer_size = kBufferSize;
  BackupServer server(bo, &store);
  ASSERT_TRUE(server.Start().ok());

  std::vector<std::string> frames;  // what the primary's engine raised since the last round
  uint64_t segment_bytes = 0;       // of the segments compactions wrote, uncompressed
  struct Counter : engine::EngineObserver {
    explicit Counter(uint64_t* n) : n(n) {}
    void OnCompactionSegment(const engine::CompactionSegmentEvent& e) override {
      *n += e.bytes.size();
    }
    uint64_t* n;
  };
  // Compressed per backup as the extension's shipper does it: frames are encoded plain.
  auto encoder = std::make_shared<IndexEventEncoder>(
      [&frames](std::string f) { frames.push_back(std::move(f)); }, false);
  struct Both : engine::EngineObserver {
    Both(std::shared_ptr<engine::EngineObserver> a, std::shared_ptr<engine::EngineObserver> b)
        : a(std::move(a)), b(std::move(b)) {}
    void OnLogWrite(const engine::LogWriteEvent& e) override { a->OnLogWrite(e); }
    void OnCompactionBegin(const engine::CompactionBeginEvent& e) override {
      a->OnCompactionBegin(e);
    }
    void OnCompactionSegment(const engine::CompactionSegmentEvent& e) override {
      a->OnCompactionSegment(e);
      b->OnCompactionSegment(e);
    }
    void OnCompactionInstalled(const engine::CompactionInstalledEvent& e) override {
      a->OnCompactionInstalled(e);
    }
    void OnCompactionAbandoned(uint64_t c) override { a->OnCompactionAbandoned(c); }
    std::shared_ptr<engine::EngineObserver> a, b;
  };
  TestEngine primary(std::make_shared<Both>(encoder, std::make_shared<Counter>(&segment_bytes)));
  LinkOptions lo;
  lo.address = server.address();
  lo.transport = Transport(backend());
  lo.version = 1;
  lo.primary = "p1";
  std::unique_ptr<BackupLink> link;
  Status s = BackupLink::Connect(lo, &link);
  ASSERT_TRUE(s.ok()) << s.ToString();
  StreamShipper shipper(kIndex, 1, 0, {link.get()});

  // The replica creates no keyspace: it takes the primary's table with each install.
  engine::KeyspaceId ks, replica_ks = 0;
  ASSERT_TRUE(primary->CreateKeyspace(9, &ks).ok());
  std::mt19937 rng(3);
  std::map<std::string, std::string> model;
  uint64_t bytes_shipped = 0;
  for (int round = 0; round < 5; round++) {
    for (int i = 0; i < 2500; i++) {
      std::string key = "key" + std::to_string(rng() % 5000);
      if (rng() % 8 == 0) {
        ASSERT_TRUE(primary->Delete(ks, key).ok());
        model.erase(key);
      } else {
        std::string v = Value(rng, i + round);
        ASSERT_TRUE(primary->Put(ks, key, v).ok());
        model[key] = v;
      }
    }
    if (round == 3) {
      ASSERT_TRUE(primary->RunGC().ok());
    }
    ASSERT_TRUE(primary->CompactAll().ok());
    frames.push_back(EncodeHorizon(0x1000 + round));  // what the host's observer adds
    // Ship the round: the frames go as one stream, split across buffers as they fill.
    for (std::string& f : frames) {
      if (lz4()) f = CompressSegmentFrame(f);
      for (size_t off = 0; off < f.size(); off += 60000) {
        std::string_view piece = std::string_view(f).substr(off, 60000);
        Status a = shipper.Append(shipper.end(), piece);
        ASSERT_TRUE(a.ok()) << a.ToString();
        bytes_shipped += piece.size();
      }
    }
    frames.clear();
    uint64_t durable = 0;
    Status f = shipper.Flush(1, 10000, &durable);
    ASSERT_TRUE(f.ok()) << f.ToString();
    ASSERT_EQ(durable, shipper.end());
    ASSERT_TRUE(store.Progress().error.ok()) << store.Progress().error.ToString();
    ASSERT_EQ(store.Progress().applied_end, shipper.end());
    EXPECT_EQ(store.Progress().horizon, uint64_t(0x1000 + round));
    ASSERT_TRUE(replica->LookupKeyspace(9, &replica_ks).ok());
    ASSERT_EQ(replica_ks, ks);
    ASSERT_TRUE(Contents(replica.handle.get(), replica_ks) == model) << "round " << round;
    engine::Status v = replica->Verify();
    ASSERT_TRUE(v.ok()) << v.ToString();
  }
  ImportProgress progress = store.Progress();
  EXPECT_GE(progress.installed, 5u);
  EXPECT_EQ(replica->GetStats().compactions, progress.installed);
  // Every install brought segments, whose rewrite was timed.
  EXPECT_GE(progress.segments, progress.installed);
  EXPECT_GE(progress.segment_bytes, progress.segments * 4096);
  EXPECT_GT(progress.rewrite_nanos, 0u);
  EXPECT_GE(progress.frames, progress.segments);
  // A primary that connects again learns where the backup's copy of the index stream ends.
  // (The backup may still be closing the old session a moment: the connect is retried.)
  link.reset();
  lo.version = 2;
  std::unique_ptr<BackupLink> again;
  for (int attempt = 0; attempt < 50; attempt++) {
    s = BackupLink::Connect(lo, &again);
    if (s.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(again->index_resume(), shipper.end());
  EXPECT_GT(segment_bytes, 0u);
  if (lz4()) {
    // Compressed segments: the whole stream is smaller than the segments it carries.
    EXPECT_LT(bytes_shipped, segment_bytes) << "LZ4 saved nothing";
  } else {
    EXPECT_GT(bytes_shipped, segment_bytes);
  }
}

TEST_P(IndexShipping, AReplicaRestartedInTheMiddleOfACompactionRecoversFromItsImages) {
  TestEngine replica;
  TempDir images;
  BackupOptions bo;
  bo.transport = Transport(backend());
  bo.buffers = 8;
  bo.buffers_per_primary = 4;
  bo.buffer_size = kBufferSize;
  LinkOptions lo;
  lo.transport = Transport(backend());
  lo.version = 1;
  lo.primary = "p1";

  std::string stream;  // every frame the primary raised, in order
  TestEngine primary(
      std::make_shared<IndexEventEncoder>([&stream](std::string f) { stream += f; }, lz4()));
  engine::KeyspaceId ks, replica_ks;
  ASSERT_TRUE(primary->CreateKeyspace(9, &ks).ok());
  ASSERT_TRUE(replica->CreateKeyspace(9, &replica_ks).ok());
  std::mt19937 rng(8);
  std::map<std::string, std::string> model;
  auto round = [&](int seed) {
    for (int i = 0; i < 3000; i++) {
      std::string key = "key" + std::to_string(rng() % 5000);
      std::string v = Value(rng, seed + i);
      ASSERT_TRUE(primary->Put(ks, key, v).ok());
      model[key] = v;
    }
    ASSERT_TRUE(primary->CompactAll().ok());
  };
  // Ships stream[from, to) to a fresh server of `store` as primary p1, buffers from
  // `sequence` on, and flushes it (the backup persists, so the store applies).
  auto ship = [&](IndexStore* store, size_t from, size_t to, uint64_t sequence) {
    BackupServer server(bo, store);
    ASSERT_TRUE(server.Start().ok());
    lo.address = server.address();
    std::unique_ptr<BackupLink> link;
    Status s = BackupLink::Connect(lo, &link);
    ASSERT_TRUE(s.ok()) << s.ToString();
    StreamShipper shipper(kIndex, sequence, from, {link.get()});
    for (size_t at = from; at < to; at += 50000) {
      size_t n = std::min<size_t>(50000, to - at);
      ASSERT_TRUE(shipper.Append(at, std::string_view(stream).substr(at, n)).ok());
    }
    uint64_t durable = 0;
    ASSERT_TRUE(shipper.Flush(1, 10000, &durable).ok());
    ASSERT_EQ(durable, to);
  };

  round(0);
  size_t installed_end = stream.size();
  {
    IndexStore store(images.path(), replica.handle.get(), "p1", 0);
    ASSERT_NO_FATAL_FAILURE(ship(&store, 0, installed_end, 1));
    ASSERT_TRUE(store.Progress().error.ok()) << store.Progress().error.ToString();
    ASSERT_EQ(replica->ImportResumePosition(), installed_end);
    // The next round reaches the replica halfway (in the middle of a frame), then it dies.
    round(100000);
    size_t half = installed_end + (stream.size() - installed_end) / 2 + 7;
    ASSERT_NO_FATAL_FAILURE(ship(&store, installed_end, half, 100));
    ASSERT_TRUE(store.Progress().error.ok()) << store.Progress().error.ToString();
    ASSERT_GT(store.Progress().applied_end, installed_end);
    // The images of what is installed can go: the restart below must not need them.
    PruneStats removed;
    ASSERT_TRUE(store.PruneInstalled({}, &removed).ok());
    EXPECT_GT(removed.files, 0u);
    EXPECT_EQ(store.ResumePosition("p1", kIndex), half);
  }
  replica.Restart();
  size_t half = installed_end + (stream.size() - installed_end) / 2 + 7;
  IndexStore store(images.path(), replica.handle.get(), "p1", 0);
  Status r = store.Recover();
  ASSERT_TRUE(r.ok()) << r.ToString();
  EXPECT_EQ(store.Progress().applied_end, half) << "the kept images were not fed again";
  ASSERT_NO_FATAL_FAILURE(ship(&store, half, stream.size(), 200));
  ASSERT_TRUE(store.Progress().error.ok()) << store.Progress().error.ToString();
  EXPECT_TRUE(Contents(replica.handle.get(), replica_ks) == model);
  engine::Status v = replica->Verify();
  EXPECT_TRUE(v.ok()) << v.ToString();
}

TEST(IndexApplier, DamagedOrMalformedFramesAreRefusedAndNothingAfterThemIsApplied) {
  TestEngine replica;
  engine::CompactionBeginEvent begin{
      7, true, 0, 1, replica.options.segment_size, replica.options.node_size};
  std::string good = EncodeCompactionBegin(begin);
  // A flipped bit in the payload fails the frame checksum.
  for (size_t bit : {size_t(8 * 13), size_t(8 * 20 + 3), size_t(8 * (good.size() - 1))}) {
    std::string bad = good;
    bad[bit / 8] ^= char(1 << (bit % 8));
    IndexApplier a(replica.handle.get(), 100);
    EXPECT_FALSE(a.Feed(100, bad).ok()) << "bit " << bit;
    EXPECT_EQ(a.frames(), 0u);
    // Nothing after the damage is applied, until a primary's next connection begins with a
    // seed's marker; the failure stays reported.
    EXPECT_TRUE(a.Feed(100 + bad.size(), good).ok());
    EXPECT_EQ(a.frames(), 0u) << "went on after damage";
    EXPECT_TRUE(a.lost());
    EXPECT_EQ(a.failures(), 1u);
    // A seed's marker that is not where a session started is stream bytes like any others.
    ASSERT_TRUE(a.Feed(100 + 2 * bad.size(), EncodeSeedBegin()).ok());
    EXPECT_TRUE(a.lost()) << "resynchronized on bytes that only look like a seed";
    a.AddSessionStart(100 + 2 * bad.size() + 16);
    ASSERT_TRUE(a.Feed(100 + 2 * bad.size() + 16, EncodeSeedBegin() + EncodeHorizon(9)).ok());
    EXPECT_EQ(a.frames(), 2u) << "the next connection's seed was not taken";
    EXPECT_FALSE(a.lost());
    EXPECT_FALSE(a.error().ok());
  }
  // A frame split across records, and records out of order, still apply once whole.
  IndexApplier a(replica.handle.get(), 0);
  std::string two = good + EncodeCompactionAbandoned(7);
  ASSERT_TRUE(a.Feed(10, std::string_view(two).substr(10)).ok());
  EXPECT_EQ(a.frames(), 0u);
  ASSERT_TRUE(a.Feed(0, std::string_view(two).substr(0, 10)).ok());
  EXPECT_EQ(a.frames(), 2u);
  EXPECT_EQ(a.end(), two.size());
  ASSERT_TRUE(a.Feed(0, two).ok());  // the same bytes again: skipped
  EXPECT_EQ(a.frames(), 2u);
  // A new replica skips what comes before a seed's marker, and applies from it on.
  engine::CompactionBeginEvent odd = begin;
  odd.node_size *= 2;  // a frame the engine would refuse
  IndexApplier c(replica.handle.get(), 0, /*await_seed=*/true);
  std::string before = EncodeCompactionBegin(odd);
  ASSERT_TRUE(c.Feed(0, before).ok()) << "a frame before the seed was applied";
  std::string seed = EncodeSeedBegin();
  ASSERT_TRUE(c.Feed(before.size(), seed).ok());
  EXPECT_FALSE(c.Feed(before.size() + seed.size(), before).ok()) << "nothing after the seed";
  // A primary that connects again begins with a seed's marker, at the end of what the backup
  // kept: a frame the old connection left cut there is dropped, not completed with the seed.
  IndexApplier d(replica.handle.get(), 0);
  std::string first = EncodeHorizon(10) + EncodeHorizon(20).substr(0, 9);
  ASSERT_TRUE(d.Feed(0, first).ok());
  EXPECT_EQ(d.horizon(), 10u);
  d.AddSessionStart(first.size());
  Status cut = d.Feed(first.size(), EncodeSeedBegin() + EncodeHorizon(30));
  ASSERT_TRUE(cut.ok()) << cut.ToString();
  EXPECT_EQ(d.horizon(), 30u);
  // A session that starts beyond what the applier holds (the old session's tail never became
  // durable here) is taken from its seed on.
  IndexApplier g(replica.handle.get(), 0);
  ASSERT_TRUE(g.Feed(0, first).ok());
  g.AddSessionStart(first.size() + 100);
  ASSERT_TRUE(g.Feed(first.size() + 100, EncodeSeedBegin() + EncodeHorizon(40)).ok());
  EXPECT_EQ(g.horizon(), 40u);
  EXPECT_EQ(g.end(), first.size() + 100 + 16 + 24);  // a seed frame, a horizon frame
  // The same bytes where no session started are a frame's continuation, and fail it.
  IndexApplier h(replica.handle.get(), 0);
  ASSERT_TRUE(h.Feed(0, first).ok());
  EXPECT_FALSE(h.Feed(first.size(), EncodeSeedBegin() + EncodeHorizon(30)).ok());
  // A frame the engine refuses (other shapes) stops the applier with the engine's reason.
  IndexApplier b(replica.handle.get(), 0);
  begin.node_size *= 2;
  Status s = b.Feed(0, EncodeCompactionBegin(begin));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.ToString().find("node"), std::string::npos) << s.ToString();
}

INSTANTIATE_TEST_SUITE_P(Transports, IndexShipping,
                         ::testing::Combine(::testing::Values("shm", "tcp"), ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param) + (std::get<1>(info.param) ? "_lz4" : "");
                         });

}  // namespace
}  // namespace slipstream::replication
