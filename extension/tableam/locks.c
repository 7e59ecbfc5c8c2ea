/*
 * tableam/locks.c: the row-lock protocol, with PostgreSQL's semantics: xmax carries the
 * deleter, updater or lockers (a MultiXact when several transactions hold the row in
 * compatible modes), and waiting goes through the same heavyweight tuple and transaction locks
 * as heap, so deadlock detection, NOWAIT and SKIP LOCKED behave identically. UPDATE and DELETE
 * (modify.c) and SELECT ... FOR UPDATE/SHARE (tuple_lock, here) get the right to a row here.
 *
 * A striped LWLock (ss_row_lock) makes each check-then-write on one row atomic; it is never
 * held while waiting for another transaction.
 */
#include "slipstream.h"

#include "access/heaptoast.h"
#include "access/multixact.h"
#include "access/xact.h"
#include "catalog/catalog.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "nodes/bitmapset.h"
#include "pgstat.h"
#include "storage/lmgr.h"
#include "storage/predicate.h"
#include "storage/procarray.h"
#include "utils/combocid.h"
#include "utils/datum.h"
#include "utils/relcache.h"
#include "utils/snapmgr.h"

/* The multixact status a transaction holds a row with, for a lock mode. */
static MultiXactStatus
status_for_mode(LockTupleMode mode, bool is_update)
{
	switch (mode)
	{
		case LockTupleKeyShare:
			return MultiXactStatusForKeyShare;
		case LockTupleShare:
			return MultiXactStatusForShare;
		case LockTupleNoKeyExclusive:
			return is_update ? MultiXactStatusNoKeyUpdate : MultiXactStatusForNoKeyUpdate;
		case LockTupleExclusive:
			break;
	}
	return is_update ? MultiXactStatusUpdate : MultiXactStatusForUpdate;
}

/* The lock mode a multixact status amounts to. */
static LockTupleMode
mode_for_status(MultiXactStatus status)
{
	switch (status)
	{
		case MultiXactStatusForKeyShare:
			return LockTupleKeyShare;
		case MultiXactStatusForShare:
			return LockTupleShare;
		case MultiXactStatusForNoKeyUpdate:
		case MultiXactStatusNoKeyUpdate:
			return LockTupleNoKeyExclusive;
		case MultiXactStatusForUpdate:
		case MultiXactStatusUpdate:
			break;
	}
	return LockTupleExclusive;
}

/* Whether two row lock modes conflict (PostgreSQL's row-level lock table). */
static bool
modes_conflict(LockTupleMode a, LockTupleMode b)
{
	if (a > b)
	{
		LockTupleMode t = a;

		a = b;
		b = t;
	}
	/* a <= b in KeyShare < Share < NoKeyExclusive < Exclusive */
	switch (a)
	{
		case LockTupleKeyShare:
			return b == LockTupleExclusive;
		case LockTupleShare:
			return b >= LockTupleNoKeyExclusive;
		default:
			return true;
	}
}

/* The heavyweight tuple lock taken while queueing for a row in `mode`. */
static LOCKMODE
tuple_lock_mode(LockTupleMode mode)
{
	switch (mode)
	{
		case LockTupleKeyShare:
			return AccessShareLock;
		case LockTupleShare:
			return RowShareLock;
		case LockTupleNoKeyExclusive:
			return ExclusiveLock;
		case LockTupleExclusive:
			break;
	}
	return AccessExclusiveLock;
}

/* The transactions named by a row's xmax, with the status each holds it in. */
static int
xmax_members(HeapTupleHeader tuple, MultiXactMember **members)
{
	TransactionId xmax = HeapTupleHeaderGetRawXmax(tuple);
	uint16		infomask = tuple->t_infomask;
	bool		keys = (tuple->t_infomask2 & HEAP_KEYS_UPDATED) != 0;
	MultiXactStatus status;

	*members = NULL;
	if ((infomask & HEAP_XMAX_INVALID) || !TransactionIdIsValid(xmax))
		return 0;
	if (infomask & HEAP_XMAX_IS_MULTI)
	{
		int			n = GetMultiXactIdMembers(xmax, members, false,
											  HEAP_XMAX_IS_LOCKED_ONLY(infomask));

		return Max(n, 0);
	}
	if (HEAP_XMAX_IS_LOCKED_ONLY(infomask))
	{
		if (HEAP_XMAX_IS_KEYSHR_LOCKED(infomask))
			status = MultiXactStatusForKeyShare;
		else if (HEAP_XMAX_IS_SHR_LOCKED(infomask))
			status = MultiXactStatusForShare;
		else
			status = keys ? MultiXactStatusForUpdate : MultiXactStatusForNoKeyUpdate;
	}
	else
		status = keys ? MultiXactStatusUpdate : MultiXactStatusNoKeyUpdate;
	*members = palloc(sizeof(MultiXactMember));
	(*members)[0].xid = xmax;
	(*members)[0].status = status;
	return 1;
}

/* Whether a member still holds the row (running, or us). */
static bool
member_live(TransactionId xid)
{
	return TransactionIdIsCurrentTransactionId(xid) || TransactionIdIsInProgress(xid);
}

/*
 * The lockers of a row version that an update carries over to the new version, as heap_update
 * does: the members of its xmax that hold a lock only and still run (us included: INSERT ...
 * ON CONFLICT DO UPDATE locks the row first). Any other locker conflicted with the update and
 * has ended by the time the row is acquired. A single carried locker is recorded as a key-share
 * lock, as heap records it.
 */
int
ss_carried_lockers(HeapTupleHeader tuple, MultiXactMember **lockers)
{
	MultiXactMember *members;
	int			n = xmax_members(tuple, &members);
	int			kept = 0;

	*lockers = palloc(sizeof(MultiXactMember) * Max(n, 1));
	for (int i = 0; i < n; i++)
	{
		if (members[i].status == MultiXactStatusUpdate ||
			members[i].status == MultiXactStatusNoKeyUpdate || !member_live(members[i].xid))
			continue;
		(*lockers)[kept++] = members[i];
	}
	if (kept == 1)
		(*lockers)[0].status = MultiXactStatusForKeyShare;
	return kept;
}

/* Sets the row's xmax to exactly `members` (one plain xid, or a new MultiXact). */
void
ss_set_xmax_members(HeapTupleHeader tuple, MultiXactMember *members, int n)
{
	bool		has_update = false;
	LockTupleMode strongest = LockTupleKeyShare;
	TransactionId xmax;

	tuple->t_infomask &= ~HEAP_XMAX_BITS;
	tuple->t_infomask2 &= ~HEAP_KEYS_UPDATED;
	if (n == 0)
	{
		tuple->t_infomask |= HEAP_XMAX_INVALID;
		tuple->t_infomask2 &= ~HEAP_HOT_UPDATED;
		HeapTupleHeaderSetXmax(tuple, InvalidTransactionId);
		return;
	}
	for (int i = 0; i < n; i++)
	{
		if (members[i].status == MultiXactStatusUpdate ||
			members[i].status == MultiXactStatusNoKeyUpdate)
			has_update = true;
		if (mode_for_status(members[i].status) > strongest)
			strongest = mode_for_status(members[i].status);
	}
	if (n == 1)
		xmax = members[0].xid;
	else
	{
		xmax = MultiXactIdCreateFromMembers(n, members);
		tuple->t_infomask |= HEAP_XMAX_IS_MULTI;
	}
	if (!has_update)
	{
		/* No update is left: nor is a chain to an aborted update's version (heap does so). */
		tuple->t_infomask |= HEAP_XMAX_LOCK_ONLY;
		tuple->t_infomask2 &= ~HEAP_HOT_UPDATED;
	}
	switch (strongest)
	{
		case LockTupleKeyShare:
			tuple->t_infomask |= HEAP_XMAX_KEYSHR_LOCK;
			break;
		case LockTupleShare:
			tuple->t_infomask |= HEAP_XMAX_SHR_LOCK;
			break;
		case LockTupleNoKeyExclusive:
			tuple->t_infomask |= HEAP_XMAX_EXCL_LOCK;
			break;
		case LockTupleExclusive:
			tuple->t_infomask |= HEAP_XMAX_EXCL_LOCK;
			tuple->t_infomask2 |= HEAP_KEYS_UPDATED;
			break;
	}
	if (n == 1 && has_update)
	{
		/* A plain updater carries no lock bits, only HEAP_KEYS_UPDATED for key updates. */
		tuple->t_infomask &= ~(HEAP_XMAX_KEYSHR_LOCK | HEAP_XMAX_EXCL_LOCK);
	}
	HeapTupleHeaderSetXmax(tuple, xmax);
}

/* Fills the failure report of a row that cannot be modified or locked as asked. */
static void
fill_failure(TM_FailureData *tmfd, HeapTuple tuple, TM_Result result)
{
	tmfd->ctid = tuple->t_data->t_ctid;
	tmfd->xmax = HeapTupleHeaderGetUpdateXid(tuple->t_data);
	tmfd->cmax = result == TM_SelfModified ? HeapTupleHeaderGetCmax(tuple->t_data)
		: InvalidCommandId;
	tmfd->traversed = false;
}

/* Releases whatever an acquisition still holds. */
void
ss_release_acquisition(SsAcquisition *acq)
{
	if (acq->row_locked)
		LWLockRelease(acq->row_lock);
	acq->row_locked = false;
	if (acq->tuple_locked)
		UnlockTuple(acq->rel, &acq->tid, acq->tuple_lock_mode);
	acq->tuple_locked = false;
}

/* Reports a row we could not wait for under NOWAIT. */
static void
report_lock_unavailable(Relation rel)
{
	ereport(ERROR,
			(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
			 errmsg("could not obtain lock on row in relation \"%s\"",
					RelationGetRelationName(rel))));
}

/*
 * Gets the right to modify (is_update) or lock row `tid` in `mode`. On TM_Ok, returns with
 * the row lock held, *tuple the current row image and *members the transactions that must
 * stay in xmax next to us (compatible lockers still running), ready for the caller to write
 * the new header. On any other result nothing is held and tmfd says why.
 */
TM_Result
ss_acquire_row(SsAcquisition *acq, CommandId cid, Snapshot crosscheck, LockTupleMode mode,
			bool is_update, LockWaitPolicy policy, TM_FailureData *tmfd, HeapTuple *tuple_out,
			MultiXactMember **members_out, int *nmembers_out)
{
	uint64		tag = ss_tag(MyDatabaseId, acq->rel->rd_node.relNode);

	acq->row_lock = ss_row_lock(tag, acq->rowid);
	for (;;)
	{
		HeapTuple	tuple;
		TM_Result	result;
		MultiXactMember *members;
		MultiXactMember *keep;
		TransactionId *conflicts;
		int			n,
					nkeep = 0,
					nconflicts = 0;
		bool		committed_updater = false;
		MultiXactStatus ours;

		LWLockAcquire(acq->row_lock, LW_EXCLUSIVE);
		acq->row_locked = true;
		tuple = ss_fetch_row(acq->rel, acq->keyspace, acq->rowid);
		if (acq->new_row != NULL)
		{
			mode = tuple != NULL &&
				!ss_columns_changed(acq->rel, acq->key_columns, tuple, acq->new_row)
				? LockTupleNoKeyExclusive : LockTupleExclusive;
			acq->mode_chosen = mode;
		}
		ours = status_for_mode(mode, is_update);
		if (tuple == NULL)
		{
			ss_release_acquisition(acq);
			tmfd->ctid = acq->tid;
			tmfd->xmax = InvalidTransactionId;
			tmfd->cmax = InvalidCommandId;
			tmfd->traversed = false;
			return TM_Deleted;
		}
		result = ss_tuple_satisfies_update(tuple, cid);
		if (result != TM_Ok && result != TM_BeingModified)
		{
			fill_failure(tmfd, tuple, result);
			ss_release_acquisition(acq);
			*tuple_out = tuple;
			return result;
		}
		n = xmax_members(tuple->t_data, &members);
		keep = palloc(sizeof(MultiXactMember) * (n + 1));
		conflicts = palloc(sizeof(TransactionId) * (n + 1));
		for (int i = 0; i < n; i++)
		{
			TransactionId xid = members[i].xid;
			bool		is_updater = members[i].status == MultiXactStatusUpdate ||
				members[i].status == MultiXactStatusNoKeyUpdate;

			if (!member_live(xid))
			{
				/* Finished lockers and aborted updaters drop out... */
				if (is_updater && TransactionIdDidCommit(xid))
				{
					/* ...but an updater that committed since the check above changed the row. */
					committed_updater = true;
					break;
				}
				continue;
			}
			if (TransactionIdIsCurrentTransactionId(xid))
			{
				/* Our own earlier hold (a lock: an update would have ended above) merges. */
				LockTupleMode held = mode_for_status(members[i].status);

				ours = status_for_mode(Max(mode, held), is_update);
				continue;
			}
			if (modes_conflict(mode_for_status(members[i].status), mode) ||
				(is_updater && is_update))
				conflicts[nconflicts++] = xid;
			else
				keep[nkeep++] = members[i];
		}
		if (committed_updater)
		{
			/* Look again: the check now reports the row as updated (TM_Updated). */
			LWLockRelease(acq->row_lock);
			acq->row_locked = false;
			continue;
		}
		if (nconflicts > 0)
		{
			LWLockRelease(acq->row_lock);
			acq->row_locked = false;
			if (policy == LockWaitSkip)
			{
				ss_release_acquisition(acq);
				return TM_WouldBlock;
			}
			if (!acq->tuple_locked)
			{
				acq->tuple_lock_mode = tuple_lock_mode(mode);
				if (policy == LockWaitBlock)
					LockTuple(acq->rel, &acq->tid, acq->tuple_lock_mode);
				else if (!ConditionalLockTuple(acq->rel, &acq->tid, acq->tuple_lock_mode))
					report_lock_unavailable(acq->rel);
				acq->tuple_locked = true;
			}
			for (int i = 0; i < nconflicts; i++)
			{
				if (policy == LockWaitBlock)
					XactLockTableWait(conflicts[i], acq->rel, &acq->tid,
									  is_update ? XLTW_Update : XLTW_Lock);
				else if (!ConditionalXactLockTableWait(conflicts[i]))
					report_lock_unavailable(acq->rel);
			}
			continue;			/* look again: the row may have changed meanwhile */
		}
		if (is_update && crosscheck != InvalidSnapshot && !ss_tuple_visible(tuple, crosscheck))
		{
			fill_failure(tmfd, tuple, TM_Updated);
			ss_release_acquisition(acq);
			*tuple_out = tuple;
			return TM_Updated;
		}
		keep[nkeep].xid = GetCurrentTransactionId();
		keep[nkeep].status = ours;
		nkeep++;
		*tuple_out = tuple;
		*members_out = keep;
		*nmembers_out = nkeep;
		return TM_Ok;
	}
}

/* Stores a copy of `tuple` in the slot, allocated where the slot frees it. */
static void
store_in_slot(TupleTableSlot *slot, HeapTuple tuple, Relation rel)
{
	MemoryContext old = MemoryContextSwitchTo(slot->tts_mcxt);
	HeapTuple	copy = heap_copytuple(tuple);

	MemoryContextSwitchTo(old);
	ExecStoreHeapTuple(ss_without_root_link(copy), slot, true);
	slot->tts_tableOid = RelationGetRelid(rel);
}

/*
 * Follows an update chain from tmfd->ctid to the newest version (SELECT ... FOR UPDATE under
 * READ COMMITTED). Returns TM_Ok with *tid set, or TM_Deleted if the chain ends in nothing.
 */
static TM_Result
find_last_version(Relation rel, uint32 keyspace, TM_FailureData *tmfd, ItemPointer tid,
				  LockWaitPolicy policy)
{
	TransactionId prior_xmax = tmfd->xmax;
	ItemPointerData next = tmfd->ctid;

	for (;;)
	{
		SnapshotData dirty;
		HeapTuple	tuple;

		CHECK_FOR_INTERRUPTS();
		if (!ss_tid_valid(&next))
			return TM_Deleted;
		tuple = ss_fetch_row(rel, keyspace, ss_tid_to_rowid(&next));
		if (tuple == NULL ||
			!TransactionIdEquals(HeapTupleHeaderGetXmin(tuple->t_data), prior_xmax))
			return TM_Deleted;	/* the successor is gone: treat as deleted */
		InitDirtySnapshot(dirty);
		if (ss_tuple_visible(tuple, &dirty))
		{
			if (TransactionIdIsValid(dirty.xmin))
			{
				/* Its inserter still runs: wait, then look at the same version again. */
				if (policy == LockWaitSkip && !ConditionalXactLockTableWait(dirty.xmin))
					return TM_WouldBlock;
				if (policy == LockWaitError && !ConditionalXactLockTableWait(dirty.xmin))
					report_lock_unavailable(rel);
				if (policy == LockWaitBlock)
					XactLockTableWait(dirty.xmin, rel, &next, XLTW_FetchUpdated);
				continue;
			}
			*tid = next;
			return TM_Ok;
		}
		/* Updated again by a committed transaction: keep following. */
		if (ItemPointerEquals(&tuple->t_self, &tuple->t_data->t_ctid))
			return TM_Deleted;
		prior_xmax = HeapTupleHeaderGetUpdateXid(tuple->t_data);
		next = tuple->t_data->t_ctid;
	}
}

/* SELECT ... FOR UPDATE / NO KEY UPDATE / SHARE / KEY SHARE, with NOWAIT and SKIP LOCKED. */
static TM_Result
ss_tuple_lock(Relation rel, ItemPointer tid, Snapshot snapshot, TupleTableSlot *slot,
			  CommandId cid, LockTupleMode mode, LockWaitPolicy wait_policy, uint8 flags,
			  TM_FailureData *tmfd)
{
	uint32		keyspace = ss_rel_keyspace(rel);
	ItemPointerData target = *tid;
	bool		traversed = false;

	for (;;)
	{
		SsAcquisition acq = {rel, keyspace, ss_tid_to_rowid(&target), target};
		HeapTuple	tuple = NULL;
		MultiXactMember *members = NULL;
		int			n = 0;
		TM_Result	result;

		result = ss_acquire_row(&acq, cid, InvalidSnapshot, mode, false, wait_policy, tmfd,
							 &tuple, &members, &n);
		if (result == TM_Updated && (flags & TUPLE_LOCK_FLAG_FIND_LAST_VERSION))
		{
			result = find_last_version(rel, keyspace, tmfd, &target, wait_policy);
			if (result == TM_Ok)
			{
				traversed = true;
				continue;
			}
			tmfd->traversed = traversed;
			return result;
		}
		tmfd->traversed = traversed;
		if (result != TM_Ok)
		{
			if (tuple != NULL && result != TM_WouldBlock)
				store_in_slot(slot, tuple, rel);
			return result;
		}
		ss_set_xmax_members(tuple->t_data, members, n);
		if (HEAP_XMAX_IS_LOCKED_ONLY(tuple->t_data->t_infomask))
			tuple->t_data->t_ctid = tuple->t_self;	/* no forward link: nothing updated it */
		ss_write_row(rel, keyspace, acq.rowid, tuple, SS_ROW_HEADER);
		ss_release_acquisition(&acq);
		store_in_slot(slot, tuple, rel);
		*tid = target;
		return TM_Ok;
	}
}

/* Installs the callback of this file. */
void
ss_init_lock_callbacks(TableAmRoutine *am)
{
	am->tuple_lock = ss_tuple_lock;
}
