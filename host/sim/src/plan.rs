//! Capacity planning: the fewest workers that meet an accuracy and an SLO-violation
//! target at a load (`sluice plan`, docs/capacity-planning.md).
//!
//! Start here: [`search`] (a bounded, monotone-checked search over worker counts for
//! any evaluator), [`EvaluationCache`] (the evaluator's cache, evaluating several counts
//! in parallel), [`SimPoint`] (an evaluator that simulates a policy at a constant
//! Poisson load, as `sluice sim` does), [`curve_workers`] (where to draw the
//! accuracy–workers curve).
//!
//! RAMSIS needs no simulation: its MDP gives the expected accuracy and violation of
//! a worker count directly (RAMSIS §5.1, "an offline search for resource
//! configurations"); `sluice plan` passes that as the evaluator. Every other policy
//! is simulated.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;
use std::sync::Mutex;

use crate::{run_experiment, Experiment};

/// What a plan must meet.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Targets {
    /// The least accuracy (averaged over the requests served on time).
    pub accuracy: f64,
    /// The largest fraction of requests that miss their deadline.
    pub violation: f64,
}

/// One evaluated worker count.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Point {
    /// Workers.
    pub workers: u32,
    /// Accuracy (expected or simulated).
    pub accuracy: f64,
    /// SLO-violation rate (expected or simulated).
    pub violation: f64,
}

impl Point {
    /// Whether this point meets `targets`.
    pub fn meets(&self, targets: &Targets) -> bool {
        self.accuracy >= targets.accuracy && self.violation <= targets.violation
    }
}

/// Why there is no plan.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// A target out of [0, 1].
    #[error("{name} target {value} is not in [0, 1]")]
    Target {
        /// Which: `accuracy` or `violation`.
        name: &'static str,
        /// The target given.
        value: f64,
    },
    /// No worker count up to the bound meets the targets.
    #[error(
        "targets unreachable: no count of workers up to {max_workers} gives accuracy ≥ {} with violation ≤ {}; \
         the best achievable is {}",
        .targets.accuracy,
        .targets.violation,
        describe_best(.best, .targets)
    )]
    Unreachable {
        /// The targets.
        targets: Targets,
        /// The bound searched up to.
        max_workers: u32,
        /// The most accurate point that meets the violation target, else the one with
        /// the least violation (None: nothing was evaluated).
        best: Option<Point>,
    },
    /// The evaluator failed.
    #[error("evaluating {workers} workers: {source}")]
    Evaluation {
        /// The worker count.
        workers: u32,
        /// Why: the evaluator's error.
        source: EvaluatorError,
    },
    /// The evaluator panicked (its thread's panic message went to stderr).
    #[error("evaluating {workers} workers: the evaluation panicked")]
    Panicked {
        /// The worker count.
        workers: u32,
    },
    /// The search did not settle within [`SearchOptions::max_evaluations`].
    #[error("no stable answer after {0} evaluations")]
    TooManyEvaluations(usize),
}

/// What an evaluator's error becomes ([`PlanError::Evaluation`]): any error type, or a
/// `String`, converts into it.
pub type EvaluatorError = Box<dyn std::error::Error + Send + Sync>;

fn describe_best(best: &Option<Point>, targets: &Targets) -> String {
    match best {
        None => "unknown (nothing was evaluated)".into(),
        Some(p) if p.violation <= targets.violation => format!(
            "accuracy {:.4} at violation {:.4} with {} workers (more workers do not raise it)",
            p.accuracy, p.violation, p.workers
        ),
        Some(p) => format!(
            "violation {:.4} (accuracy {:.4}) with {} workers: no count meets the violation target",
            p.violation, p.accuracy, p.workers
        ),
    }
}

/// Bounds of the search.
#[derive(Clone, Copy, Debug)]
pub struct SearchOptions {
    /// The least worker count worth trying (a count below it is known to miss the
    /// targets, e.g. [`capacity_lower_bound`]); at least 1.
    pub min_workers: u32,
    /// The most workers a plan may use; beyond it the targets are unreachable.
    pub max_workers: u32,
    /// Counts evaluated at once (threads); 1 evaluates one after the other.
    pub parallel: usize,
    /// The most evaluations: the search stops with an error past it, so a
    /// pathological evaluator cannot run forever.
    pub max_evaluations: usize,
}

impl Default for SearchOptions {
    fn default() -> Self {
        SearchOptions { min_workers: 1, max_workers: 1024, parallel: 1, max_evaluations: 64 }
    }
}

/// A finished search.
#[derive(Clone, Debug, Serialize)]
pub struct CapacityPlan {
    /// The answer: the fewest workers found that meet the targets, with one more
    /// also meeting them.
    pub workers: u32,
    /// The answer's evaluation.
    pub point: Point,
    /// Every count evaluated, in increasing order.
    pub evaluated: Vec<Point>,
    /// Pairs `(a, b)`, `a < b`, where `a` met the targets and `b` did not: the
    /// evaluator is not monotone there (noise, or a grid effect), and the answer is
    /// above `b`.
    pub non_monotone: Vec<(u32, u32)>,
}

/// The evaluator's results by worker count: each count is evaluated once, several
/// at a time.
pub struct EvaluationCache<F> {
    eval: F,
    parallel: usize,
    done: Mutex<BTreeMap<u32, Point>>,
}

impl<F, E> EvaluationCache<F>
where
    F: Fn(u32) -> Result<Point, E> + Sync,
    E: Into<EvaluatorError> + Send,
{
    /// Wraps `eval`, evaluating up to `parallel` counts at once.
    pub fn new(eval: F, parallel: usize) -> EvaluationCache<F> {
        EvaluationCache { eval, parallel: parallel.max(1), done: Mutex::new(BTreeMap::new()) }
    }

    /// Evaluates every count of `workers` not evaluated yet (in parallel) and returns
    /// their points in the order given.
    pub fn get(&self, workers: &[u32]) -> Result<Vec<Point>, PlanError> {
        let mut todo: Vec<u32> = workers.iter().copied().filter(|k| !self.lock().contains_key(k)).collect();
        todo.sort_unstable();
        todo.dedup();
        for chunk in todo.chunks(self.parallel) {
            let evaluated =
                |k: u32, r: Result<Point, E>| r.map_err(|e| PlanError::Evaluation { workers: k, source: e.into() });
            let results: Vec<(u32, Result<Point, PlanError>)> = if chunk.len() == 1 {
                vec![(chunk[0], evaluated(chunk[0], (self.eval)(chunk[0])))]
            } else {
                std::thread::scope(|s| {
                    let handles: Vec<_> = chunk.iter().map(|&k| (k, s.spawn(move || (self.eval)(k)))).collect();
                    handles
                        .into_iter()
                        .map(|(k, h)| match h.join() {
                            Ok(r) => (k, evaluated(k, r)),
                            Err(_) => (k, Err(PlanError::Panicked { workers: k })),
                        })
                        .collect()
                })
            };
            for (k, r) in results {
                let p = r?;
                self.lock().insert(k, Point { workers: k, ..p });
            }
        }
        let done = self.lock();
        Ok(workers.iter().map(|k| done[k]).collect())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u32, Point>> {
        // A panicking evaluation is reported as an error; the map stays consistent.
        self.done.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// One count.
    pub fn one(&self, workers: u32) -> Result<Point, PlanError> {
        Ok(self.get(&[workers])?[0])
    }

    /// Every point evaluated so far, in increasing worker order.
    pub fn points(&self) -> Vec<Point> {
        self.lock().values().copied().collect()
    }

    /// How many counts were evaluated.
    pub fn count(&self) -> usize {
        self.lock().len()
    }
}

/// The fewest workers in `[min_workers, max_workers]` that meet `targets`.
///
/// 1. Bracket: evaluate `min_workers`, then double (`parallel` counts per round)
///    until a count meets the targets or `max_workers` is passed.
/// 2. Narrow: between the last count that failed and the first that met them,
///    evaluate `parallel` evenly spaced counts per round (bisection when 1) until
///    they are neighbours.
/// 3. Check the neighbour: the answer `k` is kept only when `k + 1` meets the
///    targets too. Accuracy and violation are not guaranteed monotone in the
///    workers (a simulation's noise, the MDP's slack grid), so a met count just
///    above a failing one may be luck; when `k + 1` fails, the search resumes above
///    it and the pair is reported in [`CapacityPlan::non_monotone`].
///
/// Bounded: at most `max_evaluations` counts are evaluated.
pub fn search<F, E>(
    evals: &EvaluationCache<F>,
    targets: Targets,
    opts: SearchOptions,
) -> Result<CapacityPlan, PlanError>
where
    F: Fn(u32) -> Result<Point, E> + Sync,
    E: Into<EvaluatorError> + Send,
{
    for (name, value) in [("accuracy", targets.accuracy), ("violation", targets.violation)] {
        if !(value.is_finite() && (0.0..=1.0).contains(&value)) {
            return Err(PlanError::Target { name, value });
        }
    }
    let max = opts.max_workers.max(1);
    let min = opts.min_workers.clamp(1, max);
    let parallel = opts.parallel.max(1) as u32;
    let budget = |evals: &EvaluationCache<F>| -> Result<(), PlanError> {
        if evals.count() > opts.max_evaluations {
            return Err(PlanError::TooManyEvaluations(opts.max_evaluations));
        }
        Ok(())
    };
    let meets = |k: u32| -> Result<bool, PlanError> { Ok(evals.one(k)?.meets(&targets)) };
    let mut non_monotone = Vec::new();
    // `lo`: the highest count known (or assumed, below `min`) to fail.
    let mut lo = min - 1;
    loop {
        // 1. Bracket.
        let mut hi = None;
        let mut next = lo + 1;
        while hi.is_none() && next <= max {
            let round: Vec<u32> = (0..parallel)
                .scan(next, |k, _| {
                    let this = *k;
                    *k = k.saturating_mul(2).max(this + 1);
                    Some(this.min(max))
                })
                .collect::<std::collections::BTreeSet<u32>>()
                .into_iter()
                .collect();
            let points = evals.get(&round)?;
            budget(evals)?;
            match points.iter().find(|p| p.meets(&targets)) {
                Some(p) => hi = Some(p.workers),
                None => {
                    lo = *round.last().unwrap_or(&lo);
                    next = if lo >= max { max + 1 } else { lo.saturating_mul(2).min(max) };
                }
            }
        }
        let Some(mut hi) = hi else {
            return Err(unreachable(evals, targets, max));
        };
        // The failing counts below `hi` found during bracketing.
        if let Some(p) = evals.points().iter().rev().find(|p| p.workers < hi && !p.meets(&targets)) {
            lo = lo.max(p.workers);
        }
        // 2. Narrow.
        while hi - lo > 1 {
            let step = (hi - lo) as f64 / (parallel + 1) as f64;
            let mut probes: Vec<u32> = (1..=parallel).map(|i| lo + (step * i as f64).round() as u32).collect();
            probes.retain(|&k| k > lo && k < hi);
            probes.dedup();
            if probes.is_empty() {
                probes.push(lo + (hi - lo) / 2);
            }
            let points = evals.get(&probes)?;
            budget(evals)?;
            // The lowest met probe is the new `hi`; the highest failing probe below it, the new `lo`.
            if let Some(p) = points.iter().find(|p| p.meets(&targets)) {
                hi = p.workers;
            }
            if let Some(p) = points.iter().rev().find(|p| p.workers < hi && !p.meets(&targets)) {
                lo = lo.max(p.workers);
            }
        }
        // 3. The neighbour.
        if hi == max || meets(hi + 1)? {
            let evaluated = evals.points();
            for a in &evaluated {
                if a.meets(&targets) {
                    if let Some(b) = evaluated.iter().find(|b| b.workers > a.workers && !b.meets(&targets)) {
                        if !non_monotone.contains(&(a.workers, b.workers)) {
                            non_monotone.push((a.workers, b.workers));
                        }
                    }
                }
            }
            // Keep only the pairs the answer was searched above.
            non_monotone.retain(|&(_, b)| b < hi);
            return Ok(CapacityPlan { workers: hi, point: evals.one(hi)?, evaluated, non_monotone });
        }
        non_monotone.push((hi, hi + 1));
        budget(evals)?;
        lo = hi + 1;
        if lo >= max {
            return Err(unreachable(evals, targets, max));
        }
    }
}

fn unreachable<F, E>(evals: &EvaluationCache<F>, targets: Targets, max_workers: u32) -> PlanError
where
    F: Fn(u32) -> Result<Point, E> + Sync,
    E: Into<EvaluatorError> + Send,
{
    let points = evals.points();
    let within =
        points.iter().filter(|p| p.violation <= targets.violation).max_by(|a, b| a.accuracy.total_cmp(&b.accuracy));
    let best = within.or_else(|| points.iter().min_by(|a, b| a.violation.total_cmp(&b.violation))).copied();
    PlanError::Unreachable { targets, max_workers, best }
}

/// The fewest workers that can keep up with `load_qps` at all while missing at most
/// a fraction `violation` of it: `⌈λ (1 − v) / μ⌉`, with `μ` one worker's best
/// throughput within the SLO (`max_b b / l(b)` over models and batches with
/// `l(b) ≤ slo_us`). Below it the queues grow without bound, so the search starts
/// there. `latency_us[m][b − 1]` is model `m`'s latency at batch `b`.
pub fn capacity_lower_bound(latency_us: &[Vec<f64>], slo_us: f64, load_qps: f64, violation: f64) -> u32 {
    let per_worker_qps = latency_us
        .iter()
        .flat_map(|table| {
            table.iter().enumerate().filter(|(_, l)| **l > 0.0 && **l <= slo_us).map(|(b, l)| (b + 1) as f64 / l)
        })
        .fold(0.0, f64::max)
        * 1e6;
    if per_worker_qps <= 0.0 {
        return 1;
    }
    ((load_qps * (1.0 - violation.clamp(0.0, 1.0)) / per_worker_qps).ceil() as u32).max(1)
}

/// Where to draw the accuracy–workers curve: `points` counts from `from` to twice
/// the answer (at most `max`), evenly spaced, with the answer and its neighbours
/// among them.
pub fn curve_workers(from: u32, answer: u32, max: u32, points: usize) -> Vec<u32> {
    let to = answer.saturating_mul(2).min(max).max(from + 1);
    let n = points.max(2);
    let mut out: Vec<u32> =
        (0..n).map(|i| from + ((to - from) as f64 * i as f64 / (n - 1) as f64).round() as u32).collect();
    out.extend([answer.saturating_sub(1).max(from), answer, (answer + 1).min(max)]);
    out.sort_unstable();
    out.dedup();
    out
}

/// A policy simulated at a constant Poisson load (sluice's setting of the RAMSIS
/// experiments, `examples/experiments/ramsis-constant-sluice.toml`: round-robin
/// workers, the host's expiry, every request counted): one [`Point`] per count.
#[derive(Clone, Debug)]
pub struct SimPoint {
    /// The profile (absolute, or relative to the working directory).
    pub profile: PathBuf,
    /// Models of the profile (empty: all).
    pub models: Vec<String>,
    /// SLO, ms.
    pub slo_ms: f64,
    /// Load, requests/s.
    pub load_qps: f64,
    /// Simulated seconds.
    pub duration_s: f64,
    /// Arrivals and sampled latencies.
    pub seed: u64,
    /// Largest batch.
    pub max_batch: u32,
    /// Where built-in components are.
    pub builtin_dir: PathBuf,
    /// A built-in's name or a `.wasm` path.
    pub policy: String,
    /// The policy's params (a JSON object), or None.
    pub params: Option<serde_json::Value>,
}

impl SimPoint {
    /// Simulates `workers` workers; the run's accuracy and violation rate.
    pub fn evaluate(&self, workers: u32) -> anyhow::Result<Point> {
        let r = self.simulate(workers)?;
        Ok(Point { workers, accuracy: r.accuracy, violation: r.violation_rate })
    }

    /// Simulates `workers` workers; the whole result.
    pub fn simulate(&self, workers: u32) -> anyhow::Result<crate::stats::RunResult> {
        let cwd = std::env::current_dir()?;
        let text = self.experiment_text(workers, &cwd)?;
        let exp = Experiment::parse(&text, "sluice plan", &cwd)?;
        let out = run_experiment(&exp, &cwd, false)?;
        out.results.into_iter().next().ok_or_else(|| anyhow::anyhow!("the simulation produced no result"))
    }

    /// The experiment file this simulates `workers` with (TOML).
    pub fn experiment_text(&self, workers: u32, cwd: &Path) -> anyhow::Result<String> {
        use toml::Value;
        let abs = |p: &Path| if p.is_absolute() { p.to_path_buf() } else { cwd.join(p) };
        let mut app = toml::Table::new();
        app.insert("name".into(), Value::String("app".into()));
        app.insert("slo_ms".into(), Value::Float(self.slo_ms));
        app.insert("workers".into(), Value::Integer(workers.into()));
        app.insert("router".into(), Value::String("round-robin".into()));
        app.insert("profile".into(), Value::String(abs(&self.profile).display().to_string()));
        if !self.models.is_empty() {
            app.insert("models".into(), Value::Array(self.models.iter().cloned().map(Value::String).collect()));
        }
        app.insert("max_batch".into(), Value::Integer(self.max_batch.into()));
        let policy = if self.policy.ends_with(".wasm") {
            abs(Path::new(&self.policy)).display().to_string()
        } else {
            self.policy.clone()
        };
        app.insert("policy".into(), Value::String(policy));
        if let Some(params) = &self.params {
            let params = Value::try_from(params).map_err(|e| anyhow::anyhow!("params: {e}"))?;
            app.insert("params".into(), params);
        }
        let mut arrivals = toml::Table::new();
        arrivals.insert("kind".into(), Value::String("poisson".into()));
        arrivals.insert("rate_qps".into(), Value::Float(self.load_qps));
        app.insert("arrivals".into(), Value::Table(arrivals));
        let mut doc = toml::Table::new();
        doc.insert("version".into(), Value::Integer(1));
        doc.insert("name".into(), Value::String("plan".into()));
        doc.insert("seed".into(), Value::Integer(self.seed as i64));
        doc.insert("duration_s".into(), Value::Float(self.duration_s));
        doc.insert("builtin_policy_dir".into(), Value::String(abs(&self.builtin_dir).display().to_string()));
        doc.insert("app".into(), Value::Array(vec![Value::Table(app)]));
        Ok(toml::to_string(&doc)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets() -> Targets {
        Targets { accuracy: 0.8, violation: 0.01 }
    }

    /// A monotone curve: accuracy rises with workers.
    fn smooth(k: u32) -> Result<Point, String> {
        Ok(Point { workers: k, accuracy: 1.0 - 10.0 / (k as f64 + 10.0), violation: 0.0 })
    }

    #[test]
    fn finds_the_first_count_that_meets_the_targets() {
        // 1 − 10/(k+10) ≥ 0.8 ⇔ k ≥ 40.
        for parallel in [1, 2, 3] {
            let evals = EvaluationCache::new(smooth, parallel);
            let opts = SearchOptions { parallel, ..SearchOptions::default() };
            let plan = search(&evals, targets(), opts).unwrap();
            assert_eq!(plan.workers, 40, "parallel {parallel}");
            assert!(plan.evaluated.iter().any(|p| p.workers == 39 && !p.meets(&targets())));
            assert!(plan.evaluated.iter().any(|p| p.workers == 41 && p.meets(&targets())));
            assert!(plan.non_monotone.is_empty());
            assert!(evals.count() < 20, "{} evaluations", evals.count());
        }
    }

    #[test]
    fn a_lucky_count_whose_neighbour_fails_is_not_the_answer() {
        // 30 meets the targets by luck; 31 does not; from 45 on all do.
        let bumpy = |k: u32| -> Result<Point, String> {
            let accuracy = if k == 30 || k >= 45 { 0.85 } else { 0.7 };
            Ok(Point { workers: k, accuracy, violation: 0.0 })
        };
        let evals = EvaluationCache::new(bumpy, 1);
        let plan = search(&evals, targets(), SearchOptions { min_workers: 30, ..SearchOptions::default() }).unwrap();
        assert!(plan.workers >= 45, "{plan:?}");
        assert!(plan.non_monotone.contains(&(30, 31)), "{:?}", plan.non_monotone);
    }

    #[test]
    fn unreachable_targets_name_the_best_achievable() {
        let capped = |k: u32| -> Result<Point, String> {
            Ok(Point { workers: k, accuracy: 0.75 - 1.0 / k as f64, violation: 0.0 })
        };
        let evals = EvaluationCache::new(capped, 2);
        let e = search(&evals, targets(), SearchOptions { max_workers: 100, parallel: 2, ..Default::default() })
            .unwrap_err();
        let text = e.to_string();
        assert!(text.contains("unreachable") && text.contains("0.7400") && text.contains("100 workers"), "{text}");
        // Bounded: doubling reaches the bound in a few rounds.
        assert!(evals.count() <= 10);
    }

    #[test]
    fn a_failing_evaluator_is_named() {
        let evals = EvaluationCache::new(|_| Err("boom".to_string()), 1);
        let e = search(&evals, targets(), SearchOptions::default()).unwrap_err();
        assert_eq!(e.to_string(), "evaluating 1 workers: boom");
        assert!(matches!(e, PlanError::Evaluation { workers: 1, .. }), "{e:?}");
        let bad = search(&evals, Targets { accuracy: 1.5, violation: 0.0 }, SearchOptions::default()).unwrap_err();
        assert!(bad.to_string().contains("accuracy target 1.5"));
        let bad = search(&evals, Targets { accuracy: 0.5, violation: -1.0 }, SearchOptions::default()).unwrap_err();
        assert_eq!(bad.to_string(), "violation target -1 is not in [0, 1]");
        // A panicking evaluator names the count it was evaluating.
        let evals = EvaluationCache::new(
            |k: u32| -> Result<Point, String> {
                if k == 2 {
                    panic!("test")
                } else {
                    smooth(k)
                }
            },
            2,
        );
        let e = search(&evals, targets(), SearchOptions { parallel: 2, ..SearchOptions::default() }).unwrap_err();
        assert!(matches!(e, PlanError::Panicked { workers: 2 }), "{e:?}");
        // A search that does not settle says so, with no worker count.
        let evals = EvaluationCache::new(smooth, 1);
        let opts = SearchOptions { max_evaluations: 1, ..SearchOptions::default() };
        let e = search(&evals, targets(), opts).unwrap_err();
        assert_eq!(e.to_string(), "no stable answer after 1 evaluations");
    }

    #[test]
    fn capacity_bound_and_curve() {
        // 10 requests in 50 ms: 200 requests/s per worker.
        let tables = vec![vec![
            10_000.0, 20_000.0, 30_000.0, 40_000.0, 50_000.0, 60_000.0, 70_000.0, 80_000.0, 90_000.0, 50_000.0,
        ]];
        assert_eq!(capacity_lower_bound(&tables, 100_000.0, 2000.0, 0.0), 10);
        assert_eq!(capacity_lower_bound(&tables, 100_000.0, 2000.0, 0.5), 5);
        let w = curve_workers(10, 40, 1024, 8);
        assert_eq!(w.first(), Some(&10));
        assert_eq!(w.last(), Some(&80));
        assert!(w.contains(&39) && w.contains(&40) && w.contains(&41));
    }
}
