/*
 * repl_bridge.h: the C interface between the PostgreSQL glue and the replication library
 * (replication/). Like bridge.h: no PostgreSQL headers behind it, every call catches C++
 * exceptions and returns a code, and failure messages go into a caller's buffer.
 */
/* clang-format off */
#ifndef SLIPSTREAM_REPL_BRIDGE_H
#define SLIPSTREAM_REPL_BRIDGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SS_REPL_ERROR_SIZE 256

/* ---- backup side ---- */

typedef struct SsBackupServer SsBackupServer;

typedef struct SsBufferRow
{
	char		primary[64];
	uint32_t	buffer;
	uint32_t	stream;
	uint64_t	sequence;
	uint64_t	start;
	uint32_t	valid;
	uint32_t	durable;
} SsBufferRow;

/* How a backup serves. */
typedef struct SsBackupServerOptions
{
	const char *listen;			/* "HOST:PORT" */
	const char *secret;
	uint32_t	buffers;
	uint32_t	buffer_size;
	const char *directory;		/* where buffer images are kept */
	uint64_t	system_id;		/* serve only primaries of this cluster (0: any) */
	/*
	 * A backup that is a standby: the WAL received is also written into its pg_wal (NULL: the
	 * images only, for a node that is not in recovery).
	 */
	const char *wal_directory;
	uint32_t	timeline;		/* the timeline it replays (names the WAL files) */
	uint64_t	wal_segment_size;
	uint64_t	resume_lsn;		/* where its own WAL ends now (its replay position) */
	/*
	 * A standby that imports its engine's levels (slipstream.backup_engine = import): the index
	 * stream of the primary is applied to this process's engine as it arrives.
	 */
	bool		import_index;
} SsBackupServerOptions;

/* What a backup that imports has applied of its primary's index stream. */
typedef struct SsImportStatus
{
	uint64_t	applied_end;	/* stream position applied up to */
	uint64_t	installed;		/* compactions installed since the server started */
	uint64_t	horizon;		/* WAL below which the installed levels hold every change */
	uint64_t	refused;		/* frames refused since the server started */
	bool		awaiting_seed;	/* after a refused frame: until the primary's next seed */
	uint64_t	segments;		/* segments imported since the server started */
	uint64_t	segment_bytes;	/* their bytes, uncompressed */
	uint64_t	rewrite_nanos;	/* time spent rewriting and writing them */
	char		error[SS_REPL_ERROR_SIZE];	/* the last refusal ("" if none) */
} SsImportStatus;

/* Starts serving primaries; *bound gets the address actually listened on. */
extern bool ss_backup_server_start(const SsBackupServerOptions *options, SsBackupServer **server,
								   char *bound, size_t bound_size, char *error);
/*
 * Stops (persisting every open buffer) and frees; returns the end of the gap-free WAL then
 * fsynced in pg_wal (0: the server did not write into pg_wal, or could not tell).
 */
extern uint64_t ss_backup_server_stop(SsBackupServer *server);
/* Fills up to `max` rows with the open buffers; returns how many. */
extern int	ss_backup_server_buffers(SsBackupServer *server, SsBufferRow *rows, int max);
/* The import's progress (false: this server does not import). */
extern bool ss_backup_server_import_status(SsBackupServer *server, SsImportStatus *status);

/* Fences a primary (its keys revoked, its open buffers persisted). */
extern bool ss_backup_server_fence(SsBackupServer *server, const char *primary, char *error);
/* Copies the newest session error (if any) into `error`; false if there is none. */
extern bool ss_backup_server_last_error(SsBackupServer *server, char *error);
/* The end of the gap-free WAL written into pg_wal (0 when only images are kept). */
extern uint64_t ss_backup_server_wal_end(SsBackupServer *server);
/*
 * Deletes the buffer images whose WAL all ends at or below `upto` and whose buffers no session
 * holds open (a standby passes its oldest restart point: WAL it never needs again). A store
 * that keeps images only (not in recovery) keeps its resume position as it was. *removed_files
 * gets how many files went, also on failure (a damaged image is kept and reported).
 */
extern bool ss_backup_server_prune(SsBackupServer *server, uint64_t upto,
								   uint64_t *removed_files, char *error);

/* ---- primary side ---- */

typedef struct SsBackupConn SsBackupConn;

typedef struct SsBackupConnecting SsBackupConnecting;

/*
 * Starts connecting to a backup, on a thread of its own, so that a backup that does not answer
 * holds the caller up for no time at all: the connection says hello (with the WAL timeline this
 * primary writes, which a backup replaying another refuses). ss_backup_connect_poll takes the
 * result. False (with an error) when no attempt could be started.
 */
extern bool ss_backup_connect_begin(const char *address, const char *transport,
									const char *secret, uint64_t system_id, uint32_t timeline,
									uint64_t version, const char *primary,
									SsBackupConnecting **attempt, char *error);
/*
 * Whether the attempt ended: 0 not yet; 1 connected (*conn, and *resume where the backup's
 * durable copy of this primary's WAL ends, 0 if it holds none); -1 failed (error). The attempt
 * is freed once it ended. Nothing is shipped before ss_backup_start.
 */
extern int	ss_backup_connect_poll(SsBackupConnecting *attempt, SsBackupConn **conn,
								   uint64_t *resume, char *error);
/*
 * Gives an attempt up (its backup was dropped or replaced, or the shipper leaves): waits for
 * its thread, which the connect timeout bounds, and frees it and any connection it made.
 */
extern void ss_backup_connect_abandon(SsBackupConnecting *attempt);
/* Starts the WAL stream at `start_lsn` (once, after ss_backup_connect). */
extern bool ss_backup_start(SsBackupConn *conn, uint64_t start_lsn, char *error);
/* Ships WAL bytes [lsn, lsn + len) (lsn must be where the last call ended). */
extern bool ss_backup_append(SsBackupConn *conn, uint64_t lsn, const char *data, size_t len,
							 char *error);
/*
 * Processes completions; *placed gets the WAL position placed on the backup, *durable the one
 * known durable there (closed buffers and flushes: where it resumes after a crash at worst).
 */
extern bool ss_backup_poll(SsBackupConn *conn, int timeout_ms, uint64_t *placed,
						   uint64_t *durable, char *error);
/*
 * A descriptor that turns readable when ss_backup_poll has the backup's answers to read (a tcp
 * link's socket), or -1 when its completions need none (shm places as it writes).
 */
extern int	ss_backup_wait_fd(SsBackupConn *conn);
/*
 * Makes everything shipped durable on the backup, in two halves so that several backups flush
 * at once: start waits for the placement and sends the request; finish reads the answer and
 * sets *durable to the durable position. Nothing else may be called on conn in between.
 */
extern bool ss_backup_flush_start(SsBackupConn *conn, int timeout_ms, char *error);
extern bool ss_backup_flush_finish(SsBackupConn *conn, uint64_t *durable, char *error);
/*
 * Starts the index stream (Send-Index) on a connection, where the backup's durable copy of it
 * ends; *start gets that position.
 */
extern bool ss_backup_index_start(SsBackupConn *conn, uint64_t *start, char *error);
/* Appends index stream bytes (frames) after what was appended before. */
extern bool ss_backup_index_append(SsBackupConn *conn, const char *data, size_t len, char *error);
/* The index stream's end and the position placed on the backup (0 before it started). */
extern uint64_t ss_backup_index_sent(SsBackupConn *conn);
extern uint64_t ss_backup_index_placed(SsBackupConn *conn);

/* The position after the last shipped byte (0 before ss_backup_start). */
extern uint64_t ss_backup_sent(SsBackupConn *conn);

/*
 * Placement by the committing backend (docs/replication.md): the open WAL buffer of a backup
 * reached over shm or tcp, described in memory shared between processes
 * (replication::SharedCursor, kept opaque here), to which any process of the primary appends
 * while it holds the lock that guards the cursor: over shm through its own mapping of the
 * backup's heap, over tcp through its own placer link to the backup.
 */
typedef struct SsDirectCursor
{
	uint64_t	storage[16];
} SsDirectCursor;
/* A process's mapping of, or placer link to, a backup (opened and replaced as needed). */
typedef struct SsDirectWriter SsDirectWriter;
/* Whose session a placer link joins at a tcp backup: the shipper's. */
typedef struct SsPlacerIdentity
{
	const char *address;
	const char *secret;
	uint64_t	system_id;
	uint64_t	version;
	const char *primary;
	int			connect_timeout_ms;
} SsPlacerIdentity;

/*
 * Describes conn's open WAL buffer (invalid unless the link runs on shm or tcp, a buffer is
 * open and every append of the shipper to it is placed).
 */
extern void ss_backup_export_cursor(SsBackupConn *conn, SsDirectCursor *cursor);
/*
 * Takes over what was appended through the cursor since it was exported. False when an
 * appender marked it broken: the link is dropped, and the caller reconnects.
 */
extern bool ss_backup_adopt_cursor(SsBackupConn *conn, const SsDirectCursor *cursor,
								   char *error);
/* Marks a cursor unusable (its link failed or is gone). */
extern void ss_direct_cursor_clear(SsDirectCursor *cursor);
extern bool ss_direct_cursor_valid(const SsDirectCursor *cursor);
/* The WAL position after the last byte appended through the cursor. */
extern uint64_t ss_direct_cursor_end(const SsDirectCursor *cursor);
/*
 * Appends WAL [lsn, lsn + len) (lsn must be the cursor's end) through *writer, opened or
 * reopened for the cursor's backup as needed (`placer` says whom a tcp link joins); *appended
 * gets how many bytes went, fewer when the buffer is full. Over shm they are placed when it
 * returns; over tcp only posted, and ss_direct_finish waits for them. False when the backup
 * refused (it fenced this primary or ended the session: the cursor is left invalid) or could
 * not be reached (the cursor is left as it was, for the shipper).
 */
extern bool ss_direct_append(SsDirectCursor *cursor, SsDirectWriter **writer,
							 const SsPlacerIdentity *placer, uint64_t lsn, const char *data,
							 size_t len, size_t *appended, char *error);
/*
 * Waits up to timeout_ms until what ss_direct_append posted over tcp is placed (at once over
 * shm), polling without sleeping for the first spin_us microseconds. Called after every pass
 * that tried a backup, whether its appends succeeded or not. On failure (the link failed, now
 * or during the appends) the cursor is put back as `before` (its value before the pass),
 * invalid and marked broken, so that the shipper drops and resumes that backup: WRITEs whose
 * fate is unknown are never counted, nor appended after.
 */
extern bool ss_direct_finish(SsDirectCursor *cursor, SsDirectWriter *writer,
							 const SsDirectCursor *before, int timeout_ms, int spin_us,
							 char *error);
/* Unmaps a backup (a writer whose backup went away or changed). */
extern void ss_direct_writer_close(SsDirectWriter *writer);
extern void ss_backup_disconnect(SsBackupConn *conn);

/* Whether `name` may name a primary or a backup (1..63 of [A-Za-z0-9_.-]). */
extern bool ss_repl_valid_name(const char *name);

#ifdef __cplusplus
}
#endif

#endif							/* SLIPSTREAM_REPL_BRIDGE_H */
