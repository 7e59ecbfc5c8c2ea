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

/* Starts serving primaries; *bound gets the address actually listened on. */
extern bool ss_backup_server_start(const char *listen, const char *secret, uint32_t buffers,
								   uint32_t buffer_size, const char *directory,
								   SsBackupServer **server, char *bound, size_t bound_size,
								   char *error);
/* Stops (persisting every open buffer) and frees. */
extern void ss_backup_server_stop(SsBackupServer *server);
/* Fills up to `max` rows with the open buffers; returns how many. */
extern int	ss_backup_server_buffers(SsBackupServer *server, SsBufferRow *rows, int max);
/* Fences a primary (its keys revoked, its open buffers persisted). */
extern bool ss_backup_server_fence(SsBackupServer *server, const char *primary, char *error);
/* Copies the newest session error (if any) into `error`; false if there is none. */
extern bool ss_backup_server_last_error(SsBackupServer *server, char *error);

/* ---- primary side ---- */

typedef struct SsBackupConn SsBackupConn;

/* Connects to a backup and says hello; WAL will be shipped from `start_lsn`. */
extern bool ss_backup_connect(const char *address, const char *transport, const char *secret,
							  uint64_t system_id, uint64_t version, const char *primary,
							  uint64_t start_lsn, SsBackupConn **conn, char *error);
/* Ships WAL bytes [lsn, lsn + len) (lsn must be where the last call ended). */
extern bool ss_backup_append(SsBackupConn *conn, uint64_t lsn, const char *data, size_t len,
							 char *error);
/* Processes completions; *placed gets the WAL position placed on the backup. */
extern bool ss_backup_poll(SsBackupConn *conn, int timeout_ms, uint64_t *placed, char *error);
/* Makes everything shipped durable on the backup; *durable gets the durable position. */
extern bool ss_backup_flush(SsBackupConn *conn, int timeout_ms, uint64_t *durable, char *error);
/* The position after the last shipped byte. */
extern uint64_t ss_backup_sent(SsBackupConn *conn);
extern void ss_backup_disconnect(SsBackupConn *conn);

/* Whether `name` may name a primary or a backup (1..63 of [A-Za-z0-9_.-]). */
extern bool ss_repl_valid_name(const char *name);

#ifdef __cplusplus
}
#endif

#endif							/* SLIPSTREAM_REPL_BRIDGE_H */
