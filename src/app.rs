//! Start-up and the run loop: builds the shared [`Context`], binds the HTTP
//! listener (port 0 works, for tests), then runs the HTTP API, the outbox relay,
//! the router, the consumers and the sweeper until the shutdown token fires, and
//! waits for each to finish what it holds.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::amqp::management::{self, Management};
use crate::amqp::{self, consumer, deferral, relay, router};
use crate::context::{Context, Role};
use crate::orders::Orders;
use crate::settings::{Settings, SettingsSource};
use crate::zone_check;
use crate::{db, gauges, http, pausing, retention, server, sweeper};

/// How long shutdown may take before remaining tasks are abandoned.
pub const SHUTDOWN_LIMIT: Duration = Duration::from_secs(20);

/// How long the database pools may take to close after that.
pub const CLOSE_LIMIT: Duration = Duration::from_secs(2);

/// How long start-up and `migrate` wait for another instance's migration,
/// and how they say they are waiting, or that a newer release migrated.
pub fn migration_lock(settings: &Settings) -> db::MigrationLock {
    db::MigrationLock {
        wait: settings.database.migrate_lock_wait,
        waiting: crate::telemetry::Telemetry::migration_waiting,
        newer: crate::telemetry::Telemetry::schema_newer,
    }
}

/// A built application: database ready, listener bound, nothing running yet.
pub struct Application {
    listener: TcpListener,
    ctx: Arc<Context>,
}

impl Application {
    /// Connects the database, migrates unless told not to, and binds the HTTP
    /// port. Its settings cannot be reloaded: see [`Application::build_reloading`].
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        Self::build_with(settings, None).await
    }

    /// As [`Application::build`], with settings a reload reads again from
    /// `source`, whose layers gave `started` (`settings` is that with any
    /// command-line override applied).
    pub async fn build_reloading(
        settings: Settings,
        source: SettingsSource,
        started: Settings,
    ) -> anyhow::Result<Self> {
        Self::build_with(settings, Some((source, started))).await
    }

    async fn build_with(
        settings: Settings,
        reload: Option<(SettingsSource, Settings)>,
    ) -> anyhow::Result<Self> {
        let (db, api_db) = db::connect_pools(&settings.database)
            .await
            .with_context(|| {
                format!(
                    "cannot connect to the database {}",
                    settings.database.url.redacted()
                )
            })?;
        let orders = Orders::load(&settings, &db)
            .await
            .context("the orders mapping does not match the database")?;
        if settings.database.migrate_on_start {
            db::migrate_for(&db, orders.is_owned(), migration_lock(&settings))
                .await
                .context("migrating the database")?;
        }
        let listener = TcpListener::bind(settings.http.bind)
            .await
            .with_context(|| format!("cannot listen on {} (http.bind)", settings.http.bind))?;
        let backend = db::backend_name(&db);
        let mut ctx = Context::new(settings, db, api_db).with_orders(orders);
        if let Some((source, started)) = reload {
            ctx = ctx.with_reload_source(source, started);
        }
        let ctx = Arc::new(ctx);
        // Before any role runs: a role paused for every instance starts
        // paused here too, whether this is a restart or a new instance.
        pausing::load(&ctx).await.context(
            "reading the shared pauses (order_timeout_pauses; `order-timeout migrate` creates it)",
        )?;
        // Likewise a kind read in a zone not yet confirmed is held.
        zone_check::load(&ctx)
            .await
            .context("reading the time zone checks (order_timeout_zone_checks)")?;
        let s = &ctx.settings;
        ctx.telemetry.starting(
            &s.database.url.redacted(),
            backend,
            &s.amqp.url.redacted(),
            &s.amqp.prefix,
        );
        Ok(Self { listener, ctx })
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
        ctx.telemetry
            .listening(&self.listener.local_addr()?.to_string());
        let mut tasks = tokio::task::JoinSet::new();
        tasks.spawn(server::serve(
            self.listener,
            http::router(ctx.clone()),
            ctx.settings.http.clone(),
            ctx.telemetry.clone(),
            shutdown.clone(),
        ));
        if ctx.settings.relay.enabled {
            let (c, s) = (ctx.clone(), shutdown.clone());
            tasks.spawn(amqp::supervise(
                ctx.clone(),
                Role::Relay,
                shutdown.clone(),
                move |conn, mode| relay::run(c.clone(), conn, mode, s.clone()),
            ));
        } else {
            // Another system publishes the timeouts; this role is no dependency.
            ctx.health.set_broker(Role::Relay, true);
        }
        let (c, s) = (ctx.clone(), shutdown.clone());
        tasks.spawn(amqp::supervise(
            ctx.clone(),
            Role::Router,
            shutdown.clone(),
            move |conn, mode| router::run(c.clone(), conn, mode, s.clone()),
        ));
        let (c, s) = (ctx.clone(), shutdown.clone());
        tasks.spawn(amqp::supervise(
            ctx.clone(),
            Role::Consumer,
            shutdown.clone(),
            move |conn, mode| consumer::run(c.clone(), conn, mode, s.clone()),
        ));
        let (c, s) = (ctx.clone(), shutdown.clone());
        tasks.spawn(amqp::supervise(
            ctx.clone(),
            Role::Deferrer,
            shutdown.clone(),
            move |conn, mode| deferral::run(c.clone(), conn, mode, s.clone()),
        ));
        if ctx.settings.sweeper.enabled {
            tasks.spawn(sweeper::run(ctx.clone(), shutdown.clone()));
        }
        tasks.spawn(relay::monitor(ctx.clone(), shutdown.clone()));
        tasks.spawn(gauges::run(ctx.clone(), shutdown.clone()));
        tasks.spawn(pausing::follow(ctx.clone(), shutdown.clone()));
        tasks.spawn(zone_check::run(ctx.clone(), shutdown.clone()));
        tasks.spawn(crate::shadow::run(ctx.clone(), shutdown.clone()));
        if ctx.orders.is_owned() {
            // Only the service's own checkouts write idempotency keys.
            tasks.spawn(http::idempotency::clean(ctx.clone(), shutdown.clone()));
        } else {
            // Only a mapped table's transitions write the audit trail.
            tasks.spawn(retention::run(ctx.clone(), shutdown.clone()));
        }
        if let Some(api) = ctx.settings.amqp.management.clone() {
            tasks.spawn(management::monitor(
                ctx.clone(),
                Management::new(api),
                shutdown.clone(),
            ));
        }

        shutdown.cancelled().await;
        ctx.telemetry.shutting_down();
        let drained = tokio::time::timeout(SHUTDOWN_LIMIT, async {
            while tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            ctx.telemetry.shutdown_abandoned(SHUTDOWN_LIMIT);
            tasks.abort_all();
        }
        // A database that stopped answering must not keep the process from
        // exiting: the pools get a moment to close, then are left behind.
        let closed = tokio::time::timeout(CLOSE_LIMIT, async {
            tokio::join!(ctx.api_db.clone().close(), ctx.db.clone().close())
        })
        .await;
        if closed.is_err() {
            ctx.telemetry.pools_left_open(CLOSE_LIMIT);
        }
        // The spans of the drain too: what is batched goes to the collector
        // before the process exits.
        crate::traces::flush().await;
        ctx.telemetry.stopped();
        Ok(())
    }
}
