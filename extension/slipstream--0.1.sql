-- slipstream 0.1: the table access method, its statistics and maintenance functions.
\echo Use "CREATE EXTENSION slipstream" to load this file. \quit

CREATE FUNCTION slipstream_tableam_handler(internal)
RETURNS table_am_handler
AS 'MODULE_PATHNAME' LANGUAGE C;

CREATE ACCESS METHOD slipstream TYPE TABLE HANDLER slipstream_tableam_handler;
COMMENT ON ACCESS METHOD slipstream IS 'LSM-tree storage with hybrid key-value placement';

DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'slipstream_admin') THEN
    CREATE ROLE slipstream_admin NOLOGIN;
  END IF;
END
$$;

CREATE FUNCTION verify(rel regclass)
RETURNS TABLE(check_name text, ok boolean, detail text)
AS 'MODULE_PATHNAME', 'slipstream_verify' LANGUAGE C VOLATILE;
COMMENT ON FUNCTION verify(regclass) IS 'checks the engine structure and that indexes agree with the table';

CREATE FUNCTION engine_stats()
RETURNS TABLE(name text, value double precision)
AS 'MODULE_PATHNAME', 'slipstream_engine_stats' LANGUAGE C VOLATILE STRICT;

CREATE FUNCTION level_stats()
RETURNS TABLE(level integer, bytes bigint, segments bigint, entries bigint,
              small_entries bigint, medium_entries bigint, large_entries bigint,
              tombstones bigint)
AS 'MODULE_PATHNAME', 'slipstream_level_stats' LANGUAGE C VOLATILE STRICT;

CREATE FUNCTION table_stats(rel regclass)
RETURNS TABLE(keyspace bigint, rowid_high bigint, relfilenode bigint)
AS 'MODULE_PATHNAME', 'slipstream_table_stats' LANGUAGE C VOLATILE;

CREATE FUNCTION compact(rel regclass)
RETURNS void
AS 'MODULE_PATHNAME', 'slipstream_compact' LANGUAGE C VOLATILE;
REVOKE ALL ON FUNCTION compact(regclass) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION compact(regclass) TO slipstream_admin;

-- The sizes of slipstream tables: PostgreSQL's size functions, with the bytes the engine holds
-- for a slipstream table (its md files are empty stubs). Queries calling pg_relation_size,
-- pg_table_size or pg_total_relation_size run these instead (tableam/planner.c).
CREATE FUNCTION relation_size(regclass, text) RETURNS bigint
AS 'MODULE_PATHNAME', 'slipstream_relation_size' LANGUAGE C STRICT VOLATILE PARALLEL SAFE;
CREATE FUNCTION relation_size(regclass) RETURNS bigint
AS 'MODULE_PATHNAME', 'slipstream_relation_main_size' LANGUAGE C STRICT VOLATILE PARALLEL SAFE;
CREATE FUNCTION table_size(regclass) RETURNS bigint
AS 'MODULE_PATHNAME', 'slipstream_table_size' LANGUAGE C STRICT VOLATILE PARALLEL SAFE;
CREATE FUNCTION total_relation_size(regclass) RETURNS bigint
AS 'MODULE_PATHNAME', 'slipstream_total_relation_size' LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

CREATE VIEW engine AS SELECT * FROM engine_stats();
CREATE VIEW levels AS SELECT * FROM level_stats();
GRANT USAGE ON SCHEMA slipstream TO PUBLIC;

CREATE FUNCTION row_versions(rel regclass)
RETURNS TABLE(ctid tid, xmin xid, xmax xid, infomask integer, infomask2 integer, next_ctid tid)
AS 'MODULE_PATHNAME', 'slipstream_row_versions' LANGUAGE C VOLATILE;
REVOKE ALL ON FUNCTION row_versions(regclass) FROM PUBLIC;

-- Replication (docs/replication.md): on a backup, serve_backup; on a primary, add_backup.
CREATE FUNCTION serve_backup(listen text, secret text, buffers integer DEFAULT 16,
                             buffer_size text DEFAULT '8MB')
RETURNS text
AS 'MODULE_PATHNAME', 'slipstream_serve_backup' LANGUAGE C VOLATILE;
COMMENT ON FUNCTION serve_backup(text, text, integer, text) IS 'makes this node a backup: primaries connect to LISTEN with SECRET; returns the address served';

CREATE FUNCTION stop_serving()
RETURNS boolean
AS 'MODULE_PATHNAME', 'slipstream_stop_serving' LANGUAGE C VOLATILE;

CREATE FUNCTION add_backup(name text, address text, transport text DEFAULT 'tcp', secret text DEFAULT NULL,
                           shipping text DEFAULT 'build_index', lz4 boolean DEFAULT false)
RETURNS void
AS 'MODULE_PATHNAME', 'slipstream_add_backup' LANGUAGE C VOLATILE;
COMMENT ON FUNCTION add_backup(text, text, text, text, text, boolean) IS 'ships this primary''s WAL to a backup from now on (shipping => ''send_index'': also the levels of every compaction, which the backup imports)';

CREATE FUNCTION drop_backup(name text)
RETURNS void
AS 'MODULE_PATHNAME', 'slipstream_drop_backup' LANGUAGE C VOLATILE STRICT;

CREATE FUNCTION replication_status()
RETURNS TABLE(name text, address text, transport text, state text, sent_lsn pg_lsn,
              placed_lsn pg_lsn, durable_lsn pg_lsn, placed_lag bigint,
              last_ok timestamptz, error text, shipping text, lz4 boolean,
              index_sent bigint, index_lag bigint, index_frames bigint, index_bytes bigint,
              index_raw_bytes bigint, index_installs bigint, index_seeds bigint,
              backend_placements bigint)
AS 'MODULE_PATHNAME', 'slipstream_replication_status' LANGUAGE C VOLATILE;

CREATE FUNCTION backup_buffer_status()
RETURNS TABLE(primary_name text, buffer integer, stream text, sequence bigint,
              start_lsn pg_lsn, valid_bytes bigint, durable_bytes bigint)
AS 'MODULE_PATHNAME', 'slipstream_backup_buffers' LANGUAGE C VOLATILE;

CREATE FUNCTION backup_status()
RETURNS TABLE(serving boolean, address text, standby boolean, held_lsn pg_lsn, replay_lsn pg_lsn,
              error text)
AS 'MODULE_PATHNAME', 'slipstream_backup_status' LANGUAGE C VOLATILE;
COMMENT ON FUNCTION backup_status() IS 'this node as a backup: whether and where it serves, the end of the WAL it holds in pg_wal (by which a failover ranks fenced backups), its replay position and last error';

CREATE FUNCTION index_import_status()
RETURNS TABLE(importing boolean, applied_position bigint, installed_compactions bigint,
              horizon pg_lsn, slot_lsn pg_lsn, promotable boolean, refused_frames bigint,
              awaiting_seed boolean, error text, segments_imported bigint,
              segment_bytes bigint, rewrite_ms double precision)
AS 'MODULE_PATHNAME', 'slipstream_index_import_status' LANGUAGE C VOLATILE;
COMMENT ON FUNCTION index_import_status() IS 'on a backup that imports its primary''s levels: how far it has imported, and whether it can take over';

CREATE FUNCTION promote(wait_seconds integer DEFAULT 60)
RETURNS pg_lsn
AS 'MODULE_PATHNAME', 'slipstream_promote' LANGUAGE C VOLATILE;
COMMENT ON FUNCTION promote(integer) IS 'takes over on a backup: fences the primary (stops serving, open buffers into pg_wal), lets replay reach the end of pg_wal, then promotes';

CREATE FUNCTION catch_up(wait_seconds integer DEFAULT 60)
RETURNS pg_lsn
AS 'MODULE_PATHNAME', 'slipstream_catch_up' LANGUAGE C VOLATILE;
COMMENT ON FUNCTION catch_up(integer) IS 'on a standby: lets replay reach the end of the valid WAL in pg_wal (ending any pause); call it before pg_promote()';

CREATE FUNCTION seed_snapshot()
RETURNS TABLE(tag bigint, key bytea, value bytea)
AS 'MODULE_PATHNAME', 'slipstream_seed_snapshot' LANGUAGE C VOLATILE;
COMMENT ON FUNCTION seed_snapshot() IS 'a consistent dump of the engine for seeding a standby (scripts/seed_backup.sh)';

CREATE VIEW replication AS SELECT * FROM replication_status();
CREATE VIEW backup_buffers AS SELECT * FROM backup_buffer_status();
CREATE VIEW backup AS SELECT * FROM backup_status();
CREATE VIEW index_import AS SELECT * FROM index_import_status();


-- ---- the query shuffle (docs/shuffle.md) ----

-- Peer groups; REVOKEd from PUBLIC: it holds secrets and conninfo strings (passwords).
CREATE TABLE peer_group_config (
  name text PRIMARY KEY,
  nodes text[] NOT NULL,
  self integer NOT NULL,
  secret text NOT NULL,
  transport text NOT NULL,
  receive_buffers integer NOT NULL,
  buffer_size integer NOT NULL
);
REVOKE ALL ON peer_group_config FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('peer_group_config', '');

CREATE FUNCTION create_peer_group(name text, nodes text[], self integer, secret text,
                                  transport text DEFAULT 'auto', receive_buffers integer DEFAULT 4,
                                  buffer_size text DEFAULT '1MB')
RETURNS void
AS 'MODULE_PATHNAME', 'slipstream_create_peer_group' LANGUAGE C VOLATILE;
COMMENT ON FUNCTION create_peer_group(text, text[], integer, text, text, integer, text) IS 'defines a peer group on this node: every node''s libpq conninfo by index, this node''s index, the shared secret, the transport and the channels'' receive buffers';

CREATE FUNCTION drop_peer_group(name text)
RETURNS void
AS 'MODULE_PATHNAME', 'slipstream_drop_peer_group' LANGUAGE C VOLATILE;
COMMENT ON FUNCTION drop_peer_group(text) IS 'forgets a peer group on this node';

CREATE VIEW peer_groups AS
  SELECT name, nodes, self, transport, receive_buffers, pg_size_pretty(buffer_size::bigint) AS buffer_size
  FROM peer_group_config;

CREATE FUNCTION shuffle(query text, key text, peer_group text, shuffle_id bigint DEFAULT NULL)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'slipstream_shuffle' LANGUAGE C VOLATILE;
COMMENT ON FUNCTION shuffle(text, text, text, bigint) IS 'run on every node of a peer group at once: runs the query, sends each row to the node owning the hash of its key, returns the rows this node owns';

CREATE FUNCTION shuffle_on_group(peer_group text, statement text, timeout_seconds integer DEFAULT 300)
RETURNS TABLE(node integer, command text, rows bigint)
AS 'MODULE_PATHNAME', 'slipstream_shuffle_on_group' LANGUAGE C VOLATILE;
COMMENT ON FUNCTION shuffle_on_group(text, text, integer) IS 'runs a statement on every node of a peer group at once, with slipstream.shuffle_id set to a fresh id';

CREATE FUNCTION shuffle_port(shuffle_id bigint, wait_seconds integer DEFAULT 30,
                             sequence integer DEFAULT 0)
RETURNS integer
AS 'MODULE_PATHNAME', 'slipstream_shuffle_port' LANGUAGE C VOLATILE STRICT;
COMMENT ON FUNCTION shuffle_port(bigint, integer, integer) IS 'internal: the port this node''s participant of a shuffle listens on (asked by its peers)';

CREATE FUNCTION shuffle_progress_status()
RETURNS TABLE(pid integer, shuffle_id bigint, peer_group text, state text, self integer,
              peer integer, rows_sent bigint, bytes_sent bigint, rows_received bigint,
              bytes_received bigint, port integer)
AS 'MODULE_PATHNAME', 'slipstream_shuffle_progress' LANGUAGE C VOLATILE;
CREATE VIEW shuffle_progress AS SELECT * FROM shuffle_progress_status();

-- ---- who may do what: configuring replication and peer groups is for admins ----

DO $$
DECLARE f text;
BEGIN
  FOREACH f IN ARRAY ARRAY['serve_backup(text, text, integer, text)', 'stop_serving()',
                           'add_backup(text, text, text, text, text, boolean)', 'drop_backup(text)',
                           'replication_status()', 'backup_buffer_status()', 'backup_status()', 'index_import_status()',
                           'seed_snapshot()', 'promote(integer)', 'catch_up(integer)',
                           'create_peer_group(text, text[], integer, text, text, integer, text)',
                           'drop_peer_group(text)', 'shuffle_on_group(text, text, integer)'] LOOP
    EXECUTE format('REVOKE ALL ON FUNCTION slipstream.%s FROM PUBLIC', f);
    EXECUTE format('GRANT EXECUTE ON FUNCTION slipstream.%s TO slipstream_admin', f);
  END LOOP;
END
$$;
REVOKE ALL ON replication, backup_buffers, backup, index_import, peer_groups FROM PUBLIC;
GRANT SELECT ON replication, backup_buffers, backup, index_import, peer_groups TO slipstream_admin;
GRANT SELECT ON shuffle_progress TO PUBLIC;
