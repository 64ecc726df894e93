//! What a simulated run measures, and the files it writes.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use sluice_core::queue::DropReason;

use crate::Accounting;

/// Writes drops keyed by their label, in label order as the string keys were
/// (the type's own order differs), so results files keep their bytes.
fn drops_by_label<S: serde::Serializer>(counts: &BTreeMap<DropReason, u64>, s: S) -> Result<S::Ok, S::Error> {
    let labels: BTreeMap<&str, u64> = counts.iter().map(|(r, n)| (r.as_str(), *n)).collect();
    labels.serialize(s)
}

/// How one request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Fate {
    /// Not finished when the run ended.
    Pending = 0,
    /// Served by its deadline.
    OnTime = 1,
    /// Served after its deadline.
    Late = 2,
    /// Dropped by the policy.
    Dropped = 3,
    /// Expired by the host.
    Expired = 4,
    /// Refused at admission ([`crate::Experiment::admission`]): never queued.
    Refused = 5,
}

impl Fate {
    fn missed(self) -> bool {
        !matches!(self, Fate::OnTime)
    }
    fn dropped(self) -> bool {
        matches!(self, Fate::Dropped | Fate::Expired)
    }
}

/// Accumulates one app's run.
pub struct Stats {
    fates: Vec<Fate>,
    arrivals: Vec<u64>,
    accuracy: Vec<f64>,
    /// Batches run per batch size (index: the size), counted densely: a map entry
    /// per batch was a measurable share of a run's event loop. [`Stats::batch_sizes`]
    /// gives the map the results hold.
    batches: Vec<u64>,
    /// Requests served per variant (index into `model_names`), counted densely as
    /// `batches`; [`Stats::model_mix`] gives the map by name.
    served: Vec<u64>,
    /// Per request: arrival to completion, µs (served ones).
    latency_us: Vec<u64>,
    /// Per request: when a worker took it or the host dropped it, µs (`u64::MAX`:
    /// never), for the reference accounting.
    taken: Vec<u64>,
    /// (time µs, devices hosting the app's variants from then on), for runs on
    /// `[[device]]`s.
    devices: Vec<(u64, u32)>,
    /// Per request: the queue it joined ([`NONE`]: not this shard's, or not yet).
    queue: Vec<u16>,
    /// Per request: the variant (index into `model_names`) that served it ([`NONE`]: none).
    model: Vec<u16>,
    /// The app's variants, in the order `served_by` numbers them ([`Stats::with_models`]).
    model_names: Vec<String>,
    /// The app's queues (one per worker, one when they share it).
    queues: usize,
    /// Policy faults answered by the safe decision.
    pub faults: u64,
    /// `decide` calls.
    pub decide_calls: u64,
    /// Time inside `decide` (wall clock: not part of the deterministic results).
    pub decide_seconds: f64,
    /// Whether the run admits ([`Stats::admitting`]): its result then counts the
    /// refused requests.
    admitting: bool,
    /// Per request, whether admission would have refused it and `admission_audit`
    /// admitted it anyway ([`Stats::audited`]); empty when the run audits none.
    audited: Vec<bool>,
}

impl Stats {
    /// Stats for requests arriving at `arrivals` (µs).
    pub fn new(arrivals: Vec<u64>) -> Stats {
        let n = arrivals.len();
        Stats {
            fates: vec![Fate::Pending; n],
            arrivals,
            accuracy: vec![0.0; n],
            latency_us: vec![0; n],
            taken: vec![u64::MAX; n],
            devices: Vec::new(),
            queue: vec![NONE; n],
            model: vec![NONE; n],
            model_names: Vec::new(),
            queues: 0,
            batches: Vec::new(),
            served: Vec::new(),
            faults: 0,
            decide_calls: 0,
            decide_seconds: 0.0,
            admitting: false,
            audited: Vec::new(),
        }
    }

    /// Marks a run with admission: its result has a `refused` count (a run
    /// without has none, so its results files stay as they were).
    pub fn admitting(mut self) -> Stats {
        self.admitting = true;
        self
    }

    /// Marks a run whose admission audits a share of its refusals
    /// (`admission_audit`): its result counts them and how many made their
    /// deadline, the simulated twin of the admin view's `admission_audit`.
    pub fn auditing(mut self) -> Stats {
        self.audited = vec![false; self.fates.len()];
        self
    }

    /// Request `id` was admitted as an audit of a refusal ([`Stats::auditing`]).
    pub fn audited(&mut self, id: u64) {
        if let Some(a) = self.audited.get_mut(id as usize) {
            *a = true;
        }
    }

    /// Names the app's variants (in the order [`Stats::served_by`] numbers them) and
    /// its number of queues, for the per-window variant mix and queue lengths.
    pub fn with_models(mut self, names: Vec<String>, queues: usize) -> Stats {
        self.served = vec![0; names.len()];
        self.model_names = names;
        self.queues = queues;
        self
    }

    /// Request `id` joined queue `q`.
    pub fn queued(&mut self, id: u64, q: usize) {
        self.queue[id as usize] = q.min(NONE as usize - 1) as u16;
    }

    /// Request `id` was served by variant `model` (its index among the app's variants).
    pub fn served_by(&mut self, id: u64, model: u32) {
        self.model[id as usize] = model.min(NONE as u32 - 1) as u16;
    }

    /// Folds in another shard's stats of the same arrivals: each request the other
    /// shard took or ended takes its record from there; counts add up.
    pub fn absorb(&mut self, other: &Stats) {
        for id in 0..self.queue.len().min(other.queue.len()) {
            // Queued there (a request still queued at the end was neither taken nor ended).
            if other.queue[id] != NONE {
                self.queue[id] = other.queue[id];
                self.model[id] = other.model[id];
            }
        }
        for id in 0..self.fates.len().min(other.fates.len()) {
            if other.fates[id] != Fate::Pending || other.taken[id] != u64::MAX {
                self.fates[id] = other.fates[id];
                self.accuracy[id] = other.accuracy[id];
                self.latency_us[id] = other.latency_us[id];
                self.taken[id] = other.taken[id];
            }
        }
        if self.batches.len() < other.batches.len() {
            self.batches.resize(other.batches.len(), 0);
        }
        for (mine, n) in self.batches.iter_mut().zip(&other.batches) {
            *mine += n;
        }
        for (mine, n) in self.served.iter_mut().zip(&other.served) {
            *mine += n;
        }
        for (mine, theirs) in self.audited.iter_mut().zip(&other.audited) {
            *mine |= theirs;
        }
        self.faults += other.faults;
        self.decide_calls += other.decide_calls;
        self.decide_seconds += other.decide_seconds;
    }

    /// Request `id` ended with `fate`; `accuracy` counts when it was served.
    pub fn finish(&mut self, id: u64, fate: Fate, accuracy: f64) {
        self.fates[id as usize] = fate;
        self.accuracy[id as usize] = accuracy;
    }

    /// Request `id` left the queue at `now`: a worker took it, or it was dropped.
    pub fn taken(&mut self, id: u64, now: u64) {
        self.taken[id as usize] = now;
    }

    /// Request `id` was served `us` after it arrived.
    pub fn latency(&mut self, id: u64, us: u64) {
        self.latency_us[id as usize] = us;
    }

    /// From `now` on, `n` devices host the app's variants.
    pub fn devices_in_use(&mut self, now: u64, n: u32) {
        self.devices.push((now, n));
    }

    /// The time-weighted mean of devices in use over [from, to) µs (None without a
    /// device log).
    fn mean_devices(&self, from: u64, to: u64) -> Option<f64> {
        if self.devices.is_empty() || to <= from {
            return None;
        }
        let mut area = 0.0;
        for (k, &(t, n)) in self.devices.iter().enumerate() {
            let end = self.devices.get(k + 1).map_or(u64::MAX, |x| x.0);
            let (a, b) = (t.max(from), end.min(to));
            if b > a {
                area += n as f64 * (b - a) as f64;
            }
        }
        Some(area / (to - from) as f64)
    }

    /// A batch of `size` ran on variant `model` (its index among the app's
    /// variants, [`Stats::with_models`]).
    pub fn batch(&mut self, model: u32, size: usize) {
        if size >= self.batches.len() {
            self.batches.resize(size + 1, 0);
        }
        self.batches[size] += 1;
        if let Some(n) = self.served.get_mut(model as usize) {
            *n += size as u64;
        }
    }

    /// Batches run per size (sizes that ran at least once).
    pub fn batch_sizes(&self) -> BTreeMap<usize, u64> {
        self.batches.iter().enumerate().filter(|(_, &n)| n > 0).map(|(size, &n)| (size, n)).collect()
    }

    /// Requests served per variant, by name (variants that served at least one).
    pub fn model_mix(&self) -> BTreeMap<String, u64> {
        let mut mix = BTreeMap::new();
        for (name, &n) in self.model_names.iter().zip(&self.served) {
            if n > 0 {
                *mix.entry(name.clone()).or_default() += n;
            }
        }
        mix
    }

    /// The deterministic result, and the time series by arrival window.
    #[allow(clippy::too_many_arguments)]
    pub fn result(
        &self,
        run: usize,
        app: &str,
        policy: &str,
        workers: u32,
        load_qps: Option<f64>,
        trace: Option<String>,
        seed: u64,
        duration_us: u64,
        window_us: u64,
        weakly_hard: Option<[usize; 2]>,
        overloaded: Option<String>,
        accounting: Accounting,
    ) -> (RunResult, Vec<WindowRow>) {
        let count = |f: Fate| self.fates.iter().filter(|x| **x == f).count() as u64;
        let (on_time, late, dropped, expired, pending) =
            (count(Fate::OnTime), count(Fate::Late), count(Fate::Dropped), count(Fate::Expired), count(Fate::Pending));
        let n = self.fates.len() as u64;
        let acc_sum: f64 =
            self.fates.iter().zip(&self.accuracy).filter(|(f, _)| **f == Fate::OnTime).map(|(_, a)| a).sum();
        let longest = |pred: fn(Fate) -> bool| {
            let (mut best, mut cur) = (0u64, 0u64);
            for f in &self.fates {
                cur = if pred(*f) { cur + 1 } else { 0 };
                best = best.max(cur);
            }
            best
        };
        let weakly_hard = weakly_hard.map(|[m, k]| {
            // The most misses in any K consecutive requests (arrival order).
            let miss: Vec<u32> = self.fates.iter().map(|f| u32::from(f.missed())).collect();
            let mut worst = 0u32;
            let mut window: u32 = miss.iter().take(k).sum();
            worst = worst.max(window);
            for i in k..miss.len() {
                window = window + miss[i] - miss[i - k];
                worst = worst.max(window);
            }
            WeaklyHard { m, k, worst_misses_in_window: worst as usize, held: worst as usize <= m }
        });
        let sluice_accuracy = if on_time > 0 { acc_sum / on_time as f64 } else { 0.0 };
        let sluice_violation_rate = if n > 0 { (n - on_time) as f64 / n as f64 } else { 0.0 };
        // The RAMSIS artifact's accounting: only what left the queue before the end.
        let (mut counted, mut counted_on_time, mut counted_acc) = (0u64, 0u64, 0.0);
        for ((f, a), t) in self.fates.iter().zip(&self.accuracy).zip(&self.taken) {
            if *t < duration_us {
                counted += 1;
                if *f == Fate::OnTime {
                    counted_on_time += 1;
                    counted_acc += a;
                }
            }
        }
        let reference_accuracy = if counted_on_time > 0 { counted_acc / counted_on_time as f64 } else { 0.0 };
        let reference_violation_rate =
            if counted > 0 { (counted - counted_on_time) as f64 / counted as f64 } else { 0.0 };
        let (accuracy, violation_rate) = match accounting {
            Accounting::Sluice => (sluice_accuracy, sluice_violation_rate),
            Accounting::Reference => (reference_accuracy, reference_violation_rate),
        };
        let result = RunResult {
            run,
            app: app.to_string(),
            policy: policy.to_string(),
            workers,
            load_qps,
            trace,
            seed,
            requests: n,
            served: on_time + late,
            on_time,
            late,
            dropped: dropped + expired,
            dropped_by_reason: BTreeMap::from([(DropReason::Policy, dropped), (DropReason::Expired, expired)]),
            unfinished: pending,
            refused: self.admitting.then(|| count(Fate::Refused)),
            audited: (!self.audited.is_empty()).then(|| self.audited.iter().filter(|&&a| a).count() as u64),
            audited_met: (!self.audited.is_empty()).then(|| {
                self.audited.iter().zip(&self.fates).filter(|&(&a, &f)| a && f == Fate::OnTime).count() as u64
            }),
            accuracy,
            violation_rate,
            accounting,
            sluice_accuracy,
            sluice_violation_rate,
            reference_requests: counted,
            reference_accuracy,
            reference_violation_rate,
            throughput_qps: (on_time + late) as f64 / (duration_us as f64 / 1e6),
            batch_sizes: self.batch_sizes(),
            model_mix: self.model_mix(),
            max_consecutive_misses: longest(Fate::missed),
            max_consecutive_drops: longest(Fate::dropped),
            weakly_hard,
            faults: self.faults,
            decide_calls: self.decide_calls,
            overloaded,
            replans: None,
            p99_latency_ms: (!self.devices.is_empty())
                .then(|| p99_ms(self.fates.iter().zip(&self.latency_us).filter(|(f, _)| served(**f)).map(|(_, l)| *l))),
            mean_devices: self.mean_devices(0, duration_us),
            served_accuracy: (!self.devices.is_empty() && on_time + late > 0).then(|| {
                let mass: f64 =
                    self.fates.iter().zip(&self.accuracy).filter(|(f, _)| served(**f)).map(|(_, a)| a).sum();
                mass / (on_time + late) as f64
            }),
            accuracy_loss: None,
        };
        // Per window (dense, by index: a map lookup per request was most of this
        // pass), its row once a request arrived in it; windows without arrivals
        // have no row.
        let span = self.arrivals.iter().max().map_or(0, |&t| t / window_us.max(1) + 1) as usize;
        let mut windows: Vec<Option<WindowRow>> = (0..span).map(|_| None).collect();
        // The served requests' latencies per window, in the same pass (p50 for the
        // report; p99 too on [[device]]s).
        let mut latencies: Vec<Vec<u64>> = vec![Vec::new(); span];
        let mut mix: Vec<Option<Vec<u64>>> = vec![None; span];
        for (i, f) in self.fates.iter().enumerate() {
            let w = self.arrivals[i] / window_us.max(1);
            let k = w as usize;
            if served(*f) {
                latencies[k].push(self.latency_us[i]);
                let m = self.model[i] as usize;
                if m < self.model_names.len() {
                    mix[k].get_or_insert_with(|| vec![0; self.model_names.len()])[m] += 1;
                }
            }
            let row = windows[k].get_or_insert_with(|| WindowRow {
                run,
                app: app.to_string(),
                policy: policy.to_string(),
                window_start_s: (w * window_us) as f64 / 1e6,
                ..Default::default()
            });
            row.arrivals += 1;
            match f {
                Fate::OnTime => {
                    row.on_time += 1;
                    row.accuracy += self.accuracy[i];
                }
                Fate::Late => row.late += 1,
                Fate::Dropped | Fate::Expired => row.dropped += 1,
                Fate::Pending | Fate::Refused => {}
            }
        }
        let last = windows.iter().rposition(Option::is_some).unwrap_or(0) as u64;
        let mut queue_area = self.queue_area(window_us.max(1), last, duration_us);
        let rows = windows
            .into_iter()
            .enumerate()
            .filter_map(|(k, r)| r.map(|r| (k as u64, r)))
            .map(|(w, mut r)| {
                r.accuracy = if r.on_time > 0 { r.accuracy / r.on_time as f64 } else { 0.0 };
                let mut l = std::mem::take(&mut latencies[w as usize]);
                let (p50, p99) = p50_p99_ms(&mut l);
                if !self.devices.is_empty() {
                    let from = w * window_us.max(1);
                    r.devices = self.mean_devices(from, from + window_us.max(1));
                    r.p99_ms = Some(p99);
                }
                r.p50_ms = (!l.is_empty()).then_some(p50);
                let m = mix[w as usize].take().unwrap_or_else(|| vec![0; self.model_names.len()]);
                r.mix = self.model_names.iter().cloned().zip(m).collect();
                r.queue = queue_area
                    .iter_mut()
                    .map(|q| std::mem::take(&mut q[w as usize]) / window_us.max(1) as f64)
                    .collect();
                r
            })
            .collect();
        (result, rows)
    }

    /// Per queue, per window `0..=last` of `window_us`: the time its requests spent
    /// in it there (µs), so that divided by the window it is the mean queue length.
    /// A request is in its queue from its arrival until a worker takes it or it is
    /// dropped (or the run's end, `end_us`, if neither happened). One pass, with a
    /// difference array for the windows a request waits through entirely.
    fn queue_area(&self, window_us: u64, last: u64, end_us: u64) -> Vec<Vec<f64>> {
        let n = last as usize + 1;
        let mut area = vec![vec![0.0; n]; self.queues];
        let mut full = vec![vec![0i64; n + 1]; self.queues];
        for (i, &q) in self.queue.iter().enumerate() {
            let Some(area) = area.get_mut(q as usize) else { continue };
            let a = self.arrivals[i];
            let b = self.taken[i].min(end_us.max(a));
            if b <= a {
                continue;
            }
            let (wa, wb) = ((a / window_us) as usize, ((b - 1) / window_us) as usize);
            if wa >= n {
                continue;
            }
            if wa == wb {
                area[wa] += (b - a) as f64;
                continue;
            }
            area[wa] += ((wa as u64 + 1) * window_us - a) as f64;
            if wb < n {
                area[wb] += (b - wb as u64 * window_us) as f64;
            }
            // Whole windows wa+1 ..= wb-1 (clipped to the last one).
            let full = &mut full[q as usize];
            full[wa + 1] += 1;
            full[wb.min(n)] -= 1;
        }
        for (area, full) in area.iter_mut().zip(&full) {
            let mut k = 0i64;
            for (w, a) in area.iter_mut().enumerate() {
                k += full[w];
                *a += k as f64 * window_us as f64;
            }
        }
        area
    }
}

/// No queue, no variant (a request this shard did not see, or not served).
const NONE: u16 = u16::MAX;

impl Stats {
    /// What a what-if replay reports: the median and p99 latency (ms) of the served
    /// requests, and per window of `window_us` (by arrival) its requests, on-time
    /// accuracy, violation rate, drops and latency percentiles.
    pub fn replay_summary(&self, window_us: u64) -> (f64, f64, Vec<sluice_core::whatif::SeriesPoint>) {
        let window_us = window_us.max(1);
        let mut all: Vec<u64> = Vec::with_capacity(self.fates.len());
        let mut series = Vec::new();
        let mut i = 0;
        // Requests are numbered in arrival order, so each window is one run of ids.
        while i < self.fates.len() {
            let w = self.arrivals[i] / window_us;
            let start = i;
            while i < self.fates.len() && self.arrivals[i] / window_us == w {
                i += 1;
            }
            let mut latencies: Vec<u64> = Vec::new();
            let (mut on_time, mut dropped, mut accuracy) = (0u64, 0u64, 0.0);
            for j in start..i {
                let f = self.fates[j];
                if served(f) {
                    latencies.push(self.latency_us[j]);
                }
                match f {
                    Fate::OnTime => {
                        on_time += 1;
                        accuracy += self.accuracy[j];
                    }
                    Fate::Dropped | Fate::Expired => dropped += 1,
                    _ => {}
                }
            }
            let n = (i - start) as u64;
            all.extend_from_slice(&latencies);
            let (p50_ms, p99_ms) = p50_p99_ms(&mut latencies);
            series.push(sluice_core::whatif::SeriesPoint {
                start_s: (w * window_us) as f64 / 1e6,
                requests: n,
                accuracy: if on_time > 0 { accuracy / on_time as f64 } else { 0.0 },
                violation_rate: (n - on_time) as f64 / n as f64,
                dropped,
                p50_ms,
                p99_ms,
            });
        }
        let (p50_ms, p99_ms) = p50_p99_ms(&mut all);
        (p50_ms, p99_ms, series)
    }
}

/// Index of the `q` quantile (nearest rank) among `n > 0` values.
fn rank(q: f64, n: usize) -> usize {
    ((q * n as f64).ceil() as usize).clamp(1, n) - 1
}

/// The median and 99th percentile (nearest rank) of latencies in µs, in ms (0 with
/// none). Selects rather than sorts: linear, where a replay's million latencies
/// took a sort each.
fn p50_p99_ms(latencies: &mut [u64]) -> (f64, f64) {
    if latencies.is_empty() {
        return (0.0, 0.0);
    }
    let (i50, i99) = (rank(0.50, latencies.len()), rank(0.99, latencies.len()));
    let p99 = *latencies.select_nth_unstable(i99).1;
    // Everything before `i99` is now at most the p99: the median is among them.
    let p50 = *latencies[..=i99].select_nth_unstable(i50).1;
    (p50 as f64 / 1000.0, p99 as f64 / 1000.0)
}

fn served(f: Fate) -> bool {
    matches!(f, Fate::OnTime | Fate::Late)
}

/// The 99th percentile (nearest rank) of latencies in µs, in ms; 0 with none.
fn p99_ms(latencies: impl Iterator<Item = u64>) -> f64 {
    let mut l: Vec<u64> = latencies.collect();
    p50_p99_ms(&mut l).1
}

/// (m, K) weakly-hard check.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct WeaklyHard {
    /// At most m misses...
    pub m: usize,
    /// ...in any K consecutive requests.
    pub k: usize,
    /// The most misses seen in any K consecutive requests.
    pub worst_misses_in_window: usize,
    /// Whether the constraint held.
    pub held: bool,
}

/// The deterministic result of one app in one run.
#[derive(Clone, Debug, Serialize)]
pub struct RunResult {
    /// Run index in the sweep.
    pub run: usize,
    /// App.
    pub app: String,
    /// Policy label.
    pub policy: String,
    /// Workers.
    pub workers: u32,
    /// Constant rate, when the arrivals have one.
    pub load_qps: Option<f64>,
    /// Trace file, when they come from one.
    pub trace: Option<String>,
    /// Seed.
    pub seed: u64,
    /// Requests that arrived.
    pub requests: u64,
    /// Served (on time or late).
    pub served: u64,
    /// Served by their deadline.
    pub on_time: u64,
    /// Served after it.
    pub late: u64,
    /// Dropped (policy or expired).
    pub dropped: u64,
    /// Drops by reason, written by label (`DropReason::as_str`) in results files.
    #[serde(serialize_with = "drops_by_label")]
    pub dropped_by_reason: BTreeMap<DropReason, u64>,
    /// Still queued or running when the run ended.
    pub unfinished: u64,
    /// Refused at admission, never queued (runs with `admission = true` only;
    /// they count as misses in `violation_rate`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<u64>,
    /// Of the requests admission would have refused, those `admission_audit`
    /// admitted anyway (runs that audit only; not counted in `refused`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audited: Option<u64>,
    /// Of `audited`, those served by their deadline: each a refusal that would
    /// have been false, so false refusals ≈ (`refused` + `audited`) × `audited_met`
    /// / `audited` (docs/simulator.md, "Admission").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audited_met: Option<u64>,
    /// Mean accuracy per satisfied (on-time) query, 0–1, in the experiment's
    /// `accounting`.
    pub accuracy: f64,
    /// Share of requests not served on time (late, dropped or unfinished), 0–1, in
    /// the experiment's `accounting`.
    pub violation_rate: f64,
    /// Which accounting `accuracy` and `violation_rate` follow.
    pub accounting: Accounting,
    /// `accuracy` as sluice counts it: over every request that arrived.
    pub sluice_accuracy: f64,
    /// `violation_rate` as sluice counts it: every request that arrived, the
    /// unfinished ones as misses.
    pub sluice_violation_rate: f64,
    /// Requests the reference accounting counts: taken by a worker or dropped
    /// before the simulated time ran out.
    pub reference_requests: u64,
    /// Accuracy per on-time query among `reference_requests`.
    pub reference_accuracy: f64,
    /// Share of `reference_requests` not served on time (the RAMSIS artifact's
    /// `calc_violation_rate`).
    pub reference_violation_rate: f64,
    /// Served per simulated second.
    pub throughput_qps: f64,
    /// Batches by size.
    pub batch_sizes: BTreeMap<usize, u64>,
    /// Requests served by model.
    pub model_mix: BTreeMap<String, u64>,
    /// Longest run of consecutive misses (arrival order).
    pub max_consecutive_misses: u64,
    /// Longest run of consecutive drops (arrival order).
    pub max_consecutive_drops: u64,
    /// The (m, K) check, when asked for.
    pub weakly_hard: Option<WeaklyHard>,
    /// Policy faults answered by the safe decision.
    pub faults: u64,
    /// `decide` calls.
    pub decide_calls: u64,
    /// Why the run stopped early, if it overloaded.
    pub overloaded: Option<String>,
    /// Re-plans the allocator made during the run (runs on `[[device]]`s only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replans: Option<usize>,
    /// p99 latency of the served requests, ms (runs on `[[device]]`s only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p99_latency_ms: Option<f64>,
    /// Devices hosting the app's variants, time-weighted mean over the run (runs on
    /// `[[device]]`s only: InfAdapter's cost, in cores).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mean_devices: Option<f64>,
    /// Mean accuracy of every served request, late ones included (runs on
    /// `[[device]]`s only: the accuracy a plan delivers, as InfAdapter counts it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub served_accuracy: Option<f64>,
    /// The app's most accurate variant's accuracy minus `served_accuracy`
    /// (InfAdapter's accuracy loss).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accuracy_loss: Option<f64>,
}

/// One time-series row.
#[derive(Clone, Debug, Default, Serialize)]
pub struct WindowRow {
    /// Run index.
    pub run: usize,
    /// App.
    pub app: String,
    /// Policy label.
    pub policy: String,
    /// Window start, seconds.
    pub window_start_s: f64,
    /// Arrivals in the window.
    pub arrivals: u64,
    /// Of those, served on time.
    pub on_time: u64,
    /// Served late.
    pub late: u64,
    /// Dropped.
    pub dropped: u64,
    /// Mean accuracy of the on-time ones.
    pub accuracy: f64,
    /// Runs on `[[device]]`s: p99 latency of the served ones, ms (`devices.csv`).
    pub p99_ms: Option<f64>,
    /// Runs on `[[device]]`s: devices hosting the app's variants, time-weighted.
    pub devices: Option<f64>,
    /// Median latency of the served ones, ms (None: none served): `windows.json`.
    pub p50_ms: Option<f64>,
    /// Of those arriving in the window, served per variant, in the app's variant
    /// order: `windows.json`.
    pub mix: Vec<(String, u64)>,
    /// Per queue (worker; one when the workers share one), its mean length over
    /// the window: `windows.json`.
    pub queue: Vec<f64>,
}

/// Wall-clock figures of one (run, app): `summary.json`.
#[derive(Clone, Debug, Serialize)]
pub struct Timing {
    /// Run index.
    pub run: usize,
    /// App.
    pub app: String,
    /// Policy label.
    pub policy: String,
    /// Workers.
    pub workers: u32,
    /// Constant rate, if any.
    pub load_qps: Option<f64>,
    /// Trace, if any.
    pub trace: Option<String>,
    /// Requests.
    pub requests: u64,
    /// Accuracy per satisfied query.
    pub accuracy: f64,
    /// Violation rate.
    pub violation_rate: f64,
    /// Dropped.
    pub dropped: u64,
    /// Wall time of the run (all its apps).
    pub wall_seconds: f64,
    /// Of which inside the policy's `decide`.
    pub wasm_seconds: f64,
    /// Simulated requests per wall second.
    pub simulated_requests_per_second: f64,
}

/// Writes results.json, results.csv, timeseries.csv, devices.csv (runs on
/// `[[device]]`s), windows.json (all deterministic) and summary.json.
///
/// `windows.json` holds what the dashboard's charts draw and timeseries.csv has
/// no column for (a new file, so the others stay byte-identical to earlier runs):
/// per (run, app), its variants and per window (by arrival) the served
/// requests' median latency, the variant mix and each queue's mean length.
pub fn write_outputs(dir: &Path, out: &super::ExperimentOutput) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let write = |name: &str, text: String| {
        std::fs::write(dir.join(name), text).with_context(|| format!("write {}/{name}", dir.display()))
    };
    write("results.json", serde_json::to_string_pretty(&out.results)? + "\n")?;
    write("summary.json", serde_json::to_string_pretty(&out.timing)? + "\n")?;
    let mut csv = String::from(
        "run,app,policy,workers,load_qps,trace,seed,requests,served,on_time,late,dropped,accuracy,violation_rate,throughput_qps,max_consecutive_misses,max_consecutive_drops,faults,overloaded\n",
    );
    for r in &out.results {
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{},{},{},{},{},{},{},{:.6},{:.6},{:.3},{},{},{},{}",
            r.run,
            csv_field(&r.app),
            csv_field(&r.policy),
            r.workers,
            r.load_qps.map(|l| l.to_string()).unwrap_or_default(),
            csv_field(r.trace.as_deref().unwrap_or_default()),
            r.seed,
            r.requests,
            r.served,
            r.on_time,
            r.late,
            r.dropped,
            r.accuracy,
            r.violation_rate,
            r.throughput_qps,
            r.max_consecutive_misses,
            r.max_consecutive_drops,
            r.faults,
            r.overloaded.is_some()
        );
    }
    write("results.csv", csv)?;
    let mut ts = String::from("run,app,policy,window_start_s,arrivals,on_time,late,dropped,accuracy\n");
    for w in &out.timeseries {
        let _ = writeln!(
            ts,
            "{},{},{},{:.3},{},{},{},{},{:.6}",
            w.run,
            csv_field(&w.app),
            csv_field(&w.policy),
            w.window_start_s,
            w.arrivals,
            w.on_time,
            w.late,
            w.dropped,
            w.accuracy
        );
    }
    write("timeseries.csv", ts)?;
    write("windows.json", windows_json(&out.timeseries)? + "\n")?;
    if out.timeseries.iter().any(|w| w.devices.is_some()) {
        // Runs on [[device]]s: what they used and their tail, per window.
        let mut dev = String::from("run,app,window_start_s,devices,p99_ms\n");
        for w in out.timeseries.iter().filter(|w| w.devices.is_some()) {
            let _ = writeln!(
                dev,
                "{},{},{:.3},{:.3},{:.3}",
                w.run,
                w.app,
                w.window_start_s,
                w.devices.unwrap_or(0.0),
                w.p99_ms.unwrap_or(0.0)
            );
        }
        write("devices.csv", dev)?;
    }
    Ok(())
}

/// `windows.json` (see [`write_outputs`]): one entry per (run, app), in the rows' order.
fn windows_json(rows: &[WindowRow]) -> Result<String> {
    // Four decimals: a queue length's mean to 1e-4 is finer than any chart.
    let round = |x: f64| (x * 1e4).round() / 1e4;
    let mut groups: Vec<serde_json::Value> = Vec::new();
    let mut i = 0;
    while i < rows.len() {
        let (run, app) = (rows[i].run, &rows[i].app);
        let start = i;
        while i < rows.len() && rows[i].run == run && &rows[i].app == app {
            i += 1;
        }
        let mine = &rows[start..i];
        let windows: Vec<serde_json::Value> = mine
            .iter()
            .map(|w| {
                serde_json::json!({
                    "start_s": w.window_start_s,
                    "p50_ms": w.p50_ms.map(round),
                    "mix": w.mix.iter().map(|(_, n)| *n).collect::<Vec<u64>>(),
                    "queue": w.queue.iter().map(|q| round(*q)).collect::<Vec<f64>>(),
                })
            })
            .collect();
        groups.push(serde_json::json!({
            "run": run,
            "app": app,
            "policy": rows[start].policy,
            "models": rows[start].mix.iter().map(|(m, _)| m.as_str()).collect::<Vec<&str>>(),
            "windows": windows,
        }));
    }
    Ok(serde_json::to_string(&groups)?)
}

/// A text field of a CSV line as RFC 4180 writes it: as is, or in double quotes (each
/// quote doubled) when it holds a comma, a quote or a line break, so a label such as
/// `Loki (artifact), headroom` stays one column for any CSV reader.
pub(crate) fn csv_field(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\"")).into()
    } else {
        s.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_csv_field_with_a_comma_or_quote_is_quoted() {
        assert_eq!(csv_field("Loki"), "Loki");
        assert_eq!(csv_field("Loki (artifact), headroom"), "\"Loki (artifact), headroom\"");
        assert_eq!(csv_field("a \"b\""), "\"a \"\"b\"\"\"");
    }

    #[test]
    fn selected_percentiles_are_the_sorted_nearest_ranks() {
        let mut rng = crate::rng::Rng::new(7);
        for n in [1usize, 2, 3, 99, 100, 101, 1000] {
            let mut v: Vec<u64> = (0..n).map(|_| (rng.uniform() * 1e6) as u64).collect();
            let mut sorted = v.clone();
            sorted.sort_unstable();
            let at = |q: f64| sorted[rank(q, n)] as f64 / 1000.0;
            assert_eq!(p50_p99_ms(&mut v), (at(0.50), at(0.99)), "n = {n}");
        }
        assert_eq!(p50_p99_ms(&mut []), (0.0, 0.0));
        // Nearest rank: of 1..=100, the 50th and the 99th.
        let mut v: Vec<u64> = (1..=100).rev().map(|x| x * 1000).collect();
        assert_eq!(p50_p99_ms(&mut v), (50.0, 99.0));
    }
}
