// A fake VerbsApi for the verbs backend's tests: an in-process model of a fabric in which a
// WRITE posted on one fake QP really copies bytes into the peer's registered MR (found by
// rkey, checked for bounds, rights and protection domain) and produces completions.
#pragma once

#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "verbs_api.h"

namespace slipstream::rdma::test {

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

}  // namespace slipstream::rdma::test
