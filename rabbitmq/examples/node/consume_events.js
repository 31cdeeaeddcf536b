#!/usr/bin/env node
// Consume order-timeout's domain events (wire contract v1 for events) and
// print each as one JSON line.
//
//     npm ci
//     node consume_events.js                         # every event, until Ctrl-C
//     node consume_events.js --binding order.cancelled --queue shop.refunds
//
// The service publishes every transition that commits (an order created,
// paid, shipped, completed, cancelled, flagged fulfillment_overdue, a late
// payment) to the topic exchange "<prefix>.events" (default
// "order.timeouts.events") with the routing key "order.<event>", a JSON body
// and a message_id that is the same each time the service publishes that
// event again. It binds no queue itself: this consumer declares its own and
// binds it (--binding, default "order.#": every event). Without --queue the
// queue is server-named and exclusive, so it exists only while this process
// runs and events published meanwhile are not kept for it; with --queue NAME
// it is durable, and events wait in it while the consumer is away.
//
// Delivery is at least once: the same event may come twice (same
// message_id). This example de-duplicates in memory, which lasts as long as
// the process; a real consumer records the message_id it handled in the same
// transaction as what it does with the event. Each message is acked only
// after it is handled (here: printed).
//
// --count N exits (status 0) after N distinct events; --timeout S exits after
// S seconds, with status 1 if --count was given and not reached. Tests use both.
'use strict';

const { parseArgs } = require('node:util');
const amqp = require('amqplib');

// How many message ids the in-memory de-duplication remembers.
const REMEMBERED_IDS = 100000;

function usage(message) {
  console.error(`${message}\nusage: consume_events.js [--url URL] [--exchange NAME] [--binding PATTERN] [--queue NAME] [--count N] [--timeout S]`);
  process.exit(2);
}

function number(text, name) {
  if (text === undefined) return undefined;
  const n = Number(text);
  if (!(n > 0)) usage(`${name} must be a positive number`);
  return n;
}

function options() {
  let values;
  try {
    ({ values } = parseArgs({
      options: {
        url: { type: 'string', default: 'amqp://guest:guest@127.0.0.1:5672/%2f' },
        exchange: { type: 'string', default: 'order.timeouts.events' },
        binding: { type: 'string', default: 'order.#' },
        queue: { type: 'string', default: '' },
        count: { type: 'string' },
        timeout: { type: 'string' },
      },
    }));
  } catch (e) {
    usage(e.message);
  }
  return { ...values, count: number(values.count, '--count'), timeout: number(values.timeout, '--timeout') };
}

async function main() {
  const opts = options();
  const connection = await amqp.connect(opts.url);
  const channel = await connection.createChannel();
  // Durable when named: events wait there while this consumer is away;
  // otherwise exclusive, gone with this connection.
  const declared = opts.queue
    ? await channel.assertQueue(opts.queue, { durable: true })
    : await channel.assertQueue('', { exclusive: true });
  await channel.bindQueue(declared.queue, opts.exchange, opts.binding);
  await channel.prefetch(100);
  console.error(`consuming ${opts.binding} from ${opts.exchange} on queue ${declared.queue}`);

  const seen = new Set(); // insertion-ordered: the oldest id is forgotten first
  let handled = 0;
  let finish;
  const finished = new Promise((resolve) => { finish = resolve; });

  await channel.consume(declared.queue, (msg) => {
    if (msg === null) return finish(); // the broker cancelled the consumer
    const messageId = msg.properties.messageId || '';
    if (messageId && seen.has(messageId)) {
      channel.ack(msg); // a re-publish: handled already
      return;
    }
    if (opts.count !== undefined && handled >= opts.count) return; // leaving: stays unacked, redelivered
    const event = JSON.parse(msg.content.toString('utf8'));
    process.stdout.write(`${JSON.stringify(event)}\n`);
    // Acked after it was handled: a crash before this line redelivers it.
    channel.ack(msg);
    if (messageId) {
      seen.add(messageId);
      if (seen.size > REMEMBERED_IDS) seen.delete(seen.values().next().value);
    }
    handled += 1;
    if (opts.count !== undefined && handled >= opts.count) finish();
  }, { noAck: false });

  const timer = opts.timeout !== undefined ? setTimeout(finish, opts.timeout * 1000) : null;
  process.once('SIGINT', finish);
  await finished;
  if (timer) clearTimeout(timer);
  await channel.close();
  await connection.close();
  return opts.count !== undefined && handled < opts.count ? 1 : 0;
}

main().then((code) => {
  process.exitCode = code;
}).catch((e) => {
  console.error(`consume failed: ${e.message}`);
  process.exit(1);
});
