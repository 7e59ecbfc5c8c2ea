-- What VACUUM reports of slipstream tables (VERBOSE, log_autovacuum_min_duration,
-- pg_stat_progress_vacuum) and the work memory it keeps to, as heap's VACUUM does
-- (tableam/vacuum.c). The message holds the counts; its detail, what varies from run to run
-- (xids, WAL, time), which terse verbosity leaves out.
CREATE EXTENSION IF NOT EXISTS slipstream;
\set VERBOSITY terse

-- Rows removed: deleted rows (with their index entries), chain versions pruned (a root that
-- leads on loses its row, the members before the live version go) and nothing else.
CREATE TABLE vac_r (id int PRIMARY KEY, v int) USING slipstream;
INSERT INTO vac_r SELECT g, 0 FROM generate_series(1, 600) g;
DELETE FROM vac_r WHERE id <= 100;
UPDATE vac_r SET v = 1 WHERE id > 500;
UPDATE vac_r SET v = 2 WHERE id > 550;
VACUUM (VERBOSE) vac_r;
-- Nothing is left to remove; the redirects stay, and their blocks are all-visible now: every
-- block is skipped, its rows counted by their keys, the redirects left out.
VACUUM (VERBOSE) vac_r;
SELECT count(*), sum(v) FROM vac_r;

-- With index cleanup off, dead rows stay where they are and are not counted as removed.
DELETE FROM vac_r WHERE id <= 150;
VACUUM (VERBOSE, INDEX_CLEANUP off) vac_r;
VACUUM (VERBOSE) vac_r;
DROP TABLE vac_r;

-- A rolled-back UPDATE leaves a version of every row it changed, which no index and no chain
-- leads to: VACUUM removes them during its scan, 1,024 at a time, so that their list never
-- outgrows a batch whatever the UPDATE changed.
CREATE TABLE vac_a (id int PRIMARY KEY, v int) USING slipstream;
INSERT INTO vac_a SELECT g, 0 FROM generate_series(1, 3000) g;
BEGIN;
UPDATE vac_a SET v = 1;
ROLLBACK;
VACUUM (VERBOSE) vac_a;
VACUUM (VERBOSE) vac_a;
SELECT count(*), sum(v), sum(id) FROM vac_a;
SET enable_seqscan = off; SET enable_bitmapscan = off;
SELECT count(*), sum(v) FROM vac_a WHERE id > 0;
RESET enable_seqscan; RESET enable_bitmapscan;
SELECT slipstream.verify('vac_a');
DROP TABLE vac_a;

-- More dead rows than half of maintenance_work_mem holds (1 MB: 65,536 row ids) take more
-- than one pass over the indexes, each removing index entries before rows, and leave the
-- table and its indexes agreeing.
CREATE TABLE vac_m (id int PRIMARY KEY, k int) USING slipstream;
CREATE INDEX vac_m_k ON vac_m (k);
INSERT INTO vac_m SELECT g, g % 1000 FROM generate_series(1, 140000) g;
DELETE FROM vac_m WHERE id % 2 = 0;
SET maintenance_work_mem = '1MB';
VACUUM (VERBOSE) vac_m;
RESET maintenance_work_mem;
SET enable_seqscan = off; SET enable_bitmapscan = off;
SELECT count(*), sum(id) FROM vac_m WHERE id > 0;
SELECT count(*), sum(k) FROM vac_m WHERE k >= 0;
RESET enable_seqscan; RESET enable_bitmapscan;
SELECT count(*), sum(id), sum(k) FROM vac_m;
SELECT slipstream.verify('vac_m');
-- Roots of chains that die in the prunes after the scan join the dead row list too, and past its
-- limit get their pass over the indexes there: 60,000 deleted rows and 10,000 chains whose last
-- version was deleted, under 1 MB, take two passes.
CREATE TABLE vac_p (id int PRIMARY KEY, v int) USING slipstream;
INSERT INTO vac_p SELECT g, 0 FROM generate_series(1, 80000) g;
UPDATE vac_p SET v = 1 WHERE id <= 10000;
VACUUM vac_p;
DELETE FROM vac_p WHERE id <= 70000;
SET maintenance_work_mem = '1MB';
VACUUM (VERBOSE) vac_p;
RESET maintenance_work_mem;
SET enable_seqscan = off; SET enable_bitmapscan = off;
SELECT count(*), min(id), sum(v) FROM vac_p WHERE id > 0;
RESET enable_seqscan; RESET enable_bitmapscan;
SELECT count(*), min(id), sum(v) FROM vac_p;
SELECT slipstream.verify('vac_p');
DROP TABLE vac_p;
-- ANALYZE holds maintenance_io_concurrency at 0 while it samples a slipstream table
-- (tableam/prefetch.c) and gives it back when it ends, in a transaction block too. (That it
-- is 0 meanwhile shows only on a table past row id 33.5 M: tests/pg_big_table_test.sh.)
SET maintenance_io_concurrency = 7;
ANALYZE vac_m;
SHOW maintenance_io_concurrency;
BEGIN;
ANALYZE vac_m;
SHOW maintenance_io_concurrency;
COMMIT;
RESET maintenance_io_concurrency;
SELECT reltuples FROM pg_class WHERE relname = 'vac_m';
DROP TABLE vac_m;
\set VERBOSITY default
