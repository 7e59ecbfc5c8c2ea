-- The slipstream schema's functions and views, statistics, and every error path.
CREATE EXTENSION IF NOT EXISTS slipstream;
CREATE TABLE st (id int PRIMARY KEY, v text) USING slipstream;
INSERT INTO st SELECT g, repeat('x', g % 300) FROM generate_series(1, 20000) g;

-- verify: engine structure plus table/index agreement
SELECT check_name, ok FROM slipstream.verify('st');
-- statistics: views over set-returning functions
SELECT count(*) > 20 AS has_counters FROM slipstream.engine;
SELECT value > 0 AS wrote FROM slipstream.engine WHERE name = 'user_bytes_written';
SELECT rowid_high >= 20000 AS ids FROM slipstream.table_stats('st');
SELECT slipstream.compact('st');
SELECT sum(entries) >= 20000 AS compacted FROM slipstream.levels;
SELECT value >= 1 AS compactions FROM slipstream.engine WHERE name = 'compactions';
SELECT check_name, ok FROM slipstream.verify('st');
-- The row cache: index fetches of rows read before are answered from it, and see every update
SET enable_seqscan = off;
SET enable_bitmapscan = off;
SELECT sum(length(v)) FROM st WHERE id BETWEEN 1001 AND 1500;
SELECT value AS hits_before FROM slipstream.engine WHERE name = 'row_cache_hits' \gset
SELECT sum(length(v)) FROM st WHERE id BETWEEN 1001 AND 1500;
SELECT value - :hits_before >= 500 AS cached FROM slipstream.engine WHERE name = 'row_cache_hits';
UPDATE st SET v = 'changed' WHERE id = 1007;
SELECT v FROM st WHERE id = 1007;
BEGIN;
DELETE FROM st WHERE id = 1008;
SELECT count(*) FROM st WHERE id BETWEEN 1007 AND 1008;
ROLLBACK;
SELECT id, length(v) FROM st WHERE id BETWEEN 1007 AND 1008 ORDER BY id;
RESET enable_seqscan;
RESET enable_bitmapscan;

-- ANALYZE and VACUUM give the planner honest numbers; VACUUM removes dead rows
DELETE FROM st WHERE id % 4 = 0;
VACUUM st;
SELECT reltuples FROM pg_class WHERE relname = 'st';
ANALYZE st;
SELECT reltuples BETWEEN 14000 AND 16000 AS sane FROM pg_class WHERE relname = 'st';
EXPLAIN (COSTS OFF) SELECT * FROM st WHERE id = 5;
SELECT n_live_tup, n_dead_tup FROM pg_stat_user_tables WHERE relname = 'st';
VACUUM (FREEZE) st;
SELECT age(relfrozenxid) <= age(txid_current()::text::xid) AS advanced FROM pg_class WHERE relname = 'st';
SELECT check_name, ok FROM slipstream.verify('st');
-- TABLESAMPLE
SELECT count(*) > 0 AND count(*) < 15000 AS sampled FROM st TABLESAMPLE BERNOULLI (10) REPEATABLE (1);
SELECT count(*) > 0 AS sampled FROM st TABLESAMPLE SYSTEM (50) REPEATABLE (1);
-- parallel sequential scan
SET enable_indexonlyscan = off; SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0; SET min_parallel_table_scan_size = 0;
SET max_parallel_workers_per_gather = 2;
EXPLAIN (COSTS OFF) SELECT count(*) FROM st;
SELECT count(*), sum(id) FROM st;
RESET enable_indexonlyscan; RESET parallel_setup_cost; RESET parallel_tuple_cost; RESET min_parallel_table_scan_size;
RESET max_parallel_workers_per_gather;

-- Bad input: NULLs, missing tables, tables of another access method, privileges
SELECT * FROM slipstream.verify(NULL);
SELECT slipstream.compact(NULL);
SELECT * FROM slipstream.table_stats(NULL);
SELECT * FROM slipstream.verify('no_such_table');
SELECT * FROM slipstream.verify(4000000000::oid::regclass);
CREATE TABLE plain (x int) USING heap;
SELECT * FROM slipstream.verify('plain');
SELECT slipstream.compact('plain');
CREATE VIEW vw AS SELECT 1 AS x;
SELECT * FROM slipstream.table_stats('vw');
CREATE ROLE ss_nobody;
CREATE ROLE ss_operator IN ROLE slipstream_admin;
GRANT SELECT ON st TO ss_nobody, ss_operator;
SET ROLE ss_nobody;
SELECT slipstream.compact('st');
RESET ROLE;
SET ROLE ss_operator;
SELECT slipstream.compact('st');
RESET ROLE;
DROP OWNED BY ss_nobody, ss_operator;
DROP ROLE ss_nobody, ss_operator;
-- Settings are fixed at server start and validated
SHOW slipstream.l0_size;
SET slipstream.l0_size = '8MB';
SET slipstream.no_such_setting = 1;
DROP TABLE st, plain;
DROP VIEW vw;
