// Log segment format: the writer's appends and Tailwind's valid-prefix scan (Algorithm 1) over
// intact, truncated, torn, bit-flipped, garbage and reused segment images.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "crc32c.h"
#include "slipstream/engine/log_format.h"
#include "slipstream/engine/log_scanner.h"
#include "slipstream/engine/log_writer.h"

namespace slipstream::engine {
namespace {

constexpr uint32_t kSegmentSize = 64u << 10;

struct Rec {
  LogRecordType type;
  uint64_t lsn;
  std::string payload;
  uint32_t offset = 0;  // where AppendRecord put it
};

// One append: its records and the cursor after its checksum entry.
struct Batch {
  std::vector<Rec> recs;
  uint32_t start = 0;  // cursor position before the append
  uint32_t end = 0;    // cursor position after the checksum entry
  uint32_t chain = 0;  // cursor chain after the append
};

// A zeroed segment image with a header, and the appends made to it.
class LogImage {
 public:
  explicit LogImage(uint64_t nonce = 0x1234567890abcdefull, uint64_t sequence = 7)
      : buf_(kSegmentSize, '\0') {
    StartLogSegment(buf_.data(), kSegmentSize, LogKind::kL0, sequence, 3, nonce, &cursor_);
    header_end_ = cursor_.pos;
    header_chain_ = cursor_.chain;
  }

  // Appends the records as one batch followed by a checksum entry. Each payload is passed in
  // two parts so that AppendRecord's concatenation is exercised.
  void Append(std::vector<Rec> recs) {
    Batch b;
    b.start = cursor_.pos;
    for (Rec& r : recs) {
      std::string_view p(r.payload);
      size_t cut = p.size() / 3;
      r.offset =
          AppendRecord(buf_.data(), &cursor_, r.type, r.lsn, {p.substr(0, cut), p.substr(cut)});
    }
    AppendChecksum(buf_.data(), &cursor_);
    b.recs = std::move(recs);
    b.end = cursor_.pos;
    b.chain = cursor_.chain;
    batches_.push_back(std::move(b));
  }

  std::vector<char>& buf() { return buf_; }
  const LogCursor& cursor() const { return cursor_; }
  const std::vector<Batch>& batches() const { return batches_; }
  uint32_t header_end() const { return header_end_; }
  uint32_t header_chain() const { return header_chain_; }

 private:
  std::vector<char> buf_;
  LogCursor cursor_;
  std::vector<Batch> batches_;
  uint32_t header_end_ = 0;
  uint32_t header_chain_ = 0;
};

std::string RandomBytes(std::mt19937& rng, size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = char(rng());
  return s;
}

// A deterministic mix of single-record and multi-record batches, empty and long payloads.
void FillLog(LogImage* log, uint32_t seed, int batches, uint64_t* next_lsn) {
  std::mt19937 rng(seed);
  const LogRecordType types[] = {LogRecordType::kPut,   LogRecordType::kDelete,
                                 LogRecordType::kValue, LogRecordType::kKeyspaceCreate,
                                 LogRecordType::kNext,  LogRecordType::kKeyspaceDrop};
  for (int b = 0; b < batches; b++) {
    int n = (b % 3 == 0) ? 1 : int(1 + rng() % 4);
    std::vector<Rec> recs;
    for (int i = 0; i < n; i++) {
      size_t len = (rng() % 7 == 0) ? 0 : rng() % 120;
      if (rng() % 11 == 0) len = 600 + rng() % 400;
      recs.push_back(Rec{types[rng() % 6], (*next_lsn)++, RandomBytes(rng, len)});
    }
    log->Append(std::move(recs));
  }
}

// Asserts that the scan holds exactly the records of the first `k` batches.
void ExpectBatches(const LogScan& scan, const LogImage& log, size_t k) {
  size_t want = 0;
  for (size_t b = 0; b < k; b++) want += log.batches()[b].recs.size();
  ASSERT_EQ(scan.records.size(), want);
  size_t i = 0;
  for (size_t b = 0; b < k; b++) {
    const Batch& batch = log.batches()[b];
    for (const Rec& r : batch.recs) {
      const ScannedRecord& got = scan.records[i++];
      ASSERT_EQ(got.type, r.type) << "record " << i - 1;
      ASSERT_EQ(got.lsn, r.lsn) << "record " << i - 1;
      ASSERT_EQ(got.payload, r.payload) << "record " << i - 1;
      ASSERT_EQ(got.offset, r.offset) << "record " << i - 1;
      ASSERT_EQ(got.batch_start, batch.start) << "record " << i - 1;
    }
  }
}

// Number of batches whose checksum entry lies completely within the first `len` bytes.
size_t CommittedWithin(const LogImage& log, size_t len) {
  size_t k = 0;
  while (k < log.batches().size() && log.batches()[k].end <= len) k++;
  return k;
}

// Finds a 64-bit x with f(x) == 0, for f affine over GF(2) (as CRC32C of a fixed-length
// message is in the message bits). Returns false if there is none.
bool SolveForZero(const std::function<uint32_t(uint64_t)>& f, uint64_t* x) {
  const uint32_t base = f(0);
  uint32_t basis[32] = {};  // basis[bit]: vector whose highest set bit is `bit`
  uint64_t combo[32] = {};  // the inputs XORed to produce basis[bit]
  for (int i = 0; i < 64; i++) {
    uint32_t v = f(uint64_t(1) << i) ^ base;
    uint64_t c = uint64_t(1) << i;
    for (int bit = 31; bit >= 0 && v; bit--) {
      if (!(v >> bit & 1)) continue;
      if (basis[bit] == 0) {
        basis[bit] = v;
        combo[bit] = c;
        v = 0;
      } else {
        v ^= basis[bit];
        c ^= combo[bit];
      }
    }
  }
  uint32_t target = base;
  uint64_t result = 0;
  for (int bit = 31; bit >= 0; bit--) {
    if (!(target >> bit & 1)) continue;
    if (basis[bit] == 0) return false;
    target ^= basis[bit];
    result ^= combo[bit];
  }
  *x = result;
  return f(result) == 0;
}

// An intact log scans back to exactly the records appended, with the writer's end and chain.
TEST(LogScan, RoundTripsEveryAppendedRecord) {
  LogImage log;
  uint64_t lsn = 100;
  FillLog(&log, 1, 40, &lsn);
  LogScan scan = ScanLogSegment(log.buf().data(), kSegmentSize);
  ASSERT_TRUE(scan.header_ok);
  EXPECT_FALSE(scan.stopped_at_damage);
  EXPECT_EQ(scan.valid_end, log.cursor().pos);
  EXPECT_EQ(scan.chain, log.cursor().chain);
  EXPECT_EQ(scan.header.magic, kLogMagic);
  EXPECT_EQ(scan.header.kind, uint32_t(LogKind::kL0));
  EXPECT_EQ(scan.header.sequence, 7u);
  EXPECT_EQ(scan.header.segment, 3u);
  EXPECT_EQ(scan.header.segment_size, kSegmentSize);
  ExpectBatches(scan, log, log.batches().size());
}

// A segment holding only its header is valid, empty and cleanly ended.
TEST(LogScan, HeaderOnlySegmentIsEmptyAndClean) {
  LogImage log;
  LogScan scan = ScanLogSegment(log.buf().data(), kSegmentSize);
  ASSERT_TRUE(scan.header_ok);
  EXPECT_FALSE(scan.stopped_at_damage);
  EXPECT_EQ(scan.valid_end, kLogHeaderSize);
  EXPECT_EQ(scan.chain, log.header_chain());
  EXPECT_TRUE(scan.records.empty());
}

// Cutting the written bytes at any length (rest zeroed) yields exactly the committed batches,
// never part of a batch, and reports damage exactly when the cut is inside an entry.
TEST(LogScan, EveryTruncationYieldsCommittedBatchPrefix) {
  LogImage log;
  uint64_t lsn = 1;
  FillLog(&log, 2, 25, &lsn);
  const uint32_t end = log.cursor().pos;
  std::vector<char> work(end + 64, '\0');
  for (uint32_t len = 0; len <= end; len++) {
    std::memset(work.data(), 0, work.size());
    std::memcpy(work.data(), log.buf().data(), len);
    LogScan scan = ScanLogSegment(work.data(), work.size());
    SCOPED_TRACE("len=" + std::to_string(len));
    if (len < kLogHeaderSize) {
      ASSERT_FALSE(scan.header_ok);
      ASSERT_TRUE(scan.records.empty());
      ASSERT_EQ(scan.valid_end, 0u);
      ASSERT_EQ(scan.stopped_at_damage, len > 0);
      continue;
    }
    ASSERT_TRUE(scan.header_ok);
    size_t k = CommittedWithin(log, len);
    ExpectBatches(scan, log, k);
    uint32_t want_end = k ? log.batches()[k - 1].end : log.header_end();
    ASSERT_EQ(scan.valid_end, want_end);
    ASSERT_LE(scan.valid_end, len);
    ASSERT_EQ(scan.chain, k ? log.batches()[k - 1].chain : log.header_chain());
    ASSERT_EQ(scan.stopped_at_damage, len != want_end);
  }
}

// Scanning a buffer that simply ends at any length (no zero padding) also yields only
// committed batches and never reads past the buffer.
TEST(LogScan, ShortBufferYieldsCommittedBatchPrefix) {
  LogImage log;
  uint64_t lsn = 1;
  FillLog(&log, 3, 25, &lsn);
  const uint32_t end = log.cursor().pos;
  for (uint32_t len = kLogHeaderSize; len <= end; len++) {
    // An exactly sized heap copy so that an over-read is an out-of-bounds access.
    std::vector<char> work(log.buf().begin(), log.buf().begin() + len);
    LogScan scan = ScanLogSegment(work.data(), work.size());
    SCOPED_TRACE("len=" + std::to_string(len));
    ASSERT_TRUE(scan.header_ok);
    size_t k = CommittedWithin(log, len);
    ExpectBatches(scan, log, k);
    ASSERT_EQ(scan.valid_end, k ? log.batches()[k - 1].end : log.header_end());
  }
}

// A last batch whose checksum entry is missing or torn (trailing 1..8 bytes zero, or its type
// word zero) is excluded, and the scan reports damage.
TEST(LogScan, TornChecksumExcludesLastBatch) {
  for (int multi = 0; multi < 2; multi++) {
    LogImage log;
    uint64_t lsn = 1;
    FillLog(&log, 4, 6, &lsn);
    log.Append(multi ? std::vector<Rec>{{LogRecordType::kPut, lsn, "alpha"},
                                        {LogRecordType::kDelete, lsn + 1, "beta"},
                                        {LogRecordType::kPut, lsn + 2, std::string(300, 'g')}}
                     : std::vector<Rec>{{LogRecordType::kPut, lsn, "single"}});
    const uint32_t end = log.cursor().pos;
    const size_t kept = log.batches().size() - 1;
    std::vector<char> original(log.buf().begin(), log.buf().begin() + end + 64);
    for (int zeroed = 1; zeroed <= 8; zeroed++) {
      std::vector<char> work = original;
      std::memset(work.data() + end - zeroed, 0, zeroed);
      LogScan scan = ScanLogSegment(work.data(), work.size());
      SCOPED_TRACE("multi=" + std::to_string(multi) + " zeroed=" + std::to_string(zeroed));
      ASSERT_TRUE(scan.header_ok);
      ExpectBatches(scan, log, kept);
      EXPECT_EQ(scan.valid_end, log.batches()[kept - 1].end);
      EXPECT_TRUE(scan.stopped_at_damage);
    }
    // Checksum value present but its type word never landed.
    std::vector<char> work = original;
    std::memset(work.data() + end - kChecksumEntrySize, 0, 4);
    LogScan scan = ScanLogSegment(work.data(), work.size());
    ExpectBatches(scan, log, kept);
    EXPECT_TRUE(scan.stopped_at_damage);
  }
}

// Flipping any single bit of a written log never yields a record that was not appended or one
// with other contents: the scan returns exactly the batches before the damaged one.
TEST(LogScan, SingleBitFlipsNeverYieldForeignRecords) {
  LogImage log;
  uint64_t lsn = 1;
  FillLog(&log, 5, 12, &lsn);
  const uint32_t end = log.cursor().pos;
  std::vector<char> work(log.buf().begin(), log.buf().begin() + end + 64);
  for (uint32_t byte = 0; byte < end; byte++) {
    for (int bit = 0; bit < 8; bit++) {
      work[byte] = char(work[byte] ^ (1 << bit));
      LogScan scan = ScanLogSegment(work.data(), work.size());
      work[byte] = char(work[byte] ^ (1 << bit));
      SCOPED_TRACE("byte=" + std::to_string(byte) + " bit=" + std::to_string(bit));
      if (byte < kLogHeaderSize) {
        ASSERT_FALSE(scan.header_ok);
        ASSERT_TRUE(scan.records.empty());
        ASSERT_EQ(scan.valid_end, 0u);
        ASSERT_TRUE(scan.stopped_at_damage);
        continue;
      }
      ASSERT_TRUE(scan.header_ok);
      // The batches entirely before the flipped byte survive; the one holding it does not.
      size_t k = CommittedWithin(log, byte);
      ExpectBatches(scan, log, k);
      ASSERT_LE(scan.valid_end, byte);
    }
  }
  // Unflipped, the image is intact again.
  LogScan scan = ScanLogSegment(work.data(), work.size());
  ExpectBatches(scan, log, log.batches().size());
}

// Non-zero bytes after the last checksum are damage but cost no committed record.
TEST(LogScan, GarbageAfterEndKeepsCommittedRecords) {
  LogImage log;
  uint64_t lsn = 1;
  FillLog(&log, 6, 10, &lsn);
  const uint32_t end = log.cursor().pos;
  std::mt19937 rng(6);
  for (int trial = 0; trial < 200; trial++) {
    std::vector<char> work(log.buf().begin(), log.buf().begin() + end + 256);
    size_t at = end + rng() % 200;
    size_t n = 1 + rng() % 40;
    for (size_t i = 0; i < n; i++) work[at + i] = char(rng() | 1);
    LogScan scan = ScanLogSegment(work.data(), work.size());
    ExpectBatches(scan, log, log.batches().size());
    EXPECT_EQ(scan.valid_end, end);
    EXPECT_EQ(scan.chain, log.cursor().chain);
    EXPECT_EQ(scan.stopped_at_damage, at < end + 4) << "a zero word ends the log before at";
  }
}

// When the chain is exactly zero after a record, the stored checksum is still non-zero (so a
// zeroed tail can never pass for it) and the scan accepts it.
TEST(LogScan, ZeroChainStoresNonZeroChecksum) {
  LogImage log;
  uint64_t lsn = 1;
  FillLog(&log, 7, 3, &lsn);
  const std::string payload = "chain-to-zero";
  const uint32_t chain = log.cursor().chain;
  // The chain after one record is affine in the record's LSN: solve for an LSN that zeroes it.
  auto chain_after = [&](uint64_t x) {
    RecordHeader h;
    h.type_and_length = (uint32_t(payload.size()) << 8) | uint8_t(LogRecordType::kPut);
    h.payload_crc = crc32c::Value(payload.data(), payload.size());
    h.lsn = x;
    return crc32c::Extend(chain, &h, sizeof(h));
  };
  uint64_t zero_lsn;
  ASSERT_TRUE(SolveForZero(chain_after, &zero_lsn));
  const uint32_t before = log.cursor().pos;
  log.Append({{LogRecordType::kPut, zero_lsn, payload}});
  ASSERT_EQ(log.cursor().chain, 0u);
  uint32_t stored_type, stored_value;
  std::memcpy(&stored_type, log.buf().data() + log.cursor().pos - 8, 4);
  std::memcpy(&stored_value, log.buf().data() + log.cursor().pos - 4, 4);
  EXPECT_EQ(stored_type, uint32_t(LogRecordType::kChecksum));
  EXPECT_NE(stored_value, 0u);
  EXPECT_EQ(stored_value, NonZero(0));
  EXPECT_EQ(log.cursor().pos, before + RecordSpace(payload.size()) + kChecksumEntrySize);

  log.Append({{LogRecordType::kDelete, lsn++, "after"}});
  LogScan scan = ScanLogSegment(log.buf().data(), kSegmentSize);
  EXPECT_FALSE(scan.stopped_at_damage);
  ExpectBatches(scan, log, log.batches().size());
  EXPECT_EQ(scan.valid_end, log.cursor().pos);

  // A checksum entry holding zero is never accepted, even where the chain is zero.
  std::vector<char> work(log.buf().begin(), log.buf().begin() + log.cursor().pos + 64);
  std::memset(work.data() + log.batches()[3].end - 4, 0, 4);
  scan = ScanLogSegment(work.data(), work.size());
  ExpectBatches(scan, log, 3);
  EXPECT_TRUE(scan.stopped_at_damage);
}

// A header whose CRC (the chain's seed) is zero still yields a usable segment.
TEST(LogScan, ZeroHeaderCrcSeedStillScans) {
  auto header_crc = [](uint64_t nonce) {
    LogCursor c;
    std::vector<char> b(kLogHeaderSize);
    StartLogSegment(b.data(), kSegmentSize, LogKind::kL0, 1, 3, nonce, &c);
    return c.chain;
  };
  uint64_t nonce;
  ASSERT_TRUE(SolveForZero(header_crc, &nonce));
  LogImage log(nonce, 1);
  ASSERT_EQ(log.header_chain(), 0u);
  log.Append({});  // an empty append: the checksum alone
  log.Append({{LogRecordType::kValue, 5, "v"}});
  LogScan scan = ScanLogSegment(log.buf().data(), kSegmentSize);
  ASSERT_TRUE(scan.header_ok);
  EXPECT_FALSE(scan.stopped_at_damage);
  ExpectBatches(scan, log, 2);
  EXPECT_EQ(scan.valid_end, log.cursor().pos);
}

// A zeroed (never written) segment is not damage and has no header or records.
TEST(LogScan, ZeroedSegmentIsCleanAndEmpty) {
  std::vector<char> zero(kSegmentSize, '\0');
  for (size_t size : {size_t(0), size_t(10), kLogHeaderSize, size_t(kSegmentSize)}) {
    LogScan scan = ScanLogSegment(zero.data(), size);
    EXPECT_FALSE(scan.header_ok) << size;
    EXPECT_FALSE(scan.stopped_at_damage) << size;
    EXPECT_EQ(scan.valid_end, 0u) << size;
    EXPECT_TRUE(scan.records.empty()) << size;
  }
}

// Random bytes are damage with no records, whatever the seed.
TEST(LogScan, RandomGarbageIsDamage) {
  std::mt19937 rng(8);
  for (int trial = 0; trial < 100; trial++) {
    std::string junk = RandomBytes(rng, 4096);
    junk[0] = char(junk[0] | 1);  // at least one non-zero byte in the header area
    LogScan scan = ScanLogSegment(junk.data(), junk.size());
    EXPECT_FALSE(scan.header_ok);
    EXPECT_TRUE(scan.stopped_at_damage);
    EXPECT_TRUE(scan.records.empty());
    EXPECT_EQ(scan.valid_end, 0u);
  }
  // Garbage after a valid header: no record passes the payload CRC and checksum chain.
  for (int trial = 0; trial < 200; trial++) {
    LogImage log(rng(), 1);
    std::string junk = RandomBytes(rng, 4096);
    std::memcpy(log.buf().data() + kLogHeaderSize, junk.data(), junk.size());
    LogScan scan = ScanLogSegment(log.buf().data(), kSegmentSize);
    EXPECT_TRUE(scan.header_ok);
    EXPECT_TRUE(scan.records.empty());
    EXPECT_EQ(scan.valid_end, kLogHeaderSize);
  }
}

// A header with a correct CRC but an unknown log kind is not accepted.
TEST(LogScan, UnknownKindHeaderIsRejected) {
  LogImage log;
  log.Append({{LogRecordType::kPut, 1, "x"}});
  for (uint32_t kind : {0u, 6u, 0xffffffffu}) {  // 1..5: engine logs, WAL, index stream
    std::vector<char> work(log.buf().begin(), log.buf().begin() + 512);
    LogSegmentHeader h;
    std::memcpy(&h, work.data(), sizeof(h));
    h.kind = kind;
    h.header_crc = crc32c::Value(&h, offsetof(LogSegmentHeader, header_crc));
    std::memcpy(work.data(), &h, sizeof(h));
    LogScan scan = ScanLogSegment(work.data(), work.size());
    EXPECT_FALSE(scan.header_ok) << kind;
    EXPECT_TRUE(scan.stopped_at_damage) << kind;
    EXPECT_TRUE(scan.records.empty()) << kind;
  }
}

// Reusing a segment without zeroing it, with a new header and nonce and a shorter log, scans
// back only the new log's records: stale batches never chain on.
TEST(LogScan, StaleBytesFromEarlierUseAreIgnored) {
  // Log A: 30 batches.
  LogImage a(0xaaaa0001, 1);
  uint64_t lsn = 1;
  FillLog(&a, 9, 30, &lsn);
  ASSERT_EQ(ScanLogSegment(a.buf().data(), kSegmentSize).records.size(), [&] {
    size_t n = 0;
    for (const Batch& b : a.batches()) n += b.recs.size();
    return n;
  }());

  // Log B over the same bytes, identical records for its first 10 batches: the same offsets
  // and entry bytes as A, only the header (nonce) differs.
  for (uint64_t nonce : {uint64_t(0xbbbb0002), uint64_t(0xaaaa0001 ^ 1)}) {
    std::vector<char> reused = a.buf();
    LogCursor cursor;
    StartLogSegment(reused.data(), kSegmentSize, LogKind::kL0, 1, 3, nonce, &cursor);
    for (size_t b = 0; b < 10; b++) {
      for (const Rec& r : a.batches()[b].recs) {
        AppendRecord(reused.data(), &cursor, r.type, r.lsn, {r.payload});
      }
      AppendChecksum(reused.data(), &cursor);
    }
    ASSERT_EQ(cursor.pos, a.batches()[9].end);
    LogScan scan = ScanLogSegment(reused.data(), kSegmentSize);
    ASSERT_TRUE(scan.header_ok);
    ExpectBatches(scan, a, 10);
    EXPECT_EQ(scan.valid_end, cursor.pos);
    EXPECT_EQ(scan.chain, cursor.chain);
    EXPECT_TRUE(scan.stopped_at_damage);  // A's stale 11th batch does not match B's chain
  }

  // Log B with different, shorter contents.
  std::vector<char> reused = a.buf();
  LogCursor cursor;
  StartLogSegment(reused.data(), kSegmentSize, LogKind::kL0, 2, 3, 0xcccc0003, &cursor);
  AppendRecord(reused.data(), &cursor, LogRecordType::kPut, 500, {"b-one"});
  AppendRecord(reused.data(), &cursor, LogRecordType::kPut, 501, {"b-two"});
  AppendChecksum(reused.data(), &cursor);
  AppendRecord(reused.data(), &cursor, LogRecordType::kDelete, 502, {"b-three"});
  AppendChecksum(reused.data(), &cursor);
  LogScan scan = ScanLogSegment(reused.data(), kSegmentSize);
  ASSERT_TRUE(scan.header_ok);
  ASSERT_EQ(scan.records.size(), 3u);
  EXPECT_EQ(scan.records[0].payload, "b-one");
  EXPECT_EQ(scan.records[1].payload, "b-two");
  EXPECT_EQ(scan.records[2].payload, "b-three");
  EXPECT_EQ(scan.records[2].lsn, 502u);
  EXPECT_EQ(scan.valid_end, cursor.pos);
  EXPECT_EQ(scan.header.nonce, 0xcccc0003u);
}

// Appending from a scan's valid_end and chain continues the log: old and new records scan back.
TEST(LogScan, ResumeFromScanContinuesChain) {
  LogImage log;
  uint64_t lsn = 1;
  FillLog(&log, 10, 8, &lsn);
  const uint32_t end = log.cursor().pos;
  // Tear the last batch, then zero what follows the valid prefix (as a writer reusing a torn
  // tail must) and resume.
  std::vector<char> work(log.buf().begin(), log.buf().end());
  std::memset(work.data() + end - 3, 0, 3);
  LogScan scan = ScanLogSegment(work.data(), work.size());
  ASSERT_EQ(scan.valid_end, log.batches()[6].end);
  std::memset(work.data() + scan.valid_end, 0, work.size() - scan.valid_end);
  LogCursor cursor{scan.valid_end, scan.chain};
  AppendRecord(work.data(), &cursor, LogRecordType::kPut, 9000, {"resumed", "!"});
  AppendChecksum(work.data(), &cursor);
  LogScan again = ScanLogSegment(work.data(), work.size());
  EXPECT_FALSE(again.stopped_at_damage);
  EXPECT_EQ(again.valid_end, cursor.pos);
  size_t before = scan.records.size();
  ASSERT_EQ(again.records.size(), before + 1);
  for (size_t i = 0; i < before; i++) {
    EXPECT_EQ(again.records[i].payload, scan.records[i].payload);
    EXPECT_EQ(again.records[i].lsn, scan.records[i].lsn);
  }
  EXPECT_EQ(again.records[before].payload, "resumed!");
  EXPECT_EQ(again.records[before].lsn, 9000u);
}

}  // namespace
}  // namespace slipstream::engine
