/*
 * host/decode.c: logical decoding of slipstream tables.
 *
 * PostgreSQL 15 lets a custom resource manager decode its own records (rm_decode): this turns
 * our WAL records into the reorder buffer's changes, as heap's decoder does for heap records,
 * so test_decoding, pgoutput, publications and subscribers see inserts, updates and deletes of
 * slipstream tables as they see heap's. Our records carry heap-format tuples, so a change's
 * tuple is the logged bytes as they are; TOAST values live in a heap TOAST table, whose chunks
 * heap's decoder queues and the reorder buffer joins to our change. What decoding needs beyond
 * replay is written only while wal_level = logical: the old key of deletes, and of updates that
 * change it (ss_logical_old_key), as heap logs it.
 */
#include "slipstream.h"

#include "access/detoast.h"
#include "access/heaptoast.h"
#include "access/xlogreader.h"
#include "catalog/catalog.h"	/* IsCatalogRelation, for RelationIsLogicallyLogged */
#include "catalog/pg_class.h"
#include "miscadmin.h"
#include "replication/decode.h"
#include "replication/logical.h"
#include "replication/reorderbuffer.h"
#include "replication/snapbuild.h"
#include "host/wal_records.h"
#include "utils/datum.h"
#include "utils/rel.h"
#include "utils/relcache.h"

/* Whether an identity column of `rel` differs between the two tuples. */
static bool
identity_changed(Relation rel, Bitmapset *idattrs, HeapTuple old_tuple, HeapTuple new_tuple)
{
	TupleDesc	desc = RelationGetDescr(rel);
	int			attr = -1;

	while ((attr = bms_next_member(idattrs, attr)) >= 0)
	{
		AttrNumber	attnum = attr + FirstLowInvalidHeapAttributeNumber;
		Form_pg_attribute att;
		bool		old_null,
					new_null;
		Datum		old_value,
					new_value;

		if (attnum <= 0)
			return true;
		att = TupleDescAttr(desc, attnum - 1);
		old_value = heap_getattr(old_tuple, attnum, desc, &old_null);
		new_value = heap_getattr(new_tuple, attnum, desc, &new_null);
		if (old_null != new_null ||
			(!old_null && !datumIsEqual(old_value, new_value, att->attbyval, att->attlen)))
			return true;
	}
	return false;
}

/*
 * The old key to log with a delete (new_tuple NULL) or an update of `old_tuple`, or NULL: only
 * while wal_level = logical and for a logically logged table, as heap's ExtractReplicaIdentity:
 * REPLICA IDENTITY FULL logs the whole old row (TOASTed values inlined), DEFAULT and USING
 * INDEX its identity columns (the others NULL), and an update only when they changed.
 */
HeapTuple
ss_logical_old_key(Relation rel, HeapTuple old_tuple, HeapTuple new_tuple)
{
	TupleDesc	desc = RelationGetDescr(rel);
	char		identity = rel->rd_rel->relreplident;
	Bitmapset  *idattrs;
	Datum	   *values;
	bool	   *nulls;
	HeapTuple	key;

	if (!XLogLogicalInfoActive() || !RelationIsLogicallyLogged(rel) ||
		identity == REPLICA_IDENTITY_NOTHING)
		return NULL;
	if (identity == REPLICA_IDENTITY_FULL)
		return HeapTupleHasExternal(old_tuple) ? toast_flatten_tuple(old_tuple, desc)
			: heap_copytuple(old_tuple);
	idattrs = RelationGetIndexAttrBitmap(rel, INDEX_ATTR_BITMAP_IDENTITY_KEY);
	if (bms_is_empty(idattrs) ||
		(new_tuple != NULL && !identity_changed(rel, idattrs, old_tuple, new_tuple)))
	{
		bms_free(idattrs);
		return NULL;
	}
	values = palloc(sizeof(Datum) * desc->natts);
	nulls = palloc(sizeof(bool) * desc->natts);
	heap_deform_tuple(old_tuple, desc, values, nulls);
	for (int i = 0; i < desc->natts; i++)
	{
		if (!bms_is_member(i + 1 - FirstLowInvalidHeapAttributeNumber, idattrs))
			nulls[i] = true;
		else if (!nulls[i] && TupleDescAttr(desc, i)->attlen == -1 &&
				 VARATT_IS_EXTERNAL(DatumGetPointer(values[i])))
			values[i] = PointerGetDatum(detoast_external_attr((struct varlena *)
															  DatumGetPointer(values[i])));
	}
	key = heap_form_tuple(desc, values, nulls);
	pfree(values);
	pfree(nulls);
	bms_free(idattrs);
	return key;
}

/*
 * A reorder-buffer copy of `len` logged tuple bytes (a whole HeapTupleHeader and data), without
 * a chain member's root link, which output plugins have no use for.
 */
static ReorderBufferTupleBuf *
tuple_buf(LogicalDecodingContext *ctx, const char *data, uint32 len)
{
	ReorderBufferTupleBuf *buf = ReorderBufferGetTupleBuf(ctx->reorder, len);

	buf->tuple.t_len = len;
	ItemPointerSetInvalid(&buf->tuple.t_self);
	buf->tuple.t_tableOid = InvalidOid;
	memcpy(buf->tuple.t_data, data, len);
	ss_without_root_link(&buf->tuple);
	return buf;
}

/* Reports a record too short for what it says it holds. */
static void
report_short(XLogReaderState *r)
{
	ereport(ERROR,
			(errcode(ERRCODE_DATA_CORRUPTED),
			 errmsg("slipstream: WAL record at %X/%X is too short to decode",
					LSN_FORMAT_ARGS(r->ReadRecPtr))));
}

/* Reports the record too short unless its data holds `end` bytes. */
static void
require(XLogReaderState *r, uint64 end)
{
	if (XLogRecGetDataLen(r) < end)
		report_short(r);
}

/* Copies `size` bytes at `offset` of the record's data into `dst` (checked). */
static void
read_part(XLogReaderState *r, uint64 offset, void *dst, Size size)
{
	require(r, offset + size);
	memcpy(dst, XLogRecGetData(r) + offset, size);
}

/* Queues a change of the record's relation file with its tuples (either may be NULL). */
static void
queue_change(LogicalDecodingContext *ctx, XLogRecordBuffer *buf,
			 ReorderBufferChangeType action, ReorderBufferTupleBuf *oldtuple,
			 ReorderBufferTupleBuf *newtuple, bool clear_toast)
{
	XLogReaderState *r = buf->record;
	ReorderBufferChange *change;
	XlRelation	file;

	/* Every record that changes rows starts with its relation file (host/wal_records.h). */
	read_part(r, 0, &file, sizeof(file));
	change = ReorderBufferGetChange(ctx->reorder);
	change->action = action;
	change->origin_id = XLogRecGetOrigin(r);
	change->data.tp.relnode.spcNode = file.spc;
	change->data.tp.relnode.dbNode = (Oid) (file.tag >> 32);
	change->data.tp.relnode.relNode = (Oid) file.tag;
	change->data.tp.oldtuple = oldtuple;
	change->data.tp.newtuple = newtuple;
	change->data.tp.clear_toast_afterwards = clear_toast;
	ReorderBufferQueueChange(ctx->reorder, XLogRecGetXid(r), buf->origptr, change, false);
}

/* rm_decode: queues the changes one of our records makes to a table of the slot's database. */
void
ss_decode(LogicalDecodingContext *ctx, XLogRecordBuffer *buf)
{
	XLogReaderState *r = buf->record;
	uint8		info = XLogRecGetInfo(r) & ~XLR_INFO_MASK;
	TransactionId xid = XLogRecGetXid(r);
	char	   *data = XLogRecGetData(r);
	uint64		tag;

	ReorderBufferProcessXid(ctx->reorder, xid, buf->origptr);
	if (SnapBuildCurrentState(ctx->snapshot_builder) < SNAPBUILD_FULL_SNAPSHOT ||
		ctx->fast_forward)
		return;
	if (!SnapBuildProcessChange(ctx->snapshot_builder, xid, buf->origptr))
		return;
	read_part(r, 0, &tag, sizeof(tag));
	if ((Oid) (tag >> 32) != ctx->slot->data.database)
		return;
	if (ctx->callbacks.filter_by_origin_cb != NULL &&
		filter_by_origin_cb_wrapper(ctx, XLogRecGetOrigin(r)))
		return;
	switch (info)
	{
		case SS_XLOG_PUT:
			{
				XlPut		rec;
				const char *tuple = data + sizeof(rec);

				read_part(r, 0, &rec, sizeof(rec));
				require(r, sizeof(rec) + rec.len);
				if (rec.len < SizeofHeapTupleHeader)
					report_short(r);
				queue_change(ctx, buf,
							 HeapTupleHeaderIsSpeculative((HeapTupleHeader) tuple) ?
							 REORDER_BUFFER_CHANGE_INTERNAL_SPEC_INSERT :
							 REORDER_BUFFER_CHANGE_INSERT,
							 NULL, tuple_buf(ctx, tuple, rec.len), true);
				break;
			}
		case SS_XLOG_PUT_MULTI:
			{
				XlMultiHeader head;
				uint32		pos = sizeof(head);

				read_part(r, 0, &head, sizeof(head));
				for (uint32 i = 0; i < head.count; i++)
				{
					XlMultiItem item;

					read_part(r, pos, &item, sizeof(item));
					pos += sizeof(item);
					require(r, pos + item.len);
					/* TOAST chunks are joined per row; forget them after the batch's last. */
					queue_change(ctx, buf, REORDER_BUFFER_CHANGE_INSERT, NULL,
								 tuple_buf(ctx, data + pos, item.len), i == head.count - 1);
					pos += item.len;
				}
				break;
			}
		case SS_XLOG_UPDATE:
			{
				XlUpdate	rec;
				const char *tuple = data + sizeof(rec);

				read_part(r, 0, &rec, sizeof(rec));
				require(r, sizeof(rec) + rec.len + rec.old_key_len);
				queue_change(ctx, buf, REORDER_BUFFER_CHANGE_UPDATE,
							 rec.old_key_len > 0 ?
							 tuple_buf(ctx, tuple + rec.len, rec.old_key_len) : NULL,
							 tuple_buf(ctx, tuple, rec.len), true);
				break;
			}
		case SS_XLOG_DELETE:
			{
				XlDelete	rec;

				read_part(r, 0, &rec, sizeof(rec));
				require(r, sizeof(rec) + rec.old_key_len);
				queue_change(ctx, buf, REORDER_BUFFER_CHANGE_DELETE,
							 rec.old_key_len > 0 ?
							 tuple_buf(ctx, data + sizeof(rec), rec.old_key_len) : NULL,
							 NULL, true);
				break;
			}
		case SS_XLOG_CONFIRM:
			queue_change(ctx, buf, REORDER_BUFFER_CHANGE_INTERNAL_SPEC_CONFIRM, NULL, NULL,
						 true);
			break;
		case SS_XLOG_SUPER_DELETE:
			queue_change(ctx, buf, REORDER_BUFFER_CHANGE_INTERNAL_SPEC_ABORT, NULL, NULL,
						 true);
			break;
		default:
			/* Row locks, freezes, VACUUM's removals, conflicts and resets change no row. */
			break;
	}
}
