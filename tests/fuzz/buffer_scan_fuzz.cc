// Fuzzes the backup's recovery scan of an open Tailwind buffer (buffer_scan.h): what a primary's
// one-sided WRITEs left in a buffer is arbitrary bytes to the backup. Two modes, by the low bit
// of the first byte:
//  * raw (0): the buffer is the input's bytes after a 16-byte preamble (see RawMode), as a torn
//    or damaged WRITE or a hostile primary could leave them;
//  * built (1): the buffer is formatted and filled with appends by the primary's real log
//    writer, as the input directs, then torn at one byte and/or hit by one bit flip (see
//    BuiltMode); the valid prefix must then end exactly at the last whole, undamaged append.
// In both, the valid prefix and its records never extend past the buffer (ASan sees every byte
// read), and a scan resumed where an earlier scan of the buffer ended (when only a prefix of it
// had arrived) finds what one full scan finds, as the backup's persists rely on.
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "buffer_scan.h"
#include "fuzz_input.h"
#include "slipstream/engine/log_writer.h"

namespace {

using namespace slipstream;
using namespace slipstream::replication;

// Stops the run with a message: a property of the scan does not hold.
[[noreturn]] void Fail(const char* what) {
  fuzz::FuzzFailure("buffer_scan", what);
}

// What the scan of `image` (size bytes) for (stream, sequence) must satisfy whatever the bytes:
// records of the valid prefix lie inside it, in order, and past `from` when it resumed there.
void CheckScan(const char* image, uint32_t size, const engine::LogScan& scan, uint32_t from) {
  if (scan.valid_end > size) Fail("the valid prefix extends past the buffer");
  if (scan.valid_end == 0) {
    if (!scan.records.empty()) Fail("records without a valid prefix");
    return;
  }
  if (!scan.header_ok || scan.valid_end < engine::kLogHeaderSize) {
    Fail("a valid prefix without a whole header");
  }
  uint32_t previous_end = uint32_t(engine::kLogHeaderSize);
  for (const engine::ScannedRecord& r : scan.records) {
    if (r.offset < previous_end || r.offset < from) Fail("a record overlaps or precedes the scan");
    const uint64_t end = uint64_t(r.offset) + engine::kRecordHeaderSize + r.payload.size();
    if (end > scan.valid_end) Fail("a record extends past the valid prefix");
    if (r.payload.data() != image + r.offset + engine::kRecordHeaderSize) {
      Fail("a record's payload does not point at its bytes");
    }
    if (r.batch_start > r.offset) Fail("a record's append starts after it");
    previous_end = uint32_t(end);
  }
}

// Two lists of records are the same records at the same places.
bool SameRecords(const std::vector<engine::ScannedRecord>& a,
                 const std::vector<engine::ScannedRecord>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); i++) {
    if (a[i].offset != b[i].offset || a[i].type != b[i].type || a[i].lsn != b[i].lsn ||
        a[i].payload.data() != b[i].payload.data() || a[i].payload.size() != b[i].payload.size() ||
        a[i].batch_start != b[i].batch_start) {
      return false;
    }
  }
  return true;
}

// Scans the buffer fully, then as the backup does: once when only its first `cut` bytes had
// arrived (the rest still zero), and again from where that scan ended. Both must agree, and an
// arbitrary resume point must still keep the scan inside the buffer. Returns the full scan's
// valid end.
uint32_t ScanEveryWay(const char* image, uint32_t size, uint32_t stream, uint64_t sequence,
                      uint32_t cut, uint32_t odd_chain) {
  const engine::LogScan full = ScanBuffer(image, size, stream, sequence, ScanPoint{});
  CheckScan(image, size, full, 0);
  if (ValidPrefix(image, size, stream, sequence) != full.valid_end) {
    Fail("ValidPrefix disagrees with ScanBuffer");
  }

  // Resuming at a point no scan gave is a caller's mistake, but must not leave the buffer.
  const uint32_t odd = size == 0 ? 0 : uint32_t((uint64_t(cut) * 7 + 13) % (size + 1));
  const engine::LogScan strange = ScanBuffer(image, size, stream, sequence, {odd, odd_chain});
  CheckScan(image, size, strange, odd > engine::kLogHeaderSize ? odd : 0);

  cut = size == 0 ? 0 : cut % (size + 1);
  std::unique_ptr<char[]> early(new char[size == 0 ? 1 : size]);
  std::memcpy(early.get(), image, cut);
  std::memset(early.get() + cut, 0, size - cut);
  const engine::LogScan first = ScanBuffer(early.get(), size, stream, sequence, ScanPoint{});
  CheckScan(early.get(), size, first, 0);
  // The bytes below the first scan's end must not change before the second (a primary only
  // appends): they may differ only where the first scan read zeros that had not arrived.
  if (std::memcmp(early.get(), image, first.valid_end) != 0) return full.valid_end;
  const ScanPoint point{first.valid_end, first.chain};
  const engine::LogScan resumed = ScanBuffer(image, size, stream, sequence, point);
  CheckScan(image, size, resumed, point.offset > engine::kLogHeaderSize ? point.offset : 0);
  if (resumed.valid_end != full.valid_end || resumed.chain != full.chain ||
      resumed.stopped_at_damage != full.stopped_at_damage) {
    Fail("a resumed scan ends elsewhere than a full one");
  }
  std::vector<engine::ScannedRecord> beyond;
  for (const engine::ScannedRecord& r : full.records) {
    if (point.offset <= engine::kLogHeaderSize || r.offset >= point.offset) beyond.push_back(r);
  }
  if (!SameRecords(resumed.records, beyond)) Fail("a resumed scan finds other records");
  return full.valid_end;
}

// Raw mode. Preamble: mode, cut (u32), odd chain (u32), flags, stream (u16), sequence (u32);
// then the buffer. Flag bit 0: scan for the stream and sequence the buffer's header names (so
// that a seed's buffer is scanned past its header), else for the preamble's.
void RawMode(fuzz::FuzzInput p) {
  const uint32_t cut = uint32_t(p.Take(4));
  const uint32_t odd_chain = uint32_t(p.Take(4));
  const uint8_t flags = uint8_t(p.Take(1));
  uint32_t stream = uint32_t(p.Take(2));
  uint64_t sequence = p.Take(4);
  const std::string_view bytes = p.rest();
  const uint32_t size = uint32_t(bytes.size());
  if ((flags & 1) && size >= sizeof(engine::LogSegmentHeader)) {
    engine::LogSegmentHeader h;
    std::memcpy(&h, bytes.data(), sizeof(h));
    sequence = h.sequence;
    for (uint32_t s = 1; s <= 4; s++) {
      if (uint32_t(KindOfStream(s)) == h.kind) stream = s;
    }
  }
  // Exactly the buffer on the heap, so that ASan reports any read past it.
  std::unique_ptr<char[]> image(new char[size == 0 ? 1 : size]);
  std::memcpy(image.get(), bytes.data(), size);
  ScanEveryWay(image.get(), size, stream, sequence, cut, odd_chain);
}

// Built mode. Preamble: mode, size (u16: the buffer is 64 + size % 16384 bytes), sequence (u8),
// stream (u8), damage (u8: bit 0 tear, bit 1 flip), tear (u16), flip (u16), bit (u8),
// cut (u16); then appends: a count byte (1 + n % 3 records), and per record a length byte and
// that many payload bytes (fewer when the input ends: the payload is then padded).
void BuiltMode(fuzz::FuzzInput p) {
  const uint32_t size = uint32_t(engine::kLogHeaderSize + p.Take(2) % 16384);
  const uint64_t sequence = p.Take(1);
  const uint32_t stream = 1 + uint32_t(p.Take(1) % 4);
  const uint8_t damage = uint8_t(p.Take(1));
  const uint32_t tear = uint32_t(p.Take(2));
  const uint32_t flip = uint32_t(p.Take(2));
  const uint8_t bit = uint8_t(p.Take(1) % 8);
  const uint32_t cut = uint32_t(p.Take(2));

  std::string pristine(size, '\0');
  engine::LogCursor cursor;
  engine::StartLogSegment(pristine.data(), size, KindOfStream(stream), sequence, 0,
                          0x5ca1ab1e00000000ull | sequence, &cursor);
  std::vector<uint32_t> ends{cursor.pos};  // the header's end, then every append's
  uint64_t position = 1000;
  while (!p.empty()) {
    const int records = 1 + int(p.Take(1) % 3);
    std::vector<std::string> payloads;
    size_t need = engine::kChecksumEntrySize;
    for (int r = 0; r < records; r++) {
      const size_t length = size_t(p.Take(1));
      std::string payload(p.Bytes(length));
      payload.resize(length, 'x');
      need += engine::kRecordHeaderSize + payload.size();
      payloads.push_back(std::move(payload));
    }
    if (cursor.pos + need > size) break;
    for (const std::string& payload : payloads) {
      engine::AppendRecord(pristine.data(), &cursor, engine::LogRecordType::kWal, position,
                           {payload});
      position += payload.size();
    }
    engine::AppendChecksum(pristine.data(), &cursor);
    ends.push_back(cursor.pos);
  }
  const uint32_t used = ends.back();

  std::unique_ptr<char[]> image(new char[size]);
  std::memcpy(image.get(), pristine.data(), size);
  if (damage & 1) std::memset(image.get() + tear % (used + 1), 0, size - tear % (used + 1));
  if (damage & 2) image[flip % used] ^= char(1u << bit);
  // The first byte that is not what the primary wrote (a flip may restore a torn byte).
  uint32_t first_damage = used;
  for (uint32_t i = 0; i < used; i++) {
    if (image[i] != pristine[i]) {
      first_damage = i;
      break;
    }
  }
  uint32_t expected = 0;
  for (uint32_t e : ends) {
    if (e <= first_damage) expected = e;
  }
  if (expected < ends[0]) expected = 0;  // the header itself is damaged

  const uint32_t got = ScanEveryWay(image.get(), size, stream, sequence, cut, 0);
  if (got != expected) {
    std::fprintf(stderr, "buffer_scan: valid prefix %u, but the whole appends end at %u\n", got,
                 expected);
    Fail("the valid prefix is not the whole, undamaged appends");
  }
  // Another segment's, or another stream's, buffer has no valid prefix.
  if (ValidPrefix(image.get(), size, stream, sequence + 1) != 0 ||
      ValidPrefix(image.get(), size, stream % 4 + 1, sequence) != 0) {
    Fail("a buffer of another segment or stream has a valid prefix");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::FuzzInput p(data, size);
  const uint8_t mode = uint8_t(p.Take(1));
  if (mode & 1) {
    BuiltMode(p);
  } else {
    RawMode(p);
  }
  return 0;
}
