/*
 * shuffle/shuffle.h: the query shuffle's PostgreSQL side (docs/shuffle.md). Peer groups live in
 * the extension's table slipstream.peer_group_config (groups.c); a running shuffle registers
 * its listener port and progress in shared memory (registry.c); rows travel in a
 * cluster-independent encoding (codec.c); slipstream.shuffle is shuffle.c and
 * slipstream.shuffle_on_group on_group.c. The transport is rdma::Exchange behind
 * bridge/shuffle_bridge.h.
 */
#ifndef SLIPSTREAM_SHUFFLE_H
#define SLIPSTREAM_SHUFFLE_H

#include "postgres.h"

#include "access/htup.h"
#include "access/tupdesc.h"
#include "fmgr.h"
#include "libpq-fe.h"
#include "utils/tuplestore.h"
#include "lib/stringinfo.h"

#define SS_SHUFFLE_MAX_NODES 64
#define SS_SHUFFLE_SLOTS 32

/* ---- peer groups (groups.c) ---- */

typedef struct SsPeerGroup
{
	char	   *name;
	int			nodes;
	char	  **conninfo;		/* by node index */
	int			self;
	char	   *secret;
	char	   *transport;
	int			receive_buffers;
	int			buffer_size;
} SsPeerGroup;

/* The group `name` (ERROR with a hint if there is none), whatever the caller's privileges. */
extern SsPeerGroup *ss_peer_group_load(const char *name);

/* A libpq session with a node (10 s to connect), as `user` when given, else as the conninfo
 * says; the caller checks PQstatus. */
extern PGconn *ss_peer_connect(const char *conninfo, const char *user);

/* The host a node's transport listens on: its conninfo's hostaddr or host, or 127.0.0.1 for
 * a unix socket directory. */
extern char *ss_peer_transport_host(const char *conninfo);

/* ---- the shared registry of running shuffles (registry.c) ---- */

extern void ss_shuffle_shmem_request(void);
extern void ss_shuffle_shmem_startup(void);
extern void ss_shuffle_define_settings(void);

/* The GUC slipstream.shuffle_id: the id shuffle() uses when given none ("" if unset). */
extern char *ss_shuffle_id_setting;
/* The GUC slipstream.shuffle_stall_timeout (ms; 0: none). */
extern int	ss_shuffle_stall_timeout;
/* The GUC slipstream.shuffle_join_timeout (ms): how long peers may take to join. */
extern int	ss_shuffle_join_timeout;

/*
 * Takes a slot for shuffle (`id`, `sequence`) listening on `port`; returns its index (ERROR if
 * none is free). `sequence` counts the shuffles with this id in one statement (a join shuffles
 * twice under the id shuffle_on_group set), so each meets its own peers.
 */
extern int	ss_registry_enter(int64 id, int32 sequence, uint32 port, const char *group, int nodes,
							  int self);
/* Frees this backend's slot (safe to call twice, and at exit). */
extern void ss_registry_leave(int slot);
/* Sets a slot's state text ("connecting", "sending", "draining"). */
extern void ss_registry_state(int slot, const char *state);
/* Adds traffic with `peer` to a slot's progress. */
extern void ss_registry_count(int slot, int peer, uint64 rows_sent, uint64 bytes_sent,
							  uint64 rows_received, uint64 bytes_received);

/* ---- rows on the wire (codec.c) ---- */

typedef struct SsRowCodec SsRowCodec;

/*
 * Prepares encoding or decoding rows of `desc`; ERROR for a column type that cannot travel.
 * With allow_raw, rows of built-in types only travel as heap tuples (the caller allows it
 * where no declared typmod asks for a conversion).
 */
extern SsRowCodec *ss_codec_create(TupleDesc desc, bool allow_raw);
/* Fixes the settings text I/O depends on; returns what ss_codec_settings_pop takes. */
extern int	ss_codec_settings_push(const SsRowCodec *codec);
extern void ss_codec_settings_pop(int level);
/* The owner hash of key column `column`: alike on every node of a group. */
extern uint32 ss_codec_key_hash(SsRowCodec *codec, int column, Datum value, FmgrInfo *hash,
								Oid collation);
/* Appends a tuple of the codec's descriptor: as its bytes when every column is built in. */
extern void ss_codec_encode_tuple(SsRowCodec *codec, HeapTuple tuple, StringInfo out);
/* Decodes one row (ERROR with `from` named if malformed or of another shape) into `store`. */
extern void ss_codec_store(SsRowCodec *codec, const char *data, uint32 length, int from,
						   Tuplestorestate *store);

#endif
