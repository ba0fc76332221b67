//! The Prometheus exposition of a report: one function (`registry`) builds every family from an
//! analysis report, the raw counts of the records and, when they are known, the cache
//! simulation's and the running proxy's figures. `--metrics` (`serve`) and `analyze
//! --prometheus` both call it, so the live endpoint and the batch file cannot disagree.
//!
//! Figures the analysis revises as later records arrive (losses, breaks, evictions, the ceiling)
//! are gauges of the current totals, equal to `analyze` of the same records; raw event counts
//! (requests, records, tokens the server reported) only grow and are counters.
//!
//! Cardinality is bounded: clients and models are capped at `MAX_LABEL_VALUES` each (the
//! costliest, the rest as `other`), causes, break causes and evictor kinds are closed sets of
//! the analysis's own names, statuses and error kinds are few; conversation ids are never labels.

pub mod serve;
pub mod window;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use prefixscope_core::analysis::{Priced, Rated};
use prefixscope_core::analysis::{Report, time};
use prefixscope_core::live::view::Aliases;
use prefixscope_core::record::Record;

/// Every family's name starts with it.
pub const PREFIX: &str = "prefixscope";
/// Clients (and models) kept as label values of their own, the costliest first; the rest are
/// summed as `other`, so a label has at most `MAX_LABEL_VALUES + 1` values.
pub const MAX_LABEL_VALUES: usize = 20;
pub const OTHER: &str = "other";
/// Label values are cut to this many characters (user agents and model names can be long).
const MAX_LABEL_CHARS: usize = 80;

/// The raw event counts of the records seen (probes apart): the live endpoint adds each record
/// as the recorder hands it on, `analyze --prometheus` counts a recording's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Requests of the traffic by (HTTP status, if a response came; error kind or `none`).
    pub requests: BTreeMap<(Option<u16>, &'static str), u64>,
    pub probes: u64,
}

impl Traffic {
    pub fn of<'a>(records: impl IntoIterator<Item = &'a Record>) -> Traffic {
        let mut traffic = Traffic::default();
        for record in records {
            traffic.add(record);
        }
        traffic
    }

    pub fn add(&mut self, record: &Record) {
        if record.probe {
            self.probes += 1;
            return;
        }
        let status = record.response.as_ref().map(|r| r.status);
        let error = record.error.map_or("none", |e| e.as_str());
        *self.requests.entry((status, error)).or_default() += 1;
    }

    pub fn records(&self) -> u64 {
        self.requests.values().sum()
    }
}

/// The cache simulation's figures (the live engine's hit-rate curve), when it ran.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CacheFigures {
    /// The hit rate no cache could beat on these requests (0..1).
    pub ceiling: f64,
    /// Of the simulated requests' prompt tokens, the share the server said it reused (0..1).
    pub server_reuse: Option<f64>,
}

/// What only a running proxy knows (absent from `analyze --prometheus`: the families are there,
/// without samples).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProxyFigures {
    pub records_not_written: u64,
    pub recorder_queue_depth: u64,
    /// Connections to the metrics endpoint that failed (a client gone mid-answer).
    pub metrics_connection_errors: u64,
}

/// How the live endpoint's analysis keeps up (absent from `analyze --prometheus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WindowFigures {
    /// Records the analysis left out: the endpoint was this far behind the proxy (its queue
    /// full), so the analysis gauges do not include them.
    pub records_skipped: u64,
    /// Windows closed so far: every `--metrics-window` records the analysis starts again, its
    /// totals kept (memory stays bounded on a proxy that runs for days).
    pub windows_closed: u64,
    /// Records analysed in the open window.
    pub window_records: u64,
    /// The analysis has stepped aside: records come faster than it takes them.
    pub stepped_aside: bool,
}

/// Everything the exposition is built from.
pub struct Inputs<'a> {
    pub totals: &'a Totals,
    pub traffic: &'a Traffic,
    pub cache: Option<CacheFigures>,
    pub proxy: Option<ProxyFigures>,
    pub window: Option<WindowFigures>,
    /// The `server` label of every family: the upstream (`--metrics`), or what `analyze` is told.
    pub server: &'a str,
}

/// What the analysis families show, summed: one report's (`Totals::of`), or the closed windows'
/// and the open one's (`Totals::add`), so every figure is a sum and windows add up.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Totals {
    /// Prompt, reused and evaluated tokens by model (label values).
    pub tokens_by_model: BTreeMap<String, [u64; 3]>,
    /// Tokens and milliseconds (where measured) lost, by (client alias, cause), label values.
    pub lost: BTreeMap<(String, String), (u64, Option<f64>)>,
    pub breaks_by_cause: BTreeMap<String, u64>,
    pub evictions_by_kind: BTreeMap<String, u64>,
    pub turns: u64,
    pub conversations: u64,
}

impl Totals {
    pub fn of<R: Priced>(report: &Report<R>) -> Totals {
        let mut totals = Totals {
            turns: report.coverage.turns,
            conversations: report.coverage.conversations,
            ..Totals::default()
        };
        for rated in report.rows.iter().map(Priced::rated) {
            let row = rated.row();
            let value = |m: Option<prefixscope_core::analysis::Measured<u32>>| {
                m.map_or(0, |m| u64::from(m.value))
            };
            let sums = totals
                .tokens_by_model
                .entry(label_value(&row.model))
                .or_default();
            sums[0] += value(row.counts.prompt_tokens);
            sums[1] += value(row.counts.reused_tokens);
            sums[2] += value(row.counts.evaluated_tokens);
            if let Some(cause) = rated.break_cause {
                *totals
                    .breaks_by_cause
                    .entry(cause.name().to_string())
                    .or_default() += 1;
            }
            if let Some(evicted) = &rated.evicted_by {
                *totals
                    .evictions_by_kind
                    .entry(label_value(&evicted.kind))
                    .or_default() += 1;
            }
        }
        totals.lost = losses(report);
        totals
    }

    /// `other`'s figures added to these.
    pub fn add(&mut self, other: &Totals) {
        for (model, sums) in &other.tokens_by_model {
            let mine = self.tokens_by_model.entry(model.clone()).or_default();
            for (a, b) in mine.iter_mut().zip(sums) {
                *a += b;
            }
        }
        for (key, (tokens, ms)) in &other.lost {
            let mine = self.lost.entry(key.clone()).or_insert((0, None));
            mine.0 += tokens;
            if let Some(ms) = ms {
                mine.1 = Some(mine.1.unwrap_or(0.0) + ms);
            }
        }
        for (cause, n) in &other.breaks_by_cause {
            *self.breaks_by_cause.entry(cause.clone()).or_default() += n;
        }
        for (kind, n) in &other.evictions_by_kind {
            *self.evictions_by_kind.entry(kind.clone()).or_default() += n;
        }
        self.turns += other.turns;
        self.conversations += other.conversations;
    }

    /// Prompt tokens of every model (the weight of a window's ratios when windows are summed).
    pub fn prompt_tokens(&self) -> u64 {
        self.tokens_by_model.values().map(|sums| sums[0]).sum()
    }
}

type Labels = Vec<(&'static str, String)>;
type FloatGauge = Gauge<f64, AtomicU64>;

/// A family written with its HELP and TYPE even before it has samples: prometheus-client leaves
/// out an empty family, and a dashboard (or `promtool`) should see every family from the start.
#[derive(Debug)]
struct Announced<M>(M);

impl<M: EncodeMetric> EncodeMetric for Announced<M> {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        self.0.metric_type()
    }
}

/// Registers `family` as `Announced`.
fn announce<M: EncodeMetric + Send + Sync + std::fmt::Debug + 'static>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    family: M,
) {
    registry.register(name, help, Announced(family));
}

/// An unlabelled gauge family: one sample of `value`, none while its source is absent.
fn gauge(registry: &mut Registry, name: &str, help: &str, value: Option<f64>) {
    let family = Family::<Labels, FloatGauge>::default();
    if let Some(value) = value {
        family.get_or_create(&Vec::new()).set(value);
    }
    announce(registry, name, help, family);
}

/// [`gauge`]'s counter.
fn counter(registry: &mut Registry, name: &str, help: &str, value: Option<u64>) {
    let family = Family::<Labels, Counter>::default();
    if let Some(value) = value {
        family.get_or_create(&Vec::new()).inc_by(value);
    }
    announce(registry, name, help, family);
}

/// The one place the families are defined: the live endpoint and `analyze --prometheus` both
/// encode this registry.
pub fn registry(inputs: &Inputs<'_>) -> Registry {
    let server = label_value(inputs.server);
    let mut registry =
        Registry::with_prefix_and_labels(PREFIX, [("server".into(), server.into())].into_iter());
    let totals = inputs.totals;

    let requests = Family::<Labels, Counter>::default();
    for ((status, error), n) in &inputs.traffic.requests {
        requests
            .get_or_create(&vec![
                (
                    "status",
                    status.map_or_else(|| "none".into(), |s| s.to_string()),
                ),
                ("error", (*error).into()),
            ])
            .inc_by(*n);
    }
    announce(
        &mut registry,
        "requests",
        "Requests through the proxy (probes apart), by HTTP status and error kind (none: a complete exchange)",
        requests,
    );
    let records = Family::<Labels, Counter>::default();
    records
        .get_or_create(&vec![("kind", "traffic".into())])
        .inc_by(inputs.traffic.records());
    records
        .get_or_create(&vec![("kind", "probe".into())])
        .inc_by(inputs.traffic.probes);
    announce(
        &mut registry,
        "records",
        "Records the recorder produced: the traffic's, and prefixscope's own probes of the server",
        records,
    );

    register_tokens(&mut registry, totals);
    register_losses(&mut registry, totals);

    let breaks = Family::<Labels, FloatGauge>::default();
    for (cause, n) in &totals.breaks_by_cause {
        breaks
            .get_or_create(&vec![("cause", cause.clone())])
            .set(*n as f64);
    }
    let evictions = Family::<Labels, FloatGauge>::default();
    for (kind, n) in &totals.evictions_by_kind {
        evictions
            .get_or_create(&vec![("evictor", kind.clone())])
            .set(*n as f64);
    }
    announce(
        &mut registry,
        "prefix_breaks",
        "Turns whose prompt stopped matching the previous turn's, by cause (the analysis's current count)",
        breaks,
    );
    announce(
        &mut registry,
        "evictions",
        "Turns whose cached prefix was most likely evicted by another request, by the evictor's kind",
        evictions,
    );

    let turns = FloatGauge::default();
    turns.set(totals.turns as f64);
    registry.register("turns", "Conversation turns the analysis found", turns);
    let conversations = FloatGauge::default();
    conversations.set(totals.conversations as f64);
    announce(
        &mut registry,
        "conversations",
        "Conversations the analysis found",
        conversations,
    );

    let (cache, proxy, window) = (inputs.cache, inputs.proxy, inputs.window);
    gauge(
        &mut registry,
        "cache_ceiling_ratio",
        "The prefix-cache hit rate no cache could beat on the requests so far (0 to 1)",
        cache.map(|c| c.ceiling),
    );
    gauge(
        &mut registry,
        "server_reuse_ratio",
        "Of the simulated requests' prompt tokens, the share the server said it reused (0 to 1)",
        cache.and_then(|c| c.server_reuse),
    );
    counter(
        &mut registry,
        "records_not_written",
        "Records the recorder could not write (a full disk); the proxy forwards on",
        proxy.map(|p| p.records_not_written),
    );
    gauge(
        &mut registry,
        "recorder_queue_depth",
        "Captures waiting for the recorder",
        proxy.map(|p| p.recorder_queue_depth as f64),
    );
    counter(
        &mut registry,
        "metrics_connection_errors",
        "Connections to this metrics endpoint that failed",
        proxy.map(|p| p.metrics_connection_errors),
    );
    counter(
        &mut registry,
        "metrics_records_skipped",
        "Records this endpoint's analysis left out because it was behind the proxy (its queue full); the analysis families do not include them",
        window.map(|w| w.records_skipped),
    );
    counter(
        &mut registry,
        "metrics_windows_closed",
        "Times this endpoint's analysis closed a window of --metrics-window records and started again, its totals kept",
        window.map(|w| w.windows_closed),
    );
    gauge(
        &mut registry,
        "metrics_window_records",
        "Records analysed in this endpoint's open window",
        window.map(|w| w.window_records as f64),
    );
    gauge(
        &mut registry,
        "metrics_analysis_stepped_aside",
        "1 while this endpoint's analysis steps aside because records come faster than it analyses them (the recorder skips it, counted in metrics_records_skipped); 0 otherwise",
        window.map(|w| if w.stepped_aside { 1.0 } else { 0.0 }),
    );
    registry
}

/// Prompt, reused and evaluated tokens by model, as the server (or the estimate) counted them.
fn register_tokens(registry: &mut Registry, totals: &Totals) {
    let ranked: Vec<(String, (f64, u64))> = totals
        .tokens_by_model
        .iter()
        .map(|(model, sums)| (model.clone(), (sums[0] as f64, 0)))
        .collect();
    let kept = capped(ranked);
    let families: [Family<Labels, Counter>; 3] = Default::default();
    for (model, sums) in &totals.tokens_by_model {
        let label = kept_or_other(&kept, model);
        for (family, n) in families.iter().zip(sums) {
            family
                .get_or_create(&vec![("model", label.clone())])
                .inc_by(*n);
        }
    }
    let [prompt, reused, evaluated] = families;
    announce(
        registry,
        "prompt_tokens",
        "Prompt tokens of the analysed requests, by model",
        prompt,
    );
    announce(
        registry,
        "reused_tokens",
        "Prompt tokens the server said it reused from its cache, by model",
        reused,
    );
    announce(
        registry,
        "evaluated_tokens",
        "Prompt tokens the server said it evaluated, by model",
        evaluated,
    );
}

/// Tokens and milliseconds lost by (client alias, cause): each client's rows through the
/// report's own `time` totals, so summed over clients they are `analyze`'s `time.by_cause` to
/// the token.
fn losses<R: Priced>(report: &Report<R>) -> BTreeMap<(String, String), (u64, Option<f64>)> {
    let aliases = Aliases::new(
        report
            .clients
            .iter()
            .map(|c| (c.client.as_str(), c.harness.as_deref())),
    );
    let mut by_client: HashMap<String, Vec<Rated<'_>>> = HashMap::new();
    for rated in report.rows.iter().map(Priced::rated) {
        let label = label_value(&aliases.of(&rated.row().client));
        by_client.entry(label).or_default().push(rated);
    }
    let mut lost = BTreeMap::new();
    for (client, rows) in by_client {
        for (cause, total) in time(&rows).by_cause {
            lost.insert(
                (client.clone(), label_value(&cause)),
                (total.tokens, total.ms.map(|ms| ms.value)),
            );
        }
    }
    lost
}

/// Tokens and seconds lost by client and cause, the clients capped by cost.
fn register_losses(registry: &mut Registry, totals: &Totals) {
    let mut cost: BTreeMap<&str, (f64, u64)> = BTreeMap::new();
    for ((client, _), (tokens, ms)) in &totals.lost {
        let sum = cost.entry(client).or_default();
        sum.0 += ms.unwrap_or(0.0);
        sum.1 += tokens;
    }
    let ranked: Vec<(String, (f64, u64))> = cost
        .into_iter()
        .map(|(client, cost)| (client.to_string(), cost))
        .collect();
    let kept = capped(ranked);
    let tokens = Family::<Labels, FloatGauge>::default();
    let seconds = Family::<Labels, FloatGauge>::default();
    for ((client, cause), (lost_tokens, ms)) in &totals.lost {
        let labels = vec![
            ("client", kept_or_other(&kept, client)),
            ("cause", cause.clone()),
        ];
        tokens.get_or_create(&labels).inc_by(*lost_tokens as f64);
        if let Some(ms) = ms {
            seconds.get_or_create(&labels).inc_by(ms / 1000.0);
        }
    }
    announce(
        registry,
        "lost_tokens",
        "Prompt tokens re-evaluated that the cache could have served, by client and cause (the analysis's current total)",
        tokens,
    );
    announce(
        registry,
        "lost_seconds",
        "Prefill seconds those tokens cost, by client and cause (the analysis's current total)",
        seconds,
    );
}

/// The `MAX_LABEL_VALUES` costliest values (ties by name, so the choice is stable).
pub fn capped(mut ranked: Vec<(String, (f64, u64))>) -> Vec<String> {
    ranked.sort_by(|a, b| {
        b.1.0
            .total_cmp(&a.1.0)
            .then(b.1.1.cmp(&a.1.1))
            .then(a.0.cmp(&b.0))
    });
    let mut kept: Vec<String> = ranked
        .into_iter()
        .take(MAX_LABEL_VALUES)
        .map(|(value, _)| value)
        .collect();
    kept.sort_unstable();
    kept
}

fn kept_or_other(kept: &[String], value: &str) -> String {
    if kept.binary_search_by(|k| k.as_str().cmp(value)).is_ok() {
        value.to_string()
    } else {
        OTHER.to_string()
    }
}

/// A label value the text formats take as it is: the encoder writes values unescaped, so
/// quotes, backslashes and control characters (a user agent's) become `_`; cut to
/// `MAX_LABEL_CHARS`.
pub fn label_value(text: &str) -> String {
    let value: String = text
        .chars()
        .take(MAX_LABEL_CHARS)
        .map(|c| {
            if c == '"' || c == '\\' || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect();
    if value.is_empty() {
        "none".into()
    } else {
        value
    }
}

/// The registry in the OpenMetrics text format (what prometheus-client writes; Prometheus asks
/// for it when it scrapes).
pub fn openmetrics(registry: &Registry) -> String {
    let mut text = String::new();
    // Writing into a String does not fail.
    let _ = prometheus_client::encoding::text::encode(&mut text, registry);
    text
}

/// The OpenMetrics text in the classic Prometheus text format (0.0.4), which promtool, the
/// node exporter's textfile collector and plain scrapers read: the two differ, for the families
/// here, only in a counter family's name (`X` in OpenMetrics, `X_total` as its samples are
/// named in the classic one), `# UNIT` lines and the closing `# EOF`.
pub fn classic(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.strip_suffix(" counter"))
        .collect();
    let mut text = String::with_capacity(openmetrics.len() + 16 * counters.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|start| {
            let rest = line.strip_prefix(start)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{start}{name}_total {tail}"))
        });
        match renamed {
            Some(line) => text.push_str(&line),
            None => text.push_str(line),
        }
        text.push('\n');
    }
    text
}

/// The cache figures of a live engine's hit-rate curve: its ceiling and the server's reuse
/// (none before the first simulated request).
pub fn cache_figures(curve: Option<&prefixscope_core::live::view::Curve>) -> Option<CacheFigures> {
    curve.map(|curve| CacheFigures {
        ceiling: curve.ceiling,
        server_reuse: curve.observed,
    })
}

/// `analyze --prometheus`: a recording's exposition in the classic text format, `report` being
/// `analyze`'s of `records`. The ceiling is the live engine's, run over the records as a replay
/// runs them (without the source's end, which would work out the what-if too).
pub fn of_recording(
    records: &[Record],
    report: &Report,
    config: &prefixscope_core::analysis::Config,
    server: &str,
) -> String {
    let mut engine = prefixscope_core::live::Engine::for_records(config.clone(), records);
    for record in records {
        engine.push(prefixscope_core::live::Input::Record(
            std::sync::Arc::new(record.clone()),
            0,
        ));
    }
    let inputs = Inputs {
        totals: &Totals::of(report),
        traffic: &Traffic::of(records),
        cache: cache_figures(engine.analysis_and_curve().1.as_ref()),
        proxy: None,
        window: None,
        server,
    };
    classic(&openmetrics(&registry(&inputs)))
}

#[cfg(test)]
mod tests;
