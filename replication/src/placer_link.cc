// PlacerLink: see placer_link.h.
#include "slipstream/replication/placer_link.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "control_port.h"

namespace slipstream::replication {

PlacerLink::~PlacerLink() {
  if (connection_) {
    if (staging_.lkey != 0) connection_->FreeRegion(staging_);
    port_.reset();
    connection_->Disconnect();
  }
}

// Only tcp can register one buffer on several connections (Connection::RegisterShared); a shm
// backend's buffers are written through the backup's heap instead (ShmDirectTarget).
Status PlacerLink::Connect(const LinkOptions& options, std::unique_ptr<PlacerLink>* link) {
  if (!IsValidName(options.primary)) {
    return Status::InvalidArgument("primary name must be 1..63 of [A-Za-z0-9_.-]");
  }
  if (options.transport.backend != "tcp") {
    return Status::InvalidArgument("placer links run over tcp only");
  }
  rdma::TransportOptions transport = options.transport;
  transport.receive_in_poll = true;
  std::unique_ptr<PlacerLink> l(new PlacerLink());
  Status s = rdma::Connect(transport, options.address, &l->connection_);
  if (!s.ok()) return s;
  l->port_ = std::make_unique<ControlPort>(l->connection_.get());
  s = l->port_->Init();
  if (s.ok())
    s = l->port_->Send(Join{options.system_id, options.version, options.primary}, nullptr);
  Message reply;
  if (s.ok()) s = l->port_->Receive(options.rpc_timeout_ms, &reply, nullptr);
  if (!s.ok()) return s;
  if (const auto* e = std::get_if<Error>(&reply)) {
    return Status::InvalidArgument("backup refused the placer link: " + e->message);
  }
  const auto* ok = std::get_if<JoinOk>(&reply);
  if (ok == nullptr) return Status::InvalidArgument("backup answered JOIN with something else");
  l->registered_ = ok->registered;
  l->rpc_timeout_ms_ = options.rpc_timeout_ms;
  s = l->connection_->AllocateRegion(kStagingBytes, rdma::kLocalOnly, &l->staging_);
  if (!s.ok()) return s;
  *link = std::move(l);
  return Status::OK();
}

Status PlacerLink::Write(uint64_t rkey, uint64_t remote_addr, const void* data, size_t length) {
  if (!failed_.ok()) return failed_;
  if (length == 0 || length > kStagingBytes) {
    return Status::InvalidArgument("a placer WRITE must be 1 byte to 1 MiB");
  }
  if (staged_ + length > kStagingBytes || posted_ - completed_ >= kMaxPosted) {
    // The staging memory is reused only once its WRITEs are done.
    Status s = WaitPosted(rpc_timeout_ms_);
    if (!s.ok()) return s;
  }
  char* source = staging_.addr + staged_;
  std::memcpy(source, data, length);
  rdma::Sge sge{source, uint32_t(length), staging_.lkey};
  rdma::WorkRequest wr;
  wr.wr_id = posted_;  // any id below ControlPort::kOwnIds
  wr.opcode = rdma::Opcode::kWrite;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.remote_addr = remote_addr;
  wr.rkey = rkey;
  Status s = connection_->Post(&wr, 1);
  if (!s.ok()) {
    failed_ = s;
    connection_->Disconnect();
    return s;
  }
  staged_ += length;
  posted_++;
  return Status::OK();
}

Status PlacerLink::Finish(int timeout_ms, int spin_us) {
  return WaitPosted(timeout_ms, spin_us);
}

Status PlacerLink::WaitPosted(int timeout_ms, int spin_us) {
  if (!failed_.ok()) return failed_;
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::milliseconds(timeout_ms);
  const auto spin_end = start + std::chrono::microseconds(std::max(spin_us, 0));
  Status s;
  while (s.ok() && completed_ < posted_) {
    const auto now = std::chrono::steady_clock::now();
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    if (left.count() < 0) {
      s = Status::Timeout("the backup did not acknowledge a placer WRITE in time");
      break;
    }
    Status refused;
    const int wait_ms = now < spin_end ? 0 : int(left.count());  // no sleep while spinning
    Status polled = port_->Poll(wait_ms, [&](const rdma::Completion& c) {
      if (c.status == rdma::WcStatus::kSuccess) {
        completed_++;
      } else if (refused.ok()) {
        refused =
            Status::RemoteAccess("the backup refused a placer WRITE (revoked: fenced or closed)");
      }
    });
    s = refused.ok() ? polled : refused;
    // A backup's receiving thread woken onto this CPU runs before the next poll.
    if (s.ok() && wait_ms == 0 && completed_ < posted_) sched_yield();
  }
  if (!s.ok()) {
    failed_ = s;
    connection_->Disconnect();
    return s;
  }
  posted_ = completed_ = 0;
  staged_ = 0;
  return Status::OK();
}

}  // namespace slipstream::replication
