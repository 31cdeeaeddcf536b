//! The command line: `serve`, `migrate`, `doctor`, `config`, `schedule`,
//! `demo` and `ctl`. Each parses its arguments, loads the settings (a wrong
//! value stops here, naming its key) and calls the library.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use tokio_util::sync::CancellationToken;

use super::ctl::{self, CtlAction, Target};
use super::doctor;
use crate::amqp::{self, topology::Names, wire};
use crate::app::Application;
use crate::domain::{Millis, OrderKey, TimeoutKind};
use crate::settings::{OrdersSource, Settings, SettingsSource, defaults_file, parse_window};
use crate::{db, logs};

/// Closes e-commerce orders whose deadline passed: RabbitMQ keeps the deadlines, the database decides.
#[derive(Debug, Parser)]
#[command(name = "order-timeout", version = crate::LONG_VERSION, about)]
pub struct Cli {
    /// TOML settings file (also ORDER_TIMEOUT_CONFIG); environment variables
    /// ORDER_TIMEOUT__SECTION__KEY override it.
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP API, outbox relay, router, consumers and sweeper.
    Serve {
        /// Do not run pending migrations on start.
        #[arg(long)]
        no_migrate: bool,
    },
    /// Apply, roll back or list database migrations.
    Migrate {
        /// up (default), down (roll back the last one) or status.
        #[arg(value_enum, default_value_t = MigrateAction::Up)]
        action: MigrateAction,
    },
    /// Check settings, database, broker, plugin and topology; exit non-zero on a problem.
    Doctor,
    /// Print the settings in effect (defaults, file, environment) as a TOML
    /// settings file, secrets redacted.
    Config {
        /// Print the built-in defaults instead (config/order-timeout.toml).
        #[arg(long)]
        defaults: bool,
    },
    /// Watch it work: a few orders on a temporary database, some paid, the rest
    /// cancelled live at their deadlines (needs only the broker).
    Demo,
    /// Talk to a running instance: status, pause ROLE, resume ROLE, reload, order ID.
    Ctl {
        /// The instance's API, `http://host:port` (default: from `http.bind`).
        #[arg(long)]
        url: Option<String>,
        /// An admin token (default: the first of `http.admin_tokens`).
        #[arg(long, env = "ORDER_TIMEOUT_CTL_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Print the instance's JSON answer as it is.
        #[arg(long)]
        json: bool,
        /// What to do.
        #[command(subcommand)]
        action: CtlAction,
    },
    /// Publish one timeout per the wire contract (as any checkout would).
    Schedule {
        /// The order's id.
        #[arg(long)]
        order_id: String,
        /// The kind (help: every kind, from the domain's table).
        #[arg(long, default_value = "payment", help = crate::domain::TimeoutKind::names())]
        kind: String,
        /// How long until it is due (humantime: 30s, 15m, 2h).
        #[arg(long = "in", value_name = "DURATION")]
        delay: String,
    },
}

/// `migrate` actions.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum MigrateAction {
    /// Apply every pending migration.
    Up,
    /// Roll back the most recent migration.
    Down,
    /// List applied and pending migrations.
    Status,
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Config { defaults: true } = cli.command {
        // The defaults alone: no file or environment is read, so a wrong
        // value elsewhere cannot keep the reference from printing.
        return print_out(&defaults_file());
    }
    let source = SettingsSource {
        file: cli.config.clone(),
        env: None,
    };
    if let Command::Ctl {
        url,
        token,
        json,
        action,
    } = cli.command
    {
        // A client: it needs the settings only to find the instance, and
        // must work when they no longer validate (to see a reload refused).
        return match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt.block_on(ctl::run(Target { url, token }, &source, action, json)),
            Err(e) => {
                eprintln!("order-timeout: cannot start the async runtime: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let mut settings = match Settings::load(&source) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("order-timeout: configuration error: {e}");
            return ExitCode::from(2);
        }
    };
    let demo = matches!(cli.command, Command::Demo);
    if demo {
        // The demo speaks for itself; only trouble goes to the log.
        settings.log.level = "warn,lapin=off".into();
    }
    let progress_line = demo && std::io::stdout().is_terminal() && std::io::stderr().is_terminal();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("order-timeout: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Inside the runtime: the span exporter (`tracing.*`) is a task of it.
    // Traces are for the service; the other commands log only.
    let traces = match cli.command {
        Command::Serve { .. } => settings.tracing.clone(),
        _ => crate::settings::TracingSettings {
            otlp_endpoint: String::new(),
            ..settings.tracing.clone()
        },
    };
    let installed = {
        let _entered = runtime.enter();
        logs::init(&settings.log, &traces, progress_line)
    };
    if let Err(e) = installed {
        eprintln!("order-timeout: configuration error: {e:#}");
        return ExitCode::from(2);
    }
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Serve { no_migrate } => {
                // What the layers gave, before the command line's overrides:
                // a reload compares with it.
                let started = settings.clone();
                if no_migrate {
                    settings.database.migrate_on_start = false;
                }
                serve(settings, source, started).await
            }
            Command::Migrate { action } => migrate(settings, action).await,
            Command::Doctor => Ok(doctor::run(&settings).await),
            Command::Config { .. } => Ok(print_out(&settings.to_toml())),
            Command::Demo => super::demo::run(settings).await,
            Command::Ctl { .. } => unreachable!("ctl returned before the settings were loaded"),
            Command::Schedule {
                order_id,
                kind,
                delay,
            } => schedule(settings, &order_id, &kind, &delay).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("order-timeout: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Writes `text` to standard output; a closed pipe (`| head`) is an error
/// said in one line, not a panic.
fn print_out(text: &str) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("order-timeout: cannot write to standard output: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(
    settings: Settings,
    source: SettingsSource,
    started: Settings,
) -> anyhow::Result<ExitCode> {
    // Before anything slow: from here on SIGHUP reloads instead of ending
    // the process, as it would by default.
    let hangups = hangups()?;
    let app = Application::build_reloading(settings, source, started).await?;
    let shutdown = CancellationToken::new();
    let trigger = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        trigger.cancel();
    });
    tokio::spawn(reload_on_hangup(hangups, app.context()));
    app.run(shutdown).await?;
    Ok(ExitCode::SUCCESS)
}

/// SIGHUP, as a stream of signals.
#[cfg(unix)]
type Hangups = tokio::signal::unix::Signal;
#[cfg(not(unix))]
type Hangups = ();

#[cfg(unix)]
fn hangups() -> anyhow::Result<Hangups> {
    use tokio::signal::unix::{SignalKind, signal};
    Ok(signal(SignalKind::hangup())?)
}

#[cfg(not(unix))]
fn hangups() -> anyhow::Result<Hangups> {
    Ok(())
}

/// Reloads the settings on every SIGHUP (`systemctl reload`); what a
/// reload did or refused is logged and counted by the reload itself.
#[cfg(unix)]
async fn reload_on_hangup(mut hangups: Hangups, ctx: std::sync::Arc<crate::context::Context>) {
    while hangups.recv().await.is_some() {
        let ctx = ctx.clone();
        let _ = tokio::task::spawn_blocking(move || ctx.reload()).await;
    }
}

#[cfg(not(unix))]
async fn reload_on_hangup(_: Hangups, _: std::sync::Arc<crate::context::Context>) {}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

async fn migrate(settings: Settings, action: MigrateAction) -> anyhow::Result<ExitCode> {
    let conn = db::connect(&settings.database).await?;
    // A shop's database gets only the service's own `order_timeout_*` tables.
    let owned = settings.mapping.source == OrdersSource::Owned;
    match action {
        MigrateAction::Up => {
            db::migrate_for(&conn, owned, crate::app::migration_lock(&settings)).await?;
            println!("migrations applied");
        }
        MigrateAction::Down => {
            db::migrate_down_one(&conn, owned, crate::app::migration_lock(&settings)).await?;
            println!("rolled back the last migration");
        }
        MigrateAction::Status => {
            let (applied, pending) = db::migration_status(&conn, owned).await?;
            for name in applied {
                println!("applied  {name}");
            }
            for name in pending {
                println!("pending  {name}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn schedule(
    settings: Settings,
    order_id: &str,
    kind: &str,
    delay: &str,
) -> anyhow::Result<ExitCode> {
    // Any id the wire carries: the service's own positive integers, or a
    // mapped table's integers, UUIDs or text (the consumer checks it).
    let order_id = OrderKey::parse(order_id).map_err(|e| anyhow::anyhow!("--order-id: {e}"))?;
    let kind: TimeoutKind = kind
        .parse()
        .map_err(|e: String| anyhow::anyhow!("--kind: {e}"))?;
    let delay: Duration = parse_window("--in", delay)?;
    let names = Names::new(&settings.amqp.prefix);
    let conn = amqp::connect(&settings.amqp, "schedule").await?;
    let channel = conn.create_channel().await?;
    channel.confirm_select(Default::default()).await?;
    let now = Millis::now();
    let message_id = format!("{order_id}:{kind}:cli:{}", uuid::Uuid::new_v4().simple());
    let message = wire::TimeoutMessage {
        order_id,
        kind,
        due_at: Some(now.plus(delay)),
    };
    let properties = wire::properties(&message_id, now, delay.as_millis() as u64, &[]);
    let published = amqp::publish_confirmed(
        &channel,
        names.entry(),
        kind.as_str(),
        &wire::encode(&message),
        properties,
    )
    .await;
    let _ = conn.close(200, "done".into()).await;
    published.map_err(|e| {
        anyhow::anyhow!(
            "{e} (does exchange '{}' exist? `order-timeout serve` declares it)",
            names.entry()
        )
    })?;
    println!(
        "scheduled {kind} timeout for order {}, due {}",
        message.order_id,
        now.plus(delay).to_rfc3339()
    );
    Ok(ExitCode::SUCCESS)
}
