// Seeds for backup_link_fuzz: a primary's ops and a backup's script of answers from the real
// encoder (wire.h), as a healthy backup answers them, and as it refuses.
#include <string>
#include <vector>

#include "seeds.h"
#include "slipstream/replication/wire.h"

namespace slipstream::fuzz {
namespace {

using namespace replication;

constexpr uint32_t kBuffer = 64 * 1024;

// The input: the ops (see backup_link_fuzz.cc), then each reply with its flags and length.
Seed Script(const std::string& name, const std::string& ops,
            const std::vector<std::pair<uint8_t, Message>>& replies) {
  Seed seed{name, ""};
  seed.bytes.push_back(char(ops.size()));
  seed.bytes += ops;
  for (const auto& [flags, message] : replies) {
    const std::string bytes = Encode(message);
    seed.bytes.push_back(char(flags));
    seed.bytes.push_back(char(bytes.size()));
    seed.bytes.push_back(char(bytes.size() >> 8));
    seed.bytes += bytes;
  }
  return seed;
}

// A session that appends across a buffer's end (close and open), flushes and polls; one whose
// backup has no buffer; one refused as stale; one with an extra message and failed WRITEs.
std::vector<Seed> BackupLinkSeeds() {
  const OpenOk first{0, 0x7f0000000000ull, kBuffer, 0x1111};
  const OpenOk second{1, 0x7f0000100000ull, kBuffer, 0x2222};
  return {
      Script("append_rotate_flush", std::string("\x00\x01\x02\x03\x00\x02", 6),
             {{0, HelloOk{3, kBuffer, 4, 0, 0}},
              {0, first},
              {0, CloseOk{0}},
              {0, second},
              {0, FlushOk{1, 9000}},
              {0, FlushOk{1, 12000}}}),
      Script("resume_and_flush", std::string("\x00\x02", 2),
             {{0, HelloOk{3, kBuffer, 2, 123456, 77}}, {0, first}, {0, FlushOk{0, 3112}}}),
      Script("no_buffer", std::string("\x00", 1),
             {{0, HelloOk{3, kBuffer, 1, 0, 0}},
              {0, Error{uint32_t(ErrorCode::kNoBuffer), "no free buffers"}}}),
      Script("stale", "", {{0, Error{uint32_t(ErrorCode::kStaleVersion), "stale"}}}),
      Script("extra_message", std::string("\x00\x03\x00", 3),
             {{0, HelloOk{3, kBuffer, 4, 0, 0}}, {1, first}, {0, FlushOk{0, 100}}}),
      Script("failed_writes", std::string("\x00\x00\x02", 3),
             {{0, HelloOk{3, kBuffer, 4, 0, 0}}, {2, first}, {0, FlushOk{0, 100}}}),
      Script("large_buffers", std::string("\x01\x01\x02", 3),
             {{0, HelloOk{3, 1u << 20, 4, 0, 0}},
              {0, OpenOk{0, 0x10000, 1u << 20, 5}},
              {0, FlushOk{0, 140000}}}),
  };
}

}  // namespace
SLIPSTREAM_FUZZ_SEEDS(backup_link, BackupLinkSeeds);
}  // namespace slipstream::fuzz
