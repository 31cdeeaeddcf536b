//! The orders of the burst and steady scenario: which load each belongs to, its
//! planned deadline, whether it is paid, its SKU and quantity; and the plan that
//! sets the deadlines so that every order is placed and paid before the first
//! one falls due.

use crate::cli::BenchArgs;
use order_timeout::domain::Millis;

/// The payment window of a burst: every burst deadline falls within this span.
pub(crate) const BURST_SPAN_MS: i64 = 2_000;
/// Stock given to every SKU; never the limit.
pub(crate) const STOCK: i64 = 1_000_000_000;
/// One order in this many is paid before its deadline.
const PAID_EVERY: usize = 10;

/// Which load an order belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Group {
    /// Placed to measure checkout speed before planning deadlines.
    Calibration,
    /// R due per second for S seconds.
    Steady,
    /// N due within 2 s.
    Burst,
    /// The burst again, written straight into the tables after the service's
    /// run and cancelled by the bench's plain poller ([`crate::baseline`]).
    Poller,
}

/// One order to place.
#[derive(Debug, Clone)]
pub(crate) struct Job {
    /// Its load.
    pub(crate) group: Group,
    /// The planned deadline (the service's stored one decides).
    pub(crate) deadline_ms: i64,
    /// Paid before its deadline.
    pub(crate) paid: bool,
    /// Index of its SKU.
    pub(crate) sku: usize,
    /// Units ordered.
    pub(crate) quantity: i64,
}

/// The name of SKU `i`, as stocked and ordered.
pub(crate) fn sku_name(i: usize) -> String {
    format!("BENCH-{i:03}")
}

/// The deadline of the `j`th of `n` burst orders whose first falls due at
/// `start`: spread evenly over [`BURST_SPAN_MS`].
pub(crate) fn burst_deadline(start: i64, j: usize, n: usize) -> i64 {
    start + (j as i64 * BURST_SPAN_MS) / n.max(1) as i64
}

/// The calibration orders: `n` unpaid orders over `skus` SKUs, their windows
/// fixed when they are placed.
pub(crate) fn calibration(n: usize, skus: usize) -> Vec<Job> {
    (0..n)
        .map(|i| Job {
            group: Group::Calibration,
            deadline_ms: 0,
            paid: false,
            sku: i % skus,
            quantity: 1 + (i % 3) as i64,
        })
        .collect()
}

/// The deadlines of the run, planned from the calibrated checkout rate.
pub(crate) struct Plan {
    /// The first steady deadline (the first burst one without a steady load), epoch ms.
    pub(crate) first_due: i64,
    /// The first burst deadline, epoch ms.
    pub(crate) burst_start: i64,
    /// The steady orders, then the burst's.
    pub(crate) jobs: Vec<Job>,
}

impl Plan {
    /// Plans `total` orders (`steady_n` of them steady) at `calib_rate` orders
    /// per second, and says so.
    pub(crate) fn new(
        args: &BenchArgs,
        skus: usize,
        steady_n: usize,
        total: usize,
        calib_rate: f64,
    ) -> Self {
        // Every order placed (and paid) well before the first deadline.
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
                deadline_ms: burst_deadline(burst_start, j, args.burst),
                paid: j % PAID_EVERY == PAID_EVERY - 1,
                sku: (j * 7) % skus,
                quantity: 1 + (j % 3) as i64,
            });
        }
        Self {
            first_due,
            burst_start,
            jobs,
        }
    }

    /// The last burst deadline, epoch ms.
    pub(crate) fn last_due(&self) -> i64 {
        self.burst_start + BURST_SPAN_MS
    }
}
