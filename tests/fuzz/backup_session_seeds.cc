// Seeds for backup_session_fuzz: scripts of a primary's session as a StreamShipper plays it
// (hello, open, writes by the log writer, flush, close, reopen), with requests from the real
// encoder (wire.h), and sessions a backup must refuse.
#include <string>
#include <vector>

#include "seeds.h"
#include "slipstream/engine/log_format.h"
#include "slipstream/replication/wire.h"

namespace slipstream::fuzz {
namespace {

using namespace replication;

// Builds a script: options, then events (see backup_session_fuzz.cc).
class Script {
 public:
  // Options: per-primary buffers, system id, timeline, stored version, resume.
  Script(uint8_t per_primary, uint8_t system_id, uint8_t timeline, uint8_t version) {
    bytes_ = {char(per_primary), char(system_id), char(timeline), char(version), 0};
  }
  Script& Send(const Message& m) {
    const std::string encoded = Encode(m);
    bytes_ += {char(0), char(encoded.size()), char(encoded.size() >> 8)};
    bytes_ += encoded;
    return *this;
  }
  Script& Write(uint8_t buffer, uint16_t offset, const std::string& data) {
    bytes_ += {char(1), char(buffer), char(offset), char(offset >> 8), char(data.size())};
    bytes_ += data;
    return *this;
  }
  Script& Format(uint8_t buffer, uint8_t stream, uint8_t sequence) {
    bytes_ += {char(2), char(buffer), char(stream - 1), char(sequence)};
    return *this;
  }
  // `records` + 1 records of `length` bytes and a checksum; returns where they end in *end.
  Script& Append(uint8_t buffer, uint8_t records, uint8_t length, uint32_t* end) {
    bytes_ += {char(3), char(buffer), char(records), char(length)};
    *end += (records + 1) * uint32_t(engine::kRecordHeaderSize + length) +
            uint32_t(engine::kChecksumEntrySize);
    return *this;
  }
  Seed Done(const std::string& name) const { return Seed{name, bytes_}; }

 private:
  std::string bytes_;
};

// A healthy session of each stream, flushes at and beyond the valid prefix, a torn append, and
// requests out of place.
std::vector<Seed> BackupSessionSeeds() {
  const uint32_t wal = uint32_t(StreamId::kWal);
  std::vector<Seed> seeds;
  uint32_t end = uint32_t(engine::kLogHeaderSize);
  Script session(1, 0, 0, 0);
  session.Send(Hello{42, 1, "p1", 1}).Send(Open{wal, 1, 1000}).Format(0, wal, 1);
  session.Append(0, 1, 100, &end).Append(0, 0, 40, &end);
  session.Send(Flush{0, end}).Append(0, 2, 10, &end).Send(Close{0, end});
  session.Send(Open{wal, 2, 1300}).Format(0, wal, 2);
  end = uint32_t(engine::kLogHeaderSize);
  session.Append(0, 0, 200, &end).Send(Flush{0, end + 1});
  seeds.push_back(session.Done("wal_session"));

  end = uint32_t(engine::kLogHeaderSize);
  Script index(2, 7, 3, 5);
  index.Send(Hello{7, 6, "primary-2", 3}).Send(Open{uint32_t(StreamId::kEngineIndex), 4, 0});
  index.Send(Open{uint32_t(StreamId::kEngineL0), 9, 0}).Format(0, 4, 4).Format(1, 2, 9);
  index.Append(0, 3, 50, &end).Append(1, 0, 20, &end).Send(Close{1, end});
  index.Send(Flush{0, end}).Write(0, uint16_t(end - 8), "torn");
  seeds.push_back(index.Done("index_and_l0"));

  Script stale(1, 0, 0, 9);
  stale.Send(Hello{1, 2, "p1", 0}).Send(Open{wal, 1, 0});
  seeds.push_back(stale.Done("stale_version"));

  Script early(1, 0, 0, 0);
  early.Send(Open{wal, 1, 0});
  seeds.push_back(early.Done("open_before_hello"));

  Script wrong(1, 0, 5, 0);
  wrong.Send(Hello{0, 1, "p1", 4}).Send(HelloOk{1, 2, 3, 4, 5});
  seeds.push_back(wrong.Done("wrong_timeline"));
  return seeds;
}

}  // namespace
SLIPSTREAM_FUZZ_SEEDS(backup_session, BackupSessionSeeds);
}  // namespace slipstream::fuzz
