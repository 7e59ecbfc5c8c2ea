// Seeds for channel_fuzz: what a real sending Channel writes to its peer, recorded. A receiving
// Channel is opened first on a Recorder to obtain its setup message (its regions get the same
// virtual addresses and keys as under channel_fuzz's PeerScript), then a sending Channel is
// opened against that setup message, and every WRITE it posts becomes a kPeerWrite step of the
// script, followed by the receiving side's steps (Receive, or ReceivePackage and Release).
#include <cstring>
#include <deque>
#include <memory>

#include "channel_script.h"
#include "fake_connection.h"
#include "seeds.h"
#include "slipstream/rdma/channel.h"

namespace slipstream::fuzz {
namespace {

using namespace rdma;

// A Connection that completes everything at once, hands the first receive a given setup
// message, and records the SEND payloads and WRITEs posted on it (as channel_fuzz steps).
class Recorder : public Connection {
 public:
  explicit Recorder(std::string peer_setup) : peer_setup_(std::move(peer_setup)) {}

  // Zeroed memory under the next region index (virtual address and key as in channel_fuzz).
  Status AllocateRegion(size_t length, uint32_t access, LocalRegion* region) override {
    memory_.push_back(std::make_unique<char[]>(length));
    return RegisterLocalWithAccess(memory_.back().get(), length, access, region);
  }
  // The caller's memory under the next region index.
  Status RegisterLocal(void* addr, size_t length, LocalRegion* region) override {
    return RegisterLocalWithAccess(static_cast<char*>(addr), length, kLocalOnly, region);
  }
  // Nothing to give back before the Recorder goes.
  Status FreeRegion(const LocalRegion&) override { return Status::OK(); }
  // The virtual address of the region's index.
  RemoteRegion Describe(const LocalRegion& region) const override {
    return RemoteRegion{kChannelVirtualBase * region.lkey, region.length, region.rkey};
  }
  // Records the request's bytes and completes it.
  Status Post(const WorkRequest* requests, size_t count) override {
    for (size_t i = 0; i < count; i++) {
      const WorkRequest& wr = requests[i];
      const std::string bytes = GatheredBytes(wr);
      if (wr.opcode == Opcode::kSend) {
        sent = bytes;
      } else {
        std::string step(1, char(kPeerWrite));
        step.append(reinterpret_cast<const char*>(&wr.rkey), 8);
        step.append(reinterpret_cast<const char*>(&wr.remote_addr), 8);
        const uint16_t length = uint16_t(bytes.size());
        step.append(reinterpret_cast<const char*>(&length), 2);
        writes += step + bytes;
        write_count++;
      }
      Completion c;
      c.wr_id = wr.wr_id;
      c.opcode = wr.opcode;
      if (wr.signaled) completions_.push_back(c);
    }
    return Status::OK();
  }
  // Fills the receive with the peer's setup message.
  Status PostRecv(const RecvRequest* requests, size_t count) override {
    for (size_t i = 0; i < count; i++) {
      std::memcpy(const_cast<void*>(requests[i].sge.addr), peer_setup_.data(),
                  std::min<size_t>(peer_setup_.size(), requests[i].sge.length));
      Completion c;
      c.wr_id = requests[i].wr_id;
      c.opcode = Opcode::kRecv;
      c.byte_len = uint32_t(peer_setup_.size());
      completions_.push_back(c);
    }
    return Status::OK();
  }
  // Hands out what completed.
  Status Poll(Completion* out, size_t max, int, size_t* count) override {
    *count = PopCompletions(&completions_, out, max);
    return Status::OK();
  }
  // Never fails.
  Status state() const override { return Status::OK(); }
  // Nothing to drop (a receiving channel calls this when it refuses the junk setup message).
  void Disconnect() override {}
  // A name for messages.
  std::string backend() const override { return "recorder"; }
  // As channel_fuzz's PeerScript, so that the recorded packages are gathered the same way.
  uint32_t max_sge() const override { return 4; }

  std::string sent;    // the last SEND's payload (a channel's setup message)
  std::string writes;  // the WRITEs posted so far, as kPeerWrite steps
  size_t write_count = 0;

 private:
  // Registers under the next index: lkey index+1, key kChannelKeyBase+index when remote.
  Status RegisterLocalWithAccess(char* addr, size_t length, uint32_t access, LocalRegion* region) {
    const uint32_t index = next_index_++;
    *region = LocalRegion{addr, length, access == kLocalOnly ? 0 : kChannelKeyBase + index,
                          index + 1, access};
    return Status::OK();
  }

  std::string peer_setup_;
  uint32_t next_index_ = 0;
  std::vector<std::unique_ptr<char[]>> memory_;
  std::deque<Completion> completions_;
};

// One message for Script: its opcode and size, and how the receiver takes it.
struct Sent {
  uint32_t opcode;
  size_t size;
  bool zero_copy = false;  // ReceivePackage + Release per package instead of Receive
};

// The script that a real sender produces for `messages` to a receiver with the options of
// `config` (`sender_buffer` is the sender's Send Buffer, which bounds its packages), then `tail`.
std::string Script(uint8_t config, uint32_t sender_buffer, const std::vector<Sent>& messages,
                   const std::string& tail = {}) {
  // The receiver's setup message: its Open sends it before it sees ours (junk: it fails).
  Recorder receiving(std::string(64, '\0'));
  std::unique_ptr<Channel> unused;
  Channel::Open(&receiving, ChannelConfigOptions(config), 1000, &unused);
  ChannelOptions sender_options;
  sender_options.send_buffer_size = sender_buffer;
  sender_options.packages_in_flight = 1;
  sender_options.receive_buffers = 1;
  sender_options.receive_buffer_size = 4096;
  Recorder sending(receiving.sent);
  std::unique_ptr<Channel> sender;
  if (!Channel::Open(&sending, sender_options, 1000, &sender).ok()) return {};
  std::string script(1, char(config));
  script += char(sending.sent.size());
  script += sending.sent;
  uint32_t seed = 1;
  for (const Sent& m : messages) {
    std::string data(m.size, '\0');
    for (char& c : data) c = char('a' + (seed++ % 26));
    sending.writes.clear();
    sending.write_count = 0;
    if (!sender->Send(m.opcode, data, 0, 1000).ok()) return {};
    script += sending.writes;
    if (!m.zero_copy) {
      script += char(kReceive);
      continue;
    }
    // Two WRITEs (package, READY word) per package.
    for (size_t i = 0; i < sending.write_count / 2; i++) {
      script += char(kReceivePackage);
      script += char(kRelease);
    }
  }
  return script + tail;
}

// A FREE word for the peer's buffer `entry` (entry 8 + j of our Buffer-Info array).
std::string FreeWord(uint8_t buffer, uint64_t sequence) {
  std::string step(1, char(kPeerWriteWord));
  step += char(8 + buffer);
  const uint64_t word = sequence << 8;  // state 0 (FREE) in bits 0-7
  step.append(reinterpret_cast<const char*>(&word), 8);
  return step;
}

// Messages of sizes around the package boundary, with each receive path and buffer count, and
// scripts that send back through buffers the peer freed.
std::vector<Seed> ChannelSeeds() {
  const uint8_t four = ChannelConfig(4, 4096);
  const uint8_t seven = ChannelConfig(7, 8192);
  const uint8_t one = ChannelConfig(1, 4096);
  const std::string send_back = std::string(1, char(kSend)) + char(9) + char(100);
  return {
      {"one_message", Script(four, 1 << 16, {{1, 100}})},
      {"empty_message", Script(four, 1 << 16, {{2, 0}})},
      {"full_package", Script(four, 1 << 16, {{3, 4096 - 48}})},
      {"two_packages", Script(four, 1 << 16, {{4, 4096}})},
      {"three_messages", Script(seven, 1 << 16, {{5, 10}, {6, 3000}, {7, 1}})},
      {"zero_copy", Script(four, 1 << 16, {{8, 4100, true}, {9, 20, true}})},
      {"single_buffer", Script(one, 1 << 16, {{10, 300}})},
      {"small_send_buffer", Script(seven, 4096, {{11, 4100}})},
      {"send_back", Script(four, 1 << 16, {{12, 64}}, send_back + FreeWord(0, 1) + send_back)},
      {"disconnect",
       Script(four, 1 << 16, {{13, 64}},
              std::string(1, char(kPeerDisconnect)) + std::string(1, char(kReceive)))},
  };
}

}  // namespace
SLIPSTREAM_FUZZ_SEEDS(channel, ChannelSeeds);
}  // namespace slipstream::fuzz
