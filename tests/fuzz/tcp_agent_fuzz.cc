// Fuzzes the tcp backend's receiving agent (tcp_transport.cc): a real TcpConnection (AcceptTcp)
// over a socketpair gets an arbitrary frame stream from the fuzzer, which plays the peer. The
// agent must never place a byte outside its regions (ASan guards the local buffers; the
// regions are compared with a model), and everything it does must match an independent model
// of the protocol: the bytes of every accepted WRITE land exactly where the model puts them,
// the responses it sends are a prefix of the model's, and every completion is the model's.
//
// Input: one config byte (bit 0: we post a READ of kReadBytes, bit 1: we post a WRITE of
// kWriteBytes, so the peer's responses have something to answer; bits 2-3: receives posted),
// then frames: a raw 48-byte TcpFrameHeader and, for the frame types that carry one, up to
// `length` payload bytes. The peer cannot know our random rkey or mmap address, so each header
// is patched before it is sent: rkey 1 names the read-only region, any other value is XORed
// with the read-write region's key (0: that key), and remote_addr is an offset from the named
// region's address (wrapping, so every address stays reachable).
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "backends.h"
#include "fuzz_input.h"
#include "tcp_transport.h"

namespace {

using namespace slipstream::rdma;
using slipstream::fuzz::FuzzFailure;
using slipstream::fuzz::FuzzInput;

constexpr size_t kMaxInput = 64u << 10;  // stays inside the socket buffer
constexpr size_t kRegionBytes = 4096;    // remote read and write
constexpr size_t kReadOnlyBytes = 256;   // remote read only
constexpr size_t kReadBytes = 16;        // our READ
constexpr size_t kWriteBytes = 8;        // our WRITE
constexpr size_t kRecvBytes = 32;        // each posted receive
constexpr size_t kMaxRecvs = 3;
// tcp_transport.cc's kMaxUnmatchedBytes: SEND bytes kept for receives not yet posted.
constexpr uint64_t kMaxUnmatchedBytes = 64u << 20;
constexpr uint64_t kReadOnlyKeySelector = 1;

// Stops the run with a message: the agent did something the model does not allow.
[[noreturn]] void Fail(const char* what) {
  FuzzFailure("tcp_agent", what);
}

// One frame as the fuzzer sent it (after patching).
struct Frame {
  TcpFrameHeader header;
  std::string payload;      // for a cut header: the raw bytes sent instead of a header
  bool whole = true;        // false: the input ended inside the payload
  bool cut_header = false;  // the input ended inside the header
};

// A response frame (ACK, NAK or READ_RESPONSE) with the fields the model predicts.
struct Response {
  uint8_t type;
  uint64_t sequence;
  uint64_t length;
  // Equal when type, sequence and length agree.
  bool operator==(const Response& other) const {
    return type == other.type && sequence == other.sequence && length == other.length;
  }
};

// What a completion of ours should say: its status and, for receives, length, imm and bytes.
struct Outcome {
  WcStatus status = WcStatus::kFlushed;
  uint32_t byte_len = 0;
  uint32_t imm = 0;
  bool has_imm = false;
  std::string data;
};

// One of our own requests, as the model tracks it until the peer answers.
struct OwnRequest {
  uint64_t sequence;
  bool is_read;
  Outcome* outcome;
};

// The regions the agent serves, as the model knows them.
struct Target {
  uint64_t rkey;
  uint64_t base;
  uint64_t length;
  uint32_t access;
};

// True for the frame types followed by `length` payload bytes.
bool CarriesPayload(uint8_t type) {
  return type == uint8_t(TcpFrameType::kWrite) || type == uint8_t(TcpFrameType::kWriteWithImm) ||
         type == uint8_t(TcpFrameType::kSend) || type == uint8_t(TcpFrameType::kReadResponse);
}

// The model's access check, in 128-bit arithmetic (no wrap) rather than the agent's offsets.
const Target* ModelResolve(const std::vector<Target>& targets, const TcpFrameHeader& h,
                           uint32_t right) {
  for (const Target& t : targets) {
    if (t.rkey != h.rkey) continue;
    if ((t.access & right) != right) return nullptr;
    unsigned __int128 end = (unsigned __int128)h.remote_addr + h.length;
    if (h.remote_addr < t.base || end > (unsigned __int128)t.base + t.length) return nullptr;
    return &t;
  }
  return nullptr;
}

// Everything the model predicts for one input.
struct Prediction {
  std::string region;  // the read-write region's bytes afterwards
  std::vector<Response> responses;
  Outcome recvs[kMaxRecvs];
  Outcome read;
  Outcome write;
};

// Runs the frames through the model of the agent (tcp_transport.h's protocol): frames are
// handled in order until the first one that ends the connection.
void Predict(const std::vector<Frame>& frames, const std::vector<Target>& targets, bool post_read,
             bool post_write, size_t recvs, Prediction* p) {
  p->region.assign(kRegionBytes, '\0');
  std::deque<OwnRequest> own;
  uint64_t own_sequence = 0;
  if (post_read) own.push_back({own_sequence++, true, &p->read});
  if (post_write) own.push_back({own_sequence++, false, &p->write});
  uint64_t next_sequence = 0;
  size_t next_recv = 0;
  uint64_t unmatched = 0;
  for (const Frame& f : frames) {
    const TcpFrameHeader& h = f.header;
    if (f.cut_header) break;  // the agent reads EOF inside the header
    const bool reserved_zero =
        h.reserved[0] == 0 && h.reserved[1] == 0 && h.reserved[2] == 0 && h.reserved2 == 0;
    if (h.magic != kTcpFrameMagic || !reserved_zero || h.type < 1 || h.type > 7 ||
        h.length > UINT32_MAX) {
      break;
    }
    const auto type = TcpFrameType(h.type);
    if ((type == TcpFrameType::kAck || type == TcpFrameType::kNak) && h.length != 0) break;
    if (type == TcpFrameType::kAck || type == TcpFrameType::kNak ||
        type == TcpFrameType::kReadResponse) {
      if (own.empty() || own.front().sequence != h.sequence) break;
      OwnRequest request = own.front();
      if (type == TcpFrameType::kNak) {
        request.outcome->status = WcStatus::kRemoteAccessError;
        own.pop_front();
        break;
      }
      const bool consistent = request.is_read
                                  ? type == TcpFrameType::kReadResponse && h.length == kReadBytes
                                  : type == TcpFrameType::kAck;
      if (!consistent || !f.whole) break;
      request.outcome->status = WcStatus::kSuccess;
      if (request.is_read) request.outcome->data = f.payload;
      own.pop_front();
      continue;
    }
    if (h.sequence != next_sequence) break;
    next_sequence++;
    if (type == TcpFrameType::kWrite || type == TcpFrameType::kWriteWithImm) {
      const Target* t = ModelResolve(targets, h, kRemoteWrite);
      if (t == nullptr) {
        p->responses.push_back({uint8_t(TcpFrameType::kNak), h.sequence, 0});
        break;
      }
      if (t == &targets[0]) {
        std::memcpy(p->region.data() + (h.remote_addr - t->base), f.payload.data(),
                    f.payload.size());
      }
      if (!f.whole) break;
      if (type == TcpFrameType::kWriteWithImm && next_recv < recvs) {
        Outcome& r = p->recvs[next_recv++];
        r.status = WcStatus::kSuccess;
        r.byte_len = uint32_t(h.length);
        r.imm = h.imm;
        r.has_imm = true;
      }
      p->responses.push_back({uint8_t(TcpFrameType::kAck), h.sequence, 0});
    } else if (type == TcpFrameType::kReadRequest) {
      if (ModelResolve(targets, h, kRemoteRead) == nullptr) {
        p->responses.push_back({uint8_t(TcpFrameType::kNak), h.sequence, 0});
        break;
      }
      p->responses.push_back({uint8_t(TcpFrameType::kReadResponse), h.sequence, h.length});
    } else {  // kSend
      if (next_recv < recvs) {
        if (!f.whole) break;  // the receive is flushed
        Outcome& r = p->recvs[next_recv++];
        if (h.length <= kRecvBytes) {
          r.status = WcStatus::kSuccess;
          r.byte_len = uint32_t(h.length);
          r.data = f.payload;
        } else {
          r.status = WcStatus::kLocalLengthError;
        }
      } else {
        if (unmatched + h.length > kMaxUnmatchedBytes || !f.whole) break;
        unmatched += h.length;
      }
      p->responses.push_back({uint8_t(TcpFrameType::kAck), h.sequence, 0});
    }
  }
}

// Splits the rest of the input into frames, patching each header's key and address (see the
// top).
std::vector<Frame> ParseFrames(FuzzInput in, const std::vector<Target>& targets) {
  std::vector<Frame> frames;
  while (!in.empty()) {
    Frame f;
    if (!in.TakeRaw(&f.header)) {
      f.cut_header = true;
      f.payload.assign(in.rest());
      frames.push_back(f);
      break;
    }
    const Target& named = f.header.rkey == kReadOnlyKeySelector ? targets[1] : targets[0];
    f.header.rkey =
        f.header.rkey == kReadOnlyKeySelector ? targets[1].rkey : f.header.rkey ^ targets[0].rkey;
    f.header.remote_addr += named.base;
    if (CarriesPayload(f.header.type)) {
      f.payload.assign(in.Bytes(size_t(f.header.length)));
      f.whole = f.payload.size() == f.header.length;
    }
    frames.push_back(f);
  }
  return frames;
}

// The bytes on the wire for `frames` (a cut header goes out as its raw bytes).
std::string Wire(const std::vector<Frame>& frames) {
  std::string wire;
  for (const Frame& f : frames) {
    if (!f.cut_header) wire.append(reinterpret_cast<const char*>(&f.header), sizeof(f.header));
    wire += f.payload;
  }
  return wire;
}

// Writes `wire` to the agent and reads everything it sends back until it closes the socket;
// the peer half-closes once its stream is out, so the agent always reaches the end.
std::string Exchange(int fd, const std::string& wire) {
  std::string received;
  size_t sent = 0;
  bool write_open = true;
  if (wire.empty()) {
    ::shutdown(fd, SHUT_WR);
    write_open = false;
  }
  char buffer[16384];
  for (;;) {
    pollfd p{fd, short(POLLIN | (write_open ? POLLOUT : 0)), 0};
    int rc = ::poll(&p, 1, 10000);
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) Fail("the agent neither read nor closed within 10 s");
    if (write_open && (p.revents & (POLLOUT | POLLERR | POLLHUP)) != 0) {
      ssize_t n = ::send(fd, wire.data() + sent, wire.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) sent += size_t(n);
      if ((n < 0 && errno != EAGAIN && errno != EINTR) || sent == wire.size()) {
        ::shutdown(fd, SHUT_WR);  // EPIPE: the agent is gone already
        write_open = false;
      }
    }
    if ((p.revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
      ssize_t n = ::recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
      if (n > 0) {
        received.append(buffer, size_t(n));
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        return received;
      }
    }
  }
}

// Splits what the connection sent into its own requests (checked against what we posted) and
// its responses; a cut frame at the end (the socket shut down mid-send) is ignored.
std::vector<Response> ParseReplies(const std::string& bytes, bool post_read, bool post_write) {
  std::vector<Response> responses;
  std::deque<Response> own;  // our requests in posting order (type, sequence, length)
  if (post_read) own.push_back({uint8_t(TcpFrameType::kReadRequest), 0, kReadBytes});
  if (post_write) own.push_back({uint8_t(TcpFrameType::kWrite), post_read ? 1u : 0u, kWriteBytes});
  size_t pos = 0;
  while (bytes.size() - pos >= sizeof(TcpFrameHeader)) {
    TcpFrameHeader h;
    std::memcpy(&h, bytes.data() + pos, sizeof(h));
    pos += sizeof(h);
    if (h.magic != kTcpFrameMagic) Fail("the connection sent a frame without the magic");
    const auto type = TcpFrameType(h.type);
    if (type == TcpFrameType::kReadRequest || type == TcpFrameType::kWrite) {
      if (own.empty() || !(own.front() == Response{h.type, h.sequence, h.length})) {
        Fail("the connection sent a request nobody posted");
      }
      own.pop_front();
      if (type == TcpFrameType::kWrite) pos += std::min<size_t>(kWriteBytes, bytes.size() - pos);
      continue;
    }
    if (type != TcpFrameType::kAck && type != TcpFrameType::kNak &&
        type != TcpFrameType::kReadResponse) {
      Fail("the connection sent a frame of an unexpected type");
    }
    if (type == TcpFrameType::kReadResponse && bytes.size() - pos < h.length) break;  // cut
    responses.push_back({h.type, h.sequence, h.length});
    if (type == TcpFrameType::kReadResponse) pos += size_t(h.length);
  }
  return responses;
}

// Compares one completion with the model's outcome; `buffer` holds a receive's bytes.
void CheckOutcome(const Completion& c, const Outcome& want, const char* buffer, const char* what) {
  if (c.status != want.status) {
    const std::string message = std::string(what) + " completed with status " +
                                std::to_string(int(c.status)) + ", the model says " +
                                std::to_string(int(want.status));
    FuzzFailure("tcp_agent", message.c_str());
  }
  if (c.status != WcStatus::kSuccess) return;
  if (c.opcode == Opcode::kRecv &&
      (c.byte_len != want.byte_len || c.imm != want.imm || c.has_imm != want.has_imm)) {
    Fail("a receive completion disagrees with the model (length or immediate)");
  }
  if (buffer != nullptr && std::memcmp(buffer, want.data.data(), want.data.size()) != 0) {
    Fail("a completed buffer holds other bytes than the peer sent");
  }
}

}  // namespace

// Runs one frame stream through a fresh connection's agent and compares it with the model.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > kMaxInput) return 0;
  FuzzInput in(data, size);
  const uint8_t config = in.Byte();
  const bool post_read = (config & 1) != 0;
  const bool post_write = (config & 2) != 0;
  const size_t recvs = std::min<size_t>((config >> 2) & 3, kMaxRecvs);

  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) Fail("socketpair");
  std::unique_ptr<Connection> connection;
  if (!AcceptTcp(TransportOptions{}, fds[0], &connection).ok()) Fail("AcceptTcp");
  LocalRegion region, read_only;
  if (!connection->AllocateRegion(kRegionBytes, kRemoteWrite | kRemoteRead, &region).ok() ||
      !connection->AllocateRegion(kReadOnlyBytes, kRemoteRead, &read_only).ok()) {
    Fail("AllocateRegion");
  }
  std::vector<Target> targets = {
      {region.rkey, uint64_t(reinterpret_cast<uintptr_t>(region.addr)), kRegionBytes,
       kRemoteWrite | kRemoteRead},
      {read_only.rkey, uint64_t(reinterpret_cast<uintptr_t>(read_only.addr)), kReadOnlyBytes,
       kRemoteRead}};

  // Local buffers on the heap, each registered alone, so ASan sees a byte placed past one.
  auto read_buffer = std::make_unique<char[]>(kReadBytes);
  auto write_buffer = std::make_unique<char[]>(kWriteBytes);
  std::unique_ptr<char[]> recv_buffers[kMaxRecvs];
  std::memset(write_buffer.get(), 'w', kWriteBytes);
  LocalRegion read_local, write_local;
  connection->RegisterLocal(read_buffer.get(), kReadBytes, &read_local);
  connection->RegisterLocal(write_buffer.get(), kWriteBytes, &write_local);
  for (size_t i = 0; i < recvs; i++) {
    recv_buffers[i] = std::make_unique<char[]>(kRecvBytes);
    LocalRegion local;
    connection->RegisterLocal(recv_buffers[i].get(), kRecvBytes, &local);
    RecvRequest recv{100 + i, Sge{local.addr, uint32_t(kRecvBytes), local.lkey}};
    if (!connection->PostRecv(&recv, 1).ok()) Fail("PostRecv");
  }
  if (post_read) {
    Sge sge{read_local.addr, uint32_t(kReadBytes), read_local.lkey};
    WorkRequest wr;
    wr.wr_id = 1;
    wr.opcode = Opcode::kRead;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.remote_addr = 0x1000;
    wr.rkey = 7;
    if (!connection->Post(&wr, 1).ok()) Fail("Post READ");
  }
  if (post_write) {
    Sge sge{write_local.addr, uint32_t(kWriteBytes), write_local.lkey};
    WorkRequest wr;
    wr.wr_id = 2;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.remote_addr = 0x2000;
    wr.rkey = 7;
    if (!connection->Post(&wr, 1).ok()) Fail("Post WRITE");
  }

  std::vector<Frame> frames = ParseFrames(in, targets);
  Prediction want;
  Predict(frames, targets, post_read, post_write, recvs, &want);
  std::vector<Response> got = ParseReplies(Exchange(fds[1], Wire(frames)), post_read, post_write);

  // The agent is done (it shut the socket down after its last frame): check its work.
  if (std::memcmp(region.addr, want.region.data(), kRegionBytes) != 0) {
    Fail("the read-write region differs from the model (a WRITE landed elsewhere)");
  }
  for (size_t i = 0; i < kReadOnlyBytes; i++) {
    if (read_only.addr[i] != 0) Fail("a byte landed in the read-only region");
  }
  if (got.size() > want.responses.size() ||
      !std::equal(got.begin(), got.end(), want.responses.begin())) {
    Fail("the responses are not a prefix of the model's");
  }
  Completion completions[16];
  size_t count = 0;
  connection->Poll(completions, 16, 0, &count);
  size_t expected = recvs + size_t(post_read) + size_t(post_write);
  if (count != expected) Fail("not exactly one completion per posted request");
  for (size_t i = 0; i < count; i++) {
    const Completion& c = completions[i];
    if (c.wr_id == 1) {
      CheckOutcome(c, want.read, read_buffer.get(), "our READ");
    } else if (c.wr_id == 2) {
      CheckOutcome(c, want.write, nullptr, "our WRITE");
    } else if (c.wr_id >= 100 && c.wr_id < 100 + recvs) {
      CheckOutcome(c, want.recvs[c.wr_id - 100], recv_buffers[c.wr_id - 100].get(), "a receive");
    } else {
      Fail("a completion for nothing we posted");
    }
  }
  connection.reset();  // joins the agent and the sender, closes fds[0]
  ::close(fds[1]);
  return 0;
}
