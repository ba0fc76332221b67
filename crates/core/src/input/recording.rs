//! prefixscope and llmp recordings, full or digest.

use std::collections::HashMap;
use std::io::BufRead;

use super::{FileInput, FileReport, Format, InputOptions, server_counts, session_id_in_body};
use super::{ModelEvidence, ServerSeen, choose_block_model};
use crate::cache::blocks::{
    Cutter, Prompt, Segment, prompt_from_body, prompt_from_digest, renders, reply_segment,
};
use crate::cache::{Request, SessionId};
use crate::normalize::Api;
use crate::record::{Record, read_jsonl};

/// A record's conversation key as read: an explicit session header the client sent (names
/// containing `session` or `conversation`, as the recorder keeps them). The analysis links turns
/// into conversations from the prompts themselves; a caller that runs it replaces these keys by
/// its own through [`set_conversations`].
pub(crate) fn conversation_from_session_header(record: &Record) -> Option<String> {
    session_header(record).map(|s| s.value)
}

/// Replaces the requests' conversation keys by the analysis's, by record id. Requests whose
/// record the map does not name keep no conversation.
pub(crate) fn set_conversations(
    requests: &mut [Request],
    conversation_by_record: &HashMap<u64, String>,
) {
    for request in requests {
        request.conversation = request
            .record_id
            .and_then(|id| conversation_by_record.get(&id).cloned());
    }
}

/// A recording as read: its requests, keyed by session header, and the records they came from,
/// for a caller that wants the analysis's conversations instead ([`set_conversations`]).
pub struct Recording {
    pub input: FileInput,
    pub records: Vec<Record>,
}

fn session_header(record: &Record) -> Option<SessionId> {
    record
        .request
        .headers
        .iter()
        .find(|(name, value)| {
            let name = name.to_ascii_lowercase();
            (name.contains("session") || name.contains("conversation")) && !value.is_empty()
        })
        .map(|(name, value)| SessionId {
            source: format!("header {name}"),
            value: value.clone(),
        })
}

/// One record on its way to a request: everything but the blocks, which wait for the input's
/// block model.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    pub prompt: Prompt,
    /// The server's prompt token count, when it gave one.
    pub prompt_tokens: Option<u64>,
    /// The reply as the next turn renders it, when the record holds it and it can be reused.
    pub reply: Option<Segment>,
    /// The engine, when the response's counters name it.
    pub server: Option<ServerSeen>,
    /// Where it stands in the input: the record id, a log's row.
    pub order: u64,
    pub request: Request,
}

impl Pending {
    /// Without its reply when `replies` is off (`InputOptions::replies`).
    pub(crate) fn with_replies(mut self, replies: bool) -> Pending {
        if !replies {
            self.reply = None;
        }
        self
    }

    /// Adds what the block model is chosen from (its prompt, count and engine) to `evidence`.
    pub(crate) fn observe(&self, evidence: &mut ModelEvidence) {
        evidence.add(self.order, &self.prompt, self.prompt_tokens, self.server);
    }

    /// The evidence of several.
    pub(crate) fn evidence<'a>(pending: impl IntoIterator<Item = &'a Pending>) -> ModelEvidence {
        let mut evidence = ModelEvidence::default();
        for p in pending {
            p.observe(&mut evidence);
        }
        evidence
    }

    /// The request, cut by `cutter` (prompt, then prompt + reply): requests must be cut in the
    /// order they are simulated, as the cutter learns where earlier prefixes ended.
    pub(crate) fn cut(self, cutter: &mut Cutter) -> Request {
        let (cut, cached_after) = cutter.cut_turn(
            &self.prompt,
            self.prompt_tokens,
            self.reply.as_ref(),
            self.request.output_tokens,
        );
        Request {
            blocks: cut.blocks,
            input_tokens: cut.input_tokens,
            cut: Some(cut.cut),
            keys: Some(cut.keys),
            parts: cut.parts,
            cached_after,
            ..self.request
        }
    }
}

/// Reads a recording; runs no analysis (conversations are the session headers').
pub fn read(reader: impl BufRead, name: &str, options: &InputOptions) -> Recording {
    let mut report = FileReport::new(name, Format::Recording);
    let result = read_jsonl(reader);
    for bad in result.bad_lines {
        bad_line(&mut report, bad);
    }
    of_records(result.records, report, options)
}

/// A recording's records in file order, each made into a `T` by `prepare` on every core
/// ([`super::parallel`]), with each bad line in its place: what [`crate::record::Lines`]
/// gives, on several cores. `prepare` must depend on its record alone.
pub fn for_each_record<T: Send>(
    reader: impl BufRead,
    prepare: impl Fn(Record) -> T + Sync,
    mut each: impl FnMut(Result<T, crate::record::BadLine>),
) {
    use super::parallel::Item;
    use crate::record::{BadLine, bad_record_line, parse_record_line, read_error_line};
    super::parallel::for_each_parsed(
        reader,
        |line| parse_record_line(line).map(|parsed| parsed.map(&prepare)),
        |item| match item {
            Item::Parsed { parsed: None, .. } => {}
            Item::Parsed {
                parsed: Some(parsed),
                number,
                complete,
            } => each(parsed.map_err(|error| bad_record_line(number, complete, error))),
            Item::TooLong { number, bytes } => each(Err(BadLine {
                line: number,
                error: crate::limits::too_long_message(bytes),
            })),
            Item::ReadError { number, error } => each(Err(read_error_line(number, &error))),
        },
    );
}

/// Opens an input once more from its start, decompressed, for a second read.
pub type Reopen<'a> = &'a dyn Fn() -> std::io::Result<Box<dyn BufRead>>;

/// What [`read_keyed_or_twice`] may hold of the pending requests (their structs and the texts
/// they hold anew) beside the analysis engine before it reads the file a second time: 100,000
/// real records hold about 150 MB and stay in one read; a million digest records held 1 GB
/// beside a 1.4 GB engine, past a 2 GiB address space.
pub(crate) const HELD_PENDING_BYTES: usize = 256 << 20;

/// Reads a recording one record at a time, keyed by the analysis's conversations as
/// [`super::keyed_by_analysis`] keys [`read`]'s (a test holds the two equal): each record goes
/// into the incremental analysis and becomes its pending request, then is dropped, so the
/// parsed file is never held (a 406 MB recording of 100,000 records took `profile` to 2.9 GB and
/// past a 2 GiB address space). Requests come out in id order, as `read` sorts them; the
/// analysis is kept beside them only when `options.keep_analysis` asks.
/// It holds every pending request beside the analysis engine until the block model is chosen;
/// past `held_budget` bytes of them, when `reopen` can read the file again, it stops holding
/// them and keeps only what a second read needs (the block model's evidence, each request's
/// place in id order, the bad values): the second read cuts each request as its turn comes,
/// after the engine has given its conversations and gone. Read once or twice, it gives the same
/// requests and report (a test holds them equal).
pub fn read_keyed_or_twice(
    reader: impl BufRead,
    reopen: Option<Reopen>,
    held_budget: usize,
    name: &str,
    options: &InputOptions,
) -> FileInput {
    use crate::analysis::engine::{Analyzer, Prepared};
    let mut report = FileReport::new(name, Format::Recording);
    let mut analyzer = Analyzer::new(crate::analysis::Config::default());
    // The bad values a record's request found, kept with it: they are reported in id order.
    let mut pending: Vec<(Pending, Vec<String>)> = Vec::new();
    // The prompts are all held until the block model is chosen: each text once.
    let mut texts = crate::cache::blocks::SharedTexts::default();
    let mut held_bytes = 0usize;
    // Set once the pending requests are no longer held.
    let mut second: Option<SecondRead> = None;
    // What a record gives, worked out on the parser threads: its analysis input, its request
    // and the counts of what its request lacked.
    let prepare = |record: Record| {
        // Only its counts are taken (`move_counts_into`): no name to copy.
        let mut own = FileReport::new("", Format::Recording);
        let request = pending_request(&record, &mut own).map(|r| r.with_replies(options.replies));
        (Prepared::of(&record), request, own)
    };
    for_each_record(reader, prepare, |item| match item {
        Ok((prepared, request, mut own)) => {
            analyzer.push_prepared(prepared);
            let bad_values = own.move_counts_into(&mut report);
            let Some(mut request) = request else { return };
            if let Some(second) = &mut second {
                second.add(&request, bad_values);
                return;
            }
            held_bytes += std::mem::size_of::<(Pending, Vec<String>)>()
                + texts.share_prompt(&mut request.prompt);
            if let Some(reply) = &mut request.reply {
                held_bytes += texts.share(reply);
            }
            pending.push((request, bad_values));
            if held_bytes > held_budget && reopen.is_some() {
                second = Some(SecondRead::of(std::mem::take(&mut pending)));
                texts = crate::cache::blocks::SharedTexts::default();
            }
        }
        Err(bad) => bad_line(&mut report, bad),
    });
    let second = second.map(|mut second| {
        second.report_bad_values(&mut report);
        second
    });
    if second.is_none() {
        pending.sort_by_key(|(request, _)| request.order);
    }
    let pending: Vec<Pending> = pending
        .into_iter()
        .map(|(request, bad_values)| {
            bad_values
                .into_iter()
                .for_each(|what| report.bad_value(what));
            request
        })
        .collect();
    // The engine's state (2 KB a record), the report when not kept, and the text map go before
    // the cut, which holds the prompts and the requests at once: 300,000 records did not fit a
    // 2 GiB address space.
    let (conversations, analysis) = if options.keep_analysis {
        let analysis = analyzer.into_report();
        (
            super::conversations_by_record(&analysis.rows, name),
            Some(analysis),
        )
    } else {
        // Only each record's conversation is wanted: the rows are read where the engine holds
        // them, not copied into a report.
        let shared = analyzer.live_report();
        drop(analyzer);
        let rows = shared.rows.iter().map(|shared| &*shared.row);
        (super::conversations_by_record(rows, name), None)
    };
    drop(texts);
    let input = match (second, reopen) {
        (Some(second), Some(reopen)) => second.read(reopen, report, options),
        _ => cut_all(pending, report, options),
    };
    super::keyed_by_conversations(input, &conversations, analysis)
}

/// What the second read of [`read_keyed_or_twice`] needs from the first: the block model's
/// evidence, and each request's place (its id, then its rank in the file: the sort of a single
/// read is stable).
struct SecondRead {
    evidence: ModelEvidence,
    places: Vec<(u64, u64)>,
    /// Requests' bad values, by place (most have none).
    bad_values: Vec<((u64, u64), Vec<String>)>,
}

impl SecondRead {
    /// From the requests held so far, in file order.
    fn of(held: Vec<(Pending, Vec<String>)>) -> SecondRead {
        let mut second = SecondRead {
            evidence: ModelEvidence::default(),
            places: Vec::new(),
            bad_values: Vec::new(),
        };
        for (request, bad_values) in &held {
            second.add(request, bad_values.clone());
        }
        second
    }

    fn add(&mut self, request: &Pending, bad_values: Vec<String>) {
        request.observe(&mut self.evidence);
        let place = (request.order, self.places.len() as u64);
        self.places.push(place);
        if !bad_values.is_empty() {
            self.bad_values.push((place, bad_values));
        }
    }

    /// Puts the places in id order, and the bad values in the report in that order.
    fn report_bad_values(&mut self, report: &mut FileReport) {
        self.places.sort_unstable();
        self.bad_values.sort_unstable_by_key(|(place, _)| *place);
        for (_, values) in std::mem::take(&mut self.bad_values) {
            values.into_iter().for_each(|what| report.bad_value(what));
        }
    }

    /// Reads the file again and cuts each request in id order as soon as every one before it
    /// is cut; a request read before its turn (files are written as exchanges end) waits. A
    /// second read that does not give the first's requests (the file changed, or could not be
    /// read) ends the requests there, said as the report's read error. Records appended since
    /// the first read are not read.
    fn read(self, reopen: Reopen, mut report: FileReport, options: &InputOptions) -> FileInput {
        let (model, choice) = choose_block_model(options, &self.evidence);
        report.block_model = Some(choice);
        let mut cutter = Cutter::new(model);
        let places = self.places;
        let mut requests: Vec<Request> = Vec::with_capacity(places.len());
        let mut waiting: std::collections::BTreeMap<(u64, u64), Pending> = Default::default();
        let mut rank = 0u64;
        let stopped = match reopen() {
            Err(e) => Some(format!("cannot open it again: {e}")),
            Ok(reader) => {
                let mut read_error = None;
                for_each_record(
                    reader,
                    |record| {
                        let mut ignored = FileReport::new("", Format::Recording);
                        pending_request(&record, &mut ignored)
                            .map(|r| r.with_replies(options.replies))
                    },
                    |item| match item {
                        Ok(Some(request)) => {
                            if rank < places.len() as u64 {
                                waiting.insert((request.order, rank), request);
                            }
                            rank += 1;
                            while let Some(request) = places
                                .get(requests.len())
                                .and_then(|place| waiting.remove(place))
                            {
                                requests.push(request.cut(&mut cutter));
                            }
                        }
                        Ok(None) => {}
                        Err(bad) => {
                            if let Some(error) = bad.error.strip_prefix("read error: ") {
                                read_error.get_or_insert(format!("line {}: {error}", bad.line));
                            }
                        }
                    },
                );
                read_error
            }
        };
        if requests.len() < places.len() && report.read_error.is_none() {
            report.read_error = Some(format!(
                "the second read (a large recording is read twice) gave {} of the first read's {} requests: {}",
                requests.len(),
                places.len(),
                stopped.unwrap_or_else(|| "the file changed between the reads".to_string()),
            ));
        }
        report.requests = requests.len() as u64;
        FileInput {
            requests,
            report,
            analysis: None,
        }
    }
}

/// A bad line in the report; a read error also stops the read there.
fn bad_line(report: &mut FileReport, bad: crate::record::BadLine) {
    if let Some(error) = bad.error.strip_prefix("read error: ") {
        report.read_error = Some(format!("line {}: {error}", bad.line));
    }
    report.bad(bad.line, bad.error);
}

/// The requests of `pending`, in order, cut by the block model all of them choose.
fn cut_all(pending: Vec<Pending>, mut report: FileReport, options: &InputOptions) -> FileInput {
    let (model, choice) = choose_block_model(options, &Pending::evidence(&pending));
    report.block_model = Some(choice);
    let mut cutter = Cutter::new(model);
    let requests: Vec<Request> = pending.into_iter().map(|p| p.cut(&mut cutter)).collect();
    report.requests = requests.len() as u64;
    FileInput {
        requests,
        report,
        analysis: None,
    }
}

/// Records already read (a recording's lines, a gateway log's rows) as a recording, with what
/// reading them found so far in `report`.
pub(crate) fn of_records(
    records: Vec<Record>,
    mut report: FileReport,
    options: &InputOptions,
) -> Recording {
    let pending: Vec<Pending> = records
        .iter()
        .filter_map(|record| pending_request(record, &mut report))
        .map(|p| p.with_replies(options.replies))
        .collect();
    Recording {
        input: cut_all(pending, report, options),
        records,
    }
}

/// Adds what one record tells of the block model (its prompt, server count and engine) to
/// `evidence`: a replay's first pass feeds every record through this, keeping nothing else.
pub(crate) fn observe_record(record: &Record, evidence: &mut ModelEvidence) {
    let mut ignored = FileReport::new("", Format::Recording);
    if let Some(pending) = pending_request(record, &mut ignored) {
        pending.observe(evidence);
    }
}

/// One record as a cache request, for the live simulation, cut by the engine's `cutter`.
/// `None` for what `read` would skip; the reason is counted in `report`.
pub fn live_request(
    record: &Record,
    cutter: &mut Cutter,
    report: &mut FileReport,
) -> Option<Request> {
    Some(pending_request(record, report)?.cut(cutter))
}

/// The prompt and the figures of one record, or `None` (counted in `report`) when it holds no
/// prompt to simulate. Exports read records one at a time through this too.
pub(crate) fn pending_request(record: &Record, report: &mut FileReport) -> Option<Pending> {
    // prefixscope's own request to the server (`probe`): not traffic, counted apart.
    if record.probe {
        report.probes += 1;
        return None;
    }
    let api = Api::from_path(&record.request.path);
    if !renders(api) {
        report.skip("not a prompt API");
        return None;
    }
    if let Some(error) = record.error {
        report.skip(&format!("exchange failed: {}", error.as_str()));
        return None;
    }
    let Some(response) = &record.response else {
        report.skip("no response");
        return None;
    };
    if !(200..300).contains(&response.status) {
        report.non_2xx += 1;
        return None;
    }
    let request = &record.request;
    let (prompt, stream, session) = if let Some(body) = &request.body {
        let Some(prompt) = prompt_from_body(api, body, record.tokens.as_ref()) else {
            report.skip("request body without a prompt");
            return None;
        };
        let stream = body.get("stream").and_then(serde_json::Value::as_bool);
        (
            prompt,
            stream.or(Some(api == Api::OllamaChat)),
            session_id_in_body(body),
        )
    } else if let Some(digest) = &request.digest {
        let prompt = prompt_from_digest(digest, record.tokens.as_ref());
        (prompt, Some(digest.params.stream), None)
    } else {
        report.skip("request body not recorded");
        return None;
    };
    let counts_source = response.body.clone().or_else(|| {
        response
            .digest
            .as_ref()
            .map(|d| serde_json::Value::Object(d.usage.clone()))
    });
    let counts = counts_source
        .as_ref()
        .map(server_counts)
        .unwrap_or_default();
    let prompt_tokens = super::bounded_prompt_tokens(
        &counts,
        prompt.chars(),
        &format!("record {}", record.id),
        report,
    );
    let output_tokens = counts.output_tokens;
    let reply = response
        .body
        .as_ref()
        .and_then(|body| reply_segment(api, body, output_tokens));
    Some(Pending {
        prompt_tokens,
        reply,
        server: counts.server,
        order: record.id,
        request: Request {
            t_ms: Some(record.t_start_ms),
            output_tokens,
            conversation: conversation_from_session_header(record),
            session_id: session.or_else(|| session_header(record)),
            model: prompt.model.clone(),
            streamed: stream,
            server_reused_tokens: counts.reused_tokens,
            record_id: Some(record.id),
            ..Request::default()
        },
        prompt,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a reader saw: each record's id or each bad line, in order.
    fn outcomes(
        items: impl IntoIterator<Item = Result<u64, crate::record::BadLine>>,
    ) -> Vec<String> {
        items
            .into_iter()
            .map(|item| match item {
                Ok(id) => format!("record {id}"),
                Err(bad) => format!("line {}: {}", bad.line, bad.error),
            })
            .collect()
    }

    #[test]
    fn records_read_on_every_core_are_the_serial_read() {
        let real = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../recordings/llmp/llama.cpp/parallel-nocache.jsonl"
        ))
        .unwrap();
        // Several chunks' worth, with a bad line, a blank one, another version and a cut end.
        let mut text = Vec::new();
        while text.len() < 5 << 20 {
            text.extend_from_slice(&real);
            text.extend_from_slice(b"not json\n\n   \n{\"v\":7}\n");
        }
        text.extend_from_slice(&real[..real.len() / 2]);
        let serial = outcomes(
            crate::record::Lines::new(text.as_slice()).map(|item| item.map(|record| record.id)),
        );
        assert!(serial.len() > 1_000);
        assert!(serial.last().unwrap().contains("truncated last line"));
        let mut parallel = Vec::new();
        for_each_record(
            text.as_slice(),
            |record| record.id,
            |item| parallel.push(item),
        );
        assert_eq!(outcomes(parallel), serial);
    }
}
