//! The engine on a thread of its own, publishing snapshots at a capped rate.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError};

use super::{Command, Engine, Input, Snapshot};
use crate::record::Record;

/// Snapshots are published at most this often.
pub const MIN_SNAPSHOT_INTERVAL_MS: u64 = 200;
/// ... and, after a snapshot that took `t` to build, not before `t` times this has passed: the
/// engine spends at most half its time on snapshots, the rest on records, and a record waits
/// at most about two build times to be seen.
pub const SNAPSHOT_COST_FACTOR: u32 = 1;

/// The engine on its own thread: what it is fed, and how to reach it.
pub struct Handle {
    inputs: Sender<Input>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Handle {
    /// Where records, trace requests, the end of the source and commands go (bounded: a file
    /// reader waits for the engine instead of holding the file in memory).
    pub fn sender(&self) -> Sender<Input> {
        self.inputs.clone()
    }

    pub fn command(&self, command: Command) {
        let _ = self.inputs.send(Input::Command(command));
    }

    /// Waits for the engine to finish what it was given (every sender dropped) and publish its
    /// last snapshot.
    pub fn join(mut self) {
        let (closed, _) = crossbeam_channel::bounded(1);
        self.inputs = closed;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// How many inputs may wait for the engine (records are small next to what a reader would
/// otherwise hold: a parsed file).
pub const INPUT_QUEUE: usize = 1024;

/// Runs `engine` on its own thread. It takes inputs from the returned handle's channel and, for
/// `watch`, records straight from the recorder (`records`: the recorder's consumer channel, no
/// bridge thread), stamped with `clock`. Every snapshot goes to `publish`, at most every
/// `MIN_SNAPSHOT_INTERVAL_MS` and never sooner than `SNAPSHOT_COST_FACTOR` times the last
/// one's build time; a command or the end of the source is answered at once. The thread ends,
/// after a last snapshot, when every input sender is dropped and `records` is closed.
pub fn spawn(
    mut engine: Engine,
    records: Option<Receiver<Arc<Record>>>,
    clock: Arc<dyn Fn() -> i64 + Send + Sync>,
    publish: impl Fn(Arc<Snapshot>) + Send + 'static,
) -> Handle {
    let (inputs, receiver) = crossbeam_channel::bounded::<Input>(INPUT_QUEUE);
    let thread = std::thread::Builder::new()
        .name("live-engine".into())
        .spawn(move || {
            run(&mut engine, &receiver, records.as_ref(), &*clock, &publish);
        })
        .ok();
    Handle { inputs, thread }
}

/// How long the engine works through queued inputs before it looks at the clock again.
const DRAIN_SLICE: Duration = Duration::from_millis(20);

fn run(
    engine: &mut Engine,
    inputs: &Receiver<Input>,
    records: Option<&Receiver<Arc<Record>>>,
    clock: &(dyn Fn() -> i64 + Send + Sync),
    publish: &dyn Fn(Arc<Snapshot>),
) {
    let never_records = crossbeam_channel::never::<Arc<Record>>();
    let never_inputs = crossbeam_channel::never::<Input>();
    let records_rx = records.unwrap_or(&never_records);
    let (mut inputs_open, mut records_open) = (true, records.is_some());
    let mut dirty = false;
    let mut urgent = false;
    let mut next_build = Instant::now();
    // When the oldest input not yet in a published snapshot arrived.
    let mut waiting_since: Option<Instant> = None;
    let build = |engine: &mut Engine, waiting_since: &mut Option<Instant>| {
        let start = Instant::now();
        let mut snapshot = engine.snapshot();
        let cost = start.elapsed();
        snapshot.build_us = u64::try_from(cost.as_micros()).unwrap_or(u64::MAX);
        snapshot.waited_us = waiting_since.take().map_or(0, |since| {
            u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX)
        });
        publish(Arc::new(snapshot));
        Instant::now()
            + (cost * SNAPSHOT_COST_FACTOR).max(Duration::from_millis(MIN_SNAPSHOT_INTERVAL_MS))
    };
    while inputs_open || records_open {
        // Wait for something, or for the next snapshot to be due.
        let wait = if dirty {
            next_build.saturating_duration_since(Instant::now())
        } else {
            Duration::from_secs(3600)
        };
        let inputs_rx = if inputs_open { inputs } else { &never_inputs };
        let records_now = if records_open {
            records_rx
        } else {
            &never_records
        };
        crossbeam_channel::select! {
            recv(inputs_rx) -> input => match input {
                Ok(input) => {
                    urgent |= engine.push(input);
                    dirty = true;
                }
                Err(_) => inputs_open = false,
            },
            recv(records_now) -> record => match record {
                Ok(record) => {
                    engine.push(Input::Record(record, clock()));
                    dirty = true;
                }
                Err(_) => records_open = false,
            },
            default(wait) => {}
        }
        // Work through what is queued, a slice of time at a time, commands first in line.
        let slice_end = Instant::now() + DRAIN_SLICE;
        while !urgent && Instant::now() < slice_end {
            let mut took = false;
            if inputs_open {
                match inputs.try_recv() {
                    Ok(input) => {
                        urgent |= engine.push(input);
                        dirty = true;
                        took = true;
                    }
                    Err(TryRecvError::Disconnected) => inputs_open = false,
                    Err(TryRecvError::Empty) => {}
                }
            }
            if records_open {
                match records_rx.try_recv() {
                    Ok(record) => {
                        engine.push(Input::Record(record, clock()));
                        dirty = true;
                        took = true;
                    }
                    Err(TryRecvError::Disconnected) => records_open = false,
                    Err(TryRecvError::Empty) => {}
                }
            }
            if !took {
                break;
            }
        }
        if dirty && waiting_since.is_none() {
            waiting_since = Some(Instant::now());
        }
        if dirty && (urgent || Instant::now() >= next_build) {
            next_build = build(engine, &mut waiting_since);
            dirty = false;
            urgent = false;
        }
    }
    if dirty {
        build(engine, &mut waiting_since);
    }
}
