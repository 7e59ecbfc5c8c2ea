// The backends behind Listen()/Connect(). Each takes over an authenticated setup socket `fd`
// (it owns and closes it) and builds its side of the connection.
#pragma once

#include <memory>

#include "slipstream/rdma/testing.h"
#include "slipstream/rdma/transport.h"

namespace slipstream::rdma {

// What every backend's connection is besides a Connection: the holder of its fault switches
// (reached by tests through TestFaults, never through Connection).
class FaultInjectable {
 public:
  virtual ~FaultInjectable() = default;
  virtual FaultInjection* faults() = 0;
};

Status AcceptTcp(const TransportOptions& options, int fd, std::unique_ptr<Connection>* out);
Status ConnectTcp(const TransportOptions& options, int fd, std::unique_ptr<Connection>* out);

Status AcceptShm(const TransportOptions& options, int fd, std::unique_ptr<Connection>* out);
Status ConnectShm(const TransportOptions& options, int fd, std::unique_ptr<Connection>* out);

Status AcceptVerbs(const TransportOptions& options, int fd, std::unique_ptr<Connection>* out);
Status ConnectVerbs(const TransportOptions& options, int fd, std::unique_ptr<Connection>* out);
// True when ibv_get_device_list finds at least one device.
bool VerbsDeviceAvailable();

}  // namespace slipstream::rdma
