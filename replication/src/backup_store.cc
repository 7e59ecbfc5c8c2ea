// FileBackupStore: see backup_store.h.
#include "slipstream/replication/backup_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string_view>

#include "buffer_scan.h"
#include "slipstream/engine/log_scanner.h"

namespace slipstream::replication {

namespace {

Status Errno(const std::string& what) {
  return Status::IOError(what + ": " + std::strerror(errno));
}

// Writes all of [data, data + n) at `offset`.
Status WriteAll(int fd, const char* data, size_t n, off_t offset, const std::string& path) {
  while (n > 0) {
    ssize_t w = pwrite(fd, data, n, offset);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return Errno("write " + path);
    data += w;
    n -= size_t(w);
    offset += w;
  }
  return Status::OK();
}

// fsyncs a directory so that a file created or renamed in it survives a crash.
Status SyncDirectory(const std::string& dir) {
  int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("open " + dir);
  int rc = fsync(fd);
  close(fd);
  return rc == 0 ? Status::OK() : Errno("fsync " + dir);
}

// Reads a VERSION file's contents as SaveVersion writes them: the version's decimal digits (no
// sign, no leading zero) and a newline; false for anything else, a value past 2^64 - 1 included.
bool ParseVersion(std::string_view text, uint64_t* version) {
  if (text.size() < 2 || text.back() != '\n') return false;
  text.remove_suffix(1);
  if (text.size() > 1 && text.front() == '0') return false;  // SaveVersion writes no leading 0
  uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9' || __builtin_mul_overflow(value, uint64_t{10}, &value) ||
        __builtin_add_overflow(value, uint64_t(c - '0'), &value)) {
      return false;
    }
  }
  *version = value;
  return true;
}

}  // namespace

uint64_t ContiguousEnd(const std::vector<PersistedRecord>& records, uint64_t from) {
  uint64_t end = from;
  bool started = from != 0;
  for (const PersistedRecord& r : records) {
    if (!started) {
      end = r.position;
      started = true;
    }
    if (r.position > end) break;  // a gap: what lies beyond it is not contiguous
    end = std::max(end, r.position + r.length);
  }
  return end;
}

std::string FileBackupStore::SegmentPath(const SegmentId& segment) const {
  char name[64];
  std::snprintf(name, sizeof(name), "%s-%016" PRIx64, StreamName(segment.stream), segment.sequence);
  return directory_ + "/" + segment.primary + "/" + name;
}

std::vector<std::string> FileBackupStore::SegmentFiles(const std::string& primary,
                                                       uint32_t stream) const {
  std::vector<std::string> files;
  std::error_code ec;
  std::string prefix = std::string(StreamName(stream)) + "-";
  for (const auto& entry : std::filesystem::directory_iterator(directory_ + "/" + primary, ec)) {
    std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0) files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());  // fixed-width hex sequences sort by number
  return files;
}

// Names that are not primaries' (VERSION files, strays) are skipped, as a persist never makes them.
std::vector<std::string> FileBackupStore::Primaries() const {
  std::vector<std::string> primaries;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(directory_, ec)) {
    std::string name = entry.path().filename().string();
    if (entry.is_directory(ec) && IsValidName(name)) primaries.push_back(name);
  }
  std::sort(primaries.begin(), primaries.end());
  return primaries;
}

// Scans every file (a file is the valid prefix of a buffer, so the scan reads it whole); a
// damaged file is reported, and the records of the others are still listed.
Status FileBackupStore::PersistedRecords(const std::string& primary, uint32_t stream,
                                         std::vector<std::string>* files,
                                         std::vector<PersistedRecord>* records,
                                         std::vector<bool>* whole) const {
  *files = SegmentFiles(primary, stream);
  records->clear();
  if (whole != nullptr) whole->assign(files->size(), false);
  Status first_error;
  for (uint32_t f = 0; f < files->size(); f++) {
    const std::string& path = (*files)[f];
    FileScan scan;
    Status s = ScanFile(path, &scan);
    if (!s.ok()) {
      if (first_error.ok()) first_error = s;
      continue;
    }
    if (!scan.header_ok) {
      // A file created by a crash before its first write holds nothing; anything else is damage.
      if (scan.damaged && first_error.ok()) {
        first_error = Status::IOError(path + ": no valid segment header");
      }
      continue;
    }
    if (scan.kind != uint32_t(KindOfStream(stream))) {
      if (first_error.ok()) first_error = Status::IOError(path + ": a segment of another stream");
      continue;
    }
    if (whole != nullptr) (*whole)[f] = scan.whole;
    for (const PersistedRecord& r : scan.records) {
      records->push_back(PersistedRecord{r.position, r.length, f, r.offset});
    }
  }
  // Files are in sequence order, which follows the stream; a stable sort keeps ties in it.
  std::stable_sort(
      records->begin(), records->end(),
      [](const PersistedRecord& a, const PersistedRecord& b) { return a.position < b.position; });
  return first_error;
}

// Reads and scans a kept file, or takes the scan of it kept from before if the file has not
// changed since (same inode, size and modification time): a closed image never changes, and
// rereading every image at each prune cost the backup a full read of what it keeps every 30 s.
Status FileBackupStore::ScanFile(const std::string& path, FileScan* out) const {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return Errno("stat " + path);
  int64_t mtime = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  {
    std::lock_guard<std::mutex> lock(scan_mu_);
    auto it = scans_.find(path);
    if (it != scans_.end() && it->second.inode == uint64_t(st.st_ino) &&
        it->second.size == uint64_t(st.st_size) && it->second.mtime == mtime) {
      *out = it->second;
      return Status::OK();
    }
  }
  std::ifstream in(path, std::ios::binary);
  std::string image((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return Status::IOError("cannot read " + path);
  engine::LogScan scan = engine::ScanLogSegment(image.data(), image.size());
  FileScan result;
  result.inode = uint64_t(st.st_ino);
  result.size = uint64_t(st.st_size);
  result.mtime = mtime;
  result.header_ok = scan.header_ok;
  result.damaged = scan.stopped_at_damage;
  result.kind = scan.header.kind;
  // A persist writes exactly a valid prefix: bytes beyond it are damage or a stale tail.
  result.whole = scan.valid_end == image.size();
  for (const engine::ScannedRecord& r : scan.records) {
    if (r.type != engine::LogRecordType::kWal) continue;
    uint32_t offset = uint32_t(r.payload.data() - image.data());
    result.records.push_back(PersistedRecord{r.lsn, uint32_t(r.payload.size()), 0, offset});
  }
  // Kept only if what was read is what the stat saw (a persist may have grown it meanwhile).
  if (image.size() == uint64_t(st.st_size)) {
    std::lock_guard<std::mutex> lock(scan_mu_);
    scans_[path] = result;
  }
  *out = std::move(result);
  return Status::OK();
}

// A damaged file ends the contiguous run where its records would have been: the primary then
// ships that range again rather than leave a hole.
uint64_t FileBackupStore::ResumePosition(const std::string& primary, uint32_t stream) {
  StreamKey key(primary, stream);
  uint64_t persists;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = resume_.find(key);
    if (it != resume_.end()) return it->second;
    persists = persists_[key];
  }
  std::vector<std::string> files;
  std::vector<PersistedRecord> records;
  (void)PersistedRecords(primary, stream, &files, &records);
  uint64_t end = ContiguousEnd(records, 0);
  std::lock_guard<std::mutex> lock(mu_);
  if (persists_[key] == persists) resume_[key] = end;
  return end;
}

// A prune running meanwhile must see this write: the path is marked as being written, and as
// touched once written, so that the prune keeps the file (see PruneFiles).
Status FileBackupStore::Persist(const SegmentId& segment, const char* image, uint32_t from,
                                uint32_t to, const std::vector<engine::ScannedRecord>& records,
                                bool closed) {
  (void)records;
  (void)closed;
  std::string path = SegmentPath(segment);
  {
    std::lock_guard<std::mutex> lock(mu_);
    writing_[path]++;
  }
  Status s = WriteSegment(segment, path, image, from, to);
  // Whatever happened, the files may have changed: a kept ResumePosition answer is stale.
  std::lock_guard<std::mutex> lock(mu_);
  StreamKey key(segment.primary, segment.stream);
  persists_[key]++;
  resume_.erase(key);
  if (--writing_[path] == 0) writing_.erase(path);
  if (pruning_) touched_.insert(path);
  return s;
}

// Writes the new part at its offset, then fsyncs the file and, the first time, the directory.
Status FileBackupStore::WriteSegment(const SegmentId& segment, const std::string& path,
                                     const char* image, uint32_t from, uint32_t to) {
  std::string dir = directory_ + "/" + segment.primary;
  std::error_code ec;
  bool fresh = !std::filesystem::exists(dir, ec);
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IOError("create " + dir + ": " + ec.message());
  bool existed = std::filesystem::exists(path, ec);
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("open " + path);
  Status s = WriteAll(fd, image + from, to - from, off_t(from), path);
  if (s.ok() && fsync(fd) != 0) s = Errno("fsync " + path);
  close(fd);
  if (s.ok() && !existed) s = SyncDirectory(dir);
  if (s.ok() && fresh) s = SyncDirectory(directory_);
  return s;
}

Status FileBackupStore::Prune(uint32_t stream, uint64_t upto, const std::vector<SegmentId>& open,
                              PruneStats* removed) {
  return PruneFiles(stream, upto, open, /*keep_resume=*/true, removed);
}

// Scans without holding mu_ (persists go on meanwhile), then unlinks under it: a file being
// written, or written since the scan began, is kept, since what the scan saw of it may be
// stale; a file persisted only after its unlink is created afresh, which is safe because only
// a buffer opened after `open` was taken can do that, and its first persist writes from 0.
Status FileBackupStore::PruneFiles(uint32_t stream, uint64_t upto,
                                   const std::vector<SegmentId>& open, bool keep_resume,
                                   PruneStats* removed) {
  PruneStats stats;
  if (removed != nullptr) *removed = stats;
  // The WAL's images, and the index stream's (below what a replica installed): the engine's
  // own log streams are kept whole.
  if (stream != uint32_t(StreamId::kWal) && stream != uint32_t(StreamId::kEngineIndex)) {
    return Status::OK();
  }
  std::lock_guard<std::mutex> one(prune_mu_);
  std::set<std::string> open_paths;
  for (const SegmentId& segment : open) {
    if (segment.stream == stream) open_paths.insert(SegmentPath(segment));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    pruning_ = true;
    touched_.clear();
  }
  Status first_error;
  std::vector<std::string> doomed;
  std::vector<std::string> primaries = Primaries();
  for (const std::string& primary : primaries) {
    std::vector<std::string> files;
    std::vector<PersistedRecord> records;
    std::vector<bool> whole;
    Status s = PersistedRecords(primary, stream, &files, &records, &whole);
    if (!s.ok() && first_error.ok()) first_error = s;  // reported; the damaged file stays
    std::vector<uint64_t> end(files.size(), 0);        // of each file's highest record
    for (const PersistedRecord& r : records) {
      end[r.file] = std::max(end[r.file], r.position + r.length);
    }
    // Which files go when those ending above `limit` stay.
    auto choose = [&](uint64_t limit, bool strictly) {
      std::vector<bool> gone(files.size(), false);
      for (uint32_t f = 0; f < files.size(); f++) {
        bool below = strictly ? end[f] < limit : end[f] <= limit;
        gone[f] = whole[f] && below && open_paths.count(files[f]) == 0;
      }
      return gone;
    };
    // The end of the contiguous run of the records of the files that stay.
    auto kept_end = [&](const std::vector<bool>& gone) {
      std::vector<PersistedRecord> kept;
      for (const PersistedRecord& r : records) {
        if (!gone[r.file]) kept.push_back(r);
      }
      return ContiguousEnd(kept, 0);
    };
    std::vector<bool> gone = choose(upto, false);
    if (keep_resume) {
      // ResumePosition starts the run at the first record kept: with every record that ends at
      // or below the resume position gone, it would start beyond a gap and hide it.
      uint64_t resume = ContiguousEnd(records, 0);
      if (kept_end(gone) != resume) gone = choose(std::min(upto, resume), true);
      if (kept_end(gone) != resume) gone.assign(files.size(), false);
    }
    for (uint32_t f = 0; f < files.size(); f++) {
      if (gone[f]) doomed.push_back(files[f]);
    }
  }
  std::set<std::string> directories;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::string& path : doomed) {
      if (writing_.count(path) != 0 || touched_.count(path) != 0) continue;
      struct stat st;
      uint64_t size = stat(path.c_str(), &st) == 0 ? uint64_t(st.st_size) : 0;
      if (unlink(path.c_str()) != 0) {
        if (first_error.ok()) first_error = Errno("unlink " + path);
        continue;
      }
      stats.files++;
      stats.bytes += size;
      {
        std::lock_guard<std::mutex> scans(scan_mu_);
        scans_.erase(path);
      }
      directories.insert(std::filesystem::path(path).parent_path().string());
    }
    pruning_ = false;
    touched_.clear();
    // A ResumePosition scan that ran meanwhile may have read a file that is gone now.
    for (const std::string& primary : primaries) {
      StreamKey key(primary, stream);
      persists_[key]++;
      resume_.erase(key);
    }
  }
  // Once per directory: an unlink lost to a crash only brings back a file pruned again later.
  for (const std::string& dir : directories) {
    Status s = SyncDirectory(dir);
    if (!s.ok() && first_error.ok()) first_error = s;
  }
  if (removed != nullptr) *removed = stats;
  return first_error;
}

// Only what SaveVersion writes is read: strtoull took "-1" or a number past 2^64 for the
// largest version, which fenced the primary for good, and trailing damage went unnoticed.
Status FileBackupStore::LoadVersion(const std::string& primary, uint64_t* version) {
  *version = 0;
  std::string path = directory_ + "/" + primary + "/VERSION";
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? Status::OK() : Errno("open " + path);
  char buf[32] = {};
  ssize_t n = read(fd, buf, sizeof(buf));
  close(fd);
  if (n <= 0) return Status::IOError(path + " is empty or unreadable");
  if (!ParseVersion(std::string_view(buf, size_t(n)), version)) {
    return Status::IOError(path + " does not hold a version (decimal digits and a newline)");
  }
  return Status::OK();
}

// Write to a temporary, fsync, rename, fsync the directory: a crash leaves the old or the new.
Status FileBackupStore::SaveVersion(const std::string& primary, uint64_t version) {
  std::string dir = directory_ + "/" + primary;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IOError("create " + dir + ": " + ec.message());
  std::string tmp = dir + "/VERSION.tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("open " + tmp);
  std::string text = std::to_string(version) + "\n";
  Status s = WriteAll(fd, text.data(), text.size(), 0, tmp);
  if (s.ok() && fsync(fd) != 0) s = Errno("fsync " + tmp);
  close(fd);
  if (s.ok() && rename(tmp.c_str(), (dir + "/VERSION").c_str()) != 0) s = Errno("rename " + tmp);
  if (s.ok()) s = SyncDirectory(dir);
  return s;
}

}  // namespace slipstream::replication
