// The valid prefix of a replication buffer: Tailwind's Algorithm 1 (the engine's log scanner)
// plus the checks that the buffer holds the segment it was opened for.
#pragma once

#include <cstdint>

#include "slipstream/engine/log_scanner.h"
#include "slipstream/replication/wire.h"

namespace slipstream::replication {

// The engine log kind a stream's buffers are formatted as.
engine::LogKind KindOfStream(uint32_t stream);

// Bytes of `image` that are a valid prefix of segment `sequence` of `stream`: 0 when the
// header is missing, damaged or names another segment; otherwise the end of the last record
// covered by a matching checksum.
uint32_t ValidPrefix(const char* image, uint32_t size, uint32_t stream, uint64_t sequence);

}  // namespace slipstream::replication
