// The exchange's messages as bytes: see exchange_wire.h.
#include "exchange_wire.h"

#include <cstring>

namespace slipstream::rdma::exchange_wire {

namespace {

// Appends `value` little-endian.
void PutU32(std::string* out, uint32_t value) {
  for (int i = 0; i < 4; i++) out->push_back(char(value >> (8 * i)));
}

// Reads a little-endian u32 from the front of *in.
bool GetU32(std::string_view* in, uint32_t* value) {
  if (in->size() < 4) return false;
  *value = 0;
  for (int i = 0; i < 4; i++) *value |= uint32_t(uint8_t((*in)[i])) << (8 * i);
  in->remove_prefix(4);
  return true;
}

}  // namespace

std::string EncodeHello(uint32_t from, uint32_t participants, uint64_t exchange_id) {
  const Hello hello{kHelloMagic, from, participants, 0, exchange_id};
  return std::string(reinterpret_cast<const char*>(&hello), sizeof(hello));
}

bool HelloFrom(const Message& m, std::optional<uint32_t> expected, uint32_t participants,
               uint64_t exchange_id, uint32_t* from) {
  Hello theirs{};
  if (m.opcode != kHello || m.data.size() != sizeof(theirs)) return false;
  std::memcpy(&theirs, m.data.data(), sizeof(theirs));
  if (theirs.magic != kHelloMagic || theirs.exchange_id != exchange_id ||
      theirs.participants != participants || theirs.from >= participants ||
      (expected && theirs.from != *expected)) {
    return false;
  }
  if (from) *from = theirs.from;
  return true;
}

std::string EncodeBatchHeader(const RegionLayout& layout, const ScheduleOptions& options) {
  std::string header;
  layout.EncodeTo(&header);
  PutU32(&header, options.max_bridge);
  PutU32(&header, options.max_bridge_packed);
  PutU32(&header, options.min_in_place);
  return header;
}

// Limits from the message's own size: no fragment is empty, so neither the payload nor the
// fragment count can exceed the bytes that arrived.
bool ParseBatch(std::string_view data, RegionLayout* layout, ScheduleOptions* options,
                uint64_t* wire_offset) {
  std::string_view in = data;
  Status s = RegionLayout::DecodeFrom(&in, data.size(), data.size(), layout);
  ScheduleOptions read;
  if (!s.ok() || !GetU32(&in, &read.max_bridge) || !GetU32(&in, &read.max_bridge_packed) ||
      !GetU32(&in, &read.min_in_place) || WireBytes(*layout, read) != in.size()) {
    return false;
  }
  *options = read;
  *wire_offset = data.size() - in.size();
  return true;
}

StreamMessage Classify(const Message& m) {
  if (m.opcode == kEnd && m.data.empty()) return StreamMessage::kEnd;
  return m.opcode == kBatch ? StreamMessage::kBatch : StreamMessage::kUnexpected;
}

bool IsDone(const Message& m) {
  return m.opcode == kDone && m.data.empty();
}

}  // namespace slipstream::rdma::exchange_wire
