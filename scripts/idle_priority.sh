#!/usr/bin/env bash
# idle_priority.sh: runs a command at the lowest CPU priority, so that it takes the time the
# rest of the machine leaves idle. `nice` alone is not enough where the kernel groups
# processes by session for scheduling (autogroup, on in Debian's kernels): every PostgreSQL
# postmaster leads a session of its own, and each session's group gets an equal share of the
# CPU whatever its processes' nice values, so a niced compiler still took a cluster's share.
# The command gets a session of its own, whose group is set to nice 19 where the kernel has
# autogroups.
#   scripts/idle_priority.sh command [args...]
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: idle_priority.sh command [args...]" >&2; exit 2; }
exec setsid --wait bash -c '
  [ -w /proc/self/autogroup ] && echo 19 2>/dev/null >/proc/self/autogroup
  exec nice -n 19 "$@"' idle_priority "$@"
