#!/usr/bin/env bash
# soak.sh: hours of mixed work on slipstream tables with random SIGKILLs, checking after every
# restart that nothing acknowledged was lost and that every table is sound.
#
# The work, all at once, on one private cluster:
#   - pgbench TPC-B (2 clients) on pgbench tables created USING slipstream;
#   - a YCSB mix (1 client) on a usertable of 20/300/1500-byte values (small, medium and large
#     in the engine): zipfian reads and updates (A), short scans (E), read-modify-write (F),
#     inserts (D);
#   - a ledger client whose every INSERT is printed once COMMIT returned (acknowledged).
# Each round runs them for a random 10-40 s and then injects one fault at a random moment:
#   postmaster   SIGKILL of the postmaster (and its children die with it); pg_ctl starts it
#   worker       SIGKILL of the slipstream engine worker alone; the postmaster restarts all
#   backend      SIGKILL of one client backend; the postmaster restarts all
#   terminate    pg_terminate_backend of one client backend (no restart)
# After the restart: every acknowledged ledger row is there, TPC-B's balances agree
# (accounts = branches = tellers = history), slipstream.verify passes on every table, and the
# server log since the fault has no PANIC and no failed assertion.
#
#   scripts/soak.sh [minutes] [scratch dir] [port]      (make soak SOAK_MINUTES=60)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
minutes=${1:-${SOAK_MINUTES:-60}}
scratch=${2:-${SLIPSTREAM_SCRATCH:-/tmp/slipstream-soak}}
port=${3:-55970}
pg="$root/scripts/pg_cluster.sh"
pgbin=/usr/lib/postgresql/15/bin
cluster="$scratch/cluster"
keys=20000

rm -rf "$scratch"
mkdir -p "$scratch/work"
chmod 777 "$scratch/work"
"$pg" init "$cluster" "$port" "checkpoint_timeout = 30s" "max_wal_size = 256MB" \
  "restart_after_crash = on" >/dev/null
"$pg" start "$cluster"
trap '"$pg" stop "$cluster" immediate >/dev/null 2>&1 || true' EXIT
sql() { PGOPTIONS="-c client_min_messages=warning" "$pg" psql "$cluster" -qAt "$@"; }
pgbench() {
  (cd "$scratch/work" && "$pgbin/pgbench" -h "$cluster/sock" -p "$port" -U postgres "$@" postgres)
}

# Waits until the server accepts connections again (after a restart by the postmaster).
wait_ready() {
  for _ in $(seq 1 600); do
    "$pgbin/pg_isready" -q -h "$cluster/sock" -p "$port" -U postgres && sql -c "SELECT 1" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "the server did not come back within 120 s" >&2
  tail -n 30 "$cluster/server.log" >&2
  return 1
}

sql -c "CREATE EXTENSION slipstream"
PGOPTIONS="-c default_table_access_method=slipstream" pgbench -i -q -s 2 >/dev/null 2>&1
sql -c "CREATE TABLE ledger (client int, seq int, payload text, PRIMARY KEY (client, seq)) USING slipstream" \
  -c "CREATE TABLE usertable (ycsb_key int PRIMARY KEY, field0 text) USING slipstream" \
  -c "CREATE SEQUENCE usertable_seq START $((keys + 1))"
value_sql() {
  echo "CASE WHEN ($1) % 100 < 60 THEN left(md5(random()::text), 20)
             WHEN ($1) % 100 < 80 THEN left(repeat(md5(random()::text), 10), 300)
             ELSE left(repeat(md5(random()::text), 47), 1500) END"
}
sql -c "INSERT INTO usertable SELECT k, $(value_sql k) FROM generate_series(1, $keys) k"
tables="pgbench_accounts pgbench_branches pgbench_tellers pgbench_history ledger usertable"

zipf="\\set z random_zipfian(1, $keys, 1.01)
\\set key (:z * 2654435761) % $keys + 1"
cat >"$scratch/work/ycsb_a.sql" <<EOF
$zipf
\\set op random(1, 100)
\\if :op <= 50
SELECT field0 FROM usertable WHERE ycsb_key = :key;
\\else
UPDATE usertable SET field0 = $(value_sql :key) WHERE ycsb_key = :key;
\\endif
EOF
cat >"$scratch/work/ycsb_e.sql" <<EOF
$zipf
\\set len random(1, 100)
SELECT ycsb_key, field0 FROM usertable WHERE ycsb_key >= :key ORDER BY ycsb_key LIMIT :len;
EOF
cat >"$scratch/work/ycsb_f.sql" <<EOF
$zipf
BEGIN;
SELECT field0 FROM usertable WHERE ycsb_key = :key FOR UPDATE;
UPDATE usertable SET field0 = $(value_sql :key) WHERE ycsb_key = :key;
COMMIT;
EOF
cat >"$scratch/work/ycsb_d.sql" <<EOF
INSERT INTO usertable SELECT k, $(value_sql k) FROM (SELECT nextval('usertable_seq') AS k) s;
EOF

# The ledger client: "ACK client seq" once each autocommit INSERT returned.
ledger_workload() {
  local first=$1
  for n in $(seq "$first" $((first + 200000))); do
    echo "INSERT INTO ledger VALUES (1, $n, repeat('l', $((n % 700))));"
    echo "\\echo ACK 1 $n"
  done
}

# The pid of a random client backend running the workload, or of the engine worker.
pick_backend() {
  sql -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend'
            AND pid <> pg_backend_pid() ORDER BY random() LIMIT 1"
}
# The engine worker has no database connection, so it is not in pg_stat_activity: find it by
# its process title among the postmaster's children.
worker_pid() {
  pgrep -P "$(head -1 "$cluster/data/postmaster.pid")" -f '^postgres: slipstream worker' | head -1
}

# The checks after a restart; prints what failed (nothing when all is well).
check_all() {
  local problems=()
  sort -u "$scratch/acked" >"$scratch/acked.sorted"
  chmod 644 "$scratch/acked.sorted"
  local missing
  missing=$(sql -c "CREATE TEMP TABLE acked (client int, seq int)" \
    -c "\\copy acked FROM '$scratch/acked.sorted' WITH (DELIMITER ' ')" \
    -c "SELECT count(*) FROM acked a WHERE NOT EXISTS
          (SELECT 1 FROM ledger l WHERE l.client = a.client AND l.seq = a.seq)")
  [ "$missing" = 0 ] || problems+=("$missing acknowledged ledger rows lost")
  lost_total=$((lost_total + missing))
  local balances
  balances=$(sql -c "SELECT (SELECT sum(abalance) FROM pgbench_accounts) || ' ' ||
                            (SELECT sum(bbalance) FROM pgbench_branches) || ' ' ||
                            (SELECT sum(tbalance) FROM pgbench_tellers) || ' ' ||
                            (SELECT coalesce(sum(delta), 0) FROM pgbench_history)")
  read -r a b t h <<<"$balances"
  [ "$a" = "$b" ] && [ "$b" = "$t" ] && [ "$t" = "$h" ] ||
    problems+=("TPC-B balances disagree: accounts $a branches $b tellers $t history $h")
  for table in $tables; do
    sql -c "SELECT slipstream.verify('$table')" >/dev/null 2>"$scratch/verify.err" ||
      problems+=("verify($table): $(head -c 300 "$scratch/verify.err")")
  done
  # A fault that did not happen would make the round prove nothing.
  local since
  since=$(tail -c +"$((log_offset + 1))" "$cluster/server.log")
  case "$fault" in
    worker | backend) grep -q "was terminated by signal 9" <<<"$since" ||
      problems+=("the $fault was not killed (no crash restart in the server log)") ;;
    postmaster) grep -q "database system was interrupted" <<<"$since" ||
      problems+=("no crash recovery after the postmaster's SIGKILL") ;;
  esac
  local bad
  bad=$(tail -c +"$((log_offset + 1))" "$cluster/server.log" | grep -c -E "PANIC|TRAP:|Assert" || true)
  [ "$bad" = 0 ] || problems+=("$bad PANIC or assertion lines in the server log")
  for p in "${problems[@]}"; do echo "$p"; done
}

faults=(postmaster worker backend terminate)
declare -A fault_count
: >"$scratch/acked"
deadline=$(($(date +%s) + minutes * 60))
round=0 tpcb_total=0 ycsb_total=0 lost_total=0 failures=0
started=$(date +%s)
echo "soak: $minutes minutes on port $port, scratch $scratch"
while [ "$(date +%s)" -lt "$deadline" ]; do
  round=$((round + 1))
  duration=$((10 + RANDOM % 31))
  at=$((3 + RANDOM % (duration - 3)))
  fault=${faults[$((RANDOM % ${#faults[@]}))]}
  fault_count[$fault]=$((${fault_count[$fault]:-0} + 1))
  log_offset=$(stat -c %s "$cluster/server.log")

  pgbench -n -c 2 -j 1 -T "$duration" >"$scratch/tpcb.out" 2>&1 &
  tpcb=$!
  pgbench -n -c 1 -j 1 -T "$duration" -f "$scratch/work/ycsb_a.sql@50" -f "$scratch/work/ycsb_e.sql@20" \
    -f "$scratch/work/ycsb_f.sql@20" -f "$scratch/work/ycsb_d.sql@10" >"$scratch/ycsb.out" 2>&1 &
  ycsb=$!
  # psql itself (not through pg_cluster.sh), so that $! is the process to stop.
  ledger_workload $((round * 1000000)) |
    "$pgbin/psql" -X -qAt -v ON_ERROR_STOP=1 -h "$cluster/sock" -p "$port" -U postgres \
      >"$scratch/ledger.out" 2>&1 &
  ledger=$!

  sleep "$at"
  case "$fault" in
    postmaster) "$pg" kill "$cluster" 2>/dev/null ;;
    worker) pid=$(worker_pid) && [ -n "$pid" ] && kill -9 "$pid" ;;
    backend) pid=$(pick_backend) && [ -n "$pid" ] && kill -9 "$pid" ;;
    terminate) pid=$(pick_backend) && [ -n "$pid" ] && sql -c "SELECT pg_terminate_backend($pid)" >/dev/null ;;
  esac
  # The ledger client would go on after a terminate; end it with the round.
  wait "$tpcb" "$ycsb" 2>/dev/null || true
  kill "$ledger" 2>/dev/null || true
  wait "$ledger" 2>/dev/null || true
  grep '^ACK ' "$scratch/ledger.out" | cut -d' ' -f2,3 >>"$scratch/acked" || true
  [ "$fault" = postmaster ] && "$pg" start "$cluster"
  wait_ready

  tpcb_n=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$scratch/tpcb.out" | head -1)
  ycsb_n=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$scratch/ycsb.out" | head -1)
  tpcb_total=$((tpcb_total + ${tpcb_n:-0}))
  ycsb_total=$((ycsb_total + ${ycsb_n:-0}))
  problems=$(check_all)
  status=ok
  if [ -n "$problems" ]; then
    status=FAILED
    failures=$((failures + 1))
    echo "$problems" | sed 's/^/    /' >>"$scratch/problems"
  fi
  printf "round %4d  %-10s after %2ss of %2ss  tpcb %6s  ycsb %6s  acked %7s  %s\n" "$round" "$fault" \
    "$at" "$duration" "${tpcb_n:-0}" "${ycsb_n:-0}" "$(wc -l <"$scratch/acked")" "$status"
  [ -n "$problems" ] && echo "$problems" | sed 's/^/    /'
done

elapsed=$((($(date +%s) - started) / 60))
{
  echo "soak summary: $round rounds in $elapsed minutes"
  echo "  faults: postmaster ${fault_count[postmaster]:-0}, worker ${fault_count[worker]:-0}, backend ${fault_count[backend]:-0}, terminate ${fault_count[terminate]:-0}"
  echo "  transactions: TPC-B $tpcb_total, YCSB $ycsb_total, acknowledged ledger inserts $(sort -u "$scratch/acked" | wc -l)"
  echo "  acknowledged rows lost: $lost_total; rounds with a failed check: $failures"
} | tee "$scratch/summary"
[ "$failures" = 0 ]
