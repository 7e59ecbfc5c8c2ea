# pgbench_pair.sh: sourced by bench/tpcb_pg.sh and bench/copy_pg.sh. One private cluster with a
# database per table access method (bench_heap, bench_slipstream), for pgbench run unmodified
# against each; the caller sets root, cluster and port first, and huge_pages (auto, on or off;
# bench/huge_pages.sh) if it takes a --huge-pages option.
pg="$root/scripts/pg_cluster.sh"
pgbench=/usr/lib/postgresql/15/bin/pgbench
. "$root/bench/huge_pages.sh"

# Creates and starts the cluster (extra postgresql.conf lines as arguments), stopped on exit,
# with both databases.
pair_start() {
  "$pg" init "$cluster" "$port" "$@" >/dev/null
  trap '"$pg" stop "$cluster" >/dev/null 2>&1 || true; huge_pages_release' EXIT
  huge_pages_prepare "$cluster" "${huge_pages:-auto}"
  echo "(shared memory on huge pages: $huge_pages_in_use)"
  "$pg" start "$cluster" >/dev/null
  "$pg" psql "$cluster" -qAt -c "CREATE DATABASE bench_heap" -c "CREATE DATABASE bench_slipstream"
  "$pg" psql "$cluster" -qAt -d bench_slipstream -c "CREATE EXTENSION slipstream"
}

# Fails unless slipstream.verify finds the pgbench tables of bench_slipstream sound.
pair_verify() {
  local bad
  bad=$("$pg" psql "$cluster" -qAt -d bench_slipstream -c "SELECT count(*) FROM
    (SELECT (slipstream.verify(c.oid)).* FROM pg_class c WHERE c.relname LIKE 'pgbench_%' AND c.relkind = 'r') v
    WHERE NOT ok")
  echo "slipstream.verify failures over the pgbench tables: $bad"
  [ "$bad" = 0 ]
}
