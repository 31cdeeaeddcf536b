//! The table of settings: every key declared once, in the `settings!` call
//! below, with its type, built-in default, reader and one-line description.
//! The macro makes of it the section structs and [`Settings`], the placeholder
//! they are read into, and one [`Key`] entry per key that the defaults layer,
//! the known-key check, [`Settings::load`], [`Settings::describe`], a reload
//! ([`Settings::with_live`], [`changes`]) and the settings file all walk.

use super::*;

/// One key, and all the service knows about it.
pub(super) struct Key {
    /// The dotted name; the environment spells `amqp.url` `ORDER_TIMEOUT__AMQP__URL`.
    pub name: &'static str,
    /// One line for an operator: what it does, its unit or allowed values (the
    /// key's comment in `config/order-timeout.toml` and `order-timeout config`).
    pub doc: &'static str,
    /// The built-in default, written as a file or the environment would write it.
    pub default: &'static str,
    /// Whether a reload applies it while the service runs (see [`is_live`]).
    pub live: bool,
    /// Parses the merged layers' text for `name` into its field.
    pub read: fn(&str, &str, &mut Settings) -> Result<(), SettingsError>,
    /// The value as `doctor` shows it: a secret only ever redacted.
    pub show: fn(&Settings) -> String,
    /// Whether two settings hold the same value (a rotated token shows the same).
    pub same: fn(&Settings, &Settings) -> bool,
    /// Copies the value from the second settings into the first (a reload).
    pub copy: fn(&mut Settings, &Settings),
    /// The text as given, redacted if the key is a secret (`order-timeout config`).
    pub written: fn(&str) -> String,
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

/// What a key's value is stored as.
pub(super) trait Field: Clone + PartialEq {
    /// The placeholder a field holds until its key is read.
    fn unset() -> Self;
    /// The value as `doctor` shows it.
    fn show(&self) -> String;
    /// Text given for such a key as `order-timeout config` prints it.
    fn written(text: &str) -> String {
        text.to_string()
    }
}

macro_rules! fields {
    ($($ty:ty: $unset:expr, $show:expr $(, $written:expr)?;)*) => {$(
        impl Field for $ty {
            fn unset() -> Self {
                $unset
            }
            fn show(&self) -> String {
                ($show)(self)
            }
            $(fn written(text: &str) -> String {
                ($written)(text)
            })?
        }
    )*};
}

fields! {
    bool: false, |v: &bool| v.to_string();
    u16: 0, |v: &u16| v.to_string();
    u32: 0, |v: &u32| v.to_string();
    u64: 0, |v: &u64| v.to_string();
    i32: 0, |v: &i32| v.to_string();
    usize: 0, |v: &usize| v.to_string();
    f64: 0.0, |v: &f64| v.to_string();
    String: String::new(), String::clone;
    SocketAddr: SocketAddr::from(([127, 0, 0, 1], 0)), |v: &SocketAddr| v.to_string();
    Duration: Duration::ZERO, |d: &Duration| humantime::format_duration(*d).to_string();
    Vec<String>: Vec::new(), |v: &Vec<String>| v.join("; ");
    Option<PathBuf>: None, |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
    Option<Duration>: None, |d: &Option<Duration>| match d {
        Some(d) => humantime::format_duration(*d).to_string(),
        None => "off".to_string(),
    };
    Option<Zone>: None, |z: &Option<Zone>| z.as_ref().map(ToString::to_string).unwrap_or_default();
    Secret: Secret::opaque(""), Secret::redacted, redact_url;
    Vec<Secret>: Vec::new(), |t: &Vec<Secret>| match t.len() {
        0 => String::new(),
        1 => "1 token (redacted)".to_string(),
        n => format!("{n} tokens (redacted)"),
    }, |text: &str| if text.is_empty() { String::new() } else { REDACTED.to_string() };
    Option<ManagementApi>: None, |m: &Option<ManagementApi>| match m {
        Some(m) => format!("{} (as {}, vhost {})", m.base, m.username, m.vhost),
        None => "off".to_string(),
    }, redact_url;
}

/// `true` for a key marked `[live]`.
macro_rules! flag {
    () => {
        false
    };
    (live) => {
        true
    };
}

/// One [`Key`] entry whose value is the field at `path` of [`Settings`].
macro_rules! key {
    ($name:expr, $doc:expr, $default:literal, [$($live:ident)?], $ty:ty, ($($path:ident).+),
     |$k:tt, $v:tt, $s:tt| $read:expr) => {
        Key {
            name: $name,
            doc: $doc.trim_ascii_start(),
            default: $default,
            live: flag!($($live)?),
            read: |$k, $v, settings| {
                let value: $ty = {
                    let $s = &mut *settings;
                    $read
                }?;
                settings.$($path).+ = value;
                Ok(())
            },
            show: |s| Field::show(&s.$($path).+),
            same: |a, b| a.$($path).+ == b.$($path).+,
            copy: |to, from| to.$($path).+ = from.$($path).+.clone(),
            written: <$ty as Field>::written,
        }
    };
}

/// The sections whose struct is made from their keys: each key is its doc
/// line, an optional `[live]`, the field (`as "section.key"` where the key's
/// name is another), its type and default, and how its text is read.
macro_rules! settings {
    ($(
        #[doc = $sdoc:literal]
        $section:ident: $Struct:ident, check $check:expr => {
            $(
                #[doc = $doc:literal]
                $([$live:ident])? $field:ident $(as $name:literal)?: $ty:ty = $default:literal,
                    |$k:tt, $v:tt, $s:tt| $read:expr;
            )*
            $(
                + #[doc = $xdoc:literal]
                $xfield:ident: $xty:ty;
            )*
        }
    )*
    then $(
        #[doc = $mdoc:literal]
        $msection:ident in $root:ident, check $mcheck:expr, opt_in $opt_in:literal => {
            $(
                #[doc = $mkdoc:literal]
                $($mpath:ident).+: $mty:ty = $mdefault:literal, |$mk:tt, $mv:tt, $ms:tt| $mread:expr;
            )*
        }
    )*) => {
        $(
            #[doc = $sdoc]
            #[derive(Debug, Clone)]
            pub struct $Struct {
                $(#[doc = $doc] pub $field: $ty,)*
                $(#[doc = $xdoc] pub $xfield: $xty,)*
            }
        )*

        /// All settings, validated.
        #[derive(Debug, Clone)]
        pub struct Settings {
            $(#[doc = $sdoc] pub $section: $Struct,)*
            /// Whose orders the timeouts act on, and how a shop's table is mapped.
            pub mapping: MappingSettings,
            /// Where each key's value came from, for `doctor`.
            pub sources: BTreeMap<String, Source>,
            /// The text of each key the file or the environment set, as given but
            /// with secrets redacted, for `order-timeout config` ([`Settings::to_toml`]).
            pub given: BTreeMap<String, String>,
        }

        impl Settings {
            /// The shape [`Settings::load`] fills, every field a placeholder.
            pub(super) fn unread(sources: BTreeMap<String, Source>) -> Self {
                Settings {
                    $($section: $Struct {
                        $($field: Field::unset(),)*
                        $($xfield: Default::default(),)*
                    },)*
                    mapping: MappingSettings::default(),
                    sources,
                    given: BTreeMap::new(),
                }
            }
        }

        /// Every section, in the order they are read and shown.
        pub(super) const SECTIONS: &[Section] = &[
            $(Section {
                doc: $sdoc.trim_ascii_start(),
                keys: &[$(key!(
                    name!($section, $field $(, $name)?), $doc, $default, [$($live)?], $ty,
                    ($section.$field), |$k, $v, $s| $read
                )),*],
                check: $check,
                opt_in: false,
            },)*
            $(Section {
                doc: $mdoc.trim_ascii_start(),
                keys: &[$(key!(
                    concat!(stringify!($msection), ".", stringify!($($mpath).+)), $mkdoc, $mdefault,
                    [], $mty, ($root.$($mpath).+), |$mk, $mv, $ms| $mread
                )),*],
                check: $mcheck,
                opt_in: $opt_in,
            },)*
        ];
    };
}

/// A key's dotted name: its section's and its field's, unless given.
macro_rules! name {
    ($section:ident, $field:ident) => {
        concat!(stringify!($section), ".", stringify!($field))
    };
    ($section:ident, $field:ident, $name:literal) => {
        $name
    };
}

const MS: Duration = Duration::from_millis(1);
const SEC: Duration = Duration::from_secs(1);
const DAY: Duration = Duration::from_secs(86_400);

settings! {
    /// The database: the service's own tables, or a shop's when orders.source is mapped.
    database: DatabaseSettings, check None => {
        /// Where orders live: sqlite://FILE?mode=rwc, postgres://USER:PASS@HOST/DB, mysql:// (MariaDB too).
        url: Secret = "sqlite://order-timeout.db?mode=rwc", |k, v, _| parse_database_url(k, v).map(Secret::new);
        /// Connections of the HTTP API's pool, 1 to 1000 (SQLite: always 1).
        max_connections: u32 = "10", |k, v, _| parse_range(k, v, 1, 1000);
        // The consumers, relay and sweeper get their own pool, so a flood of
        // requests cannot starve the timeouts of connections (SQLite: one each).
        /// Connections of the consumers', relay's and sweeper's own pool, 1 to 1000 (SQLite: always 1).
        background_connections: u32 = "5", |k, v, _| parse_range(k, v, 1, 1000);
        /// Whether `serve` applies pending migrations at start (false: run `order-timeout migrate` yourself).
        migrate_on_start: bool = "true", |k, v, _| parse_bool(k, v);
        // Instances that start together take turns: one migrates under a
        // database lock, the others wait, then find nothing pending.
        /// Longest wait while another instance migrates; then start-up fails naming it (1s to 24h).
        migrate_lock_wait: Duration = "5m", |k, v, _| parse_duration(k, v, SEC, DAY);
    }

    /// The broker, RabbitMQ: where the timers wait until their deadline.
    amqp: AmqpSettings, check None => {
        /// Broker URL, amqp://USER:PASSWORD@HOST:PORT/VHOST or amqps://…; a cluster's nodes comma-separated.
        url: Secret = "amqp://guest:guest@127.0.0.1:5672/%2f", |k, v, _| parse_amqp_url(k, v).map(Secret::new);
        // A node that drops SYNs costs the OS's ~2 minutes per try, and one that
        // accepts TCP but never speaks AMQP would hang a reconnect for ever (lapin
        // ignores the URL's connection_timeout): past this, the next address is
        // tried. A broker a few milliseconds away answers in well under a second.
        /// Time to open a connection to one address of amqp.url, TCP and AMQP handshake (100ms to 10m).
        connect_timeout: Duration = "5s", |k, v, _| parse_duration(k, v, MS * 100, SEC * 600);
        /// Name of the entry exchange; every other exchange and queue is PREFIX.ROLE (A-Z a-z 0-9 . - _ :).
        prefix: String = "order.timeouts", |k, v, _| parse_prefix(k, v);
        /// Where timers wait: native (quorum queue, RabbitMQ 4.3+), plugin, ttl, or auto (the first offered).
        delay_mode: DelayMode = "auto", |k, v, _| parse_choice(k, v, &DelayMode::ALL, DelayMode::as_str);
        // Early messages (up to `consumer.hold_max`) are held unacked, so prefetch
        // must exceed rate × hold: 10,000 carries 10,000/s with a 1 s hold.
        // Memory: the router and the relay put canonical bodies (under 1 KiB)
        // into the delay stage, so 10,000 held cost about 10 MiB.
        /// Unacked deliveries per timeout consumer, 1 to 65535; keep it above rate × consumer.hold_max.
        prefetch: u16 = "10000", |k, v, _| parse_range(k, v, 1, 65535);
        // The router needs no hold: its window only has to cover the broker's
        // confirm round trip. Larger windows cost memory, not speed (measured with
        // `bench --million`). Memory: lapin holds each delivery whole before the
        // size check, so the window costs up to router_prefetch × the broker's
        // max_message_size: 256 × 128 KiB (rabbitmq/rabbitmq.conf) = 32 MiB, and
        // 256 × 16 MiB (RabbitMQ 4's default) = 4 GiB on a broker left unbounded.
        /// Deliveries the router may have in flight awaiting the broker's confirm, 1 to 65535.
        router_prefetch: u16 = "256", |k, v, _| parse_range(k, v, 1, 65535);
        /// classic (one node, fastest) or quorum (replicated: timers survive losing a node).
        queue_type: QueueType = "classic", |k, v, _| parse_choice(k, v, &QueueType::ALL, QueueType::as_str);
        /// This instance's name in its broker connection names (at most 128 bytes); empty: HOST:PID.
        instance: String = "", |k, v, _| instance_name(k, v);
        // The file's certificates go to `tls_ca_pem`, read here so that a
        // missing or wrong file stops start-up naming this key.
        /// PEM file of CA certificates to trust for amqps:// besides the system's; empty: none.
        tls_ca_file: Option<PathBuf> = "", |k, v, s| {
            s.amqp.tls_ca_pem = read_pem(k, v)?;
            Ok::<_, SettingsError>(Some(v).filter(|p| !p.is_empty()).map(PathBuf::from))
        };
        // Empty: the management API on the broker's host (http, port 15672) with
        // the credentials of amqp.url; `off`: not used. Read after `amqp.url`,
        // whose parts fill what this URL leaves out.
        /// Management API, http:// only; empty: http://HOST:15672 as amqp.url's user; off: not used.
        management as "amqp.management_url": Option<ManagementApi> = "",
            |k, v, s| parse_management(k, v, s.amqp.url.expose());
        + /// Extra CA certificates (PEM) to trust for `amqps://`, from `amqp.tls_ca_file`.
        tls_ca_pem: Option<String>;
    }

    /// The HTTP API: checkout, the buyer's and the shop's actions, health and metrics.
    http: HttpSettings, check Some(check_http) => {
        /// HTTP API address, HOST:PORT (port 0: any free one); beyond loopback: tokens or allow_anonymous.
        bind: SocketAddr = "127.0.0.1:8080", |k, v, _| parse_bind(k, v);
        // Bearer tokens, comma-separated (old,new while one is rotated). None on a
        // loopback bind leaves the API open, as in development. Read at each
        // request (`crate::http`): a rotated-out token is refused from the next on.
        /// Bearer tokens of the checkout scope (checkout, buyer's actions), comma-separated, 16+ chars.
        [live] checkout_tokens: Vec<Secret> = "", |k, v, _| parse_tokens(k, v);
        /// Bearer tokens of the admin scope (stock, shipping, all of checkout), comma-separated, 16+ chars.
        [live] admin_tokens: Vec<Secret> = "", |k, v, _| parse_tokens(k, v);
        // A non-loopback bind without tokens stops start-up unless this says the
        // API is meant to be open to whoever reaches it.
        /// true: an API reachable from other machines runs without tokens (anyone may call everything).
        allow_anonymous: bool = "false", |k, v, _| parse_bool(k, v);
        /// Whether /readyz and /metrics need a token of either scope (/healthz never does).
        protect_operations: bool = "false", |k, v, _| parse_bool(k, v);
        /// Time to send a request head, and the most an idle keep-alive connection lives (100ms to 1h).
        header_read_timeout: Duration = "75s", |k, v, _| parse_duration(k, v, MS * 100, SEC * 3600);
        /// Time a request may take before it is answered 503 and dropped (100ms to 1h).
        request_timeout: Duration = "30s", |k, v, _| parse_duration(k, v, MS * 100, SEC * 3600);
        // A retry comes within minutes; kept forever, keys only grow the table.
        /// How long an Idempotency-Key is kept; an older key is used anew (1s to 365d).
        idempotency_retention: Duration = "24h", |k, v, _| parse_duration(k, v, SEC, DAY * 365);
        /// Most open connections; at the cap the server stops accepting (1 to 1000000).
        max_connections: usize = "1024", |k, v, _| parse_range(k, v, 1, 1_000_000);
        // Beyond this many requests at once, answer 503 at once rather than queue
        // for the API's database pool.
        /// Most requests handled at once; beyond it, 503 with Retry-After (1 to 1000000).
        max_in_flight: usize = "100", |k, v, _| parse_range(k, v, 1, 1_000_000);
    }

    /// How long each stage of an order may take: 1ms to 49d, written like 250ms, 30s, 15m, 2h or 7d.
    windows: Windows, check Some(check_windows) => {
        /// Default time from checkout to payment; then the order is cancelled and its stock released.
        [live] payment: Duration = "30m", |k, v, _| parse_window(k, v);
        /// Time from payment to shipping; then the order is flagged fulfillment_overdue (it stays paid).
        [live] fulfillment: Duration = "7d", |k, v, _| parse_window(k, v);
        /// Time from shipping to the buyer's confirmation; then the order is completed.
        [live] receipt: Duration = "14d", |k, v, _| parse_window(k, v);
        // A longer one would hold stock out of sale for that long.
        /// Longest payment_window a checkout may ask for; windows.payment must not exceed it.
        [live] max_payment: Duration = "7d", |k, v, _| parse_window(k, v);
    }

    /// The timeout consumers, which apply due timeouts in the database.
    consumer: ConsumerSettings, check None => {
        /// Most deliveries decided in one database transaction (1 to 10000).
        [live] batch_size: usize = "200", |k, v, _| parse_range(k, v, 1, MAX_BATCH as usize);
        /// How long a batch may wait to fill while messages flow; an idle queue never waits (0 to 1s).
        [live] batch_wait: Duration = "5ms", |k, v, _| parse_duration(k, v, Duration::ZERO, SEC);
        /// A delivery due within this is held in memory; one due later waits in the broker again (0 to 60s).
        [live] hold_max: Duration = "1s", |k, v, _| parse_duration(k, v, Duration::ZERO, SEC * 60);
        // On: a due burst is applied at the database's pace, not the broker's
        // (see `amqp::catch_up`); off only to measure without it.
        /// Whether a due delivery also applies every order of its kind already due (false: to measure).
        catch_up: bool = "true", |k, v, _| parse_bool(k, v);
        // On: the database work of a due burst starts at its first deadline,
        // not at its first message, which a loaded broker hands over late.
        /// Whether the catch-up also runs at its kind's next deadline, not only after a due delivery.
        wake_at_deadline: bool = "true", |k, v, _| parse_bool(k, v);
    }

    /// The outbox relay, which publishes committed timeouts and events to the broker.
    relay: RelaySettings, check None => {
        /// Whether this instance publishes the outbox (timeouts, domain events); false: something else does.
        enabled: bool = "true", |k, v, _| parse_bool(k, v);
        /// Most outbox rows published per round (1 to 10000).
        [live] batch_size: u64 = "500", |k, v, _| parse_range(k, v, 1, MAX_BATCH);
        // The next round is claimed and published while the broker confirms
        // the last ones: a round costs the database's round trips, not also
        // the broker's. Each round out holds up to batch_size rows in memory
        // and unconfirmed messages on the channel.
        /// Most relay rounds published whose confirms are still outstanding, per outbox (1 to 64).
        [live] rounds_in_flight: usize = "4", |k, v, _| parse_range(k, v, 1, 64);
        /// How often the relay looks at the outbox when no commit woke it (1ms to 60s).
        [live] interval: Duration = "200ms", |k, v, _| parse_duration(k, v, MS, SEC * 60);
        /// Refusals by the broker after which an outbox row is set aside with its reason (1 to 1000).
        max_attempts: i32 = "10", |k, v, _| parse_range(k, v, 1, 1000);
    }

    /// The sweeper, the safety net: applies the timeouts of orders overdue by more than a grace period.
    sweeper: SweeperSettings, check None => {
        /// Whether this instance sweeps (any number may: each order changes once).
        enabled: bool = "true", |k, v, _| parse_bool(k, v);
        /// Time between sweeps (100ms to 1d).
        [live] interval: Duration = "30s", |k, v, _| parse_duration(k, v, MS * 100, DAY);
        /// How long past its deadline an order must be before the sweeper acts on it (0 to 30d).
        [live] grace: Duration = "60s", |k, v, _| parse_duration(k, v, Duration::ZERO, DAY * 30);
        /// Orders per page of a sweep, one transaction each; a sweep goes on until none is left (1 to 10000).
        [live] batch_size: u64 = "500", |k, v, _| parse_range(k, v, 1, MAX_BATCH);
    }

    /// Pauses: those shared by every instance are kept in the database (docs/operations.md, Pause and resume).
    control: ControlSettings, check None => {
        // A pause made on one instance reaches the others within this; a
        // reading is one primary-key scan of a table of at most six rows.
        /// How often an instance reads the pauses shared by every instance (100ms to 1m).
        poll_interval: Duration = "1s", |k, v, _| parse_duration(k, v, MS * 100, SEC * 60);
    }

    /// The audit trail of a mapped table's transitions (order_timeout_audit): how long it is kept.
    audit: AuditSettings, check None => {
        // Deleted a bounded batch at a time with a pause between, judged by
        // the database's clock (`crate::retention`). The floor keeps the
        // rows a retried batch reads back (`Mapped::applied_earlier`).
        /// How long an audit row is kept, then deleted in batches (1h to 3650d); off or 0: kept for ever.
        [live] retention: Option<Duration> = "90d", |k, v, _| parse_retention(k, v, SEC * 3600, DAY * 3650);
    }

    /// The order gauges: orders waiting for each timeout, those overdue, and those due soon (docs/operations.md, Monitoring).
    metrics: MetricsSettings, check None => {
        // Prometheus scrapes every 15 s to 1 min: a reading per scrape at most.
        /// How often the order gauges are read from the database, two queries per kind (100ms to 1h).
        [live] gauge_interval: Duration = "15s", |k, v, _| parse_duration(k, v, MS * 100, SEC * 3600);
        // As sweeper.grace: an order this late is one the sweeper takes in
        // its next pass, so a lost timer shows for at most sweeper.interval.
        /// How long past its deadline a waiting order must be to count in overdue_orders (0 to 30d).
        [live] overdue_after: Duration = "60s", |k, v, _| parse_duration(k, v, Duration::ZERO, DAY * 30);
    }

    /// Logging, to standard error.
    log: LogSettings, check None => {
        /// pretty (lines for a terminal) or json (one object per line, for log shippers).
        format: LogFormat = "pretty", |k, v, _| parse_choice(k, v, &LogFormat::ALL, LogFormat::as_str);
        /// Log filter in RUST_LOG syntax, used when RUST_LOG is not set.
        [live] level: String = "info,lapin=off", |k, v, _| parse_log_level(k, v);
    }

    /// Traces of each timeout across the broker, exported over OTLP/HTTP (docs/operations.md, Tracing).
    tracing: TracingSettings, check None => {
        // Empty: no exporter, no layer, no header read or written, no cost.
        /// OTLP/HTTP base URL, e.g. http://collector:4318 (spans go to its /v1/traces); empty: off.
        otlp_endpoint: String = "", |k, v, _| parse_otlp_endpoint(k, v);
        /// The service.name the spans carry.
        service_name: String = "order-timeout", |k, v, _| parse_service_name(k, v);
        // Parent-based: a publisher's sampled traceparent is always followed.
        /// Share of new traces sampled (0.0 to 1.0); a publisher's traceparent keeps its own decision.
        sample_ratio: f64 = "1.0", |k, v, _| parse_ratio(k, v);
    }

    // Whose orders, and a shop's own table (see `mapping.rs`): empty text is
    // unset; checked across keys, and with `orders.source`, once all are read.
    then
    /// Whose orders the timeouts act on.
    orders in mapping, check None, opt_in false => {
        /// owned (its own tables, filled by its API) or mapped (a shop's table, described by mapping.*).
        source: OrdersSource = "owned", |k, v, _| parse_choice(k, v, &OrdersSource::ALL, OrdersSource::as_str);
        /// Mapped only: decide as serve does, change nothing, record it beside the shop's own closes.
        shadow: bool = "false", |k, v, _| parse_bool(k, v);
    }
    /// A shop's own orders table, for orders.source = "mapped" (see config/mall.toml); refused otherwise.
    mapping in mapping, check Some(check_mapping), opt_in true => {
        /// The shop's orders table, NAME or SCHEMA.NAME (required when mapped).
        table: String = "", |k, v, _| parse_ident(k, v, true);
        /// Its primary key column: integer, text or UUID.
        id_column: String = "id", |k, v, _| parse_ident(k, v, false);
        /// Its status column: integer or text.
        status_column: String = "status", |k, v, _| parse_ident(k, v, false);
        /// Optional time column set to the database's clock by every transition (e.g. updated_at).
        stamp_column: String = "", |k, v, _| parse_ident(k, v, false);
        /// Zone the shop writes zone-less times in: IANA name or +HH:MM; empty: the server's default.
        time_zone: Option<Zone> = "", |k, v, _| parse_time_zone(k, v);
        /// Status of an unpaid order, which the payment timeout acts on (required when mapped).
        payment.from: String = "", |k, v, _| parse_status(k, v);
        /// Status the payment timeout sets: the shop's cancelled or closed (required when mapped).
        payment.to: String = "", |k, v, _| parse_status(k, v);
        /// Column holding the payment deadline; set this or since_column.
        payment.deadline_column: String = "", |k, v, _| parse_ident(k, v, false);
        /// Column holding the window's start (creation); deadline = it + windows.payment.
        payment.since_column: String = "", |k, v, _| parse_ident(k, v, false);
        /// Status of a paid order waiting to be shipped; empty: fulfillment timeouts are not mapped.
        fulfillment.from: String = "", |k, v, _| parse_status(k, v);
        /// Status meaning overdue, if the shop has one; set this or flag_column.
        fulfillment.to: String = "", |k, v, _| parse_status(k, v);
        /// Nullable time column stamped once when the order is found overdue (its status stays).
        fulfillment.flag_column: String = "", |k, v, _| parse_ident(k, v, false);
        /// Column holding the shipping deadline; set this or since_column.
        fulfillment.deadline_column: String = "", |k, v, _| parse_ident(k, v, false);
        /// Column holding the window's start (payment); deadline = it + windows.fulfillment.
        fulfillment.since_column: String = "", |k, v, _| parse_ident(k, v, false);
        /// Status of a shipped order; empty: receipt timeouts are not mapped.
        receipt.from: String = "", |k, v, _| parse_status(k, v);
        /// Status the receipt timeout sets: the shop's completed.
        receipt.to: String = "", |k, v, _| parse_status(k, v);
        /// Column holding the receipt deadline; set this or since_column.
        receipt.deadline_column: String = "", |k, v, _| parse_ident(k, v, false);
        /// Column holding the window's start (shipping); deadline = it + windows.receipt.
        receipt.since_column: String = "", |k, v, _| parse_ident(k, v, false);
        /// Order items table, NAME or SCHEMA.NAME; give every stock key (available_column optional) or none.
        stock.items_table: String = "", |k, v, _| parse_ident(k, v, true);
        /// Its column holding the order id.
        stock.items_order_column: String = "", |k, v, _| parse_ident(k, v, false);
        /// Its column naming the stock row.
        stock.items_sku_column: String = "", |k, v, _| parse_ident(k, v, false);
        /// Its quantity column.
        stock.items_quantity_column: String = "", |k, v, _| parse_ident(k, v, false);
        /// Stock table, NAME or SCHEMA.NAME.
        stock.table: String = "", |k, v, _| parse_ident(k, v, true);
        /// Its key, matched against the items' SKU column.
        stock.id_column: String = "", |k, v, _| parse_ident(k, v, false);
        /// Column a cancelled order's quantities are taken back from (reserved stock).
        stock.reserved_column: String = "", |k, v, _| parse_ident(k, v, false);
        /// Optional column the quantities are added back to (stock taken off sale at checkout).
        stock.available_column: String = "", |k, v, _| parse_ident(k, v, false);
        /// Own statements per order a payment timeout cancels, ;-separated, id bound as $1 (PostgreSQL) or ?.
        release_sql: Vec<String> = "", |k, v, _| parse_release_sql(k, v);
    }
}

/// Every key, in table order.
pub(super) fn keys() -> impl Iterator<Item = &'static Key> {
    SECTIONS.iter().flat_map(|section| section.keys)
}

impl Windows {
    /// The window of `kind`, `windows.<kind>`: the settings hold one key
    /// per kind, so this is where the kinds' list meets them.
    pub fn of(&self, kind: crate::domain::TimeoutKind) -> std::time::Duration {
        use crate::domain::TimeoutKind::*;
        match kind {
            Payment => self.payment,
            Fulfillment => self.fulfillment,
            Receipt => self.receipt,
        }
    }
}

impl AmqpSettings {
    /// The broker's addresses, in the order `amqp.url` gives them (secret:
    /// for a connect call; [`redact_url`] any that is shown).
    pub fn addresses(&self) -> Vec<&str> {
        self.url.expose().split(',').collect()
    }
}

/// Where the broker's management HTTP API answers, and as whom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagementApi {
    /// `http://host:port` and any path prefix, without credentials or `/api`.
    pub base: String,
    /// The user name.
    pub username: String,
    /// The password.
    pub password: Secret,
    /// The vhost of `amqp.url`, whose exchanges it reads.
    pub vhost: String,
}

impl HttpSettings {
    /// Whether any token is configured, so that the API asks for one.
    pub fn has_tokens(&self) -> bool {
        !self.checkout_tokens.is_empty() || !self.admin_tokens.is_empty()
    }
}
