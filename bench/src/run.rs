//! One run of the bench: the delay mode chosen against what the broker offers, a
//! fresh vhost and database, the service under test started as a child `serve`
//! on them, the chosen scenario, cleanup whatever happened, and the JSON written
//! only when the run was right.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use serde_json::Value;

use crate::cli::{BenchArgs, BenchDb, BenchMode};
use crate::ctx::RunCtx;
use crate::env::{self, BenchDatabase, Management, Resources, Service};
use crate::{million, timeouts};
use order_timeout::settings::Settings;

/// Runs the bench; the exit code says whether the run was right.
pub async fn run(
    settings: Settings,
    config: Option<PathBuf>,
    args: BenchArgs,
) -> anyhow::Result<ExitCode> {
    let management = Management::new(&args.management)?;
    let plugin = management.plugin_available().await?;
    let Some(mode) = choose_mode(args.mode, plugin, args.million) else {
        return Ok(ExitCode::SUCCESS);
    };
    // A failed run must not leave an older run's figures looking current.
    if args.out.exists() {
        std::fs::remove_file(&args.out)
            .with_context(|| format!("removing {}", args.out.display()))?;
    }
    let mut res = Resources {
        management: Some(management),
        ..Default::default()
    };
    let outcome = tokio::select! {
        r = setup_and_run(&mut res, &settings, config.as_deref(), &args, mode) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    res.cleanup().await;
    match outcome {
        Ok(report) => {
            write_report(&args.out, &report)?;
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("bench FAILED, no figures reported: {e:#}");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// The delay mode to run (`ttl` or `plugin`) for `--mode` when the broker does
/// or does not offer the plugin; `None` when nothing is to be measured.
fn choose_mode(asked: BenchMode, plugin: bool, million: bool) -> Option<&'static str> {
    match (asked, plugin, million) {
        // A million timers: ttl unless plugin mode is asked for (the plugin's
        // table is not meant for millions; the figure says what it costs).
        (BenchMode::Ttl, _, _) | (BenchMode::Auto, _, true) => Some("ttl"),
        (BenchMode::Plugin | BenchMode::Auto, true, _) => Some("plugin"),
        (BenchMode::Plugin, false, _) => {
            println!(
                "SKIPPED plugin mode: the broker offers no x-delayed-message exchange type \
                 (rabbitmq_delayed_message_exchange is not enabled); nothing was measured"
            );
            None
        }
        (BenchMode::Auto, false, _) => {
            println!(
                "plugin mode skipped: the broker offers no x-delayed-message exchange type; \
                 running ttl mode"
            );
            Some("ttl")
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

/// Creates the vhost, database and child, then runs the chosen scenario.
async fn setup_and_run(
    res: &mut Resources,
    settings: &Settings,
    config: Option<&Path>,
    args: &BenchArgs,
    mode: &str,
) -> anyhow::Result<Value> {
    let tag = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
    let vhost = format!("ot-bench-{tag}");
    let management = res.management.clone().context("management API")?;
    management.create_vhost(&vhost).await?;
    res.vhost = Some(vhost.clone());
    let database = match args.db {
        BenchDb::Postgres => BenchDatabase::postgres(&args.postgres_admin, &tag).await?,
        BenchDb::Sqlite => BenchDatabase::sqlite(&tag),
    };
    let db_url = database.url().to_string();
    let db_kind = database.kind();
    res.database = Some(database);
    let mut amqp_url = url::Url::parse(settings.amqp.url.expose()).context("amqp.url")?;
    amqp_url.set_path(&format!("/{vhost}"));
    let amqp_url = amqp_url.to_string();
    println!("bench: mode {mode}, database {db_kind}, vhost {vhost}");

    let child = ChildEnv {
        port: env::free_port()?,
        // The bench calls the API as production does, with a bearer token: a
        // random admin token of this run's own.
        token: uuid::Uuid::new_v4().simple().to_string(),
        db_url,
        amqp_url: amqp_url.clone(),
        mode,
        tag: &tag,
    };
    let http = start_service(res, settings, config, args, &child).await?;
    let db = res.database.as_ref().context("database")?.connect().await?;
    let ctx = RunCtx {
        http,
        db,
        amqp_url,
        management,
        vhost,
        mode: mode.to_string(),
        db_kind: db_kind.to_string(),
        prefetch: settings.amqp.prefetch,
        batch_size: settings.consumer.batch_size,
        prefix: settings.amqp.prefix.clone(),
    };
    let report = if args.million {
        million::run(&ctx, res, args).await?
    } else {
        timeouts::timeouts(&ctx, res, args).await?
    };
    ctx.db.clone().close().await.ok();
    Ok(report)
}

/// What the child `serve` is told of this run, on top of its settings.
struct ChildEnv<'a> {
    /// The port its API binds.
    port: u16,
    /// Its admin bearer token, this run's own.
    token: String,
    /// The run's fresh database.
    db_url: String,
    /// The broker URL of the run's vhost.
    amqp_url: String,
    /// `ttl` or `plugin`.
    mode: &'a str,
    /// The run's random tag (its instance name).
    tag: &'a str,
}

impl ChildEnv<'_> {
    /// The environment variables the child is started with.
    fn vars(&self, settings: &Settings, args: &BenchArgs) -> Vec<(String, String)> {
        let mut vars = vec![
            ("ORDER_TIMEOUT__HTTP__ADMIN_TOKENS", self.token.clone()),
            ("ORDER_TIMEOUT__DATABASE__URL", self.db_url.clone()),
            ("ORDER_TIMEOUT__AMQP__URL", self.amqp_url.clone()),
            ("ORDER_TIMEOUT__AMQP__DELAY_MODE", self.mode.to_string()),
            (
                "ORDER_TIMEOUT__AMQP__INSTANCE",
                format!("bench-{}", self.tag),
            ),
            (
                "ORDER_TIMEOUT__HTTP__BIND",
                format!("127.0.0.1:{}", self.port),
            ),
            // Every cancel must be the message path's, so the sweeper stays off.
            ("ORDER_TIMEOUT__SWEEPER__ENABLED", "false".to_string()),
            // The same values the ceiling uses, whichever layer set them.
            (
                "ORDER_TIMEOUT__AMQP__PREFETCH",
                settings.amqp.prefetch.to_string(),
            ),
            (
                "ORDER_TIMEOUT__CONSUMER__BATCH_SIZE",
                settings.consumer.batch_size.to_string(),
            ),
            // Room for every client and the progress queries: the bench measures
            // throughput, not the overload refusal.
            (
                "ORDER_TIMEOUT__HTTP__MAX_IN_FLIGHT",
                (args.clients + 16)
                    .max(settings.http.max_in_flight)
                    .to_string(),
            ),
        ];
        if let Some(level) = &args.service_log_level {
            vars.push(("ORDER_TIMEOUT__LOG__LEVEL", level.clone()));
        }
        vars.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }
}

/// Starts the service under test and waits until it is ready; returns the HTTP
/// client the run calls it with.
async fn start_service(
    res: &mut Resources,
    settings: &Settings,
    config: Option<&Path>,
    args: &BenchArgs,
    child: &ChildEnv<'_>,
) -> anyhow::Result<reqwest::Client> {
    let service_env = child.vars(settings, args);
    let log = args
        .out
        .parent()
        .unwrap_or(Path::new("."))
        .join("service.log");
    let http = api_client(&child.token, args.clients)?;
    let service = res
        .service
        .insert(Service::start(config, &service_env, child.port, log)?);
    println!(
        "bench: service under test pid {} on {} (log {})",
        service.pid(),
        service.base,
        service.log.display()
    );
    service.wait_ready(&http, Duration::from_secs(60)).await?;
    Ok(http)
}

/// The HTTP client for the service's API: the run's bearer token on every
/// request, an idle connection kept per client.
fn api_client(token: &str, clients: usize) -> anyhow::Result<reqwest::Client> {
    let mut authorization = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))?;
    authorization.set_sensitive(true);
    Ok(reqwest::Client::builder()
        .default_headers(
            [(reqwest::header::AUTHORIZATION, authorization)]
                .into_iter()
                .collect(),
        )
        .pool_max_idle_per_host(clients.max(1))
        .timeout(Duration::from_secs(60))
        .build()?)
}
