// ValidPrefix: see buffer_scan.h.
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
  }
  return engine::LogKind::kWal;
}

uint32_t ValidPrefix(const char* image, uint32_t size, uint32_t stream, uint64_t sequence) {
  engine::LogScan scan = engine::ScanLogSegment(image, size);
  if (!scan.header_ok || scan.header.kind != uint32_t(KindOfStream(stream)) ||
      scan.header.sequence != sequence || scan.header.segment_size != size) {
    return 0;
  }
  return scan.valid_end;
}

}  // namespace slipstream::replication
