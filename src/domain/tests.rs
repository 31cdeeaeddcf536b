//! The domain's unit tests: order keys, the diagram's tables, time.

use super::*;

#[test]
fn a_fault_is_what_parse_refuses() {
    let long = "x".repeat(MAX_ORDER_KEY_BYTES + 1);
    for (raw, fault) in [
        ("", Some("empty")),
        (" 12 ", Some("surrounding_blanks")),
        ("12\n", Some("control_characters")),
        ("1\t2", Some("control_characters")),
        (long.as_str(), Some("too_long")),
        ("12", None),
        ("ORD-7", None),
    ] {
        assert_eq!(OrderKey::fault(raw), fault, "{raw:?}");
        assert_eq!(OrderKey::parse(raw).is_ok(), fault.is_none(), "{raw:?}");
        assert!(fault.is_none_or(|f| OrderKey::FAULTS.contains(&f)));
    }
}

#[test]
fn order_ids_are_positive_integers() {
    assert_eq!("42".parse::<OrderId>().unwrap().get(), 42);
    assert_eq!(
        "9223372036854775807".parse::<OrderId>().unwrap().get(),
        i64::MAX
    );
    for bad in ["0", "-1", "+3", "1.5", "abc", "", "9223372036854775808"] {
        assert!(bad.parse::<OrderId>().is_err(), "{bad}");
    }
    assert_eq!(serde_json::to_string(&OrderId::new(7)).unwrap(), "\"7\"");
}

#[test]
fn order_keys_are_any_short_clean_text() {
    for good in [
        "42",
        "0b1c2d3e-0000-4000-8000-000000000001",
        "202611300001",
        "SN-7 a",
    ] {
        assert_eq!(OrderKey::parse(good).unwrap().as_str(), good);
    }
    let long = "x".repeat(MAX_ORDER_KEY_BYTES + 1);
    for bad in ["", " 42", "42 ", "4\n2", "a\u{0}b", long.as_str()] {
        assert!(OrderKey::parse(bad).is_err(), "{bad:?}");
    }
    assert_eq!(OrderKey::from(OrderId::new(9)).as_str(), "9");
}

#[test]
fn transitions_follow_the_diagram() {
    use OrderStatus::*;
    assert!(PendingPayment.can_become(Paid));
    assert!(PendingPayment.can_become(Cancelled));
    assert!(!Paid.can_become(Cancelled));
    assert!(!Cancelled.can_become(Paid));
    assert!(!Paid.can_become(Completed));
    assert!(Shipped.can_become(Completed));
    assert!(!Paid.can_become(Paid));
    for st in OrderStatus::ALL {
        assert_eq!(st.as_str().parse::<OrderStatus>().unwrap(), st);
    }
}

#[test]
fn every_trigger_walks_exactly_one_edge() {
    let triggers = Action::ALL
        .map(Trigger::Action)
        .into_iter()
        .chain(TimeoutKind::ALL.map(Trigger::Timeout));
    for by in triggers {
        let edges: Vec<&Edge> = DIAGRAM.iter().filter(|e| e.by == by).collect();
        assert_eq!(edges.len(), 1, "{by:?}: {edges:?}");
        assert_eq!(edge(by), *edges[0]);
    }
    assert_eq!(
        Action::Pay.edge(),
        (OrderStatus::PendingPayment, OrderStatus::Paid)
    );
    assert_eq!(TimeoutKind::Receipt.acts_on(), OrderStatus::Shipped);
    assert_eq!(TimeoutKind::names(), "payment, fulfillment or receipt");
    for a in Action::ALL {
        assert_eq!(a.as_str().parse::<Action>(), Ok(a));
    }
}

#[test]
fn every_kind_has_its_row_and_a_coherent_edge() {
    for (i, kind) in TimeoutKind::ALL.into_iter().enumerate() {
        assert_eq!(KINDS[i].kind, kind);
        assert_eq!(kind.as_str().parse::<TimeoutKind>(), Ok(kind));
    }
    for e in DIAGRAM {
        assert!(!e.stamps.is_empty(), "{e:?} stamps nothing");
        assert_eq!(e.flag_only, e.from == e.to, "{e:?}");
        // A flag-only edge stamps a column of its own: set once, it is the flag.
        if e.flag_only {
            assert!(DIAGRAM.iter().all(|o| o == &e || o.stamps != e.stamps));
        }
    }
}

#[test]
fn the_events_are_the_diagrams_once_each() {
    assert_eq!(
        EVENTS,
        [
            "created",
            "paid",
            "shipped",
            "completed",
            "cancelled",
            "fulfillment_overdue",
            "late_payment",
        ]
    );
}

#[test]
fn millis_round_trip_rfc3339() {
    let t = Millis::parse_rfc3339("2026-11-30T05:30:00Z").unwrap();
    assert_eq!(t.to_rfc3339(), "2026-11-30T05:30:00.000Z");
    assert_eq!(
        Millis::parse_rfc3339("2026-11-30T06:30:00+01:00").unwrap(),
        t
    );
    assert_eq!(t.plus(Duration::from_secs(1)).signed_since(t), 1000);
    assert_eq!(t.since(t.plus(Duration::from_secs(1))), Duration::ZERO);
}

#[test]
fn truncate_keeps_at_most_max_characters_multi_byte_or_not() {
    assert_eq!(truncate("abc", 3), "abc");
    assert_eq!(truncate("abcd", 3), "ab…");
    // Four-byte characters: the bound is characters, as VARCHAR counts them.
    let emoji = "😀".repeat(300);
    let cut = truncate(&emoji, 255);
    assert_eq!(cut.chars().count(), 255);
    assert!(cut.ends_with('…'));
    assert_eq!(truncate(&"é".repeat(255), 255), "é".repeat(255));
}
