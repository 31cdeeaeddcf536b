//! The table of settings: every key once, with its built-in default (and why
//! it is what it is), how its text is read into its field of [`Settings`], and
//! how `doctor` shows it, and its one-line description for an operator. The
//! defaults layer, the known-key check, parsing, [`Settings::describe`] and the
//! settings file (`config/order-timeout.toml`, `order-timeout config`) all
//! come from here, so a new key is one entry here and its field.

use super::*;

/// One key, and all the service knows about it.
pub(super) struct Key {
    /// The dotted name; the environment spells `amqp.url` `ORDER_TIMEOUT__AMQP__URL`.
    pub name: &'static str,
    /// One line for an operator: what it does, its unit or allowed values. It
    /// is the key's comment in `config/order-timeout.toml` and in what
    /// `order-timeout config` prints.
    pub doc: &'static str,
    /// The built-in default, written as a file or the environment would write it.
    pub default: &'static str,
    /// Parses the merged layers' text for `name` (the first argument, for
    /// errors to name) into its field.
    pub read: fn(&str, &str, &mut Settings) -> Result<(), SettingsError>,
    /// The value as `doctor` shows it: a secret only ever redacted, which its
    /// type ([`Secret`]) sees to.
    pub show: fn(&Settings) -> String,
    /// Whether the key's text is a secret, how it is hidden and how two
    /// values of it are compared (`show` cannot tell them apart).
    pub secret: Option<SecretKey>,
}

/// How a secret key is hidden, and compared by its value.
pub(super) struct SecretKey {
    /// How its [`Secret`] hides it when printed as written (`order-timeout
    /// config`): `Secret::new` shows a URL without its password,
    /// `Secret::opaque` nothing at all.
    pub wrap: fn(String) -> Secret,
    /// Whether two settings hold the same value: what a reload compares,
    /// since the shown text of two tokens, or of two URLs that differ only by
    /// their password, is the same. The values never leave it.
    pub same: fn(&Settings, &Settings) -> bool,
}

/// A section's keys, and what must hold across them once all are read.
pub(super) struct Section {
    /// One line saying what the section is about, above it in the file.
    pub doc: &'static str,
    /// In the order they are parsed (so the first wrong one is reported) and
    /// `doctor` prints them.
    pub keys: &'static [Key],
    /// Checks across keys, run right after the section's last key is read.
    pub check: Option<Check>,
    /// Whether giving a key at all is a choice, even with its default value:
    /// the file ships such keys commented out (`mapping.*` is refused unless
    /// `orders.source` is mapped).
    pub opt_in: bool,
}

/// What must hold across keys, given all of them read (see `checks.rs`).
pub(super) type Check = fn(&Settings) -> Result<(), SettingsError>;

/// Every section, in the order they are read and shown.
pub(super) const SECTIONS: &[Section] = &[
    Section {
        doc: "The database: the service's own tables, or a shop's when orders.source is mapped.",
        keys: DATABASE,
        check: None,
        opt_in: false,
    },
    Section {
        doc: "The broker, RabbitMQ: where the timers wait until their deadline.",
        keys: AMQP,
        check: None,
        opt_in: false,
    },
    Section {
        doc: "The HTTP API: checkout, the buyer's and the shop's actions, health and metrics.",
        keys: HTTP,
        check: Some(check_http),
        opt_in: false,
    },
    Section {
        doc: "How long each stage of an order may take: 1ms to 49d, written like 250ms, 30s, 15m, 2h or 7d.",
        keys: WINDOWS,
        check: Some(check_windows),
        opt_in: false,
    },
    Section {
        doc: "The timeout consumers, which apply due timeouts in the database.",
        keys: CONSUMER,
        check: None,
        opt_in: false,
    },
    Section {
        doc: "The outbox relay, which publishes committed timeouts and events to the broker.",
        keys: RELAY,
        check: None,
        opt_in: false,
    },
    Section {
        doc: "The sweeper, the safety net: applies the timeouts of orders overdue by more than a grace period.",
        keys: SWEEPER,
        check: None,
        opt_in: false,
    },
    Section {
        doc: "The order gauges: orders waiting for each timeout, and those overdue (docs/operations.md, Monitoring).",
        keys: METRICS,
        check: None,
        opt_in: false,
    },
    Section {
        doc: "Logging, to standard error.",
        keys: LOG,
        check: None,
        opt_in: false,
    },
    Section {
        doc: "Whose orders the timeouts act on.",
        keys: ORDERS,
        check: None,
        opt_in: false,
    },
    Section {
        doc: "A shop's own orders table, for orders.source = \"mapped\" (see config/mall.toml); refused otherwise.",
        keys: MAPPING,
        check: Some(check_mapping),
        opt_in: true,
    },
];

/// Every key, in table order.
pub(super) fn keys() -> impl Iterator<Item = &'static Key> {
    SECTIONS.iter().flat_map(|section| section.keys)
}

/// Stores a parsed value in its field, or passes the error on.
fn set<T>(field: &mut T, parsed: Result<T, SettingsError>) -> Result<(), SettingsError> {
    *field = parsed?;
    Ok(())
}

/// A duration as `doctor` shows it (`1m 15s`).
fn time(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

/// A token list as `doctor` shows it: how many, never what.
fn describe_tokens(tokens: &[Secret]) -> String {
    match tokens.len() {
        0 => String::new(),
        1 => "1 token (redacted)".to_string(),
        n => format!("{n} tokens (redacted)"),
    }
}

const DAY: Duration = Duration::from_secs(86_400);

const DATABASE: &[Key] = &[
    Key {
        name: "database.url",
        doc: "Where orders live: sqlite://FILE?mode=rwc, postgres://USER:PASS@HOST/DB, mysql:// (MariaDB too).",
        default: "sqlite://order-timeout.db?mode=rwc",
        read: |k, v, s| {
            set(
                &mut s.database.url,
                parse_database_url(k, v).map(Secret::new),
            )
        },
        show: |s| s.database.url.redacted(),
        secret: Some(SecretKey {
            wrap: Secret::new,
            same: |a, b| a.database.url == b.database.url,
        }),
    },
    Key {
        name: "database.max_connections",
        doc: "Connections of the HTTP API's pool, 1 to 1000 (SQLite: always 1).",
        default: "10",
        read: |k, v, s| set(&mut s.database.max_connections, parse_range(k, v, 1, 1000)),
        show: |s| s.database.max_connections.to_string(),
        secret: None,
    },
    Key {
        name: "database.background_connections",
        doc: "Connections of the consumers', relay's and sweeper's own pool, 1 to 1000 (SQLite: always 1).",
        // The consumers, relay and sweeper get their own pool, so a flood of
        // requests cannot starve the timeouts of connections (SQLite: one each).
        default: "5",
        read: |k, v, s| {
            set(
                &mut s.database.background_connections,
                parse_range(k, v, 1, 1000),
            )
        },
        show: |s| s.database.background_connections.to_string(),
        secret: None,
    },
    Key {
        name: "database.migrate_on_start",
        doc: "Whether `serve` applies pending migrations at start (false: run `order-timeout migrate` yourself).",
        default: "true",
        read: |k, v, s| set(&mut s.database.migrate_on_start, parse_bool(k, v)),
        show: |s| s.database.migrate_on_start.to_string(),
        secret: None,
    },
];

const AMQP: &[Key] = &[
    Key {
        name: "amqp.url",
        doc: "Broker URL, amqp://USER:PASSWORD@HOST:PORT/VHOST or amqps://…; a cluster's nodes comma-separated.",
        default: "amqp://guest:guest@127.0.0.1:5672/%2f",
        read: |k, v, s| set(&mut s.amqp.url, parse_amqp_url(k, v).map(Secret::new)),
        show: |s| s.amqp.url.redacted(),
        secret: Some(SecretKey {
            wrap: Secret::new,
            same: |a, b| a.amqp.url == b.amqp.url,
        }),
    },
    Key {
        name: "amqp.connect_timeout",
        doc: "Time to open a connection to one address of amqp.url, TCP and AMQP handshake (100ms to 10m).",
        // A node that drops SYNs costs the OS's ~2 minutes per try, and one that
        // accepts TCP but never speaks AMQP would hang a reconnect for ever (lapin
        // ignores the URL's connection_timeout): past this, the next address is
        // tried. A broker a few milliseconds away answers in well under a second.
        default: "5s",
        read: |k, v, s| {
            set(
                &mut s.amqp.connect_timeout,
                parse_duration(k, v, Duration::from_millis(100), Duration::from_secs(600)),
            )
        },
        show: |s| time(s.amqp.connect_timeout),
        secret: None,
    },
    Key {
        name: "amqp.prefix",
        doc: "Name of the entry exchange; every other exchange and queue is PREFIX.ROLE (A-Z a-z 0-9 . - _ :).",
        default: "order.timeouts",
        read: |k, v, s| set(&mut s.amqp.prefix, parse_prefix(k, v)),
        show: |s| s.amqp.prefix.clone(),
        secret: None,
    },
    Key {
        name: "amqp.delay_mode",
        doc: "Where timers wait: plugin (x-delayed-message exchange), ttl (TTL queues), or auto (plugin if on).",
        default: "auto",
        read: |k, v, s| {
            set(
                &mut s.amqp.delay_mode,
                parse_choice(k, v, &DelayMode::ALL, DelayMode::as_str),
            )
        },
        show: |s| s.amqp.delay_mode.as_str().to_string(),
        secret: None,
    },
    Key {
        name: "amqp.prefetch",
        doc: "Unacked deliveries per timeout consumer, 1 to 65535; keep it above rate × consumer.hold_max.",
        // Early messages (up to `consumer.hold_max`) are held unacked, so prefetch
        // must exceed rate × hold: 10,000 carries 10,000/s with a 1 s hold.
        // Memory: the router and the relay put canonical bodies (under 1 KiB)
        // into the delay stage, so 10,000 held cost about 10 MiB.
        default: "10000",
        read: |k, v, s| set(&mut s.amqp.prefetch, parse_range(k, v, 1, 65535)),
        show: |s| s.amqp.prefetch.to_string(),
        secret: None,
    },
    Key {
        name: "amqp.router_prefetch",
        doc: "Deliveries the router may have in flight awaiting the broker's confirm, 1 to 65535.",
        // The router needs no hold: its window only has to cover the broker's
        // confirm round trip. Larger windows cost memory, not speed (measured with
        // `bench --million`). Memory: lapin holds each delivery whole before the
        // size check, so the window costs up to router_prefetch × the broker's
        // max_message_size: 256 × 128 KiB (rabbitmq/rabbitmq.conf) = 32 MiB, and
        // 256 × 16 MiB (RabbitMQ 4's default) = 4 GiB on a broker left unbounded.
        default: "256",
        read: |k, v, s| set(&mut s.amqp.router_prefetch, parse_range(k, v, 1, 65535)),
        show: |s| s.amqp.router_prefetch.to_string(),
        secret: None,
    },
    Key {
        name: "amqp.queue_type",
        doc: "classic (one node, fastest) or quorum (replicated: timers survive losing a node).",
        default: "classic",
        read: |k, v, s| {
            set(
                &mut s.amqp.queue_type,
                parse_choice(k, v, &QueueType::ALL, QueueType::as_str),
            )
        },
        show: |s| s.amqp.queue_type.as_str().to_string(),
        secret: None,
    },
    Key {
        name: "amqp.instance",
        doc: "This instance's name in its broker connection names; empty: HOST:PID.",
        // Empty: this host's name and the process id.
        default: "",
        read: |_, v, s| set(&mut s.amqp.instance, Ok(instance_name(v))),
        show: |s| s.amqp.instance.clone(),
        secret: None,
    },
    Key {
        name: "amqp.tls_ca_file",
        doc: "PEM file of CA certificates to trust for amqps:// besides the system's; empty: none.",
        default: "",
        read: |k, v, s| {
            s.amqp.tls_ca_pem = read_pem(k, v)?;
            s.amqp.tls_ca_file = Some(v).filter(|p| !p.is_empty()).map(PathBuf::from);
            Ok(())
        },
        show: |s| {
            let file = s.amqp.tls_ca_file.as_ref();
            file.map(|p| p.display().to_string()).unwrap_or_default()
        },
        secret: None,
    },
    Key {
        name: "amqp.management_url",
        doc: "Management API, http:// only; empty: http://HOST:15672 as amqp.url's user; off: not used.",
        // Empty: the management API on the broker's host (http, port 15672) with
        // the credentials of amqp.url; `off`: not used. Read after `amqp.url`,
        // whose parts fill what this URL leaves out.
        default: "",
        read: |k, v, s| {
            set(
                &mut s.amqp.management,
                parse_management(k, v, s.amqp.url.expose()),
            )
        },
        show: |s| match &s.amqp.management {
            Some(m) => format!("{} (as {}, vhost {})", m.base, m.username, m.vhost),
            None => "off".to_string(),
        },
        secret: Some(SecretKey {
            wrap: Secret::new,
            same: |a, b| a.amqp.management == b.amqp.management,
        }),
    },
];

const HTTP: &[Key] = &[
    Key {
        name: "http.bind",
        doc: "HTTP API address, HOST:PORT (port 0: any free one); beyond loopback: tokens or allow_anonymous.",
        default: "127.0.0.1:8080",
        read: |k, v, s| set(&mut s.http.bind, parse_bind(k, v)),
        show: |s| s.http.bind.to_string(),
        secret: None,
    },
    Key {
        name: "http.checkout_tokens",
        doc: "Bearer tokens of the checkout scope (checkout, buyer's actions), comma-separated, 16+ chars.",
        // Bearer tokens, comma-separated (old,new while one is rotated). None on a
        // loopback bind leaves the API open, as in development.
        default: "",
        read: |k, v, s| set(&mut s.http.checkout_tokens, parse_tokens(k, v)),
        show: |s| describe_tokens(&s.http.checkout_tokens),
        secret: Some(SecretKey {
            wrap: Secret::opaque,
            same: |a, b| a.http.checkout_tokens == b.http.checkout_tokens,
        }),
    },
    Key {
        name: "http.admin_tokens",
        doc: "Bearer tokens of the admin scope (stock, shipping, all of checkout), comma-separated, 16+ chars.",
        default: "",
        read: |k, v, s| set(&mut s.http.admin_tokens, parse_tokens(k, v)),
        show: |s| describe_tokens(&s.http.admin_tokens),
        secret: Some(SecretKey {
            wrap: Secret::opaque,
            same: |a, b| a.http.admin_tokens == b.http.admin_tokens,
        }),
    },
    Key {
        name: "http.allow_anonymous",
        doc: "true: an API reachable from other machines runs without tokens (anyone may call everything).",
        // A non-loopback bind without tokens stops start-up unless this says the
        // API is meant to be open to whoever reaches it.
        default: "false",
        read: |k, v, s| set(&mut s.http.allow_anonymous, parse_bool(k, v)),
        show: |s| s.http.allow_anonymous.to_string(),
        secret: None,
    },
    Key {
        name: "http.protect_operations",
        doc: "Whether /readyz and /metrics need a token of either scope (/healthz never does).",
        // `/readyz` and `/metrics` need a token of either scope (`/healthz` never does).
        default: "false",
        read: |k, v, s| set(&mut s.http.protect_operations, parse_bool(k, v)),
        show: |s| s.http.protect_operations.to_string(),
        secret: None,
    },
    Key {
        name: "http.header_read_timeout",
        doc: "Time to send a request head, and the most an idle keep-alive connection lives (100ms to 1h).",
        // A client that has not sent its request head in this time (or keeps an
        // idle connection open this long) is disconnected.
        default: "75s",
        read: |k, v, s| {
            set(
                &mut s.http.header_read_timeout,
                parse_duration(k, v, Duration::from_millis(100), Duration::from_secs(3600)),
            )
        },
        show: |s| time(s.http.header_read_timeout),
        secret: None,
    },
    Key {
        name: "http.request_timeout",
        doc: "Time a request may take before it is answered 503 and dropped (100ms to 1h).",
        default: "30s",
        read: |k, v, s| {
            set(
                &mut s.http.request_timeout,
                parse_duration(k, v, Duration::from_millis(100), Duration::from_secs(3600)),
            )
        },
        show: |s| time(s.http.request_timeout),
        secret: None,
    },
    Key {
        name: "http.idempotency_retention",
        doc: "How long an Idempotency-Key is kept; an older key is used anew (1s to 365d).",
        // A retry comes within minutes; kept forever, keys only grow the table.
        default: "24h",
        read: |k, v, s| {
            set(
                &mut s.http.idempotency_retention,
                parse_duration(
                    k,
                    v,
                    Duration::from_secs(1),
                    Duration::from_secs(365 * 86_400),
                ),
            )
        },
        show: |s| time(s.http.idempotency_retention),
        secret: None,
    },
    Key {
        name: "http.max_connections",
        doc: "Most open connections; at the cap the server stops accepting (1 to 1000000).",
        default: "1024",
        read: |k, v, s| set(&mut s.http.max_connections, parse_range(k, v, 1, 1_000_000)),
        show: |s| s.http.max_connections.to_string(),
        secret: None,
    },
    Key {
        name: "http.max_in_flight",
        doc: "Most requests handled at once; beyond it, 503 with Retry-After (1 to 1000000).",
        // Beyond this many requests at once, answer 503 at once rather than queue
        // for the API's database pool.
        default: "100",
        read: |k, v, s| set(&mut s.http.max_in_flight, parse_range(k, v, 1, 1_000_000)),
        show: |s| s.http.max_in_flight.to_string(),
        secret: None,
    },
];

const WINDOWS: &[Key] = &[
    Key {
        name: "windows.payment",
        doc: "Default time from checkout to payment; then the order is cancelled and its stock released.",
        default: "30m",
        read: |k, v, s| set(&mut s.windows.payment, parse_window(k, v)),
        show: |s| time(s.windows.payment),
        secret: None,
    },
    Key {
        name: "windows.fulfillment",
        doc: "Time from payment to shipping; then the order is flagged fulfillment_overdue (it stays paid).",
        default: "7d",
        read: |k, v, s| set(&mut s.windows.fulfillment, parse_window(k, v)),
        show: |s| time(s.windows.fulfillment),
        secret: None,
    },
    Key {
        name: "windows.receipt",
        doc: "Time from shipping to the buyer's confirmation; then the order is completed.",
        default: "14d",
        read: |k, v, s| set(&mut s.windows.receipt, parse_window(k, v)),
        show: |s| time(s.windows.receipt),
        secret: None,
    },
    Key {
        name: "windows.max_payment",
        doc: "Longest payment_window a checkout may ask for; windows.payment must not exceed it.",
        // The longest `payment_window` a checkout may ask for: a longer one would
        // hold stock out of sale for that long.
        default: "7d",
        read: |k, v, s| set(&mut s.windows.max_payment, parse_window(k, v)),
        show: |s| time(s.windows.max_payment),
        secret: None,
    },
];

const CONSUMER: &[Key] = &[
    Key {
        name: "consumer.batch_size",
        doc: "Most deliveries decided in one database transaction (1 to 10000).",
        default: "200",
        read: |k, v, s| {
            set(
                &mut s.consumer.batch_size,
                parse_range(k, v, 1, MAX_BATCH as usize),
            )
        },
        show: |s| s.consumer.batch_size.to_string(),
        secret: None,
    },
    Key {
        name: "consumer.batch_wait",
        doc: "How long a batch may wait to fill while messages flow; an idle queue never waits (0 to 1s).",
        default: "5ms",
        read: |k, v, s| {
            set(
                &mut s.consumer.batch_wait,
                parse_duration(k, v, Duration::ZERO, Duration::from_secs(1)),
            )
        },
        show: |s| time(s.consumer.batch_wait),
        secret: None,
    },
    Key {
        name: "consumer.hold_max",
        doc: "A delivery due within this is held in memory; one due later waits in the broker again (0 to 60s).",
        default: "1s",
        read: |k, v, s| {
            set(
                &mut s.consumer.hold_max,
                parse_duration(k, v, Duration::ZERO, Duration::from_secs(60)),
            )
        },
        show: |s| time(s.consumer.hold_max),
        secret: None,
    },
    // On: a due burst is applied at the database's pace, not the broker's
    // (see `amqp::catch_up`); off only to measure without it.
    Key {
        name: "consumer.catch_up",
        doc: "Whether a due delivery also applies every order of its kind already due (false: to measure).",
        default: "true",
        read: |k, v, s| set(&mut s.consumer.catch_up, parse_bool(k, v)),
        show: |s| s.consumer.catch_up.to_string(),
        secret: None,
    },
];

const RELAY: &[Key] = &[
    Key {
        name: "relay.enabled",
        doc: "Whether this instance publishes the outbox (timeouts, domain events); false: something else does.",
        default: "true",
        read: |k, v, s| set(&mut s.relay.enabled, parse_bool(k, v)),
        show: |s| s.relay.enabled.to_string(),
        secret: None,
    },
    Key {
        name: "relay.batch_size",
        doc: "Most outbox rows published per round (1 to 10000).",
        default: "500",
        read: |k, v, s| set(&mut s.relay.batch_size, parse_range(k, v, 1, MAX_BATCH)),
        show: |s| s.relay.batch_size.to_string(),
        secret: None,
    },
    Key {
        name: "relay.interval",
        doc: "How often the relay looks at the outbox when no commit woke it (1ms to 60s).",
        default: "200ms",
        read: |k, v, s| {
            set(
                &mut s.relay.interval,
                parse_duration(k, v, Duration::from_millis(1), Duration::from_secs(60)),
            )
        },
        show: |s| time(s.relay.interval),
        secret: None,
    },
    Key {
        name: "relay.max_attempts",
        doc: "Refusals by the broker after which an outbox row is set aside with its reason (1 to 1000).",
        default: "10",
        read: |k, v, s| set(&mut s.relay.max_attempts, parse_range(k, v, 1, 1000)),
        show: |s| s.relay.max_attempts.to_string(),
        secret: None,
    },
];

const SWEEPER: &[Key] = &[
    Key {
        name: "sweeper.enabled",
        doc: "Whether this instance sweeps (any number may: each order changes once).",
        default: "true",
        read: |k, v, s| set(&mut s.sweeper.enabled, parse_bool(k, v)),
        show: |s| s.sweeper.enabled.to_string(),
        secret: None,
    },
    Key {
        name: "sweeper.interval",
        doc: "Time between sweeps (100ms to 1d).",
        default: "30s",
        read: |k, v, s| {
            set(
                &mut s.sweeper.interval,
                parse_duration(k, v, Duration::from_millis(100), DAY),
            )
        },
        show: |s| time(s.sweeper.interval),
        secret: None,
    },
    Key {
        name: "sweeper.grace",
        doc: "How long past its deadline an order must be before the sweeper acts on it (0 to 30d).",
        default: "60s",
        read: |k, v, s| {
            set(
                &mut s.sweeper.grace,
                parse_duration(k, v, Duration::ZERO, DAY * 30),
            )
        },
        show: |s| time(s.sweeper.grace),
        secret: None,
    },
    Key {
        name: "sweeper.batch_size",
        doc: "Most orders handled per kind per sweep (1 to 10000).",
        default: "500",
        read: |k, v, s| set(&mut s.sweeper.batch_size, parse_range(k, v, 1, MAX_BATCH)),
        show: |s| s.sweeper.batch_size.to_string(),
        secret: None,
    },
];

const METRICS: &[Key] = &[
    Key {
        name: "metrics.gauge_interval",
        doc: "How often the order gauges are read from the database, one query per kind (100ms to 1h).",
        // Prometheus scrapes every 15 s to 1 min: a reading per scrape at most.
        default: "15s",
        read: |k, v, s| {
            set(
                &mut s.metrics.gauge_interval,
                parse_duration(k, v, Duration::from_millis(100), Duration::from_secs(3600)),
            )
        },
        show: |s| time(s.metrics.gauge_interval),
        secret: None,
    },
    Key {
        name: "metrics.overdue_after",
        doc: "How long past its deadline a waiting order must be to count in overdue_orders (0 to 30d).",
        // As sweeper.grace: an order this late is one the sweeper takes in
        // its next pass, so a lost timer shows for at most sweeper.interval.
        default: "60s",
        read: |k, v, s| {
            set(
                &mut s.metrics.overdue_after,
                parse_duration(k, v, Duration::ZERO, DAY * 30),
            )
        },
        show: |s| time(s.metrics.overdue_after),
        secret: None,
    },
];

const LOG: &[Key] = &[
    Key {
        name: "log.format",
        doc: "pretty (lines for a terminal) or json (one object per line, for log shippers).",
        default: "pretty",
        read: |k, v, s| {
            set(
                &mut s.log.format,
                parse_choice(k, v, &LogFormat::ALL, LogFormat::as_str),
            )
        },
        show: |s| s.log.format.as_str().to_string(),
        secret: None,
    },
    Key {
        name: "log.level",
        doc: "Log filter in RUST_LOG syntax, used when RUST_LOG is not set.",
        default: "info,lapin=off",
        read: |k, v, s| set(&mut s.log.level, parse_log_level(k, v)),
        show: |s| s.log.level.clone(),
        secret: None,
    },
];

/// Whose orders (see `mapping.rs`).
const ORDERS: &[Key] = &[Key {
    name: "orders.source",
    doc: "owned (its own tables, filled by its API) or mapped (a shop's table, described by mapping.*).",
    default: "owned",
    read: |k, v, s| {
        set(
            &mut s.mapping.source,
            parse_choice(k, v, &OrdersSource::ALL, OrdersSource::as_str),
        )
    },
    show: |s| s.mapping.source.as_str().to_string(),
    secret: None,
}];

/// A `mapping.*` key naming a table (`qualified`: `schema.name` allowed) or
/// a column of the shop's.
macro_rules! ident_key {
    ($name:literal, $doc:literal, $default:literal, $($field:ident).+, $qualified:literal) => {
        Key {
            name: $name,
            doc: $doc,
            default: $default,
            read: |k, v, s| set(&mut s.mapping.$($field).+, parse_ident(k, v, $qualified)),
            show: |s| s.mapping.$($field).+.clone(),
            secret: None,
        }
    };
}

/// A `mapping.<kind>.*` key holding one of the shop's status values.
macro_rules! status_key {
    ($name:literal, $doc:literal, $($field:ident).+) => {
        Key {
            name: $name,
            doc: $doc,
            default: "",
            read: |k, v, s| set(&mut s.mapping.$($field).+, parse_status(k, v)),
            show: |s| s.mapping.$($field).+.clone(),
            secret: None,
        }
    };
}

/// A shop's own table (see `mapping.rs`): empty means unset; checked across
/// keys, and with `orders.source`, once all are read.
const MAPPING: &[Key] = &[
    ident_key!(
        "mapping.table",
        "The shop's orders table, NAME or SCHEMA.NAME (required when mapped).",
        "",
        table,
        true
    ),
    ident_key!(
        "mapping.id_column",
        "Its primary key column: integer, text or UUID.",
        "id",
        id_column,
        false
    ),
    ident_key!(
        "mapping.status_column",
        "Its status column: integer or text.",
        "status",
        status_column,
        false
    ),
    ident_key!(
        "mapping.stamp_column",
        "Optional time column set to the database's clock by every transition (e.g. updated_at).",
        "",
        stamp_column,
        false
    ),
    Key {
        name: "mapping.time_zone",
        doc: "Zone the shop writes zone-less times in: IANA name or +HH:MM; empty: the server's default.",
        default: "",
        read: |k, v, s| set(&mut s.mapping.time_zone, parse_time_zone(k, v)),
        show: |s| {
            s.mapping
                .time_zone
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default()
        },
        secret: None,
    },
    status_key!(
        "mapping.payment.from",
        "Status of an unpaid order, which the payment timeout acts on (required when mapped).",
        payment.from
    ),
    status_key!(
        "mapping.payment.to",
        "Status the payment timeout sets: the shop's cancelled or closed (required when mapped).",
        payment.to
    ),
    ident_key!(
        "mapping.payment.deadline_column",
        "Column holding the payment deadline; set this or since_column.",
        "",
        payment.deadline_column,
        false
    ),
    ident_key!(
        "mapping.payment.since_column",
        "Column holding the window's start (creation); deadline = it + windows.payment.",
        "",
        payment.since_column,
        false
    ),
    status_key!(
        "mapping.fulfillment.from",
        "Status of a paid order waiting to be shipped; empty: fulfillment timeouts are not mapped.",
        fulfillment.from
    ),
    status_key!(
        "mapping.fulfillment.to",
        "Status meaning overdue, if the shop has one; set this or flag_column.",
        fulfillment.to
    ),
    ident_key!(
        "mapping.fulfillment.flag_column",
        "Nullable time column stamped once when the order is found overdue (its status stays).",
        "",
        fulfillment.flag_column,
        false
    ),
    ident_key!(
        "mapping.fulfillment.deadline_column",
        "Column holding the shipping deadline; set this or since_column.",
        "",
        fulfillment.deadline_column,
        false
    ),
    ident_key!(
        "mapping.fulfillment.since_column",
        "Column holding the window's start (payment); deadline = it + windows.fulfillment.",
        "",
        fulfillment.since_column,
        false
    ),
    status_key!(
        "mapping.receipt.from",
        "Status of a shipped order; empty: receipt timeouts are not mapped.",
        receipt.from
    ),
    status_key!(
        "mapping.receipt.to",
        "Status the receipt timeout sets: the shop's completed.",
        receipt.to
    ),
    ident_key!(
        "mapping.receipt.deadline_column",
        "Column holding the receipt deadline; set this or since_column.",
        "",
        receipt.deadline_column,
        false
    ),
    ident_key!(
        "mapping.receipt.since_column",
        "Column holding the window's start (shipping); deadline = it + windows.receipt.",
        "",
        receipt.since_column,
        false
    ),
    ident_key!(
        "mapping.stock.items_table",
        "Order items table, NAME or SCHEMA.NAME; give every stock key (available_column optional) or none.",
        "",
        stock.items_table,
        true
    ),
    ident_key!(
        "mapping.stock.items_order_column",
        "Its column holding the order id.",
        "",
        stock.items_order_column,
        false
    ),
    ident_key!(
        "mapping.stock.items_sku_column",
        "Its column naming the stock row.",
        "",
        stock.items_sku_column,
        false
    ),
    ident_key!(
        "mapping.stock.items_quantity_column",
        "Its quantity column.",
        "",
        stock.items_quantity_column,
        false
    ),
    ident_key!(
        "mapping.stock.table",
        "Stock table, NAME or SCHEMA.NAME.",
        "",
        stock.table,
        true
    ),
    ident_key!(
        "mapping.stock.id_column",
        "Its key, matched against the items' SKU column.",
        "",
        stock.id_column,
        false
    ),
    ident_key!(
        "mapping.stock.reserved_column",
        "Column a cancelled order's quantities are taken back from (reserved stock).",
        "",
        stock.reserved_column,
        false
    ),
    ident_key!(
        "mapping.stock.available_column",
        "Optional column the quantities are added back to (stock taken off sale at checkout).",
        "",
        stock.available_column,
        false
    ),
    Key {
        name: "mapping.release_sql",
        doc: "Own statements per order a payment timeout cancels, ;-separated, id bound as $1 (PostgreSQL) or ?.",
        default: "",
        read: |k, v, s| set(&mut s.mapping.release_sql, parse_release_sql(k, v)),
        show: |s| s.mapping.release_sql.join("; "),
        secret: None,
    },
];

impl Settings {
    /// The shape [`Settings::load`] fills: every field a placeholder that its
    /// key's `read` overwrites (the unit test `every_key_reaches_its_own_field`
    /// holds each entry to that).
    pub(super) fn unread(sources: BTreeMap<String, Source>) -> Self {
        let unset = || Secret::opaque("");
        Settings {
            database: DatabaseSettings {
                url: unset(),
                max_connections: 0,
                background_connections: 0,
                migrate_on_start: false,
            },
            amqp: AmqpSettings {
                url: unset(),
                connect_timeout: Duration::ZERO,
                prefix: String::new(),
                delay_mode: DelayMode::Auto,
                prefetch: 0,
                router_prefetch: 0,
                queue_type: QueueType::Classic,
                instance: String::new(),
                tls_ca_pem: None,
                tls_ca_file: None,
                management: None,
            },
            http: HttpSettings {
                bind: SocketAddr::from(([127, 0, 0, 1], 0)),
                checkout_tokens: Vec::new(),
                admin_tokens: Vec::new(),
                allow_anonymous: false,
                protect_operations: false,
                header_read_timeout: Duration::ZERO,
                request_timeout: Duration::ZERO,
                idempotency_retention: Duration::ZERO,
                max_connections: 0,
                max_in_flight: 0,
            },
            windows: Windows {
                payment: Duration::ZERO,
                fulfillment: Duration::ZERO,
                receipt: Duration::ZERO,
                max_payment: Duration::ZERO,
            },
            consumer: ConsumerSettings {
                batch_size: 0,
                batch_wait: Duration::ZERO,
                hold_max: Duration::ZERO,
                catch_up: false,
            },
            relay: RelaySettings {
                enabled: false,
                batch_size: 0,
                interval: Duration::ZERO,
                max_attempts: 0,
            },
            sweeper: SweeperSettings {
                enabled: false,
                interval: Duration::ZERO,
                grace: Duration::ZERO,
                batch_size: 0,
            },
            metrics: MetricsSettings {
                gauge_interval: Duration::ZERO,
                overdue_after: Duration::ZERO,
            },
            log: LogSettings {
                format: LogFormat::Pretty,
                level: String::new(),
            },
            mapping: MappingSettings {
                source: OrdersSource::Owned,
                table: String::new(),
                id_column: String::new(),
                status_column: String::new(),
                stamp_column: String::new(),
                time_zone: Some(Zone::Named(String::new())),
                payment: KindMapping::default(),
                fulfillment: KindMapping::default(),
                receipt: KindMapping::default(),
                stock: StockMapping::default(),
                release_sql: Vec::new(),
            },
            sources,
            given: BTreeMap::new(),
        }
    }
}
