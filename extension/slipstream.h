/*
 * slipstream.h: declarations shared by the extension's C files (the PostgreSQL glue).
 *
 * Storage model: every slipstream relation file node is one engine keyspace whose tag is
 * (database oid << 32 | relfilenode). A row is one key-value pair: the key is its 64-bit row
 * id (big-endian), the value is a heap-format tuple (HeapTupleHeader plus data), so MVCC
 * fields, t_ctid chains and PostgreSQL's tuple routines work unchanged. Row id r maps to the
 * ItemPointer (r >> 8, (r & 0xff) + 1), so every index AM can point at rows.
 *
 * Durability: every change is first written to PostgreSQL's WAL (our resource manager), then
 * applied to the engine; the engine persists nothing the WAL lacks (its persist barrier
 * flushes WAL first). Commit durability is therefore PostgreSQL's own group commit. After a
 * restart, the engine recovers its own state and then replays our WAL records from the
 * horizon it had made durable, kept in the replication slot "slipstream" (see host/startup.c,
 * host/wal.c and host/horizon.c).
 */
#ifndef SLIPSTREAM_H
#define SLIPSTREAM_H

#include "postgres.h"

#include "access/heapam.h"
#include "access/htup.h"
#include "access/xlogdefs.h"
#include "access/xlogreader.h"
#include "access/htup_details.h"
#include "access/multixact.h"
#include "access/tableam.h"
#include "fmgr.h"
#include "port/atomics.h"
#include "port/pg_bswap.h"
#include "storage/itemptr.h"
#include "storage/lwlock.h"
#include "storage/condition_variable.h"
#include "utils/rel.h"
#include "utils/snapshot.h"

#include "bridge/bridge.h"

/* ---- row ids ---- */
#define SS_ROWS_PER_BLOCK 256
#define SS_KEY_SIZE 8
#define SS_MAX_ROWID ((UINT64CONST(1) << 40) - SS_ROWS_PER_BLOCK)

/* The ItemPointer that names row id `rowid`. */
static inline void
ss_rowid_to_tid(uint64 rowid, ItemPointer tid)
{
	ItemPointerSet(tid, (BlockNumber) (rowid / SS_ROWS_PER_BLOCK),
				   (OffsetNumber) (rowid % SS_ROWS_PER_BLOCK + 1));
}

/* The row id an ItemPointer names (callers check ss_tid_valid first). */
static inline uint64
ss_tid_to_rowid(ItemPointer tid)
{
	return (uint64) ItemPointerGetBlockNumberNoCheck(tid) * SS_ROWS_PER_BLOCK +
		(ItemPointerGetOffsetNumberNoCheck(tid) - 1);
}

/* Whether an ItemPointer can name a slipstream row at all. */
static inline bool
ss_tid_valid(ItemPointer tid)
{
	OffsetNumber off = ItemPointerGetOffsetNumberNoCheck(tid);

	return ItemPointerIsValid(tid) && off >= 1 && off <= SS_ROWS_PER_BLOCK;
}

/* Big-endian encoding, so that key order is row id order. */
static inline void
ss_encode_key(uint64 rowid, char *key)
{
	uint64		big_endian = pg_hton64(rowid);

	StaticAssertStmt(SS_KEY_SIZE == sizeof(uint64), "a row key is one big-endian uint64");
	memcpy(key, &big_endian, SS_KEY_SIZE);
}

static inline uint64
ss_decode_key(const char *key)
{
	uint64		big_endian;

	memcpy(&big_endian, key, SS_KEY_SIZE);
	return pg_ntoh64(big_endian);
}

/* The engine tag of a relation file node. */
static inline uint64
ss_tag(Oid dbid, Oid relfilenode)
{
	return ((uint64) dbid << 32) | relfilenode;
}

/* ---- settings (admin/settings.c, from the engine's settings.def and admin/settings.def) ---- */
/* The C type of a GUC variable for each KIND of the settings tables. */
#define SS_GUC_CTYPE_U32 int
#define SS_GUC_CTYPE_U64 int
#define SS_GUC_CTYPE_BOOL bool
#define SS_GUC_CTYPE_REAL double

/* The extension's own settings: ss_worker_naptime_ms, ss_sync_interval_ms. */
#define SS_EXT_SETTING(NAME, FIELD, KIND, UNIT, DEFAULT, MIN, MAX, CONTEXT, DESCRIPTION, \
					   LONG_DESCRIPTION) \
	extern SS_GUC_CTYPE_##KIND ss_##FIELD;
#include "admin/settings.def"

extern void ss_define_settings(void);
/* ERROR unless the user is a superuser or a member of slipstream_admin (admin/functions.c). */
extern void ss_require_admin(const char *what);
extern char *ss_text_arg(FunctionCallInfo fcinfo, int n, const char *name);
/* The engine options from the GUCs. */
extern void ss_fill_options(SsOptions *options);

/* ---- shared state and the engine handle (host/shmem.c) ---- */
#define SS_ROW_LOCKS 1024

/* Where the engine's start (host/startup.c) is: backends wait for SS_REPLAY_READY. */
#define SS_REPLAY_NOT_STARTED 0
#define SS_REPLAY_RUNNING 1
#define SS_REPLAY_READY 2
#define SS_REPLAY_FAILED 3

typedef struct SsShared
{
	/* An SS_REPLAY_* state; replay_cv is signalled when it becomes READY or FAILED. */
	pg_atomic_uint32 replay_state;
	ConditionVariable replay_cv;
	char		replay_error[256];
	/* End of the last WAL record whose change was applied to the engine (barrier target). */
	pg_atomic_uint64 max_applied_lsn;
	/* WAL position below which every change is durable in the engine (slot restart_lsn). */
	pg_atomic_uint64 durable_horizon;
	pg_atomic_uint64 replayed_records;
	int			worker_pid;
	/*
	 * 1 once the startup process applies our records on a standby, 2 once that failed (the
	 * engine is then no copy of the primary's, even after a promotion): host/standby.c.
	 */
	pg_atomic_uint32 standby;
	/*
	 * Advanced before VACUUM creates, extends or sets bits in a visibility map, so that writers
	 * know when what they cached about a table's map is stale (tableam/vismap.c).
	 */
	pg_atomic_uint64 vm_epoch;
	LWLockPadded row_locks[SS_ROW_LOCKS];
	/* Per-backend: WAL insert position when a change began, 0 when none is in flight. */
	pg_atomic_uint64 inflight[FLEXIBLE_ARRAY_MEMBER];
} SsShared;

extern SsShared *ss_shared;

extern void ss_shmem_request(void);
extern void ss_shmem_startup(void);
/* Number of PGPROC slots, the size of the per-backend arrays. */
extern int	ss_proc_slots(void);
/* Opens the engine in this process (no wait for replay). */
extern void ss_engine_attach(void);
/* Turns a failed bridge call into an ERROR. */
extern void ss_report(SsCode code, const char *what) pg_attribute_noreturn();
#define SS_CHECK(call, what) \
	do { SsCode ss_code_ = (call); if (ss_code_ != SS_OK) ss_report(ss_code_, (what)); } while (0)

/* ---- bringing the engine up after a start (host/startup.c) ---- */
/* Recovery and WAL replay, then the gate opens (the worker, once per start). */
extern void ss_engine_startup(void);
/* Opens the engine and waits until WAL replay has finished: the gate for every table access. */
extern void ss_engine_ready(void);
extern void ss_mark_clean_shutdown(void);

/* ---- keyspaces and row ids (host/rowids.c) ---- */
extern void ss_rowids_shmem_request(void);
extern void ss_rowids_shmem_init(void);
/* Keyspace of a relation (cached in rd_amcache); creates it if `create`. */
extern uint32 ss_rel_keyspace(Relation rel);
/* What a backend caches in a slipstream relation's relcache entry (rd_amcache). */
typedef struct SsRelCache
{
	uint64		tag;			/* the relation file node the rest is about */
	uint32		keyspace;
	bool		vm_known;		/* vm_pages is valid as of vm_epoch (tableam/vismap.c) */
	uint64		vm_epoch;
	BlockNumber vm_pages;		/* pages of the visibility map fork */
} SsRelCache;
extern SsRelCache *ss_rel_cache(Relation rel);
extern uint32 ss_keyspace_for_tag(uint64 tag, bool create);
extern uint64 ss_next_rowid(Relation rel, uint32 keyspace, uint32 count);
/* One past the highest row id handed out (0 for an empty relation). */
extern uint64 ss_rowid_high(Relation rel, uint32 keyspace);
extern void ss_forget_rowids(uint64 tag);

/* ---- striped row locks (host/row_locks.c) ---- */
extern void ss_row_locks_shmem_init(bool fresh);
extern void ss_row_locks_register_tranche(void);
extern LWLock *ss_row_lock(uint64 tag, uint64 rowid);

/* ---- the durable horizon (host/horizon.c) ---- */
/*
 * Brackets a WAL-then-engine change: begin before XLogInsert, logged with the record's end
 * (before the engine write), done after the engine write. The horizon is derived from them.
 */
extern void ss_change_begin(void);
extern void ss_change_logged(XLogRecPtr end_lsn);
extern void ss_change_done(void);
extern bool ss_persist_barrier(char *msg, size_t msg_size);
extern uint64_t ss_wal_needed(void);
extern uint64_t ss_wal_durable(void);
/* Acquires the slot "slipstream", creating it the first time. */
extern void ss_acquire_named_slot(const char *name, const char *why);
extern void ss_acquire_slot(void);
extern XLogRecPtr ss_applied_horizon(void);
extern void ss_advance_horizon(void);
/* On a standby: sync the engine and move the slot up to the replay position. */
extern void ss_advance_standby_horizon(void);
/* Creates the slot at `horizon` (a seeded standby's first start) and releases it. */
extern void ss_create_slot_at(XLogRecPtr horizon);
/* The slot's restart_lsn, invalid when there is no slot. */
extern XLogRecPtr ss_slot_horizon(void);
/* The restart_lsn of the physical slot `name`, invalid when there is no such slot. */
extern XLogRecPtr ss_named_slot_restart(const char *name);
/* Sets and saves the restart_lsn of the slot this process holds. */
extern void ss_set_slot_restart(XLogRecPtr restart);
extern void ss_advance_slot_restart(XLogRecPtr restart);

/* ---- WAL records (host/wal.c) ---- */
#define SS_RMGR_ID 128
#define SS_HEADER_SIZE offsetof(HeapTupleHeaderData, t_bits)

extern void ss_register_rmgr(void);
extern XLogRecPtr ss_log_put(Relation rel, uint64 rowid, HeapTuple tuple);
extern XLogRecPtr ss_log_put_multi(Relation rel, uint64 *rowids, HeapTuple *tuples, int ntuples,
								   bool rewrite);
/*
 * What a row write is, as its WAL record says for logical decoding (replay stores them all the
 * same way: the row, or its new header).
 */
typedef enum SsRowChange
{
	SS_ROW_PUT,					/* a whole row: a new row */
	SS_ROW_HEADER,				/* a new header only: a row lock, a freeze */
	SS_ROW_DELETE,				/* a new header that deletes the row */
	SS_ROW_CONFIRM,				/* a speculative insertion confirmed */
	SS_ROW_SUPER_DELETE			/* a speculative insertion undone */
} SsRowChange;
extern XLogRecPtr ss_log_header(Relation rel, uint64 rowid, HeapTupleHeader header,
								SsRowChange change, HeapTuple old_key);
extern XLogRecPtr ss_log_update(Relation rel, uint64 old_rowid, HeapTupleHeader old_header,
								uint64 new_rowid, HeapTuple new_tuple, HeapTuple old_key);
extern HeapTuple ss_logical_old_key(Relation rel, HeapTuple old_tuple, HeapTuple new_tuple);
struct LogicalDecodingContext;
struct XLogRecordBuffer;
extern void ss_decode(struct LogicalDecodingContext *ctx, struct XLogRecordBuffer *buf);
extern XLogRecPtr ss_log_remove(Relation rel, uint64 *rowids, int nrowids);
extern XLogRecPtr ss_log_prune(Relation rel, uint64 root, HeapTupleHeader redirect,
							   uint64 *removed, int nremoved, TransactionId latest_removed);
extern XLogRecPtr ss_log_reset(uint64 tag);
extern void ss_log_conflict(Relation rel, TransactionId horizon);
extern bool ss_rel_needs_wal(Relation rel);
/* Applies our records from start to end to the engine; returns how many there were. */
extern uint64 ss_replay_wal(XLogRecPtr start, XLogRecPtr end);
struct XLogReaderState;
extern void ss_apply_record(struct XLogReaderState *record);

/* ---- the engine on a standby (host/standby.c) ---- */
/* The seed a standby loads at its first start, in $PGDATA (written by scripts/seed_backup.sh). */
#define SS_SEED_FILE "slipstream_seed"
/* The key of the seed's last row (tag 0), whose value is the dump's horizon and end. */
#define SS_SEED_TRAILER "slipstream seed end"
#define SS_SEED_BATCH_BYTES (256 * 1024)
extern void ss_standby_startup(void);
extern void ss_standby_redo(struct XLogReaderState *record);
extern void ss_standby_cleanup(void);
extern bool ss_sweep_allowed(void);

/* ---- HOT-like version chains (tableam/chains.c) ---- */
/* No row id: the end of a chain. */
#define SS_NO_ROWID PG_UINT64_MAX
/*
 * t_infomask2 bit (one heap leaves free) of a pruned chain root: a header-only row invisible
 * to every snapshot, whose t_ctid names the chain's first version still needed (itself: none).
 */
#define SS_HEAP_REDIRECT 0x0800
#define SS_REDIRECT_SIZE MAXALIGN(SizeofHeapTupleHeader)

/* Whether a stored row is a chain root's redirect. */
static inline bool
ss_is_redirect(HeapTupleHeader header)
{
	return (header->t_infomask2 & SS_HEAP_REDIRECT) != 0;
}

/*
 * t_infomask2 bit (the other one heap leaves free) of a heap-only version that names its
 * chain's root: its last 8 bytes, past its columns and counted in t_len, hold the root's row
 * id. A change to such a version clears the visibility map bit of its root's block, where
 * index-only scans look, so VACUUM may mark a block of redirects all-visible (tableam/vismap.c).
 * Heap needs no such link: its chains stay in their root's page. Columns are read by the
 * attribute count, so the bytes past them are never taken for a column.
 */
#define SS_HEAP_ROOT_LINK 0x1000
#define SS_ROOT_LINK_SIZE ((uint32) sizeof(uint64))

/* The row id of the root of `tuple`'s chain, if the tuple is a member that names it. */
static inline bool
ss_member_root(HeapTuple tuple, uint64 *root)
{
	HeapTupleHeader header = tuple->t_data;

	if ((header->t_infomask2 & SS_HEAP_ROOT_LINK) == 0 || !HeapTupleHeaderIsHeapOnly(header) ||
		tuple->t_len < (uint32) header->t_hoff + SS_ROOT_LINK_SIZE)
		return false;
	memcpy(root, (char *) header + tuple->t_len - SS_ROOT_LINK_SIZE, SS_ROOT_LINK_SIZE);
	return true;
}

extern HeapTuple ss_with_root_link(HeapTuple tuple, uint64 root);
extern HeapTuple ss_without_root_link(HeapTuple tuple);

/* A walk along a chain from its root, as an index entry names it. */
typedef struct SsChainWalk
{
	Relation	rel;
	uint32		keyspace;
	uint64		root;
	uint64		next;			/* the row id to read next, SS_NO_ROWID at the end */
	TransactionId prior_xmax;	/* the update that must have made `next` */
	uint64		last_returned;	/* versions up to it were returned already */
	int			restarts;
	LWLock	   *lock;			/* the root's row lock, held from the last restart on */
	bool		all_dead;		/* every version walked so far is dead to everyone */
	int			dead_seen;		/* how many of them */
	uint64		tag;			/* the relation file node's engine tag */
	bool		cacheable;		/* an MVCC walk: it may use and fill the chain cache */
	bool		from_cache;		/* it started where the chain cache said */
	uint64		cache_start;	/* where that was */
	TransactionId cache_xmin;	/* the raw xmin the version there must have */
	int			reads;			/* engine reads of versions so far */
} SsChainWalk;

/* What prunes did, for VACUUM's report. */
typedef struct SsPruneCounts
{
	int64		pruned;			/* versions removed */
	int64		rewalked;		/* chains changed since VACUUM's scan, walked again */
} SsPruneCounts;

typedef enum SsPruneResult
{
	SS_PRUNE_KEPT,				/* the chain still has versions some transaction may see */
	SS_PRUNE_DEAD_ROOT,			/* nothing is left but the root, a redirect to itself */
	SS_PRUNE_NOT_ROOT			/* no such row, or a heap-only one */
} SsPruneResult;

extern void ss_chain_start(SsChainWalk *walk, Relation rel, uint32 keyspace, uint64 root,
						   Snapshot snapshot);
extern HeapTuple ss_chain_next_visible(SsChainWalk *walk, Snapshot snapshot,
									   HeapTuple root_tuple, struct GlobalVisState *vistest);
extern void ss_chain_end(SsChainWalk *walk);
extern void ss_chain_prune_if_worth(SsChainWalk *walk, Snapshot snapshot,
									struct GlobalVisState *vistest);
extern bool ss_chain_all_dead(Relation rel, uint32 keyspace, uint64 root,
							  struct GlobalVisState *vistest, TransactionId *latest_removed);
extern uint64 ss_redirect_target(Relation rel, HeapTuple redirect);
extern SsPruneResult ss_prune_chain(Relation rel, uint32 keyspace, uint64 root,
									struct GlobalVisState *vistest, TransactionId oldest_xmin,
									SsPruneCounts *counts);
extern SsPruneResult ss_prune_chain_seen(Relation rel, uint32 keyspace, uint64 root,
										 uint64 expected, uint64 *removed, int nremoved,
										 uint64 target, TransactionId target_xmin,
										 TransactionId latest_removed,
										 TransactionId oldest_xmin, SsPruneCounts *counts);

/* ---- index fetches that skip the memtables (tableam/quiet_ranges.c) ---- */
typedef struct SsQuietRange
{
	uint64		lo;				/* no memtable held a row id in [lo, hi) when last asked */
	uint64		hi;
	uint64		last_rowid;		/* the root the previous fetch asked for */
	int			width;			/* row ids the next seek covers */
	Snapshot	snapshot;		/* the snapshot the range was found for (NULL: none) */
	CommandId	curcid;			/* and its command id, xmin and xmax then */
	TransactionId xmin;
	TransactionId xmax;
} SsQuietRange;

extern void ss_quiet_reset(SsQuietRange *quiet);
extern HeapTuple ss_quiet_fetch(SsQuietRange *quiet, Relation rel, uint32 keyspace,
								uint64 rowid, Snapshot snapshot);

/* ---- the shared chain cache (tableam/chain_cache.c) ---- */
extern void ss_chain_cache_shmem_request(void);
extern void ss_chain_cache_shmem_init(void);
extern bool ss_chain_cache_lookup(uint32 keyspace, uint64 tag, uint64 root,
								  uint64 *first_needed, TransactionId *first_xmin);
extern void ss_chain_cache_remember(uint32 keyspace, uint64 tag, uint64 root, uint64 rowid,
									TransactionId xmin);
extern void ss_chain_cache_forget(uint32 keyspace, uint64 tag, uint64 root, uint64 rowid);

/* ---- the visibility map (tableam/vismap.c) ---- */
extern void ss_vm_clear_rows(Relation rel, const uint64 *rowids, int nrowids);
extern bool ss_vm_row_all_visible(HeapTuple tuple, HTSV_Result state, TransactionId oldest_xmin);
extern BlockNumber ss_vm_update(Relation rel, uint32 keyspace, TransactionId oldest_xmin,
								const bool *candidate, BlockNumber nblocks,
								BufferAccessStrategy strategy);
extern void ss_vm_redo(XLogReaderState *record);
extern void ss_vm_forget(void);
extern void ss_vm_note_frozen_rows(Relation rel, uint64 first, uint32 count);
extern void ss_vm_finish_frozen_rows(Relation rel);

/* ---- a relation file node's files in any tablespace (host/relfiles.c) ---- */
#define SS_FILES_MAIN 1			/* <relnode>: a permanent or unlogged table's */
#define SS_FILES_TEMP 2			/* t<backend>_<relnode>: a temporary table's */
#define SS_FILES_INIT 4			/* <relnode>_init: an unlogged table's init fork */
extern bool ss_relnode_has_files(Oid db, Oid relnode, int kinds, const char *except);

/* ---- background worker (host/worker.c) ---- */
extern void ss_register_worker(void);
extern void ss_register_bgworker(const char *function, const char *name);
/* The same, for a worker that starts at `start_time` (a BgWorkerStartTime). */
extern void ss_register_bgworker_at(const char *function, const char *name, int start_time);
PGDLLEXPORT void ss_worker_main(Datum arg);

/* ---- visibility (visibility.c) ---- */
extern bool ss_tuple_visible(HeapTuple tuple, Snapshot snapshot);
extern TM_Result ss_tuple_satisfies_update(HeapTuple tuple, CommandId curcid);
extern HTSV_Result ss_tuple_vacuum_state(HeapTuple tuple, TransactionId oldest_xmin,
										 TransactionId *dead_after);

/* ---- table access method (tableam.c) ---- */
extern const TableAmRoutine *ss_tableam_routine(void);
/* ---- rows (rows.c) ---- */
extern HeapTuple ss_tuple_from_value(Relation rel, uint64 rowid, const char *value, size_t len);
/* Reads row `rowid` into a palloc'd tuple; NULL if absent. */
extern HeapTuple ss_fetch_row(Relation rel, uint32 keyspace, uint64 rowid);
extern HeapTuple ss_fetch_row_past_memtables(Relation rel, uint32 keyspace, uint64 rowid);
extern void ss_write_row(Relation rel, uint32 keyspace, uint64 rowid, HeapTuple tuple,
						 SsRowChange change);
extern void ss_write_update(Relation rel, uint32 keyspace, HeapTuple old_tuple, uint64 new_rowid,
							HeapTuple new_tuple);
extern void ss_write_rows(Relation rel, uint32 keyspace, uint64 *rowids, HeapTuple *tuples,
						  int ntuples, bool rewrite);
extern void ss_remove_rows(Relation rel, uint32 keyspace, uint64 *rowids, int nrowids);
extern void ss_write_prune(Relation rel, uint32 keyspace, uint64 root, HeapTupleHeader redirect,
						   uint64 *removed, int nremoved, TransactionId latest_removed);

/* ---- the row-lock protocol (tableam/locks.c) ---- */
/* State of one row acquisition: which locks we hold while it goes on. */
typedef struct SsAcquisition
{
	Relation	rel;
	uint32		keyspace;
	uint64		rowid;
	ItemPointerData tid;
	LWLock	   *row_lock;
	bool		row_locked;
	bool		tuple_locked;
	LOCKMODE	tuple_lock_mode;
	/*
	 * An update sets new_row and key_columns (the relation's INDEX_ATTR_BITMAP_KEY): the mode
	 * is then chosen from the row found under the lock, exclusive only if the update changes
	 * a key column, and left in mode_chosen. A row version's columns never change, so one
	 * fetch decides it (heap looks at the page it already holds).
	 */
	TupleTableSlot *new_row;
	Bitmapset  *key_columns;
	LockTupleMode mode_chosen;
} SsAcquisition;

/*
 * Gets the right to modify (is_update) or lock a row in `mode`. On TM_Ok, returns with the row
 * lock held, *tuple the current row image and *members the transactions that must stay in
 * xmax next to us, ready for the caller to write the new header (then release).
 */
extern TM_Result ss_acquire_row(SsAcquisition *acq, CommandId cid, Snapshot crosscheck,
								LockTupleMode mode, bool is_update, LockWaitPolicy policy,
								TM_FailureData *tmfd, HeapTuple *tuple_out,
								MultiXactMember **members_out, int *nmembers_out);
extern void ss_release_acquisition(SsAcquisition *acq);
/* Whether the new row in `slot` differs from `old_tuple` in any column of `columns`. */
extern bool ss_columns_changed(Relation rel, const Bitmapset *columns, HeapTuple old_tuple,
							   TupleTableSlot *slot);
/* Sets the row's xmax to exactly `members` (one plain xid, or a new MultiXact). */
extern void ss_set_xmax_members(HeapTupleHeader tuple, MultiXactMember *members, int n);
extern int	ss_carried_lockers(HeapTupleHeader tuple, MultiXactMember **lockers);

/* ---- callbacks by concern (tableam/scan.c, modify.c, locks.c, ddl.c, vacuum.c) ---- */
extern void ss_init_scan_callbacks(TableAmRoutine *am);
extern void ss_init_modify_callbacks(TableAmRoutine *am);
extern void ss_init_lock_callbacks(TableAmRoutine *am);
extern void ss_init_ddl_callbacks(TableAmRoutine *am);
extern void ss_init_vacuum_callbacks(TableAmRoutine *am);
extern void ss_install_planner_hook(void);
/* No md.c prefetches for slipstream tables: bitmap heap scans and ANALYZE (tableam/prefetch.c). */
extern void ss_install_prefetch_hook(void);
extern void ss_analyze_prefetch_off(void);
/* ANALYZE: the share of a sampled block's row ids read, and which ones (tableam/analyze.c). */
extern double ss_analyze_row_fraction(Relation rel, BlockNumber nblocks);
extern int	ss_analyze_pick_offsets(double fraction, uint16 *offsets);
/* Makes a scan return chain roots' redirects, which scans skip otherwise (tableam/scan.c). */
extern void ss_scan_every_row(TableScanDesc scan);
/* Moves a forward scan on to the first row id >= `rowid`; returns the rows passed over. */
extern uint64 ss_scan_skip_to(TableScanDesc scan, uint64 rowid);
/* Serializable: reports a read of `tuple` that a concurrent writer may invalidate. */
extern void ss_conflict_out(Relation rel, HeapTuple tuple, bool visible, Snapshot snapshot);

#endif							/* SLIPSTREAM_H */
