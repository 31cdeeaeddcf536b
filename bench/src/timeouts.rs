//! The burst and steady scenario (`make bench`), phase by phase: stock the
//! SKUs, calibrate checkout, plan the deadlines, place and pay every order, wait
//! for the drain, check the database's result, then on a quiet machine (the
//! service stopped) the same burst through a plain poller ([`baseline`]) and
//! the ceiling, then report.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::analysis;
use crate::baseline;
use crate::ceiling::{self, Scheduled};
use crate::cli::BenchArgs;
use crate::ctx::RunCtx;
use crate::drain::wait_drained;
use crate::env::Resources;
use crate::load::{pay, place, stock};
use crate::plan::{self, Group, Job, Plan};
use crate::profile;
use crate::report::{self, Measured};
use order_timeout::domain::Millis;

/// The checkout rate aimed for (PostgreSQL, over HTTP, on two cores), orders per second.
const TARGET_CHECKOUT_PER_S: f64 = 2_000.0;

/// The burst and steady scenario.
pub(crate) async fn timeouts(
    ctx: &RunCtx,
    res: &mut Resources,
    args: &BenchArgs,
) -> anyhow::Result<Value> {
    if args.burst == 0 {
        bail!("--burst must be at least 1");
    }
    let skus = args.skus.max(1);
    let (base, pid, ticks) = {
        let service = res.service.as_ref().context("service")?;
        (service.base.clone(), service.pid(), service.ticks())
    };
    stock(ctx, &base, skus).await?;
    let steady_n = args.steady_rate * args.steady_secs;
    let total = steady_n + args.burst;

    let calib_n = (total / 10).clamp(20, 500);
    let calib = plan::calibration(calib_n, skus);
    let (calib_ids, calib_rate) = calibrate(ctx, &base, &calib, args.clients).await?;
    let plan = Plan::new(args, skus, steady_n, total, calib_rate);
    let checkout = checkout(ctx, &base, &plan.jobs, args.clients, (pid, ticks)).await?;
    pay(ctx, &base, &plan.jobs, &checkout.ids, args.clients).await?;
    let margin = plan.first_due - Millis::now().0;
    if margin < 500 {
        bail!(
            "placing the orders took longer than planned: the first deadline was {} ms away \
             when the last payment went in; the measurement would mix checkout and cancels",
            margin
        );
    }

    // Every order of the run, by database id.
    let mut all: HashMap<i64, Job> = HashMap::with_capacity(total + calib_n);
    for (job, id) in calib
        .iter()
        .zip(&calib_ids)
        .chain(plan.jobs.iter().zip(&checkout.ids))
    {
        all.insert(*id, job.clone());
    }
    let drain_limit = Duration::from_secs(60 + (total / 200) as u64);
    let samples = wait_drained(ctx, res, plan.last_due(), drain_limit).await?;
    let stats = res.service.as_ref().context("service")?.stats()?;
    let result = analysis::analyse(ctx, &all, skus).await?;
    refuse_if_wrong("the run", &result.errors)?;
    let drain = profile::Profile::new(samples);
    let (first_cancel, last_cancel, burst_n) = result.burst_window;
    let limit = drain.limit(
        &ctx.mode,
        (first_cancel, last_cancel),
        burst_n,
        result.burst_cancels_per_s,
        result.burst_offered_per_s,
    );
    let series = drain.series(plan.burst_start - 1_000);
    // The baseline and the ceiling are measured on a quiet broker and
    // database: the service stops first.
    if let Some(mut service) = res.service.take() {
        service.stop();
    }
    let burst_jobs: Vec<Job> = plan
        .jobs
        .iter()
        .filter(|j| j.group == Group::Burst)
        .cloned()
        .collect();
    let baseline = baseline::run(ctx, res, all, &burst_jobs, skus, drain_limit).await?;
    refuse_if_wrong("the baseline", &baseline.result.errors)?;
    let ceiling = ceiling::measure(ctx, args.burst.max(2_000), &checkout.schedule).await?;
    let measured = Measured {
        orders: total + calib_n,
        checkout_per_s: checkout.per_s,
        checkout_limit: checkout.limit,
        result,
        limit,
        series,
        baseline,
        ceiling,
        stats,
    };
    let report = report::json(ctx, args, &measured);
    report::print_table(&report, &measured.stats);
    Ok(report)
}

/// Calibration: how fast does checkout go here, now? Places `calib`, each due
/// 2 s after placement; returns their ids and the orders placed per second.
async fn calibrate(
    ctx: &RunCtx,
    base: &str,
    calib: &[Job],
    clients: usize,
) -> anyhow::Result<(Vec<i64>, f64)> {
    let started = Instant::now();
    let (calib_ids, _) = place(ctx, base, calib, clients, Some(2_000), "calibration").await?;
    let calib_rate = calib.len() as f64 / started.elapsed().as_secs_f64();
    Ok((calib_ids, calib_rate))
}

/// What placing the run's orders measured.
struct Checkout {
    /// The order ids, in job order.
    ids: Vec<i64>,
    /// The run's timers as the relay scheduled them: when, and for how long.
    schedule: Vec<Scheduled>,
    /// Orders placed per second.
    per_s: f64,
    /// The CPU's verdict on checkout.
    limit: Value,
}

/// Places every planned order, timed, reading the machine's CPU before and
/// after; `service` is the pid and clock ticks of the service under test.
async fn checkout(
    ctx: &RunCtx,
    base: &str,
    jobs: &[Job],
    clients: usize,
    (pid, ticks): (u32, f64),
) -> anyhow::Result<Checkout> {
    let total = jobs.len();
    let cpu_before = profile::Cpu::read(Some(pid), ctx.broker_pid, ticks);
    let started = Instant::now();
    let (ids, sent) = place(ctx, base, jobs, clients, None, "checkout").await?;
    let cpu_after = profile::Cpu::read(Some(pid), ctx.broker_pid, ticks);
    let schedule: Vec<Scheduled> = jobs
        .iter()
        .zip(&sent)
        .map(|(j, at)| Scheduled {
            sent_ms: *at,
            window_ms: j.deadline_ms - at,
            burst: j.group == Group::Burst,
        })
        .collect();
    let checkout_s = started.elapsed().as_secs_f64();
    let per_s = total as f64 / checkout_s;
    let limit = profile::cpu_usage(
        &cpu_before,
        &cpu_after,
        checkout_s,
        total,
        per_s,
        TARGET_CHECKOUT_PER_S,
    );
    println!("checkout: {total} orders in {checkout_s:.1}s = {per_s:.0}/s");
    Ok(Checkout {
        ids,
        schedule,
        per_s,
        limit,
    })
}

/// Fails with every problem found in `what` (the run, the baseline), so that
/// a wrong run reports no figures.
fn refuse_if_wrong(what: &str, errors: &[String]) -> anyhow::Result<()> {
    if !errors.is_empty() {
        bail!(
            "{what} was wrong ({} problems):\n  - {}",
            errors.len(),
            errors.join("\n  - ")
        );
    }
    println!("correctness of {what}: every check passed");
    Ok(())
}
