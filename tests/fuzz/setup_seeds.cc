// Seeds for setup_fuzz: frames written by SendSetupMessage (mode 0), and both halves of a real
// successful Authenticate exchange, recorded between the two sides (mode 1: what the client
// sent, mode 2: what the server sent). The nonces and proofs of the recording are random, so
// they are overwritten with fixed bytes: the seeds stay deterministic and keep their framing.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <future>

#include "seeds.h"
#include "setup.h"
#include "shm_transport.h"

namespace slipstream::fuzz {
namespace {

using namespace rdma;

constexpr int kTimeoutMs = 5000;
const std::string kSecret = "fuzz-secret";  // setup_fuzz's secret
constexpr size_t kNonceBytes = 32, kProofBytes = 32;

// The bytes SendSetupMessage writes for each (type, payload), one after another.
std::string Frames(const std::vector<std::pair<uint32_t, std::string>>& messages) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return {};
  size_t total = 0;
  for (const auto& [type, payload] : messages) {
    if (!SendSetupMessage(fds[0], type, payload).ok()) return {};
    total += 8 + payload.size();
  }
  std::string bytes(total, '\0');
  size_t got = 0;
  while (got < total) {
    ssize_t n = ::recv(fds[1], bytes.data() + got, total - got, 0);
    if (n <= 0) break;
    got += size_t(n);
  }
  ::close(fds[0]);
  ::close(fds[1]);
  return bytes;
}

// Passes what one side of the relay sent on to the other and keeps a copy in `sent`; false once
// that side is done.
bool Relay(int from, int to, std::string* sent) {
  char buffer[4096];
  ssize_t n = ::recv(from, buffer, sizeof(buffer), 0);
  if (n <= 0) return false;
  sent->append(buffer, size_t(n));
  ::send(to, buffer, size_t(n), MSG_NOSIGNAL);
  return true;
}

// What each side of a real handshake for `backend` sent, recorded by relaying between two
// socketpairs: first what the client sent, then what the server sent.
std::pair<std::string, std::string> RecordHandshake(const std::string& backend) {
  int client[2], server[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, client) != 0 ||
      ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, server) != 0) {
    return {};
  }
  auto client_done = std::async(std::launch::async, [&] {
    std::string name = backend;
    Status s = Authenticate(client[0], kSecret, false, &name, kTimeoutMs);
    ::shutdown(client[0], SHUT_RDWR);
    return s;
  });
  auto server_done = std::async(std::launch::async, [&] {
    std::string name;
    Status s = Authenticate(server[0], kSecret, true, &name, kTimeoutMs);
    ::shutdown(server[0], SHUT_RDWR);
    return s;
  });
  std::string from_client, from_server;
  bool client_open = true, server_open = true;
  while (client_open || server_open) {
    pollfd p[2] = {{client[1], POLLIN, 0}, {server[1], POLLIN, 0}};
    if (::poll(p, 2, kTimeoutMs) <= 0) break;
    if (client_open && p[0].revents != 0) client_open = Relay(client[1], server[1], &from_client);
    if (server_open && p[1].revents != 0) server_open = Relay(server[1], client[1], &from_server);
  }
  bool ok = client_done.get().ok() && server_done.get().ok();
  for (int fd : {client[0], client[1], server[0], server[1]}) ::close(fd);
  if (!ok) return {};
  return {from_client, from_server};
}

// Overwrites `length` bytes at `offset` with a fixed pattern (a recorded random value).
void Fix(std::string* bytes, size_t offset, size_t length, char fill) {
  if (bytes->size() >= offset + length) bytes->replace(offset, length, length, fill);
}

// Frames of assorted types and sizes, and the recorded handshakes for three backends.
std::vector<Seed> SetupSeeds() {
  std::vector<Seed> seeds;
  ShmHeapDescription heap{};
  heap.magic = kShmHeapMagic;
  heap.version = kShmVersion;
  heap.pid = 4242;
  heap.memfd = 7;
  heap.table_entries = kShmTableEntries;
  heap.region_space = 1u << 21;
  heap.heap_size = kShmRegionOffset + heap.region_space;
  heap.ring_bytes = kShmRingBytes;
  const std::string description(reinterpret_cast<const char*>(&heap), sizeof(heap));
  seeds.push_back({"frame_empty", '\0' + Frames({{kShmReadyMessage, ""}})});
  seeds.push_back({"frame_heap", '\0' + Frames({{kShmHeapMessage, description}})});
  seeds.push_back(
      {"frames_two", '\0' + Frames({{kShmHeapMessage, description}, {kShmReadyMessage, ""}})});
  seeds.push_back({"frame_large", '\0' + Frames({{0x12345678, std::string(3000, 'p')}})});
  for (const char* backend : {"tcp", "shm", "verbs"}) {
    auto [client, server] = RecordHandshake(backend);
    // Client: HELLO (header, version, nonce, name), then the client proof frame.
    Fix(&client, 12, kNonceBytes, 'n');
    if (client.size() >= kProofBytes) Fix(&client, client.size() - kProofBytes, kProofBytes, 'c');
    // Server: the proof frame (header, nonce, proof), then the empty AUTH_OK frame.
    Fix(&server, 8, kNonceBytes, 'N');
    Fix(&server, 8 + kNonceBytes, kProofBytes, 'S');
    seeds.push_back({std::string("server_hears_") + backend, '\1' + client});
    seeds.push_back({std::string("client_hears_") + backend, '\2' + server});
  }
  return seeds;
}

}  // namespace
SLIPSTREAM_FUZZ_SEEDS(setup, SetupSeeds);
}  // namespace slipstream::fuzz
