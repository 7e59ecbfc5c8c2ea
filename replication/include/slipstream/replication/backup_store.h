// BackupStore: where a backup makes the buffers it received durable. The backup server hands
// it valid prefixes only (found by the Tailwind scan), each with the records the scan found
// beyond the previous one; what the store does with them is its business: FileBackupStore keeps
// buffer images as files (tests, tools, a backup that is only an archive), WalDirectoryStore
// (wal_directory_store.h) also writes the WAL they carry into the pg_wal of a backup that is a
// PostgreSQL standby.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "slipstream/engine/log_scanner.h"
#include "slipstream/replication/wire.h"

namespace slipstream::replication {

// Identifies one buffer's contents: a segment of a primary's stream.
struct SegmentId {
  std::string primary;
  uint32_t stream = 0;
  uint64_t sequence = 0;
  uint64_t start = 0;  // stream position of the segment's first record (WAL: an LSN)
};

// What a prune removed.
struct PruneStats {
  uint64_t files = 0;
  uint64_t bytes = 0;
};

class BackupStore {
 public:
  virtual ~BackupStore() = default;

  // Makes image[0, to) of a segment durable, of which [0, from) already is: `to` ends a valid
  // prefix, and `from` is the `to` of the previous call for the segment (0 at first).
  // `records` are the valid records at offsets in [from, to), as the scan that found `to`
  // listed them (their payloads point into `image`): a store needs no scan of its own, so a
  // persist costs the new bytes only. `closed`: no more bytes will follow.
  virtual Status Persist(const SegmentId& segment, const char* image, uint32_t from, uint32_t to,
                         const std::vector<engine::ScannedRecord>& records, bool closed) = 0;

  // Does what a store leaves off the path of the answer to the request that persisted: the
  // backup server calls it after answering, once requests pause for 2 ms or 20 ms after the
  // first unsettled one (and when a session ends). What Persist returned OK for is durable already;
  // what Settle does is not needed for that (WalDirectoryStore: the fsync of the WAL written into
  // pg_wal, which its images can redo). The default does nothing.
  virtual Status Settle() { return Status::OK(); }

  // The highest version seen for a primary (0: none), and recording a higher one durably.
  virtual Status LoadVersion(const std::string& primary, uint64_t* version) = 0;
  virtual Status SaveVersion(const std::string& primary, uint64_t version) = 0;

  // The stream position where the durably persisted, gap-free copy of a primary's stream ends
  // (0: the store holds none of it). A reconnecting primary ships from there.
  virtual uint64_t ResumePosition(const std::string& primary, uint32_t stream) = 0;

  // A primary's new session ships `stream` from `position` on (its resume position, given in
  // the hello's answer): what the stream holds before it may end in a piece the old session
  // never completed. Told before the answer goes out; the default ignores it.
  virtual Status NoteSessionStart(const std::string& primary, uint32_t stream, uint64_t position) {
    (void)primary;
    (void)stream;
    (void)position;
    return Status::OK();
  }

  // Deletes what the store keeps of `stream` that is no longer needed: segments, of every
  // primary, whose records all end at or below `upto` and that are not in `open` (the server
  // still appends to an open buffer and persists it from an offset, so its file must stay).
  // The caller vouches that no one needs the stream below `upto` again (a standby: its oldest
  // restart point). *removed (may be null) gets what went. The default keeps everything.
  virtual Status Prune(uint32_t stream, uint64_t upto, const std::vector<SegmentId>& open,
                       PruneStats* removed) {
    (void)stream;
    (void)upto;
    (void)open;
    if (removed != nullptr) *removed = PruneStats{};
    return Status::OK();
  }
};

// Where one valid record of a persisted segment lies: its stream position and length, the
// file holding it (an index into the file list it came with) and its payload's offset there.
struct PersistedRecord {
  uint64_t position = 0;
  uint32_t length = 0;
  uint32_t file = 0;
  uint32_t offset = 0;
};

// The end of the contiguous run of `records` (ordered by position) that starts at or below
// `from` and reaches beyond it; `from` if none does. With from = 0 the run starts at the first
// record.
uint64_t ContiguousEnd(const std::vector<PersistedRecord>& records, uint64_t from);

// Keeps each segment as the file DIR/PRIMARY/STREAM-SEQUENCE (the image prefix, fsynced) and
// each primary's version in DIR/PRIMARY/VERSION.
class FileBackupStore : public BackupStore {
 public:
  explicit FileBackupStore(std::string directory) : directory_(std::move(directory)) {}

  // Writes image[from, to) and fsyncs it before returning (the records are not needed).
  Status Persist(const SegmentId& segment, const char* image, uint32_t from, uint32_t to,
                 const std::vector<engine::ScannedRecord>& records, bool closed) override;
  Status LoadVersion(const std::string& primary, uint64_t* version) override;
  Status SaveVersion(const std::string& primary, uint64_t version) override;
  // The end of the contiguous records of the persisted segments: every file is scanned, once
  // after each persist to the stream (the answer is kept until then).
  uint64_t ResumePosition(const std::string& primary, uint32_t stream) override;
  // PruneFiles with keep_resume: what ResumePosition answers stays what it was.
  Status Prune(uint32_t stream, uint64_t upto, const std::vector<SegmentId>& open,
               PruneStats* removed) override;

  // Unlinks the segment files of `stream` (the WAL or the index stream; the engine's log
  // streams keep theirs) of every
  // primary whose records all end at or below `upto` and that are not open; fsyncs each
  // directory it removed from. A file that is not wholly a valid prefix (no header, damage, a
  // stale tail) is kept, a file persisted while the prune ran is kept, and the errors
  // PersistedRecords reports are returned after the others were pruned. `keep_resume`: for a
  // primary whose files would then give another ResumePosition (its first kept record beyond
  // a gap), `upto` is lowered to below the end of its contiguous records, or nothing of it is
  // removed.
  Status PruneFiles(uint32_t stream, uint64_t upto, const std::vector<SegmentId>& open,
                    bool keep_resume, PruneStats* removed);

  // The path of a segment's file.
  std::string SegmentPath(const SegmentId& segment) const;
  // Every segment file of a primary's stream, by sequence.
  std::vector<std::string> SegmentFiles(const std::string& primary, uint32_t stream) const;
  // The primaries with a directory here.
  std::vector<std::string> Primaries() const;
  // The valid records of every persisted segment of a primary's stream, ordered by position
  // (overlaps, from a primary that shipped a range again, included); `files` gets
  // SegmentFiles(). A file without a valid header of the stream's kind is an error. `whole`
  // (may be null) gets, per file, whether it was read and is a valid prefix to its last byte.
  Status PersistedRecords(const std::string& primary, uint32_t stream,
                          std::vector<std::string>* files, std::vector<PersistedRecord>* records,
                          std::vector<bool>* whole = nullptr) const;

 private:
  using StreamKey = std::pair<std::string, uint32_t>;  // primary, stream

  // What a scan of one kept file found, with what identifies the file's version.
  struct FileScan {
    uint64_t inode = 0, size = 0;
    int64_t mtime = 0;
    bool header_ok = false, damaged = false, whole = false;
    uint32_t kind = 0;
    std::vector<PersistedRecord> records;  // file index 0: the caller's is set when copied
  };
  Status ScanFile(const std::string& path, FileScan* out) const;

  // Persist's file work: writes image[from, to) into `path` and fsyncs what it must.
  Status WriteSegment(const SegmentId& segment, const std::string& path, const char* image,
                      uint32_t from, uint32_t to);

  std::string directory_;
  std::mutex mu_;  // resume_, persists_, writing_, pruning_, touched_
  // ResumePosition's answer per stream, and the persists to the stream counted so far: an
  // answer is kept only if no persist happened while its scan ran.
  std::map<StreamKey, uint64_t> resume_;
  std::map<StreamKey, uint64_t> persists_;
  // A prune must not unlink a file a persist is writing, nor one whose scan a persist made
  // stale: the paths being persisted now, and those persisted since the running prune began.
  std::map<std::string, uint32_t> writing_;
  bool pruning_ = false;
  std::set<std::string> touched_;
  std::mutex prune_mu_;  // one prune at a time
  mutable std::mutex scan_mu_;
  mutable std::map<std::string, FileScan> scans_;  // by path; a changed file is read again
};

}  // namespace slipstream::replication
