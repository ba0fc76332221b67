//! What the TUI's tests drive the app with: a clock that stands still and a live engine that
//! answers at once (included with `#[path]`, so each test binary builds only this).
#![allow(dead_code)]

use std::cell::RefCell;
use std::sync::Arc;

use prefixscope::tui::{Clock, Control};
use prefixscope_core::live::{Command, Engine, Input, Snapshot};

/// A clock that stands still (tests, goldens).
pub struct FixedClock(pub i64);

impl Clock for FixedClock {
    fn now_ms(&self) -> i64 {
        self.0
    }
}

pub struct NoControl;
impl Control for NoControl {}

/// A synchronous live engine behind the app (tests, goldens): commands are answered at once.
pub struct EngineControl(pub RefCell<Engine>);

impl Control for EngineControl {
    fn command(&self, command: Command) -> Option<Arc<Snapshot>> {
        let mut engine = self.0.borrow_mut();
        engine.push(Input::Command(command));
        Some(Arc::new(engine.snapshot()))
    }
}
