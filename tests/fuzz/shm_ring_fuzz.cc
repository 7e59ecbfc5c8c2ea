// Fuzzes the shm backend's receive ring (shm_transport.h): the peer writes the ring's bytes and
// its tail word, so ReadShmRecordHeader must refuse anything that is not a whole, well-formed
// record, and a record it accepts must lie inside what the tail covers and be copied out
// (CopyShmRecordPayload) without reading outside the ring or writing past the receive buffer.
// The consumer loop below is ShmConnection::ConsumeRingLocked's, with receives of fuzzed sizes.
// Every accepted record must also be exactly what WriteShmRecord (the producer) writes for
// its header and payload at the same index.
//
// Input: u64 head (our consumer index; rounded down to 16 bytes, as ours always is), u64 tail
// minus head (the peer's word), one byte giving the number of posted receives (1..8), one
// byte per receive giving its size in units of 4 bytes, then the ring's bytes from the head
// on (wrapping around the ring's end; the rest of the ring is zero).
#include <cstring>
#include <memory>
#include <vector>

#include "fuzz_input.h"
#include "shm_transport.h"

namespace {

using namespace slipstream::rdma;
using slipstream::fuzz::FuzzFailure;
using slipstream::fuzz::FuzzInput;

constexpr size_t kMaxReceives = 8;

// Stops the run with a message: the ring code did something it must not.
[[noreturn]] void Fail(const char* what) {
  FuzzFailure("shm_ring", what);
}

// The ring: exactly kShmRingBytes on the heap, so ASan sees any access past its end.
char* Ring() {
  static char* ring = new char[kShmRingBytes]();
  return ring;
}

// A second ring that the producer re-encodes accepted records into.
char* Scratch() {
  static char* scratch = new char[kShmRingBytes]();
  return scratch;
}

// Copies `length` bytes to the ring from index `from` on, wrapping around its end.
void Place(char* ring, uint64_t from, const char* bytes, size_t length) {
  for (size_t i = 0; i < length; i++) ring[(from + i) % kShmRingBytes] = bytes[i];
}

// True when the rings hold the same `length` bytes from index `from` on (wrapping).
bool SameBytes(const char* a, const char* b, uint64_t from, uint64_t length) {
  for (uint64_t i = 0; i < length; i++) {
    if (a[(from + i) % kShmRingBytes] != b[(from + i) % kShmRingBytes]) return false;
  }
  return true;
}

}  // namespace

// Places the input in the ring and consumes it as Poll would, checking every accepted record.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 17 || size > kShmRingBytes) return 0;
  FuzzInput in(data, size);
  uint64_t head = 0, delta = 0;
  in.TakeRaw(&head);  // the size check above leaves both words and the count byte
  in.TakeRaw(&delta);
  head &= ~(kShmRecordHeaderBytes - 1);
  const uint64_t tail = head + delta;
  const size_t receives = in.Byte() % kMaxReceives + 1;
  std::vector<std::unique_ptr<char[]>> buffers;
  std::vector<uint32_t> sizes;
  for (size_t i = 0; i < receives; i++) {
    sizes.push_back(uint32_t(in.Byte()) * 4);
    buffers.push_back(std::make_unique<char[]>(sizes.back()));
  }
  const char* ring_bytes = in.rest().data();
  const size_t ring_length = in.size();
  char* ring = Ring();
  Place(ring, head, ring_bytes, ring_length);

  uint64_t consumed = head;
  for (size_t r = 0; r < receives; r++) {
    if (tail == consumed) break;
    ShmRecordHeader header;
    if (!ReadShmRecordHeader(ring, consumed, tail, &header).ok()) break;
    const uint64_t bytes = ShmRecordBytes(header.kind, header.length);
    if (tail < consumed || bytes > tail - consumed || bytes < kShmRecordHeaderBytes ||
        bytes % kShmRecordHeaderBytes != 0) {
      Fail("accepted a record that the tail does not cover");
    }
    const bool is_send = header.kind == kShmRecordSend;
    if ((!is_send && header.kind != kShmRecordWriteWithImm) || header.reserved != 0 ||
        (is_send && header.length > kShmMaxSendBytes)) {
      Fail("accepted a malformed record header");
    }
    // Copy out as Poll does (into the receive when it fits, else into a buffer of its own, to
    // re-encode it), then write the record again with the producer and compare.
    std::vector<Sge> payload;
    std::unique_ptr<char[]> spill;
    if (is_send) {
      char* out = buffers[r].get();
      if (header.length > sizes[r]) {
        spill = std::make_unique<char[]>(header.length);
        out = spill.get();
      }
      CopyShmRecordPayload(ring, consumed, header.length, out);
      payload.push_back(Sge{out, header.length, 0});
    }
    WriteShmRecord(Scratch(), consumed, header, is_send ? &payload : nullptr);
    if (!SameBytes(ring, Scratch(), consumed,
                   kShmRecordHeaderBytes + (is_send ? header.length : 0))) {
      Fail("an accepted record is not what the producer writes for it");
    }
    consumed += bytes;
  }

  // Leave the ring zero for the next input.
  std::vector<char> zeros(ring_length, '\0');
  Place(ring, head, zeros.data(), ring_length);
  return 0;
}
