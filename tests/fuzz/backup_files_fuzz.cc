// Fuzzes the files a backup reads back from its disk (backup_store.h): a primary's VERSION file
// and the kept images of its segments, whatever a crash, a full disk or an operator left in
// them. The files are written into a directory of this process (under $TMPDIR, /dev/shm or
// /tmp) and read by a fresh FileBackupStore per input, through its real entry points.
//
// Input: stream (u8, mod 4 + 1), the VERSION file's length (u8) and bytes, a version to save
// (u64), the first image's length (u16) and bytes, then the second image (the rest).
// Properties: LoadVersion accepts exactly what SaveVersion writes (digits of a 64-bit value and
// a newline) and reads its value; a saved version reads back; every record PersistedRecords
// lists lies inside its file, is ordered by position, reads back with ReadRecord as the bytes
// the file holds there, and comes from a file of the stream's kind; a file called whole is a
// valid prefix to its last byte; ResumePosition is the end of the contiguous records.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "buffer_scan.h"
#include "fuzz_input.h"
#include "slipstream/replication/backup_store.h"
#include "wal_files.h"

namespace {

using namespace slipstream;
using namespace slipstream::replication;

// Stops the run with a message: a property of the backup's files does not hold.
[[noreturn]] void Fail(const char* what) {
  fuzz::FuzzFailure("backup_files", what);
}

// This process's directory of kept files, made once and removed at exit (the name outlives
// every static, so the exit handler may read it).
const std::string& Directory() {
  static const std::string* directory = [] {
    std::error_code ec;
    std::string base = std::filesystem::is_directory("/dev/shm", ec) ? "/dev/shm" : "/tmp";
    if (const char* tmp = std::getenv("TMPDIR")) base = tmp;
    auto* path =
        new std::string(base + "/slipstream-backup-files-fuzz-" + std::to_string(getpid()));
    std::filesystem::create_directories(*path + "/p1", ec);
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(Directory(), ignored);
    });
    return path;
  }();
  return *directory;
}

// Replaces `path` with `bytes`, or removes it when `bytes` is null.
void WriteFile(const std::string& path, const std::string_view* bytes) {
  std::error_code ec;
  std::filesystem::remove(path, ec);
  if (bytes == nullptr) return;
  std::ofstream out(path, std::ios::binary);
  out.write(bytes->data(), std::streamsize(bytes->size()));
}

// The value of `text` as SaveVersion writes it (decimal digits of a 64-bit value, a newline);
// false for anything else.
bool SavedForm(std::string_view text, uint64_t* value) {
  if (text.size() < 2 || text.back() != '\n') return false;
  text.remove_suffix(1);
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9' || __builtin_mul_overflow(v, 10, &v) ||
        __builtin_add_overflow(v, uint64_t(c - '0'), &v)) {
      return false;
    }
  }
  *value = v;
  return std::to_string(v) == text;
}

// LoadVersion reads exactly what SaveVersion writes, and nothing else.
void CheckVersion(FileBackupStore* store, std::string_view text, uint64_t to_save) {
  const std::string path = Directory() + "/p1/VERSION";
  WriteFile(path, &text);
  uint64_t loaded = 0;
  const Status s = store->LoadVersion("p1", &loaded);
  uint64_t expected = 0;
  const bool saved_form = SavedForm(text, &expected);
  if (s.ok() && !saved_form) Fail("LoadVersion accepted what SaveVersion never writes");
  if (saved_form && (!s.ok() || loaded != expected)) {
    Fail("LoadVersion refused or misread what SaveVersion writes");
  }
  if (!store->SaveVersion("p1", to_save).ok() || !store->LoadVersion("p1", &loaded).ok() ||
      loaded != to_save) {
    Fail("a saved version does not read back");
  }
  WriteFile(path, nullptr);  // no stray file for the listing below
}

// The records of the kept images, and what the store derives from them.
void CheckImages(FileBackupStore* store, uint32_t stream, const std::vector<std::string>& images) {
  std::vector<std::string> files;
  std::vector<PersistedRecord> records;
  std::vector<bool> whole;
  (void)store->PersistedRecords("p1", stream, &files, &records, &whole);
  if (files.size() != images.size() || whole.size() != files.size()) {
    Fail("PersistedRecords lists other files than were kept");
  }
  for (size_t i = 0; i + 1 < records.size(); i++) {
    if (records[i].position > records[i + 1].position) Fail("records out of position order");
  }
  for (const PersistedRecord& r : records) {
    if (r.file >= files.size()) Fail("a record of a file that is not listed");
    const std::string& image = images[r.file];
    if (uint64_t(r.offset) + r.length > image.size()) Fail("a record beyond the end of its file");
    const engine::LogScan scan = engine::ScanLogSegment(image.data(), image.size());
    if (!scan.header_ok || scan.header.kind != uint32_t(KindOfStream(stream))) {
      Fail("a record of a file of another stream, or with no valid header");
    }
    if (uint64_t(r.offset) + r.length > scan.valid_end) Fail("a record beyond the valid prefix");
    std::string read;
    if (!ReadRecord(files, r, 0, r.length, &read).ok() ||
        read != std::string_view(image).substr(r.offset, r.length)) {
      Fail("ReadRecord does not read a record's bytes");
    }
  }
  for (size_t f = 0; f < files.size(); f++) {
    if (whole[f] &&
        engine::ScanLogSegment(images[f].data(), images[f].size()).valid_end != images[f].size()) {
      Fail("a file called whole that is not a valid prefix to its end");
    }
  }
  if (store->ResumePosition("p1", stream) != ContiguousEnd(records, 0)) {
    Fail("ResumePosition is not the end of the contiguous records");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::FuzzInput p(data, size);
  const uint32_t stream = 1 + uint32_t(p.Take(1) % 4);
  const std::string_view version = p.Bytes(size_t(p.Take(1)));
  const uint64_t to_save = p.Take(8);
  const std::vector<std::string> images = {std::string(p.Bytes(size_t(p.Take(2)))),
                                           std::string(p.rest())};

  const std::string dir = Directory() + "/p1/";
  // Other streams' files are never listed for this one; clear what an earlier input left.
  for (uint32_t s = 1; s <= 4; s++) {
    for (int f = 0; f < 2; f++) {
      WriteFile(dir + StreamName(s) + "-000000000000000" + char('1' + f), nullptr);
    }
  }
  for (size_t f = 0; f < images.size(); f++) {
    const std::string_view bytes = images[f];
    WriteFile(dir + StreamName(stream) + "-000000000000000" + char('1' + f), &bytes);
  }

  FileBackupStore store(Directory());  // fresh: no scans kept from an earlier input
  CheckVersion(&store, version, to_save);
  CheckImages(&store, stream, images);
  return 0;
}
