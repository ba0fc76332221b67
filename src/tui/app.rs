//! The app's state and how events change it. `handle` may change state; drawing (`ui.rs`) only
//! reads it. Effects that touch the disk or the proxy are returned to the loop as `Action`s.

use crossterm::event::{
    KeyCode, KeyEvent, KeyEventKind, KeyModifiers, MouseButton, MouseEvent, MouseEventKind,
};
use tui_textarea::TextArea;

use std::sync::Arc;

use super::event::Event;
use super::view::View;
use prefixscope_core::live::{Command, Snapshot};

pub use prefixscope_core::live::LIVE_BLOCK_SIZE;

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
    /// A trace read as cache requests (the name of its format): hit rate and
    /// prefixes only.
    RequestsOnly(String),
}

pub enum Dialog {
    /// Keys, glyphs and figures (scrolled by `scroll` lines).
    Help {
        scroll: u16,
    },
    /// One request: its cause, cost, what changed and the fix (scrolled by `scroll` lines).
    Detail {
        id: u64,
        scroll: u16,
    },
    /// A top prefix (its index in the pane's order): what it is made of, its figures.
    Prefix {
        index: usize,
        scroll: u16,
    },
    /// A client (its index in the Loss pane): what it suffered and caused, by cause.
    Client {
        index: usize,
        scroll: u16,
    },
    /// The findings by cost with their fixes and savings; `selected` is a finding.
    Findings {
        selected: usize,
    },
    /// The capacity view in llama.cpp's terms: `-np` 1/2/4/8 × `--cache-ram` off/on, simulated.
    Capacity {
        scroll: u16,
    },
    /// Who cost whom: clients × clients, from `evicted_by`.
    WhoCostWhom {
        scroll: u16,
    },
    /// The rows of a finding (its index in the findings view).
    FindingRows {
        index: usize,
        selected: usize,
    },
    Filter(TextArea<'static>),
    /// Where to read on to in a replay: a record number or a time (`g`).
    Seek(TextArea<'static>),
    Export {
        format: usize,
        name: TextArea<'static>,
    },
}

pub use prefixscope_core::export::TARGET_NAMES as EXPORT_FORMATS;

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
    /// A replay's reading held (`true`) or let go on; the loop falls back to pausing the view
    /// when the source cannot be held.
    PauseSource(bool),
    /// While the replay is held: read this many more records.
    Step(u64),
    /// A replay: read on at once to a record or a time, then hold there.
    Seek(crate::tui::Seek),
    /// Write the open view's text to `prefixscope-<what>-<ms>.txt` (0600): the lines shown.
    WriteView(String, Vec<String>),
    /// Work for the live engine (a filter, the chart's optimal replay): its answer comes back
    /// as a new snapshot.
    Engine(Command),
}

pub struct App {
    pub source: Source,
    pub input: Input,
    /// The latest snapshot shown (drawing reads this and the UI state below, nothing else).
    pub snapshot: Arc<Snapshot>,
    /// While paused: the newest snapshot, shown when the view resumes.
    held: Option<Arc<Snapshot>>,
    pub focus: Pane,
    pub selected: [usize; 5],
    pub paused: bool,
    /// The replay's reading is held (`p` in a replay): the view stays live, `.` steps.
    pub source_paused: bool,
    pub filter: String,
    pub dialog: Option<Dialog>,
    /// Where Esc goes back to: the views opened before the one shown.
    pub back: Vec<Dialog>,
    /// The turn selected in the selected lane (its index; `None`: the newest).
    pub cell: Option<usize>,
    /// The focused pane fills the screen.
    pub zoom: bool,
    pub status: Option<String>,
    pub warnings: u64,
    pub records_written: Option<u64>,
    pub in_flight: u64,
    pub upstream_ok: Option<bool>,
    /// `Control::proxy_notes`, shown on the status bar.
    pub proxy_notes: Vec<String>,
    pub speed: Option<f64>,
    pub source_done: bool,
    pub quitting: bool,
    pub mouse: bool,
    pub chart: bool,
    pub prefixes_by_tokens: bool,
    pub now_ms: i64,
    pub needs_draw: bool,
    /// The terminal size at the last draw, for mouse hit-testing (set by the loop).
    pub last_size: (u16, u16),
    /// Frames drawn so far (the loop counts them).
    pub frames_drawn: u64,
    /// When measured: for each key, µs from the loop taking it to the end of the draw that
    /// shows it.
    pub key_latency_us: Option<Vec<u64>>,
}

impl App {
    /// An app showing `snapshot` (an empty engine's, before any record).
    pub fn new(source: Source, snapshot: Arc<Snapshot>) -> App {
        App {
            source,
            input: Input::Exchanges,
            snapshot,
            held: None,
            focus: Pane::Conversations,
            selected: [0; 5],
            paused: false,
            source_paused: false,
            filter: String::new(),
            dialog: None,
            back: Vec::new(),
            cell: None,
            zoom: false,
            status: None,
            warnings: 0,
            records_written: None,
            in_flight: 0,
            upstream_ok: None,
            proxy_notes: Vec::new(),
            speed: None,
            source_done: false,
            quitting: false,
            mouse: true,
            chart: false,
            prefixes_by_tokens: false,
            now_ms: 0,
            needs_draw: true,
            last_size: (0, 0),
            frames_drawn: 0,
            key_latency_us: None,
        }
    }

    /// The newest snapshot the app was given: the one on screen, or the one held while paused.
    pub fn newest_snapshot(&self) -> Arc<Snapshot> {
        match &self.held {
            Some(held) if held.generation > self.snapshot.generation => Arc::clone(held),
            _ => Arc::clone(&self.snapshot),
        }
    }

    pub fn view(&self) -> &View {
        &self.snapshot.view
    }

    pub fn requests(&self) -> u64 {
        self.snapshot.requests
    }

    pub fn requests_per_second(&self) -> f64 {
        self.snapshot.requests_per_second(self.now_ms)
    }

    pub fn handle(&mut self, event: Event, now_ms: i64) -> Action {
        self.now_ms = now_ms;
        match event {
            Event::Snapshot(snapshot) => {
                self.show(snapshot);
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
            Event::Signal(name) => {
                self.needs_draw = true;
                if self.quitting {
                    // Already waiting for the exchanges in flight; a second signal forces.
                    return Action::None;
                }
                let action = self.quit();
                if action == Action::Quit {
                    self.status = Some(format!(
                        "{name}: waiting for {} in flight; a second signal quits now",
                        prefixscope_core::units::plural(self.in_flight, "exchange")
                    ));
                }
                action
            }
            // Nothing can be drawn or typed: end the loop now; the edge's shutdown (the proxy
            // answering what is in flight, the recorder's last records) runs as after `q`.
            Event::TerminalLost(why) => {
                self.status = Some(why.to_string());
                Action::ForceQuit
            }
            Event::Warning(text) => {
                self.warnings += 1;
                self.status = Some(text);
                self.needs_draw = true;
                Action::None
            }
            Event::Notice(text) => {
                self.status = Some(text);
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

    /// A new snapshot: shown at once, or held while the view is paused.
    pub fn show(&mut self, snapshot: Arc<Snapshot>) {
        if snapshot.generation < self.snapshot.generation {
            return;
        }
        if self.paused {
            self.held = Some(snapshot);
            return;
        }
        if snapshot.source_done && !self.source_done {
            self.source_done = true;
            self.status = Some("replay finished".into());
        }
        self.snapshot = snapshot;
        for (i, pane) in Pane::ALL.iter().enumerate() {
            let len = self.pane_len(*pane);
            self.selected[i] = self.selected[i].min(len.saturating_sub(1));
        }
        self.needs_draw = true;
    }

    /// Whether something changed since the last draw (and forget it: the loop draws now).
    pub fn take_needs_draw(&mut self) -> bool {
        std::mem::take(&mut self.needs_draw)
    }

    pub fn pane_len(&self, pane: Pane) -> usize {
        match pane {
            Pane::Conversations => self.view().lanes.len(),
            Pane::Breaks => self.view().breaks.len(),
            Pane::Losses => self.view().losses.len() + self.view().unattributed.len(),
            Pane::HitRate => self.view().curve.as_ref().map_or(0, |c| c.points.len()),
            Pane::Prefixes => self.view().prefixes.len(),
        }
    }

    fn focus_index(&self) -> usize {
        Pane::ALL.iter().position(|p| *p == self.focus).unwrap_or(0)
    }

    /// The turn selected in the selected lane: the cell cursor, or the newest.
    pub fn selected_cell(&self) -> Option<usize> {
        let lane = self.view().lanes.get(self.selected[0])?;
        let last = lane.cells.len().checked_sub(1)?;
        Some(self.cell.map_or(last, |c| c.min(last)))
    }

    /// The row id a selection points at, for the detail view.
    pub fn selected_row(&self) -> Option<u64> {
        let i = self.selected[self.focus_index()];
        match self.focus {
            Pane::Conversations => {
                let cell = self.selected_cell()?;
                self.view()
                    .lanes
                    .get(i)
                    .and_then(|l| l.cells.get(cell))
                    .map(|c| c.id)
            }
            Pane::Breaks => self.view().breaks.get(i).map(|b| b.id),
            _ => None,
        }
    }

    /// The top prefixes in the pane's order (by count, or by reusable tokens with `t`).
    pub fn prefix_items(&self) -> Vec<&prefixscope_core::live::view::PrefixItem> {
        let mut items: Vec<_> = self.view().prefixes.iter().collect();
        if self.prefixes_by_tokens {
            items.sort_by_key(|p| std::cmp::Reverse(p.reusable_tokens));
        } else {
            items.sort_by_key(|p| std::cmp::Reverse(p.count));
        }
        items
    }

    /// Opens `dialog` over the one shown (Esc comes back to it).
    fn open(&mut self, dialog: Dialog) {
        if let Some(shown) = self.dialog.take() {
            self.back.push(shown);
        }
        self.dialog = Some(dialog);
    }

    /// Esc: the view before, or the panes. Leaving the findings view tells the engine.
    fn go_back(&mut self) -> Action {
        let left = self.dialog.take();
        self.dialog = self.back.pop();
        let still_open =
            |pick: fn(&Dialog) -> bool| self.back.iter().chain(self.dialog.as_ref()).any(pick);
        match left {
            Some(Dialog::Findings { .. })
                if !still_open(|d| matches!(d, Dialog::Findings { .. })) =>
            {
                Action::Engine(Command::Advice(false))
            }
            Some(Dialog::Capacity { .. }) => Action::Engine(Command::Capacity(false)),
            _ => Action::Redraw,
        }
    }

    /// How many entries the findings view lists (0 until the engine worked them out).
    pub fn advice_len(&self) -> usize {
        self.snapshot.advice_ready().map_or(0, <[_]>::len)
    }

    /// The keys of a view (Detail, Prefix, Client, Findings, FindingRows); `None`: not one.
    fn view_key(&mut self, key: KeyEvent) -> Option<Action> {
        // Where the view's last page starts: scrolling stops there, so ↑ moves at once.
        let end = super::panes::views::view_end(self, &super::theme::Theme::plain());
        let page = |scroll: &mut u16, code: KeyCode| {
            match code {
                KeyCode::Down | KeyCode::Char('j') => *scroll = scroll.saturating_add(1),
                KeyCode::Up | KeyCode::Char('k') => *scroll = scroll.saturating_sub(1),
                KeyCode::PageDown | KeyCode::Char(' ') => *scroll = scroll.saturating_add(10),
                KeyCode::PageUp => *scroll = scroll.saturating_sub(10),
                KeyCode::Home => *scroll = 0,
                KeyCode::End => *scroll = end,
                _ => {}
            }
            *scroll = (*scroll).min(end);
        };
        let advice_len = self.advice_len();
        let rows_of = |app: &App, index: usize| {
            app.snapshot
                .advice_ready()
                .and_then(|a| a.get(index))
                .map_or(0, |a| a.finding.rows.len())
        };
        let rows_len = match &self.dialog {
            Some(Dialog::FindingRows { index, .. }) => rows_of(self, *index),
            _ => 0,
        };
        let code = key.code;
        let back = matches!(code, KeyCode::Esc | KeyCode::Backspace | KeyCode::Left);
        // `v` in a turn: the request that evicted it; `u` in a subagent's turn: the request
        // whose tool call its conversation answers. Esc comes back to this one.
        if let (Some(Dialog::Detail { id, .. }), KeyCode::Char(key @ ('v' | 'u'))) =
            (&self.dialog, code)
        {
            let row = self.snapshot.row(*id);
            let (to, none) = match key {
                'v' => (
                    row.and_then(|row| row.evicted_by.as_ref().map(|by| by.row)),
                    "v: no request evicted this turn",
                ),
                _ => (
                    row.and_then(|row| super::panes::views::spawner_of(self, &row)),
                    "u: this turn's conversation is no subagent",
                ),
            };
            match to {
                Some(to) if self.snapshot.row(to).is_some() => {
                    self.open(Dialog::Detail { id: to, scroll: 0 });
                }
                Some(to) => self.status = Some(format!("request #{to} is not in the current view")),
                None => self.status = Some(none.into()),
            }
            return Some(Action::Redraw);
        }
        match self.dialog.as_mut()? {
            Dialog::Detail { scroll, .. }
            | Dialog::Prefix { scroll, .. }
            | Dialog::Client { scroll, .. }
            | Dialog::Capacity { scroll }
            | Dialog::WhoCostWhom { scroll } => {
                if back {
                    return Some(self.go_back());
                }
                page(scroll, code);
            }
            Dialog::Findings { selected } => match code {
                _ if back => return Some(self.go_back()),
                _ if moves_in_list(code) => *selected = moved_in_list(*selected, advice_len, code),
                KeyCode::Enter | KeyCode::Right => {
                    let index = *selected;
                    if rows_of(self, index) > 0 {
                        self.open(Dialog::FindingRows { index, selected: 0 });
                    }
                }
                _ => {}
            },
            Dialog::FindingRows { index, selected } => {
                let (index, len) = (*index, rows_len);
                match code {
                    _ if back => return Some(self.go_back()),
                    _ if moves_in_list(code) => *selected = moved_in_list(*selected, len, code),
                    KeyCode::Enter | KeyCode::Right => {
                        let row = self
                            .snapshot
                            .advice_ready()
                            .and_then(|a| a.get(index))
                            .and_then(|a| a.finding.rows.get(*selected).copied());
                        if let Some(id) = row {
                            self.open(Dialog::Detail { id, scroll: 0 });
                        }
                    }
                    _ => {}
                }
            }
            _ => return None,
        }
        Some(Action::Redraw)
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
                        self.status = Some(if self.filter.is_empty() {
                            "filter cleared".into()
                        } else {
                            format!("filter: {} (names and message text)", self.filter)
                        });
                        return Action::Engine(Command::Filter(self.filter.clone()));
                    }
                    KeyCode::Esc => self.dialog = None,
                    _ => {
                        area.input(key);
                    }
                },
                Dialog::Seek(area) => match key.code {
                    KeyCode::Enter => {
                        let typed = area.lines().join("");
                        self.dialog = None;
                        match crate::tui::Seek::parse(&typed) {
                            Ok(to) => return Action::Seek(to),
                            Err(why) => self.status = Some(format!("seek: {why}")),
                        }
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
                Dialog::Help { .. } => {
                    // Scrolling stops at the last page, so ↑ moves at once.
                    let end = super::panes::views::view_end(self, &super::theme::Theme::plain());
                    let Some(Dialog::Help { scroll }) = self.dialog.as_mut() else {
                        return Action::Redraw;
                    };
                    if ctrl_c || key.code == KeyCode::Char('q') {
                        self.dialog = None;
                        self.back.clear();
                        return self.quit();
                    }
                    // ↑ ↓ scroll it; any other key closes it.
                    match key.code {
                        KeyCode::Down | KeyCode::Char('j') => *scroll = scroll.saturating_add(1),
                        KeyCode::Up | KeyCode::Char('k') => *scroll = scroll.saturating_sub(1),
                        KeyCode::PageDown => *scroll = scroll.saturating_add(10),
                        KeyCode::PageUp => *scroll = scroll.saturating_sub(10),
                        _ => {
                            self.dialog = self.back.pop();
                            return Action::Redraw;
                        }
                    }
                    *scroll = (*scroll).min(end);
                }
                _ => {
                    if ctrl_c || key.code == KeyCode::Char('q') {
                        self.dialog = None;
                        self.back.clear();
                        return self.quit();
                    }
                    if key.code == KeyCode::Char('?') {
                        self.open(Dialog::Help { scroll: 0 });
                        return Action::Redraw;
                    }
                    if key.code == KeyCode::Char('s') {
                        // The snapshot is of everything, whichever view is open.
                        return Action::Snapshot;
                    }
                    if key.code == KeyCode::Char('o') {
                        // The view's whole text to a file, to read or copy outside.
                        let theme = super::theme::Theme::plain();
                        let (name, lines) = super::panes::views::plain_text(self, &theme);
                        if !lines.is_empty() {
                            return Action::WriteView(name, lines);
                        }
                        return Action::Redraw;
                    }
                    // A pane's key in a view says where it works rather than doing nothing.
                    let in_turn = matches!(self.dialog, Some(Dialog::Detail { .. }));
                    if let KeyCode::Char(c) = key.code
                        && !matches!(c, 'j' | 'k' | ' ')
                        && !(in_turn && matches!(c, 'v' | 'u'))
                    {
                        self.status = Some(format!(
                            "{c}: a key of the panes, not of this view (Esc goes back)"
                        ));
                        return Action::Redraw;
                    }
                    return self.view_key(key).unwrap_or(Action::Redraw);
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
            KeyCode::Char('?') => self.dialog = Some(Dialog::Help { scroll: 0 }),
            // Inside a lane, ← → move along its turns (Home / End: the oldest, the newest).
            KeyCode::Left | KeyCode::Char('h') if self.focus == Pane::Conversations => {
                self.cell = self.selected_cell().map(|c| c.saturating_sub(1));
            }
            KeyCode::Right | KeyCode::Char('l') if self.focus == Pane::Conversations => {
                let last = self
                    .view()
                    .lanes
                    .get(self.selected[0])
                    .map_or(0, |l| l.cells.len().saturating_sub(1));
                self.cell = self.selected_cell().map(|c| (c + 1).min(last));
            }
            KeyCode::Home if self.focus == Pane::Conversations => self.cell = Some(0),
            KeyCode::End if self.focus == Pane::Conversations => self.cell = None,
            KeyCode::Tab | KeyCode::Right => self.focus = Pane::ALL[(index + 1) % Pane::ALL.len()],
            KeyCode::BackTab | KeyCode::Left => {
                self.focus = Pane::ALL[(index + Pane::ALL.len() - 1) % Pane::ALL.len()]
            }
            KeyCode::Down | KeyCode::Char('j') => {
                let len = self.pane_len(self.focus);
                let before = self.selected[index];
                self.selected[index] = (self.selected[index] + 1).min(len.saturating_sub(1));
                if self.focus == Pane::Conversations && before != self.selected[index] {
                    self.cell = self.keep_turn(before);
                }
            }
            KeyCode::Up | KeyCode::Char('k') => {
                let before = self.selected[index];
                self.selected[index] = self.selected[index].saturating_sub(1);
                if self.focus == Pane::Conversations && before != self.selected[index] {
                    self.cell = self.keep_turn(before);
                }
            }
            KeyCode::Enter => match self.focus {
                Pane::Conversations | Pane::Breaks => {
                    if let Some(id) = self.selected_row() {
                        self.open(Dialog::Detail { id, scroll: 0 });
                    }
                }
                Pane::Prefixes if !self.view().prefixes.is_empty() => self.open(Dialog::Prefix {
                    index: self.selected[index],
                    scroll: 0,
                }),
                Pane::Losses if self.selected[index] < self.view().losses.len() => {
                    self.open(Dialog::Client {
                        index: self.selected[index],
                        scroll: 0,
                    })
                }
                Pane::HitRate if self.input == Input::Exchanges => {
                    self.open(Dialog::Capacity { scroll: 0 });
                    return Action::Engine(Command::Capacity(true));
                }
                _ => {}
            },
            KeyCode::Char('f') => {
                self.open(Dialog::Findings { selected: 0 });
                return Action::Engine(Command::Advice(true));
            }
            KeyCode::Char('z') => self.zoom = !self.zoom,
            KeyCode::Char('w') => self.open(Dialog::WhoCostWhom { scroll: 0 }),
            KeyCode::Char('p') | KeyCode::Char(' ')
                if matches!(self.source, Source::Replay { .. })
                    && self.speed.is_some()
                    && !self.source_done =>
            {
                // A replay: hold its reading itself (the loop asks the pacer).
                return Action::PauseSource(!self.source_paused);
            }
            KeyCode::Char('g')
                if matches!(self.source, Source::Replay { .. })
                    && self.speed.is_some()
                    && !self.source_done =>
            {
                self.dialog = Some(Dialog::Seek(TextArea::default()));
            }
            KeyCode::Char('g') => {
                self.status = Some(match self.source {
                    _ if self.source_done => "seek: the replay has finished".into(),
                    Source::Replay { .. } => {
                        "seek: an --instant replay reads every record at once".into()
                    }
                    Source::Live { .. } => "seek applies to replays".into(),
                });
            }
            KeyCode::Char('.') if self.source_paused => return Action::Step(1),
            KeyCode::Char(']') if self.source_paused => return Action::Step(10),
            KeyCode::Char('p') | KeyCode::Char(' ') => {
                self.paused = !self.paused;
                if !self.paused
                    && let Some(snapshot) = self.held.take()
                {
                    self.show(snapshot);
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
                // The chart adds Belady's optimal, which the engine works out for it.
                return Action::Engine(Command::Chart(self.chart));
            }
            KeyCode::Char('t') => self.prefixes_by_tokens = !self.prefixes_by_tokens,
            KeyCode::Char('m') => {
                self.mouse = !self.mouse;
                self.status = Some(format!("mouse {}", if self.mouse { "on" } else { "off" }));
            }
            KeyCode::Char('+') | KeyCode::Char('=') => return self.change_speed(2.0),
            KeyCode::Char('-') => return self.change_speed(0.5),
            KeyCode::Esc if self.zoom => self.zoom = false,
            KeyCode::Esc if !self.filter.is_empty() => {
                self.filter.clear();
                self.status = Some("filter cleared".into());
                return Action::Engine(Command::Filter(String::new()));
            }
            _ => {}
        }
        Action::Redraw
    }

    /// The cell cursor after moving from lane `from` to the selected one: the same turn number
    /// where the new lane has it, else the newest.
    fn keep_turn(&self, from: usize) -> Option<usize> {
        let lanes = &self.view().lanes;
        let cell = self.cell?;
        let turn = lanes.get(from)?.cells.get(cell)?.turn;
        lanes
            .get(self.selected[0])?
            .cells
            .iter()
            .position(|c| c.turn == turn)
    }

    fn change_speed(&mut self, factor: f64) -> Action {
        let Some(speed) = self.speed else {
            self.status = Some("speed applies to replays".into());
            return Action::Redraw;
        };
        let speed = (speed * factor).clamp(
            prefixscope_core::limits::MIN_SPEED,
            prefixscope_core::limits::MAX_SPEED,
        );
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
            "waiting for {} in flight; q again to quit now",
            prefixscope_core::units::plural(self.in_flight, "exchange")
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
            MouseEventKind::Down(MouseButton::Left) if self.dialog.is_none() => {
                let zoom = self.zoom.then_some(self.focus);
                if let Some(pane) =
                    super::ui::pane_at(mouse.column, mouse.row, self.last_size, zoom)
                {
                    self.focus = pane;
                    // A click on a lane selects it, on a cell that turn.
                    if pane == Pane::Conversations
                        && let Some(rect) = super::ui::pane_rect(pane, self.last_size, zoom)
                        && let Some((lane, cell)) = super::panes::conversations::cell_at(
                            self,
                            rect.inner(ratatui::layout::Margin::new(1, 1)),
                            mouse.column,
                            mouse.row,
                        )
                    {
                        self.selected[0] = lane;
                        self.cell = cell;
                    }
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

/// The keys that move a list's selection (`moved_in_list`).
fn moves_in_list(code: KeyCode) -> bool {
    matches!(
        code,
        KeyCode::Down
            | KeyCode::Char('j')
            | KeyCode::Up
            | KeyCode::Char('k')
            | KeyCode::PageDown
            | KeyCode::PageUp
            | KeyCode::Home
            | KeyCode::End
    )
}

/// A list's selection after a key: one step, a page of 10, or an end (`len` entries).
fn moved_in_list(selected: usize, len: usize, code: KeyCode) -> usize {
    let last = len.saturating_sub(1);
    match code {
        KeyCode::Down | KeyCode::Char('j') => (selected + 1).min(last),
        KeyCode::Up | KeyCode::Char('k') => selected.saturating_sub(1),
        KeyCode::PageDown => (selected + 10).min(last),
        KeyCode::PageUp => selected.saturating_sub(10),
        KeyCode::Home => 0,
        KeyCode::End => last,
        _ => selected,
    }
}
