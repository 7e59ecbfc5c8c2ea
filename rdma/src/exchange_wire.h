// The messages of the all-to-all exchange (exchange.cc) as bytes: what a participant sends on a
// pair's channel and how it reads what a peer sent, apart from the channels that carry them, so
// that every parser of a peer's bytes is a pure function (tests/fuzz/exchange_fuzz.cc).
//
// Messages on a pair's channel (sender slot 0, so they arrive in order):
//   kHello  {magic, from, participants, exchange id}: the connecting side's first message
//   kBatch  encoded layout | max_bridge, max_bridge_packed, min_in_place (3 x u32) | wire image
//   kEnd    empty: no more batches from this sender
//   kDone   empty: the sender has every peer's end, i.e. everything (Close)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "slipstream/rdma/channel.h"
#include "slipstream/rdma/region.h"
#include "slipstream/rdma/schedule.h"

namespace slipstream::rdma::exchange_wire {

constexpr uint32_t kHello = 1, kBatch = 2, kEnd = 3, kDone = 4;
// What a batch message adds to the layout and the wire image: the three thresholds.
constexpr uint64_t kBatchTrailer = 12;
// Names the exchange and the version of its batches' encoding, so participants of other
// builds refuse each other at the hello: "SLX2" since pointer-mapped offsets travel as
// distances ("SLEX" before).
constexpr uint32_t kHelloMagic = 0x32584c53;  // "SLX2"

// A hello as it travels (in the host's byte order: participants share a machine type).
struct Hello {
  uint32_t magic;
  uint32_t from;
  uint32_t participants;
  uint32_t pad;
  uint64_t exchange_id;
};

// The data of the hello participant `from` sends in exchange `exchange_id` of `participants`.
std::string EncodeHello(uint32_t from, uint32_t participants, uint64_t exchange_id);

// True when `m` is a hello of this exchange (`exchange_id`, `participants`) from a participant
// (`expected`, when given); its index goes to *from.
bool HelloFrom(const Message& m, std::optional<uint32_t> expected, uint32_t participants,
               uint64_t exchange_id, uint32_t* from = nullptr);

// A batch's data up to its wire image: the encoded layout, then the planner's thresholds.
std::string EncodeBatchHeader(const RegionLayout& layout, const ScheduleOptions& options);

// Reads a batch's data: the layout goes to *layout (also when what follows it is malformed),
// the thresholds to *options, and where the wire image starts to *wire_offset. False unless
// the layout is well-formed and what follows the thresholds is exactly its wire image.
bool ParseBatch(std::string_view data, RegionLayout* layout, ScheduleOptions* options,
                uint64_t* wire_offset);

// What a message on a stream (before its end) is.
enum class StreamMessage { kEnd, kBatch, kUnexpected };

// Classifies a message a peer sent before its end: an empty kEnd ends its stream, a kBatch is
// to be parsed, anything else is a protocol violation.
StreamMessage Classify(const Message& m);

// Whether a message a peer sent after its end is its Done (the only one allowed there).
bool IsDone(const Message& m);

}  // namespace slipstream::rdma::exchange_wire
