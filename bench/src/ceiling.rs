//! The machine's ceiling for the service's work, measured without the service:
//!
//! - the broker: publish N persistent messages of a contract message's size with
//!   confirms into a throwaway durable queue (classic, version 2, like the work
//!   queues), then consume and ack them as fast as one consumer can, with the
//!   service's prefetch, acking with `multiple` once per batch like our consumer;
//! - the database: N rows in a throwaway table of the run's database, cancelled by
//!   the service's kind of statement (`UPDATE … WHERE id IN (…) AND status =
//!   'pending_payment' AND deadline <= now RETURNING id`), one transaction per
//!   batch of `consumer.batch_size`, one after the other like one consumer;
//! - the delay path: the run's timers replayed, broker only, through a
//!   throwaway copy of the topology in the run's delay mode ([`delay_path`]);
//!   not in native mode, whose stage needs the service's deferrer
//!   ([`NATIVE_DELAY_PATH`]).
//!
//! None includes what the service adds (the audit rows, the stock release,
//! the TTL hops): the gap between the service and the lower ceiling is the cost
//! of the service's own work.

use std::time::Instant;

use anyhow::{Context as _, bail};
use futures_util::{FutureExt, StreamExt};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicQosOptions, ConfirmSelectOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection};
use sea_orm::{ConnectionTrait, DbBackend, Statement, TransactionTrait};
use tokio::task::JoinHandle;

use crate::analysis::Lateness;
use crate::ctx::RunCtx;
use order_timeout::amqp::topology::{self, Mode, Names, QueueType};
use order_timeout::amqp::wire::{self, TimeoutMessage};
use order_timeout::domain::{Millis, OrderId, TimeoutKind};

/// Publishes pipelined this many messages before waiting for their confirms.
const PUBLISH_WINDOW: usize = 1_000;

/// The machine's ceiling for a run's work, every part measured.
pub struct Ceiling {
    /// Publish and consume-and-ack of a plain durable queue.
    pub broker: BrokerCeiling,
    /// Rows per second cancelled by the batched conditional UPDATE.
    pub db_batch_cancel_per_s: f64,
    /// The run's timers replayed through a copy of the delay path (`None` in
    /// native mode: [`NATIVE_DELAY_PATH`]).
    pub delay_path: Option<DelayPath>,
}

/// Why native mode has no delay-path ceiling: its wait queue holds a timer
/// only when a deferrer settles it with a delivery time, so the broker alone
/// releases nothing at its time; the service's deferrer cannot be run without
/// the service, and a copy of it here would measure the copy.
pub const NATIVE_DELAY_PATH: &str = "not measured in native mode: the wait queue holds timers only as the service's deferrer tells it, so there is no broker-only path to replay";

/// Measures the ceiling with `n` messages and rows, then the delay path with the
/// run's `schedule`, one after the other on a quiet broker and database.
pub async fn measure(ctx: &RunCtx, n: usize, schedule: &[Scheduled]) -> anyhow::Result<Ceiling> {
    let broker = consume_ack(ctx, n).await?;
    let db_batch_cancel_per_s = db_batch_cancel(ctx, n).await?;
    let delay_path = if ctx.mode == "native" {
        println!("ceiling: delay path {NATIVE_DELAY_PATH}");
        None
    } else {
        Some(delay_path(ctx, schedule).await?)
    };
    Ok(Ceiling {
        broker,
        db_batch_cancel_per_s,
        delay_path,
    })
}

/// What the broker managed.
pub struct BrokerCeiling {
    /// Persistent publishes confirmed per second (one channel, pipelined).
    pub publish_per_s: f64,
    /// Deliveries consumed and acked per second (one consumer).
    pub consume_ack_per_s: f64,
}

/// Raw consume-and-ack rate of a plain durable queue in the run's vhost.
pub async fn consume_ack(ctx: &RunCtx, n: usize) -> anyhow::Result<BrokerCeiling> {
    println!("ceiling: broker, {n} persistent messages through a throwaway queue");
    let conn = ctx.broker("ceiling").await?;
    let queue = format!("{}.bench-ceiling", ctx.prefix);
    let result = consume_ack_on(&conn, &queue, n, ctx.prefetch, ctx.batch_size).await;
    if let Ok(channel) = conn.create_channel().await {
        let _ = channel
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    let _ = conn.close(200, "ceiling done".into()).await;
    result
}

/// Publishes `n` messages into `queue` (declared here), then consumes and acks
/// them; each half timed on its own.
async fn consume_ack_on(
    conn: &Connection,
    queue: &str,
    n: usize,
    prefetch: u16,
    batch_size: usize,
) -> anyhow::Result<BrokerCeiling> {
    let publish = conn.create_channel().await?;
    publish
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let mut args = FieldTable::default();
    // The same queue kind as the service's work queues.
    args.insert("x-queue-version".into(), AMQPValue::LongInt(2));
    publish
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            args,
        )
        .await?;
    let publish_per_s = publish_confirmed(&publish, queue, n).await?;
    let consume_ack_per_s = consume_acked(conn, queue, n, prefetch, batch_size).await?;
    println!("ceiling: publish+confirm {publish_per_s:.0}/s, consume+ack {consume_ack_per_s:.0}/s");
    Ok(BrokerCeiling {
        publish_per_s,
        consume_ack_per_s,
    })
}

/// Publishes `n` persistent contract messages to `queue`, [`PUBLISH_WINDOW`] at
/// a time before waiting for their confirms; returns publishes per second.
async fn publish_confirmed(publish: &Channel, queue: &str, n: usize) -> anyhow::Result<f64> {
    let now = Millis::now();
    let started = Instant::now();
    let mut sent = 0;
    while sent < n {
        let mut confirms = Vec::with_capacity(PUBLISH_WINDOW);
        for i in sent..(sent + PUBLISH_WINDOW).min(n) {
            // A contract message of the same size as the relay's.
            let message = TimeoutMessage {
                order_id: OrderId::new(1_000_000 + i as i64).into(),
                kind: TimeoutKind::Payment,
                due_at: Some(now),
            };
            let properties =
                wire::properties(&format!("{}:payment:{i}", 1_000_000 + i), now, 1, &[]);
            confirms.push(
                publish
                    .basic_publish(
                        "".into(),
                        queue.into(),
                        order_timeout::amqp::publish_options(),
                        &wire::encode(&message),
                        properties,
                    )
                    .await?,
            );
        }
        sent += confirms.len();
        for confirm in confirms {
            if !confirm.await?.is_ack() {
                bail!("the broker nacked a ceiling publish");
            }
        }
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// Consumes and acks `n` messages from `queue` on a channel of its own, a batch
/// at a time like the service's consumer; returns deliveries per second.
async fn consume_acked(
    conn: &Connection,
    queue: &str,
    n: usize,
    prefetch: u16,
    batch_size: usize,
) -> anyhow::Result<f64> {
    let consume = conn.create_channel().await?;
    consume
        .basic_qos(prefetch, BasicQosOptions::default())
        .await?;
    let mut deliveries = consume
        .basic_consume(
            queue.into(),
            "bench-ceiling".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let started = Instant::now();
    let mut acked = 0;
    while acked < n {
        // Gather like the consumer: wait for one, take what is ready, up to a batch.
        let first = match deliveries.next().await {
            Some(d) => d?,
            None => bail!("the ceiling consumer ended after {acked} deliveries"),
        };
        acked += ack_batch(&mut deliveries, first, batch_size).await?.len();
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// Takes `first` and the deliveries already waiting behind it, up to `max` in
/// all, acks them with one `multiple` ack, and returns their bodies.
async fn ack_batch(
    deliveries: &mut lapin::Consumer,
    first: lapin::message::Delivery,
    max: usize,
) -> anyhow::Result<Vec<Vec<u8>>> {
    let mut last = first;
    let mut bodies = Vec::new();
    while bodies.len() + 1 < max {
        match deliveries.next().now_or_never() {
            Some(Some(d)) => bodies.push(std::mem::replace(&mut last, d?).data),
            Some(None) => bail!("the bench's consumer ended"),
            None => break,
        }
    }
    last.acker.ack(BasicAckOptions { multiple: true }).await?;
    bodies.push(last.data);
    Ok(bodies)
}

/// Raw batched conditional-UPDATE rate on the run's database, rows per second.
pub async fn db_batch_cancel(ctx: &RunCtx, n: usize) -> anyhow::Result<f64> {
    println!(
        "ceiling: database, {n} rows cancelled in batches of {}",
        ctx.batch_size
    );
    let db = &ctx.db;
    let backend = db.get_database_backend();
    let table = "bench_ceiling";
    db.execute_unprepared(&format!(
        "CREATE TABLE {table} (id BIGINT PRIMARY KEY, status VARCHAR(24) NOT NULL, \
         pay_deadline_ms BIGINT NOT NULL, cancelled_at_ms BIGINT, version INTEGER NOT NULL DEFAULT 0)"
    ))
    .await?;
    // The same index the orders table has for this filter.
    db.execute_unprepared(&format!(
        "CREATE INDEX idx_{table}_status_deadline ON {table} (status, pay_deadline_ms)"
    ))
    .await?;
    let due = Millis::now().0 - 1_000;
    let fill = match backend {
        DbBackend::Postgres => format!(
            "INSERT INTO {table} (id, status, pay_deadline_ms) \
             SELECT g, 'pending_payment', {due} FROM generate_series(1, {n}) AS g"
        ),
        _ => format!(
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {n}) \
             INSERT INTO {table} (id, status, pay_deadline_ms) SELECT x, 'pending_payment', {due} FROM c"
        ),
    };
    db.execute_unprepared(&fill).await?;
    if backend == DbBackend::Postgres {
        db.execute_unprepared(&format!("ANALYZE {table}")).await?;
    }
    let started = Instant::now();
    let mut changed = 0;
    let ids: Vec<usize> = (1..=n).collect();
    for chunk in ids.chunks(ctx.batch_size.max(1)) {
        let now = Millis::now().0;
        let list = chunk
            .iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let sql = format!(
            "UPDATE {table} SET status = 'cancelled', cancelled_at_ms = {now}, version = version + 1 \
             WHERE id IN ({list}) AND status = 'pending_payment' AND pay_deadline_ms <= {now} RETURNING id"
        );
        let txn = db.begin().await?;
        let rows = txn
            .query_all_raw(Statement::from_string(backend, sql))
            .await?;
        txn.commit().await?;
        changed += rows.len();
    }
    let per_s = n as f64 / started.elapsed().as_secs_f64();
    db.execute_unprepared(&format!("DROP TABLE {table}"))
        .await?;
    if changed != n {
        bail!("the database ceiling changed {changed} of {n} rows");
    }
    println!("ceiling: batched conditional UPDATE {per_s:.0} rows/s");
    Ok(per_s)
}

/// What the broker's delay path managed alone.
pub struct DelayPath {
    /// Burst messages out of the delay path per second, first to last arrival.
    pub per_s: f64,
    /// Last burst arrival minus the last burst due time.
    pub drain_ms: i64,
    /// How late each burst timer arrived: `max(0, arrival - due)` (an early one
    /// would be held by the consumer until it is due, so the broker cost it nothing).
    pub burst: Lateness,
    /// The same for the steady load.
    pub steady: Lateness,
}

/// One timer of the run, as the service's relay scheduled it.
#[derive(Debug, Clone, Copy)]
pub struct Scheduled {
    /// When its checkout was sent (epoch ms).
    pub sent_ms: i64,
    /// Its payment window (ms).
    pub window_ms: i64,
    /// Part of the burst (else of the steady load).
    pub burst: bool,
}

/// The broker alone carrying the run's timers through the run's delay mechanism:
/// every steady and burst timer replayed into a throwaway copy of the topology,
/// each published at the same moment relative to the others as the service's
/// relay published it and with the same delay, so each sits in the same TTL
/// levels at the same relative times; then consumed from the copy's work queue
/// by one consumer acking per batch. No router,
/// no database, no service: how fast, and how late, this broker hands these
/// timers over at all.
pub async fn delay_path(ctx: &RunCtx, schedule: &[Scheduled]) -> anyhow::Result<DelayPath> {
    let n = schedule.len();
    if !schedule.iter().any(|s| s.burst) {
        bail!("the delay path needs at least one burst timer");
    }
    println!("ceiling: delay path, the run's {n} timers replayed through a copy of the topology");
    let mode = if ctx.mode == "plugin" {
        Mode::Plugin
    } else {
        Mode::Ttl
    };
    let conn = ctx.broker("delay path").await?;
    let names = Names::new(&format!("{}.ceiling", ctx.prefix));
    topology::declare(&conn, &names, mode, QueueType::Classic).await?;
    let channel = conn.create_channel().await?;
    let result = replay(&conn, &channel, &names, mode, ctx.prefetch, schedule).await;
    if let Ok(channel) = conn.create_channel().await {
        let _ = topology::delete_all(&channel, &names).await;
    }
    let _ = conn.close(200, "ceiling done".into()).await;
    result
}

/// The order id of the first replayed timer; message i has this plus i.
const FIRST_REPLAY_ID: i64 = 2_000_000;

/// One delivery of the replay: (arrival ms, due ms, burst).
type Arrival = (i64, i64, bool);

/// When each replayed timer is published and falls due.
struct Replay {
    /// The run's timers in the order the relay published them.
    order: Vec<Scheduled>,
    /// When the first of them was sent in the run (epoch ms).
    t0: i64,
    /// When the first of them is published in the replay (epoch ms).
    start: i64,
    /// Message i is due at `dues[i].0`, and is a burst timer if `dues[i].1`.
    dues: Vec<(i64, bool)>,
    /// The last due time of all.
    last_due: i64,
}

impl Replay {
    /// Shifts `schedule` to start 200 ms from now.
    fn new(schedule: &[Scheduled]) -> Self {
        let mut order: Vec<Scheduled> = schedule.to_vec();
        order.sort_unstable_by_key(|s| s.sent_ms);
        let t0 = order[0].sent_ms;
        let start = Millis::now().0 + 200;
        // Message i is due at dues[i]; its order id says which it is.
        let dues: Vec<(i64, bool)> = order
            .iter()
            .map(|s| (start + (s.sent_ms - t0) + s.window_ms, s.burst))
            .collect();
        let last_due = dues.iter().map(|(d, _)| *d).max().unwrap_or(start);
        Self {
            order,
            t0,
            start,
            dues,
            last_due,
        }
    }
}

/// Replays `schedule` through the copy of the topology named `names`:
/// consumer first, then every publish at its time, then the figures.
async fn replay(
    conn: &Connection,
    channel: &Channel,
    names: &Names,
    mode: Mode,
    prefetch: u16,
    schedule: &[Scheduled],
) -> anyhow::Result<DelayPath> {
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let replay = Replay::new(schedule);
    // The consumer runs before the first publish: arrivals are timed as they come.
    let (_consume, receiver) = start_receiver(conn, names, prefetch, &replay).await?;
    publish_replay(channel, names, mode, &replay).await?;
    let arrivals = receiver.await.context("the delay-path consumer task")??;
    Ok(delay_path_figures(&arrivals, &replay))
}

/// Starts consuming the copy's payment work queue; the task returns every
/// arrival, or fails 60 s after the last due time. The channel is returned so
/// that it stays open until the replay is over.
async fn start_receiver(
    conn: &Connection,
    names: &Names,
    prefetch: u16,
    replay: &Replay,
) -> anyhow::Result<(Channel, JoinHandle<anyhow::Result<Vec<Arrival>>>)> {
    let queue = names.work(TimeoutKind::Payment);
    let consume = conn.create_channel().await?;
    consume
        .basic_qos(prefetch, BasicQosOptions::default())
        .await?;
    let deliveries = consume
        .basic_consume(
            queue.as_str().into(),
            "bench-delay-path".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let give_up = tokio::time::Instant::now()
        + std::time::Duration::from_millis(
            (replay.last_due - Millis::now().0).max(0) as u64 + 60_000,
        );
    let receiver = tokio::spawn(receive(deliveries, replay.dues.clone(), give_up));
    Ok((consume, receiver))
}

/// Takes every replayed timer as it arrives, acking per batch.
async fn receive(
    mut deliveries: lapin::Consumer,
    arrivals_of: Vec<(i64, bool)>,
    give_up: tokio::time::Instant,
) -> anyhow::Result<Vec<Arrival>> {
    let n = arrivals_of.len();
    let mut arrivals: Vec<Arrival> = Vec::with_capacity(n);
    while arrivals.len() < n {
        let Ok(next) = tokio::time::timeout_at(give_up, deliveries.next()).await else {
            bail!(
                "the delay path delivered {} of {n} timers by 60 s after the last due",
                arrivals.len()
            );
        };
        let Some(delivery) = next else {
            bail!(
                "the delay-path consumer ended after {} deliveries",
                arrivals.len()
            );
        };
        let now = Millis::now().0;
        let batch = ack_batch(&mut deliveries, delivery?, n - arrivals.len()).await?;
        for data in batch {
            let message = wire::decode("payment", Some("application/json"), &data)
                .map_err(|p| anyhow::anyhow!("a delay-path message does not decode: {p:?}"))?;
            let id: i64 = message
                .order_id
                .as_str()
                .parse()
                .context("a delay-path message with a non-numeric id")?;
            let i = (id - FIRST_REPLAY_ID) as usize;
            let (due, burst) = *arrivals_of
                .get(i)
                .context("a delay-path message with an unknown id")?;
            arrivals.push((now, due, burst));
        }
    }
    Ok(arrivals)
}

/// Publishes each timer at its replay time, with the delay left to its due
/// time, where the service's relay would; then waits for every confirm.
async fn publish_replay(
    channel: &Channel,
    names: &Names,
    mode: Mode,
    replay: &Replay,
) -> anyhow::Result<()> {
    let mut confirms = Vec::with_capacity(replay.order.len());
    for (i, s) in replay.order.iter().enumerate() {
        let publish_at = replay.start + (s.sent_ms - replay.t0);
        let wait = publish_at - Millis::now().0;
        if wait > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(wait as u64)).await;
        }
        let due = Millis(replay.dues[i].0);
        let delay_ms = (due.0 - Millis::now().0).max(1);
        let message = TimeoutMessage {
            order_id: OrderId::new(FIRST_REPLAY_ID + i as i64).into(),
            kind: TimeoutKind::Payment,
            due_at: Some(due),
        };
        let properties =
            wire::properties(&format!("{i}:payment"), Millis::now(), delay_ms as u64, &[]);
        // Where the service's relay puts the same timer.
        let (exchange, key) =
            topology::delay_route(names, mode, TimeoutKind::Payment, delay_ms as u64);
        confirms.push(
            channel
                .basic_publish(
                    exchange.as_str().into(),
                    key.as_str().into(),
                    order_timeout::amqp::publish_options(),
                    &wire::encode(&message),
                    properties,
                )
                .await?,
        );
    }
    for confirm in confirms {
        if !confirm.await?.is_ack() {
            bail!("the broker nacked a delay-path publish");
        }
    }
    Ok(())
}

/// The delay path's rate, drain and lateness from the replay's arrivals.
fn delay_path_figures(arrivals: &[Arrival], replay: &Replay) -> DelayPath {
    let late = |burst: bool| {
        Lateness::of(
            arrivals
                .iter()
                .filter(|a| a.2 == burst)
                .map(|(at, due, _)| (at - due).max(0))
                .collect(),
        )
    };
    let (first, last) = arrivals
        .iter()
        .filter(|a| a.2)
        .fold((i64::MAX, i64::MIN), |(lo, hi), a| {
            (lo.min(a.0), hi.max(a.0))
        });
    let burst_n = arrivals.iter().filter(|a| a.2).count();
    let last_burst_due = replay
        .dues
        .iter()
        .filter(|d| d.1)
        .map(|d| d.0)
        .max()
        .unwrap_or(replay.last_due);
    let per_s = burst_n as f64 * 1000.0 / (last - first).max(1) as f64;
    let drain_ms = last - last_burst_due;
    let (burst, steady) = (late(true), late(false));
    println!(
        "ceiling: delay path {per_s:.0}/s for the burst, drained {drain_ms} ms after its last due; \
         arrived late by p99 {} ms (burst), {} ms (steady)",
        burst.p99, steady.p99
    );
    DelayPath {
        per_s,
        drain_ms,
        burst,
        steady,
    }
}
