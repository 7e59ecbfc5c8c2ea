/*
 * host/wal_records.h: the layouts of slipstream's WAL records, shared by the code that writes
 * and replays them (host/wal.c) and the code that decodes them (host/decode.c).
 */
#ifndef SLIPSTREAM_WAL_RECORDS_H
#define SLIPSTREAM_WAL_RECORDS_H

#define SS_XLOG_PUT 0x00
#define SS_XLOG_PUT_MULTI 0x10
#define SS_XLOG_HEADER 0x20
#define SS_XLOG_UPDATE 0x30
#define SS_XLOG_REMOVE 0x40
#define SS_XLOG_RESET 0x50
#define SS_XLOG_CONFLICT 0x60
/* Header records that mean more than a new header, for logical decoding (host/decode.c). */
#define SS_XLOG_DELETE 0x70		/* a delete: the new header, then the old key if logged */
#define SS_XLOG_CONFIRM 0x80	/* a speculative insertion confirmed: the new header */
#define SS_XLOG_SUPER_DELETE 0x90	/* a speculative insertion undone: the new header */
/* Rows copied by a table rewrite (CLUSTER, VACUUM FULL, ALTER TABLE): PUT_MULTI's layout,
 * replayed alike, and not decoded (as heap's HEAP_INSERT_NO_LOGICAL). */
#define SS_XLOG_REWRITE 0xA0
/* A block's all-visible bit set by VACUUM, or cleared by a change to the block (vismap.c). */
#define SS_XLOG_VM_SET 0xB0
#define SS_XLOG_VM_CLEAR 0xC0
/* A HOT-like chain pruned: its root rewritten as a redirect, dead members removed (chains.c). */
#define SS_XLOG_PRUNE 0xD0

/*
 * Every record begins with the relation file it changes: `tag` (database and relfilenode, the
 * engine's keyspace tag) and `spc`, the file's tablespace, which logical decoding needs to map
 * the file back to its relation (RelidByRelfilenode). A reset is just those.
 */
typedef struct XlRelation
{
	uint64		tag;
	Oid			spc;
} XlRelation;

typedef struct XlPut
{
	uint64		tag;
	Oid			spc;
	uint64		rowid;
	uint32		len;
} XlPut;

typedef struct XlMultiHeader
{
	uint64		tag;
	Oid			spc;
	uint32		count;
} XlMultiHeader;

typedef struct XlMultiItem
{
	uint64		rowid;
	uint32		len;
} XlMultiItem;

typedef struct XlHeader
{
	uint64		tag;
	Oid			spc;
	uint64		rowid;
	char		header[SS_HEADER_SIZE];
} XlHeader;

/* A delete's record: the header, then old_key_len bytes of the old key tuple (0: none). */
typedef struct XlDelete
{
	XlHeader	header;
	uint32		old_key_len;
} XlDelete;

/* An update's record: this, the new tuple (len bytes), then the old key tuple, if any. */
typedef struct XlUpdate
{
	uint64		tag;
	Oid			spc;
	uint64		old_rowid;
	uint64		new_rowid;
	uint32		len;
	uint32		old_key_len;
	char		old_header[SS_HEADER_SIZE];
} XlUpdate;

/* Queries on a hot standby whose snapshot may still see what follows must end first. */
typedef struct XlConflict
{
	uint64		tag;
	Oid			spc;
	TransactionId horizon;		/* as heap's latestRemovedXid */
} XlConflict;

typedef struct XlRemove
{
	uint64		tag;
	Oid			spc;
	uint32		count;
} XlRemove;

/*
 * A chain's prune: this, the root's redirect (redirect_len bytes), then `count` row ids removed.
 * `horizon` is the newest xid whose versions it removes, for hot standby conflicts.
 */
typedef struct XlPrune
{
	uint64		tag;
	Oid			spc;
	TransactionId horizon;
	uint64		root;
	uint32		count;
	uint32		redirect_len;
} XlPrune;

/*
 * A visibility map change: block `block` (256 row ids) of the relation file; the map page is
 * the record's block reference 0. `cutoff`: for a set, the newest xmin in the block, which
 * queries on a hot standby must not predate (as heap's XLOG_HEAP2_VISIBLE).
 */
typedef struct XlVisibility
{
	uint64		tag;
	Oid			spc;
	BlockNumber block;
	TransactionId cutoff;
} XlVisibility;

/* Decoding reads the file's tablespace at the same offset in every record. */
#define SS_XL_SPC_OFFSET offsetof(XlRelation, spc)
StaticAssertDecl(offsetof(XlPut, spc) == SS_XL_SPC_OFFSET &&
				 offsetof(XlMultiHeader, spc) == SS_XL_SPC_OFFSET &&
				 offsetof(XlHeader, spc) == SS_XL_SPC_OFFSET &&
				 offsetof(XlUpdate, spc) == SS_XL_SPC_OFFSET &&
				 offsetof(XlConflict, spc) == SS_XL_SPC_OFFSET &&
				 offsetof(XlRemove, spc) == SS_XL_SPC_OFFSET &&
				 offsetof(XlPrune, spc) == SS_XL_SPC_OFFSET &&
				 offsetof(XlVisibility, spc) == SS_XL_SPC_OFFSET,
				 "every record starts with its relation file");

#endif							/* SLIPSTREAM_WAL_RECORDS_H */
