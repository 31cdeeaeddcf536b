//! Traces across the broker: OpenTelemetry spans exported over OTLP/HTTP
//! (`tracing.*`), linked from one process to the next by the W3C
//! `traceparent` (and `tracestate`) headers of the AMQP messages, and through
//! the outboxes by the context stored with each row.
//!
//! Off unless `tracing.otlp_endpoint` is set: then no layer is installed,
//! no span of this module is made ([`span`] gives `Span::none()`), no header
//! is read or written and no column filled, so tracing off costs one atomic
//! read per message. On, the spans are:
//!
//! - `checkout` (POST /orders), whose context its timeout's outbox row keeps;
//! - `relay.publish`, the relay's publish of an outbox row, a child of the
//!   context the row keeps, whose context the message carries;
//! - `router.validate`, the router's check of a message from the ingest
//!   queue, a child of the message's `traceparent` (a publisher's own, or the
//!   relay's), whose context the message carries into the delay stage;
//! - `consumer.apply`, the consumer's decision on one timeout (order id,
//!   kind, cause, lateness), a child of the message's `traceparent`, whose
//!   context the domain event of the transition keeps for its own
//!   `relay.publish`.
//!
//! A `traceparent` that is not valid W3C trace context is ignored: the span
//! starts a new trace, and the message goes on as any other.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

use crate::settings::TracingSettings;

/// The W3C trace context header: version, trace id, parent span id, flags.
pub const TRACEPARENT: &str = "traceparent";
/// The W3C vendor-specific trace state, passed on as received.
pub const TRACESTATE: &str = "tracestate";

/// The OTLP/HTTP path spans are posted to, below `tracing.otlp_endpoint`.
pub const TRACES_PATH: &str = "/v1/traces";

/// How long the exporter waits for the receiver's answer to one batch.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// The installed provider: set once, by [`layer`], when tracing is on.
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// Whether traces are exported (a provider was installed).
pub fn enabled() -> bool {
    PROVIDER.get().is_some()
}

/// The layer exporting this crate's spans, when `tracing.otlp_endpoint` is
/// set; `None` when it is empty. Must run inside the tokio runtime: the batch
/// exporter is a task of it.
pub fn layer<S>(
    settings: &TracingSettings,
) -> anyhow::Result<Option<Box<dyn Layer<S> + Send + Sync>>>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
{
    if settings.otlp_endpoint.is_empty() || PROVIDER.get().is_some() {
        return Ok(None);
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(format!("{}{TRACES_PATH}", settings.otlp_endpoint))
        .with_timeout(EXPORT_TIMEOUT)
        .build()?;
    let batches =
        opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor::builder(
            exporter,
            opentelemetry_sdk::runtime::Tokio,
        )
        .build();
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(settings.service_name.clone())
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            crate::VERSION,
        ))
        .build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(batches)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            settings.sample_ratio,
        ))))
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("order-timeout");
    let _ = PROVIDER.set(provider);
    // Only the spans this module makes: log events stay log lines, and the
    // spans of libraries are not exported.
    let only_ours = tracing_subscriber::filter::filter_fn(|meta| {
        meta.is_span() && meta.target() == SPAN_TARGET
    });
    Ok(Some(
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_tracked_inactivity(false)
            .with_threads(false)
            .with_filter(only_ours)
            .boxed(),
    ))
}

/// The target of every span made here, the one the layer exports.
pub const SPAN_TARGET: &str = "order_timeout::traces";

/// Sends the spans still batched, waiting for the receiver at most
/// [`EXPORT_TIMEOUT`] more (a SIGTERM drain's last step).
pub async fn flush() {
    let Some(provider) = PROVIDER.get() else {
        return;
    };
    let provider = provider.clone();
    // The flush blocks its thread until the batch task has exported.
    let flushed = tokio::task::spawn_blocking(move || provider.force_flush());
    let _ = tokio::time::timeout(EXPORT_TIMEOUT * 2, flushed).await;
}

/// Makes a span of this module when traces are on, `Span::none()` when off.
macro_rules! span {
    ($name:literal $(, $($fields:tt)*)?) => {
        if $crate::traces::enabled() {
            tracing::info_span!(target: "order_timeout::traces", $name $(, $($fields)*)?)
        } else {
            tracing::Span::none()
        }
    };
}
pub(crate) use span;

/// A trace context read from W3C text fields; `None` when the traceparent is
/// missing or not valid (the span is then a root).
fn extract(fields: &HashMap<String, String>) -> Option<opentelemetry::Context> {
    let cx = TraceContextPropagator::new().extract(fields);
    cx.span().span_context().is_valid().then_some(cx)
}

/// Makes `parent` the span's parent, if there is one.
fn adopt(span: &Span, parent: Option<opentelemetry::Context>) {
    if let Some(parent) = parent {
        let _ = span.set_parent(parent);
    }
}

/// The span's context as W3C text fields (empty for `Span::none()` or a span
/// not sampled in).
fn fields_of(span: &Span) -> HashMap<String, String> {
    let mut fields = HashMap::new();
    if span.is_none() {
        return fields;
    }
    let cx = span.context();
    if cx.span().span_context().is_valid() {
        TraceContextPropagator::new().inject_context(&cx, &mut fields);
    }
    fields
}

/// The text of a header, when it is a string.
fn header(headers: Option<&FieldTable>, name: &str) -> Option<String> {
    match headers?.inner().get(name)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_string()),
        _ => None,
    }
}

/// Makes the message's `traceparent` (and `tracestate`) the span's parent;
/// nothing when the span is `Span::none()`, the header is absent or malformed.
pub fn follow_headers(span: &Span, headers: Option<&FieldTable>) {
    if span.is_none() {
        return;
    }
    let mut fields = HashMap::new();
    for name in [TRACEPARENT, TRACESTATE] {
        if let Some(value) = header(headers, name) {
            fields.insert(name.to_string(), value);
        }
    }
    adopt(span, extract(&fields));
}

/// Makes an HTTP request's `traceparent` (and `tracestate`) the span's
/// parent; nothing when the span is `Span::none()` or the header is absent
/// or malformed.
pub fn follow_http(span: &Span, headers: &axum::http::HeaderMap) {
    if span.is_none() {
        return;
    }
    let mut fields = HashMap::new();
    for name in [TRACEPARENT, TRACESTATE] {
        if let Some(value) = headers.get(name).and_then(|v| v.to_str().ok()) {
            fields.insert(name.to_string(), value.to_string());
        }
    }
    adopt(span, extract(&fields));
}

/// The properties with the span's context as the `traceparent` (and
/// `tracestate`) headers, replacing any the message had; unchanged when the
/// span is `Span::none()`.
pub fn into_headers(span: &Span, properties: BasicProperties) -> BasicProperties {
    let fields = fields_of(span);
    if fields.is_empty() {
        return properties;
    }
    // Rebuilt without the old trace headers: a table has no removal.
    let mut headers: std::collections::BTreeMap<_, _> = properties
        .headers()
        .as_ref()
        .map(|h| h.inner().clone())
        .unwrap_or_default();
    for name in [TRACEPARENT, TRACESTATE] {
        headers.remove(name);
        if let Some(value) = fields.get(name) {
            headers.insert(name.into(), AMQPValue::LongString(value.as_str().into()));
        }
    }
    let headers = FieldTable::from(headers);
    properties.with_headers(headers)
}

/// The span's context as an outbox row keeps it: the `traceparent`, then a
/// line feed and the `tracestate` when there is one (neither may hold a line
/// feed). `None` for `Span::none()`.
pub fn stored(span: &Span) -> Option<String> {
    let fields = fields_of(span);
    let parent = fields.get(TRACEPARENT)?;
    Some(match fields.get(TRACESTATE).filter(|s| !s.is_empty()) {
        Some(state) => format!("{parent}\n{state}"),
        None => parent.clone(),
    })
}

/// The context of the span the caller runs in, as [`stored`] keeps it;
/// `None` when traces are off.
pub fn current() -> Option<String> {
    if !enabled() {
        return None;
    }
    stored(&Span::current())
}

/// Makes a context an outbox row kept ([`stored`]) the span's parent.
pub fn follow_stored(span: &Span, stored: Option<&str>) {
    let Some(stored) = stored.filter(|_| !span.is_none()) else {
        return;
    };
    let mut fields = HashMap::new();
    let (parent, state) = stored.split_once('\n').unwrap_or((stored, ""));
    fields.insert(TRACEPARENT.to_string(), parent.to_string());
    if !state.is_empty() {
        fields.insert(TRACESTATE.to_string(), state.to_string());
    }
    adopt(span, extract(&fields));
}

/// Records on a `consumer.apply` span what became of its delivery.
pub(crate) fn record_disposition(span: &Span, action: &crate::amqp::disposition::Disposition) {
    use crate::amqp::disposition::Disposition;
    let outcome = match action {
        Disposition::Applied { lateness_ms } => {
            span.record("timeout.lateness_ms", *lateness_ms);
            "applied"
        }
        Disposition::NotApplicable { .. } => "not_applicable",
        Disposition::Hold(_) => "held",
        Disposition::Redelay(_) => "redelayed",
        Disposition::Park(_) => "parked",
    };
    span.record("timeout.outcome", outcome);
}

tokio::task_local! {
    /// The stored context of each order's `consumer.apply` span, by order id
    /// as on the wire, while a batch is applied: the domain events its
    /// transaction writes keep it ([`for_order`]).
    static BY_ORDER: HashMap<String, String>;
}

/// Runs `work` with the contexts of each order's span in reach of
/// [`for_order`]; with none (traces off), runs it as it is.
pub async fn with_orders<F: std::future::Future>(
    contexts: HashMap<String, String>,
    work: F,
) -> F::Output {
    if contexts.is_empty() {
        return work.await;
    }
    BY_ORDER.scope(contexts, work).await
}

/// The context a domain event of this order keeps: its `consumer.apply`
/// span's in a batch ([`with_orders`]), else the caller's span (a checkout,
/// a buyer's or shop's request); `None` when traces are off.
pub fn for_order(order_id: &str) -> Option<String> {
    if !enabled() {
        return None;
    }
    BY_ORDER
        .try_with(|contexts| contexts.get(order_id).cloned())
        .ok()
        .flatten()
        .or_else(current)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_malformed_traceparent_is_no_parent() {
        for bad in [
            "",
            "garbage",
            "00-00000000000000000000000000000000-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            let fields = HashMap::from([(TRACEPARENT.to_string(), bad.to_string())]);
            assert!(extract(&fields).is_none(), "{bad:?} taken as a parent");
        }
    }

    #[test]
    fn a_valid_traceparent_and_its_state_are_read() {
        let fields = HashMap::from([
            (
                TRACEPARENT.to_string(),
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_string(),
            ),
            (TRACESTATE.to_string(), "shop=a1".to_string()),
        ]);
        let cx = extract(&fields).expect("valid");
        let span = cx.span();
        let sc = span.span_context();
        assert_eq!(
            sc.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
        assert_eq!(sc.trace_state().header(), "shop=a1");
    }

    #[test]
    fn off_no_span_no_header_no_column() {
        let span = Span::none();
        let props = BasicProperties::default();
        assert_eq!(into_headers(&span, props.clone()), props);
        assert_eq!(stored(&span), None);
        assert_eq!(for_order("1"), None);
    }
}
