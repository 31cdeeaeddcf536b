//! `order-timeout doctor`: a readable report on the settings (each with its
//! source, secrets redacted), the database, the broker, the plugin, the delay
//! mode `auto` would choose, and the topology. Exits non-zero on any problem.

use std::process::ExitCode;
use std::time::Duration;

use crate::amqp::topology::Names;
use crate::db;
use crate::db::entities::order_timeout_events;
use crate::db::store;
use crate::domain::TimeoutKind;
use crate::orders::Mapped;
use crate::settings::{OrdersSource, Settings};
use crate::zone_check;
use sea_orm::DatabaseConnection;

mod broker;
mod first_start;
mod grants;
mod mapped_indexes;

use broker::{check_broker, check_stages, check_topology};

struct Report {
    problems: usize,
}

impl Report {
    fn ok(&self, what: &str, detail: impl std::fmt::Display) {
        println!("  ok    {what}: {detail}");
    }
    fn fail(&mut self, what: &str, detail: impl std::fmt::Display) {
        self.problems += 1;
        println!("  FAIL  {what}: {detail}");
    }
    fn note(&self, what: &str, detail: impl std::fmt::Display) {
        println!("  note  {what}: {detail}");
    }
    /// Something that works now and will lose timers if an operator does the
    /// wrong thing next: said loudly, not counted as a problem.
    fn warn(&self, what: &str, detail: impl std::fmt::Display) {
        println!("  WARN  {what}: {detail}");
    }
}

/// Runs every check and prints the report.
pub async fn run(settings: &Settings) -> ExitCode {
    let mut report = Report { problems: 0 };
    println!("settings");
    for (key, value, source) in settings.describe() {
        println!("  {key:<28} {value:<40} ({source})");
    }
    println!("database");
    check_database(&mut report, settings).await;
    println!("broker");
    let names = Names::new(&settings.amqp.prefix);
    if let Some(mode) = check_broker(&mut report, settings, &names).await {
        check_topology(&mut report, settings, &names, mode).await;
        check_stages(&mut report, settings, &names, mode).await;
    }
    if report.problems == 0 {
        println!("all checks passed");
        ExitCode::SUCCESS
    } else {
        println!("{} problem(s) found", report.problems);
        ExitCode::FAILURE
    }
}

/// The database answers, and no migration is pending.
async fn check_database(report: &mut Report, settings: &Settings) {
    let url = settings.database.url.redacted();
    let conn = match db::connect(&settings.database).await {
        Ok(conn) => conn,
        Err(e) => return report.fail("reachable", format!("{url}: {e}")),
    };
    report.ok("reachable", format!("{url} ({})", db::backend_name(&conn)));
    check_clock(report, &conn).await;
    let owned = settings.mapping.source == OrdersSource::Owned;
    if !owned {
        check_mapping(report, settings, &conn).await;
    }
    match db::migration_status(&conn, owned).await {
        Ok((applied, pending)) if pending.is_empty() => report.ok(
            "migrations",
            format!("{} applied, none pending", applied.len()),
        ),
        Ok((_, pending)) => report.fail(
            "migrations",
            format!(
                "{} pending ({}); run `order-timeout migrate`",
                pending.len(),
                pending.join(", ")
            ),
        ),
        Err(e) => report.fail("migrations", e),
    }
    if owned {
        first_start::check_owned(report, settings, &conn).await;
    }
    // Read only once migrated: before that the table may not exist.
    if let Ok(state) = store::outbox_backlog::<order_timeout_events::Entity>(&conn).await {
        let line = format!(
            "{} domain events waiting to be published, {} set aside",
            state.waiting, state.set_aside
        );
        if state.set_aside > 0 {
            report.warn(
                "events outbox",
                format!("{line} (docs/wire-contract.md, Events: putting them back)"),
            );
        } else {
            report.ok("events outbox", line);
        }
    }
}

/// This host's clock against the database's, which decides what is due: a
/// warning, not a failure, since the service never judges by the host's.
async fn check_clock(report: &mut Report, conn: &DatabaseConnection) {
    if conn.get_database_backend() == sea_orm::DbBackend::Sqlite {
        return report.ok(
            "clock",
            "SQLite is embedded: the database's clock is this host's",
        );
    }
    match db::clock::skew(conn).await {
        Ok(skew) => {
            let line = format!(
                "the database's clock decides what is due; this host's is {:+.3} s from it (±{} ms)",
                skew.seconds(),
                skew.uncertainty.as_millis()
            );
            if skew.worth_a_warning() {
                report.warn(
                    "clock",
                    format!(
                        "{line}, over {} s: fix this host's time (NTP), or its logs and AMQP timestamps mislead",
                        db::clock::SKEW_WARN.as_secs()
                    ),
                );
            } else {
                report.ok("clock", line);
            }
        }
        Err(e) => report.fail("clock", format!("cannot read the database's clock: {e}")),
    }
}

/// `ms` either way, to a tenth of a second below a minute, else in whole seconds (`8h 0m 3s`).
fn span(ms: i64) -> String {
    let ms = ms.unsigned_abs();
    if ms < 60_000 {
        format!("{:.1} s", ms as f64 / 1000.0)
    } else {
        humantime::format_duration(Duration::from_secs(ms / 1000)).to_string()
    }
}

/// A newest row this far after the database's now means its zone is wrong:
/// more than clock steps and a slow write could explain.
const FUTURE_TOLERANCE_MS: i64 = 60_000;

/// The shop's table as the mapping describes it: what was found for each
/// setting, the zone its times are read in, and how many orders wait for
/// each mapped timeout. Read-only. Fails when the zone cannot be determined
/// (the mapping does not load) or the newest order lies in the future by that
/// zone (it is not the zone the shop writes in).
async fn check_mapping(report: &mut Report, settings: &Settings, conn: &DatabaseConnection) {
    let mapped = match Mapped::load(&settings.mapping, &settings.windows, conn).await {
        Ok(mapped) => mapped,
        Err(e) => return report.fail("mapping", e),
    };
    for finding in &mapped.findings {
        report.ok("mapping", finding);
    }
    if mapped.release_statements() > 0 && !mapped.is_shadow() {
        report.ok(
            "mapping",
            format!(
                "{} release statement(s) run for an id no order has, rolled back",
                mapped.release_statements()
            ),
        );
    }
    mapped_indexes::check(report, &mapped, conn).await;
    grants::check(report, &mapped, conn).await;
    // The zone and where it came from are among the findings above.
    let zone = &mapped.zone;
    for kind in TimeoutKind::ALL {
        match mapped.newest(conn, kind).await {
            Ok(Some(newest)) => match (&newest.value, newest.ahead_ms) {
                (Some(value), Some(ahead)) if ahead > FUTURE_TOLERANCE_MS => report.fail(
                    "time zone",
                    format!(
                        "{kind}: the newest {} ({value}) is {} after the database's now ({}) in {}: the shop writes in another zone; set mapping.time_zone",
                        newest.column,
                        span(ahead),
                        newest.now,
                        zone.used
                    ),
                ),
                (Some(value), Some(ahead)) => report.ok(
                    "time zone",
                    format!(
                        "{kind}: the newest {} ({value}) is {} before the database's now ({}) in {}",
                        newest.column,
                        span(ahead),
                        newest.now,
                        zone.used
                    ),
                ),
                _ => report.ok(
                    "time zone",
                    format!(
                        "{kind}: no {} yet to compare with the database's now ({})",
                        newest.column, newest.now
                    ),
                ),
            },
            Ok(None) => {}
            Err(e) => report.fail("time zone", format!("{kind}: {e}")),
        }
    }
    zone_evidence(report, &mapped, conn).await;
    shadow_state(report, &mapped, conn).await;
    first_start::check(report, settings, conn, &mapped).await;
    // Rows the service cannot read are never acted on: worth a warning,
    // not a failure (the other orders are served).
    match mapped.unreadable_ids(conn).await {
        Ok(Some(0)) => report.ok("ids", "every id is readable"),
        Ok(Some(n)) => report.warn(
            "ids",
            format!(
                "{n} row(s) have an id the service cannot read (empty, surrounding blanks, control characters or over 255 bytes): no timeout acts on them; fix them in the shop's table"
            ),
        ),
        Ok(None) => {}
        Err(e) => report.fail("ids", e),
    }
}

/// What the running service found of a guessed zone (`crate::zone_check`):
/// per kind read in the server's default zone, whether a new order has
/// confirmed it, contradicted it (with the offset that would fit), or not
/// yet, in which case `serve` closes none of that kind, backlog included.
async fn zone_evidence(report: &mut Report, mapped: &Mapped, conn: &DatabaseConnection) {
    let zone = mapped.zone.used.to_string();
    for kind in mapped.zone_guarded() {
        let verdict = match zone_check::recorded(conn, kind, &zone).await {
            Ok(verdict) => verdict.unwrap_or(zone_check::Verdict::Unconfirmed),
            // Before `migrate`, no service has kept anything.
            Err(_) => zone_check::Verdict::Unconfirmed,
        };
        let line = zone_check::describe(mapped, kind, &verdict);
        match verdict {
            zone_check::Verdict::Fits => report.ok("time zone", line),
            zone_check::Verdict::Unconfirmed => report.warn("time zone", line),
            zone_check::Verdict::Off { .. } => report.fail("time zone", line),
        }
    }
}

/// Shadow mode (`orders.shadow`): on, and what it recorded so far per kind;
/// nothing when it is off.
async fn shadow_state(report: &mut Report, mapped: &Mapped, conn: &DatabaseConnection) {
    if !mapped.is_shadow() {
        return;
    }
    report.ok(
        "shadow",
        "on: serve decides as usual but writes nothing to the shop's tables and publishes no events; GET /admin/shadow (order-timeout ctl shadow) sets its decisions beside the shop's",
    );
    let now = match db::clock::now(conn).await {
        Ok(now) => now,
        Err(e) => return report.fail("shadow", format!("cannot read the clock: {e}")),
    };
    for kind in TimeoutKind::ALL {
        match mapped.shadow_report(conn, kind, now).await {
            Ok(Some(r)) => report.ok("shadow", format!("{kind}: {}", r.counts())),
            Ok(None) => {}
            // Before `migrate`, nothing is recorded.
            Err(e) => return report.note("shadow", format!("nothing recorded yet ({e})")),
        }
    }
}
