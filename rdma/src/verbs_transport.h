// The verbs backend: one RC queue pair per connection on the first RDMA device, set up by
// exchanging queue-pair numbers, LIDs, GIDs and packet sequence numbers over the authenticated
// TCP setup socket (not rdma_cm's connection manager: one socket does authentication, setup
// and peer-death detection, and the whole path can be unit-tested against a fake VerbsApi).
//
// Differences from the software backends, all forced by the hardware:
//  * Remote keys are the NIC's 32-bit MR keys, not random 64-bit values. Each connection has
//    its own protection domain, so a key of one connection is useless on another, and the HCA
//    (not our code) checks bounds and rights of every incoming access. A WorkRequest whose
//    rkey does not fit 32 bits can never be valid here and is refused by Post
//    (InvalidArgument) instead of reaching the wire.
//  * Fault injection: only completion_delay_us applies. Torn writes and dropped connections
//    (tear_next_write_after, drop_on_next_write) need a software data path; they are
//    ignored here.
//  * The target of a refused access learns it from a notice the initiator sends over the setup
//    socket when it polls the kRemoteAccessError completion (hardware would also raise the
//    IBV_EVENT_QP_ACCESS_ERR async event, which this backend does not read). If the target
//    polls a flushed receive before that notice arrives it reports Disconnected instead of
//    RemoteAccess.
//  * A received SEND longer than its receive buffer (kLocalLengthError) puts the queue pair in
//    the error state, as on every RC implementation.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "slipstream/rdma/status.h"
#include "slipstream/rdma/transport.h"

namespace slipstream::rdma {

// Setup-socket message types of the verbs backend (after authentication the socket is ours).
enum VerbsMessage : uint32_t {
  kVerbsQpInfo = 0x56510001,        // payload: an encoded VerbsQpInfo
  kVerbsReady = 0x56510002,         // this side's queue pair is in RTS
  kVerbsRemoteAccess = 0x56510003,  // the receiver's memory refused one of our accesses
  kVerbsFailed = 0x56510004,        // this side gave up (setup failed or its QP failed); text
};

// What the peer needs to connect its queue pair to ours.
struct VerbsQpInfo {
  uint32_t qp_num = 0;  // 24 bits
  uint32_t psn = 0;     // 24 bits: the first packet sequence number we send
  uint16_t lid = 0;     // 0 on RoCE, where the GID addresses the port
  uint8_t link_layer = IBV_LINK_LAYER_INFINIBAND;
  uint8_t mtu = IBV_MTU_1024;  // the port's active ibv_mtu
  uint8_t gid[16] = {};
};

// Fixed-size little-endian encoding, independent of either host's struct layout.
std::string EncodeQpInfo(const VerbsQpInfo& info);
// Parses and range-checks a peer's VerbsQpInfo; nullopt if malformed.
std::optional<VerbsQpInfo> DecodeQpInfo(std::string_view payload);

// The status a work request gets for a verbs completion status.
WcStatus ToWcStatus(ibv_wc_status status);
// The connection state a completion with `status` leaves (OK for IBV_WC_SUCCESS).
Status ConnectionStateAfter(ibv_wc_status status);

// Builds this side of a verbs connection over the authenticated setup socket `fd` (owned:
// closed on failure, kept for peer-death detection otherwise). Both sides run the same steps.
Status BuildVerbsConnection(const TransportOptions& options, int fd,
                            std::unique_ptr<Connection>* out);

}  // namespace slipstream::rdma
