// The device: one file of fixed-size segments, read through a shared read-only mapping and
// written through io_uring. Each process (and each thread) has its own handle state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "slipstream/engine/status.h"

namespace slipstream::engine {

struct WriteRequest {
  uint64_t offset;
  const char* data;
  uint32_t length;
};

class Device {
 public:
  Device() = default;
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  // Opens (creating if needed) `path` and reserves a mapping of `max_size` bytes; once only.
  Status Open(const std::string& path, uint32_t segment_size, uint64_t max_size);

  uint32_t segment_size() const { return segment_size_; }
  uint64_t max_segments() const { return max_size_ / segment_size_; }

  // Read-only view of a segment (valid only below the file size).
  const char* Segment(uint32_t segment) const { return map_ + uint64_t(segment) * segment_size_; }
  const char* At(uint64_t offset) const { return map_ + offset; }

  // Current file size in segments.
  Status SizeInSegments(uint64_t* segments) const;
  // Grows the file (zero-filled) to at least `segments` segments.
  Status Grow(uint64_t segments);
  // Empties the file (a fresh engine).
  Status Truncate();
  // Zeroes a whole segment (before it is reused for a log).
  Status ZeroSegment(uint32_t segment);
  // Zeroes [offset, offset+length).
  Status ZeroRange(uint64_t offset, uint64_t length);

  // Writes every request (io_uring, all submitted at once), then fdatasync if `sync`.
  Status Write(const std::vector<WriteRequest>& requests, bool sync);
  Status Sync();

 private:
  int fd_ = -1;
  char* map_ = nullptr;
  uint32_t segment_size_ = 0;
  uint64_t max_size_ = 0;
};

// Durably replaces `path` with `contents` (write to a temporary, fsync, rename, fsync the dir).
Status WriteFileAtomically(const std::string& path, const std::string& contents);
// Reads a whole file; NotFound if it does not exist.
Status ReadWholeFile(const std::string& path, std::string* contents);

}  // namespace slipstream::engine
