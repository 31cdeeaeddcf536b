#!/usr/bin/env bash
# The database's ceiling for checkout on this machine: the statement of one
# checkout as the service sends it on PostgreSQL
# (bench/pgbench/checkout-one-statement.sql; bench/pgbench/checkout.sql is the
# statement-at-a-time checkout of MariaDB and SQLite), from CLIENTS
# connections for SECS seconds with pgbench, on a throwaway PostgreSQL database
# that the service's own migrations created. No service, no broker, no HTTP:
# what the database alone allows, and what it costs in machine CPU per order.
# Prints the figures and writes them as JSON (OUT). Needs pgbench (PostgreSQL's
# client tools) and a release build (`cargo build --release`).
#   bench/checkout-ceiling.sh            # 64 clients, 20 s
#   CLIENTS=16 SECS=10 bench/checkout-ceiling.sh
#   SCRIPT=bench/pgbench/checkout.sql bench/checkout-ceiling.sh
set -euo pipefail
cd "$(dirname "$0")/.."
clients=${CLIENTS:-64}
secs=${SECS:-20}
out=${OUT:-target/bench/checkout-ceiling.json}
script=${SCRIPT:-bench/pgbench/checkout-one-statement.sql}
admin=${POSTGRES_ADMIN:-postgres://postgres@127.0.0.1:5432/postgres}
db="ot_pgbench_$$_$RANDOM"
url="postgres://postgres@127.0.0.1:5432/$db"

psql -q "$admin" -c "CREATE DATABASE $db"
trap 'psql -q "$admin" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null' EXIT
ORDER_TIMEOUT__DATABASE__URL="$url" ./target/release/order-timeout migrate up >/dev/null 2>&1
psql -q "$url" -c "INSERT INTO inventory (sku, available, reserved, sold, updated_at_ms)
    SELECT 'S' || g, 1000000000000, 0, 0, 0 FROM generate_series(1, 64) AS g"

# Busy and total CPU time of the whole machine, in clock ticks (/proc/stat).
ticks() { awk '/^cpu / {print $2+$3+$4+$7+$8+$9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat; }
read -r busy0 total0 < <(ticks)
result=$(pgbench -n -M prepared -c "$clients" -j 2 -T "$secs" -f "$script" "$url" 2>&1)
read -r busy1 total1 < <(ticks)
tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$result")
failed=$(sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' <<<"$result")
if [[ -z "$tps" ]]; then
    echo "$result" >&2
    echo "checkout-ceiling: pgbench gave no tps" >&2
    exit 1
fi
orders=$(psql -tA "$url" -c "SELECT COUNT(*) FROM orders")
cores=$(nproc)
awk -v tps="$tps" -v orders="$orders" -v failed="${failed:-0}" -v b="$((busy1 - busy0))" -v t="$((total1 - total0))" \
    -v cores="$cores" -v clients="$clients" -v script="$script" -v secs="$secs" -v out="$out" 'BEGIN {
    busy = cores * b / t;                   # cores busy on average
    ms = busy * 1000 / tps;                 # machine CPU per checkout, ms
    printf "checkout ceiling (database alone, pgbench %s, %d clients, %d s)\n", script, clients, secs;
    printf "  %.0f checkouts/s, %d orders written, %d failed\n", tps, orders, failed;
    printf "  %.2f of %d cores busy: %.2f ms of machine CPU per checkout (pgbench included)\n", busy, cores, ms;
    printf "  3,000 checkouts/s would need %.1f cores for the database statements alone\n", ms * 3000 / 1000;
    printf "{\"scenario\":\"checkout_ceiling\",\"script\":\"%s\",\"clients\":%d,\"secs\":%d,\"checkouts_per_s\":%.1f,\"orders\":%d,\"failed\":%d,\"cores_busy\":%.2f,\"cores\":%d,\"cpu_ms_per_checkout\":%.3f}\n", script, clients, secs, tps, orders, failed, busy, cores, ms > out;
}'
echo "wrote $out"
