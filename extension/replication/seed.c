/*
 * replication/seed.c: slipstream.seed_snapshot(), the engine half of seeding a backup or a
 * standby (scripts/seed_backup.sh; docs/replication.md, "Seeding a backup").
 *
 * pg_basebackup copies the engine's files while the engine writes them, and that copy is not
 * consistent (a level may be named by a manifest copied after its segments were). So the seed
 * script discards it and streams this function's output instead: every row of every permanent
 * slipstream table as (tag, key, value), taken after the WAL position H below which every
 * change is applied, followed by a trailer row (tag 0) that carries H and the WAL insert
 * position when the dump ended. The standby loads it at its first start and applies our WAL
 * records from H on (host/standby.c): records are idempotent, so a row the dump already holds
 * in a newer version is simply written again on the way to the same final state.
 */
#include "slipstream.h"

#include "access/xlog.h"
#include "access/xlog_internal.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "port/pg_bswap.h"
#include "utils/builtins.h"
#include "utils/tuplestore.h"

PG_FUNCTION_INFO_V1(slipstream_seed_snapshot);

/* A keyspace to dump. */
typedef struct SeedKeyspace
{
	uint64		tag;
	uint32		keyspace;
} SeedKeyspace;

typedef struct SeedList
{
	SeedKeyspace *items;
	int			count;
	int			capacity;
} SeedList;

/* Whether a keyspace belongs in the seed: a permanent table whose file is there. */
static bool
keyspace_wanted(uint64 tag)
{
	Oid			db = (Oid) (tag >> 32);
	Oid			relnode = (Oid) (tag & 0xffffffff);

	if (db == InvalidOid)
		return false;			/* reserved tags */
	if (!ss_relnode_has_files(db, relnode, SS_FILES_MAIN, NULL))
		return false;			/* dropped, or a temporary table's (t<backend>_<relnode>) */
	if (ss_relnode_has_files(db, relnode, SS_FILES_INIT, NULL))
		return false;			/* unlogged: a standby holds it empty */
	return true;
}

/* Collects one keyspace from the engine's list (no PostgreSQL errors are raised in here). */
static void
collect(uint64 tag, uint32 keyspace, void *arg)
{
	SeedList   *list = (SeedList *) arg;

	/*
	 * Keyspaces beyond the room counted were created after the horizon was read: every change
	 * to them starts at or above it, so replay from the horizon brings them in full.
	 */
	if (list->count == list->capacity)
		return;
	list->items[list->count].tag = tag;
	list->items[list->count].keyspace = keyspace;
	list->count++;
}

/* Counts the engine's keyspaces. */
static void
count_one(uint64 tag, uint32 keyspace, void *arg)
{
	(*(int *) arg)++;
}

/* Appends one (tag, key, value) row. */
static void
put_row(Tuplestorestate *store, TupleDesc desc, uint64 tag, const char *key, size_t key_len,
		const char *value, size_t value_len)
{
	Datum		values[3];
	bool		nulls[3] = {false, false, false};
	bytea	   *k = palloc(VARHDRSZ + key_len);
	bytea	   *v = palloc(VARHDRSZ + value_len);

	SET_VARSIZE(k, VARHDRSZ + key_len);
	memcpy(VARDATA(k), key, key_len);
	SET_VARSIZE(v, VARHDRSZ + value_len);
	memcpy(VARDATA(v), value, value_len);
	values[0] = Int64GetDatum((int64) tag);
	values[1] = PointerGetDatum(k);
	values[2] = PointerGetDatum(v);
	tuplestore_putvalues(store, desc, values, nulls);
	pfree(k);
	pfree(v);
}

/*
 * Whether a keyspace was dropped after it was listed (DROP TABLE, TRUNCATE): its rows no
 * longer matter, and a keyspace made for the same tag since then holds only changes at or
 * above the horizon, which replay brings.
 */
static bool
dropped_meanwhile(SeedKeyspace *ks)
{
	uint32		current = 0;

	return ss_keyspace_lookup(ks->tag, &current) != SS_OK || current != ks->keyspace;
}

/* Dumps one keyspace's rows; the iterator is freed on every path. */
static uint64
dump_keyspace(Tuplestorestate *store, TupleDesc desc, SeedKeyspace *ks)
{
	SsIterator *volatile it = ss_iter_new(ks->keyspace);
	volatile uint64 rows = 0;
	SsCode		code;

	if (it == NULL)
		ss_report(SS_NO_MEMORY, "opening an engine iterator");
	PG_TRY();
	{
		for (ss_iter_seek(it, "", 0); ss_iter_valid(it); ss_iter_next(it))
		{
			const char *key;
			const char *value;
			size_t		key_len;
			size_t		value_len;

			ss_iter_key(it, &key, &key_len);
			ss_iter_value(it, &value, &value_len);
			put_row(store, desc, ks->tag, key, key_len, value, value_len);
			if (++rows % 1000 == 0)
				CHECK_FOR_INTERRUPTS();
		}
		code = ss_iter_status(it);
		if (code != SS_OK && !dropped_meanwhile(ks))
			ss_report(code, "reading a table for the seed");
	}
	PG_FINALLY();
	{
		ss_iter_free(it);
	}
	PG_END_TRY();
	return rows;
}

/*
 * The end of the last record inserted, for an insert position `insert`: at the start of a page
 * the insert position names the byte after the page header, which no record reaches yet, and
 * XLogFlush refuses a position past the inserted WAL.
 */
static XLogRecPtr
last_record_end(XLogRecPtr insert)
{
	if (XLogSegmentOffset(insert, wal_segment_size) == SizeOfXLogLongPHD)
		return insert - SizeOfXLogLongPHD;
	if (insert % XLOG_BLCKSZ == SizeOfXLogShortPHD)
		return insert - SizeOfXLogShortPHD;
	return insert;
}

/*
 * slipstream.seed_snapshot(): every row of every permanent slipstream table, then the trailer
 * (see the top of this file). Superusers and slipstream_admin only: it reads every table.
 */
Datum
slipstream_seed_snapshot(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	SeedList	list = {0};
	int			total = 0;
	XLogRecPtr	horizon;
	XLogRecPtr	dump_end;
	uint64		v[2];
	uint64		rows = 0;

	ss_require_admin("take a seed snapshot");
	if (RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("a seed snapshot can only be taken on a primary"),
				 errhint("Seed new standbys from the primary.")));
	ss_engine_ready();
	InitMaterializedSRF(fcinfo, 0);

	/* H first: every change that starts below it is in the engine before any iterator opens. */
	horizon = ss_applied_horizon();
	SS_CHECK(ss_keyspace_list(count_one, &total), "listing keyspaces");
	list.capacity = total + 64;
	list.items = palloc(sizeof(SeedKeyspace) * list.capacity);
	SS_CHECK(ss_keyspace_list(collect, &list), "listing keyspaces");
	for (int i = 0; i < list.count; i++)
	{
		if (keyspace_wanted(list.items[i].tag))
			rows += dump_keyspace(rsinfo->setResult, rsinfo->setDesc, &list.items[i]);
	}
	/*
	 * The dump may hold changes whose WAL is not flushed yet (transactions still open). A crash
	 * of this primary would lose that WAL, and their xids could be handed out again; the copy
	 * would then show rows of those later transactions that they never wrote. Flushing WAL to
	 * the dump's end makes every dumped change one the WAL keeps.
	 */
	dump_end = GetXLogInsertRecPtr();
	XLogFlush(last_record_end(dump_end));
	v[0] = pg_hton64(horizon);
	v[1] = pg_hton64(dump_end);
	put_row(rsinfo->setResult, rsinfo->setDesc, 0, SS_SEED_TRAILER, strlen(SS_SEED_TRAILER),
			(const char *) v, sizeof(v));
	ereport(DEBUG1, (errmsg("slipstream: seed snapshot of " UINT64_FORMAT " rows from %X/%X",
							rows, LSN_FORMAT_ARGS(horizon))));
	return (Datum) 0;
}
