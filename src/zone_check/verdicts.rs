//! What the time zone check knows, held in the [`Context`](crate::context::Context)
//! for `/readyz`, the page and the watch: each guarded kind's verdict, and
//! the newest stamps read at start. Apart from the check itself, which needs
//! the context, so that the context needs only this.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::domain::TimeoutKind;
use crate::orders::mapped::Stamp;

/// What the check knows of one kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No order has appeared since the zone was guessed: held.
    Unconfirmed,
    /// A new order's stamp fit the zone.
    Fits,
    /// A new order's stamp lay `ahead_ms` from now; `fitting` is the UTC
    /// offset it would fit. Held.
    Off {
        ahead_ms: i64,
        fitting: String,
        stamp: String,
    },
}

impl Verdict {
    /// As the metric's `state` label and `/readyz` spell it.
    pub fn state(&self) -> &'static str {
        match self {
            Self::Unconfirmed => "unconfirmed",
            Self::Fits => "fits",
            Self::Off { .. } => "off",
        }
    }
}

/// Each guarded kind's verdict, for `/readyz` and the page, and the newest
/// stamps read at start, which a new order's must exceed to count.
#[derive(Debug, Default)]
pub struct ZoneChecks {
    verdicts: Mutex<BTreeMap<TimeoutKind, Verdict>>,
    baselines: Mutex<BTreeMap<TimeoutKind, Stamp>>,
}

impl ZoneChecks {
    /// The kinds whose zone a new order contradicted, each with why.
    pub fn mismatched(&self) -> Vec<(TimeoutKind, Verdict)> {
        let verdicts = self.verdicts.lock().unwrap_or_else(|e| e.into_inner());
        verdicts
            .iter()
            .filter(|(_, v)| matches!(v, Verdict::Off { .. }))
            .map(|(k, v)| (*k, v.clone()))
            .collect()
    }

    /// Every guarded kind's verdict.
    pub fn all(&self) -> Vec<(TimeoutKind, Verdict)> {
        let verdicts = self.verdicts.lock().unwrap_or_else(|e| e.into_inner());
        verdicts.iter().map(|(k, v)| (*k, v.clone())).collect()
    }

    pub(super) fn get(&self, kind: TimeoutKind) -> Option<Verdict> {
        let verdicts = self.verdicts.lock().unwrap_or_else(|e| e.into_inner());
        verdicts.get(&kind).cloned()
    }

    pub(super) fn set(&self, kind: TimeoutKind, verdict: Verdict) {
        let mut verdicts = self.verdicts.lock().unwrap_or_else(|e| e.into_inner());
        verdicts.insert(kind, verdict);
    }

    /// Keeps the newest stamp of `kind` read at start.
    pub(super) fn set_baseline(&self, kind: TimeoutKind, stamp: Stamp) {
        let mut baselines = self.baselines.lock().unwrap_or_else(|e| e.into_inner());
        baselines.insert(kind, stamp);
    }

    /// The stamps read at start, for the watch that takes them over.
    pub(super) fn take_baselines(&self) -> BTreeMap<TimeoutKind, Stamp> {
        std::mem::take(&mut *self.baselines.lock().unwrap_or_else(|e| e.into_inner()))
    }
}
