// Connection setup: authentication, a listener that survives bad peers, framing limits,
// random keys and the region table's checks.
#include "setup.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <future>
#include <limits>
#include <string>
#include <thread>
#include <unordered_set>

#include "backends.h"
#include "region_table.h"
#include "slipstream/rdma/transport.h"

namespace slipstream::rdma {
namespace {

constexpr int kTimeoutMs = 5000;

// Options for the tcp backend with `secret`.
TransportOptions TcpOptions(const std::string& secret) {
  TransportOptions options;
  options.backend = "tcp";
  options.secret = secret;
  options.connect_timeout_ms = kTimeoutMs;
  return options;
}

// Runs one Accept on a thread of its own.
std::future<Status> AcceptAsync(Listener* listener, std::unique_ptr<Connection>* connection,
                                int timeout_ms = kTimeoutMs) {
  return std::async(std::launch::async, [=] { return listener->Accept(timeout_ms, connection); });
}

// True when the peer closed `fd` (reads EOF or a reset within a few seconds).
bool PeerClosed(int fd) {
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char byte;
  for (;;) {
    ssize_t n = ::recv(fd, &byte, 1, 0);
    if (n == 0) return true;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno == ECONNRESET;
  }
}

// Connects a raw TCP socket to the listener (no handshake).
int RawConnect(const std::string& address) {
  int fd = -1;
  Status s = SetupConnect(address, kTimeoutMs, &fd);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return fd;
}

// Writes a setup frame header with any type and length, and no payload.
void SendRawHeader(int fd, uint32_t type, uint32_t length) {
  char header[8];
  std::memcpy(header, &type, 4);
  std::memcpy(header + 4, &length, 4);
  ASSERT_EQ(::send(fd, header, sizeof(header), MSG_NOSIGNAL), ssize_t(sizeof(header)));
}

TEST(SetupTest, AuthenticationSucceeds) {
  std::unique_ptr<Listener> listener;
  ASSERT_TRUE(Listen(TcpOptions("s3cret"), "127.0.0.1:0", &listener).ok());
  EXPECT_NE(listener->address(), "127.0.0.1:0");
  std::unique_ptr<Connection> server, client;
  auto accepted = AcceptAsync(listener.get(), &server);
  Status s = Connect(TcpOptions("s3cret"), listener->address(), &client);
  ASSERT_TRUE(s.ok()) << s.ToString();
  s = accepted.get();
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(client->backend(), "tcp");
  EXPECT_EQ(server->backend(), "tcp");
  EXPECT_TRUE(client->state().ok());
  EXPECT_TRUE(server->state().ok());
}

TEST(SetupTest, WrongClientSecretFailsAndListenerGoesOn) {
  std::unique_ptr<Listener> listener;
  ASSERT_TRUE(Listen(TcpOptions("right"), "127.0.0.1:0", &listener).ok());
  std::unique_ptr<Connection> server, bad, good;
  auto accepted = AcceptAsync(listener.get(), &server);
  Status s = Connect(TcpOptions("wrong"), listener->address(), &bad);
  EXPECT_EQ(s.code(), Status::Code::kAuthFailed) << s.ToString();
  EXPECT_EQ(bad, nullptr);
  s = Connect(TcpOptions("right"), listener->address(), &good);
  ASSERT_TRUE(s.ok()) << s.ToString();
  s = accepted.get();
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(server->state().ok());
}

TEST(SetupTest, WrongServerSecretFailsAndListenerGoesOn) {
  std::unique_ptr<Listener> listener;
  ASSERT_TRUE(Listen(TcpOptions("server-only"), "127.0.0.1:0", &listener).ok());
  std::unique_ptr<Connection> server, bad, good;
  auto accepted = AcceptAsync(listener.get(), &server);
  Status s = Connect(TcpOptions("client-only"), listener->address(), &bad);
  EXPECT_EQ(s.code(), Status::Code::kAuthFailed) << s.ToString();
  s = Connect(TcpOptions("server-only"), listener->address(), &good);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(accepted.get().ok());
}

TEST(SetupTest, BothRolesSeeAuthFailedOnAMismatch) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  auto server = std::async(std::launch::async, [&] {
    std::string backend;
    return Authenticate(fds[0], "alpha", /*is_server=*/true, &backend, kTimeoutMs);
  });
  std::string backend = "tcp";
  Status client = Authenticate(fds[1], "beta", /*is_server=*/false, &backend, kTimeoutMs);
  EXPECT_EQ(client.code(), Status::Code::kAuthFailed) << client.ToString();
  ::close(fds[1]);  // what Connect does with a failed peer
  Status s = server.get();
  EXPECT_EQ(s.code(), Status::Code::kAuthFailed) << s.ToString();
  ::close(fds[0]);
}

TEST(SetupTest, MatchingSecretsAgreeOnTheBackend) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  std::string learned;
  auto server = std::async(std::launch::async, [&] {
    return Authenticate(fds[0], "same", /*is_server=*/true, &learned, kTimeoutMs);
  });
  std::string backend = "shm";
  Status s = Authenticate(fds[1], "same", /*is_server=*/false, &backend, kTimeoutMs);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(server.get().ok());
  EXPECT_EQ(learned, "shm");
  ::close(fds[0]);
  ::close(fds[1]);
}

TEST(SetupTest, EmptySecretIsRefused) {
  std::unique_ptr<Listener> listener;
  EXPECT_FALSE(Listen(TcpOptions(""), "127.0.0.1:0", &listener).ok());
  EXPECT_EQ(listener, nullptr);
  ASSERT_TRUE(Listen(TcpOptions("x"), "127.0.0.1:0", &listener).ok());
  std::unique_ptr<Connection> client;
  EXPECT_FALSE(Connect(TcpOptions(""), listener->address(), &client).ok());
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  std::string backend = "tcp";
  EXPECT_FALSE(Authenticate(fds[0], "", /*is_server=*/false, &backend, 100).ok());
  EXPECT_FALSE(Authenticate(fds[1], "", /*is_server=*/true, &backend, 100).ok());
  ::close(fds[0]);
  ::close(fds[1]);
}

TEST(SetupTest, GarbageAndOversizedPeersAreDroppedAndListenerSurvives) {
  TransportOptions options = TcpOptions("survivor");
  options.connect_timeout_ms = 500;  // a silent peer holds Accept at most this long
  std::unique_ptr<Listener> listener;
  ASSERT_TRUE(Listen(options, "127.0.0.1:0", &listener).ok());
  std::unique_ptr<Connection> server;
  auto accepted = AcceptAsync(listener.get(), &server, 20000);

  // Text that is not a frame at all: its "length" is far beyond kMaxSetupMessage.
  int garbage = RawConnect(listener->address());
  const char http[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_GT(::send(garbage, http, sizeof(http) - 1, MSG_NOSIGNAL), 0);
  EXPECT_TRUE(PeerClosed(garbage));
  ::close(garbage);

  // A frame one byte over the limit.
  int oversized = RawConnect(listener->address());
  SendRawHeader(oversized, 0x534c0001, kMaxSetupMessage + 1);
  EXPECT_TRUE(PeerClosed(oversized));
  ::close(oversized);

  // A well-sized frame of an unknown type.
  int unknown = RawConnect(listener->address());
  SendRawHeader(unknown, 0xdeadbeef, 4);
  ASSERT_EQ(::send(unknown, "abcd", 4, MSG_NOSIGNAL), 4);
  EXPECT_TRUE(PeerClosed(unknown));
  ::close(unknown);

  // A HELLO that is too short to hold a nonce.
  int short_hello = RawConnect(listener->address());
  SendRawHeader(short_hello, 0x534c0001, 3);
  ASSERT_EQ(::send(short_hello, "abc", 3, MSG_NOSIGNAL), 3);
  EXPECT_TRUE(PeerClosed(short_hello));
  ::close(short_hello);

  // A peer that says nothing is dropped after connect_timeout_ms.
  int silent = RawConnect(listener->address());
  EXPECT_TRUE(PeerClosed(silent));
  ::close(silent);

  std::unique_ptr<Connection> client;
  Status s = Connect(options, listener->address(), &client);
  ASSERT_TRUE(s.ok()) << s.ToString();
  s = accepted.get();
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(server->state().ok());
}

TEST(SetupTest, AcceptTimesOutWithoutPeers) {
  std::unique_ptr<Listener> listener;
  ASSERT_TRUE(Listen(TcpOptions("t"), "127.0.0.1:0", &listener).ok());
  std::unique_ptr<Connection> server;
  auto start = std::chrono::steady_clock::now();
  Status s = listener->Accept(200, &server);
  auto spent = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(s.code(), Status::Code::kTimeout) << s.ToString();
  EXPECT_LT(spent, std::chrono::seconds(2));
}

TEST(SetupTest, FramingChecksLengthsAndDeadlines) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  uint32_t type = 0;
  std::string payload;
  // Round trip.
  ASSERT_TRUE(SendSetupMessage(fds[0], 7, "hello").ok());
  ASSERT_TRUE(RecvSetupMessage(fds[1], kTimeoutMs, &type, &payload).ok());
  EXPECT_EQ(type, 7u);
  EXPECT_EQ(payload, "hello");
  // Exactly the limit is fine to send; one more is refused on both ends.
  EXPECT_EQ(SendSetupMessage(fds[0], 7, std::string(kMaxSetupMessage + 1, 'x')).code(),
            Status::Code::kInvalidArgument);
  SendRawHeader(fds[0], 7, kMaxSetupMessage + 1);
  EXPECT_EQ(RecvSetupMessage(fds[1], kTimeoutMs, &type, &payload).code(),
            Status::Code::kInvalidArgument);
  // Nothing arrives: Timeout.
  EXPECT_EQ(RecvSetupMessage(fds[1], 50, &type, &payload).code(), Status::Code::kTimeout);
  // A truncated payload followed by a close: Disconnected.
  SendRawHeader(fds[0], 7, 10);
  ASSERT_EQ(::send(fds[0], "abc", 3, MSG_NOSIGNAL), 3);
  ::close(fds[0]);
  EXPECT_EQ(RecvSetupMessage(fds[1], kTimeoutMs, &type, &payload).code(),
            Status::Code::kDisconnected);
  ::close(fds[1]);
}

TEST(SetupTest, SplitHostPort) {
  std::string host;
  uint16_t port = 0;
  ASSERT_TRUE(SplitHostPort("127.0.0.1:80", &host, &port).ok());
  EXPECT_EQ(host, "127.0.0.1");
  EXPECT_EQ(port, 80);
  ASSERT_TRUE(SplitHostPort("[::1]:65535", &host, &port).ok());
  EXPECT_EQ(host, "::1");
  EXPECT_EQ(port, 65535);
  ASSERT_TRUE(SplitHostPort("localhost:0", &host, &port).ok());
  EXPECT_EQ(host, "localhost");
  EXPECT_FALSE(SplitHostPort("localhost", &host, &port).ok());
  EXPECT_FALSE(SplitHostPort("host:65536", &host, &port).ok());
  EXPECT_FALSE(SplitHostPort("host:", &host, &port).ok());
  EXPECT_FALSE(SplitHostPort("host:12a", &host, &port).ok());
  EXPECT_FALSE(SplitHostPort("::1:80", &host, &port).ok());
  EXPECT_FALSE(SplitHostPort("[::1]80", &host, &port).ok());
}

TEST(SetupTest, ResolveBackend) {
  EXPECT_EQ(ResolveBackend("tcp", "127.0.0.1"), "tcp");
  EXPECT_EQ(ResolveBackend("shm", "10.0.0.1"), "shm");
  EXPECT_EQ(ResolveBackend("verbs", "10.0.0.1"), "verbs");
  EXPECT_EQ(ResolveBackend("carrier-pigeon", "127.0.0.1"), "");
  const bool verbs = VerbsDeviceAvailable();
  for (const char* loopback : {"127.0.0.1", "127.1.2.3", "::1", "localhost"}) {
    EXPECT_EQ(ResolveBackend("auto", loopback), verbs ? "verbs" : "shm") << loopback;
  }
  for (const char* remote : {"10.1.2.3", "192.168.0.1", "example.com", "::2"}) {
    EXPECT_EQ(ResolveBackend("auto", remote), verbs ? "verbs" : "tcp") << remote;
  }
  std::unique_ptr<Listener> listener;
  ASSERT_TRUE(Listen(TcpOptions("k"), "127.0.0.1:0", &listener).ok());
  TransportOptions options = TcpOptions("k");
  options.backend = "carrier-pigeon";
  std::unique_ptr<Connection> client;
  EXPECT_EQ(Connect(options, listener->address(), &client).code(), Status::Code::kInvalidArgument);
}

TEST(SetupTest, RandomKeysAreDistinctAndNonZero) {
  constexpr int kDraws = 100000;
  std::unordered_set<uint64_t> seen;
  seen.reserve(kDraws);
  for (int i = 0; i < kDraws; i++) {
    uint64_t key = RandomKey();
    ASSERT_NE(key, 0u);
    ASSERT_TRUE(seen.insert(key).second) << "repeated key after " << i << " draws";
  }
}

// A RegionTable over a stack buffer.
class RegionTableTest : public ::testing::Test {
 protected:
  char memory_[4096] = {};
  RegionTable table_;
  uint64_t Base() const { return reinterpret_cast<uintptr_t>(memory_); }
};

TEST_F(RegionTableTest, BoundsAreExactAndOverflowSafe) {
  uint64_t key = 0;
  ASSERT_TRUE(table_.Add(memory_, 1024, kRemoteWrite | kRemoteRead, &key).ok());
  EXPECT_NE(key, 0u);
  EXPECT_EQ(table_.bytes(), 1024u);
  EXPECT_EQ(table_.Resolve(key, Base(), 1024, kRemoteWrite), memory_);
  EXPECT_EQ(table_.Resolve(key, Base() + 1023, 1, kRemoteRead), memory_ + 1023);
  EXPECT_EQ(table_.Resolve(key, Base() + 1024, 0, kRemoteRead), memory_ + 1024);
  EXPECT_EQ(table_.Resolve(key, Base(), 1025, kRemoteWrite), nullptr);
  EXPECT_EQ(table_.Resolve(key, Base() + 1, 1024, kRemoteWrite), nullptr);
  EXPECT_EQ(table_.Resolve(key, Base() + 1024, 1, kRemoteWrite), nullptr);
  EXPECT_EQ(table_.Resolve(key, Base() - 1, 1, kRemoteWrite), nullptr);
  EXPECT_EQ(table_.Resolve(key, Base() + 1025, 0, kRemoteWrite), nullptr);
  // remote_addr + length wraps around to a small value: must not pass.
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  EXPECT_EQ(table_.Resolve(key, Base() + 1, max, kRemoteWrite), nullptr);
  EXPECT_EQ(table_.Resolve(key, max, 2, kRemoteWrite), nullptr);
  EXPECT_EQ(table_.Resolve(key, Base(), max, kRemoteWrite), nullptr);
}

TEST_F(RegionTableTest, RightsAreChecked) {
  uint64_t write_only = 0, read_only = 0, both = 0;
  ASSERT_TRUE(table_.Add(memory_, 1024, kRemoteWrite, &write_only).ok());
  ASSERT_TRUE(table_.Add(memory_ + 1024, 1024, kRemoteRead, &read_only).ok());
  ASSERT_TRUE(table_.Add(memory_ + 2048, 1024, kRemoteRead | kRemoteWrite, &both).ok());
  EXPECT_NE(table_.Resolve(write_only, Base(), 8, kRemoteWrite), nullptr);
  EXPECT_EQ(table_.Resolve(write_only, Base(), 8, kRemoteRead), nullptr);
  EXPECT_NE(table_.Resolve(read_only, Base() + 1024, 8, kRemoteRead), nullptr);
  EXPECT_EQ(table_.Resolve(read_only, Base() + 1024, 8, kRemoteWrite), nullptr);
  EXPECT_NE(table_.Resolve(both, Base() + 2048, 8, kRemoteRead), nullptr);
  EXPECT_NE(table_.Resolve(both, Base() + 2048, 8, kRemoteWrite), nullptr);
  EXPECT_NE(table_.Resolve(both, Base() + 2048, 8, kRemoteWrite | kRemoteRead), nullptr);
  EXPECT_EQ(table_.Resolve(write_only, Base(), 8, kRemoteWrite | kRemoteRead), nullptr);
  EXPECT_EQ(table_.Resolve(both, Base() + 2048, 8, 0), nullptr);  // no right asked: refused
  // A key is bound to its own region: another region's address does not resolve with it.
  EXPECT_EQ(table_.Resolve(write_only, Base() + 2048, 8, kRemoteWrite), nullptr);
}

TEST_F(RegionTableTest, UnknownAndRemovedKeys) {
  uint64_t key = 0, other = 0;
  ASSERT_TRUE(table_.Add(memory_, 2048, kRemoteWrite, &key).ok());
  ASSERT_TRUE(table_.Add(memory_ + 2048, 2048, kRemoteWrite, &other).ok());
  EXPECT_NE(key, other);
  EXPECT_EQ(table_.bytes(), 4096u);
  EXPECT_EQ(table_.Resolve(key ^ 1, Base(), 8, kRemoteWrite), nullptr);
  EXPECT_EQ(table_.Resolve(0, Base(), 8, kRemoteWrite), nullptr);
  ASSERT_TRUE(table_.Remove(key).ok());
  EXPECT_EQ(table_.Resolve(key, Base(), 8, kRemoteWrite), nullptr);
  EXPECT_EQ(table_.Remove(key).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(table_.bytes(), 2048u);
  EXPECT_NE(table_.Resolve(other, Base() + 2048, 8, kRemoteWrite), nullptr);
  EXPECT_FALSE(table_.Add(memory_, 0, kRemoteWrite, &key).ok());
}

}  // namespace
}  // namespace slipstream::rdma
