//! The terminal UI edge: ratatui + crossterm over the pure engine.
//!
//! `run` is generic over the ratatui `Backend` and takes its inputs (one event channel, a clock,
//! the edge's controls), so tests drive the real app on a `TestBackend`.

pub mod app;
pub mod event;
pub mod panes;
mod seek;
pub mod theme;
pub mod ui;
pub mod view;

pub use seek::Seek;

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use ratatui::Terminal;
use ratatui::backend::Backend;

use app::{Action, App};
use event::Event;
use prefixscope_core::live::{Command, Snapshot};
use theme::Theme;

pub trait Clock {
    fn now_ms(&self) -> i64;
}

pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        crate::clock::wall_clock_ms()
    }
}

/// What the app can ask of the edge that feeds it.
pub trait Control {
    fn set_speed(&self, _speed: f64) {}
    /// Stop accepting (the proxy) or reading (a replay); `Event::ProxyStopped` follows.
    fn stop(&self) {}
    /// Hold (or let go on) what feeds the view: a replay's reading. Whether the source can be
    /// held (a proxy cannot: the recording goes on).
    fn pause_source(&self, _paused: bool) -> bool {
        false
    }
    /// While the source is held: `records` more, at once.
    fn step_source(&self, _records: u64) {}
    /// Reads on to `to` and holds there (a replay); what to say, or why not.
    fn seek_source(&self, _to: Seek) -> Result<String, String> {
        Err("seek applies to replays".into())
    }
    fn in_flight(&self) -> u64 {
        0
    }
    fn records_written(&self) -> Option<u64> {
        None
    }
    fn upstream_ok(&self) -> Option<bool> {
        None
    }
    /// What the proxy wants said on the status bar: why the upstream is down, requests the HTTP
    /// parser refused, connections not accepted.
    fn proxy_notes(&self) -> Vec<String> {
        Vec::new()
    }
    /// Writes an export of what was recorded or replayed so far (read back from disk: the app
    /// keeps no bodies); returns what to show.
    fn export(&self, _format: &str, _path: &str) -> Result<String, String> {
        Err("export is not available in this build".into())
    }
    /// Hands work to the live engine. An engine on its own thread answers with a snapshot
    /// event later (`None` here); a synchronous one (tests) may answer at once.
    fn command(&self, _command: Command) -> Option<Arc<Snapshot>> {
        None
    }
}

/// Events applied before drawing once: keys are few, snapshots are capped by the engine.
const EVENT_BATCH: usize = 1024;

/// The loop: wait for an event, apply it, draw when something changed. Nothing happens while
/// nothing happens: no busy loop, no redraw of a static screen. Records never reach this
/// thread: the live engine consumes them and sends snapshots.
pub fn run<B: Backend>(
    terminal: &mut Terminal<B>,
    app: &mut App,
    events: &Receiver<Event>,
    clock: &dyn Clock,
    control: &dyn Control,
    theme: &Theme,
) -> io::Result<()> {
    let mut last_rate = -1.0;
    // Keys applied since the last draw, with when the loop took them (key latency).
    let mut keys_waiting: Vec<Instant> = Vec::new();
    loop {
        app.now_ms = clock.now_ms();
        // The status bar shows these: a change alone is worth a frame.
        let (in_flight, written) = (control.in_flight(), control.records_written());
        if (in_flight, written) != (app.in_flight, app.records_written) {
            app.needs_draw = true;
        }
        app.in_flight = in_flight;
        app.records_written = written;
        let upstream_ok = control.upstream_ok().or(app.upstream_ok);
        if upstream_ok != app.upstream_ok {
            app.needs_draw = true;
        }
        app.upstream_ok = upstream_ok;
        let notes = control.proxy_notes();
        if notes != app.proxy_notes {
            app.needs_draw = true;
            app.proxy_notes = notes;
        }
        let rate = app.requests_per_second();
        if rate != last_rate {
            app.needs_draw = true;
            last_rate = rate;
        }
        if app.take_needs_draw() {
            let size = terminal.size()?;
            app.last_size = (size.width, size.height);
            terminal.draw(|frame| {
                ui::draw(frame, app, theme);
                scrub_controls(frame.buffer_mut());
            })?;
            app.frames_drawn += 1;
            if let Some(latencies) = app.key_latency_us.as_mut() {
                for taken in keys_waiting.drain(..) {
                    latencies.push(u64::try_from(taken.elapsed().as_micros()).unwrap_or(u64::MAX));
                }
            }
            keys_waiting.clear();
        }
        // Rates and "n s ago" change with time alone: look again every second.
        let first = match events.recv_timeout(Duration::from_millis(1000)) {
            Ok(event) => event,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return Ok(()),
        };
        for event in std::iter::once(first).chain(events.try_iter().take(EVENT_BATCH)) {
            if matches!(event, Event::Key(_)) {
                keys_waiting.push(Instant::now());
            }
            match app.handle(event, clock.now_ms()) {
                Action::ForceQuit => return Ok(()),
                Action::Quit => control.stop(),
                Action::Speed(speed) => control.set_speed(speed),
                Action::PauseSource(paused) => {
                    if control.pause_source(paused) {
                        // The replay itself stops: the view stays live for steps.
                        app.source_paused = paused;
                        app.paused = false;
                        app.status = Some(if paused {
                            "replay paused: no record is read; . reads one, p resumes".into()
                        } else {
                            "replay resumed".into()
                        });
                    }
                }
                Action::Step(records) => {
                    if app.source_paused {
                        control.step_source(records);
                        app.status = Some(format!(
                            "reading {} at once; p resumes",
                            prefixscope_core::units::plural(records, "record")
                        ));
                    }
                }
                Action::Seek(to) => {
                    app.status = Some(match control.seek_source(to) {
                        Ok(said) => {
                            app.source_paused = true;
                            app.paused = false;
                            said
                        }
                        Err(why) => why,
                    });
                }
                Action::WriteView(what, lines) => {
                    let path = PathBuf::from(format!("prefixscope-{what}-{}.txt", clock.now_ms()));
                    let mut text = lines.join("\n");
                    text.push('\n');
                    app.status = Some(match write_private(&path, &text) {
                        Ok(()) => format!("written: {}", path.display()),
                        Err(e) => format!("write failed: {}: {e}", path.display()),
                    });
                }
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
                Action::Engine(command) => {
                    if let Some(snapshot) = control.command(command) {
                        app.show(snapshot);
                    }
                }
                Action::None | Action::Redraw => {}
            }
        }
    }
}

/// No cell may send a control character to the terminal: ratatui drops some, but a zero-width
/// one can ride along with the cell before it. Recorded text (models, user agents, messages)
/// reaches the panes from anywhere, so the frame is checked once, where it is complete.
fn scrub_controls(buffer: &mut ratatui::buffer::Buffer) {
    for cell in buffer.content.iter_mut() {
        if prefixscope_core::text::has_controls(cell.symbol()) {
            let kept: String = cell.symbol().chars().filter(|c| !c.is_control()).collect();
            cell.set_symbol(if kept.is_empty() { " " } else { &kept });
        }
    }
}

/// `prefixscope-snapshot-<ms>.json` (the snapshot on screen: `analyze --json`'s report plus
/// what the panes show), `.txt` (its summary, as printed at exit) and `.html` (`analyze -o`'s
/// page of the same report), in the working directory, private (0600): they hold break text.
fn write_snapshot(app: &App, now_ms: i64) -> Result<String, String> {
    let base = PathBuf::from(format!("prefixscope-snapshot-{now_ms}"));
    let json = base.with_extension("json");
    let text = base.with_extension("txt");
    let body = serde_json::to_string_pretty(&app.snapshot.to_json()).map_err(|e| e.to_string())?;
    write_private(&json, &(body + "\n")).map_err(|e| format!("{}: {e}", json.display()))?;
    write_private(&text, &app.snapshot.summary())
        .map_err(|e| format!("{}: {e}", text.display()))?;
    // The page `analyze -o` writes, of the report on screen.
    let html = base.with_extension("html");
    write_private(
        &html,
        &crate::html_report::analysis_page(&app.snapshot.report, app.snapshot.findings()),
    )
    .map_err(|e| format!("{}: {e}", html.display()))?;
    Ok(format!(
        "{}, {} and {}",
        json.display(),
        text.display(),
        html.display()
    ))
}

/// A whole file, 0600, through a temporary file renamed over the path (`output_file`): a
/// symlink there is replaced, never written through.
fn write_private(path: &std::path::Path, text: &str) -> io::Result<()> {
    prefixscope_core::output_file::write_whole(path, &[], text.as_bytes())
}

/// Terminal set-up for a real TTY, undone on every exit: the guard's `Drop` for returns and
/// errors, the panic hook for panics (restore first, then print the panic).
pub mod terminal {
    use std::io::{self, Stdout};
    use std::mem::ManuallyDrop;
    use std::sync::atomic::{AtomicBool, Ordering};

    use crossterm::event::{DisableMouseCapture, EnableMouseCapture};
    use crossterm::execute;
    use crossterm::terminal::{
        EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
    };
    use ratatui::Terminal;
    use ratatui::backend::CrosstermBackend;

    pub struct Guard {
        /// Never dropped while its cursor cannot be shown: ratatui's `Drop` then reports it with
        /// `eprintln!`, which panics when the terminal is gone (see `Drop for Guard`).
        pub terminal: ManuallyDrop<Terminal<CrosstermBackend<Stdout>>>,
    }

    /// Whether the terminal is set up (raw, alternate screen): a forced exit restores it only
    /// then, so `record`'s stdout never gets escape sequences.
    static ENTERED: AtomicBool = AtomicBool::new(false);

    /// `restore`, if `enter` set the terminal up and nothing restored it since.
    pub fn restore_if_entered() {
        if ENTERED.load(Ordering::SeqCst) {
            restore();
        }
    }

    pub fn restore() {
        ENTERED.store(false, Ordering::SeqCst);
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
        ENTERED.store(true, Ordering::SeqCst);
        enable_raw_mode()?;
        let mut stdout = io::stdout();
        execute!(stdout, EnterAlternateScreen)?;
        if mouse {
            execute!(stdout, EnableMouseCapture)?;
        }
        let terminal = ManuallyDrop::new(Terminal::new(CrosstermBackend::new(stdout))?);
        Ok(Guard { terminal })
    }

    impl Drop for Guard {
        fn drop(&mut self) {
            restore();
            if self.terminal.show_cursor().is_ok() {
                // SAFETY: dropped once, here, and never used after.
                unsafe { ManuallyDrop::drop(&mut self.terminal) };
            }
            // Otherwise the terminal is gone: its `Terminal` is left undropped (the process is
            // on its way out; nothing is lost but a buffer that cannot be written anywhere).
        }
    }
}

/// Terminal input on its own thread, into the one channel. A terminal that goes away (its
/// window closed, tmux killed, an SSH drop) ends the app as `q` does (`Event::TerminalLost`):
/// the tty is polled for a hang-up before crossterm reads it, because crossterm's reader spins
/// on a hung-up tty instead of failing.
pub fn spawn_input(events: Sender<Event>) {
    std::thread::spawn(move || {
        use crossterm::event::{Event as Term, poll, read};
        let tty = tty_watch::Tty::open();
        loop {
            match tty.wait(Duration::from_millis(250)) {
                tty_watch::Wait::Lost(why) => {
                    let _ = events.send(Event::TerminalLost(why));
                    return;
                }
                tty_watch::Wait::Idle => continue,
                tty_watch::Wait::Ready => {}
            }
            // Only what is already there: `read` never waits on a tty that may hang up.
            while let Ok(true) = poll(Duration::ZERO) {
                let Ok(event) = read() else {
                    let _ = events.send(Event::TerminalLost("the terminal cannot be read"));
                    return;
                };
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
        }
    });
}

/// `poll(2)` on the tty crossterm reads (stdin when it is a terminal, `/dev/tty` otherwise).
mod tty_watch {
    use std::fs::File;
    use std::io::IsTerminal;
    use std::os::fd::{AsRawFd, RawFd};
    use std::time::Duration;

    pub(super) enum Wait {
        Ready,
        Idle,
        Lost(&'static str),
    }

    pub(super) struct Tty {
        /// Kept open for as long as its descriptor is polled.
        _file: Option<File>,
        fd: Option<RawFd>,
    }

    impl Tty {
        pub(super) fn open() -> Tty {
            if std::io::stdin().is_terminal() {
                return Tty {
                    _file: None,
                    fd: Some(std::io::stdin().as_raw_fd()),
                };
            }
            let file = File::open("/dev/tty").ok();
            let fd = file.as_ref().map(AsRawFd::as_raw_fd);
            Tty { _file: file, fd }
        }

        pub(super) fn wait(&self, timeout: Duration) -> Wait {
            let Some(fd) = self.fd else {
                return Wait::Lost("no terminal to read");
            };
            let mut poll_fd = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            let millis = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
            // SAFETY: one valid pollfd, for the length given.
            let ready = unsafe { libc::poll(&mut poll_fd, 1, millis) };
            if ready < 0 {
                return match std::io::Error::last_os_error().kind() {
                    std::io::ErrorKind::Interrupted => Wait::Idle,
                    _ => Wait::Lost("the terminal cannot be polled"),
                };
            }
            if poll_fd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
                Wait::Lost("the terminal hung up")
            } else if poll_fd.revents & libc::POLLIN != 0 {
                Wait::Ready
            } else {
                Wait::Idle
            }
        }
    }
}
