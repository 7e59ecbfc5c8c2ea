// log_payloads.h: record payloads laid out as the engine's write path, compaction and log
// rotation lay them out, for the seed writers that build log segments (log_scan, large_value,
// recovery). One copy, so that every seed carries the same layout the engine writes.
#pragma once

#include <lz4.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "coding.h"
#include "format.h"
#include "slipstream/engine/log_format.h"

namespace slipstream::fuzz {

// A compressible value of `size` bytes; `seed` makes values of the same size differ.
inline std::string Text(size_t size, int seed) {
  std::string v(size, '\0');
  for (size_t i = 0; i < size; i++) v[i] = char('a' + (seed * 7 + i * 13 + i / 7) % 26);
  return v;
}

// The payload of an L0 put of an inline value: varint ikey size, ikey, kind, value.
inline std::string InlinePutPayload(engine::KeyspaceId ks, std::string_view key,
                                    std::string_view value) {
  std::string ikey = engine::MakeInternalKey(ks, key);
  char varint[5];
  std::string p(varint, engine::EncodeVarint32(varint, uint32_t(ikey.size())) - varint);
  p += ikey;
  p.push_back(char(engine::ValueKind::kInline));
  return p.append(value);
}

// The payload of a value record of the medium or large log: varint ikey size, ikey, flags, raw
// size, then the value raw or LZ4-compressed (`compress`, as the write path does when it saves
// space).
inline std::string ValuePayload(const std::string& ikey, const std::string& value, bool compress) {
  char buf[5];
  std::string p(buf, engine::EncodeVarint32(buf, uint32_t(ikey.size())) - buf);
  p += ikey;
  std::string body = value;
  char flags = 0;
  if (compress) {
    body.resize(size_t(LZ4_compressBound(int(value.size()))));
    int n = LZ4_compress_fast(value.data(), body.data(), int(value.size()), int(body.size()), 4);
    body.resize(size_t(n));
    flags = char(engine::kValueFlagLz4);
  }
  p.push_back(flags);
  engine::EncodeFixed32(buf, uint32_t(value.size()));
  p.append(buf, 4);
  return p + body;
}

// The payload of a keyspace create record (id, tag), as write_path.cc appends it; a drop
// record's payload is its first 4 bytes (the id).
inline std::string KeyspacePayload(uint32_t id, uint64_t tag) {
  char payload[12];
  engine::EncodeFixed32(payload, id);
  engine::EncodeFixed64(payload + 4, tag);
  return std::string(payload, 12);
}

// The payload of the NEXT record LogSet::Rotate seals a segment with: the segment and the
// sequence the log continues in.
inline std::string NextPayload(uint32_t segment, uint64_t sequence) {
  char payload[12];
  engine::EncodeFixed32(payload, segment);
  engine::EncodeFixed64(payload + 4, sequence);
  return std::string(payload, 12);
}

}  // namespace slipstream::fuzz
