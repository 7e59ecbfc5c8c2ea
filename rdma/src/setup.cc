// Connection setup: TCP sockets with deadlines, length-checked framing, and mutual
// HMAC-SHA256 challenge-response authentication.
#include "setup.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace slipstream::rdma {

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kNonceBytes = 32;
constexpr size_t kProofBytes = 32;  // SHA-256
constexpr size_t kMaxBackendName = 32;
constexpr uint32_t kProtocolVersion = 1;

// Setup message types of the authentication exchange.
enum SetupType : uint32_t {
  kHello = 0x534c0001,        // client: version, nonce, backend name
  kServerProof = 0x534c0002,  // server: nonce, proof
  kClientProof = 0x534c0003,  // client: proof
  kAuthOk = 0x534c0004,       // server: the client's proof was accepted
};

// Milliseconds left until `deadline` (never negative); -1 means no deadline.
int RemainingMs(Clock::time_point deadline, bool infinite) {
  if (infinite) return -1;
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() > 0 ? static_cast<int>(left.count()) : 0;
}

// A deadline `timeout_ms` from now (negative: none).
Clock::time_point DeadlineAfter(int timeout_ms) {
  return Clock::now() + std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms);
}

// Text of errno for messages.
std::string ErrnoText(const char* what) {
  return std::string(what) + ": " + std::strerror(errno);
}

// Waits until `fd` has `events` or the deadline passes.
Status WaitFor(int fd, short events, Clock::time_point deadline, bool infinite) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, RemainingMs(deadline, infinite));
    if (rc > 0) return Status::OK();
    if (rc == 0) return Status::Timeout("setup peer did not answer in time");
    if (errno != EINTR) return Status::IOError(ErrnoText("poll"));
  }
}

// Receives exactly `length` bytes before the deadline; EOF is Disconnected.
Status RecvExact(int fd, char* out, size_t length, Clock::time_point deadline, bool infinite) {
  size_t done = 0;
  while (done < length) {
    Status s = WaitFor(fd, POLLIN, deadline, infinite);
    if (!s.ok()) return s;
    ssize_t n = ::recv(fd, out + done, length - done, MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n == 0) {
      return Status::Disconnected("setup peer closed the connection");
    } else if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
      return Status::Disconnected(ErrnoText("recv"));
    }
  }
  return Status::OK();
}

// Sends all of `data` (blocking; setup messages are small enough for the socket buffer).
Status SendAll(int fd, const char* data, size_t length) {
  size_t done = 0;
  while (done < length) {
    ssize_t n = ::send(fd, data + done, length - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno != EINTR) {
      return Status::Disconnected(ErrnoText("send"));
    }
  }
  return Status::OK();
}

// Sets the options every setup socket gets: no Nagle delay (frames are latency bound).
void TuneSocket(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Resolves host/port with getaddrinfo; an empty host means the wildcard address (passive).
Status Resolve(const std::string& host, uint16_t port, bool passive, addrinfo** result) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  std::string service = std::to_string(port);
  int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, result);
  if (rc != 0) return Status::InvalidArgument("cannot resolve " + host + ": " + gai_strerror(rc));
  return Status::OK();
}

// Fills `out` with random bytes from the kernel.
void RandomBytes(void* out, size_t length) {
  char* p = static_cast<char*>(out);
  while (length > 0) {
    ssize_t n = ::getrandom(p, length, 0);
    if (n < 0) continue;  // EINTR; getrandom never fails otherwise once the pool is ready
    p += n;
    length -= static_cast<size_t>(n);
  }
}

// HMAC-SHA256(secret, role || own nonce || peer nonce || backend).
std::string Proof(const std::string& secret, const char* role, const std::string& own_nonce,
                  const std::string& peer_nonce, const std::string& backend) {
  std::string message = std::string(role) + '\0' + own_nonce + peer_nonce + backend;
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_length = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &mac_length);
  return std::string(reinterpret_cast<char*>(mac), mac_length);
}

// Compares two proofs in constant time (no timing hint about how many bytes matched).
bool ProofMatches(const std::string& expected, const std::string& received) {
  return expected.size() == kProofBytes && received.size() == kProofBytes &&
         CRYPTO_memcmp(expected.data(), received.data(), kProofBytes) == 0;
}

// Backend names are short lowercase words; anything else in a HELLO is a malformed peer.
bool ValidBackendName(const std::string& name) {
  if (name.empty() || name.size() > kMaxBackendName) return false;
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

// Receives one message of the expected type before the deadline; another type is malformed.
Status Expect(int fd, uint32_t type, Clock::time_point deadline, bool infinite,
              std::string* payload) {
  uint32_t got = 0;
  Status s = RecvSetupMessage(fd, RemainingMs(deadline, infinite), &got, payload);
  if (!s.ok()) return s;
  if (got != type) return Status::InvalidArgument("unexpected setup message type");
  return Status::OK();
}

// The server half of Authenticate.
Status AuthenticateServer(int fd, const std::string& secret, std::string* backend,
                          Clock::time_point deadline, bool infinite) {
  std::string hello;
  Status s = Expect(fd, kHello, deadline, infinite, &hello);
  if (!s.ok()) return s;
  uint32_t version = 0;
  if (hello.size() < sizeof(version) + kNonceBytes) {
    return Status::InvalidArgument("short HELLO");
  }
  std::memcpy(&version, hello.data(), sizeof(version));
  if (version != kProtocolVersion) return Status::InvalidArgument("unknown protocol version");
  std::string client_nonce = hello.substr(sizeof(version), kNonceBytes);
  std::string name = hello.substr(sizeof(version) + kNonceBytes);
  if (!ValidBackendName(name)) return Status::InvalidArgument("bad backend name in HELLO");

  std::string server_nonce(kNonceBytes, '\0');
  RandomBytes(server_nonce.data(), server_nonce.size());
  s = SendSetupMessage(fd, kServerProof,
                       server_nonce + Proof(secret, "server", server_nonce, client_nonce, name));
  if (!s.ok()) return s;

  std::string client_proof;
  s = Expect(fd, kClientProof, deadline, infinite, &client_proof);
  // A client that rejected our proof hangs up instead of answering: that is a failed
  // authentication, not a transport problem.
  if (s.code() == Status::Code::kDisconnected) return Status::AuthFailed(s.message());
  if (!s.ok()) return s;
  if (!ProofMatches(Proof(secret, "client", client_nonce, server_nonce, name), client_proof)) {
    return Status::AuthFailed("the client does not hold the shared secret");
  }
  s = SendSetupMessage(fd, kAuthOk, {});
  if (!s.ok()) return s;
  *backend = name;
  return Status::OK();
}

// The client half of Authenticate.
Status AuthenticateClient(int fd, const std::string& secret, const std::string& backend,
                          Clock::time_point deadline, bool infinite) {
  if (!ValidBackendName(backend)) return Status::InvalidArgument("bad backend name");
  std::string client_nonce(kNonceBytes, '\0');
  RandomBytes(client_nonce.data(), client_nonce.size());
  std::string hello(sizeof(kProtocolVersion), '\0');
  std::memcpy(hello.data(), &kProtocolVersion, sizeof(kProtocolVersion));
  hello += client_nonce + backend;
  Status s = SendSetupMessage(fd, kHello, hello);
  if (!s.ok()) return s;

  std::string answer;
  s = Expect(fd, kServerProof, deadline, infinite, &answer);
  if (!s.ok()) return s;
  if (answer.size() != kNonceBytes + kProofBytes) {
    return Status::InvalidArgument("malformed server proof");
  }
  std::string server_nonce = answer.substr(0, kNonceBytes);
  if (!ProofMatches(Proof(secret, "server", server_nonce, client_nonce, backend),
                    answer.substr(kNonceBytes))) {
    return Status::AuthFailed("the server does not hold the shared secret");
  }
  s = SendSetupMessage(fd, kClientProof,
                       Proof(secret, "client", client_nonce, server_nonce, backend));
  if (!s.ok()) return s;
  std::string ok;
  s = Expect(fd, kAuthOk, deadline, infinite, &ok);
  if (s.code() == Status::Code::kDisconnected) return Status::AuthFailed(s.message());
  if (!s.ok()) return s;
  if (!ok.empty()) return Status::InvalidArgument("malformed authentication result");
  return Status::OK();
}

}  // namespace

// Splits "HOST:PORT" or "[V6HOST]:PORT"; the host may be empty (wildcard), the port must be a
// decimal number up to 65535.
Status SplitHostPort(const std::string& host_port, std::string* host, uint16_t* port) {
  std::string h, p;
  if (!host_port.empty() && host_port[0] == '[') {
    size_t close = host_port.find(']');
    if (close == std::string::npos || close + 1 >= host_port.size() ||
        host_port[close + 1] != ':') {
      return Status::InvalidArgument("malformed address: " + host_port);
    }
    h = host_port.substr(1, close - 1);
    p = host_port.substr(close + 2);
  } else {
    size_t colon = host_port.rfind(':');
    if (colon == std::string::npos) {
      return Status::InvalidArgument("address lacks a port: " + host_port);
    }
    h = host_port.substr(0, colon);
    p = host_port.substr(colon + 1);
    if (h.find(':') != std::string::npos) {
      return Status::InvalidArgument("IPv6 addresses need brackets: " + host_port);
    }
  }
  if (p.empty() || p.size() > 5) return Status::InvalidArgument("bad port: " + host_port);
  uint32_t value = 0;
  for (char c : p) {
    if (c < '0' || c > '9') return Status::InvalidArgument("bad port: " + host_port);
    value = value * 10 + static_cast<uint32_t>(c - '0');
  }
  if (value > 65535) return Status::InvalidArgument("port out of range: " + host_port);
  *host = h;
  *port = static_cast<uint16_t>(value);
  return Status::OK();
}

// Binds the first address that works. The listening socket is non-blocking so that a peer
// that resets between poll() and accept() cannot block Accept past its timeout.
Status SetupListen(const std::string& host_port, int* fd, std::string* bound) {
  std::string host;
  uint16_t port = 0;
  Status s = SplitHostPort(host_port, &host, &port);
  if (!s.ok()) return s;
  addrinfo* addresses = nullptr;
  s = Resolve(host, port, /*passive=*/true, &addresses);
  if (!s.ok()) return s;
  int last_errno = 0;
  int listen_fd = -1;
  for (addrinfo* a = addresses; a != nullptr && listen_fd < 0; a = a->ai_next) {
    int candidate =
        ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (candidate < 0) {
      last_errno = errno;
      continue;
    }
    int one = 1;
    ::setsockopt(candidate, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(candidate, a->ai_addr, a->ai_addrlen) == 0 && ::listen(candidate, 64) == 0) {
      listen_fd = candidate;
    } else {
      last_errno = errno;
      ::close(candidate);
    }
  }
  ::freeaddrinfo(addresses);
  if (listen_fd < 0) {
    errno = last_errno;
    return Status::IOError(ErrnoText(("cannot listen on " + host_port).c_str()));
  }
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    Status failure = Status::IOError(ErrnoText("getsockname"));
    ::close(listen_fd);
    return failure;
  }
  uint16_t bound_port = address.ss_family == AF_INET6
                            ? ntohs(reinterpret_cast<sockaddr_in6*>(&address)->sin6_port)
                            : ntohs(reinterpret_cast<sockaddr_in*>(&address)->sin_port);
  std::string bound_host = host;
  if (bound_host.empty()) bound_host = address.ss_family == AF_INET6 ? "::" : "0.0.0.0";
  bool needs_brackets = bound_host.find(':') != std::string::npos;
  *bound =
      (needs_brackets ? "[" + bound_host + "]" : bound_host) + ":" + std::to_string(bound_port);
  *fd = listen_fd;
  return Status::OK();
}

// Waits for one incoming connection; the accepted socket is blocking and close-on-exec.
Status SetupAccept(int listen_fd, int timeout_ms, int* fd) {
  const bool infinite = timeout_ms < 0;
  const Clock::time_point deadline = DeadlineAfter(timeout_ms);
  for (;;) {
    Status s = WaitFor(listen_fd, POLLIN, deadline, infinite);
    if (!s.ok()) return s.code() == Status::Code::kTimeout ? Status::Timeout("no peer") : s;
    int peer = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (peer >= 0) {
      TuneSocket(peer);
      *fd = peer;
      return Status::OK();
    }
    // Transient: the peer went away before we accepted it, or a signal; keep waiting.
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED ||
        errno == EPROTO) {
      continue;
    }
    return Status::IOError(ErrnoText("accept"));
  }
}

// Connects with a non-blocking connect() so that the timeout holds, then returns the socket
// to blocking mode for the backends.
Status SetupConnect(const std::string& host_port, int timeout_ms, int* fd) {
  const bool infinite = timeout_ms < 0;
  const Clock::time_point deadline = DeadlineAfter(timeout_ms);
  std::string host;
  uint16_t port = 0;
  Status s = SplitHostPort(host_port, &host, &port);
  if (!s.ok()) return s;
  if (host.empty()) return Status::InvalidArgument("no host to connect to: " + host_port);
  addrinfo* addresses = nullptr;
  s = Resolve(host, port, /*passive=*/false, &addresses);
  if (!s.ok()) return s;
  Status last = Status::Unavailable("no address for " + host_port);
  int connected = -1;
  for (addrinfo* a = addresses; a != nullptr && connected < 0; a = a->ai_next) {
    int candidate =
        ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (candidate < 0) {
      last = Status::IOError(ErrnoText("socket"));
      continue;
    }
    int rc = ::connect(candidate, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      s = WaitFor(candidate, POLLOUT, deadline, infinite);
      if (s.ok()) {
        int error = 0;
        socklen_t length = sizeof(error);
        ::getsockopt(candidate, SOL_SOCKET, SO_ERROR, &error, &length);
        errno = error;
        rc = error == 0 ? 0 : -1;
      } else {
        last = s;
        ::close(candidate);
        continue;
      }
    }
    if (rc != 0) {
      last = Status::Unavailable(ErrnoText(("cannot connect to " + host_port).c_str()));
      ::close(candidate);
      continue;
    }
    int flags = ::fcntl(candidate, F_GETFL);
    ::fcntl(candidate, F_SETFL, flags & ~O_NONBLOCK);
    TuneSocket(candidate);
    connected = candidate;
  }
  ::freeaddrinfo(addresses);
  if (connected < 0) return last;
  *fd = connected;
  return Status::OK();
}

// Header (type, length) and payload in one send.
Status SendSetupMessage(int fd, uint32_t type, std::string_view payload) {
  if (payload.size() > kMaxSetupMessage) {
    return Status::InvalidArgument("setup message too long");
  }
  std::string frame(8, '\0');
  uint32_t length = static_cast<uint32_t>(payload.size());
  std::memcpy(frame.data(), &type, 4);
  std::memcpy(frame.data() + 4, &length, 4);
  frame.append(payload);
  return SendAll(fd, frame.data(), frame.size());
}

// Reads the header, refuses a length over kMaxSetupMessage before allocating anything, then
// reads the payload; the whole message must arrive within timeout_ms (negative: no limit).
Status RecvSetupMessage(int fd, int timeout_ms, uint32_t* type, std::string* payload) {
  const bool infinite = timeout_ms < 0;
  const Clock::time_point deadline = DeadlineAfter(timeout_ms);
  char header[8];
  Status s = RecvExact(fd, header, sizeof(header), deadline, infinite);
  if (!s.ok()) return s;
  uint32_t length = 0;
  std::memcpy(type, header, 4);
  std::memcpy(&length, header + 4, 4);
  if (length > kMaxSetupMessage) return Status::InvalidArgument("setup message too long");
  payload->assign(length, '\0');
  return RecvExact(fd, payload->data(), length, deadline, infinite);
}

// Runs the exchange for one role under one deadline for the whole handshake.
Status Authenticate(int fd, const std::string& secret, bool is_server, std::string* backend,
                    int timeout_ms) {
  if (secret.empty()) return Status::InvalidArgument("an empty shared secret is refused");
  const bool infinite = timeout_ms < 0;
  const Clock::time_point deadline = DeadlineAfter(timeout_ms);
  if (is_server) return AuthenticateServer(fd, secret, backend, deadline, infinite);
  return AuthenticateClient(fd, secret, *backend, deadline, infinite);
}

// Eight random bytes, redrawn while zero (0 means "no key").
uint64_t RandomKey() {
  uint64_t key = 0;
  while (key == 0) RandomBytes(&key, sizeof(key));
  return key;
}

}  // namespace slipstream::rdma
