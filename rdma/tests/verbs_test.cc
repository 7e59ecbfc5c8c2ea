// The verbs backend against a fake VerbsApi: an in-process model of a fabric in which a WRITE
// posted on one fake QP really copies bytes into the peer's registered MR (found by rkey,
// checked for bounds, rights and protection domain) and produces completions, so these tests
// check data placement and error semantics as well as the sequence of verbs calls.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "backends.h"
#include "setup.h"
#include "verbs_api.h"
#include "verbs_transport.h"

namespace slipstream::rdma {
namespace {

constexpr int kTimeoutMs = 5000;

// ---------------------------------------------------------------------------------------------
// The fake fabric.

struct FakeContext {
  ibv_context context{};
  int id = 0;
  uint16_t lid = 0;
};

struct FakePd {
  ibv_pd pd{};
};

struct FakeMr {
  ibv_mr mr{};
  int access = 0;
};

struct FakeCq {
  ibv_cq cq{};
  std::deque<ibv_wc> entries;
};

// A receive as the fake keeps it (the caller's ibv_recv_wr does not outlive post_recv).
struct PostedRecv {
  uint64_t wr_id;
  std::vector<ibv_sge> sges;
};

struct FakeQp {
  ibv_qp qp{};
  FakeCq* cq = nullptr;
  ibv_qp_init_attr init{};
  ibv_qp_state state = IBV_QPS_RESET;
  int access_flags = 0;
  uint32_t dest_qp_num = 0;
  uint16_t dlid = 0;
  uint32_t rq_psn = 0;
  uint32_t sq_psn = 0;
  std::deque<PostedRecv> recvs;
};

// One work request of the last chain given to post_send, copied for inspection.
struct RecordedSend {
  uint64_t wr_id;
  ibv_wr_opcode opcode;
  unsigned int send_flags;
  std::vector<ibv_sge> sges;
  uint64_t remote_addr;
  uint32_t rkey;
  uint32_t imm_data;
};

class FakeFabric {
 public:
  FakeFabric();
  ~FakeFabric();

  // The calls made so far by the context with `id` (its open_device included), in order.
  std::vector<std::string> CallsOf(int id) const;
  // The fake objects behind verbs handles the backend obtained.
  FakeMr* MrByLkey(uint32_t lkey);
  FakeQp* QpOfContext(int id);
  int ContextOfLkey(uint32_t lkey);
  // Completes every held send request with `status` (successes only if signaled), moving the
  // QP to the error state for an error status, as hardware would.
  void CompleteHeld(ibv_wc_status status);

  VerbsApi api{};
  std::mutex mu;
  int device_count = 2;
  int outstanding_device_lists = 0;
  int post_send_error = 0;  // post_send returns this errno (nothing posted) when non-zero
  bool fail_create_qp = false;
  bool hold_sends = false;  // keep posted sends unexecuted until CompleteHeld
  int post_send_calls = 0;
  int failed_releases = 0;  // release calls the fake refused (resource still in use)
  std::vector<RecordedSend> last_chain;
  std::vector<int> registered_access;  // access flags of every reg_mr call

  // Everything below is the model; only the fake functions touch it (under mu).
  std::vector<std::pair<int, std::string>> calls;  // (context id, call)
  ibv_device devices[2]{};
  int next_context_id = 1;
  uint16_t next_lid = 0x11;
  uint32_t next_qp_num = 0x200;
  uint32_t next_key = 0x1000;
  std::map<uint32_t, FakeMr*> mrs_by_lkey;
  std::map<uint32_t, FakeMr*> mrs_by_rkey;
  std::map<uint32_t, FakeQp*> qps;
  std::set<FakeCq*> cqs;
  std::set<FakePd*> pds;
  std::vector<std::pair<FakeQp*, RecordedSend>> held;
};

FakeFabric* fabric = nullptr;

// The id of the context an object belongs to.
int IdOf(ibv_context* context) {
  return reinterpret_cast<FakeContext*>(context)->id;
}

void Log(ibv_context* context, const std::string& call) {
  fabric->calls.emplace_back(context ? IdOf(context) : 0, call);
}

// Pushes a completion onto `cq`.
void Complete(FakeCq* cq, uint64_t wr_id, ibv_wc_status status, ibv_wc_opcode opcode,
              uint32_t byte_len = 0, uint32_t imm_data = 0, unsigned int flags = 0) {
  ibv_wc wc{};
  wc.wr_id = wr_id;
  wc.status = status;
  wc.opcode = opcode;
  wc.byte_len = byte_len;
  wc.imm_data = imm_data;
  wc.wc_flags = flags;
  cq->entries.push_back(wc);
}

// Moves a QP to the error state: its posted receives complete with a flush error.
void FailQp(FakeQp* qp) {
  qp->state = IBV_QPS_ERR;
  for (const PostedRecv& r : qp->recvs) Complete(qp->cq, r.wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV);
  qp->recvs.clear();
}

// The local bytes of an sge, if it lies in an MR of `pd`.
char* LocalBytes(const ibv_sge& sge, ibv_pd* pd) {
  auto it = fabric->mrs_by_lkey.find(sge.lkey);
  if (it == fabric->mrs_by_lkey.end() || it->second->mr.pd != pd) return nullptr;
  const ibv_mr& mr = it->second->mr;
  uintptr_t start = reinterpret_cast<uintptr_t>(mr.addr);
  if (sge.addr < start || sge.addr - start > mr.length ||
      sge.length > mr.length - (sge.addr - start)) {
    return nullptr;
  }
  return reinterpret_cast<char*>(sge.addr);
}

// The peer's bytes for a remote access, checked like an HCA: key, PD, bounds and right.
char* RemoteBytes(FakeQp* peer, uint32_t rkey, uint64_t addr, uint64_t length, int right) {
  auto it = fabric->mrs_by_rkey.find(rkey);
  if (it == fabric->mrs_by_rkey.end()) return nullptr;
  FakeMr* mr = it->second;
  if (mr->mr.pd != peer->qp.pd || !(mr->access & right)) return nullptr;
  uintptr_t start = reinterpret_cast<uintptr_t>(mr->mr.addr);
  if (addr < start || addr - start > mr->mr.length || length > mr->mr.length - (addr - start)) {
    return nullptr;
  }
  return reinterpret_cast<char*>(addr);
}

// Runs one send request on `qp`, placing bytes and producing completions.
void Execute(FakeQp* qp, const RecordedSend& wr) {
  bool signaled = wr.send_flags & IBV_SEND_SIGNALED;
  auto fail = [&](ibv_wc_status status) {
    Complete(qp->cq, wr.wr_id, status, IBV_WC_SEND);
    FailQp(qp);
  };
  if (qp->state == IBV_QPS_ERR) return Complete(qp->cq, wr.wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND);
  auto peer_it = fabric->qps.find(qp->dest_qp_num);
  FakeQp* peer = peer_it == fabric->qps.end() ? nullptr : peer_it->second;
  if (peer == nullptr || reinterpret_cast<FakeContext*>(peer->qp.context)->lid != qp->dlid ||
      peer->state == IBV_QPS_ERR || peer->state < IBV_QPS_RTR) {
    return fail(IBV_WC_RETRY_EXC_ERR);  // nobody acknowledges
  }
  uint64_t total = 0;
  std::vector<char*> local;
  for (const ibv_sge& sge : wr.sges) {
    char* p = LocalBytes(sge, qp->qp.pd);
    if (p == nullptr) return fail(IBV_WC_LOC_PROT_ERR);
    local.push_back(p);
    total += sge.length;
  }
  auto remote_refused = [&] {
    fail(IBV_WC_REM_ACCESS_ERR);
    FailQp(peer);
  };
  switch (wr.opcode) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM: {
      char* target = RemoteBytes(peer, wr.rkey, wr.remote_addr, total, IBV_ACCESS_REMOTE_WRITE);
      if (target == nullptr) return remote_refused();
      if (wr.opcode == IBV_WR_RDMA_WRITE_WITH_IMM && peer->recvs.empty()) {
        return fail(IBV_WC_RNR_RETRY_EXC_ERR);
      }
      for (size_t i = 0; i < wr.sges.size(); i++) {
        std::memcpy(target, local[i], wr.sges[i].length);
        target += wr.sges[i].length;
      }
      if (wr.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
        PostedRecv r = peer->recvs.front();
        peer->recvs.pop_front();
        Complete(peer->cq, r.wr_id, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, uint32_t(total),
                 wr.imm_data, IBV_WC_WITH_IMM);
      }
      if (signaled) Complete(qp->cq, wr.wr_id, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE);
      return;
    }
    case IBV_WR_RDMA_READ: {
      char* source = RemoteBytes(peer, wr.rkey, wr.remote_addr, total, IBV_ACCESS_REMOTE_READ);
      if (source == nullptr) return remote_refused();
      for (size_t i = 0; i < wr.sges.size(); i++) {
        std::memcpy(local[i], source, wr.sges[i].length);
        source += wr.sges[i].length;
      }
      if (signaled) Complete(qp->cq, wr.wr_id, IBV_WC_SUCCESS, IBV_WC_RDMA_READ);
      return;
    }
    case IBV_WR_SEND: {
      if (peer->recvs.empty()) return fail(IBV_WC_RNR_RETRY_EXC_ERR);
      PostedRecv r = peer->recvs.front();
      peer->recvs.pop_front();
      uint64_t room = 0;
      for (const ibv_sge& sge : r.sges) room += sge.length;
      if (total > room) {
        Complete(peer->cq, r.wr_id, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV);
        FailQp(peer);
        return fail(IBV_WC_REM_INV_REQ_ERR);
      }
      char* target = r.sges.empty() ? nullptr : reinterpret_cast<char*>(r.sges[0].addr);
      for (size_t i = 0; i < wr.sges.size(); i++) {
        std::memcpy(target, local[i], wr.sges[i].length);
        target += wr.sges[i].length;
      }
      Complete(peer->cq, r.wr_id, IBV_WC_SUCCESS, IBV_WC_RECV, uint32_t(total));
      if (signaled) Complete(qp->cq, wr.wr_id, IBV_WC_SUCCESS, IBV_WC_SEND);
      return;
    }
    default:
      return fail(IBV_WC_LOC_QP_OP_ERR);
  }
}

const char* StateName(ibv_qp_state state) {
  switch (state) {
    case IBV_QPS_INIT:
      return "INIT";
    case IBV_QPS_RTR:
      return "RTR";
    case IBV_QPS_RTS:
      return "RTS";
    case IBV_QPS_ERR:
      return "ERR";
    default:
      return "OTHER";
  }
}

// The fake verbs calls. Each takes the fabric's lock: both sides of a connection run in
// threads of this process and share the model.
ibv_device** FakeGetDeviceList(int* n) {
  std::lock_guard<std::mutex> lock(fabric->mu);
  Log(nullptr, "get_device_list");
  auto** list = new ibv_device*[fabric->device_count + 1];
  for (int i = 0; i < fabric->device_count; i++) list[i] = &fabric->devices[i];
  list[fabric->device_count] = nullptr;
  fabric->outstanding_device_lists++;
  if (n) *n = fabric->device_count;
  return list;
}

void FakeFreeDeviceList(ibv_device** list) {
  std::lock_guard<std::mutex> lock(fabric->mu);
  fabric->outstanding_device_lists--;
  delete[] list;
}

// Every open is a separate HCA port with its own LID, so the two sides are two "devices".
ibv_context* FakeOpenDevice(ibv_device* device) {
  std::lock_guard<std::mutex> lock(fabric->mu);
  auto* c = new FakeContext;
  c->context.device = device;
  c->id = fabric->next_context_id++;
  c->lid = fabric->next_lid++;
  Log(&c->context, std::string("open_device:") + device->name);
  return &c->context;
}

int FakeCloseDevice(ibv_context* context) {
  std::lock_guard<std::mutex> lock(fabric->mu);
  Log(context, "close_device");
  for (FakePd* pd : fabric->pds) {
    if (pd->pd.context == context) {
      fabric->failed_releases++;
      return EBUSY;
    }
  }
  delete reinterpret_cast<FakeContext*>(context);
  return 0;
}

int FakeQueryDevice(ibv_context* context, ibv_device_attr* attr) {
  std::lock_guard<std::mutex> lock(fabric->mu);
  Log(context, "query_device");
  *attr = ibv_device_attr{};
  attr->max_qp_wr = 1024;
  attr->max_sge = 8;
  attr->max_cqe = 4096;
  attr->max_qp_rd_atom = 16;
  attr->max_qp_init_rd_atom = 16;
  return 0;
}

int FakeQueryPort(ibv_context* context, uint8_t port, ibv_port_attr* attr) {
  std::lock_guard<std::mutex> lock(fabric->mu);
  Log(context, "query_port");
  if (port != 1) return EINVAL;
  *attr = ibv_port_attr{};
  attr->state = IBV_PORT_ACTIVE;
  attr->lid = reinterpret_cast<FakeContext*>(context)->lid;
  attr->link_layer = IBV_LINK_LAYER_INFINIBAND;
  attr->active_mtu = IBV_MTU_4096;
  return 0;
}

int FakeQueryGid(ibv_context* context, uint8_t, int, ibv_gid* gid) {
  std::lock_guard<std::mutex> lock(fabric->mu);
  Log(context, "query_gid");
  std::memset(gid, 0, sizeof(*gid));
  gid->raw[15] = uint8_t(IdOf(context));
  return 0;
}

ibv_pd* FakeAllocPd(ibv_context* context) {
  std::lock_guard<std::mutex> lock(fabric->mu);
  Log(context, "alloc_pd");
  auto* pd = new FakePd;
  pd->pd.context = context;
  fabric->pds.insert(pd);
  return &pd->pd;
}

// Refuses (EBUSY) while an MR or QP still uses the PD, as the kernel does.
int FakeDeallocPd(ibv_pd* pd) {
  std::lock_guard<std::mutex> lock(fabric->mu);
  Log(pd->context, "dealloc_pd");
  for (auto& [key, mr] : fabric->mrs_by_lkey) {
    if (mr->mr.pd == pd) return fabric->failed_releases++, EBUSY;
  }
  for (auto& [num, qp] : fabric->qps) {
    if (qp->qp.pd == pd) return fabric->failed_releases++, EBUSY;
  }
  fabric->pds.erase(reinterpret_cast<FakePd*>(pd));
  delete reinterpret_cast<FakePd*>(pd);
  return 0;
}

ibv_mr* FakeRegMr(ibv_pd* pd, void* addr, size_t length, int access) {
  std::lock_guard<std::mutex> lock(fabric->mu);
  Log(pd->context, "reg_mr");
  fabric->registered_access.push_back(access);
  auto* mr = new FakeMr;
  mr->mr.context = pd->context;
  mr->mr.pd = pd;
  mr->mr.addr = addr;
  mr->mr.length = length;
  mr->mr.lkey = fabric->next_key++;
  mr->mr.rkey = fabric->next_key++;
  mr->access = access;
  fabric->mrs_by_lkey[mr->mr.lkey] = mr;
  fabric->mrs_by_rkey[mr->mr.rkey] = mr;
  return &mr->mr;
}

int FakeDeregMr(ibv_mr* mr) {
  std::lock_guard<std::mutex> lock(fabric->mu);
  Log(mr->context, "dereg_mr");
  fabric->mrs_by_lkey.erase(mr->lkey);
  fabric->mrs_by_rkey.erase(mr->rkey);
  delete reinterpret_cast<FakeMr*>(mr);
  return 0;
}

ibv_cq* FakeCreateCq(ibv_context* context, int cqe, void*, ibv_comp_channel*, int) {
  std::lock_guard<std::mutex> lock(fabric->mu);
  Log(context, "create_cq");
  auto* cq = new FakeCq;
  cq->cq.context = context;
  cq->cq.cqe = cqe;
  fabric->cqs.insert(cq);
  return &cq->cq;
}

int FakeDestroyCq(ibv_cq* cq) {
  std::lock_guard<std::mutex> lock(fabric->mu);
  Log(cq->context, "destroy_cq");
  for (auto& [num, qp] : fabric->qps) {
    if (&qp->cq->cq == cq) return fabric->failed_releases++, EBUSY;
  }
  fabric->cqs.erase(reinterpret_cast<FakeCq*>(cq));
  delete reinterpret_cast<FakeCq*>(cq);
  return 0;
}

ibv_qp* FakeCreateQp(ibv_pd* pd, ibv_qp_init_attr* init) {
  std::lock_guard<std::mutex> lock(fabric->mu);
  Log(pd->context, "create_qp");
  if (fabric->fail_create_qp) {
    errno = ENOMEM;
    return nullptr;
  }
  auto* qp = new FakeQp;
  qp->qp.context = pd->context;
  qp->qp.pd = pd;
  qp->qp.qp_num = fabric->next_qp_num++;
  qp->qp.qp_type = init->qp_type;
  qp->cq = reinterpret_cast<FakeCq*>(init->send_cq);
  qp->init = *init;
  fabric->qps[qp->qp.qp_num] = qp;
  return &qp->qp;
}

int FakeDestroyQp(ibv_qp* qp) {
  std::lock_guard<std::mutex> lock(fabric->mu);
  Log(qp->context, "destroy_qp");
  fabric->qps.erase(qp->qp_num);
  delete reinterpret_cast<FakeQp*>(qp);
  return 0;
}

// Enforces the RC state machine and the attributes each transition must carry.
int FakeModifyQp(ibv_qp* handle, ibv_qp_attr* attr, int mask) {
  std::lock_guard<std::mutex> lock(fabric->mu);
  auto* qp = reinterpret_cast<FakeQp*>(handle);
  Log(handle->context, std::string("modify_qp:") + StateName(attr->qp_state));
  if (!(mask & IBV_QP_STATE)) return EINVAL;
  switch (attr->qp_state) {
    case IBV_QPS_INIT: {
      int needed = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
      if (qp->state != IBV_QPS_RESET || (mask & needed) != needed) return EINVAL;
      qp->access_flags = attr->qp_access_flags;
      break;
    }
    case IBV_QPS_RTR: {
      int needed = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
      if (qp->state != IBV_QPS_INIT || (mask & needed) != needed) return EINVAL;
      qp->dest_qp_num = attr->dest_qp_num;
      qp->dlid = attr->ah_attr.dlid;
      qp->rq_psn = attr->rq_psn;
      break;
    }
    case IBV_QPS_RTS: {
      int needed = IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                   IBV_QP_MAX_QP_RD_ATOMIC;
      if (qp->state != IBV_QPS_RTR || (mask & needed) != needed) return EINVAL;
      qp->sq_psn = attr->sq_psn;
      break;
    }
    case IBV_QPS_ERR:
      FailQp(qp);
      return 0;
    default:
      return EINVAL;
  }
  qp->state = attr->qp_state;
  return 0;
}

int FakePostSend(ibv_qp* handle, ibv_send_wr* wr, ibv_send_wr** bad) {
  std::lock_guard<std::mutex> lock(fabric->mu);
  auto* qp = reinterpret_cast<FakeQp*>(handle);
  Log(handle->context, "post_send");
  fabric->post_send_calls++;
  fabric->last_chain.clear();
  for (ibv_send_wr* w = wr; w; w = w->next) {
    RecordedSend r{w->wr_id,        w->opcode,  w->send_flags, {}, w->wr.rdma.remote_addr,
                   w->wr.rdma.rkey, w->imm_data};
    r.sges.assign(w->sg_list, w->sg_list + w->num_sge);
    fabric->last_chain.push_back(r);
  }
  if (fabric->post_send_error != 0 || (qp->state != IBV_QPS_RTS && qp->state != IBV_QPS_ERR)) {
    *bad = wr;
    return fabric->post_send_error != 0 ? fabric->post_send_error : EINVAL;
  }
  for (const RecordedSend& r : fabric->last_chain) {
    if (fabric->hold_sends) {
      fabric->held.emplace_back(qp, r);
    } else {
      Execute(qp, r);
    }
  }
  return 0;
}

int FakePostRecv(ibv_qp* handle, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  std::lock_guard<std::mutex> lock(fabric->mu);
  auto* qp = reinterpret_cast<FakeQp*>(handle);
  Log(handle->context, "post_recv");
  if (qp->state == IBV_QPS_RESET) {
    *bad = wr;
    return EINVAL;
  }
  for (ibv_recv_wr* w = wr; w; w = w->next) {
    if (qp->state == IBV_QPS_ERR) {
      Complete(qp->cq, w->wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV);
    } else {
      qp->recvs.push_back(PostedRecv{w->wr_id, {w->sg_list, w->sg_list + w->num_sge}});
    }
  }
  return 0;
}

int FakePollCq(ibv_cq* handle, int n, ibv_wc* wc) {
  std::lock_guard<std::mutex> lock(fabric->mu);
  auto* cq = reinterpret_cast<FakeCq*>(handle);
  int got = 0;
  while (got < n && !cq->entries.empty()) {
    wc[got++] = cq->entries.front();
    cq->entries.pop_front();
  }
  return got;
}

FakeFabric::FakeFabric() {
  api = VerbsApi{FakeGetDeviceList, FakeFreeDeviceList, FakeOpenDevice, FakeCloseDevice,
                 FakeQueryDevice,   FakeQueryPort,      FakeQueryGid,   FakeAllocPd,
                 FakeDeallocPd,     FakeRegMr,          FakeDeregMr,    FakeCreateCq,
                 FakeDestroyCq,     FakeCreateQp,       FakeDestroyQp,  FakeModifyQp,
                 FakePostSend,      FakePostRecv,       FakePollCq};
  std::strcpy(devices[0].name, "fake0");
  std::strcpy(devices[1].name, "fake1");
  fabric = this;
}

FakeFabric::~FakeFabric() {
  fabric = nullptr;
}

std::vector<std::string> FakeFabric::CallsOf(int id) const {
  std::vector<std::string> out;
  for (const auto& [context, call] : calls) {
    if (context == id) out.push_back(call);
  }
  return out;
}

FakeMr* FakeFabric::MrByLkey(uint32_t lkey) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = mrs_by_lkey.find(lkey);
  return it == mrs_by_lkey.end() ? nullptr : it->second;
}

FakeQp* FakeFabric::QpOfContext(int id) {
  std::lock_guard<std::mutex> lock(mu);
  for (auto& [num, qp] : qps) {
    if (IdOf(qp->qp.context) == id) return qp;
  }
  return nullptr;
}

int FakeFabric::ContextOfLkey(uint32_t lkey) {
  FakeMr* mr = MrByLkey(lkey);
  return mr ? IdOf(mr->mr.context) : 0;
}

void FakeFabric::CompleteHeld(ibv_wc_status status) {
  std::lock_guard<std::mutex> lock(mu);
  for (auto& [qp, wr] : held) {
    if (status == IBV_WC_SUCCESS) {
      if (wr.send_flags & IBV_SEND_SIGNALED) Complete(qp->cq, wr.wr_id, status, IBV_WC_RDMA_WRITE);
    } else {
      Complete(qp->cq, wr.wr_id, status, IBV_WC_RDMA_WRITE);
      if (qp->state != IBV_QPS_ERR) FailQp(qp);
    }
  }
  held.clear();
}

// ---------------------------------------------------------------------------------------------
// Helpers.

// A test with a fresh fabric installed as the verbs table.
class VerbsTest : public ::testing::Test {
 protected:
  VerbsTest() : scoped_(&fabric_.api) {}

  // Connects two verbs connections over a socketpair (the setup socket after authentication).
  void Connect(uint32_t max_outstanding = 64) {
    options_.max_outstanding = max_outstanding;
    options_.connect_timeout_ms = kTimeoutMs;
    int fds[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    auto accepted = std::async(std::launch::async, [&] {
      std::unique_ptr<Connection> c;
      Status s = AcceptVerbs(options_, fds[0], &c);
      EXPECT_TRUE(s.ok()) << s.ToString();
      return c;
    });
    Status s = ConnectVerbs(options_, fds[1], &client_);
    ASSERT_TRUE(s.ok()) << s.ToString();
    server_ = accepted.get();
    ASSERT_TRUE(server_ && client_);
  }

  // Allocates a region on `c` or fails the test.
  LocalRegion Allocate(Connection* c, size_t length, uint32_t access) {
    LocalRegion r;
    Status s = c->AllocateRegion(length, access, &r);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return r;
  }

  // Polls `c` until one completion arrives (or the timeout passes).
  Completion PollOne(Connection* c, int timeout_ms = 1000) {
    Completion wc;
    size_t n = 0;
    Status s = c->Poll(&wc, 1, timeout_ms, &n);
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(n, 1u);
    return wc;
  }

  // Expects Poll on `c` to return nothing right now.
  void ExpectNoCompletion(Connection* c) {
    Completion wc;
    size_t n = 7;
    Status s = c->Poll(&wc, 1, 0, &n);
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(n, 0u);
  }

  // A WRITE of `sge` to `remote` at `offset`.
  static WorkRequest Write(uint64_t wr_id, const Sge* sge, const RemoteRegion& remote,
                           uint64_t offset = 0) {
    WorkRequest wr;
    wr.wr_id = wr_id;
    wr.opcode = Opcode::kWrite;
    wr.sg_list = sge;
    wr.num_sge = 1;
    wr.remote_addr = remote.addr + offset;
    wr.rkey = remote.rkey;
    return wr;
  }

  FakeFabric fabric_;
  ScopedVerbsApi scoped_;
  TransportOptions options_;
  std::unique_ptr<Connection> server_, client_;
};

// ---------------------------------------------------------------------------------------------
// Connection setup.

TEST_F(VerbsTest, SetupOpensDeviceAndMovesQpThroughInitRtrRtsWithThePeersInfo) {
  Connect();
  std::vector<std::string> expected = {
      "open_device:fake0", "query_device", "query_port",     "query_gid",     "alloc_pd",
      "create_cq",         "create_qp",    "modify_qp:INIT", "modify_qp:RTR", "modify_qp:RTS"};
  EXPECT_EQ(fabric_.CallsOf(1), expected);
  EXPECT_EQ(fabric_.CallsOf(2), expected);
  EXPECT_EQ(fabric_.outstanding_device_lists, 0);  // every list was freed

  FakeQp* a = fabric_.QpOfContext(1);
  FakeQp* b = fabric_.QpOfContext(2);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->state, IBV_QPS_RTS);
  EXPECT_EQ(b->state, IBV_QPS_RTS);
  EXPECT_EQ(a->qp.qp_type, IBV_QPT_RC);
  // Each side's RTR names the other side's QP, LID and first PSN, learned over the socket.
  EXPECT_EQ(a->dest_qp_num, b->qp.qp_num);
  EXPECT_EQ(b->dest_qp_num, a->qp.qp_num);
  EXPECT_EQ(a->dlid, reinterpret_cast<FakeContext*>(b->qp.context)->lid);
  EXPECT_EQ(b->dlid, reinterpret_cast<FakeContext*>(a->qp.context)->lid);
  EXPECT_EQ(a->rq_psn, b->sq_psn);
  EXPECT_EQ(b->rq_psn, a->sq_psn);
  EXPECT_EQ(a->access_flags,
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  EXPECT_EQ(a->init.cap.max_send_wr, 64u);
  EXPECT_EQ(a->init.send_cq, a->init.recv_cq);
  EXPECT_EQ(server_->backend(), "verbs");
  EXPECT_TRUE(server_->state().ok());
  EXPECT_TRUE(client_->state().ok());
}

TEST_F(VerbsTest, NoDeviceMeansUnavailableWithAClearMessageAndThePeerIsTold) {
  fabric_.device_count = 0;
  EXPECT_FALSE(VerbsDeviceAvailable());
  EXPECT_EQ(fabric_.outstanding_device_lists, 0);
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  std::unique_ptr<Connection> c;
  Status s = ConnectVerbs(options_, fds[1], &c);
  EXPECT_EQ(s.code(), Status::Code::kUnavailable);
  EXPECT_NE(s.message().find("no RDMA device"), std::string::npos) << s.message();
  EXPECT_FALSE(c);
  uint32_t type = 0;
  std::string text;
  ASSERT_TRUE(RecvSetupMessage(fds[0], 1000, &type, &text).ok());
  EXPECT_EQ(type, kVerbsFailed);
  EXPECT_NE(text.find("no RDMA device"), std::string::npos);
  // The failed side closed its socket.
  EXPECT_EQ(RecvSetupMessage(fds[0], 1000, &type, &text).code(), Status::Code::kDisconnected);
  ::close(fds[0]);
}

TEST_F(VerbsTest, DeviceAvailableWhenTheListIsNotEmpty) {
  EXPECT_TRUE(VerbsDeviceAvailable());
}

TEST_F(VerbsTest, SetupFailureReleasesWhatWasBuiltAndFailsThePeerFast) {
  fabric_.fail_create_qp = true;
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  auto accepted = std::async(std::launch::async, [&] {
    std::unique_ptr<Connection> c;
    return AcceptVerbs(options_, fds[0], &c);
  });
  std::unique_ptr<Connection> c;
  Status s = ConnectVerbs(options_, fds[1], &c);
  EXPECT_FALSE(s.ok());
  Status peer = accepted.get();
  EXPECT_FALSE(peer.ok());
  for (int id : {1, 2}) {
    std::vector<std::string> calls = fabric_.CallsOf(id);
    ASSERT_GE(calls.size(), 3u);
    std::vector<std::string> tail(calls.end() - 3, calls.end());
    EXPECT_EQ(tail, (std::vector<std::string>{"destroy_cq", "dealloc_pd", "close_device"}));
  }
  EXPECT_EQ(fabric_.failed_releases, 0);
}

TEST(VerbsQpInfoTest, EncodesAndRefusesMalformedInfo) {
  VerbsQpInfo info;
  info.qp_num = 0x123456;
  info.psn = 0xabcdef;
  info.lid = 0x4242;
  info.mtu = IBV_MTU_2048;
  info.gid[3] = 9;
  std::string wire = EncodeQpInfo(info);
  std::optional<VerbsQpInfo> back = DecodeQpInfo(wire);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->qp_num, info.qp_num);
  EXPECT_EQ(back->psn, info.psn);
  EXPECT_EQ(back->lid, info.lid);
  EXPECT_EQ(back->mtu, info.mtu);
  EXPECT_EQ(back->gid[3], 9);
  EXPECT_FALSE(DecodeQpInfo(wire.substr(1)));
  std::string bad_qpn = wire;
  bad_qpn[7] = 1;  // qp_num above 24 bits
  EXPECT_FALSE(DecodeQpInfo(bad_qpn));
  std::string bad_mtu = wire;
  bad_mtu[15] = 9;
  EXPECT_FALSE(DecodeQpInfo(bad_mtu));
  std::string bad_magic = wire;
  bad_magic[0] ^= 1;
  EXPECT_FALSE(DecodeQpInfo(bad_magic));
}

// ---------------------------------------------------------------------------------------------
// Regions.

TEST_F(VerbsTest, RegionsAreRegisteredWithExactlyTheRequestedRights) {
  Connect();
  struct Case {
    uint32_t access;
    int flags;
  } cases[] = {
      {kLocalOnly, IBV_ACCESS_LOCAL_WRITE},
      {kRemoteWrite, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE},
      {kRemoteRead, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ},
      {kRemoteWrite | kRemoteRead,
       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ},
  };
  for (const Case& c : cases) {
    fabric_.registered_access.clear();
    LocalRegion r = Allocate(server_.get(), 5000, c.access);
    ASSERT_EQ(fabric_.registered_access.size(), 1u);
    EXPECT_EQ(fabric_.registered_access[0], c.flags) << "access " << c.access;
    FakeMr* mr = fabric_.MrByLkey(r.lkey);
    ASSERT_TRUE(mr);
    EXPECT_EQ(mr->mr.addr, r.addr);
    EXPECT_EQ(mr->mr.length, 5000u);
    EXPECT_EQ(r.rkey, c.access == kLocalOnly ? 0u : uint64_t(mr->mr.rkey));
    EXPECT_EQ(r.access, c.access);
    EXPECT_TRUE(std::all_of(r.addr, r.addr + r.length, [](char b) { return b == 0; }));
    RemoteRegion d = server_->Describe(r);
    EXPECT_EQ(d.addr, reinterpret_cast<uintptr_t>(r.addr));
    EXPECT_EQ(d.length, 5000u);
    EXPECT_EQ(d.rkey, r.rkey);
    EXPECT_TRUE(server_->FreeRegion(r).ok());
    EXPECT_EQ(fabric_.MrByLkey(r.lkey), nullptr);
  }
  LocalRegion r;
  EXPECT_EQ(server_->AllocateRegion(0, kRemoteWrite, &r).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(server_->AllocateRegion(64, 1u << 7, &r).code(), Status::Code::kInvalidArgument);
}

TEST_F(VerbsTest, RegionCapacityIsEnforced) {
  options_.region_capacity = 8192;
  Connect();
  LocalRegion a = Allocate(client_.get(), 8192, kLocalOnly);
  LocalRegion b;
  EXPECT_EQ(client_->AllocateRegion(1, kLocalOnly, &b).code(), Status::Code::kWouldBlock);
  EXPECT_TRUE(client_->FreeRegion(a).ok());
  EXPECT_TRUE(client_->AllocateRegion(1, kLocalOnly, &b).ok());
  EXPECT_EQ(client_->FreeRegion(a).code(), Status::Code::kInvalidArgument);  // already freed
}

// ---------------------------------------------------------------------------------------------
// Posting.

TEST_F(VerbsTest, PostBuildsOneChainedListWithOneDoorbell) {
  Connect();
  LocalRegion src = Allocate(client_.get(), 4096, kLocalOnly);
  LocalRegion target = Allocate(server_.get(), 4096, kRemoteWrite | kRemoteRead);
  LocalRegion inbox = Allocate(server_.get(), 256, kLocalOnly);
  RemoteRegion remote = server_->Describe(target);
  RecvRequest recvs[2] = {{900, Sge{inbox.addr, 128, inbox.lkey}},
                          {901, Sge{inbox.addr + 128, 128, inbox.lkey}}};
  ASSERT_TRUE(server_->PostRecv(recvs, 2).ok());
  std::memcpy(src.addr, "headpayload", 11);
  std::memcpy(src.addr + 1000, "checksum", 8);
  std::memcpy(src.addr + 2000, "hello peer", 10);

  Sge gather[2] = {{src.addr, 4, src.lkey}, {src.addr + 4, 7, src.lkey}};
  Sge sum{src.addr + 1000, 8, src.lkey};
  Sge read_back{src.addr + 3000, 11, src.lkey};
  Sge message{src.addr + 2000, 10, src.lkey};
  WorkRequest wr[4];
  wr[0] = Write(1, gather, remote, 100);
  wr[0].num_sge = 2;
  wr[0].signaled = false;
  wr[1] = Write(2, &sum, remote, 200);
  wr[1].opcode = Opcode::kWriteWithImm;
  wr[1].imm = 0xdeadbeef;
  wr[1].fence = true;
  wr[2] = Write(3, &read_back, remote, 100);
  wr[2].opcode = Opcode::kRead;
  wr[3].wr_id = 4;
  wr[3].opcode = Opcode::kSend;
  wr[3].sg_list = &message;
  wr[3].num_sge = 1;
  int calls_before = fabric_.post_send_calls;
  ASSERT_TRUE(client_->Post(wr, 4).ok());
  EXPECT_EQ(fabric_.post_send_calls, calls_before + 1);

  const std::vector<RecordedSend>& chain = fabric_.last_chain;
  ASSERT_EQ(chain.size(), 4u);
  EXPECT_EQ(chain[0].opcode, IBV_WR_RDMA_WRITE);
  EXPECT_EQ(chain[1].opcode, IBV_WR_RDMA_WRITE_WITH_IMM);
  EXPECT_EQ(chain[2].opcode, IBV_WR_RDMA_READ);
  EXPECT_EQ(chain[3].opcode, IBV_WR_SEND);
  EXPECT_EQ(chain[0].send_flags, 0u);
  EXPECT_EQ(chain[1].send_flags, unsigned(IBV_SEND_SIGNALED | IBV_SEND_FENCE));
  EXPECT_EQ(chain[2].send_flags, unsigned(IBV_SEND_SIGNALED));
  EXPECT_EQ(chain[3].send_flags, unsigned(IBV_SEND_SIGNALED));
  ASSERT_EQ(chain[0].sges.size(), 2u);
  EXPECT_EQ(chain[0].sges[0].addr, reinterpret_cast<uintptr_t>(src.addr));
  EXPECT_EQ(chain[0].sges[0].length, 4u);
  EXPECT_EQ(chain[0].sges[1].addr, reinterpret_cast<uintptr_t>(src.addr + 4));
  EXPECT_EQ(chain[0].sges[1].lkey, src.lkey);
  EXPECT_EQ(chain[0].remote_addr, remote.addr + 100);
  EXPECT_EQ(chain[0].rkey, uint32_t(remote.rkey));
  EXPECT_EQ(chain[1].remote_addr, remote.addr + 200);
  EXPECT_EQ(chain[1].imm_data, htonl(0xdeadbeef));
  EXPECT_EQ(chain[2].sges[0].addr, reinterpret_cast<uintptr_t>(src.addr + 3000));

  // The model ran the requests: bytes are placed, read back and received.
  Completion wc[8];
  size_t n = 0;
  ASSERT_TRUE(client_->Poll(wc, 8, 1000, &n).ok());
  ASSERT_EQ(n, 3u);  // the unsignaled WRITE completes silently
  EXPECT_EQ(wc[0].wr_id, 2u);
  EXPECT_EQ(wc[0].opcode, Opcode::kWriteWithImm);
  EXPECT_EQ(wc[1].wr_id, 3u);
  EXPECT_EQ(wc[1].opcode, Opcode::kRead);
  EXPECT_EQ(wc[2].wr_id, 4u);
  EXPECT_EQ(wc[2].opcode, Opcode::kSend);
  for (size_t i = 0; i < n; i++) EXPECT_EQ(wc[i].status, WcStatus::kSuccess);
  EXPECT_EQ(std::string(target.addr + 100, 11), "headpayload");
  EXPECT_EQ(std::string(target.addr + 200, 8), "checksum");
  EXPECT_EQ(std::string(src.addr + 3000, 11), "headpayload");

  ASSERT_TRUE(server_->Poll(wc, 8, 1000, &n).ok());
  ASSERT_EQ(n, 2u);
  EXPECT_EQ(wc[0].wr_id, 900u);
  EXPECT_EQ(wc[0].opcode, Opcode::kRecv);
  EXPECT_TRUE(wc[0].has_imm);
  EXPECT_EQ(wc[0].imm, 0xdeadbeefu);
  EXPECT_EQ(wc[1].wr_id, 901u);
  EXPECT_FALSE(wc[1].has_imm);
  EXPECT_EQ(wc[1].byte_len, 10u);
  EXPECT_EQ(std::string(inbox.addr + 128, 10), "hello peer");
}

TEST_F(VerbsTest, BadRequestsAreRefusedBeforeAnythingIsPosted) {
  Connect();
  LocalRegion src = Allocate(client_.get(), 64, kLocalOnly);
  LocalRegion target = Allocate(server_.get(), 64, kRemoteWrite);
  RemoteRegion remote = server_->Describe(target);
  Sge good{src.addr, 8, src.lkey};
  Sge past_end{src.addr + 60, 8, src.lkey};
  Sge wrong_key{src.addr, 8, src.lkey + 77};
  int calls = fabric_.post_send_calls;
  WorkRequest wr[2] = {Write(1, &good, remote), Write(2, &past_end, remote)};
  EXPECT_EQ(client_->Post(wr, 2).code(), Status::Code::kInvalidArgument);
  wr[1] = Write(2, &wrong_key, remote);
  EXPECT_EQ(client_->Post(wr, 2).code(), Status::Code::kInvalidArgument);
  wr[1] = Write(2, &good, remote);
  wr[1].rkey = 1ull << 40;  // no verbs key is that wide
  EXPECT_EQ(client_->Post(wr, 2).code(), Status::Code::kInvalidArgument);
  wr[1] = Write(2, &good, remote);
  wr[1].opcode = Opcode::kRecv;
  EXPECT_EQ(client_->Post(wr, 2).code(), Status::Code::kInvalidArgument);
  RecvRequest recv{5, past_end};
  EXPECT_EQ(client_->PostRecv(&recv, 1).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(fabric_.post_send_calls, calls);
  EXPECT_TRUE(std::all_of(target.addr, target.addr + 64, [](char b) { return b == 0; }));
}

TEST_F(VerbsTest, PostSendFailureSurfacesAsAStatus) {
  Connect(4);
  LocalRegion src = Allocate(client_.get(), 64, kLocalOnly);
  LocalRegion target = Allocate(server_.get(), 64, kRemoteWrite);
  Sge sge{src.addr, 8, src.lkey};
  WorkRequest wr = Write(1, &sge, server_->Describe(target));
  fabric_.post_send_error = ENOMEM;
  EXPECT_EQ(client_->Post(&wr, 1).code(), Status::Code::kWouldBlock);
  fabric_.post_send_error = EIO;
  Status s = client_->Post(&wr, 1);
  EXPECT_EQ(s.code(), Status::Code::kIOError);
  EXPECT_NE(s.message().find("ibv_post_send"), std::string::npos) << s.message();
  // Nothing stayed outstanding: the whole budget of 4 is still free.
  fabric_.post_send_error = 0;
  fabric_.hold_sends = true;
  WorkRequest four[4] = {wr, wr, wr, wr};
  EXPECT_TRUE(client_->Post(four, 4).ok());
  EXPECT_EQ(client_->Post(&wr, 1).code(), Status::Code::kWouldBlock);  // max_outstanding
  ExpectNoCompletion(client_.get());
  fabric_.CompleteHeld(IBV_WC_SUCCESS);
  Completion wc[4];
  size_t n = 0;
  ASSERT_TRUE(client_->Poll(wc, 4, 1000, &n).ok());
  EXPECT_EQ(n, 4u);
  EXPECT_TRUE(client_->Post(&wr, 1).ok());
}

TEST_F(VerbsTest, LongUnsignaledStreamsNeverExhaustTheQueue) {
  Connect(8);
  LocalRegion src = Allocate(client_.get(), 64, kLocalOnly);
  LocalRegion target = Allocate(server_.get(), 64, kRemoteWrite);
  Sge sge{src.addr, 8, src.lkey};
  WorkRequest wr = Write(1, &sge, server_->Describe(target));
  wr.signaled = false;
  int forced = 0;
  for (int i = 0; i < 100; i++) {
    Status s = client_->Post(&wr, 1);
    ASSERT_TRUE(s.ok()) << i << ": " << s.ToString();
    if (fabric_.last_chain[0].send_flags & IBV_SEND_SIGNALED) forced++;
    ExpectNoCompletion(client_.get());  // internal signals are never reported
  }
  EXPECT_GT(forced, 0);
}

// ---------------------------------------------------------------------------------------------
// Completions and errors.

TEST(VerbsStatusTest, MapsEveryCompletionStatus) {
  EXPECT_EQ(ToWcStatus(IBV_WC_SUCCESS), WcStatus::kSuccess);
  EXPECT_EQ(ToWcStatus(IBV_WC_REM_ACCESS_ERR), WcStatus::kRemoteAccessError);
  EXPECT_EQ(ToWcStatus(IBV_WC_LOC_LEN_ERR), WcStatus::kLocalLengthError);
  EXPECT_EQ(ToWcStatus(IBV_WC_WR_FLUSH_ERR), WcStatus::kFlushed);
  EXPECT_EQ(ToWcStatus(IBV_WC_RETRY_EXC_ERR), WcStatus::kFlushed);
  EXPECT_EQ(ToWcStatus(IBV_WC_RNR_RETRY_EXC_ERR), WcStatus::kFlushed);
  EXPECT_TRUE(ConnectionStateAfter(IBV_WC_SUCCESS).ok());
  EXPECT_EQ(ConnectionStateAfter(IBV_WC_REM_ACCESS_ERR).code(), Status::Code::kRemoteAccess);
  EXPECT_EQ(ConnectionStateAfter(IBV_WC_RETRY_EXC_ERR).code(), Status::Code::kDisconnected);
  EXPECT_EQ(ConnectionStateAfter(IBV_WC_RNR_RETRY_EXC_ERR).code(), Status::Code::kDisconnected);
  EXPECT_EQ(ConnectionStateAfter(IBV_WC_WR_FLUSH_ERR).code(), Status::Code::kDisconnected);
  EXPECT_EQ(ConnectionStateAfter(IBV_WC_LOC_LEN_ERR).code(), Status::Code::kIOError);
  EXPECT_EQ(ConnectionStateAfter(IBV_WC_GENERAL_ERR).code(), Status::Code::kIOError);
}

// One connection per status: a WRITE held by the fake completes with the given status.
TEST_F(VerbsTest, PollMapsEachCompletionStatusAndTheConnectionState) {
  struct Case {
    ibv_wc_status status;
    WcStatus expected;
    Status::Code state;
  } cases[] = {
      {IBV_WC_SUCCESS, WcStatus::kSuccess, Status::Code::kOk},
      {IBV_WC_REM_ACCESS_ERR, WcStatus::kRemoteAccessError, Status::Code::kRemoteAccess},
      {IBV_WC_LOC_LEN_ERR, WcStatus::kLocalLengthError, Status::Code::kIOError},
      {IBV_WC_WR_FLUSH_ERR, WcStatus::kFlushed, Status::Code::kDisconnected},
      {IBV_WC_RETRY_EXC_ERR, WcStatus::kFlushed, Status::Code::kDisconnected},
      {IBV_WC_RNR_RETRY_EXC_ERR, WcStatus::kFlushed, Status::Code::kDisconnected},
      {IBV_WC_REM_INV_REQ_ERR, WcStatus::kFlushed, Status::Code::kIOError},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(int(c.status));
    server_.reset();
    client_.reset();
    Connect();
    LocalRegion src = Allocate(client_.get(), 64, kLocalOnly);
    LocalRegion target = Allocate(server_.get(), 64, kRemoteWrite);
    Sge sge{src.addr, 8, src.lkey};
    WorkRequest wr[2] = {Write(41, &sge, server_->Describe(target)),
                         Write(42, &sge, server_->Describe(target))};
    fabric_.hold_sends = true;
    ASSERT_TRUE(client_->Post(wr, 1).ok());
    fabric_.CompleteHeld(c.status);
    fabric_.hold_sends = false;
    Completion wc = PollOne(client_.get());
    EXPECT_EQ(wc.wr_id, 41u);
    EXPECT_EQ(wc.opcode, Opcode::kWrite);
    EXPECT_EQ(wc.status, c.expected);
    EXPECT_EQ(client_->state().code(), c.state);
    if (c.state != Status::Code::kOk) {
      // Every later request on a failed connection completes with kFlushed...
      ASSERT_TRUE(client_->Post(&wr[1], 1).ok());
      wc = PollOne(client_.get());
      EXPECT_EQ(wc.wr_id, 42u);
      EXPECT_EQ(wc.status, WcStatus::kFlushed);
      // ...and with nothing left, Poll reports the connection's error.
      size_t n = 0;
      EXPECT_EQ(client_->Poll(&wc, 1, 100, &n).code(), c.state);
      EXPECT_EQ(n, 0u);
    }
  }
}

// The three kinds of violation, each on a fresh connection: both sides learn, nothing placed.
TEST_F(VerbsTest, RemoteAccessViolationFailsBothSidesAndPlacesNothing) {
  for (int kind = 0; kind < 3; kind++) {
    SCOPED_TRACE(kind);
    server_.reset();
    client_.reset();
    Connect();
    LocalRegion src = Allocate(client_.get(), 64, kLocalOnly);
    std::memset(src.addr, 'x', 64);
    LocalRegion target = Allocate(server_.get(), 64, kind == 2 ? kRemoteRead : kRemoteWrite);
    LocalRegion inbox = Allocate(server_.get(), 64, kLocalOnly);
    RecvRequest recv{77, Sge{inbox.addr, 64, inbox.lkey}};
    ASSERT_TRUE(server_->PostRecv(&recv, 1).ok());
    RemoteRegion remote = server_->Describe(target);
    Sge sge{src.addr, 16, src.lkey};
    WorkRequest wr = Write(5, &sge, remote);
    if (kind == 0) wr.rkey = remote.rkey + 1000;       // unknown key
    if (kind == 1) wr.remote_addr = remote.addr + 56;  // runs past the end
    ASSERT_TRUE(client_->Post(&wr, 1).ok());
    Completion wc = PollOne(client_.get());
    EXPECT_EQ(wc.wr_id, 5u);
    EXPECT_EQ(wc.status, WcStatus::kRemoteAccessError);
    EXPECT_EQ(client_->state().code(), Status::Code::kRemoteAccess);
    EXPECT_TRUE(std::all_of(target.addr, target.addr + 64, [](char b) { return b == 0; }));
    // The target's pending receive is flushed and its connection fails with RemoteAccess.
    wc = PollOne(server_.get());
    EXPECT_EQ(wc.wr_id, 77u);
    EXPECT_EQ(wc.status, WcStatus::kFlushed);
    EXPECT_EQ(server_->state().code(), Status::Code::kRemoteAccess) << server_->state().ToString();
  }
}

TEST_F(VerbsTest, ReceiveTooSmallIsALocalLengthError) {
  Connect();
  LocalRegion src = Allocate(client_.get(), 64, kLocalOnly);
  LocalRegion inbox = Allocate(server_.get(), 64, kLocalOnly);
  RecvRequest recv{8, Sge{inbox.addr, 8, inbox.lkey}};
  ASSERT_TRUE(server_->PostRecv(&recv, 1).ok());
  Sge sge{src.addr, 16, src.lkey};
  WorkRequest send;
  send.wr_id = 9;
  send.opcode = Opcode::kSend;
  send.sg_list = &sge;
  send.num_sge = 1;
  ASSERT_TRUE(client_->Post(&send, 1).ok());
  Completion wc = PollOne(server_.get());
  EXPECT_EQ(wc.wr_id, 8u);
  EXPECT_EQ(wc.status, WcStatus::kLocalLengthError);
  EXPECT_FALSE(server_->state().ok());
  wc = PollOne(client_.get());
  EXPECT_EQ(wc.status, WcStatus::kFlushed);
  EXPECT_FALSE(client_->state().ok());
}

TEST_F(VerbsTest, PeerDisconnectIsDetectedAndPendingRequestsFlush) {
  Connect();
  LocalRegion inbox = Allocate(server_.get(), 64, kLocalOnly);
  RecvRequest recv{3, Sge{inbox.addr, 64, inbox.lkey}};
  ASSERT_TRUE(server_->PostRecv(&recv, 1).ok());
  ExpectNoCompletion(server_.get());
  client_->Disconnect();
  EXPECT_EQ(client_->state().code(), Status::Code::kDisconnected);
  Completion wc = PollOne(server_.get());
  EXPECT_EQ(wc.wr_id, 3u);
  EXPECT_EQ(wc.status, WcStatus::kFlushed);
  EXPECT_EQ(server_->state().code(), Status::Code::kDisconnected);
  size_t n = 0;
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(server_->Poll(&wc, 1, 2000, &n).code(), Status::Code::kDisconnected);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(500));
}

TEST_F(VerbsTest, PeerProcessDeathIsSeenThroughTheSetupSocket) {
  Connect();
  // Destroying the client closes its setup socket without any goodbye, like a dead process.
  client_.reset();
  Completion wc;
  size_t n = 0;
  Status s = server_->Poll(&wc, 1, 1000, &n);
  EXPECT_EQ(s.code(), Status::Code::kDisconnected) << s.ToString();
  EXPECT_EQ(server_->state().code(), Status::Code::kDisconnected);
}

TEST_F(VerbsTest, PollNeverWaitsPastItsTimeout) {
  Connect();
  Completion wc;
  size_t n = 9;
  auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(server_->Poll(&wc, 1, 50, &n).ok());
  auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(n, 0u);
  EXPECT_GE(waited, std::chrono::milliseconds(50));
  EXPECT_LT(waited, std::chrono::milliseconds(400));
}

TEST_F(VerbsTest, CompletionDelayHoldsCompletionsBack) {
  Connect();
  LocalRegion src = Allocate(client_.get(), 64, kLocalOnly);
  LocalRegion target = Allocate(server_.get(), 64, kRemoteWrite);
  Sge sge{src.addr, 8, src.lkey};
  WorkRequest wr = Write(1, &sge, server_->Describe(target));
  TestFaults(client_)->completion_delay_us = 40000;
  auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(client_->Post(&wr, 1).ok());
  ExpectNoCompletion(client_.get());
  Completion wc = PollOne(client_.get(), 2000);
  EXPECT_EQ(wc.status, WcStatus::kSuccess);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(40));
}

TEST_F(VerbsTest, DestructionReleasesQpCqMrsPdDeviceInThatOrder) {
  Connect();
  LocalRegion a = Allocate(client_.get(), 64, kRemoteWrite);
  Allocate(client_.get(), 64, kLocalOnly);
  int id = fabric_.ContextOfLkey(a.lkey);
  ASSERT_NE(id, 0);
  size_t before = fabric_.CallsOf(id).size();
  client_.reset();
  std::vector<std::string> calls = fabric_.CallsOf(id);
  std::vector<std::string> teardown(calls.begin() + before, calls.end());
  EXPECT_EQ(teardown, (std::vector<std::string>{"destroy_qp", "destroy_cq", "dereg_mr", "dereg_mr",
                                                "dealloc_pd", "close_device"}));
  EXPECT_EQ(fabric_.failed_releases, 0);
}

// Runs only where a real device exists: the real table must find it.
TEST(VerbsRealDeviceTest, RealTableAgreesWithTheMachine) {
  int n = 0;
  ibv_device** list = RealVerbsApi().get_device_list(&n);
  bool any = list != nullptr && n > 0;
  if (list) RealVerbsApi().free_device_list(list);
  EXPECT_EQ(VerbsDeviceAvailable(), any);
  if (!any) GTEST_SKIP() << "no RDMA device here";
}

}  // namespace
}  // namespace slipstream::rdma
