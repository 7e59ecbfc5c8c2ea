// Helpers of the protocol tests (a backup server on a transport, link options for it), shared
// by the suites that run a primary against a real BackupServer.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include "slipstream/engine/log_scanner.h"
#include "slipstream/replication/backup_link.h"
#include "slipstream/replication/backup_server.h"
#include "slipstream/replication/backup_store.h"
#include "test_util.h"

namespace slipstream::replication::test {

constexpr char kSecret[] = "replication-test-secret";
constexpr uint32_t kBufferSize = 64 * 1024;
constexpr uint32_t kWal = uint32_t(StreamId::kWal);

inline rdma::TransportOptions Transport(const std::string& backend,
                                        const std::string& secret = kSecret) {
  rdma::TransportOptions t;
  t.backend = backend;
  t.secret = secret;
  t.connect_timeout_ms = 5000;
  return t;
}

// A backup server with a file store in its own directory.
struct Backup {
  Backup(const std::string& backend, uint32_t buffers = 8, uint32_t per_primary = 4,
         uint64_t system_id = 0)
      : store(dir.path()) {
    BackupOptions o;
    o.transport = Transport(backend);
    o.buffers = buffers;
    o.buffers_per_primary = per_primary;
    o.buffer_size = kBufferSize;
    o.system_id = system_id;
    server = std::make_unique<BackupServer>(o, &store);
    Status s = server->Start();
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  // The stream bytes of every persisted segment of a primary's WAL stream, in order, checked
  // to be contiguous.
  std::string PersistedStream(const std::string& primary, uint64_t start) {
    std::string out;
    uint64_t position = start;
    for (const std::string& file : store.SegmentFiles(primary, kWal)) {
      std::ifstream in(file, std::ios::binary);
      std::string image((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      image.resize(kBufferSize, '\0');
      engine::LogScan scan = engine::ScanLogSegment(image.data(), image.size());
      EXPECT_TRUE(scan.header_ok) << file;
      for (const engine::ScannedRecord& r : scan.records) {
        EXPECT_EQ(r.lsn, position) << file;
        out.append(r.payload);
        position += r.payload.size();
      }
    }
    return out;
  }

  TempDir dir;
  FileBackupStore store;
  std::unique_ptr<BackupServer> server;
};

// Options for primary `primary` to connect to `server` over `backend`.
inline LinkOptions LinkTo(const BackupServer& server, const std::string& backend,
                          uint64_t version = 1, const std::string& primary = "p1") {
  LinkOptions o;
  o.address = server.address();
  o.transport = Transport(backend);
  o.version = version;
  o.primary = primary;
  return o;
}

// The same for the server of `b`.
inline LinkOptions Link(const Backup& b, const std::string& backend, uint64_t version = 1,
                        const std::string& primary = "p1") {
  return LinkTo(*b.server, backend, version, primary);
}

inline std::string RandomBytes(std::mt19937_64& rng, size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = char(rng());
  return s;
}

// Polls the backup's view until `pred` holds (or 5 s pass).
template <typename Pred>
bool Eventually(Pred pred) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

}  // namespace slipstream::replication::test
