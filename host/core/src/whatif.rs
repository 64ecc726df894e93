//! The what-if seam: replaying a window of recorded arrivals through a simulator
//! with a policy that is not (yet) serving, to compare it with the one that is.
//!
//! The live host (`sluice-server`) records arrivals and runs evaluations, but it
//! must not depend on the simulator (`sluice-sim`); the simulator implements
//! [`Replayer`] and whoever starts the host hands it over (`sluice serve`, the
//! end-to-end tests) — the same shape as the [`crate::clock::Clock`] and
//! [`crate::executor::Executor`] seams. `sluice evaluate` runs the same replay
//! offline.
//!
//! Start here: [`ReplayJob`] (what is replayed: the app, its workers' models, the
//! arrivals, one policy), [`Replayer::replay`], [`ReplayResult`] (what one replay
//! measured) and [`Comparison`] (candidate against current, and the promotion
//! rule [`PromoteIf`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::app_config::AppConfig;
use crate::runtime::{CompiledPolicy, PolicyEngine};

/// One policy a replay runs.
#[derive(Clone, Debug)]
pub struct PolicyUnderTest {
    /// Its name (as bound or uploaded; `safe` for the host's built-in fallback).
    pub name: String,
    /// The compiled component (None: the safe policy, run natively).
    pub compiled: Option<Arc<CompiledPolicy>>,
    /// Its parameters, a JSON object.
    pub params: String,
}

/// What one replay runs: an app as it is configured and loaded, the arrivals of a
/// window, and one policy.
#[derive(Clone)]
pub struct ReplayJob {
    /// The app (SLO, workers, router, profile, models, limits). Its `policy`,
    /// `params` and `arrivals` are not used: [`ReplayJob::policy`] and
    /// [`ReplayJob::arrivals_us`] replace them.
    pub app: AppConfig,
    /// Per worker, the ids of the models it has loaded (None: every model, as the
    /// host starts).
    pub loaded: Option<Vec<Vec<u32>>>,
    /// Arrival times in µs from the start of the window, in order.
    pub arrivals_us: Arc<Vec<u64>>,
    /// Simulated time: every arrival is before it; queued requests are served after it.
    pub duration_us: u64,
    /// Width of the time series' windows, µs (a minute for the admin API).
    pub series_window_us: u64,
    /// The engine `policy.compiled` was compiled by (instances must come from it).
    pub engine: Arc<PolicyEngine>,
    /// The policy to replay.
    pub policy: PolicyUnderTest,
}

/// Cancellation and progress of a running replay, shared with whoever started it.
#[derive(Debug, Default)]
pub struct ReplayControl {
    /// Shared with the replay's policy bindings ([`ReplayControl::abort_flag`]).
    cancel: Arc<AtomicBool>,
    done: AtomicU64,
    total: AtomicU64,
}

impl ReplayControl {
    /// Asks the replay to stop; it returns [`ReplayError::Cancelled`] soon after.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Release);
    }

    /// Whether [`ReplayControl::cancel`] was called.
    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Acquire)
    }

    /// The flag [`ReplayControl::cancel`] sets, for the replay's policy bindings
    /// (`runtime::Binding::abort`): a policy call in progress stops at the next epoch
    /// tick instead of running out its budget.
    pub fn abort_flag(&self) -> Arc<AtomicBool> {
        self.cancel.clone()
    }

    /// The replay reports that `done` of `total` units of work are finished.
    pub fn report(&self, done: u64, total: u64) {
        self.total.store(total, Ordering::Relaxed);
        self.done.store(done, Ordering::Relaxed);
    }

    /// The share of the work done, 0–1 (0 before the first report).
    pub fn fraction(&self) -> f64 {
        let total = self.total.load(Ordering::Relaxed);
        if total == 0 {
            return 0.0;
        }
        (self.done.load(Ordering::Relaxed) as f64 / total as f64).clamp(0.0, 1.0)
    }
}

/// Why a replay gave no result.
#[derive(Debug, Error)]
pub enum ReplayError {
    /// [`ReplayControl::cancel`] was called.
    #[error("cancelled")]
    Cancelled,
    /// The replay could not be set up or run (the message names the cause).
    #[error("{0}")]
    Failed(String),
}

/// What one replay measured. Latency is from arrival to completion, of the
/// requests served (on time or late).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ReplayResult {
    /// The policy replayed.
    pub policy: String,
    /// Requests replayed.
    pub requests: u64,
    /// Served (on time or late).
    pub served: u64,
    /// Served by their deadline.
    pub on_time: u64,
    /// Dropped by the policy or expired by the host.
    pub dropped: u64,
    /// Refused at admission, never queued: a replay admits as the host does
    /// (`sluice_core::admission`), judging every recorded arrival again.
    #[serde(default)]
    pub refused: u64,
    /// Mean accuracy of the requests served on time, 0–1.
    pub accuracy: f64,
    /// Share of the requests not served on time (late, dropped, refused,
    /// unfinished), 0–1.
    pub violation_rate: f64,
    /// Median latency, ms.
    pub p50_ms: f64,
    /// 99th-percentile latency, ms.
    pub p99_ms: f64,
    /// Policy faults answered by the safe decision.
    pub faults: u64,
    /// Set when a queue outgrew the simulator's bound and the replay stopped early.
    pub overloaded: Option<String>,
    /// Per window of [`ReplayJob::series_window_us`] (by arrival time).
    pub series: Vec<SeriesPoint>,
}

/// One window of a replay's time series.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SeriesPoint {
    /// Window start, seconds from the start of the replay.
    pub start_s: f64,
    /// Requests that arrived in it.
    pub requests: u64,
    /// Mean accuracy of those served on time.
    pub accuracy: f64,
    /// Share of them not served on time.
    pub violation_rate: f64,
    /// Of them, dropped.
    pub dropped: u64,
    /// Median latency of those served, ms.
    pub p50_ms: f64,
    /// 99th-percentile latency of those served, ms.
    pub p99_ms: f64,
}

/// Replays a window of arrivals with a policy (the simulator implements it).
pub trait Replayer: Send + Sync {
    /// Runs `job` to the end on up to `threads` threads (more than one only where
    /// [`Replayer::splits`] says so), polling `control` to stop early and reporting
    /// progress into it. Blocking and CPU-bound: call it off the async threads.
    fn replay(&self, job: &ReplayJob, control: &ReplayControl, threads: usize) -> Result<ReplayResult, ReplayError>;

    /// Whether a replay of `job` can use more than one thread (with the same results).
    fn splits(&self, _job: &ReplayJob) -> bool {
        false
    }
}

/// When a candidate may replace the current policy: both must hold.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PromoteIf {
    /// The candidate's accuracy must exceed the current policy's by at least this
    /// (absolute, 0–1; 0 allows equal accuracy, a negative value a loss).
    pub accuracy_gain_min: f64,
    /// The candidate's violation rate must be at most this (0–1).
    pub violation_max: f64,
}

impl PromoteIf {
    /// Checks the values; the error names the field.
    pub fn validate(&self) -> Result<(), PromoteIfError> {
        if !(self.accuracy_gain_min.is_finite() && (-1.0..=1.0).contains(&self.accuracy_gain_min)) {
            return Err(PromoteIfError {
                field: "accuracy_gain_min",
                expected: "-1 to 1",
                got: self.accuracy_gain_min,
            });
        }
        if !(self.violation_max.is_finite() && (0.0..=1.0).contains(&self.violation_max)) {
            return Err(PromoteIfError { field: "violation_max", expected: "0 to 1", got: self.violation_max });
        }
        Ok(())
    }
}

/// A [`PromoteIf`] value out of its range ([`PromoteIf::validate`]); the message
/// names the field as the HTTP body spells it, and `field` lets the CLI name its flag.
#[derive(Clone, Copy, Debug, Error, PartialEq)]
#[error("promote_if.{field}: expected {expected}, got {got}")]
pub struct PromoteIfError {
    /// The field (`accuracy_gain_min`, `violation_max`).
    pub field: &'static str,
    /// Its range, in words.
    pub expected: &'static str,
    /// The value given.
    pub got: f64,
}

/// The candidate minus the current policy, for each figure.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Difference {
    /// Accuracy gain (positive: the candidate is more accurate).
    pub accuracy: f64,
    /// Violation-rate change (negative: the candidate violates less).
    pub violation_rate: f64,
    /// Change in dropped requests.
    pub dropped: i64,
    /// Change in median latency, ms.
    pub p50_ms: f64,
    /// Change in p99 latency, ms.
    pub p99_ms: f64,
    /// Per window: accuracy and violation-rate changes, window by window.
    pub series: Vec<SeriesDifference>,
}

/// One window of [`Difference::series`].
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SeriesDifference {
    /// Window start, seconds.
    pub start_s: f64,
    /// Accuracy gain.
    pub accuracy: f64,
    /// Violation-rate change.
    pub violation_rate: f64,
    /// p99 change, ms.
    pub p99_ms: f64,
}

/// A candidate's replay against the current policy's, over the same arrivals.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Comparison {
    /// The candidate's replay.
    pub candidate: ReplayResult,
    /// The current policy's replay.
    pub current: ReplayResult,
    /// Candidate minus current.
    pub difference: Difference,
}

impl Comparison {
    /// Compares two replays of the same arrivals.
    pub fn new(candidate: ReplayResult, current: ReplayResult) -> Comparison {
        let series = candidate
            .series
            .iter()
            .zip(&current.series)
            .map(|(c, k)| SeriesDifference {
                start_s: c.start_s,
                accuracy: c.accuracy - k.accuracy,
                violation_rate: c.violation_rate - k.violation_rate,
                p99_ms: c.p99_ms - k.p99_ms,
            })
            .collect();
        let difference = Difference {
            accuracy: candidate.accuracy - current.accuracy,
            violation_rate: candidate.violation_rate - current.violation_rate,
            dropped: candidate.dropped as i64 - current.dropped as i64,
            p50_ms: candidate.p50_ms - current.p50_ms,
            p99_ms: candidate.p99_ms - current.p99_ms,
            series,
        };
        Comparison { candidate, current, difference }
    }

    /// Whether `rule` allows promoting the candidate, and why (or why not), in words.
    pub fn verdict(&self, rule: &PromoteIf) -> (bool, String) {
        let (c, k) = (&self.candidate, &self.current);
        if let Some(o) = c.overloaded.as_ref().or(k.overloaded.as_ref()) {
            return (false, format!("not promoted: a replay overloaded the simulator ({o})"));
        }
        if c.faults > 0 {
            return (false, format!("not promoted: the candidate faulted {} times in the replay", c.faults));
        }
        let gain = c.accuracy - k.accuracy;
        let figures = format!(
            "accuracy {:.5} vs {:.5} (gain {gain:+.5}, required >= {}), violation rate {:.5} (required <= {})",
            c.accuracy, k.accuracy, rule.accuracy_gain_min, c.violation_rate, rule.violation_max
        );
        let gain_ok = gain >= rule.accuracy_gain_min;
        let violation_ok = c.violation_rate <= rule.violation_max;
        match (gain_ok, violation_ok) {
            (true, true) => (true, format!("promoted: {figures}")),
            (false, true) => (false, format!("not promoted: accuracy gain too small: {figures}")),
            (true, false) => (false, format!("not promoted: violation rate too high: {figures}")),
            (false, false) => {
                (false, format!("not promoted: accuracy gain too small and violation rate too high: {figures}"))
            }
        }
    }
}

/// Replays the same arrivals with the candidate (`controls[0]`) and the current
/// policy (`controls[1]`) and compares them. With `parallel`, two threads: where the
/// replayer can split both replays across them ([`Replayer::splits`]), one replay
/// after the other, each on both (the two cores stay busy to the end, where two
/// replays side by side leave one idle once the faster is done); otherwise the two
/// replays at once, one per thread. Without, one after the other on the calling
/// thread. Cancelling either control stops both.
pub fn compare(
    replayer: &dyn Replayer,
    candidate: &ReplayJob,
    current: &ReplayJob,
    controls: &[ReplayControl; 2],
    parallel: bool,
) -> Result<Comparison, ReplayError> {
    let split = parallel && replayer.splits(candidate) && replayer.splits(current);
    let (c, k) = if parallel && !split {
        std::thread::scope(|s| {
            let c = s.spawn(|| {
                let r = replayer.replay(candidate, &controls[0], 1);
                if r.is_err() {
                    controls[1].cancel();
                }
                r
            });
            let k = replayer.replay(current, &controls[1], 1);
            if k.is_err() {
                controls[0].cancel();
            }
            let c = c.join().unwrap_or_else(|_| Err(ReplayError::Failed("the candidate's replay panicked".into())));
            (c, k)
        })
    } else {
        let threads = if split { 2 } else { 1 };
        let c = replayer.replay(candidate, &controls[0], threads);
        let k = match &c {
            Ok(_) => replayer.replay(current, &controls[1], threads),
            Err(_) => Err(ReplayError::Cancelled),
        };
        (c, k)
    };
    // The candidate's own failure says more than the cancel it caused in the other.
    match (c, k) {
        (Ok(c), Ok(k)) => Ok(Comparison::new(c, k)),
        (Err(ReplayError::Failed(e)), _) => Err(ReplayError::Failed(format!("candidate: {e}"))),
        (_, Err(ReplayError::Failed(e))) => Err(ReplayError::Failed(format!("current policy: {e}"))),
        (Err(e), _) | (_, Err(e)) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(accuracy: f64, violation_rate: f64) -> ReplayResult {
        ReplayResult { accuracy, violation_rate, ..ReplayResult::default() }
    }

    #[test]
    fn the_verdict_needs_both_the_gain_and_the_violation_bound() {
        let rule = PromoteIf { accuracy_gain_min: 0.01, violation_max: 0.005 };
        let better = Comparison::new(result(0.80, 0.001), result(0.78, 0.002));
        assert!(better.verdict(&rule).0, "{}", better.verdict(&rule).1);
        assert!((better.difference.accuracy - 0.02).abs() < 1e-12);
        let worse = Comparison::new(result(0.77, 0.001), result(0.78, 0.002));
        let (ok, why) = worse.verdict(&rule);
        assert!(!ok && why.contains("accuracy gain too small"), "{why}");
        let violating = Comparison::new(result(0.90, 0.01), result(0.78, 0.002));
        let (ok, why) = violating.verdict(&rule);
        assert!(!ok && why.contains("violation rate too high"), "{why}");
        let mut overloaded = better.clone();
        overloaded.candidate.overloaded = Some("queue".into());
        assert!(!overloaded.verdict(&rule).0);
    }

    #[test]
    fn promote_if_is_checked() {
        assert!(PromoteIf { accuracy_gain_min: 0.0, violation_max: 0.01 }.validate().is_ok());
        let e = PromoteIf { accuracy_gain_min: f64::NAN, violation_max: 0.01 }.validate().unwrap_err();
        assert_eq!(e.field, "accuracy_gain_min");
        assert_eq!(e.to_string(), "promote_if.accuracy_gain_min: expected -1 to 1, got NaN");
        let e = PromoteIf { accuracy_gain_min: 0.0, violation_max: 2.0 }.validate().unwrap_err();
        assert_eq!(e.to_string(), "promote_if.violation_max: expected 0 to 1, got 2");
    }
}
