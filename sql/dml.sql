-- Basic DDL and DML on slipstream tables, checked against what heap would return.
CREATE EXTENSION IF NOT EXISTS slipstream;
SET default_table_access_method = slipstream;

CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, qty int DEFAULT 0, note text);
SELECT amname FROM pg_class c JOIN pg_am a ON a.oid = c.relam WHERE relname = 'items';
INSERT INTO items VALUES (1, 'apple', 5), (2, 'pear', 3), (3, 'plum', NULL);
INSERT INTO items (id, name) SELECT g, 'item' || g FROM generate_series(4, 1000) g;
SELECT count(*), sum(id), count(qty), sum(qty) FROM items;
SELECT * FROM items WHERE id <= 3 ORDER BY id;

-- UPDATE moves rows to new row ids; every index must follow.
UPDATE items SET qty = qty + 1 WHERE id <= 2;
UPDATE items SET name = upper(name) WHERE id % 100 = 0;
SELECT id, name, qty FROM items WHERE id IN (1, 2, 100, 1000) ORDER BY id;
SELECT count(*) FROM items WHERE name LIKE 'ITEM%';

-- DELETE, and DELETE ... RETURNING
DELETE FROM items WHERE id > 990 RETURNING id;
DELETE FROM items WHERE id % 2 = 0;
SELECT count(*), min(id), max(id) FROM items;

-- UPDATE ... FROM, and a self-join
CREATE TABLE price (id int, price numeric);
INSERT INTO price SELECT g, g * 1.5 FROM generate_series(1, 20) g;
UPDATE items i SET note = 'priced ' || p.price FROM price p WHERE p.id = i.id;
SELECT id, note FROM items WHERE note IS NOT NULL ORDER BY id LIMIT 5;

-- COPY in and out (COPY FROM goes through multi_insert)
CREATE TABLE copied (a int, b text, c float8);
COPY copied FROM stdin WITH (FORMAT csv);
1,one,1.5
2,two,2.5
3,"three, quoted",3.5
\.
INSERT INTO copied SELECT g, 'bulk' || g, g / 4.0 FROM generate_series(4, 5000) g;
COPY copied (a) FROM PROGRAM 'seq 5001 8000';
COPY (SELECT * FROM copied WHERE a <= 3 ORDER BY a) TO stdout;
SELECT count(*), sum(a), round(sum(c)::numeric, 2) FROM copied;

-- CREATE TABLE AS, SELECT INTO, and a materialized view
CREATE TABLE ctas AS SELECT a, b FROM copied WHERE a % 100 = 0;
SELECT count(*), sum(a) FROM ctas;
SELECT a INTO selinto FROM copied WHERE a < 10;
SELECT count(*) FROM selinto;
CREATE MATERIALIZED VIEW mv AS SELECT a % 10 AS k, count(*) AS n FROM ctas GROUP BY 1;
SELECT amname FROM pg_class c JOIN pg_am a ON a.oid = c.relam WHERE relname = 'mv';
REFRESH MATERIALIZED VIEW mv;
SELECT * FROM mv ORDER BY k LIMIT 3;
DROP MATERIALIZED VIEW mv;

-- TRUNCATE (new file node), in a transaction that rolls back, then for real
BEGIN;
TRUNCATE ctas;
SELECT count(*) FROM ctas;
ROLLBACK;
SELECT count(*) FROM ctas;
TRUNCATE ctas;
SELECT count(*) FROM ctas;
INSERT INTO ctas VALUES (1, 'after truncate');
SELECT * FROM ctas;

-- TRUNCATE of a table created in the same transaction (empties it in place)
BEGIN;
CREATE TABLE fresh (x int);
INSERT INTO fresh SELECT generate_series(1, 100);
TRUNCATE fresh;
INSERT INTO fresh VALUES (42);
SELECT * FROM fresh;
COMMIT;
SELECT * FROM fresh;

-- ALTER TABLE that rewrites the table, VACUUM FULL and CLUSTER
ALTER TABLE copied ALTER COLUMN a TYPE bigint;
SELECT pg_typeof(a), count(*) FROM copied GROUP BY 1;
ALTER TABLE copied ADD COLUMN d int DEFAULT 7;
ALTER TABLE copied ADD COLUMN e timestamptz DEFAULT now();
SELECT count(*), sum(d) FROM copied;
DELETE FROM copied WHERE a > 100;
VACUUM FULL copied;
SELECT count(*), sum(a) FROM copied;
CREATE INDEX copied_b ON copied (b);
CLUSTER copied USING copied_b;
SELECT a, b FROM copied ORDER BY b LIMIT 3;
SELECT count(*) FROM copied WHERE b = 'bulk50';

-- Partitioned tables whose partitions use slipstream
CREATE TABLE events (id int, kind text, at date) PARTITION BY RANGE (at);
CREATE TABLE events_2025 PARTITION OF events FOR VALUES FROM ('2025-01-01') TO ('2026-01-01');
CREATE TABLE events_2026 PARTITION OF events FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
INSERT INTO events SELECT g, 'k' || (g % 3), date '2025-06-01' + g FROM generate_series(1, 400) g;
SELECT tableoid::regclass, count(*) FROM events GROUP BY 1 ORDER BY 1;
UPDATE events SET at = at + 300 WHERE id <= 10;  -- moves rows across partitions
SELECT tableoid::regclass, count(*) FROM events GROUP BY 1 ORDER BY 1;
SELECT c.relname, a.amname FROM pg_class c JOIN pg_am a ON a.oid = c.relam
  WHERE c.relname LIKE 'events_%' ORDER BY 1;

-- Temporary and unlogged tables work too (no WAL; unlogged ones are emptied after a crash)
CREATE TEMP TABLE tmp (x int PRIMARY KEY, y text) USING slipstream;
INSERT INTO tmp SELECT g, 't' || g FROM generate_series(1, 100) g;
UPDATE tmp SET y = 'u' WHERE x <= 10;
SELECT count(*), count(*) FILTER (WHERE y = 'u') FROM tmp;
TRUNCATE tmp;
INSERT INTO tmp VALUES (1, 'after truncate');
SELECT * FROM tmp;
CREATE UNLOGGED TABLE unl (x int) USING slipstream;
INSERT INTO unl SELECT generate_series(1, 20);
SELECT count(*) FROM unl;
CREATE TABLE heapy (x int) USING heap;
SELECT amname FROM pg_class c JOIN pg_am a ON a.oid = c.relam WHERE relname = 'heapy';

-- DROP TABLE
DROP TABLE items, price, ctas, selinto, fresh, events, heapy, tmp, unl CASCADE;
SELECT count(*) FROM pg_class WHERE relname IN ('items', 'ctas');
DROP TABLE copied;

-- RETURNING system columns report the version just stored (as heap's do); seq scans are counted
CREATE TABLE ret_sys (a int PRIMARY KEY, b text) USING slipstream;
BEGIN;
INSERT INTO ret_sys VALUES (1, 'x')
  RETURNING xmin = pg_current_xact_id()::xid AS xmin_ok, xmax = '0'::xid AS xmax_zero, cmin, ctid;
UPDATE ret_sys SET b = 'y' WHERE a = 1
  RETURNING xmin = pg_current_xact_id()::xid AS xmin_ok, xmax = '0'::xid AS xmax_zero, cmin, ctid;
INSERT INTO ret_sys VALUES (2, 'z'), (3, 'w')
  RETURNING xmin = pg_current_xact_id()::xid AS xmin_ok, cmin, ctid;
COMMIT;
SELECT count(*) FROM ret_sys;
SELECT pg_stat_force_next_flush();
SELECT seq_scan > 0 AS seq_scan_counted FROM pg_stat_user_tables WHERE relname = 'ret_sys';
DROP TABLE ret_sys;

-- Wide rows (1,000 bytes and more, below TOAST's threshold) are large values in the engine: a
-- header change (a lock, an update's old version, a delete, even one rolled back) is written
-- as a patch naming the stored row, which reads back whole with its new header.
CREATE TABLE wide (id int PRIMARY KEY, n int, pad text) USING slipstream;
INSERT INTO wide SELECT g, 0, repeat(chr(64 + g), 1500) FROM generate_series(1, 4) g;
SELECT value AS patches_before FROM slipstream.engine_stats() WHERE name = 'large_patches' \gset
BEGIN;
SELECT id FROM wide WHERE id IN (1, 2) ORDER BY id FOR UPDATE;
UPDATE wide SET n = n + 1 WHERE id = 1;
DELETE FROM wide WHERE id = 3;
COMMIT;
BEGIN;
UPDATE wide SET n = 100 WHERE id = 4;
ROLLBACK;
SELECT id, n, length(pad), pad = repeat(chr(64 + id), 1500) AS pad_intact FROM wide ORDER BY id;
SELECT value - :patches_before AS patches FROM slipstream.engine_stats() WHERE name = 'large_patches';
SELECT count(*) AS verify_failures FROM slipstream.verify('wide') WHERE NOT ok;
DROP TABLE wide;
