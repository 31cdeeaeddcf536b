//! What a bench run stands on: a fresh RabbitMQ vhost (management API), a fresh
//! database (PostgreSQL database or SQLite file), and the service under test as
//! a child process, whose peak memory and CPU time are read from `/proc`.
//!
//! Each resource is created by one function and removed by [`Resources::cleanup`],
//! which the caller runs on every exit path (success, failure, Ctrl-C).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::Context as _;
use order_timeout_harness::delayed::{self, Timers};
use order_timeout_harness::{Process, Serve};
use sea_orm::{ConnectionTrait, Database, DatabaseConnection};
use serde_json::Value;

/// The RabbitMQ management API (the harness's client; errors here say which
/// option was wrong, and are `anyhow` like the rest of the bench).
#[derive(Clone)]
pub struct Management(order_timeout_harness::Management);

impl Management {
    /// Parses `http://user:pass@host:port/api` (credentials default to guest/guest).
    pub fn new(raw: &str) -> anyhow::Result<Self> {
        let api = order_timeout_harness::Management::new(raw, Duration::from_secs(60))
            .with_context(|| "--management is not a URL")?;
        Ok(Self(api))
    }

    /// GET a JSON document.
    pub async fn get(&self, path: &str) -> anyhow::Result<Value> {
        Ok(self.0.get(path).await?)
    }

    /// Whether the broker offers the `x-delayed-message` exchange type.
    pub async fn plugin_available(&self) -> anyhow::Result<bool> {
        Ok(self.0.plugin_available().await?)
    }

    /// Creates a vhost and gives our user every right in it.
    pub async fn create_vhost(&self, name: &str) -> anyhow::Result<()> {
        Ok(self.0.create_vhost(name).await?)
    }

    /// Deletes a vhost with everything in it.
    pub async fn delete_vhost(&self, name: &str) -> anyhow::Result<()> {
        Ok(self.0.delete_vhost(name).await?)
    }
}

/// Which database the service under test runs on.
pub enum BenchDatabase {
    /// A database created on a PostgreSQL server for this run.
    Postgres {
        /// The server's admin URL (`…/postgres`), to create and drop.
        admin: String,
        /// The database's name.
        name: String,
        /// Its URL.
        url: String,
    },
    /// A SQLite file created for this run.
    Sqlite {
        /// The file.
        path: PathBuf,
        /// Its URL.
        url: String,
    },
}

impl BenchDatabase {
    /// Creates a fresh PostgreSQL database `ot_bench_<random>`.
    pub async fn postgres(admin: &str, tag: &str) -> anyhow::Result<Self> {
        let name = format!("ot_bench_{tag}");
        let conn = admin_connect(admin).await.with_context(|| {
            format!(
                "cannot reach PostgreSQL at {}",
                order_timeout::settings::redact_url(admin)
            )
        })?;
        conn.execute_unprepared(&format!("CREATE DATABASE {name}"))
            .await
            .with_context(|| format!("CREATE DATABASE {name}"))?;
        conn.close().await.ok();
        let mut url = url::Url::parse(admin)?;
        url.set_path(&format!("/{name}"));
        Ok(Self::Postgres {
            admin: admin.to_string(),
            name,
            url: url.to_string(),
        })
    }

    /// A fresh SQLite file in the system's temporary directory.
    pub fn sqlite(tag: &str) -> Self {
        let path = std::env::temp_dir().join(format!("ot-bench-{tag}.db"));
        let url = format!("sqlite://{}?mode=rwc", path.display());
        Self::Sqlite { path, url }
    }

    /// The URL the service and the bench connect with.
    pub fn url(&self) -> &str {
        match self {
            Self::Postgres { url, .. } | Self::Sqlite { url, .. } => url,
        }
    }

    /// `postgres` or `sqlite`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Postgres { .. } => "postgres",
            Self::Sqlite { .. } => "sqlite",
        }
    }

    /// Connects the bench itself (reads results, runs the database ceiling).
    pub async fn connect(&self) -> anyhow::Result<DatabaseConnection> {
        self.connect_pool(2).await
    }

    /// One connection of its own, as a cron job has (the baseline's poller).
    pub async fn connect_one(&self) -> anyhow::Result<DatabaseConnection> {
        self.connect_pool(1).await
    }

    async fn connect_pool(&self, connections: u32) -> anyhow::Result<DatabaseConnection> {
        let mut options = sea_orm::ConnectOptions::new(self.url().to_string());
        options.sqlx_logging(false).max_connections(connections);
        Ok(Database::connect(options).await?)
    }

    /// Drops the database (`WITH (FORCE)`: a killed child may leave connections) or removes the file.
    pub async fn drop_it(&self) -> anyhow::Result<()> {
        match self {
            Self::Postgres { admin, name, .. } => {
                let conn = admin_connect(admin).await?;
                conn.execute_unprepared(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await?;
                conn.close().await.ok();
            }
            Self::Sqlite { path, .. } => {
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
                }
            }
        }
        Ok(())
    }
}

/// A connection to the server's admin database, without statement logging.
async fn admin_connect(admin: &str) -> Result<DatabaseConnection, sea_orm::DbErr> {
    let mut options = sea_orm::ConnectOptions::new(admin.to_string());
    options.sqlx_logging(false).max_connections(1);
    Database::connect(options).await
}

/// The service under test, a child process running `serve` (the harness's
/// runner, with the bench's `/proc` readings on top).
pub struct Service {
    /// The child.
    process: Process,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    /// Where its stdout and stderr go.
    pub log: PathBuf,
    /// Kernel clock ticks per second, for `/proc/<pid>/stat`.
    ticks: f64,
}

/// Peak memory and CPU time of the child, from `/proc`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcStats {
    /// `VmHWM`: peak resident set, MiB.
    pub peak_rss_mb: f64,
    /// `VmRSS`: resident set now, MiB.
    pub rss_mb: f64,
    /// `utime + stime`, seconds.
    pub cpu_s: f64,
}

/// A port nobody listens on now (the child binds it a moment later).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(order_timeout_harness::free_port()?)
}

impl Service {
    /// Starts `order-timeout serve` (`binary`, else [`service_binary`]) with
    /// `env` added to our environment, its output in `log`.
    pub fn start(
        binary: Option<&Path>,
        config: Option<&Path>,
        env: &[(String, String)],
        port: u16,
        log: PathBuf,
    ) -> anyhow::Result<Self> {
        let binary = match binary {
            Some(path) => path.to_path_buf(),
            None => service_binary()?,
        };
        let mut serve = Serve::new(binary)
            .envs(env.iter().cloned())
            .port(port)
            .log(&log);
        if let Some(config) = config {
            serve = serve.config(config);
        }
        let process = serve.start()?;
        Ok(Self {
            base: process.base().to_string(),
            process,
            log,
            ticks: clock_ticks(),
        })
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Fails if the child has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        Ok(self.process.check_alive()?)
    }

    /// Waits until `/readyz` answers 200 (database and every broker role up).
    pub async fn wait_ready(
        &mut self,
        http: &reqwest::Client,
        limit: Duration,
    ) -> anyhow::Result<()> {
        Ok(self.process.wait_ready(http, limit).await?)
    }

    /// Peak RSS, current RSS and CPU time so far.
    pub fn stats(&self) -> anyhow::Result<ProcStats> {
        proc_stats(self.pid(), self.ticks)
    }

    /// Kernel clock ticks per second.
    pub fn ticks(&self) -> f64 {
        self.ticks
    }

    /// SIGTERM, a graceful wait, then SIGKILL. (Dropping the service kills
    /// the child too: it never outlives the bench.)
    pub fn stop(&mut self) {
        self.process.stop();
    }
}

/// Peak RSS, current RSS and CPU time of a process, from `/proc` (Linux).
pub fn proc_stats(pid: u32, ticks: f64) -> anyhow::Result<ProcStats> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .context("reading /proc/<pid>/status (Linux only)")?;
    let kb = |key: &str| -> f64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12th and 13th here.
    let tick = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Ok(ProcStats {
        peak_rss_mb: kb("VmHWM:") / 1024.0,
        rss_mb: kb("VmRSS:") / 1024.0,
        cpu_s: (tick(11) + tick(12)) / ticks,
    })
}

/// Kernel clock ticks per second (`getconf CLK_TCK`, else 100), for `/proc/<pid>/stat`.
pub(crate) fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|t| *t > 0.0)
        .unwrap_or(100.0)
}

/// Everything a run created, removed by [`Resources::cleanup`].
#[derive(Default)]
pub struct Resources {
    /// The management API, to delete the vhost.
    pub management: Option<Management>,
    /// The vhost made for this run.
    pub vhost: Option<String>,
    /// The database made for this run.
    pub database: Option<BenchDatabase>,
    /// The service under test.
    pub service: Option<Service>,
    /// The run was in plugin mode: its timers are in the plugin's table of
    /// the node, which deleting the vhost does not empty.
    pub plugin_timers: bool,
}

impl Resources {
    /// Stops the child, deletes the vhost and drops the database; says what failed.
    pub async fn cleanup(&mut self) {
        if let Some(mut service) = self.service.take() {
            service.stop();
        }
        if let (Some(management), Some(vhost)) = (&self.management, self.vhost.take()) {
            if self.plugin_timers {
                forget_delayed(&vhost);
            }
            match management.delete_vhost(&vhost).await {
                Ok(()) => println!("cleanup: deleted vhost {vhost}"),
                Err(e) => eprintln!("cleanup: could not delete vhost {vhost}: {e:#}"),
            }
        }
        if let Some(db) = self.database.take() {
            match db.drop_it().await {
                Ok(()) => println!("cleanup: removed the {} database", db.kind()),
                Err(e) => eprintln!(
                    "cleanup: could not remove the {} database: {e:#}",
                    db.kind()
                ),
            }
        }
    }
}

/// Removes the delayed-message plugin's timers of the run's exchanges: the
/// plugin keeps them on the node, and deleting the vhost leaves them there
/// until they come due (a day or two for `--million`). Through `rabbitmqctl
/// eval` on the local node; where that is not possible, says what is left
/// behind.
fn forget_delayed(vhost: &str) {
    let ctl = ["rabbitmqctl".to_string()];
    match delayed::forget(&ctl, Timers::OfVhost(vhost)) {
        Ok(0) => {}
        Ok(n) => println!(
            "cleanup: removed {n} delayed-message timers of {vhost} from the plugin's table"
        ),
        Err(e) => eprintln!(
            "cleanup: could not remove the plugin's delayed timers of {vhost} ({e}): \
             any left stay in the broker's memory until they come due"
        ),
    }
}

/// The service binary: `ORDER_TIMEOUT_BIN`, else `order-timeout` beside this
/// binary (`cargo build --release --workspace` puts both in `target/release`).
pub fn service_binary() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("ORDER_TIMEOUT_BIN") {
        return Ok(PathBuf::from(path));
    }
    let me = std::env::current_exe().context("cannot find the bench's own binary")?;
    let exe = me.with_file_name(format!("order-timeout{}", std::env::consts::EXE_SUFFIX));
    anyhow::ensure!(
        exe.exists(),
        "{} not found: build the service beside the bench (`cargo build --release --workspace`, \
         as `make bench` does) or set ORDER_TIMEOUT_BIN",
        exe.display()
    );
    Ok(exe)
}
