// ScanBuffer and ValidPrefix: see buffer_scan.h.
#include "buffer_scan.h"

namespace slipstream::replication {

engine::LogKind KindOfStream(uint32_t stream) {
  switch (StreamId(stream)) {
    case StreamId::kWal:
      return engine::LogKind::kWal;
    case StreamId::kEngineL0:
      return engine::LogKind::kL0;
    case StreamId::kEngineLarge:
      return engine::LogKind::kLarge;
    case StreamId::kEngineIndex:
      return engine::LogKind::kIndexStream;
  }
  return engine::LogKind::kWal;
}

// The header is checked on every scan (it is 64 bytes): a buffer whose header is not the one
// it was opened for has no valid prefix, however far an earlier scan got.
engine::LogScan ScanBuffer(const char* image, uint32_t size, uint32_t stream, uint64_t sequence,
                           ScanPoint from) {
  engine::LogScan scan = engine::ScanLogSegmentFrom(image, size, from.offset, from.chain);
  if (!scan.header_ok || scan.header.kind != uint32_t(KindOfStream(stream)) ||
      scan.header.sequence != sequence || scan.header.segment_size != size) {
    scan.valid_end = 0;
    scan.chain = 0;
    scan.records.clear();
  }
  return scan;
}

uint32_t ValidPrefix(const char* image, uint32_t size, uint32_t stream, uint64_t sequence) {
  return ScanBuffer(image, size, stream, sequence, ScanPoint{}).valid_end;
}

}  // namespace slipstream::replication
