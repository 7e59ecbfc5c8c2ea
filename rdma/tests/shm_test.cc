// Tests of what is particular to the shm backend (the conformance suite covers the shared
// semantics): placement order seen by a target whose initiator is SIGKILLed mid-WRITE, a
// stopped target that still serves WRITE and READ, the receive ring under wrap-around and when
// full, malformed heap descriptions, and fresh keys for re-allocated regions.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <future>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "setup.h"
#include "shm_transport.h"
#include "slipstream/rdma/shm_peer.h"
#include "slipstream/rdma/transport.h"
#include "test_util.h"

namespace slipstream::rdma {
namespace {

using Clock = std::chrono::steady_clock;
using namespace test;  // NOLINT: the shared helpers (test_util.h)
constexpr char kSecret[] = "shm-test-secret";

// Options for the shm backend with the test secret.
TransportOptions ShmOptions() {
  TransportOptions options;
  options.backend = "shm";
  options.secret = kSecret;
  options.connect_timeout_ms = kTimeoutMs;
  options.region_capacity = 64u << 20;
  return options;
}

// Connects a shm pair (the shared MakePair with the shm test options by default).
Pair MakePair(const TransportOptions& options = ShmOptions()) {
  return test::MakePair(options);
}

// A WRITE, READ or WRITE_WITH_IMM of `sges` at `remote` + `offset`.
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

// A SEND of `sges`.
WorkRequest SendOf(uint64_t wr_id, const std::vector<Sge>& sges) {
  WorkRequest wr;
  wr.wr_id = wr_id;
  wr.opcode = Opcode::kSend;
  wr.sg_list = sges.data();
  wr.num_sge = static_cast<uint32_t>(sges.size());
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
  return done[0].status;
}

// ---------------------------------------------------------------------------------------------
// Two real processes: the child is the initiator and streams generations of a pattern into the
// parent's region; the parent SIGKILLs it at a random moment.

constexpr size_t kStreamBytes = 1 << 20;
constexpr size_t kStreamWords = kStreamBytes / 8;

// Word `index` of generation `generation` (generation 0 is the zeroed region).
uint64_t StreamWord(uint64_t generation, size_t index) {
  return generation == 0 ? 0 : (generation << 32) | index;
}

// Byte `index` of generation `generation`.
char StreamByte(uint64_t generation, size_t index) {
  uint64_t word = StreamWord(generation, index / 8);
  char bytes[8];
  std::memcpy(bytes, &word, 8);
  return bytes[index % 8];
}

// True when the region is a prefix of generation `newer` followed by generation newer-1 (the
// only states a WRITE in increasing address order can leave); *torn says whether the boundary
// lies strictly inside (the region is neither wholly one generation nor the other).
bool IsAscendingPrefix(const char* data, uint64_t newer, bool* torn) {
  if (newer == 0) return false;
  size_t boundary = 0;
  while (boundary < kStreamBytes && data[boundary] == StreamByte(newer, boundary)) boundary++;
  bool all_older = true;
  for (size_t i = 0; i < kStreamBytes; i++) {
    bool older = data[i] == StreamByte(newer - 1, i);
    if (i >= boundary && !older) return false;
    all_older = all_older && older;
  }
  *torn = boundary < kStreamBytes && !all_older;
  return true;
}

// The generation in the top half of a word.
uint64_t GenerationOf(uint64_t word) {
  return word >> 32;
}

// Reads the region from its last word to its first while the child writes. A writer moving
// upwards through addresses, generation after generation, can then only be seen with
// generations that never increase towards higher addresses; every word is whole (placement
// uses aligned stores of at least 8 bytes) and carries its own index.
::testing::AssertionResult DescendingSnapshotIsMonotonic(const char* region) {
  uint64_t previous_generation = 0;
  for (size_t w = kStreamWords; w-- > 0;) {
    uint64_t word =
        std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(const_cast<char*>(region) + w * 8))
            .load(std::memory_order_acquire);
    if (word != 0 && (word & 0xffffffffu) != w) {
      return ::testing::AssertionFailure() << "word " << w << " is torn: " << word;
    }
    uint64_t generation = GenerationOf(word);
    if (w + 1 < kStreamWords && generation < previous_generation) {
      return ::testing::AssertionFailure()
             << "word " << w << " has generation " << generation << " below word " << w + 1 << "'s "
             << previous_generation;
    }
    previous_generation = generation;
  }
  return ::testing::AssertionSuccess();
}

// The child: connects, learns the parent's region from a SEND, then writes generation after
// generation of the stream pattern over the whole region until it is killed.
[[noreturn]] void StreamWriterChild(const std::string& address) {
  std::unique_ptr<Connection> connection;
  if (!Connect(ShmOptions(), address, &connection).ok()) _exit(2);
  LocalRegion inbox, source;
  if (!connection->AllocateRegion(64, kLocalOnly, &inbox).ok()) _exit(3);
  if (!connection->AllocateRegion(kStreamBytes, kLocalOnly, &source).ok()) _exit(3);
  RecvRequest recv{1, Sge{inbox.addr, 64, inbox.lkey}};
  connection->PostRecv(&recv, 1);
  std::vector<Completion> got = PollN(connection.get(), 1);
  if (got.size() != 1 || got[0].status != WcStatus::kSuccess) _exit(4);
  RemoteRegion remote;
  std::memcpy(&remote, inbox.addr, sizeof(remote));
  std::vector<Sge> sges = {{source.addr, uint32_t(kStreamBytes), source.lkey}};
  uint64_t* words = reinterpret_cast<uint64_t*>(source.addr);
  for (uint64_t generation = 1;; generation++) {
    for (size_t w = 0; w < kStreamWords; w++) words[w] = StreamWord(generation, w);
    WorkRequest wr = OneSided(Opcode::kWrite, generation, sges, remote);
    if (!connection->Post(&wr, 1).ok()) _exit(5);
    got = PollN(connection.get(), 1);
    if (got.size() != 1 || got[0].status != WcStatus::kSuccess) _exit(6);
  }
}

TEST(ShmProcessTest, KilledWriterLeavesAnAscendingPrefix) {
  constexpr int kTrials = 60;
  std::random_device device;
  const uint32_t seed = device();
  std::mt19937 random(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  int torn_trials = 0;
  for (int trial = 0; trial < kTrials; trial++) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    std::unique_ptr<Listener> listener;
    ASSERT_TRUE(Listen(ShmOptions(), "127.0.0.1:0", &listener).ok());
    const std::string address = listener->address();
    // No thread runs here at fork time (shm connections have none), so the child may use the
    // library freely.
    pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      listener.reset();
      StreamWriterChild(address);
    }
    std::unique_ptr<Connection> parent;
    Status s = listener->Accept(kTimeoutMs, &parent);
    if (!s.ok()) {
      ::kill(child, SIGKILL);
      ::waitpid(child, nullptr, 0);
      FAIL() << s.ToString();
    }
    LocalRegion target, outbox;
    ASSERT_TRUE(parent->AllocateRegion(kStreamBytes, kRemoteWrite, &target).ok());
    ASSERT_TRUE(parent->AllocateRegion(64, kLocalOnly, &outbox).ok());
    RemoteRegion remote = parent->Describe(target);
    std::memcpy(outbox.addr, &remote, sizeof(remote));
    std::vector<Sge> sges = {{outbox.addr, uint32_t(sizeof(remote)), outbox.lkey}};
    ASSERT_EQ(PostAndWait(parent.get(), SendOf(0, sges)), WcStatus::kSuccess);
    // Wait until the second generation has started (so the region holds real data below it),
    // look at the region while it changes a few times, then kill at a random moment.
    uint64_t* first_word = reinterpret_cast<uint64_t*>(target.addr);
    Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(kTimeoutMs);
    while (GenerationOf(std::atomic_ref<uint64_t>(*first_word).load()) < 2 &&
           Clock::now() < deadline) {
      std::this_thread::yield();
    }
    ASSERT_GE(GenerationOf(std::atomic_ref<uint64_t>(*first_word).load()), 2u)
        << "the child never wrote";
    int snapshots = static_cast<int>(random() % 3);
    for (int i = 0; i < snapshots; i++) {
      EXPECT_TRUE(DescendingSnapshotIsMonotonic(target.addr));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(random() % 1500));
    ::kill(child, SIGKILL);
    int wstatus = 0;
    ::waitpid(child, &wstatus, 0);
    ASSERT_TRUE(WIFSIGNALED(wstatus)) << "the child exited early with " << wstatus;
    // The child is dead: what the region holds now is final.
    const uint64_t newest = GenerationOf(*first_word);
    bool torn = false;
    bool valid = IsAscendingPrefix(target.addr, newest, &torn) ||
                 IsAscendingPrefix(target.addr, newest + 1, &torn);
    ASSERT_TRUE(valid) << "placed bytes are not a prefix in increasing address order";
    if (torn) torn_trials++;
    // And the target learns that its peer is gone.
    Clock::time_point start = Clock::now();
    while (parent->state().ok() && Clock::now() - start < std::chrono::seconds(2)) {
      Completion wc[4];
      size_t n = 0;
      parent->Poll(wc, 4, 100, &n);
    }
    EXPECT_EQ(parent->state().code(), Status::Code::kDisconnected);
  }
  // The check above means something only if some kills landed in the middle of a WRITE.
  EXPECT_GE(torn_trials, 1) << "no kill landed inside a WRITE in " << kTrials << " trials";
  std::printf("[          ] %d of %d kills landed inside a WRITE\n", torn_trials, kTrials);
}

// A child process that owns a remote region: it connects over shm, registers `length` bytes
// with `access`, sends the region's description and waits to be killed, never touching the
// connection again. Returns its pid with the parent's connection and the description; -1 (the
// child killed) when the setup did not complete, with the reason in *why.
pid_t ForkRegionOwner(size_t length, uint32_t access, std::unique_ptr<Connection>* parent,
                      RemoteRegion* remote, std::string* why) {
  std::unique_ptr<Listener> listener;
  Status s = Listen(ShmOptions(), "127.0.0.1:0", &listener);
  if (!s.ok()) {
    *why = s.ToString();
    return -1;
  }
  const std::string address = listener->address();
  pid_t child = ::fork();
  if (child < 0) {
    *why = "fork failed";
    return -1;
  }
  if (child == 0) {
    listener.reset();
    std::unique_ptr<Connection> connection;
    if (!Connect(ShmOptions(), address, &connection).ok()) _exit(2);
    LocalRegion region, outbox;
    if (!connection->AllocateRegion(length, access, &region).ok()) _exit(3);
    if (!connection->AllocateRegion(64, kLocalOnly, &outbox).ok()) _exit(3);
    RemoteRegion described = connection->Describe(region);
    std::memcpy(outbox.addr, &described, sizeof(described));
    std::vector<Sge> sges = {{outbox.addr, uint32_t(sizeof(described)), outbox.lkey}};
    if (PostAndWait(connection.get(), SendOf(1, sges)) != WcStatus::kSuccess) _exit(4);
    for (;;) ::pause();
  }
  LocalRegion inbox;
  s = listener->Accept(kTimeoutMs, parent);
  if (s.ok()) s = (*parent)->AllocateRegion(64, kLocalOnly, &inbox);
  RecvRequest recv{1, Sge{inbox.addr, 64, inbox.lkey}};
  if (s.ok()) s = (*parent)->PostRecv(&recv, 1);
  if (s.ok() && PollN(parent->get(), 1).size() != 1) s = Status::Timeout("no description came");
  if (!s.ok()) {
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    *why = s.ToString();
    return -1;
  }
  std::memcpy(remote, inbox.addr, sizeof(*remote));
  return child;
}

// The target process is stopped (SIGSTOP) and still serves WRITE and READ: the initiator does
// all the work.
TEST(ShmProcessTest, StoppedTargetStillServesWriteAndRead) {
  std::unique_ptr<Connection> parent;
  RemoteRegion remote;
  std::string why;
  pid_t child = ForkRegionOwner(1 << 16, kRemoteWrite | kRemoteRead, &parent, &remote, &why);
  ASSERT_GT(child, 0) << why;
  LocalRegion source, back;
  ASSERT_TRUE(parent->AllocateRegion(1 << 16, kLocalOnly, &source).ok());
  ASSERT_TRUE(parent->AllocateRegion(1 << 16, kLocalOnly, &back).ok());
  ::kill(child, SIGSTOP);
  int wstatus = 0;
  ASSERT_EQ(::waitpid(child, &wstatus, WUNTRACED), child);
  ASSERT_TRUE(WIFSTOPPED(wstatus));
  FillPattern(source.addr, source.length, 17);
  std::vector<Sge> out = {{source.addr, uint32_t(source.length), source.lkey}};
  std::vector<Sge> in = {{back.addr, uint32_t(back.length), back.lkey}};
  EXPECT_EQ(PostAndWait(parent.get(), OneSided(Opcode::kWrite, 2, out, remote)),
            WcStatus::kSuccess);
  EXPECT_EQ(PostAndWait(parent.get(), OneSided(Opcode::kRead, 3, in, remote)), WcStatus::kSuccess);
  EXPECT_TRUE(HasPattern(back.addr, back.length, 17));
  EXPECT_TRUE(parent->state().ok());
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
}

// A ShmPeerWriter (another process of the host writing into a connection's peer) must refuse
// a peer killed without revoking anything: its heap lives on in the writer's mapping and its
// keys stay valid, yet nobody holds those bytes any more.
TEST(ShmProcessTest, APeerWriterRefusesAPeerWhoseProcessExited) {
  std::unique_ptr<Connection> parent;
  RemoteRegion remote;
  std::string why;
  pid_t child = ForkRegionOwner(4096, kRemoteWrite, &parent, &remote, &why);
  ASSERT_GT(child, 0) << why;
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

// ---------------------------------------------------------------------------------------------
// The receive ring.

// Ring bytes one SEND of `length` bytes takes.
uint64_t SendRecordBytes(uint64_t length) {
  return kShmRecordHeaderBytes +
         (length + kShmRecordHeaderBytes - 1) / kShmRecordHeaderBytes * kShmRecordHeaderBytes;
}

TEST(ShmRingTest, FullRingIsWouldBlockAndPostsNothing) {
  Pair pair = MakePair();
  ASSERT_NE(pair.server, nullptr);
  constexpr uint32_t kMessage = 4080;  // a 4096-byte record
  const uint64_t fits = kShmRingBytes / SendRecordBytes(kMessage);
  LocalRegion outbox, inbox, target;
  ASSERT_TRUE(pair.client->AllocateRegion(kMessage * 2, kLocalOnly, &outbox).ok());
  ASSERT_TRUE(pair.server->AllocateRegion(kMessage * (fits + 1), kLocalOnly, &inbox).ok());
  ASSERT_TRUE(pair.server->AllocateRegion(4096, kRemoteWrite, &target).ok());
  // Nobody receives: SENDs land in the ring until it is full.
  for (uint64_t i = 0; i < fits; i++) {
    FillPattern(outbox.addr, kMessage, uint32_t(i));
    std::vector<Sge> sges = {{outbox.addr, kMessage, outbox.lkey}};
    ASSERT_EQ(PostAndWait(pair.client.get(), SendOf(i, sges)), WcStatus::kSuccess) << i;
  }
  std::vector<Sge> sges = {{outbox.addr, kMessage, outbox.lkey}};
  WorkRequest one_more = SendOf(fits, sges);
  EXPECT_EQ(pair.client->Post(&one_more, 1).code(), Status::Code::kWouldBlock);
  // Even a WRITE with immediate (a bare 16-byte record) finds no room.
  std::vector<Sge> imm_sges = {{outbox.addr, 16, outbox.lkey}};
  WorkRequest imm = OneSided(Opcode::kWriteWithImm, 99, imm_sges, pair.server->Describe(target));
  EXPECT_EQ(pair.client->Post(&imm, 1).code(), Status::Code::kWouldBlock);
  // A list whose SEND cannot fit posts nothing, not even the WRITE before it.
  FillPattern(outbox.addr + kMessage, 64, 500);
  std::vector<Sge> write_sges = {{outbox.addr + kMessage, 64, outbox.lkey}};
  WorkRequest both[2] = {OneSided(Opcode::kWrite, 100, write_sges, pair.server->Describe(target)),
                         one_more};
  EXPECT_EQ(pair.client->Post(both, 2).code(), Status::Code::kWouldBlock);
  EXPECT_TRUE(AllZero(target.addr, target.length));
  EXPECT_TRUE(PollN(pair.client.get(), 1, 50).empty());
  EXPECT_TRUE(pair.client->state().ok());
  // One receive frees one record's room, and no more.
  RecvRequest first{0, Sge{inbox.addr, kMessage, inbox.lkey}};
  ASSERT_TRUE(pair.server->PostRecv(&first, 1).ok());
  std::vector<Completion> got = PollN(pair.server.get(), 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].byte_len, kMessage);
  EXPECT_TRUE(HasPattern(inbox.addr, kMessage, 0));
  FillPattern(outbox.addr, kMessage, uint32_t(fits));
  ASSERT_EQ(PostAndWait(pair.client.get(), SendOf(fits, sges)), WcStatus::kSuccess);
  EXPECT_EQ(pair.client->Post(&one_more, 1).code(), Status::Code::kWouldBlock);
  // Drain everything; each message arrives whole and in order.
  std::vector<RecvRequest> recvs;
  for (uint64_t i = 1; i <= fits; i++) {
    recvs.push_back(RecvRequest{i, Sge{inbox.addr + i * kMessage, kMessage, inbox.lkey}});
  }
  ASSERT_TRUE(pair.server->PostRecv(recvs.data(), recvs.size()).ok());
  got = PollN(pair.server.get(), fits);
  ASSERT_EQ(got.size(), fits);
  for (uint64_t i = 1; i <= fits; i++) {
    EXPECT_EQ(got[i - 1].wr_id, i);
    EXPECT_EQ(got[i - 1].status, WcStatus::kSuccess);
    EXPECT_TRUE(HasPattern(inbox.addr + i * kMessage, kMessage, uint32_t(i))) << i;
  }
  EXPECT_TRUE(pair.client->state().ok());
  EXPECT_TRUE(pair.server->state().ok());
}

TEST(ShmRingTest, RecordsSurviveManyWrapArounds) {
  Pair pair = MakePair();
  ASSERT_NE(pair.server, nullptr);
  constexpr uint32_t kMessages = 3000;
  constexpr uint32_t kSlots = 512;  // receives outstanding at most (more than the ring holds)
  constexpr uint32_t kSlotBytes = 9024;
  LocalRegion outbox, inbox, target;
  ASSERT_TRUE(pair.client->AllocateRegion(kSlotBytes, kLocalOnly, &outbox).ok());
  ASSERT_TRUE(pair.server->AllocateRegion(uint64_t(kSlots) * kSlotBytes, kLocalOnly, &inbox).ok());
  ASSERT_TRUE(pair.server->AllocateRegion(kSlotBytes, kRemoteWrite, &target).ok());
  RemoteRegion remote = pair.server->Describe(target);
  std::mt19937 random(12345);
  std::vector<uint32_t> sizes(kMessages);
  for (uint32_t& size : sizes) size = random() % kSlotBytes + 1;  // odd sizes straddle the end
  std::deque<uint32_t> in_ring;                                   // sent, not yet received
  uint32_t next_send = 0, next_recv_post = 0, received = 0;
  uint64_t ring_bytes_sent = 0;
  bool saw_full = false;
  Clock::time_point deadline = Clock::now() + std::chrono::seconds(60);
  while (received < kMessages && Clock::now() < deadline) {
    if (next_send < kMessages && in_ring.size() < kSlots) {
      // Every fifth message is a WRITE with immediate: a bare record carrying imm.
      const bool with_imm = next_send % 5 == 4;
      FillPattern(outbox.addr, sizes[next_send], next_send);
      std::vector<Sge> sges = {{outbox.addr, sizes[next_send], outbox.lkey}};
      WorkRequest wr = with_imm ? OneSided(Opcode::kWriteWithImm, next_send, sges, remote)
                                : SendOf(next_send, sges);
      wr.imm = next_send * 7;
      Status s = pair.client->Post(&wr, 1);
      if (s.ok()) {
        std::vector<Completion> done = PollN(pair.client.get(), 1);
        ASSERT_EQ(done.size(), 1u);
        ASSERT_EQ(done[0].status, WcStatus::kSuccess);
        ring_bytes_sent += with_imm ? kShmRecordHeaderBytes : SendRecordBytes(sizes[next_send]);
        if (with_imm) {
          ASSERT_TRUE(HasPattern(target.addr, sizes[next_send], next_send));
        }
        in_ring.push_back(next_send++);
        continue;
      }
      ASSERT_EQ(s.code(), Status::Code::kWouldBlock) << s.ToString();
      saw_full = true;
    }
    // Receive: post receives for what is in the ring, then take some completions.
    while (next_recv_post < next_send) {
      RecvRequest recv{
          next_recv_post,
          Sge{inbox.addr + uint64_t(next_recv_post % kSlots) * kSlotBytes, kSlotBytes, inbox.lkey}};
      ASSERT_TRUE(pair.server->PostRecv(&recv, 1).ok());
      next_recv_post++;
    }
    size_t take = std::min<size_t>(in_ring.size(), 1 + random() % 64);
    std::vector<Completion> got = PollN(pair.server.get(), take);
    ASSERT_EQ(got.size(), take);
    for (const Completion& c : got) {
      uint32_t id = in_ring.front();
      in_ring.pop_front();
      ASSERT_EQ(c.wr_id, id);
      ASSERT_EQ(c.status, WcStatus::kSuccess);
      ASSERT_EQ(c.byte_len, sizes[id]);
      if (id % 5 == 4) {
        ASSERT_TRUE(c.has_imm);
        ASSERT_EQ(c.imm, id * 7);
      } else {
        ASSERT_FALSE(c.has_imm);
        ASSERT_TRUE(HasPattern(inbox.addr + uint64_t(id % kSlots) * kSlotBytes, sizes[id], id))
            << "message " << id;
      }
      received++;
    }
  }
  EXPECT_EQ(received, kMessages);
  EXPECT_GT(ring_bytes_sent, 4 * kShmRingBytes) << "the ring did not wrap several times";
  EXPECT_TRUE(saw_full) << "the ring never filled up";
}

TEST(ShmRingTest, LargestSendFillsTheWholeRing) {
  Pair pair = MakePair();
  ASSERT_NE(pair.server, nullptr);
  LocalRegion outbox, inbox;
  ASSERT_TRUE(pair.client->AllocateRegion(kShmRingBytes, kLocalOnly, &outbox).ok());
  ASSERT_TRUE(pair.server->AllocateRegion(kShmRingBytes, kLocalOnly, &inbox).ok());
  // Offset the ring first, so the big record wraps.
  std::vector<Sge> small = {{outbox.addr, 100, outbox.lkey}};
  ASSERT_EQ(PostAndWait(pair.client.get(), SendOf(1, small)), WcStatus::kSuccess);
  RecvRequest recv{1, Sge{inbox.addr, 100, inbox.lkey}};
  ASSERT_TRUE(pair.server->PostRecv(&recv, 1).ok());
  ASSERT_EQ(PollN(pair.server.get(), 1).size(), 1u);
  FillPattern(outbox.addr, kShmMaxSendBytes, 3);
  std::vector<Sge> too_big = {{outbox.addr, uint32_t(kShmMaxSendBytes + 1), outbox.lkey}};
  WorkRequest refused = SendOf(2, too_big);
  EXPECT_EQ(pair.client->Post(&refused, 1).code(), Status::Code::kInvalidArgument);
  std::vector<Sge> largest = {{outbox.addr, uint32_t(kShmMaxSendBytes), outbox.lkey}};
  ASSERT_EQ(PostAndWait(pair.client.get(), SendOf(3, largest)), WcStatus::kSuccess);
  recv = RecvRequest{3, Sge{inbox.addr, uint32_t(kShmRingBytes), inbox.lkey}};
  ASSERT_TRUE(pair.server->PostRecv(&recv, 1).ok());
  std::vector<Completion> got = PollN(pair.server.get(), 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].byte_len, kShmMaxSendBytes);
  EXPECT_TRUE(HasPattern(inbox.addr, kShmMaxSendBytes, 3));
}

TEST(ShmRingTest, SleepingPollerIsWokenBySend) {
  Pair pair = MakePair();
  ASSERT_NE(pair.server, nullptr);
  LocalRegion outbox, inbox;
  ASSERT_TRUE(pair.client->AllocateRegion(64, kLocalOnly, &outbox).ok());
  ASSERT_TRUE(pair.server->AllocateRegion(64, kLocalOnly, &inbox).ok());
  RecvRequest recv{5, Sge{inbox.addr, 64, inbox.lkey}};
  ASSERT_TRUE(pair.server->PostRecv(&recv, 1).ok());
  Clock::time_point start = Clock::now();
  auto polled = std::async(std::launch::async, [&] { return PollN(pair.server.get(), 1, 3000); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::vector<Sge> sges = {{outbox.addr, 8, outbox.lkey}};
  ASSERT_EQ(PostAndWait(pair.client.get(), SendOf(1, sges)), WcStatus::kSuccess);
  std::vector<Completion> got = polled.get();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].wr_id, 5u);
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(1000));
}

// ---------------------------------------------------------------------------------------------
// Malformed heap descriptions.

// A raw peer that authenticates for "shm" and then says whatever the test wants.
class ShmMalformedPeerTest : public ::testing::Test {
 protected:
  // Starts a listener whose Accept runs in the background for the whole test.
  void SetUp() override {
    ASSERT_TRUE(Listen(ShmOptions(), "127.0.0.1:0", &listener_).ok());
    accepted_ =
        std::async(std::launch::async, [this] { return listener_->Accept(20000, &server_); });
  }

  // Makes sure the background Accept has finished (a good peer connects if none did).
  void TearDown() override {
    if (accepted_.valid()) {
      std::unique_ptr<Connection> client;
      Connect(ShmOptions(), listener_->address(), &client);
      accepted_.get();
    }
  }

  // Connects and authenticates a raw socket, and reads the listener's heap description.
  int RawPeer(ShmHeapDescription* listener_heap) {
    int fd = -1;
    EXPECT_TRUE(SetupConnect(listener_->address(), kTimeoutMs, &fd).ok());
    std::string backend = "shm";
    EXPECT_TRUE(Authenticate(fd, kSecret, /*is_server=*/false, &backend, kTimeoutMs).ok());
    uint32_t type = 0;
    std::string payload;
    EXPECT_TRUE(RecvSetupMessage(fd, kTimeoutMs, &type, &payload).ok());
    EXPECT_EQ(type, kShmHeapMessage);
    EXPECT_EQ(payload.size(), sizeof(ShmHeapDescription));
    if (payload.size() == sizeof(ShmHeapDescription)) {
      std::memcpy(listener_heap, payload.data(), sizeof(*listener_heap));
    }
    return fd;
  }

  // Sends `payload` as message `type` and expects the listener to hang up without a ready.
  void ExpectDropped(uint32_t type, const std::string& payload, const char* what) {
    SCOPED_TRACE(what);
    ShmHeapDescription listener_heap{};
    int fd = RawPeer(&listener_heap);
    ASSERT_TRUE(SendSetupMessage(fd, type, payload).ok());
    uint32_t reply = 0;
    std::string body;
    Status s = RecvSetupMessage(fd, kTimeoutMs, &reply, &body);
    EXPECT_EQ(s.code(), Status::Code::kDisconnected) << s.ToString() << " reply " << reply;
    ::close(fd);
    EXPECT_EQ(accepted_.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout)
        << "Accept gave up instead of dropping the peer";
  }

  // A description that would pass every check if the numbers were true.
  static ShmHeapDescription Plausible() {
    ShmHeapDescription d{};
    d.magic = kShmHeapMagic;
    d.version = kShmVersion;
    d.pid = static_cast<int32_t>(::getpid());
    d.memfd = 0;
    d.table_entries = kShmTableEntries;
    d.region_space = 1 << 20;
    d.heap_size = kShmRegionOffset + d.region_space;
    d.ring_bytes = kShmRingBytes;
    return d;
  }

  // The bytes of a description.
  static std::string Bytes(const ShmHeapDescription& d) {
    return std::string(reinterpret_cast<const char*>(&d), sizeof(d));
  }

  std::unique_ptr<Listener> listener_;
  std::unique_ptr<Connection> server_;
  std::future<Status> accepted_;
};

TEST_F(ShmMalformedPeerTest, MalformedDescriptionsAreDroppedAndAcceptGoesOn) {
  ShmHeapDescription d = Plausible();
  ExpectDropped(kShmReadyMessage, Bytes(d), "wrong message type");
  ExpectDropped(kShmHeapMessage, Bytes(d).substr(0, 40), "short description");
  ExpectDropped(kShmHeapMessage, Bytes(d) + "x", "long description");
  d.magic ^= 1;
  ExpectDropped(kShmHeapMessage, Bytes(d), "bad magic");
  d = Plausible();
  d.version = kShmVersion + 1;
  ExpectDropped(kShmHeapMessage, Bytes(d), "other version");
  d = Plausible();
  d.table_entries = 7;
  ExpectDropped(kShmHeapMessage, Bytes(d), "other table size");
  d = Plausible();
  d.heap_size = ~uint64_t(0);
  ExpectDropped(kShmHeapMessage, Bytes(d), "heap size that does not add up");
  d = Plausible();
  d.region_space = uint64_t(1) << 62;
  d.heap_size = kShmRegionOffset + d.region_space;
  ExpectDropped(kShmHeapMessage, Bytes(d), "absurd region space");
  d = Plausible();
  d.pid = -1;
  ExpectDropped(kShmHeapMessage, Bytes(d), "no process");
  d = Plausible();
  d.memfd = 1 << 20;  // no such descriptor
  ExpectDropped(kShmHeapMessage, Bytes(d), "no such descriptor");
  // A real, writable file of this process that is not a sealed heap of the declared size.
  int memfd = ::memfd_create("not-a-heap", MFD_CLOEXEC);
  ASSERT_GE(memfd, 0);
  ASSERT_EQ(::ftruncate(memfd, static_cast<off_t>(Plausible().heap_size)), 0);
  d = Plausible();
  d.memfd = memfd;
  ExpectDropped(kShmHeapMessage, Bytes(d), "unsealed file");
  ::close(memfd);
  // A sealed file of the right size whose contents are not a heap header.
  memfd = ::memfd_create("fake-heap", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(memfd, 0);
  ASSERT_EQ(::ftruncate(memfd, static_cast<off_t>(Plausible().heap_size)), 0);
  ASSERT_EQ(::fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  d.memfd = memfd;
  ExpectDropped(kShmHeapMessage, Bytes(d), "sealed file without a heap header");
  ::close(memfd);
  // After all that, a well-behaved peer still gets through the same Accept.
  std::unique_ptr<Connection> client;
  Status s = Connect(ShmOptions(), listener_->address(), &client);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(accepted_.get().ok());
  ASSERT_NE(server_, nullptr);
  EXPECT_EQ(server_->backend(), "shm");
}

// ---------------------------------------------------------------------------------------------
// Keys.

TEST(ShmKeysTest, ReallocatedRegionsGetNewKeysAndOldKeysFail) {
  Pair pair = MakePair();
  ASSERT_NE(pair.server, nullptr);
  LocalRegion source;
  ASSERT_TRUE(pair.client->AllocateRegion(4096, kLocalOnly, &source).ok());
  FillPattern(source.addr, 4096, 9);
  std::vector<Sge> sges = {{source.addr, 4096, source.lkey}};
  LocalRegion first;
  ASSERT_TRUE(pair.server->AllocateRegion(4096, kRemoteWrite, &first).ok());
  RemoteRegion old_remote = pair.server->Describe(first);
  ASSERT_EQ(PostAndWait(pair.client.get(), OneSided(Opcode::kWrite, 1, sges, old_remote)),
            WcStatus::kSuccess);
  ASSERT_TRUE(pair.server->FreeRegion(first).ok());
  // The same size again (likely the same space and table slot): zeroed, with a new key.
  LocalRegion second;
  ASSERT_TRUE(pair.server->AllocateRegion(4096, kRemoteWrite, &second).ok());
  EXPECT_NE(second.rkey, first.rkey);
  EXPECT_NE(second.rkey, 0u);
  EXPECT_TRUE(AllZero(second.addr, second.length));
  RemoteRegion new_remote = pair.server->Describe(second);
  std::vector<Sge> head = {{source.addr, 16, source.lkey}};
  ASSERT_EQ(PostAndWait(pair.client.get(), OneSided(Opcode::kWrite, 2, head, new_remote)),
            WcStatus::kSuccess);
  EXPECT_TRUE(HasPattern(second.addr, 16, 9));
  // The old key (even at the old address, which may be the new region's) is refused.
  EXPECT_EQ(PostAndWait(pair.client.get(), OneSided(Opcode::kWrite, 3, sges, old_remote)),
            WcStatus::kRemoteAccessError);
  EXPECT_TRUE(AllZero(second.addr + 16, second.length - 16));
  EXPECT_EQ(pair.client->state().code(), Status::Code::kRemoteAccess);
  Clock::time_point deadline = Clock::now() + std::chrono::seconds(5);
  while (pair.server->state().ok() && Clock::now() < deadline) {
    Completion wc[4];
    size_t n = 0;
    pair.server->Poll(wc, 4, 10, &n);
  }
  EXPECT_EQ(pair.server->state().code(), Status::Code::kRemoteAccess);
}

TEST(ShmKeysTest, ManyRegionsComeAndGo) {
  Pair pair = MakePair();
  ASSERT_NE(pair.server, nullptr);
  LocalRegion source;
  ASSERT_TRUE(pair.client->AllocateRegion(1 << 17, kLocalOnly, &source).ok());
  FillPattern(source.addr, source.length, 1);
  std::mt19937 random(7);
  std::vector<LocalRegion> live;
  std::set<uint64_t> keys_seen;
  for (int round = 0; round < 2000; round++) {
    if (live.size() < 50 && (live.empty() || random() % 2 == 0)) {
      LocalRegion region;
      size_t length = 1 + random() % (1 << 17);
      ASSERT_TRUE(pair.server->AllocateRegion(length, kRemoteWrite, &region).ok());
      ASSERT_TRUE(AllZero(region.addr, region.length)) << "round " << round;
      EXPECT_TRUE(keys_seen.insert(region.rkey).second) << "a key came back";
      std::vector<Sge> sges = {{source.addr, uint32_t(length), source.lkey}};
      ASSERT_EQ(PostAndWait(pair.client.get(),
                            OneSided(Opcode::kWrite, round, sges, pair.server->Describe(region))),
                WcStatus::kSuccess);
      ASSERT_TRUE(HasPattern(region.addr, length, 1));
      live.push_back(region);
    } else {
      size_t victim = random() % live.size();
      ASSERT_TRUE(pair.server->FreeRegion(live[victim]).ok());
      live.erase(live.begin() + victim);
    }
  }
  EXPECT_TRUE(pair.client->state().ok());
}

}  // namespace
}  // namespace slipstream::rdma
