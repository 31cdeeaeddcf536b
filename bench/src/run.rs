//! One run of the bench: the broker under test (`--amqp`, `--management`), a
//! fresh vhost and database, the delay mode chosen as the service chooses it
//! against what that broker offers, the service under test started as a child
//! `serve` on them, and the chosen scenario. `main` runs it, then the tracing
//! comparison, cleans up whatever happened, and writes the JSON only when the
//! run was right.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::cli::{BenchArgs, BenchDb, BenchMode};
use crate::ctx::RunCtx;
use crate::env::{self, BenchDatabase, Management, Resources, Service};
use crate::{million, timeouts};
use order_timeout::amqp::topology::{Mode, Names};
use order_timeout::amqp::{choose_mode, probe};
use order_timeout::settings::{AmqpSettings, DelayMode, Secret, Settings, redact_url};

/// The broker under test: `--amqp`, else the service's `amqp.url` (one node:
/// the bench puts the run's vhost into it).
pub(crate) fn broker_url(settings: &Settings, args: &BenchArgs) -> anyhow::Result<url::Url> {
    let (raw, from) = match &args.amqp {
        Some(raw) => (raw.as_str(), "--amqp"),
        None => (settings.amqp.url.expose(), "amqp.url"),
    };
    url::Url::parse(raw)
        .with_context(|| format!("{from} '{}' is not one broker URL", redact_url(raw)))
}

/// The delay mode to run for `--mode`, with the reason in words, decided as
/// the service decides `amqp.delay_mode` (its own probe and choice, on the
/// run's vhost of the broker under test); `None`, having said why, when the
/// broker lacks the mode asked for and nothing is to be measured.
async fn choose_run_mode(
    asked: BenchMode,
    million: bool,
    amqp: &AmqpSettings,
    management: &Management,
) -> anyhow::Result<Option<(Mode, String)>> {
    let delay_mode = match asked {
        BenchMode::Ttl => return Ok(Some((Mode::Ttl, "--mode ttl".into()))),
        BenchMode::Plugin => {
            if management.plugin_available().await? {
                return Ok(Some((Mode::Plugin, "--mode plugin".into())));
            }
            println!(
                "SKIPPED plugin mode: the broker offers no x-delayed-message exchange type \
                 (rabbitmq_delayed_message_exchange is not enabled, or cannot be: RabbitMQ 4.3 \
                 has none); nothing was measured"
            );
            return Ok(None);
        }
        BenchMode::Native => DelayMode::Native,
        BenchMode::Auto => DelayMode::Auto,
    };
    let amqp = AmqpSettings {
        delay_mode,
        ..amqp.clone()
    };
    let offers = probe(&amqp, &Names::new(&amqp.prefix))
        .await
        .context("probing the broker for the delay modes it offers")?;
    if let (BenchMode::Native, Err(why)) = (asked, &offers.native) {
        println!(
            "SKIPPED native mode: the broker does not hold quorum-queue messages until a \
             delivery time ({why}); nothing was measured"
        );
        return Ok(None);
    }
    if asked == BenchMode::Native {
        return Ok(Some((
            Mode::Native,
            "--mode native: the broker holds quorum-queue messages until a delivery time".into(),
        )));
    }
    let (mode, why) = choose_mode(delay_mode, &offers);
    if million && mode == Mode::Plugin && asked == BenchMode::Auto {
        // A million timers: the plugin's table is not meant for millions; it is
        // measured only when asked for.
        return Ok(Some((
            Mode::Ttl,
            format!("--million with --mode auto: ttl, not the plugin it would choose ({why})"),
        )));
    }
    Ok(Some((mode, why)))
}
/// Creates the vhost, chooses the mode on it, creates the database and the
/// child, then runs the chosen scenario; `None` when the mode is skipped.
pub(crate) async fn setup_and_run(
    res: &mut Resources,
    settings: &Settings,
    config: Option<&Path>,
    args: &BenchArgs,
    broker: &url::Url,
    extra_env: &[(String, String)],
) -> anyhow::Result<Option<Value>> {
    let tag = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
    let vhost = format!("ot-bench-{tag}");
    let management = res.management.clone().context("management API")?;
    let overview = management.get("/overview").await?;
    let version = overview["rabbitmq_version"]
        .as_str()
        .unwrap_or("?")
        .to_string();
    management.create_vhost(&vhost).await?;
    res.vhost = Some(vhost.clone());
    let mut amqp_url = broker.clone();
    amqp_url.set_path(&format!("/{vhost}"));
    let amqp_url = amqp_url.to_string();
    let amqp = AmqpSettings {
        url: Secret::new(amqp_url.clone()),
        ..settings.amqp.clone()
    };
    let Some((mode, mode_why)) =
        choose_run_mode(args.mode, args.million, &amqp, &management).await?
    else {
        return Ok(None);
    };
    res.plugin_timers = mode == Mode::Plugin;
    let database = match args.db {
        BenchDb::Postgres => BenchDatabase::postgres(&args.postgres_admin, &tag).await?,
        BenchDb::Sqlite => BenchDatabase::sqlite(&tag),
    };
    let db_url = database.url().to_string();
    let db_kind = database.kind();
    res.database = Some(database);
    let broker_node = format!(
        "{}:{}",
        broker.host_str().unwrap_or("?"),
        broker.port().unwrap_or(5672)
    );
    println!(
        "bench: RabbitMQ {version} at {broker_node}, mode {} ({mode_why}), database {db_kind}, vhost {vhost}",
        mode.as_str()
    );

    let child = ChildEnv {
        port: env::free_port()?,
        // The bench calls the API as production does, with a bearer token: a
        // random admin token of this run's own.
        token: uuid::Uuid::new_v4().simple().to_string(),
        db_url,
        amqp_url: amqp_url.clone(),
        management_url: args.management.clone(),
        mode,
        tag: &tag,
        extra: extra_env,
    };
    let http = start_service(res, settings, config, args, &child).await?;
    let db = res.database.as_ref().context("database")?.connect().await?;
    let broker_pid = broker_pid(&management).await;
    let ctx = RunCtx {
        http,
        db,
        amqp_url,
        management,
        vhost,
        mode: mode.as_str().to_string(),
        mode_why,
        broker: serde_json::json!({ "version": version, "node": broker_node }),
        broker_pid,
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
    Ok(Some(report))
}

/// The operating-system pid of the broker's node, when the management API
/// tells it and it runs on this machine: its CPU is then told apart from
/// other brokers' (a 3.10 and a 4.3 node side by side).
async fn broker_pid(management: &Management) -> Option<u32> {
    let nodes = management.get("/nodes").await.ok()?;
    let pid = nodes.as_array()?.first()?["os_pid"]
        .as_str()?
        .parse::<u32>()
        .ok()?;
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    (comm.trim() == "beam.smp").then_some(pid)
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
    /// The management API of the broker under test (`--management`).
    management_url: String,
    /// The delay mode chosen for the run (never `auto`: resolved by the bench).
    mode: Mode,
    /// The run's random tag (its instance name).
    tag: &'a str,
    /// Settings of this run only, last (the tracing comparison's).
    extra: &'a [(String, String)],
}

impl ChildEnv<'_> {
    /// The environment variables the child is started with.
    fn vars(&self, settings: &Settings, args: &BenchArgs) -> Vec<(String, String)> {
        let mut vars = vec![
            ("ORDER_TIMEOUT__HTTP__ADMIN_TOKENS", self.token.clone()),
            ("ORDER_TIMEOUT__DATABASE__URL", self.db_url.clone()),
            ("ORDER_TIMEOUT__AMQP__URL", self.amqp_url.clone()),
            (
                "ORDER_TIMEOUT__AMQP__DELAY_MODE",
                self.mode.as_str().to_string(),
            ),
            // Its gauges and `doctor` read the broker under test, not the
            // default of amqp.url's host on port 15672.
            (
                "ORDER_TIMEOUT__AMQP__MANAGEMENT_URL",
                self.management_url.clone(),
            ),
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
        vars.into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .chain(self.extra.iter().cloned())
            .collect()
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
    let service = res.service.insert(Service::start(
        args.service_bin.as_deref(),
        config,
        &service_env,
        child.port,
        log,
    )?);
    println!(
        "bench: service under test pid {} on {} (log {})",
        service.pid(),
        service.base,
        service.log.display()
    );
    service.wait_ready(&http, Duration::from_secs(60)).await?;
    // The service's own word for the mode it runs, from /readyz.
    let ready: Value = http
        .get(format!("{}/readyz", service.base))
        .send()
        .await?
        .json()
        .await?;
    let running = ready["broker"]["mode"].as_str().unwrap_or("unresolved");
    if running != child.mode.as_str() {
        bail!(
            "the service runs in {running} mode (its /readyz), the bench asked for {}",
            child.mode.as_str()
        );
    }
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
