// Fuzzes the connection setup (setup.h) with arbitrary peer bytes on a real socket: the fuzz
// input (after a mode byte) is written into one end of a socketpair, which is then half-closed,
// and the parser runs on the other end. It must return an error or succeed, never crash, and
// never wait for its timeout (the peer's end of stream is always there).
//
// Mode 0, RecvSetupMessage until it fails: every message it accepts must be the frame
// SendSetupMessage writes for its type and payload, and it must stop exactly where the framing
// says (InvalidArgument for a length over kMaxSetupMessage, Disconnected for a cut frame).
// Mode 1, Authenticate as the server: it must never succeed (the client's proof would need the
// secret and the server's fresh nonce); it must answer with a proof only a well-formed HELLO,
// and that proof must cover the nonce and backend name the HELLO carried.
// Mode 2, Authenticate as the client: it must never succeed either.
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "fuzz_input.h"
#include "setup.h"

namespace {

using namespace slipstream::rdma;
using slipstream::fuzz::FuzzFailure;
using slipstream::fuzz::FuzzInput;

constexpr size_t kMaxInput = 64u << 10;  // stays inside the socket buffer
constexpr int kTimeoutMs = 5000;
const std::string kSecret = "fuzz-secret";
// setup.cc's message types and HELLO layout (version, 32-byte nonce, backend name).
constexpr uint32_t kHello = 0x534c0001;
constexpr uint32_t kServerProof = 0x534c0002;
constexpr uint32_t kProtocolVersion = 1;
constexpr size_t kNonceBytes = 32;

// Stops the run with a message: the setup code did something it must not.
[[noreturn]] void Fail(const char* what, const Status& s = Status::OK()) {
  FuzzFailure("setup", (std::string(what) + " (" + s.ToString() + ")").c_str());
}

// Writes all of `bytes` to `fd` (they fit in the socket buffer).
void WriteAll(int fd, const char* bytes, size_t length) {
  while (length > 0) {
    ssize_t n = ::send(fd, bytes, length, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) Fail("cannot write the input into the socket");
    bytes += n;
    length -= size_t(n);
  }
}

// Reads from `fd` until end of stream.
std::string ReadAll(int fd) {
  std::string out;
  char buffer[4096];
  for (;;) {
    ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return out;
    out.append(buffer, size_t(n));
  }
}

// The bytes SendSetupMessage puts on a socket for one message.
std::string Encoded(uint32_t type, const std::string& payload) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) Fail("socketpair");
  Status s = SendSetupMessage(fds[0], type, payload);
  if (!s.ok()) Fail("SendSetupMessage refused what RecvSetupMessage accepted", s);
  ::close(fds[0]);
  std::string bytes = ReadAll(fds[1]);
  ::close(fds[1]);
  return bytes;
}

// Mode 0: reads messages until the input runs out or breaks the framing.
void CheckFraming(int fd, const std::string& input) {
  size_t offset = 0;
  for (;;) {
    uint32_t type = 0;
    std::string payload;
    Status s = RecvSetupMessage(fd, kTimeoutMs, &type, &payload);
    const size_t left = input.size() - offset;
    uint32_t length = 0;
    if (left >= 8) std::memcpy(&length, input.data() + offset + 4, 4);
    if (left < 8 || (length <= kMaxSetupMessage && left - 8 < length)) {
      if (s.code() != Status::Code::kDisconnected) Fail("a cut frame is not Disconnected", s);
      return;
    }
    if (length > kMaxSetupMessage) {
      if (s.code() != Status::Code::kInvalidArgument) Fail("an overlong frame was not refused", s);
      return;
    }
    if (!s.ok()) Fail("a whole frame was refused", s);
    if (Encoded(type, payload) != input.substr(offset, 8 + payload.size())) {
      Fail("an accepted message is not the encoding of its type and payload");
    }
    offset += 8 + payload.size();
  }
}

// HMAC-SHA256(secret, "server" NUL || server nonce || client nonce || backend), as setup.h says.
std::string ServerProof(const std::string& server_nonce, const std::string& client_nonce,
                        const std::string& backend) {
  std::string message = std::string("server") + '\0' + server_nonce + client_nonce + backend;
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_length = 0;
  HMAC(EVP_sha256(), kSecret.data(), int(kSecret.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &mac_length);
  return std::string(reinterpret_cast<char*>(mac), mac_length);
}

// Whether `input` starts with a well-formed HELLO (fills nonce and backend name if so).
bool WellFormedHello(const std::string& input, std::string* nonce, std::string* backend) {
  if (input.size() < 8) return false;
  uint32_t type = 0, length = 0, version = 0;
  std::memcpy(&type, input.data(), 4);
  std::memcpy(&length, input.data() + 4, 4);
  if (type != kHello || length > kMaxSetupMessage || input.size() - 8 < length) return false;
  if (length < 4 + kNonceBytes) return false;
  std::memcpy(&version, input.data() + 8, 4);
  if (version != kProtocolVersion) return false;
  *nonce = input.substr(12, kNonceBytes);
  *backend = input.substr(12 + kNonceBytes, length - 4 - kNonceBytes);
  if (backend->empty() || backend->size() > 32) return false;
  for (char c : *backend) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

// Mode 1: the server must refuse, and answer with a proof exactly when the HELLO was good.
void CheckServer(int fd, int peer, const std::string& input) {
  std::string backend = "unchanged";
  Status s = Authenticate(fd, kSecret, /*is_server=*/true, &backend, kTimeoutMs);
  if (s.ok()) Fail("the server accepted a peer that does not hold the secret");
  if (s.code() == Status::Code::kTimeout) Fail("the server waited although the peer was gone", s);
  if (backend != "unchanged") Fail("the server reported a backend without authenticating");
  ::shutdown(fd, SHUT_WR);
  std::string answer = ReadAll(peer);
  std::string client_nonce, name;
  const bool hello = WellFormedHello(input, &client_nonce, &name);
  if (!hello) {
    if (!answer.empty()) Fail("the server answered a malformed HELLO");
    return;
  }
  uint32_t type = 0, length = 0;
  if (answer.size() != 8 + 2 * kNonceBytes) Fail("the server's proof has the wrong size");
  std::memcpy(&type, answer.data(), 4);
  std::memcpy(&length, answer.data() + 4, 4);
  if (type != kServerProof || length != 2 * kNonceBytes) Fail("the server's proof is misframed");
  if (answer.substr(8 + kNonceBytes) !=
      ServerProof(answer.substr(8, kNonceBytes), client_nonce, name)) {
    Fail("the server's proof does not cover the HELLO's nonce and backend name");
  }
}

// Mode 2: the client must refuse a server that does not hold the secret.
void CheckClient(int fd) {
  std::string backend = "tcp";
  Status s = Authenticate(fd, kSecret, /*is_server=*/false, &backend, kTimeoutMs);
  if (s.ok()) Fail("the client accepted a server that does not hold the secret");
  if (s.code() == Status::Code::kTimeout) Fail("the client waited although the peer was gone", s);
}

}  // namespace

// Writes the input as the peer's bytes and runs the parser the mode byte picks.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > kMaxInput) return 0;
  FuzzInput in(data, size);
  const int mode = in.Byte() % 3;
  const std::string input(in.rest());
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) Fail("socketpair");
  WriteAll(fds[1], input.data(), input.size());
  ::shutdown(fds[1], SHUT_WR);  // the peer is done; it still reads what we answer
  if (mode == 0) {
    CheckFraming(fds[0], input);
  } else if (mode == 1) {
    CheckServer(fds[0], fds[1], input);
  } else {
    CheckClient(fds[0]);
  }
  ::close(fds[0]);
  ::close(fds[1]);
  return 0;
}
