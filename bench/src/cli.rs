//! The options of `order-timeout-bench`: the scenario's size, the database and
//! delay mode under test, and where the broker, database and report are.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

/// Options of `order-timeout-bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Orders due within 2 s (the burst).
    #[arg(long, default_value_t = 20_000)]
    pub burst: usize,
    /// Orders due per second in the steady load.
    #[arg(long, default_value_t = 1_000)]
    pub steady_rate: usize,
    /// How long the steady load lasts, in seconds (0: no steady load).
    #[arg(long, default_value_t = 30)]
    pub steady_secs: usize,
    /// The database of the service under test (a fresh one either way).
    #[arg(long, value_enum, default_value_t = BenchDb::Postgres)]
    pub db: BenchDb,
    /// Delay mode; `auto` is the service's `auto` (native where the broker
    /// holds quorum-queue delivery times, else the plugin where enabled, else
    /// ttl), except that `--million` never picks the plugin.
    #[arg(long, value_enum, default_value_t = BenchMode::Auto)]
    pub mode: BenchMode,
    /// HTTP requests in flight while placing orders.
    #[arg(long, default_value_t = 64)]
    pub clients: usize,
    /// Distinct SKUs the orders draw from (fewer means hotter inventory rows).
    #[arg(long, default_value_t = 64)]
    pub skus: usize,
    /// Schedule a million long timeouts (with `--mode auto`: native where the
    /// broker has it, else ttl; plugin only when asked) and watch memory instead.
    #[arg(long)]
    pub million: bool,
    /// How many orders `--million` schedules (a smaller number for a smoke run).
    #[arg(long, default_value_t = 1_000_000)]
    pub million_orders: usize,
    /// After `--million` has scheduled every timer, how long to measure the
    /// idle cost (CPU of the service, broker and database with every timer
    /// pending and none due), seconds; 0 skips it.
    #[arg(long, default_value_t = 30)]
    pub idle_secs: u64,
    /// Where the JSON goes.
    #[arg(long, default_value = "target/bench/latest.json")]
    pub out: PathBuf,
    /// The broker under test, `amqp://user:pass@host:port` (its vhost is
    /// replaced by the run's own); default: the service's `amqp.url`.
    #[arg(long, value_name = "URL")]
    pub amqp: Option<String>,
    /// The management API of that same broker, with credentials.
    #[arg(long, default_value = "http://guest:guest@127.0.0.1:15672/api")]
    pub management: String,
    /// PostgreSQL admin URL; the bench creates and drops `ot_bench_<random>` there.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/postgres")]
    pub postgres_admin: String,
    /// After the main run, the same burst of this many orders (no steady
    /// load) on the service with tracing off, then on and exporting to a
    /// sink the bench runs (first on `--tracing-baseline` when given); the
    /// figures go into the JSON's `tracing`. 0 skips it.
    #[arg(long, default_value_t = 5_000)]
    pub tracing_burst: usize,
    /// The service built without tracing at all (an earlier release's
    /// binary, as `make bench` builds with scripts/previous-release.sh): the
    /// tracing comparison runs its burst on it too, the baseline that
    /// tracing off is measured against.
    #[arg(long, value_name = "BIN")]
    pub tracing_baseline: Option<PathBuf>,
    /// How many times the tracing comparison runs each of its bursts, in
    /// turn (baseline, off, on, then again); each figure is the median.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=9))]
    pub tracing_rounds: u32,
    /// The service binary under test (default: `ORDER_TIMEOUT_BIN`, else
    /// `order-timeout` beside the bench's own binary).
    #[arg(long, value_name = "BIN")]
    pub service_bin: Option<PathBuf>,
    /// `log.level` of the service under test (default: its own setting).
    #[arg(long)]
    pub service_log_level: Option<String>,
}

/// `--db`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BenchDb {
    /// A fresh PostgreSQL database.
    Postgres,
    /// A fresh SQLite file.
    Sqlite,
}

/// `--mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BenchMode {
    /// TTL levels.
    Ttl,
    /// The delayed-message plugin (skipped when the broker lacks it).
    Plugin,
    /// A quorum queue holding each timer until its time (RabbitMQ 4.3 and
    /// later; skipped when the broker does not hold delivery times).
    Native,
    /// What the service's `auto` picks (see `--mode`).
    Auto,
}
