/*
 * replication/backup_worker.c: the backup server worker. When serve_backup() has configured
 * this node as a backup, it runs a BackupServer (replication/backup_server.h) whose buffers
 * primaries fill with one-sided writes; segments are made durable under
 * $PGDATA/slipstream_backup/<primary>/. On a backup that is a standby (in recovery) the WAL
 * they carry is also written into pg_wal (WalDirectoryStore), from which the startup process
 * replays it; the worker wakes the startup process when more has arrived, or in deferred replay
 * holds it paused until a batch has arrived (pace_replay). A node that is not in
 * recovery keeps the images only: a primary's WAL never goes into the pg_wal of a primary. A
 * standby's images are pruned every 30 s below its oldest restart point. It
 * publishes the buffers it holds for the slipstream.backup_buffers view and restarts the
 * server when the configuration changes or the node leaves recovery. SIGTERM stops it,
 * persisting every open buffer first.
 */
#include "slipstream.h"
#include "replication/repl.h"

#include "access/xlog.h"
#include "access/xlog_internal.h"
#include "access/xlogrecovery.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

PGDLLEXPORT void ss_backup_worker_main(Datum arg);

/*
 * Starts serving per the current configuration, recording the outcome. *standby says whether
 * the server writes into pg_wal: it does when this node is in recovery, from where its replay
 * has reached, and then serves only primaries of its own cluster.
 */
static SsBackupServer *
start_server(uint32 generation, bool *standby)
{
	SsServeConfig copy;
	SsBackupServerOptions options;
	SsBackupServer *server = NULL;
	char		bound[SS_REPL_TEXT] = "";
	char		error[SS_REPL_ERROR_SIZE] = "";
	char		directory[MAXPGPATH];
	char		wal_directory[MAXPGPATH];
	bool		ok;

	LWLockAcquire(ss_repl->lock, LW_SHARED);
	copy = ss_repl->serve;
	LWLockRelease(ss_repl->lock);
	snprintf(directory, sizeof(directory), "%s/slipstream_backup", DataDir);
	memset(&options, 0, sizeof(options));
	options.listen = copy.listen;
	options.secret = copy.secret;
	options.buffers = copy.buffers;
	options.buffer_size = copy.buffer_size;
	options.directory = directory;
	*standby = RecoveryInProgress();
	if (*standby && ss_engine_imports())
	{
		/*
		 * This process will import: the flag keeps a promotion's replay waiting. It is set
		 * before recovery is looked at again, so that either the engine worker sees it, or this
		 * sees that recovery ended and serves as a node that is not a standby.
		 */
		pg_atomic_write_u32(&ss_repl->importing, 1);
		pg_memory_barrier();
		if (!RecoveryInProgress())
		{
			pg_atomic_write_u32(&ss_repl->importing, 0);
			*standby = false;
		}
	}
	if (*standby)
	{
		TimeLineID	tli;

		options.resume_lsn = GetXLogReplayRecPtr(&tli);
		options.timeline = tli;
		options.wal_segment_size = wal_segment_size;
		snprintf(wal_directory, sizeof(wal_directory), "%s/" XLOGDIR, DataDir);
		options.wal_directory = wal_directory;
		options.system_id = GetSystemIdentifier();
		if (ss_engine_imports())
		{
			ss_engine_attach();
			options.import_index = true;
		}
	}
	ok = ss_backup_server_start(&options, &server, bound, sizeof(bound), error);
	if (!ok)
		pg_atomic_write_u32(&ss_repl->importing, 0);
	LWLockAcquire(ss_repl->lock, LW_EXCLUSIVE);
	ss_repl->serve.running_generation = generation;
	ss_repl->serve.serving = ok;
	strlcpy(ss_repl->serve.bound, ok ? bound : "", sizeof(ss_repl->serve.bound));
	strlcpy(ss_repl->serve.error, ok ? "" : error, sizeof(ss_repl->serve.error));
	ss_repl->serve.nrows = 0;
	LWLockRelease(ss_repl->lock);
	if (ok && *standby)
		ereport(LOG, (errmsg("slipstream: serving as a backup at %s, writing the WAL received "
							 "into pg_wal from %X/%X on timeline %u",
							 bound, LSN_FORMAT_ARGS(options.resume_lsn), options.timeline)));
	else if (ok)
		ereport(LOG, (errmsg("slipstream: serving as a backup at %s", bound)));
	else
		ereport(LOG, (errmsg("slipstream: cannot serve as a backup at %s: %s", copy.listen, error)));
	return ok ? server : NULL;
}

/* Copies the server's open buffers into shared memory for the view. */
static void
publish_buffers(SsBackupServer *server)
{
	SsBufferRow rows[SS_MAX_BUFFER_ROWS];
	int			n = server ? ss_backup_server_buffers(server, rows, SS_MAX_BUFFER_ROWS) : 0;
	char		error[SS_REPL_ERROR_SIZE];
	bool		has_error = server && ss_backup_server_last_error(server, error);

	LWLockAcquire(ss_repl->lock, LW_EXCLUSIVE);
	memcpy(ss_repl->serve.rows, rows, sizeof(SsBufferRow) * n);
	ss_repl->serve.nrows = n;
	if (has_error)
		strlcpy(ss_repl->serve.error, error, sizeof(ss_repl->serve.error));
	LWLockRelease(ss_repl->lock);
}

/* The server this process runs (NULL: none), for the exit callback. */
static SsBackupServer *running_server = NULL;

/* Stops the server; an importing one no longer holds the engine after this. */
static void
stop_server(SsBackupServer *server)
{
	uint64		held;

	running_server = NULL;
	held = ss_backup_server_stop(server);
	if (held > pg_atomic_read_u64(&ss_repl->held_wal_lsn))
		pg_atomic_write_u64(&ss_repl->held_wal_lsn, held);
	pg_atomic_write_u32(&ss_repl->importing, 0);
	/* The last buffers went into pg_wal: replay need not wait for its next look. */
	if (RecoveryInProgress())
		WakeupRecovery();
}

/* Frames the import refused when the server (re)started: those of its kept images. */
static uint64 refused_at_start = 0;

/* When the server was last restarted for a refused frame (restarts are 30 s apart at least). */
static TimestampTz last_refusal_restart = 0;

/*
 * An importing standby: publishes how far the import got, and moves the slot "slipstream" to
 * the WAL horizon the installed levels cover, from which a promotion replays. A frame the
 * import refused (damaged, out of order, naming a segment it lacks) is never installed: the
 * import skips the stream until the primary's next seed, which comes with its next connection,
 * so this returns true to have the server restarted (its connections dropped). Meanwhile the WAL
 * still arrives and the slot keeps it from the last horizon: nothing is lost, a promotion only
 * replays more.
 */
static bool
follow_import(SsBackupServer *server)
{
	SsImportStatus status;

	if (!ss_backup_server_import_status(server, &status))
		return false;
	LWLockAcquire(ss_repl->lock, LW_EXCLUSIVE);
	ss_repl->import = status;
	LWLockRelease(ss_repl->lock);
	/* Never beyond the WAL this backup holds in pg_wal: a promotion replays from there. */
	if (RecoveryInProgress() && status.horizon <= ss_backup_server_wal_end(server))
		(void) ss_import_advance_slot(status.horizon);
	if (status.refused > refused_at_start && status.awaiting_seed &&
		TimestampDifferenceExceeds(last_refusal_restart, GetCurrentTimestamp(), 30000))
	{
		last_refusal_restart = GetCurrentTimestamp();
		ereport(WARNING,
				(errmsg("slipstream: this backup refused a frame of its primary's index stream: %s",
						status.error),
				 errdetail("Nothing of it was installed; the WAL from the last imported horizon "
						   "is kept."),
				 errhint("The backup reconnects its primary, whose next connection ships the "
						 "levels again.")));
		return true;
	}
	return false;
}

/* Notes the refusals a server found in its kept images when it started. */
static void
note_import_start(SsBackupServer *server)
{
	SsImportStatus status;

	refused_at_start = ss_backup_server_import_status(server, &status) ? status.refused : 0;
}

/* How often a standby's buffer images are pruned. */
#define SS_PRUNE_INTERVAL_MS 30000

/*
 * Deletes the buffer images that hold only WAL below this standby's oldest restart point: it
 * never needs that WAL again (its pg_wal may have removed it already), and after a crash it
 * resumes from its replay position, which is at or above that restart point, so the images
 * the store redoes from are all kept. A failure is only a warning: serving goes on, and the
 * next prune tries again.
 */
static void
prune_images(SsBackupServer *server)
{
	XLogRecPtr	redo;
	TimeLineID	tli;
	uint64_t	removed = 0;
	char		error[SS_REPL_ERROR_SIZE] = "";

	GetOldestRestartPoint(&redo, &tli);
	if (XLogRecPtrIsInvalid(redo))
		return;
	if (ss_backup_server_prune(server, redo, &removed, error))
		ereport(DEBUG1, (errmsg("slipstream: pruned " UINT64_FORMAT " buffer images holding only "
								"WAL below the restart point %X/%X",
								(uint64) removed, LSN_FORMAT_ARGS(redo))));
	else
		ereport(WARNING, (errmsg("slipstream: cannot prune the buffer images below %X/%X "
								 "(" UINT64_FORMAT " removed): %s",
								 LSN_FORMAT_ARGS(redo), (uint64) removed, error)));
}

/*
 * Paces the startup process in deferred replay (slipstream.backup_replay = deferred): it is
 * held paused while less than slipstream.backup_replay_lag of the WAL in pg_wal (up to
 * wal_end) is unreplayed, and released to replay a batch, down to less than one WAL segment,
 * once more is. So a passive backup spends no CPU on replay while its primary is busy, and a
 * takeover replays at most about that much. A pause this worker did not make
 * (pg_wal_replay_pause()) is left alone; a resume it did not make (pg_wal_replay_resume(), or a
 * promotion, which ends any pause) replays one batch. Continuous replay releases a hold.
 */
static void
pace_replay(XLogRecPtr wal_end)
{
	XLogRecPtr	replay = GetXLogReplayRecPtr(NULL);
	uint64		lag = wal_end > replay ? wal_end - replay : 0;
	uint64		batch = (uint64) ss_backup_replay_lag_mb * 1024 * 1024;
	bool		deferred = ss_backup_replay == SS_REPLAY_DEFERRED && !PromoteIsTriggered();
	RecoveryPauseState state = GetRecoveryPauseState();

	if (ss_repl->replay_held && state == RECOVERY_NOT_PAUSED)
		ss_repl->replay_held = false;
	if (ss_repl->replay_held && (!deferred || lag >= batch))
	{
		SetRecoveryPause(false);
		ss_repl->replay_held = false;
		if (deferred)
			ereport(DEBUG1, (errmsg("slipstream: replaying a batch of " UINT64_FORMAT " bytes of WAL",
									(uint64) lag)));
	}
	else if (!ss_repl->replay_held && deferred && state == RECOVERY_NOT_PAUSED &&
			 lag < (uint64) wal_segment_size)
	{
		SetRecoveryPause(true);
		ss_repl->replay_held = true;
	}
}

/* Ends a pause of deferred replay: the node no longer serves, or no longer as a standby. */
static void
release_replay(void)
{
	if (!ss_repl->replay_held)
		return;
	if (RecoveryInProgress() && GetRecoveryPauseState() != RECOVERY_NOT_PAUSED)
		SetRecoveryPause(false);
	ss_repl->replay_held = false;
}

/*
 * On exit, however it comes (an ERROR too): the server stops first, its sessions joined, so that
 * no import goes on once a promotion may take the engine over; then the flag clears.
 */
static void
clear_importing(int code, Datum arg)
{
	if (running_server != NULL)
	{
		ss_backup_server_stop(running_server);
		running_server = NULL;
	}
	pg_atomic_write_u32(&ss_repl->importing, 0);
}

/* The backup worker's main loop. */
void
ss_backup_worker_main(Datum arg)
{
	SsBackupServer *server = NULL;
	uint32		serving_generation = 0;
	bool		standby = false;	/* the server writes into pg_wal */
	XLogRecPtr	wal_end = InvalidXLogRecPtr;	/* of pg_wal, when the startup process was woken */
	TimestampTz last_prune = GetCurrentTimestamp();

	pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	BackgroundWorkerUnblockSignals();
	ss_repl->backup_worker_pgprocno = MyProc->pgprocno;
	before_shmem_exit(clear_importing, 0);

	while (!ShutdownRequestPending)
	{
		bool		requested;
		uint32		generation;

		CHECK_FOR_INTERRUPTS();
		LWLockAcquire(ss_repl->lock, LW_SHARED);
		requested = ss_repl->serve.requested;
		generation = ss_repl->serve.generation;
		LWLockRelease(ss_repl->lock);
		/* Promoted: this node is a primary now, whose pg_wal no primary may write into. */
		if (server != NULL && standby && !RecoveryInProgress())
		{
			ereport(LOG, (errmsg("slipstream: recovery has ended: the backup server stops "
								 "writing into pg_wal and keeps buffer images only")));
			serving_generation = 0;
		}
		if (generation != serving_generation)
		{
			if (server != NULL)
			{
				stop_server(server);
				server = NULL;
			}
			serving_generation = generation;
			standby = false;
			if (requested)
			{
				server = start_server(generation, &standby);
				if (server != NULL)
					note_import_start(server);
				running_server = server;
			}
			else
			{
				LWLockAcquire(ss_repl->lock, LW_EXCLUSIVE);
				ss_repl->serve.running_generation = generation;
				ss_repl->serve.serving = false;
				ss_repl->serve.nrows = 0;
				LWLockRelease(ss_repl->lock);
			}
		}
		publish_buffers(server);
		if (server == NULL || !standby)
			release_replay();
		if (server != NULL && standby)
		{
			XLogRecPtr	end = ss_backup_server_wal_end(server);

			if (end > pg_atomic_read_u64(&ss_repl->held_wal_lsn))
				pg_atomic_write_u64(&ss_repl->held_wal_lsn, end);
			/* More WAL to replay: without this the startup process looks every 5 s. */
			if (end > wal_end)
			{
				WakeupRecovery();
				wal_end = end;
			}
			if (RecoveryInProgress())
				pace_replay(end);
			if (follow_import(server))
				serving_generation = 0;	/* restarted next time round: the primary reconnects */
			if (RecoveryInProgress() &&
				TimestampDifferenceExceeds(last_prune, GetCurrentTimestamp(),
										   SS_PRUNE_INTERVAL_MS))
			{
				prune_images(server);
				last_prune = GetCurrentTimestamp();
			}
		}
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, 100,
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
	if (server != NULL)
		stop_server(server);
	ss_repl->backup_worker_pgprocno = -1;
	/*
	 * Exit code 1: the postmaster starts us again unless it is shutting down. A SIGTERM also
	 * comes from the checkpointer invalidating our slot, or from pg_terminate_backend, and must
	 * not end replication until the next server start.
	 */
	proc_exit(1);
}
