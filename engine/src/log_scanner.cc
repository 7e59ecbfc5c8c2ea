// Tailwind's Algorithm 1: walk entries by their lengths, chain the header checksums, and accept
// records only up to the last checksum entry that matches the chain.
#include "slipstream/engine/log_scanner.h"

#include <algorithm>
#include <cstring>

#include "crc32c.h"

namespace slipstream::engine {

namespace {

// Checks magic and header CRC.
bool ReadHeader(const char* base, size_t size, LogSegmentHeader* h) {
  if (size < kLogHeaderSize) return false;
  std::memcpy(h, base, sizeof(*h));
  return h->magic == kLogMagic &&
         h->header_crc == crc32c::Value(h, offsetof(LogSegmentHeader, header_crc)) &&
         h->kind >= 1 && h->kind <= 5;
}

// Whether `t` is the type of a data record (not a checksum, not garbage).
bool IsDataType(uint8_t t) {
  return t >= 2 && t <= 8;
}

// Reads the header into `scan`: true when it is whole and of a known kind. An all-zero header
// is a never-written segment; anything else that fails is damage.
bool ScanHeader(const char* base, size_t size, LogScan* scan) {
  if (ReadHeader(base, size, &scan->header)) {
    scan->header_ok = true;
    return true;
  }
  for (size_t i = 0; i < std::min(size, kLogHeaderSize); i++) {
    if (base[i] != 0) {
      scan->stopped_at_damage = true;
      break;
    }
  }
  return false;
}

// Walks entries from `from`, a valid end whose chain state is `chain`, until a zero word, damage,
// or the end of the buffer. Everything the walk decides depends only on the bytes from `from` on
// and on `chain`, which is why a scan can stop at a valid end and be resumed there.
void Walk(const char* base, size_t size, uint32_t from, uint32_t chain, LogScan* scan) {
  scan->valid_end = from;
  scan->chain = chain;
  size_t committed = 0;  // records[0..committed) are covered by a checksum
  size_t pos = from;
  while (pos + 4 <= size) {
    uint32_t word;
    std::memcpy(&word, base + pos, 4);
    if (word == 0) break;  // pre-zeroed space: the clean end
    auto type = static_cast<uint8_t>(word & 0xff);
    uint32_t length = word >> 8;
    if (type == static_cast<uint8_t>(LogRecordType::kChecksum)) {
      uint32_t stored;
      if (length != 0 || pos + kChecksumEntrySize > size) {
        scan->stopped_at_damage = true;
        break;
      }
      std::memcpy(&stored, base + pos + 4, 4);
      if (stored != NonZero(chain)) {
        scan->stopped_at_damage = true;
        break;
      }
      pos += kChecksumEntrySize;
      committed = scan->records.size();
      scan->valid_end = uint32_t(pos);
      scan->chain = chain;
      continue;
    }
    if (!IsDataType(type) || pos + kRecordHeaderSize + length > size) {
      scan->stopped_at_damage = true;
      break;
    }
    RecordHeader h;
    std::memcpy(&h, base + pos, sizeof(h));
    const char* payload = base + pos + kRecordHeaderSize;
    if (crc32c::Value(payload, length) != h.payload_crc) {
      scan->stopped_at_damage = true;
      break;
    }
    chain = crc32c::Extend(chain, &h, sizeof(h));
    scan->records.push_back(ScannedRecord{uint32_t(pos), static_cast<LogRecordType>(type), h.lsn,
                                          std::string_view(payload, length), scan->valid_end});
    pos += kRecordHeaderSize + length;
  }
  // Records after the last valid checksum belong to an append that never completed.
  if (scan->records.size() > committed) {
    scan->records.resize(committed);
    scan->stopped_at_damage = true;
  }
}

}  // namespace

// The walk from the header's end, seeded with the header's CRC.
LogScan ScanLogSegment(const char* base, size_t size) {
  return ScanLogSegmentFrom(base, size, 0, 0);
}

// The header is checked again because it is cheap, and a segment whose header was damaged or
// zeroed since the earlier scan has no valid prefix at all.
LogScan ScanLogSegmentFrom(const char* base, size_t size, uint32_t from, uint32_t chain) {
  LogScan scan;
  if (!ScanHeader(base, size, &scan)) return scan;
  if (from <= kLogHeaderSize || from > size) {
    from = uint32_t(kLogHeaderSize);
    chain = scan.header.header_crc;
  }
  Walk(base, size, from, chain, &scan);
  return scan;
}

}  // namespace slipstream::engine
