// Seeds for backup_files_fuzz: VERSION files as SaveVersion writes them, and kept images of
// each stream as a backup persists them (valid prefixes of buffers the log writer filled).
#include <string>
#include <vector>

#include "buffer_scan.h"
#include "fuzz_input.h"
#include "seeds.h"
#include "slipstream/engine/log_writer.h"

namespace slipstream::fuzz {
namespace {

using namespace replication;

// A kept image: the valid prefix of a buffer of segment `sequence` of `stream` whose appends
// carry `per_append` bytes each from stream position `position` on.
std::string Image(uint32_t stream, uint64_t sequence, uint64_t position, int appends,
                  size_t per_append) {
  std::string buffer(4096, '\0');
  engine::LogCursor cursor;
  engine::StartLogSegment(buffer.data(), uint32_t(buffer.size()), KindOfStream(stream), sequence, 0,
                          0xabcdef, &cursor);
  for (int a = 0; a < appends; a++) {
    std::string payload(per_append, char('0' + a % 10));
    engine::AppendRecord(buffer.data(), &cursor, engine::LogRecordType::kWal, position, {payload});
    engine::AppendChecksum(buffer.data(), &cursor);
    position += per_append;
  }
  buffer.resize(cursor.pos);
  return buffer;
}

// The input: stream, VERSION text, a version to save, the first image, the second.
Seed Files(const std::string& name, uint32_t stream, const std::string& version, uint64_t save,
           const std::string& first, const std::string& second) {
  Seed seed{name, ""};
  PutLittleEndian(&seed.bytes, stream - 1, 1);
  PutLittleEndian(&seed.bytes, version.size(), 1);
  seed.bytes += version;
  PutLittleEndian(&seed.bytes, save, 8);
  PutLittleEndian(&seed.bytes, first.size(), 2);
  return Seed{name, seed.bytes + first + second};
}

// Contiguous, overlapping and gapped images of the WAL, images of the other streams, a torn
// one, and VERSION files as they are written.
std::vector<Seed> BackupFilesSeeds() {
  const std::string a = Image(1, 1, 1000, 5, 100);
  const std::string b = Image(1, 2, 1500, 4, 60);
  std::string torn = Image(1, 3, 1740, 3, 50);
  torn.resize(torn.size() - 3);
  return {
      Files("wal_contiguous", 1, "7\n", 8, a, b),
      Files("wal_overlap", 1, "18446744073709551615\n", 3, a, Image(1, 2, 1200, 6, 90)),
      Files("wal_gap", 1, "0\n", 0, a, Image(1, 2, 9000, 2, 10)),
      Files("wal_torn", 1, "12\n", 13, b, torn),
      Files("index", 4, "3\n", 4, Image(4, 1, 0, 3, 200), Image(4, 2, 600, 1, 30)),
      Files("l0", 2, "1\n", 1, Image(2, 1, 0, 2, 20), ""),
      Files("no_version", 1, "", 2, a, ""),
  };
}

}  // namespace
SLIPSTREAM_FUZZ_SEEDS(backup_files, BackupFilesSeeds);
}  // namespace slipstream::fuzz
