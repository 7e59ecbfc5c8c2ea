// channel_script.h: the script channel_fuzz plays as a channel's peer, as channel_seeds records
// it from a real sending Channel. Both sides take the layout from here, so that a recorded
// peer's WRITEs reach the same regions, and a recorded config the same options, in the fuzzer.
#pragma once

#include <cstdint>

#include "slipstream/rdma/channel.h"

namespace slipstream::fuzz {

// The virtual address of region i (counted from 0) is kChannelVirtualBase * (i + 1), and its
// remote key kChannelKeyBase + i, in channel_fuzz's PeerScript as in channel_seeds' Recorder.
constexpr uint64_t kChannelVirtualBase = 0x10000000;
constexpr uint64_t kChannelKeyBase = 0x5000;

// The steps of the script after the config byte and the peer's setup message.
enum ChannelStep : uint8_t {
  kPeerWrite,       // u64 rkey, u64 address, u16 length, bytes: a WRITE by the peer
  kPeerWriteWord,   // u8 entry, u64 word: the peer writes one of our Buffer-Info words
  kReceive,         // we Receive (copy-out), without waiting
  kReceivePackage,  // we ReceivePackage (zero-copy) and keep the view
  kRelease,         // we Release the oldest view we keep
  kSend,            // u8 opcode, u8 length: we Send that many bytes
  kPeerDisconnect,  // the peer drops the connection
  kSteps
};

// The receiving channel's options a script's config byte stands for: receive_buffers 1..7 (bits
// 0-2), 8 KiB Receive Buffers (bit 3, else 4 KiB), two sender slots (bit 4, else one), four
// packages in flight (bit 5, else one). Every byte stands for valid options.
inline rdma::ChannelOptions ChannelConfigOptions(uint8_t config) {
  rdma::ChannelOptions options;
  options.receive_buffers = (config & 7) % 7 + 1;
  options.receive_buffer_size = (config & 0x08) ? 8192 : 4096;
  options.sender_threads = (config & 0x10) ? 2 : 1;
  options.packages_in_flight = (config & 0x20) ? 4 : 1;
  options.send_buffer_size = 16384;
  return options;
}

// The config byte of a receiver with `buffers` (1..7) Receive Buffers of `size` (4096 or 8192)
// bytes, one sender slot and one package in flight.
inline uint8_t ChannelConfig(uint32_t buffers, uint32_t size) {
  return uint8_t((buffers - 1) | (size == 8192 ? 0x08 : 0));
}

}  // namespace slipstream::fuzz
