/*
 * host/startup.c: bringing the engine up after every server start, before any backend may
 * touch a slipstream table. Runs in the worker, once per start (a backup promoted to primary
 * will run the same sequence):
 *
 *   1. open the engine (the first process recovers it from its own files);
 *   2. tell a clean shutdown from a crash by the marker the worker leaves after its final sync;
 *      after a crash, empty unlogged tables, as PostgreSQL empties their files;
 *   3. replay our WAL records from the durable horizon (the slot's restart_lsn) to the end of
 *      WAL (wal.c), make them durable in the engine and move the horizon up (horizon.c);
 *   4. mark the engine ready: backends waiting in ss_engine_ready go on.
 *
 * A failure marks the start failed, so that waiting backends get an error instead of waiting.
 */
#include "slipstream.h"
#include "replication/repl.h"

#include <sys/stat.h>
#include <unistd.h>

#include "access/xlog.h"
#include "miscadmin.h"
#include "postmaster/interrupt.h"
#include "replication/slot.h"
#include "storage/fd.h"
#include "storage/ipc.h"
#include "utils/memutils.h"
#include "utils/wait_event.h"

/* Path of the marker the worker leaves after a clean shutdown. */
static void
clean_marker_path(char *path, size_t size)
{
	snprintf(path, size, "%s/slipstream/clean_shutdown", DataDir);
}

/* Whether the server stopped cleanly (the marker is there); the marker is consumed. */
static bool
take_clean_shutdown_marker(void)
{
	char		path[MAXPGPATH];
	struct stat st;

	clean_marker_path(path, sizeof(path));
	if (stat(path, &st) != 0)
		return false;
	if (unlink(path) != 0)
		ereport(ERROR, (errcode_for_file_access(),
						errmsg("could not remove \"%s\": %m", path)));
	return true;
}

/* Removes a clean-shutdown marker left by a worker that stopped while the server ran on. */
static void
forget_clean_shutdown(void)
{
	char		path[MAXPGPATH];

	clean_marker_path(path, sizeof(path));
	if (unlink(path) != 0 && errno != ENOENT)
		ereport(ERROR, (errcode_for_file_access(),
						errmsg("could not remove \"%s\": %m", path)));
}

/* Leaves the clean-shutdown marker (the worker, after its final sync). */
void
ss_mark_clean_shutdown(void)
{
	char		path[MAXPGPATH];
	FILE	   *f;

	clean_marker_path(path, sizeof(path));
	f = AllocateFile(path, "w");
	if (f == NULL || FreeFile(f) != 0)
		ereport(WARNING, (errcode_for_file_access(),
						  errmsg("could not write \"%s\": %m", path)));
}

/* Drops a keyspace whose relation is unlogged (it has an init fork). */
static void
reset_if_unlogged(uint64 tag, uint32 keyspace, void *arg)
{
	int		   *reset = (int *) arg;

	if ((tag >> 32) == 0)
		return;
	if (!ss_relnode_has_files((Oid) (tag >> 32), (Oid) (tag & 0xffffffff), SS_FILES_INIT, NULL))
		return;
	if (ss_keyspace_drop(keyspace) == SS_OK)
	{
		ss_forget_rowids(tag);
		(*reset)++;
	}
}

/* After a crash: empties every unlogged relation's keyspace. */
static void
reset_unlogged_tables(void)
{
	int			reset = 0;

	SS_CHECK(ss_keyspace_list(reset_if_unlogged, &reset), "listing keyspaces");
	if (reset > 0)
		ereport(LOG, (errmsg("slipstream: emptied %d unlogged tables after a crash", reset)));
}

/* Opens the gate: backends waiting in ss_engine_ready go on. */
static void
mark_ready(void)
{
	pg_atomic_write_u32(&ss_shared->replay_state, SS_REPLAY_READY);
	ConditionVariableBroadcast(&ss_shared->replay_cv);
}

/* Marks replay as failed so that waiting backends get an error instead of waiting on. */
static void
mark_replay_failed(const char *message)
{
	strlcpy(ss_shared->replay_error, message, sizeof(ss_shared->replay_error));
	pg_atomic_write_u32(&ss_shared->replay_state, SS_REPLAY_FAILED);
	ConditionVariableBroadcast(&ss_shared->replay_cv);
}

/*
 * A promoted standby that imported its levels: waits until the backup worker no longer
 * imports (it stops at the end of recovery), and refuses to go on if no import covers WAL this
 * node holds: replaying from anywhere else would lose what the primary had in its memtables.
 * The replay below then starts at the slot, the horizon of the last import.
 */
static void
take_over_imported_engine(void)
{
	while (pg_atomic_read_u32(&ss_repl->importing) != 0)
	{
		CHECK_FOR_INTERRUPTS();
		if (ShutdownRequestPending)
			proc_exit(1);
		pg_usleep(10000);
	}
	if (ss_slot_horizon() == InvalidXLogRecPtr)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("slipstream: this node was promoted before its engine imported levels "
						"that its WAL covers"),
				 errhint("Seed the node again from a primary with scripts/seed_backup.sh; a "
						 "Send-Index backup can take over once slipstream.index_import shows it "
						 "promotable. A node that is not a Send-Index backup needs "
						 "slipstream.backup_engine = replay.")));
	pg_atomic_write_u32(&ss_shared->standby, 1);
	ereport(LOG, (errmsg("slipstream: taking over the imported levels; the WAL from %X/%X "
						 "rebuilds the rest", LSN_FORMAT_ARGS(ss_slot_horizon()))));
}

/* The startup sequence itself (see the top of this file). */
static void
start_engine(void)
{
	XLogRecPtr	start;
	XLogRecPtr	end;
	uint64		applied = 0;

	if (pg_atomic_read_u32(&ss_shared->standby) == 2)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("slipstream: this node was promoted, but its engine was not kept "
						"current as a standby: %s", ss_shared->replay_error),
				 errhint("Seed the node again from a primary with scripts/seed_backup.sh.")));
	/* By the setting, not by rm_startup: a standby may be promoted before it replays a record. */
	if (ss_engine_imports())
		take_over_imported_engine();
	if (pg_atomic_read_u32(&ss_shared->replay_state) == SS_REPLAY_READY)
	{
		/*
		 * A restarted worker in a running server: the gate is open and backends change the
		 * engine, so replaying older WAL now would overwrite newer rows. Nothing to do.
		 */
		ss_engine_attach();
		forget_clean_shutdown();	/* the server did not stop: the marker means nothing */
		ss_acquire_slot();
		return;
	}
	pg_atomic_write_u32(&ss_shared->replay_state, SS_REPLAY_RUNNING);

	/* 1. Open the engine. */
	ss_engine_attach();

	/* 2. Clean shutdown or crash. */
	if (!take_clean_shutdown_marker())
		reset_unlogged_tables();

	/* 3. Replay our WAL from the durable horizon. */
	ss_acquire_slot();
	start = MyReplicationSlot->data.restart_lsn;
	end = GetFlushRecPtr(NULL);
	pg_atomic_write_u64(&ss_shared->durable_horizon, start);
	if (start != InvalidXLogRecPtr && start < end)
		applied = ss_replay_wal(start, end);
	pg_atomic_write_u64(&ss_shared->replayed_records, applied);
	/* Everything replayed is in the WAL already; make it durable in the engine too. */
	SS_CHECK(ss_sync_all(), "syncing the replayed changes");
	ss_advance_horizon();
	if (applied > 0)
		ereport(LOG, (errmsg("slipstream: replayed " UINT64_FORMAT " WAL records from %X/%X "
							 "to %X/%X into the engine", applied, LSN_FORMAT_ARGS(start),
							 LSN_FORMAT_ARGS(end))));

	/* 4. Ready. */
	mark_ready();
}

/* Brings the engine up (the worker, once per start); a failure is recorded, then rethrown. */
void
ss_engine_startup(void)
{
	PG_TRY();
	{
		start_engine();
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(TopMemoryContext);
		edata = CopyErrorData();
		mark_replay_failed(edata->message);
		PG_RE_THROW();
	}
	PG_END_TRY();
}

/* Opens the engine and waits for WAL replay: every table access goes through here. */
void
ss_engine_ready(void)
{
	uint32		state;

	if (ss_shared != NULL && pg_atomic_read_u32(&ss_shared->replay_state) == SS_REPLAY_READY &&
		ss_is_open())
		return;
	if (ss_shared == NULL)
		ss_engine_attach();		/* reports that the library was not preloaded */
	for (;;)
	{
		state = pg_atomic_read_u32(&ss_shared->replay_state);
		if (state == SS_REPLAY_READY)
			break;
		if (ss_engine_imports() && RecoveryInProgress())
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("slipstream tables cannot be read on a backup that imports its "
							"primary's levels"),
					 errdetail("slipstream.backup_engine = import: the engine holds the levels "
							   "of the primary's last compaction, not the changes since."),
					 errhint("Read on the primary, or on a standby with "
							 "slipstream.backup_engine = replay.")));
		if (state == SS_REPLAY_FAILED && pg_atomic_read_u32(&ss_shared->standby) == 2)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("slipstream: the engine on this node is not a copy of the "
							"primary's: %s", ss_shared->replay_error),
					 errhint("Seed this standby again with scripts/seed_backup.sh; see "
							 "docs/replication.md.")));
		if (state == SS_REPLAY_FAILED)
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("slipstream: replaying the WAL into the engine failed: %s",
							ss_shared->replay_error),
					 errhint("See the server log of the slipstream worker.")));
		ConditionVariableTimedSleep(&ss_shared->replay_cv, 100, PG_WAIT_EXTENSION);
		CHECK_FOR_INTERRUPTS();
	}
	ConditionVariableCancelSleep();
	/* Opened only now: on a standby, the startup process has seeded or checked it first. */
	ss_engine_attach();
}
