/*
 * host.c: hosting the engine inside PostgreSQL: its shared-memory arena and our shared state,
 * each process's engine handle, relation keyspaces, row id allocation and row locks.
 */
#include "slipstream.h"

#include <sys/stat.h>

#include "access/xlog.h"
#include "access/twophase.h"
#include "access/xloginsert.h"
#include "utils/wait_event.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"

SsShared   *ss_shared = NULL;

static void *engine_arena = NULL;
static size_t engine_arena_size = 0;
static HTAB *rowid_map = NULL;
static LWLock *rowid_map_lock = NULL;
static int	row_lock_tranche = 0;

#define SS_ROWID_MAP_SIZE 8192
#define SS_ARENA_ALIGN 4096

typedef struct RowidMapEntry
{
	uint64		tag;
	pg_atomic_uint64 next;
} RowidMapEntry;

/* Number of PGPROC slots, the size of the per-backend arrays. */
static int
proc_slots(void)
{
	return MaxBackends + NUM_AUXILIARY_PROCS + max_prepared_xacts;
}

/* Bytes of our own shared state. */
static Size
shared_size(void)
{
	return add_size(offsetof(SsShared, inflight),
					mul_size(sizeof(pg_atomic_uint64), proc_slots()));
}

/* Asks for the arena, our shared state, the row id map and its lock (shmem_request_hook). */
void
ss_shmem_request(void)
{
	SsOptions	options;

	ss_fill_options(&options);
	engine_arena_size = ss_arena_size(&options);
	if (engine_arena_size == 0)
		ereport(FATAL,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("slipstream: the engine settings are inconsistent"),
				 errhint("Check slipstream.segment_size, slipstream.node_size and the value "
						 "size thresholds: node_size must be at most segment_size / 8 and "
						 "small_threshold below large_threshold.")));
	RequestAddinShmemSpace(add_size(engine_arena_size, SS_ARENA_ALIGN));
	RequestAddinShmemSpace(shared_size());
	RequestAddinShmemSpace(hash_estimate_size(SS_ROWID_MAP_SIZE, sizeof(RowidMapEntry)));
	RequestNamedLWLockTranche("slipstream", 1);
}

/* Creates or attaches the shared structures; a fresh arena is zeroed (shmem_startup_hook). */
void
ss_shmem_startup(void)
{
	bool		found;
	char	   *raw;
	HASHCTL		info;

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	raw = ShmemInitStruct("slipstream engine arena", engine_arena_size + SS_ARENA_ALIGN, &found);
	engine_arena = (void *) TYPEALIGN(SS_ARENA_ALIGN, raw);
	if (!found)
		memset(engine_arena, 0, engine_arena_size);

	ss_shared = ShmemInitStruct("slipstream shared state", shared_size(), &found);
	if (!found)
	{
		memset(ss_shared, 0, shared_size());
		pg_atomic_init_u32(&ss_shared->replay_state, 0);
		ConditionVariableInit(&ss_shared->replay_cv);
		pg_atomic_init_u64(&ss_shared->max_applied_lsn, 0);
		pg_atomic_init_u64(&ss_shared->durable_horizon, 0);
		pg_atomic_init_u64(&ss_shared->replayed_records, 0);
		row_lock_tranche = LWLockNewTrancheId();
		for (int i = 0; i < SS_ROW_LOCKS; i++)
			LWLockInitialize(&ss_shared->row_locks[i].lock, row_lock_tranche);
		for (int i = 0; i < proc_slots(); i++)
			pg_atomic_init_u64(&ss_shared->inflight[i], 0);
	}
	else
		row_lock_tranche = ss_shared->row_locks[0].lock.tranche;

	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(uint64);
	info.entrysize = sizeof(RowidMapEntry);
	rowid_map = ShmemInitHash("slipstream row ids", SS_ROWID_MAP_SIZE, SS_ROWID_MAP_SIZE, &info,
							  HASH_ELEM | HASH_BLOBS);
	rowid_map_lock = &(GetNamedLWLockTranche("slipstream"))->lock;
	LWLockRelease(AddinShmemInitLock);
	LWLockRegisterTranche(row_lock_tranche, "slipstream_row");
}

/*
 * Whether a cancel, statement timeout or termination is pending: only reads the flags the
 * signal handlers set, so the engine may call it from C++ (nothing here can throw).
 */
static bool
cancel_pending(void)
{
	return QueryCancelPending || ProcDiePending;
}

/* Turns a failed bridge call into an ERROR with a fitting errcode. */
void
ss_report(SsCode code, const char *what)
{
	int			errcode_value;

	/* A wait the engine gave up because of a cancel reports the cancel itself. */
	if (code == SS_BUSY)
		CHECK_FOR_INTERRUPTS();

	switch (code)
	{
		case SS_CORRUPTION:
			errcode_value = ERRCODE_DATA_CORRUPTED;
			break;
		case SS_IO_ERROR:
			errcode_value = ERRCODE_IO_ERROR;
			break;
		case SS_INVALID:
			errcode_value = ERRCODE_INVALID_PARAMETER_VALUE;
			break;
		case SS_NO_MEMORY:
			errcode_value = ERRCODE_OUT_OF_MEMORY;
			break;
		case SS_BUSY:
			errcode_value = ERRCODE_OBJECT_IN_USE;
			break;
		default:
			errcode_value = ERRCODE_INTERNAL_ERROR;
			break;
	}
	ereport(ERROR,
			(errcode(errcode_value),
			 errmsg("slipstream: %s failed: %s", what, ss_last_error()),
			 code == SS_BUSY ?
			 errhint("Long-running scans or open cursors on slipstream tables hold engine memory; finish them and retry.") : 0));
}

/* Drops this process's engine handle at exit. */
static void
close_engine(int code, Datum arg)
{
	ss_close();
}

/* Opens the engine in this process; the first process after a (re)start recovers it. */
void
ss_engine_attach(void)
{
	SsOptions	options;
	SsCode		code;

	if (ss_is_open())
		return;
	if (ss_shared == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("slipstream must be loaded via shared_preload_libraries"),
				 errhint("Add slipstream to shared_preload_libraries in postgresql.conf and "
						 "restart the server.")));
	ss_fill_options(&options);
	if (mkdir(options.directory, S_IRWXU) != 0 && errno != EEXIST)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("slipstream: could not create directory \"%s\": %m", options.directory)));
	code = ss_open(&options, engine_arena, engine_arena_size, ss_persist_barrier,
				   cancel_pending);
	if (code != SS_OK)
		ss_report(code, "opening the engine");
	before_shmem_exit(close_engine, 0);
}

/* Opens the engine and waits for WAL replay: every table access goes through here. */
void
ss_engine_ready(void)
{
	uint32		state;

	if (ss_shared != NULL && pg_atomic_read_u32(&ss_shared->replay_state) == 2 && ss_is_open())
		return;
	if (RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("slipstream tables cannot be accessed during recovery"),
				 errhint("slipstream replicates through its own backup nodes, not through "
						 "physical standbys; query the primary.")));
	ss_engine_attach();
	for (;;)
	{
		state = pg_atomic_read_u32(&ss_shared->replay_state);
		if (state == 2)
			break;
		if (state == 3)
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("slipstream: replaying the WAL into the engine failed: %s",
							ss_shared->replay_error),
					 errhint("See the server log of the slipstream worker.")));
		ConditionVariableTimedSleep(&ss_shared->replay_cv, 100, PG_WAIT_EXTENSION);
		CHECK_FOR_INTERRUPTS();
	}
	ConditionVariableCancelSleep();
}

/* Keyspace of a tag; creates it when missing and `create`. Returns 0 for "none". */
uint32
ss_keyspace_for_tag(uint64 tag, bool create)
{
	uint32		keyspace = 0;
	SsCode		code = ss_keyspace_lookup(tag, &keyspace);

	if (code == SS_NOT_FOUND)
	{
		if (!create)
			return 0;
		code = ss_keyspace_create(tag, &keyspace);
		if (code == SS_INVALID)	/* created meanwhile by another backend */
			code = ss_keyspace_lookup(tag, &keyspace);
	}
	if (code != SS_OK)
		ss_report(code, "looking up a keyspace");
	return keyspace;
}

/* Keyspace of a relation, cached in its relcache entry (dropped on invalidation). */
uint32
ss_rel_keyspace(Relation rel)
{
	uint64		tag = ss_tag(MyDatabaseId, rel->rd_node.relNode);
	uint64	   *cache = (uint64 *) rel->rd_amcache;
	uint32		keyspace;

	ss_engine_ready();
	if (cache != NULL && cache[0] == tag)
		return (uint32) cache[1];
	keyspace = ss_keyspace_for_tag(tag, true);
	if (rel->rd_amcache == NULL)
		rel->rd_amcache = MemoryContextAlloc(CacheMemoryContext, 2 * sizeof(uint64));
	cache = (uint64 *) rel->rd_amcache;
	cache[0] = tag;
	cache[1] = keyspace;
	return keyspace;
}

/* Whether the keyspace holds any row with id >= rowid. */
static bool
has_row_at_or_after(SsIterator *it, uint64 rowid)
{
	char		key[SS_KEY_SIZE];

	ss_encode_key(rowid, key);
	ss_iter_seek(it, key, SS_KEY_SIZE);
	return ss_iter_valid(it);
}

/* One past the highest row id in the keyspace, by binary search over seeks. */
static uint64
first_free_rowid(uint32 keyspace)
{
	SsIterator *it = ss_iter_new(keyspace);
	uint64		lo = 0;
	uint64		hi = SS_MAX_ROWID;
	SsCode		code;

	if (it == NULL)
		ss_report(SS_INTERNAL, "opening an iterator");
	if (!has_row_at_or_after(it, 0))
	{
		code = ss_iter_status(it);
		ss_iter_free(it);
		if (code != SS_OK)
			ss_report(code, "scanning for the highest row id");
		return 0;
	}
	/* Invariant: a row exists at or after lo; none at or after hi. */
	while (hi - lo > 1)
	{
		uint64		mid = lo + (hi - lo) / 2;

		if (has_row_at_or_after(it, mid))
			lo = mid;
		else
			hi = mid;
	}
	code = ss_iter_status(it);
	ss_iter_free(it);
	if (code != SS_OK)
		ss_report(code, "scanning for the highest row id");
	return lo + 1;
}

/* Reserves `count` consecutive fresh row ids for a relation. */
uint64
ss_next_rowid(Relation rel, uint32 keyspace, uint32 count)
{
	uint64		tag = ss_tag(MyDatabaseId, rel->rd_node.relNode);
	RowidMapEntry *entry;
	bool		found;
	uint64		first;

	LWLockAcquire(rowid_map_lock, LW_SHARED);
	entry = hash_search(rowid_map, &tag, HASH_FIND, NULL);
	if (entry != NULL)
	{
		first = pg_atomic_fetch_add_u64(&entry->next, count);
		LWLockRelease(rowid_map_lock);
	}
	else
	{
		LWLockRelease(rowid_map_lock);
		LWLockAcquire(rowid_map_lock, LW_EXCLUSIVE);
		entry = hash_search(rowid_map, &tag, HASH_ENTER_NULL, &found);
		if (entry == NULL)
		{
			LWLockRelease(rowid_map_lock);
			ereport(ERROR,
					(errcode(ERRCODE_OUT_OF_MEMORY),
					 errmsg("slipstream: too many tables in use at once (at most %d)",
							SS_ROWID_MAP_SIZE)));
		}
		if (!found)
			pg_atomic_init_u64(&entry->next, first_free_rowid(keyspace));
		first = pg_atomic_fetch_add_u64(&entry->next, count);
		LWLockRelease(rowid_map_lock);
	}
	if (first + count > SS_MAX_ROWID)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("slipstream: table \"%s\" has used up its row ids",
						RelationGetRelationName(rel)),
				 errhint("Rewrite the table with VACUUM FULL to renumber its rows.")));
	return first;
}

/* Forgets the row id counter of a dropped or emptied keyspace. */
void
ss_forget_rowids(uint64 tag)
{
	LWLockAcquire(rowid_map_lock, LW_EXCLUSIVE);
	hash_search(rowid_map, &tag, HASH_REMOVE, NULL);
	LWLockRelease(rowid_map_lock);
}

/* The lock serializing changes to one row (striped). */
LWLock *
ss_row_lock(uint64 tag, uint64 rowid)
{
	uint64		h = (tag * UINT64CONST(0x9E3779B97F4A7C15)) ^ (rowid * UINT64CONST(0xC2B2AE3D27D4EB4F));

	return &ss_shared->row_locks[(h >> 32) % SS_ROW_LOCKS].lock;
}

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

/* One past the highest row id handed out (0 for an empty relation). */
uint64
ss_rowid_high(Relation rel, uint32 keyspace)
{
	return ss_next_rowid(rel, keyspace, 0);
}
