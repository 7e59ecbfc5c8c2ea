/*
 * tableam/ddl.c: storage life cycle (CREATE, TRUNCATE, rewrites), CLUSTER / VACUUM FULL copies,
 * index builds and validation, and the size figures the planner and ANALYZE use.
 *
 * Each relation file node has an (empty) md file besides its keyspace: PostgreSQL's own
 * pending-delete machinery then removes it on DROP, TRUNCATE, rewrite or abort, and the worker
 * drops keyspaces whose file is gone (see host/worker.c). PostgreSQL never reuses a relfilenode
 * whose file exists, so a keyspace met again under a new relation is stale and is dropped.
 */
#include "slipstream.h"

#include <math.h>

#include "access/genam.h"

#include "access/heaptoast.h"
#include "access/multixact.h"
#include "access/relscan.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/index.h"
#include "catalog/pg_am_d.h"
#include "catalog/storage.h"
#include "catalog/storage_xlog.h"
#include "commands/progress.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "optimizer/plancat.h"
#include "pgstat.h"
#include "storage/bufmgr.h"
#include "storage/procarray.h"
#include "storage/smgr.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "utils/tuplesort.h"

/* Rows written per engine batch while copying. */
#define SS_COPY_BATCH 512

/* The 256-row-id blocks a scan of `rel` may meet: up to the row id high-water mark. */
static BlockNumber
rowid_blocks(Relation rel, uint32 keyspace)
{
	uint64		high = ss_rowid_high(rel, keyspace);

	return (BlockNumber) Min((high + SS_ROWS_PER_BLOCK - 1) / SS_ROWS_PER_BLOCK, MaxBlockNumber);
}

/*
 * Reports to a progress view (`param`: blocks scanned or done) the block of the row a scan has
 * reached, counted from `first`, when it moved on; `last` keeps what was reported.
 */
static void
report_block_reached(int param, ItemPointer tid, BlockNumber first, BlockNumber *last)
{
	BlockNumber block = ItemPointerGetBlockNumber(tid);
	BlockNumber done = block >= first ? block - first : 0;

	if (done > *last || *last == InvalidBlockNumber)
	{
		pgstat_progress_update_param(param, done);
		*last = done;
	}
}

/*
 * Starts an empty keyspace for a new file node whose main file is `own_path`, dropping a stale
 * one with the same tag. Keyspaces are tagged by database and relfilenode, while PostgreSQL
 * checks only the tablespace and persistence it creates a file in when it picks a new
 * relfilenode: so (after OID wraparound) another tablespace or persistence may already use the
 * number, and then its keyspace is live, not stale.
 */
static void
fresh_keyspace(uint64 tag, bool wal, const char *own_path)
{
	uint32		stale;

	ss_engine_ready();
	stale = ss_keyspace_for_tag(tag, false);
	if (stale != 0)
	{
		if (ss_relnode_has_files((Oid) (tag >> 32), (Oid) (tag & 0xffffffff),
								 SS_FILES_MAIN | SS_FILES_TEMP, own_path))
			ereport(ERROR,
					(errcode(ERRCODE_DUPLICATE_OBJECT),
					 errmsg("slipstream: relfilenode %u is in use by a relation in another "
							"tablespace or of another persistence", (Oid) (tag & 0xffffffff)),
					 errhint("Retry the command: the next attempt picks another file node.")));
		SS_CHECK(ss_keyspace_drop(stale), "dropping a stale keyspace");
	}
	ss_forget_rowids(tag);
	if (wal)
	{
		ss_change_begin();
		ss_change_logged(ss_log_reset(tag));
		ss_change_done();
	}
	(void) ss_keyspace_for_tag(tag, true);
}

/* Forgets the cached keyspace of a relation. */
static void
forget_cached_keyspace(Relation rel)
{
	if (rel->rd_amcache != NULL)
		pfree(rel->rd_amcache);
	rel->rd_amcache = NULL;
}

/* Creates the empty md files of a new file node: the main fork, and an unlogged table's init fork. */
static void
create_stub_files(const RelFileNode *rnode, char persistence)
{
	SMgrRelation srel = RelationCreateStorage(*rnode, persistence, true);

	if (persistence == RELPERSISTENCE_UNLOGGED)
	{
		/* The init fork tells PostgreSQL (and the worker after a crash) to empty it. */
		smgrcreate(srel, INIT_FORKNUM, false);
		log_smgrcreate(rnode, INIT_FORKNUM);
		smgrimmedsync(srel, INIT_FORKNUM);
	}
	smgrclose(srel);
}

/* The path of the main file of file node `rnode` with persistence `persistence`. */
static char *
main_file_path(const RelFileNode *rnode, char persistence)
{
	return relpathbackend(*rnode, persistence == RELPERSISTENCE_TEMP ?
						  BackendIdForTempRelations() : InvalidBackendId, MAIN_FORKNUM);
}

/* CREATE TABLE, TRUNCATE and rewrites: new, empty storage under a new file node. */
static void
ss_relation_set_new_filenode(Relation rel, const RelFileNode *newrnode, char persistence,
							 TransactionId *freeze_xid, MultiXactId *minmulti)
{
	char	   *path;

	*freeze_xid = RecentXmin;
	*minmulti = GetOldestMultiXactId();
	create_stub_files(newrnode, persistence);
	path = main_file_path(newrnode, persistence);
	fresh_keyspace(ss_tag(MyDatabaseId, newrnode->relNode),
				   persistence == RELPERSISTENCE_PERMANENT, path);
	pfree(path);
	forget_cached_keyspace(rel);
}

/* TRUNCATE of a table created in the same transaction: empty it in place. */
static void
ss_relation_nontransactional_truncate(Relation rel)
{
	uint64		tag = ss_tag(MyDatabaseId, rel->rd_node.relNode);
	char	   *path = main_file_path(&rel->rd_node, rel->rd_rel->relpersistence);

	fresh_keyspace(tag, ss_rel_needs_wal(rel), path);
	pfree(path);
	/* The visibility map (and any other fork) goes too, WAL-logged as for heap. */
	RelationTruncate(rel, 0);
	ss_vm_forget();
	forget_cached_keyspace(rel);
}

/*
 * ALTER TABLE ... SET TABLESPACE: the table's files move to the new tablespace, and its rows
 * to the keyspace of the new file node, every stored version as it is, under the same row ids
 * (the indexes move unchanged and keep pointing at them). The engine keeps the rows in its own
 * files under the data directory whatever the tablespace (docs/extension.md, "Storage model").
 * The old file is removed at commit and its keyspace swept then; on abort, the new one's.
 */
static void
ss_relation_copy_data(Relation rel, const RelFileNode *newrnode)
{
	char		persistence = rel->rd_rel->relpersistence;
	RelationData target = *rel;
	uint32		new_keyspace;
	TableScanDesc scan;
	TupleTableSlot *slot;
	HeapTuple	batch[SS_COPY_BATCH];
	uint64		batch_rowids[SS_COPY_BATCH];
	int			nbatch = 0;
	char	   *path;

	create_stub_files(newrnode, persistence);
	path = main_file_path(newrnode, persistence);
	fresh_keyspace(ss_tag(MyDatabaseId, newrnode->relNode), ss_rel_needs_wal(rel), path);
	pfree(path);

	/* The rows are written as the relation's under its new file node. */
	target.rd_node = *newrnode;
	target.rd_amcache = NULL;
	new_keyspace = ss_rel_keyspace(&target);

	slot = table_slot_create(rel, NULL);
	scan = table_beginscan(rel, SnapshotAny, 0, NULL);
	ss_scan_every_row(scan);	/* chains keep their shape: the indexes move as they are */
	for (;;)
	{
		bool		have = table_scan_getnextslot(scan, ForwardScanDirection, slot);

		CHECK_FOR_INTERRUPTS();
		if (have)
		{
			batch[nbatch] = ExecCopySlotHeapTuple(slot);
			batch_rowids[nbatch] = ss_tid_to_rowid(&batch[nbatch]->t_self);
			nbatch++;
		}
		if (nbatch == SS_COPY_BATCH || (!have && nbatch > 0))
		{
			ss_write_rows(&target, new_keyspace, batch_rowids, batch, nbatch, true);
			for (int i = 0; i < nbatch; i++)
				heap_freetuple(batch[i]);
			nbatch = 0;
		}
		if (!have)
			break;
	}
	table_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	if (target.rd_amcache != NULL)
		pfree(target.rd_amcache);
	RelationDropStorage(rel);
}

/* Freezes what the cutoffs allow in a row about to be copied (CLUSTER, VACUUM FULL). */
static void
freeze_copied_row(HeapTupleHeader tuple, TransactionId xid_cutoff, MultiXactId multi_cutoff)
{
	TransactionId xmin = HeapTupleHeaderGetRawXmin(tuple);

	if (!HeapTupleHeaderXminFrozen(tuple) && TransactionIdIsNormal(xmin) &&
		TransactionIdPrecedes(xmin, xid_cutoff) && TransactionIdDidCommit(xmin))
		tuple->t_infomask |= HEAP_XMIN_FROZEN;
	if (!(tuple->t_infomask & HEAP_XMAX_INVALID) && HEAP_XMAX_IS_LOCKED_ONLY(tuple->t_infomask))
	{
		TransactionId xmax = HeapTupleHeaderGetRawXmax(tuple);
		bool		running = (tuple->t_infomask & HEAP_XMAX_IS_MULTI)
			? MultiXactIdIsRunning(xmax, true)
			: TransactionIdIsInProgress(xmax);

		if (!running)
		{
			tuple->t_infomask &= ~HEAP_XMAX_BITS;
			tuple->t_infomask |= HEAP_XMAX_INVALID;
			tuple->t_infomask2 &= ~HEAP_KEYS_UPDATED;
			HeapTupleHeaderSetXmax(tuple, InvalidTransactionId);
		}
	}
}

/*
 * The successor of a version a rewrite keeps (the version that one's update made): its old row
 * id, its new one once the rewrite gives it (SS_NO_ROWID before), and the predecessor's copy
 * when that came first and waits for the new row id to point at.
 */
typedef struct Successor
{
	uint64		old_rowid;		/* hash key */
	uint64		new_rowid;
	HeapTuple	waiting;		/* the predecessor's copy, not yet written */
	uint64		waiting_rowid;	/* its new row id */
} Successor;

/* A rewrite in progress (CLUSTER, VACUUM FULL): where copies go, and what they wait for. */
typedef struct Rewrite
{
	Relation	old_rel;
	Relation	new_rel;
	TransactionId oldest_xmin;
	uint32		new_keyspace;
	TransactionId xid_cutoff;
	MultiXactId multi_cutoff;
	uint64		next_new;		/* the next new row id to give */
	uint64		reserved;		/* new row ids taken from the relation's counter so far */
	uint64		first_new;
	HTAB	   *successors;		/* Successor entries by old row id */
	HeapTuple	batch[SS_COPY_BATCH];
	uint64		batch_rowids[SS_COPY_BATCH];
	int			nbatch;
	int64		written;
} Rewrite;

/* Writes the batch of copies (taking their row ids from the counter first) and frees them. */
static void
rewrite_flush(Rewrite *rw)
{
	uint64		used = rw->next_new - rw->first_new;

	if (rw->nbatch == 0)
		return;
	if (used > rw->reserved)
	{
		(void) ss_next_rowid(rw->new_rel, rw->new_keyspace, (uint32) (used - rw->reserved));
		rw->reserved = used;
	}
	ss_write_rows(rw->new_rel, rw->new_keyspace, rw->batch_rowids, rw->batch, rw->nbatch, true);
	for (int i = 0; i < rw->nbatch; i++)
		pfree(rw->batch[i]);
	rw->written += rw->nbatch;
	rw->nbatch = 0;
	pgstat_progress_update_param(PROGRESS_CLUSTER_HEAP_TUPLES_WRITTEN, rw->written);
}

/*
 * Adds a copy, made ready for the new relation (its row id, frozen xids, no chain flags,
 * TOASTed values moved to the new TOAST table), to the batch; `tuple` is handed over.
 */
static void
rewrite_emit(Rewrite *rw, HeapTuple tuple, uint64 new_rowid)
{
	freeze_copied_row(tuple->t_data, rw->xid_cutoff, rw->multi_cutoff);
	/* Every copy is indexed on its own: no chains survive a rewrite, as with heap. */
	tuple = ss_without_root_link(tuple);
	tuple->t_data->t_infomask2 &= ~(HEAP_HOT_UPDATED | HEAP_ONLY_TUPLE);
	tuple->t_tableOid = RelationGetRelid(rw->new_rel);
	ss_rowid_to_tid(new_rowid, &tuple->t_self);
	if (HeapTupleHasExternal(tuple))
	{
		/* TOASTed values move to the new relation's TOAST table, as heap does. */
		HeapTuple	retoasted = heap_toast_insert_or_update(rw->new_rel, tuple, NULL,
															HEAP_INSERT_NO_LOGICAL);

		if (retoasted != tuple)
		{
			retoasted->t_self = tuple->t_self;
			pfree(tuple);
			tuple = retoasted;
		}
	}
	rw->batch[rw->nbatch] = tuple;
	rw->batch_rowids[rw->nbatch] = new_rowid;
	if (++rw->nbatch == SS_COPY_BATCH)
		rewrite_flush(rw);
}

/*
 * Whether a version the rewrite keeps links to a successor it may keep too: an update ended it
 * and some snapshot may still see it (recently dead). A live version's t_ctid may still name
 * the version of an update that rolled back, or a locker's; that link leads nowhere.
 */
static bool
links_forward(HeapTuple tuple, TransactionId oldest_xmin)
{
	TransactionId dead_after;

	return !ItemPointerEquals(&tuple->t_self, &tuple->t_data->t_ctid) &&
		ss_tid_valid(&tuple->t_data->t_ctid) &&
		ss_tuple_vacuum_state(tuple, oldest_xmin, &dead_after) == HEAPTUPLE_RECENTLY_DEAD;
}

/*
 * Gives a kept version (`tuple`, a copy handed over) its new row id and writes it: at once when
 * it ends no chain or its successor's new row id is known, else when the successor comes (or
 * at the end, pointing at itself, if the successor is not kept). A successor's own arrival
 * releases the predecessor that waited for it. Successors were noted beforehand
 * (rewrite_note_successors): whatever the order, a successor may come first, since a rewrite in
 * index order gives a version's successor a smaller row id when the index puts it first.
 */
static void
rewrite_copy(Rewrite *rw, HeapTuple tuple)
{
	uint64		old_rowid = ss_tid_to_rowid(&tuple->t_self);
	uint64		new_rowid = rw->next_new++;
	Successor  *self = hash_search(rw->successors, &old_rowid, HASH_FIND, NULL);

	if (self != NULL)
	{
		self->new_rowid = new_rowid;
		if (self->waiting != NULL)
		{
			/* Its predecessor came first: it points here now, and the pair is done. */
			ss_rowid_to_tid(new_rowid, &self->waiting->t_data->t_ctid);
			rewrite_emit(rw, self->waiting, self->waiting_rowid);
			(void) hash_search(rw->successors, &old_rowid, HASH_REMOVE, NULL);
		}
	}
	if (links_forward(tuple, rw->oldest_xmin))
	{
		uint64		successor = ss_tid_to_rowid(&tuple->t_data->t_ctid);
		Successor  *next = hash_search(rw->successors, &successor, HASH_FIND, NULL);

		if (next == NULL || next->waiting != NULL)
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("slipstream: the update chain at row " UINT64_FORMAT " of \"%s\" is "
							"inconsistent",
							successor, RelationGetRelationName(rw->old_rel)),
					 errdetail("Row " UINT64_FORMAT " links to it, and %s.", old_rowid,
							   next == NULL ? "the first pass of the rewrite did not see that link"
							   : "so does another row")));
		if (next->new_rowid == SS_NO_ROWID)
		{
			next->waiting = tuple;
			next->waiting_rowid = new_rowid;
			return;
		}
		ss_rowid_to_tid(next->new_rowid, &tuple->t_data->t_ctid);
		(void) hash_search(rw->successors, &successor, HASH_REMOVE, NULL);
	}
	else
		ss_rowid_to_tid(new_rowid, &tuple->t_data->t_ctid);
	rewrite_emit(rw, tuple, new_rowid);
}

/* Writes the versions still waiting for successors the rewrite did not keep, pointing at themselves. */
static void
rewrite_finish(Rewrite *rw)
{
	HASH_SEQ_STATUS status;
	Successor  *entry;

	hash_seq_init(&status, rw->successors);
	while ((entry = hash_seq_search(&status)) != NULL)
	{
		if (entry->waiting == NULL)
			continue;
		ss_rowid_to_tid(entry->waiting_rowid, &entry->waiting->t_data->t_ctid);
		rewrite_emit(rw, entry->waiting, entry->waiting_rowid);
		entry->waiting = NULL;
	}
	rewrite_flush(rw);
}

/* Before a rewrite, notes the successors of the versions it will keep: one pass in row id order. */
static void
rewrite_note_successors(Rewrite *rw, Relation old_rel, TransactionId oldest_xmin)
{
	TupleTableSlot *slot = table_slot_create(old_rel, NULL);
	TableScanDesc scan = table_beginscan(old_rel, SnapshotAny, 0, NULL);

	while (table_scan_getnextslot(scan, ForwardScanDirection, slot))
	{
		bool		should_free;
		HeapTuple	tuple = ExecFetchSlotHeapTuple(slot, false, &should_free);

		CHECK_FOR_INTERRUPTS();
		if (!links_forward(tuple, oldest_xmin))
			continue;
		{
			uint64		successor = ss_tid_to_rowid(&tuple->t_data->t_ctid);
			bool		found;
			Successor  *entry = hash_search(rw->successors, &successor, HASH_ENTER, &found);

			entry->new_rowid = SS_NO_ROWID;
			entry->waiting = NULL;
		}
	}
	table_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
}

/*
 * CLUSTER and VACUUM FULL: copies every row some transaction may still see into the new
 * relation with new row ids, in row id order, in index order (CLUSTER by an index scan) or
 * sorted (CLUSTER by a sort). Copies are written as they come; only a version whose update's
 * successor it keeps too and has not met yet waits, so that its t_ctid can name the
 * successor's new row id: memory grows with such versions, not with the table.
 */
static void
ss_relation_copy_for_cluster(Relation old_rel, Relation new_rel, Relation old_index,
							 bool use_sort, TransactionId oldest_xmin,
							 TransactionId *xid_cutoff, MultiXactId *multi_cutoff,
							 double *num_tuples, double *tups_vacuumed,
							 double *tups_recently_dead)
{
	uint32		old_keyspace = ss_rel_keyspace(old_rel);
	TupleTableSlot *slot = table_slot_create(old_rel, NULL);
	TableScanDesc scan = NULL;
	IndexScanDesc iscan = NULL;
	Tuplesortstate *sort = NULL;
	HASHCTL		info;
	Rewrite		rw = {0};
	int64		scanned = 0;
	BlockNumber reported = InvalidBlockNumber;

	rw.old_rel = old_rel;
	rw.new_rel = new_rel;
	rw.oldest_xmin = oldest_xmin;
	rw.new_keyspace = ss_rel_keyspace(new_rel);
	rw.xid_cutoff = *xid_cutoff;
	rw.multi_cutoff = *multi_cutoff;
	rw.first_new = rw.next_new = ss_next_rowid(new_rel, rw.new_keyspace, 0);
	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(uint64);
	info.entrysize = sizeof(Successor);
	info.hcxt = CurrentMemoryContext;
	rw.successors = hash_create("slipstream rewrite successors", 1024, &info,
								HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	*num_tuples = *tups_vacuumed = *tups_recently_dead = 0;

	rewrite_note_successors(&rw, old_rel, oldest_xmin);
	if (old_index != NULL && use_sort)
		sort = tuplesort_begin_cluster(RelationGetDescr(old_rel), old_index,
									   maintenance_work_mem, NULL, TUPLESORT_NONE);
	/* pg_stat_progress_cluster, as heap's rewrite reports it (cluster.c sets the other phases). */
	if (old_index != NULL && !use_sort)
	{
		pgstat_progress_update_param(PROGRESS_CLUSTER_PHASE,
									 PROGRESS_CLUSTER_PHASE_INDEX_SCAN_HEAP);
		iscan = index_beginscan(old_rel, old_index, SnapshotAny, 0, 0);
		index_rescan(iscan, NULL, 0, NULL, 0);
	}
	else
	{
		const int	params[] = {PROGRESS_CLUSTER_PHASE, PROGRESS_CLUSTER_TOTAL_HEAP_BLKS};
		const int64 values[] = {PROGRESS_CLUSTER_PHASE_SEQ_SCAN_HEAP,
		rowid_blocks(old_rel, old_keyspace)};

		pgstat_progress_update_multi_param(2, params, values);
		scan = table_beginscan(old_rel, SnapshotAny, 0, NULL);
	}

	for (;;)
	{
		bool		should_free;
		HeapTuple	tuple;
		TransactionId dead_after;

		CHECK_FOR_INTERRUPTS();
		if (iscan != NULL ? !index_getnext_slot(iscan, ForwardScanDirection, slot)
			: !table_scan_getnextslot(scan, ForwardScanDirection, slot))
			break;
		tuple = ExecFetchSlotHeapTuple(slot, false, &should_free);
		pgstat_progress_update_param(PROGRESS_CLUSTER_HEAP_TUPLES_SCANNED, ++scanned);
		if (scan != NULL)
			report_block_reached(PROGRESS_CLUSTER_HEAP_BLKS_SCANNED, &tuple->t_self, 0,
								 &reported);
		switch (ss_tuple_vacuum_state(tuple, oldest_xmin, &dead_after))
		{
			case HEAPTUPLE_DEAD:
				*tups_vacuumed += 1;
				continue;
			case HEAPTUPLE_RECENTLY_DEAD:
				*tups_recently_dead += 1;
				break;
			default:
				*num_tuples += 1;
				break;
		}
		if (sort != NULL)
			tuplesort_putheaptuple(sort, tuple);
		else
			rewrite_copy(&rw, heap_copytuple(tuple));
	}
	if (iscan != NULL)
		index_endscan(iscan);
	if (scan != NULL)
	{
		pgstat_progress_update_param(PROGRESS_CLUSTER_HEAP_BLKS_SCANNED,
									 rowid_blocks(old_rel, old_keyspace));
		table_endscan(scan);
	}
	ExecDropSingleTupleTableSlot(slot);
	if (sort != NULL)
	{
		HeapTuple	tuple;

		pgstat_progress_update_param(PROGRESS_CLUSTER_PHASE, PROGRESS_CLUSTER_PHASE_SORT_TUPLES);
		tuplesort_performsort(sort);
		pgstat_progress_update_param(PROGRESS_CLUSTER_PHASE,
									 PROGRESS_CLUSTER_PHASE_WRITE_NEW_HEAP);
		while ((tuple = tuplesort_getheaptuple(sort, true)) != NULL)
		{
			CHECK_FOR_INTERRUPTS();
			rewrite_copy(&rw, heap_copytuple(tuple));
		}
		tuplesort_end(sort);
	}
	rewrite_finish(&rw);
	hash_destroy(rw.successors);
}

/*
 * An index build's verdict on one version it met through a chain: whether to index it and
 * whether it is alive, by VACUUM's rules (SnapshotAny) or the build's snapshot, which the walk
 * already applied. As heap's, a version dead to some snapshots whose chain goes on is not
 * indexed (its successor is, under the same root) and the index is marked unusable for those
 * snapshots (ii_BrokenHotChain, hence indcheckxmin).
 */
static bool
build_should_index(HeapTuple tuple, Snapshot snapshot, TransactionId oldest_xmin,
				   IndexInfo *index_info, bool *alive)
{
	TransactionId dead_after;

	*alive = true;
	if (snapshot != SnapshotAny)
		return true;
	switch (ss_tuple_vacuum_state(tuple, oldest_xmin, &dead_after))
	{
		case HEAPTUPLE_DEAD:
			return false;
		case HEAPTUPLE_RECENTLY_DEAD:
		case HEAPTUPLE_DELETE_IN_PROGRESS:
			if (HeapTupleHeaderIsHotUpdated(tuple->t_data))
			{
				index_info->ii_BrokenHotChain = true;
				return false;
			}
			*alive = false;
			return true;
		default:
			return true;
	}
}

/* The state an index build carries from row to row. */
typedef struct BuildState
{
	Relation	index_rel;
	IndexInfo  *index_info;
	EState	   *estate;
	ExprContext *econtext;
	ExprState  *predicate;
	TupleTableSlot *slot;
	Snapshot	snapshot;
	TransactionId oldest_xmin;
	IndexBuildCallback callback;
	void	   *callback_state;
	double		reltuples;
} BuildState;

/* Indexes one version (in the build's slot) under its chain root's TID. */
static void
build_index_version(BuildState *build, HeapTuple tuple, ItemPointer root_tid)
{
	Datum		values[INDEX_MAX_KEYS];
	bool		isnull[INDEX_MAX_KEYS];
	bool		alive;

	if (!build_should_index(tuple, build->snapshot, build->oldest_xmin, build->index_info,
							&alive))
		return;
	build->reltuples += 1;
	MemoryContextReset(build->econtext->ecxt_per_tuple_memory);
	if (build->predicate != NULL && !ExecQual(build->predicate, build->econtext))
		return;
	FormIndexDatum(build->index_info, build->slot, build->estate, values, isnull);
	build->callback(build->index_rel, root_tid, values, isnull, alive, build->callback_state);
}

/*
 * Feeds an index build: every row some transaction may still see (SnapshotAny, classified by
 * VACUUM's rules) or, for concurrent builds, every row the build's snapshot sees. A chain's
 * versions are reached from its root and indexed under the root's TID, as heap's root_offsets
 * do; heap-only rows met by the scan itself are skipped.
 */
static double
ss_index_build_range_scan(Relation table_rel, Relation index_rel, IndexInfo *index_info,
						  bool allow_sync, bool anyvisible, bool progress,
						  BlockNumber start_blockno, BlockNumber numblocks,
						  IndexBuildCallback callback, void *callback_state,
						  TableScanDesc scan)
{
	BuildState	build = {0};
	bool		own_scan = (scan == NULL);
	bool		unregister = false;
	uint32		keyspace = ss_rel_keyspace(table_rel);
	BlockNumber total = rowid_blocks(table_rel, keyspace);
	BlockNumber reported = InvalidBlockNumber;

	build.index_rel = index_rel;
	build.index_info = index_info;
	build.estate = CreateExecutorState();
	build.econtext = GetPerTupleExprContext(build.estate);
	build.slot = table_slot_create(table_rel, NULL);
	build.econtext->ecxt_scantuple = build.slot;
	build.predicate = ExecPrepareQual(index_info->ii_Predicate, build.estate);
	build.oldest_xmin = InvalidTransactionId;
	build.callback = callback;
	build.callback_state = callback_state;
	if (own_scan)
	{
		if (!IsBootstrapProcessingMode() && !index_info->ii_Concurrent)
		{
			build.oldest_xmin = GetOldestNonRemovableTransactionId(table_rel);
			build.snapshot = SnapshotAny;
		}
		else
		{
			build.snapshot = RegisterSnapshot(GetTransactionSnapshot());
			unregister = true;
		}
		scan = table_beginscan_strat(table_rel, SnapshotAny, 0, NULL, true, allow_sync);
		if (start_blockno != 0 || numblocks != InvalidBlockNumber)
		{
			ItemPointerData min,
						max;

			ItemPointerSet(&min, start_blockno, 1);
			ItemPointerSet(&max,
						   numblocks == InvalidBlockNumber ? MaxBlockNumber
						   : start_blockno + numblocks - 1,
						   SS_ROWS_PER_BLOCK);
			table_rescan_tidrange(scan, &min, &max);
		}
	}
	else
	{
		build.snapshot = scan->rs_snapshot;
		if (build.snapshot == SnapshotAny)
			build.oldest_xmin = GetOldestNonRemovableTransactionId(table_rel);
	}
	ss_scan_every_row(scan);
	/*
	 * pg_stat_progress_create_index: the blocks of the range, and the block the scan is at
	 * (a parallel participant's blocks come in chunks: it reports the furthest it reached).
	 */
	if (start_blockno != 0 || numblocks != InvalidBlockNumber)
		total = numblocks == InvalidBlockNumber ? total - Min(total, start_blockno)
			: Min(numblocks, total - Min(total, start_blockno));
	if (progress)
		pgstat_progress_update_param(PROGRESS_SCAN_BLOCKS_TOTAL, total);

	while (table_scan_getnextslot(scan, ForwardScanDirection, build.slot))
	{
		bool		should_free;
		HeapTuple	tuple = ExecFetchSlotHeapTuple(build.slot, false, &should_free);
		ItemPointerData root_tid = tuple->t_self;
		SsChainWalk walk;
		HeapTuple	version;

		CHECK_FOR_INTERRUPTS();
		if (progress)
			report_block_reached(PROGRESS_SCAN_BLOCKS_DONE, &root_tid, start_blockno, &reported);
		if (HeapTupleHeaderIsHeapOnly(tuple->t_data))
			continue;			/* indexed through its root */
		if (!ss_is_redirect(tuple->t_data) && !HeapTupleHeaderIsHotUpdated(tuple->t_data))
		{
			if (build.snapshot == SnapshotAny || ss_tuple_visible(tuple, build.snapshot))
				build_index_version(&build, tuple, &root_tid);
			continue;
		}
		ss_chain_start(&walk, table_rel, keyspace, ss_tid_to_rowid(&root_tid), build.snapshot);
		while ((version = ss_chain_next_visible(&walk, build.snapshot, NULL, NULL)) != NULL)
		{
			ExecStoreHeapTuple(ss_without_root_link(version), build.slot, true);
			build_index_version(&build, version, &root_tid);
		}
		ss_chain_end(&walk);
	}
	table_endscan(scan);		/* a parallel build's scan too: its caller does not end it */
	if (progress)
		pgstat_progress_update_param(PROGRESS_SCAN_BLOCKS_DONE, total);
	if (unregister)
		UnregisterSnapshot(build.snapshot);
	ExecDropSingleTupleTableSlot(build.slot);
	FreeExecutorState(build.estate);
	index_info->ii_ExpressionsState = NIL;
	index_info->ii_PredicateState = NULL;
	return build.reltuples;
}

/*
 * CREATE INDEX CONCURRENTLY's validation: inserts every version the snapshot sees whose chain
 * root's TID the index lacks. Roots come in TID order, as does the sorted list of the index's
 * TIDs.
 */
static void
ss_index_validate_scan(Relation table_rel, Relation index_rel, IndexInfo *index_info,
					   Snapshot snapshot, ValidateIndexState *state)
{
	Datum		values[INDEX_MAX_KEYS];
	bool		isnull[INDEX_MAX_KEYS];
	EState	   *estate = CreateExecutorState();
	ExprContext *econtext = GetPerTupleExprContext(estate);
	TupleTableSlot *slot = table_slot_create(table_rel, NULL);
	ExprState  *predicate;
	TableScanDesc scan = table_beginscan_strat(table_rel, SnapshotAny, 0, NULL, true, false);
	uint32		keyspace = ss_rel_keyspace(table_rel);
	ItemPointerData indexed;
	bool		have_indexed = false;
	bool		index_done = false;
	BlockNumber reported = InvalidBlockNumber;

	ss_scan_every_row(scan);
	pgstat_progress_update_param(PROGRESS_SCAN_BLOCKS_TOTAL, rowid_blocks(table_rel, keyspace));
	econtext->ecxt_scantuple = slot;
	predicate = ExecPrepareQual(index_info->ii_Predicate, estate);
	ItemPointerSetInvalid(&indexed);
	while (table_scan_getnextslot(scan, ForwardScanDirection, slot))
	{
		ItemPointerData root_tid = slot->tts_tid;
		bool		should_free;
		HeapTuple	tuple = ExecFetchSlotHeapTuple(slot, false, &should_free);
		SsChainWalk walk;
		HeapTuple	version;

		CHECK_FOR_INTERRUPTS();
		report_block_reached(PROGRESS_SCAN_BLOCKS_DONE, &root_tid, 0, &reported);
		if (HeapTupleHeaderIsHeapOnly(tuple->t_data))
			continue;			/* reached through its root */
		ss_chain_start(&walk, table_rel, keyspace, ss_tid_to_rowid(&root_tid), snapshot);
		version = ss_chain_next_visible(&walk, snapshot, heap_copytuple(tuple), NULL);
		ss_chain_end(&walk);
		if (version == NULL)
			continue;
		ExecStoreHeapTuple(ss_without_root_link(version), slot, true);
		state->htups += 1;
		/* Advance through the index's TIDs up to this root's. */
		while (!index_done && (!have_indexed || ItemPointerCompare(&indexed, &root_tid) < 0))
		{
			Datum		ts_val;
			bool		ts_isnull;

			if (!tuplesort_getdatum(state->tuplesort, true, &ts_val, &ts_isnull, NULL))
			{
				index_done = true;
				break;
			}
			itemptr_decode(&indexed, DatumGetInt64(ts_val));
			have_indexed = true;
		}
		if (have_indexed && !index_done && ItemPointerEquals(&indexed, &root_tid))
			continue;
		MemoryContextReset(econtext->ecxt_per_tuple_memory);
		if (predicate != NULL && !ExecQual(predicate, econtext))
			continue;
		FormIndexDatum(index_info, slot, estate, values, isnull);
		index_insert(index_rel, values, isnull, &root_tid, table_rel,
					 index_info->ii_Unique ? UNIQUE_CHECK_YES : UNIQUE_CHECK_NO, false,
					 index_info);
		state->tups_inserted += 1;
	}
	pgstat_progress_update_param(PROGRESS_SCAN_BLOCKS_DONE, rowid_blocks(table_rel, keyspace));
	table_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	FreeExecutorState(estate);
	index_info->ii_ExpressionsState = NIL;
	index_info->ii_PredicateState = NULL;
}

/* Size in bytes as 8 KB "blocks" of 256 row ids each (what ANALYZE and BRIN walk). */
static uint64
ss_relation_size(Relation rel, ForkNumber fork)
{
	uint64		high;

	if (fork != MAIN_FORKNUM && fork != InvalidForkNumber)
		return 0;
	/* ANALYZE asks just before it sets up md.c prefetches, which must not happen. */
	ss_analyze_prefetch_off();
	high = ss_rowid_high(rel, ss_rel_keyspace(rel));
	return (high + SS_ROWS_PER_BLOCK - 1) / SS_ROWS_PER_BLOCK * BLCKSZ;
}

/* A TOAST table is needed when a row could exceed the TOAST threshold, as for heap. */
static bool
ss_relation_needs_toast_table(Relation rel)
{
	TupleDesc	desc = RelationGetDescr(rel);
	int32		fixed = SizeofHeapTupleHeader + BITMAPLEN(desc->natts);

	for (int i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (att->attisdropped)
			continue;
		if (att->attlen < 0)
		{
			if (att->attstorage != TYPSTORAGE_PLAIN)
				return true;
			fixed += BLCKSZ;	/* a plain varlena can be wide */
		}
		else
			fixed = att_align_nominal(fixed, att->attalign) + att->attlen;
	}
	return fixed > TOAST_TUPLE_THRESHOLD;
}

/* TOAST values live in a heap TOAST table: PostgreSQL's toaster writes only to heap. */
static Oid
ss_relation_toast_am(Relation rel)
{
	return HEAP_TABLE_AM_OID;
}

/*
 * The pages heap would use for `versions` row versions of `rel`: versions of the estimated
 * width (data plus heap's maxaligned tuple header and line pointer) packed into 8 KB pages up
 * to the table's fillfactor, as heap_insert packs them.
 */
static double
heap_equivalent_pages(Relation rel, int32 data_width, double versions)
{
	Size		row_bytes = MAXALIGN(SizeofHeapTupleHeader + data_width) + sizeof(ItemIdData);
	Size		usable = BLCKSZ - SizeOfPageHeaderData -
		RelationGetTargetPageFreeSpace(rel, HEAP_DEFAULT_FILLFACTOR);
	double		per_page = Min(Max((double) (usable / row_bytes), 1.0),
							   (double) MaxHeapTuplesPerPage);

	return ceil(versions / per_page);
}

/*
 * Planner size estimate, computed as heap computes its own (table_block_relation_estimate_size)
 * so that the planner makes the choices it makes for heap. Heap counts the pages of its file;
 * a slipstream table has no such file, so its pages are those heap would fill with the row
 * versions stored so far: every row id handed out (row ids are dense and dead versions stay
 * until VACUUM, as heap's pages stay), at the estimated row width. A table never vacuumed or
 * analyzed counts as at least 10 pages, as heap's does. Rows come from the density of live
 * rows the last VACUUM or ANALYZE saw over the row id blocks (pg_class.relpages counts those
 * 256-row-id blocks here), applied to today's blocks; before any, from the row width, as heap.
 * Every stored version costs a sequential scan, so a table whose dead versions pile up between
 * VACUUMs looks as expensive to scan as it is, and the planner prefers its indexes. The
 * all-visible fraction is that of the visibility map, as heap's.
 */
static void
ss_relation_estimate_size(Relation rel, int32 *attr_widths, BlockNumber *pages, double *tuples,
						  double *allvisfrac)
{
	double		high = (double) ss_rowid_high(rel, ss_rel_keyspace(rel));
	double		id_blocks = ceil(high / SS_ROWS_PER_BLOCK);
	int32		width = get_rel_data_width(rel, attr_widths);
	double		relpages = (double) rel->rd_rel->relpages;
	double		reltuples = (double) rel->rd_rel->reltuples;
	double		curpages = heap_equivalent_pages(rel, width, high);

	if (curpages < 10 && reltuples < 0 && !rel->rd_rel->relhassubclass)
		curpages = 10;
	*pages = (BlockNumber) Min(curpages, (double) MaxBlockNumber);
	/* The share of row id blocks the last VACUUM found all-visible (tableam/vismap.c). */
	*allvisfrac = id_blocks > 0 ? Min(1.0, (double) rel->rd_rel->relallvisible / id_blocks) : 0;
	if (curpages == 0)
	{
		*tuples = 0;
		return;
	}
	if (reltuples >= 0 && relpages > 0)
		*tuples = rint(reltuples / relpages * id_blocks);
	else
	{
		/* Heap's density for a table never vacuumed; the integer division is heap's too. */
		int32		tuple_width = width + MAXALIGN(SizeofHeapTupleHeader) + sizeof(ItemIdData);

		*tuples = rint((double) ((BLCKSZ - SizeOfPageHeaderData) / tuple_width) * curpages);
	}
}

/* Installs the callbacks of this file. */
void
ss_init_ddl_callbacks(TableAmRoutine *am)
{
	am->relation_set_new_filenode = ss_relation_set_new_filenode;
	am->relation_nontransactional_truncate = ss_relation_nontransactional_truncate;
	am->relation_copy_data = ss_relation_copy_data;
	am->relation_copy_for_cluster = ss_relation_copy_for_cluster;
	am->index_build_range_scan = ss_index_build_range_scan;
	am->index_validate_scan = ss_index_validate_scan;
	am->relation_size = ss_relation_size;
	am->relation_needs_toast_table = ss_relation_needs_toast_table;
	am->relation_toast_am = ss_relation_toast_am;
	am->relation_estimate_size = ss_relation_estimate_size;
}
