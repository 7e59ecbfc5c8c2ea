// slipstream_wal_restore: writes the WAL a backup holds for a primary back into WAL segment
// files, the first step of taking over (and what tests check acknowledged commits against).
//
//   slipstream_wal_restore BACKUP_DIR PRIMARY OUT_DIR [--timeline=N] [--segment-size=BYTES]
//
// BACKUP_DIR is $PGDATA/slipstream_backup of the backup. Every persisted segment of the
// primary's WAL stream is scanned (only its valid prefix counts: Tailwind's scan), and each
// record's bytes are written at their WAL position into OUT_DIR/<WAL file name>. Prints the
// first and the end WAL position restored; fails when the stream has a gap.
#include <fcntl.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "buffer_scan.h"
#include "slipstream/engine/log_scanner.h"
#include "slipstream/replication/backup_store.h"

namespace {

using namespace slipstream;

// The WAL file name of segment `segno` (PostgreSQL's XLogFileName).
std::string WalFileName(uint32_t timeline, uint64_t segno, uint64_t segment_size) {
  uint64_t per_id = 0x100000000ull / segment_size;
  char name[32];
  std::snprintf(name, sizeof(name), "%08X%08X%08X", timeline, uint32_t(segno / per_id),
                uint32_t(segno % per_id));
  return name;
}

// Writes WAL bytes at their position, across segment files (created zero-filled).
bool WriteWal(const std::string& out, uint32_t timeline, uint64_t segment_size, uint64_t lsn,
              std::string_view bytes) {
  while (!bytes.empty()) {
    uint64_t segno = lsn / segment_size;
    uint64_t offset = lsn % segment_size;
    size_t n = std::min<uint64_t>(bytes.size(), segment_size - offset);
    std::string path = out + "/" + WalFileName(timeline, segno, segment_size);
    int fd = open(path.c_str(), O_WRONLY | O_CREAT, 0600);
    if (fd < 0 || ftruncate(fd, off_t(segment_size)) != 0 ||
        pwrite(fd, bytes.data(), n, off_t(offset)) != ssize_t(n) || fsync(fd) != 0) {
      std::perror(path.c_str());
      if (fd >= 0) close(fd);
      return false;
    }
    close(fd);
    bytes.remove_prefix(n);
    lsn += n;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
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
  replication::FileBackupStore store(argv[1]);
  uint64_t first = 0, end = 0;
  bool any = false;
  for (const std::string& file :
       store.SegmentFiles(argv[2], uint32_t(replication::StreamId::kWal))) {
    std::ifstream in(file, std::ios::binary);
    std::string image((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    engine::LogScan scan = engine::ScanLogSegment(image.data(), image.size());
    if (!scan.header_ok) {
      std::fprintf(stderr, "%s: no valid segment header\n", file.c_str());
      return 1;
    }
    for (const engine::ScannedRecord& r : scan.records) {
      if (r.type != engine::LogRecordType::kWal) continue;
      if (any && r.lsn != end) {
        // A reconnect resumes where the backup had placed up to: an overlap is the same bytes.
        if (r.lsn > end) {
          std::fprintf(stderr,
                       "gap in the WAL stream at %" PRIx64 " (next record at %" PRIx64 ")\n", end,
                       r.lsn);
          return 1;
        }
      }
      if (!WriteWal(argv[3], timeline, segment_size, r.lsn, r.payload)) return 1;
      if (!any) first = r.lsn;
      any = true;
      end = std::max<uint64_t>(end, r.lsn + r.payload.size());
    }
  }
  if (!any) {
    std::fprintf(stderr, "no WAL of primary %s in %s\n", argv[2], argv[1]);
    return 1;
  }
  std::printf("%X/%X %X/%X\n", uint32_t(first >> 32), uint32_t(first), uint32_t(end >> 32),
              uint32_t(end));
  return 0;
}
