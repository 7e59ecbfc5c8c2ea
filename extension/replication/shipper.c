/*
 * replication/shipper.c: the shipper worker of a primary. Every round it reads the WAL that is
 * flushed locally and not yet shipped, appends it to each backup (one round, one checksum:
 * commits that arrived meanwhile share it, i.e. group commit), polls for placement, asks for
 * durability when a remote_flush commit waits, publishes the positions reached on
 * slipstream.min_sync_backups backups, and wakes the committing backends that waited for them.
 *
 * A backup tells, when it connects, where its durable copy of this primary's WAL ends (its
 * resume position), and the WAL is shipped from exactly there: its copy never has a gap. The
 * replication slot "slipstream_backups" keeps the WAL from the oldest position a backup may
 * resume from: the lowest resume position, then durable position, of the configured backups.
 */
#include "slipstream.h"
#include "replication/repl.h"

#include <fcntl.h>
#include <unistd.h>

#include "access/xlog.h"
#include "access/xlog_internal.h"
#include "access/twophase.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "replication/slot.h"
#include "storage/fd.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/pmsignal.h"
#include "storage/proc.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "bridge/index_bridge.h"

#define SS_SHIP_SLOT "slipstream_backups"
#define SS_SHIP_CHUNK (1024 * 1024)
#define SS_RECONNECT_MS 500
#define SS_REFUSED_RETRY_MS 5000	/* after a refusal that needs a re-seed */
#define SS_INDEX_ROUND_BYTES (32 * 1024 * 1024)	/* index frames shipped per round at most */
#define SS_INDEX_BUSY_BYTES (512 * 1024)	/* ... while commits wait for the WAL's placement */
#define SS_SEED_RETRY_MS 60000		/* a seed asked for and not seen is asked for again */

PGDLLEXPORT void ss_shipper_main(Datum arg);
PGDLLEXPORT void ss_backup_worker_main(Datum arg);

/* This process's connection to each backup slot. */
typedef struct ShipLink
{
	SsBackupConn *conn;
	SsBackupConnecting *connecting;	/* a connect under way (conn is NULL meanwhile) */
	uint32		generation;
	TimestampTz next_attempt;
	/* This round's progress, between collect_from and finish_collect. */
	uint64		placed;
	uint64		durable;
	bool		flushing;		/* its FLUSH was sent, the answer is not read yet */
	/* Send-Index backups: the index stream runs, and frames wait for a seed's marker. */
	bool		index_started;
	bool		awaiting_seed;
	bool		skipping_seed;	/* a seed it does not need: skipped to its end */
	bool		index_wants_flush;	/* an install waits for its WAL to be durable there */
	TimestampTz seed_asked;		/* when a seed was last asked for it */
} ShipLink;

static ShipLink links[SS_MAX_BACKUPS];

/*
 * What the shipper waits on while commits wait: its latch (new WAL to ship) and the sockets of
 * the links whose answers only a Poll reads (tcp), so that a round's ACKs are read as they
 * arrive while the WAL flushed meanwhile is already on its way (rounds overlap). Rebuilt when
 * a link connects or is dropped (links_changed): a closed socket leaves an epoll set by itself,
 * and a new one may reuse its number.
 */
static WaitEventSet *round_events = NULL;
static uint64 links_changed = 1;
static uint64 round_events_built = 0;

/*
 * Registers the shipper and the backup worker (from _PG_init). The backup worker starts once a
 * standby is consistent (with hot_standby on; otherwise after recovery), since a backup that is
 * a standby receives WAL while it replays.
 */
void
ss_register_repl_workers(void)
{
	ss_register_bgworker("ss_shipper_main", "shipper");
	ss_register_bgworker_at("ss_backup_worker_main", "backup server",
							BgWorkerStart_ConsistentState);
}

/* The name this primary gives itself at its backups: cluster_name, or "primary". */
const char *
ss_repl_primary_name(void)
{
	return (cluster_name != NULL && cluster_name[0] != '\0' && ss_repl_valid_name(cluster_name)) ?
		cluster_name : "primary";
}

/* The shipper's reader of pg_wal (its buffer holds one chunk). */
static SsWalReader wal_reader;

/* Where the slot keeps WAL from (invalid if there is no slot yet). */
static XLogRecPtr
ship_slot_restart(void)
{
	return ss_named_slot_restart(SS_SHIP_SLOT);
}

/*
 * Makes the slot keep the WAL from `start` on (moving it back if it is ahead), then checks that
 * the WAL is still there: a checkpoint may have removed it meanwhile (as ReplicationSlotReserveWal
 * fears), or long ago (a slot invalidated by max_slot_wal_keep_size). If it is gone, a slot that
 * was moved back is put back, and false returned.
 */
static bool
hold_wal_from(XLogRecPtr start)
{
	XLogRecPtr	before;
	XLogSegNo	segno;
	bool		moved = false;

	ss_acquire_named_slot(SS_SHIP_SLOT, "the backups have not yet received");
	before = MyReplicationSlot->data.restart_lsn;
	if (before == InvalidXLogRecPtr || start < before)
	{
		SpinLockAcquire(&MyReplicationSlot->mutex);
		MyReplicationSlot->data.restart_lsn = start;
		SpinLockRelease(&MyReplicationSlot->mutex);
		ReplicationSlotsComputeRequiredLSN();
		moved = true;
	}
	XLByteToSeg(start, segno, wal_segment_size);
	if (XLogGetLastRemovedSegno() >= segno)
	{
		if (moved)
		{
			SpinLockAcquire(&MyReplicationSlot->mutex);
			MyReplicationSlot->data.restart_lsn = before;
			SpinLockRelease(&MyReplicationSlot->mutex);
			ReplicationSlotsComputeRequiredLSN();
		}
		return false;
	}
	if (moved)
	{
		ReplicationSlotMarkDirty();
		ReplicationSlotSave();
	}
	return true;
}

/*
 * Moves the slot to the oldest position a configured backup may resume from, in memory: the
 * next checkpoint saves it (ss_advance_slot_restart), so no fsync delays the round.
 */
static void
advance_ship_slot(XLogRecPtr oldest)
{
	if (oldest == InvalidXLogRecPtr || oldest <= MyReplicationSlot->data.restart_lsn)
		return;
	ss_advance_slot_restart(oldest);
}

/*
 * Ends the connection of slot i, after committing backends have stopped appending to its
 * buffer (its cursor is cleared under the lock they append under), or gives up its connect.
 */
static void
drop_link(int i)
{
	if (links[i].connecting != NULL)
	{
		ss_backup_connect_abandon(links[i].connecting);
		links[i].connecting = NULL;
	}
	LWLockAcquire(ss_repl->place_lock, LW_EXCLUSIVE);
	ss_direct_cursor_clear(&ss_repl->backups[i].direct);
	LWLockRelease(ss_repl->place_lock);
	if (links[i].conn != NULL)
	{
		ss_backup_disconnect(links[i].conn);
		links[i].conn = NULL;
		links_changed++;
	}
}

/* Records a backup's failure; it is lost once it failed for longer than backup_timeout. */
static void
link_failed(int i, const char *error)
{
	SsBackupSlot *slot = &ss_repl->backups[i];
	TimestampTz now = GetCurrentTimestamp();

	drop_link(i);
	links[i].index_started = false;
	links[i].next_attempt = TimestampTzPlusMilliseconds(now, SS_RECONNECT_MS);
	LWLockAcquire(ss_repl->lock, LW_EXCLUSIVE);
	strlcpy(slot->error, error, sizeof(slot->error));
	if (slot->last_ok == 0)
		slot->last_ok = now;
	slot->state = TimestampDifferenceExceeds(slot->last_ok, now, ss_backup_timeout_ms) ?
		SS_BACKUP_LOST : SS_BACKUP_CONNECTING;
	LWLockRelease(ss_repl->lock);
}

/*
 * Drops the slot slipstream_seed_NAME that scripts/seed_backup.sh created on this primary to
 * keep the WAL a freshly seeded standby needs until its first connection as backup NAME; once
 * it streams, our own slot keeps that WAL. A slot in use (a streaming standby's) is left alone.
 */
static void
drop_seed_slot(const char *backup)
{
	char		name[NAMEDATALEN];
	ReplicationSlot *slot;
	bool		idle;
	int			n = snprintf(name, sizeof(name), "slipstream_seed_");

	for (const char *c = backup; *c != '\0' && n < NAMEDATALEN - 1; c++)
		name[n++] = ((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_') ? *c : '_';
	name[n] = '\0';
	LWLockAcquire(ReplicationSlotControlLock, LW_SHARED);
	slot = SearchNamedReplicationSlot(name, false);
	idle = slot != NULL && slot->active_pid == 0 && SlotIsPhysical(slot);
	LWLockRelease(ReplicationSlotControlLock);
	if (!idle)
		return;
	/* Dropping acquires the slot, and a process holds one slot at a time. */
	if (MyReplicationSlot != NULL)
		ReplicationSlotRelease();
	PG_TRY();
	{
		ReplicationSlotDrop(name, true);
		ereport(LOG, (errmsg("slipstream: dropped replication slot \"%s\": backup \"%s\" streams",
							 name, backup)));
	}
	PG_CATCH();
	{
		/* Taken meanwhile (or not removable): it stays, and the shipper goes on. */
		EmitErrorReport();
		FlushErrorState();
		LWLockReleaseAll();
		if (MyReplicationSlot != NULL)
			ReplicationSlotRelease();
	}
	PG_END_TRY();
	ss_acquire_named_slot(SS_SHIP_SLOT, "the backups have not yet received");
}

/*
 * Records why slot i cannot stream until its backup is re-seeded, logging it once; it is tried
 * again now and then (the re-seed is the user's, and nothing tells us when it is done).
 */
static void
refuse_link(int i, const char *error)
{
	bool		repeated;
	char		name[sizeof(ss_repl->backups[i].name)];

	LWLockAcquire(ss_repl->lock, LW_SHARED);
	repeated = strcmp(ss_repl->backups[i].error, error) == 0;
	strlcpy(name, ss_repl->backups[i].name, sizeof(name));
	LWLockRelease(ss_repl->lock);
	if (!repeated)
		ereport(WARNING,
				(errmsg("slipstream: cannot ship WAL to backup \"%s\": %s", name, error)));
	link_failed(i, error);
	links[i].next_attempt = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
														SS_REFUSED_RETRY_MS);
}

/* Makes link i skip index frames until a seed's marker, and asks the engine worker for one. */
static void
ask_for_seed(int i)
{
	links[i].awaiting_seed = true;
	links[i].seed_asked = GetCurrentTimestamp();
	pg_atomic_write_u32(&ss_repl->seed_requested, 1);
}

/*
 * Starts connecting slot i, on a thread of the bridge's: a backup that does not answer (a host
 * that is down, a process that is stopped) holds up neither the other backups' rounds nor the
 * commits they place. A later round takes the result (finish_connect).
 */
static void
begin_connect(int i)
{
	SsBackupSlot copy;
	char		error[SS_REPL_ERROR_SIZE];

	LWLockAcquire(ss_repl->lock, LW_SHARED);
	copy = ss_repl->backups[i];
	LWLockRelease(ss_repl->lock);
	links[i].generation = copy.generation;
	if (!ss_backup_connect_begin(copy.address, copy.transport, copy.secret,
								 GetSystemIdentifier(), GetWALInsertionTimeLine(), copy.version,
								 ss_repl_primary_name(), &links[i].connecting, error))
	{
		links[i].connecting = NULL;
		link_failed(i, error);
	}
}

/*
 * Once slot i's connect has ended, starts its WAL stream where the backup's durable copy ends
 * (its resume position); a backup that holds none starts where it left off, or at the current
 * WAL segment. A failed connect is recorded as the link's failure.
 */
static void
finish_connect(int i)
{
	SsBackupSlot copy;
	XLogRecPtr	flush = GetFlushRecPtr(NULL);
	XLogRecPtr	start;
	uint64		resume = 0;
	char		error[SS_REPL_ERROR_SIZE];
	int			ended;

	ended = ss_backup_connect_poll(links[i].connecting, &links[i].conn, &resume, error);
	if (ended == 0)
		return;
	links[i].connecting = NULL;
	if (ended < 0)
	{
		links[i].conn = NULL;
		link_failed(i, error);
		return;
	}
	links_changed++;
	LWLockAcquire(ss_repl->lock, LW_SHARED);
	copy = ss_repl->backups[i];
	LWLockRelease(ss_repl->lock);
	if (resume != InvalidXLogRecPtr)
	{
		/* Anywhere else leaves a gap in its copy, or ships again what it has. */
		start = resume;
		if (start > flush)
		{
			/* Without the flush position, which moves: the message is logged once. */
			snprintf(error, sizeof(error),
					 "the backup holds WAL up to %X/%X, beyond this primary's flushed WAL: it "
					 "copies another history; re-seed it",
					 LSN_FORMAT_ARGS(start));
			refuse_link(i, error);
			return;
		}
	}
	else
	{
		/*
		 * A backup that holds none of our WAL starts at the beginning of a WAL segment (still in
		 * pg_wal), so it holds whole segment files, page headers included: the current one, or,
		 * when the slot already keeps WAL (after a restart, or created by an earlier round before
		 * this first connection), the one the slot starts in, which the slot keeps whole. One that
		 * lost what it had starts where it had it placed.
		 */
		start = copy.placed_lsn != InvalidXLogRecPtr ? copy.placed_lsn :
			flush - XLogSegmentOffset(flush, wal_segment_size);
		if (copy.placed_lsn == InvalidXLogRecPtr && ship_slot_restart() != InvalidXLogRecPtr)
		{
			XLogRecPtr	kept = ship_slot_restart();

			start = kept - XLogSegmentOffset(kept, wal_segment_size);
		}
	}
	if (!hold_wal_from(start))
	{
		snprintf(error, sizeof(error),
				 "the WAL from %X/%X it needs next is no longer on this primary; re-seed the backup",
				 LSN_FORMAT_ARGS(start));
		refuse_link(i, error);
		return;
	}
	if (!ss_backup_start(links[i].conn, start, error))
	{
		link_failed(i, error);
		return;
	}
	if (copy.send_index)
	{
		uint64		index_start = 0;

		/*
		 * The frames raised while it was away are gone from the queue: it takes the next seed
		 * whole (its import skips the compactions it has already installed).
		 */
		if (!ss_backup_index_start(links[i].conn, &index_start, error))
		{
			link_failed(i, error);
			return;
		}
		links[i].index_started = true;
		links[i].skipping_seed = false;
		ask_for_seed(i);
		LWLockAcquire(ss_repl->lock, LW_EXCLUSIVE);
		ss_repl->backups[i].index_sent = index_start;
		ss_repl->backups[i].index_placed = index_start;
		LWLockRelease(ss_repl->lock);
	}
	LWLockAcquire(ss_repl->lock, LW_EXCLUSIVE);
	ss_repl->backups[i].state = SS_BACKUP_STREAMING;
	ss_repl->backups[i].start_lsn = start;
	ss_repl->backups[i].sent_lsn = start;
	ss_repl->backups[i].placed_lsn = start;
	/* A resume position is exactly what the backup holds durably, lower than we knew or not. */
	if (resume != InvalidXLogRecPtr || ss_repl->backups[i].durable_lsn < start)
		ss_repl->backups[i].durable_lsn = start;
	ss_repl->backups[i].last_ok = GetCurrentTimestamp();
	ss_repl->backups[i].error[0] = '\0';
	LWLockRelease(ss_repl->lock);
	ereport(LOG, (errmsg("slipstream: shipping WAL to backup \"%s\" at %s from %X/%X%s",
						 copy.name, copy.address, LSN_FORMAT_ARGS(start),
						 resume != InvalidXLogRecPtr ? " (where its durable copy ends)" : "")));
	drop_seed_slot(copy.name);
}

/*
 * Ends a change of backup i's buffer description under place_lock: describes the buffer to the
 * committing backends again (or forgets it when the link failed), lets go of the lock, and
 * drops a failed link.
 */
static void
release_cursor(int i, bool ok, const char *error)
{
	SsDirectCursor *direct = &ss_repl->backups[i].direct;

	if (ok)
		ss_backup_export_cursor(links[i].conn, direct);
	else
		ss_direct_cursor_clear(direct);
	LWLockRelease(ss_repl->place_lock);
	if (!ok)
		link_failed(i, error);
}

/*
 * Appends the flushed WAL a connected backup lacks with one-sided writes (no waiting). First it
 * takes over what committing backends appended to the open buffer since the last round, and
 * afterwards it describes the buffer to them again (a rotation opens another), all under the
 * lock their appends take.
 */
static void
ship_to(int i, XLogRecPtr flush, TimeLineID tli)
{
	char		error[SS_REPL_ERROR_SIZE];
	SsBackupConn *conn = links[i].conn;
	SsDirectCursor *direct = &ss_repl->backups[i].direct;
	bool		ok = true;

	/*
	 * A backend that holds the lock while the buffer is described is placing what was flushed
	 * (and wakes this process for anything it leaves): queueing behind it would only cost it a
	 * wake-up of this process when it lets go. The next round looks again.
	 */
	if (!LWLockConditionalAcquire(ss_repl->place_lock, LW_EXCLUSIVE))
	{
		if (ss_direct_cursor_valid(direct))
			return;
		LWLockAcquire(ss_repl->place_lock, LW_EXCLUSIVE);
	}
	if (!ss_backup_adopt_cursor(conn, direct, error))
		ok = false;				/* a backend's WRITEs may still land: resume afresh */
	while (ok && ss_backup_sent(conn) < flush)
	{
		XLogRecPtr	from = ss_backup_sent(conn);
		Size		len = ss_wal_read_size(&wal_reader, from, flush);

		/* A backlog can take a while to ship: a crashed postmaster must not wait for it. */
		if (!PostmasterIsAlive())
			proc_exit(1);

		if (!ss_wal_read(&wal_reader, from, len, tli, error) ||
			!ss_backup_append(conn, from, wal_reader.buffer, len, error))
		{
			ok = false;
			break;
		}
	}
	release_cursor(i, ok, error);
}

/*
 * Appends the queued index frames to the Send-Index backups, oldest first, up to a budget per
 * round so that the WAL is never held up for long: a small one while commits wait (the shipper
 * is their path), a large one when it is idle. A frame goes to a backup only once that
 * backup holds the WAL it is tagged with (the write-ahead rule, on the backup: the levels it
 * imports never hold a change whose WAL it lacks); a backup that waits for a seed skips the
 * frames before the seed's marker. A queue that overflowed lost frames: every Send-Index backup
 * then takes the next seed.
 */
static void
ship_index(bool waiters)
{
	void	   *queue = ss_index_queue();
	uint64		budget = waiters ? SS_INDEX_BUSY_BYTES : SS_INDEX_ROUND_BYTES;
	TimestampTz now = GetCurrentTimestamp();
	char		error[SS_REPL_ERROR_SIZE];

	if (ss_index_queue_overflowed(queue))
	{
		ss_index_queue_clear_overflow(queue);
		ereport(LOG, (errmsg("slipstream: the index frame queue overflowed "
							 "(slipstream.index_queue_size): Send-Index backups take a new seed")));
		for (int i = 0; i < SS_MAX_BACKUPS; i++)
			if (links[i].conn != NULL && links[i].index_started)
				ask_for_seed(i);
	}
	for (int i = 0; i < SS_MAX_BACKUPS; i++)
		if (links[i].conn != NULL && links[i].index_started && links[i].awaiting_seed &&
			TimestampDifferenceExceeds(links[i].seed_asked, now, SS_SEED_RETRY_MS))
			ask_for_seed(i);
	while (budget > 0)
	{
		const char *frame;
		size_t		len;
		uint64		tag;
		bool		seed;
		bool		seed_end;
		bool		install;
		bool		blocked = false;

		if (!ss_index_queue_front(queue, &frame, &len, &tag))
			break;
		seed = ss_index_frame_is_seed(frame, len);
		seed_end = ss_index_frame_is_seed_end(frame, len);
		install = ss_index_frame_is_install(frame, len);
		for (int i = 0; i < SS_MAX_BACKUPS; i++)
		{
			ShipLink   *link = &links[i];

			/*
			 * A backup that is current skips another backup's seed (it would skip every
			 * compaction of it anyway), from its marker to its end.
			 */
			if (link->conn != NULL && link->index_started && seed && !link->awaiting_seed)
				link->skipping_seed = true;
			if (link->conn == NULL || !link->index_started || (!seed && link->awaiting_seed) ||
				link->skipping_seed)
				continue;
			/*
			 * An install makes the backup's levels durable: it goes once the WAL it is tagged
			 * with is durable there, not only placed (a backup that crashed and lost placed WAL
			 * must not hold changes whose commit records it lacks); a FLUSH is asked for it.
			 */
			if (install && link->durable < tag)
			{
				link->index_wants_flush = true;
				blocked = true;
			}
			else if (link->placed < tag)
				blocked = true;
		}
		if (blocked)
			break;
		for (int i = 0; i < SS_MAX_BACKUPS; i++)
		{
			ShipLink   *link = &links[i];
			SsBackupSlot *slot = &ss_repl->backups[i];
			const char *out = frame;
			size_t		out_len = len;

			if (link->conn == NULL || !link->index_started || (!seed && link->awaiting_seed))
				continue;
			if (link->skipping_seed)
			{
				if (seed_end)
					link->skipping_seed = false;
				continue;
			}
			if (slot->lz4)
				out = ss_index_compress(frame, len, &out_len);
			if (!ss_backup_index_append(link->conn, out, out_len, error))
			{
				link_failed(i, error);
				continue;
			}
			if (seed)
				link->awaiting_seed = false;
			/* Only this process writes these counters; the view reads them under the lock. */
			LWLockAcquire(ss_repl->lock, LW_EXCLUSIVE);
			slot->index_sent = ss_backup_index_sent(link->conn);
			slot->index_frames++;
			slot->index_bytes += out_len;
			slot->index_raw_bytes += len;
			slot->index_seeds += seed ? 1 : 0;
			slot->index_installs += ss_index_frame_is_install(frame, len) ? 1 : 0;
			LWLockRelease(ss_repl->lock);
		}
		/* The frame was copied out: frame and out stay valid until the next front/compress. */
		ss_index_queue_pop(queue);
		budget -= Min(budget, (uint64) len);
	}
}

/* With no Send-Index backup, frames raised before the last one was dropped are of no use. */
static void
drain_index_queue(void)
{
	void	   *queue = ss_index_queue();
	const char *frame;
	size_t		len;
	uint64		tag;

	if (ss_index_queue_overflowed(queue))
		ss_index_queue_clear_overflow(queue);
	while (ss_index_queue_front(queue, &frame, &len, &tag))
		ss_index_queue_pop(queue);
}

/*
 * Collects a backup's placements and, when a remote_flush commit waits, sends it a FLUSH whose
 * answer finish_collect reads, after every backup got its own. A link whose answers arrive on
 * a socket (tcp) takes what is there: the shipper waits for the rest together with new WAL
 * (wait_for_round). Others are waited for a little while commits wait (every backup was
 * appended to first, so their round trips overlap).
 */
static void
collect_from(int i, bool want_flush, bool waiters)
{
	char		error[SS_REPL_ERROR_SIZE];
	ShipLink   *link = &links[i];
	bool		waits_by_fd = ss_backup_wait_fd(link->conn) >= 0;

	link->flushing = false;
	for (int spins = 0;; spins++)
	{
		if (!ss_backup_poll(link->conn, spins == 0 ? 0 : 1, &link->placed, &link->durable,
							error))
		{
			link_failed(i, error);
			return;
		}
		if (link->placed >= ss_backup_sent(link->conn) || !waiters || waits_by_fd || spins >= 5)
			break;
	}
	if (want_flush)
	{
		if (!ss_backup_flush_start(link->conn, ss_backup_timeout_ms, error))
		{
			link_failed(i, error);
			return;
		}
		link->flushing = true;
	}
}

/*
 * Describes a tcp link's open buffer to the committing backends once the shipper's own appends
 * to it are placed, which over tcp is known only after ship_to, when the ACKs were read. A
 * backend that holds place_lock now is placing: the next round describes it.
 */
static void
describe_placed_buffer(int i)
{
	char		error[SS_REPL_ERROR_SIZE];
	ShipLink   *link = &links[i];
	SsDirectCursor *direct = &ss_repl->backups[i].direct;
	bool		ok = true;

	if (!ss_backend_placement || ss_backup_wait_fd(link->conn) < 0 ||
		ss_direct_cursor_valid(direct) || link->placed < ss_backup_sent(link->conn))
		return;
	if (!LWLockConditionalAcquire(ss_repl->place_lock, LW_EXCLUSIVE))
		return;
	if (ss_direct_cursor_valid(direct))
	{
		LWLockRelease(ss_repl->place_lock);
		return;
	}
	ok = ss_backup_adopt_cursor(link->conn, direct, error);
	release_cursor(i, ok, error);
}

/* Reads the answer to a FLUSH collect_from sent, then publishes the backup's progress. */
static void
finish_collect(int i)
{
	char		error[SS_REPL_ERROR_SIZE];
	ShipLink   *link = &links[i];

	if (link->flushing)
	{
		uint64		flushed = 0;

		link->flushing = false;
		if (!ss_backup_flush_finish(link->conn, &flushed, error))
		{
			link_failed(i, error);
			return;
		}
		link->durable = Max(link->durable, flushed);
		/* What is durable there is placed, though the ACKs the flush read were not counted. */
		link->placed = Max(link->placed, link->durable);
	}
	LWLockAcquire(ss_repl->lock, LW_EXCLUSIVE);
	if (link->index_started)
		ss_repl->backups[i].index_placed = ss_backup_index_placed(link->conn);
	/* Committing backends may have appended beyond what this process knows of. */
	if (ss_backup_sent(link->conn) > ss_repl->backups[i].sent_lsn)
		ss_repl->backups[i].sent_lsn = ss_backup_sent(link->conn);
	if (link->placed > ss_repl->backups[i].placed_lsn)
		ss_repl->backups[i].placed_lsn = link->placed;
	if (link->durable > ss_repl->backups[i].durable_lsn)
		ss_repl->backups[i].durable_lsn = link->durable;
	ss_repl->backups[i].last_ok = GetCurrentTimestamp();
	LWLockRelease(ss_repl->lock);
	describe_placed_buffer(i);
}

/* Whether a link whose answers arrive on a socket has appends not known placed yet. */
static bool
placements_pending(void)
{
	for (int i = 0; i < SS_MAX_BACKUPS; i++)
		if (links[i].conn != NULL && ss_backup_wait_fd(links[i].conn) >= 0 &&
			links[i].placed < ss_backup_sent(links[i].conn))
			return true;
	return false;
}

/*
 * Waits up to timeout_ms for the latch (a backend flushed WAL a commit waits for) or for an
 * answer on a link's socket, whichever comes first: the next round ships the one and reads
 * the other, so a commit that arrives during a round trip does not wait for it to end.
 */
static void
wait_for_round(long timeout_ms)
{
	WaitEvent	event;

	if (round_events == NULL || round_events_built != links_changed)
	{
		if (round_events != NULL)
		{
			FreeWaitEventSet(round_events);
			round_events = NULL;	/* not left dangling if the next call fails */
		}
		round_events = CreateWaitEventSet(TopMemoryContext, SS_MAX_BACKUPS + 2);
		AddWaitEventToSet(round_events, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, NULL);
		AddWaitEventToSet(round_events, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, NULL, NULL);
		for (int i = 0; i < SS_MAX_BACKUPS; i++)
			if (links[i].conn != NULL && ss_backup_wait_fd(links[i].conn) >= 0)
				AddWaitEventToSet(round_events, WL_SOCKET_READABLE,
								  ss_backup_wait_fd(links[i].conn), NULL, NULL);
		round_events_built = links_changed;
	}
	(void) WaitEventSetWait(round_events, timeout_ms, &event, 1, PG_WAIT_EXTENSION);
	ResetLatch(MyLatch);
}

/*
 * On any way out of the shipper (an ERROR, the postmaster's death): connects still under way
 * are waited for, so that no thread of the bridge's runs while the process exits.
 */
static void
abandon_connects(int code, Datum arg)
{
	for (int i = 0; i < SS_MAX_BACKUPS; i++)
		if (links[i].connecting != NULL)
		{
			ss_backup_connect_abandon(links[i].connecting);
			links[i].connecting = NULL;
		}
}

/* The shipper's main loop. */
void
ss_shipper_main(Datum arg)
{
	pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	BackgroundWorkerUnblockSignals();
	CurrentResourceOwner = ResourceOwnerCreate(NULL, "slipstream shipper");
	ss_repl->shipper_pgprocno = MyProc->pgprocno;
	memset(links, 0, sizeof(links));
	before_shmem_exit(abandon_connects, (Datum) 0);
	if (!ss_wal_reader_init(&wal_reader, SS_SHIP_CHUNK))
		ereport(ERROR, (errcode(ERRCODE_OUT_OF_MEMORY), errmsg("out of memory")));
	/* A shipper that restarts has no link: no cursor may describe the old ones' buffers. */
	LWLockAcquire(ss_repl->place_lock, LW_EXCLUSIVE);
	for (int i = 0; i < SS_MAX_BACKUPS; i++)
		ss_direct_cursor_clear(&ss_repl->backups[i].direct);
	LWLockRelease(ss_repl->place_lock);

	while (!ShutdownRequestPending)
	{
		XLogRecPtr	flush = GetFlushRecPtr(NULL);
		TimeLineID	tli = GetWALInsertionTimeLine();
		bool		want_flush = pg_atomic_read_u64(&ss_repl->flush_wanted) >
			pg_atomic_read_u64(&ss_repl->durable_lsn);
		XLogRecPtr	oldest = InvalidXLogRecPtr;
		bool		unknown = false;	/* a backup whose position is not known yet */
		TimestampTz now = GetCurrentTimestamp();
		bool		waiters = ss_repl_someone_waits();

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}
		pg_atomic_write_u32(&ss_repl->sync_backups, ss_min_sync_backups);
		for (int i = 0; i < SS_MAX_BACKUPS; i++)
		{
			bool		in_use;
			uint32		generation;

			LWLockAcquire(ss_repl->lock, LW_SHARED);
			in_use = ss_repl->backups[i].in_use;
			generation = ss_repl->backups[i].generation;
			LWLockRelease(ss_repl->lock);
			if ((links[i].conn != NULL || links[i].connecting != NULL) &&
				(!in_use || generation != links[i].generation))
				drop_link(i);	/* dropped or replaced */
			if (!in_use)
				continue;
			if (links[i].conn == NULL && links[i].connecting == NULL &&
				now >= links[i].next_attempt)
				begin_connect(i);
			if (links[i].connecting != NULL)
				finish_connect(i);
			if (links[i].conn != NULL)
				ship_to(i, flush, tli);
		}
		/* Every backup was written to: now their placements, whose round trips overlap. */
		for (int i = 0; i < SS_MAX_BACKUPS; i++)
		{
			if (links[i].conn != NULL)
				collect_from(i, want_flush || links[i].index_wants_flush, waiters);
			links[i].index_wants_flush = false;
		}

		/* Every backup that flushes got its FLUSH: now the answers, whose fsyncs overlap. */
		for (int i = 0; i < SS_MAX_BACKUPS; i++)
		{
			if (links[i].conn != NULL)
				finish_collect(i);
			/*
			 * A backup resumes at worst where its WAL is known durable. One that has not
			 * connected since this primary started may need anything the slot still keeps.
			 */
			LWLockAcquire(ss_repl->lock, LW_SHARED);
			if (!ss_repl->backups[i].in_use)
				;				/* not configured */
			else if (ss_repl->backups[i].durable_lsn == InvalidXLogRecPtr)
				unknown = true;
			else if (oldest == InvalidXLogRecPtr || ss_repl->backups[i].durable_lsn < oldest)
				oldest = ss_repl->backups[i].durable_lsn;
			LWLockRelease(ss_repl->lock);
		}
		ss_repl_publish();
		/* Index frames, after the WAL they are tagged with (placements just collected). */
		if (pg_atomic_read_u32(&ss_repl->index_backups) > 0)
			ship_index(ss_repl_someone_waits());
		else
			drain_index_queue();
		if (ss_repl_configured_backups() > 0)
		{
			ss_acquire_named_slot(SS_SHIP_SLOT, "the backups have not yet received");
			if (!unknown)
				advance_ship_slot(oldest);
		}
		else if (SearchNamedReplicationSlot(SS_SHIP_SLOT, true) != NULL)
		{
			/* The last backup was dropped: the WAL is no longer kept for it. */
			if (MyReplicationSlot != NULL)
				ReplicationSlotRelease();
			ReplicationSlotDrop(SS_SHIP_SLOT, true);
		}
		if (!ss_repl_someone_waits() || ss_repl_configured_backups() == 0)
		{
			(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, 10,
							 PG_WAIT_EXTENSION);
			ResetLatch(MyLatch);
		}
		else if (GetFlushRecPtr(NULL) == flush)
		{
			/* Waiters, nothing new to read: give the placements a moment to complete. */
			if (placements_pending())
				wait_for_round(1);
			else
			{
				(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, 1,
								 PG_WAIT_EXTENSION);
				ResetLatch(MyLatch);
			}
		}
	}
	for (int i = 0; i < SS_MAX_BACKUPS; i++)
		if (links[i].conn != NULL || links[i].connecting != NULL)
			drop_link(i);
	ss_repl->shipper_pgprocno = -1;
	/*
	 * Exit code 1: the postmaster starts us again unless it is shutting down. A SIGTERM also
	 * comes from the checkpointer invalidating our slot, or from pg_terminate_backend, and must
	 * not end replication until the next server start.
	 */
	proc_exit(1);
}
