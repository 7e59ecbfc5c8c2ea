/*
 * modify.c: INSERT, UPDATE, DELETE, row locks and speculative insertion, with PostgreSQL's
 * semantics: xmax carries the deleter, updater or lockers (a MultiXact when several
 * transactions hold the row in compatible modes), t_ctid links a row to its next version, and
 * waiting goes through the same heavyweight tuple and transaction locks as heap, so deadlock
 * detection, NOWAIT and SKIP LOCKED behave identically.
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

/* Sets the row's xmax to exactly `members` (one plain xid, or a new MultiXact). */
static void
set_xmax_members(HeapTupleHeader tuple, MultiXactMember *members, int n)
{
	bool		has_update = false;
	LockTupleMode strongest = LockTupleKeyShare;
	TransactionId xmax;

	tuple->t_infomask &= ~HEAP_XMAX_BITS;
	tuple->t_infomask2 &= ~HEAP_KEYS_UPDATED;
	if (n == 0)
	{
		tuple->t_infomask |= HEAP_XMAX_INVALID;
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
		tuple->t_infomask |= HEAP_XMAX_LOCK_ONLY;
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

/* State of one row acquisition: which locks we hold while it goes on. */
typedef struct Acquisition
{
	Relation	rel;
	uint32		keyspace;
	uint64		rowid;
	ItemPointerData tid;
	LWLock	   *row_lock;
	bool		row_locked;
	bool		tuple_locked;
	LOCKMODE	tuple_lock_mode;
} Acquisition;

/* Releases whatever an acquisition still holds. */
static void
release_acquisition(Acquisition *acq)
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
static TM_Result
acquire_row(Acquisition *acq, CommandId cid, Snapshot crosscheck, LockTupleMode mode,
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
		MultiXactStatus ours = status_for_mode(mode, is_update);

		LWLockAcquire(acq->row_lock, LW_EXCLUSIVE);
		acq->row_locked = true;
		tuple = ss_fetch_row(acq->rel, acq->keyspace, acq->rowid);
		if (tuple == NULL)
		{
			release_acquisition(acq);
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
			release_acquisition(acq);
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
				release_acquisition(acq);
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
			release_acquisition(acq);
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
	ExecStoreHeapTuple(copy, slot, true);
	slot->tts_tableOid = RelationGetRelid(rel);
}

/* Fills in the MVCC fields of a tuple about to be inserted by this command. */
static void
prepare_new_tuple(Relation rel, HeapTuple tuple, CommandId cid, uint64 rowid)
{
	TransactionId xid = GetCurrentTransactionId();

	tuple->t_data->t_infomask &= ~HEAP_XACT_MASK;
	tuple->t_data->t_infomask2 &= ~HEAP2_XACT_MASK;
	tuple->t_data->t_infomask |= HEAP_XMAX_INVALID;
	HeapTupleHeaderSetXmin(tuple->t_data, xid);
	HeapTupleHeaderSetCmin(tuple->t_data, cid);
	HeapTupleHeaderSetXmax(tuple->t_data, 0);
	tuple->t_tableOid = RelationGetRelid(rel);
	ss_rowid_to_tid(rowid, &tuple->t_self);
	tuple->t_data->t_ctid = tuple->t_self;
}

/* The slot's row as a tuple ready to store: a private copy, TOASTed when too wide. */
static HeapTuple
tuple_to_store(Relation rel, TupleTableSlot *slot, HeapTuple old_tuple)
{
	bool		should_free;
	HeapTuple	tuple = ExecFetchSlotHeapTuple(slot, true, &should_free);
	HeapTuple	copy;

	if (rel->rd_rel->relkind != RELKIND_TOASTVALUE &&
		(HeapTupleHasExternal(tuple) || tuple->t_len > TOAST_TUPLE_THRESHOLD ||
		 (old_tuple != NULL && HeapTupleHasExternal(old_tuple))))
	{
		copy = heap_toast_insert_or_update(rel, tuple, old_tuple, 0);
		if (copy == tuple)
			copy = heap_copytuple(tuple);
	}
	else
		copy = heap_copytuple(tuple);
	if (should_free)
		heap_freetuple(tuple);
	return copy;
}

/*
 * Gives the slot's own tuple the transaction fields of the version just stored, as heap_insert
 * does for its caller's tuple, so that RETURNING xmin, xmax, cmin and ctid report the stored
 * row (the stored copy may differ otherwise: it was TOASTed or copied before the fields were
 * set). Slots that keep no heap tuple have no system columns to fix.
 */
static void
stamp_slot(TupleTableSlot *slot, HeapTuple stored)
{
	HeapTupleHeader header;

	if (slot->tts_ops->get_heap_tuple == NULL || TTS_EMPTY(slot))
		return;
	header = slot->tts_ops->get_heap_tuple(slot)->t_data;
	header->t_choice = stored->t_data->t_choice;
	header->t_ctid = stored->t_data->t_ctid;
	header->t_infomask = (header->t_infomask & ~HEAP_XACT_MASK) |
		(stored->t_data->t_infomask & HEAP_XACT_MASK);
	header->t_infomask2 = (header->t_infomask2 & ~HEAP2_XACT_MASK) |
		(stored->t_data->t_infomask2 & HEAP2_XACT_MASK);
	slot->tts_tid = stored->t_self;
	slot->tts_tableOid = stored->t_tableOid;
}

/* INSERT of one row. */
static void
ss_tuple_insert(Relation rel, TupleTableSlot *slot, CommandId cid, int options,
				struct BulkInsertStateData *bistate)
{
	uint32		keyspace = ss_rel_keyspace(rel);
	HeapTuple	tuple;
	uint64		rowid;

	tuple = tuple_to_store(rel, slot, NULL);
	rowid = ss_next_rowid(rel, keyspace, 1);
	prepare_new_tuple(rel, tuple, cid, rowid);
	CheckForSerializableConflictIn(rel, NULL, InvalidBlockNumber);
	ss_write_row(rel, keyspace, rowid, tuple, false);
	pgstat_count_heap_insert(rel, 1);
	slot->tts_tableOid = RelationGetRelid(rel);
	slot->tts_tid = tuple->t_self;
	stamp_slot(slot, tuple);
	heap_freetuple(tuple);
}

/* INSERT ... ON CONFLICT: the row carries a speculative token until completed. */
static void
ss_tuple_insert_speculative(Relation rel, TupleTableSlot *slot, CommandId cid, int options,
							struct BulkInsertStateData *bistate, uint32 spec_token)
{
	uint32		keyspace = ss_rel_keyspace(rel);
	HeapTuple	tuple = tuple_to_store(rel, slot, NULL);
	uint64		rowid = ss_next_rowid(rel, keyspace, 1);

	prepare_new_tuple(rel, tuple, cid, rowid);
	HeapTupleHeaderSetSpeculativeToken(tuple->t_data, spec_token);
	CheckForSerializableConflictIn(rel, NULL, InvalidBlockNumber);
	ss_write_row(rel, keyspace, rowid, tuple, false);
	pgstat_count_heap_insert(rel, 1);
	slot->tts_tableOid = RelationGetRelid(rel);
	ss_rowid_to_tid(rowid, &slot->tts_tid);
	stamp_slot(slot, tuple);
	heap_freetuple(tuple);
}

/* Ends a speculative insertion: confirm the row, or make it invisible to everyone at once. */
static void
ss_tuple_complete_speculative(Relation rel, TupleTableSlot *slot, uint32 spec_token,
							  bool succeeded)
{
	uint32		keyspace = ss_rel_keyspace(rel);
	uint64		rowid = ss_tid_to_rowid(&slot->tts_tid);
	HeapTuple	tuple = ss_fetch_row(rel, keyspace, rowid);

	if (tuple == NULL)
		elog(ERROR, "slipstream: speculatively inserted row " UINT64_FORMAT " vanished", rowid);
	tuple->t_data->t_ctid = tuple->t_self;
	if (!succeeded)
	{
		/* "Super-delete": no snapshot can see a row whose inserter is invalid. */
		HeapTupleHeaderSetXmin(tuple->t_data, InvalidTransactionId);
		tuple->t_data->t_infomask |= HEAP_XMIN_INVALID;
		if (HeapTupleHasExternal(tuple))
			heap_toast_delete(rel, tuple, true);
		pgstat_count_heap_delete(rel);
	}
	ss_write_row(rel, keyspace, rowid, tuple, true);
	heap_freetuple(tuple);
}

/* COPY FROM and multi-row inserts: one row id range, one WAL record, one engine batch. */
static void
ss_multi_insert(Relation rel, TupleTableSlot **slots, int nslots, CommandId cid, int options,
				struct BulkInsertStateData *bistate)
{
	uint32		keyspace = ss_rel_keyspace(rel);
	uint64		first = ss_next_rowid(rel, keyspace, nslots);
	HeapTuple  *tuples = palloc(sizeof(HeapTuple) * nslots);
	uint64	   *rowids = palloc(sizeof(uint64) * nslots);

	CheckForSerializableConflictIn(rel, NULL, InvalidBlockNumber);
	for (int i = 0; i < nslots; i++)
	{
		tuples[i] = tuple_to_store(rel, slots[i], NULL);
		rowids[i] = first + i;
		prepare_new_tuple(rel, tuples[i], cid, rowids[i]);
		slots[i]->tts_tableOid = RelationGetRelid(rel);
		slots[i]->tts_tid = tuples[i]->t_self;
	}
	ss_write_rows(rel, keyspace, rowids, tuples, nslots);
	pgstat_count_heap_insert(rel, nslots);
	for (int i = 0; i < nslots; i++)
	{
		stamp_slot(slots[i], tuples[i]);
		heap_freetuple(tuples[i]);
	}
	pfree(tuples);
	pfree(rowids);
}

/* Sets the header fields of a row we now delete or update (xmax, cmax, keys flag). */
static void
mark_deleted(HeapTuple tuple, MultiXactMember *members, int n, CommandId cid)
{
	bool		iscombo;

	set_xmax_members(tuple->t_data, members, n);
	HeapTupleHeaderAdjustCmax(tuple->t_data, &cid, &iscombo);
	HeapTupleHeaderSetCmax(tuple->t_data, cid, iscombo);
}

/* Reports an attempt to change a row this command cannot see. */
static void
report_invisible(const char *what)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("attempted to %s invisible tuple", what)));
}

/* DELETE of one row version. */
static TM_Result
ss_tuple_delete(Relation rel, ItemPointer tid, CommandId cid, Snapshot snapshot,
				Snapshot crosscheck, bool wait, TM_FailureData *tmfd, bool changing_part)
{
	Acquisition acq = {rel, ss_rel_keyspace(rel), ss_tid_to_rowid(tid), *tid};
	HeapTuple	tuple = NULL;
	MultiXactMember *members = NULL;
	int			n = 0;
	TM_Result	result;

	result = acquire_row(&acq, cid, crosscheck, LockTupleExclusive, true,
						 wait ? LockWaitBlock : LockWaitError, tmfd, &tuple, &members, &n);
	if (result == TM_Invisible)
		report_invisible("delete");
	if (result != TM_Ok)
		return result;
	CheckForSerializableConflictIn(rel, tid, ItemPointerGetBlockNumber(tid));
	mark_deleted(tuple, members, n, cid);
	tuple->t_data->t_ctid = tuple->t_self;
	if (changing_part)
		HeapTupleHeaderSetMovedPartitions(tuple->t_data);
	ss_write_row(rel, acq.keyspace, acq.rowid, tuple, true);
	release_acquisition(&acq);
	if (HeapTupleHasExternal(tuple))
		heap_toast_delete(rel, tuple, false);
	pgstat_count_heap_delete(rel);
	return TM_Ok;
}

/* Whether an update changes any column that a foreign key or unique index may reference. */
static bool
key_columns_changed(Relation rel, HeapTuple old_tuple, TupleTableSlot *slot)
{
	Bitmapset  *keys = RelationGetIndexAttrBitmap(rel, INDEX_ATTR_BITMAP_KEY);
	TupleDesc	desc = RelationGetDescr(rel);
	int			attr = -1;
	bool		changed = false;

	while (!changed && (attr = bms_next_member(keys, attr)) >= 0)
	{
		AttrNumber	attnum = attr + FirstLowInvalidHeapAttributeNumber;
		bool		old_null,
					new_null;
		Datum		old_value,
					new_value;
		Form_pg_attribute att;

		if (attnum <= 0)
		{
			changed = true;		/* system columns: be conservative */
			break;
		}
		att = TupleDescAttr(desc, attnum - 1);
		old_value = heap_getattr(old_tuple, attnum, desc, &old_null);
		new_value = slot_getattr(slot, attnum, &new_null);
		if (old_null != new_null)
			changed = true;
		else if (!old_null)
			changed = !datumIsEqual(old_value, new_value, att->attbyval, att->attlen);
	}
	bms_free(keys);
	return changed;
}

/* UPDATE: a new row version at a new row id; the old one points at it through t_ctid. */
static TM_Result
ss_tuple_update(Relation rel, ItemPointer otid, TupleTableSlot *slot, CommandId cid,
				Snapshot snapshot, Snapshot crosscheck, bool wait, TM_FailureData *tmfd,
				LockTupleMode *lockmode, bool *update_indexes)
{
	Acquisition acq = {rel, ss_rel_keyspace(rel), ss_tid_to_rowid(otid), *otid};
	HeapTuple	old_tuple;
	HeapTuple	new_tuple;
	MultiXactMember *members = NULL;
	int			n = 0;
	TM_Result	result;
	uint64		new_rowid;

	/* Decide the lock strength from the current image (re-checked under the row lock). */
	old_tuple = ss_fetch_row(rel, acq.keyspace, acq.rowid);
	*lockmode = (old_tuple == NULL || key_columns_changed(rel, old_tuple, slot))
		? LockTupleExclusive : LockTupleNoKeyExclusive;
	*update_indexes = false;
	result = acquire_row(&acq, cid, crosscheck, *lockmode, true,
						 wait ? LockWaitBlock : LockWaitError, tmfd, &old_tuple, &members, &n);
	if (result == TM_Invisible)
		report_invisible("update");
	if (result != TM_Ok)
		return result;
	if (*lockmode == LockTupleNoKeyExclusive && key_columns_changed(rel, old_tuple, slot))
	{
		/* The row changed between our look and the lock: redo with the stronger mode. */
		release_acquisition(&acq);
		*lockmode = LockTupleExclusive;
		result = acquire_row(&acq, cid, crosscheck, *lockmode, true,
							 wait ? LockWaitBlock : LockWaitError, tmfd, &old_tuple, &members, &n);
		if (result == TM_Invisible)
			report_invisible("update");
		if (result != TM_Ok)
			return result;
	}
	CheckForSerializableConflictIn(rel, otid, ItemPointerGetBlockNumber(otid));

	new_tuple = tuple_to_store(rel, slot, old_tuple);
	new_rowid = ss_next_rowid(rel, acq.keyspace, 1);
	prepare_new_tuple(rel, new_tuple, cid, new_rowid);
	new_tuple->t_data->t_infomask |= HEAP_UPDATED;
	mark_deleted(old_tuple, members, n, cid);
	old_tuple->t_data->t_ctid = new_tuple->t_self;
	ss_write_update(rel, acq.keyspace, old_tuple, new_rowid, new_tuple);
	release_acquisition(&acq);

	pgstat_count_heap_update(rel, false);
	slot->tts_tableOid = RelationGetRelid(rel);
	slot->tts_tid = new_tuple->t_self;
	stamp_slot(slot, new_tuple);
	*update_indexes = true;
	heap_freetuple(new_tuple);
	return TM_Ok;
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
		Acquisition acq = {rel, keyspace, ss_tid_to_rowid(&target), target};
		HeapTuple	tuple = NULL;
		MultiXactMember *members = NULL;
		int			n = 0;
		TM_Result	result;

		result = acquire_row(&acq, cid, InvalidSnapshot, mode, false, wait_policy, tmfd,
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
		set_xmax_members(tuple->t_data, members, n);
		ss_write_row(rel, keyspace, acq.rowid, tuple, true);
		release_acquisition(&acq);
		store_in_slot(slot, tuple, rel);
		*tid = target;
		return TM_Ok;
	}
}

/* Installs the callbacks of this file. */
void
ss_init_modify_callbacks(TableAmRoutine *am)
{
	am->tuple_insert = ss_tuple_insert;
	am->tuple_insert_speculative = ss_tuple_insert_speculative;
	am->tuple_complete_speculative = ss_tuple_complete_speculative;
	am->multi_insert = ss_multi_insert;
	am->tuple_delete = ss_tuple_delete;
	am->tuple_update = ss_tuple_update;
	am->tuple_lock = ss_tuple_lock;
}
