//! `order-timeout-bench` (`make bench`): measures the service as a black box, against the local
//! broker (or the one `--amqp` and `--management` name) and a fresh database, then measures the machine's ceiling for the same
//! work, and refuses to report figures from a run that was wrong.
//!
//! One run:
//! 1. a fresh vhost and database; the service under test started as a child
//!    process (`serve`, sweeper off, so every cancel is the message path's);
//! 2. a short calibration of checkout speed, then every order of the run placed
//!    over HTTP by concurrent clients (checkout throughput), with deadlines
//!    planned so that all are placed before the first one falls due: a steady
//!    load (R due per second for S seconds) and, after it, a burst (N due within
//!    2 s); 10% of each paid before its deadline;
//! 3. waiting until every unpaid order is cancelled; reading the result from the
//!    database (`cancelled_at`, `pay_deadline`, stock, audit trail);
//! 4. correctness checks; then, the service stopped, the baseline: the same
//!    burst written straight into the same database and cancelled by a plain
//!    poller in the bench (every 1 s, batches of 1,000, like a cron job),
//!    measured and checked the same way; then the ceiling: a raw consume-and-ack
//!    of a plain durable queue, and a raw batched conditional UPDATE, on the
//!    same broker and database; then the table (ours beside the poller's);
//! 5. the same burst (`--tracing-burst`, no steady load) on fresh vhosts and
//!    databases, the service with tracing off, then on and exporting to a
//!    sink of the bench's: both figures side by side; and the JSON in
//!    `target/bench/latest.json`.
//!
//! `--million` is a different scenario: see [`million`].
//!
//! Modules, in the order a run uses them:
//! - this file: the command line, `main`, and the run sequence (the run, then
//!   the tracing comparison, cleanup, the JSON written at the end);
//! - [`cli`]: the bench's options;
//! - [`run`]: one run (broker, vhost, mode, database, the child `serve`);
//! - [`ctx`]: what every phase of a run needs (HTTP client, database, broker URL, settings);
//! - [`env`]: the management API, the run's database, the child process, cleanup;
//! - [`timeouts`]: the burst and steady scenario, phase by phase;
//! - [`plan`]: the orders of that scenario: which load, deadline, SKU, paid or not;
//! - [`load`]: placing and paying orders over HTTP with concurrent clients;
//! - [`drain`]: waiting until every unpaid order is cancelled, sampling as it goes;
//! - [`profile`]: what the drain samples say about where the burst's time went;
//! - [`analysis`]: what the database says about the run, and the correctness checks;
//! - [`baseline`]: the same burst through a plain database poller, for comparison;
//! - [`ceiling`]: the machine's ceiling for the same work, without the service;
//! - [`report`]: the scenario's JSON and the table printed from it;
//! - [`million`]: the `--million` scenario;
//! - [`tracing_cost`]: the same burst with tracing off and on, side by side;
//! - [`sql`]: raw reads on the bench's own database connection.

mod analysis;
mod baseline;
mod ceiling;
mod cli;
mod ctx;
mod drain;
mod env;
mod load;
mod million;
mod plan;
mod profile;
mod report;
mod run;
mod sql;
mod timeouts;
mod tracing_cost;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;
use serde_json::Value;

use cli::BenchArgs;
use order_timeout::settings::{Settings, SettingsSource};

/// Measures order-timeout (a child `serve` on a fresh vhost and database) and the machine's ceiling.
#[derive(Debug, Parser)]
#[command(name = "order-timeout-bench", version, about)]
struct Cli {
    /// The service's TOML settings file (also ORDER_TIMEOUT_CONFIG), passed on
    /// to the child; environment variables ORDER_TIMEOUT__SECTION__KEY override it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(flatten)]
    args: BenchArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let settings = match Settings::load(&SettingsSource {
        file: cli.config.clone(),
        env: None,
    }) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("order-timeout-bench: configuration error: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("order-timeout-bench: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(settings, cli.config, cli.args)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("order-timeout-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the bench; the exit code says whether the run was right.
async fn run(
    settings: Settings,
    config: Option<PathBuf>,
    args: BenchArgs,
) -> anyhow::Result<ExitCode> {
    let management = env::Management::new(&args.management)?;
    let broker = run::broker_url(&settings, &args)?;
    // A failed or skipped run must not leave an older run's figures looking current.
    if args.out.exists() {
        std::fs::remove_file(&args.out)
            .with_context(|| format!("removing {}", args.out.display()))?;
    }
    let mut res = env::Resources {
        management: Some(management),
        ..Default::default()
    };
    let outcome = tokio::select! {
        r = run::setup_and_run(&mut res, &settings, config.as_deref(), &args, &broker, &[]) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    res.cleanup().await;
    // What tracing costs: the same burst with it off and on, after the main run.
    let outcome = match outcome {
        Ok(Some(mut report)) if !args.million && args.tracing_burst > 0 => {
            let compared = tokio::select! {
                r = tracing_cost::compare(&settings, config.as_deref(), &args, &broker) => r,
                _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
            };
            compared.map(|tracing| {
                report["tracing"] = tracing;
                Some(report)
            })
        }
        other => other,
    };
    match outcome {
        Ok(Some(report)) => {
            write_report(&args.out, &report)?;
            Ok(ExitCode::SUCCESS)
        }
        // Skipped, saying why: nothing to report.
        Ok(None) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("bench FAILED, no figures reported: {e:#}");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Writes the report as pretty JSON to `out`, making its directory.
fn write_report(out: &Path, report: &Value) -> anyhow::Result<()> {
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(out, serde_json::to_string_pretty(report)? + "\n")
        .with_context(|| format!("writing {}", out.display()))?;
    println!("wrote {}", out.display());
    Ok(())
}
