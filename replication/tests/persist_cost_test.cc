// What a persist costs a backup, printed rather than asserted (timings depend on the machine):
// 2,000 appends of 4,000 bytes fill one 8 MB buffer, each followed by a persist, as a primary in
// remote_flush does with a FLUSH per group commit. The scan work per persist is the bytes
// appended since the last one (not the whole prefix again, twice); through the server over shm,
// a flush costs about the same at the end of the buffer as at its start; with a standby's store
// on real files, the flush is answered after one fsync (the image), pg_wal's following it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <thread>

#include "buffer_scan.h"
#include "slipstream/engine/log_writer.h"
#include "slipstream/rdma/testing.h"
#include "slipstream/replication/backup_link.h"
#include "slipstream/replication/backup_server.h"
#include "slipstream/replication/stream_shipper.h"
#include "slipstream/replication/wal_directory_store.h"
#include "test_util.h"

namespace slipstream::replication {
namespace {

constexpr uint32_t kWal = uint32_t(StreamId::kWal);
constexpr uint32_t kBuffer = 8u << 20;
constexpr int kAppends = 2000;
constexpr size_t kAppendBytes = 4000;

using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

std::string Random(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = char(rng());
  return s;
}

// The scans a persist needs, on one buffer filled append by append: as before (the valid-prefix
// scan of the whole buffer, then the store's scan of [0, to) for the records of [from, to)),
// and now (one scan resumed where the durable prefix ends, its records handed to the store).
// Both must find the same prefixes and records.
TEST(PersistCost, ScanWorkPerPersistIsTheNewBytes) {
  std::string buffer(kBuffer, '\0');
  engine::LogCursor cursor;
  engine::StartLogSegment(buffer.data(), kBuffer, engine::LogKind::kWal, 1, 0, 7, &cursor);
  std::string payload = Random(kAppendBytes, 1);
  std::vector<uint32_t> ends;
  Clock::duration full{}, resumed{};
  uint64_t full_bytes = 0, resumed_bytes = 0;
  uint32_t durable = 0;  // the rescans' state: the end of the persisted prefix
  ScanPoint point;       // the resumed scans' state
  for (int i = 0; i < kAppends; i++) {
    engine::AppendRecord(buffer.data(), &cursor, engine::LogRecordType::kWal,
                         uint64_t(i) * kAppendBytes, {payload});
    engine::AppendChecksum(buffer.data(), &cursor);

    auto t0 = Clock::now();
    uint32_t valid = ValidPrefix(buffer.data(), kBuffer, kWal, 1);
    engine::LogScan rescan = engine::ScanLogSegment(buffer.data(), valid);
    size_t fresh = 0;
    for (const engine::ScannedRecord& r : rescan.records) fresh += r.offset >= durable;
    durable = valid;
    auto t1 = Clock::now();
    engine::LogScan scan = ScanBuffer(buffer.data(), kBuffer, kWal, 1, point);
    auto t2 = Clock::now();
    full += t1 - t0;
    resumed += t2 - t1;
    full_bytes += uint64_t(valid) * 2;
    resumed_bytes += scan.valid_end - point.offset;
    ASSERT_EQ(scan.valid_end, valid);
    ASSERT_EQ(scan.valid_end, cursor.pos);
    ASSERT_EQ(scan.records.size(), fresh);
    ASSERT_EQ(scan.records.size(), 1u);
    point = ScanPoint{scan.valid_end, scan.chain};
  }
  std::printf(
      "[ persist  ] %d appends+persists of %zu bytes into an 8 MB buffer: rescanning the whole "
      "prefix twice %.1f ms (%.1f MB scanned), resuming %.1f ms (%.1f MB scanned)\n",
      kAppends, kAppendBytes, Ms(full), full_bytes / 1e6, Ms(resumed), resumed_bytes / 1e6);
}

// A store that keeps nothing: what remains of a flush is the server's own work.
class NullStore : public BackupStore {
 public:
  Status Persist(const SegmentId&, const char*, uint32_t, uint32_t to,
                 const std::vector<engine::ScannedRecord>& records, bool) override {
    records_ += records.size();
    to_ = to;
    return Status::OK();
  }
  Status LoadVersion(const std::string&, uint64_t* version) override {
    *version = 0;
    return Status::OK();
  }
  Status SaveVersion(const std::string&, uint64_t) override { return Status::OK(); }
  uint64_t ResumePosition(const std::string&, uint32_t) override { return 0; }
  uint64_t records_ = 0;
  uint32_t to_ = 0;
};

// `rounds` append+flush rounds of a primary through a backup server over shm, `think_us` apart
// (a client's time between commits); the time of the flushes of the first and last 200 rounds,
// and of all, is printed.
void FlushRounds(BackupStore* store, const std::string& what, uint64_t start, int rounds,
                 int think_us) {
  rdma::TransportOptions t;
  t.backend = "shm";
  t.secret = "persist-cost-secret";
  t.connect_timeout_ms = 5000;
  BackupOptions o;
  o.transport = t;
  o.buffers = 4;
  o.buffers_per_primary = 2;
  o.buffer_size = kBuffer;
  BackupServer server(o, store);
  ASSERT_TRUE(server.Start().ok());
  LinkOptions lo;
  lo.address = server.address();
  lo.transport = t;
  lo.primary = "p1";
  std::unique_ptr<BackupLink> link;
  ASSERT_TRUE(BackupLink::Connect(lo, &link).ok());
  StreamShipper shipper(kWal, start, start, {link.get()});
  std::string payload = Random(kAppendBytes, 2);
  Clock::duration first{}, last{}, all{};
  for (int i = 0; i < rounds; i++) {
    if (think_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(think_us));
    ASSERT_TRUE(shipper.Append(shipper.end(), payload).ok());
    auto t0 = Clock::now();
    uint64_t durable = 0;
    Status s = shipper.Flush(1, 5000, &durable);
    auto d = Clock::now() - t0;
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_EQ(durable, shipper.end());
    all += d;
    if (i < 200) first += d;
    if (i >= rounds - 200) last += d;
  }
  std::printf(
      "[ persist  ] %s: %d append+flush rounds of %zu bytes, %d us apart, into one 8 MB buffer "
      "over shm: %.1f us per flush (first 200: %.1f us, last 200: %.1f us)\n",
      what.c_str(), rounds, kAppendBytes, think_us, Ms(all) * 1000 / rounds, Ms(first) * 1000 / 200,
      Ms(last) * 1000 / 200);
}

TEST(PersistCost, FlushesThroughTheServer) {
  NullStore null;
  FlushRounds(&null, "no store", 1000, kAppends, 0);
  EXPECT_EQ(null.records_, uint64_t(kAppends));
}

TEST(PersistCost, FlushesIntoAStandbysPgWal) {
  test::BackupDirs dirs;
  {
    WalDirectoryOptions w;
    w.image_directory = dirs.images();
    w.wal_directory = dirs.wal();
    w.segment_size = 16ull << 20;
    w.resume = 1ull << 30;
    std::unique_ptr<WalDirectoryStore> store;
    ASSERT_TRUE(WalDirectoryStore::Open(w, &store).ok());
    // Back to back, a flush waits for the fsync of pg_wal that follows the previous answer.
    FlushRounds(store.get(), "WalDirectoryStore", w.resume, kAppends, 0);
    FlushRounds(store.get(), "WalDirectoryStore", store->WalEnd(), 500, 1000);
  }
}

}  // namespace
}  // namespace slipstream::replication
