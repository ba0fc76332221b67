//! The TUI on ratatui's `TestBackend`: the real app loop (`tui::run`) fed a real recording on its
//! one event channel with a fixed clock, and the screens it draws compared with golden text
//! files (`PREFIXSCOPE_UPDATE_GOLDEN=1` rewrites them; say why in the commit).

#[path = "support/tui.rs"]
mod tui_support;

use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::Arc;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use prefixscope::tui::app::{Action, App, Source};
use prefixscope::tui::event::Event;
use prefixscope::tui::run;
use prefixscope::tui::theme::Theme;
use prefixscope_core::analysis::Config;
use prefixscope_core::live::{Engine, Input};
use prefixscope_core::record::{Record, read_jsonl};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use tui_support::{EngineControl, FixedClock, NoControl};

/// 2025-01-01T00:00:00Z: after every recording, so "n ago" texts stay put.
const NOW_MS: i64 = 1_735_689_600_000;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The records in the order the proxy completed them.
fn completion_order(name: &str) -> Vec<Record> {
    let text = std::fs::read(root().join("recordings").join(format!("{name}.jsonl"))).unwrap();
    let mut records = read_jsonl(text.as_slice()).records;
    records.sort_by_key(|r| (r.t_end_ms.max(r.t_start_ms), r.id));
    records
}

fn key(c: char) -> Event {
    Event::Key(KeyEvent::new(KeyCode::Char(c), KeyModifiers::NONE))
}

fn special(code: KeyCode) -> Event {
    Event::Key(KeyEvent::new(code, KeyModifiers::NONE))
}

/// The live engine fed every record of a recording (in completion order) and its end.
fn engine_of(name: &str) -> EngineControl {
    let records = completion_order(name);
    let mut engine = Engine::for_records(Config::default(), &records);
    for record in records {
        engine.push(Input::Record(Arc::new(record), NOW_MS));
    }
    engine.push(Input::SourceDone);
    EngineControl(RefCell::new(engine))
}

/// Runs the real loop on the engine's snapshot (the channel then closes), then on each event of
/// `then` in a batch of its own, as a person types; returns the last screen.
fn screen(name: &str, width: u16, height: u16, then: &[Event]) -> String {
    screen_with(name, width, height, then, Theme::plain(), text)
}

fn screen_with(
    name: &str,
    width: u16,
    height: u16,
    then: &[Event],
    theme: Theme,
    read: fn(&TestBackend) -> String,
) -> String {
    screen_on(engine_of(name), name, (width, height), then, theme, read)
}

/// `screen_with` on an engine fed as the test needs.
fn screen_on(
    control: EngineControl,
    name: &str,
    (width, height): (u16, u16),
    then: &[Event],
    theme: Theme,
    read: fn(&TestBackend) -> String,
) -> String {
    let (sender, receiver) = crossbeam_channel::unbounded();
    let snapshot = Arc::new(control.0.borrow_mut().snapshot());
    let mut app = App::new(
        Source::Replay {
            files: format!("{name}.jsonl"),
        },
        Arc::new(Engine::new(Config::default()).snapshot()),
    );
    sender.send(Event::Snapshot(snapshot)).unwrap();
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
    let clock = FixedClock(NOW_MS);
    drop(sender);
    run(&mut terminal, &mut app, &receiver, &clock, &control, &theme).unwrap();
    for event in then {
        let (sender, receiver) = crossbeam_channel::unbounded();
        sender.send(event.clone()).unwrap();
        drop(sender);
        run(&mut terminal, &mut app, &receiver, &clock, &control, &theme).unwrap();
    }
    read(terminal.backend())
}

/// Every row's text, then the runs of cells whose style is not the default, so colours,
/// highlight and modifiers are pinned too: `  @3-9 fg=Green bg=- +BOLD`.
fn styled(backend: &TestBackend) -> String {
    let buffer = backend.buffer();
    let mut out = String::new();
    for y in 0..buffer.area.height {
        let line: String = (0..buffer.area.width)
            .map(|x| buffer[(x, y)].symbol().to_string())
            .collect();
        out.push_str(line.trim_end());
        out.push('\n');
        let style_of = |x: u16| {
            let cell = &buffer[(x, y)];
            let color = |c: ratatui::style::Color| match c {
                ratatui::style::Color::Reset => "-".to_string(),
                other => format!("{other:?}"),
            };
            (
                color(cell.fg),
                color(cell.bg),
                format!("{:?}", cell.modifier),
            )
        };
        let mut x = 0;
        while x < buffer.area.width {
            let style = style_of(x);
            let start = x;
            while x < buffer.area.width && style_of(x) == style {
                x += 1;
            }
            if style != ("-".to_string(), "-".to_string(), "NONE".to_string()) {
                out.push_str(&format!(
                    "  @{start}-{} fg={} bg={} {}\n",
                    x - 1,
                    style.0,
                    style.1,
                    style.2
                ));
            }
        }
    }
    out
}

fn text(backend: &TestBackend) -> String {
    let buffer = backend.buffer();
    let mut out = String::new();
    for y in 0..buffer.area.height {
        let line: String = (0..buffer.area.width)
            .map(|x| buffer[(x, y)].symbol().to_string())
            .collect();
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn check_golden(file: &str, actual: &str) {
    let golden = root().join("tests/golden/tui").join(file);
    if std::env::var_os("PREFIXSCOPE_UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(golden.parent().unwrap()).unwrap();
        std::fs::write(&golden, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&golden).unwrap_or_default();
    assert!(
        expected == actual,
        "screen differs from {}; if intended, rerun with PREFIXSCOPE_UPDATE_GOLDEN=1 and say why in the commit\n--- actual ---\n{actual}",
        golden.display()
    );
}

#[test]
fn parallel_nocache_at_three_sizes() {
    for (width, height) in [(120, 40), (80, 24), (20, 5)] {
        let screen = screen("llmp/llama.cpp/parallel-nocache", width, height, &[]);
        check_golden(&format!("parallel-nocache.{width}x{height}.txt"), &screen);
    }
    let big = screen("llmp/llama.cpp/parallel-nocache", 120, 40, &[]);
    assert!(big.contains("lost 8,604 tokens"), "{big}");
    assert!(big.contains("22 turns in 5 conversations"), "{big}");
    assert!(
        big.contains("\"…s. Today is Monday.\" → \"…s. Today is Tuesday.\""),
        "{big}"
    );
    let tiny = screen("llmp/llama.cpp/parallel-nocache", 20, 5, &[]);
    assert!(tiny.contains("needs"), "{tiny}");
}

#[test]
fn every_recording_draws_at_80x24() {
    for name in [
        "llmp/llama.cpp/session",
        "llmp/llama.cpp/parallel",
        "llmp/ollama/session",
        "llmp/llama.cpp/session.digest",
        "llmp/ollama-openai/session",
        "xllamacpp/session",
    ] {
        let path = root().join("recordings").join(format!("{name}.jsonl"));
        if !path.exists() {
            continue;
        }
        let screen = screen(name, 80, 24, &[]);
        check_golden(&format!("{}.80x24.txt", name.replace('/', "--")), &screen);
    }
}

#[test]
fn keys_help_filter_detail_and_pause() {
    let name = "llmp/llama.cpp/parallel-nocache";
    let help = screen(name, 100, 30, &[key('?')]);
    check_golden("parallel-nocache.help.txt", &help);
    assert!(help.contains("snapshot"), "{help}");

    // `/` opens the filter; typing and Enter filters the conversations to one client.
    let mut typed = vec![key('/')];
    typed.extend("other-agent".chars().map(key));
    typed.push(special(KeyCode::Enter));
    let filtered = screen(name, 120, 40, &typed);
    check_golden("parallel-nocache.filtered.txt", &filtered);
    assert!(filtered.contains("filter: other-agent"), "{filtered}");
    assert!(!filtered.contains("llmp-drive/1 #2 c3"), "{filtered}");

    // Tab to the breaks, down to the system-prompt change, Enter for its detail.
    let mut keys = vec![special(KeyCode::Tab)];
    keys.extend(std::iter::repeat_n(special(KeyCode::Down), 7));
    keys.push(special(KeyCode::Enter));
    let detail = screen(name, 120, 40, &keys);
    check_golden("parallel-nocache.detail.txt", &detail);

    let paused = screen(name, 120, 40, &[key('p')]);
    assert!(paused.contains("PAUSED"), "{paused}");
}

/// A trace has no messages: the cache panes fill, the others say what they would need.
#[test]
fn a_mooncake_trace_feeds_the_cache_panes_only() {
    use prefixscope::tui::app::Input;
    use prefixscope_core::input::{self, Format, InputOptions};
    let file = std::fs::File::open(root().join("tests/data/mooncake/conversation_trace.jsonl.gz"))
        .unwrap();
    let reader = input::decompressed(std::io::BufReader::new(file)).unwrap();
    let options = InputOptions {
        block_size: Some(512),
        ..InputOptions::default()
    };
    let trace = input::read(reader, "conversation_trace", Format::Mooncake, &options);
    let mut engine = Engine::with_block_size(Config::default(), 512);
    for request in trace.requests.into_iter().take(2_000) {
        engine.push(prefixscope_core::live::Input::Request(
            Arc::new(request),
            NOW_MS,
        ));
    }
    engine.push(prefixscope_core::live::Input::SourceDone);
    let (sender, receiver) = crossbeam_channel::unbounded();
    sender
        .send(Event::Snapshot(Arc::new(engine.snapshot())))
        .unwrap();
    drop(sender);
    let mut app = App::new(
        Source::Replay {
            files: "conversation_trace.jsonl.gz".into(),
        },
        Arc::new(Engine::new(Config::default()).snapshot()),
    );
    app.input = Input::RequestsOnly("mooncake".into());
    let mut terminal = Terminal::new(TestBackend::new(120, 40)).unwrap();
    run(
        &mut terminal,
        &mut app,
        &receiver,
        &FixedClock(NOW_MS),
        &NoControl,
        &Theme::plain(),
    )
    .unwrap();
    let screen = text(terminal.backend());
    check_golden("mooncake-2000.120x40.txt", &screen);
    assert!(
        screen.contains("2,000 requests of a mooncake input"),
        "{screen}"
    );
    assert!(screen.contains("has no messages"), "{screen}");
    assert!(
        screen.contains("512-token blocks") || screen.contains("ceiling"),
        "{screen}"
    );
}

/// `c` turns the sparkline into a chart of LRU, FIFO and (worked out for the chart) optimal.
#[test]
fn the_chart_key_shows_lru_fifo_and_optimal() {
    let chart = screen("llmp/llama.cpp/session", 120, 40, &[key('c')]);
    check_golden("session.chart.txt", &chart);
    assert!(chart.contains("Hit rate by capacity (chart)"), "{chart}");
    for name in ["LRU", "FIFO", "optimal"] {
        assert!(chart.contains(name), "{name}:\n{chart}");
    }
}

/// Colours, highlight and modifiers, cell by cell: the focused pane's border, the selected
/// row, a turn's cell by its reuse, the chart's series.
#[test]
fn styled_screens_pin_colours_and_highlight() {
    let colour = Theme { color: true };
    let name = "llmp/llama.cpp/parallel-nocache";
    for (width, height) in [(120, 40), (80, 24)] {
        let screen = screen_with(name, width, height, &[], colour, styled);
        check_golden(
            &format!("parallel-nocache.{width}x{height}.styled.txt"),
            &screen,
        );
    }
    let breaks = screen_with(
        name,
        120,
        40,
        &[special(KeyCode::Tab), special(KeyCode::Down)],
        colour,
        styled,
    );
    check_golden("parallel-nocache.breaks-selected.styled.txt", &breaks);
    let chart = screen_with(
        "llmp/llama.cpp/session",
        120,
        40,
        &[key('c')],
        colour,
        styled,
    );
    check_golden("session.chart.styled.txt", &chart);
}

/// Ollama reports no reuse: every pane says "not measured", as `analyze` does, never a zero.
#[test]
fn a_server_without_reuse_counters_shows_not_measured_never_zero() {
    for name in ["llmp/ollama/session", "llmp/ollama-openai/session"] {
        let screen = screen(name, 120, 40, &[]);
        assert!(
            screen.contains("prefixscope · loss not measured (no reuse and timing counts)"),
            "{screen}"
        );
        assert!(screen.contains("llmp-drive: not measured"), "{screen}");
        assert!(screen.contains("server reuse not rep"), "{screen}");
        assert!(!screen.contains("lost 0 tokens"), "{screen}");
        assert!(!screen.contains("0 tok,"), "{screen}");
        assert!(!screen.contains("no loss"), "{screen}");
    }
}

/// The chart on traffic whose policies differ (the Mooncake trace): optimal, LRU and FIFO each
/// in their own colour and marker, cell by cell, with the ceiling and every capacity labelled.
#[test]
fn the_chart_shows_optimal_over_lru_over_fifo_cell_by_cell() {
    use prefixscope::tui::app::Input as Shows;
    use prefixscope_core::input::{self, Format, InputOptions};
    let file = std::fs::File::open(root().join("tests/data/mooncake/conversation_trace.jsonl.gz"))
        .unwrap();
    let reader = input::decompressed(std::io::BufReader::new(file)).unwrap();
    let options = InputOptions {
        block_size: Some(512),
        ..InputOptions::default()
    };
    let trace = input::read(reader, "conversation_trace", Format::Mooncake, &options);
    let mut engine = Engine::with_block_size(Config::default(), 512);
    for request in trace.requests.into_iter().take(2_000) {
        engine.push(Input::Request(Arc::new(request), NOW_MS));
    }
    engine.push(Input::SourceDone);
    let first = Arc::new(engine.snapshot());
    // The data first: optimal ≥ LRU ≥ FIFO at every capacity once the chart asks for optimal.
    let control = EngineControl(RefCell::new(engine));
    let mut app = App::new(
        Source::Replay {
            files: "conversation_trace.jsonl.gz".into(),
        },
        Arc::new(Engine::new(Config::default()).snapshot()),
    );
    app.input = Shows::RequestsOnly("mooncake".into());
    let mut terminal = Terminal::new(TestBackend::new(120, 40)).unwrap();
    let clock = FixedClock(NOW_MS);
    let colour = Theme { color: true };
    for events in [vec![Event::Snapshot(first)], vec![key('c')]] {
        let (sender, receiver) = crossbeam_channel::unbounded();
        for event in events {
            sender.send(event).unwrap();
        }
        drop(sender);
        run(
            &mut terminal,
            &mut app,
            &receiver,
            &clock,
            &control,
            &colour,
        )
        .unwrap();
    }
    let curve = app.view().curve.clone().unwrap();
    for (label, lru, fifo, optimal) in &curve.points {
        let optimal = optimal.unwrap();
        assert!(
            optimal >= *lru && *lru >= *fifo,
            "{label}: {optimal} {lru} {fifo}"
        );
    }
    let screen = styled(terminal.backend());
    check_golden("mooncake-2000.chart.styled.txt", &screen);
    for colour in ["Magenta", "Green", "Yellow", "Cyan"] {
        assert!(
            screen.contains(&format!("fg={colour}")),
            "{colour}:\n{screen}"
        );
    }
    // Every capacity of the axis (from one block up to the working set) is labelled.
    for (label, ..) in &curve.points {
        assert!(screen.contains(label.as_str()), "{label}:\n{screen}");
    }
    // Cell by cell: in every column of the plot, the highest optimal cell is not below the
    // highest LRU cell, nor that below the highest FIFO cell (where a series is hidden by a
    // higher one drawn over it, it is not there to compare). One row of slack: the dot marker
    // places a point to the cell, braille to a quarter of one, so two lines a row apart in value
    // can round to either order.
    let buffer = terminal.backend().buffer();
    let top_row = |x: u16, colour: ratatui::style::Color| {
        (0..buffer.area.height).find(|&y| {
            let cell = &buffer[(x, y)];
            cell.fg == colour && !cell.symbol().trim().is_empty() && !cell.symbol().is_ascii()
        })
    };
    use ratatui::style::Color;
    let mut columns = 0;
    for x in 0..buffer.area.width {
        let (optimal, lru, fifo) = (
            top_row(x, Color::Magenta),
            top_row(x, Color::Green),
            top_row(x, Color::Yellow),
        );
        if let (Some(o), Some(l)) = (optimal, lru) {
            assert!(o <= l + 1, "column {x}: optimal at row {o}, LRU at {l}");
            columns += 1;
        }
        if let (Some(l), Some(f)) = (lru, fifo) {
            assert!(l <= f + 1, "column {x}: LRU at row {l}, FIFO at {f}");
            columns += 1;
        }
    }
    assert!(columns > 0, "no column shows two series:\n{screen}");
}

/// Model names, user agents and message text with terminal escapes (window title, clear screen,
/// C1 CSI): no cell of any screen holds a control character.
#[test]
fn recorded_terminal_escapes_never_reach_a_cell() {
    let hostile = std::fs::read(root().join("tests/data/hostile-escapes.jsonl")).unwrap();
    let mut engine = Engine::new(Config::default());
    for record in read_jsonl(hostile.as_slice()).records {
        engine.push(Input::Record(Arc::new(record), NOW_MS));
    }
    engine.push(Input::SourceDone);
    let control = EngineControl(RefCell::new(engine));
    let snapshot = Arc::new(control.0.borrow_mut().snapshot());
    let mut app = App::new(
        Source::Replay {
            files: "hostile\x1b]0;pwned\x07.jsonl".into(),
        },
        Arc::new(Engine::new(Config::default()).snapshot()),
    );
    let mut terminal = Terminal::new(TestBackend::new(120, 40)).unwrap();
    let clock = FixedClock(NOW_MS);
    let theme = Theme::plain();
    // The first screen, each pane focused, and the detail of the selected request.
    let mut events = vec![Event::Snapshot(snapshot)];
    for _ in 0..5 {
        events.push(special(KeyCode::Tab));
        events.push(special(KeyCode::Enter));
        events.push(special(KeyCode::Esc));
    }
    events.push(Event::Warning("bad line: \x1b[2J".into()));
    for (screen, event) in events.into_iter().enumerate() {
        let (sender, receiver) = crossbeam_channel::unbounded();
        sender.send(event).unwrap();
        drop(sender);
        run(&mut terminal, &mut app, &receiver, &clock, &control, &theme).unwrap();
        let buffer = terminal.backend().buffer();
        for cell in buffer.content.iter() {
            assert!(
                !cell.symbol().chars().any(char::is_control),
                "{:?} on screen {screen}:\n{}",
                cell.symbol(),
                text(terminal.backend())
            );
        }
    }
    assert!(text(terminal.backend()).contains("pwned"));
}

/// Past the newest 1,000 breaks the pane says how many there are in all.
#[test]
fn the_breaks_title_says_when_only_the_newest_are_described() {
    let mut engine = Engine::new(Config::default());
    for record in completion_order("llmp/llama.cpp/parallel-nocache") {
        engine.push(Input::Record(Arc::new(record), NOW_MS));
    }
    let mut snapshot = engine.snapshot();
    snapshot.view.breaks_total = 12_345;
    let mut app = App::new(
        Source::Replay {
            files: "many".into(),
        },
        Arc::new(snapshot),
    );
    let mut terminal = Terminal::new(TestBackend::new(120, 40)).unwrap();
    let (sender, receiver) = crossbeam_channel::unbounded::<Event>();
    drop(sender);
    run(
        &mut terminal,
        &mut app,
        &receiver,
        &FixedClock(NOW_MS),
        &NoControl,
        &Theme::plain(),
    )
    .unwrap();
    let screen = text(terminal.backend());
    assert!(
        screen.contains("Prefix breaks (newest 1,000 of 12,345)"),
        "{screen}"
    );
}

/// A live proxy's trouble reaches the status bar: why the upstream is down, requests the HTTP
/// parser refused, connections not accepted (`Control::proxy_notes`).
#[test]
fn the_status_bar_says_why_the_upstream_is_down_and_what_was_refused() {
    struct Troubled;
    impl prefixscope::tui::Control for Troubled {
        fn upstream_ok(&self) -> Option<bool> {
            Some(false)
        }
        fn proxy_notes(&self) -> Vec<String> {
            vec![
                "TLS handshake with up:443 failed: invalid peer certificate".into(),
                "2 refused (not recorded)".into(),
            ]
        }
    }
    let (sender, receiver) = crossbeam_channel::unbounded();
    let mut app = App::new(
        Source::Live {
            upstream: "https://up".into(),
            listen: "127.0.0.1:8787".into(),
            recording: "rec.jsonl".into(),
        },
        Arc::new(Engine::new(Config::default()).snapshot()),
    );
    sender.send(Event::Resize(200, 30)).unwrap();
    drop(sender);
    let mut terminal = Terminal::new(TestBackend::new(200, 30)).unwrap();
    run(
        &mut terminal,
        &mut app,
        &receiver,
        &FixedClock(NOW_MS),
        &Troubled,
        &Theme::plain(),
    )
    .unwrap();
    let screen = text(terminal.backend());
    assert!(screen.contains("UPSTREAM DOWN"), "{screen}");
    assert!(
        screen.contains("TLS handshake with up:443 failed"),
        "{screen}"
    );
    assert!(screen.contains("2 refused (not recorded)"), "{screen}");
}

/// Issue #12, "counts that agree": a filter filters the header and the Loss pane's "all" line
/// (the same loss entries the client lines sum), lists only the clients it matches, and the
/// cache panes, which simulate every request, say they are unfiltered.
#[test]
fn a_filter_filters_the_header_and_the_all_line_or_says_unfiltered() {
    let name = "llmp/llama.cpp/parallel-nocache";
    let mut typed = vec![key('/')];
    typed.extend("other-agent".chars().map(key));
    typed.push(special(KeyCode::Enter));
    let screen = screen(name, 240, 40, &typed);
    let header = screen.lines().next().unwrap();
    assert!(
        header.contains(
            "filter other-agent: lost 2,134 tokens, 580 ms (79% of prefill) · 5 of 24 requests, 5 turns in 1 conversation"
        ),
        "{screen}"
    );
    assert!(
        screen.contains("all matching /other-agent: 2,134 tokens, 580 ms of 736 ms prefill (79%)"),
        "{screen}"
    );
    // Only the client the filter matches, never one at "0 tok" below a total that is not its.
    assert!(!screen.contains("llmp-drive/1 #1:"), "{screen}");
    assert!(!screen.contains(": 0 tok"), "{screen}");
    assert!(
        screen.contains("Hit rate by capacity (unfiltered)"),
        "{screen}"
    );
    assert!(
        screen.contains("Top prefixes by count (unfiltered)"),
        "{screen}"
    );

    // The filtered totals are the unfiltered client's own, from the same loss entries.
    let control = engine_of(name);
    let all = control.0.borrow_mut().snapshot();
    control
        .0
        .borrow_mut()
        .push(Input::Command(prefixscope_core::live::Command::Filter(
            "other-agent".into(),
        )));
    let filtered = control.0.borrow_mut().snapshot();
    let client = all
        .view
        .losses
        .iter()
        .find(|l| l.client == "other-agent/2")
        .unwrap();
    let h = &filtered.view.header;
    assert_eq!(h.lost_tokens, client.tokens);
    assert_eq!(h.lost_ms, client.ms);
    assert_eq!(u64::from(client.requests), h.records);
    assert_eq!(h.all_records, all.view.header.records);
    assert_eq!(
        filtered.view.losses.iter().map(|l| l.tokens).sum::<u64>(),
        h.lost_tokens
    );
    // With no filter the header is the report's, as `analyze` prints it.
    assert_eq!(all.view.header.lost_tokens, all.report.time.lost_tokens);
    assert!(all.view.header.filter.is_empty());

    // A filter that matches nothing says so.
    let mut typed = vec![key('/')];
    typed.extend("nobody-here".chars().map(key));
    typed.push(special(KeyCode::Enter));
    let none = self::screen(name, 120, 40, &typed);
    assert!(none.contains("no request matches /nobody-here"), "{none}");
    assert!(none.contains("0 of 24 requests"), "{none}");
}

/// The header counts the records received and the hit rate's cold replay the requests it
/// simulates (a model list, a failed exchange or a non-2xx answer has no prompt to cache): the
/// header gives both, the summary says what was left out and why.
#[test]
fn the_header_and_the_hit_rate_count_the_same_requests_or_say_why_not() {
    let name = "llmp/llama.cpp/parallel-nocache";
    let screen = screen(name, 240, 40, &[]);
    assert!(
        screen
            .lines()
            .next()
            .unwrap()
            .contains("24 requests (23 simulated), 22 turns in 5 conversations"),
        "{screen}"
    );
    assert!(screen.contains("cold replay of 23 requests"), "{screen}");
    let snapshot = engine_of(name).0.borrow_mut().snapshot();
    assert_eq!((snapshot.requests, snapshot.simulated), (24, 23));
    assert_eq!(
        snapshot.not_simulated,
        vec![("not a prompt API".to_string(), 1)]
    );
    let summary = snapshot.summary();
    assert!(
        summary.contains("prefixscope: 24 requests over"),
        "{summary}"
    );
    assert!(
        summary.contains("hit rate (cold replay of 23 requests, "),
        "{summary}"
    );
    assert!(
        summary.contains(
            "the hit rate simulates 23 of 24 requests (not simulated: 1 not a prompt API)"
        ),
        "{summary}"
    );
    let json = snapshot.to_json();
    assert_eq!(json["requests_received"], 24);
    assert_eq!(json["requests_simulated"], 23);
    assert_eq!(json["not_simulated"]["not a prompt API"], 1);

    // On every recording, what was received is what was simulated and what was not, by reason.
    for name in [
        "llmp/llama.cpp/session",
        "llmp/llama.cpp/parallel",
        "llmp/llama.cpp/parallel-nocache",
        "llmp/ollama/session",
        "llmp/llama.cpp/session.digest",
        "llmp/ollama-openai/session",
        "xllamacpp/session",
    ] {
        let snapshot = engine_of(name).0.borrow_mut().snapshot();
        let left_out: u64 = snapshot.not_simulated.iter().map(|(_, n)| n).sum();
        assert_eq!(snapshot.simulated + left_out, snapshot.requests, "{name}");
        assert_eq!(
            snapshot
                .view
                .curve
                .as_ref()
                .unwrap()
                .label
                .split(',')
                .next(),
            Some(format!("cold replay of {} requests", snapshot.simulated).as_str()),
            "{name}"
        );
        assert_eq!(
            snapshot.simulated == snapshot.requests,
            snapshot.simulated_line().is_none(),
            "{name}"
        );
    }
}

/// One of a thing is singular wherever a count is printed: the header, the curve, the summary,
/// the status messages.
#[test]
fn one_request_turn_conversation_and_exchange_are_singular() {
    let records = completion_order("llmp/llama.cpp/session");
    let first = records
        .into_iter()
        .find(|r| r.request.path.contains("chat"))
        .unwrap();
    let mut engine = Engine::for_records(Config::default(), [&first]);
    engine.push(Input::Record(Arc::new(first), NOW_MS));
    engine.push(Input::SourceDone);
    let snapshot = engine.snapshot();
    let summary = snapshot.summary();
    for text in [
        "prefixscope: 1 request",
        "1 analysed, 1 turn in 1 conversation",
        "coverage: 1 of 1 record analysed",
        "reuse reported on 1 of 1 turn",
        "cold replay of 1 request, ",
    ] {
        assert!(summary.contains(text), "{text}:\n{summary}");
    }
    assert!(!summary.contains("1 requests"), "{summary}");

    let control = EngineControl(RefCell::new(engine));
    let mut app = App::new(
        Source::Live {
            upstream: "http://up".into(),
            listen: "127.0.0.1:8787".into(),
            recording: "rec.jsonl".into(),
        },
        Arc::new(snapshot),
    );
    let mut terminal = Terminal::new(TestBackend::new(160, 30)).unwrap();
    let clock = FixedClock(NOW_MS);
    let theme = Theme::plain();
    let draw = |app: &mut App, terminal: &mut Terminal<TestBackend>, event: Event| {
        let (sender, receiver) = crossbeam_channel::unbounded();
        sender.send(event).unwrap();
        drop(sender);
        run(terminal, app, &receiver, &clock, &control, &theme).unwrap();
        text(terminal.backend())
    };
    let screen = draw(&mut app, &mut terminal, Event::Resize(160, 30));
    assert!(
        screen.contains("1 request, 1 turn in 1 conversation"),
        "{screen}"
    );

    // The end of the demo is a status, not a warning; an agent's error is a warning.
    let finished = prefixscope::session::demo::end_of_demo(&Ok(prefixscope_demo::script::RunLog {
        requests: Vec::new(),
        events: Vec::new(),
        errors: Vec::new(),
    }));
    assert!(
        matches!(&finished, Event::Notice(text) if text == "demo finished: 0 requests; q quits")
    );
    let screen = draw(&mut app, &mut terminal, finished);
    assert_eq!(app.warnings, 0);
    assert!(
        screen.contains("demo finished: 0 requests; q quits"),
        "{screen}"
    );
    assert!(!screen.contains("warning"), "{screen}");
    let stopped = prefixscope::session::demo::end_of_demo(&Err("connection refused".into()));
    assert!(matches!(&stopped, Event::Warning(text) if text == "demo stopped: connection refused"));
    let screen = draw(&mut app, &mut terminal, stopped);
    assert_eq!(app.warnings, 1);
    assert!(screen.contains("0 bad lines, 1 warning "), "{screen}");

    // `q` with one exchange in flight.
    app.in_flight = 1;
    struct OneInFlight;
    impl prefixscope::tui::Control for OneInFlight {
        fn in_flight(&self) -> u64 {
            1
        }
    }
    let (sender, receiver) = crossbeam_channel::unbounded();
    sender.send(key('q')).unwrap();
    drop(sender);
    run(
        &mut terminal,
        &mut app,
        &receiver,
        &clock,
        &OneInFlight,
        &theme,
    )
    .unwrap();
    let screen = text(terminal.backend());
    assert!(
        screen.contains("waiting for 1 exchange in flight; q again to quit now"),
        "{screen}"
    );
}

/// Quitting `watch` or `demo` with an exchange in flight: the proxy answers it, the recorder
/// writes it and closes the engine's channel, and the summary is the engine's last snapshot,
/// taken after it analysed that record too (`session::screen::last_snapshot`, what
/// `run_screen_live` returns), so it counts what "records written" counts.
#[test]
fn the_summary_after_quit_counts_the_exchange_that_was_in_flight() {
    use prefixscope::session::screen::last_snapshot;
    use std::time::Duration;
    let mut records = completion_order("llmp/llama.cpp/parallel-nocache");
    let in_flight = records.pop().unwrap();
    let (records_tx, records_rx) = crossbeam_channel::unbounded();
    let (events_tx, events_rx) = crossbeam_channel::unbounded();
    let handle = prefixscope_core::live::spawn(
        Engine::new(Config::default()),
        Some(records_rx),
        Arc::new(|| NOW_MS),
        move |snapshot| {
            let _ = events_tx.send(Event::Snapshot(snapshot));
        },
    );
    let shown = records.len() as u64;
    for record in records {
        records_tx.send(Arc::new(record)).unwrap();
    }
    // What was on screen when `q` was pressed.
    let on_screen = loop {
        match events_rx.recv_timeout(Duration::from_secs(30)) {
            Ok(Event::Snapshot(snapshot)) if snapshot.requests == shown => break snapshot,
            Ok(_) => {}
            Err(e) => panic!("no snapshot of {shown} requests: {e}"),
        }
    };
    // The exchange in flight completes and is written; then the recorder finishes.
    records_tx.send(Arc::new(in_flight)).unwrap();
    drop(records_tx);
    let last = last_snapshot(Arc::clone(&on_screen), handle, &events_rx);
    assert_eq!((on_screen.requests, last.requests), (shown, shown + 1));
    assert!(
        last.summary().starts_with("prefixscope: 24 requests over"),
        "{}",
        last.summary()
    );
    assert_eq!(last.report.coverage.records, 24);

    // Nothing new since the screen's snapshot: that one stands.
    let (events_tx, events_rx) = crossbeam_channel::unbounded();
    let (records_tx, records_rx) = crossbeam_channel::unbounded::<Arc<Record>>();
    let handle = prefixscope_core::live::spawn(
        Engine::new(Config::default()),
        Some(records_rx),
        Arc::new(|| NOW_MS),
        move |snapshot| {
            let _ = events_tx.send(Event::Snapshot(snapshot));
        },
    );
    drop(records_tx);
    let last = last_snapshot(Arc::clone(&on_screen), handle, &events_rx);
    assert!(Arc::ptr_eq(&last, &on_screen));
}

/// The records of a recording in file order (what `prefixscope whatif FILE` reads).
fn file_records(name: &str) -> Vec<Record> {
    let text = std::fs::read(root().join("recordings").join(format!("{name}.jsonl"))).unwrap();
    read_jsonl(text.as_slice()).records
}

/// Runs the real binary; its stdout.
fn binary(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_prefixscope"))
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// Issue #13, drill-down: any turn is reachable. In Conversations ↓ picks the lane, ← → move
/// along its turns, Enter opens that turn (cause and cost first, then the fix, what changed),
/// Esc comes back to the panes. The figures are the report's row's.
#[test]
fn a_middle_turn_of_a_lane_opens_with_its_cause_cost_and_fix() {
    let name = "llmp/llama.cpp/parallel-nocache";
    let snapshot = engine_of(name).0.borrow_mut().snapshot();
    let lane = &snapshot.view.lanes[1];
    assert_eq!(lane.conversation, 2);
    let cell = &lane.cells[2];
    let row = snapshot.row(cell.id).unwrap();
    let loss = row.lost_external.as_ref().unwrap();
    assert_eq!(loss.cause, "other_conversation");

    let keys = [
        special(KeyCode::Down),
        special(KeyCode::Left),
        special(KeyCode::Left),
    ];
    let lanes = screen(name, 120, 40, &keys);
    assert!(
        lanes.contains(&format!("t{} lost {} tok", cell.turn, loss.tokens)),
        "{lanes}"
    );
    let mut open = keys.to_vec();
    open.push(special(KeyCode::Enter));
    for (width, height) in [(120, 40), (80, 24)] {
        let detail = screen(name, width, height, &open);
        assert!(
            detail.contains(&format!("c2 turn {}", cell.turn)),
            "{detail}"
        );
        assert!(
            detail.contains(&format!("other conversation: lost {} tokens", loss.tokens)),
            "{detail}"
        );
        assert!(detail.contains("fix:"), "{detail}");
        assert!(detail.contains("-np"), "{detail}");
        let styled_detail = screen_with(name, width, height, &open, Theme { color: true }, styled);
        check_golden(
            &format!("parallel-nocache.turn-detail.{width}x{height}.styled.txt"),
            &styled_detail,
        );
    }
    // Esc goes back to the panes, the same turn still selected.
    open.push(special(KeyCode::Esc));
    let back = screen(name, 120, 40, &open);
    assert!(back.contains("Prefix breaks"), "{back}");
    assert!(
        back.contains(&format!("t{} lost {} tok", cell.turn, loss.tokens)),
        "{back}"
    );

    // The system prompt change: before and after as written, the changed span highlighted.
    let c1 = &snapshot.view.lanes[0];
    let changed = c1
        .cells
        .iter()
        .position(|c| c.broke.is_some() && c.lost_tokens > 0)
        .unwrap();
    let mut keys = vec![special(KeyCode::Home)];
    keys.extend(std::iter::repeat_n(special(KeyCode::Right), changed));
    keys.push(special(KeyCode::Enter));
    let detail = screen_with(name, 120, 40, &keys, Theme { color: true }, styled);
    assert!(
        detail.contains("system prompt changed: lost 584 tokens"),
        "{detail}"
    );
    assert!(
        detail.contains("before: sentences. Today is Monday."),
        "{detail}"
    );
    assert!(
        detail.contains("after:  sentences. Today is Tuesday."),
        "{detail}"
    );
    assert!(!detail.contains("\\\""), "{detail}");
    assert!(detail.contains("move it after the stable part"), "{detail}");
    assert!(detail.contains("REVERSED"), "{detail}");
    check_golden("parallel-nocache.system-change.120x40.styled.txt", &detail);
}

/// Issue #13, findings with fixes: ranked by cost, the other-conversation evictions first with
/// the `--cache-ram` / `-np` fix and the savings `prefixscope whatif` predicts on the same file.
#[test]
fn the_findings_view_gives_the_fix_and_whatifs_saving() {
    use prefixscope_core::sim::what_if;
    let name = "llmp/llama.cpp/parallel-nocache";
    let records = file_records(name);
    let file = root().join("recordings").join(format!("{name}.jsonl"));
    let file = file.to_str().unwrap();
    let findings = screen(name, 120, 40, &[key('f')]);
    assert!(findings.contains("1. other conversations"), "{findings}");
    assert!(findings.contains("-np N"), "{findings}");
    for (args, slots, cache_ram, flag) in [
        (vec!["--cache-ram", "on"], 1, true, "--cache-ram on"),
        (
            vec!["--slots", "4", "--cache-ram", "off"],
            4,
            false,
            "-np 4",
        ),
        (
            vec!["--slots", "2", "--cache-ram", "off"],
            2,
            false,
            "-np 2",
        ),
    ] {
        // Saved against the server's own settings (one slot, no host cache), both simulated.
        let w = what_if(&records, slots, cache_ram);
        let own = what_if(&records, 1, false);
        let saved = own.predicted.lost_tokens - w.predicted.lost_tokens;
        let shown = format!(
            "{flag}: −{} tokens",
            prefixscope_core::units::thousands(saved)
        );
        assert!(findings.contains(&shown), "{shown}:\n{findings}");
        // The binary's own figures, on the same file.
        let mut command = vec!["whatif", file, "--json"];
        command.extend(args.iter().copied());
        let json: serde_json::Value = serde_json::from_str(&binary(&command)).unwrap();
        assert_eq!(json["recorded"]["lost_tokens"], w.recorded.lost_tokens);
        assert_eq!(json["predicted"]["lost_tokens"], w.predicted.lost_tokens);
    }
    // The README's figure: 8,604 tokens lost, 584 with the host cache on (8,600 simulated).
    assert!(
        findings.contains("--cache-ram on: −8,016 tokens"),
        "{findings}"
    );
    for (width, height) in [(120, 40), (80, 24)] {
        let styled_findings = screen_with(
            name,
            width,
            height,
            &[key('f')],
            Theme { color: true },
            styled,
        );
        check_golden(
            &format!("parallel-nocache.findings.{width}x{height}.styled.txt"),
            &styled_findings,
        );
    }
    // Enter opens the finding's turns, Enter again one of them.
    let rows = screen(name, 120, 40, &[key('f'), special(KeyCode::Enter)]);
    assert!(
        rows.contains("cache lost to other conversations on 15 turns"),
        "{rows}"
    );
    let turn = screen(
        name,
        120,
        40,
        &[key('f'), special(KeyCode::Enter), special(KeyCode::Enter)],
    );
    assert!(turn.contains("other conversation: lost"), "{turn}");

    // The `s` text prints each fix with its saving on one line.
    let snapshot = engine_of(name).0.borrow_mut().snapshot();
    let summary = snapshot.summary();
    assert!(
        summary.lines().any(|l| l
            .trim_start()
            .starts_with("--cache-ram on: −8,016 tokens, −")),
        "{summary}"
    );
    let json = snapshot.to_json();
    assert_eq!(json["fixes"][0]["savings"][0]["saved_tokens"], 8_016);
    // Every token lost is in one entry of the view: the findings, and the losses too few for
    // one (the system-prompt change, once) in the same table's words.
    let listed: u64 = snapshot
        .advice()
        .iter()
        .map(|a| u64::from(a.finding.lost_tokens.unwrap_or(0)))
        .sum();
    assert_eq!(listed, snapshot.report.time.lost_tokens);
    assert!(
        findings.contains("system prompt changes on 1 turn (gemma): 584 tokens"),
        "{findings}"
    );
    assert!(
        findings.contains("a date or time in the system prompt"),
        "{findings}"
    );
}

/// A demo scenario run to its end (×1000, seed 3): its records, the real app's 120×40 screens
/// after the engine's last snapshot and after `then`, and the engine that made them.
fn demo_screens(scenario: &str, then: Event) -> (Vec<Record>, Vec<String>, EngineControl) {
    use prefixscope::session::demo::{Demo, DemoConfig};
    let config = DemoConfig {
        scenario: scenario.into(),
        slots: None,
        cache_ram: false,
        speed: 1000.0,
        seed: 3,
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
    let mut engine = Engine::for_records(Config::default(), &outcome.records);
    for record in &outcome.records {
        engine.push(Input::Record(Arc::new(record.clone()), NOW_MS));
    }
    engine.push(Input::SourceDone);
    let control = EngineControl(RefCell::new(engine));
    let snapshot = Arc::new(control.0.borrow_mut().snapshot());
    let mut app = App::new(
        Source::Replay {
            files: format!("{scenario} demo"),
        },
        Arc::new(Engine::new(Config::default()).snapshot()),
    );
    let mut terminal = Terminal::new(TestBackend::new(120, 40)).unwrap();
    let clock = FixedClock(NOW_MS);
    let mut screens = Vec::new();
    for event in [Event::Snapshot(snapshot), then] {
        let (sender, receiver) = crossbeam_channel::unbounded();
        sender.send(event).unwrap();
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
        screens.push(text(terminal.backend()));
    }
    (outcome.records, screens, control)
}

/// Issue #13: on the volatile-system demo the findings view names the changing span of the
/// system prompt, where it is, and the fix.
#[test]
fn the_volatile_system_demo_shows_where_the_system_prompt_changes_and_the_fix() {
    let (records, screens, control) = demo_screens("volatile-system", key('f'));
    // Every lost token is in one entry of the findings view: they sum to `analyze`'s total.
    let total = prefixscope_core::analysis::analyze(&records, &Config::default())
        .time
        .lost_tokens;
    let screen = &screens[1];
    assert!(screen.contains("1. system prompt changes"), "{screen}");
    assert!(
        screen.contains("at character 24 of the system prompt"),
        "{screen}"
    );
    assert!(screen.contains("0000000000000000]"), "{screen}");
    assert!(screen.contains("0000000000000001]"), "{screen}");
    assert!(screen.contains("move it after the stable part"), "{screen}");
    let listed: u64 = control
        .0
        .borrow_mut()
        .snapshot()
        .advice()
        .iter()
        .map(|a| u64::from(a.finding.lost_tokens.unwrap_or(0)))
        .sum();
    assert!(total > 0);
    assert_eq!(listed, total);
    // One entry for it, not two (the prefix-break finding says the same with less).
    assert!(
        !screen.contains("prompt prefix broken by system prompt changes"),
        "{screen}"
    );
}

/// Issue #13, culprits: what each client suffered and what it caused (from `evicted_by`), by
/// cost; on parallel-nocache both sum to the total loss and equal `analyze --json`'s rows.
#[test]
fn caused_and_suffered_sum_to_the_loss_and_equal_analyzes_evicted_by() {
    let name = "llmp/llama.cpp/parallel-nocache";
    let snapshot = engine_of(name).0.borrow_mut().snapshot();
    let view = &snapshot.view;
    let total = view.header.lost_tokens;
    assert_eq!(total, 8_604);
    let suffered: u64 = view.losses.iter().map(|l| l.tokens).sum();
    let caused: u64 = view.losses.iter().map(|l| l.caused_tokens).sum::<u64>()
        + view.unattributed.iter().map(|u| u.1).sum::<u64>();
    assert_eq!((suffered, caused), (total, total));
    // By cost, highest first.
    let costs: Vec<u64> = view
        .losses
        .iter()
        .map(|l| l.tokens.max(l.caused_tokens))
        .collect();
    assert!(costs.windows(2).all(|w| w[0] >= w[1]), "{costs:?}");

    let file = root().join("recordings").join(format!("{name}.jsonl"));
    let json: serde_json::Value =
        serde_json::from_str(&binary(&["analyze", file.to_str().unwrap(), "--json"])).unwrap();
    let mut expect_suffered: std::collections::BTreeMap<String, u64> = Default::default();
    let mut expect_caused: std::collections::BTreeMap<String, u64> = Default::default();
    for row in json["rows"].as_array().unwrap() {
        let client = row["client"].as_str().unwrap().to_string();
        let tokens = |loss: &serde_json::Value| loss["tokens"].as_u64().unwrap_or(0);
        if !row["lost_client"].is_null() {
            *expect_suffered.entry(client.clone()).or_default() += tokens(&row["lost_client"]);
            *expect_caused.entry(client.clone()).or_default() += tokens(&row["lost_client"]);
        }
        if !row["lost_external"].is_null() {
            *expect_suffered.entry(client.clone()).or_default() += tokens(&row["lost_external"]);
            let by = row["evicted_by"]["client"].as_str().unwrap_or("(server)");
            *expect_caused.entry(by.to_string()).or_default() += tokens(&row["lost_external"]);
        }
    }
    for l in &view.losses {
        assert_eq!(
            l.tokens,
            expect_suffered.get(&l.client).copied().unwrap_or(0),
            "{}",
            l.client
        );
        assert_eq!(
            l.caused_tokens,
            expect_caused.get(&l.client).copied().unwrap_or(0),
            "{}",
            l.client
        );
    }
    // The figures (llmp's weights less what the previous prompts' own counts held):
    // other-agent/2 suffered 2,134 and caused 2,473; llmp-drive/1 lost nothing but cost others
    // 390.
    let of = |client: &str| view.losses.iter().find(|l| l.client == client).unwrap();
    assert_eq!(
        (
            of("other-agent/2").tokens,
            of("other-agent/2").caused_tokens
        ),
        (2_134, 2_473)
    );
    assert_eq!(
        (of("llmp-drive/1").tokens, of("llmp-drive/1").caused_tokens),
        (0, 390)
    );

    // On screen, with column headers; Enter opens a client's causes, suffered and caused.
    let pane = screen(
        name,
        120,
        40,
        &[special(KeyCode::Tab), special(KeyCode::Tab)],
    );
    assert!(pane.contains("client"), "{pane}");
    assert!(pane.contains("suffered"), "{pane}");
    assert!(pane.contains("caused"), "{pane}");
    let keys = [
        special(KeyCode::Tab),
        special(KeyCode::Tab),
        special(KeyCode::Down),
        special(KeyCode::Enter),
    ];
    let client = screen(name, 120, 40, &keys);
    assert!(client.contains("other-agent (other-agent/2)"), "{client}");
    assert!(client.contains("suffered: 2,134 tokens"), "{client}");
    assert!(client.contains("caused: 2,473 tokens"), "{client}");
    check_golden("parallel-nocache.client.120x40.txt", &client);
}

/// Issue #16: a snapshot holds a cell for every turn, so its lanes hold their own length and
/// share their client's names, and a cell's evictor is its row's, its strings shared.
#[test]
fn lanes_hold_their_length_and_share_their_names() {
    let name = "llmp/llama.cpp/parallel-nocache";
    let snapshot = engine_of(name).0.borrow_mut().snapshot();
    let lanes = &snapshot.view.lanes;
    assert!(lanes.len() > 1);
    let mut evicted = 0;
    for lane in lanes {
        assert_eq!(
            lane.cells.capacity(),
            lane.cells.len(),
            "lane {}",
            lane.conversation
        );
        for other in lanes.iter().filter(|o| o.client == lane.client) {
            assert!(Arc::ptr_eq(&lane.client, &other.client));
            assert!(Arc::ptr_eq(&lane.alias, &other.alias));
        }
        for cell in &lane.cells {
            let row = snapshot.row(cell.id).unwrap();
            let of_row = row
                .evicted_by
                .as_ref()
                .map(|by| (by.row, &*by.client, &*by.kind));
            let of_cell = cell
                .evicted_by
                .as_ref()
                .map(|by| (by.row, &*by.client, &*by.kind));
            assert_eq!(of_cell, of_row, "#{}", cell.id);
            evicted += usize::from(of_cell.is_some());
        }
    }
    assert!(evicted > 1);
    let kinds: Vec<&Arc<str>> = lanes
        .iter()
        .flat_map(|l| &l.cells)
        .filter_map(|c| c.evicted_by.as_ref().map(|by| &by.kind))
        .collect();
    for a in &kinds {
        for b in &kinds {
            assert_eq!(a == b, Arc::ptr_eq(a, b));
        }
    }
}

/// Issue #13: the cells encode the loss, by colour and by glyph, so a `NO_COLOR` screen still
/// tells a lossy turn from a clean one: `■` exactly where nothing was lost.
#[test]
fn without_colour_a_lossy_turn_still_differs_from_a_clean_one() {
    for name in [
        "llmp/llama.cpp/parallel-nocache",
        "llmp/llama.cpp/session",
        "xllamacpp/session",
    ] {
        let snapshot = engine_of(name).0.borrow_mut().snapshot();
        for lane in &snapshot.view.lanes {
            for cell in &lane.cells {
                let glyph = cell.mark.glyph();
                if cell.lost_tokens > 0 {
                    assert!(["×", "!", "~"].contains(&glyph), "{name} #{}", cell.id);
                } else {
                    assert!(["■", "?"].contains(&glyph), "{name} #{}", cell.id);
                }
            }
        }
    }
    let plain = screen("llmp/llama.cpp/parallel-nocache", 120, 40, &[]);
    assert!(plain.contains("■!!×!!"), "{plain}");
    // The legend is in the help.
    let help = screen("llmp/llama.cpp/parallel-nocache", 120, 40, &[key('?')]);
    for text in [
        "■ nothing lost",
        "× the client broke the prefix",
        "! evicted by",
        "#2",
    ] {
        assert!(help.contains(text), "{text}:\n{help}");
    }
}

/// Issue #13, layout: at 120 columns the cause and the cost of every visible break line are
/// whole; Top prefixes have column headers and Enter opens what a prefix is made of; `z` zooms.
#[test]
fn break_lines_lead_with_cause_and_cost_and_tables_have_headers() {
    let name = "llmp/llama.cpp/parallel-nocache";
    let snapshot = engine_of(name).0.borrow_mut().snapshot();
    let screen_text = screen(name, 120, 40, &[]);
    let shown: Vec<&str> = screen_text.lines().collect();
    let mut checked = 0;
    for b in &snapshot.view.breaks {
        let lead = format!(
            "{}: {} tok",
            b.cause,
            prefixscope::tui::view::tokens(u64::from(b.tokens))
        );
        if shown.iter().any(|l| l.contains(&lead)) {
            checked += 1;
        }
    }
    assert!(checked >= 8, "{checked} break lines whole:\n{screen_text}");
    for (width, height) in [(120, 40), (80, 24)] {
        let s = screen(name, width, height, &[]);
        for line in s.lines().skip(2).take(height as usize / 2) {
            if let Some(cell) = line.split('│').nth(3)
                && cell.contains(" tok")
            {
                let head = cell.split(" · ").next().unwrap();
                assert!(!head.contains('…'), "{width}: {line}");
            }
        }
    }
    let prefixes = screen(name, 120, 40, &[special(KeyCode::BackTab)]);
    for header in ["count", "tokens", "prefix", "share"] {
        assert!(prefixes.contains(header), "{header}:\n{prefixes}");
    }
    let opened = screen(
        name,
        120,
        40,
        &[special(KeyCode::BackTab), special(KeyCode::Enter)],
    );
    assert!(opened.contains("what it is made of"), "{opened}");
    assert!(opened.contains("requests start with the same"), "{opened}");
    check_golden("parallel-nocache.prefix.120x40.txt", &opened);
    let zoomed = screen(name, 80, 24, &[special(KeyCode::Tab), key('z')]);
    assert!(!zoomed.contains("Conversations"), "{zoomed}");
    assert!(!zoomed.contains("Loss per client"), "{zoomed}");
    assert!(zoomed.contains("Prefix breaks"), "{zoomed}");
    check_golden("parallel-nocache.zoom-breaks.80x24.txt", &zoomed);
}

/// Issue #13, the capacity view in llama.cpp's terms: Enter on the hit-rate pane gives the hit
/// rate and the tokens lost under the simulated server at `-np` 1/2/4/8 × `--cache-ram` off/on,
/// each what `prefixscope whatif FILE --slots N --cache-ram …` predicts on the same records,
/// beside the real server's reuse; the setting nearest what the server did is marked.
#[test]
fn the_capacity_view_is_whatif_at_every_setting() {
    use prefixscope_core::sim::what_if;
    let name = "llmp/llama.cpp/parallel-nocache";
    let records = file_records(name);
    let keys = [
        special(KeyCode::Tab),
        special(KeyCode::Tab),
        special(KeyCode::Tab),
        special(KeyCode::Enter),
    ];
    let view = screen(name, 120, 40, &keys);
    assert!(
        view.contains("the real server: 0.0% reused, lost 8,604 tokens"),
        "{view}"
    );
    for (slots, cache_ram) in prefixscope_core::analysis::CAPACITY_SETTINGS {
        let w = what_if(&records, slots, cache_ram);
        let prompt: u64 = w.requests.iter().map(|r| u64::from(r.prompt_tokens)).sum();
        let reused: u64 = w
            .requests
            .iter()
            .map(|r| u64::from(r.predicted_reused))
            .sum();
        let cell = format!(
            "{:>5.1}% {:>7}",
            100.0 * reused as f64 / prompt as f64,
            prefixscope::tui::view::tokens(w.predicted.lost_tokens)
        );
        let row = view
            .lines()
            .find(|l| l.contains(&format!("│-np {slots} ")))
            .unwrap_or_else(|| panic!("-np {slots}:\n{view}"));
        let half = if cache_ram {
            row.split_at(row.char_indices().nth(41).unwrap().0).1
        } else {
            row.split_at(row.char_indices().nth(41).unwrap().0).0
        };
        assert!(
            half.contains(&cell),
            "-np {slots} {cache_ram}: {cell}\n{view}"
        );
    }
    // The one-slot server without the host cache is what the recording shows (0% reused,
    // 8,604 tokens lost), within 1%.
    let one = view.lines().find(|l| l.contains("│-np 1 ")).unwrap();
    let lost: u64 = one
        .split_whitespace()
        .nth(3)
        .map(|n| n.replace(',', ""))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{one}"));
    assert!(
        lost.abs_diff(8_604) * 100 <= 8_604 && one.contains('◀'),
        "{view}"
    );
    // Who holds the slot now: the replay at the marked setting (the server's own, inferred
    // from the traffic: the recording has no /props), its calibration the one `prefixscope
    // whatif` prints for it.
    let report = prefixscope_core::analysis::analyze(
        &records,
        &prefixscope_core::analysis::Config::default(),
    );
    let slots = prefixscope_core::sim::residency(&records, &report, 1, false);
    let (compared, agreed) = slots
        .calibration
        .iter()
        .fold((0, 0), |(c, a), m| (c + m.compared, a + m.agreed));
    assert_eq!((compared, agreed), (23, 23));
    for line in [
        "who holds each slot, replayed at -np 1 --cache-ram off (its own settings: /props and the traffic)".to_string(),
        format!("calibration: the replay matched the server's reuse on {agreed} of {compared} requests"),
        format!("slot 0  c{} ", slots.holders[0].as_ref().unwrap().conversation.unwrap()),
    ] {
        assert!(view.contains(&line), "{line}\n{view}");
    }
    assert!(view.contains("next: a request of c"), "{view}");
    for (width, height) in [(120, 40), (80, 24)] {
        let styled_view = screen_with(name, width, height, &keys, Theme { color: true }, styled);
        check_golden(
            &format!("parallel-nocache.capacity.{width}x{height}.styled.txt"),
            &styled_view,
        );
    }
    // With the host cache on, the server's own settings are `--cache-ram on`.
    let on = screen("llmp/llama.cpp/parallel", 120, 40, &keys);
    let marked = on.lines().find(|l| l.contains('◀')).unwrap();
    assert!(
        marked.find('◀') > marked.find("-np").map(|i| i + 40),
        "{on}"
    );
}

/// `watch` before its first request says how to point each harness at the proxy.
#[test]
fn the_first_screen_of_watch_gives_the_base_urls() {
    let mut app = App::new(
        Source::Live {
            upstream: "http://127.0.0.1:8080".into(),
            listen: "127.0.0.1:8787".into(),
            recording: "rec.jsonl".into(),
        },
        Arc::new(Engine::new(Config::default()).snapshot()),
    );
    let (sender, receiver) = crossbeam_channel::unbounded();
    sender.send(Event::Resize(120, 40)).unwrap();
    drop(sender);
    let mut terminal = Terminal::new(TestBackend::new(120, 40)).unwrap();
    run(
        &mut terminal,
        &mut app,
        &receiver,
        &FixedClock(NOW_MS),
        &NoControl,
        &Theme::plain(),
    )
    .unwrap();
    let screen = text(terminal.backend());
    for text in [
        "Conversations: waiting for the first request; point your harness at the proxy",
        "ANTHROPIC_BASE_URL=http://127.0.0.1:8787 claude",
        "OPENAI_BASE_URL=http://127.0.0.1:8787/v1",
        "OLLAMA_HOST=http://127.0.0.1:8787",
        "--openai-api-base http://127.0.0.1:8787/v1",
    ] {
        assert!(screen.contains(text), "{text}:\n{screen}");
    }
    check_golden("watch-first-screen.120x40.txt", &screen);
}

/// Issue #13, who evicts whom: `w` gives clients × clients from `evicted_by`; each row sums to
/// what that client caused, each column to what it suffered, the whole to the loss.
#[test]
fn who_cost_whom_sums_to_caused_suffered_and_the_loss() {
    let name = "llmp/llama.cpp/parallel-nocache";
    let snapshot = engine_of(name).0.borrow_mut().snapshot();
    let view = &snapshot.view;
    for l in &view.losses {
        let caused: u64 = view
            .who_cost_whom
            .iter()
            .filter(|(c, _, _)| c.as_deref() == Some(l.client.as_str()))
            .map(|e| e.2)
            .sum();
        let suffered: u64 = view
            .who_cost_whom
            .iter()
            .filter(|(_, v, _)| *v == l.client)
            .map(|e| e.2)
            .sum();
        assert_eq!(
            (caused, suffered),
            (l.caused_tokens, l.tokens),
            "{}",
            l.client
        );
    }
    let all: u64 = view.who_cost_whom.iter().map(|e| e.2).sum();
    assert_eq!(all, 8_604);
    let matrix = screen(name, 120, 40, &[key('w')]);
    assert!(matrix.contains("caused by"), "{matrix}");
    assert!(matrix.contains("8,604"), "{matrix}");
    check_golden("parallel-nocache.who-cost-whom.120x40.txt", &matrix);
    let narrow = screen(name, 80, 24, &[key('w')]);
    check_golden("parallel-nocache.who-cost-whom.80x24.txt", &narrow);
}

/// A click on a cell selects that turn (Enter then opens it).
#[test]
fn a_click_on_a_cell_selects_that_turn() {
    use crossterm::event::{MouseButton, MouseEvent, MouseEventKind};
    let click = |column, row| {
        Event::Mouse(MouseEvent {
            kind: MouseEventKind::Down(MouseButton::Left),
            column,
            row,
            modifiers: KeyModifiers::NONE,
        })
    };
    // Lane c2 is the second (row 4, under the column headers); its cells start after the name
    // (13), `c2  ` and `‹`.
    let opened = screen(
        "llmp/llama.cpp/parallel-nocache",
        120,
        40,
        &[click(1 + 20 + 2, 4), special(KeyCode::Enter)],
    );
    assert!(opened.contains("c2 turn 3"), "{opened}");
}

/// aider's restored history: the lane and the break pane name the harness (from its system
/// prompt: its user-agent is the OpenAI SDK's) and the reorder, with `analyze`'s figures.
#[test]
fn a_harness_is_named_and_a_reorder_is_called_one() {
    let aider = screen("../tests/data/harness/aider", 120, 40, &[]);
    assert!(aider.contains("aider c1"), "{aider}");
    assert!(
        aider.contains("history reordered: 101 tok")
            && aider.contains("history reordered: 107 tok"),
        "{aider}"
    );
    assert!(aider.contains("lost 208 tokens"), "{aider}");
    let claude = screen("../tests/data/harness/claude-code.digest", 120, 40, &[]);
    assert!(claude.contains("Claude Code c1"), "{claude}");
    assert!(claude.contains("no prefix breaks"), "{claude}");
}

/// Runs the loop on a recording's snapshot, then on each event, and hands back the app and the
/// terminal (for what a key returns, such as `o`'s lines).
fn app_after(
    name: &str,
    width: u16,
    height: u16,
    then: &[Event],
    theme: &Theme,
) -> (App, Terminal<TestBackend>, EngineControl) {
    let control = engine_of(name);
    let snapshot = Arc::new(control.0.borrow_mut().snapshot());
    let mut app = App::new(
        Source::Replay {
            files: format!("{name}.jsonl"),
        },
        Arc::new(Engine::new(Config::default()).snapshot()),
    );
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
    let clock = FixedClock(NOW_MS);
    for event in std::iter::once(Event::Snapshot(snapshot)).chain(then.iter().cloned()) {
        let (sender, receiver) = crossbeam_channel::unbounded();
        sender.send(event).unwrap();
        drop(sender);
        run(&mut terminal, &mut app, &receiver, &clock, &control, theme).unwrap();
    }
    (app, terminal, control)
}

/// Issue #13, break text: the whole message before and after, scrollable to its end, the
/// changed span highlighted in each, and `o` writes both whole texts as recorded.
#[test]
fn a_breaks_whole_texts_scroll_with_the_change_highlighted_and_o_writes_them() {
    let name = "llmp/llama.cpp/parallel-nocache";
    let theme = Theme { color: true };
    // The system-prompt change, as in `keys_help_filter_detail_and_pause`.
    let mut keys = vec![special(KeyCode::Tab)];
    keys.extend(std::iter::repeat_n(special(KeyCode::Down), 7));
    keys.push(special(KeyCode::Enter));
    keys.push(special(KeyCode::End));
    // At 80x24 the last page is the after text's end too, the change highlighted.
    let (_, narrow, _) = app_after(name, 80, 24, &keys, &theme);
    let narrow = styled(narrow.backend());
    check_golden("parallel-nocache.break-text-end.80x24.styled.txt", &narrow);
    assert!(narrow.contains("Today is Tuesday."), "{narrow}");
    let (mut app, terminal, control) = app_after(name, 120, 40, &keys, &theme);
    let end = styled(terminal.backend());
    check_golden("parallel-nocache.break-text-end.120x40.styled.txt", &end);
    assert!(
        end.contains("message 0 after, whole (1,353 bytes):"),
        "{end}"
    );
    // The last page: the after text's end, its changed span reversed.
    let lines: Vec<&str> = end.lines().collect();
    let tuesday = lines
        .iter()
        .position(|l| l.contains("sentences. Today is Tuesday."))
        .unwrap();
    let at = lines[tuesday].find("Tues").unwrap();
    let column = lines[tuesday][..at].chars().count();
    assert!(
        lines[tuesday + 1..]
            .iter()
            .take_while(|l| l.starts_with("  @"))
            .any(|l| l.starts_with(&format!("  @{column}-{} ", column + 3))
                && l.contains("REVERSED")),
        "{end}"
    );
    // ↑ from the end moves at once (the scroll stops at the last page, never past it).
    let up = {
        let (sender, receiver) = crossbeam_channel::unbounded();
        sender.send(special(KeyCode::Up)).unwrap();
        drop(sender);
        let mut terminal = terminal;
        run(
            &mut terminal,
            &mut app,
            &receiver,
            &FixedClock(NOW_MS),
            &control,
            &theme,
        )
        .unwrap();
        text(terminal.backend())
    };
    assert_ne!(up, text_of_styled(&end), "{up}");
    // `o`: both whole texts, as recorded, in the view's file.
    let Action::WriteView(what, written) = app.handle(key('o'), NOW_MS) else {
        panic!("o did not write the view");
    };
    assert!(what.starts_with("request-"), "{what}");
    let snapshot = control.0.borrow_mut().snapshot();
    let id: u64 = what["request-".len()..].parse().unwrap();
    let row = snapshot.row(id).unwrap();
    let texts = row.break_location.unwrap().texts.unwrap();
    let file = written.join("\n");
    assert!(file.contains(&*texts.before), "{file}");
    assert!(file.contains(&*texts.after), "{file}");
    assert!(texts.before.ends_with("Today is Monday."));
    assert!(texts.after.ends_with("Today is Tuesday."));
}

/// The text rows of a `styled` screen.
fn text_of_styled(styled: &str) -> String {
    styled
        .lines()
        .filter(|l| !l.starts_with("  @"))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// The real replay's pacer behind the app: `g` and what it reads, drained into an engine here
/// (records stamped with the fixed clock) so the screen can be compared.
struct Seeking {
    pacer: Arc<prefixscope::session::replay::Pacer>,
}

impl prefixscope::tui::Control for Seeking {
    fn pause_source(&self, paused: bool) -> bool {
        self.pacer.pause(paused);
        true
    }
    fn seek_source(&self, to: prefixscope::tui::Seek) -> Result<String, String> {
        self.pacer.seek(to)
    }
}

/// What the feeder sends until it stops sending for a while (held), stamped with `NOW_MS`.
fn drain(inputs: &crossbeam_channel::Receiver<Input>) -> Vec<Input> {
    let mut got = Vec::new();
    while let Ok(input) = inputs.recv_timeout(std::time::Duration::from_millis(300)) {
        got.push(match input {
            Input::Record(record, _) => Input::Record(record, NOW_MS),
            other => other,
        });
    }
    got
}

/// The screen of an app shown one snapshot of `engine`, after `keys`.
fn screen_of(engine: &mut Engine, name: &str, control: &dyn prefixscope::tui::Control) -> String {
    let mut app = App::new(
        Source::Replay {
            files: format!("{name}.jsonl"),
        },
        Arc::new(Engine::new(Config::default()).snapshot()),
    );
    app.speed = Some(1.0);
    app.source_paused = true;
    let mut terminal = Terminal::new(TestBackend::new(120, 40)).unwrap();
    let (sender, receiver) = crossbeam_channel::unbounded();
    sender
        .send(Event::Snapshot(Arc::new(engine.snapshot())))
        .unwrap();
    drop(sender);
    let clock = FixedClock(NOW_MS);
    run(
        &mut terminal,
        &mut app,
        &receiver,
        &clock,
        control,
        &Theme::plain(),
    )
    .unwrap();
    text(terminal.backend())
}

/// Issue #13, replay controls: `g` seeks forward to a record or a time, reading on at once and
/// holding there; the screen then is the screen of a replay fed up to that record.
#[test]
fn seek_reads_on_to_a_record_or_a_time_and_the_screen_equals_a_replay_fed_that_far() {
    use prefixscope::session::replay::{Replay, ReplayConfig, measure_block_model};
    use prefixscope::tui::Seek;
    let name = "llmp/llama.cpp/parallel-nocache";
    let path = root().join("recordings").join(format!("{name}.jsonl"));
    let replay = Replay::open(&ReplayConfig {
        files: vec![path.clone()],
        speed: 1.0,
        instant: false,
        analysis: Default::default(),
    })
    .unwrap();
    let pacer = Arc::clone(&replay.pacer);
    pacer.pause(true);
    let feeder = replay.feeder(|_| {});
    let (sender, inputs) = crossbeam_channel::unbounded();
    let feeding = std::thread::spawn(move || feeder(sender));
    // Held before the first record: only the block model comes.
    let mut engine = Engine::new(Config::default());
    let first = drain(&inputs);
    assert_eq!(first.len(), 1);
    for input in first {
        engine.push(input);
    }

    // `g 10 Enter` in the app: the loop asks the pacer.
    let control = Seeking {
        pacer: Arc::clone(&pacer),
    };
    let mut app = App::new(
        Source::Replay {
            files: format!("{name}.jsonl"),
        },
        Arc::new(engine.snapshot()),
    );
    app.speed = Some(1.0);
    let mut terminal = Terminal::new(TestBackend::new(120, 40)).unwrap();
    let clock = FixedClock(NOW_MS);
    let mut typed = vec![key('g')];
    typed.extend("10".chars().map(key));
    let mut dialog = String::new();
    for event in typed.into_iter().chain([special(KeyCode::Enter)]) {
        if matches!(&event, Event::Key(k) if k.code == KeyCode::Enter) {
            dialog = text(terminal.backend());
        }
        let (sender, receiver) = crossbeam_channel::unbounded();
        sender.send(event).unwrap();
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
    }
    assert!(
        dialog.contains("seek: read on to a record or a time"),
        "{dialog}"
    );
    assert!(dialog.contains("10"), "{dialog}");
    let status = text(terminal.backend());
    assert!(
        status.contains("reading on to record 10, then paused"),
        "{status}"
    );
    assert!(app.source_paused);
    let read = drain(&inputs);
    assert_eq!(read.len(), 10, "exactly ten records, then held");
    assert_eq!(pacer.sent(), 10);
    for input in read {
        engine.push(input);
    }
    let seeked = screen_of(&mut engine, name, &NoControl);

    // The same recording fed its first ten records in file order, with the same block model.
    let records = read_jsonl(std::fs::read(&path).unwrap().as_slice()).records;
    let mut fed = Engine::new(Config::default());
    fed.push(Input::BlockModel(Box::new(measure_block_model(
        std::slice::from_ref(&path),
    ))));
    for record in records.iter().take(10) {
        fed.push(Input::Record(Arc::new(record.clone()), NOW_MS));
    }
    assert_eq!(seeked, screen_of(&mut fed, name, &NoControl));
    assert!(seeked.contains("10 req"), "{seeked}");

    // Forward only: back is refused with why; a time reads on to the records at or before it.
    assert!(
        pacer
            .seek(Seek::Record(5))
            .unwrap_err()
            .contains("forward only")
    );
    let tenth = records[9].t_end_ms.max(records[9].t_start_ms);
    let ahead: Vec<i64> = records[10..]
        .iter()
        .map(|r| r.t_end_ms.max(r.t_start_ms))
        .collect();
    let until = tenth + 5_000;
    let expected = ahead.iter().take_while(|t| **t <= until).count();
    let said = pacer.seek(Seek::Ahead(5_000)).unwrap();
    assert!(said.contains("then paused"), "{said}");
    assert_eq!(drain(&inputs).len(), expected);
    assert!(expected > 0 && expected < ahead.len(), "{expected}");
    pacer.stop();
    feeding.join().unwrap();
}

/// Issue #13, savings past the live what-if's cap: the findings view says what replaying more
/// would cost (measured, BENCHMARKS.md) and names the command that does it.
#[test]
fn past_the_whatif_cap_the_findings_say_its_measured_cost_and_the_command() {
    let mut records = completion_order("llmp/llama.cpp/parallel-nocache");
    let one_round = records.clone();
    let mut next = records.iter().map(|r| r.id).max().unwrap() + 1;
    let mut offset = 0;
    while records.len() <= prefixscope_core::live::MAX_WHATIF_RECORDS {
        // Each round later and with new ids, as a longer recording would be.
        offset += 3_600_000;
        for r in &one_round {
            let mut r = r.clone();
            r.id = next;
            next += 1;
            r.t_start_ms += offset;
            r.t_end_ms += offset;
            records.push(r);
        }
    }
    let mut engine = Engine::for_records(Config::default(), &records);
    for record in records {
        engine.push(Input::Record(Arc::new(record), NOW_MS));
    }
    engine.push(Input::SourceDone);
    let control = EngineControl(RefCell::new(engine));
    let snapshot = Arc::new(control.0.borrow_mut().snapshot());
    let mut app = App::new(
        Source::Replay {
            files: "long.jsonl".into(),
        },
        Arc::new(Engine::new(Config::default()).snapshot()),
    );
    let mut terminal = Terminal::new(TestBackend::new(200, 50)).unwrap();
    let clock = FixedClock(NOW_MS);
    for event in [Event::Snapshot(snapshot), key('f')] {
        let (sender, receiver) = crossbeam_channel::unbounded();
        sender.send(event).unwrap();
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
    }
    let screen = text(terminal.backend());
    assert!(screen.contains("past the live what-if's 1,000"), "{screen}");
    assert!(screen.contains("4.6 s and 250 MiB at 5,000"), "{screen}");
    assert!(
        screen.contains("savings: run prefixscope whatif on the recording"),
        "{screen}"
    );
}

/// The help scrolls to its last page and no further: ↑ from there moves at once.
#[test]
fn the_help_stops_at_its_last_page() {
    let name = "llmp/llama.cpp/parallel-nocache";
    let mut keys = vec![key('?')];
    keys.extend(std::iter::repeat_n(special(KeyCode::PageDown), 10));
    let bottom = screen(name, 100, 30, &keys);
    assert!(
        bottom.contains("lost tokens recorded minus predicted"),
        "{bottom}"
    );
    keys.push(special(KeyCode::Up));
    let up = screen(name, 100, 30, &keys);
    assert_ne!(up, bottom);
    assert!(up.contains("help: keys, cells, figures"), "{up}");
}

/// Issue #14: on the sliding-window demo the break list names every forced re-prefill the
/// engine's, the header's loss is `analyze`'s, and the findings view gives the server's fix.
#[test]
fn the_swa_demo_names_the_engines_re_prefills_on_screen() {
    let (records, screens, _) = demo_screens("swa", key('f'));
    let report = prefixscope_core::analysis::analyze(&records, &Config::default());
    let (main, findings) = (&screens[0], &screens[1]);
    let forced = report
        .rows
        .iter()
        .filter(|r| r.engine_cause.is_some())
        .count();
    assert!(forced >= 4, "{forced}");
    assert_eq!(
        main.matches("the engine's: sliding-window cache").count(),
        forced.min(main.matches("server emptied cache").count()),
        "{main}"
    );
    assert!(
        main.contains("the engine's: sliding-window cache"),
        "{main}"
    );
    assert!(
        main.contains(&format!(
            "lost {} tokens",
            prefixscope_core::units::thousands(report.time.lost_tokens)
        )),
        "{main}"
    );
    assert!(findings.contains("--swa-full"), "{findings}");
}

/// `watch` while a request is in flight: the proxy handed it over at its start, its record has
/// not come, and the capacity view says where the server will run it and whose prefix it
/// evicts, marked predicted, before the server answers; the line is what
/// `sim::residency_with_starts` works out for the same records (the path `whatif`
/// prints), on screen at 120x40 and, scrolled, at 80x24.
#[test]
fn a_request_in_flight_is_predicted_in_the_capacity_view() {
    use prefixscope_core::sim::residency_with_starts;
    let name = "llmp/llama.cpp/parallel-nocache";
    let records = completion_order(name);
    let (done, last) = records.split_at(records.len() - 1);
    let mut start = last[0].clone();
    assert_eq!(start.request.path, "/v1/chat/completions");
    start.response = None;
    let settings = prefixscope_core::live::ServerSettings {
        slots: 1,
        cache_ram: false,
        source: "the server's slot count from its /props".into(),
    };
    let fed = || {
        let mut engine = Engine::for_records(Config::default(), done);
        engine.set_server_settings(Some(settings.clone()));
        for record in done {
            engine.push(Input::Record(Arc::new(record.clone()), NOW_MS));
        }
        engine.push(Input::Started(Arc::new(start.clone())));
        EngineControl(RefCell::new(engine))
    };
    let report = prefixscope_core::analysis::analyze(done, &Config::default());
    let headless = residency_with_starts(done, &report, std::slice::from_ref(&start), 1, false);
    let predicted = &headless.starting[0];
    let evicts = predicted
        .evicts
        .as_ref()
        .expect("it evicts the slot's holder");
    let keys = [
        special(KeyCode::Tab),
        special(KeyCode::Tab),
        special(KeyCode::Tab),
        special(KeyCode::Enter),
    ];
    let view = screen_on(fed(), name, (120, 40), &keys, Theme::plain(), text);
    let line = match predicted.conversation {
        Some(c) => format!("in flight: #{} of c{c} ", start.id),
        None => format!("in flight: #{} of ", start.id),
    };
    let shown = view
        .lines()
        .find(|l| l.contains(&line))
        .unwrap_or_else(|| panic!("{line}\n{view}"));
    for part in [
        "→ slot 0, evicting ".to_string(),
        format!("(#{})", evicts.record),
        format!("(predicted; reuses {:.0}%)", predicted.reused_share * 100.0),
    ] {
        assert!(shown.contains(&part), "{part}\n{shown}");
    }
    // Not lost to the host: marked as a warning.
    let styled_view = screen_on(fed(), name, (120, 40), &keys, Theme { color: true }, styled);
    check_golden("parallel-nocache.in-flight.120x40.styled.txt", &styled_view);
    // At 80x24 the view scrolls to it.
    let mut small_keys = keys.to_vec();
    small_keys.extend([special(KeyCode::End)]);
    let small = screen_on(fed(), name, (80, 24), &small_keys, Theme::plain(), text);
    assert!(
        small.contains(&format!("in flight: #{}", start.id)),
        "{small}"
    );
}

/// `v` in a turn opens the request that evicted it; Esc comes back to the turn. A turn no
/// request evicted says so.
#[test]
fn v_goes_from_a_turn_to_the_request_that_evicted_it() {
    let name = "llmp/llama.cpp/parallel-nocache";
    // c2 t3 is request #10, evicted by #9 (other-agent c4 t2).
    let to_turn = [
        special(KeyCode::Down),
        special(KeyCode::Left),
        special(KeyCode::Left),
        special(KeyCode::Enter),
    ];
    let turn = screen(name, 120, 40, &to_turn);
    assert!(turn.contains("request #10"), "{turn}");
    assert!(
        turn.contains("evicted by #9") && turn.contains("v opens it"),
        "{turn}"
    );
    let mut keys = to_turn.to_vec();
    keys.push(key('v'));
    let evictor = screen(name, 120, 40, &keys);
    assert!(
        evictor.contains("other-agent c4 turn 2 · request #9"),
        "{evictor}"
    );
    keys.push(special(KeyCode::Esc));
    let back = screen(name, 120, 40, &keys);
    assert!(back.contains("c2 turn 3 · request #10"), "{back}");
    // The first turn of c1 (request #1) was evicted by nothing.
    let first = screen(
        name,
        120,
        40,
        &[special(KeyCode::Home), special(KeyCode::Enter), key('v')],
    );
    assert!(first.contains("v: no request evicted this turn"), "{first}");
    // A key of the panes in a view says so, rather than doing nothing.
    let mut keys = to_turn.to_vec();
    keys.push(key('e'));
    let said = screen(name, 120, 40, &keys);
    assert!(
        said.contains("e: a key of the panes, not of this view (Esc goes back)"),
        "{said}"
    );
}

/// The mixed demo's subagent: its lane is marked `c5↳`, its turn says whose tool call its
/// conversation answers, and `u` opens that request.
#[test]
fn u_goes_from_a_subagents_turn_to_the_request_that_spawned_it() {
    let (records, _, control) = demo_screens("mixed", key('?'));
    let fed = || {
        let mut engine = Engine::for_records(Config::default(), &records);
        for record in &records {
            engine.push(Input::Record(Arc::new(record.clone()), NOW_MS));
        }
        engine.push(Input::SourceDone);
        EngineControl(RefCell::new(engine))
    };
    let snapshot = control.0.borrow_mut().snapshot();
    let (index, lane) = snapshot
        .view
        .lanes
        .iter()
        .enumerate()
        .find(|(_, l)| l.spawned_by.is_some())
        .expect("the mixed demo's subagent has a lane");
    let parent = lane.spawned_by.unwrap();
    let at = |keys: &[Event]| screen_on(fed(), "mixed", (120, 40), keys, Theme::plain(), text);
    let label = format!("c{}↳", lane.conversation);
    let panes = at(&[]);
    assert!(panes.contains(&label), "{label}:\n{panes}");
    let mut keys = vec![special(KeyCode::Down); index];
    keys.extend([special(KeyCode::Home), special(KeyCode::Enter)]);
    let opened = at(&keys);
    assert!(
        opened.contains(&format!(
            "subagent: its conversation answers the tool call of #{parent}"
        )),
        "{opened}"
    );
    keys.push(key('u'));
    let up = at(&keys);
    assert!(up.contains(&format!("· request #{parent} ·")), "{up}");
}
