//! The burst and steady scenario's report: the JSON written to `--out`, with
//! the steady load's verdict against the broker's own lateness and the burst
//! beside the baseline poller's, and the table printed from that JSON.

use serde_json::{Value, json};

use crate::analysis::{Analysis, Lateness};
use crate::baseline::{self, Baseline};
use crate::ceiling::{Ceiling, NATIVE_DELAY_PATH};
use crate::cli::BenchArgs;
use crate::ctx::RunCtx;
use crate::env::ProcStats;
use crate::profile::round2;

/// Everything one burst and steady run measured.
pub(crate) struct Measured {
    /// Orders placed, calibration included.
    pub(crate) orders: usize,
    /// Orders placed per second over HTTP (calibration excluded).
    pub(crate) checkout_per_s: f64,
    /// The CPU's verdict on checkout ([`crate::profile::cpu_usage`]).
    pub(crate) checkout_limit: Value,
    /// What the database says about the run.
    pub(crate) result: Analysis,
    /// The CPU's and queues' verdict on the burst ([`crate::profile::Profile::limit`]).
    pub(crate) limit: Value,
    /// The drain, about one sample a second from just before the burst.
    pub(crate) series: Value,
    /// The same burst through a plain poller.
    pub(crate) baseline: Baseline,
    /// The machine's ceiling for the same work.
    pub(crate) ceiling: Ceiling,
    /// The service's peak memory and CPU time.
    pub(crate) stats: ProcStats,
}

/// The report of a burst and steady run, as written to `--out`.
pub(crate) fn json(ctx: &RunCtx, args: &BenchArgs, m: &Measured) -> Value {
    let (result, consume, update, delay_path) = (
        &m.result,
        &m.ceiling.broker,
        m.ceiling.db_batch_cancel_per_s,
        m.ceiling.delay_path.as_ref(),
    );
    let steady_limit = steady_verdict(&ctx.mode, &result.steady, delay_path.map(|d| &d.steady));
    let lower = consume.consume_ack_per_s.min(update);
    let fraction = result.burst_cancels_per_s / lower;
    json!({
        "mode": ctx.mode,
        "mode_why": ctx.mode_why,
        "broker": ctx.broker,
        "db": ctx.db_kind,
        "orders": m.orders,
        "burst": args.burst,
        "steady": { "rate": args.steady_rate, "secs": args.steady_secs },
        "clients": args.clients,
        "batch_size": ctx.batch_size,
        "prefetch": ctx.prefetch,
        "checkout_per_s": round1(m.checkout_per_s),
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
            "delay_path_per_s": delay_path.map(|d| round1(d.per_s)),
            "delay_path_drain_ms": delay_path.map(|d| d.drain_ms),
            "delay_path_lateness_ms": delay_path.map(|d| json!({
                "burst": d.burst.json(),
                "steady": d.steady.json(),
            })),
            "delay_path_skipped": delay_path.is_none().then_some(NATIVE_DELAY_PATH),
        },
        "fraction_of_ceiling": (fraction * 1000.0).round() / 1000.0,
        "fraction_of_delay_path": delay_path.map(|d| (result.burst_cancels_per_s / d.per_s * 1000.0).round() / 1000.0),
        // Machine CPU (broker, database, service and bench together) per
        // cancel in the burst and per checkout, from the two profiles below.
        "cpu_ms_per_cancel": m.limit["machine_cpu_ms_per_cancel"],
        "cpu_ms_per_checkout": m.checkout_limit["machine_cpu_ms_per_op"],
        "limit": m.limit,
        "checkout_limit": m.checkout_limit,
        "steady_limit": steady_limit,
        "burst_drain_series": m.series,
        "service_peak_rss_mb": round1(m.stats.peak_rss_mb),
        "service_cpu_s": round1(m.stats.cpu_s),
        "checks": result.checks,
        "baseline": baseline_json(ctx, &m.baseline, &result.burst, &m.limit),
    })
}

/// The baseline poller's figures, and `versus`: the service's burst (its
/// lateness and the CPU of its `limit`) beside the poller's, with the ratios
/// ours ÷ poller (below 1: ours is lower, so better). The database's share is
/// `null` on SQLite, which runs inside the process that cancels.
fn baseline_json(ctx: &RunCtx, b: &Baseline, burst: &Lateness, limit: &Value) -> Value {
    let on_server = ctx.db_kind != "sqlite";
    let machine = b.cpu.map(|c| round2(c.machine_ms));
    let database = b.cpu.filter(|_| on_server).map(|c| round2(c.database_ms));
    let ours_database = if on_server {
        limit["database_cpu_ms_per_cancel"].clone()
    } else {
        Value::Null
    };
    let lateness = &b.result.lateness;
    let ours = json!({
        "p50": burst.p50,
        "p99": burst.p99,
        "machine_cpu_ms_per_cancel": limit["machine_cpu_ms_per_cancel"],
        "database_cpu_ms_per_cancel": ours_database,
    });
    let poller = json!({
        "p50": lateness.p50,
        "p99": lateness.p99,
        "machine_cpu_ms_per_cancel": machine,
        "database_cpu_ms_per_cancel": database,
    });
    let ratio = |key: &str| match (ours[key].as_f64(), poller[key].as_f64()) {
        (Some(a), Some(p)) if p > 0.0 => json!(round2(a / p)),
        _ => Value::Null,
    };
    let ours_over_poller = json!({
        "p50": ratio("p50"),
        "p99": ratio("p99"),
        "machine_cpu_ms_per_cancel": ratio("machine_cpu_ms_per_cancel"),
        "database_cpu_ms_per_cancel": ratio("database_cpu_ms_per_cancel"),
    });
    json!({
        "kind": "poller",
        "interval_ms": baseline::INTERVAL.as_millis() as u64,
        "batch": baseline::BATCH,
        "orders": b.orders,
        "unpaid": b.unpaid,
        "cancelled": lateness.n,
        "phase_ms": b.phase_ms,
        "first_deadline_after_first_wake_ms": b.first_deadline_after_ms,
        "wakes": b.wakes,
        "passes": b.passes,
        "lateness_ms": lateness.json(),
        "cancels_per_s": round1(b.result.burst.cancels_per_s),
        "drain_ms": b.result.burst.drain_ms,
        "machine_cpu_ms_per_cancel": machine,
        "database_cpu_ms_per_cancel": database,
        "writes": "the orders' status and stamps and the stock release, as the service's cancel; no audit rows, no domain events",
        "checks": b.result.checks,
        "versus": {
            "ours": ours,
            "poller": poller,
            "ours_over_poller": ours_over_poller,
            "ours_ahead_on_p99": burst.p99 < lateness.p99,
        },
    })
}

/// The steady load's lateness against the broker's own: how late the delay path
/// alone delivered the same timers (nothing else running) says how much of the
/// service's lateness is the broker's. The target is the mode's: native mode
/// holds each timer until its millisecond, the others do not.
fn steady_verdict(mode: &str, service: &Lateness, broker: Option<&Lateness>) -> Value {
    let target_p99_ms: i64 = if mode == "native" { 20 } else { 100 };
    let verdict = match broker {
        _ if service.n == 0 => "no steady load in this run".to_string(),
        _ if service.p99 <= target_p99_ms => format!(
            "p99 {} ms, within the {target_p99_ms} ms target",
            service.p99
        ),
        None => format!(
            "p99 {} ms against the {target_p99_ms} ms target; the broker's delay path alone was {NATIVE_DELAY_PATH}",
            service.p99
        ),
        Some(broker) if broker.p99 * 2 >= service.p99 => format!(
            "p99 {} ms against the {target_p99_ms} ms target; the broker's delay path alone \
             delivered the same timers late by p99 {} ms, so most of it is the delay stage's",
            service.p99, broker.p99
        ),
        Some(broker) => format!(
            "p99 {} ms against the {target_p99_ms} ms target; the broker's delay path alone \
             delivered the same timers late by p99 {} ms, so most of it ({} ms) is the \
             service's own: the consumer's batch and its transaction",
            service.p99,
            broker.p99,
            service.p99 - broker.p99
        ),
    };
    json!({
        "target_p99_ms": target_p99_ms,
        "service_p99_ms": service.p99,
        "delay_path_p99_ms": broker.map(|b| b.p99),
        "verdict": verdict,
    })
}

/// `x` to one decimal, as the report gives rates and sizes.
pub(crate) fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// Prints the report `r` as a table, then the verdicts.
pub(crate) fn print_table(r: &Value, stats: &ProcStats) {
    println!();
    println!("{:<34} value", "figure");
    println!("{}", "-".repeat(78));
    for (name, value) in table_rows(r, stats) {
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
    print_versus(&r["baseline"]);
    println!();
}

/// The burst beside the baseline poller's, from the report's `baseline`.
fn print_versus(b: &Value) {
    let v = &b["versus"];
    let (ours, poller, ratio) = (&v["ours"], &v["poller"], &v["ours_over_poller"]);
    let times = |x: &Value| x.as_f64().map_or("n/a".to_string(), |x| format!("{x:.2}×"));
    let ms = |x: &Value| x.as_f64().map_or("n/a".to_string(), |x| format!("{x:.2}"));
    let database = if ours["database_cpu_ms_per_cancel"].is_null()
        && poller["database_cpu_ms_per_cancel"].is_null()
    {
        "the database's part not told apart (SQLite runs inside the process that cancels)"
            .to_string()
    } else {
        format!(
            "of which the database {} / {} ms",
            ms(&ours["database_cpu_ms_per_cancel"]),
            ms(&poller["database_cpu_ms_per_cancel"]),
        )
    };
    println!();
    println!(
        "burst vs a {} s poller (ours / poller): lateness p50 {} / {} ms ({}), p99 {} / {} ms ({}), \
         machine CPU per cancel {} / {} ms ({}), {database}",
        b["interval_ms"].as_u64().unwrap_or(0) as f64 / 1000.0,
        ours["p50"],
        poller["p50"],
        times(&ratio["p50"]),
        ours["p99"],
        poller["p99"],
        times(&ratio["p99"]),
        ms(&ours["machine_cpu_ms_per_cancel"]),
        ms(&poller["machine_cpu_ms_per_cancel"]),
        times(&ratio["machine_cpu_ms_per_cancel"]),
    );
    println!(
        "the poller (same burst and database, batches of {}, no audit rows or domain events): \
         {} of {} unpaid cancelled in {} wakes, {}/s, drained {} ms after the last deadline, \
         max lateness {} ms; the first deadline fell {} ms after one of its wakes",
        b["batch"],
        b["cancelled"],
        b["unpaid"],
        b["wakes"],
        b["cancels_per_s"],
        b["drain_ms"],
        b["lateness_ms"]["max"],
        b["phase_ms"],
    );
    if v["ours_ahead_on_p99"].as_bool() == Some(true) {
        println!(
            "p99: ours is ahead of the poller ({} ms against {} ms)",
            ours["p99"], poller["p99"]
        );
    } else {
        println!(
            "p99: ours is NOT ahead of the poller ({} ms against {} ms)",
            ours["p99"], poller["p99"]
        );
    }
}

/// The table's rows: (figure, value) read from the report `r`.
fn table_rows(r: &Value, stats: &ProcStats) -> [(&'static str, String); 16] {
    let lat = |load: &str| {
        let l = &r["lateness_ms"][load];
        format!(
            "p50 {} / p90 {} / p99 {} / max {} ms (n={})",
            l["p50"], l["p90"], l["p99"], l["max"], l["n"]
        )
    };
    let ceiling = &r["ceiling"];
    [
        (
            "mode / db / broker",
            format!(
                "{} / {} / RabbitMQ {}",
                r["mode"].as_str().unwrap_or(""),
                r["db"].as_str().unwrap_or(""),
                r["broker"]["version"].as_str().unwrap_or("?")
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
            format!("{}/s", ceiling["consume_ack_per_s"]),
        ),
        (
            "ceiling: publish+confirm",
            format!("{}/s", ceiling["publish_confirm_per_s"]),
        ),
        (
            "ceiling: batched UPDATE",
            format!("{}/s", ceiling["db_batch_cancel_per_s"]),
        ),
        (
            "ceiling: delay path (broker only)",
            if ceiling["delay_path_per_s"].is_null() {
                "not measured (native mode)".to_string()
            } else {
                format!(
                    "{}/s, drained {} ms after the last due",
                    ceiling["delay_path_per_s"], ceiling["delay_path_drain_ms"]
                )
            },
        ),
        (
            "delay path alone, arrived late by",
            if ceiling["delay_path_lateness_ms"].is_null() {
                "not measured (native mode)".to_string()
            } else {
                format!(
                    "burst p99 {} ms, steady p99 {} ms",
                    ceiling["delay_path_lateness_ms"]["burst"]["p99"],
                    ceiling["delay_path_lateness_ms"]["steady"]["p99"]
                )
            },
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
    ]
}
