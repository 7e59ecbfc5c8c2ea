// CRC32C (Castagnoli), hardware accelerated with SSE4.2: the engine's node and log checksums,
// and the frames of the index-shipping stream.
#pragma once

#include <cstddef>
#include <cstdint>

namespace slipstream::engine::crc32c {

// Extends `crc` (0 for a fresh checksum) over `n` bytes.
uint32_t Extend(uint32_t crc, const void* data, size_t n);

inline uint32_t Value(const void* data, size_t n) {
  return Extend(0, data, n);
}

}  // namespace slipstream::engine::crc32c
