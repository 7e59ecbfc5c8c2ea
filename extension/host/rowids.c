/*
 * host/rowids.c: a relation's engine keyspace (cached in its relcache entry) and its row ids:
 * dense, never reused, handed out from a shared counter per relation file node that is
 * initialised after a restart by a binary search over iterator seeks (and during recovery
 * read that way every time, never cached: replay does not take ids from the counter).
 */
#include "slipstream.h"

#include "access/xlog.h"
#include "miscadmin.h"
#include "port/pg_bitutils.h"
#include "storage/ipc.h"
#include "storage/shmem.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/memutils.h"

static HTAB *rowid_map = NULL;
static LWLock *rowid_map_lock = NULL;

#define SS_ROWID_MAP_SIZE 8192

typedef struct RowidMapEntry
{
	uint64		tag;
	pg_atomic_uint64 next;
} RowidMapEntry;

/* Asks for the row id map and its lock (from the shmem_request_hook). */
void
ss_rowids_shmem_request(void)
{
	RequestAddinShmemSpace(hash_estimate_size(SS_ROWID_MAP_SIZE, sizeof(RowidMapEntry)));
	RequestNamedLWLockTranche("slipstream", 1);
}

/* Creates or attaches the row id map (from the shmem_startup_hook, under AddinShmemInitLock). */
void
ss_rowids_shmem_init(void)
{
	HASHCTL		info;

	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(uint64);
	info.entrysize = sizeof(RowidMapEntry);
	rowid_map = ShmemInitHash("slipstream row ids", SS_ROWID_MAP_SIZE, SS_ROWID_MAP_SIZE, &info,
							  HASH_ELEM | HASH_BLOBS);
	rowid_map_lock = &(GetNamedLWLockTranche("slipstream"))->lock;
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

/* The backend's cache of a relation (rd_amcache, dropped on invalidation), made when missing. */
SsRelCache *
ss_rel_cache(Relation rel)
{
	uint64		tag = ss_tag(MyDatabaseId, rel->rd_node.relNode);
	SsRelCache *cache = (SsRelCache *) rel->rd_amcache;
	uint32		keyspace;

	ss_engine_ready();
	if (cache != NULL && cache->tag == tag)
		return cache;
	keyspace = ss_keyspace_for_tag(tag, true);
	if (cache == NULL)
		cache = MemoryContextAlloc(CacheMemoryContext, sizeof(SsRelCache));
	memset(cache, 0, sizeof(SsRelCache));
	cache->keyspace = keyspace;
	cache->tag = tag;
	rel->rd_amcache = cache;
	return cache;
}

/* Keyspace of a relation, cached in its relcache entry. */
uint32
ss_rel_keyspace(Relation rel)
{
	return ss_rel_cache(rel)->keyspace;
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

/*
 * Every row id is a stored version until VACUUM (dead ones included), and the planner's
 * estimate counts them (tableam/ddl.c). A plan cached while a small table had few versions
 * (pgbench's branches right after its VACUUM: a sequential scan of one page) would scan ever
 * more dead versions until autovacuum invalidates it; so each time the table's row ids double
 * past 256, its relcache entry is invalidated (at commit), and cached plans are made again.
 */
static void
replan_when_doubled(Relation rel, uint64 first, uint32 count)
{
	uint64		end = first + count;

	if (count == 0 || end < 256)
		return;
	if (pg_leftmost_one_pos64(end) != pg_leftmost_one_pos64(Max(first, 1)))
		CacheInvalidateRelcache(rel);
}

/* Reserves `count` consecutive fresh row ids for a relation. */
uint64
ss_next_rowid(Relation rel, uint32 keyspace, uint32 count)
{
	uint64		tag = ss_tag(MyDatabaseId, rel->rd_node.relNode);
	RowidMapEntry *entry;
	bool		found;
	uint64		first;

	/*
	 * On a standby, replay adds rows with the primary's ids and never takes them from here: a
	 * counter cached now would fall behind (parallel scans would miss rows) and, after a
	 * promotion, hand out ids of rows that exist (inserts would overwrite them). So in
	 * recovery the high-water mark is read from the engine every time, and nothing is cached.
	 */
	if (RecoveryInProgress())
	{
		if (count != 0)
			ereport(ERROR,
					(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
					 errmsg("slipstream: cannot take row ids during recovery")));
		return first_free_rowid(keyspace);
	}
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
	replan_when_doubled(rel, first, count);
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

/* One past the highest row id handed out (0 for an empty relation). */
uint64
ss_rowid_high(Relation rel, uint32 keyspace)
{
	return ss_next_rowid(rel, keyspace, 0);
}
