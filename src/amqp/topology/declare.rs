//! Declaring the topology on the broker (accepting names an earlier version
//! declared), deleting it, and probing for the plugin.

use super::*;

async fn bind(channel: &Channel, b: &Binding, nowait: bool) -> Result<(), lapin::Error> {
    match &b.destination {
        Destination::Queue(q) => {
            channel
                .queue_bind(
                    q.as_str().into(),
                    b.source.as_str().into(),
                    b.key.as_str().into(),
                    QueueBindOptions { nowait },
                    FieldTable::default(),
                )
                .await
        }
        Destination::Exchange(x) => {
            channel
                .exchange_bind(
                    x.as_str().into(),
                    b.source.as_str().into(),
                    b.key.as_str().into(),
                    ExchangeBindOptions { nowait },
                    FieldTable::default(),
                )
                .await
        }
    }
}

/// Declares the whole topology of `mode`: the shared part and the delay stage
/// of `mode`. Idempotent; run on every (re)connect so a broker that lost its
/// definitions gets them back. The other mode's stage is left as it is: timers
/// still waiting there drain into `due` (see the module note).
///
/// A name an earlier version declared with fewer arguments (no alternate
/// exchange, no dead-letter exchange into `parked`) is accepted as it is: the
/// broker refuses to change an existing name's arguments, and deleting it
/// would drop what is flowing through it. Those names are returned, for a
/// warning; `doctor` and the README say how to bring them up to date. Fails
/// with 406 PRECONDITION_FAILED when a name exists with arguments no version
/// gave it (an entry exchange left as `x-delayed-message` by an earlier
/// version in plugin mode): `doctor` explains that case. [`exchanges`],
/// [`queues`] and [`bindings`] say what; `definitions` exports the same.
pub async fn declare(
    conn: &Connection,
    names: &Names,
    mode: Mode,
    queue_type: QueueType,
) -> Result<Vec<String>, lapin::Error> {
    let mut channel = conn.create_channel().await?;
    let mut earlier = Vec::new();
    for x in exchanges(names, mode) {
        if let Err(e) = declare_exchange(&channel, &x).await {
            let Some(args) = x.earlier.as_ref().filter(|_| is_precondition_failed(&e)) else {
                return Err(e);
            };
            // The 406 closed the channel.
            channel = conn.create_channel().await?;
            let spec = ExchangeSpec {
                arguments: args.clone(),
                ..x.clone()
            };
            declare_exchange(&channel, &spec).await?;
            earlier.push(x.name.clone());
        }
    }
    for q in queues(names, mode, queue_type) {
        if let Err(e) = declare_queue(&channel, &q).await {
            let Some(args) = q.earlier.as_ref().filter(|_| is_precondition_failed(&e)) else {
                return Err(e);
            };
            channel = conn.create_channel().await?;
            let spec = QueueSpec {
                arguments: args.clone(),
                ..q.clone()
            };
            declare_queue(&channel, &spec).await?;
            earlier.push(q.name.clone());
        }
    }
    for b in core_bindings(names) {
        bind(&channel, &b, false).await?;
    }
    match mode {
        Mode::Plugin | Mode::Native => {
            for b in stage_bindings(names, mode) {
                bind(&channel, &b, false).await?;
            }
        }
        Mode::Ttl => {
            // About 1,350 bindings: sent without waiting for each reply (nowait), so
            // declaring costs one round trip, not 1,350. A failed binding closes the
            // channel, which the synchronous declare below then reports.
            for b in level_bindings(names) {
                bind(&channel, &b, true).await?;
            }
            channel
                .exchange_declare(
                    names.due().as_str().into(),
                    ExchangeKind::Topic,
                    ExchangeDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await?;
        }
    }
    let _ = channel.close(200, "declared".into()).await;
    Ok(earlier)
}

/// The broker refused a declaration because the name exists with other
/// arguments or another type (406).
pub fn is_precondition_failed(e: &lapin::Error) -> bool {
    e.to_string().contains("PRECONDITION_FAILED")
}

/// Declares one exchange as [`declare`] does. On an existing exchange this
/// creates nothing, and fails (406, closing the channel) when its type or
/// arguments differ: `doctor` uses that to check the topology matches.
pub async fn declare_exchange(channel: &Channel, x: &ExchangeSpec) -> Result<(), lapin::Error> {
    // Durable: the topology must outlive a broker restart; never auto-deleted.
    let options = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    channel
        .exchange_declare(
            x.name.as_str().into(),
            x.kind.to_lapin(),
            options,
            args(&x.arguments),
        )
        .await
}

/// Declares one queue as [`declare`] does; see [`declare_exchange`].
pub async fn declare_queue(channel: &Channel, q: &QueueSpec) -> Result<lapin::Queue, lapin::Error> {
    let options = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    channel
        .queue_declare(q.name.as_str().into(), options, args(&q.arguments))
        .await
}

/// Deletes everything [`declare`] may have created under these names, in
/// any mode, for tests and for operators who mean it: timers waiting in
/// either stage are lost.
pub async fn delete_all(channel: &Channel, names: &Names) -> Result<(), lapin::Error> {
    // The TTL queues are a superset of the plugin mode's; RabbitMQ answers a
    // delete of a name that does not exist with delete-ok.
    let mut queues = queues(names, Mode::Ttl, QueueType::Classic);
    queues.push(wait_queue(names));
    for q in queues {
        channel
            .queue_delete(q.name.as_str().into(), Default::default())
            .await?;
    }
    let mut all = exchanges(names, Mode::Ttl);
    all.extend(stage_exchanges(names, Mode::Plugin));
    all.extend(stage_exchanges(names, Mode::Native));
    for x in all {
        channel
            .exchange_delete(x.name.as_str().into(), ExchangeDeleteOptions::default())
            .await?;
    }
    Ok(())
}

/// Does this broker offer the `x-delayed-message` exchange type? Asked on a
/// throwaway connection, because declaring an unknown exchange type closes the
/// whole connection (503 COMMAND_INVALID), not just the channel.
pub async fn probe_plugin(conn: &Connection, names: &Names) -> Result<bool, lapin::Error> {
    let channel = conn.create_channel().await?;
    let probe = format!("{}.probe.{}", names.entry(), uuid::Uuid::new_v4().simple());
    let declared = channel
        .exchange_declare(
            probe.as_str().into(),
            ExchangeKind::Custom("x-delayed-message".into()),
            // Auto-delete and non-durable: nothing is left behind if we die here.
            ExchangeDeclareOptions {
                auto_delete: true,
                ..Default::default()
            },
            args(&[("x-delayed-type", Arg::Text("direct".into()))]),
        )
        .await;
    match declared {
        Ok(()) => {
            channel
                .exchange_delete(probe.as_str().into(), ExchangeDeleteOptions::default())
                .await?;
            Ok(true)
        }
        Err(e) if is_unknown_exchange_type(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

fn is_unknown_exchange_type(e: &lapin::Error) -> bool {
    let text = e.to_string();
    // RabbitMQ answers "COMMAND_INVALID - unknown exchange type 'x-delayed-message'".
    text.contains("unknown exchange type")
        || text.contains("COMMAND_INVALID")
        || text.contains("503")
}
