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

/// How many predictors admission runs, each with its own margin: [`LAST`],
/// [`FASTEST`] and [`BY_LOAD`].
pub const PREDICTORS: usize = sluice_core::queue::PREDICTORS;

/// The predictor that serves the queue with the worker's last model: right for a
/// policy that keeps its model (`fixed`; jellyfish at a steady load).
pub const LAST: usize = 0;

/// The predictor that serves the queue with the worker's fastest loaded model:
/// right for a policy that changes to a faster model as its queue or load grows.
pub const FASTEST: usize = 1;

/// The predictor that serves the queue with the model and batch size the policy
/// chose the last time the app's arrival rate was about what it is now
/// ([`load_bucket`]): right for a policy that picks its model and batch by load,
/// as jellyfish does from the `load_qps` the host gives it. Under a burst it
/// changes from ResNet-50 one by one to Inception in pairs (164 ms a pair, 60 ms
/// more than the single ResNet-50 the last batch predicted), so the last model's
/// prediction for a request admitted in the burst was off by 60 ms one answer in
/// five, and its margin refused deep requests that then made their deadline.
pub const BY_LOAD: usize = 2;

/// How many buckets of arrival rate [`BY_LOAD`] remembers a choice for.
pub const LOAD_BUCKETS: usize = 64;

/// The bucket of an arrival rate (req/s): ⌊4 · log2(rate + 1)⌋, steps of about
/// 19 %, the last from about 56,000 req/s up.
pub fn load_bucket(rate: f64) -> usize {
    let b = 4.0 * (rate.max(0.0) + 1.0).log2();
    (b as usize).min(LOAD_BUCKETS - 1)
}

/// A model and batch size packed for an atomic (0: none known).
pub fn pack_choice(model: u32, batch: u32) -> u64 {
    (u64::from(model) + 1) << 32 | u64::from(batch)
}

/// The model and batch size of [`pack_choice`], None for 0.
pub fn unpack_choice(packed: u64) -> Option<(u32, u32)> {
    let model = (packed >> 32).checked_sub(1)?;
    Some((model as u32, (packed & 0xFFFF_FFFF) as u32))
}

/// A prediction as admission judges it: the wait it counts (the prediction plus
/// its margin, µs) and the margin in it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Judged {
    /// The predicted wait plus `margin_us`.
    pub wait_us: f64,
    /// The margin of the predictor that gave it.
    pub margin_us: f64,
}

/// `judged` with the time from a batch's end to its answer leaving the server
/// (`edge_us`, a high quantile of recent answers) kept back: added to the wait and
/// to the margin. At most an eighth of the SLO, so a stall of the fronts (a
/// descheduled runtime) cannot make admission refuse everything.
pub fn keep_back_edge(judged: Judged, edge_us: u64, slo_us: u64) -> Judged {
    let edge = edge_us.min(slo_us / 8) as f64;
    Judged { wait_us: judged.wait_us + edge, margin_us: judged.margin_us + edge }
}

/// The wait admission counts for one request from each predictor's own prediction
/// and margin (the high quantile of its own recent errors): the soonest of
/// prediction plus margin, each predictor calibrated on its own. One margin for
/// the sooner of two predictions mixed their errors: with jellyfish serving lone
/// requests with ResNet-50 (103.6 ms) while the fastest model (Inception, 80.8 ms)
/// predicted them, every short prediction ran 20–85 ms late, the one margin sat at
/// its cap, and requests two or three deep that the last model predicted to the
/// millisecond were refused (BENCHMARKS §12).
///
/// A predictor whose margin reached `cap` is left out while another is below it:
/// its errors are larger than any margin admission may add, so it would admit
/// requests to finish late. When every margin is at the cap, the soonest counts
/// with the cap as margin (a margin near the SLO would refuse every request, so
/// no answer would ever come to bring it down).
pub fn judge(predicted: [f64; PREDICTORS], margins: [u64; PREDICTORS], cap: u64) -> Judged {
    let usable = |i: &usize| margins[*i] < cap;
    let any = (0..PREDICTORS).any(|i| usable(&i));
    (0..PREDICTORS)
        .filter(|i| !any || usable(i))
        .map(|i| {
            let margin_us = margins[i].min(cap) as f64;
            Judged { wait_us: predicted[i] + margin_us, margin_us }
        })
        .min_by(|a, b| a.wait_us.total_cmp(&b.wait_us))
        .unwrap_or(Judged { wait_us: 0.0, margin_us: 0.0 })
}

/// How many bands of depth admission keeps errors and margins for
/// ([`band`]).
pub const BANDS: usize = 6;

/// The band of a request with `ahead` requests before it on its worker: the bit
/// length of `ahead` (0; 1; 2–3; 4–7; 8–15; 16 and more).
///
/// Errors depend on the depth: a request predicted alone at an idle worker is
/// late when the policy pairs it with a later arrival (jellyfish under load: 60–83
/// ms, one answer in five), while one three deep is predicted in the full batches
/// it will be served in and is rarely off by more than the executor's jitter. One
/// margin for all took the shallow requests' 99th percentile (61 ms) and refused
/// deep ones that then made their deadline (BENCHMARKS §12).
pub fn band(ahead: usize) -> usize {
    ((usize::BITS - ahead.leading_zeros()) as usize).min(BANDS - 1)
}

/// The fewest errors a band's margin is taken from: a band with fewer borrows
/// its deeper neighbours' errors, then its shallower ones'
/// ([`BandedErrors::margins`]).
pub const MIN_SAMPLES: usize = 100;

/// Prediction errors kept per band of depth ([`band`]), and the margin each band
/// gets.
#[derive(Debug, Default)]
pub struct BandedErrors {
    bands: [PredictionErrors; BANDS],
}

impl BandedErrors {
    /// Records one answer's error in `band`.
    pub fn record(&mut self, band: usize, error: i64) {
        self.bands[band.min(BANDS - 1)].record([error]);
    }

    /// Each band's margin: the [`ERROR_QUANTILE`] of its errors, pooled with the
    /// deeper bands' and then the shallower ones' until [`MIN_SAMPLES`] are in
    /// (or every band is). Deeper first: a sparse band sits where the queue is
    /// rarely that deep, and the requests that matter there are those near their
    /// deadline, whose errors the deeper bands hold; with fewer than
    /// [`MIN_SAMPLES`] in all, it is their largest error, as in
    /// [`PredictionErrors`].
    pub fn margins(&self) -> [u64; BANDS] {
        std::array::from_fn(|b| {
            // No allocation: this runs for every band and predictor per batch.
            let mut pooled: [&[i64]; BANDS] = [&[]; BANDS];
            let mut n = 0;
            for (slot, k) in pooled.iter_mut().zip((b..BANDS).chain((0..b).rev())) {
                if n >= MIN_SAMPLES {
                    break;
                }
                *slot = &self.bands[k].sorted;
                n += slot.len();
            }
            top_quantile(&pooled, n)
        })
    }
}

/// The [`ERROR_QUANTILE`] of `n` values held in sorted slices, at least 0: the
/// m-th largest (m = n less the quantile's index), by popping the largest m
/// times. m is about 1 % of n.
fn top_quantile(sorted: &[&[i64]], n: usize) -> u64 {
    if n == 0 {
        return 0;
    }
    let k = quantile_index(n);
    let mut ends = [0; BANDS];
    for (end, s) in ends.iter_mut().zip(sorted) {
        *end = s.len();
    }
    let sorted = &sorted[..sorted.len().min(BANDS)];
    let mut value = 0;
    for _ in 0..n - k {
        let Some(at) = (0..sorted.len()).filter(|&i| ends[i] > 0).max_by_key(|&i| sorted[i][ends[i] - 1]) else {
            break;
        };
        ends[at] -= 1;
        value = sorted[at][ends[at]];
    }
    u64::try_from(value).unwrap_or(0)
}

/// The index of the [`ERROR_QUANTILE`] in `n` sorted values.
fn quantile_index(n: usize) -> usize {
    ((n as f64 * ERROR_QUANTILE).ceil() as usize).clamp(1, n) - 1
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
        u64::try_from(self.sorted[quantile_index(self.sorted.len())]).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answering_time_is_kept_back_up_to_an_eighth_of_the_slo() {
        let judged = Judged { wait_us: 300_000.0, margin_us: 10_000.0 };
        let kept = keep_back_edge(judged, 4_000, 400_000);
        assert_eq!((kept.wait_us, kept.margin_us), (304_000.0, 14_000.0));
        let capped = keep_back_edge(judged, 90_000, 400_000);
        assert_eq!((capped.wait_us, capped.margin_us), (350_000.0, 60_000.0));
    }

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
    fn each_predictor_is_judged_with_its_own_margin() {
        let cap = 100_000;
        // The last model's prediction is later but right; the fastest's earlier and
        // 60 ms late at its 99th percentile: the last one's counts.
        let j = judge([250_000.0, 200_000.0, 250_000.0], [2_000, 60_000, 2_000], cap);
        assert_eq!(j, Judged { wait_us: 252_000.0, margin_us: 2_000.0 });
        // The fastest model's is sooner once its margin is counted: it counts.
        let j = judge([300_000.0, 200_000.0, 300_000.0], [2_000, 60_000, 2_000], cap);
        assert_eq!(j, Judged { wait_us: 260_000.0, margin_us: 60_000.0 });
        // A margin at the cap leaves its predictor out, however soon it predicts.
        let j = judge([300_000.0, 100_000.0, 300_000.0], [2_000, 150_000, 2_000], cap);
        assert_eq!(j.wait_us, 302_000.0);
        // Every margin at the cap: the soonest, with the cap as margin.
        let j = judge([300_000.0, 100_000.0, 300_000.0], [120_000, 150_000, 120_000], cap);
        assert_eq!(j, Judged { wait_us: 200_000.0, margin_us: 100_000.0 });
    }

    #[test]
    fn load_buckets_are_steps_of_a_fifth() {
        assert_eq!(load_bucket(0.0), 0);
        assert_eq!(load_bucket(-3.0), 0);
        assert_eq!(load_bucket(f64::NAN), 0);
        // jellyfish's switch to its faster model at 23.6 req/s on two workers
        // falls between 18 and 26 req/s.
        assert!(load_bucket(18.0) < load_bucket(26.0));
        assert_eq!(load_bucket(1e12), LOAD_BUCKETS - 1);
        assert_eq!(unpack_choice(pack_choice(3, 4)), Some((3, 4)));
        assert_eq!(unpack_choice(pack_choice(0, 1)), Some((0, 1)));
        assert_eq!(unpack_choice(0), None);
    }

    #[test]
    fn the_band_is_the_bit_length_of_the_depth() {
        let bands: Vec<usize> = [0, 1, 2, 3, 4, 7, 8, 15, 16, 1000, usize::MAX].into_iter().map(band).collect();
        assert_eq!(bands, [0, 1, 2, 2, 3, 3, 4, 4, 5, 5, 5]);
    }

    #[test]
    fn each_band_gets_the_margin_of_its_own_errors() {
        let mut e = BandedErrors::default();
        // Shallow requests often late by 60 ms, deep ones on time.
        for i in 0..200 {
            e.record(0, if i % 5 == 0 { 60_000 } else { 0 });
            e.record(2, 1_000);
        }
        let m = e.margins();
        assert_eq!((m[0], m[2]), (60_000, 1_000));
        // Band 1 has none: it borrows the deeper bands' (2, then the rest: 200).
        assert_eq!(m[1], 1_000);
        // The deepest has none either, nor any deeper: it borrows band 4, 3 and 2.
        assert_eq!(m[5], 1_000);
        // A sparse band is pooled until 100: 10 of its own at 5 ms, 200 deeper at 1 ms.
        let mut e = BandedErrors::default();
        for _ in 0..10 {
            e.record(1, 5_000);
        }
        for _ in 0..200 {
            e.record(2, 1_000);
        }
        // 210 values, 10 at 5 ms: the 99th percentile (index 207) is one of them.
        assert_eq!(e.margins()[1], 5_000);
        // With no errors anywhere, no margin.
        assert_eq!(BandedErrors::default().margins(), [0; BANDS]);
    }

    #[test]
    fn pooled_quantiles_equal_a_plain_sort() {
        let mut x: u64 = 11;
        let mut next = || {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            ((x >> 33) % 10_000) as i64 - 2_000
        };
        for sizes in [[0, 3, 0], [50, 0, 70], [300, 200, 512], [1, 1, 1]] {
            let parts: Vec<Vec<i64>> = sizes
                .iter()
                .map(|&n| {
                    let mut v: Vec<i64> = (0..n).map(|_| next()).collect();
                    v.sort_unstable();
                    v
                })
                .collect();
            let mut all: Vec<i64> = parts.concat();
            all.sort_unstable();
            let slices: Vec<&[i64]> = parts.iter().map(|v| &v[..]).collect();
            let expected = all.get(quantile_index(all.len().max(1))).map_or(0, |&v| u64::try_from(v).unwrap_or(0));
            assert_eq!(top_quantile(&slices, all.len()), expected, "{sizes:?}");
        }
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
