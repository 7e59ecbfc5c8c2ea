/*
 * shuffle/on_group.c: slipstream.shuffle_on_group(peer_group, statement, timeout_seconds) runs
 * one statement on every node of a peer group at once, each in a session of its own (libpq,
 * the group's conninfo) with slipstream.shuffle_id set to a fresh random id, and returns a row
 * per node. If any node fails, every session is cancelled and the ERROR names the node whose
 * failure came first in cause (not merely "a peer went away"). Superuser or slipstream_admin
 * only: the sessions run as whoever the group's conninfo names.
 */
#include "postgres.h"

#include "fmgr.h"
#include "funcapi.h"
#include "libpq-fe.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "slipstream.h"
#include "shuffle/shuffle.h"

PG_FUNCTION_INFO_V1(slipstream_shuffle_on_group);

typedef struct NodeRun
{
	PGconn	   *conn;
	bool		done;
	char	   *command;
	int64		rows;
	char	   *error;			/* NULL: no error */
	char		sqlstate[6];
	bool		cancelled;		/* a cancel was sent (its error is a consequence) */
} NodeRun;

/* Sends a cancel to every node whose statement still runs (once each). */
static void
cancel_running(NodeRun *nodes, int n)
{
	for (int i = 0; i < n; i++)
	{
		PGcancel   *cancel;
		char		buffer[256];

		if (nodes[i].conn == NULL || nodes[i].done || nodes[i].cancelled)
			continue;
		cancel = PQgetCancel(nodes[i].conn);
		if (cancel)
		{
			(void) PQcancel(cancel, buffer, sizeof(buffer));
			PQfreeCancel(cancel);
		}
		nodes[i].cancelled = true;
	}
}

/* Cancels whatever still runs and closes every session. */
static void
close_all(NodeRun *nodes, int n)
{
	for (int i = 0; i < n; i++)
	{
		if (nodes[i].conn == NULL)
			continue;
		if (!nodes[i].done)
		{
			PGcancel   *cancel = PQgetCancel(nodes[i].conn);
			char		buffer[256];

			if (cancel)
			{
				(void) PQcancel(cancel, buffer, sizeof(buffer));
				PQfreeCancel(cancel);
			}
		}
		PQfinish(nodes[i].conn);
		nodes[i].conn = NULL;
	}
}

/* Takes the results `node` has ready; marks it done after the last. */
static void
collect(NodeRun *node)
{
	PGresult   *result;

	if (!PQconsumeInput(node->conn))
	{
		node->error = pstrdup(PQerrorMessage(node->conn));
		strlcpy(node->sqlstate, "08006", sizeof(node->sqlstate));
		node->done = true;
		return;
	}
	while (!PQisBusy(node->conn))
	{
		result = PQgetResult(node->conn);
		if (result == NULL)
		{
			node->done = true;
			return;
		}
		if (PQresultStatus(result) == PGRES_FATAL_ERROR && node->error == NULL)
		{
			const char *state = PQresultErrorField(result, PG_DIAG_SQLSTATE);
			const char *message = PQresultErrorField(result, PG_DIAG_MESSAGE_PRIMARY);

			node->error = pstrdup(message ? message : PQresultErrorMessage(result));
			strlcpy(node->sqlstate, state ? state : "XX000", sizeof(node->sqlstate));
		}
		else if (PQresultStatus(result) == PGRES_COMMAND_OK ||
				 PQresultStatus(result) == PGRES_TUPLES_OK)
		{
			const char *tuples = PQcmdTuples(result);

			node->command = pstrdup(PQcmdStatus(result));
			node->rows = PQresultStatus(result) == PGRES_TUPLES_OK
				? PQntuples(result) : (tuples[0] ? strtoll(tuples, NULL, 10) : 0);
		}
		PQclear(result);
	}
}

/* A fresh id: random, positive, never 0. */
static int64
fresh_id(void)
{
	uint64		id = 0;

	while (id == 0)
	{
		if (!pg_strong_random(&id, sizeof(id)))
			ereport(ERROR,
					(errcode(ERRCODE_INTERNAL_ERROR),
					 errmsg("could not draw a random shuffle id")));
		id &= ~(UINT64CONST(1) << 63);
	}
	return (int64) id;
}

Datum
slipstream_shuffle_on_group(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	char	   *group_name;
	char	   *statement;
	int			timeout_seconds;
	SsPeerGroup *group;
	NodeRun    *volatile nodes;
	int			n;
	int64		id;
	TimestampTz deadline;
	int			failed = -1;
	bool		failed_is_consequence = false;

	ss_require_admin("run statements on a peer group");
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("peer_group and statement must not be null")));
	group_name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	statement = text_to_cstring(PG_GETARG_TEXT_PP(1));
	timeout_seconds = PG_ARGISNULL(2) ? 300 : PG_GETARG_INT32(2);
	if (timeout_seconds < 1 || timeout_seconds > 86400)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("timeout_seconds must be from 1 to 86400")));
	group = ss_peer_group_load(group_name);
	n = group->nodes;
	id = fresh_id();
	nodes = palloc0(sizeof(NodeRun) * n);
	deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), (int64) timeout_seconds * 1000);

	PG_TRY();
	{
		char	   *sql = psprintf("SET slipstream.shuffle_id = '%lld'; %s", (long long) id,
								   statement);
		int			running = n;

		for (int i = 0; i < n; i++)
		{
			/*
			 * A non-superuser's statement runs as that user on every node, whoever the
			 * group's conninfo names: the group must not lend an admin more rights.
			 */
			char	   *user = superuser() ? NULL : GetUserNameFromId(GetUserId(), false);

			nodes[i].conn = ss_peer_connect(group->conninfo[i], user);
			if (PQstatus(nodes[i].conn) != CONNECTION_OK)
				ereport(ERROR,
						(errcode(ERRCODE_SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION),
						 errmsg("could not reach node %d of peer group \"%s\": %s", i,
								group->name, pchomp(PQerrorMessage(nodes[i].conn))),
						 errhint("Check node %d's conninfo in slipstream.peer_groups, and that "
								 "the node is up.", i)));
		}
		for (int i = 0; i < n; i++)
			if (!PQsendQuery(nodes[i].conn, sql))
				ereport(ERROR,
						(errcode(ERRCODE_CONNECTION_FAILURE),
						 errmsg("could not send the statement to node %d: %s", i,
								pchomp(PQerrorMessage(nodes[i].conn)))));
		while (running > 0)
		{
			bool		failure = false;

			running = 0;
			for (int i = 0; i < n; i++)
			{
				if (!nodes[i].done)
					collect(&nodes[i]);
				if (!nodes[i].done)
					running++;
				failure = failure || nodes[i].error != NULL;
			}
			/* One node failed: the others cannot finish; stop them now. */
			if (failure && running > 0)
			{
				cancel_running(nodes, n);
				failure = false;
			}
			if (running == 0)
				break;
			if (GetCurrentTimestamp() >= deadline)
				ereport(ERROR,
						(errcode(ERRCODE_QUERY_CANCELED),
						 errmsg("the statement did not finish on every node of peer group \"%s\" "
								"within %d seconds", group->name, timeout_seconds),
						 errhint("Raise timeout_seconds, or look at "
								 "slipstream.shuffle_progress on the nodes.")));
			(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, 5,
							 PG_WAIT_EXTENSION);
			ResetLatch(MyLatch);
			CHECK_FOR_INTERRUPTS();
		}
	}
	PG_FINALLY();
	{
		close_all(nodes, n);
	}
	PG_END_TRY();

	/* The cause: the first failure that is not a lost connection, else the first one. */
	for (int i = 0; i < n; i++)
	{
		bool		consequence = nodes[i].cancelled || strcmp(nodes[i].sqlstate, "08006") == 0;

		if (nodes[i].error == NULL)
			continue;
		if (failed < 0 || (failed_is_consequence && !consequence))
		{
			failed = i;
			failed_is_consequence = consequence;
		}
	}
	if (failed >= 0)
	{
		StringInfoData others;

		initStringInfo(&others);
		for (int i = 0; i < n; i++)
			if (nodes[i].error && i != failed)
				appendStringInfo(&others, "%snode %d: %s", others.len ? "; " : "", i,
								 nodes[i].error);
		ereport(ERROR,
				(errcode(MAKE_SQLSTATE(nodes[failed].sqlstate[0], nodes[failed].sqlstate[1],
									   nodes[failed].sqlstate[2], nodes[failed].sqlstate[3],
									   nodes[failed].sqlstate[4])),
				 errmsg("node %d of peer group \"%s\" failed: %s", failed, group->name,
						nodes[failed].error),
				 others.len ? errdetail("The other nodes: %s", others.data) : 0));
	}

	InitMaterializedSRF(fcinfo, 0);
	for (int i = 0; i < n; i++)
	{
		Datum		values[3];
		bool		nulls[3] = {false, nodes[i].command == NULL, false};

		values[0] = Int32GetDatum(i);
		values[1] = nodes[i].command ? CStringGetTextDatum(nodes[i].command) : (Datum) 0;
		values[2] = Int64GetDatum(nodes[i].rows);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
