#!/usr/bin/env bash
# demo_replication.sh: slipstream replication on this machine. A primary and two backups (each
# a standby seeded with scripts/seed_backup.sh, fed WAL only by one-sided writes): b1 imports
# the primary's levels (Send-Index, LZ4), b2 replays the WAL into its own engine (Build-Index).
# pgbench TPC-B on slipstream tables in remote_memory, the status views, a hot-standby read on
# b2; then the primary is SIGKILLed under load, b1 takes over with slipstream.promote(), and
# every commit that was acknowledged is checked on it.
#   scripts/demo_replication.sh [scratch dir] [base port] [transport] [seconds]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=${1:-${SLIPSTREAM_SCRATCH:-/tmp/slipstream-demo-replication}}
base=${2:-55800}
transport=${3:-tcp}
seconds=${4:-10}
secret="demo-$RANDOM$RANDOM"
pg="$root/scripts/pg_cluster.sh"
pgbin=/usr/lib/postgresql/15/bin
primary="$scratch/primary"
b1="$scratch/b1"
b2="$scratch/b2"

as_postgres() { if [ "$(id -un)" = postgres ]; then "$@"; else runuser -u postgres -- "$@"; fi; }
rm -rf "$scratch"
mkdir -p "$scratch"
[ "$(id -u)" = 0 ] && chown postgres: "$scratch"
trap 'for c in "$primary" "$b1" "$b2"; do "$pg" stop "$c" immediate >/dev/null 2>&1 || true; done' EXIT
p_sql() { "$pg" psql "$primary" "$@"; }

echo "== a primary on port $base (slipstream.min_sync_backups = 2)"
"$pg" init "$primary" "$base" "slipstream.min_sync_backups = 2" "slipstream.backup_timeout = 2s" >/dev/null
"$pg" start "$primary"
p_sql -q -c "CREATE EXTENSION slipstream"
PGOPTIONS="-c default_table_access_method=slipstream" as_postgres "$pgbin/pgbench" -i -s 2 -q \
  -h "$primary/sock" -p "$base" -U postgres postgres 2>&1 | tail -1

for i in 1 2; do
  dir="$scratch/b$i"
  mode=(); shipping="'build_index', false"
  [ "$i" = 1 ] && { mode=(--send-index); shipping="'send_index', true"; }
  echo "== seeding backup b$i: scripts/seed_backup.sh ${mode[*]} --connstring ... --datadir $dir/data"
  mkdir -p "$dir/sock"
  [ "$(id -u)" = 0 ] && chown -R postgres: "$dir"
  as_postgres "$root/scripts/seed_backup.sh" "${mode[@]}" \
    --connstring "host=$primary/sock port=$base user=postgres dbname=postgres" \
    --datadir "$dir/data" --name "b$i" --set "port = $((base + i))" \
    --set "unix_socket_directories = '$dir/sock'"
  "$pg" start "$dir"
  "$pg" psql "$dir" -qAt -c "SELECT 'b$i serves at ' || slipstream.serve_backup('127.0.0.1:$((base + 10 + i))', '$secret', 8, '8MB')"
  echo "SELECT slipstream.add_backup('b$i', '127.0.0.1:$((base + 10 + i))', '$transport', '...', $shipping)"
  p_sql -qAt -c "SELECT slipstream.add_backup('b$i', '127.0.0.1:$((base + 10 + i))', '$transport', '$secret', $shipping)"
done
for _ in $(seq 1 200); do
  [ "$(p_sql -qAt -c "SELECT count(*) FROM slipstream.replication WHERE state = 'streaming'")" = 2 ] && break
  sleep 0.05
done

echo "== pgbench TPC-B, 2 clients, $seconds s, slipstream.commit_mode = remote_memory ($transport)"
PGOPTIONS="-c slipstream.commit_mode=remote_memory" as_postgres "$pgbin/pgbench" -n -c 2 -j 2 \
  -T "$seconds" -M prepared -h "$primary/sock" -p "$base" -U postgres postgres |
  grep -E "^(number of transactions actually|latency average|tps)"
# b1 can take over once the levels it imported cover WAL it holds (two L0 compactions after
# its seed); the engine compacts on its own as L0 fills, and this makes it so at once.
for _ in $(seq 1 30); do
  [ "$("$pg" psql "$b1" -qAt -c "SELECT promotable FROM slipstream.index_import")" = t ] && break
  p_sql -qAt -c "SELECT slipstream.compact('pgbench_history')" >/dev/null
  sleep 0.5
done
echo "== SELECT * FROM slipstream.replication (on the primary)"
p_sql -c "SELECT name, transport, state, sent_lsn, placed_lsn, placed_lag, shipping, lz4, index_frames, pg_size_pretty(index_raw_bytes) AS index_bytes, pg_size_pretty(index_bytes) AS sent_after_lz4, index_installs, index_seeds FROM slipstream.replication"
echo "== SELECT * FROM slipstream.index_import (on b1: the levels it imported)"
"$pg" psql "$b1" -c "SELECT * FROM slipstream.index_import"
echo "== SELECT * FROM slipstream.verify('pgbench_accounts') (on b1: its imported levels)"
"$pg" psql "$b1" -c "SELECT check_name, ok, detail FROM slipstream.verify('pgbench_accounts')"
echo "== SELECT * FROM slipstream.backup_buffers (on b1)"
"$pg" psql "$b1" -c "SELECT * FROM slipstream.backup_buffers"
echo "== a hot-standby read of a slipstream table on b2"
"$pg" psql "$b2" -c "SELECT count(*) AS history_rows, sum(delta) AS deltas FROM pgbench_history"

echo "== clients commit in remote_memory; the primary is killed with SIGKILL after 3 s"
p_sql -q -c "CREATE TABLE acked (client int, seq int, PRIMARY KEY (client, seq)) USING slipstream"
for c in 1 2 3; do
  { echo "SET slipstream.commit_mode = remote_memory;"
    for n in $(seq 1 100000); do echo "INSERT INTO acked VALUES ($c, $n);"; echo "\\echo ACK $c $n"; done
  } | "$pg" psql "$primary" -qAt >"$scratch/client$c.out" 2>&1 &
done
sleep 3
"$pg" kill "$primary"
wait || true
cat "$scratch"/client*.out | sed -n 's/^ACK //p' | sort >"$scratch/acked"
echo "acknowledged commits: $(wc -l <"$scratch/acked")"

echo "== b1 takes over: SELECT slipstream.promote() (its imported levels, then the WAL after them)"
"$pg" psql "$b1" -qAt -c "SELECT 'promoted at ' || slipstream.promote()"
grep -h "taking over the imported levels\|replayed .* WAL records" "$b1/server.log" | sed 's/^.*slipstream: /  /'
"$pg" psql "$b1" -qAt -c "SELECT client || ' ' || seq FROM acked" | sort >"$scratch/present"
missing=$(comm -23 "$scratch/acked" "$scratch/present" | wc -l)
echo "on the new primary: $(wc -l <"$scratch/present") rows, $missing acknowledged commits missing"
"$pg" psql "$b1" -c "SELECT check_name, ok FROM slipstream.verify('acked')"
"$pg" psql "$b1" -qAt -c "INSERT INTO acked VALUES (0, 0)" -c "SELECT 'b1 takes writes: ' || count(*) || ' rows' FROM acked"
[ "$missing" = 0 ] || { echo "an acknowledged commit was lost" >&2; exit 1; }
echo "== done"
