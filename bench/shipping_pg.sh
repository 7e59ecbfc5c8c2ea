#!/usr/bin/env bash
# shipping_pg.sh: what a replica costs with index shipping (Anthus Send-Index) against one that
# builds its own index (Build-Index), through PostgreSQL, in one run on one machine (issue 10).
#
# For each transport (shm, tcp) and each mode a fresh primary and one Tailwind backup (a
# standby seeded by scripts/seed_backup.sh, fed WAL by one-sided writes):
#   build      Build-Index: the backup replays every slipstream record into its own engine
#              and compacts for itself (add_backup(..., 'build_index'))
#   send       Send-Index: the backup imports the primary's compactions (seed_backup.sh
#              --send-index, slipstream.backup_engine = import; add_backup(..., 'send_index'))
#   send-lz4   the same with the index stream LZ4-compressed (add_backup(..., 'send_index', true))
# on which run, in order, YCSB Load then YCSB A for each value-size mix (SD, MD, LD; a table per
# mix) and pgbench's TPC-B (tpcb-like on slipstream tables made by pgbench -i before the seed),
# every client session in slipstream.commit_mode = remote_memory (min_sync_backups = 1).
# Then the primary is SIGKILLed and the backup takes over: slipstream.promote(60), the first
# read, a count(*) of every table (checked against the primary's).
#
# Per run it reports the primary's throughput and, on the backup, from before the run until
# it has caught up after it (its replay at the primary's flush position, then its engine's
# compaction counters, or for Send-Index the primary's index lag at 0 and the backup's
# installed compactions, unchanged for 2 s):
#   - CPU: utime + stime of the backup's postmaster and every child (cutime + cstime of the
#     postmaster for those that exited), /proc/PID/stat, in microseconds per operation
#     (operation = a pgbench transaction: one insert in Load, a read or an update in A, a
#     TPC-B transaction);
#   - device bytes read and written: read_bytes and write_bytes of /proc/PID/io over the same
#     processes (the postmaster's includes its reaped children). write_bytes is the kernel's
#     count of page-cache memory dirtied, which overstates small overwrites of allocated files
#     (pg_wal segments, the engine's device file) on kernels with large folios (see
#     docs/benchmarks.md); for a Build-Index backup also the engine's own device counters
#     (slipstream.engine device_bytes_read / _written: what it read and wrote through its device
#     layer, page cache hits included; an importing backup's engine cannot be queried);
#   - network bytes: WAL shipped (the primary's sent_lsn for the backup, before and after)
#     plus the index stream as sent (index_bytes of slipstream.replication; index_raw_bytes
#     before LZ4).
# A last step (--promote-gb) loads about N GB of user data (SD mix rows, in batches, commit
# mode local) into one table on a primary with a Build-Index and a Send-Index backup (tcp;
# shm if --transports has no tcp), measures that load as workload bulk-SD (both backups at
# once), waits until both caught up (and the Send-Index one is promotable), kills the primary
# and times the takeover of each, one after the other.
#
# Values: 20, 300 or 1500 B by the mix (bench/ycsb_pg.sh's classes); --values=random (the
# default) makes every 32 characters of a value from their own md5 (hex digits without
# repeats, which LZ4 barely shrinks), --values=repeat repeats one md5 as bench/ycsb_pg.sh does
# (which LZ4 squeezes about 10x).
#
#   bench/shipping_pg.sh [--mixes=SD,MD,LD,tpcb] [--transports=shm,tcp]
#       [--modes=build,send,send-lz4] [--seconds=10] [--records=40000] [--scale=5]
#       [--clients=2] [--l0-size=4MB] [--values=random|repeat] [--promote-gb=1] [--quick]
#       [--base-port=57000] [--scratch=/tmp/slipstream-bench-shipping]
#       [--results=results/shipping] [--plot=docs/shipping_bench.png|none] [--keep]
#       [--report-only]
#
# --quick is a smoke run (about 3.5 minutes): --mixes=SD,tpcb --seconds=3 --records=5000
# --scale=1 --promote-gb=0.05, the plot into the results directory (later options win).
# --promote-gb=0 skips the last step; --mixes= (empty) runs only it. Ports: base .. base + 4
# for the clusters, base + 11, + 13, + 14 for the backups' Tailwind servers.
# Results: RESULTS/shipping.csv (one row per run), RESULTS/promotion.csv, RESULTS/shipping.md
# (the tables printed at the end) and the plot (scripts/plot_shipping.gp, if gnuplot is
# installed). The clusters are always stopped; their data directories are removed after a run
# without failures unless --keep. --report-only prints the tables and draws the plot again from
# the CSV files in the results directory (give the run's other options for the headings).
# Needs the extension installed (make install); `make bench-shipping` does both.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mixes=SD,MD,LD,tpcb
transports=shm,tcp
modes=build,send,send-lz4
seconds=10
records=40000
scale=5
clients=2
l0_size=4MB
values=random
promote_gb=1
base=57000
scratch=${SLIPSTREAM_SCRATCH:-/tmp/slipstream-bench-shipping}
results="$root/results/shipping"
plot=""
keep=0
report_only=0
for arg in "$@"; do
  case "$arg" in
    --mixes=*) mixes=${arg#*=} ;;
    --transports=*) transports=${arg#*=} ;;
    --modes=*) modes=${arg#*=} ;;
    --seconds=*) seconds=${arg#*=} ;;
    --records=*) records=${arg#*=} ;;
    --scale=*) scale=${arg#*=} ;;
    --clients=*) clients=${arg#*=} ;;
    --l0-size=*) l0_size=${arg#*=} ;;
    --values=*) values=${arg#*=} ;;
    --promote-gb=*) promote_gb=${arg#*=} ;;
    --quick) mixes=SD,tpcb; seconds=3; records=5000; scale=1; promote_gb=0.05; [ -n "$plot" ] || plot=quick ;;
    --base-port=*) base=${arg#*=} ;;
    --scratch=*) scratch=${arg#*=} ;;
    --results=*) results=${arg#*=} ;;
    --plot=*) plot=${arg#*=} ;;
    --keep) keep=1 ;;
    --report-only) report_only=1 ;;
    -h|--help) sed -n '2,60p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument $arg (see bench/shipping_pg.sh --help)" >&2; exit 2 ;;
  esac
done
case "$plot" in
  "") plot="$root/docs/shipping_bench.png" ;;
  quick) plot="$results/shipping_bench.png" ;;
esac
mkdir -p "$results"
results=$(cd "$results" && pwd)
for m in ${mixes//,/ }; do
  case "$m" in SD|MD|LD|tpcb) ;; *) echo "unknown mix $m (SD, MD, LD, tpcb)" >&2; exit 2 ;; esac
done
for t in ${transports//,/ }; do
  case "$t" in shm|tcp) ;; *) echo "unknown transport $t (shm, tcp)" >&2; exit 2 ;; esac
done
for m in ${modes//,/ }; do
  case "$m" in build|send|send-lz4) ;; *) echo "unknown mode $m (build, send, send-lz4)" >&2; exit 2 ;; esac
done
case "$values" in random|repeat) ;; *) echo "--values=$values: random or repeat" >&2; exit 2 ;; esac
awk -v g="$promote_gb" 'BEGIN { exit !(g >= 0) }' || { echo "--promote-gb=$promote_gb: a number >= 0" >&2; exit 2; }

pg="$root/scripts/pg_cluster.sh"
pgbin=/usr/lib/postgresql/15/bin
pgbench="$pgbin/pgbench"
secret="bench-$RANDOM$RANDOM$RANDOM"
clk_tck=$(getconf CLK_TCK)
started=$(date +%s)

as_postgres() { if [ "$(id -un)" = postgres ]; then "$@"; else runuser -u postgres -- "$@"; fi; }
log() { echo "[$(date +%H:%M:%S)] $*"; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }

[ -x "$pgbench" ] || { echo "no $pgbench: run make install (or make deps) first" >&2; exit 1; }
[ -f "$($pgbin/pg_config --pkglibdir 2>/dev/null || echo /usr/lib/postgresql/15/lib)/slipstream.so" ] ||
  { echo "the slipstream module is not installed: run make install first" >&2; exit 1; }

node() { echo "$scratch/$1"; }
declare -A port=([primary]=$base [replica]=$((base + 1)) [gb-primary]=$((base + 2))
                 [gb-build]=$((base + 3)) [gb-send]=$((base + 4)))
declare -A serve=([replica]=$((base + 11)) [gb-build]=$((base + 13)) [gb-send]=$((base + 14)))

stop_all() {
  local d
  for d in "$scratch"/*/; do
    [ -f "$d/data/postmaster.pid" ] && "$pg" stop "${d%/}" immediate >/dev/null 2>&1 || true
  done
}
failed=0
cleanup() {
  local rc=$?
  sess_close_all
  stop_all
  if [ "$rc" = 0 ] && [ "$failed" = 0 ] && [ "$keep" = 0 ]; then
    rm -rf "$scratch"/*/data
  else
    echo "clusters stopped; data directories and logs left in $scratch" >&2
  fi
}
if [ "$report_only" = 0 ]; then
if [ -n "$(ls -A "$scratch" 2>/dev/null)" ] && [ ! -e "$scratch/.shipping_pg" ]; then
  echo "$scratch is not empty and was not made by this program: remove it or pick another --scratch" >&2
  exit 2
fi
stop_all   # clusters an interrupted earlier run may have left
rm -rf "$scratch"
mkdir -p "$scratch"
touch "$scratch/.shipping_pg"
[ "$(id -u)" = 0 ] && chown postgres: "$scratch"
trap cleanup EXIT
trap 'exit 130' INT TERM
fi

psql_n() { PGOPTIONS="-c client_min_messages=warning" "$pg" psql "$(node "$1")" -qAt "${@:2}"; }

# --- sessions -----------------------------------------------------------------------------
# A persistent psql session per node for the polling, so that waiting for a backup does not
# fork a backend on it (a few ms of its CPU) several times a second.
declare -A s_in=() s_out=() s_pid=()
sess_open() { # key node
  local key=$1 f="$scratch/.sess-$1" fd
  sess_close "$key"
  rm -f "$f.in" "$f.out"
  mkfifo "$f.in" "$f.out"
  PGOPTIONS="-c client_min_messages=warning" "$pg" psql "$(node "$2")" -qAt -v ON_ERROR_STOP=0 \
    <"$f.in" >"$f.out" 2>&1 &
  s_pid[$key]=$!
  exec {fd}>"$f.in"
  s_in[$key]=$fd
  exec {fd}<"$f.out"
  s_out[$key]=$fd
}
sess_close() {
  local key=$1
  [ -n "${s_pid[$key]:-}" ] || return 0
  eval "exec ${s_in[$key]}>&-" 2>/dev/null || true
  eval "exec ${s_out[$key]}<&-" 2>/dev/null || true
  kill "${s_pid[$key]}" 2>/dev/null || true
  wait "${s_pid[$key]}" 2>/dev/null || true
  unset "s_pid[$key]" "s_in[$key]" "s_out[$key]"
}
sess_close_all() {
  local k
  for k in "${!s_pid[@]}"; do sess_close "$k"; done
}
# Runs SQL $2 in session $1; prints its output (errors included); fails after 60 s of silence.
sess_q() {
  local key=$1 line
  printf '%s;\n\\echo @@end@@\n' "$2" >&"${s_in[$key]}"
  while IFS= read -r -t 60 line <&"${s_out[$key]}"; do
    [ "$line" = "@@end@@" ] && return 0
    printf '%s\n' "$line"
  done
  echo "session $key: no answer to $2" >&2
  return 1
}

# --- CPU and I/O of a node ----------------------------------------------------------------
# "pid ticks read_bytes write_bytes title" for the postmaster of node $1 (its own and its reaped
# children's CPU and I/O) and each of its children.
snapshot() {
  local dir pm pid t io
  dir=$(node "$1")
  pm=$(head -1 "$dir/data/postmaster.pid")
  for pid in "$pm" $(ps --ppid "$pm" -o pid=); do
    if [ "$pid" = "$pm" ]; then
      t=$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | awk '{ print $12 + $13 + $14 + $15 }') || true
    else
      t=$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | awk '{ print $12 + $13 }') || true
    fi
    io=$(awk '$1 == "read_bytes:" { r = $2 } $1 == "write_bytes:" { w = $2 } END { print r + 0, w + 0 }' \
      "/proc/$pid/io" 2>/dev/null) || true
    [ -n "$t" ] && [ -n "$io" ] && echo "$pid $t $io $(ps -o args= -p "$pid" 2>/dev/null || true)"
  done
}
# "seconds read_bytes write_bytes" between two snapshots (processes matched by pid; a process
# that started in between counts in full).
snap_delta() {
  awk -v hz="$clk_tck" 'NR == FNR { t[$1] = $2; r[$1] = $3; w[$1] = $4; next }
       { dt = $2 - t[$1]; dr = $3 - r[$1]; dw = $4 - w[$1]
         if (dt < 0 || dr < 0 || dw < 0) { dt = $2; dr = $3; dw = $4 }
         T += dt; R += dr; W += dw }
       END { printf "%.3f %.0f %.0f\n", T / hz, R, W }' "$1" "$2"
}

# --- nodes --------------------------------------------------------------------------------
init_primary() {
  local n=$1 dir
  dir=$(node "$n")
  "$pg" init "$dir" "${port[$n]}" "shared_buffers = 256MB" "slipstream.l0_size = $l0_size" \
    "max_wal_size = 4GB" "checkpoint_timeout = 30min" "wal_keep_size = 4GB" \
    "slipstream.backup_timeout = 5s" >/dev/null
  "$pg" start "$dir"
  psql_n "$n" -c "CREATE EXTENSION slipstream" >/dev/null
}

# Seeds backup $2 of primary $1 ($3 = build, send, send-lz4), starts it and makes it serve.
seed_backup() {
  local p=$1 n=$2 mode=$3 dir pdir args
  dir=$(node "$n")
  pdir=$(node "$p")
  rm -rf "$dir"
  mkdir -p "$dir/sock"
  [ "$(id -u)" = 0 ] && chown -R postgres: "$dir"
  args=(--connstring "host=$pdir/sock port=${port[$p]} user=postgres dbname=postgres"
        --datadir "$dir/data" --name "$n" --set "port = ${port[$n]}"
        --set "unix_socket_directories = '$dir/sock'" --set "cluster_name = '$n'")
  [ "$mode" = build ] || args+=(--send-index)
  as_postgres "$root/scripts/seed_backup.sh" "${args[@]}" >"$dir/seed.log" 2>&1 ||
    { cat "$dir/seed.log" >&2; return 1; }
  "$pg" start "$dir" || { tail -20 "$dir/server.log" >&2; return 1; }
  psql_n "$n" -c "SELECT slipstream.serve_backup('127.0.0.1:${serve[$n]}', '$secret', 16, '8MB')" >/dev/null
}

# Primary $1 ships to backup $2 (named after it) over transport $3 in mode $4; waits until it
# streams.
add_backup() {
  local p=$1 n=$2 t=$3 mode=$4 shipping=build_index lz4=false i
  [ "$mode" = build ] || shipping=send_index
  [ "$mode" = send-lz4 ] && lz4=true
  psql_n "$p" -c "SELECT slipstream.add_backup('$n', '127.0.0.1:${serve[$n]}', '$t', '$secret', '$shipping', $lz4)" >/dev/null
  for i in $(seq 1 600); do
    [ "$(psql_n "$p" -c "SELECT state FROM slipstream.replication WHERE name = '$n'")" = streaming ] && return 0
    sleep 0.1
  done
  echo "backup $n never streamed: $(psql_n "$p" -c "SELECT state, error FROM slipstream.replication WHERE name = '$n'")" >&2
  tail -5 "$(node "$n")/server.log" >&2
  return 1
}

# Waits until backups $3... (sessions named after them; modes in bk_mode) of primary $1
# (session $2) have caught up: replay at the primary's flush position, and then nothing moving
# for 2 s (8 polls): the primary's compaction and GC counters, for a Build-Index backup its
# own, for a Send-Index one the primary's index stream (lag 0) and its installed compactions.
# Prints the seconds until the last change. Fails after $wait_max seconds.
declare -A bk_mode=()
wait_max=900
wait_caught_up() {
  local pk=$2 target t0 prev="" cur stable=0 last b v lag
  shift 2
  t0=$(now)
  last=$t0
  target=$(sess_q "$pk" "SELECT pg_current_wal_flush_lsn()") || return 1
  while :; do
    cur=$(sess_q "$pk" "SELECT string_agg(value::text, ' ' ORDER BY name) FROM slipstream.engine
                        WHERE name IN ('compactions', 'compaction_bytes_written', 'gc_runs')") || return 1
    lag=0
    for b in "$@"; do
      v=$(sess_q "$b" "SELECT pg_last_wal_replay_lsn() >= '$target'") || return 1
      [ "$v" = t ] || lag=1
      if [ "${bk_mode[$b]}" = build ]; then
        v=$(sess_q "$b" "SELECT string_agg(value::text, ' ' ORDER BY name) FROM slipstream.engine
                         WHERE name IN ('compactions', 'compaction_bytes_written', 'gc_runs')") || return 1
      else
        v=$(sess_q "$pk" "SELECT index_lag || ' ' || index_frames FROM slipstream.replication WHERE name = '$b'") || return 1
        [ "${v%% *}" = 0 ] || lag=1
        v="$v $(sess_q "$b" "SELECT installed_compactions || ' ' || coalesce(error, '') FROM slipstream.index_import")" || return 1
      fi
      cur="$cur | $v"
    done
    if [ "$lag" = 0 ] && [ "$cur" = "$prev" ]; then
      stable=$((stable + 1))
    else
      stable=0
      last=$(now)
    fi
    [ "$stable" -ge 8 ] && { elapsed "$t0" "$last"; return 0; }
    prev=$cur
    if awk -v a="$t0" -v b="$(now)" -v m="$wait_max" 'BEGIN { exit !(b - a > m) }'; then
      echo "backups $* did not catch up in $wait_max s: $cur (target $target)" >&2
      return 1
    fi
    sleep 0.25
  done
}

# Send-Index backup $3 of primary $1 (session $2): compacts table $4 on the primary until the
# backup can take over (promotable), 60 s at most.
wait_promotable() {
  local p=$1 pk=$2 b=$3 table=$4 i
  for i in $(seq 1 120); do
    [ "$(sess_q "$b" "SELECT promotable FROM slipstream.index_import")" = t ] && return 0
    sess_q "$pk" "SELECT slipstream.compact('$table')" >/dev/null
    sleep 0.5
  done
  echo "$b never became promotable: $(sess_q "$b" "SELECT * FROM slipstream.index_import")" >&2
  return 1
}

# --- workloads ----------------------------------------------------------------------------
# Small/medium/large percent of a mix (bench/ycsb_pg.sh): values of 20, 300 and 1500 B, a
# record's class fixed by its key.
mix_shares() {
  case "$1" in
    SD) echo "60 20" ;; MD) echo "20 60" ;; LD) echo "20 20" ;;
  esac
}
# --values=random (the default): every 32 characters from their own md5, so that neither LZ4
# nor the engine's compression of large values finds repeats; --values=repeat: one md5
# repeated, as bench/ycsb_pg.sh does.
value_sql() { # key expression, mix
  local small medium
  read -r small medium < <(mix_shares "$2")
  if [ "$values" = repeat ]; then
    echo "CASE WHEN ($1) % 100 < $small THEN left(md5(random()::text), 20)
               WHEN ($1) % 100 < $((small + medium)) THEN left(repeat(md5(random()::text), 10), 300)
               ELSE left(repeat(md5(random()::text), 47), 1500) END"
  else
    # The subqueries name the key, so that they run for every row (not once, as an InitPlan).
    echo "CASE WHEN ($1) % 100 < $small THEN left(md5(random()::text), 20)
               WHEN ($1) % 100 < $((small + medium)) THEN
                 (SELECT left(string_agg(md5(random()::text || g || ($1)), ''), 300) FROM generate_series(1, 10) g)
               ELSE (SELECT left(string_agg(md5(random()::text || g || ($1)), ''), 1500) FROM generate_series(1, 47) g) END"
  fi
}
table_of() { echo "ut_$(echo "$1" | tr 'A-Z' 'a-z')"; }
# The pgbench script of workload $1 (load, a) on mix $2.
workload_script() {
  local w=$1 mix=$2 table
  table=$(table_of "$mix")
  case "$w" in
    load)
      echo "INSERT INTO $table SELECT k, $(value_sql k "$mix") FROM (SELECT nextval('${table}_seq') AS k) s;" ;;
    a)
      echo "\\set z random_zipfian(1, $records, 1.01)"
      echo "\\set key (:z * 2654435761) % $records + 1"
      echo "\\set op random(1, 100)"
      echo "\\if :op <= 50"
      echo "SELECT field0 FROM $table WHERE ycsb_key = :key;"
      echo "\\else"
      echo "UPDATE $table SET field0 = $(value_sql :key "$mix") WHERE ycsb_key = :key;"
      echo "\\endif" ;;
  esac
}

csv="$results/shipping.csv"
pcsv="$results/promotion.csv"
[ "$report_only" = 1 ] || echo "transport,mode,workload,ops,seconds,tps,replica_cpu_s,replica_cpu_us_per_op,replica_read_bytes,replica_write_bytes,wal_bytes,index_bytes,index_raw_bytes,network_bytes,index_installs,catchup_s,primary_cpu_us_per_op,engine_read_bytes,engine_write_bytes,status" >"$csv"
[ "$report_only" = 1 ] || echo "step,transport,mode,user_bytes,replica_engine_bytes,promote_s,first_read_s,count_s,rows,rows_expected,fence_s,status" >"$pcsv"

# One measured run of workload $1 (load-MIX, a-MIX, tpcb) on the pair of this transport ($2)
# and mode ($3): appends a row to the CSV.
run_one() {
  local w=$1 t=$2 mode=$3 dir out ops tps wal0 wal1 ix0 ix1 catchup e0 e1
  local -a script=()
  dir="$scratch/runs/$t-$mode-$w"
  mkdir -p "$dir"
  chmod 777 "$dir"
  case "$w" in
    load-*) workload_script load "${w#load-}" >"$dir/script.sql"; script=(-f "$dir/script.sql" -t $((records / clients))) ;;
    a-*) workload_script a "${w#a-}" >"$dir/script.sql"; script=(-f "$dir/script.sql" -T "$seconds") ;;
    tpcb) script=(-b tpcb-like -T "$seconds") ;;
  esac
  wait_caught_up primary P replica >/dev/null
  sync
  snapshot replica >"$dir/replica.before"
  snapshot primary >"$dir/primary.before"
  read -r wal0 ix0 <<<"$(repl_counters P replica)"
  e0=$(engine_io replica)
  if ! out=$(cd "$dir" && PGOPTIONS="-c slipstream.commit_mode=remote_memory" timeout $((seconds * 4 + 600)) \
      "$pgbench" -h "$(node primary)/sock" -p "${port[primary]}" -U postgres -n -c "$clients" -j "$clients" \
      -M prepared "${script[@]}" postgres 2>&1); then
    echo "$out" | tail -5 >&2
    return 1
  fi
  echo "$out" >"$dir/pgbench.out"
  catchup=$(wait_caught_up primary P replica) || return 1
  snapshot replica >"$dir/replica.after"
  snapshot primary >"$dir/primary.after"
  read -r wal1 ix1 <<<"$(repl_counters P replica)"
  e1=$(engine_io replica)
  ops=$(echo "$out" | sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p')
  tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -1)
  [ -n "$ops" ] && [ "$ops" -gt 0 ] || { echo "pgbench processed no transaction: $out" >&2; return 1; }
  local walb
  walb=$(sess_q P "SELECT pg_wal_lsn_diff('$wal1', '$wal0')::bigint")
  append_row "$t" "$mode" "$w" "$ops" "$([[ $w == load-* ]] && echo - || echo "$seconds")" "$tps" \
    "$(snap_delta "$dir/replica.before" "$dir/replica.after")" \
    "$(snap_delta "$dir/primary.before" "$dir/primary.after")" "$walb" "$ix0" "$ix1" "$catchup" "$e0" "$e1"
}

# "device_bytes_read,device_bytes_written" of the engine of Build-Index backup $1 (its session):
# what the engine read and wrote through its device layer, page cache hits included; "-,-" for
# a Send-Index backup, whose engine cannot be queried while it imports.
engine_io() {
  if [ "${bk_mode[$1]}" = build ]; then
    sess_q "$1" "SELECT string_agg(value::bigint::text, ',' ORDER BY name) FROM slipstream.engine
                 WHERE name IN ('device_bytes_read', 'device_bytes_written')"
  else
    echo "-,-"
  fi
}

# "sent_lsn index_bytes,index_raw_bytes,index_installs" of backup $2 in the primary's session $1.
repl_counters() {
  sess_q "$1" "SELECT sent_lsn || ' ' || coalesce(index_bytes, 0) || ',' || coalesce(index_raw_bytes, 0)
               || ',' || coalesce(index_installs, 0) FROM slipstream.replication WHERE name = '$2'"
}

# Appends a row: transport mode workload ops seconds tps "backup: cpu_s read write"
# "primary: cpu_s read write" wal_bytes index_counters_before index_counters_after catchup_s
# [engine_io_before engine_io_after].
append_row() {
  awk -v t="$1" -v m="$2" -v w="$3" -v ops="$4" -v secs="$5" -v tps="$6" -v rs="$7" -v ps="$8" \
      -v walb="$9" -v ix0="${10}" -v ix1="${11}" -v c="${12}" -v e0="${13:--,-}" -v e1="${14:--,-}" 'BEGIN {
    split(rs, r, " "); split(ps, p, " "); split(ix0, a, ","); split(ix1, b, ","); split(e0, x, ","); split(e1, y, ",")
    ib = b[1] - a[1]; ir = b[2] - a[2]; inst = b[3] - a[3]
    er = (x[1] == "-" || y[1] == "-") ? "-" : sprintf("%.0f", y[1] - x[1])
    ew = (x[2] == "-" || y[2] == "-") ? "-" : sprintf("%.0f", y[2] - x[2])
    printf "%s,%s,%s,%d,%s,%.1f,%.3f,%.2f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%d,%.1f,%.2f,%s,%s,ok\n", t, m, w, ops, secs, tps,
      r[1], r[1] * 1e6 / ops, r[2], r[3], walb, ib, ir, walb + ib, inst, c, p[1] * 1e6 / ops, er, ew
  }' >>"$csv"
  log "$(tail -1 "$csv" | awk -F, '{ printf "%-4s %-8s %-8s %7.0f tps  replica CPU %6.1f us/op  read %.1f MB  written %.1f MB  net %.1f MB (WAL %.1f + index %.1f)  caught up %.1f s after", $1, $2, $3, $6, $8, $9 / 1e6, $10 / 1e6, $14 / 1e6, $11 / 1e6, $12 / 1e6, $16 }')"
}

fail_row() { # transport mode workload why
  echo "$1,$2,$3,0,-,0,-,-,-,-,-,-,-,-,-,-,-,-,-,failed: $4" >>"$csv"
  log "$1 $2 $3 FAILED: $4"
}

workload_list() {
  local m
  for m in ${mixes//,/ }; do
    if [ "$m" = tpcb ]; then echo tpcb; else echo "load-$m"; echo "a-$m"; fi
  done
}

# Times the takeover of backup $1 (its primary was killed): slipstream.promote(60), then a
# first point read (which waits until the engine replayed the WAL past its imported horizon),
# then count(*) over tables $2 (space-separated), which must add up to $3.
# Prints "promote_s first_read_s count_s rows engine_bytes fence_s" (engine bytes: segments in
# use after it; fence: from the call until the startup process logged the promote request,
# i.e. slipstream.promote()'s wait for the backup worker to stop serving).
time_takeover() {
  local n=$1 tables=$2 t0 t1 t2 t3 rows first sum engine
  first=${tables%% *}
  sum=$(for x in $tables; do echo "(SELECT count(*) FROM $x)"; done | paste -sd+)
  t0=$(now)
  psql_n "$n" -c "SELECT slipstream.promote(60)" >/dev/null || return 1
  t1=$(now)
  # The fencing's share: until the startup process logged the promote request.
  local req fence
  req=$(grep "received promote request" "$(node "$n")/server.log" | tail -1 | cut -d' ' -f1-3)
  fence=$( [ -n "$req" ] && elapsed "$t0" "$(date -d "$req" +%s.%N)" || echo -)
  if [ "$first" = pgbench_accounts ]; then
    psql_n "$n" -c "SELECT abalance FROM pgbench_accounts WHERE aid = 1" >/dev/null || return 1
  else
    psql_n "$n" -c "SELECT field0 FROM $first WHERE ycsb_key = 1" >/dev/null || return 1
  fi
  t2=$(now)
  rows=$(psql_n "$n" -c "SELECT $sum") || return 1
  t3=$(now)
  engine=$(psql_n "$n" -c "SELECT (value * pg_size_bytes(current_setting('slipstream.segment_size')))::bigint
                           FROM slipstream.engine WHERE name = 'segments_in_use'") || return 1
  echo "$(elapsed "$t0" "$t1") $(elapsed "$t1" "$t2") $(elapsed "$t2" "$t3") $rows $engine $fence"
}

# One pair: a fresh primary and one backup of mode $2 on transport $1; every workload; the
# takeover. Runs in a subshell (set -e): a failure ends the pair, and its rows say so.
run_pair() {
  local t=$1 mode=$2 m w tables="" expected r bytes pr_s fr_s co_s rows eb fe
  log "== $t, $mode: a fresh primary and one backup"
  init_primary primary
  for m in ${mixes//,/ }; do
    [ "$m" = tpcb ] && continue
    psql_n primary -c "CREATE TABLE $(table_of "$m") (ycsb_key bigint PRIMARY KEY, field0 text) USING slipstream" \
      -c "CREATE SEQUENCE $(table_of "$m")_seq" >/dev/null
    tables="$tables $(table_of "$m")"
  done
  if [[ ",$mixes," == *,tpcb,* ]]; then
    PGOPTIONS="-c default_table_access_method=slipstream" "$pgbench" -h "$(node primary)/sock" \
      -p "${port[primary]}" -U postgres -i -q -s "$scale" postgres >"$(node primary)/pgbench-init.log" 2>&1 ||
      { cat "$(node primary)/pgbench-init.log" >&2; return 1; }
    tables="$tables pgbench_accounts"
  fi
  tables=${tables# }
  seed_backup primary replica "$mode"
  add_backup primary replica "$t" "$mode"
  bk_mode=([replica]=$mode)
  sess_open P primary
  sess_open replica replica
  r=$(wait_caught_up primary P replica)
  log "seeded and caught up ($(sess_q P "SELECT 'seeds ' || coalesce(index_seeds, 0) || ', index ' || round(coalesce(index_bytes, 0) / 1e6, 1) || ' MB' FROM slipstream.replication WHERE name = 'replica'"))"
  for w in $(workload_list); do
    run_one "$w" "$t" "$mode" || { fail_row "$t" "$mode" "$w" "run failed"; return 1; }
  done
  # The takeover.
  if [ -n "$tables" ]; then
    [ "$mode" = build ] || wait_promotable primary P replica "${tables%% *}"
    wait_caught_up primary P replica >/dev/null
    expected=$(psql_n primary -c "SELECT $(for x in $tables; do echo "(SELECT count(*) FROM $x)"; done | paste -sd+)")
    bytes=$(psql_n primary -c "SELECT $(for x in $tables; do
        if [ "$x" = pgbench_accounts ]; then echo "(SELECT sum(pg_column_size(a.*))::bigint FROM pgbench_accounts a)";
        else echo "(SELECT sum(8 + octet_length(field0))::bigint FROM $x)"; fi; done | paste -sd+)")
    sess_close P
    sess_close replica
    "$pg" kill "$(node primary)"
    r=$(time_takeover replica "$tables")
    read -r pr_s fr_s co_s rows eb fe <<<"$r"
    echo "pair,$t,$mode,$bytes,$eb,$pr_s,$fr_s,$co_s,$rows,$expected,$fe,$([ "$rows" = "$expected" ] && echo ok || echo "rows differ")" >>"$pcsv"
    log "takeover: promote $pr_s s (fencing $fe s), first read $fr_s s, count(*) $co_s s: $rows rows (primary had $expected)"
    [ "$rows" = "$expected" ] || { echo "the promoted backup has $rows rows, the primary had $expected" >&2; return 1; }
  fi
  "$pg" stop "$(node replica)" immediate >/dev/null 2>&1 || true
}

# The --promote-gb step: one primary, a Build-Index and a Send-Index backup over tcp (shm if
# --transports has no tcp).
gb_t=tcp
[[ ",$transports," == *,tcp,* ]] || gb_t=shm
run_gb() {
  local bytes rows batch n=0 t0 loaded expected r pr_s fr_s co_s got b eb w0 w1 x0 x1 fe
  bytes=$(awk -v g="$promote_gb" 'BEGIN { printf "%d", g * 1024 * 1024 * 1024 }')
  # SD rows: 8 B of key and 372 B of value on average.
  rows=$(( bytes / 380 ))
  batch=200000
  log "== takeover of a backup holding about $promote_gb GB ($rows SD rows): a primary, a Build-Index and a Send-Index backup ($gb_t)"
  init_primary gb-primary
  psql_n gb-primary -c "CREATE TABLE big (ycsb_key bigint PRIMARY KEY, field0 text) USING slipstream" >/dev/null
  seed_backup gb-primary gb-build build
  seed_backup gb-primary gb-send send
  add_backup gb-primary gb-build "$gb_t" build
  add_backup gb-primary gb-send "$gb_t" send
  bk_mode=([gb-build]=build [gb-send]=send)
  sess_open G gb-primary
  sess_open gb-build gb-build
  sess_open gb-send gb-send
  wait_caught_up gb-primary G gb-build gb-send >/dev/null
  # The load is measured too, as workload bulk-SD: both backups at once (they share the cores).
  local dir="$scratch/runs/gb" c0 c1
  mkdir -p "$dir"
  sync
  for b in gb-primary gb-build gb-send; do snapshot "$b" >"$dir/$b.before"; done
  c0=$(for b in gb-build gb-send; do repl_counters G "$b"; done)
  local eb0 eb1
  eb0=$(engine_io gb-build)
  t0=$(now)
  while [ "$n" -lt "$rows" ]; do
    local hi=$(( n + batch < rows ? n + batch : rows ))
    psql_n gb-primary -c "INSERT INTO big SELECT k, $(value_sql k SD) FROM generate_series($((n + 1)), $hi) k" >/dev/null
    n=$hi
  done
  loaded=$(elapsed "$t0" "$(now)")
  log "loaded $rows rows in $loaded s; waiting for the backups"
  r=$(wait_caught_up gb-primary G gb-build gb-send)
  for b in gb-primary gb-build gb-send; do snapshot "$b" >"$dir/$b.after"; done
  c1=$(for b in gb-build gb-send; do repl_counters G "$b"; done)
  eb1=$(engine_io gb-build)
  local i=0 walb
  for b in gb-build gb-send; do
    i=$((i + 1))
    read -r w0 x0 <<<"$(echo "$c0" | sed -n "${i}p")"
    read -r w1 x1 <<<"$(echo "$c1" | sed -n "${i}p")"
    walb=$(sess_q G "SELECT pg_wal_lsn_diff('$w1', '$w0')::bigint")
    append_row "$gb_t" "${b#gb-}" bulk-SD "$rows" - "$(awk -v r="$rows" -v s="$loaded" 'BEGIN { printf "%.1f", r / s }')" \
      "$(snap_delta "$dir/$b.before" "$dir/$b.after")" "$(snap_delta "$dir/gb-primary.before" "$dir/gb-primary.after")" \
      "$walb" "$x0" "$x1" "$r" "$([ "$b" = gb-build ] && echo "$eb0" || echo "-,-")" "$([ "$b" = gb-build ] && echo "$eb1" || echo "-,-")"
  done
  wait_promotable gb-primary G gb-send big
  wait_caught_up gb-primary G gb-build gb-send >/dev/null
  log "caught up $r s after the load"
  expected=$(psql_n gb-primary -c "SELECT count(*) FROM big")
  local user_bytes
  user_bytes=$(psql_n gb-primary -c "SELECT sum(8 + octet_length(field0))::bigint FROM big")
  sess_close G
  sess_close gb-build
  sess_close gb-send
  "$pg" kill "$(node gb-primary)"
  for b in gb-send gb-build; do
    r=$(time_takeover "$b" big)
    read -r pr_s fr_s co_s got eb fe <<<"$r"
    local mode=${b#gb-}
    echo "gb,$gb_t,$mode,$user_bytes,$eb,$pr_s,$fr_s,$co_s,$got,$expected,$fe,$([ "$got" = "$expected" ] && echo ok || echo "rows differ")" >>"$pcsv"
    log "$b took over: promote $pr_s s (fencing $fe s), first read $fr_s s, count(*) $co_s s: $got rows (primary had $expected)"
    grep -h "taking over the imported levels\|replayed .* WAL records" "$(node "$b")/server.log" | tail -2 | sed 's/^/  /' || true
    "$pg" stop "$(node "$b")" immediate >/dev/null 2>&1 || true
  done
}

[ "$report_only" = 1 ] || {
log "shipping benchmark: mixes $mixes, transports $transports, modes $modes; $records records, ${seconds} s per A and TPC-B run, scale $scale, $clients clients, l0_size $l0_size; $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"
for t in ${transports//,/ }; do
  for mode in ${modes//,/ }; do
    [ -n "$(workload_list)" ] || continue
    set +e
    (
      set -e
      trap 'sess_close_all; stop_all' EXIT
      run_pair "$t" "$mode"
    )
    rc=$?
    set -e
    if [ "$rc" != 0 ]; then
      failed=1
      for w in $(workload_list); do
        grep -q "^$t,$mode,$w," "$csv" || fail_row "$t" "$mode" "$w" "pair failed"
      done
      grep -q "^pair,$t,$mode," "$pcsv" || echo "pair,$t,$mode,-,-,-,-,-,-,-,-,failed" >>"$pcsv"
    fi
    stop_all
    [ "$keep" = 1 ] || [ "$rc" != 0 ] || rm -rf "$(node primary)/data" "$(node replica)/data"
    [ "$keep" = 1 ] || [ "$rc" != 0 ] || rm -rf "$(node primary)" "$(node replica)"
  done
done
if awk -v g="$promote_gb" 'BEGIN { exit !(g > 0) }'; then
  set +e
  (
    set -e
    trap 'sess_close_all; stop_all' EXIT
    run_gb
  )
  rc=$?
  set -e
  if [ "$rc" != 0 ]; then
    failed=1
    for m in send build; do
      grep -q "^gb,$gb_t,$m," "$pcsv" || echo "gb,$gb_t,$m,-,-,-,-,-,-,-,-,failed" >>"$pcsv"
    done
  fi
  stop_all
fi

}

# --- report -------------------------------------------------------------------------------
md="$results/shipping.md"
ratios="$results/shipping_ratios.csv"
# Send-Index / Build-Index per transport and workload (and over all workloads: sums).
awk -F, -v OFS=, '
  NR > 1 && $20 == "ok" {
    k = $1 "," $3; key[k] = 1; if (!($3 in wseen)) { wseen[$3] = 1; wl[++nw] = $3 }
    tseen[$1] = 1
    ops[k, $2] = $4; cpu[k, $2] = $7; rd[k, $2] = $9; wr[k, $2] = $10; net[k, $2] = $14; er[k, $2] = $18
    if ($3 !~ /^bulk/ && $18 != "-") ER[$1, $2] += $18
    if ($3 !~ /^bulk/) { OPS[$1, $2] += $4; CPU[$1, $2] += $7; RD[$1, $2] += $9; WR[$1, $2] += $10; NET[$1, $2] += $14 }
  }
  function r(a, b) { return (b > 0) ? sprintf("%.3f", a / b) : (a == 0 ? "both 0" : "build 0") }
  function per(x, o) { return o > 0 ? x / o : 0 }
  function mbv(x, o) { return o > 0 ? sprintf("%.1f", x / 1e6) : "-" }
  END {
    print "transport,workload,cpu_send,cpu_send_lz4,read_send,read_send_lz4,write_send,write_send_lz4,net_send,net_send_lz4,read_mb_build,read_mb_send,read_mb_send_lz4,engine_read_mb_build"
    split("shm tcp", ts, " ")
    for (i = 1; i <= 2; i++) {
      t = ts[i]; if (!(t in tseen)) continue
      for (j = 1; j <= nw + 1; j++) {
        if (j <= nw) {
          w = wl[j]; k = t "," w; if (!(k in key)) continue
          ob = ops[k, "build"]; cb = per(cpu[k, "build"], ob); rb = per(rd[k, "build"], ob); wb = per(wr[k, "build"], ob); nb = per(net[k, "build"], ob)
          line = t "," w
          for (mi = 1; mi <= 2; mi++) { m = (mi == 1) ? "send" : "send-lz4"; o = ops[k, m]
            c[mi] = r(per(cpu[k, m], o), cb); rr[mi] = r(per(rd[k, m], o), rb); ww[mi] = r(per(wr[k, m], o), wb); nn[mi] = r(per(net[k, m], o), nb)
            if (!(o > 0) || !(ob > 0)) c[mi] = rr[mi] = ww[mi] = nn[mi] = "-" }
        } else {
          w = "all"; ob = OPS[t, "build"]; cb = per(CPU[t, "build"], ob); rb = per(RD[t, "build"], ob); wb = per(WR[t, "build"], ob); nb = per(NET[t, "build"], ob)
          line = t ",all"
          for (mi = 1; mi <= 2; mi++) { m = (mi == 1) ? "send" : "send-lz4"; o = OPS[t, m]
            c[mi] = r(per(CPU[t, m], o), cb); rr[mi] = r(per(RD[t, m], o), rb); ww[mi] = r(per(WR[t, m], o), wb); nn[mi] = r(per(NET[t, m], o), nb)
            if (!(o > 0) || !(ob > 0)) c[mi] = rr[mi] = ww[mi] = nn[mi] = "-" }
        }
        if (j <= nw) { mb = mbv(rd[k, "build"], ops[k, "build"]) "," mbv(rd[k, "send"], ops[k, "send"]) "," mbv(rd[k, "send-lz4"], ops[k, "send-lz4"]) "," ((er[k, "build"] == "" || er[k, "build"] == "-") ? "-" : sprintf("%.1f", er[k, "build"] / 1e6)) }
        else { mb = mbv(RD[t, "build"], OPS[t, "build"]) "," mbv(RD[t, "send"], OPS[t, "send"]) "," mbv(RD[t, "send-lz4"], OPS[t, "send-lz4"]) "," (OPS[t, "build"] > 0 ? sprintf("%.1f", ER[t, "build"] / 1e6) : "-") }
        print line, c[1], c[2], rr[1], rr[2], ww[1], ww[2], nn[1], nn[2], mb
      }
    }
  }' "$csv" >"$ratios"

{
  echo "Shipping benchmark: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs, load average at the end $(cut -d' ' -f1-3 /proc/loadavg); $clients clients, $records records per YCSB mix (Load inserts them, A runs ${seconds} s), TPC-B scale $scale for ${seconds} s, slipstream.l0_size $l0_size, commit_mode remote_memory, one backup"
  echo
  echo "| transport | mode | workload | ops | primary tps | replica CPU us/op | replica MB read | replica MB written | engine MB read / written | WAL MB | index MB sent (raw) | network B/op | caught up after s | primary CPU us/op |"
  echo "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  awk -F, 'NR > 1 {
    if ($20 != "ok") { printf "| %s | %s | %s | %s |  |  |  |  |  |  |  |  |  |  |\n", $1, $2, $3, $20; next }
    e = ($18 == "-") ? "-" : sprintf("%.1f / %.1f", $18 / 1e6, $19 / 1e6)
    printf "| %s | %s | %s | %d | %.0f | %.1f | %.1f | %.1f | %s | %.1f | %.1f (%.1f) | %.0f | %.1f | %.1f |\n",
      $1, $2, $3, $4, $6, $8, $9 / 1e6, $10 / 1e6, e, $11 / 1e6, $12 / 1e6, $13 / 1e6, $14 / $4, $16, $17
  }' "$csv"
  echo
  echo "Send-Index / Build-Index, per operation (\"all\": the sums over the workloads of a transport but bulk-SD, the load of the takeover step, where both backups ran at once):"
  echo
  echo "| transport | workload | CPU send | CPU send+lz4 | written send | written send+lz4 | network send | network send+lz4 | device MB read: build / send / send+lz4 | build engine MB read |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
  awk -F, 'NR > 1 { printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s / %s / %s | %s |\n", $1, $2, $3, $4, $7, $8, $9, $10, $11, $12, $13, $14 }' "$ratios"
  echo
  echo "Takeover (the primary SIGKILLed; promote = slipstream.promote(60), first read = a point read after it, count = count(*) of every table):"
  echo
  echo "| step | transport | mode | user data MB | engine MB in use after | promote s (fencing) | first read s | promote + first read s | count(*) s | rows |"
  echo "|---|---|---|---:|---:|---:|---:|---:|---:|---|"
  awk -F, 'NR > 1 {
    if ($12 != "ok") { printf "| %s | %s | %s |  |  |  |  |  |  | %s |\n", $1, $2, $3, $12; next }
    printf "| %s | %s | %s | %.0f | %.0f | %.2f (%s) | %.2f | %.2f | %.2f | %d (%s) |\n", $1, $2, $3, $4 / 1e6, $5 / 1e6, $6, $11, $7, $6 + $7, $8, $9, $12
  }' "$pcsv"
} >"$md"
echo
cat "$md"
echo
echo "CSV: $csv, $pcsv, $ratios; tables: $md"

if [ "$plot" != none ]; then
  if command -v gnuplot >/dev/null; then
    # One row per transport and workload, one column per mode, for each plotted metric.
    for metric in cpu net write read tps; do
      awk -F, -v metric="$metric" '
        NR > 1 && $20 == "ok" && !(metric == "tps" && $3 ~ /^bulk/) {
          k = $3 " " $1; if (!(k in seen)) { seen[k] = 1; rows[++n] = k }
          v = (metric == "cpu") ? $8 : (metric == "net") ? $14 / $4 : (metric == "write") ? $10 / $4 : (metric == "read") ? $9 / $4 : $6
          val[k, $2] = v
        }
        END {
          print "run,build,send,send-lz4"
          for (i = 1; i <= n; i++) {
            k = rows[i]; printf "%s", k
            split("build send send-lz4", ms, " ")
            for (j = 1; j <= 3; j++) printf ",%s", ((k, ms[j]) in val) ? val[k, ms[j]] : "NaN"
            printf "\n"
          }
        }' "$csv" >"$results/plot_$metric.csv"
    done
    awk -F, 'NR > 1 && $12 == "ok" { printf "%s %s %s,%s,%s\n", $1, $2, $3, $6, $7 } BEGIN { print "takeover,promote,first_read" }' "$pcsv" \
      >"$results/plot_promote.csv"
    gnuplot -e "dir='$results'; out='$plot'; subtitle='$clients clients, $records records per mix, ${seconds} s runs, TPC-B scale $scale, l0_size $l0_size, $(nproc) CPUs'" \
      "$root/scripts/plot_shipping.gp" && echo "plot: $plot"
  else
    echo "no gnuplot (Debian gnuplot-nox): no plot"
  fi
fi
log "done in $(( $(date +%s) - started )) s"
[ "$failed" = 0 ] || { echo "some runs failed (see the status columns)" >&2; exit 1; }
