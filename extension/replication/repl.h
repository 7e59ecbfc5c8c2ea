/*
 * replication/repl.h: slipstream replication inside PostgreSQL (docs/replication.md).
 *
 * On a primary, the shipper worker (shipper.c) streams the WAL to every configured backup with
 * Tailwind's one-sided writes, and committing backends wait in their commit callback
 * (commit_wait.c) until the WAL of their commit is placed (remote_memory) or durable
 * (remote_flush) on slipstream.min_sync_backups backups. On a backup, the backup worker
 * (backup_worker.c) serves primaries from a bounded pool of buffers, and on a backup that is a
 * standby writes the WAL they ship into its pg_wal for replay. Both are configured by
 * SQL functions (functions.c) whose settings live in shared memory and in the file
 * $PGDATA/slipstream_replication.conf (repl_shmem.c), so they survive restarts.
 */
#ifndef SLIPSTREAM_REPL_H
#define SLIPSTREAM_REPL_H

#include "postgres.h"

#include "access/xlogdefs.h"
#include "datatype/timestamp.h"
#include "port/atomics.h"
#include "storage/lwlock.h"

#include "bridge/repl_bridge.h"

#define SS_MAX_BACKUPS 8
#define SS_MAX_BUFFER_ROWS 64
#define SS_REPL_TEXT 128

/* What a configured backup is doing. */
typedef enum SsBackupState
{
	SS_BACKUP_CONNECTING = 0,	/* not connected yet, or reconnecting */
	SS_BACKUP_STREAMING,		/* WAL is being placed */
	SS_BACKUP_LOST				/* failed for longer than slipstream.backup_timeout */
} SsBackupState;

/* One backup of this primary. */
typedef struct SsBackupSlot
{
	bool		in_use;
	char		name[64];
	char		address[SS_REPL_TEXT];
	char		transport[16];
	char		secret[SS_REPL_TEXT];	/* never shown */
	uint64		version;		/* this primary's version for it (stale rejoins are refused) */
	uint32		generation;		/* bumped by add/drop: the shipper reconnects */
	SsBackupState state;
	XLogRecPtr	start_lsn;		/* where the current connection started shipping */
	XLogRecPtr	sent_lsn;
	XLogRecPtr	placed_lsn;
	XLogRecPtr	durable_lsn;
	TimestampTz last_ok;		/* last time it answered */
	char		error[SS_REPL_ERROR_SIZE];
	/* Index shipping (Send-Index): the backup imports the levels; lz4: segments compressed. */
	bool		send_index;
	bool		lz4;
	bool		awaiting_seed;	/* the shipper skips frames until the next seed's marker */
	uint64		index_sent;		/* index stream position shipped */
	uint64		index_placed;	/* placed on the backup */
	uint64		index_frames;	/* frames shipped since this primary started */
	uint64		index_bytes;	/* their bytes as sent (after LZ4) */
	uint64		index_raw_bytes;	/* their bytes before LZ4 */
	uint64		index_installs;	/* compaction ends shipped */
	uint64		index_seeds;	/* seeds it was sent */
	/*
	 * Its open WAL buffer, when backends may append to it (shm): exported by the shipper after
	 * its appends, extended by committing backends, adopted by the shipper before it ships
	 * again; all under place_lock.
	 */
	SsDirectCursor direct;
	uint64		direct_rounds;	/* placements made by committing backends */
} SsBackupSlot;

/* The backup role of this node. */
typedef struct SsServeConfig
{
	bool		requested;		/* serve_backup() was called (and not stopped) */
	uint32		generation;		/* bumped by serve_backup/stop_serving */
	char		listen[SS_REPL_TEXT];
	char		secret[SS_REPL_TEXT];
	uint32		buffers;
	uint32		buffer_size;
	/* Written by the backup worker. */
	uint32		running_generation;	/* the generation it serves (or failed to) */
	bool		serving;
	char		bound[SS_REPL_TEXT];
	char		error[SS_REPL_ERROR_SIZE];
	int			nrows;
	SsBufferRow rows[SS_MAX_BUFFER_ROWS];
} SsServeConfig;

typedef struct SsReplShared
{
	LWLock	   *lock;			/* backups, serve */
	LWLock	   *place_lock;		/* appends to the backups' open WAL buffers (direct cursors) */
	SsBackupSlot backups[SS_MAX_BACKUPS];
	SsServeConfig serve;
	int			shipper_pgprocno;	/* -1 while no shipper runs */
	int			placing_pgprocno;	/* a backend placing WAL under place_lock (-1: none) */
	int			backup_worker_pgprocno;
	pg_atomic_uint64 placed_lsn;	/* placed on min_sync_backups backups */
	pg_atomic_uint64 durable_lsn;	/* durable on min_sync_backups backups */
	pg_atomic_uint64 flush_wanted;	/* the highest commit waiting in remote_flush mode */
	pg_atomic_uint32 sync_backups;	/* min_sync_backups as the shipper last read it */
	bool		replay_held;	/* the backup worker paused replay (deferred replay) */
	/* Index shipping (index_ship.c). */
	pg_atomic_uint32 index_backups;	/* configured Send-Index backups */
	pg_atomic_uint32 seed_requested;	/* the shipper wants the engine worker to seed */
	pg_atomic_uint64 seeds_shipped;
	pg_atomic_uint64 index_prev_begin;	/* applied horizon at the last installed L0 begin */
	pg_atomic_uint64 index_installed_horizon;	/* the horizon the installed levels cover */
	pg_atomic_uint32 importing;	/* the backup worker imports into the engine */
	pg_atomic_uint64 held_wal_lsn;	/* a standby backup: the end of the WAL it fsynced */
	SsImportStatus import;		/* its progress, for the view (under lock) */
	/* Per PGPROC: the WAL position a committing backend waits for (0: not waiting). */
	pg_atomic_uint64 waiting[FLEXIBLE_ARRAY_MEMBER];
} SsReplShared;

extern SsReplShared *ss_repl;

/* slipstream.commit_mode */
typedef enum SsCommitMode
{
	SS_COMMIT_LOCAL = 0,
	SS_COMMIT_REMOTE_MEMORY,
	SS_COMMIT_REMOTE_FLUSH
} SsCommitMode;
extern int	ss_commit_mode;

/* slipstream.backup_replay */
typedef enum SsBackupReplay
{
	SS_REPLAY_CONTINUOUS = 0,
	SS_REPLAY_DEFERRED
} SsBackupReplay;
extern int	ss_backup_replay;

/* slipstream.backup_engine */
typedef enum SsBackupEngine
{
	SS_BACKUP_ENGINE_REPLAY = 0,
	SS_BACKUP_ENGINE_IMPORT
} SsBackupEngine;
extern int	ss_backup_engine;

/* index_ship.c */
extern void ss_index_define_settings(void);
extern void ss_index_shmem_request(void);
extern void ss_index_shmem_startup(void);
extern void *ss_index_queue(void);
extern void *ss_index_observer(void);
extern void ss_index_seed_if_requested(void);
extern bool ss_engine_imports(void);
extern bool ss_import_advance_slot(XLogRecPtr horizon);
extern void ss_repl_count_index_backups(void);

/* repl_shmem.c */
extern void ss_repl_define_settings(void);
extern void ss_repl_shmem_request(void);
extern void ss_repl_shmem_startup(void);
extern void ss_repl_save_config(void);
extern void ss_repl_wake(int pgprocno);
extern void ss_repl_publish(void);
extern bool ss_repl_someone_waits(void);
extern int	ss_repl_configured_backups(void);
extern const char *ss_backup_state_name(SsBackupState state);

/* catch_up.c: a backup's replay catches up with all of pg_wal before it is promoted */
extern bool ss_catch_up(TimestampTz deadline, XLogRecPtr *end);

/* wal_reader.c: flushed WAL read from pg_wal, by the shipper and by committing backends */
typedef struct SsWalReader
{
	int			fd;				/* the segment file read last (-1: none) */
	XLogSegNo	segno;
	TimeLineID	tli;
	XLogRecPtr	from;			/* the range in the buffer (Invalid: none) */
	Size		len;
	Size		capacity;
	char	   *buffer;
} SsWalReader;
extern bool ss_wal_reader_init(SsWalReader *reader, Size capacity);
extern bool ss_wal_read(SsWalReader *reader, XLogRecPtr from, Size len, TimeLineID tli,
						char *error);
extern Size ss_wal_read_size(const SsWalReader *reader, XLogRecPtr from, XLogRecPtr upto);

/* shipper.c, backup_worker.c */
extern void ss_register_repl_workers(void);
extern const char *ss_repl_primary_name(void);

/* commit_wait.c */
extern void ss_repl_commit_prepare(void);
extern void ss_repl_commit_wait(void);
extern void ss_repl_prepare_wait(void);

#endif							/* SLIPSTREAM_REPL_H */
