/*
 * replication/functions.c: the SQL functions that configure and show replication: on a
 * backup, serve_backup / stop_serving and the backup_buffers view; on a primary, add_backup /
 * drop_backup and the replication view. Configuring needs superuser or slipstream_admin;
 * every argument is checked before anything changes, so an error leaves nothing half done.
 * Secrets are never shown.
 */
#include "slipstream.h"
#include "replication/repl.h"

#include "access/xlog.h"
#include "access/xlogrecovery.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/pg_lsn.h"
#include "utils/timestamp.h"

PG_FUNCTION_INFO_V1(slipstream_serve_backup);
PG_FUNCTION_INFO_V1(slipstream_stop_serving);
PG_FUNCTION_INFO_V1(slipstream_add_backup);
PG_FUNCTION_INFO_V1(slipstream_drop_backup);
PG_FUNCTION_INFO_V1(slipstream_replication_status);
PG_FUNCTION_INFO_V1(slipstream_backup_buffers);
PG_FUNCTION_INFO_V1(slipstream_backup_status);
PG_FUNCTION_INFO_V1(slipstream_promote);
PG_FUNCTION_INFO_V1(slipstream_catch_up);
PG_FUNCTION_INFO_V1(slipstream_index_import_status);


/* Checks "HOST:PORT" (a port from 1 to 65535, port 0 only where `any_port`). */
static void
check_address(const char *address, bool any_port)
{
	const char *colon = strrchr(address, ':');
	char	   *end;
	long		port;

	if (strlen(address) >= SS_REPL_TEXT || colon == NULL || colon == address)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid address \"%s\"", address),
				 errhint("Give HOST:PORT, e.g. '127.0.0.1:7400'.")));
	errno = 0;
	port = strtol(colon + 1, &end, 10);
	if (errno != 0 || *end != '\0' || end == colon + 1 || port < (any_port ? 0 : 1) || port > 65535)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid port in address \"%s\"", address),
				 errhint("The port must be a number from %d to 65535.", any_port ? 0 : 1)));
}

/* Checks a shared secret: not empty, and short enough to keep. */
static void
check_secret(const char *secret)
{
	if (secret[0] == '\0' || strlen(secret) >= SS_REPL_TEXT)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("the secret must be 1 to %d bytes long", SS_REPL_TEXT - 1),
				 errhint("Primary and backup must be given the same secret.")));
}

/* Checks a backup or primary name. */
static void
check_name(const char *name)
{
	if (!ss_repl_valid_name(name))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_NAME),
				 errmsg("invalid backup name \"%s\"", name),
				 errhint("Use 1 to 63 letters, digits, '_', '-' or '.'.")));
}

/*
 * serve_backup(listen, secret, buffers, buffer_size): makes this node a backup and waits until
 * the backup worker serves (returns the address it listens on) or fails (ERROR, and the
 * configuration is left as it was before).
 */
Datum
slipstream_serve_backup(PG_FUNCTION_ARGS)
{
	char	   *listen = ss_text_arg(fcinfo, 0, "listen");
	char	   *secret = ss_text_arg(fcinfo, 1, "secret");
	int32		buffers = PG_ARGISNULL(2) ? 16 : PG_GETARG_INT32(2);
	char	   *size_text = PG_ARGISNULL(3) ? "8MB" : text_to_cstring(PG_GETARG_TEXT_PP(3));
	int64		buffer_size;
	SsServeConfig before;
	uint32		generation;
	char		bound[SS_REPL_TEXT] = "";
	char		error[SS_REPL_ERROR_SIZE] = "";
	bool		ok = false;

	ss_require_admin("configure a backup");
	check_address(listen, true);
	check_secret(secret);
	if (buffers < 1 || buffers > 1024)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("buffers must be from 1 to 1024, not %d", buffers),
				 errhint("Each primary uses up to 4 buffers at once; give a few per primary.")));
	buffer_size = DatumGetInt64(DirectFunctionCall1(pg_size_bytes, CStringGetTextDatum(size_text)));
	if (buffer_size < 64 * 1024 || buffer_size > 1024 * 1024 * 1024 ||
		(buffer_size & (buffer_size - 1)) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("buffer_size must be a power of two from 64kB to 1GB, not %s", size_text),
				 errhint("The default, '8MB', is what Tailwind uses.")));
	if ((int64) buffers * buffer_size > (INT64CONST(16) << 30))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("buffers x buffer_size must be at most 16GB"),
				 errhint("The buffers are memory the backup must be able to flush.")));

	LWLockAcquire(ss_repl->lock, LW_EXCLUSIVE);
	before = ss_repl->serve;
	strlcpy(ss_repl->serve.listen, listen, sizeof(ss_repl->serve.listen));
	strlcpy(ss_repl->serve.secret, secret, sizeof(ss_repl->serve.secret));
	ss_repl->serve.buffers = (uint32) buffers;
	ss_repl->serve.buffer_size = (uint32) buffer_size;
	ss_repl->serve.requested = true;
	generation = ++ss_repl->serve.generation;
	LWLockRelease(ss_repl->lock);
	ss_repl_wake(ss_repl->backup_worker_pgprocno);

	for (int waited = 0; waited < 10000; waited += 10)
	{
		bool		done;

		LWLockAcquire(ss_repl->lock, LW_SHARED);
		done = ss_repl->serve.running_generation == generation;
		ok = ss_repl->serve.serving;
		strlcpy(bound, ss_repl->serve.bound, sizeof(bound));
		strlcpy(error, ss_repl->serve.error, sizeof(error));
		LWLockRelease(ss_repl->lock);
		if (done)
			break;
		strlcpy(error, "the slipstream backup server worker did not answer within 10 s", sizeof(error));
		ok = false;
		CHECK_FOR_INTERRUPTS();
		pg_usleep(10000);
	}
	LWLockAcquire(ss_repl->lock, LW_EXCLUSIVE);
	if (!ok)
	{
		before.generation = ++ss_repl->serve.generation;
		before.running_generation = ss_repl->serve.running_generation;
		ss_repl->serve = before;	/* back to what it was */
	}
	else
		ss_repl_save_config();
	LWLockRelease(ss_repl->lock);
	ss_repl_wake(ss_repl->backup_worker_pgprocno);
	if (!ok)
		ereport(ERROR,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("cannot serve as a backup at %s: %s", listen, error),
				 errhint("Check that the address is free and local to this host.")));
	PG_RETURN_TEXT_P(cstring_to_text(bound));
}

/*
 * Stops this node's serving as a backup (the fence): no primary may write into it afterwards.
 * Returns the new serve generation, and through *was whether it served; the backup worker is
 * woken to close every connection and persist every open buffer.
 */
static uint32
request_stop_serving(bool *was)
{
	uint32		generation;

	LWLockAcquire(ss_repl->lock, LW_EXCLUSIVE);
	*was = ss_repl->serve.requested;
	ss_repl->serve.requested = false;
	generation = ++ss_repl->serve.generation;
	ss_repl_save_config();
	LWLockRelease(ss_repl->lock);
	ss_repl_wake(ss_repl->backup_worker_pgprocno);
	return generation;
}

/* Waits until `deadline` for the backup worker to have stopped serving `generation`. */
static bool
wait_stopped_serving(uint32 generation, TimestampTz deadline)
{
	for (;;)
	{
		bool		done;

		LWLockAcquire(ss_repl->lock, LW_SHARED);
		done = ss_repl->serve.running_generation == generation && !ss_repl->serve.serving;
		LWLockRelease(ss_repl->lock);
		if (done)
			return true;
		if (GetCurrentTimestamp() >= deadline)
			return false;
		CHECK_FOR_INTERRUPTS();
		pg_usleep(10000);
	}
}

/*
 * stop_serving(): this node stops being a backup, and fences its primaries: returns once the
 * backup worker has closed every connection and persisted every open buffer (into pg_wal on a
 * standby), or after 60 s with a warning if no worker answers.
 */
Datum
slipstream_stop_serving(PG_FUNCTION_ARGS)
{
	bool		was;
	uint32		generation;

	ss_require_admin("configure a backup");
	generation = request_stop_serving(&was);
	if (!wait_stopped_serving(generation,
							  TimestampTzPlusMilliseconds(GetCurrentTimestamp(), 60 * 1000)))
		ereport(WARNING,
				(errmsg("the backup worker did not confirm that it stopped serving"),
				 errhint("Check that the slipstream backup worker runs (server log).")));
	PG_RETURN_BOOL(was);
}

/*
 * add_backup(name, address, transport, secret, shipping, lz4): WAL is shipped to it from now
 * on, and with shipping = 'send_index' the levels of every compaction too (the backup imports
 * them, slipstream.backup_engine = import), LZ4-compressed with lz4.
 */
Datum
slipstream_add_backup(PG_FUNCTION_ARGS)
{
	char	   *name = ss_text_arg(fcinfo, 0, "name");
	char	   *address = ss_text_arg(fcinfo, 1, "address");
	char	   *transport = ss_text_arg(fcinfo, 2, "transport");
	char	   *secret = ss_text_arg(fcinfo, 3, "secret");
	char	   *shipping = PG_NARGS() > 4 ? ss_text_arg(fcinfo, 4, "shipping") : "build_index";
	bool		lz4 = PG_NARGS() > 5 && !PG_ARGISNULL(5) && PG_GETARG_BOOL(5);
	bool		send_index;
	int			free_slot = -1;

	ss_require_admin("configure replication");
	check_name(name);
	check_address(address, false);
	if (strcmp(transport, "tcp") != 0 && strcmp(transport, "shm") != 0 &&
		strcmp(transport, "verbs") != 0 && strcmp(transport, "auto") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("unknown transport \"%s\"", transport),
				 errhint("Use 'tcp', 'shm' (same host), 'verbs' (RDMA NICs) or 'auto'.")));
	check_secret(secret);
	if (strcmp(shipping, "send_index") != 0 && strcmp(shipping, "build_index") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("unknown shipping mode \"%s\"", shipping),
				 errhint("Use 'build_index' (the backup builds its levels from the WAL) or "
						 "'send_index' (it imports the primary's; set slipstream.backup_engine "
						 "= import there).")));
	send_index = strcmp(shipping, "send_index") == 0;
	if (lz4 && !send_index)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lz4 compresses shipped index segments, which only send_index ships"),
				 errhint("Pass shipping => 'send_index', or leave lz4 off.")));
	if (RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("backups can only be added on a primary"),
				 errhint("This server is in recovery.")));

	/* The slot's cursor is cleared under the lock its appenders hold (taken first, as they do). */
	LWLockAcquire(ss_repl->place_lock, LW_EXCLUSIVE);
	LWLockAcquire(ss_repl->lock, LW_EXCLUSIVE);
	for (int i = 0; i < SS_MAX_BACKUPS; i++)
	{
		if (ss_repl->backups[i].in_use && strcmp(ss_repl->backups[i].name, name) == 0)
		{
			LWLockRelease(ss_repl->lock);
			LWLockRelease(ss_repl->place_lock);
			ereport(ERROR,
					(errcode(ERRCODE_DUPLICATE_OBJECT),
					 errmsg("backup \"%s\" already exists", name),
					 errhint("Drop it first with slipstream.drop_backup('%s').", name)));
		}
		if (!ss_repl->backups[i].in_use && free_slot < 0)
			free_slot = i;
	}
	if (free_slot < 0)
	{
		LWLockRelease(ss_repl->lock);
		LWLockRelease(ss_repl->place_lock);
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("a primary can have at most %d backups", SS_MAX_BACKUPS),
				 errhint("Drop a backup first.")));
	}
	{
		SsBackupSlot *slot = &ss_repl->backups[free_slot];
		uint32		generation = slot->generation + 1;

		memset(slot, 0, sizeof(*slot));
		strlcpy(slot->name, name, sizeof(slot->name));
		strlcpy(slot->address, address, sizeof(slot->address));
		strlcpy(slot->transport, transport, sizeof(slot->transport));
		strlcpy(slot->secret, secret, sizeof(slot->secret));
		/* Later than any version this primary gave before: a stale rejoin is refused. */
		slot->version = (uint64) GetCurrentTimestamp();
		slot->generation = generation;
		slot->state = SS_BACKUP_CONNECTING;
		slot->send_index = send_index;
		slot->lz4 = lz4;
		slot->in_use = true;
	}
	PG_TRY();
	{
		ss_repl_save_config();
	}
	PG_CATCH();
	{
		ss_repl->backups[free_slot].in_use = false;
		LWLockRelease(ss_repl->lock);
		LWLockRelease(ss_repl->place_lock);
		PG_RE_THROW();
	}
	PG_END_TRY();
	ss_repl_count_index_backups();
	LWLockRelease(ss_repl->lock);
	LWLockRelease(ss_repl->place_lock);
	ss_repl_wake(ss_repl->shipper_pgprocno);
	PG_RETURN_VOID();
}

/* drop_backup(name): WAL is no longer shipped to it, and commits no longer wait for it. */
Datum
slipstream_drop_backup(PG_FUNCTION_ARGS)
{
	char	   *name = ss_text_arg(fcinfo, 0, "name");
	bool		found = false;

	ss_require_admin("configure replication");
	LWLockAcquire(ss_repl->lock, LW_EXCLUSIVE);
	for (int i = 0; i < SS_MAX_BACKUPS; i++)
	{
		if (ss_repl->backups[i].in_use && strcmp(ss_repl->backups[i].name, name) == 0)
		{
			ss_repl->backups[i].in_use = false;
			ss_repl->backups[i].generation++;
			found = true;
		}
	}
	if (found)
	{
		ss_repl_count_index_backups();
		ss_repl_save_config();
	}
	LWLockRelease(ss_repl->lock);
	if (!found)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("backup \"%s\" does not exist", name),
				 errhint("See SELECT name FROM slipstream.replication.")));
	ss_repl_wake(ss_repl->shipper_pgprocno);
	PG_RETURN_VOID();
}

/* One row per configured backup, like pg_stat_replication (no secrets). */
Datum
slipstream_replication_status(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	SsBackupSlot copy[SS_MAX_BACKUPS];
	XLogRecPtr	flush = RecoveryInProgress() ? InvalidXLogRecPtr : GetFlushRecPtr(NULL);

	InitMaterializedSRF(fcinfo, 0);
	LWLockAcquire(ss_repl->lock, LW_SHARED);
	memcpy(copy, ss_repl->backups, sizeof(copy));
	LWLockRelease(ss_repl->lock);
	for (int i = 0; i < SS_MAX_BACKUPS; i++)
	{
		Datum		values[20];
		bool		nulls[20] = {0};
		SsBackupSlot *b = &copy[i];

		if (!b->in_use)
			continue;
		values[0] = CStringGetTextDatum(b->name);
		values[1] = CStringGetTextDatum(b->address);
		values[2] = CStringGetTextDatum(b->transport);
		values[3] = CStringGetTextDatum(ss_backup_state_name(b->state));
		values[4] = LSNGetDatum(b->sent_lsn);
		values[5] = LSNGetDatum(b->placed_lsn);
		values[6] = LSNGetDatum(b->durable_lsn);
		if (flush != InvalidXLogRecPtr && b->placed_lsn != InvalidXLogRecPtr)
			values[7] = Int64GetDatum(flush > b->placed_lsn ? (int64) (flush - b->placed_lsn) : 0);
		else
			nulls[7] = true;
		if (b->last_ok != 0)
			values[8] = TimestampTzGetDatum(b->last_ok);
		else
			nulls[8] = true;
		if (b->error[0] != '\0')
			values[9] = CStringGetTextDatum(b->error);
		else
			nulls[9] = true;
		values[10] = CStringGetTextDatum(b->send_index ? "send_index" : "build_index");
		values[11] = BoolGetDatum(b->lz4);
		values[12] = Int64GetDatum((int64) b->index_sent);
		values[13] = Int64GetDatum((int64) (b->index_sent > b->index_placed ?
											b->index_sent - b->index_placed : 0));
		values[14] = Int64GetDatum((int64) b->index_frames);
		values[15] = Int64GetDatum((int64) b->index_bytes);
		values[16] = Int64GetDatum((int64) b->index_raw_bytes);
		values[17] = Int64GetDatum((int64) b->index_installs);
		values[18] = Int64GetDatum((int64) b->index_seeds);
		values[19] = Int64GetDatum((int64) b->direct_rounds);
		if (!b->send_index)
			for (int c = 12; c <= 18; c++)
				nulls[c] = true;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/* On a backup that imports (backup_engine = import): how far its engine has imported. */
Datum
slipstream_index_import_status(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	SsImportStatus status;
	bool		importing;
	XLogRecPtr	slot = ss_slot_horizon();
	Datum		values[12];
	bool		nulls[12] = {0};

	InitMaterializedSRF(fcinfo, 0);
	if (!ss_engine_imports() || !RecoveryInProgress())
		return (Datum) 0;		/* not a backup that imports (or no longer one: promoted) */
	LWLockAcquire(ss_repl->lock, LW_SHARED);
	status = ss_repl->import;
	LWLockRelease(ss_repl->lock);
	importing = pg_atomic_read_u32(&ss_repl->importing) != 0;
	values[0] = BoolGetDatum(importing);
	values[1] = Int64GetDatum((int64) status.applied_end);
	values[2] = Int64GetDatum((int64) status.installed);
	values[3] = LSNGetDatum(status.horizon);
	nulls[3] = status.horizon == 0;
	values[4] = LSNGetDatum(slot);
	nulls[4] = slot == InvalidXLogRecPtr;
	values[5] = BoolGetDatum(slot != InvalidXLogRecPtr);
	values[6] = Int64GetDatum((int64) status.refused);
	values[7] = BoolGetDatum(status.awaiting_seed);
	values[8] = CStringGetTextDatum(status.error);
	nulls[8] = status.error[0] == '\0';
	values[9] = Int64GetDatum((int64) status.segments);
	values[10] = Int64GetDatum((int64) status.segment_bytes);
	values[11] = Float8GetDatum((double) status.rewrite_nanos / 1e6);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	return (Datum) 0;
}

/*
 * This node as a backup, in one row: whether it serves and where, the WAL it holds (the end
 * of the gap-free WAL it wrote and fsynced into pg_wal: what a promotion replays up to, by
 * which a failover ranks the candidates once they are fenced), how far replay is, and the
 * server's last error.
 */
Datum
slipstream_backup_status(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	bool		serving;
	char		bound[SS_REPL_TEXT];
	char		error[SS_REPL_ERROR_SIZE];
	uint64		held = pg_atomic_read_u64(&ss_repl->held_wal_lsn);
	bool		standby = RecoveryInProgress();
	Datum		values[6];
	bool		nulls[6] = {0};

	InitMaterializedSRF(fcinfo, 0);
	LWLockAcquire(ss_repl->lock, LW_SHARED);
	serving = ss_repl->serve.serving;
	strlcpy(bound, ss_repl->serve.bound, sizeof(bound));
	strlcpy(error, ss_repl->serve.error, sizeof(error));
	LWLockRelease(ss_repl->lock);
	values[0] = BoolGetDatum(serving);
	values[1] = CStringGetTextDatum(bound);
	nulls[1] = !serving || bound[0] == '\0';
	values[2] = BoolGetDatum(standby);
	values[3] = LSNGetDatum(held);
	nulls[3] = held == 0;
	if (standby)
		values[4] = LSNGetDatum(GetXLogReplayRecPtr(NULL));
	nulls[4] = !standby;
	values[5] = CStringGetTextDatum(error);
	nulls[5] = error[0] == '\0';
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	return (Datum) 0;
}

/* On a backup: the buffers primaries hold open, with their valid and durable bytes. */
Datum
slipstream_backup_buffers(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	SsBufferRow rows[SS_MAX_BUFFER_ROWS];
	int			n;

	InitMaterializedSRF(fcinfo, 0);
	LWLockAcquire(ss_repl->lock, LW_SHARED);
	n = ss_repl->serve.nrows;
	memcpy(rows, ss_repl->serve.rows, sizeof(SsBufferRow) * n);
	LWLockRelease(ss_repl->lock);
	for (int i = 0; i < n; i++)
	{
		Datum		values[7];
		bool		nulls[7] = {0};

		values[0] = CStringGetTextDatum(rows[i].primary);
		values[1] = Int32GetDatum((int32) rows[i].buffer);
		values[2] = CStringGetTextDatum(rows[i].stream == 1 ? "wal" :
										rows[i].stream == 2 ? "engine_l0" :
										rows[i].stream == 3 ? "engine_large" : "engine_index");
		values[3] = Int64GetDatum((int64) rows[i].sequence);
		values[4] = LSNGetDatum(rows[i].start);
		values[5] = Int64GetDatum((int64) rows[i].valid);
		values[6] = Int64GetDatum((int64) rows[i].durable);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/* Refuses a wait_seconds argument outside 1 s to a day. */
static void
check_wait_seconds(int wait_seconds, const char *what)
{
	if (wait_seconds <= 0 || wait_seconds > 86400)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("wait_seconds must be between 1 and 86400"),
				 errhint("Give how long to wait for %s, e.g. 60.", what)));
}

/* Refuses to run on a node that is not in recovery; `function` names the caller for the hint. */
static void
require_standby(const char *function)
{
	if (!RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("this node is not a standby"),
				 errhint("%s works on a backup seeded with scripts/seed_backup.sh, or on any "
						 "standby.", function)));
}

/*
 * promote(wait_seconds): takes over on a backup whose primary is dead. Fences the primary
 * first (the backup stops serving: every primary connection is closed and its regions revoked,
 * so a zombie primary cannot write any more, and the valid prefix of every open buffer is
 * written into pg_wal), then lets replay catch up with all of pg_wal (catch_up.c says why a
 * promotion must wait for it), then promotes, all within wait_seconds. The engine goes on as
 * a primary's (docs/replication.md, "Failures"). Returns the WAL position recovery ended at.
 */
Datum
slipstream_promote(PG_FUNCTION_ARGS)
{
	int			wait_seconds = PG_ARGISNULL(0) ? 60 : PG_GETARG_INT32(0);
	TimestampTz deadline;
	uint32		generation;
	bool		promoted;
	bool		served;
	XLogRecPtr	held_end;
	long		left_ms;

	ss_require_admin("promote a backup");
	check_wait_seconds(wait_seconds, "the fencing, the catch-up and the promotion");
	require_standby("slipstream.promote()");
	if (ss_engine_imports() && ss_slot_horizon() == InvalidXLogRecPtr)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("this backup has not yet imported levels that its WAL covers"),
				 errhint("It can take over once it has installed two L0 compactions of its "
						 "primary after it was seeded; see slipstream.index_import.")));
	deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), (int64) wait_seconds * 1000);

	/* 1. Fence: stop serving, and wait until the backup worker has persisted and closed all. */
	generation = request_stop_serving(&served);
	if (!wait_stopped_serving(generation, deadline))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the backup worker did not stop serving within %d seconds",
						wait_seconds),
				 errhint("Check that the slipstream backup worker runs (server log); the "
						 "node was not promoted.")));

	/* 2. Catch up: nothing writes into pg_wal any more; replay reaches its end. */
	if (!ss_catch_up(deadline, &held_end))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("replay reached %X/%X, not the end of the WAL this backup holds at "
						"%X/%X, within %d seconds",
						LSN_FORMAT_ARGS(GetXLogReplayRecPtr(NULL)), LSN_FORMAT_ARGS(held_end),
						wait_seconds),
				 errhint("The node was fenced but not promoted; call slipstream.promote() "
						 "again with a longer wait.")));

	/* 3. Promote: recovery ends at the end of pg_wal. pg_promote waits whole seconds. */
	left_ms = Max(TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline), 1000);
	promoted = DatumGetBool(DirectFunctionCall2(pg_promote, BoolGetDatum(true),
												Int32GetDatum((int32) ((left_ms + 999) / 1000))));
	if (!promoted)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the promotion did not finish within %d seconds", wait_seconds),
				 errhint("It may still finish: check pg_is_in_recovery() and the server log.")));

	/* Replay went no further after the promotion: this is where recovery ended. */
	PG_RETURN_LSN(GetXLogReplayRecPtr(NULL));
}

/*
 * catch_up(wait_seconds): on a standby, lets replay reach the end of the valid WAL in pg_wal
 * as it is now, ending any pause of replay on the way, as a promotion would. Called before a
 * pg_promote() that someone else makes (Patroni's pre_promote hook), so that recovery cannot
 * end short of WAL the node holds (catch_up.c). Returns that end.
 */
Datum
slipstream_catch_up(PG_FUNCTION_ARGS)
{
	int			wait_seconds = PG_ARGISNULL(0) ? 60 : PG_GETARG_INT32(0);
	XLogRecPtr	end;

	ss_require_admin("let a standby catch up");
	check_wait_seconds(wait_seconds, "replay to reach the end of pg_wal");
	require_standby("slipstream.catch_up()");
	if (!ss_catch_up(TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
												 (int64) wait_seconds * 1000), &end))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("replay reached %X/%X, not the end of pg_wal at %X/%X, within %d "
						"seconds",
						LSN_FORMAT_ARGS(GetXLogReplayRecPtr(NULL)), LSN_FORMAT_ARGS(end),
						wait_seconds),
				 errhint("Call it again with a longer wait; the server log tells why replay is "
						 "slow.")));
	PG_RETURN_LSN(end);
}
