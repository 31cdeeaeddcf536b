//! Start-up and the run loop: builds the shared [`Context`], binds the HTTP
//! listener (port 0 works, for tests), then runs the HTTP API, the outbox relay,
//! the router, the consumers and the sweeper until the shutdown token fires, and
//! waits for each to finish what it holds.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use sea_orm::DatabaseConnection;
use tokio::net::TcpListener;
use tokio::sync::{Notify, OnceCell};
use tokio_util::sync::CancellationToken;

use crate::amqp::management::{self, Management};
use crate::amqp::topology::{Mode, Names};
use crate::amqp::{self, consumer, relay, router};
use crate::metrics::Events;
use crate::settings::Settings;
use crate::{db, http, server, sweeper};

/// How long shutdown may take before remaining tasks are abandoned.
pub const SHUTDOWN_LIMIT: Duration = Duration::from_secs(20);

/// How long the database pools may take to close after that.
pub const CLOSE_LIMIT: Duration = Duration::from_secs(2);

/// Live state of the dependencies, for `/readyz`.
#[derive(Debug, Default)]
pub struct Health {
    /// The last database operation of a background component succeeded.
    database: AtomicBool,
    /// Per broker role, whether its connection is up.
    relay: AtomicBool,
    router: AtomicBool,
    consumer: AtomicBool,
}

impl Health {
    /// Records a broker role's connection state.
    pub fn set_broker(&self, role: &str, up: bool) {
        let flag = match role {
            "relay" => &self.relay,
            "router" => &self.router,
            _ => &self.consumer,
        };
        flag.store(up, Ordering::Relaxed);
    }
    /// `(role, connected)` for every broker role.
    pub fn broker(&self) -> [(&'static str, bool); 3] {
        [
            ("relay", self.relay.load(Ordering::Relaxed)),
            ("router", self.router.load(Ordering::Relaxed)),
            ("consumer", self.consumer.load(Ordering::Relaxed)),
        ]
    }
    /// Records whether the database answered a background component.
    pub fn set_database(&self, up: bool) {
        self.database.store(up, Ordering::Relaxed);
    }
    /// Whether the database answered last time.
    pub fn database(&self) -> bool {
        self.database.load(Ordering::Relaxed)
    }
}

/// Everything the components share.
pub struct Context {
    /// Validated settings.
    pub settings: Settings,
    /// Exchange and queue names.
    pub names: Names,
    /// The database pool of the background work: consumers, relay, sweeper.
    pub db: DatabaseConnection,
    /// The database pool of the HTTP handlers, apart from `db` so that
    /// requests cannot take the connections timeouts need.
    pub api_db: DatabaseConnection,
    /// Logs and metrics.
    pub events: Arc<Events>,
    /// Dependency state for `/readyz`.
    pub health: Health,
    /// Wakes the outbox relay when a transaction wrote a row.
    pub relay_wakeup: Notify,
    /// The delay mode, resolved once (probing the broker if `auto`).
    mode: OnceCell<(Mode, String)>,
    /// Set once the topology has been declared by this instance.
    topology: tokio::sync::watch::Sender<bool>,
}

impl Context {
    /// A context over open database pools: the background one and the API's.
    pub fn new(settings: Settings, db: DatabaseConnection, api_db: DatabaseConnection) -> Self {
        let names = Names::new(&settings.amqp.prefix);
        let health = Health::default();
        health.set_database(true);
        Self {
            settings,
            names,
            db,
            api_db,
            events: Events::new(),
            health,
            relay_wakeup: Notify::new(),
            mode: OnceCell::new(),
            topology: tokio::sync::watch::Sender::new(false),
        }
    }

    /// The delay mode in effect, resolving it on first use.
    pub async fn delay_mode(&self) -> Result<Mode, lapin::Error> {
        let (mode, _) = self
            .mode
            .get_or_try_init(|| async {
                let (mode, why) = amqp::resolve_mode(&self.settings.amqp, &self.names).await?;
                tracing::info!(mode = mode.as_str(), reason = %why, "delay mode chosen");
                Ok::<_, lapin::Error>((mode, why))
            })
            .await?;
        Ok(*mode)
    }

    /// Records that the topology is declared.
    pub fn topology_declared(&self) {
        self.topology.send_replace(true);
    }

    /// Waits until this instance has declared the topology at least once.
    pub async fn wait_topology(&self) {
        let mut rx = self.topology.subscribe();
        // The sender lives as long as the context, so this cannot fail.
        let _ = rx.wait_for(|declared| *declared).await;
    }

    /// The mode if already resolved.
    pub fn resolved_mode(&self) -> Option<Mode> {
        self.mode.get().map(|(m, _)| *m)
    }
}

/// A built application: database ready, listener bound, nothing running yet.
pub struct Application {
    listener: TcpListener,
    ctx: Arc<Context>,
}

impl Application {
    /// Connects the database, migrates unless told not to, and binds the HTTP port.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let (db, api_db) = db::connect_pools(&settings.database)
            .await
            .with_context(|| {
                format!(
                    "cannot connect to the database {}",
                    settings.database.url.redacted()
                )
            })?;
        if settings.database.migrate_on_start {
            db::migrate(&db).await.context("migrating the database")?;
        }
        let listener = TcpListener::bind(settings.http.bind)
            .await
            .with_context(|| format!("cannot listen on {} (http.bind)", settings.http.bind))?;
        tracing::info!(
            database = %settings.database.url.redacted(),
            backend = db::backend_name(&db),
            broker = %settings.amqp.url.redacted(),
            prefix = %settings.amqp.prefix,
            "order-timeout ready to start"
        );
        Ok(Self {
            listener,
            ctx: Arc::new(Context::new(settings, db, api_db)),
        })
    }

    /// The address the HTTP API listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .unwrap_or(self.ctx.settings.http.bind)
    }

    /// The shared context (tests inspect metrics and the database through it).
    pub fn context(&self) -> Arc<Context> {
        self.ctx.clone()
    }

    /// Runs every component until `shutdown` fires, then drains them.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let ctx = self.ctx;
        tracing::info!(addr = %self.listener.local_addr()?, "HTTP API listening");
        let mut tasks = tokio::task::JoinSet::new();
        tasks.spawn(server::serve(
            self.listener,
            http::router(ctx.clone()),
            ctx.settings.http.clone(),
            ctx.events.clone(),
            shutdown.clone(),
        ));
        if ctx.settings.relay.enabled {
            let (c, s) = (ctx.clone(), shutdown.clone());
            tasks.spawn(amqp::supervise(
                ctx.clone(),
                "relay",
                shutdown.clone(),
                move |conn, mode| relay::run(c.clone(), conn, mode, s.clone()),
            ));
        } else {
            // Another system publishes the timeouts; this role is no dependency.
            ctx.health.set_broker("relay", true);
        }
        let (c, s) = (ctx.clone(), shutdown.clone());
        tasks.spawn(amqp::supervise(
            ctx.clone(),
            "router",
            shutdown.clone(),
            move |conn, mode| router::run(c.clone(), conn, mode, s.clone()),
        ));
        let (c, s) = (ctx.clone(), shutdown.clone());
        tasks.spawn(amqp::supervise(
            ctx.clone(),
            "consumer",
            shutdown.clone(),
            move |conn, mode| consumer::run(c.clone(), conn, mode, s.clone()),
        ));
        if ctx.settings.sweeper.enabled {
            tasks.spawn(sweeper::run(ctx.clone(), shutdown.clone()));
        }
        tasks.spawn(relay::monitor(ctx.clone(), shutdown.clone()));
        if let Some(api) = ctx.settings.amqp.management.clone() {
            tasks.spawn(management::monitor(
                ctx.clone(),
                Management::new(api),
                shutdown.clone(),
            ));
        }

        shutdown.cancelled().await;
        tracing::info!("shutting down: finishing in-flight work");
        let drained = tokio::time::timeout(SHUTDOWN_LIMIT, async {
            while tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                limit_s = SHUTDOWN_LIMIT.as_secs(),
                "shutdown limit reached; abandoning remaining work (the broker redelivers it)"
            );
            tasks.abort_all();
        }
        // A database that stopped answering must not keep the process from
        // exiting: the pools get a moment to close, then are left behind.
        let closed = tokio::time::timeout(CLOSE_LIMIT, async {
            tokio::join!(ctx.api_db.clone().close(), ctx.db.clone().close())
        })
        .await;
        if closed.is_err() {
            tracing::warn!(
                limit_s = CLOSE_LIMIT.as_secs(),
                "the database pools did not close in time; exiting anyway"
            );
        }
        tracing::info!("stopped");
        Ok(())
    }
}
