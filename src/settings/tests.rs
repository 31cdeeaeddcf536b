//! Unit tests of the settings.

use super::keys::Key;
use super::*;

fn load(env: &[(&str, &str)]) -> Result<Settings, SettingsError> {
    let env = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Settings::load(&SettingsSource {
        file: None,
        env: Some(env),
    })
}

#[test]
fn defaults_load() {
    let s = load(&[]).unwrap();
    assert_eq!(s.amqp.prefix, "order.timeouts");
    assert_eq!(s.windows.payment, Duration::from_secs(1800));
    assert_eq!(s.windows.fulfillment, Duration::from_secs(7 * 86400));
    assert_eq!(s.http.bind.to_string(), "127.0.0.1:8080");
    assert_eq!(s.amqp.delay_mode, DelayMode::Auto);
    assert_eq!(s.http.header_read_timeout, Duration::from_secs(75));
    assert_eq!(s.http.request_timeout, Duration::from_secs(30));
    assert_eq!((s.http.max_connections, s.http.max_in_flight), (1024, 100));
    assert_eq!(
        (
            s.database.max_connections,
            s.database.background_connections
        ),
        (10, 5)
    );
}

#[test]
fn env_overrides_and_is_recorded() {
    let s = load(&[
        ("ORDER_TIMEOUT__AMQP__DELAY_MODE", "ttl"),
        ("ORDER_TIMEOUT__WINDOWS__PAYMENT", "15m"),
    ])
    .unwrap();
    assert_eq!(s.amqp.delay_mode, DelayMode::Ttl);
    assert_eq!(s.windows.payment, Duration::from_secs(900));
    assert_eq!(
        s.sources["amqp.delay_mode"],
        Source::Env("ORDER_TIMEOUT__AMQP__DELAY_MODE".into())
    );
}

#[test]
fn wrong_values_name_their_key() {
    for (var, value, key) in [
        ("ORDER_TIMEOUT__AMQP__DELAY_MODE", "fast", "amqp.delay_mode"),
        ("ORDER_TIMEOUT__WINDOWS__PAYMENT", "soon", "windows.payment"),
        ("ORDER_TIMEOUT__WINDOWS__RECEIPT", "60d", "windows.receipt"),
        ("ORDER_TIMEOUT__HTTP__BIND", "localhost", "http.bind"),
        ("ORDER_TIMEOUT__AMQP__URL", "http://x", "amqp.url"),
        ("ORDER_TIMEOUT__AMQP__PREFETCH", "0", "amqp.prefetch"),
        ("ORDER_TIMEOUT__LOG__FORMAT", "xml", "log.format"),
        (
            "ORDER_TIMEOUT__HTTP__HEADER_READ_TIMEOUT",
            "0s",
            "http.header_read_timeout",
        ),
        (
            "ORDER_TIMEOUT__HTTP__REQUEST_TIMEOUT",
            "forever",
            "http.request_timeout",
        ),
        (
            "ORDER_TIMEOUT__HTTP__MAX_CONNECTIONS",
            "0",
            "http.max_connections",
        ),
        (
            "ORDER_TIMEOUT__HTTP__MAX_IN_FLIGHT",
            "-1",
            "http.max_in_flight",
        ),
        (
            "ORDER_TIMEOUT__DATABASE__BACKGROUND_CONNECTIONS",
            "0",
            "database.background_connections",
        ),
    ] {
        let err = load(&[(var, value)]).unwrap_err().to_string();
        assert!(err.contains(&format!("`{key}`")), "{err}");
    }
}

#[test]
fn management_api_defaults_to_the_brokers_host_and_credentials() {
    let api = |env: &[(&str, &str)]| load(env).unwrap().amqp.management;
    let default = api(&[]).unwrap();
    assert_eq!(default.base, "http://127.0.0.1:15672");
    assert_eq!(
        (default.username.as_str(), default.password.expose()),
        ("guest", "guest")
    );
    assert_eq!(default.vhost, "/");
    let shop = api(&[(
        "ORDER_TIMEOUT__AMQP__URL",
        "amqp://shop:pw@mq.internal:5672/shop%2Fa",
    )])
    .unwrap();
    assert_eq!(shop.base, "http://mq.internal:15672");
    assert_eq!(
        (shop.username.as_str(), shop.vhost.as_str()),
        ("shop", "shop/a")
    );
    let given = api(&[
        ("ORDER_TIMEOUT__AMQP__URL", "amqp://shop:pw@mq:5672/shop"),
        (
            "ORDER_TIMEOUT__AMQP__MANAGEMENT_URL",
            "http://ops:s%40id@mq-admin:8080/rabbit/api/",
        ),
    ])
    .unwrap();
    assert_eq!(given.base, "http://mq-admin:8080/rabbit");
    assert_eq!(
        (given.username.as_str(), given.password.expose()),
        ("ops", "s@id")
    );
    assert_eq!(given.vhost, "shop");
    assert_eq!(api(&[("ORDER_TIMEOUT__AMQP__MANAGEMENT_URL", "off")]), None);
    // amqps://: the default would be https, which this client cannot speak.
    assert_eq!(
        api(&[("ORDER_TIMEOUT__AMQP__URL", "amqps://u:p@mq:5671/%2f")]),
        None
    );
    for bad in ["https://mq:15671", "ftp://mq", "not a url"] {
        let err = load(&[("ORDER_TIMEOUT__AMQP__MANAGEMENT_URL", bad)])
            .unwrap_err()
            .to_string();
        assert!(err.contains("`amqp.management_url`"), "{bad}: {err}");
    }
    // Shown without the password.
    let shown = load(&[(
        "ORDER_TIMEOUT__AMQP__MANAGEMENT_URL",
        "http://ops:hunter2@mq:15672",
    )])
    .unwrap()
    .describe();
    assert!(!format!("{shown:?}").contains("hunter2"));
}

#[test]
fn urls_that_libraries_would_quote_whole_stop_here_redacted() {
    for (var, value) in [
        ("ORDER_TIMEOUT__DATABASE__URL", "mariadb://u:hunter2pw@h/db"),
        (
            "ORDER_TIMEOUT__DATABASE__URL",
            "postgres://u:hunter2#pw@h/db",
        ),
        (
            "ORDER_TIMEOUT__DATABASE__URL",
            "postgres://u:hunter2?pw@h/db",
        ),
        (
            "ORDER_TIMEOUT__DATABASE__URL",
            "postgres://u:hunter2/pw@h/db",
        ),
        ("ORDER_TIMEOUT__DATABASE__URL", "oracle://u:hunter2pw@h/db"),
        ("ORDER_TIMEOUT__AMQP__URL", "amqp:u:hunter2pw@h"),
        ("ORDER_TIMEOUT__AMQP__URL", "amqp://u:hunter2#pw@h:5672/%2f"),
    ] {
        let err = load(&[(var, value)]).unwrap_err().to_string();
        assert!(!err.contains("hunter2"), "{value}: {err}");
        let key = if var.contains("DATABASE") {
            "database.url"
        } else {
            "amqp.url"
        };
        assert!(err.contains(&format!("`{key}`")), "{value}: {err}");
    }
    // Well-formed URLs pass, percent-encoded passwords included.
    for url in [
        "postgres://u:p%23w@h/db",
        "mysql://root@127.0.0.1:3306/x",
        "sqlite::memory:",
    ] {
        load(&[("ORDER_TIMEOUT__DATABASE__URL", url)]).unwrap();
    }
    let scrubbed = scrub_url(
        "error with 'postgres://u:p%23w@h/db' and p#w",
        "postgres://u:p%23w@h/db",
    );
    assert_eq!(scrubbed, "error with 'postgres://u:***@h/db' and ***");
}

#[test]
fn a_cluster_is_several_addresses_of_one_vhost_each_redacted() {
    let list = "amqp://svc:hunter2@mq-1:5672/shop, amqp://svc:hunter3@mq-2:5673/shop,amqp://svc:hunter%2C4@mq-3/shop";
    let s = load(&[("ORDER_TIMEOUT__AMQP__URL", list)]).unwrap();
    assert_eq!(
        s.amqp.addresses(),
        [
            "amqp://svc:hunter2@mq-1:5672/shop",
            "amqp://svc:hunter3@mq-2:5673/shop",
            "amqp://svc:hunter%2C4@mq-3/shop"
        ]
    );
    // Every password hidden, every node shown; management on the first node.
    let shown = format!("{:?} {}", s.describe(), s.amqp.url);
    for secret in ["hunter2", "hunter3", "hunter%2C4", "hunter,4"] {
        assert!(!shown.contains(secret), "{shown}");
    }
    for node in ["mq-1:5672", "mq-2:5673", "mq-3"] {
        assert!(shown.contains(node), "{shown}");
    }
    let api = s.amqp.management.unwrap();
    assert_eq!(
        (api.base.as_str(), api.vhost.as_str()),
        ("http://mq-1:15672", "shop")
    );
    let scrubbed = scrub_url("refused amqp://svc:hunter3@mq-2:5673/shop (hunter3)", list);
    assert!(!scrubbed.contains("hunter3"), "{scrubbed}");

    // One broker: one vhost; no empty address; each address checked alone.
    for (bad, says) in [
        ("amqp://u:p@a/shop,amqp://u:p@b/other", "vhost 'other'"),
        (
            "amqp://u:p@a/shop,,amqp://u:p@b/shop",
            "address 2 of 3 is empty",
        ),
        ("amqp://u:p@a/shop,http://b/shop", "scheme 'http'"),
        (
            "amqp://u:hunter2@a/shop,amqp://u:hunter2#x@b/shop",
            "is not",
        ),
    ] {
        let err = load(&[("ORDER_TIMEOUT__AMQP__URL", bad)])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`amqp.url`") && err.contains(says),
            "{bad}: {err}"
        );
        assert!(!err.contains("hunter2"), "{err}");
    }
    // A comma inside one URL (a query, a password) is no list: redacted whole.
    assert!(!redact_url("postgres://u:hunter2@db/x?options=a,b").contains("hunter2"));
    assert!(!redact_url("amqp://u:hun,ter2@mq/x").contains("ter2"));
}

#[test]
fn unknown_keys_are_refused() {
    let err = load(&[("ORDER_TIMEOUT__AMQP__DELAYMODE", "ttl")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("`amqp.delaymode`"), "{err}");
}

#[test]
fn file_layer_sits_between_defaults_and_env() {
    let dir = std::env::temp_dir().join(format!("ot-settings-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("c.toml");
    std::fs::write(
        &path,
        "[amqp]\nprefix = \"shop.t\"\nprefetch = 50\n[windows]\npayment = \"10m\"\n",
    )
    .unwrap();
    let env = [(
        "ORDER_TIMEOUT__WINDOWS__PAYMENT".to_string(),
        "5m".to_string(),
    )]
    .into_iter()
    .collect();
    let s = Settings::load(&SettingsSource {
        file: Some(path.clone()),
        env: Some(env),
    })
    .unwrap();
    assert_eq!(s.amqp.prefix, "shop.t");
    assert_eq!(s.amqp.prefetch, 50);
    assert_eq!(s.windows.payment, Duration::from_secs(300));
    assert_eq!(s.sources["amqp.prefix"], Source::File(path));
    std::fs::remove_dir_all(dir).unwrap();
}

const TOKEN_A: &str = "aaaaaaaa-0123456789";
const TOKEN_B: &str = "bbbbbbbb-0123456789";

#[test]
fn tokens_parse_as_a_comma_separated_list() {
    let tokens = |v: &str| {
        parse_tokens("http.admin_tokens", v)
            .map(|t| t.iter().map(|s| s.expose().to_string()).collect::<Vec<_>>())
    };
    assert_eq!(tokens("").unwrap(), Vec::<String>::new());
    assert_eq!(tokens("  ").unwrap(), Vec::<String>::new());
    assert_eq!(tokens(TOKEN_A).unwrap(), [TOKEN_A]);
    // Rotation: old,new; spaces around the commas do not count.
    assert_eq!(
        tokens(&format!("{TOKEN_A}, {TOKEN_B}")).unwrap(),
        [TOKEN_A, TOKEN_B]
    );
    for (bad, why) in [
        ("short-token", "11 characters; at least 16"),
        (
            "has a space in it-0123456789",
            "token 1 contains whitespace",
        ),
        ("tab\tinside-0123456789", "token 1 contains whitespace"),
        ("non-ascii-é-0123456789", "not printable ASCII"),
    ] {
        let err = tokens(bad).unwrap_err().to_string();
        assert!(err.contains("`http.admin_tokens`"), "{err}");
        assert!(err.contains(why), "{bad}: {err}");
        assert!(!err.contains(bad), "a token is never shown: {err}");
    }
    let err = tokens(&format!("{TOKEN_A},,{TOKEN_B}"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("token 2 is empty"), "{err}");
    let err = tokens(&format!("{TOKEN_A},{TOKEN_A}"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("token 2 is given twice"), "{err}");
    assert!(!err.contains(TOKEN_A), "{err}");
}

#[test]
fn one_token_in_both_scopes_is_refused() {
    let err = load(&[
        ("ORDER_TIMEOUT__HTTP__ADMIN_TOKENS", TOKEN_A),
        (
            "ORDER_TIMEOUT__HTTP__CHECKOUT_TOKENS",
            &format!("{TOKEN_B},{TOKEN_A}"),
        ),
    ])
    .unwrap_err()
    .to_string();
    assert!(err.contains("`http.checkout_tokens`"), "{err}");
    assert!(err.contains("`http.admin_tokens`"), "{err}");
    assert!(!err.contains(TOKEN_A), "{err}");
}

#[test]
fn a_reachable_bind_needs_tokens_or_an_explicitly_open_api() {
    for bind in [
        "0.0.0.0:8080",
        "10.1.2.3:8080",
        "[::]:8080",
        "[::ffff:10.0.0.1]:80",
    ] {
        let err = load(&[("ORDER_TIMEOUT__HTTP__BIND", bind)])
            .unwrap_err()
            .to_string();
        for key in [
            "`http.bind`",
            "`http.admin_tokens`",
            "`http.checkout_tokens`",
            "`http.allow_anonymous",
        ] {
            assert!(err.contains(key), "{bind}: {err}");
        }
        load(&[
            ("ORDER_TIMEOUT__HTTP__BIND", bind),
            ("ORDER_TIMEOUT__HTTP__ALLOW_ANONYMOUS", "true"),
        ])
        .unwrap();
        load(&[
            ("ORDER_TIMEOUT__HTTP__BIND", bind),
            ("ORDER_TIMEOUT__HTTP__CHECKOUT_TOKENS", TOKEN_A),
        ])
        .unwrap();
    }
    for loopback in [
        "127.0.0.1:0",
        "127.8.9.10:80",
        "[::1]:8080",
        "[::ffff:127.0.0.1]:80",
    ] {
        let s = load(&[("ORDER_TIMEOUT__HTTP__BIND", loopback)]).unwrap();
        assert!(!s.http.has_tokens());
    }
    let err = load(&[("ORDER_TIMEOUT__HTTP__PROTECT_OPERATIONS", "true")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("`http.protect_operations`"), "{err}");
}

#[test]
fn the_default_payment_window_stays_within_the_maximum() {
    let s = load(&[]).unwrap();
    assert_eq!(s.windows.max_payment, Duration::from_secs(7 * 86400));
    let err = load(&[("ORDER_TIMEOUT__WINDOWS__PAYMENT", "8d")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("`windows.payment`"), "{err}");
    assert!(err.contains("`windows.max_payment` (7days)"), "{err}");
    let s = load(&[
        ("ORDER_TIMEOUT__WINDOWS__PAYMENT", "8d"),
        ("ORDER_TIMEOUT__WINDOWS__MAX_PAYMENT", "10d"),
    ])
    .unwrap();
    assert_eq!(s.windows.payment, Duration::from_secs(8 * 86400));
    let err = load(&[("ORDER_TIMEOUT__WINDOWS__MAX_PAYMENT", "60d")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("`windows.max_payment`"), "{err}");
}

#[test]
fn secrets_are_redacted() {
    let s = Secret::new("amqp://shop:hunter2@rabbit:5672/%2f");
    assert!(!format!("{s:?} {s}").contains("hunter2"));
    assert!(!redact_url("postgres://u:hunter2@db/x?password=hunter2").contains("hunter2"));
    assert!(!redact_url("u:hunter2@db").contains("hunter2"));
    let token = Secret::opaque("hunter2-token-0123456789");
    assert_eq!(format!("{token:?} {token}"), "Secret(***) ***");
    let shown = load(&[
        ("ORDER_TIMEOUT__HTTP__ADMIN_TOKENS", TOKEN_A),
        (
            "ORDER_TIMEOUT__HTTP__CHECKOUT_TOKENS",
            &format!("{TOKEN_B},hunter2-token-0123456789"),
        ),
    ])
    .unwrap();
    let described = format!("{:?} {shown:?}", shown.describe());
    for token in [TOKEN_A, TOKEN_B, "hunter2"] {
        assert!(!described.contains(token), "{described}");
    }
    assert!(described.contains("2 tokens (redacted)"), "{described}");
}

#[test]
fn every_key_has_a_default_that_parses() {
    // In table order, as `load` reads them: `amqp.management_url` reads the
    // `amqp.url` before it.
    let mut settings = Settings::unread(BTreeMap::new());
    for section in SECTIONS {
        for key in section.keys {
            if let Err(e) = (key.read)(key.name, key.default, &mut settings) {
                panic!("the default of `{}` does not parse: {e}", key.name);
            }
        }
        if let Some(check) = section.check {
            check(&settings).unwrap();
        }
    }
}

#[test]
fn describe_lists_every_key_once_in_table_order() {
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
}

#[test]
fn the_keys_of_a_section_share_its_name() {
    for section in SECTIONS {
        let name = |k: &Key| k.name.split_once('.').map(|(section, _)| section);
        let first = name(&section.keys[0]).unwrap();
        for key in section.keys {
            assert_eq!(name(key), Some(first), "{}", key.name);
            // Only the mapping has tables within its table (`mapping.payment.from`).
            let nested = key.name[first.len() + 1..].contains('.');
            assert!(!nested || first == "mapping", "{}", key.name);
        }
    }
}

/// A valid value other than the default for every key (the test below fails
/// on a key missing here, so a new key must add one).
fn another_value(key: &str, ca_file: &str) -> String {
    let value = match key {
        "database.url" => "postgres://u:p@db.internal/shop",
        "database.max_connections" => "11",
        "database.background_connections" => "6",
        "database.migrate_on_start" => "false",
        "amqp.url" => "amqp://shop:pw@mq.internal:5672/shop",
        "amqp.connect_timeout" => "3s",
        "amqp.prefix" => "shop.timeouts",
        "amqp.delay_mode" => "ttl",
        "amqp.prefetch" => "9",
        "amqp.router_prefetch" => "8",
        "amqp.queue_type" => "quorum",
        "amqp.instance" => "instance-a",
        "amqp.tls_ca_file" => ca_file,
        "amqp.management_url" => "off",
        "http.bind" => "127.0.0.1:9090",
        "http.checkout_tokens" => "cccccccc-0123456789,dddddddd-0123456789",
        "http.admin_tokens" => "eeeeeeee-0123456789,ffffffff-0123456789",
        "http.allow_anonymous" => "true",
        "http.protect_operations" => "true",
        "http.header_read_timeout" => "10s",
        "http.request_timeout" => "10s",
        "http.idempotency_retention" => "2h",
        "http.max_connections" => "7",
        "http.max_in_flight" => "7",
        "windows.payment" => "15m",
        "windows.fulfillment" => "8d",
        "windows.receipt" => "15d",
        "windows.max_payment" => "10d",
        "consumer.batch_size" => "7",
        "consumer.batch_wait" => "6ms",
        "consumer.hold_max" => "2s",
        "consumer.catch_up" => "false",
        "relay.enabled" => "false",
        "relay.batch_size" => "7",
        "relay.interval" => "1s",
        "relay.max_attempts" => "3",
        "sweeper.enabled" => "false",
        "sweeper.interval" => "1m",
        "sweeper.grace" => "2m",
        "sweeper.batch_size" => "7",
        "metrics.gauge_interval" => "1m",
        "metrics.overdue_after" => "5m",
        "log.format" => "json",
        "log.level" => "debug",
        other => panic!("no other value for `{other}`: add one to this test"),
    };
    value.to_string()
}

#[test]
fn every_key_reaches_its_own_field() {
    let dir = std::env::temp_dir().join(format!("ot-settings-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca_file = dir.join("ca.pem");
    std::fs::write(
        &ca_file,
        "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let ca_file = ca_file.display().to_string();
    // A token in the admin scope, so that `http.protect_operations = true`
    // passes the cross-key checks.
    let admin = ("ORDER_TIMEOUT__HTTP__ADMIN_TOKENS", TOKEN_A);
    let base = load(&[admin]).unwrap().describe();
    // The orders and their mapping only mean something together: see
    // `every_mapping_key_reaches_its_own_field`.
    let alone = |k: &&Key| !k.name.starts_with("mapping.") && k.name != "orders.source";
    for (i, key) in keys().enumerate().filter(|(_, k)| alone(k)) {
        let var = format!(
            "{ENV_PREFIX}__{}",
            key.name.replace('.', "__").to_uppercase()
        );
        let value = another_value(key.name, &ca_file);
        // A later variable wins over an earlier one of the same name.
        let described = load(&[admin, (&var, &value)])
            .unwrap_or_else(|e| panic!("`{}` = '{value}': {e}", key.name))
            .describe();
        let (name, shown, source) = &described[i];
        assert_eq!(name, key.name);
        assert_ne!(shown, &base[i].1, "`{}` did not change its field", key.name);
        assert_eq!(source, &Source::Env(var.clone()));
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// Two complete mappings between them set every `mapping.*` key to a value
/// of its own; each shows up in its own key.
#[test]
fn every_mapping_key_reaches_its_own_field() {
    let common = [
        ("ORDER_TIMEOUT__DATABASE__URL", "postgres://u@db/shop"),
        ("ORDER_TIMEOUT__ORDERS__SOURCE", "mapped"),
        ("ORDER_TIMEOUT__MAPPING__TABLE", "shop.orders_t"),
        ("ORDER_TIMEOUT__MAPPING__ID_COLUMN", "id_c"),
        ("ORDER_TIMEOUT__MAPPING__STATUS_COLUMN", "status_c"),
        ("ORDER_TIMEOUT__MAPPING__STAMP_COLUMN", "stamp_c"),
        ("ORDER_TIMEOUT__MAPPING__PAYMENT__FROM", "p_from"),
        ("ORDER_TIMEOUT__MAPPING__PAYMENT__TO", "p_to"),
        ("ORDER_TIMEOUT__MAPPING__FULFILLMENT__FROM", "f_from"),
        ("ORDER_TIMEOUT__MAPPING__RECEIPT__FROM", "r_from"),
        ("ORDER_TIMEOUT__MAPPING__RECEIPT__TO", "r_to"),
    ];
    let a = [
        ("ORDER_TIMEOUT__MAPPING__PAYMENT__SINCE_COLUMN", "p_since"),
        ("ORDER_TIMEOUT__MAPPING__TIME_ZONE", "America/Bogota"),
        ("ORDER_TIMEOUT__MAPPING__FULFILLMENT__TO", "f_to"),
        (
            "ORDER_TIMEOUT__MAPPING__FULFILLMENT__DEADLINE_COLUMN",
            "f_deadline",
        ),
        ("ORDER_TIMEOUT__MAPPING__RECEIPT__SINCE_COLUMN", "r_since"),
        ("ORDER_TIMEOUT__MAPPING__STOCK__ITEMS_TABLE", "items_t"),
        (
            "ORDER_TIMEOUT__MAPPING__STOCK__ITEMS_ORDER_COLUMN",
            "items_order",
        ),
        (
            "ORDER_TIMEOUT__MAPPING__STOCK__ITEMS_SKU_COLUMN",
            "items_sku",
        ),
        (
            "ORDER_TIMEOUT__MAPPING__STOCK__ITEMS_QUANTITY_COLUMN",
            "items_qty",
        ),
        ("ORDER_TIMEOUT__MAPPING__STOCK__TABLE", "stock_t"),
        ("ORDER_TIMEOUT__MAPPING__STOCK__ID_COLUMN", "stock_id"),
        (
            "ORDER_TIMEOUT__MAPPING__STOCK__RESERVED_COLUMN",
            "stock_reserved",
        ),
        (
            "ORDER_TIMEOUT__MAPPING__STOCK__AVAILABLE_COLUMN",
            "stock_available",
        ),
        (
            "ORDER_TIMEOUT__MAPPING__RELEASE_SQL",
            "DELETE FROM holds WHERE o = $1",
        ),
    ];
    let b = [
        (
            "ORDER_TIMEOUT__MAPPING__PAYMENT__DEADLINE_COLUMN",
            "p_deadline",
        ),
        ("ORDER_TIMEOUT__MAPPING__FULFILLMENT__FLAG_COLUMN", "f_flag"),
        (
            "ORDER_TIMEOUT__MAPPING__FULFILLMENT__SINCE_COLUMN",
            "f_since",
        ),
        (
            "ORDER_TIMEOUT__MAPPING__RECEIPT__DEADLINE_COLUMN",
            "r_deadline",
        ),
    ];
    let mut seen = std::collections::BTreeSet::new();
    for variant in [&a[..], &b[..]] {
        let env: Vec<(&str, &str)> = common.iter().chain(variant).copied().collect();
        let described = load(&env).unwrap_or_else(|e| panic!("{e}")).describe();
        for (var, value) in &env[1..] {
            let key = var["ORDER_TIMEOUT__".len()..]
                .replace("__", ".")
                .to_lowercase();
            let (_, shown, source) = described
                .iter()
                .find(|(k, _, _)| *k == key)
                .unwrap_or_else(|| panic!("{key} not described"));
            assert_eq!(shown, value, "`{key}`");
            assert_eq!(source, &Source::Env(var.to_string()));
            seen.insert(key);
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
    let mapped = [
        ("ORDER_TIMEOUT__DATABASE__URL", "postgres://u@db/shop"),
        ("ORDER_TIMEOUT__ORDERS__SOURCE", "mapped"),
        ("ORDER_TIMEOUT__MAPPING__TABLE", "oms_order"),
        ("ORDER_TIMEOUT__MAPPING__PAYMENT__FROM", "0"),
        ("ORDER_TIMEOUT__MAPPING__PAYMENT__TO", "4"),
        (
            "ORDER_TIMEOUT__MAPPING__PAYMENT__SINCE_COLUMN",
            "create_time",
        ),
    ];
    load(&mapped).expect("a minimal mapping");
    // (changes to the minimal mapping, the key named, what the reason says)
    type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, &'a str);
    let cases: &[Case] = &[
        // A mapping key while the service owns the orders would be ignored.
        (
            &[("ORDER_TIMEOUT__MAPPING__TABLE", "oms_order")],
            "mapping.table",
            "`orders.source` is owned",
        ),
        (
            &[("ORDER_TIMEOUT__DATABASE__URL", "sqlite::memory:")],
            "orders.source",
            "PostgreSQL or MySQL",
        ),
        (
            &[("ORDER_TIMEOUT__MAPPING__TABLE", "")],
            "mapping.table",
            "must name",
        ),
        (
            &[("ORDER_TIMEOUT__MAPPING__TABLE", "oms_order; DROP TABLE x")],
            "mapping.table",
            "not a table name",
        ),
        // Spliced into statements as a quoted literal: nothing that could end it.
        (
            &[("ORDER_TIMEOUT__MAPPING__TIME_ZONE", "UTC' OR '1'='1")],
            "mapping.time_zone",
            "not a time zone",
        ),
        (
            &[("ORDER_TIMEOUT__MAPPING__TIME_ZONE", "+15:00")],
            "mapping.time_zone",
            "between -14:00 and +14:00",
        ),
        (
            &[("ORDER_TIMEOUT__MAPPING__STATUS_COLUMN", "a.b")],
            "mapping.status_column",
            "not a column name",
        ),
        (
            &[("ORDER_TIMEOUT__MAPPING__PAYMENT__TO", "")],
            "mapping.payment.to",
            "must be set",
        ),
        (
            &[("ORDER_TIMEOUT__MAPPING__PAYMENT__TO", "0")],
            "mapping.payment.to",
            "same status",
        ),
        (
            &[("ORDER_TIMEOUT__MAPPING__PAYMENT__SINCE_COLUMN", "")],
            "mapping.payment.deadline_column",
            "set this",
        ),
        (
            &[("ORDER_TIMEOUT__MAPPING__PAYMENT__DEADLINE_COLUMN", "d")],
            "mapping.payment.since_column",
            "not both",
        ),
        (
            &[("ORDER_TIMEOUT__MAPPING__STAMP_COLUMN", "create_time")],
            "mapping.stamp_column",
            "would move the deadline",
        ),
        (
            &[("ORDER_TIMEOUT__MAPPING__RECEIPT__TO", "3")],
            "mapping.receipt.to",
            "needs `mapping.receipt.from`",
        ),
        (
            &[("ORDER_TIMEOUT__MAPPING__STOCK__ITEMS_TABLE", "items")],
            "mapping.stock.items_order_column",
            "must be set",
        ),
        (
            &[("ORDER_TIMEOUT__MAPPING__RELEASE_SQL", "UPDATE s SET r = 0")],
            "mapping.release_sql",
            "does not bind the order id",
        ),
    ];
    for (changes, key, said) in cases {
        let env: Vec<(&str, &str)> = if changes[0].0 == "ORDER_TIMEOUT__MAPPING__TABLE"
            && *key == "mapping.table"
            && said.contains("owned")
        {
            changes.to_vec()
        } else {
            mapped.iter().chain(changes.iter()).copied().collect()
        };
        match load(&env) {
            Err(SettingsError::Invalid { key: k, reason }) => {
                assert_eq!(&k, key, "{reason}");
                assert!(reason.contains(said), "{key}: {reason}");
            }
            other => panic!("{key}: expected a refusal, got {other:?}"),
        }
    }
}

/// `config/order-timeout.toml`, as shipped.
const SHIPPED: &str = include_str!("../../config/order-timeout.toml");

fn load_file(path: &Path, env: &[(&str, &str)]) -> Result<Settings, SettingsError> {
    let env = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Settings::load(&SettingsSource {
        file: Some(path.to_path_buf()),
        env: Some(env),
    })
}

/// Every key's value as `doctor` shows it, without where it came from.
fn values(settings: &Settings) -> Vec<(String, String)> {
    let described = settings.describe().into_iter();
    described.map(|(key, shown, _)| (key, shown)).collect()
}

/// The dotted keys a settings file mentions, set or commented out, in order.
fn keys_in(file: &str) -> Vec<String> {
    let mut section = "";
    let mut found = Vec::new();
    for line in file.lines() {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name;
        } else if let Some((field, _)) = line.trim_start_matches("# ").split_once(" = ")
            && !field.contains(' ')
            && !section.is_empty()
        {
            found.push(format!("{section}.{field}"));
        }
    }
    found
}

#[test]
fn every_key_is_in_the_shipped_file() {
    let found = keys_in(SHIPPED);
    for key in keys() {
        assert!(
            found.iter().any(|k| k == key.name),
            "`{}` is missing from config/order-timeout.toml; regenerate it: {REGENERATE}",
            key.name
        );
    }
    let table: Vec<&str> = keys().map(|k| k.name).collect();
    assert_eq!(
        found, table,
        "regenerate config/order-timeout.toml: {REGENERATE}"
    );
}

#[test]
fn the_shipped_file_is_the_table_written_out() {
    let written = defaults_file();
    if written != SHIPPED {
        let differs = written
            .lines()
            .zip(SHIPPED.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(written.lines().count().min(SHIPPED.lines().count()));
        panic!(
            "config/order-timeout.toml is not the settings table written out \
             (line {} differs: the table writes {:?}); regenerate it: {REGENERATE}",
            differs + 1,
            written.lines().nth(differs).unwrap_or("(end of file)"),
        );
    }
}

#[test]
fn the_shipped_file_changes_nothing() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/order-timeout.toml");
    let shipped = load_file(&path, &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(values(&shipped), values(&load(&[]).unwrap()));
    // It really was read: every key it sets came from it.
    assert_eq!(shipped.sources["amqp.prefix"], Source::File(path));
    // And what it leaves commented out kept the default (the mapping would
    // be refused with `orders.source = owned`).
    assert_eq!(shipped.sources["mapping.id_column"], Source::Default);
    assert_eq!(shipped.sources["http.admin_tokens"], Source::Default);
}

#[test]
fn every_key_is_described_in_one_line() {
    for key in keys() {
        let doc = key.doc;
        assert!(
            !doc.is_empty() && !doc.contains('\n') && doc.ends_with('.'),
            "{}: {doc:?}",
            key.name
        );
        // With `# ` in front, a line of the file stays within 100 characters.
        assert!(doc.chars().count() <= 98, "{}: too long: {doc}", key.name);
    }
}

/// `order-timeout config`: what the file and the environment gave, each
/// saying where from, secrets redacted; read back (the real tokens given again
/// in the environment), the same settings.
#[test]
fn the_settings_in_effect_read_back_as_themselves() {
    let dir = std::env::temp_dir().join(format!("ot-settings-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("c.toml");
    std::fs::write(
        &path,
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
    )
    .unwrap();
    let token = (
        "ORDER_TIMEOUT__HTTP__ADMIN_TOKENS",
        "hunter2-admin-0123456789",
    );
    let env = [
        ("ORDER_TIMEOUT__AMQP__PREFIX", "shop.timeouts"),
        (
            "ORDER_TIMEOUT__HTTP__CHECKOUT_TOKENS",
            "hunter2-check-0123456789",
        ),
        (
            "ORDER_TIMEOUT__MAPPING__RELEASE_SQL",
            "UPDATE holds SET note = 'it''s \"late\"' WHERE o = ?; DELETE FROM h WHERE o = ?",
        ),
    ];
    let settings = load_file(&path, &env).unwrap_or_else(|e| panic!("{e}"));
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
    assert_eq!(keys_in(&printed), keys_in(SHIPPED));

    let again = dir.join("printed.toml");
    std::fs::write(&again, &printed).unwrap();
    // A redacted token is refused, naming its key: never taken for a token.
    let err = load_file(&again, &[]).unwrap_err().to_string();
    assert!(
        err.contains("`http.checkout_tokens`") && err.contains("redacted"),
        "{err}"
    );
    let read_back = load_file(
        &again,
        &[token, ("ORDER_TIMEOUT__HTTP__CHECKOUT_TOKENS", env[1].1)],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(values(&read_back), values(&settings));
    std::fs::remove_dir_all(dir).unwrap();
}

/// Nothing but the table's defaults: the settings in effect are the shipped
/// file, below their own header.
#[test]
fn with_nothing_given_the_settings_in_effect_are_the_defaults() {
    let printed = load(&[]).unwrap().to_toml();
    let body = |file: &str| file[file.find("\n[").unwrap_or(0)..].to_string();
    assert_eq!(body(&printed), body(SHIPPED));
}

/// Every live key and a few restart-only ones, each given a value other than its default.
const RELOADED: &[(&str, &str)] = &[
    ("ORDER_TIMEOUT__WINDOWS__PAYMENT", "15m"),
    ("ORDER_TIMEOUT__WINDOWS__FULFILLMENT", "3d"),
    ("ORDER_TIMEOUT__WINDOWS__RECEIPT", "10d"),
    ("ORDER_TIMEOUT__WINDOWS__MAX_PAYMENT", "2d"),
    ("ORDER_TIMEOUT__CONSUMER__BATCH_SIZE", "17"),
    ("ORDER_TIMEOUT__CONSUMER__BATCH_WAIT", "7ms"),
    ("ORDER_TIMEOUT__CONSUMER__HOLD_MAX", "3s"),
    ("ORDER_TIMEOUT__RELAY__BATCH_SIZE", "33"),
    ("ORDER_TIMEOUT__RELAY__INTERVAL", "2s"),
    ("ORDER_TIMEOUT__SWEEPER__INTERVAL", "9s"),
    ("ORDER_TIMEOUT__SWEEPER__GRACE", "11s"),
    ("ORDER_TIMEOUT__SWEEPER__BATCH_SIZE", "44"),
    ("ORDER_TIMEOUT__METRICS__GAUGE_INTERVAL", "5s"),
    ("ORDER_TIMEOUT__METRICS__OVERDUE_AFTER", "90s"),
    ("ORDER_TIMEOUT__LOG__LEVEL", "debug"),
    ("ORDER_TIMEOUT__HTTP__CHECKOUT_TOKENS", TOKEN_A),
    ("ORDER_TIMEOUT__HTTP__ADMIN_TOKENS", TOKEN_B),
    ("ORDER_TIMEOUT__AMQP__PREFIX", "elsewhere"),
    ("ORDER_TIMEOUT__AMQP__DELAY_MODE", "ttl"),
    ("ORDER_TIMEOUT__AMQP__QUEUE_TYPE", "quorum"),
    ("ORDER_TIMEOUT__HTTP__BIND", "127.0.0.1:9999"),
    ("ORDER_TIMEOUT__SWEEPER__ENABLED", "false"),
    ("ORDER_TIMEOUT__CONSUMER__CATCH_UP", "false"),
];

#[test]
fn a_reload_takes_the_live_keys_and_nothing_else() {
    let running = load(&[]).unwrap();
    let new = load(RELOADED).unwrap();
    let all: Vec<&str> = changes(&running, &new).iter().map(|c| c.key).collect();
    assert_eq!(all.len(), RELOADED.len(), "each given key differs: {all:?}");
    for key in live_keys() {
        assert!(all.contains(&key), "the test changes every live key: {key}");
    }
    let applied = running.with_live(&new);
    let taken: Vec<&str> = changes(&running, &applied).iter().map(|c| c.key).collect();
    let left: Vec<&str> = changes(&applied, &new).iter().map(|c| c.key).collect();
    assert_eq!(
        taken,
        all.iter()
            .copied()
            .filter(|k| is_live(k, &running))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        left,
        all.iter()
            .copied()
            .filter(|k| !is_live(k, &running))
            .collect::<Vec<_>>()
    );
    assert_eq!(taken.len(), live_keys().count());
    // Where an applied value came from follows it.
    assert_eq!(
        applied.sources["windows.payment"],
        Source::Env("ORDER_TIMEOUT__WINDOWS__PAYMENT".into())
    );
    assert_eq!(applied.sources["amqp.prefix"], Source::Default);
}

/// A token swapped for another, or a URL whose password alone changed, shows
/// the same redacted text: it is a change all the same, named without its value.
#[test]
fn a_rotated_token_or_a_new_password_is_a_change() {
    let running = load(&[
        ("ORDER_TIMEOUT__HTTP__ADMIN_TOKENS", TOKEN_A),
        (
            "ORDER_TIMEOUT__DATABASE__URL",
            "postgres://shop:hunter2-old@127.0.0.1/shop",
        ),
        (
            "ORDER_TIMEOUT__AMQP__URL",
            "amqp://shop:hunter2-old@127.0.0.1/%2f",
        ),
    ])
    .unwrap();
    let new = load(&[
        ("ORDER_TIMEOUT__HTTP__ADMIN_TOKENS", TOKEN_B),
        (
            "ORDER_TIMEOUT__DATABASE__URL",
            "postgres://shop:hunter2-new@127.0.0.1/shop",
        ),
        (
            "ORDER_TIMEOUT__AMQP__URL",
            "amqp://shop:hunter2-new@127.0.0.1/%2f",
        ),
    ])
    .unwrap();
    let found = changes(&running, &new);
    let keys: Vec<&str> = found.iter().map(|c| c.key).collect();
    // The management API takes its password from `amqp.url`.
    assert_eq!(
        keys,
        [
            "database.url",
            "amqp.url",
            "amqp.management_url",
            "http.admin_tokens"
        ]
    );
    let shown = format!("{found:?}");
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
    let running = load(&[("ORDER_TIMEOUT__HTTP__ADMIN_TOKENS", TOKEN_A)]).unwrap();
    let none = load(&[]).unwrap();
    let refused = check_applied(&running, &running.with_live(&none)).unwrap_err();
    assert!(
        refused.to_string().contains("http.admin_tokens"),
        "{refused}"
    );
    let rotated = load(&[("ORDER_TIMEOUT__HTTP__CHECKOUT_TOKENS", TOKEN_B)]).unwrap();
    check_applied(&running, &running.with_live(&rotated)).unwrap();
    // Open on loopback at start: tokens may be added by a reload.
    check_applied(&none, &none.with_live(&running)).unwrap();
}

/// A file that is not TOML: the error names the file, line and column and
/// says what is wrong, without the line, which may carry a secret.
#[test]
fn a_syntax_error_names_line_and_column_never_the_text() {
    let dir = std::env::temp_dir().join(format!("ot-settings-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("broken.toml");
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
        std::fs::write(&path, text).unwrap();
        let error = load_file(&path, &[]).unwrap_err().to_string();
        assert!(!error.contains("hunter2"), "{error}");
        assert!(error.contains(&path.display().to_string()), "{error}");
        assert!(error.contains(&format!("line {line}, column ")), "{error}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_mapped_table_keeps_its_windows_until_a_restart() {
    let mut running = load(&[]).unwrap();
    running.mapping.source = OrdersSource::Mapped;
    let new = load(RELOADED).unwrap();
    assert!(!is_live("windows.payment", &running));
    assert!(is_live("sweeper.interval", &running));
    let applied = running.with_live(&new);
    assert_eq!(applied.windows.payment, running.windows.payment);
    assert_eq!(applied.sweeper.interval, new.sweeper.interval);
}

/// `mapping.time_zone`: offsets east positive, as MySQL and ISO 8601 write
/// them, shown as written; names kept as they are.
#[test]
fn time_zones_are_read_by_shape() {
    assert_eq!(Zone::parse("-05:00"), Ok(Zone::Offset(-300)));
    assert_eq!(Zone::parse("+08:00"), Ok(Zone::Offset(480)));
    assert_eq!(
        Zone::parse("+05:30").map(|z| z.to_string()),
        Ok("+05:30".into())
    );
    assert_eq!(
        Zone::parse("-00:30").map(|z| z.to_string()),
        Ok("-00:30".into())
    );
    assert_eq!(
        Zone::parse("America/Argentina/Buenos_Aires"),
        Ok(Zone::Named("America/Argentina/Buenos_Aires".into()))
    );
    assert_eq!(Zone::parse("SYSTEM"), Ok(Zone::Named("SYSTEM".into())));
    // A server's own spelling stays text: PostgreSQL reads this one as UTC+5.
    assert_eq!(Zone::verbatim("-05:00"), Ok(Zone::Named("-05:00".into())));
    assert!(Zone::verbatim("<-03>3").is_err());
    for bad in [
        "",
        "+5:00",
        "05:00",
        "Asia/Shang hai",
        "a'b",
        "-14:30",
        "x".repeat(65).as_str(),
    ] {
        assert!(Zone::parse(bad).is_err(), "{bad}");
    }
}
