// Strided gathers: a gather list taken again and again, each time a stride further on in every
// entry's buffer (a WRITE with a repeat, WorkRequest::repeat), copied into one contiguous
// buffer. This is what a NIC's gather engine does for a projection of rows; in software the
// shm backend copies straight into the peer's memory with it, and tcp into its send chunks.
#pragma once

#include <cstddef>
#include <cstdint>

#include "slipstream/rdma/transport.h"

namespace slipstream::rdma {

// The bytes one period of a gather list carries.
uint64_t PeriodBytes(const Sge* sges, size_t count);

// Copies periods [first, first + periods) of the gather list into `out`, back to back: in
// period k each entry's bytes are taken from k * stride past its address. The periods go a
// block at a time and, inside a block, one entry at a time (a loop of fixed-width copies per
// entry), so the bytes of one block land in no particular order.
void GatherPeriods(const Sge* sges, size_t count, uint64_t stride, uint64_t first, uint64_t periods,
                   char* out);

// Copies the first `limit` bytes of the same image (from period 0), one entry at a time: what
// a WRITE cut short after `limit` bytes leaves placed.
void GatherPrefix(const Sge* sges, size_t count, uint64_t stride, uint64_t limit, char* out);

}  // namespace slipstream::rdma
