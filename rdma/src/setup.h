// Connection setup shared by all backends: a TCP socket, framed messages on it, and mutual
// challenge-response authentication over the shared secret. Nothing is registered for a peer
// before Authenticate() succeeds.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "slipstream/rdma/status.h"

namespace slipstream::rdma {

constexpr uint32_t kMaxSetupMessage = 1u << 20;

// Binds and listens on "HOST:PORT" (PORT 0: any); returns the fd and the bound "HOST:PORT".
Status SetupListen(const std::string& host_port, int* fd, std::string* bound);
// Accepts one TCP connection within timeout_ms.
Status SetupAccept(int listen_fd, int timeout_ms, int* fd);
// Connects to "HOST:PORT" within timeout_ms.
Status SetupConnect(const std::string& host_port, int timeout_ms, int* fd);
// Splits "HOST:PORT"; InvalidArgument if malformed.
Status SplitHostPort(const std::string& host_port, std::string* host, uint16_t* port);

// Framed message: u32 type, u32 length (<= kMaxSetupMessage), payload. Anything else is a
// malformed peer: InvalidArgument, and the caller drops the connection.
Status SendSetupMessage(int fd, uint32_t type, std::string_view payload);
Status RecvSetupMessage(int fd, int timeout_ms, uint32_t* type, std::string* payload);

// Mutual authentication: both sides send a random 32-byte nonce and prove they hold the secret
// with HMAC-SHA256(secret, role || own nonce || peer nonce || backend). The client names the
// backend it wants (`backend` in); the server learns it (`backend` out). An empty secret is
// refused. AuthFailed on a wrong proof; the secret never crosses the wire.
Status Authenticate(int fd, const std::string& secret, bool is_server, std::string* backend,
                    int timeout_ms);

// A random 64-bit value from the kernel (getrandom), never 0.
uint64_t RandomKey();

}  // namespace slipstream::rdma
