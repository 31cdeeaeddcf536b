//! `order-timeout-bench` end to end at a tiny size: it must finish, pass its own
//! correctness checks, clean up, and write the JSON other tools read. It runs
//! the service binary built beside it (`cargo test --workspace` builds both).

use std::process::Command;

#[test]
fn small_bench_on_sqlite_writes_valid_json() {
    let dir = std::env::temp_dir().join(format!("ot-bench-test-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("latest.json");
    let run = Command::new(env!("CARGO_BIN_EXE_order-timeout-bench"))
        .args([
            "--db",
            "sqlite",
            "--mode",
            "ttl",
            "--burst",
            "200",
            "--steady-rate",
            "50",
            "--steady-secs",
            "3",
            "--clients",
            "16",
            "--skus",
            "8",
            "--tracing-burst",
            "200",
            "--out",
        ])
        .arg(&out)
        // The baseline of the tracing comparison: here the same binary (a
        // real run names an earlier release's), for the mechanics.
        .arg("--tracing-baseline")
        .arg(service_binary())
        .output()
        .expect("the binary runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "bench failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains("cleanup: deleted vhost"), "{stdout}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(report["mode"], "ttl");
    assert_eq!(report["db"], "sqlite");
    // 250 placed, plus the calibration orders.
    assert!(report["orders"].as_u64().unwrap() >= 250, "{report}");
    for key in [
        "checkout_per_s",
        "burst_cancels_per_s",
        "fraction_of_ceiling",
        "service_peak_rss_mb",
        "service_cpu_s",
        "cpu_ms_per_cancel",
        "cpu_ms_per_checkout",
    ] {
        assert!(report[key].as_f64().unwrap() > 0.0, "{key}: {report}");
    }
    for load in ["burst", "steady"] {
        let l = &report["lateness_ms"][load];
        for p in ["p50", "p90", "p99", "max"] {
            assert!(l[p].as_i64().unwrap() >= 0, "{load}.{p}: {report}");
        }
        assert!(l["p50"].as_i64() <= l["max"].as_i64());
    }
    for key in ["consume_ack_per_s", "db_batch_cancel_per_s"] {
        assert!(
            report["ceiling"][key].as_f64().unwrap() > 0.0,
            "{key}: {report}"
        );
    }
    // The broker-only replay of the burst through a copy of the delay path.
    assert!(
        report["ceiling"]["delay_path_per_s"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    // The drain was sampled: CPU per process and where the due timers were.
    let limit = &report["limit"];
    assert!(!limit["verdict"].as_str().unwrap().is_empty(), "{report}");
    for role in ["broker", "database", "service", "bench"] {
        assert!(
            limit["cores_by_process"][role].as_f64().unwrap() >= 0.0,
            "{role}: {report}"
        );
    }
    assert!(
        limit["cores_by_process"]["broker"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    let series = report["burst_drain_series"].as_array().unwrap();
    assert!(!series.is_empty(), "{report}");
    assert!(stdout.contains("limit: "), "{stdout}");
    // The replay covered both loads, and says how late the broker alone was.
    for load in ["burst", "steady"] {
        let l = &report["ceiling"]["delay_path_lateness_ms"][load];
        assert!(l["n"].as_u64().unwrap() > 0, "{load}: {report}");
        assert!(l["p99"].as_i64().unwrap() >= 0, "{load}: {report}");
    }
    assert!(
        !report["steady_limit"]["verdict"]
            .as_str()
            .unwrap()
            .is_empty(),
        "{report}"
    );
    assert!(
        !report["checkout_limit"]["verdict"]
            .as_str()
            .unwrap()
            .is_empty(),
        "{report}"
    );
    check_baseline(&report, &stdout);
    check_tracing(&report, &stdout);
    std::fs::remove_dir_all(dir).ok();
}

/// The same burst of 200 on the baseline, with tracing off and on: the
/// figures of each, and the spans the bench's sink received from the traced
/// run (at least a checkout and a publish per order).
fn check_tracing(report: &serde_json::Value, stdout: &str) {
    let t = &report["tracing"];
    assert_eq!(t["burst"], 200, "{report}");
    for run in ["baseline", "off", "on"] {
        assert_eq!(t["runs"][run].as_array().map(Vec::len), Some(1), "{report}");
        // (CPU per cancel may be unmeasurable at this size: null then.)
        for key in ["checkout_per_s", "burst_cancels_per_s", "service_cpu_s"] {
            assert!(t[run][key].as_f64().unwrap() > 0.0, "{run}.{key}: {report}");
        }
        assert!(
            t[run]["burst_lateness_p99_ms"].as_i64().unwrap() >= 0,
            "{report}"
        );
    }
    for ratio in ["on_over_off", "off_over_baseline"] {
        assert!(
            t[ratio]["checkout_per_s"].as_f64().unwrap() > 0.0,
            "{ratio}: {report}"
        );
    }
    assert!(t["sink"]["spans"].as_u64().unwrap() >= 400, "{report}");
    assert!(
        t["sink"]["export_requests"].as_u64().unwrap() >= 1,
        "{report}"
    );
    assert!(stdout.contains("bench: tracing on"), "{stdout}");
    assert!(stdout.contains("bench: tracing baseline"), "{stdout}");
}

/// The service binary `cargo test --workspace` builds beside the bench.
fn service_binary() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_BIN_EXE_order-timeout-bench"))
        .with_file_name(format!("order-timeout{}", std::env::consts::EXE_SUFFIX))
}

/// The same burst (200 orders, one in ten paid) through the bench's plain
/// poller: there, every unpaid order counted, checked, and set beside ours.
fn check_baseline(report: &serde_json::Value, stdout: &str) {
    let b = &report["baseline"];
    assert_eq!(b["kind"], "poller", "{report}");
    assert_eq!(b["interval_ms"], 1000, "{report}");
    assert_eq!(b["batch"], 1000, "{report}");
    assert_eq!(b["orders"], 200, "{report}");
    assert_eq!(b["unpaid"], 180, "{report}");
    assert_eq!(b["cancelled"], 180, "{report}");
    let l = &b["lateness_ms"];
    assert_eq!(l["n"], 180, "{report}");
    for p in ["p50", "p90", "p99", "max"] {
        assert!(l[p].as_i64().unwrap() >= 0, "baseline {p}: {report}");
    }
    assert!(l["p50"].as_i64() <= l["p99"].as_i64(), "{report}");
    assert!(l["p99"].as_i64() <= l["max"].as_i64(), "{report}");
    let phase = b["phase_ms"].as_i64().unwrap();
    assert!((0..1000).contains(&phase), "{report}");
    assert!(b["wakes"].as_u64().unwrap() >= 1, "{report}");
    assert!(b["cancels_per_s"].as_f64().unwrap() > 0.0, "{report}");
    assert!(b["drain_ms"].as_i64().unwrap() >= 0, "{report}");
    assert!(
        b["machine_cpu_ms_per_cancel"].as_f64().unwrap() >= 0.0,
        "{report}"
    );
    // SQLite runs inside the process that cancels: no database share of its own.
    assert!(b["database_cpu_ms_per_cancel"].is_null(), "{report}");
    for check in [
        "paid_left_paid",
        "none_early",
        "all_unpaid_cancelled",
        "stock_conserved",
    ] {
        assert_eq!(b["checks"][check], true, "{check}: {report}");
    }
    let v = &b["versus"];
    assert_eq!(
        v["ours"]["p99"], report["lateness_ms"]["burst"]["p99"],
        "{report}"
    );
    assert_eq!(v["poller"]["p99"], l["p99"], "{report}");
    assert!(v["ours_ahead_on_p99"].is_boolean(), "{report}");
    assert!(stdout.contains("burst vs a 1 s poller"), "{stdout}");
    assert!(stdout.contains("p99: ours is"), "{stdout}");
}

/// The broker the native-mode runs aim at: `ORDER_TIMEOUT_TEST_BROKER` and
/// `ORDER_TIMEOUT_TEST_MANAGEMENT` as for the service's tests (`make
/// test-broker`), else the machine's own.
fn test_broker() -> Vec<String> {
    let mut args = Vec::new();
    if let Ok(amqp) = std::env::var("ORDER_TIMEOUT_TEST_BROKER") {
        args.extend(["--amqp".to_string(), amqp]);
    }
    if let Ok(management) = std::env::var("ORDER_TIMEOUT_TEST_MANAGEMENT") {
        args.extend(["--management".to_string(), management]);
    }
    args
}

/// Runs the bench in native mode with `args` on the test broker; `None`
/// (having said why) where that broker has no native delays.
fn native_run(args: &[&str]) -> Option<serde_json::Value> {
    let dir = std::env::temp_dir().join(format!("ot-bench-test-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("latest.json");
    let run = Command::new(env!("CARGO_BIN_EXE_order-timeout-bench"))
        .args(["--db", "sqlite", "--mode", "native", "--tracing-burst", "0"])
        .args(args)
        .args(test_broker())
        .arg("--out")
        .arg(&out)
        .output()
        .expect("the binary runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "bench failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains("cleanup: deleted vhost"), "{stdout}");
    if stdout.contains("SKIPPED native mode") {
        // CI's run on RabbitMQ 4.3 sets this: there the mode must run.
        assert!(
            std::env::var_os("ORDER_TIMEOUT_REQUIRE_NATIVE").is_none(),
            "ORDER_TIMEOUT_REQUIRE_NATIVE is set but the bench skipped native mode: {stdout}"
        );
        eprintln!("skipped: the test broker has no native delays (RabbitMQ 4.3 has): {stdout}");
        assert!(!out.exists(), "a skipped run wrote a report");
        std::fs::remove_dir_all(dir).ok();
        return None;
    }
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    std::fs::remove_dir_all(dir).ok();
    assert_eq!(report["mode"], "native", "{report}");
    assert!(
        report["broker"]["version"]
            .as_str()
            .unwrap()
            .starts_with('4'),
        "{report}"
    );
    Some(report)
}

#[test]
fn native_million_reports_the_wait_queues_memory_and_the_scheduling_rate() {
    let Some(report) = native_run(&["--million", "--million-orders", "2000", "--idle-secs", "0"])
    else {
        return;
    };
    let native = &report["native"];
    assert!(native["held_s"].as_f64().unwrap() > 0.0, "{report}");
    assert!(
        native["timers_deferred_per_s"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    assert!(
        native["wait_queue_memory_per_timer_bytes"]
            .as_f64()
            .unwrap()
            > 0.0,
        "{report}"
    );
    assert!(
        native["node_memory_per_timer_bytes"].is_number(),
        "{report}"
    );
    for key in ["before", "peak", "after"] {
        assert!(
            native["wait_queue_memory_mb"][key].is_number(),
            "{key}: {report}"
        );
    }
    assert_eq!(
        report["broker_after"]["wait_queue"]["timers_held"], 2000,
        "{report}"
    );
}

#[test]
fn native_burst_reports_lateness_without_a_delay_path_ceiling() {
    let Some(report) = native_run(&[
        "--burst",
        "200",
        "--steady-rate",
        "50",
        "--steady-secs",
        "3",
        "--clients",
        "16",
        "--skus",
        "8",
    ]) else {
        return;
    };
    for load in ["burst", "steady"] {
        let l = &report["lateness_ms"][load];
        assert!(l["n"].as_u64().unwrap() > 0, "{load}: {report}");
        assert!(l["p99"].as_i64().unwrap() >= 0, "{load}: {report}");
    }
    assert!(report["ceiling"]["delay_path_per_s"].is_null(), "{report}");
    assert!(
        report["ceiling"]["delay_path_skipped"].is_string(),
        "{report}"
    );
    assert_eq!(report["steady_limit"]["target_p99_ms"], 20, "{report}");
    assert!(
        report["limit"]["cores_by_process"]["broker"]
            .as_f64()
            .unwrap()
            > 0.0,
        "{report}"
    );
}
