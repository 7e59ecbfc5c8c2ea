/*
 * tableam/rows.c: reading and writing single rows. Every write goes WAL first, then the engine,
 * inside the change brackets that let the worker compute the durable horizon (see host/horizon.c).
 */
#include "slipstream.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "utils/memutils.h"

/* Builds a palloc'd HeapTuple from a stored value. */
HeapTuple
ss_tuple_from_value(Relation rel, uint64 rowid, const char *value, size_t len)
{
	HeapTuple	tuple;

	if (len < SizeofHeapTupleHeader || len > MaxAllocSize - HEAPTUPLESIZE)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("slipstream: row " UINT64_FORMAT " of \"%s\" has an invalid length %zu",
						rowid, RelationGetRelationName(rel), len)));
	tuple = (HeapTuple) palloc(HEAPTUPLESIZE + len);
	tuple->t_len = (uint32) len;
	tuple->t_tableOid = RelationGetRelid(rel);
	tuple->t_data = (HeapTupleHeader) ((char *) tuple + HEAPTUPLESIZE);
	memcpy(tuple->t_data, value, len);
	ss_rowid_to_tid(rowid, &tuple->t_self);
	if (tuple->t_data->t_hoff < SizeofHeapTupleHeader || tuple->t_data->t_hoff > len)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("slipstream: row " UINT64_FORMAT " of \"%s\" has a corrupt header",
						rowid, RelationGetRelationName(rel))));
	return tuple;
}

/*
 * Makes `tuple` (handed over) a chain member that names its root, `root` (SS_HEAP_ROOT_LINK):
 * a copy with the root's row id past its columns.
 */
HeapTuple
ss_with_root_link(HeapTuple tuple, uint64 root)
{
	HeapTuple	linked;

	tuple = ss_without_root_link(tuple);
	linked = (HeapTuple) palloc(HEAPTUPLESIZE + tuple->t_len + SS_ROOT_LINK_SIZE);
	*linked = *tuple;
	linked->t_data = (HeapTupleHeader) ((char *) linked + HEAPTUPLESIZE);
	memcpy(linked->t_data, tuple->t_data, tuple->t_len);
	memcpy((char *) linked->t_data + tuple->t_len, &root, SS_ROOT_LINK_SIZE);
	linked->t_len = tuple->t_len + SS_ROOT_LINK_SIZE;
	linked->t_data->t_infomask2 |= SS_HEAP_ROOT_LINK;
	heap_freetuple(tuple);
	return linked;
}

/*
 * Drops a root link from a private tuple, in place: before a stored row leaves the table AM in
 * a slot (where PostgreSQL could copy it elsewhere, and TOAST would keep the header's bit but
 * not the bytes, or compare its length), and before a row is stored as one of its own (a
 * rewrite's copy). Only a heap-only version has link bytes to cut: a tuple that kept the bit
 * but lost its chain flags elsewhere loses the bit alone.
 */
HeapTuple
ss_without_root_link(HeapTuple tuple)
{
	HeapTupleHeader header = tuple->t_data;

	if ((header->t_infomask2 & SS_HEAP_ROOT_LINK) == 0)
		return tuple;
	if (HeapTupleHeaderIsHeapOnly(header) &&
		tuple->t_len >= (uint32) header->t_hoff + SS_ROOT_LINK_SIZE)
		tuple->t_len -= SS_ROOT_LINK_SIZE;
	header->t_infomask2 &= ~SS_HEAP_ROOT_LINK;
	return tuple;
}

/* Reads row `rowid`, from the levels alone if `past_memtables`; NULL if there is none. */
static HeapTuple
read_row(Relation rel, uint32 keyspace, uint64 rowid, bool past_memtables)
{
	char		key[SS_KEY_SIZE];
	const char *value;
	size_t		len;
	SsCode		code;

	ss_encode_key(rowid, key);
	code = past_memtables ? ss_get_past_memtables(keyspace, key, SS_KEY_SIZE, &value, &len)
		: ss_get(keyspace, key, SS_KEY_SIZE, &value, &len);
	if (code == SS_NOT_FOUND)
		return NULL;
	if (code != SS_OK)
		ss_report(code, "reading a row");
	return ss_tuple_from_value(rel, rowid, value, len);
}

/* Reads row `rowid` into a palloc'd tuple; NULL if there is no such row. */
HeapTuple
ss_fetch_row(Relation rel, uint32 keyspace, uint64 rowid)
{
	return read_row(rel, keyspace, rowid, false);
}

/*
 * Reads row `rowid` from the engine's levels alone, as of the moment the memtables were found
 * to hold none of its range (tableam/quiet_ranges.c); NULL if the levels lack it.
 */
HeapTuple
ss_fetch_row_past_memtables(Relation rel, uint32 keyspace, uint64 rowid)
{
	return read_row(rel, keyspace, rowid, true);
}

/*
 * Stores the tuple as row `rowid`: a new row (SS_ROW_PUT), or an existing row whose header
 * changed (the other kinds, which log the header only; a delete also logs the old key when
 * logical decoding needs it). A header change tells the engine that only the header differs
 * from the stored row, so a large row is not written again (the engine keeps the new header
 * beside a pointer to it).
 */
void
ss_write_row(Relation rel, uint32 keyspace, uint64 rowid, HeapTuple tuple, SsRowChange change)
{
	char		key[SS_KEY_SIZE];
	SsCode		code;

	ss_encode_key(rowid, key);
	if (ss_rel_needs_wal(rel))
	{
		XLogRecPtr	lsn;
		HeapTuple	old_key = change == SS_ROW_DELETE ?
			ss_logical_old_key(rel, tuple, NULL) : NULL;

		ss_change_begin();
		lsn = change == SS_ROW_PUT ? ss_log_put(rel, rowid, tuple)
			: ss_log_header(rel, rowid, tuple->t_data, change, old_key);
		ss_change_logged(lsn);
		if (old_key != NULL)
			heap_freetuple(old_key);
	}
	code = change == SS_ROW_PUT ? ss_put(keyspace, key, SS_KEY_SIZE, tuple->t_data, tuple->t_len)
		: ss_put_changed_prefix(keyspace, key, SS_KEY_SIZE, tuple->t_data, tuple->t_len,
								SS_HEADER_SIZE);
	ss_change_done();
	if (code != SS_OK)
		ss_report(code, "writing a row");
	/*
	 * A lock or a freeze changes what no snapshot sees; anything else may end all-visible, for
	 * the row's block and for its chain's root's, where index-only scans look.
	 */
	if (change != SS_ROW_HEADER)
	{
		uint64		rowids[2];
		int			n = 0;

		if (ss_member_root(tuple, &rowids[0]) && rowids[0] < rowid)
			n++;
		rowids[n++] = rowid;
		ss_vm_clear_rows(rel, rowids, n);
	}
}

/* Stores an update atomically: the old row's new header and the new version. */
void
ss_write_update(Relation rel, uint32 keyspace, HeapTuple old_tuple, uint64 new_rowid,
				HeapTuple new_tuple)
{
	uint64		old_rowid = ss_tid_to_rowid(&old_tuple->t_self);
	char		old_key[SS_KEY_SIZE];
	char		new_key[SS_KEY_SIZE];
	SsBatch    *batch = ss_batch_new();
	SsCode		code;

	if (batch == NULL)
		ss_report(SS_NO_MEMORY, "updating a row");
	ss_encode_key(old_rowid, old_key);
	ss_encode_key(new_rowid, new_key);
	ss_batch_put_changed_prefix(batch, keyspace, old_key, SS_KEY_SIZE, old_tuple->t_data,
								old_tuple->t_len, SS_HEADER_SIZE);
	ss_batch_put(batch, keyspace, new_key, SS_KEY_SIZE, new_tuple->t_data, new_tuple->t_len);
	if (ss_rel_needs_wal(rel))
	{
		HeapTuple	old_key = ss_logical_old_key(rel, old_tuple, new_tuple);

		ss_change_begin();
		ss_change_logged(ss_log_update(rel, old_rowid, old_tuple->t_data, new_rowid, new_tuple,
									   old_key));
		if (old_key != NULL)
			heap_freetuple(old_key);
	}
	code = ss_batch_write(batch);
	ss_change_done();
	ss_batch_free(batch);
	if (code != SS_OK)
		ss_report(code, "updating a row");
	{
		/* The old version's chain's root too: its block is where index-only scans look. */
		uint64		rowids[3];
		int			n = 0;

		if (ss_member_root(old_tuple, &rowids[0]) && rowids[0] < old_rowid)
			n++;
		rowids[n++] = old_rowid;
		rowids[n++] = new_rowid;
		ss_vm_clear_rows(rel, rowids, n);
	}
}

/* Stores many new rows atomically (multi-row inserts, COPY, and a rewrite's copies). */
void
ss_write_rows(Relation rel, uint32 keyspace, uint64 *rowids, HeapTuple *tuples, int ntuples,
			  bool rewrite)
{
	SsBatch    *batch;
	SsCode		code;
	char		key[SS_KEY_SIZE];
	size_t		bytes = 0;

	if (ntuples == 0)
		return;
	batch = ss_batch_new();
	if (batch == NULL)
		ss_report(SS_NO_MEMORY, "inserting rows");
	for (int i = 0; i < ntuples; i++)
		bytes += SS_KEY_SIZE + tuples[i]->t_len;
	ss_batch_reserve(batch, ntuples, bytes);
	for (int i = 0; i < ntuples; i++)
	{
		ss_encode_key(rowids[i], key);
		ss_batch_put(batch, keyspace, key, SS_KEY_SIZE, tuples[i]->t_data, tuples[i]->t_len);
	}
	if (ss_rel_needs_wal(rel))
	{
		ss_change_begin();
		ss_change_logged(ss_log_put_multi(rel, rowids, tuples, ntuples, rewrite));
	}
	code = ss_batch_write(batch);
	ss_change_done();
	ss_batch_free(batch);
	if (code != SS_OK)
		ss_report(code, "inserting rows");
	/* A rewrite fills a new file node, which has no visibility map yet. */
	if (!rewrite)
		ss_vm_clear_rows(rel, rowids, ntuples);
}

/* Removes rows for good (VACUUM, after their index entries are gone). */
void
ss_remove_rows(Relation rel, uint32 keyspace, uint64 *rowids, int nrowids)
{
	SsBatch    *batch;
	SsCode		code;
	char		key[SS_KEY_SIZE];

	if (nrowids == 0)
		return;
	batch = ss_batch_new();
	if (batch == NULL)
		ss_report(SS_NO_MEMORY, "removing rows");
	for (int i = 0; i < nrowids; i++)
	{
		ss_encode_key(rowids[i], key);
		ss_batch_delete(batch, keyspace, key, SS_KEY_SIZE);
	}
	if (ss_rel_needs_wal(rel))
	{
		ss_change_begin();
		ss_change_logged(ss_log_remove(rel, rowids, nrowids));
	}
	code = ss_batch_write(batch);
	ss_change_done();
	ss_batch_free(batch);
	if (code != SS_OK)
		ss_report(code, "removing rows");
}

/*
 * Prunes a chain in one atomic change: the root's redirect (a header-only row) replaces it and
 * the dead members go (tableam/chains.c). No visibility map bit changes: the root's block is
 * not all-visible while the chain has a version to prune (the update that ended the version
 * the old redirect named cleared it), and removing a row makes no block less visible.
 */
void
ss_write_prune(Relation rel, uint32 keyspace, uint64 root, HeapTupleHeader redirect,
			   uint64 *removed, int nremoved, TransactionId latest_removed)
{
	SsBatch    *batch = ss_batch_new();
	SsCode		code;
	char		key[SS_KEY_SIZE];

	if (batch == NULL)
		ss_report(SS_NO_MEMORY, "pruning a chain");
	ss_encode_key(root, key);
	ss_batch_put(batch, keyspace, key, SS_KEY_SIZE, redirect, SS_REDIRECT_SIZE);
	for (int i = 0; i < nremoved; i++)
	{
		ss_encode_key(removed[i], key);
		ss_batch_delete(batch, keyspace, key, SS_KEY_SIZE);
	}
	if (ss_rel_needs_wal(rel))
	{
		ss_change_begin();
		ss_change_logged(ss_log_prune(rel, root, redirect, removed, nremoved, latest_removed));
	}
	code = ss_batch_write(batch);
	ss_change_done();
	ss_batch_free(batch);
	if (code != SS_OK)
		ss_report(code, "pruning a chain");
}
