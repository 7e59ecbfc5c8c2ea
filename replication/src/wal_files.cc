// WalFileName and WalFileWriter: see wal_files.h.
#include "wal_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

namespace slipstream::replication {

namespace {

// Files written before Sync closes them all at once; more are synced and closed early.
constexpr size_t kMaxOpenFiles = 16;

Status Errno(const std::string& what) {
  return Status::IOError(what + ": " + std::strerror(errno));
}

// A temporary name no other writer in this process or another uses. PostgreSQL removes files
// named xlogtemp.* from pg_wal when it starts, so a crash mid-create leaves nothing behind.
std::string TempName(const std::string& directory) {
  static std::atomic<uint64_t> counter{0};
  return directory + "/xlogtemp.slipstream." + std::to_string(getpid()) + "." +
         std::to_string(counter.fetch_add(1));
}

}  // namespace

std::string WalFileName(uint32_t timeline, uint64_t segno, uint64_t segment_size) {
  uint64_t per_id = 0x100000000ull / segment_size;
  char name[32];
  std::snprintf(name, sizeof(name), "%08X%08X%08X", timeline, uint32_t(segno / per_id),
                uint32_t(segno % per_id));
  return name;
}

bool IsValidWalSegmentSize(uint64_t size) {
  return size >= (1ull << 20) && size <= (1ull << 30) && (size & (size - 1)) == 0;
}

WalFileWriter::WalFileWriter(std::string directory, uint32_t timeline, uint64_t segment_size)
    : directory_(std::move(directory)), timeline_(timeline), segment_size_(segment_size) {}

WalFileWriter::~WalFileWriter() {
  CloseAll();
}

void WalFileWriter::CloseAll() {
  for (auto& [segno, fd] : open_) close(fd);
  open_.clear();
}

// The file is complete (full size, zeros written, synced) before its name appears; link()
// rather than rename() so that a file someone else installed meanwhile is used, never
// replaced. Zeros are written, not a hole left (as PostgreSQL fills its WAL segments): later
// writes then overwrite allocated blocks, and fdatasync has no metadata to commit.
Status WalFileWriter::Create(const std::string& path) {
  std::string tmp = TempName(directory_);
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("create " + tmp);
  Status s;
  const std::string zeros(std::min<uint64_t>(segment_size_, 1u << 20), '\0');
  for (uint64_t done = 0; s.ok() && done < segment_size_; done += zeros.size()) {
    size_t n = size_t(std::min<uint64_t>(zeros.size(), segment_size_ - done));
    if (pwrite(fd, zeros.data(), n, off_t(done)) != ssize_t(n)) s = Errno("fill " + tmp);
  }
  if (s.ok() && fsync(fd) != 0) s = Errno("fsync " + tmp);
  close(fd);
  if (s.ok() && link(tmp.c_str(), path.c_str()) != 0 && errno != EEXIST) {
    s = Errno("link " + tmp + " to " + path);
  }
  unlink(tmp.c_str());
  if (s.ok()) created_ = true;
  return s;
}

Status WalFileWriter::Open(uint64_t segno, int* fd) {
  auto it = open_.find(segno);
  if (it != open_.end()) {
    *fd = it->second;
    return Status::OK();
  }
  if (open_.size() >= kMaxOpenFiles) {
    for (auto& [n, f] : open_) {
      if (fdatasync(f) != 0) return Errno("fdatasync " + WalFileName(timeline_, n, segment_size_));
    }
    CloseAll();
  }
  std::string path = directory_ + "/" + WalFileName(timeline_, segno, segment_size_);
  int f = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (f < 0 && errno == ENOENT) {
    Status s = Create(path);
    if (!s.ok()) return s;
    f = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  }
  if (f < 0) return Errno("open " + path);
  open_[segno] = f;
  *fd = f;
  return Status::OK();
}

Status WalFileWriter::Write(uint64_t position, std::string_view bytes) {
  while (!bytes.empty()) {
    uint64_t segno = position / segment_size_;
    uint64_t offset = position % segment_size_;
    size_t n = size_t(std::min<uint64_t>(bytes.size(), segment_size_ - offset));
    int fd;
    Status s = Open(segno, &fd);
    if (!s.ok()) return s;
    size_t done = 0;
    while (done < n) {
      ssize_t w = pwrite(fd, bytes.data() + done, n - done, off_t(offset + done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return Errno("write " + WalFileName(timeline_, segno, segment_size_));
      done += size_t(w);
    }
    bytes.remove_prefix(n);
    position += n;
  }
  return Status::OK();
}

Status WalFileWriter::Sync() {
  Status s;
  // Segments are full size and their blocks allocated (Create): data alone needs syncing.
  for (auto& [segno, fd] : open_) {
    if (s.ok() && fdatasync(fd) != 0)
      s = Errno("fdatasync " + WalFileName(timeline_, segno, segment_size_));
  }
  CloseAll();
  if (s.ok() && created_) {
    int dir = open(directory_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0) return Errno("open " + directory_);
    if (fsync(dir) != 0) s = Errno("fsync " + directory_);
    close(dir);
    if (s.ok()) created_ = false;
  }
  return s;
}

// One pread per segment file touched.
Status ReadWal(const std::string& directory, uint32_t timeline, uint64_t segment_size,
               uint64_t position, size_t n, std::string* out) {
  out->assign(n, '\0');
  size_t done = 0;
  while (done < n) {
    uint64_t p = position + done;
    std::string path = directory + "/" + WalFileName(timeline, p / segment_size, segment_size);
    size_t take = size_t(std::min<uint64_t>(n - done, segment_size - p % segment_size));
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Errno("open " + path);
    ssize_t r = pread(fd, out->data() + done, take, off_t(p % segment_size));
    close(fd);
    if (r != ssize_t(take)) return Status::IOError("short read of " + path);
    done += take;
  }
  return Status::OK();
}

Status ReadRecord(const std::vector<std::string>& files, const PersistedRecord& record,
                  uint32_t from, uint32_t n, std::string* out) {
  const std::string& path = files[record.file];
  out->assign(n, '\0');
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("open " + path);
  ssize_t r = pread(fd, out->data(), n, off_t(record.offset) + from);
  close(fd);
  return r == ssize_t(n) ? Status::OK() : Status::IOError("short read of " + path);
}

// Reads each payload with one pread from its file, keeping the last file open: records come
// in position order, which is mostly file order.
Status WriteContiguousRecords(const std::vector<std::string>& files,
                              const std::vector<PersistedRecord>& records, WalFileWriter* writer,
                              uint64_t* end) {
  uint64_t e = *end;
  uint64_t written = *end;  // the end of what is written
  int fd = -1;
  uint32_t fd_file = 0;
  std::string payload;
  Status s;
  for (const PersistedRecord& r : records) {
    if (e == 0) e = r.position;
    if (r.position > e) break;                 // a gap: the rest does not continue
    if (r.position + r.length <= e) continue;  // there already
    if (fd < 0 || fd_file != r.file) {
      if (fd >= 0) close(fd);
      fd_file = r.file;
      fd = open(files[r.file].c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        s = Errno("open " + files[r.file]);
        break;
      }
    }
    payload.resize(r.length);
    if (pread(fd, payload.data(), r.length, off_t(r.offset)) != ssize_t(r.length)) {
      s = Status::IOError("short read of " + files[r.file]);
      break;
    }
    s = writer->Write(r.position, payload);
    if (!s.ok()) break;
    e = written = r.position + r.length;
  }
  if (fd >= 0) close(fd);
  Status synced = writer->Sync();
  if (synced.ok()) *end = written;  // what was written before an error is durable too
  return s.ok() ? synced : s;
}

}  // namespace slipstream::replication
