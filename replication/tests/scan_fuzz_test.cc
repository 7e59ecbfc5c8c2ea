// Tailwind's recovery of an open buffer, fuzzed: buffers filled with random appends, then torn
// at a random byte (everything after it never arrived) and/or hit by a random bit flip. The
// valid prefix must end exactly at the last append that was whole and undamaged: never
// beyond it (a damaged or torn record accepted) and never before it (an acknowledged one lost).
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
