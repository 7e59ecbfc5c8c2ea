#!/usr/bin/env bash
# demo_shuffle.sh: a repartitioned join and aggregate in plain SQL across three PostgreSQL nodes
# on this machine, with slipstream.shuffle (docs/shuffle.md). Orders are spread over the nodes by
# order id and customers by a range of ids, so no node can join them alone. Both are shuffled by
# customer id into tables of their own on every node, each node joins and aggregates its share,
# and the answer is checked against the same query over all the rows in one place.
#   scripts/demo_shuffle.sh [scratch dir] [first port] [orders]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=${1:-${SLIPSTREAM_SCRATCH:-/tmp/slipstream-demo-shuffle}}
port=${2:-55410}
orders=${3:-300000}
pg="$root/scripts/pg_cluster.sh"
mkdir -p "$scratch"
[ "$(id -u)" = 0 ] && chown postgres: "$scratch"
psql_node() { local n=$1; shift; "$pg" psql "$scratch/n$n" -qAt "$@"; }
cleanup() { for n in 0 1 2; do "$pg" stop "$scratch/n$n" >/dev/null 2>&1 || true; done; }
trap cleanup EXIT

echo "== three private PostgreSQL 15 clusters in $scratch (ports $port-$((port + 2)))"
for n in 0 1 2; do
  "$pg" init "$scratch/n$n" $((port + n)) >/dev/null
  "$pg" start "$scratch/n$n"
done
nodes="ARRAY['host=$scratch/n0/sock port=$port dbname=postgres',
              'host=$scratch/n1/sock port=$((port + 1)) dbname=postgres',
              'host=$scratch/n2/sock port=$((port + 2)) dbname=postgres']"
per_node=$((orders / 3))
for n in 0 1 2; do
  psql_node $n -c "CREATE EXTENSION slipstream" \
    -c "SELECT slipstream.create_peer_group('demo', $nodes, $n, 'demo secret', 'auto')" \
    -c "CREATE TABLE orders (order_id bigint, customer_id int, total numeric(10,2)) USING slipstream" \
    -c "INSERT INTO orders SELECT g, (1 + (g::bigint * 7919) % 5000)::int, (g % 997) / 10.0
        FROM generate_series($n * $per_node + 1, ($n + 1) * $per_node) g" \
    -c "CREATE TABLE customers (customer_id int, region text) USING slipstream" \
    -c "INSERT INTO customers SELECT c, (ARRAY['north','south','east','west'])[1 + c % 4]
        FROM generate_series($n * 5000 / 3 + 1, ($n + 1) * 5000 / 3) c" \
    -c "CREATE UNLOGGED TABLE my_orders (LIKE orders); CREATE UNLOGGED TABLE my_customers (LIKE customers)" \
    >/dev/null
done
echo "orders per node:    $(for n in 0 1 2; do psql_node $n -c 'SELECT count(*) FROM orders'; done | paste -sd' ')"
echo "customers per node: $(for n in 0 1 2; do psql_node $n -c 'SELECT count(*) FROM customers'; done | paste -sd' ')"
psql_node 0 -c "SELECT * FROM slipstream.peer_groups" -P pager=off

echo "== step 1: shuffle orders and customers by customer_id (slipstream.shuffle_on_group)"
start=$(date +%s.%N)
"$pg" psql "$scratch/n0" -c "SELECT * FROM slipstream.shuffle_on_group('demo', \$\$
  INSERT INTO my_orders SELECT * FROM slipstream.shuffle('SELECT * FROM orders', 'customer_id', 'demo')
    AS t(order_id bigint, customer_id int, total numeric(10,2))\$\$)"
"$pg" psql "$scratch/n0" -c "SELECT * FROM slipstream.shuffle_on_group('demo', \$\$
  INSERT INTO my_customers SELECT * FROM slipstream.shuffle('SELECT * FROM customers', 'customer_id', 'demo')
    AS t(customer_id int, region text)\$\$)"
end=$(date +%s.%N)
awk -v s="$start" -v e="$end" -v n="$orders" 'BEGIN { printf "shuffled %d orders and 5000 customers in %.2f s\n", n, e - s }'

echo "== step 2: every node joins and aggregates its share (revenue per region)"
for n in 0 1 2; do
  psql_node $n -c "CREATE TABLE part AS SELECT region, count(*) AS orders, sum(total) AS revenue
                   FROM my_orders JOIN my_customers USING (customer_id) GROUP BY region"
done
echo "== step 3: the per-node partial sums, gathered and added up"
answer=$(for n in 0 1 2; do psql_node $n -c "SELECT region, orders, revenue FROM part"; done |
  awk -F'|' '{ o[$1] += $2; r[$1] += $3 } END { for (k in o) printf "%s|%d|%.2f\n", k, o[k], r[k] }' | sort)
echo "$answer" | awk -F'|' '{ printf "%-6s %8s %14s\n", $1, $2, $3 }'

echo "== check: the same query over all the rows on one node"
for n in 1 2; do
  psql_node $n -c "COPY orders TO STDOUT" | psql_node 0 -c "COPY orders FROM STDIN"
  psql_node $n -c "COPY customers TO STDOUT" | psql_node 0 -c "COPY customers FROM STDIN"
done
expected=$(psql_node 0 -c "SELECT region, count(*), sum(total) FROM orders JOIN customers USING (customer_id)
                           GROUP BY region ORDER BY region")
if [ "$answer" = "$expected" ]; then
  echo "the repartitioned join gives the single-node answer: OK"
else
  echo "MISMATCH:"; echo "$expected"; exit 1
fi
