// bridge.cc: the engine behind the C interface of bridge.h. No PostgreSQL headers here: every
// entry point catches C++ exceptions and returns an SsCode, so nothing unwinds into C.
#include "bridge.h"

#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "bridge_internal.h"
#include "slipstream/engine/engine.h"

namespace {

using slipstream::engine::Engine;
using slipstream::engine::Iterator;
using slipstream::engine::Options;
using slipstream::engine::PointReader;
using slipstream::engine::Status;
using slipstream::engine::WriteBatch;

std::unique_ptr<Engine> g_engine;  // this process's handle on the shared engine
// Every ss_get of this process reads through one reader, so that fetching the rows an index
// range scan yields in row id order (and a chain's versions) costs a few steps each.
std::unique_ptr<PointReader> g_reader;
std::string g_last_error;
std::string g_get_buffer;  // ss_get's result
std::string g_first_key;   // ss_first_memtable_key's result

// Records a failed status and maps it to a code.
SsCode Fail(const Status& s) {
  g_last_error = s.ToString();
  switch (s.code()) {
    case Status::Code::kOk:
      return SS_OK;
    case Status::Code::kNotFound:
      return SS_NOT_FOUND;
    case Status::Code::kCorruption:
      return SS_CORRUPTION;
    case Status::Code::kInvalidArgument:
      return SS_INVALID;
    case Status::Code::kIOError:
      return SS_IO_ERROR;
    case Status::Code::kBusy:
      return SS_BUSY;
  }
  return SS_INTERNAL;
}

// Maps a status to a code, remembering the message of a failure.
SsCode Code(const Status& s) {
  return s.ok() ? SS_OK : Fail(s);
}

// Runs `body` with every exception turned into a code.
template <typename Body>
SsCode Guard(Body body) {
  try {
    if (!g_engine) {
      g_last_error = "the slipstream engine is not open in this process";
      return SS_INTERNAL;
    }
    return body();
  } catch (const std::bad_alloc&) {
    g_last_error = "out of memory";
    return SS_NO_MEMORY;
  } catch (const std::exception& e) {
    g_last_error = e.what();
    return SS_INTERNAL;
  } catch (...) {
    g_last_error = "unknown C++ exception";
    return SS_INTERNAL;
  }
}

// The engine options for a bridge options struct.
Options ToOptions(const SsOptions* o) {
  Options opts;
  opts.directory = o->directory;
#define SS_SETTING(NAME, FIELD, KIND, UNIT, DEFAULT, MIN, MAX, CONTEXT, DESCRIPTION) \
  opts.FIELD = o->FIELD;
#include "slipstream/engine/settings.def"
  opts.max_device_size = o->max_device_size;
  opts.max_value_size = o->max_value_size;
  if (o->observer != nullptr) {
    opts.observer = *static_cast<std::shared_ptr<slipstream::engine::EngineObserver>*>(o->observer);
  }
  return opts;
}

}  // namespace

// This process's engine handle, for the other bridges (bridge_internal.h).
slipstream::engine::Engine* ss_bridge_engine() {
  return g_engine.get();
}

// An iterator, and the code of a failure (an exception) in one of its moves: the iteration
// then reports that failure instead of ending quietly.
struct SsIterator {
  std::unique_ptr<Iterator> it;
  SsCode failed = SS_OK;
};

// A batch, and the code of a failure while it was built: writing it then fails as a whole, so
// no part of it is written.
struct SsBatch {
  WriteBatch batch;
  SsCode failed = SS_OK;
};

extern "C" {

const char* ss_last_error(void) {
  return g_last_error.c_str();
}

size_t ss_arena_size(const SsOptions* options) {
  try {
    return Engine::ArenaSize(ToOptions(options));
  } catch (...) {
    return 0;
  }
}

SsCode ss_open(const SsOptions* options, void* arena, size_t arena_size, const SsHostLog* host_log,
               SsInterruptCheck interrupted) {
  try {
    Options opts = ToOptions(options);
    if (host_log != nullptr && host_log->barrier != nullptr) {
      SsPersistBarrier barrier = host_log->barrier;
      opts.persist_barrier = [barrier]() -> Status {
        char msg[256] = {0};
        if (barrier(msg, sizeof(msg))) return Status::OK();
        return Status::IOError(msg);
      };
      if (host_log->needed != nullptr && host_log->durable != nullptr) {
        opts.host_log_needed = host_log->needed;
        opts.host_log_durable = host_log->durable;
        opts.max_writeout_lag_ms = host_log->max_lag_ms;
      }
      // The WAL holds every change and is released only after the worker's Sync() (each
      // slipstream.sync_interval): the background write-outs need no fdatasync of their own.
      opts.sync_background_flushes = false;
    }
    if (interrupted != nullptr) opts.interrupted = [interrupted]() { return interrupted(); };
    std::unique_ptr<Engine> engine;
    Status s = Engine::Open(opts, arena, arena_size, &engine);
    if (!s.ok()) return Fail(s);
    g_reader = engine->NewPointReader();
    g_engine = std::move(engine);
    return SS_OK;
  } catch (const std::exception& e) {
    g_last_error = e.what();
    return SS_INTERNAL;
  } catch (...) {
    g_last_error = "unknown C++ exception";
    return SS_INTERNAL;
  }
}

bool ss_is_open(void) {
  return g_engine != nullptr;
}

void ss_close(void) {
  try {
    g_reader.reset();
    g_engine.reset();
  } catch (...) {
  }
}

SsCode ss_keyspace_lookup(uint64_t tag, uint32_t* keyspace) {
  return Guard([&] { return Code(g_engine->LookupKeyspace(tag, keyspace)); });
}

SsCode ss_keyspace_create(uint64_t tag, uint32_t* keyspace) {
  return Guard([&] { return Code(g_engine->CreateKeyspace(tag, keyspace)); });
}

SsCode ss_keyspace_drop(uint32_t keyspace) {
  return Guard([&] { return Code(g_engine->DropKeyspace(keyspace)); });
}

SsCode ss_keyspace_size(uint32_t keyspace, uint64_t* bytes) {
  *bytes = 0;
  return Guard([&] { return Code(g_engine->ApproximateSize(keyspace, bytes)); });
}

SsCode ss_keyspace_list(void (*fn)(uint64_t, uint32_t, void*), void* arg) {
  return Guard([&] {
    std::vector<std::pair<uint64_t, uint32_t>> live;
    Status s = g_engine->ListKeyspaces(&live);
    if (!s.ok()) return Fail(s);
    for (const auto& [tag, id] : live) fn(tag, id, arg);
    return SS_OK;
  });
}

SsCode ss_put(uint32_t keyspace, const void* key, size_t key_len, const void* value,
              size_t value_len) {
  return Guard([&] {
    return Code(g_engine->Put(keyspace, std::string_view(static_cast<const char*>(key), key_len),
                              std::string_view(static_cast<const char*>(value), value_len)));
  });
}

SsCode ss_put_changed_prefix(uint32_t keyspace, const void* key, size_t key_len, const void* value,
                             size_t value_len, uint32_t prefix) {
  return Guard([&] {
    thread_local WriteBatch batch;
    batch.Clear();
    batch.PutChangedPrefix(keyspace, std::string_view(static_cast<const char*>(key), key_len),
                           std::string_view(static_cast<const char*>(value), value_len), prefix);
    return Code(g_engine->Write(batch));
  });
}

SsCode ss_delete(uint32_t keyspace, const void* key, size_t key_len) {
  return Guard([&] {
    return Code(
        g_engine->Delete(keyspace, std::string_view(static_cast<const char*>(key), key_len)));
  });
}

SsCode ss_get(uint32_t keyspace, const void* key, size_t key_len, const char** value,
              size_t* value_len) {
  return Guard([&] {
    Status s = g_reader->Get(keyspace, std::string_view(static_cast<const char*>(key), key_len),
                             &g_get_buffer);
    if (!s.ok()) {
      if (s.IsNotFound()) return SS_NOT_FOUND;  // an answer, not a failure
      return Fail(s);
    }
    *value = g_get_buffer.data();
    *value_len = g_get_buffer.size();
    return SS_OK;
  });
}

SsCode ss_first_memtable_key(uint32_t keyspace, const void* lo, const void* hi, size_t key_len,
                             bool* held, const char** first, size_t* first_len) {
  return Guard([&] {
    *held = g_reader->FirstMemtableKey(
        keyspace, std::string_view(static_cast<const char*>(lo), key_len),
        std::string_view(static_cast<const char*>(hi), key_len), &g_first_key);
    *first = g_first_key.data();
    *first_len = g_first_key.size();
    return SS_OK;
  });
}

SsCode ss_get_past_memtables(uint32_t keyspace, const void* key, size_t key_len, const char** value,
                             size_t* value_len) {
  return Guard([&] {
    Status s = g_reader->GetPastMemtables(
        keyspace, std::string_view(static_cast<const char*>(key), key_len), &g_get_buffer);
    if (!s.ok()) {
      if (s.IsNotFound()) return SS_NOT_FOUND;
      return Fail(s);
    }
    *value = g_get_buffer.data();
    *value_len = g_get_buffer.size();
    return SS_OK;
  });
}

// The last freed batch, kept with its memory for the next (a bulk load writes batch after
// batch); one per thread, though PostgreSQL's processes have one.
thread_local std::unique_ptr<SsBatch> g_spare_batch;
// A batch whose memory passes this is freed, not kept.
constexpr size_t kKeptBatchBytes = 4 << 20;

SsBatch* ss_batch_new(void) {
  try {
    if (g_spare_batch) return g_spare_batch.release();
    return new SsBatch();
  } catch (...) {
    return nullptr;
  }
}

void ss_batch_reserve(SsBatch* batch, size_t ops, size_t bytes) {
  if (batch->failed != SS_OK) return;
  batch->failed = Guard([&] {
    batch->batch.Reserve(ops, bytes);
    return SS_OK;
  });
}

void ss_batch_put(SsBatch* batch, uint32_t keyspace, const void* key, size_t key_len,
                  const void* value, size_t value_len) {
  if (batch->failed != SS_OK) return;
  batch->failed = Guard([&] {
    batch->batch.Put(keyspace, std::string_view(static_cast<const char*>(key), key_len),
                     std::string_view(static_cast<const char*>(value), value_len));
    return SS_OK;
  });
}

void ss_batch_put_changed_prefix(SsBatch* batch, uint32_t keyspace, const void* key, size_t key_len,
                                 const void* value, size_t value_len, uint32_t prefix) {
  if (batch->failed != SS_OK) return;
  batch->failed = Guard([&] {
    batch->batch.PutChangedPrefix(
        keyspace, std::string_view(static_cast<const char*>(key), key_len),
        std::string_view(static_cast<const char*>(value), value_len), prefix);
    return SS_OK;
  });
}

void ss_batch_delete(SsBatch* batch, uint32_t keyspace, const void* key, size_t key_len) {
  if (batch->failed != SS_OK) return;
  batch->failed = Guard([&] {
    batch->batch.Delete(keyspace, std::string_view(static_cast<const char*>(key), key_len));
    return SS_OK;
  });
}

SsCode ss_batch_write(SsBatch* batch) {
  if (batch->failed != SS_OK) return batch->failed;  // the message is still ss_last_error()
  return Guard([&] { return Code(g_engine->Write(batch->batch)); });
}

void ss_batch_free(SsBatch* batch) {
  if (g_spare_batch || batch->batch.Capacity() > kKeptBatchBytes) {
    delete batch;
    return;
  }
  batch->batch.Clear();
  batch->failed = SS_OK;
  g_spare_batch.reset(batch);
}

SsCode ss_sync_all(void) {
  return Guard([&] { return Code(g_engine->Sync(~uint64_t(0))); });
}

SsCode ss_background_work(bool* did_work) {
  return Guard([&] {
    *did_work = g_engine->DoBackgroundWork();
    return SS_OK;
  });
}

void ss_wait_for_background_work(int timeout_ms) {
  Guard([&] {
    g_engine->WaitForBackgroundWork(timeout_ms);
    return SS_OK;
  });
}

SsCode ss_compact_all(void) {
  return Guard([&] { return Code(g_engine->CompactAll()); });
}

SsCode ss_run_gc(void) {
  return Guard([&] { return Code(g_engine->RunGC()); });
}

SsCode ss_verify(void) {
  return Guard([&] { return Code(g_engine->Verify()); });
}

SsCode ss_stats(SsStats* out) {
  return Guard([&] {
    slipstream::engine::Stats s = g_engine->GetStats();
    std::memset(out, 0, sizeof(*out));
    for (const auto& l : s.levels) {
      if (out->nlevels == SS_MAX_LEVELS) break;
      out->levels[out->nlevels++] =
          SsLevelStats{l.level,         l.bytes,          l.segments,      l.entries,
                       l.small_entries, l.medium_entries, l.large_entries, l.tombstones};
    }
    out->l0_entries = s.l0_entries;
    out->l0_bytes = s.l0_bytes;
    out->l0_descents = s.l0_descents;
    out->user_bytes_written = s.user_bytes_written;
    out->device_bytes_written = s.device_bytes_written;
    out->device_bytes_read = s.device_bytes_read;
    out->compactions = s.compactions;
    out->compaction_bytes_written = s.compaction_bytes_written;
    out->compaction_leaves_kept = s.compaction_leaves_kept;
    out->compaction_leaves_moved = s.compaction_leaves_moved;
    out->compaction_filters_rebuilt = s.compaction_filters_rebuilt;
    out->gc_runs = s.gc_runs;
    out->large_patches = s.large_patches;
    out->row_cache_hits = s.row_cache_hits;
    out->row_cache_misses = s.row_cache_misses;
    out->row_cache_installs = s.row_cache_installs;
    out->gc_bytes_relocated = s.gc_bytes_relocated;
    out->gc_reclaimed_bytes = s.gc_reclaimed_bytes;
    out->stall_count = s.stall_count;
    out->stall_micros = s.stall_micros;
    out->log_flushes = s.log_flushes;
    out->log_records_flushed = s.log_records_flushed;
    out->log_barrier_calls = s.log_barrier_calls;
    out->segments_in_use = s.segments_in_use;
    out->medium_log_segments = s.medium_log_segments;
    out->large_log_segments = s.large_log_segments;
    out->l0_log_segments = s.l0_log_segments;
    out->last_lsn = s.last_lsn;
    out->durable_lsn = s.durable_lsn;
    return SS_OK;
  });
}

SsIterator* ss_iter_new(uint32_t keyspace) {
  SsIterator* result = nullptr;
  Guard([&] {
    auto it = std::make_unique<SsIterator>();
    it->it = g_engine->NewIterator(keyspace);
    result = it.release();
    return SS_OK;
  });
  return result;
}

void ss_iter_seek(SsIterator* it, const void* key, size_t key_len) {
  if (it->failed != SS_OK) return;
  it->failed = Guard([&] {
    it->it->Seek(std::string_view(static_cast<const char*>(key), key_len));
    return SS_OK;
  });
}

void ss_iter_set_upper_bound(SsIterator* it, const void* key, size_t key_len) {
  if (it->failed != SS_OK) return;
  it->failed = Guard([&] {
    it->it->SetUpperBound(std::string_view(static_cast<const char*>(key), key_len));
    return SS_OK;
  });
}

void ss_iter_next(SsIterator* it) {
  if (it->failed != SS_OK) return;
  it->failed = Guard([&] {
    it->it->Next();
    return SS_OK;
  });
}

uint64_t ss_iter_skip_to(SsIterator* it, const void* key, size_t key_len, size_t mark_size,
                         size_t mark_offset, uint8_t mark_mask, uint64_t* marked) {
  uint64_t passed = 0;
  if (it->failed != SS_OK) return 0;
  it->failed = Guard([&] {
    Iterator::SkipMark mark;
    mark.size = mark_size;
    mark.offset = mark_offset;
    mark.mask = mark_mask;
    passed = it->it->SkipTo(std::string_view(static_cast<const char*>(key), key_len), mark, marked);
    return SS_OK;
  });
  return passed;
}

bool ss_iter_valid(SsIterator* it) {
  return it->failed == SS_OK && it->it->Valid();
}

void ss_iter_key(SsIterator* it, const char** key, size_t* key_len) {
  std::string_view k = it->it->key();
  *key = k.data();
  *key_len = k.size();
}

void ss_iter_value(SsIterator* it, const char** value, size_t* value_len) {
  std::string_view v = it->it->value();
  *value = v.data();
  *value_len = v.size();
}

SsCode ss_iter_status(SsIterator* it) {
  if (it->failed != SS_OK) return it->failed;
  return Guard([&] { return Code(it->it->status()); });
}

void ss_iter_free(SsIterator* it) {
  try {
    delete it;
  } catch (...) {
  }
}

}  // extern "C"
