//! Unit tests of the settings: the keys given in the environment (and a
//! file), and what is loaded, shown, written out or refused.

use super::*;

mod shipped;

/// The environment variable that sets a dotted key.
fn env_var(key: &str) -> String {
    format!("{ENV_PREFIX}__{}", key.replace('.', "__").to_uppercase())
}

/// The settings with these keys given in the environment, after `file`.
fn load_from(file: Option<&Path>, env: &[(&str, &str)]) -> Result<Settings, SettingsError> {
    let env = env.iter().map(|(k, v)| (env_var(k), v.to_string()));
    Settings::load(&SettingsSource {
        file: file.map(Path::to_path_buf),
        env: Some(env.collect()),
    })
}

fn load(env: &[(&str, &str)]) -> Result<Settings, SettingsError> {
    load_from(None, env)
}

/// A fresh directory holding `name` with this text.
fn temp_file(name: &str, text: &str) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("ot-settings-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

/// Every key's value as `doctor` shows it, without where it came from.
fn values(settings: &Settings) -> Vec<(String, String)> {
    let described = settings.describe().into_iter();
    described.map(|(key, shown, _)| (key, shown)).collect()
}

/// One key's value as `doctor` shows it.
fn shown(settings: &Settings, key: &str) -> String {
    let mut described = settings.describe().into_iter();
    described.find(|(k, _, _)| k == key).unwrap().1
}

/// `key = value | key = value …` as pairs for [`load`].
fn pairs(text: &str) -> Vec<(&str, &str)> {
    let pairs = text.split(" | ").map(|p| p.trim().split_once(" = "));
    pairs.map(Option::unwrap).collect()
}

const TOKEN_A: &str = "hunter2-token-aaaaaaaa";
const TOKEN_B: &str = "hunter2-token-bbbbbbbb";

/// Each case, `key = value => key named: what the reason says`, given after
/// `base`, is refused naming that key, without a secret (`hunter2`) in the error.
fn refuses(base: &[(&str, &str)], cases: &[&str]) {
    for case in cases {
        let (change, named) = case.split_once(" => ").unwrap();
        let ((set, value), (key, said)) = (
            change.split_once(" = ").unwrap(),
            named.split_once(": ").unwrap(),
        );
        let env: Vec<_> = base.iter().copied().chain([(set, value)]).collect();
        let err = load(&env).expect_err(case);
        let text = err.to_string();
        match &err {
            SettingsError::Invalid { key: k, .. } | SettingsError::Unknown { key: k, .. } => {
                assert_eq!(k, key, "{case}: {text}");
            }
            SettingsError::File { .. } => panic!("{case}: {text}"),
        }
        assert!(text.contains(said), "{case}: {text}");
        assert!(!text.contains("hunter2"), "{case}: {text}");
    }
}

#[test]
fn defaults_load_and_each_layer_wins_over_the_one_before() {
    // Every key's default parses, and together they pass the checks across keys.
    let defaults = load(&[]).unwrap();
    for (key, value) in [
        ("amqp.prefix", "order.timeouts"),
        ("amqp.delay_mode", "auto"),
        ("windows.payment", "30m"),
        ("windows.fulfillment", "7days"),
        ("windows.max_payment", "7days"),
        ("http.bind", "127.0.0.1:8080"),
        ("http.header_read_timeout", "1m 15s"),
        ("http.request_timeout", "30s"),
        ("http.max_connections", "1024"),
        ("http.max_in_flight", "100"),
        ("database.max_connections", "10"),
        ("database.background_connections", "5"),
    ] {
        assert_eq!(shown(&defaults, key), value, "{key}");
    }
    let (dir, path) = temp_file(
        "c.toml",
        "[amqp]\nprefix = \"shop.t\"\nprefetch = 50\n[windows]\npayment = \"10m\"\n",
    );
    let env = [("amqp.delay_mode", "ttl"), ("windows.payment", "5m")];
    let s = load_from(Some(&path), &env).unwrap();
    assert_eq!((s.amqp.prefix.as_str(), s.amqp.prefetch), ("shop.t", 50));
    assert_eq!(s.amqp.delay_mode, DelayMode::Ttl);
    assert_eq!(s.windows.payment, Duration::from_secs(300));
    assert_eq!(s.sources["amqp.prefix"], Source::File(path));
    let var = env_var("windows.payment");
    assert_eq!(s.sources["windows.payment"], Source::Env(var));
    assert_eq!(s.sources["windows.receipt"], Source::Default);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn tracing_is_off_by_default_and_its_endpoint_is_a_base_url() {
    let defaults = load(&[]).unwrap();
    assert_eq!(defaults.tracing.otlp_endpoint, "");
    assert_eq!(defaults.tracing.service_name, "order-timeout");
    assert_eq!(defaults.tracing.sample_ratio, 1.0);
    let s = load(&[
        ("tracing.otlp_endpoint", "http://collector:4318/"),
        ("tracing.sample_ratio", "0.25"),
    ])
    .unwrap();
    assert_eq!(s.tracing.otlp_endpoint, "http://collector:4318");
    assert_eq!(s.tracing.sample_ratio, 0.25);
}

#[test]
fn wrong_values_are_refused_naming_their_key_never_a_secret() {
    refuses(
        &[],
        &[
            "amqp.delay_mode = fast => amqp.delay_mode: (expected auto, plugin, ttl or native)",
            "log.format = xml => log.format: (expected pretty or json)",
            "tracing.otlp_endpoint = collector:4318 => tracing.otlp_endpoint: expected http://HOST:PORT",
            "tracing.otlp_endpoint = grpc://collector:4317 => tracing.otlp_endpoint: expected http://HOST:PORT",
            "tracing.otlp_endpoint = http://u:hunter2@collector:4318 => tracing.otlp_endpoint: credentials do not belong",
            "tracing.otlp_endpoint = http://collector:4318/?x=1 => tracing.otlp_endpoint: no query",
            "tracing.otlp_endpoint = https://collector:4318 => tracing.otlp_endpoint: speaks plain HTTP, not TLS",
            "amqp.instance = \u{1b}[2J => amqp.instance: holds a control character",
            "tracing.sample_ratio = 1.5 => tracing.sample_ratio: from 0.0 to 1.0",
            "tracing.sample_ratio = half => tracing.sample_ratio: from 0.0 to 1.0",
            "tracing.service_name = \u{7} => tracing.service_name: no control characters",
            "windows.payment = soon => windows.payment: is not a duration",
            "http.request_timeout = forever => http.request_timeout: is not a duration",
            "windows.receipt = 60d => windows.receipt: is out of range",
            "http.header_read_timeout = 0s => http.header_read_timeout: is out of range",
            "http.bind = localhost => http.bind: (expected host:port",
            "amqp.prefetch = 0 => amqp.prefetch: from 1 to 65535",
            "http.max_connections = 0 => http.max_connections: from 1 to 1000000",
            "http.max_in_flight = -1 => http.max_in_flight: a whole number",
            "database.background_connections = 0 => database.background_connections: from 1 to 1000",
            // A key nobody reads is a typo.
            "amqp.delaymode = ttl => amqp.delaymode: unknown setting",
            // URLs a library would quote whole, password included.
            "database.url = mariadb://u:hunter2pw@h/db => database.url: with mysql://, not mariadb://",
            "database.url = postgres://u:hunter2#pw@h/db => database.url: percent-encode",
            "database.url = postgres://u:hunter2?pw@h/db => database.url: percent-encode",
            "database.url = postgres://u:hunter2/pw@h/db => database.url: percent-encode",
            "database.url = oracle://u:hunter2pw@h/db => database.url: scheme 'oracle'",
            "amqp.url = http://x => amqp.url: scheme 'http'",
            "amqp.url = amqp:u:hunter2pw@h => amqp.url: is not an AMQP URL",
            "amqp.url = amqp://u:hunter2#pw@h:5672/%2f => amqp.url: percent-encode",
            // A cluster is one broker: one vhost; each address checked alone.
            "amqp.url = amqp://u:p@a/shop,amqp://u:p@b/other => amqp.url: vhost 'other'",
            "amqp.url = amqp://u:p@a/shop,,amqp://u:p@b/shop => amqp.url: address 2 of 3 is empty",
            "amqp.url = amqp://u:p@a/shop,http://b/shop => amqp.url: scheme 'http'",
            "amqp.url = amqp://u:hunter2@a/shop,amqp://u:hunter2#x@b/shop => amqp.url: is not",
            "amqp.management_url = https://mq:15671 => amqp.management_url: https is not supported",
            "amqp.management_url = ftp://mq => amqp.management_url: scheme 'ftp'",
            "amqp.management_url = not a url => amqp.management_url: is not a URL",
            // Tokens are told by position, never shown.
            "http.admin_tokens = hunter2 => http.admin_tokens: 7 characters; at least 16",
            "http.admin_tokens = hunter2 has a space => http.admin_tokens: token 1 contains whitespace",
            "http.admin_tokens = hunter2\ttab-0123456789 => http.admin_tokens: token 1 contains whitespace",
            "http.admin_tokens = hunter2-é-0123456789 => http.admin_tokens: not printable ASCII",
            "http.admin_tokens = hunter2-token-aaaaaaaa,,hunter2-token-bbbbbbbb => http.admin_tokens: token 2 is empty",
            "http.admin_tokens = hunter2-token-aaaaaaaa,hunter2-token-aaaaaaaa => http.admin_tokens: token 2 is given twice",
            // A reachable API says who may call it, or that anyone may.
            "http.bind = 0.0.0.0:8080 => http.bind: set `http.admin_tokens` and/or `http.checkout_tokens`, or `http.allow_anonymous",
            "http.bind = 10.1.2.3:8080 => http.bind: set `http.admin_tokens`",
            "http.bind = [::]:8080 => http.bind: set `http.admin_tokens`",
            "http.bind = [::ffff:10.0.0.1]:80 => http.bind: set `http.admin_tokens`",
            "http.protect_operations = true => http.protect_operations: true needs a token",
            "windows.payment = 8d => windows.payment: longer than `windows.max_payment` (7days)",
            "windows.max_payment = 60d => windows.max_payment: is out of range",
            // Under an hour would delete the rows a retried batch reads back.
            "audit.retention = 30m => audit.retention: is out of range",
            "audit.retention = never => audit.retention: is not a duration",
            // A mapping key while the service owns the orders would be ignored.
            "mapping.table = oms_order => mapping.table: `orders.source` is owned",
        ],
    );
    refuses(
        &[("http.admin_tokens", TOKEN_A)],
        &[
            "http.checkout_tokens = hunter2-token-bbbbbbbb,hunter2-token-aaaaaaaa => http.checkout_tokens: a token is also in `http.admin_tokens`",
        ],
    );
    // What is right around them passes.
    for env in [
        &[("database.url", "postgres://u:p%23w@h/db")][..],
        &[("database.url", "mysql://root@127.0.0.1:3306/x")],
        &[("database.url", "sqlite::memory:")],
        &[("windows.payment", "8d"), ("windows.max_payment", "10d")],
        &[("http.admin_tokens", &format!(" {TOKEN_A} , {TOKEN_B}"))],
        &[
            ("http.bind", "0.0.0.0:8080"),
            ("http.allow_anonymous", "true"),
        ],
        &[
            ("http.bind", "[::]:8080"),
            ("http.checkout_tokens", TOKEN_A),
        ],
        &[("http.bind", "127.8.9.10:80")],
        &[("http.bind", "[::1]:8080")],
        &[("http.bind", "[::ffff:127.0.0.1]:80")],
    ] {
        load(env).unwrap_or_else(|e| panic!("{env:?}: {e}"));
    }
}

#[test]
fn tokens_are_a_comma_separated_list_shown_only_counted() {
    let tokens = |v: &str| {
        let parsed = parse_tokens("http.admin_tokens", v).unwrap();
        parsed
            .iter()
            .map(|s| s.expose().to_string())
            .collect::<Vec<_>>()
    };
    assert!(tokens("").is_empty() && tokens("  ").is_empty());
    // Rotation: old,new; spaces around the commas do not count.
    assert_eq!(tokens(&format!("{TOKEN_A}, {TOKEN_B}")), [TOKEN_A, TOKEN_B]);
    let token = Secret::opaque(TOKEN_A);
    assert_eq!(format!("{token:?} {token}"), "Secret(***) ***");
    let both = format!("{TOKEN_B},hunter2-token-cccccccc");
    let s = load(&[
        ("http.admin_tokens", TOKEN_A),
        ("http.checkout_tokens", &both),
    ])
    .unwrap();
    let described = format!("{:?} {s:?}", s.describe());
    assert!(!described.contains("hunter2"), "{described}");
    assert!(described.contains("2 tokens (redacted)"), "{described}");
}

#[test]
fn urls_are_shown_and_scrubbed_without_their_passwords() {
    let s = Secret::new("amqp://shop:hunter2@rabbit:5672/%2f");
    assert!(!format!("{s:?} {s}").contains("hunter2"));
    for url in [
        "postgres://u:hunter2@db/x?password=hunter2",
        "u:hunter2@db",
        // A comma inside one URL (a query, a password) is no list: redacted whole.
        "postgres://u:hunter2@db/x?options=a,b",
        "amqp://u:hun,hunter2@mq/x",
    ] {
        assert!(!redact_url(url).contains("hunter2"), "{url}");
    }
    let scrubbed = scrub_url(
        "error with 'postgres://u:p%23w@h/db' and p#w",
        "postgres://u:p%23w@h/db",
    );
    assert_eq!(scrubbed, "error with 'postgres://u:***@h/db' and ***");

    let list = "amqp://svc:hunter2@mq-1:5672/shop, amqp://svc:hunter3@mq-2:5673/shop,amqp://svc:hunter%2C4@mq-3/shop";
    let s = load(&[("amqp.url", list)]).unwrap();
    let addresses = [
        "amqp://svc:hunter2@mq-1:5672/shop",
        "amqp://svc:hunter3@mq-2:5673/shop",
    ];
    assert_eq!(s.amqp.addresses()[..2], addresses);
    assert_eq!(s.amqp.addresses()[2], "amqp://svc:hunter%2C4@mq-3/shop");
    // Every password hidden, every node shown; management on the first node.
    let shown = format!("{:?} {}", s.describe(), s.amqp.url);
    for secret in ["hunter2", "hunter3", "hunter%2C4", "hunter,4"] {
        assert!(!shown.contains(secret), "{shown}");
    }
    for node in ["mq-1:5672", "mq-2:5673", "mq-3"] {
        assert!(shown.contains(node), "{shown}");
    }
    let scrubbed = scrub_url("refused amqp://svc:hunter3@mq-2:5673/shop (hunter3)", list);
    assert!(!scrubbed.contains("hunter3"), "{scrubbed}");
    let api = s.amqp.management.unwrap();
    assert_eq!(
        (api.base.as_str(), api.vhost.as_str()),
        ("http://mq-1:15672", "shop")
    );
}

#[test]
fn the_management_api_defaults_to_the_brokers_host_and_credentials() {
    let api = |env: &[(&str, &str)]| {
        load(env).unwrap().amqp.management.map(|m| {
            let password = m.password.expose().to_string();
            format!("{} {}:{password} {}", m.base, m.username, m.vhost)
        })
    };
    for (env, expected) in [
        (&[][..], Some("http://127.0.0.1:15672 guest:guest /")),
        (
            &[("amqp.url", "amqp://shop:pw@mq.internal:5672/shop%2Fa")],
            Some("http://mq.internal:15672 shop:pw shop/a"),
        ),
        (
            &[
                ("amqp.url", "amqp://shop:pw@mq:5672/shop"),
                (
                    "amqp.management_url",
                    "http://ops:s%40id@mq-admin:8080/rabbit/api/",
                ),
            ],
            Some("http://mq-admin:8080/rabbit ops:s@id shop"),
        ),
        (&[("amqp.management_url", "off")], None),
        // amqps://: the default would be https, which this client cannot speak.
        (&[("amqp.url", "amqps://u:p@mq:5671/%2f")], None),
    ] {
        assert_eq!(api(env).as_deref(), expected, "{env:?}");
    }
    let s = load(&[("amqp.management_url", "http://ops:hunter2@mq:15672")]).unwrap();
    assert!(!format!("{:?}", s.describe()).contains("hunter2"));
}

#[test]
fn the_table_lists_every_key_once_described_in_one_line() {
    let described: Vec<String> = load(&[])
        .unwrap()
        .describe()
        .into_iter()
        .map(|(key, _, source)| {
            assert_eq!(source, Source::Default, "{key}");
            key
        })
        .collect();
    let table: Vec<&str> = keys().map(|k| k.name).collect();
    assert_eq!(described, table);
    let unique: std::collections::BTreeSet<&str> = table.iter().copied().collect();
    assert_eq!(unique.len(), table.len(), "a key is in the table twice");
    // The order doctor has always printed, then the orders and their mapping.
    assert_eq!(table.first(), Some(&"database.url"));
    assert_eq!(table.last(), Some(&"mapping.release_sql"));
    for section in SECTIONS {
        let first = file::section_name(section.keys[0].name);
        for key in section.keys {
            assert_eq!(file::section_name(key.name), first, "{}", key.name);
            // Only the mapping has tables within its table (`mapping.payment.from`).
            let nested = key.name[first.len() + 1..].contains('.');
            assert!(!nested || first == "mapping", "{}", key.name);
            let doc = key.doc;
            assert!(
                !doc.is_empty() && !doc.contains('\n') && doc.ends_with('.'),
                "{doc:?}"
            );
            // With `# ` in front, a line of the file stays within 100 characters.
            assert!(doc.chars().count() <= 98, "{}: too long: {doc}", key.name);
        }
    }
}

/// Two complete mappings between them set every `mapping.*` key to a value
/// of its own; each shows up in its own key.
#[test]
fn every_mapping_key_reaches_its_own_field() {
    let common = "database.url = postgres://u@db/shop | orders.source = mapped \
        | mapping.table = shop.orders_t | mapping.id_column = id_c | mapping.status_column = status_c \
        | mapping.stamp_column = stamp_c | mapping.payment.from = p_from | mapping.payment.to = p_to \
        | mapping.fulfillment.from = f_from | mapping.receipt.from = r_from | mapping.receipt.to = r_to";
    let a = "mapping.payment.since_column = p_since | mapping.time_zone = America/Bogota \
        | mapping.fulfillment.to = f_to | mapping.fulfillment.deadline_column = f_deadline \
        | mapping.receipt.since_column = r_since | mapping.stock.items_table = items_t \
        | mapping.stock.items_order_column = items_order | mapping.stock.items_sku_column = items_sku \
        | mapping.stock.items_quantity_column = items_qty | mapping.stock.table = stock_t \
        | mapping.stock.id_column = stock_id | mapping.stock.reserved_column = stock_reserved \
        | mapping.stock.available_column = stock_available \
        | mapping.release_sql = DELETE FROM holds WHERE o = $1";
    let b = "mapping.payment.deadline_column = p_deadline | mapping.fulfillment.flag_column = f_flag \
        | mapping.fulfillment.since_column = f_since | mapping.receipt.deadline_column = r_deadline";
    let mut seen = std::collections::BTreeSet::new();
    for variant in [a, b] {
        let text = format!("{common} | {variant}");
        let env = pairs(&text);
        let described = load(&env).unwrap_or_else(|e| panic!("{e}")).describe();
        for (key, value) in &env[1..] {
            let (_, shown, source) = described
                .iter()
                .find(|(k, _, _)| *k == *key)
                .unwrap_or_else(|| panic!("{key} not described"));
            assert_eq!(shown, value, "`{key}`");
            assert_eq!(source, &Source::Env(env_var(key)));
            seen.insert(key.to_string());
        }
    }
    let all: std::collections::BTreeSet<String> = keys()
        .map(|k| k.name.to_string())
        .filter(|k| k.starts_with("mapping.") || k == "orders.source")
        .collect();
    assert_eq!(seen, all, "every mapping key is set by one of the two");
}

/// What the mapping must say, across keys, is refused naming the key.
#[test]
fn a_mapping_that_cannot_work_names_its_key() {
    let mapped = pairs(
        "database.url = postgres://u@db/shop | orders.source = mapped | mapping.table = oms_order \
         | mapping.payment.from = 0 | mapping.payment.to = 4 \
         | mapping.payment.since_column = create_time",
    );
    load(&mapped).expect("a minimal mapping");
    // Each: a change to the minimal mapping => the key named: what the reason says.
    refuses(
        &mapped,
        &[
            "database.url = sqlite::memory: => orders.source: PostgreSQL or MySQL",
            "mapping.table =  => mapping.table: must name",
            "mapping.table = oms_order; DROP TABLE x => mapping.table: not a table name",
            // Spliced into statements as a quoted literal: nothing that could end it.
            "mapping.time_zone = UTC' OR '1'='1 => mapping.time_zone: not a time zone",
            "mapping.time_zone = +15:00 => mapping.time_zone: between -14:00 and +14:00",
            "mapping.status_column = a.b => mapping.status_column: not a column name",
            "mapping.payment.to =  => mapping.payment.to: must be set",
            "mapping.payment.to = 0 => mapping.payment.to: same status",
            "mapping.payment.since_column =  => mapping.payment.deadline_column: set this",
            "mapping.payment.deadline_column = d => mapping.payment.since_column: not both",
            "mapping.stamp_column = create_time => mapping.stamp_column: would move the deadline",
            "mapping.receipt.to = 3 => mapping.receipt.to: needs `mapping.receipt.from`",
            "mapping.stock.items_table = items => mapping.stock.items_order_column: must be set",
            "mapping.release_sql = UPDATE s SET r = 0 => mapping.release_sql: does not bind the order id",
        ],
    );
}

#[test]
fn the_audit_is_kept_for_its_retention_or_for_ever() {
    let retention = |v: &str| load(&[("audit.retention", v)]).unwrap().audit.retention;
    assert_eq!(
        load(&[]).unwrap().audit.retention,
        Some(Duration::from_secs(90 * 86_400))
    );
    assert_eq!(retention("400d"), Some(Duration::from_secs(400 * 86_400)));
    assert_eq!(retention("off"), None);
    assert_eq!(retention("0"), None);
    assert_eq!(
        shown(
            &load(&[("audit.retention", "off")]).unwrap(),
            "audit.retention"
        ),
        "off"
    );
}

#[test]
fn an_instance_name_fits_consumer_tags_and_columns_or_is_refused() {
    // 128 bytes of two-byte characters: taken; one more: refused, naming the key.
    let at_edge = "é".repeat(64);
    let s = load(&[("amqp.instance", at_edge.as_str())]).unwrap();
    assert_eq!(s.amqp.instance, at_edge);
    for long in ["é".repeat(65), "i".repeat(300)] {
        let err = load(&[("amqp.instance", long.as_str())]).expect_err("too long");
        let text = err.to_string();
        assert!(
            matches!(&err, SettingsError::Invalid { key, .. } if key == "amqp.instance"),
            "{text}"
        );
        assert!(text.contains("at most 128"), "{text}");
    }
    // Empty: this host and the process, which always fit.
    let default = load(&[]).unwrap();
    assert!(
        default.amqp.instance.len() <= 128,
        "{}",
        default.amqp.instance
    );
}
