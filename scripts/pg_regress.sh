#!/usr/bin/env bash
# pg_regress.sh: runs the pg_regress suite (sql/ + expected/) and the isolation specs
# (specs/ + expected/) against a private cluster with slipstream preloaded.
#   scripts/pg_regress.sh [scratch dir] [port]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=${1:-${SLIPSTREAM_SCRATCH:-/tmp/slipstream-regress}}
port=${2:-55440}
pgxs=$(dirname "$(dirname "$(dirname "$(pg_config --pgxs)")")")
cluster="$scratch/cluster"

# No autovacuum: the tests VACUUM when they mean to, and a concurrent ANALYZE would hold back
# the horizon that pruning and VACUUM in the expected outputs depend on.
"$root/scripts/pg_cluster.sh" init "$cluster" "$port" "autovacuum = off"
"$root/scripts/pg_cluster.sh" start "$cluster"
trap '"$root/scripts/pg_cluster.sh" stop "$cluster" immediate || true' EXIT

out="$scratch/out"
rm -rf "$out" && mkdir -p "$out"
[ "$(id -u)" = 0 ] && chown postgres: "$out" "$scratch"
tests=$(cd "$root/sql" && ls *.sql | sed 's/\.sql$//' | sort)
specs=$(cd "$root/specs" 2>/dev/null && ls *.spec 2>/dev/null | sed 's/\.spec$//' | sort || true)
status=0
run_as_postgres() { if [ "$(id -un)" = postgres ]; then "$@"; else runuser -u postgres -- "$@"; fi; }
# pg_regress reads sql/ and expected/ from the (possibly root-owned) clone, writes only to $out.
run_as_postgres "$pgxs/src/test/regress/pg_regress" --inputdir="$root" --outputdir="$out" \
  --host="$cluster/sock" --port="$port" --user=postgres --dbname=slipstream_regress \
  $tests || status=$?
if [ -n "$specs" ]; then
  run_as_postgres "$pgxs/src/test/isolation/pg_isolation_regress" --inputdir="$root" \
    --outputdir="$out/isolation" --host="$cluster/sock" --port="$port" --user=postgres \
    --dbname=slipstream_isolation --load-extension=slipstream $specs || status=$?
fi
if [ "$status" != 0 ]; then
  for f in "$out/regression.diffs" "$out/isolation/regression.diffs"; do
    [ -f "$f" ] && cat "$f"
  done
  tail -30 "$cluster/server.log"
fi
exit "$status"
