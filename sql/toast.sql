-- Values of every size: in place, in the engine's medium and large classes, and TOASTed
-- (compressed, or moved out of line into the table's heap TOAST table), up to 100 MB.
CREATE EXTENSION IF NOT EXISTS slipstream;
SET default_table_access_method = slipstream;

CREATE TABLE blobs (id int PRIMARY KEY, v text);
SELECT c.relname IS NOT NULL AS has_toast, a.amname AS toast_am
  FROM pg_class t LEFT JOIN pg_class c ON c.oid = t.reltoastrelid
  LEFT JOIN pg_am a ON a.oid = c.relam WHERE t.relname = 'blobs';
INSERT INTO blobs
  SELECT g, (SELECT string_agg(md5((g * 1000 + i)::text), '') FROM generate_series(1, s) i)
  FROM (VALUES (1, 1), (2, 3), (3, 30), (4, 60), (5, 200), (6, 5000)) AS sizes(g, s);
SELECT id, length(v), md5(v) = (SELECT md5(string_agg(md5((id * 1000 + i)::text), ''))
  FROM generate_series(1, (ARRAY[1, 3, 30, 60, 200, 5000])[id]) i) AS intact
  FROM blobs ORDER BY id;

-- A 100 MB value (compressible) and a 5 MB one (incompressible), updated and deleted
INSERT INTO blobs VALUES (100, repeat('slipstream', 10 * 1024 * 1024));
SELECT length(v), md5(v) = md5(repeat('slipstream', 10 * 1024 * 1024)) FROM blobs WHERE id = 100;
INSERT INTO blobs SELECT 101, string_agg(md5(i::text), '') FROM generate_series(1, 160000) i;
SELECT length(v), md5(v) = (SELECT md5(string_agg(md5(i::text), '')) FROM generate_series(1, 160000) i)
  FROM blobs WHERE id = 101;
UPDATE blobs SET v = v || 'tail' WHERE id = 101;
SELECT right(v, 8) FROM blobs WHERE id = 101;
UPDATE blobs SET id = 102 WHERE id = 101;   -- the TOASTed value is carried over unchanged
SELECT id, length(v) FROM blobs WHERE id > 100 ORDER BY id;
DELETE FROM blobs WHERE id = 100;
SELECT count(*), sum(length(v)) FROM blobs;
VACUUM FULL blobs;
SELECT id, length(v) FROM blobs WHERE id > 5 ORDER BY id;

SELECT check_name, ok FROM slipstream.verify('blobs');
DROP TABLE blobs;
