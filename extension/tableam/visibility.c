/*
 * tableam/visibility.c: PostgreSQL's tuple visibility rules for rows stored in the engine.
 *
 * Rows carry standard heap tuple headers, but live outside shared buffers, so heap's routines
 * (which set hint bits on a buffer page) cannot be used. These functions decide from the
 * header, the snapshot, the current transaction's state and the commit log alone; they never
 * write. Rows whose xmin is known committed carry HEAP_XMIN_COMMITTED (set by VACUUM, as is
 * HEAP_XMIN_FROZEN); nothing else relies on hint bits.
 */
#include "slipstream.h"

#include "access/heapam.h"
#include "access/multixact.h"
#include "access/subtrans.h"
#include "access/transam.h"
#include "access/xact.h"
#include "storage/procarray.h"
#include "utils/combocid.h"
#include "utils/snapmgr.h"

/* What a transaction id means for the reader. */
typedef enum XidState
{
	XID_CURRENT,				/* this transaction (or one of its live subtransactions) */
	XID_IN_PROGRESS,			/* running, or running as of the snapshot */
	XID_COMMITTED,
	XID_ABORTED					/* aborted or crashed */
} XidState;

/* State of xid for a reader with `snapshot` (NULL: as of now). */
static XidState
xid_state(TransactionId xid, Snapshot snapshot)
{
	/*
	 * Below the snapshot's xmin, an xid is neither running for it nor ours: every xid of this
	 * transaction came after a snapshot it took, or was running (so not below xmin) when it was
	 * taken. Only the commit log is left to ask: this skips the two calls that would say so,
	 * half of what the check of a loaded row's xmin costs.
	 */
	if (snapshot != NULL && TransactionIdPrecedes(xid, snapshot->xmin))
		return TransactionIdDidCommit(xid) ? XID_COMMITTED : XID_ABORTED;
	if (TransactionIdIsCurrentTransactionId(xid))
		return XID_CURRENT;
	if (snapshot != NULL)
	{
		if (XidInMVCCSnapshot(xid, snapshot))
			return XID_IN_PROGRESS;
	}
	else if (TransactionIdIsInProgress(xid))
		return XID_IN_PROGRESS;
	return TransactionIdDidCommit(xid) ? XID_COMMITTED : XID_ABORTED;
}

/* State of the inserting transaction. */
static XidState
xmin_state(HeapTupleHeader tuple, Snapshot snapshot)
{
	if (HeapTupleHeaderXminFrozen(tuple) || HeapTupleHeaderXminCommitted(tuple))
	{
		/* Vacuum sets these only once the inserter committed before every snapshot. */
		return XID_COMMITTED;
	}
	if (HeapTupleHeaderXminInvalid(tuple))
		return XID_ABORTED;
	return xid_state(HeapTupleHeaderGetRawXmin(tuple), snapshot);
}

/* The transaction that deleted or updated the row, if any (lockers do not count). */
static TransactionId
updater_xid(HeapTupleHeader tuple)
{
	if (tuple->t_infomask & HEAP_XMAX_INVALID)
		return InvalidTransactionId;
	if (HEAP_XMAX_IS_LOCKED_ONLY(tuple->t_infomask))
		return InvalidTransactionId;
	if (tuple->t_infomask & HEAP_XMAX_IS_MULTI)
		return HeapTupleGetUpdateXid(tuple);
	return HeapTupleHeaderGetRawXmax(tuple);
}

/* MVCC: visible iff inserted before the snapshot and not deleted before it. */
static bool
visible_mvcc(HeapTupleHeader tuple, Snapshot snapshot)
{
	TransactionId updater;

	switch (xmin_state(tuple, snapshot))
	{
		case XID_CURRENT:
			if (HeapTupleHeaderGetCmin(tuple) >= snapshot->curcid)
				return false;	/* inserted by a later command */
			break;
		case XID_COMMITTED:
			break;
		default:
			return false;
	}
	updater = updater_xid(tuple);
	if (!TransactionIdIsValid(updater))
		return true;
	switch (xid_state(updater, snapshot))
	{
		case XID_CURRENT:
			return HeapTupleHeaderGetCmax(tuple) >= snapshot->curcid;
		case XID_COMMITTED:
			return false;
		default:
			return true;
	}
}

/* SnapshotSelf: committed or own changes, including the current command's. */
static bool
visible_self(HeapTupleHeader tuple)
{
	TransactionId updater;
	XidState	state = xmin_state(tuple, NULL);

	if (state != XID_CURRENT && state != XID_COMMITTED)
		return false;
	updater = updater_xid(tuple);
	if (!TransactionIdIsValid(updater))
		return true;
	state = xid_state(updater, NULL);
	return !(state == XID_CURRENT || state == XID_COMMITTED);
}

/*
 * SnapshotDirty: like Self, but rows of running transactions count as visible, and the
 * snapshot reports those transactions (xmin for an inserter, xmax for a deleter) so that the
 * caller can wait for them; a speculative insertion reports its token too.
 */
static bool
visible_dirty(HeapTupleHeader tuple, Snapshot snapshot)
{
	TransactionId updater;
	XidState	state;

	snapshot->xmin = snapshot->xmax = InvalidTransactionId;
	snapshot->speculativeToken = 0;
	state = xmin_state(tuple, NULL);
	if (state == XID_ABORTED)
		return false;
	if (state == XID_IN_PROGRESS)
	{
		snapshot->xmin = HeapTupleHeaderGetRawXmin(tuple);
		if (HeapTupleHeaderIsSpeculative(tuple))
			snapshot->speculativeToken = HeapTupleHeaderGetSpeculativeToken(tuple);
		return true;			/* a deleter can only be the inserter itself */
	}
	updater = updater_xid(tuple);
	if (!TransactionIdIsValid(updater))
		return true;
	state = xid_state(updater, NULL);
	if (state == XID_IN_PROGRESS)
	{
		snapshot->xmax = updater;
		return true;
	}
	return state == XID_ABORTED;
}

/* Whether a row passes `snapshot` (every snapshot type PostgreSQL hands a table AM). */
bool
ss_tuple_visible(HeapTuple htup, Snapshot snapshot)
{
	HeapTupleHeader tuple = htup->t_data;

	switch (snapshot->snapshot_type)
	{
		case SNAPSHOT_MVCC:
			return visible_mvcc(tuple, snapshot);
		case SNAPSHOT_SELF:
			return visible_self(tuple);
		case SNAPSHOT_ANY:
			return true;
		case SNAPSHOT_TOAST:
			/* TOAST chunks are reached only from visible rows; skip only known-dead ones. */
			return xmin_state(tuple, NULL) != XID_ABORTED;
		case SNAPSHOT_DIRTY:
			return visible_dirty(tuple, snapshot);
		case SNAPSHOT_NON_VACUUMABLE:
			{
				TransactionId dead_after = InvalidTransactionId;
				HTSV_Result res = ss_tuple_vacuum_state(htup, InvalidTransactionId, &dead_after);

				if (res == HEAPTUPLE_RECENTLY_DEAD &&
					GlobalVisTestIsRemovableXid(snapshot->vistest, dead_after))
					res = HEAPTUPLE_DEAD;
				return res != HEAPTUPLE_DEAD;
			}
		case SNAPSHOT_HISTORIC_MVCC:
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("slipstream tables cannot be read by logical decoding")));
	}
	return false;				/* unreachable */
}

/*
 * Whether the current command may update, delete or lock the row (heap's
 * HeapTupleSatisfiesUpdate contract): TM_Ok, TM_Invisible, TM_SelfModified, TM_BeingModified
 * (another transaction holds it), TM_Updated or TM_Deleted (committed by another).
 */
TM_Result
ss_tuple_satisfies_update(HeapTuple htup, CommandId curcid)
{
	HeapTupleHeader tuple = htup->t_data;
	TransactionId xmax;
	XidState	state = xmin_state(tuple, NULL);
	bool		multi = (tuple->t_infomask & HEAP_XMAX_IS_MULTI) != 0;

	if (state == XID_ABORTED || state == XID_IN_PROGRESS)
		return TM_Invisible;
	if (state == XID_CURRENT && HeapTupleHeaderGetCmin(tuple) >= curcid)
		return TM_Invisible;	/* inserted after this command started */
	if (tuple->t_infomask & HEAP_XMAX_INVALID)
		return TM_Ok;
	xmax = HeapTupleHeaderGetRawXmax(tuple);
	if (HEAP_XMAX_IS_LOCKED_ONLY(tuple->t_infomask))
	{
		/* Only locked: it matters only while a locker other than us runs. */
		if (multi)
			return MultiXactIdIsRunning(xmax, true) ? TM_BeingModified : TM_Ok;
		if (TransactionIdIsCurrentTransactionId(xmax))
			return TM_BeingModified;	/* our own lock: caller decides whether to upgrade */
		return TransactionIdIsInProgress(xmax) ? TM_BeingModified : TM_Ok;
	}
	if (multi)
	{
		TransactionId updater = HeapTupleGetUpdateXid(tuple);

		if (TransactionIdIsCurrentTransactionId(updater))
			return HeapTupleHeaderGetCmax(tuple) >= curcid ? TM_SelfModified : TM_Invisible;
		if (MultiXactIdIsRunning(xmax, false))
			return TM_BeingModified;
		if (TransactionIdIsValid(updater) && TransactionIdDidCommit(updater))
			return ItemPointerEquals(&htup->t_self, &tuple->t_ctid) ? TM_Deleted : TM_Updated;
		return TM_Ok;
	}
	if (TransactionIdIsCurrentTransactionId(xmax))
		return HeapTupleHeaderGetCmax(tuple) >= curcid ? TM_SelfModified : TM_Invisible;
	if (TransactionIdIsInProgress(xmax))
		return TM_BeingModified;
	if (!TransactionIdDidCommit(xmax))
		return TM_Ok;			/* the updater aborted */
	return ItemPointerEquals(&htup->t_self, &tuple->t_ctid) ? TM_Deleted : TM_Updated;
}

/*
 * VACUUM's classification (heap's HeapTupleSatisfiesVacuumHorizon contract): for
 * HEAPTUPLE_RECENTLY_DEAD, *dead_after is the xid after whose end the row can be removed.
 * With a valid oldest_xmin, RECENTLY_DEAD rows whose deleter precedes it are reported DEAD.
 */
HTSV_Result
ss_tuple_vacuum_state(HeapTuple htup, TransactionId oldest_xmin, TransactionId *dead_after)
{
	HeapTupleHeader tuple = htup->t_data;
	TransactionId updater;
	XidState	state = xmin_state(tuple, NULL);

	*dead_after = InvalidTransactionId;
	if (state == XID_CURRENT)
	{
		/* Inserted, then deleted by this transaction (any of its subtransactions), as heap. */
		updater = updater_xid(tuple);
		if (TransactionIdIsValid(updater) && TransactionIdIsCurrentTransactionId(updater))
			return HEAPTUPLE_DELETE_IN_PROGRESS;
		return HEAPTUPLE_INSERT_IN_PROGRESS;
	}
	if (state == XID_IN_PROGRESS)
		return HEAPTUPLE_INSERT_IN_PROGRESS;	/* even if its inserter deleted it, as heap */
	if (state == XID_ABORTED)
		return HEAPTUPLE_DEAD;
	if (tuple->t_infomask & HEAP_XMAX_INVALID)
		return HEAPTUPLE_LIVE;
	if (HEAP_XMAX_IS_LOCKED_ONLY(tuple->t_infomask))
		return HEAPTUPLE_LIVE;	/* lockers never make a row dead */
	updater = updater_xid(tuple);
	if (!TransactionIdIsValid(updater))
		return HEAPTUPLE_LIVE;
	state = xid_state(updater, NULL);
	if (state == XID_CURRENT || state == XID_IN_PROGRESS)
		return HEAPTUPLE_DELETE_IN_PROGRESS;
	if (state == XID_ABORTED)
	{
		/* A multixact may still hold live lockers, which keep the row live anyway. */
		return HEAPTUPLE_LIVE;
	}
	*dead_after = updater;
	if (TransactionIdIsValid(oldest_xmin) && TransactionIdPrecedes(updater, oldest_xmin))
		return HEAPTUPLE_DEAD;
	return HEAPTUPLE_RECENTLY_DEAD;
}
