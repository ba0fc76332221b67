//! From records to a report: which turns belong together, where each prompt stopped matching,
//! what that cost, and who is to blame. Pure: no I/O, no clock.
//!
//! The batch algorithm is llmp 0.1.0's (`table`, `findings`, `report`; MIT, see NOTICE), so our
//! figures agree with llmp's on the same recordings; prefixscope's extensions are marked where
//! they are made.

pub(crate) mod client_cause;
pub(crate) mod engine;
pub(crate) mod engine_cause;
pub(crate) mod findings;
pub(crate) mod harness;
pub(crate) mod ids;
#[cfg(any(test, feature = "reference"))]
mod reference;
pub(crate) mod report;
pub(crate) mod row;
pub(crate) mod server_events;
pub(crate) mod table;

pub use client_cause::client_cause_label;
pub use engine_cause::EngineKind;
pub use findings::{CAPACITY_SETTINGS, Fix, LEVERS, Lever, advice_cause, fix, listed};
#[cfg(any(test, feature = "reference"))]
pub use reference::analyze_reference;
pub use report::{finding_label, time};

use serde::{Deserialize, Serialize};

use crate::normalize::exchange::{Exchange, SkipReason, normalize};
use crate::record::Record;

pub use engine::{Analyzer, Prepared, Update};
pub use findings::{Confidence, Finding, FindingKind};
// Counts carry their source from normalization on; the analysis passes them on as they are.
pub use crate::normalize::measured::{Measured, Source};
pub use report::Report;
pub use row::{
    BreakCause, BreakLocation, BreakTexts, Cause, Client, Composition, EvictedBy, Loss, Priced,
    Rated, Row, RowKind, Shape, SharedRow, ToolUsage, subagent_links,
};

/// Version of the report format (llmp's report format v1 plus prefixscope's added fields).
pub const REPORT_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    pub session_gap_ms: u64,
    pub thresholds: Thresholds,
    /// What a lost token costs (`pricing`): the dated default table for hosted APIs, and the
    /// user's `--prices`.
    #[serde(skip)]
    pub prices: crate::pricing::Prices,
    /// The live engine's analysis starts again past this estimate of its heap
    /// (`live::DEFAULT_MEMORY_BUDGET`, `--memory-budget`); a batch analysis never does.
    #[serde(skip)]
    pub memory_budget: usize,
    /// The live engine also starts again after this many records (`--metrics-window`: a
    /// `--metrics` endpoint's windows); `None`: only past the memory budget.
    #[serde(skip)]
    pub window: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Thresholds {
    pub tool_schema_tokens: u32,
    pub system_tokens: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            session_gap_ms: 60_000,
            thresholds: Thresholds::default(),
            prices: crate::pricing::Prices::default(),
            memory_budget: crate::live::DEFAULT_MEMORY_BUDGET,
            window: None,
        }
    }
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            tool_schema_tokens: 800,
            system_tokens: 800,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Normalized {
    pub exchanges: Vec<Exchange>,
    pub skipped: Vec<Skipped>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Skipped {
    pub path: String,
    pub reason: SkipReason,
    /// `HEAD` or `GET /`: a harness checking the server is up.
    pub connectivity_check: bool,
}

/// Probe records (`record.probe`) are not traffic: neither an exchange nor a skipped one.
pub fn normalize_all(records: &[Record]) -> Normalized {
    let mut normalized = Normalized::default();
    for record in records.iter().filter(|r| !r.probe) {
        match normalize(record) {
            Ok(exchange) => normalized.exchanges.push(exchange),
            Err(reason) => normalized.skipped.push(Skipped {
                path: record.request.path.clone(),
                reason,
                connectivity_check: crate::normalize::exchange::is_connectivity_check(record),
            }),
        }
    }
    normalized
}

/// The whole analysis of `records` (in any order; rows come out in start order): the engine in
/// batch mode, linear in the records.
pub fn analyze(records: &[Record], config: &Config) -> Report {
    engine::Analyzer::from_records(records, config.clone()).into_report()
}

/// The findings of a report's rows and tool usage (those of `Analyzer::live_report`, which
/// leaves them out until they are read).
pub fn find<R: Priced>(report: &report::Report<R>, config: &Config) -> Vec<Finding> {
    findings::find(&report.rows, &report.tools, config)
}
