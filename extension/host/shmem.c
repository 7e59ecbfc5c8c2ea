/*
 * host/shmem.c: hosting the engine inside PostgreSQL: its shared-memory arena and our shared
 * state (shmem hooks), each process's engine handle, and bridge failures turned into ERRORs.
 * Row ids (rowids.c), row locks (row_locks.c) and the horizon (horizon.c) add their parts.
 */
#include "slipstream.h"
#include "replication/repl.h"

#include <sys/stat.h>

#include "access/xlog.h"
#include "access/twophase.h"
#include "access/xloginsert.h"
#include "utils/wait_event.h"
#include "miscadmin.h"
#include "postmaster/walwriter.h"
#include "storage/ipc.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "utils/memutils.h"

SsShared   *ss_shared = NULL;

static void *engine_arena = NULL;
static size_t engine_arena_size = 0;

#define SS_ARENA_ALIGN 4096

/* Number of PGPROC slots, the size of the per-backend arrays. */
int
ss_proc_slots(void)
{
	return MaxBackends + NUM_AUXILIARY_PROCS + max_prepared_xacts;
}

/* Bytes of our own shared state. */
static Size
shared_size(void)
{
	return add_size(offsetof(SsShared, inflight),
					mul_size(sizeof(pg_atomic_uint64), ss_proc_slots()));
}

/* Asks for the arena, our shared state, the row id map and its lock (shmem_request_hook). */
void
ss_shmem_request(void)
{
	SsOptions	options;

	ss_fill_options(&options);
	engine_arena_size = ss_arena_size(&options);
	if (engine_arena_size == 0)
		ereport(FATAL,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("slipstream: the engine settings are inconsistent"),
				 errhint("Check slipstream.segment_size, slipstream.node_size and the value "
						 "size thresholds: node_size must be at most segment_size / 8 and "
						 "small_threshold below large_threshold.")));
	RequestAddinShmemSpace(add_size(engine_arena_size, SS_ARENA_ALIGN));
	RequestAddinShmemSpace(shared_size());
	ss_rowids_shmem_request();
	ss_chain_cache_shmem_request();
}

/* Creates or attaches the shared structures; a fresh arena is zeroed (shmem_startup_hook). */
void
ss_shmem_startup(void)
{
	bool		found;
	char	   *raw;

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	raw = ShmemInitStruct("slipstream engine arena", engine_arena_size + SS_ARENA_ALIGN, &found);
	engine_arena = (void *) TYPEALIGN(SS_ARENA_ALIGN, raw);
	if (!found)
		memset(engine_arena, 0, engine_arena_size);

	ss_shared = ShmemInitStruct("slipstream shared state", shared_size(), &found);
	if (!found)
	{
		memset(ss_shared, 0, shared_size());
		pg_atomic_init_u32(&ss_shared->replay_state, SS_REPLAY_NOT_STARTED);
		ConditionVariableInit(&ss_shared->replay_cv);
		pg_atomic_init_u64(&ss_shared->max_applied_lsn, 0);
		pg_atomic_init_u64(&ss_shared->durable_horizon, 0);
		pg_atomic_init_u64(&ss_shared->replayed_records, 0);
		pg_atomic_init_u32(&ss_shared->standby, 0);
		pg_atomic_init_u64(&ss_shared->vm_epoch, 0);
		for (int i = 0; i < ss_proc_slots(); i++)
			pg_atomic_init_u64(&ss_shared->inflight[i], 0);
	}
	ss_row_locks_shmem_init(!found);
	ss_rowids_shmem_init();
	ss_chain_cache_shmem_init();
	LWLockRelease(AddinShmemInitLock);
	ss_row_locks_register_tranche();
}

/*
 * Whether a cancel, statement timeout or termination is pending: only reads the flags the
 * signal handlers set, so the engine may call it from C++ (nothing here can throw).
 */
static bool
cancel_pending(void)
{
	return QueryCancelPending || ProcDiePending;
}

/* Turns a failed bridge call into an ERROR with a fitting errcode. */
void
ss_report(SsCode code, const char *what)
{
	int			errcode_value;

	/* A wait the engine gave up because of a cancel reports the cancel itself. */
	if (code == SS_BUSY)
		CHECK_FOR_INTERRUPTS();

	switch (code)
	{
		case SS_CORRUPTION:
			errcode_value = ERRCODE_DATA_CORRUPTED;
			break;
		case SS_IO_ERROR:
			errcode_value = ERRCODE_IO_ERROR;
			break;
		case SS_INVALID:
			errcode_value = ERRCODE_INVALID_PARAMETER_VALUE;
			break;
		case SS_NO_MEMORY:
			errcode_value = ERRCODE_OUT_OF_MEMORY;
			break;
		case SS_BUSY:
			errcode_value = ERRCODE_OBJECT_IN_USE;
			break;
		default:
			errcode_value = ERRCODE_INTERNAL_ERROR;
			break;
	}
	ereport(ERROR,
			(errcode(errcode_value),
			 errmsg("slipstream: %s failed: %s", what, ss_last_error()),
			 code == SS_BUSY ?
			 errhint("Long-running scans or open cursors on slipstream tables hold engine memory; finish them and retry.") : 0));
}

/* Drops this process's engine handle at exit. */
static void
close_engine(int code, Datum arg)
{
	ss_close();
}

/* Opens the engine in this process; the first process after a (re)start recovers it. */
void
ss_engine_attach(void)
{
	SsOptions	options;
	SsCode		code;

	/*
	 * Periodic engine write-outs wait for WAL that commits or the WAL writer flush anyway, up to
	 * two WAL writer rounds, instead of flushing it themselves (a sync of its own each time).
	 */
	SsHostLog	host_log = {ss_persist_barrier, ss_wal_needed, ss_wal_durable,
		(uint32) Max(2 * WalWriterDelay, 50)};

	if (ss_is_open())
		return;
	if (ss_shared == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("slipstream must be loaded via shared_preload_libraries"),
				 errhint("Add slipstream to shared_preload_libraries in postgresql.conf and "
						 "restart the server.")));
	ss_fill_options(&options);
	options.observer = ss_index_observer();	/* index shipping (Send-Index) */
	if (mkdir(options.directory, S_IRWXU) != 0 && errno != EEXIST)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("slipstream: could not create directory \"%s\": %m", options.directory)));
	code = ss_open(&options, engine_arena, engine_arena_size, &host_log, cancel_pending);
	if (code != SS_OK)
		ss_report(code, "opening the engine");
	before_shmem_exit(close_engine, 0);
}

