#!/usr/bin/env python3
"""Consume order-timeout's domain events (wire contract v1 for events) and print each as one JSON line.

    pip install pika
    python consume_events.py                         # every event, until Ctrl-C
    python consume_events.py --binding order.cancelled --queue shop.refunds

The service publishes every transition that commits (an order created, paid,
shipped, completed, cancelled, flagged fulfillment_overdue, a late payment)
to the topic exchange "<prefix>.events" (default "order.timeouts.events")
with the routing key "order.<event>", a JSON body and a message_id that is
the same each time the service publishes that event again. It binds no queue
itself: this consumer declares its own and binds it (--binding, default
"order.#": every event). Without --queue the queue is server-named and
exclusive, so it exists only while this process runs and events published
meanwhile are not kept for it; with --queue NAME it is durable, and events
wait in it while the consumer is away.

Delivery is at least once: the same event may come twice (same message_id).
This example de-duplicates in memory, which lasts as long as the process;
a real consumer records the message_id it handled in the same transaction as
what it does with the event. Each message is acked only after it is handled
(here: printed).

--count N exits (status 0) after N distinct events; --timeout S exits after S
seconds, with status 1 if --count was given and not reached. Tests use both.
"""

import argparse
import collections
import json
import sys
import time

import pika

# How many message ids the in-memory de-duplication remembers.
REMEMBERED_IDS = 100_000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="amqp://guest:guest@127.0.0.1:5672/%2f")
    parser.add_argument("--exchange", default="order.timeouts.events")
    parser.add_argument("--binding", default="order.#", help="topic pattern: order.#, order.cancelled, …")
    parser.add_argument("--queue", default="", help="a durable queue of this name (default: a temporary one)")
    parser.add_argument("--count", type=int, help="exit after this many distinct events")
    parser.add_argument("--timeout", type=float, help="exit after this many seconds")
    args = parser.parse_args()

    connection = pika.BlockingConnection(pika.URLParameters(args.url))
    channel = connection.channel()
    if args.queue:
        # Durable: events wait here while this consumer is away.
        queue = channel.queue_declare(queue=args.queue, durable=True).method.queue
    else:
        # Exclusive: gone with this connection.
        queue = channel.queue_declare(queue="", exclusive=True).method.queue
    channel.queue_bind(queue=queue, exchange=args.exchange, routing_key=args.binding)
    channel.basic_qos(prefetch_count=100)
    print(f"consuming {args.binding} from {args.exchange} on queue {queue}", file=sys.stderr, flush=True)

    seen = collections.OrderedDict()
    handled = 0
    deadline = time.monotonic() + args.timeout if args.timeout else None
    try:
        # inactivity_timeout: wake up now and then to check the deadline.
        for method, properties, body in channel.consume(queue, inactivity_timeout=0.2):
            if deadline is not None and time.monotonic() >= deadline:
                break
            if method is None:
                continue
            message_id = properties.message_id or ""
            if message_id and message_id in seen:
                channel.basic_ack(method.delivery_tag)  # a re-publish: handled already
                continue
            event = json.loads(body)
            print(json.dumps(event, separators=(",", ":")), flush=True)
            # Acked after it was handled: a crash before this line redelivers it.
            channel.basic_ack(method.delivery_tag)
            if message_id:
                seen[message_id] = True
                if len(seen) > REMEMBERED_IDS:
                    seen.popitem(last=False)
            handled += 1
            if args.count is not None and handled >= args.count:
                break
    except KeyboardInterrupt:
        pass
    finally:
        channel.cancel()
        connection.close()
    return 1 if args.count is not None and handled < args.count else 0


if __name__ == "__main__":
    sys.exit(main())
