// Fuzzes the multi-buffer channel (slipstream/rdma/channel.h) as a receiver whose peer is the
// fuzz input. A real Channel runs over PeerScript, an in-process Connection that does what a
// transport does for the peer's one-sided WRITEs (key, bounds and rights checked, bytes placed
// in our registered memory, a refused access ends the connection) but takes every byte the
// peer writes from the input: its setup message, packages in our Receive Buffers, and READY
// and FREE words in our Buffer-Info array, in any order and with any contents.
//
// The channel must never crash, throw or hang, and:
//  * a package it hands out (ReceivePackage) lies inside the Receive Buffer it names, carries
//    the next sequence number, fits its message, and is exactly the header in the buffer;
//  * a message it hands out (Receive) comes from a valid sender slot;
//  * every WRITE it posts (packages, READY and FREE words of its own sends and releases)
//    stays inside the regions the peer's setup message declared, gathers only from its own
//    registered buffers, and it never posts a READ or a WRITE_WITH_IMM.
//
// Input: a config byte (receive_buffers 1..7, 4 or 8 KiB buffers, 1 or 2 sender slots, 1 or 4
// packages in flight), the length (one byte) and bytes of the peer's setup message, then a
// script of steps (see ChannelStep in channel_script.h).
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "channel_script.h"
#include "fake_connection.h"
#include "fuzz_input.h"
#include "slipstream/rdma/channel.h"

namespace {

using namespace slipstream::rdma;
using namespace slipstream::fuzz;

// channel.cc's package header (the first 40 of its 48 bytes) and its Buffer-Info entries.
constexpr uint32_t kPackageMagic = 0x4b504c53;
constexpr uint32_t kHeaderSize = 48;
constexpr size_t kMaxSteps = 256;

// Stops the run with a message: the channel did something it must not.
[[noreturn]] void Fail(const char* what) {
  FuzzFailure("channel", what);
}

// The Connection the channel runs over. Our side's calls behave as on a real transport; the
// peer's side is driven by the fuzz input through PeerWrite and PeerDisconnect.
class PeerScript : public Connection {
 public:
  // `peer_setup` is the peer's setup message, delivered into the channel's setup receive.
  explicit PeerScript(std::string peer_setup) : peer_setup_(std::move(peer_setup)) {
    if (peer_setup_.size() >= 16 + 2 * sizeof(RemoteRegion)) {
      std::memcpy(&declared_[0], peer_setup_.data() + 16, sizeof(RemoteRegion));
      std::memcpy(&declared_[1], peer_setup_.data() + 16 + sizeof(RemoteRegion),
                  sizeof(RemoteRegion));
    }
  }

  // Zeroed heap memory (ASan sees accesses past it), registered under region index i.
  Status AllocateRegion(size_t length, uint32_t access, LocalRegion* region) override {
    if (length == 0) return Status::InvalidArgument("empty region");
    auto memory = std::make_unique<char[]>(length);
    char* addr = memory.get();
    return Add(addr, length, access, std::move(memory), region);
  }
  // The caller's memory under region index i.
  Status RegisterLocal(void* addr, size_t length, LocalRegion* region) override {
    return Add(static_cast<char*>(addr), length, kLocalOnly, nullptr, region);
  }
  // Forgets the region (the peer's later WRITEs to it fail) and frees its memory.
  Status FreeRegion(const LocalRegion& region) override {
    if (region.lkey == 0 || region.lkey > regions_.size()) return Status::InvalidArgument("lkey");
    Region& r = regions_[region.lkey - 1];
    if (!r.live || r.addr != region.addr) return Status::InvalidArgument("not a region");
    r.live = false;
    r.memory.reset();
    return Status::OK();
  }
  // The region's virtual address and key.
  RemoteRegion Describe(const LocalRegion& region) const override {
    const Region& r = regions_[region.lkey - 1];
    return RemoteRegion{r.virtual_addr, r.length, r.rkey};
  }

  // Checks every request the channel posts, then completes it at once (the peer has placed
  // it): WRITEs inside the declared regions, one SEND (the setup message).
  Status Post(const WorkRequest* requests, size_t count) override {
    for (size_t i = 0; i < count; i++) {
      const WorkRequest& wr = requests[i];
      uint64_t length = 0;
      for (uint32_t k = 0; k < wr.num_sge; k++) {
        CheckLocal(wr.sg_list[k]);
        length += wr.sg_list[k].length;
      }
      if (wr.opcode == Opcode::kWrite) {
        CheckDeclared(wr.rkey, wr.remote_addr, length);
      } else if (wr.opcode != Opcode::kSend) {
        Fail("the channel posted something other than WRITE and SEND");
      }
      Completion c;
      c.wr_id = wr.wr_id;
      c.opcode = wr.opcode;
      c.status = failed_ ? WcStatus::kFlushed : WcStatus::kSuccess;
      if (wr.signaled || failed_) completions_.push_back(c);
    }
    return Status::OK();
  }
  // The first receive gets the peer's setup message; later ones wait forever.
  Status PostRecv(const RecvRequest* requests, size_t count) override {
    for (size_t i = 0; i < count; i++) {
      CheckLocal(requests[i].sge);
      Completion c;
      c.wr_id = requests[i].wr_id;
      c.opcode = Opcode::kRecv;
      if (failed_) {
        c.status = WcStatus::kFlushed;
      } else if (setup_delivered_) {
        continue;
      } else if (peer_setup_.size() > requests[i].sge.length) {
        c.status = WcStatus::kLocalLengthError;
      } else {
        std::memcpy(const_cast<void*>(requests[i].sge.addr), peer_setup_.data(),
                    peer_setup_.size());
        c.byte_len = uint32_t(peer_setup_.size());
      }
      setup_delivered_ = true;
      completions_.push_back(c);
    }
    return Status::OK();
  }
  // Never waits: the peer only acts between the channel's calls.
  Status Poll(Completion* out, size_t max, int, size_t* count) override {
    *count = PopCompletions(&completions_, out, max);
    if (*count == 0 && failed_) return state();
    return Status::OK();
  }
  // Disconnected once either side dropped the connection.
  Status state() const override {
    return failed_ ? Status::Disconnected("the peer is gone") : Status::OK();
  }
  // Our side drops the connection (the channel does on a malformed package).
  void Disconnect() override { failed_ = true; }
  // A name for messages.
  std::string backend() const override { return "fuzz"; }
  // Few gather entries, so that the channel's gather lists fill up.
  uint32_t max_sge() const override { return 4; }

  // The peer WRITEs `bytes` at (rkey, addr): placed if a region with remote write rights
  // covers it, else the connection fails as a transport's would (RemoteAccess).
  void PeerWrite(uint64_t rkey, uint64_t addr, std::string_view bytes) {
    if (failed_) return;
    for (Region& r : regions_) {
      if (!r.live || r.rkey != rkey || (r.access & kRemoteWrite) == 0) continue;
      if (addr < r.virtual_addr || addr - r.virtual_addr > r.length ||
          bytes.size() > r.length - (addr - r.virtual_addr)) {
        break;
      }
      std::memcpy(r.addr + (addr - r.virtual_addr), bytes.data(), bytes.size());
      return;
    }
    failed_ = true;
  }
  // The peer drops the connection.
  void PeerDisconnect() { failed_ = true; }

  // The memory of region `index` (the channel's Receive Buffers are region 0, its Buffer-Info
  // array region 1).
  const char* memory(size_t index) const { return regions_.at(index).addr; }

 private:
  struct Region {
    std::unique_ptr<char[]> memory;
    char* addr;
    size_t length;
    uint64_t virtual_addr;
    uint64_t rkey;
    uint32_t access;
    bool live;
  };

  // Registers a region under the next index.
  Status Add(char* addr, size_t length, uint32_t access, std::unique_ptr<char[]> memory,
             LocalRegion* region) {
    const size_t index = regions_.size();
    const uint64_t rkey = access == kLocalOnly ? 0 : kChannelKeyBase + index;
    regions_.push_back(Region{std::move(memory), addr, length, kChannelVirtualBase * (index + 1),
                              rkey, access, true});
    *region = LocalRegion{addr, length, rkey, uint32_t(index + 1), access};
    return Status::OK();
  }

  // The channel may only gather from (or scatter into) its own live regions.
  void CheckLocal(const Sge& sge) const {
    if (sge.lkey == 0 || sge.lkey > regions_.size()) Fail("a work request names an unknown lkey");
    const Region& r = regions_[sge.lkey - 1];
    const char* at = static_cast<const char*>(sge.addr);
    if (!r.live || at < r.addr || size_t(at - r.addr) > r.length ||
        sge.length > r.length - size_t(at - r.addr)) {
      Fail("a work request's buffer is outside its region");
    }
  }

  // A WRITE must stay inside a region the peer declared under that key (offsets taken modulo
  // 2^64, as the channel computes its addresses from the declared ones).
  void CheckDeclared(uint64_t rkey, uint64_t addr, uint64_t length) const {
    for (const RemoteRegion& d : declared_) {
      if (d.rkey != rkey) continue;
      const uint64_t offset = addr - d.addr;
      if (offset <= d.length && length <= d.length - offset) return;
    }
    Fail("the channel wrote outside the regions the peer declared");
  }

  std::string peer_setup_;
  bool setup_delivered_ = false;
  bool failed_ = false;
  RemoteRegion declared_[2];
  std::vector<Region> regions_;
  std::deque<Completion> completions_;
};

// Checks a package the channel handed out against its Receive Buffer.
void CheckPackage(const PackageView& p, const PeerScript& script, const ChannelOptions& options,
                  uint64_t expected_sequence) {
  if (p.buffer >= options.receive_buffers) Fail("a package names a buffer that does not exist");
  const char* buffer = script.memory(0) + size_t(p.buffer) * options.receive_buffer_size;
  if (p.data.data() != buffer + kHeaderSize ||
      p.data.size() > options.receive_buffer_size - kHeaderSize) {
    Fail("a package's bytes are not inside its Receive Buffer");
  }
  if (p.sequence != expected_sequence) Fail("a package is out of sequence");
  if (p.offset > p.message_size || p.data.size() > p.message_size - p.offset) {
    Fail("a package does not fit its message");
  }
  if (p.sender >= 16) Fail("a package from a sender slot that cannot exist");
  char header[40];
  const uint32_t length = uint32_t(p.data.size());
  std::memcpy(header, &kPackageMagic, 4);
  std::memcpy(header + 4, &p.opcode, 4);
  std::memcpy(header + 8, &p.sequence, 8);
  std::memcpy(header + 16, &p.message_size, 8);
  std::memcpy(header + 24, &p.offset, 8);
  std::memcpy(header + 32, &length, 4);
  std::memcpy(header + 36, &p.sender, 4);
  if (std::memcmp(header, buffer, sizeof(header)) != 0) {
    Fail("a package view is not the header in its buffer");
  }
}

}  // namespace

// Opens a receiving channel against the input's setup message, then runs the input's script.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzInput in(data, size);
  const ChannelOptions options = ChannelConfigOptions(in.Byte());
  PeerScript script(std::string(in.Bytes(in.Byte())));
  std::unique_ptr<Channel> channel;
  if (!Channel::Open(&script, options, 1000, &channel).ok()) return 0;

  // Our Buffer-Info array: region 1.
  const RemoteRegion info{kChannelVirtualBase * 2, 16 * 8, kChannelKeyBase + 1};
  uint64_t next_sequence = 1;  // of the packages we take, however we take them
  std::deque<PackageView> held;
  for (size_t steps = 0; !in.empty() && steps < kMaxSteps; steps++) {
    switch (in.Byte() % kSteps) {
      case kPeerWrite: {
        const uint64_t rkey = in.Take(8);
        const uint64_t addr = in.Take(8);
        script.PeerWrite(rkey, addr, in.Bytes(in.Take(2)));
        break;
      }
      case kPeerWriteWord: {
        const uint64_t entry = in.Byte() % 16;
        script.PeerWrite(info.rkey, info.addr + 8 * entry, in.Bytes(8));
        break;
      }
      case kReceive: {
        // Receive takes whole messages only, so the next package number is not known here:
        // what counts is that nothing breaks and the sender slot is possible.
        Message message;
        if (channel->Receive(&message, 0).ok() && message.sender >= 16) {
          Fail("a message from a sender slot that cannot exist");
        }
        next_sequence = 0;
        break;
      }
      case kReceivePackage: {
        PackageView package;
        if (!channel->ReceivePackage(&package, 0).ok()) break;
        if (next_sequence == 0) next_sequence = package.sequence;
        CheckPackage(package, script, options, next_sequence);
        next_sequence++;
        held.push_back(package);
        break;
      }
      case kRelease:
        if (!held.empty()) {
          channel->Release(held.front());
          held.pop_front();
        }
        break;
      case kSend: {
        const uint32_t opcode = in.Byte();
        const std::string payload(in.Byte(), 'm');
        channel->Send(opcode, payload, 0, 0);
        break;
      }
      default:
        script.PeerDisconnect();
        break;
    }
  }
  for (const PackageView& package : held) channel->Release(package);
  channel.reset();
  return 0;
}
