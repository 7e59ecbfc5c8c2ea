-- Backward scans of slipstream tables: SCROLL cursors over sequential, TID range and index
-- scans move both ways and return what the same cursors over heap return.
CREATE EXTENSION IF NOT EXISTS slipstream;
CREATE TABLE bw_ss (id int PRIMARY KEY, v text) USING slipstream;
CREATE TABLE bw_heap (id int PRIMARY KEY, v text) USING heap;
INSERT INTO bw_ss SELECT g, 'v' || g FROM generate_series(1, 1500) g;
INSERT INTO bw_heap SELECT * FROM bw_ss;
-- dead rows here and there, and whole empty blocks (row ids 300-899)
DELETE FROM bw_ss WHERE id % 7 = 0 OR id BETWEEN 301 AND 900;
DELETE FROM bw_heap WHERE id % 7 = 0 OR id BETWEEN 301 AND 900;
VACUUM bw_ss;

-- Runs FETCH `cmd` on cursor `cur` and returns the ids it fetched, in order.
CREATE FUNCTION bw_fetch(cur text, cmd text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE r record; ids text := '';
BEGIN
  FOR r IN EXECUTE format('FETCH %s FROM %I', cmd, cur) LOOP
    ids := ids || r.id || ' ';
  END LOOP;
  RETURN rtrim(ids);
END $$;

-- Runs each command on a heap cursor and on a slipstream cursor; both must fetch the same.
CREATE FUNCTION bw_compare(heap_cur text, ss_cur text, cmds text[])
RETURNS TABLE(step bigint, cmd text, fetched text, same boolean) LANGUAGE plpgsql AS $$
DECLARE c text; n bigint := 0; h text; s text;
BEGIN
  FOREACH c IN ARRAY cmds LOOP
    n := n + 1;
    h := bw_fetch(heap_cur, c);
    s := bw_fetch(ss_cur, c);
    step := n; cmd := c; same := h IS NOT DISTINCT FROM s;
    fetched := CASE WHEN length(s) > 60 THEN left(s, 28) || ' ... ' || right(s, 27) ELSE s END;
    RETURN NEXT;
  END LOOP;
END $$;

-- a sequential scan, both ways, across dead rows and empty blocks
BEGIN;
DECLARE ch SCROLL CURSOR FOR SELECT id FROM bw_heap;
DECLARE cs SCROLL CURSOR FOR SELECT id FROM bw_ss;
EXPLAIN (COSTS OFF) SELECT id FROM bw_ss;
SELECT * FROM bw_compare('ch', 'cs', ARRAY[
  'FORWARD 5', 'BACKWARD 2', 'PRIOR', 'PRIOR', 'PRIOR', 'NEXT', 'LAST', 'PRIOR',
  'BACKWARD 10', 'ABSOLUTE 290', 'NEXT', 'NEXT', 'RELATIVE -3', 'FORWARD ALL', 'PRIOR',
  'BACKWARD ALL', 'NEXT', 'FIRST', 'ABSOLUTE -1', 'FORWARD 3', 'BACKWARD 600']);
COMMIT;

-- rows deleted and inserted after the cursor's snapshot stay as they were
BEGIN ISOLATION LEVEL REPEATABLE READ;
DECLARE ch SCROLL CURSOR FOR SELECT id FROM bw_heap;
DECLARE cs SCROLL CURSOR FOR SELECT id FROM bw_ss;
SELECT * FROM bw_compare('ch', 'cs', ARRAY['FORWARD 2']);
SAVEPOINT s;
DELETE FROM bw_ss WHERE id = 1499;
DELETE FROM bw_heap WHERE id = 1499;
INSERT INTO bw_ss VALUES (5000, 'new');
INSERT INTO bw_heap VALUES (5000, 'new');
SELECT * FROM bw_compare('ch', 'cs', ARRAY['LAST', 'BACKWARD 3', 'FIRST']);
ROLLBACK TO s;
COMMIT;

-- a TID range scan, backward: block 0 holds row ids 0-255 (ctids (0,1) to (0,256)), so the
-- ids are the row ids plus one (heap packs its pages otherwise, so no comparison here)
BEGIN;
DECLARE cs SCROLL CURSOR FOR SELECT id FROM bw_ss WHERE ctid < '(1,0)';
EXPLAIN (COSTS OFF) SELECT id FROM bw_ss WHERE ctid < '(1,0)';
SELECT bw_fetch('cs', 'LAST') AS last, bw_fetch('cs', 'PRIOR') AS prior,
       bw_fetch('cs', 'BACKWARD 3') AS backward_3, bw_fetch('cs', 'FORWARD 2') AS forward_2,
       bw_fetch('cs', 'FORWARD ALL') AS rest;
SELECT bw_fetch('cs', 'ABSOLUTE 3') AS third, bw_fetch('cs', 'BACKWARD ALL') AS before_it;
COMMIT;

-- index scans backward, fetching from the table
SET enable_seqscan = off;
SET enable_bitmapscan = off;
EXPLAIN (COSTS OFF) SELECT id, v FROM bw_ss WHERE id < 40 ORDER BY id DESC;
SELECT string_agg(id || ':' || v, ' ') FROM (SELECT id, v FROM bw_ss WHERE id < 40 ORDER BY id DESC) s;
BEGIN;
DECLARE ch SCROLL CURSOR FOR SELECT id, v FROM bw_heap WHERE id > 1200 ORDER BY id;
DECLARE cs SCROLL CURSOR FOR SELECT id, v FROM bw_ss WHERE id > 1200 ORDER BY id;
EXPLAIN (COSTS OFF) SELECT id, v FROM bw_ss WHERE id > 1200 ORDER BY id;
SELECT * FROM bw_compare('ch', 'cs', ARRAY['FORWARD 4', 'BACKWARD 2', 'LAST', 'BACKWARD 5']);
COMMIT;
RESET enable_seqscan;
RESET enable_bitmapscan;

DROP FUNCTION bw_compare(text, text, text[]);
DROP FUNCTION bw_fetch(text, text);
DROP TABLE bw_ss, bw_heap;
