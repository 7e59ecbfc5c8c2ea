#!/usr/bin/env bash
# ycsb_pg.sh: YCSB for PostgreSQL, heap against slipstream on one server in one run.
#
# For every value-size mix it creates two usertables (one heap, one USING slipstream), runs YCSB
# Load and workloads A-F on each (the heap table first, then the slipstream one, same settings,
# same client count), and prints throughput, latency percentiles (from pgbench's per-transaction
# log) and the slipstream/heap ratio. The workloads are pgbench scripts:
#   Load  100% insert (keys from a sequence)        A  50% read, 50% update
#   B     95% read, 5% update                       C  100% read
#   D     95% read of the latest keys, 5% insert    E  95% scan (1-100 rows), 5% insert
#   F     50% read, 50% read-modify-write (one transaction)
# Requests are zipfian over the loaded keys and scrambled (a hot key is anywhere in the key
# space, as in YCSB's scrambled zipfian); pgbench's zipfian needs an exponent > 1, so 1.01 is
# used where YCSB uses 0.99. D reads "latest": the newest key minus a zipfian offset.
# Value-size mixes (small/medium/large percent of records, a record's class fixed by its key):
#   S 100/0/0, M 0/100/0, L 0/0/100, SD 60/20/20, MD 20/60/20, LD 20/20/60
# with values of 20 B, 300 B and 1500 B (the engine's small, medium and large classes for a
# row; 1500 B stays below PostgreSQL's TOAST threshold, so both tables store it in the row).
#
# With --rounds=N (N > 1) workloads A-F run N times each, the table that goes first alternating
# (heap first in odd rounds, slipstream first in even ones), so that neither always runs on the
# machine the other has just warmed or loaded; a line per round, then the workload's line with
# the mean tps of the rounds and the ratio of the means. Load runs once (it fills the tables), in
# --load-chunks alternating chunks (10 by default: heap's tenth, slipstream's tenth, then
# slipstream first, ...), its tps the rows over the summed time of a table's chunks, so that a
# virtual machine whose fsync latency drifts over minutes does not favour the table loaded first.
#
#   bench/ycsb_pg.sh [--mixes=SD,...|all] [--workloads=load,a,...] [--records=N]
#                    [--seconds=S] [--clients=C] [--rounds=N] [--load-chunks=K]
#                    [--scratch=DIR] [--port=P] [--set='name = value']...
#                    [--huge-pages=auto|on|off] [--keep]
# --set adds a server setting (repeatable), e.g. --set='slipstream.row_cache_size = 0'.
# --huge-pages chooses the shared memory's page size (bench/huge_pages.sh; auto by default:
# 2-MB pages when they can be reserved).
# --keep leaves the cluster running, its tables as the last workload left them, to look at
# afterwards (scripts/pg_cluster.sh psql SCRATCH/cluster; stop it with pg_cluster.sh stop, and
# give back huge pages the run reserved with sysctl -w vm.nr_hugepages=0 as root).
# Needs the extension installed (make install); `make bench-pg` does both.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mixes=SD
workloads=load,a,b,c,d,e,f
records=100000
seconds=15
clients=2
rounds=1
load_chunks=10
scratch=${SLIPSTREAM_SCRATCH:-/tmp/slipstream-ycsb}
port=55470
extra_settings=()
huge_pages=auto
keep=0
for arg in "$@"; do
  case "$arg" in
    --set=*) extra_settings+=("${arg#*=}") ;;
    --mixes=*) mixes=${arg#*=} ;;
    --workloads=*) workloads=${arg#*=} ;;
    --records=*) records=${arg#*=} ;;
    --seconds=*) seconds=${arg#*=} ;;
    --clients=*) clients=${arg#*=} ;;
    --rounds=*) rounds=${arg#*=} ;;
    --load-chunks=*) load_chunks=${arg#*=} ;;
    --scratch=*) scratch=${arg#*=} ;;
    --port=*) port=${arg#*=} ;;
    --huge-pages=*) huge_pages=${arg#*=} ;;
    --keep) keep=1 ;;
    *) echo "unknown argument $arg (see the header of $0)" >&2; exit 2 ;;
  esac
done
[ "$mixes" = all ] && mixes=S,M,L,SD,MD,LD
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "--rounds is a positive number, not $rounds" >&2; exit 2; }
[[ "$load_chunks" =~ ^[1-9][0-9]*$ ]] || { echo "--load-chunks is a positive number, not $load_chunks" >&2; exit 2; }
cluster="$scratch/cluster"
pg="$root/scripts/pg_cluster.sh"
pgbench=/usr/lib/postgresql/15/bin/pgbench
. "$root/bench/huge_pages.sh"

# Small/medium/large percentages of a mix.
mix_shares() {
  case "$1" in
    S) echo "100 0 0" ;; M) echo "0 100 0" ;; L) echo "0 0 100" ;;
    SD) echo "60 20 20" ;; MD) echo "20 60 20" ;; LD) echo "20 20 60" ;;
    *) echo "unknown mix $1 (S, M, L, SD, MD, LD)" >&2; exit 2 ;;
  esac
}

# A SQL expression for a fresh value of key expression $1's class (classes by key % 100).
value_sql() {
  local key=$1 small medium
  read -r small medium _ < <(mix_shares "$mix")
  echo "CASE WHEN ($key) % 100 < $small THEN left(md5(random()::text), 20)
             WHEN ($key) % 100 < $((small + medium)) THEN left(repeat(md5(random()::text), 10), 300)
             ELSE left(repeat(md5(random()::text), 47), 1500) END"
}

# The pgbench script of one workload over table $1.
workload_script() {
  local table=$1 w=$2
  local zipf="\\set z random_zipfian(1, $records, 1.01)
\\set key (:z * 2654435761) % $records + 1"
  case "$w" in
    load)
      echo "INSERT INTO $table SELECT k, $(value_sql k) FROM (SELECT nextval('${table}_seq') AS k) s;" ;;
    a|b|c)
      local reads=$([ "$w" = a ] && echo 50 || { [ "$w" = b ] && echo 95 || echo 100; })
      echo "$zipf"
      echo "\\set op random(1, 100)"
      echo "\\if :op <= $reads"
      echo "SELECT field0 FROM $table WHERE ycsb_key = :key;"
      echo "\\else"
      echo "UPDATE $table SET field0 = $(value_sql :key) WHERE ycsb_key = :key;"
      echo "\\endif" ;;
    d)
      echo "\\set offset random_zipfian(1, $records, 1.01) - 1"
      echo "\\set op random(1, 100)"
      echo "\\if :op <= 95"
      echo "SELECT field0 FROM $table WHERE ycsb_key = (SELECT last_value FROM ${table}_seq) - :offset;"
      echo "\\else"
      echo "INSERT INTO $table SELECT k, $(value_sql k) FROM (SELECT nextval('${table}_seq') AS k) s;"
      echo "\\endif" ;;
    e)
      echo "$zipf"
      echo "\\set len random(1, 100)"
      echo "\\set op random(1, 100)"
      echo "\\if :op <= 95"
      echo "SELECT ycsb_key, field0 FROM $table WHERE ycsb_key >= :key ORDER BY ycsb_key LIMIT :len;"
      echo "\\else"
      echo "INSERT INTO $table SELECT k, $(value_sql k) FROM (SELECT nextval('${table}_seq') AS k) s;"
      echo "\\endif" ;;
    f)
      echo "$zipf"
      echo "\\set op random(1, 100)"
      echo "\\if :op <= 50"
      echo "SELECT field0 FROM $table WHERE ycsb_key = :key;"
      echo "\\else"
      echo "BEGIN;"
      echo "SELECT field0 FROM $table WHERE ycsb_key = :key FOR UPDATE;"
      echo "UPDATE $table SET field0 = $(value_sql :key) WHERE ycsb_key = :key;"
      echo "COMMIT;"
      echo "\\endif" ;;
    *) echo "unknown workload $w (load, a-f)" >&2; exit 2 ;;
  esac
}

psql_c() { PGOPTIONS="-c client_min_messages=warning" "$pg" psql "$cluster" -qAt "$@"; }

# Runs pgbench with workload $2 on table $1 (limit arguments $3...), its per-transaction log
# kept in $scratch/log/$1 (added to what earlier calls left there); prints the tps.
run_pgbench() {
  local table=$1 w=$2 dir="$scratch/run"
  shift 2
  rm -rf "$dir" && mkdir -p "$dir" "$scratch/log/$table" && chmod 777 "$dir"
  workload_script "$table" "$w" >"$dir/script.sql"
  local out
  out=$(cd "$dir" && "$pgbench" -h "$cluster/sock" -p "$port" -U postgres -n -c "$clients" -j "$clients" \
    "$@" -M prepared -l --log-prefix="$dir/log" -f "$dir/script.sql" postgres 2>&1) || {
    echo "$out" >&2
    return 1
  }
  cat "$dir"/log* >>"$scratch/log/$table/all"
  echo "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -1
}

# Prints "p50 p95 p99" (ms) of the transactions logged for table $1, and forgets them.
percentiles() {
  local log="$scratch/log/$1/all"
  # pgbench log lines: client transaction latency_us script_no time_s time_us
  awk '{ print $3 }' "$log" 2>/dev/null | sort -n | awk '
    { v[NR] = $1 }
    END {
      if (NR == 0) { print 0, 0, 0; exit }
      p50 = v[int(NR * 0.50) > 0 ? int(NR * 0.50) : 1]
      p95 = v[int(NR * 0.95) > 0 ? int(NR * 0.95) : 1]
      p99 = v[int(NR * 0.99) > 0 ? int(NR * 0.99) : 1]
      printf "%.3f %.3f %.3f\n", p50 / 1000, p95 / 1000, p99 / 1000
    }'
  rm -f "$log"
}

# Runs one workload (not Load) for $seconds on one table; prints "tps p50 p95 p99" (ms).
run_one() {
  psql_c -c "CHECKPOINT" >/dev/null
  local tps
  tps=$(run_pgbench "$1" "$2" -T "$seconds")
  echo "$(printf '%.0f' "$tps") $(percentiles "$1")"
}

# Loads both tables in $load_chunks alternating chunks (heap's chunk first in odd chunks), so
# that a machine whose disk or CPU speed drifts over minutes (virtual machines do) slows both
# alike; prints "heap_tps slip_tps heap_p50 p95 p99 slip_p50 p95 p99", tps = rows / summed time.
run_load() {
  local per_client=$((records / clients)) done_per_client=0 chunk n tps am
  local -A seconds_of=([heap]=0 [slipstream]=0)
  psql_c -c "CHECKPOINT" >/dev/null
  for chunk in $(seq 1 "$load_chunks"); do
    n=$((per_client / load_chunks))
    [ "$chunk" = "$load_chunks" ] && n=$((per_client - done_per_client))
    done_per_client=$((done_per_client + n))
    [ "$n" -gt 0 ] || continue
    local order="heap slipstream"
    [ $((chunk % 2)) = 0 ] && order="slipstream heap"
    for am in $order; do
      tps=$(run_pgbench "ut_$am" load -t "$n")
      seconds_of[$am]=$(awk -v s="${seconds_of[$am]}" -v n=$((n * clients)) -v t="$tps" \
        'BEGIN { print s + (t > 0 ? n / t : 0) }')
    done
  done
  local rows=$((done_per_client * clients))
  echo "$(awk -v r=$rows -v s="${seconds_of[heap]}" 'BEGIN { printf "%.0f", (s > 0 ? r / s : 0) }')" \
    "$(awk -v r=$rows -v s="${seconds_of[slipstream]}" 'BEGIN { printf "%.0f", (s > 0 ? r / s : 0) }')" \
    "$(percentiles ut_heap)" "$(percentiles ut_slipstream)"
}

"$pg" init "$cluster" "$port" "slipstream.l0_size = 32MB" "shared_buffers = 1GB" "max_wal_size = 4GB" \
  "checkpoint_timeout = 30min" ${extra_settings[@]+"${extra_settings[@]}"}
[ "$keep" = 1 ] || trap '"$pg" stop "$cluster" >/dev/null 2>&1 || true; huge_pages_release' EXIT
huge_pages_prepare "$cluster" "$huge_pages"
echo "== private PostgreSQL 15 cluster in $cluster (port $port); $records records, $clients clients," \
  "${seconds}s per workload; shared memory on huge pages: $huge_pages_in_use"
"$pg" start "$cluster"
psql_c -c "CREATE EXTENSION slipstream"
rm -rf "$scratch/log"

# One line of the table: label, heap tps, slipstream tps, heap and slipstream percentiles.
print_line() {
  local h50 h95 h99 s50 s95 s99
  read -r h50 h95 h99 <<<"$4"
  read -r s50 s95 s99 <<<"$5"
  printf '%-4s %-5s %12s %12s %6.2fx | %8s %8s %8s | %8s %8s %8s\n' "$mix" "$1" "$2" "$3" \
    "$(awk -v a="$3" -v b="$2" 'BEGIN { print (b > 0 ? a / b : 0) }')" \
    "$h50" "$h95" "$h99" "$s50" "$s95" "$s99"
}

printf '\n%-4s %-5s %12s %12s %7s | %-26s | %-26s\n' mix wkld "heap tps" "slip tps" ratio \
  "heap p50/p95/p99 ms" "slipstream p50/p95/p99 ms"
failed=0
for mix in ${mixes//,/ }; do
  mix_shares "$mix" >/dev/null
  for am in heap slipstream; do
    t="ut_$am"
    psql_c -c "DROP TABLE IF EXISTS $t" -c "DROP SEQUENCE IF EXISTS ${t}_seq" \
      -c "CREATE TABLE $t (ycsb_key bigint PRIMARY KEY, field0 text) USING $am" \
      -c "CREATE SEQUENCE ${t}_seq"
  done
  loaded=0
  for w in ${workloads//,/ }; do
    if [ "$w" != load ] && [ "$loaded" = 0 ]; then
      # Workloads without a Load step run over a bulk-loaded table.
      for am in heap slipstream; do
        psql_c -c "INSERT INTO ut_$am SELECT k, $(value_sql k) FROM generate_series(1, $records) k" \
          -c "SELECT setval('ut_${am}_seq', $records)" >/dev/null
      done
      loaded=1
    fi
    if [ "$w" = load ]; then
      read -r h_tps s_tps h50 h95 h99 s50 s95 s99 < <(run_load)
      print_line load "$h_tps" "$s_tps" "$h50 $h95 $h99" "$s50 $s95 $s99"
      loaded=1
      psql_c -c "VACUUM ANALYZE ut_heap" -c "VACUUM ANALYZE ut_slipstream"
      continue
    fi
    n=$rounds
    h_sum=0
    s_sum=0
    for round in $(seq 1 "$n"); do
      if [ $((round % 2)) = 1 ]; then
        read -r h_tps h50 h95 h99 < <(run_one ut_heap "$w")
        read -r s_tps s50 s95 s99 < <(run_one ut_slipstream "$w")
      else
        read -r s_tps s50 s95 s99 < <(run_one ut_slipstream "$w")
        read -r h_tps h50 h95 h99 < <(run_one ut_heap "$w")
      fi
      h_sum=$((h_sum + h_tps))
      s_sum=$((s_sum + s_tps))
      label=$w
      [ "$n" -gt 1 ] && label="$w/$round"
      print_line "$label" "$h_tps" "$s_tps" "$h50 $h95 $h99" "$s50 $s95 $s99"
    done
    if [ "$n" -gt 1 ]; then print_line "$w" $((h_sum / n)) $((s_sum / n)) "- - -" "- - -"; fi
  done
  bad=$(psql_c -c "SELECT count(*) FROM slipstream.verify('ut_slipstream') WHERE NOT ok")
  rows_h=$(psql_c -c "SELECT count(*) FROM ut_heap")
  rows_s=$(psql_c -c "SELECT count(*) FROM ut_slipstream")
  echo "     rows: heap $rows_h, slipstream $rows_s; slipstream.verify failures: $bad"
  [ "$bad" = 0 ] || failed=1
done
[ "$failed" = 0 ] || { echo "ycsb: slipstream.verify failed" >&2; exit 1; }
