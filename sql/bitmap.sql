-- Bitmap heap scans on slipstream tables: planned, exact and lossy, BitmapAnd/BitmapOr, and
-- the same rows as on heap.
CREATE EXTENSION IF NOT EXISTS slipstream;
CREATE TABLE bm_ss (id int, a int, b int, pad text) USING slipstream;
CREATE TABLE bm_heap (id int, a int, b int, pad text) USING heap;
INSERT INTO bm_ss SELECT g, g % 97, g % 13, repeat('p', g % 50) FROM generate_series(1, 20000) g;
INSERT INTO bm_heap SELECT * FROM bm_ss;
CREATE INDEX bm_ss_a ON bm_ss (a);
CREATE INDEX bm_ss_b ON bm_ss (b);
CREATE INDEX bm_heap_a ON bm_heap (a);
CREATE INDEX bm_heap_b ON bm_heap (b);
-- dead and updated versions must not come back
DELETE FROM bm_ss WHERE id % 10 = 0;
DELETE FROM bm_heap WHERE id % 10 = 0;
UPDATE bm_ss SET pad = 'updated' WHERE id % 10 = 5;
UPDATE bm_heap SET pad = 'updated' WHERE id % 10 = 5;
ANALYZE bm_ss;
ANALYZE bm_heap;
SET enable_seqscan = off;
SET enable_indexscan = off;
SET enable_indexonlyscan = off;

-- the planner picks a bitmap heap scan
EXPLAIN (COSTS OFF) SELECT * FROM bm_ss WHERE a = 5;
SELECT count(*), sum(id), count(*) FILTER (WHERE pad = 'updated') AS updated FROM bm_ss WHERE a = 5;
SELECT count(*), sum(id), count(*) FILTER (WHERE pad = 'updated') AS updated FROM bm_heap WHERE a = 5;
-- the same rows as heap, exactly
SELECT count(*) AS differences FROM (
  (SELECT * FROM bm_ss WHERE a IN (1, 2, 3) EXCEPT ALL SELECT * FROM bm_heap WHERE a IN (1, 2, 3))
  UNION ALL
  (SELECT * FROM bm_heap WHERE a IN (1, 2, 3) EXCEPT ALL SELECT * FROM bm_ss WHERE a IN (1, 2, 3))) d;

-- BitmapAnd and BitmapOr over two indexes
EXPLAIN (COSTS OFF) SELECT * FROM bm_ss WHERE a = 7 AND b = 3;
SELECT count(*), sum(id) FROM bm_ss WHERE a = 7 AND b = 3;
SELECT count(*), sum(id) FROM bm_heap WHERE a = 7 AND b = 3;
EXPLAIN (COSTS OFF) SELECT * FROM bm_ss WHERE a = 7 OR b = 3;
SELECT count(*), sum(id) FROM bm_ss WHERE a = 7 OR b = 3;
SELECT count(*), sum(id) FROM bm_heap WHERE a = 7 OR b = 3;

-- a bitmap too big for work_mem turns lossy: whole blocks are read and the quals rechecked
CREATE FUNCTION bm_lossy(query text) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE line text; lossy boolean := false;
BEGIN
  FOR line IN EXECUTE 'EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) ' || query LOOP
    IF line LIKE '%lossy=%' THEN lossy := true; END IF;
  END LOOP;
  RETURN lossy;
END $$;
-- (more than about 1,000 pages of 256 row ids: 300,000 rows)
CREATE TABLE bm_big (id int, m int) USING slipstream;
INSERT INTO bm_big SELECT g, g % 3 FROM generate_series(1, 300000) g;
DELETE FROM bm_big WHERE id % 1000 = 1;
CREATE INDEX bm_big_m ON bm_big (m);
ANALYZE bm_big;
SET work_mem = '64kB';
SET max_parallel_workers_per_gather = 0;
SELECT bm_lossy('SELECT * FROM bm_big WHERE m = 1') AS lossy;
SELECT count(*), sum(id), min(id), max(id) FROM bm_big WHERE m = 1;
SELECT count(*) FILTER (WHERE m = 1), sum(id) FILTER (WHERE m = 1) FROM bm_big;
RESET max_parallel_workers_per_gather;
-- and the same scan run by parallel workers
SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
SET min_parallel_table_scan_size = 0;
EXPLAIN (COSTS OFF) SELECT count(*), sum(id) FROM bm_big WHERE m = 1;
SELECT count(*), sum(id) FROM bm_big WHERE m = 1;
RESET parallel_setup_cost;
RESET parallel_tuple_cost;
RESET min_parallel_table_scan_size;
RESET work_mem;

-- a transaction's own changes, and a snapshot taken before others'
BEGIN;
INSERT INTO bm_ss VALUES (100001, 5, 5, 'mine');
DELETE FROM bm_ss WHERE id = 5;
SELECT count(*), sum(id) FROM bm_ss WHERE a = 5;
ROLLBACK;
SELECT count(*), sum(id) FROM bm_ss WHERE a = 5;

-- a cursor over a bitmap scan
BEGIN;
DECLARE c CURSOR FOR SELECT id FROM bm_ss WHERE a = 11 ORDER BY id;
FETCH 3 FROM c;
CLOSE c;
COMMIT;

RESET enable_seqscan;
RESET enable_indexscan;
RESET enable_indexonlyscan;
DROP FUNCTION bm_lossy(text);
DROP TABLE bm_ss, bm_heap, bm_big;

-- Blocks whose rows VACUUM removed: the scans that read a table block by block (ANALYZE,
-- bitmap, TID range and backward scans) seek with the block's end as a bound, so each stops
-- there instead of walking the removed rows to the next live one; the rows are the same.
CREATE TABLE bm_gaps (id int, pad text) USING slipstream;
INSERT INTO bm_gaps SELECT g, 'p' || g FROM generate_series(1, 5120) g;
CREATE INDEX bm_gaps_id ON bm_gaps (id);
DELETE FROM bm_gaps WHERE id NOT BETWEEN 769 AND 800 AND id NOT BETWEEN 4353 AND 4360
  AND id <> 5120;
VACUUM bm_gaps;
ANALYZE bm_gaps;
SELECT relpages, reltuples FROM pg_class WHERE relname = 'bm_gaps';
SELECT count(*), min(id), max(id) FROM bm_gaps WHERE ctid >= '(3,0)' AND ctid < '(4,0)';
SELECT count(*), min(id), max(id) FROM bm_gaps WHERE ctid >= '(4,0)' AND ctid < '(17,0)';
SET enable_seqscan = off;
SET enable_indexscan = off;
EXPLAIN (COSTS OFF) SELECT id FROM bm_gaps WHERE id > 700;
SELECT array_agg(id ORDER BY id) FROM bm_gaps WHERE id > 700 AND id NOT BETWEEN 770 AND 799;
RESET enable_seqscan;
RESET enable_indexscan;
BEGIN;
DECLARE g SCROLL CURSOR FOR SELECT id FROM bm_gaps;
FETCH LAST FROM g;
FETCH BACKWARD 10 FROM g;
FETCH ABSOLUTE 1 FROM g;
CLOSE g;
COMMIT;
DROP TABLE bm_gaps;
