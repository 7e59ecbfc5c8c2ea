// Segment allocation and reuse seen through the public API: overwriting a fixed key set keeps
// the segments in use and the device file bounded, and a dropped keyspace's space comes back.
#include <sys/stat.h>

#include <random>
#include <string>
#include <vector>

#include "test_util.h"

namespace slipstream::engine::test {
namespace {

// Pseudo-random (incompressible, so LZ4 cannot shrink large values) and unique per key and round.
std::string ValueOf(size_t size, int key, int round) {
  std::mt19937_64 rng(uint64_t(key) * 1000003 + uint64_t(round));
  std::string v(size, '\0');
  for (size_t i = 0; i < size; i++) v[i] = char(rng());
  return v;
}

std::string KeyOf(int i) {
  return "key-" + std::to_string(i);
}

// Medium (in place or in the medium log) and large values, varying per key.
size_t SizeOf(int key) {
  static const size_t kSizes[] = {150, 400, 900, 1500, 4000};
  return kSizes[key % 5];
}

uint64_t DeviceFileBytes(const std::string& dir) {
  struct stat st;
  if (stat((dir + "/segments").c_str(), &st) != 0) return 0;
  return uint64_t(st.st_size);
}

// Writes every key once with this round's values.
void WriteRound(TestEngine& t, KeyspaceId ks, int keys, int round) {
  for (int k = 0; k < keys; k++) {
    Status s = t->Put(ks, KeyOf(k), ValueOf(SizeOf(k), k, round));
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
}

void CheckRound(TestEngine& t, KeyspaceId ks, int keys, int round) {
  for (int k = 0; k < keys; k += 7) {
    std::string got;
    Status s = t->Get(ks, KeyOf(k), &got);
    ASSERT_TRUE(s.ok()) << KeyOf(k) << " " << s.ToString();
    ASSERT_EQ(got, ValueOf(SizeOf(k), k, round)) << KeyOf(k);
  }
}

// Overwriting the same 2000 keys for 10 rounds (compacting and collecting garbage each round)
// reuses space: segments in use and the device file stay within ~2x of round 2.
TEST(Allocator, OverwritesReuseSegments) {
  TestEngine t;
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(1, &ks).ok());
  constexpr int kKeys = 2000;
  constexpr int kRounds = 10;
  std::vector<uint64_t> in_use(kRounds + 1), file(kRounds + 1);
  for (int round = 1; round <= kRounds; round++) {
    WriteRound(t, ks, kKeys, round);
    ASSERT_TRUE(t->CompactAll().ok());
    Status s = t->RunGC();
    ASSERT_TRUE(s.ok()) << s.ToString();
    Stats st = t->GetStats();
    in_use[round] = st.segments_in_use;
    file[round] = DeviceFileBytes(t.dir.path());
    CheckRound(t, ks, kKeys, round);
    s = t->Verify();
    ASSERT_TRUE(s.ok()) << "round " << round << ": " << s.ToString();
  }
  std::string trace;
  for (int r = 1; r <= kRounds; r++) {
    trace += " r" + std::to_string(r) + "=" + std::to_string(in_use[r]) + "/" +
             std::to_string(file[r] / t.options.segment_size);
  }
  SCOPED_TRACE("segments in use / device segments:" + trace);
  ASSERT_GT(in_use[2], 0u);
  EXPECT_LE(in_use[kRounds], 2 * in_use[2]);
  EXPECT_LE(file[kRounds], 2 * file[2]);
  // Live data per round is ~2000 * 1.4 KB = 2.8 MB, i.e. ~11 segments of 256 KiB. Far more
  // than that in use means overwritten values are not being reclaimed.
  EXPECT_LE(in_use[kRounds] * t.options.segment_size, 16 * (kKeys * 1390ull));
}

// With live data well past the device file's initial 64 segments, overwrite rounds with
// compaction and GC stop growing the device file after the second round.
TEST(Allocator, DeviceFileStopsGrowingUnderOverwrites) {
  TestEngine t;
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(1, &ks).ok());
  constexpr int kKeys = 2000;  // ~23 MB live: about 90 segments of 256 KiB
  constexpr int kRounds = 4;
  std::vector<uint64_t> in_use(kRounds + 1), file(kRounds + 1);
  for (int round = 1; round <= kRounds; round++) {
    for (int k = 0; k < kKeys; k++) {
      Status s = t->Put(ks, KeyOf(k), ValueOf(4000 + (k % 4) * 5000, k, round));
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
    ASSERT_TRUE(t->CompactAll().ok());
    ASSERT_TRUE(t->RunGC().ok());
    in_use[round] = t->GetStats().segments_in_use;
    file[round] = DeviceFileBytes(t.dir.path());
  }
  std::string trace;
  for (int r = 1; r <= kRounds; r++) {
    trace += " r" + std::to_string(r) + "=" + std::to_string(in_use[r]) + "/" +
             std::to_string(file[r] / t.options.segment_size);
  }
  SCOPED_TRACE("segments in use / device segments:" + trace);
  EXPECT_GT(file[2], 64ull * t.options.segment_size);
  EXPECT_LE(file[kRounds], file[2] + file[2] / 4);
  EXPECT_LE(in_use[kRounds], in_use[2] + in_use[2] / 4);
  std::string got;
  ASSERT_TRUE(t->Get(ks, KeyOf(kKeys - 1), &got).ok());
  EXPECT_EQ(got, ValueOf(4000 + ((kKeys - 1) % 4) * 5000, kKeys - 1, kRounds));
}

// A host that only runs DoBackgroundWork (no CompactAll) also keeps the space of overwritten
// large values bounded: segments in use after 8 overwrite rounds stay within 2x of round 2.
TEST(Allocator, BackgroundWorkBoundsOverwrittenLargeValues) {
  TestEngine t;
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(1, &ks).ok());
  constexpr int kKeys = 1000;  // 4000-byte values: ~4 MB live, about 16 segments
  constexpr int kRounds = 8;
  std::vector<uint64_t> in_use(kRounds + 1), file(kRounds + 1), l0(kRounds + 1);
  std::vector<uint64_t> compactions(kRounds + 1);
  for (int round = 1; round <= kRounds; round++) {
    for (int k = 0; k < kKeys; k++) {
      Status s = t->Put(ks, KeyOf(k), ValueOf(4000, k, round));
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
    while (t->DoBackgroundWork()) {
    }
    Stats st = t->GetStats();
    in_use[round] = st.segments_in_use;
    file[round] = DeviceFileBytes(t.dir.path());
    l0[round] = st.l0_entries;
    compactions[round] = st.compactions;
  }
  std::string trace;
  for (int r = 1; r <= kRounds; r++) {
    trace += " r" + std::to_string(r) + "=" + std::to_string(in_use[r]) + "/" +
             std::to_string(file[r] / t.options.segment_size) + "(l0=" + std::to_string(l0[r]) +
             ",c=" + std::to_string(compactions[r]) + ")";
  }
  SCOPED_TRACE("segments in use / device segments (L0 entries, compactions):" + trace);
  EXPECT_LE(in_use[kRounds], 2 * in_use[2]);
  EXPECT_LE(file[kRounds], 2 * file[2]);
  std::string got;
  ASSERT_TRUE(t->Get(ks, KeyOf(5), &got).ok());
  EXPECT_EQ(got, ValueOf(4000, 5, kRounds));
}

// Dropping a keyspace and compacting returns its segments to the free pool, and the space is
// reused by later writes instead of growing the device file.
TEST(Allocator, DropKeyspaceReclaimsSpace) {
  TestEngine t;
  KeyspaceId keep, drop;
  ASSERT_TRUE(t->CreateKeyspace(1, &keep).ok());
  ASSERT_TRUE(t->CreateKeyspace(2, &drop).ok());
  WriteRound(t, keep, 300, 1);
  ASSERT_TRUE(t->CompactAll().ok());
  const uint64_t baseline = t->GetStats().segments_in_use;

  WriteRound(t, drop, 3000, 1);
  ASSERT_TRUE(t->CompactAll().ok());
  const uint64_t loaded = t->GetStats().segments_in_use;
  const uint64_t file_loaded = DeviceFileBytes(t.dir.path());
  ASSERT_GT(loaded, baseline + 10) << "the dropped keyspace should occupy many segments";

  ASSERT_TRUE(t->DropKeyspace(drop).ok());
  ASSERT_TRUE(t->CompactAll().ok());
  ASSERT_TRUE(t->RunGC().ok());
  const uint64_t after = t->GetStats().segments_in_use;
  EXPECT_LE(after, baseline + (loaded - baseline) / 4)
      << "baseline " << baseline << " loaded " << loaded << " after drop " << after;
  Status s = t->Verify();
  ASSERT_TRUE(s.ok()) << s.ToString();
  CheckRound(t, keep, 300, 1);
  std::string got;
  EXPECT_FALSE(t->Get(drop, KeyOf(0), &got).ok());

  // A new keyspace of the same size fits in the reclaimed space.
  KeyspaceId again;
  ASSERT_TRUE(t->CreateKeyspace(3, &again).ok());
  WriteRound(t, again, 3000, 2);
  ASSERT_TRUE(t->CompactAll().ok());
  EXPECT_LE(DeviceFileBytes(t.dir.path()), file_loaded + file_loaded / 4);
  CheckRound(t, again, 3000, 2);
}

// After a drop, the next compaction that rewrites the level holding the dropped keyspace's
// entries (here: L0 into the only level, triggered by one unrelated write) frees its segments.
TEST(Allocator, DropKeyspaceReclaimedByNextMerge) {
  TestEngine t;
  KeyspaceId keep, drop;
  ASSERT_TRUE(t->CreateKeyspace(1, &keep).ok());
  ASSERT_TRUE(t->CreateKeyspace(2, &drop).ok());
  WriteRound(t, keep, 300, 1);
  ASSERT_TRUE(t->CompactAll().ok());
  const uint64_t baseline = t->GetStats().segments_in_use;
  WriteRound(t, drop, 3000, 1);
  ASSERT_TRUE(t->CompactAll().ok());
  const uint64_t loaded = t->GetStats().segments_in_use;
  ASSERT_GT(loaded, baseline + 10);

  ASSERT_TRUE(t->DropKeyspace(drop).ok());
  ASSERT_TRUE(t->Put(keep, "one-more", "value").ok());
  ASSERT_TRUE(t->CompactAll().ok());
  ASSERT_TRUE(t->RunGC().ok());
  Stats st = t->GetStats();
  EXPECT_LE(st.segments_in_use, baseline + 2) << "baseline " << baseline << " loaded " << loaded;
  uint64_t entries = 0;
  for (const LevelStats& l : st.levels) entries += l.entries;
  EXPECT_EQ(entries, 301u) << "the dropped keyspace's entries are gone from the levels";
  Status s = t->Verify();
  ASSERT_TRUE(s.ok()) << s.ToString();
  CheckRound(t, keep, 300, 1);
}

// Repeated create / fill / drop cycles keep the device file bounded.
TEST(Allocator, DropCyclesKeepDeviceBounded) {
  TestEngine t;
  std::vector<uint64_t> file;
  for (int cycle = 0; cycle < 6; cycle++) {
    KeyspaceId ks;
    ASSERT_TRUE(t->CreateKeyspace(100 + cycle, &ks).ok());
    WriteRound(t, ks, 1500, cycle);
    ASSERT_TRUE(t->CompactAll().ok());
    ASSERT_TRUE(t->DropKeyspace(ks).ok());
    ASSERT_TRUE(t->CompactAll().ok());
    ASSERT_TRUE(t->RunGC().ok());
    file.push_back(DeviceFileBytes(t.dir.path()));
  }
  std::string trace;
  for (uint64_t f : file) trace += " " + std::to_string(f / t.options.segment_size);
  EXPECT_LE(file.back(), 2 * file[1]) << "device segments per cycle:" << trace;
  Status s = t->Verify();
  ASSERT_TRUE(s.ok()) << s.ToString();
}

}  // namespace
}  // namespace slipstream::engine::test
