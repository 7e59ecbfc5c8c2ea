/*
 * tableam/modify.c: INSERT (one row, many rows, speculative), UPDATE and DELETE. Every change
 * to an existing row first gets the right to it through the row-lock protocol of locks.c
 * (ss_acquire_row), then writes the new header and the new version, WAL first (rows.c);
 * t_ctid links a row to its next version.
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

	/*
	 * Rows leave slipstream tables without their root link (scan.c), but one copied out by a
	 * build from before that (say into heap) may still carry the bit: it means nothing here.
	 */
	if (tuple->t_data->t_infomask2 & SS_HEAP_ROOT_LINK)
	{
		copy = ss_without_root_link(heap_copytuple(tuple));
		if (should_free)
			heap_freetuple(tuple);
		tuple = copy;
		should_free = true;
	}

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
	if (options & TABLE_INSERT_FROZEN)
		HeapTupleHeaderSetXminFrozen(tuple->t_data);
	CheckForSerializableConflictIn(rel, NULL, InvalidBlockNumber);
	ss_write_row(rel, keyspace, rowid, tuple, SS_ROW_PUT);
	if (options & TABLE_INSERT_FROZEN)
		ss_vm_note_frozen_rows(rel, rowid, 1);
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
	ss_write_row(rel, keyspace, rowid, tuple, SS_ROW_PUT);
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
	ss_write_row(rel, keyspace, rowid, tuple, succeeded ? SS_ROW_CONFIRM : SS_ROW_SUPER_DELETE);
	heap_freetuple(tuple);
}

/*
 * COPY FROM and multi-row inserts: one row id range, one WAL record, one engine batch. With
 * TABLE_INSERT_FROZEN (COPY FREEZE into a table created or truncated in this subtransaction)
 * the rows go in frozen, as heap_multi_insert's do, and fill all-visible blocks.
 */
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
		if (options & TABLE_INSERT_FROZEN)
			HeapTupleHeaderSetXminFrozen(tuples[i]->t_data);
		slots[i]->tts_tableOid = RelationGetRelid(rel);
		slots[i]->tts_tid = tuples[i]->t_self;
	}
	ss_write_rows(rel, keyspace, rowids, tuples, nslots, false);
	if (options & TABLE_INSERT_FROZEN)
		ss_vm_note_frozen_rows(rel, first, nslots);
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

	ss_set_xmax_members(tuple->t_data, members, n);
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
	SsAcquisition acq = {rel, ss_rel_keyspace(rel), ss_tid_to_rowid(tid), *tid};
	HeapTuple	tuple = NULL;
	MultiXactMember *members = NULL;
	int			n = 0;
	TM_Result	result;

	result = ss_acquire_row(&acq, cid, crosscheck, LockTupleExclusive, true,
						 wait ? LockWaitBlock : LockWaitError, tmfd, &tuple, &members, &n);
	if (result == TM_Invisible)
		report_invisible("delete");
	if (result != TM_Ok)
		return result;
	CheckForSerializableConflictIn(rel, tid, ItemPointerGetBlockNumber(tid));
	mark_deleted(tuple, members, n, cid);
	tuple->t_data->t_ctid = tuple->t_self;
	HeapTupleHeaderClearHotUpdated(tuple->t_data);	/* a chain to an aborted update ends */
	if (changing_part)
		HeapTupleHeaderSetMovedPartitions(tuple->t_data);
	ss_write_row(rel, acq.keyspace, acq.rowid, tuple, SS_ROW_DELETE);
	ss_release_acquisition(&acq);
	if (HeapTupleHasExternal(tuple))
		heap_toast_delete(rel, tuple, false);
	pgstat_count_heap_delete(rel);
	return TM_Ok;
}

/* Whether the new row in `slot` differs from `old_tuple` in any column of `columns`. */
bool
ss_columns_changed(Relation rel, const Bitmapset *columns, HeapTuple old_tuple,
				   TupleTableSlot *slot)
{
	TupleDesc	desc = RelationGetDescr(rel);
	int			attr = -1;

	while ((attr = bms_next_member(columns, attr)) >= 0)
	{
		AttrNumber	attnum = attr + FirstLowInvalidHeapAttributeNumber;
		bool		old_null,
					new_null;
		Datum		old_value,
					new_value;
		Form_pg_attribute att;

		if (attnum <= 0)
			return true;		/* system columns: be conservative */
		att = TupleDescAttr(desc, attnum - 1);
		old_value = heap_getattr(old_tuple, attnum, desc, &old_null);
		new_value = slot_getattr(slot, attnum, &new_null);
		if (old_null != new_null ||
			(!old_null && !datumIsEqual(old_value, new_value, att->attbyval, att->attlen)))
			return true;
	}
	return false;
}

/*
 * UPDATE: a new row version at a new row id; the old one points at it through t_ctid. When no
 * indexed column changes, the new version is heap-only and joins the old one's chain, and the
 * indexes are left alone (tableam/chains.c), as heap's HOT updates.
 */
static TM_Result
ss_tuple_update(Relation rel, ItemPointer otid, TupleTableSlot *slot, CommandId cid,
				Snapshot snapshot, Snapshot crosscheck, bool wait, TM_FailureData *tmfd,
				LockTupleMode *lockmode, bool *update_indexes)
{
	SsAcquisition acq = {rel, ss_rel_keyspace(rel), ss_tid_to_rowid(otid), *otid};
	HeapTuple	old_tuple = NULL;
	HeapTuple	new_tuple;
	Bitmapset  *key_columns;
	MultiXactMember *members = NULL;
	MultiXactMember *lockers;
	int			n = 0;
	int			nlockers;
	TM_Result	result;
	uint64		new_rowid;
	bool		hot;

	/*
	 * The lock strength (exclusive only if a key column changes) is chosen from the row the
	 * acquisition finds under the row lock: one fetch. The column sets are the relcache's
	 * copies, taken before any lock.
	 */
	key_columns = RelationGetIndexAttrBitmap(rel, INDEX_ATTR_BITMAP_KEY);
	acq.new_row = slot;
	acq.key_columns = key_columns;
	acq.mode_chosen = LockTupleExclusive;
	*update_indexes = false;
	result = ss_acquire_row(&acq, cid, crosscheck, LockTupleExclusive, true,
							wait ? LockWaitBlock : LockWaitError, tmfd, &old_tuple, &members, &n);
	*lockmode = acq.mode_chosen;
	bms_free(key_columns);
	if (result == TM_Invisible)
		report_invisible("update");
	if (result != TM_Ok)
		return result;
	CheckForSerializableConflictIn(rel, otid, ItemPointerGetBlockNumber(otid));

	new_tuple = tuple_to_store(rel, slot, old_tuple);
	new_rowid = ss_next_rowid(rel, acq.keyspace, 1);
	prepare_new_tuple(rel, new_tuple, cid, new_rowid);
	new_tuple->t_data->t_infomask |= HEAP_UPDATED;
	if (ss_hot_updates && rel->rd_rel->relhasindex)
	{
		Bitmapset  *indexed = RelationGetIndexAttrBitmap(rel, INDEX_ATTR_BITMAP_ALL);

		hot = !ss_columns_changed(rel, indexed, old_tuple, slot);
		bms_free(indexed);
	}
	else
		hot = false;
	if (hot)
	{
		uint64		root = acq.rowid;

		HeapTupleHeaderSetHotUpdated(old_tuple->t_data);
		HeapTupleHeaderSetHeapOnly(new_tuple->t_data);
		/*
		 * The new member names its root (unless the old one, stored before members did, does
		 * not say), so that changing it clears the root's block in the visibility map.
		 */
		if (!HeapTupleHeaderIsHeapOnly(old_tuple->t_data) || ss_member_root(old_tuple, &root))
			new_tuple = ss_with_root_link(new_tuple, root);
	}
	else
		HeapTupleHeaderClearHotUpdated(old_tuple->t_data);
	/* Lockers of the old version that stay (key-share ones, and ours) hold the new one too. */
	nlockers = ss_carried_lockers(old_tuple->t_data, &lockers);
	if (nlockers > 0)
		ss_set_xmax_members(new_tuple->t_data, lockers, nlockers);
	mark_deleted(old_tuple, members, n, cid);
	old_tuple->t_data->t_ctid = new_tuple->t_self;
	ss_write_update(rel, acq.keyspace, old_tuple, new_rowid, new_tuple);
	ss_release_acquisition(&acq);

	pgstat_count_heap_update(rel, hot);
	slot->tts_tableOid = RelationGetRelid(rel);
	slot->tts_tid = new_tuple->t_self;
	stamp_slot(slot, new_tuple);
	*update_indexes = !hot;
	heap_freetuple(new_tuple);
	return TM_Ok;
}

/* The end of a COPY or a materialized view's refresh: a frozen load marks its last block. */
static void
ss_finish_bulk_insert(Relation rel, int options)
{
	if (options & TABLE_INSERT_FROZEN)
		ss_vm_finish_frozen_rows(rel);
}

/* Installs the callbacks of this file. */
void
ss_init_modify_callbacks(TableAmRoutine *am)
{
	am->finish_bulk_insert = ss_finish_bulk_insert;
	am->tuple_insert = ss_tuple_insert;
	am->tuple_insert_speculative = ss_tuple_insert_speculative;
	am->tuple_complete_speculative = ss_tuple_complete_speculative;
	am->multi_insert = ss_multi_insert;
	am->tuple_delete = ss_tuple_delete;
	am->tuple_update = ss_tuple_update;
}
