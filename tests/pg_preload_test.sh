#!/usr/bin/env bash
# pg_preload_test.sh: without shared_preload_libraries, CREATE EXTENSION slipstream must fail
# with a clear error and a hint, and leave nothing behind.
#   tests/pg_preload_test.sh [scratch dir] [port]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=${1:-${SLIPSTREAM_SCRATCH:-/tmp/slipstream-preload}}
port=${2:-55465}
cluster="$scratch/cluster"
pg="$root/scripts/pg_cluster.sh"

"$pg" init "$cluster" "$port" "shared_preload_libraries = ''"
"$pg" start "$cluster"
trap '"$pg" stop "$cluster" immediate >/dev/null 2>&1 || true' EXIT
out=$("$pg" psql "$cluster" -c "CREATE EXTENSION slipstream" 2>&1 || true)
echo "$out"
echo "$out" | grep -q "ERROR:  slipstream must be loaded via shared_preload_libraries"
echo "$out" | grep -q "HINT:  Add slipstream to shared_preload_libraries"
left=$("$pg" psql "$cluster" -qAt -c "SELECT count(*) FROM pg_extension WHERE extname = 'slipstream'")
[ "$left" = 0 ]
echo "preload test passed"
