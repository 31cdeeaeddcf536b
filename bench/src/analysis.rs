//! What the database says about a run, read after the drain: every order
//! against what the bench placed (paid ones left paid, none cancelled early,
//! every unpaid one cancelled), stock conserved, one cancel event per cancel in
//! the audit trail, all by timeout messages; and from the cancel times, each
//! load's lateness and the burst's rate. The baseline's burst is read the same
//! way ([`analyse_load`]), without the audit trail. Any problem found refuses the run.

use std::collections::HashMap;

use sea_orm::{DatabaseConnection, QueryResult};
use serde_json::{Value, json};

use crate::ctx::RunCtx;
use crate::plan::{BURST_SPAN_MS, Group, Job, STOCK};
use crate::sql::{count, query};

/// Lateness percentiles of one load, in milliseconds.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Lateness {
    /// Orders measured.
    pub(crate) n: usize,
    pub(crate) p50: i64,
    pub(crate) p90: i64,
    pub(crate) p99: i64,
    pub(crate) max: i64,
}

impl Lateness {
    /// The percentiles of `values` (nearest rank); all zero when there are none.
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

    /// `{ n, p50, p90, p99, max }` for the report.
    pub(crate) fn json(&self) -> Value {
        json!({ "n": self.n, "p50": self.p50, "p90": self.p90, "p99": self.p99, "max": self.max })
    }
}

/// What the database says about a run.
pub(crate) struct Analysis {
    /// Every problem found; a run with any is refused.
    pub(crate) errors: Vec<String>,
    /// What was checked, for the JSON.
    pub(crate) checks: Value,
    /// Lateness of the burst's cancels.
    pub(crate) burst: Lateness,
    /// Lateness of the steady load's cancels.
    pub(crate) steady: Lateness,
    /// Burst cancels over the span from its first to its last cancel.
    pub(crate) burst_cancels_per_s: f64,
    /// What the burst asked for: its unpaid orders over 2 s.
    pub(crate) burst_offered_per_s: f64,
    /// From the last burst deadline to the last burst cancel.
    pub(crate) burst_drain_ms: i64,
    /// First and last burst cancel (epoch ms) and how many.
    pub(crate) burst_window: (i64, i64, usize),
}

/// Reads the run's result from the database; `all` is every order the bench
/// placed, by database id, over `skus` SKUs.
pub(crate) async fn analyse(
    ctx: &RunCtx,
    all: &HashMap<i64, Job>,
    skus: usize,
) -> anyhow::Result<Analysis> {
    let mut errors = Vec::new();
    let (mut orders, mut checks) = check_table(&ctx.db, all, skus, &mut errors).await?;
    let by_message = cancels_by_message(&ctx.db, orders.cancelled, &mut errors).await?;
    checks.insert("cancelled".into(), json!(orders.cancelled));
    checks.insert("cancels_by_message_path".into(), json!(by_message));
    let burst_cancels = orders.cancels.remove(&Group::Burst).unwrap_or_default();
    let burst = Burst::of(&burst_cancels);
    Ok(Analysis {
        errors,
        checks: Value::Object(checks),
        burst: Lateness::of(lateness(&burst_cancels)),
        steady: Lateness::of(lateness(
            &orders.cancels.remove(&Group::Steady).unwrap_or_default(),
        )),
        burst_cancels_per_s: burst.cancels_per_s,
        burst_offered_per_s: burst.offered_per_s,
        burst_drain_ms: burst.drain_ms,
        burst_window: burst.window,
    })
}

/// What the database says about one load's orders once more is placed after
/// the service's run (the baseline's burst, [`crate::baseline`]).
pub(crate) struct Load {
    /// Every problem found in the whole table; a run with any is refused.
    pub(crate) errors: Vec<String>,
    /// What was checked, for the JSON.
    pub(crate) checks: Value,
    /// Lateness of the load's cancels.
    pub(crate) lateness: Lateness,
    /// Its cancels' rate, drain and window.
    pub(crate) burst: Burst,
}

/// Reads the orders of `group` from the database, checking the whole table
/// again against `all` (everything placed, that load included): the rows the
/// service's checks passed must be as they were, and stock conserved over
/// both. No audit check: only the service writes audit rows.
pub(crate) async fn analyse_load(
    db: &DatabaseConnection,
    all: &HashMap<i64, Job>,
    skus: usize,
    group: Group,
) -> anyhow::Result<Load> {
    let mut errors = Vec::new();
    let (mut orders, mut checks) = check_table(db, all, skus, &mut errors).await?;
    let cancels = orders.cancels.remove(&group).unwrap_or_default();
    checks.insert("cancelled".into(), json!(cancels.len()));
    Ok(Load {
        errors,
        checks: Value::Object(checks),
        lateness: Lateness::of(lateness(&cancels)),
        burst: Burst::of(&cancels),
    })
}

/// Every order and every SKU in the database read against `all`: the checks
/// every run makes, the service's and the baseline's.
async fn check_table(
    db: &DatabaseConnection,
    all: &HashMap<i64, Job>,
    skus: usize,
    errors: &mut Vec<String>,
) -> anyhow::Result<(Orders, serde_json::Map<String, Value>)> {
    let rows = query(
        db,
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
    let mut orders = Orders::new(skus);
    for row in &rows {
        orders.add(row, all, errors)?;
    }
    orders.summarise(errors);
    let stock_ok = stock_conserved(db, skus, &orders.sold_expected, errors).await?;
    let checks = [
        ("orders_in_db", json!(rows.len())),
        ("paid_left_paid", json!(orders.paid_cancelled == 0)),
        ("none_early", json!(orders.early == 0)),
        ("all_unpaid_cancelled", json!(orders.unpaid_open == 0)),
        ("stock_conserved", json!(stock_ok)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    Ok((orders, checks))
}

/// Cancel time minus deadline of each (cancelled at, deadline).
fn lateness(cancels: &[(i64, i64)]) -> Vec<i64> {
    cancels.iter().map(|(at, deadline)| at - deadline).collect()
}

/// The orders table read against what the bench placed.
struct Orders {
    /// (cancelled at, deadline) of every cancel, epoch ms, per load.
    cancels: HashMap<Group, Vec<(i64, i64)>>,
    /// Unpaid orders cancelled before their deadline.
    early: usize,
    /// Paid orders not left paid.
    paid_cancelled: usize,
    /// Unpaid orders not cancelled.
    unpaid_open: usize,
    /// Orders the bench did not place.
    unknown: usize,
    /// Units the paid orders took, per SKU: what each SKU must have sold.
    sold_expected: Vec<i64>,
    /// Unpaid orders cancelled.
    cancelled: i64,
}

impl Orders {
    fn new(skus: usize) -> Self {
        Self {
            cancels: HashMap::new(),
            early: 0,
            paid_cancelled: 0,
            unpaid_open: 0,
            unknown: 0,
            sold_expected: vec![0_i64; skus],
            cancelled: 0,
        }
    }

    /// Checks one row of `orders`; the first five problems of each kind are
    /// named in `errors`.
    fn add(
        &mut self,
        row: &QueryResult,
        all: &HashMap<i64, Job>,
        errors: &mut Vec<String>,
    ) -> anyhow::Result<()> {
        let id: i64 = row.try_get("", "id")?;
        let status: String = row.try_get("", "status")?;
        let deadline: i64 = row.try_get("", "pay_deadline_ms")?;
        let cancelled_at: Option<i64> = row.try_get("", "cancelled_at_ms")?;
        let Some(job) = all.get(&id) else {
            self.unknown += 1;
            return Ok(());
        };
        if job.paid {
            if status != "paid" {
                self.paid_cancelled += 1;
                if self.paid_cancelled <= 5 {
                    errors.push(format!("paid order {id} is {status}"));
                }
            }
            self.sold_expected[job.sku] += job.quantity;
            return Ok(());
        }
        match (status.as_str(), cancelled_at) {
            ("cancelled", Some(at)) => {
                self.cancelled += 1;
                if at < deadline {
                    self.early += 1;
                    if self.early <= 5 {
                        errors.push(format!(
                            "order {id} cancelled {} ms before its deadline",
                            deadline - at
                        ));
                    }
                }
                self.cancels
                    .entry(job.group)
                    .or_default()
                    .push((at, deadline));
            }
            _ => {
                self.unpaid_open += 1;
                if self.unpaid_open <= 5 {
                    errors.push(format!("unpaid order {id} is {status}, not cancelled"));
                }
            }
        }
        Ok(())
    }

    /// One line per kind of problem, with how many.
    fn summarise(&self, errors: &mut Vec<String>) {
        for (what, n) in [
            ("orders the bench did not place", self.unknown),
            ("paid orders not left paid", self.paid_cancelled),
            ("orders cancelled before their deadline", self.early),
            ("unpaid orders not cancelled", self.unpaid_open),
        ] {
            if n > 0 {
                errors.push(format!("{n} {what}"));
            }
        }
    }
}

/// Stock: available + reserved + sold == stocked; nothing left reserved; sold == paid.
async fn stock_conserved(
    db: &DatabaseConnection,
    skus: usize,
    sold_expected: &[i64],
    errors: &mut Vec<String>,
) -> anyhow::Result<bool> {
    let stock = query(db, "SELECT sku, available, reserved, sold FROM inventory").await?;
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
    Ok(stock_ok)
}

/// The audit trail: one cancel per cancelled order, all by timeout messages.
async fn cancels_by_message(
    db: &DatabaseConnection,
    cancelled: i64,
    errors: &mut Vec<String>,
) -> anyhow::Result<bool> {
    let events = count(
        db,
        "SELECT COUNT(*) FROM order_events WHERE event = 'cancelled'",
    )
    .await?;
    let not_message = count(
        db,
        "SELECT COUNT(*) FROM order_events WHERE event = 'cancelled' AND cause <> 'timeout'",
    )
    .await?;
    if events != cancelled {
        errors.push(format!(
            "{events} cancel events in the audit trail for {cancelled} cancelled orders"
        ));
    }
    if not_message > 0 {
        errors.push(format!(
            "{not_message} cancels not made by a timeout message"
        ));
    }
    Ok(not_message == 0 && events == cancelled)
}

/// A burst's figures from its cancels.
pub(crate) struct Burst {
    /// Cancels over the span from the first to the last.
    pub(crate) cancels_per_s: f64,
    /// Its unpaid orders over [`BURST_SPAN_MS`].
    pub(crate) offered_per_s: f64,
    /// From the last burst deadline to the last burst cancel.
    pub(crate) drain_ms: i64,
    /// First and last cancel (epoch ms) and how many.
    pub(crate) window: (i64, i64, usize),
}

impl Burst {
    /// From (cancelled at, deadline) of every burst cancel.
    fn of(cancels: &[(i64, i64)]) -> Self {
        let offered_per_s = cancels.len() as f64 / (BURST_SPAN_MS as f64 / 1000.0);
        let (first, last) = cancels
            .iter()
            .fold((i64::MAX, i64::MIN), |(lo, hi), (at, _)| {
                (lo.min(*at), hi.max(*at))
            });
        let last_deadline = cancels.iter().map(|(_, d)| *d).max().unwrap_or(0);
        let span_ms = (last - first).max(1);
        let cancels_per_s = if cancels.is_empty() {
            0.0
        } else {
            cancels.len() as f64 * 1000.0 / span_ms as f64
        };
        Self {
            cancels_per_s,
            offered_per_s,
            drain_ms: if cancels.is_empty() {
                0
            } else {
                last - last_deadline
            },
            window: (first, last, cancels.len()),
        }
    }
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

    #[test]
    fn burst_figures_from_its_cancels() {
        // (cancelled at, deadline): three cancels over 2 s, the last 100 ms after its deadline.
        let b = Burst::of(&[(1_000, 900), (1_500, 1_000), (3_000, 2_900)]);
        assert_eq!(b.window, (1_000, 3_000, 3));
        assert_eq!(b.cancels_per_s, 1.5);
        assert_eq!(b.offered_per_s, 3.0 / (BURST_SPAN_MS as f64 / 1000.0));
        assert_eq!(b.drain_ms, 100);
    }
}
