/*
 * replication/wal_reader.c: reads flushed WAL from pg_wal for whoever ships it, the shipper
 * or a committing backend placing its own commit. A reader keeps its segment file open from
 * call to call (the slot "slipstream_backups" keeps the file from being recycled while a backup
 * may still need it), and remembers the range it read last, so that backups that are level
 * ask for the same range once. Files are opened with BasicOpenFile: a backend reads inside its
 * commit callback and keeps the file across transactions, which fd.c's transient files may
 * not. Nothing here raises an ERROR.
 */
#include "slipstream.h"
#include "replication/repl.h"

#include <fcntl.h>
#include <unistd.h>

#include "access/xlog.h"
#include "access/xlog_internal.h"
#include "storage/fd.h"
#include "utils/memutils.h"

/*
 * Makes a reader with a buffer of `capacity` bytes in TopMemoryContext (it lives as long as the
 * process); false, without an ERROR, when there is no memory for it.
 */
bool
ss_wal_reader_init(SsWalReader *reader, Size capacity)
{
	reader->fd = -1;
	reader->segno = 0;
	reader->tli = 0;
	reader->from = InvalidXLogRecPtr;
	reader->len = 0;
	reader->capacity = capacity;
	reader->buffer = MemoryContextAllocExtended(TopMemoryContext, capacity, MCXT_ALLOC_NO_OOM);
	return reader->buffer != NULL;
}

/*
 * Reads WAL [from, from + len) of timeline `tli` into the reader's buffer; len must stay inside
 * one segment and the buffer. False with a message in `error` (SS_REPL_ERROR_SIZE bytes).
 */
bool
ss_wal_read(SsWalReader *reader, XLogRecPtr from, Size len, TimeLineID tli, char *error)
{
	XLogSegNo	segno;
	char		name[MAXFNAMELEN];
	ssize_t		n;

	Assert(len <= reader->capacity);
	if (from == reader->from && len <= reader->len && tli == reader->tli)
		return true;
	XLByteToSeg(from, segno, wal_segment_size);
	XLogFileName(name, tli, segno, wal_segment_size);
	if (reader->fd < 0 || segno != reader->segno || tli != reader->tli)
	{
		char		path[MAXPGPATH];

		if (reader->fd >= 0)
		{
			close(reader->fd);
			ReleaseExternalFD();
			reader->fd = -1;
		}
		reader->from = InvalidXLogRecPtr;
		snprintf(path, sizeof(path), XLOGDIR "/%s", name);
		/* Counted against max_files_per_process, as fd.c counts its own. */
		if (!AcquireExternalFD())
		{
			snprintf(error, SS_REPL_ERROR_SIZE, "cannot open WAL file %s: too many open files", name);
			return false;
		}
		reader->fd = BasicOpenFile(path, O_RDONLY | PG_BINARY);
		if (reader->fd < 0)
		{
			ReleaseExternalFD();
			snprintf(error, SS_REPL_ERROR_SIZE, "cannot open WAL file %s: %m (the backup fell too far behind: reseed it)", name);
			return false;
		}
		reader->segno = segno;
		reader->tli = tli;
	}
	n = pg_pread(reader->fd, reader->buffer, len, XLogSegmentOffset(from, wal_segment_size));
	if (n != (ssize_t) len)
	{
		snprintf(error, SS_REPL_ERROR_SIZE, "short read of WAL file %s", name);
		reader->from = InvalidXLogRecPtr;
		return false;
	}
	reader->from = from;
	reader->len = len;
	return true;
}

/* The bytes of a read that may be asked for at `from`: up to `capacity` and the segment's end. */
Size
ss_wal_read_size(const SsWalReader *reader, XLogRecPtr from, XLogRecPtr upto)
{
	Size		len = Min((Size) (upto - from), reader->capacity);

	return Min(len, (Size) (wal_segment_size - XLogSegmentOffset(from, wal_segment_size)));
}
