//! The wire contract's unit tests: decoding, headers, what a re-delay and a parked copy carry.

use super::*;

#[test]
fn an_oversized_body_is_parked_cut_with_its_size() {
    let small = vec![b'x'; MAX_BODY_BYTES];
    assert_eq!(parked_body(&small), (&small[..], None));
    let big = vec![b'x'; MAX_BODY_BYTES + 1];
    let (kept, size) = parked_body(&big);
    assert_eq!(
        (kept.len(), size),
        (PARKED_KEEP_BYTES, Some(MAX_BODY_BYTES + 1))
    );
    let p = with_original_size(BasicProperties::default().with_headers(delay_table(5)), 9);
    let headers = p.headers().as_ref();
    assert_eq!(header_int(headers, X_ORIGINAL_SIZE), Some(Ok(9)));
    assert_eq!(header_int(headers, X_DELAY), Some(Ok(5)));
}

fn delay_table(ms: i64) -> FieldTable {
    let mut t = FieldTable::default();
    t.insert(X_DELAY.into(), AMQPValue::LongLongInt(ms));
    t
}

#[test]
fn event_properties_are_json_persistent_with_the_stable_id() {
    let at = Millis::parse_rfc3339("2026-11-30T05:30:00.004Z").unwrap();
    let p = event_properties("b1c2", at, "cancelled", "SN-1");
    assert_eq!(
        p.content_type().as_ref().map(|c| c.as_str()),
        Some("application/json")
    );
    assert_eq!(*p.delivery_mode(), Some(2));
    assert_eq!(p.message_id().as_ref().map(|m| m.as_str()), Some("b1c2"));
    assert_eq!(*p.timestamp(), Some(1_796_016_600));
    let headers = p.headers().as_ref();
    assert_eq!(
        header_text(headers, EVENT_HEADER).as_deref(),
        Some("cancelled")
    );
    assert_eq!(
        header_text(headers, ORDER_ID_HEADER).as_deref(),
        Some("SN-1")
    );
    assert!(
        header_int(headers, X_DELAY).is_none(),
        "no delay: it is no timer"
    );
}

fn table(value: AMQPValue) -> FieldTable {
    let mut t = FieldTable::default();
    t.insert(X_DELAY.into(), value);
    t
}

#[test]
fn decodes_the_contract_body() {
    let m = decode(
        "payment",
        Some("application/json"),
        br#"{"order_id":"42","kind":"payment","due_at":"2026-11-30T05:30:00Z","extra":1}"#,
    )
    .unwrap();
    assert_eq!(m.order_id.as_str(), "42");
    assert_eq!(m.kind, TimeoutKind::Payment);
    assert_eq!(
        m.due_at,
        Some(Millis::parse_rfc3339("2026-11-30T05:30:00Z").unwrap())
    );
    let m = decode("receipt", None, br#"{"order_id":"7"}"#).unwrap();
    assert_eq!(m.kind, TimeoutKind::Receipt);
    assert_eq!(
        decode("payment", None, &encode(&m)).unwrap_err().reason,
        ParkReason::KindMismatch
    );
}

#[test]
fn parks_what_breaks_the_contract() {
    let cases: [(&str, Option<&str>, &[u8], ParkReason); 8] = [
        ("payment", None, b"not json", ParkReason::InvalidBody),
        (
            "payment",
            None,
            br#"{"order_id":42}"#,
            ParkReason::InvalidBody,
        ),
        (
            "payment",
            None,
            br#"{"order_id":""}"#,
            ParkReason::InvalidBody,
        ),
        (
            "refund",
            None,
            br#"{"order_id":"4"}"#,
            ParkReason::UnknownKind,
        ),
        (
            "payment",
            None,
            br#"{"order_id":"4","kind":"refund"}"#,
            ParkReason::UnknownKind,
        ),
        (
            "payment",
            Some("text/plain"),
            br#"{"order_id":"4"}"#,
            ParkReason::WrongContentType,
        ),
        (
            "payment",
            None,
            br#"{"order_id":"4","due_at":"tomorrow"}"#,
            ParkReason::InvalidBody,
        ),
        (
            "payment",
            None,
            &[0xff, 0xfe, 0x00],
            ParkReason::InvalidBody,
        ),
    ];
    for (rk, ct, body, reason) in cases {
        assert_eq!(
            decode(rk, ct, body).unwrap_err().reason,
            reason,
            "{}",
            String::from_utf8_lossy(body)
        );
    }
    let big = vec![b' '; MAX_BODY_BYTES + 1];
    assert_eq!(
        decode("payment", None, &big).unwrap_err().reason,
        ParkReason::BodyTooLarge
    );
}

#[test]
fn validates_x_delay() {
    assert_eq!(
        publish_delay(Some(&table(AMQPValue::LongInt(1500)))),
        Ok(1500)
    );
    assert_eq!(
        publish_delay(Some(&table(AMQPValue::LongLongInt(4_294_967_295)))),
        Ok(4_294_967_295)
    );
    assert_eq!(
        publish_delay(None).unwrap_err().reason,
        ParkReason::MissingDelay
    );
    for bad in [
        AMQPValue::LongInt(0),
        AMQPValue::LongInt(-5),
        AMQPValue::LongLongInt(4_294_967_296),
        AMQPValue::Double(1.5),
        AMQPValue::LongString("1000".into()),
    ] {
        assert_eq!(
            publish_delay(Some(&table(bad.clone()))).unwrap_err().reason,
            ParkReason::InvalidDelay,
            "{bad:?}"
        );
    }
}

#[test]
fn says_what_x_delay_holds_when_it_is_no_integer() {
    use lapin::types::DecimalValue;
    let detail = |v: AMQPValue| publish_delay(Some(&table(v))).unwrap_err().detail;
    let decimal = |scale, value| AMQPValue::DecimalValue(DecimalValue { scale, value });
    for (value, says) in [
        (AMQPValue::LongString("2000".into()), "the string '2000'"),
        (AMQPValue::Float(2000.0), "the float 2000"),
        (AMQPValue::Double(2000.5), "the float 2000.5"),
        (decimal(1, 20000), "the decimal 2000.0"),
        (decimal(3, 5), "the decimal 0.005"),
        (decimal(0, 2000), "the decimal 2000"),
        (AMQPValue::Boolean(false), "the boolean false"),
        (AMQPValue::Void, "no value (void)"),
        (
            AMQPValue::FieldTable(FieldTable::default()),
            "a value of type FieldTable",
        ),
    ] {
        assert_eq!(
            detail(value),
            format!("x-delay must be an integer, got {says}")
        );
    }
    assert_eq!(
        detail(AMQPValue::Timestamp(u64::MAX)),
        "x-delay is 18446744073709551615, beyond a signed 64-bit integer"
    );
}

#[test]
fn reads_every_integer_width() {
    for value in [
        AMQPValue::ShortShortInt(100),
        AMQPValue::ShortShortUInt(100),
        AMQPValue::ShortInt(100),
        AMQPValue::ShortUInt(100),
        AMQPValue::LongInt(100),
        AMQPValue::LongUInt(100),
        AMQPValue::LongLongInt(100),
        AMQPValue::Timestamp(100),
    ] {
        assert_eq!(
            publish_delay(Some(&table(value.clone()))),
            Ok(100),
            "{value:?}"
        );
    }
    assert_eq!(
        publish_delay(Some(&table(AMQPValue::LongUInt(u32::MAX)))),
        Ok(MAX_DELAY_MS)
    );
}

/// A publisher's forgeries of headers the service itself stamps.
const FORGED: [&str; 5] = [
    X_PARKED_REASON,
    X_PARKED_BY,
    "x-parked-note",
    X_ORIGINAL_SIZE,
    X_REDELAYS,
];

#[test]
fn forwarded_copies_keep_the_publishers_properties_but_never_expire_or_impersonate() {
    let mut headers = FieldTable::default();
    headers.insert(X_DELAY.into(), AMQPValue::Timestamp(1500));
    headers.insert("x-shop".into(), AMQPValue::LongInt(7));
    // The native stage's own annotations are the service's to stamp.
    headers.insert("x-opt-delivery-time".into(), AMQPValue::LongLongInt(1));
    headers.insert(
        "x-opt-order-timeout-deferrals".into(),
        AMQPValue::LongLongInt(1),
    );
    for forged in FORGED {
        headers.insert(forged.into(), AMQPValue::LongString("forged".into()));
    }
    let original = BasicProperties::default()
        .with_message_id("m1".into())
        .with_content_type("application/json".into())
        .with_correlation_id("c1".into())
        .with_delivery_mode(1)
        .with_expiration("100".into())
        .with_user_id("someone-else".into())
        .with_headers(headers);
    let sent = with_delay(&original, 1500);
    let h = sent.headers().as_ref();
    assert_eq!(header_int(h, X_DELAY), Some(Ok(1500)));
    assert!(matches!(
        h.unwrap()
            .inner()
            .iter()
            .find(|(k, _)| k.as_str() == X_DELAY),
        Some((_, AMQPValue::LongLongInt(1500)))
    ));
    assert_eq!(header_int(h, "x-shop"), Some(Ok(7)));
    assert_eq!(header_int(h, "x-opt-delivery-time"), None);
    assert_eq!(header_int(h, "x-opt-order-timeout-deferrals"), None);
    for forged in FORGED {
        assert_eq!(header_text(h, forged), None, "{forged} forwarded");
    }
    assert_eq!(sent.message_id(), original.message_id());
    assert_eq!(sent.content_type(), original.content_type());
    assert_eq!(sent.correlation_id(), original.correlation_id());
    // Persistent, no per-message TTL, no foreign user id.
    assert_eq!(sent.delivery_mode(), &Some(2));
    assert_eq!(sent.expiration(), &None);
    assert_eq!(sent.user_id(), &None);
    let park = Park::new(ParkReason::InvalidBody, "bad");
    let parked = parked_properties(&original, &park, "router", "x", "payment", Millis(0));
    assert_eq!((parked.expiration(), parked.user_id()), (&None, &None));
    let h = parked.headers().as_ref();
    assert_eq!(
        header_text(h, X_ORIGINAL_EXPIRATION).as_deref(),
        Some("100")
    );
    // Parking's own headers are the service's, none of the publisher's.
    assert_eq!(
        header_text(h, X_PARKED_REASON).as_deref(),
        Some("invalid_body")
    );
    assert_eq!(header_text(h, X_PARKED_BY).as_deref(), Some("router"));
    assert_eq!(header_text(h, "x-parked-note"), None);
    assert_eq!(header_text(h, X_ORIGINAL_SIZE), None);
    assert_eq!(
        header_text(h, X_ORIGINAL_USER_ID).as_deref(),
        Some("someone-else")
    );
}

#[test]
fn parked_copies_keep_headers_and_say_why() {
    let props = properties("m1", Millis(0), 1000, &[]);
    let park = Park::new(ParkReason::InvalidBody, "bad");
    let parked = parked_properties(
        &props,
        &park,
        "router",
        "order.timeouts",
        "payment",
        Millis(0),
    );
    let h = parked.headers().as_ref();
    assert_eq!(
        header_text(h, X_PARKED_REASON).as_deref(),
        Some("invalid_body")
    );
    assert_eq!(header_int(h, X_DELAY), Some(Ok(1000)));
    assert_eq!(parked.message_id().as_ref().map(|s| s.as_str()), Some("m1"));
}
