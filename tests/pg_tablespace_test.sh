#!/usr/bin/env bash
# pg_tablespace_test.sh: slipstream tables in tablespaces survive crashes and travel in seeds.
#   1. A table and its index in a tablespace (a directory outside the data directory): three
#      clients insert while a fourth moves the table between the tablespace and pg_default
#      (ALTER TABLE ... SET TABLESPACE) again and again, and the postmaster is killed (SIGKILL)
#      at a random point, ROUNDS times. After each restart every acknowledged row is there,
#      an index scan finds as many rows as a sequential scan, slipstream.verify passes, and an
#      unlogged table in the tablespace is empty, as heap's would be.
#   2. scripts/seed_backup.sh --streaming --tablespace-mapping seeds a standby on this host with
#      the tablespace in a directory of its own; the standby carries the table, and once
#      promoted it is writable and holds every row.
#   tests/pg_tablespace_test.sh [scratch dir] [base port] [rounds]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=${1:-${SLIPSTREAM_SCRATCH:-/tmp/slipstream-tablespace}}
base=${2:-55670}
rounds=${3:-${ROUNDS:-4}}
clients=3
pg="$root/scripts/pg_cluster.sh"
primary="$scratch/primary"
standby="$scratch/standby"
space="$scratch/space"
pgbin=${PGBIN:-/usr/lib/postgresql/15/bin}

as_postgres() { if [ "$(id -un)" = postgres ]; then "$@"; else runuser -u postgres -- "$@"; fi; }
fail() { echo "tablespace test FAILED: $*" >&2; exit 1; }

rm -rf "$scratch"
mkdir -p "$space"
[ "$(id -u)" = 0 ] && chown -R postgres: "$scratch"
"$pg" init "$primary" "$base" "slipstream.flush_interval = 500ms" "slipstream.sync_interval = 2s" \
  "wal_level = replica" "max_wal_senders = 5" >/dev/null
"$pg" start "$primary"
trap 'for c in "$primary" "$standby"; do "$pg" stop "$c" immediate >/dev/null 2>&1 || true; done' EXIT
p_sql() { "$pg" psql "$primary" -qAt "$@"; }
s_sql() { "$pg" psql "$standby" -qAt "$@"; }

p_sql -c "CREATE EXTENSION slipstream" \
  -c "CREATE TABLESPACE space LOCATION '$space'" \
  -c "CREATE TABLE tt (client int, seq int, payload text, PRIMARY KEY (client, seq)) USING slipstream TABLESPACE space" \
  -c "CREATE INDEX tt_seq ON tt (seq) TABLESPACE space" \
  -c "CREATE UNLOGGED TABLE tu (x int) USING slipstream TABLESPACE space" >/dev/null

# One client: single-row inserts from `first` on; "ACK n" once each returned.
workload() {
  local c=$1 first=$2
  for n in $(seq "$first" $((first + 100000))); do
    echo "INSERT INTO tt VALUES ($c, $n, repeat(md5('$n'), $((n % 20))));"
    echo "\\echo ACK $n"
  done
}

# The mover: the table goes back and forth between the tablespace and pg_default.
mover() {
  for _ in $(seq 1 10000); do
    echo "ALTER TABLE tt SET TABLESPACE pg_default;"
    echo "ALTER TABLE tt SET TABLESPACE space;"
  done
}

moves_total=0
for round in $(seq 1 "$rounds"); do
  p_sql -c "INSERT INTO tu SELECT generate_series(1, 100)"
  pids=()
  for c in $(seq 1 $clients); do
    first=$(( $(p_sql -c "SELECT coalesce(max(seq), 0) FROM tt WHERE client = $c") + 1 ))
    workload "$c" "$first" | "$pg" psql "$primary" -qAt >"$scratch/acks.$c" 2>/dev/null &
    pids+=($!)
  done
  mover | "$pg" psql "$primary" -qAt -e >"$scratch/moves" 2>/dev/null &
  pids+=($!)
  sleep "$(awk -v r=$RANDOM 'BEGIN { printf "%.2f", 1 + (r % 200) / 100 }')"
  "$pg" kill "$primary"
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  "$pg" start "$primary"
  moves=$(grep -c "^ALTER TABLE" "$scratch/moves" || true)
  moves_total=$((moves_total + moves))

  for c in $(seq 1 $clients); do
    acked=$(grep -o 'ACK [0-9]*' "$scratch/acks.$c" | tail -1 | cut -d' ' -f2)
    acked=${acked:-0}
    have=$(p_sql -c "SELECT count(*) FROM tt WHERE client = $c AND seq <= $acked")
    [ "$have" = "$acked" ] || fail "round $round: client $c had $acked acknowledged rows, $have survived"
  done
  seq_rows=$(p_sql -c "SET enable_indexscan = off" -c "SET enable_bitmapscan = off" \
    -c "SELECT count(*) FROM tt")
  index_rows=$(p_sql -c "SET enable_seqscan = off" -c "SET enable_bitmapscan = off" \
    -c "SELECT count(*) FROM tt WHERE seq > 0")
  [ "$seq_rows" = "$index_rows" ] || fail "round $round: $seq_rows rows by a table scan, $index_rows by the index"
  bad=$(p_sql -c "SELECT count(*) FROM slipstream.verify('tt') WHERE NOT ok")
  [ "$bad" = 0 ] || { p_sql -c "SELECT * FROM slipstream.verify('tt') WHERE NOT ok" >&2; fail "round $round: verify"; }
  unlogged=$(p_sql -c "SELECT count(*) FROM tu")
  [ "$unlogged" = 0 ] || fail "round $round: the unlogged table kept $unlogged rows through a crash"
  where=$(p_sql -c "SELECT coalesce(t.spcname, 'pg_default') FROM pg_class c
                    LEFT JOIN pg_tablespace t ON t.oid = c.reltablespace WHERE c.relname = 'tt'")
  echo "round $round: $seq_rows rows, all acknowledged ones there, $moves moves begun, table in $where"
done
[ "$moves_total" -ge $((rounds * 2)) ] || fail "only $moves_total moves were begun: the test did not exercise them"

# ---- 2. A standby seeded with the tablespace mapped to a directory of its own ----
mkdir -p "$standby/sock"
[ "$(id -u)" = 0 ] && chown -R postgres: "$standby"
as_postgres "$root/scripts/seed_backup.sh" \
  --connstring "host=$primary/sock port=$base user=postgres dbname=postgres" \
  --datadir "$standby/data" --streaming --name ts --set "port = $((base + 1))" \
  --set "unix_socket_directories = '$standby/sock'" \
  --tablespace-mapping "$space=$scratch/standby_space" >"$scratch/seed.log" 2>&1 ||
  { cat "$scratch/seed.log" >&2; fail "seeding the standby"; }
"$pg" start "$standby"
link=$(readlink -f "$standby/data/pg_tblspc/"*)
[ "$link" = "$scratch/standby_space" ] || fail "the standby's tablespace is $link"
p_sql -c "INSERT INTO tt SELECT 9, g, 'after the seed' FROM generate_series(1, 500) g" \
  -c "ALTER TABLE tt SET TABLESPACE pg_default" \
  -c "INSERT INTO tt SELECT 9, g, 'after the move' FROM generate_series(501, 600) g" \
  -c "ALTER TABLE tt SET TABLESPACE space" >/dev/null
target=$(p_sql -c "SELECT pg_current_wal_flush_lsn()")
for _ in $(seq 1 600); do
  [ "$(s_sql -c "SELECT pg_last_wal_replay_lsn() >= '$target'" 2>/dev/null)" = t ] && break
  sleep 0.1
done
summary="SELECT count(*), sum(hashtext(x::text)) FROM tt x"
expected=$(p_sql -c "$summary")
got=$(s_sql -c "$summary")
[ "$got" = "$expected" ] || fail "the standby holds ($got), the primary ($expected)"
echo "standby: the table in the mapped tablespace equals the primary's ($got)"
s_sql -c "SELECT pg_promote(true, 60)" >/dev/null
s_sql -c "INSERT INTO tt VALUES (10, 1, 'on the promoted node')" >/dev/null
after=$(s_sql -c "SELECT count(*) FROM tt")
[ "$after" = $(( ${expected%%|*} + 1 )) ] || fail "promoted: $after rows"
bad=$(s_sql -c "SELECT count(*) FROM slipstream.verify('tt') WHERE NOT ok")
[ "$bad" = 0 ] || fail "promoted: verify"
echo "promoted: writable, $after rows, verify passes"
echo "tablespace test passed ($rounds crash rounds, $moves_total moves begun)"
