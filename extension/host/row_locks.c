/*
 * host/row_locks.c: the striped LWLocks that make each check-then-write on one row atomic
 * (tableam/locks.c uses them; they are never held while waiting for another transaction).
 */
#include "slipstream.h"

static int	row_lock_tranche = 0;

/* Initialises the row locks of a fresh shared state, or finds their tranche (under lock). */
void
ss_row_locks_shmem_init(bool fresh)
{
	if (fresh)
	{
		row_lock_tranche = LWLockNewTrancheId();
		for (int i = 0; i < SS_ROW_LOCKS; i++)
			LWLockInitialize(&ss_shared->row_locks[i].lock, row_lock_tranche);
	}
	else
		row_lock_tranche = ss_shared->row_locks[0].lock.tranche;
}

/* Names the row locks' tranche in this process (for wait events). */
void
ss_row_locks_register_tranche(void)
{
	LWLockRegisterTranche(row_lock_tranche, "slipstream_row");
}

/* The lock serializing changes to one row (striped). */
LWLock *
ss_row_lock(uint64 tag, uint64 rowid)
{
	uint64		h = (tag * UINT64CONST(0x9E3779B97F4A7C15)) ^ (rowid * UINT64CONST(0xC2B2AE3D27D4EB4F));

	return &ss_shared->row_locks[(h >> 32) % SS_ROW_LOCKS].lock;
}
