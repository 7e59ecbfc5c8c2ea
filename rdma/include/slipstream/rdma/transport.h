// The one-sided transport: a verbs-shaped interface with three backends (verbs, shm, tcp)
// that behave identically. Replication and the query shuffle move all their data through it.
//
// Semantics every backend guarantees (the conformance suite checks them on each):
//  * Completion of a WRITE means its bytes are placed in the remote region (like an RC ACK),
//    not merely sent. A READ completes when the bytes are in the local buffer.
//  * WRITEs on one connection are placed in the order they were posted. Within one WRITE,
//    shm and tcp place bytes in increasing address order; verbs hardware does not promise
//    that, so Tailwind-style torn-write detection must post the trailing checksum as its own
//    WRITE with `fence` set (which orders it after every earlier WRITE is placed). This works
//    identically on all three backends.
//  * A remote access violation (unknown key, out of bounds, missing right) fails that work
//    request with kRemoteAccessError on the initiator, moves the connection to the error state
//    (every later request completes with kFlushed), and the target sees the connection fail
//    with Status::RemoteAccess: both sides learn, nothing is placed.
//  * A peer that disconnects or dies is detected and reported (Status::Disconnected, pending
//    requests complete with kFlushed); no call blocks forever.
//  * Peers authenticate (challenge-response over a shared secret) before a connection exists,
//    so no region is ever registered for an unauthenticated peer. Remote keys are random
//    64-bit values; a region belongs to one connection and carries only the rights asked for.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "slipstream/rdma/status.h"

namespace slipstream::rdma {

// Rights on a region.
enum Access : uint32_t {
  kLocalOnly = 0,  // a local source or destination buffer only
  kRemoteWrite = 1u << 0,
  kRemoteRead = 1u << 1,
};

// A region of this side's memory, allocated and registered on one connection.
struct LocalRegion {
  char* addr = nullptr;
  size_t length = 0;
  uint64_t rkey = 0;  // random; 0 for local-only regions
  uint32_t lkey = 0;
  uint32_t access = kLocalOnly;
};

// What the peer needs to access a region: sent to it by the application (e.g. in a SEND).
struct RemoteRegion {
  uint64_t addr = 0;  // the region's address in its owner's numbering
  uint64_t length = 0;
  uint64_t rkey = 0;
};

// One piece of a local buffer (a gather source or a scatter destination).
struct Sge {
  const void* addr;
  uint32_t length;
  uint32_t lkey;
};

enum class Opcode : uint8_t { kWrite, kWriteWithImm, kRead, kSend, kRecv };

struct WorkRequest {
  uint64_t wr_id = 0;
  Opcode opcode = Opcode::kWrite;
  const Sge* sg_list = nullptr;  // WRITE/SEND: gathered source; READ: scattered destination
  uint32_t num_sge = 0;
  uint64_t remote_addr = 0;  // WRITE/READ
  uint64_t rkey = 0;         // WRITE/READ
  uint32_t imm = 0;          // kWriteWithImm: delivered to the target's next receive
  bool signaled = true;      // unsignaled requests produce a completion only on error
  bool fence = false;        // start only after every earlier request has completed
  // A strided gather (WRITE and WRITE with immediate, up to Connection::max_repeat()): the
  // gather list is taken `repeat` times, each time `repeat_stride` bytes further on in every
  // entry's buffer, and the copies land back to back at remote_addr. Such a WRITE places its
  // bytes in no particular order (places_in_address_order covers only WRITEs without one).
  uint32_t repeat = 1;
  uint64_t repeat_stride = 0;
};

// A buffer for an incoming SEND (or the notification of a WRITE with immediate).
struct RecvRequest {
  uint64_t wr_id = 0;
  Sge sge{};
};

enum class WcStatus : uint8_t {
  kSuccess = 0,
  kRemoteAccessError,  // bad key, out of bounds, or missing right at the target
  kLocalLengthError,   // a received SEND did not fit the posted receive buffer
  kFlushed,            // the connection failed before this request could run
};

struct Completion {
  uint64_t wr_id = 0;
  Opcode opcode = Opcode::kWrite;  // kRecv for receive completions
  WcStatus status = WcStatus::kSuccess;
  uint32_t byte_len = 0;  // received bytes (kRecv)
  uint32_t imm = 0;
  bool has_imm = false;
};

struct TransportOptions {
  std::string backend = "auto";  // "auto", "verbs", "shm" or "tcp"
  std::string secret;            // shared secret; both sides must hold the same one
  int connect_timeout_ms = 5000;
  uint32_t max_outstanding = 256;       // posted but not completed requests per connection
  size_t region_capacity = 1ull << 30;  // bytes of registered regions one connection may hold
  // tcp only: no receiving thread; Poll reads what the peer sent. For an initiator whose peer
  // never needs it to act unasked (replication's primary: the backups only answer), so that a
  // completion reaches the polling thread without a hand-off between threads. The peer's own
  // requests (a WRITE into this side's regions, a SEND, a READ) are then served only while
  // this side polls, and a dead peer is noticed by the next Poll.
  bool receive_in_poll = false;
};

class Connection {
 public:
  virtual ~Connection() = default;

  // Allocates and registers a zeroed region with the given rights for this connection.
  virtual Status AllocateRegion(size_t length, uint32_t access, LocalRegion* region) = 0;
  // Registers caller-owned memory as a local-only region of this connection (a gather source
  // or scatter destination, e.g. one buffer scattered to several peers); the memory must
  // outlive the registration, and FreeRegion deregisters it without freeing it.
  virtual Status RegisterLocal(void* addr, size_t length, LocalRegion* region) = 0;
  // Registers memory this connection does not own (a region of another connection) for the
  // peer's remote accesses under `rkey`, the random key that memory already has there, so that
  // several peers reach one buffer through one description (replication's placer links,
  // docs/replication.md). FreeRegion revokes it without freeing the memory and returns only
  // once no WRITE of the peer is storing into it (one caught in the middle ends the
  // connection), so the owner may reuse the memory at once; a WRITE whose key was revoked
  // while its bytes were stored is refused, never acknowledged. Only the tcp backend offers it
  // (InvalidArgument elsewhere: shm peers map the owner's memory directly, and verbs would need
  // the owner's protection domain).
  virtual Status RegisterShared(void* addr, size_t length, uint32_t access, uint64_t rkey,
                                LocalRegion* region);
  // Deregisters (the peer's later accesses fail) and frees a region.
  virtual Status FreeRegion(const LocalRegion& region) = 0;
  // What to send to the peer so that it can access `region`.
  virtual RemoteRegion Describe(const LocalRegion& region) const = 0;

  // Posts work requests in order with one doorbell. Fails (posting nothing) on bad input or
  // when more than max_outstanding would be in flight.
  virtual Status Post(const WorkRequest* requests, size_t count) = 0;
  virtual Status PostRecv(const RecvRequest* requests, size_t count) = 0;
  // Returns up to `max` completions; waits up to timeout_ms for the first (0: do not wait).
  virtual Status Poll(Completion* out, size_t max, int timeout_ms, size_t* count) = 0;

  // OK while usable; the error that ended it otherwise.
  virtual Status state() const = 0;
  virtual void Disconnect() = 0;
  virtual std::string backend() const = 0;
  // The most gather entries one work request may carry here.
  virtual uint32_t max_sge() const = 0;
  // The largest WorkRequest::repeat a WRITE may carry here: 1 where the transport has no
  // strided gather (verbs: a NIC's gather list is flat).
  virtual uint32_t max_repeat() const { return 1; }
  // Whether the bytes of one WRITE (without a repeat) become visible at the target in
  // increasing address order, and a WRITE cut short by a failure leaves exactly a prefix
  // placed. Then a checksum at the end of a WRITE is never seen before what it covers, and
  // needs no fenced WRITE of its own (shm copies upwards, tcp receives into the region in
  // order; verbs promises neither).
  virtual bool places_in_address_order() const { return false; }
  // A descriptor that becomes readable when the peer sent something only Poll handles, so that
  // a caller can wait for it together with other events and then Poll(0); -1 when no
  // descriptor tells (completions then come through Poll's own wait). Only a tcp connection
  // with receive_in_poll has one: its socket. Completions that need no frame (a failure
  // noticed locally, a delayed completion) do not make it readable: a caller waits with a
  // timeout.
  virtual int wait_fd() const { return -1; }
};

class Listener {
 public:
  virtual ~Listener() = default;
  // Waits for a peer, authenticates it and returns the connection. A peer that fails
  // authentication or speaks nonsense is dropped and Accept goes on waiting (until timeout).
  virtual Status Accept(int timeout_ms, std::unique_ptr<Connection>* connection) = 0;
  // The address peers connect to, "HOST:PORT" (the port actually bound).
  virtual std::string address() const = 0;
};

// Every backend sets up connections over a TCP socket at "HOST:PORT" (the authentication
// handshake and the exchange of region tables run there; verbs also uses it as rdma_cm's
// address). Listen with PORT 0 to get any free port. The connecting side's backend decides:
// "auto" picks verbs when a device exists, else shm when HOST is a loopback address, else tcp.
// A listener accepts any backend it supports.
Status Listen(const TransportOptions& options, const std::string& address,
              std::unique_ptr<Listener>* listener);
// Connects to a listener's address and authenticates.
Status Connect(const TransportOptions& options, const std::string& address,
               std::unique_ptr<Connection>* connection);

// The backend "auto" resolves to for a peer at `host` on this machine.
std::string ResolveBackend(const std::string& requested, const std::string& host);

}  // namespace slipstream::rdma
