/*
 * tableam/chains.c: HOT-like version chains. An UPDATE that changes no indexed column writes
 * its new version at a new row id, as every update does, but marks it heap-only and leaves the
 * indexes alone: their entries keep naming the chain's root row id, and a fetch walks t_ctid
 * from the root to the version its snapshot sees.
 *
 * A chain's members live in other 256-row blocks than its root (row ids only grow), so every hop
 * is one engine point read; pruning keeps chains short. A prune rewrites the root as a redirect
 * (a header-only row, flagged SS_HEAP_REDIRECT, whose t_ctid names the first member still
 * needed, or the root itself once the whole chain is dead) and removes the members it skipped,
 * in one WAL record and one engine batch. It runs under the root's row lock, which serialises
 * prunes of a chain; no lock keeps readers out, so a reader that finds a member missing starts
 * again from the root, the last time under that lock in share mode, where a missing member can
 * only be one that was never on the chain (an aborted update's version, which VACUUM removes).
 */
#include "slipstream.h"

#include "access/heapam_xlog.h"
#include "access/transam.h"
#include "access/xlog.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/procarray.h"
#include "utils/inval.h"
#include "utils/snapmgr.h"

/* From which restart on a walk that found a member gone holds the root's row lock. */
#define SS_CHAIN_RESTARTS 3

/* A chain walk of a fetch whose snapshot saw at least this many dead versions prunes it. */
#define SS_PRUNE_MIN_DEAD 2

/*
 * Starts a walk of the chain rooted at `root`; with an MVCC snapshot, from where the chain
 * cache says the versions it may see begin (the versions before are dead to everyone).
 */
void
ss_chain_start(SsChainWalk *walk, Relation rel, uint32 keyspace, uint64 root,
			   Snapshot snapshot)
{
	memset(walk, 0, sizeof(*walk));
	walk->rel = rel;
	walk->keyspace = keyspace;
	walk->root = root;
	walk->next = root;
	walk->prior_xmax = InvalidTransactionId;
	walk->last_returned = SS_NO_ROWID;
	walk->all_dead = true;
	walk->tag = ss_tag(MyDatabaseId, rel->rd_node.relNode);
	if (snapshot != NULL && IsMVCCSnapshot(snapshot))
	{
		uint64		first_needed;
		TransactionId first_xmin;

		walk->cacheable = true;
		if (ss_chain_cache_lookup(keyspace, walk->tag, root, &first_needed, &first_xmin) &&
			first_needed != root)
		{
			walk->next = first_needed;
			walk->cache_start = first_needed;
			walk->cache_xmin = first_xmin;
			walk->from_cache = true;
		}
	}
}

/*
 * Where a redirect sends a walk: its target, or SS_NO_ROWID when it names itself (the whole
 * chain is dead). A target that is no row id of ours is corruption, reported, not followed.
 */
uint64
ss_redirect_target(Relation rel, HeapTuple redirect)
{
	if (ItemPointerEquals(&redirect->t_self, &redirect->t_data->t_ctid))
		return SS_NO_ROWID;
	if (!ss_tid_valid(&redirect->t_data->t_ctid))
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("slipstream: the redirect at row " UINT64_FORMAT " of \"%s\" names no row",
						ss_tid_to_rowid(&redirect->t_self), RelationGetRelationName(rel))));
	return ss_tid_to_rowid(&redirect->t_data->t_ctid);
}

/*
 * Whether `tuple`, read where its chain's previous version pointed, is that chain's next
 * version: heap-only, and made by the update (`prior_xmax`, if known) that ended the previous
 * one, as heap_hot_search_buffer checks.
 */
static bool
next_in_chain(HeapTuple tuple, TransactionId prior_xmax)
{
	return HeapTupleHeaderIsHeapOnly(tuple->t_data) && !ss_is_redirect(tuple->t_data) &&
		(!TransactionIdIsValid(prior_xmax) ||
		 TransactionIdEquals(prior_xmax, HeapTupleHeaderGetXmin(tuple->t_data)));
}

/* Whether the walk may go on from `tuple` to its successor, which it then names. */
static bool
chain_continues(HeapTuple tuple, uint64 *next, TransactionId *prior_xmax)
{
	if (!HeapTupleHeaderIsHotUpdated(tuple->t_data) ||
		!ss_tid_valid(&tuple->t_data->t_ctid) ||
		ItemPointerEquals(&tuple->t_self, &tuple->t_data->t_ctid))
		return false;
	*next = ss_tid_to_rowid(&tuple->t_data->t_ctid);
	*prior_xmax = HeapTupleHeaderGetUpdateXid(tuple->t_data);
	return true;
}

/* Whether a version is dead to every transaction, now and to come. */
static bool
surely_dead(HeapTuple tuple, GlobalVisState *vistest, TransactionId oldest_xmin)
{
	TransactionId dead_after;
	HTSV_Result state = ss_tuple_vacuum_state(tuple, oldest_xmin, &dead_after);

	if (state == HEAPTUPLE_DEAD)
		return true;
	return vistest != NULL && state == HEAPTUPLE_RECENTLY_DEAD &&
		GlobalVisTestIsRemovableXid(vistest, dead_after);
}

/*
 * Starts the walk again from the root after a member vanished under it; from the last try on,
 * under the root's row lock, which holds prunes of the chain off (a member missing then is
 * the end of the chain). A walk that returns a version releases the lock, so a non-MVCC walk
 * may come here again: it takes the lock again.
 */
static void
restart_walk(SsChainWalk *walk)
{
	walk->restarts++;
	if (walk->restarts >= SS_CHAIN_RESTARTS)
	{
		walk->lock = ss_row_lock(walk->tag, walk->root);
		LWLockAcquire(walk->lock, LW_SHARED);
	}
	if (walk->from_cache)
	{
		/*
		 * The walk from the cache's start failed (that version is gone or another row took its
		 * row id, or a member after it vanished): forget the entry unless it moved on; the walk
		 * from the root writes it again when it finds the first version still needed.
		 */
		ss_chain_cache_forget(walk->keyspace, walk->tag, walk->root, walk->cache_start);
		walk->from_cache = false;
	}
	walk->next = walk->root;
	walk->prior_xmax = InvalidTransactionId;
	walk->all_dead = true;
	walk->dead_seen = 0;
}

/* Ends a walk: releases the lock a last restart took. */
static void
finish_walk(SsChainWalk *walk)
{
	walk->next = SS_NO_ROWID;
	/* (An error in between released it already, with every LWLock.) */
	if (walk->lock != NULL && LWLockHeldByMe(walk->lock))
		LWLockRelease(walk->lock);
	walk->lock = NULL;
}

/*
 * The next version of the chain that `snapshot` sees, palloc'd in the current memory context,
 * or NULL at the end of the chain. `root_tuple`, if not NULL, is the root's row already read
 * (it is handed over). An MVCC snapshot sees at most one version; other snapshots may call
 * again for the next one. Every version looked at is reported to SSI; walk->all_dead says
 * whether every version walked is dead to everyone (when `vistest` is given).
 */
HeapTuple
ss_chain_next_visible(SsChainWalk *walk, Snapshot snapshot, HeapTuple root_tuple,
					  GlobalVisState *vistest)
{
	if (root_tuple != NULL && walk->from_cache)
	{
		pfree(root_tuple);		/* the walk starts past the root */
		root_tuple = NULL;
	}
	while (walk->next != SS_NO_ROWID)
	{
		uint64		rowid = walk->next;
		bool		at_root = (rowid == walk->root);
		HeapTuple	tuple;
		bool		visible;

		CHECK_FOR_INTERRUPTS();
		if (at_root && root_tuple != NULL)
		{
			tuple = root_tuple;
			root_tuple = NULL;
		}
		else
		{
			tuple = ss_fetch_row(walk->rel, walk->keyspace, rowid);
			walk->reads++;
		}
		if (tuple == NULL)
		{
			/* A missing root was removed by VACUUM; a missing member, maybe by a prune. */
			if (at_root || walk->lock != NULL)
				finish_walk(walk);
			else
				restart_walk(walk);
			continue;
		}
		if (walk->from_cache && rowid == walk->cache_start &&
			HeapTupleHeaderGetRawXmin(tuple->t_data) != walk->cache_xmin)
		{
			/* The row id the cache named was handed out again: walk from the root. */
			pfree(tuple);
			restart_walk(walk);
			continue;
		}
		if (walk->from_cache && rowid == walk->cache_start &&
			!HeapTupleHeaderXminInvalid(tuple->t_data))
		{
			/*
			 * The versions before the one the cache names were dead to everyone when the entry
			 * was written, so the update that ended the last of them, which inserted this one
			 * (the chain's links say so), committed below every snapshot's horizon: this
			 * version's xmin is committed for every snapshot, what HEAP_XMIN_COMMITTED means
			 * when VACUUM sets it (tableam/visibility.c). Marked in this copy, it spares the
			 * visibility check a commit log lookup, whose shared lock is a cache line every
			 * reading backend writes.
			 */
			tuple->t_data->t_infomask |= HEAP_XMIN_COMMITTED;
		}
		if (at_root && ss_is_redirect(tuple->t_data))
		{
			walk->next = ss_redirect_target(walk->rel, tuple);
			if (walk->next == SS_NO_ROWID)
				finish_walk(walk);	/* the whole chain is dead */
			pfree(tuple);
			continue;
		}
		if (at_root ? HeapTupleHeaderIsHeapOnly(tuple->t_data)
			: !next_in_chain(tuple, walk->prior_xmax))
		{
			pfree(tuple);
			finish_walk(walk);
			continue;
		}
		if (!chain_continues(tuple, &walk->next, &walk->prior_xmax))
			finish_walk(walk);
		/* After a restart, versions returned before are skipped: row ids grow along a chain. */
		if (walk->last_returned != SS_NO_ROWID && rowid <= walk->last_returned)
		{
			walk->all_dead = false;
			pfree(tuple);
			continue;
		}
		visible = ss_tuple_visible(tuple, snapshot);
		ss_conflict_out(walk->rel, tuple, visible, snapshot);
		/* all_dead holds while every version so far is dead: they are the prunable prefix. */
		if (walk->all_dead)
		{
			if (!visible && vistest != NULL && surely_dead(tuple, vistest, InvalidTransactionId))
				walk->dead_seen++;
			else
			{
				walk->all_dead = false;
				if (walk->cacheable && vistest != NULL && rowid != walk->root)
					ss_chain_cache_remember(walk->keyspace, walk->tag, walk->root, rowid,
											HeapTupleHeaderGetRawXmin(tuple->t_data));
			}
		}
		if (!visible)
		{
			pfree(tuple);
			continue;
		}
		walk->last_returned = rowid;
		if (IsMVCCSnapshot(snapshot))
			finish_walk(walk);
		else if (walk->lock != NULL)
		{
			LWLockRelease(walk->lock);	/* no lock is held across a return */
			walk->lock = NULL;
		}
		return tuple;
	}
	return NULL;
}

/* Releases what a walk that stopped early still holds. */
void
ss_chain_end(SsChainWalk *walk)
{
	finish_walk(walk);
}

/*
 * Prunes the chain a walk with an MVCC snapshot went along if it found enough dead versions
 * there, as heap prunes a page on access (never during recovery: a standby changes nothing).
 */
void
ss_chain_prune_if_worth(SsChainWalk *walk, Snapshot snapshot, GlobalVisState *vistest)
{
	if (walk->dead_seen >= SS_PRUNE_MIN_DEAD && IsMVCCSnapshot(snapshot) &&
		!RecoveryInProgress())
		(void) ss_prune_chain(walk->rel, walk->keyspace, walk->root, vistest,
							  InvalidTransactionId, NULL);
}

/* Room for a redirect row's value, aligned as a tuple header. */
typedef union RedirectRow
{
	HeapTupleHeaderData header;
	char		bytes[SS_REDIRECT_SIZE];
} RedirectRow;

/* The value of a redirect row: a header, invisible to every snapshot, naming `target`. */
static void
make_redirect(HeapTupleHeader header, uint64 target)
{
	memset(header, 0, SS_REDIRECT_SIZE);
	header->t_infomask = HEAP_XMIN_INVALID | HEAP_XMAX_INVALID;
	header->t_infomask2 = SS_HEAP_REDIRECT;
	header->t_hoff = SS_REDIRECT_SIZE;
	ss_rowid_to_tid(target, &header->t_ctid);
}

/*
 * Prunes the chain rooted at `root`: the dead versions at its start are removed and the root
 * becomes a redirect to the first version some transaction may still see (or to itself when
 * none is left). Dead means dead to everyone by `vistest`, or, for VACUUM (vistest NULL), by
 * `oldest_xmin`. Returns SS_PRUNE_DEAD_ROOT when the root is (now) a redirect to itself, which
 * VACUUM removes with its index entries; SS_PRUNE_NOT_ROOT when `root` is no chain root.
 * `counts`, if not NULL, gains the number of versions removed (VACUUM's report; a root left
 * dead counts where VACUUM removes it).
 */
SsPruneResult
ss_prune_chain(Relation rel, uint32 keyspace, uint64 root, GlobalVisState *vistest,
			   TransactionId oldest_xmin, SsPruneCounts *counts)
{
	uint64		tag = ss_tag(MyDatabaseId, rel->rd_node.relNode);
	LWLock	   *lock = ss_row_lock(tag, root);
	HeapTuple	tuple;
	uint64	   *removed = NULL;
	int			nremoved = 0;
	int			capacity = 0;
	uint64		next;
	uint64		target;
	TransactionId target_xmin = InvalidTransactionId;
	TransactionId prior_xmax = InvalidTransactionId;
	TransactionId latest_removed = InvalidTransactionId;
	bool		was_redirect;
	int			reclaimed = 0;
	SsPruneResult result = SS_PRUNE_KEPT;
	RedirectRow redirect;

	LWLockAcquire(lock, LW_EXCLUSIVE);
	tuple = ss_fetch_row(rel, keyspace, root);
	if (tuple == NULL)
	{
		LWLockRelease(lock);
		return SS_PRUNE_NOT_ROOT;
	}
	was_redirect = ss_is_redirect(tuple->t_data);
	if (was_redirect)
	{
		next = ss_redirect_target(rel, tuple);
		if (next == SS_NO_ROWID)
		{
			LWLockRelease(lock);
			pfree(tuple);
			return SS_PRUNE_DEAD_ROOT;
		}
	}
	else if (HeapTupleHeaderIsHeapOnly(tuple->t_data) ||
			 !surely_dead(tuple, vistest, oldest_xmin))
	{
		result = HeapTupleHeaderIsHeapOnly(tuple->t_data) ? SS_PRUNE_NOT_ROOT : SS_PRUNE_KEPT;
		LWLockRelease(lock);
		pfree(tuple);
		return result;
	}
	else
	{
		HeapTupleHeaderAdvanceLatestRemovedXid(tuple->t_data, &latest_removed);
		if (!chain_continues(tuple, &next, &prior_xmax))
			next = SS_NO_ROWID;
	}
	pfree(tuple);

	/* Walk the dead prefix; `target` ends as the first version still needed. */
	target = SS_NO_ROWID;
	while (next != SS_NO_ROWID)
	{
		HeapTuple	member = ss_fetch_row(rel, keyspace, next);
		uint64		current = next;

		if (member == NULL || !next_in_chain(member, prior_xmax))
		{
			if (member != NULL)
				pfree(member);
			break;				/* the chain ends here: everything before it was dead */
		}
		if (!surely_dead(member, vistest, oldest_xmin))
		{
			target = current;
			target_xmin = HeapTupleHeaderGetRawXmin(member->t_data);
			pfree(member);
			break;
		}
		HeapTupleHeaderAdvanceLatestRemovedXid(member->t_data, &latest_removed);
		if (nremoved == capacity)
		{
			capacity = Max(16, capacity * 2);
			removed = removed == NULL ? palloc(sizeof(uint64) * capacity)
				: repalloc(removed, sizeof(uint64) * capacity);
		}
		removed[nremoved++] = current;
		if (!chain_continues(member, &next, &prior_xmax))
			next = SS_NO_ROWID;
		pfree(member);
	}
	if (target == SS_NO_ROWID)
	{
		target = root;
		result = SS_PRUNE_DEAD_ROOT;
	}
	if (!was_redirect || nremoved > 0)
	{
		make_redirect(&redirect.header, target);
		ss_write_prune(rel, keyspace, root, &redirect.header, removed, nremoved,
					   latest_removed);
		/* A root that held a row and still leads on lost that row; a dead root goes later. */
		if (counts != NULL)
			counts->pruned += nremoved + (!was_redirect && result != SS_PRUNE_DEAD_ROOT ? 1 : 0);
		/*
		 * A prune on access tells the statistics what it reclaimed, as heap's page prune does,
		 * so that autovacuum counts only the dead versions left for VACUUM: the members and a
		 * root that held a row, less a root now dead with its chain (its index entries wait for
		 * VACUUM). VACUUM reports its own counts when it ends.
		 */
		if (vistest != NULL)
			reclaimed = nremoved + (was_redirect ? 0 : 1) - (result == SS_PRUNE_DEAD_ROOT ? 1 : 0);
	}
	LWLockRelease(lock);
	if (reclaimed > 0)
		pgstat_update_heap_dead_tuples(rel, reclaimed);
	/* The next fetch starts at the new target, not at a version now gone. */
	if (target != root)
		ss_chain_cache_remember(keyspace, tag, root, target, target_xmin);
	else
		ss_chain_cache_forget(keyspace, tag, root, SS_NO_ROWID);
	if (removed != NULL)
		pfree(removed);
	return result;
}

/*
 * VACUUM's prune of a chain whose members its scan has read: the root, which the scan found a
 * redirect to `expected`, is read again under its row lock and, still that, made a redirect to
 * `target` (a version the scan found still needed) past the `nremoved` dead members `removed`,
 * which are not read again. Members dead by VACUUM's horizon stay dead, their links do not
 * change, and only a prune removes them, which rewrites the root first: an unchanged root
 * means the chain from `expected` to `target` is as the scan saw it. A root changed since
 * falls back to ss_prune_chain, which walks the chain. `counts` as there.
 */
SsPruneResult
ss_prune_chain_seen(Relation rel, uint32 keyspace, uint64 root, uint64 expected,
					uint64 *removed, int nremoved, uint64 target,
					TransactionId target_xmin, TransactionId latest_removed,
					TransactionId oldest_xmin, SsPruneCounts *counts)
{
	uint64		tag = ss_tag(MyDatabaseId, rel->rd_node.relNode);
	LWLock	   *lock = ss_row_lock(tag, root);
	HeapTuple	tuple;
	bool		unchanged;
	RedirectRow redirect;

	LWLockAcquire(lock, LW_EXCLUSIVE);
	tuple = ss_fetch_row(rel, keyspace, root);
	unchanged = tuple != NULL && ss_is_redirect(tuple->t_data) &&
		ss_redirect_target(rel, tuple) == expected;
	if (tuple != NULL)
		pfree(tuple);
	if (!unchanged)
	{
		LWLockRelease(lock);
		if (counts != NULL)
			counts->rewalked++;
		return ss_prune_chain(rel, keyspace, root, NULL, oldest_xmin, counts);
	}
	make_redirect(&redirect.header, target);
	ss_write_prune(rel, keyspace, root, &redirect.header, removed, nremoved,
				   latest_removed);
	if (counts != NULL)
		counts->pruned += nremoved;
	LWLockRelease(lock);
	ss_chain_cache_remember(keyspace, tag, root, target, target_xmin);
	return SS_PRUNE_KEPT;
}

/*
 * Whether every version of the chain an index entry names (its root) is dead to everyone by
 * `vistest`, so that the entry may go (the index AMs' bottom-up and simple deletion). The walk
 * holds the root's row lock in share mode, so that no prune moves the chain under it; a
 * missing root is reported as not dead (VACUUM, which removes rows only after their entries,
 * is deleting it). When all are dead, *latest_removed is advanced over them.
 */
bool
ss_chain_all_dead(Relation rel, uint32 keyspace, uint64 root, GlobalVisState *vistest,
				  TransactionId *latest_removed)
{
	LWLock	   *lock = ss_row_lock(ss_tag(MyDatabaseId, rel->rd_node.relNode), root);
	uint64		next = root;
	TransactionId prior_xmax = InvalidTransactionId;
	TransactionId removed_xid = InvalidTransactionId;
	bool		all_dead = true;

	LWLockAcquire(lock, LW_SHARED);
	while (next != SS_NO_ROWID && all_dead)
	{
		HeapTuple	tuple = ss_fetch_row(rel, keyspace, next);
		bool		at_root = (next == root);

		if (tuple == NULL)
		{
			all_dead = !at_root;
			break;
		}
		if (at_root && ss_is_redirect(tuple->t_data))
		{
			next = ss_redirect_target(rel, tuple);
			pfree(tuple);
			continue;
		}
		if (!at_root && !next_in_chain(tuple, prior_xmax))
		{
			pfree(tuple);
			break;				/* not on this chain: the chain ended before it */
		}
		if (!surely_dead(tuple, vistest, InvalidTransactionId))
			all_dead = false;
		else
		{
			HeapTupleHeaderAdvanceLatestRemovedXid(tuple->t_data, &removed_xid);
			if (!chain_continues(tuple, &next, &prior_xmax))
				next = SS_NO_ROWID;
		}
		pfree(tuple);
	}
	LWLockRelease(lock);
	if (all_dead && TransactionIdIsValid(removed_xid) &&
		(!TransactionIdIsValid(*latest_removed) ||
		 TransactionIdFollows(removed_xid, *latest_removed)))
		*latest_removed = removed_xid;
	return all_dead;
}
