// Seeds for region_fuzz: layouts of every kind, masked and not, each encoded by EncodeTo and
// followed by planner thresholds as a batch carries them (3 x u32, little-endian).
#include <string>
#include <vector>

#include "seeds.h"
#include "slipstream/rdma/region.h"
#include "slipstream/rdma/schedule.h"

namespace slipstream::fuzz {
namespace {

using namespace rdma;

// Appends `value` little-endian.
void PutU32(std::string* out, uint32_t value) {
  for (int i = 0; i < 4; i++) out->push_back(char(value >> (8 * i)));
}

// The seed of one layout: its encoding, then the thresholds `options`.
Seed Encoded(const char* name, const RegionLayout& layout, const ScheduleOptions& options) {
  Seed seed{name, ""};
  layout.EncodeTo(&seed.bytes);
  PutU32(&seed.bytes, options.max_bridge);
  PutU32(&seed.bytes, options.max_bridge_packed);
  PutU32(&seed.bytes, options.min_in_place);
  return seed;
}

// A mask over `rows` rows selecting every row whose index modulo `period` is below `keep`.
RowMask Periodic(uint64_t rows, uint64_t period, uint64_t keep) {
  RowMask mask(rows);
  for (uint64_t row = 0; row < rows; row++) {
    if (row % period < keep) mask.Set(row);
  }
  return mask;
}

// Layouts a shuffle or a projection sends: projections of rows, selections of columns, rows of
// a row store, under the thresholds measured for shm and tcp and with everything in place.
std::vector<Seed> RegionSeeds() {
  const ScheduleOptions shm = ScheduleOptions::FromCosts(TransferCosts::Measured("shm"));
  const ScheduleOptions tcp = ScheduleOptions::FromCosts(TransferCosts::Measured("tcp"));
  const ScheduleOptions in_place{0, 0, 0};
  std::vector<Seed> seeds;
  RegionLayout strided, bitmapped, pointer, masked;
  if (RegionLayout::Strided(128, 64, 40, {{0, 8}, {16, 4}, {40, 24}}, &strided).ok()) {
    seeds.push_back(Encoded("strided_projection", strided, shm));
    seeds.push_back(Encoded("strided_projection_tcp", strided, tcp));
    if (strided.WithMask(Periodic(40, 3, 1), &masked).ok()) {
      seeds.push_back(Encoded("strided_masked", masked, shm));
    }
  }
  RegionLayout whole_rows;
  if (RegionLayout::Strided(0, 16, 100, {{0, 16}}, &whole_rows).ok()) {
    seeds.push_back(Encoded("strided_whole_rows", whole_rows, in_place));
  }
  if (RegionLayout::Bitmapped({{0, 4}, {4096, 8}, {12288, 2}}, 200, &bitmapped).ok()) {
    seeds.push_back(Encoded("bitmapped_unmasked", bitmapped, shm));
    if (bitmapped.WithMask(Periodic(200, 7, 3), &masked).ok()) {
      seeds.push_back(Encoded("bitmapped_selection", masked, tcp));
    }
  }
  if (RegionLayout::PointerMapped({{500, 20}, {0, 7}, {7, 9}, {2000, 300}, {640, 1}}, &pointer)
          .ok()) {
    seeds.push_back(Encoded("pointer_mapped", pointer, shm));
    if (pointer.WithMask(Periodic(5, 2, 1), &masked).ok()) {
      seeds.push_back(Encoded("pointer_mapped_masked", masked, in_place));
    }
  }
  RegionLayout empty;
  if (RegionLayout::PointerMapped({}, &empty).ok()) {
    seeds.push_back(Encoded("pointer_mapped_empty", empty, shm));
  }
  return seeds;
}

}  // namespace
SLIPSTREAM_FUZZ_SEEDS(region, RegionSeeds);
}  // namespace slipstream::fuzz
