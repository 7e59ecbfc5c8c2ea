// Placement by other processes of the primary (direct_append.h, placer_link.h), on shm (the
// backup's heap mapped) and tcp (a placer link that JOINs the shipper's session): appends
// through an exported cursor interleave with the shipper's own across rotations; a fenced
// backup refuses them; a placer link of another incarnation of the primary is refused; a
// buffer is revoked from placer links before it is persisted and reused; a broken cursor makes
// the shipper drop and resume.
#include "slipstream/replication/direct_append.h"

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "protocol_util.h"
#include "slipstream/rdma/shm_peer.h"
#include "slipstream/rdma/testing.h"
#include "slipstream/replication/placer_link.h"
#include "slipstream/replication/stream_shipper.h"

namespace slipstream::replication {
namespace {

using namespace test;  // NOLINT: the shared helpers (protocol_util.h)

// A process's way into the backup's open buffer: its own mapping of the backup's heap (shm) or
// its own placer link (tcp).
struct Appender {
  std::unique_ptr<ShmDirectTarget> shm;
  std::unique_ptr<PlacerLink> placer;

  DirectTarget* target() { return shm ? static_cast<DirectTarget*>(shm.get()) : placer.get(); }
  // AppendDirect, and over tcp the wait for the backup's ACKs; on a failed wait the cursor is
  // put back as it was, marked broken, as a backend does.
  Status Append(SharedCursor* cursor, uint64_t at, std::string_view bytes, size_t* appended) {
    const SharedCursor before = *cursor;
    Status s = AppendDirect(cursor, target(), at, bytes, appended);
    if (s.ok() && placer) {
      s = placer->Finish(5000);
      if (!s.ok()) {
        *cursor = before;
        cursor->valid = 0;
        cursor->broken = 1;
        *appended = 0;
      }
    }
    return s;
  }
};

// Opens an Appender for `cursor` (exported by a shipper linked to `b` as primary p1, version 1).
Status OpenAppender(const Backup& b, const std::string& transport, const SharedCursor& cursor,
                    Appender* out) {
  if (transport == "shm") {
    std::unique_ptr<rdma::ShmPeerWriter> writer;
    Status s = rdma::ShmPeerWriter::Open(cursor.peer, &writer);
    if (s.ok()) out->shm = std::make_unique<ShmDirectTarget>(std::move(writer));
    return s;
  }
  return PlacerLink::Connect(Link(b, "tcp"), &out->placer);
}

class DirectAppend : public ::testing::TestWithParam<std::string> {};

// Appends through the cursor, interleaved at random with the shipper's own appends and
// rotations, leave on the backup exactly the stream, as one chain per buffer.
TEST_P(DirectAppend, InterleavesWithTheShipperAcrossRotations) {
  const std::string transport = GetParam();
  Backup b(transport);
  std::unique_ptr<BackupLink> link;
  ASSERT_TRUE(BackupLink::Connect(Link(b, transport), &link).ok());
  StreamShipper shipper(kWal, 1, 500, {link.get()});
  std::mt19937_64 rng(11);
  std::string stream = RandomBytes(rng, 100);
  ASSERT_TRUE(shipper.Append(500, stream).ok());
  ASSERT_TRUE(shipper.WaitPlaced(shipper.end(), 1, 5000).ok());
  SharedCursor cursor;
  shipper.ExportCursor(&cursor);
  ASSERT_EQ(cursor.valid, 1u);
  ASSERT_EQ(cursor.transport,
            uint32_t(transport == "shm" ? CursorTransport::kShm : CursorTransport::kTcp));
  ASSERT_EQ(cursor.end, 500 + stream.size());
  Appender appender;
  ASSERT_TRUE(OpenAppender(b, transport, cursor, &appender).ok());
  int direct = 0, rotations = 0;
  while (stream.size() < 6 * kBufferSize) {
    std::string chunk = RandomBytes(rng, 1 + rng() % 4000);
    const uint64_t at = 500 + stream.size();
    size_t appended = 0;
    if (rng() % 3 != 0 && cursor.valid) {
      ASSERT_TRUE(appender.Append(&cursor, at, chunk, &appended).ok());
      direct += appended > 0 ? 1 : 0;
    }
    if (appended < chunk.size()) {  // the shipper's turn, or a full buffer: it rotates
      const uint64_t sequence = cursor.sequence;
      ASSERT_TRUE(shipper.AdoptCursor(cursor).ok());
      ASSERT_EQ(shipper.end(), at + appended);
      ASSERT_TRUE(shipper.Append(at + appended, chunk.substr(appended)).ok());
      // Over tcp the shipper's WRITEs complete later: it describes the buffer once they did.
      ASSERT_TRUE(shipper.WaitPlaced(shipper.end(), 1, 5000).ok());
      shipper.ExportCursor(&cursor);
      ASSERT_EQ(cursor.valid, 1u);
      rotations += cursor.sequence != sequence ? 1 : 0;
    }
    stream += chunk;
  }
  ASSERT_TRUE(shipper.AdoptCursor(cursor).ok());
  ASSERT_TRUE(shipper.WaitPlaced(shipper.end(), 1, 5000).ok());
  size_t appended = 0;
  ASSERT_TRUE(appender.Append(&cursor, 500 + stream.size(), "tail", &appended).ok());
  ASSERT_EQ(appended, 4u);
  stream += "tail";
  ASSERT_TRUE(shipper.AdoptCursor(cursor).ok());
  EXPECT_EQ(shipper.Placed(1), 500 + stream.size()) << "a direct append is placed when it returns";
  uint64_t durable = 0;
  ASSERT_TRUE(shipper.Flush(1, 5000, &durable).ok());
  EXPECT_EQ(durable, 500 + stream.size());
  EXPECT_GT(direct, 100);
  EXPECT_GE(rotations, 4);
  link.reset();
  ASSERT_TRUE(Eventually([&] { return b.server->Primaries().empty(); }));
  EXPECT_EQ(b.PersistedStream("p1", 500), stream);
  EXPECT_TRUE(b.server->Errors().empty());
}

// A fenced primary's backends cannot place either: the backup revokes the buffer's key before
// it persists, so a direct append after the fence is refused and the cursor given up, and what
// was placed before survives.
TEST_P(DirectAppend, AFencedBackupRefusesDirectAppends) {
  const std::string transport = GetParam();
  Backup b(transport);
  std::unique_ptr<BackupLink> link;
  ASSERT_TRUE(BackupLink::Connect(Link(b, transport), &link).ok());
  StreamShipper shipper(kWal, 1, 0, {link.get()});
  ASSERT_TRUE(shipper.Append(0, "first").ok());
  ASSERT_TRUE(shipper.WaitPlaced(shipper.end(), 1, 5000).ok());
  SharedCursor cursor;
  shipper.ExportCursor(&cursor);
  Appender appender;
  ASSERT_TRUE(OpenAppender(b, transport, cursor, &appender).ok());
  size_t appended = 0;
  ASSERT_TRUE(appender.Append(&cursor, 5, "second", &appended).ok());
  ASSERT_EQ(appended, 6u);
  ASSERT_TRUE(b.server->Fence("p1").ok());
  Status s = appender.Append(&cursor, 11, "third", &appended);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(appended, 0u);
  EXPECT_EQ(cursor.valid, 0u);
  EXPECT_EQ(cursor.end, 11u) << "the cursor keeps what was placed";
  EXPECT_EQ(b.PersistedStream("p1", 0), "firstsecond");
}

INSTANTIATE_TEST_SUITE_P(Transports, DirectAppend, ::testing::Values("shm", "tcp"),
                         [](const auto& info) { return info.param; });

// Out-of-order appends are refused, and a description of a process that is not the backup's
// maps nothing.
TEST(DirectAppendShm, AppendsStayInOrderAndForeignHeapsAreRefused) {
  Backup b("shm");
  std::unique_ptr<BackupLink> link;
  ASSERT_TRUE(BackupLink::Connect(Link(b, "shm"), &link).ok());
  StreamShipper shipper(kWal, 1, 0, {link.get()});
  SharedCursor cursor;
  shipper.ExportCursor(&cursor);
  EXPECT_EQ(cursor.valid, 0u) << "no buffer is open before the first append";
  ASSERT_TRUE(shipper.Append(0, "bytes").ok());
  shipper.ExportCursor(&cursor);
  ASSERT_EQ(cursor.valid, 1u);
  Appender appender;
  ASSERT_TRUE(OpenAppender(b, "shm", cursor, &appender).ok());
  size_t appended = 0;
  EXPECT_EQ(appender.Append(&cursor, 4, "x", &appended).code(), Status::Code::kInvalidArgument);
  rdma::ShmPeerRef wrong = cursor.peer;
  wrong.token[0] ^= 1;
  std::unique_ptr<rdma::ShmPeerWriter> other;
  EXPECT_FALSE(rdma::ShmPeerWriter::Open(wrong, &other).ok());
}

// A JOIN must name a live session of the primary at its exact version, over a transport that
// can share buffers; a placer link registers the buffers open when it joins and those opened
// later.
TEST(PlacerLink, JoinsOnlyTheLiveSessionOfItsPrimaryAndVersion) {
  Backup b("tcp");
  std::unique_ptr<PlacerLink> placer;
  Status s = PlacerLink::Connect(Link(b, "tcp"), &placer);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << "no session yet: " << s.ToString();

  std::unique_ptr<BackupLink> link;
  ASSERT_TRUE(BackupLink::Connect(Link(b, "tcp", /*version=*/3), &link).ok());
  EXPECT_FALSE(PlacerLink::Connect(Link(b, "tcp", 2), &placer).ok()) << "an older incarnation";
  EXPECT_FALSE(PlacerLink::Connect(Link(b, "tcp", 4), &placer).ok()) << "a newer one";
  EXPECT_FALSE(PlacerLink::Connect(Link(b, "tcp", 3, "p2"), &placer).ok()) << "another primary";
  EXPECT_FALSE(PlacerLink::Connect(Link(b, "shm", 3), &placer).ok()) << "shm cannot share";
  LinkOptions wrong_secret = Link(b, "tcp", 3);
  wrong_secret.transport.secret = "not-the-secret";
  EXPECT_FALSE(PlacerLink::Connect(wrong_secret, &placer).ok());

  StreamShipper shipper(kWal, 1, 0, {link.get()});
  ASSERT_TRUE(shipper.Append(0, "opened").ok());
  ASSERT_TRUE(PlacerLink::Connect(Link(b, "tcp", 3), &placer).ok());
  EXPECT_EQ(placer->registered_at_join(), 1u);
  EXPECT_TRUE(b.server->Primaries() == std::vector<std::string>{"p1"})
      << "a placer link is not a primary of its own";
  EXPECT_TRUE(b.server->Errors().empty());
}

// A tcp backup whose shipper placed a few bytes and described its open buffer, and a placer
// link that joined that shipper's session.
struct DescribedTcpBuffer {
  Backup b{"tcp"};
  std::unique_ptr<BackupLink> link;
  std::unique_ptr<StreamShipper> shipper;
  SharedCursor cursor;
  std::unique_ptr<PlacerLink> placer;

  void Open() {
    ASSERT_TRUE(BackupLink::Connect(Link(b, "tcp"), &link).ok());
    shipper = std::make_unique<StreamShipper>(kWal, 1, 0, std::vector<BackupLink*>{link.get()});
    ASSERT_TRUE(shipper->Append(0, "bytes").ok());
    ASSERT_TRUE(shipper->WaitPlaced(shipper->end(), 1, 5000).ok());
    shipper->ExportCursor(&cursor);
    ASSERT_EQ(cursor.valid, 1u);
    ASSERT_TRUE(PlacerLink::Connect(Link(b, "tcp"), &placer).ok());
  }
};

// A tcp shipper describes its buffer (once its own WRITEs to it are placed), and more WRITEs
// than the transport keeps in flight may be posted through a placer link before one Finish:
// the link waits for the earlier ones itself.
TEST(PlacerLink, ManyWritesBeforeOneFinish) {
  DescribedTcpBuffer t;
  ASSERT_NO_FATAL_FAILURE(t.Open());
  EXPECT_EQ(t.cursor.transport, uint32_t(CursorTransport::kTcp));
  for (uint64_t i = 0; i < 1000; i++) {
    Status s = t.placer->Write(t.cursor.rkey, t.cursor.remote_addr + t.cursor.pos + 8 * i, &i, 8);
    ASSERT_TRUE(s.ok()) << "WRITE " << i << ": " << s.ToString();
  }
  Status s = t.placer->Finish(5000);
  EXPECT_TRUE(s.ok()) << s.ToString();
}

// Finish may poll without sleeping for a while (slipstream.placement_spin_us): acknowledgements
// that come before, during or after that spin all end it with OK, and a spin longer than the
// timeout still ends at the timeout.
TEST(PlacerLink, FinishSpinsThenSleepsAndKeepsItsTimeout) {
  DescribedTcpBuffer t;
  ASSERT_NO_FATAL_FAILURE(t.Open());
  PlacerLink* placer = t.placer.get();
  rdma::FaultInjection* faults = rdma::TestFaults(placer->connection_for_testing());
  ASSERT_NE(faults, nullptr);
  const SharedCursor& cursor = t.cursor;
  uint64_t at = cursor.remote_addr + cursor.pos;
  // {ACK delay, spin}: answered within the spin, after it, and without one.
  const std::pair<uint32_t, int> cases[] = {{0, 100000}, {20000, 1000}, {20000, 0}, {0, 0}};
  for (auto [delay_us, spin_us] : cases) {
    faults->completion_delay_us = delay_us;
    ASSERT_TRUE(placer->Write(cursor.rkey, at, "12345678", 8).ok());
    at += 8;
    Status s = placer->Finish(5000, spin_us);
    EXPECT_TRUE(s.ok()) << "delay " << delay_us << " spin " << spin_us << ": " << s.ToString();
  }
  // An answer later than the timeout fails the link even while the spin lasts.
  faults->completion_delay_us = 2000000;
  ASSERT_TRUE(placer->Write(cursor.rkey, at, "12345678", 8).ok());
  Status s = placer->Finish(100, 10000000);  // the ACK, at 2 s, would end it with OK
  EXPECT_EQ(s.code(), Status::Code::kTimeout) << s.ToString();
  EXPECT_FALSE(placer->state().ok());
}

// Closing a buffer revokes it from the placer links before it is persisted and re-zeroed: a
// backend's WRITE with the old key is refused, and its link ends, instead of landing in the
// buffer's next use. The shipper, told so by the broken cursor, drops the backup; a new link
// resumes where the durable copy ends.
TEST(PlacerLink, AClosedBufferIsRevokedAndABrokenCursorDropsTheBackup) {
  Backup b("tcp", 8, 2);
  std::unique_ptr<BackupLink> link;
  ASSERT_TRUE(BackupLink::Connect(Link(b, "tcp"), &link).ok());
  StreamShipper shipper(kWal, 1, 0, {link.get()});
  std::mt19937_64 rng(5);
  std::string stream = RandomBytes(rng, 1000);
  ASSERT_TRUE(shipper.Append(0, stream).ok());
  ASSERT_TRUE(shipper.WaitPlaced(shipper.end(), 1, 5000).ok());
  SharedCursor cursor;
  shipper.ExportCursor(&cursor);
  ASSERT_EQ(cursor.valid, 1u);
  Appender appender;
  ASSERT_TRUE(OpenAppender(b, "tcp", cursor, &appender).ok());
  size_t appended = 0;
  std::string more = RandomBytes(rng, 500);
  ASSERT_TRUE(appender.Append(&cursor, stream.size(), more, &appended).ok());
  stream += more;
  const SharedCursor old = cursor;

  // The shipper adopts it and fills the buffer: it closes and opens the next.
  ASSERT_TRUE(shipper.AdoptCursor(cursor).ok());
  std::string fill = RandomBytes(rng, kBufferSize);
  ASSERT_TRUE(shipper.Append(stream.size(), fill).ok());
  stream += fill;
  ASSERT_TRUE(shipper.WaitPlaced(shipper.end(), 1, 5000).ok());

  // A late append through the closed buffer's description is refused.
  SharedCursor stale = old;
  Status s = appender.Append(&stale, stale.end, "late", &appended);
  EXPECT_EQ(s.code(), Status::Code::kRemoteAccess) << s.ToString();
  EXPECT_EQ(stale.broken, 1u);

  // A cursor broken on the open buffer drops the backup at the shipper.
  shipper.ExportCursor(&cursor);
  ASSERT_EQ(cursor.valid, 1u);
  cursor.broken = 1;
  cursor.valid = 0;
  EXPECT_FALSE(shipper.AdoptCursor(cursor).ok());
  EXPECT_EQ(shipper.live(), 0);
  link.reset();
  ASSERT_TRUE(Eventually([&] { return b.server->Primaries().empty(); }));
  EXPECT_EQ(b.PersistedStream("p1", 0), stream);
  std::unique_ptr<BackupLink> again;
  ASSERT_TRUE(BackupLink::Connect(Link(b, "tcp"), &again).ok());
  EXPECT_EQ(again->resume(), stream.size());
}

}  // namespace
}  // namespace slipstream::replication
