//! `prefixscope watch`: the recording proxy and the TUI in one process. The view reads records
//! from the recorder on a channel of its own: it may lag behind the traffic, it never holds
//! the proxy back. When stdout is not a terminal it records, prints one line per record and,
//! when stopped, the analysis summary.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use clap::Args;

use super::record::{Capture, CaptureArgs, start_capture};
use super::{EXIT_OK, status, tui};
use prefixscope::analysis::Config;
use prefixscope::live::{Engine, Input as EngineInput, LIVE_BLOCK_SIZE};
use prefixscope::proxy::ProxyStats;
use prefixscope::record::Record;
use prefixscope::recorder::RecorderStats;
use prefixscope::tui::app::{Input, Source};
use prefixscope::tui::event::Event;
use prefixscope::tui::{Clock, Control, SystemClock};

#[derive(Args)]
pub struct WatchArgs {
    #[command(flatten)]
    capture: CaptureArgs,
    /// Don't capture the mouse (keep the terminal's own selection).
    #[arg(long)]
    no_mouse: bool,
}

pub fn run(args: WatchArgs) -> u8 {
    let (records_tx, records_rx) = crossbeam_channel::unbounded::<Arc<Record>>();
    let capture = match start_capture(&args.capture, vec![records_tx]) {
        Ok(capture) => capture,
        Err(code) => return code,
    };
    if !std::io::stdout().is_terminal() {
        return headless(capture, records_rx);
    }
    let Capture {
        runtime,
        proxy,
        recorder,
        path,
        listen,
        upstream,
    } = capture;
    let (events, receiver) = crossbeam_channel::unbounded();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let control = Live {
        proxy: proxy.stats(),
        recorder: recorder.stats(),
        stop: std::sync::Mutex::new(Some(stop_tx)),
        files: vec![path.clone()],
    };
    let proxy_thread = {
        let events = events.clone();
        std::thread::spawn(move || {
            runtime.block_on(proxy.run(async {
                let _ = stop_rx.await;
            }));
            let _ = events.send(Event::ProxyStopped);
        })
    };
    let source = Source::Live {
        upstream: upstream.url(),
        listen: listen.to_string(),
        recording: path.display().to_string(),
    };
    let view = tui::View {
        source,
        input: Input::Exchanges,
        block_size: LIVE_BLOCK_SIZE,
        speed: None,
        mouse: !args.no_mouse,
    };
    // The recorder's consumer channel goes straight into the live engine.
    let feed = tui::Feed {
        records: Some(records_rx),
        feeder: None,
    };
    let code = tui::run_tui(view, events, receiver, feed, &control);
    control.stop();
    let _ = proxy_thread.join();
    let stats = recorder.finish();
    eprintln!(
        "prefixscope: {} records written to {}",
        stats.written.load(Ordering::Relaxed),
        path.display()
    );
    code
}

/// What the app may ask of the live edge (`demo` wraps it too).
pub(super) struct Live {
    pub(super) proxy: Arc<ProxyStats>,
    pub(super) recorder: Arc<RecorderStats>,
    pub(super) stop: std::sync::Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    pub(super) files: Vec<PathBuf>,
}

impl Control for Live {
    fn stop(&self) {
        if let Some(stop) = self.stop.lock().ok().and_then(|mut s| s.take()) {
            let _ = stop.send(());
        }
    }

    fn in_flight(&self) -> u64 {
        self.proxy.in_flight()
    }

    fn records_written(&self) -> Option<u64> {
        Some(self.recorder.written.load(Ordering::Relaxed))
    }

    fn upstream_ok(&self) -> Option<bool> {
        let ok = self.proxy.last_upstream_ok_ms.load(Ordering::Relaxed);
        let failed = self.proxy.last_upstream_failure_ms.load(Ordering::Relaxed);
        (ok > 0 || failed > 0).then_some(ok >= failed)
    }

    fn export(&self, format: &str, path: &str) -> Result<String, String> {
        tui::export_files(&self.files, format, path)
    }
}

/// No terminal: record as `record` does, a line per record on stdout, the summary at the end.
fn headless(capture: Capture, records: crossbeam_channel::Receiver<Arc<Record>>) -> u8 {
    let Capture {
        runtime,
        proxy,
        recorder,
        path,
        listen,
        upstream,
    } = capture;
    eprintln!(
        "prefixscope: proxy http://{listen} -> {}, recording to {}; stdout is not a terminal, so one line per record. Ctrl-C stops.",
        upstream.url(),
        path.display()
    );
    let printer = std::thread::spawn(move || {
        let mut engine = Engine::new(Config::default());
        for record in records {
            println!("{}", status::record_line(&record));
            engine.push(EngineInput::Record(record, SystemClock.now_ms()));
        }
        print!("{}", engine.snapshot().summary());
    });
    runtime.block_on(proxy.run(async {
        let _ = tokio::signal::ctrl_c().await;
    }));
    drop(runtime);
    let stats = recorder.finish();
    let _ = printer.join();
    eprintln!(
        "prefixscope: {} records written to {}",
        stats.written.load(Ordering::Relaxed),
        path.display()
    );
    EXIT_OK
}
