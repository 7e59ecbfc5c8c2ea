// TEMPORARY stand-ins for the shm backend until src/shm_transport.cc exists; delete this file
// at integration. (The verbs entry points already come from src/verbs_transport.cc.)
#include <unistd.h>

#include "backends.h"

namespace slipstream::rdma {

// Stand-in: the shm backend is not built yet.
Status AcceptShm(const TransportOptions&, int fd, std::unique_ptr<Connection>*) {
  ::close(fd);
  return Status::Unavailable("shm backend not built yet");
}

// Stand-in: the shm backend is not built yet.
Status ConnectShm(const TransportOptions&, int fd, std::unique_ptr<Connection>*) {
  ::close(fd);
  return Status::Unavailable("shm backend not built yet");
}

}  // namespace slipstream::rdma
