/*
 * tableam/planner.c: what the planner sees of slipstream tables.
 *
 * PostgreSQL's size functions (pg_relation_size and the others) measure md files, which for a
 * slipstream table are empty stubs; the planner hook puts tableam/sizes.c's functions, which
 * add what the engine holds, in their place in every query it plans (EXPLAIN VERBOSE shows
 * slipstream.relation_size and so on). Views keep PostgreSQL's functions in their definitions:
 * the swap happens when a query is planned, not when it is parsed.
 *
 * (Bitmap heap scans used to be refused on tables past row id 16.7 M here, because md.c's
 * prefetches failed past the stub's first segment; tableam/prefetch.c turns those off.)
 */
#include "slipstream.h"

#include "catalog/namespace.h"
#include "catalog/pg_type_d.h"
#include "commands/extension.h"
#include "nodes/nodeFuncs.h"
#include "optimizer/optimizer.h"
#include "optimizer/planner.h"
#include "parser/parse_func.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"

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

/* Installs the planner hook (from _PG_init). */
void
ss_install_planner_hook(void)
{
	prev_planner_hook = planner_hook;
	planner_hook = ss_planner;
}
