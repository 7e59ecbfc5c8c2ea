#!/usr/bin/env bash
# sqlsmith.sh: sqlsmith's random queries against slipstream tables, with heap as the referee.
#
# One private cluster holds two databases made by scripts/sqlsmith_schema.sql from the same
# data: `smith` (every table USING slipstream) and `smith_heap` (heap). sqlsmith runs QUERIES
# queries against `smith` as a role that is not a superuser (so that it cannot stop the server
# on purpose; the slipstream schema's functions are among those it calls). Then:
#   - no server process may have crashed, PANICked or failed an assertion;
#   - every error the server logged (csvlog, with its statement) must be one heap gives for the
#     same statement (sqlsmith_compare.py replays a sample of each kind against `smith_heap`)
#     or a documented slipstream error (scripts/sqlsmith_known_errors.txt).
#
#   scripts/sqlsmith.sh [queries] [seed] [scratch dir] [port]      (make sqlsmith)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
queries=${1:-${SQLSMITH_QUERIES:-20000}}
seed=${2:-${SQLSMITH_SEED:-$RANDOM}}
scratch=${3:-${SLIPSTREAM_SCRATCH:-/tmp/slipstream-sqlsmith}}
port=${4:-55980}
pg="$root/scripts/pg_cluster.sh"
cluster="$scratch/cluster"

rm -rf "$scratch"
mkdir -p "$scratch"
"$pg" init "$cluster" "$port" "logging_collector = on" "log_destination = 'csvlog'" \
  "log_directory = 'log'" "log_filename = 'postgres.log'" "log_min_error_statement = error" \
  "log_min_messages = warning" "jit = off" >/dev/null
"$pg" start "$cluster"
trap '"$pg" stop "$cluster" immediate >/dev/null 2>&1 || true' EXIT
sql() { "$pg" psql "$cluster" -qAt "$@"; }

sql -c "CREATE ROLE smith LOGIN" -c "ALTER ROLE smith SET statement_timeout = '2s'" \
  -c "CREATE DATABASE smith OWNER smith" -c "CREATE DATABASE smith_heap OWNER smith" >/dev/null
sql -d smith -c "CREATE EXTENSION slipstream" -c "ALTER SCHEMA public OWNER TO smith" >/dev/null
sql -d smith_heap -c "CREATE EXTENSION slipstream" -c "ALTER SCHEMA public OWNER TO smith" >/dev/null
PGOPTIONS="-c default_table_access_method=slipstream -c client_min_messages=warning" \
  "$pg" psql "$cluster" -qAt -U smith -d smith -f "$root/scripts/sqlsmith_schema.sql" >/dev/null
PGOPTIONS="-c default_table_access_method=heap -c client_min_messages=warning" \
  "$pg" psql "$cluster" -qAt -U smith -d smith_heap -f "$root/scripts/sqlsmith_schema.sql" >/dev/null
[ "$(sql -d smith -c "SELECT count(*) FROM pg_class c JOIN pg_am a ON a.oid = c.relam
      WHERE a.amname = 'slipstream' AND c.relnamespace = 'public'::regnamespace")" -ge 5 ] || {
  echo "the smith database's tables are not slipstream tables" >&2
  exit 1
}
log_start=$(stat -c %s "$cluster/data/log/postgres.csv")

echo "sqlsmith: $queries queries, seed $seed, against slipstream tables"
start=$(date +%s)
sqlsmith --target="host=$cluster/sock port=$port dbname=smith user=smith" --seed="$seed" \
  --max-queries="$queries" --exclude-catalog --verbose >"$scratch/sqlsmith.out" 2>&1 || {
  echo "sqlsmith exited with $? (last lines of its output):" >&2
  tail -n 20 "$scratch/sqlsmith.out" >&2
}
echo "sqlsmith ran for $(($(date +%s) - start)) s; its summary:"
grep -E "^error rate" "$scratch/sqlsmith.out" || true

status=0
crashes=$(grep -c -E "terminated by signal|PANIC|TRAP:|server process .* exited with exit code [^01]" \
  "$cluster/data/log/postgres.csv" || true)
if [ "$crashes" != 0 ]; then
  echo "the server crashed or PANICked $crashes times:" >&2
  grep -E "terminated by signal|PANIC|TRAP:" "$cluster/data/log/postgres.csv" | head -n 10 >&2
  status=1
fi
python3 "$root/scripts/sqlsmith_compare.py" --log="$cluster/data/log/postgres.csv" --offset="$log_start" \
  --known="$root/scripts/sqlsmith_known_errors.txt" --psql="$root/scripts/pg_cluster.sh psql $cluster" \
  --report="$scratch/errors.txt" || status=1
[ "$status" = 0 ] && echo "sqlsmith: no crash, and every error is heap's or a documented slipstream one"
exit "$status"
