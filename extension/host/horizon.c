/*
 * host/horizon.c: the durable horizon, the WAL position below which every change is durable in
 * the engine. Each change is bracketed (begin before XLogInsert, logged with the record's end,
 * done after the engine write); the engine's write-ahead barrier flushes WAL to the end of
 * every change applied so far; the worker syncs the engine and moves the replication slot
 * "slipstream" up to the horizon, so the slot keeps exactly the WAL replay may need.
 */
#include "slipstream.h"

#include "access/xlog.h"
#include "access/xloginsert.h"
#include "access/xlogrecovery.h"
#include "miscadmin.h"
#include "replication/slot.h"
#include "storage/proc.h"
#include "utils/memutils.h"

#define SS_SLOT_NAME "slipstream"

static void ss_move_slot(XLogRecPtr horizon);

/* Marks a change in flight from the current WAL insert position (see ss_advance_horizon). */
void
ss_change_begin(void)
{
	pg_atomic_write_u64(&ss_shared->inflight[MyProc->pgprocno], GetXLogInsertRecPtr());
	pg_memory_barrier();
}

/* The change's WAL record ends at end_lsn: the engine may persist it once WAL reaches it. */
void
ss_change_logged(XLogRecPtr end_lsn)
{
	uint64		cur = pg_atomic_read_u64(&ss_shared->max_applied_lsn);

	while (cur < end_lsn &&
		   !pg_atomic_compare_exchange_u64(&ss_shared->max_applied_lsn, &cur, end_lsn))
		;
}

/* The change is applied to the engine: no longer in flight. */
void
ss_change_done(void)
{
	pg_memory_barrier();
	pg_atomic_write_u64(&ss_shared->inflight[MyProc->pgprocno], 0);
}

/*
 * The engine's write-ahead barrier: flushes WAL up to the end of every change applied so far.
 * Runs inside engine calls (C++ frames above us), so errors are caught here, not thrown.
 */
bool
ss_persist_barrier(char *msg, size_t msg_size)
{
	XLogRecPtr	target = ss_wal_needed();
	MemoryContext context = CurrentMemoryContext;
	volatile bool ok = true;

	if (target == InvalidXLogRecPtr || RecoveryInProgress())
		return true;
	PG_TRY();
	{
		XLogFlush(target);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(context);
		edata = CopyErrorData();
		FlushErrorState();
		strlcpy(msg, edata->message, msg_size);
		FreeErrorData(edata);
		ok = false;
	}
	PG_END_TRY();
	return ok;
}

/* Where WAL must be durable for every change applied so far (the barrier's target). */
uint64_t
ss_wal_needed(void)
{
	return pg_atomic_read_u64(&ss_shared->max_applied_lsn);
}

/* How far WAL is durable now; during recovery, everywhere (the barrier flushes nothing). */
uint64_t
ss_wal_durable(void)
{
	if (RecoveryInProgress())
		return PG_UINT64_MAX;
	return GetFlushRecPtr(NULL);
}

/*
 * Acquires the physical slot `name` for this process, creating it (reserving WAL from now on)
 * the first time; `why` says in the log what it keeps the WAL for.
 */
void
ss_acquire_named_slot(const char *name, const char *why)
{
	if (MyReplicationSlot != NULL)
		return;
	if (SearchNamedReplicationSlot(name, true) == NULL)
	{
		ReplicationSlotCreate(name, false, RS_PERSISTENT, false);
		ReplicationSlotReserveWal();
		ReplicationSlotMarkDirty();
		ReplicationSlotSave();
		ReplicationSlotsComputeRequiredLSN();
		ereport(LOG, (errmsg("slipstream: created replication slot \"%s\" to keep the WAL %s",
							 name, why)));
		return;
	}
	ReplicationSlotAcquire(name, true);
}

/*
 * Creates our slot at `horizon` on a freshly seeded standby (the seed's horizon: the WAL from
 * there on is in pg_wal and must stay until the engine holds it durably), then releases it.
 */
void
ss_create_slot_at(XLogRecPtr horizon)
{
	if (SearchNamedReplicationSlot(SS_SLOT_NAME, true) != NULL)
		ReplicationSlotDrop(SS_SLOT_NAME, true);	/* a seed loaded again after a crash */
	ReplicationSlotCreate(SS_SLOT_NAME, false, RS_PERSISTENT, false);
	ss_set_slot_restart(horizon);
	ReplicationSlotRelease();
	pg_atomic_write_u64(&ss_shared->durable_horizon, horizon);
}

/* Where the physical slot `name` keeps WAL from (invalid if there is no such slot). */
XLogRecPtr
ss_named_slot_restart(const char *name)
{
	ReplicationSlot *slot = SearchNamedReplicationSlot(name, true);
	XLogRecPtr	restart = InvalidXLogRecPtr;

	if (slot != NULL)
	{
		SpinLockAcquire(&slot->mutex);
		restart = slot->data.restart_lsn;
		SpinLockRelease(&slot->mutex);
	}
	return restart;
}

/* Where our slot says the engine's durable horizon is (invalid if there is no slot). */
XLogRecPtr
ss_slot_horizon(void)
{
	return ss_named_slot_restart(SS_SLOT_NAME);
}

/*
 * Sets the restart_lsn of the slot this process holds and saves it at once (before WAL below
 * it may be recycled, so the slot on disk never points at a gap), then lets PostgreSQL
 * recompute what WAL all slots keep.
 */
void
ss_set_slot_restart(XLogRecPtr restart)
{
	SpinLockAcquire(&MyReplicationSlot->mutex);
	MyReplicationSlot->data.restart_lsn = restart;
	SpinLockRelease(&MyReplicationSlot->mutex);
	ReplicationSlotMarkDirty();
	ReplicationSlotSave();
	ReplicationSlotsComputeRequiredLSN();
}

/*
 * Moves the restart_lsn of the slot this process holds forward without saving it: PostgreSQL
 * saves dirty slots in every checkpoint before that checkpoint removes WAL, so the slot on
 * disk never points at a gap (a crash leaves it behind, which keeps more WAL, never less).
 * This is how a walsender moves a physical slot; the shipper moves its slot on every round a
 * backup reports progress, and saving each time (two fsyncs) stalled the commits it serves.
 */
void
ss_advance_slot_restart(XLogRecPtr restart)
{
	SpinLockAcquire(&MyReplicationSlot->mutex);
	if (restart > MyReplicationSlot->data.restart_lsn)
		MyReplicationSlot->data.restart_lsn = restart;
	SpinLockRelease(&MyReplicationSlot->mutex);
	ReplicationSlotMarkDirty();
	ReplicationSlotsComputeRequiredLSN();
}

/* Acquires our slot, creating it the first time. */
void
ss_acquire_slot(void)
{
	ss_acquire_named_slot(SS_SLOT_NAME, "the engine has not yet made durable");
}

/*
 * A WAL position A such that every change whose record starts below A has been applied to
 * the engine: the insert position read first, lowered to the start of any change in flight.
 */
XLogRecPtr
ss_applied_horizon(void)
{
	XLogRecPtr	horizon = GetXLogInsertRecPtr();
	int			nslots = ss_proc_slots();

	pg_memory_barrier();
	for (int i = 0; i < nslots; i++)
	{
		uint64		v = pg_atomic_read_u64(&ss_shared->inflight[i]);

		if (v != 0 && v < horizon)
			horizon = v;
	}
	return horizon;
}

/*
 * Makes the engine durable and moves the slot up to ss_applied_horizon() as read before the
 * sync, so every change whose record starts below the slot is durable in the engine. The
 * slot stays at or below the flushed WAL: the insert position may be ahead of it, and a slot
 * past the WAL that survives a crash would point into records written after the crash.
 */
void
ss_advance_horizon(void)
{
	XLogRecPtr	flushed = GetFlushRecPtr(NULL);
	XLogRecPtr	horizon = Min(ss_applied_horizon(), flushed);

	SS_CHECK(ss_sync_all(), "syncing the engine");
	ss_acquire_slot();
	ss_move_slot(horizon);
}

/*
 * On a standby: makes the engine durable and moves the slot up to the replay position read
 * before the sync. The startup process applies our records as it replays them (standby.c),
 * so every record that ends below that position is in the engine and now durable.
 */
void
ss_advance_standby_horizon(void)
{
	XLogRecPtr	horizon = GetXLogReplayRecPtr(NULL);

	SS_CHECK(ss_sync_all(), "syncing the engine");
	if (MyReplicationSlot == NULL)
	{
		if (SearchNamedReplicationSlot(SS_SLOT_NAME, true) == NULL)
			return;				/* not seeded: standby.c has reported it */
		ReplicationSlotAcquire(SS_SLOT_NAME, true);
	}
	ss_move_slot(horizon);
}

/* Moves our acquired slot up to `horizon` (never down), durably, and publishes it. */
static void
ss_move_slot(XLogRecPtr horizon)
{
	if (horizon <= MyReplicationSlot->data.restart_lsn)
		return;
	ss_set_slot_restart(horizon);
	pg_atomic_write_u64(&ss_shared->durable_horizon, horizon);
}
