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
 *
 * When every column is of a built-in type, a row travels as its heap tuple instead (u32
 * signature with the high bit set | the tuple header and data, TOASTed values flattened):
 * nothing is converted on either side. Its bytes mean the same on every node of a group (one
 * architecture, one major version, built-in types only). The receiver checks the header and
 * walks every attribute within the bytes before it stores the tuple, so a malformed one is
 * refused, never read out of bounds.
 */
#include "postgres.h"

#include "access/detoast.h"
#include "access/heaptoast.h"
#include "access/htup_details.h"
#include "access/transam.h"
#include "access/tupmacs.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/guc.h"
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

#define SS_RAW_ROW 0x80000000u

static void ss_codec_encode(SsRowCodec *codec, Datum *values, bool *nulls, StringInfo out);
static void ss_codec_decode(SsRowCodec *codec, const char *data, uint32 length, int from,
							Datum *values, bool *nulls);

struct SsRowCodec
{
	int			natts;
	bool		raw;			/* rows travel as heap tuples */
	TupleDesc	desc;
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
ss_codec_create(TupleDesc desc, bool allow_raw)
{
	SsRowCodec *codec = palloc0(sizeof(SsRowCodec));
	uint32		signature = hash_bytes_uint32((uint32) desc->natts);

	codec->natts = desc->natts;
	codec->desc = desc;
	codec->raw = allow_raw;
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
		codec->raw = codec->raw && att->atttypid < FirstNormalObjectId;
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
	codec->signature = signature & ~SS_RAW_ROW;
	return codec;
}

/*
 * Text output and input depend on session settings (DateStyle, extra_float_digits, ...); the
 * codec fixes the ones that do, as postgres_fdw does, so every node writes and reads the same
 * text whatever its sessions say. Returns the GUC nest level to pop (-1: nothing set).
 */
int
ss_codec_settings_push(const SsRowCodec *codec)
{
	int			level;

	if (codec->raw)
		return -1;
	level = NewGUCNestLevel();
	(void) set_config_option("datestyle", "ISO", PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE,
							 true, 0, false);
	(void) set_config_option("intervalstyle", "postgres", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	(void) set_config_option("extra_float_digits", "3", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	(void) set_config_option("bytea_output", "hex", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	return level;
}

/* Restores what ss_codec_settings_push changed. */
void
ss_codec_settings_pop(int level)
{
	if (level >= 0)
		AtEOXact_GUC(true, level);
}

uint32
ss_codec_key_hash(SsRowCodec *codec, int column, Datum value, FmgrInfo *hash, Oid collation)
{
	SsColumnIO *c = &codec->columns[column];
	char	   *text;
	uint32		result;

	/* Built-in types hash alike everywhere; others (enums hash their OIDs) by their text. */
	if (c->type < FirstNormalObjectId)
		return DatumGetUInt32(FunctionCall1Coll(hash, collation, value));
	if (c->binary)
	{
		bytea	   *bytes = SendFunctionCall(&c->output, value);

		result = hash_bytes((const unsigned char *) VARDATA(bytes), VARSIZE(bytes) - VARHDRSZ);
		pfree(bytes);
		return result;
	}
	text = OutputFunctionCall(&c->output, value);
	result = hash_bytes((const unsigned char *) text, strlen(text));
	pfree(text);
	return result;
}

/* Appends `value` as 4 bytes, in this machine's order (a peer group is one architecture). */
static void
put_u32(StringInfo out, uint32 value)
{
	appendBinaryStringInfo(out, (const char *) &value, sizeof(value));
}

void
ss_codec_encode_tuple(SsRowCodec *codec, HeapTuple tuple, StringInfo out)
{
	Datum	   *values;
	bool	   *nulls;

	if (codec->raw)
	{
		HeapTuple	flat = HeapTupleHasExternal(tuple)
			? toast_flatten_tuple(tuple, codec->desc) : tuple;

		put_u32(out, codec->signature | SS_RAW_ROW);
		appendBinaryStringInfo(out, (const char *) flat->t_data, flat->t_len);
		if (flat != tuple)
			heap_freetuple(flat);
		return;
	}
	values = palloc(sizeof(Datum) * Max(codec->natts, 1));
	nulls = palloc(sizeof(bool) * Max(codec->natts, 1));
	heap_deform_tuple(tuple, codec->desc, values, nulls);
	ss_codec_encode(codec, values, nulls, out);
	pfree(values);
	pfree(nulls);
}

/* Appends one row's encoding, value by value. */
static void
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

/*
 * Checks a received heap tuple against the descriptor: header fields, then every attribute's
 * alignment and length within the bytes; no TOAST pointers (the sender flattens them).
 */
static void
check_raw_tuple(SsRowCodec *codec, HeapTupleHeader header, uint32 length, int from)
{
	TupleDesc	desc = codec->desc;
	int			natts;
	bool		hasnulls;
	const char *data;
	uint32		data_length;
	uint32		offset = 0;

	if (length < SizeofHeapTupleHeader)
		malformed(from, "a tuple shorter than its header");
	natts = HeapTupleHeaderGetNatts(header);
	hasnulls = (header->t_infomask & HEAP_HASNULL) != 0;
	if (natts > desc->natts || header->t_hoff > length || header->t_hoff < SizeofHeapTupleHeader ||
		(hasnulls && header->t_hoff < SizeofHeapTupleHeader + BITMAPLEN(natts)) ||
		(header->t_infomask & HEAP_HASEXTERNAL))
		malformed(from, "a tuple header that does not fit its columns");
	data = (const char *) header + header->t_hoff;
	data_length = length - header->t_hoff;
	for (int i = 0; i < natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);
		uint32		size;

		if (hasnulls && att_isnull(i, header->t_bits))
			continue;
		if (att->attlen == -1)
		{
			/* a varlena starts aligned unless it is a short one (1-byte header) */
			if (offset >= data_length)
				malformed(from, "a value past the end of its tuple");
			if (!VARATT_NOT_PAD_BYTE(data + offset))
				offset = att_align_nominal(offset, att->attalign);
			if (offset >= data_length)
				malformed(from, "a value past the end of its tuple");
			if (VARATT_IS_EXTERNAL(data + offset))
				malformed(from, "a TOAST pointer in a tuple");
			if (!VARATT_IS_1B(data + offset) && data_length - offset < VARHDRSZ)
				malformed(from, "a value past the end of its tuple");
			size = VARSIZE_ANY(data + offset);
		}
		else if (att->attlen == -2)
		{
			size = (uint32) strnlen(data + offset, data_length - offset) + 1;
			if (offset + size > data_length)
				malformed(from, "an unterminated string in a tuple");
		}
		else
		{
			offset = att_align_nominal(offset, att->attalign);
			size = (uint32) att->attlen;
		}
		if (size == 0 || offset > data_length || size > data_length - offset)
			malformed(from, "a value past the end of its tuple");
		offset += size;
	}
}

void
ss_codec_store(SsRowCodec *codec, const char *data, uint32 length, int from,
			   Tuplestorestate *store)
{
	uint32		signature;

	if (length < sizeof(signature))
		malformed(from, "too short");
	memcpy(&signature, data, sizeof(signature));
	if ((signature & ~SS_RAW_ROW) != codec->signature ||
		((signature & SS_RAW_ROW) != 0) != codec->raw)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("shuffle participant %d sends rows of other column types", from),
				 errhint("Every node's query must return the columns the call declares, of the "
						 "same types (user-defined types created alike on every node).")));
	if (codec->raw)
	{
		HeapTupleData tuple;
		uint32		tuple_length = length - sizeof(signature);

		/* The bytes sit anywhere in the message: copy them to an aligned place first. */
		enlargeStringInfo(&codec->scratch, tuple_length + MAXIMUM_ALIGNOF);
		tuple.t_data = (HeapTupleHeader) MAXALIGN(codec->scratch.data);
		memcpy(tuple.t_data, data + sizeof(signature), tuple_length);
		tuple.t_len = tuple_length;
		ItemPointerSetInvalid(&tuple.t_self);
		tuple.t_tableOid = InvalidOid;
		check_raw_tuple(codec, tuple.t_data, tuple_length, from);
		tuplestore_puttuple(store, &tuple);
	}
	else
	{
		Datum	   *values = palloc(sizeof(Datum) * Max(codec->natts, 1));
		bool	   *nulls = palloc(sizeof(bool) * Max(codec->natts, 1));

		ss_codec_decode(codec, data, length, from, values, nulls);
		tuplestore_putvalues(store, codec->desc, values, nulls);
	}
}

/* Decodes one value-by-value row (ERROR with `from` named if malformed or of another shape). */
static void
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
