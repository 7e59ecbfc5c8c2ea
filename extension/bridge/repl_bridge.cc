// repl_bridge.cc: the replication library behind the C interface of repl_bridge.h. Every entry
// point catches C++ exceptions; errors are written into the caller's buffer.
#include "repl_bridge.h"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>

#include "bridge_internal.h"
#include "slipstream/replication/backup_link.h"
#include "slipstream/replication/backup_server.h"
#include "slipstream/replication/direct_append.h"
#include "slipstream/replication/index_stream.h"
#include "slipstream/replication/placer_link.h"
#include "slipstream/replication/stream_shipper.h"
#include "slipstream/replication/wal_directory_store.h"

namespace repl = slipstream::replication;

namespace {

// The store of a standby that imports its engine's levels: the WAL goes into pg_wal
// (WalDirectoryStore) and the index stream to an IndexStore whose replica is this process's
// engine, each keeping its own images.
class ImportingStore : public repl::BackupStore {
 public:
  ImportingStore(std::unique_ptr<repl::WalDirectoryStore> wal,
                 std::unique_ptr<repl::IndexStore> index)
      : wal_(std::move(wal)), index_(std::move(index)) {}

  repl::Status Persist(const repl::SegmentId& segment, const char* image, uint32_t from,
                       uint32_t to, const std::vector<slipstream::engine::ScannedRecord>& records,
                       bool closed) override {
    return Route(segment.stream)->Persist(segment, image, from, to, records, closed);
  }
  repl::Status Settle() override { return wal_->Settle(); }
  repl::Status LoadVersion(const std::string& primary, uint64_t* version) override {
    return wal_->LoadVersion(primary, version);
  }
  repl::Status SaveVersion(const std::string& primary, uint64_t version) override {
    return wal_->SaveVersion(primary, version);
  }
  uint64_t ResumePosition(const std::string& primary, uint32_t stream) override {
    return Route(stream)->ResumePosition(primary, stream);
  }
  repl::Status NoteSessionStart(const std::string& primary, uint32_t stream,
                                uint64_t position) override {
    return Route(stream)->NoteSessionStart(primary, stream, position);
  }
  // With the WAL's images go the index stream's that hold only what the replica installed
  // (IndexStore::Recover feeds it again from its last install).
  repl::Status Prune(uint32_t stream, uint64_t upto, const std::vector<repl::SegmentId>& open,
                     repl::PruneStats* removed) override {
    if (stream == uint32_t(repl::StreamId::kEngineIndex)) {
      if (removed != nullptr) *removed = repl::PruneStats{};
      return repl::Status::OK();
    }
    repl::Status s = wal_->Prune(stream, upto, open, removed);
    repl::PruneStats index_removed;
    repl::Status t = index_->PruneInstalled(open, &index_removed);
    if (removed != nullptr) {
      removed->files += index_removed.files;
      removed->bytes += index_removed.bytes;
    }
    return s.ok() ? t : s;
  }

  repl::WalDirectoryStore* wal() { return wal_.get(); }
  repl::IndexStore* index() { return index_.get(); }

 private:
  repl::BackupStore* Route(uint32_t stream) {
    if (stream == uint32_t(repl::StreamId::kEngineIndex)) return index_.get();
    return wal_.get();
  }

  std::unique_ptr<repl::WalDirectoryStore> wal_;
  std::unique_ptr<repl::IndexStore> index_;
};

}  // namespace

struct SsBackupServer {
  std::unique_ptr<repl::BackupStore> store;
  repl::WalDirectoryStore* wal_store = nullptr;  // the store, when it writes into pg_wal
  repl::IndexStore* index_store = nullptr;       // the store, when it imports
  std::unique_ptr<repl::BackupServer> server;
};

struct SsBackupConn {
  std::unique_ptr<repl::BackupLink> link;
  std::unique_ptr<repl::StreamShipper> shipper;
  std::unique_ptr<repl::StreamShipper> index;  // the index stream (Send-Index backups)
};

// A connect on a thread of its own (ss_backup_connect_begin): status and conn are the
// thread's until it sets done, then the shipper's.
struct SsBackupConnecting {
  std::thread thread;
  std::atomic<bool> done{false};
  repl::Status status;
  std::unique_ptr<SsBackupConn> conn;
};

namespace {

// A standby replays only what its backup server has persisted into pg_wal: open buffers are
// persisted this often, so that hot-standby reads trail the primary by about this much.
constexpr uint32_t kStandbyPersistIntervalMs = 100;

// How long the shipper's connect (and authentication) to a backup may take: a backup on this
// network answers in milliseconds. The connect runs on a thread of its own, so a backup that
// does not answer (a host that is down, a process that is stopped) holds up no other backup.
constexpr int kShipperConnectTimeoutMs = 1000;

// How long the shipper's append waits for a backup that acknowledges none of the WRITEs in
// flight before it gives the backup up: the second a committing backend's placer link waits
// (commit_wait.c), since the shipper holds place_lock meanwhile and every commit waits too.
constexpr int kShipperAppendTimeoutMs = 1000;

// Copies a message into a caller's error buffer (SS_REPL_ERROR_SIZE bytes).
void SetError(char* error, const std::string& message) {
  if (error != nullptr) std::snprintf(error, SS_REPL_ERROR_SIZE, "%s", message.c_str());
}

// Runs `body`, turning a failed status or any exception into false and a message.
template <typename Body>
bool Guard(char* error, Body body) {
  try {
    repl::Status s = body();
    if (!s.ok()) SetError(error, s.ToString());
    return s.ok();
  } catch (const std::exception& e) {
    SetError(error, std::string("internal error: ") + e.what());
  } catch (...) {
    SetError(error, "internal error");
  }
  return false;
}

// The stream of a connection, or an error when ss_backup_start has not made it yet.
repl::Status Shipper(SsBackupConn* conn, repl::StreamShipper** shipper) {
  *shipper = conn->shipper.get();
  return *shipper != nullptr ? repl::Status::OK()
                             : repl::Status::InvalidArgument("the WAL stream is not started");
}

// Blocks every signal while it lives: threads started meanwhile (transport agents, backup
// sessions) inherit the mask, so PostgreSQL's signal handlers only ever run on its own thread.
class BlockSignals {
 public:
  BlockSignals() {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &saved_);
  }
  ~BlockSignals() { pthread_sigmask(SIG_SETMASK, &saved_, nullptr); }

 private:
  sigset_t saved_;
};

}  // namespace

extern "C" {

bool ss_backup_server_start(const SsBackupServerOptions* options, SsBackupServer** server,
                            char* bound, size_t bound_size, char* error) {
  BlockSignals blocked;
  return Guard(error, [&] {
    auto s = std::make_unique<SsBackupServer>();
    if (options->wal_directory != nullptr) {
      repl::WalDirectoryOptions w;
      w.image_directory = options->directory;
      w.wal_directory = options->wal_directory;
      w.timeline = options->timeline;
      w.segment_size = options->wal_segment_size;
      w.resume = options->resume_lsn;
      std::unique_ptr<repl::WalDirectoryStore> store;
      repl::Status st = repl::WalDirectoryStore::Open(w, &store);
      if (!st.ok()) return st;
      s->wal_store = store.get();
      if (options->import_index) {
        slipstream::engine::Engine* replica = ss_bridge_engine();
        if (replica == nullptr) {
          return repl::Status::InvalidArgument("the engine is not open in the backup worker");
        }
        auto index = std::make_unique<repl::IndexStore>(std::string(options->directory) + "_index",
                                                        replica, "", 0);
        // What was imported after the last install did not survive a restart: fed again
        // before any primary connects.
        st = index->Recover();
        if (!st.ok()) return st;
        s->index_store = index.get();
        s->store = std::make_unique<ImportingStore>(std::move(store), std::move(index));
      } else {
        s->store = std::move(store);
      }
    } else {
      s->store = std::make_unique<repl::FileBackupStore>(options->directory);
    }
    repl::BackupOptions o;
    o.address = options->listen;
    o.transport.secret = options->secret;
    o.system_id = options->system_id;
    if (options->wal_directory != nullptr) o.timeline = options->timeline;
    o.buffers = options->buffers;
    o.buffers_per_primary = options->buffers < 4 ? options->buffers : 4;
    o.buffer_size = options->buffer_size;
    if (s->wal_store != nullptr) o.persist_interval_ms = kStandbyPersistIntervalMs;
    s->server = std::make_unique<repl::BackupServer>(o, s->store.get());
    repl::Status st = s->server->Start();
    if (!st.ok()) return st;
    std::snprintf(bound, bound_size, "%s", s->server->address().c_str());
    *server = s.release();
    return repl::Status::OK();
  });
}

bool ss_backup_server_import_status(SsBackupServer* server, SsImportStatus* status) {
  try {
    if (server->index_store == nullptr) return false;
    repl::ImportProgress p = server->index_store->Progress();
    status->applied_end = p.applied_end;
    status->installed = p.installed;
    status->horizon = p.horizon;
    status->refused = p.refused;
    status->awaiting_seed = p.awaiting_seed;
    status->segments = p.segments;
    status->segment_bytes = p.segment_bytes;
    status->rewrite_nanos = p.rewrite_nanos;
    SetError(status->error, p.error.ok() ? std::string() : p.error.ToString());
    return true;
  } catch (...) {
    return false;
  }
}

uint64_t ss_backup_server_stop(SsBackupServer* server) {
  uint64_t wal_end = 0;
  try {
    // The server first: it persists the open buffers into the store, which is then settled.
    server->server.reset();
    if (server->wal_store != nullptr && server->wal_store->Settle().ok()) {
      wal_end = server->wal_store->WalEnd();
    }
  } catch (...) {
  }
  try {
    delete server;
  } catch (...) {
  }
  return wal_end;
}

int ss_backup_server_buffers(SsBackupServer* server, SsBufferRow* rows, int max) {
  try {
    int n = 0;
    for (const repl::BufferStatus& b : server->server->Buffers()) {
      if (n == max) break;
      SsBufferRow& r = rows[n++];
      std::snprintf(r.primary, sizeof(r.primary), "%s", b.primary.c_str());
      r.buffer = b.buffer;
      r.stream = b.stream;
      r.sequence = b.sequence;
      r.start = b.start;
      r.valid = b.valid;
      r.durable = b.durable;
    }
    return n;
  } catch (...) {
    return 0;
  }
}

bool ss_backup_server_fence(SsBackupServer* server, const char* primary, char* error) {
  return Guard(error, [&] { return server->server->Fence(primary); });
}

bool ss_backup_server_last_error(SsBackupServer* server, char* error) {
  try {
    std::vector<std::string> errors = server->server->Errors();
    if (errors.empty()) return false;
    SetError(error, errors.back());
    return true;
  } catch (...) {
    return false;
  }
}

uint64_t ss_backup_server_wal_end(SsBackupServer* server) {
  try {
    return server->wal_store != nullptr ? server->wal_store->WalEnd() : 0;
  } catch (...) {
    return 0;
  }
}

// The count is set before anything can throw, so a caller reads a defined value on failure.
bool ss_backup_server_prune(SsBackupServer* server, uint64_t upto, uint64_t* removed_files,
                            char* error) {
  *removed_files = 0;
  return Guard(error, [&] {
    repl::PruneStats removed;
    repl::Status s = server->server->Prune(upto, &removed);
    *removed_files = removed.files;
    return s;
  });
}

bool ss_backup_connect_begin(const char* address, const char* transport, const char* secret,
                             uint64_t system_id, uint32_t timeline, uint64_t version,
                             const char* primary, SsBackupConnecting** attempt, char* error) {
  *attempt = nullptr;
  BlockSignals blocked;  // the attempt's thread, and the link's threads after it, inherit it
  return Guard(error, [&] {
    repl::LinkOptions o;
    o.address = address;
    o.transport.backend = transport;
    o.transport.secret = secret;
    o.transport.connect_timeout_ms = kShipperConnectTimeoutMs;
    o.append_timeout_ms = kShipperAppendTimeoutMs;
    o.system_id = system_id;
    o.timeline = timeline;
    o.version = version;
    o.primary = primary;
    auto a = std::make_unique<SsBackupConnecting>();
    SsBackupConnecting* raw = a.get();
    raw->thread = std::thread([raw, o] {
      auto c = std::make_unique<SsBackupConn>();
      repl::Status s;
      try {
        s = repl::BackupLink::Connect(o, &c->link);
      } catch (const std::exception& e) {
        s = repl::Status::IOError(std::string("internal error: ") + e.what());
      } catch (...) {
        s = repl::Status::IOError("internal error");
      }
      raw->status = s;
      if (s.ok()) raw->conn = std::move(c);
      raw->done.store(true, std::memory_order_release);
    });
    *attempt = a.release();
    return repl::Status::OK();
  });
}

int ss_backup_connect_poll(SsBackupConnecting* attempt, SsBackupConn** conn, uint64_t* resume,
                           char* error) {
  *conn = nullptr;
  *resume = 0;
  if (!attempt->done.load(std::memory_order_acquire)) return 0;
  int ended = -1;
  try {
    attempt->thread.join();  // it has set done: it is leaving
    if (attempt->status.ok()) {
      *resume = attempt->conn->link->resume();
      *conn = attempt->conn.release();
      ended = 1;
    } else {
      SetError(error, attempt->status.ToString());
    }
  } catch (const std::exception& e) {
    SetError(error, std::string("internal error: ") + e.what());
  } catch (...) {
    SetError(error, "internal error");
  }
  ss_backup_connect_abandon(attempt);
  return ended;
}

void ss_backup_connect_abandon(SsBackupConnecting* attempt) {
  try {
    if (attempt->thread.joinable()) attempt->thread.join();
    delete attempt;  // with a connection it made, if nobody took it
  } catch (...) {
  }
}

bool ss_backup_start(SsBackupConn* conn, uint64_t start_lsn, char* error) {
  return Guard(error, [&] {
    if (conn->shipper) return repl::Status::InvalidArgument("the WAL stream is started already");
    // Segment sequences start at the WAL position: unique across reconnects, in WAL order.
    conn->shipper =
        std::make_unique<repl::StreamShipper>(uint32_t(repl::StreamId::kWal), start_lsn, start_lsn,
                                              std::vector<repl::BackupLink*>{conn->link.get()});
    return repl::Status::OK();
  });
}

static_assert(sizeof(repl::SharedCursor) <= sizeof(SsDirectCursor::storage));
static_assert(std::is_trivially_copyable_v<repl::SharedCursor>);

// A process's way into one backup's open buffer: a mapping of its heap (shm) or a placer link
// (tcp), made on first use and replaced when the backup changes or the link fails.
struct SsDirectWriter {
  std::unique_ptr<repl::ShmDirectTarget> shm;
  std::unique_ptr<repl::PlacerLink> placer;
  std::string placer_key;  // who the placer link joined: address, version, primary
  std::chrono::steady_clock::time_point retry_after{};  // after a placer connect failed
  // How long a backend waits before it tries a placer link again after a connect failed: a
  // backup that does not answer must not cost every commit a connect timeout.
  static constexpr std::chrono::milliseconds kRetryDelay{1000};
};

// C++ helpers inside the extern "C" block keep C++ linkage (they return C++ types).
extern "C++" {
namespace {

// The cursor kept in a caller's opaque storage.
repl::SharedCursor LoadCursor(const SsDirectCursor* cursor) {
  repl::SharedCursor c;
  std::memcpy(&c, cursor->storage, sizeof(c));
  return c;
}

void StoreCursor(const repl::SharedCursor& c, SsDirectCursor* cursor) {
  std::memset(cursor->storage, 0, sizeof(cursor->storage));
  std::memcpy(cursor->storage, &c, sizeof(c));
}

}  // namespace
}  // extern "C++"

void ss_backup_export_cursor(SsBackupConn* conn, SsDirectCursor* cursor) {
  repl::SharedCursor c;
  try {
    if (conn->shipper) conn->shipper->ExportCursor(&c);
  } catch (...) {
    c = repl::SharedCursor{};
  }
  StoreCursor(c, cursor);
}

bool ss_backup_adopt_cursor(SsBackupConn* conn, const SsDirectCursor* cursor, char* error) {
  return Guard(error, [&] {
    return conn->shipper ? conn->shipper->AdoptCursor(LoadCursor(cursor)) : repl::Status::OK();
  });
}

void ss_direct_cursor_clear(SsDirectCursor* cursor) {
  StoreCursor(repl::SharedCursor{}, cursor);
}

bool ss_direct_cursor_valid(const SsDirectCursor* cursor) {
  return LoadCursor(cursor).valid != 0;
}

uint64_t ss_direct_cursor_end(const SsDirectCursor* cursor) {
  return LoadCursor(cursor).end;
}

extern "C++" {
namespace {

// The writer's target for cursor `c`, opened or replaced as needed (Unavailable while a failed
// placer connect waits out its retry delay).
repl::Status OpenTarget(const repl::SharedCursor& c, const SsPlacerIdentity* placer,
                        SsDirectWriter* w, repl::DirectTarget** target) {
  if (c.transport == uint32_t(repl::CursorTransport::kShm)) {
    w->placer.reset();
    if (!w->shm || !w->shm->Maps(c.peer)) {
      w->shm.reset();
      std::unique_ptr<slipstream::rdma::ShmPeerWriter> mapped;
      repl::Status s = slipstream::rdma::ShmPeerWriter::Open(c.peer, &mapped);
      if (!s.ok()) return s;
      w->shm = std::make_unique<repl::ShmDirectTarget>(std::move(mapped));
    }
    *target = w->shm.get();
    return repl::Status::OK();
  }
  if (c.transport != uint32_t(repl::CursorTransport::kTcp) || placer == nullptr) {
    return repl::Status::InvalidArgument("the cursor names no transport this process can use");
  }
  w->shm.reset();
  const std::string key =
      std::string(placer->address) + "/" + std::to_string(placer->version) + "/" + placer->primary;
  if (w->placer && (!w->placer->state().ok() || w->placer_key != key)) w->placer.reset();
  if (!w->placer) {
    if (std::chrono::steady_clock::now() < w->retry_after) {
      return repl::Status::Unavailable("the last placer link to this backup failed to connect");
    }
    repl::LinkOptions o;
    o.address = placer->address;
    o.transport.backend = "tcp";
    o.transport.secret = placer->secret;
    o.transport.connect_timeout_ms = placer->connect_timeout_ms;
    o.rpc_timeout_ms = placer->connect_timeout_ms;
    o.system_id = placer->system_id;
    o.version = placer->version;
    o.primary = placer->primary;
    BlockSignals blocked;  // the link's sender thread takes no PostgreSQL signal
    repl::Status s = repl::PlacerLink::Connect(o, &w->placer);
    if (!s.ok()) {
      w->retry_after = std::chrono::steady_clock::now() + SsDirectWriter::kRetryDelay;
      return s;
    }
    w->placer_key = key;
  }
  *target = w->placer.get();
  return repl::Status::OK();
}

}  // namespace
}  // extern "C++"

bool ss_direct_append(SsDirectCursor* cursor, SsDirectWriter** writer,
                      const SsPlacerIdentity* placer, uint64_t lsn, const char* data, size_t len,
                      size_t* appended, char* error) {
  *appended = 0;
  // The cursor is stored back whatever happens: after an exception too, what was placed
  // before it stays described (AppendDirect moves the cursor right after each WRITE).
  repl::SharedCursor c = LoadCursor(cursor);
  bool opened = false;
  bool ok = Guard(error, [&] {
    if (*writer == nullptr) *writer = new SsDirectWriter();
    repl::DirectTarget* target = nullptr;
    repl::Status s = OpenTarget(c, placer, *writer, &target);
    if (!s.ok()) return s;
    opened = true;
    return repl::AppendDirect(&c, target, lsn, std::string_view(data, len), appended);
  });
  // A tcp backup this process cannot connect to now is left to the shipper for this commit
  // only (its connects are spaced out); a backup that refused a WRITE, or whose heap cannot be
  // mapped, is given up until the shipper describes it again. Over tcp ss_direct_finish then
  // decides what the WRITEs posted so far count for.
  const bool tcp = c.transport == uint32_t(repl::CursorTransport::kTcp);
  if (!ok && (opened || !tcp)) c.valid = 0;
  if (ok || opened || !tcp) StoreCursor(c, cursor);
  return ok;
}

bool ss_direct_finish(SsDirectCursor* cursor, SsDirectWriter* writer, const SsDirectCursor* before,
                      int timeout_ms, int spin_us, char* error) {
  return Guard(error, [&] {
    if (writer == nullptr || !writer->placer) return repl::Status::OK();  // shm: placed already
    repl::Status s = writer->placer->Finish(timeout_ms, spin_us);
    if (!s.ok()) {
      // What was posted may still land: the shipper must not append after it (direct_append.h).
      repl::SharedCursor c = LoadCursor(before);
      c.valid = 0;
      c.broken = 1;
      StoreCursor(c, cursor);
    }
    return s;
  });
}

void ss_direct_writer_close(SsDirectWriter* writer) {
  delete writer;
}

bool ss_backup_append(SsBackupConn* conn, uint64_t lsn, const char* data, size_t len, char* error) {
  return Guard(error, [&] {
    repl::StreamShipper* shipper;
    repl::Status s = Shipper(conn, &shipper);
    return s.ok() ? shipper->Append(lsn, std::string_view(data, len)) : s;
  });
}

bool ss_backup_poll(SsBackupConn* conn, int timeout_ms, uint64_t* placed, uint64_t* durable,
                    char* error) {
  return Guard(error, [&] {
    repl::StreamShipper* shipper;
    repl::Status s = Shipper(conn, &shipper);
    if (!s.ok()) return s;
    s = shipper->Poll(timeout_ms);
    if (s.ok() && conn->index) s = conn->index->Poll(0);  // the same link: its completions
    *placed = shipper->Placed(1);
    *durable = shipper->Durable(1);
    if (s.ok() && shipper->live() == 0) s = repl::Status::Disconnected("backup lost");
    if (!s.ok() && !shipper->failures().empty()) {
      s = repl::Status::Disconnected(shipper->failures()[0]);
    }
    return s;
  });
}

int ss_backup_wait_fd(SsBackupConn* conn) {
  return conn->link ? conn->link->wait_fd() : -1;
}

bool ss_backup_flush_start(SsBackupConn* conn, int timeout_ms, char* error) {
  return Guard(error, [&] {
    repl::StreamShipper* shipper;
    repl::Status s = Shipper(conn, &shipper);
    return s.ok() ? shipper->StartFlush(timeout_ms) : s;
  });
}

bool ss_backup_flush_finish(SsBackupConn* conn, uint64_t* durable, char* error) {
  return Guard(error, [&] {
    repl::StreamShipper* shipper;
    repl::Status s = Shipper(conn, &shipper);
    return s.ok() ? shipper->FinishFlush(1, durable) : s;
  });
}

bool ss_backup_index_start(SsBackupConn* conn, uint64_t* start, char* error) {
  return Guard(error, [&] {
    if (conn->index) return repl::Status::InvalidArgument("the index stream is started already");
    uint64_t resume = conn->link->index_resume();
    // As for the WAL: segment sequences start at the stream position (1 for an empty stream).
    conn->index = std::make_unique<repl::StreamShipper>(
        uint32_t(repl::StreamId::kEngineIndex), resume == 0 ? 1 : resume, resume,
        std::vector<repl::BackupLink*>{conn->link.get()});
    *start = resume;
    return repl::Status::OK();
  });
}

bool ss_backup_index_append(SsBackupConn* conn, const char* data, size_t len, char* error) {
  return Guard(error, [&] {
    if (!conn->index) return repl::Status::InvalidArgument("the index stream is not started");
    repl::Status s = conn->index->Append(conn->index->end(), std::string_view(data, len));
    if (s.ok() && conn->index->live() == 0) s = repl::Status::Disconnected("backup lost");
    if (!s.ok() && !conn->index->failures().empty()) {
      s = repl::Status::Disconnected(conn->index->failures()[0]);
    }
    return s;
  });
}

uint64_t ss_backup_index_sent(SsBackupConn* conn) {
  return conn->index ? conn->index->end() : 0;
}

uint64_t ss_backup_index_placed(SsBackupConn* conn) {
  try {
    return conn->index ? conn->index->Placed(1) : 0;
  } catch (...) {
    return 0;
  }
}

uint64_t ss_backup_sent(SsBackupConn* conn) {
  return conn->shipper ? conn->shipper->end() : 0;
}

void ss_backup_disconnect(SsBackupConn* conn) {
  try {
    delete conn;
  } catch (...) {
  }
}

bool ss_repl_valid_name(const char* name) {
  try {
    return repl::IsValidName(name);
  } catch (...) {
    return false;
  }
}

}  // extern "C"
