//! The broker half of `doctor`: its nodes and the plugin, the delay mode `auto`
//! would choose, every exchange and queue of the topology compared with what
//! the code declares, and the timers waiting in each delay stage.

use lapin::options::{ExchangeDeclareOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ExchangeKind};

use crate::amqp;
use crate::amqp::management::Management;
use crate::amqp::topology::{self, Mode, Names};
use crate::settings::{DelayMode, Settings, redact_url};

use super::Report;

/// The broker answers; whether it holds native delays, or has the plugin;
/// the delay mode that follows, chosen as `serve` chooses it
/// ([`amqp::choose_mode`]).
pub(super) async fn check_broker(
    report: &mut Report,
    settings: &Settings,
    names: &Names,
) -> Option<Mode> {
    // Every address of amqp.url (the nodes of a cluster): one is enough to
    // run, each one down is worth knowing.
    let addresses = settings.amqp.addresses();
    let mut reachable = 0;
    for address in &addresses {
        let shown = redact_url(address);
        match amqp::connect_to_address(&settings.amqp, "doctor", address).await {
            Err(e) if addresses.len() == 1 => report.fail("reachable", format!("{shown}: {e}")),
            Err(e) => report.warn("reachable", format!("{shown}: {e}")),
            Ok(conn) => {
                reachable += 1;
                report.ok("reachable", shown);
                let _ = conn.close(200, "doctor".into()).await;
            }
        }
    }
    if reachable == 0 {
        if addresses.len() > 1 {
            report.fail("reachable", "no address of amqp.url answers");
        }
        return None;
    }
    service_connections(report, settings).await;
    // What `serve` would find: the native stage first, the plugin only where
    // that is missing (`auto` on RabbitMQ 4.3 never asks for the plugin).
    let offers = match amqp::probe(&settings.amqp, names).await {
        Ok(offers) => offers,
        Err(e) => {
            report.fail("delay stages", format!("probe failed: {e}"));
            return None;
        }
    };
    match &offers.native {
        Ok(()) => report.ok(
            "native",
            "quorum queues hold a message until its delivery time (x-opt-delivery-time)",
        ),
        Err(why) => report.note("native", format!("not available: {why}")),
    }
    match offers.plugin {
        Some(true) => report.ok("plugin", "x-delayed-message exchange type available"),
        Some(false) => report.note("plugin", "x-delayed-message not available (rabbitmq-plugins enable rabbitmq_delayed_message_exchange)"),
        None => report.note("plugin", "not probed: the broker's own native delays come first"),
    }
    if settings.amqp.delay_mode == DelayMode::Plugin && offers.plugin == Some(false) {
        report.fail(
            "delay mode",
            "amqp.delay_mode = plugin but the broker has no x-delayed-message type",
        );
        return None;
    }
    if settings.amqp.delay_mode == DelayMode::Native
        && let Err(why) = &offers.native
    {
        report.fail(
            "delay mode",
            format!("amqp.delay_mode = native but the broker cannot hold timers: {why}"),
        );
        return None;
    }
    let (mode, why) = amqp::choose_mode(settings.amqp.delay_mode, &offers);
    report.ok("delay mode", format!("{} — {why}", mode.as_str()));
    Some(mode)
}

pub(super) async fn check_topology(
    report: &mut Report,
    settings: &Settings,
    names: &Names,
    mode: Mode,
) {
    let conn = match amqp::connect(&settings.amqp, "doctor-topology").await {
        Ok(c) => c,
        Err(e) => return report.fail("topology", e),
    };
    let exchanges = topology::exchanges(names, mode);
    let queues = topology::queues(names, mode, settings.amqp.queue_type);
    let mut found = Found::default();
    for x in &exchanges {
        let what = format!("exchange {}", x.name);
        if exists(&conn, &x.name, None).await {
            found.record(what, exchange_verdict(&conn, x).await);
        } else {
            found.missing.push(what);
        }
    }
    for q in &queues {
        let mut count = None;
        if !exists(&conn, &q.name, Some(&mut count)).await {
            found.missing.push(format!("queue {}", q.name));
            continue;
        }
        if let Some(n) = count.filter(|n| *n > 0) {
            found.backlog.push(format!("{}={n}", q.name));
        }
        found.record(format!("queue {}", q.name), queue_verdict(&conn, q).await);
    }
    let _ = conn.close(200, "doctor".into()).await;
    found.report(report, names, exchanges.len(), queues.len());
    let events = format!("exchange {}", names.events());
    let mut wrong = found.missing.iter().chain(&found.differing);
    if !wrong.any(|w| *w == events || w.starts_with(&format!("{events} ("))) {
        report.ok(
            "events",
            format!(
                "{} (topic): every committed transition, routing key order.<event>; consumers bind their own queues",
                names.events()
            ),
        );
    }
}

/// The vhost compared with what this version declares.
#[derive(Default)]
struct Found {
    /// Names that do not exist.
    missing: Vec<String>,
    /// Names declared with another type or other arguments, with the broker's words.
    differing: Vec<String>,
    /// Names declared as an earlier version declared them.
    earlier: Vec<String>,
    /// Queues holding messages, with their counts.
    backlog: Vec<String>,
}

/// How one existing name compares.
enum Verdict {
    /// As this version declares it.
    AsDeclared,
    /// As an earlier version declared it (accepted, with a warning).
    AsEarlier,
    /// Otherwise: the broker's reason.
    Differs(String),
}

impl Found {
    fn record(&mut self, what: String, verdict: Verdict) {
        match verdict {
            Verdict::AsDeclared => {}
            Verdict::AsEarlier => self.earlier.push(what),
            Verdict::Differs(why) => self.differing.push(format!("{what} ({why})")),
        }
    }

    fn report(&self, report: &mut Report, names: &Names, exchanges: usize, queues: usize) {
        if !self.earlier.is_empty() {
            report.warn(
                "topology",
                format!(
                    "{} declared without an alternate or dead-letter exchange into {} (by hand, or by a definitions \
                     file of your own): a message that finds no queue there is dropped instead of parked. The service \
                     works as it is; \
                     add them with the policies in UPGRADING.md: {}",
                    self.earlier.len(),
                    names.parked(),
                    self.earlier.join(", ")
                ),
            );
        }
        if self.missing.is_empty() && self.differing.is_empty() && self.earlier.is_empty() {
            report.ok(
                "topology",
                format!(
                    "{exchanges} exchanges and {queues} queues declared, types and arguments as expected"
                ),
            );
        }
        if !self.missing.is_empty() {
            report.fail(
                "topology",
                format!(
                    "missing {} (start `order-timeout serve` once to declare them): {}",
                    self.missing.len(),
                    self.missing.join(", ")
                ),
            );
        }
        let entry = names.entry();
        if self
            .differing
            .iter()
            .any(|d| d.starts_with(&format!("exchange {entry} ")))
        {
            report.note(
                "entry exchange",
                format!(
                    "{entry} must be a fanout in every mode (the router validates every message before it waits), \
                     not another type (x-delayed-message, say, declared by a publisher that used the plugin \
                     directly): delete {entry} (timers waiting in it \
                     are lost; the sweeper catches their orders at deadline + sweeper.grace) and start the service, \
                     which declares it again"
                ),
            );
        }
        if !self.differing.is_empty() {
            report.fail(
                "topology",
                format!(
                    "{} declared with another type or other arguments (another delay mode or queue type?): {}",
                    self.differing.len(),
                    self.differing.join(", ")
                ),
            );
        }
        if !self.backlog.is_empty() {
            report.note("messages waiting", self.backlog.join(", "));
        }
    }
}

/// How exchange `x` in the vhost compares with what this version declares.
async fn exchange_verdict(conn: &Connection, x: &topology::ExchangeSpec) -> Verdict {
    let earlier = x.earlier.clone().map(|arguments| topology::ExchangeSpec {
        arguments,
        ..x.clone()
    });
    verdict(conn, x.clone(), earlier, |ch, spec| async move {
        topology::declare_exchange(&ch, &spec).await
    })
    .await
}

/// How queue `q` in the vhost compares with what this version declares.
async fn queue_verdict(conn: &Connection, q: &topology::QueueSpec) -> Verdict {
    let earlier = q.earlier.clone().map(|arguments| topology::QueueSpec {
        arguments,
        ..q.clone()
    });
    verdict(conn, q.clone(), earlier, |ch, spec| async move {
        topology::declare_queue(&ch, &spec).await.map(|_| ())
    })
    .await
}

/// Declares `spec` as this version does; when the broker refuses it, tries
/// the arguments an earlier version declared (`earlier`), which the service
/// also accepts.
async fn verdict<S, F, Fut>(conn: &Connection, spec: S, earlier: Option<S>, declare: F) -> Verdict
where
    F: Fn(Channel, S) -> Fut,
    Fut: std::future::Future<Output = Result<(), lapin::Error>>,
{
    let Err(e) = on_fresh_channel(conn, |ch| declare(ch, spec)).await else {
        return Verdict::AsDeclared;
    };
    if let Some(earlier) = earlier
        && on_fresh_channel(conn, |ch| declare(ch, earlier))
            .await
            .is_ok()
    {
        return Verdict::AsEarlier;
    }
    Verdict::Differs(short(&e))
}

/// Which delay stages exist in the vhost and how many timers each holds, and
/// what that means for switching modes or removing the plugin.
pub(super) async fn check_stages(
    report: &mut Report,
    settings: &Settings,
    names: &Names,
    mode: Mode,
) {
    let conn = match amqp::connect(&settings.amqp, "doctor-stages").await {
        Ok(c) => c,
        Err(e) => return report.fail("delay stages", e),
    };
    // TTL stage: exact counts over AMQP.
    let mut ttl = None;
    for l in 0..topology::LEVELS {
        let mut count = None;
        if exists(&conn, &names.level(l), Some(&mut count)).await {
            *ttl.get_or_insert(0u64) += u64::from(count.unwrap_or(0));
        }
    }
    let plugin_exists = exists(&conn, &names.delay(), None).await;
    let native_exists = exists(&conn, &names.wait(), None).await;
    let _ = conn.close(200, "doctor".into()).await;
    let plugin = if plugin_exists {
        Some(plugin_timers(report, settings, names).await)
    } else {
        None
    };
    let count = |n: Option<u64>| n.map_or("an unknown number of".to_string(), |n| n.to_string());
    match ttl {
        Some(n) => report.ok(
            "ttl stage",
            format!(
                "{} level queues, {n} timers waiting{}",
                topology::LEVELS,
                in_use(mode, Mode::Ttl)
            ),
        ),
        None => report.ok("ttl stage", "not declared in this vhost"),
    }
    match plugin {
        Some(n) => report.ok(
            "plugin stage",
            format!(
                "{}, {} timers waiting{}",
                names.delay(),
                count(n),
                in_use(mode, Mode::Plugin)
            ),
        ),
        None => report.ok("plugin stage", "not declared in this vhost"),
    }
    if native_exists {
        let held = native_timers(report, settings, names).await;
        report.ok(
            "native stage",
            format!(
                "{} (quorum queue), {} timers held{}",
                names.wait(),
                count(held),
                in_use(mode, Mode::Native)
            ),
        );
        if mode != Mode::Native && held != Some(0) {
            report.note(
                "native stage",
                "timers from a run in native mode still come back in time and drain into due (the deferrer runs while the queue exists); keep the queue until it is empty",
            );
        }
    } else {
        report.ok("native stage", "not declared in this vhost");
    }
    warn_about_stages(report, settings, names, mode, ttl, plugin);
}

/// Which node each connection of the service's running instances is on, as
/// the management API sees them (connections are named `order-timeout
/// <instance> <role>`).
async fn service_connections(report: &mut Report, settings: &Settings) {
    let Some(api) = &settings.amqp.management else {
        return;
    };
    match Management::new(api.clone()).connections().await {
        Ok(connections) => {
            let ours: Vec<String> = connections
                .into_iter()
                .filter(|(name, _)| {
                    name.starts_with("order-timeout ")
                        && !name
                            .rsplit(' ')
                            .next()
                            .is_some_and(|r| r.starts_with("doctor"))
                })
                .map(|(name, node)| format!("{name} on {node}"))
                .collect();
            if ours.is_empty() {
                report.ok(
                    "connections",
                    "no instance of the service is connected to this vhost",
                );
            }
            for line in ours {
                report.ok("connections", line);
            }
        }
        Err(e) => report.note("connections", format!("not listed: {e}")),
    }
}

/// The timers in the plugin's stage, which keeps them in no queue: only the
/// management API reports how many (`None` when it cannot be asked).
async fn plugin_timers(report: &mut Report, settings: &Settings, names: &Names) -> Option<u64> {
    let Some(api) = &settings.amqp.management else {
        report.note(
            "plugin stage",
            format!(
                "{} exists; its timers cannot be counted with amqp.management_url = off",
                names.delay()
            ),
        );
        return None;
    };
    match Management::new(api.clone()).delayed(&names.delay()).await {
        Ok(n) => n,
        Err(e) => {
            report.note("plugin stage", format!("{} exists; {e}", names.delay()));
            None
        }
    }
}

/// The timers in the native stage's queue, held until their time: the
/// broker reports them as the queue's `messages_delayed`, which only the
/// management API shows (`None` when it cannot be asked).
async fn native_timers(report: &mut Report, settings: &Settings, names: &Names) -> Option<u64> {
    let Some(api) = &settings.amqp.management else {
        report.note(
            "native stage",
            "the timers held cannot be counted with amqp.management_url = off",
        );
        return None;
    };
    match Management::new(api.clone()).stages(names).await {
        Ok(stages) => stages.native,
        Err(e) => {
            report.note("native stage", e.to_string());
            None
        }
    }
}

/// What the timers waiting in each stage mean for the plugin and a mode switch.
fn warn_about_stages(
    report: &mut Report,
    settings: &Settings,
    names: &Names,
    mode: Mode,
    ttl: Option<u64>,
    plugin: Option<Option<u64>>,
) {
    let count = |n: Option<u64>| n.map_or("an unknown number of".to_string(), |n| n.to_string());
    let sweeper = if settings.sweeper.enabled {
        format!(
            "the sweeper catches their orders at deadline + sweeper.grace ({})",
            humantime::format_duration(settings.sweeper.grace)
        )
    } else {
        "and the sweeper is off (sweeper.enabled = false): nothing would catch their orders"
            .to_string()
    };
    if let Some(n) = plugin.filter(|n| n != &Some(0)) {
        report.warn(
            "plugin stage",
            format!(
                "{} timers wait in the plugin's node-local table: disabling the plugin, deleting {} \
                 or losing this node loses them; {sweeper}",
                count(n),
                names.delay()
            ),
        );
    }
    if mode == Mode::Plugin && ttl.is_some_and(|n| n > 0) {
        report.note(
            "ttl stage",
            "timers from a run in ttl mode still drain from the levels into due; keep the levels until they are empty",
        );
    }
    if mode == Mode::Ttl && plugin.is_some_and(|n| n != Some(0)) {
        report.note(
            "plugin stage",
            "timers from a run in plugin mode still drain into due; keep the plugin enabled until they are gone",
        );
    }
}

/// ` (in use)` for the stage of the mode in effect.
fn in_use(mode: Mode, stage: Mode) -> &'static str {
    if mode == stage {
        " (in use)"
    } else {
        " (not in use; drains into due)"
    }
}

/// Runs one declaration on its own channel: a 406 closes that channel only.
async fn on_fresh_channel<F, Fut>(conn: &Connection, f: F) -> Result<(), lapin::Error>
where
    F: FnOnce(Channel) -> Fut,
    Fut: std::future::Future<Output = Result<(), lapin::Error>>,
{
    let channel = conn.create_channel().await?;
    let result = f(channel.clone()).await;
    let _ = channel.close(200, "checked".into()).await;
    result
}

/// The broker's reason without the protocol noise.
fn short(e: &lapin::Error) -> String {
    let text = e.to_string();
    match text.find("PRECONDITION_FAILED - ") {
        Some(i) => crate::domain::truncate(&text[i + "PRECONDITION_FAILED - ".len()..], 160),
        None => crate::domain::truncate(&text, 160),
    }
}

/// Passive declare: checks existence without creating anything. A missing name
/// closes the channel (404), so each check gets a fresh one.
async fn exists(conn: &Connection, name: &str, count: Option<&mut Option<u32>>) -> bool {
    let Ok(channel): Result<Channel, _> = conn.create_channel().await else {
        return false;
    };
    let found = match count {
        None => channel
            .exchange_declare(
                name.into(),
                ExchangeKind::Direct,
                ExchangeDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .is_ok(),
        Some(count) => match channel
            .queue_declare(
                name.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
        {
            Ok(q) => {
                *count = Some(q.message_count());
                true
            }
            Err(_) => false,
        },
    };
    let _ = channel.close(200, "checked".into()).await;
    found
}
