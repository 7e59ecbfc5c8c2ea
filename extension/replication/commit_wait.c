/*
 * replication/commit_wait.c: a committing backend waits, in its commit callback, until the
 * WAL of its commit is placed in (remote_memory) or durable on (remote_flush)
 * slipstream.min_sync_backups backups. PostgreSQL has already made the commit visible (as for
 * its own synchronous replication); only the client's answer waits. Nothing here may raise an
 * ERROR (the transaction is committed): a cancel or termination ends the wait with a WARNING.
 */
#include "slipstream.h"
#include "replication/repl.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "miscadmin.h"
#include "storage/lwlock.h"
#include "tcop/tcopprot.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#define SS_DIRECT_CHUNK (256 * 1024)	/* WAL read per append by a backend */
#define SS_DIRECT_PASSES 8			/* placement passes of one leader at most */
/*
 * How long a backend placing over tcp waits for a backup's ACKs, and for a placer link to
 * connect, before it leaves that backup to the shipper (which then drops and resumes it).
 */
#define SS_PLACER_TIMEOUT_MS 1000

/* This backend's reader of pg_wal and its mappings of the backups (made on first use). */
static SsWalReader direct_reader;
static bool direct_reader_ready = false;
static SsDirectWriter *direct_writers[SS_MAX_BACKUPS];

/*
 * Whom this backend's placer link to backup i joins: the shipper's session there. The slot's
 * text may change under add_backup/drop_backup, so it is copied under the lock (a change also
 * bumps the generation, after which the shipper describes no buffer until it reconnected).
 */
static bool
placer_identity(int i, SsPlacerIdentity *who, char *address, char *secret)
{
	SsBackupSlot *slot = &ss_repl->backups[i];
	bool		tcp;

	LWLockAcquire(ss_repl->lock, LW_SHARED);
	tcp = slot->in_use && strcmp(slot->transport, "tcp") == 0;
	if (tcp)
	{
		strlcpy(address, slot->address, SS_REPL_TEXT);
		strlcpy(secret, slot->secret, SS_REPL_TEXT);
		who->version = slot->version;
	}
	LWLockRelease(ss_repl->lock);
	who->address = address;
	who->secret = secret;
	who->system_id = GetSystemIdentifier();
	who->primary = ss_repl_primary_name();
	who->connect_timeout_ms = SS_PLACER_TIMEOUT_MS;
	return tcp;
}

/*
 * One pass of placement, under place_lock: appends the WAL flushed now to every streaming
 * backup whose open buffer backends may append to (shm, and tcp through this backend's placer
 * links), as the shipper would. Over tcp the WRITEs to every backup go out first and their
 * ACKs are awaited after, so the round trips overlap. *complete is cleared when a streaming
 * backup could not be served this way (no open buffer, a full buffer, a refusal, a link that
 * failed, WAL that cannot be read); returns the flush position it placed up to.
 */
static XLogRecPtr
place_pass(bool *complete, bool *placed_any)
{
	TimeLineID	tli;
	XLogRecPtr	flush = GetFlushRecPtr(&tli);
	char		error[SS_REPL_ERROR_SIZE];
	XLogRecPtr	ends[SS_MAX_BACKUPS];
	SsDirectCursor before[SS_MAX_BACKUPS];
	TimestampTz spin_end;

	for (int i = 0; i < SS_MAX_BACKUPS; i++)
	{
		SsBackupSlot *slot = &ss_repl->backups[i];
		SsDirectCursor *direct = &slot->direct;
		XLogRecPtr	end;
		SsPlacerIdentity who;
		char		address[SS_REPL_TEXT];
		char		secret[SS_REPL_TEXT];
		bool		tcp;

		ends[i] = InvalidXLogRecPtr;

		/* The shipper keeps the state current; an old value only sends the commit its way. */
		if (!slot->in_use || slot->state != SS_BACKUP_STREAMING ||
			!ss_direct_cursor_valid(direct))
		{
			/* A mapping of a backup that went away would keep its memory alive. */
			if (direct_writers[i] != NULL)
			{
				ss_direct_writer_close(direct_writers[i]);
				direct_writers[i] = NULL;
			}
			if (slot->in_use && slot->state == SS_BACKUP_STREAMING)
				*complete = false;
			continue;
		}
		tcp = placer_identity(i, &who, address, secret);
		before[i] = *direct;
		end = ss_direct_cursor_end(direct);
		while (end < flush)
		{
			Size		len = ss_wal_read_size(&direct_reader, end, flush);
			size_t		appended = 0;

			if (!ss_wal_read(&direct_reader, end, len, tli, error) ||
				!ss_direct_append(direct, &direct_writers[i], tcp ? &who : NULL, end,
								  direct_reader.buffer, len, &appended, error))
			{
				ereport(DEBUG1,
						(errmsg("slipstream: backend placement on backup \"%s\" gave way to the shipper: %s",
								slot->name, error)));
				break;
			}
			end += appended;
			if (appended < len)
				break;			/* the buffer is full: the shipper opens the next */
		}
		if (end < flush)
			*complete = false;
		ends[i] = end;
	}
	/*
	 * Every backup was written to: now their acknowledgements (none to wait for over shm),
	 * polled for without sleeping during slipstream.placement_spin_us in all.
	 */
	spin_end = GetCurrentTimestamp() + ss_placement_spin_us;
	for (int i = 0; i < SS_MAX_BACKUPS; i++)
	{
		SsBackupSlot *slot = &ss_repl->backups[i];
		XLogRecPtr	end = ends[i];
		int			spin_us;

		if (end == InvalidXLogRecPtr)
			continue;			/* not tried */
		spin_us = (int) Max(spin_end - GetCurrentTimestamp(), 0);
		if (!ss_direct_finish(&slot->direct, direct_writers[i], &before[i], SS_PLACER_TIMEOUT_MS,
							  spin_us, error))
		{
			ereport(DEBUG1,
					(errmsg("slipstream: backend placement on backup \"%s\" gave way to the shipper: %s",
							slot->name, error)));
			*complete = false;
			continue;
		}
		if (end <= ss_direct_cursor_end(&before[i]))
			continue;
		if (end > slot->placed_lsn)
		{
			LWLockAcquire(ss_repl->lock, LW_EXCLUSIVE);
			if (end > slot->placed_lsn)
				slot->placed_lsn = end;
			if (end > slot->sent_lsn)
				slot->sent_lsn = end;
			slot->direct_rounds++;
			LWLockRelease(ss_repl->lock);
			*placed_any = true;
		}
	}
	return flush;
}

/*
 * Places this backend's commit itself, when no other process is appending to the backups:
 * the commit then needs neither a wake-up of the shipper nor one of its own, which on a
 * machine whose cores are all busy is what a commit waits for. As the leader of a group
 * commit, it goes on while more WAL was flushed meanwhile (the commits of backends that found
 * the lock taken and wait to be woken by its publish), a few passes at most. Backups it cannot
 * serve are left to the shipper, which it wakes. Returns whether the commit is placed on
 * enough backups. Never raises an ERROR.
 */
static bool
place_own_commit(XLogRecPtr target)
{
	bool		complete = true;
	bool		wake_shipper = false;

	if (!direct_reader_ready)
		direct_reader_ready = ss_wal_reader_init(&direct_reader, SS_DIRECT_CHUNK);
	if (!direct_reader_ready)
		return false;
	for (int pass = 0; pass < SS_DIRECT_PASSES; pass++)
	{
		bool		placed_any = false;
		XLogRecPtr	placed_to;

		if (!LWLockConditionalAcquire(ss_repl->place_lock, LW_EXCLUSIVE))
		{
			/* Another process took over; the first time, the caller waits as before. */
			wake_shipper = pass > 0;
			break;
		}
		ss_repl->placing_pgprocno = MyProc->pgprocno;
		placed_to = place_pass(&complete, &placed_any);
		ss_repl->placing_pgprocno = -1;
		LWLockRelease(ss_repl->place_lock);
		if (placed_any)
			ss_repl_publish();
		if (!complete)
		{
			wake_shipper = true;	/* for the backups this could not serve */
			break;
		}
		if (GetFlushRecPtr(NULL) <= placed_to)
			break;
		wake_shipper = pass == SS_DIRECT_PASSES - 1;	/* WAL is left for it */
	}
	if (wake_shipper)
		ss_repl_wake(ss_repl->shipper_pgprocno);
	return pg_atomic_read_u64(&ss_repl->placed_lsn) >= target;
}

/* What ss_repl_commit_prepare saw of the committing transaction. */
static bool commit_wrote_wal = false;
static bool commit_has_xid = false;
static XLogRecPtr commit_end_before = InvalidXLogRecPtr;

/*
 * At XACT_EVENT_PRE_COMMIT: what the commit wait needs to know of the transaction, whether it
 * wrote WAL and whether it has an xid. A commit waits as PostgreSQL's synchronous replication
 * does: one with an xid that wrote WAL, and one without an xid whose WAL PostgreSQL flushed
 * itself (COMMIT PREPARED, whose record it flushes). Not a read-only transaction (it keeps
 * the last one's XactLastCommitEnd), nor one that wrote WAL without an xid and that nobody
 * flushed: a read that pruned, whose wait for the placement of unflushed WAL lasted until
 * the WAL writer came by (YCSB's reads waited 100 ms about once in a hundred).
 */
void
ss_repl_commit_prepare(void)
{
	commit_wrote_wal = XactLastRecEnd != InvalidXLogRecPtr;
	commit_has_xid = TransactionIdIsValid(GetTopTransactionIdIfAny());
	commit_end_before = XactLastCommitEnd;
}

/* Whether the remote commit modes apply at all: a mode, a backup, and a process to wait in. */
static bool
remote_wait_wanted(void)
{
	return ss_commit_mode != SS_COMMIT_LOCAL && ss_repl != NULL && ss_min_sync_backups > 0 &&
		MyProc != NULL && ss_repl_configured_backups() > 0;
}

/*
 * Waits until the flushed WAL up to `target` is placed (remote_memory) or durable
 * (remote_flush) on slipstream.min_sync_backups backups. `done` says what the transaction
 * already is locally ("committed", "been prepared") in the WARNING a cancel gets.
 */
static void
wait_for_backups(XLogRecPtr target, const char *done)
{
	bool		flush = ss_commit_mode == SS_COMMIT_REMOTE_FLUSH;
	pg_atomic_uint64 *progress;

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
	if (!flush && ss_backend_placement && place_own_commit(target))
		return;
	pg_atomic_write_u64(&ss_repl->waiting[MyProc->pgprocno], target);
	/*
	 * Whoever publishes next (the shipper, or a backend placing now) reads the waits after it
	 * raised the positions: with this barrier, either it sees ours or we see its position.
	 */
	pg_memory_barrier();
	/* A backend placing now goes on while WAL was flushed meanwhile, ours included. */
	if (ss_repl->placing_pgprocno < 0)
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
					 errdetail("The transaction has already %s locally, but might not have been replicated to the backups.", done)));
			whereToSendOutput = DestNone;
			break;
		}
		if (QueryCancelPending)
		{
			QueryCancelPending = false;
			ereport(WARNING,
					(errmsg("canceling the wait for slipstream replication"),
					 errdetail("The transaction has already %s locally, but might not have been replicated to the backups.", done)));
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

/* Waits for this backend's last commit (XactLastCommitEnd) per slipstream.commit_mode. */
void
ss_repl_commit_wait(void)
{
	XLogRecPtr	target = XactLastCommitEnd;

	if (!remote_wait_wanted() || target == InvalidXLogRecPtr || !commit_wrote_wal ||
		target == commit_end_before)
		return;
	commit_wrote_wal = false;
	if (target > GetFlushRecPtr(NULL))
	{
		if (!commit_has_xid)
			return;
		/*
		 * Only flushed WAL is shipped: a commit that synchronous_commit = off left unflushed
		 * is flushed here, since the remote modes promise more than a local flush.
		 */
		XLogFlush(target);
	}
	wait_for_backups(target, "committed");
}

/*
 * At XACT_EVENT_PREPARE: waits for the PREPARE TRANSACTION record, as PostgreSQL's
 * synchronous replication does (EndPrepare), so that a prepared transaction a transaction
 * manager was told of survives a takeover. PostgreSQL flushed the record and has already reset
 * XactLastRecEnd; the record ends at or before the flush position, which is the target.
 */
void
ss_repl_prepare_wait(void)
{
	if (!remote_wait_wanted())
		return;
	wait_for_backups(GetFlushRecPtr(NULL), "been prepared");
}
