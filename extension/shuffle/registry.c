/*
 * shuffle/registry.c: running shuffles in shared memory. A shuffle takes a slot for its life:
 * its id and listener port (what slipstream.shuffle_port answers a peer with) and its progress
 * per peer (the slipstream.shuffle_progress view). A spinlock guards the slots; nothing in
 * them is a pointer. A backend frees its slot on error and at exit.
 */
#include "postgres.h"

#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "shuffle/shuffle.h"

PG_FUNCTION_INFO_V1(slipstream_shuffle_port);
PG_FUNCTION_INFO_V1(slipstream_shuffle_progress);

typedef struct SsPeerProgress
{
	uint64		rows_sent;
	uint64		bytes_sent;
	uint64		rows_received;
	uint64		bytes_received;
} SsPeerProgress;

typedef struct SsShuffleSlot
{
	int			pid;			/* 0: free */
	Oid			database;
	int64		id;
	int32		sequence;		/* the how-manieth shuffle with this id in its statement */
	uint32		port;
	int			nodes;
	int			self;
	char		group[NAMEDATALEN];
	char		state[16];
	SsPeerProgress peers[SS_SHUFFLE_MAX_NODES];
} SsShuffleSlot;

typedef struct SsShuffleShared
{
	slock_t		lock;
	SsShuffleSlot slots[SS_SHUFFLE_SLOTS];
} SsShuffleShared;

static SsShuffleShared *shared = NULL;
static bool exit_callback_set = false;

char	   *ss_shuffle_id_setting = NULL;
int			ss_shuffle_stall_timeout = 600000;
int			ss_shuffle_join_timeout = 30000;

/* shmem_request_hook: the slots. */
void
ss_shuffle_shmem_request(void)
{
	RequestAddinShmemSpace(sizeof(SsShuffleShared));
}

/* shmem_startup_hook: create or attach (AddinShmemInitLock held by the caller). */
void
ss_shuffle_shmem_startup(void)
{
	bool		found;

	shared = ShmemInitStruct("slipstream shuffles", sizeof(SsShuffleShared), &found);
	if (!found)
	{
		memset(shared, 0, sizeof(SsShuffleShared));
		SpinLockInit(&shared->lock);
	}
}

/* The GUCs: the id the group helper sets in each node's session, and the waits. */
void
ss_shuffle_define_settings(void)
{
	DefineCustomStringVariable("slipstream.shuffle_id",
							   "The shuffle id slipstream.shuffle uses when it is given none.",
							   "slipstream.shuffle_on_group sets it to a fresh random id in the "
							   "session it opens on every node of the group.",
							   &ss_shuffle_id_setting, "", PGC_USERSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("slipstream.shuffle_stall_timeout",
							"How long a shuffle waits for a peer that takes no rows and sends none.",
							"A peer that is gone fails the shuffle at once; this bounds one that is "
							"alive but stuck. 0 waits as long as the statement may run.",
							&ss_shuffle_stall_timeout, 600000, 0, INT_MAX, PGC_USERSET,
							GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomIntVariable("slipstream.shuffle_join_timeout",
							"How long a shuffle waits for its peers to join it, and to take the "
							"last batch it sends them.",
							"Every node of the group must start the shuffle within this time "
							"(slipstream.shuffle_on_group starts them at once); a node that "
							"never does fails the others after it.",
							&ss_shuffle_join_timeout, 30000, 1000, 3600000, PGC_USERSET,
							GUC_UNIT_MS, NULL, NULL, NULL);
}

/* Frees every slot this process holds (at exit: an error path may not have run). */
static void
leave_all(int code, Datum arg)
{
	if (shared == NULL)
		return;
	SpinLockAcquire(&shared->lock);
	for (int i = 0; i < SS_SHUFFLE_SLOTS; i++)
		if (shared->slots[i].pid == MyProcPid)
			shared->slots[i].pid = 0;
	SpinLockRelease(&shared->lock);
}

int
ss_registry_enter(int64 id, int32 sequence, uint32 port, const char *group, int nodes, int self)
{
	int			slot = -1;
	bool		duplicate = false;

	if (!exit_callback_set)
	{
		before_shmem_exit(leave_all, (Datum) 0);
		exit_callback_set = true;
	}
	SpinLockAcquire(&shared->lock);
	for (int i = 0; i < SS_SHUFFLE_SLOTS; i++)
	{
		if (shared->slots[i].pid != 0 && shared->slots[i].id == id &&
			shared->slots[i].sequence == sequence)
			duplicate = true;
		if (shared->slots[i].pid == 0 && slot < 0)
			slot = i;
	}
	if (!duplicate && slot >= 0)
	{
		SsShuffleSlot *s = &shared->slots[slot];

		memset(s, 0, sizeof(*s));
		s->pid = MyProcPid;
		s->database = MyDatabaseId;
		s->id = id;
		s->sequence = sequence;
		s->port = port;
		s->nodes = nodes;
		s->self = self;
		strlcpy(s->group, group, sizeof(s->group));
		strlcpy(s->state, "connecting", sizeof(s->state));
	}
	SpinLockRelease(&shared->lock);
	if (duplicate)
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("shuffle %lld is already running on this node", (long long) id),
				 errhint("Every shuffle needs its own id; slipstream.shuffle_on_group draws a "
						 "fresh one.")));
	if (slot < 0)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("too many shuffles running on this node (at most %d)",
						SS_SHUFFLE_SLOTS),
				 errhint("Wait for one to finish.")));
	return slot;
}

void
ss_registry_leave(int slot)
{
	if (slot < 0 || shared == NULL)
		return;
	SpinLockAcquire(&shared->lock);
	if (shared->slots[slot].pid == MyProcPid)
		shared->slots[slot].pid = 0;
	SpinLockRelease(&shared->lock);
}

void
ss_registry_state(int slot, const char *state)
{
	SpinLockAcquire(&shared->lock);
	strlcpy(shared->slots[slot].state, state, sizeof(shared->slots[slot].state));
	SpinLockRelease(&shared->lock);
}

void
ss_registry_count(int slot, int peer, uint64 rows_sent, uint64 bytes_sent,
				  uint64 rows_received, uint64 bytes_received)
{
	SsPeerProgress *p;

	if (peer < 0 || peer >= SS_SHUFFLE_MAX_NODES)
		return;
	SpinLockAcquire(&shared->lock);
	p = &shared->slots[slot].peers[peer];
	p->rows_sent += rows_sent;
	p->bytes_sent += bytes_sent;
	p->rows_received += rows_received;
	p->bytes_received += bytes_received;
	SpinLockRelease(&shared->lock);
}

/*
 * slipstream.shuffle_port(shuffle_id, wait_seconds): the port this node's participant of the
 * shuffle listens on, waiting until it has registered. Peers call it through libpq.
 */
Datum
slipstream_shuffle_port(PG_FUNCTION_ARGS)
{
	int64		id = PG_GETARG_INT64(0);
	int			wait_seconds = PG_ARGISNULL(1) ? 30 : PG_GETARG_INT32(1);
	int32		sequence = PG_ARGISNULL(2) ? 0 : PG_GETARG_INT32(2);
	TimestampTz deadline;

	if (wait_seconds < 0 || wait_seconds > 3600)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("wait_seconds must be from 0 to 3600")));
	deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), wait_seconds * 1000);
	for (;;)
	{
		int32		port = -1;

		SpinLockAcquire(&shared->lock);
		for (int i = 0; i < SS_SHUFFLE_SLOTS; i++)
			if (shared->slots[i].pid != 0 && shared->slots[i].id == id &&
				shared->slots[i].sequence == sequence && shared->slots[i].database == MyDatabaseId)
				port = (int32) shared->slots[i].port;
		SpinLockRelease(&shared->lock);
		if (port >= 0)
			PG_RETURN_INT32(port);
		if (GetCurrentTimestamp() >= deadline)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("shuffle %lld is not running on this node", (long long) id),
					 errhint("Every node of the peer group must run slipstream.shuffle with the "
							 "same id at the same time; slipstream.shuffle_on_group does that.")));
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, 10,
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
}

/* slipstream.shuffle_progress: a row per running shuffle of this database and peer. */
Datum
slipstream_shuffle_progress(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	SsShuffleSlot *copy = palloc(sizeof(SsShuffleSlot) * SS_SHUFFLE_SLOTS);

	InitMaterializedSRF(fcinfo, 0);
	SpinLockAcquire(&shared->lock);
	memcpy(copy, shared->slots, sizeof(SsShuffleSlot) * SS_SHUFFLE_SLOTS);
	SpinLockRelease(&shared->lock);
	for (int i = 0; i < SS_SHUFFLE_SLOTS; i++)
	{
		SsShuffleSlot *s = &copy[i];

		if (s->pid == 0 || s->database != MyDatabaseId)
			continue;
		for (int peer = 0; peer < s->nodes && peer < SS_SHUFFLE_MAX_NODES; peer++)
		{
			Datum		values[11];
			bool		nulls[11] = {0};

			values[0] = Int32GetDatum(s->pid);
			values[1] = Int64GetDatum(s->id);
			values[2] = CStringGetTextDatum(s->group);
			values[3] = CStringGetTextDatum(s->state);
			values[4] = Int32GetDatum(s->self);
			values[5] = Int32GetDatum(peer);
			values[6] = Int64GetDatum((int64) s->peers[peer].rows_sent);
			values[7] = Int64GetDatum((int64) s->peers[peer].bytes_sent);
			values[8] = Int64GetDatum((int64) s->peers[peer].rows_received);
			values[9] = Int64GetDatum((int64) s->peers[peer].bytes_received);
			values[10] = Int32GetDatum((int32) s->port);
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		}
	}
	return (Datum) 0;
}
