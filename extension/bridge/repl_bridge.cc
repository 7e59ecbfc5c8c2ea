// repl_bridge.cc: the replication library behind the C interface of repl_bridge.h. Every entry
// point catches C++ exceptions; errors are written into the caller's buffer.
#include "repl_bridge.h"

#include <signal.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "slipstream/replication/backup_link.h"
#include "slipstream/replication/backup_server.h"
#include "slipstream/replication/stream_shipper.h"
#include "slipstream/replication/wal_directory_store.h"

namespace repl = slipstream::replication;

struct SsBackupServer {
  std::unique_ptr<repl::BackupStore> store;
  repl::WalDirectoryStore* wal_store = nullptr;  // the store, when it writes into pg_wal
  std::unique_ptr<repl::BackupServer> server;
};

struct SsBackupConn {
  std::unique_ptr<repl::BackupLink> link;
  std::unique_ptr<repl::StreamShipper> shipper;
};

namespace {

// A standby replays only what its backup server has persisted into pg_wal: open buffers are
// persisted this often, so that hot-standby reads trail the primary by about this much.
constexpr uint32_t kStandbyPersistIntervalMs = 100;

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
      s->store = std::move(store);
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

void ss_backup_server_stop(SsBackupServer* server) {
  try {
    delete server;
  } catch (...) {
  }
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

bool ss_backup_connect(const char* address, const char* transport, const char* secret,
                       uint64_t system_id, uint32_t timeline, uint64_t version, const char* primary,
                       SsBackupConn** conn, uint64_t* resume, char* error) {
  BlockSignals blocked;
  return Guard(error, [&] {
    repl::LinkOptions o;
    o.address = address;
    o.transport.backend = transport;
    o.transport.secret = secret;
    o.system_id = system_id;
    o.timeline = timeline;
    o.version = version;
    o.primary = primary;
    auto c = std::make_unique<SsBackupConn>();
    repl::Status s = repl::BackupLink::Connect(o, &c->link);
    if (!s.ok()) return s;
    *resume = c->link->resume();
    *conn = c.release();
    return repl::Status::OK();
  });
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
    *placed = shipper->Placed(1);
    *durable = shipper->Durable(1);
    if (s.ok() && shipper->live() == 0) s = repl::Status::Disconnected("backup lost");
    if (!s.ok() && !shipper->failures().empty()) {
      s = repl::Status::Disconnected(shipper->failures()[0]);
    }
    return s;
  });
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
