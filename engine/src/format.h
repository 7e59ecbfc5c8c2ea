// On-device and in-memory formats shared by the engine's units: pointers, kinds, internal keys.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "coding.h"
#include "slipstream/engine/write_batch.h"

namespace slipstream::engine {

// A device location: a segment number and a byte offset inside that segment. Every node and
// value pointer is stored this way so that a replica can rewrite segment numbers alone.
struct DevPtr {
  uint32_t segment = 0;
  uint32_t offset = 0;

  bool IsNull() const { return segment == 0 && offset == 0; }
  uint64_t Pack() const { return (uint64_t(segment) << 32) | offset; }
  static DevPtr Unpack(uint64_t v) { return DevPtr{uint32_t(v >> 32), uint32_t(v)}; }
  bool operator==(const DevPtr&) const = default;
};

// A value stored in the medium or large log: where its record is, and how big.
struct ValuePtr {
  DevPtr where;
  uint32_t record_bytes = 0;  // bytes of the whole log record (for invalid-byte accounting)
  uint32_t value_size = 0;    // logical value size

  static constexpr size_t kEncodedSize = 16;
  void EncodeTo(char* dst) const {
    EncodeFixed32(dst, where.segment);
    EncodeFixed32(dst + 4, where.offset);
    EncodeFixed32(dst + 8, record_bytes);
    EncodeFixed32(dst + 12, value_size);
  }
  static ValuePtr DecodeFrom(const char* p) {
    return ValuePtr{
        {DecodeFixed32(p), DecodeFixed32(p + 4)}, DecodeFixed32(p + 8), DecodeFixed32(p + 12)};
  }
};

// How an entry's value is stored.
enum class ValueKind : uint8_t {
  kInline = 1,     // value bytes follow the key (small, or medium in place)
  kMediumPtr = 2,  // ValuePtr into the medium log
  kLargePtr = 3,   // ValuePtr into the large log
  kTombstone = 4,  // deleted
  // A large value whose first bytes changed: a ValuePtr into the large log, whether this entry
  // owns that record (see LargePatch), then the bytes that replace the value's first ones. A
  // row's header change writes this instead of the whole value again.
  kLargePatch = 5,
};

inline bool IsValidValueKind(uint8_t k) {
  return k >= 1 && k <= 5;
}

// Whether an entry of this kind names a large-log record.
inline bool RefersToLargeLog(ValueKind k) {
  return k == ValueKind::kLargePtr || k == ValueKind::kLargePatch;
}

// The bytes of a kLargePatch entry after its key, in memtables, L0 records and leaves alike:
// the ValuePtr first (where Send-Index replicas rewrite segment numbers, as for kLargePtr), a
// byte that says whether the entry owns the record, then the replacement prefix.
//
// Several entries of one key may name one record (the put, then a lock's and an update's header
// changes). Exactly one of them owns it: its accounting (invalid bytes when it is dropped, live
// bytes in Verify) is the owner's alone. A patch is written as a non-owner; when a merge drops
// the owner for a newer entry naming the same record, that entry becomes the owner.
struct LargePatch {
  static constexpr size_t kFixedSize = ValuePtr::kEncodedSize + 1;
  static constexpr size_t kMaxPrefix = 64;

  static void EncodeTo(const ValuePtr& ptr, bool owner, std::string_view prefix, std::string* out) {
    char buf[ValuePtr::kEncodedSize];
    ptr.EncodeTo(buf);
    out->assign(buf, sizeof(buf));
    out->push_back(owner ? 1 : 0);
    out->append(prefix);
  }
  // Decodes `bytes`; false if they cannot be a patch.
  static bool DecodeFrom(std::string_view bytes, ValuePtr* ptr, bool* owner,
                         std::string_view* prefix) {
    if (bytes.size() < kFixedSize || bytes.size() > kFixedSize + kMaxPrefix ||
        uint8_t(bytes[ValuePtr::kEncodedSize]) > 1) {
      return false;
    }
    *ptr = ValuePtr::DecodeFrom(bytes.data());
    *owner = bytes[ValuePtr::kEncodedSize] == 1;
    *prefix = bytes.substr(kFixedSize);
    return prefix->size() <= ptr->value_size;
  }
};

// Size classes of hybrid placement (by key plus value bytes).
enum class SizeClass : uint8_t { kSmall, kMedium, kLarge };

// What a device segment is used for. Segment 0 is never allocated (DevPtr{0,0} is null).
enum class SegmentKind : uint8_t {
  kFree = 0,
  kL0Log = 1,
  kMediumLog = 2,
  kLargeLog = 3,
  kIndex = 4,  // B+-tree nodes of one level's tree
  kBloom = 5,  // bloom filter blocks of one level's tree
  kReserved = 6,
};

const char* SegmentKindName(SegmentKind kind);

// Internal keys: 4-byte big-endian keyspace id, then the user key. memcmp order groups a
// keyspace's keys together and orders them by user key.
constexpr size_t kKeyspacePrefix = 4;

inline std::string MakeInternalKey(KeyspaceId ks, std::string_view user_key) {
  std::string k(kKeyspacePrefix + user_key.size(), '\0');
  k[0] = char(ks >> 24);
  k[1] = char(ks >> 16);
  k[2] = char(ks >> 8);
  k[3] = char(ks);
  if (!user_key.empty()) std::memcpy(k.data() + kKeyspacePrefix, user_key.data(), user_key.size());
  return k;
}

inline KeyspaceId KeyspaceOf(std::string_view ikey) {
  const auto* p = reinterpret_cast<const uint8_t*>(ikey.data());
  return (KeyspaceId(p[0]) << 24) | (KeyspaceId(p[1]) << 16) | (KeyspaceId(p[2]) << 8) | p[3];
}

inline std::string_view UserKeyOf(std::string_view ikey) {
  return ikey.substr(kKeyspacePrefix);
}

// Byte-wise (unsigned) comparison of two keys, as std::string_view::compare, inlined and eight
// bytes at a time: engine keys are short (a keyspace prefix and a row id), and a libc memcmp
// call per step of a skiplist descent or a leaf's binary search was most of a point read's
// engine time (issue 11's profile of YCSB C and E).
inline int CompareKeys(std::string_view a, std::string_view b) {
  static_assert(std::endian::native == std::endian::little, "loads are little-endian words");
  size_t n = a.size() < b.size() ? a.size() : b.size();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t x, y;
    std::memcpy(&x, a.data() + i, 8);
    std::memcpy(&y, b.data() + i, 8);
    if (x != y) return __builtin_bswap64(x) < __builtin_bswap64(y) ? -1 : 1;
  }
  for (; i < n; i++) {
    unsigned char x = static_cast<unsigned char>(a[i]);
    unsigned char y = static_cast<unsigned char>(b[i]);
    if (x != y) return x < y ? -1 : 1;
  }
  return a.size() < b.size() ? -1 : a.size() > b.size() ? 1 : 0;
}

}  // namespace slipstream::engine
