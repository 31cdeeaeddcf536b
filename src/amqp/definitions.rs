//! The topology as RabbitMQ definitions (the management API's JSON format), so an
//! operator can create it ahead of time, review it, or keep it under change control:
//! import into a vhost with `POST /api/definitions/{vhost}`, the management UI
//! ("Import definitions", with a virtual host chosen) or `rabbitmqctl
//! import_definitions`. Built from the same [`topology`] functions that
//! [`topology::declare`] runs, so the file and the service cannot disagree.
//!
//! Objects carry no `vhost` field: the file imports into whichever vhost it is
//! posted to. The service still declares everything on start (idempotent): an
//! imported topology is checked for equivalence, not trusted blindly.
//!
//! `rabbitmq/definitions.ttl.json` and `rabbitmq/definitions.plugin.json` are this
//! function's output for the default prefix; a unit test keeps them equal.
//! `rabbitmq/definitions.access.json` ([`access`]) gives the service and its
//! publishers users of their own with the least rights each needs.
//! Regenerate with `ORDER_TIMEOUT_WRITE_DEFINITIONS=1 cargo test --lib definitions`.

use serde_json::{Map, Value, json};

use super::topology::{self, Arg, Args, Destination, Mode, Names};

fn arguments(args: &Args) -> Value {
    let map: Map<String, Value> = args
        .iter()
        .map(|(k, v)| {
            let v = match v {
                Arg::Int(i) => json!(i),
                Arg::Long(i) => json!(i),
                Arg::Text(s) => json!(s),
            };
            ((*k).to_string(), v)
        })
        .collect();
    Value::Object(map)
}

/// The definitions of `mode` under `names`: `exchanges`, `queues` and `bindings`,
/// in declaration order, durable and not auto-deleted like [`topology::declare`] makes them.
pub fn definitions(names: &Names, mode: Mode) -> Value {
    let exchanges: Vec<Value> = topology::exchanges(names, mode)
        .iter()
        .map(|x| {
            json!({
                "name": x.name,
                "type": x.kind.as_str(),
                "durable": true,
                "auto_delete": false,
                "internal": false,
                "arguments": arguments(&x.arguments),
            })
        })
        .collect();
    let queues: Vec<Value> = topology::queues(names, mode, topology::QueueType::Classic)
        .iter()
        .map(|q| {
            json!({
                "name": q.name,
                "durable": true,
                "auto_delete": false,
                "arguments": arguments(&q.arguments),
            })
        })
        .collect();
    let bindings: Vec<Value> = topology::bindings(names, mode)
        .iter()
        .map(|b| {
            let (destination, destination_type) = match &b.destination {
                Destination::Queue(q) => (q, "queue"),
                Destination::Exchange(x) => (x, "exchange"),
            };
            json!({
                "source": b.source,
                "destination": destination,
                "destination_type": destination_type,
                "routing_key": b.key,
                "arguments": {},
            })
        })
        .collect();
    json!({
        "exchanges": exchanges,
        "queues": queues,
        "bindings": bindings,
    })
}

/// The text of a definitions file: pretty-printed JSON and a trailing newline.
pub fn render(names: &Names, mode: Mode) -> String {
    // Serializing a `Value` cannot fail.
    let mut text = serde_json::to_string_pretty(&definitions(names, mode)).unwrap_or_default();
    text.push('\n');
    text
}

/// The committed file of each mode, relative to the repository root.
pub fn file_name(mode: Mode) -> String {
    format!("rabbitmq/definitions.{}.json", mode.as_str())
}

/// The service's user name in [`access`].
pub const SERVICE_USER: &str = "order-timeout";
/// The publishers' user name in [`access`].
pub const PUBLISHER_USER: &str = "order-timeout-publisher";

/// `name` as a regular expression that matches it alone.
fn literal(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_string()
            } else {
                format!("\\{c}")
            }
        })
        .collect()
}

/// Least privilege on the broker, as definitions to import (`POST
/// /api/definitions`, or `rabbitmqctl import_definitions`) into `vhost`:
/// - the service's user, whose configure, write and read permissions cover
///   the prefix's names only (`<prefix>` and `<prefix>.*`: the probe of the
///   delay mode and the events exchange included), tagged `management` so it
///   can read its own vhost's counts through the management API;
/// - the publishers' user, which can write to the entry exchange and nothing
///   else: no queue to read, nothing to declare, no other exchange.
///
/// Neither has a password (`password_hash` empty): set one after the import
/// (`rabbitmqctl change_password`), so that no password is ever in a file.
pub fn access(names: &Names, vhost: &str) -> Value {
    let entry = literal(names.entry());
    let ours = format!("^{entry}(\\..*)?$");
    let user = |name: &str, tags: &[&str]| {
        json!({
            "name": name,
            "password_hash": "",
            "hashing_algorithm": "rabbit_password_hashing_sha256",
            "tags": tags,
            "limits": {},
        })
    };
    json!({
        "users": [user(SERVICE_USER, &["management"]), user(PUBLISHER_USER, &[])],
        "permissions": [
            {"user": SERVICE_USER, "vhost": vhost, "configure": ours, "write": ours, "read": ours},
            {"user": PUBLISHER_USER, "vhost": vhost, "configure": "^$", "write": format!("^{entry}$"), "read": "^$"},
        ],
    })
}

/// The committed access file (default prefix, vhost `/`).
pub const ACCESS_FILE: &str = "rabbitmq/definitions.access.json";

/// The text of the access file: pretty-printed JSON and a trailing newline.
pub fn render_access(names: &Names, vhost: &str) -> String {
    let mut text = serde_json::to_string_pretty(&access(names, vhost)).unwrap_or_default();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::TimeoutKind;
    use std::path::PathBuf;

    /// The committed files are exactly what the code declares. To regenerate after
    /// a topology change: `ORDER_TIMEOUT_WRITE_DEFINITIONS=1 cargo test --lib definitions`.
    #[test]
    fn committed_definitions_match_the_code() {
        let names = Names::new("order.timeouts");
        for mode in [Mode::Ttl, Mode::Plugin, Mode::Native] {
            let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(file_name(mode));
            let expected = render(&names, mode);
            if std::env::var_os("ORDER_TIMEOUT_WRITE_DEFINITIONS").is_some() {
                std::fs::write(&path, &expected).unwrap();
            }
            let committed = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                committed == expected,
                "{} differs from the topology in the code; regenerate it with \
                 ORDER_TIMEOUT_WRITE_DEFINITIONS=1 cargo test --lib definitions",
                path.display()
            );
        }
    }

    #[test]
    fn committed_access_matches_the_code() {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(ACCESS_FILE);
        let expected = render_access(&Names::new("order.timeouts"), "/");
        if std::env::var_os("ORDER_TIMEOUT_WRITE_DEFINITIONS").is_some() {
            std::fs::write(&path, &expected).unwrap();
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == expected,
            "{} differs from the code; regenerate it with \
             ORDER_TIMEOUT_WRITE_DEFINITIONS=1 cargo test --lib definitions",
            path.display()
        );
    }

    #[test]
    fn access_covers_the_prefix_and_nothing_else() {
        let a = access(&Names::new("shop.t-1"), "v");
        let service = &a["permissions"][0];
        assert_eq!(service["configure"], "^shop\\.t\\-1(\\..*)?$");
        assert_eq!(service["read"], service["write"]);
        let publisher = &a["permissions"][1];
        assert_eq!(
            (
                publisher["configure"].as_str(),
                publisher["write"].as_str(),
                publisher["read"].as_str()
            ),
            (Some("^$"), Some("^shop\\.t\\-1$"), Some("^$"))
        );
        assert_eq!(a["users"][0]["password_hash"], "");
    }

    #[test]
    fn ttl_definitions_hold_every_level_and_binding() {
        let names = Names::new("p");
        let d = definitions(&names, Mode::Ttl);
        let levels = topology::LEVELS as usize;
        // entry, parked, due, events, out.00..out.23
        assert_eq!(d["exchanges"].as_array().unwrap().len(), 4 + levels + 1);
        assert_eq!(
            d["exchanges"][3],
            json!({"name": "p.events", "type": "topic", "durable": true, "auto_delete": false, "internal": false, "arguments": {}})
        );
        // ingest, parked, three work queues, level.00..level.22
        assert_eq!(
            d["queues"].as_array().unwrap().len(),
            2 + TimeoutKind::ALL.len() + levels
        );
        assert_eq!(
            d["bindings"].as_array().unwrap().len(),
            topology::bindings(&names, Mode::Ttl).len()
        );
        let level5 = d["queues"]
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["name"] == "p.level.05")
            .unwrap();
        assert_eq!(
            level5["arguments"],
            json!({"x-queue-version": 2, "x-message-ttl": 32000, "x-dead-letter-exchange": "p.out.05"})
        );
        assert_eq!(
            d["exchanges"][0],
            json!({"name": "p", "type": "fanout", "durable": true, "auto_delete": false, "internal": false, "arguments": {"alternate-exchange": "p.parked"}})
        );
        assert!(
            d.to_string().find("\"vhost\"").is_none(),
            "no vhost: imports anywhere"
        );
    }

    #[test]
    fn plugin_definitions_have_the_fanout_entry_and_the_delay_stage() {
        let d = definitions(&Names::new("p"), Mode::Plugin);
        // The entry is the same fanout as in ttl mode: the router validates first.
        assert_eq!(
            d["exchanges"][0],
            definitions(&Names::new("p"), Mode::Ttl)["exchanges"][0]
        );
        let delay = d["exchanges"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == "p.delay")
            .unwrap();
        assert_eq!(delay["type"], "x-delayed-message");
        assert_eq!(delay["arguments"], json!({"x-delayed-type": "direct"}));
        for kind in TimeoutKind::ALL {
            assert!(
                d["bindings"].as_array().unwrap().contains(&json!({
                    "source": "p.delay", "destination": "p.due", "destination_type": "exchange",
                    "routing_key": kind.as_str(), "arguments": {},
                })),
                "{kind:?}"
            );
        }
        assert!(!d.to_string().contains("p.level."));
        assert!(!d.to_string().contains("p.out."));
    }
}
