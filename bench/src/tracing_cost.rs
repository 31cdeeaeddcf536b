//! What traces cost (`tracing.*`): the same burst run twice on fresh vhosts
//! and databases, the service started with tracing off, then on and
//! exporting every span to a sink the bench runs (an OTLP/HTTP receiver that
//! decodes and counts what it is sent, as a collector would). Each run is a
//! whole run of [`crate::timeouts`], checked for correctness like the main
//! one; the figures of both go side by side into the report's `tracing`.
//! With `--tracing-baseline`, a build of the service without any tracing
//! code (an earlier release) runs the same burst first: what tracing off
//! costs is off against that baseline. `--tracing-rounds` runs the bursts in
//! turn that many times and keeps each figure's median.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context as _;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message as _;
use serde_json::{Value, json};

use crate::cli::BenchArgs;
use crate::env::Resources;
use order_timeout::settings::Settings;

/// What the sink received.
#[derive(Clone, Default)]
struct Sink {
    requests: Arc<AtomicU64>,
    spans: Arc<AtomicU64>,
}

impl Sink {
    /// Listens on 127.0.0.1 (any free port); returns the base URL.
    async fn start(&self) -> anyhow::Result<String> {
        let app = axum::Router::new()
            .route("/v1/traces", post(receive))
            .with_state(self.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(format!("http://{addr}"))
    }
}

/// Decodes one export request and counts its spans.
async fn receive(State(sink): State<Sink>, body: Bytes) -> Vec<u8> {
    sink.requests.fetch_add(1, Ordering::Relaxed);
    if let Ok(request) = ExportTraceServiceRequest::decode(body) {
        let spans: usize = request
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .map(|s| s.spans.len())
            .sum();
        sink.spans.fetch_add(spans as u64, Ordering::Relaxed);
    }
    Vec::new()
}

/// The figures of one run that tracing could change.
fn figures(report: &Value) -> Value {
    json!({
        "checkout_per_s": report["checkout_per_s"],
        "cpu_ms_per_checkout": report["cpu_ms_per_checkout"],
        "burst_cancels_per_s": report["burst_cancels_per_s"],
        "burst_lateness_p99_ms": report["lateness_ms"]["burst"]["p99"],
        "cpu_ms_per_cancel": report["cpu_ms_per_cancel"],
        "service_cpu_s": report["service_cpu_s"],
        "service_peak_rss_mb": report["service_peak_rss_mb"],
    })
}

/// The figures [`figures`] keeps, in the order they are printed.
const KEYS: [&str; 6] = [
    "checkout_per_s",
    "cpu_ms_per_checkout",
    "burst_cancels_per_s",
    "burst_lateness_p99_ms",
    "cpu_ms_per_cancel",
    "service_cpu_s",
];

/// One of the comparison's services: the baseline (built without tracing),
/// tracing off, tracing on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Leg {
    Baseline,
    Off,
    On,
}

impl Leg {
    fn label(self) -> &'static str {
        match self {
            Leg::Baseline => "baseline",
            Leg::Off => "off",
            Leg::On => "on",
        }
    }
}

/// Each figure's median over `runs` (the lower middle for an even count).
fn medians(runs: &[Value]) -> Value {
    let mut out = serde_json::Map::new();
    for key in KEYS.iter().chain(["service_peak_rss_mb"].iter()) {
        let mut values: Vec<&Value> = runs
            .iter()
            .map(|r| &r[*key])
            .filter(|v| v.is_number())
            .collect();
        values
            .sort_by(|a, b| f64::total_cmp(&a.as_f64().unwrap_or(0.0), &b.as_f64().unwrap_or(0.0)));
        let median = match values.len() {
            0 => Value::Null,
            n => values[(n - 1) / 2].clone(),
        };
        out.insert((*key).to_string(), median);
    }
    Value::Object(out)
}

/// `a / b` per figure, to two places.
fn ratios(a: &Value, b: &Value) -> Value {
    let mut out = serde_json::Map::new();
    for key in KEYS {
        let ratio = match (a[key].as_f64(), b[key].as_f64()) {
            (Some(a), Some(b)) if b > 0.0 => json!((a / b * 100.0).round() / 100.0),
            _ => Value::Null,
        };
        out.insert(key.to_string(), ratio);
    }
    Value::Object(out)
}

/// Runs the burst of `--tracing-burst` on the baseline (when
/// `--tracing-baseline` names one), with tracing off, then on, the three in
/// turn `--tracing-rounds` times; the comparison of the medians, printed and
/// as the report's `tracing`.
pub(crate) async fn compare(
    settings: &Settings,
    config: Option<&Path>,
    args: &BenchArgs,
    broker: &url::Url,
) -> anyhow::Result<Value> {
    let pair_args = BenchArgs {
        burst: args.tracing_burst,
        steady_secs: 0,
        out: args.out.with_file_name("tracing-run.json"),
        ..args.clone()
    };
    let sink = Sink::default();
    let endpoint = sink.start().await?;
    let mut legs = Vec::new();
    if args.tracing_baseline.is_some() {
        legs.push(Leg::Baseline);
    }
    legs.extend([Leg::Off, Leg::On]);
    let mut runs: Vec<(Leg, Value)> = Vec::new();
    for round in 1..=args.tracing_rounds {
        for &leg in &legs {
            let label = leg.label();
            println!(
                "\nbench: tracing {label} (round {round} of {}), the same burst of {} orders",
                args.tracing_rounds, pair_args.burst
            );
            let extra = match leg {
                Leg::On => vec![(
                    "ORDER_TIMEOUT__TRACING__OTLP_ENDPOINT".to_string(),
                    endpoint.clone(),
                )],
                Leg::Baseline | Leg::Off => Vec::new(),
            };
            let leg_args = BenchArgs {
                service_bin: match leg {
                    Leg::Baseline => args.tracing_baseline.clone(),
                    Leg::Off | Leg::On => args.service_bin.clone(),
                },
                ..pair_args.clone()
            };
            let mut res = Resources {
                management: Some(crate::env::Management::new(&args.management)?),
                ..Default::default()
            };
            let report =
                crate::run::setup_and_run(&mut res, settings, config, &leg_args, broker, &extra)
                    .await;
            res.cleanup().await;
            let report = report?.with_context(|| format!("the tracing-{label} run was skipped"))?;
            runs.push((leg, figures(&report)));
        }
    }
    let of = |leg: Leg| -> Vec<Value> {
        runs.iter()
            .filter(|(l, _)| *l == leg)
            .map(|(_, f)| f.clone())
            .collect()
    };
    let (off, on) = (medians(&of(Leg::Off)), medians(&of(Leg::On)));
    let baseline = args
        .tracing_baseline
        .as_ref()
        .map(|_| medians(&of(Leg::Baseline)));
    let spans = sink.spans.load(Ordering::Relaxed);
    let comparison = json!({
        "burst": pair_args.burst,
        "rounds": args.tracing_rounds,
        "baseline_binary": args.tracing_baseline.as_ref().map(|p| p.display().to_string()),
        "baseline": baseline,
        "off": off,
        "on": on,
        "off_over_baseline": baseline.as_ref().map(|b| ratios(&off, b)),
        "on_over_off": ratios(&on, &off),
        "runs": {
            "baseline": of(Leg::Baseline),
            "off": of(Leg::Off),
            "on": of(Leg::On),
        },
        "sink": {
            "export_requests": sink.requests.load(Ordering::Relaxed),
            "spans": spans,
        },
    });
    print_comparison(&comparison);
    if spans == 0 {
        anyhow::bail!("tracing on exported no span to the bench's sink");
    }
    Ok(comparison)
}

fn print_comparison(c: &Value) {
    println!(
        "\ntracing, burst of {}, medians of {} round(s) (on: {} spans to the sink in {} requests)",
        c["burst"], c["rounds"], c["sink"]["spans"], c["sink"]["export_requests"]
    );
    if let Some(binary) = c["baseline_binary"].as_str() {
        println!("baseline: {binary}, built without tracing");
    }
    let row = |label: &str, f: &Value| {
        let cells: Vec<String> = KEYS.iter().map(|k| f[*k].to_string()).collect();
        println!(
            "{:<18} {:>12} {:>16} {:>16} {:>13} {:>18} {:>15}",
            label, cells[0], cells[1], cells[2], cells[3], cells[4], cells[5]
        );
    };
    println!(
        "{:<18} {:>12} {:>16} {:>16} {:>13} {:>18} {:>15}",
        "tracing",
        "checkout/s",
        "CPU ms/checkout",
        "burst cancels/s",
        "burst p99 ms",
        "CPU ms per cancel",
        "service CPU s"
    );
    for label in ["baseline", "off", "on", "off_over_baseline", "on_over_off"] {
        if !c[label].is_null() {
            row(label, &c[label]);
        }
    }
    if c["rounds"].as_u64().unwrap_or(1) > 1 {
        println!("each run:");
        for leg in ["baseline", "off", "on"] {
            for (i, run) in c["runs"][leg].as_array().into_iter().flatten().enumerate() {
                row(&format!("  {leg} {}", i + 1), run);
            }
        }
    }
}
