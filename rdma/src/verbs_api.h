// Every libibverbs call the verbs backend makes, as a table of function pointers. The backend
// never calls libibverbs directly: it calls through the table captured when a connection is
// built, so unit tests can install a fake table (an in-process model of a fabric) and exercise
// the backend without RDMA hardware or kernel RDMA support. Several verbs entry points are
// static inline functions or macros in <infiniband/verbs.h> (ibv_post_send, ibv_post_recv,
// ibv_poll_cq, ibv_reg_mr, ibv_query_port, ...), so the real table holds small wrapper
// functions around them rather than their addresses.
#pragma once

#include <infiniband/verbs.h>

namespace slipstream::rdma {

struct VerbsApi {
  ibv_device** (*get_device_list)(int* num_devices);
  void (*free_device_list)(ibv_device** list);
  ibv_context* (*open_device)(ibv_device* device);
  int (*close_device)(ibv_context* context);
  int (*query_device)(ibv_context* context, ibv_device_attr* attr);
  int (*query_port)(ibv_context* context, uint8_t port_num, ibv_port_attr* attr);
  int (*query_gid)(ibv_context* context, uint8_t port_num, int index, ibv_gid* gid);
  ibv_pd* (*alloc_pd)(ibv_context* context);
  int (*dealloc_pd)(ibv_pd* pd);
  ibv_mr* (*reg_mr)(ibv_pd* pd, void* addr, size_t length, int access);
  int (*dereg_mr)(ibv_mr* mr);
  ibv_cq* (*create_cq)(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                       int comp_vector);
  int (*destroy_cq)(ibv_cq* cq);
  ibv_qp* (*create_qp)(ibv_pd* pd, ibv_qp_init_attr* attr);
  int (*destroy_qp)(ibv_qp* qp);
  int (*modify_qp)(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask);
  // Returns 0 or an errno value; *bad_wr is the first request not posted.
  int (*post_send)(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr);
  int (*post_recv)(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr);
  // Returns the number of completions written to `wc` (>= 0) or a negative value on failure.
  int (*poll_cq)(ibv_cq* cq, int num_entries, ibv_wc* wc);
};

// The table that calls libibverbs.
const VerbsApi& RealVerbsApi();

// The table new verbs connections (and VerbsDeviceAvailable) use: the real one unless a test
// installed another.
const VerbsApi& CurrentVerbsApi();

// Installs `api` for connections built from now on (nullptr restores the real table). For
// tests; `api` must outlive every connection built while it was installed.
void SetVerbsApiForTesting(const VerbsApi* api);

// Installs a table for the lifetime of a scope, restoring the previous one afterwards.
class ScopedVerbsApi {
 public:
  explicit ScopedVerbsApi(const VerbsApi* api) : previous_(&CurrentVerbsApi()) {
    SetVerbsApiForTesting(api);
  }
  ~ScopedVerbsApi() { SetVerbsApiForTesting(previous_); }
  ScopedVerbsApi(const ScopedVerbsApi&) = delete;
  ScopedVerbsApi& operator=(const ScopedVerbsApi&) = delete;

 private:
  const VerbsApi* previous_;
};

}  // namespace slipstream::rdma
