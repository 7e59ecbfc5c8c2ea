// The valid-prefix scan of a log segment (Tailwind, Algorithm 1).
//
// This unit depends on nothing but the format: replication runs it on backups' buffers, and
// recovery runs it on the primary's own segments.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "slipstream/engine/log_format.h"

namespace slipstream::engine {

struct ScannedRecord {
  uint32_t offset;  // of the record header within the segment
  LogRecordType type;
  uint64_t lsn;
  std::string_view payload;  // points into the scanned buffer
  uint32_t batch_start;      // where the append that wrote this record began
};

struct LogScan {
  bool header_ok = false;  // false: never written (zeroed) or header damaged
  LogSegmentHeader header{};
  uint32_t valid_end = 0;  // bytes of the valid prefix (0 when the header is not ok)
  uint32_t chain = 0;      // checksum chain state at valid_end, to continue appending
  // Why the scan stopped: a zero word (clean end), or damage (a checksum mismatch, a bad
  // payload CRC, an impossible length or type). Torn tails of open segments stop as damage.
  bool stopped_at_damage = false;
  std::vector<ScannedRecord> records;  // only records covered by a valid checksum
};

// Scans `size` bytes of a segment image and returns its valid prefix and records.
LogScan ScanLogSegment(const char* base, size_t size);

// Continues the scan of a segment image whose bytes below `from` were scanned before, so that
// a buffer that grows (a backup's, on every flush) costs only its new bytes. `from` and `chain`
// are the valid_end and chain of that earlier scan, and the bytes below `from` must not have
// changed since. The header is read and checked again (header_ok, header); records holds only
// those at offsets >= from; valid_end, chain and stopped_at_damage are what ScanLogSegment
// would return. A `from` at or below the header's end, or beyond `size`, scans from the start.
LogScan ScanLogSegmentFrom(const char* base, size_t size, uint32_t from, uint32_t chain);

}  // namespace slipstream::engine
