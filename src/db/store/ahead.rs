//! The deadlines ahead: how many orders fall due minute by minute, for
//! `GET /admin/deadlines` and the `due_next` gauge. One aggregate grouped by
//! the minute, over the (status, deadline) index, never rows read into memory.

use sea_orm::sea_query::{Asterisk, Func};

use super::expiry::unflagged;

use super::*;

/// One minute, in milliseconds: the resolution of [`DueAhead::minutes`].
pub const MINUTE_MS: i64 = 60_000;

/// Which of the asked horizons a deadline falls in: [`OVERDUE_BAND`] when it
/// passed already, else the index of the first horizon it is before.
pub const OVERDUE_BAND: i64 = -1;

/// The orders waiting for a timeout of one kind, by when they fall due.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DueAhead {
    /// Orders whose deadline already passed, still in the status the
    /// timeout acts on (and, for fulfillment, not flagged yet).
    pub overdue: u64,
    /// Orders falling due within each horizon asked, in the order asked.
    pub within: Vec<u64>,
    /// Orders falling due before the longest horizon, by the minute of their
    /// deadline (its start, on a minute boundary of the epoch), ascending;
    /// minutes with none are left out.
    pub minutes: Vec<(Millis, u64)>,
}

impl DueAhead {
    /// Folds the rows of the grouped query, `(band, minute, count)`: a band
    /// is [`OVERDUE_BAND`] or the index of the first of `horizons` horizons
    /// the deadlines are before. A minute cut by a horizon comes as two rows.
    pub fn from_rows(horizons: usize, rows: impl IntoIterator<Item = (i64, i64, i64)>) -> Self {
        let mut ahead = Self {
            within: vec![0; horizons],
            ..Self::default()
        };
        let mut minutes: BTreeMap<i64, u64> = BTreeMap::new();
        for (band, minute, count) in rows {
            let count = u64::try_from(count).unwrap_or(0);
            let Ok(band) = usize::try_from(band) else {
                ahead.overdue += count;
                continue;
            };
            // Due within this horizon, so within every longer one too.
            for within in ahead.within.iter_mut().skip(band) {
                *within += count;
            }
            *minutes.entry(minute).or_default() += count;
        }
        ahead.minutes = minutes
            .into_iter()
            .filter(|&(_, n)| n > 0)
            .map(|(m, n)| (Millis(m), n))
            .collect();
        ahead
    }
}

/// How many orders of `kind` fall due within each of `horizons` (ascending,
/// the last bounds the query) from `now`, minute by minute, and how many are
/// overdue already. One `GROUP BY` over the band and the minute, which reads
/// the (status, deadline) index's entries up to `now` + the last horizon.
pub async fn due_ahead(
    db: &DatabaseConnection,
    kind: TimeoutKind,
    now: Millis,
    horizons: &[Duration],
) -> Result<DueAhead, DbErr> {
    let Some(&longest) = horizons.last() else {
        return Ok(DueAhead::default());
    };
    let deadline = deadline_column(kind);
    // Literal bands, not bound values, whose type a backend would have to
    // guess; cast to a BIGINT below, as PostgreSQL reads them as INT4.
    let mut band =
        CaseStatement::new().case(deadline.lt(now.0), Expr::cust(OVERDUE_BAND.to_string()));
    for (i, horizon) in horizons.iter().enumerate() {
        band = band.case(deadline.lt(now.plus(*horizon).0), Expr::cust(i.to_string()));
    }
    // Overdue orders share one group whatever their minute: their count is
    // what matters, and a backlog of days would otherwise be a row a minute.
    let minute: Expr = CaseStatement::new()
        .case(deadline.lt(now.0), Expr::cust("0"))
        .finally(
            Expr::col(deadline).sub(Expr::col(deadline).modulo(Expr::cust(MINUTE_MS.to_string()))),
        )
        .into();
    let bigint = match db.get_database_backend() {
        DbBackend::MySql => "SIGNED",
        _ => "BIGINT",
    };
    let band = Func::cast_as(Expr::Case(Box::new(band)), bigint);
    let mut query = orders::Entity::find()
        .select_only()
        .expr_as(band, "due_band")
        .expr_as(minute, "due_minute")
        .expr_as(Expr::col(Asterisk).count(), "due_count")
        .filter(orders::Column::Status.eq(kind.acts_on().as_str()))
        .filter(deadline.lt(now.plus(longest).0));
    query = unflagged(kind, query);
    // Grouped by the output names: the expressions hold bound values, which
    // PostgreSQL would not match with a second copy of them.
    let rows: Vec<(i64, i64, i64)> = query
        .group_by(Expr::cust("due_band"))
        .group_by(Expr::cust("due_minute"))
        .into_tuple()
        .all(db)
        .await?;
    Ok(DueAhead::from_rows(horizons.len(), rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_fold_into_overdue_horizons_and_minutes() {
        // Horizons 1m, 5m; a minute cut by the 1m horizon comes in two rows.
        let rows = [
            (OVERDUE_BAND, 0, 4),
            (0, 120_000, 2),
            (1, 120_000, 3),
            (1, 300_000, 5),
        ];
        let ahead = DueAhead::from_rows(2, rows);
        assert_eq!(ahead.overdue, 4);
        assert_eq!(ahead.within, vec![2, 10]);
        assert_eq!(
            ahead.minutes,
            vec![(Millis(120_000), 5), (Millis(300_000), 5)]
        );
    }

    #[test]
    fn no_rows_is_nothing_due() {
        let ahead = DueAhead::from_rows(3, []);
        assert_eq!(ahead.within, vec![0, 0, 0]);
        assert!(ahead.minutes.is_empty());
        assert_eq!(ahead.overdue, 0);
    }
}
