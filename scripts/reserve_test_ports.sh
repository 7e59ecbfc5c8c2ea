#!/usr/bin/env bash
# reserve_test_ports.sh: keeps the kernel from handing out the loopback ports the PostgreSQL
# tests listen on (55400-55999) as the source ports of outgoing connections.
#
# Those ports lie inside Linux's ephemeral range (32768-60999 by default), so any connection a
# test makes (psql over TCP, a shipper to its backup, Patroni to etcd) may be given one of them
# as its own port, and a server that starts then fails to bind it ("Address already in use").
# net.ipv4.ip_local_reserved_ports takes them out of the ephemeral range; listening on them
# explicitly still works. Added to what is reserved already; needs root (or sudo), and without
# it the tests still run, with only their retries to fall back on.
#
#   scripts/reserve_test_ports.sh
set -euo pipefail
range=55400-55999
knob=/proc/sys/net/ipv4/ip_local_reserved_ports

[ -r "$knob" ] || { echo "reserve_test_ports.sh: no $knob; ports not reserved"; exit 0; }
current=$(cat "$knob")
case ",$current," in
  *",$range,"*) exit 0 ;;
esac
wanted=${current:+$current,}$range
if [ "$(id -u)" = 0 ]; then
  echo "$wanted" >"$knob" 2>/dev/null || { echo "reserve_test_ports.sh: could not write $knob; ports not reserved"; exit 0; }
elif sudo -n true 2>/dev/null; then
  echo "$wanted" | sudo -n tee "$knob" >/dev/null || { echo "reserve_test_ports.sh: could not write $knob; ports not reserved"; exit 0; }
else
  echo "reserve_test_ports.sh: not root and no sudo; ports $range not reserved (tests retry on a taken port)"
  exit 0
fi
echo "reserved ports $range for the tests' servers (net.ipv4.ip_local_reserved_ports = $(cat "$knob"))"
