/*
 * tableam/prefetch.c: no md.c prefetches for slipstream tables.
 *
 * PostgreSQL 15 prefetches the blocks a bitmap heap scan (effective_io_concurrency) and an
 * ANALYZE (maintenance_io_concurrency) are about to read through md.c (PrefetchBuffer), as if a
 * table's blocks were md blocks. A slipstream table's md file is an empty stub; its rows are in
 * the engine, so such a prefetch has nothing to read, and md.c refuses one beyond the stub's
 * first 1 GB segment ("previous segment is only 0 blocks"): a bitmap scan or an ANALYZE that
 * reached block 131,072 (row id 33.5 M at 256 row ids a block) failed. Every such prefetch is
 * turned off instead:
 *  - a bitmap heap scan's node reads its prefetch distance when the executor starts; the
 *    ExecutorStart hook sets it to 0 for the nodes that scan slipstream tables, before any
 *    prefetch (BitmapHeapNext prefetches only from its first row on);
 *  - ANALYZE reads maintenance_io_concurrency right after it asks the table's size
 *    (acquire_sample_rows); the size callback, seeing the backend's progress report say that
 *    an ANALYZE is under way, sets the setting to 0 for the rest of that relation's analysis
 *    (as a function's SET clause would: ANALYZE undoes its GUC changes at the end). Without
 *    track_activities there is no progress report to see; `maintenance_io_concurrency = 0`
 *    does the same by hand.
 * Neither changes what is read: the rows come from the engine, never from md blocks.
 */
#include "slipstream.h"

#include "commands/progress.h"
#include "executor/executor.h"
#include "nodes/nodeFuncs.h"
#include "storage/bufmgr.h"
#include "utils/backend_status.h"
#include "utils/guc.h"

static ExecutorStart_hook_type prev_executor_start_hook = NULL;

/* Turns off the prefetches of one bitmap heap scan node (and walks on to its children). */
static bool
stop_bitmap_prefetch(PlanState *node, void *context)
{
	if (node == NULL)
		return false;
	if (IsA(node, BitmapHeapScanState))
	{
		BitmapHeapScanState *bitmap = (BitmapHeapScanState *) node;
		Relation	rel = bitmap->ss.ss_currentRelation;

		if (rel != NULL && rel->rd_tableam == ss_tableam_routine())
			bitmap->prefetch_maximum = 0;
	}
	return planstate_tree_walker(node, stop_bitmap_prefetch, context);
}

/* ExecutorStart_hook: the plan's state as usual, then no prefetches for our bitmap scans. */
static void
ss_executor_start(QueryDesc *query, int eflags)
{
	if (prev_executor_start_hook)
		prev_executor_start_hook(query, eflags);
	else
		standard_ExecutorStart(query, eflags);
	if (query->planstate != NULL)
		(void) stop_bitmap_prefetch(query->planstate, NULL);
}

/*
 * Called when a slipstream table's size is asked: if this backend is running an ANALYZE (of
 * that table, or of a parent whose sample takes its rows), it is about to read
 * maintenance_io_concurrency for its prefetches, which is set to 0 for the rest of that
 * relation's analysis: do_analyze_rel undoes its GUC changes when it ends (AtEOXact_GUC on its
 * own nesting level), and an error's abort does too.
 */
void
ss_analyze_prefetch_off(void)
{
	if (MyBEEntry == NULL || MyBEEntry->st_progress_command != PROGRESS_COMMAND_ANALYZE ||
		maintenance_io_concurrency == 0)
		return;
	(void) set_config_option("maintenance_io_concurrency", "0", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
}

/* Installs the ExecutorStart hook (from _PG_init). */
void
ss_install_prefetch_hook(void)
{
	prev_executor_start_hook = ExecutorStart_hook;
	ExecutorStart_hook = ss_executor_start;
}
