//! The baseline: the run's burst once more, cancelled by the plain poller users
//! compare us with (the cron job they have today) instead of the service, on the
//! same database, measured with the same instruments, so that the two sets of
//! figures are printed side by side from one run.
//!
//! After the service's burst has been checked and the service stopped, the
//! burst's orders (the same count, SKUs, quantities and paid tenth) are written
//! straight into `orders`, `order_items` and `inventory` as new ids, their
//! deadlines spread over 2 s a few seconds ahead by the database's clock. The
//! poller starts as soon as they are written, so its phase against the
//! deadlines is whatever the writing left (it is recorded, not chosen). It wakes
//! every [`INTERVAL`] on its own connection and repeats, until a pass cancels
//! fewer than [`BATCH`], one transaction of: the conditional `UPDATE … WHERE id
//! IN (the oldest due pending orders, LIMIT BATCH, FOR UPDATE SKIP LOCKED)
//! RETURNING id`, then one statement releasing those orders' stock (reserved
//! back to available). It writes the same row changes as the service's cancel
//! but no audit rows (`order_events`) and no domain events (the event outbox,
//! `order_timeout_events`): a plain cron job writes neither.
//!
//! The drain is watched by the service's own loop ([`drain::watch`]), the
//! result read and checked by [`analysis::analyse_load`] (the whole table again,
//! stock over both runs), and the CPU per cancel taken over the same window as
//! the service's ([`Profile::cpu_per_cancel`]).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement, TransactionTrait};
use tokio::time::MissedTickBehavior;

use crate::analysis::{self, Load};
use crate::ctx::RunCtx;
use crate::drain::{self, Canceller};
use crate::env::Resources;
use crate::plan::{Group, Job, burst_deadline, sku_name};
use crate::profile::{CpuPerCancel, Profile};
use crate::sql::count;
use order_timeout::db::clock;

/// How often the poller wakes: once a second, like the cron job it stands for.
pub(crate) const INTERVAL: Duration = Duration::from_secs(1);
/// Orders one pass cancels at most.
pub(crate) const BATCH: usize = 1_000;
/// Rows per multi-row INSERT when the burst is written.
const INSERT_ROWS: usize = 1_000;

/// What the baseline measured.
pub(crate) struct Baseline {
    /// Orders written (the burst's count).
    pub(crate) orders: usize,
    /// Of those, left unpaid for the poller to cancel.
    pub(crate) unpaid: usize,
    /// How long after one of the poller's wakes the first deadline fell, ms
    /// (0 ≤ phase < [`INTERVAL`]): its first cancels wait the rest of the interval.
    pub(crate) phase_ms: i64,
    /// From the poller's first wake to the first deadline, ms (database clock).
    pub(crate) first_deadline_after_ms: i64,
    /// Wakes until every unpaid order was cancelled.
    pub(crate) wakes: usize,
    /// Passes (transactions) over all wakes.
    pub(crate) passes: usize,
    /// What the database says: the checks, the lateness, the rate.
    pub(crate) result: Load,
    /// CPU per cancel over the window from the first to the last cancel
    /// (`None` when the drain's samples do not span it).
    pub(crate) cpu: Option<CpuPerCancel>,
}

/// Runs the baseline after the service's run: `placed` is every order placed
/// so far, by id (the service's checks passed on them), `burst` the burst's
/// jobs, over `skus` SKUs; fails if the poller does not cancel every unpaid
/// order within `limit` after the last deadline.
pub(crate) async fn run(
    ctx: &RunCtx,
    res: &Resources,
    mut placed: HashMap<i64, Job>,
    burst: &[Job],
    skus: usize,
    limit: Duration,
) -> anyhow::Result<Baseline> {
    let db = &ctx.db;
    // New ids after the service's: its rows stay as its checks left them.
    let first_id = count(db, "SELECT COALESCE(MAX(id), 0) + 1 FROM orders").await?;
    let mut jobs: Vec<Job> = burst
        .iter()
        .map(|j| Job {
            group: Group::Poller,
            ..j.clone()
        })
        .collect();
    let unpaid = jobs.iter().filter(|j| !j.paid).count();
    // Time to write them before the first falls due, generous on a busy machine.
    let lead_ms = 3_000 + jobs.len() as i64 / 10;
    println!(
        "baseline: writing the burst again ({} orders, {unpaid} unpaid) for a plain poller \
         (every {} ms, batches of {BATCH})",
        jobs.len(),
        INTERVAL.as_millis()
    );
    let (first_due, last_due) = write(db, first_id, &mut jobs, lead_ms).await?;
    let written_at = clock::now(db).await?.0;
    let margin = first_due - written_at;
    if margin < 500 {
        bail!(
            "writing the baseline's orders took too long: the first deadline was {margin} ms \
             away when they were written"
        );
    }
    let poller_db = res
        .database
        .as_ref()
        .context("database")?
        .connect_one()
        .await?;
    let give_up = Instant::now() + Duration::from_millis((last_due - written_at) as u64) + limit;
    let poller = tokio::spawn(poll(poller_db, unpaid, give_up));
    let abort = poller.abort_handle();
    let mut watched_poller = Poller;
    let watched = tokio::try_join!(
        drain::watch(ctx, &mut watched_poller, Some(first_id), last_due, limit),
        async { poller.await.context("the poller's task")? },
    );
    if watched.is_err() {
        abort.abort();
    }
    let (samples, polled) = watched?;
    println!(
        "baseline: the poller cancelled {} orders in {} wakes ({} passes)",
        polled.cancelled, polled.wakes, polled.passes
    );
    placed.extend((first_id..).zip(jobs));
    let result = analysis::analyse_load(db, &placed, skus, Group::Poller).await?;
    let (first_cancel, last_cancel, cancels) = result.burst.window;
    let cpu = Profile::new(samples).cpu_per_cancel((first_cancel, last_cancel), cancels);
    let first_deadline_after_ms = first_due - polled.first_wake_ms;
    Ok(Baseline {
        orders: burst.len(),
        unpaid,
        phase_ms: first_deadline_after_ms.rem_euclid(INTERVAL.as_millis() as i64),
        first_deadline_after_ms,
        wakes: polled.wakes,
        passes: polled.passes,
        result,
        cpu,
    })
}

/// Writes `jobs` as orders `first_id`, `first_id + 1`, … in one transaction
/// (multi-row INSERTs): the paid ones `paid` with their units sold, the others
/// `pending_payment` with theirs reserved, each SKU's units taken from
/// `available`, as checkout and payment would have left them. Their deadlines,
/// set in `jobs` too, are spread over the burst's span from `lead_ms` ahead by
/// the database's clock. Returns the first and last deadline.
async fn write(
    db: &DatabaseConnection,
    first_id: i64,
    jobs: &mut [Job],
    lead_ms: i64,
) -> anyhow::Result<(i64, i64)> {
    let now = clock::now(db).await?.0;
    let first_due = now + lead_ms;
    let n = jobs.len();
    for (j, job) in jobs.iter_mut().enumerate() {
        job.deadline_ms = burst_deadline(first_due, j, n);
    }
    let last_due = jobs.last().map_or(first_due, |j| j.deadline_ms);
    let txn = db.begin().await?;
    for (c, chunk) in jobs.chunks(INSERT_ROWS).enumerate() {
        let ids = (first_id + (c * INSERT_ROWS) as i64..).zip(chunk);
        let mut orders = Vec::with_capacity(chunk.len());
        let mut items = Vec::with_capacity(chunk.len());
        for (id, job) in ids {
            let (status, paid_at, version) = if job.paid {
                ("paid", now.to_string(), 1)
            } else {
                ("pending_payment", "NULL".to_string(), 0)
            };
            orders.push(format!(
                "({id}, '{status}', {}, {now}, {paid_at}, {version}, {now})",
                job.deadline_ms
            ));
            items.push(format!("({id}, '{}', {})", sku_name(job.sku), job.quantity));
        }
        txn.execute_unprepared(&format!(
            "INSERT INTO orders (id, status, pay_deadline_ms, created_at_ms, paid_at_ms, version, \
             updated_at_ms) VALUES {}",
            orders.join(",")
        ))
        .await
        .context("writing the baseline's orders")?;
        txn.execute_unprepared(&format!(
            "INSERT INTO order_items (order_id, sku, quantity) VALUES {}",
            items.join(",")
        ))
        .await
        .context("writing the baseline's order lines")?;
    }
    // Units per SKU: (reserved by the unpaid, sold to the paid).
    let mut per_sku: BTreeMap<usize, (i64, i64)> = BTreeMap::new();
    for job in jobs.iter() {
        let units = per_sku.entry(job.sku).or_default();
        if job.paid {
            units.1 += job.quantity;
        } else {
            units.0 += job.quantity;
        }
    }
    for (sku, (reserved, sold)) in per_sku {
        let changed = txn
            .execute_unprepared(&format!(
                "UPDATE inventory SET available = available - {}, reserved = reserved + {reserved}, \
                 sold = sold + {sold}, updated_at_ms = {now} WHERE sku = '{}'",
                reserved + sold,
                sku_name(sku)
            ))
            .await
            .context("reserving the baseline's stock")?;
        if changed.rows_affected() != 1 {
            bail!("SKU {} is not in inventory", sku_name(sku));
        }
    }
    txn.commit().await?;
    if db.get_database_backend() == DbBackend::Postgres {
        // Fresh statistics, as a production table has: the poller's query
        // then uses the (status, pay_deadline) index as it would there.
        db.execute_unprepared("ANALYZE orders, order_items").await?;
    }
    Ok((first_due, last_due))
}

/// What the poller did.
struct Polled {
    /// The database's time at its first wake, epoch ms.
    first_wake_ms: i64,
    /// Wakes.
    wakes: usize,
    /// Passes over all wakes.
    passes: usize,
    /// Orders it cancelled.
    cancelled: usize,
}

/// The poller: wakes every [`INTERVAL`], the first time at once, and on each
/// wake runs [`pass`] until one cancels fewer than [`BATCH`]; stops when it has
/// cancelled `unpaid` orders, and fails at a wake after `give_up`.
async fn poll(db: DatabaseConnection, unpaid: usize, give_up: Instant) -> anyhow::Result<Polled> {
    let mut wake = tokio::time::interval(INTERVAL);
    // A fixed cadence like cron's: a wake that overran its second is not made
    // up for at once, the next one keeps the schedule.
    wake.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut first_wake_ms = None;
    let (mut wakes, mut passes, mut cancelled) = (0, 0, 0);
    while cancelled < unpaid {
        wake.tick().await;
        if Instant::now() > give_up {
            bail!(
                "the poller cancelled {cancelled} of {unpaid} unpaid orders within its time limit"
            );
        }
        wakes += 1;
        loop {
            let (at, n) = pass(&db).await?;
            first_wake_ms.get_or_insert(at);
            passes += 1;
            cancelled += n;
            if n < BATCH {
                break;
            }
        }
    }
    db.close().await.ok();
    Ok(Polled {
        first_wake_ms: first_wake_ms.context("the poller never woke")?,
        wakes,
        passes,
        cancelled,
    })
}

/// One pass, one transaction: the conditional cancel of the oldest due orders
/// (at most [`BATCH`]) and the release of their stock. Returns the database's
/// time it decided by and how many it cancelled (the row count is the answer).
async fn pass(db: &DatabaseConnection) -> anyhow::Result<(i64, usize)> {
    let backend = db.get_database_backend();
    // Read just before the transaction, as the service does: the statements
    // run a moment later, so the reading errs towards "not yet due".
    let now = clock::now(db).await?.0;
    // SQLite has one writer and no row locks, nor the clause.
    let lock = if backend == DbBackend::Postgres {
        " FOR UPDATE SKIP LOCKED"
    } else {
        ""
    };
    // The status is checked again by the UPDATE itself, so the statement is
    // conditional even where the subquery takes no lock.
    let cancel = format!(
        "UPDATE orders SET status = 'cancelled', cancelled_at_ms = {now}, updated_at_ms = {now}, \
         version = version + 1 WHERE status = 'pending_payment' AND id IN (SELECT id FROM orders \
         WHERE status = 'pending_payment' AND pay_deadline_ms <= {now} ORDER BY pay_deadline_ms \
         LIMIT {BATCH}{lock}) RETURNING id"
    );
    let txn = db.begin().await?;
    let ids = txn
        .query_all_raw(Statement::from_string(backend, cancel))
        .await
        .context("the poller's cancel")?
        .iter()
        .map(|row| row.try_get_by_index::<i64>(0))
        .collect::<Result<Vec<i64>, _>>()?;
    if !ids.is_empty() {
        let list = ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
        // One statement for every SKU of the batch; the only writer, so the
        // order in which it locks the stock rows does not matter here.
        txn.execute_unprepared(&format!(
            "UPDATE inventory SET reserved = reserved - r.q, available = available + r.q, \
             updated_at_ms = {now} FROM (SELECT sku, CAST(SUM(quantity) AS BIGINT) AS q \
             FROM order_items WHERE order_id IN ({list}) GROUP BY sku) AS r \
             WHERE inventory.sku = r.sku"
        ))
        .await
        .context("the poller's stock release")?;
    }
    txn.commit().await?;
    Ok((now, ids.len()))
}

/// The poller, as [`drain::watch`] sees it: a task of the bench's own, whose
/// failures end the watch through its join; no broker holds its orders.
struct Poller;

impl Canceller for Poller {
    fn check_alive(&mut self) -> anyhow::Result<()> {
        Ok(())
    }

    fn service_pid(&self) -> Option<u32> {
        None
    }

    async fn depths(&self) -> anyhow::Result<Option<(u32, u32, u32)>> {
        Ok(None)
    }

    fn prefix(&self) -> &'static str {
        "baseline: "
    }

    fn blame(&self) -> &'static str {
        "the poller lost or stalled them"
    }
}
