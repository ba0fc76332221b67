//! The one shutdown path of every command. SIGINT, SIGTERM and SIGHUP are caught on a thread of
//! their own: the first asks for a graceful stop (whatever the command registered with
//! `on_stop`: stop accepting, finish the exchanges in flight, write their records, leave the
//! TUI), and the command then exits 0 as if it had been quit. A second signal forces: the
//! terminal is restored first, then the process exits with 128 + the signal's number, like a
//! shell reports a process killed by it. Either way, the temporary files of outputs not yet
//! written whole are removed first (`output_file`).

use std::sync::{Arc, Mutex};

/// 128 + the signal's number: the exit code of a forced stop.
pub const FORCED_EXIT_BASE: i32 = 128;

/// A caught signal, by number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Signal(pub i32);

impl Signal {
    pub fn name(self) -> &'static str {
        #[cfg(unix)]
        {
            use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
            match self.0 {
                SIGINT => return "SIGINT",
                SIGTERM => return "SIGTERM",
                SIGHUP => return "SIGHUP",
                _ => {}
            }
        }
        "signal"
    }

    /// The exit code of a process forced out by this signal.
    pub fn forced_exit_code(self) -> i32 {
        FORCED_EXIT_BASE + self.0
    }
}

type OnStop = Box<dyn FnOnce(Signal) + Send>;

enum State {
    /// No signal yet; what to do on the first.
    Waiting(Option<OnStop>),
    /// A signal came (before or after `on_stop` was set).
    Stopping(Signal),
}

/// The process's signal thread. Create one per command, before anything worth stopping runs;
/// it lives as long as the process (signal handlers are process-wide).
#[derive(Clone)]
pub struct Shutdown {
    state: Arc<Mutex<State>>,
}

impl Shutdown {
    /// Catches SIGINT, SIGTERM and SIGHUP from now on. If they cannot be caught (no signals on
    /// this platform), the returned value never fires and the defaults stay.
    pub fn listen() -> Shutdown {
        let shutdown = Shutdown {
            state: Arc::new(Mutex::new(State::Waiting(None))),
        };
        #[cfg(unix)]
        {
            use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
            match signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) {
                Ok(mut signals) => {
                    let first = shutdown.clone();
                    std::thread::spawn(move || {
                        let mut caught = 0u32;
                        for number in signals.forever() {
                            caught += 1;
                            if caught == 1 {
                                first.request(Signal(number));
                            } else {
                                force(Signal(number));
                            }
                        }
                    });
                }
                Err(e) => prefixscope_core::stderr_line!(
                    "prefixscope: cannot catch signals ({e}); they stop at once"
                ),
            }
        }
        shutdown
    }

    /// A value that never fires (library callers and tests that stop by other means).
    pub fn never() -> Shutdown {
        Shutdown {
            state: Arc::new(Mutex::new(State::Waiting(None))),
        }
    }

    /// What the first signal does; runs at once if one already came. Replaces an earlier one.
    pub fn on_stop(&self, stop: impl FnOnce(Signal) + Send + 'static) {
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        match &mut *state {
            State::Waiting(slot) => *slot = Some(Box::new(stop)),
            State::Stopping(signal) => {
                let signal = *signal;
                drop(state);
                stop(signal);
            }
        }
    }

    /// The signal that asked for the stop, if one did.
    pub fn requested(&self) -> Option<Signal> {
        match &*self.state.lock().ok()? {
            State::Stopping(signal) => Some(*signal),
            State::Waiting(_) => None,
        }
    }

    /// Acts as if `signal` had been caught (the first one): for tests and callers with their own
    /// reasons to stop.
    pub fn request(&self, signal: Signal) {
        let stop = {
            let Ok(mut state) = self.state.lock() else {
                return;
            };
            match std::mem::replace(&mut *state, State::Stopping(signal)) {
                State::Waiting(stop) => stop,
                State::Stopping(earlier) => {
                    *state = State::Stopping(earlier);
                    None
                }
            }
        };
        if let Some(stop) = stop {
            stop(signal);
        }
    }

    /// Resolves on the first signal (for a tokio task: the proxy's `run`).
    pub fn stopped(&self) -> impl std::future::Future<Output = Signal> + Send + 'static {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.on_stop(move |signal| {
            let _ = tx.send(signal);
        });
        async move {
            match rx.await {
                Ok(signal) => signal,
                // Replaced by another `on_stop`: this future never fires.
                Err(_) => std::future::pending().await,
            }
        }
    }
}

/// The second signal: leave the terminal as it was found, then exit at once.
fn force(signal: Signal) -> ! {
    crate::tui::terminal::restore_if_entered();
    prefixscope_core::stderr_line!(
        "prefixscope: {} again: exiting now; exchanges still in flight are not recorded",
        signal.name()
    );
    prefixscope_core::output_file::exit_removing_temporaries(signal.forced_exit_code());
}

/// For a command with nothing to finish gracefully (`analyze`, `export`…): the first SIGINT,
/// SIGTERM or SIGHUP exits at once with 128 + its number, as the default would, but with the
/// temporary files of unfinished outputs removed.
pub fn exit_on_signal() {
    #[cfg(unix)]
    {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        if let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) {
            std::thread::spawn(move || {
                if let Some(number) = signals.forever().next() {
                    prefixscope_core::output_file::exit_removing_temporaries(
                        Signal(number).forced_exit_code(),
                    );
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_request_runs_the_stop_once_even_when_it_came_first() {
        let shutdown = Shutdown::never();
        shutdown.request(Signal(15));
        let (tx, rx) = std::sync::mpsc::channel();
        shutdown.on_stop(move |signal| tx.send(signal).unwrap_or(()));
        assert_eq!(rx.try_recv(), Ok(Signal(15)));
        assert_eq!(shutdown.requested(), Some(Signal(15)));

        let shutdown = Shutdown::never();
        let (tx, rx) = std::sync::mpsc::channel();
        shutdown.on_stop(move |signal| tx.send(signal).unwrap_or(()));
        assert!(rx.try_recv().is_err());
        shutdown.request(Signal(1));
        shutdown.request(Signal(2));
        assert_eq!(rx.try_recv(), Ok(Signal(1)));
        assert!(rx.try_recv().is_err());
        assert_eq!(shutdown.requested(), Some(Signal(1)));
    }
}
