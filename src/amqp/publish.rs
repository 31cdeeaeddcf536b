//! Publishing: every publish of the service is confirmed by the broker
//! before what it came from is acked, and never `mandatory`; parking copies a
//! bad delivery, with its reason, to the parked queue.

use lapin::message::Delivery;
use lapin::options::BasicPublishOptions;
use lapin::{BasicProperties, Channel, Confirmation};

use super::Error;
use super::wire::{self, Park};
use crate::context::Context;
use crate::domain::{Millis, TimeoutKind};

/// The options of every publish the service makes. Never `mandatory`: the
/// delayed-message plugin routes a message to nowhere when it is published (it
/// routes when the delay ends), so it returns every delayed message as
/// unroutable while still scheduling it (seen on 3.10 and 4.0: a return taken
/// for a failure and published again doubles the timer); and every other
/// exchange of ours always has a route. Never
/// `immediate`: RabbitMQ refuses it.
pub fn publish_options() -> BasicPublishOptions {
    BasicPublishOptions {
        mandatory: false,
        immediate: false,
    }
}

/// Publishes and waits for the broker's confirm; a nack, or a message the
/// broker returned, is an error.
pub async fn publish_confirmed(
    channel: &Channel,
    exchange: &str,
    routing_key: &str,
    body: &[u8],
    properties: BasicProperties,
) -> Result<(), Error> {
    let confirm = channel
        .basic_publish(
            exchange.into(),
            routing_key.into(),
            publish_options(),
            body,
            properties,
        )
        .await?
        .await?;
    confirmed(confirm, exchange)
}

/// What a publisher confirm means: the message is safe with the broker only on
/// a plain ack; anything else is an error naming the exchange.
pub fn confirmed(confirm: Confirmation, exchange: &str) -> Result<(), Error> {
    match confirm {
        Confirmation::Ack(None) => Ok(()),
        Confirmation::Ack(Some(_)) => Err(Error::Returned(exchange.to_string())),
        Confirmation::Nack(_) => Err(Error::Nacked(exchange.to_string())),
        // Every publishing channel of ours is in confirm mode: this is a bug.
        Confirmation::NotRequested => Err(Error::Unconfirmed(exchange.to_string())),
    }
}

/// Copies a delivery to the parked queue with the reason (confirmed), then acks
/// it. Parking is how bad input is kept: never requeued in a loop, never dropped.
pub async fn park_delivery(
    ctx: &Context,
    channel: &Channel,
    delivery: &Delivery,
    park: &Park,
    by: &'static str,
    kind: Option<TimeoutKind>,
) -> Result<(), Error> {
    let properties = wire::parked_properties(
        &delivery.properties,
        park,
        by,
        delivery.exchange.as_str(),
        delivery.routing_key.as_str(),
        Millis::now(),
    );
    // An oversized body is kept cut, with its size: whole, a flood of them
    // would push the earlier parked messages out of the queue's byte bound.
    let (body, properties) = match wire::parked_body(&delivery.data) {
        (body, Some(size)) => (body, wire::with_original_size(properties, size)),
        (body, None) => (body, properties),
    };
    let parked = ctx.names.parked();
    publish_confirmed(
        channel,
        &parked,
        delivery.routing_key.as_str(),
        body,
        properties,
    )
    .await?;
    delivery.acker.ack(Default::default()).await?;
    ctx.telemetry.parked(
        park.reason.as_str(),
        &park.detail,
        by,
        delivery.routing_key.as_str(),
        kind,
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plugin returns every `mandatory` publish to a delayed exchange as
    /// unroutable (checked on the real plugin by the integration tests), so
    /// no publish of ours may set it.
    #[test]
    fn no_publish_is_mandatory() {
        let options = publish_options();
        assert!(!options.mandatory);
        assert!(!options.immediate);
    }

    #[test]
    fn only_a_plain_ack_is_safe() {
        assert!(confirmed(Confirmation::Ack(None), "x").is_ok());
        assert!(matches!(
            confirmed(Confirmation::Nack(None), "x"),
            Err(Error::Nacked(x)) if x == "x"
        ));
        assert!(matches!(
            confirmed(Confirmation::NotRequested, "x"),
            Err(Error::Unconfirmed(_))
        ));
    }
}
