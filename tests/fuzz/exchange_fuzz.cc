// Fuzzes the messages of the all-to-all exchange (exchange_wire.h) as a peer could send them on
// a pair's channel: the input is the channel message, its opcode (u32, little-endian) then its
// data. Every parser the exchange runs on a peer's message runs on it: the hello check of both
// sides of the setup, the classification of what arrives before and after a peer's end, and the
// batch parser. What they accept must be what the exchange's own encoders write, and an
// accepted batch must unpack from exactly the wire image it carries (ASan sees every byte read).
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "exchange_wire.h"
#include "fuzz_input.h"
#include "slipstream/rdma/schedule.h"

namespace {

using namespace slipstream::rdma;
using namespace slipstream::rdma::exchange_wire;
using slipstream::fuzz::FuzzFailure;
using slipstream::fuzz::FuzzInput;

// The exchange the fuzzed participant belongs to (the seeds' hellos name it).
constexpr uint32_t kParticipants = 4;
constexpr uint64_t kExchangeId = 0x5eed5eed00000042ull;

// Stops the run with a message: a property of the exchange's parsers does not hold.
[[noreturn]] void Fail(const char* what) {
  FuzzFailure("exchange", what);
}

// The hello checks of both setup sides: an accepted hello names a participant of this exchange,
// is the hello that participant's EncodeHello writes (but for the padding, which is not read),
// and is accepted from that participant alone.
void CheckHello(const Message& m) {
  uint32_t from = kParticipants;
  if (!HelloFrom(m, std::nullopt, kParticipants, kExchangeId, &from)) {
    for (uint32_t j = 0; j < kParticipants; j++) {
      if (HelloFrom(m, j, kParticipants, kExchangeId)) Fail("a hello accepted only when expected");
    }
    return;
  }
  if (from >= kParticipants) Fail("a hello from a participant outside the exchange");
  const std::string encoded = EncodeHello(from, kParticipants, kExchangeId);
  const size_t pad = offsetof(Hello, pad);
  if (encoded.size() != m.data.size() || encoded.compare(0, pad, m.data, 0, pad) != 0 ||
      encoded.compare(pad + 4, std::string::npos, m.data, pad + 4, std::string::npos) != 0) {
    Fail("an accepted hello is not the one its participant encodes");
  }
  for (uint32_t j = 0; j < kParticipants; j++) {
    if (HelloFrom(m, j, kParticipants, kExchangeId) != (j == from)) {
      Fail("a hello accepted from the wrong participant");
    }
  }
  if (HelloFrom(m, std::nullopt, kParticipants, kExchangeId + 1) ||
      HelloFrom(m, std::nullopt, kParticipants + 1, kExchangeId)) {
    Fail("a hello accepted for another exchange");
  }
}

// The message kinds: End and Done are empty messages of their opcodes and nothing else.
void CheckKinds(const Message& m) {
  const StreamMessage kind = Classify(m);
  if ((kind == StreamMessage::kEnd) != (m.opcode == kEnd && m.data.empty())) {
    Fail("Classify's end is not an empty kEnd");
  }
  if ((kind == StreamMessage::kBatch) != (m.opcode == kBatch)) {
    Fail("Classify's batch is not a kBatch");
  }
  if (IsDone(m) != (m.opcode == kDone && m.data.empty())) Fail("IsDone is not an empty kDone");
}

// The batch parser on the data whatever the opcode (the exchange parses only kBatch, but the
// parser must hold on any bytes): an accepted batch is its header's encoding followed by a wire
// image of exactly the length its layout and thresholds give, which unpacks.
void CheckBatch(std::string_view data) {
  RegionLayout layout;
  ScheduleOptions options;
  uint64_t wire_offset = 0;
  if (!ParseBatch(data, &layout, &options, &wire_offset)) return;
  if (wire_offset > data.size()) Fail("a batch's wire image starts beyond its data");
  if (EncodeBatchHeader(layout, options) != data.substr(0, wire_offset)) {
    Fail("an accepted batch header is not what EncodeBatchHeader writes for it");
  }
  const uint64_t wire_bytes = data.size() - wire_offset;
  if (WireBytes(layout, options) != wire_bytes) Fail("a batch's wire image has another length");
  if (layout.payload_bytes() > data.size() || layout.fragment_count() > data.size()) {
    Fail("a batch's layout exceeds the limits its size sets");
  }
  // Exactly the wire image on the heap, so that ASan reports any read past it.
  std::unique_ptr<char[]> wire(new char[wire_bytes == 0 ? 1 : wire_bytes]);
  std::memcpy(wire.get(), data.data() + wire_offset, wire_bytes);
  std::string payload;
  if (!Unpack(layout, options, std::string_view(wire.get(), wire_bytes), &payload).ok()) {
    Fail("Unpack refused the wire image of an accepted batch");
  }
  if (payload.size() != layout.payload_bytes()) Fail("an unpacked payload has another length");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzInput in(data, size);
  Message m;
  if (!in.TakeRaw(&m.opcode)) return 0;  // little-endian on every machine this runs on
  m.data.assign(in.rest());
  CheckHello(m);
  CheckKinds(m);
  CheckBatch(m.data);
  return 0;
}
