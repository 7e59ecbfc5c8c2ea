#include "value_compression.h"

#include <lz4.h>

#include <climits>
#include <memory>

namespace slipstream::engine {

namespace {

// One LZ4 stream per thread, set up once. LZ4_compress_fast zeroes a 16 KB table for every
// value; a stream reset with LZ4_resetStream_fast keeps the table and only moves its base past
// the old entries, which is what made a large value's compression cost most of its write.
struct ThreadStream {
  LZ4_stream_t stream;
  ThreadStream() { LZ4_initStream(&stream, sizeof(stream)); }
};

LZ4_stream_t* StreamOfThisThread() {
  // A pointer, not the 16 KB object, in thread-local storage: the library is dlopen()ed by
  // PostgreSQL, where static TLS is scarce.
  thread_local std::unique_ptr<ThreadStream> stream;
  if (!stream) stream = std::make_unique<ThreadStream>();
  return &stream->stream;
}

}  // namespace

int CompressValue(const char* src, size_t size, char* dst, size_t capacity, int acceleration) {
  if (size > size_t(LZ4_MAX_INPUT_SIZE) || capacity > size_t(INT_MAX)) return 0;
  LZ4_stream_t* stream = StreamOfThisThread();
  // Each value starts a new stream: its block refers to no earlier value, so it decodes alone.
  LZ4_resetStream_fast(stream);
  return LZ4_compress_fast_continue(stream, src, dst, int(size), int(capacity), acceleration);
}

}  // namespace slipstream::engine
