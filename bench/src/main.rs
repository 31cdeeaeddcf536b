//! `order-timeout-bench` (`make bench`): measures the service as a black box, against the local
//! broker and a fresh database, then measures the machine's ceiling for the same
//! work, and refuses to report figures from a run that was wrong.
//!
//! One run:
//! 1. a fresh vhost and database; the service under test started as a child
//!    process (`serve`, sweeper off, so every cancel is the message path's);
//! 2. a short calibration of checkout speed, then every order of the run placed
//!    over HTTP by concurrent clients (checkout throughput), with deadlines
//!    planned so that all are placed before the first one falls due: a steady
//!    load (R due per second for S seconds) and, after it, a burst (N due within
//!    2 s); 10% of each paid before its deadline;
//! 3. waiting until every unpaid order is cancelled; reading the result from the
//!    database (`cancelled_at`, `pay_deadline`, stock, audit trail);
//! 4. correctness checks, then the ceiling: a raw consume-and-ack of a plain
//!    durable queue, and a raw batched conditional UPDATE, on the same broker and
//!    database; then the table, and JSON in `target/bench/latest.json`.
//!
//! `--million` is a different scenario: see [`million`].

mod ceiling;
mod env;
mod million;
mod profile;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::{Args, ValueEnum};
use sea_orm::{ConnectionTrait, DatabaseConnection, QueryResult, Statement};
use serde_json::{Value, json};

use clap::Parser;
use env::{BenchDatabase, Management, ProcStats, Resources, Service};
use order_timeout::domain::Millis;
use order_timeout::settings::{Settings, SettingsSource};

/// Measures order-timeout (a child `serve` on a fresh vhost and database) and the machine's ceiling.
#[derive(Debug, Parser)]
#[command(name = "order-timeout-bench", version, about)]
struct Cli {
    /// The service's TOML settings file (also ORDER_TIMEOUT_CONFIG), passed on
    /// to the child; environment variables ORDER_TIMEOUT__SECTION__KEY override it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(flatten)]
    args: BenchArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let settings = match Settings::load(&SettingsSource {
        file: cli.config.clone(),
        env: None,
    }) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("order-timeout-bench: configuration error: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("order-timeout-bench: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(settings, cli.config, cli.args)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("order-timeout-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The payment window of a burst: every burst deadline falls within this span.
pub(crate) const BURST_SPAN_MS: i64 = 2_000;
/// Stock given to every SKU; never the limit.
const STOCK: i64 = 1_000_000_000;
/// The checkout rate the issue asks for (PostgreSQL), orders per second.
const TARGET_CHECKOUT_PER_S: f64 = 3_000.0;
/// One order in this many is paid before its deadline.
const PAID_EVERY: usize = 10;

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
    /// Delay mode; `auto` runs plugin mode when the broker has it, else ttl.
    #[arg(long, value_enum, default_value_t = BenchMode::Auto)]
    pub mode: BenchMode,
    /// HTTP requests in flight while placing orders.
    #[arg(long, default_value_t = 64)]
    pub clients: usize,
    /// Distinct SKUs the orders draw from (fewer means hotter inventory rows).
    #[arg(long, default_value_t = 64)]
    pub skus: usize,
    /// Schedule a million long timeouts (ttl mode unless `--mode plugin`) and
    /// watch memory instead.
    #[arg(long)]
    pub million: bool,
    /// How many orders `--million` schedules (a smaller number for a smoke run).
    #[arg(long, default_value_t = 1_000_000)]
    pub million_orders: usize,
    /// Where the JSON goes.
    #[arg(long, default_value = "target/bench/latest.json")]
    pub out: PathBuf,
    /// RabbitMQ management API, with credentials.
    #[arg(long, default_value = "http://guest:guest@127.0.0.1:15672/api")]
    pub management: String,
    /// PostgreSQL admin URL; the bench creates and drops `ot_bench_<random>` there.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/postgres")]
    pub postgres_admin: String,
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
    /// The plugin when present, else TTL levels.
    Auto,
}

/// Runs the bench; the exit code says whether the run was right.
pub async fn run(
    settings: Settings,
    config: Option<PathBuf>,
    args: BenchArgs,
) -> anyhow::Result<ExitCode> {
    let management = Management::new(&args.management)?;
    let plugin = management.plugin_available().await?;
    let mode = match (args.mode, plugin, args.million) {
        // A million timers: ttl unless plugin mode is asked for (the plugin's
        // table is not meant for millions; the figure says what it costs).
        (BenchMode::Ttl, _, _) | (BenchMode::Auto, _, true) => "ttl",
        (BenchMode::Plugin | BenchMode::Auto, true, _) => "plugin",
        (BenchMode::Plugin, false, _) => {
            println!(
                "SKIPPED plugin mode: the broker offers no x-delayed-message exchange type \
                 (rabbitmq_delayed_message_exchange is not enabled); nothing was measured"
            );
            return Ok(ExitCode::SUCCESS);
        }
        (BenchMode::Auto, false, _) => {
            println!(
                "plugin mode skipped: the broker offers no x-delayed-message exchange type; \
                 running ttl mode"
            );
            "ttl"
        }
    };
    // A failed run must not leave an older run's figures looking current.
    if args.out.exists() {
        std::fs::remove_file(&args.out)
            .with_context(|| format!("removing {}", args.out.display()))?;
    }
    let mut res = Resources {
        management: Some(management),
        ..Default::default()
    };
    let outcome = tokio::select! {
        r = setup_and_run(&mut res, &settings, config.as_deref(), &args, mode) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    res.cleanup().await;
    match outcome {
        Ok(report) => {
            if let Some(dir) = args.out.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::write(&args.out, serde_json::to_string_pretty(&report)? + "\n")
                .with_context(|| format!("writing {}", args.out.display()))?;
            println!("wrote {}", args.out.display());
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("bench FAILED, no figures reported: {e:#}");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Creates the vhost, database and child, then runs the chosen scenario.
async fn setup_and_run(
    res: &mut Resources,
    settings: &Settings,
    config: Option<&Path>,
    args: &BenchArgs,
    mode: &str,
) -> anyhow::Result<Value> {
    let tag = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
    let vhost = format!("ot-bench-{tag}");
    let management = res.management.clone().context("management API")?;
    management.create_vhost(&vhost).await?;
    res.vhost = Some(vhost.clone());
    let database = match args.db {
        BenchDb::Postgres => BenchDatabase::postgres(&args.postgres_admin, &tag).await?,
        BenchDb::Sqlite => BenchDatabase::sqlite(&tag),
    };
    let db_url = database.url().to_string();
    let db_kind = database.kind();
    res.database = Some(database);
    let mut amqp_url = url::Url::parse(settings.amqp.url.expose()).context("amqp.url")?;
    amqp_url.set_path(&format!("/{vhost}"));
    let amqp_url = amqp_url.to_string();
    println!("bench: mode {mode}, database {db_kind}, vhost {vhost}");

    let port = env::free_port()?;
    // The bench calls the API as production does, with a bearer token: a
    // random admin token of this run's own.
    let token = uuid::Uuid::new_v4().simple().to_string();
    let mut service_env = vec![
        ("ORDER_TIMEOUT__HTTP__ADMIN_TOKENS", token.clone()),
        ("ORDER_TIMEOUT__DATABASE__URL", db_url.clone()),
        ("ORDER_TIMEOUT__AMQP__URL", amqp_url.clone()),
        ("ORDER_TIMEOUT__AMQP__DELAY_MODE", mode.to_string()),
        ("ORDER_TIMEOUT__AMQP__INSTANCE", format!("bench-{tag}")),
        ("ORDER_TIMEOUT__HTTP__BIND", format!("127.0.0.1:{port}")),
        // Every cancel must be the message path's, so the sweeper stays off.
        ("ORDER_TIMEOUT__SWEEPER__ENABLED", "false".to_string()),
        // The same values the ceiling uses, whichever layer set them.
        (
            "ORDER_TIMEOUT__AMQP__PREFETCH",
            settings.amqp.prefetch.to_string(),
        ),
        (
            "ORDER_TIMEOUT__CONSUMER__BATCH_SIZE",
            settings.consumer.batch_size.to_string(),
        ),
        // Room for every client and the progress queries: the bench measures
        // throughput, not the overload refusal.
        (
            "ORDER_TIMEOUT__HTTP__MAX_IN_FLIGHT",
            (args.clients + 16)
                .max(settings.http.max_in_flight)
                .to_string(),
        ),
    ];
    if let Some(level) = &args.service_log_level {
        service_env.push(("ORDER_TIMEOUT__LOG__LEVEL", level.clone()));
    }
    let service_env: Vec<(String, String)> = service_env
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    let log = args
        .out
        .parent()
        .unwrap_or(Path::new("."))
        .join("service.log");
    let mut authorization = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))?;
    authorization.set_sensitive(true);
    let http = reqwest::Client::builder()
        .default_headers(
            [(reqwest::header::AUTHORIZATION, authorization)]
                .into_iter()
                .collect(),
        )
        .pool_max_idle_per_host(args.clients.max(1))
        .timeout(Duration::from_secs(60))
        .build()?;
    let service = res
        .service
        .insert(Service::start(config, &service_env, port, log)?);
    println!(
        "bench: service under test pid {} on {} (log {})",
        service.pid(),
        service.base,
        service.log.display()
    );
    service.wait_ready(&http, Duration::from_secs(60)).await?;
    let db = res.database.as_ref().context("database")?.connect().await?;
    let ctx = RunCtx {
        http,
        db,
        amqp_url,
        management,
        vhost,
        mode: mode.to_string(),
        db_kind: db_kind.to_string(),
        prefetch: settings.amqp.prefetch,
        batch_size: settings.consumer.batch_size,
        prefix: settings.amqp.prefix.clone(),
    };
    let report = if args.million {
        million::run(&ctx, res, args).await?
    } else {
        timeouts(&ctx, res, args).await?
    };
    ctx.db.clone().close().await.ok();
    Ok(report)
}

/// What every phase needs.
pub(crate) struct RunCtx {
    /// HTTP client for the service's API.
    http: reqwest::Client,
    /// The bench's own connection to the service's database.
    db: DatabaseConnection,
    /// The broker URL of the run's vhost.
    amqp_url: String,
    /// The management API.
    management: Management,
    /// The run's vhost.
    vhost: String,
    /// `ttl` or `plugin`.
    mode: String,
    /// `postgres` or `sqlite`.
    db_kind: String,
    /// `amqp.prefetch` of the service (and of the ceiling's consumer).
    prefetch: u16,
    /// `consumer.batch_size` of the service (and of both ceilings).
    batch_size: usize,
    /// `amqp.prefix` (names of the service's queues).
    prefix: String,
}

impl RunCtx {
    /// A connection of the bench's own to the run's vhost, named
    /// `order-timeout bench <role>` in the management UI.
    pub(crate) async fn broker(&self, role: &str) -> anyhow::Result<lapin::Connection> {
        let name = format!("order-timeout bench {role}");
        lapin::Connection::connect(
            &self.amqp_url,
            lapin::ConnectionProperties::default().with_connection_name(name.into()),
        )
        .await
        .with_context(|| format!("connecting the bench's {role} connection to the run's vhost"))
    }
}

/// Which load an order belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Group {
    /// Placed to measure checkout speed before planning deadlines.
    Calibration,
    /// R due per second for S seconds.
    Steady,
    /// N due within 2 s.
    Burst,
}

/// One order to place.
#[derive(Debug, Clone)]
struct Job {
    /// Its load.
    group: Group,
    /// The planned deadline (the service's stored one decides).
    deadline_ms: i64,
    /// Paid before its deadline.
    paid: bool,
    /// Index of its SKU.
    sku: usize,
    /// Units ordered.
    quantity: i64,
}

fn sku_name(i: usize) -> String {
    format!("BENCH-{i:03}")
}

/// The burst and steady scenario.
async fn timeouts(ctx: &RunCtx, res: &mut Resources, args: &BenchArgs) -> anyhow::Result<Value> {
    if args.burst == 0 {
        bail!("--burst must be at least 1");
    }
    let skus = args.skus.max(1);
    for i in 0..skus {
        let service = res.service.as_ref().context("service")?;
        let resp = ctx
            .http
            .put(format!("{}/inventory/{}", service.base, sku_name(i)))
            .json(&json!({ "available": STOCK }))
            .send()
            .await?;
        if !resp.status().is_success() {
            bail!("stocking {}: {}", sku_name(i), resp.status());
        }
    }
    let steady_n = args.steady_rate * args.steady_secs;
    let total = steady_n + args.burst;

    // Calibration: how fast does checkout go here, now? Due 2 s after placement.
    let calib_n = (total / 10).clamp(20, 500);
    let calib: Vec<Job> = (0..calib_n)
        .map(|i| Job {
            group: Group::Calibration,
            deadline_ms: 0,
            paid: false,
            sku: i % skus,
            quantity: 1 + (i % 3) as i64,
        })
        .collect();
    let base = res.service.as_ref().context("service")?.base.clone();
    let started = Instant::now();
    let (calib_ids, _) =
        place(ctx, &base, &calib, args.clients, Some(2_000), "calibration").await?;
    let calib_rate = calib_n as f64 / started.elapsed().as_secs_f64();

    // Plan: every order placed (and paid) well before the first deadline.
    let estimate_s = (total as f64 * 1.1) / calib_rate;
    let first_due = Millis::now().0 + (estimate_s * 1.6 * 1000.0) as i64 + 3_000;
    let burst_start = if steady_n > 0 {
        first_due + (args.steady_secs as i64) * 1000 + 3_000
    } else {
        first_due
    };
    println!(
        "plan: checkout calibrated at {calib_rate:.0}/s; placing {total} orders \
         (steady {steady_n}, burst {}), first due in {:.1}s, burst due in {:.1}s",
        args.burst,
        (first_due - Millis::now().0) as f64 / 1000.0,
        (burst_start - Millis::now().0) as f64 / 1000.0,
    );
    let mut jobs = Vec::with_capacity(total);
    for i in 0..steady_n {
        jobs.push(Job {
            group: Group::Steady,
            deadline_ms: first_due + (i as i64 * 1000) / args.steady_rate.max(1) as i64,
            paid: i % PAID_EVERY == PAID_EVERY - 1,
            sku: i % skus,
            quantity: 1 + (i % 3) as i64,
        });
    }
    for j in 0..args.burst {
        jobs.push(Job {
            group: Group::Burst,
            deadline_ms: burst_start + (j as i64 * BURST_SPAN_MS) / args.burst as i64,
            paid: j % PAID_EVERY == PAID_EVERY - 1,
            sku: (j * 7) % skus,
            quantity: 1 + (j % 3) as i64,
        });
    }
    let (pid, ticks) = {
        let service = res.service.as_ref().context("service")?;
        (service.pid(), service.ticks())
    };
    let cpu_before = profile::Cpu::read(pid, ticks);
    let started = Instant::now();
    let (ids, sent) = place(ctx, &base, &jobs, args.clients, None, "checkout").await?;
    let cpu_after = profile::Cpu::read(pid, ticks);
    // The run's timers as the relay scheduled them: when, and for how long.
    let schedule: Vec<ceiling::Scheduled> = jobs
        .iter()
        .zip(&sent)
        .map(|(j, at)| ceiling::Scheduled {
            sent_ms: *at,
            window_ms: j.deadline_ms - at,
            burst: j.group == Group::Burst,
        })
        .collect();
    let checkout_s = started.elapsed().as_secs_f64();
    let checkout_per_s = total as f64 / checkout_s;
    let checkout_limit = profile::cpu_usage(
        &cpu_before,
        &cpu_after,
        checkout_s,
        total,
        checkout_per_s,
        TARGET_CHECKOUT_PER_S,
    );
    println!("checkout: {total} orders in {checkout_s:.1}s = {checkout_per_s:.0}/s");
    pay(ctx, &base, &jobs, &ids, args.clients).await?;
    let margin = first_due - Millis::now().0;
    if margin < 500 {
        bail!(
            "placing the orders took longer than planned: the first deadline was {} ms away \
             when the last payment went in; the measurement would mix checkout and cancels",
            margin
        );
    }

    // Every order of the run, by database id.
    let mut all: HashMap<i64, Job> = HashMap::with_capacity(total + calib_n);
    for (job, id) in calib.iter().zip(&calib_ids).chain(jobs.iter().zip(&ids)) {
        all.insert(*id, job.clone());
    }
    let last_due = burst_start + BURST_SPAN_MS;
    let drain_limit = Duration::from_secs(60 + (total / 200) as u64);
    let samples = wait_drained(ctx, res, last_due, drain_limit).await?;
    let stats = res.service.as_ref().context("service")?.stats()?;
    let result = analyse(ctx, &all, skus).await?;
    if !result.errors.is_empty() {
        bail!(
            "the run was wrong ({} problems):\n  - {}",
            result.errors.len(),
            result.errors.join("\n  - ")
        );
    }
    println!("correctness: every check passed");
    let (first_cancel, last_cancel, burst_n) = result.burst_window;
    let drain = profile::Profile::new(samples);
    let limit = drain.limit(
        &ctx.mode,
        (first_cancel, last_cancel),
        burst_n,
        result.burst_cancels_per_s,
        result.burst_offered_per_s,
    );
    let series = drain.series(burst_start - 1_000);
    // The ceiling is measured on a quiet broker and database: the service stops first.
    if let Some(mut service) = res.service.take() {
        service.stop();
    }
    let n = args.burst.max(2_000);
    let consume = ceiling::consume_ack(ctx, n).await?;
    let update = ceiling::db_batch_cancel(ctx, n).await?;
    let delay_path = ceiling::delay_path(ctx, &schedule).await?;
    let steady_limit = steady_verdict(&result.steady, &delay_path.steady);
    let lower = consume.consume_ack_per_s.min(update);
    let fraction = result.burst_cancels_per_s / lower;
    let report = json!({
        "mode": ctx.mode,
        "db": ctx.db_kind,
        "orders": total + calib_n,
        "burst": args.burst,
        "steady": { "rate": args.steady_rate, "secs": args.steady_secs },
        "clients": args.clients,
        "batch_size": ctx.batch_size,
        "prefetch": ctx.prefetch,
        "checkout_per_s": round1(checkout_per_s),
        "burst_cancels_per_s": round1(result.burst_cancels_per_s),
        "burst_offered_per_s": round1(result.burst_offered_per_s),
        "burst_drain_ms": result.burst_drain_ms,
        "lateness_ms": {
            "burst": result.burst.json(),
            "steady": result.steady.json(),
        },
        "ceiling": {
            "consume_ack_per_s": round1(consume.consume_ack_per_s),
            "publish_confirm_per_s": round1(consume.publish_per_s),
            "db_batch_cancel_per_s": round1(update),
            "delay_path_per_s": round1(delay_path.per_s),
            "delay_path_drain_ms": delay_path.drain_ms,
            "delay_path_lateness_ms": {
                "burst": delay_path.burst.json(),
                "steady": delay_path.steady.json(),
            },
        },
        "fraction_of_ceiling": (fraction * 1000.0).round() / 1000.0,
        "fraction_of_delay_path": (result.burst_cancels_per_s / delay_path.per_s * 1000.0).round() / 1000.0,
        "limit": limit,
        "checkout_limit": checkout_limit,
        "steady_limit": steady_limit,
        "burst_drain_series": series,
        "service_peak_rss_mb": round1(stats.peak_rss_mb),
        "service_cpu_s": round1(stats.cpu_s),
        "checks": result.checks,
    });
    print_table(&report, &stats);
    Ok(report)
}

/// The steady load's lateness against the broker's own: how late the delay path
/// alone delivered the same timers (nothing else running) says how much of the
/// service's lateness is the broker's.
fn steady_verdict(service: &Lateness, broker: &Lateness) -> Value {
    const TARGET_P99_MS: i64 = 100;
    let verdict = if service.n == 0 {
        "no steady load in this run".to_string()
    } else if service.p99 <= TARGET_P99_MS {
        format!(
            "p99 {} ms, within the {TARGET_P99_MS} ms target",
            service.p99
        )
    } else if broker.p99 * 2 >= service.p99 {
        format!(
            "p99 {} ms against the {TARGET_P99_MS} ms target; the broker's delay path alone \
             delivered the same timers late by p99 {} ms, so most of it is the TTL levels'",
            service.p99, broker.p99
        )
    } else {
        format!(
            "p99 {} ms against the {TARGET_P99_MS} ms target; the broker's delay path alone \
             delivered the same timers late by p99 {} ms, so most of it ({} ms) is the \
             service's own: the consumer's batch and its transaction",
            service.p99,
            broker.p99,
            service.p99 - broker.p99
        )
    };
    json!({
        "target_p99_ms": TARGET_P99_MS,
        "service_p99_ms": service.p99,
        "delay_path_p99_ms": broker.p99,
        "verdict": verdict,
    })
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// Places `jobs` with `clients` requests in flight; returns the order ids in job
/// order, and when each request was sent (epoch ms). `window_ms` fixes every window (calibration); otherwise each job's
/// planned deadline sets its window.
async fn place(
    ctx: &RunCtx,
    base: &str,
    jobs: &[Job],
    clients: usize,
    window_ms: Option<i64>,
    label: &str,
) -> anyhow::Result<(Vec<i64>, Vec<i64>)> {
    let jobs: Arc<Vec<Job>> = Arc::new(jobs.to_vec());
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicBool::new(false));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..clients.max(1) {
        let (jobs, next, done, failed) = (jobs.clone(), next.clone(), done.clone(), failed.clone());
        let http = ctx.http.clone();
        let url = format!("{base}/orders");
        workers.spawn(async move {
            let mut placed = Vec::new();
            while !failed.load(Ordering::Relaxed) {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(i) else { break };
                let window = window_ms.unwrap_or(job.deadline_ms - Millis::now().0);
                if window < 1_000 {
                    failed.store(true, Ordering::Relaxed);
                    anyhow::bail!(
                        "order {i} would be due in {window} ms: checkout is slower than planned"
                    );
                }
                let body = json!({
                    "items": [{ "sku": sku_name(job.sku), "quantity": job.quantity }],
                    "payment_window": format!("{window}ms"),
                });
                let sent_ms = Millis::now().0;
                let result = async {
                    let resp = http.post(&url).json(&body).send().await?;
                    let status = resp.status();
                    let doc: Value = resp.json().await?;
                    if status != reqwest::StatusCode::CREATED {
                        anyhow::bail!("POST /orders answered {status}: {doc}");
                    }
                    doc["id"]
                        .as_str()
                        .and_then(|s| s.parse::<i64>().ok())
                        .with_context(|| format!("POST /orders: no string id in {doc}"))
                }
                .await;
                match result {
                    Ok(id) => placed.push((i, id, sent_ms)),
                    Err(e) => {
                        failed.store(true, Ordering::Relaxed);
                        return Err(e);
                    }
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok(placed)
        });
    }
    let progress = {
        let (done, n, label) = (done.clone(), jobs.len(), label.to_string());
        tokio::spawn(async move {
            let start = Instant::now();
            loop {
                tokio::time::sleep(Duration::from_secs(2)).await;
                let d = done.load(Ordering::Relaxed);
                println!(
                    "{label}: {d}/{n} placed ({:.0}/s)",
                    d as f64 / start.elapsed().as_secs_f64()
                );
            }
        })
    };
    let mut ids = vec![0_i64; jobs.len()];
    let mut sent = vec![0_i64; jobs.len()];
    let mut first_error = None;
    while let Some(joined) = workers.join_next().await {
        match joined {
            Ok(Ok(placed)) => {
                for (i, id, sent_ms) in placed {
                    ids[i] = id;
                    sent[i] = sent_ms;
                }
            }
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(e) => {
                first_error.get_or_insert(anyhow::anyhow!("a client task failed: {e}"));
            }
        }
    }
    progress.abort();
    if let Some(e) = first_error {
        return Err(e.context(format!("{label} failed")));
    }
    Ok((ids, sent))
}

/// Pays the orders planned as paid, before their deadlines.
async fn pay(
    ctx: &RunCtx,
    base: &str,
    jobs: &[Job],
    ids: &[i64],
    clients: usize,
) -> anyhow::Result<()> {
    let targets: Arc<Vec<(i64, i64)>> = Arc::new(
        jobs.iter()
            .zip(ids)
            .filter(|(j, _)| j.paid)
            .map(|(j, id)| (*id, j.deadline_ms))
            .collect(),
    );
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..clients.max(1) {
        let (targets, next, http, base) = (
            targets.clone(),
            next.clone(),
            ctx.http.clone(),
            base.to_string(),
        );
        workers.spawn(async move {
            while let Some((id, deadline)) =
                targets.get(next.fetch_add(1, Ordering::Relaxed)).copied()
            {
                if deadline - Millis::now().0 < 500 {
                    anyhow::bail!(
                        "order {id} would be paid within 500 ms of its deadline: too slow to plan"
                    );
                }
                let resp = http.post(format!("{base}/orders/{id}/pay")).send().await?;
                if resp.status() != reqwest::StatusCode::OK {
                    let status = resp.status();
                    let text = resp.text().await.unwrap_or_default();
                    anyhow::bail!("POST /orders/{id}/pay answered {status}: {text}");
                }
            }
            Ok(())
        });
    }
    while let Some(joined) = workers.join_next().await {
        joined.context("a payment task failed")??;
    }
    println!("paid: {} orders before their deadlines", targets.len());
    Ok(())
}

async fn query(db: &DatabaseConnection, sql: &str) -> anyhow::Result<Vec<QueryResult>> {
    db.query_all_raw(Statement::from_string(
        db.get_database_backend(),
        sql.to_string(),
    ))
    .await
    .with_context(|| format!("query failed: {sql}"))
}

async fn count(db: &DatabaseConnection, sql: &str) -> anyhow::Result<i64> {
    let rows = query(db, sql).await?;
    let row = rows.first().with_context(|| format!("no row from {sql}"))?;
    Ok(row.try_get_by_index::<i64>(0)?)
}

/// Waits until no order is `pending_payment` and the last deadline has passed.
/// Waits until no order is pending, sampling the drain every
/// [`profile::SAMPLE_EVERY`] and printing progress every second.
async fn wait_drained(
    ctx: &RunCtx,
    res: &mut Resources,
    last_due: i64,
    limit: Duration,
) -> anyhow::Result<Vec<profile::Sample>> {
    let depths =
        profile::Depths::new(ctx.broker("depths").await?, &ctx.prefix, ctx.mode == "ttl").await?;
    let mut samples = Vec::new();
    let mut printed = Instant::now() - Duration::from_secs(1);
    loop {
        let service = res.service.as_mut().context("service")?;
        service.check_alive()?;
        let (pid, ticks) = (service.pid(), service.ticks());
        // Queue depths and database counts as close together as they can be.
        let (levels, ingest, work) = depths.read().await?;
        let now = Millis::now().0;
        let pending = count(
            &ctx.db,
            "SELECT COUNT(*) FROM orders WHERE status = 'pending_payment'",
        )
        .await?;
        let cancelled = count(
            &ctx.db,
            "SELECT COUNT(*) FROM orders WHERE status = 'cancelled'",
        )
        .await?;
        let overdue = count(
            &ctx.db,
            &format!("SELECT COUNT(*) FROM orders WHERE status = 'pending_payment' AND pay_deadline_ms <= {now}"),
        )
        .await?;
        samples.push(profile::Sample {
            at_ms: now,
            cpu: profile::Cpu::read(pid, ticks),
            cancelled,
            overdue,
            levels,
            ingest,
            work,
        });
        if pending == 0 && now > last_due {
            println!("drained: {cancelled} cancelled, none pending");
            return Ok(samples);
        }
        let since_last = now - last_due;
        if since_last > limit.as_millis() as i64 {
            bail!(
                "{pending} orders still pending_payment {:.0}s after the last deadline \
                 ({overdue} of them overdue): the message path lost or stalled them",
                since_last as f64 / 1000.0
            );
        }
        let when = if since_last < 0 {
            format!("last due in {:.1}s", -since_last as f64 / 1000.0)
        } else {
            format!("last deadline {:.1}s ago", since_last as f64 / 1000.0)
        };
        if printed.elapsed() >= Duration::from_secs(1) {
            println!(
                "waiting: {cancelled} cancelled, {pending} pending ({overdue} overdue; \
                 levels {levels}, work {work}), {when}"
            );
            printed = Instant::now();
        }
        tokio::time::sleep(profile::SAMPLE_EVERY).await;
    }
}

/// Lateness percentiles of one load, in milliseconds.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Lateness {
    /// Orders measured.
    n: usize,
    p50: i64,
    p90: i64,
    pub(crate) p99: i64,
    max: i64,
}

impl Lateness {
    pub(crate) fn of(mut values: Vec<i64>) -> Self {
        values.sort_unstable();
        let n = values.len();
        if n == 0 {
            return Self::default();
        }
        // Nearest rank: the smallest value with at least p% of values at or below it.
        let rank = |p: f64| values[((p * n as f64).ceil() as usize).clamp(1, n) - 1];
        Self {
            n,
            p50: rank(0.50),
            p90: rank(0.90),
            p99: rank(0.99),
            max: values[n - 1],
        }
    }
    pub(crate) fn json(&self) -> Value {
        json!({ "n": self.n, "p50": self.p50, "p90": self.p90, "p99": self.p99, "max": self.max })
    }
}

/// What the database says about a run.
struct Analysis {
    /// Every problem found; a run with any is refused.
    errors: Vec<String>,
    /// What was checked, for the JSON.
    checks: Value,
    burst: Lateness,
    steady: Lateness,
    /// Burst cancels over the span from its first to its last cancel.
    burst_cancels_per_s: f64,
    /// What the burst asked for: its unpaid orders over 2 s.
    burst_offered_per_s: f64,
    /// From the last burst deadline to the last burst cancel.
    burst_drain_ms: i64,
    /// First and last burst cancel (epoch ms) and how many.
    burst_window: (i64, i64, usize),
}

async fn analyse(ctx: &RunCtx, all: &HashMap<i64, Job>, skus: usize) -> anyhow::Result<Analysis> {
    let mut errors = Vec::new();
    let rows = query(
        &ctx.db,
        "SELECT id, status, pay_deadline_ms, cancelled_at_ms FROM orders",
    )
    .await?;
    if rows.len() != all.len() {
        errors.push(format!(
            "the database holds {} orders, the bench placed {}",
            rows.len(),
            all.len()
        ));
    }
    let mut late: HashMap<Group, Vec<i64>> = HashMap::new();
    let mut burst_cancels = Vec::new();
    let (mut early, mut paid_cancelled, mut unpaid_open, mut unknown) = (0, 0, 0, 0);
    let mut sold_expected = vec![0_i64; skus];
    let mut cancelled_total = 0;
    for row in &rows {
        let id: i64 = row.try_get("", "id")?;
        let status: String = row.try_get("", "status")?;
        let deadline: i64 = row.try_get("", "pay_deadline_ms")?;
        let cancelled_at: Option<i64> = row.try_get("", "cancelled_at_ms")?;
        let Some(job) = all.get(&id) else {
            unknown += 1;
            continue;
        };
        if job.paid {
            if status != "paid" {
                paid_cancelled += 1;
                if paid_cancelled <= 5 {
                    errors.push(format!("paid order {id} is {status}"));
                }
            }
            sold_expected[job.sku] += job.quantity;
            continue;
        }
        match (status.as_str(), cancelled_at) {
            ("cancelled", Some(at)) => {
                cancelled_total += 1;
                if at < deadline {
                    early += 1;
                    if early <= 5 {
                        errors.push(format!(
                            "order {id} cancelled {} ms before its deadline",
                            deadline - at
                        ));
                    }
                }
                late.entry(job.group).or_default().push(at - deadline);
                if job.group == Group::Burst {
                    burst_cancels.push((at, deadline));
                }
            }
            _ => {
                unpaid_open += 1;
                if unpaid_open <= 5 {
                    errors.push(format!("unpaid order {id} is {status}, not cancelled"));
                }
            }
        }
    }
    for (what, n) in [
        ("orders the bench did not place", unknown),
        ("paid orders not left paid", paid_cancelled),
        ("orders cancelled before their deadline", early),
        ("unpaid orders not cancelled", unpaid_open),
    ] {
        if n > 0 {
            errors.push(format!("{n} {what}"));
        }
    }
    // Stock: available + reserved + sold == stocked; nothing left reserved; sold == paid.
    let stock = query(
        &ctx.db,
        "SELECT sku, available, reserved, sold FROM inventory",
    )
    .await?;
    let mut stock_ok = stock.len() == skus;
    if !stock_ok {
        errors.push(format!("{} SKUs in inventory, {skus} stocked", stock.len()));
    }
    for row in &stock {
        let sku: String = row.try_get("", "sku")?;
        let available: i64 = row.try_get("", "available")?;
        let reserved: i64 = row.try_get("", "reserved")?;
        let sold: i64 = row.try_get("", "sold")?;
        let index = sku
            .strip_prefix("BENCH-")
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|i| *i < skus);
        let expected_sold = index.map(|i| sold_expected[i]);
        if available + reserved + sold != STOCK || reserved != 0 || Some(sold) != expected_sold {
            stock_ok = false;
            errors.push(format!(
                "stock of {sku} not conserved: available {available} + reserved {reserved} + sold {sold} \
                 (stocked {STOCK}, paid {expected_sold:?})"
            ));
        }
    }
    // The audit trail: one cancel per cancelled order, all by timeout messages.
    let events = count(
        &ctx.db,
        "SELECT COUNT(*) FROM order_events WHERE event = 'cancelled'",
    )
    .await?;
    let not_message = count(
        &ctx.db,
        "SELECT COUNT(*) FROM order_events WHERE event = 'cancelled' AND cause <> 'timeout'",
    )
    .await?;
    if events != cancelled_total {
        errors.push(format!(
            "{events} cancel events in the audit trail for {cancelled_total} cancelled orders"
        ));
    }
    if not_message > 0 {
        errors.push(format!(
            "{not_message} cancels not made by a timeout message"
        ));
    }
    let burst_offered_per_s = burst_cancels.len() as f64 / (BURST_SPAN_MS as f64 / 1000.0);
    let (first, last) = burst_cancels
        .iter()
        .fold((i64::MAX, i64::MIN), |(lo, hi), (at, _)| {
            (lo.min(*at), hi.max(*at))
        });
    let last_deadline = burst_cancels.iter().map(|(_, d)| *d).max().unwrap_or(0);
    let span_ms = (last - first).max(1);
    let burst_cancels_per_s = if burst_cancels.is_empty() {
        0.0
    } else {
        burst_cancels.len() as f64 * 1000.0 / span_ms as f64
    };
    let checks = json!({
        "orders_in_db": rows.len(),
        "cancelled": cancelled_total,
        "paid_left_paid": paid_cancelled == 0,
        "none_early": early == 0,
        "all_unpaid_cancelled": unpaid_open == 0,
        "stock_conserved": stock_ok,
        "cancels_by_message_path": not_message == 0 && events == cancelled_total,
    });
    Ok(Analysis {
        errors,
        checks,
        burst: Lateness::of(late.remove(&Group::Burst).unwrap_or_default()),
        steady: Lateness::of(late.remove(&Group::Steady).unwrap_or_default()),
        burst_cancels_per_s,
        burst_offered_per_s,
        burst_drain_ms: if burst_cancels.is_empty() {
            0
        } else {
            last - last_deadline
        },
        burst_window: (first, last, burst_cancels.len()),
    })
}

fn print_table(r: &Value, stats: &ProcStats) {
    let lat = |load: &str| {
        let l = &r["lateness_ms"][load];
        format!(
            "p50 {} / p90 {} / p99 {} / max {} ms (n={})",
            l["p50"], l["p90"], l["p99"], l["max"], l["n"]
        )
    };
    println!();
    println!("{:<34} value", "figure");
    println!("{}", "-".repeat(78));
    for (name, value) in [
        (
            "mode / db",
            format!(
                "{} / {}",
                r["mode"].as_str().unwrap_or(""),
                r["db"].as_str().unwrap_or("")
            ),
        ),
        ("orders placed", r["orders"].to_string()),
        (
            "checkout (HTTP, all clients)",
            format!("{}/s", r["checkout_per_s"]),
        ),
        (
            "burst cancels",
            format!(
                "{}/s (offered {}/s)",
                r["burst_cancels_per_s"], r["burst_offered_per_s"]
            ),
        ),
        (
            "burst drained after last deadline",
            format!("{} ms", r["burst_drain_ms"]),
        ),
        ("lateness, burst", lat("burst")),
        ("lateness, steady", lat("steady")),
        (
            "ceiling: consume+ack",
            format!("{}/s", r["ceiling"]["consume_ack_per_s"]),
        ),
        (
            "ceiling: publish+confirm",
            format!("{}/s", r["ceiling"]["publish_confirm_per_s"]),
        ),
        (
            "ceiling: batched UPDATE",
            format!("{}/s", r["ceiling"]["db_batch_cancel_per_s"]),
        ),
        (
            "ceiling: delay path (broker only)",
            format!(
                "{}/s, drained {} ms after the last due",
                r["ceiling"]["delay_path_per_s"], r["ceiling"]["delay_path_drain_ms"]
            ),
        ),
        (
            "delay path alone, arrived late by",
            format!(
                "burst p99 {} ms, steady p99 {} ms",
                r["ceiling"]["delay_path_lateness_ms"]["burst"]["p99"],
                r["ceiling"]["delay_path_lateness_ms"]["steady"]["p99"]
            ),
        ),
        (
            "burst / lower ceiling",
            format!("{}", r["fraction_of_ceiling"]),
        ),
        (
            "burst / delay path",
            format!("{}", r["fraction_of_delay_path"]),
        ),
        ("service peak RSS", format!("{:.1} MiB", stats.peak_rss_mb)),
        ("service CPU time", format!("{:.1} s", stats.cpu_s)),
    ] {
        println!("{name:<34} {value}");
    }
    if r["burst_cancels_per_s"].as_f64().unwrap_or(0.0)
        >= 0.9 * r["burst_offered_per_s"].as_f64().unwrap_or(f64::MAX)
    {
        println!(
            "note: the service kept up with the burst; its rate is the offered rate, raise --burst to find its limit"
        );
    }
    if let Some(verdict) = r["steady_limit"]["verdict"].as_str() {
        println!("steady: {verdict}");
    }
    if let Some(verdict) = r["checkout_limit"]["verdict"].as_str() {
        println!("checkout: {verdict}");
    }
    if let Some(verdict) = r["limit"]["verdict"].as_str() {
        println!("limit: {verdict}");
    }
    println!();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let l = Lateness::of((1..=100).rev().collect());
        assert_eq!((l.n, l.p50, l.p90, l.p99, l.max), (100, 50, 90, 99, 100));
        let one = Lateness::of(vec![7]);
        assert_eq!((one.p50, one.p99, one.max), (7, 7, 7));
        assert_eq!(Lateness::of(vec![]).n, 0);
    }
}
