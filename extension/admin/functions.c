/*
 * admin/functions.c: SQL functions in the slipstream schema: verify, statistics, compact.
 */
#include "slipstream.h"
#include "replication/repl.h"

#include "access/genam.h"
#include "access/relation.h"
#include "access/table.h"
#include "access/xlog.h"
#include "catalog/namespace.h"
#include "catalog/pg_am_d.h"
#include "catalog/pg_authid_d.h"
#include "commands/defrem.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

PG_FUNCTION_INFO_V1(slipstream_verify);
PG_FUNCTION_INFO_V1(slipstream_engine_stats);
PG_FUNCTION_INFO_V1(slipstream_level_stats);
PG_FUNCTION_INFO_V1(slipstream_table_stats);
PG_FUNCTION_INFO_V1(slipstream_compact);

/* Rejects a NULL argument with a clear error. */
static void
require_arg(FunctionCallInfo fcinfo, int n, const char *name)
{
	if (PG_ARGISNULL(n))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be NULL", name),
				 errhint("Pass a slipstream table, for example 'public.t'::regclass.")));
}

/* Opens a relation that must exist and use slipstream. */
static Relation
open_slipstream_table(Oid relid, LOCKMODE lockmode)
{
	Relation	rel = try_relation_open(relid, lockmode);

	if (rel == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("relation with OID %u does not exist", relid)));
	if (rel->rd_rel->relkind != RELKIND_RELATION && rel->rd_rel->relkind != RELKIND_MATVIEW)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("\"%s\" is not a table", RelationGetRelationName(rel))));
	if (rel->rd_tableam != ss_tableam_routine())
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("table \"%s\" does not use the slipstream access method",
						RelationGetRelationName(rel)),
				 errhint("Create it with USING slipstream.")));
	return rel;
}

/* The text argument `n`, refused if NULL. */
char *
ss_text_arg(FunctionCallInfo fcinfo, int n, const char *name)
{
	if (PG_ARGISNULL(n))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", name)));
	return text_to_cstring(PG_GETARG_TEXT_PP(n));
}

/* Configuration needs superuser or membership in slipstream_admin. */
void
ss_require_admin(const char *what)
{
	Oid			admin = get_role_oid("slipstream_admin", true);

	if (superuser())
		return;
	if (OidIsValid(admin) && has_privs_of_role(GetUserId(), admin))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("permission denied to %s", what),
			 errhint("Only superusers and members of the slipstream_admin role may %s.", what)));
}

/* Appends one (check, ok, detail) row. */
static void
put_check(Tuplestorestate *store, TupleDesc desc, const char *check, bool ok, const char *detail)
{
	Datum		values[3];
	bool		nulls[3] = {false, false, false};

	values[0] = CStringGetTextDatum(check);
	values[1] = BoolGetDatum(ok);
	values[2] = CStringGetTextDatum(detail);
	tuplestore_putvalues(store, desc, values, nulls);
}

/* Counts the rows `snapshot` sees through a full scan of btree `index`. */
static int64
count_through_index(Relation rel, Relation index, Snapshot snapshot)
{
	IndexScanDesc scan = index_beginscan(rel, index, snapshot, 0, 0);
	TupleTableSlot *slot = table_slot_create(rel, NULL);
	int64		count = 0;

	index_rescan(scan, NULL, 0, NULL, 0);
	while (index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		CHECK_FOR_INTERRUPTS();
		count++;
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	return count;
}

/*
 * slipstream.verify(regclass): the engine's structural check, then table/index agreement:
 * every btree index must lead to exactly the rows a sequential scan sees.
 */
Datum
slipstream_verify(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Relation	rel;
	SsCode		code;
	Snapshot	snapshot;
	TableScanDesc scan;
	TupleTableSlot *slot;
	int64		rows = 0;
	List	   *indexes;
	ListCell   *lc;

	require_arg(fcinfo, 0, "the table");
	rel = open_slipstream_table(PG_GETARG_OID(0), AccessShareLock);
	InitMaterializedSRF(fcinfo, 0);

	if (ss_engine_imports() && RecoveryInProgress())
	{
		/*
		 * A backup that imports its primary's levels: they are checked as on a primary, but
		 * its rows are not readable before promotion (the changes since the last install are
		 * only in its WAL).
		 */
		ss_engine_attach();
		code = ss_verify();
		put_check(rsinfo->setResult, rsinfo->setDesc, "engine structure", code == SS_OK,
				  code == SS_OK ? "the imported levels: B+-tree order, node checksums, bloom "
				  "filters and segment accounting are consistent" : ss_last_error());
		put_check(rsinfo->setResult, rsinfo->setDesc, "table scan", true,
				  "skipped: an importing backup reads its rows only after promotion");
		relation_close(rel, AccessShareLock);
		return (Datum) 0;
	}
	ss_engine_ready();
	code = ss_verify();
	put_check(rsinfo->setResult, rsinfo->setDesc, "engine structure", code == SS_OK,
			  code == SS_OK ? "B+-tree order, node checksums, bloom filters and segment "
			  "accounting are consistent" : ss_last_error());

	snapshot = RegisterSnapshot(GetTransactionSnapshot());
	scan = table_beginscan(rel, snapshot, 0, NULL);
	slot = table_slot_create(rel, NULL);
	while (table_scan_getnextslot(scan, ForwardScanDirection, slot))
	{
		CHECK_FOR_INTERRUPTS();
		rows++;
	}
	table_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	put_check(rsinfo->setResult, rsinfo->setDesc, "table scan", true,
			  psprintf(INT64_FORMAT " visible rows", rows));

	indexes = RelationGetIndexList(rel);
	foreach(lc, indexes)
	{
		Relation	index = index_open(lfirst_oid(lc), AccessShareLock);
		char	   *name = RelationGetRelationName(index);

		if (index->rd_rel->relam != BTREE_AM_OID ||
			!index->rd_index->indisvalid || RelationGetIndexPredicate(index) != NIL)
			put_check(rsinfo->setResult, rsinfo->setDesc, psprintf("index %s", name), true,
					  "skipped: only valid, non-partial btree indexes are cross-checked");
		else
		{
			int64		through = count_through_index(rel, index, snapshot);

			put_check(rsinfo->setResult, rsinfo->setDesc, psprintf("index %s", name),
					  through == rows,
					  psprintf(INT64_FORMAT " rows through the index, " INT64_FORMAT
							   " in the table", through, rows));
		}
		index_close(index, AccessShareLock);
	}
	UnregisterSnapshot(snapshot);
	relation_close(rel, AccessShareLock);
	return (Datum) 0;
}

/* Appends one (name, value) row. */
static void
put_stat(Tuplestorestate *store, TupleDesc desc, const char *name, double value)
{
	Datum		values[2];
	bool		nulls[2] = {false, false};

	values[0] = CStringGetTextDatum(name);
	values[1] = Float8GetDatum(value);
	tuplestore_putvalues(store, desc, values, nulls);
}

/* slipstream.engine_stats(): engine-wide counters as (name, value) rows. */
Datum
slipstream_engine_stats(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	SsStats		s;
	Tuplestorestate *st;
	TupleDesc	d;
	double		device_bytes = 0;

	InitMaterializedSRF(fcinfo, 0);
	st = rsinfo->setResult;
	d = rsinfo->setDesc;
	ss_engine_ready();
	SS_CHECK(ss_stats(&s), "reading engine statistics");
	put_stat(st, d, "l0_entries", s.l0_entries);
	put_stat(st, d, "l0_bytes", s.l0_bytes);
	put_stat(st, d, "l0_descents", s.l0_descents);
	{
		int			in_use = 0;

		for (uint32 i = 0; i < s.nlevels; i++)
			in_use += s.levels[i].entries > 0;
		put_stat(st, d, "levels_in_use", in_use);
	}
	put_stat(st, d, "user_bytes_written", s.user_bytes_written);
	put_stat(st, d, "device_bytes_written", s.device_bytes_written);
	put_stat(st, d, "device_bytes_read", s.device_bytes_read);
	device_bytes = s.device_bytes_written;
	put_stat(st, d, "write_amplification",
			 s.user_bytes_written ? device_bytes / s.user_bytes_written : 0);
	put_stat(st, d, "compactions", s.compactions);
	put_stat(st, d, "compaction_bytes_written", s.compaction_bytes_written);
	put_stat(st, d, "compaction_leaves_kept", s.compaction_leaves_kept);
	put_stat(st, d, "compaction_leaves_moved", s.compaction_leaves_moved);
	put_stat(st, d, "compaction_filters_rebuilt", s.compaction_filters_rebuilt);
	put_stat(st, d, "gc_runs", s.gc_runs);
	put_stat(st, d, "large_patches", s.large_patches);
	put_stat(st, d, "row_cache_hits", s.row_cache_hits);
	put_stat(st, d, "row_cache_misses", s.row_cache_misses);
	put_stat(st, d, "row_cache_installs", s.row_cache_installs);
	put_stat(st, d, "gc_bytes_relocated", s.gc_bytes_relocated);
	put_stat(st, d, "gc_reclaimed_bytes", s.gc_reclaimed_bytes);
	put_stat(st, d, "stalls", s.stall_count);
	put_stat(st, d, "stall_micros", s.stall_micros);
	put_stat(st, d, "log_flushes", s.log_flushes);
	put_stat(st, d, "log_records_flushed", s.log_records_flushed);
	put_stat(st, d, "log_barrier_calls", s.log_barrier_calls);
	put_stat(st, d, "records_per_flush",
			 s.log_flushes ? (double) s.log_records_flushed / s.log_flushes : 0);
	put_stat(st, d, "segments_in_use", s.segments_in_use);
	put_stat(st, d, "medium_log_segments", s.medium_log_segments);
	put_stat(st, d, "large_log_segments", s.large_log_segments);
	put_stat(st, d, "l0_log_segments", s.l0_log_segments);
	put_stat(st, d, "last_lsn", s.last_lsn);
	put_stat(st, d, "durable_lsn", s.durable_lsn);
	put_stat(st, d, "wal_records_replayed_at_start",
			 pg_atomic_read_u64(&ss_shared->replayed_records));
	return (Datum) 0;
}

/* slipstream.level_stats(): one row per level with its size and entries per size class. */
Datum
slipstream_level_stats(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	SsStats		s;

	InitMaterializedSRF(fcinfo, 0);
	ss_engine_ready();
	SS_CHECK(ss_stats(&s), "reading engine statistics");
	for (uint32 i = 0; i < s.nlevels; i++)
	{
		Datum		values[8];
		bool		nulls[8] = {0};

		values[0] = Int32GetDatum(s.levels[i].level);
		values[1] = Int64GetDatum(s.levels[i].bytes);
		values[2] = Int64GetDatum(s.levels[i].segments);
		values[3] = Int64GetDatum(s.levels[i].entries);
		values[4] = Int64GetDatum(s.levels[i].small_entries);
		values[5] = Int64GetDatum(s.levels[i].medium_entries);
		values[6] = Int64GetDatum(s.levels[i].large_entries);
		values[7] = Int64GetDatum(s.levels[i].tombstones);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/* slipstream.table_stats(regclass): the table's keyspace and row id high-water mark. */
Datum
slipstream_table_stats(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Relation	rel;
	Datum		values[3];
	bool		nulls[3] = {false, false, false};
	uint32		keyspace;

	require_arg(fcinfo, 0, "the table");
	rel = open_slipstream_table(PG_GETARG_OID(0), AccessShareLock);
	InitMaterializedSRF(fcinfo, 0);
	keyspace = ss_rel_keyspace(rel);
	values[0] = Int64GetDatum((int64) keyspace);
	values[1] = Int64GetDatum((int64) ss_rowid_high(rel, keyspace));
	values[2] = Int64GetDatum((int64) rel->rd_node.relNode);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	relation_close(rel, AccessShareLock);
	return (Datum) 0;
}

/* slipstream.compact(regclass): compacts the engine down to its last level now. */
Datum
slipstream_compact(PG_FUNCTION_ARGS)
{
	Relation	rel;

	require_arg(fcinfo, 0, "the table");
	ss_require_admin("force a compaction");
	rel = open_slipstream_table(PG_GETARG_OID(0), AccessShareLock);
	ss_engine_ready();
	SS_CHECK(ss_compact_all(), "compacting");
	relation_close(rel, AccessShareLock);
	PG_RETURN_VOID();
}

PG_FUNCTION_INFO_V1(slipstream_row_versions);

/*
 * slipstream.row_versions(regclass): every stored row version (dead ones too, and the redirects
 * of pruned chain roots) with its MVCC header, like pageinspect's heap_page_items; for
 * diagnosis, superusers only.
 */
Datum
slipstream_row_versions(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Relation	rel;
	TableScanDesc scan;
	TupleTableSlot *slot;

	require_arg(fcinfo, 0, "the table");
	if (!superuser())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to read raw row versions"),
				 errhint("Only superusers may call slipstream.row_versions.")));
	rel = open_slipstream_table(PG_GETARG_OID(0), AccessShareLock);
	InitMaterializedSRF(fcinfo, 0);
	scan = table_beginscan(rel, SnapshotAny, 0, NULL);
	ss_scan_every_row(scan);	/* chain roots' redirects too */
	slot = table_slot_create(rel, NULL);
	while (table_scan_getnextslot(scan, ForwardScanDirection, slot))
	{
		bool		should_free;
		HeapTuple	tuple = ExecFetchSlotHeapTuple(slot, false, &should_free);
		HeapTupleHeader h = tuple->t_data;
		Datum		values[6];
		bool		nulls[6] = {0};

		values[0] = PointerGetDatum(&tuple->t_self);
		values[1] = TransactionIdGetDatum(HeapTupleHeaderGetRawXmin(h));
		values[2] = TransactionIdGetDatum(HeapTupleHeaderGetRawXmax(h));
		values[3] = Int32GetDatum(h->t_infomask);
		values[4] = Int32GetDatum(h->t_infomask2);
		values[5] = PointerGetDatum(&h->t_ctid);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	table_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	relation_close(rel, AccessShareLock);
	return (Datum) 0;
}
