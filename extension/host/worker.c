/*
 * host/worker.c: the slipstream background worker. After every server start it brings the
 * engine up (startup.c: recovery and WAL replay, then the gate opens for backends), then
 * loops: engine background work (log flushes, compactions, GC), advancing the durable horizon,
 * and dropping keyspaces whose relation files PostgreSQL has removed (DROP TABLE, TRUNCATE,
 * DROP DATABASE, aborted CREATE). SIGTERM ends it after a final sync; after a crash the
 * postmaster restarts it.
 */
#include "slipstream.h"

#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/pmsignal.h"
#include "storage/fd.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/timestamp.h"

/* How often stale keyspaces are looked for. */
#define SS_SWEEP_INTERVAL_MS 5000

/* Registers a restartable worker of this library that starts once recovery has finished. */
void
ss_register_bgworker(const char *function, const char *name)
{
	BackgroundWorker worker;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = 1;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "slipstream");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "%s", function);
	snprintf(worker.bgw_name, BGW_MAXLEN, "slipstream %s", name);
	snprintf(worker.bgw_type, BGW_MAXLEN, "slipstream %s", name);
	RegisterBackgroundWorker(&worker);
}

/* Registers the engine worker (from _PG_init). */
void
ss_register_worker(void)
{
	ss_register_bgworker("ss_worker_main", "worker");
}

typedef struct SweepState
{
	int			dropped;
} SweepState;

/* Drops a keyspace whose relation file no longer exists. */
static void
sweep_one(uint64 tag, uint32 keyspace, void *arg)
{
	SweepState *state = (SweepState *) arg;
	char		path[MAXPGPATH];
	struct stat st;
	Oid			db = (Oid) (tag >> 32);
	Oid			relnode = (Oid) (tag & 0xffffffff);

	if (db == InvalidOid)
		return;					/* reserved tags */
	snprintf(path, sizeof(path), "base/%u/%u", db, relnode);
	if (stat(path, &st) == 0 || errno != ENOENT)
		return;
	if (ss_temp_file_exists(db, relnode))
		return;					/* a temporary table's file */
	if (ss_keyspace_drop(keyspace) == SS_OK)
	{
		ss_forget_rowids(tag);
		state->dropped++;
	}
}

/* Whether a temporary relation file t<backend>_<relnode> exists in database `db`. */
bool
ss_temp_file_exists(Oid db, Oid relnode)
{
	char		pattern[MAXPGPATH];
	glob_t		matches;
	bool		found;

	snprintf(pattern, sizeof(pattern), "base/%u/t*_%u", db, relnode);
	found = glob(pattern, GLOB_NOSORT, NULL, &matches) == 0 && matches.gl_pathc > 0;
	globfree(&matches);
	return found;
}

/* Drops every keyspace whose relation file is gone. */
static void
sweep_keyspaces(void)
{
	SweepState	state = {0};

	SS_CHECK(ss_keyspace_list(sweep_one, &state), "listing keyspaces");
	if (state.dropped > 0)
		ereport(DEBUG1, (errmsg("slipstream: dropped %d keyspaces of removed relations",
								state.dropped)));
}

/* The worker's entry point. */
void
ss_worker_main(Datum arg)
{
	TimestampTz last_horizon = 0;
	TimestampTz last_sweep = 0;
	MemoryContext loop_context;

	pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	BackgroundWorkerUnblockSignals();
	CurrentResourceOwner = ResourceOwnerCreate(NULL, "slipstream worker");
	ss_shared->worker_pid = MyProcPid;

	ss_engine_startup();

	loop_context = AllocSetContextCreate(TopMemoryContext, "slipstream worker loop",
										 ALLOCSET_DEFAULT_SIZES);
	while (!ShutdownRequestPending)
	{
		bool		did_work = false;
		TimestampTz now;
		MemoryContext old = MemoryContextSwitchTo(loop_context);

		CHECK_FOR_INTERRUPTS();
		if (!PostmasterIsAlive())
			proc_exit(1);		/* the postmaster died: our shared memory goes with it */
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}
		SS_CHECK(ss_background_work(&did_work), "engine background work");
		now = GetCurrentTimestamp();
		if (TimestampDifferenceExceeds(last_horizon, now, ss_sync_interval_ms))
		{
			ss_advance_horizon();
			last_horizon = now;
		}
		if (TimestampDifferenceExceeds(last_sweep, now, SS_SWEEP_INTERVAL_MS))
		{
			sweep_keyspaces();
			last_sweep = now;
		}
		MemoryContextSwitchTo(old);
		MemoryContextReset(loop_context);
		if (!did_work)
			ss_wait_for_background_work(ss_worker_naptime_ms);
	}
	/* Shutdown: everything applied becomes durable in the engine, the slot moves up. */
	ss_advance_horizon();
	ss_mark_clean_shutdown();
	/* Exit code 1: if only the worker was told to stop, the postmaster starts it again. */
	proc_exit(1);
}
