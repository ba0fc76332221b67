//! The app's state and how events change it. `handle` may change state; drawing (`ui.rs`) only
//! reads it. Effects that touch the disk or the proxy are returned to the loop as `Action`s.

use crossterm::event::{
    KeyCode, KeyEvent, KeyEventKind, KeyModifiers, MouseButton, MouseEvent, MouseEventKind,
};
use tui_textarea::TextArea;

use super::event::Event;
use super::view::{Curve, PrefixItem, View, thousands};
use crate::analysis::{Analyzer, Config};
use crate::cache::Policy;
use crate::cache::blocks::BlockModel;
use crate::cache::live::LiveSimulator;
use crate::cache::prefixes::TOP_PREFIXES;
use crate::cache::profile::Capacity;
use crate::input::recording::live_request;
use crate::input::{FileReport, Format};

/// Data redraws at most this often; keys redraw at once.
pub const DATA_REDRAW_MS: i64 = 250;
/// Rebuilding the view is linear in the rows (the report), so data redraws wait at least this
/// many times the last rebuild's cost: the rebuild never takes more than a tenth of a core,
/// however long the run.
pub const REBUILD_COST_FACTOR: i64 = 10;
/// Block size and capacities of the live hit-rate curve (tokens).
pub const LIVE_BLOCK_SIZE: u32 = 16;
pub const LIVE_CAPACITIES: [(&str, u64); 6] = [
    ("4K", 4_096),
    ("16K", 16_384),
    ("64K", 65_536),
    ("256K", 262_144),
    ("1M", 1_048_576),
    ("4M", 4_194_304),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pane {
    Conversations,
    Breaks,
    Losses,
    HitRate,
    Prefixes,
}

impl Pane {
    pub const ALL: [Pane; 5] = [
        Pane::Conversations,
        Pane::Breaks,
        Pane::Losses,
        Pane::HitRate,
        Pane::Prefixes,
    ];

    pub fn title(self) -> &'static str {
        match self {
            Pane::Conversations => "Conversations",
            Pane::Breaks => "Prefix breaks",
            Pane::Losses => "Loss per client",
            Pane::HitRate => "Hit rate by capacity",
            Pane::Prefixes => "Top prefixes",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Live {
        upstream: String,
        listen: String,
        recording: String,
    },
    Replay {
        files: String,
    },
}

/// What the input carries, so panes that need more say so instead of staying empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// Recordings: every pane.
    Exchanges,
    /// A trace or gateway log read as cache requests (the name of its format): hit rate and
    /// prefixes only.
    RequestsOnly(String),
}

pub enum Dialog {
    Help,
    Detail(u64),
    Filter(TextArea<'static>),
    Export {
        format: usize,
        name: TextArea<'static>,
    },
}

pub use crate::export::TARGET_NAMES as EXPORT_FORMATS;

/// What the loop must do for the app (I/O stays out of here).
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    None,
    Redraw,
    Snapshot,
    Export {
        format: String,
        path: String,
    },
    /// Stop the proxy (or the replay), then quit once in-flight exchanges are done.
    Quit,
    ForceQuit,
    Speed(f64),
}

pub struct App {
    pub source: Source,
    pub input: Input,
    engine: Analyzer,
    /// Records received (their bodies are not kept: the recording holds them).
    pub requests_seen: u64,
    /// The cold-replay cache simulation behind the hit-rate pane.
    cache: LiveSimulator,
    block_model: BlockModel,
    cache_skips: FileReport,
    /// Prompt tokens of simulated requests, and of those the server said it reused (only
    /// requests whose server reported reuse count in both).
    server_reuse: (u64, u64),
    pub view: View,
    pub focus: Pane,
    pub selected: [usize; 5],
    pub paused: bool,
    pub filter: String,
    pub dialog: Option<Dialog>,
    pub status: Option<String>,
    pub warnings: u64,
    pub records_written: Option<u64>,
    pub in_flight: u64,
    pub upstream_ok: Option<bool>,
    pub speed: Option<f64>,
    pub source_done: bool,
    pub quitting: bool,
    pub mouse: bool,
    pub chart: bool,
    pub prefixes_by_tokens: bool,
    /// Request start times of the last minute, for requests/s.
    recent: std::collections::VecDeque<i64>,
    pub now_ms: i64,
    data_dirty: bool,
    last_view_ms: i64,
    pub needs_draw: bool,
    /// How long the last view rebuild took (measured by the loop, which owns the clock).
    pub rebuild_cost_ms: i64,
    rebuilt: bool,
    /// The terminal size at the last draw, for mouse hit-testing (set by the loop).
    pub last_size: (u16, u16),
}

impl App {
    pub fn new(source: Source, config: Config) -> App {
        App::with_block_size(source, config, LIVE_BLOCK_SIZE)
    }

    /// `block_size`: tokens per block of the hit-rate simulation (a trace's own, e.g. 512 for
    /// Mooncake; capacities stay in tokens).
    pub fn with_block_size(source: Source, config: Config, block_size: u32) -> App {
        let block_size = block_size.max(1);
        App {
            source,
            input: Input::Exchanges,
            engine: Analyzer::new(config),
            requests_seen: 0,
            cache: LiveSimulator::new(
                block_size,
                LIVE_CAPACITIES
                    .iter()
                    .map(|(label, tokens)| Capacity {
                        blocks: tokens / u64::from(block_size),
                        label: (*label).to_string(),
                    })
                    .collect(),
            ),
            block_model: BlockModel {
                block_size,
                ..BlockModel::default()
            },
            cache_skips: FileReport::new("live", Format::Recording),
            server_reuse: (0, 0),
            view: View::default(),
            focus: Pane::Conversations,
            selected: [0; 5],
            paused: false,
            filter: String::new(),
            dialog: None,
            status: None,
            warnings: 0,
            records_written: None,
            in_flight: 0,
            upstream_ok: None,
            speed: None,
            source_done: false,
            quitting: false,
            mouse: true,
            chart: false,
            prefixes_by_tokens: false,
            recent: std::collections::VecDeque::new(),
            now_ms: 0,
            data_dirty: false,
            last_view_ms: i64::MIN / 2,
            needs_draw: true,
            rebuild_cost_ms: 0,
            rebuilt: false,
            last_size: (0, 0),
        }
    }

    pub fn requests(&self) -> u64 {
        self.requests_seen
    }

    pub fn requests_per_second(&self) -> f64 {
        // `recent` is in arrival order, so the last ten seconds are its tail.
        let since = self.now_ms - 10_000;
        let older = self.recent.partition_point(|&t| t < since);
        (self.recent.len() - older) as f64 / 10.0
    }

    pub fn report(&self) -> crate::analysis::Report {
        self.engine.report()
    }

    pub fn handle(&mut self, event: Event, now_ms: i64) -> Action {
        self.now_ms = now_ms;
        match event {
            Event::Record(record) => {
                self.engine.push(&record);
                if let Some(request) =
                    live_request(&record, &self.block_model, &mut self.cache_skips)
                {
                    self.simulate(&request);
                }
                self.count_arrival(now_ms);
                Action::None
            }
            Event::Request(request) => {
                self.simulate(&request);
                self.count_arrival(now_ms);
                Action::None
            }
            Event::SourceDone => {
                self.source_done = true;
                self.status = Some("replay finished".into());
                self.needs_draw = true;
                Action::None
            }
            Event::ProxyStopped => {
                self.source_done = true;
                if self.quitting {
                    Action::ForceQuit
                } else {
                    Action::None
                }
            }
            Event::Warning(text) => {
                self.warnings += 1;
                self.status = Some(text);
                self.needs_draw = true;
                Action::None
            }
            Event::Tick => {
                self.needs_draw = true;
                Action::None
            }
            Event::Resize(w, h) => {
                self.last_size = (w, h);
                self.needs_draw = true;
                Action::Redraw
            }
            Event::Mouse(mouse) => self.mouse_event(mouse),
            Event::Key(key) if key.kind != KeyEventKind::Release => {
                self.needs_draw = true;
                self.key(key)
            }
            Event::Key(_) => Action::None,
        }
    }

    fn simulate(&mut self, request: &crate::cache::Request) {
        let update = self.cache.push(request);
        if let Some(reused) = request.server_reused_tokens {
            self.server_reuse.0 += update.request_tokens;
            self.server_reuse.1 += reused.min(update.request_tokens);
        }
    }

    fn count_arrival(&mut self, now_ms: i64) {
        self.recent.push_back(now_ms);
        while self.recent.front().is_some_and(|&t| t < now_ms - 60_000) {
            self.recent.pop_front();
        }
        self.requests_seen += 1;
        self.data_dirty = true;
    }

    /// Rebuilds the view from the engine when data changed, at most every 250 ms, never while
    /// paused (the engine keeps consuming; only the picture stands still).
    pub fn refresh(&mut self, now_ms: i64) -> bool {
        self.now_ms = now_ms;
        if self.data_dirty
            && !self.paused
            && now_ms - self.last_view_ms >= self.redraw_interval_ms()
        {
            self.rebuild_view();
            self.rebuilt = true;
            self.last_view_ms = now_ms;
            self.data_dirty = false;
            self.needs_draw = true;
        }
        std::mem::take(&mut self.needs_draw)
    }

    pub fn redraw_interval_ms(&self) -> i64 {
        DATA_REDRAW_MS.max(self.rebuild_cost_ms.saturating_mul(REBUILD_COST_FACTOR))
    }

    /// Whether `refresh` rebuilt the view since the last call (the loop times rebuilds).
    pub fn take_rebuilt(&mut self) -> bool {
        std::mem::take(&mut self.rebuilt)
    }

    /// When the next data redraw is due, if one is pending.
    pub fn next_refresh_ms(&self) -> Option<i64> {
        (self.data_dirty && !self.paused).then_some(self.last_view_ms + self.redraw_interval_ms())
    }

    pub fn rebuild_view(&mut self) {
        let (report, _changes) = self.engine.refresh();
        self.view = View::build(report, &self.filter);
        self.view.curve = self.curve();
        self.view.prefixes = self.prefixes();
        for (i, pane) in Pane::ALL.iter().enumerate() {
            let len = self.pane_len(*pane);
            self.selected[i] = self.selected[i].min(len.saturating_sub(1));
        }
    }

    /// The hit-rate curve of the requests so far (LRU and FIFO at each capacity, the
    /// ceiling, the server's reuse), or `None` before the first simulated request.
    fn curve(&self) -> Option<Curve> {
        if self.cache.requests() == 0 {
            return None;
        }
        let points = self.cache.points();
        let share = |policy: Policy, label: &str| {
            points
                .iter()
                .find(|p| p.policy == policy && p.capacity.as_deref() == Some(label))
                .map_or(0.0, |p| p.hit_rate)
        };
        // Belady's optimal replays every block so far, so only while the chart shows it.
        let block_size = u64::from(self.block_model.block_size);
        let optimal = |label: &str| {
            let tokens = LIVE_CAPACITIES.iter().find(|(l, _)| *l == label)?.1;
            self.chart.then(|| {
                self.cache
                    .optimal_snapshot(&Capacity {
                        blocks: tokens / block_size,
                        label: label.to_string(),
                    })
                    .hit_rate
            })
        };
        Some(Curve {
            label: format!(
                "cold replay of {} requests, {}-token blocks",
                self.cache.requests(),
                self.block_model.block_size
            ),
            points: LIVE_CAPACITIES
                .iter()
                .map(|(label, _)| {
                    (
                        (*label).to_string(),
                        share(Policy::Lru, label),
                        share(Policy::Fifo, label),
                        optimal(label),
                    )
                })
                .collect(),
            ceiling: self.cache.ceiling().hit_rate,
            observed: (self.server_reuse.0 > 0)
                .then(|| self.server_reuse.1 as f64 / self.server_reuse.0 as f64),
        })
    }

    /// Both leaderboards, merged (the pane sorts by the key the user picked).
    fn prefixes(&self) -> Vec<PrefixItem> {
        let boards = self.cache.leaderboards(TOP_PREFIXES);
        let mut items: Vec<PrefixItem> = Vec::new();
        for group in boards.by_count.iter().chain(&boards.by_reusable_tokens) {
            let label = format!(
                "{} tok prefix ({:.0}% of reusable)",
                thousands(group.prefix_tokens),
                group.share_of_reusable * 100.0
            );
            if !items.iter().any(|i| {
                i.label == label
                    && i.count == group.count
                    && i.reusable_tokens == group.reusable_tokens
            }) {
                items.push(PrefixItem {
                    label,
                    count: group.count,
                    reusable_tokens: group.reusable_tokens,
                });
            }
        }
        items
    }

    pub fn pane_len(&self, pane: Pane) -> usize {
        match pane {
            Pane::Conversations => self.view.lanes.len(),
            Pane::Breaks => self.view.breaks.len(),
            Pane::Losses => self.view.losses.len(),
            Pane::HitRate => self.view.curve.as_ref().map_or(0, |c| c.points.len()),
            Pane::Prefixes => self.view.prefixes.len(),
        }
    }

    fn focus_index(&self) -> usize {
        Pane::ALL.iter().position(|p| *p == self.focus).unwrap_or(0)
    }

    /// The row id a selection points at, for the detail view.
    pub fn selected_row(&self) -> Option<u64> {
        let i = self.selected[self.focus_index()];
        match self.focus {
            Pane::Conversations => self
                .view
                .lanes
                .get(i)
                .and_then(|l| l.cells.last())
                .map(|c| c.id),
            Pane::Breaks => self.view.breaks.get(i).map(|b| b.id),
            _ => None,
        }
    }

    fn key(&mut self, key: KeyEvent) -> Action {
        let ctrl_c =
            key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c');
        if let Some(dialog) = self.dialog.as_mut() {
            match dialog {
                Dialog::Filter(area) => match key.code {
                    KeyCode::Enter => {
                        self.filter = area.lines().join(" ");
                        self.dialog = None;
                        self.rebuild_view();
                        self.status = Some(if self.filter.is_empty() {
                            "filter cleared".into()
                        } else {
                            format!("filter: {}", self.filter)
                        });
                    }
                    KeyCode::Esc => self.dialog = None,
                    _ => {
                        area.input(key);
                    }
                },
                Dialog::Export { format, name } => match key.code {
                    KeyCode::Enter => {
                        let path = name.lines().join("");
                        let format = EXPORT_FORMATS[*format].to_string();
                        self.dialog = None;
                        return Action::Export { format, path };
                    }
                    KeyCode::Esc => self.dialog = None,
                    KeyCode::Tab | KeyCode::Down => {
                        *format = (*format + 1) % EXPORT_FORMATS.len();
                        *name = name_area(&default_export_name(EXPORT_FORMATS[*format]));
                    }
                    KeyCode::BackTab | KeyCode::Up => {
                        *format = (*format + EXPORT_FORMATS.len() - 1) % EXPORT_FORMATS.len();
                        *name = name_area(&default_export_name(EXPORT_FORMATS[*format]));
                    }
                    _ => {
                        name.input(key);
                    }
                },
                Dialog::Help | Dialog::Detail(_) => {
                    if ctrl_c || key.code == KeyCode::Char('q') {
                        self.dialog = None;
                        return self.quit();
                    }
                    self.dialog = None;
                }
            }
            return Action::Redraw;
        }
        if ctrl_c {
            return self.quit();
        }
        let index = self.focus_index();
        match key.code {
            KeyCode::Char('q') => return self.quit(),
            KeyCode::Char('?') => self.dialog = Some(Dialog::Help),
            KeyCode::Tab | KeyCode::Right => self.focus = Pane::ALL[(index + 1) % Pane::ALL.len()],
            KeyCode::BackTab | KeyCode::Left => {
                self.focus = Pane::ALL[(index + Pane::ALL.len() - 1) % Pane::ALL.len()]
            }
            KeyCode::Down | KeyCode::Char('j') => {
                let len = self.pane_len(self.focus);
                self.selected[index] = (self.selected[index] + 1).min(len.saturating_sub(1));
            }
            KeyCode::Up | KeyCode::Char('k') => {
                self.selected[index] = self.selected[index].saturating_sub(1)
            }
            KeyCode::Enter => {
                if let Some(id) = self.selected_row() {
                    self.dialog = Some(Dialog::Detail(id));
                }
            }
            KeyCode::Char('p') | KeyCode::Char(' ') => {
                self.paused = !self.paused;
                if !self.paused {
                    self.data_dirty = true;
                }
                self.status = Some(if self.paused {
                    "view paused; recording goes on".into()
                } else {
                    "view resumed".into()
                });
            }
            KeyCode::Char('/') => {
                let mut area = TextArea::default();
                area.insert_str(&self.filter);
                self.dialog = Some(Dialog::Filter(area));
            }
            KeyCode::Char('s') => return Action::Snapshot,
            KeyCode::Char('e') => {
                self.dialog = Some(Dialog::Export {
                    format: 0,
                    name: name_area(&default_export_name("mooncake")),
                })
            }
            KeyCode::Char('c') => {
                self.chart = !self.chart;
                // The chart adds Belady's optimal, worked out now.
                if self.chart && !self.paused {
                    self.rebuild_view();
                }
            }
            KeyCode::Char('t') => self.prefixes_by_tokens = !self.prefixes_by_tokens,
            KeyCode::Char('m') => {
                self.mouse = !self.mouse;
                self.status = Some(format!("mouse {}", if self.mouse { "on" } else { "off" }));
            }
            KeyCode::Char('+') | KeyCode::Char('=') => return self.change_speed(2.0),
            KeyCode::Char('-') => return self.change_speed(0.5),
            KeyCode::Esc if !self.filter.is_empty() => {
                self.filter.clear();
                self.rebuild_view();
                self.status = Some("filter cleared".into());
            }
            _ => {}
        }
        Action::Redraw
    }

    fn change_speed(&mut self, factor: f64) -> Action {
        let Some(speed) = self.speed else {
            self.status = Some("speed applies to replays".into());
            return Action::Redraw;
        };
        let speed = (speed * factor).clamp(0.125, 1024.0);
        self.speed = Some(speed);
        self.status = Some(format!("replay speed ×{speed}"));
        Action::Speed(speed)
    }

    fn quit(&mut self) -> Action {
        if self.quitting || self.in_flight == 0 {
            return Action::ForceQuit;
        }
        self.quitting = true;
        self.status = Some(format!(
            "waiting for {} exchange(s) in flight; q again to quit now",
            self.in_flight
        ));
        Action::Quit
    }

    fn mouse_event(&mut self, mouse: MouseEvent) -> Action {
        if !self.mouse {
            return Action::None;
        }
        let index = self.focus_index();
        match mouse.kind {
            MouseEventKind::ScrollDown => {
                let len = self.pane_len(self.focus);
                self.selected[index] = (self.selected[index] + 1).min(len.saturating_sub(1));
            }
            MouseEventKind::ScrollUp => {
                self.selected[index] = self.selected[index].saturating_sub(1)
            }
            MouseEventKind::Down(MouseButton::Left) => {
                if let Some(pane) = super::ui::pane_at(mouse.column, mouse.row, self.last_size) {
                    self.focus = pane;
                }
            }
            _ => return Action::None,
        }
        self.needs_draw = true;
        Action::Redraw
    }
}

fn name_area(text: &str) -> TextArea<'static> {
    let mut area = TextArea::default();
    area.insert_str(text);
    area
}

pub fn default_export_name(format: &str) -> String {
    match format {
        "weka" | "otel" | "trace_synthetic" | "mooncake" | "bailian" => {
            format!("prefixscope-{format}.jsonl")
        }
        other => format!("prefixscope-{other}"),
    }
}
