//! The binary's contracts: a wrong setting stops start-up naming the key;
//! `config` prints the settings in effect without their secrets; `doctor`
//! reports and exits by what it found; `schedule` publishes per the wire
//! contract.

use std::process::Command;
use std::time::Duration;

use order_timeout_harness::Serve;

use crate::helpers::*;

const BIN: &str = env!("CARGO_BIN_EXE_order-timeout");

#[test]
fn wrong_settings_stop_start_up_naming_the_key() {
    for (var, value, key) in [
        ("ORDER_TIMEOUT__AMQP__DELAY_MODE", "fast", "amqp.delay_mode"),
        ("ORDER_TIMEOUT__WINDOWS__PAYMENT", "soon", "windows.payment"),
        ("ORDER_TIMEOUT__HTTP__BIND", "everywhere", "http.bind"),
        ("ORDER_TIMEOUT__SWEEPER__GRACE", "-1s", "sweeper.grace"),
        ("ORDER_TIMEOUT__AMQP__DELAYMODE", "ttl", "amqp.delaymode"),
    ] {
        let out = Command::new(BIN)
            .arg("serve")
            .env(var, value)
            .output()
            .expect("binary runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{var}={value}: {stderr}");
        assert!(
            stderr.contains(&format!("`{key}`")),
            "{var}={value}: {stderr}"
        );
    }
}

/// URLs the database library or the AMQP client would refuse with an error
/// quoting them whole, password included: every command stops at start-up,
/// naming the key, and prints the URL only redacted.
#[test]
fn malformed_urls_never_print_their_password_in_any_command() {
    let commands: [&[&str]; 6] = [
        &["serve"],
        &["migrate", "status"],
        &["doctor"],
        &["config"],
        &["schedule", "--order-id", "1", "--in", "1s"],
        &["demo"],
    ];
    let urls = [
        (
            "ORDER_TIMEOUT__DATABASE__URL",
            "mariadb://shop:hunter2pw@127.0.0.1/shop",
            "database.url",
        ),
        (
            "ORDER_TIMEOUT__DATABASE__URL",
            "postgres://shop:hunter2#pw@127.0.0.1/shop",
            "database.url",
        ),
        (
            "ORDER_TIMEOUT__DATABASE__URL",
            "postgres://shop:hunter2?pw@127.0.0.1/shop",
            "database.url",
        ),
        (
            "ORDER_TIMEOUT__DATABASE__URL",
            "postgres://shop:hunter2/pw@127.0.0.1/shop",
            "database.url",
        ),
        (
            "ORDER_TIMEOUT__AMQP__URL",
            "amqp:shop:hunter2pw@127.0.0.1",
            "amqp.url",
        ),
        (
            "ORDER_TIMEOUT__AMQP__URL",
            "amqp://shop:hunter2#pw@127.0.0.1:5672/%2f",
            "amqp.url",
        ),
    ];
    for command in commands {
        for (var, url, key) in urls {
            let out = Command::new(BIN)
                .args(command)
                .env(var, url)
                .output()
                .expect("binary runs");
            let all = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(out.status.code(), Some(2), "{command:?} {url}: {all}");
            assert!(
                all.contains(&format!("`{key}`")),
                "{command:?} {url}: {all}"
            );
            assert!(!all.contains("hunter2"), "{command:?} {url}: {all}");
        }
    }
}

/// A settings file with a syntax error on a line holding a secret (a token
/// without its closing quote; a database URL with a password): every command
/// stops at start-up naming the file, line and column, never the line.
#[test]
fn a_syntax_error_in_the_file_stops_start_up_without_quoting_the_line() {
    let dir = std::env::temp_dir().join(format!("ot-syntax-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("order-timeout.toml");
    let files = [
        (
            "[windows]\npayment = \"2s\"\n[http]\nadmin_tokens = \"hunter2-token-0123456789\n",
            4,
        ),
        (
            "[database]\nurl = \"postgres://shop:hunter2-pw@127.0.0.1/shop\nmax_connections = 5\n",
            2,
        ),
    ];
    for (text, line) in files {
        std::fs::write(&path, text).unwrap();
        for command in [&["serve"][..], &["doctor"], &["config"]] {
            let out = Command::new(BIN)
                .arg("--config")
                .arg(&path)
                .args(command)
                .output()
                .expect("binary runs");
            let all = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(out.status.code(), Some(2), "{command:?}: {all}");
            assert!(!all.contains("hunter2"), "{command:?}: {all}");
            assert!(
                all.contains(&path.display().to_string())
                    && all.contains(&format!("line {line}, column ")),
                "{command:?}: {all}"
            );
        }
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// Runs the binary with `args` and `env`; its exit code, stdout and stderr.
fn run_bin(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("binary runs");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

/// A settings file's lines without the `# from …` marks of `config`.
fn unmarked(printed: &str) -> Vec<&str> {
    let lines = printed.lines();
    lines
        .map(|l| l.split("  # from ").next().unwrap_or(l))
        .collect()
}

/// `config` prints what the file and the environment set, each saying where
/// from, and never a password or token; printed, it is a settings file again:
/// read back (the redacted tokens given for real in the environment, as they
/// should be), it prints the same settings.
#[test]
fn config_prints_the_settings_in_effect_without_secrets() {
    let dir = std::env::temp_dir().join(format!("ot-config-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("order-timeout.toml");
    std::fs::write(
        &file,
        r#"
[amqp]
url = "amqp://svc:hunter2-mq@127.0.0.1:5672/%2f"
prefix = "file.prefix"
[http]
admin_tokens = "hunter2-admin-0123456789"
[windows]
payment = "10m"
"#,
    )
    .unwrap();
    let file = file.display().to_string();
    let checkout = (
        "ORDER_TIMEOUT__HTTP__CHECKOUT_TOKENS",
        "hunter2-checkout-0123",
    );
    let admin = (
        "ORDER_TIMEOUT__HTTP__ADMIN_TOKENS",
        "hunter2-admin-0123456789",
    );
    let (code, printed, stderr) = run_bin(
        &["--config", &file, "config"],
        &[("ORDER_TIMEOUT__AMQP__PREFIX", "env.prefix"), checkout],
    );
    assert_eq!(code, Some(0), "{stderr}");
    for line in [
        "prefix = \"env.prefix\"  # from env ORDER_TIMEOUT__AMQP__PREFIX".to_string(),
        format!("payment = \"10m\"  # from file {file}"),
        format!("url = \"amqp://svc:***@127.0.0.1:5672/%2f\"  # from file {file}"),
        format!("admin_tokens = \"***\"  # from file {file}"),
        "checkout_tokens = \"***\"  # from env ORDER_TIMEOUT__HTTP__CHECKOUT_TOKENS".to_string(),
        // What nobody set is as shipped.
        "receipt = \"14d\"".to_string(),
        "# table = \"\"".to_string(),
    ] {
        assert!(printed.lines().any(|l| l == line), "{line}\n{printed}");
    }
    assert!(!printed.contains("hunter2"), "{printed}");

    let again = dir.join("printed.toml").display().to_string();
    std::fs::write(&again, &printed).unwrap();
    // Read back as it is, a redacted token is refused by name, never taken
    // for a token.
    let (code, stdout, stderr) = run_bin(&["--config", &again, "config"], &[]);
    assert_eq!(code, Some(2), "{stdout}{stderr}");
    assert!(
        stderr.contains("`http.checkout_tokens`") && stderr.contains("redacted"),
        "{stderr}"
    );
    assert!(!stderr.contains("hunter2"), "{stderr}");
    let (code, reprinted, stderr) = run_bin(&["--config", &again, "config"], &[checkout, admin]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(unmarked(&reprinted), unmarked(&printed));
    std::fs::remove_dir_all(dir).unwrap();
}

/// `config --defaults` is the shipped file, whatever the environment says;
/// `config` with a wrong value stops like every command, naming the key.
#[test]
fn config_defaults_is_the_shipped_file_and_a_wrong_value_stops_config() {
    let wrong = ("ORDER_TIMEOUT__AMQP__DELAY_MODE", "fast");
    let (code, stdout, stderr) = run_bin(&["config", "--defaults"], &[wrong]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout, include_str!("../../config/order-timeout.toml"));
    let (code, stdout, stderr) = run_bin(&["config"], &[wrong]);
    assert_eq!(code, Some(2), "{stdout}{stderr}");
    assert!(stderr.contains("`amqp.delay_mode`"), "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
}

#[test]
fn secrets_never_reach_doctor_output() {
    let out = Command::new(BIN)
        .arg("doctor")
        .env(
            "ORDER_TIMEOUT__AMQP__URL",
            "amqp://guest:s3cret-pw@127.0.0.1:1/%2f",
        )
        .env(
            "ORDER_TIMEOUT__DATABASE__URL",
            "postgres://postgres:s3cret-pw@127.0.0.1:1/x",
        )
        .output()
        .expect("binary runs");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success(),
        "unreachable services are a problem: {all}"
    );
    assert!(all.contains("FAIL"), "{all}");
    assert!(!all.contains("s3cret-pw"), "{all}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_reports_mode_and_topology_and_schedule_publishes_ttl() {
    run(Backend::Sqlite, DelayMode::Ttl, doctor_and_schedule).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_reports_mode_and_topology_and_schedule_publishes_plugin() {
    run(Backend::Sqlite, DelayMode::Plugin, doctor_and_schedule).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_reports_mode_and_topology_and_schedule_publishes_native() {
    run(Backend::Sqlite, DelayMode::Native, doctor_and_schedule).await
}

async fn doctor_and_schedule(backend: Backend, mode: DelayMode) {
    let app = spawn_app(Spawn::new(backend, mode)).await;
    // Everything the app runs with, the delay mode and management API included.
    let env = app.env.clone();

    let out = Command::new(BIN)
        .arg("doctor")
        .envs(env.clone())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("delay mode: {}", mode.as_str())),
        "{stdout}"
    );
    let (topology, other_queue_type, in_use, absent) = match mode {
        DelayMode::Ttl => (
            "topology: 28 exchanges and 28 queues declared, types and arguments as expected",
            "28 declared with another type or other arguments",
            "ttl stage: 23 level queues, 0 timers waiting (in use)",
            "plugin stage: not declared in this vhost",
        ),
        DelayMode::Plugin => (
            "topology: 5 exchanges and 5 queues declared, types and arguments as expected",
            "5 declared with another type or other arguments",
            "plugin stage: order.timeouts.delay, 0 timers waiting (in use)",
            "ttl stage: not declared in this vhost",
        ),
        DelayMode::Native => (
            "topology: 5 exchanges and 6 queues declared, types and arguments as expected",
            // The wait queue is a quorum queue whatever amqp.queue_type says.
            "5 declared with another type or other arguments",
            "native stage: order.timeouts.wait (quorum queue), 0 timers held (in use)",
            "plugin stage: not declared in this vhost",
        ),
    };
    let events = [
        "ok    events: order.timeouts.events (topic): every committed transition",
        "ok    events outbox: 0 domain events waiting to be published, 0 set aside",
    ];
    for line in [topology, in_use, absent, "(env ORDER_TIMEOUT__AMQP__URL)"]
        .into_iter()
        .chain(events)
    {
        assert!(stdout.contains(line), "{line}\n{stdout}");
    }

    // The same vhost seen with another queue type: doctor says the topology differs.
    let out = Command::new(BIN)
        .arg("doctor")
        .envs(env.clone())
        .env("ORDER_TIMEOUT__AMQP__QUEUE_TYPE", "quorum")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(stdout.contains(other_queue_type), "{stdout}");

    app.put_stock("A", 1).await;
    // A long window: the timer waits in the stage, and doctor counts it.
    let waiting = app.order(&[("A", 1)], "1h").await;
    let counted = in_use.replace("0 timers", "1 timers");
    let stdout = wait_until(
        Duration::from_secs(30),
        "doctor counts the waiting timer",
        || async {
            let out = Command::new(BIN)
                .arg("doctor")
                .envs(env.clone())
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout).to_string();
            stdout.contains(&counted).then_some(stdout)
        },
    )
    .await;
    if mode == DelayMode::Plugin {
        // The plugin's table is node-local: doctor says what removing it would cost.
        assert!(
            stdout.contains("WARN  plugin stage: 1 timers wait in the plugin's node-local table"),
            "{stdout}"
        );
    }
    assert_eq!(app.get_order(&waiting).await["status"], "pending_payment");

    app.put_stock("B", 1).await;
    let id = app.order(&[("B", 1)], "2s").await;
    let out = Command::new(BIN)
        .args([
            "schedule",
            "--order-id",
            &id,
            "--kind",
            "payment",
            "--in",
            "2s",
        ])
        .envs(env)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    app.wait_status(&id, "cancelled", Duration::from_secs(8))
        .await;
    wait_until(Duration::from_secs(8), "both messages handled", || async {
        (app.metric(
            "order_timeout_timeouts_handled_total",
            &["kind=\"payment\""],
        )
        .await
            >= 2.0)
            .then_some(())
    })
    .await;
}

/// Runs `serve` until its log says `until` (the test fails if it never does),
/// and returns what it logged.
async fn logs_of_serve(env: &[(&str, String)], until: &str) -> String {
    let log = std::env::temp_dir().join(format!("ot-logs-{}.log", uuid::Uuid::new_v4().simple()));
    let mut child = Serve::new(BIN)
        .envs(env.iter().map(|(k, v)| (*k, v.clone())))
        .log(&log)
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    wait_until(
        Duration::from_secs(30),
        &format!("serve logs {until:?}"),
        || async { child.log_text().contains(until).then_some(()) },
    )
    .await;
    child.kill();
    let logs = child.log_text();
    let _ = std::fs::remove_file(&log);
    logs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_never_reach_logs() {
    let db = std::env::temp_dir().join(format!("ot-logs-{}.db", uuid::Uuid::new_v4().simple()));
    let env = [
        // A broker that is not there: the service keeps retrying and says so.
        (
            "ORDER_TIMEOUT__AMQP__URL",
            "amqp://shop:hunter2-secret@127.0.0.1:1/%2f".to_string(),
        ),
        (
            "ORDER_TIMEOUT__DATABASE__URL",
            format!("sqlite://{}?mode=rwc", db.display()),
        ),
        ("ORDER_TIMEOUT__LOG__FORMAT", "json".to_string()),
        ("ORDER_TIMEOUT__LOG__LEVEL", "debug".to_string()),
    ];
    let logs = logs_of_serve(&env, "broker connection lost").await;
    let _ = std::fs::remove_file(&db);
    assert!(!logs.contains("hunter2"), "{logs}");
    // JSON lines for machines: every line parses, with fields at the top level.
    for line in logs.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(v["level"].is_string() && v["message"].is_string(), "{line}");
    }

    // A database that is not there: start-up fails, naming it without its password.
    let out = Command::new(BIN)
        .arg("serve")
        .env(
            "ORDER_TIMEOUT__DATABASE__URL",
            "postgres://shop:hunter2-secret@127.0.0.1:1/shop",
        )
        .output()
        .unwrap();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success());
    assert!(
        all.contains("cannot connect to the database postgres://shop:***@127.0.0.1:1/shop"),
        "{all}"
    );
    assert!(!all.contains("hunter2"), "{all}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_tells_what_happened_and_leaves_nothing_ttl() {
    run(Backend::Sqlite, DelayMode::Ttl, demo).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_tells_what_happened_and_leaves_nothing_plugin() {
    run(Backend::Sqlite, DelayMode::Plugin, demo).await
}

async fn demo(_: Backend, mode: DelayMode) {
    let vhost = Vhost::create().await;
    let started = std::time::Instant::now();
    let out = Command::new(BIN)
        .arg("demo")
        .env(
            "ORDER_TIMEOUT__AMQP__URL",
            format!("{BROKER}/{}", vhost.name()),
        )
        .env("ORDER_TIMEOUT__AMQP__DELAY_MODE", mode.as_str())
        .env(
            "ORDER_TIMEOUT__AMQP__MANAGEMENT_URL",
            management_base(false),
        )
        .output()
        .unwrap();
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A guard against a hang, not a speed target: on an idle machine the demo
    // takes about 15 s, but a broker busy with the whole suite can take a
    // minute to declare its topology.
    assert!(took < Duration::from_secs(150), "the demo took {took:?}");
    // What really happened: every unpaid order cancelled by its timer, on time.
    for line in [
        "6 orders: 2 paid, 4 cancelled",
        "4 cancelled by their timer from the broker, at most",
        &format!("(delay mode: {};", mode.as_str()),
    ] {
        assert!(stdout.contains(line), "{line}\n{stdout}");
    }
    assert!(!stdout.contains("instead"), "{stdout}");
    // Piped: plain lines, no escape codes.
    assert!(!stdout.contains('\x1b'), "{stdout}");
    let v = url_encode(vhost.name());
    let queues = api_get(&format!("/queues/{v}")).await;
    assert_eq!(queues, serde_json::json!([]), "the demo left queues behind");
    let exchanges = api_get(&format!("/exchanges/{v}")).await;
    let left: Vec<&str> = exchanges
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|x| x["name"].as_str())
        .filter(|n| !n.is_empty() && !n.starts_with("amq."))
        .collect();
    assert!(left.is_empty(), "the demo left exchanges behind: {left:?}");
}
