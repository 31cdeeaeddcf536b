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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, OnceLock};
use std::time::Duration;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider, SpanData, SpanExporter};
use prometheus_client::metrics::counter::Counter;
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

/// Spans lost in exports that failed (the receiver refused the batch, did
/// not answer within [`EXPORT_TIMEOUT`], or could not be reached): the SDK
/// sends each batch once. Process-wide, as the exporter is;
/// `order_timeout_trace_spans_lost_total` reads it.
pub static SPANS_LOST: LazyLock<Counter> = LazyLock::new(Counter::default);

/// The OTLP exporter, counting what it loses ([`SPANS_LOST`]) and saying so
/// once per run of failures: a warning at the first, a line with the count
/// when exports work again.
#[derive(Debug)]
struct Counted<E> {
    inner: E,
    /// Spans lost since the last export that worked; 0 while they work.
    failing: AtomicU64,
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len() as u64;
        let result = self.inner.export(batch).await;
        match &result {
            Ok(()) => {
                let lost = self.failing.swap(0, Ordering::Relaxed);
                if lost > 0 {
                    tracing::info!(lost, "trace export works again");
                }
            }
            Err(e) => {
                SPANS_LOST.inc_by(spans);
                if self.failing.fetch_add(spans, Ordering::Relaxed) == 0 {
                    tracing::warn!(
                        error = %e,
                        spans,
                        "trace export failed: these spans are lost (counted in \
                         order_timeout_trace_spans_lost_total; no further line until exports work again)"
                    );
                }
            }
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}

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
    let exporter = Counted {
        inner: exporter,
        failing: AtomicU64::new(0),
    };
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

/// Most characters a stored context may have: its columns'
/// (`trace_context VARCHAR(1024)`).
pub const STORED_MAX: usize = 1024;

/// The span's context as an outbox row keeps it: the `traceparent`, then a
/// line feed and the `tracestate` when there is one (neither may hold a line
/// feed). `None` for `Span::none()`. At most [`STORED_MAX`] characters: the
/// `traceparent` is always kept and `tracestate` members (up to 32 of 512
/// characters each, by W3C) are dropped whole from the end until it fits, as
/// the W3C allows a vendor to.
pub fn stored(span: &Span) -> Option<String> {
    let fields = fields_of(span);
    let parent = fields.get(TRACEPARENT)?;
    Some(bounded(
        parent,
        fields.get(TRACESTATE).map_or("", String::as_str),
    ))
}

/// `parent`, and `state`'s leading members that fit beside it in
/// [`STORED_MAX`] characters (see [`stored`]).
fn bounded(parent: &str, state: &str) -> String {
    let mut kept = String::new();
    let room = STORED_MAX.saturating_sub(parent.chars().count() + 1);
    let mut used = 0;
    for member in state.split(',').map(str::trim).filter(|m| !m.is_empty()) {
        let cost = member.chars().count() + usize::from(used > 0);
        if used + cost > room {
            break;
        }
        if used > 0 {
            kept.push(',');
        }
        kept.push_str(member);
        used += cost;
    }
    if kept.is_empty() {
        parent.to_string()
    } else {
        format!("{parent}\n{kept}")
    }
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
    fn a_long_tracestate_loses_whole_members_from_the_end_to_fit() {
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        // 30 members of about 45 characters, multi-byte values among them:
        // 1,339 characters, as a publisher sent in the reproduction.
        let members: Vec<String> = (0..30)
            .map(|i| format!("vendor{i:02}=é{}", "x".repeat(35 + i % 3)))
            .collect();
        let state = members.join(",");
        let stored = bounded(parent, &state);
        assert!(stored.chars().count() <= STORED_MAX, "{}", stored.len());
        let (kept_parent, kept) = stored.split_once('\n').unwrap();
        assert_eq!(kept_parent, parent);
        let kept: Vec<&str> = kept.split(',').collect();
        // Whole members, the first ones, as many as fit.
        assert_eq!(
            kept,
            members[..kept.len()]
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
        );
        let next = members[kept.len()].chars().count() + 1;
        assert!(stored.chars().count() + next > STORED_MAX);
        // Short ones are kept whole; an empty state is no line.
        assert_eq!(bounded(parent, "a=1,b=2"), format!("{parent}\na=1,b=2"));
        assert_eq!(bounded(parent, ""), parent);
        // A single member too long for the room: the traceparent alone.
        assert_eq!(bounded(parent, &format!("a={}", "y".repeat(1000))), parent);
    }

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
