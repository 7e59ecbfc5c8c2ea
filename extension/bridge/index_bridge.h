/*
 * index_bridge.h: the C interface of index shipping (Send-Index) on a primary: the frame queue
 * in shared memory that every process's engine events are framed into, the observer that
 * frames them, the seed, and what the shipper needs to consume the queue. Like bridge.h: no
 * PostgreSQL headers, no exception crosses it, and nothing here calls PostgreSQL (the hooks
 * must not ereport: they run inside engine code).
 */
/* clang-format off */
#ifndef SLIPSTREAM_INDEX_BRIDGE_H
#define SLIPSTREAM_INDEX_BRIDGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What the observer asks its host (static storage: it keeps the pointer). */
typedef struct SsIndexHooks
{
	void	   *queue;			/* the frame queue (ss_index_queue_init) */
	bool		(*enabled) (void);	/* whether any backup takes the index stream now */
	uint64_t	(*wal_tag) (void);	/* the WAL flushed now: it covers every event raised so far */
	/* At an L0 compaction's begin: the applied WAL horizon now. */
	uint64_t	(*l0_begin) (void);
	/* At its install, with what l0_begin returned: the horizon to declare (0: none). */
	uint64_t	(*l0_installed) (uint64_t begin);
	/* During a seed (its locks held): the horizon the levels being shipped cover. */
	uint64_t	(*seed_horizon) (void);
	bool		(*interrupted) (void);	/* a producer waiting for room gives up */
	int			push_wait_ms;	/* how long a producer waits for room before overflowing */
} SsIndexHooks;

/* Shared-memory bytes of a queue of `capacity` bytes of frames, and laying one out. */
extern size_t ss_index_queue_size(uint64_t capacity);
extern void ss_index_queue_init(void *memory, uint64_t capacity);

/* An observer for SsOptions.observer that frames this process's events into the queue. */
extern void *ss_index_observer_new(const SsIndexHooks *hooks);

/*
 * Ships this node's levels into the queue as a seed (Engine::ShipLevels), then the horizon
 * they cover. False with a message if the engine failed or the queue overflowed.
 */
extern bool ss_index_ship_levels(const SsIndexHooks *hooks, char *error, size_t error_size);

/* The consumer (the shipper): the oldest frame (valid until the next call), and removing it. */
extern bool ss_index_queue_front(void *queue, const char **frame, size_t *len, uint64_t *tag);
extern void ss_index_queue_pop(void *queue);
extern bool ss_index_queue_overflowed(void *queue);
extern void ss_index_queue_clear_overflow(void *queue);
extern uint64_t ss_index_queue_bytes(void *queue);

/* Whether a frame is a seed's marker. */
extern bool ss_index_frame_is_seed(const char *frame, size_t len);
/* Whether a frame is a seed's end. */
extern bool ss_index_frame_is_seed_end(const char *frame, size_t len);
/* Whether a frame is a compaction's end (counted in the replication view). */
extern bool ss_index_frame_is_install(const char *frame, size_t len);
/* A segment frame compressed with LZ4 (others as they are); valid until the next call. */
extern const char *ss_index_compress(const char *frame, size_t len, size_t *out_len);

#ifdef __cplusplus
}
#endif

#endif							/* SLIPSTREAM_INDEX_BRIDGE_H */
