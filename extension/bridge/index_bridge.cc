// index_bridge.cc: index shipping on a primary behind the C interface of index_bridge.h. The
// observer frames the engine's events (IndexEventEncoder) into the FrameQueue in shared
// memory, tagged with the WAL that covers them, and after each L0 compaction's install adds
// the WAL horizon its levels now cover, so that a backup knows where its WAL replay would
// start at a promotion (docs/replication.md, "How it plugs into PostgreSQL").
#include "index_bridge.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "bridge_internal.h"
#include "slipstream/replication/frame_queue.h"
#include "slipstream/replication/index_stream.h"

namespace engine = slipstream::engine;
namespace repl = slipstream::replication;

namespace {

// Frames events into the queue. A live observer pushes only while a backup takes the stream;
// a seed's always does. A producer waits for room up to push_wait_ms (it must not wait for
// long: it may hold engine locks a commit needs), then marks the queue overflowed, which
// makes the shipper re-seed its backups rather than let them miss a frame.
class QueueObserver : public engine::EngineObserver {
 public:
  QueueObserver(const SsIndexHooks* hooks, bool seed)
      : hooks_(hooks), seed_(seed), encoder_([this](std::string frame) { Push(frame); }, false) {}

  // Every callback runs inside engine code, which an exception must not unwind: a frame that
  // cannot be made (out of memory) marks the queue overflowed, and the backups take a seed.
  //
  // Events are encoded only while someone listens: Push would drop the frame anyway, and
  // encoding copies (and may compress) whole segments and large-log writes, which took 9% of
  // a bulk load's samples on a primary without backups. A listener that appears meanwhile
  // starts with a seed, which never needs the frames before it.
  void OnLogWrite(const engine::LogWriteEvent& e) override {
    if (!Listening()) return;
    Guarded([&] { encoder_.OnLogWrite(e); });
  }
  void OnSeedBegin() override {
    seed_horizon_ = hooks_->seed_horizon();
    Guarded([&] { encoder_.OnSeedBegin(); });
  }
  void OnSeedEnd(const std::vector<uint32_t>& level_trees) override {
    Guarded([&] { encoder_.OnSeedEnd(level_trees); });
  }
  void OnCompactionBegin(const engine::CompactionBeginEvent& e) override {
    if (e.from_l0 && !seed_) l0_begin_ = hooks_->l0_begin();
    if (Listening()) Guarded([&] { encoder_.OnCompactionBegin(e); });
  }
  void OnCompactionSegment(const engine::CompactionSegmentEvent& e) override {
    if (!Listening()) return;
    Guarded([&] { encoder_.OnCompactionSegment(e); });
  }
  void OnCompactionInstalled(const engine::CompactionInstalledEvent& e) override {
    if (Listening()) Guarded([&] { encoder_.OnCompactionInstalled(e); });
    if (e.from_l0 && !seed_) {
      // Called whether or not a backup listens: the horizons chain from install to install.
      uint64_t horizon = hooks_->l0_installed(l0_begin_);
      // Tagged at least with the horizon itself: a backup takes it only once it holds that WAL.
      if (horizon != 0) Guarded([&] { Push(repl::EncodeHorizon(horizon), horizon); });
    }
  }
  void OnCompactionAbandoned(uint64_t compaction) override {
    if (!Listening()) return;
    Guarded([&] { encoder_.OnCompactionAbandoned(compaction); });
  }
  // While a backup takes the index stream, it imports each compaction's tree whole.
  bool WantsWholeTrees() const override { return Listening(); }

  // Whether frames reach anyone: a seed's always do, a live observer's while a backup takes the
  // stream.
  bool Listening() const { return seed_ || hooks_->enabled(); }

  uint64_t seed_horizon() const { return seed_horizon_; }
  bool overflowed() const { return overflowed_; }

  // Runs `body`; an exception marks the queue overflowed instead of leaving.
  template <typename Body>
  void Guarded(Body body) {
    try {
      body();
    } catch (...) {
      overflowed_ = true;
      repl::FrameQueue::Attach(hooks_->queue)->MarkOverflowed();
    }
  }

  // Appends a frame tagged with the WAL flushed now (at least `min_tag`), waiting a little for
  // room.
  void Push(const std::string& frame, uint64_t min_tag = 0) {
    if (!seed_ && !hooks_->enabled()) return;
    repl::FrameQueue* queue = repl::FrameQueue::Attach(hooks_->queue);
    uint64_t tag = std::max(hooks_->wal_tag(), min_tag);
    auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(hooks_->push_wait_ms);
    for (;;) {
      repl::FrameQueue::PushResult r = queue->TryPush(frame, tag);
      if (r == repl::FrameQueue::PushResult::kPushed) return;
      if (r == repl::FrameQueue::PushResult::kOverflowed) break;
      if (std::chrono::steady_clock::now() >= deadline || hooks_->interrupted()) {
        queue->Push(frame, tag);  // marks the queue overflowed unless room came meanwhile
        if (!queue->overflowed()) return;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    overflowed_ = true;
  }

 private:
  const SsIndexHooks* hooks_;
  bool seed_;
  repl::IndexEventEncoder encoder_;
  uint64_t l0_begin_ = 0;
  uint64_t seed_horizon_ = 0;
  bool overflowed_ = false;
};

std::string g_frame;       // ss_index_queue_front's frame
std::string g_compressed;  // ss_index_compress's result

void SetError(char* error, size_t size, const std::string& message) {
  if (error != nullptr && size > 0) std::snprintf(error, size, "%s", message.c_str());
}

}  // namespace

extern "C" {

size_t ss_index_queue_size(uint64_t capacity) {
  return repl::FrameQueue::SizeFor(capacity);
}

void ss_index_queue_init(void* memory, uint64_t capacity) {
  try {
    repl::FrameQueue::Create(memory, capacity);
  } catch (...) {
  }
}

void* ss_index_observer_new(const SsIndexHooks* hooks) {
  try {
    return new std::shared_ptr<engine::EngineObserver>(
        std::make_shared<QueueObserver>(hooks, false));
  } catch (...) {
    return nullptr;
  }
}

bool ss_index_ship_levels(const SsIndexHooks* hooks, char* error, size_t error_size) {
  try {
    engine::Engine* e = ss_bridge_engine();
    if (e == nullptr) {
      SetError(error, error_size, "the engine is not open in this process");
      return false;
    }
    QueueObserver seed(hooks, true);
    engine::Status s = e->ShipLevels(&seed);
    if (!s.ok()) {
      SetError(error, error_size, s.ToString());
      return false;
    }
    if (seed.seed_horizon() != 0) {
      seed.Push(repl::EncodeHorizon(seed.seed_horizon()), seed.seed_horizon());
    }
    if (seed.overflowed()) {
      SetError(error, error_size, "the index frame queue overflowed during the seed");
      return false;
    }
    return true;
  } catch (const std::exception& ex) {
    SetError(error, error_size, std::string("internal error: ") + ex.what());
  } catch (...) {
    SetError(error, error_size, "internal error");
  }
  return false;
}

bool ss_index_queue_front(void* queue, const char** frame, size_t* len, uint64_t* tag) {
  try {
    if (!repl::FrameQueue::Attach(queue)->Front(&g_frame, tag)) return false;
    *frame = g_frame.data();
    *len = g_frame.size();
    return true;
  } catch (...) {
    return false;
  }
}

void ss_index_queue_pop(void* queue) {
  repl::FrameQueue::Attach(queue)->PopFront();
}

bool ss_index_queue_overflowed(void* queue) {
  return repl::FrameQueue::Attach(queue)->overflowed();
}

void ss_index_queue_clear_overflow(void* queue) {
  repl::FrameQueue::Attach(queue)->ClearOverflow();
}

uint64_t ss_index_queue_bytes(void* queue) {
  return repl::FrameQueue::Attach(queue)->bytes();
}

bool ss_index_frame_is_seed(const char* frame, size_t len) {
  return repl::IsSeedFrame(std::string_view(frame, len));
}

bool ss_index_frame_is_seed_end(const char* frame, size_t len) {
  return repl::IsSeedEndFrame(std::string_view(frame, len));
}

bool ss_index_frame_is_install(const char* frame, size_t len) {
  return repl::IsInstallFrame(std::string_view(frame, len));
}

const char* ss_index_compress(const char* frame, size_t len, size_t* out_len) {
  try {
    g_compressed = repl::CompressSegmentFrame(std::string_view(frame, len));
    *out_len = g_compressed.size();
    return g_compressed.data();
  } catch (...) {
    *out_len = len;  // sent as it is: compression is an optimization
    return frame;
  }
}

}  // extern "C"
