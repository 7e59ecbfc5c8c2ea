/*
 * tableam/scan.c: reading rows: sequential, TID-range, parallel, ANALYZE and TABLESAMPLE scans over
 * an engine iterator, and point fetches for index scans.
 *
 * An engine iterator is a C++ object: it is freed by scan_end, or by a memory-context reset
 * callback when an error ends the query first, so an ERROR never leaks one.
 */
#include "slipstream.h"

#include "access/relscan.h"
#include "access/tsmapi.h"
#include "access/xact.h"
#include "catalog/index.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "nodes/execnodes.h"
#include "pgstat.h"
#include "storage/predicate.h"
#include "utils/snapmgr.h"

/* Rows a parallel worker claims at a time. */
#define SS_PARALLEL_CHUNK (64 * SS_ROWS_PER_BLOCK)

/* Owner of an engine iterator, freed when its memory context goes away. */
typedef struct IteratorHolder
{
	SsIterator *it;
	MemoryContextCallback callback;
} IteratorHolder;

typedef struct SsScanDescData
{
	TableScanDescData base;
	uint32		keyspace;
	MemoryContext mcxt;			/* the scan's own context: iterators live there */
	IteratorHolder *holder;
	bool		positioned;
	uint64		range_start;	/* first row id to return */
	uint64		range_end;		/* one past the last (UINT64_MAX: no end) */
	uint64		current;		/* the row id returned last (where a turn starts) */
	bool		backward;		/* moving backward: block_rows holds rows below `bound` */
	uint64		bound;			/* backward: the rows still to return lie below it */
	/* ANALYZE and TABLESAMPLE: the rows of the current block. */
	HeapTuple	block_rows[SS_ROWS_PER_BLOCK];
	int			block_nrows;
	int			block_next;
	BlockNumber block;
	BlockNumber sample_next_block;
	BlockNumber sample_nblocks;
	uint64		counted_block;	/* the block a forward scan last counted as read, plus one */
	double		analyze_fraction;	/* ANALYZE: share of a block's row ids read (0: not chosen yet) */
	bool		every_row;		/* every stored row, redirects too (ss_scan_every_row) */
} SsScanDescData;
typedef SsScanDescData *SsScanDesc;

/* Parallel scans share a cursor over row ids. */
typedef struct SsParallelScanData
{
	ParallelTableScanDescData base;
	pg_atomic_uint64 next_rowid;
	uint64		end_rowid;
} SsParallelScanData;

/* Frees the iterator when its memory context is reset (errors included). */
static void
free_iterator_callback(void *arg)
{
	IteratorHolder *holder = (IteratorHolder *) arg;

	if (holder->it != NULL)
		ss_iter_free(holder->it);
	holder->it = NULL;
}

/* A new iterator owned by memory context `mcxt`. */
static IteratorHolder *
new_iterator(uint32 keyspace, MemoryContext mcxt)
{
	IteratorHolder *holder = MemoryContextAllocZero(mcxt, sizeof(IteratorHolder));

	holder->it = ss_iter_new(keyspace);
	if (holder->it == NULL)
		ss_report(SS_INTERNAL, "opening an iterator");
	holder->callback.func = free_iterator_callback;
	holder->callback.arg = holder;
	MemoryContextRegisterResetCallback(mcxt, &holder->callback);
	return holder;
}

/* Frees an iterator early (its holder stays until the context goes). */
static void
drop_iterator(IteratorHolder *holder)
{
	if (holder != NULL && holder->it != NULL)
	{
		ss_iter_free(holder->it);
		holder->it = NULL;
	}
}

/*
 * Positions the iterator at the first row id >= rowid, below `end` (PG_UINT64_MAX: no end).
 * The bound matters where VACUUM has removed many rows: the engine then stops at `end`
 * instead of walking their deletions to the next live row, so that reading a table block by
 * block (ANALYZE, bitmap and backward scans) costs one pass, not one pass per block.
 */
static void
seek_rowid(SsIterator *it, uint64 rowid, uint64 end)
{
	char		key[SS_KEY_SIZE];

	if (end == PG_UINT64_MAX)
		ss_iter_set_upper_bound(it, NULL, 0);
	else
	{
		ss_encode_key(end, key);
		ss_iter_set_upper_bound(it, key, SS_KEY_SIZE);
	}
	ss_encode_key(rowid, key);
	ss_iter_seek(it, key, SS_KEY_SIZE);
}

/* Row id at the iterator, after checking the iteration did not fail. */
static bool
iterator_row(SsIterator *it, uint64 *rowid)
{
	const char *key;
	size_t		len;
	SsCode		code;

	if (!ss_iter_valid(it))
	{
		code = ss_iter_status(it);
		if (code != SS_OK)
			ss_report(code, "scanning");
		return false;
	}
	ss_iter_key(it, &key, &len);
	if (len != SS_KEY_SIZE)
		ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED),
						errmsg("slipstream: a row key has %zu bytes instead of %d", len,
							   SS_KEY_SIZE)));
	*rowid = ss_decode_key(key);
	return true;
}

/* The tuple at the iterator, copied into `mcxt`. */
static HeapTuple
iterator_tuple(Relation rel, SsIterator *it, uint64 rowid, MemoryContext mcxt)
{
	const char *value;
	size_t		len;
	MemoryContext old = MemoryContextSwitchTo(mcxt);
	HeapTuple	tuple;

	ss_iter_value(it, &value, &len);
	tuple = ss_tuple_from_value(rel, rowid, value, len);
	MemoryContextSwitchTo(old);
	return tuple;
}

/* Reads a row into the slot's memory context (the slot frees it). */
static HeapTuple
fetch_for_slot(Relation rel, uint32 keyspace, uint64 rowid, TupleTableSlot *slot)
{
	MemoryContext old = MemoryContextSwitchTo(slot->tts_mcxt);
	HeapTuple	tuple = ss_fetch_row(rel, keyspace, rowid);

	MemoryContextSwitchTo(old);
	return tuple;
}

/*
 * Counts a block of rows read, for pg_statio's heap_blks_hit: our rows have no buffers, so a
 * 256-row block a scan reads (or the block of a row an index fetch reads) counts as a hit.
 */
static inline void
count_block_read(Relation rel)
{
	pgstat_count_buffer_read(rel);
	pgstat_count_buffer_hit(rel);
}

/* Frees the rows of the current block that were not handed out. */
static void
clear_block(SsScanDesc scan)
{
	for (int i = 0; i < scan->block_nrows; i++)
		if (scan->block_rows[i] != NULL)
			pfree(scan->block_rows[i]);
	scan->block_nrows = 0;
	scan->block_next = 0;
}

/*
 * Makes a scan return every stored row whatever its snapshot, the redirects of pruned chain
 * roots (tableam/chains.c) included, which scans skip otherwise: VACUUM, a copy of the stored
 * rows and index builds (which apply their snapshot along each chain) need them.
 */
void
ss_scan_every_row(TableScanDesc sscan)
{
	((SsScanDesc) sscan)->every_row = true;
}

/* Where a stored redirect's SS_HEAP_REDIRECT bit lies: the byte of t_infomask2 that holds it. */
static inline size_t
redirect_mark_offset(void)
{
	uint16		bit = SS_HEAP_REDIRECT;

	return offsetof(HeapTupleHeaderData, t_infomask2) + (((uint8 *) &bit)[0] != 0 ? 0 : 1);
}

/* The bit within that byte. */
static inline uint8
redirect_mark_mask(void)
{
	uint16		bit = SS_HEAP_REDIRECT;

	return ((uint8 *) &bit)[0] != 0 ? ((uint8 *) &bit)[0] : ((uint8 *) &bit)[1];
}

/*
 * Moves a forward scan that has returned a row on to the first row id >= `rowid`, and returns
 * how many rows it passed over, counted by their keys without reading their values: VACUUM
 * leaves out blocks the visibility map says hold nothing to do, but counts their rows for
 * pg_class.reltuples (tableam/vacuum.c). Redirects are not rows; the engine tells them apart
 * by their length and flag, which are in place beside their keys.
 */
uint64
ss_scan_skip_to(TableScanDesc sscan, uint64 rowid)
{
	SsScanDesc	scan = (SsScanDesc) sscan;
	char		key[SS_KEY_SIZE];
	uint64		passed;
	uint64		redirects = 0;
	uint64		at;

	Assert(scan->positioned && !scan->backward && scan->base.rs_parallel == NULL);
	CHECK_FOR_INTERRUPTS();
	ss_encode_key(rowid, key);
	passed = ss_iter_skip_to(scan->holder->it, key, SS_KEY_SIZE, SS_REDIRECT_SIZE,
							 redirect_mark_offset(), redirect_mark_mask(), &redirects);
	/* Reports a failed move or read; a row left at the iterator is the caller's next one. */
	(void) iterator_row(scan->holder->it, &at);
	return passed - Min(redirects, passed);
}

/* The snapshot a scan's rows are checked against. */
static inline Snapshot
scan_snapshot(SsScanDesc scan)
{
	return scan->every_row ? SnapshotAny : scan->base.rs_snapshot;
}

/*
 * Loads every row of one 256-row block into the scan (ANALYZE, TABLESAMPLE, bitmap and backward
 * scans), redirects only if `redirects`.
 */
static void
load_block(SsScanDesc scan, BlockNumber block, bool redirects)
{
	uint64		first = (uint64) block * SS_ROWS_PER_BLOCK;
	uint64		rowid;

	clear_block(scan);
	scan->block = block;
	count_block_read(scan->base.rs_rd);
	if (scan->holder == NULL || scan->holder->it == NULL)
		scan->holder = new_iterator(scan->keyspace, scan->mcxt);
	seek_rowid(scan->holder->it, first, first + SS_ROWS_PER_BLOCK);
	while (iterator_row(scan->holder->it, &rowid) && rowid < first + SS_ROWS_PER_BLOCK)
	{
		HeapTuple	tuple = iterator_tuple(scan->base.rs_rd, scan->holder->it, rowid,
										   scan->mcxt);

		ss_iter_next(scan->holder->it);
		if (!redirects && ss_is_redirect(tuple->t_data))
			pfree(tuple);
		else
			scan->block_rows[scan->block_nrows++] = tuple;
	}
}

/* Serializable: reads of this relation are covered by one relation-level predicate lock. */
static void
predicate_lock(Relation rel, Snapshot snapshot)
{
	if (snapshot != NULL && IsMVCCSnapshot(snapshot))
		PredicateLockRelation(rel, snapshot);
}

/* Serializable: reports a read of `tuple` that a concurrent writer may invalidate. */
void
ss_conflict_out(Relation rel, HeapTuple tuple, bool visible, Snapshot snapshot)
{
	TransactionId xid;

	if (!CheckForSerializableConflictOutNeeded(rel, snapshot))
		return;
	if (!visible)
		xid = HeapTupleHeaderGetXmin(tuple->t_data);
	else
	{
		xid = HeapTupleHeaderGetUpdateXid(tuple->t_data);
		if (tuple->t_data->t_infomask & HEAP_XMAX_INVALID ||
			HEAP_XMAX_IS_LOCKED_ONLY(tuple->t_data->t_infomask))
			return;
	}
	if (!TransactionIdIsValid(xid) || TransactionIdIsCurrentTransactionId(xid) ||
		!TransactionIdIsNormal(xid))
		return;
	if (TransactionIdPrecedes(xid, TransactionXmin))
		return;
	CheckForSerializableConflictOut(rel, xid, snapshot);
}

/*
 * Stores `tuple` (palloc'd, handed over) in `slot` if `snapshot` sees it, and tells SSI what
 * was read either way; an invisible tuple is freed and false returned. A chain member's root
 * link stays only for `keep_link` (VACUUM's scan of every row, which writes rows back).
 */
static bool
store_if_visible(Relation rel, HeapTuple tuple, Snapshot snapshot, TupleTableSlot *slot,
				 bool keep_link)
{
	bool		visible = ss_tuple_visible(tuple, snapshot);

	ss_conflict_out(rel, tuple, visible, snapshot);
	if (!visible)
	{
		pfree(tuple);
		return false;
	}
	if (!keep_link)
		ss_without_root_link(tuple);
	ExecStoreHeapTuple(tuple, slot, true);
	slot->tts_tableOid = RelationGetRelid(rel);
	return true;
}

/* Begins a scan of any kind. */
static TableScanDesc
ss_scan_begin(Relation rel, Snapshot snapshot, int nkeys, struct ScanKeyData *key,
			  ParallelTableScanDesc pscan, uint32 flags)
{
	SsScanDesc	scan = palloc0(sizeof(SsScanDescData));

	RelationIncrementReferenceCount(rel);
	scan->base.rs_rd = rel;
	scan->base.rs_snapshot = snapshot;
	scan->base.rs_nkeys = nkeys;
	scan->base.rs_key = key;
	scan->base.rs_flags = flags;
	scan->base.rs_parallel = pscan;
	scan->keyspace = ss_rel_keyspace(rel);
	scan->mcxt = CurrentMemoryContext;
	scan->range_end = PG_UINT64_MAX;
	if (flags & (SO_TYPE_SEQSCAN | SO_TYPE_SAMPLESCAN | SO_TYPE_TIDRANGESCAN |
				 SO_TYPE_BITMAPSCAN))
		predicate_lock(rel, snapshot);
	if (flags & SO_TYPE_ANALYZE)
		scan->holder = new_iterator(scan->keyspace, scan->mcxt);
	if (flags & SO_TYPE_SEQSCAN)
		pgstat_count_heap_scan(rel);
	return (TableScanDesc) scan;
}

/* Ends a scan and frees its iterator. */
static void
ss_scan_end(TableScanDesc sscan)
{
	SsScanDesc	scan = (SsScanDesc) sscan;

	drop_iterator(scan->holder);
	if (scan->base.rs_flags & SO_TEMP_SNAPSHOT)
		UnregisterSnapshot(scan->base.rs_snapshot);
	RelationDecrementReferenceCount(scan->base.rs_rd);
	pfree(scan);
}

/* Restarts a scan from the beginning (with a fresh engine snapshot). */
static void
ss_scan_rescan(TableScanDesc sscan, struct ScanKeyData *key, bool set_params, bool allow_strat,
			   bool allow_sync, bool allow_pagemode)
{
	SsScanDesc	scan = (SsScanDesc) sscan;

	drop_iterator(scan->holder);
	scan->holder = NULL;
	scan->positioned = false;
	clear_block(scan);
	scan->sample_next_block = 0;
	if (key != NULL && scan->base.rs_nkeys > 0)
		memcpy(scan->base.rs_key, key, scan->base.rs_nkeys * sizeof(ScanKeyData));
}

/* Claims the next chunk of row ids in a parallel scan; false when none is left. */
static bool
claim_parallel_chunk(SsScanDesc scan)
{
	SsParallelScanData *p = (SsParallelScanData *) scan->base.rs_parallel;
	uint64		start = pg_atomic_fetch_add_u64(&p->next_rowid, SS_PARALLEL_CHUNK);

	if (start >= p->end_rowid)
		return false;
	scan->range_start = start;
	scan->range_end = Min(start + SS_PARALLEL_CHUNK, p->end_rowid);
	seek_rowid(scan->holder->it, scan->range_start, scan->range_end);
	return true;
}

/* Forward: the next visible row after the one returned last (or from the range's start). */
static bool
next_forward(SsScanDesc scan, TupleTableSlot *slot)
{
	Relation	rel = scan->base.rs_rd;

	if (!scan->positioned)
	{
		scan->positioned = true;
		scan->backward = false;
		if (scan->base.rs_parallel != NULL)
		{
			if (!claim_parallel_chunk(scan))
				return false;
		}
		else
			seek_rowid(scan->holder->it, scan->range_start, scan->range_end);
	}
	else if (scan->backward)
	{
		/* Turning round: on from just after the row returned last. */
		clear_block(scan);
		scan->backward = false;
		seek_rowid(scan->holder->it, scan->current + 1, scan->range_end);
	}
	for (;;)
	{
		uint64		rowid;
		HeapTuple	tuple;

		CHECK_FOR_INTERRUPTS();
		if (!iterator_row(scan->holder->it, &rowid) || rowid >= scan->range_end)
		{
			if (scan->base.rs_parallel != NULL && claim_parallel_chunk(scan))
				continue;
			return false;
		}
		tuple = iterator_tuple(rel, scan->holder->it, rowid, slot->tts_mcxt);
		ss_iter_next(scan->holder->it);
		scan->current = rowid;
		if (rowid / SS_ROWS_PER_BLOCK + 1 != scan->counted_block)
		{
			scan->counted_block = rowid / SS_ROWS_PER_BLOCK + 1;
			count_block_read(rel);
		}
		if (ss_is_redirect(tuple->t_data) && !scan->every_row)
		{
			pfree(tuple);
			continue;
		}
		if (!store_if_visible(rel, tuple, scan_snapshot(scan), slot, scan->every_row))
			continue;
		pgstat_count_heap_getnext(rel);
		return true;
	}
}

/*
 * Backward: loads the rows of the block below row id `scan->bound` that lie in the scan's
 * range and below the bound, newest row id first, and moves the bound down to that block.
 * The engine iterates forward only, so a backward scan reads its range block by block.
 */
static void
load_block_below(SsScanDesc scan)
{
	BlockNumber block = (BlockNumber) ((scan->bound - 1) / SS_ROWS_PER_BLOCK);
	int			kept = 0;

	load_block(scan, block, scan->every_row);
	for (int i = 0; i < scan->block_nrows; i++)
	{
		uint64		rowid = ss_tid_to_rowid(&scan->block_rows[i]->t_self);

		if (rowid < scan->bound && rowid >= scan->range_start)
			scan->block_rows[kept++] = scan->block_rows[i];
		else
			pfree(scan->block_rows[i]);
	}
	scan->block_nrows = kept;
	for (int i = 0; i < kept / 2; i++)
	{
		HeapTuple	t = scan->block_rows[i];

		scan->block_rows[i] = scan->block_rows[kept - 1 - i];
		scan->block_rows[kept - 1 - i] = t;
	}
	scan->bound = Max((uint64) block * SS_ROWS_PER_BLOCK, scan->range_start);
}

/* Backward: the previous visible row before the one returned last (or from the range's end). */
static bool
next_backward(SsScanDesc scan, TupleTableSlot *slot)
{
	Relation	rel = scan->base.rs_rd;

	if (scan->base.rs_parallel != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("a parallel scan of a slipstream table cannot move backward")));
	if (!scan->positioned)
	{
		scan->positioned = true;
		scan->backward = true;
		clear_block(scan);
		scan->bound = scan->range_end != PG_UINT64_MAX ? scan->range_end
			: ss_rowid_high(rel, scan->keyspace);
	}
	else if (!scan->backward)
	{
		/* Turning round: the rows before the one returned last. */
		clear_block(scan);
		scan->backward = true;
		scan->bound = scan->current;
	}
	for (;;)
	{
		while (scan->block_next < scan->block_nrows)
		{
			HeapTuple	tuple = scan->block_rows[scan->block_next];

			scan->block_rows[scan->block_next++] = NULL;
			CHECK_FOR_INTERRUPTS();
			scan->current = ss_tid_to_rowid(&tuple->t_self);
			if (!store_if_visible(rel, tuple, scan_snapshot(scan), slot, scan->every_row))
				continue;
			pgstat_count_heap_getnext(rel);
			return true;
		}
		if (scan->bound <= scan->range_start)
			return false;
		load_block_below(scan);
	}
}

/*
 * The next visible row of the scan's range in `direction`, stored in `slot`. At either end the
 * scan is no longer positioned, as heap's: a move the other way starts from that end again.
 */
static bool
ss_scan_getnextslot(TableScanDesc sscan, ScanDirection direction, TupleTableSlot *slot)
{
	SsScanDesc	scan = (SsScanDesc) sscan;
	bool		found;

	if (scan->holder == NULL || scan->holder->it == NULL)
		scan->holder = new_iterator(scan->keyspace, scan->mcxt);
	if (ScanDirectionIsBackward(direction))
		found = next_backward(scan, slot);
	else
		found = next_forward(scan, slot);
	if (!found)
	{
		scan->positioned = false;
		clear_block(scan);
		ExecClearTuple(slot);
	}
	return found;
}

/* Restricts a TID range scan to [mintid, maxtid]. */
static void
ss_scan_set_tidrange(TableScanDesc sscan, ItemPointer mintid, ItemPointer maxtid)
{
	SsScanDesc	scan = (SsScanDesc) sscan;
	BlockNumber min_block = ItemPointerGetBlockNumberNoCheck(mintid);
	OffsetNumber min_off = ItemPointerGetOffsetNumberNoCheck(mintid);
	BlockNumber max_block = ItemPointerGetBlockNumberNoCheck(maxtid);
	OffsetNumber max_off = ItemPointerGetOffsetNumberNoCheck(maxtid);

	scan->range_start = (uint64) min_block * SS_ROWS_PER_BLOCK +
		(min_off == 0 ? 0 : Min(min_off - 1, SS_ROWS_PER_BLOCK));
	scan->range_end = (uint64) max_block * SS_ROWS_PER_BLOCK +
		Min((uint64) max_off, SS_ROWS_PER_BLOCK);
	scan->positioned = false;
}

/* The next visible row of a TID range scan. */
static bool
ss_scan_getnextslot_tidrange(TableScanDesc sscan, ScanDirection direction,
							 TupleTableSlot *slot)
{
	return ss_scan_getnextslot(sscan, direction, slot);
}

/* Shared-memory size of a parallel scan's state. */
static Size
ss_parallelscan_estimate(Relation rel)
{
	return sizeof(SsParallelScanData);
}

/* Sets up a parallel scan over every row id handed out so far. */
static Size
ss_parallelscan_initialize(Relation rel, ParallelTableScanDesc pscan)
{
	SsParallelScanData *p = (SsParallelScanData *) pscan;

	p->base.phs_relid = RelationGetRelid(rel);
	p->base.phs_syncscan = false;
	pg_atomic_init_u64(&p->next_rowid, 0);
	p->end_rowid = ss_rowid_high(rel, ss_rel_keyspace(rel));
	return sizeof(SsParallelScanData);
}

/* Rewinds a parallel scan. */
static void
ss_parallelscan_reinitialize(Relation rel, ParallelTableScanDesc pscan)
{
	SsParallelScanData *p = (SsParallelScanData *) pscan;

	pg_atomic_write_u64(&p->next_rowid, 0);
}

typedef struct SsIndexFetchData
{
	IndexFetchTableData base;
	uint32		keyspace;
	GlobalVisState *vistest;	/* the relation's horizons (a static of procarray.c's) */
	SsChainWalk walk;			/* the chain a fetch with a non-MVCC snapshot goes on along */
	SsQuietRange quiet;			/* row ids no memtable held (tableam/quiet_ranges.c) */
} SsIndexFetchData;

/* Begins fetching rows by TID for an index scan. */
static IndexFetchTableData *
ss_index_fetch_begin(Relation rel)
{
	SsIndexFetchData *fetch = palloc0(sizeof(SsIndexFetchData));

	fetch->base.rel = rel;
	fetch->keyspace = ss_rel_keyspace(rel);
	fetch->vistest = NULL;		/* looked up at the first fetch, under its snapshot */
	fetch->walk.next = SS_NO_ROWID;
	ss_quiet_reset(&fetch->quiet);
	return &fetch->base;
}

/* Forgets the chain a fetch was on, and the quiet range (a rescan starts elsewhere). */
static void
ss_index_fetch_reset(IndexFetchTableData *scan)
{
	SsIndexFetchData *fetch = (SsIndexFetchData *) scan;

	ss_chain_end(&fetch->walk);
	ss_quiet_reset(&fetch->quiet);
}

/* Ends an index fetch. */
static void
ss_index_fetch_end(IndexFetchTableData *scan)
{
	ss_index_fetch_reset(scan);
	pfree(scan);
}

/*
 * Fetches the version of the chain an index entry names (its root row id, tableam/chains.c)
 * that `snapshot` sees, and sets *tid to it. A non-MVCC snapshot may see several: *call_again
 * asks for the next. *all_dead lets the index drop entries whose whole chain is dead to
 * everyone. A walk that passed dead versions prunes the chain.
 */
static bool
ss_index_fetch_tuple(IndexFetchTableData *sscan, ItemPointer tid, Snapshot snapshot,
					 TupleTableSlot *slot, bool *call_again, bool *all_dead)
{
	SsIndexFetchData *fetch = (SsIndexFetchData *) sscan;
	Relation	rel = fetch->base.rel;
	GlobalVisState *vistest;
	bool		first_call = !*call_again;
	HeapTuple	root_tuple = NULL;
	HeapTuple	tuple;
	MemoryContext old;
	int			reads_before;

	*call_again = false;
	if (all_dead)
		*all_dead = false;
	/* Which horizons apply depends on the relation alone: one lookup serves every fetch. */
	if (fetch->vistest == NULL)
		fetch->vistest = GlobalVisTestFor(rel);
	vistest = fetch->vistest;
	old = MemoryContextSwitchTo(slot->tts_mcxt);
	if (first_call)
	{
		ss_chain_end(&fetch->walk);
		if (!ss_tid_valid(tid))
		{
			MemoryContextSwitchTo(old);
			return false;
		}
		ss_chain_start(&fetch->walk, rel, fetch->keyspace, ss_tid_to_rowid(tid), snapshot);
		/* Before the row is read: see tableam/quiet_ranges.c. */
		predicate_lock(rel, snapshot);
		/* A walk the chain cache starts past its root reads members, never in a quiet range. */
		if (!fetch->walk.from_cache)
			root_tuple = ss_quiet_fetch(&fetch->quiet, rel, fetch->keyspace,
										fetch->walk.root, snapshot);
		if (root_tuple != NULL)
			count_block_read(rel);
	}
	reads_before = fetch->walk.reads;
	tuple = ss_chain_next_visible(&fetch->walk, snapshot, root_tuple, vistest);
	MemoryContextSwitchTo(old);
	/* Each version read counts as a block access: a chain's versions live in other blocks. */
	for (int i = reads_before; i < fetch->walk.reads; i++)
		count_block_read(rel);
	if (first_call)
		ss_chain_prune_if_worth(&fetch->walk, snapshot, vistest);
	if (tuple == NULL)
	{
		if (all_dead)
			*all_dead = first_call && fetch->walk.all_dead;
		return false;
	}
	pgstat_count_heap_fetch(rel);
	*tid = tuple->t_self;
	*call_again = !IsMVCCSnapshot(snapshot);
	ExecStoreHeapTuple(ss_without_root_link(tuple), slot, true);
	slot->tts_tableOid = RelationGetRelid(rel);
	return true;
}

/* Fetches one row version by TID if `snapshot` sees it. */
static bool
ss_tuple_fetch_row_version(Relation rel, ItemPointer tid, Snapshot snapshot,
						   TupleTableSlot *slot)
{
	HeapTuple	tuple;

	if (!ss_tid_valid(tid))
		return false;
	tuple = fetch_for_slot(rel, ss_rel_keyspace(rel), ss_tid_to_rowid(tid), slot);
	if (tuple == NULL || !store_if_visible(rel, tuple, snapshot, slot, false))
		return false;
	/* A TID scan's read counts for SSI: a tuple-level predicate lock, as heap_fetch's. */
	PredicateLockTID(rel, &tuple->t_self, snapshot, HeapTupleHeaderGetXmin(tuple->t_data));
	return true;
}

/* Whether a TID can name a row of this relation. */
static bool
ss_tuple_tid_valid(TableScanDesc sscan, ItemPointer tid)
{
	SsScanDesc	scan = (SsScanDesc) sscan;

	return ss_tid_valid(tid) &&
		ss_tid_to_rowid(tid) < ss_rowid_high(scan->base.rs_rd, scan->keyspace);
}

/* Follows the update chain from *tid to the newest version the scan's snapshot sees. */
static void
ss_tuple_get_latest_tid(TableScanDesc sscan, ItemPointer tid)
{
	SsScanDesc	scan = (SsScanDesc) sscan;
	Relation	rel = scan->base.rs_rd;
	ItemPointerData current = *tid;
	TransactionId prior_xmax = InvalidTransactionId;

	for (;;)
	{
		HeapTuple	tuple;

		CHECK_FOR_INTERRUPTS();
		if (!ss_tid_valid(&current))
			return;
		tuple = ss_fetch_row(rel, scan->keyspace, ss_tid_to_rowid(&current));
		if (tuple == NULL)
			return;
		if (TransactionIdIsValid(prior_xmax) &&
			!TransactionIdEquals(prior_xmax, HeapTupleHeaderGetXmin(tuple->t_data)))
			return;
		if (ss_tuple_visible(tuple, scan->base.rs_snapshot))
			*tid = current;
		if ((tuple->t_data->t_infomask & HEAP_XMAX_INVALID) ||
			HEAP_XMAX_IS_LOCKED_ONLY(tuple->t_data->t_infomask) ||
			ItemPointerEquals(&tuple->t_self, &tuple->t_data->t_ctid))
			return;
		prior_xmax = HeapTupleHeaderGetUpdateXid(tuple->t_data);
		current = tuple->t_data->t_ctid;
		pfree(tuple);
	}
}

/* Whether the row in `slot` (one of ours) satisfies `snapshot`. */
static bool
ss_tuple_satisfies_snapshot(Relation rel, TupleTableSlot *slot, Snapshot snapshot)
{
	bool		should_free;
	HeapTuple	tuple = ExecFetchSlotHeapTuple(slot, false, &should_free);
	bool		visible = ss_tuple_visible(tuple, snapshot);

	if (should_free)
		heap_freetuple(tuple);
	return visible;
}

/*
 * ANALYZE of a big table: loads the rows at a random subset of a block's row ids, read one by
 * one (tableam/analyze.c), redirects left out.
 */
static void
load_block_sample(SsScanDesc scan, BlockNumber block)
{
	uint64		first = (uint64) block * SS_ROWS_PER_BLOCK;
	uint16		offsets[SS_ROWS_PER_BLOCK];
	int			count = ss_analyze_pick_offsets(scan->analyze_fraction, offsets);
	MemoryContext old = MemoryContextSwitchTo(scan->mcxt);

	clear_block(scan);
	scan->block = block;
	count_block_read(scan->base.rs_rd);
	for (int i = 0; i < count; i++)
	{
		HeapTuple	tuple = ss_fetch_row(scan->base.rs_rd, scan->keyspace, first + offsets[i]);

		CHECK_FOR_INTERRUPTS();
		if (tuple == NULL)
			continue;
		if (ss_is_redirect(tuple->t_data))
			pfree(tuple);
		else
			scan->block_rows[scan->block_nrows++] = tuple;
	}
	MemoryContextSwitchTo(old);
}

/*
 * ANALYZE: moves to a sampled block (always "exists": empty blocks just yield no rows), and
 * reads its rows, or a share of them in a big table.
 */
static bool
ss_scan_analyze_next_block(TableScanDesc sscan, BlockNumber blockno,
						   BufferAccessStrategy bstrategy)
{
	SsScanDesc	scan = (SsScanDesc) sscan;

	if (scan->analyze_fraction == 0)
	{
		uint64		high = ss_rowid_high(scan->base.rs_rd, scan->keyspace);

		scan->analyze_fraction = ss_analyze_row_fraction(scan->base.rs_rd,
														 (BlockNumber) ((high + SS_ROWS_PER_BLOCK - 1) / SS_ROWS_PER_BLOCK));
	}
	if (scan->analyze_fraction < 1)
		load_block_sample(scan, blockno);
	else
		load_block(scan, blockno, false);
	return true;
}

/*
 * ANALYZE: the next row of the block worth sampling, counting live and dead rows; each row of a
 * block read in part counts for the rows it stands for.
 */
static bool
ss_scan_analyze_next_tuple(TableScanDesc sscan, TransactionId oldest_xmin, double *liverows,
						   double *deadrows, TupleTableSlot *slot)
{
	SsScanDesc	scan = (SsScanDesc) sscan;
	double		weight = scan->analyze_fraction > 0 && scan->analyze_fraction < 1 ?
		1 / scan->analyze_fraction : 1;

	while (scan->block_next < scan->block_nrows)
	{
		HeapTuple	tuple = scan->block_rows[scan->block_next];
		TransactionId dead_after;
		bool		sample = false;

		scan->block_rows[scan->block_next++] = NULL;
		switch (ss_tuple_vacuum_state(tuple, oldest_xmin, &dead_after))
		{
			case HEAPTUPLE_LIVE:
				sample = true;
				*liverows += weight;
				break;
			case HEAPTUPLE_DEAD:
			case HEAPTUPLE_RECENTLY_DEAD:
				*deadrows += weight;
				break;
			case HEAPTUPLE_INSERT_IN_PROGRESS:
				/* Our own inserts count as live, as heap's ANALYZE does. */
				if (TransactionIdIsCurrentTransactionId(HeapTupleHeaderGetXmin(tuple->t_data)))
				{
					sample = true;
					*liverows += weight;
				}
				break;
			case HEAPTUPLE_DELETE_IN_PROGRESS:
				if (TransactionIdIsCurrentTransactionId(HeapTupleHeaderGetUpdateXid(tuple->t_data)))
					*deadrows += weight;
				else
				{
					sample = true;
					*liverows += weight;
				}
				break;
		}
		if (sample)
		{
			ExecStoreHeapTuple(ss_without_root_link(tuple), slot, true);
			slot->tts_tableOid = RelationGetRelid(scan->base.rs_rd);
			return true;
		}
		pfree(tuple);
	}
	ExecClearTuple(slot);
	return false;
}

/*
 * Bitmap scans: an exact page with at most this many offsets is read row by row (point reads);
 * a fuller one, or a lossy one, by one iterator pass over its 256 row ids.
 */
#define SS_BITMAP_POINT_READS 32

/*
 * Bitmap scan: the version of the chain rooted at `root` that the scan's snapshot sees, or NULL
 * (`root_tuple`, the root's row if already read, is handed over). Rows that are no chain roots
 * (heap-only versions) have no index entries, so a bitmap never names them.
 */
static HeapTuple
bitmap_visible_version(SsScanDesc scan, uint64 root, HeapTuple root_tuple)
{
	GlobalVisState *vistest = GlobalVisTestFor(scan->base.rs_rd);
	SsChainWalk walk;
	HeapTuple	tuple;

	ss_chain_start(&walk, scan->base.rs_rd, scan->keyspace, root, scan->base.rs_snapshot);
	tuple = ss_chain_next_visible(&walk, scan->base.rs_snapshot, root_tuple, vistest);
	ss_chain_end(&walk);
	ss_chain_prune_if_worth(&walk, scan->base.rs_snapshot, vistest);
	return tuple;
}

/*
 * Bitmap scan: loads the visible versions of the chains whose roots block `tbmres->blockno`
 * holds and the bitmap names (every root of the block when it is lossy); false if none.
 */
static bool
ss_scan_bitmap_next_block(TableScanDesc sscan, struct TBMIterateResult *tbmres)
{
	SsScanDesc	scan = (SsScanDesc) sscan;
	uint64		first = (uint64) tbmres->blockno * SS_ROWS_PER_BLOCK;
	MemoryContext old = MemoryContextSwitchTo(scan->mcxt);

	if (tbmres->ntuples >= 0 && tbmres->ntuples <= SS_BITMAP_POINT_READS)
	{
		clear_block(scan);
		scan->block = tbmres->blockno;
		count_block_read(scan->base.rs_rd);
		for (int i = 0; i < tbmres->ntuples; i++)
		{
			OffsetNumber off = tbmres->offsets[i];
			HeapTuple	tuple;

			if (off < 1 || off > SS_ROWS_PER_BLOCK)
				continue;		/* not a row id of ours: no such row */
			tuple = bitmap_visible_version(scan, first + off - 1, NULL);
			if (tuple != NULL)
				scan->block_rows[scan->block_nrows++] = tuple;
		}
	}
	else
	{
		/* One pass over the block; the bitmap's offsets (if exact) are in ascending order. */
		int			want = 0;
		int			kept = 0;

		load_block(scan, tbmres->blockno, true);
		for (int i = 0; i < scan->block_nrows; i++)
		{
			HeapTuple	tuple = scan->block_rows[i];
			OffsetNumber off = ItemPointerGetOffsetNumber(&tuple->t_self);

			scan->block_rows[i] = NULL;
			while (tbmres->ntuples >= 0 && want < tbmres->ntuples && tbmres->offsets[want] < off)
				want++;
			if (HeapTupleHeaderIsHeapOnly(tuple->t_data) ||
				(tbmres->ntuples >= 0 &&
				 (want >= tbmres->ntuples || tbmres->offsets[want] != off)))
			{
				pfree(tuple);
				continue;
			}
			tuple = bitmap_visible_version(scan, first + off - 1, tuple);
			if (tuple != NULL)
				scan->block_rows[kept++] = tuple;
		}
		scan->block_nrows = kept;
	}
	MemoryContextSwitchTo(old);
	return scan->block_nrows > 0;
}

/* Bitmap scan: the next visible version of the loaded block, stored in `slot`. */
static bool
ss_scan_bitmap_next_tuple(TableScanDesc sscan, struct TBMIterateResult *tbmres,
						  TupleTableSlot *slot)
{
	SsScanDesc	scan = (SsScanDesc) sscan;
	Relation	rel = scan->base.rs_rd;

	if (scan->block_next < scan->block_nrows)
	{
		HeapTuple	tuple = scan->block_rows[scan->block_next];

		scan->block_rows[scan->block_next++] = NULL;
		CHECK_FOR_INTERRUPTS();
		if (!scan->every_row)
			ss_without_root_link(tuple);
		ExecStoreHeapTuple(tuple, slot, true);
		slot->tts_tableOid = RelationGetRelid(rel);
		pgstat_count_heap_fetch(rel);
		return true;
	}
	ExecClearTuple(slot);
	return false;
}

/* TABLESAMPLE: moves to the next block the sampling method picks. */
static bool
ss_scan_sample_next_block(TableScanDesc sscan, struct SampleScanState *scanstate)
{
	SsScanDesc	scan = (SsScanDesc) sscan;
	TsmRoutine *tsm = scanstate->tsmroutine;
	BlockNumber block;

	if (scan->sample_next_block == 0 && !scan->positioned)
	{
		uint64		high = ss_rowid_high(scan->base.rs_rd, scan->keyspace);

		scan->sample_nblocks = (BlockNumber) ((high + SS_ROWS_PER_BLOCK - 1) / SS_ROWS_PER_BLOCK);
		scan->positioned = true;
	}
	if (tsm->NextSampleBlock)
		block = tsm->NextSampleBlock(scanstate, scan->sample_nblocks);
	else
		block = scan->sample_next_block < scan->sample_nblocks ? scan->sample_next_block
			: InvalidBlockNumber;
	if (!BlockNumberIsValid(block))
		return false;
	scan->sample_next_block = block + 1;
	load_block(scan, block, false);
	return true;
}

/* TABLESAMPLE: the next sampled visible row of the current block. */
static bool
ss_scan_sample_next_tuple(TableScanDesc sscan, struct SampleScanState *scanstate,
						  TupleTableSlot *slot)
{
	SsScanDesc	scan = (SsScanDesc) sscan;
	TsmRoutine *tsm = scanstate->tsmroutine;

	for (;;)
	{
		OffsetNumber off = tsm->NextSampleTuple(scanstate, scan->block, SS_ROWS_PER_BLOCK);
		HeapTuple	found = NULL;

		if (!OffsetNumberIsValid(off))
		{
			ExecClearTuple(slot);
			return false;
		}
		for (int i = 0; i < scan->block_nrows; i++)
		{
			if (scan->block_rows[i] != NULL &&
				ItemPointerGetOffsetNumber(&scan->block_rows[i]->t_self) == off)
			{
				found = scan->block_rows[i];
				break;
			}
		}
		if (found != NULL && ss_tuple_visible(found, scan->base.rs_snapshot))
		{
			MemoryContext old = MemoryContextSwitchTo(slot->tts_mcxt);
			HeapTuple	copy = heap_copytuple(found);

			MemoryContextSwitchTo(old);
			ExecStoreHeapTuple(ss_without_root_link(copy), slot, true);
			slot->tts_tableOid = RelationGetRelid(scan->base.rs_rd);
			return true;
		}
	}
}

/* Installs the callbacks of this file. */
void
ss_init_scan_callbacks(TableAmRoutine *am)
{
	am->scan_begin = ss_scan_begin;
	am->scan_end = ss_scan_end;
	am->scan_rescan = ss_scan_rescan;
	am->scan_getnextslot = ss_scan_getnextslot;
	am->scan_set_tidrange = ss_scan_set_tidrange;
	am->scan_getnextslot_tidrange = ss_scan_getnextslot_tidrange;
	am->parallelscan_estimate = ss_parallelscan_estimate;
	am->parallelscan_initialize = ss_parallelscan_initialize;
	am->parallelscan_reinitialize = ss_parallelscan_reinitialize;
	am->index_fetch_begin = ss_index_fetch_begin;
	am->index_fetch_reset = ss_index_fetch_reset;
	am->index_fetch_end = ss_index_fetch_end;
	am->index_fetch_tuple = ss_index_fetch_tuple;
	am->tuple_fetch_row_version = ss_tuple_fetch_row_version;
	am->tuple_tid_valid = ss_tuple_tid_valid;
	am->tuple_get_latest_tid = ss_tuple_get_latest_tid;
	am->tuple_satisfies_snapshot = ss_tuple_satisfies_snapshot;
	am->scan_analyze_next_block = ss_scan_analyze_next_block;
	am->scan_analyze_next_tuple = ss_scan_analyze_next_tuple;
	am->scan_bitmap_next_block = ss_scan_bitmap_next_block;
	am->scan_bitmap_next_tuple = ss_scan_bitmap_next_tuple;
	am->scan_sample_next_block = ss_scan_sample_next_block;
	am->scan_sample_next_tuple = ss_scan_sample_next_tuple;
}
