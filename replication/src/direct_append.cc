// AppendDirect: see slipstream/replication/direct_append.h.
#include "slipstream/replication/direct_append.h"

#include <algorithm>
#include <string>

#include "slipstream/engine/log_format.h"
#include "slipstream/engine/log_writer.h"
#include "slipstream/replication/stream_shipper.h"

namespace slipstream::replication {

Status AppendDirect(SharedCursor* cursor, DirectTarget* target, uint64_t position,
                    std::string_view bytes, size_t* appended) {
  *appended = 0;
  if (cursor->valid == 0) return Status::Unavailable("no open buffer to append to");
  if (position != cursor->end) {
    return Status::InvalidArgument("stream bytes must be appended in order");
  }
  // One record and its checksum are formatted here, then written as one WRITE: the records'
  // bytes do not depend on where they lie in the segment, only on the chain before them.
  thread_local std::string scratch;
  const uint32_t overhead = uint32_t(engine::kRecordHeaderSize + engine::kChecksumEntrySize);
  while (!bytes.empty()) {
    const uint32_t room = cursor->buffer_size - cursor->pos;
    if (cursor->pos > cursor->buffer_size || room < overhead + StreamShipper::kMinRecordRoom) {
      break;  // full: the shipper closes it and opens the next
    }
    const size_t n = std::min<size_t>({bytes.size(), room - overhead, engine::kMaxRecordPayload});
    if (scratch.size() < n + overhead) scratch.resize(n + overhead);
    engine::LogCursor local{0, cursor->chain};
    engine::AppendRecord(scratch.data(), &local, engine::LogRecordType::kWal, cursor->end,
                         {bytes.substr(0, n)});
    engine::AppendChecksum(scratch.data(), &local);
    Status s =
        target->Write(cursor->rkey, cursor->remote_addr + cursor->pos, scratch.data(), local.pos);
    if (!s.ok()) {
      cursor->valid = 0;
      return s;
    }
    cursor->pos += local.pos;
    cursor->chain = local.chain;
    cursor->end += n;
    *appended += n;
    bytes.remove_prefix(n);
  }
  return Status::OK();
}

}  // namespace slipstream::replication
