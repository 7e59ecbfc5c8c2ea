// WalDirectoryStore and the WAL files it writes, on real files in a temporary directory: WAL
// file names, bytes at their WAL positions across a segment boundary, the resume position, a
// gap refused, an overlap written again harmlessly, the redo from kept images after a crash,
// the WAL end waiting for the fsync of pg_wal and the crash cases of that order,
// FileBackupStore's resume position over overlapping and gapped segments, and pruning (what
// goes, what stays, and that no answer changes).
#include "slipstream/replication/wal_directory_store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "slipstream/engine/log_scanner.h"
#include "slipstream/engine/log_writer.h"
#include "test_util.h"
#include "wal_files.h"

namespace slipstream::replication {
namespace {

constexpr uint32_t kWal = uint32_t(StreamId::kWal);
constexpr uint64_t kSegment = 1ull << 20;  // the smallest WAL segment PostgreSQL allows
constexpr uint32_t kImageSize = 64 * 1024;

using Dirs = test::BackupDirs;

// One buffer image being filled the way a primary fills it: records, each append followed by
// its checksum.
class Image {
 public:
  explicit Image(uint64_t sequence) : bytes_(kImageSize, '\0') {
    engine::StartLogSegment(bytes_.data(), kImageSize, engine::LogKind::kWal, sequence, 0, 99,
                            &cursor_);
  }
  // Appends a record of `payload` at stream position `position`; returns the valid end.
  uint32_t Append(uint64_t position, const std::string& payload) {
    engine::AppendRecord(bytes_.data(), &cursor_, engine::LogRecordType::kWal, position, {payload});
    engine::AppendChecksum(bytes_.data(), &cursor_);
    return cursor_.pos;
  }
  const char* data() const { return bytes_.data(); }

 private:
  std::string bytes_;
  engine::LogCursor cursor_;
};

std::string Random(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = char(rng());
  return s;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The bytes of WAL positions [position, position + n) in a pg_wal directory.
std::string ReadWal(const std::string& dir, uint32_t timeline, uint64_t position, size_t n) {
  std::string out;
  while (out.size() < n) {
    uint64_t p = position + out.size();
    std::string file = ReadFile(dir + "/" + WalFileName(timeline, p / kSegment, kSegment));
    if (file.size() != kSegment) return out;  // missing or short: the caller sees it
    size_t take = std::min<size_t>(n - out.size(), kSegment - p % kSegment);
    out.append(file, p % kSegment, take);
  }
  return out;
}

std::unique_ptr<WalDirectoryStore> OpenStore(const Dirs& d, uint64_t resume,
                                             uint32_t timeline = 1) {
  WalDirectoryOptions o;
  o.image_directory = d.images();
  o.wal_directory = d.wal();
  o.timeline = timeline;
  o.segment_size = kSegment;
  o.resume = resume;
  std::unique_ptr<WalDirectoryStore> store;
  Status s = WalDirectoryStore::Open(o, &store);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return store;
}

// The valid records of image[0, to) at offsets >= from: what the backup server hands a store.
std::vector<engine::ScannedRecord> Records(const char* image, uint32_t from, uint32_t to) {
  engine::LogScan scan = engine::ScanLogSegment(image, to);
  std::vector<engine::ScannedRecord> records;
  for (const engine::ScannedRecord& r : scan.records) {
    if (r.offset >= from) records.push_back(r);
  }
  return records;
}

// Persists image[from, to) as the backup server does: Persist with the records of [from, to),
// then Settle (after the answer would have gone out).
Status Persist(BackupStore* store, const SegmentId& id, const char* image, uint32_t from,
               uint32_t to, bool closed) {
  Status s = store->Persist(id, image, from, to, Records(image, from, to), closed);
  Status settled = store->Settle();
  return s.ok() ? settled : s;
}

// Overwrites WAL positions [position, position + n) of a pg_wal directory with `bytes` (zeros
// if empty): what a crash leaves of writes that were not fsynced.
void OverwriteWal(const std::string& dir, uint64_t position, size_t n, std::string bytes = "") {
  if (bytes.empty()) bytes.assign(n, '\0');
  WalFileWriter w(dir, 1, kSegment);
  ASSERT_TRUE(w.Write(position, bytes).ok());
  ASSERT_TRUE(w.Sync().ok());
}

TEST(WalFiles, NamesArePostgresXLogFileNames) {
  constexpr uint64_t k16MB = 16ull << 20;
  EXPECT_EQ(WalFileName(1, 0, k16MB), "000000010000000000000000");
  EXPECT_EQ(WalFileName(1, 3, k16MB), "000000010000000000000003");
  // 0/FF000000 and 1/02000000: 256 segments of 16 MB per 4 GB "log id".
  EXPECT_EQ(WalFileName(1, 0xff, k16MB), "0000000100000000000000FF");
  EXPECT_EQ(WalFileName(1, 0x102, k16MB), "000000010000000100000002");
  EXPECT_EQ(WalFileName(0x2a, 5, 1ull << 30), "0000002A0000000100000001");
  EXPECT_EQ(WalFileName(2, 4097, kSegment), "000000020000000100000001");
  EXPECT_TRUE(IsValidWalSegmentSize(kSegment));
  EXPECT_TRUE(IsValidWalSegmentSize(1ull << 30));
  EXPECT_FALSE(IsValidWalSegmentSize(kSegment / 2));
  EXPECT_FALSE(IsValidWalSegmentSize(3 * kSegment));
  EXPECT_FALSE(IsValidWalSegmentSize(2ull << 30));
}

TEST(WalDirectoryStore, BytesLandAtTheirPositionsAcrossASegmentBoundary) {
  Dirs d;
  uint64_t start = 5 * kSegment - 1000;  // the standby's WAL ends 1000 bytes before segment 5
  auto store = OpenStore(d, start, /*timeline=*/3);
  EXPECT_EQ(store->ResumePosition("p1", kWal), start);
  Image image(start);
  std::string a = Random(3000, 1), b = Random(500, 2);
  image.Append(start, a);
  uint32_t to = image.Append(start + a.size(), b);
  Status s = Persist(store.get(), SegmentId{"p1", kWal, start, start}, image.data(), 0, to, false);
  ASSERT_TRUE(s.ok()) << s.ToString();
  // Segment 4 ends with the first 1000 bytes, segment 5 starts with the rest.
  std::string seg4 = ReadFile(d.wal() + "/000000030000000000000004");
  std::string seg5 = ReadFile(d.wal() + "/000000030000000000000005");
  ASSERT_EQ(seg4.size(), kSegment);
  ASSERT_EQ(seg5.size(), kSegment);
  EXPECT_EQ(seg4.substr(kSegment - 1000), a.substr(0, 1000));
  EXPECT_EQ(seg5.substr(0, 2000), a.substr(1000));
  EXPECT_EQ(seg5.substr(2000, 500), b);
  EXPECT_EQ(seg4.substr(0, kSegment - 1000), std::string(kSegment - 1000, '\0'));
  EXPECT_EQ(seg5.substr(2500), std::string(kSegment - 2500, '\0'));
  EXPECT_EQ(store->ResumePosition("p1", kWal), start + 3500);
  EXPECT_EQ(store->ResumePosition("another-name", kWal), start + 3500) << "one pg_wal";
  EXPECT_EQ(store->WalEnd(), start + 3500);
  // The image is kept, as FileBackupStore keeps it.
  FileBackupStore images(d.images());
  EXPECT_EQ(images.ResumePosition("p1", kWal), start + 3500);
  // Nothing but the two segments (no temporary file is left).
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(d.wal())) {
    (void)e;
    files++;
  }
  EXPECT_EQ(files, 2u);
}

TEST(WalDirectoryStore, OnlyRecordsNewlyValidAreWritten) {
  Dirs d;
  uint64_t start = 2 * kSegment;
  auto store = OpenStore(d, start);
  Image image(start);
  std::string a = Random(100, 3), b = Random(200, 4);
  uint32_t first = image.Append(start, a);
  SegmentId id{"p1", kWal, start, start};
  ASSERT_TRUE(Persist(store.get(), id, image.data(), 0, first, false).ok());
  // Damage what was written: a second persist of the same buffer must not write `a` again.
  std::string path = d.wal() + "/" + WalFileName(1, 2, kSegment);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.write("XXXX", 4);
  }
  uint32_t second = image.Append(start + a.size(), b);
  ASSERT_TRUE(Persist(store.get(), id, image.data(), first, second, true).ok());
  std::string wal = ReadWal(d.wal(), 1, start, 300);
  EXPECT_EQ(wal.substr(0, 4), "XXXX");
  EXPECT_EQ(wal.substr(4), a.substr(4) + b);
  EXPECT_EQ(store->WalEnd(), start + 300);
}

TEST(WalDirectoryStore, AGapIsRefusedAndNothingIsWrittenPastIt) {
  Dirs d;
  uint64_t start = 3 * kSegment + 100;
  auto store = OpenStore(d, start);
  Image image(start + 4096);
  std::string a = Random(1000, 5);
  uint32_t to = image.Append(start + 4096, a);  // 4096 bytes missing before it
  Status s = Persist(store.get(), SegmentId{"p1", kWal, start + 4096, start + 4096}, image.data(),
                     0, to, false);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("gap"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("0/300064"), std::string::npos) << "names the end: " << s.ToString();
  EXPECT_NE(s.message().find("0/301064"), std::string::npos) << "names the next: " << s.ToString();
  EXPECT_EQ(store->ResumePosition("p1", kWal), start);
  EXPECT_FALSE(std::filesystem::exists(d.wal() + "/" + WalFileName(1, 3, kSegment)));
  // A record that continues the WAL after a contiguous one in the same append is still
  // written up to the gap.
  Image two(start);
  std::string b = Random(50, 6);
  two.Append(start, b);
  uint32_t end = two.Append(start + 4096, a);
  s = Persist(store.get(), SegmentId{"p1", kWal, start, start}, two.data(), 0, end, false);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(store->ResumePosition("p1", kWal), start + 50);
  EXPECT_EQ(ReadWal(d.wal(), 1, start, 50), b);
}

TEST(WalDirectoryStore, AnOverlapIsWrittenAgainHarmlessly) {
  Dirs d;
  uint64_t start = kSegment + 8;
  auto store = OpenStore(d, start);
  std::string stream = Random(6000, 7);
  Image first(start);
  uint32_t to = first.Append(start, stream.substr(0, 4000));
  ASSERT_TRUE(
      Persist(store.get(), SegmentId{"p1", kWal, start, start}, first.data(), 0, to, true).ok());
  // A primary that resumed lower (from the standby's replay position, say) ships 1000..6000.
  Image again(start + 1000);
  uint32_t again_to = again.Append(start + 1000, stream.substr(1000));
  Status s = Persist(store.get(), SegmentId{"p1", kWal, start + 1000, start + 1000}, again.data(),
                     0, again_to, true);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(ReadWal(d.wal(), 1, start, stream.size()), stream);
  EXPECT_EQ(store->ResumePosition("p1", kWal), start + stream.size());
  // Wholly below the end: nothing changes.
  Image old(start);
  uint32_t old_to = old.Append(start, stream.substr(0, 10));
  ASSERT_TRUE(
      Persist(store.get(), SegmentId{"p1", kWal, start, start}, old.data(), 0, old_to, true).ok());
  EXPECT_EQ(store->ResumePosition("p1", kWal), start + stream.size());
  EXPECT_EQ(ReadWal(d.wal(), 1, start, stream.size()), stream);
}

TEST(WalDirectoryStore, AnExistingSegmentFileIsWrittenInPlace) {
  Dirs d;
  uint64_t start = 7 * kSegment + 512;
  // PostgreSQL may have recycled an old segment under this name: its stale bytes stay around
  // what is written (its reader tells them apart by their page addresses).
  std::string path = d.wal() + "/" + WalFileName(1, 7, kSegment);
  {
    std::ofstream f(path, std::ios::binary);
    f << std::string(kSegment, '\xab');
  }
  auto store = OpenStore(d, start);
  Image image(start);
  std::string a = Random(700, 8);
  uint32_t to = image.Append(start, a);
  ASSERT_TRUE(
      Persist(store.get(), SegmentId{"p1", kWal, start, start}, image.data(), 0, to, false).ok());
  std::string file = ReadFile(path);
  ASSERT_EQ(file.size(), kSegment);
  EXPECT_EQ(file.substr(512, 700), a);
  EXPECT_EQ(file.substr(0, 512), std::string(512, '\xab'));
  EXPECT_EQ(file.substr(1212, 100), std::string(100, '\xab'));
}

// A backup that crashed after keeping an image and before writing its WAL: opening the store
// again writes it, and the resume position covers it.
TEST(WalDirectoryStore, OpeningRedoesTheWalOfKeptImages) {
  Dirs d;
  uint64_t start = 4 * kSegment - 300;
  std::string stream = Random(5000, 9);
  FileBackupStore images(d.images());
  Image one(start), two(start + 3000);
  uint32_t one_to = one.Append(start, stream.substr(0, 3000));
  uint32_t two_to = two.Append(start + 3000, stream.substr(3000));
  ASSERT_TRUE(
      Persist(&images, SegmentId{"p1", kWal, start, start}, one.data(), 0, one_to, true).ok());
  ASSERT_TRUE(
      Persist(&images, SegmentId{"p1", kWal, start + 1, start + 3000}, two.data(), 0, two_to, false)
          .ok());
  // An image beyond a gap is not redone.
  Image far(start + 9000);
  uint32_t far_to = far.Append(start + 9000, Random(100, 10));
  ASSERT_TRUE(
      Persist(&images, SegmentId{"p1", kWal, start + 2, start + 9000}, far.data(), 0, far_to, false)
          .ok());
  // The standby had replayed up to 1000 bytes into the stream: those are in its pg_wal.
  {
    WalFileWriter own(d.wal(), 1, kSegment);
    ASSERT_TRUE(own.Write(start, stream.substr(0, 1000)).ok());
    ASSERT_TRUE(own.Sync().ok());
  }
  auto store = OpenStore(d, start + 1000);
  EXPECT_EQ(store->ResumePosition("p1", kWal), start + 5000);
  EXPECT_EQ(ReadWal(d.wal(), 1, start, 5000), stream);
  EXPECT_EQ(ReadWal(d.wal(), 1, start + 9000, 100), std::string(100, '\0'));
  // Images that end below the standby's own WAL change nothing.
  auto ahead = OpenStore(d, start + 6000);
  EXPECT_EQ(ahead->ResumePosition("p1", kWal), start + 6000);
}

// Images of another history (copied from a node that was a backup of another primary) are not
// redone: the bytes both hold below the standby's WAL end differ.
TEST(WalDirectoryStore, ImagesOfAnotherHistoryAreNotRedone) {
  Dirs d;
  uint64_t start = 6 * kSegment + 100;
  FileBackupStore images(d.images());
  Image old(start);
  uint32_t to = old.Append(start, Random(4000, 20));
  ASSERT_TRUE(Persist(&images, SegmentId{"old", kWal, start, start}, old.data(), 0, to, true).ok());
  std::string own = Random(2000, 21);
  {
    WalFileWriter writer(d.wal(), 1, kSegment);
    ASSERT_TRUE(writer.Write(start, own).ok());
    ASSERT_TRUE(writer.Sync().ok());
  }
  auto store = OpenStore(d, start + 2000);
  EXPECT_EQ(store->ResumePosition("p1", kWal), start + 2000);
  EXPECT_EQ(ReadWal(d.wal(), 1, start, 4000), own + std::string(2000, '\0'));
}

// Persist writes the WAL into pg_wal (so a gap is refused there and then), but the WAL end,
// which the hello gives and the startup process is woken by, moves only once Settle has
// fsynced it.
TEST(WalDirectoryStore, TheWalEndMovesOnlyWhenTheWalIsFsynced) {
  Dirs d;
  uint64_t start = 2 * kSegment + 100;
  auto store = OpenStore(d, start);
  Image image(start);
  std::string a = Random(500, 30), b = Random(700, 31);
  uint32_t first = image.Append(start, a);
  SegmentId id{"p1", kWal, start, start};
  ASSERT_TRUE(
      store->Persist(id, image.data(), 0, first, Records(image.data(), 0, first), false).ok());
  EXPECT_EQ(ReadWal(d.wal(), 1, start, a.size()), a);
  EXPECT_EQ(store->WalEnd(), start);
  EXPECT_EQ(store->ResumePosition("p1", kWal), start);
  // A second persist before the fsync continues the WAL written: no gap.
  uint32_t second = image.Append(start + a.size(), b);
  ASSERT_TRUE(
      store->Persist(id, image.data(), first, second, Records(image.data(), first, second), false)
          .ok());
  EXPECT_EQ(store->WalEnd(), start);
  ASSERT_TRUE(store->Settle().ok());
  EXPECT_EQ(store->WalEnd(), start + a.size() + b.size());
  EXPECT_EQ(store->ResumePosition("p1", kWal), start + a.size() + b.size());
  EXPECT_EQ(ReadWal(d.wal(), 1, start, a.size() + b.size()), a + b);
  // Nothing written since: settling again changes nothing.
  ASSERT_TRUE(store->Settle().ok());
  EXPECT_EQ(store->WalEnd(), start + a.size() + b.size());
}

// The crash cases of a persist's order (the image written and fsynced, the WAL written, the
// answer, the WAL fsynced). A crash may lose WAL writes not yet fsynced, wholly or in part
// (a hole, a torn tail), and the image of a persist not yet answered, in part, whose WAL may
// be in pg_wal in part. Each such state, made on a copy of the files, reopens (from a replay
// position the standby may have reached) to pg_wal holding every answered byte with no gap and
// a resume position at the end of the durable images; shipping the rest from there fills
// pg_wal exactly.
TEST(WalDirectoryStore, ACrashBeforeTheWalIsFsyncedLosesNothingAnswered) {
  const uint64_t start = 5 * kSegment - 2500;  // the answered WAL crosses a segment boundary
  const std::string stream = Random(9000, 40);
  std::mt19937_64 rng(41);
  for (int c = 0; c < 40; c++) {
    SCOPED_TRACE("case " + std::to_string(c));
    Dirs live, crashed;
    auto store = OpenStore(live, start);
    Image image(start);
    SegmentId id{"p1", kWal, start, start};
    // [0, 3000) settled, [3000, 6000) answered (Persist returned) but not settled, each as
    // three appends of 1000 bytes; [6000, 9000) the persist in flight, not answered.
    std::vector<uint32_t> ends;  // image offset after each append
    for (int i = 0; i < 9; i++)
      ends.push_back(image.Append(start + i * 1000, stream.substr(i * 1000, 1000)));
    ASSERT_TRUE(Persist(store.get(), id, image.data(), 0, ends[2], false).ok());
    ASSERT_TRUE(store
                    ->Persist(id, image.data(), ends[2], ends[5],
                              Records(image.data(), ends[2], ends[5]), false)
                    .ok());
    std::filesystem::copy(live.images(), crashed.images(),
                          std::filesystem::copy_options::recursive |
                              std::filesystem::copy_options::overwrite_existing);
    std::filesystem::copy(live.wal(), crashed.wal(),
                          std::filesystem::copy_options::recursive |
                              std::filesystem::copy_options::overwrite_existing);
    store.reset();
    // What the crash lost of the WAL written since the last fsync.
    const uint64_t settled = start + 3000, answered = start + 6000;
    switch (rng() % 3) {
      case 0:  // all of it
        OverwriteWal(crashed.wal(), settled, 3000);
        break;
      case 1: {  // a hole
        uint64_t at = settled + rng() % 2500;
        OverwriteWal(crashed.wal(), at, 1 + rng() % 500);
        break;
      }
      case 2: {  // a torn tail
        uint64_t at = settled + rng() % 3000;
        OverwriteWal(crashed.wal(), at, answered - at);
        break;
      }
    }
    // The persist in flight: part of its image, and part of its WAL (or none).
    uint32_t image_part = uint32_t(rng() % (ends[8] - ends[5] + 1));
    {
      FileBackupStore images(crashed.images());
      std::fstream f(images.SegmentPath(id), std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(ends[5]);
      f.write(image.data() + ends[5], image_part);
    }
    uint32_t wal_part = uint32_t(rng() % 3001);
    if (wal_part > 0)
      OverwriteWal(crashed.wal(), answered, wal_part, stream.substr(6000, wal_part));
    // The whole appends of the in-flight image are durable too.
    uint64_t durable = answered;
    for (int i = 6; i < 9; i++) {
      if (ends[i] <= ends[5] + image_part) durable = start + (i + 1) * 1000;
    }

    uint64_t replayed = rng() % 2 ? start : settled;
    auto reopened = OpenStore(crashed, replayed);
    ASSERT_EQ(reopened->ResumePosition("p1", kWal), durable);
    ASSERT_EQ(ReadWal(crashed.wal(), 1, start, durable - start), stream.substr(0, durable - start));
    // The primary ships from the resume position into a new buffer.
    Image rest(durable);
    uint32_t to = rest.Append(durable, stream.substr(durable - start));
    ASSERT_TRUE(
        Persist(reopened.get(), SegmentId{"p1", kWal, durable, durable}, rest.data(), 0, to, true)
            .ok());
    EXPECT_EQ(reopened->WalEnd(), start + stream.size());
    EXPECT_EQ(ReadWal(crashed.wal(), 1, start, stream.size()), stream);
  }
}

TEST(WalDirectoryStore, BadOptionsAreRefused) {
  Dirs d;
  WalDirectoryOptions o;
  o.image_directory = d.images();
  o.wal_directory = d.wal();
  std::unique_ptr<WalDirectoryStore> store;
  o.segment_size = 3 * kSegment;
  EXPECT_FALSE(WalDirectoryStore::Open(o, &store).ok());
  o.segment_size = kSegment;
  o.timeline = 0;
  EXPECT_FALSE(WalDirectoryStore::Open(o, &store).ok());
  o.timeline = 1;
  o.wal_directory = d.wal() + "/missing";
  EXPECT_FALSE(WalDirectoryStore::Open(o, &store).ok());
}

TEST(FileBackupStore, ResumePositionIsTheEndOfTheContiguousRecords) {
  Dirs d;
  FileBackupStore store(d.images());
  EXPECT_EQ(store.ResumePosition("p1", kWal), 0u) << "holds none";
  Image a(1000), b(1500), c(5000);
  uint32_t a_to = a.Append(1000, Random(1000, 11));  // 1000..2000
  uint32_t b_to = b.Append(1500, Random(1000, 12));  // 1500..2500, overlapping a
  uint32_t c_to = c.Append(5000, Random(10, 13));    // beyond a gap
  ASSERT_TRUE(Persist(&store, SegmentId{"p1", kWal, 1000, 1000}, a.data(), 0, a_to, true).ok());
  EXPECT_EQ(store.ResumePosition("p1", kWal), 2000u);
  ASSERT_TRUE(Persist(&store, SegmentId{"p1", kWal, 1500, 1500}, b.data(), 0, b_to, true).ok());
  ASSERT_TRUE(Persist(&store, SegmentId{"p1", kWal, 5000, 5000}, c.data(), 0, c_to, true).ok());
  EXPECT_EQ(store.ResumePosition("p1", kWal), 2500u);
  EXPECT_EQ(store.ResumePosition("p2", kWal), 0u) << "per primary";
  // A file created by a crash before its first write holds nothing and harms nothing.
  std::ofstream(d.images() + "/p1/wal-00000000000000ff").close();
  EXPECT_EQ(store.ResumePosition("p1", kWal), 2500u);
  std::vector<std::string> files;
  std::vector<PersistedRecord> records;
  EXPECT_TRUE(store.PersistedRecords("p1", kWal, &files, &records).ok());
  EXPECT_EQ(records.size(), 3u);
}

// The names of the files a store keeps of a primary's WAL, without their directory.
std::vector<std::string> FileNames(const FileBackupStore& store, const std::string& primary) {
  std::vector<std::string> names;
  for (const std::string& f : store.SegmentFiles(primary, kWal)) {
    names.push_back(std::filesystem::path(f).filename().string());
  }
  return names;
}

// Closed images wholly at or below `upto` go; one straddling it, an open one (even below it),
// one beyond the WAL end (its WAL refused as a gap), a damaged one and an empty one stay.
TEST(WalDirectoryStore, PruneRemovesClosedImagesWhollyBelowUpto) {
  Dirs d;
  uint64_t s = 8 * kSegment - 1500;
  auto store = OpenStore(d, s);
  FileBackupStore view(d.images());
  std::string stream = Random(4000, 30);
  Image a(1), b(2), c(3), open(4), far(5);
  uint32_t a_to = a.Append(s, stream.substr(0, 1000));
  uint32_t b_to = b.Append(s + 1000, stream.substr(1000, 1000));
  uint32_t c_to = c.Append(s + 2000, stream.substr(2000, 1000));
  uint32_t open_to = open.Append(s + 3000, stream.substr(3000));
  uint32_t far_to = far.Append(s + 9000, Random(100, 31));
  SegmentId open_id{"p1", kWal, 4, s + 3000};
  ASSERT_TRUE(Persist(store.get(), SegmentId{"p1", kWal, 1, s}, a.data(), 0, a_to, true).ok());
  ASSERT_TRUE(
      Persist(store.get(), SegmentId{"p1", kWal, 2, s + 1000}, b.data(), 0, b_to, true).ok());
  ASSERT_TRUE(
      Persist(store.get(), SegmentId{"p1", kWal, 3, s + 2000}, c.data(), 0, c_to, true).ok());
  ASSERT_TRUE(Persist(store.get(), open_id, open.data(), 0, open_to, false).ok());
  EXPECT_FALSE(
      Persist(store.get(), SegmentId{"p1", kWal, 5, s + 9000}, far.data(), 0, far_to, true).ok())
      << "a gap";
  ASSERT_EQ(store->WalEnd(), s + 4000);
  std::ofstream(d.images() + "/p1/wal-00000000000000f0").close();  // created, never written
  std::ofstream(d.images() + "/p1/wal-00000000000000f1") << std::string(200, 'x');  // damaged

  PruneStats removed;
  Status st = store->Prune(kWal, s + 1500, {open_id}, &removed);
  EXPECT_FALSE(st.ok()) << "the damaged file is reported";
  EXPECT_EQ(removed.files, 1u);
  EXPECT_EQ(removed.bytes, a_to);
  EXPECT_EQ(FileNames(view, "p1"),
            (std::vector<std::string>{"wal-0000000000000002", "wal-0000000000000003",
                                      "wal-0000000000000004", "wal-0000000000000005",
                                      "wal-00000000000000f0", "wal-00000000000000f1"}));
  // Beyond every record: capped at the WAL end, and the open buffer stays even so.
  (void)store->Prune(kWal, ~0ull, {open_id}, &removed);
  EXPECT_EQ(removed.files, 2u);
  EXPECT_EQ(FileNames(view, "p1"),
            (std::vector<std::string>{"wal-0000000000000004", "wal-0000000000000005",
                                      "wal-00000000000000f0", "wal-00000000000000f1"}));
  // Closed, the open buffer's image goes too; nothing of other streams is pruned.
  EXPECT_TRUE(store->Prune(uint32_t(StreamId::kEngineL0), ~0ull, {}, &removed).ok());
  EXPECT_EQ(removed.files, 0u);
  (void)store->Prune(kWal, s + 4000, {}, &removed);
  EXPECT_EQ(removed.files, 1u);
  EXPECT_EQ(store->WalEnd(), s + 4000);
  EXPECT_EQ(ReadWal(d.wal(), 1, s, 4000), stream);
}

// Pruning below the resume position changes neither the WAL end nor what a reopen after a
// crash redoes from the images.
TEST(WalDirectoryStore, PruningBelowTheResumePositionChangesNoAnswer) {
  Dirs d;
  uint64_t s = 5 * kSegment - 2000;
  std::string stream = Random(6000, 40);
  FileBackupStore images(d.images());
  Image one(1), two(2), three(3);
  uint32_t one_to = one.Append(s, stream.substr(0, 3000));
  uint32_t two_to = two.Append(s + 3000, stream.substr(3000, 2000));
  uint32_t three_to = three.Append(s + 5000, stream.substr(5000));
  SegmentId three_id{"p1", kWal, 3, s + 5000};
  ASSERT_TRUE(Persist(&images, SegmentId{"p1", kWal, 1, s}, one.data(), 0, one_to, true).ok());
  ASSERT_TRUE(
      Persist(&images, SegmentId{"p1", kWal, 2, s + 3000}, two.data(), 0, two_to, true).ok());
  ASSERT_TRUE(Persist(&images, three_id, three.data(), 0, three_to, false).ok());
  // The standby's own WAL (its replay position, and a restart point below it).
  const uint64_t replay = s + 3500, restart = s + 3000;
  {
    WalFileWriter own(d.wal(), 1, kSegment);
    ASSERT_TRUE(own.Write(s, stream.substr(0, 3500)).ok());
    ASSERT_TRUE(own.Sync().ok());
  }
  auto store = OpenStore(d, replay);
  ASSERT_EQ(store->ResumePosition("p1", kWal), s + 6000);
  PruneStats removed;
  ASSERT_TRUE(store->Prune(kWal, restart, {three_id}, &removed).ok());
  EXPECT_EQ(removed.files, 1u) << "one, wholly below the restart point";
  EXPECT_EQ(store->ResumePosition("p1", kWal), s + 6000);
  // A crash loses what pg_wal held beyond the replay position; the reopen redoes it.
  store.reset();
  OverwriteWal(d.wal(), replay, 2500);
  store = OpenStore(d, replay);
  EXPECT_EQ(store->ResumePosition("p1", kWal), s + 6000);
  EXPECT_EQ(ReadWal(d.wal(), 1, s, 6000), stream);
}

// A store that keeps images only answers the same resume position after a prune: the file
// holding its last contiguous byte stays, so the run does not start beyond the gap.
TEST(FileBackupStore, PruningKeepsTheResumePosition) {
  Dirs d;
  FileBackupStore store(d.images());
  Image a(1000), b(2000), c(5000);
  uint32_t a_to = a.Append(1000, Random(1000, 50));  // 1000..2000
  uint32_t b_to = b.Append(2000, Random(1000, 51));  // 2000..3000
  uint32_t c_to = c.Append(5000, Random(10, 52));    // beyond a gap
  ASSERT_TRUE(Persist(&store, SegmentId{"p1", kWal, 1000, 1000}, a.data(), 0, a_to, true).ok());
  ASSERT_TRUE(Persist(&store, SegmentId{"p1", kWal, 2000, 2000}, b.data(), 0, b_to, true).ok());
  ASSERT_TRUE(Persist(&store, SegmentId{"p1", kWal, 5000, 5000}, c.data(), 0, c_to, true).ok());
  ASSERT_EQ(store.ResumePosition("p1", kWal), 3000u);
  PruneStats removed;
  ASSERT_TRUE(store.Prune(kWal, 10000, {}, &removed).ok());
  EXPECT_EQ(removed.files, 1u);
  EXPECT_EQ(store.ResumePosition("p1", kWal), 3000u);
  EXPECT_EQ(FileNames(store, "p1"),
            (std::vector<std::string>{"wal-00000000000007d0", "wal-0000000000001388"}));
  // A fresh store (no cached answer) reads the same from the files left.
  FileBackupStore again(d.images());
  EXPECT_EQ(again.ResumePosition("p1", kWal), 3000u);
}

}  // namespace
}  // namespace slipstream::replication
