/*
 * replication/commit_wait.c: a committing backend waits, in its commit callback, until the
 * WAL of its commit is placed in (remote_memory) or durable on (remote_flush)
 * slipstream.min_sync_backups backups. PostgreSQL has already made the commit visible (as for
 * its own synchronous replication); only the client's answer waits. Nothing here may raise an
 * ERROR (the transaction is committed): a cancel or termination ends the wait with a WARNING.
 */
#include "slipstream.h"
#include "replication/repl.h"

#include "access/xlog.h"
#include "miscadmin.h"
#include "tcop/tcopprot.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "utils/wait_event.h"

/* Waits for this backend's last commit (XactLastCommitEnd) per slipstream.commit_mode. */
void
ss_repl_commit_wait(void)
{
	XLogRecPtr	target = XactLastCommitEnd;
	bool		flush = ss_commit_mode == SS_COMMIT_REMOTE_FLUSH;
	pg_atomic_uint64 *progress;

	if (ss_commit_mode == SS_COMMIT_LOCAL || ss_repl == NULL || target == InvalidXLogRecPtr ||
		ss_min_sync_backups == 0 || MyProc == NULL || ss_repl_configured_backups() == 0)
		return;
	progress = flush ? &ss_repl->durable_lsn : &ss_repl->placed_lsn;
	if (pg_atomic_read_u64(progress) >= target)
		return;
	if (flush)
	{
		uint64		wanted = pg_atomic_read_u64(&ss_repl->flush_wanted);

		while (wanted < target &&
			   !pg_atomic_compare_exchange_u64(&ss_repl->flush_wanted, &wanted, target))
			;
	}
	pg_atomic_write_u64(&ss_repl->waiting[MyProc->pgprocno], target);
	ss_repl_wake(ss_repl->shipper_pgprocno);
	for (;;)
	{
		if (pg_atomic_read_u64(progress) >= target)
			break;
		if (ProcDiePending)
		{
			ereport(WARNING,
					(errcode(ERRCODE_ADMIN_SHUTDOWN),
					 errmsg("canceling the wait for slipstream replication and terminating the connection"),
					 errdetail("The transaction has already committed locally, but might not have been replicated to the backups.")));
			whereToSendOutput = DestNone;
			break;
		}
		if (QueryCancelPending)
		{
			QueryCancelPending = false;
			ereport(WARNING,
					(errmsg("canceling the wait for slipstream replication"),
					 errdetail("The transaction has already committed locally, but might not have been replicated to the backups.")));
			break;
		}
		/* Not WL_EXIT_ON_PM_DEATH: exiting here would abort a committed transaction. */
		if (WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_POSTMASTER_DEATH, 100,
					  WAIT_EVENT_SYNC_REP) & WL_POSTMASTER_DEATH)
		{
			ProcDiePending = true;	/* end the session once the commit is finished */
			whereToSendOutput = DestNone;
			break;
		}
		ResetLatch(MyLatch);
	}
	pg_atomic_write_u64(&ss_repl->waiting[MyProc->pgprocno], 0);
}
