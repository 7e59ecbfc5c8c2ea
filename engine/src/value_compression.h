// CompressValue: LZ4 compression of large values on the writer's thread, without the 16 KB
// hash table reset that LZ4_compress_fast pays on every call (docs/engine.md, "Logs").

#ifndef SLIPSTREAM_ENGINE_VALUE_COMPRESSION_H_
#define SLIPSTREAM_ENGINE_VALUE_COMPRESSION_H_

#include <cstddef>

namespace slipstream::engine {

// Compresses `size` bytes at `src` into `dst` (room for `capacity` bytes) as one LZ4 block that
// LZ4_decompress_safe decodes on its own; returns the compressed size, or 0 if it did not fit.
// `acceleration` is LZ4's (1 is its default; higher is faster and compresses less).
int CompressValue(const char* src, size_t size, char* dst, size_t capacity, int acceleration);

}  // namespace slipstream::engine

#endif  // SLIPSTREAM_ENGINE_VALUE_COMPRESSION_H_
