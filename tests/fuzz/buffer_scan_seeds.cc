// Seeds for buffer_scan_fuzz: buffers the primary's log writer formats and fills (raw mode), and
// directions for the fuzzer's own builder (built mode). See buffer_scan_fuzz.cc for the layouts.
#include <string>
#include <vector>

#include "buffer_scan.h"
#include "fuzz_input.h"
#include "seeds.h"
#include "slipstream/engine/log_writer.h"

namespace slipstream::fuzz {
namespace {

using namespace replication;

// A buffer of `size` bytes of segment `sequence` of `stream` as a StreamShipper fills it: each
// append is `per_append` records of the given lengths and one checksum, until `appends` or
// the buffer runs out.
std::string Buffer(uint32_t size, uint32_t stream, uint64_t sequence, int appends,
                   std::vector<size_t> per_append) {
  std::string image(size, '\0');
  engine::LogCursor cursor;
  engine::StartLogSegment(image.data(), size, KindOfStream(stream), sequence, 3,
                          0x0123456789abcdefull, &cursor);
  uint64_t position = 0x1000000;
  for (int a = 0; a < appends; a++) {
    size_t need = engine::kChecksumEntrySize;
    for (size_t n : per_append) need += engine::kRecordHeaderSize + n;
    if (cursor.pos + need > size) break;
    for (size_t n : per_append) {
      std::string payload(n, '\0');
      for (size_t i = 0; i < n; i++) payload[i] = char('A' + (a * 5 + i) % 26);
      engine::AppendRecord(image.data(), &cursor, engine::LogRecordType::kWal, position, {payload});
      position += n;
    }
    engine::AppendChecksum(image.data(), &cursor);
  }
  return image;
}

// The raw-mode input for a buffer: resume cut, chain, flags (scan as the header says), stream
// and sequence, then the buffer.
Seed Raw(const std::string& name, uint32_t cut, const std::string& buffer) {
  Seed seed{name, ""};
  PutLittleEndian(&seed.bytes, 0, 1);
  PutLittleEndian(&seed.bytes, cut, 4);
  PutLittleEndian(&seed.bytes, 0, 4);
  PutLittleEndian(&seed.bytes, 1, 1);
  PutLittleEndian(&seed.bytes, 1, 2);
  PutLittleEndian(&seed.bytes, 0, 4);
  seed.bytes += buffer;
  return seed;
}

// The built-mode input: buffer size, sequence, stream, damage (tear and/or flip where), resume
// cut, then appends of `records` records of `length` bytes each.
Seed Built(const std::string& name, int damage, uint32_t tear, uint32_t flip, int appends,
           int records, int length) {
  Seed seed{name, ""};
  PutLittleEndian(&seed.bytes, 1, 1);
  PutLittleEndian(&seed.bytes, 4096, 2);
  PutLittleEndian(&seed.bytes, 7, 1);
  PutLittleEndian(&seed.bytes, 0, 1);  // the WAL stream
  PutLittleEndian(&seed.bytes, damage, 1);
  PutLittleEndian(&seed.bytes, tear, 2);
  PutLittleEndian(&seed.bytes, flip, 2);
  PutLittleEndian(&seed.bytes, 3, 1);
  PutLittleEndian(&seed.bytes, 700, 2);
  for (int a = 0; a < appends; a++) {
    PutLittleEndian(&seed.bytes, records - 1, 1);
    for (int r = 0; r < records; r++) {
      PutLittleEndian(&seed.bytes, length, 1);
      for (int i = 0; i < length; i++) seed.bytes.push_back(char('a' + (a + i) % 26));
    }
  }
  return seed;
}

// Whole, torn, full and empty buffers of each stream, and built buffers with each damage.
std::vector<Seed> BufferScanSeeds() {
  return {
      Raw("wal_appends", 300, Buffer(2048, 1, 5, 8, {40, 3})),
      Raw("wal_full", 1000, Buffer(1024, 1, 6, 100, {60})),
      Raw("wal_empty", 64, Buffer(512, 1, 7, 0, {})),
      Raw("l0_appends", 100, Buffer(1024, 2, 1, 4, {100})),
      Raw("large_appends", 500, Buffer(1536, 3, 2, 3, {200, 1, 17})),
      Raw("index_appends", 200, Buffer(1024, 4, 9, 5, {30, 30})),
      Raw("zero", 0, std::string(256, '\0')),
      Built("built_whole", 0, 0, 0, 10, 2, 30),
      Built("built_torn", 1, 500, 0, 10, 1, 60),
      Built("built_flipped", 2, 0, 333, 10, 3, 20),
      Built("built_torn_and_flipped", 3, 800, 200, 12, 1, 50),
  };
}

}  // namespace
SLIPSTREAM_FUZZ_SEEDS(buffer_scan, BufferScanSeeds);
}  // namespace slipstream::fuzz
