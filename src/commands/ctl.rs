//! `order-timeout ctl`: a running instance's `/admin` endpoints from the
//! command line. It finds the instance and an admin token in the same
//! settings `serve` reads (`http.bind`, `http.admin_tokens`), unless told
//! with `--url` and `--token` (or `ORDER_TIMEOUT_CTL_TOKEN`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;
use serde_json::Value;

use crate::http_client::{Answer, JsonClient, Method};
use crate::settings::{Settings, SettingsSource};

/// How long an answer may take: a reload reads a file, nothing waits longer.
const TIMEOUT: Duration = Duration::from_secs(10);

/// What `ctl` asks of the instance.
#[derive(Debug, Clone, Subcommand)]
pub enum CtlAction {
    /// Show every role (paused or running) and what a reload left for a restart.
    Status,
    /// Pause a role (the kinds and roles are named from their tables).
    #[command(about = format!("Pause a role: {}", crate::control::Pausable::help()))]
    Pause {
        /// The role.
        role: String,
    },
    /// Resume a paused role.
    Resume {
        /// The role.
        role: String,
    },
    /// Read the settings again; apply what can change while running.
    Reload,
}

/// Where to reach the instance, and as whom.
#[derive(Debug, Clone)]
pub struct Target {
    /// `http://host:port`.
    pub url: Option<String>,
    /// An admin token.
    pub token: Option<String>,
}

/// Runs one `ctl` command; exit 0 when done, 1 when refused or unreachable,
/// 2 when the instance cannot be found from the settings.
pub async fn run(
    target: Target,
    source: &SettingsSource,
    action: CtlAction,
    json: bool,
) -> ExitCode {
    let (url, token) = match resolve(target, source) {
        Ok(found) => found,
        Err(e) => {
            eprintln!("order-timeout ctl: {e}");
            return ExitCode::from(2);
        }
    };
    let mut client = JsonClient::new(TIMEOUT);
    if let Some(token) = &token {
        client = match client.bearer(token) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("order-timeout ctl: the token: {e}");
                return ExitCode::from(2);
            }
        };
    }
    let (method, path) = match &action {
        CtlAction::Status => (Method::GET, "/admin/status".to_string()),
        CtlAction::Pause { role } => (Method::POST, format!("/admin/pause/{role}")),
        CtlAction::Resume { role } => (Method::POST, format!("/admin/resume/{role}")),
        CtlAction::Reload => (Method::POST, "/admin/reload".to_string()),
    };
    let body = (method == Method::POST).then(|| Value::Object(Default::default()));
    let answer = match client
        .send(method, &format!("{url}{path}"), body.as_ref())
        .await
    {
        Ok(answer) => answer,
        Err(e) => {
            eprintln!("order-timeout ctl: no answer from {url}: {e}");
            return ExitCode::FAILURE;
        }
    };
    if json {
        println!("{}", answer.body);
        return if answer.status.is_success() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    if !answer.status.is_success() {
        eprintln!("order-timeout ctl: {}", refusal(&answer));
        return ExitCode::FAILURE;
    }
    print!("{}", render(&action, &answer.body));
    ExitCode::SUCCESS
}

/// The URL and token: as given, or from the settings.
fn resolve(target: Target, source: &SettingsSource) -> Result<(String, Option<String>), String> {
    if let (Some(url), Some(token)) = (&target.url, &target.token) {
        return Ok((url.trim_end_matches('/').to_string(), Some(token.clone())));
    }
    let settings = Settings::load(source).map_err(|e| {
        format!("configuration error: {e} (or give --url and --token, which need no settings)")
    })?;
    let url = target
        .url
        .map(|u| u.trim_end_matches('/').to_string())
        .unwrap_or_else(|| format!("http://{}", reachable(settings.http.bind)));
    let token = target.token.or_else(|| {
        settings
            .http
            .admin_tokens
            .first()
            .map(|t| t.expose().to_string())
    });
    Ok((url, token))
}

/// Where a client reaches a server bound to `bind`: the loopback address of
/// its family when it listens on every address.
fn reachable(bind: SocketAddr) -> SocketAddr {
    let ip = match bind.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, bind.port())
}

/// An error answer in one line.
fn refusal(answer: &Answer) -> String {
    let reason = answer.body["error"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| answer.body.to_string());
    match answer.body["outcome"].as_str() {
        Some("refused") => format!("reload refused, the running settings stay: {reason}"),
        _ => format!("{} {reason}", answer.status.as_u16()),
    }
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

/// A successful answer for people.
fn render(action: &CtlAction, body: &Value) -> String {
    let mut out = String::new();
    match action {
        CtlAction::Status => {
            out += &format!(
                "instance {}  mode {}\n",
                text(&body["instance"]),
                body["mode"].as_str().unwrap_or("unresolved")
            );
            for role in body["roles"].as_array().into_iter().flatten() {
                let state = if role["enabled"] == false {
                    "off on this instance".to_string()
                } else if role["paused"] == true {
                    format!("paused since {}", text(&role["since"]))
                } else {
                    "running".to_string()
                };
                out += &format!("{:<12} {state}\n", text(&role["role"]));
            }
            let reload = &body["reload"];
            if let Some(at) = reload["last_at"].as_str() {
                out += &format!("last reload {at}: {}\n", text(&reload["last_outcome"]));
            }
            out += &restart_lines(&reload["restart_needed"]);
        }
        CtlAction::Pause { .. } | CtlAction::Resume { .. } => {
            let role = text(&body["role"]);
            let state = if body["paused"] == true {
                "paused"
            } else {
                "running"
            };
            if body["changed"] == true {
                out += &format!("{role}: {state}\n");
            } else {
                out += &format!("{role}: {state} already\n");
            }
        }
        CtlAction::Reload => {
            let changed = body["changed"].as_array().cloned().unwrap_or_default();
            if changed.is_empty() {
                out += "reloaded: nothing that applies while running changed\n";
            } else {
                out += "reloaded, now in effect:\n";
                for c in &changed {
                    out += &format!(
                        "  {}: {} -> {}\n",
                        text(&c["key"]),
                        text(&c["from"]),
                        text(&c["to"])
                    );
                }
            }
            for note in body["notes"].as_array().into_iter().flatten() {
                out += &format!("note: {}\n", text(note));
            }
            out += &restart_lines(&body["restart_needed"]);
        }
    }
    out
}

fn restart_lines(restart: &Value) -> String {
    let mut out = String::new();
    let restart = restart.as_array().cloned().unwrap_or_default();
    if !restart.is_empty() {
        out += "needs a restart to apply (running -> configured):\n";
        for c in &restart {
            out += &format!(
                "  {}: {} -> {}\n",
                text(&c["key"]),
                text(&c["running"]),
                text(&c["configured"])
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_server_on_every_address_is_reached_on_loopback() {
        let any4: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        let any6: SocketAddr = "[::]:8080".parse().unwrap();
        let one: SocketAddr = "10.1.2.3:8080".parse().unwrap();
        assert_eq!(reachable(any4).to_string(), "127.0.0.1:8080");
        assert_eq!(reachable(any6).to_string(), "[::1]:8080");
        assert_eq!(reachable(one), one);
    }

    #[test]
    fn a_reload_says_what_changed_and_what_waits() {
        let body = json!({
            "outcome": "applied",
            "changed": [{"key": "windows.payment", "from": "30m", "to": "15m"}],
            "restart_needed": [{"key": "amqp.prefix", "running": "a", "configured": "b"}],
            "notes": [],
        });
        let text = render(&CtlAction::Reload, &body);
        assert!(text.contains("windows.payment: 30m -> 15m"), "{text}");
        assert!(text.contains("needs a restart"), "{text}");
        assert!(text.contains("amqp.prefix: a -> b"), "{text}");
    }
}
