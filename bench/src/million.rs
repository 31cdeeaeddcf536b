//! `bench --million`: a million pending timers (or `--million-orders N`), in
//! any delay mode.
//!
//! Checkout over HTTP runs at a few thousand orders a second on a small machine,
//! so a million would take most of an hour; instead the orders and their outbox
//! rows are written by one SQL statement each (one transaction), exactly as a
//! million checkouts would have left them, and the service's own outbox relay
//! publishes them straight into the delay stage (the TTL levels, or the plugin's
//! exchange, or the native stage's wait queue). Windows are one to two days, so
//! nothing falls due during the run.
//!
//! Reported: the time from the commit to the last timer waiting in the stage,
//! the service's RSS sampled every second (is it flat?), the broker's memory and
//! disk (`/api/nodes`), the queues' memory (`/api/queues`), and the broker's
//! memory per pending timer (the plugin keeps its timers in a table of the
//! node, not in a queue, so only the node's memory shows them). In native mode
//! also the wait queue's own: its process's memory (the queue keeps the index
//! of held timers in memory) per held timer, and the scheduling rate, from the
//! commit until the queue holds every timer (`messages_delayed`). The vhost
//! (and with it the timers) is deleted afterwards.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use sea_orm::{ConnectionTrait, DbBackend, TransactionTrait};
use serde_json::{Value, json};

use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;

use crate::cli::BenchArgs;
use crate::ctx::RunCtx;
use crate::env::{ProcStats, Resources, proc_stats};
use crate::profile::{Cpu, Role};
use crate::report::round1;
use crate::sql::count;
use order_timeout::amqp::topology::{LEVELS, Names};
use order_timeout::domain::{Millis, TimeoutKind};

const DAY_MS: i64 = 86_400_000;

/// What the broker says about itself and the run's queues.
#[derive(Debug, Clone, Copy, Default)]
struct BrokerState {
    /// Node memory in use, MiB.
    mem_mb: f64,
    /// Free disk, MiB.
    disk_free_mb: f64,
    /// Timers waiting in the delay stage (TTL levels, or the plugin's exchange).
    in_levels: u64,
    /// Messages in every other queue of the vhost (ingest, work, parked).
    elsewhere: u64,
    /// Memory of the vhost's queues, MiB.
    queue_mem_mb: f64,
    /// Bytes of persistent message bodies in the vhost's queues, MiB.
    persistent_mb: f64,
    /// The native stage's wait queue (native mode only).
    wait: Option<WaitQueue>,
}

/// The native stage's wait queue, as the management API reports it (its
/// figures are refreshed every stats interval, 5 s by default).
#[derive(Debug, Clone, Copy, Default)]
struct WaitQueue {
    /// Timers the queue holds until their time (`messages_delayed`).
    held: u64,
    /// The queue process's memory, bytes.
    memory: f64,
}

impl WaitQueue {
    /// Reads `<prefix>.wait` of the run's vhost: the queue, and every timer
    /// in it (held, or ready or with the deferrer on their way to be held).
    async fn read(ctx: &RunCtx, names: &Names) -> anyhow::Result<(Self, u64)> {
        let q = ctx
            .management
            .get(&format!("/queues/{}/{}", ctx.vhost, names.wait()))
            .await?;
        let n = |key: &str| q[key].as_u64().unwrap_or(0);
        let wait = Self {
            held: n("messages_delayed"),
            memory: q["memory"].as_f64().unwrap_or(0.0),
        };
        let in_stage = wait.held + n("messages_ready") + n("messages_unacknowledged");
        Ok((wait, in_stage))
    }
}

/// Exact message counts by passive declare (the management API's are up to 5 s
/// old): timers in the delay stage, and messages anywhere else. The plugin's
/// timers are in no queue: the plugin reports them per exchange. Those the
/// native wait queue holds are not counted by a passive declare either: the
/// management API says how many (`messages_delayed`), with the queue itself.
async fn counts(
    ctx: &RunCtx,
    channel: &lapin::Channel,
    names: &Names,
) -> anyhow::Result<(u64, u64, Option<WaitQueue>)> {
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let mut levels = 0;
    let mut wait = None;
    if ctx.mode == "native" {
        let (queue, in_stage) = WaitQueue::read(ctx, names).await?;
        levels = in_stage;
        wait = Some(queue);
    } else if ctx.mode == "plugin" {
        let exchange = ctx
            .management
            .get(&format!("/exchanges/{}/{}", ctx.vhost, names.delay()))
            .await?;
        levels = exchange["messages_delayed"]
            .as_u64()
            .context("the plugin reports no messages_delayed")?;
    } else {
        for l in 0..LEVELS {
            let q = channel
                .queue_declare(
                    names.level(l).as_str().into(),
                    passive,
                    FieldTable::default(),
                )
                .await?;
            levels += u64::from(q.message_count());
        }
    }
    let mut others = vec![names.ingest(), names.parked()];
    others.extend(TimeoutKind::ALL.iter().map(|k| names.work(*k)));
    let mut elsewhere = 0;
    for name in others {
        let q = channel
            .queue_declare(name.as_str().into(), passive, FieldTable::default())
            .await?;
        elsewhere += u64::from(q.message_count());
    }
    Ok((levels, elsewhere, wait))
}

async fn broker_state(ctx: &RunCtx, channel: &lapin::Channel) -> anyhow::Result<BrokerState> {
    let nodes = ctx.management.get("/nodes").await?;
    let node = nodes
        .as_array()
        .and_then(|n| n.first())
        .context("/api/nodes is empty")?;
    let mb = |v: &Value| v.as_f64().unwrap_or(0.0) / 1_048_576.0;
    let queues = ctx
        .management
        .get(&format!(
            "/queues/{}?columns=name,messages,memory,message_bytes_persistent",
            ctx.vhost
        ))
        .await?;
    let mut state = BrokerState {
        mem_mb: mb(&node["mem_used"]),
        disk_free_mb: mb(&node["disk_free"]),
        ..Default::default()
    };
    (state.in_levels, state.elsewhere, state.wait) =
        counts(ctx, channel, &Names::new(&ctx.prefix)).await?;
    for q in queues.as_array().into_iter().flatten() {
        state.queue_mem_mb += mb(&q["memory"]);
        state.persistent_mb += mb(&q["message_bytes_persistent"]);
    }
    Ok(state)
}

fn broker_json(s: &BrokerState) -> Value {
    json!({
        "mem_used_mb": round1(s.mem_mb),
        "disk_free_mb": round1(s.disk_free_mb),
        "timers_in_stage": s.in_levels,
        "queue_memory_mb": round1(s.queue_mem_mb),
        "message_bytes_persistent_mb": round1(s.persistent_mb),
        "wait_queue": s.wait.map(|w| json!({
            "timers_held": w.held,
            "memory_mb": round1(w.memory / 1_048_576.0),
        })),
    })
}

/// Native mode's own figures: how fast the wait queue came to hold every
/// timer, and what each costs the queue and the node.
fn native_json(m: usize, s: &Schedule, node_per_timer: f64) -> Option<Value> {
    let (before, after) = (s.before.wait?, s.after.wait?);
    let bytes = |b: f64| b.round();
    Some(json!({
        "held_s": round1(s.schedule_s),
        "timers_deferred_per_s": round1(m as f64 / s.schedule_s),
        "wait_queue_memory_mb": {
            "before": round1(before.memory / 1_048_576.0),
            "peak": round1(s.peak_wait_memory / 1_048_576.0),
            "after": round1(after.memory / 1_048_576.0),
        },
        "wait_queue_memory_per_timer_bytes": bytes((after.memory - before.memory) / m as f64),
        "node_memory_per_timer_bytes": bytes(node_per_timer),
        "note": "held_s is from the commit until the wait queue's messages_delayed reached the count; the management API refreshes it every stats interval (5 s by default), so held_s is late by up to that",
    }))
}

/// Runs the scenario; the service is running on a fresh database.
pub async fn run(ctx: &RunCtx, res: &mut Resources, args: &BenchArgs) -> anyhow::Result<Value> {
    let m = args.million_orders.max(1);
    let service = res.service.as_ref().context("service")?;
    let (pid, ticks) = (service.pid(), service.ticks());
    let samples = sample_rss(pid, ticks);
    let result = schedule(ctx, res, m).await;
    let idle = match &result {
        Ok(_) if args.idle_secs > 0 => Some(idle(pid, ctx.broker_pid, ticks, args.idle_secs).await),
        _ => None,
    };
    samples.sampler.abort();
    let done = result?;
    let (schedule_s, insert_s) = (done.schedule_s, done.insert_s);
    let stats = res.service.as_ref().context("service")?.stats()?;
    let samples = samples.taken.lock().map(|v| v.clone()).unwrap_or_default();
    let figures = Figures::new(
        m,
        &samples,
        schedule_s,
        insert_s,
        done.before,
        done.after,
        stats,
    );
    let native = native_json(m, &done, figures.per_timer_bytes);
    let report = json!({
        "mode": ctx.mode,
        "mode_why": ctx.mode_why,
        "broker": ctx.broker,
        "db": ctx.db_kind,
        "scenario": "million",
        "orders": m,
        "scheduled_through": "orders and outbox rows written by SQL in one transaction; the service's relay published them straight into the delay stage",
        "insert_s": round1(insert_s),
        "published_s": round1(done.published_s),
        "schedule_s": round1(schedule_s),
        "schedule_per_s": round1(m as f64 / schedule_s),
        "service_rss_mb": { "first": round1(figures.first), "max": round1(figures.max), "last": round1(figures.last), "series": series(&samples) },
        "service_peak_rss_mb": round1(stats.peak_rss_mb),
        "service_cpu_s": round1(stats.cpu_s),
        "broker_before": broker_json(&done.before),
        "broker_after": broker_json(&done.after),
        "broker_memory_per_timer_bytes": figures.per_timer_bytes.round(),
        "native": native,
        "idle": idle.as_ref().map(Idle::json),
    });
    figures.print_table();
    if let Some(native) = &report["native"].as_object() {
        println!(
            "{:<34} {} timers/s held ({} s from the commit); wait queue {} bytes per timer (peak {} MiB), node {} bytes per timer",
            "native stage",
            native["timers_deferred_per_s"],
            native["held_s"],
            native["wait_queue_memory_per_timer_bytes"],
            native["wait_queue_memory_mb"]["peak"],
            native["node_memory_per_timer_bytes"]
        );
    }
    if let Some(idle) = &idle {
        idle.print(m);
    }
    Ok(report)
}

/// The idle cost: with every timer pending and none due, the share of one
/// core each part used over the measured seconds.
struct Idle {
    secs: f64,
    service: f64,
    broker: f64,
    database: f64,
}

/// Measures the idle cost over `secs` seconds: CPU time of the service, the
/// broker and the database (all their processes) read from `/proc` before
/// and after, over the elapsed time.
async fn idle(pid: u32, broker: Option<u32>, ticks: f64, secs: u64) -> Idle {
    println!("million: measuring the idle cost for {secs} s (every timer pending, none due)");
    let before = Cpu::read(Some(pid), broker, ticks);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let after = Cpu::read(Some(pid), broker, ticks);
    let elapsed = started.elapsed().as_secs_f64();
    let share = |role| (after.seconds(role) - before.seconds(role)) / elapsed;
    Idle {
        secs: elapsed,
        service: share(Role::Service),
        broker: share(Role::Broker),
        database: share(Role::Database),
    }
}

impl Idle {
    fn json(&self) -> Value {
        let pct = |f: f64| (f * 10_000.0).round() / 100.0;
        json!({
            "secs": round1(self.secs),
            "service_core_pct": pct(self.service),
            "broker_core_pct": pct(self.broker),
            "database_core_pct": pct(self.database),
        })
    }

    fn print(&self, m: usize) {
        println!(
            "{:<34} service {:.2} %, broker {:.2} %, database {:.2} % of a core over {:.0} s, {m} pending",
            "idle cost",
            self.service * 100.0,
            self.broker * 100.0,
            self.database * 100.0,
            self.secs
        );
    }
}

/// The service's resident set, sampled every second by a task of its own.
struct RssSamples {
    /// The sampling task, aborted when the scenario is over.
    sampler: tokio::task::JoinHandle<()>,
    /// (seconds since the start, the service's memory) per sample.
    taken: Arc<Mutex<Vec<(f64, ProcStats)>>>,
}

/// Starts sampling the memory of process `pid` every second.
fn sample_rss(pid: u32, ticks: f64) -> RssSamples {
    let taken: Arc<Mutex<Vec<(f64, ProcStats)>>> = Arc::default();
    let sampler = {
        let samples = taken.clone();
        tokio::spawn(async move {
            let start = Instant::now();
            loop {
                if let Ok(s) = proc_stats(pid, ticks)
                    && let Ok(mut v) = samples.lock()
                {
                    v.push((start.elapsed().as_secs_f64(), s));
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };
    RssSamples { sampler, taken }
}

/// The service's memory over the run, at most 60 points for the JSON.
fn series(samples: &[(f64, ProcStats)]) -> Vec<Value> {
    // Keep the series short in the JSON: at most 60 points.
    let step = (samples.len() / 60).max(1);
    samples
        .iter()
        .step_by(step)
        .map(|(t, s)| json!([round1(*t), round1(s.rss_mb)]))
        .collect()
}

/// What the table shows.
struct Figures {
    /// Timers scheduled.
    m: usize,
    /// Seconds from the commit to the last timer in the delay stage.
    schedule_s: f64,
    /// Seconds writing the rows.
    insert_s: f64,
    /// The service's RSS at the first sample, its largest, and at the last, MiB.
    first: f64,
    max: f64,
    last: f64,
    /// The service's peak memory and CPU time.
    stats: ProcStats,
    /// The broker before the rows were written, and once every timer was in the stage.
    before: BrokerState,
    after: BrokerState,
    /// The broker's memory growth per pending timer, bytes.
    per_timer_bytes: f64,
}

impl Figures {
    fn new(
        m: usize,
        samples: &[(f64, ProcStats)],
        schedule_s: f64,
        insert_s: f64,
        before: BrokerState,
        after: BrokerState,
        stats: ProcStats,
    ) -> Self {
        let rss: Vec<f64> = samples.iter().map(|(_, s)| s.rss_mb).collect();
        Self {
            m,
            schedule_s,
            insert_s,
            first: rss.first().copied().unwrap_or(0.0),
            max: rss.iter().copied().fold(0.0, f64::max),
            last: rss.last().copied().unwrap_or(0.0),
            stats,
            before,
            after,
            // The node's memory grew by this much for the timers it now keeps.
            per_timer_bytes: (after.mem_mb - before.mem_mb) * 1_048_576.0 / m as f64,
        }
    }

    fn print_table(&self) {
        let Self {
            m,
            schedule_s,
            insert_s,
            first,
            max,
            last,
            stats,
            before,
            after,
            per_timer_bytes,
        } = self;
        println!();
        println!("{:<34} value", "figure");
        println!("{}", "-".repeat(78));
        for (name, value) in [
            ("timers scheduled", m.to_string()),
            ("rows written (SQL)", format!("{insert_s:.1} s")),
            (
                "commit -> all in the delay stage",
                format!("{schedule_s:.1} s ({:.0}/s)", *m as f64 / schedule_s),
            ),
            (
                "service RSS first/max/last",
                format!("{first:.1} / {max:.1} / {last:.1} MiB"),
            ),
            (
                "service peak RSS (VmHWM)",
                format!("{:.1} MiB", stats.peak_rss_mb),
            ),
            ("service CPU time", format!("{:.1} s", stats.cpu_s)),
            (
                "broker memory before/after",
                format!("{:.0} / {:.0} MiB", before.mem_mb, after.mem_mb),
            ),
            (
                "broker disk free before/after",
                format!("{:.0} / {:.0} MiB", before.disk_free_mb, after.disk_free_mb),
            ),
            (
                "broker memory per pending timer",
                format!("{per_timer_bytes:.0} bytes"),
            ),
            ("queues' memory", format!("{:.1} MiB", after.queue_mem_mb)),
        ] {
            println!("{name:<34} {value}");
        }
        println!();
    }
}

/// What scheduling the timers took.
struct Schedule {
    /// Seconds writing the rows.
    insert_s: f64,
    /// Seconds from the commit until the outbox was empty (every timer
    /// published by the relay).
    published_s: f64,
    /// Seconds from the commit until every timer was in the delay stage (in
    /// native mode: held by the wait queue).
    schedule_s: f64,
    /// The broker before the rows were written, and once every timer was in the stage.
    before: BrokerState,
    after: BrokerState,
    /// The wait queue's largest memory seen meanwhile, bytes (native mode).
    peak_wait_memory: f64,
}

/// Writes the rows, waits for the service to put every timer in the delay stage.
async fn schedule(ctx: &RunCtx, res: &mut Resources, m: usize) -> anyhow::Result<Schedule> {
    let conn = ctx.broker("million").await?;
    let channel = conn.create_channel().await?;
    let result = schedule_on(ctx, res, m, &channel).await;
    let _ = conn.close(200, "done".into()).await;
    result
}

async fn schedule_on(
    ctx: &RunCtx,
    res: &mut Resources,
    m: usize,
    channel: &lapin::Channel,
) -> anyhow::Result<Schedule> {
    let mut before = broker_state(ctx, channel).await?;
    // The wait queue's memory is reported from the first stats interval after
    // its declaration (5 s by default): the baseline waits for it, so that the
    // empty queue's own memory is not counted against the timers.
    let reported = Instant::now();
    while before.wait.is_some_and(|w| w.memory == 0.0)
        && reported.elapsed() < Duration::from_secs(15)
    {
        tokio::time::sleep(Duration::from_millis(500)).await;
        before = broker_state(ctx, channel).await?;
    }
    let now = Millis::now().0;
    let series = match ctx.db.get_database_backend() {
        DbBackend::Postgres => format!("SELECT g AS x FROM generate_series(1, {m}) AS g"),
        _ => format!(
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {m}) SELECT x FROM c"
        ),
    };
    println!("million: writing {m} orders and their outbox rows");
    let started = Instant::now();
    let txn = ctx.db.begin().await?;
    // Deadlines spread over a day, one to two days ahead: many TTL levels in use.
    txn.execute_unprepared(&format!(
        "INSERT INTO orders (status, pay_deadline_ms, created_at_ms, version, updated_at_ms) \
         SELECT 'pending_payment', {now} + {DAY_MS} + (s.x % 86400) * 1000, {now}, 0, {now} FROM ({series}) AS s"
    ))
    .await?;
    txn.execute_unprepared(&format!(
        "INSERT INTO outbox (order_id, kind, due_at_ms, created_at_ms, attempts) \
         SELECT id, 'payment', pay_deadline_ms, {now}, 0 FROM orders"
    ))
    .await?;
    txn.commit().await?;
    let insert_s = started.elapsed().as_secs_f64();
    let committed = Instant::now();
    let limit = Duration::from_secs(120 + (m / 500) as u64);
    let mut last_print = Instant::now() - Duration::from_secs(10);
    let mut published_s = None;
    let mut peak_wait_memory: f64 = 0.0;
    loop {
        res.service.as_mut().context("service")?.check_alive()?;
        let outbox = count(&ctx.db, "SELECT COUNT(*) FROM outbox").await?;
        if outbox == 0 && published_s.is_none() {
            published_s = Some(committed.elapsed().as_secs_f64());
        }
        let state = broker_state(ctx, channel).await?;
        peak_wait_memory = peak_wait_memory.max(state.wait.map_or(0.0, |w| w.memory));
        // In native mode a timer is scheduled once the wait queue holds it.
        let staged = match state.wait {
            Some(wait) => wait.held >= m as u64,
            None => state.in_levels >= m as u64,
        };
        if outbox == 0 && staged && state.elsewhere == 0 {
            let schedule_s = committed.elapsed().as_secs_f64();
            println!("million: all {m} timers in the delay stage after {schedule_s:.1}s");
            // A little longer, to see whether memory settles.
            tokio::time::sleep(Duration::from_secs(5)).await;
            let after = broker_state(ctx, channel).await?;
            let cancelled = count(
                &ctx.db,
                "SELECT COUNT(*) FROM orders WHERE status <> 'pending_payment'",
            )
            .await?;
            if cancelled != 0 {
                bail!("{cancelled} orders changed status, though none was due");
            }
            if after.in_levels != m as u64 {
                bail!(
                    "{} timers in the delay stage, {m} scheduled",
                    after.in_levels
                );
            }
            if let Some(wait) = after.wait
                && wait.held != m as u64
            {
                bail!("the wait queue holds {} timers, {m} scheduled", wait.held);
            }
            return Ok(Schedule {
                insert_s,
                published_s: published_s.unwrap_or(schedule_s),
                schedule_s,
                before,
                after,
                peak_wait_memory: peak_wait_memory.max(after.wait.map_or(0.0, |w| w.memory)),
            });
        }
        if committed.elapsed() > limit {
            bail!(
                "after {}s: {outbox} outbox rows left, {} timers in the stage, {} elsewhere (want {m} in the stage)",
                limit.as_secs(),
                state.in_levels,
                state.elsewhere
            );
        }
        if last_print.elapsed() >= Duration::from_secs(2) {
            let held = state
                .wait
                .map(|w| format!(" ({} held by the wait queue)", w.held))
                .unwrap_or_default();
            println!(
                "million: outbox {outbox} left, {} in the stage{held}, {} elsewhere, broker {:.0} MiB",
                state.in_levels, state.elsewhere, state.mem_mb
            );
            last_print = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
