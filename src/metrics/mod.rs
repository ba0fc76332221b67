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

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use prefixscope_core::analysis::{Priced, Report};
use prefixscope_core::live::view::Curve;
use prefixscope_core::live::{Earlier, Engine, Snapshot};
pub use prefixscope_core::live::{Sums, label_value};
use prefixscope_core::record::Record;

/// Every family's name starts with it.
pub const PREFIX: &str = "prefixscope";
/// Clients (and models) kept as label values of their own, the costliest first; the rest are
/// summed as `other`, so a label has at most `MAX_LABEL_VALUES + 1` values.
pub const MAX_LABEL_VALUES: usize = 20;
pub const OTHER: &str = "other";

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

/// What the analysis families are built from at one moment: the live engine's open analysis
/// and what its analyses before (`Earlier`) covered, added, so within one analysis the figures
/// equal `analyze` of its records and across restarts they are the sum of each.
#[derive(Debug, Clone, PartialEq)]
pub struct Figures {
    pub totals: Sums,
    pub cache: Option<CacheFigures>,
    pub window: WindowFigures,
}

impl Figures {
    /// `report` and `curve` of the open analysis, the ratios weighted by prompt tokens.
    pub fn of<R: Priced>(
        report: &Report<R>,
        curve: Option<&Curve>,
        earlier: Option<&Earlier>,
    ) -> Figures {
        let none = Earlier::default();
        let earlier = earlier.unwrap_or(&none);
        let open = Sums::of(report);
        let weight = open.prompt_tokens() as f64;
        let mut totals = earlier.sums.clone();
        totals.add(&open);
        let cache = earlier
            .ceiling
            .with(curve.map(|c| c.ceiling), weight)
            .map(|ceiling| CacheFigures {
                ceiling,
                server_reuse: earlier
                    .server_reuse
                    .with(curve.and_then(|c| c.observed), weight),
            });
        Figures {
            totals,
            cache,
            window: WindowFigures {
                records_skipped: 0,
                windows_closed: earlier.restarts,
                window_records: report.coverage.records,
                stepped_aside: false,
            },
        }
    }

    /// A live engine's figures now.
    pub fn of_engine(engine: &mut Engine) -> Figures {
        let (report, curve) = engine.analysis_and_curve();
        Figures::of(&report, curve.as_ref(), engine.earlier())
    }

    /// A snapshot's figures (the engine behind the screen).
    pub fn of_snapshot(snapshot: &Snapshot) -> Figures {
        Figures::of(
            &snapshot.report,
            snapshot.view.curve.as_ref(),
            snapshot.earlier.as_ref(),
        )
    }
}

/// Everything the exposition is built from.
pub struct Inputs<'a> {
    pub totals: &'a Sums,
    pub traffic: &'a Traffic,
    pub cache: Option<CacheFigures>,
    pub proxy: Option<ProxyFigures>,
    pub window: Option<WindowFigures>,
    /// The `server` label of every family: the upstream (`--metrics`), or what `analyze` is told.
    pub server: &'a str,
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
fn register_tokens(registry: &mut Registry, totals: &Sums) {
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

/// Tokens and seconds lost by client and cause, the clients capped by cost.
fn register_losses(registry: &mut Registry, totals: &Sums) {
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
    let (_, curve) = engine.analysis_and_curve();
    let inputs = Inputs {
        totals: &Sums::of(report),
        traffic: &Traffic::of(records),
        cache: Figures::of(report, curve.as_ref(), None).cache,
        proxy: None,
        window: None,
        server,
    };
    classic(&openmetrics(&registry(&inputs)))
}

#[cfg(test)]
mod tests;
