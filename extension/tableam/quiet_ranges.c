/*
 * tableam/quiet_ranges.c: index fetches that skip the memtables. A point read asks each
 * memtable's hash index before the levels, and for a row no memtable holds (most rows of a
 * table loaded a while ago) that probe is a cache miss or two for nothing: a fifth of an E-like
 * range scan's time in the profiles. When a scan's fetches ascend (keys inserted in order have
 * ascending chain roots), one seek per memtable finds the first row id at or after the fetch
 * that a memtable holds; the row ids below it form a quiet range, whose roots are read from
 * the levels alone.
 *
 * Why that serves an MVCC snapshot as well as a full read: the seek comes after the snapshot
 * was taken, so nothing a transaction it sees wrote into the range is missing from the levels.
 * What was written there since (a new version's header, a lock, a prune's redirect) was
 * written by a transaction it does not see, or by a later command of its own: each row stays
 * visible to it or not as before, and a row added since is invisible (bitmap scans rely on the
 * same when they read a block's rows and hand them out later). A root pruned since was dead
 * to this snapshot too; a walk that follows its stale t_ctid to a removed member starts again
 * from the root with full reads (tableam/chains.c). Serializable reads lose nothing: the
 * relation-level predicate lock is taken at every fetch before its row is read. Other
 * snapshots need rows as they are now, and so does a fetch with another snapshot than the
 * one the range was found for.
 */
#include "slipstream.h"

#include "utils/snapmgr.h"

/* Row ids the first seek of a run covers, and the most one covers. */
#define SS_QUIET_FIRST 32
#define SS_QUIET_MAX 4096

/* A fetch at most this far past the previous one continues an ascending run. */
#define SS_QUIET_GAP 4

/* A seek that finds fewer quiet row ids than this did not pay for itself. */
#define SS_QUIET_MIN_YIELD 8

/*
 * Fetches that skip the seek after one that did not pay, at first and at most: the pause
 * doubles with every such seek in a row. It is kept per keyspace across scans, since each
 * statement starts a scan of its own: on a table whose memtables hold rows everywhere (one
 * updated all over since the last flush) the seeks of short range scans found runs of a row
 * or two, and cost more than the probes they saved.
 */
#define SS_QUIET_PAUSE_FIRST 16
#define SS_QUIET_PAUSE_MAX 4096

/* The pause of a keyspace: fetches left to skip, and the length of the next pause. */
typedef struct QuietPause
{
	uint32		keyspace;
	int			left;
	int			next;
} QuietPause;

#define SS_QUIET_PAUSES 16
StaticAssertDecl(SS_QUIET_PAUSES == 1 << 4, "pause_of takes the hash's top 4 bits");
static QuietPause quiet_pauses[SS_QUIET_PAUSES];

/* The pause of `keyspace` (direct-mapped: a keyspace taking another's entry starts afresh). */
static QuietPause *
pause_of(uint32 keyspace)
{
	QuietPause *pause = &quiet_pauses[(keyspace * (uint32) 0x9E3779B1) >> 28];

	if (pause->keyspace != keyspace || pause->next == 0)
	{
		pause->keyspace = keyspace;
		pause->left = 0;
		pause->next = SS_QUIET_PAUSE_FIRST;
	}
	return pause;
}

/* Forgets the range and the run. */
void
ss_quiet_reset(SsQuietRange *quiet)
{
	memset(quiet, 0, sizeof(*quiet));
	quiet->last_rowid = SS_NO_ROWID;
	quiet->width = SS_QUIET_FIRST;
}

/* Whether `snapshot` is the one the range was found for. */
static bool
same_snapshot(SsQuietRange *quiet, Snapshot snapshot)
{
	return quiet->snapshot == snapshot && quiet->curcid == snapshot->curcid &&
		quiet->xmin == snapshot->xmin && quiet->xmax == snapshot->xmax;
}

/* Seeks the memtables for the quiet range starting at `rowid`; false if it is empty. */
static bool
find_range(SsQuietRange *quiet, uint32 keyspace, uint64 rowid, Snapshot snapshot)
{
	char		lo[SS_KEY_SIZE];
	char		hi[SS_KEY_SIZE];
	uint64		end = Min(rowid + quiet->width, SS_MAX_ROWID);
	bool		held;
	const char *first;
	size_t		first_len;
	SsCode		code;

	ss_encode_key(rowid, lo);
	ss_encode_key(end, hi);
	code = ss_first_memtable_key(keyspace, lo, hi, SS_KEY_SIZE, &held, &first, &first_len);
	if (code != SS_OK)
		ss_report(code, "looking for rows in the memtables");
	if (held && first_len != SS_KEY_SIZE)
		ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED),
						errmsg("slipstream: a row key has %zu bytes instead of %d", first_len,
							   SS_KEY_SIZE)));
	if (held)
		end = ss_decode_key(first);
	quiet->snapshot = snapshot;
	quiet->curcid = snapshot->curcid;
	quiet->xmin = snapshot->xmin;
	quiet->xmax = snapshot->xmax;
	quiet->lo = rowid;
	quiet->hi = end;
	quiet->width = Min(quiet->width * 2, SS_QUIET_MAX);
	return end > rowid;
}

/*
 * Root `rowid` read from the levels alone, palloc'd in the current memory context, or NULL
 * when the caller must read it the usual way: the snapshot is not an MVCC one, the fetches do
 * not ascend, a memtable holds the row, or the levels lack it.
 */
HeapTuple
ss_quiet_fetch(SsQuietRange *quiet, Relation rel, uint32 keyspace, uint64 rowid,
			   Snapshot snapshot)
{
	uint64		previous = quiet->last_rowid;

	quiet->last_rowid = rowid;
	if (!ss_quiet_ranges || snapshot == NULL || !IsMVCCSnapshot(snapshot))
		return NULL;
	if (quiet->snapshot != NULL && !same_snapshot(quiet, snapshot))
	{
		ss_quiet_reset(quiet);
		quiet->last_rowid = rowid;
	}
	if (rowid < quiet->lo || rowid >= quiet->hi)
	{
		QuietPause *pause;
		bool		found;

		if (previous == SS_NO_ROWID || rowid <= previous || rowid - previous > SS_QUIET_GAP)
		{
			quiet->width = SS_QUIET_FIRST;
			return NULL;
		}
		pause = pause_of(keyspace);
		if (pause->left > 0)
		{
			pause->left--;
			return NULL;
		}
		found = find_range(quiet, keyspace, rowid, snapshot);
		if (quiet->hi - rowid < SS_QUIET_MIN_YIELD)
		{
			pause->left = pause->next;
			pause->next = Min(pause->next * 2, SS_QUIET_PAUSE_MAX);
		}
		else
			pause->next = SS_QUIET_PAUSE_FIRST;
		if (!found)
			return NULL;
	}
	return ss_fetch_row_past_memtables(rel, keyspace, rowid);
}
