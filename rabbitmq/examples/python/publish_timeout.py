#!/usr/bin/env python3
"""Publish one order timeout to order-timeout, per its wire contract (v1).

    pip install pika
    python publish_timeout.py --order-id 42 --delay-ms 1800000

The same message works whether the service runs in plugin or TTL mode: the
exchange is the configured prefix (default "order.timeouts"), the routing key
is the kind, the header x-delay holds the delay in integer milliseconds, and
the body is JSON with the order id as a string.
"""

import argparse
import datetime
import json
import sys
import time
import uuid

import pika

MAX_DELAY_MS = 4_294_967_295  # the plugin's limit, about 49.7 days


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="amqp://guest:guest@127.0.0.1:5672/%2f")
    parser.add_argument("--exchange", default="order.timeouts")
    parser.add_argument("--order-id", required=True, help="the order's id (sent as a string)")
    parser.add_argument("--kind", default="payment", choices=["payment", "fulfillment", "receipt"])
    parser.add_argument("--delay-ms", type=int, required=True, help="milliseconds until the deadline")
    parser.add_argument("--traceparent", help="W3C trace context of the checkout, carried on to the cancel's trace")
    parser.add_argument("--tracestate", help="W3C trace state, with --traceparent")
    args = parser.parse_args()

    if not 0 < args.delay_ms <= MAX_DELAY_MS:
        parser.error(f"--delay-ms must be from 1 to {MAX_DELAY_MS}")

    due = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(milliseconds=args.delay_ms)
    body = json.dumps({
        "order_id": str(args.order_id),  # a string: ids above 2**53 do not survive JSON numbers
        "kind": args.kind,
        "due_at": due.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
    })
    headers = {"x-delay": args.delay_ms}
    if args.traceparent:
        headers["traceparent"] = args.traceparent
        if args.tracestate:
            headers["tracestate"] = args.tracestate
    properties = pika.BasicProperties(
        content_type="application/json",
        delivery_mode=2,  # persistent: the timer must survive a broker restart
        message_id=str(uuid.uuid4()),
        timestamp=int(time.time()),
        headers=headers,
    )

    connection = pika.BlockingConnection(pika.URLParameters(args.url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()  # basic_publish raises if the broker does not take it
        # No mandatory flag needed: the entry exchange is a fanout to the
        # service's ingest queue in both delay modes, so it always has a route.
        channel.basic_publish(exchange=args.exchange, routing_key=args.kind, body=body, properties=properties)
    finally:
        connection.close()
    print(f"scheduled {args.kind} timeout for order {args.order_id} in {args.delay_ms} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
