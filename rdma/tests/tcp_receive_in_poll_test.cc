// The tcp backend with receive_in_poll (TransportOptions): a connection without a receiving
// thread, whose Poll reads and handles the peer's frames. Its own requests complete through
// Poll, the peer's requests are served while it polls, a dead peer is reported by Poll, and two
// threads may poll at once.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "setup.h"
#include "slipstream/rdma/transport.h"
#include "tcp_transport.h"
#include "test_util.h"

namespace slipstream::rdma {
namespace {

using namespace test;  // NOLINT: the shared helpers (test_util.h)

// A pair whose server (accepted) has the usual agent and whose client polls to receive.
class TcpReceiveInPollTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::unique_ptr<Listener> listener;
    ASSERT_TRUE(Listen(TcpOptions("receive-in-poll"), "127.0.0.1:0", &listener).ok());
    ConnectThroughListener(listener.get(), TcpOptions("receive-in-poll", true), &server_, &client_);
  }

  LocalRegion Allocate(Connection* connection, size_t length, uint32_t access) {
    LocalRegion region;
    EXPECT_TRUE(connection->AllocateRegion(length, access, &region).ok());
    return region;
  }

  // A WRITE, READ or SEND of `sge` (to `remote` + `offset` for the one-sided ones).
  static WorkRequest Request(Opcode opcode, uint64_t wr_id, const Sge* sge,
                             const RemoteRegion& remote = {}, uint64_t offset = 0) {
    WorkRequest wr;
    wr.wr_id = wr_id;
    wr.opcode = opcode;
    wr.sg_list = sge;
    wr.num_sge = 1;
    wr.remote_addr = remote.addr + offset;
    wr.rkey = remote.rkey;
    return wr;
  }

  std::unique_ptr<Connection> server_;
  std::unique_ptr<Connection> client_;
};

// The client's WRITE, READ and SEND complete through its Poll, with their bytes in place.
TEST_F(TcpReceiveInPollTest, OwnRequestsCompleteThroughPoll) {
  LocalRegion target = Allocate(server_.get(), 8192, kRemoteWrite | kRemoteRead);
  LocalRegion inbox = Allocate(server_.get(), 4096, kLocalOnly);
  LocalRegion local = Allocate(client_.get(), 3 * 4096, kLocalOnly);
  FillPattern(local.addr, 4096, 1);
  FillPattern(target.addr + 4096, 4096, 2);
  FillPattern(local.addr + 2 * 4096, 4096, 3);
  RecvRequest recv;
  recv.wr_id = 40;
  recv.sge = Sge{inbox.addr, 4096, inbox.lkey};
  ASSERT_TRUE(server_->PostRecv(&recv, 1).ok());

  RemoteRegion remote = server_->Describe(target);
  Sge write_sge{local.addr, 4096, local.lkey};
  Sge read_sge{local.addr + 4096, 4096, local.lkey};
  Sge send_sge{local.addr + 2 * 4096, 4096, local.lkey};
  WorkRequest requests[3] = {Request(Opcode::kWrite, 1, &write_sge, remote),
                             Request(Opcode::kRead, 2, &read_sge, remote, 4096),
                             Request(Opcode::kSend, 3, &send_sge)};
  ASSERT_TRUE(client_->Post(requests, 3).ok());
  std::vector<Completion> done = PollN(client_.get(), 3);
  ASSERT_EQ(done.size(), 3u);
  for (size_t i = 0; i < 3; i++) {
    EXPECT_EQ(done[i].wr_id, i + 1);
    EXPECT_EQ(done[i].status, WcStatus::kSuccess);
  }
  EXPECT_TRUE(HasPattern(target.addr, 4096, 1));
  EXPECT_TRUE(HasPattern(local.addr + 4096, 4096, 2));
  std::vector<Completion> received = PollN(server_.get(), 1);
  ASSERT_EQ(received.size(), 1u);
  EXPECT_EQ(received[0].wr_id, 40u);
  EXPECT_TRUE(HasPattern(inbox.addr, 4096, 3));
}

// Unsignaled WRITEs are acknowledged too: one Poll takes their ACK frames with the signaled
// one's, and every WRITE is placed, in order.
TEST_F(TcpReceiveInPollTest, UnsignaledWritesAreAcknowledgedOnTheWay) {
  constexpr int kWrites = 200;
  LocalRegion target = Allocate(server_.get(), kWrites * 64, kRemoteWrite);
  LocalRegion local = Allocate(client_.get(), kWrites * 64, kLocalOnly);
  FillPattern(local.addr, kWrites * 64, 9);
  RemoteRegion remote = server_->Describe(target);
  std::vector<Sge> sges(kWrites);
  std::vector<WorkRequest> writes(kWrites);
  for (int i = 0; i < kWrites; i++) {
    sges[size_t(i)] = Sge{local.addr + i * 64, 64, local.lkey};
    writes[size_t(i)] = Request(Opcode::kWrite, uint64_t(i), &sges[size_t(i)], remote, i * 64);
    writes[size_t(i)].signaled = i + 1 == kWrites;
  }
  ASSERT_TRUE(client_->Post(writes.data(), writes.size()).ok());
  std::vector<Completion> done = PollN(client_.get(), 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].wr_id, uint64_t(kWrites - 1));
  EXPECT_TRUE(HasPattern(target.addr, kWrites * 64, 9));
  // The connection stays usable: the unsignaled ACKs were all matched to their requests.
  Sge again{local.addr, 64, local.lkey};
  WorkRequest write = Request(Opcode::kWrite, 500, &again, remote);
  ASSERT_TRUE(client_->Post(&write, 1).ok());
  done = PollN(client_.get(), 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, WcStatus::kSuccess);
}

// The server's WRITE into the client's region and its SEND to the client are served while the
// client polls (the only time it reads the socket); then the server's requests complete.
TEST_F(TcpReceiveInPollTest, PeerRequestsAreServedWhilePolling) {
  LocalRegion client_target = Allocate(client_.get(), 4096, kRemoteWrite);
  LocalRegion client_inbox = Allocate(client_.get(), 4096, kLocalOnly);
  LocalRegion server_local = Allocate(server_.get(), 8192, kLocalOnly);
  FillPattern(server_local.addr, 4096, 5);
  FillPattern(server_local.addr + 4096, 4096, 6);
  RecvRequest recv;
  recv.wr_id = 77;
  recv.sge = Sge{client_inbox.addr, 4096, client_inbox.lkey};
  ASSERT_TRUE(client_->PostRecv(&recv, 1).ok());
  Sge write_sge{server_local.addr, 4096, server_local.lkey};
  Sge send_sge{server_local.addr + 4096, 4096, server_local.lkey};
  WorkRequest requests[2] = {
      Request(Opcode::kWrite, 1, &write_sge, client_->Describe(client_target)),
      Request(Opcode::kSend, 2, &send_sge)};
  ASSERT_TRUE(server_->Post(requests, 2).ok());
  std::vector<Completion> received = PollN(client_.get(), 1);
  ASSERT_EQ(received.size(), 1u);
  EXPECT_EQ(received[0].wr_id, 77u);
  EXPECT_EQ(received[0].opcode, Opcode::kRecv);
  EXPECT_TRUE(HasPattern(client_target.addr, 4096, 5));
  EXPECT_TRUE(HasPattern(client_inbox.addr, 4096, 6));
  std::vector<Completion> done = PollN(server_.get(), 2);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].status, WcStatus::kSuccess);
  EXPECT_EQ(done[1].status, WcStatus::kSuccess);
}

// Poll(0) on an idle connection returns at once with nothing and stays usable.
TEST_F(TcpReceiveInPollTest, PollWithoutTimeoutReturnsAtOnce) {
  Completion wc[4];
  size_t n = 99;
  for (int i = 0; i < 100; i++) {
    ASSERT_TRUE(client_->Poll(wc, 4, 0, &n).ok());
    EXPECT_EQ(n, 0u);
  }
  EXPECT_TRUE(client_->state().ok());
}

// The client's wait_fd is its socket: it turns readable when a WRITE's ACK arrives, a Poll(0)
// then finds the completion, and afterwards it is quiet again. The server, whose agent reads
// its socket, has none.
TEST_F(TcpReceiveInPollTest, WaitFdTurnsReadableWhenPollHasWork) {
  EXPECT_EQ(server_->wait_fd(), -1);
  const int fd = client_->wait_fd();
  ASSERT_GE(fd, 0);
  LocalRegion target = Allocate(server_.get(), 4096, kRemoteWrite);
  LocalRegion local = Allocate(client_.get(), 4096, kLocalOnly);
  FillPattern(local.addr, 4096, 4);
  pollfd readable{fd, POLLIN, 0};
  ASSERT_EQ(::poll(&readable, 1, 0), 0) << "readable before anything was sent";
  for (uint64_t round = 0; round < 3; round++) {
    Sge sge{local.addr, 4096, local.lkey};
    WorkRequest write = Request(Opcode::kWrite, round, &sge, server_->Describe(target));
    ASSERT_TRUE(client_->Post(&write, 1).ok());
    readable.revents = 0;
    ASSERT_EQ(::poll(&readable, 1, kTimeoutMs), 1) << "the ACK did not make it readable";
    Completion wc[4];
    size_t n = 0;
    // Poll(0) reads a frame whose start arrived whole (it waits for the rest, bounded).
    ASSERT_TRUE(client_->Poll(wc, 4, 0, &n).ok());
    ASSERT_EQ(n, 1u);
    EXPECT_EQ(wc[0].wr_id, round);
    EXPECT_EQ(wc[0].status, WcStatus::kSuccess);
    EXPECT_EQ(::poll(&readable, 1, 0), 0) << "still readable after Poll took the ACK";
  }
  EXPECT_TRUE(HasPattern(target.addr, 4096, 4));
}

// A peer that goes away is reported by the next Poll, and a request posted to it is flushed.
TEST_F(TcpReceiveInPollTest, AGonePeerIsReportedByPoll) {
  LocalRegion target = Allocate(server_.get(), 4096, kRemoteWrite);
  RemoteRegion remote = server_->Describe(target);
  LocalRegion local = Allocate(client_.get(), 4096, kLocalOnly);
  server_.reset();
  Status state = Status::OK();
  for (int i = 0; i < 500 && state.ok(); i++) {
    Completion wc[4];
    size_t n = 0;
    state = client_->Poll(wc, 4, 10, &n);
    EXPECT_EQ(n, 0u);
  }
  EXPECT_EQ(state.code(), Status::Code::kDisconnected) << state.ToString();
  Sge sge{local.addr, 64, local.lkey};
  WorkRequest write = Request(Opcode::kWrite, 9, &sge, remote);
  if (client_->Post(&write, 1).ok()) {
    std::vector<Completion> done = PollN(client_.get(), 1);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].status, WcStatus::kFlushed);
  }
}

// A tcp connection (*server, connect_timeout_ms 300) whose peer is a raw socket (*raw) that
// authenticated and then sends only what a test writes to it, and reads nothing.
void ConnectRawPeer(bool receive_in_poll, std::unique_ptr<Connection>* server, int* raw) {
  TransportOptions options;
  options.backend = "tcp";
  options.secret = "receive-in-poll";
  options.connect_timeout_ms = 300;
  options.receive_in_poll = receive_in_poll;
  ConnectRawTcpPeer(options, server, raw);
}

// A peer that stops in the middle of a frame holds Poll's caller for connect_timeout_ms at
// most: the connection then fails, and Poll returns.
TEST(TcpReceiveInPoll, APeerStalledInAFrameFailsTheConnection) {
  std::unique_ptr<Connection> server;
  int raw = -1;
  ConnectRawPeer(/*receive_in_poll=*/true, &server, &raw);
  ASSERT_FALSE(HasFatalFailure());
  TcpFrameHeader header;
  header.type = uint8_t(TcpFrameType::kSend);
  header.length = 8;
  ASSERT_EQ(::send(raw, &header, sizeof(header) / 2, MSG_NOSIGNAL), ssize_t(sizeof(header) / 2));
  Status state = Status::OK();
  for (int i = 0; i < 100 && state.ok(); i++) {
    Completion wc[4];
    size_t n = 0;
    state = server->Poll(wc, 4, 50, &n);
  }
  EXPECT_FALSE(state.ok());
  EXPECT_FALSE(server->state().ok());
  ::close(raw);
}

// A connection failed by a refusal (NAK) while its sender is blocked sending to a peer that
// stopped reading is still destroyed, within about connect_timeout_ms: the sender's send is cut
// short then. (Without the bound the destructor waited for that send forever.)
TEST(TcpReceiveInPoll, DestroyingAConnectionWhosePeerStoppedReadingReturns) {
  std::unique_ptr<Connection> server;
  int raw = -1;
  ConnectRawPeer(/*receive_in_poll=*/false, &server, &raw);
  ASSERT_FALSE(HasFatalFailure());
  // A READ far larger than the sockets buffer, which this side never reads: the server's
  // sender blocks in its send. Then a READ it must refuse: it fails the connection with a NAK.
  constexpr size_t kBig = 64u << 20;
  LocalRegion source;
  ASSERT_TRUE(server->AllocateRegion(kBig, kRemoteRead, &source).ok());
  RemoteRegion remote = server->Describe(source);
  TcpFrameHeader read;
  read.type = uint8_t(TcpFrameType::kReadRequest);
  read.sequence = 0;
  read.rkey = remote.rkey;
  read.remote_addr = remote.addr;
  read.length = kBig;
  TcpFrameHeader refused = read;
  refused.sequence = 1;
  refused.rkey = remote.rkey ^ 1;
  ASSERT_EQ(::send(raw, &read, sizeof(read), MSG_NOSIGNAL), ssize_t(sizeof(read)));
  ASSERT_EQ(::send(raw, &refused, sizeof(refused), MSG_NOSIGNAL), ssize_t(sizeof(refused)));
  for (int i = 0; i < 500 && server->state().ok(); i++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_FALSE(server->state().ok());
  server.reset();  // hangs here without the bound
  ::close(raw);
}

// A thread that posts small WRITEs to a peer that reads nothing is never held by the socket:
// Post returns once the socket's buffers are full, and the frames wait for the sender. (A
// posting thread used to send them itself with a blocking send: a backup whose process was
// stopped held the shipper, and every commit, until it resumed.)
TEST(TcpReceiveInPoll, PostNeverBlocksOnAPeerThatStoppedReading) {
  std::unique_ptr<Connection> server;
  int raw = -1;
  ConnectRawPeer(/*receive_in_poll=*/false, &server, &raw);
  ASSERT_FALSE(HasFatalFailure());
  constexpr size_t kWrite = 60u << 10;  // small enough for the posting thread to send
  LocalRegion local;
  ASSERT_TRUE(server->AllocateRegion(kWrite, kLocalOnly, &local).ok());
  auto posting = std::async(std::launch::async, [&] {
    // max_outstanding (256) of them: 15 MiB, far more than the sockets hold.
    int accepted = 0;
    for (int i = 0; i < 1000; i++) {
      Sge sge{local.addr, uint32_t(kWrite), local.lkey};
      WorkRequest wr;
      wr.wr_id = uint64_t(i);
      wr.opcode = Opcode::kWrite;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.rkey = 77;
      wr.remote_addr = 0;
      Status s = server->Post(&wr, 1);
      if (s.code() == Status::Code::kWouldBlock) break;
      if (!s.ok()) return -1;
      accepted++;
    }
    return accepted;
  });
  // A liveness bound, not a speed one: the posts take milliseconds; without the fix they never
  // return until the peer goes away.
  bool returned = posting.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
  ::close(raw);  // unread bytes: a reset, which fails a blocked send, so the test ends either way
  EXPECT_TRUE(returned) << "Post blocked on a full socket";
  EXPECT_EQ(posting.get(), 256);
  server.reset();
}

// Frames the posting thread could not send whole are finished by the sender, in order: a
// receiver that reads nothing for a while (it polls later) gets every WRITE intact, plain and
// strided (every third WRITE gathers its two halves as two periods of one entry).
TEST_F(TcpReceiveInPollTest, FramesLeftByAFullSocketArriveWholeAndInOrder) {
  constexpr size_t kWrite = 60u << 10;
  constexpr int kWrites = 200;  // 12 MB: the sockets fill long before the last one
  LocalRegion target = Allocate(client_.get(), kWrite * kWrites, kRemoteWrite);
  LocalRegion local = Allocate(server_.get(), kWrite * kWrites, kLocalOnly);
  RemoteRegion remote = client_->Describe(target);
  for (int i = 0; i < kWrites; i++) FillPattern(local.addr + i * kWrite, kWrite, uint32_t(i + 1));
  auto posting = std::async(std::launch::async, [&] {
    for (int i = 0; i < kWrites; i++) {
      const bool strided = i % 3 == 0;
      Sge sge{local.addr + i * kWrite, uint32_t(strided ? kWrite / 2 : kWrite), local.lkey};
      WorkRequest wr = Request(Opcode::kWrite, uint64_t(i), &sge, remote, i * kWrite);
      if (strided) {
        wr.repeat = 2;
        wr.repeat_stride = kWrite / 2;
      }
      Status s = server_->Post(&wr, 1);
      if (!s.ok()) return i;
    }
    return kWrites;
  });
  // Posting must not wait for the client, which reads nothing yet (a liveness bound).
  bool posted = posting.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
  // Only now does the client read (its Poll handles the frames and ACKs them).
  std::atomic<bool> done{false};
  std::thread reader([&] {
    while (!done.load()) {
      Completion wc[4];
      size_t n = 0;
      if (!client_->Poll(wc, 4, 5, &n).ok()) return;
    }
  });
  std::vector<Completion> completions = PollN(server_.get(), kWrites, 12 * kTimeoutMs);
  done = true;
  reader.join();
  EXPECT_TRUE(posted) << "Post blocked on a full socket";
  ASSERT_EQ(posting.get(), kWrites);
  ASSERT_EQ(completions.size(), size_t(kWrites));
  for (int i = 0; i < kWrites; i++) {
    EXPECT_EQ(completions[i].wr_id, uint64_t(i));
    EXPECT_EQ(completions[i].status, WcStatus::kSuccess);
    EXPECT_TRUE(HasPattern(target.addr + i * kWrite, kWrite, uint32_t(i + 1))) << i;
  }
}

// Two threads polling one connection share its completions: each arrives exactly once.
TEST_F(TcpReceiveInPollTest, TwoPollingThreadsShareTheCompletions) {
  constexpr int kWrites = 400;
  LocalRegion target = Allocate(server_.get(), 4096, kRemoteWrite);
  LocalRegion local = Allocate(client_.get(), 4096, kLocalOnly);
  RemoteRegion remote = server_->Describe(target);
  Sge sge{local.addr, 64, local.lkey};
  std::atomic<int> taken{0};
  std::vector<uint64_t> got[2];
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(2 * kTimeoutMs);
  auto poller = [&](int which) {
    while (taken.load() < kWrites && std::chrono::steady_clock::now() < deadline) {
      Completion wc[8];
      size_t n = 0;
      if (!client_->Poll(wc, 8, 5, &n).ok()) return;
      for (size_t i = 0; i < n; i++) got[which].push_back(wc[i].wr_id);
      taken += int(n);
    }
  };
  std::thread a(poller, 0);
  std::thread b(poller, 1);
  for (int i = 0; i < kWrites; i++) {
    WorkRequest write = Request(Opcode::kWrite, uint64_t(i), &sge, remote, uint64_t(i % 64) * 64);
    while (!client_->Post(&write, 1).ok() && client_->state().ok()) {
      std::this_thread::yield();  // max_outstanding requests are in flight
    }
  }
  a.join();
  b.join();
  std::set<uint64_t> all(got[0].begin(), got[0].end());
  all.insert(got[1].begin(), got[1].end());
  EXPECT_EQ(got[0].size() + got[1].size(), size_t(kWrites));
  EXPECT_EQ(all.size(), size_t(kWrites));
}

}  // namespace
}  // namespace slipstream::rdma
