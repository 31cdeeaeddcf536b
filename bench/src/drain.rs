//! Waiting for the drain: after the last order is placed, the bench polls the
//! run's database (and, for the service, its queues) until every unpaid order
//! is cancelled, keeping a sample of each look for [`profile`], and gives up
//! when orders stay pending too long after the last deadline (whoever cancels
//! them lost or stalled them). The service's drain and the baseline poller's
//! ([`crate::baseline`]) are watched by the same loop, so both are measured alike.

use std::time::{Duration, Instant};

use anyhow::bail;

use crate::ctx::RunCtx;
use crate::env::{self, Resources, Service};
use crate::profile;
use crate::sql::count;
use order_timeout::domain::Millis;

/// Whoever cancels the orders while the drain is watched.
pub(crate) trait Canceller {
    /// Fails when it has stopped (the child exited).
    fn check_alive(&mut self) -> anyhow::Result<()>;
    /// The pid of the service under test, whose CPU is the service's share;
    /// `None` when the bench itself cancels.
    fn service_pid(&self) -> Option<u32>;
    /// Where the due timers are now: (levels, ingest, work), as
    /// [`profile::Sample`] has them; `None` when no broker holds them.
    async fn depths(&self) -> anyhow::Result<Option<(u32, u32, u32)>>;
    /// What the progress lines start with.
    fn prefix(&self) -> &'static str;
    /// Who lost the orders, for the error when some stay pending.
    fn blame(&self) -> &'static str;
}

/// The service under test, cancelling through its message path.
struct MessagePath<'a> {
    service: &'a mut Service,
    depths: profile::Depths,
}

impl Canceller for MessagePath<'_> {
    fn check_alive(&mut self) -> anyhow::Result<()> {
        self.service.check_alive()
    }

    fn service_pid(&self) -> Option<u32> {
        Some(self.service.pid())
    }

    async fn depths(&self) -> anyhow::Result<Option<(u32, u32, u32)>> {
        self.depths.read().await.map(Some)
    }

    fn prefix(&self) -> &'static str {
        ""
    }

    fn blame(&self) -> &'static str {
        "the message path lost or stalled them"
    }
}

/// Waits until the service has cancelled every unpaid order and the last
/// deadline has passed; see [`watch`].
pub(crate) async fn wait_drained(
    ctx: &RunCtx,
    res: &mut Resources,
    last_due: i64,
    limit: Duration,
) -> anyhow::Result<profile::Drained> {
    let depths = profile::Depths::new(ctx.broker("depths").await?, &ctx.prefix, &ctx.mode).await?;
    let Some(service) = res.service.as_mut() else {
        bail!("the service under test is not running");
    };
    watch(
        ctx,
        &mut MessagePath { service, depths },
        None,
        last_due,
        limit,
    )
    .await
}

/// Waits until no order (of those with `id >= first_id`, or any) is
/// `pending_payment` and the last deadline has passed, sampling the drain every
/// [`profile::SAMPLE_EVERY`] and printing progress every second; fails if orders
/// are still pending `limit` after the last deadline.
pub(crate) async fn watch(
    ctx: &RunCtx,
    canceller: &mut impl Canceller,
    first_id: Option<i64>,
    last_due: i64,
    limit: Duration,
) -> anyhow::Result<profile::Drained> {
    // The service's counts stay index-only: no id filter unless asked.
    let scope = first_id.map_or(String::new(), |id| format!(" AND id >= {id}"));
    let ticks = env::clock_ticks();
    let trace = profile::CpuTrace::start(canceller.service_pid(), ctx.broker_pid, ticks);
    let mut samples = Vec::new();
    let mut printed = Instant::now() - Duration::from_secs(1);
    loop {
        canceller.check_alive()?;
        // Queue depths and database counts as close together as they can be.
        let depths = canceller.depths().await?;
        let (levels, ingest, work) = depths.unwrap_or_default();
        let now = Millis::now().0;
        let pending = count(
            &ctx.db,
            &format!("SELECT COUNT(*) FROM orders WHERE status = 'pending_payment'{scope}"),
        )
        .await?;
        let cancelled = count(
            &ctx.db,
            &format!("SELECT COUNT(*) FROM orders WHERE status = 'cancelled'{scope}"),
        )
        .await?;
        let overdue = count(
            &ctx.db,
            &format!("SELECT COUNT(*) FROM orders WHERE status = 'pending_payment' AND pay_deadline_ms <= {now}{scope}"),
        )
        .await?;
        samples.push(profile::Sample {
            at_ms: now,
            cancelled,
            overdue,
            levels,
            ingest,
            work,
        });
        if pending == 0 && now > last_due {
            println!(
                "{}drained: {cancelled} cancelled, none pending",
                canceller.prefix()
            );
            return Ok((samples, trace.finish()));
        }
        let since_last = now - last_due;
        if since_last > limit.as_millis() as i64 {
            bail!(
                "{pending} orders still pending_payment {:.0}s after the last deadline \
                 ({overdue} of them overdue): {}",
                since_last as f64 / 1000.0,
                canceller.blame()
            );
        }
        let when = if since_last < 0 {
            format!("last due in {:.1}s", -since_last as f64 / 1000.0)
        } else {
            format!("last deadline {:.1}s ago", since_last as f64 / 1000.0)
        };
        if printed.elapsed() >= Duration::from_secs(1) {
            let queues =
                depths.map_or(String::new(), |_| format!("; levels {levels}, work {work}"));
            println!(
                "{}waiting: {cancelled} cancelled, {pending} pending ({overdue} overdue{queues}), {when}",
                canceller.prefix()
            );
            printed = Instant::now();
        }
        tokio::time::sleep(profile::SAMPLE_EVERY).await;
    }
}
