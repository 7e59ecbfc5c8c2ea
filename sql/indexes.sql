-- Every index AM over slipstream rows: btree, hash, GiST, GIN, BRIN, unique and partial
-- indexes, CREATE INDEX CONCURRENTLY, REINDEX, and index scans after updates.
CREATE EXTENSION IF NOT EXISTS slipstream;
SET default_table_access_method = slipstream;
CREATE EXTENSION IF NOT EXISTS btree_gist;

CREATE TABLE docs (id int, title text, tags text[], body tsvector, pos point, n int);
INSERT INTO docs
  SELECT g, 'title ' || g, ARRAY['t' || (g % 5), 't' || (g % 7)],
         to_tsvector('english', 'word' || (g % 13) || ' common text'),
         point(g % 100, g / 100), g % 50
  FROM generate_series(1, 3000) g;

CREATE UNIQUE INDEX docs_id ON docs (id);
CREATE INDEX docs_title_hash ON docs USING hash (title);
CREATE INDEX docs_tags_gin ON docs USING gin (tags);
CREATE INDEX docs_body_gin ON docs USING gin (body);
CREATE INDEX docs_pos_gist ON docs USING gist (pos);
CREATE INDEX docs_n_brin ON docs USING brin (id) WITH (pages_per_range = 1);
CREATE INDEX docs_n_partial ON docs (n) WHERE n < 5;
ANALYZE docs;

SET enable_seqscan = off;
SET enable_bitmapscan = off;
-- A GIN index produces only bitmaps: with sequential scans off, a bitmap heap scan uses it.
EXPLAIN (COSTS OFF) SELECT * FROM docs WHERE tags @> ARRAY['t3'];
SELECT count(*) FROM docs WHERE id BETWEEN 100 AND 199;
SELECT id FROM docs WHERE title = 'title 77';
SELECT count(*) FROM docs WHERE tags @> ARRAY['t3'];
SELECT count(*) FROM docs WHERE body @@ to_tsquery('english', 'word7');
SELECT count(*) FROM docs WHERE pos <@ box(point(0, 0), point(10, 10));
SELECT count(*) FROM docs WHERE n < 3;
RESET enable_bitmapscan;

-- Unique violations, also through an UPDATE
INSERT INTO docs (id, title) VALUES (5, 'dup');
UPDATE docs SET id = 6 WHERE id = 7;
SELECT id, title FROM docs WHERE id IN (5, 6, 7) ORDER BY id;

-- Index scans after updates see only the new versions
UPDATE docs SET title = 'renamed ' || id, n = n + 1000 WHERE id <= 50;
SELECT count(*) FROM docs WHERE title LIKE 'renamed%';
SELECT id FROM docs WHERE title = 'title 20';
SELECT id, title FROM docs WHERE title = 'renamed 20';
SELECT count(*) FROM docs WHERE n >= 1000;
SELECT count(*) FROM docs WHERE n < 5;

-- Index-only scans stay correct (every row is checked in the table)
EXPLAIN (COSTS OFF) SELECT id FROM docs WHERE id < 10;
SELECT id FROM docs WHERE id < 10 ORDER BY id;
DELETE FROM docs WHERE id < 5;
SELECT id FROM docs WHERE id < 10 ORDER BY id;

-- CREATE INDEX CONCURRENTLY and REINDEX (CONCURRENTLY)
CREATE INDEX CONCURRENTLY docs_n_cic ON docs (n);
SELECT indisvalid FROM pg_index WHERE indexrelid = 'docs_n_cic'::regclass;
SELECT count(*) FROM docs WHERE n = 10;
REINDEX INDEX docs_id;
REINDEX TABLE docs;
REINDEX INDEX CONCURRENTLY docs_title_hash;
SELECT id FROM docs WHERE title = 'title 2000';
CREATE UNIQUE INDEX CONCURRENTLY docs_title_u ON docs (title);
INSERT INTO docs (id, title) VALUES (99999, 'title 2000');
RESET enable_seqscan;

-- Exclusion constraints (GiST) and a multi-column btree with INCLUDE
CREATE TABLE booking (room int, during int4range, EXCLUDE USING gist (room WITH =, during WITH &&));
INSERT INTO booking VALUES (1, '[1,5)'), (1, '[5,9)'), (2, '[1,9)');
INSERT INTO booking VALUES (1, '[4,6)');
CREATE INDEX docs_multi ON docs (n, id) INCLUDE (title);
SET enable_seqscan = off;
SELECT id, title FROM docs WHERE n = 11 AND id < 200 ORDER BY id;
RESET enable_seqscan;

SELECT check_name, ok FROM slipstream.verify('docs');
DROP TABLE docs, booking;
