/*
 * shuffle/groups.c: peer groups, kept in the extension's table slipstream.peer_group_config
 * (REVOKEd from PUBLIC: it holds the secret and conninfo strings that may hold passwords).
 * create_peer_group and drop_peer_group need superuser or slipstream_admin and check every
 * argument before anything changes; the table is read and written as the bootstrap superuser,
 * so that a shuffle run by any user can read its group's secret without being able to.
 */
#include "postgres.h"

#include "catalog/pg_authid.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "libpq-fe.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"

#include "slipstream.h"
#include "shuffle/shuffle.h"

PG_FUNCTION_INFO_V1(slipstream_create_peer_group);
PG_FUNCTION_INFO_V1(slipstream_drop_peer_group);

/* Runs `sql` with `nargs` text parameters through SPI as the bootstrap superuser. */
static int
run_as_owner(const char *sql, int nargs, Oid *types, Datum *values, bool read_only)
{
	Oid			saved_user;
	int			saved_context;
	int			result;
	char		nulls[8] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};

	GetUserIdAndSecContext(&saved_user, &saved_context);
	SetUserIdAndSecContext(BOOTSTRAP_SUPERUSERID, saved_context | SECURITY_LOCAL_USERID_CHANGE);
	PG_TRY();
	{
		result = SPI_execute_with_args(sql, nargs, types, values, nulls, read_only, 0);
	}
	PG_FINALLY();
	{
		SetUserIdAndSecContext(saved_user, saved_context);
	}
	PG_END_TRY();
	return result;
}


/* Checks a group name: 1 to 63 bytes of letters, digits, '_' and '-'. */
static void
check_group_name(const char *name)
{
	size_t		length = strlen(name);
	bool		ok = length > 0 && length < NAMEDATALEN;

	for (const char *c = name; ok && *c; c++)
		ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
			*c == '_' || *c == '-';
	if (!ok)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid peer group name \"%s\"", name),
				 errhint("Use 1 to %d letters, digits, '_' or '-'.", NAMEDATALEN - 1)));
}

PGconn *
ss_peer_connect(const char *conninfo, const char *user)
{
	const char *keywords[4] = {"dbname", "connect_timeout", user ? "user" : NULL, NULL};
	const char *values[4] = {conninfo, "10", user, NULL};

	/* The conninfo (a string or a URI) is expanded first; the later keywords override it. */
	return PQconnectdbParams(keywords, values, 1);
}

char *
ss_peer_transport_host(const char *conninfo)
{
	PQconninfoOption *options = PQconninfoParse(conninfo, NULL);
	char	   *host = NULL;
	char	   *hostaddr = NULL;
	char	   *result;

	if (options == NULL)
		return pstrdup("127.0.0.1");
	for (PQconninfoOption *o = options; o->keyword; o++)
	{
		if (strcmp(o->keyword, "host") == 0 && o->val && o->val[0])
			host = o->val;
		if (strcmp(o->keyword, "hostaddr") == 0 && o->val && o->val[0])
			hostaddr = o->val;
	}
	if (hostaddr)
		result = pnstrdup(hostaddr, strcspn(hostaddr, ","));
	else if (host && host[0] != '/' && host[0] != '@')
		result = pnstrdup(host, strcspn(host, ","));
	else
		result = pstrdup("127.0.0.1");	/* a unix socket: the node is this machine */
	PQconninfoFree(options);
	return result;
}

/*
 * slipstream.create_peer_group(name, nodes, self, secret, transport, receive_buffers,
 * buffer_size): one row of peer_group_config, after every argument is checked.
 */
Datum
slipstream_create_peer_group(PG_FUNCTION_ARGS)
{
	char	   *name;
	ArrayType  *nodes_array;
	Datum	   *nodes;
	bool	   *node_nulls;
	int			n;
	int			self;
	char	   *secret;
	char	   *transport;
	int			receive_buffers;
	char	   *buffer_size_text;
	int64		buffer_size;
	Oid			types[7] = {TEXTOID, TEXTARRAYOID, INT4OID, TEXTOID, TEXTOID, INT4OID, INT4OID};
	Datum		values[7];
	int			rc;

	ss_require_admin("configure peer groups");
	name = ss_text_arg(fcinfo, 0, "name");
	check_group_name(name);
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("nodes must not be null")));
	nodes_array = PG_GETARG_ARRAYTYPE_P(1);
	if (ARR_NDIM(nodes_array) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("nodes must be a one-dimensional array of conninfo strings")));
	deconstruct_array(nodes_array, TEXTOID, -1, false, TYPALIGN_INT, &nodes, &node_nulls, &n);
	if (n < 1 || n > SS_SHUFFLE_MAX_NODES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a peer group has 1 to %d nodes, not %d", SS_SHUFFLE_MAX_NODES, n),
				 errhint("List every node's libpq conninfo, e.g. 'host=10.0.0.1 port=5432 "
						 "dbname=shop'.")));
	for (int i = 0; i < n; i++)
	{
		char	   *conninfo;
		char	   *error = NULL;
		PQconninfoOption *parsed;

		if (node_nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("node %d of the peer group is null", i)));
		conninfo = TextDatumGetCString(nodes[i]);
		parsed = PQconninfoParse(conninfo, &error);
		if (parsed == NULL)
		{
			char	   *message = pstrdup(error ? error : "out of memory");

			if (error)
				PQfreemem(error);
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("node %d's conninfo is invalid: %s", i, message),
					 errhint("Give a libpq connection string, e.g. 'host=10.0.0.1 port=5432 "
							 "dbname=shop'.")));
		}
		PQconninfoFree(parsed);
	}
	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("self must not be null")));
	self = PG_GETARG_INT32(2);
	if (self < 0 || self >= n)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("self must be this node's index in nodes, from 0 to %d", n - 1)));
	secret = ss_text_arg(fcinfo, 3, "secret");
	if (secret[0] == '\0' || strlen(secret) > 255)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("the secret must be 1 to 255 bytes long"),
				 errhint("Every node of the group must be given the same secret.")));
	transport = ss_text_arg(fcinfo, 4, "transport");
	if (strcmp(transport, "auto") != 0 && strcmp(transport, "tcp") != 0 &&
		strcmp(transport, "shm") != 0 && strcmp(transport, "verbs") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("unknown transport \"%s\"", transport),
				 errhint("Use auto, tcp, shm or verbs.")));
	receive_buffers = PG_ARGISNULL(5) ? 4 : PG_GETARG_INT32(5);
	if (receive_buffers < 1 || receive_buffers > 7)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("receive_buffers must be from 1 to 7")));
	buffer_size_text = ss_text_arg(fcinfo, 6, "buffer_size");
	buffer_size = DatumGetInt64(DirectFunctionCall1(pg_size_bytes,
													CStringGetTextDatum(buffer_size_text)));
	if (buffer_size < 65536 || buffer_size > 256 * 1024 * 1024)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("buffer_size must be from 64kB to 256MB"),
				 errhint("It is the size of each receive buffer and of a batch of rows.")));

	values[0] = CStringGetTextDatum(name);
	values[1] = PointerGetDatum(nodes_array);
	values[2] = Int32GetDatum(self);
	values[3] = CStringGetTextDatum(secret);
	values[4] = CStringGetTextDatum(transport);
	values[5] = Int32GetDatum(receive_buffers);
	values[6] = Int32GetDatum((int32) buffer_size);
	SPI_connect();
	rc = run_as_owner("SELECT 1 FROM slipstream.peer_group_config WHERE name = $1", 1, types,
					  values, true);
	if (rc == SPI_OK_SELECT && SPI_processed > 0)
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("peer group \"%s\" already exists", name),
				 errhint("Drop it first with slipstream.drop_peer_group.")));
	rc = run_as_owner("INSERT INTO slipstream.peer_group_config VALUES ($1, $2, $3, $4, $5, $6, $7)",
					  7, types, values, false);
	if (rc != SPI_OK_INSERT)
		elog(ERROR, "could not store peer group \"%s\" (SPI code %d)", name, rc);
	SPI_finish();
	PG_RETURN_VOID();
}

/* slipstream.drop_peer_group(name). */
Datum
slipstream_drop_peer_group(PG_FUNCTION_ARGS)
{
	char	   *name;
	Oid			types[1] = {TEXTOID};
	Datum		values[1];
	int			rc;

	ss_require_admin("configure peer groups");
	name = ss_text_arg(fcinfo, 0, "name");
	values[0] = CStringGetTextDatum(name);
	SPI_connect();
	rc = run_as_owner("DELETE FROM slipstream.peer_group_config WHERE name = $1", 1, types, values,
					  false);
	if (rc != SPI_OK_DELETE || SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("peer group \"%s\" does not exist", name),
				 errhint("SELECT name FROM slipstream.peer_groups lists them.")));
	SPI_finish();
	PG_RETURN_VOID();
}

SsPeerGroup *
ss_peer_group_load(const char *name)
{
	SsPeerGroup *group = palloc0(sizeof(SsPeerGroup));
	Oid			types[1] = {TEXTOID};
	Datum		values[1] = {CStringGetTextDatum(name)};
	MemoryContext caller = CurrentMemoryContext;
	int			rc;

	SPI_connect();
	rc = run_as_owner("SELECT nodes, self, secret, transport, receive_buffers, buffer_size "
					  "FROM slipstream.peer_group_config WHERE name = $1",
					  1, types, values, true);
	if (rc != SPI_OK_SELECT || SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("peer group \"%s\" does not exist", name),
				 errhint("An admin creates it on every node with slipstream.create_peer_group.")));
	{
		HeapTuple	row = SPI_tuptable->vals[0];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		MemoryContext spi = MemoryContextSwitchTo(caller);
		ArrayType  *array = DatumGetArrayTypePCopy(SPI_getbinval(row, desc, 1, &isnull));
		Datum	   *nodes;
		int			n;

		deconstruct_array(array, TEXTOID, -1, false, TYPALIGN_INT, &nodes, NULL, &n);
		group->name = pstrdup(name);
		group->nodes = n;
		group->conninfo = palloc(sizeof(char *) * n);
		for (int i = 0; i < n; i++)
			group->conninfo[i] = TextDatumGetCString(nodes[i]);
		group->self = DatumGetInt32(SPI_getbinval(row, desc, 2, &isnull));
		group->secret = TextDatumGetCString(SPI_getbinval(row, desc, 3, &isnull));
		group->transport = TextDatumGetCString(SPI_getbinval(row, desc, 4, &isnull));
		group->receive_buffers = DatumGetInt32(SPI_getbinval(row, desc, 5, &isnull));
		group->buffer_size = DatumGetInt32(SPI_getbinval(row, desc, 6, &isnull));
		MemoryContextSwitchTo(spi);
	}
	SPI_finish();
	return group;
}
