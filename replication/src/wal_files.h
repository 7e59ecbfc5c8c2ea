// PostgreSQL WAL segment files, written from outside PostgreSQL: a backup's received WAL goes
// into its pg_wal (WalDirectoryStore), and slipstream_wal_restore writes a backup's WAL into a
// directory for pg_waldump or a takeover. The names and layout are PostgreSQL's (xlog_internal.h):
// segment `segno` of timeline `tli` holds WAL positions [segno * size, (segno + 1) * size).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "slipstream/replication/backup_store.h"

namespace slipstream::replication {

// The file name of WAL segment `segno` (PostgreSQL's XLogFileName).
std::string WalFileName(uint32_t timeline, uint64_t segno, uint64_t segment_size);

// Whether `size` is a WAL segment size PostgreSQL accepts (a power of two, 1 MB to 1 GB).
bool IsValidWalSegmentSize(uint64_t size);

// Writes WAL bytes at their positions into the segment files of one directory and one
// timeline. A missing segment file is created at full size, zero-filled, under a temporary name
// and renamed into place, so a reader (the standby's startup process) never sees it short. An
// existing file is written in place: PostgreSQL recycles old segments under future names, and
// its reader tells their stale pages apart by their page addresses.
//
// Not thread-safe.
class WalFileWriter {
 public:
  WalFileWriter(std::string directory, uint32_t timeline, uint64_t segment_size);
  ~WalFileWriter();  // closes (without syncing)
  WalFileWriter(const WalFileWriter&) = delete;
  WalFileWriter& operator=(const WalFileWriter&) = delete;

  // Writes `bytes` at WAL position `position`, across segment files as needed.
  Status Write(uint64_t position, std::string_view bytes);

  // Makes every write since the last Sync durable: fsyncs each file written and, when a file
  // was created, the directory. Closes the files.
  Status Sync();

 private:
  // The descriptor of segment `segno`'s file, opened (and created) on first use.
  Status Open(uint64_t segno, int* fd);
  // Creates a segment file at full size, zero-filled, and renames it into place.
  Status Create(const std::string& path);
  void CloseAll();

  std::string directory_;
  uint32_t timeline_;
  uint64_t segment_size_;
  std::map<uint64_t, int> open_;  // segno -> descriptor of files written since the last Sync
  bool created_ = false;          // a file was created since the last Sync
};

// Reads WAL positions [position, position + n) from the segment files of a directory into
// *out (IOError when a file is missing or short).
Status ReadWal(const std::string& directory, uint32_t timeline, uint64_t segment_size,
               uint64_t position, size_t n, std::string* out);

// Reads bytes [from, from + n) of a persisted record's payload from its file into *out.
Status ReadRecord(const std::vector<std::string>& files, const PersistedRecord& record,
                  uint32_t from, uint32_t n, std::string* out);

// Writes the payloads of the persisted `records` (ordered by position, each in
// files[record.file]) that continue the WAL at *end, up to the first gap, and syncs them; *end
// becomes the end of what is durably written, also on an error (when *end is 0, the first record
// starts the WAL).
// Records wholly below *end are skipped: they are there already.
Status WriteContiguousRecords(const std::vector<std::string>& files,
                              const std::vector<PersistedRecord>& records, WalFileWriter* writer,
                              uint64_t* end);

}  // namespace slipstream::replication
