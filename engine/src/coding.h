// Little-endian fixed-width and varint encoding, and the 64-bit key hash.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace slipstream::engine {

inline void EncodeFixed32(char* dst, uint32_t v) {
  std::memcpy(dst, &v, 4);
}
inline void EncodeFixed64(char* dst, uint64_t v) {
  std::memcpy(dst, &v, 8);
}
inline uint32_t DecodeFixed32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint64_t DecodeFixed64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline uint16_t DecodeFixed16(const char* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

inline void PutFixed32(std::string* dst, uint32_t v) {
  dst->append(reinterpret_cast<char*>(&v), 4);
}
inline void PutFixed64(std::string* dst, uint64_t v) {
  dst->append(reinterpret_cast<char*>(&v), 8);
}

// Writes a varint32 at dst and returns the byte after it.
inline char* EncodeVarint32(char* dst, uint32_t v) {
  auto* p = reinterpret_cast<uint8_t*>(dst);
  while (v >= 0x80) {
    *p++ = static_cast<uint8_t>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<uint8_t>(v);
  return reinterpret_cast<char*>(p);
}

inline int VarintLength(uint32_t v) {
  int n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

// Parses a varint32 in [p, limit); returns nullptr if it is truncated or too long.
inline const char* DecodeVarint32(const char* p, const char* limit, uint32_t* v) {
  uint32_t result = 0;
  for (int shift = 0; shift <= 28 && p < limit; shift += 7) {
    uint32_t byte = static_cast<uint8_t>(*p++);
    result |= (byte & 0x7f) << shift;
    if (!(byte & 0x80)) {
      *v = result;
      return p;
    }
  }
  return nullptr;
}

// A fast 64-bit hash of a key (for bloom filters); stable across processes and versions.
inline uint64_t HashKey(std::string_view key) {
  const uint64_t m = 0xc6a4a7935bd1e995ull;
  uint64_t h = 0x9e3779b97f4a7c15ull ^ (key.size() * m);
  const char* p = key.data();
  size_t n = key.size();
  while (n >= 8) {
    uint64_t k = DecodeFixed64(p);
    k *= m;
    k ^= k >> 47;
    k *= m;
    h ^= k;
    h *= m;
    p += 8;
    n -= 8;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, p, n);
  h ^= tail;
  h *= m;
  h ^= h >> 47;
  h *= m;
  h ^= h >> 47;
  return h;
}

}  // namespace slipstream::engine
