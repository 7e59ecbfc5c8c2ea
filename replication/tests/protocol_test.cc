// The Tailwind protocol between a primary and backups, on the shm and tcp transports: open,
// append, close and flush; buffer exhaustion and reuse; versions; fencing; a primary that
// dies or tears its last write; a backup that dies under a shipper; the resume position a
// backup gives in its hello, a primary that resumes there after the backup restarted, and a
// prune while a primary ships; a backup whose process stops (tcp).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>
#include <thread>

#include "buffer_scan.h"
#include "control_port.h"
#include "protocol_util.h"
#include "slipstream/engine/log_scanner.h"
#include "slipstream/engine/log_writer.h"
#include "slipstream/rdma/testing.h"
#include "slipstream/replication/backup_link.h"
#include "slipstream/replication/backup_server.h"
#include "slipstream/replication/stream_shipper.h"
#include "slipstream/replication/wal_directory_store.h"
#include "wal_files.h"

namespace slipstream::replication {
namespace {

using namespace test;  // NOLINT: the shared helpers (protocol_util.h)

class Protocol : public ::testing::TestWithParam<std::string> {};

TEST_P(Protocol, AppendsArePlacedAndClosedBuffersPersisted) {
  Backup b(GetParam());
  std::unique_ptr<BackupLink> link;
  Status s = BackupLink::Connect(Link(b, GetParam()), &link);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(link->buffer_size(), kBufferSize);
  EXPECT_EQ(link->buffers(), 4u);
  StreamShipper shipper(kWal, 1, 1000, {link.get()});
  std::mt19937_64 rng(1);
  std::string stream;
  while (stream.size() < 5 * kBufferSize) {  // several buffers
    std::string chunk = RandomBytes(rng, 1 + rng() % 3000);
    Status a = shipper.Append(1000 + stream.size(), chunk);
    ASSERT_TRUE(a.ok()) << a.ToString() << " "
                        << (shipper.failures().empty() ? "" : shipper.failures()[0]);
    stream += chunk;
    if (rng() % 4 == 0) {
      ASSERT_TRUE(shipper.WaitPlaced(shipper.end(), 1, 5000).ok());
      EXPECT_EQ(shipper.Placed(1), 1000 + stream.size());
    }
  }
  uint64_t durable = 0;
  ASSERT_TRUE(shipper.Flush(1, 5000, &durable).ok());
  EXPECT_EQ(durable, 1000 + stream.size());
  // Open buffer: its valid prefix is what was placed.
  std::vector<BufferStatus> buffers = b.server->Buffers();
  ASSERT_EQ(buffers.size(), 1u);
  EXPECT_EQ(buffers[0].primary, "p1");
  EXPECT_EQ(buffers[0].valid, buffers[0].durable);
  link.reset();  // the primary goes away: its open buffer is persisted
  ASSERT_TRUE(Eventually([&] { return b.server->Primaries().empty(); }));
  EXPECT_EQ(b.PersistedStream("p1", 1000), stream);
  EXPECT_TRUE(b.server->Errors().empty());
}

TEST_P(Protocol, BuffersRunOutAndAreReusedZeroed) {
  Backup b(GetParam(), /*buffers=*/8, /*per_primary=*/2);
  std::unique_ptr<BackupLink> link;
  ASSERT_TRUE(BackupLink::Connect(Link(b, GetParam()), &link).ok());
  uint32_t first, second, third;
  ASSERT_TRUE(link->Open(kWal, 1, 0, &first).ok());
  ASSERT_TRUE(link->Open(kWal, 2, 0, &second).ok());
  Status s = link->Open(kWal, 3, 0, &third);
  EXPECT_EQ(s.code(), Status::Code::kWouldBlock) << s.ToString();
  // Fill `first` with one append, close it, and open again: the buffer comes back zeroed.
  std::string image(kBufferSize, '\0');
  engine::LogCursor cursor;
  engine::StartLogSegment(image.data(), kBufferSize, engine::LogKind::kWal, 1, 0, 7, &cursor);
  engine::AppendRecord(image.data(), &cursor, engine::LogRecordType::kWal, 0, {"hello"});
  uint32_t checksum_at = cursor.pos;
  engine::AppendChecksum(image.data(), &cursor);
  ASSERT_TRUE(link->Append(first, image.data(), 0, checksum_at, cursor.pos).ok());
  ASSERT_TRUE(Eventually([&] {
    link->Poll(1);
    return link->placed(first) == cursor.pos;
  }));
  EXPECT_FALSE(link->Close(first, cursor.pos - 1).ok()) << "a close short of the prefix";
  ASSERT_TRUE(BackupLink::Connect(Link(b, GetParam()), &link).ok());  // the old link's session ends
  ASSERT_TRUE(link->Open(kWal, 3, 0, &third).ok());
  ASSERT_TRUE(link->Open(kWal, 4, 0, &first).ok());
  for (const BufferStatus& st : b.server->Buffers()) EXPECT_EQ(st.valid, 0u) << "not zeroed";
  // Sequence 1 was persisted when its session ended, with the one record.
  EXPECT_EQ(b.PersistedStream("p1", 0), "hello");
}

TEST_P(Protocol, StaleVersionsWrongClustersAndWrongSecretsAreRefused) {
  Backup b(GetParam(), 8, 4, /*system_id=*/77);
  std::unique_ptr<BackupLink> link;
  LinkOptions o = Link(b, GetParam(), /*version=*/5);
  o.system_id = 77;
  ASSERT_TRUE(BackupLink::Connect(o, &link).ok());
  link.reset();
  o.version = 4;
  Status s = BackupLink::Connect(o, &link);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("version"), std::string::npos) << s.ToString();
  o.version = 6;
  EXPECT_TRUE(BackupLink::Connect(o, &link).ok());
  uint64_t seen = 0;
  ASSERT_TRUE(b.store.LoadVersion("p1", &seen).ok());
  EXPECT_EQ(seen, 6u);
  link.reset();
  o.system_id = 78;
  s = BackupLink::Connect(o, &link);
  EXPECT_NE(s.message().find("cluster"), std::string::npos) << s.ToString();
  o.system_id = 77;
  o.transport.secret = "wrong";
  EXPECT_FALSE(BackupLink::Connect(o, &link).ok());
  EXPECT_TRUE(Eventually([&] { return b.server->Primaries().empty(); }));
}

// A backup replaying timeline 2 (seeded after a failover) serves a primary writing timeline
// 2, and tools that name none, but refuses one still writing timeline 1 (and the reverse: a
// backup of the old timeline is never fed the new one's WAL).
TEST_P(Protocol, APrimaryOfAnotherTimelineIsRefused) {
  TempDir dir;
  FileBackupStore store(dir.path());
  BackupOptions bo;
  bo.transport = Transport(GetParam());
  bo.buffers = 8;
  bo.buffers_per_primary = 4;
  bo.buffer_size = kBufferSize;
  bo.timeline = 2;
  BackupServer server(bo, &store);
  ASSERT_TRUE(server.Start().ok());
  LinkOptions o = LinkTo(server, GetParam());
  std::unique_ptr<BackupLink> link;
  o.timeline = 1;
  Status s = BackupLink::Connect(o, &link);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("timeline"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("seed it again"), std::string::npos) << s.ToString();
  o.timeline = 2;
  s = BackupLink::Connect(o, &link);
  EXPECT_TRUE(s.ok()) << s.ToString();
  link.reset();
  ASSERT_TRUE(Eventually([&] { return server.Primaries().empty(); }));
  o.timeline = 0;
  EXPECT_TRUE(BackupLink::Connect(o, &link).ok());
}

TEST_P(Protocol, AFencedPrimaryCannotWriteAndItsPlacedBytesSurvive) {
  Backup b(GetParam());
  std::unique_ptr<BackupLink> link;
  ASSERT_TRUE(BackupLink::Connect(Link(b, GetParam()), &link).ok());
  StreamShipper shipper(kWal, 1, 0, {link.get()});
  std::mt19937_64 rng(2);
  std::string stream = RandomBytes(rng, 20000);
  ASSERT_TRUE(shipper.Append(0, stream).ok());
  ASSERT_TRUE(shipper.WaitPlaced(stream.size(), 1, 5000).ok());
  ASSERT_TRUE(b.server->Fence("p1").ok());
  EXPECT_FALSE(b.server->Fence("p1").ok()) << "no session is left to fence";
  // The zombie's next writes fail; nothing more reaches the backup.
  std::string more = RandomBytes(rng, 5000);
  Status s = shipper.Append(stream.size(), more);
  if (s.ok()) s = shipper.WaitPlaced(shipper.end(), 1, 2000);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(b.PersistedStream("p1", 0), stream);
}

// Tailwind's Figure 5: the primary dies in the middle of an append (the transport tears the
// WRITE and drops the connection); the backup keeps exactly the appends before it. The last
// append is one 416-byte record (16-byte header, 400 bytes) and its 8-byte checksum, which shm
// and tcp send in the same WRITE (they place its bytes in address order): tears inside the
// header, inside the payload, after the whole record (the checksum never arrives) and inside
// the checksum. Torn checksums are also covered byte by byte in scan_fuzz_test.cc.
TEST_P(Protocol, ATornLastAppendIsNotKept) {
  for (int64_t tear : {0, 5, 15, 16, 40, 300, 415, 416, 419, 423}) {
    Backup b(GetParam());
    std::unique_ptr<BackupLink> link;
    ASSERT_TRUE(BackupLink::Connect(Link(b, GetParam()), &link).ok());
    StreamShipper shipper(kWal, 1, 0, {link.get()});
    std::mt19937_64 rng{uint64_t(tear)};
    std::string kept = RandomBytes(rng, 3000);
    ASSERT_TRUE(shipper.Append(0, kept).ok());
    ASSERT_TRUE(shipper.WaitPlaced(kept.size(), 1, 5000).ok());
    rdma::TestFaults(link->connection_for_testing())->tear_next_write_after = tear;
    std::string lost = RandomBytes(rng, 400);
    Status s = shipper.Append(kept.size(), lost);
    if (s.ok()) s = shipper.WaitPlaced(shipper.end(), 1, 2000);
    EXPECT_FALSE(s.ok()) << "tear at " << tear;
    ASSERT_TRUE(Eventually([&] { return b.server->Primaries().empty(); }));
    EXPECT_EQ(b.PersistedStream("p1", 0), kept) << "tear at " << tear;
  }
}

TEST_P(Protocol, AShipperGoesOnWhenOneOfTwoBackupsDies) {
  Backup b1(GetParam()), b2(GetParam());
  std::unique_ptr<BackupLink> l1, l2;
  ASSERT_TRUE(BackupLink::Connect(Link(b1, GetParam()), &l1).ok());
  ASSERT_TRUE(BackupLink::Connect(Link(b2, GetParam()), &l2).ok());
  StreamShipper shipper(kWal, 1, 0, {l1.get(), l2.get()});
  std::mt19937_64 rng(3);
  std::string stream;
  for (int i = 0; i < 50; i++) {
    std::string chunk = RandomBytes(rng, 2000);
    ASSERT_TRUE(shipper.Append(stream.size(), chunk).ok());
    stream += chunk;
  }
  ASSERT_TRUE(shipper.WaitPlaced(stream.size(), 2, 5000).ok());
  b2.server->Stop();  // the second backup dies
  for (int i = 0; i < 50; i++) {
    std::string chunk = RandomBytes(rng, 2000);
    Status s = shipper.Append(stream.size(), chunk);
    ASSERT_TRUE(s.ok()) << s.ToString();
    stream += chunk;
  }
  ASSERT_TRUE(shipper.WaitPlaced(stream.size(), 1, 5000).ok());
  Status two = shipper.WaitPlaced(stream.size(), 2, 2000);
  EXPECT_EQ(two.code(), Status::Code::kUnavailable) << two.ToString();
  EXPECT_EQ(shipper.live(), 1);
  EXPECT_EQ(shipper.failures().size(), 1u);
  uint64_t durable = 0;
  ASSERT_TRUE(shipper.Flush(1, 5000, &durable).ok());
  EXPECT_EQ(durable, stream.size());
  l1.reset();
  ASSERT_TRUE(Eventually([&] { return b1.server->Primaries().empty(); }));
  EXPECT_EQ(b1.PersistedStream("p1", 0), stream);
}

TEST_P(Protocol, AMalformedPeerIsDroppedAndTheServerGoesOn) {
  Backup b(GetParam());
  // A peer that authenticates but sends an OPEN before HELLO.
  std::unique_ptr<rdma::Connection> raw;
  ASSERT_TRUE(rdma::Connect(Transport(GetParam()), b.server->address(), &raw).ok());
  rdma::LocalRegion r;
  ASSERT_TRUE(raw->AllocateRegion(4096, rdma::kLocalOnly, &r).ok());
  std::string bytes = Encode(Open{kWal, 1, 0});
  std::memcpy(r.addr, bytes.data(), bytes.size());
  rdma::Sge sge{r.addr, uint32_t(bytes.size()), r.lkey};
  rdma::WorkRequest wr;
  wr.opcode = rdma::Opcode::kSend;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ASSERT_TRUE(raw->Post(&wr, 1).ok());
  ASSERT_TRUE(Eventually([&] { return !b.server->Errors().empty(); }));
  // A real primary is still served.
  std::unique_ptr<BackupLink> link;
  EXPECT_TRUE(BackupLink::Connect(Link(b, GetParam()), &link).ok());
}

// A backup played by the test: it takes one connection on `listener` and answers the
// primary's requests with `answers`, one each, then waits until the primary hangs up.
void ScriptedBackup(rdma::Listener* listener, const std::vector<Message>& answers) {
  std::unique_ptr<rdma::Connection> connection;
  ASSERT_TRUE(listener->Accept(5000, &connection).ok());
  ControlPort port(connection.get());
  ASSERT_TRUE(port.Init().ok());
  for (const Message& answer : answers) {
    Message request;
    ASSERT_TRUE(port.Receive(5000, &request, nullptr).ok());
    ASSERT_TRUE(port.Send(answer, nullptr).ok());
  }
  Message none;
  (void)port.Receive(5000, &none, nullptr);
}

// Options for primary "p1" to connect to the scripted backup at `listener`.
LinkOptions LinkToScripted(const rdma::Listener& listener, const std::string& backend) {
  LinkOptions o;
  o.address = listener.address();
  o.transport = Transport(backend);
  o.primary = "p1";
  return o;
}

// A backup (a stranger holding the secret, or a broken one) that answers HELLO with buffers no
// segment fits is refused at once: the shipper used to format a segment header of 64 bytes into
// an image of the offered size, overrunning it when smaller, and to rotate forever when a
// header and an append did not fit. Found by tests/fuzz/backup_link_fuzz
// (regressions/backup_link/).
TEST_P(Protocol, ABackupOfferingUnusableBuffersIsRefused) {
  std::unique_ptr<rdma::Listener> listener;
  ASSERT_TRUE(rdma::Listen(Transport(GetParam()), "127.0.0.1:0", &listener).ok());
  for (uint32_t size : {0u, 16u, 100u, 4096u, 100000u, 1u << 31, 64u * 1024}) {
    std::thread backup(ScriptedBackup, listener.get(),
                       std::vector<Message>{HelloOk{1, size, 4, 0, 0}});
    std::unique_ptr<BackupLink> link;
    Status s = BackupLink::Connect(LinkToScripted(*listener, GetParam()), &link);
    if (size == 64u * 1024) {
      EXPECT_TRUE(s.ok()) << s.ToString();
    } else {
      EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << "buffer size " << size;
    }
    link.reset();
    backup.join();
  }
}

// A backup that answers OPEN with a buffer it did not grant, or one whose index does not fit
// the high half of a WRITE's work request id below ControlPort::kOwnIds, is refused: such an id
// made the WRITEs' completions look like the control port's own, so placement was never learnt
// (the shipper waited 5 s and dropped the backup) and a send slot still in use was freed.
// Found by tests/fuzz/backup_link_fuzz (regressions/backup_link/).
TEST_P(Protocol, ABackupHandingOutAnUngrantedBufferIsRefused) {
  std::unique_ptr<rdma::Listener> listener;
  ASSERT_TRUE(rdma::Listen(Transport(GetParam()), "127.0.0.1:0", &listener).ok());
  for (uint32_t index : {1u << 30, 4u, 0xffffffffu, 3u}) {
    std::thread backup(ScriptedBackup, listener.get(),
                       std::vector<Message>{HelloOk{1, kBufferSize, 4, 0, 0},
                                            OpenOk{index, 0x10000, kBufferSize, 77}});
    std::unique_ptr<BackupLink> link;
    ASSERT_TRUE(BackupLink::Connect(LinkToScripted(*listener, GetParam()), &link).ok());
    uint32_t buffer = 0;
    Status s = link->Open(kWal, 1, 0, &buffer);
    if (index == 3u) {
      EXPECT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(buffer, 3u);
    } else {
      EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << "buffer " << index;
    }
    link.reset();
    backup.join();
  }
}

// A VERSION file is read back only as SaveVersion writes it: "-1", a number past 2^64 - 1 or
// trailing damage used to be read as a version (the first two as the largest, which fenced the
// primary for good). Found by tests/fuzz/backup_files_fuzz (regressions/backup_files/).
TEST(BackupFiles, AVersionFileHoldsExactlyWhatSaveVersionWrites) {
  TempDir dir;
  FileBackupStore store(dir.path());
  for (uint64_t version : {uint64_t{0}, uint64_t{1}, uint64_t{907}, UINT64_MAX}) {
    ASSERT_TRUE(store.SaveVersion("p1", version).ok());
    uint64_t loaded = 1234;
    ASSERT_TRUE(store.LoadVersion("p1", &loaded).ok());
    EXPECT_EQ(loaded, version);
  }
  for (const char* text : {"-1\n", "18446744073709551616\n", "99999999999999999999999\n", "12abc\n",
                           "12\n\n", " 5\n", "+5\n", "007\n", "5", "\n", "0x10\n"}) {
    std::ofstream(dir.path() + "/p1/VERSION", std::ios::binary | std::ios::trunc) << text;
    uint64_t loaded = 1234;
    EXPECT_EQ(store.LoadVersion("p1", &loaded).code(), Status::Code::kIOError) << text;
  }
}

TEST_P(Protocol, HelloTellsWhereTheBackupsCopyEnds) {
  Backup b(GetParam());
  std::unique_ptr<BackupLink> link;
  ASSERT_TRUE(BackupLink::Connect(Link(b, GetParam()), &link).ok());
  EXPECT_EQ(link->resume(), 0u) << "a new backup holds nothing";
  StreamShipper shipper(kWal, 1000, 1000, {link.get()});
  std::mt19937_64 rng(4);
  std::string stream = RandomBytes(rng, 3 * kBufferSize);
  for (size_t at = 0; at < stream.size(); at += 5000) {
    ASSERT_TRUE(shipper.Append(1000 + at, std::string_view(stream).substr(at, 5000)).ok());
  }
  ASSERT_TRUE(shipper.WaitPlaced(shipper.end(), 1, 5000).ok());
  link.reset();  // the open buffer is persisted when the session ends
  ASSERT_TRUE(Eventually([&] { return b.server->Primaries().empty(); }));
  ASSERT_TRUE(BackupLink::Connect(Link(b, GetParam()), &link).ok());
  EXPECT_EQ(link->resume(), 1000 + stream.size());
}

// With a persist interval, what is placed becomes durable without a close or a flush.
TEST_P(Protocol, OpenBuffersArePersistedPeriodically) {
  TempDir dir;
  FileBackupStore store(dir.path());
  BackupOptions o;
  o.transport = Transport(GetParam());
  o.buffer_size = kBufferSize;
  o.persist_interval_ms = 20;
  BackupServer server(o, &store);
  ASSERT_TRUE(server.Start().ok());
  LinkOptions lo = LinkTo(server, GetParam());
  std::unique_ptr<BackupLink> link;
  ASSERT_TRUE(BackupLink::Connect(lo, &link).ok());
  StreamShipper shipper(kWal, 500, 500, {link.get()});
  std::mt19937_64 rng(6);
  std::string stream;
  for (int round = 0; round < 3; round++) {
    std::string chunk = RandomBytes(rng, 7000);
    ASSERT_TRUE(shipper.Append(500 + stream.size(), chunk).ok());
    stream += chunk;
    ASSERT_TRUE(shipper.WaitPlaced(shipper.end(), 1, 5000).ok());
    EXPECT_TRUE(Eventually([&] { return store.ResumePosition("p1", kWal) == shipper.end(); }))
        << "round " << round;
  }
  EXPECT_EQ(shipper.Durable(1), 500u) << "the primary was told of no close or flush";
}

// The bytes of WAL positions [position, position + n) in a pg_wal directory.
std::string ReadWal(const std::string& dir, uint64_t segment_size, uint64_t position, size_t n) {
  std::string out;
  while (out.size() < n) {
    uint64_t p = position + out.size();
    std::ifstream in(dir + "/" + WalFileName(1, p / segment_size, segment_size), std::ios::binary);
    std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (file.size() != segment_size) break;
    size_t take = std::min<size_t>(n - out.size(), segment_size - p % segment_size);
    out.append(file, p % segment_size, take);
  }
  return out;
}

// A backup that is a standby: its server persists into a WalDirectoryStore. It is "restarted"
// from a copy of its directories taken while it ran, which is what a crash leaves: the closed
// and flushed buffers, not the placed bytes of the open one. The primary reconnects, resumes
// at the position the hello gives, and the standby's pg_wal ends up holding the whole stream.
TEST_P(Protocol, APrimaryResumesWithNoGapAfterTheBackupRestarts) {
  constexpr uint64_t kSegment = 1ull << 20;
  const uint64_t start = 3 * kSegment - 4000;  // where the standby's own WAL ends
  TempDir before, after;
  for (const TempDir* d : {&before, &after}) {
    std::filesystem::create_directories(d->path() + "/images");
    std::filesystem::create_directories(d->path() + "/pg_wal");
  }
  auto open_store = [&](const TempDir& d, std::unique_ptr<WalDirectoryStore>* store) {
    WalDirectoryOptions o;
    o.image_directory = d.path() + "/images";
    o.wal_directory = d.path() + "/pg_wal";
    o.segment_size = kSegment;
    o.resume = start;  // the replay position: it does not move in this test
    Status s = WalDirectoryStore::Open(o, store);
    ASSERT_TRUE(s.ok()) << s.ToString();
  };
  BackupOptions bo;
  bo.transport = Transport(GetParam());
  bo.buffers = 8;
  bo.buffers_per_primary = 4;
  bo.buffer_size = kBufferSize;
  std::unique_ptr<WalDirectoryStore> store;
  open_store(before, &store);
  auto server = std::make_unique<BackupServer>(bo, store.get());
  ASSERT_TRUE(server->Start().ok());
  LinkOptions lo = LinkTo(*server, GetParam());
  std::unique_ptr<BackupLink> link;
  ASSERT_TRUE(BackupLink::Connect(lo, &link).ok());
  ASSERT_EQ(link->resume(), start);

  // Ship across buffers and a WAL segment boundary, flush, then place more without a flush.
  std::mt19937_64 rng(5);
  std::string stream = RandomBytes(rng, 5 * kBufferSize + 1234);
  auto shipper = std::make_unique<StreamShipper>(kWal, start, start, std::vector{link.get()});
  size_t flushed_at = 4 * kBufferSize;
  for (size_t at = 0; at < flushed_at; at += 3000) {
    size_t n = std::min<size_t>(3000, flushed_at - at);
    ASSERT_TRUE(shipper->Append(start + at, std::string_view(stream).substr(at, n)).ok());
  }
  uint64_t durable = 0;
  ASSERT_TRUE(shipper->Flush(1, 5000, &durable).ok());
  ASSERT_EQ(durable, start + flushed_at);
  size_t placed_to = flushed_at + 5000;
  ASSERT_TRUE(
      shipper->Append(start + flushed_at, std::string_view(stream).substr(flushed_at, 5000)).ok());
  ASSERT_TRUE(shipper->WaitPlaced(start + placed_to, 1, 5000).ok());
  ASSERT_EQ(shipper->Durable(1), start + flushed_at);
  std::filesystem::copy(
      before.path(), after.path(),
      std::filesystem::copy_options::recursive | std::filesystem::copy_options::overwrite_existing);
  shipper.reset();
  link.reset();
  server.reset();
  store.reset();

  // The backup comes back: its hello says where its durable WAL ends, below what was placed.
  open_store(after, &store);
  server = std::make_unique<BackupServer>(bo, store.get());
  ASSERT_TRUE(server->Start().ok());
  lo.address = server->address();
  ASSERT_TRUE(BackupLink::Connect(lo, &link).ok());
  uint64_t resume = link->resume();
  EXPECT_EQ(resume, start + flushed_at);
  EXPECT_LT(resume, start + placed_to);

  // A primary that ships from beyond the resume position leaves a gap: refused, and the link
  // that tried is dropped.
  shipper =
      std::make_unique<StreamShipper>(kWal, resume + 100, resume + 100, std::vector{link.get()});
  ASSERT_TRUE(
      shipper->Append(resume + 100, std::string_view(stream).substr(resume - start + 100, 1000))
          .ok());
  Status s = shipper->Flush(1, 5000, &durable);
  EXPECT_FALSE(s.ok());
  ASSERT_EQ(shipper->failures().size(), 1u);
  EXPECT_NE(shipper->failures()[0].find("gap"), std::string::npos) << shipper->failures()[0];
  shipper.reset();
  ASSERT_TRUE(BackupLink::Connect(lo, &link).ok());
  ASSERT_EQ(link->resume(), resume) << "the refused bytes were not written";

  // Resuming at the position the hello gives: the rest of the stream, then more.
  shipper = std::make_unique<StreamShipper>(kWal, resume, resume, std::vector{link.get()});
  for (uint64_t at = resume - start; at < stream.size(); at += 3000) {
    size_t n = std::min<size_t>(3000, stream.size() - at);
    ASSERT_TRUE(shipper->Append(start + at, std::string_view(stream).substr(at, n)).ok());
  }
  ASSERT_TRUE(shipper->Flush(1, 5000, &durable).ok());
  EXPECT_EQ(durable, start + stream.size());
  // The WAL is in pg_wal when the flush is answered; its fsync, and the WAL end, follow.
  EXPECT_EQ(ReadWal(after.path() + "/pg_wal", kSegment, start, stream.size()), stream);
  EXPECT_TRUE(Eventually([&] { return store->WalEnd() == start + stream.size(); }));
  shipper.reset();
  link.reset();
  server.reset();
  EXPECT_EQ(store->ResumePosition("p1", kWal), start + stream.size());
}

// A standby's server prunes while a primary ships: the closed buffers' images go, the open
// one's stays (the server persists it from an offset later), and the primary goes on appending
// and closing buffers with no error; the image left and those after it hold the WAL gap-free.
TEST_P(Protocol, APruneSparesOpenBuffersAndThePrimaryGoesOn) {
  constexpr uint64_t kSegment = 1ull << 20;
  const uint64_t start = 2 * kSegment - 1000;
  TempDir dir;
  std::filesystem::create_directories(dir.path() + "/images");
  std::filesystem::create_directories(dir.path() + "/pg_wal");
  WalDirectoryOptions wo;
  wo.image_directory = dir.path() + "/images";
  wo.wal_directory = dir.path() + "/pg_wal";
  wo.segment_size = kSegment;
  wo.resume = start;
  std::unique_ptr<WalDirectoryStore> store;
  ASSERT_TRUE(WalDirectoryStore::Open(wo, &store).ok());
  BackupOptions bo;
  bo.transport = Transport(GetParam());
  bo.buffer_size = kBufferSize;
  BackupServer server(bo, store.get());
  ASSERT_TRUE(server.Start().ok());
  LinkOptions lo = LinkTo(server, GetParam());
  std::unique_ptr<BackupLink> link;
  ASSERT_TRUE(BackupLink::Connect(lo, &link).ok());
  StreamShipper shipper(kWal, start, start, {link.get()});
  std::mt19937_64 rng(8);
  std::string stream;
  auto ship = [&](size_t n) {
    std::string chunk = RandomBytes(rng, n);
    for (size_t at = 0; at < n; at += 3000) {
      size_t k = std::min<size_t>(3000, n - at);
      ASSERT_TRUE(shipper.Append(start + stream.size(), chunk.substr(at, k)).ok());
      stream.append(chunk, at, k);
    }
    uint64_t durable = 0;
    ASSERT_TRUE(shipper.Flush(1, 5000, &durable).ok());
    ASSERT_EQ(durable, start + stream.size());
    ASSERT_TRUE(Eventually([&] { return store->WalEnd() == start + stream.size(); }));
  };
  ship(3 * kBufferSize + kBufferSize / 2);  // three buffers closed, one open
  FileBackupStore view(dir.path() + "/images");
  std::vector<BufferStatus> open = server.Buffers();
  ASSERT_EQ(open.size(), 1u);
  ASSERT_EQ(view.SegmentFiles("p1", kWal).size(), 4u);

  PruneStats removed;
  Status s = server.Prune(store->WalEnd(), &removed);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(removed.files, 3u);
  std::vector<std::string> left = view.SegmentFiles("p1", kWal);
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0], view.SegmentPath(SegmentId{"p1", kWal, open[0].sequence, open[0].start}));

  ship(2 * kBufferSize);  // the open buffer fills and closes, and more follow
  EXPECT_TRUE(server.Errors().empty()) << server.Errors()[0];
  EXPECT_EQ(ReadWal(wo.wal_directory, kSegment, start, stream.size()), stream);
  std::vector<std::string> files;
  std::vector<PersistedRecord> records;
  s = view.PersistedRecords("p1", kWal, &files, &records);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_FALSE(records.empty());
  EXPECT_EQ(records.front().position, open[0].start);
  EXPECT_EQ(ContiguousEnd(records, 0), start + stream.size());
}

// A backup whose process stops (SIGSTOP: alive, its sockets open, acknowledging nothing) is
// given up by a shipper that goes on appending: once the transport's queue is full, Append
// waits for completions append_timeout_ms at most and the link fails. It used to wait for as long
// as the process stayed stopped, and the shipper in PostgreSQL with it, under the lock every
// commit's placement takes. Over tcp only: over shm a WRITE needs nothing of the backup.
TEST(ProtocolTcp, AShipperGivesUpABackupWhoseProcessStopped) {
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  pid_t child = ::fork();  // before this process starts any thread
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(pipe_fds[0]);
    Backup b("tcp");
    std::string said = b.server->address() + "\n" + b.dir.path() + "\n";
    if (::write(pipe_fds[1], said.data(), said.size()) != ssize_t(said.size())) _exit(1);
    for (;;) ::pause();
  }
  ::close(pipe_fds[1]);
  std::string said;
  char c;
  while (::read(pipe_fds[0], &c, 1) == 1) {
    said += c;
    if (std::count(said.begin(), said.end(), '\n') == 2) break;
  }
  ::close(pipe_fds[0]);
  const std::string address = said.substr(0, said.find('\n'));
  const std::string dir = said.substr(said.find('\n') + 1, said.rfind('\n') - said.find('\n') - 1);
  // Ends the backup process and removes its directory, on every way out of the test.
  struct ChildGuard {
    pid_t pid;
    std::string dir;
    ~ChildGuard() {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      if (!dir.empty()) std::filesystem::remove_all(dir);
    }
  };
  std::unique_ptr<ChildGuard> guard(new ChildGuard{child, dir});
  ASSERT_FALSE(address.empty()) << "the backup process did not start";

  LinkOptions o;
  o.address = address;
  o.transport = Transport("tcp");
  o.version = 1;
  o.primary = "p1";
  o.append_timeout_ms = 500;
  std::unique_ptr<BackupLink> link;
  Status connected = BackupLink::Connect(o, &link);
  ASSERT_TRUE(connected.ok()) << connected.ToString();
  StreamShipper shipper(kWal, 1, 0, {link.get()});
  std::string chunk(16, 'w');  // small appends: the queue fills long before the buffer
  uint64_t position = 0;
  for (int i = 0; i < 10; i++, position += chunk.size()) {
    ASSERT_TRUE(shipper.Append(position, chunk).ok());
  }
  ASSERT_TRUE(shipper.WaitPlaced(position, 1, 5000).ok());
  ::kill(child, SIGSTOP);
  auto appending = std::async(std::launch::async, [&] {
    for (int i = 0; i < 100000; i++, position += chunk.size()) {
      Status s = shipper.Append(position, chunk);
      if (!s.ok()) return s;
    }
    return Status::OK();
  });
  // A liveness bound, not a speed one: the link fails after append_timeout_ms (half a second).
  bool returned = appending.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
  guard.reset();  // lets a blocked Append fail, so that the test ends either way
  ASSERT_TRUE(returned) << "Append waited on a stopped backup";
  Status s = appending.get();
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(shipper.live(), 0);
  ASSERT_EQ(shipper.failures().size(), 1u);
  EXPECT_NE(shipper.failures()[0].find("acknowledged none of the WRITEs in flight"),
            std::string::npos)
      << shipper.failures()[0];
}

INSTANTIATE_TEST_SUITE_P(Transports, Protocol, ::testing::Values("shm", "tcp"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace slipstream::replication
