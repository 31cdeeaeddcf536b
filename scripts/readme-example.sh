#!/usr/bin/env bash
# Runs the README's quick-start example against `make run`: the service on its
# defaults (SQLite file, local broker, port 8080), with only the broker vhost
# and the database file redirected so the run leaves nothing behind.
set -euo pipefail
cd "$(dirname "$0")/.."

vhost="ot-readme-$RANDOM$RANDOM"
workdir=$(mktemp -d)
log="$workdir/service.log"
mgmt=http://127.0.0.1:15672/api
pid=""

cleanup() {
    if [[ -n "$pid" ]]; then kill -TERM -- "-$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
    curl -sf -u guest:guest -X DELETE "$mgmt/vhosts/$vhost" >/dev/null || true
    rm -rf "$workdir"
}
trap cleanup EXIT

if curl -s -o /dev/null "http://127.0.0.1:8080/healthz"; then
    echo "readme-example: port 8080 is taken; the README example needs it" >&2
    exit 1
fi
curl -sf -u guest:guest -X PUT "$mgmt/vhosts/$vhost" >/dev/null
curl -sf -u guest:guest -X PUT -H 'content-type: application/json' \
    -d '{"configure":".*","write":".*","read":".*"}' "$mgmt/permissions/$vhost/guest" >/dev/null

export ORDER_TIMEOUT__AMQP__URL="amqp://guest:guest@127.0.0.1:5672/$vhost"
export ORDER_TIMEOUT__DATABASE__URL="sqlite://$workdir/order-timeout.db?mode=rwc"
setsid make run >"$log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
    if curl -sf http://127.0.0.1:8080/readyz >/dev/null 2>&1; then break; fi
    if ! kill -0 "$pid" 2>/dev/null; then cat "$log"; echo "readme-example: make run exited" >&2; exit 1; fi
    sleep 1
done
curl -sf http://127.0.0.1:8080/readyz >/dev/null || { cat "$log"; echo "readme-example: service not ready" >&2; exit 1; }

# The example, exactly as the README shows it.
example=$(awk '/<!-- readme-example:start -->/{on=1; next} /<!-- readme-example:end -->/{on=0} on && !/^```/' README.md)
[[ -n "$example" ]] || { echo "readme-example: no example block in README.md" >&2; exit 1; }
output=$(bash -euo pipefail -c "$example")
echo "$output"

order=$(grep '"id":"1"' <<<"$output" | tail -n 1)
stock=$(grep '"sku":"TSHIRT"' <<<"$output" | tail -n 1)
grep -q '"status":"cancelled"' <<<"$order" || { echo "readme-example: order 1 was not cancelled: $order" >&2; exit 1; }
grep -q '"available":10,"reserved":0' <<<"$stock" || { echo "readme-example: stock not back: $stock" >&2; exit 1; }
echo "readme-example: 1 passed, 0 failed"
