// ShmPeerWriter: WRITEs into an shm connection's peer from outside the connection, with the
// peer's table checked before and after the copy and the peer's process checked after it.
#include "slipstream/rdma/shm_peer.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "slipstream/rdma/transport.h"
#include "test_util.h"

namespace slipstream::rdma {
namespace {

using namespace test;  // NOLINT: the shared helpers (test_util.h)

TransportOptions Shm() {
  TransportOptions options;
  options.backend = "shm";
  options.secret = "shm-peer-secret";
  options.connect_timeout_ms = kTimeoutMs;
  return options;
}

TEST(ShmPeerWriter, WritesWhereTheConnectionWouldAndRefusesRevokedKeys) {
  Pair pair = MakePair(Shm());
  ASSERT_NE(pair.server, nullptr);
  LocalRegion target;
  ASSERT_TRUE(pair.server->AllocateRegion(4096, kRemoteWrite, &target).ok());
  LocalRegion readonly;
  ASSERT_TRUE(pair.server->AllocateRegion(4096, kRemoteRead, &readonly).ok());
  ShmPeerRef ref;
  ASSERT_TRUE(ExportShmPeer(pair.client.get(), &ref).ok());
  std::unique_ptr<ShmPeerWriter> writer;
  ASSERT_TRUE(ShmPeerWriter::Open(ref, &writer).ok());
  EXPECT_TRUE(writer->Maps(ref));
  RemoteRegion remote = pair.server->Describe(target);
  ASSERT_TRUE(writer->Write(remote.rkey, remote.addr + 100, "placed", 6).ok());
  EXPECT_EQ(std::string(target.addr + 100, 6), "placed");
  EXPECT_EQ(writer->Write(remote.rkey, remote.addr + 4093, "long", 4).code(),
            Status::Code::kRemoteAccess)
      << "past the region's end";
  RemoteRegion ro = pair.server->Describe(readonly);
  EXPECT_EQ(writer->Write(ro.rkey, ro.addr, "x", 1).code(), Status::Code::kRemoteAccess)
      << "a region without the write right";
  EXPECT_EQ(writer->Write(remote.rkey ^ 1, remote.addr, "x", 1).code(), Status::Code::kRemoteAccess)
      << "an unknown key";
  // The connection's end revokes its regions (a fenced backup), before its owner reads them.
  pair.server->Disconnect();
  EXPECT_EQ(writer->Write(remote.rkey, remote.addr, "late", 4).code(), Status::Code::kRemoteAccess);
  EXPECT_TRUE(AllZero(target.addr, 100));
  // Only shm connections can be exported.
  TransportOptions tcp = Shm();
  tcp.backend = "tcp";
  Pair over_tcp = MakePair(tcp);
  ASSERT_NE(over_tcp.client, nullptr);
  EXPECT_EQ(ExportShmPeer(over_tcp.client.get(), &ref).code(), Status::Code::kUnavailable);
}

// A peer killed without revoking anything keeps its heap alive in our mapping, and its keys
// valid: a WRITE must still fail, since nobody holds those bytes any more.
TEST(ShmPeerWriter, APeerWhoseProcessExitedIsRefused) {
  std::unique_ptr<Listener> listener;
  ASSERT_TRUE(Listen(Shm(), "127.0.0.1:0", &listener).ok());
  const std::string address = listener->address();
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The region's owner: it sends the region's description, then waits to be killed.
    listener.reset();
    std::unique_ptr<Connection> connection;
    if (!Connect(Shm(), address, &connection).ok()) _exit(2);
    LocalRegion target, outbox;
    if (!connection->AllocateRegion(4096, kRemoteWrite, &target).ok()) _exit(3);
    if (!connection->AllocateRegion(64, kLocalOnly, &outbox).ok()) _exit(3);
    RemoteRegion remote = connection->Describe(target);
    std::memcpy(outbox.addr, &remote, sizeof(remote));
    Sge sge{outbox.addr, uint32_t(sizeof(remote)), outbox.lkey};
    WorkRequest send;
    send.opcode = Opcode::kSend;
    send.sg_list = &sge;
    send.num_sge = 1;
    if (!connection->Post(&send, 1).ok()) _exit(4);
    PollN(connection.get(), 1);
    for (;;) ::pause();
  }
  std::unique_ptr<Connection> parent;
  Status s = listener->Accept(kTimeoutMs, &parent);
  if (!s.ok()) {
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    FAIL() << s.ToString();
  }
  LocalRegion inbox;
  ASSERT_TRUE(parent->AllocateRegion(64, kLocalOnly, &inbox).ok());
  RecvRequest recv{1, Sge{inbox.addr, 64, inbox.lkey}};
  ASSERT_TRUE(parent->PostRecv(&recv, 1).ok());
  std::vector<Completion> got = PollN(parent.get(), 1);
  ASSERT_EQ(got.size(), 1u);
  RemoteRegion remote;
  std::memcpy(&remote, inbox.addr, sizeof(remote));
  ShmPeerRef ref;
  ASSERT_TRUE(ExportShmPeer(parent.get(), &ref).ok());
  EXPECT_EQ(ref.pid, child);
  std::unique_ptr<ShmPeerWriter> writer;
  ASSERT_TRUE(ShmPeerWriter::Open(ref, &writer).ok());
  EXPECT_TRUE(writer->Write(remote.rkey, remote.addr, "alive", 5).ok());
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  Status after = writer->Write(remote.rkey, remote.addr, "dead", 4);
  EXPECT_EQ(after.code(), Status::Code::kDisconnected) << after.ToString();
  // A description of a process that is gone maps nothing.
  std::unique_ptr<ShmPeerWriter> again;
  EXPECT_FALSE(ShmPeerWriter::Open(ref, &again).ok());
}

}  // namespace
}  // namespace slipstream::rdma
