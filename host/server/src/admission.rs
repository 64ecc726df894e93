//! Admission's deadline prediction as pure functions (the state they read lives on
//! [`crate::app::WorkerHandle`] and [`crate::app::App`]).
//!
//! A request is admitted when the worker it is routed to is predicted to finish it
//! by its deadline: what is left of the running batch, then the requests ahead of
//! it and itself in batches of the size the worker's policy forms
//! ([`learned_batch`]), at the worker's measured slowdown over the profile
//! ([`predict_us`]), plus a margin: a high quantile of how late past answers
//! finished against their own prediction ([`PredictionErrors`]). The margin is what
//! the prediction cannot know: a policy that switches model or batch size with the
//! load (jellyfish), executor noise, scheduling.

use sluice_sdk as sdk;

/// The batch size admission assumes after a policy formed a batch of `size` with
/// `left` requests staying queued, having assumed `previous` before: `size` when
/// requests stayed queued (the policy chose that size), otherwise the larger of
/// the two (it took all there was, and might have taken more).
pub fn learned_batch(previous: u32, size: usize, left: usize) -> u32 {
    let size = u32::try_from(size).unwrap_or(u32::MAX).max(1);
    if left > 0 {
        size
    } else {
        size.max(previous)
    }
}

/// µs until a worker has served `queued` requests and one more with `model`:
/// `running` requests in a batch of `running_model` that started `elapsed` µs ago
/// (what is left of its profiled time), then the queue from its head in batches of
/// `batch` (at most the model's largest profiled batch), all at `slowdown` times
/// the profile.
///
/// The request's own batch holds the requests known to be in it (itself included)
/// and those expected to arrive before it starts, `arrivals_per_us` times the
/// wait, up to `batch`: a policy that takes what is queued at once fills its
/// batch with later arrivals (under overload, a full batch: in pairs, the first of
/// a pair finishes with its partner), while under light load the request is
/// served nearly alone. Alone at an idle worker it runs at once, alone.
pub fn predict_us(
    running_model: &sdk::Model,
    model: &sdk::Model,
    slowdown: f64,
    (running, elapsed): (usize, u64),
    queued: usize,
    batch: u32,
    arrivals_per_us: f64,
) -> f64 {
    let latency_of =
        |m: &sdk::Model, b: u64| m.latency(u32::try_from(b).unwrap_or(u32::MAX)).unwrap_or(0) as f64 * slowdown;
    let latency = |b: u64| latency_of(model, b);
    let left = match running {
        0 => 0.0,
        size => {
            let size = (size as u64).min(u64::from(running_model.max_batch().max(1)));
            (latency_of(running_model, size) - elapsed as f64).max(0.0)
        }
    };
    if running == 0 && queued == 0 {
        return latency(1);
    }
    let b = u64::from(model.max_batch().min(batch).max(1));
    let n = queued as u64 + 1;
    let before = (n - 1) / b; // whole batches ahead of its own
    let start = left + before as f64 * latency(b);
    let known = n - before * b;
    let expected = (arrivals_per_us.max(0.0) * start).round() as u64;
    start + latency(known.saturating_add(expected).min(b))
}

/// How many recent answers [`PredictionErrors`] keeps.
pub const ERROR_WINDOW: usize = 512;

/// The quantile of recent prediction errors admission adds as a margin: with it, at
/// most about 1 in 100 admitted requests finishes later than predicted by more than
/// the margin, which is the "p99 of accepted requests ≤ the SLO".
pub const ERROR_QUANTILE: f64 = 0.99;

/// The last [`ERROR_WINDOW`] prediction errors (answer time less the finish time
/// predicted at admission, µs; negative when early) and the margin they give.
/// Until 100 answers are in, the 99th percentile is their largest error: starting
/// from zeros instead (predictions assumed right) let jellyfish's first model
/// switches pass unnoticed and served late under overload (BENCHMARKS §7).
///
/// The window is kept twice: in arrival order (to know which error leaves) and
/// sorted (so the quantile is a lookup). A batch's answers cost a binary search
/// and a move of at most [`ERROR_WINDOW`] values each, where a selection over the
/// whole window per batch cost a copy and a partial sort under the app's lock,
/// once per request with zero-latency models (BENCHMARKS §3).
#[derive(Debug, Default)]
pub struct PredictionErrors {
    ring: Vec<i64>,
    next: usize,
    sorted: Vec<i64>,
}

impl PredictionErrors {
    /// Records the errors of one batch's answers and returns the margin: the
    /// [`ERROR_QUANTILE`] of the window, at least 0 (a prediction that runs
    /// early does not earn a negative margin).
    pub fn record(&mut self, errors: impl IntoIterator<Item = i64>) -> u64 {
        for e in errors {
            if self.ring.len() < ERROR_WINDOW {
                self.ring.push(e);
            } else {
                let old = std::mem::replace(&mut self.ring[self.next], e);
                // Present: every value in the ring is in the sorted copy.
                let at = self.sorted.partition_point(|&x| x < old);
                self.sorted.remove(at);
            }
            let at = self.sorted.partition_point(|&x| x < e);
            self.sorted.insert(at, e);
            self.next = (self.next + 1) % ERROR_WINDOW;
        }
        self.margin()
    }

    /// The current margin (µs).
    pub fn margin(&self) -> u64 {
        if self.sorted.is_empty() {
            return 0;
        }
        let k = ((self.sorted.len() as f64 * ERROR_QUANTILE).ceil() as usize).clamp(1, self.sorted.len()) - 1;
        u64::try_from(self.sorted[k]).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ResNet-50 on one CPU thread (profiles/imagenet-light-cpu.toml, p95, with
    /// batch 3 between 2 and 4): batching does not pay.
    fn cpu() -> sdk::Model {
        sdk::Model { id: 0, name: "resnet50".into(), accuracy: 0.76, latency: vec![104, 279, 385, 492] }
    }

    /// A GPU-like model: a batch of 4 costs 1.5 single requests.
    fn gpu() -> sdk::Model {
        sdk::Model { id: 0, name: "gpu".into(), accuracy: 0.76, latency: vec![10, 11, 13, 15] }
    }

    /// Arrivals per µs under overload: every batch fills.
    const FLOOD: f64 = 1.0;

    #[test]
    fn queued_requests_are_served_in_the_batches_the_policy_forms() {
        let (cpu, gpu) = (cpu(), gpu());
        // One by one (fixed on a CPU): 3 × 104 behind a batch just finishing.
        assert_eq!(predict_us(&cpu, &cpu, 1.0, (1, 104), 2, 1, FLOOD), 312.0);
        // In pairs (jellyfish's SLO/2 rule) under overload: the third waits for a
        // second pair, which fills.
        assert_eq!(predict_us(&cpu, &cpu, 1.0, (1, 104), 2, 2, FLOOD), 2.0 * 279.0);
        // Under light load the second pair holds only the third.
        assert_eq!(predict_us(&cpu, &cpu, 1.0, (1, 104), 2, 2, 0.0), 279.0 + 104.0);
        // Up to 4 on the GPU-like one: 9 in three batches; capped by the profile.
        assert_eq!(predict_us(&gpu, &gpu, 1.0, (1, 10), 8, 4, FLOOD), 45.0);
        assert_eq!(predict_us(&gpu, &gpu, 1.0, (1, 10), 8, 32, FLOOD), 45.0);
        // Arrivals expected while it waits: 2 known, 10 µs of wait at 0.1/µs → 1.
        assert_eq!(predict_us(&gpu, &gpu, 1.0, (1, 0), 1, 4, 0.1), 10.0 + 13.0);
    }

    #[test]
    fn the_queue_is_predicted_with_its_model_and_the_running_batch_with_its_own() {
        let (slow, fast) = (cpu(), gpu());
        // A slow batch 60 µs into its 104, then two queued and this one on the fast
        // model one by one: 44 + 3 × 10.
        assert_eq!(predict_us(&slow, &fast, 1.0, (1, 60), 2, 1, FLOOD), 44.0 + 30.0);
        // Idle: the request alone on the queue's model.
        assert_eq!(predict_us(&slow, &fast, 1.0, (0, 0), 0, 1, FLOOD), 10.0);
    }

    #[test]
    fn the_batch_size_follows_what_the_policy_chose() {
        // Took the whole queue: no sign of a smaller limit.
        assert_eq!(learned_batch(4, 1, 0), 4);
        // Took 1 of 3: the policy limits itself to 1.
        assert_eq!(learned_batch(4, 1, 2), 1);
        // Took all of 2: it batches at least that much.
        assert_eq!(learned_batch(1, 2, 0), 2);
        assert_eq!(learned_batch(2, 1, 0), 2);
        assert_eq!(learned_batch(2, 0, 3), 1, "never 0");
    }

    #[test]
    fn a_running_batch_counts_only_what_is_left_of_it() {
        let m = cpu();
        // Idle worker: the request alone, even for a policy that forms pairs.
        assert_eq!(predict_us(&m, &m, 1.0, (0, 0), 0, 1, FLOOD), 104.0);
        assert_eq!(predict_us(&m, &m, 1.0, (0, 0), 0, 2, FLOOD), 104.0);
        // A single request 60 µs into its 104: 44 left, then this one.
        assert_eq!(predict_us(&m, &m, 1.0, (1, 60), 0, 1, FLOOD), 148.0);
        // Overrunning its profile: nothing more is predicted for it.
        assert_eq!(predict_us(&m, &m, 1.0, (1, 500), 1, 1, FLOOD), 208.0);
        // At twice the profile, everything doubles (the elapsed time does not).
        assert_eq!(predict_us(&m, &m, 2.0, (1, 60), 0, 1, FLOOD), 2.0 * 104.0 - 60.0 + 208.0);
        // A running batch of 2, just started, then two queued and this one.
        assert_eq!(predict_us(&m, &m, 1.0, (2, 0), 2, 1, FLOOD), 279.0 + 312.0);
        // Behind a running batch, a policy that forms pairs pairs it with a later
        // arrival under overload.
        assert_eq!(predict_us(&m, &m, 1.0, (1, 0), 0, 2, FLOOD), 104.0 + 279.0);
    }

    #[test]
    fn the_margin_is_the_99th_percentile_of_recent_lateness() {
        let mut e = PredictionErrors::default();
        assert_eq!(e.margin(), 0);
        // Early answers give no margin.
        assert_eq!(e.record([-5_000, -1_000]), 0);
        // 3 late by 30 ms among 200: the 99th percentile is one of them (2 would
        // be the 1 % allowed past it).
        let mut errors = vec![0; 195];
        errors.extend([30_000; 3]);
        assert_eq!(e.record(errors), 30_000);
        // One outlier in a full window of 512 is past the 99th percentile.
        let mut e = PredictionErrors::default();
        e.record(std::iter::repeat_n(1_000, ERROR_WINDOW - 1).chain([90_000]));
        assert_eq!(e.margin(), 1_000);
        // The window forgets: 512 on-time answers later, the margin is back to 0.
        let mut e = PredictionErrors::default();
        e.record(std::iter::repeat_n(30_000, 10));
        assert_eq!(e.record(std::iter::repeat_n(0, ERROR_WINDOW)), 0);
    }

    #[test]
    fn the_sorted_window_gives_the_quantile_of_the_last_errors() {
        // Against a plain sort of the last ERROR_WINDOW values, through several
        // wrap-arounds, with repeated values and batches of different sizes.
        let mut e = PredictionErrors::default();
        let mut all = Vec::new();
        let mut x: u64 = 7;
        for batch in 0..700 {
            let errors: Vec<i64> = (0..1 + batch % 5)
                .map(|_| {
                    x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                    ((x >> 33) % 2_000) as i64 - 1_000
                })
                .collect();
            all.extend(&errors);
            let margin = e.record(errors);
            let mut last: Vec<i64> = all[all.len().saturating_sub(ERROR_WINDOW)..].to_vec();
            last.sort_unstable();
            let k = ((last.len() as f64 * ERROR_QUANTILE).ceil() as usize).clamp(1, last.len()) - 1;
            assert_eq!(margin, u64::try_from(last[k]).unwrap_or(0), "after batch {batch}");
        }
    }
}
