//! `doctor`'s dry run of the first start: per kind, how many orders wait and
//! how many are already past their deadline, and what `serve` would close as
//! soon as it runs (a shop leaving a cron job often has a long tail of
//! overdue rows the cron never reached): who closes them, how many, the
//! oldest deadline and the first ids in the order they would be taken, with
//! a warning when that is more than one page of the sweeper.
//!
//! It reads through the same [`OrderStore`] queries the sweeper and the
//! catch-up run (`backlog` and `overdue`), by the database's clock, so that
//! what it counts is what they would take; it only reads.

use std::time::Duration;

use sea_orm::DatabaseConnection;

use super::{Report, span};
use crate::amqp::catch_up;
use crate::db::{self, clock};
use crate::domain::{Millis, TimeoutKind};
use crate::orders::{OrderStore, Owned};
use crate::settings::Settings;

/// How many ids of each kind the dry run shows.
const SAMPLE: u64 = 10;

/// What closes the orders already overdue when `serve` starts, by the settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Closer {
    /// The consumers' catch-up (`consumer.catch_up`): everything past its
    /// deadline, at once as it starts (with `consumer.wake_at_deadline`),
    /// else at the kind's first due timeout (the sweeper, if it runs, may
    /// take those past its grace before).
    CatchUp { at_start: bool },
    /// The sweeper alone: what is overdue by more than `sweeper.grace`, in
    /// its first round, `sweeper.interval` after the start.
    Sweeper,
    /// Neither runs: only a timeout published for an order closes it.
    Nothing,
}

impl Closer {
    fn of(settings: &Settings) -> Self {
        let consumer = &settings.consumer;
        if consumer.catch_up {
            // Without the deadline wake, the first due timeout of the kind
            // starts it: soon, once a checkout publishes them.
            Self::CatchUp {
                at_start: consumer.wake_at_deadline,
            }
        } else if settings.sweeper.enabled {
            Self::Sweeper
        } else {
            Self::Nothing
        }
    }

    /// How long past its deadline an order must be for this closer to take it.
    fn threshold(self, settings: &Settings) -> Duration {
        match self {
            Self::Sweeper => settings.sweeper.grace,
            Self::CatchUp { .. } | Self::Nothing => Duration::ZERO,
        }
    }
}

/// One kind's orders as the dry run read them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Due {
    /// Waiting for the timeout.
    pending: u64,
    /// Of those, past the deadline now.
    overdue: u64,
    /// Of those, past it by more than `sweeper.grace`.
    past_grace: u64,
    /// What the closer takes at the first start.
    closes: u64,
    /// The oldest deadline, when any order is overdue.
    oldest: Option<Millis>,
    /// The first ids the closer would take, in its order.
    sample: Vec<String>,
}

/// How a line is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    Ok,
    Note,
    Warn,
}

/// The dry run on the service's own orders, once their tables are migrated
/// (before that there is no order to close; `migrations` says so).
pub(super) async fn check_owned(
    report: &mut Report,
    settings: &Settings,
    conn: &DatabaseConnection,
) {
    if matches!(db::migration_status(conn, true).await, Ok((_, pending)) if pending.is_empty()) {
        check(report, settings, conn, &Owned).await;
    }
}

/// Reads each kind `store` acts on and prints the dry run. Read-only.
pub(super) async fn check(
    report: &mut Report,
    settings: &Settings,
    conn: &DatabaseConnection,
    store: &dyn OrderStore,
) {
    // The database's clock decides what is overdue, as in the service.
    let now = match clock::now(conn).await {
        Ok(now) => now,
        Err(e) => return report.fail("first start", format!("cannot read the clock: {e}")),
    };
    let closer = Closer::of(settings);
    for kind in TimeoutKind::ALL.into_iter().filter(|k| store.maps(*k)) {
        match read(settings, conn, store, kind, now, closer).await {
            Ok(due) => {
                report.ok(
                    "orders",
                    format!(
                        "{kind}: {} waiting, {} of them past the deadline now",
                        due.pending, due.overdue
                    ),
                );
                for (level, line) in describe(settings, closer, kind, now, &due) {
                    match level {
                        Level::Ok => report.ok("first start", line),
                        Level::Note => report.note("first start", line),
                        Level::Warn => report.warn("first start", line),
                    }
                }
            }
            Err(e) => report.fail("orders", format!("{kind}: {e}")),
        }
    }
}

/// One kind's counts and sample, through the sweeper's own queries.
async fn read(
    settings: &Settings,
    conn: &DatabaseConnection,
    store: &dyn OrderStore,
    kind: TimeoutKind,
    now: Millis,
    closer: Closer,
) -> Result<Due, sea_orm::DbErr> {
    let Some(all) = store.backlog(conn, kind, now, Duration::ZERO).await? else {
        return Ok(Due::default());
    };
    let grace = settings.sweeper.grace;
    let past_grace = match store.backlog(conn, kind, now, grace).await? {
        Some(b) => b.overdue,
        None => 0,
    };
    let threshold = closer.threshold(settings);
    let closes = if threshold.is_zero() {
        all.overdue
    } else {
        past_grace
    };
    let page = store
        .overdue(conn, kind, now, threshold, None, SAMPLE)
        .await?;
    Ok(Due {
        pending: all.pending,
        overdue: all.overdue,
        past_grace,
        closes,
        oldest: (all.overdue > 0).then(|| now.minus(all.oldest_overdue)),
        sample: page
            .orders
            .into_iter()
            .map(|(key, _)| key.as_str().to_string())
            .collect(),
    })
}

/// The lines of one kind's dry run.
fn describe(
    settings: &Settings,
    closer: Closer,
    kind: TimeoutKind,
    now: Millis,
    due: &Due,
) -> Vec<(Level, String)> {
    let sweeper = &settings.sweeper;
    let grace = humantime::format_duration(sweeper.grace);
    let n = due.closes;
    if closer == Closer::Nothing {
        if due.overdue == 0 {
            return vec![(
                Level::Ok,
                format!("{kind}: closes none (none past the deadline)"),
            )];
        }
        return vec![(
            Level::Warn,
            format!(
                "{kind}: {} past the deadline, and nothing closes them but a timeout published for each: consumer.catch_up and sweeper.enabled are off",
                due.overdue
            ),
        )];
    }
    if n == 0 {
        let which = match closer {
            Closer::Sweeper => {
                format!("none past the deadline by more than sweeper.grace ({grace})")
            }
            _ => "none past the deadline".to_string(),
        };
        return vec![(Level::Ok, format!("{kind}: closes none ({which})"))];
    }
    let who = match closer {
        Closer::CatchUp { at_start: true } => format!(
            "the consumers' catch-up, as it starts: every one past the deadline; {} of them past it by more than sweeper.grace ({grace})",
            due.past_grace
        ),
        Closer::CatchUp { at_start: false } => format!(
            "the consumers' catch-up, at the kind's first due timeout: every one past the deadline; {} of them past it by more than sweeper.grace ({grace}){}",
            due.past_grace,
            if sweeper.enabled {
                ", which the sweeper takes if no timeout comes first"
            } else {
                ""
            }
        ),
        _ => format!(
            "the sweeper, {} after the start: past the deadline by more than sweeper.grace ({grace}); {} past it in all",
            humantime::format_duration(sweeper.interval),
            due.overdue
        ),
    };
    let oldest = match due.oldest {
        Some(at) => format!(
            "; oldest deadline {} ({} ago)",
            at.to_rfc3339(),
            span(now.signed_since(at))
        ),
        None => String::new(),
    };
    let more = if n > due.sample.len() as u64 {
        ", …"
    } else {
        ""
    };
    let mut lines = vec![
        (
            Level::Note,
            format!("{kind}: closes {n} at once ({who}){oldest}"),
        ),
        (
            Level::Note,
            format!(
                "{kind}: the first ids, in the order they are taken: {}{more}",
                due.sample.join(", ")
            ),
        ),
    ];
    // More than one page of the sweeper: what a cron closed a few at a time
    // now goes in one go, with its events and stock moves.
    if n > sweeper.batch_size {
        let how = match closer {
            Closer::CatchUp { .. } => {
                let round = catch_up::round_size(settings.consumer.batch_size);
                format!(
                    "within {} catch-up round(s) of up to {round}, {} ms apart",
                    n.div_ceil(round),
                    catch_up::EVERY.as_millis()
                )
            }
            _ => format!(
                "in its first round, {} transaction(s) of sweeper.batch_size",
                n.div_ceil(sweeper.batch_size)
            ),
        };
        lines.push((
            Level::Warn,
            format!(
                "{kind}: {n} to close, more than sweeper.batch_size ({}): the first start closes all of them {how}; to stage it, see docs/migrating-from-cron.md",
                sweeper.batch_size
            ),
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::SettingsSource;

    fn settings(env: &[(&str, &str)]) -> Settings {
        let source = SettingsSource {
            file: None,
            env: Some(
                env.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
        };
        Settings::load(&source).unwrap()
    }

    fn due(closes: u64) -> Due {
        Due {
            pending: closes + 5,
            overdue: closes,
            past_grace: closes / 2,
            closes,
            oldest: Some(Millis(1_000)),
            sample: (1..=closes.min(SAMPLE)).map(|n| n.to_string()).collect(),
        }
    }

    #[test]
    fn by_default_the_catch_up_closes_every_overdue_order_as_it_starts() {
        let s = settings(&[]);
        let closer = Closer::of(&s);
        assert_eq!(closer, Closer::CatchUp { at_start: true });
        assert_eq!(closer.threshold(&s), Duration::ZERO);
        let lines = describe(&s, closer, TimeoutKind::Payment, Millis(61_000), &due(3));
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(
            lines[0]
                .1
                .contains("closes 3 at once (the consumers' catch-up, as it starts")
        );
        assert!(
            lines[0]
                .1
                .contains("oldest deadline 1970-01-01T00:00:01.000Z (1m ago)")
        );
        assert_eq!(
            lines[1].1,
            "payment: the first ids, in the order they are taken: 1, 2, 3"
        );
    }

    #[test]
    fn more_than_a_sweeper_page_is_a_warning_with_the_rounds_it_takes() {
        let s = settings(&[]);
        let lines = describe(
            &s,
            Closer::of(&s),
            TimeoutKind::Payment,
            Millis(0),
            &due(12_000),
        );
        let (level, warning) = lines.last().unwrap();
        assert_eq!(*level, Level::Warn);
        // Four pages of 500 per round by default.
        assert!(
            warning.contains("12000 to close, more than sweeper.batch_size (500)")
                && warning.contains("within 6 catch-up round(s) of up to 2000, 20 ms apart"),
            "{warning}"
        );
        assert!(lines[1].1.ends_with("9, 10, …"), "{lines:?}");
        let small = describe(
            &s,
            Closer::of(&s),
            TimeoutKind::Payment,
            Millis(0),
            &due(500),
        );
        assert!(small.iter().all(|(l, _)| *l != Level::Warn), "{small:?}");
    }

    #[test]
    fn without_the_catch_up_the_sweeper_takes_what_is_past_its_grace() {
        let s = settings(&[
            ("ORDER_TIMEOUT__CONSUMER__CATCH_UP", "false"),
            ("ORDER_TIMEOUT__SWEEPER__BATCH_SIZE", "100"),
        ]);
        let closer = Closer::of(&s);
        assert_eq!(closer, Closer::Sweeper);
        assert_eq!(closer.threshold(&s), Duration::from_secs(60));
        let lines = describe(&s, closer, TimeoutKind::Receipt, Millis(0), &due(250));
        assert!(
            lines[0].1.contains("the sweeper, 30s after the start"),
            "{lines:?}"
        );
        assert!(
            lines[2]
                .1
                .contains("in its first round, 3 transaction(s) of sweeper.batch_size"),
            "{lines:?}"
        );
    }

    #[test]
    fn without_the_deadline_wake_the_first_due_timeout_starts_the_catch_up() {
        let s = settings(&[("ORDER_TIMEOUT__CONSUMER__WAKE_AT_DEADLINE", "false")]);
        let closer = Closer::of(&s);
        assert_eq!(closer, Closer::CatchUp { at_start: false });
        assert_eq!(closer.threshold(&s), Duration::ZERO);
        let lines = describe(&s, closer, TimeoutKind::Payment, Millis(0), &due(8));
        assert!(
            lines[0].1.contains(
                "at the kind's first due timeout: every one past the deadline; 4 of them past it by more than sweeper.grace (1m), which the sweeper takes if no timeout comes first"
            ),
            "{lines:?}"
        );
    }

    #[test]
    fn with_nothing_to_close_them_overdue_orders_are_a_warning() {
        let s = settings(&[
            ("ORDER_TIMEOUT__CONSUMER__CATCH_UP", "false"),
            ("ORDER_TIMEOUT__SWEEPER__ENABLED", "false"),
        ]);
        let closer = Closer::of(&s);
        assert_eq!(closer, Closer::Nothing);
        let lines = describe(&s, closer, TimeoutKind::Payment, Millis(0), &due(4));
        assert_eq!(lines[0].0, Level::Warn);
        assert!(lines[0].1.contains("nothing closes them"), "{lines:?}");
        let none = describe(&s, closer, TimeoutKind::Payment, Millis(0), &Due::default());
        assert_eq!(none[0].0, Level::Ok);
    }
}
