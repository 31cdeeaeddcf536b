//! Reloading the settings while running: during a steady stream of
//! deadlines, several reloads lose nothing, apply nothing early, drop no
//! connection and give new windows to the orders placed after them only; a
//! configuration that does not validate is refused whole; keys read only at
//! start are reported, not applied; SIGHUP reloads a real `serve` process,
//! its log level included.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use order_timeout_harness::{Serve, Signal};
use sea_orm::{ConnectionTrait, Statement};
use serde_json::Value;

use crate::control::{count, ctl};
use crate::helpers::*;

const BIN: &str = env!("CARGO_BIN_EXE_order-timeout");

/// A settings file of its own for one test, removed with it.
struct ConfigFile {
    dir: PathBuf,
    path: PathBuf,
}

impl ConfigFile {
    fn new(text: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("ot-reload-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = Self {
            path: dir.join("order-timeout.toml"),
            dir,
        };
        file.write(text);
        file
    }
    /// Replaces the file's text, as an operator editing it would (through a
    /// rename, so a reload never reads half a file).
    fn write(&self, text: &str) {
        let next = self.dir.join("next.toml");
        std::fs::write(&next, text).unwrap();
        std::fs::rename(&next, &self.path).unwrap();
    }
    fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// POST /admin/reload: status and body.
async fn reload(app: &TestApp) -> (u16, Value) {
    let resp = app
        .http
        .post(format!("{}/admin/reload", app.base))
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

/// The keys of a reload answer's list.
fn keys(list: &Value) -> Vec<String> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|c| c["key"].as_str().unwrap().to_string())
        .collect()
}

/// `(created_at, pay_deadline)` of every order, by id.
async fn windows(app: &TestApp) -> HashMap<String, i64> {
    let db = &app.ctx.db;
    let rows = db
        .query_all_raw(Statement::from_string(
            db.get_database_backend(),
            "SELECT id, created_at_ms, pay_deadline_ms FROM orders",
        ))
        .await
        .unwrap();
    rows.iter()
        .map(|row| {
            let id: i64 = row.try_get_by_index(0).unwrap();
            let created: i64 = row.try_get_by_index(1).unwrap();
            let deadline: i64 = row.try_get_by_index(2).unwrap();
            (id.to_string(), deadline - created)
        })
        .collect()
}

/// Places an order of one unit of W on the default payment window; its id.
async fn place_default(api: &Api) -> String {
    let resp = api
        .http
        .post(format!("{}/orders", api.base))
        .json(&serde_json::json!({"items": [{"sku": "W", "quantity": 1}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 201);
    let order: Value = resp.json().await.unwrap();
    order["id"].as_str().unwrap().to_string()
}

/// The settings file of one phase: the payment window and some tuning.
fn phase_file(window: &str, tuning: &str) -> String {
    format!("[windows]\npayment = \"{window}\"\n{tuning}")
}

/// The scenario: orders placed steadily for 8 s on the default
/// payment window (the file's), their deadlines 1.5 to 3 s away, so they come
/// due all along; every 2 s the file changes and is reloaded. Then: every
/// order cancelled once, none early, none by the sweeper; each one's window
/// is the one in effect when it was placed; no broker connection dropped and
/// no delivery given back.
async fn reload_during_steady_deadlines(backend: Backend, mode: DelayMode) {
    // How long each phase places orders: its orders come due during the next.
    const PHASE: Duration = Duration::from_secs(2);
    let phases: [(&str, i64, &str); 4] = [
        ("2s", 2000, ""),
        (
            "3s",
            3000,
            "[consumer]\nbatch_size = 7\nbatch_wait = \"2ms\"\n[relay]\ninterval = \"200ms\"\nbatch_size = 9\n[log]\nlevel = \"debug\"\n",
        ),
        (
            "1500ms",
            1500,
            "[consumer]\nbatch_size = 50\nhold_max = \"500ms\"\n[sweeper]\ninterval = \"2s\"\ngrace = \"30s\"\nbatch_size = 10\n",
        ),
        ("2500ms", 2500, "[metrics]\ngauge_interval = \"1s\"\n"),
    ];
    let file = ConfigFile::new(&phase_file(phases[0].0, phases[0].2));
    let app = spawn_app(
        Spawn::new(backend, mode).env("ORDER_TIMEOUT_CONFIG", file.path().display().to_string()),
    )
    .await;
    app.put_stock("W", 10_000).await;

    // Which window each order was placed under.
    let mut expected: HashMap<String, i64> = HashMap::new();
    let start = Instant::now();
    let mut phase = 0;
    while start.elapsed() < PHASE * phases.len() as u32 {
        let due_phase = (start.elapsed().as_millis() / PHASE.as_millis()) as usize;
        if due_phase > phase && due_phase < phases.len() {
            phase = due_phase;
            let (window, _, tuning) = phases[phase];
            file.write(&phase_file(window, tuning));
            let (status, body) = reload(&app).await;
            assert_eq!(status, 200, "{body}");
            assert_eq!(body["outcome"], "applied", "{body}");
            let changed = keys(&body["changed"]);
            assert!(changed.contains(&"windows.payment".into()), "{body}");
            assert_eq!(
                keys(&body["restart_needed"]),
                Vec::<String>::new(),
                "{body}"
            );
        }
        // No window asked for: the default, which the reloads change.
        let id = place_default(&app).await;
        expected.insert(id, phases[phase].1);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(phase, 3, "every reload happened");
    let n = expected.len() as i64;
    wait_until(Duration::from_secs(30), "every order cancelled", || async {
        (count(
            &app,
            "SELECT COUNT(*) FROM orders WHERE status = 'cancelled'",
        )
        .await
            == n)
            .then_some(())
    })
    .await;

    // The window of each order is the one in effect when it was placed.
    let placed = windows(&app).await;
    for (id, window) in &expected {
        assert_eq!(placed[id], *window, "order {id}");
    }
    for (_, window, _) in phases {
        assert!(
            expected.values().filter(|w| **w == window).count() > 10,
            "orders placed in every phase"
        );
    }
    // Once each, none early, none caught by the sweeper.
    assert_eq!(
        count(
            &app,
            "SELECT COUNT(*) FROM orders WHERE cancelled_at_ms < pay_deadline_ms"
        )
        .await,
        0
    );
    let cancels = "SELECT COUNT(*) FROM order_events WHERE event = 'cancelled'";
    assert_eq!(count(&app, cancels).await, n);
    let by_timeout = "SELECT COUNT(DISTINCT order_id) FROM order_events WHERE event = 'cancelled' AND cause = 'timeout'";
    assert_eq!(count(&app, by_timeout).await, n);
    assert_eq!(app.stock("W").await["available"], 10_000);

    // Nothing dropped: one connection per role all along, no delivery given back.
    for role in ["relay", "router", "consumer"] {
        let label = format!("role=\"{role}\"");
        assert_eq!(
            app.metric("order_timeout_broker_connects_total", &[&label])
                .await,
            1.0,
            "{role} connected once"
        );
    }
    assert_eq!(
        app.metric("order_timeout_redeliveries_total", &[]).await,
        0.0
    );
    assert_eq!(
        app.metric(
            "order_timeout_config_reloads_total",
            &["outcome=\"applied\""]
        )
        .await,
        3.0
    );
    // The last file is what runs: a key it no longer sets is back to its default.
    let live = app.ctx.live();
    assert_eq!(live.metrics.gauge_interval, Duration::from_secs(1));
    assert_eq!(live.consumer.batch_size, 200);
    assert_eq!(live.sweeper.interval, Duration::from_secs(30));
}

each_mode!(reload_during_steady_deadlines);

/// A file that does not validate is refused whole (its valid changes
/// too), naming the key; a key read only at start is reported, not applied.
async fn refused_whole_and_restart_keys_reported(backend: Backend, mode: DelayMode) {
    let file = ConfigFile::new(&phase_file("2s", ""));
    let app = spawn_app(
        Spawn::new(backend, mode).env("ORDER_TIMEOUT_CONFIG", file.path().display().to_string()),
    )
    .await;
    app.put_stock("W", 100).await;
    let prefix = app.ctx.settings.amqp.prefix.clone();

    for (text, key) in [
        (
            phase_file("5s", "[consumer]\nbatch_size = 0\n"),
            "consumer.batch_size",
        ),
        (
            phase_file("5s", "[sweeper]\nintervall = \"1s\"\n"),
            "sweeper.intervall",
        ),
        (phase_file("5s", "[windows]\n"), "config file"),
    ] {
        file.write(&text);
        let (status, body) = reload(&app).await;
        assert_eq!(status, 422, "{body}");
        assert_eq!(body["outcome"], "refused");
        assert!(
            body["error"].as_str().unwrap().contains(key),
            "{key}: {body}"
        );
        let (out, err, ok) = ctl(&app, &["reload"]);
        assert!(!ok, "{out}");
        assert!(
            err.contains("reload refused, the running settings stay") && err.contains(key),
            "{err}"
        );
    }
    assert_eq!(
        app.metric(
            "order_timeout_config_reloads_total",
            &["outcome=\"refused\""]
        )
        .await,
        6.0
    );
    // The running window is the old one.
    let id = place_default(&app).await;
    let order = app.get_order(&id).await;
    assert_eq!(ms(&order, "pay_deadline") - ms(&order, "created_at"), 2000);

    // Valid, with keys read only at start changed too, a secret among them.
    let secret = new_token("checkout");
    file.write(&format!(
        "{}[amqp]\nprefix = \"elsewhere\"\nqueue_type = \"quorum\"\n[http]\nrequest_timeout = \"7s\"\ncheckout_tokens = \"{secret}\"\n",
        phase_file("4s", "")
    ));
    let (status, body) = reload(&app).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["outcome"], "applied");
    // Tokens apply while running; table order puts them first.
    assert_eq!(
        keys(&body["changed"]),
        ["http.checkout_tokens", "windows.payment"]
    );
    assert_eq!(body["changed"][1]["from"], "2s");
    assert_eq!(body["changed"][1]["to"], "4s");
    let mut restart = keys(&body["restart_needed"]);
    restart.sort();
    assert_eq!(
        restart,
        ["amqp.prefix", "amqp.queue_type", "http.request_timeout"]
    );
    assert!(
        !body.to_string().contains(&secret),
        "the token is redacted: {body}"
    );
    assert_eq!(app.ctx.live().amqp.prefix, prefix, "not applied");
    let id = place_default(&app).await;
    let order = app.get_order(&id).await;
    assert_eq!(ms(&order, "pay_deadline") - ms(&order, "created_at"), 4000);
    app.cancelled_on_time(&id, Duration::from_secs(10)).await;

    // Read again unchanged: nothing applies, the restart is still needed,
    // and `ctl status` says so.
    let (out, err, ok) = ctl(&app, &["reload"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("nothing that applies while running changed"),
        "{out}"
    );
    assert!(out.contains("amqp.prefix"), "{out}");
    let (out, _, ok) = ctl(&app, &["status"]);
    assert!(ok);
    assert!(!out.contains(&secret), "{out}");
    assert!(
        out.contains("last reload") && out.contains("unchanged"),
        "{out}"
    );
    assert!(
        out.contains("needs a restart") && out.contains("http.request_timeout: 30s -> 7s"),
        "{out}"
    );
}
each_mode!(refused_whole_and_restart_keys_reported);

/// A real `serve` process: SIGHUP reloads its file, the new window applies to
/// the next order, and the new log level is the filter from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_a_running_serve() {
    let mut app = spawn_app(Spawn::new(Backend::Sqlite, DelayMode::Ttl)).await;
    app.put_stock("W", 100).await;
    app.stop().await;
    let file = ConfigFile::new(&phase_file(
        "2s",
        "[log]\nlevel = \"info\"\nformat = \"json\"\n",
    ));
    let log = file.dir.join("serve.log");
    let mut env = app.env.clone();
    // The file gives these; the environment would win over it.
    env.remove("ORDER_TIMEOUT__LOG__LEVEL");
    let serve = Serve::new(BIN)
        .envs(env)
        .env("ORDER_TIMEOUT__DATABASE__MIGRATE_ON_START", "false")
        .config(file.path())
        .instance("hup")
        .log(&log);
    let (mut child, api) = start_ready(&app, serve).await;
    let before = place_default(&api).await;

    file.write(&phase_file(
        "3s",
        "[log]\nlevel = \"debug\"\nformat = \"json\"\n",
    ));
    child.signal(Signal::Hup).unwrap();
    wait_until(Duration::from_secs(10), "the reload applied", || async {
        let applied = api
            .metric(
                "order_timeout_config_reloads_total",
                &["outcome=\"applied\""],
            )
            .await;
        (applied == 1.0).then_some(())
    })
    .await;
    let after = place_default(&api).await;
    let window = |order: &Value| ms(order, "pay_deadline") - ms(order, "created_at");
    assert_eq!(window(&api.get_order(&before).await), 2000);
    assert_eq!(window(&api.get_order(&after).await), 3000);
    for id in [&before, &after] {
        api.wait_status(id, "cancelled", Duration::from_secs(10))
            .await;
    }
    // A second SIGHUP with a broken file: refused, the process runs on.
    file.write("[windows]\npayment = \"soon\"\n");
    child.signal(Signal::Hup).unwrap();
    wait_until(Duration::from_secs(10), "the reload refused", || async {
        let refused = api
            .metric(
                "order_timeout_config_reloads_total",
                &["outcome=\"refused\""],
            )
            .await;
        (refused == 1.0).then_some(())
    })
    .await;
    assert_eq!(api.ready().await, Some(()), "still serving");
    child.signal(Signal::Term).unwrap();
    child.wait(Duration::from_secs(30)).await.unwrap();

    // The log: `order created` is a debug line, so only the order placed
    // after the reload has one; the reload and the refusal are logged.
    let text = child.log_text();
    let created: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("order created"))
        .collect();
    assert_eq!(created.len(), 1, "{text}");
    assert!(
        created[0].contains(&format!("\"order_id\":\"{after}\"")),
        "{}",
        created[0]
    );
    assert!(
        text.contains("settings reloaded") && text.contains("windows.payment: 2s -> 3s"),
        "{text}"
    );
    assert!(
        text.contains("settings reload refused") && text.contains("windows.payment"),
        "{text}"
    );
}

/// GET `path` on `base` with `token`: the status.
async fn status_with(base: &str, token: &str, path: &str) -> u16 {
    let resp = api_client(Some(token))
        .get(format!("{base}{path}"))
        .send()
        .await
        .unwrap();
    resp.status().as_u16()
}

/// `ctl reload` against `base` with `token`: success, and stdout with stderr.
fn ctl_reload(base: &str, token: &str) -> (bool, String) {
    let out = std::process::Command::new(BIN)
        .args(["ctl", "--url", base, "reload"])
        .env("ORDER_TIMEOUT_CTL_TOKEN", token)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Issue 26, items 2 and 3, on a real `serve` whose tokens and database URL
/// come from its file. A token rotated by reload (old and new both listed,
/// then the old removed) is refused from the next request on, without a
/// restart; a database URL whose password alone changed is reported as
/// needing a restart; and a file with a syntax error on a line holding a
/// token or a password is refused naming file, line and column, never the
/// line, in the 422, in `ctl reload` and in the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rotate_by_reload_and_no_secret_is_ever_quoted() {
    let mut app = spawn_app(Spawn::new(Backend::Postgres, DelayMode::Ttl)).await;
    app.stop().await;
    let old = app.token.clone().unwrap();
    let new = new_token("admin");
    let (buyer_old, buyer_new) = (new_token("checkout"), new_token("checkout"));
    let mut env = app.env.clone();
    // The file gives these; the environment would win over it.
    env.remove("ORDER_TIMEOUT__HTTP__ADMIN_TOKENS");
    let db = env.remove("ORDER_TIMEOUT__DATABASE__URL").unwrap();
    // The server trusts local connections: any password connects.
    let db_with = |password: &str| db.replacen("postgres@", &format!("postgres:{password}@"), 1);
    let settings = |admin: &str, checkout: &str, password: &str| {
        format!(
            "[database]\nurl = \"{}\"\nmigrate_on_start = false\n[http]\nadmin_tokens = \"{admin}\"\ncheckout_tokens = \"{checkout}\"\n",
            db_with(password)
        )
    };
    let file = ConfigFile::new(&settings(&old, &buyer_old, "hunter2-first"));
    let log = file.dir.join("serve.log");
    let serve = Serve::new(BIN)
        .envs(env)
        .config(file.path())
        .instance("rotate")
        .log(&log);
    let (mut child, _) = start_ready(&app, serve).await;
    let base = child.base().to_string();
    let post_reload = |token: &str| {
        let (base, client) = (base.clone(), api_client(Some(token)));
        async move {
            let resp = client
                .post(format!("{base}/admin/reload"))
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            (status, resp.text().await.unwrap())
        }
    };
    let secrets = [
        old.as_str(),
        new.as_str(),
        buyer_old.as_str(),
        buyer_new.as_str(),
        "hunter2",
    ];
    let no_secret = |text: &str| {
        for secret in secrets {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
    };
    assert_eq!(status_with(&base, &old, "/admin/status").await, 200);
    assert_eq!(status_with(&base, &new, "/admin/status").await, 401);

    // Both admin tokens listed; the checkout token swapped at once.
    file.write(&settings(
        &format!("{old},{new}"),
        &buyer_new,
        "hunter2-first",
    ));
    let (status, body) = post_reload(&old).await;
    assert_eq!(status, 200, "{body}");
    no_secret(&body);
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["outcome"], "applied", "{body}");
    assert_eq!(
        keys(&body["changed"]),
        ["http.checkout_tokens", "http.admin_tokens"]
    );
    assert_eq!(keys(&body["restart_needed"]), Vec::<String>::new());
    for token in [&old, &new] {
        assert_eq!(status_with(&base, token, "/admin/status").await, 200);
    }
    // A checkout-scope route: 404 for an order that is not there, once let in.
    assert_eq!(status_with(&base, &buyer_old, "/orders/1").await, 401);
    assert_eq!(status_with(&base, &buyer_new, "/orders/1").await, 404);

    // The old admin token removed, the same number of tokens as before it
    // was added; and only the database password changed.
    file.write(&settings(&new, &buyer_new, "hunter2-second"));
    let (ok, out) = ctl_reload(&base, &new);
    assert!(ok, "{out}");
    no_secret(&out);
    assert!(out.contains("http.admin_tokens"), "{out}");
    assert!(out.contains("database.url"), "{out}");
    assert_eq!(status_with(&base, &old, "/admin/status").await, 401);
    assert_eq!(status_with(&base, &new, "/admin/status").await, 200);
    // Read again: nothing live changed; the new password waits for a restart.
    let (status, body) = post_reload(&new).await;
    assert_eq!(status, 200, "{body}");
    no_secret(&body);
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["outcome"], "unchanged", "{body}");
    assert_eq!(keys(&body["restart_needed"]), ["database.url"]);

    // A missing quote on a token's line, then on the database URL's.
    let good = settings(&new, &buyer_new, "hunter2-second");
    let broken_token = good.replacen(&format!("{new}\""), &new, 1);
    let broken_url = good.replacen(
        &format!("{}\"", db_with("hunter2-second")),
        &db_with("hunter2-second"),
        1,
    );
    for (text, line) in [(broken_token, 5), (broken_url, 2)] {
        file.write(&text);
        let at = format!("line {line}, column ");
        let (status, body) = post_reload(&new).await;
        assert_eq!(status, 422, "{body}");
        no_secret(&body);
        assert!(
            body.contains(&file.path().display().to_string()) && body.contains(&at),
            "{body}"
        );
        let (ok, out) = ctl_reload(&base, &new);
        assert!(!ok, "{out}");
        no_secret(&out);
        assert!(
            out.contains(&file.path().display().to_string()) && out.contains(&at),
            "{out}"
        );
    }
    // Still running on the last good settings.
    assert_eq!(status_with(&base, &new, "/admin/status").await, 200);
    child.signal(Signal::Term).unwrap();
    child.wait(Duration::from_secs(30)).await.unwrap();
    let text = child.log_text();
    no_secret(&text);
    assert!(
        text.contains("settings reload refused") && text.contains("line 2, column "),
        "{text}"
    );
}
