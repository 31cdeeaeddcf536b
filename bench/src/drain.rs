//! Waiting for the drain: after the last order is placed, the bench polls the
//! run's database and queues until every unpaid order is cancelled, keeping a
//! sample of each look for [`profile`], and gives up when orders stay pending
//! too long after the last deadline (the message path lost or stalled them).

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::ctx::RunCtx;
use crate::env::Resources;
use crate::profile;
use crate::sql::count;
use order_timeout::domain::Millis;

/// Waits until no order is `pending_payment` and the last deadline has passed,
/// sampling the drain every [`profile::SAMPLE_EVERY`] and printing progress
/// every second; fails if orders are still pending `limit` after the last deadline.
pub(crate) async fn wait_drained(
    ctx: &RunCtx,
    res: &mut Resources,
    last_due: i64,
    limit: Duration,
) -> anyhow::Result<Vec<profile::Sample>> {
    let depths = profile::Depths::new(ctx.broker("depths").await?, &ctx.prefix, &ctx.mode).await?;
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
            cpu: profile::Cpu::read(pid, ctx.broker_pid, ticks),
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
