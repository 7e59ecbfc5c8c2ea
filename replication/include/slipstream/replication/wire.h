// The control messages between a primary and a backup (Tailwind's open and close RPCs, and
// the flush and hello that slipstream adds). They travel as transport SENDs; the data itself
// travels only as one-sided WRITEs into the buffers these messages hand out.
//
// Every message is a 12-byte header (magic, type, payload length) and a payload of
// little-endian fields. Decode accepts exactly the encoding of one message and nothing else:
// anything malformed is InvalidArgument, and the receiver drops the peer.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include "slipstream/rdma/status.h"

namespace slipstream::replication {

using rdma::Status;

constexpr uint32_t kWireMagic = 0x50525353;  // "SSRP"
constexpr uint32_t kMaxMessage = 512;        // bytes of a whole message, header included
constexpr size_t kMaxNameLength = 63;        // primary names

// What a buffer holds.
enum class StreamId : uint32_t {
  kWal = 1,          // PostgreSQL WAL, on the commit path
  kEngineL0 = 2,     // the engine's L0 recovery log, byte for byte (off the commit path)
  kEngineLarge = 3,  // the engine's large-value log, byte for byte
  kEngineIndex = 4,  // index shipping: framed compaction events and large-log bytes
};
bool IsValidStream(uint32_t stream);
const char* StreamName(uint32_t stream);

// Why a backup refused a request.
enum class ErrorCode : uint32_t {
  kBadRequest = 1,     // a well-formed message that makes no sense now (e.g. OPEN before HELLO)
  kWrongCluster = 2,   // the primary is not of the cluster this backup copies
  kStaleVersion = 3,   // the primary's version is older than one the backup has seen
  kNoBuffer = 4,       // every buffer of this primary is open: close one and retry
  kUnknownBuffer = 5,  // not a buffer this primary holds open
  kBadLength = 6,      // a close or flush length that is not the end of a valid prefix
  kStorage = 7,        // the backup could not make the data durable
  kWrongTimeline = 8,  // the primary writes another WAL timeline than the backup replays
  kNoSession = 9,      // a JOIN that names no live session of that primary at that version
  kCannotShare = 10,   // a JOIN over a transport that cannot share a session's buffers
};

// The primary introduces itself; `version` orders primaries of the same name (a rejoining
// stale one is refused).
struct Hello {
  uint64_t system_id;
  uint64_t version;
  std::string primary;
  // The WAL timeline the primary writes (0: not a PostgreSQL primary). A backup that replays
  // another timeline was seeded before a failover and refuses it.
  uint32_t timeline = 0;
};
struct HelloOk {
  uint64_t version;      // the highest version the backup has seen for this primary
  uint32_t buffer_size;  // every buffer's length
  uint32_t buffers;      // buffers the primary may hold open at once
  // The WAL position where the backup's durable copy of this primary's WAL stream ends (0: it
  // holds none). The primary ships from here, so a reconnect never leaves a gap.
  uint64_t resume;
  // The same for the primary's index stream (StreamId::kEngineIndex; 0: it holds none).
  uint64_t index_resume = 0;
};
// Asks for a buffer for segment `sequence` of a stream, starting at stream position `start`.
struct Open {
  uint32_t stream;
  uint64_t sequence;
  uint64_t start;
};
struct OpenOk {
  uint32_t buffer;
  uint64_t addr;  // the buffer as an rdma::RemoteRegion
  uint64_t length;
  uint64_t rkey;
};
// The buffer is full at `length` (a valid prefix): make it durable and free it.
struct Close {
  uint32_t buffer;
  uint32_t length;
};
struct CloseOk {
  uint32_t buffer;
};
// Make the buffer's valid prefix up to `length` durable now (remote_flush).
struct Flush {
  uint32_t buffer;
  uint32_t length;
};
struct FlushOk {
  uint32_t buffer;
  uint32_t durable;  // bytes of the buffer now durable
};
struct Error {
  uint32_t code;  // ErrorCode
  std::string message;
};
// Instead of HELLO, on a placer link: a second connection of the primary (one of its committing
// backends) that appends to the buffers its session holds open, with the session's keys, and
// asks for no buffers of its own. Accepted only while a session of that primary at exactly
// that version lives (docs/replication.md, "Placement by the committing backend").
struct Join {
  uint64_t system_id;
  uint64_t version;
  std::string primary;
};
struct JoinOk {
  uint32_t registered;  // open buffers of the session registered on the link now
};

using Message =
    std::variant<Hello, HelloOk, Open, OpenOk, Close, CloseOk, Flush, FlushOk, Error, Join, JoinOk>;

// The bytes of a message (at most kMaxMessage; longer names are refused by Decode).
std::string Encode(const Message& message);
// Parses exactly one message; InvalidArgument for anything else.
Status Decode(std::string_view bytes, Message* message);

// A primary name: 1..63 of [A-Za-z0-9_.-] (it names a directory on the backup).
bool IsValidName(std::string_view name);

// Whether `size` is a buffer size a backup may offer (BackupServer::Start) and a primary takes
// (BackupLink::Connect): a power of two from 64 kB to 1 GB. A primary formats segments of that
// size in memory, so a smaller one could not hold a segment header and an append, and a larger
// one would only make it allocate gigabytes per stream.
bool IsValidBufferSize(uint64_t size);

}  // namespace slipstream::replication
