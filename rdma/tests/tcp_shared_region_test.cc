// Connection::RegisterShared on tcp: one buffer reached by two peers through one key (a
// replication backup's open buffer, written by the shipper and by a primary's backends), and
// revocation that the owner can rely on before it reuses the memory.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <memory>
#include <thread>

#include "slipstream/rdma/transport.h"
#include "tcp_transport.h"
#include "test_util.h"

namespace slipstream::rdma {
namespace {

using namespace test;  // NOLINT: the shared helpers (test_util.h)

// Two clients of one listener; owner_ is the accepted side of the first, sharer_ of the second.
class TcpSharedRegionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::unique_ptr<Listener> listener;
    ASSERT_TRUE(Listen(TcpOptions("shared-region"), "127.0.0.1:0", &listener).ok());
    const TransportOptions client_options = TcpOptions("shared-region", true);
    ConnectThroughListener(listener.get(), client_options, &owner_, &first_);
    ConnectThroughListener(listener.get(), client_options, &sharer_, &second_);
    ASSERT_FALSE(HasFatalFailure());
    ASSERT_TRUE(owner_->AllocateRegion(8192, kRemoteWrite, &buffer_).ok());
    remote_ = owner_->Describe(buffer_);
  }

  // WRITEs `length` bytes of pattern `seed` from `client` at `offset` of the buffer, and
  // returns how the WRITE completed (kFlushed when it never got an answer).
  WcStatus WriteFrom(Connection* client, uint64_t offset, size_t length, uint32_t seed) {
    LocalRegion local;
    EXPECT_TRUE(client->AllocateRegion(length, kLocalOnly, &local).ok());
    FillPattern(local.addr, length, seed);
    Sge sge{local.addr, uint32_t(length), local.lkey};
    WorkRequest wr;
    wr.wr_id = seed;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.remote_addr = remote_.addr + offset;
    wr.rkey = remote_.rkey;
    if (!client->Post(&wr, 1).ok()) return WcStatus::kFlushed;
    std::vector<Completion> wc = PollN(client, 1, kTimeoutMs);
    client->FreeRegion(local);
    return wc.size() == 1 ? wc[0].status : WcStatus::kFlushed;
  }

  std::unique_ptr<Connection> first_, second_, owner_, sharer_;
  LocalRegion buffer_;
  RemoteRegion remote_;
};

// Both peers write into the one buffer with the owner's key; after the sharer's registration is
// revoked its peer is refused and the owner's still writes.
TEST_F(TcpSharedRegionTest, TwoPeersWriteOneBufferUntilOneIsRevoked) {
  LocalRegion shared;
  ASSERT_TRUE(
      sharer_->RegisterShared(buffer_.addr, buffer_.length, kRemoteWrite, remote_.rkey, &shared)
          .ok());
  EXPECT_EQ(shared.rkey, remote_.rkey);
  EXPECT_EQ(sharer_->Describe(shared).addr, remote_.addr);
  EXPECT_EQ(WriteFrom(first_.get(), 0, 1000, 1), WcStatus::kSuccess);
  EXPECT_EQ(WriteFrom(second_.get(), 1000, 3000, 2), WcStatus::kSuccess);
  EXPECT_TRUE(HasPattern(buffer_.addr, 1000, 1));
  EXPECT_TRUE(HasPattern(buffer_.addr + 1000, 3000, 2));

  ASSERT_TRUE(sharer_->FreeRegion(shared).ok());
  EXPECT_EQ(WriteFrom(second_.get(), 4000, 100, 3), WcStatus::kRemoteAccessError);
  EXPECT_TRUE(AllZero(buffer_.addr + 4000, 100));
  EXPECT_EQ(WriteFrom(first_.get(), 4000, 100, 4), WcStatus::kSuccess);
  EXPECT_TRUE(HasPattern(buffer_.addr + 4000, 100, 4));
  // The memory was not the sharer's to free: the owner's region is whole.
  EXPECT_TRUE(owner_->FreeRegion(buffer_).ok());
}

// Bounds and rights are those given, and keys are not handed out twice on one connection.
TEST_F(TcpSharedRegionTest, RegistrationsAreCheckedLikeOwnRegions) {
  LocalRegion shared;
  EXPECT_FALSE(sharer_->RegisterShared(buffer_.addr, 4096, kLocalOnly, remote_.rkey, &shared).ok());
  EXPECT_FALSE(sharer_->RegisterShared(buffer_.addr, 4096, kRemoteWrite, 0, &shared).ok());
  ASSERT_TRUE(
      sharer_->RegisterShared(buffer_.addr, 4096, kRemoteWrite, remote_.rkey, &shared).ok());
  LocalRegion again;
  EXPECT_FALSE(
      sharer_->RegisterShared(buffer_.addr, 4096, kRemoteWrite, remote_.rkey, &again).ok());
  // Only the first 4096 bytes were shared.
  EXPECT_EQ(WriteFrom(second_.get(), 4000, 200, 5), WcStatus::kRemoteAccessError);
  EXPECT_TRUE(AllZero(buffer_.addr + 4000, 200));
}

// Backends that cannot share memory between connections refuse to.
TEST(SharedRegion, ShmRefusesToShare) {
  TransportOptions options;
  options.backend = "shm";
  options.secret = "shared-region";
  Pair pair = MakePair(options);
  ASSERT_TRUE(pair.server && pair.client);
  LocalRegion region, shared;
  ASSERT_TRUE(pair.server->AllocateRegion(4096, kRemoteWrite, &region).ok());
  EXPECT_FALSE(
      pair.server->RegisterShared(region.addr, 4096, kRemoteWrite, region.rkey ^ 1, &shared).ok());
}

// A revocation that finds a WRITE in the middle of storing (its peer stalled after part of the
// payload) returns at once rather than waiting for the peer, ends that connection, and the
// WRITE is never acknowledged: the owner may zero and reuse the memory right away.
TEST(SharedRegion, RevokingDuringAStalledWriteEndsThatConnection) {
  const TransportOptions options = TcpOptions("shared-region");
  std::unique_ptr<Connection> sharer;
  int raw = -1;
  ConnectRawTcpPeer(options, &sharer, &raw);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  // The owner: any connection that allocates the memory (a pair of its own).
  Pair pair = MakePair(options);
  ASSERT_TRUE(pair.server);
  LocalRegion buffer, shared;
  ASSERT_TRUE(pair.server->AllocateRegion(8192, kRemoteWrite, &buffer).ok());
  ASSERT_TRUE(sharer->RegisterShared(buffer.addr, 8192, kRemoteWrite, buffer.rkey, &shared).ok());

  TcpFrameHeader write;
  write.type = uint8_t(TcpFrameType::kWrite);
  write.sequence = 0;
  write.rkey = buffer.rkey;
  write.remote_addr = reinterpret_cast<uintptr_t>(buffer.addr);
  write.length = 4096;
  char part[100];
  FillPattern(part, sizeof(part), 6);
  ASSERT_EQ(::send(raw, &write, sizeof(write), MSG_NOSIGNAL), ssize_t(sizeof(write)));
  ASSERT_EQ(::send(raw, part, sizeof(part), MSG_NOSIGNAL), ssize_t(sizeof(part)));
  // Wait until the agent is inside the store (the first bytes are in the buffer).
  for (int i = 0; i < 500 && !HasPattern(buffer.addr, sizeof(part), 6); i++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(HasPattern(buffer.addr, sizeof(part), 6));
  ASSERT_TRUE(sharer->FreeRegion(shared).ok());  // waited for the peer forever before
  EXPECT_FALSE(sharer->state().ok());
  // Nothing came back but the connection's end: no ACK for the WRITE.
  TcpFrameHeader answer;
  ssize_t n = ::recv(raw, &answer, sizeof(answer), MSG_WAITALL);
  EXPECT_TRUE(n <= 0 || answer.type != uint8_t(TcpFrameType::kAck));
  ::close(raw);
}

}  // namespace
}  // namespace slipstream::rdma
