-- The sizes of slipstream tables: pg_relation_size, pg_table_size and pg_total_relation_size
-- report the bytes the engine holds (their md files are empty stubs), and stay PostgreSQL's
-- own for every other relation.
CREATE EXTENSION IF NOT EXISTS slipstream;
CREATE TABLE sz_ss (id int PRIMARY KEY, v text) USING slipstream;
CREATE TABLE sz_heap (id int PRIMARY KEY, v text) USING heap;
INSERT INTO sz_ss SELECT g, repeat(md5(g::text), 3) FROM generate_series(1, 20000) g;
INSERT INTO sz_heap SELECT * FROM sz_ss;
VACUUM ANALYZE sz_heap;

-- the rows' own bytes, to judge the engine's estimate by
CREATE TEMP TABLE sz_expect AS SELECT sum(pg_column_size(t.*))::bigint AS row_bytes FROM sz_ss t;

-- the engine holds about the rows' bytes (keys, tuple headers and values)
SELECT pg_relation_size('sz_ss') BETWEEN row_bytes * 0.8 AND row_bytes * 3 AS plausible
  FROM sz_expect;
SELECT pg_relation_size('sz_ss', 'main') = pg_relation_size('sz_ss') AS main_is_default,
       pg_relation_size('sz_ss', 'fsm') AS fsm, pg_relation_size('sz_ss', 'vm') AS vm;
SELECT pg_table_size('sz_ss') >= pg_relation_size('sz_ss') AS table_includes_main,
       pg_total_relation_size('sz_ss') = pg_table_size('sz_ss') + pg_indexes_size('sz_ss')
         AS total_adds_indexes,
       pg_indexes_size('sz_ss') > 0 AS has_index_bytes;
-- heap tables keep PostgreSQL's answer: their pages
SELECT pg_relation_size('sz_heap') = current_setting('block_size')::bigint * relpages AS heap_is_pages
  FROM pg_class WHERE relname = 'sz_heap';
-- a relation that does not exist: NULL, as PostgreSQL's
SELECT pg_relation_size(0) IS NULL AS missing_is_null, pg_table_size(0) IS NULL AS missing_table;

-- the swap is visible in the plan, and works in views, PL/pgSQL and the one-argument form
EXPLAIN (VERBOSE, COSTS OFF) SELECT pg_relation_size('sz_ss'), pg_table_size('sz_ss');
CREATE VIEW sz_view AS SELECT pg_total_relation_size('sz_ss') AS total;
SELECT total > 0 AS view_sees_engine FROM sz_view;
SELECT pg_get_viewdef('sz_view') LIKE '%pg_total_relation_size%' AS view_keeps_pg_function;
DO $$
BEGIN
  RAISE NOTICE 'plpgsql sees engine bytes: %', pg_relation_size('sz_ss') > 0;
END $$;

-- more rows, more bytes; a truncated table holds none
INSERT INTO sz_ss SELECT g, repeat(md5(g::text), 3) FROM generate_series(20001, 40000) g;
SELECT pg_relation_size('sz_ss') BETWEEN row_bytes * 1.6 AND row_bytes * 6 AS grew FROM sz_expect;
TRUNCATE sz_ss;
SELECT pg_relation_size('sz_ss') AS after_truncate;

DROP VIEW sz_view;
DROP TABLE sz_ss, sz_heap;
