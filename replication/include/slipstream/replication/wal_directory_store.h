// WalDirectoryStore: the store of a backup that is a PostgreSQL standby (standby.signal, no
// primary_conninfo). Every valid prefix it is handed is kept as a buffer image (a
// FileBackupStore: a backup that crashes in the middle of writing WAL redoes the write from
// it), and the WAL its records carry is written at its WAL positions into the standby's pg_wal,
// from which the startup process replays it.
//
// The WAL in pg_wal stays one gap-free stream: it starts where the standby's own WAL ended
// when the store was opened, a record that lies below its end is written again (the same
// bytes: harmless), and a record that starts beyond its end is refused with an error naming the
// gap, so a primary reconnects and resumes from ResumePosition() rather than leave a hole the
// startup process would stop at.
//
// The order of a persist, and why the backup answers after one fsync: the image is written and
// fsynced; the WAL is written into pg_wal (so a gap or a failed write still refuses the
// request); the answer goes out; then Settle() fsyncs pg_wal and moves the WAL end. The image
// must be durable before the answer: after a crash the images are all that tells the store how
// far pg_wal held WAL beyond the standby's replay position (Redo), and a resume position below
// what a FLUSH reported durable would make the store refuse the primary's next WAL as a gap, or
// a primary that released that WAL re-seed this backup. So the other order, pg_wal fsynced
// first and the image not, is not safe. pg_wal need not be durable before the answer: what a
// crash loses of it (all, a hole, a torn tail) lies beyond the WAL end the store gave out and is
// held by a durable image, so Open writes it again; the startup process stops at such damage
// (WAL records carry CRCs, pages their addresses) rather than replay past it, and is woken only
// once the WAL is fsynced (its own polling may read it between the write and the fsync, as it
// could before).
//
// Thread-safe: the backup server's sessions persist concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "slipstream/replication/backup_store.h"

namespace slipstream::replication {

class WalFileWriter;

struct WalDirectoryOptions {
  std::string image_directory;          // where buffer images are kept ($PGDATA/slipstream_backup)
  std::string wal_directory;            // the standby's pg_wal
  uint32_t timeline = 1;                // the timeline the standby replays (it names the files)
  uint64_t segment_size = 16ull << 20;  // the cluster's WAL segment size
  uint64_t resume = 0;  // where the standby's own WAL ends now (its replay position; 0: none)
};

class WalDirectoryStore : public BackupStore {
 public:
  // Validates the options, then redoes from the kept images the WAL that continues the
  // standby's own beyond `resume` (written before a crash, or never written because of it), so
  // that a primary need not ship again what this backup holds. Images that disagree with pg_wal
  // on the bytes just below `resume` are of another history and are left alone.
  static Status Open(const WalDirectoryOptions& options, std::unique_ptr<WalDirectoryStore>* store);
  ~WalDirectoryStore() override;  // settles

  // Writes and fsyncs the image, then writes into pg_wal the WAL of `records` that continues
  // it (an overlap again, harmlessly); a record beyond the WAL end is refused as a gap, and
  // what came before it stays written. pg_wal is not fsynced here: see Settle().
  Status Persist(const SegmentId& segment, const char* image, uint32_t from, uint32_t to,
                 const std::vector<engine::ScannedRecord>& records, bool closed) override;
  // fsyncs the WAL written into pg_wal since the last call; then WalEnd and ResumePosition
  // include it. After a failed fsync they do not, and the next record beyond them is a gap.
  Status Settle() override;
  Status LoadVersion(const std::string& primary, uint64_t* version) override;
  Status SaveVersion(const std::string& primary, uint64_t version) override;
  // WAL: the end of the gap-free WAL in pg_wal (never below the resume position it was opened
  // with), whichever primary asks; other streams: the end of their kept images.
  uint64_t ResumePosition(const std::string& primary, uint32_t stream) override;
  // Deletes the closed images (of every primary) whose WAL all ends at or below
  // min(upto, WalEnd()). `upto` must be WAL this standby never needs again from the images: its
  // oldest restart point. Why that keeps what the images are for: after a crash the store is
  // opened with `resume` = the standby's replay position, at or above its restart point (so at
  // or above every `upto` a prune was given: the restart point only moves up), and Redo reads
  // only records that end beyond `resume` (WriteContiguousRecords skips the others) plus, in
  // SameHistory, the record holding the byte just below it, which ends at or above `resume`
  // and so is pruned only if it ends exactly at `upto` = `resume` (then a record starting at
  // `resume` is redone unchecked, as when no image held that byte; a standby's replay
  // position, once consistent, is beyond its restart point's redo position, so that does not
  // happen in the extension). ResumePosition of the WAL is the WAL end and does not look at
  // images.
  Status Prune(uint32_t stream, uint64_t upto, const std::vector<SegmentId>& open,
               PruneStats* removed) override;

  // The end of the gap-free WAL in pg_wal, fsynced.
  uint64_t WalEnd();

 private:
  explicit WalDirectoryStore(const WalDirectoryOptions& options);
  // Writes the WAL of the kept images of every primary that continues the stream at end_.
  Status Redo();

  WalDirectoryOptions options_;
  FileBackupStore images_;
  std::mutex mu_;  // writer_, end_ and written_
  std::unique_ptr<WalFileWriter> writer_;
  uint64_t end_;      // of the gap-free WAL in pg_wal, fsynced
  uint64_t written_;  // of the gap-free WAL in pg_wal, perhaps not yet fsynced (>= end_)
};

}  // namespace slipstream::replication
