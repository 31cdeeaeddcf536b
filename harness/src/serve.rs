//! `order-timeout serve` as a child process: started with its settings in the
//! environment and its HTTP port chosen, awaited until ready, signalled,
//! awaited until it exits, and never left running.

use std::fs::File;
use std::io;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long [`Process::stop`] lets the service drain after SIGTERM before it
/// kills it: the service's own shutdown bound (20 s) plus its pools' 2 s, with room.
const STOP_GRACE: Duration = Duration::from_secs(25);

/// How often a wait polls the child or its HTTP endpoint.
const POLL: Duration = Duration::from_millis(100);

/// Why a child could not be started, got ready, or exit.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The binary could not be run.
    #[error("cannot start the service under test ({bin}): {error}")]
    Spawn {
        /// The binary.
        bin: PathBuf,
        /// What the operating system said.
        error: io::Error,
    },
    /// The log file could not be created.
    #[error("cannot write {path}: {error}")]
    Log {
        /// The log file.
        path: PathBuf,
        /// What the operating system said.
        error: io::Error,
    },
    /// The child exited while it was expected to run.
    #[error("the service under test exited ({status}); {}", see(log))]
    Exited {
        /// How it exited.
        status: ExitStatus,
        /// Where its output went.
        log: Option<PathBuf>,
    },
    /// The child did not answer in time.
    #[error("the service under test did not answer {path} within {}s; {}", limit.as_secs(), see(log))]
    NotReady {
        /// The endpoint polled.
        path: &'static str,
        /// How long it was given.
        limit: Duration,
        /// Where its output went.
        log: Option<PathBuf>,
    },
    /// The child was still running when it should have exited.
    #[error("the service under test did not exit within {within:?}")]
    StillRunning {
        /// How long it was given.
        within: Duration,
    },
    /// `kill` failed or could not be run.
    #[error("kill -{signal} {pid}: {detail}")]
    Signal {
        /// The signal's name.
        signal: &'static str,
        /// The child's pid.
        pid: u32,
        /// What went wrong.
        detail: String,
    },
    /// Asking the operating system about the child failed.
    #[error("the service under test: {0}")]
    Io(#[from] io::Error),
}

/// Where to look for the reason a child failed.
fn see(log: &Option<PathBuf>) -> String {
    match log {
        Some(path) => format!("see {}", path.display()),
        None => "its output was not kept".to_string(),
    }
}

/// A port nobody listens on now (the child binds it a moment later).
pub fn free_port() -> io::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// A signal [`Process::signal`] sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// Graceful shutdown: the service drains and exits.
    Term,
    /// Ctrl-C: the service treats it as SIGTERM.
    Int,
    /// No shutdown at all: the broker and the outbox must keep everything.
    Kill,
    /// Reload the settings (`systemctl reload`).
    Hup,
}

impl Signal {
    /// The name `kill -<name>` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Term => "TERM",
            Self::Int => "INT",
            Self::Kill => "KILL",
            Self::Hup => "HUP",
        }
    }
}

/// How to start one `serve` child: the binary, then options, then [`Serve::start`].
#[derive(Debug, Clone)]
pub struct Serve {
    /// The `order-timeout` binary.
    bin: PathBuf,
    /// `--config <file>`, when given.
    config: Option<PathBuf>,
    /// Settings, as `ORDER_TIMEOUT__…` variables, on top of our environment.
    env: Vec<(String, String)>,
    /// The HTTP port on 127.0.0.1; a free one when not given.
    port: Option<u16>,
    /// `amqp.instance`, when given: names the child's broker connections.
    instance: Option<String>,
    /// Where stdout and stderr go; nowhere when not given.
    log: Option<PathBuf>,
}

impl Serve {
    /// `bin serve`, with our environment, a free port and no output kept.
    pub fn new(bin: impl Into<PathBuf>) -> Self {
        Self {
            bin: bin.into(),
            config: None,
            env: Vec::new(),
            port: None,
            instance: None,
            log: None,
        }
    }

    /// Loads settings from this file (`--config`) before the environment.
    pub fn config(mut self, file: impl Into<PathBuf>) -> Self {
        self.config = Some(file.into());
        self
    }

    /// Adds one variable to the child's environment.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Adds variables to the child's environment; later ones win.
    pub fn envs<K, V>(mut self, vars: impl IntoIterator<Item = (K, V)>) -> Self
    where
        K: Into<String>,
        V: Into<String>,
    {
        self.env
            .extend(vars.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }

    /// Serves HTTP on `127.0.0.1:port` (`http.bind`).
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    /// Sets `amqp.instance`, which names the child's broker connections.
    pub fn instance(mut self, name: impl Into<String>) -> Self {
        self.instance = Some(name.into());
        self
    }

    /// Writes the child's stdout and stderr to this file (created, with its folder).
    pub fn log(mut self, file: impl Into<PathBuf>) -> Self {
        self.log = Some(file.into());
        self
    }

    /// Starts the child. It is not ready yet: see [`Process::wait_ready`].
    pub fn start(self) -> Result<Process, Error> {
        let port = match self.port {
            Some(port) => port,
            None => free_port()?,
        };
        let (stdout, stderr) = match &self.log {
            Some(path) => {
                let file = create_log(path).map_err(|error| Error::Log {
                    path: path.clone(),
                    error,
                })?;
                (Stdio::from(file.try_clone()?), Stdio::from(file))
            }
            None => (Stdio::null(), Stdio::null()),
        };
        let mut cmd = Command::new(&self.bin);
        if let Some(config) = &self.config {
            cmd.arg("--config").arg(config);
        }
        cmd.arg("serve")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("ORDER_TIMEOUT__HTTP__BIND", format!("127.0.0.1:{port}"));
        if let Some(instance) = &self.instance {
            cmd.env("ORDER_TIMEOUT__AMQP__INSTANCE", instance);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .map_err(|error| Error::Spawn {
                bin: self.bin.clone(),
                error,
            })?;
        Ok(Process {
            child,
            port,
            base: format!("http://127.0.0.1:{port}"),
            log: self.log,
        })
    }
}

/// Creates the log file and its folder.
fn create_log(path: &Path) -> io::Result<File> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    File::create(path)
}

/// A running `serve` child. Dropping it kills the child if it still runs.
#[derive(Debug)]
pub struct Process {
    /// The child.
    child: Child,
    /// Its HTTP port on 127.0.0.1.
    port: u16,
    /// `http://127.0.0.1:<port>`.
    base: String,
    /// Where its output goes, when kept.
    log: Option<PathBuf>,
}

impl Process {
    /// `http://127.0.0.1:<port>`, the base of every HTTP call to it.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Its HTTP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its log file, when its output is kept.
    pub fn log(&self) -> Option<&Path> {
        self.log.as_deref()
    }

    /// What it has written to its log so far (empty when none is kept).
    pub fn log_text(&self) -> String {
        self.log
            .as_ref()
            .and_then(|path| std::fs::read_to_string(path).ok())
            .unwrap_or_default()
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails, naming the log, if the child has exited.
    pub fn check_alive(&mut self) -> Result<(), Error> {
        match self.child.try_wait()? {
            Some(status) => Err(Error::Exited {
                status,
                log: self.log.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Waits until `/readyz` answers 200 (database and every broker role up);
    /// fails early if the child exits meanwhile.
    pub async fn wait_ready(
        &mut self,
        http: &reqwest::Client,
        limit: Duration,
    ) -> Result<(), Error> {
        self.wait_answers(http, "/readyz", limit).await
    }

    /// Waits until `/healthz` answers 200 (the HTTP API serves, whatever the
    /// broker and database); fails early if the child exits meanwhile.
    pub async fn wait_live(
        &mut self,
        http: &reqwest::Client,
        limit: Duration,
    ) -> Result<(), Error> {
        self.wait_answers(http, "/healthz", limit).await
    }

    async fn wait_answers(
        &mut self,
        http: &reqwest::Client,
        path: &'static str,
        limit: Duration,
    ) -> Result<(), Error> {
        let start = Instant::now();
        loop {
            self.check_alive()?;
            if let Ok(resp) = http.get(format!("{}{path}", self.base)).send().await
                && resp.status().is_success()
            {
                return Ok(());
            }
            if start.elapsed() > limit {
                return Err(Error::NotReady {
                    path,
                    limit,
                    log: self.log.clone(),
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Sends a signal with the `kill` command.
    pub fn signal(&self, signal: Signal) -> Result<(), Error> {
        let failed = |detail: String| Error::Signal {
            signal: signal.name(),
            pid: self.pid(),
            detail,
        };
        let out = Command::new("kill")
            .arg(format!("-{}", signal.name()))
            .arg(self.pid().to_string())
            .stdin(Stdio::null())
            .output()
            .map_err(|e| failed(e.to_string()))?;
        if !out.status.success() {
            return Err(failed(
                String::from_utf8_lossy(&out.stderr).trim().to_string(),
            ));
        }
        Ok(())
    }

    /// Waits for the child to exit; returns how it exited and how long that took.
    pub async fn wait(&mut self, within: Duration) -> Result<(ExitStatus, Duration), Error> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok((status, start.elapsed()));
            }
            if start.elapsed() > within {
                return Err(Error::StillRunning { within });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Kills the child at once (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, a graceful wait (blocking this thread, so that it also works
    /// from `Drop` and outside a runtime), then SIGKILL.
    pub fn stop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let _ = self.signal(Signal::Term);
        let until = Instant::now() + STOP_GRACE;
        while Instant::now() < until {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // Whatever way the caller leaves (a failed assertion included), the
        // child does not outlive it.
        if !matches!(self.child.try_wait(), Ok(Some(_))) {
            self.kill();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_binary_is_a_spawn_error_naming_it() {
        let err = Serve::new("/nonexistent/order-timeout")
            .start()
            .unwrap_err();
        assert!(matches!(err, Error::Spawn { .. }), "{err}");
        assert!(
            err.to_string().contains("/nonexistent/order-timeout"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_child_that_exits_fails_the_readiness_wait_naming_its_log() {
        // `sh serve` exits at once (no such script): the wait says so, with the log.
        let log = std::env::temp_dir().join(format!("ot-harness-{}.log", std::process::id()));
        let mut child = Serve::new("sh").log(&log).start().unwrap();
        let err = child
            .wait_ready(&reqwest::Client::new(), Duration::from_secs(10))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Exited { .. }), "{err}");
        assert!(
            err.to_string().contains(&log.display().to_string()),
            "{err}"
        );
        assert!(!child.log_text().is_empty(), "sh said why");
        let _ = std::fs::remove_file(&log);
    }

    #[test]
    fn signals_are_named_as_kill_takes_them() {
        let names: Vec<&str> = [Signal::Term, Signal::Int, Signal::Kill, Signal::Hup]
            .iter()
            .map(|s| s.name())
            .collect();
        assert_eq!(names, ["TERM", "INT", "KILL", "HUP"]);
    }
}
