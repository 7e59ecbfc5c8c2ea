// Seeds for large_value_fuzz: large- and medium-log segments of value records written as the
// write path (LZ4 or raw) and compaction (raw) write them, each with a value pointer at one of
// its records and that record's key, in the layout large_value_fuzz.cc reads.
#include <string>
#include <vector>

#include "format.h"
#include "log_payloads.h"
#include "seeds.h"
#include "slipstream/engine/log_format.h"
#include "slipstream/engine/log_writer.h"

namespace slipstream::fuzz {
namespace {

using namespace engine;

// The image is cut after its last record plus a little zeroed space; the segments of
// large_value_fuzz.cc are 256 KiB and zero-padded.
constexpr uint32_t kImageSize = 64u << 10;
constexpr uint32_t kZeroTail = 16;
// The segments large_value_fuzz.cc keeps the medium and the large log in.
constexpr uint32_t kMediumSegment = 1;
constexpr uint32_t kLargeSegment = 2;

// One seed: a segment of the given values (one append each), and a pointer to value `pick`.
Seed Make(const char* name, bool large, bool buffered, const std::vector<std::string>& values,
          bool compress, size_t pick) {
  std::string image(kImageSize, '\0');
  LogCursor cursor;
  uint32_t segment = large ? kLargeSegment : kMediumSegment;
  StartLogSegment(image.data(), kImageSize, large ? LogKind::kLarge : LogKind::kMedium, 1, segment,
                  0x5eed0000 + segment, &cursor);
  ValuePtr ptr;
  std::string picked_key;
  for (size_t i = 0; i < values.size(); i++) {
    std::string ikey = MakeInternalKey(1, "value" + std::to_string(i));
    std::string payload = ValuePayload(ikey, values[i], compress);
    uint32_t offset = AppendRecord(image.data(), &cursor, LogRecordType::kValue, 10 + i, {payload});
    AppendChecksum(image.data(), &cursor);
    if (i == pick) {
      ptr = ValuePtr{{segment, offset}, RecordSpace(payload.size()), uint32_t(values[i].size())};
      picked_key = ikey;
    }
  }
  image.resize(cursor.pos + kZeroTail);
  std::string seed(1, char((large ? 1 : 0) | (buffered ? 2 : 0)));
  char encoded[ValuePtr::kEncodedSize];
  ptr.EncodeTo(encoded);
  seed.append(encoded, sizeof(encoded));
  seed.push_back(char(picked_key.size()));
  seed += picked_key;
  return Seed{name, seed + image};
}

// Large values compressed and raw, on the device and in a buffer; medium values.
std::vector<Seed> LargeValueSeeds() {
  return {
      Make("large_lz4", true, false, {Text(4000, 1), Text(2500, 2)}, true, 1),
      Make("large_raw", true, false, {Text(1500, 3), Text(1200, 4)}, false, 0),
      Make("large_buffered", true, true, {Text(3000, 5)}, true, 0),
      Make("medium", false, false, {Text(400, 6), Text(800, 7), Text(300, 8)}, false, 2),
  };
}

}  // namespace
SLIPSTREAM_FUZZ_SEEDS(large_value, LargeValueSeeds);
}  // namespace slipstream::fuzz
