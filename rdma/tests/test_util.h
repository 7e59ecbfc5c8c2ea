// Helpers shared by the transport tests: deterministic byte patterns, a connected pair inside
// one process, and polling for a number of completions.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "setup.h"
#include "slipstream/rdma/transport.h"

namespace slipstream::rdma::test {

constexpr int kTimeoutMs = 5000;

// The deterministic byte at `index` of pattern `seed`.
inline char PatternByte(uint32_t seed, size_t index) {
  uint32_t x = static_cast<uint32_t>(index) * 2654435761u + seed * 40503u + 7;
  return static_cast<char>((x >> 13) ^ (x >> 5) ^ seed);
}

// Fills `length` bytes at `out` with pattern `seed`.
inline void FillPattern(char* out, size_t length, uint32_t seed) {
  for (size_t i = 0; i < length; i++) out[i] = PatternByte(seed, i);
}

// True when `length` bytes at `data` follow pattern `seed`.
inline bool HasPattern(const char* data, size_t length, uint32_t seed) {
  for (size_t i = 0; i < length; i++) {
    if (data[i] != PatternByte(seed, i)) return false;
  }
  return true;
}

// True when all `length` bytes at `data` are zero.
inline bool AllZero(const char* data, size_t length) {
  return std::all_of(data, data + length, [](char c) { return c == 0; });
}

// A connected pair inside this process: `server` from Accept, `client` from Connect.
struct Pair {
  std::unique_ptr<Connection> server;
  std::unique_ptr<Connection> client;
};

// Connects a pair over loopback with `options`; the result is empty (with a failed
// expectation) when the backend cannot connect.
inline Pair MakePair(const TransportOptions& options) {
  Pair pair;
  std::unique_ptr<Listener> listener;
  Status s = Listen(options, "127.0.0.1:0", &listener);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (!s.ok()) return pair;
  auto accepted =
      std::async(std::launch::async, [&] { return listener->Accept(kTimeoutMs, &pair.server); });
  s = Connect(options, listener->address(), &pair.client);
  EXPECT_TRUE(s.ok()) << options.backend << ": " << s.ToString();
  Status a = accepted.get();
  EXPECT_TRUE(a.ok()) << options.backend << ": " << a.ToString();
  if (!s.ok() || !a.ok()) return Pair{};
  return pair;
}

// Polls until `want` completions arrived or the deadline passed.
inline std::vector<Completion> PollN(Connection* connection, size_t want,
                                     int timeout_ms = kTimeoutMs) {
  using Clock = std::chrono::steady_clock;
  std::vector<Completion> got;
  Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (got.size() < want && Clock::now() < deadline) {
    Completion batch[64];
    size_t n = 0;
    int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    Status s =
        connection->Poll(batch, std::min<size_t>(64, want - got.size()), std::max(left, 0), &n);
    got.insert(got.end(), batch, batch + n);
    if (!s.ok() && n == 0) break;  // a failed connection with nothing left to report
  }
  return got;
}

// Options of a tcp connection with `secret` (and receive_in_poll as given).
inline TransportOptions TcpOptions(const std::string& secret, bool receive_in_poll = false) {
  TransportOptions options;
  options.backend = "tcp";
  options.secret = secret;
  options.connect_timeout_ms = kTimeoutMs;
  options.receive_in_poll = receive_in_poll;
  return options;
}

// Connects *client to `listener` with `client_options` while the listener accepts *server.
inline void ConnectThroughListener(Listener* listener, const TransportOptions& client_options,
                                   std::unique_ptr<Connection>* server,
                                   std::unique_ptr<Connection>* client) {
  auto accepted =
      std::async(std::launch::async, [&] { return listener->Accept(kTimeoutMs, server); });
  ASSERT_TRUE(Connect(client_options, listener->address(), client).ok());
  ASSERT_TRUE(accepted.get().ok());
}

// A tcp connection (*server) made with `options` whose peer is a raw socket (*raw) that
// authenticated and then sends only what a test writes to it, and reads nothing.
inline void ConnectRawTcpPeer(const TransportOptions& options, std::unique_ptr<Connection>* server,
                              int* raw) {
  std::unique_ptr<Listener> listener;
  ASSERT_TRUE(Listen(options, "127.0.0.1:0", &listener).ok());
  auto accepted =
      std::async(std::launch::async, [&] { return listener->Accept(kTimeoutMs, server); });
  ASSERT_TRUE(SetupConnect(listener->address(), kTimeoutMs, raw).ok());
  std::string backend = "tcp";
  ASSERT_TRUE(Authenticate(*raw, options.secret, /*is_server=*/false, &backend, kTimeoutMs).ok());
  ASSERT_TRUE(accepted.get().ok());
}

// A connection that forwards every call to another one: tests derive from it and override the
// one call they change (hold completions back, rewrite what is posted, hide a capability).
// The optional capabilities (max_repeat, places_in_address_order, wait_fd) keep Connection's
// defaults unless a test forwards them.
class ForwardingConnection : public Connection {
 public:
  explicit ForwardingConnection(Connection* inner) : inner_(inner) {}

  // Forwards to the wrapped connection.
  Status AllocateRegion(size_t length, uint32_t access, LocalRegion* region) override {
    return inner_->AllocateRegion(length, access, region);
  }
  // Forwards to the wrapped connection.
  Status RegisterLocal(void* addr, size_t length, LocalRegion* region) override {
    return inner_->RegisterLocal(addr, length, region);
  }
  // Forwards to the wrapped connection.
  Status FreeRegion(const LocalRegion& region) override { return inner_->FreeRegion(region); }
  // Forwards to the wrapped connection.
  RemoteRegion Describe(const LocalRegion& region) const override {
    return inner_->Describe(region);
  }
  // Forwards to the wrapped connection.
  Status Post(const WorkRequest* requests, size_t count) override {
    return inner_->Post(requests, count);
  }
  // Forwards to the wrapped connection.
  Status PostRecv(const RecvRequest* requests, size_t count) override {
    return inner_->PostRecv(requests, count);
  }
  // Forwards to the wrapped connection.
  Status Poll(Completion* out, size_t max, int timeout_ms, size_t* count) override {
    return inner_->Poll(out, max, timeout_ms, count);
  }
  // Forwards to the wrapped connection.
  Status state() const override { return inner_->state(); }
  // Forwards to the wrapped connection.
  void Disconnect() override { inner_->Disconnect(); }
  // Forwards to the wrapped connection.
  std::string backend() const override { return inner_->backend(); }
  // Forwards to the wrapped connection.
  uint32_t max_sge() const override { return inner_->max_sge(); }

 protected:
  Connection* inner() const { return inner_; }

 private:
  Connection* inner_;
};

}  // namespace slipstream::rdma::test
