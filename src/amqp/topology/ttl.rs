//! The TTL stage: the routing key of a delay in octal digits, the bindings
//! that send a message from level to level, and each level's arguments.

use super::*;

/// The TTL routing key of a delay in whole seconds (clamped to what the levels
/// hold): [`DIGITS`] octal digits, most significant first, then the kind.
pub fn ttl_routing_key(seconds: u64, kind: TimeoutKind) -> String {
    let seconds = seconds.min((1 << LEVELS) - 1);
    let mut key = String::with_capacity(DIGITS as usize * 2 + 12);
    for digit in (0..DIGITS).rev() {
        let value = (seconds >> (digit * DIGIT_BITS)) & 7;
        key.push(char::from(b'0' + value as u8));
        key.push('.');
    }
    key.push_str(kind.as_str());
    key
}

/// The topic patterns matching every TTL routing key whose bits satisfy `want`
/// (`Some(v)`: the bit must be `v`; `None`: any), with any kind. A digit with no
/// constrained bit is `*`; a constrained digit is spelled out, one pattern per
/// allowed value, so a pattern never needs `#`.
fn digit_patterns(want: impl Fn(u32) -> Option<bool>) -> Vec<String> {
    let mut patterns = vec![String::new()];
    for digit in (0..DIGITS).rev() {
        let bits = digit * DIGIT_BITS..(digit + 1) * DIGIT_BITS;
        let words: Vec<String> = if bits.clone().all(|b| want(b).is_none()) {
            vec!["*".to_string()]
        } else {
            // Bits above the levels are never set in a key: no pattern for them.
            let want = |b: u32| if b >= LEVELS { Some(false) } else { want(b) };
            (0..8u64)
                .filter(|v| {
                    bits.clone().all(|b| match want(b) {
                        Some(required) => (v >> (b - digit * DIGIT_BITS) & 1 == 1) == required,
                        None => true,
                    })
                })
                .map(|v| v.to_string())
                .collect()
        };
        patterns = patterns
            .iter()
            .flat_map(|p| words.iter().map(move |w| format!("{p}{w}.")))
            .collect();
    }
    patterns.into_iter().map(|p| p + "*").collect()
}

/// The bindings of the TTL levels: from each `out.L` to the level of the next set
/// bit below L (bit K set, bits K+1 … L-1 clear), and to the due exchange when
/// no bit below L is set.
pub fn level_bindings(names: &Names) -> Vec<Binding> {
    let mut out = Vec::new();
    for l in 0..=LEVELS {
        for k in 0..l {
            let want = |b: u32| match b {
                b if b == k => Some(true),
                b if b > k && b < l => Some(false),
                _ => None,
            };
            out.extend(digit_patterns(want).into_iter().map(|key| Binding {
                source: names.out(l),
                destination: Destination::Queue(names.level(k)),
                key,
            }));
        }
        let want = |b: u32| (b < l).then_some(false);
        out.extend(digit_patterns(want).into_iter().map(|key| Binding {
            source: names.out(l),
            destination: Destination::Exchange(names.due()),
            key,
        }));
    }
    out
}

/// The arguments of TTL level `l`.
pub(super) fn level_args(names: &Names, l: u32, queue_type: QueueType) -> Args {
    let mut args = vec![
        // Queue-wide TTL: every message in a level lives exactly as long,
        // so expiry order is arrival order and the head is always next.
        ("x-message-ttl", Arg::Long((1i64 << l) * 1000)),
        // No dead-letter routing key: the original key, with its bits, travels on.
        ("x-dead-letter-exchange", Arg::Text(names.out(l))),
    ];
    if queue_type == QueueType::Classic && l >= LAZY_FROM {
        args.push(("x-queue-mode", Arg::Text("lazy".into())));
    }
    if queue_type == QueueType::Quorum {
        // Without this a quorum queue dead-letters at most once: a message lost
        // on the way to the next level would be a lost timer. At-least-once
        // keeps it until the next level has confirmed it ...
        args.push(("x-dead-letter-strategy", Arg::Text("at-least-once".into())));
        // ... which RabbitMQ allows only when a full queue refuses new messages
        // instead of dropping its oldest.
        args.push(("x-overflow", Arg::Text("reject-publish".into())));
    }
    args
}
