#!/usr/bin/env bash
# pg_tests.sh: the PostgreSQL suites of `make test-pg` (and so of `make check`), PG_TEST_JOBS
# (default 2) at a time. Every test starts its own clusters on its own loopback ports and
# scratch directories, and most of a test's time is spent waiting (for fsyncs, promotions,
# Patroni's loop, sleeps that let a load run before a kill): one at a time, the suite kept
# one of two cores busy and took 18 of CI's 30 minutes. Each test writes to its own log, which
# is printed whole when the test ends, with its time; after a failure no further test starts,
# the running ones finish, and the script fails.
#
# What runs: pg_regress and the isolation specs; the preload, device-size, maintenance-report, big-table,
# contention, visibility-map churn, SIGKILL crash and pinned-stall tests; a restart whose
# durable horizon lies past the WAL that survived the kill; the replication kill tests (a primary and
# a backup, tcp and shm, 6 rounds each; a backup killed under load; a seeded streaming
# standby); logical decoding (test_decoding against heap's output, a pgoutput subscriber);
# tablespaces (SIGKILL while tables move between them, a seeded standby with a mapped
# tablespace); takeovers after SIGKILL of the primary with two backups over tcp, shm (by
# scripts/failover.sh), remote_flush and deferred replay, and with Send-Index backups over tcp
# and shm, compacting all along, remote_flush too; a promotion of a backup whose replay was
# paused while the load arrived; a Send-Index backup through DDL, refused reads and a
# promotion compared table by table; Patroni's failover after a SIGKILL of the leader, 3 rounds
# with streaming replicas and 3 with Tailwind backups; the shuffle; a smoke run of the YCSB
# benchmark (every workload, verify).
#
# Ports (55400-55999, kept out of the ephemeral range by scripts/reserve_test_ports.sh): no
# two tests share one, so any two may run together; the two Patroni runs share etcd's ports
# and run one after the other as one entry.
#
#   scripts/pg_tests.sh [name...]     (names as in the list below; default: all)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

# The script reaps the tests' orphans itself (a child subreaper, prctl PR_SET_CHILD_SUBREAPER,
# set by python3 before it becomes this shell again): a killed postmaster and its children go
# to the nearest subreaper, which is otherwise the machine's init, and a test may start the
# node again only once they are reaped (pg_cluster.sh kill waits for them, and PostgreSQL
# refuses a data directory whose postmaster.pid names a process that still exists, zombies
# included). The init of these virtual machines reaped them 1.4 s after each kill; this shell
# reaps them at once, whenever it waits.
if [ -z "${SLIPSTREAM_SUBREAPER:-}" ] && command -v python3 >/dev/null; then
  export SLIPSTREAM_SUBREAPER=1
  exec python3 -c 'import ctypes, os, sys
if ctypes.CDLL(None).prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
    sys.stderr.write("pg_tests.sh: no child subreaper; orphans go to init\n")
os.execvp(sys.argv[1], sys.argv[1:])' bash "$0" "$@"
fi
jobs=${PG_TEST_JOBS:-2}
logs=${PG_TEST_LOGS:-/tmp/slipstream-pg-tests}

# name|command, longest first, so that the last tests to start are short ones.
tests=(
  "patroni|tests/pg_patroni_failover_test.sh /tmp/slipstream-patroni 3 && tests/pg_patroni_failover_test.sh /tmp/slipstream-patroni 3 tailwind"
  "send-index-shm|tests/pg_takeover_test.sh /tmp/slipstream-send-index-shm 55800 6 shm remote_memory continuous send_index"
  "send-index-tcp|tests/pg_takeover_test.sh /tmp/slipstream-send-index-tcp 55780 6 tcp remote_memory continuous send_index"
  "takeover-tcp|tests/pg_takeover_test.sh /tmp/slipstream-takeover-tcp 55700 6 tcp remote_memory"
  "shuffle|tests/pg_shuffle_test.sh /tmp/slipstream-shuffle 55860"
  "takeover-shm|TAKEOVER_BY=script tests/pg_takeover_test.sh /tmp/slipstream-takeover-shm 55720 6 shm remote_memory"
  "big-table|tests/pg_big_table_test.sh"
  "send-index-flush|tests/pg_takeover_test.sh /tmp/slipstream-send-index-flush 55840 4 tcp remote_flush continuous send_index"
  "takeover-deferred|tests/pg_takeover_test.sh /tmp/slipstream-takeover-deferred 55760 4 shm remote_memory deferred"
  "replication-tcp|tests/pg_replication_test.sh /tmp/slipstream-replication-tcp 55620 6 tcp"
  "replication-shm|tests/pg_replication_test.sh /tmp/slipstream-replication-shm 55630 6 shm"
  "crash|tests/pg_crash_test.sh"
  "takeover-flush|tests/pg_takeover_test.sh /tmp/slipstream-takeover-flush 55740 4 tcp remote_flush"
  "standby|tests/pg_standby_test.sh /tmp/slipstream-standby 55660"
  "regress|scripts/pg_regress.sh"
  "maintenance-report|tests/pg_maintenance_report_test.sh"
  "tablespace|tests/pg_tablespace_test.sh /tmp/slipstream-tablespace 55670 4"
  "pinned-stall|tests/pg_pinned_stall_test.sh"
  "promote-catch-up|tests/pg_promote_catch_up_test.sh /tmp/slipstream-promote-catch-up 55920"
  "replication-backup|tests/pg_replication_backup_test.sh /tmp/slipstream-replication-backup 55640 tcp"
  "ycsb-smoke|bench/ycsb_pg.sh --records=2000 --seconds=1 --mixes=SD --load-chunks=2 --port=55471 --scratch=/tmp/slipstream-ycsb-smoke"
  "vismap-churn|tests/pg_vismap_churn_test.sh"
  "contention|tests/pg_contention_test.sh"
  "send-index|tests/pg_send_index_test.sh /tmp/slipstream-send-index 55820 tcp"
  "logical|tests/pg_logical_test.sh /tmp/slipstream-logical 55680"
  "slot-past-wal|tests/pg_slot_past_wal_test.sh"
  "restart-partial-wal|tests/pg_restart_partial_wal_test.sh"
  "seed-crash|tests/pg_seed_crash_test.sh"
  "preload|tests/pg_preload_test.sh"
  "device-size|tests/pg_device_size_test.sh"
)

names=() commands=()
for entry in "${tests[@]}"; do
  name=${entry%%|*}
  if [ $# -gt 0 ]; then
    wanted=0
    for arg in "$@"; do [ "$arg" = "$name" ] && wanted=1; done
    [ "$wanted" = 1 ] || continue
  fi
  names+=("$name")
  commands+=("${entry#*|}")
done
if [ ${#names[@]} = 0 ]; then
  echo "pg_tests.sh: no test named $*; the names:" >&2
  for entry in "${tests[@]}"; do echo "  ${entry%%|*}" >&2; done
  exit 2
fi

rm -rf "$logs"
mkdir -p "$logs"
declare -A name_of start_of
failed=()
next=0
suite_start=$(date +%s)

# Starts test $1 in the background, its output into its log.
start_test() {
  local i=$1
  (cd "$root" && exec bash -c "${commands[$i]}") >"$logs/${names[$i]}.log" 2>&1 &
  name_of[$!]=${names[$i]}
  start_of[$!]=$(date +%s)
  echo "-- started ${names[$i]}"
}

running=0
while [ "$next" -lt ${#names[@]} ] || [ "$running" -gt 0 ]; do
  while [ "$running" -lt "$jobs" ] && [ "$next" -lt ${#names[@]} ] && [ ${#failed[@]} = 0 ]; do
    start_test "$next"
    next=$((next + 1))
    running=$((running + 1))
  done
  [ "$running" = 0 ] && break
  wait -n -p finished
  rc=$?
  running=$((running - 1))
  name=${name_of[$finished]}
  echo "==== $name"
  cat "$logs/$name.log"
  echo "== $name: $(($(date +%s) - ${start_of[$finished]})) s, exit $rc"
  [ "$rc" = 0 ] || failed+=("$name")
done

echo "== PostgreSQL tests: $(($(date +%s) - suite_start)) s, $jobs at a time"
if [ ${#failed[@]} -gt 0 ]; then
  # CI keeps only the end of the output, and the tests that ended after a failure push its log
  # out of it: the lines that say what failed are repeated here, last.
  for name in "${failed[@]}"; do
    echo "== what failed in $name:" >&2
    grep -E 'FAILED|failed|FAIL:|not ok|^[-+][^-+]|ERROR|PANIC|Assert' "$logs/$name.log" | tail -n 15 >&2
  done
  echo "FAILED: ${failed[*]} (logs in $logs)" >&2
  [ "$next" -lt ${#names[@]} ] && echo "not run after the failure: ${names[*]:$next}" >&2
  exit 1
fi
