/*
 * tableam/chain_cache.c: the chain cache, shared by every backend. Per chain root, it says
 * where the versions some transaction may still see begin, so that an MVCC fetch starts there
 * instead of reading a redirect or a dead root first (tableam/chains.c).
 *
 * Why an entry stays true: the versions before `first_needed` were dead to everyone when it was
 * written, and dead to everyone is for good (the horizon is the same for every backend of the
 * database). An entry names a chain by engine keyspace, relation file node tag and root row id.
 * A keyspace id is never given to a second file node while the server runs (the engine's counter
 * only grows, and a truncate in place or a new file node gets a new keyspace); the tag must
 * match too, because a standby importing the primary's index segments takes the primary's
 * keyspace table as it is. What an entry names can still go: a prune removes versions, and the
 * row ids of removed versions at the top of a table can be handed out again (the counter
 * restarts above the highest stored row after a restart, and on a promoted standby). So the
 * entry also carries the raw xmin of the version it names, which together with the row id
 * names that one version (freezing keeps the raw xmin); a fetch that finds no row there, or
 * another one, forgets the entry and walks from the root (chains.c).
 * Shared memory is rebuilt at every server start and after a crash, which empties the cache.
 *
 * The cache is direct-mapped: a chain whose slot another chain takes is merely walked from its
 * root again. A bitmap with one bit per entry, set once the entry is first filled, lets a fetch
 * of a row that never had a chain skip the entry: the bitmap (128 KiB for a million entries)
 * stays in the processor's cache, the entries (40 MiB) do not, and a scan of rows never updated
 * would otherwise pay a memory miss per row for nothing. Each entry is guarded by a sequence
 * counter (odd while a writer fills it), so a reader never uses a torn entry; a writer that
 * finds the entry busy gives up, since losing a cache write costs one read later and waiting
 * would cost every fetch.
 */
#include "slipstream.h"

#include "port/atomics.h"
#include "port/pg_bitutils.h"
#include "storage/shmem.h"

typedef struct ChainCacheEntry
{
	pg_atomic_uint32 seq;		/* odd while a writer fills the entry; 0: never filled */
	uint32		keyspace;
	uint64		tag;
	uint64		root;
	uint64		first_needed;
	TransactionId first_xmin;	/* the raw xmin of the version at first_needed */
} ChainCacheEntry;

static ChainCacheEntry *chain_cache = NULL;
static pg_atomic_uint64 *chain_cache_filled = NULL;	/* a bit per entry: ever filled */
static uint64 chain_cache_mask = 0;

/* Entries the cache has: slipstream.chain_cache_entries rounded down to a power of two. */
static uint64
chain_cache_entries(void)
{
	if (ss_chain_cache_entries == 0)
		return 0;
	return UINT64CONST(1) << pg_leftmost_one_pos32((uint32) ss_chain_cache_entries);
}

/* Asks for the cache's shared memory (from the shmem_request_hook). */
void
ss_chain_cache_shmem_request(void)
{
	RequestAddinShmemSpace(mul_size(sizeof(ChainCacheEntry), chain_cache_entries()));
	RequestAddinShmemSpace(mul_size(sizeof(pg_atomic_uint64), chain_cache_entries() / 64 + 1));
}

/* Creates or attaches the cache (from the shmem_startup_hook, under AddinShmemInitLock). */
void
ss_chain_cache_shmem_init(void)
{
	uint64		entries = chain_cache_entries();
	bool		found;

	if (entries == 0)
		return;
	chain_cache = ShmemInitStruct("slipstream chain cache", sizeof(ChainCacheEntry) * entries,
								  &found);
	if (!found)
	{
		/* Zeroed entries are empty: sequence 0 names no chain (keyspace 0 is no keyspace). */
		memset(chain_cache, 0, sizeof(ChainCacheEntry) * entries);
		for (uint64 i = 0; i < entries; i++)
			pg_atomic_init_u32(&chain_cache[i].seq, 0);
	}
	chain_cache_filled = ShmemInitStruct("slipstream chain cache bitmap",
										 sizeof(pg_atomic_uint64) * (entries / 64 + 1), &found);
	if (!found)
		for (uint64 i = 0; i < entries / 64 + 1; i++)
			pg_atomic_init_u64(&chain_cache_filled[i], 0);
	chain_cache_mask = entries - 1;
}

/*
 * The number of the entry a chain maps to: a keyspace's roots take consecutive entries from a
 * place its id hashes to, so that the fetches of an index range scan, whose roots mostly
 * ascend, read the entries in address order and the processor prefetches them.
 */
static inline uint64
chain_cache_slot(uint32 keyspace, uint64 root)
{
	uint64		start = ((uint64) keyspace * UINT64CONST(0x9E3779B97F4A7C15)) >> 24;

	return (start + root) & chain_cache_mask;
}

/* Whether entry `slot` was ever filled (a read of the bitmap, which stays cached). */
static inline bool
chain_cache_ever_filled(uint64 slot)
{
	uint64		word = pg_atomic_read_u64(&chain_cache_filled[slot / 64]);

	return (word & (UINT64CONST(1) << (slot % 64))) != 0;
}

/*
 * Whether the cache knows where the versions of chain `root` that some transaction may see
 * begin; if so, *first_needed says where and *first_xmin the raw xmin the version there had.
 */
bool
ss_chain_cache_lookup(uint32 keyspace, uint64 tag, uint64 root, uint64 *first_needed,
					  TransactionId *first_xmin)
{
	ChainCacheEntry *entry;
	uint64		slot;
	uint32		before;
	uint64		found_tag;
	uint64		found_root;
	uint64		found_first;
	TransactionId found_xmin;
	uint32		found_keyspace;

	if (chain_cache == NULL)
		return false;
	slot = chain_cache_slot(keyspace, root);
	if (!chain_cache_ever_filled(slot))
		return false;
	entry = &chain_cache[slot];
	before = pg_atomic_read_u32(&entry->seq);
	if (before == 0 || (before & 1) != 0)
		return false;
	pg_read_barrier();
	found_keyspace = ((volatile ChainCacheEntry *) entry)->keyspace;
	found_tag = ((volatile ChainCacheEntry *) entry)->tag;
	found_root = ((volatile ChainCacheEntry *) entry)->root;
	found_first = ((volatile ChainCacheEntry *) entry)->first_needed;
	found_xmin = ((volatile ChainCacheEntry *) entry)->first_xmin;
	pg_read_barrier();
	if (pg_atomic_read_u32(&entry->seq) != before || found_keyspace != keyspace ||
		found_tag != tag || found_root != root)
		return false;
	*first_needed = found_first;
	*first_xmin = found_xmin;
	return true;
}

/* Fills entry `slot` unless another writer holds it; `keyspace` 0 empties it. */
static void
chain_cache_store(uint64 slot, uint32 keyspace, uint64 tag, uint64 root, uint64 first_needed,
				  TransactionId first_xmin)
{
	ChainCacheEntry *entry = &chain_cache[slot];
	uint32		seq = pg_atomic_read_u32(&entry->seq);

	if ((seq & 1) != 0 || !pg_atomic_compare_exchange_u32(&entry->seq, &seq, seq + 1))
		return;
	((volatile ChainCacheEntry *) entry)->keyspace = keyspace;
	((volatile ChainCacheEntry *) entry)->tag = tag;
	((volatile ChainCacheEntry *) entry)->root = root;
	((volatile ChainCacheEntry *) entry)->first_needed = first_needed;
	((volatile ChainCacheEntry *) entry)->first_xmin = first_xmin;
	pg_write_barrier();
	/* Never back to 0, which means empty; an even value names the entry's contents. */
	pg_atomic_write_u32(&entry->seq, seq + 2 == 0 ? 2 : seq + 2);
	if (keyspace != 0 && !chain_cache_ever_filled(slot))
		pg_atomic_fetch_or_u64(&chain_cache_filled[slot / 64], UINT64CONST(1) << (slot % 64));
}

/*
 * Remembers that the versions of chain `root` some transaction may see begin at `rowid`, the
 * version whose raw xmin is `xmin`.
 */
void
ss_chain_cache_remember(uint32 keyspace, uint64 tag, uint64 root, uint64 rowid,
						TransactionId xmin)
{
	uint64		known;
	TransactionId known_xmin;

	if (chain_cache == NULL)
		return;
	/* A fetch that changes nothing writes nothing: the line stays shared between readers. */
	if (ss_chain_cache_lookup(keyspace, tag, root, &known, &known_xmin) && known == rowid &&
		known_xmin == xmin)
		return;
	chain_cache_store(chain_cache_slot(keyspace, root), keyspace, tag, root, rowid, xmin);
}

/*
 * Forgets chain `root`'s entry if it still sends fetches to `rowid` (any row id for
 * SS_NO_ROWID): a prune removed that version, or a fetch found another row there.
 */
void
ss_chain_cache_forget(uint32 keyspace, uint64 tag, uint64 root, uint64 rowid)
{
	uint64		known;
	TransactionId known_xmin;

	if (chain_cache == NULL)
		return;
	if (ss_chain_cache_lookup(keyspace, tag, root, &known, &known_xmin) &&
		(rowid == SS_NO_ROWID || known == rowid))
		chain_cache_store(chain_cache_slot(keyspace, root), 0, 0, 0, 0, InvalidTransactionId);
}
