/*
 * tableam/vacuum.c: VACUUM (dead rows out of the engine and their index entries out of the indexes,
 * old xids frozen, relfrozenxid advanced) and the index AMs' question "which of these entries
 * point at rows dead to everyone?".
 *
 * Order matters: index entries go first, rows after, so an index never points at a missing
 * row that a later insert could reuse the id of.
 *
 * As heap's lazy VACUUM, a VACUUM leaves out the blocks the visibility map marks all-visible
 * (tableam/vismap.c): every change clears its blocks' bits, so such a block holds no dead row and
 * nothing to prune, but for the rows of changes a crash cut off before their bit was cleared
 * (never committed, and never indexed), which only an aggressive VACUUM removes. The map has no
 * all-frozen bit, because a crash between a change and the clearing of its bit can leave a bit set
 * over the change (vismap.c): such a bit may be trusted to mean "nothing for VACUUM to do" but not
 * "no xid older than relfrozenxid". So an aggressive VACUUM (FREEZE, DISABLE_PAGE_SKIPPING, or
 * relfrozenxid older than vacuum_freeze_table_age) reads every block, and a VACUUM that skipped
 * blocks leaves relfrozenxid and relminmxid where they were. It still counts the skipped blocks'
 * rows, by their keys alone, so that reltuples stays exact: an estimate from the scanned blocks'
 * density would drift, since all-visible blocks are denser than the others; the count leaves
 * out the redirects of pruned chains (ss_scan_skip_to).
 */
#include "slipstream.h"

#include <math.h>

#include "access/genam.h"
#include "access/heapam_xlog.h"
#include "access/multixact.h"
#include "access/transam.h"
#include "access/visibilitymap.h"
#include "access/xact.h"
#include "catalog/index.h"
#include "commands/dbcommands.h"
#include "commands/progress.h"
#include "commands/vacuum.h"
#include "executor/instrument.h"
#include "miscadmin.h"
#include "postmaster/autovacuum.h"
#include "pgstat.h"
#include "storage/bufmgr.h"
#include "storage/pmsignal.h"
#include "storage/procarray.h"
#include "utils/lsyscache.h"
#include "utils/pg_rusage.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

/* Rows removed per WAL record and engine batch. */
#define SS_REMOVE_BATCH 1024

/*
 * Dead rows whose index entries go in the next pass over the indexes: half of VACUUM's work
 * memory, as heap's dead tuple array takes it; a full list is emptied by a pass during the scan.
 */
typedef struct DeadRows
{
	uint64	   *rowids;			/* sorted ascending */
	int64		count;
	int64		capacity;
	int64		limit;			/* rows per pass over the indexes */
	TransactionId latest_removed;	/* for hot standbys, as heap's latestRemovedXid */
} DeadRows;

/* What a pass over the indexes needs, for emptying a full dead row list wherever it fills. */
typedef struct IndexPass
{
	bool		dead_stay;		/* index cleanup off: dead rows stay */
	Relation   *indexes;
	int			nindexes;
	IndexBulkDeleteResult **stats;
	BufferAccessStrategy strategy;
	const double *live;			/* live rows the scan has counted so far */
	struct VacuumReport *report;
} IndexPass;

/*
 * What one VACUUM did and saw, for its log message (VERBOSE, log_autovacuum_min_duration) and
 * pg_stat_progress_vacuum.
 */
typedef struct VacuumReport
{
	int64		removed;		/* dead rows removed with their index entries */
	int64		kept;			/* dead rows left in place: index cleanup was off */
	SsPruneCounts prunes;		/* chain versions pruned, chains walked again */
	int64		orphans;		/* versions of aborted updates removed */
	int			index_passes;	/* passes over the indexes that removed entries */
	int64		blocks_vacuumed;	/* blocks rows were removed from */
	double		live;
	double		recently_dead;
	BlockNumber pages;
	BlockNumber read;			/* blocks the scan read rows of */
	BlockNumber skipped;
	BlockNumber all_visible;
	TimestampTz start;
	PGRUsage	usage;
	WalUsage	wal;			/* pgWalUsage when VACUUM began */
} VacuumReport;

/* A pruned chain's root and the first version its redirect names as still needed. */
typedef struct Redirect
{
	uint64		root;
	uint64		target;
} Redirect;

/*
 * The redirects whose chains VACUUM looks at after its scan, and the heap-only versions the scan
 * found still needed (a bit per row id from `base`, the first redirect's root: a chain's
 * versions follow its root, so no target lies below it). Both live in three eighths of
 * VACUUM's work memory (maintenance_work_mem, or autovacuum_work_mem) and are allocated at the
 * first redirect; redirects past `limit` are pruned during the scan, as before
 * this list existed.
 */
typedef struct Redirects
{
	Redirect   *items;
	int64		count;
	int64		capacity;
	int64		limit;
	bool		started;		/* the first redirect sized the list and the bitmap */
	double		budget;			/* bytes for both */
	uint64		rows_end;		/* one past the last row id the scan may meet */
	uint8	   *needed;
	uint64		base;
	uint64		nbits;
} Redirects;

/*
 * A dead chain member the scan met whose update continued its chain (a HOT update), kept so
 * that the prunes after the scan need not read it again (ss_prune_chain_seen).
 */
typedef struct DeadMember
{
	uint64		rowid;
	uint64		next;			/* the version its update inserted */
	TransactionId xmin;
	TransactionId update_xid;	/* the xmin `next` has */
	TransactionId removed_xid;	/* what removing it means for hot standbys */
} DeadMember;

/*
 * The dead members the scan met, in ascending row ids; an eighth of VACUUM's work memory (the
 * redirects take three eighths, the dead rows half). Members past the limit are not kept: their
 * chains are walked.
 */
typedef struct DeadMembers
{
	DeadMember *items;
	int64		count;
	int64		capacity;
	int64		limit;
} DeadMembers;

/* Chains longer than this are walked after the scan, not pruned from what it read. */
#define SS_SEEN_MEMBERS 64

/* VACUUM's work memory in bytes: autovacuum_work_mem in an autovacuum worker, if set. */
static double
work_memory_bytes(void)
{
	int			work_kb = IsAutoVacuumWorkerProcess() && autovacuum_work_mem != -1
		? autovacuum_work_mem : maintenance_work_mem;

	return (double) work_kb * 1024;
}

/* Makes room for one more item in a growing array of `size`-byte items, up to `most`. */
static void *
reserve_one(void *items, int64 count, int64 *capacity, size_t size, int64 most)
{
	if (count < *capacity)
		return items;
	*capacity = Min(Max(1024, *capacity * 2), Max(most, count + 1));
	return items == NULL ? palloc_extended(size * *capacity, MCXT_ALLOC_HUGE)
		: repalloc_huge(items, size * *capacity);
}

/* Sets the dead rows' share of work memory; the list grows as rows come. */
static void
dead_rows_init(DeadRows *dead)
{
	memset(dead, 0, sizeof(*dead));
	dead->limit = Max((int64) (work_memory_bytes() / 2 / sizeof(uint64)), SS_REMOVE_BATCH);
}

/* Appends a row id (scans produce them in ascending order). */
static void
dead_rows_add(DeadRows *dead, uint64 rowid)
{
	dead->rowids = reserve_one(dead->rowids, dead->count, &dead->capacity, sizeof(uint64),
							   PG_INT64_MAX);
	dead->rowids[dead->count++] = rowid;
}

/* Sets the work memory budget; nothing is allocated before the first redirect. */
static void
redirects_init(Redirects *redirects, uint64 rows_end)
{
	memset(redirects, 0, sizeof(*redirects));
	redirects->budget = work_memory_bytes() * 3 / 8;
	redirects->rows_end = rows_end;
}

/*
 * Keeps a redirect met by the scan for after it; false when there is no room (the caller
 * prunes the chain at once). The first one sizes the bitmap from its root to the end.
 */
static bool
redirects_add(Redirects *redirects, uint64 root, uint64 target)
{
	if (!redirects->started)
	{
		uint64		nbits = root < redirects->rows_end ? redirects->rows_end - root : 0;
		double		bitmap_bytes = (double) (nbits + 7) / 8;

		redirects->started = true;
		if (bitmap_bytes > redirects->budget / 2)
			return false;		/* no room: every redirect is pruned during the scan */
		redirects->base = root;
		redirects->nbits = nbits;
		redirects->needed = palloc_extended(Max((Size) ((nbits + 7) / 8), 1),
											MCXT_ALLOC_HUGE | MCXT_ALLOC_ZERO);
		redirects->limit = (int64) ((redirects->budget - bitmap_bytes) / sizeof(Redirect));
	}
	if (redirects->count >= redirects->limit)
		return false;
	redirects->items = reserve_one(redirects->items, redirects->count, &redirects->capacity,
								   sizeof(Redirect), redirects->limit);
	redirects->items[redirects->count].root = root;
	redirects->items[redirects->count].target = target;
	redirects->count++;
	return true;
}

/* Notes a heap-only version the scan found still needed. */
static inline void
redirects_note_needed(Redirects *redirects, uint64 rowid)
{
	if (rowid >= redirects->base && rowid - redirects->base < redirects->nbits)
	{
		uint64		bit = rowid - redirects->base;

		redirects->needed[bit / 8] |= (uint8) (1 << (bit % 8));
	}
}

/* Whether the scan found the version at `rowid` still needed. */
static inline bool
redirects_needed(const Redirects *redirects, uint64 rowid)
{
	uint64		bit = rowid - redirects->base;

	return rowid >= redirects->base && bit < redirects->nbits &&
		(redirects->needed[bit / 8] & (1 << (bit % 8))) != 0;
}

/* Frees the list and the bitmap. */
static void
redirects_free(Redirects *redirects)
{
	if (redirects->items != NULL)
		pfree(redirects->items);
	if (redirects->needed != NULL)
		pfree(redirects->needed);
	redirects->items = NULL;
	redirects->needed = NULL;
	redirects->count = 0;
}

/* Sets the dead members' share of work memory; nothing is allocated before the first one. */
static void
dead_members_init(DeadMembers *members)
{
	memset(members, 0, sizeof(*members));
	members->limit = (int64) (work_memory_bytes() / 8 / sizeof(DeadMember));
}

/* Keeps a dead heap-only version the scan met, if its update continued the chain. */
static void
dead_members_add(DeadMembers *members, HeapTuple tuple)
{
	HeapTupleHeader header = tuple->t_data;
	DeadMember *m;

	if (!HeapTupleHeaderIsHotUpdated(header) || !ss_tid_valid(&header->t_ctid) ||
		ItemPointerEquals(&tuple->t_self, &header->t_ctid) || members->count >= members->limit)
		return;
	members->items = reserve_one(members->items, members->count, &members->capacity,
								 sizeof(DeadMember), members->limit);
	m = &members->items[members->count++];
	m->rowid = ss_tid_to_rowid(&tuple->t_self);
	m->next = ss_tid_to_rowid(&header->t_ctid);
	m->xmin = HeapTupleHeaderGetRawXmin(header);
	m->update_xid = HeapTupleHeaderGetUpdateXid(header);
	m->removed_xid = InvalidTransactionId;
	HeapTupleHeaderAdvanceLatestRemovedXid(header, &m->removed_xid);
}

/* The dead member the scan kept at `rowid`, or NULL. */
static const DeadMember *
dead_members_find(const DeadMembers *members, uint64 rowid)
{
	int64		lo = 0,
				hi = members->count;

	while (lo < hi)
	{
		int64		mid = lo + (hi - lo) / 2;

		if (members->items[mid].rowid < rowid)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < members->count && members->items[lo].rowid == rowid ? &members->items[lo] : NULL;
}

/* Frees the dead members. */
static void
dead_members_free(DeadMembers *members)
{
	if (members->items != NULL)
		pfree(members->items);
	members->items = NULL;
	members->count = 0;
}

/* qsort order of row ids. */
static int
rowid_cmp(const void *a, const void *b)
{
	uint64		x = *(const uint64 *) a;
	uint64		y = *(const uint64 *) b;

	return x < y ? -1 : x > y;
}

/* Index bulk-delete callback: is this TID one of the dead rows? */
static bool
tid_is_dead(ItemPointer tid, void *state)
{
	DeadRows   *dead = (DeadRows *) state;
	uint64		rowid;
	int64		lo = 0,
				hi = dead->count;

	if (!ss_tid_valid(tid))
		return false;
	rowid = ss_tid_to_rowid(tid);
	while (lo < hi)
	{
		int64		mid = lo + (hi - lo) / 2;

		if (dead->rowids[mid] < rowid)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < dead->count && dead->rowids[lo] == rowid;
}

/* Clears an xmax that no longer means anything (finished lockers, aborted updaters). */
static bool
clear_stale_xmax(HeapTupleHeader tuple)
{
	TransactionId xmax = HeapTupleHeaderGetRawXmax(tuple);
	bool		stale;

	if (tuple->t_infomask & HEAP_XMAX_INVALID)
		return false;
	if (tuple->t_infomask & HEAP_XMAX_IS_MULTI)
		stale = !MultiXactIdIsRunning(xmax, HEAP_XMAX_IS_LOCKED_ONLY(tuple->t_infomask)) &&
			(HEAP_XMAX_IS_LOCKED_ONLY(tuple->t_infomask) ||
			 !TransactionIdDidCommit(HeapTupleGetUpdateXid(tuple)));
	else
		stale = !TransactionIdIsInProgress(xmax) &&
			(HEAP_XMAX_IS_LOCKED_ONLY(tuple->t_infomask) || !TransactionIdDidCommit(xmax));
	if (!stale)
		return false;
	tuple->t_infomask &= ~HEAP_XMAX_BITS;
	tuple->t_infomask |= HEAP_XMAX_INVALID;
	tuple->t_infomask2 &= ~(HEAP_KEYS_UPDATED | HEAP_HOT_UPDATED);
	HeapTupleHeaderSetXmax(tuple, InvalidTransactionId);
	return true;
}

/*
 * Writes a row whose header VACUUM froze, unless a concurrent change got there first (VACUUM
 * holds no row lock while scanning; the next VACUUM will freeze what this one skips).
 */
static bool
write_frozen_row(Relation rel, uint32 keyspace, HeapTuple tuple, HeapTupleHeader original)
{
	bool		written = false;

	uint64		rowid = ss_tid_to_rowid(&tuple->t_self);
	LWLock	   *lock = ss_row_lock(ss_tag(MyDatabaseId, rel->rd_node.relNode), rowid);
	HeapTuple	current;

	LWLockAcquire(lock, LW_EXCLUSIVE);
	current = ss_fetch_row(rel, keyspace, rowid);
	if (current != NULL && memcmp(current->t_data, original, SS_HEADER_SIZE) == 0)
	{
		ss_write_row(rel, keyspace, rowid, tuple, SS_ROW_HEADER);
		written = true;
	}
	LWLockRelease(lock);
	if (current != NULL)
		pfree(current);
	return written;
}

/* Lowers the oldest xid and multixact a row still holds, for relfrozenxid and relminmxid. */
static void
track_oldest_xids(HeapTupleHeader tuple, TransactionId *frozen_xid, MultiXactId *min_multi)
{
	TransactionId xmin = HeapTupleHeaderGetRawXmin(tuple);

	if (!HeapTupleHeaderXminFrozen(tuple) && TransactionIdIsNormal(xmin) &&
		TransactionIdPrecedes(xmin, *frozen_xid))
		*frozen_xid = xmin;
	if (!(tuple->t_infomask & HEAP_XMAX_INVALID))
	{
		TransactionId xmax = HeapTupleHeaderGetRawXmax(tuple);

		if (tuple->t_infomask & HEAP_XMAX_IS_MULTI)
		{
			if (MultiXactIdIsValid(xmax) && MultiXactIdPrecedes(xmax, *min_multi))
				*min_multi = xmax;
		}
		else if (TransactionIdIsNormal(xmax) && TransactionIdPrecedes(xmax, *frozen_xid))
			*frozen_xid = xmax;
	}
}

/*
 * Charges VACUUM's cost for a block of rows, as heap does per page, and leaves when the
 * postmaster is gone. Rows are not in shared buffers, so without this charge the cost-based
 * delay never sleeps, and vacuum_delay_point() (which checks the postmaster only after a
 * sleep) would let an autovacuum worker run on for minutes after a crash of the postmaster,
 * holding the old shared memory and keeping the server from starting again.
 */
static void
charge_block(bool dirtied)
{
	VacuumCostBalance += dirtied ? VacuumCostPageHit + VacuumCostPageDirty : VacuumCostPageHit;
	if (IsUnderPostmaster && !PostmasterIsAlive())
		exit(1);
	vacuum_delay_point();
}

/*
 * Removes the versions of aborted updates noted so far. They have no index entries, and no
 * chain leads to them, so they go at once, a batch at a time: a large rolled-back UPDATE
 * leaves one for every row it changed.
 */
static void
remove_orphans(Relation rel, uint32 keyspace, DeadRows *orphans, VacuumReport *report)
{
	for (int64 i = 0; i < orphans->count; i += SS_REMOVE_BATCH)
	{
		charge_block(true);
		ss_remove_rows(rel, keyspace, orphans->rowids + i,
					   (int) Min(SS_REMOVE_BATCH, orphans->count - i));
	}
	report->orphans += orphans->count;
	orphans->count = 0;
}

/*
 * Prunes the chain of redirect `r` from what the scan read when it can: the dead members from
 * the redirect's target on, each the version its predecessor's update inserted, up to a
 * version the scan found still needed; otherwise by walking the chain.
 */
static SsPruneResult
prune_after_scan(Relation rel, uint32 keyspace, const Redirect *r, const Redirects *redirects,
				 const DeadMembers *members, TransactionId oldest_xmin, SsPruneCounts *counts)
{
	uint64		removed[SS_SEEN_MEMBERS];
	int			nremoved = 0;
	uint64		next = r->target;
	TransactionId prior_xmax = InvalidTransactionId;
	TransactionId latest_removed = InvalidTransactionId;
	const DeadMember *m;

	while (nremoved < SS_SEEN_MEMBERS && (m = dead_members_find(members, next)) != NULL &&
		   (nremoved == 0 || TransactionIdEquals(m->xmin, prior_xmax)))
	{
		removed[nremoved++] = m->rowid;
		if (TransactionIdIsValid(m->removed_xid) &&
			(!TransactionIdIsValid(latest_removed) ||
			 TransactionIdFollows(m->removed_xid, latest_removed)))
			latest_removed = m->removed_xid;
		prior_xmax = m->update_xid;
		next = m->next;
	}
	if (nremoved == 0 || dead_members_find(members, next) != NULL ||
		!redirects_needed(redirects, next))
		return ss_prune_chain(rel, keyspace, r->root, NULL, oldest_xmin, counts);
	return ss_prune_chain_seen(rel, keyspace, r->root, r->target, removed, nremoved, next,
							   prior_xmax, latest_removed, oldest_xmin, counts);
}

/* Removes the index entries of the dead rows, then the rows. */
static void
remove_dead_rows(Relation rel, uint32 keyspace, DeadRows *dead, Relation *indexes, int nindexes,
				 IndexBulkDeleteResult **stats, BufferAccessStrategy strategy, double live,
				 VacuumReport *report)
{
	uint64		last_block = PG_UINT64_MAX;

	pgstat_progress_update_param(PROGRESS_VACUUM_PHASE, PROGRESS_VACUUM_PHASE_VACUUM_INDEX);
	for (int i = 0; i < nindexes; i++)
	{
		IndexVacuumInfo ivinfo = {0};

		ivinfo.index = indexes[i];
		ivinfo.analyze_only = false;
		ivinfo.report_progress = false;
		ivinfo.estimated_count = true;
		ivinfo.message_level = DEBUG2;
		ivinfo.num_heap_tuples = live;
		ivinfo.strategy = strategy;
		stats[i] = index_bulk_delete(&ivinfo, stats[i], tid_is_dead, dead);
	}
	/* A hot standby first cancels the queries that could still see these rows. */
	if (nindexes > 0)
		pgstat_progress_update_param(PROGRESS_VACUUM_NUM_INDEX_VACUUMS, ++report->index_passes);
	pgstat_progress_update_param(PROGRESS_VACUUM_PHASE, PROGRESS_VACUUM_PHASE_VACUUM_HEAP);
	if (ss_rel_needs_wal(rel) && TransactionIdIsValid(dead->latest_removed))
		ss_log_conflict(rel, dead->latest_removed);
	for (int64 i = 0; i < dead->count; i += SS_REMOVE_BATCH)
	{
		charge_block(true);
		ss_remove_rows(rel, keyspace, dead->rowids + i,
					   (int) Min(SS_REMOVE_BATCH, dead->count - i));
	}
	for (int64 i = 0; i < dead->count; i++)
	{
		if (dead->rowids[i] / SS_ROWS_PER_BLOCK != last_block)
			report->blocks_vacuumed++;
		last_block = dead->rowids[i] / SS_ROWS_PER_BLOCK;
	}
	pgstat_progress_update_param(PROGRESS_VACUUM_HEAP_BLKS_VACUUMED, report->blocks_vacuumed);
	report->removed += dead->count;
}

/*
 * Empties the dead row list: its rows and their index entries go, or, with index cleanup off,
 * stay (they are counted as kept). During the scan and the prunes after it, when the list is
 * full, and once at the end.
 */
static void
empty_dead_rows(Relation rel, uint32 keyspace, DeadRows *dead, const IndexPass *pass)
{
	if (dead->count > 0 && pass->dead_stay)
		pass->report->kept += dead->count;
	else if (dead->count > 0)
		remove_dead_rows(rel, keyspace, dead, pass->indexes, pass->nindexes, pass->stats,
						 pass->strategy, *pass->live, pass->report);
	dead->count = 0;
	dead->latest_removed = InvalidTransactionId;
	pgstat_progress_update_param(PROGRESS_VACUUM_NUM_DEAD_TUPLES, 0);
}

/*
 * Prunes the chains whose redirect names a version the scan did not find still needed (dead to
 * everyone by `oldest_xmin`, not met, or past the bitmap), and adds the roots of chains now
 * wholly dead to `dead`. A redirect whose version the scan found needed, or (with `trust_map`:
 * not an aggressive VACUUM) whose version lies in a block the visibility map marks all-visible,
 * skipped by the scan, leads to no dead version, so its chain is left alone without reading it
 * again: on a table of many updated rows nearly every root is such a redirect, and two point
 * reads for each made a VACUUM with nothing to do take seconds. That needed version was made
 * by a committed update, and with `oldest_xmin` fixed for the whole VACUUM, a version not dead
 * by it when the scan met it is not dead by it later: the prune would stop at it. A chain the
 * scan read whole is pruned without reading its dead members again (prune_after_scan).
 */
static void
prune_redirected_chains(Relation rel, uint32 keyspace, const Redirects *redirects,
						const DeadMembers *members, TransactionId oldest_xmin, bool trust_map,
						DeadRows *dead, const IndexPass *pass, SsPruneCounts *counts)
{
	bool		added = false;
	Buffer		vm_buffer = InvalidBuffer;

	for (int64 i = 0; i < redirects->count; i++)
	{
		const Redirect *r = &redirects->items[i];

		if (redirects_needed(redirects, r->target))
			continue;
		if (trust_map &&
			VM_ALL_VISIBLE(rel, (BlockNumber) (r->target / SS_ROWS_PER_BLOCK), &vm_buffer))
			continue;
		charge_block(true);
		if (prune_after_scan(rel, keyspace, r, redirects, members, oldest_xmin, counts) ==
			SS_PRUNE_DEAD_ROOT)
		{
			dead_rows_add(dead, r->root);
			added = true;
		}
		/* The roots fill the list too: a full one gets its pass over the indexes here. */
		if (dead->count >= dead->limit)
		{
			if (added)
				qsort(dead->rowids, dead->count, sizeof(uint64), rowid_cmp);
			added = false;
			empty_dead_rows(rel, keyspace, dead, pass);
		}
	}
	if (BufferIsValid(vm_buffer))
		ReleaseBuffer(vm_buffer);
	/* tid_is_dead searches them: ascending again. */
	if (added)
		qsort(dead->rowids, dead->count, sizeof(uint64), rowid_cmp);
}

/* The name VACUUM's messages give a relation: database, schema and table. */
static char *
qualified_name(Relation rel)
{
	char	   *database = get_database_name(MyDatabaseId);
	char	   *schema = get_namespace_name(RelationGetNamespace(rel));

	return psprintf("%s.%s.%s", database ? database : "?", schema ? schema : "?",
					RelationGetRelationName(rel));
}

/*
 * Says what VACUUM did, as heap's VACUUM does: at INFO for VERBOSE, at LOG for an autovacuum
 * that took at least log_autovacuum_min_duration. The message holds the counts a test can
 * compare; the detail, what varies from run to run (xids, WAL, time).
 */
static void
report_vacuum(Relation rel, struct VacuumParams *params, bool aggressive, VacuumReport *report,
			  TransactionId oldest_xmin, TransactionId old_frozen_xid,
			  TransactionId new_frozen_xid, bool frozen_xid_updated)
{
	bool		verbose = (params->options & VACOPT_VERBOSE) != 0;
	StringInfoData detail;
	WalUsage	wal = {0};
	const char *what;

	if (!verbose &&
		(!IsAutoVacuumWorkerProcess() || params->log_min_duration < 0 ||
		 (params->log_min_duration > 0 &&
		  !TimestampDifferenceExceeds(report->start, GetCurrentTimestamp(),
									  params->log_min_duration))))
		return;
	if (verbose)
		what = "finished vacuuming";
	else if (params->is_wraparound)
		what = aggressive ? "automatic aggressive vacuum to prevent wraparound of table"
			: "automatic vacuum to prevent wraparound of table";
	else
		what = aggressive ? "automatic aggressive vacuum of table" : "automatic vacuum of table";
	initStringInfo(&detail);
	appendStringInfo(&detail,
					 "removed: " INT64_FORMAT " dead rows from " INT64_FORMAT " blocks, " INT64_FORMAT
					 " pruned chain versions, " INT64_FORMAT " versions of aborted updates\n",
					 report->removed, report->blocks_vacuumed, report->prunes.pruned,
					 report->orphans);
	if (report->prunes.rewalked > 0)
		appendStringInfo(&detail, "chains changed since the scan, walked again: " INT64_FORMAT "\n",
						 report->prunes.rewalked);
	if (report->kept > 0)
		appendStringInfo(&detail, "index cleanup off: " INT64_FORMAT " dead rows kept\n",
						 report->kept);
	appendStringInfo(&detail, "blocks: %u read, %u skipped as all-visible, %u all-visible now, of %u\n",
					 report->read, Min(report->skipped, report->pages), report->all_visible,
					 report->pages);
	appendStringInfo(&detail, "removable cutoff: %u, which was %d XIDs old when operation ended\n",
					 oldest_xmin, (int32) (ReadNextTransactionId() - oldest_xmin));
	if (frozen_xid_updated)
		appendStringInfo(&detail, "new relfrozenxid: %u, which is %d XIDs ahead of previous value\n",
						 new_frozen_xid, (int32) (new_frozen_xid - old_frozen_xid));
	WalUsageAccumDiff(&wal, &pgWalUsage, &report->wal);
	appendStringInfo(&detail, "WAL usage: %lld records, %lld full page images, %llu bytes\n",
					 (long long) wal.wal_records, (long long) wal.wal_fpi,
					 (unsigned long long) wal.wal_bytes);
	appendStringInfo(&detail, "system usage: %s", pg_rusage_show(&report->usage));
	ereport(verbose ? INFO : LOG,
			(errmsg("%s \"%s\": " INT64_FORMAT " rows removed (%d index scans), %.0f remain, %.0f "
					"are dead but not yet removable; %u of %u blocks skipped as all-visible",
					what, qualified_name(rel),
					report->removed + report->prunes.pruned + report->orphans, report->index_passes,
					report->live,
					report->recently_dead, Min(report->skipped, report->pages), report->pages),
			 errdetail_internal("%s", detail.data)));
	pfree(detail.data);
}

/* VACUUM (not FULL) of one slipstream relation. */
static void
ss_relation_vacuum(Relation rel, struct VacuumParams *params, BufferAccessStrategy strategy)
{
	uint32		keyspace = ss_rel_keyspace(rel);
	TransactionId oldest_xmin,
				freeze_limit,
				new_frozen_xid;
	MultiXactId oldest_mxact,
				multi_cutoff,
				new_min_multi;
	Relation   *indexes;
	int			nindexes;
	IndexBulkDeleteResult **index_stats;
	DeadRows	dead;
	DeadRows	orphans = {0};
	VacuumReport report = {0};
	IndexPass	pass;
	TransactionId old_frozen_xid = rel->rd_rel->relfrozenxid;
	bool		frozen_xid_updated = false;
	Redirects	redirects;
	DeadMembers members;
	bool		freeze_conflict_logged = false;
	double		live = 0,
				recently_dead = 0;
	TableScanDesc scan;
	TupleTableSlot *slot;
	uint64		high;
	BlockNumber pages;
	BlockNumber map_blocks;
	BlockNumber all_visible;
	bool	   *candidate;
	bool		dead_stay;
	uint64		last_block = PG_UINT64_MAX;
	bool		dirtied_block = false;
	bool		aggressive;
	bool		may_skip;
	Buffer		vm_buffer = InvalidBuffer;
	BlockNumber skipped = 0;

	report.start = GetCurrentTimestamp();
	pg_rusage_init(&report.usage);
	report.wal = pgWalUsage;
	pgstat_progress_start_command(PROGRESS_COMMAND_VACUUM, RelationGetRelid(rel));
	aggressive = vacuum_set_xid_limits(rel, params->freeze_min_age, params->freeze_table_age,
									   params->multixact_freeze_min_age,
									   params->multixact_freeze_table_age, &oldest_xmin,
									   &oldest_mxact, &freeze_limit, &multi_cutoff);
	may_skip = !aggressive && !(params->options & VACOPT_DISABLE_PAGE_SKIPPING);
	if (params->options & VACOPT_VERBOSE)
		ereport(INFO, (errmsg(aggressive ? "aggressively vacuuming \"%s\"" : "vacuuming \"%s\"",
							  qualified_name(rel))));
	new_frozen_xid = oldest_xmin;
	new_min_multi = oldest_mxact;
	vac_open_indexes(rel, RowExclusiveLock, &nindexes, &indexes);
	index_stats = palloc0(sizeof(IndexBulkDeleteResult *) * Max(nindexes, 1));
	/* Indexes are vacuumed one after the other; a temporary table's are refused as heap does. */
	if (params->nworkers > 0 && nindexes > 1 &&
		params->index_cleanup != VACOPTVALUE_DISABLED && RelationUsesLocalBuffers(rel))
		ereport(WARNING,
				(errmsg("disabling parallel option of vacuum on \"%s\" --- cannot vacuum temporary tables in parallel",
						RelationGetRelationName(rel))));

	/*
	 * Blocks that may be all-visible once the dead rows are gone (the visibility map, see
	 * tableam/vismap.c); rows added after this look are checked again when the bits are set.
	 */
	high = ss_rowid_high(rel, keyspace);
	map_blocks = (BlockNumber) ((high + SS_ROWS_PER_BLOCK - 1) / SS_ROWS_PER_BLOCK);
	candidate = palloc(sizeof(bool) * Max(map_blocks, 1));
	redirects_init(&redirects, (uint64) map_blocks * SS_ROWS_PER_BLOCK);
	dead_members_init(&members);
	dead_rows_init(&dead);
	{
		const int	params_changed[] = {PROGRESS_VACUUM_PHASE, PROGRESS_VACUUM_TOTAL_HEAP_BLKS,
										PROGRESS_VACUUM_MAX_DEAD_TUPLES};
		const int64 values[] = {PROGRESS_VACUUM_PHASE_SCAN_HEAP, map_blocks, dead.limit};

		pgstat_progress_update_multi_param(3, params_changed, values);
	}
	memset(candidate, true, sizeof(bool) * map_blocks);
	dead_stay = nindexes > 0 && params->index_cleanup == VACOPTVALUE_DISABLED;
	pass.dead_stay = dead_stay;
	pass.indexes = indexes;
	pass.nindexes = nindexes;
	pass.stats = index_stats;
	pass.strategy = strategy;
	pass.live = &live;
	pass.report = &report;

	scan = table_beginscan(rel, SnapshotAny, 0, NULL);
	ss_scan_every_row(scan);
	slot = table_slot_create(rel, NULL);
	while (table_scan_getnextslot(scan, ForwardScanDirection, slot))
	{
		bool		should_free;
		HeapTuple	tuple = ExecFetchSlotHeapTuple(slot, false, &should_free);
		uint64		rowid = ss_tid_to_rowid(&tuple->t_self);
		TransactionId dead_after;
		TransactionId xmin = HeapTupleHeaderGetRawXmin(tuple->t_data);
		bool		changed = false;
		HeapTupleHeaderData original;
		uint64		block = rowid / SS_ROWS_PER_BLOCK;
		HTSV_Result state;

		if (block != last_block)
		{
			charge_block(dirtied_block);
			last_block = block;
			dirtied_block = false;
			/* A full dead row list: a pass over the indexes now, as heap's VACUUM makes. */
			if (dead.count >= dead.limit)
			{
				empty_dead_rows(rel, keyspace, &dead, &pass);
				pgstat_progress_update_param(PROGRESS_VACUUM_PHASE,
											 PROGRESS_VACUUM_PHASE_SCAN_HEAP);
			}
			pgstat_progress_update_param(PROGRESS_VACUUM_HEAP_BLKS_SCANNED,
										 Min(block, (uint64) map_blocks));
			pgstat_progress_update_param(PROGRESS_VACUUM_NUM_DEAD_TUPLES, dead.count);
			/* All-visible blocks hold nothing to do: on to the first block that may. */
			if (may_skip && block < map_blocks && VM_ALL_VISIBLE(rel, block, &vm_buffer))
			{
				BlockNumber next = (BlockNumber) block + 1;

				while (next < map_blocks && VM_ALL_VISIBLE(rel, next, &vm_buffer))
					next++;
				skipped += next - (BlockNumber) block;
				/*
				 * This row and those passed over: all live, as the bits say, but for redirects. A
				 * block at a time, leaving if the postmaster died (see charge_block).
				 */
				live += ss_is_redirect(tuple->t_data) ? 0 : 1;
				for (uint64 b = block + 1; b <= next; b++)
				{
					if (IsUnderPostmaster && !PostmasterIsAlive())
						exit(1);
					live += ss_scan_skip_to(scan, b * SS_ROWS_PER_BLOCK);
				}
				continue;
			}
			report.read++;
		}
		else
			vacuum_delay_point();
		memcpy(&original, tuple->t_data, SS_HEADER_SIZE);
		if (ss_is_redirect(tuple->t_data))
		{
			/*
			 * A pruned chain's root: once all of the chain is dead, it goes; otherwise it is
			 * pruned further after the scan if the version it names turns out dead.
			 */
			uint64		target = ss_redirect_target(rel, tuple);

			/*
			 * The block stays a candidate for all-visible: a redirect whose version every
			 * transaction sees, and whose changes clear this block, does not keep it from
			 * being one (ss_vm_update reads that version again).
			 */
			if (target == SS_NO_ROWID)
				dead_rows_add(&dead, rowid);
			else if (!redirects_add(&redirects, rowid, target) &&
					 ss_prune_chain(rel, keyspace, rowid, NULL, oldest_xmin, &report.prunes) ==
					 SS_PRUNE_DEAD_ROOT)
				dead_rows_add(&dead, rowid);
			continue;
		}
		state = ss_tuple_vacuum_state(tuple, oldest_xmin, &dead_after);
		if (state == HEAPTUPLE_DEAD && HeapTupleHeaderIsHeapOnly(tuple->t_data))
		{
			/*
			 * A dead chain member has no index entry. Its chain's prune removes it (at its dead
			 * root, which the scan met first: row ids grow along a chain; or after the scan,
			 * for a redirect that names it), unless its update aborted and no chain leads to
			 * it any more; a member still on a chain behind one that some transaction may see
			 * stays.
			 */
			if (!TransactionIdDidCommit(xmin) && !HeapTupleHeaderXminFrozen(tuple->t_data))
			{
				dead_rows_add(&orphans, rowid);
				if (orphans.count == SS_REMOVE_BATCH)
					remove_orphans(rel, keyspace, &orphans, &report);
			}
			else
			{
				/* Its chain's prune removes it: the block stays a candidate for all-visible. */
				track_oldest_xids(tuple->t_data, &new_frozen_xid, &new_min_multi);
				dead_members_add(&members, tuple);
			}
			continue;
		}
		if (state == HEAPTUPLE_DEAD && HeapTupleHeaderIsHotUpdated(tuple->t_data))
		{
			/*
			 * A dead chain root: it becomes a redirect past the dead versions it leads to, which
			 * may leave its block all-visible (see the redirects above).
			 */
			if (ss_prune_chain(rel, keyspace, rowid, NULL, oldest_xmin, &report.prunes) ==
				SS_PRUNE_DEAD_ROOT)
				dead_rows_add(&dead, rowid);
			continue;
		}
		if (HeapTupleHeaderIsHeapOnly(tuple->t_data))
			redirects_note_needed(&redirects, rowid);
		/* A dead row does not keep its block from all-visible if it is about to be removed. */
		if (state == HEAPTUPLE_DEAD ? dead_stay : !ss_vm_row_all_visible(tuple, state, oldest_xmin))
		{
			uint64		root;

			if (block < map_blocks)
				candidate[block] = false;
			/* Nor can its root's block, whose index entries lead here (met earlier). */
			if (ss_member_root(tuple, &root) && root / SS_ROWS_PER_BLOCK < map_blocks)
				candidate[root / SS_ROWS_PER_BLOCK] = false;
		}
		switch (state)
		{
			case HEAPTUPLE_DEAD:
				dead_rows_add(&dead, rowid);
				HeapTupleHeaderAdvanceLatestRemovedXid(tuple->t_data, &dead.latest_removed);
				/* Without index cleanup the row stays: its xids hold relfrozenxid back. */
				if (dead_stay)
					track_oldest_xids(tuple->t_data, &new_frozen_xid, &new_min_multi);
				continue;
			case HEAPTUPLE_LIVE:
				live += 1;
				if (!HeapTupleHeaderXminFrozen(tuple->t_data) && TransactionIdIsNormal(xmin) &&
					TransactionIdPrecedes(xmin, freeze_limit))
				{
					tuple->t_data->t_infomask |= HEAP_XMIN_FROZEN;
					changed = true;
				}
				changed |= clear_stale_xmax(tuple->t_data);
				break;
			case HEAPTUPLE_RECENTLY_DEAD:
				recently_dead += 1;
				break;
			default:
				live += 1;
				break;
		}
		if (changed && !freeze_conflict_logged && ss_rel_needs_wal(rel))
		{
			/* As heap's freeze records: standby queries older than the limit must end. */
			TransactionId horizon = freeze_limit;

			TransactionIdRetreat(horizon);
			ss_log_conflict(rel, horizon);
			freeze_conflict_logged = true;
		}
		dirtied_block |= changed;
		if (changed && !write_frozen_row(rel, keyspace, tuple, &original))
			memcpy(tuple->t_data, &original, SS_HEADER_SIZE);	/* account for what stays */
		track_oldest_xids(tuple->t_data, &new_frozen_xid, &new_min_multi);
	}
	ExecDropSingleTupleTableSlot(slot);
	table_endscan(scan);
	if (BufferIsValid(vm_buffer))
		ReleaseBuffer(vm_buffer);
	pgstat_progress_update_param(PROGRESS_VACUUM_HEAP_BLKS_SCANNED, map_blocks);
	prune_redirected_chains(rel, keyspace, &redirects, &members, oldest_xmin, may_skip, &dead,
							&pass, &report.prunes);
	redirects_free(&redirects);
	dead_members_free(&members);

	/* The skipped blocks' xids were not looked at: relfrozenxid and relminmxid stay. */
	if (skipped > 0)
	{
		new_frozen_xid = InvalidTransactionId;
		new_min_multi = InvalidMultiXactId;
	}

	remove_orphans(rel, keyspace, &orphans, &report);

	empty_dead_rows(rel, keyspace, &dead, &pass);
	if (nindexes > 0)
		pgstat_progress_update_param(PROGRESS_VACUUM_PHASE,
									 PROGRESS_VACUUM_PHASE_INDEX_CLEANUP);
	for (int i = 0; i < nindexes; i++)
	{
		IndexVacuumInfo ivinfo = {0};

		ivinfo.index = indexes[i];
		ivinfo.estimated_count = false;
		ivinfo.message_level = DEBUG2;
		ivinfo.num_heap_tuples = live;
		ivinfo.strategy = strategy;
		index_stats[i] = index_vacuum_cleanup(&ivinfo, index_stats[i]);
		if (index_stats[i] != NULL && !index_stats[i]->estimated_count)
			vac_update_relstats(indexes[i], index_stats[i]->num_pages,
								index_stats[i]->num_index_tuples, 0, false,
								InvalidTransactionId, InvalidMultiXactId, NULL, NULL, false);
	}
	vac_close_indexes(nindexes, indexes, NoLock);

	pgstat_progress_update_param(PROGRESS_VACUUM_PHASE, PROGRESS_VACUUM_PHASE_FINAL_CLEANUP);
	all_visible = ss_vm_update(rel, keyspace, oldest_xmin, candidate, map_blocks, strategy);
	pfree(candidate);
	high = ss_rowid_high(rel, keyspace);
	pages = (BlockNumber) ((high + SS_ROWS_PER_BLOCK - 1) / SS_ROWS_PER_BLOCK);
	vac_update_relstats(rel, pages, live, Min(all_visible, pages), nindexes > 0, new_frozen_xid,
						new_min_multi, &frozen_xid_updated, NULL, false);
	pgstat_report_vacuum(RelationGetRelid(rel), rel->rd_rel->relisshared, (PgStat_Counter) live,
						 (PgStat_Counter) recently_dead);
	report.live = live;
	report.recently_dead = recently_dead;
	report.pages = pages;
	report.skipped = skipped;
	report.all_visible = Min(all_visible, pages);
	report_vacuum(rel, params, aggressive, &report, oldest_xmin, old_frozen_xid, new_frozen_xid,
				  frozen_xid_updated);
	pgstat_progress_end_command();
}

/*
 * Index AMs ask which entries point at rows dead to everyone (bottom-up and simple deletion):
 * an entry names a chain root, and may go once the whole chain is dead. A missing root is left
 * alone: VACUUM removes rows only after their index entries, so such an entry is one VACUUM is
 * already deleting.
 */
static TransactionId
ss_index_delete_tuples(Relation rel, TM_IndexDeleteOp *delstate)
{
	uint32		keyspace = ss_rel_keyspace(rel);
	GlobalVisState *vistest = GlobalVisTestFor(rel);
	TransactionId latest_removed = InvalidTransactionId;

	for (int i = 0; i < delstate->ndeltids; i++)
	{
		TM_IndexDelete *d = &delstate->deltids[i];
		TM_IndexStatus *status = &delstate->status[d->id];

		if (!ss_tid_valid(&d->tid))
			continue;
		/* An entry names a chain's root: it may go once every version of the chain is dead. */
		if (ss_chain_all_dead(rel, keyspace, ss_tid_to_rowid(&d->tid), vistest, &latest_removed))
			status->knowndeletable = true;
	}
	return latest_removed;
}

/* Installs the callbacks of this file. */
void
ss_init_vacuum_callbacks(TableAmRoutine *am)
{
	am->relation_vacuum = ss_relation_vacuum;
	am->index_delete_tuples = ss_index_delete_tuples;
}
