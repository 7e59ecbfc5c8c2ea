// Fuzzes the reading back of values stored out of line (LogSet::ReadValue, log_set.h): a value
// pointer (ValuePtr::DecodeFrom) from a leaf or the L0 log, and the medium- or large-log record
// it points at, on a device file and in a shared log buffer. Whatever the pointer and the
// segment's bytes, ReadValue must return Corruption or exactly the value the record holds; the
// buffer and the device must give the same answer; and every value record the log scan finds
// must read back as an independent decoding of the record says it should.
//
// A large pointer is also read as a patch (a kLargePatch entry, format.h): it reads what the
// pointer reads with its first bytes replaced by the patch's, or Corruption.
//
// Input: a mode byte (bit 0: a large pointer, else medium; bit 1: the large segment is also in
// a shared log buffer; bits 2-7: the length of the patch's prefix, taken from the image), 16
// bytes of ValuePtr, a key length byte and the key, then the image of the segment the
// pointer's kind lives in (zero-padded to the segment size).
#include <lz4.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "arena_layout.h"
#include "coding.h"
#include "crc32c.h"
#include "engine_fixture.h"
#include "fuzz_input.h"
#include "log_set.h"
#include "segment_table.h"
#include "shared_state.h"
#include "slipstream/engine/log_scanner.h"

namespace {

using namespace slipstream::engine;
using slipstream::fuzz::DeviceFile;
using slipstream::fuzz::FuzzFailure;
using slipstream::fuzz::FuzzInput;

constexpr uint32_t kSegmentSize = 256u << 10;
constexpr uint32_t kMaxValueSize = 32u << 10;
constexpr uint32_t kDeviceSegments = 8;
// Where the target keeps its value records: one medium-log and one large-log segment, next to
// an index segment and a free one, which no value pointer may lead into.
constexpr uint32_t kMediumSegment = 1;
constexpr uint32_t kLargeSegment = 2;
constexpr uint32_t kIndexSegment = 3;
// Value records checked per input at most (each a read of the segment).
constexpr size_t kMaxScannedRecords = 32;

// Stops the run with a message naming the broken property.
[[noreturn]] void Fail(const char* what, const Status& s = Status::OK()) {
  FuzzFailure("large_value", what, s);
}

// A device file in a private directory (engine_fixture.h) and the arena parts ReadValue uses,
// made once per process: the segment table and the large log's shared buffers.
class Store {
 public:
  // Makes the device file, the segment table and the large log's buffers.
  Store()
      : options_(MakeOptions()),
        file_("large_value", "large-value-fuzz", kSegmentSize, kDeviceSegments) {
    // The arena up to the keyspace table, then the log buffers (no memtables are needed).
    ArenaLayout layout = ArenaLayout::For(options_);
    uint64_t l0_buffers = layout.memtables;
    uint64_t large_buffers = l0_buffers + uint64_t(kL0LogBuffers) * kSegmentSize;
    arena_size_ = large_buffers + uint64_t(kLargeLogBuffers) * kSegmentSize;
    arena_ = static_cast<char*>(std::aligned_alloc(4096, arena_size_));
    std::memset(arena_, 0, arena_size_);
    shared_ = reinterpret_cast<SharedState*>(arena_);
    segments_ = std::make_unique<SegmentTable>(arena_, &shared_->segments, file_.device());
    segments_->Format(layout.segment_table, kDeviceSegments);
    segments_->set_count(kDeviceSegments);
    segments_->info(0).kind = uint8_t(SegmentKind::kReserved);
    segments_->info(kMediumSegment).kind = uint8_t(SegmentKind::kMediumLog);
    segments_->info(kLargeSegment).kind = uint8_t(SegmentKind::kLargeLog);
    segments_->info(kIndexSegment).kind = uint8_t(SegmentKind::kIndex);
    logs_ =
        std::make_unique<LogSet>(options_, arena_, &shared_->logs, file_.device(), segments_.get(),
                                 &shared_->counters, &shared_->write_mu, nullptr, nullptr);
    logs_->Format(l0_buffers, large_buffers);
    padded_.assign(kSegmentSize, '\0');
  }
  // Frees the arena (the device file and its directory go with file_).
  ~Store() { std::free(arena_); }

  // Puts `image` at the start of the medium and the large segment on the device, and in the
  // large log's first buffer (which holds the large segment), zeroing what an earlier image
  // left after it; returns the segment as placed.
  std::string_view Place(std::string_view image) {
    size_t n = std::min<size_t>(image.size(), kSegmentSize);
    size_t span = std::max(n, dirty_);
    std::memcpy(padded_.data(), image.data(), n);
    std::memset(padded_.data() + n, 0, span - n);
    for (uint32_t seg : {kMediumSegment, kLargeSegment}) file_.Write(seg, padded_.data(), span);
    SharedLogBuffer& b = shared_->logs.large.buffers[0];
    std::memcpy(arena_ + b.data_offset, padded_.data(), span);
    b.segment = kLargeSegment;
    dirty_ = n;
    return padded_;
  }

  // Reads `entry` for `ikey`, from the shared buffer if `buffered` and then again from the
  // device as after the buffer's write-out: the two must agree.
  Status Read(std::string_view ikey, const LeafEntry& entry, std::string* value, bool buffered) {
    SharedLogBuffer& b = shared_->logs.large.buffers[0];
    b.state.store(buffered ? SharedLogBuffer::kActive : SharedLogBuffer::kFree);
    Status s = logs_->ReadValue(ikey, entry, value);
    if (buffered) {
      b.state.store(SharedLogBuffer::kFree);
      std::string from_device;
      Status d = logs_->ReadValue(ikey, entry, &from_device);
      if (d.code() != s.code() || from_device != *value) {
        Fail("the shared buffer and the device disagree", d);
      }
    }
    return s;
  }

 private:
  // Small segments and values, so that a segment is cheap to rewrite for every input.
  static Options MakeOptions() {
    Options o;
    o.directory = "/nonexistent";
    o.segment_size = kSegmentSize;
    o.node_size = 4096;
    o.max_value_size = kMaxValueSize;
    o.max_device_size = uint64_t(kDeviceSegments) * kSegmentSize;
    return o;
  }

  Options options_;
  DeviceFile file_;
  uint64_t arena_size_ = 0;
  char* arena_ = nullptr;
  SharedState* shared_ = nullptr;
  std::unique_ptr<SegmentTable> segments_;
  std::unique_ptr<LogSet> logs_;
  std::string padded_;  // the segments' bytes: the image and zeroes
  size_t dirty_ = 0;    // bytes of the segments an earlier image may have left non-zero
};

// What a value record holds, decoded here independently of ReadValue: its key and its value
// (nullopt-like `ok` false when the record cannot hold a value of at most kMaxValueSize).
struct Decoded {
  bool ok = false;
  std::string_view key;
  std::string value;
};

// Decodes a kValue payload: varint key size, key, flags, raw size, raw or LZ4 bytes.
Decoded DecodeValuePayload(std::string_view payload) {
  Decoded d;
  const char* p = payload.data();
  const char* limit = p + payload.size();
  uint32_t key_size;
  p = DecodeVarint32(p, limit, &key_size);
  if (p == nullptr || uint64_t(limit - p) < uint64_t(key_size) + 5) return d;
  d.key = std::string_view(p, key_size);
  p += key_size;
  uint8_t flags = uint8_t(*p++);
  uint32_t raw_size = DecodeFixed32(p);
  p += 4;
  if (raw_size > kMaxValueSize) return d;
  if (flags & kValueFlagLz4) {
    d.value.resize(raw_size);
    int n = LZ4_decompress_safe(p, d.value.data(), int(limit - p), int(raw_size));
    d.ok = n == int(raw_size);
  } else {
    d.value.assign(p, size_t(limit - p));
    d.ok = d.value.size() == raw_size;
  }
  return d;
}

// The value record `ptr` names in `image` (as placed on the device), if its header and CRC are
// sound: what ReadValue may return at most.
bool RecordAt(std::string_view image, const ValuePtr& ptr, std::string_view* payload) {
  if (ptr.record_bytes < kRecordHeaderSize ||
      uint64_t(ptr.where.offset) + ptr.record_bytes > image.size()) {
    return false;
  }
  RecordHeader h;
  std::memcpy(&h, image.data() + ptr.where.offset, sizeof(h));
  *payload =
      image.substr(ptr.where.offset + kRecordHeaderSize, ptr.record_bytes - kRecordHeaderSize);
  return (h.type_and_length & 0xff) == uint8_t(LogRecordType::kValue) &&
         (h.type_and_length >> 8) == payload->size() &&
         crc32c::Value(payload->data(), payload->size()) == h.payload_crc;
}

// Reads `ptr` for `ikey` and checks the answer against the record in the padded image.
void CheckRead(Store* store, std::string_view padded, ValueKind kind, const ValuePtr& ptr,
               std::string_view ikey, bool buffered) {
  LeafEntry entry{};
  entry.key = ikey;
  entry.kind = kind;
  entry.ptr = ptr;
  std::string value;
  Status s = store->Read(ikey, entry, &value, buffered);
  if (!s.ok() && !s.IsCorruption())
    Fail("ReadValue failed with something other than Corruption", s);
  if (!s.ok()) return;
  uint32_t expected = kind == ValueKind::kLargePtr ? kLargeSegment : kMediumSegment;
  if (ptr.where.segment != expected || ptr.where.offset < kLogHeaderSize) {
    Fail("read a value through a pointer into the wrong segment or its header");
  }
  std::string_view payload;
  if (!RecordAt(padded, ptr, &payload)) Fail("read a value from a record that is not sound");
  Decoded d = DecodeValuePayload(payload);
  if (!d.ok || d.key != ikey || d.value != value) Fail("read another value than the record holds");
}

// Reads `ptr` as a patch with `prefix`: the pointer's value with its first bytes replaced, or
// Corruption, which only a prefix longer than the value or a size the record lacks explain.
void CheckPatchRead(Store* store, const ValuePtr& ptr, std::string_view ikey,
                    std::string_view prefix, bool buffered) {
  LeafEntry plain{};
  plain.key = ikey;
  plain.kind = ValueKind::kLargePtr;
  plain.ptr = ptr;
  LeafEntry patch = plain;
  patch.kind = ValueKind::kLargePatch;
  patch.inline_value = prefix;
  patch.owner = false;
  std::string whole, patched;
  Status read = store->Read(ikey, plain, &whole, buffered);
  Status s = store->Read(ikey, patch, &patched, buffered);
  if (!s.ok() && !s.IsCorruption())
    Fail("a patch read failed with something other than Corruption", s);
  if (s.ok()) {
    if (!read.ok()) Fail("a patch read a record its pointer cannot", read);
    whole.replace(0, prefix.size(), prefix);
    if (patched != whole) Fail("a patch read otherwise than its record with the new prefix");
  } else if (read.ok() && prefix.size() <= whole.size() && whole.size() == ptr.value_size) {
    Fail("a patch failed where its record reads", s);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Destroyed at exit, which removes its directory.
  static Store instance;
  Store* store = &instance;
  if (size < 1 + ValuePtr::kEncodedSize + 1) return 0;
  FuzzInput in(data, size);
  uint8_t mode = in.Byte();
  const char* ptr_bytes = in.Bytes(ValuePtr::kEncodedSize).data();
  ValuePtr ptr = ValuePtr::DecodeFrom(ptr_bytes);
  char encoded[ValuePtr::kEncodedSize];
  ptr.EncodeTo(encoded);
  if (std::memcmp(encoded, ptr_bytes, sizeof(encoded)) != 0) {
    Fail("a value pointer does not encode back to its bytes");
  }
  std::string_view ikey = in.Bytes(in.Byte());
  std::string_view image = in.rest();
  bool large = mode & 1;
  bool buffered = large && (mode & 2);
  std::string_view padded = store->Place(image);

  CheckRead(store, padded, large ? ValueKind::kLargePtr : ValueKind::kMediumPtr, ptr, ikey,
            buffered);
  if (large) CheckPatchRead(store, ptr, ikey, image.substr(0, mode >> 2), buffered);

  // Every value record the scan finds, read through an exact pointer with its own key: it
  // reads back iff it decodes here, and as what it decodes to.
  LogScan scan = ScanLogSegment(padded.data(), padded.size());
  size_t checked = 0;
  for (const ScannedRecord& rec : scan.records) {
    if (rec.type != LogRecordType::kValue || checked++ == kMaxScannedRecords) continue;
    Decoded d = DecodeValuePayload(rec.payload);
    ValuePtr exact{{large ? kLargeSegment : kMediumSegment, rec.offset},
                   uint32_t(kRecordHeaderSize + rec.payload.size()),
                   uint32_t(d.value.size())};
    LeafEntry entry{};
    entry.kind = large ? ValueKind::kLargePtr : ValueKind::kMediumPtr;
    entry.ptr = exact;
    std::string value;
    Status s = store->Read(d.key, entry, &value, buffered);
    if (s.ok() != d.ok || (s.ok() && value != d.value)) {
      Fail("a scanned value record reads back otherwise than it decodes", s);
    }
    if (!s.ok() && !s.IsCorruption()) Fail("ReadValue failed with another error", s);
  }

  // Inline values are copied as they are, tombstones are NotFound.
  LeafEntry inline_entry{};
  inline_entry.kind = ValueKind::kInline;
  inline_entry.inline_value = image.substr(0, 64);
  std::string value;
  if (!store->Read(ikey, inline_entry, &value, false).ok() || value != inline_entry.inline_value) {
    Fail("an inline value was not copied as it is");
  }
  LeafEntry tombstone{};
  tombstone.kind = ValueKind::kTombstone;
  if (!store->Read(ikey, tombstone, &value, false).IsNotFound())
    Fail("a tombstone read as a value");
  return 0;
}
