-- The replication functions and views: every bad argument is refused with a clear error and
-- changes nothing; configuring needs superuser or slipstream_admin; secrets are never shown.
CREATE EXTENSION IF NOT EXISTS slipstream;

-- add_backup: bad names, addresses, transports and secrets
SELECT slipstream.add_backup('bad name', '127.0.0.1:7400', 'tcp', 's');
SELECT slipstream.add_backup('b1', 'nohostport', 'tcp', 's');
SELECT slipstream.add_backup('b1', '127.0.0.1:99999', 'tcp', 's');
SELECT slipstream.add_backup('b1', '127.0.0.1:0', 'tcp', 's');
SELECT slipstream.add_backup('b1', '127.0.0.1:7400', 'carrier-pigeon', 's');
SELECT slipstream.add_backup('b1', '127.0.0.1:7400', 'tcp', '');
SELECT slipstream.add_backup('b1', '127.0.0.1:7400', 'tcp', NULL);
SELECT slipstream.add_backup('b1', '127.0.0.1:7400', 'tcp', repeat('s', 200));
SELECT slipstream.drop_backup('nope');
SELECT count(*) AS backups_after_errors FROM slipstream.replication;

-- a backup nobody serves: listed (without its secret) while it is being connected, then dropped
SELECT slipstream.add_backup('b1', '127.0.0.1:1', 'tcp', 'sekrit');
SELECT slipstream.add_backup('b1', '127.0.0.1:1', 'tcp', 'sekrit');
SELECT name, address, transport, state IN ('connecting', 'lost') AS not_streaming
  FROM slipstream.replication;
SELECT count(*) AS columns_named_secret FROM information_schema.columns
  WHERE table_schema = 'slipstream' AND table_name = 'replication' AND column_name LIKE '%secret%';
SELECT slipstream.drop_backup('b1');
SELECT count(*) AS backups FROM slipstream.replication;

-- serve_backup: bad buffers, sizes, secrets and addresses
SELECT slipstream.serve_backup('127.0.0.1:0', 's', 0);
SELECT slipstream.serve_backup('127.0.0.1:0', 's', 4, '1000');
SELECT slipstream.serve_backup('127.0.0.1:0', 's', 4, 'lots');
SELECT slipstream.serve_backup('127.0.0.1:0', 's', 1024, '1GB');
SELECT slipstream.serve_backup('127.0.0.1:0', '', 4);
SELECT slipstream.serve_backup('127.0.0.1', 's', 4);
SELECT slipstream.serve_backup('203.0.113.1:0', 's', 4);
-- and one that works: it listens, holds no buffers yet, and stops
SELECT slipstream.serve_backup('127.0.0.1:0', 'sekrit', 4, '1MB') LIKE '127.0.0.1:%' AS serving;
SELECT count(*) AS buffers FROM slipstream.backup_buffers;
-- a primary that serves holds no WAL of another's: held_lsn stays null
SELECT serving, address LIKE '127.0.0.1:%' AS address, standby, held_lsn, replay_lsn, error
  FROM slipstream.backup;
SELECT slipstream.stop_serving();
SELECT slipstream.stop_serving();
SELECT serving, address, held_lsn FROM slipstream.backup;

-- commit modes
SHOW slipstream.commit_mode;
SET slipstream.commit_mode = 'bogus';
SET slipstream.commit_mode = remote_memory;
-- with no backup configured, a commit does not wait
CREATE TABLE repl_t (id int) USING slipstream;
INSERT INTO repl_t VALUES (1);
RESET slipstream.commit_mode;
DROP TABLE repl_t;

-- promote: only on a standby, with a positive wait
SELECT slipstream.promote();
SELECT slipstream.promote(0);
SELECT slipstream.promote(2147483647);
SELECT pg_is_in_recovery() AS still_in_recovery;
-- catch_up: the same checks (on a standby, tests/pg_promote_catch_up_test.sh)
SELECT slipstream.catch_up();
SELECT slipstream.catch_up(-1);

-- seed_snapshot: every row of a permanent table under its tag, and one trailer row (tag 0)
-- carrying the dump's horizon and end (16 bytes); unlogged and temporary tables are left out
CREATE TABLE seed_t (id int, v text) USING slipstream;
INSERT INTO seed_t SELECT g, repeat('v', g) FROM generate_series(1, 25) g;
CREATE UNLOGGED TABLE seed_u (id int) USING slipstream;
INSERT INTO seed_u VALUES (1);
CREATE TEMP TABLE seed_tmp (id int) USING slipstream;
INSERT INTO seed_tmp VALUES (1);
CREATE FUNCTION pg_temp.tag_of(rel regclass) RETURNS bigint LANGUAGE sql AS
  $$ SELECT ((SELECT oid FROM pg_database WHERE datname = current_database())::bigint << 32)
            | pg_relation_filenode(rel)::bigint $$;
SELECT count(*) FILTER (WHERE tag = pg_temp.tag_of('seed_t')) AS seed_t_rows,
       count(*) FILTER (WHERE tag = pg_temp.tag_of('seed_u')) AS unlogged_rows,
       count(*) FILTER (WHERE tag = pg_temp.tag_of('seed_tmp')) AS temp_rows,
       count(*) FILTER (WHERE tag = 0) AS trailers,
       bool_and(length(value) = 16) FILTER (WHERE tag = 0) AS trailer_holds_two_lsns
  FROM slipstream.seed_snapshot();
-- the dump's end is flushed WAL when the snapshot returns, even with a transaction's changes
-- still open (their WAL is not flushed by a commit): a crash cannot take back a dumped change
BEGIN;
INSERT INTO seed_t SELECT g, 'open' FROM generate_series(26, 2000) g;
SELECT pg_current_wal_flush_lsn() >=
       '0/0'::pg_lsn + ('x' || encode(substring(value FROM 9 FOR 8), 'hex'))::bit(64)::bigint
         AS dump_end_flushed
  FROM slipstream.seed_snapshot() WHERE tag = 0;
COMMIT;
-- and when no record follows a segment switch, whose insert position names the byte after the
-- new segment's page header (a flush to there would be refused)
SELECT pg_switch_wal() IS NOT NULL AS switched;
SELECT count(*) FILTER (WHERE tag = 0) AS trailers FROM slipstream.seed_snapshot();
DROP TABLE seed_t, seed_u, seed_tmp;

-- permissions: only superusers and members of slipstream_admin
CREATE ROLE repl_user LOGIN;
SET ROLE repl_user;
SELECT slipstream.promote();
SELECT slipstream.catch_up();
SELECT count(*) FROM slipstream.seed_snapshot();
SELECT slipstream.add_backup('b2', '127.0.0.1:1', 'tcp', 'sekrit');
SELECT slipstream.serve_backup('127.0.0.1:0', 'sekrit');
SELECT * FROM slipstream.replication;
SELECT * FROM slipstream.backup_buffers;
SELECT * FROM slipstream.backup;
RESET ROLE;
GRANT slipstream_admin TO repl_user;
SET ROLE repl_user;
SELECT slipstream.catch_up(1);
SELECT slipstream.add_backup('b2', '127.0.0.1:1', 'tcp', 'sekrit');
SELECT name FROM slipstream.replication;
SELECT slipstream.drop_backup('b2');
RESET ROLE;
DROP ROLE repl_user;
