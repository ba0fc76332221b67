//! The live endpoint's analysis: the live engine the TUI runs, over a window of at most
//! `window` records. When the window is full its totals are kept and a new engine starts, so the
//! endpoint's memory is bounded by the window (the engine keeps state per record) on a proxy
//! that runs for days. Within one window the families equal `analyze` of the same records; over
//! several, they are the sum of each window's analysis (DESIGN.md, "Prometheus metrics").
//!
//! Pure and synchronous, like the engine: arrival times come with the records.

use std::collections::VecDeque;
use std::sync::Arc;

use super::{CacheFigures, Totals, WindowFigures, cache_figures};
use prefixscope_core::analysis::Config;
use prefixscope_core::live::{Engine, Input};
use prefixscope_core::record::Record;

/// Records per window unless `--metrics-window` says otherwise (a window also closes at
/// `--memory-budget`): about 100–200 MB of engine on
/// agent traffic (BENCHMARKS.md, "With `--metrics` on and off").
pub const DEFAULT_WINDOW: usize = 20_000;
/// `--metrics-window`'s bounds.
pub const MIN_WINDOW: usize = 100;
pub const MAX_WINDOW: usize = 1_000_000;
/// The newest probe records, given again to each new window's engine: `record` probes the
/// server once, and a window that forgot the server's slots and model would explain less.
const PROBES_KEPT: usize = 16;

/// A ratio summed over windows, each weighted by its window's prompt tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Weighted {
    sum: f64,
    weight: f64,
}

impl Weighted {
    fn add(&mut self, value: f64, weight: f64) {
        self.sum += value * weight;
        self.weight += weight;
    }

    fn with(self, value: Option<f64>, weight: f64) -> Option<f64> {
        let mut all = self;
        if let Some(value) = value {
            all.add(value, weight);
        }
        if all.weight > 0.0 {
            Some(all.sum / all.weight)
        } else {
            value
        }
    }
}

/// What the exposition is built from at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct Figures {
    pub totals: Totals,
    pub cache: Option<CacheFigures>,
    pub window: WindowFigures,
}

pub struct Windowed {
    config: Config,
    window: usize,
    /// The analysis's heap at most (`Engine::held_bytes`).
    budget: usize,
    engine: Engine,
    in_window: usize,
    closed: Totals,
    closed_ceiling: Weighted,
    closed_reuse: Weighted,
    windows_closed: u64,
    probes: VecDeque<Arc<Record>>,
}

impl Windowed {
    /// `window` is bounded to `MIN_WINDOW..=MAX_WINDOW`; a window also closes when its
    /// analysis's heap passes `config.memory_budget` (the engine itself then never restarts).
    pub fn new(mut config: Config, window: usize) -> Windowed {
        let budget = config.memory_budget;
        config.memory_budget = usize::MAX;
        Windowed {
            engine: Engine::new(config.clone()),
            config,
            budget,
            window: window.clamp(MIN_WINDOW, MAX_WINDOW),
            in_window: 0,
            closed: Totals::default(),
            closed_ceiling: Weighted::default(),
            closed_reuse: Weighted::default(),
            windows_closed: 0,
            probes: VecDeque::new(),
        }
    }

    /// One record as the recorder hands it on, and when it arrived (ms).
    pub fn push(&mut self, record: Arc<Record>, arrived_ms: i64) {
        if record.probe {
            if self.probes.len() == PROBES_KEPT {
                self.probes.pop_front();
            }
            self.probes.push_back(Arc::clone(&record));
        } else {
            if self.in_window >= self.window || self.engine.held_bytes() > self.budget {
                self.close(arrived_ms);
            }
            self.in_window += 1;
        }
        self.engine.push(Input::Record(record, arrived_ms));
    }

    /// Keeps the open window's totals and starts a new engine, told the newest probes.
    fn close(&mut self, now_ms: i64) {
        let (totals, cache) = self.open_figures();
        let weight = totals.prompt_tokens() as f64;
        if let Some(cache) = cache {
            self.closed_ceiling.add(cache.ceiling, weight);
            if let Some(reuse) = cache.server_reuse {
                self.closed_reuse.add(reuse, weight);
            }
        }
        self.closed.add(&totals);
        self.windows_closed += 1;
        self.in_window = 0;
        self.engine = Engine::new(self.config.clone());
        for probe in &self.probes {
            self.engine.push(Input::Record(Arc::clone(probe), now_ms));
        }
    }

    fn open_figures(&mut self) -> (Totals, Option<CacheFigures>) {
        let (report, curve) = self.engine.analysis_and_curve();
        (Totals::of(&report), cache_figures(curve.as_ref()))
    }

    /// The closed windows' totals and the open one's; the ratios weighted by prompt tokens.
    pub fn figures(&mut self) -> Figures {
        let (open, cache) = self.open_figures();
        let weight = open.prompt_tokens() as f64;
        let mut totals = self.closed.clone();
        totals.add(&open);
        let ceiling = self.closed_ceiling.with(cache.map(|c| c.ceiling), weight);
        let cache = ceiling.map(|ceiling| CacheFigures {
            ceiling,
            server_reuse: self
                .closed_reuse
                .with(cache.and_then(|c| c.server_reuse), weight),
        });
        Figures {
            totals,
            cache,
            window: WindowFigures {
                records_skipped: 0,
                windows_closed: self.windows_closed,
                window_records: self.in_window as u64,
                stepped_aside: false,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::tests::real_recording;
    use prefixscope_core::analysis::analyze;

    /// The real recording's traffic five times over, with new ids.
    fn five_times_over() -> Vec<Record> {
        let one: Vec<Record> = real_recording().into_iter().filter(|r| !r.probe).collect();
        (0..5u64)
            .flat_map(|round| {
                one.iter().map(move |record| {
                    let mut record = record.clone();
                    record.id += round * 10_000;
                    record
                })
            })
            .collect()
    }

    fn windowed(records: &[Record], window: usize) -> Figures {
        let mut windowed = Windowed::new(Config::default(), window);
        for (i, record) in records.iter().enumerate() {
            windowed.push(Arc::new(record.clone()), i as i64);
        }
        windowed.figures()
    }

    #[test]
    fn one_window_is_the_analysis_of_its_records() {
        let records = real_recording();
        let figures = windowed(&records, MAX_WINDOW);
        let report = analyze(&records, &Config::default());
        assert_eq!(figures.totals, Totals::of(&report));
        assert_eq!(figures.window.windows_closed, 0);
        assert!(figures.totals.lost.values().map(|l| l.0).sum::<u64>() > 0);
    }

    #[test]
    fn closed_windows_add_up_to_the_analyses_of_their_records() {
        // The recording's traffic five times over (new ids), in windows of 100 records.
        let records = five_times_over();
        let figures = windowed(&records, MIN_WINDOW);
        let mut expected = Totals::default();
        for chunk in records.chunks(MIN_WINDOW) {
            expected.add(&Totals::of(&analyze(chunk, &Config::default())));
        }
        let windows = records.len().div_ceil(MIN_WINDOW);
        assert_eq!(figures.window.windows_closed, windows as u64 - 1);
        assert_eq!(
            figures.window.window_records,
            (records.len() - (windows - 1) * MIN_WINDOW) as u64
        );
        assert_eq!(figures.totals, expected);
    }

    /// A window also closes when its analysis passes the memory budget, whatever its count of
    /// records: its memory is bounded by the budget, not by records of any size. The closed
    /// windows still add up to the analyses of their records.
    #[test]
    fn a_window_closes_at_the_memory_budget() {
        let records = five_times_over();
        let config = Config {
            memory_budget: 64 << 10,
            ..Config::default()
        };
        let mut windowed = Windowed::new(config, MAX_WINDOW);
        let mut closed_at = Vec::new();
        for (i, record) in records.iter().enumerate() {
            let before = windowed.windows_closed;
            windowed.push(Arc::new(record.clone()), i as i64);
            if windowed.windows_closed > before {
                closed_at.push(i);
            }
            assert!(windowed.engine.held_bytes() <= (64 << 10) + (32 << 10));
        }
        assert!(closed_at.len() >= 2, "{closed_at:?}");
        let mut expected = Totals::default();
        let mut from = 0;
        for &to in closed_at.iter().chain(std::iter::once(&records.len())) {
            expected.add(&Totals::of(&analyze(
                &records[from..to],
                &Config::default(),
            )));
            from = to;
        }
        assert_eq!(windowed.figures().totals, expected);
    }
}
