/*
 * shuffle/codec.c: rows in an encoding every node of a peer group reads alike.
 *
 * A row: u32 signature | u16 columns | null bitmap | for each non-null column u32 length and
 * the value. Built-in types (fixed OIDs, the same on every cluster) travel in their binary
 * send format; every other type (user-defined types, enums, composites, domains, and their
 * arrays, whose OIDs differ between clusters and whose binary formats carry OIDs) in its text
 * output. TOASTed values are detoasted by the output functions. The signature hashes the
 * column types (OIDs of built-ins, names of the rest), so rows of another shape are refused
 * rather than misread.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/transam.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"

#include "shuffle/shuffle.h"

typedef struct SsColumnIO
{
	bool		binary;
	Oid			type;
	int32		typmod;
	Oid			ioparam;
	FmgrInfo	output;			/* typsend or typoutput */
	FmgrInfo	input;			/* typreceive or typinput */
} SsColumnIO;

struct SsRowCodec
{
	int			natts;
	uint32		signature;
	SsColumnIO *columns;
	StringInfoData scratch;
};

/* Whether `type` travels in its binary format: built in, with a send/receive pair. */
static bool
binary_type(Oid type)
{
	HeapTuple	tuple;
	bool		binary;

	if (type >= FirstNormalObjectId)
		return false;
	tuple = SearchSysCache1(TYPEOID, ObjectIdGetDatum(type));
	if (!HeapTupleIsValid(tuple))
		elog(ERROR, "cache lookup failed for type %u", type);
	binary = OidIsValid(((Form_pg_type) GETSTRUCT(tuple))->typsend) &&
		OidIsValid(((Form_pg_type) GETSTRUCT(tuple))->typreceive);
	ReleaseSysCache(tuple);
	return binary;
}

SsRowCodec *
ss_codec_create(TupleDesc desc)
{
	SsRowCodec *codec = palloc0(sizeof(SsRowCodec));
	uint32		signature = hash_bytes_uint32((uint32) desc->natts);

	codec->natts = desc->natts;
	codec->columns = palloc0(sizeof(SsColumnIO) * Max(desc->natts, 1));
	initStringInfo(&codec->scratch);
	for (int i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);
		SsColumnIO *c = &codec->columns[i];
		Oid			function;
		bool		varlena;

		if (att->attisdropped)
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("a shuffle's rows cannot have dropped columns")));
		if (att->atttypid == RECORDOID)
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("column \"%s\" has the anonymous type record",
							NameStr(att->attname)),
					 errhint("Give it a named composite type, created alike on every node.")));
		c->type = att->atttypid;
		c->typmod = att->atttypmod;
		c->binary = binary_type(att->atttypid);
		if (c->binary)
		{
			getTypeBinaryOutputInfo(att->atttypid, &function, &varlena);
			fmgr_info(function, &c->output);
			getTypeBinaryInputInfo(att->atttypid, &function, &c->ioparam);
			fmgr_info(function, &c->input);
			signature = hash_combine(signature, hash_bytes_uint32(att->atttypid));
		}
		else
		{
			char	   *name = format_type_be(att->atttypid);

			getTypeOutputInfo(att->atttypid, &function, &varlena);
			fmgr_info(function, &c->output);
			getTypeInputInfo(att->atttypid, &function, &c->ioparam);
			fmgr_info(function, &c->input);
			signature = hash_combine(signature,
									 hash_bytes((const unsigned char *) name, strlen(name)));
		}
	}
	codec->signature = signature;
	return codec;
}

uint32
ss_codec_signature(const SsRowCodec *codec)
{
	return codec->signature;
}

/* Appends `value` as 4 bytes, in this machine's order (a peer group is one architecture). */
static void
put_u32(StringInfo out, uint32 value)
{
	appendBinaryStringInfo(out, (const char *) &value, sizeof(value));
}

void
ss_codec_encode(SsRowCodec *codec, Datum *values, bool *nulls, StringInfo out)
{
	uint16		natts = (uint16) codec->natts;
	int			bitmap_bytes = (codec->natts + 7) / 8;
	int			bitmap_at;

	put_u32(out, codec->signature);
	appendBinaryStringInfo(out, (const char *) &natts, sizeof(natts));
	bitmap_at = out->len;
	for (int i = 0; i < bitmap_bytes; i++)
		appendStringInfoCharMacro(out, 0);
	for (int i = 0; i < codec->natts; i++)
	{
		SsColumnIO *c = &codec->columns[i];

		if (nulls[i])
		{
			out->data[bitmap_at + i / 8] |= (char) (1 << (i % 8));
			continue;
		}
		if (c->binary)
		{
			bytea	   *bytes = SendFunctionCall(&c->output, values[i]);

			put_u32(out, VARSIZE(bytes) - VARHDRSZ);
			appendBinaryStringInfo(out, VARDATA(bytes), VARSIZE(bytes) - VARHDRSZ);
			pfree(bytes);
		}
		else
		{
			char	   *text = OutputFunctionCall(&c->output, values[i]);
			uint32		length = strlen(text);

			put_u32(out, length);
			appendBinaryStringInfo(out, text, length);
			pfree(text);
		}
	}
}

/* A malformed row from participant `from`. */
static void
malformed(int from, const char *what)
{
	ereport(ERROR,
			(errcode(ERRCODE_PROTOCOL_VIOLATION),
			 errmsg("malformed row from shuffle participant %d: %s", from, what)));
}

void
ss_codec_decode(SsRowCodec *codec, const char *data, uint32 length, int from, Datum *values,
				bool *nulls)
{
	uint32		signature;
	uint16		natts;
	int			bitmap_bytes = (codec->natts + 7) / 8;
	const char *bitmap;
	const char *end = data + length;

	if (length < sizeof(signature) + sizeof(natts) + bitmap_bytes)
		malformed(from, "too short");
	memcpy(&signature, data, sizeof(signature));
	memcpy(&natts, data + sizeof(signature), sizeof(natts));
	if (signature != codec->signature || natts != codec->natts)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("shuffle participant %d sends rows of other column types", from),
				 errhint("Every node's query must return the columns the call declares, of the "
						 "same types (user-defined types created alike on every node).")));
	bitmap = data + sizeof(signature) + sizeof(natts);
	data = bitmap + bitmap_bytes;
	for (int i = 0; i < codec->natts; i++)
	{
		SsColumnIO *c = &codec->columns[i];
		uint32		size;

		nulls[i] = (bitmap[i / 8] >> (i % 8)) & 1;
		if (nulls[i])
		{
			values[i] = (Datum) 0;
			continue;
		}
		if (end - data < (ptrdiff_t) sizeof(size))
			malformed(from, "a value's length is cut off");
		memcpy(&size, data, sizeof(size));
		data += sizeof(size);
		if ((uint64) (end - data) < size)
			malformed(from, "a value is cut off");
		resetStringInfo(&codec->scratch);
		appendBinaryStringInfo(&codec->scratch, data, size);
		data += size;
		if (c->binary)
		{
			values[i] = ReceiveFunctionCall(&c->input, &codec->scratch, c->ioparam, c->typmod);
			if (codec->scratch.cursor != codec->scratch.len)
				malformed(from, "a binary value has bytes left over");
		}
		else
			values[i] = InputFunctionCall(&c->input, codec->scratch.data, c->ioparam, c->typmod);
	}
	if (data != end)
		malformed(from, "bytes after the last value");
}
