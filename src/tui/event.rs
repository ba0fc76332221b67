//! The one event enum, on one channel, that drives the app: terminal input, records, and what
//! the edges report.

use std::sync::Arc;

use crossterm::event::{KeyEvent, MouseEvent};

use crate::cache::Request;
use crate::record::Record;

#[derive(Debug, Clone)]
pub enum Event {
    Key(KeyEvent),
    Mouse(MouseEvent),
    Resize(u16, u16),
    /// One exchange, from the proxy's recorder or a replayed file.
    Record(Arc<Record>),
    /// One request of a trace or gateway log (no messages: only the cache panes use it).
    Request(Arc<Request>),
    /// A replayed file has no more records.
    SourceDone,
    /// The proxy stopped accepting and finished what was in flight.
    ProxyStopped,
    /// Something to show in the status bar (a bad line, a write error).
    Warning(String),
    /// Time passes: rates and "n s ago" change.
    Tick,
}
