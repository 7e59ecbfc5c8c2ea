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

CREATE VIEW engine AS SELECT * FROM engine_stats();
CREATE VIEW levels AS SELECT * FROM level_stats();
GRANT USAGE ON SCHEMA slipstream TO PUBLIC;

CREATE FUNCTION row_versions(rel regclass)
RETURNS TABLE(ctid tid, xmin xid, xmax xid, infomask integer, infomask2 integer, next_ctid tid)
AS 'MODULE_PATHNAME', 'slipstream_row_versions' LANGUAGE C VOLATILE;
REVOKE ALL ON FUNCTION row_versions(regclass) FROM PUBLIC;
