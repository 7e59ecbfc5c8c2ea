-- Tablespaces: slipstream tables can be created in, and moved between, tablespaces. The stub
-- file, TOAST table and indexes live in the tablespace; the rows stay in the engine's files
-- (docs/extension.md, "Storage model"). Moving a table keeps every row version and its ctid,
-- so the indexes, which move by themselves, keep pointing at them.
CREATE EXTENSION IF NOT EXISTS slipstream;
SET allow_in_place_tablespaces = true;
CREATE TABLESPACE ss_space LOCATION '';

CREATE TABLE ts_t (id int PRIMARY KEY, v text, big text) USING slipstream TABLESPACE ss_space;
CREATE INDEX ts_t_v ON ts_t (v) TABLESPACE ss_space;
INSERT INTO ts_t SELECT g, 'v' || g, CASE WHEN g % 50 = 0 THEN repeat(md5(g::text), 400) END
FROM generate_series(1, 600) g;
UPDATE ts_t SET v = v || '+' WHERE id % 7 = 0;
DELETE FROM ts_t WHERE id % 11 = 0;
SELECT c.relname, t.spcname, a.amname FROM pg_class c
JOIN pg_tablespace t ON t.oid = c.reltablespace LEFT JOIN pg_am a ON a.oid = c.relam
WHERE c.relname IN ('ts_t', 'ts_t_v') ORDER BY 1;
-- A move that rolls back leaves the rows where they were.
BEGIN;
ALTER TABLE ts_t SET TABLESPACE pg_default;
INSERT INTO ts_t VALUES (1000, 'in the move');
ROLLBACK;
-- The worker sweeps the keyspaces whose files are gone every 5 s (here the aborted move's):
-- the rows of a table in a tablespace outlive a sweep.
SELECT pg_sleep(6);
SELECT count(*), sum(id), count(big), sum(length(big)) FROM ts_t;

-- Moving the table keeps every version (dead ones too) with its ctid.
CREATE TEMP TABLE before_rows AS SELECT ctid AS tid, * FROM ts_t;
CREATE TEMP TABLE before_versions AS
SELECT v.ctid AS tid, v.xmin::text AS x_min, v.xmax::text AS x_max, v.infomask, v.next_ctid
FROM slipstream.row_versions('ts_t') v;
ALTER TABLE ts_t SET TABLESPACE pg_default;
SELECT spcname FROM pg_class c LEFT JOIN pg_tablespace t ON t.oid = c.reltablespace
WHERE c.relname = 'ts_t';
SELECT count(*) AS differing_rows FROM (
  (SELECT ctid AS tid, * FROM ts_t EXCEPT SELECT * FROM before_rows)
  UNION ALL (SELECT * FROM before_rows EXCEPT SELECT ctid AS tid, * FROM ts_t)) d;
CREATE TEMP TABLE after_versions AS
SELECT v.ctid AS tid, v.xmin::text AS x_min, v.xmax::text AS x_max, v.infomask, v.next_ctid
FROM slipstream.row_versions('ts_t') v;
SELECT (SELECT count(*) FROM before_versions) AS versions,
       (SELECT count(*) FROM before_versions WHERE x_max <> '0') AS with_xmax;
SELECT count(*) AS differing_versions FROM (
  (SELECT * FROM after_versions EXCEPT SELECT * FROM before_versions)
  UNION ALL (SELECT * FROM before_versions EXCEPT SELECT * FROM after_versions)) d;
-- The indexes did not move and still find the rows.
SET enable_seqscan = off;
SET enable_bitmapscan = off;
SELECT id, v FROM ts_t WHERE id = 14;
SELECT id, v FROM ts_t WHERE v = 'v14+';
RESET enable_seqscan;
RESET enable_bitmapscan;

-- New rows after a move get fresh row ids.
ALTER TABLE ts_t SET TABLESPACE ss_space;
INSERT INTO ts_t VALUES (1001, 'after the move');
SELECT count(*) AS reused_row_ids FROM ts_t a JOIN before_rows b ON a.ctid = b.tid
WHERE a.id = 1001;
SELECT count(*), sum(id) FROM ts_t;

-- Rewrites and truncation inside a tablespace.
VACUUM FULL ts_t;
CLUSTER ts_t USING ts_t_pkey;
SELECT count(*), sum(id), count(big) FROM ts_t;
TRUNCATE ts_t;
INSERT INTO ts_t VALUES (1, 'one');
SELECT * FROM ts_t;

-- Unlogged and temporary tables.
CREATE UNLOGGED TABLE ts_u (id int) USING slipstream TABLESPACE ss_space;
INSERT INTO ts_u SELECT generate_series(1, 100);
ALTER TABLE ts_u SET TABLESPACE pg_default;
SELECT count(*) FROM ts_u;
SET temp_tablespaces = ss_space;
CREATE TEMP TABLE ts_temp (id int) USING slipstream;
INSERT INTO ts_temp SELECT generate_series(1, 10);
SELECT count(*) FROM ts_temp;
RESET temp_tablespaces;

DROP TABLE ts_temp;

-- A database whose default tablespace is ss_space.
SELECT current_database() AS regress_db \gset
CREATE DATABASE ss_space_db TABLESPACE ss_space TEMPLATE template0;
\c ss_space_db
CREATE EXTENSION slipstream;
CREATE TABLE in_db (id int) USING slipstream;
INSERT INTO in_db SELECT generate_series(1, 50);
SELECT count(*) FROM in_db;
\c :regress_db
DROP DATABASE ss_space_db;

DROP TABLE ts_t, ts_u;
DROP TABLESPACE ss_space;
