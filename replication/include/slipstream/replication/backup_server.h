// BackupServer: the backup side of Tailwind replication. It accepts authenticated primaries,
// registers for each a bounded set of pre-zeroed buffers, answers their open, close and
// flush requests, and makes received segments durable through a BackupStore. It never looks
// at a record while the primary writes: its CPU works only on the rare control messages, and a
// persist (close, flush, periodic) scans only the bytes appended since the last one.
//
// When a primary's connection ends (it died, or was fenced), the valid prefix of every buffer
// it held open is found by the Tailwind scan and persisted: what the primary was told was
// placed survives it.
//
// A primary's committing backends may open placer links (a JOIN instead of a HELLO, over tcp):
// its session registers each buffer it holds open on them under the buffer's own key, and
// revokes it from them before it persists and re-zeroes the buffer (close, fence, the
// session's end), so a backend appends to the very buffer the primary's shipper does.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "slipstream/rdma/transport.h"
#include "slipstream/replication/backup_store.h"
#include "slipstream/replication/wire.h"

namespace slipstream::replication {

struct BackupOptions {
  std::string address = "127.0.0.1:0";  // where primaries connect ("HOST:PORT"; 0: any port)
  rdma::TransportOptions transport;     // the shared secret lives here
  uint64_t system_id = 0;               // only primaries of this cluster are served (0: any)
  uint32_t timeline = 0;             // only primaries writing this WAL timeline are served (0: any)
  uint32_t buffers = 16;             // buffers in all, over every primary
  uint32_t buffers_per_primary = 4;  // buffers one primary may hold open at once
  uint32_t buffer_size = 8u << 20;   // bytes per buffer
  // Every this many ms the valid prefixes of open buffers are persisted too, not only on close,
  // flush and the end of a session (0: never). A standby's startup process replays only what
  // is persisted: without it, the last WAL of a quiet primary waits for the next close.
  uint32_t persist_interval_ms = 0;
};

// One buffer as the status view shows it.
struct BufferStatus {
  std::string primary;
  uint32_t buffer = 0;
  uint32_t stream = 0;
  uint64_t sequence = 0;
  uint64_t start = 0;
  uint32_t valid = 0;    // bytes of the valid prefix now (scanned on request)
  uint32_t durable = 0;  // bytes already persisted
};

class BackupServer {
 public:
  BackupServer(const BackupOptions& options, BackupStore* store);
  ~BackupServer();  // stops
  BackupServer(const BackupServer&) = delete;
  BackupServer& operator=(const BackupServer&) = delete;

  // Validates the options, listens and starts serving.
  Status Start();
  // Serves one primary on `connection`, made elsewhere (a test's or a fuzzer's scripted
  // primary), as if the listener had accepted it; Start need not have been called. Stop ends it.
  Status Serve(std::unique_ptr<rdma::Connection> connection);
  // Stops accepting, ends every session (persisting open buffers) and waits for them.
  void Stop();
  // "HOST:PORT" primaries connect to.
  std::string address() const;

  // Fences a primary: its regions are revoked (later WRITEs fail at the primary), its
  // connections closed, and the valid prefixes of its open buffers persisted. Returns when
  // all of that is done; NotFound-like InvalidArgument if it has no session.
  Status Fence(const std::string& primary);

  // The buffers held open now, with their valid prefixes scanned (each scan reads only what
  // was appended since the last).
  std::vector<BufferStatus> Buffers();

  // Prunes the WAL the store keeps at or below `upto` (BackupStore::Prune), sparing the
  // segments of every buffer a session holds open. The host vouches that the WAL below `upto`
  // is never needed again (a standby: its oldest restart point). Nothing is pruned once Stop
  // has begun. *removed (may be null) gets what went.
  Status Prune(uint64_t upto, PruneStats* removed = nullptr);

  // Primaries connected now.
  std::vector<std::string> Primaries();

  // Errors that ended sessions (malformed peers, storage failures), oldest first, at most 32.
  std::vector<std::string> Errors();

 private:
  class Session;

  void AcceptLoop();
  // Refuses options no server can run with.
  Status CheckOptions() const;
  // Starts a session on `connection` and lists it; the caller holds mu_.
  void AddSessionLocked(std::unique_ptr<rdma::Connection> connection);
  size_t EndSessions(const std::string& primary, const Session* keep);
  // The live session of `primary` at `version`, if any (a placer link's JOIN names it).
  std::shared_ptr<Session> FindSession(const std::string& primary, uint64_t version);
  void RecordError(const std::string& error);
  // Takes up to `want` buffers from the budget; returns how many it got.
  uint32_t TakeBuffers(uint32_t want);
  void ReturnBuffers(uint32_t count);

  BackupOptions options_;
  BackupStore* store_;
  std::unique_ptr<rdma::Listener> listener_;
  std::thread acceptor_;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;  // sessions_, errors_, free_buffers_, versions
  std::vector<std::shared_ptr<Session>> sessions_;
  std::vector<std::string> errors_;
  uint32_t free_buffers_ = 0;
  std::mutex version_mu_;  // one HELLO's version check and update at a time
};

}  // namespace slipstream::replication
