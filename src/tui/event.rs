//! The one event enum, on one channel, that drives the app: terminal input, the live engine's
//! snapshots, and what the edges report.

use std::sync::Arc;

use crossterm::event::{KeyEvent, MouseEvent};

use prefixscope_core::live::Snapshot;

#[derive(Debug, Clone)]
pub enum Event {
    Key(KeyEvent),
    Mouse(MouseEvent),
    Resize(u16, u16),
    /// The live engine's newest state (records are consumed there, never on the UI thread).
    Snapshot(Arc<Snapshot>),
    /// The proxy stopped accepting and finished what was in flight.
    ProxyStopped,
    /// SIGINT, SIGTERM or SIGHUP (its name): quit as `q` does, waiting for what is in flight.
    Signal(&'static str),
    /// The terminal went away (why): quit as `q` does; nothing can be drawn any more.
    TerminalLost(&'static str),
    /// Something wrong to show in the status bar (a bad line, a write error); counted.
    Warning(String),
    /// Something to show in the status bar that is not a problem (the demo's end).
    Notice(String),
}
