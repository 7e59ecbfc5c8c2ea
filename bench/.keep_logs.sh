#!/usr/bin/env bash
# replication_pg.sh: what keeping standbys in sync costs (issue 9), in one run on one machine.
# pgbench TPC-B and YCSB workload A run on a primary in each of these configurations:
#
#   slip-local                 slipstream tables, no replication: the baseline of every slipstream row
#                              (run first and again last, as slip-local-end; ratios are to their mean)
#   tw-T-N-M                   slipstream tables, N (1, 2) Tailwind backups on transport T (shm, tcp):
#                              standbys seeded by scripts/seed_backup.sh, fed WAL by one-sided writes,
#                              slipstream.min_sync_backups = N, slipstream.commit_mode = remote_M
#                              (M = memory, flush)
#   twd-T-N-M                  the same with the backups in deferred replay
#                              (slipstream.backup_replay = deferred: passive backups that replay in
#                              batches; the replay a run leaves is charged to it, see "A run")
#   tws-shm-N-memory           tw-shm-N-memory with slipstream.backend_placement = off: the shipper
#                              places every commit, as before committing backends placed their own
#   sr-slip-N-M                slipstream tables, PostgreSQL's synchronous streaming replication to
#                              N standbys (seed_backup.sh --streaming), synchronous_standby_names =
#                              'ANY N (s1[, s2])', synchronous_commit = M (write = remote_write, on)
#   heap-local(-end), sr-heap-N-M   the same on heap tables (heap-local: the baseline of heap rows)
#
# For each configuration and workload it reports throughput, its ratio to the baseline of the
# same table type, p50 and p99 transaction latency (pgbench's per-transaction log), and CPU
# seconds per 1,000 transactions: on each standby (the mean over the standbys) the receiving
# process (Tailwind: "slipstream backup"; streaming: walreceiver), replay (the startup process)
# and the rest of the standby's processes; on the primary the sender (slipstream shipper or
# walsenders) and all of its processes. utime + stime from /proc/PID/stat of every child of each
# postmaster (and the postmaster's own and reaped children's time), read before pgbench starts
# and after every standby has replayed the primary's WAL up to where pgbench stopped.
#
#   bench/replication_pg.sh [--seconds=15] [--warmup=10] [--scale=10] [--records=100000]
#       [--value-size=100] [--clients=2] [--workloads=tpcb,ycsb-a] [--configs=all|PATTERN,...]
#       [--quick] [--base-port=56000] [--scratch=/tmp/slipstream-bench-replication]
#       [--results=results/replication] [--plot=docs/replication_bench.png|none] [--keep]
#
# One primary per table type is loaded once (pgbench -i, the usertable), left to finish its
# compactions, warmed up (each workload for --warmup seconds, default min(10, seconds)), and
# kept for all its configurations; standbys are seeded once per kind (Tailwind, streaming).
# --configs takes names or shell patterns (--configs='tw-tcp-*,sr-slip-1-*'); the baseline of a
# table type runs whenever any of its configurations does. --quick is a smoke run: 2 s per
# run, scale 1, 10,000 records, the plot into the results directory (later options win).
# Ports: base .. base + 5 for the clusters, base + 11 and + 12 for the Tailwind backups.
# --keep leaves the data directories in the scratch directory (they are removed after a run
# without failures; the clusters are always stopped).
# Results: RESULTS/replication.csv, RESULTS/replication.md (the tables printed at the end) and,
# if gnuplot is installed, the plot of the tps ratios (scripts/plot_replication.gp).
# Needs the extension installed (make install); `make bench-replication` does both.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=15
warmup=""
scale=10
records=100000
value_size=100
clients=2
workloads=tpcb,ycsb-a
configs=all
base=56000
scratch=${SLIPSTREAM_SCRATCH:-/tmp/slipstream-bench-replication}
results="$root/results/replication"
plot=""
keep=0
for arg in "$@"; do
  case "$arg" in
    --seconds=*) seconds=${arg#*=} ;;
    --warmup=*) warmup=${arg#*=} ;;
    --scale=*) scale=${arg#*=} ;;
    --records=*) records=${arg#*=} ;;
    --value-size=*) value_size=${arg#*=} ;;
    --clients=*) clients=${arg#*=} ;;
    --workloads=*) workloads=${arg#*=} ;;
    --configs=*) configs=${arg#*=} ;;
    --quick) seconds=2; scale=1; records=10000; [ -n "$plot" ] || plot=quick ;;
    --base-port=*) base=${arg#*=} ;;
    --scratch=*) scratch=${arg#*=} ;;
    --results=*) results=${arg#*=} ;;
    --plot=*) plot=${arg#*=} ;;
    --keep) keep=1 ;;
    -h|--help) sed -n '2,41p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument $arg (see bench/replication_pg.sh --help)" >&2; exit 2 ;;
  esac
done
[ -n "$warmup" ] || warmup=$(( seconds < 10 ? seconds : 10 ))
case "$plot" in
  "") plot="$root/docs/replication_bench.png" ;;
  quick) plot="$results/replication_bench.png" ;;
esac
for w in ${workloads//,/ }; do
  case "$w" in tpcb|ycsb-a) ;; *) echo "unknown workload $w (tpcb, ycsb-a)" >&2; exit 2 ;; esac
done

pg="$root/scripts/pg_cluster.sh"
pgbin=/usr/lib/postgresql/15/bin
pgbench="$pgbin/pgbench"
secret="bench-$RANDOM$RANDOM$RANDOM"
clk_tck=$(getconf CLK_TCK)
started=$(date +%s)

# Every configuration, in the order of the report.
all_configs=(slip-local slip-local-end
  tw-shm-1-memory tw-shm-1-flush tw-shm-2-memory tw-shm-2-flush
  tw-tcp-1-memory tw-tcp-1-flush tw-tcp-2-memory tw-tcp-2-flush
  twd-shm-1-memory twd-shm-1-flush twd-shm-2-memory twd-shm-2-flush
  twd-tcp-1-memory twd-tcp-1-flush twd-tcp-2-memory twd-tcp-2-flush
  tws-shm-1-memory tws-shm-2-memory
  sr-slip-1-write sr-slip-1-on sr-slip-2-write sr-slip-2-on
  heap-local heap-local-end sr-heap-1-write sr-heap-1-on sr-heap-2-write sr-heap-2-on)
IFS=, read -ra patterns <<<"$configs"
selected() {
  local p
  for p in "${patterns[@]}"; do
    # shellcheck disable=SC2053
    [ "$p" = all ] || [[ $1 == $p ]] && return 0
  done
  return 1
}
# Whether any configuration matching pattern $1 is selected.
any_selected() {
  local c
  for c in "${all_configs[@]}"; do
    # shellcheck disable=SC2053
    [[ $c == $1 ]] && selected "$c" && return 0
  done
  return 1
}
nothing=1
for c in "${all_configs[@]}"; do selected "$c" && nothing=0; done
[ "$nothing" = 0 ] || { echo "--configs=$configs selects no configuration (names: ${all_configs[*]})" >&2; exit 2; }

as_postgres() { if [ "$(id -un)" = postgres ]; then "$@"; else runuser -u postgres -- "$@"; fi; }
log() { echo "[$(date +%H:%M:%S)] $*"; }

[ -x "$pgbench" ] || { echo "no $pgbench: run make install (or make deps) first" >&2; exit 1; }
[ -f "$($pgbin/pg_config --pkglibdir 2>/dev/null || echo /usr/lib/postgresql/15/lib)/slipstream.so" ] ||
  { echo "the slipstream module is not installed: run make install first" >&2; exit 1; }

# Nodes: a primary and two standbys per table type; Tailwind backups serve at base + 10 + i.
declare -A port=([slip-primary]=$base [slip-s1]=$((base + 1)) [slip-s2]=$((base + 2))
                 [heap-primary]=$((base + 3)) [heap-s1]=$((base + 4)) [heap-s2]=$((base + 5)))
serve_port() { echo $((base + 10 + ${1#s})); }
node() { echo "$scratch/$1"; }

stop_all() {
  local d
  for d in "$scratch"/*/; do
    [ -f "$d/data/postmaster.pid" ] && "$pg" stop "${d%/}" immediate >/dev/null 2>&1 || true
  done
}
cleanup() {
  local rc=$?
  stop_all
  if [ "$rc" = 0 ] && [ "$keep" = 0 ]; then
    rm -rf "$scratch"/*/data
  else
    echo "clusters stopped; data directories and logs left in $scratch" >&2
  fi
}
if [ -n "$(ls -A "$scratch" 2>/dev/null)" ] && [ ! -e "$scratch/.replication_pg" ]; then
  echo "$scratch is not empty and was not made by this program: remove it or pick another --scratch" >&2
  exit 2
fi
stop_all   # clusters an interrupted earlier run may have left
rm -rf "$scratch"
mkdir -p "$scratch" "$results"
touch "$scratch/.replication_pg"
[ "$(id -u)" = 0 ] && chown postgres: "$scratch"
trap cleanup EXIT
trap 'exit 130' INT TERM

psql_n() { local n=$1; shift; PGOPTIONS="-c client_min_messages=warning" "$pg" psql "$(node "$n")" -qAt "$@"; }

raw="$results/replication.raw.csv"
echo "workload,config,tables,replication,transport,standbys,commit_mode,seconds,transactions,commits,tps,p50_ms,p99_ms,write_p50_ms,write_p99_ms,standby_recv_cpu,standby_replay_cpu,standby_other_cpu,primary_sender_cpu,primary_cpu,status" >"$raw"

# tables replication transport standbys commit_mode of a configuration name.
describe() {
  local c=$1 mode
  case "$c" in
    slip-local*) echo "slipstream none - 0 local" ;;
    heap-local*) echo "heap none - 0 local" ;;
    tw-*)
      IFS=- read -r _ t n m <<<"$c"
      echo "slipstream tailwind $t $n remote_$m" ;;
    twd-*)
      IFS=- read -r _ t n m <<<"$c"
      echo "slipstream tailwind-deferred $t $n remote_$m" ;;
    tws-*)
      IFS=- read -r _ t n m <<<"$c"
      echo "slipstream tailwind-shipper $t $n remote_$m" ;;
    sr-*)
      IFS=- read -r _ am n m <<<"$c"
      [ "$am" = slip ] && am=slipstream
      mode=$([ "$m" = write ] && echo remote_write || echo on)
      echo "$am streaming - $n $mode" ;;
  esac
}

# --- CPU accounting -----------------------------------------------------------------------
# "pid role ticks" for the postmaster of node $1 (role self: its own time and its reaped
# children's, so backends that exit during a run still count) and each of its children. $2 is
# what the node is (primary, tailwind, streaming): every node runs an idle "slipstream backup
# server", which is the receiver only on a Tailwind backup.
cpu_snapshot() {
  local dir pm pid args role t what=$2
  dir=$(node "$1")
  pm=$(head -1 "$dir/data/postmaster.pid")
  t=$(sed 's/^.*) //' "/proc/$pm/stat" | awk '{ print $12 + $13 + $14 + $15 }')
  echo "$pm self $t"
  while read -r pid args; do
    case "$what:$args" in
      tailwind:*"slipstream backup"*|streaming:*walreceiver*) role=recv ;;
      tailwind:*startup*|streaming:*startup*) role=replay ;;
      primary:*"slipstream shipper"*|primary:*walsender*) role=sender ;;
      *) role=other ;;
    esac
    t=$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | awk '{ print $12 + $13 }') || true
    [ -n "$t" ] && echo "$pid $role $t"
  done < <(ps --ppid "$pm" -o pid=,args=)
}
# Ticks between two snapshots, by role: "recv replay sender other total".
cpu_delta() {
  awk 'NR == FNR { before[$1] = $3; next }
       { d = $3 - (($1 in before) ? before[$1] : 0); if (d < 0) d = $3; r[$2] += d; total += d }
       END { print r["recv"] + 0, r["replay"] + 0, r["sender"] + 0, r["other"] + r["self"], total + 0 }' "$1" "$2"
}

# --- nodes --------------------------------------------------------------------------------
primary=""      # the current primary's node name (slip-primary, heap-primary)
standbys=()     # the node names of the standbys the current configuration keeps in sync
kind=none       # how they are kept in sync: tailwind, streaming (none: no standbys)

init_primary() {
  local n=$1 am=$2 dir
  dir=$(node "$n")
  log "$n: initdb, pgbench -i -s $scale and $records YCSB records on $am tables"
  "$pg" init "$dir" "${port[$n]}" "shared_buffers = 512MB" "slipstream.l0_size = 32MB" \
    "max_wal_size = 4GB" "checkpoint_timeout = 30min" "wal_keep_size = 4GB" \
    "slipstream.backup_timeout = 5s" >/dev/null
  "$pg" start "$dir"
  psql_n "$n" -c "CREATE EXTENSION slipstream" >/dev/null
  PGOPTIONS="-c default_table_access_method=$am" "$pgbench" -h "$dir/sock" -p "${port[$n]}" -U postgres \
    -i -q -s "$scale" postgres >"$dir/pgbench-init.log" 2>&1 || { cat "$dir/pgbench-init.log" >&2; return 1; }
  psql_n "$n" -c "CREATE TABLE usertable (ycsb_key bigint PRIMARY KEY, field0 text) USING $am" \
    -c "INSERT INTO usertable SELECT k, left(repeat(md5(k::text), $((value_size / 32 + 1))), $value_size)
        FROM generate_series(1, $records) k" \
    -c "VACUUM ANALYZE" >/dev/null
  primary=$n
  standbys=()
  kind=none
  settle
  for w in ${workloads//,/ }; do
    log "$n: warm-up, $w for $warmup s (not measured)"
    workload_scripts "$w" "$dir"
    "$pgbench" -h "$dir/sock" -p "${port[$n]}" -U postgres -n -c "$clients" -j "$clients" -T "$warmup" \
      -M prepared "${script_args[@]+"${script_args[@]}"}" postgres >"$dir/warmup-$w.log" 2>&1 ||
      { cat "$dir/warmup-$w.log" >&2; return 1; }
  done
  settle
}

# Waits (at most 2 minutes) until the engine's background work after a load has stopped: its
# compaction and GC counters unchanged for 3 s.
settle() {
  local prev="" cur stable=0 i
  for i in $(seq 1 120); do
    cur=$(psql_n "$primary" -c "SELECT string_agg(value::text, ' ' ORDER BY name) FROM slipstream.engine
                                WHERE name IN ('compactions', 'compaction_bytes_written', 'gc_runs')")
    if [ "$cur" = "$prev" ]; then stable=$((stable + 1)); else stable=0; fi
    [ "$stable" -ge 3 ] && return 0
    prev=$cur
    sleep 1
  done
}

# Seeds standby $2 (s1, s2) of the current primary with scripts/seed_backup.sh ($3 = 1 adds
# --streaming), starts it and, for a Tailwind backup, makes it serve.
seed_standby() {
  local n=$1 name=$2 streaming=$3 dir pdir args
  dir=$(node "$n")
  pdir=$(node "$primary")
  "$pg" stop "$dir" immediate >/dev/null 2>&1 || true
  rm -rf "$dir"
  mkdir -p "$dir/sock"
  [ "$(id -u)" = 0 ] && chown -R postgres: "$dir"
  args=(--connstring "host=$pdir/sock port=${port[$primary]} user=postgres dbname=postgres"
        --datadir "$dir/data" --name "$name" --set "port = ${port[$n]}"
        --set "unix_socket_directories = '$dir/sock'" --set "cluster_name = '$name'")
  [ "$streaming" = 1 ] && args+=(--streaming)
  local t0=$SECONDS
  as_postgres "$root/scripts/seed_backup.sh" "${args[@]}" >"$dir/seed.log" 2>&1 ||
    { cat "$dir/seed.log" >&2; return 1; }
  "$pg" start "$dir" || { tail -20 "$dir/server.log" >&2; return 1; }
  if [ "$streaming" = 0 ]; then
    psql_n "$n" -c "SELECT slipstream.serve_backup('127.0.0.1:$(serve_port "$name")', '$secret', 16, '8MB')" \
      >/dev/null || return 1
  fi
  log "seeded $n as $([ "$streaming" = 1 ] && echo "a streaming standby" || echo "a Tailwind backup") in $((SECONDS - t0)) s"
}

start_node() {
  local dir
  dir=$(node "$1")
  [ -f "$dir/data/postmaster.pid" ] && return 0
  "$pg" start "$dir"
}
stop_node() {
  local dir
  dir=$(node "$1")
  [ -f "$dir/data/postmaster.pid" ] || return 0
  "$pg" stop "$dir" fast
}

# Waits until every standby in $standbys has replayed the primary's WAL up to its flush position.
# A backup in deferred replay holds replay paused: resuming it replays the batch it holds.
wait_caught_up() {
  local target s i
  target=$(psql_n "$primary" -c "SELECT pg_current_wal_flush_lsn()")
  for s in "${standbys[@]+"${standbys[@]}"}"; do
    for i in $(seq 1 1200); do
      [ "$(psql_n "$s" -c "SELECT pg_get_wal_replay_pause_state()" 2>/dev/null)" = "not paused" ] ||
        psql_n "$s" -c "SELECT pg_wal_replay_resume()" >/dev/null 2>&1 || true
      [ "$(psql_n "$s" -c "SELECT pg_last_wal_replay_lsn() >= '$target'" 2>/dev/null)" = t ] && break
      if [ "$i" = 1200 ]; then
        echo "$s did not replay up to $target in 120 s (at $(psql_n "$s" -c "SELECT pg_last_wal_replay_lsn()"))" >&2
        tail -5 "$(node "$s")/server.log" >&2
        return 1
      fi
      sleep 0.1
    done
  done
}

set_primary_conf() { # name value (SQL literal)
  psql_n "$primary" -c "ALTER SYSTEM SET $1 = $2" -c "SELECT pg_reload_conf()" >/dev/null
  sleep 0.5
}

# Tailwind: ships to exactly the backups s1..s$2 of the current table type over transport $1,
# slipstream.min_sync_backups = $2; waits until they stream and have replayed everything.
tw_set() {
  local transport=$1 count=$2 prefix=${primary%-primary} want=() name cur_t i state
  for i in $(seq 1 "$count"); do want+=("s$i"); done
  while IFS='|' read -r name cur_t; do
    [ -n "$name" ] || continue
    if [[ " ${want[*]} " != *" $name "* ]] || [ "$cur_t" != "$transport" ]; then
      psql_n "$primary" -c "SELECT slipstream.drop_backup('$name')" >/dev/null
    fi
  done < <(psql_n "$primary" -c "SELECT name, transport FROM slipstream.replication")
  for name in "${want[@]}"; do
    if [ -z "$(psql_n "$primary" -c "SELECT 1 FROM slipstream.replication WHERE name = '$name'")" ]; then
      psql_n "$primary" -c "SELECT slipstream.add_backup('$name', '127.0.0.1:$(serve_port "$name")', '$transport', '$secret')" >/dev/null
    fi
  done
  set_primary_conf slipstream.min_sync_backups "$count"
  standbys=()
  kind=tailwind
  for name in "${want[@]}"; do
    for i in $(seq 1 600); do
      state=$(psql_n "$primary" -c "SELECT state FROM slipstream.replication WHERE name = '$name'")
      [ "$state" = streaming ] && break
      if [ "$i" = 600 ]; then
        echo "backup $name never streamed over $transport: $(psql_n "$primary" -c "SELECT state, error FROM slipstream.replication WHERE name = '$name'")" >&2
        tail -5 "$(node "$prefix-$name")/server.log" >&2
        return 1
      fi
      sleep 0.1
    done
    standbys+=("$prefix-$name")
  done
  wait_caught_up
}
tw_drop_all() {
  local name
  for name in $(psql_n "$primary" -c "SELECT name FROM slipstream.replication"); do
    psql_n "$primary" -c "SELECT slipstream.drop_backup('$name')" >/dev/null
  done
  psql_n "$primary" -c "ALTER SYSTEM RESET slipstream.min_sync_backups" -c "SELECT pg_reload_conf()" >/dev/null
  standbys=()
}

# Streaming: standbys s1..s$1 of the current table type run (the others are stopped) and are
# synchronous: synchronous_standby_names = 'ANY n (...)'; waits until they stream and caught up.
sr_set() {
  local count=$1 prefix=${primary%-primary} names=() i list
  for i in 1 2; do
    if [ "$i" -le "$count" ]; then start_node "$prefix-s$i"; names+=("s$i"); else stop_node "$prefix-s$i"; fi
  done
  list=$(IFS=,; echo "${names[*]}")
  set_primary_conf synchronous_standby_names "'ANY $count (${list//,/, })'"
  for i in $(seq 1 1200); do
    [ "$(psql_n "$primary" -c "SELECT count(*) FROM pg_stat_replication
          WHERE application_name IN ('${list//,/\',\'}') AND state = 'streaming' AND sync_state IN ('sync', 'quorum')")" = "$count" ] && break
    if [ "$i" = 1200 ]; then
      echo "the standbys $list are not synchronous: $(psql_n "$primary" -c "SELECT application_name, state, sync_state FROM pg_stat_replication")" >&2
      return 1
    fi
    sleep 0.1
  done
  standbys=()
  kind=streaming
  for i in "${names[@]}"; do standbys+=("$prefix-$i"); done
  wait_caught_up
}
sr_reset() {
  psql_n "$primary" -c "ALTER SYSTEM RESET synchronous_standby_names" -c "SELECT pg_reload_conf()" >/dev/null
  standbys=()
}

# --- runs ---------------------------------------------------------------------------------
# Writes the pgbench scripts of workload $1 into directory $2 and sets script_args to the
# pgbench arguments that run it. YCSB A is two scripts of weight 50 (pgbench picks one per
# transaction), so the log tells reads (script 0) from updates (script 1).
workload_scripts() {
  local w=$1 dir=$2
  script_args=()
  [ "$w" = ycsb-a ] || return 0
  cat >"$dir/ycsb-read.sql" <<SQL
\\set z random_zipfian(1, $records, 1.01)
\\set key (:z * 2654435761) % $records + 1
SELECT field0 FROM usertable WHERE ycsb_key = :key;
SQL
  cat >"$dir/ycsb-update.sql" <<SQL
\\set z random_zipfian(1, $records, 1.01)
\\set key (:z * 2654435761) % $records + 1
UPDATE usertable SET field0 = left(repeat(md5(random()::text), $((value_size / 32 + 1))), $value_size) WHERE ycsb_key = :key;
SQL
  script_args=(-f "$dir/ycsb-read.sql@50" -f "$dir/ycsb-update.sql@50")
}

# Runs workload $2 of configuration $1 on the current primary with PGOPTIONS $3; appends a row.
run_one() {
  local config=$1 w=$2 options=$3 dir pdir out s tx tps lat cpu_p cpu_s n
  local -a desc
  read -ra desc <<<"$(describe "$config")"
  dir="$scratch/runs/$config-$w"
  pdir=$(node "$primary")
  rm -rf "$dir" && mkdir -p "$dir"
  psql_n "$primary" -c "CHECKPOINT" >/dev/null
  wait_caught_up || return 1
  # No dirty pages of earlier runs (or of removed data directories) left to write back while
  # commits wait for fsync.
  sync
  cpu_snapshot "$primary" primary >"$dir/cpu.primary.before"
  for s in "${standbys[@]+"${standbys[@]}"}"; do cpu_snapshot "$s" "$kind" >"$dir/cpu.$s.before"; done
  workload_scripts "$w" "$dir"
  if ! out=$(cd "$dir" && PGOPTIONS="$options" timeout $((seconds * 4 + 120)) "$pgbench" -h "$pdir/sock" \
      -p "${port[$primary]}" -U postgres -n -c "$clients" -j "$clients" -T "$seconds" -M prepared \
      -l --log-prefix="$dir/log" "${script_args[@]+"${script_args[@]}"}" postgres 2>&1); then
    echo "$out" | tail -5 >&2
    return 1
  fi
  echo "$out" >"$dir/pgbench.out"
  wait_caught_up || return 1
  cpu_snapshot "$primary" primary >"$dir/cpu.primary.after"
  for s in "${standbys[@]+"${standbys[@]}"}"; do cpu_snapshot "$s" "$kind" >"$dir/cpu.$s.after"; done

  tx=$(echo "$out" | sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p')
  tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -1)
  [ -n "$tx" ] && [ "$tx" -gt 0 ] || { echo "pgbench processed no transaction: $out" >&2; return 1; }
  # pgbench log lines: client transaction latency_us script time_s time_us. "lat": p50 and p99
  # of every transaction, then of the writing ones (TPC-B: all; YCSB A: the updates, script 1),
  # then how many wrote (the commits).
  local write_script=-1
  [ "$w" = ycsb-a ] && write_script=1
  lat=$(for which in all write; do
      cat "$dir"/log* | awk -v which="$which" -v ws="$write_script" \
        'which == "all" || ws < 0 || $4 == ws { print $3 }' | sort -n | awk '
        { v[NR] = $1 }
        END {
          i50 = int(NR * 0.50); if (i50 < 1) i50 = 1
          i99 = int(NR * 0.99); if (i99 < 1) i99 = 1
          printf "%.3f %.3f %d ", v[i50] / 1000, v[i99] / 1000, NR
        }'
    done)
  :
  cpu_p=$(cpu_delta "$dir/cpu.primary.before" "$dir/cpu.primary.after")
  n=${#standbys[@]}
  if [ "$n" -gt 0 ]; then
    cpu_s=$(for s in "${standbys[@]}"; do cpu_delta "$dir/cpu.$s.before" "$dir/cpu.$s.after"; done |
      awk '{ r += $1; p += $2; o += $3 + $4 } END { print r, p, o }')
  else
    cpu_s="- - -"
  fi
  # CPU seconds per 1,000 commits (transactions that wrote; standby columns: the mean over
  # the standbys).
  awk -v w="$w" -v c="$config" -v d="${desc[*]}" -v secs="$seconds" -v tx="$tx" -v tps="$tps" \
      -v lat="$lat" -v cs="$cpu_s" -v cp="$cpu_p" -v n="$n" -v hz="$clk_tck" 'BEGIN {
    split(d, a, " "); split(lat, l, " "); split(cs, s, " "); split(cp, p, " ")
    commits = l[6]
    k = commits > 0 ? 1000 / commits / hz : 0
    printf "%s,%s,%s,%s,%s,%s,%s,%s,%d,%d,%.1f,%s,%s,%s,%s,", w, c, a[1], a[2], a[3], a[4], a[5], secs,
      tx, commits, tps, l[1], l[2], l[4], l[5]
    if (n > 0) printf "%.4f,%.4f,%.4f,", s[1] * k / n, s[2] * k / n, s[3] * k / n
    else printf "-,-,-,"
    printf "%.4f,%.4f,ok\n", p[3] * k, p[5] * k
  }' >>"$raw"
  log "$(tail -1 "$raw" | awk -F, '{ printf "%-16s %-7s %7.0f tps  p50/p99 %s/%s ms (writes %s/%s)  standby recv/replay/other %s/%s/%s  primary %s  (CPU s per 1k commits)", $2, $1, $11, $12, $13, $14, $15, $16, $17, $18, $20 }')"
}

failed=0
# Runs every selected workload of configuration $1 (PGOPTIONS $2) if it is selected; a failure
# is recorded in a row. run_always runs it in any case (the baselines).
run_config() {
  selected "$1" || return 0
  run_always "$@"
}
run_always() {
  local config=$1 options=$2 w
  for w in ${workloads//,/ }; do
    if ! run_one "$config" "$w" "$options"; then
      fail_config "$config" "run failed"
      return 0
    fi
  done
}
fail_config() {
  local config=$1 why=$2 w
  local -a desc
  read -ra desc <<<"$(describe "$config")"
  for w in ${workloads//,/ }; do
    echo "$w,$config,${desc[0]},${desc[1]},${desc[2]},${desc[3]},${desc[4]},$seconds,0,0,0,-,-,-,-,-,-,-,-,-,failed: $why" >>"$raw"
  done
  log "$config FAILED: $why"
  failed=1
}
# Fails every selected configuration matching pattern $1.
fail_matching() {
  local c
  for c in "${all_configs[@]}"; do
    # shellcheck disable=SC2053
    [[ $c == $1 ]] && selected "$c" && fail_config "$c" "$2"
  done
  return 0
}

mode_options() { # commit_mode name of a configuration -> PGOPTIONS
  case "$1" in
    remote_memory|remote_flush) echo "-c slipstream.commit_mode=$1" ;;
    remote_write|on) echo "-c synchronous_commit=$1" ;;
    *) echo "" ;;
  esac
}

# The streaming configurations of table type $1 (slip, heap) on the current primary.
streaming_phase() {
  local am=$1 prefix=${primary%-primary} need2=0 n m
  any_selected "sr-$am-*" || return 0
  any_selected "sr-$am-2-*" && need2=1
  sr_reset
  log "streaming replication on $am tables: seeding standbys"
  if ! seed_standby "$prefix-s1" s1 1 || { [ "$need2" = 1 ] && ! seed_standby "$prefix-s2" s2 1; }; then
    fail_matching "sr-$am-*" "seeding a streaming standby failed"
    return 0
  fi
  for n in 2 1; do
    any_selected "sr-$am-$n-*" || continue
    if ! sr_set "$n"; then
      fail_matching "sr-$am-$n-*" "the standbys did not become synchronous"
      continue
    fi
    for m in write on; do
      run_config "sr-$am-$n-$m" "$(mode_options "$([ $m = write ] && echo remote_write || echo on)")"
    done
  done
  sr_reset
  stop_node "$prefix-s1"
  stop_node "$prefix-s2"
}

# --- slipstream tables --------------------------------------------------------------------
if any_selected 'slip-local*' || any_selected 'tw-*' || any_selected 'twd-*' || any_selected 'tws-*' || any_selected 'sr-slip-*'; then
  phase_start=$SECONDS
  init_primary slip-primary slipstream
  log "slip-local: the slipstream baseline"
  run_always slip-local ""

  if any_selected 'tw-*' || any_selected 'twd-*' || any_selected 'tws-*'; then
    log "Tailwind backups: seeding"
    need2=0
    { any_selected 'tw-*-2-*' || any_selected 'twd-*-2-*' || any_selected 'tws-*-2-*'; } && need2=1
    if ! seed_standby slip-s1 s1 0 || { [ "$need2" = 1 ] && ! seed_standby slip-s2 s2 0; }; then
      fail_matching 'tw*-*' "seeding a Tailwind backup failed"
    else
      for family in tw twd tws; do
        any_selected "$family-*" || continue
        replay=$([ "$family" = twd ] && echo deferred || echo continuous)
        for s in slip-s1 slip-s2; do
          [ -f "$(node "$s")/data/postmaster.pid" ] || continue
          psql_n "$s" -c "ALTER SYSTEM SET slipstream.backup_replay = $replay" -c "SELECT pg_reload_conf()" >/dev/null
        done
        for t in shm tcp; do
          for n in 2 1; do
            any_selected "$family-$t-$n-*" || continue
            if ! tw_set "$t" "$n"; then
              fail_matching "$family-$t-$n-*" "the backups did not stream"
              continue
            fi
            for m in memory flush; do
              if [ "$family" = tws ]; then
                # The shipper places every commit (no placement by committing backends, which
                # happens only over shm in remote_memory).
                [ "$t" = shm ] && [ "$m" = memory ] || continue
                run_config "$family-$t-$n-$m" "$(mode_options "remote_$m") -c slipstream.backend_placement=off"
              else
                run_config "$family-$t-$n-$m" "$(mode_options "remote_$m")"
              fi
            done
          done
        done
      done
    fi
    tw_drop_all
    stop_node slip-s1
    stop_node slip-s2
  fi

  streaming_phase slip
  log "slip-local-end: the slipstream baseline again, after the replicated runs"
  run_always slip-local-end ""
  stop_node slip-primary
  log "slipstream phase: $((SECONDS - phase_start)) s"
fi

# --- heap tables --------------------------------------------------------------------------
if any_selected 'heap-local*' || any_selected 'sr-heap-*'; then
  phase_start=$SECONDS
  init_primary heap-primary heap
  log "heap-local: the heap baseline"
  run_always heap-local ""
  streaming_phase heap
  log "heap-local-end: the heap baseline again, after the replicated runs"
  run_always heap-local-end ""
  stop_node heap-primary
  log "heap phase: $((SECONDS - phase_start)) s"
fi

# --- report -------------------------------------------------------------------------------
csv="$results/replication.csv"
md="$results/replication.md"
order=$(IFS=,; echo "${all_configs[*]}")
# The rows in report order with the ratio to the baseline of the same workload and tables.
awk -F, -v OFS=, -v order="$order" '
  NR == FNR { if (FNR > 1 && $21 == "ok" && $4 == "none") { sum[$1 "," $3] += $11; cnt[$1 "," $3]++ }; next }
  FNR == 1 { $11 = $11 OFS "tps_ratio"; print; next }
  {
    b = cnt[$1 "," $3] ? sum[$1 "," $3] / cnt[$1 "," $3] : 0
    ratio = ($21 == "ok" && b > 0) ? sprintf("%.3f", $11 / b) : "-"
    $11 = $11 OFS ratio
    print
  }' "$raw" "$raw" >"$csv.unsorted"
n_order=$(echo "$order" | tr , '\n' | awk '{ printf "%s%s:%d", (NR > 1 ? "," : ""), $1, NR }')
{ head -1 "$csv.unsorted"
  tail -n +2 "$csv.unsorted" | awk -F, -v m="$n_order" -v w="$workloads" '
    BEGIN { n = split(m, a, ","); for (i = 1; i <= n; i++) { split(a[i], kv, ":"); idx[kv[1]] = kv[2] }
            n = split(w, b, ","); for (i = 1; i <= n; i++) widx[b[i]] = i }
    { printf "%02d %02d %s\n", widx[$1], idx[$2], $0 }' | sort | cut -d" " -f3-
} >"$csv"
rm -f "$csv.unsorted"

workload_title() {
  case "$1" in
    tpcb) echo "pgbench TPC-B (scale $scale)" ;;
    ycsb-a) echo "YCSB A: 50% point reads, 50% updates, zipfian ($records records of $value_size B)" ;;
  esac
}
{
  echo "Replication benchmark: $clients clients, ${seconds} s per run, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  for w in ${workloads//,/ }; do
    echo
    echo "### $(workload_title "$w")"
    echo
    echo "| config | tables | replication | standbys | commit | tps | ratio | p50 / p99 ms | writes p50 / p99 ms | standby recv | standby replay | standby other | primary sender | primary all |"
    echo "|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    awk -F, -v w="$w" '$1 == w {
      repl = ($4 == "tailwind") ? "Tailwind " $5 : ($4 == "tailwind-deferred" ? "Tailwind " $5 ", deferred replay" : ($4 == "tailwind-shipper" ? "Tailwind " $5 ", shipper places" : ($4 == "streaming" ? "streaming" : "none")))
      if ($22 != "ok") { printf "| %s | %s | %s | %s | %s | %s |  |  |  |  |  |  |  |  |\n", $2, $3, repl, $6, $7, $22; next }
      printf "| %s | %s | %s | %s | %s | %.0f | %s | %s / %s | %s / %s | %s | %s | %s | %s | %s |\n",
        $2, $3, repl, $6, $7, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21
    }' "$csv"
  done
  echo
  echo "CPU columns: CPU seconds per 1,000 commits (transactions that wrote: TPC-B all, YCSB A the updates); standby columns are per standby (the mean over the standbys)."
} >"$md"
echo
cat "$md"
echo
echo "CSV: $csv; table: $md"

# The plot: tps ratio of every replicated configuration, one bar per workload.
if [ "$plot" != none ]; then
  ratios="$results/replication_ratios.csv"
  awk -F, -v w="$workloads" '
    BEGIN { nw = split(w, ws, ",") }
    NR > 1 && $4 != "none" { if (!($2 in seen)) { seen[$2] = 1; names[++n] = $2 } r[$2, $1] = ($12 == "-" ? "NaN" : $12) }
    END {
      printf "config"; for (i = 1; i <= nw; i++) printf ",%s", ws[i]; printf "\n"
      for (j = 1; j <= n; j++) {
        printf "%s", names[j]
        for (i = 1; i <= nw; i++) printf ",%s", ((names[j], ws[i]) in r ? r[names[j], ws[i]] : "NaN")
        printf "\n"
      }
    }' "$csv" >"$ratios"
  if [ "$(wc -l <"$ratios")" -gt 1 ] && command -v gnuplot >/dev/null; then
    gnuplot -e "data='$ratios'; out='$plot'; workloads='${workloads//,/ }'; subtitle='$clients clients, ${seconds} s per run, TPC-B scale $scale, YCSB $records records'" \
      "$root/scripts/plot_replication.gp" && echo "plot: $plot"
  elif ! command -v gnuplot >/dev/null; then
    echo "no gnuplot (Debian gnuplot-nox): no plot"
  fi
fi
log "done in $(( $(date +%s) - started )) s"
[ "$failed" = 0 ] || { echo "some configurations failed (see the status column)" >&2; exit 1; }
