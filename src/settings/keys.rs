//! The table of settings: every key once, with its built-in default (and why
//! it is what it is), how its text is read into its field of [`Settings`], and
//! how `doctor` shows it. The defaults layer, the known-key check, parsing and
//! [`Settings::describe`] all come from here, so a new key is one entry here
//! and its field.

use super::*;

/// One key, and all the service knows about it.
pub(super) struct Key {
    /// The dotted name; the environment spells `amqp.url` `ORDER_TIMEOUT__AMQP__URL`.
    pub name: &'static str,
    /// The built-in default, written as a file or the environment would write it.
    pub default: &'static str,
    /// Parses the merged layers' text for `name` (the first argument, for
    /// errors to name) into its field.
    pub read: fn(&str, &str, &mut Settings) -> Result<(), SettingsError>,
    /// The value as `doctor` shows it: a secret only ever redacted, which its
    /// type ([`Secret`]) sees to.
    pub show: fn(&Settings) -> String,
}

/// A section's keys, and what must hold across them once all are read.
pub(super) struct Section {
    /// In the order they are parsed (so the first wrong one is reported) and
    /// `doctor` prints them.
    pub keys: &'static [Key],
    /// Checks across keys, run right after the section's last key is read.
    pub check: Option<Check>,
}

/// What must hold across keys, given all of them read (see `checks.rs`).
pub(super) type Check = fn(&Settings) -> Result<(), SettingsError>;

/// Every section, in the order they are read and shown.
pub(super) const SECTIONS: &[Section] = &[
    Section {
        keys: DATABASE,
        check: None,
    },
    Section {
        keys: AMQP,
        check: None,
    },
    Section {
        keys: HTTP,
        check: Some(check_http),
    },
    Section {
        keys: WINDOWS,
        check: Some(check_windows),
    },
    Section {
        keys: CONSUMER,
        check: None,
    },
    Section {
        keys: RELAY,
        check: None,
    },
    Section {
        keys: SWEEPER,
        check: None,
    },
    Section {
        keys: LOG,
        check: None,
    },
    Section {
        keys: ORDERS,
        check: None,
    },
    Section {
        keys: MAPPING,
        check: Some(check_mapping),
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
        default: "sqlite://order-timeout.db?mode=rwc",
        read: |k, v, s| {
            set(
                &mut s.database.url,
                parse_database_url(k, v).map(Secret::new),
            )
        },
        show: |s| s.database.url.redacted(),
    },
    Key {
        name: "database.max_connections",
        default: "10",
        read: |k, v, s| set(&mut s.database.max_connections, parse_range(k, v, 1, 1000)),
        show: |s| s.database.max_connections.to_string(),
    },
    Key {
        name: "database.background_connections",
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
    },
    Key {
        name: "database.migrate_on_start",
        default: "true",
        read: |k, v, s| set(&mut s.database.migrate_on_start, parse_bool(k, v)),
        show: |s| s.database.migrate_on_start.to_string(),
    },
];

const AMQP: &[Key] = &[
    Key {
        name: "amqp.url",
        default: "amqp://guest:guest@127.0.0.1:5672/%2f",
        read: |k, v, s| set(&mut s.amqp.url, parse_amqp_url(k, v).map(Secret::new)),
        show: |s| s.amqp.url.redacted(),
    },
    Key {
        name: "amqp.prefix",
        default: "order.timeouts",
        read: |k, v, s| set(&mut s.amqp.prefix, parse_prefix(k, v)),
        show: |s| s.amqp.prefix.clone(),
    },
    Key {
        name: "amqp.delay_mode",
        default: "auto",
        read: |k, v, s| {
            set(
                &mut s.amqp.delay_mode,
                parse_choice(k, v, &DelayMode::ALL, DelayMode::as_str),
            )
        },
        show: |s| s.amqp.delay_mode.as_str().to_string(),
    },
    Key {
        name: "amqp.prefetch",
        // Early messages (up to `consumer.hold_max`) are held unacked, so prefetch
        // must exceed rate × hold: 10,000 carries 10,000/s with a 1 s hold.
        default: "10000",
        read: |k, v, s| set(&mut s.amqp.prefetch, parse_range(k, v, 1, 65535)),
        show: |s| s.amqp.prefetch.to_string(),
    },
    Key {
        name: "amqp.router_prefetch",
        // The router needs no hold: its window only has to cover the broker's
        // confirm round trip. Larger windows cost memory, not speed (measured with
        // `bench --million`).
        default: "1000",
        read: |k, v, s| set(&mut s.amqp.router_prefetch, parse_range(k, v, 1, 65535)),
        show: |s| s.amqp.router_prefetch.to_string(),
    },
    Key {
        name: "amqp.queue_type",
        default: "classic",
        read: |k, v, s| {
            set(
                &mut s.amqp.queue_type,
                parse_choice(k, v, &QueueType::ALL, QueueType::as_str),
            )
        },
        show: |s| s.amqp.queue_type.as_str().to_string(),
    },
    Key {
        name: "amqp.instance",
        // Empty: this host's name and the process id.
        default: "",
        read: |_, v, s| set(&mut s.amqp.instance, Ok(instance_name(v))),
        show: |s| s.amqp.instance.clone(),
    },
    Key {
        name: "amqp.tls_ca_file",
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
    },
    Key {
        name: "amqp.management_url",
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
    },
];

const HTTP: &[Key] = &[
    Key {
        name: "http.bind",
        default: "127.0.0.1:8080",
        read: |k, v, s| set(&mut s.http.bind, parse_bind(k, v)),
        show: |s| s.http.bind.to_string(),
    },
    Key {
        name: "http.checkout_tokens",
        // Bearer tokens, comma-separated (old,new while one is rotated). None on a
        // loopback bind leaves the API open, as in development.
        default: "",
        read: |k, v, s| set(&mut s.http.checkout_tokens, parse_tokens(k, v)),
        show: |s| describe_tokens(&s.http.checkout_tokens),
    },
    Key {
        name: "http.admin_tokens",
        default: "",
        read: |k, v, s| set(&mut s.http.admin_tokens, parse_tokens(k, v)),
        show: |s| describe_tokens(&s.http.admin_tokens),
    },
    Key {
        name: "http.allow_anonymous",
        // A non-loopback bind without tokens stops start-up unless this says the
        // API is meant to be open to whoever reaches it.
        default: "false",
        read: |k, v, s| set(&mut s.http.allow_anonymous, parse_bool(k, v)),
        show: |s| s.http.allow_anonymous.to_string(),
    },
    Key {
        name: "http.protect_operations",
        // `/readyz` and `/metrics` need a token of either scope (`/healthz` never does).
        default: "false",
        read: |k, v, s| set(&mut s.http.protect_operations, parse_bool(k, v)),
        show: |s| s.http.protect_operations.to_string(),
    },
    Key {
        name: "http.header_read_timeout",
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
    },
    Key {
        name: "http.request_timeout",
        default: "30s",
        read: |k, v, s| {
            set(
                &mut s.http.request_timeout,
                parse_duration(k, v, Duration::from_millis(100), Duration::from_secs(3600)),
            )
        },
        show: |s| time(s.http.request_timeout),
    },
    Key {
        name: "http.max_connections",
        default: "1024",
        read: |k, v, s| set(&mut s.http.max_connections, parse_range(k, v, 1, 1_000_000)),
        show: |s| s.http.max_connections.to_string(),
    },
    Key {
        name: "http.max_in_flight",
        // Beyond this many requests at once, answer 503 at once rather than queue
        // for the API's database pool.
        default: "100",
        read: |k, v, s| set(&mut s.http.max_in_flight, parse_range(k, v, 1, 1_000_000)),
        show: |s| s.http.max_in_flight.to_string(),
    },
];

const WINDOWS: &[Key] = &[
    Key {
        name: "windows.payment",
        default: "30m",
        read: |k, v, s| set(&mut s.windows.payment, parse_window(k, v)),
        show: |s| time(s.windows.payment),
    },
    Key {
        name: "windows.fulfillment",
        default: "7d",
        read: |k, v, s| set(&mut s.windows.fulfillment, parse_window(k, v)),
        show: |s| time(s.windows.fulfillment),
    },
    Key {
        name: "windows.receipt",
        default: "14d",
        read: |k, v, s| set(&mut s.windows.receipt, parse_window(k, v)),
        show: |s| time(s.windows.receipt),
    },
    Key {
        name: "windows.max_payment",
        // The longest `payment_window` a checkout may ask for: a longer one would
        // hold stock out of sale for that long.
        default: "7d",
        read: |k, v, s| set(&mut s.windows.max_payment, parse_window(k, v)),
        show: |s| time(s.windows.max_payment),
    },
];

const CONSUMER: &[Key] = &[
    Key {
        name: "consumer.batch_size",
        default: "200",
        read: |k, v, s| {
            set(
                &mut s.consumer.batch_size,
                parse_range(k, v, 1, MAX_BATCH as usize),
            )
        },
        show: |s| s.consumer.batch_size.to_string(),
    },
    Key {
        name: "consumer.batch_wait",
        default: "5ms",
        read: |k, v, s| {
            set(
                &mut s.consumer.batch_wait,
                parse_duration(k, v, Duration::ZERO, Duration::from_secs(1)),
            )
        },
        show: |s| time(s.consumer.batch_wait),
    },
    Key {
        name: "consumer.hold_max",
        default: "1s",
        read: |k, v, s| {
            set(
                &mut s.consumer.hold_max,
                parse_duration(k, v, Duration::ZERO, Duration::from_secs(60)),
            )
        },
        show: |s| time(s.consumer.hold_max),
    },
    // On: a due burst is applied at the database's pace, not the broker's
    // (see `amqp::catch_up`); off only to measure without it.
    Key {
        name: "consumer.catch_up",
        default: "true",
        read: |k, v, s| set(&mut s.consumer.catch_up, parse_bool(k, v)),
        show: |s| s.consumer.catch_up.to_string(),
    },
];

const RELAY: &[Key] = &[
    Key {
        name: "relay.enabled",
        default: "true",
        read: |k, v, s| set(&mut s.relay.enabled, parse_bool(k, v)),
        show: |s| s.relay.enabled.to_string(),
    },
    Key {
        name: "relay.batch_size",
        default: "500",
        read: |k, v, s| set(&mut s.relay.batch_size, parse_range(k, v, 1, MAX_BATCH)),
        show: |s| s.relay.batch_size.to_string(),
    },
    Key {
        name: "relay.interval",
        default: "200ms",
        read: |k, v, s| {
            set(
                &mut s.relay.interval,
                parse_duration(k, v, Duration::from_millis(1), Duration::from_secs(60)),
            )
        },
        show: |s| time(s.relay.interval),
    },
    Key {
        name: "relay.max_attempts",
        default: "10",
        read: |k, v, s| set(&mut s.relay.max_attempts, parse_range(k, v, 1, 1000)),
        show: |s| s.relay.max_attempts.to_string(),
    },
];

const SWEEPER: &[Key] = &[
    Key {
        name: "sweeper.enabled",
        default: "true",
        read: |k, v, s| set(&mut s.sweeper.enabled, parse_bool(k, v)),
        show: |s| s.sweeper.enabled.to_string(),
    },
    Key {
        name: "sweeper.interval",
        default: "30s",
        read: |k, v, s| {
            set(
                &mut s.sweeper.interval,
                parse_duration(k, v, Duration::from_millis(100), DAY),
            )
        },
        show: |s| time(s.sweeper.interval),
    },
    Key {
        name: "sweeper.grace",
        default: "60s",
        read: |k, v, s| {
            set(
                &mut s.sweeper.grace,
                parse_duration(k, v, Duration::ZERO, DAY * 30),
            )
        },
        show: |s| time(s.sweeper.grace),
    },
    Key {
        name: "sweeper.batch_size",
        default: "500",
        read: |k, v, s| set(&mut s.sweeper.batch_size, parse_range(k, v, 1, MAX_BATCH)),
        show: |s| s.sweeper.batch_size.to_string(),
    },
];

const LOG: &[Key] = &[
    Key {
        name: "log.format",
        default: "pretty",
        read: |k, v, s| {
            set(
                &mut s.log.format,
                parse_choice(k, v, &LogFormat::ALL, LogFormat::as_str),
            )
        },
        show: |s| s.log.format.as_str().to_string(),
    },
    Key {
        name: "log.level",
        default: "info,lapin=off",
        read: |k, v, s| set(&mut s.log.level, parse_log_level(k, v)),
        show: |s| s.log.level.clone(),
    },
];

/// Whose orders (see `mapping.rs`).
const ORDERS: &[Key] = &[Key {
    name: "orders.source",
    default: "owned",
    read: |k, v, s| {
        set(
            &mut s.mapping.source,
            parse_choice(k, v, &OrdersSource::ALL, OrdersSource::as_str),
        )
    },
    show: |s| s.mapping.source.as_str().to_string(),
}];

/// A `mapping.*` key naming a table (`qualified`: `schema.name` allowed) or
/// a column of the shop's.
macro_rules! ident_key {
    ($name:literal, $default:literal, $($field:ident).+, $qualified:literal) => {
        Key {
            name: $name,
            default: $default,
            read: |k, v, s| set(&mut s.mapping.$($field).+, parse_ident(k, v, $qualified)),
            show: |s| s.mapping.$($field).+.clone(),
        }
    };
}

/// A `mapping.<kind>.*` key holding one of the shop's status values.
macro_rules! status_key {
    ($name:literal, $($field:ident).+) => {
        Key {
            name: $name,
            default: "",
            read: |k, v, s| set(&mut s.mapping.$($field).+, parse_status(k, v)),
            show: |s| s.mapping.$($field).+.clone(),
        }
    };
}

/// A shop's own table (see `mapping.rs`): empty means unset; checked across
/// keys, and with `orders.source`, once all are read.
const MAPPING: &[Key] = &[
    ident_key!("mapping.table", "", table, true),
    ident_key!("mapping.id_column", "id", id_column, false),
    ident_key!("mapping.status_column", "status", status_column, false),
    ident_key!("mapping.stamp_column", "", stamp_column, false),
    status_key!("mapping.payment.from", payment.from),
    status_key!("mapping.payment.to", payment.to),
    ident_key!(
        "mapping.payment.deadline_column",
        "",
        payment.deadline_column,
        false
    ),
    ident_key!(
        "mapping.payment.since_column",
        "",
        payment.since_column,
        false
    ),
    status_key!("mapping.fulfillment.from", fulfillment.from),
    status_key!("mapping.fulfillment.to", fulfillment.to),
    ident_key!(
        "mapping.fulfillment.flag_column",
        "",
        fulfillment.flag_column,
        false
    ),
    ident_key!(
        "mapping.fulfillment.deadline_column",
        "",
        fulfillment.deadline_column,
        false
    ),
    ident_key!(
        "mapping.fulfillment.since_column",
        "",
        fulfillment.since_column,
        false
    ),
    status_key!("mapping.receipt.from", receipt.from),
    status_key!("mapping.receipt.to", receipt.to),
    ident_key!(
        "mapping.receipt.deadline_column",
        "",
        receipt.deadline_column,
        false
    ),
    ident_key!(
        "mapping.receipt.since_column",
        "",
        receipt.since_column,
        false
    ),
    ident_key!("mapping.stock.items_table", "", stock.items_table, true),
    ident_key!(
        "mapping.stock.items_order_column",
        "",
        stock.items_order_column,
        false
    ),
    ident_key!(
        "mapping.stock.items_sku_column",
        "",
        stock.items_sku_column,
        false
    ),
    ident_key!(
        "mapping.stock.items_quantity_column",
        "",
        stock.items_quantity_column,
        false
    ),
    ident_key!("mapping.stock.table", "", stock.table, true),
    ident_key!("mapping.stock.id_column", "", stock.id_column, false),
    ident_key!(
        "mapping.stock.reserved_column",
        "",
        stock.reserved_column,
        false
    ),
    ident_key!(
        "mapping.stock.available_column",
        "",
        stock.available_column,
        false
    ),
    Key {
        name: "mapping.release_sql",
        default: "",
        read: |k, v, s| set(&mut s.mapping.release_sql, parse_release_sql(k, v)),
        show: |s| s.mapping.release_sql.join("; "),
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
                payment: KindMapping::default(),
                fulfillment: KindMapping::default(),
                receipt: KindMapping::default(),
                stock: StockMapping::default(),
                release_sql: Vec::new(),
            },
            sources,
        }
    }
}
