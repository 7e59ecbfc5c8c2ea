-- The SQL shuffle (docs/shuffle.md): peer groups, slipstream.shuffle, shuffle_on_group and the
-- progress view on one node. Every bad argument is refused with a clear error and changes
-- nothing; configuring groups and running statements on them needs superuser or
-- slipstream_admin; the secret is never shown; and a one-node group (this node alone) returns
-- every row of a query unchanged, which runs the row codec, both of its encodings, without a
-- peer. tests/pg_shuffle_test.sh shuffles between three nodes.
SET client_min_messages = warning;  -- quiet whether or not an earlier test created it
CREATE EXTENSION IF NOT EXISTS slipstream;
RESET client_min_messages;
-- this node's conninfo (its socket directory and port vary with the cluster: not shown)
SELECT format('host=%s port=%s dbname=%s user=%s', current_setting('unix_socket_directories'),
              current_setting('port'), current_database(), current_user) AS self \gset

-- create_peer_group: bad names, node lists, self, secrets, transports and buffers
SELECT slipstream.create_peer_group('bad name', ARRAY[:'self'], 0, 's');
SELECT slipstream.create_peer_group('', ARRAY[:'self'], 0, 's');
SELECT slipstream.create_peer_group(repeat('g', 64), ARRAY[:'self'], 0, 's');
SELECT slipstream.create_peer_group(NULL, ARRAY[:'self'], 0, 's');
SELECT slipstream.create_peer_group('g1', ARRAY[]::text[], 0, 's');
SELECT slipstream.create_peer_group('g1', NULL, 0, 's');
SELECT slipstream.create_peer_group('g1', ARRAY[:'self', NULL], 0, 's');
SELECT slipstream.create_peer_group('g1', ARRAY[[:'self'], [:'self']], 0, 's');
SELECT slipstream.create_peer_group('g1', ARRAY['nonsense'], 0, 's');
SELECT slipstream.create_peer_group('g1', ARRAY['host=x bogus_option=1'], 0, 's');
SELECT slipstream.create_peer_group('g1', array_fill('host=x'::text, ARRAY[65]), 0, 's');
SELECT slipstream.create_peer_group('g1', ARRAY[:'self'], -1, 's');
SELECT slipstream.create_peer_group('g1', ARRAY[:'self'], 1, 's');
SELECT slipstream.create_peer_group('g1', ARRAY[:'self'], NULL, 's');
SELECT slipstream.create_peer_group('g1', ARRAY[:'self'], 0, '');
SELECT slipstream.create_peer_group('g1', ARRAY[:'self'], 0, NULL);
SELECT slipstream.create_peer_group('g1', ARRAY[:'self'], 0, repeat('s', 256));
SELECT slipstream.create_peer_group('g1', ARRAY[:'self'], 0, 's', 'carrier-pigeon');
SELECT slipstream.create_peer_group('g1', ARRAY[:'self'], 0, 's', NULL);
SELECT slipstream.create_peer_group('g1', ARRAY[:'self'], 0, 's', 'tcp', 0);
SELECT slipstream.create_peer_group('g1', ARRAY[:'self'], 0, 's', 'tcp', -3);
SELECT slipstream.create_peer_group('g1', ARRAY[:'self'], 0, 's', 'tcp', 1000000);
SELECT slipstream.create_peer_group('g1', ARRAY[:'self'], 0, 's', 'tcp', 4, 'lots');
SELECT slipstream.create_peer_group('g1', ARRAY[:'self'], 0, 's', 'tcp', 4, '1000');
SELECT slipstream.create_peer_group('g1', ARRAY[:'self'], 0, 's', 'tcp', 4, '-1MB');
SELECT slipstream.create_peer_group('g1', ARRAY[:'self'], 0, 's', 'tcp', 4, '1TB');
SELECT slipstream.create_peer_group('g1', ARRAY[:'self'], 0, 's', 'tcp', 4, NULL);
SELECT count(*) AS groups_after_errors FROM slipstream.peer_groups;

-- groups that work: this node alone (the default transport and buffers, and tcp), and one of
-- three nodes; a duplicate name is refused
SELECT slipstream.create_peer_group('one', ARRAY[:'self'], 0, 'sekrit-one');
SELECT slipstream.create_peer_group('one', ARRAY[:'self'], 0, 'sekrit-one');
SELECT slipstream.create_peer_group('one_tcp', ARRAY[:'self'], 0, 'sekrit-two', 'tcp', 7, '256kB');
SELECT slipstream.create_peer_group(name => 'three', self => 2, secret => 'sekrit-three',
  nodes => ARRAY['host=10.0.0.1 port=5432 dbname=shop', 'host=10.0.0.2 port=5432 dbname=shop', :'self'],
  transport => 'shm', receive_buffers => 1, buffer_size => '256MB');
SELECT name, cardinality(nodes) AS nodes, self, transport, receive_buffers, buffer_size
  FROM slipstream.peer_groups ORDER BY name;
SELECT nodes[1:2] FROM slipstream.peer_groups WHERE name = 'three';
-- the secret is in no column and no value of the view
SELECT count(*) AS columns_named_secret FROM information_schema.columns
  WHERE table_schema = 'slipstream' AND table_name = 'peer_groups' AND column_name LIKE '%secret%';
SELECT count(*) AS rows_showing_a_secret FROM slipstream.peer_groups g WHERE g::text LIKE '%sekrit%';

-- drop_peer_group
SELECT slipstream.drop_peer_group('nope');
SELECT slipstream.drop_peer_group(NULL);
SELECT slipstream.drop_peer_group('three');
SELECT slipstream.drop_peer_group('three');
SELECT name FROM slipstream.peer_groups ORDER BY name;

-- shuffle: the simplest one, then bad groups, keys, queries and column lists
SELECT * FROM slipstream.shuffle('SELECT g, g * 10 AS x FROM generate_series(1, 5) g', 'g', 'one', 1)
  AS t(g int, x int) ORDER BY g;
SELECT * FROM slipstream.shuffle('SELECT 1 AS a', 'a', 'nope', 1) AS t(a int);
SELECT * FROM slipstream.shuffle('SELECT 1 AS a', 'b', 'one', 1) AS t(a int);
SELECT * FROM slipstream.shuffle('SELECT 1 AS a', 'A', 'one', 1) AS t(a int);
SELECT * FROM slipstream.shuffle('SELECT 1 AS a', 'a', 'one', 1) AS t(b int);
SELECT * FROM slipstream.shuffle('CREATE TABLE shuffle_nope (a int)', 'a', 'one', 1) AS t(a int);
SELECT to_regclass('shuffle_nope') AS not_created;
CREATE TABLE shuffle_victim (a int);
INSERT INTO shuffle_victim VALUES (1), (2);
SELECT * FROM slipstream.shuffle('DELETE FROM shuffle_victim', 'a', 'one', 1) AS t(a int);
SELECT count(*) AS victim_rows FROM shuffle_victim;
SELECT * FROM slipstream.shuffle('DELETE FROM shuffle_victim WHERE a = 1 RETURNING a', 'a', 'one', 1)
  AS t(a int);
SELECT count(*) AS victim_rows FROM shuffle_victim;
SELECT * FROM slipstream.shuffle('SELEC 1', 'a', 'one', 1) AS t(a int);
SELECT * FROM slipstream.shuffle('SELECT a FROM no_such_table', 'a', 'one', 1) AS t(a int);
SELECT * FROM slipstream.shuffle('SELECT 1 / (g - 3) AS a FROM generate_series(1, 5) g', 'a', 'one', 1)
  AS t(a int);
SELECT * FROM slipstream.shuffle('SELECT 1 AS a; SELECT 2 AS a', 'a', 'one', 1) AS t(a int);
SELECT * FROM slipstream.shuffle('SELECT 1 AS a, 2 AS b', 'a', 'one', 1) AS t(a int);
SELECT * FROM slipstream.shuffle('SELECT 1 AS a', 'a', 'one', 1) AS t(a int, b int);
SELECT * FROM slipstream.shuffle('SELECT 1 AS a', 'a', 'one', 1) AS t(a bigint);
SELECT * FROM slipstream.shuffle('SELECT ''x''::text AS a', 'a', 'one', 1) AS t(a varchar);
SELECT * FROM slipstream.shuffle('SELECT 1 AS a', 'a', 'one', 1);
SELECT slipstream.shuffle('SELECT 1 AS a', 'a', 'one', 1);
SELECT * FROM slipstream.shuffle(NULL, 'a', 'one', 1) AS t(a int);
SELECT * FROM slipstream.shuffle('SELECT 1 AS a', NULL, 'one', 1) AS t(a int);
SELECT * FROM slipstream.shuffle('SELECT 1 AS a', 'a', NULL, 1) AS t(a int);
SELECT * FROM slipstream.shuffle('SELECT point(1, 2) AS p', 'p', 'one', 1) AS t(p point);
SELECT * FROM slipstream.shuffle('SELECT ROW(1, 2) AS r', 'r', 'one', 1) AS t(r record);
-- the id: given, or slipstream.shuffle_id; shuffles with one id in one statement (nested, or
-- the two sides of a join) are told apart by their order, so each meets its own peers
SELECT * FROM slipstream.shuffle('SELECT 1 AS a', 'a', 'one') AS t(a int);
SET slipstream.shuffle_id = 'abc';
SELECT * FROM slipstream.shuffle('SELECT 1 AS a', 'a', 'one') AS t(a int);
SET slipstream.shuffle_id = 77;
SELECT * FROM slipstream.shuffle('SELECT 1 AS a', 'a', 'one') AS t(a int);
RESET slipstream.shuffle_id;
SELECT * FROM slipstream.shuffle('SELECT 2 AS a', 'a', 'one', -5) AS t(a int);
SELECT * FROM slipstream.shuffle(
  $$SELECT * FROM slipstream.shuffle('SELECT 1 AS a', 'a', 'one', 5) AS i(a int)$$, 'a', 'one', 5)
  AS t(a int);
SELECT * FROM slipstream.shuffle(
  $$SELECT * FROM slipstream.shuffle('SELECT 1 AS a', 'a', 'one', 6) AS i(a int)$$, 'a', 'one', 5)
  AS t(a int);
-- the progress view: a shuffle sees itself in it; nothing is left after errors
SELECT * FROM slipstream.shuffle(
  'SELECT shuffle_id, peer_group, state, self, peer, port > 0 AS listening FROM slipstream.shuffle_progress',
  'peer', 'one', 123) AS t(shuffle_id bigint, peer_group text, state text, self int, peer int, listening bool);
SELECT count(*) AS shuffles_running FROM slipstream.shuffle_progress;
-- a row larger than a batch (the group's buffer_size, 1MB) is refused
SELECT count(*) FROM slipstream.shuffle('SELECT 1 AS id, repeat(''x'', 3000000) AS v', 'id', 'one', 1)
  AS t(id int, v text);
SELECT length(v) FROM slipstream.shuffle('SELECT 1 AS id, repeat(''x'', 900000) AS v', 'id', 'one', 1)
  AS t(id int, v text);
-- shuffle_port: what peers ask through libpq
SELECT slipstream.shuffle_port(424242, 0);
SELECT slipstream.shuffle_port(424242, -1);
-- how long peers may take to join is a setting (1 s to 1 hour)
SET slipstream.shuffle_join_timeout = '500ms';
SET slipstream.shuffle_join_timeout = '5s';
SHOW slipstream.shuffle_join_timeout;
RESET slipstream.shuffle_join_timeout;

-- a one-node group returns every row unchanged: every type class, NULL in every column,
-- user-defined types (an enum, a composite, a domain, their arrays), TOASTed values
CREATE TYPE shuffle_mood AS ENUM ('sad', 'ok', 'happy');
CREATE TYPE shuffle_pair AS (a int, b text, m shuffle_mood, f float8);
CREATE DOMAIN shuffle_posint AS int CHECK (VALUE > 0);
CREATE TABLE shuffle_types (
  id int, i2 int2, i4 int4, i8 int8, n numeric, f4 float4, f8 float8, t text, vc varchar(10),
  bp char(5), nm name, ch "char", b bytea, bo bool, d date, tm time, ttz timetz, ts timestamp,
  tstz timestamptz, iv interval, u uuid, j jsonb, js json, ip inet, cidr cidr, mac macaddr,
  bits bit(5), vbits varbit, tsv tsvector, r int4range, mr int4multirange, pt point, bx box,
  lsn pg_lsn, o oid, ia int[], ta text[], na numeric[], ja jsonb[],
  c shuffle_pair, e shuffle_mood, ea shuffle_mood[], ca shuffle_pair[], dm shuffle_posint,
  big text, bigb bytea);
INSERT INTO shuffle_types (id) VALUES (0);                  -- NULL in every other column
INSERT INTO shuffle_types
SELECT g, (-32768 + g)::int2, -2147483648 + g, 9223372036854775807 - g,
  (ARRAY['NaN', 'Infinity', '-Infinity', '0', '-1.5e-100', '123456789012345678901234567890.123456789'])[g % 6 + 1]::numeric,
  (ARRAY['NaN', 'Infinity', '-0', '1.17549435e-38', '3.4028235e38', '0.1'])[g % 6 + 1]::float4,
  (ARRAY['NaN', '-Infinity', '-0', '2.2250738585072014e-308', '1.7976931348623157e308', '0.1'])[g % 6 + 1]::float8,
  (ARRAY['', 'plain', 'ünïcødé ☃', E'tab\tnewline\nquote''"back\\slash', 'NULL', repeat('long ', 100)])[g % 6 + 1],
  'vc' || g, 'bp' || g, ('name' || g)::name, chr(64 + g)::"char",
  CASE WHEN g % 2 = 0 THEN '\x00ff00ff'::bytea ELSE ''::bytea END, g % 2 = 0,
  (ARRAY['2000-02-29', 'infinity', '-infinity', '4713-01-01 BC', '5874897-12-31', '1970-01-01'])[g % 6 + 1]::date,
  '23:59:59.999999'::time, '12:34:56.789+05:30'::timetz,
  (ARRAY['2000-02-29 12:34:56.789012', 'infinity', '-infinity', '4713-01-01 00:00:00 BC', '294276-12-31 23:59:59', '1970-01-01'])[g % 6 + 1]::timestamp,
  (ARRAY['2000-02-29 12:34:56.789012+00', 'infinity', '-infinity', '1900-01-01 00:00:00+02', '2038-01-19 03:14:08+00', '1970-01-01+00'])[g % 6 + 1]::timestamptz,
  make_interval(years => g, months => -g, days => g * 3, secs => g * 1.5), md5(g::text)::uuid,
  jsonb_build_object('g', g, 'nested', jsonb_build_array(1.5, 'x', NULL, true, jsonb_build_object('é', '"'))),
  ('{"b": 1, "a": [1, 2], "a": "dup key kept by json"}')::json,
  (ARRAY['10.0.0.1', '::1', '192.168.0.0/16', '2001:db8::ff/64', '0.0.0.0', '255.255.255.255'])[g % 6 + 1]::inet,
  '10.1.0.0/16'::cidr, '08:00:2b:01:02:03'::macaddr, B'10101', B'1100110011',
  to_tsvector('simple', 'the quick brown fox ' || g), int4range(g, g * 10), int4multirange(int4range(1, 3), int4range(g + 5, g + 9)),
  point(g, -g), box(point(0, 0), point(g, g)), ('16/' || to_hex(g * 4096))::pg_lsn, g::oid,
  ARRAY[g, NULL, -g], ARRAY['a', NULL, 'with "quote"', 'comma,brace}', '', 'NULL'],
  ARRAY[1.5, NULL, 'NaN']::numeric[], ARRAY['{"x": 1}'::jsonb, NULL],
  ROW(g, 'p,(' || g || ')"', (ARRAY['sad', 'ok', 'happy'])[g % 3 + 1], 1.0 / 3)::shuffle_pair,
  (ARRAY['sad', 'ok', 'happy'])[g % 3 + 1]::shuffle_mood,
  ARRAY[(ARRAY['sad', 'ok', 'happy'])[g % 3 + 1]::shuffle_mood, NULL],
  ARRAY[ROW(1, NULL, 'ok', NULL)::shuffle_pair, NULL, ROW(NULL, NULL, NULL, NULL)::shuffle_pair],
  g::shuffle_posint,
  CASE g % 3 WHEN 0 THEN (SELECT string_agg(md5(x::text), '') FROM generate_series(1, 3200) x)  -- 100 kB, stored out of line
             WHEN 1 THEN repeat('compressible ', 8000)                                          -- 100 kB, compressed in line
             ELSE 'short' END,
  CASE WHEN g % 3 = 0 THEN decode((SELECT string_agg(md5(x::text || 'b'), '') FROM generate_series(1, 1600) x), 'hex') END
FROM generate_series(1, 12) g;
-- row 1 again once per column, with that column NULL: NULL in each column amid values
DO $$
DECLARE
  col record;
  list text;
BEGIN
  FOR col IN SELECT attnum FROM pg_attribute
             WHERE attrelid = 'shuffle_types'::regclass AND attnum > 1 AND NOT attisdropped LOOP
    SELECT string_agg(CASE WHEN a.attnum = 1 THEN (100 + col.attnum)::text
                           WHEN a.attnum = col.attnum THEN 'NULL' ELSE quote_ident(a.attname) END,
                      ', ' ORDER BY a.attnum)
      INTO list FROM pg_attribute a
      WHERE a.attrelid = 'shuffle_types'::regclass AND a.attnum > 0 AND NOT a.attisdropped;
    EXECUTE format('INSERT INTO shuffle_types SELECT %s FROM shuffle_types WHERE id = 1', list);
  END LOOP;
END
$$;
SELECT count(*) AS rows,
       count(*) FILTER (WHERE id <= 12 AND length(big) >= 100000 AND pg_column_size(big) < 10000) AS big_compressed,
       count(*) FILTER (WHERE id <= 12 AND length(big) >= 100000 AND pg_column_size(big) >= 100000) AS big_uncompressed
  FROM shuffle_types;
-- every column: the rows that come back are the table's (md5 of the text form of each row)
SELECT count(*) AS rows_back,
       (SELECT string_agg(md5(s::text), ',' ORDER BY md5(s::text)) FROM shuffle_types s)
     = string_agg(md5(rw::text), ',' ORDER BY md5(rw::text)) AS identical
  FROM slipstream.shuffle('SELECT * FROM shuffle_types', 'id', 'one', 10) AS rw(
  id int, i2 int2, i4 int4, i8 int8, n numeric, f4 float4, f8 float8, t text, vc varchar(10),
  bp char(5), nm name, ch "char", b bytea, bo bool, d date, tm time, ttz timetz, ts timestamp,
  tstz timestamptz, iv interval, u uuid, j jsonb, js json, ip inet, cidr cidr, mac macaddr,
  bits bit(5), vbits varbit, tsv tsvector, r int4range, mr int4multirange, pt point, bx box,
  lsn pg_lsn, o oid, ia int[], ta text[], na numeric[], ja jsonb[],
  c shuffle_pair, e shuffle_mood, ea shuffle_mood[], ca shuffle_pair[], dm shuffle_posint,
  big text, bigb bytea);
-- built-in types only (rows travel as heap tuples): the same, and over tcp
CREATE VIEW shuffle_builtin AS
  SELECT id, i2, i4, i8, n, f4, f8, t, vc, bp, nm, ch, b, bo, d, tm, ttz, ts, tstz, iv, u, j, js, ip,
         cidr, mac, bits, vbits, tsv, r, mr, pt, bx, lsn, o, ia, ta, na, ja, big, bigb
  FROM shuffle_types;
SELECT g AS peer_group, count(*) AS rows_back,
       (SELECT string_agg(md5(s::text), ',' ORDER BY md5(s::text)) FROM shuffle_builtin s)
     = string_agg(md5(rw::text), ',' ORDER BY md5(rw::text)) AS identical
  FROM (VALUES ('one'), ('one_tcp')) v(g),
  slipstream.shuffle('SELECT * FROM shuffle_builtin', 'id', g, 11) AS rw(
  id int, i2 int2, i4 int4, i8 int8, n numeric, f4 float4, f8 float8, t text, vc varchar(10),
  bp char(5), nm name, ch "char", b bytea, bo bool, d date, tm time, ttz timetz, ts timestamp,
  tstz timestamptz, iv interval, u uuid, j jsonb, js json, ip inet, cidr cidr, mac macaddr,
  bits bit(5), vbits varbit, tsv tsvector, r int4range, mr int4multirange, pt point, bx box,
  lsn pg_lsn, o oid, ia int[], ta text[], na numeric[], ja jsonb[], big text, bigb bytea)
  GROUP BY g ORDER BY g;
-- some rows in full (no long values), as they come back
SELECT id, n, f4, f8, t, d, ts, tstz, iv, c, e, ea, ca, dm
  FROM slipstream.shuffle('SELECT id, n, f4, f8, t, d, ts, tstz, iv, c, e, ea, ca, dm FROM shuffle_types WHERE id BETWEEN 0 AND 6',
                          'e', 'one', 12)
  AS t(id int, n numeric, f4 float4, f8 float8, t text, d date, ts timestamp, tstz timestamptz,
       iv interval, c shuffle_pair, e shuffle_mood, ea shuffle_mood[], ca shuffle_pair[], dm shuffle_posint)
  ORDER BY id;
SELECT id, i2, i8, b, ip, r, mr, pt, lsn, ia, ta, na, ja, j
  FROM slipstream.shuffle('SELECT id, i2, i8, b, ip, r, mr, pt, lsn, ia, ta, na, ja, j FROM shuffle_types WHERE id BETWEEN 0 AND 4',
                          'id', 'one', 13)
  AS t(id int, i2 int2, i8 int8, b bytea, ip inet, r int4range, mr int4multirange, pt point,
       lsn pg_lsn, ia int[], ta text[], na numeric[], ja jsonb[], j jsonb)
  ORDER BY id;
-- keys of every hashable class (NULL keys go to node 0, the only one here)
SELECT k AS key_column, count(*) AS rows_back
  FROM unnest(ARRAY['n', 'f8', 't', 'b', 'tstz', 'iv', 'u', 'j', 'ip', 'r', 'ia', 'ta', 'c', 'e', 'ea', 'dm']) k,
  LATERAL slipstream.shuffle('SELECT id, n, f8, t, b, tstz, iv, u, j, ip, r, ia, ta, c, e, ea, dm FROM shuffle_types', k, 'one', 14)
    AS t(id int, n numeric, f8 float8, t text, b bytea, tstz timestamptz, iv interval, u uuid, j jsonb,
         ip inet, r int4range, ia int[], ta text[], c shuffle_pair, e shuffle_mood, ea shuffle_mood[],
         dm shuffle_posint)
  GROUP BY k ORDER BY k;
-- a source with a dropped column, a slipstream table, and a row of 1000 columns
CREATE TABLE shuffle_dropped (a int, gone text, b text) USING slipstream;
INSERT INTO shuffle_dropped SELECT g, 'gone', 'b' || g FROM generate_series(1, 3) g;
ALTER TABLE shuffle_dropped DROP COLUMN gone;
SELECT * FROM slipstream.shuffle('SELECT * FROM shuffle_dropped', 'b', 'one', 15) AS t(a int, b text) ORDER BY a;
DO $$
DECLARE
  columns text := (SELECT string_agg(format('c%s int', g), ', ' ORDER BY g) FROM generate_series(1, 1000) g);
  result text;
BEGIN
  EXECUTE format('CREATE TABLE shuffle_wide (%s)', columns);
  INSERT INTO shuffle_wide (c1, c500, c1000) VALUES (1, 500, 1000), (2, NULL, 2000);
  UPDATE shuffle_wide SET c999 = 999 WHERE c1 = 2;
  EXECUTE format('SELECT (string_agg(md5(rw::text), '','' ORDER BY rw.c1) = (SELECT string_agg(md5(s::text), '','' ORDER BY s.c1) FROM shuffle_wide s))
                         || '', '' || count(*) || '' rows, '' || count(*) FILTER (WHERE c500 IS NULL) || '' with c500 NULL''
                  FROM slipstream.shuffle(%L, %L, %L, 16) AS rw(%s)', 'SELECT * FROM shuffle_wide', 'c1', 'one', columns)
    INTO result;
  RAISE NOTICE 'rows of 1000 columns back identical: %', result;
END
$$;

-- shuffle_on_group: bad arguments, then statements on this node alone
SELECT * FROM slipstream.shuffle_on_group('nope', 'SELECT 1');
SELECT * FROM slipstream.shuffle_on_group(NULL, 'SELECT 1');
SELECT * FROM slipstream.shuffle_on_group('one', NULL);
SELECT * FROM slipstream.shuffle_on_group('one', 'SELECT 1', 0);
SELECT * FROM slipstream.shuffle_on_group('one', 'SELECT 1', 86401);
SELECT * FROM slipstream.shuffle_on_group('one', 'SELECT 1 / 0');
SELECT * FROM slipstream.shuffle_on_group('one', 'SELECT pg_sleep(10)', 1);
SELECT * FROM slipstream.shuffle_on_group('one', 'SELECT current_setting(''slipstream.shuffle_id'')::bigint > 0');
CREATE TABLE shuffle_dst (g int, x text);
SELECT * FROM slipstream.shuffle_on_group('one', $$
  INSERT INTO shuffle_dst SELECT * FROM slipstream.shuffle('SELECT g, md5(g::text) FROM generate_series(1, 5000) g', 'g', 'one')
    AS t(g int, x text)
$$);
SELECT count(*), sum(g), bool_and(x = md5(g::text)) AS intact FROM shuffle_dst;
SELECT * FROM slipstream.shuffle_on_group('one_tcp', $$
  SELECT * FROM slipstream.shuffle('SELECT g FROM generate_series(1, 7) g', 'g', 'one_tcp') AS t(g int)
$$);
SELECT count(*) AS shuffles_running FROM slipstream.shuffle_progress;

-- permissions: configuring and shuffle_on_group need superuser or slipstream_admin; anyone
-- may shuffle
CREATE ROLE shuffle_user LOGIN;
CREATE ROLE shuffle_admin LOGIN IN ROLE slipstream_admin;
SET ROLE shuffle_user;
SELECT slipstream.create_peer_group('by_user', ARRAY['host=x'], 0, 's');
SELECT slipstream.drop_peer_group('one');
SELECT * FROM slipstream.shuffle_on_group('one', 'SELECT 1');
SELECT * FROM slipstream.peer_groups;
SELECT * FROM slipstream.peer_group_config;
SELECT * FROM slipstream.shuffle('SELECT g FROM generate_series(1, 3) g', 'g', 'one', 20) AS t(g int) ORDER BY g;
SELECT count(*) AS shuffles_running FROM slipstream.shuffle_progress;
RESET ROLE;
-- EXECUTE granted by mistake is not enough: the functions check the role themselves
GRANT EXECUTE ON FUNCTION slipstream.create_peer_group(text, text[], integer, text, text, integer, text),
  slipstream.drop_peer_group(text), slipstream.shuffle_on_group(text, text, integer) TO shuffle_user;
SET ROLE shuffle_user;
SELECT slipstream.create_peer_group('by_user', ARRAY['host=x'], 0, 's');
SELECT slipstream.drop_peer_group('one');
SELECT * FROM slipstream.shuffle_on_group('one', 'SELECT 1');
RESET ROLE;
REVOKE EXECUTE ON FUNCTION slipstream.create_peer_group(text, text[], integer, text, text, integer, text),
  slipstream.drop_peer_group(text), slipstream.shuffle_on_group(text, text, integer) FROM shuffle_user;
SELECT name FROM slipstream.peer_groups ORDER BY name;
SET ROLE shuffle_admin;
SELECT slipstream.create_peer_group('by_admin', ARRAY[:'self'], 0, 's');
SELECT name FROM slipstream.peer_groups ORDER BY name;
SELECT * FROM slipstream.shuffle_on_group('by_admin',
  $$SELECT * FROM slipstream.shuffle('SELECT g FROM generate_series(1, 10) g', 'g', 'by_admin') AS t(g int)$$);
-- an admin's statements run as the admin on every node, whoever the group's conninfo names:
-- a group cannot lend it a superuser's rights
SELECT * FROM slipstream.shuffle_on_group('one', 'ALTER ROLE shuffle_admin SUPERUSER');
SELECT slipstream.drop_peer_group('by_admin');
RESET ROLE;
SELECT rolsuper AS admin_became_superuser FROM pg_roles WHERE rolname = 'shuffle_admin';

-- declared typmods convert the query's values, heap tuples or not
SELECT * FROM slipstream.shuffle($$SELECT 1 AS id, 3.14159::numeric AS n, 'abc'::varchar AS v$$,
  'id', 'one', 30) AS t(id int, n numeric(5,2), v varchar(3));
SELECT * FROM slipstream.shuffle($$SELECT 1 AS id, 'abcdef'::varchar AS v$$,
  'id', 'one', 31) AS t(id int, v varchar(3));

-- cleanup
SELECT slipstream.drop_peer_group('one');
SELECT slipstream.drop_peer_group('one_tcp');
SELECT count(*) AS groups FROM slipstream.peer_groups;
DROP VIEW shuffle_builtin;
DROP TABLE shuffle_victim, shuffle_types, shuffle_dropped, shuffle_wide, shuffle_dst;
DROP TYPE shuffle_pair, shuffle_mood;
DROP DOMAIN shuffle_posint;
DROP ROLE shuffle_user, shuffle_admin;
