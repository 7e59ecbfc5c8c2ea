/*
 * replication/repl_shmem.c: the replication settings, the shared state of replication
 * (repl.h), and the configuration file that keeps backups and the backup role across
 * restarts ($PGDATA/slipstream_replication.conf, mode 0600: it holds the secrets).
 */
#include "slipstream.h"
#include "replication/repl.h"

#include <sys/stat.h>
#include <unistd.h>

#include "access/twophase.h"
#include "miscadmin.h"
#include "storage/fd.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "utils/guc.h"

#define SS_REPL_CONFIG "slipstream_replication.conf"

SsReplShared *ss_repl = NULL;
int			ss_commit_mode = SS_COMMIT_LOCAL;
int			ss_backup_replay = SS_REPLAY_CONTINUOUS;

static const struct config_enum_entry commit_mode_options[] = {
	{"local", SS_COMMIT_LOCAL, false},
	{"remote_memory", SS_COMMIT_REMOTE_MEMORY, false},
	{"remote_flush", SS_COMMIT_REMOTE_FLUSH, false},
	{NULL, 0, false}
};

static const struct config_enum_entry backup_replay_options[] = {
	{"continuous", SS_REPLAY_CONTINUOUS, false},
	{"deferred", SS_REPLAY_DEFERRED, false},
	{NULL, 0, false}
};

/*
 * Defines slipstream.commit_mode and slipstream.backup_replay (enums, which the numeric
 * settings tables cannot hold).
 */
void
ss_repl_define_settings(void)
{
	DefineCustomEnumVariable("slipstream.commit_mode",
							 "When a commit returns: after a local flush, or once its WAL is "
							 "placed in (remote_memory) or durable on (remote_flush) backups.",
							 "In the remote modes every commit that wrote WAL waits for "
							 "slipstream.min_sync_backups backups.",
							 &ss_commit_mode, SS_COMMIT_LOCAL, commit_mode_options,
							 PGC_USERSET, 0, NULL, NULL, NULL);
	DefineCustomEnumVariable("slipstream.backup_replay",
							 "Whether a backup that is a standby replays the WAL it receives as "
							 "it arrives (continuous) or in batches (deferred).",
							 "deferred keeps a backup passive, as Tailwind's are: its startup "
							 "process replays only once slipstream.backup_replay_lag of WAL is "
							 "unreplayed, and at a takeover.",
							 &ss_backup_replay, SS_REPLAY_CONTINUOUS, backup_replay_options,
							 PGC_SIGHUP, 0, NULL, NULL, NULL);
	ss_index_define_settings();
}

/* Bytes of the shared state: the fixed part and one wait slot per PGPROC. */
static Size
repl_shared_size(void)
{
	int			procs = MaxBackends + NUM_AUXILIARY_PROCS + max_prepared_xacts;

	return add_size(offsetof(SsReplShared, waiting), mul_size(procs, sizeof(pg_atomic_uint64)));
}

/* shmem_request_hook: our state and its lock. */
void
ss_repl_shmem_request(void)
{
	RequestAddinShmemSpace(repl_shared_size());
	RequestNamedLWLockTranche("slipstream replication", 2);
	ss_index_shmem_request();
}

/* Hex of a secret (the file stays one token per field whatever the secret holds). */
static void
to_hex(const char *in, char *out, size_t out_size)
{
	size_t		n = 0;

	for (; *in && n + 3 <= out_size; in++, n += 2)
		snprintf(out + n, 3, "%02x", (unsigned char) *in);
	out[n] = '\0';
}

/* The secret a hex token holds (false if it is not hex). */
static bool
from_hex(const char *in, char *out, size_t out_size)
{
	size_t		len = strlen(in);

	if (len % 2 != 0 || len / 2 >= out_size)
		return false;
	for (size_t i = 0; i < len / 2; i++)
	{
		unsigned int byte;

		if (sscanf(in + 2 * i, "%2x", &byte) != 1)
			return false;
		out[i] = (char) byte;
	}
	out[len / 2] = '\0';
	return true;
}

/* Reads the configuration file into fresh shared state (postmaster, at startup). */
static void
load_config(void)
{
	FILE	   *f = fopen(SS_REPL_CONFIG, "r");
	char		line[1024];
	int			next = 0;

	if (f == NULL)
		return;
	while (fgets(line, sizeof(line), f) != NULL)
	{
		char		kind[16], a[SS_REPL_TEXT], b[SS_REPL_TEXT], c[SS_REPL_TEXT], secret[2 * SS_REPL_TEXT + 1];
		char		shipping[16] = "build_index", compression[16] = "plain";
		unsigned long long d;

		if (sscanf(line, "%15s", kind) != 1)
			continue;
		if (strcmp(kind, "backup") == 0 && next < SS_MAX_BACKUPS &&
			sscanf(line, "%*s %127s %127s %127s %llu %256s %15s %15s", a, b, c, &d, secret,
				   shipping, compression) >= 5)
		{
			SsBackupSlot *slot = &ss_repl->backups[next];

			if (!from_hex(secret, slot->secret, sizeof(slot->secret)))
				continue;
			strlcpy(slot->name, a, sizeof(slot->name));
			strlcpy(slot->address, b, sizeof(slot->address));
			strlcpy(slot->transport, c, sizeof(slot->transport));
			slot->version = d;
			slot->send_index = strcmp(shipping, "send_index") == 0;
			slot->lz4 = strcmp(compression, "lz4") == 0;
			slot->in_use = true;
			next++;
		}
		else if (strcmp(kind, "serve") == 0 &&
				 sscanf(line, "%*s %127s %127s %127s %256s", a, b, c, secret) == 4)
		{
			SsServeConfig *serve = &ss_repl->serve;

			if (!from_hex(secret, serve->secret, sizeof(serve->secret)))
				continue;
			strlcpy(serve->listen, a, sizeof(serve->listen));
			serve->buffers = (uint32) strtoul(b, NULL, 10);
			serve->buffer_size = (uint32) strtoul(c, NULL, 10);
			serve->requested = true;
			serve->generation = 1;
		}
	}
	fclose(f);
}

/* Writes the configuration durably (temporary file, fsync, rename); the caller holds the lock. */
void
ss_repl_save_config(void)
{
	char		tmp[MAXPGPATH];
	char		hex[2 * SS_REPL_TEXT + 1];
	FILE	   *f;

	snprintf(tmp, sizeof(tmp), "%s.tmp", SS_REPL_CONFIG);
	f = AllocateFile(tmp, "w");
	if (f == NULL)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("could not write \"%s\": %m", tmp)));
	(void) fchmod(fileno(f), S_IRUSR | S_IWUSR);
	fprintf(f, "# slipstream replication settings (written by add_backup, serve_backup, ...)\n");
	for (int i = 0; i < SS_MAX_BACKUPS; i++)
	{
		SsBackupSlot *slot = &ss_repl->backups[i];

		if (!slot->in_use)
			continue;
		to_hex(slot->secret, hex, sizeof(hex));
		fprintf(f, "backup %s %s %s %llu %s %s %s\n", slot->name, slot->address,
				slot->transport, (unsigned long long) slot->version, hex,
				slot->send_index ? "send_index" : "build_index", slot->lz4 ? "lz4" : "plain");
	}
	if (ss_repl->serve.requested)
	{
		to_hex(ss_repl->serve.secret, hex, sizeof(hex));
		fprintf(f, "serve %s %u %u %s\n", ss_repl->serve.listen, ss_repl->serve.buffers,
				ss_repl->serve.buffer_size, hex);
	}
	if (fflush(f) != 0 || pg_fsync(fileno(f)) != 0)
	{
		FreeFile(f);
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("could not write \"%s\": %m", tmp)));
	}
	FreeFile(f);
	(void) durable_rename(tmp, SS_REPL_CONFIG, ERROR);
}

/* shmem_startup_hook: creates the state (loading the configuration) or attaches to it. */
void
ss_repl_shmem_startup(void)
{
	bool		found;
	int			procs = MaxBackends + NUM_AUXILIARY_PROCS + max_prepared_xacts;

	ss_repl = ShmemInitStruct("slipstream replication", repl_shared_size(), &found);
	if (!found)
	{
		memset(ss_repl, 0, repl_shared_size());
		ss_repl->lock = &(GetNamedLWLockTranche("slipstream replication"))[0].lock;
		ss_repl->place_lock = &(GetNamedLWLockTranche("slipstream replication"))[1].lock;
		ss_repl->shipper_pgprocno = -1;
		ss_repl->placing_pgprocno = -1;
		ss_repl->backup_worker_pgprocno = -1;
		pg_atomic_init_u64(&ss_repl->placed_lsn, 0);
		pg_atomic_init_u64(&ss_repl->durable_lsn, 0);
		pg_atomic_init_u64(&ss_repl->flush_wanted, 0);
		pg_atomic_init_u32(&ss_repl->sync_backups, ss_min_sync_backups);
		for (int i = 0; i < procs; i++)
			pg_atomic_init_u64(&ss_repl->waiting[i], 0);
		pg_atomic_init_u32(&ss_repl->index_backups, 0);
		pg_atomic_init_u32(&ss_repl->seed_requested, 0);
		pg_atomic_init_u64(&ss_repl->seeds_shipped, 0);
		pg_atomic_init_u64(&ss_repl->index_prev_begin, 0);
		pg_atomic_init_u64(&ss_repl->index_installed_horizon, 0);
		pg_atomic_init_u32(&ss_repl->importing, 0);
		pg_atomic_init_u64(&ss_repl->held_wal_lsn, 0);
		load_config();
		ss_repl_count_index_backups();
	}
	ss_index_shmem_startup();
}

/* Sets the latch of the process with this PGPROC number (-1: nobody). */
void
ss_repl_wake(int pgprocno)
{
	if (pgprocno >= 0)
		SetLatch(&ProcGlobal->allProcs[pgprocno].procLatch);
}

/*
 * The k-th highest value among streaming backups; 0 if fewer. k is min_sync_backups as the
 * shipper last read it, the same for every process that publishes: a backend that has not
 * yet reloaded a raised setting must not publish with the old one.
 */
static XLogRecPtr
kth_highest(bool durable)
{
	XLogRecPtr	values[SS_MAX_BACKUPS];
	int			n = 0;
	int			k = (int) pg_atomic_read_u32(&ss_repl->sync_backups);

	for (int i = 0; i < SS_MAX_BACKUPS; i++)
	{
		SsBackupSlot *slot = &ss_repl->backups[i];

		if (slot->in_use && slot->state == SS_BACKUP_STREAMING)
			values[n++] = durable ? slot->durable_lsn : slot->placed_lsn;
	}
	if (k <= 0 || n < k)
		return InvalidXLogRecPtr;
	/* A small insertion sort, highest first. */
	for (int a = 1; a < n; a++)
		for (int b = a; b > 0 && values[b] > values[b - 1]; b--)
		{
			XLogRecPtr	t = values[b];

			values[b] = values[b - 1];
			values[b - 1] = t;
		}
	return values[k - 1];
}

/* Raises *position to `value` unless it is there already (the shipper and backends publish). */
static void
advance_to(pg_atomic_uint64 *position, uint64 value)
{
	uint64		seen = pg_atomic_read_u64(position);

	while (seen < value && !pg_atomic_compare_exchange_u64(position, &seen, value))
		;
}

/*
 * Publishes the positions reached on slipstream.min_sync_backups backups and wakes every
 * backend whose wait is over (called by the shipper after a round and by a backend that placed
 * its own commit).
 */
void
ss_repl_publish(void)
{
	XLogRecPtr	placed, durable;
	int			procs = MaxBackends + NUM_AUXILIARY_PROCS + max_prepared_xacts;

	LWLockAcquire(ss_repl->lock, LW_SHARED);
	placed = kth_highest(false);
	durable = kth_highest(true);
	LWLockRelease(ss_repl->lock);
	advance_to(&ss_repl->placed_lsn, placed);
	advance_to(&ss_repl->durable_lsn, durable);
	for (int p = 0; p < procs; p++)
	{
		uint64		wait = pg_atomic_read_u64(&ss_repl->waiting[p]);

		if (wait != 0 && (wait <= placed || wait <= durable) && p != MyProc->pgprocno)
			ss_repl_wake(p);
	}
}

/* Whether some backend waits for its commit's placement or durability. */
bool
ss_repl_someone_waits(void)
{
	int			procs = MaxBackends + NUM_AUXILIARY_PROCS + max_prepared_xacts;

	for (int p = 0; p < procs; p++)
		if (pg_atomic_read_u64(&ss_repl->waiting[p]) != 0)
			return true;
	return false;
}

/* Publishes how many configured backups take the index stream (the observers look at it). */
void
ss_repl_count_index_backups(void)
{
	uint32		n = 0;

	for (int i = 0; i < SS_MAX_BACKUPS; i++)
		n += (ss_repl->backups[i].in_use && ss_repl->backups[i].send_index) ? 1 : 0;
	pg_atomic_write_u32(&ss_repl->index_backups, n);
}

/* Backups configured now. */
int
ss_repl_configured_backups(void)
{
	int			n = 0;

	for (int i = 0; i < SS_MAX_BACKUPS; i++)
		n += ss_repl->backups[i].in_use ? 1 : 0;
	return n;
}

const char *
ss_backup_state_name(SsBackupState state)
{
	switch (state)
	{
		case SS_BACKUP_CONNECTING:
			return "connecting";
		case SS_BACKUP_STREAMING:
			return "streaming";
		case SS_BACKUP_LOST:
			return "lost";
	}
	return "unknown";
}
