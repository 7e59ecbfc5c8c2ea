// Seeds for wire_fuzz: one encoding of every control message.
#include "seeds.h"
#include "slipstream/replication/wire.h"

namespace slipstream::fuzz {
namespace {

// Every message type once, with fields a real exchange would carry.
std::vector<Seed> WireSeeds() {
  using namespace replication;
  return {
      {"hello", Encode(Hello{7301234567890123456ull, 3, "p1", 1})},
      {"hello_ok", Encode(HelloOk{3, 1u << 20, 8, 0x1000000, 0x2000})},
      {"open", Encode(Open{uint32_t(StreamId::kWal), 2, 0x1000000})},
      {"open_ok", Encode(OpenOk{1, 0x7f0000001000ull, 1u << 20, 0x1234567890abcdefull})},
      {"close", Encode(Close{1, 4096})},
      {"close_ok", Encode(CloseOk{1})},
      {"flush", Encode(Flush{1, 512})},
      {"flush_ok", Encode(FlushOk{1, 512})},
      {"error", Encode(Error{uint32_t(ErrorCode::kStaleVersion), "primary p1 is stale"})},
  };
}

}  // namespace
SLIPSTREAM_FUZZ_SEEDS(wire, WireSeeds);
}  // namespace slipstream::fuzz
