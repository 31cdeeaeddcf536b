//! `make test-cluster`: the service on the three-node RabbitMQ cluster of
//! `make cluster` (`scripts/cluster.sh`; `RABBITMQ_ROOT=/srv/rabbitmq43` for
//! RabbitMQ 4.3), quorum queues, two `serve` instances given the cluster's
//! three addresses in different orders, and PostgreSQL. Phases of 600 orders
//! (`CLUSTER_ORDERS`) placed at 80 a second (`CLUSTER_ORDERS_PER_SECOND`),
//! payment windows of 4 to 12 s, 10 % paid a third of the way into their
//! windows; in each, a node is lost for 10 s ([`DOWN`], plus the time stopping
//! and starting it takes) from when the first deadlines fall due, so that most
//! fall due while it is down ([`LOSSES`]): in TTL mode the node holding the
//! most quorum-queue leaders, its application stopped (`rabbitmqctl stop_app`)
//! and started again, then its Erlang VM SIGKILLed and the node restarted; in
//! plugin mode the node that holds the plugin timers instance a's relay
//! published (the plugin keeps them in that node's table, replicated
//! nowhere), stopped, then killed and replaced by an empty node; in native
//! mode (RabbitMQ 4.3) the node holding the leader of the queue that holds
//! the timers stopped, then the node of instance a's deferrer killed. A mode
//! the cluster cannot run ([`Mode::unavailable`]: the plugin on 4.3) is
//! skipped, saying why. Then the ledger: nothing lost, nothing early, no paid
//! order cancelled, no stock released twice, stock conserved, the outbox
//! drained, and the lateness of the timers that fell due while the node was
//! down. The figures are printed and written to the broker series' section of
//! `docs/RELIABILITY.md`.
//!
//! Another delay mode's phases are a [`Mode`] value (its `delay_mode`, when
//! the cluster can run it, how to read its phases) and their [`Loss`] rows in
//! [`LOSSES`], a [`Target`] added if they lose another node.
//!
//! `#[ignore]` keeps it out of `cargo test`: it needs the cluster, and stops
//! and kills its nodes.

mod ledger;

use std::collections::HashMap;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ledger::{
    Placed, SKUS, admin, checkout, ends, env_or, get_json, migrate, outbox_rows, percentiles,
    put_stock, settle, stock_check, write_section,
};
use order_timeout_harness::{Management, Process, Serve};
use serde_json::Value;
use tokio::sync::Mutex;

const BIN: &str = env!("CARGO_BIN_EXE_order-timeout");
/// The cluster's nodes: AMQP port and node name (`scripts/cluster.sh`).
const NODES: [(u16, &str); 3] = [
    (5681, "ot-cluster-1@localhost"),
    (5682, "ot-cluster-2@localhost"),
    (5683, "ot-cluster-3@localhost"),
];
/// The management API of the cluster (any node answers for all, while it is
/// up): node 1's. [`cluster_api_on`] asks another.
const MANAGEMENT: &str = "http://127.0.0.1:15681/api";
/// The sweeper's grace: long enough that a cancel by the sweeper means a
/// timer the broker lost, not one that was merely late. A timer that waits
/// for a lost node is late by at most the time the node is away ([`DOWN`]
/// plus stopping and starting it: 14 to 22 s here), so the grace is well
/// above that.
const GRACE_S: u64 = 30;
/// How often each instance's sweeper looks: a lost timer's order is cancelled
/// between deadline + grace and one interval later.
const SWEEP_INTERVAL_S: u64 = 2;
/// The shortest payment window, and how far above it they spread: 4 to 12 s,
/// so that the TTL levels of 1, 2, 4 and 8 s all carry timers.
const WINDOW_MIN_MS: u64 = 4_000;
const WINDOW_SPREAD_MS: u64 = 8_000;
/// How long a phase keeps its node away (stopping and starting it comes on
/// top), and the seconds into the loss at which where the timers wait is
/// looked at: after the first level expiries, and shortly before the node
/// comes back.
const DOWN: Duration = Duration::from_secs(10);
const LOOKS_S: [u64; 2] = [3, 8];

fn cluster_api() -> Management {
    Management::new(MANAGEMENT, Duration::from_secs(10)).expect("management API URL")
}

/// The management API of node `node` (0-based): its AMQP port plus 10,000.
fn cluster_api_on(node: usize) -> Management {
    let url = format!("http://127.0.0.1:{}/api", NODES[node].0 + 10_000);
    Management::new(&url, Duration::from_secs(10)).expect("management API URL")
}

/// `scripts/cluster.sh ARGS…`.
fn cluster(args: &[&str]) {
    let status = Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/cluster.sh"))
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("scripts/cluster.sh {args:?}: {e}"));
    assert!(status.success(), "scripts/cluster.sh {args:?}");
}

/// A delay mode the service runs in for some phases (`amqp.delay_mode`).
/// A mode's phases run one after the other, the instances restarted in it
/// first; a mode the cluster cannot run is skipped, saying why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Timers in the quorum queues of the TTL levels: replicated.
    Ttl,
    /// Timers in the delayed-message plugin's table on the node that
    /// received them: replicated nowhere.
    Plugin,
    /// Timers held by the quorum queue `<prefix>.wait` until their time
    /// (RabbitMQ 4.3 and later): replicated, released by the deferrer.
    Native,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Self::Ttl => "ttl",
            Self::Plugin => "plugin",
            Self::Native => "native",
        }
    }

    /// Why the cluster cannot run this mode; `None` when it can.
    fn unavailable(self, broker: &Broker) -> Option<String> {
        match self {
            Self::Ttl => None,
            Self::Native if broker.at_least(4, 3) => None,
            Self::Native => {
                // CI runs the cluster on RabbitMQ 4.3 too: there it must run.
                assert!(
                    std::env::var_os("ORDER_TIMEOUT_REQUIRE_NATIVE").is_none(),
                    "ORDER_TIMEOUT_REQUIRE_NATIVE is set but the cluster is RabbitMQ {}",
                    broker.version
                );
                Some(format!(
                    "RabbitMQ {}'s quorum queues hold no message until a time (native mode needs \
                     RabbitMQ 4.3 or later)",
                    broker.version
                ))
            }
            Self::Plugin if broker.plugin => None,
            Self::Plugin if broker.at_least(4, 3) => Some(format!(
                "the delayed-message plugin cannot run on RabbitMQ {} (Khepri only, no Mnesia; the \
                 plugin is built on Mnesia)",
                broker.version
            )),
            Self::Plugin => {
                // CI installs the plugin: there a cluster without it is a failure.
                assert!(
                    std::env::var_os("ORDER_TIMEOUT_REQUIRE_PLUGIN").is_none(),
                    "ORDER_TIMEOUT_REQUIRE_PLUGIN is set but the cluster (RabbitMQ {}) offers no \
                     x-delayed-message exchange type",
                    broker.version
                );
                Some(format!(
                    "the cluster (RabbitMQ {}) offers no x-delayed-message exchange type \
                     (rabbitmq_delayed_message_exchange is not installed)",
                    broker.version
                ))
            }
        }
    }

    /// How to read this mode's phases, for the report.
    fn how_to_read(self) -> &'static str {
        match self {
            Self::Ttl => {
                "In TTL mode every timer is a message in a quorum queue, replicated on the three \
                 nodes, and fires from the others while one is down."
            }
            Self::Plugin => {
                "In plugin mode a timer lives only on the node that received it (the node of the \
                 relay connection that published it): while that node is stopped its timers wait for \
                 it and fire late when it is back; when its data is lost they are gone, and the \
                 sweeper cancels their orders at deadline + grace (the count of orders cancelled by \
                 the sweeper is the count of timers lost)."
            }
            Self::Native => {
                "In native mode every timer is held by one quorum queue, replicated on the three \
                 nodes, until its delivery time; each instance's deferrer (AMQP 1.0, on one node) \
                 releases it into the due exchange. Losing the queue's leader moves the held timers \
                 to a new leader; losing the deferrer's node reconnects it to another."
            }
        }
    }
}

/// What the cluster offers, asked once of its management API.
struct Broker {
    /// `4.3.6`, say.
    version: String,
    /// The `x-delayed-message` exchange type is there.
    plugin: bool,
}

impl Broker {
    async fn ask() -> Self {
        let api = cluster_api();
        Self {
            version: api.broker_version().await.unwrap_or_else(|_| "?".into()),
            plugin: api.plugin_available().await.unwrap_or(false),
        }
    }

    /// The version is `major.minor` or later.
    fn at_least(&self, major: u32, minor: u32) -> bool {
        let mut parts = self
            .version
            .split('.')
            .map(|p| p.parse::<u32>().unwrap_or(0));
        let have = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        have >= (major, minor)
    }

    /// `4.3`, say.
    fn series(&self) -> String {
        self.version
            .split('.')
            .take(2)
            .collect::<Vec<_>>()
            .join(".")
    }
}

/// Which node a phase loses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// The node holding the most quorum-queue leaders of the vhost.
    MostLeaders,
    /// The node instance a's relay publishes to (where the plugin keeps the
    /// timers it published).
    RelayNode,
    /// The node holding the leader of the native stage's queue `<prefix>.wait`.
    WaitLeader,
    /// The node instance a's deferrer is connected to (its AMQP 1.0 link).
    DeferrerNode,
}

/// How a phase loses the node, and brings it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// `rabbitmqctl stop_app`, later `start_app`.
    StopApp,
    /// SIGKILL of its Erlang VM, later a restart of the node (its data kept).
    Kill,
    /// SIGKILL, then its data lost: forgotten by the cluster, and an empty
    /// node joined in its place.
    KillAndReplace,
}

/// One phase: a node lost, and brought back, in a delay mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Loss {
    /// Its name in `CLUSTER_PHASES` and in the printed figures.
    name: &'static str,
    mode: Mode,
    target: Target,
    fault: Fault,
    describe: &'static str,
}

/// The phases, in order. A mode's phases are consecutive: the instances are
/// restarted once when the mode changes (the previous stage drained by then).
const LOSSES: [Loss; 6] = [
    Loss {
        name: "stop_app",
        mode: Mode::Ttl,
        target: Target::MostLeaders,
        fault: Fault::StopApp,
        describe: "application stopped (rabbitmqctl stop_app), then started",
    },
    Loss {
        name: "kill",
        mode: Mode::Ttl,
        target: Target::MostLeaders,
        fault: Fault::Kill,
        describe: "Erlang VM killed (SIGKILL), then the node restarted",
    },
    Loss {
        name: "plugin_stop_app",
        mode: Mode::Plugin,
        target: Target::RelayNode,
        fault: Fault::StopApp,
        describe: "plugin mode: the node holding instance a's relay connection (and the plugin timers it \
                   published) stopped (stop_app), then started",
    },
    Loss {
        name: "plugin_replace",
        mode: Mode::Plugin,
        target: Target::RelayNode,
        fault: Fault::KillAndReplace,
        describe: "plugin mode: the node holding instance a's relay connection killed (SIGKILL), its data \
                   (the plugin's timers with it) lost, and an empty node joined in its place",
    },
    Loss {
        name: "native_stop_app",
        mode: Mode::Native,
        target: Target::WaitLeader,
        fault: Fault::StopApp,
        describe: "native mode: the node holding the leader of the wait queue (every held timer) stopped \
                   (stop_app), then started",
    },
    Loss {
        name: "native_kill",
        mode: Mode::Native,
        target: Target::DeferrerNode,
        fault: Fault::Kill,
        describe: "native mode: the node instance a's deferrer is connected to killed (SIGKILL), then \
                   the node restarted",
    },
];

impl Loss {
    fn down(self, node: usize) {
        let n = (node + 1).to_string();
        match self.fault {
            Fault::StopApp => cluster(&["stop-app", &n]),
            Fault::Kill | Fault::KillAndReplace => cluster(&["kill", &n]),
        }
    }
    fn up(self, node: usize) {
        let n = (node + 1).to_string();
        match self.fault {
            Fault::StopApp => cluster(&["start-app", &n]),
            Fault::Kill => cluster(&["restart", &n]),
            Fault::KillAndReplace => cluster(&["replace", &n]),
        }
    }
}

struct World {
    vhost: String,
    db_name: String,
    env: HashMap<String, String>,
    ports: [u16; 2],
    client: reqwest::Client,
}

impl World {
    fn base(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.ports[i])
    }

    /// Instance `i` in delay mode `mode`, given the cluster's addresses
    /// starting from node `i + 1`.
    fn start(&self, i: usize, mode: &str) -> Process {
        let urls: Vec<String> = (0..NODES.len())
            .map(|k| {
                let (port, _) = NODES[(i + k) % NODES.len()];
                format!("amqp://guest:guest@127.0.0.1:{port}/{}", self.vhost)
            })
            .collect();
        Serve::new(BIN)
            .envs(self.env.clone())
            .env("ORDER_TIMEOUT__AMQP__URL", urls.join(","))
            .env("ORDER_TIMEOUT__AMQP__DELAY_MODE", mode)
            .port(self.ports[i])
            .instance(["cluster-a", "cluster-b"][i])
            .start()
            .unwrap_or_else(|e| panic!("{e}"))
    }
}

/// What one phase did and found.
struct Phase {
    loss: Loss,
    node: usize,
    leaders_before: [usize; 3],
    down_for: Duration,
    placed: Vec<Placed>,
    orders: HashMap<String, Value>,
    down_from: chrono::DateTime<chrono::Utc>,
    down_until: chrono::DateTime<chrono::Utc>,
    /// Where the instances' connections were once they had reconnected.
    after: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the three-node cluster of `make cluster` and stops its nodes: run with `make test-cluster`"]
async fn losing_a_node_loses_nothing() {
    let per_phase = env_or("CLUSTER_ORDERS", 600);
    let rate = env_or("CLUSTER_ORDERS_PER_SECOND", 80);
    let started_at = chrono::Utc::now();
    let world = Arc::new(setup().await);
    let broker = Broker::ask().await;
    println!("cluster: RabbitMQ {}", broker.version);
    // CLUSTER_PHASES (say `kill` or `stop_app,kill`) runs some phases only.
    let only = std::env::var("CLUSTER_PHASES").unwrap_or_default();
    let mut losses = Vec::new();
    let mut skipped: Vec<(Mode, Vec<&str>, String)> = Vec::new();
    for loss in LOSSES {
        if !only.is_empty() && !only.split(',').any(|p| p.trim() == loss.name) {
            continue;
        }
        match loss.mode.unavailable(&broker) {
            None => losses.push(loss),
            Some(why) => match skipped.iter_mut().find(|(m, _, _)| *m == loss.mode) {
                Some((_, names, _)) => names.push(loss.name),
                None => skipped.push((loss.mode, vec![loss.name], why)),
            },
        }
    }
    for (mode, names, why) in &skipped {
        // Written to stderr too: a skipped phase must say so.
        let line = format!(
            "SKIPPED ({} mode: {}): {why}",
            mode.as_str(),
            names.join(", ")
        );
        println!("cluster: {line}");
        eprintln!("{line}");
    }
    let instances = Mutex::new(Vec::new());
    let mut nodes = None;
    let mut mode = None;
    let mut phases = Vec::new();
    for loss in losses {
        if mode != Some(loss.mode) {
            mode = Some(loss.mode);
            // A restart in the other mode: the previous stage is drained by now.
            start_instances(&world, &instances, loss.mode).await;
            // Spread the queue leaders over the nodes, as an operator of a
            // cluster does after declaring quorum queues (they start on the
            // declaring node).
            cluster(&["rebalance"]);
            if nodes.is_none() {
                let at = [
                    connected_nodes(&world, 0).await,
                    connected_nodes(&world, 1).await,
                ];
                println!("cluster: instance a on {}, b on {}", at[0], at[1]);
                put_stock(&world.client, &world.base(0)).await;
                nodes = Some(at);
            }
        }
        phases.push(phase(&world, loss, per_phase, rate).await);
    }
    let nodes = nodes.expect("no phase ran: CLUSTER_PHASES names none the cluster can run");

    let report = ledger_and_report(
        &world,
        &broker,
        &phases,
        &skipped,
        &nodes,
        started_at,
        (per_phase, rate),
        only.is_empty(),
    )
    .await;
    drop(instances.lock().await.drain(..).collect::<Vec<Process>>());
    teardown(&world).await;
    report.assert_balances();
}

/// (Re)starts both instances in `mode` and waits until they are ready.
async fn start_instances(world: &World, instances: &Mutex<Vec<Process>>, mode: Mode) {
    let mut all = instances.lock().await;
    all.clear();
    for i in 0..2 {
        let mut p = world.start(i, mode.as_str());
        p.wait_ready(&world.client, Duration::from_secs(90))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        all.push(p);
    }
}

/// A vhost on the cluster and a database of our own, migrated once.
async fn setup() -> World {
    let id = &uuid::Uuid::new_v4().simple().to_string()[..12];
    let (vhost, db_name) = (format!("ot-cluster-{id}"), format!("ot_cluster_{id}"));
    cluster_api()
        .create_vhost(&vhost)
        .await
        .unwrap_or_else(|e| panic!("the cluster of `make cluster` at {MANAGEMENT}: {e}"));
    admin(&format!("CREATE DATABASE {db_name}")).await;
    let env: HashMap<String, String> = [
        (
            "ORDER_TIMEOUT__DATABASE__URL",
            format!("postgres://postgres@127.0.0.1:5432/{db_name}"),
        ),
        (
            "ORDER_TIMEOUT__AMQP__URL",
            format!("amqp://guest:guest@127.0.0.1:5681/{vhost}"),
        ),
        ("ORDER_TIMEOUT__AMQP__QUEUE_TYPE", "quorum".into()),
        ("ORDER_TIMEOUT__AMQP__DELAY_MODE", "ttl".into()),
        (
            "ORDER_TIMEOUT__AMQP__MANAGEMENT_URL",
            "http://127.0.0.1:15681".into(),
        ),
        (
            "ORDER_TIMEOUT__SWEEPER__INTERVAL",
            format!("{SWEEP_INTERVAL_S}s"),
        ),
        // Each order by its own message, or by the sweeper: what the broker
        // delivered is what is measured. (With catch-up on, the default, one
        // due message has the consumer apply every order already due, and a
        // node's loss hides behind the others' deliveries.)
        ("ORDER_TIMEOUT__CONSUMER__CATCH_UP", "false".into()),
        ("ORDER_TIMEOUT__SWEEPER__GRACE", format!("{GRACE_S}s")),
        ("ORDER_TIMEOUT__LOG__LEVEL", "warn".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    migrate(BIN, &env);
    let port = || order_timeout_harness::free_port().unwrap();
    World {
        vhost,
        db_name,
        env,
        ports: [port(), port()],
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap(),
    }
}

/// The node each broker connection of instance `i` is on, from its `/readyz`.
async fn connected_nodes(world: &World, i: usize) -> String {
    let ready = get_json(&world.client, &format!("{}/readyz", world.base(i))).await;
    let nodes = &ready["broker"]["nodes"];
    ["relay", "router", "consumer", "deferrer"]
        .iter()
        .map(|role| format!("{role} {}", nodes[role].as_str().unwrap_or("-")))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Messages a quorum queue has dead-lettered (at-least-once) whose next queue
/// has not confirmed them yet: they wait in this queue, not the next one.
fn dead_lettered(queue: &Value) -> u64 {
    queue["messages_dlx"].as_u64().unwrap_or(0)
}

/// The queues holding messages, with their count, those dead-lettered and
/// not yet taken by the next queue, and their leader.
async fn waiting(vhost: &str, lost: usize) -> String {
    // Asked of a node that is up: the lost one answers nothing.
    let queues = cluster_api_on((lost + 1) % NODES.len())
        .get(&format!(
            "/queues/{vhost}?columns=name,messages,messages_ready,messages_unacknowledged,messages_delayed,messages_dlx,leader,members,online"
        ))
        .await
        .unwrap_or_default();
    let busy: Vec<String> = queues
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter(|q| q["messages"].as_u64().unwrap_or(0) + dead_lettered(q) > 0)
        .map(|q| {
            format!(
                "{} {} ({} unacked, {} held until their time, {} dead-lettered not yet in the next queue, leader {}, {} of {} members online)",
                q["name"].as_str().unwrap_or("?"),
                q["messages"],
                q["messages_unacknowledged"],
                q["messages_delayed"].as_u64().unwrap_or(0),
                dead_lettered(q),
                q["leader"].as_str().unwrap_or("?"),
                q["online"].as_array().map_or(0, Vec::len),
                q["members"].as_array().map_or(0, Vec::len),
            )
        })
        .collect();
    busy.join(", ")
}

/// The node instance a's `role` is connected to.
async fn role_node(world: &World, role: &str) -> usize {
    let ready = get_json(&world.client, &format!("{}/readyz", world.base(0))).await;
    let at = ready["broker"]["nodes"][role].as_str().unwrap_or_default();
    NODES
        .iter()
        .position(|(port, _)| at.ends_with(&format!(":{port}")))
        .unwrap_or_else(|| panic!("instance a's {role} on no node of the cluster: {ready}"))
}

/// The node holding the leader of the native stage's queue.
async fn wait_leader(vhost: &str) -> usize {
    let queue = cluster_api()
        .get(&format!("/queues/{vhost}/order.timeouts.wait"))
        .await
        .unwrap_or_else(|e| panic!("the wait queue: {e}"));
    let leader = queue["leader"].as_str().unwrap_or_default();
    NODES
        .iter()
        .position(|(_, n)| *n == leader)
        .unwrap_or_else(|| panic!("the wait queue's leader on no node of the cluster: {queue}"))
}

/// Quorum-queue leaders of the vhost per node.
async fn leaders(vhost: &str) -> [usize; 3] {
    let queues = cluster_api()
        .get(&format!("/queues/{vhost}?columns=name,type,leader,node"))
        .await
        .unwrap();
    let mut per_node = [0; 3];
    for q in queues.as_array().map(Vec::as_slice).unwrap_or_default() {
        let leader = q["leader"].as_str().or_else(|| q["node"].as_str());
        if let Some(i) = NODES.iter().position(|(_, n)| Some(*n) == leader) {
            per_node[i] += 1;
        }
    }
    per_node
}

/// Orders at `rate` a second, windows of 4 to 12 s, every tenth paid a
/// third of the way into its window; once a third of them are placed and the
/// first deadlines fall due, the phase's node ([`Target`]) is lost for 10 s
/// ([`DOWN`]) plus the time stopping and starting it takes. Then waits until
/// no order is pending.
async fn phase(world: &Arc<World>, loss: Loss, count: u64, rate: u64) -> Phase {
    let placed = Arc::new(Mutex::new(Vec::<Placed>::new()));
    let generator = {
        let (world, placed) = (world.clone(), placed.clone());
        tokio::spawn(async move {
            let mut tasks = Vec::new();
            for n in 0..count {
                let base = world.base((n % 2) as usize);
                let items = vec![(SKUS[(n % 5) as usize].to_string(), 1 + (n % 3) as i64)];
                let window_ms = WINDOW_MIN_MS + (n * 7_919 % WINDOW_SPREAD_MS);
                let (placed, client) = (placed.clone(), world.client.clone());
                tasks.push(tokio::spawn(async move {
                    let Some(id) = checkout(&client, &base, &items, window_ms).await else {
                        return;
                    };
                    let mut paid = false;
                    if n.is_multiple_of(10) {
                        tokio::time::sleep(Duration::from_millis(window_ms / 3)).await;
                        let pay = client
                            .post(format!("{base}/orders/{id}/pay"))
                            .header("content-type", "application/json")
                            .send()
                            .await;
                        paid = pay.is_ok_and(|r| r.status() == 200);
                    }
                    placed.lock().await.push(Placed { id, items, paid });
                }));
                // The scenario: the order rate.
                tokio::time::sleep(Duration::from_micros(1_000_000 / rate)).await;
            }
            for t in tasks {
                let _ = t.await;
            }
        })
    };
    // The scenario: the node is lost once a third of the orders are placed,
    // while the first deadlines fall due (the shortest window after that).
    tokio::time::sleep(Duration::from_millis(
        count * 1_000 / rate / 3 + WINDOW_MIN_MS,
    ))
    .await;
    let leaders_before = leaders(&world.vhost).await;
    let node = match loss.target {
        Target::RelayNode => role_node(world, "relay").await,
        Target::DeferrerNode => role_node(world, "deferrer").await,
        Target::WaitLeader => wait_leader(&world.vhost).await,
        Target::MostLeaders => (0..3).max_by_key(|i| leaders_before[*i]).unwrap_or(0),
    };
    let down_from = chrono::Utc::now();
    let lost_at = Instant::now();
    let before = format!(
        "a: {}; b: {}",
        connected_nodes(world, 0).await,
        connected_nodes(world, 1).await
    );
    loss.down(node);
    let gone = Instant::now();
    println!(
        "cluster: {}: {} of node {} ({} leaders of {:?}); connections before: {before}",
        loss.name, loss.describe, NODES[node].1, leaders_before[node], leaders_before,
    );
    // The scenario: the node is away for DOWN; where the timers wait is
    // looked at LOOKS_S into the loss.
    for at in LOOKS_S {
        tokio::time::sleep_until((gone + Duration::from_secs(at)).into()).await;
        println!(
            "cluster: {}: timers waiting {at} s into the loss: {}",
            loss.name,
            waiting(&world.vhost, node).await
        );
    }
    tokio::time::sleep_until((gone + DOWN).into()).await;
    let after = format!(
        "a: {}; b: {}",
        connected_nodes(world, 0).await,
        connected_nodes(world, 1).await
    );
    println!(
        "cluster: {}: connections while it is down: {after}",
        loss.name
    );
    let after = format!("before the loss {before}; while the node was down {after}");
    loss.up(node);
    let down_for = lost_at.elapsed();
    let down_until = chrono::Utc::now();
    println!(
        "cluster: {}: node {} back after {down_for:?}",
        loss.name, NODES[node].1
    );
    generator.await.unwrap();
    let placed = placed.lock().await.clone();
    // Every order is placed and the node is back: the last deadline is at
    // most the longest window away, and a lost timer's order is the sweeper's
    // one interval after deadline + grace; the rest is margin for a loaded
    // machine. Past that, a pending order is lost.
    let patience = Duration::from_millis(WINDOW_MIN_MS + WINDOW_SPREAD_MS)
        + Duration::from_secs(GRACE_S + SWEEP_INTERVAL_S + 30);
    let orders = settle(&world.client, &world.base(0), &placed, patience).await;
    Phase {
        loss,
        node,
        leaders_before,
        down_for,
        placed,
        orders,
        down_from,
        down_until,
        after,
    }
}

/// The verdict: what must be zero, and what must hold.
struct Verdict {
    bad: Vec<(String, usize)>,
    stock_ok: bool,
    parked: i64,
    outbox: (i64, i64),
}

impl Verdict {
    fn assert_balances(&self) {
        for (what, n) in &self.bad {
            assert_eq!(*n, 0, "{what}");
        }
        assert!(self.stock_ok, "stock not conserved");
        assert_eq!(self.parked, 0, "parked messages");
        assert_eq!(self.outbox, (0, 0), "outbox not drained");
    }
}

/// Prints every figure and writes the cluster's section of `docs/RELIABILITY.md`.
#[allow(clippy::too_many_arguments)]
async fn ledger_and_report(
    world: &World,
    broker: &Broker,
    phases: &[Phase],
    skipped: &[(Mode, Vec<&str>, String)],
    nodes: &[String; 2],
    started_at: chrono::DateTime<chrono::Utc>,
    (per_phase, rate): (u64, u64),
    write: bool,
) -> Verdict {
    let mut bad = Vec::new();
    let mut sold: HashMap<String, i64> = HashMap::new();
    let mut sections = Vec::new();
    for p in phases {
        let e = ends(&p.placed, &p.orders);
        for (sku, q) in &e.sold_expected {
            *sold.entry(sku.clone()).or_default() += q;
        }
        let while_down: Vec<Duration> = e
            .lateness
            .iter()
            .filter(|(due, _)| *due >= p.down_from && *due <= p.down_until)
            .map(|(_, late)| *late)
            .collect();
        let all: Vec<Duration> = e.lateness.iter().map(|(_, l)| *l).collect();
        let swept: Vec<String> = e
            .swept
            .iter()
            .map(|due| format!("{:+.1}", (due.to_utc() - p.down_from).as_seconds_f64()))
            .collect();
        if !swept.is_empty() {
            println!(
                "cluster: {}: the sweeper's orders were due at (s after the node was lost) {}{}",
                p.loss.name,
                swept.iter().take(20).cloned().collect::<Vec<_>>().join(" "),
                if swept.len() > 20 { " …" } else { "" }
            );
        }
        let swept_row =
            format!("cancelled by the sweeper (timer not there by deadline + {GRACE_S} s)");
        let rows = [
            ("orders placed", p.placed.len().to_string()),
            ("cancelled", e.cancelled.to_string()),
            ("paid (and still paid)", e.paid.to_string()),
            ("lost (unpaid, not cancelled)", e.lost.to_string()),
            ("cancelled before the deadline", e.early.to_string()),
            (
                "paid with a 200, then cancelled",
                e.paid_then_cancelled.to_string(),
            ),
            ("stock released twice", e.double_release.to_string()),
            (swept_row.as_str(), e.by_sweeper.to_string()),
            (
                "lateness, deadlines while the node was down",
                percentiles(while_down),
            ),
            ("lateness, every cancel of the phase", percentiles(all)),
        ];
        for (k, v) in &rows {
            println!("cluster: {}: {k:<62} {v}", p.loss.name);
        }
        bad.push((format!("{}: lost", p.loss.name), e.lost));
        bad.push((format!("{}: early", p.loss.name), e.early));
        bad.push((
            format!("{}: paid then cancelled", p.loss.name),
            e.paid_then_cancelled,
        ));
        bad.push((format!("{}: released twice", p.loss.name), e.double_release));
        sections.push(format!(
            "### Node {} lost: {}\n\nLeaders per node before: {:?}; the node was down for {:.1} s. \
             Connections {}.\n\n\
             | figure | value |\n|---|---|\n{}",
            p.node + 1,
            p.loss.describe,
            p.leaders_before,
            p.down_for.as_secs_f64(),
            p.after,
            rows.iter()
                .map(|(k, v)| format!("| {k} | {v} |"))
                .collect::<Vec<_>>()
                .join("\n")
        ));
    }
    let (stock_ok, stock_lines) = stock_check(&world.client, &world.base(0), &sold).await;
    let parked = cluster_api()
        .get_opt(&format!("/queues/{}/order.timeouts.parked", world.vhost))
        .await
        .ok()
        .flatten()
        .and_then(|q| q["messages"].as_i64())
        .unwrap_or(-1);
    let outbox = outbox_rows(&world.db_name).await;
    println!(
        "cluster: stock conserved {stock_ok}, parked {parked}, outbox left/set aside {outbox:?}"
    );
    let rabbit = &broker.version;
    // The phases that ran, mode by mode, and how to read each mode's.
    let mut modes: Vec<Mode> = Vec::new();
    for p in phases {
        if !modes.contains(&p.loss.mode) {
            modes.push(p.loss.mode);
        }
    }
    let scenario = modes
        .iter()
        .map(|m| {
            let losses: Vec<&str> = phases
                .iter()
                .filter(|p| p.loss.mode == *m)
                .map(|p| p.loss.describe)
                .collect();
            format!("in {} mode: {}", m.as_str(), losses.join("; "))
        })
        .collect::<Vec<_>>()
        .join("; then, the instances restarted, ");
    let how_to_read = modes
        .iter()
        .map(|m| m.how_to_read())
        .collect::<Vec<_>>()
        .join(" ");
    let skipped_text: String = skipped
        .iter()
        .map(|(m, names, why)| {
            format!(
                "\n\nSkipped: the {} mode's phases ({}): {why}.",
                m.as_str(),
                names.join(", ")
            )
        })
        .collect();
    let text = format!(
        "## Losing a node of a three-node {title}cluster\n\n\
         Produced by `make test-cluster{make_root}` (`make cluster`, then `cargo test --release --test cluster -- \
         --ignored --nocapture`), {started}, on the 2-core machine: three RabbitMQ {rabbit} nodes of one \
         cluster on this machine, quorum queues (leaders rebalanced), PostgreSQL, two `serve` \
         instances given the three addresses in different orders (connections at the start: a: {a}; \
         b: {b}), sweeper interval {SWEEP_INTERVAL_S} s and grace {GRACE_S} s, the consumers' catch-up \
         off (each order by its own message or by the sweeper, so that what the broker delivered is \
         what is measured). Each phase: {per_phase} orders at about {rate}/s, windows of {w_min} to \
         {w_max} s, every tenth paid a third of the way into its window, and a node lost for {down} s \
         (plus the time stopping and starting it takes) from when the first deadlines fall due, so \
         that most fall due while it is down: {scenario}.{skipped_text}\n\n\
         How to read it: {how_to_read} Nothing is lost to the shop either way: the database \
         decides, and the sweeper covers what the broker dropped.\n\n{phases}\n\n\
         ### After every phase\n\n\
         Stock conserved and matching the paid orders: {stock_ok}. Parked messages: {parked}. \
         Outbox rows left unpublished / set aside: {} / {}.\n\n\
         | sku | available | reserved | sold | total | conserved and matching paid orders |\n\
         |---|---|---|---|---|---|\n{stock}\n",
        outbox.0,
        outbox.1,
        w_min = WINDOW_MIN_MS / 1_000,
        w_max = (WINDOW_MIN_MS + WINDOW_SPREAD_MS) / 1_000,
        down = DOWN.as_secs(),
        title = section_title(broker),
        make_root = if broker.at_least(4, 3) {
            " RABBITMQ_ROOT=/srv/rabbitmq43"
        } else {
            ""
        },
        started = started_at.format("%Y-%m-%d %H:%M UTC"),
        a = nodes[0],
        b = nodes[1],
        phases = sections.join("\n\n"),
        stock = stock_lines.join("\n"),
    );
    if write {
        write_section(&section_name(broker), &text);
    } else {
        println!("cluster: some phases only (CLUSTER_PHASES): docs/RELIABILITY.md left as it was");
    }
    Verdict {
        bad,
        stock_ok,
        parked,
        outbox,
    }
}

/// The section of `docs/RELIABILITY.md` a run writes: one per broker series,
/// `cluster` for the machine's 3.10.
fn section_name(broker: &Broker) -> String {
    match broker.series().as_str() {
        "3.10" => "cluster".to_string(),
        series => format!("cluster-{series}"),
    }
}

/// "RabbitMQ 4.3 " in the section's title, nothing for 3.10.
fn section_title(broker: &Broker) -> String {
    match broker.series().as_str() {
        "3.10" => String::new(),
        series => format!("RabbitMQ {series} "),
    }
}

async fn teardown(world: &World) {
    let _ = cluster_api().delete_vhost(&world.vhost).await;
    admin(&format!(
        "DROP DATABASE IF EXISTS {} WITH (FORCE)",
        world.db_name
    ))
    .await;
}
