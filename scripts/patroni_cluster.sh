#!/usr/bin/env bash
# patroni_cluster.sh: a slipstream cluster under Patroni on loopback: one local etcd and three
# Patroni nodes (a leader and two replicas), as users run them, in one of two modes:
#   baseline  the replicas are streaming replicas (PostgreSQL's own replication with our rm_redo
#             applying slipstream records on them), synchronous_mode_strict;
#   tailwind  the replicas are slipstream Tailwind backups: WAL reaches them by the leader's
#             one-sided writes, commits in remote_memory wait for both
#             (slipstream.min_sync_backups = 2), and Patroni's hooks
#             (scripts/patroni_callback.sh) make replicas serve, make the leader ship to them,
#             fence before a promotion and re-seed the backups a failover left behind.
# Everything runs as the postgres OS user (through runuser when invoked as root); data, sockets,
# logs and the generated etcd and Patroni configurations live in a scratch directory
# (default /tmp/slipstream-patroni, or $SLIPSTREAM_PATRONI_DIR). It never touches a system
# cluster. See docs/failover.md.
#
#   scripts/patroni_cluster.sh start [--tailwind]  # etcd, node0 bootstraps, node1 and node2 seeded
#                                       # (or SLIPSTREAM_PATRONI_MODE=tailwind; baseline by default)
#   scripts/patroni_cluster.sh stop             # every process of the scratch directory, only those
#   scripts/patroni_cluster.sh status           # etcd health, patronictl list, replication
#   scripts/patroni_cluster.sh psql [NODE] [psql args...]   # NODE: leader (default), node0..node2
#   scripts/patroni_cluster.sh leader           # prints the name of the running leader
#   scripts/patroni_cluster.sh settled          # true if both replicas stream (baseline: one of
#                                               # them synchronously; tailwind: both are backups
#                                               # in state streaming on the leader)
#   scripts/patroni_cluster.sh mode             # prints the mode of the cluster in the scratch dir
#
# Ports: etcd client 55880 and peer 55881, PostgreSQL 55890-55892, Patroni REST 55895-55897,
# and in the tailwind mode the backup servers on 55900-55902.
# Patroni calls back into this script for its post_bootstrap hook (`post-bootstrap CONNSTRING`:
# CREATE EXTENSION slipstream, and the replication user's membership in slipstream_admin so
# that scripts/seed_backup.sh, Patroni's create_replica_methods command, can run as it; in the
# tailwind mode also the seeding role slipstream_seeder, see docs/failover.md).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
scratch=${SLIPSTREAM_PATRONI_DIR:-/tmp/slipstream-patroni}
PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
scope=slipstream
etcd_client=55880
etcd_peer=55881
nodes=(node0 node1 node2)
marker=.slipstream-patroni
# baseline or tailwind: given to start (--tailwind or SLIPSTREAM_PATRONI_MODE), then kept in
# $scratch/mode for the other commands.
mode=${SLIPSTREAM_PATRONI_MODE:-baseline}
[ -f "$scratch/mode" ] && [ "${1:-}" != start ] && mode=$(cat "$scratch/mode")

# Prints the PostgreSQL port of node $1 (0..2).
pg_port() { echo $((55890 + $1)); }

# Prints the Patroni REST API port of node $1 (0..2).
rest_port() { echo $((55895 + $1)); }

# Prints the port node $1 (0..2) serves as a Tailwind backup on (tailwind mode).
serve_port() { echo $((55900 + $1)); }

# Prints 32 random hex digits.
random_hex() { od -An -N16 -tx1 /dev/urandom | tr -d ' \n'; }

# Prints the index (0..2) of the node named $1, or fails.
node_index() {
  case "$1" in
    node0) echo 0 ;; node1) echo 1 ;; node2) echo 2 ;;
    *) echo "patroni_cluster.sh: no node $1 (node0, node1, node2)" >&2; return 1 ;;
  esac
}

# True if process $1 is alive and its command line mentions the scratch directory.
ours() {
  local pid=$1
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$scratch/"
}

# Prints the pid recorded in pid file $1 if that process is ours and alive.
live_pid() {
  local pid
  [ -f "$1" ] || return 1
  pid=$(head -1 "$1")
  ours "$pid" && echo "$pid"
}

# Waits up to $1 seconds for command $2... to succeed; fails if it never does.
wait_until() {
  local secs=$1
  shift
  local end=$((SECONDS + secs))
  while [ "$SECONDS" -lt "$end" ]; do
    "$@" && return 0
    sleep 0.5
  done
  return 1
}

# The parts of a node's Patroni configuration that differ between the modes
# (docs/failover.md explains each setting).

# bootstrap.dcs: failover and synchronous replication.
mode_dcs() {
  if [ "$mode" = tailwind ]; then
    # slipstream's commit wait (2 of 2 backups) replaces synchronous replication; any backup
    # holds every acknowledged commit, so a lag only decides availability.
    cat <<EOF
    maximum_lag_on_failover: 67108864
    primary_start_timeout: 0
    synchronous_mode: false
EOF
  else
    cat <<EOF
    maximum_lag_on_failover: 1048576
    primary_start_timeout: 0
    synchronous_mode: true
    synchronous_mode_strict: true
    synchronous_node_count: 1
EOF
  fi
}

# bootstrap.dcs.ignore_slots beyond "slipstream": the leader's shipping slot and the seeds'
# (each line printed after a newline: nothing at all in the baseline mode).
mode_ignore_slots() {
  [ "$mode" = tailwind ] || return 0
  local n
  printf '\n%s' "      - name: slipstream_backups" "        type: physical"
  for n in "${nodes[@]}"; do
    printf '\n%s' "      - name: slipstream_seed_$n" "        type: physical"
  done
}

# bootstrap.dcs.postgresql.parameters beyond the common ones (the same way).
mode_parameters() {
  [ "$mode" = tailwind ] || return 0
  printf '\n%s' "        slipstream.min_sync_backups: 2"
}

# pg_hba.conf (bootstrap.pg_hba, and postgresql.pg_hba in the tailwind mode).
mode_pg_hba() {
  local indent=${1:-    }
  echo "$indent- local all all trust"
  if [ "$mode" = tailwind ]; then
    # Patroni reads a replica's timeline over a replication connection to the replica itself
    # (use_unix_socket_repl: through its private socket).
    echo "$indent- local replication all trust"
    # Patroni's replication user may not stream (Patroni writes primary_conninfo all the same:
    # each replica's walreceiver is refused, and WAL comes by Tailwind); the seeds replicate as
    # slipstream_seeder.
    echo "$indent- host replication replicator 127.0.0.1/32 reject"
    echo "$indent- host replication slipstream_seeder 127.0.0.1/32 scram-sha-256"
  else
    echo "$indent- host replication replicator 127.0.0.1/32 scram-sha-256"
  fi
  echo "$indent- host all all 127.0.0.1/32 scram-sha-256"
}

# The postgresql section's replica creation, divergence handling and hooks for node $1.
mode_postgresql() {
  local name=$1
  if [ "$mode" = tailwind ]; then
    local hook="$root/scripts/patroni_callback.sh --env $scratch/tailwind.env --node $name"
    cat <<EOF
  # Divergence is found by the backups (they refuse a primary of another timeline) and handled
  # by the leader's hook (patronictl reinit); Patroni's own check needs a replication
  # connection as the replication user, which the leader refuses.
  remove_data_directory_on_rewind_failure: false
  remove_data_directory_on_diverged_timelines: false
  use_unix_socket_repl: true
  pg_hba:
$(mode_pg_hba "    ")
  callbacks:
    on_start: $hook
    on_role_change: $hook
  pre_promote: $hook pre_promote
  create_replica_methods:
    - slipstream_seed
  slipstream_seed:
    command: $root/scripts/patroni_seed.sh --env $scratch/tailwind.env --name $name --user slipstream_seeder --passfile $scratch/seed.pgpass
EOF
  else
    cat <<EOF
  remove_data_directory_on_rewind_failure: true
  remove_data_directory_on_diverged_timelines: true
  create_replica_methods:
    - slipstream_seed
  slipstream_seed:
    command: $root/scripts/seed_backup.sh --streaming --name $name
EOF
  fi
}

# Writes the etcd configuration and the three Patroni configurations into the scratch dir (and,
# in the tailwind mode, the backups' shared secret, the seeding role's password and pgpass, and
# tailwind.env, which scripts/patroni_callback.sh reads).
write_configs() {
  local su_pw rep_pw seed_pw i name
  su_pw=$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')
  rep_pw=$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')
  if [ "$mode" = tailwind ]; then
    seed_pw=$(random_hex)
    (umask 077
     random_hex >"$scratch/slipstream.secret"
     echo "$seed_pw" >"$scratch/seeder.password"
     echo "127.0.0.1:*:*:slipstream_seeder:$seed_pw" >"$scratch/seed.pgpass")
    cat >"$scratch/tailwind.env" <<EOF
# The tailwind mode's layout, for scripts/patroni_callback.sh (generated by
# scripts/patroni_cluster.sh).
scope=$scope
pgbin=$PGBIN
members=(${nodes[*]})
pg_ports=($(pg_port 0) $(pg_port 1) $(pg_port 2))
rest_ports=($(rest_port 0) $(rest_port 1) $(rest_port 2))
serve_ports=($(serve_port 0) $(serve_port 1) $(serve_port 2))
transport=tcp
serve_buffers=8
serve_buffer_size=8MB
serve_buffer_bytes=8388608
secret_file=$scratch/slipstream.secret
EOF
  fi
  cat >"$scratch/etcd.yml" <<EOF
# etcd for the slipstream Patroni cluster (generated by scripts/patroni_cluster.sh)
name: slipstream-etcd
data-dir: $scratch/etcd
listen-client-urls: http://127.0.0.1:$etcd_client
advertise-client-urls: http://127.0.0.1:$etcd_client
listen-peer-urls: http://127.0.0.1:$etcd_peer
initial-advertise-peer-urls: http://127.0.0.1:$etcd_peer
initial-cluster: slipstream-etcd=http://127.0.0.1:$etcd_peer
initial-cluster-token: slipstream-patroni
initial-cluster-state: new
# Patroni's etcd3 client talks to the gRPC gateway (/v3/...), which a configuration file
# leaves off unless asked for.
enable-grpc-gateway: true
logger: zap
log-level: warn
EOF
  for i in 0 1 2; do
    name=${nodes[$i]}
    cat >"$scratch/$name.yml" <<EOF
# Patroni node $name of the slipstream cluster (generated by scripts/patroni_cluster.sh;
# docs/failover.md says what each setting is for).
scope: $scope
namespace: /slipstream-patroni/
name: $name

restapi:
  listen: 127.0.0.1:$(rest_port $i)
  connect_address: 127.0.0.1:$(rest_port $i)

etcd3:
  hosts:
    - 127.0.0.1:$etcd_client

watchdog:
  mode: off

bootstrap:
  dcs:
    ttl: 20
    loop_wait: 2
    retry_timeout: 5
$(mode_dcs)
    ignore_slots:
      - name: slipstream
        type: physical$(mode_ignore_slots)
    postgresql:
      use_pg_rewind: false
      use_slots: $([ "$mode" = tailwind ] && echo false || echo true)
      parameters:
        shared_preload_libraries: slipstream
        wal_level: replica
        hot_standby: "on"
        max_wal_senders: 10
        max_replication_slots: 10
        wal_keep_size: 256MB
        max_connections: 40
        shared_buffers: 128MB
        max_prepared_transactions: 10
        slipstream.l0_size: 4MB$(mode_parameters)
  initdb:
    - encoding: UTF8
    - locale: C
  pg_hba:
$(mode_pg_hba)
  post_bootstrap: $root/scripts/patroni_cluster.sh post-bootstrap$([ "$mode" = tailwind ] && echo " --seeder-password-file $scratch/seeder.password")

postgresql:
  listen: 127.0.0.1:$(pg_port $i)
  connect_address: 127.0.0.1:$(pg_port $i)
  data_dir: $scratch/$name/data
  bin_dir: $PGBIN
  pgpass: $scratch/$name/pgpass
  use_unix_socket: true
  authentication:
    superuser:
      username: postgres
      password: $su_pw
    replication:
      username: replicator
      password: $rep_pw
  parameters:
    unix_socket_directories: $scratch/$name/sock
    logging_collector: "on"
    log_directory: $scratch/$name/log
    log_filename: postgresql.log
    log_rotation_age: 0
    log_rotation_size: 0
  use_pg_rewind: false
$(mode_postgresql "$name")

tags:
  nofailover: false
  noloadbalance: false
  clonefrom: false
  nosync: false
EOF
  done
  chmod 600 "$scratch"/*.yml
  if [ "$(id -u)" = 0 ]; then
    chown postgres: "$scratch"/*.yml
    [ "$mode" = tailwind ] && chown postgres: "$scratch"/tailwind.env "$scratch"/seeder.password \
      "$scratch"/seed.pgpass "$scratch"/slipstream.secret
  fi
  return 0
}

# Starts daemon $2 (a command line) as postgres, its pid in file $1 and its output in file $3.
start_daemon() {
  local pidfile=$1 cmd=$2 log=$3
  # setsid, and no descriptor of ours: the daemons outlive this script, its process group and
  # whatever reads its output.
  rm -f "$pidfile"
  if [ "$(id -un)" = postgres ]; then
    setsid sh -c 'echo $$ >"$1"; exec $2 >>"$3" 2>&1' _ "$pidfile" "$cmd" "$log" \
      </dev/null >/dev/null 2>&1 &
  else
    setsid runuser -u postgres -- sh -c 'echo $$ >"$1"; exec $2 >>"$3" 2>&1' \
      _ "$pidfile" "$cmd" "$log" </dev/null >/dev/null 2>&1 &
  fi
  wait_until 10 test -s "$pidfile"
}

# Prints the HTTP status of GET $2 on the REST API of node $1 (000 if it does not answer).
rest_status() {
  curl -s -o /dev/null -m 2 -w '%{http_code}' "http://127.0.0.1:$(rest_port "$1")$2" || true
}

# Prints the JSON of GET /cluster from the first node whose REST API answers.
cluster_json() {
  local i
  for i in 0 1 2; do
    curl -sf -m 2 "http://127.0.0.1:$(rest_port $i)/cluster" && return 0
  done
  return 1
}

# Prints the name of the running leader: it holds the leader key and its PostgreSQL is a
# primary (fails if there is none).
leader() {
  local i
  for i in 0 1 2; do
    if [ "$(rest_status $i /primary)" = 200 ] &&
       [ "$(node_sql $i -c 'SELECT pg_is_in_recovery()' 2>/dev/null)" = f ]; then
      echo "${nodes[$i]}"
      return 0
    fi
  done
  return 1
}

# Runs psql on node $1 (0..2) through its socket, quiet and unaligned.
node_sql() {
  local i=$1
  shift
  "$PGBIN/psql" -X -qAt -v ON_ERROR_STOP=1 -h "$scratch/${nodes[$i]}/sock" -p "$(pg_port "$i")" \
    -U postgres -d postgres "$@"
}

# Prints the name of the synchronous standby Patroni has published in etcd (fails if none).
sync_standby() {
  local name
  name=$(cluster_json | jq -r '[.members[] | select(.role == "sync_standby") | .name] | join(" ")') || return 1
  [ -n "$name" ] && [ "${name// /}" = "$name" ] && echo "$name"
}

# True once the cluster is settled: the leader streams to both replicas, and the one standby
# Patroni published as synchronous in etcd is the leader's synchronous_standby_names and in
# sync (not the '*' that strict mode sets while it has no candidate, and not a change of
# synchronous standby half done: Patroni fails over only to the published one).
all_streaming() {
  local l i s names
  l=$(leader) || return 1
  i=$(node_index "$l")
  s=$(sync_standby) || return 1
  names=$(node_sql "$i" -c "SHOW synchronous_standby_names" 2>/dev/null) || return 1
  [ "${names//\"/}" = "$s" ] || return 1
  [ "$(node_sql "$i" -c "SELECT count(*) FILTER (WHERE state = 'streaming'),
                                count(*) FILTER (WHERE state = 'streaming' AND sync_state = 'sync'
                                                   AND application_name = '$s')
                         FROM pg_stat_replication" 2>/dev/null)" = "2|1" ]
}

# Tailwind mode: true once the leader ships to both other nodes as Tailwind backups (state
# streaming in slipstream.replication), so that commits in remote_memory go on.
all_backups_streaming() {
  local l i n
  l=$(leader) || return 1
  i=$(node_index "$l")
  n=$(node_sql "$i" -c "SELECT count(*) FROM slipstream.replication
                        WHERE state = 'streaming' AND name <> '$l'
                          AND name IN ('${nodes[0]}', '${nodes[1]}', '${nodes[2]}')" 2>/dev/null) || return 1
  [ "$n" = 2 ]
}

# True once the cluster is settled, in its mode.
settled() {
  if [ "$mode" = tailwind ]; then all_backups_streaming; else all_streaming; fi
}

# True if etcd or a Patroni node of the scratch directory is running.
running() {
  local n
  live_pid "$scratch/etcd.pid" >/dev/null && return 0
  for n in "${nodes[@]}"; do live_pid "$scratch/$n/patroni.pid" >/dev/null && return 0; done
  return 1
}

# True if etcd answers its health check.
etcd_healthy() { curl -sf -m 2 "http://127.0.0.1:$etcd_client/health" | grep -q '"health":"true"'; }

# Starts etcd and the three Patroni nodes on a fresh scratch directory; waits for a leader and
# two streaming replicas.
start() {
  local i
  if [ -e "$scratch" ] && [ ! -e "$scratch/$marker" ] && [ -n "$(ls -A "$scratch")" ]; then
    echo "patroni_cluster.sh: $scratch exists and is not ours; remove it or set SLIPSTREAM_PATRONI_DIR" >&2
    exit 1
  fi
  if [ -e "$scratch/$marker" ] && running; then
    echo "patroni_cluster.sh: a cluster is running in $scratch; stop it first" >&2
    exit 1
  fi
  case "$mode" in
    baseline|tailwind) ;;
    *) echo "patroni_cluster.sh: unknown mode $mode (baseline or tailwind)" >&2; exit 2 ;;
  esac
  rm -rf "$scratch"
  mkdir -p "$scratch/etcd"
  for n in "${nodes[@]}"; do mkdir -p "$scratch/$n/sock" "$scratch/$n/log"; done
  touch "$scratch/$marker"
  echo "$mode" >"$scratch/mode"
  chmod 700 "$scratch" "$scratch/etcd"
  [ "$(id -u)" = 0 ] && chown -R postgres: "$scratch"
  write_configs

  start_daemon "$scratch/etcd.pid" "etcd --config-file $scratch/etcd.yml" "$scratch/etcd.log"
  wait_until 30 etcd_healthy || { echo "etcd did not become healthy; see $scratch/etcd.log" >&2; exit 1; }

  # node0 bootstraps (initdb, post_bootstrap); the others then seed from it.
  start_patroni 0
  if ! wait_until 120 leader >/dev/null; then
    echo "node0 did not bootstrap within 120 s; see $scratch/node0/patroni.log" >&2
    tail -20 "$scratch/node0/patroni.log" >&2
    exit 1
  fi
  for i in 1 2; do start_patroni "$i"; done
  if ! wait_settled 180; then
    echo "the replicas did not stream within 180 s ($mode mode)" >&2
    status >&2 || true
    for n in "${nodes[@]}"; do
      echo "--- $n: patroni.log" >&2
      tail -25 "$scratch/$n/patroni.log" >&2 || true
      echo "--- $n: postgresql.log" >&2
      tail -15 "$scratch/$n/log/postgresql.log" >&2 || true
    done
    exit 1
  fi
  status
}

# Starts the Patroni daemon of node $1 (0..2).
start_patroni() {
  start_daemon "$scratch/${nodes[$1]}/patroni.pid" "patroni $scratch/${nodes[$1]}.yml" \
    "$scratch/${nodes[$1]}/patroni.log"
}

# Waits up to $1 seconds for the cluster to settle. A Patroni that exits while it starts (its
# REST or PostgreSQL port taken for a moment: all our ports lie in the kernel's ephemeral range,
# so any outgoing connection may hold one) is started again, at most 5 times per node and
# 1, 2, 4, 8 then 16 s after it exited, once its log's last lines are shown.
wait_settled() {
  local end=$((SECONDS + $1)) i restarts=(0 0 0)
  while [ "$SECONDS" -lt "$end" ]; do
    settled && return 0
    for i in 0 1 2; do
      live_pid "$scratch/${nodes[$i]}/patroni.pid" >/dev/null && continue
      if [ "${restarts[$i]}" -ge 5 ]; then
        echo "Patroni of ${nodes[$i]} exited 6 times while the cluster started" >&2
        return 1
      fi
      echo "Patroni of ${nodes[$i]} exited while the cluster started; starting it again in $((1 << restarts[$i])) s. Its log ended with:" >&2
      tail -3 "$scratch/${nodes[$i]}/patroni.log" | sed 's/^/  /' >&2 || true
      sleep $((1 << restarts[$i]))
      restarts[$i]=$((restarts[$i] + 1))
      start_patroni "$i"
    done
    sleep 0.5
  done
  return 1
}

# Sends signal $1 to every live pid in "$@" and waits up to $2 seconds for them to exit.
signal_and_wait() {
  local sig=$1 secs=$2 pid
  shift 2
  for pid in "$@"; do kill "-$sig" "$pid" 2>/dev/null || true; done
  local end=$((SECONDS + secs))
  while [ "$SECONDS" -lt "$end" ]; do
    local alive=0
    for pid in "$@"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && return 0
    sleep 0.2
  done
  return 1
}

# Prints the postgres-owned processes whose command line names the scratch directory (other
# than this script and its ancestors).
leftovers() {
  local uid pid p self_chain=" $$ "
  uid=$(id -u postgres)
  p=$$
  while [ "$p" -gt 1 ]; do
    p=$(awk '{print $4}' "/proc/$p/stat" 2>/dev/null || echo 1)
    self_chain+="$p "
  done
  for pid in /proc/[0-9]*; do
    pid=${pid#/proc/}
    [ "$(stat -c %u "/proc/$pid" 2>/dev/null)" = "$uid" ] || continue
    case "$self_chain" in *" $pid "*) continue ;; esac
    ours "$pid" && echo "$pid"
  done
  return 0
}

# Stops the Patroni nodes (each stops its PostgreSQL), etcd, then anything of the scratch
# directory that is left (postmasters, seeds): only processes of this scratch directory.
stop() {
  local pids=() n pid
  [ -d "$scratch" ] || return 0
  for n in "${nodes[@]}"; do
    pid=$(live_pid "$scratch/$n/patroni.pid") && pids+=("$pid")
  done
  if [ "${#pids[@]}" -gt 0 ] && ! signal_and_wait TERM 60 "${pids[@]}"; then
    echo "patroni_cluster.sh: Patroni did not stop within 60 s; killing it" >&2
    signal_and_wait KILL 10 "${pids[@]}" || true
  fi
  # Postmasters left behind (a Patroni killed or stuck): immediate shutdown, then SIGKILL.
  pids=()
  for n in "${nodes[@]}"; do
    pid=$(live_pid "$scratch/$n/data/postmaster.pid") && pids+=("$pid")
  done
  if [ "${#pids[@]}" -gt 0 ] && ! signal_and_wait QUIT 20 "${pids[@]}"; then
    signal_and_wait KILL 10 "${pids[@]}" || true
  fi
  if pid=$(live_pid "$scratch/etcd.pid"); then
    signal_and_wait TERM 20 "$pid" || signal_and_wait KILL 10 "$pid" || true
  fi
  # Anything else still naming the scratch directory (pg_basebackup of a seed, ...).
  mapfile -t pids < <(leftovers)
  if [ "${#pids[@]}" -gt 0 ]; then
    signal_and_wait TERM 10 "${pids[@]}" || signal_and_wait KILL 10 "${pids[@]}" || true
  fi
  return 0
}

# Prints etcd's health, Patroni's view of the cluster and the leader's replication.
status() {
  local l
  if etcd_healthy; then echo "etcd: healthy on 127.0.0.1:$etcd_client"; else echo "etcd: not answering"; fi
  echo "mode: $mode"
  patronictl -c "$scratch/node0.yml" list 2>&1 || true
  if l=$(leader) && [ "$mode" = tailwind ]; then
    echo "leader $l ships WAL to its Tailwind backups (slipstream.replication):"
    node_sql "$(node_index "$l")" -P footer=off -P format=aligned -P tuples_only=off \
      -c "SELECT name, address, state, sent_lsn, placed_lsn, durable_lsn, placed_lag, error
          FROM slipstream.replication ORDER BY 1"
  elif [ -n "${l:-}" ]; then
    echo "leader $l replicates to:"
    node_sql "$(node_index "$l")" -P footer=off -P format=aligned -P tuples_only=off \
      -c "SELECT application_name, state, sync_state, replay_lsn FROM pg_stat_replication ORDER BY 1"
  else
    echo "no running leader"
  fi
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  start)
    for a in "$@"; do
      case "$a" in
        --tailwind) mode=tailwind ;;
        --baseline) mode=baseline ;;
        *) echo "patroni_cluster.sh: start takes --tailwind or --baseline, not $a" >&2; exit 2 ;;
      esac
    done
    start
    ;;
  stop) stop ;;
  status) status ;;
  leader) leader ;;
  settled) settled ;;
  mode) echo "$mode" ;;
  psql)
    target=leader
    case "${1:-}" in leader|node0|node1|node2) target=$1; shift ;; esac
    if [ "$target" = leader ]; then
      target=$(leader) || { echo "patroni_cluster.sh: no running leader" >&2; exit 1; }
    fi
    i=$(node_index "$target")
    exec "$PGBIN/psql" -X -h "$scratch/$target/sock" -p "$(pg_port "$i")" -U postgres -d postgres "$@"
    ;;
  post-bootstrap)
    # Called by Patroni on the bootstrapped node, with the superuser's connection string last
    # ([--seeder-password-file FILE] CONNSTRING).
    seeder_file=""
    if [ "${1:-}" = --seeder-password-file ]; then seeder_file=${2:?}; shift 2; fi
    conn=${1:?connection string}
    # Patroni creates the replication user only after this hook: create it here (Patroni then
    # sets its password) so that it can be made a member of slipstream_admin.
    "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -d "$conn" \
      -c "CREATE EXTENSION IF NOT EXISTS slipstream" \
      -c "DO \$\$ BEGIN
            IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'replicator') THEN
              CREATE ROLE replicator LOGIN REPLICATION;
            END IF;
          END \$\$" \
      -c "GRANT slipstream_admin TO replicator"
    if [ -n "$seeder_file" ]; then
      # Tailwind mode: the role the seeds replicate as (the leader refuses the replication
      # user's replication connections, which are its replicas' walreceivers).
      "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -d "$conn" -v pw="$(cat "$seeder_file")" <<'EOF'
SELECT format('CREATE ROLE slipstream_seeder LOGIN REPLICATION PASSWORD %L', :'pw')
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'slipstream_seeder') \gexec
GRANT slipstream_admin TO slipstream_seeder;
EOF
    fi
    ;;
  *)
    sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
