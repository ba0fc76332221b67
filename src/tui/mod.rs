//! The terminal UI edge: ratatui + crossterm over the pure engine.
//!
//! `run` is generic over the ratatui `Backend` and takes its inputs (one event channel, a clock,
//! the edge's controls), so tests drive the real app on a `TestBackend`.

pub mod app;
pub mod event;
pub mod panes;
pub mod theme;
pub mod ui;
pub mod view;

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use ratatui::Terminal;
use ratatui::backend::Backend;

use app::{Action, App};
use event::Event;
use theme::Theme;

pub trait Clock {
    fn now_ms(&self) -> i64;
}

pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }
}

/// A clock that stands still (tests, goldens).
pub struct FixedClock(pub i64);

impl Clock for FixedClock {
    fn now_ms(&self) -> i64 {
        self.0
    }
}

/// What the app can ask of the edge that feeds it.
pub trait Control {
    fn set_speed(&self, _speed: f64) {}
    /// Stop accepting (the proxy) or reading (a replay); `Event::ProxyStopped` follows.
    fn stop(&self) {}
    fn in_flight(&self) -> u64 {
        0
    }
    fn records_written(&self) -> Option<u64> {
        None
    }
    fn upstream_ok(&self) -> Option<bool> {
        None
    }
    /// Writes an export of what was recorded or replayed so far (read back from disk: the app
    /// keeps no bodies); returns what to show.
    fn export(&self, _format: &str, _path: &str) -> Result<String, String> {
        Err("export is not available in this build".into())
    }
}

pub struct NoControl;
impl Control for NoControl {}

/// The loop: wait for an event (or the next capped redraw), apply it, draw when something
/// changed. Nothing happens while nothing happens: no busy loop, no redraw of a static screen.
pub fn run<B: Backend>(
    terminal: &mut Terminal<B>,
    app: &mut App,
    events: &Receiver<Event>,
    clock: &dyn Clock,
    control: &dyn Control,
    theme: &Theme,
) -> io::Result<()> {
    let mut last_rate = -1.0;
    loop {
        let now = clock.now_ms();
        app.in_flight = control.in_flight();
        app.records_written = control.records_written();
        app.upstream_ok = control.upstream_ok().or(app.upstream_ok);
        let rate = app.requests_per_second();
        if rate != last_rate {
            app.needs_draw = true;
            last_rate = rate;
        }
        let draw = app.refresh(now);
        if app.take_rebuilt() {
            app.rebuild_cost_ms = clock.now_ms() - now;
        }
        if draw {
            let size = terminal.size()?;
            app.last_size = (size.width, size.height);
            terminal.draw(|frame| ui::draw(frame, app, theme))?;
        }
        let wait = match app.next_refresh_ms() {
            Some(due) => (due - now).clamp(1, app::DATA_REDRAW_MS),
            None => 1000,
        };
        let first = match events.recv_timeout(Duration::from_millis(wait as u64)) {
            Ok(event) => event,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return Ok(()),
        };
        // Apply everything already waiting before drawing once.
        for event in std::iter::once(first).chain(events.try_iter().take(50_000)) {
            match app.handle(event, clock.now_ms()) {
                Action::ForceQuit => return Ok(()),
                Action::Quit => control.stop(),
                Action::Speed(speed) => control.set_speed(speed),
                Action::Snapshot => {
                    app.status = Some(match write_snapshot(app, clock.now_ms()) {
                        Ok(paths) => format!("snapshot written: {paths}"),
                        Err(e) => format!("snapshot failed: {e}"),
                    });
                }
                Action::Export { format, path } => {
                    app.status = Some(match control.export(&format, &path) {
                        Ok(message) => message,
                        Err(e) => format!("export failed: {e}"),
                    });
                }
                Action::None | Action::Redraw => {}
            }
        }
    }
}

/// `prefixscope-snapshot-<ms>.json` (the report) and `.txt` (its summary), in the working
/// directory.
fn write_snapshot(app: &App, now_ms: i64) -> Result<String, String> {
    let report = app.report();
    let base = PathBuf::from(format!("prefixscope-snapshot-{now_ms}"));
    let json = base.with_extension("json");
    let text = base.with_extension("txt");
    let body = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
    std::fs::write(&json, body + "\n").map_err(|e| format!("{}: {e}", json.display()))?;
    std::fs::write(&text, report.summary()).map_err(|e| format!("{}: {e}", text.display()))?;
    Ok(format!("{} and {}", json.display(), text.display()))
}

/// Terminal set-up for a real TTY, undone on every exit: the guard's `Drop` for returns and
/// errors, the panic hook for panics (restore first, then print the panic).
pub mod terminal {
    use std::io::{self, Stdout};

    use crossterm::event::{DisableMouseCapture, EnableMouseCapture};
    use crossterm::execute;
    use crossterm::terminal::{
        EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
    };
    use ratatui::Terminal;
    use ratatui::backend::CrosstermBackend;

    pub struct Guard {
        pub terminal: Terminal<CrosstermBackend<Stdout>>,
    }

    pub fn restore() {
        let _ = disable_raw_mode();
        let _ = execute!(
            io::stdout(),
            DisableMouseCapture,
            LeaveAlternateScreen,
            crossterm::cursor::Show
        );
    }

    pub fn enter(mouse: bool) -> io::Result<Guard> {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            previous(info);
        }));
        enable_raw_mode()?;
        let mut stdout = io::stdout();
        execute!(stdout, EnterAlternateScreen)?;
        if mouse {
            execute!(stdout, EnableMouseCapture)?;
        }
        let terminal = Terminal::new(CrosstermBackend::new(stdout))?;
        Ok(Guard { terminal })
    }

    impl Drop for Guard {
        fn drop(&mut self) {
            restore();
        }
    }
}

/// Terminal input on its own thread, into the one channel.
pub fn spawn_input(events: Sender<Event>) {
    std::thread::spawn(move || {
        use crossterm::event::{Event as Term, read};
        while let Ok(event) = read() {
            let event = match event {
                Term::Key(key) => Event::Key(key),
                Term::Mouse(mouse) => Event::Mouse(mouse),
                Term::Resize(w, h) => Event::Resize(w, h),
                _ => continue,
            };
            if events.send(event).is_err() {
                return;
            }
        }
    });
}
