//! The one clock that decides: the database's.
//!
//! Whether an order is due, whether a payment is late, every time the service
//! stamps on a row and the `x-delay` a relay computes are reckoned from the
//! database's clock, never from the wall clock of the instance doing the work:
//! instances whose clocks disagree (a stepped NTP, a VM restored from a
//! snapshot) must decide identically, and a deadline stamped by one is read
//! by another. The reading is taken once per transaction or batch, just before
//! it; the statements run a moment later, so a reading errs towards "not yet
//! due", never early.
//!
//! SQLite is embedded: its clock is the process's own, so no round trip is made.

use std::time::Duration;

use sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement};

use crate::domain::Millis;

/// The database's time now, in milliseconds since the Unix epoch.
pub async fn now(db: &impl ConnectionTrait) -> Result<Millis, DbErr> {
    let backend = db.get_database_backend();
    let sql = match backend {
        // clock_timestamp(), not now(): the time of the call, not of the
        // start of the transaction it may run in.
        DbBackend::Postgres => {
            "SELECT CAST(FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000) AS BIGINT)"
        }
        // UNIX_TIMESTAMP reads NOW(3) back in the same session zone it was
        // written in, so the instant is right whatever that zone is.
        DbBackend::MySql => "SELECT CAST(FLOOR(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED)",
        _ => return Ok(Millis::now()),
    };
    let row = db
        .query_one_raw(Statement::from_string(backend, sql))
        .await?
        .ok_or_else(|| DbErr::Custom("the database's clock returned no row".into()))?;
    Ok(Millis(row.try_get_by_index::<i64>(0)?))
}

/// How far this host's clock is ahead of the database's (negative when it is
/// behind), measured against the middle of the round trip, so the network's
/// own delay is not counted as skew. Zero for SQLite.
pub async fn skew(db: &impl ConnectionTrait) -> Result<Skew, DbErr> {
    let before = Millis::now();
    let started = std::time::Instant::now();
    let database = now(db).await?;
    let round_trip = started.elapsed();
    let host_mid = before.0 + (round_trip.as_millis() / 2) as i64;
    Ok(Skew {
        database,
        host_ahead_ms: host_mid - database.0,
        uncertainty: round_trip / 2,
    })
}

/// A measured difference between this host's clock and the database's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Skew {
    /// The database's clock, as read.
    pub database: Millis,
    /// Milliseconds this host's clock is ahead of the database's.
    pub host_ahead_ms: i64,
    /// Half the round trip: the measurement is good to within this.
    pub uncertainty: Duration,
}

/// Above this, `doctor` and the log warn about the skew: the service still
/// decides by the database's clock, but the host's logs, the AMQP
/// `timestamp` property and anything else on the host read another time.
pub const SKEW_WARN: Duration = Duration::from_secs(1);

impl Skew {
    /// The skew in seconds (host ahead positive), for the gauge.
    pub fn seconds(self) -> f64 {
        self.host_ahead_ms as f64 / 1000.0
    }

    /// Whether it is large enough to warn about, beyond what the round trip
    /// could explain.
    pub fn worth_a_warning(self) -> bool {
        self.host_ahead_ms.unsigned_abs() as u128 > (SKEW_WARN + self.uncertainty).as_millis()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skew_within_the_round_trip_is_no_warning() {
        let skew = |ms, rt_ms| Skew {
            database: Millis(0),
            host_ahead_ms: ms,
            uncertainty: Duration::from_millis(rt_ms),
        };
        assert!(!skew(900, 0).worth_a_warning());
        assert!(!skew(1_200, 300).worth_a_warning());
        assert!(skew(1_200, 100).worth_a_warning());
        assert!(skew(-120_000, 5).worth_a_warning());
        assert_eq!(skew(-1_500, 0).seconds(), -1.5);
    }
}
