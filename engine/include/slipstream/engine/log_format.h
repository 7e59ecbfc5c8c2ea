// The log segment format shared by the L0 recovery log, the medium log, the large log and
// replication (a backup buffer is formatted as a log segment), hence public.
//
// A segment starts with a 64-byte header, then entries. A data entry is a 16-byte header
// (type and length, payload CRC32C, LSN) and its payload. After every append (one record or a
// batch) the writer adds a checksum entry holding a non-zero CRC32C chained over all entry
// headers since the segment start (Tailwind). Segments are zeroed before use, so a reader finds
// the valid prefix of any segment, even one torn by a crash or by a partial remote write, with
// the scan of Tailwind's Algorithm 1 (log_scanner.h) and nothing else.
#pragma once

#include <cstddef>
#include <cstdint>

namespace slipstream::engine {

// kWal: a replication buffer holding a stream of PostgreSQL WAL (replication/).
// kIndexStream: a replication buffer of index shipping (framed compaction events).
enum class LogKind : uint32_t { kL0 = 1, kMedium = 2, kLarge = 3, kWal = 4, kIndexStream = 5 };

enum class LogRecordType : uint8_t {
  kChecksum = 1,        // not a data record: a 4-byte chained checksum follows the type word
  kPut = 2,             // varint ikey length, ikey, value kind, inline value or ValuePtr
  kDelete = 3,          // varint ikey length, ikey
  kKeyspaceCreate = 4,  // u32 id, u64 tag
  kKeyspaceDrop = 5,    // u32 id
  kNext = 6,            // u32 next segment, u64 next sequence: the log continues there
  kValue = 7,           // medium/large log: varint ikey length, ikey, u8 flags, u32 raw size, bytes
  kWal = 8,             // replicated WAL: the bytes from the WAL position in the record's LSN
};

constexpr uint64_t kLogMagic = 0x3130474f4c50534cull;  // "LSPLOG01"
constexpr size_t kLogHeaderSize = 64;
constexpr size_t kRecordHeaderSize = 16;
constexpr size_t kChecksumEntrySize = 8;
constexpr uint32_t kMaxRecordPayload = (1u << 24) - 1;
constexpr uint8_t kValueFlagLz4 = 1;

// The segment header as stored (little-endian, 64 bytes).
struct LogSegmentHeader {
  uint64_t magic;
  uint32_t kind;          // LogKind
  uint32_t segment_size;  // bytes
  uint64_t sequence;      // position in the log's chain of segments
  uint32_t segment;       // the segment number it was written to on the primary
  uint32_t reserved;
  uint64_t nonce;  // random per use of a segment: seeds the checksum chain
  uint8_t pad[20];
  uint32_t header_crc;  // CRC32C of the 60 bytes before it
};
static_assert(sizeof(LogSegmentHeader) == kLogHeaderSize);

// The 16-byte header of a data entry.
struct RecordHeader {
  uint32_t type_and_length;  // type in the low 8 bits, payload length in the high 24
  uint32_t payload_crc;
  uint64_t lsn;
};
static_assert(sizeof(RecordHeader) == kRecordHeaderSize);

inline uint32_t NonZero(uint32_t crc) {
  return crc == 0 ? 1 : crc;
}

}  // namespace slipstream::engine
