//! The model of llama.cpp's prompt cache against the real server, on the recordings
//! `tests/llama/make-scenarios.sh` made through `prefixscope record` (layout on, the default)
//! in front of the real llama.cpp server code (`recordings/xllamacpp/scenarios/README.md`):
//! the ceiling bounds what the server reused on every request, every charged loss is what the
//! slot held and the server re-evaluated, and continued first turns are turns.

use prefixscope_core::analysis::RowKind;

mod support;

use support::server_model::{check, check_within, held_after};

const SCENARIOS: [&str; 6] = [
    "append",
    "alternate",
    "short-first",
    "date",
    "two-slots",
    "tool-calls",
];

fn recording(name: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("recordings/xllamacpp/scenarios")
        .join(format!("{name}.jsonl"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_model_agrees_with_the_real_server_on_every_scenario() {
    for name in SCENARIOS {
        let check = check(&recording(name), name);
        assert!(check.problems.is_empty(), "{:#?}", check.problems);
        eprintln!(
            "{name}: ceiling {} ≥ server {}; charged {} against {} lost",
            check.ceiling_total, check.server_total, check.charged_total, check.truth_total
        );
    }
}

/// The same recordings without the server's layout (`tokens` removed, as a recording through
/// another proxy has them): every charge within 8% of what the server lost.
#[test]
fn without_the_layout_every_charge_is_within_8_percent() {
    for name in SCENARIOS {
        let mut records = prefixscope_core::record::read_jsonl(recording(name).as_slice()).records;
        for record in &mut records {
            record.tokens = None;
        }
        let mut jsonl = Vec::new();
        for record in &records {
            prefixscope_core::record::write_jsonl(&mut jsonl, record).unwrap();
        }
        let check = check_within(&jsonl, name, 0.08);
        let charges: Vec<&String> = check
            .problems
            .iter()
            .filter(|p| p.contains("charged"))
            .collect();
        assert!(charges.is_empty(), "{charges:#?}");
        eprintln!(
            "{name} without the layout: charged {} against {} lost; ceiling {} ≥ server {}",
            check.charged_total, check.truth_total, check.ceiling_total, check.server_total
        );
    }
}

/// What the model takes as the truth, shown by the server: on one agent appending turns to
/// a warm slot, each turn reuses the previous prompt and the reply it generated, less one.
#[test]
fn a_warm_slot_holds_the_prompt_and_the_reply_less_one() {
    let check = check(&recording("append"), "append");
    let rows = &check.report.rows;
    assert_eq!(rows.len(), 5);
    for pair in rows.windows(2) {
        assert_eq!(
            pair[1].counts.reused_tokens.map(|r| r.value),
            held_after(&pair[0]),
            "row {}",
            pair[1].id
        );
    }
}

/// Three agents taking turns on one slot without the host cache: every later turn is
/// evicted, and charged the previous prompt and the reply the slot held (llmp charges the
/// prompt alone, 63 tokens short on each).
#[test]
fn evictions_are_charged_with_the_reply_the_slot_held() {
    for name in ["alternate", "two-slots"] {
        let check = check(&recording(name), name);
        let evicted: Vec<_> = check
            .report
            .rows
            .iter()
            .filter(|r| {
                r.lost_external.as_ref().map(|l| l.cause.as_str()) == Some("other_conversation")
            })
            .collect();
        assert_eq!(evicted.len(), 6, "{name}");
        assert_eq!(check.charged_total, check.truth_total, "{name}");
    }
}

/// First turns at `max_tokens` 20 without tools look like title calls; each is continued,
/// so each is a turn and the eviction of the turn after it is counted.
#[test]
fn continued_first_turns_are_turns() {
    let check = check(&recording("short-first"), "short-first");
    let report = &check.report;
    assert!(report.rows.iter().all(|r| r.kind == RowKind::Turn));
    assert_eq!(report.coverage.turns, 9);
    assert_eq!(report.coverage.conversations, 3);
    let lost: u32 = report
        .rows
        .iter()
        .filter_map(|r| r.lost_external.as_ref())
        .map(|l| l.tokens)
        .sum();
    assert_eq!(u64::from(lost), check.truth_total);
}

/// The date changes at the end of a 1,000-character system prompt: the ceiling keeps the
/// unchanged head of the edited message, so it bounds the server's reuse there too.
#[test]
fn an_edited_system_prompt_keeps_its_unchanged_head() {
    let check = check(&recording("date"), "date");
    let row = check
        .report
        .rows
        .iter()
        .find(|r| r.break_cause.is_some())
        .expect("the date change is a break");
    assert_eq!(row.client_cause.as_deref(), Some("date_in_system_prompt"));
    let reused = row.counts.reused_tokens.map_or(0, |r| r.value);
    assert!(reused > 200, "the server reused the head: {reused}");
    assert!(check.ceiling_total >= check.server_total);
}

/// `whatif` at the settings the recording shows (slots from its `/props`, the host cache
/// inferred): the simulation agrees with the server on at least 95% of requests, predicts the
/// recorded loss within 5%, and no fix offers a setting that saves nothing or loses more.
#[test]
fn whatif_at_the_recorded_settings_predicts_what_the_server_did() {
    use prefixscope_core::analysis::{Config, analyze};
    use prefixscope_core::sim::{recorded_settings, residency, what_if};
    for (name, slots, cache_ram) in [
        ("append", 1, None),
        ("alternate", 1, Some(false)),
        ("short-first", 1, Some(false)),
        ("date", 1, None),
        ("two-slots", 2, Some(false)),
        ("tool-calls", 1, None),
    ] {
        let records = prefixscope_core::record::read_jsonl(recording(name).as_slice()).records;
        let own = recorded_settings(&records);
        assert_eq!(own.slots, slots, "{name}: {}", own.slots_source);
        assert!(own.slots_source.contains("/props"), "{name}");
        // Where the traffic tells (a conversation evicted and back), the host cache is
        // inferred; where it does not, it is said to be assumed.
        match cache_ram {
            Some(on) => {
                assert_eq!(own.cache_ram, on, "{name}");
                assert!(own.cache_ram_source.starts_with("inferred"), "{name}");
            }
            None => assert!(own.cache_ram_source.starts_with("assumed"), "{name}"),
        }
        let w = what_if(&records, own.slots, own.cache_ram);
        let (recorded, predicted) = (w.recorded.lost_tokens, w.predicted.lost_tokens);
        assert!(
            recorded.abs_diff(predicted) * 20 <= recorded.max(1),
            "{name}: predicted {predicted}, recorded {recorded}"
        );
        let report = analyze(&records, &Config::default());
        let r = residency(&records, &report, own.slots, own.cache_ram);
        let (compared, agreed) = r
            .calibration
            .iter()
            .fold((0, 0), |(c, a), m| (c + m.compared, a + m.agreed));
        assert!(
            agreed * 100 >= compared * 95,
            "{name}: {agreed} of {compared}"
        );
        let predictions = prefixscope_core::live::predict_at(
            &records,
            &prefixscope_core::analysis::CAPACITY_SETTINGS,
            None,
        );
        for advice in prefixscope_core::live::advise(&report.findings, &predictions) {
            for saving in &advice.savings {
                assert!(
                    saving.saving_tokens() > 0,
                    "{name}: {}",
                    saving.saving_text()
                );
            }
        }
        eprintln!(
            "{name}: whatif at {} slot(s), host cache {}: {agreed} of {compared} agree; predicted {predicted} lost, recorded {recorded}",
            own.slots,
            if own.cache_ram { "on" } else { "off" }
        );
    }
}
