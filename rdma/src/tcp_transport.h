// The tcp backend: after the setup handshake the same socket carries frames. Each side runs
// one receiving agent thread that checks every incoming access against its RegionTable and
// receives WRITE payloads straight into the region (in increasing address order), then
// acknowledges, so an initiator's WRITE completion means the bytes are placed. Frames go out
// through io_uring from one sender thread per connection.
//
// Wire format (host byte order; both peers run on the same kind of machine): every frame is a
// TcpFrameHeader, followed for WRITE, WRITE_WITH_IMM, SEND and READ_RESPONSE by `length`
// payload bytes. Requests carry the initiator's sequence number; each request gets exactly one
// response (ACK, NAK or READ_RESPONSE) carrying the same number, in order.
#pragma once

#include <cstdint>

#include "backends.h"
#include "software_backend.h"

namespace slipstream::rdma {

constexpr uint32_t kTcpFrameMagic = 0x46504c53;  // "SLPF"
// Largest payload of one frame: that of one request.
constexpr uint64_t kTcpMaxPayload = kSoftwareMaxRequestBytes;

enum class TcpFrameType : uint8_t {
  kWrite = 1,         // rkey, remote_addr, length, payload
  kWriteWithImm = 2,  // as kWrite, plus imm for the target's next receive
  kReadRequest = 3,   // rkey, remote_addr, length; answered by kReadResponse
  kSend = 4,          // length, payload for the target's next receive
  kAck = 5,           // the request `sequence` was carried out
  kNak = 6,           // the request `sequence` was refused (remote access error)
  kReadResponse = 7,  // length, the bytes read
};

struct TcpFrameHeader {
  uint32_t magic = kTcpFrameMagic;
  uint8_t type = 0;
  uint8_t reserved[3] = {0, 0, 0};
  uint32_t imm = 0;
  uint32_t reserved2 = 0;
  uint64_t sequence = 0;
  uint64_t rkey = 0;
  uint64_t remote_addr = 0;
  uint64_t length = 0;
};
static_assert(sizeof(TcpFrameHeader) == 48);

}  // namespace slipstream::rdma
