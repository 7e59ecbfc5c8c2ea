// Seeds for tcp_agent_fuzz: request frames encoded by a real tcp connection (its sender, over a
// socketpair whose other end records them), and response frames built from TcpFrameHeader,
// which is the wire format itself. Keys and addresses follow tcp_agent_fuzz's convention: rkey
// 0 is the read-write region, 1 the read-only one, remote_addr an offset into the region.
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <memory>

#include "backends.h"
#include "seeds.h"
#include "tcp_transport.h"

namespace slipstream::fuzz {
namespace {

using namespace rdma;

// Config bits of tcp_agent_fuzz's first byte.
constexpr char kPostRead = 1, kPostWrite = 2;
// The number of receives tcp_agent_fuzz posts, in its config byte.
char Recvs(int count) {
  return char(count << 2);
}

// One request for Encode: opcode, rkey selector, offset, and the payload or READ length.
struct Request {
  Opcode opcode;
  uint64_t rkey;
  uint64_t offset;
  std::string payload;
  uint32_t read_length = 0;
  uint32_t imm = 0;
};

// Posts `requests` on a real tcp connection and returns the frames its sender put on the wire.
std::string Encode(const std::vector<Request>& requests) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return {};
  std::unique_ptr<Connection> connection;
  if (!ConnectTcp(TransportOptions{}, fds[0], &connection).ok()) return {};
  std::vector<std::string> sources;
  sources.reserve(requests.size());
  size_t expected = 0;
  std::vector<char> read_target(1 << 16);
  LocalRegion read_local;
  connection->RegisterLocal(read_target.data(), read_target.size(), &read_local);
  for (const Request& r : requests) {
    sources.push_back(r.payload.empty() ? std::string(1, '\0') : r.payload);
    LocalRegion local;
    connection->RegisterLocal(sources.back().data(), sources.back().size(), &local);
    Sge sge = r.opcode == Opcode::kRead ? Sge{read_local.addr, r.read_length, read_local.lkey}
                                        : Sge{local.addr, uint32_t(r.payload.size()), local.lkey};
    WorkRequest wr;
    wr.opcode = r.opcode;
    wr.sg_list = &sge;
    wr.num_sge = sge.length > 0 ? 1 : 0;
    wr.rkey = r.rkey;
    wr.remote_addr = r.offset;
    wr.imm = r.imm;
    if (!connection->Post(&wr, 1).ok()) return {};
    expected += sizeof(TcpFrameHeader) + (r.opcode == Opcode::kRead ? 0 : r.payload.size());
  }
  std::string wire(expected, '\0');
  size_t got = 0;
  while (got < expected) {
    ssize_t n = ::recv(fds[1], wire.data() + got, expected - got, 0);
    if (n <= 0) return {};
    got += size_t(n);
  }
  connection.reset();
  ::close(fds[1]);
  return wire;
}

// A response frame (ACK, NAK or READ_RESPONSE) to our request `sequence`, with its payload.
std::string Response(TcpFrameType type, uint64_t sequence, const std::string& payload = {}) {
  TcpFrameHeader h;
  h.type = uint8_t(type);
  h.sequence = sequence;
  h.length = payload.size();
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h)) + payload;
}

// Typical exchanges: each request type, accesses at the regions' edges, refused ones, and the
// answers to our own READ and WRITE.
std::vector<Seed> TcpAgentSeeds() {
  const std::string text = "slipstream tcp agent seed";
  return {
      {"write", '\0' + Encode({{Opcode::kWrite, 0, 0, "0123456789abcdef"}})},
      {"write_at_end", '\0' + Encode({{Opcode::kWrite, 0, 4096 - 8, "last8byt"}})},
      {"write_past_end", '\0' + Encode({{Opcode::kWrite, 0, 4096 - 4, "overflow"}})},
      {"write_read_only", '\0' + Encode({{Opcode::kWrite, 1, 0, "refused!"}})},
      {"read", '\0' + Encode({{Opcode::kRead, 0, 100, "", 64}})},
      {"read_read_only", '\0' + Encode({{Opcode::kRead, 1, 0, "", 256}})},
      {"write_then_read", '\0' + Encode({{Opcode::kWrite, 0, 10, text},
                                         {Opcode::kRead, 0, 0, "", 4096},
                                         {Opcode::kWrite, 0, 2048, text}})},
      {"send_into_receives", Recvs(2) + Encode({{Opcode::kSend, 0, 0, "short send"},
                                                {Opcode::kSend, 0, 0, std::string(40, 's')},
                                                {Opcode::kSend, 0, 0, "unmatched"}})},
      {"write_with_imm", Recvs(1) + Encode({{Opcode::kWriteWithImm, 0, 64, text, 0, 0xabcd},
                                            {Opcode::kWriteWithImm, 0, 0, "", 0, 7}})},
      {"read_response",
       char(kPostRead) + Response(TcpFrameType::kReadResponse, 0, "sixteen bytes!!!")},
      {"read_response_and_ack", char(kPostRead | kPostWrite) +
                                    Response(TcpFrameType::kReadResponse, 0, "sixteen bytes!!!") +
                                    Response(TcpFrameType::kAck, 1)},
      {"nak", char(kPostWrite) + Response(TcpFrameType::kNak, 0)},
      {"mixed", char(kPostRead | Recvs(3)) +
                    Encode({{Opcode::kSend, 0, 0, "hello"}, {Opcode::kWrite, 0, 0, text}}) +
                    Response(TcpFrameType::kReadResponse, 0, "sixteen bytes!!!")},
  };
}

}  // namespace
SLIPSTREAM_FUZZ_SEEDS(tcp_agent, TcpAgentSeeds);
}  // namespace slipstream::fuzz
