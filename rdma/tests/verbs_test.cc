// The verbs backend against a fake VerbsApi: an in-process model of a fabric in which a WRITE
// posted on one fake QP really copies bytes into the peer's registered MR (found by rkey,
// checked for bounds, rights and protection domain) and produces completions, so these tests
// check data placement and error semantics as well as the sequence of verbs calls.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "backends.h"
#include "fake_fabric.h"
#include "setup.h"
#include "verbs_api.h"
#include "verbs_transport.h"

namespace slipstream::rdma {
namespace {

using namespace test;  // NOLINT: the fake fabric (fake_fabric.h)

constexpr int kTimeoutMs = 5000;

// ---------------------------------------------------------------------------------------------
// Helpers.

// A test with a fresh fabric installed as the verbs table.
class VerbsTest : public ::testing::Test {
 protected:
  VerbsTest() : scoped_(&fabric_.api) {}

  // Connects two verbs connections over a socketpair (the setup socket after authentication).
  void Connect(uint32_t max_outstanding = 64) {
    options_.max_outstanding = max_outstanding;
    options_.connect_timeout_ms = kTimeoutMs;
    int fds[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    auto accepted = std::async(std::launch::async, [&] {
      std::unique_ptr<Connection> c;
      Status s = AcceptVerbs(options_, fds[0], &c);
      EXPECT_TRUE(s.ok()) << s.ToString();
      return c;
    });
    Status s = ConnectVerbs(options_, fds[1], &client_);
    ASSERT_TRUE(s.ok()) << s.ToString();
    server_ = accepted.get();
    ASSERT_TRUE(server_ && client_);
  }

  // Allocates a region on `c` or fails the test.
  LocalRegion Allocate(Connection* c, size_t length, uint32_t access) {
    LocalRegion r;
    Status s = c->AllocateRegion(length, access, &r);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return r;
  }

  // Polls `c` until one completion arrives (or the timeout passes).
  Completion PollOne(Connection* c, int timeout_ms = 1000) {
    Completion wc;
    size_t n = 0;
    Status s = c->Poll(&wc, 1, timeout_ms, &n);
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(n, 1u);
    return wc;
  }

  // Expects Poll on `c` to return nothing right now.
  void ExpectNoCompletion(Connection* c) {
    Completion wc;
    size_t n = 7;
    Status s = c->Poll(&wc, 1, 0, &n);
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(n, 0u);
  }

  // A WRITE of `sge` to `remote` at `offset`.
  static WorkRequest Write(uint64_t wr_id, const Sge* sge, const RemoteRegion& remote,
                           uint64_t offset = 0) {
    WorkRequest wr;
    wr.wr_id = wr_id;
    wr.opcode = Opcode::kWrite;
    wr.sg_list = sge;
    wr.num_sge = 1;
    wr.remote_addr = remote.addr + offset;
    wr.rkey = remote.rkey;
    return wr;
  }

  FakeFabric fabric_;
  ScopedVerbsApi scoped_;
  TransportOptions options_;
  std::unique_ptr<Connection> server_, client_;
};

// ---------------------------------------------------------------------------------------------
// Connection setup.

TEST_F(VerbsTest, SetupOpensDeviceAndMovesQpThroughInitRtrRtsWithThePeersInfo) {
  Connect();
  std::vector<std::string> expected = {
      "open_device:fake0", "query_device", "query_port",     "query_gid",     "alloc_pd",
      "create_cq",         "create_qp",    "modify_qp:INIT", "modify_qp:RTR", "modify_qp:RTS"};
  EXPECT_EQ(fabric_.CallsOf(1), expected);
  EXPECT_EQ(fabric_.CallsOf(2), expected);
  EXPECT_EQ(fabric_.outstanding_device_lists, 0);  // every list was freed

  FakeQp* a = fabric_.QpOfContext(1);
  FakeQp* b = fabric_.QpOfContext(2);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->state, IBV_QPS_RTS);
  EXPECT_EQ(b->state, IBV_QPS_RTS);
  EXPECT_EQ(a->qp.qp_type, IBV_QPT_RC);
  // Each side's RTR names the other side's QP, LID and first PSN, learned over the socket.
  EXPECT_EQ(a->dest_qp_num, b->qp.qp_num);
  EXPECT_EQ(b->dest_qp_num, a->qp.qp_num);
  EXPECT_EQ(a->dlid, reinterpret_cast<FakeContext*>(b->qp.context)->lid);
  EXPECT_EQ(b->dlid, reinterpret_cast<FakeContext*>(a->qp.context)->lid);
  EXPECT_EQ(a->rq_psn, b->sq_psn);
  EXPECT_EQ(b->rq_psn, a->sq_psn);
  EXPECT_EQ(a->access_flags,
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  EXPECT_EQ(a->init.cap.max_send_wr, 64u);
  EXPECT_EQ(a->init.send_cq, a->init.recv_cq);
  EXPECT_EQ(server_->backend(), "verbs");
  EXPECT_TRUE(server_->state().ok());
  EXPECT_TRUE(client_->state().ok());
}

TEST_F(VerbsTest, NoDeviceMeansUnavailableWithAClearMessageAndThePeerIsTold) {
  fabric_.device_count = 0;
  EXPECT_FALSE(VerbsDeviceAvailable());
  EXPECT_EQ(fabric_.outstanding_device_lists, 0);
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  std::unique_ptr<Connection> c;
  Status s = ConnectVerbs(options_, fds[1], &c);
  EXPECT_EQ(s.code(), Status::Code::kUnavailable);
  EXPECT_NE(s.message().find("no RDMA device"), std::string::npos) << s.message();
  EXPECT_FALSE(c);
  uint32_t type = 0;
  std::string text;
  ASSERT_TRUE(RecvSetupMessage(fds[0], 1000, &type, &text).ok());
  EXPECT_EQ(type, kVerbsFailed);
  EXPECT_NE(text.find("no RDMA device"), std::string::npos);
  // The failed side closed its socket.
  EXPECT_EQ(RecvSetupMessage(fds[0], 1000, &type, &text).code(), Status::Code::kDisconnected);
  ::close(fds[0]);
}

TEST_F(VerbsTest, DeviceAvailableWhenTheListIsNotEmpty) {
  EXPECT_TRUE(VerbsDeviceAvailable());
}

TEST_F(VerbsTest, SetupFailureReleasesWhatWasBuiltAndFailsThePeerFast) {
  fabric_.fail_create_qp = true;
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  auto accepted = std::async(std::launch::async, [&] {
    std::unique_ptr<Connection> c;
    return AcceptVerbs(options_, fds[0], &c);
  });
  std::unique_ptr<Connection> c;
  Status s = ConnectVerbs(options_, fds[1], &c);
  EXPECT_FALSE(s.ok());
  Status peer = accepted.get();
  EXPECT_FALSE(peer.ok());
  for (int id : {1, 2}) {
    std::vector<std::string> calls = fabric_.CallsOf(id);
    ASSERT_GE(calls.size(), 3u);
    std::vector<std::string> tail(calls.end() - 3, calls.end());
    EXPECT_EQ(tail, (std::vector<std::string>{"destroy_cq", "dealloc_pd", "close_device"}));
  }
  EXPECT_EQ(fabric_.failed_releases, 0);
}

TEST(VerbsQpInfoTest, EncodesAndRefusesMalformedInfo) {
  VerbsQpInfo info;
  info.qp_num = 0x123456;
  info.psn = 0xabcdef;
  info.lid = 0x4242;
  info.mtu = IBV_MTU_2048;
  info.gid[3] = 9;
  std::string wire = EncodeQpInfo(info);
  std::optional<VerbsQpInfo> back = DecodeQpInfo(wire);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->qp_num, info.qp_num);
  EXPECT_EQ(back->psn, info.psn);
  EXPECT_EQ(back->lid, info.lid);
  EXPECT_EQ(back->mtu, info.mtu);
  EXPECT_EQ(back->gid[3], 9);
  EXPECT_FALSE(DecodeQpInfo(wire.substr(1)));
  std::string bad_qpn = wire;
  bad_qpn[7] = 1;  // qp_num above 24 bits
  EXPECT_FALSE(DecodeQpInfo(bad_qpn));
  std::string bad_mtu = wire;
  bad_mtu[15] = 9;
  EXPECT_FALSE(DecodeQpInfo(bad_mtu));
  std::string bad_magic = wire;
  bad_magic[0] ^= 1;
  EXPECT_FALSE(DecodeQpInfo(bad_magic));
}

// ---------------------------------------------------------------------------------------------
// Regions.

TEST_F(VerbsTest, RegionsAreRegisteredWithExactlyTheRequestedRights) {
  Connect();
  struct Case {
    uint32_t access;
    int flags;
  } cases[] = {
      {kLocalOnly, IBV_ACCESS_LOCAL_WRITE},
      {kRemoteWrite, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE},
      {kRemoteRead, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ},
      {kRemoteWrite | kRemoteRead,
       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ},
  };
  for (const Case& c : cases) {
    fabric_.registered_access.clear();
    LocalRegion r = Allocate(server_.get(), 5000, c.access);
    ASSERT_EQ(fabric_.registered_access.size(), 1u);
    EXPECT_EQ(fabric_.registered_access[0], c.flags) << "access " << c.access;
    FakeMr* mr = fabric_.MrByLkey(r.lkey);
    ASSERT_TRUE(mr);
    EXPECT_EQ(mr->mr.addr, r.addr);
    EXPECT_EQ(mr->mr.length, 5000u);
    EXPECT_EQ(r.rkey, c.access == kLocalOnly ? 0u : uint64_t(mr->mr.rkey));
    EXPECT_EQ(r.access, c.access);
    EXPECT_TRUE(std::all_of(r.addr, r.addr + r.length, [](char b) { return b == 0; }));
    RemoteRegion d = server_->Describe(r);
    EXPECT_EQ(d.addr, reinterpret_cast<uintptr_t>(r.addr));
    EXPECT_EQ(d.length, 5000u);
    EXPECT_EQ(d.rkey, r.rkey);
    EXPECT_TRUE(server_->FreeRegion(r).ok());
    EXPECT_EQ(fabric_.MrByLkey(r.lkey), nullptr);
  }
  LocalRegion r;
  EXPECT_EQ(server_->AllocateRegion(0, kRemoteWrite, &r).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(server_->AllocateRegion(64, 1u << 7, &r).code(), Status::Code::kInvalidArgument);
}

// Caller memory registers local-only (no remote rights, no rkey), is not zeroed, does not count
// against the region capacity, and stays the caller's after deregistration.
TEST_F(VerbsTest, CallerMemoryRegistersLocalOnly) {
  options_.region_capacity = 4096;
  Connect();
  std::vector<char> memory(10000, 'x');
  fabric_.registered_access.clear();
  LocalRegion r;
  ASSERT_TRUE(client_->RegisterLocal(memory.data(), memory.size(), &r).ok());
  ASSERT_EQ(fabric_.registered_access.size(), 1u);
  EXPECT_EQ(fabric_.registered_access[0], IBV_ACCESS_LOCAL_WRITE);
  FakeMr* mr = fabric_.MrByLkey(r.lkey);
  ASSERT_TRUE(mr);
  EXPECT_EQ(mr->mr.addr, memory.data());
  EXPECT_EQ(r.rkey, 0u);
  EXPECT_EQ(r.access, uint32_t(kLocalOnly));
  EXPECT_EQ(memory[9999], 'x');
  LocalRegion inside = Allocate(client_.get(), 4096, kLocalOnly);  // capacity untouched
  EXPECT_TRUE(client_->FreeRegion(r).ok());
  EXPECT_EQ(fabric_.MrByLkey(r.lkey), nullptr);
  EXPECT_EQ(memory[0], 'x');
  EXPECT_TRUE(client_->FreeRegion(inside).ok());
  EXPECT_EQ(client_->RegisterLocal(nullptr, 10, &r).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(client_->RegisterLocal(memory.data(), 0, &r).code(), Status::Code::kInvalidArgument);
}

TEST_F(VerbsTest, RegionCapacityIsEnforced) {
  options_.region_capacity = 8192;
  Connect();
  LocalRegion a = Allocate(client_.get(), 8192, kLocalOnly);
  LocalRegion b;
  EXPECT_EQ(client_->AllocateRegion(1, kLocalOnly, &b).code(), Status::Code::kWouldBlock);
  EXPECT_TRUE(client_->FreeRegion(a).ok());
  EXPECT_TRUE(client_->AllocateRegion(1, kLocalOnly, &b).ok());
  EXPECT_EQ(client_->FreeRegion(a).code(), Status::Code::kInvalidArgument);  // already freed
}

// ---------------------------------------------------------------------------------------------
// Posting.

TEST_F(VerbsTest, PostBuildsOneChainedListWithOneDoorbell) {
  Connect();
  LocalRegion src = Allocate(client_.get(), 4096, kLocalOnly);
  LocalRegion target = Allocate(server_.get(), 4096, kRemoteWrite | kRemoteRead);
  LocalRegion inbox = Allocate(server_.get(), 256, kLocalOnly);
  RemoteRegion remote = server_->Describe(target);
  RecvRequest recvs[2] = {{900, Sge{inbox.addr, 128, inbox.lkey}},
                          {901, Sge{inbox.addr + 128, 128, inbox.lkey}}};
  ASSERT_TRUE(server_->PostRecv(recvs, 2).ok());
  std::memcpy(src.addr, "headpayload", 11);
  std::memcpy(src.addr + 1000, "checksum", 8);
  std::memcpy(src.addr + 2000, "hello peer", 10);

  Sge gather[2] = {{src.addr, 4, src.lkey}, {src.addr + 4, 7, src.lkey}};
  Sge sum{src.addr + 1000, 8, src.lkey};
  Sge read_back{src.addr + 3000, 11, src.lkey};
  Sge message{src.addr + 2000, 10, src.lkey};
  WorkRequest wr[4];
  wr[0] = Write(1, gather, remote, 100);
  wr[0].num_sge = 2;
  wr[0].signaled = false;
  wr[1] = Write(2, &sum, remote, 200);
  wr[1].opcode = Opcode::kWriteWithImm;
  wr[1].imm = 0xdeadbeef;
  wr[1].fence = true;
  wr[2] = Write(3, &read_back, remote, 100);
  wr[2].opcode = Opcode::kRead;
  wr[3].wr_id = 4;
  wr[3].opcode = Opcode::kSend;
  wr[3].sg_list = &message;
  wr[3].num_sge = 1;
  int calls_before = fabric_.post_send_calls;
  ASSERT_TRUE(client_->Post(wr, 4).ok());
  EXPECT_EQ(fabric_.post_send_calls, calls_before + 1);

  const std::vector<RecordedSend>& chain = fabric_.last_chain;
  ASSERT_EQ(chain.size(), 4u);
  EXPECT_EQ(chain[0].opcode, IBV_WR_RDMA_WRITE);
  EXPECT_EQ(chain[1].opcode, IBV_WR_RDMA_WRITE_WITH_IMM);
  EXPECT_EQ(chain[2].opcode, IBV_WR_RDMA_READ);
  EXPECT_EQ(chain[3].opcode, IBV_WR_SEND);
  EXPECT_EQ(chain[0].send_flags, 0u);
  EXPECT_EQ(chain[1].send_flags, unsigned(IBV_SEND_SIGNALED | IBV_SEND_FENCE));
  EXPECT_EQ(chain[2].send_flags, unsigned(IBV_SEND_SIGNALED));
  EXPECT_EQ(chain[3].send_flags, unsigned(IBV_SEND_SIGNALED));
  ASSERT_EQ(chain[0].sges.size(), 2u);
  EXPECT_EQ(chain[0].sges[0].addr, reinterpret_cast<uintptr_t>(src.addr));
  EXPECT_EQ(chain[0].sges[0].length, 4u);
  EXPECT_EQ(chain[0].sges[1].addr, reinterpret_cast<uintptr_t>(src.addr + 4));
  EXPECT_EQ(chain[0].sges[1].lkey, src.lkey);
  EXPECT_EQ(chain[0].remote_addr, remote.addr + 100);
  EXPECT_EQ(chain[0].rkey, uint32_t(remote.rkey));
  EXPECT_EQ(chain[1].remote_addr, remote.addr + 200);
  EXPECT_EQ(chain[1].imm_data, htonl(0xdeadbeef));
  EXPECT_EQ(chain[2].sges[0].addr, reinterpret_cast<uintptr_t>(src.addr + 3000));

  // The model ran the requests: bytes are placed, read back and received.
  Completion wc[8];
  size_t n = 0;
  ASSERT_TRUE(client_->Poll(wc, 8, 1000, &n).ok());
  ASSERT_EQ(n, 3u);  // the unsignaled WRITE completes silently
  EXPECT_EQ(wc[0].wr_id, 2u);
  EXPECT_EQ(wc[0].opcode, Opcode::kWriteWithImm);
  EXPECT_EQ(wc[1].wr_id, 3u);
  EXPECT_EQ(wc[1].opcode, Opcode::kRead);
  EXPECT_EQ(wc[2].wr_id, 4u);
  EXPECT_EQ(wc[2].opcode, Opcode::kSend);
  for (size_t i = 0; i < n; i++) EXPECT_EQ(wc[i].status, WcStatus::kSuccess);
  EXPECT_EQ(std::string(target.addr + 100, 11), "headpayload");
  EXPECT_EQ(std::string(target.addr + 200, 8), "checksum");
  EXPECT_EQ(std::string(src.addr + 3000, 11), "headpayload");

  ASSERT_TRUE(server_->Poll(wc, 8, 1000, &n).ok());
  ASSERT_EQ(n, 2u);
  EXPECT_EQ(wc[0].wr_id, 900u);
  EXPECT_EQ(wc[0].opcode, Opcode::kRecv);
  EXPECT_TRUE(wc[0].has_imm);
  EXPECT_EQ(wc[0].imm, 0xdeadbeefu);
  EXPECT_EQ(wc[1].wr_id, 901u);
  EXPECT_FALSE(wc[1].has_imm);
  EXPECT_EQ(wc[1].byte_len, 10u);
  EXPECT_EQ(std::string(inbox.addr + 128, 10), "hello peer");
}

TEST_F(VerbsTest, BadRequestsAreRefusedBeforeAnythingIsPosted) {
  Connect();
  LocalRegion src = Allocate(client_.get(), 64, kLocalOnly);
  LocalRegion target = Allocate(server_.get(), 64, kRemoteWrite);
  RemoteRegion remote = server_->Describe(target);
  Sge good{src.addr, 8, src.lkey};
  Sge past_end{src.addr + 60, 8, src.lkey};
  Sge wrong_key{src.addr, 8, src.lkey + 77};
  int calls = fabric_.post_send_calls;
  WorkRequest wr[2] = {Write(1, &good, remote), Write(2, &past_end, remote)};
  EXPECT_EQ(client_->Post(wr, 2).code(), Status::Code::kInvalidArgument);
  wr[1] = Write(2, &wrong_key, remote);
  EXPECT_EQ(client_->Post(wr, 2).code(), Status::Code::kInvalidArgument);
  wr[1] = Write(2, &good, remote);
  wr[1].rkey = 1ull << 40;  // no verbs key is that wide
  EXPECT_EQ(client_->Post(wr, 2).code(), Status::Code::kInvalidArgument);
  wr[1] = Write(2, &good, remote);
  wr[1].opcode = Opcode::kRecv;
  EXPECT_EQ(client_->Post(wr, 2).code(), Status::Code::kInvalidArgument);
  // A NIC's gather list is flat: no strided gathers (the transfer layer expands periods).
  EXPECT_EQ(client_->max_repeat(), 1u);
  wr[1] = Write(2, &good, remote);
  wr[1].repeat = 2;
  EXPECT_EQ(client_->Post(wr, 2).code(), Status::Code::kInvalidArgument);
  RecvRequest recv{5, past_end};
  EXPECT_EQ(client_->PostRecv(&recv, 1).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(fabric_.post_send_calls, calls);
  EXPECT_TRUE(std::all_of(target.addr, target.addr + 64, [](char b) { return b == 0; }));
}

TEST_F(VerbsTest, PostSendFailureSurfacesAsAStatus) {
  Connect(4);
  LocalRegion src = Allocate(client_.get(), 64, kLocalOnly);
  LocalRegion target = Allocate(server_.get(), 64, kRemoteWrite);
  Sge sge{src.addr, 8, src.lkey};
  WorkRequest wr = Write(1, &sge, server_->Describe(target));
  fabric_.post_send_error = ENOMEM;
  EXPECT_EQ(client_->Post(&wr, 1).code(), Status::Code::kWouldBlock);
  fabric_.post_send_error = EIO;
  Status s = client_->Post(&wr, 1);
  EXPECT_EQ(s.code(), Status::Code::kIOError);
  EXPECT_NE(s.message().find("ibv_post_send"), std::string::npos) << s.message();
  // Nothing stayed outstanding: the whole budget of 4 is still free.
  fabric_.post_send_error = 0;
  fabric_.hold_sends = true;
  WorkRequest four[4] = {wr, wr, wr, wr};
  EXPECT_TRUE(client_->Post(four, 4).ok());
  EXPECT_EQ(client_->Post(&wr, 1).code(), Status::Code::kWouldBlock);  // max_outstanding
  ExpectNoCompletion(client_.get());
  fabric_.CompleteHeld(IBV_WC_SUCCESS);
  Completion wc[4];
  size_t n = 0;
  ASSERT_TRUE(client_->Poll(wc, 4, 1000, &n).ok());
  EXPECT_EQ(n, 4u);
  EXPECT_TRUE(client_->Post(&wr, 1).ok());
}

TEST_F(VerbsTest, LongUnsignaledStreamsNeverExhaustTheQueue) {
  Connect(8);
  LocalRegion src = Allocate(client_.get(), 64, kLocalOnly);
  LocalRegion target = Allocate(server_.get(), 64, kRemoteWrite);
  Sge sge{src.addr, 8, src.lkey};
  WorkRequest wr = Write(1, &sge, server_->Describe(target));
  wr.signaled = false;
  int forced = 0;
  for (int i = 0; i < 100; i++) {
    Status s = client_->Post(&wr, 1);
    ASSERT_TRUE(s.ok()) << i << ": " << s.ToString();
    if (fabric_.last_chain[0].send_flags & IBV_SEND_SIGNALED) forced++;
    ExpectNoCompletion(client_.get());  // internal signals are never reported
  }
  EXPECT_GT(forced, 0);
}

// ---------------------------------------------------------------------------------------------
// Completions and errors.

TEST(VerbsStatusTest, MapsEveryCompletionStatus) {
  EXPECT_EQ(ToWcStatus(IBV_WC_SUCCESS), WcStatus::kSuccess);
  EXPECT_EQ(ToWcStatus(IBV_WC_REM_ACCESS_ERR), WcStatus::kRemoteAccessError);
  EXPECT_EQ(ToWcStatus(IBV_WC_LOC_LEN_ERR), WcStatus::kLocalLengthError);
  EXPECT_EQ(ToWcStatus(IBV_WC_WR_FLUSH_ERR), WcStatus::kFlushed);
  EXPECT_EQ(ToWcStatus(IBV_WC_RETRY_EXC_ERR), WcStatus::kFlushed);
  EXPECT_EQ(ToWcStatus(IBV_WC_RNR_RETRY_EXC_ERR), WcStatus::kFlushed);
  EXPECT_TRUE(ConnectionStateAfter(IBV_WC_SUCCESS).ok());
  EXPECT_EQ(ConnectionStateAfter(IBV_WC_REM_ACCESS_ERR).code(), Status::Code::kRemoteAccess);
  EXPECT_EQ(ConnectionStateAfter(IBV_WC_RETRY_EXC_ERR).code(), Status::Code::kDisconnected);
  EXPECT_EQ(ConnectionStateAfter(IBV_WC_RNR_RETRY_EXC_ERR).code(), Status::Code::kDisconnected);
  EXPECT_EQ(ConnectionStateAfter(IBV_WC_WR_FLUSH_ERR).code(), Status::Code::kDisconnected);
  EXPECT_EQ(ConnectionStateAfter(IBV_WC_LOC_LEN_ERR).code(), Status::Code::kIOError);
  EXPECT_EQ(ConnectionStateAfter(IBV_WC_GENERAL_ERR).code(), Status::Code::kIOError);
}

// One connection per status: a WRITE held by the fake completes with the given status.
TEST_F(VerbsTest, PollMapsEachCompletionStatusAndTheConnectionState) {
  struct Case {
    ibv_wc_status status;
    WcStatus expected;
    Status::Code state;
  } cases[] = {
      {IBV_WC_SUCCESS, WcStatus::kSuccess, Status::Code::kOk},
      {IBV_WC_REM_ACCESS_ERR, WcStatus::kRemoteAccessError, Status::Code::kRemoteAccess},
      {IBV_WC_LOC_LEN_ERR, WcStatus::kLocalLengthError, Status::Code::kIOError},
      {IBV_WC_WR_FLUSH_ERR, WcStatus::kFlushed, Status::Code::kDisconnected},
      {IBV_WC_RETRY_EXC_ERR, WcStatus::kFlushed, Status::Code::kDisconnected},
      {IBV_WC_RNR_RETRY_EXC_ERR, WcStatus::kFlushed, Status::Code::kDisconnected},
      {IBV_WC_REM_INV_REQ_ERR, WcStatus::kFlushed, Status::Code::kIOError},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(int(c.status));
    server_.reset();
    client_.reset();
    Connect();
    LocalRegion src = Allocate(client_.get(), 64, kLocalOnly);
    LocalRegion target = Allocate(server_.get(), 64, kRemoteWrite);
    Sge sge{src.addr, 8, src.lkey};
    WorkRequest wr[2] = {Write(41, &sge, server_->Describe(target)),
                         Write(42, &sge, server_->Describe(target))};
    fabric_.hold_sends = true;
    ASSERT_TRUE(client_->Post(wr, 1).ok());
    fabric_.CompleteHeld(c.status);
    fabric_.hold_sends = false;
    Completion wc = PollOne(client_.get());
    EXPECT_EQ(wc.wr_id, 41u);
    EXPECT_EQ(wc.opcode, Opcode::kWrite);
    EXPECT_EQ(wc.status, c.expected);
    EXPECT_EQ(client_->state().code(), c.state);
    if (c.state != Status::Code::kOk) {
      // Every later request on a failed connection completes with kFlushed...
      ASSERT_TRUE(client_->Post(&wr[1], 1).ok());
      wc = PollOne(client_.get());
      EXPECT_EQ(wc.wr_id, 42u);
      EXPECT_EQ(wc.status, WcStatus::kFlushed);
      // ...and with nothing left, Poll reports the connection's error.
      size_t n = 0;
      EXPECT_EQ(client_->Poll(&wc, 1, 100, &n).code(), c.state);
      EXPECT_EQ(n, 0u);
    }
  }
}

// The three kinds of violation, each on a fresh connection: both sides learn, nothing placed.
TEST_F(VerbsTest, RemoteAccessViolationFailsBothSidesAndPlacesNothing) {
  for (int kind = 0; kind < 3; kind++) {
    SCOPED_TRACE(kind);
    server_.reset();
    client_.reset();
    Connect();
    LocalRegion src = Allocate(client_.get(), 64, kLocalOnly);
    std::memset(src.addr, 'x', 64);
    LocalRegion target = Allocate(server_.get(), 64, kind == 2 ? kRemoteRead : kRemoteWrite);
    LocalRegion inbox = Allocate(server_.get(), 64, kLocalOnly);
    RecvRequest recv{77, Sge{inbox.addr, 64, inbox.lkey}};
    ASSERT_TRUE(server_->PostRecv(&recv, 1).ok());
    RemoteRegion remote = server_->Describe(target);
    Sge sge{src.addr, 16, src.lkey};
    WorkRequest wr = Write(5, &sge, remote);
    if (kind == 0) wr.rkey = remote.rkey + 1000;       // unknown key
    if (kind == 1) wr.remote_addr = remote.addr + 56;  // runs past the end
    ASSERT_TRUE(client_->Post(&wr, 1).ok());
    Completion wc = PollOne(client_.get());
    EXPECT_EQ(wc.wr_id, 5u);
    EXPECT_EQ(wc.status, WcStatus::kRemoteAccessError);
    EXPECT_EQ(client_->state().code(), Status::Code::kRemoteAccess);
    EXPECT_TRUE(std::all_of(target.addr, target.addr + 64, [](char b) { return b == 0; }));
    // The target's pending receive is flushed and its connection fails with RemoteAccess.
    wc = PollOne(server_.get());
    EXPECT_EQ(wc.wr_id, 77u);
    EXPECT_EQ(wc.status, WcStatus::kFlushed);
    EXPECT_EQ(server_->state().code(), Status::Code::kRemoteAccess) << server_->state().ToString();
  }
}

TEST_F(VerbsTest, ReceiveTooSmallIsALocalLengthError) {
  Connect();
  LocalRegion src = Allocate(client_.get(), 64, kLocalOnly);
  LocalRegion inbox = Allocate(server_.get(), 64, kLocalOnly);
  RecvRequest recv{8, Sge{inbox.addr, 8, inbox.lkey}};
  ASSERT_TRUE(server_->PostRecv(&recv, 1).ok());
  Sge sge{src.addr, 16, src.lkey};
  WorkRequest send;
  send.wr_id = 9;
  send.opcode = Opcode::kSend;
  send.sg_list = &sge;
  send.num_sge = 1;
  ASSERT_TRUE(client_->Post(&send, 1).ok());
  Completion wc = PollOne(server_.get());
  EXPECT_EQ(wc.wr_id, 8u);
  EXPECT_EQ(wc.status, WcStatus::kLocalLengthError);
  EXPECT_FALSE(server_->state().ok());
  wc = PollOne(client_.get());
  EXPECT_EQ(wc.status, WcStatus::kFlushed);
  EXPECT_FALSE(client_->state().ok());
}

TEST_F(VerbsTest, PeerDisconnectIsDetectedAndPendingRequestsFlush) {
  Connect();
  LocalRegion inbox = Allocate(server_.get(), 64, kLocalOnly);
  RecvRequest recv{3, Sge{inbox.addr, 64, inbox.lkey}};
  ASSERT_TRUE(server_->PostRecv(&recv, 1).ok());
  ExpectNoCompletion(server_.get());
  client_->Disconnect();
  EXPECT_EQ(client_->state().code(), Status::Code::kDisconnected);
  Completion wc = PollOne(server_.get());
  EXPECT_EQ(wc.wr_id, 3u);
  EXPECT_EQ(wc.status, WcStatus::kFlushed);
  EXPECT_EQ(server_->state().code(), Status::Code::kDisconnected);
  size_t n = 0;
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(server_->Poll(&wc, 1, 2000, &n).code(), Status::Code::kDisconnected);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(500));
}

TEST_F(VerbsTest, PeerProcessDeathIsSeenThroughTheSetupSocket) {
  Connect();
  // Destroying the client closes its setup socket without any goodbye, like a dead process.
  client_.reset();
  Completion wc;
  size_t n = 0;
  Status s = server_->Poll(&wc, 1, 1000, &n);
  EXPECT_EQ(s.code(), Status::Code::kDisconnected) << s.ToString();
  EXPECT_EQ(server_->state().code(), Status::Code::kDisconnected);
}

TEST_F(VerbsTest, PollNeverWaitsPastItsTimeout) {
  Connect();
  Completion wc;
  size_t n = 9;
  auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(server_->Poll(&wc, 1, 50, &n).ok());
  auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(n, 0u);
  EXPECT_GE(waited, std::chrono::milliseconds(50));
  EXPECT_LT(waited, std::chrono::milliseconds(400));
}

TEST_F(VerbsTest, CompletionDelayHoldsCompletionsBack) {
  Connect();
  LocalRegion src = Allocate(client_.get(), 64, kLocalOnly);
  LocalRegion target = Allocate(server_.get(), 64, kRemoteWrite);
  Sge sge{src.addr, 8, src.lkey};
  WorkRequest wr = Write(1, &sge, server_->Describe(target));
  TestFaults(client_)->completion_delay_us = 40000;
  auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(client_->Post(&wr, 1).ok());
  ExpectNoCompletion(client_.get());
  Completion wc = PollOne(client_.get(), 2000);
  EXPECT_EQ(wc.status, WcStatus::kSuccess);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(40));
}

TEST_F(VerbsTest, DestructionReleasesQpCqMrsPdDeviceInThatOrder) {
  Connect();
  LocalRegion a = Allocate(client_.get(), 64, kRemoteWrite);
  Allocate(client_.get(), 64, kLocalOnly);
  int id = fabric_.ContextOfLkey(a.lkey);
  ASSERT_NE(id, 0);
  size_t before = fabric_.CallsOf(id).size();
  client_.reset();
  std::vector<std::string> calls = fabric_.CallsOf(id);
  std::vector<std::string> teardown(calls.begin() + before, calls.end());
  EXPECT_EQ(teardown, (std::vector<std::string>{"destroy_qp", "destroy_cq", "dereg_mr", "dereg_mr",
                                                "dealloc_pd", "close_device"}));
  EXPECT_EQ(fabric_.failed_releases, 0);
}

// Runs only where a real device exists: the real table must find it.
TEST(VerbsRealDeviceTest, RealTableAgreesWithTheMachine) {
  int n = 0;
  ibv_device** list = RealVerbsApi().get_device_list(&n);
  bool any = list != nullptr && n > 0;
  if (list) RealVerbsApi().free_device_list(list);
  EXPECT_EQ(VerbsDeviceAvailable(), any);
  if (!any) GTEST_SKIP() << "no RDMA device here";
}

}  // namespace
}  // namespace slipstream::rdma
