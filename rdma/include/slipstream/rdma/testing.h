// Test hooks of the transports: faults a connection injects on request (torn and dropped
// WRITEs, delayed completions), for the conformance, channel and replication tests. Kept out of
// the Connection interface: production code has no business with them.
#pragma once

#include <cstdint>
#include <memory>

#include "slipstream/rdma/transport.h"

namespace slipstream::rdma {

// Faults the backends inject on request (see docs/rdma.md).
struct FaultInjection {
  // Stop placing after this many bytes of the next WRITE and drop the connection (torn write).
  int64_t tear_next_write_after = -1;
  // Drop the connection in the middle of the next WRITE (before any byte is placed).
  bool drop_on_next_write = false;
  // Delay every completion by this many microseconds.
  uint32_t completion_delay_us = 0;
};

// The fault switches of a connection made by Listen/Connect (nullptr for any other).
FaultInjection* TestFaults(Connection* connection);

// The same for an owned connection.
inline FaultInjection* TestFaults(const std::unique_ptr<Connection>& connection) {
  return TestFaults(connection.get());
}

}  // namespace slipstream::rdma
