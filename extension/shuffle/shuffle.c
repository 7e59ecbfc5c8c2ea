/*
 * shuffle/shuffle.c: slipstream.shuffle(query, key, peer_group, shuffle_id), run on every node
 * of a peer group at once (docs/shuffle.md). Each node opens its listener and registers it,
 * learns the others' ports through libpq (slipstream.shuffle_port), joins the exchange, runs
 * its query and encodes each row. A row goes to the node that owns the hash of its key: this
 * node's own rows straight into the result, a peer's into that peer's slice of an arena. A
 * full slice is one batch, sent as a region of the arena (zero copy where it pays); whatever
 * arrives meanwhile goes into the result. At the end each node sends what its slices hold,
 * ends its streams, drains the others' and returns its rows.
 *
 * A send that finds the peer's buffers full returns at once; this node then drains what
 * arrived and tries again, so two nodes sending to each other never wait on each other. Any
 * error (a lost peer, a cancel, a bad row) ends the exchange, which disconnects every peer, so
 * every node fails within the transport's timeouts.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "tcop/pquery.h"
#include "fmgr.h"
#include "funcapi.h"
#include "libpq-fe.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "storage/pmsignal.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/typcache.h"
#include "access/xact.h"
#include "utils/wait_event.h"

#include "bridge/shuffle_bridge.h"
#include "shuffle/shuffle.h"

PG_FUNCTION_INFO_V1(slipstream_shuffle);

#define SS_SHUFFLE_FETCH 1000

/* The rows bound for one peer: a batch being filled in the peer's slice of the arena. */
typedef struct ShufflePeerBatch
{
	char	   *slice;			/* the peer's part of the arena */
	uint64		used;			/* bytes of rows in it */
	uint32		rows;
	uint32	   *lengths;		/* of each row, the rows lying back to back from the start */
} ShufflePeerBatch;

typedef struct ShuffleRun
{
	int64		id;
	int32		sequence;		/* shuffles with this id earlier in the statement */
	SsPeerGroup *group;
	SsShuffle  *shuffle;
	int			slot;
	SsRowCodec *encoder;		/* the query's rows */
	SsRowCodec *decoder;		/* the result's rows */
	Tuplestorestate *store;
	TupleDesc	result_desc;
	MemoryContext batch_context;
	uint64		batch_limit;	/* the most bytes a batch, and so a row, may take */
	uint32		max_rows;		/* the most rows a batch may hold */
	ShufflePeerBatch batches[SS_SHUFFLE_MAX_NODES];
	uint64		own_rows;		/* this node's own rows not yet counted in its progress */
	TimestampTz last_progress;
	char		error[SS_SHUFFLE_ERROR_SIZE];
} ShuffleRun;

/* Raises the transport's error (after `what` failed) as an ERROR every node understands. */
static void
raise_transport_error(ShuffleRun *run, const char *what, int code)
{
	ereport(ERROR,
			(errcode(code == SS_SHUFFLE_AUTH_FAILED ? ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION
					 : ERRCODE_CONNECTION_FAILURE),
			 errmsg("shuffle %lld failed while %s: %s", (long long) run->id, what, run->error),
			 code == SS_SHUFFLE_AUTH_FAILED
			 ? errhint("Every node of peer group \"%s\" must be given the same secret.",
					   run->group->name)
			 : errhint("Another node of peer group \"%s\" failed, was cancelled or cannot be "
					   "reached; its log says why.", run->group->name)));
}

/* Waits for `conn`'s pending query, interruptibly; its result (ERROR if it failed). */
static PGresult *
remote_result(PGconn *conn, int node)
{
	PGresult   *result = NULL;
	PGresult   *next;

	while (PQisBusy(conn))
	{
		int			events = WaitLatchOrSocket(MyLatch,
											   WL_LATCH_SET | WL_SOCKET_READABLE | WL_TIMEOUT |
											   WL_EXIT_ON_PM_DEATH,
											   PQsocket(conn), 100, PG_WAIT_EXTENSION);

		if (events & WL_LATCH_SET)
			ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		if (!PQconsumeInput(conn))
			ereport(ERROR,
					(errcode(ERRCODE_CONNECTION_FAILURE),
					 errmsg("lost node %d of the peer group: %s", node, PQerrorMessage(conn))));
	}
	while ((next = PQgetResult(conn)) != NULL)
	{
		if (result)
			PQclear(result);
		result = next;
	}
	return result;
}

/* The port node `node`'s participant of shuffle `id` listens on, asked through libpq. */
static uint32
rendezvous(ShuffleRun *run, int node)
{
	PGconn	   *volatile conn = ss_peer_connect(run->group->conninfo[node], NULL);
	uint32		port = 0;

	PG_TRY();
	{
		char		id_text[32];
		char		wait_text[16];
		char		sequence_text[16];
		const char *params[3] = {id_text, wait_text, sequence_text};
		PGresult   *result;

		if (PQstatus(conn) != CONNECTION_OK)
			ereport(ERROR,
					(errcode(ERRCODE_SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION),
					 errmsg("could not reach node %d of peer group \"%s\": %s", node,
							run->group->name, pchomp(PQerrorMessage(conn))),
					 errhint("Check node %d's conninfo in slipstream.peer_groups, and that the "
							 "node is up.", node)));
		snprintf(id_text, sizeof(id_text), "%lld", (long long) run->id);
		snprintf(wait_text, sizeof(wait_text), "%d", Max(ss_shuffle_join_timeout / 1000, 1));
		snprintf(sequence_text, sizeof(sequence_text), "%d", run->sequence);
		if (!PQsendQueryParams(conn,
							   "SELECT slipstream.shuffle_port($1::bigint, $2::integer, $3::integer)",
							   3, NULL, params, NULL, NULL, 0))
			ereport(ERROR,
					(errcode(ERRCODE_CONNECTION_FAILURE),
					 errmsg("could not ask node %d for its shuffle port: %s", node,
							PQerrorMessage(conn))));
		result = remote_result(conn, node);
		if (result == NULL || PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1)
		{
			const char *primary = result ? PQresultErrorField(result, PG_DIAG_MESSAGE_PRIMARY) : NULL;
			char	   *message = pstrdup(primary ? primary : "no result");

			if (result)
				PQclear(result);
			ereport(ERROR,
					(errcode(ERRCODE_CONNECTION_FAILURE),
					 errmsg("node %d of peer group \"%s\" did not join shuffle %lld: %s", node,
							run->group->name, (long long) run->id, message),
					 errhint("Run the shuffle on every node of the group at once, with the same "
							 "id; slipstream.shuffle_on_group does that.")));
		}
		port = (uint32) strtoul(PQgetvalue(result, 0, 0), NULL, 10);
		PQclear(result);
	}
	PG_FINALLY();
	{
		PQfinish(conn);
	}
	PG_END_TRY();
	return port;
}

/*
 * Between waits in the transport (which sleeps outside PostgreSQL's latch): cancels and
 * termination, and the postmaster's death, which would otherwise leave this backend
 * shuffling for a node that is gone.
 */
static void
check_interrupts(void)
{
	CHECK_FOR_INTERRUPTS();
	if (!PostmasterIsAlive())
		ereport(FATAL,
				(errcode(ERRCODE_ADMIN_SHUTDOWN),
				 errmsg("terminating the shuffle: the postmaster died")));
}

/* Decodes one row from `from` into the result. */
static void
store_row(ShuffleRun *run, const char *data, uint32 length, int from)
{
	ss_codec_store(run->decoder, data, length, from, run->store);
}

/*
 * Takes what has arrived (waiting up to timeout_ms for the first message): rows go into the
 * result, ends are noted. Returns whether anything arrived.
 */
static bool
drain(ShuffleRun *run, int timeout_ms)
{
	bool		any = false;

	for (;;)
	{
		SsShuffleBatch *batch = NULL;
		int			end_from = -1;
		int			rc = ss_shuffle_receive(run->shuffle, any ? 0 : timeout_ms, &batch, &end_from,
											run->error);

		if (rc == SS_SHUFFLE_NOTHING)
			return any;
		if (rc != SS_SHUFFLE_OK)
			raise_transport_error(run, "receiving", rc);
		any = true;
		run->last_progress = GetCurrentTimestamp();
		if (batch == NULL)
			continue;			/* a peer's end */
		PG_TRY();
		{
			MemoryContext old = MemoryContextSwitchTo(run->batch_context);
			int			settings = ss_codec_settings_push(run->decoder);
			const char *data;
			uint32		length;
			uint64		rows = 0;
			uint64		bytes = 0;
			int			from = (int) ss_shuffle_batch_from(batch);

			while (ss_shuffle_batch_next(batch, &data, &length))
			{
				store_row(run, data, length, from);
				rows++;
				bytes += length;
			}
			ss_codec_settings_pop(settings);
			MemoryContextSwitchTo(old);
			MemoryContextReset(run->batch_context);
			ss_registry_count(run->slot, from, 0, 0, rows, bytes);
		}
		PG_FINALLY();
		{
			ss_shuffle_batch_free(batch);
		}
		PG_END_TRY();
		check_interrupts();
	}
}

/* Fails when a peer has taken nothing and sent nothing for too long. */
static void
check_stall(ShuffleRun *run, const char *what)
{
	if (ss_shuffle_stall_timeout > 0 &&
		TimestampDifferenceExceeds(run->last_progress, GetCurrentTimestamp(),
								   ss_shuffle_stall_timeout))
		ereport(ERROR,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("shuffle %lld made no progress for %d ms while %s",
						(long long) run->id, ss_shuffle_stall_timeout, what),
				 errhint("A node of peer group \"%s\" stopped taking rows; its log says why. "
						 "slipstream.shuffle_stall_timeout sets how long to wait.",
						 run->group->name)));
}

/* A step of the transport that may find `target`'s buffers full: tried again until done. */
typedef int (*ShuffleStep) (SsShuffle *shuffle, uint32_t target, char *error);

/*
 * Runs `step` for `target` until it no longer would block, taking the other nodes' rows
 * meanwhile (they may be what frees our peer's buffers); raises its failure, naming `what`.
 */
static void
retry_while_full(ShuffleRun *run, ShuffleStep step, int target, const char *what)
{
	int			rc;

	while ((rc = step(run->shuffle, (uint32) target, run->error)) == SS_SHUFFLE_WOULD_BLOCK)
	{
		if (!drain(run, 1))
			check_stall(run, what);
		check_interrupts();
	}
	if (rc != SS_SHUFFLE_OK)
		raise_transport_error(run, what, rc);
}

/* Sends the rows of `target`'s batch: its slice of the arena, as a region. */
static void
send_batch(ShuffleRun *run, int target)
{
	ShufflePeerBatch *batch = &run->batches[target];
	uint64		before[6];
	uint64		after[6];

	if (batch->rows == 0)
		return;
	if (ss_shuffle_stage(run->shuffle, (uint32) target, batch->lengths, batch->rows,
						 run->error) != SS_SHUFFLE_OK)
		raise_transport_error(run, "staging a batch", SS_SHUFFLE_ERROR);
	ss_shuffle_counters(run->shuffle, (uint32) target, before);
	retry_while_full(run, ss_shuffle_try_send, target, "sending");
	run->last_progress = GetCurrentTimestamp();
	ss_shuffle_counters(run->shuffle, (uint32) target, after);
	ss_registry_count(run->slot, target, batch->rows, after[1] - before[1], 0, 0);
	batch->used = 0;
	batch->rows = 0;
}

/* Counts the own rows kept since the last call in this node's progress. */
static void
count_own_rows(ShuffleRun *run)
{
	if (run->own_rows == 0)
		return;
	ss_registry_count(run->slot, run->group->self, run->own_rows, 0, run->own_rows, 0);
	run->own_rows = 0;
}

/*
 * What a batch's encoded layout may take beside its rows: for each row a byte for its offset
 * (rows lie back to back) and at most five for its length (rdma's RegionLayout::EncodeTo).
 */
static uint64
header_reserve(uint64 rows)
{
	return 64 + rows * 6;
}

/*
 * Adds one encoded row: a row this node owns goes straight into the result, a peer's is
 * appended to that peer's batch, which is sent first when the row would not fit.
 */
static void
add_row(ShuffleRun *run, const StringInfo encoded, uint32 owner)
{
	ShufflePeerBatch *batch = &run->batches[owner];

	/* Checked for every row, so whether a row is refused does not depend on its key. */
	if ((uint64) encoded->len + header_reserve(1) > run->batch_limit)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("a row of %d bytes does not fit a shuffle batch of peer group \"%s\" "
						"(%llu bytes)", encoded->len, run->group->name,
						(unsigned long long) run->batch_limit),
				 errhint("Raise the group's buffer_size (each receive buffer holds one batch).")));
	if ((int) owner == run->group->self)
	{
		store_row(run, encoded->data, (uint32) encoded->len, run->group->self);
		run->own_rows++;
		return;
	}
	if (batch->used + encoded->len + header_reserve(batch->rows + 1) > run->batch_limit ||
		batch->rows == run->max_rows)
		send_batch(run, (int) owner);
	memcpy(batch->slice + batch->used, encoded->data, encoded->len);
	batch->lengths[batch->rows++] = (uint32) encoded->len;
	batch->used += encoded->len;
}

/* The id this shuffle runs under: the argument, else slipstream.shuffle_id. */
static int64
shuffle_id(FunctionCallInfo fcinfo)
{
	char	   *end;
	long long	id;

	if (!PG_ARGISNULL(3))
		return PG_GETARG_INT64(3);
	if (ss_shuffle_id_setting == NULL || ss_shuffle_id_setting[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("no shuffle id given"),
				 errhint("Pass shuffle_id (the same on every node), or run the statement with "
						 "slipstream.shuffle_on_group, which sets slipstream.shuffle_id.")));
	errno = 0;
	id = strtoll(ss_shuffle_id_setting, &end, 10);
	if (errno != 0 || *end != '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("slipstream.shuffle_id \"%s\" is not a number", ss_shuffle_id_setting)));
	return (int64) id;
}

/*
 * The how-manieth shuffle with `id` this is in the current statement (0 for the first): every
 * node runs the same statement, so the n-th shuffle of each meets the n-th of the others.
 */
static int32
next_sequence(int64 id)
{
	static int64 last_id = 0;
	static TimestampTz last_statement = 0;
	static int32 sequence = 0;
	TimestampTz statement = GetCurrentStatementStartTimestamp();

	if (id == last_id && statement == last_statement)
		return ++sequence;
	last_id = id;
	last_statement = statement;
	sequence = 0;
	return 0;
}

/* Checks that the query's columns are the declared ones (names may differ, types may not). */
static void
check_columns(TupleDesc query, TupleDesc result)
{
	if (query->natts != result->natts)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("the shuffle's query returns %d columns, the call declares %d",
						query->natts, result->natts),
				 errhint("Declare the query's columns after AS, e.g. AS t(id int, name text).")));
	for (int i = 0; i < query->natts; i++)
		if (TupleDescAttr(query, i)->atttypid != TupleDescAttr(result, i)->atttypid)
			ereport(ERROR,
					(errcode(ERRCODE_DATATYPE_MISMATCH),
					 errmsg("column %d of the shuffle's query is of type %s, the call declares %s",
							i + 1, format_type_be(TupleDescAttr(query, i)->atttypid),
							format_type_be(TupleDescAttr(result, i)->atttypid)),
					 errhint("Cast the query's column or fix the column definition list.")));
}

/*
 * Whether rows may travel as heap tuples: only where the declared columns ask for no
 * conversion (a typmod, e.g. numeric(5,2), that the query's column does not already have).
 */
static bool
typmods_match(TupleDesc query, TupleDesc result)
{
	for (int i = 0; i < query->natts; i++)
	{
		int32		declared = TupleDescAttr(result, i)->atttypmod;

		if (declared >= 0 && declared != TupleDescAttr(query, i)->atttypmod)
			return false;
	}
	return true;
}

/*
 * Where the query's rows go: straight from the executor's slots into the batch arena, without
 * the copy SPI_cursor_fetch would make of every tuple.
 */
typedef struct ShuffleDest
{
	DestReceiver pub;
	ShuffleRun *run;
	int			key_column;
	FmgrInfo   *hash;
	Oid			collation;
	StringInfoData encoded;
	MemoryContext row_context;
} ShuffleDest;

/* Encodes one row of the query and adds it to the batch of the node that owns its key. */
static bool
shuffle_receive_slot(TupleTableSlot *slot, DestReceiver *self)
{
	ShuffleDest *dest = (ShuffleDest *) self;
	ShuffleRun *run = dest->run;
	bool		should_free;
	HeapTuple	tuple = ExecFetchSlotHeapTuple(slot, false, &should_free);
	bool		key_null;
	Datum		key_value = slot_getattr(slot, dest->key_column + 1, &key_null);
	uint32		owner = 0;
	MemoryContext outer;

	/* Detoasting and the output functions allocate per row: all of it goes here. */
	resetStringInfo(&dest->encoded);
	outer = MemoryContextSwitchTo(dest->row_context);
	if (!key_null)
		owner = ss_codec_key_hash(run->encoder, dest->key_column, key_value, dest->hash,
								  dest->collation) % (uint32) run->group->nodes;
	ss_codec_encode_tuple(run->encoder, tuple, &dest->encoded);
	if (should_free)
		heap_freetuple(tuple);
	/*
	 * An own row is decoded here too, under the encoder's settings: the query's columns are
	 * of the result's types (check_columns), so both codecs fix the same ones.
	 */
	add_row(run, &dest->encoded, owner);
	MemoryContextSwitchTo(outer);
	MemoryContextReset(dest->row_context);
	return true;
}

/* Nothing to set up or tear down per fetch. */
static void
shuffle_dest_startup(DestReceiver *self, int operation, TupleDesc typeinfo)
{
}

/* Nothing to tear down. */
static void
shuffle_dest_shutdown(DestReceiver *self)
{
}

/* The receiver lives in the run's memory. */
static void
shuffle_dest_destroy(DestReceiver *self)
{
}

/* Runs the query and shuffles its rows (everything after the exchange is up). */
static void
run_query(ShuffleRun *run, const char *query, const char *key)
{
	SPIPlanPtr	plan;
	Portal		portal;
	TupleDesc	desc;
	int			key_column = -1;
	TypeCacheEntry *key_type;
	Oid			key_collation;
	ShuffleDest *dest;
	MemoryContext row_context;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	plan = SPI_prepare(query, 0, NULL);
	if (plan == NULL)
		elog(ERROR, "could not prepare the shuffle's query: %s", SPI_result_code_string(SPI_result));
	if (!SPI_is_cursor_plan(plan))
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("the shuffle's query must return rows"),
				 errhint("Give one SELECT (or VALUES, or a statement with RETURNING).")));
	portal = SPI_cursor_open(NULL, plan, NULL, NULL, false);
	desc = portal->tupDesc;
	check_columns(desc, run->result_desc);
	{
		MemoryContext old = MemoryContextSwitchTo(run->batch_context->parent);
		bool		raw = typmods_match(desc, run->result_desc);

		run->encoder = ss_codec_create(desc, raw);
		run->decoder = ss_codec_create(run->result_desc, raw);
		row_context = AllocSetContextCreate(run->batch_context->parent,
											"slipstream shuffle row", ALLOCSET_DEFAULT_SIZES);
		MemoryContextSwitchTo(old);
	}
	for (int i = 0; i < desc->natts; i++)
		if (strcmp(NameStr(TupleDescAttr(desc, i)->attname), key) == 0)
			key_column = i;
	if (key_column < 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_COLUMN),
				 errmsg("the shuffle's query has no column \"%s\"", key),
				 errhint("key names a column of the query's result, as the query names it.")));
	key_type = lookup_type_cache(TupleDescAttr(desc, key_column)->atttypid,
								 TYPECACHE_HASH_PROC_FINFO);
	if (!OidIsValid(key_type->hash_proc))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("the key column's type %s has no hash function",
						format_type_be(TupleDescAttr(desc, key_column)->atttypid)),
				 errhint("Shuffle by a column of a hashable type, or cast it.")));
	key_collation = TupleDescAttr(desc, key_column)->attcollation;
	dest = palloc0(sizeof(ShuffleDest));
	dest->pub.receiveSlot = shuffle_receive_slot;
	dest->pub.rStartup = shuffle_dest_startup;
	dest->pub.rShutdown = shuffle_dest_shutdown;
	dest->pub.rDestroy = shuffle_dest_destroy;
	dest->pub.mydest = DestNone;
	dest->run = run;
	dest->key_column = key_column;
	dest->hash = &key_type->hash_proc_finfo;
	dest->collation = key_collation;
	dest->row_context = row_context;
	initStringInfo(&dest->encoded);
	ss_registry_state(run->slot, "sending");
	for (;;)
	{
		int			settings = ss_codec_settings_push(run->encoder);
		uint64		fetched = PortalRunFetch(portal, FETCH_FORWARD, SS_SHUFFLE_FETCH,
											 (DestReceiver *) dest);

		ss_codec_settings_pop(settings);
		if (fetched == 0)
			break;
		count_own_rows(run);
		check_interrupts();
		(void) drain(run, 0);
	}
	for (int target = 0; target < run->group->nodes; target++)
		send_batch(run, target);
	count_own_rows(run);
	SPI_cursor_close(portal);
	SPI_finish();
}

/* Ends this node's streams and takes every other node's rows until they all ended. */
static void
finish(ShuffleRun *run)
{
	int			n = run->group->nodes;

	ss_registry_state(run->slot, "draining");
	for (int target = 0; target < n; target++)
	{
		if (target != run->group->self)
			retry_while_full(run, ss_shuffle_try_end, target, "ending its streams");
	}
	while (!ss_shuffle_all_ended(run->shuffle))
	{
		if (!drain(run, 100))
			check_stall(run, "waiting for the other nodes' rows");
		check_interrupts();
	}
	if (ss_shuffle_finish(run->shuffle, ss_shuffle_join_timeout, run->error) != SS_SHUFFLE_OK)
		raise_transport_error(run, "finishing", SS_SHUFFLE_ERROR);
}

/*
 * slipstream.shuffle(query text, key text, peer_group text, shuffle_id bigint) RETURNS SETOF
 * record: this node's share of every node's rows.
 */
Datum
slipstream_shuffle(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	ShuffleRun *run;
	char	   *query;
	char	   *key;
	char	   *group_name;
	TupleDesc	result_desc;
	MemoryContext per_query;
	MemoryContext old;
	uint32		port = 0;
	SsShuffle  *volatile shuffle = NULL;
	volatile int slot = -1;

	for (int i = 0; i < 3; i++)
		if (PG_ARGISNULL(i))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s must not be null", i == 0 ? "query" : i == 1 ? "key" : "peer_group")));
	if (rsinfo == NULL || !IsA(rsinfo, ReturnSetInfo) ||
		(rsinfo->allowedModes & SFRM_Materialize) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("slipstream.shuffle must be called in a FROM clause")));
	if (get_call_result_type(fcinfo, NULL, &result_desc) != TYPEFUNC_COMPOSITE)
		ereport(ERROR,
				(errcode(ERRCODE_SYNTAX_ERROR),
				 errmsg("slipstream.shuffle needs a column definition list"),
				 errhint("Call it as SELECT * FROM slipstream.shuffle(...) AS t(id int, ...).")));
	query = text_to_cstring(PG_GETARG_TEXT_PP(0));
	key = text_to_cstring(PG_GETARG_TEXT_PP(1));
	group_name = text_to_cstring(PG_GETARG_TEXT_PP(2));

	per_query = rsinfo->econtext->ecxt_per_query_memory;
	old = MemoryContextSwitchTo(per_query);
	run = palloc0(sizeof(ShuffleRun));
	run->id = shuffle_id(fcinfo);
	run->sequence = next_sequence(run->id);
	run->group = ss_peer_group_load(group_name);
	run->result_desc = CreateTupleDescCopy(result_desc);
	/*
	 * Random access only when the caller asks for it (a backward scan; a rescan rewinds a
	 * forward-only store too): a store read forward spills a length word less per row past
	 * work_mem.
	 */
	run->store = tuplestore_begin_heap((rsinfo->allowedModes & SFRM_Materialize_Random) != 0,
									   false, work_mem);
	run->batch_context = AllocSetContextCreate(per_query, "slipstream shuffle batch",
											   ALLOCSET_DEFAULT_SIZES);
	run->last_progress = GetCurrentTimestamp();
	MemoryContextSwitchTo(old);

	{
		char	   *host = ss_peer_transport_host(run->group->conninfo[run->group->self]);

		shuffle = ss_shuffle_listen(host, run->group->transport, run->group->secret, &port,
									run->error);
		if (shuffle == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_CONNECTION_FAILURE),
					 errmsg("shuffle %lld could not listen on %s: %s", (long long) run->id, host,
							run->error),
					 errhint("The host comes from this node's conninfo in peer group \"%s\".",
							 run->group->name)));
	}
	run->shuffle = shuffle;
	PG_TRY();
	{
		int			n = run->group->nodes;
		const char **addresses = palloc0(sizeof(char *) * n);
		char	   *arena;		/* a slice of batch_limit bytes per peer */
		int			rc;

		slot = ss_registry_enter(run->id, run->sequence, port, run->group->name, n,
								 run->group->self);
		run->slot = slot;
		for (int node = 0; node < n; node++)
			addresses[node] = node == run->group->self
				? pstrdup("")
				: psprintf("%s:%u", ss_peer_transport_host(run->group->conninfo[node]),
						   rendezvous(run, node));
		rc = ss_shuffle_connect(shuffle, (uint64) run->id * 1000003 + (uint64) run->sequence,
								(uint32) run->group->self, addresses,
								(uint32) n, (uint32) run->group->receive_buffers,
								(uint32) run->group->buffer_size, ss_shuffle_join_timeout,
								run->error);
		if (rc == SS_SHUFFLE_ERROR)
			ereport(ERROR,
					(errcode(ERRCODE_CONNECTION_FAILURE),
					 errmsg("shuffle %lld could not connect to its peers: %s", (long long) run->id,
							run->error),
					 errhint("Every node of peer group \"%s\" must run the shuffle at the same "
							 "time, with the same secret; a node that cannot says so in its log.",
							 run->group->name)));
		if (rc != SS_SHUFFLE_OK)
			raise_transport_error(run, "connecting to its peers", rc);

		/*
		 * One batch fits one receive buffer. Each peer's rows gather in a slice of their own,
		 * so a batch is one run of the arena; a single node ships nothing.
		 */
		run->batch_limit = n > 1 ? ss_shuffle_max_batch(shuffle) : (uint64) run->group->buffer_size;
		run->max_rows = (uint32) Min(run->batch_limit / 8, (uint64) 1 << 20);
		/* Each slice is registered with its peer alone: on verbs, pinned once. */
		arena = n > 1 ? MemoryContextAllocHuge(per_query, run->batch_limit * (uint64) (n - 1)) : NULL;
		for (int target = 0, slice = 0; target < n; target++)
		{
			ShufflePeerBatch *batch = &run->batches[target];

			if (target == run->group->self)
				continue;
			batch->slice = arena + run->batch_limit * (uint64) slice++;
			batch->lengths = MemoryContextAllocHuge(per_query, sizeof(uint32) * run->max_rows);
			if (ss_shuffle_set_source(shuffle, (uint32) target, batch->slice, run->batch_limit,
									  run->error) != SS_SHUFFLE_OK)
				raise_transport_error(run, "registering its batch buffer", SS_SHUFFLE_ERROR);
		}
		run_query(run, query, key);
		finish(run);
	}
	PG_FINALLY();
	{
		ss_shuffle_close(shuffle);
		run->shuffle = NULL;
		ss_registry_leave(slot);
	}
	PG_END_TRY();

	rsinfo->returnMode = SFRM_Materialize;
	rsinfo->setResult = run->store;
	rsinfo->setDesc = run->result_desc;
	return (Datum) 0;
}
