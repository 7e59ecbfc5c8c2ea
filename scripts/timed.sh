#!/usr/bin/env bash
# timed.sh: runs one test command and prints how long it took, so that a log of `make check`
# shows where the suite's 30 minutes go (CI keeps only the log).
#
#   scripts/timed.sh COMMAND [ARG...]
set -uo pipefail
start=$(date +%s)
"$@"
rc=$?
echo "== $(basename "$1") ${*:2}: $(( $(date +%s) - start )) s, exit $rc"
exit "$rc"
