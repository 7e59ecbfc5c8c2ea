/*
 * tableam/vismap.c: the visibility map of slipstream tables, so that index-only scans skip the
 * table for blocks whose rows every transaction sees, as on heap.
 *
 * A block is 256 row ids (the block number of their ItemPointers), and the map is PostgreSQL's
 * own visibility map fork of the table's stub file, laid out as visibilitymap.c lays it out:
 * the executor (nodeIndexonlyscan.c, nodeBitmapHeapscan.c) and ANALYZE read it unchanged. Only
 * the all-visible bit is used.
 *
 * Heap keeps its map right with the heap page's lock and the page's PD_ALL_VISIBLE flag; our
 * rows have no pages, so the map page's own buffer lock orders the two sides:
 * - VACUUM sets a block's bit while holding the map page exclusively, after reading the
 *   block's rows again under that lock and finding every one visible to all.
 * - A writer, once its change is in the engine, reads the bit under a share lock and clears it
 *   if set. Either VACUUM's reading saw the change (and did not set the bit), or VACUUM set the
 *   bit before the writer looked (and the writer clears it).
 * Both log what they did (SS_XLOG_VM_SET / VM_CLEAR, the map page as block reference 0), and
 * the startup process redoes it, on a standby and in crash recovery alike. A writer's clear is
 * logged after its change but before it returns: a crash in between leaves the bit set over a
 * change whose transaction never committed, which no query can reach through an index.
 *
 * Writers must not pay for a map that does not exist. Each backend caches the map's size per
 * table, and ss_shared->vm_epoch, which VACUUM advances before it creates, extends or sets
 * anything in a map, says when that cache is stale.
 */
#include "slipstream.h"

#include "access/visibilitymap.h"
#include "access/xact.h"
#include "access/xloginsert.h"
#include "access/xlogutils.h"
#include "commands/vacuum.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/bufmgr.h"
#include "storage/smgr.h"
#include "storage/standby.h"

#include "host/wal_records.h"

/* The map's layout, as visibilitymap.c's (two bits per block). */
#define VM_MAPSIZE (BLCKSZ - MAXALIGN(SizeOfPageHeaderData))
#define VM_BLOCKS_PER_PAGE (VM_MAPSIZE * 4)
#define VM_PAGE(block) ((block) / VM_BLOCKS_PER_PAGE)
#define VM_BYTE(block) (((block) % VM_BLOCKS_PER_PAGE) / 4)
#define VM_SHIFT(block) (((block) % 4) * 2)

/* Whether block `block`'s all-visible bit is set on map page `page`. */
static bool
bit_is_set(Page page, BlockNumber block)
{
	uint8	   *map = (uint8 *) PageGetContents(page);

	return ((map[VM_BYTE(block)] >> VM_SHIFT(block)) & VISIBILITYMAP_ALL_VISIBLE) != 0;
}

/* Sets or clears the block's bits on the page. */
static void
change_bit(Page page, BlockNumber block, bool set)
{
	uint8	   *map = (uint8 *) PageGetContents(page);

	if (set)
		map[VM_BYTE(block)] |= VISIBILITYMAP_ALL_VISIBLE << VM_SHIFT(block);
	else
		map[VM_BYTE(block)] &= ~(VISIBILITYMAP_VALID_BITS << VM_SHIFT(block));
}

/* Sets or clears a block's bit on the exclusively locked map buffer, logging it. */
static void
log_change(Relation rel, Buffer buffer, BlockNumber block, bool set, TransactionId cutoff)
{
	Page		page = BufferGetPage(buffer);

	START_CRIT_SECTION();
	change_bit(page, block, set);
	MarkBufferDirty(buffer);
	if (RelationNeedsWAL(rel))
	{
		XlVisibility rec;
		XLogRecPtr	lsn;

		memset(&rec, 0, sizeof(rec));
		rec.tag = ss_tag(MyDatabaseId, rel->rd_node.relNode);
		rec.spc = rel->rd_node.spcNode;
		rec.block = block;
		rec.cutoff = cutoff;
		XLogBeginInsert();
		XLogRegisterData((char *) &rec, sizeof(rec));
		XLogRegisterBuffer(0, buffer, 0);
		lsn = XLogInsert(SS_RMGR_ID, set ? SS_XLOG_VM_SET : SS_XLOG_VM_CLEAR);
		PageSetLSN(page, lsn);
	}
	END_CRIT_SECTION();
}

/*
 * Whether the table's map has page `map_page`, from this backend's cache while no VACUUM has
 * touched any map since it was filled.
 */
static bool
map_has_page(Relation rel, BlockNumber map_page)
{
	SsRelCache *cache = ss_rel_cache(rel);
	uint64		epoch;

	/* The change is in the engine before the epoch is read (see the top). */
	pg_memory_barrier();
	epoch = pg_atomic_read_u64(&ss_shared->vm_epoch);
	if (!cache->vm_known || cache->vm_epoch != epoch)
	{
		SMgrRelation smgr = RelationGetSmgr(rel);

		cache->vm_pages = smgrexists(smgr, VISIBILITYMAP_FORKNUM) ?
			smgrnblocks(smgr, VISIBILITYMAP_FORKNUM) : 0;
		cache->vm_epoch = epoch;
		cache->vm_known = true;
	}
	return map_page < cache->vm_pages;
}

/*
 * After a change to rows `rowids` is in the engine: clears the all-visible bits of their blocks.
 * Callers pass ascending row ids (a batch's, or an update's old then new version), so each map
 * page and each block is met once in a row.
 */
void
ss_vm_clear_rows(Relation rel, const uint64 *rowids, int nrowids)
{
	Buffer		buffer = InvalidBuffer;
	BlockNumber buffer_page = InvalidBlockNumber;
	BlockNumber last_block = InvalidBlockNumber;

	for (int i = 0; i < nrowids; i++)
	{
		BlockNumber block = (BlockNumber) (rowids[i] / SS_ROWS_PER_BLOCK);
		BlockNumber page_no = VM_PAGE(block);
		bool		set;

		if (block == last_block)
			continue;
		last_block = block;
		if (page_no != buffer_page)
		{
			if (BufferIsValid(buffer))
				ReleaseBuffer(buffer);
			buffer = InvalidBuffer;
			buffer_page = page_no;
			if (map_has_page(rel, page_no))
				buffer = ReadBufferExtended(rel, VISIBILITYMAP_FORKNUM, page_no,
											RBM_ZERO_ON_ERROR, NULL);
		}
		if (!BufferIsValid(buffer))
			continue;
		LockBuffer(buffer, BUFFER_LOCK_SHARE);
		set = !PageIsNew(BufferGetPage(buffer)) && bit_is_set(BufferGetPage(buffer), block);
		LockBuffer(buffer, BUFFER_LOCK_UNLOCK);
		if (!set)
			continue;
		LockBuffer(buffer, BUFFER_LOCK_EXCLUSIVE);
		if (bit_is_set(BufferGetPage(buffer), block))
			log_change(rel, buffer, block, false, InvalidTransactionId);
		LockBuffer(buffer, BUFFER_LOCK_UNLOCK);
	}
	if (BufferIsValid(buffer))
		ReleaseBuffer(buffer);
}

/*
 * Whether a row, in VACUUM's state `state`, is visible to every transaction now and to come:
 * live, and inserted before `oldest_xmin` (or frozen). Both VACUUM's first guess and the check
 * under the map page's lock use it.
 */
bool
ss_vm_row_all_visible(HeapTuple tuple, HTSV_Result state, TransactionId oldest_xmin)
{
	return state == HEAPTUPLE_LIVE &&
		(HeapTupleHeaderXminFrozen(tuple->t_data) ||
		 TransactionIdPrecedes(HeapTupleHeaderGetXmin(tuple->t_data), oldest_xmin));
}

/* Moves `cutoff` to `tuple`'s xmin if that is newer and not frozen. */
static void
advance_cutoff(HeapTuple tuple, TransactionId *cutoff)
{
	TransactionId xmin;

	if (HeapTupleHeaderXminFrozen(tuple->t_data))
		return;
	xmin = HeapTupleHeaderGetXmin(tuple->t_data);
	if (!TransactionIdIsValid(*cutoff) || TransactionIdFollows(xmin, *cutoff))
		*cutoff = xmin;
}

/*
 * Whether the chain of redirect `redirect` (root `root`) holds one version, visible to every
 * transaction, that names the root: every change to that version then clears the root's
 * block first (tableam/rows.c), so an index-only scan may trust the root's block for it.
 * A version stored before members named their roots keeps the block off the map, as before.
 */
static bool
redirect_all_visible(Relation rel, uint32 keyspace, uint64 root, HeapTuple redirect,
					 TransactionId oldest_xmin, TransactionId *cutoff)
{
	uint64		target = ss_redirect_target(rel, redirect);
	uint64		named_root;
	HeapTuple	member;
	TransactionId dead_after;
	bool		visible;

	if (target == SS_NO_ROWID)
		return false;
	member = ss_fetch_row(rel, keyspace, target);
	if (member == NULL)
		return false;
	visible = ss_member_root(member, &named_root) && named_root == root &&
		ss_vm_row_all_visible(member, ss_tuple_vacuum_state(member, oldest_xmin, &dead_after),
							  oldest_xmin);
	if (visible)
		advance_cutoff(member, cutoff);
	pfree(member);
	return visible;
}

/*
 * Whether every row of `block` is visible to every transaction, now and to come
 * (ss_vm_row_all_visible), a redirect counting by the version it names. `cutoff` gets the
 * newest xmin among them that is not frozen.
 */
static bool
block_all_visible(Relation rel, uint32 keyspace, BlockNumber block, TransactionId oldest_xmin,
				  TransactionId *cutoff)
{
	uint64		first = (uint64) block * SS_ROWS_PER_BLOCK;
	uint64		end = first + SS_ROWS_PER_BLOCK;
	char		key[SS_KEY_SIZE];
	SsIterator *it = ss_iter_new(keyspace);
	volatile bool visible = true;

	*cutoff = InvalidTransactionId;
	if (it == NULL)
		ss_report(SS_INTERNAL, "opening an iterator");
	PG_TRY();
	{
		ss_encode_key(end, key);
		ss_iter_set_upper_bound(it, key, SS_KEY_SIZE);
		ss_encode_key(first, key);
		for (ss_iter_seek(it, key, SS_KEY_SIZE); ss_iter_valid(it) && visible;
			 ss_iter_next(it))
		{
			const char *k;
			const char *value;
			size_t		klen;
			size_t		vlen;
			uint64		rowid;
			HeapTuple	tuple;
			TransactionId dead_after;

			ss_iter_key(it, &k, &klen);
			if (klen != SS_KEY_SIZE)
				break;
			rowid = ss_decode_key(k);
			if (rowid >= end)
				break;
			ss_iter_value(it, &value, &vlen);
			tuple = ss_tuple_from_value(rel, rowid, value, vlen);
			if (ss_is_redirect(tuple->t_data))
				visible = redirect_all_visible(rel, keyspace, rowid, tuple, oldest_xmin, cutoff);
			else if (!ss_vm_row_all_visible(tuple, ss_tuple_vacuum_state(tuple, oldest_xmin,
																		  &dead_after),
											oldest_xmin))
				visible = false;
			else
				advance_cutoff(tuple, cutoff);
			pfree(tuple);
		}
		if (visible && ss_iter_status(it) != SS_OK)
			ss_report(ss_iter_status(it), "reading a block");
	}
	PG_FINALLY();
	{
		ss_iter_free(it);
	}
	PG_END_TRY();
	return visible;
}

/*
 * VACUUM: sets the all-visible bit of every block of the table whose rows all are visible to
 * everyone, and clears it where they are not (a change whose transaction never committed, see
 * the top). `candidate(block)` is VACUUM's first guess from its scan: blocks it rules out are
 * not read again. Returns the number of all-visible blocks, for pg_class.relallvisible.
 */
BlockNumber
ss_vm_update(Relation rel, uint32 keyspace, TransactionId oldest_xmin, const bool *candidate,
			 BlockNumber nblocks, BufferAccessStrategy strategy)
{
	Buffer		buffer = InvalidBuffer;
	BlockNumber visible = 0;

	/* Before the map is created, extended or set: writers must look again (see the top). */
	pg_atomic_fetch_add_u64(&ss_shared->vm_epoch, 1);
	for (BlockNumber block = 0; block < nblocks; block++)
	{
		TransactionId cutoff;
		bool		set;

		vacuum_delay_point();
		visibilitymap_pin(rel, block, &buffer);
		LockBuffer(buffer, BUFFER_LOCK_EXCLUSIVE);
		set = bit_is_set(BufferGetPage(buffer), block);
		/*
		 * A bit still set was set by an earlier VACUUM after reading the block, and every change
		 * since would have cleared it (writers wait for this lock): no need to read it again.
		 */
		if (candidate[block] && set)
			visible++;
		else if (candidate[block] &&
				 block_all_visible(rel, keyspace, block, oldest_xmin, &cutoff))
		{
			if (!set)
				log_change(rel, buffer, block, true, cutoff);
			visible++;
		}
		else if (set)
			log_change(rel, buffer, block, false, InvalidTransactionId);
		LockBuffer(buffer, BUFFER_LOCK_UNLOCK);
	}
	if (BufferIsValid(buffer))
		ReleaseBuffer(buffer);
	return visible;
}

/* Redo of a map change, in the startup process (a standby, or crash recovery). */
void
ss_vm_redo(XLogReaderState *record)
{
	uint8		info = XLogRecGetInfo(record) & ~XLR_INFO_MASK;
	XlVisibility rec;
	Buffer		buffer;

	if (XLogRecGetDataLen(record) < sizeof(rec))
		ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED),
						errmsg("slipstream: WAL record at %X/%X is too short",
							   LSN_FORMAT_ARGS(record->ReadRecPtr))));
	memcpy(&rec, XLogRecGetData(record), sizeof(rec));
	if (info == SS_XLOG_VM_SET && InHotStandby && TransactionIdIsValid(rec.cutoff))
	{
		RelFileNode node;

		XLogRecGetBlockTag(record, 0, &node, NULL, NULL);
		ResolveRecoveryConflictWithSnapshot(rec.cutoff, node);
	}
	if (XLogReadBufferForRedoExtended(record, 0, RBM_ZERO_ON_ERROR, false, &buffer) ==
		BLK_NEEDS_REDO)
	{
		Page		page = BufferGetPage(buffer);

		if (PageIsNew(page))
			PageInit(page, BLCKSZ, 0);
		change_bit(page, rec.block, info == SS_XLOG_VM_SET);
		PageSetLSN(page, record->EndRecPtr);
		MarkBufferDirty(buffer);
	}
	if (BufferIsValid(buffer))
		UnlockReleaseBuffer(buffer);
}

/*
 * COPY FREEZE and REFRESH MATERIALIZED VIEW insert frozen rows (TABLE_INSERT_FROZEN) into a
 * file node created in this subtransaction, which no other backend can reach. As heap does for
 * the pages it fills that way, the blocks those rows fill are marked all-visible at once, so
 * the VACUUM that follows a load has nothing to read there (pgbench -i's took 4-6 times heap's
 * time without this). Only blocks whose every row id came from one unbroken run of frozen
 * inserts count: rows the transaction inserted otherwise (not frozen) are left to VACUUM. A
 * later change in the same transaction clears its block's bit as any change does.
 */
typedef struct FrozenRun
{
	Oid			relid;
	RelFileNode node;
	TransactionId xid;			/* the loading transaction: a run never outlives it */
	uint64		start;			/* first row id of the run */
	uint64		end;			/* one past its last */
	BlockNumber map_pages;		/* map pages known to exist (the run created them) */
} FrozenRun;

static FrozenRun frozen_run;

/* Sets the all-visible bits of blocks first..last (inclusive), logging each one it changes. */
static void
set_blocks(Relation rel, BlockNumber first, BlockNumber last)
{
	Buffer		buffer = InvalidBuffer;

	/*
	 * Before the map is created or extended, writers must look again (see the top). Setting
	 * bits on pages that exist needs no such notice here: no other backend can write to this
	 * file node, and this one's writers read the bits of pages they know.
	 */
	if (VM_PAGE(last) >= frozen_run.map_pages)
	{
		pg_atomic_fetch_add_u64(&ss_shared->vm_epoch, 1);
		frozen_run.map_pages = VM_PAGE(last) + 1;
	}
	for (BlockNumber block = first; block <= last; block++)
	{
		visibilitymap_pin(rel, block, &buffer);
		LockBuffer(buffer, BUFFER_LOCK_EXCLUSIVE);
		/* Frozen rows conflict with no standby query: no cutoff. */
		if (!bit_is_set(BufferGetPage(buffer), block))
			log_change(rel, buffer, block, true, InvalidTransactionId);
		LockBuffer(buffer, BUFFER_LOCK_UNLOCK);
	}
	if (BufferIsValid(buffer))
		ReleaseBuffer(buffer);
}

/*
 * After frozen rows first..first+count-1 are in the engine: marks the blocks they complete,
 * within the run of frozen row ids they continue (or start).
 */
void
ss_vm_note_frozen_rows(Relation rel, uint64 first, uint32 count)
{
	uint64		done;
	uint64		first_block;
	uint64		end_block;

	if (count == 0)
		return;
	if (frozen_run.relid != RelationGetRelid(rel) ||
		!RelFileNodeEquals(frozen_run.node, rel->rd_node) ||
		frozen_run.xid != GetTopTransactionIdIfAny() || frozen_run.end != first)
	{
		frozen_run.relid = RelationGetRelid(rel);
		frozen_run.node = rel->rd_node;
		frozen_run.xid = GetTopTransactionIdIfAny();
		frozen_run.start = first;
		frozen_run.map_pages = 0;
	}
	done = first;
	frozen_run.end = first + count;
	/* Blocks that start inside the run, and end inside it for the first time now. */
	first_block = Max((frozen_run.start + SS_ROWS_PER_BLOCK - 1) / SS_ROWS_PER_BLOCK,
					  done / SS_ROWS_PER_BLOCK);
	end_block = frozen_run.end / SS_ROWS_PER_BLOCK;
	if (first_block < end_block)
		set_blocks(rel, (BlockNumber) first_block, (BlockNumber) (end_block - 1));
}

/*
 * At the end of a frozen load: marks the run's last, partly filled block too (a later insert
 * into it clears the bit, as after a VACUUM).
 */
void
ss_vm_finish_frozen_rows(Relation rel)
{
	uint64		last_block;

	if (frozen_run.relid != RelationGetRelid(rel) ||
		!RelFileNodeEquals(frozen_run.node, rel->rd_node) ||
		frozen_run.xid != GetTopTransactionIdIfAny() ||
		frozen_run.end % SS_ROWS_PER_BLOCK == 0)
		return;
	last_block = frozen_run.end / SS_ROWS_PER_BLOCK;
	if (last_block * SS_ROWS_PER_BLOCK >= frozen_run.start)
		set_blocks(rel, (BlockNumber) last_block, (BlockNumber) last_block);
}

/* After the table's map was truncated in place: every backend must look at it again. */
void
ss_vm_forget(void)
{
	pg_atomic_fetch_add_u64(&ss_shared->vm_epoch, 1);
}
