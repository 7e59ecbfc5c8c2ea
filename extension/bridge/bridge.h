/*
 * bridge.h: the C interface between the PostgreSQL glue (C) and the engine (C++).
 *
 * Every function catches C++ exceptions and reports failure as an SsCode; the message of the
 * last failure in this process is ss_last_error(). Nothing here calls PostgreSQL, so no
 * ereport/longjmp can cross a C++ frame: callers turn codes into ereports afterwards.
 * Pointers handed out (values, keys) stay valid until the next call on the same object.
 */
/* A C header in PostgreSQL style: clang-format (C++ style in this folder) leaves it alone. */
/* clang-format off */
#ifndef SLIPSTREAM_BRIDGE_H
#define SLIPSTREAM_BRIDGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "slipstream/engine/settings.def"	/* SS_SETTINGS_MAX_LEVELS, SS_CTYPE_* */

#ifdef __cplusplus
extern "C" {
#endif

typedef enum SsCode {
	SS_OK = 0,
	SS_NOT_FOUND,
	SS_CORRUPTION,
	SS_INVALID,
	SS_IO_ERROR,
	SS_BUSY,
	SS_NO_MEMORY,
	SS_INTERNAL
} SsCode;

/*
 * Engine sizes and thresholds (see engine/include/slipstream/engine/options.h): one field per
 * line of settings.def, in bytes or milliseconds as the engine counts, plus what only the host
 * decides.
 */
typedef struct SsOptions
{
	const char *directory;
#define SS_SETTING(NAME, FIELD, KIND, UNIT, DEFAULT, MIN, MAX, CONTEXT, DESCRIPTION) \
	SS_CTYPE_##KIND FIELD;
#include "slipstream/engine/settings.def"
	uint64_t	max_device_size;
	uint32_t	max_value_size;
	/* Told of this process's log write-outs and compactions (index_bridge.h; NULL: none). */
	void	   *observer;
} SsOptions;

/* Called before engine records reach the device; returns false (and fills msg) to refuse. */
typedef bool (*SsPersistBarrier) (char *msg, size_t msg_size);

/* Asked while a write waits for engine room: true (a cancel is pending) ends it with SS_BUSY. */
typedef bool (*SsInterruptCheck) (void);

/* A position in the host's log (a WAL LSN). */
typedef uint64_t (*SsHostLogPosition) (void);

/*
 * The host's log, written before the engine's (PostgreSQL's WAL). `barrier` makes it durable
 * past every change applied so far; `needed` says where that is and `durable` how far it is
 * durable now, so that periodic engine write-outs can wait for the host's own flushes instead
 * of calling the barrier, at most `max_lag_ms` (the engine's Options::host_log_needed).
 * `needed` and `durable` may be NULL: every write-out then calls the barrier.
 */
typedef struct SsHostLog
{
	SsPersistBarrier barrier;
	SsHostLogPosition needed;
	SsHostLogPosition durable;
	uint32_t	max_lag_ms;
} SsHostLog;

typedef struct SsLevelStats {
	uint32_t	level;
	uint64_t	bytes;
	uint64_t	segments;
	uint64_t	entries;
	uint64_t	small_entries;
	uint64_t	medium_entries;
	uint64_t	large_entries;
	uint64_t	tombstones;
} SsLevelStats;

/* Room for every on-device level (settings.def bounds max_levels) and one to spare. */
#define SS_MAX_LEVELS (SS_SETTINGS_MAX_LEVELS + 1)

typedef struct SsStats {
	uint32_t	nlevels;
	SsLevelStats levels[SS_MAX_LEVELS];
	uint64_t	l0_entries;
	uint64_t	l0_bytes;
	uint64_t	l0_descents;
	uint64_t	user_bytes_written;
	uint64_t	device_bytes_written;
	uint64_t	device_bytes_read;
	uint64_t	compactions;
	uint64_t	compaction_bytes_written;
	uint64_t	compaction_leaves_kept;
	uint64_t	compaction_leaves_moved;
	uint64_t	compaction_filters_rebuilt;
	uint64_t	gc_runs;
	uint64_t	large_patches;
	uint64_t	row_cache_hits;
	uint64_t	row_cache_misses;
	uint64_t	row_cache_installs;
	uint64_t	gc_bytes_relocated;
	uint64_t	gc_reclaimed_bytes;
	uint64_t	stall_count;
	uint64_t	stall_micros;
	uint64_t	log_flushes;
	uint64_t	log_records_flushed;
	uint64_t	log_barrier_calls;
	uint64_t	segments_in_use;
	uint64_t	medium_log_segments;
	uint64_t	large_log_segments;
	uint64_t	l0_log_segments;
	uint64_t	last_lsn;
	uint64_t	durable_lsn;
} SsStats;

typedef struct SsIterator SsIterator;
typedef struct SsBatch SsBatch;

/* Message of the last failure in this process (empty if none). */
extern const char *ss_last_error(void);

/* Shared-memory bytes the engine needs for these options; 0 if the options are invalid. */
extern size_t ss_arena_size(const SsOptions *options);
/* Opens (first process: recovers into the zeroed arena) or attaches this process's handle. */
extern SsCode ss_open(const SsOptions *options, void *arena, size_t arena_size,
					  const SsHostLog *host_log, SsInterruptCheck interrupted);
extern bool ss_is_open(void);
/* Drops this process's handle (the shared state stays). */
extern void ss_close(void);

extern SsCode ss_keyspace_lookup(uint64_t tag, uint32_t *keyspace);
extern SsCode ss_keyspace_create(uint64_t tag, uint32_t *keyspace);
extern SsCode ss_keyspace_drop(uint32_t keyspace);
/* An estimate of the bytes a keyspace holds (keys and values of every stored version). */
extern SsCode ss_keyspace_size(uint32_t keyspace, uint64_t *bytes);
/* Calls fn(tag, keyspace, arg) for every live keyspace. */
extern SsCode ss_keyspace_list(void (*fn) (uint64_t tag, uint32_t keyspace, void *arg), void *arg);

extern SsCode ss_put(uint32_t keyspace, const void *key, size_t key_len, const void *value,
					 size_t value_len);
/*
 * A put of a value that differs from the key's stored value in its first `prefix` bytes alone
 * (at most 64: a row's header change). A large stored value is not written again; the engine
 * keeps the new prefix beside a pointer to it. The caller holds the key against other writers.
 */
extern SsCode ss_put_changed_prefix(uint32_t keyspace, const void *key, size_t key_len,
									const void *value, size_t value_len, uint32_t prefix);
extern SsCode ss_delete(uint32_t keyspace, const void *key, size_t key_len);
/* On SS_OK, *value points at a copy owned by the bridge, valid until the next ss_get. */
extern SsCode ss_get(uint32_t keyspace, const void *key, size_t key_len, const char **value,
					 size_t *value_len);
/*
 * The smallest key in [lo, hi) that a memtable holds now: *held, and in *first a copy owned by
 * the bridge (valid until the next call). The keys below it may be read with
 * ss_get_past_memtables, which answers as ss_get did then, ignoring writes since.
 */
extern SsCode ss_first_memtable_key(uint32_t keyspace, const void *lo, const void *hi,
									size_t key_len, bool *held, const char **first,
									size_t *first_len);
extern SsCode ss_get_past_memtables(uint32_t keyspace, const void *key, size_t key_len,
									const char **value, size_t *value_len);

/*
 * Atomic batches of puts and deletes. A put or delete that fails (out of memory) makes
 * ss_batch_write fail without writing any of the batch. A freed batch's memory is kept for
 * the process's next one; ss_batch_reserve makes room for a batch whose size is known.
 */
extern SsBatch *ss_batch_new(void);
extern void ss_batch_reserve(SsBatch *batch, size_t ops, size_t bytes);
extern void ss_batch_put(SsBatch *batch, uint32_t keyspace, const void *key, size_t key_len,
						 const void *value, size_t value_len);
/* ss_put_changed_prefix in a batch (which writes the key nowhere else). */
extern void ss_batch_put_changed_prefix(SsBatch *batch, uint32_t keyspace, const void *key,
										size_t key_len, const void *value, size_t value_len,
										uint32_t prefix);
extern void ss_batch_delete(SsBatch *batch, uint32_t keyspace, const void *key, size_t key_len);
extern SsCode ss_batch_write(SsBatch *batch);
extern void ss_batch_free(SsBatch *batch);

/* Makes every record written so far durable in the engine's own log. */
extern SsCode ss_sync_all(void);
/* One round of background work; *did_work tells whether there was any. */
extern SsCode ss_background_work(bool *did_work);
extern void ss_wait_for_background_work(int timeout_ms);
extern SsCode ss_compact_all(void);
extern SsCode ss_run_gc(void);
extern SsCode ss_verify(void);
extern SsCode ss_stats(SsStats *stats);

/* Iterators over one keyspace; a snapshot of the engine at creation. NULL on failure. */
extern SsIterator *ss_iter_new(uint32_t keyspace);
extern void ss_iter_seek(SsIterator *it, const void *key, size_t key_len);
/* Keys >= `key` end the iteration from now on (key_len 0: no limit); see Iterator. */
extern void ss_iter_set_upper_bound(SsIterator *it, const void *key, size_t key_len);
extern void ss_iter_next(SsIterator *it);
/*
 * Moves on to the first key >= `key`, counting the entries passed without reading their values;
 * *marked (if not NULL) also gets those whose value is `mark_size` bytes with a bit of
 * `mark_mask` set in its byte at `mark_offset` (see Iterator::SkipMark).
 */
extern uint64_t ss_iter_skip_to(SsIterator *it, const void *key, size_t key_len, size_t mark_size,
								size_t mark_offset, uint8_t mark_mask, uint64_t *marked);
extern bool ss_iter_valid(SsIterator *it);
extern void ss_iter_key(SsIterator *it, const char **key, size_t *key_len);
extern void ss_iter_value(SsIterator *it, const char **value, size_t *value_len);
/* SS_OK unless the iteration stopped on corruption, an I/O error or a failed move. */
extern SsCode ss_iter_status(SsIterator *it);
extern void ss_iter_free(SsIterator *it);

#ifdef __cplusplus
}
#endif

#endif							/* SLIPSTREAM_BRIDGE_H */
/* clang-format on */
