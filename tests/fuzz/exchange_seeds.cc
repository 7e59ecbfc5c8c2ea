// Seeds for exchange_fuzz: every message of the exchange as the exchange's encoders write it,
// each as opcode (u32, little-endian) then data.
#include <string>
#include <vector>

#include "exchange_wire.h"
#include "seeds.h"
#include "slipstream/rdma/region.h"
#include "slipstream/rdma/schedule.h"

namespace slipstream::fuzz {
namespace {

using namespace rdma;
using namespace rdma::exchange_wire;

// The exchange exchange_fuzz checks hellos against.
constexpr uint32_t kParticipants = 4;
constexpr uint64_t kExchangeId = 0x5eed5eed00000042ull;

// One channel message as exchange_fuzz reads it.
Seed AsMessage(const std::string& name, uint32_t opcode, const std::string& data) {
  Seed seed{name, ""};
  for (int i = 0; i < 4; i++) seed.bytes.push_back(char(opcode >> (8 * i)));
  seed.bytes += data;
  return seed;
}

// A batch as TrySend sends it: the header, then the wire image its schedule writes from a
// source buffer of rows.
std::string Batch(const RegionLayout& layout, const char* backend) {
  std::string source(layout.extent(), '\0');
  for (size_t i = 0; i < source.size(); i++) source[i] = char('a' + (i * 7) % 26);
  const Schedule schedule = PlanSchedule(layout, TransferCosts::Measured(backend));
  std::string wire(schedule.wire_bytes, '\0');
  for (const Run& run : schedule.Boxes()) {
    wire.replace(run.wire, run.length, source, run.source, run.length);
  }
  return EncodeBatchHeader(layout, schedule.options) + wire;
}

// Hellos of every participant, End, Done, batches of each layout kind, and a message of an
// opcode the exchange does not know.
std::vector<Seed> ExchangeSeeds() {
  std::vector<Seed> seeds;
  for (uint32_t j = 0; j < kParticipants; j++) {
    seeds.push_back(AsMessage("hello_" + std::to_string(j), kHello,
                              EncodeHello(j, kParticipants, kExchangeId)));
  }
  seeds.push_back(AsMessage("end", kEnd, ""));
  seeds.push_back(AsMessage("done", kDone, ""));
  seeds.push_back(AsMessage("unknown", 9, "x"));
  RegionLayout rows, masked, strided, bitmapped;
  // Encoded rows of a row store, masked to the rows one target owns (the shuffle's batches).
  if (RegionLayout::PointerMapped({{0, 24}, {24, 40}, {64, 16}, {80, 33}, {113, 7}, {120, 64}},
                                  &rows)
          .ok()) {
    seeds.push_back(AsMessage("batch_rows", kBatch, Batch(rows, "shm")));
    RowMask mask(rows.rows());
    for (uint64_t row = 0; row < rows.rows(); row += 2) mask.Set(row);
    if (rows.WithMask(mask, &masked).ok()) {
      seeds.push_back(AsMessage("batch_rows_masked", kBatch, Batch(masked, "tcp")));
    }
  }
  if (RegionLayout::Strided(0, 32, 12, {{0, 4}, {20, 8}}, &strided).ok()) {
    seeds.push_back(AsMessage("batch_strided", kBatch, Batch(strided, "shm")));
  }
  if (RegionLayout::Bitmapped({{0, 4}, {256, 8}}, 30, &bitmapped).ok()) {
    seeds.push_back(AsMessage("batch_bitmapped", kBatch, Batch(bitmapped, "verbs")));
  }
  return seeds;
}

}  // namespace
SLIPSTREAM_FUZZ_SEEDS(exchange, ExchangeSeeds);
}  // namespace slipstream::fuzz
