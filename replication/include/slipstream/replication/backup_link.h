// BackupLink: the primary's connection to one backup. It says hello, opens buffers by RPC,
// appends to them with one-sided WRITEs only (the records, then their checksum as its own
// fenced WRITE, so that on every backend the checksum is placed after what it covers; one
// WRITE for both where the transport places a WRITE's bytes in address order), and closes or
// flushes them by RPC. It learns placement from the checksum WRITEs' completions.
//
// Not thread-safe: one thread (the shipper) drives a link.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "slipstream/rdma/shm_peer.h"
#include "slipstream/rdma/transport.h"
#include "slipstream/replication/wire.h"

namespace slipstream::replication {

struct LinkOptions {
  std::string address;  // the backup's "HOST:PORT"
  rdma::TransportOptions transport;
  uint64_t system_id = 0;
  uint64_t version = 1;   // this primary's version for the backup
  std::string primary;    // this primary's name
  uint32_t timeline = 0;  // the WAL timeline it writes (0: not a PostgreSQL primary)
  int rpc_timeout_ms = 5000;
  // How long Append waits for a completion when the transport's queue is full: a backup that
  // acknowledges none of its WRITEs in flight for this long fails the link.
  int append_timeout_ms = 5000;
};

class ControlPort;

class BackupLink {
 public:
  // Connects, authenticates and says hello; a refusal (stale version, wrong cluster, no
  // buffers) is InvalidArgument or WouldBlock with the backup's reason.
  static Status Connect(const LinkOptions& options, std::unique_ptr<BackupLink>* link);
  // The same over `connection`, already made to the backup (the other Connect makes it with
  // rdma::Connect at options.address): for a connection made elsewhere, such as a test's or a
  // fuzzer's scripted backup. A backup whose answer offers buffers no primary can use (see
  // IsValidBufferSize) is refused.
  static Status Connect(const LinkOptions& options, std::unique_ptr<rdma::Connection> connection,
                        std::unique_ptr<BackupLink>* link);
  ~BackupLink();

  uint32_t buffer_size() const { return buffer_size_; }
  uint32_t buffers() const { return buffers_; }
  // Where the backup's durable copy of this primary's WAL ends (0: it holds none): the
  // position to ship from so that its copy has no gap.
  uint64_t resume() const { return resume_; }
  // The same for the index stream (StreamId::kEngineIndex).
  uint64_t index_resume() const { return index_resume_; }
  const std::string& address() const { return options_.address; }

  // Opens a buffer for segment `sequence` of `stream` (WouldBlock: the backup has none free).
  Status Open(uint32_t stream, uint64_t sequence, uint64_t start, uint32_t* buffer);

  // Writes image[from, checksum_at) and then, fenced, the checksum entry at
  // image[checksum_at, to) into the buffer at the same offsets. `image` is the primary's copy
  // of the whole buffer. Placement of [0, to) is reported by placed() once it completes.
  // With the transport's queue full it waits for completions, append_timeout_ms at most: a
  // backup that acknowledges nothing for that long fails the link (Timeout).
  Status Append(uint32_t buffer, const char* image, uint32_t from, uint32_t checksum_at,
                uint32_t to);

  // Bytes of the buffer known to be placed (every append up to there completed).
  uint32_t placed(uint32_t buffer) const;

  // The backup's description of an open buffer (length 0 if it is not open).
  rdma::RemoteRegion remote(uint32_t buffer) const;
  // Where other processes of this host can write into the backup (false unless the link runs
  // on shm): see direct_append.h.
  bool ExportPeer(rdma::ShmPeerRef* peer) const;
  // Whether the backup can register its buffers on a second connection, for placer links
  // (placer_link.h): a live tcp link.
  bool shares_buffers() const {
    return failed_.ok() && connection_ && connection_->backend() == "tcp";
  }
  // Records that the buffer's bytes up to `offset` were appended and placed by another
  // process through ExportPeer; this link's next append starts there.
  void AdoptPlaced(uint32_t buffer, uint32_t offset);

  // Processes completions for up to timeout_ms (0: what is there).
  Status Poll(int timeout_ms);
  // A descriptor that turns readable when Poll has the backup's answers to handle (the
  // connection's wait_fd: a tcp socket read in Poll), or -1: a caller that waits for other
  // events too waits for it, then calls Poll(0).
  int wait_fd() const { return connection_ ? connection_->wait_fd() : -1; }

  // Closes a buffer whose valid prefix ends at `length` (after it is placed); the backup makes
  // it durable and frees it.
  Status Close(uint32_t buffer, uint32_t length);

  // Asks the backup to make the buffer durable up to at least `length`; returns how far it is.
  Status Flush(uint32_t buffer, uint32_t length, uint32_t* durable);
  // Flush in two halves, so that several backups flush at once: the request goes out, then
  // FinishFlush waits for its answer. Nothing else may be called on the link in between.
  Status StartFlush(uint32_t buffer, uint32_t length);
  Status FinishFlush(uint32_t buffer, uint32_t* durable);

  // The error that ended the link, or OK.
  Status state() const;

  // The transport connection, for tests that inject faults into it.
  rdma::Connection* connection_for_testing() { return connection_.get(); }

 private:
  struct OpenBuffer {
    rdma::RemoteRegion remote;
    rdma::LocalRegion staging;  // the bytes WRITEs read from (registered on this connection)
    uint32_t posted = 0;        // bytes up to the end of the last posted append
    uint32_t placed = 0;
  };

  explicit BackupLink(const LinkOptions& options);
  // Sends a request and waits for its reply (an Error reply becomes a status).
  Status Call(const Message& request, Message* reply);
  // Call's halves; a failure ends the link.
  Status SendRequest(const Message& request);
  Status ReceiveReply(Message* reply);
  void OnCompletion(const rdma::Completion& c);

  LinkOptions options_;
  std::unique_ptr<rdma::Connection> connection_;
  std::unique_ptr<ControlPort> port_;
  uint32_t buffer_size_ = 0;
  uint32_t buffers_ = 0;
  uint64_t resume_ = 0;
  uint64_t index_resume_ = 0;
  std::map<uint32_t, OpenBuffer> open_;
  Status failed_;
};

}  // namespace slipstream::replication
