/*
 * tableam/sizes.c: the sizes of slipstream tables as PostgreSQL's size functions report them.
 *
 * pg_relation_size, pg_table_size and pg_total_relation_size add up the sizes of a relation's
 * md files. A slipstream table's md file is an empty stub (its rows live in the engine), so
 * they would report 0 bytes to \d+, to monitoring tools and to anyone sizing a database. These
 * functions report what the engine holds for the table instead (Engine::ApproximateSize: keys
 * and values of every stored version, medium and large values at their size in the value logs)
 * and defer to PostgreSQL's own for every other relation and fork. tableam/planner.c puts them
 * in place of PostgreSQL's in every query planned, so the usual names work.
 */
#include "slipstream.h"
#include "replication/repl.h"

#include "access/relation.h"
#include "access/xlog.h"
#include "common/relpath.h"
#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/rel.h"

PG_FUNCTION_INFO_V1(slipstream_relation_size);
PG_FUNCTION_INFO_V1(slipstream_relation_main_size);
PG_FUNCTION_INFO_V1(slipstream_table_size);
PG_FUNCTION_INFO_V1(slipstream_total_relation_size);

/*
 * The bytes the engine holds for relation `relid` if it is a slipstream table, else -1 (also on
 * a backup that imports its primary's levels: its engine cannot be read before promotion, and
 * the size functions then report PostgreSQL's own answer instead of failing).
 */
static int64
engine_bytes(Oid relid)
{
	Relation	rel;
	int64		bytes = -1;

	if (ss_engine_imports() && RecoveryInProgress())
		return -1;
	rel = try_relation_open(relid, AccessShareLock);
	if (rel == NULL)
		return -1;
	if (rel->rd_tableam == ss_tableam_routine() &&
		(rel->rd_rel->relkind == RELKIND_RELATION || rel->rd_rel->relkind == RELKIND_MATVIEW))
	{
		uint64		size;
		SsCode		code = ss_keyspace_size(ss_rel_keyspace(rel), &size);

		if (code != SS_OK)
			ss_report(code, "estimating a table's size");
		bytes = (int64) size;
	}
	relation_close(rel, AccessShareLock);
	return bytes;
}

/*
 * Calls PostgreSQL's size function `fn` with this call's arguments; returns its result and
 * whether it was NULL (the relation does not exist).
 */
static int64
call_original(PGFunction fn, FunctionCallInfo fcinfo, bool *isnull)
{
	LOCAL_FCINFO(inner, 2);
	Datum		result;

	InitFunctionCallInfoData(*inner, NULL, fcinfo->nargs, fcinfo->fncollation, NULL, NULL);
	for (int i = 0; i < fcinfo->nargs; i++)
		inner->args[i] = fcinfo->args[i];
	result = fn(inner);
	*isnull = inner->isnull;
	return *isnull ? 0 : DatumGetInt64(result);
}

/*
 * The result of PostgreSQL's `fn` for the arguments of `call`, plus the engine's bytes when
 * `with_engine` and the relation is ours; NULL (in `fcinfo`, the call being answered) when
 * PostgreSQL's is.
 */
static Datum
size_result(PGFunction fn, FunctionCallInfo call, bool with_engine, FunctionCallInfo fcinfo)
{
	bool		isnull;
	int64		size = call_original(fn, call, &isnull);
	int64		bytes;

	if (isnull)
		PG_RETURN_NULL();
	bytes = with_engine ? engine_bytes(DatumGetObjectId(call->args[0].value)) : -1;
	PG_RETURN_INT64(bytes >= 0 ? size + bytes : size);
}

/* relation_size(rel, fork): pg_relation_size, with the engine's bytes as the main fork's. */
Datum
slipstream_relation_size(PG_FUNCTION_ARGS)
{
	char	   *fork = text_to_cstring(PG_GETARG_TEXT_PP(1));

	return size_result(pg_relation_size, fcinfo, forkname_to_number(fork) == MAIN_FORKNUM,
					   fcinfo);
}

/* relation_size(rel): the main fork's size, as pg_relation_size(rel). */
Datum
slipstream_relation_main_size(PG_FUNCTION_ARGS)
{
	LOCAL_FCINFO(call, 2);

	InitFunctionCallInfoData(*call, NULL, 2, fcinfo->fncollation, NULL, NULL);
	call->args[0] = fcinfo->args[0];
	call->args[1].value = CStringGetTextDatum("main");
	call->args[1].isnull = false;
	return size_result(pg_relation_size, call, true, fcinfo);
}

/* table_size(rel): pg_table_size, with the engine's bytes. */
Datum
slipstream_table_size(PG_FUNCTION_ARGS)
{
	return size_result(pg_table_size, fcinfo, true, fcinfo);
}

/* total_relation_size(rel): pg_total_relation_size, with the engine's bytes. */
Datum
slipstream_total_relation_size(PG_FUNCTION_ARGS)
{
	return size_result(pg_total_relation_size, fcinfo, true, fcinfo);
}
