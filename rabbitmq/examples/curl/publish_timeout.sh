#!/usr/bin/env bash
# Publish one order timeout to order-timeout through RabbitMQ's management HTTP
# API, per the service's wire contract (v1).
#
#     ./publish_timeout.sh --order-id 42 --delay-ms 1800000
#     ./publish_timeout.sh --url http://user:pass@broker:15672 --vhost shop --order-id 42 --delay-ms 60000
#
# For tooling, scripts and operators (re-sending a timeout by hand, a smoke test
# after a deploy), NOT for production checkouts: the HTTP API has no publisher
# confirms (an answer of "routed": true means the message reached a queue, not
# that it is safe on disk), opens a channel per request, and needs management
# credentials. Production publishers use AMQP with confirms (see ../python, ../node).
#
# --url is the management API's base (default http://guest:guest@127.0.0.1:15672),
# credentials included; --vhost the virtual host (default "/"). Needs curl and jq.
#
# The script checks "routed": true, so a wrong exchange or a missing binding
# fails loudly. The entry exchange is a plain fanout in both delay modes (the
# service validates a message before it waits), so "routed" means what it says
# with or without the delayed-message plugin; tested in both modes. (Published
# straight into a delayed-message exchange, the plugin would answer "routed":
# false for a message it did schedule: it routes when the delay ends.)
set -euo pipefail

url="http://guest:guest@127.0.0.1:15672"
vhost="/"
exchange="order.timeouts"
kind="payment"
order_id=""
delay_ms=""
max_delay_ms=4294967295 # the plugin's limit, about 49.7 days

usage() {
	echo "$1" >&2
	echo "usage: $0 [--url URL] [--vhost VHOST] [--exchange NAME] --order-id ID [--kind payment|fulfillment|receipt] --delay-ms MS" >&2
	exit 2
}

while [[ $# -gt 0 ]]; do
	case "$1" in
	--url) url="${2:?}"; shift 2 ;;
	--vhost) vhost="${2:?}"; shift 2 ;;
	--exchange) exchange="${2:?}"; shift 2 ;;
	--order-id) order_id="${2:?}"; shift 2 ;;
	--kind) kind="${2:?}"; shift 2 ;;
	--delay-ms) delay_ms="${2:?}"; shift 2 ;;
	*) usage "unknown argument: $1" ;;
	esac
done
[[ -n "$order_id" ]] || usage "--order-id is required"
case "$kind" in payment | fulfillment | receipt) ;; *) usage "--kind must be payment, fulfillment or receipt" ;; esac
# An integer, not a float: the service parks a non-integer x-delay.
[[ "$delay_ms" =~ ^[0-9]+$ ]] && ((delay_ms > 0 && delay_ms <= max_delay_ms)) ||
	usage "--delay-ms must be an integer from 1 to $max_delay_ms"

now_s=$(date -u +%s)
due_at=$(date -u -d "@$(((now_s * 1000 + delay_ms) / 1000))" +%Y-%m-%dT%H:%M:%SZ)
message_id=$(cat /proc/sys/kernel/random/uuid 2>/dev/null || uuidgen)

# jq builds the JSON, so any order id or name is quoted correctly. order_id is a
# string: ids above 2^53 do not survive JSON numbers. x-delay is a JSON integer,
# which the broker turns into an AMQP integer header.
request=$(jq -n \
	--arg order_id "$order_id" --arg kind "$kind" --arg due_at "$due_at" \
	--arg message_id "$message_id" --argjson timestamp "$now_s" --argjson delay "$delay_ms" \
	'{
	  routing_key: $kind,
	  payload: ({order_id: $order_id, kind: $kind, due_at: $due_at} | tojson),
	  payload_encoding: "string",
	  properties: {
	    content_type: "application/json",
	    delivery_mode: 2,
	    message_id: $message_id,
	    timestamp: $timestamp,
	    headers: {"x-delay": $delay}
	  }
	}')

# Names in the path are percent-encoded ("/" is the default vhost: %2F).
encode() { jq -rn --arg s "$1" '$s | @uri'; }
answer=$(curl -sS --fail-with-body -X POST \
	-H 'content-type: application/json' \
	--data "$request" \
	"$url/api/exchanges/$(encode "$vhost")/$(encode "$exchange")/publish")

if [[ "$(jq -r '.routed' <<<"$answer")" != "true" ]]; then
	echo "the broker did not route the message (answer: $answer): check --vhost and --exchange" >&2
	exit 1
fi
echo "scheduled $kind timeout for order $order_id in $delay_ms ms"
