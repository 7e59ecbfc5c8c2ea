// BackupServer and its per-primary sessions: see backup_server.h.
#include "slipstream/replication/backup_server.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "buffer_scan.h"
#include "control_port.h"

namespace slipstream::replication {

// One primary's connection: its buffers, and the thread that answers its control messages. Or,
// after a JOIN, a placer link: a second connection of a primary's session (one of its
// committing backends) on which that session registers the buffers it holds open, under their
// own keys, so that the backend appends to them directly.
class BackupServer::Session : public std::enable_shared_from_this<BackupServer::Session> {
 public:
  Session(BackupServer* server, std::unique_ptr<rdma::Connection> connection)
      : server_(server), connection_(std::move(connection)), port_(connection_.get()) {}
  ~Session() { Join(); }

  void Start() { thread_ = std::thread(&Session::Run, this); }
  // Asks the session to end; Fence() also waits for it.
  void RequestStop() { stop_.store(true); }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }
  bool finished() const { return finished_.load(); }
  std::string primary() {
    std::lock_guard<std::mutex> lock(mu_);
    return primary_;
  }
  // Whether this is the session of `primary` at `version` (not a placer link).
  bool Serves(const std::string& primary, uint64_t version) {
    std::lock_guard<std::mutex> lock(mu_);
    return primary_ == primary && version_ == version;
  }
  // The open buffers, scanned now.
  void AppendStatus(std::vector<BufferStatus>* out);
  // The segments of the open buffers.
  void AppendOpen(std::vector<SegmentId>* out);
  // Registers the open buffers on `placer`'s connection and keeps registering the buffers it
  // opens there until RemovePlacer or the end of this session; returns how many were open.
  Status AddPlacer(const std::shared_ptr<Session>& placer, uint32_t* registered);
  // Revokes what AddPlacer registered on `placer` (its link ended).
  void RemovePlacer(const Session* placer);

 private:
  // An open buffer remembers how far its scans got, so that each scan reads only the bytes
  // appended since (a FLUSH per group commit would otherwise rescan megabytes each time).
  struct Buffer {
    rdma::LocalRegion region;
    bool open = false;
    SegmentId segment;
    ScanPoint durable;  // the end of the persisted prefix (and the chain there)
    ScanPoint scanned;  // the furthest valid end a scan found (>= durable)
  };

  // A placer link and the buffers registered on it (by buffer number; lkey 0: none).
  struct Placer {
    std::shared_ptr<Session> session;
    std::vector<rdma::LocalRegion> shared;
  };

  void Run();
  // Answers one message; an error means a protocol violation (the peer is dropped).
  Status Handle(const Message& message);
  Status OnHello(const Hello& hello);
  Status OnOpen(const Open& open);
  Status OnClose(const Close& close);
  Status OnFlush(const Flush& flush);
  Status OnJoin(const replication::Join& join);
  // Why a peer of cluster `system_id` is not served here, or "" if it is.
  std::string ClusterMismatch(uint64_t system_id) const;
  // Registers open buffer `buffer` on a placer's connection (mu_ held).
  Status ShareLocked(Placer* placer, uint32_t buffer);
  // Revokes buffer `buffer` (every buffer if kAll) from every placer link before its bytes are
  // read for persisting and it is zeroed for reuse: no late WRITE of theirs lands after this
  // (mu_ held).
  static constexpr uint32_t kAll = UINT32_MAX;
  void RevokeLocked(Placer* placer, uint32_t buffer);
  void RevokeFromPlacersLocked(uint32_t buffer);
  // Readies a closed buffer for its next use: zeroed, and over tcp under a new key (mu_ held).
  void RenewLocked(Buffer* b);
  Status Reply(const Message& message) { return port_.Send(message, nullptr); }
  Status Refuse(ErrorCode code, const std::string& why) {
    return Reply(Error{uint32_t(code), why});
  }
  // Scans an open buffer from the end of its durable prefix.
  engine::LogScan ScanFromDurable(Buffer* b);
  // Persists what `scan` (a ScanFromDurable of b) found valid beyond the durable prefix.
  Status Persist(Buffer* b, const engine::LogScan& scan, bool closed);
  // Persists the valid prefix of an open buffer beyond what is durable.
  Status PersistPrefix(Buffer* b, bool closed, uint32_t* valid);
  // Persists the valid prefixes of every open buffer (the periodic persist).
  Status PersistOpen();
  // Ends the session: no more writes land, open buffers are persisted, regions freed.
  void Shutdown();

  BackupServer* server_;
  std::unique_ptr<rdma::Connection> connection_;
  ControlPort port_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> finished_{false};
  std::mutex mu_;  // primary_, version_, buffers_, placers_, ending_
  std::string primary_;
  uint64_t version_ = 0;  // the primary's version in its HELLO
  std::vector<Buffer> buffers_;
  std::vector<Placer> placers_;
  bool ending_ = false;     // Shutdown began: no placer joins any more
  bool is_placer_ = false;  // this session is a placer link of owner_
  std::weak_ptr<Session> owner_;
};

// A placer link per committing backend and backup: bounded so that an authenticated but
// misbehaving primary cannot make a backup run threads without end.
constexpr size_t kMaxPlacers = 256;

// A storage failure of the periodic persist ends the session like a protocol error: the primary
// reconnects and resumes where the durable copy ends.
void BackupServer::Session::Run() {
  Status s = port_.Init();
  auto interval = std::chrono::milliseconds(server_->options_.persist_interval_ms);
  auto next_persist = std::chrono::steady_clock::now() + interval;
  // What the persists left off their path (a standby's pg_wal fsync) waits for a pause in the
  // requests, or kSettleEvery at most: settling after every request put a second fsync in
  // front of each remote_flush round's FLUSH.
  constexpr auto kSettleEvery = std::chrono::milliseconds(20);
  bool settle_pending = false;
  auto settle_by = std::chrono::steady_clock::now();
  while (s.ok() && !stop_.load()) {
    // A placer link has nothing to answer: it only waits for its end (a stop comes with a
    // disconnect, which ends the wait at once), without waking a backup 20 times a second
    // per committing backend of the primary.
    s = port_.Poll(is_placer_ ? 500 : settle_pending ? 2 : 50, nullptr);
    Message m;
    bool handled = false;
    while (s.ok() && port_.Next(&m)) {
      s = Handle(m);
      handled = true;
    }
    auto now = std::chrono::steady_clock::now();
    if (s.ok() && interval.count() > 0 && now >= next_persist) {
      s = PersistOpen();
      next_persist = std::chrono::steady_clock::now() + interval;
      handled = true;
    }
    if (handled && !settle_pending) {
      settle_pending = true;
      settle_by = now + kSettleEvery;
    }
    if (s.ok() && settle_pending && (!handled || now >= settle_by)) {
      s = server_->store_->Settle();
      settle_pending = false;
    }
  }
  if (!s.ok() && !stop_.load() && s.code() != Status::Code::kDisconnected) {
    server_->RecordError("primary " + primary() + ": " + s.ToString());
  }
  Shutdown();
  finished_.store(true);
}

Status BackupServer::Session::Handle(const Message& message) {
  if (is_placer_) return Status::InvalidArgument("a placer link sends nothing after JOIN");
  if (const auto* m = std::get_if<Hello>(&message)) return OnHello(*m);
  if (const auto* m = std::get_if<replication::Join>(&message)) return OnJoin(*m);
  if (primary().empty()) return Status::InvalidArgument("a request before HELLO");
  if (const auto* m = std::get_if<Open>(&message)) return OnOpen(*m);
  if (const auto* m = std::get_if<Close>(&message)) return OnClose(*m);
  if (const auto* m = std::get_if<Flush>(&message)) return OnFlush(*m);
  return Status::InvalidArgument("a message a primary does not send");
}

std::string BackupServer::Session::ClusterMismatch(uint64_t system_id) const {
  const uint64_t mine = server_->options_.system_id;
  if (mine == 0 || system_id == mine) return "";
  return "this backup copies the cluster with system identifier " + std::to_string(mine) +
         ", not " + std::to_string(system_id);
}

// Checks cluster and version, registers this primary's share of pre-zeroed buffers, and tells
// where the durable copy of its WAL ends.
Status BackupServer::Session::OnHello(const Hello& hello) {
  if (!primary().empty()) return Status::InvalidArgument("a second HELLO");
  const BackupOptions& o = server_->options_;
  if (std::string why = ClusterMismatch(hello.system_id); !why.empty()) {
    return Refuse(ErrorCode::kWrongCluster, why);
  }
  if (o.timeline != 0 && hello.timeline != 0 && hello.timeline != o.timeline) {
    return Refuse(ErrorCode::kWrongTimeline,
                  "this backup replays WAL timeline " + std::to_string(o.timeline) +
                      " but primary " + hello.primary + " writes timeline " +
                      std::to_string(hello.timeline) +
                      ": it was seeded before a failover; seed it again from this primary");
  }
  uint64_t seen = 0;
  {
    std::lock_guard<std::mutex> lock(server_->version_mu_);
    Status s = server_->store_->LoadVersion(hello.primary, &seen);
    if (!s.ok()) return Refuse(ErrorCode::kStorage, s.ToString());
    if (hello.version < seen) {
      return Refuse(ErrorCode::kStaleVersion, "primary " + hello.primary + " has version " +
                                                  std::to_string(hello.version) +
                                                  " but this backup has seen version " +
                                                  std::to_string(seen) + ": reseed it");
    }
    if (hello.version > seen) {
      s = server_->store_->SaveVersion(hello.primary, hello.version);
      if (!s.ok()) return Refuse(ErrorCode::kStorage, s.ToString());
      seen = hello.version;
    }
  }
  // An older session of the same primary (a link that dropped and came back) ends first.
  server_->EndSessions(hello.primary, this);
  uint32_t granted = server_->TakeBuffers(o.buffers_per_primary);
  if (granted == 0) return Refuse(ErrorCode::kNoBuffer, "the backup has no free buffers");
  std::vector<Buffer> buffers(granted);
  uint32_t allocated = 0;
  Status s;
  for (; allocated < granted; allocated++) {
    s = connection_->AllocateRegion(o.buffer_size, rdma::kRemoteWrite, &buffers[allocated].region);
    if (!s.ok()) break;
  }
  if (!s.ok()) {
    for (uint32_t i = 0; i < allocated; i++) connection_->FreeRegion(buffers[i].region);
    server_->ReturnBuffers(granted);
    return Refuse(ErrorCode::kNoBuffer, "cannot register buffers: " + s.ToString());
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    primary_ = hello.primary;
    version_ = hello.version;
    buffers_ = std::move(buffers);
  }
  // Asked only now that an older session has persisted its open buffers: they count.
  uint64_t resume = server_->store_->ResumePosition(hello.primary, uint32_t(StreamId::kWal));
  uint64_t index_resume =
      server_->store_->ResumePosition(hello.primary, uint32_t(StreamId::kEngineIndex));
  Status noted = server_->store_->NoteSessionStart(hello.primary, uint32_t(StreamId::kEngineIndex),
                                                   index_resume);
  if (!noted.ok()) return Refuse(ErrorCode::kStorage, noted.ToString());
  return Reply(HelloOk{seen, o.buffer_size, granted, resume, index_resume});
}

Status BackupServer::Session::OnOpen(const Open& open) {
  std::lock_guard<std::mutex> lock(mu_);
  for (uint32_t i = 0; i < buffers_.size(); i++) {
    Buffer& b = buffers_[i];
    if (b.open) continue;
    b.open = true;
    b.durable = ScanPoint{};
    b.scanned = ScanPoint{};
    b.segment = SegmentId{primary_, open.stream, open.sequence, open.start};
    // Shared before the primary learns of the buffer, so that no backend's append finds it
    // missing; a placer that cannot take it ends (its backend reconnects).
    for (auto it = placers_.begin(); it != placers_.end();) {
      if (ShareLocked(&*it, i).ok()) {
        ++it;
      } else {
        RevokeLocked(&*it, kAll);
        it->session->RequestStop();
        it->session->connection_->Disconnect();
        it = placers_.erase(it);
      }
    }
    rdma::RemoteRegion r = connection_->Describe(b.region);
    return Reply(OpenOk{i, r.addr, r.length, r.rkey});
  }
  return Refuse(ErrorCode::kNoBuffer, "all " + std::to_string(buffers_.size()) +
                                          " buffers of primary " + primary_ + " are open");
}

engine::LogScan BackupServer::Session::ScanFromDurable(Buffer* b) {
  return ScanBuffer(b->region.addr, uint32_t(b->region.length), b->segment.stream,
                    b->segment.sequence, b->durable);
}

// Nothing new is persisted again; a closed buffer is persisted even so (its store may finish
// the segment). A scan that found less than is durable (a header damaged since) persists
// nothing new.
Status BackupServer::Session::Persist(Buffer* b, const engine::LogScan& scan, bool closed) {
  bool grew = scan.valid_end > b->durable.offset;
  if (!grew && !closed) return Status::OK();
  static const std::vector<engine::ScannedRecord> kNone;
  uint32_t to = grew ? scan.valid_end : b->durable.offset;
  Status s = server_->store_->Persist(b->segment, b->region.addr, b->durable.offset, to,
                                      grew ? scan.records : kNone, closed);
  if (s.ok() && grew) {
    b->durable = ScanPoint{scan.valid_end, scan.chain};
    if (b->scanned.offset < b->durable.offset) b->scanned = b->durable;
  }
  return s;
}

Status BackupServer::Session::PersistPrefix(Buffer* b, bool closed, uint32_t* valid) {
  engine::LogScan scan = ScanFromDurable(b);
  *valid = scan.valid_end;
  return Persist(b, scan, closed);
}

Status BackupServer::Session::PersistOpen() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Buffer& b : buffers_) {
    if (!b.open) continue;
    uint32_t valid;
    Status s = PersistPrefix(&b, false, &valid);
    if (!s.ok()) return s;
  }
  return Status::OK();
}

// The length must be exactly the valid prefix: a primary never closes at anything else.
Status BackupServer::Session::OnClose(const Close& close) {
  std::lock_guard<std::mutex> lock(mu_);
  if (close.buffer >= buffers_.size() || !buffers_[close.buffer].open) {
    return Refuse(ErrorCode::kUnknownBuffer,
                  "buffer " + std::to_string(close.buffer) + " is not open");
  }
  Buffer& b = buffers_[close.buffer];
  RevokeFromPlacersLocked(close.buffer);
  engine::LogScan scan = ScanFromDurable(&b);
  if (scan.valid_end != close.length) {
    return Refuse(ErrorCode::kBadLength, "close at " + std::to_string(close.length) +
                                             " but the valid prefix ends at " +
                                             std::to_string(scan.valid_end));
  }
  Status s = Persist(&b, scan, true);
  if (!s.ok()) return Refuse(ErrorCode::kStorage, s.ToString());
  RenewLocked(&b);
  b.open = false;
  return Reply(CloseOk{close.buffer});
}

Status BackupServer::Session::OnFlush(const Flush& flush) {
  std::lock_guard<std::mutex> lock(mu_);
  if (flush.buffer >= buffers_.size() || !buffers_[flush.buffer].open) {
    return Refuse(ErrorCode::kUnknownBuffer,
                  "buffer " + std::to_string(flush.buffer) + " is not open");
  }
  Buffer& b = buffers_[flush.buffer];
  uint32_t valid;
  Status s = PersistPrefix(&b, false, &valid);
  if (!s.ok()) return Refuse(ErrorCode::kStorage, s.ToString());
  if (valid < flush.length) {
    return Refuse(ErrorCode::kBadLength, "flush to " + std::to_string(flush.length) +
                                             " but the valid prefix ends at " +
                                             std::to_string(valid));
  }
  return Reply(FlushOk{flush.buffer, b.durable.offset});
}

void BackupServer::Session::Shutdown() {
  if (is_placer_) {
    if (auto owner = owner_.lock()) owner->RemovePlacer(this);
    connection_->Disconnect();
    return;
  }
  {
    // The placer links first: once revoked, their late WRITEs land nowhere.
    std::lock_guard<std::mutex> lock(mu_);
    ending_ = true;
    RevokeFromPlacersLocked(kAll);
    for (Placer& p : placers_) {
      p.session->RequestStop();
      p.session->connection_->Disconnect();
    }
    placers_.clear();
  }
  connection_->Disconnect();  // no WRITE lands after this
  std::vector<std::string> errors;
  uint32_t returned;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Buffer& b : buffers_) {
      if (b.open) {
        uint32_t valid;
        Status s = PersistPrefix(&b, false, &valid);
        if (!s.ok()) errors.push_back("primary " + primary_ + ": " + s.ToString());
      }
      connection_->FreeRegion(b.region);
    }
    returned = uint32_t(buffers_.size());
    buffers_.clear();
  }
  Status s = server_->store_->Settle();
  if (!s.ok()) errors.push_back("primary " + primary() + ": " + s.ToString());
  // The server's lock is taken only without the session's (Buffers() nests them the other way).
  for (const std::string& e : errors) server_->RecordError(e);
  server_->ReturnBuffers(returned);
}

// A JOIN is refused unless a live session of that primary at exactly that version exists here:
// a placer of an older or newer incarnation of the primary never reaches today's buffers.
Status BackupServer::Session::OnJoin(const replication::Join& join) {
  if (!primary().empty()) return Status::InvalidArgument("a JOIN after HELLO");
  if (std::string why = ClusterMismatch(join.system_id); !why.empty()) {
    return Refuse(ErrorCode::kWrongCluster, why);
  }
  std::shared_ptr<Session> owner = server_->FindSession(join.primary, join.version);
  if (!owner) {
    return Refuse(ErrorCode::kNoSession, "no session of primary " + join.primary + " at version " +
                                             std::to_string(join.version));
  }
  uint32_t registered = 0;
  is_placer_ = true;  // before AddPlacer: from then on the owner may stop this session
  owner_ = owner;
  Status s = owner->AddPlacer(shared_from_this(), &registered);
  if (!s.ok()) {
    is_placer_ = false;
    owner_.reset();
    return Refuse(s.code() == Status::Code::kInvalidArgument ? ErrorCode::kCannotShare
                                                             : ErrorCode::kNoSession,
                  s.ToString());
  }
  return Reply(JoinOk{registered});
}

Status BackupServer::Session::AddPlacer(const std::shared_ptr<Session>& placer,
                                        uint32_t* registered) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ending_) return Status::Unavailable("the session is ending");
  if (placers_.size() >= kMaxPlacers) {
    return Status::Unavailable("too many placer links for one session");
  }
  Placer p{placer, std::vector<rdma::LocalRegion>(buffers_.size())};
  *registered = 0;
  for (uint32_t i = 0; i < buffers_.size(); i++) {
    if (!buffers_[i].open) continue;
    Status s = ShareLocked(&p, i);
    if (!s.ok()) {
      RevokeLocked(&p, kAll);
      return s;
    }
    ++*registered;
  }
  placers_.push_back(std::move(p));
  return Status::OK();
}

void BackupServer::Session::RemovePlacer(const Session* placer) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = placers_.begin(); it != placers_.end(); ++it) {
    if (it->session.get() == placer) {
      RevokeLocked(&*it, kAll);
      placers_.erase(it);
      return;
    }
  }
}

Status BackupServer::Session::ShareLocked(Placer* placer, uint32_t buffer) {
  const rdma::LocalRegion& r = buffers_[buffer].region;
  return placer->session->connection_->RegisterShared(r.addr, r.length, rdma::kRemoteWrite, r.rkey,
                                                      &placer->shared[buffer]);
}

void BackupServer::Session::RevokeLocked(Placer* placer, uint32_t buffer) {
  for (uint32_t i = 0; i < placer->shared.size(); i++) {
    if ((buffer == kAll || i == buffer) && placer->shared[i].lkey != 0) {
      placer->session->connection_->FreeRegion(placer->shared[i]);
      placer->shared[i] = rdma::LocalRegion{};
    }
  }
}

// Where the transport shares buffers with placer links (tcp), a closed buffer gets fresh memory
// under a fresh key: a frame a backend aimed at this segment can then never land in a later
// one, whatever becomes of it. Fresh anonymous pages are zero, and cost no memset. Elsewhere
// (or if no memory is left for the swap) the buffer is zeroed in place.
void BackupServer::Session::RenewLocked(Buffer* b) {
  if (connection_->backend() == "tcp") {
    rdma::LocalRegion fresh;
    if (connection_->AllocateRegion(b->region.length, rdma::kRemoteWrite, &fresh).ok()) {
      connection_->FreeRegion(b->region);
      b->region = fresh;
      return;
    }
  }
  std::memset(b->region.addr, 0, b->region.length);
}

void BackupServer::Session::RevokeFromPlacersLocked(uint32_t buffer) {
  for (Placer& p : placers_) RevokeLocked(&p, buffer);
}

// Each buffer is scanned from the furthest valid end found before, which moves on.
void BackupServer::Session::AppendStatus(std::vector<BufferStatus>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  for (uint32_t i = 0; i < buffers_.size(); i++) {
    Buffer& b = buffers_[i];
    if (!b.open) continue;
    engine::LogScan scan = ScanBuffer(b.region.addr, uint32_t(b.region.length), b.segment.stream,
                                      b.segment.sequence, b.scanned);
    if (scan.valid_end > b.scanned.offset) b.scanned = ScanPoint{scan.valid_end, scan.chain};
    out->push_back(BufferStatus{primary_, i, b.segment.stream, b.segment.sequence, b.segment.start,
                                scan.valid_end, b.durable.offset});
  }
}

// A buffer stays open (and its segment listed) while Shutdown persists it.
void BackupServer::Session::AppendOpen(std::vector<SegmentId>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Buffer& b : buffers_) {
    if (b.open) out->push_back(b.segment);
  }
}

// ---------------------------------------------------------------------------------------------

BackupServer::BackupServer(const BackupOptions& options, BackupStore* store)
    : options_(options), store_(store), free_buffers_(options.buffers) {}

BackupServer::~BackupServer() {
  Stop();
}

Status BackupServer::CheckOptions() const {
  if (options_.buffers == 0 || options_.buffers_per_primary == 0) {
    return Status::InvalidArgument("a backup needs at least one buffer");
  }
  if (!IsValidBufferSize(options_.buffer_size)) {
    return Status::InvalidArgument("buffer_size must be a power of two from 64 kB to 1 GB");
  }
  return Status::OK();
}

Status BackupServer::Start() {
  Status s = CheckOptions();
  if (!s.ok()) return s;
  free_buffers_ = options_.buffers;
  s = rdma::Listen(options_.transport, options_.address, &listener_);
  if (!s.ok()) return s;
  acceptor_ = std::thread(&BackupServer::AcceptLoop, this);
  return Status::OK();
}

// Sessions served this way are reaped by Stop (or by the acceptor, when there is one).
Status BackupServer::Serve(std::unique_ptr<rdma::Connection> connection) {
  Status s = CheckOptions();
  if (!s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_.load()) return Status::InvalidArgument("the backup server is stopping");
  AddSessionLocked(std::move(connection));
  return Status::OK();
}

void BackupServer::AddSessionLocked(std::unique_ptr<rdma::Connection> connection) {
  auto session = std::make_shared<Session>(this, std::move(connection));
  session->Start();
  sessions_.push_back(std::move(session));
}

void BackupServer::Stop() {
  if (stopping_.exchange(true)) return;
  if (acceptor_.joinable()) acceptor_.join();
  std::vector<std::shared_ptr<Session>> sessions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    sessions.swap(sessions_);
  }
  for (auto& s : sessions) s->RequestStop();
  for (auto& s : sessions) s->Join();
  listener_.reset();
}

std::string BackupServer::address() const {
  return listener_ ? listener_->address() : "";
}

void BackupServer::AcceptLoop() {
  while (!stopping_.load()) {
    std::unique_ptr<rdma::Connection> connection;
    Status s = listener_->Accept(100, &connection);
    std::vector<std::shared_ptr<Session>> finished;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = sessions_.begin(); it != sessions_.end();) {
        if ((*it)->finished()) {
          finished.push_back(std::move(*it));
          it = sessions_.erase(it);
        } else {
          ++it;
        }
      }
      if (s.ok()) AddSessionLocked(std::move(connection));
    }
    for (auto& f : finished) f->Join();  // outside the lock
    if (!s.ok() && s.code() != Status::Code::kTimeout && !stopping_.load()) {
      RecordError("accept: " + s.ToString());
    }
  }
}

Status BackupServer::Fence(const std::string& primary) {
  if (EndSessions(primary, nullptr) == 0) {
    return Status::InvalidArgument("no session of primary " + primary);
  }
  return Status::OK();
}

// Placer links never match: they have no primary of their own.
std::shared_ptr<BackupServer::Session> BackupServer::FindSession(const std::string& primary,
                                                                 uint64_t version) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& s : sessions_) {
    if (!s->finished() && s->Serves(primary, version)) return s;
  }
  return nullptr;
}

// Ends every live session of `primary` but `keep`, and waits until each has persisted its
// open buffers and freed its regions.
size_t BackupServer::EndSessions(const std::string& primary, const Session* keep) {
  std::vector<std::shared_ptr<Session>> targets;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& s : sessions_) {
      if (s.get() != keep && !s->finished() && s->primary() == primary) targets.push_back(s);
    }
  }
  for (auto& s : targets) s->RequestStop();
  for (auto& s : targets) {
    while (!s->finished()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return targets.size();
}

std::vector<BufferStatus> BackupServer::Buffers() {
  std::vector<BufferStatus> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& s : sessions_) {
    if (!s->finished()) s->AppendStatus(&out);
  }
  return out;
}

// The open segments are listed under the server's lock, so no session is missed: a session
// leaves sessions_ only once finished (its buffers persisted, none open), or in Stop, which is
// why a prune after stopping_ is set does nothing. A buffer opened after the listing holds WAL
// from the primary's resume position on, and the store keeps any file persisted while it prunes.
Status BackupServer::Prune(uint64_t upto, PruneStats* removed) {
  if (removed != nullptr) *removed = PruneStats{};
  std::vector<SegmentId> open;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_.load()) return Status::OK();
    for (auto& s : sessions_) s->AppendOpen(&open);
  }
  return store_->Prune(uint32_t(StreamId::kWal), upto, open, removed);
}

std::vector<std::string> BackupServer::Primaries() {
  std::vector<std::string> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& s : sessions_) {
    std::string p = s->finished() ? std::string() : s->primary();
    if (!p.empty()) out.push_back(p);
  }
  return out;
}

std::vector<std::string> BackupServer::Errors() {
  std::lock_guard<std::mutex> lock(mu_);
  return errors_;
}

void BackupServer::RecordError(const std::string& error) {
  std::lock_guard<std::mutex> lock(mu_);
  if (errors_.size() == 32) errors_.erase(errors_.begin());
  errors_.push_back(error);
}

uint32_t BackupServer::TakeBuffers(uint32_t want) {
  std::lock_guard<std::mutex> lock(mu_);
  uint32_t got = std::min(want, free_buffers_);
  free_buffers_ -= got;
  return got;
}

void BackupServer::ReturnBuffers(uint32_t count) {
  std::lock_guard<std::mutex> lock(mu_);
  free_buffers_ += count;
}

}  // namespace slipstream::replication
