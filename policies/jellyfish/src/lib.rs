//! `jellyfish`: Jellyfish+, the load-granular model-selection baseline of RAMSIS
//! (EuroSys'24 §7, "Baseline MS&S Policies"; Jellyfish, RTSS'22).
//!
//! Start here: [`Jellyfish`] (the policy), [`Params`] (its `params` JSON) and
//! [`Jellyfish::choose`] (the selection rule, a pure function).
//!
//! Each worker assumes it receives `r = λ / K` requests per second (λ the app's
//! load, K its workers). For every loaded model it finds the largest batch
//! `b <= max_batch` whose throughput `b / L(b)` is at least `headroom · r` and
//! whose latency `L(b)` is at most SLO/2, and serves with the most accurate
//! model that has such a batch. When none has, it serves with the fastest loaded
//! model at the largest batch within SLO/2. Service is work-conserving: a free
//! worker takes up to `b` requests from the head of the queue at once and never
//! drops. Model choices therefore change only when the load does, which is what
//! RAMSIS contrasts itself with.

use serde::Deserialize;
use sluice_sdk::{helpers, log, Config, Decision, Level, Micros, Model, Policy, View};

/// The policy's parameters (all optional):
/// `{"load_qps": <f64>, "loads": [200, 400, ...], "headroom": 1.05, "max_batch": 32,
/// "overload_batch": "half-slo"}`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Params {
    /// A fixed app load λ in requests per second, instead of the host's
    /// estimate (`view.load_qps`); for experiments at a known load.
    pub load_qps: Option<f64>,
    /// Plan only for these loads: λ becomes the smallest of them at or above the
    /// estimate (the largest beyond them). The RAMSIS artifact runs Jellyfish+ on
    /// the Twitter trace from selectors built at 200, 400, …, 4000 req/s and picks
    /// one as it picks a RAMSIS policy (`simulator_script.py`, `DynamicPi`), so its
    /// λ is the estimate rounded *up* to that grid. Default: the estimate itself.
    pub loads: Option<Vec<f64>>,
    /// Throughput headroom: a model qualifies when `b / L(b) >= headroom · λ / K`.
    /// RAMSIS's Jellyfish+ uses 1.05; below 1 a worker is planned past
    /// saturation and queues grow without bound.
    pub headroom: f64,
    /// The largest batch considered (also capped by each model's profile).
    /// Jellyfish+ uses 32, the largest profiled size.
    pub max_batch: u32,
    /// The batch of the overload fallback (no model sustains the load).
    pub overload_batch: OverloadBatch,
}

impl Default for Params {
    fn default() -> Self {
        Params { load_qps: None, loads: None, headroom: 1.05, max_batch: 32, overload_batch: OverloadBatch::HalfSlo }
    }
}

/// How large a batch the fastest model serves when no model sustains the load.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum OverloadBatch {
    /// The largest batch within SLO/2 (at least 1): the selection rule's own
    /// bound, kept under overload.
    #[default]
    HalfSlo,
    /// `max_batch` (capped by the profile), as the RAMSIS artifact's
    /// `JellyfishInstPi` does when no model qualifies (`max_batch_size = N`,
    /// the lowest-latency model): the most throughput one worker has, served
    /// late when it must.
    Max,
}

/// A model with its batch sizes precomputed for the selection rule.
#[derive(Clone, Debug)]
struct Candidate {
    id: u32,
    accuracy: f64,
    /// Batch-1 latency, to find the fastest model for the fallback.
    fastest: Micros,
    /// The largest batch `<= max_batch` with `L(b) <= SLO/2`; 0 when none.
    within_half_slo: u32,
    /// The largest batch `<= max_batch` the profile has.
    largest: u32,
    /// `(throughput b / L(b) in requests/s, b)` for the sizes that can answer a
    /// "largest `b` with throughput >= x" query: scanning `b` downwards from
    /// `within_half_slo`, each size whose throughput beats every larger size's.
    /// Hence descending `b` and strictly increasing throughput, and the first
    /// entry with throughput >= x is the answer (see [`Candidate::batch_for`]).
    steps: Vec<(f64, u32)>,
}

impl Candidate {
    fn new(model: &Model, slo: Micros, max_batch: u32) -> Option<Self> {
        let fastest = model.latency(1)?;
        let cap = max_batch.min(model.max_batch());
        // L(b) <= SLO/2, written without rounding SLO/2 down.
        let fits = |b: u32| model.latency(b).is_some_and(|l| l.saturating_mul(2) <= slo);
        let within_half_slo = (1..=cap).rev().find(|&b| fits(b)).unwrap_or(0);
        let mut steps: Vec<(f64, u32)> = Vec::new();
        for b in (1..=within_half_slo).rev().filter(|&b| fits(b)) {
            let latency = model.latency(b).unwrap_or(u64::MAX) as f64;
            let throughput = f64::from(b) * 1e6 / latency; // b / L(b), L in seconds
            if steps.last().is_none_or(|&(best, _)| throughput > best) {
                steps.push((throughput, b));
            }
        }
        Some(Candidate { id: model.id, accuracy: model.accuracy, fastest, within_half_slo, largest: cap, steps })
    }

    /// The largest batch within SLO/2 whose throughput is at least `needed`.
    fn batch_for(&self, needed: f64) -> Option<u32> {
        self.steps.iter().find(|&&(throughput, _)| throughput >= needed).map(|&(_, b)| b)
    }
}

/// What [`Jellyfish::choose`] picked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice {
    /// The model id.
    pub model: u32,
    /// The largest batch a dispatch takes.
    pub batch: u32,
    /// Whether the model meets the throughput rule; `false` for the fallback
    /// (fastest model) when no loaded model does.
    pub sustains_load: bool,
}

/// Cache key: the inputs of [`Jellyfish::choose`] that come from the view.
#[derive(Debug, PartialEq)]
struct Key {
    lambda_bits: u64,
    workers: u32,
    loaded: Vec<u32>,
}

/// The Jellyfish+ policy for one worker.
#[derive(Debug)]
pub struct Jellyfish {
    params: Params,
    /// Models with a usable profile, most accurate first (ties: lower id).
    by_accuracy: Vec<Candidate>,
    /// The last selection and what it was computed from: the load estimate and
    /// the loaded set change far less often than `decide` is called.
    cached: Option<(Key, Option<Choice>)>,
}

impl Jellyfish {
    /// The selection for app load `lambda` (requests/s) over `workers` workers
    /// with the models `loaded` on this one; `None` when no loaded model has a
    /// latency profile.
    pub fn choose(&self, lambda: f64, workers: u32, loaded: &[u32]) -> Option<Choice> {
        let per_worker = lambda / f64::from(workers.max(1)); // r = λ / K
        let needed = self.params.headroom * per_worker;
        let loaded_candidates = self.by_accuracy.iter().filter(|c| helpers::is_loaded(loaded, c.id));
        // The most accurate model that sustains r with a batch within SLO/2.
        if let Some((c, batch)) = loaded_candidates.clone().find_map(|c| Some((c, c.batch_for(needed)?))) {
            return Some(Choice { model: c.id, batch, sustains_load: true });
        }
        // Overload: the fastest model, at the largest batch within SLO/2 (at least
        // 1) or at its largest batch, as `overload_batch` says.
        let c = loaded_candidates.min_by_key(|c| (c.fastest, c.id))?;
        let batch = match self.params.overload_batch {
            OverloadBatch::HalfSlo => c.within_half_slo.max(1),
            OverloadBatch::Max => c.largest.max(1),
        };
        Some(Choice { model: c.id, batch, sustains_load: false })
    }

    /// The current selection (after the last `decide`), for tests and logs.
    pub fn current(&self) -> Option<Choice> {
        self.cached.as_ref().and_then(|(_, choice)| *choice)
    }

    fn lambda(&self, view: &View) -> f64 {
        let lambda = self.params.load_qps.unwrap_or(view.load_qps);
        // A NaN or negative estimate means no usable load: plan for none.
        let lambda = if lambda >= 0.0 { lambda } else { 0.0 };
        match &self.params.loads {
            // `loads` is sorted and non-empty (checked in `init`).
            Some(loads) => loads.iter().copied().find(|&l| l >= lambda).unwrap_or(loads[loads.len() - 1]),
            None => lambda,
        }
    }
}

impl Policy for Jellyfish {
    // `observe` is the default no-op: the host need not call it after each batch.
    const OBSERVES: bool = false;

    fn init(config: Config) -> Result<Self, String> {
        let mut params: Params = config.params().map_err(|e| format!("jellyfish: {e}"))?;
        if let Some(loads) = &mut params.loads {
            if loads.is_empty() || loads.iter().any(|l| !(l.is_finite() && *l >= 0.0)) {
                return Err("jellyfish: param `loads` must be a non-empty list of non-negative numbers".into());
            }
            loads.sort_by(f64::total_cmp);
        }
        if !(params.headroom.is_finite() && params.headroom > 0.0) {
            return Err(format!("jellyfish: param `headroom` must be a positive number, got {}", params.headroom));
        }
        if params.max_batch == 0 {
            return Err("jellyfish: param `max_batch` must be at least 1".into());
        }
        if let Some(load) = params.load_qps {
            if !(load.is_finite() && load >= 0.0) {
                return Err(format!("jellyfish: param `load_qps` must be a non-negative number, got {load}"));
            }
        }
        let mut by_accuracy: Vec<Candidate> =
            config.models.iter().filter_map(|m| Candidate::new(m, config.slo, params.max_batch)).collect();
        if by_accuracy.is_empty() {
            return Err("jellyfish: no model has a latency profile".into());
        }
        by_accuracy.sort_by(|a, b| b.accuracy.total_cmp(&a.accuracy).then(a.id.cmp(&b.id)));
        Ok(Jellyfish { params, by_accuracy, cached: None })
    }

    fn decide(&mut self, view: &View) -> Decision {
        let lambda = self.lambda(view);
        let hit = matches!(&self.cached, Some((key, _))
            if key.lambda_bits == lambda.to_bits()
                && key.workers == view.workers
                && key.loaded == view.loaded);
        if !hit {
            let choice = self.choose(lambda, view.workers, &view.loaded);
            if choice != self.current() || self.cached.is_none() {
                let message = match choice {
                    Some(c) => {
                        format!(
                            "jellyfish: model {} batch {} at {lambda:.0} req/s over {} workers{}",
                            c.model,
                            c.batch,
                            view.workers,
                            if c.sustains_load { "" } else { " (overloaded: fastest model)" }
                        )
                    }
                    None => "jellyfish: no loaded model can serve".to_string(),
                };
                log(if choice.is_some() { Level::Debug } else { Level::Warn }, &message);
            }
            let key = Key { lambda_bits: lambda.to_bits(), workers: view.workers, loaded: view.loaded.clone() };
            self.cached = Some((key, choice));
        }
        match self.current() {
            Some(c) if !view.queue.is_empty() => {
                let batch = c.batch.min(u32::try_from(view.queue.len()).unwrap_or(u32::MAX));
                Decision::serve_head(c.model, batch)
            }
            _ => Decision::Idle,
        }
    }

    /// The current selection and the load it was made for.
    fn status(&self) -> String {
        match &self.cached {
            Some((key, Some(c))) => format!(
                r#"{{"model":{},"batch":{},"sustains_load":{},"load_qps":{:.1}}}"#,
                c.model,
                c.batch,
                c.sustains_load,
                f64::from_bits(key.lambda_bits)
            ),
            Some((key, None)) => format!(r#"{{"model":null,"load_qps":{:.1}}}"#, f64::from_bits(key.lambda_bits)),
            None => "{}".to_string(),
        }
    }
}

sluice_sdk::export_policy!(Jellyfish);

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sdk::testing::{config, linear_model, pending, take_logs, Harness};
    use sluice_sdk::Pending;

    const SLO: Micros = 100_000;

    /// `L(b) = base + step · (b - 1)` for `b` in `1..=max`, in milliseconds.
    fn linear(id: u32, accuracy: f64, base: u64, step: u64, max: u32) -> Model {
        linear_model(id, &format!("m{id}"), accuracy, base * 1000, step * 1000, max)
    }

    /// Within SLO/2 = 50 ms: m0 up to b = 7 (140 req/s), m1 up to 16 (400 req/s),
    /// m2 up to 32 (889 req/s).
    fn models() -> Vec<Model> {
        vec![linear(0, 0.80, 20, 5, 8), linear(1, 0.75, 10, 2, 16), linear(2, 0.60, 5, 1, 32)]
    }

    fn harness(params: &str) -> Harness<Jellyfish> {
        Harness::new(config(SLO, models(), params)).expect("init")
    }

    fn choice(model: u32, batch: u32, sustains_load: bool) -> Option<Choice> {
        Some(Choice { model, batch, sustains_load })
    }

    fn queue(n: u64) -> Vec<Pending> {
        (0..n).map(|i| pending(i, 0, SLO)).collect()
    }

    #[test]
    fn most_accurate_model_that_sustains_the_load() {
        let h = harness("");
        let j = h.policy();
        let all = [0, 1, 2];
        assert_eq!(j.choose(0.0, 1, &all), choice(0, 7, true));
        assert_eq!(j.choose(100.0, 1, &all), choice(0, 7, true)); // needs 105 <= 140
        assert_eq!(j.choose(200.0, 1, &all), choice(1, 16, true)); // 210 > 140
        assert_eq!(j.choose(500.0, 1, &all), choice(2, 32, true)); // 525 > 400
                                                                   // Overload: the fastest model at its largest batch within SLO/2.
        assert_eq!(j.choose(1000.0, 1, &all), choice(2, 32, false));
        // Only loaded models count.
        assert_eq!(j.choose(100.0, 1, &[1, 2]), choice(1, 16, true));
        assert_eq!(j.choose(1000.0, 1, &[0, 1]), choice(1, 16, false));
        assert_eq!(j.choose(100.0, 1, &[]), None);
    }

    #[test]
    fn load_is_split_over_workers_with_headroom() {
        let h = harness("");
        let j = h.policy();
        // r = 532 / 4 = 133, 1.05 r = 139.65 <= 140: m0 qualifies.
        assert_eq!(j.choose(532.0, 4, &[0, 1, 2]), choice(0, 7, true));
        // r = 136, 1.05 r = 142.8 > 140: it does not.
        assert_eq!(j.choose(544.0, 4, &[0, 1, 2]), choice(1, 16, true));
        // Without headroom 136 <= 140 qualifies again.
        let h = harness(r#"{"headroom": 1.0}"#);
        assert_eq!(h.policy().choose(544.0, 4, &[0, 1, 2]), choice(0, 7, true));
    }

    #[test]
    fn largest_batch_that_sustains_the_load_when_throughput_is_not_monotone() {
        // Throughput by batch size: 100, 50, 125, 20 req/s; all within SLO/2.
        let m = Model { id: 0, name: "odd".into(), accuracy: 0.9, latency: vec![10_000, 40_000, 24_000, 200_000] };
        let h = Harness::<Jellyfish>::new(config(1_000_000, vec![m], "")).expect("init");
        let j = h.policy();
        let batch = |needed: f64| j.choose(needed / 1.05, 1, &[0]).map(|c| c.batch);
        assert_eq!(batch(10.0), Some(4));
        assert_eq!(batch(30.0), Some(3));
        assert_eq!(batch(110.0), Some(3));
        // Nothing reaches 126 req/s: fallback, largest batch within SLO/2.
        assert_eq!(j.choose(126.0 / 1.05, 1, &[0]), choice(0, 4, false));
    }

    #[test]
    fn params_cap_the_batch_and_fix_the_load() {
        // Capped at 4: m0 gives 4 / 35 ms = 114 req/s >= 105.
        let mut h = harness(r#"{"max_batch": 4}"#);
        assert_eq!(h.policy().choose(100.0, 1, &[0, 1, 2]), choice(0, 4, true));
        let v = h.view(0, 100.0, queue(10));
        assert_eq!(h.decide(&v), Decision::serve(0, vec![0, 1, 2, 3]));
        // A fixed load overrides the host's estimate.
        let mut h = harness(r#"{"load_qps": 200}"#);
        let v = h.view(0, 1.0, queue(20));
        assert_eq!(h.decide(&v), Decision::serve_head(1, 16));
    }

    #[test]
    fn artifact_options_round_the_load_up_and_overload_at_the_largest_batch() {
        // On the grid 100, 200, 500 an estimate of 150 plans for 200, 50 for 100,
        // and one beyond the grid for its largest load.
        let mut h = harness(r#"{"loads": [500, 100, 200]}"#);
        for (estimate, expected) in [(150.0, (1, 16)), (50.0, (0, 7)), (9000.0, (2, 32))] {
            let v = h.view(0, estimate, queue(40));
            assert_eq!(h.decide(&v), Decision::serve_head(expected.0, expected.1), "estimate {estimate}");
        }
        // Overload: the fastest model at its largest profiled batch, not SLO/2's.
        let slow = vec![linear(0, 0.8, 40, 10, 8)];
        let mut h = Harness::<Jellyfish>::new(config(SLO, slow.clone(), r#"{"overload_batch": "max"}"#)).expect("init");
        assert_eq!(h.policy().choose(10_000.0, 1, &[0]), choice(0, 8, false));
        let v = h.view(0, 10_000.0, queue(20));
        assert_eq!(h.decide(&v), Decision::serve_head(0, 8));
        let h = Harness::<Jellyfish>::new(config(SLO, slow, "")).expect("init");
        assert_eq!(
            h.policy().choose(10_000.0, 1, &[0]),
            choice(0, 2, false),
            "L(2) = 50 ms is the largest within SLO/2"
        );
    }

    #[test]
    fn params_errors_name_the_parameter() {
        let err = |p: &str| Harness::<Jellyfish>::new(config(SLO, models(), p)).unwrap_err();
        assert!(err(r#"{"headrom": 1}"#).contains("headrom"));
        assert!(err(r#"{"headroom": 0}"#).contains("headroom"));
        assert!(err(r#"{"max_batch": 0}"#).contains("max_batch"));
        assert!(err(r#"{"load_qps": -1}"#).contains("load_qps"));
        assert!(err(r#"{"load_qps": "x"}"#).starts_with("jellyfish: invalid params"));
        assert!(err(r#"{"loads": []}"#).contains("loads"));
        assert!(err(r#"{"overload_batch": "all"}"#).contains("unknown variant `all`"));
    }

    #[test]
    fn dispatches_from_the_head_without_dropping() {
        let mut h = harness("");
        assert_eq!(h.decide(&h.view(0, 100.0, vec![])), Decision::Idle);
        // Fewer queued than b = 7: take them all.
        assert_eq!(h.decide(&h.view(0, 100.0, queue(3))), Decision::serve(0, vec![0, 1, 2]));
        // More: take b from the head, even if the head is already late.
        let v = h.view(500_000, 100.0, queue(12));
        let d = h.decide_checked(&v).expect("valid");
        assert_eq!(d, Decision::serve_head(0, 7));
        // Nothing loaded: idle.
        h.set_loaded(vec![]);
        assert_eq!(h.decide(&h.view(0, 100.0, queue(3))), Decision::Idle);
    }

    #[test]
    fn status_reports_the_current_choice() {
        let mut h = harness("");
        assert_eq!(h.policy().status(), "{}", "nothing chosen before the first decision");
        h.decide(&h.view(0, 100.0, queue(3)));
        assert_eq!(h.policy().status(), r#"{"model":0,"batch":7,"sustains_load":true,"load_qps":100.0}"#);
    }

    #[test]
    fn choice_is_cached_per_load_and_logged_when_it_changes() {
        let _ = take_logs();
        let mut h = harness("");
        for _ in 0..3 {
            h.decide(&h.view(0, 100.0, queue(1)));
        }
        assert_eq!(h.policy().current(), choice(0, 7, true));
        assert_eq!(take_logs().len(), 1);
        // A new load estimate: recomputed.
        let d = h.decide(&h.view(0, 1000.0, queue(40)));
        assert_eq!(d, Decision::serve_head(2, 32));
        assert_eq!(h.policy().current(), choice(2, 32, false));
        let logs = take_logs();
        assert_eq!(logs.len(), 1);
        assert!(logs[0].1.contains("overloaded"), "{logs:?}");
        // A new loaded set at the same load: recomputed too.
        h.set_loaded(vec![0, 1]);
        assert_eq!(h.decide(&h.view(0, 1000.0, queue(40))), Decision::serve_head(1, 16));
        // Same choice at a slightly different load: recomputed, not re-logged.
        let _ = take_logs();
        h.decide(&h.view(0, 1001.0, queue(40)));
        assert!(take_logs().is_empty());
    }

    #[test]
    fn replay_keeps_up_with_the_load_it_planned_for() {
        // 200 req/s for one second: m1 (b <= 16) keeps every deadline.
        let arrivals: Vec<Micros> = (0..200).map(|i| i * 5_000).collect();
        let r = harness("").replay(&arrivals, 200.0);
        assert_eq!((r.served, r.late, r.dropped, r.invalid), (200, 0, 0, 0));
        assert!(r.batches.iter().all(|&(m, _)| m == 1), "{:?}", r.batches);
        // Told the load is 10 req/s, it picks m0, which cannot keep up: batches
        // grow to its cap of 7 and some requests end up late.
        let r = harness("").replay(&arrivals, 10.0);
        assert!(r.batches.iter().all(|&(m, b)| m == 0 && b <= 7));
        assert!(r.late > 0, "{r:?}");
    }
}
