// PlacerLink: a committing backend's own connection to one backup, over which it appends to
// the buffer the primary's shipper holds open there (docs/replication.md, "Placement by the
// committing backend"). It authenticates like the shipper's link and sends JOIN instead of
// HELLO: the backup then registers every buffer that session holds open on this connection
// too, under the same keys, so the SharedCursor the shipper exports names the buffer for both.
// It asks for no buffers and sends no RPC after JOIN; the backend reads its ACKs itself
// (receive_in_poll), so a commit waits on the backup's answer and on nothing else.
//
// Not thread-safe: one process (a backend, under the primary's place_lock) drives a link.
#pragma once

#include <cstdint>
#include <memory>

#include "slipstream/rdma/transport.h"
#include "slipstream/replication/backup_link.h"
#include "slipstream/replication/direct_append.h"

namespace slipstream::replication {

class ControlPort;

class PlacerLink : public DirectTarget {
 public:
  // Connects over tcp to options.address, authenticates and JOINs the session of
  // options.primary at options.version; a refusal (no such session, a transport that cannot
  // share buffers) is InvalidArgument with the backup's reason.
  static Status Connect(const LinkOptions& options, std::unique_ptr<PlacerLink>* link);
  ~PlacerLink() override;

  // Copies the bytes into the link's staging memory and posts their WRITE (waiting for the
  // earlier ones first, up to the options' rpc_timeout_ms, only when the staging memory is
  // full or kMaxPosted are in flight).
  Status Write(uint64_t rkey, uint64_t remote_addr, const void* data, size_t length) override;
  // Waits up to timeout_ms until every WRITE posted since the last Finish is placed (the
  // backup's ACKs), polling without sleeping (yielding the CPU between polls, to a backup's
  // thread woken onto it) for the first spin_us microseconds: an ACK that arrives meanwhile
  // costs no wake-up. Anything but OK ends the link: what it posted may land
  // or not, and a caller treats it as broken (direct_append.h).
  Status Finish(int timeout_ms, int spin_us = 0);
  // The socket the backup's ACKs arrive on (to wait on several links at once), or -1.
  int wait_fd() const { return connection_ ? connection_->wait_fd() : -1; }
  // OK while usable.
  Status state() const { return failed_; }
  // How many buffers the backup had open, and registered, when it accepted the JOIN.
  uint32_t registered_at_join() const { return registered_; }

  // The transport connection, for tests that inject faults into it.
  rdma::Connection* connection_for_testing() { return connection_.get(); }

 private:
  PlacerLink() = default;
  // Polls until the posted WRITEs have completed, for timeout_ms at most, sleeping in the
  // transport's Poll only after spin_us.
  Status WaitPosted(int timeout_ms, int spin_us = 0);

  static constexpr size_t kStagingBytes = 1u << 20;
  // WRITEs in flight at most, below the transport's max_outstanding (256 by default).
  static constexpr uint64_t kMaxPosted = 128;

  std::unique_ptr<rdma::Connection> connection_;
  std::unique_ptr<ControlPort> port_;
  rdma::LocalRegion staging_{};
  size_t staged_ = 0;    // bytes of staging_ in use by WRITEs not known placed
  uint64_t posted_ = 0;  // WRITEs posted since the last wait ended
  uint64_t completed_ = 0;
  uint32_t registered_ = 0;
  int rpc_timeout_ms_ = 5000;  // the longest wait for room in the staging memory
  Status failed_;
};

}  // namespace slipstream::replication
