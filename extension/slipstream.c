/*
 * slipstream.c: module entry point: settings (GUCs, admin/settings.c), shared-memory hooks
 * (host/), the resource manager (host/wal.c), the background worker (host/worker.c), and
 * per-transaction cleanup. The table access method itself is in tableam/.
 */
#include "slipstream.h"
#include "replication/repl.h"
#include "shuffle/shuffle.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "miscadmin.h"
#include "replication/slot.h"
#include "storage/ipc.h"
#include "storage/proc.h"

PG_MODULE_MAGIC;

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
	ss_repl_shmem_request();
	ss_shuffle_shmem_request();
}

/* shmem_startup_hook: create or attach our shared structures. */
static void
startup_shmem(void)
{
	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	ss_shmem_startup();
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	ss_repl_shmem_startup();
	ss_shuffle_shmem_startup();
	LWLockRelease(AddinShmemInitLock);
}

/*
 * A change interrupted by an error is no longer in flight (the horizon must not stick); a
 * commit or a PREPARE TRANSACTION waits for the backups in the remote commit modes
 * (replication/commit_wait.c).
 */
static void
on_xact_end(XactEvent event, void *arg)
{
	if ((event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT) && ss_shared != NULL &&
		MyProc != NULL)
		ss_change_done();
	if (event == XACT_EVENT_PRE_COMMIT)
		ss_repl_commit_prepare();
	if (event == XACT_EVENT_COMMIT)
		ss_repl_commit_wait();
	if (event == XACT_EVENT_PREPARE)
		ss_repl_prepare_wait();
}

/* Same for subtransactions rolled back by an error. */
static void
on_subxact_end(SubXactEvent event, SubTransactionId sub, SubTransactionId parent, void *arg)
{
	if (event == SUBXACT_EVENT_ABORT_SUB && ss_shared != NULL && MyProc != NULL)
		ss_change_done();
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

	ss_define_settings();

	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = request_shmem;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = startup_shmem;
	ss_register_rmgr();
	ss_register_worker();
	ss_register_repl_workers();
	ss_install_planner_hook();
	ss_install_prefetch_hook();
	RegisterXactCallback(on_xact_end, NULL);
	RegisterSubXactCallback(on_subxact_end, NULL);
}
