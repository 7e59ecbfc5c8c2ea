/*
 * replication/index_ship.c: index shipping (Anthus Send-Index) inside PostgreSQL, the shared
 * half (docs/replication.md, "How it plugs into PostgreSQL").
 *
 * On a primary, every process that opens the engine gets an observer (index_bridge.h) that
 * frames its log write-outs and compactions into one frame queue in shared memory, tagged with
 * the WAL flushed by then; the shipper (shipper.c) appends them to each Send-Index backup once
 * that backup holds the WAL they are tagged with. After an L0 compaction's install the observer
 * declares the WAL horizon its levels cover: the applied horizon read when the *previous* L0
 * compaction began (only one memtable is immutable at a time, so everything applied before
 * that begin was in the memtables this install has compacted). The engine worker takes the
 * seeds the shipper asks for (Engine::ShipLevels).
 *
 * On a standby with slipstream.backup_engine = import, the backup worker applies the stream
 * to the standby's engine and moves the slot "slipstream" to each declared horizon; the
 * startup process leaves the engine alone, and a promotion replays the WAL from the slot on
 * (startup.c), which rebuilds what the primary had in its memtables.
 */
#include "slipstream.h"
#include "replication/repl.h"

#include <sys/stat.h>

#include "access/xlog.h"
#include "access/xlog_internal.h"
#include "access/xlogrecovery.h"
#include "miscadmin.h"
#include "replication/slot.h"
#include "storage/shmem.h"
#include "utils/guc.h"

#include "bridge/index_bridge.h"

int			ss_backup_engine = SS_BACKUP_ENGINE_REPLAY;
int			ss_index_queue_mb = 64;

static const struct config_enum_entry backup_engine_options[] = {
	{"replay", SS_BACKUP_ENGINE_REPLAY, false},
	{"import", SS_BACKUP_ENGINE_IMPORT, false},
	{NULL, 0, false}
};

/* The frame queue in shared memory (NULL before shmem startup). */
static void *index_queue = NULL;

/* Defines the settings of index shipping (from ss_repl_define_settings). */
void
ss_index_define_settings(void)
{
	DefineCustomEnumVariable("slipstream.backup_engine",
							 "How a standby that is a slipstream backup keeps its engine: by "
							 "replaying the WAL into it (replay) or by importing the levels its "
							 "primary ships (import, Send-Index).",
							 "import spends no CPU on compactions, but slipstream tables can be "
							 "read only after promotion; the primary must add the backup with "
							 "shipping => 'send_index'.",
							 &ss_backup_engine, SS_BACKUP_ENGINE_REPLAY, backup_engine_options,
							 PGC_POSTMASTER, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("slipstream.index_queue_size",
							"Shared memory for index shipping frames on their way to the "
							"shipper.",
							"A frame that does not fit in time makes Send-Index backups take a "
							"new seed.",
							&ss_index_queue_mb, 64, 8, 4096, PGC_POSTMASTER, GUC_UNIT_MB,
							NULL, NULL, NULL);
}

/* Bytes of frames the queue holds. */
static uint64
queue_capacity(void)
{
	return (uint64) ss_index_queue_mb * 1024 * 1024;
}

/* Asks for the queue's shared memory (from ss_repl_shmem_request). */
void
ss_index_shmem_request(void)
{
	RequestAddinShmemSpace(ss_index_queue_size(queue_capacity()));
}

/* Lays out or attaches the queue (from ss_repl_shmem_startup). */
void
ss_index_shmem_startup(void)
{
	bool		found;

	index_queue = ShmemInitStruct("slipstream index queue",
								  ss_index_queue_size(queue_capacity()), &found);
	if (!found)
		ss_index_queue_init(index_queue, queue_capacity());
}

/* The queue, for the shipper. */
void *
ss_index_queue(void)
{
	return index_queue;
}

/* ---- the observer's hooks: they run inside engine code and must not ereport ---- */

/* Whether any configured backup takes the index stream. */
static bool
hook_enabled(void)
{
	return pg_atomic_read_u32(&ss_repl->index_backups) > 0;
}

/*
 * The WAL flushed now: every record written out was in durable WAL first (the write-ahead
 * barrier flushed it, or the write-out waited for commits and the WAL writer to).
 */
static uint64_t
hook_wal_tag(void)
{
	return GetFlushRecPtr(NULL);
}

/*
 * Whether applied horizons mean anything now: on a primary whose engine worker has finished
 * replaying the WAL at its start (replayed changes are not bracketed as in flight, so the insert
 * position would claim them applied), not on a standby (whose insert position is not kept).
 */
static bool
horizons_valid(void)
{
	return pg_atomic_read_u32(&ss_shared->replay_state) == SS_REPLAY_READY &&
		!RecoveryInProgress();
}

/* At an L0 compaction's begin: the applied horizon now (0 when it means nothing). */
static uint64_t
hook_l0_begin(void)
{
	return horizons_valid() ? ss_applied_horizon() : 0;
}

/*
 * At an L0 compaction's install: keeps its begin's horizon for the next install and returns
 * the previous one, which this install covers (0 for the first after a start).
 */
static uint64_t
hook_l0_installed(uint64_t begin)
{
	uint64		previous = pg_atomic_exchange_u64(&ss_repl->index_prev_begin, begin);

	if (begin == 0 || !horizons_valid())
		return 0;				/* and the next install declares nothing either */
	if (previous != 0)
		pg_atomic_write_u64(&ss_repl->index_installed_horizon, previous);
	return previous;
}

/* The horizon the installed levels cover now (a seed's). */
static uint64_t
hook_seed_horizon(void)
{
	return pg_atomic_read_u64(&ss_repl->index_installed_horizon);
}

/* A producer waiting for room stops waiting when the process must stop. */
static bool
hook_interrupted(void)
{
	return ProcDiePending || QueryCancelPending;
}

static SsIndexHooks hooks = {
	.enabled = hook_enabled,
	.wal_tag = hook_wal_tag,
	.l0_begin = hook_l0_begin,
	.l0_installed = hook_l0_installed,
	.seed_horizon = hook_seed_horizon,
	.interrupted = hook_interrupted,
	.push_wait_ms = 5000,
};

/* This process's observer for the engine's options (made once; NULL without shared memory). */
void *
ss_index_observer(void)
{
	static void *observer = NULL;

	if (observer == NULL && index_queue != NULL && ss_repl != NULL)
	{
		hooks.queue = index_queue;
		observer = ss_index_observer_new(&hooks);
	}
	return observer;
}

/*
 * The engine worker of a primary: ships the levels as a seed when the shipper asked for one
 * (a Send-Index backup connected, or the queue overflowed). A failure is logged; the shipper
 * asks again when a backup still waits.
 */
void
ss_index_seed_if_requested(void)
{
	char		error[SS_REPL_ERROR_SIZE];

	if (pg_atomic_exchange_u32(&ss_repl->seed_requested, 0) == 0)
		return;
	hooks.queue = index_queue;
	if (!ss_index_ship_levels(&hooks, error, sizeof(error)))
	{
		ereport(WARNING, (errmsg("slipstream: could not ship the levels to Send-Index backups: %s",
								 error)));
		return;
	}
	pg_atomic_fetch_add_u64(&ss_repl->seeds_shipped, 1);
	ereport(LOG, (errmsg("slipstream: shipped the levels to Send-Index backups as a seed "
						 "(horizon %X/%X)",
						 LSN_FORMAT_ARGS(pg_atomic_read_u64(&ss_repl->index_installed_horizon)))));
}

/* ---- the backup side ---- */

/* Whether this node's engine imports (a standby with backup_engine = import). */
bool
ss_engine_imports(void)
{
	return ss_backup_engine == SS_BACKUP_ENGINE_IMPORT;
}

/*
 * Whether this standby's pg_wal holds the WAL segment of `lsn` on the timeline it replays: a
 * horizon below its first segment (a seed's, older than the base backup) cannot be replayed
 * from at a promotion.
 */
static bool
wal_segment_present(XLogRecPtr lsn)
{
	XLogSegNo	segno;
	TimeLineID	tli;
	char		path[MAXPGPATH];
	char		name[MAXFNAMELEN];
	struct stat st;

	(void) GetXLogReplayRecPtr(&tli);
	XLByteToSeg(lsn, segno, wal_segment_size);
	XLogFileName(name, tli, segno, wal_segment_size);
	snprintf(path, sizeof(path), XLOGDIR "/%s", name);
	return stat(path, &st) == 0;
}

/*
 * The backup worker of an importing standby, after a horizon was declared: moves the slot
 * "slipstream" up to it (creating the slot at the first one its pg_wal covers). From then on a
 * promotion replays from there. Returns whether the slot is at or above `horizon` now.
 */
bool
ss_import_advance_slot(XLogRecPtr horizon)
{
	XLogRecPtr	current = ss_slot_horizon();

	if (horizon == InvalidXLogRecPtr || horizon <= current)
		return current != InvalidXLogRecPtr;
	if (!wal_segment_present(horizon))
		return false;			/* older than this standby's WAL: wait for a later install */
	if (current == InvalidXLogRecPtr)
	{
		ss_create_slot_at(horizon);
		ereport(LOG, (errmsg("slipstream: the imported levels cover the WAL below %X/%X: this "
							 "backup can be promoted from now on", LSN_FORMAT_ARGS(horizon))));
		return true;
	}
	ss_acquire_slot();
	ss_set_slot_restart(horizon);
	ReplicationSlotRelease();
	pg_atomic_write_u64(&ss_shared->durable_horizon, horizon);
	return true;
}
