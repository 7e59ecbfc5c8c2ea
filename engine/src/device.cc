// Device file I/O: a reserved shared read-only mapping for reads, io_uring for writes.
#include "device.h"

#include <fcntl.h>
#include <liburing.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "process.h"

namespace slipstream::engine {

namespace {

constexpr unsigned kRingEntries = 64;

Status ErrnoStatus(const std::string& what, int err) {
  return Status::IOError(what + ": " + std::strerror(err));
}

// A per-thread ring; rebuilt in a forked child (a ring must not be shared across processes).
struct ThreadRing {
  io_uring ring;
  pid_t owner = 0;
  bool ok = false;

  io_uring* Get() {
    if (!ok || owner != CurrentPid()) {
      // A ring inherited through fork() belongs to the parent: leave it, make our own.
      ok = io_uring_queue_init(kRingEntries, &ring, 0) == 0;
      owner = CurrentPid();
    }
    return ok ? &ring : nullptr;
  }
  ~ThreadRing() {
    if (ok && owner == CurrentPid()) io_uring_queue_exit(&ring);
  }
};

thread_local ThreadRing thread_ring;

// Writes with plain pwrite (fallback when io_uring is unavailable, and for short writes).
Status PwriteAll(int fd, const char* data, size_t length, uint64_t offset) {
  while (length > 0) {
    ssize_t n = pwrite(fd, data, length, off_t(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("pwrite", errno);
    }
    data += n;
    length -= size_t(n);
    offset += uint64_t(n);
  }
  return Status::OK();
}

}  // namespace

Device::~Device() {
  if (map_) munmap(map_, max_size_);
  if (fd_ >= 0) close(fd_);
}

// The mapping covers max_size even where the file is shorter; only allocated segments, which
// are below the file size, are ever touched through it.
Status Device::Open(const std::string& path, uint32_t segment_size, uint64_t max_size) {
  if (fd_ >= 0) return Status::InvalidArgument("device is already open");
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoStatus("open " + path, errno);
  void* map = mmap(nullptr, max_size, PROT_READ, MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (map == MAP_FAILED) {
    int err = errno;
    close(fd);
    return ErrnoStatus("mmap " + path, err);
  }
  fd_ = fd;
  map_ = static_cast<char*>(map);
  segment_size_ = segment_size;
  max_size_ = max_size;
  return Status::OK();
}

Status Device::SizeInSegments(uint64_t* segments) const {
  struct stat st;
  if (fstat(fd_, &st) != 0) return ErrnoStatus("fstat", errno);
  *segments = uint64_t(st.st_size) / segment_size_;
  return Status::OK();
}

// Extends with fallocate so that the new space reads as zeros and is really allocated.
Status Device::Grow(uint64_t segments) {
  uint64_t current;
  Status s = SizeInSegments(&current);
  if (!s.ok() || current >= segments) return s;
  if (segments > max_segments()) return Status::IOError("device is full (max_device_size)");
  uint64_t bytes = segments * segment_size_;
  if (fallocate(fd_, 0, 0, off_t(bytes)) != 0) {
    if (errno != EOPNOTSUPP) return ErrnoStatus("fallocate", errno);
    if (ftruncate(fd_, off_t(bytes)) != 0) return ErrnoStatus("ftruncate", errno);
  }
  return Status::OK();
}

Status Device::Truncate() {
  if (ftruncate(fd_, 0) != 0) return ErrnoStatus("ftruncate", errno);
  return Status::OK();
}

Status Device::ZeroSegment(uint32_t segment) {
  return ZeroRange(uint64_t(segment) * segment_size_, segment_size_);
}

// Prefers FALLOC_FL_ZERO_RANGE (no data written); falls back to writing zeros.
Status Device::ZeroRange(uint64_t offset, uint64_t length) {
  if (length == 0) return Status::OK();
  if (fallocate(fd_, FALLOC_FL_ZERO_RANGE, off_t(offset), off_t(length)) == 0) {
    return Status::OK();
  }
  std::unique_ptr<char[]> zeros(new char[1 << 16]());
  while (length > 0) {
    size_t n = std::min<uint64_t>(length, 1 << 16);
    Status s = PwriteAll(fd_, zeros.get(), n, offset);
    if (!s.ok()) return s;
    offset += n;
    length -= n;
  }
  return Status::OK();
}

// Submits all writes in one batch and reaps them; short or failed completions are finished
// or reported with pwrite's error.
Status Device::Write(const std::vector<WriteRequest>& requests, bool sync) {
  io_uring* ring = thread_ring.Get();
  size_t i = 0;
  while (ring && i < requests.size()) {
    size_t batch = std::min<size_t>(requests.size() - i, kRingEntries);
    for (size_t j = 0; j < batch; j++) {
      io_uring_sqe* sqe = io_uring_get_sqe(ring);
      const WriteRequest& r = requests[i + j];
      io_uring_prep_write(sqe, fd_, r.data, r.length, r.offset);
      io_uring_sqe_set_data64(sqe, i + j);
    }
    int submitted = io_uring_submit_and_wait(ring, unsigned(batch));
    if (submitted < 0) return ErrnoStatus("io_uring_submit", -submitted);
    for (size_t j = 0; j < batch; j++) {
      io_uring_cqe* cqe;
      int rc = io_uring_wait_cqe(ring, &cqe);
      if (rc < 0) return ErrnoStatus("io_uring_wait_cqe", -rc);
      const WriteRequest& r = requests[io_uring_cqe_get_data64(cqe)];
      int res = cqe->res;
      io_uring_cqe_seen(ring, cqe);
      if (res < 0) return ErrnoStatus("write", -res);
      if (uint32_t(res) < r.length) {
        Status s = PwriteAll(fd_, r.data + res, r.length - uint32_t(res), r.offset + uint64_t(res));
        if (!s.ok()) return s;
      }
    }
    i += batch;
  }
  for (; i < requests.size(); i++) {
    Status s = PwriteAll(fd_, requests[i].data, requests[i].length, requests[i].offset);
    if (!s.ok()) return s;
  }
  return sync ? Sync() : Status::OK();
}

Status Device::Sync() {
  if (fdatasync(fd_) != 0) return ErrnoStatus("fdatasync", errno);
  return Status::OK();
}

// Temporary file, fsync, rename over the old one, fsync the directory.
Status WriteFileAtomically(const std::string& path, const std::string& contents) {
  std::string tmp = path + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoStatus("open " + tmp, errno);
  Status s = PwriteAll(fd, contents.data(), contents.size(), 0);
  if (s.ok() && fsync(fd) != 0) s = ErrnoStatus("fsync " + tmp, errno);
  close(fd);
  if (!s.ok()) return s;
  if (rename(tmp.c_str(), path.c_str()) != 0) return ErrnoStatus("rename " + tmp, errno);
  std::string dir = path.substr(0, path.find_last_of('/'));
  int dfd = open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return ErrnoStatus("open " + dir, errno);
  int rc = fsync(dfd);
  close(dfd);
  return rc == 0 ? Status::OK() : ErrnoStatus("fsync " + dir, errno);
}

Status ReadWholeFile(const std::string& path, std::string* contents) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Status::NotFound(path);
    return ErrnoStatus("open " + path, errno);
  }
  contents->clear();
  char buf[1 << 16];
  while (true) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      close(fd);
      return ErrnoStatus("read " + path, err);
    }
    if (n == 0) break;
    contents->append(buf, size_t(n));
  }
  close(fd);
  return Status::OK();
}

}  // namespace slipstream::engine
