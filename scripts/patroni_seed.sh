#!/usr/bin/env bash
# patroni_seed.sh: Patroni's create_replica method in the tailwind mode of
# scripts/patroni_cluster.sh (docs/failover.md, "The Tailwind mode"): seeds a Tailwind backup
# with scripts/seed_backup.sh, connecting to the leader as the seeding role instead of
# Patroni's replication user, whose replication connections the leader refuses (they are the
# replicas' walreceivers: in this mode WAL reaches a replica only by Tailwind's one-sided
# writes). Then it gives the new standby its replication configuration
# ($PGDATA/slipstream_replication.conf, which seed_backup.sh removed from the copy):
#   - it serves as a backup on its own port from its first start (slipstream.serve_backup's
#     setting, before Patroni's on_start hook would make it);
#   - it has every other member configured as its backup (slipstream.add_backup's setting),
#     which stays inert while it is a standby (the shipper runs only once recovery is over)
#     and is there from the first moment it is promoted: a remote_memory commit on a new
#     leader always waits for its backups. Without it, the leader's hook adds them a moment
#     after the promotion, and a commit in between is acknowledged unreplicated (slipstream
#     does not wait while no backup is configured).
#
#   patroni_seed.sh --env TAILWIND_ENV --name NODE --user ROLE --passfile PGPASS  \
#                   --scope=S --role=R --datadir=DIR --connstring=CONNINFO   (Patroni adds these)
#
# CONNINFO is Patroni's (the leader, as the replication user); its user= is replaced by ROLE,
# whose password is in PGPASS. No --streaming: the seed is a standby without primary_conninfo
# (Patroni writes its own, which the leader refuses). TAILWIND_ENV is the scratch directory's
# tailwind.env (members, their serve ports, the file holding the backups' secret).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
env_file=""
name=""
user=""
passfile=""
scope=""
datadir=""
connstring=""

while [ $# -gt 0 ]; do
  case "$1" in
    --env) env_file=${2:?}; shift 2 ;;
    --env=*) env_file=${1#*=}; shift ;;
    --name) name=${2:?}; shift 2 ;;
    --name=*) name=${1#*=}; shift ;;
    --user) user=${2:?}; shift 2 ;;
    --user=*) user=${1#*=}; shift ;;
    --passfile) passfile=${2:?}; shift 2 ;;
    --passfile=*) passfile=${1#*=}; shift ;;
    --scope) scope=${2:?}; shift 2 ;;
    --scope=*) scope=${1#*=}; shift ;;
    --datadir) datadir=${2:?}; shift 2 ;;
    --datadir=*) datadir=${1#*=}; shift ;;
    --connstring) connstring=${2:?}; shift 2 ;;
    --connstring=*) connstring=${1#*=}; shift ;;
    --role) shift 2 ;;
    --role=*) shift ;;
    *) echo "patroni_seed.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "$env_file" ] || [ -z "$name" ] || [ -z "$user" ] || [ -z "$passfile" ] ||
   [ -z "$datadir" ] || [ -z "$connstring" ]; then
  sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
# shellcheck source=/dev/null
. "$env_file"
me=-1
for i in "${!members[@]}"; do [ "${members[$i]}" = "$name" ] && me=$i; done
[ "$me" -ge 0 ] || { echo "patroni_seed.sh: $name is not a member (${members[*]})" >&2; exit 2; }

# Patroni's DSN is "dbname=... user=... host=... port=..." (values with spaces escaped by a
# backslash): only the user changes.
if [[ " $connstring" =~ \ user=([^ \\]|\\.)+ ]]; then
  connstring=${connstring/"${BASH_REMATCH[0]# }"/user=$user}
else
  connstring="$connstring user=$user"
fi
export PGPASSFILE=$passfile
echo "patroni_seed.sh: seeding $name into $datadir from \"$connstring\" (Tailwind backup)"
"$root/scripts/seed_backup.sh" --connstring "$connstring" --datadir "$datadir" --name "$name" \
  ${scope:+--scope "$scope"}

# The standby's replication configuration, in the format slipstream writes it
# (extension/replication/repl_shmem.c: "backup NAME ADDRESS TRANSPORT VERSION SECRET SHIPPING
# COMPRESSION" and "serve LISTEN BUFFERS BUFFER_BYTES SECRET", secrets in hex, the version in
# microseconds since 2000-01-01 like add_backup's). The postmaster reads it at start.
secret_hex=$(tr -d '\n' <"$secret_file" | od -An -tx1 | tr -d ' \n')
version=$(( $(date +%s%N) / 1000 - 946684800000000 ))
conf="$datadir/slipstream_replication.conf"
(
  umask 077
  {
    echo "# slipstream replication settings (written by scripts/patroni_seed.sh for $name)"
    for j in "${!members[@]}"; do
      [ "$j" = "$me" ] && continue
      echo "backup ${members[$j]} 127.0.0.1:${serve_ports[$j]} $transport $version $secret_hex build_index plain"
    done
    echo "serve 127.0.0.1:${serve_ports[$me]} $serve_buffers $serve_buffer_bytes $secret_hex"
  } >"$conf.tmp"
  mv "$conf.tmp" "$conf"
)
echo "patroni_seed.sh: $name serves at 127.0.0.1:${serve_ports[$me]} from its first start; its backups, once promoted: $(grep -c '^backup ' "$conf")"
