// WalDirectoryStore: see wal_directory_store.h.
#include "slipstream/replication/wal_directory_store.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "slipstream/engine/log_scanner.h"
#include "wal_files.h"

namespace slipstream::replication {

namespace {

constexpr uint32_t kWalStream = uint32_t(StreamId::kWal);

// A WAL position as PostgreSQL prints it (%X/%X).
std::string Lsn(uint64_t position) {
  char text[32];
  std::snprintf(text, sizeof(text), "%X/%X", uint32_t(position >> 32), uint32_t(position));
  return text;
}

Status Gap(const std::string& primary, uint64_t end, uint64_t next) {
  return Status::InvalidArgument("gap in the WAL of primary " + primary +
                                 ": this backup's WAL ends at " + Lsn(end) +
                                 " but the next record starts at " + Lsn(next) +
                                 "; not written (the primary must resume at " + Lsn(end) + ")");
}

// Bytes compared where kept images and pg_wal both hold the WAL.
constexpr uint64_t kHistoryCheck = 64 * 1024;

// Whether the kept images (`records`, by position) continue the WAL that pg_wal holds below
// `end` as the same history: the bytes just below `end` that an image holds too must be equal.
// Images copied from another node (say, a promoted backup's, by a base backup) may hold another
// history at the same positions; redoing them would break the standby's WAL. Images that start
// at `end` exactly have nothing to compare and continue it (a primary that shipped from the
// resume position this store gave).
bool SameHistory(const WalDirectoryOptions& o, const std::vector<std::string>& files,
                 const std::vector<PersistedRecord>& records, uint64_t end) {
  // An image record holding the byte just below `end`. Without one, only a record that starts
  // at `end` exactly can be redone, and there is nothing to compare.
  const PersistedRecord* holder = nullptr;
  for (const PersistedRecord& r : records) {
    if (r.position >= end) break;
    if (r.position + r.length >= end) holder = &r;
  }
  if (holder == nullptr) return true;
  // Within the segment of that byte: the one pg_wal surely still holds.
  uint64_t from = std::max({holder->position, end > kHistoryCheck ? end - kHistoryCheck : 0,
                            (end - 1) / o.segment_size * o.segment_size});
  std::string image, wal;
  return ReadRecord(files, *holder, uint32_t(from - holder->position), uint32_t(end - from), &image)
             .ok() &&
         ReadWal(o.wal_directory, o.timeline, o.segment_size, from, size_t(end - from), &wal)
             .ok() &&
         image == wal;
}

}  // namespace

WalDirectoryStore::WalDirectoryStore(const WalDirectoryOptions& options)
    : options_(options),
      images_(options.image_directory),
      writer_(std::make_unique<WalFileWriter>(options.wal_directory, options.timeline,
                                              options.segment_size)),
      end_(options.resume),
      written_(options.resume) {}

// What was written and not yet settled is fsynced (or, on an error, left to Redo).
WalDirectoryStore::~WalDirectoryStore() {
  (void)Settle();
}

Status WalDirectoryStore::Open(const WalDirectoryOptions& options,
                               std::unique_ptr<WalDirectoryStore>* store) {
  if (!IsValidWalSegmentSize(options.segment_size)) {
    return Status::InvalidArgument("the WAL segment size must be a power of two from 1 MB to 1 GB");
  }
  if (options.timeline == 0) return Status::InvalidArgument("timeline 0 does not exist");
  std::error_code ec;
  if (!std::filesystem::is_directory(options.wal_directory, ec)) {
    return Status::InvalidArgument(options.wal_directory + " is not a directory");
  }
  std::unique_ptr<WalDirectoryStore> s(new WalDirectoryStore(options));
  Status st = s->Redo();
  if (!st.ok()) return st;
  *store = std::move(s);
  return Status::OK();
}

// Records of every primary's images, by position; those that continue the stream at end_ are
// written. A damaged image ends the redo where its records would have been.
Status WalDirectoryStore::Redo() {
  std::vector<std::string> files;
  std::vector<PersistedRecord> records;
  for (const std::string& primary : images_.Primaries()) {
    std::vector<std::string> of_files;
    std::vector<PersistedRecord> of_records;
    (void)images_.PersistedRecords(primary, kWalStream, &of_files, &of_records);
    for (PersistedRecord r : of_records) {
      r.file += uint32_t(files.size());
      records.push_back(r);
    }
    files.insert(files.end(), of_files.begin(), of_files.end());
  }
  std::stable_sort(
      records.begin(), records.end(),
      [](const PersistedRecord& a, const PersistedRecord& b) { return a.position < b.position; });
  std::lock_guard<std::mutex> lock(mu_);
  if (end_ != 0 && !SameHistory(options_, files, records, end_)) return Status::OK();
  Status s = WriteContiguousRecords(files, records, writer_.get(), &end_);
  written_ = end_;  // fsynced
  return s;
}

// The image first, fsynced: once it is durable, the WAL it carries survives a crash whatever
// becomes of the writes into pg_wal (Redo). See the header for why pg_wal waits for Settle().
Status WalDirectoryStore::Persist(const SegmentId& segment, const char* image, uint32_t from,
                                  uint32_t to, const std::vector<engine::ScannedRecord>& records,
                                  bool closed) {
  Status s = images_.Persist(segment, image, from, to, records, closed);
  if (!s.ok() || segment.stream != kWalStream) return s;
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t end = written_;  // what is written into pg_wal
  uint64_t reach = end;     // ... or about to be: the end of `run`
  bool wrote = false;
  // Records that follow each other are written together (one pwrite instead of one per
  // commit).
  std::string run;
  uint64_t run_at = 0;
  auto write_run = [&]() {
    Status w = run.empty() ? Status::OK() : writer_->Write(run_at, run);
    if (w.ok() && !run.empty()) {
      end = std::max(end, run_at + run.size());
      wrote = true;
    }
    run.clear();
    return w;
  };
  for (const engine::ScannedRecord& r : records) {
    if (r.offset < from || r.type != engine::LogRecordType::kWal) continue;  // done before
    if (reach == 0) reach = r.lsn;  // the first WAL this store holds
    if (r.lsn > reach) {
      s = write_run();
      if (s.ok()) s = Gap(segment.primary, reach, r.lsn);
      break;
    }
    if (r.lsn != run_at + run.size() || run.empty()) {
      s = write_run();
      if (!s.ok()) break;
      run_at = r.lsn;
    }
    run.append(r.payload);
    reach = std::max(reach, r.lsn + r.payload.size());
  }
  if (s.ok()) s = write_run();
  // What was written before a gap or an error is kept: it continues the stream.
  if (wrote) written_ = end;
  return s;
}

// A failed fsync may have dropped the written pages (Linux marks them clean): the WAL end stays,
// and what lies beyond it is written again when a primary ships it again.
Status WalDirectoryStore::Settle() {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t written = written_;
  Status s = writer_->Sync();
  if (s.ok()) {
    end_ = written;
  } else {
    written_ = end_;
  }
  return s;
}

Status WalDirectoryStore::LoadVersion(const std::string& primary, uint64_t* version) {
  return images_.LoadVersion(primary, version);
}

Status WalDirectoryStore::SaveVersion(const std::string& primary, uint64_t version) {
  return images_.SaveVersion(primary, version);
}

uint64_t WalDirectoryStore::ResumePosition(const std::string& primary, uint32_t stream) {
  if (stream != kWalStream) return images_.ResumePosition(primary, stream);
  return WalEnd();
}

// Capped at the WAL end: an image holding WAL that pg_wal may not hold durably yet is what
// Redo would need after a crash. The images' own contiguous end is not kept (keep_resume
// false): the WAL's resume position is the WAL end, and an image whose WAL was refused as a gap
// would otherwise pin every image above it forever.
Status WalDirectoryStore::Prune(uint32_t stream, uint64_t upto, const std::vector<SegmentId>& open,
                                PruneStats* removed) {
  return images_.PruneFiles(stream, std::min(upto, WalEnd()), open, /*keep_resume=*/false, removed);
}

uint64_t WalDirectoryStore::WalEnd() {
  std::lock_guard<std::mutex> lock(mu_);
  return end_;
}

}  // namespace slipstream::replication
