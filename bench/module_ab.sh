#!/usr/bin/env bash
# module_ab.sh: two builds of slipstream.so against each other on one workload, alternating on
# one cluster, so that an engine or table AM change is measured in the same run as its
# baseline (heap is not involved). Each round restarts the cluster with build A, runs the
# workload, then the same with build B (B goes first in even rounds), and prints the
# transactions per second and the server's CPU per transaction (utime + stime of every process
# of the cluster, from /proc); the last line is B's ratio to A over all rounds.
#
#   bench/module_ab.sh --a=OLD.so --b=NEW.so [--workload=update|read|scan|rmw] [--mix=SD|L]
#       [--records=100000] [--seconds=10] [--rounds=3] [--clients=1] [--separate]
#       [--scratch=DIR] [--port=55490] [--a-set='name = value']... [--b-set=...]... [--churn=S]
#
# Workloads over a YCSB-like table of `records` rows (values of 20, 300 and 1500 bytes in
# YCSB's SD mix, or all of 1500 bytes in the L mix; zipfian keys, as bench/ycsb_pg.sh), with
# synchronous_commit = off so that a commit's fsync does not hide CPU: `update` (a single-row
# UPDATE of field0), `read` (a point SELECT), `scan` (YCSB E's SELECT of 1-100 rows in key
# order), `rmw` (YCSB F's write: SELECT ... FOR UPDATE, then the UPDATE, in one transaction).
# --separate gives each build a cluster of its own, loaded by it, for builds whose engine
# formats differ (a build cannot open what a newer one wrote); otherwise both share one.
# --a-set and --b-set give a side server settings of its own (written to postgresql.auto.conf
# before each start), so that one build can be measured against itself with a setting changed
# (--a=X.so --b=X.so --a-set='slipstream.row_cache_size = 0'). --churn=S runs S seconds of
# `update` on the loaded table first, so that reads find version chains, as YCSB's E finds them
# after A-D.
# Build the two modules first (e.g. `make install` on each commit, copying
# /usr/lib/postgresql/15/lib/slipstream.so aside). B stays installed afterwards. Run as root
# (it installs the modules); the cluster runs as the postgres user.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
a="" b="" workload=update records=100000 seconds=10 rounds=3 clients=1 mix=SD separate=0 churn=0
a_settings=() b_settings=()
scratch=${SLIPSTREAM_SCRATCH:-/tmp/slipstream-module-ab}
port=55490
for arg in "$@"; do
  case "$arg" in
    --a=*) a=${arg#*=} ;;
    --b=*) b=${arg#*=} ;;
    --workload=*) workload=${arg#*=} ;;
    --mix=*) mix=${arg#*=} ;;
    --separate) separate=1 ;;
    --a-set=*) a_settings+=("${arg#*=}") ;;
    --b-set=*) b_settings+=("${arg#*=}") ;;
    --churn=*) churn=${arg#*=} ;;
    --records=*) records=${arg#*=} ;;
    --seconds=*) seconds=${arg#*=} ;;
    --rounds=*) rounds=${arg#*=} ;;
    --clients=*) clients=${arg#*=} ;;
    --scratch=*) scratch=${arg#*=} ;;
    --port=*) port=${arg#*=} ;;
    *) echo "unknown argument $arg (see the header of $0)" >&2; exit 2 ;;
  esac
done
[ -f "$a" ] && [ -f "$b" ] || { echo "give two built modules: --a=OLD.so --b=NEW.so" >&2; exit 2; }
pg="$root/scripts/pg_cluster.sh"
pgbench=/usr/lib/postgresql/15/bin/pgbench
libdir=$(/usr/lib/postgresql/15/bin/pg_config --pkglibdir 2>/dev/null || echo /usr/lib/postgresql/15/lib)
. "$root/bench/ycsb_table.sh"
declare -A cluster_of=([A]="$scratch/cluster" [B]="$scratch/cluster")
if [ "$separate" = 1 ]; then
  cluster_of=([A]="$scratch/cluster-a" [B]="$scratch/cluster-b")
fi
cluster=${cluster_of[A]}

# Installs the module of side $1 with every cluster stopped (overwriting a mapped library in
# place would crash the processes that map it; install(1) replaces the file), and starts the
# side's cluster.
use_module() {
  local module=$a
  [ "$1" = B ] && module=$b
  for c in "${cluster_of[@]}"; do "$pg" stop "$c" >/dev/null 2>&1 || true; done
  install -m 755 "$module" "$libdir/slipstream.so"
  cluster=${cluster_of[$1]}
  if [ "$1" = A ]; then
    printf '%s\n' ${a_settings[@]+"${a_settings[@]}"} >"$cluster/data/postgresql.auto.conf"
  else
    printf '%s\n' ${b_settings[@]+"${b_settings[@]}"} >"$cluster/data/postgresql.auto.conf"
  fi
  "$pg" start "$cluster"
}
trap 'for c in "${cluster_of[@]}"; do "$pg" stop "$c" >/dev/null 2>&1 || true; done
  install -m 755 "$b" "$libdir/slipstream.so"' EXIT

mkdir -p "$scratch"
[ "$(id -u)" = 0 ] && chown postgres: "$scratch"
sides=A
[ "$separate" = 1 ] && sides="A B"
for side in $sides; do
  "$pg" init "${cluster_of[$side]}" "$port" "shared_buffers = 256MB" "max_wal_size = 4GB" >/dev/null
  use_module "$side"
  load_usertable "$cluster"
done
write_workload_script "$workload" "$scratch/script.sql"
if [ "$churn" != 0 ]; then
  write_workload_script update "$scratch/churn.sql"
  for side in $sides; do
    use_module "$side"
    "$pgbench" -h "$cluster/sock" -p "$port" -U postgres -n -c 2 -j 2 -T "$churn" -M prepared \
      -f "$scratch/churn.sql" postgres >/dev/null 2>&1
  done
fi

# CPU ticks of the postmaster, its children and their reaped children.
cluster_ticks() {
  local pm t=0 p f
  pm=$(head -1 "$cluster/data/postmaster.pid")
  for p in $pm $(pgrep -P "$pm"); do
    { read -r -a f <"/proc/$p/stat"; } 2>/dev/null || continue  # a process that just ended
    t=$((t + f[13] + f[14] + f[15] + f[16]))
  done
  echo "$t"
}

# A warm-up run per cluster, not counted: the first run after the load was always A's, and it
# found a table no update had aged yet (an A/A comparison came out 0.93x without it).
for side in $sides; do
  use_module "$side"
  PGOPTIONS="-c synchronous_commit=off" "$pgbench" -h "$cluster/sock" -p "$port" -U postgres -n \
    -c "$clients" -j "$clients" -T "$seconds" -M prepared -f "$scratch/script.sql" postgres >/dev/null 2>&1
done

declare -A tx_sum=([A]=0 [B]=0) ticks_sum=([A]=0 [B]=0)
hz=$(getconf CLK_TCK)
echo "== $workload, $mix mix, $records records, $clients client(s), ${seconds}s x $rounds rounds; A=$a ${a_settings[*]+(${a_settings[*]}) }B=$b ${b_settings[*]+(${b_settings[*]}) }(clusters: $([ "$separate" = 1 ] && echo one each || echo one shared))"
for round in $(seq 1 "$rounds"); do
  # A goes first in odd rounds and B in even ones: whichever runs first in a round was
  # measured 7-12% faster (it finds the table as the previous round's compactions left it).
  order="A B"
  [ $((round % 2)) = 0 ] && order="B A"
  for side in $order; do
    use_module "$side"
    "$pg" psql "$cluster" -qAt -c "CHECKPOINT"
    before=$(cluster_ticks)
    out=$(PGOPTIONS="-c synchronous_commit=off" "$pgbench" -h "$cluster/sock" -p "$port" -U postgres \
      -n -c "$clients" -j "$clients" -T "$seconds" -M prepared -f "$scratch/script.sql" postgres 2>&1)
    after=$(cluster_ticks)
    tx=$(echo "$out" | sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p')
    [ -n "$tx" ] && [ "$tx" -gt 0 ] || { echo "pgbench failed: $out" >&2; exit 1; }
    tx_sum[$side]=$((tx_sum[$side] + tx))
    ticks_sum[$side]=$((ticks_sum[$side] + after - before))
    awk -v r="$round" -v s="$side" -v tx="$tx" -v secs="$seconds" -v t=$((after - before)) -v hz="$hz" \
      'BEGIN { printf "round %d %s %9.0f tps  server CPU %7.1f us per transaction\n", r, s, tx / secs, t * 1e6 / hz / tx }'
  done
done
awk -v ta="${tx_sum[A]}" -v tb="${tx_sum[B]}" -v ca="${ticks_sum[A]}" -v cb="${ticks_sum[B]}" \
  'BEGIN { printf "B/A: %.3fx transactions, %.3fx server CPU per transaction\n", tb / ta, (cb / tb) / (ca / ta) }'
