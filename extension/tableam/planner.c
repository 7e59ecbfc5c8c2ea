/*
 * tableam/planner.c: what the planner may choose on slipstream tables.
 *
 * Bitmap heap scans work on slipstream tables (tableam/scan.c), with one catch in PostgreSQL 15:
 * nodeBitmapHeapscan.c prefetches the blocks it will visit through md.c (PrefetchBuffer), as if
 * the table's blocks were md blocks. Our md file is an empty stub, and md.c refuses to prefetch
 * a block beyond its first 1 GB segment when that segment is not full ("previous segment is
 * only 0 blocks"), so a bitmap scan that reached block RELSEG_SIZE (row id 33.5 M with 256 row
 * ids a block) would fail whenever effective_io_concurrency > 0. The planner is therefore told
 * that indexes of a table past half that row id cannot produce bitmaps; the margin covers
 * plans cached while the table grows.
 *
 * PostgreSQL's size functions (pg_relation_size and the others) measure md files, which for a
 * slipstream table are empty stubs; the planner hook puts tableam/sizes.c's functions, which
 * add what the engine holds, in their place in every query it plans (EXPLAIN VERBOSE shows
 * slipstream.relation_size and so on). Views keep PostgreSQL's functions in their definitions:
 * the swap happens when a query is planned, not when it is parsed.
 */
#include "slipstream.h"

#include "access/table.h"
#include "catalog/namespace.h"
#include "catalog/pg_type_d.h"
#include "commands/extension.h"
#include "nodes/nodeFuncs.h"
#include "nodes/pathnodes.h"
#include "optimizer/optimizer.h"
#include "optimizer/plancat.h"
#include "optimizer/planner.h"
#include "parser/parse_func.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"

/* Row ids from which bitmap heap scans are not planned (half of md's first segment). */
#define SS_BITMAP_ROWID_LIMIT ((uint64) RELSEG_SIZE * SS_ROWS_PER_BLOCK / 2)

static get_relation_info_hook_type prev_get_relation_info_hook = NULL;
static planner_hook_type prev_planner_hook = NULL;

/* PostgreSQL's size functions and the names of ours (tableam/sizes.c) that replace them. */
#define SS_SIZE_FUNCTIONS 4
static const struct
{
	Oid			original;
	const char *name;
	int			nargs;
}			size_functions[SS_SIZE_FUNCTIONS] = {
	{F_PG_RELATION_SIZE_REGCLASS_TEXT, "relation_size", 2},
	{F_PG_RELATION_SIZE_REGCLASS, "relation_size", 1},
	{F_PG_TABLE_SIZE, "table_size", 1},
	{F_PG_TOTAL_RELATION_SIZE, "total_relation_size", 1},
};

/* A query's walk: our functions, looked up at the first size function met. */
typedef struct SizeSwap
{
	bool		resolved;
	Oid			ours[SS_SIZE_FUNCTIONS];	/* InvalidOid: the extension is not installed */
} SizeSwap;

/* get_relation_info_hook: no bitmap heap scans on slipstream tables past the limit. */
static void
ss_get_relation_info(PlannerInfo *root, Oid relid, bool inhparent, RelOptInfo *rel)
{
	Relation	relation;

	if (prev_get_relation_info_hook)
		prev_get_relation_info_hook(root, relid, inhparent, rel);
	if (rel->indexlist == NIL)
		return;
	relation = table_open(relid, NoLock);	/* the planner holds its lock */
	if (relation->rd_tableam == ss_tableam_routine() &&
		ss_rowid_high(relation, ss_rel_keyspace(relation)) > SS_BITMAP_ROWID_LIMIT)
	{
		ListCell   *lc;

		foreach(lc, rel->indexlist)
			((IndexOptInfo *) lfirst(lc))->amhasgetbitmap = false;
	}
	table_close(relation, NoLock);
}

/*
 * Finds our size functions in the extension's schema, slipstream (fixed by its control file);
 * none if the extension is not installed in this database.
 */
static void
resolve_size_functions(SizeSwap *swap)
{
	const char *schema = OidIsValid(get_extension_oid("slipstream", true)) ? "slipstream" : NULL;
	Oid			argtypes[2] = {REGCLASSOID, TEXTOID};

	swap->resolved = true;
	for (int i = 0; i < SS_SIZE_FUNCTIONS; i++)
	{
		List	   *name;

		swap->ours[i] = InvalidOid;
		if (schema == NULL)
			continue;
		name = list_make2(makeString(pstrdup(schema)),
						  makeString(pstrdup(size_functions[i].name)));
		swap->ours[i] = LookupFuncName(name, size_functions[i].nargs, argtypes, true);
	}
}

/* Walks a query (subqueries, CTEs and sublinks included), swapping the size functions. */
static bool
swap_size_functions(Node *node, SizeSwap *swap)
{
	if (node == NULL)
		return false;
	if (IsA(node, FuncExpr))
	{
		FuncExpr   *func = (FuncExpr *) node;

		for (int i = 0; i < SS_SIZE_FUNCTIONS; i++)
		{
			if (func->funcid != size_functions[i].original)
				continue;
			if (!swap->resolved)
				resolve_size_functions(swap);
			if (OidIsValid(swap->ours[i]))
				func->funcid = swap->ours[i];
			break;
		}
	}
	if (IsA(node, Query))
		return query_tree_walker((Query *) node, swap_size_functions, swap, 0);
	return expression_tree_walker(node, swap_size_functions, swap);
}

/* planner_hook: our size functions in place of PostgreSQL's, then the planner as before. */
static PlannedStmt *
ss_planner(Query *parse, const char *query_string, int cursor_options,
		   ParamListInfo bound_params)
{
	SizeSwap	swap = {0};

	/* The planner works on its own copy of the query tree, which it changes anyway. */
	(void) swap_size_functions((Node *) parse, &swap);
	if (prev_planner_hook)
		return prev_planner_hook(parse, query_string, cursor_options, bound_params);
	return standard_planner(parse, query_string, cursor_options, bound_params);
}

/* Installs the planner hooks (from _PG_init). */
void
ss_install_planner_hook(void)
{
	prev_get_relation_info_hook = get_relation_info_hook;
	get_relation_info_hook = ss_get_relation_info;
	prev_planner_hook = planner_hook;
	planner_hook = ss_planner;
}
