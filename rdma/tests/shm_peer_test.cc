// ShmPeerWriter: WRITEs into an shm connection's peer from outside the connection, with the
// peer's table checked before and after the copy (a peer whose process exited: shm_test.cc).
#include "slipstream/rdma/shm_peer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>

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

}  // namespace
}  // namespace slipstream::rdma
