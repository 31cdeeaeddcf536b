//! The settings file and what comes after loading: the shipped file is the
//! table written out, the settings in effect read back as themselves, a
//! reload takes the live keys, a syntax error, time zones.

use super::*;

/// `config/order-timeout.toml`, as shipped.
const SHIPPED: &str = include_str!("../../../config/order-timeout.toml");

/// `docs/configuration.md`, whose table of settings is the settings table
/// told to a reader.
const PAGE: &str = include_str!("../../../docs/configuration.md");

/// The keys the page's "Every setting" table names, each with the default it
/// gives: `Some` for a code span, `None` for words (`(none)`, `host:pid`).
/// A row may name several keys of one stem (`windows.payment` / `.receipt`),
/// with a default for each or one for all.
fn page_settings() -> Vec<(String, Option<String>)> {
    let section = PAGE
        .split("\n## Every setting\n")
        .nth(1)
        .expect("docs/configuration.md has its section `Every setting`");
    let section = section.split("\n## ").next().unwrap_or(section);
    let mut listed = Vec::new();
    for row in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = row.trim_matches('|').split(" | ").map(str::trim).collect();
        let names: Vec<&str> = cells[0].split(" / ").collect();
        let defaults: Vec<&str> = cells.get(1).map_or(vec![], |c| c.split(" / ").collect());
        assert!(
            defaults.len() == names.len() || defaults.len() == 1,
            "docs/configuration.md: one default per key, or one for all: {row}"
        );
        let first = code(names[0]).unwrap_or_else(|| panic!("docs/configuration.md: {row}"));
        let stem = &first[..first.rfind('.').unwrap_or(0)];
        for (i, name) in names.iter().enumerate() {
            let name = code(name).unwrap_or_else(|| panic!("docs/configuration.md: {row}"));
            let name = match name.starts_with('.') {
                true => format!("{stem}{name}"),
                false => name.to_string(),
            };
            let default = defaults[i.min(defaults.len() - 1)];
            listed.push((name, code(default).map(str::to_string)));
        }
    }
    listed
}

/// The text of a cell that is one code span.
fn code(cell: &str) -> Option<&str> {
    let text = cell.strip_prefix('`')?.strip_suffix('`')?;
    (!text.contains('`')).then_some(text)
}

#[test]
fn the_configuration_page_lists_every_key_with_its_default() {
    let listed = page_settings();
    let on_page: Vec<&str> = listed.iter().map(|(name, _)| name.as_str()).collect();
    let missing: Vec<&str> = keys()
        .map(|k| k.name)
        .filter(|k| !on_page.contains(k))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/configuration.md lacks {missing:?}"
    );
    let unknown: Vec<&str> = on_page
        .iter()
        .copied()
        .filter(|name| !keys().any(|k| k.name == *name))
        .collect();
    assert!(
        unknown.is_empty(),
        "docs/configuration.md names keys the service does not have: {unknown:?}"
    );
    assert_eq!(
        on_page.len(),
        keys().count(),
        "docs/configuration.md names a key twice"
    );
    for (name, default) in &listed {
        let key = keys().find(|k| k.name == name).expect("known");
        match default {
            Some(text) => assert_eq!(
                text, key.default,
                "docs/configuration.md: the default of `{name}`"
            ),
            // Said in words ("(none)", "(empty: …)"): the default is empty.
            None => assert_eq!(
                key.default, "",
                "docs/configuration.md: `{name}` defaults to `{}`, which the page should say as code",
                key.default
            ),
        }
    }
}

/// A settings file below its header.
fn body(file: &str) -> &str {
    &file[file.find("\n[").unwrap_or(0)..]
}

#[test]
fn the_shipped_file_is_the_table_written_out() {
    let written = defaults_file();
    for (n, (ours, shipped)) in written.lines().zip(SHIPPED.lines()).enumerate() {
        let line = n + 1;
        assert_eq!(
            ours, shipped,
            "config/order-timeout.toml line {line}: {REGENERATE}"
        );
    }
    assert_eq!(
        written, SHIPPED,
        "regenerate config/order-timeout.toml: {REGENERATE}"
    );
}

#[test]
fn the_shipped_file_changes_nothing() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/order-timeout.toml");
    let shipped = load_from(Some(&path), &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(values(&shipped), values(&load(&[]).unwrap()));
    // It really was read: every key it sets came from it.
    assert_eq!(shipped.sources["amqp.prefix"], Source::File(path));
    // And what it leaves commented out kept the default (the mapping would
    // be refused with `orders.source = owned`).
    assert_eq!(shipped.sources["mapping.id_column"], Source::Default);
    assert_eq!(shipped.sources["http.admin_tokens"], Source::Default);
}

/// `order-timeout config`: what the file and the environment gave, each
/// saying where from, secrets redacted; read back (the real tokens given again
/// in the environment), the same settings.
#[test]
fn the_settings_in_effect_read_back_as_themselves() {
    let (dir, path) = temp_file(
        "c.toml",
        r#"
[database]
url = "postgres://shop:hunter2-db@db.internal/shop"
[amqp]
url = "amqp://svc:hunter2-mq@mq-1:5672/shop, amqp://svc:hunter2-mq@mq-2:5672/shop"
management_url = "http://ops:hunter2-api@mq-1:15672"
prefetch = 50
[http]
admin_tokens = "hunter2-admin-0123456789"
[orders]
source = "mapped"
[mapping]
table = "oms_order"
status_column = "state"
[mapping.payment]
from = "0"
to = "4"
since_column = "create_time"
[mapping.receipt]
from = 'shipped "by post"'
to = "done\\now"
deadline_column = "receive_by"
"#,
    );
    let token = ("http.admin_tokens", "hunter2-admin-0123456789");
    let env = [
        ("amqp.prefix", "shop.timeouts"),
        ("http.checkout_tokens", "hunter2-check-0123456789"),
        (
            "mapping.release_sql",
            "UPDATE holds SET note = 'it''s \"late\"' WHERE o = ?; DELETE FROM h WHERE o = ?",
        ),
    ];
    let settings = load_from(Some(&path), &env).unwrap_or_else(|e| panic!("{e}"));
    let printed = settings.to_toml();
    assert!(!printed.contains("hunter2"), "{printed}");
    let file = format!("# from file {}", path.display());
    for line in [
        "prefix = \"shop.timeouts\"  # from env ORDER_TIMEOUT__AMQP__PREFIX".to_string(),
        format!("prefetch = 50  {file}"),
        format!("url = \"postgres://shop:***@db.internal/shop\"  {file}"),
        format!("admin_tokens = \"***\"  {file}"),
        "checkout_tokens = \"***\"  # from env ORDER_TIMEOUT__HTTP__CHECKOUT_TOKENS".to_string(),
        // A status is text, even when it looks like a number.
        format!("payment.from = \"0\"  {file}"),
        format!("receipt.from = \"shipped \\\"by post\\\"\"  {file}"),
        // Unset, it stays as shipped: commented out.
        "# stock.table = \"\"".to_string(),
        "# id_column = \"id\"".to_string(),
        "bind = \"127.0.0.1:8080\"".to_string(),
    ] {
        assert!(printed.lines().any(|l| l == line), "{line}\n{printed}");
    }
    // Every key where the shipped file has it, set or commented out.
    let shape = |file: &str| -> Vec<String> {
        let lines = body(file).lines().map(|l| l.trim_start_matches("# "));
        lines
            .map(|l| l.split_once(" = ").map_or(l, |(k, _)| k).into())
            .collect()
    };
    assert_eq!(shape(&printed), shape(SHIPPED));

    let again = dir.join("printed.toml");
    std::fs::write(&again, &printed).unwrap();
    // A redacted token is refused, naming its key: never taken for a token.
    let err = load_from(Some(&again), &[]).unwrap_err().to_string();
    assert!(
        err.contains("`http.checkout_tokens`") && err.contains("redacted"),
        "{err}"
    );
    let read_back = load_from(Some(&again), &[token, ("http.checkout_tokens", env[1].1)])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(values(&read_back), values(&settings));
    std::fs::remove_dir_all(dir).unwrap();
}

/// Nothing but the table's defaults: the settings in effect are the shipped
/// file, below their own header.
#[test]
fn with_nothing_given_the_settings_in_effect_are_the_defaults() {
    let printed = load(&[]).unwrap().to_toml();
    assert_eq!(body(&printed), body(SHIPPED));
}

/// The keys whose values differ from `a` to `b`.
fn changed(a: &Settings, b: &Settings) -> Vec<&'static str> {
    changes(a, b).iter().map(|c| c.key).collect()
}

/// Every live key and a few restart-only ones, each given a value other than its default.
const RELOADED: &str = "windows.payment = 15m | windows.fulfillment = 3d | windows.receipt = 10d \
    | windows.max_payment = 2d | consumer.batch_size = 17 | consumer.batch_wait = 7ms \
    | consumer.hold_max = 3s | relay.batch_size = 33 | relay.rounds_in_flight = 5 \
    | relay.interval = 2s | sweeper.interval = 9s | sweeper.grace = 11s | sweeper.batch_size = 44 \
    | metrics.gauge_interval = 5s | metrics.overdue_after = 90s | log.level = debug \
    | audit.retention = 30d \
    | http.checkout_tokens = hunter2-token-aaaaaaaa | http.admin_tokens = hunter2-token-bbbbbbbb \
    | amqp.prefix = elsewhere | amqp.delay_mode = ttl | amqp.queue_type = quorum \
    | http.bind = 127.0.0.1:9999 | sweeper.enabled = false | consumer.catch_up = false";

#[test]
fn a_reload_takes_the_live_keys_and_nothing_else() {
    let running = load(&[]).unwrap();
    let new = load(&pairs(RELOADED)).unwrap();
    let all = changed(&running, &new);
    assert_eq!(all.len(), pairs(RELOADED).len(), "each given key differs");
    for key in live_keys() {
        assert!(all.contains(&key), "the test changes every live key: {key}");
    }
    let applied = running.with_live(&new);
    let (live, restart): (Vec<&str>, Vec<&str>) = all.iter().partition(|k| is_live(k, &running));
    assert_eq!(changed(&running, &applied), live);
    assert_eq!(changed(&applied, &new), restart);
    assert_eq!(live.len(), live_keys().count());
    // Where an applied value came from follows it.
    assert_eq!(
        applied.sources["windows.payment"],
        Source::Env(env_var("windows.payment"))
    );
    assert_eq!(applied.sources["amqp.prefix"], Source::Default);
    // A mapped table keeps its windows until a restart.
    let mut running = running;
    running.mapping.source = OrdersSource::Mapped;
    assert!(!is_live("windows.payment", &running));
    assert!(is_live("sweeper.interval", &running));
    let applied = running.with_live(&new);
    assert_eq!(applied.windows.payment, running.windows.payment);
    assert_eq!(applied.sweeper.interval, new.sweeper.interval);
}

/// A token swapped for another, or a URL whose password alone changed, shows
/// the same redacted text: it is a change all the same, named without its value.
#[test]
fn a_rotated_token_or_a_new_password_is_a_change() {
    let running = load(&[
        ("http.admin_tokens", TOKEN_A),
        ("database.url", "postgres://shop:hunter2-old@127.0.0.1/shop"),
        ("amqp.url", "amqp://shop:hunter2-old@127.0.0.1/%2f"),
    ])
    .unwrap();
    let new = load(&[
        ("http.admin_tokens", TOKEN_B),
        ("database.url", "postgres://shop:hunter2-new@127.0.0.1/shop"),
        ("amqp.url", "amqp://shop:hunter2-new@127.0.0.1/%2f"),
    ])
    .unwrap();
    // The management API takes its password from `amqp.url`.
    let keys = "database.url amqp.url amqp.management_url http.admin_tokens";
    assert_eq!(changed(&running, &new).join(" "), keys);
    let shown = format!("{:?}", changes(&running, &new));
    for secret in [TOKEN_A, TOKEN_B, "hunter2"] {
        assert!(!shown.contains(secret), "{shown}");
    }
    assert!(is_live("http.admin_tokens", &running));
    assert!(!is_live("database.url", &running));
    let applied = running.with_live(&new);
    assert_eq!(applied.http.admin_tokens, new.http.admin_tokens);
    assert_eq!(applied.database.url, running.database.url);
    assert!(changes(&new, &new).is_empty());
}

/// A reload applies its tokens with the running bind and switches: it may not
/// take every token away (the API would be open), and what it applies must
/// pass the checks a start would.
#[test]
fn a_reload_never_leaves_the_api_without_its_tokens() {
    let running = load(&[("http.admin_tokens", TOKEN_A)]).unwrap();
    let none = load(&[]).unwrap();
    let refused = check_applied(&running, &running.with_live(&none)).unwrap_err();
    assert!(
        refused.to_string().contains("http.admin_tokens"),
        "{refused}"
    );
    let rotated = load(&[("http.checkout_tokens", TOKEN_B)]).unwrap();
    check_applied(&running, &running.with_live(&rotated)).unwrap();
    // Open on loopback at start: tokens may be added by a reload.
    check_applied(&none, &none.with_live(&running)).unwrap();
}

/// A file that is not TOML: the error names the file, line and column and
/// says what is wrong, without the line, which may carry a secret.
#[test]
fn a_syntax_error_names_line_and_column_never_the_text() {
    for (text, line) in [
        (
            "[windows]\npayment = \"2s\"\n[http]\nadmin_tokens = \"hunter2-token-0123456789\n",
            4,
        ),
        (
            "[database]\nurl = \"postgres://shop:hunter2@127.0.0.1/shop\nmax_connections = 5\n",
            2,
        ),
    ] {
        let (dir, path) = temp_file("broken.toml", text);
        let error = load_from(Some(&path), &[]).unwrap_err().to_string();
        assert!(!error.contains("hunter2"), "{error}");
        assert!(error.contains(&path.display().to_string()), "{error}");
        assert!(error.contains(&format!("line {line}, column ")), "{error}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}

/// `mapping.time_zone`: offsets east positive, as MySQL and ISO 8601 write
/// them, shown as written; names kept as they are.
#[test]
fn time_zones_are_read_by_shape() {
    for (text, zone) in [
        ("-05:00", Zone::Offset(-300)),
        ("+08:00", Zone::Offset(480)),
        ("+05:30", Zone::Offset(330)),
        ("-00:30", Zone::Offset(-30)),
        (
            "America/Argentina/Buenos_Aires",
            Zone::Named("America/Argentina/Buenos_Aires".into()),
        ),
        ("SYSTEM", Zone::Named("SYSTEM".into())),
    ] {
        assert_eq!(Zone::parse(text).as_ref(), Ok(&zone));
        assert_eq!(zone.to_string(), text);
    }
    // A server's own spelling stays text: PostgreSQL reads this one as UTC+5.
    assert_eq!(Zone::verbatim("-05:00"), Ok(Zone::Named("-05:00".into())));
    assert!(Zone::verbatim("<-03>3").is_err());
    let long = "x".repeat(65);
    for bad in [
        "",
        "+5:00",
        "05:00",
        "Asia/Shang hai",
        "a'b",
        "-14:30",
        &long,
    ] {
        assert!(Zone::parse(bad).is_err(), "{bad}");
    }
}
