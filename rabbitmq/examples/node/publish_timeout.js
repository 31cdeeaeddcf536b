#!/usr/bin/env node
// Publish one order timeout to order-timeout, per its wire contract (v1).
//
//     npm ci
//     node publish_timeout.js --order-id 42 --delay-ms 1800000
//
// The same message works whether the service runs in plugin or TTL mode: the
// exchange is the configured prefix (default "order.timeouts"), the routing key
// is the kind, the header x-delay holds the delay in integer milliseconds, and
// the body is JSON with the order id as a string.
'use strict';

const crypto = require('node:crypto');
const { parseArgs } = require('node:util');
const amqp = require('amqplib');

const MAX_DELAY_MS = 4294967295; // the plugin's limit, about 49.7 days
const KINDS = ['payment', 'fulfillment', 'receipt'];

function usage(message) {
  console.error(`${message}\nusage: publish_timeout.js [--url URL] [--exchange NAME] --order-id ID [--kind ${KINDS.join('|')}] --delay-ms MS`);
  process.exit(2);
}

function options() {
  let values;
  try {
    ({ values } = parseArgs({
      options: {
        url: { type: 'string', default: 'amqp://guest:guest@127.0.0.1:5672/%2f' },
        exchange: { type: 'string', default: 'order.timeouts' },
        'order-id': { type: 'string' },
        kind: { type: 'string', default: 'payment' },
        'delay-ms': { type: 'string' },
      },
    }));
  } catch (e) {
    usage(e.message);
  }
  if (!values['order-id']) usage('--order-id is required');
  if (!KINDS.includes(values.kind)) usage(`--kind must be one of ${KINDS.join(', ')}`);
  // An integer, not a float: the service parks a non-integer x-delay.
  const delay = /^\d+$/.test(values['delay-ms'] ?? '') ? Number(values['delay-ms']) : NaN;
  if (!(delay > 0 && delay <= MAX_DELAY_MS)) usage(`--delay-ms must be an integer from 1 to ${MAX_DELAY_MS}`);
  return { ...values, delayMs: delay };
}

async function main() {
  const opts = options();
  const body = JSON.stringify({
    order_id: String(opts['order-id']), // a string: ids above 2**53 do not survive JSON numbers
    kind: opts.kind,
    due_at: new Date(Date.now() + opts.delayMs).toISOString(),
  });

  const connection = await amqp.connect(opts.url);
  try {
    // A confirm channel: waitForConfirms rejects unless the broker took the message.
    const channel = await connection.createConfirmChannel();
    // No `mandatory` needed: the entry exchange is a fanout to the service's
    // ingest queue in both delay modes, so it always has a route.
    channel.publish(opts.exchange, opts.kind, Buffer.from(body), {
      contentType: 'application/json',
      deliveryMode: 2, // persistent: the timer must survive a broker restart
      messageId: crypto.randomUUID(),
      timestamp: Math.floor(Date.now() / 1000),
      // amqplib sends a whole JS number as an AMQP integer (32 or 64 bits).
      headers: { 'x-delay': opts.delayMs },
    });
    await channel.waitForConfirms();
    await channel.close();
  } finally {
    await connection.close();
  }
  console.log(`scheduled ${opts.kind} timeout for order ${opts['order-id']} in ${opts.delayMs} ms`);
}

main().catch((e) => {
  console.error(`publish failed: ${e.message}`);
  process.exit(1);
});
