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
use crate::orders::mapped::{ShadowReport, Spread};
use crate::settings::{Settings, SettingsSource};

/// How long an answer may take: a reload reads a file, nothing waits longer.
const TIMEOUT: Duration = Duration::from_secs(10);

/// What `ctl` asks of the instance.
#[derive(Debug, Clone, Subcommand)]
pub enum CtlAction {
    /// Show every role (paused or running) and what a reload left for a restart.
    Status,
    /// Pause a role (the kinds and roles are named from their tables).
    #[command(about = format!("Pause a role on every instance (kept in the database, still paused after a restart): {}", crate::control::Pausable::help()))]
    Pause {
        /// The role.
        role: String,
        /// Pause it on this instance only, in memory, until it stops.
        #[arg(long)]
        instance: bool,
        /// Why, shown by `ctl status` and `/readyz` (at most 500 characters).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Resume a paused role (on every instance, unless --instance).
    Resume {
        /// The role.
        role: String,
        /// Lift this instance's own pause only.
        #[arg(long)]
        instance: bool,
    },
    /// Read the settings again; apply what can change while running.
    Reload,
    /// One order's story: status, deadlines, each transition with its cause,
    /// lateness and instance, its events, the timeouts ahead, parked ones.
    Order {
        /// The order's id, as on the wire.
        id: String,
    },
    /// Shadow mode's report (orders.shadow): per kind, what the service
    /// would have done beside what the shop (its cron) did.
    Shadow,
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
        CtlAction::Pause { role, instance, .. } => (
            Method::POST,
            format!("/admin/pause/{role}{}", scope(*instance)),
        ),
        CtlAction::Resume { role, instance } => (
            Method::POST,
            format!("/admin/resume/{role}{}", scope(*instance)),
        ),
        CtlAction::Reload => (Method::POST, "/admin/reload".to_string()),
        CtlAction::Shadow => (Method::GET, "/admin/shadow".to_string()),
        CtlAction::Order { id } => (
            Method::GET,
            format!(
                "/admin/orders/{}",
                percent_encoding::utf8_percent_encode(id, percent_encoding::NON_ALPHANUMERIC)
            ),
        ),
    };
    let body = match &action {
        CtlAction::Pause {
            reason: Some(reason),
            ..
        } => Some(serde_json::json!({ "reason": reason })),
        _ => (method == Method::POST).then(|| Value::Object(Default::default())),
    };
    let mut answer = match client
        .send(method, &format!("{url}{path}"), body.as_ref())
        .await
    {
        Ok(answer) => answer,
        Err(e) => {
            eprintln!("order-timeout ctl: no answer from {url}: {e}");
            return ExitCode::FAILURE;
        }
    };
    // What the answer holds came from publishers, shops and operators
    // (parked bodies, reasons, statuses): none of it reaches the terminal
    // as a control character, in either output.
    printable(&mut answer.body);
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

/// Replaces every control character (C0, DEL, C1: escape sequences, line
/// breaks that would forge a line) in the strings of `value` with its
/// visible escape, `\u{1b}` say.
fn printable(value: &mut Value) {
    match value {
        Value::String(s) if s.chars().any(char::is_control) => {
            *s = s
                .chars()
                .map(|c| {
                    if c.is_control() {
                        c.escape_unicode().to_string()
                    } else {
                        c.to_string()
                    }
                })
                .collect();
        }
        Value::Array(items) => items.iter_mut().for_each(printable),
        Value::Object(fields) => fields.values_mut().for_each(printable),
        _ => {}
    }
}

/// The query naming the scope: none for the default, shared.
fn scope(instance: bool) -> &'static str {
    if instance { "?scope=instance" } else { "" }
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
                    let pauses: Vec<String> = role["pauses"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(pause_line)
                        .collect();
                    let since = format!("paused since {}", text(&role["since"]));
                    if pauses.is_empty() {
                        since
                    } else {
                        format!("{since} ({})", pauses.join("; "))
                    }
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
            let pausing = matches!(action, CtlAction::Pause { .. });
            let paused = body["paused"] == true;
            let changed = body["changed"] == true;
            // Said only when it is not the default (shared, every instance).
            let only_here = if text(&body["scope"]) == "instance" {
                " on this instance only"
            } else {
                ""
            };
            let other = if only_here.is_empty() {
                "instance"
            } else {
                "shared"
            };
            let said = match (pausing, changed, paused) {
                (true, true, _) => format!("paused{only_here}"),
                (true, false, _) => format!("paused{only_here} already"),
                (false, true, false) => "running".to_string(),
                (false, false, false) => "running already".to_string(),
                // Resumed in one scope, still held by the other.
                (false, true, true) => {
                    format!("resumed{only_here}, still paused by its {other} pause")
                }
                (false, false, true) => {
                    format!("not paused{only_here}; still paused by its {other} pause")
                }
            };
            out += &format!("{role}: {said}\n");
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
        CtlAction::Order { .. } => out += &story(body),
        CtlAction::Shadow => out += &shadow(body),
    }
    out
}

/// Shadow mode's report for people: per kind, the counts, the two
/// latenesses and the first orders that stand out.
fn shadow(body: &Value) -> String {
    let mut out = format!(
        "shadow mode, now {} (the database's clock)\n",
        text(&body["now"])
    );
    let spread = |s: &Spread| match s.n {
        0 => "none".to_string(),
        n => format!(
            "p50 {} ms, p99 {} ms, max {} ms ({n})",
            shown(s.p50),
            shown(s.p99),
            shown(s.max)
        ),
    };
    for kind in body["kinds"].as_array().into_iter().flatten() {
        let r: ShadowReport = match serde_json::from_value(kind["report"].clone()) {
            Ok(r) => r,
            Err(e) => {
                out += &format!(
                    "{}: a report this ctl cannot read ({e})\n",
                    text(&kind["kind"])
                );
                continue;
            }
        };
        out += &format!("{}: {}\n", text(&kind["kind"]), r.counts());
        out += &format!("  the shop's lateness: {}\n", spread(&r.shop_late_ms));
        out += &format!("  ours: {}\n", spread(&r.our_late_ms));
        for (list, what) in [
            (&r.first_early, "closed early"),
            (&r.first_disagreements, "disagreement"),
            (&r.first_still_open, "still open"),
        ] {
            for n in list {
                out += &format!(
                    "  {what}: order {} ({}), {} ms after its deadline\n",
                    n.order_id,
                    n.status.as_deref().unwrap_or("open"),
                    shown(n.after_deadline_ms)
                );
            }
        }
    }
    out
}

/// A number of milliseconds, or `-` where there is none.
fn shown(ms: Option<i64>) -> String {
    ms.map_or_else(|| "-".to_string(), |ms| ms.to_string())
}

/// An order's story for people: one section per part of the answer.
fn story(body: &Value) -> String {
    let mut out = format!(
        "order {} ({})  {}",
        text(&body["id"]),
        text(&body["source"]),
        text(&body["status"])
    );
    if let Some(raw) = body["status_raw"].as_str() {
        out += &format!(" (the shop's table says '{raw}')");
    }
    out += &format!("\nnow {} (the database's clock)\n", text(&body["now"]));
    let list = |v: &Value| v.as_array().cloned().unwrap_or_default();
    out += "deadlines:\n";
    for d in list(&body["deadlines"]) {
        let passed = if d["passed"] == true {
            "passed"
        } else {
            "ahead"
        };
        out += &format!("  {:<12} {}  {passed}\n", text(&d["kind"]), text(&d["at"]));
    }
    out += "transitions:\n";
    for t in list(&body["transitions"]) {
        let from = t["from"]
            .as_str()
            .map(|f| format!("{f} -> "))
            .unwrap_or_default();
        let mut line = format!(
            "  {}  {:<20} {from}{}  by {}",
            text(&t["at"]),
            text(&t["event"]),
            text(&t["to"]),
            text(&t["cause"])
        );
        if let Some(kind) = t["kind"].as_str() {
            line += &format!(" ({kind})");
        }
        if let Some(late) = t["late_ms"].as_i64() {
            line += &format!(", {late} ms after the deadline");
        }
        if let Some(instance) = t["instance"].as_str() {
            line += &format!(", on {instance}");
        }
        if let Some(detail) = t["detail"].as_str() {
            line += &format!(": {detail}");
        }
        out += &format!("{line}\n");
    }
    out += "events:\n";
    for e in list(&body["events"]) {
        let mut line = format!(
            "  {:<28} {:<10} {}",
            text(&e["event"]),
            text(&e["state"]),
            text(&e["at"])
        );
        if let Some(reason) = e["reason"].as_str() {
            line += &format!(": {reason}");
        }
        out += &format!("{line}\n");
    }
    let waiting = list(&body["waiting"]);
    if waiting.is_empty() {
        out += "waiting: no timeout ahead for this status\n";
    } else {
        out += "waiting:\n";
        for w in waiting {
            let ms = w["due_in_ms"].as_i64().unwrap_or(0);
            out += &format!(
                "  {:<12} due {} (in {})\n",
                text(&w["kind"]),
                text(&w["due_at"]),
                // Whole seconds: the milliseconds of a week away say nothing.
                humantime::format_duration(std::time::Duration::from_secs(
                    u64::try_from(ms / 1000).unwrap_or(0)
                ))
            );
        }
    }
    if body["parked_checked"] != true {
        out += &format!("parked: not checked ({})\n", text(&body["parked_error"]));
        return out;
    }
    let parked = list(&body["parked"]);
    let read = body["parked_read"].as_u64().unwrap_or(0);
    let partly = if body["parked_complete"] == true {
        String::new()
    } else {
        format!(
            "; only the first {read} of about {} messages were read",
            body["parked_in_queue"].as_u64().unwrap_or(0)
        )
    };
    if parked.is_empty() {
        out += &format!("parked: none of its timeouts ({read} messages read{partly})\n");
    } else {
        out += &format!("parked ({read} messages read{partly}):\n");
        for p in parked {
            let mut line = format!(
                "  {:<12} {}",
                p["kind"].as_str().unwrap_or("?"),
                text(&p["reason"])
            );
            if let Some(detail) = p["detail"].as_str() {
                line += &format!(": {detail}");
            }
            if let Some(by) = p["parked_by"].as_str() {
                line += &format!("  (parked by {by})");
            }
            line += &format!("  in {}", text(&p["queue"]));
            if let Some(at) = p["at"].as_str() {
                line += &format!(" since {at}");
            }
            out += &format!("{line}\n");
        }
    }
    out
}

/// One pause of a role: `shared, by token sha256:… on shop-1: why`.
fn pause_line(pause: &Value) -> String {
    let mut line = format!(
        "{}, by {} on {}",
        text(&pause["scope"]),
        text(&pause["by"]),
        text(&pause["instance"])
    );
    if let Some(reason) = pause["reason"].as_str() {
        line += &format!(": {reason}");
    }
    line
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
    fn status_says_who_paused_what_in_which_scope() {
        let body = json!({
            "instance": "shop-1", "mode": "ttl",
            "roles": [
                {"role": "payment", "paused": true, "since": "2026-12-02T09:14:03.512Z", "enabled": true,
                 "pauses": [
                    {"scope": "shared", "since": "2026-12-02T09:14:03.512Z", "by": "token sha256:0123456789ab",
                     "instance": "shop-2", "reason": "PSP outage"},
                    {"scope": "instance", "since": "2026-12-02T09:15:00.000Z", "by": "anonymous",
                     "instance": "shop-1", "reason": null}
                 ]},
                {"role": "receipt", "paused": false, "since": null, "enabled": true, "pauses": []}
            ],
            "reload": {"last_at": null, "last_outcome": null, "restart_needed": []}
        });
        let text = render(&CtlAction::Status, &body);
        assert!(
            text.contains(
                "payment      paused since 2026-12-02T09:14:03.512Z (shared, by token sha256:0123456789ab on shop-2: PSP outage; instance, by anonymous on shop-1)"
            ),
            "{text}"
        );
        assert!(text.contains("receipt      running"), "{text}");
    }

    #[test]
    fn pause_and_resume_say_what_holds() {
        let pause = |instance| CtlAction::Pause {
            role: "payment".into(),
            instance,
            reason: None,
        };
        let resume = |instance| CtlAction::Resume {
            role: "payment".into(),
            instance,
        };
        let answer = |scope: &str, paused: bool, changed: bool| json!({"role": "payment", "scope": scope, "paused": paused, "changed": changed});
        let cases = [
            (
                pause(false),
                answer("shared", true, true),
                "payment: paused\n",
            ),
            (
                pause(false),
                answer("shared", true, false),
                "payment: paused already\n",
            ),
            (
                pause(true),
                answer("instance", true, true),
                "payment: paused on this instance only\n",
            ),
            (
                resume(false),
                answer("shared", false, true),
                "payment: running\n",
            ),
            (
                resume(false),
                answer("shared", false, false),
                "payment: running already\n",
            ),
            (
                resume(false),
                answer("shared", true, true),
                "payment: resumed, still paused by its instance pause\n",
            ),
            (
                resume(true),
                answer("instance", true, false),
                "payment: not paused on this instance only; still paused by its shared pause\n",
            ),
        ];
        for (action, body, said) in cases {
            assert_eq!(render(&action, &body), said, "{body}");
        }
    }

    #[test]
    fn an_orders_story_has_a_line_per_transition_and_says_what_waits() {
        let body = json!({
            "id": "8812", "source": "owned", "status": "cancelled", "now": "2026-12-05T12:00:00.000Z",
            "deadlines": [{"kind": "payment", "at": "2026-12-05T11:59:00.000Z", "passed": true}],
            "transitions": [
                {"at": "2026-12-05T11:58:00.000Z", "event": "created", "from": null, "to": "pending_payment",
                 "cause": "buyer", "kind": null, "late_ms": null, "instance": null, "detail": null},
                {"at": "2026-12-05T11:59:00.112Z", "event": "cancelled", "from": "pending_payment", "to": "cancelled",
                 "cause": "timeout", "kind": "payment", "late_ms": 112, "instance": "shop-1", "detail": null}
            ],
            "events": [{"event": "order.cancelled", "state": "set_aside", "at": "2026-12-05T11:59:00.112Z", "reason": "too big"}],
            "waiting": [], "parked": [{"kind": "payment", "reason": "bad_delay", "detail": "x-delay -5", "queue": "p.parked", "at": null}],
            "parked_checked": true, "parked_complete": false, "parked_read": 200, "parked_in_queue": 450
        });
        let text = render(&CtlAction::Order { id: "8812".into() }, &body);
        assert!(
            text.starts_with("order 8812 (owned)  cancelled\n"),
            "{text}"
        );
        assert!(text.contains("pending_payment -> cancelled  by timeout (payment), 112 ms after the deadline, on shop-1"), "{text}");
        assert!(text.contains("order.cancelled"), "{text}");
        assert!(text.contains("set_aside"), "{text}");
        assert!(text.contains("waiting: no timeout ahead"), "{text}");
        assert!(text.contains("only the first 200 of about 450"), "{text}");
        assert!(
            text.contains("bad_delay: x-delay -5  in p.parked"),
            "{text}"
        );
        let unchecked = json!({"id": "1", "source": "mapped", "status": "paid", "status_raw": "PAID",
            "now": "x", "parked_checked": false, "parked_error": "amqp.management_url = off"});
        let text = render(&CtlAction::Order { id: "1".into() }, &unchecked);
        assert!(text.contains("(the shop's table says 'PAID')"), "{text}");
        assert!(
            text.contains("parked: not checked (amqp.management_url = off)"),
            "{text}"
        );
    }

    #[test]
    fn what_a_publisher_or_a_shop_wrote_reaches_the_terminal_escaped() {
        let mut body = json!({
            "id": "9", "source": "mapped", "status": "paid\u{1b}[2J", "status_raw": "PAID\u{9b}31m",
            "now": "x", "parked_checked": true,
            "parked": [{"kind": "payment", "reason": "bad_delay", "detail": "x\nparked: forged line\u{7}",
                        "queue": "p.parked", "at": null, "parked_by": "router"}]
        });
        printable(&mut body);
        let text = render(&CtlAction::Order { id: "9".into() }, &body);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "{text:?}"
        );
        assert!(text.contains("paid\\u{1b}[2J"), "{text}");
        assert!(text.contains("x\\u{a}parked: forged line\\u{7}"), "{text}");
        assert!(
            !lines.iter().any(|l| l.starts_with("parked: forged")),
            "{text}"
        );
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
