// The multi-buffer channel on each software backend: message boundaries, sizes up to 1 GiB,
// 1 to 7 receive buffers, slow consumers, several sender threads, zero-copy paths, and a peer
// that disconnects in the middle of a message.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <future>
#include <random>
#include <thread>

#include "slipstream/rdma/channel.h"

namespace slipstream::rdma {
namespace {

constexpr int kTimeoutMs = 20000;

// A connected pair of the given backend inside this process.
struct Pair {
  std::unique_ptr<Connection> server, client;
};

Pair Connect(const std::string& backend) {
  TransportOptions options;
  options.backend = backend;
  options.secret = "channel-test-secret";
  options.region_capacity = 1ull << 31;
  std::unique_ptr<Listener> listener;
  Status s = Listen(options, "127.0.0.1:0", &listener);
  EXPECT_TRUE(s.ok()) << s.ToString();
  Pair pair;
  if (!s.ok()) return pair;
  auto accepted = std::async(std::launch::async, [&] {
    std::unique_ptr<Connection> c;
    Status a = listener->Accept(kTimeoutMs, &c);
    EXPECT_TRUE(a.ok()) << a.ToString();
    return c;
  });
  s = rdma::Connect(options, listener->address(), &pair.client);
  EXPECT_TRUE(s.ok()) << s.ToString();
  pair.server = accepted.get();
  return pair;
}

// Both channel ends, opened concurrently (setup is a handshake).
struct Channels {
  Pair pair;
  std::unique_ptr<Channel> sender, receiver;
};

Channels Open(const std::string& backend, const ChannelOptions& send_side,
              const ChannelOptions& receive_side) {
  Channels c;
  c.pair = Connect(backend);
  if (!c.pair.server || !c.pair.client) return c;
  auto opened = std::async(std::launch::async, [&] {
    std::unique_ptr<Channel> ch;
    Status s = Channel::Open(c.pair.server.get(), receive_side, kTimeoutMs, &ch);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return ch;
  });
  Status s = Channel::Open(c.pair.client.get(), send_side, kTimeoutMs, &c.sender);
  EXPECT_TRUE(s.ok()) << s.ToString();
  c.receiver = opened.get();
  return c;
}

// Deterministic bytes for message `id`, so a receiver can check every byte.
std::string Pattern(size_t size, uint64_t id) {
  std::string s(size, '\0');
  uint64_t x = id * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < size; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    s[i] = char(x);
  }
  return s;
}

class ChannelTest : public ::testing::TestWithParam<std::string> {};

// Messages of many sizes keep their boundaries and bytes; more than one package per message.
TEST_P(ChannelTest, SizesAndBoundaries) {
  ChannelOptions o;
  o.receive_buffers = 3;
  o.receive_buffer_size = 64 << 10;
  Channels c = Open(GetParam(), o, o);
  ASSERT_TRUE(c.sender && c.receiver);
  std::vector<size_t> sizes = {0, 1, 8, 100, 4096, (64 << 10) - 48, 64 << 10, 1 << 20, 5 << 20};
  std::thread sender([&] {
    for (size_t i = 0; i < sizes.size(); i++) {
      Status s = c.sender->Send(uint32_t(i), Pattern(sizes[i], i), 0, kTimeoutMs);
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
  });
  for (size_t i = 0; i < sizes.size(); i++) {
    Message m;
    Status s = c.receiver->Receive(&m, kTimeoutMs);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(m.opcode, i);
    ASSERT_EQ(m.data.size(), sizes[i]);
    EXPECT_TRUE(m.data == Pattern(sizes[i], i)) << "message " << i << " corrupted";
  }
  sender.join();
}

// Every receive-buffer count from 1 (the single-buffer baseline) to 7, with a slow consumer.
TEST_P(ChannelTest, OneToSevenBuffersSlowConsumer) {
  for (uint32_t buffers = 1; buffers <= 7; buffers++) {
    ChannelOptions send_side, receive_side;
    receive_side.receive_buffers = buffers;
    receive_side.receive_buffer_size = 16 << 10;
    Channels c = Open(GetParam(), send_side, receive_side);
    ASSERT_TRUE(c.sender && c.receiver);
    std::thread sender([&] {
      for (int i = 0; i < 40; i++) {
        Status s = c.sender->Send(7, Pattern(3000 + i * 1000, i), 0, kTimeoutMs);
        ASSERT_TRUE(s.ok()) << s.ToString();
      }
    });
    for (int i = 0; i < 40; i++) {
      if (i % 10 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      Message m;
      Status s = c.receiver->Receive(&m, kTimeoutMs);
      ASSERT_TRUE(s.ok()) << buffers << " buffers: " << s.ToString();
      ASSERT_TRUE(m.data == Pattern(3000 + i * 1000, i)) << buffers << " buffers, message " << i;
    }
    sender.join();
  }
}

// With every receive buffer full and timeout 0, Send says WouldBlock instead of waiting.
TEST_P(ChannelTest, WouldBlockWhenFull) {
  ChannelOptions o;
  o.receive_buffers = 2;
  o.receive_buffer_size = 4096;
  Channels c = Open(GetParam(), o, o);
  ASSERT_TRUE(c.sender && c.receiver);
  ASSERT_TRUE(c.sender->Send(1, "a", 0, kTimeoutMs).ok());
  ASSERT_TRUE(c.sender->Send(2, "b", 0, kTimeoutMs).ok());
  Status s = c.sender->Send(3, "c", 0, 0);
  EXPECT_EQ(s.code(), Status::Code::kWouldBlock) << s.ToString();
  Message m;
  ASSERT_TRUE(c.receiver->Receive(&m, kTimeoutMs).ok());
  EXPECT_EQ(m.data, "a");
  ASSERT_TRUE(c.sender->Send(3, "c", 0, kTimeoutMs).ok());
  ASSERT_TRUE(c.receiver->Receive(&m, kTimeoutMs).ok());
  EXPECT_EQ(m.data, "b");
  ASSERT_TRUE(c.receiver->Receive(&m, kTimeoutMs).ok());
  EXPECT_EQ(m.data, "c");
}

// Several threads share one channel: each thread's messages arrive whole and in its order.
TEST_P(ChannelTest, SeveralSenderThreads) {
  ChannelOptions send_side, receive_side;
  send_side.sender_threads = 4;
  send_side.send_buffer_size = 4 * (32 << 10);
  receive_side.receive_buffers = 5;
  receive_side.receive_buffer_size = 16 << 10;
  Channels c = Open(GetParam(), send_side, receive_side);
  ASSERT_TRUE(c.sender && c.receiver);
  constexpr int kPerThread = 50;
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < 4; t++) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; i++) {
        uint64_t id = t * 1000 + i;
        Status s = c.sender->Send(uint32_t(i), Pattern(500 + (id * 7919) % 40000, id), t, kTimeoutMs);
        ASSERT_TRUE(s.ok()) << s.ToString();
      }
    });
  }
  int next[4] = {0, 0, 0, 0};
  for (int k = 0; k < 4 * kPerThread; k++) {
    Message m;
    Status s = c.receiver->Receive(&m, kTimeoutMs);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_LT(m.sender, 4u);
    int i = next[m.sender]++;
    uint64_t id = m.sender * 1000 + i;
    ASSERT_EQ(m.opcode, uint32_t(i)) << "out of order for sender " << m.sender;
    ASSERT_TRUE(m.data == Pattern(500 + (id * 7919) % 40000, id));
  }
  for (auto& t : threads) t.join();
}

// Zero-copy both ways: send from a registered region, consume packages in place.
TEST_P(ChannelTest, ZeroCopyPaths) {
  ChannelOptions o;
  o.receive_buffers = 4;
  o.receive_buffer_size = 8192;
  Channels c = Open(GetParam(), o, o);
  ASSERT_TRUE(c.sender && c.receiver);
  LocalRegion region;
  ASSERT_TRUE(c.pair.client->AllocateRegion(100000, kLocalOnly, &region).ok());
  std::string data = Pattern(100000, 42);
  std::memcpy(region.addr, data.data(), data.size());
  std::thread sender([&] {
    Status s = c.sender->SendRegion(9, region, 1000, 50000, 0, kTimeoutMs);
    ASSERT_TRUE(s.ok()) << s.ToString();
  });
  std::string got;
  while (got.size() < 50000) {
    PackageView p;
    Status s = c.receiver->ReceivePackage(&p, kTimeoutMs);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(p.opcode, 9u);
    EXPECT_EQ(p.offset, got.size());
    got.append(p.data);
    ASSERT_TRUE(c.receiver->Release(p).ok());
  }
  sender.join();
  EXPECT_TRUE(got == data.substr(1000, 50000));
}

// A peer that goes away in the middle of a message: both sides get an error, nobody hangs.
TEST_P(ChannelTest, DisconnectMidMessage) {
  ChannelOptions o;
  o.receive_buffers = 2;
  o.receive_buffer_size = 4096;
  Channels c = Open(GetParam(), o, o);
  ASSERT_TRUE(c.sender && c.receiver);
  auto sent = std::async(std::launch::async, [&] {
    return c.sender->Send(1, Pattern(1 << 20, 1), 0, kTimeoutMs);  // needs ~260 packages
  });
  PackageView p;
  ASSERT_TRUE(c.receiver->ReceivePackage(&p, kTimeoutMs).ok());  // take one, never free more
  c.pair.server->Disconnect();
  Status s = sent.get();
  EXPECT_FALSE(s.ok());
  Message m;
  EXPECT_FALSE(c.receiver->Receive(&m, 2000).ok());
}

// A 1 GiB message streamed through 1 MiB buffers.
TEST_P(ChannelTest, OneGibibyteStreamed) {
  ChannelOptions o;
  o.receive_buffers = 4;
  o.receive_buffer_size = 1 << 20;
  Channels c = Open(GetParam(), o, o);
  ASSERT_TRUE(c.sender && c.receiver);
  std::string data(size_t(1) << 30, '\0');
  for (size_t i = 0; i < data.size(); i += 4096) data[i] = char(i >> 12);
  std::thread sender([&] { ASSERT_TRUE(c.sender->Send(5, data, 0, 120000).ok()); });
  Message m;
  Status s = c.receiver->Receive(&m, 120000);
  sender.join();
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(m.data.size(), data.size());
  EXPECT_TRUE(m.data == data);
}

INSTANTIATE_TEST_SUITE_P(Backends, ChannelTest, ::testing::Values("shm", "tcp"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace slipstream::rdma
