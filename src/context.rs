//! What the components share, below every one of them: the settings, the
//! database pools, the telemetry, the live health of the dependencies, and the
//! delay mode once resolved. The subsystems (`amqp`, `http`, `sweeper`) take an
//! `Arc<Context>`; `app` builds it and starts them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use sea_orm::DatabaseConnection;
use tokio::sync::OnceCell;

use crate::broker::{Mode, Names};
use crate::control::Pauses;
use crate::orders::Orders;
use crate::reload::{ReloadError, Reloaded, Reloader};
use crate::settings::{Settings, SettingsSource};
use crate::telemetry::Telemetry;

/// A connection of the service to the broker, one per role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Publishes the outbox.
    Relay,
    /// Validates what publishers send and routes it into the delay stage; it
    /// declares the topology on each of its (re)connects.
    Router,
    /// Applies due timeouts.
    Consumer,
    /// Holds the native stage's timers in their queue until they are due
    /// (AMQP 1.0); idle where there is no native stage.
    Deferrer,
}

impl Role {
    /// Every role, in the order `/readyz` lists them.
    pub const ALL: [Role; 4] = [Role::Relay, Role::Router, Role::Consumer, Role::Deferrer];

    /// The role's name in connection names, logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Relay => "relay",
            Self::Router => "router",
            Self::Consumer => "consumer",
            Self::Deferrer => "deferrer",
        }
    }
}

/// Live state of the broker connections, for `/readyz` (which asks the
/// database itself, each time).
#[derive(Debug, Default)]
pub struct Health {
    /// Per broker role, whether its connection is up.
    relay: AtomicBool,
    router: AtomicBool,
    consumer: AtomicBool,
    deferrer: AtomicBool,
    /// Per broker role (in [`Role::ALL`]'s order), the node (`host:port` of
    /// `amqp.url`) its connection is on, while it is up.
    nodes: Mutex<[Option<String>; 4]>,
}

impl Health {
    fn flag(&self, role: Role) -> &AtomicBool {
        match role {
            Role::Relay => &self.relay,
            Role::Router => &self.router,
            Role::Consumer => &self.consumer,
            Role::Deferrer => &self.deferrer,
        }
    }
    /// Records a broker role's connection state.
    pub fn set_broker(&self, role: Role, up: bool) {
        self.flag(role).store(up, Ordering::Relaxed);
    }
    /// `(role, connected)` for every broker role.
    pub fn broker(&self) -> [(Role, bool); 4] {
        Role::ALL.map(|role| (role, self.flag(role).load(Ordering::Relaxed)))
    }
    /// Records the node a broker role's connection is on (`None`: none).
    pub fn set_node(&self, role: Role, node: Option<String>) {
        let i = Role::ALL.iter().position(|r| *r == role).unwrap_or(0);
        if let Ok(mut nodes) = self.nodes.lock() {
            nodes[i] = node;
        }
    }
    /// `(role, node)` for every broker role.
    pub fn nodes(&self) -> [(Role, Option<String>); 4] {
        let nodes = self.nodes.lock().map(|n| n.clone()).unwrap_or_default();
        std::array::from_fn(|i| (Role::ALL[i], nodes[i].clone()))
    }
}

/// Everything the components share.
pub struct Context {
    /// The settings as the service started. The keys a reload may change
    /// ([`crate::settings::live_keys`]) are read through [`Context::live`].
    pub settings: Settings,
    /// The settings in effect, and reloading them.
    pub reloader: Reloader,
    /// Which roles are paused.
    pub pauses: Pauses,
    /// What the time zone check found of each guarded kind (`zone_check`).
    pub zone_checks: crate::zone_check::verdicts::ZoneChecks,
    /// Exchange and queue names.
    pub names: Names,
    /// The database pool of the background work: consumers, relay, sweeper.
    pub db: DatabaseConnection,
    /// The database pool of the HTTP handlers, apart from `db` so that
    /// requests cannot take the connections timeouts need.
    pub api_db: DatabaseConnection,
    /// Whose orders the timeouts act on.
    pub orders: Orders,
    /// Logs and metrics.
    pub telemetry: Arc<Telemetry>,
    /// Dependency state for `/readyz`.
    pub health: Health,
    /// The delay mode, resolved once (`amqp::delay_mode` probes the broker
    /// if `auto`), with the reason.
    pub(crate) mode: OnceCell<(Mode, String)>,
    /// Set once the topology has been declared by this instance.
    topology: tokio::sync::watch::Sender<bool>,
}

impl Context {
    /// A context over open database pools: the background one and the API's.
    pub fn new(settings: Settings, db: DatabaseConnection, api_db: DatabaseConnection) -> Self {
        let names = Names::new(&settings.amqp.prefix);
        let health = Health::default();
        Self {
            reloader: Reloader::new(settings.clone(), None),
            pauses: Pauses::default(),
            zone_checks: Default::default(),
            settings,
            names,
            db,
            api_db,
            orders: Orders::owned(),
            telemetry: Telemetry::new(),
            health,
            mode: OnceCell::new(),
            topology: tokio::sync::watch::Sender::new(false),
        }
    }

    /// The same context acting on `orders` (a shop's mapped table).
    pub fn with_orders(mut self, orders: Orders) -> Self {
        self.orders = orders;
        self
    }

    /// The same context reloading its settings from `source`, whose layers
    /// gave `started` (before any command-line override).
    pub fn with_reload_source(mut self, source: SettingsSource, started: Settings) -> Self {
        self.reloader = Reloader::new(self.settings.clone(), Some((source, started)));
        self
    }

    /// Reads the settings again and applies what can change while running
    /// (see [`Reloader::reload`]); logged and counted. Reads a file: call it
    /// off the async workers.
    pub fn reload(&self) -> Result<Reloaded, ReloadError> {
        let reloaded = self.reloader.reload();
        match &reloaded {
            Ok(reloaded) => self.telemetry.settings_reloaded(reloaded),
            Err(ReloadError::Refused(error)) => self.telemetry.settings_refused(error),
            Err(ReloadError::NoSource) => {}
        }
        reloaded
    }

    /// The settings in effect now: what a component reads each time it uses
    /// a key a reload may change.
    pub fn live(&self) -> Arc<Settings> {
        self.reloader.current()
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
