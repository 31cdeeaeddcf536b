//! The broker side of the topology: the committed definitions files import
//! into a fresh vhost and carry a timeout, quorum queues carry a full timeout
//! cycle, `rabbitmq/rabbitmq.conf` uses only keys the broker knows, and the
//! users of `rabbitmq/definitions.access.json` have the rights they need and
//! no more.

use std::collections::{BTreeSet, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use order_timeout::amqp::definitions;
use order_timeout::amqp::topology::{LAZY_FROM, LEVELS, Mode, Names};
use serde_json::{Value, json};

use crate::helpers::*;

fn topology_mode(mode: DelayMode) -> Mode {
    mode.service()
}

/// `POST /api/definitions/{vhost}`: what an operator does with the file.
async fn import_definitions(vhost: &str, definitions: &Value) {
    broker_api()
        .post(&format!("/definitions/{}", url_encode(vhost)), definitions)
        .await
        .unwrap_or_else(|e| panic!("import definitions: {e}"));
}

/// A binding as the management API and the definitions both spell it.
fn binding_key(b: &Value) -> (String, String, String, String) {
    let s = |k: &str| b[k].as_str().unwrap_or_default().to_string();
    (
        s("source"),
        s("destination"),
        s("destination_type"),
        s("routing_key"),
    )
}

/// The vhost holds exactly the definitions' exchanges, queues and bindings, each
/// with the type, flags and arguments the file gives (the broker's own `amq.*`
/// exchanges and default-exchange bindings aside).
async fn assert_vhost_matches(vhost: &str, definitions: &Value) {
    let v = url_encode(vhost);
    let exchanges: Vec<Value> = api_get(&format!("/exchanges/{v}"))
        .await
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| {
            let name = x["name"].as_str().unwrap();
            !name.is_empty() && !name.starts_with("amq.")
        })
        .cloned()
        .collect();
    let expected = definitions["exchanges"].as_array().unwrap();
    assert_eq!(exchanges.len(), expected.len(), "exchanges in {vhost}");
    for want in expected {
        let got = exchanges
            .iter()
            .find(|x| x["name"] == want["name"])
            .unwrap_or_else(|| panic!("exchange {} missing", want["name"]));
        for field in ["type", "durable", "auto_delete", "internal", "arguments"] {
            assert_eq!(got[field], want[field], "exchange {} {field}", want["name"]);
        }
    }

    let queues = api_get(&format!("/queues/{v}")).await;
    let queues = queues.as_array().unwrap();
    let expected = definitions["queues"].as_array().unwrap();
    assert_eq!(queues.len(), expected.len(), "queues in {vhost}");
    for want in expected {
        let got = queues
            .iter()
            .find(|q| q["name"] == want["name"])
            .unwrap_or_else(|| panic!("queue {} missing", want["name"]));
        for field in ["durable", "auto_delete"] {
            assert_eq!(got[field], want[field], "queue {} {field}", want["name"]);
        }
        assert_eq!(
            queue_arguments(got, want),
            want["arguments"],
            "queue {} arguments",
            want["name"]
        );
    }

    let bindings: BTreeSet<_> = api_get(&format!("/bindings/{v}"))
        .await
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["source"] != "")
        .map(binding_key)
        .collect();
    let expected: BTreeSet<_> = definitions["bindings"]
        .as_array()
        .unwrap()
        .iter()
        .map(binding_key)
        .collect();
    assert_eq!(
        expected.len(),
        definitions["bindings"].as_array().unwrap().len(),
        "no duplicate bindings in the file"
    );
    assert_eq!(bindings, expected, "bindings in {vhost}");
}

/// A queue's arguments as the broker reports them, less the
/// `x-queue-type: classic` that RabbitMQ 4.3 (seen on 4.3.6) records on a
/// classic queue declared without one, when the definitions say none.
fn queue_arguments(got: &Value, want: &Value) -> Value {
    let mut arguments = got["arguments"].clone();
    if want["arguments"].get("x-queue-type").is_none()
        && arguments.get("x-queue-type") == Some(&json!("classic"))
        && let Some(map) = arguments.as_object_mut()
    {
        map.remove("x-queue-type");
    }
    arguments
}

/// An operator imports the committed definitions into an empty vhost; the
/// service started on it finds everything equivalent (a mismatch would be
/// PRECONDITION_FAILED and the service never ready), adds nothing, and a
/// payment timeout goes through the imported topology.
async fn imported_definitions_run_a_timeout(backend: Backend, mode: DelayMode) {
    let file = definitions::file_name(topology_mode(mode));
    let defs = read_repo_json(&file);
    // The file is the code's topology (the unit test checks the text; this the meaning).
    assert_eq!(
        defs,
        definitions::definitions(&Names::new("order.timeouts"), topology_mode(mode))
    );
    let vhost = Vhost::create().await;
    import_definitions(vhost.name(), &defs).await;
    assert_vhost_matches(vhost.name(), &defs).await;

    let app = spawn_app(Spawn::new(backend, mode).vhost(vhost)).await;
    assert_eq!(app.names.entry(), "order.timeouts", "the files' prefix");
    assert_vhost_matches(&app.vhost, &defs).await;
    if topology_mode(mode) == Mode::Ttl {
        // The long levels hold the backlog on disk (lazy); the short ones, a due
        // burst's last stays, keep the default mode.
        for l in 0..LEVELS {
            let name = url_encode(&app.names.level(l));
            let q = api_get(&format!("/queues/{}/{name}", url_encode(&app.vhost))).await;
            let lazy = q["arguments"]["x-queue-mode"] == "lazy";
            assert_eq!(lazy, l >= LAZY_FROM, "level {l}: {q}");
        }
    }

    app.put_stock("A", 3).await;
    let id = app.order(&[("A", 2)], "2s").await;
    assert_eq!(app.stock("A").await["reserved"], 2);
    app.cancelled_on_time(&id, Duration::from_secs(8)).await;
    let stock = app.stock("A").await;
    assert_eq!(
        (stock["available"].clone(), stock["reserved"].clone()),
        (json!(3), json!(0))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn definitions_ttl_import_and_run_sqlite() {
    run(
        Backend::Sqlite,
        DelayMode::Ttl,
        imported_definitions_run_a_timeout,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn definitions_plugin_import_and_run_postgres() {
    run(
        Backend::Postgres,
        DelayMode::Plugin,
        imported_definitions_run_a_timeout,
    )
    .await
}

/// `rabbitmq/rabbitmq.conf` uses only keys the broker knows: each key, set or
/// suggested in a `# key = value` line, is a mapping in the schema files of the
/// installed RabbitMQ (core and plugins), when they are installed here.
#[test]
fn rabbitmq_conf_keys_are_real() {
    let conf = std::fs::read_to_string(repo_path("rabbitmq/rabbitmq.conf")).unwrap();
    let keys: Vec<String> = conf
        .lines()
        .map(|l| l.strip_prefix("# ").unwrap_or(l))
        .filter(|l| !l.starts_with('#') && l.contains(" = "))
        .map(|l| l.split(" = ").next().unwrap().trim().to_string())
        .collect();
    assert!(keys.len() >= 8, "settings found: {keys:?}");
    let schemas: Vec<PathBuf> = std::fs::read_dir("/usr/lib/rabbitmq/lib")
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|server| {
            std::fs::read_dir(server.path().join("plugins"))
                .into_iter()
                .flatten()
        })
        .flatten()
        .flat_map(|plugin| {
            std::fs::read_dir(plugin.path().join("priv/schema"))
                .into_iter()
                .flatten()
        })
        .flatten()
        .map(|e| e.path())
        .collect();
    if schemas.is_empty() {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: no RabbitMQ schema files under /usr/lib/rabbitmq to check rabbitmq.conf keys against"
        );
        return;
    }
    let mappings: HashSet<String> = schemas
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .flat_map(|text| {
            text.lines()
                .filter_map(|l| l.strip_prefix("{mapping, \""))
                .filter_map(|l| l.split('"').next())
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    for key in keys {
        assert!(mappings.contains(&key), "{key} is not a rabbitmq.conf key");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_queues_carry_a_full_timeout_cycle() {
    let app = spawn_app(
        Spawn::new(Backend::Postgres, DelayMode::Ttl)
            .env("ORDER_TIMEOUT__AMQP__QUEUE_TYPE", "quorum"),
    )
    .await;
    let queue = |name: String| {
        let vhost = app.vhost.clone();
        async move { api_get(&format!("/queues/{vhost}/{name}")).await }
    };
    for l in [0, 5, 22] {
        let q = queue(app.names.level(l)).await;
        assert_eq!(q["type"], "quorum", "{q}");
        let args = &q["arguments"];
        assert_eq!(args["x-queue-type"], "quorum", "{q}");
        assert_eq!(args["x-dead-letter-strategy"], "at-least-once", "{q}");
        assert_eq!(args["x-overflow"], "reject-publish", "{q}");
        // Lazy mode is a classic-queue argument; quorum queues keep it off disk anyway.
        assert!(args.get("x-queue-mode").is_none(), "{q}");
        assert_eq!(args["x-message-ttl"], (1i64 << l) * 1000, "{q}");
        assert_eq!(args["x-dead-letter-exchange"], app.names.out(l), "{q}");
    }
    for name in [
        app.names.work(order_timeout::domain::TimeoutKind::Payment),
        app.names.ingest(),
        app.names.parked(),
    ] {
        assert_eq!(queue(name).await["type"], "quorum");
    }
    // 3 s: a stay in level 1 (2 s), then level 0 (1 s), both quorum.
    app.put_stock("A", 5).await;
    let id = app.order(&[("A", 5)], "3s").await;
    app.cancelled_on_time(&id, Duration::from_secs(10)).await;
    assert_eq!(app.stock("A").await["available"], 5);
}

// ------------------------------------------------------- least privilege

/// Users the test made (they are global, not in its vhost): deleted on drop.
struct Users(Vec<String>);

impl Drop for Users {
    fn drop(&mut self) {
        let users = std::mem::take(&mut self.0);
        let _ = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async {
                    for user in users {
                        let _ = broker_api().delete(&format!("/users/{user}")).await;
                    }
                })
        })
        .join();
    }
}

/// `rabbitmq/definitions.access.json`, imported as an operator would (its
/// users renamed for this test, its vhost this test's), each user then given
/// a password: the service runs the whole cycle as its own user and can reach
/// nothing outside its prefix; the publishers' user can publish to the entry
/// exchange and do nothing else.
async fn least_privilege(backend: Backend, mode: DelayMode) {
    let vhost = Vhost::create().await;
    let id = vhost.name()["ot-test-".len()..].to_string();
    let (service, publisher) = (format!("ot-test-svc-{id}"), format!("ot-test-pub-{id}"));
    let file = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(definitions::ACCESS_FILE),
    )
    .unwrap();
    let mut access: Value = serde_json::from_str(&file).unwrap();
    let rename = |name: &Value| {
        if name == definitions::SERVICE_USER {
            json!(service)
        } else {
            json!(publisher)
        }
    };
    for user in access["users"].as_array_mut().unwrap() {
        user["name"] = rename(&user["name"]);
    }
    for p in access["permissions"].as_array_mut().unwrap() {
        p["user"] = rename(&p["user"]);
        p["vhost"] = json!(vhost.name());
    }
    let _users = Users(vec![service.clone(), publisher.clone()]);
    broker_api()
        .post("/definitions", &access)
        .await
        .unwrap_or_else(|e| panic!("import {}: {e}", definitions::ACCESS_FILE));
    let password = new_token("pw");
    for user in access["users"].as_array().unwrap() {
        let tags: Vec<&str> = user["tags"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        broker_api()
            .put(
                &format!("/users/{}", user["name"].as_str().unwrap()),
                Some(&json!({"password": password, "tags": tags.join(",")})),
            )
            .await
            .unwrap();
    }
    let url_as = |user: &str| {
        let broker = BROKER.get();
        let (scheme, host) = broker.split_once("://").unwrap();
        let host = host.rsplit('@').next().unwrap();
        format!("{scheme}://{user}:{password}@{host}/{}", vhost.name())
    };
    let (service_url, publisher_url) = (url_as(&service), url_as(&publisher));

    // The service, as its own user (the management API too: amqp.url's user).
    let app = spawn_app(
        Spawn::new(backend, mode)
            .env("ORDER_TIMEOUT__AMQP__URL", service_url.clone())
            .vhost(vhost),
    )
    .await;
    app.put_stock("A", 2).await;
    let id = app.order(&[("A", 2)], "1s").await;
    app.wait_status(&id, "cancelled", Duration::from_secs(20))
        .await;
    assert_eq!(app.stock("A").await["available"], 2);

    // The publishers' user publishes to the entry exchange: its message
    // reaches the service (an unknown order: parked with the reason).
    let conn = |url: String| async move {
        lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
            .await
            .unwrap()
    };
    let publishing = conn(publisher_url.clone()).await;
    let channel = publishing.create_channel().await.unwrap();
    channel
        .confirm_select(lapin::options::ConfirmSelectOptions::default())
        .await
        .unwrap();
    let body = json!({"order_id": "999999", "kind": "payment"}).to_string();
    order_timeout::amqp::publish_confirmed(
        &channel,
        app.names.entry(),
        "payment",
        body.as_bytes(),
        contract_properties(delay(10)),
    )
    .await
    .expect("the publishers' user publishes to the entry exchange");
    let parked = wait_until(
        Duration::from_secs(20),
        "the publisher's message parked",
        || async {
            let parked = app.drain_parked().await;
            (!parked.is_empty()).then_some(parked)
        },
    )
    .await;
    assert_eq!(parked.len(), 1, "{parked:?}");
    assert_eq!(parked[0].0, "unknown_order");

    // ... and nothing else: another exchange, a queue, a declaration.
    let refused = |what: &str, e: String| {
        assert!(e.contains("ACCESS_REFUSED"), "{what}: {e}");
    };
    let channel = publishing.create_channel().await.unwrap();
    channel
        .confirm_select(lapin::options::ConfirmSelectOptions::default())
        .await
        .unwrap();
    let due = order_timeout::amqp::publish_confirmed(
        &channel,
        &app.names.due(),
        "payment",
        body.as_bytes(),
        contract_properties(delay(10)),
    )
    .await;
    refused("publish to the due exchange", format!("{:?}", due.err()));
    let channel = publishing.create_channel().await.unwrap();
    let get = channel
        .basic_get(
            app.names.ingest().as_str().into(),
            lapin::options::BasicGetOptions::default(),
        )
        .await;
    refused("read the ingest queue", format!("{:?}", get.err()));
    let channel = publishing.create_channel().await.unwrap();
    let declare = channel
        .queue_declare(
            "mine".into(),
            // Durable: a broker that denies transient non-exclusive queues
            // (RabbitMQ 4.3's deprecation) would refuse it for that instead.
            lapin::options::QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            lapin::types::FieldTable::default(),
        )
        .await;
    refused("declare a queue", format!("{:?}", declare.err()));

    // The service's user reaches nothing outside its prefix either.
    let serving = conn(service_url).await;
    let channel = serving.create_channel().await.unwrap();
    let other = channel
        .exchange_declare(
            "shop.orders".into(),
            lapin::ExchangeKind::Fanout,
            lapin::options::ExchangeDeclareOptions::default(),
            lapin::types::FieldTable::default(),
        )
        .await;
    refused(
        "the service's user declares outside its prefix",
        format!("{:?}", other.err()),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_privilege_users_ttl_sqlite() {
    run(Backend::Sqlite, DelayMode::Ttl, least_privilege).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_privilege_users_plugin_postgres() {
    run(Backend::Postgres, DelayMode::Plugin, least_privilege).await
}
