/*
 * replication/catch_up.c: before a backup is promoted, its replay catches up with every byte
 * of WAL it holds. PostgreSQL's startup process decodes WAL ahead of replay (recovery
 * prefetching) and keeps an error it met at the then end of pg_wal until replay gets there.
 * A standby that is not told to promote meets that error, reads again and finds the WAL that
 * arrived since; a standby told to promote ends recovery at it instead. A backup held paused
 * (deferred replay) or lagging behind its primary (continuous replay) may hold such an error
 * well before the end of the WAL it received, and a promotion at that moment would drop every
 * commit after it. So slipstream.promote() first finds where the valid WAL in pg_wal ends,
 * waits until replay is there, and only then promotes (docs/replication.md, "Failures").
 * slipstream.catch_up() does the same for a promotion made by someone else (Patroni's
 * pre_promote hook, or a user about to call pg_promote()).
 */
#include "slipstream.h"
#include "replication/repl.h"

#include <fcntl.h>
#include <unistd.h>

#include "access/xlog.h"
#include "access/xlog_internal.h"
#include "access/xlogreader.h"
#include "access/xlogrecovery.h"
#include "miscadmin.h"
#include "storage/fd.h"
#include "storage/latch.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

/* How often the wait looks at replay, and wakes the startup process out of its retry sleep. */
#define SS_CATCH_UP_POLL_MS 10

/* The pg_wal segment a page read has open. */
typedef struct PgWalPages
{
	TimeLineID	tli;
	XLogSegNo	segno;
	int			fd;				/* -1: none open */
} PgWalPages;

/*
 * The reader's page_read callback: a whole page of pg_wal, or -1 where the segment file is
 * missing or ends (the end of the WAL this node holds). Any other failure to read is an ERROR:
 * taken for the end, it would promote without WAL the node holds.
 */
static int
read_pg_wal_page(XLogReaderState *reader, XLogRecPtr page, int wanted, XLogRecPtr record,
				 char *buffer)
{
	PgWalPages *pages = (PgWalPages *) reader->private_data;
	XLogSegNo	segno;
	char		path[MAXPGPATH];
	ssize_t		n;

	XLByteToSeg(page, segno, wal_segment_size);
	XLogFilePath(path, pages->tli, segno, wal_segment_size);
	if (pages->fd >= 0 && pages->segno != segno)
	{
		CloseTransientFile(pages->fd);
		pages->fd = -1;
	}
	if (pages->fd < 0)
	{
		pages->fd = OpenTransientFile(path, O_RDONLY | PG_BINARY);
		if (pages->fd < 0 && errno == ENOENT)
			return -1;
		if (pages->fd < 0)
			ereport(ERROR,
					(errcode_for_file_access(),
					 errmsg("could not open WAL segment \"%s\": %m", path)));
		pages->segno = segno;
	}
	n = pg_pread(pages->fd, buffer, XLOG_BLCKSZ, XLogSegmentOffset(page, wal_segment_size));
	if (n < 0)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("could not read WAL segment \"%s\": %m", path)));
	return n == XLOG_BLCKSZ ? XLOG_BLCKSZ : -1;
}

/*
 * The end of the last complete, valid record of timeline `tli` in pg_wal at or after `from`
 * (`from` itself when there is none): how far replay can get with the WAL this node holds.
 * Pages are checked as the startup process checks them: this cluster's system identifier, and
 * this timeline only.
 */
static XLogRecPtr
pg_wal_valid_end(XLogRecPtr from, TimeLineID tli)
{
	PgWalPages pages = {tli, 0, -1};
	XLogReaderState *reader;
	XLogRecPtr	first;
	XLogRecPtr	end = from;
	char	   *error;
	uint64		records = 0;

	reader = XLogReaderAllocate(wal_segment_size, NULL,
								XL_ROUTINE(.page_read = read_pg_wal_page), &pages);
	if (reader == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory while reading pg_wal")));
	reader->system_identifier = GetSystemIdentifier();
	first = XLogFindNextRecord(reader, from);
	if (first != InvalidXLogRecPtr)
	{
		while (XLogReadRecord(reader, &error) != NULL && reader->latestPageTLI == tli)
		{
			end = reader->EndRecPtr;
			if (++records % 4096 == 0)
				CHECK_FOR_INTERRUPTS();
		}
	}
	if (pages.fd >= 0)
		CloseTransientFile(pages.fd);
	XLogReaderFree(reader);
	return end;
}

/*
 * Waits until replay has reached `target`, until `deadline`: ends any pause of replay (as a
 * promotion would) and wakes the startup process out of its sleep between reads of pg_wal, so
 * that it reads the WAL the fence wrote. Returns whether replay got there.
 */
static bool
wait_replay_reaches(XLogRecPtr target, TimestampTz deadline)
{
	for (;;)
	{
		if (GetXLogReplayRecPtr(NULL) >= target)
			return true;
		if (GetCurrentTimestamp() >= deadline)
			return false;
		if (GetRecoveryPauseState() != RECOVERY_NOT_PAUSED)
			SetRecoveryPause(false);
		WakeupRecovery();
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 SS_CATCH_UP_POLL_MS, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
}

/*
 * Lets replay catch up with the WAL pg_wal holds now, until `deadline`: finds the end of its
 * valid records from the replay position on, then waits for replay to get there. Sets *end to
 * that end; returns whether replay reached it in time.
 */
bool
ss_catch_up(TimestampTz deadline, XLogRecPtr *end)
{
	TimeLineID	tli;
	XLogRecPtr	replayed;

	/* Read apart: the timeline is an output of the call that reads the position. */
	replayed = GetXLogReplayRecPtr(&tli);
	*end = pg_wal_valid_end(replayed, tli);
	return wait_replay_reaches(*end, deadline);
}
