// Seeds for shm_ring_fuzz: rings filled by the real producer (WriteShmRecord), at the ring's
// start, across its end (a payload that wraps), and far into the 64-bit index space.
#include <cstring>

#include "seeds.h"
#include "shm_transport.h"

namespace slipstream::fuzz {
namespace {

using namespace rdma;

// One record for Ring: SEND with `payload`, or WRITE_WITH_IMM of `length` bytes with `imm`.
struct Record {
  uint32_t kind;
  std::string payload;
  uint32_t length = 0;
  uint32_t imm = 0;
};

// The fuzz input for a ring whose consumer is at `head`, holding `records` written by the
// producer from `head` on, with one receive of `receive_size` bytes per record.
std::string Ring(uint64_t head, const std::vector<Record>& records, uint32_t receive_size) {
  std::vector<char> ring(kShmRingBytes, '\0');
  uint64_t tail = head;
  for (const Record& r : records) {
    const bool is_send = r.kind == kShmRecordSend;
    const uint32_t length = is_send ? uint32_t(r.payload.size()) : r.length;
    std::vector<Sge> payload = {Sge{r.payload.data(), uint32_t(r.payload.size()), 0}};
    WriteShmRecord(ring.data(), tail, ShmRecordHeader{r.kind, length, r.imm, 0},
                   is_send ? &payload : nullptr);
    tail += ShmRecordBytes(r.kind, length);
  }
  const uint64_t delta = tail - head;
  std::string input(16, '\0');
  std::memcpy(input.data(), &head, 8);
  std::memcpy(input.data() + 8, &delta, 8);
  input += char(records.size() - 1);
  input.append(records.size(), char(receive_size / 4));
  for (uint64_t i = head; i != tail; i++) input += ring[i % kShmRingBytes];
  return input;
}

// Typical ring contents: single records of each kind, several in a row, a wrapped payload, a
// SEND larger than its receive, and indexes near 2^64.
std::vector<Seed> ShmRingSeeds() {
  const std::string text = "a SEND through the shm receive ring";
  return {
      {"send", Ring(0, {{kShmRecordSend, text}}, 64)},
      {"write_with_imm", Ring(0, {{kShmRecordWriteWithImm, "", 4096, 0xfeed}}, 0)},
      {"empty_send", Ring(16, {{kShmRecordSend, ""}}, 0)},
      {"several", Ring(4096,
                       {{kShmRecordSend, "one"},
                        {kShmRecordWriteWithImm, "", 100, 1},
                        {kShmRecordSend, std::string(200, 'x')},
                        {kShmRecordSend, "four"}},
                       1020)},
      {"wrapped_payload", Ring(kShmRingBytes - 32, {{kShmRecordSend, text + text}}, 128)},
      {"header_at_end", Ring(kShmRingBytes - 16, {{kShmRecordSend, text}}, 64)},
      {"larger_than_receive", Ring(0, {{kShmRecordSend, std::string(300, 'y')}}, 16)},
      {"high_indexes", Ring(~uint64_t(0) - 1023, {{kShmRecordSend, text}}, 64)},
  };
}

}  // namespace
SLIPSTREAM_FUZZ_SEEDS(shm_ring, ShmRingSeeds);
}  // namespace slipstream::fuzz
