// The semantics every software backend promises (transport.h, docs/rdma.md), checked on each:
// placement, ordering, completions, rights, keys, disconnects, peer death and injected faults.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "setup.h"
#include "slipstream/rdma/testing.h"
#include "slipstream/rdma/transport.h"
#include "tcp_transport.h"
#include "test_util.h"

namespace slipstream::rdma {
namespace {

using Clock = std::chrono::steady_clock;
using namespace test;  // NOLINT: the shared helpers (test_util.h)
constexpr char kSecret[] = "conformance-secret";

// Options for `backend` with the shared test secret.
TransportOptions OptionsFor(const std::string& backend) {
  TransportOptions options;
  options.backend = backend;
  options.secret = kSecret;
  options.connect_timeout_ms = kTimeoutMs;
  return options;
}

// Waits until `connection` leaves the OK state (or the deadline passes); returns its state.
Status WaitForFailure(Connection* connection, int timeout_ms = kTimeoutMs) {
  Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (connection->state().ok() && Clock::now() < deadline) {
    Completion wc[8];
    size_t n = 0;
    connection->Poll(wc, 8, 10, &n);  // keeps completions flowing on every backend
  }
  return connection->state();
}

// A WRITE (or another one-sided opcode) of `sges` to `remote` + `offset`.
WorkRequest OneSided(Opcode opcode, uint64_t wr_id, const std::vector<Sge>& sges,
                     const RemoteRegion& remote, uint64_t offset = 0) {
  WorkRequest wr;
  wr.wr_id = wr_id;
  wr.opcode = opcode;
  wr.sg_list = sges.data();
  wr.num_sge = static_cast<uint32_t>(sges.size());
  wr.remote_addr = remote.addr + offset;
  wr.rkey = remote.rkey;
  return wr;
}

// Posts one request and waits for its completion; returns its status.
WcStatus PostAndWait(Connection* connection, const WorkRequest& wr) {
  Status s = connection->Post(&wr, 1);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (!s.ok()) return WcStatus::kFlushed;
  std::vector<Completion> done = PollN(connection, 1);
  EXPECT_EQ(done.size(), 1u);
  if (done.size() != 1) return WcStatus::kFlushed;
  EXPECT_EQ(done[0].wr_id, wr.wr_id);
  return done[0].status;
}

class ConformanceTest : public ::testing::TestWithParam<std::string> {
 protected:
  // Connects a fresh pair for the backend under test.
  void SetUp() override {
    pair_ = MakePair(OptionsFor(GetParam()));
    ASSERT_NE(pair_.server, nullptr) << GetParam() << " backend did not connect";
    ASSERT_NE(pair_.client, nullptr);
    server_ = pair_.server.get();
    client_ = pair_.client.get();
  }

  // Allocates a region on `connection`, failing the test when that fails.
  LocalRegion Allocate(Connection* connection, size_t length, uint32_t access) {
    LocalRegion region;
    Status s = connection->AllocateRegion(length, access, &region);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return region;
  }

  Pair pair_;
  Connection* server_ = nullptr;
  Connection* client_ = nullptr;
};

TEST_P(ConformanceTest, RegionsAreZeroedAndDescribed) {
  LocalRegion region = Allocate(server_, 1 << 16, kRemoteWrite);
  ASSERT_NE(region.addr, nullptr);
  EXPECT_TRUE(AllZero(region.addr, region.length));
  RemoteRegion remote = server_->Describe(region);
  EXPECT_EQ(remote.length, region.length);
  EXPECT_EQ(remote.rkey, region.rkey);
  EXPECT_NE(remote.rkey, 0u);
  EXPECT_EQ(server_->backend(), GetParam());
  EXPECT_TRUE(server_->FreeRegion(region).ok());
  EXPECT_FALSE(server_->FreeRegion(region).ok());
}

TEST_P(ConformanceTest, WritePlacesExactBytesFromScatterGather) {
  LocalRegion target = Allocate(server_, 1 << 16, kRemoteWrite);
  LocalRegion source = Allocate(client_, 1 << 16, kLocalOnly);
  FillPattern(source.addr, source.length, 11);
  // Three pieces, out of order in the source, gathered into one contiguous write at offset 100.
  std::vector<Sge> sges = {{source.addr + 5000, 300, source.lkey},
                           {source.addr + 17, 1, source.lkey},
                           {source.addr + 40000, 9000, source.lkey}};
  RemoteRegion remote = server_->Describe(target);
  ASSERT_EQ(PostAndWait(client_, OneSided(Opcode::kWrite, 1, sges, remote, 100)),
            WcStatus::kSuccess);
  EXPECT_TRUE(AllZero(target.addr, 100));
  EXPECT_EQ(std::memcmp(target.addr + 100, source.addr + 5000, 300), 0);
  EXPECT_EQ(target.addr[400], source.addr[17]);
  EXPECT_EQ(std::memcmp(target.addr + 401, source.addr + 40000, 9000), 0);
  EXPECT_TRUE(AllZero(target.addr + 9401, target.length - 9401));
}

// A strided gather's bytes as a loop over its periods would place them.
std::string ReferenceGather(const std::vector<Sge>& sges, uint64_t repeat, uint64_t stride) {
  std::string image;
  for (uint64_t k = 0; k < repeat; k++) {
    for (const Sge& sge : sges) {
      image.append(static_cast<const char*>(sge.addr) + k * stride, sge.length);
    }
  }
  return image;
}

// Strided gathers of random shapes (entries of every common width and odd ones, periods from
// a few bytes to more than tcp's 256 KiB send chunk, repeats from 1 to thousands), alone and
// with immediate, land exactly as the reference loop places them, and nowhere else.
TEST_P(ConformanceTest, StridedGathersPlaceEveryPeriod) {
  ASSERT_GT(client_->max_repeat(), 1u);
  constexpr size_t kSource = 8 << 20;
  constexpr size_t kTarget = 4 << 20;
  LocalRegion source = Allocate(client_, kSource, kLocalOnly);
  LocalRegion target = Allocate(server_, kTarget, kRemoteWrite);
  FillPattern(source.addr, source.length, 5);
  RemoteRegion remote = server_->Describe(target);
  std::mt19937_64 rng(20261130);
  const uint32_t widths[] = {1, 2, 3, 4, 8, 12, 16, 24, 32, 40, 300};
  for (int round = 0; round < 60; round++) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::vector<Sge> sges;
    uint64_t period = 0;
    uint64_t reach = 0;  // how far into a period's source the entries go
    const size_t entries = 1 + rng() % 5;
    for (size_t i = 0; i < entries; i++) {
      const uint32_t width = round == 7 ? 300000 : widths[rng() % std::size(widths)];
      const uint64_t at = reach + rng() % 64;
      sges.push_back(Sge{source.addr + at, width, source.lkey});
      reach = at + width;
      period += width;
    }
    const uint64_t stride = reach + rng() % 200;
    const uint64_t max_repeat =
        std::min<uint64_t>((kSource - reach) / stride + 1, (kTarget - 64) / period);
    const uint64_t repeat = 1 + rng() % std::min<uint64_t>(max_repeat, round % 3 ? 5000 : 8);
    const uint64_t offset = rng() % 64;
    WorkRequest wr = OneSided(round % 4 == 0 ? Opcode::kWriteWithImm : Opcode::kWrite,
                              uint64_t(round) + 1, sges, remote, offset);
    wr.repeat = uint32_t(repeat);
    wr.repeat_stride = stride;
    wr.imm = uint32_t(round);
    if (wr.opcode == Opcode::kWriteWithImm) {
      LocalRegion notice = Allocate(server_, 64, kLocalOnly);
      RecvRequest recv{7, Sge{notice.addr, 64, notice.lkey}};
      ASSERT_TRUE(server_->PostRecv(&recv, 1).ok());
      ASSERT_EQ(PostAndWait(client_, wr), WcStatus::kSuccess);
      std::vector<Completion> got = PollN(server_, 1);
      ASSERT_EQ(got.size(), 1u);
      EXPECT_EQ(got[0].byte_len, repeat * period);
      EXPECT_EQ(got[0].imm, uint32_t(round));
      EXPECT_TRUE(server_->FreeRegion(notice).ok());
    } else {
      ASSERT_EQ(PostAndWait(client_, wr), WcStatus::kSuccess);
    }
    const std::string want = ReferenceGather(sges, repeat, stride);
    ASSERT_EQ(std::string(target.addr + offset, want.size()), want);
    EXPECT_TRUE(AllZero(target.addr, offset));
    EXPECT_TRUE(AllZero(target.addr + offset + want.size(), kTarget - offset - want.size()));
    std::memset(target.addr, 0, kTarget);
  }
}

// A strided gather whose last copy would read past its region, whose repeat is 0, whose
// stride overflows, or that is not a WRITE, is refused at Post: nothing is placed.
TEST_P(ConformanceTest, BadStridedGathersAreRefusedLocally) {
  LocalRegion source = Allocate(client_, 4096, kLocalOnly);
  LocalRegion target = Allocate(server_, 1 << 16, kRemoteWrite | kRemoteRead);
  RemoteRegion remote = server_->Describe(target);
  std::vector<Sge> sges = {{source.addr + 8, 16, source.lkey}};
  WorkRequest wr = OneSided(Opcode::kWrite, 1, sges, remote);
  wr.repeat_stride = 128;
  wr.repeat = 33;  // the last copy starts at 8 + 32 * 128 = 4,104: past the 4,096 bytes
  EXPECT_EQ(client_->Post(&wr, 1).code(), Status::Code::kInvalidArgument);
  wr.repeat = 32;
  wr.repeat_stride = 132;  // ends at 8 + 31 * 132 + 16 = 4,116: one entry's end past it
  EXPECT_EQ(client_->Post(&wr, 1).code(), Status::Code::kInvalidArgument);
  wr.repeat = 0;
  EXPECT_EQ(client_->Post(&wr, 1).code(), Status::Code::kInvalidArgument);
  wr.repeat = 3;
  wr.repeat_stride = UINT64_MAX / 2 + 1;  // 2 * stride wraps around
  EXPECT_EQ(client_->Post(&wr, 1).code(), Status::Code::kInvalidArgument);
  wr.repeat_stride = UINT64_MAX / 2 - 4;  // no wrap in the product, but past the address space
  EXPECT_EQ(client_->Post(&wr, 1).code(), Status::Code::kInvalidArgument);
  wr.repeat_stride = 128;
  wr.opcode = Opcode::kRead;
  EXPECT_EQ(client_->Post(&wr, 1).code(), Status::Code::kInvalidArgument);
  wr.opcode = Opcode::kSend;
  EXPECT_EQ(client_->Post(&wr, 1).code(), Status::Code::kInvalidArgument);
  EXPECT_TRUE(AllZero(target.addr, target.length));
  // The largest that fits: the last copy ends at 8 + 31 * 129 + 16 = 4,023.
  wr.opcode = Opcode::kWrite;
  wr.repeat = 32;
  wr.repeat_stride = 129;
  FillPattern(source.addr, source.length, 3);
  ASSERT_EQ(PostAndWait(client_, wr), WcStatus::kSuccess);
  EXPECT_EQ(std::string(target.addr, 32 * 16), ReferenceGather(sges, 32, 129));
  EXPECT_TRUE(AllZero(target.addr + 32 * 16, target.length - 32 * 16));
  EXPECT_TRUE(client_->state().ok());
}

// A strided gather cut short by an injected fault leaves exactly a prefix of its image.
TEST_P(ConformanceTest, TornStridedGatherPlacesAPrefix) {
  LocalRegion source = Allocate(client_, 1 << 20, kLocalOnly);
  LocalRegion target = Allocate(server_, 1 << 20, kRemoteWrite);
  FillPattern(source.addr, source.length, 9);
  RemoteRegion remote = server_->Describe(target);
  std::vector<Sge> sges = {{source.addr, 16, source.lkey}, {source.addr + 40, 8, source.lkey}};
  WorkRequest wr = OneSided(Opcode::kWrite, 1, sges, remote);
  wr.repeat = 8000;
  wr.repeat_stride = 128;
  constexpr int64_t kTorn = 70001;
  TestFaults(client_)->tear_next_write_after = kTorn;
  ASSERT_TRUE(client_->Post(&wr, 1).ok());
  std::vector<Completion> got = PollN(client_, 1);
  if (!got.empty()) {
    EXPECT_NE(got[0].status, WcStatus::kSuccess);
  }
  Status state = WaitForFailure(server_);
  EXPECT_EQ(state.code(), Status::Code::kDisconnected) << state.ToString();
  const std::string want = ReferenceGather(sges, 8000, 128);
  EXPECT_EQ(std::string(target.addr, kTorn), want.substr(0, kTorn));
  EXPECT_TRUE(AllZero(target.addr + kTorn, target.length - kTorn));
}

TEST_P(ConformanceTest, CompletionImpliesPlacement) {
  LocalRegion target = Allocate(server_, 4096, kRemoteWrite);
  LocalRegion source = Allocate(client_, 4096, kLocalOnly);
  RemoteRegion remote = server_->Describe(target);
  for (uint32_t round = 0; round < 200; round++) {
    FillPattern(source.addr, 4096, round);
    std::vector<Sge> sges = {{source.addr, 4096, source.lkey}};
    ASSERT_EQ(PostAndWait(client_, OneSided(Opcode::kWrite, round, sges, remote)),
              WcStatus::kSuccess);
    // Read the target right after the completion: every byte must already be there.
    ASSERT_TRUE(HasPattern(target.addr, 4096, round)) << "round " << round;
  }
}

TEST_P(ConformanceTest, WritesArePlacedInPostingOrder) {
  constexpr uint32_t kWrites = 1000;
  LocalRegion target = Allocate(server_, 64, kRemoteWrite);
  LocalRegion source = Allocate(client_, kWrites * 8, kLocalOnly);
  RemoteRegion remote = server_->Describe(target);
  std::vector<std::vector<Sge>> sges(kWrites);
  std::vector<WorkRequest> wrs;
  for (uint64_t i = 0; i < kWrites; i++) {
    uint64_t value = i + 1;
    std::memcpy(source.addr + i * 8, &value, 8);
    sges[i] = {{source.addr + i * 8, 8, source.lkey}};
    wrs.push_back(OneSided(Opcode::kWrite, i, sges[i], remote, 8));
    wrs.back().signaled = (i + 1) % 100 == 0;
  }
  for (uint32_t first = 0; first < kWrites; first += 100) {
    Status s;
    // Each batch of 100 fits max_outstanding once the previous batch has completed.
    ASSERT_TRUE((s = client_->Post(&wrs[first], 100)).ok()) << s.ToString();
    std::vector<Completion> done = PollN(client_, 1);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].wr_id, first + 99);
    EXPECT_EQ(done[0].status, WcStatus::kSuccess);
  }
  uint64_t final_value = 0;
  std::memcpy(&final_value, target.addr + 8, 8);
  EXPECT_EQ(final_value, kWrites);
}

TEST_P(ConformanceTest, SizesFromOneByteToFourMebibytes) {
  constexpr size_t kMax = 4u << 20;
  LocalRegion target = Allocate(server_, kMax + 64, kRemoteWrite | kRemoteRead);
  LocalRegion source = Allocate(client_, kMax, kLocalOnly);
  LocalRegion back = Allocate(client_, kMax, kLocalOnly);
  RemoteRegion remote = server_->Describe(target);
  uint32_t seed = 100;
  for (size_t size : {size_t(1), size_t(2), size_t(3), size_t(7), size_t(64), size_t(4095),
                      size_t(4096), size_t(65537), size_t(1u << 20) + 3, kMax}) {
    seed++;
    FillPattern(source.addr, size, seed);
    std::vector<Sge> out = {{source.addr, uint32_t(size), source.lkey}};
    ASSERT_EQ(PostAndWait(client_, OneSided(Opcode::kWrite, seed, out, remote, 64)),
              WcStatus::kSuccess)
        << size;
    ASSERT_TRUE(HasPattern(target.addr + 64, size, seed)) << size;
    std::vector<Sge> in = {{back.addr, uint32_t(size), back.lkey}};
    ASSERT_EQ(PostAndWait(client_, OneSided(Opcode::kRead, seed, in, remote, 64)),
              WcStatus::kSuccess)
        << size;
    ASSERT_TRUE(HasPattern(back.addr, size, seed)) << size;
  }
}

TEST_P(ConformanceTest, ReadScattersIntoSeveralBuffers) {
  LocalRegion target = Allocate(server_, 8192, kRemoteRead);
  FillPattern(target.addr, 8192, 77);
  LocalRegion dest = Allocate(client_, 8192, kLocalOnly);
  std::vector<Sge> sges = {{dest.addr + 4096, 1000, dest.lkey}, {dest.addr, 24, dest.lkey}};
  RemoteRegion remote = server_->Describe(target);
  ASSERT_EQ(PostAndWait(client_, OneSided(Opcode::kRead, 5, sges, remote, 10)), WcStatus::kSuccess);
  EXPECT_EQ(std::memcmp(dest.addr + 4096, target.addr + 10, 1000), 0);
  EXPECT_EQ(std::memcmp(dest.addr, target.addr + 1010, 24), 0);
  EXPECT_TRUE(AllZero(dest.addr + 24, 4096 - 24));
}

TEST_P(ConformanceTest, SendAndReceive) {
  LocalRegion inbox = Allocate(server_, 4 * 4096, kLocalOnly);
  LocalRegion outbox = Allocate(client_, 4096, kLocalOnly);
  FillPattern(outbox.addr, 4096, 5);
  // One message arrives before its receive is posted; the others find posted receives.
  std::vector<Sge> first = {{outbox.addr, 100, outbox.lkey}};
  WorkRequest early;
  early.wr_id = 1;
  early.opcode = Opcode::kSend;
  early.sg_list = first.data();
  early.num_sge = 1;
  ASSERT_EQ(PostAndWait(client_, early), WcStatus::kSuccess);
  RecvRequest recvs[4];
  for (int i = 0; i < 4; i++) {
    recvs[i].wr_id = 10 + i;
    recvs[i].sge = Sge{inbox.addr + i * 4096, 4096, inbox.lkey};
  }
  ASSERT_TRUE(server_->PostRecv(recvs, 4).ok());
  std::vector<Sge> second = {{outbox.addr + 1000, 50, outbox.lkey}, {outbox.addr, 10, outbox.lkey}};
  WorkRequest gathered = early;
  gathered.wr_id = 2;
  gathered.sg_list = second.data();
  gathered.num_sge = 2;
  ASSERT_EQ(PostAndWait(client_, gathered), WcStatus::kSuccess);
  std::vector<Completion> got = PollN(server_, 2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].opcode, Opcode::kRecv);
  EXPECT_EQ(got[0].wr_id, 10u);
  EXPECT_EQ(got[0].status, WcStatus::kSuccess);
  EXPECT_EQ(got[0].byte_len, 100u);
  EXPECT_FALSE(got[0].has_imm);
  EXPECT_TRUE(HasPattern(inbox.addr, 100, 5));
  EXPECT_EQ(got[1].wr_id, 11u);
  EXPECT_EQ(got[1].byte_len, 60u);
  EXPECT_EQ(std::memcmp(inbox.addr + 4096, outbox.addr + 1000, 50), 0);
  EXPECT_EQ(std::memcmp(inbox.addr + 4096 + 50, outbox.addr, 10), 0);
}

TEST_P(ConformanceTest, SendLargerThanTheReceiveIsALengthError) {
  LocalRegion inbox = Allocate(server_, 4096, kLocalOnly);
  LocalRegion outbox = Allocate(client_, 4096, kLocalOnly);
  RecvRequest recv{7, Sge{inbox.addr, 16, inbox.lkey}};
  ASSERT_TRUE(server_->PostRecv(&recv, 1).ok());
  std::vector<Sge> sges = {{outbox.addr, 17, outbox.lkey}};
  WorkRequest send;
  send.wr_id = 1;
  send.opcode = Opcode::kSend;
  send.sg_list = sges.data();
  send.num_sge = 1;
  ASSERT_TRUE(client_->Post(&send, 1).ok());
  std::vector<Completion> got = PollN(server_, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].wr_id, 7u);
  EXPECT_EQ(got[0].status, WcStatus::kLocalLengthError);
}

TEST_P(ConformanceTest, WriteWithImmediateNotifiesTheTarget) {
  LocalRegion target = Allocate(server_, 4096, kRemoteWrite);
  LocalRegion inbox = Allocate(server_, 64, kLocalOnly);
  LocalRegion source = Allocate(client_, 4096, kLocalOnly);
  FillPattern(source.addr, 4096, 9);
  RecvRequest recv{42, Sge{inbox.addr, 64, inbox.lkey}};
  ASSERT_TRUE(server_->PostRecv(&recv, 1).ok());
  std::vector<Sge> sges = {{source.addr, 512, source.lkey}};
  WorkRequest wr = OneSided(Opcode::kWriteWithImm, 3, sges, server_->Describe(target), 256);
  wr.imm = 0xC0FFEE;
  ASSERT_EQ(PostAndWait(client_, wr), WcStatus::kSuccess);
  std::vector<Completion> got = PollN(server_, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].wr_id, 42u);
  EXPECT_EQ(got[0].opcode, Opcode::kRecv);
  EXPECT_EQ(got[0].status, WcStatus::kSuccess);
  EXPECT_TRUE(got[0].has_imm);
  EXPECT_EQ(got[0].imm, 0xC0FFEEu);
  // The notification comes after the data is in place.
  EXPECT_TRUE(HasPattern(target.addr + 256, 512, 9));
}

TEST_P(ConformanceTest, UnsignaledRequestsProduceNoCompletion) {
  LocalRegion target = Allocate(server_, 4096, kRemoteWrite);
  LocalRegion source = Allocate(client_, 4096, kLocalOnly);
  FillPattern(source.addr, 4096, 3);
  RemoteRegion remote = server_->Describe(target);
  std::vector<std::vector<Sge>> sges(10);
  std::vector<WorkRequest> wrs;
  for (int i = 0; i < 10; i++) {
    sges[i] = {{source.addr + i * 400, 400, source.lkey}};
    wrs.push_back(OneSided(Opcode::kWrite, i, sges[i], remote, i * 400));
    wrs.back().signaled = i == 9;
  }
  ASSERT_TRUE(client_->Post(wrs.data(), wrs.size()).ok());
  std::vector<Completion> got = PollN(client_, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].wr_id, 9u);
  EXPECT_TRUE(PollN(client_, 1, 100).empty());
  EXPECT_TRUE(HasPattern(target.addr, 4000, 3));
}

TEST_P(ConformanceTest, FenceWaitsForEarlierRequests) {
  // READ remote A into a local buffer, then (fenced) WRITE that buffer to remote B: B gets
  // A's bytes only if the WRITE gathered after the READ had completed.
  LocalRegion remote_a = Allocate(server_, 1 << 20, kRemoteRead);
  LocalRegion remote_b = Allocate(server_, 1 << 20, kRemoteWrite);
  FillPattern(remote_a.addr, remote_a.length, 21);
  LocalRegion staging = Allocate(client_, 1 << 20, kLocalOnly);
  std::vector<Sge> sges = {{staging.addr, 1 << 20, staging.lkey}};
  WorkRequest wrs[2] = {OneSided(Opcode::kRead, 1, sges, server_->Describe(remote_a)),
                        OneSided(Opcode::kWrite, 2, sges, server_->Describe(remote_b))};
  wrs[1].fence = true;
  ASSERT_TRUE(client_->Post(wrs, 2).ok());
  std::vector<Completion> got = PollN(client_, 2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].wr_id, 1u);
  EXPECT_EQ(got[1].wr_id, 2u);
  EXPECT_EQ(got[1].status, WcStatus::kSuccess);
  EXPECT_TRUE(HasPattern(remote_b.addr, remote_b.length, 21));
}

TEST_P(ConformanceTest, ManyRequestsInOnePost) {
  constexpr int kCount = 200;
  LocalRegion target = Allocate(server_, kCount * 256, kRemoteWrite);
  LocalRegion source = Allocate(client_, kCount * 256, kLocalOnly);
  FillPattern(source.addr, source.length, 8);
  RemoteRegion remote = server_->Describe(target);
  std::vector<std::vector<Sge>> sges(kCount);
  std::vector<WorkRequest> wrs;
  for (int i = 0; i < kCount; i++) {
    sges[i] = {{source.addr + i * 256, 256, source.lkey}};
    wrs.push_back(OneSided(Opcode::kWrite, 1000 + i, sges[i], remote, i * 256));
  }
  ASSERT_TRUE(client_->Post(wrs.data(), wrs.size()).ok());
  std::vector<Completion> got = PollN(client_, kCount);
  ASSERT_EQ(got.size(), size_t(kCount));
  for (int i = 0; i < kCount; i++) {
    EXPECT_EQ(got[i].wr_id, uint64_t(1000 + i));  // posting order
    EXPECT_EQ(got[i].status, WcStatus::kSuccess);
  }
  EXPECT_TRUE(HasPattern(target.addr, target.length, 8));
}

TEST_P(ConformanceTest, BadPostsAreRefusedLocally) {
  LocalRegion source = Allocate(client_, 4096, kLocalOnly);
  LocalRegion target = Allocate(server_, 4096, kRemoteWrite);
  RemoteRegion remote = server_->Describe(target);
  // An Sge one byte past its region, and one with an lkey of no region.
  std::vector<Sge> outside = {{source.addr + 1, 4096, source.lkey}};
  WorkRequest wr = OneSided(Opcode::kWrite, 1, outside, remote);
  EXPECT_EQ(client_->Post(&wr, 1).code(), Status::Code::kInvalidArgument);
  std::vector<Sge> no_region = {{source.addr, 16, source.lkey + 1000}};
  wr = OneSided(Opcode::kWrite, 1, no_region, remote);
  EXPECT_EQ(client_->Post(&wr, 1).code(), Status::Code::kInvalidArgument);
  // Memory of a region on another connection is not a local buffer of this one.
  std::vector<Sge> foreign = {{target.addr, 16, source.lkey}};
  wr = OneSided(Opcode::kWrite, 1, foreign, remote);
  EXPECT_EQ(client_->Post(&wr, 1).code(), Status::Code::kInvalidArgument);
  // More requests than max_outstanding in one call.
  std::vector<Sge> fine = {{source.addr, 16, source.lkey}};
  std::vector<WorkRequest> too_many(OptionsFor(GetParam()).max_outstanding + 1,
                                    OneSided(Opcode::kWrite, 1, fine, remote));
  EXPECT_EQ(client_->Post(too_many.data(), too_many.size()).code(), Status::Code::kInvalidArgument);
  // Nothing above was posted: the connection is fine and idle.
  EXPECT_TRUE(PollN(client_, 1, 50).empty());
  EXPECT_TRUE(client_->state().ok());
  EXPECT_TRUE(AllZero(target.addr, target.length));
}

TEST_P(ConformanceTest, RegionCapacityIsEnforced) {
  TransportOptions options = OptionsFor(GetParam());
  options.region_capacity = 1 << 20;
  Pair small = MakePair(options);
  ASSERT_NE(small.client, nullptr);
  LocalRegion a, b;
  ASSERT_TRUE(small.client->AllocateRegion(768 << 10, kRemoteWrite, &a).ok());
  EXPECT_FALSE(small.client->AllocateRegion(512 << 10, kRemoteWrite, &b).ok());
  ASSERT_TRUE(small.client->FreeRegion(a).ok());
  EXPECT_TRUE(small.client->AllocateRegion(1 << 20, kRemoteWrite, &b).ok());
}

TEST_P(ConformanceTest, RemoteKeysAreRandom) {
  Pair other = MakePair(OptionsFor(GetParam()));
  ASSERT_NE(other.server, nullptr);
  std::vector<uint64_t> keys;
  for (Connection* connection : {server_, client_, other.server.get(), other.client.get()}) {
    for (int i = 0; i < 8; i++) {
      LocalRegion region;
      ASSERT_TRUE(connection->AllocateRegion(4096, kRemoteWrite, &region).ok());
      keys.push_back(region.rkey);
    }
  }
  std::set<uint64_t> distinct(keys.begin(), keys.end());
  EXPECT_EQ(distinct.size(), keys.size());
  EXPECT_EQ(distinct.count(0), 0u);
  // Consecutive keys are far apart (sequential or nearby keys would be guessable).
  for (size_t i = 1; i < keys.size(); i++) {
    uint64_t gap = keys[i] > keys[i - 1] ? keys[i] - keys[i - 1] : keys[i - 1] - keys[i];
    EXPECT_GT(gap, uint64_t(1) << 24) << "keys " << keys[i - 1] << " and " << keys[i];
  }
}

// How a rights violation is provoked.
enum class Violation { kWriteReadOnly, kReadWriteOnly, kUnknownKey, kOneBytePastEnd };

// Runs one violation followed by a legal WRITE, and checks what both sides see.
void CheckViolation(const std::string& backend, Violation violation) {
  Pair pair = MakePair(OptionsFor(backend));
  ASSERT_NE(pair.server, nullptr);
  Connection* server = pair.server.get();
  Connection* client = pair.client.get();
  LocalRegion read_only, write_only;
  ASSERT_TRUE(server->AllocateRegion(4096, kRemoteRead, &read_only).ok());
  ASSERT_TRUE(server->AllocateRegion(4096, kRemoteWrite, &write_only).ok());
  LocalRegion local;
  ASSERT_TRUE(client->AllocateRegion(8192, kLocalOnly, &local).ok());
  FillPattern(local.addr, local.length, 1);
  std::vector<Sge> sges = {{local.addr, 4096, local.lkey}};
  std::vector<Sge> long_sges = {{local.addr, 4097, local.lkey}};
  WorkRequest bad;
  switch (violation) {
    case Violation::kWriteReadOnly:
      bad = OneSided(Opcode::kWrite, 1, sges, server->Describe(read_only));
      break;
    case Violation::kReadWriteOnly:
      bad = OneSided(Opcode::kRead, 1, sges, server->Describe(write_only));
      break;
    case Violation::kUnknownKey: {
      RemoteRegion forged = server->Describe(write_only);
      forged.rkey ^= 0x5a5a5a5a;
      bad = OneSided(Opcode::kWrite, 1, sges, forged);
      break;
    }
    case Violation::kOneBytePastEnd:
      bad = OneSided(Opcode::kWrite, 1, long_sges, server->Describe(write_only));
      break;
  }
  WorkRequest wrs[2] = {bad, OneSided(Opcode::kWrite, 2, sges, server->Describe(write_only))};
  ASSERT_TRUE(client->Post(wrs, 2).ok());
  std::vector<Completion> got = PollN(client, 2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].wr_id, 1u);
  EXPECT_EQ(got[0].status, WcStatus::kRemoteAccessError);
  EXPECT_EQ(got[1].wr_id, 2u);
  EXPECT_EQ(got[1].status, WcStatus::kFlushed);
  // Later requests are flushed too.
  WorkRequest later = OneSided(Opcode::kWrite, 3, sges, server->Describe(write_only));
  client->Post(&later, 1);
  got = PollN(client, 1, 1000);
  if (!got.empty()) {
    EXPECT_EQ(got[0].status, WcStatus::kFlushed);
  }
  EXPECT_FALSE(client->state().ok());
  Status target_state = WaitForFailure(server);
  EXPECT_EQ(target_state.code(), Status::Code::kRemoteAccess) << target_state.ToString();
  EXPECT_TRUE(AllZero(read_only.addr, read_only.length));
  EXPECT_TRUE(AllZero(write_only.addr, write_only.length));
}

TEST_P(ConformanceTest, WriteIntoReadOnlyRegionIsRefused) {
  CheckViolation(GetParam(), Violation::kWriteReadOnly);
}

TEST_P(ConformanceTest, ReadFromWriteOnlyRegionIsRefused) {
  CheckViolation(GetParam(), Violation::kReadWriteOnly);
}

TEST_P(ConformanceTest, UnknownKeyIsRefused) {
  CheckViolation(GetParam(), Violation::kUnknownKey);
}

TEST_P(ConformanceTest, OneBytePastTheEndIsRefused) {
  CheckViolation(GetParam(), Violation::kOneBytePastEnd);
}

TEST_P(ConformanceTest, FreedRegionIsNoLongerAccessible) {
  LocalRegion target = Allocate(server_, 4096, kRemoteWrite);
  RemoteRegion remote = server_->Describe(target);
  ASSERT_TRUE(server_->FreeRegion(target).ok());
  LocalRegion source = Allocate(client_, 4096, kLocalOnly);
  std::vector<Sge> sges = {{source.addr, 16, source.lkey}};
  EXPECT_EQ(PostAndWait(client_, OneSided(Opcode::kWrite, 1, sges, remote)),
            WcStatus::kRemoteAccessError);
}

TEST_P(ConformanceTest, PeerDisconnectFlushesAndNeverHangs) {
  LocalRegion target = Allocate(server_, 1 << 20, kRemoteWrite);
  LocalRegion source = Allocate(client_, 1 << 20, kLocalOnly);
  RemoteRegion remote = server_->Describe(target);
  std::vector<Sge> sges = {{source.addr, 1 << 20, source.lkey}};
  std::vector<WorkRequest> wrs(64, OneSided(Opcode::kWrite, 0, sges, remote));
  for (size_t i = 0; i < wrs.size(); i++) wrs[i].wr_id = i;
  ASSERT_TRUE(client_->Post(wrs.data(), wrs.size()).ok());
  server_->Disconnect();
  EXPECT_EQ(server_->state().code(), Status::Code::kDisconnected);
  // Every request completes exactly once: successes first, then flushes.
  std::vector<Completion> got = PollN(client_, wrs.size());
  ASSERT_EQ(got.size(), wrs.size());
  bool flushing = false;
  for (size_t i = 0; i < got.size(); i++) {
    EXPECT_EQ(got[i].wr_id, i);
    if (got[i].status != WcStatus::kSuccess) flushing = true;
    EXPECT_EQ(got[i].status, flushing ? WcStatus::kFlushed : WcStatus::kSuccess);
  }
  Status state = WaitForFailure(client_);
  EXPECT_EQ(state.code(), Status::Code::kDisconnected) << state.ToString();
  // Requests posted now are flushed, and Poll returns within its timeout.
  WorkRequest late = OneSided(Opcode::kWrite, 99, sges, remote);
  client_->Post(&late, 1);
  auto start = Clock::now();
  got = PollN(client_, 2, 300);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
  ASSERT_LE(got.size(), 1u);
  if (!got.empty()) {
    EXPECT_EQ(got[0].status, WcStatus::kFlushed);
  }
}

TEST_P(ConformanceTest, PollHonoursItsTimeout) {
  Completion wc[4];
  size_t n = 7;
  auto start = Clock::now();
  EXPECT_TRUE(client_->Poll(wc, 4, 150, &n).ok());
  auto spent = Clock::now() - start;
  EXPECT_EQ(n, 0u);
  EXPECT_GE(spent, std::chrono::milliseconds(140));
  EXPECT_LT(spent, std::chrono::seconds(2));
  start = Clock::now();
  EXPECT_TRUE(client_->Poll(wc, 4, 0, &n).ok());
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(100));
}

TEST_P(ConformanceTest, TornWritePlacesExactlyThePrefix) {
  constexpr size_t kLength = 256 << 10;
  constexpr int64_t kTorn = 70001;
  LocalRegion target = Allocate(server_, kLength, kRemoteWrite);
  LocalRegion source = Allocate(client_, kLength, kLocalOnly);
  FillPattern(source.addr, kLength, 31);
  // An earlier whole write lands; then the torn one at another offset.
  std::vector<Sge> small = {{source.addr, 100, source.lkey}};
  RemoteRegion remote = server_->Describe(target);
  ASSERT_EQ(PostAndWait(client_, OneSided(Opcode::kWrite, 1, small, remote)), WcStatus::kSuccess);
  std::vector<Sge> sges = {{source.addr, uint32_t(kLength - 4096), source.lkey}};
  TestFaults(client_)->tear_next_write_after = kTorn;
  WorkRequest torn = OneSided(Opcode::kWrite, 2, sges, remote, 4096);
  ASSERT_TRUE(client_->Post(&torn, 1).ok());
  std::vector<Completion> got = PollN(client_, 1);
  if (!got.empty()) {
    EXPECT_NE(got[0].status, WcStatus::kSuccess);
  }
  Status state = WaitForFailure(server_);
  EXPECT_EQ(state.code(), Status::Code::kDisconnected) << state.ToString();
  EXPECT_TRUE(HasPattern(target.addr, 100, 31));
  EXPECT_TRUE(AllZero(target.addr + 100, 4096 - 100));
  EXPECT_TRUE(HasPattern(target.addr + 4096, kTorn, 31));
  EXPECT_TRUE(AllZero(target.addr + 4096 + kTorn, kLength - 4096 - kTorn));
}

// Backends that claim address-ordered placement (a checksum at a WRITE's end needs no WRITE
// of its own: replication's appends rely on it) never show a WRITE's last byte before the rest:
// a thread of the target watches blocks written once each into zeroed memory while they land.
TEST_P(ConformanceTest, AnOrderedWriteNeverShowsItsEndFirst) {
  ASSERT_TRUE(client_->places_in_address_order());
  constexpr size_t kBlocks = 400;
  constexpr size_t kBlock = (32 << 10) + 8;  // long enough to be watched while it lands
  LocalRegion target = Allocate(server_, kBlocks * kBlock, kRemoteWrite);
  LocalRegion source = Allocate(client_, kBlock, kLocalOnly);
  std::memset(source.addr, 0x5a, kBlock);
  RemoteRegion remote = server_->Describe(target);
  std::atomic<bool> torn{false};
  std::atomic<bool> stop{false};
  std::thread watcher([&] {
    const volatile char* bytes = target.addr;
    for (size_t b = 0; b < kBlocks && !stop;) {
      const volatile char* block = bytes + b * kBlock;
      if (block[kBlock - 1] == 0) continue;
      // The first byte at once (a copy that ran downwards stores it last), then the rest.
      if (block[0] != 0x5a) torn = true;
      for (size_t i = 1; i < kBlock - 1; i++) {
        if (block[i] != 0x5a) torn = true;
      }
      b++;
    }
  });
  std::vector<Sge> sges = {{source.addr, uint32_t(kBlock), source.lkey}};
  for (size_t b = 0; b < kBlocks; b++) {
    WorkRequest wr = OneSided(Opcode::kWrite, b, sges, remote, b * kBlock);
    if (PostAndWait(client_, wr) != WcStatus::kSuccess) break;
  }
  stop = true;
  watcher.join();
  EXPECT_FALSE(torn.load()) << "a block's last byte was visible before its other bytes";
}

TEST_P(ConformanceTest, DroppedWritePlacesNothing) {
  LocalRegion target = Allocate(server_, 65536, kRemoteWrite);
  LocalRegion source = Allocate(client_, 65536, kLocalOnly);
  FillPattern(source.addr, 65536, 4);
  std::vector<Sge> sges = {{source.addr, 65536, source.lkey}};
  TestFaults(client_)->drop_on_next_write = true;
  WorkRequest dropped = OneSided(Opcode::kWrite, 1, sges, server_->Describe(target));
  ASSERT_TRUE(client_->Post(&dropped, 1).ok());
  std::vector<Completion> got = PollN(client_, 1);
  if (!got.empty()) {
    EXPECT_EQ(got[0].status, WcStatus::kFlushed);
  }
  Status state = WaitForFailure(server_);
  EXPECT_EQ(state.code(), Status::Code::kDisconnected) << state.ToString();
  EXPECT_FALSE(client_->state().ok());
  EXPECT_TRUE(AllZero(target.addr, target.length));
}

TEST_P(ConformanceTest, CompletionDelayIsApplied) {
  LocalRegion target = Allocate(server_, 4096, kRemoteWrite);
  LocalRegion source = Allocate(client_, 4096, kLocalOnly);
  std::vector<Sge> sges = {{source.addr, 64, source.lkey}};
  TestFaults(client_)->completion_delay_us = 200000;
  auto start = Clock::now();
  ASSERT_EQ(PostAndWait(client_, OneSided(Opcode::kWrite, 1, sges, server_->Describe(target))),
            WcStatus::kSuccess);
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(195));
  TestFaults(client_)->completion_delay_us = 0;
  start = Clock::now();
  ASSERT_EQ(PostAndWait(client_, OneSided(Opcode::kWrite, 2, sges, server_->Describe(target))),
            WcStatus::kSuccess);
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(150));
}

// A child process connects, streams WRITEs into the parent's region and is SIGKILLed in the
// middle: the parent learns within its Poll timeout. The child is forked before this process
// starts any thread, so it may use the library freely.
TEST_P(ConformanceTest, PeerProcessDeathIsDetected) {
  pair_ = Pair{};  // this test needs no in-process pair (and no threads at fork time)
  TransportOptions options = OptionsFor(GetParam());
  std::unique_ptr<Listener> listener;
  ASSERT_TRUE(Listen(options, "127.0.0.1:0", &listener).ok());
  const std::string address = listener->address();
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    listener.reset();
    std::unique_ptr<Connection> connection;
    if (!Connect(options, address, &connection).ok()) _exit(2);
    LocalRegion inbox, source;
    if (!connection->AllocateRegion(64, kLocalOnly, &inbox).ok()) _exit(3);
    if (!connection->AllocateRegion(1 << 20, kLocalOnly, &source).ok()) _exit(3);
    FillPattern(source.addr, source.length, 55);
    RecvRequest recv{1, Sge{inbox.addr, 64, inbox.lkey}};
    connection->PostRecv(&recv, 1);
    std::vector<Completion> got = PollN(connection.get(), 1);
    if (got.size() != 1 || got[0].status != WcStatus::kSuccess) _exit(4);
    RemoteRegion remote;
    std::memcpy(&remote, inbox.addr, sizeof(remote));
    std::vector<Sge> sges = {{source.addr, 1 << 20, source.lkey}};
    for (uint64_t i = 0;; i++) {  // until killed
      WorkRequest wr = OneSided(Opcode::kWrite, i, sges, remote);
      if (connection->Post(&wr, 1).ok()) PollN(connection.get(), 1, 1000);
    }
  }
  std::unique_ptr<Connection> parent;
  Status s = listener->Accept(kTimeoutMs, &parent);
  if (!s.ok()) {
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    FAIL() << s.ToString();
  }
  LocalRegion target, outbox;
  ASSERT_TRUE(parent->AllocateRegion(1 << 20, kRemoteWrite, &target).ok());
  ASSERT_TRUE(parent->AllocateRegion(64, kLocalOnly, &outbox).ok());
  RemoteRegion remote = parent->Describe(target);
  std::memcpy(outbox.addr, &remote, sizeof(remote));
  std::vector<Sge> sges = {{outbox.addr, uint32_t(sizeof(remote)), outbox.lkey}};
  WorkRequest send;
  send.opcode = Opcode::kSend;
  send.sg_list = sges.data();
  send.num_sge = 1;
  EXPECT_EQ(PostAndWait(parent.get(), send), WcStatus::kSuccess);
  // Wait until the stream is flowing (a whole WRITE has been placed: its tail is there).
  constexpr size_t kTail = (1 << 20) - 64;
  std::vector<char> tail(64);
  for (size_t i = 0; i < tail.size(); i++) tail[i] = PatternByte(55, kTail + i);
  Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(kTimeoutMs);
  bool flowing = false;
  while (!flowing && Clock::now() < deadline) {
    flowing = std::memcmp(target.addr + kTail, tail.data(), tail.size()) == 0;
    if (!flowing) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(flowing) << "the child never wrote";
  ::kill(child, SIGKILL);
  int wstatus = 0;
  ::waitpid(child, &wstatus, 0);
  EXPECT_TRUE(WIFSIGNALED(wstatus));
  // Poll reports the failure within its timeout.
  auto start = Clock::now();
  Status polled;
  while (parent->state().ok() && Clock::now() - start < std::chrono::seconds(5)) {
    Completion wc[4];
    size_t n = 0;
    polled = parent->Poll(wc, 4, 500, &n);
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(parent->state().code(), Status::Code::kDisconnected) << parent->state().ToString();
  Completion wc[4];
  size_t n = 0;
  start = Clock::now();
  polled = parent->Poll(wc, 4, 500, &n);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(1));
  EXPECT_FALSE(polled.ok() && n == 0 && parent->state().ok());
}

INSTANTIATE_TEST_SUITE_P(Backends, ConformanceTest, ::testing::Values("tcp", "shm"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// The tcp backend's agent drops a peer that sends malformed frames, without touching memory.
class TcpMalformedFrameTest : public ::testing::Test {
 protected:
  // Connects a raw authenticated socket to a tcp listener and accepts the connection.
  void SetUp() override {
    TransportOptions options = OptionsFor("tcp");
    std::unique_ptr<Listener> listener;
    ASSERT_TRUE(Listen(options, "127.0.0.1:0", &listener).ok());
    auto accepted =
        std::async(std::launch::async, [&] { return listener->Accept(kTimeoutMs, &server_); });
    ASSERT_TRUE(SetupConnect(listener->address(), kTimeoutMs, &raw_).ok());
    std::string backend = "tcp";
    ASSERT_TRUE(Authenticate(raw_, kSecret, /*is_server=*/false, &backend, kTimeoutMs).ok());
    ASSERT_TRUE(accepted.get().ok());
    ASSERT_TRUE(server_->AllocateRegion(4096, kRemoteWrite | kRemoteRead, &region_).ok());
  }

  // Closes the raw socket.
  void TearDown() override {
    if (raw_ >= 0) ::close(raw_);
  }

  // Sends a frame header and `payload`.
  void SendFrame(const TcpFrameHeader& header, const std::string& payload = {}) {
    ASSERT_EQ(::send(raw_, &header, sizeof(header), MSG_NOSIGNAL), ssize_t(sizeof(header)));
    if (!payload.empty()) {
      ASSERT_EQ(::send(raw_, payload.data(), payload.size(), MSG_NOSIGNAL),
                ssize_t(payload.size()));
    }
  }

  // A well-formed WRITE of `length` bytes at the region's start.
  TcpFrameHeader Write(uint64_t sequence, uint64_t length) {
    TcpFrameHeader header;
    header.type = uint8_t(TcpFrameType::kWrite);
    header.sequence = sequence;
    header.rkey = region_.rkey;
    header.remote_addr = reinterpret_cast<uintptr_t>(region_.addr);
    header.length = length;
    return header;
  }

  std::unique_ptr<Connection> server_;
  LocalRegion region_;
  int raw_ = -1;
};

TEST_F(TcpMalformedFrameTest, WellFormedWriteIsPlacedAndAcknowledged) {
  SendFrame(Write(0, 4), "abcd");
  TcpFrameHeader ack;
  ASSERT_EQ(::recv(raw_, &ack, sizeof(ack), MSG_WAITALL), ssize_t(sizeof(ack)));
  EXPECT_EQ(ack.type, uint8_t(TcpFrameType::kAck));
  EXPECT_EQ(ack.sequence, 0u);
  EXPECT_EQ(std::memcmp(region_.addr, "abcd", 4), 0);
}

TEST_F(TcpMalformedFrameTest, UnknownTypeDropsTheConnection) {
  TcpFrameHeader header = Write(0, 4);
  header.type = 99;
  SendFrame(header, "abcd");
  Status state = WaitForFailure(server_.get());
  EXPECT_TRUE(state.code() == Status::Code::kIOError || state.code() == Status::Code::kDisconnected)
      << state.ToString();
  EXPECT_TRUE(AllZero(region_.addr, region_.length));
}

TEST_F(TcpMalformedFrameTest, ImpossibleLengthDropsTheConnection) {
  SendFrame(Write(0, uint64_t(1) << 40), "abcd");
  Status state = WaitForFailure(server_.get());
  EXPECT_TRUE(state.code() == Status::Code::kIOError || state.code() == Status::Code::kDisconnected)
      << state.ToString();
  EXPECT_TRUE(AllZero(region_.addr, region_.length));
}

TEST_F(TcpMalformedFrameTest, BadMagicOrSequenceDropsTheConnection) {
  TcpFrameHeader header = Write(5, 4);  // the first request must carry sequence 0
  SendFrame(header, "abcd");
  Status state = WaitForFailure(server_.get());
  EXPECT_FALSE(state.ok());
  EXPECT_TRUE(AllZero(region_.addr, region_.length));
}

TEST_F(TcpMalformedFrameTest, UnsolicitedResponseDropsTheConnection) {
  TcpFrameHeader ack;
  ack.type = uint8_t(TcpFrameType::kAck);
  SendFrame(ack);
  Status state = WaitForFailure(server_.get());
  EXPECT_EQ(state.code(), Status::Code::kIOError) << state.ToString();
}

}  // namespace
}  // namespace slipstream::rdma
