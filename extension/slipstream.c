/*
 * slipstream.c: module entry point: settings (GUCs), shared-memory hooks, the resource
 * manager, the background worker, and per-transaction cleanup.
 */
#include "slipstream.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "miscadmin.h"
#include "replication/slot.h"
#include "storage/ipc.h"
#include "storage/proc.h"
#include "utils/guc.h"

PG_MODULE_MAGIC;

int			ss_segment_size_kb = 2048;
int			ss_node_size_kb = 8;
int			ss_l0_size_mb = 16;
int			ss_memtables = 4;
int			ss_growth_factor = 8;
int			ss_max_levels = 7;
int			ss_small_threshold = 100;
int			ss_large_threshold = 1000;
int			ss_medium_inplace_level = 0;
bool		ss_compress_large = true;
double		ss_gc_threshold = 0.1;
int			ss_bloom_bits = 10;
int			ss_flush_interval_ms = 10;
int			ss_worker_naptime_ms = 100;
int			ss_sync_interval_ms = 1000;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

void		_PG_init(void);

/* shmem_request_hook: our arena and state. */
static void
request_shmem(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	ss_shmem_request();
}

/* shmem_startup_hook: create or attach our shared structures. */
static void
startup_shmem(void)
{
	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	ss_shmem_startup();
}

/* A change interrupted by an error is no longer in flight (the horizon must not stick). */
static void
on_xact_end(XactEvent event, void *arg)
{
	if ((event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT) && ss_shared != NULL &&
		MyProc != NULL)
		ss_change_done();
}

/* Same for subtransactions rolled back by an error. */
static void
on_subxact_end(SubXactEvent event, SubTransactionId sub, SubTransactionId parent, void *arg)
{
	if (event == SUBXACT_EVENT_ABORT_SUB && ss_shared != NULL && MyProc != NULL)
		ss_change_done();
}

/* Declares one integer setting fixed at server start. */
static void
define_int(const char *name, const char *desc, int *var, int boot, int min, int max, int flags)
{
	DefineCustomIntVariable(name, desc, NULL, var, boot, min, max, PGC_POSTMASTER, flags, NULL,
							NULL, NULL);
}

/* Module load: everything here requires shared_preload_libraries. */
void
_PG_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("slipstream must be loaded via shared_preload_libraries"),
				 errhint("Add slipstream to shared_preload_libraries in postgresql.conf and "
						 "restart the server.")));
	if (wal_level < WAL_LEVEL_REPLICA)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("slipstream requires wal_level replica or logical"),
				 errhint("slipstream keeps the WAL its engine has not yet made durable in a "
						 "replication slot; set wal_level = replica.")));

	define_int("slipstream.segment_size", "Size of every engine device segment.",
			   &ss_segment_size_kb, 2048, 256, 1024 * 1024, GUC_UNIT_KB);
	define_int("slipstream.node_size", "Size of a B+-tree node (at most segment_size / 8).",
			   &ss_node_size_kb, 8, 1, 64, GUC_UNIT_KB);
	define_int("slipstream.l0_size", "Data an L0 memtable holds before it is compacted.",
			   &ss_l0_size_mb, 16, 1, 4096, GUC_UNIT_MB);
	define_int("slipstream.memtables", "Memtable slots in shared memory (each l0_size).",
			   &ss_memtables, 4, 2, 8, 0);
	define_int("slipstream.growth_factor", "Capacity ratio between consecutive levels.",
			   &ss_growth_factor, 8, 2, 64, 0);
	define_int("slipstream.max_levels", "Number of on-device levels.",
			   &ss_max_levels, 7, 1, 12, 0);
	define_int("slipstream.small_threshold",
			   "Rows (key plus value) below this many bytes are small: stored in place.",
			   &ss_small_threshold, 100, 1, 1 << 20, GUC_UNIT_BYTE);
	define_int("slipstream.large_threshold",
			   "Rows from this many bytes on are large: stored in the large log.",
			   &ss_large_threshold, 1000, 2, 1 << 20, GUC_UNIT_BYTE);
	define_int("slipstream.medium_inplace_level",
			   "Level from which medium rows are stored in place (0: the last level).",
			   &ss_medium_inplace_level, 0, 0, 12, 0);
	DefineCustomBoolVariable("slipstream.compress_large", "LZ4-compress large rows.", NULL,
							 &ss_compress_large, true, PGC_POSTMASTER, 0, NULL, NULL, NULL);
	DefineCustomRealVariable("slipstream.gc_threshold",
							 "Garbage fraction at which a large-log segment is collected.",
							 NULL, &ss_gc_threshold, 0.1, 0.01, 0.99, PGC_POSTMASTER, 0, NULL,
							 NULL, NULL);
	define_int("slipstream.bloom_bits_per_key", "Bloom filter bits per key.",
			   &ss_bloom_bits, 10, 0, 32, 0);
	define_int("slipstream.flush_interval", "How often the engine log is written out.",
			   &ss_flush_interval_ms, 10, 1, 10000, GUC_UNIT_MS);
	DefineCustomIntVariable("slipstream.worker_naptime",
							"Idle wait of the background worker between rounds.", NULL,
							&ss_worker_naptime_ms, 100, 1, 10000, PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);
	DefineCustomIntVariable("slipstream.sync_interval",
							"How often the engine is synced and the WAL it no longer needs "
							"is released.",
							"After a crash, WAL written since the last sync is replayed into "
							"the engine, so this bounds replay work, not durability.",
							&ss_sync_interval_ms, 1000, 10, 3600 * 1000, PGC_SIGHUP,
							GUC_UNIT_MS, NULL, NULL, NULL);
	MarkGUCPrefixReserved("slipstream");

	if (ss_small_threshold >= ss_large_threshold)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("slipstream.small_threshold (%d) must be below slipstream.large_threshold (%d)",
						ss_small_threshold, ss_large_threshold)));

	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = request_shmem;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = startup_shmem;
	ss_register_rmgr();
	ss_register_worker();
	RegisterXactCallback(on_xact_end, NULL);
	RegisterSubXactCallback(on_subxact_end, NULL);
}
