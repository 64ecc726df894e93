//! Prometheus metrics, rendered in the text exposition format at `GET /metrics`.
//!
//! A small hand-rolled registry: label sets are few (apps × models × outcomes), so
//! a mutex-protected map per family is cheap next to a batch's inference time, and
//! it avoids pulling a metrics framework into the hot path's dependencies. A
//! counted label set is found by the hash of the borrowed labels ([`LabelMap`]):
//! counting allocates only the first time a label set is seen, not per answer
//! (issue 36's profile found the owned key built per answer under the lock).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;
use std::hash::{Hash, Hasher};
use std::sync::OnceLock;

use parking_lot::Mutex;

/// Histogram buckets for latencies, in seconds (100 µs to 10 s).
pub const LATENCY_BUCKETS: &[f64] =
    &[0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// Histogram buckets for policy decision time, in seconds (250 ns to 10 ms).
pub const DECIDE_BUCKETS: &[f64] =
    &[0.00000025, 0.0000005, 0.000001, 0.0000025, 0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.001, 0.01];

/// Histogram buckets for batch sizes.
pub const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0];

type Labels = Vec<(&'static str, String)>;

/// Label sets and their values, found by the borrowed labels without building an
/// owned key: a map from the labels' hash to the (few) sets with that hash.
/// Rendering sorts the sets, so the exposition's order is the labels' order.
struct LabelMap<V> {
    by_hash: HashMap<u64, Vec<(Labels, V)>>,
}

impl<V> Default for LabelMap<V> {
    fn default() -> Self {
        LabelMap { by_hash: HashMap::new() }
    }
}

impl<V> LabelMap<V> {
    /// The value of `labels`, made by `make` the first time they are seen.
    fn slot(&mut self, labels: &[(&'static str, &str)], make: impl FnOnce() -> V) -> &mut V {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        for (k, v) in labels {
            k.hash(&mut hasher);
            v.hash(&mut hasher);
        }
        let sets = self.by_hash.entry(hasher.finish()).or_default();
        let same = |l: &Labels| l.len() == labels.len() && l.iter().zip(labels).all(|(a, b)| a.0 == b.0 && a.1 == b.1);
        let i = match sets.iter().position(|(l, _)| same(l)) {
            Some(i) => i,
            None => {
                sets.push((labels.iter().map(|(k, v)| (*k, v.to_string())).collect(), make()));
                sets.len() - 1
            }
        };
        &mut sets[i].1
    }

    /// Every label set with its value, in the labels' order.
    fn sorted(&self) -> Vec<(&Labels, &V)> {
        let mut all: Vec<_> = self.by_hash.values().flatten().map(|(l, v)| (l, v)).collect();
        all.sort_by(|a, b| a.0.cmp(b.0));
        all
    }
}

impl LabelMap<u64> {
    /// Adds one to `labels`' count.
    fn count(&mut self, labels: &[(&'static str, &str)]) {
        *self.slot(labels, || 0) += 1;
    }
}

#[derive(Default)]
struct Histogram {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

/// What the HTTP front counts about connections.
#[derive(Default)]
pub struct ConnectionStats {
    /// Open connections now.
    pub open: std::sync::atomic::AtomicU64,
    /// Connections refused over `max_connections`.
    pub refused: std::sync::atomic::AtomicU64,
    /// Connections closed after `idle_timeout_ms` without activity.
    pub idle_closed: std::sync::atomic::AtomicU64,
    /// Connections closed because a request's head did not arrive in time.
    pub header_timeouts: std::sync::atomic::AtomicU64,
    /// Connections asked to give their slot to a client under its share
    /// (`connection_share`; `crate::conn::Connections`).
    pub evicted: std::sync::atomic::AtomicU64,
}

/// All of sluice's metrics.
#[derive(Default)]
pub struct Metrics {
    /// Connection gauges and counters (the HTTP front updates them directly).
    pub connections: ConnectionStats,
    requests: Mutex<LabelMap<u64>>,
    responses: Mutex<LabelMap<u64>>,
    faults: Mutex<LabelMap<u64>>,
    swaps: Mutex<LabelMap<u64>>,
    /// One map per family of [`HISTOGRAMS`], by its name.
    histograms: Mutex<BTreeMap<&'static str, LabelMap<Histogram>>>,
    events: Mutex<Events>,
    replans: Mutex<LabelMap<u64>>,
    /// Writes the gauges read from the apps when scraped ([`Metrics::read_gauges_from`]).
    gauges: OnceLock<Gauges>,
}

/// Writes gauges into the exposition when it is rendered.
pub type Gauges = Box<dyn Fn(&mut String) + Send + Sync>;

/// How many control events (swaps, re-plans) the dashboard's timeline keeps: a
/// page polls every half second and asks for those after the last it saw, so only
/// a page that was closed longer than the host took this many swaps misses some.
pub const EVENTS_KEPT: usize = 256;

/// The timeline of control events the dashboard draws as markers.
#[derive(Default)]
struct Events {
    next_seq: u64,
    kept: std::collections::VecDeque<Event>,
}

/// One control event: a hot swap or a re-plan, when it happened.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Event {
    /// Its number, counting from 1: a reader asks for those after the last it saw.
    pub seq: u64,
    /// When, in milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// `swap` or `replan`.
    pub kind: &'static str,
    /// The app swapped, or the re-planned scope (`allocator`).
    pub app: String,
    /// The policy swapped in, or the re-plan's reason.
    pub detail: String,
}

/// Families rendered as histograms: name, help text, buckets.
const HISTOGRAMS: &[(&str, &str, &[f64])] = &[
    (
        "sluice_queue_seconds",
        "Time from arrival to the start of the batch that served the request, by app.",
        LATENCY_BUCKETS,
    ),
    ("sluice_latency_seconds", "Latency from arrival to the served answer, by app.", LATENCY_BUCKETS),
    ("sluice_batch_size", "Requests per executed batch, by app and model.", BATCH_BUCKETS),
    ("sluice_policy_decide_seconds", "Time of one policy decide call, by app.", DECIDE_BUCKETS),
    (
        "sluice_allocator_solve_seconds",
        "Wall time of one allocation (every solve down the demand ladder), by solver status.",
        LATENCY_BUCKETS,
    ),
];

impl Metrics {
    /// Counts one answered request. `outcome` is `served`, `late`, `dropped-<reason>`
    /// (`DropReason::as_str`) or `rejected-<why>` (`queue-full`, `overload`,
    /// `shutdown`): the admin view's `served`, `late`, `dropped` and `rejected`
    /// counters are these summed over models and reasons.
    pub fn request(&self, app: &str, model: &str, outcome: &str) {
        self.requests_n(app, model, outcome, 1);
    }

    /// Counts `n` answered requests alike (a batch's served answers: one lock per
    /// batch, not per answer); see [`Metrics::request`].
    pub fn requests_n(&self, app: &str, model: &str, outcome: &str, n: u64) {
        if n > 0 {
            *self.requests.lock().slot(&[("app", app), ("model", model), ("outcome", outcome)], || 0) += n;
        }
    }

    /// Counts one answer a client received from `front` (`http`: every response,
    /// by status code; `grpc`: every inference call, by gRPC code name).
    pub fn response(&self, front: &'static str, code: &str) {
        self.responses.lock().count(&[("front", front), ("code", code)]);
    }

    /// Counts one policy fault of `kind` (`PolicyFault::kind`: `trap`, `timeout`,
    /// `memory`, `invalid`, `reinit`, `stalled`).
    pub fn fault(&self, app: &str, policy: &str, kind: &str) {
        self.faults.lock().count(&[("app", app), ("policy", policy), ("kind", kind)]);
    }

    /// Counts one hot swap.
    pub fn swap(&self, app: &str, policy: &str) {
        self.swaps.lock().count(&[("app", app), ("policy", policy)]);
        self.event("swap", app, policy);
    }

    /// Records a control event for the dashboard's markers (swaps record theirs
    /// through [`Metrics::swap`]). A `replan` also counts in `sluice_replans_total`
    /// (scope `app`, reason `detail`), so Grafana sees what the page's markers show.
    pub fn event(&self, kind: &'static str, app: &str, detail: &str) {
        if kind == "replan" {
            self.replans.lock().count(&[("scope", app), ("reason", detail)]);
        }
        let unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let mut e = self.events.lock();
        e.next_seq += 1;
        let seq = e.next_seq;
        e.kept.push_back(Event { seq, unix_ms, kind, app: app.to_string(), detail: detail.to_string() });
        while e.kept.len() > EVENTS_KEPT {
            e.kept.pop_front();
        }
    }

    /// The control events after `seq` (0: every one kept), oldest first.
    pub fn events_after(&self, seq: u64) -> Vec<Event> {
        self.events.lock().kept.iter().filter(|e| e.seq > seq).cloned().collect()
    }

    /// `app`'s answered requests by (model, outcome), as `sluice_requests_total` counts them.
    pub fn requests_of(&self, app: &str) -> Vec<(String, String, u64)> {
        let map = self.requests.lock();
        map.sorted()
            .into_iter()
            .filter(|(l, _)| l.iter().any(|(k, v)| *k == "app" && v == app))
            .map(|(l, n)| {
                let get = |key: &str| l.iter().find(|(k, _)| *k == key).map(|(_, v)| v.clone()).unwrap_or_default();
                (get("model"), get("outcome"), *n)
            })
            .collect()
    }

    /// The cumulative bucket counts of histogram family `name` (one of [`HISTOGRAMS`])
    /// summed over every label set with `app`, one per bucket of the family, then the
    /// total count (the `+Inf` bucket).
    pub fn buckets_of(&self, name: &str, app: &str) -> Vec<u64> {
        let n = HISTOGRAMS.iter().find(|h| h.0 == name).map(|h| h.2.len()).unwrap_or(0);
        let mut out = vec![0; n + 1];
        let map = self.histograms.lock();
        for (labels, h) in map.get(name).map(LabelMap::sorted).unwrap_or_default() {
            if labels.iter().any(|(k, v)| *k == "app" && v == app) {
                for (o, c) in out.iter_mut().zip(&h.counts) {
                    *o += c;
                }
                out[n] += h.count;
            }
        }
        out
    }

    /// Records one observation into the histogram family `name` (one of [`HISTOGRAMS`]).
    pub fn record(&self, name: &'static str, labels: &[(&'static str, &str)], value: f64) {
        self.record_all(name, labels, [value]);
    }

    /// Records every value of `values` into one label set of the histogram family
    /// `name` under one lock (a batch's latencies).
    pub fn record_all(
        &self,
        name: &'static str,
        labels: &[(&'static str, &str)],
        values: impl IntoIterator<Item = f64>,
    ) {
        let buckets = HISTOGRAMS.iter().find(|h| h.0 == name).map(|h| h.2).unwrap_or(LATENCY_BUCKETS);
        let mut map = self.histograms.lock();
        let h = map
            .entry(name)
            .or_default()
            .slot(labels, || Histogram { counts: vec![0; buckets.len()], ..Default::default() });
        for value in values {
            // Buckets are sorted: the value falls in every bucket from the first
            // bound at or above it (a NaN in none, counted only in `count`).
            let first =
                buckets.partition_point(|b| matches!(value.partial_cmp(b), Some(std::cmp::Ordering::Greater) | None));
            for c in &mut h.counts[first..] {
                *c += 1;
            }
            h.sum += value;
            h.count += 1;
        }
    }

    /// The observation count and sum of the histogram family `name` over every
    /// label set that includes `labels` (the statistics extension reads them).
    pub fn histogram_totals(&self, name: &str, labels: &[(&str, &str)]) -> (u64, f64) {
        let map = self.histograms.lock();
        map.get(name)
            .map(LabelMap::sorted)
            .unwrap_or_default()
            .into_iter()
            .filter(|(l, _)| labels.iter().all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v)))
            .fold((0, 0.0), |(count, sum), (_, h)| (count + h.count, sum + h.sum))
    }

    /// Sets what writes the gauges read at scrape time (per-worker queue lengths,
    /// the variants' accuracies: the state's apps, `State::build`). Set once. Read
    /// when scraped, they cost the request path nothing; a function and not the
    /// state itself, so these metrics stay below the state that owns them.
    pub fn read_gauges_from(&self, gauges: Gauges) {
        let _ = self.gauges.set(gauges);
    }

    /// Renders everything in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        counter(
            &mut out,
            "sluice_requests_total",
            "Answered requests by app, model (empty when none served it) and outcome, each the status its client got: served and late (200), dropped-{policy,expired} (504), dropped-executor-error (500: a failed batch), rejected-{queue-full,overload} (429), rejected-shutdown (503). A batched request counts each sample.",
            &self.requests.lock(),
        );
        counter(
            &mut out,
            "sluice_responses_total",
            "Answers sent, by front and code: every HTTP response by status, every gRPC inference call by code.",
            &self.responses.lock(),
        );
        counter(
            &mut out,
            "sluice_policy_faults_total",
            "Policy faults by app, policy and kind (trap, timeout, memory, invalid: answered by the safe policy; reinit: a failed re-instantiation; stalled: requests expired while the policy dispatched nothing).",
            &self.faults.lock(),
        );
        counter(
            &mut out,
            "sluice_policy_swaps_total",
            "Completed hot swaps of an app's policy, by app and the policy swapped in.",
            &self.swaps.lock(),
        );
        counter(
            &mut out,
            "sluice_replans_total",
            "Re-plans that put a new plan in force, by scope (allocator: the [[device]] allocator) and reason (admin, period, demand shift).",
            &self.replans.lock(),
        );
        if let Some(gauges) = self.gauges.get() {
            gauges(&mut out);
        }
        let c = &self.connections;
        let get = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        let _ = writeln!(
            out,
            "# HELP sluice_connections_open Open connections (HTTP and gRPC).\n# TYPE sluice_connections_open gauge\nsluice_connections_open {}",
            get(&c.open)
        );
        let _ = writeln!(
            out,
            "# HELP sluice_connections_closed_total Connections (HTTP and gRPC) refused or closed by the server, by reason: limit (refused at max_connections), idle, header-timeout, fairness (asked to give its slot to a client under its connection_share).\n# TYPE sluice_connections_closed_total counter"
        );
        for (reason, v) in [
            ("limit", &c.refused),
            ("idle", &c.idle_closed),
            ("header-timeout", &c.header_timeouts),
            ("fairness", &c.evicted),
        ] {
            let _ = writeln!(out, "sluice_connections_closed_total{{reason=\"{reason}\"}} {}", get(v));
        }
        let map = self.histograms.lock();
        for (name, help, buckets) in HISTOGRAMS {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            for (labels, h) in map.get(name).map(LabelMap::sorted).unwrap_or_default() {
                let base = render_labels(labels);
                let sep = if base.is_empty() { "" } else { "," };
                for (i, b) in buckets.iter().enumerate() {
                    let _ = writeln!(out, "{name}_bucket{{{base}{sep}le=\"{b}\"}} {}", h.counts[i]);
                }
                let _ = writeln!(out, "{name}_bucket{{{base}{sep}le=\"+Inf\"}} {}", h.count);
                let _ = writeln!(out, "{name}_sum{{{base}}} {}", h.sum);
                let _ = writeln!(out, "{name}_count{{{base}}} {}", h.count);
            }
        }
        out
    }
}

/// The labels as the exposition writes them: `k="v",...`, values escaped.
pub fn render_labels(labels: &[(&'static str, String)]) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")))
        .collect::<Vec<_>>()
        .join(",")
}

fn counter(out: &mut String, name: &str, help: &str, map: &LabelMap<u64>) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
    for (labels, v) in map.sorted() {
        let _ = writeln!(out, "{name}{{{}}} {v}", render_labels(labels));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_histograms() {
        let m = Metrics::default();
        m.request("a", "m\"1", "served");
        m.request("a", "m\"1", "served");
        m.record("sluice_batch_size", &[("app", "a")], 3.0);
        let text = m.render();
        assert!(text.contains("sluice_requests_total{app=\"a\",model=\"m\\\"1\",outcome=\"served\"} 2"), "{text}");
        assert!(text.contains("sluice_batch_size_bucket{app=\"a\",le=\"2\"} 0"), "{text}");
        assert!(text.contains("sluice_batch_size_bucket{app=\"a\",le=\"4\"} 1"), "{text}");
        assert!(text.contains("sluice_batch_size_count{app=\"a\"} 1"), "{text}");
    }

    #[test]
    fn a_replan_event_counts_by_scope_and_reason() {
        let m = Metrics::default();
        m.event("replan", "allocator", "admin");
        m.event("replan", "allocator", "admin");
        m.event("replan", "allocator", "period");
        m.swap("a", "fixed");
        let text = m.render();
        assert!(text.contains("# TYPE sluice_replans_total counter"), "{text}");
        assert!(text.contains("sluice_replans_total{scope=\"allocator\",reason=\"admin\"} 2"), "{text}");
        assert!(text.contains("sluice_replans_total{scope=\"allocator\",reason=\"period\"} 1"), "{text}");
        assert!(!text.contains("sluice_replans_total{scope=\"a\""), "a swap is not a re-plan: {text}");
        assert_eq!(m.events_after(0).len(), 4, "every event is still a marker");
    }
}
