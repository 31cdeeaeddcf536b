//! The built-in default of every key: the first layer, and the list of keys
//! a file or the environment may set.

/// Every key with its built-in default. The order is the order `doctor` prints.
pub(super) const DEFAULTS: &[(&str, &str)] = &[
    ("database.url", "sqlite://order-timeout.db?mode=rwc"),
    ("database.max_connections", "10"),
    // The consumers, relay and sweeper get their own pool, so a flood of
    // requests cannot starve the timeouts of connections (SQLite: one each).
    ("database.background_connections", "5"),
    ("database.migrate_on_start", "true"),
    ("amqp.url", "amqp://guest:guest@127.0.0.1:5672/%2f"),
    ("amqp.prefix", "order.timeouts"),
    ("amqp.delay_mode", "auto"),
    // Early messages (up to `consumer.hold_max`) are held unacked, so prefetch
    // must exceed rate × hold: 10,000 carries 10,000/s with a 1 s hold.
    ("amqp.prefetch", "10000"),
    // The router needs no hold: its window only has to cover the broker's
    // confirm round trip. Larger windows cost memory, not speed (measured with
    // `bench --million`).
    ("amqp.router_prefetch", "1000"),
    ("amqp.queue_type", "classic"),
    ("amqp.instance", ""),
    ("amqp.tls_ca_file", ""),
    // Empty: the management API on the broker's host (http, port 15672) with
    // the credentials of amqp.url; `off`: not used.
    ("amqp.management_url", ""),
    ("http.bind", "127.0.0.1:8080"),
    // Bearer tokens, comma-separated (old,new while one is rotated). None on a
    // loopback bind leaves the API open, as in development.
    ("http.checkout_tokens", ""),
    ("http.admin_tokens", ""),
    // A non-loopback bind without tokens stops start-up unless this says the
    // API is meant to be open to whoever reaches it.
    ("http.allow_anonymous", "false"),
    // `/readyz` and `/metrics` need a token of either scope (`/healthz` never does).
    ("http.protect_operations", "false"),
    // A client that has not sent its request head in this time (or keeps an
    // idle connection open this long) is disconnected.
    ("http.header_read_timeout", "75s"),
    ("http.request_timeout", "30s"),
    ("http.max_connections", "1024"),
    // Beyond this many requests at once, answer 503 at once rather than queue
    // for the API's database pool.
    ("http.max_in_flight", "100"),
    ("windows.payment", "30m"),
    ("windows.fulfillment", "7d"),
    ("windows.receipt", "14d"),
    // The longest `payment_window` a checkout may ask for: a longer one would
    // hold stock out of sale for that long.
    ("windows.max_payment", "7d"),
    ("consumer.batch_size", "200"),
    ("consumer.batch_wait", "5ms"),
    ("consumer.hold_max", "1s"),
    ("relay.enabled", "true"),
    ("relay.batch_size", "500"),
    ("relay.interval", "200ms"),
    ("relay.max_attempts", "10"),
    ("sweeper.enabled", "true"),
    ("sweeper.interval", "30s"),
    ("sweeper.grace", "60s"),
    ("sweeper.batch_size", "500"),
    ("log.format", "pretty"),
    ("log.level", "info,lapin=off"),
];
