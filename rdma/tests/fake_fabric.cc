// The fake fabric (fake_fabric.h): the verbs calls and the model they act on.
#include "fake_fabric.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstring>
#include <deque>

namespace slipstream::rdma::test {

namespace {

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

}  // namespace

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

}  // namespace slipstream::rdma::test
