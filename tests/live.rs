//! The live engine (issue #11): one snapshot behind every output. The `s` key's JSON is
//! `analyze --json` at the same paths plus what the panes show; the headless replay prints the
//! same snapshot's summary; the engine on its thread ends where the synchronous one does, and
//! answers a command with a snapshot. Plus the app's state machine (keys, mouse, dialogs,
//! pause, redraws), so a key that stops working fails a test.

#[path = "support/tui.rs"]
mod tui_support;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers, MouseButton, MouseEvent, MouseEventKind};
use prefixscope::tui::app::{Action, App, Dialog, EXPORT_FORMATS, Pane, Source};
use prefixscope::tui::event::Event;
use prefixscope::tui::run;
use prefixscope::tui::theme::Theme;
use prefixscope_core::analysis::{Config, analyze};
use prefixscope_core::live::{self, Command, Engine, Input, Snapshot};
use prefixscope_core::record::{Lines, Record, read_jsonl};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use tui_support::{EngineControl, FixedClock};

const BIN: &str = env!("CARGO_BIN_EXE_prefixscope");

fn recording(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("recordings")
        .join(name)
}

/// The records in file order (what `replay` feeds).
fn file_order(name: &str) -> Vec<Record> {
    let file = std::fs::File::open(recording(name)).unwrap();
    Lines::new(std::io::BufReader::new(file))
        .map(Result::unwrap)
        .collect()
}

/// The engine a replay of `records` runs: the block model measured over them first.
fn engine_of(records: &[Record]) -> Engine {
    let mut engine = Engine::new(Config::default());
    engine.push(Input::BlockModel(Box::new(live::FirstPass::of(records))));
    for record in records {
        engine.push(Input::Record(Arc::new(record.clone()), 0));
    }
    engine.push(Input::SourceDone);
    engine
}

#[test]
fn the_snapshot_json_is_analyze_json_plus_what_the_panes_show() {
    let name = "llmp/llama.cpp/parallel-nocache.jsonl";
    let records = file_order(name);
    let snapshot = engine_of(&records).snapshot();
    let mut json = snapshot.to_json();
    // What the panes show, beside the report.
    assert_eq!(json["snapshot_version"], live::SNAPSHOT_VERSION);
    let points = json["hit_rate"]["points"].as_array().unwrap();
    assert_eq!(points.len(), live::AXIS_POINTS);
    assert!(json["hit_rate"]["ceiling"].as_f64().unwrap() > 0.0);
    assert!(!json["top_prefixes"].as_array().unwrap().is_empty());
    assert!(!json["findings"].as_array().unwrap().is_empty());
    assert_eq!(json["time"]["lost_tokens"], 8604);
    // Without those, exactly `analyze --json`'s report.
    for added in [
        "snapshot_version",
        "requests_received",
        "requests_simulated",
        "not_simulated",
        "hit_rate",
        "top_prefixes",
        "filter",
        "fixes",
        "calibration",
        "server",
    ] {
        json.as_object_mut().unwrap().remove(added);
    }
    let read = read_jsonl(std::fs::read(recording(name)).unwrap().as_slice());
    let reference = serde_json::to_value(analyze(&read.records, &Config::default())).unwrap();
    assert_eq!(json, reference);
}

#[test]
fn the_headless_replay_ends_with_the_snapshot_summary() {
    let name = "llmp/llama.cpp/parallel-nocache.jsonl";
    let snapshot = engine_of(&file_order(name)).snapshot();
    let out = std::process::Command::new(BIN)
        .args(["replay", "--headless", "--instant"])
        .arg(recording(name))
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    let summary = snapshot.summary();
    assert!(summary.contains("hit rate ("), "{summary}");
    assert!(summary.contains("top prefixes"), "{summary}");
    assert!(
        stdout.ends_with(&summary),
        "stdout:\n{stdout}\nsnapshot summary:\n{summary}"
    );
}

#[test]
fn the_engine_on_its_thread_ends_where_the_synchronous_one_does_and_answers_commands() {
    let name = "llmp/llama.cpp/parallel-nocache.jsonl";
    let records = file_order(name);
    let expected = engine_of(&records).snapshot();
    let (handle, snapshots) = spawn_collecting();
    let inputs = handle.sender();
    inputs
        .send(Input::BlockModel(Box::new(live::FirstPass::of(&records))))
        .unwrap();
    for record in &records {
        inputs
            .send(Input::Record(Arc::new(record.clone()), 0))
            .unwrap();
    }
    inputs.send(Input::SourceDone).unwrap();
    // The end of the source is answered at once.
    let done = loop {
        let s = snapshots.recv_timeout(Duration::from_secs(10)).unwrap();
        if s.source_done {
            break s;
        }
    };
    assert_eq!(done.requests, records.len() as u64);
    assert_eq!(done.report, expected.report);
    assert_eq!(done.summary(), expected.summary());
    // A filter comes back as a snapshot built with it.
    handle.command(Command::Filter("other-agent".into()));
    let filtered = snapshots.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(filtered.filter, "other-agent");
    assert!(filtered.generation > done.generation);
    assert!(
        filtered
            .view
            .lanes
            .iter()
            .all(|l| l.client.contains("other-agent"))
    );
    drop(inputs);
    handle.join();
}

/// The engine on its thread, every snapshot it publishes collected on a channel.
fn spawn_collecting() -> (live::Handle, crossbeam_channel::Receiver<Arc<Snapshot>>) {
    let (sender, snapshots) = crossbeam_channel::unbounded::<Arc<Snapshot>>();
    let handle = live::spawn(
        Engine::new(Config::default()),
        None,
        Arc::new(|| 0),
        move |s| {
            let _ = sender.send(s);
        },
    );
    (handle, snapshots)
}

// The app's state machine.

fn app_on(name: &str) -> (App, EngineControl) {
    let mut engine = engine_of(&file_order(name));
    let snapshot = Arc::new(engine.snapshot());
    let mut app = App::new(Source::Replay { files: name.into() }, snapshot);
    app.last_size = (120, 40);
    (app, EngineControl(RefCell::new(engine)))
}

fn key(app: &mut App, code: KeyCode) -> Action {
    app.handle(Event::Key(KeyEvent::new(code, KeyModifiers::NONE)), 0)
}

#[test]
fn keys_change_what_they_say() {
    let (mut app, _) = app_on("llmp/llama.cpp/parallel-nocache.jsonl");
    // t: prefixes by reusable tokens, and back.
    assert!(!app.prefixes_by_tokens);
    key(&mut app, KeyCode::Char('t'));
    assert!(app.prefixes_by_tokens);
    key(&mut app, KeyCode::Char('t'));
    assert!(!app.prefixes_by_tokens);
    // Tab moves the focus along the panes, BackTab back.
    assert_eq!(app.focus, Pane::Conversations);
    key(&mut app, KeyCode::Tab);
    assert_eq!(app.focus, Pane::Breaks);
    key(&mut app, KeyCode::BackTab);
    assert_eq!(app.focus, Pane::Conversations);
    // Down / Up move the selection, within the pane.
    key(&mut app, KeyCode::Down);
    assert_eq!(app.selected[0], 1);
    for _ in 0..100 {
        key(&mut app, KeyCode::Down);
    }
    assert_eq!(app.selected[0], app.pane_len(Pane::Conversations) - 1);
    key(&mut app, KeyCode::Up);
    assert_eq!(app.selected[0], app.pane_len(Pane::Conversations) - 2);
    // c asks the engine for the chart; / then Enter for a filter.
    assert_eq!(
        key(&mut app, KeyCode::Char('c')),
        Action::Engine(Command::Chart(true))
    );
    key(&mut app, KeyCode::Char('/'));
    for c in "c4".chars() {
        key(&mut app, KeyCode::Char(c));
    }
    assert_eq!(
        key(&mut app, KeyCode::Enter),
        Action::Engine(Command::Filter("c4".into()))
    );
    assert_eq!(
        key(&mut app, KeyCode::Esc),
        Action::Engine(Command::Filter(String::new()))
    );
    // m turns mouse capture off; s asks for a snapshot; q quits at once with nothing in flight.
    key(&mut app, KeyCode::Char('m'));
    assert!(!app.mouse);
    assert_eq!(key(&mut app, KeyCode::Char('s')), Action::Snapshot);
    assert_eq!(key(&mut app, KeyCode::Char('q')), Action::ForceQuit);
}

#[test]
fn replay_speed_doubles_halves_and_stays_within_its_bounds() {
    let (mut app, _) = app_on("llmp/llama.cpp/session.jsonl");
    assert!(matches!(key(&mut app, KeyCode::Char('+')), Action::Redraw));
    app.speed = Some(1.0);
    assert_eq!(key(&mut app, KeyCode::Char('+')), Action::Speed(2.0));
    assert_eq!(key(&mut app, KeyCode::Char('-')), Action::Speed(1.0));
    for _ in 0..20 {
        key(&mut app, KeyCode::Char('+'));
    }
    assert_eq!(app.speed, Some(1000.0));
    for _ in 0..40 {
        key(&mut app, KeyCode::Char('-'));
    }
    assert_eq!(app.speed, Some(0.01));
}

#[test]
fn the_export_dialog_cycles_formats_and_names() {
    let (mut app, _) = app_on("llmp/llama.cpp/session.jsonl");
    key(&mut app, KeyCode::Char('e'));
    for step in 1..=EXPORT_FORMATS.len() {
        key(&mut app, KeyCode::Tab);
        let Some(Dialog::Export { format, .. }) = &app.dialog else {
            panic!("the export dialog closed");
        };
        assert_eq!(*format, step % EXPORT_FORMATS.len());
    }
    key(&mut app, KeyCode::BackTab);
    let action = key(&mut app, KeyCode::Enter);
    let last = EXPORT_FORMATS[EXPORT_FORMATS.len() - 1];
    assert_eq!(
        action,
        Action::Export {
            format: last.into(),
            path: format!("prefixscope-{last}.jsonl")
        }
    );
    assert!(app.dialog.is_none());
}

#[test]
fn the_mouse_scrolls_and_clicks_unless_turned_off() {
    let (mut app, _) = app_on("llmp/llama.cpp/parallel-nocache.jsonl");
    let mouse = |kind, column, row| {
        Event::Mouse(MouseEvent {
            kind,
            column,
            row,
            modifiers: KeyModifiers::NONE,
        })
    };
    app.handle(mouse(MouseEventKind::ScrollDown, 10, 5), 0);
    assert_eq!(app.selected[0], 1);
    app.handle(mouse(MouseEventKind::ScrollUp, 10, 5), 0);
    assert_eq!(app.selected[0], 0);
    // A click on the right half of the top row of panes focuses the breaks.
    app.handle(mouse(MouseEventKind::Down(MouseButton::Left), 100, 5), 0);
    assert_eq!(app.focus, Pane::Breaks);
    app.mouse = false;
    app.handle(mouse(MouseEventKind::ScrollDown, 100, 5), 0);
    assert_eq!(app.selected[1], 0);
}

#[test]
fn pause_holds_new_snapshots_and_resume_shows_the_newest() {
    let (mut app, control) = app_on("llmp/llama.cpp/session.jsonl");
    let shown = app.snapshot.generation;
    key(&mut app, KeyCode::Char('p'));
    assert!(app.paused);
    let newer = Arc::new(control.0.borrow_mut().snapshot());
    app.handle(Event::Snapshot(Arc::clone(&newer)), 0);
    assert_eq!(app.snapshot.generation, shown, "a paused view changed");
    key(&mut app, KeyCode::Char('p'));
    assert_eq!(app.snapshot.generation, newer.generation);
    // An older snapshot arriving late never replaces a newer one.
    let mut older = (*newer).clone();
    older.generation = 0;
    app.handle(Event::Snapshot(Arc::new(older)), 0);
    assert_eq!(app.snapshot.generation, newer.generation);
}

#[test]
fn the_loop_draws_once_per_change_and_never_for_nothing() {
    let (mut app, control) = app_on("llmp/llama.cpp/session.jsonl");
    let mut terminal = Terminal::new(TestBackend::new(120, 40)).unwrap();
    let (sender, receiver) = crossbeam_channel::unbounded();
    // Three snapshots and a key in one batch: applied together, drawn once (plus the first
    // frame).
    for _ in 0..3 {
        let s = Arc::new(control.0.borrow_mut().snapshot());
        sender.send(Event::Snapshot(s)).unwrap();
    }
    sender
        .send(Event::Key(KeyEvent::new(KeyCode::Down, KeyModifiers::NONE)))
        .unwrap();
    drop(sender);
    let clock = FixedClock(1_735_689_600_000);
    run(
        &mut terminal,
        &mut app,
        &receiver,
        &clock,
        &control,
        &Theme::plain(),
    )
    .unwrap();
    assert_eq!(app.frames_drawn, 2);
    // A new loop draws its first frame; an event that changes nothing (the mouse while it is
    // off) draws none.
    app.mouse = false;
    let (sender, receiver) = crossbeam_channel::unbounded::<Event>();
    sender
        .send(Event::Mouse(MouseEvent {
            kind: MouseEventKind::ScrollDown,
            column: 1,
            row: 1,
            modifiers: KeyModifiers::NONE,
        }))
        .unwrap();
    drop(sender);
    run(
        &mut terminal,
        &mut app,
        &receiver,
        &clock,
        &control,
        &Theme::plain(),
    )
    .unwrap();
    assert_eq!(app.frames_drawn, 3);
}

/// The replay session in-process: its feeder streams the file into the engine's thread, which
/// ends where the synchronous engine does; its headless output ends with the same summary.
#[test]
fn a_replay_session_feeds_the_engine_and_prints_the_same_summary_headless() {
    use prefixscope::session::replay::{Replay, ReplayConfig};
    let name = "llmp/llama.cpp/parallel-nocache.jsonl";
    let expected = engine_of(&file_order(name)).snapshot();
    let config = ReplayConfig {
        files: vec![recording(name)],
        speed: 1.0,
        instant: true,
        analysis: Default::default(),
    };
    let replay = Replay::open(&config).unwrap();
    assert_eq!(replay.trace_format(), None);
    let (handle, snapshots) = spawn_collecting();
    let feeder = replay.feeder(|warning| panic!("unexpected warning: {warning}"));
    feeder(handle.sender());
    let done = loop {
        let s = snapshots.recv_timeout(Duration::from_secs(10)).unwrap();
        if s.source_done {
            break s;
        }
    };
    assert_eq!(done.report, expected.report);
    assert_eq!(done.summary(), expected.summary());
    handle.join();

    let mut out = Vec::new();
    let mut err = Vec::new();
    Replay::open(&config)
        .unwrap()
        .headless(&mut out, &mut err)
        .unwrap();
    let out = String::from_utf8(out).unwrap();
    assert!(out.ends_with(&expected.summary()), "{out}");
    assert!(err.is_empty());
}

/// However fast records arrive, snapshots come at most every `MIN_SNAPSHOT_INTERVAL_MS`:
/// the cap that keeps a busy engine from drawing for nothing.
#[test]
fn snapshots_are_capped_while_records_stream_in() {
    let records = file_order("llmp/llama.cpp/parallel-nocache.jsonl");
    let (handle, snapshots) = spawn_collecting();
    let inputs = handle.sender();
    let start = std::time::Instant::now();
    // A record every 5 ms for about 600 ms, over and over.
    let mut sent = 0;
    while start.elapsed() < Duration::from_millis(600) {
        let record = records[sent % records.len()].clone();
        inputs.send(Input::Record(Arc::new(record), 0)).unwrap();
        sent += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    let elapsed = start.elapsed();
    drop(inputs);
    handle.join();
    let published = snapshots.try_iter().count() as u128;
    // One per interval begun, plus the last one when the input closes.
    let most = elapsed.as_millis() / u128::from(live::MIN_SNAPSHOT_INTERVAL_MS) + 2;
    assert!(sent > 50, "{sent} records sent");
    assert!(
        (1..=most).contains(&published),
        "{published} snapshots in {elapsed:?} (at most {most})"
    );
}

/// One cause per loss (issue #12, item 5): on the mixed demo, where a turn's history was
/// rewritten harmlessly and a side-call evicted it, the break lines' costs by cause are the
/// loss entries the header and the Loss pane sum, and the turn's glyph is the eviction's.
#[test]
fn every_break_line_costs_what_the_header_and_the_loss_pane_count() {
    use prefixscope::session::demo::{Demo, DemoConfig};
    use prefixscope_core::live::view::Mark;
    let config = DemoConfig {
        scenario: "mixed".into(),
        slots: None,
        cache_ram: false,
        speed: 1000.0,
        seed: 1,
        out: None,
        listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        swa_full: false,
    };
    let outcome = Demo::start(
        config,
        Vec::<prefixscope_capture::recorder::Consumer>::new(),
    )
    .unwrap()
    .run_to_end(std::future::pending())
    .unwrap();
    let snapshot = engine_of(&outcome.records).snapshot();
    let view = &snapshot.view;
    assert_eq!(view.breaks.len(), view.breaks_total.max(view.breaks.len()));
    let lines: u64 = view.breaks.iter().map(|b| u64::from(b.tokens)).sum();
    assert_eq!(lines, view.header.lost_tokens);
    let mut by_cause_lines = std::collections::BTreeMap::<String, u64>::new();
    for b in &view.breaks {
        *by_cause_lines.entry(b.cause.clone()).or_default() += u64::from(b.tokens);
    }
    let mut by_cause_losses = std::collections::BTreeMap::<String, u64>::new();
    for client in &view.losses {
        for (cause, tokens) in &client.by_cause {
            *by_cause_losses.entry(cause.clone()).or_default() += tokens;
        }
    }
    by_cause_lines.retain(|_, t| *t > 0);
    assert_eq!(by_cause_lines, by_cause_losses);
    // Rows with a break and an eviction are two facts; the glyph follows the larger loss.
    let both: Vec<_> = snapshot
        .report
        .rows
        .iter()
        .map(|r| &*r.row)
        .filter(|r| r.break_cause.is_some() && r.lost_external.is_some())
        .collect();
    // Seed 1 (the demo's default) has one: the coder's turn 8.
    assert!(!both.is_empty());
    for row in &both {
        assert_eq!(view.breaks.iter().filter(|b| b.id == row.id).count(), 2);
        let cell = view
            .lanes
            .iter()
            .flat_map(|l| &l.cells)
            .find(|c| c.id == row.id)
            .unwrap();
        let client = row.lost_client.as_ref().map_or(0, |l| l.tokens);
        let external = row.lost_external.as_ref().map_or(0, |l| l.tokens);
        if external > client {
            assert_eq!(cell.mark, Mark::Eviction, "row {}", row.id);
        }
    }
}

/// A request id that never arrives (an exchange still in flight, a record never written) holds
/// the cache simulation back while newer records keep coming, but 30 s at most behind the newest
/// arrival; the end of the source releases everything.
#[test]
fn a_missing_record_holds_the_cache_panes_back_at_most_thirty_seconds() {
    let records: Vec<Record> = file_order("xllamacpp/session.jsonl")
        .into_iter()
        .filter(|r| r.id != 3)
        .collect();
    let chat = |upto: u64| {
        records
            .iter()
            .filter(|r| {
                r.id <= upto
                    && (r.request.path.contains("/chat/completions")
                        || r.request.path.contains("/messages"))
            })
            .count() as u64
    };
    // Every record at once: those after the gap wait.
    let mut engine = Engine::for_records(Config::default(), &records);
    for record in &records {
        engine.push(Input::Record(Arc::new(record.clone()), 0));
    }
    assert_eq!(engine.snapshot().simulated, chat(2));
    engine.push(Input::SourceDone);
    assert_eq!(engine.snapshot().simulated, chat(u64::MAX));
    // Ten seconds apart: held while record 4 has waited 30 s or less behind the newest; then
    // the gap is passed and the rest flows.
    let mut engine = Engine::for_records(Config::default(), &records);
    for record in &records {
        engine.push(Input::Record(
            Arc::new(record.clone()),
            record.id as i64 * 10_000,
        ));
        let simulated = engine.snapshot().simulated;
        match record.id {
            4..=7 => assert_eq!(simulated, chat(2), "after record {}", record.id),
            8.. => assert_eq!(simulated, chat(record.id), "after record {}", record.id),
            _ => {}
        }
    }
}

/// The live engine fed a real llama.cpp recording as the proxy feeds it: each chat request
/// at its start (no response yet) and its record at its end, in the order they happened, with
/// the server's settings and the capacity view open. Returns, per request, what the slot view
/// said at its start: the record whose prefix it evicts, if any, and the share of its prompt
/// it reuses; and the engine at the end.
fn predicted_at_start(
    records: &[Record],
    slots: usize,
    cache_ram: bool,
) -> (BTreeMap<u64, u64>, BTreeMap<u64, usize>, Engine) {
    let mut engine = Engine::new(Config::default());
    engine.set_server_settings(Some(live::ServerSettings {
        slots,
        cache_ram,
        source: "the recording's server".into(),
    }));
    engine.push(Input::Command(Command::Capacity(true)));
    let mut moments: Vec<(i64, bool, &Record)> = records
        .iter()
        .flat_map(|r| [(r.t_start_ms, false, r), (r.t_end_ms, true, r)])
        .collect();
    moments.sort_by_key(|(t, ended, r)| (*t, *ended, r.id));
    let (mut evicts, mut reuse) = (BTreeMap::new(), BTreeMap::new());
    for (t, ended, record) in moments {
        if ended {
            engine.push(Input::Record(Arc::new(record.clone()), t));
            continue;
        }
        if record.request.path != "/v1/chat/completions" {
            continue;
        }
        let mut start = record.clone();
        start.response = None;
        start.t_end_ms = start.t_start_ms;
        engine.push(Input::Started(Arc::new(start)));
        let snapshot = engine.snapshot();
        let view = Option::as_ref(&snapshot.slots).expect("the slot view");
        let me = view
            .residency
            .starting
            .iter()
            .find(|s| s.record == record.id)
            .expect("the started request is predicted");
        assert!(me.slot < slots, "#{}", record.id);
        reuse.insert(record.id, me.reused_tokens);
        if let Some(evicted) = &me.evicts {
            evicts.insert(record.id, evicted.record);
        }
    }
    (evicts, reuse, engine)
}

/// A request is predicted as it starts, before the server has answered: on a real llama.cpp
/// recording (one slot, no host cache, four agents), every eviction the analysis later proves
/// from the server's counts was foretold by the slot view at the start of a request that ran
/// in between, and the turn that lost its prefix was said, at its start, to reuse little.
#[test]
fn the_live_engine_predicts_each_eviction_when_its_request_starts() {
    let records = file_order("llmp/llama.cpp/parallel-nocache.jsonl");
    let (predicted, reuse_at_start, mut engine) = predicted_at_start(&records, 1, false);
    let report = analyze(&records, &Config::default());
    // (the turn that found its prefix gone, its conversation, the request that evicted it)
    let evicted: Vec<(u64, Option<u32>, u64)> = report
        .rows
        .iter()
        .filter(|r| r.cause == Some(prefixscope_core::analysis::Cause::OtherConversation))
        .filter_map(|r| {
            r.evicted_by
                .as_ref()
                .map(|by| (r.id, r.conversation, by.row))
        })
        .collect();
    eprintln!(
        "predicted at start (request: the record whose prefix it evicts): {predicted:?}\nproved after (turn, its conversation, evicted by): {evicted:?}"
    );
    assert_eq!(evicted.len(), 15);
    let conversation_of = |id: u64| report.rows.iter().find(|r| r.id == id)?.conversation;
    for (turn, conversation, by) in &evicted {
        // Its conversation's turn before it, and the request that took its prefix meanwhile:
        // some request that started between them was said, at its start, to evict it.
        let previous = report
            .rows
            .iter()
            .filter(|r| r.id < *turn && r.conversation == *conversation)
            .map(|r| r.id)
            .max()
            .unwrap();
        let foretold = predicted
            .range(previous + 1..=*by)
            .any(|(_, victim)| conversation_of(*victim) == *conversation);
        assert!(
            foretold,
            "#{turn} of c{conversation:?} (previous #{previous}), evicted by #{by}"
        );
        // And the turn itself was said to find little of its prompt in the slot.
        let prompt = report
            .rows
            .iter()
            .find(|r| r.id == *turn)
            .and_then(|r| r.counts.prompt_tokens)
            .map_or(0, |p| p.value as usize);
        assert!(
            reuse_at_start[turn] * 2 < prompt,
            "#{turn}: {} of {prompt}",
            reuse_at_start[turn]
        );
    }
    // Once every record is in, nothing is in flight.
    let snapshot = engine.snapshot();
    assert!(
        Option::as_ref(&snapshot.slots)
            .unwrap()
            .residency
            .starting
            .is_empty()
    );
}

/// What the slot view says at a request's start is what the server then reports: the reuse
/// predicted from the request alone agrees with the response's `cache_n` (within the
/// calibration's tolerance) on every request of the real recordings, with their settings.
#[test]
fn the_reuse_predicted_at_a_requests_start_is_what_the_server_reports() {
    for (name, slots, cache_ram) in [
        ("parallel-nocache", 1, false),
        ("parallel", 1, true),
        ("session", 4, true),
    ] {
        let records = file_order(&format!("llmp/llama.cpp/{name}.jsonl"));
        let (_, reuse_at_start, _) = predicted_at_start(&records, slots, cache_ram);
        let report = analyze(&records, &Config::default());
        let (mut compared, mut agreed) = (0, 0);
        for row in &report.rows {
            let (Some(reused), Some(prompt), Some(tokens)) = (
                row.counts.reused_tokens,
                row.counts.prompt_tokens,
                reuse_at_start.get(&row.id),
            ) else {
                continue;
            };
            compared += 1;
            let predicted = u32::try_from(*tokens).unwrap_or(u32::MAX);
            if prefixscope_core::sim::agrees(prompt.value, reused.value, predicted) {
                agreed += 1;
            } else {
                eprintln!(
                    "{name} #{}: server {} of {}, predicted {predicted}",
                    row.id, reused.value, prompt.value
                );
            }
        }
        eprintln!("{name}: predicted at start {agreed} of {compared}");
        assert!(compared > 0);
        assert_eq!(agreed, compared, "{name}");
    }
}

/// `records` `copies` times, each copy an hour after the one before, with new ids.
fn hourly_copies(records: &[Record], copies: u64) -> Vec<Record> {
    (0..copies)
        .flat_map(|round| {
            let shift = round as i64 * 3_600_000;
            records.iter().map(move |record| {
                let mut record = record.clone();
                record.id += round * 10_000;
                record.t_start_ms += shift;
                record.t_end_ms += shift;
                if let Some(t) = record.t_first_byte_ms.as_mut() {
                    *t += shift;
                }
                record
            })
        })
        .collect()
}

/// Past its memory budget the live analysis starts again: what it holds stays near the budget,
/// the panes equal `analyze` of the records since the last restart, and every output says how
/// many records it dropped and what they lost (the summary, the `s` JSON, `replay --headless`).
#[test]
fn past_its_memory_budget_the_live_analysis_starts_again_and_says_what_it_dropped() {
    let one = file_order("llmp/llama.cpp/parallel-nocache.jsonl");
    let records = hourly_copies(&one, 6);
    let budget = 64 << 10;
    let mut engine = Engine::new(Config {
        memory_budget: budget,
        ..Config::default()
    });
    let mut restarted_at = Vec::new();
    for (i, record) in records.iter().enumerate() {
        let before = engine.snapshot().earlier.map_or(0, |e| e.restarts);
        engine.push(Input::Record(Arc::new(record.clone()), 0));
        assert!(engine.held_bytes() <= budget + (32 << 10));
        if engine.snapshot().earlier.map_or(0, |e| e.restarts) > before {
            restarted_at.push(i);
        }
    }
    let snapshot = engine.snapshot();
    let earlier = snapshot.earlier.clone().expect("the budget was reached");
    assert_eq!(earlier.restarts, restarted_at.len() as u64);
    let last = *restarted_at.last().unwrap();
    assert_eq!(earlier.records, last as u64);
    let dropped = analyze(&records[..last], &Config::default());
    let since = analyze(&records[last..], &Config::default());
    assert_eq!(snapshot.report.coverage.records, since.coverage.records);
    assert_eq!(snapshot.report.time.lost_tokens, since.time.lost_tokens);
    // What each earlier window lost, summed: at least what its records lost together, less
    // what a conversation split by a restart would have lost at the split.
    assert!(earlier.lost_tokens <= dropped.time.lost_tokens);
    assert!(earlier.lost_tokens > 0);
    let line = earlier.line();
    assert!(
        snapshot.summary().starts_with(&line),
        "{}",
        snapshot.summary()
    );
    assert!(
        line.contains(&format!("the {} records before", last)),
        "{line}"
    );
    assert_eq!(
        snapshot.to_json()["memory_budget"]["earlier_records"],
        last as u64
    );

    // The same traffic 60 times over (1,440 records) past a budget of 1 MiB, through the CLI.
    let file =
        std::env::temp_dir().join(format!("prefixscope-budget-{}.jsonl", std::process::id()));
    let text: String = hourly_copies(&one, 60)
        .iter()
        .map(|r| String::from_utf8(prefixscope_core::record::record_line(r)).unwrap())
        .collect();
    std::fs::write(&file, text).unwrap();
    let out = std::process::Command::new(BIN)
        .args([
            "replay",
            "--headless",
            "--instant",
            "--memory-budget",
            "1MiB",
        ])
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("memory budget (1 MiB) reached: the analysis started again"),
        "{stdout}"
    );
    let out = std::process::Command::new(BIN)
        .args([
            "replay",
            "--headless",
            "--instant",
            "--memory-budget",
            "1KiB",
        ])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "a budget below 1 MiB is refused"
    );
    let _ = std::fs::remove_file(&file);
}

/// One findings list behind every output: on every checked-in recording, every charged loss
/// belongs to a finding of `analysis::listed` (costliest first; nothing is left for a second
/// listing to add), the loss findings sum to the report's lost tokens, and the same list in
/// the same words is in `analyze`'s text, the live snapshot's findings view, `replay`'s
/// summary and the snapshot's HTML page.
#[test]
fn every_output_shows_one_findings_list_with_every_loss_in_it() {
    use prefixscope_core::analysis::{FindingKind, listed};
    let names = [
        "llmp/llama.cpp/parallel-nocache.jsonl",
        "llmp/llama.cpp/parallel.jsonl",
        "llmp/llama.cpp/session.jsonl",
        "llmp/llama.cpp/session.digest.jsonl",
        "llmp/ollama/session.jsonl",
        "llmp/ollama-openai/session.jsonl",
        "xllamacpp/session.jsonl",
        "xllamacpp/scenarios/alternate.jsonl",
        "xllamacpp/scenarios/append.jsonl",
        "xllamacpp/scenarios/date.jsonl",
        "xllamacpp/scenarios/short-first.jsonl",
        "xllamacpp/scenarios/tool-calls.jsonl",
        "xllamacpp/scenarios/two-slots.jsonl",
    ];
    for name in names {
        let records = file_order(name);
        let report = analyze(&records, &Config::default());
        let list = listed(&report, &report.findings);
        assert_eq!(
            listed(&report, &list).len(),
            list.len(),
            "{name}: a loss no finding speaks for"
        );
        let costs: Vec<u32> = list.iter().map(|f| f.lost_tokens.unwrap_or(0)).collect();
        assert!(costs.windows(2).all(|w| w[0] >= w[1]), "{name}: {costs:?}");
        let loss_kinds = [
            FindingKind::SideCallOnConversationModel,
            FindingKind::PrefixBreak,
            FindingKind::ServerCacheLoss,
            FindingKind::OtherConversationEviction,
            FindingKind::OtherModelEviction,
        ];
        let spoken: u64 = list
            .iter()
            .filter(|f| loss_kinds.contains(&f.kind))
            .map(|f| u64::from(f.lost_tokens.unwrap_or(0)))
            .sum();
        assert!(
            spoken >= report.time.lost_tokens,
            "{name}: findings speak for {spoken} of {} tokens lost",
            report.time.lost_tokens
        );
        let labels: Vec<String> = list
            .iter()
            .map(prefixscope_core::analysis::finding_label)
            .collect();

        // The live snapshot's findings view and summary, and the snapshot's HTML.
        let snapshot = engine_of(&records).snapshot();
        let advice: Vec<&str> = snapshot.advice().iter().map(|a| a.label.as_str()).collect();
        assert_eq!(advice, labels, "{name}: the findings view");
        let findings_lines = |text: &str| -> Vec<String> {
            text.lines()
                .skip_while(|l| *l != "findings:")
                .take_while(|l| l.starts_with("findings:") || l.starts_with("  "))
                .map(str::to_string)
                .collect()
        };
        let text = report.summary();
        assert_eq!(
            findings_lines(&snapshot.summary()),
            findings_lines(&text),
            "{name}: the live summary"
        );
        for label in labels.iter().take(3) {
            assert!(text.contains(label.as_str()), "{name}: {label}\n{text}");
        }
        let html = prefixscope::html_report::analysis_page(&snapshot.report, snapshot.findings());
        for label in &labels {
            assert!(
                html.contains(&prefixscope::html_report::escape(label)),
                "{name}: the HTML misses {label}"
            );
        }
    }
}

/// A page says "not measured" where `analyze` does, never "Nothing lost": Ollama's native API
/// reports no reuse, so its loss is unknown, not zero.
#[test]
fn the_html_page_says_not_measured_where_analyze_does() {
    let records = file_order("llmp/ollama/session.jsonl");
    let report = analyze(&records, &Config::default());
    assert!(
        report.summary().contains("not measured"),
        "{}",
        report.summary()
    );
    let html = prefixscope::html_report::analysis_page(&report, &report.findings);
    assert!(html.contains("Loss not measured"), "{html}");
    assert!(!html.contains("Nothing lost"), "{html}");
    let measured = analyze(
        &file_order("llmp/llama.cpp/parallel-nocache.jsonl"),
        &Config::default(),
    );
    let html = prefixscope::html_report::analysis_page(&measured, &measured.findings);
    assert!(!html.contains("not measured ("), "a measured loss is drawn");
}

/// The top prefixes are not led by the role markup every request starts with: a prefix under
/// `MIN_LISTED_PREFIX_TOKENS` is not listed (by count it led with `24× 4 tok`).
#[test]
fn the_prefixes_by_count_skip_fragments_of_a_few_tokens() {
    let records = file_order("llmp/llama.cpp/parallel-nocache.jsonl");
    let snapshot = engine_of(&records).snapshot();
    assert!(!snapshot.view.prefixes.is_empty());
    assert!(
        snapshot
            .view
            .prefixes
            .iter()
            .all(|i| i.prefix_tokens >= live::MIN_LISTED_PREFIX_TOKENS),
        "{:?}",
        snapshot
            .view
            .prefixes
            .iter()
            .map(|i| &i.label)
            .collect::<Vec<_>>()
    );
}

/// Every list pages and every view takes `s`: PgDn, PgUp, Home and End move the findings list
/// (they did nothing), and `s` inside a view writes the snapshot (it did nothing, silently).
#[test]
fn the_findings_list_pages_and_s_works_inside_a_view() {
    let (mut app, _) = app_on("llmp/llama.cpp/parallel-nocache.jsonl");
    key(&mut app, KeyCode::Char('f'));
    let len = app.advice_len();
    assert!(len > 1, "{len}");
    let selected = |app: &App| match &app.dialog {
        Some(Dialog::Findings { selected }) => *selected,
        _ => panic!("not the findings view"),
    };
    key(&mut app, KeyCode::End);
    assert_eq!(selected(&app), len - 1);
    key(&mut app, KeyCode::PageUp);
    assert_eq!(selected(&app), (len - 1).saturating_sub(10));
    key(&mut app, KeyCode::Home);
    assert_eq!(selected(&app), 0);
    key(&mut app, KeyCode::PageDown);
    assert_eq!(selected(&app), 10.min(len - 1));
    assert_eq!(key(&mut app, KeyCode::Char('s')), Action::Snapshot);
    assert_eq!(selected(&app), 10.min(len - 1), "s keeps the view open");
}

/// `/` searches what the requests sent: a word found only in user messages keeps exactly the
/// requests whose messages hold it (it matched client, model and break excerpts only, 1 of 15
/// requests that said "Monday" on a real session).
#[test]
fn the_filter_searches_the_message_text() {
    let records = file_order("llmp/llama.cpp/parallel-nocache.jsonl");
    let word = "Reviewer";
    let holding = records
        .iter()
        .filter(|r| {
            r.request.body.as_ref().is_some_and(|b| {
                b["messages"]
                    .to_string()
                    .to_lowercase()
                    .contains(&word.to_lowercase())
            })
        })
        .count();
    assert!(holding > 0 && holding < records.len(), "{holding}");
    let mut engine = engine_of(&records);
    engine.push(Input::Command(Command::Filter(word.into())));
    let snapshot = engine.snapshot();
    assert_eq!(snapshot.view.header.records, holding as u64);
}
