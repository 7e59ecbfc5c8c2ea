#!/usr/bin/env bash
# module_bytes.sh: what two builds of slipstream.so write to the engine's device for the same
# transactions. Each build gets a fresh cluster, loads the same YCSB-like table, runs a fixed
# number of pgbench transactions (one client, synchronous_commit = off, zipfian keys, so both
# make the same changes), and reports slipstream.engine_stats()'s byte counters over them; the
# last line is B's device bytes a transaction against A's. Bytes do not depend on how much CPU
# the virtual machine steals, so this measures a change to what the engine writes (placement,
# patches, GC) where tps ratios are noise.
#
#   bench/module_bytes.sh --a=OLD.so --b=NEW.so [--workload=update|rmw] [--mix=L|SD]
#       [--records=100000] [--transactions=30000] [--scratch=DIR] [--port=55497]
#
# `update` is YCSB A's update, `rmw` F's read-modify-write (SELECT ... FOR UPDATE, then the
# UPDATE); the L mix has rows of 1,500 bytes, SD 60% of 20, 20% of 300 and 20% of 1,500 bytes.
# Run as root (it installs the modules); B stays installed afterwards.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
a="" b="" workload=rmw mix=L records=100000 transactions=30000
scratch=${SLIPSTREAM_SCRATCH:-/tmp/slipstream-module-bytes}
port=55497
for arg in "$@"; do
  case "$arg" in
    --a=*) a=${arg#*=} ;;
    --b=*) b=${arg#*=} ;;
    --workload=*) workload=${arg#*=} ;;
    --mix=*) mix=${arg#*=} ;;
    --records=*) records=${arg#*=} ;;
    --transactions=*) transactions=${arg#*=} ;;
    --scratch=*) scratch=${arg#*=} ;;
    --port=*) port=${arg#*=} ;;
    *) echo "unknown argument $arg (see the header of $0)" >&2; exit 2 ;;
  esac
done
[ -f "$a" ] && [ -f "$b" ] || { echo "give two built modules: --a=OLD.so --b=NEW.so" >&2; exit 2; }
pg="$root/scripts/pg_cluster.sh"
. "$root/bench/ycsb_table.sh"
pgbench=/usr/lib/postgresql/15/bin/pgbench
libdir=$(/usr/lib/postgresql/15/bin/pg_config --pkglibdir 2>/dev/null || echo /usr/lib/postgresql/15/lib)
cluster="$scratch/cluster"
trap '"$pg" stop "$cluster" >/dev/null 2>&1 || true; install -m 755 "$b" "$libdir/slipstream.so"' EXIT
mkdir -p "$scratch"
[ "$(id -u)" = 0 ] && chown postgres: "$scratch"

counters="'device_bytes_written', 'compaction_bytes_written', 'gc_bytes_relocated', 'gc_runs',
  'large_patches'"

# The counters as "name value" lines (a counter a build lacks reads 0).
stats() {
  "$pg" psql "$cluster" -qAt -F' ' -c "SELECT n, coalesce((SELECT value FROM slipstream.engine_stats()
    WHERE name = n), 0)::bigint FROM unnest(ARRAY[$counters]) n ORDER BY n"
}

case "$workload" in
  update | rmw) write_workload_script "$workload" "$scratch/script.sql" ;;
  *) echo "unknown workload $workload (update, rmw)" >&2; exit 2 ;;
esac
echo "== $workload, $mix mix, $records records, $transactions transactions; A=$a B=$b"
declare -A device
for side in A B; do
  module=$a
  [ "$side" = B ] && module=$b
  "$pg" stop "$cluster" >/dev/null 2>&1 || true
  install -m 755 "$module" "$libdir/slipstream.so"
  "$pg" init "$cluster" "$port" "shared_buffers = 256MB" "max_wal_size = 4GB" >/dev/null
  "$pg" start "$cluster" >/dev/null
  load_usertable "$cluster"
  declare -A before=()
  while read -r name value; do before[$name]=$value; done < <(stats)
  out=$(PGOPTIONS="-c synchronous_commit=off" "$pgbench" -h "$cluster/sock" -p "$port" -U postgres \
    -n -c 1 -t "$transactions" -M prepared -f "$scratch/script.sql" postgres 2>&1) ||
    { echo "pgbench failed: $out" >&2; exit 1; }
  "$pg" psql "$cluster" -qAt -c "SELECT pg_sleep(2)" >/dev/null  # the log flush behind the last commits
  line="$side:"
  while read -r name value; do
    delta=$((value - ${before[$name]}))
    [ "$name" = device_bytes_written ] && device[$side]=$delta
    line="$line $name $delta"
  done < <(stats)
  echo "$line"
  awk -v s="$side" -v d="${device[$side]}" -v t="$transactions" \
    'BEGIN { printf "%s: %.0f device bytes a transaction\n", s, d / t }'
done
awk -v a="${device[A]}" -v b="${device[B]}" \
  'BEGIN { printf "B/A: %.3fx device bytes a transaction\n", b / a }'
