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

namespace repl = slipstream::replication;

struct SsBackupServer {
  std::unique_ptr<repl::FileBackupStore> store;
  std::unique_ptr<repl::BackupServer> server;
};

struct SsBackupConn {
  std::unique_ptr<repl::BackupLink> link;
  std::unique_ptr<repl::StreamShipper> shipper;
};

namespace {

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

bool ss_backup_server_start(const char* listen, const char* secret, uint32_t buffers,
                            uint32_t buffer_size, const char* directory, SsBackupServer** server,
                            char* bound, size_t bound_size, char* error) {
  BlockSignals blocked;
  return Guard(error, [&] {
    auto s = std::make_unique<SsBackupServer>();
    s->store = std::make_unique<repl::FileBackupStore>(directory);
    repl::BackupOptions o;
    o.address = listen;
    o.transport.secret = secret;
    o.buffers = buffers;
    o.buffers_per_primary = buffers < 4 ? buffers : 4;
    o.buffer_size = buffer_size;
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

bool ss_backup_connect(const char* address, const char* transport, const char* secret,
                       uint64_t system_id, uint64_t version, const char* primary,
                       uint64_t start_lsn, SsBackupConn** conn, char* error) {
  BlockSignals blocked;
  return Guard(error, [&] {
    repl::LinkOptions o;
    o.address = address;
    o.transport.backend = transport;
    o.transport.secret = secret;
    o.system_id = system_id;
    o.version = version;
    o.primary = primary;
    auto c = std::make_unique<SsBackupConn>();
    repl::Status s = repl::BackupLink::Connect(o, &c->link);
    if (!s.ok()) return s;
    // Segment sequences start at the WAL position: unique across reconnects, in WAL order.
    c->shipper =
        std::make_unique<repl::StreamShipper>(uint32_t(repl::StreamId::kWal), start_lsn, start_lsn,
                                              std::vector<repl::BackupLink*>{c->link.get()});
    *conn = c.release();
    return repl::Status::OK();
  });
}

bool ss_backup_append(SsBackupConn* conn, uint64_t lsn, const char* data, size_t len, char* error) {
  return Guard(error, [&] { return conn->shipper->Append(lsn, std::string_view(data, len)); });
}

bool ss_backup_poll(SsBackupConn* conn, int timeout_ms, uint64_t* placed, char* error) {
  return Guard(error, [&] {
    repl::Status s = conn->shipper->Poll(timeout_ms);
    *placed = conn->shipper->Placed(1);
    if (s.ok() && conn->shipper->live() == 0) s = repl::Status::Disconnected("backup lost");
    if (!s.ok() && !conn->shipper->failures().empty()) {
      s = repl::Status::Disconnected(conn->shipper->failures()[0]);
    }
    return s;
  });
}

bool ss_backup_flush(SsBackupConn* conn, int timeout_ms, uint64_t* durable, char* error) {
  return Guard(error, [&] { return conn->shipper->Flush(1, timeout_ms, durable); });
}

uint64_t ss_backup_sent(SsBackupConn* conn) {
  return conn->shipper->end();
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
