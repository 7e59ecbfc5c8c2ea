-- The visibility map of slipstream tables (tableam/vismap.c): VACUUM sets the all-visible bit
-- of 256-row-id blocks whose rows everyone sees, index-only scans then skip the table for
-- them, and every change clears the bits of the blocks it touches.
CREATE EXTENSION IF NOT EXISTS slipstream;
CREATE EXTENSION IF NOT EXISTS pg_visibility;
-- Updates here make new index entries; HOT chains have their own rule, tested at the end.
SET slipstream.hot_updates = off;
CREATE TABLE vm_t (id int PRIMARY KEY, v int) USING slipstream;
INSERT INTO vm_t SELECT g, g % 10 FROM generate_series(1, 1000) g;
SELECT relallvisible FROM pg_class WHERE relname = 'vm_t';
VACUUM vm_t;
SELECT relpages, relallvisible FROM pg_class WHERE relname = 'vm_t';
SELECT blkno, all_visible FROM pg_visibility_map('vm_t') ORDER BY 1;
SET enable_seqscan = off;
SET enable_bitmapscan = off;
-- Heap fetches: 0, the rows are not read.
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) SELECT count(*) FROM vm_t WHERE id < 100;
SELECT count(*), sum(id) FROM vm_t WHERE id < 100;

-- An update clears the bits of the old version's block (0) and the new one's (3).
UPDATE vm_t SET v = -1 WHERE id = 5;
SELECT blkno, all_visible FROM pg_visibility_map('vm_t') ORDER BY 1;
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) SELECT count(*) FROM vm_t WHERE id < 100;
SELECT count(*), sum(id) FROM vm_t WHERE id < 100;

-- A delete clears its block's bit: the deleted row is not counted through the index.
VACUUM vm_t;
SELECT blkno, all_visible FROM pg_visibility_map('vm_t') ORDER BY 1;
DELETE FROM vm_t WHERE id = 300;
SELECT blkno, all_visible FROM pg_visibility_map('vm_t') ORDER BY 1;
SELECT count(*), sum(id) FROM vm_t WHERE id BETWEEN 250 AND 350;

-- An insert into a block VACUUM marked (the last, partly filled one) clears it; rolled back,
-- its row is not counted.
VACUUM vm_t;
SELECT blkno, all_visible FROM pg_visibility_map('vm_t') ORDER BY 1;
BEGIN;
INSERT INTO vm_t VALUES (2000, 0);
SELECT blkno, all_visible FROM pg_visibility_map('vm_t') ORDER BY 1;
ROLLBACK;
SELECT count(*) FROM vm_t WHERE id > 900;
INSERT INTO vm_t SELECT g, 0 FROM generate_series(3000, 3009) g;
SELECT count(*) FROM vm_t WHERE id > 900;

-- Row locks and VACUUM's freezing keep the bits.
VACUUM (FREEZE) vm_t;
SELECT count(*) FILTER (WHERE all_visible) AS visible_blocks FROM pg_visibility_map('vm_t');
BEGIN;
SELECT id FROM vm_t WHERE id = 10 FOR UPDATE;
SELECT count(*) FILTER (WHERE all_visible) AS visible_blocks FROM pg_visibility_map('vm_t');
COMMIT;

-- The planner sees the all-visible share, as for heap: a covering index wins.
RESET enable_seqscan;
RESET enable_bitmapscan;
ANALYZE vm_t;
EXPLAIN (COSTS OFF) SELECT id FROM vm_t WHERE id BETWEEN 10 AND 20;
-- TRUNCATE, CLUSTER and VACUUM FULL start without a map.
CLUSTER vm_t USING vm_t_pkey;
SELECT count(*) FILTER (WHERE all_visible) AS visible_blocks FROM pg_visibility_map('vm_t');
SET enable_seqscan = off;
SELECT count(*) FROM vm_t WHERE id < 100;
TRUNCATE vm_t;
INSERT INTO vm_t VALUES (1, 1);
SELECT count(*) FROM vm_t WHERE id < 100;
RESET enable_seqscan;

-- A pruned HOT chain (its root a redirect to one version every transaction sees) leaves its
-- root's block all-visible, as heap's pruned chains leave their page: the version names its
-- root (infomask2 bit 4096, 8 bytes past its columns), and every change to it clears the
-- root's block too, where index-only scans look.
RESET slipstream.hot_updates;
TRUNCATE vm_t;
INSERT INTO vm_t SELECT g, g % 10 FROM generate_series(1, 600) g;
UPDATE vm_t SET v = -1 WHERE id IN (5, 6, 7);
UPDATE vm_t SET v = -2 WHERE id = 6;
VACUUM vm_t;
SELECT blkno, all_visible FROM pg_visibility_map('vm_t') ORDER BY 1;
SELECT count(*) FILTER (WHERE infomask2 & 4096 <> 0) AS linked,
       count(*) FILTER (WHERE infomask2 & 2048 <> 0) AS redirects
  FROM slipstream.row_versions('vm_t');
SET enable_seqscan = off;
SET enable_bitmapscan = off;
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) SELECT count(*) FROM vm_t WHERE id < 100;
SELECT count(*), sum(v) FROM vm_t WHERE id < 100;
-- Deleting a chain's version clears its root's block (0) and its own (2): the index-only
-- count sees the delete.
DELETE FROM vm_t WHERE id = 5;
SELECT blkno, all_visible FROM pg_visibility_map('vm_t') ORDER BY 1;
SELECT count(*) FROM vm_t WHERE id < 100;
-- So does an update of one, whether it changes the key (a new root) or not (a HOT update).
VACUUM vm_t;
SELECT blkno, all_visible FROM pg_visibility_map('vm_t') ORDER BY 1;
UPDATE vm_t SET id = 1000 WHERE id = 6;
SELECT blkno, all_visible FROM pg_visibility_map('vm_t') ORDER BY 1;
SELECT count(*) FROM vm_t WHERE id < 100;
VACUUM vm_t;
UPDATE vm_t SET v = -3 WHERE id = 7;
SELECT blkno, all_visible FROM pg_visibility_map('vm_t') ORDER BY 1;
SELECT count(*), sum(v) FROM vm_t WHERE id < 100;
VACUUM vm_t;
SELECT blkno, all_visible FROM pg_visibility_map('vm_t') ORDER BY 1;
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) SELECT count(*) FROM vm_t WHERE id < 100;
SELECT count(*), sum(v) FROM vm_t WHERE id < 100;
RESET enable_seqscan;
RESET enable_bitmapscan;
-- A row copied out of a chain is a row of its own: no link in another table, nor after a
-- rewrite.
CREATE TABLE vm_copy (id int PRIMARY KEY, v int) USING slipstream;
INSERT INTO vm_copy SELECT * FROM vm_t;
SELECT count(*) FILTER (WHERE infomask2 & 4096 <> 0) AS linked, count(*)
  FROM slipstream.row_versions('vm_copy');
SELECT sum(v) FROM vm_copy;
VACUUM FULL vm_t;
SELECT count(*) FILTER (WHERE infomask2 & 4096 <> 0) AS linked, count(*)
  FROM slipstream.row_versions('vm_t');
SELECT count(*), sum(v) FROM vm_t;
-- Nor does a row that leaves the table AM in a slot: copied into heap (which would keep the
-- bit, and through TOAST lose the bytes) and back, its columns read back whole; and a no-op
-- update of a chain's version is suppressed, its length being the new one's.
CREATE TABLE vm_wide (id int PRIMARY KEY, n int, t text) USING slipstream;
ALTER TABLE vm_wide ALTER COLUMN t SET STORAGE EXTERNAL;
INSERT INTO vm_wide VALUES (1, 0, repeat('abcdefgh', 1000));
UPDATE vm_wide SET n = 1;
CREATE TABLE vm_heap USING heap AS SELECT * FROM vm_wide;
CREATE TABLE vm_back (id int, n int, t text) USING slipstream;
INSERT INTO vm_back SELECT * FROM vm_heap;
SELECT n, md5(t) = md5(repeat('abcdefgh', 1000)) AS whole FROM vm_back;
CREATE TRIGGER vm_same BEFORE UPDATE ON vm_wide
  FOR EACH ROW EXECUTE FUNCTION suppress_redundant_updates_trigger();
WITH changed AS (UPDATE vm_wide SET n = n RETURNING 1) SELECT count(*) AS updated FROM changed;
DROP TABLE vm_wide, vm_heap, vm_back;
DROP TABLE vm_copy;
DROP TABLE vm_t;

-- VACUUM leaves out all-visible blocks, as heap's does (VERBOSE says how many): a change
-- clears its block's bit, so only the blocks of the two deletes are read. Their rows are
-- counted in full and the others' by their keys; relfrozenxid stays, since the skipped blocks'
-- xids were not looked at. DISABLE_PAGE_SKIPPING and FREEZE read every block and may
-- advance it.
CREATE TABLE vm_skip (id int PRIMARY KEY, v int) USING slipstream;
INSERT INTO vm_skip SELECT g, 0 FROM generate_series(1, 1280) g;
VACUUM (FREEZE) vm_skip;
SELECT relfrozenxid::text::bigint AS frozen_before FROM pg_class WHERE relname = 'vm_skip' \gset
-- (VERBOSE's detail says what varies from run to run: xids, WAL, time.)
\set VERBOSITY terse
DELETE FROM vm_skip WHERE id IN (10, 1000);
SELECT count(*) FILTER (WHERE all_visible) AS visible_blocks FROM pg_visibility_map('vm_skip');
VACUUM (VERBOSE) vm_skip;
SELECT reltuples, relallvisible, relfrozenxid::text::bigint = :frozen_before AS frozenxid_kept
  FROM pg_class WHERE relname = 'vm_skip';
SELECT n_live_tup, n_dead_tup FROM pg_stat_get_live_tuples('vm_skip'::regclass) n_live_tup,
  pg_stat_get_dead_tuples('vm_skip'::regclass) n_dead_tup;
SELECT count(*), sum(id) FROM vm_skip;
VACUUM (VERBOSE) vm_skip;
-- Skipped blocks' rows are counted, not estimated: block 0 now holds far fewer rows than the
-- others, and an estimate from the scanned blocks' density would be off.
DELETE FROM vm_skip WHERE id <= 200;
VACUUM vm_skip;
UPDATE vm_skip SET v = 1 WHERE id = 700;
VACUUM (VERBOSE) vm_skip;
SELECT reltuples, (SELECT count(*) FROM vm_skip) AS rows FROM pg_class WHERE relname = 'vm_skip';
VACUUM (VERBOSE, DISABLE_PAGE_SKIPPING) vm_skip;
\set VERBOSITY default
SELECT reltuples, relallvisible, relfrozenxid::text::bigint > :frozen_before AS frozenxid_advanced
  FROM pg_class WHERE relname = 'vm_skip';
DROP TABLE vm_skip;

-- Without index cleanup a dead row stays, and so does its xmin's hold on relfrozenxid.
CREATE TABLE vm_keep (id int PRIMARY KEY) USING slipstream;
INSERT INTO vm_keep VALUES (1), (2);
SELECT xmin::text::bigint AS kept_xmin FROM vm_keep WHERE id = 1 \gset
DELETE FROM vm_keep WHERE id = 1;
VACUUM (FREEZE, INDEX_CLEANUP off) vm_keep;
SELECT relfrozenxid::text::bigint <= :kept_xmin AS holds_back FROM pg_class WHERE relname = 'vm_keep';
VACUUM (FREEZE) vm_keep;
SELECT relfrozenxid::text::bigint > :kept_xmin AS advanced FROM pg_class WHERE relname = 'vm_keep';
DROP TABLE vm_keep;

-- COPY FREEZE into a table created in the same transaction (TABLE_INSERT_FROZEN): the rows go
-- in frozen and the blocks they fill are all-visible at once, as heap's pages are, so the
-- VACUUM after a load has nothing to read there. Block 0 also holds a row inserted before the
-- COPY, not frozen: it is left to VACUUM. The last block, partly filled, is marked at the end.
\getenv abs_builddir PG_ABS_BUILDDIR
\set frozen_data :abs_builddir '/vm_frozen.data'
COPY (SELECT g, 'copied' FROM generate_series(1, 1000) g) TO :'frozen_data';
BEGIN;
CREATE TABLE vm_frozen (id int PRIMARY KEY, v text) USING slipstream;
INSERT INTO vm_frozen VALUES (0, 'plain');
COPY vm_frozen FROM :'frozen_data' WITH (FREEZE);
COMMIT;
SELECT blkno, all_visible FROM pg_visibility_map('vm_frozen') ORDER BY 1;
SELECT infomask & 768 = 768 AS xmin_frozen, count(*)
  FROM slipstream.row_versions('vm_frozen') GROUP BY 1 ORDER BY 1;
-- Heap fetches only for the rows of block 0 (ids 0-255), whose bit VACUUM has not set yet.
SET enable_seqscan = off;
SET enable_bitmapscan = off;
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) SELECT count(*) FROM vm_frozen WHERE id < 600;
SELECT count(*), sum(id) FROM vm_frozen WHERE id < 600;
RESET enable_seqscan;
RESET enable_bitmapscan;
-- A change after the load clears its block's bit as always.
UPDATE vm_frozen SET v = 'changed' WHERE id = 700;
SELECT blkno, all_visible FROM pg_visibility_map('vm_frozen') ORDER BY 1;
SELECT count(*) FILTER (WHERE v = 'changed'), count(*) FROM vm_frozen;
DROP TABLE vm_frozen;
-- Without a new file node in the transaction, COPY FREEZE is refused by PostgreSQL itself.
CREATE TABLE vm_frozen (id int PRIMARY KEY, v text) USING slipstream;
COPY vm_frozen FROM :'frozen_data' WITH (FREEZE);
-- After TRUNCATE in the transaction it is allowed again.
BEGIN;
TRUNCATE vm_frozen;
COPY vm_frozen FROM :'frozen_data' WITH (FREEZE);
COMMIT;
SELECT blkno, all_visible FROM pg_visibility_map('vm_frozen') ORDER BY 1;
SELECT count(*), sum(id) FROM vm_frozen;
DROP TABLE vm_frozen;

-- REFRESH MATERIALIZED VIEW fills its new file node with frozen rows too.
CREATE MATERIALIZED VIEW vm_mat USING slipstream AS
  SELECT g AS id FROM generate_series(1, 600) g WITH NO DATA;
REFRESH MATERIALIZED VIEW vm_mat;
SELECT blkno, all_visible FROM pg_visibility_map('vm_mat') ORDER BY 1;
SELECT bool_and(infomask & 768 = 768) AS all_frozen, count(*) FROM slipstream.row_versions('vm_mat');
DROP MATERIALIZED VIEW vm_mat;
