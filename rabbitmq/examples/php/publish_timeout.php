<?php
// Publish one order timeout to order-timeout, per its wire contract (v1).
//
//     sudo apt-get install php-cli php-amqplib
//     php publish_timeout.php --order-id 42 --delay-ms 1800000
//
// (With Composer: `composer require php-amqplib/php-amqplib` and its
// vendor/autoload.php instead of Debian's autoloader below.)
//
// The same message works whether the service runs in plugin or TTL mode: the
// exchange is the configured prefix (default "order.timeouts"), the routing key
// is the kind, the header x-delay holds the delay in integer milliseconds, and
// the body is JSON with the order id as a string.
//
// x-delay goes out as a signed 64-bit integer (AMQP type 'l'), pinned with
// AMQPTable::T_INT_LONGLONG: left to itself, php-amqplib picks the type by the
// value, a 32-bit 'I' up to 2,147,483,647 and 'l' above.

declare(strict_types=1);

require '/usr/share/php/PhpAmqpLib/autoload.php';

use PhpAmqpLib\Connection\AMQPConnectionConfig;
use PhpAmqpLib\Connection\AMQPConnectionFactory;
use PhpAmqpLib\Message\AMQPMessage;
use PhpAmqpLib\Wire\AMQPTable;

const MAX_DELAY_MS = 4294967295; // the plugin's limit, about 49.7 days
const KINDS = ['payment', 'fulfillment', 'receipt'];

function usage(string $message): never
{
    fwrite(STDERR, "$message\nusage: publish_timeout.php [--url URL] [--exchange NAME] --order-id ID"
        . " [--kind payment|fulfillment|receipt] --delay-ms MS\n");
    exit(2);
}

/** A random (version 4) UUID, the message's unique id. */
function uuid4(): string
{
    $bytes = random_bytes(16);
    $bytes[6] = chr(ord($bytes[6]) & 0x0f | 0x40);
    $bytes[8] = chr(ord($bytes[8]) & 0x3f | 0x80);
    return vsprintf('%s%s-%s-%s-%s-%s%s%s', str_split(bin2hex($bytes), 4));
}

/** The connection settings of an amqp:// or amqps:// URL. */
function connection_config(string $url): AMQPConnectionConfig
{
    $parts = parse_url($url);
    $scheme = $parts['scheme'] ?? '';
    if ($parts === false || !in_array($scheme, ['amqp', 'amqps'], true)) {
        usage("--url must be an amqp:// or amqps:// URL");
    }
    $config = new AMQPConnectionConfig();
    $config->setIsSecure($scheme === 'amqps');
    $config->setHost($parts['host'] ?? 'localhost');
    $config->setPort($parts['port'] ?? ($scheme === 'amqps' ? 5671 : 5672));
    $config->setUser(rawurldecode($parts['user'] ?? 'guest'));
    $config->setPassword(rawurldecode($parts['pass'] ?? 'guest'));
    // The path is the vhost, percent-encoded ("/%2f" is "/"); none means "/".
    $path = substr($parts['path'] ?? '', 1);
    $config->setVhost($path === '' ? '/' : rawurldecode($path));
    $config->setConnectionName('publish_timeout');
    return $config;
}

$options = getopt('', ['url:', 'exchange:', 'order-id:', 'kind:', 'delay-ms:'], $rest);
if ($rest < $argc) {
    usage("unknown argument: {$argv[$rest]}");
}
$url = $options['url'] ?? 'amqp://guest:guest@127.0.0.1:5672/%2f';
$exchange = $options['exchange'] ?? 'order.timeouts';
$orderId = $options['order-id'] ?? '';
$kind = $options['kind'] ?? 'payment';
$delay = $options['delay-ms'] ?? '';
foreach ([$url, $exchange, $orderId, $kind, $delay] as $value) {
    if (is_array($value)) {
        usage('each option may be given once');
    }
}
if ($orderId === '') {
    usage('--order-id is required');
}
if (!in_array($kind, KINDS, true)) {
    usage('--kind must be one of ' . implode(', ', KINDS));
}
// An integer, not a float: the service parks a non-integer x-delay.
$delayMs = preg_match('/^\d{1,10}$/', $delay) ? (int) $delay : 0;
if ($delayMs < 1 || $delayMs > MAX_DELAY_MS) {
    usage('--delay-ms must be an integer from 1 to ' . MAX_DELAY_MS);
}

$now = new DateTimeImmutable('now', new DateTimeZone('UTC'));
$due = $now->modify(sprintf('+%d milliseconds', $delayMs));
$body = json_encode([
    'order_id' => $orderId, // a string: ids above 2^53 do not survive JSON numbers
    'kind' => $kind,
    'due_at' => $due->format('Y-m-d\TH:i:s.v\Z'),
], JSON_THROW_ON_ERROR | JSON_UNESCAPED_SLASHES);

$headers = new AMQPTable();
$headers->set('x-delay', $delayMs, AMQPTable::T_INT_LONGLONG);
$message = new AMQPMessage($body, [
    'content_type' => 'application/json',
    'delivery_mode' => AMQPMessage::DELIVERY_MODE_PERSISTENT, // the timer must survive a broker restart
    'message_id' => uuid4(),
    'timestamp' => $now->getTimestamp(),
    'application_headers' => $headers,
]);

try {
    $connection = AMQPConnectionFactory::create(connection_config($url));
    try {
        $channel = $connection->channel();
        $channel->confirm_select(); // publisher confirms
        $nacked = false;
        $channel->set_nack_handler(function () use (&$nacked): void {
            $nacked = true;
        });
        // No mandatory flag needed: the entry exchange is a fanout to the
        // service's ingest queue in both delay modes, so it always has a route.
        $channel->basic_publish($message, $exchange, $kind);
        // Throws when the broker closes the channel (a missing exchange, say)
        // or does not answer within 10 s.
        $channel->wait_for_pending_acks(10);
        if ($nacked) {
            throw new RuntimeException('the broker nacked the message');
        }
        $channel->close();
    } finally {
        $connection->close();
    }
} catch (Throwable $e) {
    fwrite(STDERR, 'publish failed: ' . get_class($e) . ': ' . $e->getMessage() . "\n");
    exit(1);
}
echo "scheduled $kind timeout for order $orderId in $delayMs ms\n";
