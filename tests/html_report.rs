//! Issue #15, the HTML report: `profile -o NAME` writes NAME.json and NAME.html, one page with
//! no script and nothing fetched. A real browser (Debian's chromium, headless) renders it: the
//! DOM it builds holds the capacity chart (an SVG with a line per policy and the ceiling) and
//! the figures of `profile --json`, to the token; its screenshots are `assets/report-*.png`
//! (`PREFIXSCOPE_UPDATE_SCREENSHOTS=1` writes them again).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_prefixscope");

fn chromium() -> Option<&'static str> {
    let found = ["chromium", "chromium-browser"].into_iter().find(|name| {
        Command::new(name)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if found.is_none() {
        assert!(
            std::env::var_os("PREFIXSCOPE_REQUIRE_CHROMIUM").is_none(),
            "chromium is required here (PREFIXSCOPE_REQUIRE_CHROMIUM is set) but not installed"
        );
        eprintln!("SKIPPED: chromium is not installed");
    }
    found
}

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn browser(chromium: &str, args: &[&str], page: &Path) -> std::process::Output {
    let profile_dir = page.with_extension("chromium-profile");
    Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
        ])
        .arg(format!("--user-data-dir={}", profile_dir.display()))
        .args(args)
        .arg(format!("file://{}", page.display()))
        .output()
        .unwrap()
}

/// `prefixscope COMMAND INPUT -o DIR/NAME`: its JSON report and its page, checked to be
/// self-contained (nothing to run, nothing to fetch).
fn written_report(command: &str, input: &str, name: &str) -> (Value, PathBuf) {
    let dir = std::env::temp_dir().join(format!("prefixscope-html-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let base = dir.join(name);
    let output = Command::new(BIN)
        .arg(command)
        .arg(repo(input))
        .arg("-o")
        .arg(&base)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let json: Value =
        serde_json::from_slice(&std::fs::read(base.with_extension("json")).unwrap()).unwrap();
    let page = base.with_extension("html");
    let html = std::fs::read_to_string(&page).unwrap();
    for never in ["<script", " src=", " href=", "@import", "url("] {
        assert!(!html.contains(never), "{never} in {name}.html");
    }
    (json, page)
}

/// `profile -o` of `input`, then the page as chromium builds it, held against the JSON.
fn check(input: &str, name: &str) {
    let Some(chromium) = chromium() else {
        return;
    };
    let (json, page) = written_report("profile", input, name);
    let dir = page.parent().unwrap().to_path_buf();
    let dumped = browser(chromium, &["--dump-dom"], &page);
    let dom = String::from_utf8_lossy(&dumped.stdout).to_string();
    assert!(
        dom.contains("<svg"),
        "no chart in the DOM chromium built:\n{dom}"
    );
    let polylines = dom.matches("<polyline").count();
    assert!(polylines >= 3, "{polylines} lines: one per policy");
    // The legend's texts (plotters puts each on a line of its own inside <text>).
    let svg = &dom[dom.find("<svg").unwrap()..dom.find("</svg>").unwrap()];
    for label in ["fifo", "lru", "optimal", "ceiling "] {
        assert!(
            svg.lines().any(|l| l.trim_start().starts_with(label)),
            "the legend names {label}"
        );
    }
    // Every point of the curve, and the ceiling, as `profile --json` has them.
    let points = json["points"].as_array().unwrap();
    assert_eq!(points.len(), 18);
    for point in points.iter().chain([&json["ceiling"]]) {
        let policy = point["policy"].as_str().unwrap();
        let capacity = point["capacity_tokens"]
            .as_u64()
            .map_or(String::new(), |t| t.to_string());
        let row_start = format!("data-policy=\"{policy}\" data-capacity-tokens=\"{capacity}\"");
        let at = dom
            .find(&row_start)
            .unwrap_or_else(|| panic!("{row_start}"));
        let row = &dom[at..at + dom[at..].find("</tr>").unwrap()];
        for (field, attribute) in [
            ("hit_tokens", "data-hit-tokens"),
            ("same_conversation_tokens", "data-same"),
            ("other_tokens", "data-other"),
        ] {
            let expected = format!("{attribute}=\"{}\"", point[field].as_u64().unwrap());
            assert!(
                row.contains(&expected),
                "{policy} {capacity}: {expected} in {row}"
            );
        }
    }
    let share = json["sessions"]["share"].as_f64().unwrap();
    assert!(dom.contains(&format!("data-session-share=\"{share}\"")));
    if let Some(server) = json["server_observed"].as_object() {
        let reused = server["server_reused_tokens"].as_u64().unwrap();
        assert!(dom.contains(&format!("data-server-reused=\"{reused}\"")));
    }
    // A recording's page carries its analysis too: its losses as `analyze` counts them.
    if name == "recording" {
        // Its chart spans the working set (6,356 tokens measured, 1-token blocks), not the
        // defaults' 16K to 16M, where every capacity holds it all; the table has those too.
        let labels: Vec<&str> = svg.lines().map(str::trim).collect();
        for capacity in ["1", "100", "10,000"] {
            assert!(labels.contains(&capacity), "{capacity} on the axis");
        }
        assert!(
            !labels.contains(&"1M"),
            "the axis stops near the working set"
        );
        assert!(dom.contains("data-capacity-tokens=\"16777216\""));
        assert!(dom.contains("what was lost, and when"));
        assert!(
            dom.contains("data-lost-tokens=\"585\""),
            "analyze's 585 tokens"
        );
    }
    // The picture README shows.
    let shot = dir.join(format!("{name}.png"));
    let taken = browser(
        chromium,
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1000,1300",
            "--hide-scrollbars",
        ],
        &page,
    );
    let png = std::fs::read(&shot)
        .unwrap_or_else(|_| panic!("no screenshot: {}", String::from_utf8_lossy(&taken.stderr)));
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 20_000,
        "{} bytes",
        png.len()
    );
    let asset = repo(&format!("assets/report-{name}.png"));
    if std::env::var_os("PREFIXSCOPE_UPDATE_SCREENSHOTS").is_some() {
        std::fs::write(&asset, &png).unwrap();
    }
    assert!(asset.exists(), "{} is checked in", asset.display());
}

#[test]
fn the_report_of_the_mooncake_trace_renders_with_profiles_figures() {
    check(
        "tests/data/mooncake/conversation_trace.jsonl.gz",
        "mooncake",
    );
}

#[test]
fn the_report_of_a_recording_renders_with_profiles_figures() {
    check("recordings/llmp/llama.cpp/parallel.jsonl", "recording");
}

/// The page's chart spans the working set from one run over more capacities than the JSON's;
/// the JSON written beside it is still `profile --json`'s.
#[test]
fn the_json_beside_the_page_is_profile_json() {
    let input = "recordings/llmp/llama.cpp/parallel.jsonl";
    let (written, _) = written_report("profile", input, "beside");
    let output = Command::new(BIN)
        .args(["profile", "--json"])
        .arg(repo(input))
        .output()
        .unwrap();
    let printed: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(written, printed);
}

#[test]
fn report_paths_follow_the_name_given() {
    let dir = std::env::temp_dir().join(format!("prefixscope-html-paths-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (given, json, html) in [
        ("a.json", "a.json", "a.html"),
        ("b", "b.json", "b.html"),
        ("c.out", "c.out", "c.out.html"),
    ] {
        let status = Command::new(BIN)
            .arg("profile")
            .arg(repo("recordings/llmp/llama.cpp/parallel.jsonl"))
            .arg("-o")
            .arg(dir.join(given))
            .output()
            .unwrap();
        assert!(status.status.success());
        assert!(
            dir.join(json).exists() && dir.join(html).exists(),
            "{given}"
        );
    }
}

/// `analyze -o` writes the analysis's page too: loss by cause (to the token, as the JSON's
/// `time.by_cause`), by client, the requests in time with their breaks and evictions, and the
/// findings with their fixes, as chromium builds it.
#[test]
fn the_analysis_page_renders_with_analyzes_figures() {
    let Some(chromium) = chromium() else {
        return;
    };
    let (json, page) = written_report(
        "analyze",
        "recordings/llmp/llama.cpp/parallel-nocache.jsonl",
        "analysis",
    );
    let dom =
        String::from_utf8_lossy(&browser(chromium, &["--dump-dom"], &page).stdout).to_string();
    assert_eq!(dom.matches("<svg").count(), 3, "causes, clients, timeline");
    let lost = json["time"]["lost_tokens"].as_u64().unwrap();
    assert_eq!(lost, 8_604);
    assert!(dom.contains(&format!("data-lost-tokens=\"{lost}\"")));
    for (cause, total) in json["time"]["by_cause"].as_object().unwrap() {
        let row = format!(
            "data-cause=\"{cause}\"><td>{}</td><td data-tokens=\"{}\"",
            prefixscope_core::units::cause_label(cause),
            total["tokens"].as_u64().unwrap()
        );
        assert!(dom.contains(&row), "{row}");
    }
    // Each finding's fix, in words.
    for finding in json["findings"].as_array().unwrap() {
        let change = finding["fix"]["change"].as_str().unwrap();
        let escaped = change
            .replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;");
        assert!(dom.contains(&escaped), "{change}");
    }
    // The timeline's legend names what the points are.
    for label in ["turn", "a client's break", "evicted by another request"] {
        assert!(dom.contains(label), "{label}");
    }
}
