#!/usr/bin/env bash
# callgrind_pg.sh: instructions a transaction costs a PostgreSQL backend on heap and on
# slipstream, counted by valgrind's callgrind. Timings on these virtual machines move by 5-25%
# between runs of the same module; instruction counts of the same keys move by well under 1%,
# so this resolves the small CPU differences that tps ratios cannot. It counts instructions,
# not time: cache misses, lock waits, fsyncs and background work (the slipstream worker,
# autovacuum) are not in it.
#
# One cluster (the postmaster under callgrind, so every backend is counted in its own file)
# holds `usertable` on slipstream and `heaptable`, a heap copy, with bench/ycsb_table.sh's rows.
# Each workload runs with one client on each table, once to warm up (--count transactions),
# then twice with the same seed (--base and then --base + --count transactions); the difference of the two backends' counts divided by
# --count is one transaction's cost, free of connection start-up. The same keys run on both
# tables. slipstream.max_device_size is lowered to 16GB: valgrind cannot map the 1 TB default.
#
#   bench/callgrind_pg.sh [--workloads=read,update,rmw,scan,insert] [--records=N] [--mix=SD|L]
#                         [--count=N] [--base=N] [--scratch=DIR] [--port=P] [--keep]
# --keep leaves the callgrind files in SCRATCH/callgrind (callgrind_annotate reads them).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
workloads=read,update,rmw,scan,insert
records=100000
mix=SD
count=2000
base=200
scratch=${SLIPSTREAM_SCRATCH:-/tmp/slipstream-callgrind}
port=55477
keep=0
for arg in "$@"; do
  case "$arg" in
    --workloads=*) workloads=${arg#*=} ;;
    --records=*) records=${arg#*=} ;;
    --mix=*) mix=${arg#*=} ;;
    --count=*) count=${arg#*=} ;;
    --base=*) base=${arg#*=} ;;
    --scratch=*) scratch=${arg#*=} ;;
    --port=*) port=${arg#*=} ;;
    --keep) keep=1 ;;
    *) echo "unknown argument $arg (see the header of $0)" >&2; exit 2 ;;
  esac
done
for n in "$records" "$count" "$base"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "--records, --count and --base are positive numbers" >&2; exit 2; }
done
if ! command -v valgrind >/dev/null; then
  SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null
fi
cluster="$scratch/cluster"
out="$scratch/callgrind"
pg="$root/scripts/pg_cluster.sh"
pgbench=/usr/lib/postgresql/15/bin/pgbench
. "$root/bench/ycsb_table.sh"

echo "== cluster in $cluster (port $port): $records rows, mix $mix; $count transactions a measure"
"$pg" stop "$cluster" >/dev/null 2>&1 || true
rm -rf "$scratch"
mkdir -p "$scratch"
chown postgres "$scratch" 2>/dev/null || true
"$pg" init "$cluster" "$port" "slipstream.max_device_size = 16GB" "shared_buffers = 256MB" \
  "autovacuum = off" >/dev/null
"$pg" start "$cluster" >/dev/null
load_usertable "$cluster"
"$pg" psql "$cluster" -qAt \
  -c "CREATE TABLE heaptable (ycsb_key int PRIMARY KEY, field0 text) USING heap" \
  -c "INSERT INTO heaptable SELECT * FROM usertable" -c "VACUUM ANALYZE heaptable" \
  -c "CREATE SEQUENCE usertable_seq START $((records + 1))" \
  -c "CREATE SEQUENCE heaptable_seq START $((records + 1))" \
  -c "CHECKPOINT"
"$pg" stop "$cluster" >/dev/null

# The postmaster under callgrind; each process it forks writes callgrind.out.<pid> on exit.
as_postgres() { if [ "$(id -un)" = postgres ]; then "$@"; else runuser -u postgres -- "$@"; fi; }
mkdir -p "$out"
chown postgres "$out" 2>/dev/null || true
as_postgres bash -c "valgrind --tool=callgrind --callgrind-out-file='$out/cg.%p' \
  /usr/lib/postgresql/15/bin/postgres -D '$cluster/data' >'$scratch/valgrind.log' 2>&1 &"
stop_server() {
  as_postgres /usr/lib/postgresql/15/bin/pg_ctl -D "$cluster/data" -m fast -w -t 300 stop >/dev/null 2>&1 || true
  [ "$keep" = 1 ] || rm -rf "$out"
}
trap stop_server EXIT
for _ in $(seq 1 180); do
  "$pg" psql "$cluster" -qAt -c "SELECT count(*) FROM usertable WHERE ycsb_key = 1" >/dev/null 2>&1 && break
  sleep 1
done

# The pgbench script of workload $1 over table $2 into file $3.
script_for() {
  local w=$1 table=$2 file=$3
  if [ "$w" = insert ]; then
    echo "INSERT INTO $table SELECT k, $(value_sql k 'random()') FROM (SELECT nextval('${table}_seq') AS k) s;" >"$file"
  else
    write_workload_script "$w" "$file"
    sed -i "s/usertable/$table/g" "$file"
  fi
  chmod 644 "$file"
}

# Instructions of the busiest backend of one pgbench run of $2 transactions of script $1.
run_instructions() {
  local before after f best=0 ir
  before=$(ls "$out" | sort)
  PGOPTIONS="-c synchronous_commit=off" "$pgbench" -h "$cluster/sock" -p "$port" -U postgres -n \
    -c 1 -t "$2" -M prepared --random-seed=7 -f "$1" postgres >"$scratch/pgbench.log" 2>&1 ||
    { cat "$scratch/pgbench.log" >&2; return 1; }
  for _ in $(seq 1 60); do
    after=$(comm -13 <(echo "$before") <(ls "$out" | sort))
    [ -n "$after" ] && [ "$(echo "$after" | wc -l)" -ge 1 ] && sleep 2 && break
    sleep 1
  done
  after=$(comm -13 <(echo "$before") <(ls "$out" | sort))
  for f in $after; do
    ir=$(sed -n 's/^summary: \([0-9]*\)/\1/p' "$out/$f")
    [ -n "$ir" ] && [ "$ir" -gt "$best" ] && best=$ir
  done
  echo "$best"
}

printf '%-8s %14s %14s %7s\n' workload "heap Ir/tx" "slip Ir/tx" ratio
for w in ${workloads//,/ }; do
  declare -A per=()
  for table in heaptable usertable; do
    script_for "$w" "$table" "$scratch/$w-$table.sql"
    run_instructions "$scratch/$w-$table.sql" "$count" >/dev/null  # warms caches and chains
    i1=$(run_instructions "$scratch/$w-$table.sql" "$base")
    i2=$(run_instructions "$scratch/$w-$table.sql" "$((base + count))")
    per[$table]=$(((i2 - i1) / count))
  done
  awk -v w="$w" -v h="${per[heaptable]}" -v s="${per[usertable]}" \
    'BEGIN { printf "%-8s %14d %14d %6.3fx\n", w, h, s, s / h }'
  unset per
done
