-- HOT-like version chains (tableam/chains.c): an update that changes no indexed column leaves
-- the indexes alone, its version joins a chain that index fetches walk from the root the
-- entries name, and pruning (on access and in VACUUM) shortens chains.
CREATE EXTENSION IF NOT EXISTS slipstream;
CREATE TABLE hot_t (id int PRIMARY KEY, k int, v text) USING slipstream;
CREATE INDEX hot_t_k ON hot_t (k);
INSERT INTO hot_t SELECT g, g % 10, 'v' || g FROM generate_series(1, 300) g;
SET enable_seqscan = off;
SET enable_bitmapscan = off;
-- Two HOT updates and one of an indexed column, counted as heap counts them.
-- (pg_stat_xact_user_tables also holds counts not flushed yet: the deltas count.)
BEGIN;
SELECT n_tup_upd AS upd0, n_tup_hot_upd AS hot0
  FROM pg_stat_xact_user_tables WHERE relname = 'hot_t' \gset
UPDATE hot_t SET v = 'a' WHERE id = 1;
UPDATE hot_t SET v = 'b' WHERE id = 1;
UPDATE hot_t SET k = 100 WHERE id = 2;
SELECT n_tup_upd - :upd0 AS updates, n_tup_hot_upd - :hot0 AS hot_updates
  FROM pg_stat_xact_user_tables WHERE relname = 'hot_t';
COMMIT;
-- The chain: the root (HOT-updated, 0x4000), then heap-only versions (0x8000).
SELECT ctid, infomask2 & x'c000'::int AS hot_bits, next_ctid
  FROM slipstream.row_versions('hot_t') WHERE ctid IN ('(0,1)', '(1,45)', '(1,46)', '(1,47)');
-- Both indexes still name the root; a fetch returns the newest version, at its own ctid.
SELECT id, k, v, ctid FROM hot_t WHERE id = 1;
SELECT id, v, ctid FROM hot_t WHERE k = 1 AND id < 30 ORDER BY id;
SELECT id, k, ctid FROM hot_t WHERE k = 100;
-- The root's own TID names a dead version, as on heap.
SELECT count(*) FROM hot_t WHERE ctid = '(0,1)';

-- A fetch that walks past dead versions prunes the chain: the root becomes a redirect
-- (0x0800) to the first version still needed, and the dead members are gone.
UPDATE hot_t SET v = 'c' WHERE id = 1;
SELECT v FROM hot_t WHERE id = 1;
SELECT ctid, infomask2 & x'c800'::int AS bits, next_ctid
  FROM slipstream.row_versions('hot_t') WHERE ctid = '(0,1)' OR ctid > '(1,44)' ORDER BY ctid;

-- An aborted update in the middle of a chain, then a committed one.
UPDATE hot_t SET v = 'd1' WHERE id = 4;
BEGIN;
UPDATE hot_t SET v = 'aborted' WHERE id = 4;
ROLLBACK;
UPDATE hot_t SET v = 'd2' WHERE id = 4;
SELECT id, v FROM hot_t WHERE id = 4;
SELECT id, v FROM hot_t WHERE k = 4 AND id < 10;

-- Unique checks and ON CONFLICT find a chain's live version through its root.
INSERT INTO hot_t VALUES (1, 0, 'dup');
INSERT INTO hot_t VALUES (1, 0, 'x') ON CONFLICT (id) DO UPDATE SET v = 'upserted';
SELECT id, v FROM hot_t WHERE id = 1;
-- A deleted member: the whole chain is dead.
DELETE FROM hot_t WHERE id = 4;
SELECT count(*) FROM hot_t WHERE id = 4;

-- Bitmap scans reach versions through roots: a few point reads, and a fuller block in one pass.
RESET enable_bitmapscan;
SET enable_indexscan = off;
EXPLAIN (COSTS OFF) SELECT id, v FROM hot_t WHERE id IN (1, 2, 3);
SELECT id, v FROM hot_t WHERE id IN (1, 2, 3) ORDER BY id;
UPDATE hot_t SET v = v || '!' WHERE id <= 100;
SELECT count(*), count(*) FILTER (WHERE v LIKE '%!') FROM hot_t WHERE id <= 150;
RESET enable_indexscan;

-- VACUUM prunes every chain; whole-dead chains go with their index entries.
VACUUM hot_t;
SELECT count(*) FILTER (WHERE infomask2 & x'0800'::int <> 0) AS redirects,
       count(*) FILTER (WHERE infomask2 & x'8000'::int <> 0) AS heap_only,
       count(*) AS stored
  FROM slipstream.row_versions('hot_t');
SELECT count(*), sum(id) FROM hot_t WHERE id > 0;
SELECT count(*) FROM hot_t WHERE k >= 0;

-- After its scan VACUUM prunes the chains of redirects whose versions it found dead, from what
-- the scan read (tableam/vacuum.c): each redirect then names its row's live version, and the
-- dead versions between are gone. Updates by sequential scans prune nothing on access.
CREATE TABLE hot_vac (id int PRIMARY KEY, v int) USING slipstream;
INSERT INTO hot_vac SELECT g, 0 FROM generate_series(1, 4) g;
SET enable_seqscan = on; SET enable_indexscan = off; SET enable_bitmapscan = off;
UPDATE hot_vac SET v = 1;
VACUUM hot_vac;
UPDATE hot_vac SET v = 2 WHERE id <= 3;
UPDATE hot_vac SET v = 3 WHERE id <= 2;
SELECT count(*) FILTER (WHERE infomask2 & x'0800'::int <> 0) AS redirects,
       count(*) FILTER (WHERE infomask2 & x'8000'::int <> 0) AS heap_only
  FROM slipstream.row_versions('hot_vac');
VACUUM hot_vac;
SELECT count(*) FILTER (WHERE infomask2 & x'0800'::int <> 0) AS redirects,
       count(*) FILTER (WHERE infomask2 & x'8000'::int <> 0) AS heap_only,
       count(*) FILTER (WHERE xmax <> 0 AND infomask2 & x'0800'::int = 0) AS dead
  FROM slipstream.row_versions('hot_vac');
SELECT r.ctid AS root, r.next_ctid AS names, l.ctid = r.next_ctid AS names_live_version
  FROM slipstream.row_versions('hot_vac') r
  JOIN slipstream.row_versions('hot_vac') l ON l.infomask2 & x'8000'::int <> 0 AND l.xmax = 0
   AND l.ctid = r.next_ctid
 WHERE r.infomask2 & x'0800'::int <> 0 ORDER BY r.ctid;
SET enable_seqscan = off; RESET enable_indexscan;
SELECT id, v FROM hot_vac WHERE id BETWEEN 1 AND 4 ORDER BY id;
RESET enable_bitmapscan;
SELECT check_name, ok FROM slipstream.verify('hot_vac');
DROP TABLE hot_vac;

-- New indexes index a chain's version under its root's TID, built plainly or concurrently.
CREATE INDEX hot_t_v ON hot_t (v);
CREATE UNIQUE INDEX CONCURRENTLY hot_t_v_id ON hot_t (v, id);
SELECT id, v FROM hot_t WHERE v = 'v50!';
SELECT id FROM hot_t WHERE v = 'upserted!';
SELECT check_name, ok FROM slipstream.verify('hot_t');

-- The setting turns HOT updates off (every update then inserts index entries).
SET slipstream.hot_updates = off;
BEGIN;
SELECT n_tup_upd AS upd0, n_tup_hot_upd AS hot0
  FROM pg_stat_xact_user_tables WHERE relname = 'hot_t' \gset
UPDATE hot_t SET v = 'cold' WHERE id = 20;
SELECT n_tup_upd - :upd0 AS updates, n_tup_hot_upd - :hot0 AS hot_updates
  FROM pg_stat_xact_user_tables WHERE relname = 'hot_t';
COMMIT;
RESET slipstream.hot_updates;

-- Rewrites keep no chains: every copy is indexed on its own.
CLUSTER hot_t USING hot_t_pkey;
SELECT count(*) FILTER (WHERE infomask2 & x'c800'::int <> 0) AS chain_rows
  FROM slipstream.row_versions('hot_t');
SELECT id, v FROM hot_t WHERE id IN (1, 20, 50) ORDER BY id;
UPDATE hot_t SET v = 'after cluster' WHERE id = 50;
VACUUM FULL hot_t;
SELECT id, v FROM hot_t WHERE id = 50;
SELECT check_name, ok FROM slipstream.verify('hot_t');
DROP TABLE hot_t;

-- Index entries name chain roots: the index AMs' deletion of entries whose rows are dead (here
-- btree's, when new entries fill a page holding killed ones) must keep an entry whose root is
-- dead while its chain lives on.
CREATE TABLE hot_del (k int, v int) USING slipstream;
CREATE INDEX hot_del_k ON hot_del (k);
INSERT INTO hot_del SELECT g, 0 FROM generate_series(1, 350) g;
UPDATE hot_del SET v = 1 WHERE k <= 100;
DELETE FROM hot_del WHERE k BETWEEN 101 AND 200;
SET enable_seqscan = off; SET enable_bitmapscan = off;
SELECT count(*) FROM hot_del WHERE k BETWEEN 101 AND 200;
SELECT count(*) FROM hot_del WHERE k BETWEEN 101 AND 200;
INSERT INTO hot_del SELECT g % 100 + 1, 2 FROM generate_series(1, 300) g;
SELECT count(*), sum(v) FROM hot_del WHERE k <= 100;
SET enable_indexscan = off; SET enable_seqscan = on;
SELECT count(*), sum(v) FROM hot_del WHERE k <= 100;
DROP TABLE hot_del;

-- A row inserted and HOT-updated by one transaction, the update in a subtransaction: a new
-- index gets the live version only (the root is being deleted by this transaction, as heap
-- classifies it).
CREATE TABLE hot_sub (id int, c int) USING slipstream;
CREATE INDEX hot_sub_id ON hot_sub (id);
BEGIN;
INSERT INTO hot_sub VALUES (1, 10);
SAVEPOINT s;
UPDATE hot_sub SET c = 20 WHERE id = 1;
RELEASE s;
CREATE INDEX hot_sub_c ON hot_sub (c);
COMMIT;
SET enable_seqscan = off; SET enable_bitmapscan = off;
SELECT id, c FROM hot_sub WHERE c = 10;
SELECT id, c FROM hot_sub WHERE c >= 0;
RESET enable_seqscan; RESET enable_bitmapscan;
DROP TABLE hot_sub;

-- A row lock or a delete after a rolled-back HOT update ends the chain to the aborted version
-- (no HOT flag, no forward link), as heap's do.
CREATE TABLE hot_lock (id int PRIMARY KEY, v int) USING slipstream;
INSERT INTO hot_lock VALUES (1, 0), (2, 0);
BEGIN;
UPDATE hot_lock SET v = 1 WHERE id IN (1, 2);
ROLLBACK;
BEGIN;
SELECT id FROM hot_lock WHERE id = 1 FOR UPDATE;
COMMIT;
DELETE FROM hot_lock WHERE id = 2;
SELECT ctid, infomask2 & x'4000'::int AS hot_updated, next_ctid
  FROM slipstream.row_versions('hot_lock') WHERE ctid IN ('(0,1)', '(0,2)');
DROP TABLE hot_lock;

-- The chain cache is shared by every backend (tableam/chain_cache.c): VACUUM's prune records
-- where the chain's needed versions begin, so that a fetch in a new backend reads that one
-- version and not the redirect before it. Each version read counts as a block access.
CREATE TABLE hot_cache (id int PRIMARY KEY, v int) USING slipstream;
INSERT INTO hot_cache VALUES (1, 0), (2, 0);
UPDATE hot_cache SET v = 1 WHERE id = 1;
UPDATE hot_cache SET v = 2 WHERE id = 1;
VACUUM hot_cache;
\c -
SET enable_seqscan = off; SET enable_bitmapscan = off;
BEGIN;
SELECT v FROM hot_cache WHERE id = 1;
SELECT v FROM hot_cache WHERE id = 2;
SELECT pg_stat_get_xact_blocks_hit('hot_cache'::regclass) AS versions_read;
COMMIT;
-- A new file node is a new keyspace: what the cache knew of the old one never applies to it.
TRUNCATE hot_cache;
INSERT INTO hot_cache VALUES (1, 10), (2, 20);
UPDATE hot_cache SET v = 11 WHERE id = 1;
SELECT id, v FROM hot_cache ORDER BY id;
RESET enable_seqscan; RESET enable_bitmapscan;
DROP TABLE hot_cache;

-- A prune on access tells the statistics what it reclaimed, as heap's page prune does, so that
-- autovacuum counts only the dead versions VACUUM must remove: n_dead_tup ends equal to the
-- dead versions still stored. The first walk after row 1's three updates in one transaction
-- passes three dead versions from the root and prunes them (walks after it start at the chain
-- cache's entry, past the root); row 2's chain keeps its one dead version.
CREATE TABLE hot_dead (id int PRIMARY KEY, v int) USING slipstream;
INSERT INTO hot_dead VALUES (1, 0), (2, 0);
SET enable_seqscan = off; SET enable_bitmapscan = off;
BEGIN;
UPDATE hot_dead SET v = 1 WHERE id = 1;
UPDATE hot_dead SET v = 2 WHERE id = 1;
UPDATE hot_dead SET v = 3 WHERE id = 1;
COMMIT;
UPDATE hot_dead SET v = 4 WHERE id = 1;
UPDATE hot_dead SET v = 5 WHERE id = 1;
UPDATE hot_dead SET v = 1 WHERE id = 2;
UPDATE hot_dead SET v = 2 WHERE id = 2;
SELECT id, v FROM hot_dead WHERE id IN (1, 2) ORDER BY id;
RESET enable_seqscan; RESET enable_bitmapscan;
SELECT count(*) FILTER (WHERE infomask2 & x'0800'::int <> 0) AS redirects,
       count(*) FILTER (WHERE xmax <> 0 AND infomask2 & x'0800'::int = 0) AS dead_versions
  FROM slipstream.row_versions('hot_dead');
SELECT pg_stat_force_next_flush();
SELECT n_tup_upd, n_dead_tup FROM pg_stat_user_tables WHERE relname = 'hot_dead';
DROP TABLE hot_dead;
