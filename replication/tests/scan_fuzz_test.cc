// Tailwind's recovery of an open buffer, fuzzed: buffers filled with random appends, then torn
// at a random byte (everything after it never arrived) and/or hit by a random bit flip. The
// valid prefix must end exactly at the last append that was whole and undamaged: never
// beyond it (a damaged or torn record accepted) and never before it (an acknowledged one lost).
// A scan resumed where an earlier one ended (as the backup's persists are) finds the same.
#include <gtest/gtest.h>

#include <random>

#include "buffer_scan.h"
#include "slipstream/engine/log_writer.h"

namespace slipstream::replication {
namespace {

constexpr uint32_t kSize = 8192;

// A buffer of random appends (each a few records and one checksum), and where each ends.
struct Image {
  std::string bytes;
  std::vector<uint32_t> ends;  // the header's end, then every append's end
};

Image MakeImage(std::mt19937_64& rng, uint64_t sequence) {
  Image img;
  img.bytes.assign(kSize, '\0');
  engine::LogCursor cursor;
  engine::StartLogSegment(img.bytes.data(), kSize, engine::LogKind::kWal, sequence, 0, rng(),
                          &cursor);
  img.ends.push_back(cursor.pos);
  uint64_t position = rng() % 1000000;
  while (true) {
    int records = 1 + int(rng() % 3);
    std::vector<std::string> payloads;
    size_t need = engine::kChecksumEntrySize;
    for (int r = 0; r < records; r++) {
      payloads.emplace_back(size_t(rng() % 300), '\0');
      for (char& c : payloads.back()) c = char(rng());
      need += engine::kRecordHeaderSize + payloads.back().size();
    }
    if (cursor.pos + need > kSize) break;
    for (const std::string& p : payloads) {
      engine::AppendRecord(img.bytes.data(), &cursor, engine::LogRecordType::kWal, position, {p});
      position += p.size();
    }
    engine::AppendChecksum(img.bytes.data(), &cursor);
    img.ends.push_back(cursor.pos);
  }
  return img;
}

// The end of the last append that lies wholly before `damage`.
uint32_t LastWholeEnd(const Image& img, uint32_t damage) {
  uint32_t best = 0;
  for (uint32_t e : img.ends) {
    if (e <= damage) best = e;
  }
  return best;
}

TEST(ScanFuzz, TornAndFlippedBuffersKeepExactlyTheWholeAppends) {
  std::mt19937_64 rng(20261125);
  int cases = 0, torn = 0, flipped = 0;
  while (cases < 100000) {
    uint64_t sequence = rng() % 1000;
    Image img = MakeImage(rng, sequence);
    uint32_t used = img.ends.back();
    for (int variant = 0; variant < 20; variant++, cases++) {
      std::string bytes = img.bytes;
      int kind = int(rng() % 3);
      if (kind != 1) {  // torn: the bytes from `tear` on never arrived
        uint32_t tear = uint32_t(rng() % (used + 1));
        std::fill(bytes.begin() + tear, bytes.end(), '\0');
        torn++;
      }
      if (kind != 0) {  // a bit flip anywhere in what was written
        bytes[rng() % used] ^= char(1u << (rng() % 8));
        flipped++;
      }
      // The first byte that is not what the primary wrote (a flip may restore a torn byte).
      uint32_t damage = used;
      for (uint32_t i = 0; i < used; i++) {
        if (bytes[i] != img.bytes[i]) {
          damage = i;
          break;
        }
      }
      uint32_t expected = LastWholeEnd(img, damage);
      if (expected < img.ends[0]) expected = 0;  // the header itself is damaged
      uint32_t got = ValidPrefix(bytes.data(), kSize, uint32_t(StreamId::kWal), sequence);
      ASSERT_EQ(got, expected) << "case " << cases << " damage at " << damage;
    }
  }
  EXPECT_GT(torn, 30000);
  EXPECT_GT(flipped, 30000);
}

// The backup's scans resume where the durable prefix ended: a buffer scanned once when some
// appends had arrived, then torn and flipped only beyond that point (the bytes below it are
// never written again), and scanned again from there, finds what one full scan finds, and
// the records of the second scan are those beyond the first's end.
TEST(ScanFuzz, ResumedScansFindWhatFullScansFind) {
  std::mt19937_64 rng(20261202);
  for (int cases = 0; cases < 20000; cases++) {
    uint64_t sequence = rng() % 1000;
    Image img = MakeImage(rng, sequence);
    uint32_t used = img.ends.back();
    // The first scan, when the appends up to ends[k] had arrived.
    size_t k = rng() % img.ends.size();
    std::string early(img.bytes.begin(), img.bytes.begin() + img.ends[k]);
    early.resize(kSize, '\0');
    engine::LogScan first = ScanBuffer(early.data(), kSize, uint32_t(StreamId::kWal), sequence, {});
    ASSERT_EQ(first.valid_end, img.ends[k]);
    ScanPoint point{first.valid_end, first.chain};
    // Then the rest arrives, torn and/or flipped beyond the point.
    std::string bytes = img.bytes;
    if (used > point.offset) {
      int kind = int(rng() % 3);
      if (kind != 1) {
        uint32_t tear = point.offset + uint32_t(rng() % (used - point.offset + 1));
        std::fill(bytes.begin() + tear, bytes.end(), '\0');
      }
      if (kind != 0) bytes[point.offset + rng() % (used - point.offset)] ^= char(1u << (rng() % 8));
    }
    engine::LogScan full = engine::ScanLogSegment(bytes.data(), kSize);
    engine::LogScan resumed =
        ScanBuffer(bytes.data(), kSize, uint32_t(StreamId::kWal), sequence, point);
    ASSERT_EQ(resumed.valid_end,
              ValidPrefix(bytes.data(), kSize, uint32_t(StreamId::kWal), sequence))
        << "case " << cases;
    ASSERT_EQ(resumed.chain, full.chain) << "case " << cases;
    size_t beyond = 0;
    for (const engine::ScannedRecord& r : full.records) beyond += r.offset >= point.offset;
    ASSERT_EQ(resumed.records.size(), beyond) << "case " << cases;
    // A resumed scan still checks which segment the buffer holds.
    ASSERT_EQ(
        ScanBuffer(bytes.data(), kSize, uint32_t(StreamId::kWal), sequence + 1, point).valid_end,
        0u);
  }
}

TEST(ScanFuzz, ABufferOfAnotherSegmentOrStreamIsNotValid) {
  std::mt19937_64 rng(1);
  Image img = MakeImage(rng, 5);
  EXPECT_EQ(ValidPrefix(img.bytes.data(), kSize, uint32_t(StreamId::kWal), 5), img.ends.back());
  EXPECT_EQ(ValidPrefix(img.bytes.data(), kSize, uint32_t(StreamId::kWal), 6), 0u);
  EXPECT_EQ(ValidPrefix(img.bytes.data(), kSize, uint32_t(StreamId::kEngineL0), 5), 0u);
  EXPECT_EQ(ValidPrefix(img.bytes.data(), kSize / 2, uint32_t(StreamId::kWal), 5), 0u);
  std::string zero(kSize, '\0');
  EXPECT_EQ(ValidPrefix(zero.data(), kSize, uint32_t(StreamId::kWal), 5), 0u);
}

}  // namespace
}  // namespace slipstream::replication
