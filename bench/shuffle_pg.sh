#!/usr/bin/env bash
# shuffle_pg.sh: repartitioning ROWS rows across three PostgreSQL nodes by a key, with
# slipstream.shuffle (tcp and shm) against what a user does today, postgres_fdw: every node
# INSERTs into the owners' tables through foreign tables (batch_size 1000), all nodes at once.
# Each method ends with every row in the `dst` table of the node that owns its key; the counts
# and a checksum are checked after every run. A local INSERT ... SELECT of the same rows on
# every node at once is the floor no method can beat.
#
#   bench/shuffle_pg.sh [--rows=N] [--rounds=R] [--scratch=DIR] [--port=P] [--plot=PNG|none]
# The best round of each method goes to RESULTS/shuffle.csv and, with gnuplot, to the plot
# (default docs/shuffle_bench.png).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rows=10000000
rounds=2
scratch=${SLIPSTREAM_SCRATCH:-/tmp/slipstream-shuffle}
port=55940
plot="$root/docs/shuffle_bench.png"
results="$root/results/shuffle"
for arg in "$@"; do
  case "$arg" in
    --plot=*) plot=${arg#*=} ;;
    --rows=*) rows=${arg#*=} ;;
    --rounds=*) rounds=${arg#*=} ;;
    --scratch=*) scratch=${arg#*=} ;;
    --port=*) port=${arg#*=} ;;
    *) echo "unknown argument $arg (see the header of $0)" >&2; exit 2 ;;
  esac
done
pg="$root/scripts/pg_cluster.sh"
nodes=3
mkdir -p "$scratch"
[ "$(id -u)" = 0 ] && chown postgres: "$scratch"

conninfo() { echo "host=$scratch/n$1/sock port=$((port + $1)) dbname=postgres"; }
psql_node() { local n=$1; shift; "$pg" psql "$scratch/n$n" -qAt "$@"; }
now() { date +%s.%N; }

cleanup() { for n in 0 1 2; do "$pg" stop "$scratch/n$n" >/dev/null 2>&1 || true; done; }
trap cleanup EXIT
echo "== three private PostgreSQL 15 clusters in $scratch (ports $port-$((port + 2))); $rows rows"
for n in 0 1 2; do
  "$pg" init "$scratch/n$n" $((port + n)) "shared_buffers = 256MB" "max_wal_size = 8GB" \
    "checkpoint_timeout = 30min" "work_mem = 64MB" >/dev/null
  "$pg" start "$scratch/n$n"
done
group="ARRAY['$(conninfo 0)','$(conninfo 1)','$(conninfo 2)']"
per_node=$(( (rows + nodes - 1) / nodes ))
for n in 0 1 2; do
  first=$((n * per_node + 1))
  last=$(( (n + 1) * per_node < rows ? (n + 1) * per_node : rows ))
  psql_node $n -c "CREATE EXTENSION slipstream" -c "CREATE EXTENSION postgres_fdw" \
    -c "CREATE TABLE src (order_id bigint, customer_id int, total numeric(10,2), note text)" \
    -c "INSERT INTO src SELECT g, ((g::bigint * 7919) % 1000003)::int, (g % 100000) / 100.0, 'order ' || g
        FROM generate_series($first, $last) g" \
    -c "CREATE TABLE dst (LIKE src)" -c "VACUUM ANALYZE src" >/dev/null
  for m in 0 1 2; do
    psql_node $n -c "CREATE SERVER node$m FOREIGN DATA WRAPPER postgres_fdw
        OPTIONS (host '$scratch/n$m/sock', port '$((port + m))', dbname 'postgres', batch_size '1000')" \
      -c "CREATE USER MAPPING FOR postgres SERVER node$m OPTIONS (user 'postgres')" \
      -c "CREATE FOREIGN TABLE dst_$m (order_id bigint, customer_id int, total numeric(10,2), note text)
          SERVER node$m OPTIONS (table_name 'dst')" >/dev/null
  done
done
echo "loaded: $(for n in 0 1 2; do psql_node $n -c 'SELECT count(*) FROM src'; done | paste -sd+) rows"

# The owner of a key, as slipstream.shuffle computes it: the type's hash, unsigned, mod 3.
owner="((hashint4(customer_id)::bigint & 4294967295) % 3)"
expected_sum=$(for n in 0 1 2; do psql_node $n -c "SELECT sum(order_id) FROM src"; done | paste -sd+ | bc)

# Runs "$@" on the three nodes at once (the statement may use NODE for the node's index).
on_all() {
  local statement=$1 pids=()
  for n in 0 1 2; do psql_node $n -c "${statement//NODE/$n}" >/dev/null & pids+=($!); done
  local failed=0
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
  return $failed
}

# Checks that dst on every node holds exactly the rows it owns, every row once.
check() {
  local count=0 sum=0 wrong=0
  for n in 0 1 2; do
    count=$((count + $(psql_node $n -c "SELECT count(*) FROM dst")))
    sum=$(echo "$sum + $(psql_node $n -c "SELECT coalesce(sum(order_id), 0) FROM dst")" | bc)
    wrong=$((wrong + $(psql_node $n -c "SELECT count(*) FROM dst WHERE $owner <> $n")))
  done
  if [ "$count" != "$rows" ] || [ "$sum" != "$expected_sum" ] || [ "$wrong" != 0 ]; then
    echo "CHECK FAILED: $count rows (want $rows), sum $sum (want $expected_sum), $wrong misplaced"
    exit 1
  fi
}

declare -A best
record() {  # method seconds
  local m=$1 s=$2
  if [ -z "${best[$m]:-}" ] || [ "$(echo "$s < ${best[$m]}" | bc)" = 1 ]; then best[$m]=$s; fi
  printf '  %-16s %7.2f s  %10.0f rows/s\n' "$m" "$s" "$(echo "$rows / $s" | bc -l)"
}

for round in $(seq 1 "$rounds"); do
  echo "== round $round"
  for n in 0 1 2; do psql_node $n -c "TRUNCATE dst" -c "CHECKPOINT" >/dev/null; done
  start=$(now)
  on_all "INSERT INTO dst SELECT * FROM src"
  record "local insert" "$(echo "$(now) - $start" | bc)"

  for transport in tcp shm; do
    for n in 0 1 2; do
      psql_node $n -c "SELECT slipstream.drop_peer_group(name) FROM slipstream.peer_groups" \
        -c "SELECT slipstream.create_peer_group('bench', $group, $n, 'bench-secret', '$transport',
            receive_buffers => 4, buffer_size => '1MB')" -c "TRUNCATE dst" -c "CHECKPOINT" >/dev/null
    done
    start=$(now)
    psql_node 0 -c "SELECT * FROM slipstream.shuffle_on_group('bench', \$\$INSERT INTO dst
      SELECT * FROM slipstream.shuffle('SELECT * FROM src', 'customer_id', 'bench')
        AS t(order_id bigint, customer_id int, total numeric(10,2), note text)\$\$)" >/dev/null
    record "slipstream $transport" "$(echo "$(now) - $start" | bc)"
    check
  done
  # The shuffle feeding an aggregate on every node (a repartitioned GROUP BY's first step):
  # nothing is stored, so this is the shuffle's own rate.
  start=$(now)
  got=$(psql_node 0 -c "SELECT sum(rows) FROM slipstream.shuffle_on_group('bench', \$\$SELECT count(*)
      FROM slipstream.shuffle('SELECT * FROM src', 'customer_id', 'bench')
        AS t(order_id bigint, customer_id int, total numeric(10,2), note text)\$\$)")
  record "shuffle to agg" "$(echo "$(now) - $start" | bc)"

  for n in 0 1 2; do psql_node $n -c "TRUNCATE dst" -c "CHECKPOINT" >/dev/null; done
  start=$(now)
  pids=()
  for n in 0 1 2; do
    stmt="INSERT INTO dst SELECT * FROM src WHERE $owner = $n;"
    for m in 0 1 2; do
      [ "$m" = "$n" ] && continue
      stmt+=" INSERT INTO dst_$m SELECT * FROM src WHERE $owner = $m;"
    done
    psql_node $n -c "$stmt" >/dev/null & pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  record "postgres_fdw" "$(echo "$(now) - $start" | bc)"
  check
done

echo "== best of $rounds rounds"
for m in "local insert" "slipstream tcp" "slipstream shm" "shuffle to agg" "postgres_fdw"; do
  printf '  %-16s %7.2f s  %10.0f rows/s\n' "$m" "${best[$m]}" "$(echo "$rows / ${best[$m]}" | bc -l)"
done
mkdir -p "$results"
{
  echo "method,seconds,rows_per_second"
  for m in "local insert" "slipstream tcp" "slipstream shm" "shuffle to agg" "postgres_fdw"; do
    echo "$m,${best[$m]},$(echo "$rows / ${best[$m]}" | bc -l)"
  done
} > "$results/shuffle.csv"
if [ "$plot" != none ] && command -v gnuplot >/dev/null; then
  gnuplot -e "csv='$results/shuffle.csv'; out='$plot'; rows=$rows" "$root/scripts/plot_shuffle.gp"
  echo "plot: $plot"
fi
for t in "slipstream tcp" "slipstream shm" "shuffle to agg"; do
  printf '%s / postgres_fdw: %.2fx rows per second\n' "$t" \
    "$(echo "${best[postgres_fdw]} / ${best[$t]}" | bc -l)"
done
