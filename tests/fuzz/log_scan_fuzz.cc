// Fuzzes the valid-prefix scan of log segments (log_scanner.h), which recovery runs on the
// segments a crash left behind and replication on backups' buffers: ScanLogSegment must take
// any bytes without crashing, return only records inside the input and covered by a checksum
// that matches the chain, and a scan resumed at any record boundary it reported must agree
// with the full scan.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "crc32c.h"
#include "fuzz_input.h"
#include "slipstream/engine/log_format.h"
#include "slipstream/engine/log_scanner.h"

namespace {

using namespace slipstream::engine;

// Resumed scans tried per input at most, spread over the reported boundaries, so that an input
// of many tiny batches stays fast.
constexpr size_t kMaxResumes = 24;

// Stops the run with a message naming the broken property.
[[noreturn]] void Fail(const char* what, size_t size) {
  const std::string message = std::string(what) + " (input of " + std::to_string(size) + " bytes)";
  slipstream::fuzz::FuzzFailure("log_scan", message.c_str());
}

// Whether two scans found the same valid prefix and stopped for the same reason.
bool SameOutcome(const LogScan& a, const LogScan& b) {
  return a.header_ok == b.header_ok && a.valid_end == b.valid_end && a.chain == b.chain &&
         a.stopped_at_damage == b.stopped_at_damage &&
         std::memcmp(&a.header, &b.header, sizeof(a.header)) == 0;
}

// Whether two records are the same one (same place, same bytes viewed).
bool SameRecord(const ScannedRecord& a, const ScannedRecord& b) {
  return a.offset == b.offset && a.type == b.type && a.lsn == b.lsn &&
         a.payload.data() == b.payload.data() && a.payload.size() == b.payload.size() &&
         a.batch_start == b.batch_start;
}

// Walks the checksum entries from *pos up to `to`, each of which must hold the chain's value,
// and records the valid end after each; the entries must end exactly at `to`.
void SkipChecksums(const char* base, size_t size, uint32_t to, uint32_t chain, uint32_t* pos,
                   std::vector<std::pair<uint32_t, uint32_t>>* boundaries) {
  if (to > size) Fail("entries beyond the input", size);
  while (*pos < to) {
    uint32_t word, stored;
    if (uint64_t(*pos) + kChecksumEntrySize > to) Fail("records do not tile the prefix", size);
    std::memcpy(&word, base + *pos, 4);
    std::memcpy(&stored, base + *pos + 4, 4);
    if (word != uint32_t(LogRecordType::kChecksum) || stored != NonZero(chain)) {
      Fail("an append ended without its checksum", size);
    }
    *pos += uint32_t(kChecksumEntrySize);
    boundaries->push_back({*pos, chain});
  }
  if (*pos != to) Fail("records overlap", size);
}

// Checks one full scan against the bytes it read: every record lies inside the valid prefix,
// which lies inside the input; each record's header and payload CRC are really there; the
// records tile the prefix with checksum entries between batches; and the chain the scan reports
// is the one the record headers give.
void CheckScan(const char* base, size_t size, const LogScan& scan,
               std::vector<std::pair<uint32_t, uint32_t>>* boundaries) {
  if (!scan.header_ok) {
    if (scan.valid_end != 0 || !scan.records.empty()) Fail("records without a header", size);
    return;
  }
  if (scan.valid_end < kLogHeaderSize || scan.valid_end > size) {
    Fail("valid prefix outside the input", size);
  }
  if (scan.header.magic != kLogMagic || scan.header.kind < 1 || scan.header.kind > 5) {
    Fail("accepted a header of an unknown magic or kind", size);
  }
  uint32_t chain = scan.header.header_crc;
  uint32_t pos = uint32_t(kLogHeaderSize);  // where the next entry must start
  uint32_t batch = pos;                     // the valid end the current append started at
  boundaries->push_back({pos, chain});
  for (const ScannedRecord& rec : scan.records) {
    // Checksum entries sit only between appends (an empty append leaves one alone), so the
    // bytes from `pos` to the record are whole checksum entries, each ending an append.
    if (rec.offset != pos) {
      SkipChecksums(base, size, rec.offset, chain, &pos, boundaries);
      batch = pos;
    }
    if (rec.batch_start != batch) Fail("wrong batch start", size);
    if (uint64_t(rec.offset) + kRecordHeaderSize + rec.payload.size() > scan.valid_end ||
        rec.payload.data() != base + rec.offset + kRecordHeaderSize) {
      Fail("record outside the valid prefix", size);
    }
    RecordHeader h;
    std::memcpy(&h, base + rec.offset, sizeof(h));
    if ((h.type_and_length & 0xff) != uint8_t(rec.type) ||
        (h.type_and_length >> 8) != rec.payload.size() || h.lsn != rec.lsn ||
        uint8_t(rec.type) < 2 || uint8_t(rec.type) > 8) {
      Fail("record differs from its header", size);
    }
    if (crc32c::Value(rec.payload.data(), rec.payload.size()) != h.payload_crc) {
      Fail("record with a bad payload CRC", size);
    }
    chain = crc32c::Extend(chain, &h, sizeof(h));
    pos = uint32_t(rec.offset + kRecordHeaderSize + rec.payload.size());
  }
  // The prefix ends with the checksum entries of the last append (or is the header alone).
  if (scan.valid_end != pos) SkipChecksums(base, size, scan.valid_end, chain, &pos, boundaries);
  if (scan.chain != chain) Fail("reported chain is not the records' chain", size);
  // A clean stop is a zero word at the valid end or the end of the buffer.
  if (!scan.stopped_at_damage && uint64_t(scan.valid_end) + 4 <= size) {
    uint32_t word;
    std::memcpy(&word, base + scan.valid_end, 4);
    if (word != 0) Fail("stopped cleanly before a non-zero word", size);
  }
}

// A scan resumed at a boundary the full scan reported finds the same prefix and exactly the
// full scan's records from there on (all of them if `from` makes it start over).
void CheckResume(const char* base, size_t size, const LogScan& full, uint32_t from,
                 uint32_t chain) {
  LogScan resumed = ScanLogSegmentFrom(base, size, from, chain);
  if (!SameOutcome(full, resumed)) Fail("resumed scan disagrees with the full scan", size);
  auto first = std::find_if(full.records.begin(), full.records.end(),
                            [&](const ScannedRecord& r) { return r.offset >= from; });
  size_t expected = size_t(full.records.end() - first);
  if (from <= kLogHeaderSize || from > size) expected = full.records.size();
  if (resumed.records.size() != expected) Fail("resumed scan found other records", size);
  for (size_t i = 0; i < expected; i++) {
    if (!SameRecord(resumed.records[i], full.records[full.records.size() - expected + i])) {
      Fail("resumed scan found other records", size);
    }
  }
}

// The valid prefix stands on its own: the same bytes followed by zeroes (what recovery keeps
// of a segment, and what a torn tail is zeroed to) scan to the same records, cleanly.
void CheckPrefixAlone(const char* base, size_t size, const LogScan& full) {
  std::string copy(base, full.valid_end);
  copy.resize(size, '\0');
  LogScan again = ScanLogSegment(copy.data(), copy.size());
  if (again.valid_end != full.valid_end || again.chain != full.chain ||
      again.records.size() != full.records.size() || again.stopped_at_damage) {
    Fail("the valid prefix followed by zeroes scans differently", size);
  }
  for (size_t i = 0; i < full.records.size(); i++) {
    const ScannedRecord& a = full.records[i];
    const ScannedRecord& b = again.records[i];
    if (a.offset != b.offset || a.type != b.type || a.lsn != b.lsn || a.payload != b.payload ||
        a.batch_start != b.batch_start) {
      Fail("the valid prefix followed by zeroes scans differently", size);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* base = reinterpret_cast<const char*>(data);
  LogScan full = ScanLogSegment(base, size);
  std::vector<std::pair<uint32_t, uint32_t>> boundaries;  // (valid end, chain there)
  CheckScan(base, size, full, &boundaries);
  // From the start or beyond the end, a resumed scan is a full scan whatever chain it is given.
  CheckResume(base, size, full, 0, 0x12345678);
  CheckResume(base, size, full, uint32_t(kLogHeaderSize), 0x12345678);
  if (size < UINT32_MAX) CheckResume(base, size, full, uint32_t(size + 1), 0x12345678);
  if (!full.header_ok) return 0;
  size_t step = std::max<size_t>(1, boundaries.size() / kMaxResumes);
  for (size_t i = 0; i < boundaries.size(); i += step) {
    CheckResume(base, size, full, boundaries[i].first, boundaries[i].second);
  }
  CheckResume(base, size, full, boundaries.back().first, boundaries.back().second);
  CheckPrefixAlone(base, size, full);
  return 0;
}
