/*
 * replication/backup_worker.c: the backup server worker. When serve_backup() has configured
 * this node as a backup, it runs a BackupServer (replication/backup_server.h) whose buffers
 * primaries fill with one-sided writes; segments are made durable under
 * $PGDATA/slipstream_backup/<primary>/. It publishes the buffers it holds for the
 * slipstream.backup_buffers view and restarts the server when the configuration changes.
 * SIGTERM stops it, persisting every open buffer first.
 */
#include "slipstream.h"
#include "replication/repl.h"

#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "utils/wait_event.h"

PGDLLEXPORT void ss_backup_worker_main(Datum arg);

/* Starts serving per the current configuration, recording the outcome. */
static SsBackupServer *
start_server(uint32 generation)
{
	SsServeConfig copy;
	SsBackupServer *server = NULL;
	char		bound[SS_REPL_TEXT] = "";
	char		error[SS_REPL_ERROR_SIZE] = "";
	char		directory[MAXPGPATH];
	bool		ok;

	LWLockAcquire(ss_repl->lock, LW_SHARED);
	copy = ss_repl->serve;
	LWLockRelease(ss_repl->lock);
	snprintf(directory, sizeof(directory), "%s/slipstream_backup", DataDir);
	ok = ss_backup_server_start(copy.listen, copy.secret, copy.buffers, copy.buffer_size,
								directory, &server, bound, sizeof(bound), error);
	LWLockAcquire(ss_repl->lock, LW_EXCLUSIVE);
	ss_repl->serve.running_generation = generation;
	ss_repl->serve.serving = ok;
	strlcpy(ss_repl->serve.bound, ok ? bound : "", sizeof(ss_repl->serve.bound));
	strlcpy(ss_repl->serve.error, ok ? "" : error, sizeof(ss_repl->serve.error));
	ss_repl->serve.nrows = 0;
	LWLockRelease(ss_repl->lock);
	if (ok)
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

/* The backup worker's main loop. */
void
ss_backup_worker_main(Datum arg)
{
	SsBackupServer *server = NULL;
	uint32		serving_generation = 0;

	pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	BackgroundWorkerUnblockSignals();
	ss_repl->backup_worker_pgprocno = MyProc->pgprocno;

	while (!ShutdownRequestPending)
	{
		bool		requested;
		uint32		generation;

		CHECK_FOR_INTERRUPTS();
		LWLockAcquire(ss_repl->lock, LW_SHARED);
		requested = ss_repl->serve.requested;
		generation = ss_repl->serve.generation;
		LWLockRelease(ss_repl->lock);
		if (generation != serving_generation)
		{
			if (server != NULL)
			{
				ss_backup_server_stop(server);
				server = NULL;
			}
			serving_generation = generation;
			if (requested)
				server = start_server(generation);
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
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, 100,
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
	if (server != NULL)
		ss_backup_server_stop(server);
	ss_repl->backup_worker_pgprocno = -1;
	proc_exit(0);
}
