// The shm backend: two processes on one host, each keeping its remotely accessible regions in
// one memfd "heap" that the peer maps after authentication. The initiator validates every
// WRITE and READ against the region table in the target's heap and moves the bytes itself, so
// the target's CPU does nothing for one-sided operations. SEND and WRITE_WITH_IMM append a
// record to a ring in the target's heap and wake it with a futex; the target consumes records
// into posted receives when it polls.
//
// Heap layout (offsets from the start of the memfd; all fixed, so both sides agree):
//   [0, kShmHeaderBytes)             ShmHeapHeader: magic, sizes, token, doorbell, error word,
//                                    ring head/tail, table high-water mark
//   [kShmTableOffset, +table)        kShmTableEntries ShmTableEntry, read by the peer
//   [kShmRingOffset, +kShmRingBytes) the receive ring, written by the peer
//   [kShmRegionOffset, heap_size)    region space, carved up by AllocateRegion
//
// Honest limits (shm is for trusted same-host peers): the peer maps the whole heap read-write,
// so a malicious process that authenticated could write anywhere in it (table and ring
// included); the checks here protect a correct peer from its own mistakes and keep a buggy
// peer from crashing us, not from a hostile one. A FreeRegion that races a WRITE the peer has
// already validated is not fenced: the peer's bytes may still land in the freed space (which
// AllocateRegion zeroes again before reuse).
//
// Setup messages on the authenticated socket (both sides send, then receive): one
// kShmHeapMessage carrying a ShmHeapDescription, then one empty kShmReadyMessage once the
// peer's heap is mapped and checked. Anything else drops the connection.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backends.h"

namespace slipstream::rdma {

constexpr uint64_t kShmHeapMagic = 0x5041454850494c53ull;  // "SLIPHEAP"
constexpr uint32_t kShmVersion = 1;
constexpr uint32_t kShmHeapMessage = 0x534d0001;
constexpr uint32_t kShmReadyMessage = 0x534d0002;

constexpr uint32_t kShmTableEntries = 4096;
constexpr uint64_t kShmHeaderBytes = 4096;
constexpr uint64_t kShmTableOffset = kShmHeaderBytes;
constexpr uint64_t kShmTableEntryBytes = 48;
constexpr uint64_t kShmRingOffset = kShmTableOffset + kShmTableEntries * kShmTableEntryBytes;
constexpr uint64_t kShmRingBytes = 1u << 20;
constexpr uint64_t kShmRegionOffset = kShmRingOffset + kShmRingBytes;
// Largest region space a peer may declare (a sanity bound on what we agree to map).
constexpr uint64_t kShmMaxRegionSpace = 1ull << 44;

// Ring records: a 16-byte header, then (SEND only) the payload padded to 16 bytes. The payload
// may wrap around the end of the ring; a header never does (everything is 16-byte aligned).
constexpr uint64_t kShmRecordHeaderBytes = 16;
constexpr uint64_t kShmMaxSendBytes = kShmRingBytes - kShmRecordHeaderBytes;
constexpr uint32_t kShmRecordSend = 1;
constexpr uint32_t kShmRecordWriteWithImm = 2;

// Values of the error word, written by the peer to tell us why it ended the connection.
constexpr uint32_t kShmNoError = 0;
constexpr uint32_t kShmErrorRemoteAccess = 1;

// Table entry states.
constexpr uint32_t kShmEntryFree = 0;
constexpr uint32_t kShmEntryValid = 1;

// One region of the owner, as the peer sees it. `sequence` is a seqlock: the owner makes it odd
// while it rewrites the entry, so a reader retries instead of using half-updated fields.
struct ShmTableEntry {
  std::atomic<uint64_t> sequence;
  std::atomic<uint64_t> rkey;
  std::atomic<uint64_t> base;    // the region's address in the owner's numbering (Describe)
  std::atomic<uint64_t> offset;  // where the region starts in the owner's heap
  std::atomic<uint64_t> length;
  std::atomic<uint32_t> access;
  std::atomic<uint32_t> state;
};
static_assert(sizeof(ShmTableEntry) == kShmTableEntryBytes);
static_assert(std::atomic<uint64_t>::is_always_lock_free);  // address-free across processes

// The start of every heap. Fields above `doorbell` are written once by the owner before the
// peer maps the heap; the rest are shared words.
struct ShmHeapHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t table_entries;
  uint64_t heap_size;
  uint64_t region_space;
  uint64_t ring_bytes;
  uint64_t token[2];  // random; the description must carry the same (guards against pid reuse)
  alignas(64) std::atomic<uint32_t> doorbell;   // futex word: bumped by the peer per record
  std::atomic<uint32_t> waiters;                // owner threads sleeping on the doorbell
  std::atomic<uint32_t> error;                  // set by the peer before it drops us
  std::atomic<uint32_t> table_used;             // entries [0, table_used) may be valid
  alignas(64) std::atomic<uint64_t> ring_head;  // bytes consumed (written by the owner)
  alignas(64) std::atomic<uint64_t> ring_tail;  // bytes produced (written by the peer)
};
static_assert(sizeof(ShmHeapHeader) <= kShmHeaderBytes);

// A ring record's header.
struct ShmRecordHeader {
  uint32_t kind;    // kShmRecordSend or kShmRecordWriteWithImm
  uint32_t length;  // SEND: payload bytes; WRITE_WITH_IMM: bytes written (reported byte_len)
  uint32_t imm;
  uint32_t reserved;
};
static_assert(sizeof(ShmRecordHeader) == kShmRecordHeaderBytes);

// What one side sends the other in kShmHeapMessage.
struct ShmHeapDescription {
  uint64_t magic;
  uint32_t version;
  int32_t pid;
  int32_t memfd;
  uint32_t table_entries;
  uint64_t heap_size;
  uint64_t region_space;
  uint64_t ring_bytes;
  uint64_t token[2];
};
static_assert(sizeof(ShmHeapDescription) == 64);

// The receive ring's record format, used by the producer (the peer's Post) and the consumer
// (our Poll), and fuzzed on its own (tests/fuzz/shm_ring_fuzz.cc): the peer writes the ring,
// so the consumer checks every record before it copies anything out of it.

// Bytes a ring record takes: the header, then for a SEND the payload padded to 16 bytes.
uint64_t ShmRecordBytes(uint32_t kind, uint64_t length);

// Writes a record at producer index `tail` of the ring at `ring` (kShmRingBytes long): the
// header, then (SEND only, else nullptr) the `payload` bytes, wrapping around the ring's end,
// each piece stored in ascending address order. The caller has checked that it fits.
void WriteShmRecord(char* ring, uint64_t tail, const ShmRecordHeader& header,
                    const std::vector<Sge>* payload);

// Checks the record at consumer index `head` (our own index: a multiple of 16) of the ring at
// `ring`, which the peer claims to have filled up to `tail` (its word: trusted for nothing;
// the caller has seen tail != head). OK with the header, copied out of the shared ring once,
// when the record is whole and well formed; IOError otherwise.
Status ReadShmRecordHeader(const char* ring, uint64_t head, uint64_t tail, ShmRecordHeader* header);

// Copies the first `length` payload bytes of the SEND record at consumer index `head` to `out`,
// wrapping around the ring's end (length was checked by ReadShmRecordHeader).
void CopyShmRecordPayload(const char* ring, uint64_t head, uint64_t length, char* out);

}  // namespace slipstream::rdma
