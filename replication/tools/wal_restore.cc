// slipstream_wal_restore: writes the WAL a backup holds for a primary back into WAL segment
// files, the first step of taking over (and what tests check acknowledged commits against).
//
//   slipstream_wal_restore BACKUP_DIR PRIMARY OUT_DIR [--timeline=N] [--segment-size=BYTES]
//
// BACKUP_DIR is $PGDATA/slipstream_backup of the backup. Every persisted segment of the
// primary's WAL stream is scanned (only its valid prefix counts: Tailwind's scan), and each
// record's bytes are written at their WAL position into OUT_DIR/<WAL file name> (wal_files.h).
// Prints the first and the end WAL position restored; fails when the stream has a gap.
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "slipstream/replication/backup_store.h"
#include "wal_files.h"

int main(int argc, char** argv) {
  using namespace slipstream::replication;
  if (argc < 4) {
    std::fprintf(stderr,
                 "usage: %s BACKUP_DIR PRIMARY OUT_DIR [--timeline=N] [--segment-size=BYTES]\n",
                 argv[0]);
    return 2;
  }
  uint32_t timeline = 1;
  uint64_t segment_size = 16ull << 20;
  for (int i = 4; i < argc; i++) {
    if (std::sscanf(argv[i], "--timeline=%u", &timeline) == 1) continue;
    if (std::sscanf(argv[i], "--segment-size=%" SCNu64, &segment_size) == 1) continue;
    std::fprintf(stderr, "unknown argument %s\n", argv[i]);
    return 2;
  }
  if (!IsValidWalSegmentSize(segment_size)) {
    std::fprintf(stderr, "--segment-size must be a power of two from 1 MB to 1 GB\n");
    return 2;
  }
  FileBackupStore store(argv[1]);
  std::vector<std::string> files;
  std::vector<PersistedRecord> records;
  Status s = store.PersistedRecords(argv[2], uint32_t(StreamId::kWal), &files, &records);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  if (records.empty()) {
    std::fprintf(stderr, "no WAL of primary %s in %s\n", argv[2], argv[1]);
    return 1;
  }
  // Records come by position; a reconnect may have shipped a range again (the same bytes).
  WalFileWriter writer(argv[3], timeline, segment_size);
  uint64_t first = records[0].position, end = 0;
  s = WriteContiguousRecords(files, records, &writer, &end);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  for (const PersistedRecord& r : records) {
    if (r.position > end) {
      std::fprintf(stderr, "gap in the WAL stream at %" PRIx64 " (next record at %" PRIx64 ")\n",
                   end, r.position);
      return 1;
    }
  }
  std::printf("%X/%X %X/%X\n", uint32_t(first >> 32), uint32_t(first), uint32_t(end >> 32),
              uint32_t(end));
  return 0;
}
