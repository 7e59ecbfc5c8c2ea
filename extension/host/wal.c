/*
 * host/wal.c: slipstream's WAL resource manager: writing our records, and reading them back
 * into the engine (replay, driven by startup.c).
 *
 * Why a WAL record per change: commit durability then costs exactly what heap's does (one
 * group-committed WAL flush), and a transaction id is always in WAL before any engine data
 * that carries it can reach disk (the barrier), so a crash can never let PostgreSQL hand the
 * same xid to a new transaction while old engine rows still carry it.
 *
 * After a crash of a primary, redo in the startup process does nothing: the worker replays our
 * records from the slot's restart_lsn (a horizon below which every change is durable in the
 * engine, see horizon.c) to the end of WAL, before any backend may touch a slipstream table
 * (startup.c). On a standby (archive recovery), the startup process applies each record as it
 * replays it (standby.c). Every record is idempotent: puts carry whole rows, header records
 * whole header prefixes, so a record applied twice leaves what applying it once left.
 */
#include "slipstream.h"

#include "access/twophase.h"
#include "access/xlog.h"
#include "access/xlog_internal.h"
#include "access/xloginsert.h"
#include "access/xlogreader.h"
#include "access/xlogutils.h"
#include "catalog/pg_tablespace_d.h"
#include "miscadmin.h"
#include "replication/slot.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "storage/standby.h"
#include "utils/memutils.h"

#include "host/wal_records.h"

/* Tag of a relation as the WAL records name it. */
static uint64
rel_tag(Relation rel)
{
	return ss_tag(MyDatabaseId, rel->rd_node.relNode);
}

/* Whether changes to this relation go through WAL (permanent relations). */
bool
ss_rel_needs_wal(Relation rel)
{
	return RelationNeedsWAL(rel);
}

/* Logs an inserted row. */
XLogRecPtr
ss_log_put(Relation rel, uint64 rowid, HeapTuple tuple)
{
	XlPut		rec;

	memset(&rec, 0, sizeof(rec));
	rec.tag = rel_tag(rel);
	rec.spc = rel->rd_node.spcNode;
	rec.rowid = rowid;
	rec.len = tuple->t_len;

	XLogBeginInsert();
	XLogRegisterData((char *) &rec, sizeof(rec));
	XLogRegisterData((char *) tuple->t_data, tuple->t_len);
	return XLogInsert(SS_RMGR_ID, SS_XLOG_PUT);
}

/*
 * The body of the last batch record, kept for the next: a COPY logs one batch after another,
 * and a body allocated and freed each time went back to the system and was faulted in anew.
 * Bodies above SS_KEPT_BATCH_BODY are freed after use.
 */
static char *batch_body;
static Size batch_body_size;
#define SS_KEPT_BATCH_BODY (1024 * 1024)

/* Returns a buffer of at least `size` bytes for a batch record's body. */
static char *
batch_body_buffer(Size size)
{
	if (size > batch_body_size)
	{
		if (batch_body != NULL)
			pfree(batch_body);
		batch_body = NULL;
		batch_body_size = 0;
		batch_body = MemoryContextAllocExtended(TopMemoryContext, size, MCXT_ALLOC_HUGE);
		batch_body_size = size;
	}
	return batch_body;
}

/*
 * Logs a batch of inserted rows (COPY, multi-row inserts) as one contiguous record body; rows a
 * rewrite copies (`rewrite`) are logged as such, which logical decoding passes over.
 */
XLogRecPtr
ss_log_put_multi(Relation rel, uint64 *rowids, HeapTuple *tuples, int ntuples, bool rewrite)
{
	XlMultiHeader head;
	Size		size = sizeof(head);
	char	   *body;
	char	   *p;
	XLogRecPtr	lsn;

	memset(&head, 0, sizeof(head));
	head.tag = rel_tag(rel);
	head.spc = rel->rd_node.spcNode;
	head.count = (uint32) ntuples;
	for (int i = 0; i < ntuples; i++)
		size += sizeof(XlMultiItem) + tuples[i]->t_len;
	body = batch_body_buffer(size);
	memcpy(body, &head, sizeof(head));
	p = body + sizeof(head);
	for (int i = 0; i < ntuples; i++)
	{
		XlMultiItem item = {rowids[i], tuples[i]->t_len};

		memcpy(p, &item, sizeof(item));
		p += sizeof(item);
		memcpy(p, tuples[i]->t_data, tuples[i]->t_len);
		p += tuples[i]->t_len;
	}
	XLogBeginInsert();
	XLogRegisterData(body, size);
	lsn = XLogInsert(SS_RMGR_ID, rewrite ? SS_XLOG_REWRITE : SS_XLOG_PUT_MULTI);
	if (batch_body_size > SS_KEPT_BATCH_BODY)
	{
		pfree(batch_body);
		batch_body = NULL;
		batch_body_size = 0;
	}
	return lsn;
}

/*
 * Logs a new header prefix (xmax, infomask, ctid) of an existing row, as the record type that
 * says what the change is (`change`: a header, a delete, a confirmation or a super-delete); a
 * delete carries the old key logical decoding needs (`old_key`, NULL: none).
 */
XLogRecPtr
ss_log_header(Relation rel, uint64 rowid, HeapTupleHeader header, SsRowChange change,
			  HeapTuple old_key)
{
	XlDelete	rec;
	uint8		info;

	memset(&rec, 0, sizeof(rec));
	rec.header.tag = rel_tag(rel);
	rec.header.spc = rel->rd_node.spcNode;
	rec.header.rowid = rowid;
	memcpy(rec.header.header, header, SS_HEADER_SIZE);
	XLogBeginInsert();
	switch (change)
	{
		case SS_ROW_DELETE:
			info = SS_XLOG_DELETE;
			rec.old_key_len = old_key != NULL ? old_key->t_len : 0;
			XLogRegisterData((char *) &rec, sizeof(rec));
			if (old_key != NULL)
				XLogRegisterData((char *) old_key->t_data, old_key->t_len);
			return XLogInsert(SS_RMGR_ID, info);
		case SS_ROW_CONFIRM:
			info = SS_XLOG_CONFIRM;
			break;
		case SS_ROW_SUPER_DELETE:
			info = SS_XLOG_SUPER_DELETE;
			break;
		default:
			info = SS_XLOG_HEADER;
			break;
	}
	XLogRegisterData((char *) &rec.header, sizeof(rec.header));
	return XLogInsert(SS_RMGR_ID, info);
}

/*
 * Logs an update: the old row's new header and the new version, as one record, with the old
 * key logical decoding needs when the key changed (`old_key`, NULL: none).
 */
XLogRecPtr
ss_log_update(Relation rel, uint64 old_rowid, HeapTupleHeader old_header, uint64 new_rowid,
			  HeapTuple new_tuple, HeapTuple old_key)
{
	XlUpdate	rec;

	memset(&rec, 0, sizeof(rec));
	rec.tag = rel_tag(rel);
	rec.spc = rel->rd_node.spcNode;
	rec.old_rowid = old_rowid;
	rec.new_rowid = new_rowid;
	rec.len = new_tuple->t_len;
	rec.old_key_len = old_key != NULL ? old_key->t_len : 0;
	memcpy(rec.old_header, old_header, SS_HEADER_SIZE);
	XLogBeginInsert();
	XLogRegisterData((char *) &rec, sizeof(rec));
	XLogRegisterData((char *) new_tuple->t_data, new_tuple->t_len);
	if (old_key != NULL)
		XLogRegisterData((char *) old_key->t_data, old_key->t_len);
	return XLogInsert(SS_RMGR_ID, SS_XLOG_UPDATE);
}

/* Logs the removal of dead rows by VACUUM. */
XLogRecPtr
ss_log_remove(Relation rel, uint64 *rowids, int nrowids)
{
	XlRemove	rec;

	memset(&rec, 0, sizeof(rec));
	rec.tag = rel_tag(rel);
	rec.spc = rel->rd_node.spcNode;
	rec.count = (uint32) nrowids;

	XLogBeginInsert();
	XLogRegisterData((char *) &rec, sizeof(rec));
	XLogRegisterData((char *) rowids, sizeof(uint64) * nrowids);
	return XLogInsert(SS_RMGR_ID, SS_XLOG_REMOVE);
}

/* Logs a chain's prune: the root's redirect and the members removed, one atomic change. */
XLogRecPtr
ss_log_prune(Relation rel, uint64 root, HeapTupleHeader redirect, uint64 *removed, int nremoved,
			 TransactionId latest_removed)
{
	XlPrune		rec;

	memset(&rec, 0, sizeof(rec));
	rec.tag = rel_tag(rel);
	rec.spc = rel->rd_node.spcNode;
	rec.horizon = latest_removed;
	rec.root = root;
	rec.count = (uint32) nremoved;
	rec.redirect_len = SS_REDIRECT_SIZE;

	XLogBeginInsert();
	XLogRegisterData((char *) &rec, sizeof(rec));
	XLogRegisterData((char *) redirect, SS_REDIRECT_SIZE);
	if (nremoved > 0)
		XLogRegisterData((char *) removed, sizeof(uint64) * nremoved);
	return XLogInsert(SS_RMGR_ID, SS_XLOG_PRUNE);
}

/*
 * Logs, before VACUUM removes rows or freezes xmins, the newest xid whose effect it makes
 * visible to every snapshot: a hot standby cancels the queries that could still tell (as
 * heap's prune and freeze records make it do).
 */
void
ss_log_conflict(Relation rel, TransactionId horizon)
{
	XlConflict	rec;

	memset(&rec, 0, sizeof(rec));
	rec.tag = rel_tag(rel);
	rec.spc = rel->rd_node.spcNode;
	rec.horizon = horizon;

	XLogBeginInsert();
	XLogRegisterData((char *) &rec, sizeof(rec));
	(void) XLogInsert(SS_RMGR_ID, SS_XLOG_CONFLICT);
}

/* Logs that a relation's rows were all discarded in place (non-transactional truncate). */
XLogRecPtr
ss_log_reset(uint64 tag)
{
	XLogBeginInsert();
	XLogRegisterData((char *) &tag, sizeof(tag));
	return XLogInsert(SS_RMGR_ID, SS_XLOG_RESET);
}

/* pg_waldump's description of a record. */
static void
ss_desc(StringInfo buf, XLogReaderState *record)
{
	char	   *data = XLogRecGetData(record);
	uint8		info = XLogRecGetInfo(record) & ~XLR_INFO_MASK;
	uint64		tag;

	memcpy(&tag, data, sizeof(tag));
	appendStringInfo(buf, "db %u relfilenode %u", (uint32) (tag >> 32), (uint32) tag);
	if (info == SS_XLOG_PUT || info == SS_XLOG_HEADER || info == SS_XLOG_DELETE ||
		info == SS_XLOG_CONFIRM || info == SS_XLOG_SUPER_DELETE)
	{
		uint64		rowid;

		StaticAssertStmt(offsetof(XlPut, rowid) == offsetof(XlHeader, rowid),
						 "row ids at one offset");
		memcpy(&rowid, data + offsetof(XlHeader, rowid), sizeof(rowid));
		appendStringInfo(buf, " row " UINT64_FORMAT, rowid);
	}
	else if (info == SS_XLOG_PRUNE)
	{
		XlPrune		rec;

		memcpy(&rec, data, sizeof(rec));
		appendStringInfo(buf, " root " UINT64_FORMAT " removed %u horizon %u", rec.root,
						 rec.count, rec.horizon);
	}
}

/* pg_waldump's name of a record type. */
static const char *
ss_identify(uint8 info)
{
	switch (info & ~XLR_INFO_MASK)
	{
		case SS_XLOG_PUT:
			return "PUT";
		case SS_XLOG_PUT_MULTI:
			return "PUT_MULTI";
		case SS_XLOG_HEADER:
			return "HEADER";
		case SS_XLOG_UPDATE:
			return "UPDATE";
		case SS_XLOG_REMOVE:
			return "REMOVE";
		case SS_XLOG_RESET:
			return "RESET";
		case SS_XLOG_CONFLICT:
			return "CONFLICT";
		case SS_XLOG_DELETE:
			return "DELETE";
		case SS_XLOG_CONFIRM:
			return "CONFIRM";
		case SS_XLOG_SUPER_DELETE:
			return "SUPER_DELETE";
		case SS_XLOG_REWRITE:
			return "REWRITE";
		case SS_XLOG_VM_SET:
			return "VM_SET";
		case SS_XLOG_VM_CLEAR:
			return "VM_CLEAR";
		case SS_XLOG_PRUNE:
			return "PRUNE";
	}
	return NULL;
}

static RmgrData ss_rmgr = {
	.rm_name = "slipstream",
	.rm_redo = ss_standby_redo,
	.rm_desc = ss_desc,
	.rm_identify = ss_identify,
	.rm_startup = ss_standby_startup,
	.rm_cleanup = ss_standby_cleanup,
	.rm_decode = ss_decode,
};

/* Registers the resource manager (from _PG_init, under shared_preload_libraries). */
void
ss_register_rmgr(void)
{
	RegisterCustomRmgr(SS_RMGR_ID, &ss_rmgr);
}

/* ---- applying records to the engine (replay) ---- */

/* Replaces the header prefix of a stored row; a missing row is left missing. */
static void
apply_header(uint32 keyspace, uint64 rowid, const char *header, SsBatch *batch)
{
	char		key[SS_KEY_SIZE];
	const char *value;
	size_t		len;
	SsCode		code;
	char	   *copy;

	ss_encode_key(rowid, key);
	code = ss_get(keyspace, key, SS_KEY_SIZE, &value, &len);
	if (code == SS_NOT_FOUND)
		return;					/* removed by a later change already in the engine */
	if (code != SS_OK)
		ss_report(code, "replaying a row header");
	if (len < SS_HEADER_SIZE)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("slipstream: row " UINT64_FORMAT " of keyspace %u is too short (%zu bytes)",
						rowid, keyspace, len)));
	copy = palloc(len);
	memcpy(copy, value, len);
	memcpy(copy, header, SS_HEADER_SIZE);
	ss_batch_put_changed_prefix(batch, keyspace, key, SS_KEY_SIZE, copy, len, SS_HEADER_SIZE);
	pfree(copy);
}

/* Applies one of our WAL records to the engine. */
void
ss_apply_record(XLogReaderState *record)
{
	char	   *data = XLogRecGetData(record);
	uint32		data_len = XLogRecGetDataLen(record);
	uint8		info = XLogRecGetInfo(record) & ~XLR_INFO_MASK;
	uint64		tag;
	uint32		keyspace;
	char		key[SS_KEY_SIZE];
	SsBatch    *batch;
	SsCode		code;
	LWLock	   *chain_lock = NULL;

	if (data_len < sizeof(uint64))
		ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED),
						errmsg("slipstream: WAL record at %X/%X is too short",
							   LSN_FORMAT_ARGS(record->ReadRecPtr))));
	memcpy(&tag, data, sizeof(tag));
	if (info == SS_XLOG_CONFLICT)
	{
		XlConflict	rec;
		RelFileNode node;

		if (data_len < sizeof(rec))
			ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED),
							errmsg("slipstream: WAL record at %X/%X is too short",
								   LSN_FORMAT_ARGS(record->ReadRecPtr))));
		memcpy(&rec, data, sizeof(rec));
		node.spcNode = rec.spc;
		node.dbNode = (Oid) (tag >> 32);
		node.relNode = (Oid) tag;
		if (InHotStandby && TransactionIdIsValid(rec.horizon))
			ResolveRecoveryConflictWithSnapshot(rec.horizon, node);
		return;
	}
	if (info == SS_XLOG_VM_SET || info == SS_XLOG_VM_CLEAR)
		return;					/* visibility map pages: the startup process redoes them */
	if (info == SS_XLOG_RESET)
	{
		keyspace = ss_keyspace_for_tag(tag, false);
		if (keyspace != 0)
			SS_CHECK(ss_keyspace_drop(keyspace), "replaying a truncate");
		return;
	}
	keyspace = ss_keyspace_for_tag(tag, true);
	batch = ss_batch_new();
	if (batch == NULL)
		ss_report(SS_NO_MEMORY, "replaying WAL");
	switch (info)
	{
		case SS_XLOG_PUT:
			{
				XlPut		rec;

				memcpy(&rec, data, sizeof(rec));
				ss_encode_key(rec.rowid, key);
				ss_batch_put(batch, keyspace, key, SS_KEY_SIZE, data + sizeof(rec), rec.len);
				break;
			}
		case SS_XLOG_PUT_MULTI:
		case SS_XLOG_REWRITE:
			{
				XlMultiHeader head;
				char	   *p = data + sizeof(head);

				memcpy(&head, data, sizeof(head));
				for (uint32 i = 0; i < head.count; i++)
				{
					XlMultiItem item;

					memcpy(&item, p, sizeof(item));
					p += sizeof(item);
					ss_encode_key(item.rowid, key);
					ss_batch_put(batch, keyspace, key, SS_KEY_SIZE, p, item.len);
					p += item.len;
				}
				break;
			}
		case SS_XLOG_HEADER:
		case SS_XLOG_DELETE:
		case SS_XLOG_CONFIRM:
		case SS_XLOG_SUPER_DELETE:
			{
				XlHeader	rec;

				memcpy(&rec, data, sizeof(rec));
				apply_header(keyspace, rec.rowid, rec.header, batch);
				break;
			}
		case SS_XLOG_UPDATE:
			{
				XlUpdate	rec;

				memcpy(&rec, data, sizeof(rec));
				apply_header(keyspace, rec.old_rowid, rec.old_header, batch);
				ss_encode_key(rec.new_rowid, key);
				ss_batch_put(batch, keyspace, key, SS_KEY_SIZE, data + sizeof(rec), rec.len);
				break;
			}
		case SS_XLOG_PRUNE:
			{
				XlPrune		rec;
				const char *p = data + sizeof(rec);
				uint64		rowid;

				if (data_len >= sizeof(rec))
					memcpy(&rec, data, sizeof(rec));
				if (data_len < sizeof(rec) || rec.redirect_len < SizeofHeapTupleHeader ||
					data_len != sizeof(rec) + rec.redirect_len +
					sizeof(uint64) * (uint64) rec.count)
				{
					ss_batch_free(batch);
					ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED),
									errmsg("slipstream: prune record at %X/%X has a wrong length",
										   LSN_FORMAT_ARGS(record->ReadRecPtr))));
				}
				if (InHotStandby && TransactionIdIsValid(rec.horizon))
				{
					RelFileNode node;

					node.spcNode = rec.spc;
					node.dbNode = (Oid) (tag >> 32);
					node.relNode = (Oid) tag;
					ResolveRecoveryConflictWithSnapshot(rec.horizon, node);
				}
				/* As a prune on the primary, under the root's row lock: readers rely on it. */
				chain_lock = ss_row_lock(tag, rec.root);
				ss_encode_key(rec.root, key);
				ss_batch_put(batch, keyspace, key, SS_KEY_SIZE, p, rec.redirect_len);
				p += rec.redirect_len;
				for (uint32 i = 0; i < rec.count; i++)
				{
					memcpy(&rowid, p + i * sizeof(uint64), sizeof(rowid));
					ss_encode_key(rowid, key);
					ss_batch_delete(batch, keyspace, key, SS_KEY_SIZE);
				}
				break;
			}
		case SS_XLOG_REMOVE:
			{
				XlRemove	rec;
				uint64		rowid;

				memcpy(&rec, data, sizeof(rec));
				for (uint32 i = 0; i < rec.count; i++)
				{
					memcpy(&rowid, data + sizeof(rec) + i * sizeof(uint64), sizeof(rowid));
					ss_encode_key(rowid, key);
					ss_batch_delete(batch, keyspace, key, SS_KEY_SIZE);
				}
				break;
			}
		default:
			ss_batch_free(batch);
			ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED),
							errmsg("slipstream: unknown WAL record type 0x%02x at %X/%X", info,
								   LSN_FORMAT_ARGS(record->ReadRecPtr))));
	}
	if (chain_lock != NULL)
		LWLockAcquire(chain_lock, LW_EXCLUSIVE);
	code = ss_batch_write(batch);
	if (chain_lock != NULL)
		LWLockRelease(chain_lock);
	ss_batch_free(batch);
	if (code != SS_OK)
		ss_report(code, "replaying WAL");
}

/*
 * Applies every one of our records from `start` to `end` to the engine; returns how many.
 * The reader never waits for WAL past the flushed (or, on a standby, replayed) end: both
 * callers run before any record of ours can be logged past it (the worker at startup, which
 * backends wait for; the startup process before its redo), so a wait for such a record would
 * never end.
 */
uint64
ss_replay_wal(XLogRecPtr start, XLogRecPtr end)
{
	XLogRecPtr	first;
	XLogReaderState *reader;
	ReadLocalXLogPageNoWaitPrivate reader_state = {.end_of_wal = false};
	uint64		applied = 0;

	reader = XLogReaderAllocate(wal_segment_size, NULL,
								XL_ROUTINE(.page_read = &read_local_xlog_page_no_wait,
										   .segment_open = &wal_segment_open,
										   .segment_close = &wal_segment_close),
								&reader_state);
	if (reader == NULL)
		ereport(ERROR, (errcode(ERRCODE_OUT_OF_MEMORY), errmsg("out of memory")));
	first = XLogFindNextRecord(reader, start);
	if (first == InvalidXLogRecPtr && reader_state.end_of_wal)
	{
		/*
		 * The horizon lies past the last record that survived a crash: modules before
		 * 2026-12-02 moved it up to the WAL insert position, which could be ahead of the
		 * flushed WAL. Every change below it was durable in the engine, and no change of ours
		 * was logged after the crash (backends wait for this replay), so none is missing.
		 */
		ereport(LOG,
				(errmsg("slipstream: no WAL record at or after %X/%X, the engine's durable "
						"horizon: nothing to replay", LSN_FORMAT_ARGS(start))));
		XLogReaderFree(reader);
		return 0;
	}
	if (first == InvalidXLogRecPtr)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("slipstream: no WAL record at or after %X/%X, the engine's durable "
						"horizon", LSN_FORMAT_ARGS(start))));
	XLogBeginRead(reader, first);
	while (reader->EndRecPtr < end || reader->EndRecPtr == InvalidXLogRecPtr)
	{
		char	   *errormsg = NULL;
		XLogRecord *rec = XLogReadRecord(reader, &errormsg);

		/*
		 * `end` is the WAL flushed when the caller looked, and the WAL writer flushes whole
		 * pages: a record that started below it may end past it. Such a record was logged
		 * after this start (the crash's torn tail was cut off by recovery), and none of ours
		 * can be, since backends wait for this replay: every record we must apply was read.
		 */
		if (rec == NULL && reader_state.end_of_wal)
			break;
		if (rec == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("slipstream: could not read WAL at %X/%X: %s",
							LSN_FORMAT_ARGS(reader->EndRecPtr),
							errormsg ? errormsg : "unknown error")));
		if (XLogRecGetRmid(reader) == SS_RMGR_ID)
		{
			ss_apply_record(reader);
			applied++;
		}
		CHECK_FOR_INTERRUPTS();
	}
	XLogReaderFree(reader);
	return applied;
}
