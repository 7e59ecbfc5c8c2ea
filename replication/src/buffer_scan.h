// The valid prefix of a replication buffer: Tailwind's Algorithm 1 (the engine's log scanner)
// plus the checks that the buffer holds the segment it was opened for.
#pragma once

#include <cstdint>

#include "slipstream/engine/log_scanner.h"
#include "slipstream/replication/wire.h"

namespace slipstream::replication {

// The engine log kind a stream's buffers are formatted as.
engine::LogKind KindOfStream(uint32_t stream);

// A valid end of a buffer and the checksum chain there (engine::LogScan's valid_end and chain):
// where a later scan of the same buffer resumes. A primary only appends to an open buffer, so
// the bytes below a valid end never change and need not be read again.
struct ScanPoint {
  uint32_t offset = 0;  // 0: nothing scanned yet (a scan starts at the header)
  uint32_t chain = 0;
};

// The valid prefix of segment `sequence` of `stream` in `image`, scanned from `from` on (see
// engine::ScanLogSegmentFrom): valid_end 0 and no records when the header is missing, damaged
// or names another segment; otherwise the end of the last record covered by a matching
// checksum, and the valid records at offsets >= from.offset.
engine::LogScan ScanBuffer(const char* image, uint32_t size, uint32_t stream, uint64_t sequence,
                           ScanPoint from);

// Bytes of `image` that are a valid prefix of segment `sequence` of `stream` (ScanBuffer from
// the start).
uint32_t ValidPrefix(const char* image, uint32_t size, uint32_t stream, uint64_t sequence);

}  // namespace slipstream::replication
