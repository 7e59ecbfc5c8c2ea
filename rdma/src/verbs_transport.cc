// The verbs backend (see verbs_transport.h for its design and its honest limits).
//
// Work-request bookkeeping: every posted request gets a slot in its queue's FIFO, and the
// verbs wr_id is the slot's sequence number (bit 63 tells receive slots from send slots). RC
// completes a queue in posting order, so a send completion for sequence s also retires every
// earlier slot that was posted unsignaled. The slots give each completion the caller's wr_id
// and opcode (ibv_wc.opcode is undefined on error completions), bound max_outstanding, and
// let the backend flush what is left when the connection fails, whatever the provider does.
#include "verbs_transport.h"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "backends.h"
#include "setup.h"
#include "verbs_api.h"

namespace slipstream::rdma {

namespace {

// The real table. Each entry is a plain function because several verbs calls are inline
// functions or macros in <infiniband/verbs.h> and have no address of their own.
ibv_device** RealGetDeviceList(int* n) {
  return ibv_get_device_list(n);
}
void RealFreeDeviceList(ibv_device** list) {
  ibv_free_device_list(list);
}
ibv_context* RealOpenDevice(ibv_device* device) {
  return ibv_open_device(device);
}
int RealCloseDevice(ibv_context* context) {
  return ibv_close_device(context);
}
int RealQueryDevice(ibv_context* context, ibv_device_attr* attr) {
  return ibv_query_device(context, attr);
}
int RealQueryPort(ibv_context* context, uint8_t port, ibv_port_attr* attr) {
  return ibv_query_port(context, port, attr);
}
int RealQueryGid(ibv_context* context, uint8_t port, int index, ibv_gid* gid) {
  return ibv_query_gid(context, port, index, gid);
}
ibv_pd* RealAllocPd(ibv_context* context) {
  return ibv_alloc_pd(context);
}
int RealDeallocPd(ibv_pd* pd) {
  return ibv_dealloc_pd(pd);
}
ibv_mr* RealRegMr(ibv_pd* pd, void* addr, size_t length, int access) {
  return ibv_reg_mr(pd, addr, length, access);
}
int RealDeregMr(ibv_mr* mr) {
  return ibv_dereg_mr(mr);
}
ibv_cq* RealCreateCq(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                     int comp_vector) {
  return ibv_create_cq(context, cqe, cq_context, channel, comp_vector);
}
int RealDestroyCq(ibv_cq* cq) {
  return ibv_destroy_cq(cq);
}
ibv_qp* RealCreateQp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  return ibv_create_qp(pd, attr);
}
int RealDestroyQp(ibv_qp* qp) {
  return ibv_destroy_qp(qp);
}
int RealModifyQp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  return ibv_modify_qp(qp, attr, mask);
}
int RealPostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  return ibv_post_send(qp, wr, bad);
}
int RealPostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  return ibv_post_recv(qp, wr, bad);
}
int RealPollCq(ibv_cq* cq, int n, ibv_wc* wc) {
  return ibv_poll_cq(cq, n, wc);
}

const VerbsApi kRealVerbsApi = {
    RealGetDeviceList, RealFreeDeviceList, RealOpenDevice, RealCloseDevice, RealQueryDevice,
    RealQueryPort,     RealQueryGid,       RealAllocPd,    RealDeallocPd,   RealRegMr,
    RealDeregMr,       RealCreateCq,       RealDestroyCq,  RealCreateQp,    RealDestroyQp,
    RealModifyQp,      RealPostSend,       RealPostRecv,   RealPollCq,
};

std::atomic<const VerbsApi*> installed_api{nullptr};

using Clock = std::chrono::steady_clock;

constexpr uint8_t kPort = 1;           // the first port of the first device
constexpr int kGidIndex = 0;           // the port's default GID (RoCE needs one for addressing)
constexpr uint32_t kMaxSge = 16;       // gather entries per work request (clamped to the device)
constexpr uint32_t kMaxRdAtomic = 16;  // outstanding READs per direction (clamped to device)
constexpr uint8_t kAckTimeout = 14;    // 4.096 us * 2^14 = 67 ms per transport retry
constexpr uint8_t kRetryCount = 7;     // ~0.5 s of silence before RETRY_EXC_ERR: peer gone
constexpr uint8_t kRnrRetry = 7;       // 7 = retry forever: a slow receiver is not an error
constexpr uint8_t kMinRnrTimer = 12;   // 0.64 ms between receiver-not-ready retries
constexpr uint32_t kQpInfoMagic = 0x31515653;  // "SVQ1": format version of VerbsQpInfo
constexpr size_t kQpInfoSize = 32;
constexpr uint64_t kRecvSlotBit = 1ull << 63;
constexpr auto kSocketCheckInterval = std::chrono::milliseconds(1);
constexpr int kNoticeReadTimeoutMs = 100;  // a notice's header is here; its text follows at once
constexpr size_t kMaxNoticeText = 256;
constexpr uint64_t kMaxMessageBytes = 1ull << 31;  // the largest RC message

// Appends `value` to `out` as `bytes` little-endian bytes.
void PutLittleEndian(std::string* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; i++) out->push_back(char((value >> (8 * i)) & 0xff));
}

// Reads `bytes` little-endian bytes at `p`.
uint64_t GetLittleEndian(const char* p, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; i++) value |= uint64_t(uint8_t(p[i])) << (8 * i);
  return value;
}

// Short names for the verbs completion statuses that appear in error messages.
const char* WcStatusName(ibv_wc_status status) {
  switch (status) {
    case IBV_WC_SUCCESS:
      return "SUCCESS";
    case IBV_WC_LOC_LEN_ERR:
      return "LOC_LEN_ERR";
    case IBV_WC_LOC_QP_OP_ERR:
      return "LOC_QP_OP_ERR";
    case IBV_WC_LOC_PROT_ERR:
      return "LOC_PROT_ERR";
    case IBV_WC_WR_FLUSH_ERR:
      return "WR_FLUSH_ERR";
    case IBV_WC_REM_INV_REQ_ERR:
      return "REM_INV_REQ_ERR";
    case IBV_WC_REM_ACCESS_ERR:
      return "REM_ACCESS_ERR";
    case IBV_WC_REM_OP_ERR:
      return "REM_OP_ERR";
    case IBV_WC_RETRY_EXC_ERR:
      return "RETRY_EXC_ERR";
    case IBV_WC_RNR_RETRY_EXC_ERR:
      return "RNR_RETRY_EXC_ERR";
    case IBV_WC_FATAL_ERR:
      return "FATAL_ERR";
    case IBV_WC_GENERAL_ERR:
      return "GENERAL_ERR";
    default:
      return "error";
  }
}

// The Status for a verbs call that returned the errno value `err`.
Status ErrnoStatus(const std::string& what, int err) {
  std::string message = "verbs: " + what + ": " + std::strerror(err);
  if (err == ENOMEM || err == EAGAIN) return Status::WouldBlock(message);
  if (err == EINVAL) return Status::InvalidArgument(message);
  return Status::IOError(message);
}

// Milliseconds left until `deadline`, never negative.
int MillisecondsLeft(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return int(std::max<int64_t>(0, left.count()));
}

class VerbsConnection : public Connection, public FaultInjectable {
 public:
  VerbsConnection(const VerbsApi& api, const TransportOptions& options, int fd)
      : api_(api), options_(options), fd_(fd) {}
  ~VerbsConnection() override;

  // Opens the device, builds PD, CQ and QP, and connects the QP with the peer's over fd_.
  Status Setup();

  Status AllocateRegion(size_t length, uint32_t access, LocalRegion* region) override;
  Status RegisterLocal(void* addr, size_t length, LocalRegion* region) override;
  Status FreeRegion(const LocalRegion& region) override;
  RemoteRegion Describe(const LocalRegion& region) const override;
  Status Post(const WorkRequest* requests, size_t count) override;
  Status PostRecv(const RecvRequest* requests, size_t count) override;
  Status Poll(Completion* out, size_t max, int timeout_ms, size_t* count) override;
  Status state() const override;
  void Disconnect() override;
  FaultInjection* faults() override { return &faults_; }
  std::string backend() const override { return "verbs"; }
  uint32_t max_sge() const override { return max_sge_; }

 private:
  struct Region {
    char* addr;
    size_t length;
    ibv_mr* mr;
    bool owned = true;  // false: the caller's memory (RegisterLocal)
  };
  // A posted request waiting for its completion.
  struct Slot {
    uint64_t wr_id;
    Opcode opcode;
    bool report_success;  // the caller asked for a completion (unsignaled: only on error)
  };
  struct ReadyCompletion {
    Completion completion;
    Clock::time_point ready_at;  // completion_delay_us holds it back until then
  };

  // Moves the QP through INIT, RTR and RTS using the peer's info from the setup socket.
  Status ConnectQueuePair(const ibv_device_attr& device, const VerbsQpInfo& mine,
                          Clock::time_point deadline);
  // True if [addr, addr+length) lies inside this connection's region with `lkey`.
  bool IsLocalRange(const void* addr, uint64_t length, uint32_t lkey) const;
  // Checks one work request against this connection's regions and limits.
  Status ValidateRequest(const WorkRequest& request) const;
  // Reads a notice or end-of-file from the setup socket (at most every kSocketCheckInterval
  // unless `force`), which is how the death or failure of the peer is noticed.
  void CheckSetupSocket(bool force) const;
  // Ends the connection with `reason` (the first error wins), stops the QP so the hardware
  // flushes, and tells the peer with `notice` (0: no notice) before closing our write side.
  void EnterError(const Status& reason, uint32_t notice) const;
  // Takes what the CQ holds and turns it into caller completions.
  void DrainCompletionQueue();
  void OnSendCompletion(uint64_t sequence, const ibv_wc& wc);
  void OnRecvCompletion(uint64_t sequence, const ibv_wc& wc);
  // Applies the connection-level effect of a failed completion.
  void OnFailedCompletion(ibv_wc_status status);
  // Completes every request still outstanding with kFlushed (connection in error state).
  void FlushOutstanding();
  void Deliver(const Completion& completion);

  const VerbsApi& api_;
  const TransportOptions options_;
  const int fd_;
  ibv_context* context_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  uint32_t max_sge_ = 1;
  uint32_t send_depth_ = 1;
  uint32_t recv_depth_ = 1;
  uint32_t signal_interval_ = 1;  // signal at least every this many requests (see Post)

  mutable std::mutex mu_;  // everything below
  mutable Status state_;
  mutable Clock::time_point next_socket_check_{};
  std::unordered_map<uint32_t, Region> regions_;  // by lkey
  size_t region_bytes_ = 0;
  std::deque<Slot> send_slots_;
  uint64_t send_front_ = 0;  // sequence number of send_slots_.front()
  std::deque<Slot> recv_slots_;
  uint64_t recv_front_ = 0;
  uint32_t unsignaled_run_ = 0;
  std::deque<ReadyCompletion> ready_;
  FaultInjection faults_;
  // Scratch space reused by every Post/PostRecv so posting does not allocate.
  std::vector<ibv_send_wr> send_wrs_;
  std::vector<ibv_sge> sges_;
  std::vector<ibv_recv_wr> recv_wrs_;
  std::vector<ibv_sge> recv_sges_;
};

// Releases in the order that keeps every object's dependencies alive: the QP first (no remote
// access can land afterwards), then the CQ it used, the MRs and their memory, the PD they
// lived in, and the device.
VerbsConnection::~VerbsConnection() {
  if (qp_) api_.destroy_qp(qp_);
  if (cq_) api_.destroy_cq(cq_);
  for (auto& [lkey, region] : regions_) {
    api_.dereg_mr(region.mr);
    if (region.owned) std::free(region.addr);
  }
  if (pd_) api_.dealloc_pd(pd_);
  if (context_) api_.close_device(context_);
  if (fd_ >= 0) ::close(fd_);
}

// The first device's first port; an absent or unusable device is kUnavailable.
Status VerbsConnection::Setup() {
  Clock::time_point deadline =
      Clock::now() + std::chrono::milliseconds(std::max(0, options_.connect_timeout_ms));
  int num_devices = 0;
  ibv_device** devices = api_.get_device_list(&num_devices);
  if (devices == nullptr || num_devices <= 0 || devices[0] == nullptr) {
    if (devices) api_.free_device_list(devices);
    return Status::Unavailable("verbs: no RDMA device (ibv_get_device_list found none)");
  }
  std::string name = devices[0]->name;
  context_ = api_.open_device(devices[0]);
  int open_errno = errno;
  // Freeing the list is allowed once the device we use is open.
  api_.free_device_list(devices);
  if (context_ == nullptr) {
    return Status::Unavailable("verbs: cannot open device " + name + ": " +
                               std::strerror(open_errno));
  }
  ibv_device_attr device{};
  if (int rc = api_.query_device(context_, &device); rc != 0) {
    return Status::Unavailable("verbs: cannot query device " + name + ": " + std::strerror(rc));
  }
  ibv_port_attr port{};
  if (int rc = api_.query_port(context_, kPort, &port); rc != 0) {
    return Status::Unavailable("verbs: cannot query port 1 of " + name + ": " + std::strerror(rc));
  }
  if (port.state != IBV_PORT_ACTIVE) {
    return Status::Unavailable("verbs: port 1 of " + name + " is not active");
  }
  VerbsQpInfo mine;
  mine.lid = port.lid;
  mine.link_layer = port.link_layer == IBV_LINK_LAYER_ETHERNET ? IBV_LINK_LAYER_ETHERNET
                                                               : IBV_LINK_LAYER_INFINIBAND;
  mine.mtu = uint8_t(port.active_mtu);
  ibv_gid gid{};
  if (api_.query_gid(context_, kPort, kGidIndex, &gid) != 0) {
    // InfiniBand routes by LID and can do without; RoCE cannot address the port at all.
    if (mine.link_layer == IBV_LINK_LAYER_ETHERNET) {
      return Status::Unavailable("verbs: no GID on port 1 of " + name);
    }
    std::memset(&gid, 0, sizeof(gid));
  }
  std::memcpy(mine.gid, gid.raw, sizeof(mine.gid));

  pd_ = api_.alloc_pd(context_);
  if (pd_ == nullptr) return ErrnoStatus("ibv_alloc_pd on " + name, errno);
  // Our own accounting keeps at most max_outstanding requests per queue, so neither queue nor
  // the CQ (one entry per outstanding request at most) can overflow.
  uint32_t device_max_wr = uint32_t(std::max(1, device.max_qp_wr));
  send_depth_ = std::clamp<uint32_t>(options_.max_outstanding, 1, device_max_wr);
  recv_depth_ = send_depth_;
  signal_interval_ = std::max<uint32_t>(1, send_depth_ / 2);
  max_sge_ = std::clamp<uint32_t>(uint32_t(std::max(1, device.max_sge)), 1, kMaxSge);
  int cq_entries = int(std::min<uint64_t>(uint64_t(send_depth_) + recv_depth_,
                                          uint64_t(std::max(1, device.max_cqe))));
  cq_ = api_.create_cq(context_, cq_entries, nullptr, nullptr, 0);
  if (cq_ == nullptr) return ErrnoStatus("ibv_create_cq on " + name, errno);
  ibv_qp_init_attr init{};
  init.send_cq = cq_;
  init.recv_cq = cq_;
  init.qp_type = IBV_QPT_RC;
  init.sq_sig_all = 0;  // signalling is chosen per request
  init.cap.max_send_wr = send_depth_;
  init.cap.max_recv_wr = recv_depth_;
  init.cap.max_send_sge = max_sge_;
  init.cap.max_recv_sge = 1;
  qp_ = api_.create_qp(pd_, &init);
  if (qp_ == nullptr) return ErrnoStatus("ibv_create_qp on " + name, errno);
  mine.qp_num = qp_->qp_num;
  mine.psn = uint32_t(RandomKey() & 0xffffff);
  return ConnectQueuePair(device, mine, deadline);
}

// INIT, then the exchange of QP info, RTR (the receive side knows its peer), RTS (we may
// send), and a READY exchange so that neither side sends before the other can receive.
Status VerbsConnection::ConnectQueuePair(const ibv_device_attr& device, const VerbsQpInfo& mine,
                                         Clock::time_point deadline) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.pkey_index = 0;
  attr.port_num = kPort;
  // The QP admits every remote operation; each MR then grants only the rights asked for.
  attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  int rc = api_.modify_qp(qp_, &attr,
                          IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  if (rc != 0) return ErrnoStatus("moving the queue pair to INIT", rc);

  Status s = SendSetupMessage(fd_, kVerbsQpInfo, EncodeQpInfo(mine));
  if (!s.ok()) return s;
  uint32_t type = 0;
  std::string payload;
  s = RecvSetupMessage(fd_, MillisecondsLeft(deadline), &type, &payload);
  if (!s.ok()) return s;
  if (type == kVerbsFailed) {
    return Status::Unavailable("verbs: the peer could not set up: " + payload);
  }
  std::optional<VerbsQpInfo> peer = type == kVerbsQpInfo ? DecodeQpInfo(payload) : std::nullopt;
  if (!peer) return Status::InvalidArgument("verbs: malformed queue-pair info from the peer");
  if (peer->link_layer != mine.link_layer) {
    return Status::Unavailable("verbs: the peer's port is on another link layer");
  }

  attr = ibv_qp_attr{};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = ibv_mtu(std::min(mine.mtu, peer->mtu));
  attr.dest_qp_num = peer->qp_num;
  attr.rq_psn = peer->psn;
  attr.max_dest_rd_atomic = uint8_t(std::clamp<int>(device.max_qp_rd_atom, 1, int(kMaxRdAtomic)));
  attr.min_rnr_timer = kMinRnrTimer;
  attr.ah_attr.dlid = peer->lid;
  attr.ah_attr.sl = 0;
  attr.ah_attr.src_path_bits = 0;
  attr.ah_attr.port_num = kPort;
  if (mine.link_layer == IBV_LINK_LAYER_ETHERNET) {
    // RoCE has no LIDs: packets carry a GRH addressed by GID.
    attr.ah_attr.is_global = 1;
    std::memcpy(attr.ah_attr.grh.dgid.raw, peer->gid, sizeof(peer->gid));
    attr.ah_attr.grh.sgid_index = kGidIndex;
    attr.ah_attr.grh.hop_limit = 64;
  }
  rc = api_.modify_qp(qp_, &attr,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (rc != 0) return ErrnoStatus("moving the queue pair to RTR", rc);

  attr = ibv_qp_attr{};
  attr.qp_state = IBV_QPS_RTS;
  attr.timeout = kAckTimeout;
  attr.retry_cnt = kRetryCount;
  attr.rnr_retry = kRnrRetry;
  attr.sq_psn = mine.psn;
  attr.max_rd_atomic = uint8_t(std::clamp<int>(device.max_qp_init_rd_atom, 1, int(kMaxRdAtomic)));
  rc = api_.modify_qp(qp_, &attr,
                      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                          IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
  if (rc != 0) return ErrnoStatus("moving the queue pair to RTS", rc);

  s = SendSetupMessage(fd_, kVerbsReady, {});
  if (!s.ok()) return s;
  s = RecvSetupMessage(fd_, MillisecondsLeft(deadline), &type, &payload);
  if (!s.ok()) return s;
  if (type == kVerbsFailed) {
    return Status::Unavailable("verbs: the peer could not set up: " + payload);
  }
  if (type != kVerbsReady) return Status::InvalidArgument("verbs: unexpected setup message");
  return Status::OK();
}

// Zeroed, page-aligned memory registered with exactly the rights asked for. The NIC picks the
// keys; a local-only region gets rkey 0 as the contract says, though its MR has a key too.
Status VerbsConnection::AllocateRegion(size_t length, uint32_t access, LocalRegion* region) {
  if (region == nullptr || length == 0) {
    return Status::InvalidArgument("AllocateRegion needs a non-empty region");
  }
  if ((access & ~uint32_t(kRemoteWrite | kRemoteRead)) != 0) {
    return Status::InvalidArgument("AllocateRegion: unknown access bits");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (length > options_.region_capacity - std::min(region_bytes_, options_.region_capacity)) {
    return Status::WouldBlock("verbs: the connection's region capacity is used up");
  }
  void* memory = nullptr;
  if (posix_memalign(&memory, 4096, length) != 0) {
    return Status::WouldBlock("verbs: out of memory for a region");
  }
  std::memset(memory, 0, length);
  int flags = IBV_ACCESS_LOCAL_WRITE;
  if (access & kRemoteWrite) flags |= IBV_ACCESS_REMOTE_WRITE;
  if (access & kRemoteRead) flags |= IBV_ACCESS_REMOTE_READ;
  ibv_mr* mr = api_.reg_mr(pd_, memory, length, flags);
  if (mr == nullptr) {
    int err = errno;
    std::free(memory);
    return ErrnoStatus("ibv_reg_mr", err);
  }
  regions_[mr->lkey] = Region{static_cast<char*>(memory), length, mr};
  region_bytes_ += length;
  *region = LocalRegion{static_cast<char*>(memory), length, access != kLocalOnly ? mr->rkey : 0u,
                        mr->lkey, access};
  return Status::OK();
}

// The NIC gathers from the caller's memory through a local-only memory registration.
Status VerbsConnection::RegisterLocal(void* addr, size_t length, LocalRegion* region) {
  if (region == nullptr || addr == nullptr || length == 0) {
    return Status::InvalidArgument("RegisterLocal needs non-empty memory");
  }
  std::lock_guard<std::mutex> lock(mu_);
  ibv_mr* mr = api_.reg_mr(pd_, addr, length, IBV_ACCESS_LOCAL_WRITE);
  if (mr == nullptr) return ErrnoStatus("ibv_reg_mr", errno);
  regions_[mr->lkey] = Region{static_cast<char*>(addr), length, mr, false};
  *region = LocalRegion{static_cast<char*>(addr), length, 0, mr->lkey, kLocalOnly};
  return Status::OK();
}

// Deregistration makes the HCA refuse the peer's later accesses before the memory is freed.
Status VerbsConnection::FreeRegion(const LocalRegion& region) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = regions_.find(region.lkey);
  if (it == regions_.end() || it->second.addr != region.addr) {
    return Status::InvalidArgument("FreeRegion: not a region of this connection");
  }
  if (int rc = api_.dereg_mr(it->second.mr); rc != 0) return ErrnoStatus("ibv_dereg_mr", rc);
  if (it->second.owned) {
    std::free(it->second.addr);
    region_bytes_ -= it->second.length;
  }
  regions_.erase(it);
  return Status::OK();
}

// Verbs MRs are registered at their virtual address, so the address is the local one.
RemoteRegion VerbsConnection::Describe(const LocalRegion& region) const {
  return RemoteRegion{reinterpret_cast<uintptr_t>(region.addr), region.length, region.rkey};
}

// Overflow-safe containment check against the region with `lkey`.
bool VerbsConnection::IsLocalRange(const void* addr, uint64_t length, uint32_t lkey) const {
  auto it = regions_.find(lkey);
  if (it == regions_.end()) return false;
  uintptr_t start = reinterpret_cast<uintptr_t>(it->second.addr);
  uintptr_t p = reinterpret_cast<uintptr_t>(addr);
  return p >= start && p - start <= it->second.length && length <= it->second.length - (p - start);
}

// Everything the HCA would otherwise reject locally (or worse, accept) is caught here, before
// anything is posted.
Status VerbsConnection::ValidateRequest(const WorkRequest& request) const {
  if (request.opcode == Opcode::kRecv) return Status::InvalidArgument("Post: kRecv is PostRecv's");
  if (uint8_t(request.opcode) > uint8_t(Opcode::kSend)) {
    return Status::InvalidArgument("Post: unknown opcode");
  }
  if (request.repeat != 1) {
    return Status::InvalidArgument("Post: verbs has no strided gather (max_repeat is 1)");
  }
  if (request.num_sge > max_sge_) {
    return Status::InvalidArgument("Post: more gather entries than the queue pair allows (" +
                                   std::to_string(max_sge_) + ")");
  }
  if (request.num_sge > 0 && request.sg_list == nullptr) {
    return Status::InvalidArgument("Post: num_sge without sg_list");
  }
  uint64_t total = 0;
  for (uint32_t i = 0; i < request.num_sge; i++) {
    const Sge& sge = request.sg_list[i];
    if (!IsLocalRange(sge.addr, sge.length, sge.lkey)) {
      return Status::InvalidArgument("Post: an Sge is not inside a region of this connection");
    }
    total += sge.length;
  }
  if (total > kMaxMessageBytes) return Status::InvalidArgument("Post: message longer than 2 GiB");
  if (request.opcode != Opcode::kSend && request.rkey > UINT32_MAX) {
    return Status::InvalidArgument("Post: verbs remote keys are 32-bit; this rkey cannot exist");
  }
  return Status::OK();
}

// One chained ibv_send_wr list, one ibv_post_send call: one doorbell for the whole batch.
Status VerbsConnection::Post(const WorkRequest* requests, size_t count) {
  if (count == 0) return Status::OK();
  if (requests == nullptr) return Status::InvalidArgument("Post: no requests");
  std::lock_guard<std::mutex> lock(mu_);
  size_t total_sges = 0;
  for (size_t i = 0; i < count; i++) {
    Status s = ValidateRequest(requests[i]);
    if (!s.ok()) return s;
    total_sges += requests[i].num_sge;
  }
  if (send_slots_.size() + count > send_depth_) {
    return Status::WouldBlock("Post: max_outstanding requests are in flight");
  }
  uint64_t first_sequence = send_front_ + send_slots_.size();
  if (!state_.ok()) {
    // A failed connection completes later requests with kFlushed (see Poll), as RC would.
    for (size_t i = 0; i < count; i++) {
      send_slots_.push_back(Slot{requests[i].wr_id, requests[i].opcode, true});
    }
    return Status::OK();
  }
  send_wrs_.assign(count, ibv_send_wr{});
  sges_.resize(std::max<size_t>(1, total_sges));
  size_t next_sge = 0;
  uint32_t run = unsignaled_run_;
  for (size_t i = 0; i < count; i++) {
    const WorkRequest& request = requests[i];
    ibv_send_wr& wr = send_wrs_[i];
    wr.wr_id = first_sequence + i;
    wr.next = i + 1 < count ? &send_wrs_[i + 1] : nullptr;
    wr.sg_list = request.num_sge > 0 ? &sges_[next_sge] : nullptr;
    wr.num_sge = int(request.num_sge);
    for (uint32_t j = 0; j < request.num_sge; j++) {
      const Sge& sge = request.sg_list[j];
      sges_[next_sge++] = ibv_sge{reinterpret_cast<uintptr_t>(sge.addr), sge.length, sge.lkey};
    }
    switch (request.opcode) {
      case Opcode::kWrite:
        wr.opcode = IBV_WR_RDMA_WRITE;
        break;
      case Opcode::kWriteWithImm:
        wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
        wr.imm_data = htonl(request.imm);  // immediate data travels in network byte order
        break;
      case Opcode::kRead:
        wr.opcode = IBV_WR_RDMA_READ;
        break;
      default:
        wr.opcode = IBV_WR_SEND;
        break;
    }
    if (request.opcode != Opcode::kSend) {
      wr.wr.rdma.remote_addr = request.remote_addr;
      wr.wr.rdma.rkey = uint32_t(request.rkey);
    }
    // Unsignaled requests leave the send queue only when a later signaled one completes, so
    // a long unsignaled stream (the channel's FREE writes) is signaled every signal_interval_
    // requests; the caller never sees those internal successes.
    bool signal = request.signaled || ++run >= signal_interval_;
    if (signal) run = 0;
    wr.send_flags = (signal ? unsigned(IBV_SEND_SIGNALED) : 0u) |
                    (request.fence ? unsigned(IBV_SEND_FENCE) : 0u);
    send_slots_.push_back(Slot{request.wr_id, request.opcode, request.signaled});
  }
  ibv_send_wr* bad = nullptr;
  int rc = api_.post_send(qp_, send_wrs_.data(), &bad);
  if (rc == 0) {
    unsignaled_run_ = run;
    return Status::OK();
  }
  // Requests before bad_wr were posted and keep their slots; the rest never left.
  size_t posted = 0;
  if (bad >= send_wrs_.data() && bad < send_wrs_.data() + count) posted = bad - send_wrs_.data();
  send_slots_.resize(send_slots_.size() - (count - posted));
  unsignaled_run_ = signal_interval_ - 1;  // conservatively signal the next request
  std::string what = "ibv_post_send";
  if (posted > 0) what += " (the first " + std::to_string(posted) + " requests were posted)";
  return ErrnoStatus(what, rc);
}

// Receives complete in posting order too; each takes one Sge of a registered region.
Status VerbsConnection::PostRecv(const RecvRequest* requests, size_t count) {
  if (count == 0) return Status::OK();
  if (requests == nullptr) return Status::InvalidArgument("PostRecv: no requests");
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < count; i++) {
    const Sge& sge = requests[i].sge;
    bool empty = sge.addr == nullptr && sge.length == 0;
    if (!empty && !IsLocalRange(sge.addr, sge.length, sge.lkey)) {
      return Status::InvalidArgument("PostRecv: the Sge is not inside a region of this connection");
    }
  }
  if (recv_slots_.size() + count > recv_depth_) {
    return Status::WouldBlock("PostRecv: max_outstanding receives are posted");
  }
  uint64_t first_sequence = recv_front_ + recv_slots_.size();
  for (size_t i = 0; i < count; i++) {
    recv_slots_.push_back(Slot{requests[i].wr_id, Opcode::kRecv, true});
  }
  if (!state_.ok()) return Status::OK();  // flushed by Poll
  recv_wrs_.assign(count, ibv_recv_wr{});
  recv_sges_.resize(count);
  for (size_t i = 0; i < count; i++) {
    const Sge& sge = requests[i].sge;
    recv_sges_[i] = ibv_sge{reinterpret_cast<uintptr_t>(sge.addr), sge.length, sge.lkey};
    recv_wrs_[i].wr_id = kRecvSlotBit | (first_sequence + i);
    recv_wrs_[i].next = i + 1 < count ? &recv_wrs_[i + 1] : nullptr;
    bool empty = sge.addr == nullptr && sge.length == 0;
    recv_wrs_[i].sg_list = empty ? nullptr : &recv_sges_[i];
    recv_wrs_[i].num_sge = empty ? 0 : 1;
  }
  ibv_recv_wr* bad = nullptr;
  int rc = api_.post_recv(qp_, recv_wrs_.data(), &bad);
  if (rc == 0) return Status::OK();
  size_t posted = 0;
  if (bad >= recv_wrs_.data() && bad < recv_wrs_.data() + count) posted = bad - recv_wrs_.data();
  recv_slots_.resize(recv_slots_.size() - (count - posted));
  std::string what = "ibv_post_recv";
  if (posted > 0) what += " (the first " + std::to_string(posted) + " receives were posted)";
  return ErrnoStatus(what, rc);
}

// A notice's header is peeked first so that reading never waits on a peer that sent nothing.
void VerbsConnection::CheckSetupSocket(bool force) const {
  if (!state_.ok() || fd_ < 0) return;
  Clock::time_point now = Clock::now();
  if (!force && now < next_socket_check_) return;
  next_socket_check_ = now + kSocketCheckInterval;
  pollfd p{fd_, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return;
  char header[8];
  ssize_t got = ::recv(fd_, header, sizeof(header), MSG_PEEK | MSG_DONTWAIT);
  if (got == 0) {
    EnterError(Status::Disconnected("verbs: the peer closed the connection"), 0);
    return;
  }
  if (got < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
    EnterError(Status::Disconnected(std::string("verbs: setup socket: ") + std::strerror(errno)),
               0);
    return;
  }
  if (size_t(got) < sizeof(header)) return;  // the rest of the header is on its way
  uint32_t type = 0;
  std::string text;
  Status s = RecvSetupMessage(fd_, kNoticeReadTimeoutMs, &type, &text);
  if (!s.ok()) {
    EnterError(Status::Disconnected("verbs: setup socket: " + s.message()), 0);
  } else if (type == kVerbsRemoteAccess) {
    EnterError(Status::RemoteAccess("verbs: the peer's access to this side was refused: " + text),
               0);
  } else if (type == kVerbsFailed) {
    EnterError(Status::Disconnected("verbs: the peer's queue pair failed: " + text), 0);
  } else {
    EnterError(Status::Disconnected("verbs: unexpected message on the setup socket"), 0);
  }
}

// Mutable state because state() (const) may discover the failure.
void VerbsConnection::EnterError(const Status& reason, uint32_t notice) const {
  if (!state_.ok()) return;
  state_ = reason;
  if (qp_) {
    // The error state makes the HCA stop the QP and flush what it still holds.
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    api_.modify_qp(qp_, &attr, IBV_QP_STATE);
  }
  if (fd_ < 0) return;
  if (notice != 0) {
    std::string text = reason.message().substr(0, kMaxNoticeText);
    SendSetupMessage(fd_, notice, text);  // best effort: the peer may be gone already
  }
  ::shutdown(fd_, SHUT_WR);  // a peer that missed the notice still sees end-of-file
}

// Queues a completion for the caller, held back by completion_delay_us if set.
void VerbsConnection::Deliver(const Completion& completion) {
  Clock::time_point ready_at =
      Clock::now() + std::chrono::microseconds(faults_.completion_delay_us);
  ready_.push_back(ReadyCompletion{completion, ready_at});
}

// Looks the slot up by sequence; completions for slots already flushed are stale and dropped.
void VerbsConnection::OnSendCompletion(uint64_t sequence, const ibv_wc& wc) {
  if (sequence < send_front_ || sequence - send_front_ >= send_slots_.size()) return;
  // Earlier slots without their own completion were unsignaled and have succeeded.
  while (send_front_ < sequence) {
    send_slots_.pop_front();
    send_front_++;
  }
  Slot slot = send_slots_.front();
  send_slots_.pop_front();
  send_front_++;
  WcStatus status = ToWcStatus(wc.status);
  if (wc.status != IBV_WC_SUCCESS) OnFailedCompletion(wc.status);
  if (status != WcStatus::kSuccess || slot.report_success) {
    Completion c;
    c.wr_id = slot.wr_id;
    c.opcode = slot.opcode;
    c.status = status;
    Deliver(c);
  }
}

// A receive completion carries the received length and, for WRITE with immediate, the value.
void VerbsConnection::OnRecvCompletion(uint64_t sequence, const ibv_wc& wc) {
  if (sequence < recv_front_ || sequence - recv_front_ >= recv_slots_.size()) return;
  if (wc.status != IBV_WC_SUCCESS) OnFailedCompletion(wc.status);
  while (recv_front_ <= sequence) {
    Slot slot = recv_slots_.front();
    recv_slots_.pop_front();
    Completion c;
    c.wr_id = slot.wr_id;
    c.opcode = Opcode::kRecv;
    if (recv_front_ == sequence) {
      c.status = ToWcStatus(wc.status);
      if (wc.status == IBV_WC_SUCCESS) c.byte_len = wc.byte_len;  // undefined on errors
      if (wc.status == IBV_WC_SUCCESS && (wc.wc_flags & IBV_WC_WITH_IMM)) {
        c.imm = ntohl(wc.imm_data);
        c.has_imm = true;
      }
    } else {
      c.status = WcStatus::kFlushed;  // receives complete in order; a skipped one is lost
    }
    recv_front_++;
    Deliver(c);
  }
}

// A flush alone does not say why; the peer's notice (already on the socket, usually) does.
void VerbsConnection::OnFailedCompletion(ibv_wc_status status) {
  if (!state_.ok()) return;
  if (status == IBV_WC_WR_FLUSH_ERR) {
    CheckSetupSocket(/*force=*/true);
    if (state_.ok()) EnterError(ConnectionStateAfter(status), kVerbsFailed);
    return;
  }
  uint32_t notice = status == IBV_WC_REM_ACCESS_ERR ? kVerbsRemoteAccess : kVerbsFailed;
  EnterError(ConnectionStateAfter(status), notice);
}

// Empties the CQ (in batches of 32) into caller completions; bit 63 picks the queue.
void VerbsConnection::DrainCompletionQueue() {
  ibv_wc wcs[32];
  while (true) {
    int n = api_.poll_cq(cq_, 32, wcs);
    if (n < 0) {
      EnterError(Status::IOError("verbs: ibv_poll_cq failed"), kVerbsFailed);
      return;
    }
    for (int i = 0; i < n; i++) {
      if (wcs[i].wr_id & kRecvSlotBit) {
        OnRecvCompletion(wcs[i].wr_id & ~kRecvSlotBit, wcs[i]);
      } else {
        OnSendCompletion(wcs[i].wr_id, wcs[i]);
      }
    }
    if (n < 32) return;
  }
}

// Later hardware completions for these slots are stale and dropped (see OnSendCompletion).
void VerbsConnection::FlushOutstanding() {
  for (std::deque<Slot>* slots : {&send_slots_, &recv_slots_}) {
    for (const Slot& slot : *slots) {
      Completion c;
      c.wr_id = slot.wr_id;
      c.opcode = slot.opcode;
      c.status = WcStatus::kFlushed;
      Deliver(c);
    }
  }
  send_front_ += send_slots_.size();
  recv_front_ += recv_slots_.size();
  send_slots_.clear();
  recv_slots_.clear();
}

// Busy-polls with a short back-off; never waits past the timeout and returns the connection's
// error once a failed connection has nothing left to complete.
Status VerbsConnection::Poll(Completion* out, size_t max, int timeout_ms, size_t* count) {
  if (count == nullptr || (out == nullptr && max > 0)) {
    return Status::InvalidArgument("Poll: no output");
  }
  *count = 0;
  Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(std::max(0, timeout_ms));
  for (int round = 0;; round++) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      CheckSetupSocket(/*force=*/round == 0);
      if (cq_) DrainCompletionQueue();
      if (!state_.ok()) FlushOutstanding();
      Clock::time_point now = Clock::now();
      while (*count < max && !ready_.empty() && ready_.front().ready_at <= now) {
        out[(*count)++] = ready_.front().completion;
        ready_.pop_front();
      }
      if (*count > 0 || max == 0) return Status::OK();
      if (!state_.ok() && ready_.empty()) return state_;
    }
    Clock::time_point now = Clock::now();
    if (now >= deadline) return Status::OK();
    if (round < 64) {
      std::this_thread::yield();
    } else {
      auto nap = std::min<Clock::duration>(std::chrono::microseconds(50), deadline - now);
      std::this_thread::sleep_for(nap);
    }
  }
}

// Looks at the setup socket too, so a dead peer shows even without polling.
Status VerbsConnection::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  CheckSetupSocket(/*force=*/false);
  return state_;
}

// The QP stops (pending requests flush) and the peer sees the setup socket close.
void VerbsConnection::Disconnect() {
  std::lock_guard<std::mutex> lock(mu_);
  EnterError(Status::Disconnected("verbs: disconnected by this side"), 0);
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

}  // namespace

// The wrappers above, in VerbsApi's field order.
const VerbsApi& RealVerbsApi() {
  return kRealVerbsApi;
}

// A test's table if one is installed, else the real one.
const VerbsApi& CurrentVerbsApi() {
  const VerbsApi* api = installed_api.load(std::memory_order_acquire);
  return api ? *api : kRealVerbsApi;
}

// Release/acquire so a connection built on another thread sees the whole table.
void SetVerbsApiForTesting(const VerbsApi* api) {
  installed_api.store(api, std::memory_order_release);
}

// Magic, QPN, PSN, LID, link layer, MTU, GID: 32 bytes.
std::string EncodeQpInfo(const VerbsQpInfo& info) {
  std::string out;
  PutLittleEndian(&out, kQpInfoMagic, 4);
  PutLittleEndian(&out, info.qp_num, 4);
  PutLittleEndian(&out, info.psn, 4);
  PutLittleEndian(&out, info.lid, 2);
  PutLittleEndian(&out, info.link_layer, 1);
  PutLittleEndian(&out, info.mtu, 1);
  out.append(reinterpret_cast<const char*>(info.gid), sizeof(info.gid));
  return out;
}

// The peer's values go straight into modify_qp, so each is range-checked.
std::optional<VerbsQpInfo> DecodeQpInfo(std::string_view payload) {
  if (payload.size() != kQpInfoSize) return std::nullopt;
  const char* p = payload.data();
  if (GetLittleEndian(p, 4) != kQpInfoMagic) return std::nullopt;
  VerbsQpInfo info;
  uint64_t qp_num = GetLittleEndian(p + 4, 4);
  uint64_t psn = GetLittleEndian(p + 8, 4);
  info.lid = uint16_t(GetLittleEndian(p + 12, 2));
  uint64_t link_layer = GetLittleEndian(p + 14, 1);
  uint64_t mtu = GetLittleEndian(p + 15, 1);
  // QPs 0 and 1 are the subnet-management and general-services QPs, never an RC peer.
  if (qp_num < 2 || qp_num > 0xffffff || psn > 0xffffff) return std::nullopt;
  if (link_layer > IBV_LINK_LAYER_ETHERNET) return std::nullopt;
  if (mtu < IBV_MTU_256 || mtu > IBV_MTU_4096) return std::nullopt;
  info.qp_num = uint32_t(qp_num);
  info.psn = uint32_t(psn);
  info.link_layer =
      link_layer == IBV_LINK_LAYER_ETHERNET ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND;
  info.mtu = uint8_t(mtu);
  std::memcpy(info.gid, p + 16, sizeof(info.gid));
  return info;
}

// Only three verbs statuses have their own WcStatus; the rest mean "did not run".
WcStatus ToWcStatus(ibv_wc_status status) {
  switch (status) {
    case IBV_WC_SUCCESS:
      return WcStatus::kSuccess;
    case IBV_WC_REM_ACCESS_ERR:
      return WcStatus::kRemoteAccessError;
    case IBV_WC_LOC_LEN_ERR:
      return WcStatus::kLocalLengthError;
    // Everything else (flush, retries exhausted, protocol errors) means the request did not
    // run on a working connection.
    default:
      return WcStatus::kFlushed;
  }
}

// Every error completion leaves an RC QP in the error state; this says why, for state().
Status ConnectionStateAfter(ibv_wc_status status) {
  switch (status) {
    case IBV_WC_SUCCESS:
      return Status::OK();
    case IBV_WC_REM_ACCESS_ERR:
      return Status::RemoteAccess(
          "verbs: the peer refused a remote access (unknown key, out of bounds, or missing "
          "right)");
    case IBV_WC_LOC_LEN_ERR:
      return Status::IOError("verbs: a received SEND did not fit its receive buffer");
    case IBV_WC_WR_FLUSH_ERR:
      return Status::Disconnected("verbs: the queue pair was flushed (the connection failed)");
    case IBV_WC_RETRY_EXC_ERR:
      return Status::Disconnected("verbs: the peer stopped acknowledging (retries exhausted)");
    case IBV_WC_RNR_RETRY_EXC_ERR:
      return Status::Disconnected("verbs: the peer posted no receive in time (RNR retries)");
    default:
      return Status::IOError(std::string("verbs: work request failed with ") +
                             WcStatusName(status));
  }
}

// On failure the peer is told why (best effort) so that it fails fast instead of timing out.
Status BuildVerbsConnection(const TransportOptions& options, int fd,
                            std::unique_ptr<Connection>* out) {
  auto connection = std::make_unique<VerbsConnection>(CurrentVerbsApi(), options, fd);
  Status s = connection->Setup();
  if (!s.ok()) {
    SendSetupMessage(fd, kVerbsFailed, s.message().substr(0, kMaxNoticeText));
    return s;  // the destructor releases what was built and closes fd
  }
  *out = std::move(connection);
  return Status::OK();
}

// Verbs setup is symmetric: the accepting side runs the same steps.
Status AcceptVerbs(const TransportOptions& options, int fd, std::unique_ptr<Connection>* out) {
  return BuildVerbsConnection(options, fd, out);
}

// Verbs setup is symmetric: the connecting side runs the same steps.
Status ConnectVerbs(const TransportOptions& options, int fd, std::unique_ptr<Connection>* out) {
  return BuildVerbsConnection(options, fd, out);
}

// Asks the installed table, so tests can model machines with and without devices.
bool VerbsDeviceAvailable() {
  const VerbsApi& api = CurrentVerbsApi();
  int num_devices = 0;
  ibv_device** devices = api.get_device_list(&num_devices);
  if (devices == nullptr) return false;
  bool available = num_devices > 0;
  api.free_device_list(devices);
  return available;
}

}  // namespace slipstream::rdma
