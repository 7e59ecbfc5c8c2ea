// Appending to a log segment buffer in the format of log_format.h.
//
// The buffer may be process-local (compaction's medium log) or in the shared arena (the L0
// and large logs); the cursor is a plain struct so it can live in either.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "slipstream/engine/log_format.h"

namespace slipstream::engine {

struct LogCursor {
  uint32_t pos = 0;    // next free byte in the segment
  uint32_t chain = 0;  // running CRC32C over entry headers since the segment start
};

// Writes the segment header and points the cursor after it. Bytes past the cursor may be left
// from an earlier use: the header's fresh nonce keeps them off the checksum chain, but a
// buffer whose image is scanned or shipped whole must be zeroed first.
void StartLogSegment(char* base, uint32_t segment_size, LogKind kind, uint64_t sequence,
                     uint32_t segment, uint64_t nonce, LogCursor* cursor);

// Bytes a data record with `payload` bytes takes in a segment.
inline uint32_t RecordSpace(size_t payload) {
  return uint32_t(kRecordHeaderSize + payload);
}

// Appends one data record whose payload is the concatenation of `parts`; returns its offset.
// The caller has checked that it fits. No checksum is appended.
uint32_t AppendRecord(char* base, LogCursor* cursor, LogRecordType type, uint64_t lsn,
                      std::initializer_list<std::string_view> parts);

// Appends the chained, non-zero checksum that makes every record before it valid.
void AppendChecksum(char* base, LogCursor* cursor);

}  // namespace slipstream::engine
