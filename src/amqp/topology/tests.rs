//! Unit tests of the topology.

use super::*;

/// Topic matching as RabbitMQ does it (`*` one word, `#` zero or more).
fn matches(pattern: &[&str], key: &[&str]) -> bool {
    match (pattern.first(), key.first()) {
        (None, None) => true,
        (Some(&"#"), _) => (0..=key.len()).any(|i| matches(&pattern[1..], &key[i..])),
        (Some(&"*"), Some(_)) => matches(&pattern[1..], &key[1..]),
        (Some(p), Some(k)) if p == k => matches(&pattern[1..], &key[1..]),
        _ => false,
    }
}

fn route<'a>(bindings: &'a [Binding], exchange: &str, key: &str) -> Vec<&'a Destination> {
    let key: Vec<&str> = key.split('.').collect();
    bindings
        .iter()
        .filter(|b| b.source == exchange && matches(&b.key.split('.').collect::<Vec<_>>(), &key))
        .map(|b| &b.destination)
        .collect()
}

/// Follows a message through the levels, returning the TTL seconds it spent.
fn walk(names: &Names, bindings: &[Binding], seconds: u64) -> u64 {
    let key = ttl_routing_key(seconds, TimeoutKind::Payment);
    let mut exchange = names.out(LEVELS);
    let mut waited = 0;
    let mut previous_level = LEVELS;
    loop {
        let dest = route(bindings, &exchange, &key);
        assert_eq!(
            dest.len(),
            1,
            "exactly one route from {exchange} for {key}: {dest:?}"
        );
        match dest[0] {
            Destination::Exchange(x) => {
                assert_eq!(x, &names.due());
                return waited;
            }
            Destination::Queue(q) => {
                let level: u32 = q.rsplit('.').next().unwrap().parse().unwrap();
                assert!(level < previous_level, "levels only go down");
                previous_level = level;
                waited += 1 << level;
                exchange = names.out(level);
            }
        }
    }
}

#[test]
fn every_delay_waits_exactly_its_seconds_once_per_set_bit() {
    let names = Names::new("t");
    let bindings = level_bindings(&names);
    let mut samples: Vec<u64> = (0..2050).collect();
    samples.extend([
        4_294_967,
        (1 << LEVELS) - 1,
        1 << 22,
        (1 << 22) + 1,
        86_400 * 14,
    ]);
    for s in samples {
        assert_eq!(walk(&names, &bindings, s), s, "delay {s}s");
    }
}

#[test]
fn routing_keys_are_octal_digits_then_kind() {
    assert_eq!(
        ttl_routing_key(13, TimeoutKind::Receipt),
        "0.0.0.0.0.0.1.5.receipt"
    );
    assert_eq!(
        ttl_routing_key(u64::MAX, TimeoutKind::Payment),
        "3.7.7.7.7.7.7.7.payment"
    );
}

#[test]
fn bindings_have_no_hash_and_nine_words() {
    let bindings = level_bindings(&Names::new("t"));
    for b in &bindings {
        assert!(!b.key.contains('#'), "{}", b.key);
        assert_eq!(b.key.split('.').count(), DIGITS as usize + 1, "{}", b.key);
    }
    // Spelling constrained digits out costs bindings, declared once: 1,353.
    assert!(bindings.len() < 1_400, "{} bindings", bindings.len());
}

#[test]
fn both_stages_drain_into_due_and_each_timer_enters_one() {
    let names = Names::new("t");
    let ttl: Vec<Binding> = bindings(&names, Mode::Ttl);
    let plugin: Vec<Binding> = bindings(&names, Mode::Plugin);
    for kind in TimeoutKind::ALL {
        let (x, key) = delay_route(&names, Mode::Plugin, kind, 1500);
        assert_eq!((x.as_str(), key.as_str()), ("t.delay", kind.as_str()));
        // After the plugin's delay: one route, to due, then to the kind's queue.
        assert_eq!(
            route(&plugin, &x, &key),
            vec![&Destination::Exchange(names.due())]
        );
        assert_eq!(
            route(&plugin, &names.due(), &key),
            vec![&Destination::Queue(names.work(kind))]
        );
        let (x, key) = delay_route(&names, Mode::Ttl, kind, 13_999);
        assert_eq!(x, names.out(LEVELS));
        assert_eq!(key, ttl_routing_key(13, kind));
    }
    // The shared part is the same in both modes: either stage's leftovers
    // still reach the work queues after a switch.
    assert_eq!(core_bindings(&names), plugin[..core_bindings(&names).len()]);
    assert_eq!(core_bindings(&names), ttl[..core_bindings(&names).len()]);
    assert_eq!(
        exchanges(&names, Mode::Ttl)[..4],
        exchanges(&names, Mode::Plugin)[..4]
    );
}

#[test]
fn the_events_exchange_is_a_bare_topic_in_both_modes() {
    let names = Names::new("t");
    for mode in [Mode::Ttl, Mode::Plugin] {
        let events: Vec<ExchangeSpec> = exchanges(&names, mode)
            .into_iter()
            .filter(|x| x.name == "t.events")
            .collect();
        assert_eq!(events.len(), 1, "{mode:?}");
        assert_eq!(events[0].kind, ExchangeType::Topic);
        // Nothing parks an event nobody listens to.
        assert!(events[0].arguments.is_empty());
        // Consumers bind their own queues: the service binds nothing to it.
        assert!(
            bindings(&names, mode).iter().all(|b| b.source != "t.events"
                && b.destination != Destination::Exchange("t.events".into())),
            "{mode:?}"
        );
    }
}

#[test]
fn due_routes_both_plugin_and_ttl_keys_by_kind() {
    let names = Names::new("t");
    let core = core_bindings(&names);
    for kind in TimeoutKind::ALL {
        for key in [kind.as_str().to_string(), ttl_routing_key(0, kind)] {
            let dest = route(&core, &names.due(), &key);
            assert_eq!(dest, vec![&Destination::Queue(names.work(kind))], "{key}");
        }
    }
}
