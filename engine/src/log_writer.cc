// Log segment appends: data records, and the Tailwind checksum after each append.
#include "slipstream/engine/log_writer.h"

#include <cstring>

#include "crc32c.h"

namespace slipstream::engine {

// Fills in the header; the checksum chain is seeded with the header's own CRC (which covers a
// per-use nonce), so stale bytes from an earlier use of the segment can never chain on.
void StartLogSegment(char* base, uint32_t segment_size, LogKind kind, uint64_t sequence,
                     uint32_t segment, uint64_t nonce, LogCursor* cursor) {
  LogSegmentHeader h{};
  h.magic = kLogMagic;
  h.kind = static_cast<uint32_t>(kind);
  h.segment_size = segment_size;
  h.sequence = sequence;
  h.segment = segment;
  h.nonce = nonce;
  h.header_crc = crc32c::Value(&h, offsetof(LogSegmentHeader, header_crc));
  std::memcpy(base, &h, sizeof(h));
  cursor->pos = kLogHeaderSize;
  cursor->chain = h.header_crc;
}

// Copies the payload first and the header last; the header joins the checksum chain.
uint32_t AppendRecord(char* base, LogCursor* cursor, LogRecordType type, uint64_t lsn,
                      std::initializer_list<std::string_view> parts) {
  uint32_t offset = cursor->pos;
  char* payload = base + offset + kRecordHeaderSize;
  uint32_t crc = 0;
  size_t length = 0;
  for (std::string_view part : parts) {
    if (part.empty()) continue;
    std::memcpy(payload + length, part.data(), part.size());
    crc = crc32c::Extend(crc, part.data(), part.size());
    length += part.size();
  }
  RecordHeader h;
  h.type_and_length = (uint32_t(length) << 8) | static_cast<uint8_t>(type);
  h.payload_crc = crc;
  h.lsn = lsn;
  std::memcpy(base + offset, &h, sizeof(h));
  cursor->chain = crc32c::Extend(cursor->chain, &h, sizeof(h));
  cursor->pos = uint32_t(offset + kRecordHeaderSize + length);
  return offset;
}

// The checksum is never zero, so a zeroed (unwritten) tail can never pass for one.
void AppendChecksum(char* base, LogCursor* cursor) {
  uint32_t word = static_cast<uint8_t>(LogRecordType::kChecksum);
  uint32_t value = NonZero(cursor->chain);
  std::memcpy(base + cursor->pos, &word, 4);
  std::memcpy(base + cursor->pos + 4, &value, 4);
  cursor->pos += kChecksumEntrySize;
}

}  // namespace slipstream::engine
