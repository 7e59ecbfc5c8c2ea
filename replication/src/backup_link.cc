// BackupLink: see backup_link.h.
#include "slipstream/replication/backup_link.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "control_port.h"

namespace slipstream::replication {

namespace {

// A refusal from the backup as a status the caller can act on.
Status FromError(const Error& e) {
  std::string text = "backup refused: " + e.message;
  switch (ErrorCode(e.code)) {
    case ErrorCode::kNoBuffer:
      return Status::WouldBlock(text);
    case ErrorCode::kStorage:
      return Status::IOError(text);
    default:
      return Status::InvalidArgument(text);
  }
}

}  // namespace

BackupLink::BackupLink(const LinkOptions& options) : options_(options) {}

BackupLink::~BackupLink() {
  if (connection_) {
    for (auto& [id, b] : open_) connection_->FreeRegion(b.staging);
    port_.reset();
    connection_->Disconnect();
  }
}

Status BackupLink::Connect(const LinkOptions& options, std::unique_ptr<BackupLink>* link) {
  if (!IsValidName(options.primary)) {
    return Status::InvalidArgument("primary name must be 1..63 of [A-Za-z0-9_.-]");
  }
  // The primary only initiates, and the backup only answers: over tcp the shipper's own Poll
  // reads the answers, with no receiving thread to hand each completion over (commit latency).
  rdma::TransportOptions transport = options.transport;
  transport.receive_in_poll = true;
  std::unique_ptr<rdma::Connection> connection;
  Status s = rdma::Connect(transport, options.address, &connection);
  if (!s.ok()) return s;
  return Connect(options, std::move(connection), link);
}

// The answer to HELLO is the backup's word on its buffers: the shipper formats segments of
// buffer_size bytes, so a size that cannot hold a segment is refused here (one below the
// segment header's 64 bytes overran the shipper's image).
Status BackupLink::Connect(const LinkOptions& options, std::unique_ptr<rdma::Connection> connection,
                           std::unique_ptr<BackupLink>* link) {
  if (!IsValidName(options.primary)) {
    return Status::InvalidArgument("primary name must be 1..63 of [A-Za-z0-9_.-]");
  }
  std::unique_ptr<BackupLink> l(new BackupLink(options));
  l->connection_ = std::move(connection);
  l->port_ = std::make_unique<ControlPort>(l->connection_.get());
  Status s = l->port_->Init();
  Message reply;
  if (s.ok())
    s = l->Call(Hello{options.system_id, options.version, options.primary, options.timeline},
                &reply);
  if (!s.ok()) return s;
  const auto* ok = std::get_if<HelloOk>(&reply);
  if (ok == nullptr) return Status::InvalidArgument("backup answered HELLO with something else");
  if (!IsValidBufferSize(ok->buffer_size)) {
    return Status::InvalidArgument("backup offered buffers of " + std::to_string(ok->buffer_size) +
                                   " bytes: not a power of two from 64 kB to 1 GB");
  }
  l->buffer_size_ = ok->buffer_size;
  l->buffers_ = ok->buffers;
  l->resume_ = ok->resume;
  l->index_resume_ = ok->index_resume;
  *link = std::move(l);
  return Status::OK();
}

Status BackupLink::Call(const Message& request, Message* reply) {
  Status s = SendRequest(request);
  return s.ok() ? ReceiveReply(reply) : s;
}

Status BackupLink::SendRequest(const Message& request) {
  if (!failed_.ok()) return failed_;
  Status s = port_->Send(request, [this](const rdma::Completion& c) { OnCompletion(c); });
  if (!s.ok()) failed_ = s;
  return s;
}

Status BackupLink::ReceiveReply(Message* reply) {
  if (!failed_.ok()) return failed_;
  Status s = port_->Receive(options_.rpc_timeout_ms, reply,
                            [this](const rdma::Completion& c) { OnCompletion(c); });
  if (!s.ok()) {
    failed_ = s;
    return s;
  }
  if (const auto* e = std::get_if<Error>(reply)) return FromError(*e);
  return Status::OK();
}

// The buffer's index must be one of those HELLO granted, and below 2^30: Append's work request
// ids carry it in their high half, and an id at or above ControlPort::kOwnIds is taken by the
// port for one of its own (a WRITE's completion then freed a send slot still in use, and the
// placement it reported was never learnt).
Status BackupLink::Open(uint32_t stream, uint64_t sequence, uint64_t start, uint32_t* buffer) {
  Message reply;
  Status s = Call(replication::Open{stream, sequence, start}, &reply);
  if (!s.ok()) return s;
  const auto* ok = std::get_if<OpenOk>(&reply);
  if (ok == nullptr || ok->length != buffer_size_ || ok->buffer >= buffers_ ||
      (uint64_t(ok->buffer) << 32) >= ControlPort::kOwnIds || open_.count(ok->buffer)) {
    failed_ = Status::InvalidArgument("backup answered OPEN with something unusable");
    return failed_;
  }
  OpenBuffer b;
  b.remote = rdma::RemoteRegion{ok->addr, ok->length, ok->rkey};
  s = connection_->AllocateRegion(buffer_size_, rdma::kLocalOnly, &b.staging);
  if (!s.ok()) return s;
  open_[ok->buffer] = b;
  *buffer = ok->buffer;
  return Status::OK();
}

// The id of a checksum WRITE carries the buffer and the end it completes. On a transport that
// places a WRITE's bytes in address order the records and their checksum go as one WRITE.
Status BackupLink::Append(uint32_t buffer, const char* image, uint32_t from, uint32_t checksum_at,
                          uint32_t to) {
  if (!failed_.ok()) return failed_;
  auto it = open_.find(buffer);
  if (it == open_.end()) return Status::InvalidArgument("append to a buffer that is not open");
  OpenBuffer& b = it->second;
  if (from != b.posted || from > checksum_at || checksum_at >= to || to > buffer_size_) {
    return Status::InvalidArgument("append out of order or out of the buffer");
  }
  std::memcpy(b.staging.addr + from, image + from, to - from);
  rdma::Sge data{b.staging.addr + from, checksum_at - from, b.staging.lkey};
  rdma::Sge sum{b.staging.addr + checksum_at, to - checksum_at, b.staging.lkey};
  rdma::WorkRequest wr[2];
  size_t n = 0;
  const bool one_write = connection_->places_in_address_order();
  if (one_write) {
    // The checksum lands after the records it covers within one WRITE: one request and one
    // acknowledgement per append instead of two (on tcp, half the frames of a round).
    sum = rdma::Sge{b.staging.addr + from, to - from, b.staging.lkey};
    checksum_at = from;
  } else if (checksum_at > from) {
    wr[n].wr_id = (uint64_t(buffer) << 32) | from;
    wr[n].opcode = rdma::Opcode::kWrite;
    wr[n].sg_list = &data;
    wr[n].num_sge = 1;
    wr[n].remote_addr = b.remote.addr + from;
    wr[n].rkey = b.remote.rkey;
    wr[n].signaled = false;  // errors still complete; the checksum's completion covers it
    n++;
  }
  wr[n].wr_id = (uint64_t(buffer) << 32) | to;
  wr[n].opcode = rdma::Opcode::kWrite;
  wr[n].sg_list = &sum;
  wr[n].num_sge = 1;
  wr[n].remote_addr = b.remote.addr + checksum_at;
  wr[n].rkey = b.remote.rkey;
  wr[n].fence = !one_write;
  n++;
  // Too many in flight: let some complete, for append_timeout_ms at most. A backup that is
  // alive and acknowledges nothing (its process stopped) would otherwise hold the caller for
  // as long as it stays so: the shipper, under the lock every commit's placement takes.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.append_timeout_ms);
  Status s = connection_->Post(wr, n);
  while (s.code() == Status::Code::kWouldBlock) {
    if (std::chrono::steady_clock::now() > deadline) {
      failed_ = Status::Timeout("the backup acknowledged none of the WRITEs in flight");
      return failed_;
    }
    Status p = Poll(1);
    if (!p.ok()) return p;
    s = connection_->Post(wr, n);
  }
  if (!s.ok()) {
    failed_ = s;
    return s;
  }
  b.posted = to;
  return Status::OK();
}

void BackupLink::OnCompletion(const rdma::Completion& c) {
  if (c.status != rdma::WcStatus::kSuccess) {
    if (failed_.ok()) failed_ = Status::Disconnected("a WRITE to the backup failed");
    return;
  }
  auto it = open_.find(uint32_t(c.wr_id >> 32));
  if (it != open_.end()) it->second.placed = std::max(it->second.placed, uint32_t(c.wr_id));
}

uint32_t BackupLink::placed(uint32_t buffer) const {
  auto it = open_.find(buffer);
  return it == open_.end() ? 0 : it->second.placed;
}

Status BackupLink::Poll(int timeout_ms) {
  if (!failed_.ok()) return failed_;
  Status s = port_->Poll(timeout_ms, [this](const rdma::Completion& c) { OnCompletion(c); });
  if (!s.ok() && failed_.ok()) failed_ = s;
  Message unexpected;
  if (failed_.ok() && port_->Next(&unexpected)) {
    failed_ = Status::InvalidArgument("backup sent a message nobody asked for");
  }
  return failed_;
}

rdma::RemoteRegion BackupLink::remote(uint32_t buffer) const {
  auto it = open_.find(buffer);
  return it == open_.end() ? rdma::RemoteRegion{} : it->second.remote;
}

bool BackupLink::ExportPeer(rdma::ShmPeerRef* peer) const {
  return failed_.ok() && rdma::ExportShmPeer(connection_.get(), peer).ok();
}

void BackupLink::AdoptPlaced(uint32_t buffer, uint32_t offset) {
  auto it = open_.find(buffer);
  if (it == open_.end() || offset <= it->second.posted || offset > buffer_size_) return;
  it->second.posted = offset;
  it->second.placed = std::max(it->second.placed, offset);
}

Status BackupLink::Close(uint32_t buffer, uint32_t length) {
  auto it = open_.find(buffer);
  if (it == open_.end()) return Status::InvalidArgument("close of a buffer that is not open");
  Message reply;
  Status s = Call(replication::Close{buffer, length}, &reply);
  if (!s.ok()) return s;
  if (!std::holds_alternative<CloseOk>(reply)) {
    failed_ = Status::InvalidArgument("backup answered CLOSE with something else");
    return failed_;
  }
  connection_->FreeRegion(it->second.staging);
  open_.erase(it);
  return Status::OK();
}

Status BackupLink::Flush(uint32_t buffer, uint32_t length, uint32_t* durable) {
  Status s = StartFlush(buffer, length);
  return s.ok() ? FinishFlush(buffer, durable) : s;
}

Status BackupLink::StartFlush(uint32_t buffer, uint32_t length) {
  return SendRequest(replication::Flush{buffer, length});
}

Status BackupLink::FinishFlush(uint32_t buffer, uint32_t* durable) {
  Message reply;
  Status s = ReceiveReply(&reply);
  if (!s.ok()) return s;
  const auto* ok = std::get_if<FlushOk>(&reply);
  if (ok == nullptr || ok->buffer != buffer) {
    failed_ = Status::InvalidArgument("backup answered FLUSH with something else");
    return failed_;
  }
  *durable = ok->durable;
  return Status::OK();
}

Status BackupLink::state() const {
  if (!failed_.ok()) return failed_;
  return connection_->state();
}

}  // namespace slipstream::replication
