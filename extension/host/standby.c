/*
 * host/standby.c: the engine on a standby, a node in archive recovery (a Tailwind backup, or a
 * streaming replica of PostgreSQL's own replication), kept current by the startup process.
 *
 * On a primary the startup process leaves the engine alone and the worker replays our records
 * after recovery (startup.c). On a standby, recovery never ends until promotion, so the startup
 * process applies each of our records to the engine as it replays it (rm_redo), and the worker
 * makes the engine durable and keeps the slot "slipstream" at the replay position it synced
 * (horizon.c), holding exactly the WAL a restart needs. So the standby's engine is always a
 * crash-consistent copy of the primary's: hot-standby queries read slipstream tables, and a
 * promotion is the crash recovery the primary would run (docs/replication.md).
 *
 * At each start, before the first record is replayed (rm_startup):
 *   1. a freshly seeded standby loads the seed (a consistent dump of the primary's engine
 *      taken by slipstream.seed_snapshot(), placed by scripts/seed_backup.sh) into its empty
 *      engine and creates the slot at the seed's horizon;
 *   2. our records from the slot's horizon up to where PostgreSQL's redo begins are applied
 *      (they were replayed before a restart but perhaps not made durable in the engine);
 *   3. the gate opens: hot-standby backends may read.
 * Records below the horizon are skipped by rm_redo: the engine holds them already.
 *
 * A failure here never stops the standby (heap tables and catalogs replay on): it is recorded,
 * slipstream tables report it with a hint, and our records are no longer applied.
 */
#include "slipstream.h"
#include "host/wal_records.h"
#include "replication/repl.h"

#include <sys/stat.h>
#include <unistd.h>

#include "access/xlog.h"
#include "access/xlog_internal.h"
#include "access/xlogrecovery.h"
#include "access/xlogreader.h"
#include "miscadmin.h"
#include "port/pg_bswap.h"
#include "postmaster/startup.h"
#include "storage/fd.h"
#include "utils/memutils.h"

/* Whether this (startup) process applies our records; set by rm_startup. */
static bool applying = false;

/* Records starting below this are already in the engine (the slot's horizon). */
static XLogRecPtr skip_below = InvalidXLogRecPtr;

/* Path of the seed that scripts/seed_backup.sh leaves for the first start of a standby. */
static void
seed_path(char *path, size_t size)
{
	snprintf(path, size, "%s/%s", DataDir, SS_SEED_FILE);
}

/* Path of the file that remembers where the loaded seed's dump ended (see ss_sweep_allowed). */
static void
seed_end_path(char *path, size_t size)
{
	snprintf(path, size, "%s/slipstream/seed_end", DataDir);
}

/* Marks the engine unusable on this standby, with the reason, and stops applying. */
static void
fail_standby(const char *message)
{
	applying = false;
	strlcpy(ss_shared->replay_error, message, sizeof(ss_shared->replay_error));
	pg_atomic_write_u32(&ss_shared->standby, 2);
	pg_atomic_write_u32(&ss_shared->replay_state, SS_REPLAY_FAILED);
	ConditionVariableBroadcast(&ss_shared->replay_cv);
	ereport(WARNING,
			(errmsg("slipstream: the engine on this standby is no longer kept current: %s",
					message),
			 errhint("Heap tables replay on; slipstream tables report this error. Seed the "
					 "standby again with scripts/seed_backup.sh.")));
}

/* Reads exactly `n` bytes of the seed, or fails with a clear error. */
static void
seed_read(FILE *f, void *buf, size_t n, const char *what)
{
	if (fread(buf, 1, n, f) != n)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("slipstream: the seed \"%s\" ends inside %s", SS_SEED_FILE, what),
				 errhint("The seed was cut short; run scripts/seed_backup.sh again.")));
}

/* Reads a big-endian 32-bit integer of the seed (COPY BINARY's integer format). */
static int32
seed_int32(FILE *f, const char *what)
{
	uint32		v;

	seed_read(f, &v, sizeof(v), what);
	return (int32) pg_ntoh32(v);
}

/* Reads one bytea or bigint field of a seed row into `buf` (grown as needed); returns its length. */
static int32
seed_field(FILE *f, char **buf, int32 *cap)
{
	int32		len = seed_int32(f, "a field length");

	if (len < 0 || len > MaxAllocSize)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("slipstream: the seed has a field of length %d", len)));
	if (len > *cap)
	{
		*buf = repalloc(*buf, len);
		*cap = len;
	}
	seed_read(f, *buf, len, "a field");
	return len;
}

/* Writes a batch of seed rows and starts a new one. */
static SsBatch *
flush_seed_batch(SsBatch *batch)
{
	SsCode		code = ss_batch_write(batch);

	ss_batch_free(batch);
	if (code != SS_OK)
		ss_report(code, "loading the seed");
	batch = ss_batch_new();
	if (batch == NULL)
		ss_report(SS_NO_MEMORY, "loading the seed");
	return batch;
}

/*
 * Loads the seed (COPY BINARY rows of (tag, key, value); the last row has tag 0 and carries
 * the dump's horizon and end) into the engine, makes it durable, and creates the slot at the
 * horizon. Returns the horizon.
 */
static XLogRecPtr
load_seed(const char *path)
{
	static const char signature[11] = "PGCOPY\n\377\r\n\0";
	char		head[11];
	FILE	   *f;
	char	   *buf = palloc(8192);
	int32		cap = 8192;
	char	   *key = palloc(SS_KEY_SIZE);
	SsBatch    *batch;
	size_t		batch_bytes = 0;
	uint64		rows = 0;
	uint64		cached_tag = 0;
	uint32		cached_keyspace = 0;
	XLogRecPtr	horizon = InvalidXLogRecPtr;
	XLogRecPtr	dump_end = InvalidXLogRecPtr;
	bool		trailer = false;
	char		end_path[MAXPGPATH];
	FILE	   *ef;

	f = AllocateFile(path, "rb");
	if (f == NULL)
		ereport(ERROR, (errcode_for_file_access(), errmsg("could not open \"%s\": %m", path)));
	seed_read(f, head, sizeof(head), "the header");
	if (memcmp(head, signature, sizeof(head)) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("slipstream: \"%s\" is not a COPY BINARY file", SS_SEED_FILE)));
	(void) seed_int32(f, "the header flags");
	for (int32 ext = seed_int32(f, "the header extension"); ext > 0; ext--)
		(void) fgetc(f);
	batch = ss_batch_new();
	if (batch == NULL)
		ss_report(SS_NO_MEMORY, "loading the seed");
	for (;;)
	{
		uint16		nfields_be;
		int16		nfields;
		uint64		tag_be;
		uint64		tag;
		int32		len;

		seed_read(f, &nfields_be, sizeof(nfields_be), "a row");
		nfields = (int16) pg_ntoh16(nfields_be);
		if (nfields == -1)
			break;
		if (nfields != 3 || trailer)
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("slipstream: the seed has a malformed row after %llu rows",
							(unsigned long long) rows)));
		if (seed_int32(f, "a tag") != sizeof(tag_be))
			ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED),
							errmsg("slipstream: the seed has a malformed tag")));
		seed_read(f, &tag_be, sizeof(tag_be), "a tag");
		tag = pg_ntoh64(tag_be);
		len = seed_field(f, &buf, &cap);
		if (tag == 0)
		{
			uint64		v[2];

			if (len != strlen(SS_SEED_TRAILER) || memcmp(buf, SS_SEED_TRAILER, len) != 0 ||
				seed_field(f, &buf, &cap) != sizeof(v))
				ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED),
								errmsg("slipstream: the seed's last row is malformed")));
			memcpy(v, buf, sizeof(v));
			horizon = pg_ntoh64(v[0]);
			dump_end = pg_ntoh64(v[1]);
			trailer = true;
			continue;
		}
		if (len != SS_KEY_SIZE)
			ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED),
							errmsg("slipstream: the seed has a key of %d bytes", len)));
		memcpy(key, buf, SS_KEY_SIZE);
		if (tag != cached_tag)
		{
			batch = flush_seed_batch(batch);
			batch_bytes = 0;
			cached_keyspace = ss_keyspace_for_tag(tag, true);
			cached_tag = tag;
		}
		len = seed_field(f, &buf, &cap);
		ss_batch_put(batch, cached_keyspace, key, SS_KEY_SIZE, buf, len);
		batch_bytes += len + SS_KEY_SIZE + 32;
		rows++;
		if (batch_bytes >= SS_SEED_BATCH_BYTES)
		{
			batch = flush_seed_batch(batch);
			batch_bytes = 0;
		}
		if (rows % 10000 == 0)
			CHECK_FOR_INTERRUPTS();
	}
	FreeFile(f);
	if (!trailer)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("slipstream: the seed \"%s\" has no trailer", SS_SEED_FILE),
				 errhint("The dump was cut short; run scripts/seed_backup.sh again.")));
	batch = flush_seed_batch(batch);
	ss_batch_free(batch);
	SS_CHECK(ss_sync_all(), "syncing the seeded engine");

	/* Where the dump ended, for the sweep; then the slot; the seed goes last. */
	seed_end_path(end_path, sizeof(end_path));
	ef = AllocateFile(end_path, "w");
	if (ef == NULL || fprintf(ef, "%X/%X\n", LSN_FORMAT_ARGS(dump_end)) < 0 ||
		pg_fsync(fileno(ef)) != 0 || FreeFile(ef) != 0)
		ereport(ERROR, (errcode_for_file_access(),
						errmsg("could not write \"%s\": %m", end_path)));
	ss_create_slot_at(horizon);
	durable_unlink(path, ERROR);
	ereport(LOG, (errmsg("slipstream: loaded the seed: " UINT64_FORMAT " rows, WAL horizon "
						 "%X/%X", rows, LSN_FORMAT_ARGS(horizon))));
	pfree(buf);
	pfree(key);
	return horizon;
}

/* rm_startup's work, may raise errors (see ss_standby_startup). */
static void
start_applying(void)
{
	char		path[MAXPGPATH];
	struct stat st;
	XLogRecPtr	horizon;
	XLogRecPtr	redo_start = GetXLogReplayRecPtr(NULL);
	uint64		caught_up = 0;

	if (ss_engine_imports())
	{
		/*
		 * The levels arrive by import (the backup worker), and L0 is rebuilt from the WAL at
		 * promotion: nothing to apply here, and nothing to read until then.
		 */
		ss_engine_attach();
		pg_atomic_write_u32(&ss_shared->standby, 3);
		ereport(LOG, (errmsg("slipstream: this standby imports its engine's levels from its "
							 "primary (slipstream.backup_engine = import)")));
		return;
	}
	seed_path(path, sizeof(path));
	if (stat(path, &st) != 0 && ss_slot_horizon() == InvalidXLogRecPtr)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("this standby's slipstream engine was not seeded"),
				 errdetail("A copy of the engine's files taken while the primary ran is not "
						   "consistent, and neither a seed nor the engine's slot was found.")));
	pg_atomic_write_u32(&ss_shared->replay_state, SS_REPLAY_RUNNING);
	ss_engine_attach();

	/* 1. A fresh seed. */
	if (stat(path, &st) == 0)
		horizon = load_seed(path);
	else
		horizon = ss_slot_horizon();

	/* 2. What was replayed before a restart but perhaps not made durable in the engine. */
	if (horizon < redo_start)
		caught_up = ss_replay_wal(horizon, redo_start);
	pg_atomic_write_u64(&ss_shared->durable_horizon, horizon);
	skip_below = Max(horizon, redo_start);
	if (caught_up > 0)
		ereport(LOG, (errmsg("slipstream: applied " UINT64_FORMAT " WAL records from %X/%X to "
							 "%X/%X before redo", caught_up, LSN_FORMAT_ARGS(horizon),
							 LSN_FORMAT_ARGS(redo_start))));

	/* 3. The gate opens; the worker keeps the engine durable from now on. */
	applying = true;
	pg_atomic_write_u32(&ss_shared->standby, 1);
	pg_atomic_write_u32(&ss_shared->replay_state, SS_REPLAY_READY);
	ConditionVariableBroadcast(&ss_shared->replay_cv);
	ereport(LOG, (errmsg("slipstream: applying WAL to the engine on this standby from %X/%X",
						 LSN_FORMAT_ARGS(skip_below))));
}

/*
 * Runs `body` once in the startup process; returns 0 when it succeeded, else the error's code
 * (its message in `message`). The startup process has no transaction to abort: locks are
 * released here.
 */
static int
run_once(void (*body) (XLogReaderState *), XLogReaderState *record, char *message, size_t size)
{
	MemoryContext context = CurrentMemoryContext;
	volatile int code = 0;

	PG_TRY();
	{
		body(record);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(context);
		edata = CopyErrorData();
		FlushErrorState();
		LWLockReleaseAll();
		ConditionVariableCancelSleep();
		code = edata->sqlerrcode != 0 ? edata->sqlerrcode : ERRCODE_INTERNAL_ERROR;
		strlcpy(message, edata->message, size);
		FreeErrorData(edata);
	}
	PG_END_TRY();
	return code;
}

/*
 * Runs `body` in the startup process. An engine that is busy (hot-standby queries hold the
 * memory a write needs: SS_BUSY) is waited for, as replay waits for conflicting queries; any
 * other error marks the standby's engine failed instead of ending recovery.
 */
static void
guarded(void (*body) (XLogReaderState *), XLogReaderState *record)
{
	char		message[256];
	bool		warned = false;
	int			code;

	while ((code = run_once(body, record, message, sizeof(message))) == ERRCODE_OBJECT_IN_USE)
	{
		if (!warned)
			ereport(WARNING,
					(errmsg("slipstream: replay waits for hot-standby queries that hold engine "
							"memory: %s", message),
					 errhint("Long-running queries or open cursors on slipstream tables delay "
							 "replay on this standby until they finish.")));
		warned = true;
		HandleStartupProcInterrupts();
		pg_usleep(100000L);
	}
	if (code != 0)
		fail_standby(message);
}

/* rm_startup's body, in the shape guarded() takes. */
static void
startup_body(XLogReaderState *unused)
{
	start_applying();
}

/* rm_redo's body: one of our records, applied unless the engine holds it already. */
static void
redo_body(XLogReaderState *record)
{
	if (record->ReadRecPtr < skip_below)
		return;
	ss_apply_record(record);
}

/* rm_startup: on a standby, prepares the engine for applying records (see the top). */
void
ss_standby_startup(void)
{
	if (!ArchiveRecoveryRequested)
		return;					/* crash recovery: the worker replays after it (startup.c) */
	guarded(startup_body, NULL);
}

/* rm_redo: on a standby, applies one of our records to the engine. */
void
ss_standby_redo(XLogReaderState *record)
{
	uint8		info = XLogRecGetInfo(record) & ~XLR_INFO_MASK;

	/* Visibility map changes are PostgreSQL pages: redone here, in crash recovery too. */
	if (info == SS_XLOG_VM_SET || info == SS_XLOG_VM_CLEAR)
	{
		ss_vm_redo(record);
		return;
	}
	if (!applying)
		return;
	guarded(redo_body, record);
}

/* rm_cleanup: recovery ends (a promotion): the worker takes the engine over as a primary's. */
void
ss_standby_cleanup(void)
{
	applying = false;
}

/*
 * Whether the worker may drop keyspaces whose relation file is missing: on a standby only once
 * replay has passed the end of the seed's dump, since a table in the dump may have been created
 * after the base backup and have its file created by replay later.
 */
bool
ss_sweep_allowed(void)
{
	char		path[MAXPGPATH];
	FILE	   *f;
	uint32		hi,
				lo;
	bool		allowed = true;

	if (!RecoveryInProgress())
		return true;
	seed_end_path(path, sizeof(path));
	f = AllocateFile(path, "r");
	if (f == NULL)
		return true;
	if (fscanf(f, "%X/%X", &hi, &lo) != 2 ||
		GetXLogReplayRecPtr(NULL) < (((uint64) hi) << 32 | lo))
		allowed = false;
	FreeFile(f);
	return allowed;
}
