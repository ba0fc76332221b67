//! What `replay` and `watch` share: the terminal set-up around the app loop, and the export
//! the `e` key asks for.

use std::path::{Path, PathBuf};

use crossbeam_channel::{Receiver, Sender};

use super::{EXIT_OK, EXIT_UNREADABLE};
use prefixscope::analysis::Config;
use prefixscope::tui::app::{App, Input, Source};
use prefixscope::tui::event::Event;
use prefixscope::tui::theme::Theme;
use prefixscope::tui::{Control, SystemClock, run, spawn_input, terminal};

/// What the app shows and how.
pub struct View {
    pub source: Source,
    pub input: Input,
    /// Tokens per block of the hit-rate simulation.
    pub block_size: u32,
    /// Replay speed (`None` live).
    pub speed: Option<f64>,
    pub mouse: bool,
}

/// Runs the app on the real terminal until it quits; the terminal is restored on every way
/// out (the guard's Drop, and the panic hook for panics).
pub fn run_tui(
    view: View,
    events: Sender<Event>,
    receiver: Receiver<Event>,
    control: &dyn Control,
) -> u8 {
    let mut app = App::with_block_size(view.source, Config::default(), view.block_size);
    app.input = view.input;
    app.speed = view.speed;
    app.mouse = view.mouse;
    let mut guard = match terminal::enter(view.mouse) {
        Ok(guard) => guard,
        Err(e) => {
            terminal::restore();
            eprintln!("prefixscope: cannot set up the terminal: {e}");
            return EXIT_UNREADABLE;
        }
    };
    spawn_input(events.clone());
    if std::env::var_os("PREFIXSCOPE_TEST_PANIC").is_some() {
        // For the test that the terminal is restored after a panic.
        panic!("PREFIXSCOPE_TEST_PANIC is set");
    }
    drop(events);
    let result = run(
        &mut guard.terminal,
        &mut app,
        &receiver,
        &SystemClock,
        control,
        &Theme::from_env(),
    );
    drop(guard);
    match result {
        Ok(()) => {
            if app.input == Input::Exchanges {
                print!("{}", app.report().summary());
            }
            EXIT_OK
        }
        Err(e) => {
            eprintln!("prefixscope: terminal error: {e}");
            EXIT_UNREADABLE
        }
    }
}

/// The `e` key: exports the recordings (read again from disk: the app keeps no bodies) to
/// `path`.
pub fn export_files(files: &[PathBuf], format: &str, path: &str) -> Result<String, String> {
    if path.trim().is_empty() {
        return Err("no file name".into());
    }
    super::export::export_recordings(files, format, Path::new(path.trim()))
}
