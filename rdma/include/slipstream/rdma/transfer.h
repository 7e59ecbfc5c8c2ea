// Moving regions: one-sided WRITEs of a planned schedule into remote memory, to one target or
// to many at once (D-RDMA's shared-send-queue scatter: different parts of one region, e.g. rows
// by the hash of their key, go to their owners with every target's requests posted before any
// is waited for).
#pragma once

#include <cstddef>
#include <cstdint>

#include "slipstream/rdma/region.h"
#include "slipstream/rdma/schedule.h"
#include "slipstream/rdma/transport.h"

namespace slipstream::rdma {

struct RegionTarget {
  Connection* connection = nullptr;
  LocalRegion source;  // the buffer the layout describes, registered on `connection`
  const RegionLayout* layout = nullptr;
  const Schedule* schedule = nullptr;  // PlanSchedule(*layout, ...)
  LocalRegion staging;                 // a region of `connection` for packed boxes
  RemoteRegion remote;                 // the wire image goes here, at remote_offset
  uint64_t remote_offset = 0;
};

struct TransferStats {
  uint64_t requests = 0;  // work requests posted
  uint64_t pieces = 0;    // gather entries (a strided gather's once)
  uint64_t wire_bytes = 0;
  uint64_t packed_bytes = 0;    // copied into staging
  uint64_t gathered_bytes = 0;  // sent as strided gathers, straight from the source
};

// Writes every target's wire image. Targets may share a connection, not staging memory.
// Everything this side can check is checked before anything is posted (the source holds the
// layout's extent, the staging buffer the largest packed run, the remote region the wire
// image; the schedule was planned for the layout), so such bad input writes nothing. Returns
// once every write is placed; on a transport error (e.g. a region not registered on its
// target's connection) or after timeout_ms without progress, returns the error, and targets
// served before it may hold part of their image. Adds to *stats, which it does not reset.
Status ScatterRegions(RegionTarget* targets, size_t count, int timeout_ms,
                      TransferStats* stats = nullptr);

// ScatterRegions to one target.
inline Status WriteRegion(RegionTarget& target, int timeout_ms, TransferStats* stats = nullptr) {
  return ScatterRegions(&target, 1, timeout_ms, stats);
}

}  // namespace slipstream::rdma
