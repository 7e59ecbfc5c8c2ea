// Listen(), Connect() and backend choice: every backend starts on an authenticated TCP setup
// socket, then the connecting side's backend name picks who builds the connection.
#include "slipstream/rdma/transport.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "backends.h"
#include "setup.h"

namespace slipstream::rdma {

namespace {

using Clock = std::chrono::steady_clock;

// True for names of this machine's loopback interface: 127.0.0.0/8, ::1 (also as an
// IPv4-mapped 127/8 address) and "localhost".
bool IsLoopbackHost(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6{};
  if (::inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

// Hands an authenticated socket to the backend the peer asked for (which takes ownership).
Status AcceptBackend(const std::string& backend, const TransportOptions& options, int fd,
                     std::unique_ptr<Connection>* connection) {
  if (backend == "tcp") return AcceptTcp(options, fd, connection);
  if (backend == "shm") return AcceptShm(options, fd, connection);
  if (backend == "verbs") return AcceptVerbs(options, fd, connection);
  ::close(fd);
  return Status::InvalidArgument("peer asked for an unknown backend: " + backend);
}

// The listener: one non-blocking TCP socket; Accept authenticates each peer in turn.
class SetupListener : public Listener {
 public:
  // Takes ownership of the listening socket.
  SetupListener(const TransportOptions& options, int fd, std::string address)
      : options_(options), fd_(fd), address_(std::move(address)) {}

  // Closes the listening socket.
  ~SetupListener() override { ::close(fd_); }

  // Loops until a peer authenticates and its backend is built, or the timeout passes. A peer
  // that fails authentication or sends garbage is dropped and the loop goes on; one peer may
  // hold the loop for at most connect_timeout_ms. A backend this side cannot run (Unavailable)
  // is reported, since waiting would not help.
  Status Accept(int timeout_ms, std::unique_ptr<Connection>* connection) override {
    const bool infinite = timeout_ms < 0;
    const Clock::time_point deadline =
        Clock::now() + std::chrono::milliseconds(std::max(timeout_ms, 0));
    for (;;) {
      int left = infinite ? -1 : RemainingMs(deadline);
      if (!infinite && left <= 0) return Status::Timeout("no authenticated peer in time");
      int fd = -1;
      Status s = SetupAccept(fd_, left, &fd);
      if (!s.ok()) return s;
      int auth_ms = options_.connect_timeout_ms;
      if (!infinite) {
        int now_left = RemainingMs(deadline);
        auth_ms = auth_ms < 0 ? now_left : std::min(auth_ms, now_left);
      }
      std::string backend;
      s = Authenticate(fd, options_.secret, /*is_server=*/true, &backend, auth_ms);
      if (!s.ok()) {
        ::close(fd);
        continue;
      }
      s = AcceptBackend(backend, options_, fd, connection);
      if (s.ok() || s.code() == Status::Code::kUnavailable) return s;
      // The backend's own exchange failed: the peer misbehaved or vanished; keep waiting.
    }
  }

  // "HOST:PORT" with the port actually bound.
  std::string address() const override { return address_; }

 private:
  // Milliseconds until `deadline`, at least 0.
  static int RemainingMs(Clock::time_point deadline) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    return left.count() > 0 ? static_cast<int>(left.count()) : 0;
  }

  TransportOptions options_;
  int fd_;
  std::string address_;
};

}  // namespace

// Backends that cannot share memory between connections say so.
Status Connection::RegisterShared(void*, size_t, uint32_t, uint64_t, LocalRegion*) {
  return Status::InvalidArgument("the " + backend() +
                                 " backend cannot register memory of another connection");
}

// "auto" prefers the fastest backend that can reach `host`; explicit names pass through when
// known, anything else resolves to "" (Connect turns that into InvalidArgument).
std::string ResolveBackend(const std::string& requested, const std::string& host) {
  if (requested == "auto") {
    if (VerbsDeviceAvailable()) return "verbs";
    return IsLoopbackHost(host) ? "shm" : "tcp";
  }
  if (requested == "verbs" || requested == "shm" || requested == "tcp") return requested;
  return "";
}

// Binds the setup socket; nothing else happens until Accept.
Status Listen(const TransportOptions& options, const std::string& address,
              std::unique_ptr<Listener>* listener) {
  if (options.secret.empty()) return Status::InvalidArgument("an empty shared secret is refused");
  int fd = -1;
  std::string bound;
  Status s = SetupListen(address, &fd, &bound);
  if (!s.ok()) return s;
  *listener = std::make_unique<SetupListener>(options, fd, bound);
  return Status::OK();
}

// Chooses the backend, connects and authenticates within connect_timeout_ms, then lets the
// backend build the connection on the same socket.
Status Connect(const TransportOptions& options, const std::string& address,
               std::unique_ptr<Connection>* connection) {
  if (options.secret.empty()) return Status::InvalidArgument("an empty shared secret is refused");
  std::string host;
  uint16_t port = 0;
  Status s = SplitHostPort(address, &host, &port);
  if (!s.ok()) return s;
  std::string backend = ResolveBackend(options.backend, host);
  if (backend.empty()) return Status::InvalidArgument("unknown backend: " + options.backend);
  const Clock::time_point start = Clock::now();
  int fd = -1;
  s = SetupConnect(address, options.connect_timeout_ms, &fd);
  if (!s.ok()) return s;
  int auth_ms = options.connect_timeout_ms;
  if (auth_ms >= 0) {
    auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    auth_ms = std::max(0, auth_ms - static_cast<int>(spent.count()));
  }
  s = Authenticate(fd, options.secret, /*is_server=*/false, &backend, auth_ms);
  if (!s.ok()) {
    ::close(fd);
    return s;
  }
  if (backend == "tcp") return ConnectTcp(options, fd, connection);
  if (backend == "shm") return ConnectShm(options, fd, connection);
  return ConnectVerbs(options, fd, connection);
}

FaultInjection* TestFaults(Connection* connection) {
  auto* injectable = dynamic_cast<FaultInjectable*>(connection);
  return injectable == nullptr ? nullptr : injectable->faults();
}

}  // namespace slipstream::rdma
