//! The Grafana dashboard `rabbitmq/grafana/order-timeout.json` is well formed
//! and reads only metrics that exist (ours are checked by `metrics`, after a
//! cycle that exposes every one of them).

use std::collections::HashSet;

use serde_json::Value;

use crate::helpers::*;

const DASHBOARD: &str = "rabbitmq/grafana/order-timeout.json";

/// RabbitMQ's own metrics the dashboard reads, as the rabbitmq_prometheus plugin
/// documents them (per queue with `prometheus.return_per_object_metrics = true`
/// or from `/metrics/per-object`).
const RABBITMQ_METRICS: &[&str] = &[
    "rabbitmq_queue_messages_ready",
    "rabbitmq_queue_messages_unacked",
    "rabbitmq_queue_consumers",
];

/// Every Prometheus query of the dashboard.
fn dashboard_queries(dashboard: &Value) -> Vec<String> {
    dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| {
            t["expr"]
                .as_str()
                .expect("every target has an expr")
                .to_string()
        })
        .collect()
}

/// Identifiers of our and RabbitMQ's metrics in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("order_timeout_") || w.starts_with("rabbitmq_"))
        .map(str::to_string)
        .collect()
}

/// Each of our metrics in a PromQL expression with its label selector (empty
/// when it has none).
fn ours_selectors(expr: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("order_timeout_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let after = &tail[end..];
        let selector = match after.strip_prefix('{') {
            Some(labels) => labels.split('}').next().unwrap_or_default().to_string(),
            None => String::new(),
        };
        found.push(selector);
        rest = &tail[end..];
    }
    found
}

/// Every metric a dashboard query reads exists: ours in `ours` (the samples of
/// `/metrics` after a full cycle), RabbitMQ's in its documented list and, when
/// rabbitmq_prometheus runs here, in the broker's own exposition.
pub async fn check_dashboard_metrics(ours: &[(String, String, f64)]) {
    let dashboard = read_repo_json(DASHBOARD);
    let exposed: HashSet<&str> = ours.iter().map(|(n, _, _)| n.as_str()).collect();
    // The broker's own exposition, when rabbitmq_prometheus runs here.
    let broker = reqwest::get("http://127.0.0.1:15692/metrics/per-object")
        .await
        .ok()
        .filter(|r| r.status().is_success());
    let broker_text = match broker {
        Some(r) => Some(r.text().await.unwrap_or_default()),
        None => {
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "note: rabbitmq_prometheus is not enabled on this broker; RabbitMQ metric names checked against the documented list only"
            );
            None
        }
    };
    let mut seen = 0;
    for expr in dashboard_queries(&dashboard) {
        for name in metric_names(&expr) {
            seen += 1;
            if name.starts_with("order_timeout_") {
                assert!(
                    exposed.contains(name.as_str()),
                    "dashboard reads {name}, which /metrics does not expose"
                );
            } else {
                assert!(
                    RABBITMQ_METRICS.contains(&name.as_str()),
                    "dashboard reads {name}, not a documented RabbitMQ metric"
                );
                if let Some(text) = &broker_text {
                    assert!(
                        text.contains(&format!("# TYPE {name} ")),
                        "the broker exposes no {name}"
                    );
                }
            }
        }
    }
    assert!(seen >= 12, "metric references found: {seen}");
}

/// The dashboard is a Grafana dashboard: JSON, a Prometheus datasource input,
/// every panel with a query on the `datasource` variable, every query of our
/// metrics for `$job` and `$instance` and of RabbitMQ's queues for `$prefix`,
/// each of our metric families from the brief on it.
#[test]
fn grafana_dashboard_is_well_formed() {
    let d = read_repo_json(DASHBOARD);
    assert!(d["schemaVersion"].as_i64().unwrap() >= 36);
    assert_eq!(d["__inputs"][0]["name"], "DS_PROMETHEUS");
    assert_eq!(d["__inputs"][0]["pluginId"], "prometheus");
    let panels = d["panels"].as_array().unwrap();
    let mut ids = HashSet::new();
    for p in panels {
        assert!(ids.insert(p["id"].as_i64().unwrap()), "unique panel ids");
        assert!(p["title"].as_str().is_some_and(|t| !t.is_empty()));
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        assert!(
            !p["targets"].as_array().unwrap().is_empty(),
            "{}",
            p["title"]
        );
        for t in p["targets"].as_array().unwrap() {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        }
    }
    // The variables, and no query with a name they stand for written out.
    let variables: Vec<&str> = d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(variables, ["datasource", "job", "instance", "prefix"]);
    assert_eq!(d["templating"]["list"][0]["query"], "prometheus");
    assert_eq!(d["templating"]["list"][3]["query"], "order.timeouts");
    for expr in dashboard_queries(&d) {
        assert!(
            !expr.contains("order.timeouts"),
            "the prefix is $prefix: {expr}"
        );
        for selector in ours_selectors(&expr) {
            assert!(
                selector.contains("job=~\"$job\"") && selector.contains("instance=~\"$instance\""),
                "each of our metrics is read for $job and $instance: {expr}"
            );
        }
        for name in metric_names(&expr) {
            if name.starts_with("rabbitmq_") {
                assert!(
                    expr.contains("queue=~\"$prefix."),
                    "RabbitMQ's queues by $prefix: {expr}"
                );
            }
        }
    }
    let all = dashboard_queries(&d).join("\n");
    for family in [
        "order_timeout_timeouts_handled_total",
        "order_timeout_lateness_seconds_bucket",
        "order_timeout_parked_messages_total",
        "order_timeout_sweeper_catches_total",
        "order_timeout_outbox_backlog",
        "order_timeout_outbox_oldest_age_seconds",
        "order_timeout_late_payments_total",
        "order_timeout_consumer_pauses_total",
        "order_timeout_broker_disconnects_total",
        "order_timeout_overdue_orders",
        "order_timeout_oldest_overdue_seconds",
        "order_timeout_pending_timeouts",
        "order_timeout_broker_connected",
        "order_timeout_database_up",
        "order_timeout_due_next",
        "order_timeout_events_backlog",
        "order_timeout_events_oldest_age_seconds",
        "order_timeout_events_set_aside",
        "rabbitmq_queue_messages_ready",
    ] {
        assert!(all.contains(family), "the dashboard shows {family}");
    }
    assert!(all.contains("histogram_quantile(0.5") && all.contains("histogram_quantile(0.99"));
    assert!(all.contains("queue=~\"$prefix.level.*\""));
    assert!(all.contains("queue=~\"$prefix.work.*\""));
    assert!(all.contains("by (kind, window) (order_timeout_due_next"));
}
