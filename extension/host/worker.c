/*
 * host/worker.c: the slipstream background worker. After every server start it brings the
 * engine up (startup.c: recovery and WAL replay, then the gate opens for backends), then
 * loops: engine background work (log flushes, compactions, GC), advancing the durable horizon,
 * and dropping keyspaces whose relation files PostgreSQL has removed (DROP TABLE, TRUNCATE,
 * DROP DATABASE, aborted CREATE). On a standby it runs while recovery goes on: the startup
 * process applies our records (standby.c) and the worker does the background work, keeps the
 * engine durable up to the replay position and sweeps; after a promotion it goes on as a
 * primary's worker. SIGTERM ends it after a final sync; after a crash the postmaster restarts
 * it.
 */
#include "slipstream.h"
#include "replication/repl.h"

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

/* Registers a restartable worker of this library that starts at `start_time`. */
void
ss_register_bgworker_at(const char *function, const char *name, int start_time)
{
	BackgroundWorker worker;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS;
	worker.bgw_start_time = (BgWorkerStartTime) start_time;
	worker.bgw_restart_time = 1;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "slipstream");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "%s", function);
	snprintf(worker.bgw_name, BGW_MAXLEN, "slipstream %s", name);
	snprintf(worker.bgw_type, BGW_MAXLEN, "slipstream %s", name);
	RegisterBackgroundWorker(&worker);
}

/* Registers a restartable worker of this library that starts once recovery has finished. */
void
ss_register_bgworker(const char *function, const char *name)
{
	ss_register_bgworker_at(function, name, BgWorkerStart_RecoveryFinished);
}

/*
 * Registers the engine worker (from _PG_init). It starts with the postmaster, since on a
 * standby it keeps the engine durable while recovery goes on (run_during_recovery); on a
 * primary it waits for the end of crash recovery.
 */
void
ss_register_worker(void)
{
	ss_register_bgworker_at("ss_worker_main", "worker", BgWorkerStart_PostmasterStart);
}

typedef struct SweepState
{
	int			dropped;
} SweepState;

/* Drops a keyspace whose relation file no longer exists in any tablespace. */
static void
sweep_one(uint64 tag, uint32 keyspace, void *arg)
{
	SweepState *state = (SweepState *) arg;
	Oid			db = (Oid) (tag >> 32);
	Oid			relnode = (Oid) (tag & 0xffffffff);

	if (db == InvalidOid)
		return;					/* reserved tags */
	if (ss_relnode_has_files(db, relnode, SS_FILES_MAIN | SS_FILES_TEMP, NULL))
		return;
	if (ss_keyspace_drop(keyspace) == SS_OK)
	{
		ss_forget_rowids(tag);
		state->dropped++;
	}
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

/* Reloads the configuration when asked and ends with the postmaster; true on shutdown. */
static bool
worker_interrupts(void)
{
	CHECK_FOR_INTERRUPTS();
	if (!PostmasterIsAlive())
		proc_exit(1);			/* the postmaster died: our shared memory goes with it */
	if (ConfigReloadPending)
	{
		ConfigReloadPending = false;
		ProcessConfigFile(PGC_SIGHUP);
	}
	return ShutdownRequestPending;
}

/*
 * While this node is in recovery: on a standby whose startup process applies our records
 * (standby.c), do the engine's background work, keep it durable up to the replay position
 * and sweep dropped tables; during a primary's crash recovery, and on a standby whose engine
 * failed, only wait. Returns when recovery has ended (a promotion, or the end of crash
 * recovery); exits on shutdown.
 */
static void
run_during_recovery(void)
{
	TimestampTz last_horizon = 0;
	TimestampTz last_sweep = 0;

	while (RecoveryInProgress())
	{
		bool		did_work = false;
		TimestampTz now;

		if (worker_interrupts())
		{
			if (pg_atomic_read_u32(&ss_shared->standby) == 1)
				ss_advance_standby_horizon();
			proc_exit(1);
		}
		if (pg_atomic_read_u32(&ss_shared->standby) != 1 ||
			pg_atomic_read_u32(&ss_shared->replay_state) != SS_REPLAY_READY)
		{
			(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, 100,
							 PG_WAIT_EXTENSION);
			ResetLatch(MyLatch);
			continue;
		}
		ss_engine_attach();
		SS_CHECK(ss_background_work(&did_work), "engine background work");
		now = GetCurrentTimestamp();
		if (TimestampDifferenceExceeds(last_horizon, now, ss_sync_interval_ms))
		{
			ss_advance_standby_horizon();
			last_horizon = now;
		}
		if (TimestampDifferenceExceeds(last_sweep, now, SS_SWEEP_INTERVAL_MS) &&
			ss_sweep_allowed())
		{
			sweep_keyspaces();
			last_sweep = now;
		}
		if (!did_work)
			ss_wait_for_background_work(ss_worker_naptime_ms);
	}
}

/* A promoted standby whose engine failed: nothing to run, and nothing to retry, until told to stop. */
static void
idle_until_shutdown(void)
{
	while (!worker_interrupts())
	{
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, 1000,
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
	proc_exit(0);
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

	run_during_recovery();
	if (pg_atomic_read_u32(&ss_shared->standby) == 2)
		idle_until_shutdown();
	ss_engine_startup();

	loop_context = AllocSetContextCreate(TopMemoryContext, "slipstream worker loop",
										 ALLOCSET_DEFAULT_SIZES);
	while (!ShutdownRequestPending)
	{
		bool		did_work = false;
		TimestampTz now;
		MemoryContext old = MemoryContextSwitchTo(loop_context);

		if (worker_interrupts())
			break;
		ss_index_seed_if_requested();
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
