// The resumed valid-prefix scan (ScanLogSegmentFrom): a segment that grows and is scanned in
// steps, each continuing where the previous one's valid prefix ended, must yield exactly what
// one scan of the final image yields: the same valid end, chain and damage flag, and, step by
// step, the same records. Images are random appends, torn at random bytes, hit by bit flips,
// followed by garbage, or reused over stale bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "slipstream/engine/log_format.h"
#include "slipstream/engine/log_scanner.h"
#include "slipstream/engine/log_writer.h"

namespace slipstream::engine {
namespace {

// A valid end the writer produced: after the header, or after an append's checksum.
struct End {
  uint32_t offset;
  uint32_t chain;
};

// A segment image of random appends, and the valid ends the writer left.
struct Image {
  std::string bytes;
  std::vector<End> ends;
};

// Random appends (zero to four records of random types and sizes, then a checksum) until the
// segment is full or `stop` bytes are used. `stale` is what the segment held before (reused
// without zeroing) or empty (pre-zeroed).
Image MakeImage(std::mt19937_64& rng, uint32_t size, uint32_t stop, const std::string& stale) {
  Image img;
  img.bytes = stale.empty() ? std::string(size, '\0') : stale;
  LogCursor cursor;
  StartLogSegment(img.bytes.data(), size, LogKind(1 + rng() % 4), rng() % 100, uint32_t(rng()),
                  rng(), &cursor);
  img.ends.push_back(End{cursor.pos, cursor.chain});
  while (true) {
    int records = int(rng() % 5);
    std::vector<std::string> payloads;
    size_t need = kChecksumEntrySize;
    for (int r = 0; r < records; r++) {
      size_t len = rng() % 8 == 0 ? 0 : rng() % 400;
      if (rng() % 20 == 0) len = 1000 + rng() % 3000;
      payloads.emplace_back(len, '\0');
      for (char& c : payloads.back()) c = char(rng());
      need += RecordSpace(len);
    }
    if (cursor.pos + need > std::min(size, stop)) break;
    for (const std::string& p : payloads) {
      AppendRecord(img.bytes.data(), &cursor, LogRecordType(2 + rng() % 7), rng(), {p});
    }
    AppendChecksum(img.bytes.data(), &cursor);
    img.ends.push_back(End{cursor.pos, cursor.chain});
  }
  return img;
}

// Damages a written image the ways a buffer is damaged: a tear (the bytes from a random point
// never arrived), a bit flip, garbage after the written bytes, or several of them.
void Damage(std::mt19937_64& rng, Image* img) {
  uint32_t used = img->ends.back().offset;
  std::string& b = img->bytes;
  int kind = int(rng() % 6);
  if (kind == 0 || kind == 3) {
    uint32_t tear = uint32_t(rng() % (used + 1));
    std::fill(b.begin() + tear, b.begin() + used, '\0');
  }
  if (kind == 1 || kind == 3 || kind == 4) {
    b[rng() % used] ^= char(1u << (rng() % 8));
  }
  if (kind == 2 || kind == 4) {
    size_t at = used + rng() % 64;
    size_t n = 1 + rng() % 32;
    for (size_t i = at; i < std::min(b.size(), at + n); i++) b[i] = char(rng() | 1);
  }
  // kind 5: intact
}

// One scanned record with its payload copied (steps scan different buffers).
struct Rec {
  uint32_t offset;
  LogRecordType type;
  uint64_t lsn;
  std::string payload;
  uint32_t batch_start;
  bool operator==(const Rec& o) const {
    return offset == o.offset && type == o.type && lsn == o.lsn && payload == o.payload &&
           batch_start == o.batch_start;
  }
};

void AppendRecs(const LogScan& scan, std::vector<Rec>* out) {
  for (const ScannedRecord& r : scan.records) {
    out->push_back(Rec{r.offset, r.type, r.lsn, std::string(r.payload), r.batch_start});
  }
}

// Asserts that `got` ends where `want` ends, in the same state.
void ExpectSameEnd(const LogScan& got, const LogScan& want, const std::string& what) {
  ASSERT_EQ(got.header_ok, want.header_ok) << what;
  ASSERT_EQ(std::memcmp(&got.header, &want.header, sizeof(got.header)), 0) << what;
  ASSERT_EQ(got.valid_end, want.valid_end) << what;
  ASSERT_EQ(got.chain, want.chain) << what;
  ASSERT_EQ(got.stopped_at_damage, want.stopped_at_damage) << what;
}

// The randomized property: steps over growing prefixes of the final image (the rest zero or
// garbage: bytes not yet arrived), each resumed from the last valid end and chain, then a step
// over the final image, give the full scan's end, and their records are its records in order.
// Resuming the final image's scan at any of its valid ends gives the same end and the records
// from there.
TEST(LogScanResume, StepwiseScansEqualOneFullScan) {
  std::mt19937_64 rng(20261201);
  int cases = 0, damaged = 0, steps = 0, reused = 0;
  for (; cases < 20000; cases++) {
    uint32_t size = 4096 + uint32_t(rng() % (28 * 1024));
    std::string stale;
    if (rng() % 8 == 0) {  // a segment reused without zeroing: an older log's bytes beneath
      stale = MakeImage(rng, size, size, std::string()).bytes;
      reused++;
    }
    Image img = MakeImage(rng, size, 256 + uint32_t(rng() % size), stale);
    Damage(rng, &img);
    const std::string& final_bytes = img.bytes;
    LogScan full = ScanLogSegment(final_bytes.data(), size);
    if (full.stopped_at_damage) damaged++;
    std::vector<Rec> want;
    AppendRecs(full, &want);
    const std::string what = "case " + std::to_string(cases);

    // Steps over growing prefixes.
    std::vector<Rec> got;
    uint32_t from = 0, chain = 0;
    uint32_t arrived = 0;
    int n = 1 + int(rng() % 5);
    for (int step = 0; step < n; step++, steps++) {
      arrived += uint32_t(rng() % (size - arrived + 1)) / 2;
      std::string partial = final_bytes.substr(0, arrived);
      if (rng() % 4 == 0) {
        for (uint32_t i = arrived; i < size; i++) partial.push_back(char(rng()));
      } else {
        partial.resize(size, '\0');
      }
      LogScan s = ScanLogSegmentFrom(partial.data(), size, from, chain);
      AppendRecs(s, &got);
      ASSERT_LE(s.valid_end, std::max(arrived, from)) << what << " step " << step;
      // A prefix's scan never ends beyond the full scan's (a step that saw no header keeps 0).
      ASSERT_LE(s.valid_end, full.valid_end) << what << " step " << step;
      if (s.header_ok) {
        from = s.valid_end;
        chain = s.chain;
      }
    }
    LogScan last = ScanLogSegmentFrom(final_bytes.data(), size, from, chain);
    AppendRecs(last, &got);
    ExpectSameEnd(last, full, what);
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < want.size(); i++) ASSERT_TRUE(got[i] == want[i]) << what << " #" << i;

    // Resumed at a valid end of the final image (one the writer left, within the valid prefix).
    for (int k = 0; k < 3; k++) {
      const End& e = img.ends[rng() % img.ends.size()];
      if (e.offset > full.valid_end) continue;
      LogScan r = ScanLogSegmentFrom(final_bytes.data(), size, e.offset, e.chain);
      ExpectSameEnd(r, full, what + " from " + std::to_string(e.offset));
      std::vector<Rec> tail;
      AppendRecs(r, &tail);
      std::vector<Rec> want_tail;
      for (const Rec& w : want) {
        if (w.offset >= e.offset) want_tail.push_back(w);
      }
      ASSERT_EQ(tail.size(), want_tail.size()) << what;
      for (size_t i = 0; i < tail.size(); i++) ASSERT_TRUE(tail[i] == want_tail[i]) << what;
    }
  }
  EXPECT_GT(damaged, 5000);
  EXPECT_GT(reused, 1000);
  std::printf("[ resumed  ] %d images (%d damaged, %d reused), %d partial steps\n", cases, damaged,
              reused, steps);
}

// Scanning a buffer append by append, each time from where the last scan ended, reads each
// byte about once; every append's records come back in the step after it.
TEST(LogScanResume, AppendByAppendReturnsEachAppendOnce) {
  std::mt19937_64 rng(7);
  const uint32_t size = 64 * 1024;
  std::string buf(size, '\0');
  LogCursor cursor;
  StartLogSegment(buf.data(), size, LogKind::kWal, 1, 0, 42, &cursor);
  uint32_t from = 0, chain = 0;
  uint64_t lsn = 1000;
  for (int i = 0; cursor.pos + 600 < size; i++) {
    uint32_t offset =
        AppendRecord(buf.data(), &cursor, LogRecordType::kWal, lsn, {"append-", std::to_string(i)});
    AppendChecksum(buf.data(), &cursor);
    LogScan s = ScanLogSegmentFrom(buf.data(), size, from, chain);
    ASSERT_TRUE(s.header_ok);
    ASSERT_FALSE(s.stopped_at_damage);
    ASSERT_EQ(s.records.size(), 1u) << i;
    EXPECT_EQ(s.records[0].offset, offset);
    EXPECT_EQ(s.records[0].lsn, lsn);
    EXPECT_EQ(s.records[0].payload, "append-" + std::to_string(i));
    EXPECT_EQ(s.records[0].batch_start, from == 0 ? kLogHeaderSize : from);
    EXPECT_EQ(s.valid_end, cursor.pos);
    EXPECT_EQ(s.chain, cursor.chain);
    from = s.valid_end;
    chain = s.chain;
    lsn += 100;
    // Nothing new: the resumed scan returns no record and the same end.
    LogScan again = ScanLogSegmentFrom(buf.data(), size, from, chain);
    EXPECT_TRUE(again.records.empty());
    EXPECT_EQ(again.valid_end, from);
    EXPECT_EQ(again.chain, chain);
  }
}

// Out-of-range starting points scan from the start; a damaged header yields nothing wherever
// the scan was to resume.
TEST(LogScanResume, EdgesOfTheStartingPoint) {
  std::mt19937_64 rng(3);
  Image img = MakeImage(rng, 8192, 8192, std::string());
  const uint32_t size = 8192;
  LogScan full = ScanLogSegment(img.bytes.data(), size);
  ASSERT_TRUE(full.header_ok);
  ASSERT_GT(full.records.size(), 3u);
  for (uint32_t from : {0u, 1u, uint32_t(kLogHeaderSize), size + 1, 0xffffffffu}) {
    // At or below the header's end the chain given is not used: the header's CRC seeds it.
    LogScan s = ScanLogSegmentFrom(img.bytes.data(), size, from, 0xdeadbeef);
    ExpectSameEnd(s, full, "from " + std::to_string(from));
    EXPECT_EQ(s.records.size(), full.records.size()) << from;
  }
  // A wrong chain at a valid end: the next checksum does not match, nothing more is valid.
  const End& e = img.ends[2];
  LogScan wrong = ScanLogSegmentFrom(img.bytes.data(), size, e.offset, e.chain ^ 1);
  EXPECT_EQ(wrong.valid_end, e.offset);
  EXPECT_TRUE(wrong.stopped_at_damage);
  EXPECT_TRUE(wrong.records.empty());
  // The header damaged after an earlier scan: no header, no records, wherever it resumes.
  std::string damaged = img.bytes;
  damaged[10] ^= 4;
  LogScan s = ScanLogSegmentFrom(damaged.data(), size, e.offset, e.chain);
  EXPECT_FALSE(s.header_ok);
  EXPECT_TRUE(s.stopped_at_damage);
  EXPECT_EQ(s.valid_end, 0u);
  EXPECT_TRUE(s.records.empty());
  // A zeroed (never written) segment is clean and empty.
  std::string zero(size, '\0');
  s = ScanLogSegmentFrom(zero.data(), size, e.offset, e.chain);
  EXPECT_FALSE(s.header_ok);
  EXPECT_FALSE(s.stopped_at_damage);
  EXPECT_EQ(s.valid_end, 0u);
}

}  // namespace
}  // namespace slipstream::engine
