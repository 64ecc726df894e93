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
/// and those that may arrive before it starts, up to `batch`: as many as a Poisson
/// stream of `arrivals_per_us` brings in the wait at its [`ARRIVAL_QUANTILE`]
/// ([`arrivals_at_quantile`]). A policy that takes what is queued at once fills
/// its batch with later arrivals (under overload, a full batch: in pairs, the
/// first of a pair finishes with its partner). Counting only the expected number
/// (the mean, rounded) predicted a request 40 ms behind a running pair of
/// jellyfish's Inception at 12 req/s per worker alone (0.48 arrivals, rounded to
/// none), and it finished 83 ms later with the partner that came one time in
/// three; that error made the margin of every shallow request, which refused the
/// requests whose batch was already full and then made their deadline
/// (BENCHMARKS §12). Alone at an idle worker it runs at once, alone.
pub fn predict_us(
    running_model: &sdk::Model,
    model: &sdk::Model,
    slowdown: f64,
    (running, elapsed): (usize, u64),
    queued: usize,
    batch: u32,
    arrivals_per_us: f64,
) -> f64 {
    let left = running_left_us(running_model, slowdown, (running, elapsed));
    if running == 0 && queued == 0 {
        return scaled_latency(model, 1, slowdown);
    }
    let b = u64::from(model.max_batch().min(batch).max(1));
    let n = queued as u64 + 1;
    let before = (n - 1) / b; // whole batches ahead of its own
    let start = left + before as f64 * scaled_latency(model, b, slowdown);
    own_batch_end_us(model, b, n - before * b, start, arrivals_per_us, slowdown)
}

/// `m`'s profiled latency for a batch of `b`, times the worker's `slowdown` (µs).
fn scaled_latency(m: &sdk::Model, b: u64, slowdown: f64) -> f64 {
    m.latency(u32::try_from(b).unwrap_or(u32::MAX)).unwrap_or(0) as f64 * slowdown
}

/// What is left of the running batch of `running` requests on `running_model`,
/// `elapsed` µs after it started (0 when none runs).
fn running_left_us(running_model: &sdk::Model, slowdown: f64, (running, elapsed): (usize, u64)) -> f64 {
    match running {
        0 => 0.0,
        size => {
            let size = (size as u64).min(u64::from(running_model.max_batch().max(1)));
            (scaled_latency(running_model, size, slowdown) - elapsed as f64).max(0.0)
        }
    }
}

/// When a request's own batch on `m` (of at most `b`) ends: it starts at `start`
/// with `known` requests queued for it (those ahead in it and itself), filled with
/// the arrivals until then at the [`ARRIVAL_QUANTILE`].
fn own_batch_end_us(m: &sdk::Model, b: u64, known: u64, start: f64, arrivals_per_us: f64, slowdown: f64) -> f64 {
    let more = arrivals_at_quantile(arrivals_per_us * start, b.saturating_sub(known));
    start + scaled_latency(m, known.saturating_add(more).min(b), slowdown)
}

/// The deepest queue [`predict_worst_us`] follows batch by batch (a stack array
/// of this many start times); past it, each choice is predicted on its own and the
/// latest counts. Admission refuses long before: a queue this deep is 64 batches.
pub const MAX_DEPTH: usize = 64;

/// As [`predict_us`], for a policy that may form each batch with any of `choices`
/// (model, batch size): the latest finish over every sequence of choices, one per
/// batch, the request's own batch filled as in [`predict_us`].
///
/// A policy that picks its model by load decides each batch from the rate it sees
/// then, and the rate moves while a request waits: jellyfish at 70 % of its
/// capacity served the request ahead with ResNet-50 alone and then this one in an
/// Inception pair (104 + 164 ms), later than either model throughout predicted
/// (208 or 164 ms); that 60 ms, one answer in twenty two deep, was the margin
/// that refused every request four deep (BENCHMARKS §12).
///
/// The latest start of each decision is found once per depth (a decision that
/// starts later never finishes the request sooner), so this costs the depth times
/// the choices.
pub fn predict_worst_us(
    running_model: &sdk::Model,
    choices: &[(&sdk::Model, u32)],
    slowdown: f64,
    (running, elapsed): (usize, u64),
    queued: usize,
    arrivals_per_us: f64,
) -> f64 {
    let each = || {
        choices
            .iter()
            .map(|&(m, b)| predict_us(running_model, m, slowdown, (running, elapsed), queued, b, arrivals_per_us))
    };
    if choices.len() <= 1 || queued >= MAX_DEPTH {
        return each().fold(0.0, f64::max);
    }
    let left = running_left_us(running_model, slowdown, (running, elapsed));
    // starts[k]: the latest time a decision finds `k` of those ahead still queued.
    let mut starts = [f64::NEG_INFINITY; MAX_DEPTH];
    starts[queued] = left;
    let mut worst: f64 = 0.0;
    for k in (0..=queued).rev() {
        let start = starts[k];
        if start == f64::NEG_INFINITY {
            continue;
        }
        for &(m, batch) in choices {
            let b = m.max_batch().min(batch).max(1) as usize;
            if b > k {
                // Its own batch: the k ahead, itself, and what may arrive meanwhile.
                worst = worst.max(own_batch_end_us(m, b as u64, k as u64 + 1, start, arrivals_per_us, slowdown));
            } else {
                starts[k - b] = starts[k - b].max(start + scaled_latency(m, b as u64, slowdown));
            }
        }
    }
    worst
}

/// The quantile of a Poisson count of arrivals that [`predict_us`] fills a
/// request's batch with: the batch holds fewer than that count in at least 99 of
/// 100 waits, the share of admitted requests admission lets finish later than
/// predicted by more than its margin ([`ERROR_QUANTILE`]).
pub const ARRIVAL_QUANTILE: f64 = 0.99;

/// The smallest `k` (at most `cap`) with at least [`ARRIVAL_QUANTILE`] of a
/// Poisson count of mean `mean` at or below `k`: how many arrivals a waiting
/// request's batch may gain. 0 for a mean of 0 (or not a number).
pub fn arrivals_at_quantile(mean: f64, cap: u64) -> u64 {
    if mean.is_nan() || mean <= 0.0 {
        return 0;
    }
    // P(N = 0) underflows past a mean of ~745; long before that the batch is full.
    if mean > 700.0 {
        return cap;
    }
    let (mut k, mut p) = (0, (-mean).exp());
    let mut below = p;
    while below < ARRIVAL_QUANTILE && k < cap {
        k += 1;
        p *= mean / k as f64;
        below += p;
    }
    k
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
/// ([`load_bucket`], [`nearby_buckets`]): right for a policy that picks its model and batch by load,
/// as jellyfish does from the `load_qps` the host gives it. Under a burst it
/// changes from ResNet-50 one by one to Inception in pairs (164 ms a pair, 60 ms
/// more than the single ResNet-50 the last batch predicted), so the last model's
/// prediction for a request admitted in the burst was off by 60 ms one answer in
/// five, and its margin refused deep requests that then made their deadline.
pub const BY_LOAD: usize = 2;

/// The buckets whose choices [`BY_LOAD`] predicts with for an arrival rate in
/// `bucket`: that one and the two beside it (about ±19 % each), the latest finish
/// counting. The rate a policy sees when it forms the request's batch is a later
/// estimate than admission's (jellyfish's, over the host's 500 ms window, counts 9
/// ± 3 arrivals at 18 req/s), so near a rate where the policy changes its choice
/// either may serve the request: at 70 % of jellyfish's capacity the rate sits on
/// its switch from ResNet-50 one by one to Inception in pairs, and requests
/// predicted with one bucket's ResNet-50 finished 60 ms later in an Inception pair
/// one time in twelve, a margin that then refused every request three deep
/// (BENCHMARKS §12).
pub fn nearby_buckets(bucket: usize) -> std::ops::RangeInclusive<usize> {
    bucket.saturating_sub(1)..=(bucket + 1).min(LOAD_BUCKETS - 1)
}

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
pub const BANDS: usize = 7;

/// The band of a request with `ahead` requests before it on its worker: the
/// depth itself up to 3, then its bit length (0; 1; 2; 3; 4–7; 8–15; 16 and more).
///
/// Errors depend on the depth: a request predicted alone at an idle worker is
/// late when the policy pairs it with a later arrival (jellyfish under load: 60–83
/// ms, one answer in five), while one three deep is predicted in the full batches
/// it will be served in and is rarely off by more than the executor's jitter. One
/// margin for all took the shallow requests' 99th percentile (61 ms) and refused
/// deep ones that then made their deadline (BENCHMARKS §12). Two and three deep
/// apart for the same reason: behind jellyfish's pairs, two deep were 60 ms late
/// one answer in twenty-five (the policy chose its model for the next batch after
/// admission), three deep one in a hundred, and the band they shared refused the
/// three-deep ones near their deadline.
pub fn band(ahead: usize) -> usize {
    if ahead < 4 {
        return ahead;
    }
    ((usize::BITS - ahead.leading_zeros()) as usize + 1).min(BANDS - 1)
}

/// The fewest errors a band's margin is taken from: a band with fewer borrows
/// its deeper neighbours' errors, then its shallower ones'
/// ([`BandedErrors::margins`]).
pub const MIN_SAMPLES: usize = 100;

/// The errors of its own and deeper bands with which a band stops borrowing
/// shallower ones' ([`BandedErrors::margins`]): their largest error then covers
/// about 97 in 100 of its answers, while a shallower band's errors are another
/// kind. Requests four deep behind jellyfish's full Inception pairs were predicted
/// to the millisecond (55 answers, none more than 2 ms late), and the 60 ms they
/// borrowed from the band of two and three deep, where the policy's choice of
/// model for the next batch is still open, refused every one of them near its
/// deadline: three in four of the false refusals at 70 and 90 % of capacity
/// (BENCHMARKS §12).
pub const OWN_SAMPLES: usize = 32;

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
    /// deeper bands' until [`MIN_SAMPLES`] are in, then with the shallower ones'
    /// while fewer than [`OWN_SAMPLES`] are (or every band is). Deeper first: a
    /// sparse band sits where the queue is rarely that deep, and the requests that
    /// matter there are those near their deadline, whose errors the deeper bands
    /// hold; shallower ones' only to have a few errors at all; with fewer than
    /// [`MIN_SAMPLES`] in all, it is their largest error, as in
    /// [`PredictionErrors`].
    pub fn margins(&self) -> [u64; BANDS] {
        std::array::from_fn(|b| {
            // No allocation: this runs for every band and predictor per batch.
            let mut pooled: [&[i64]; BANDS] = [&[]; BANDS];
            let mut n = 0;
            for (slot, k) in pooled.iter_mut().zip((b..BANDS).chain((0..b).rev())) {
                if n >= MIN_SAMPLES || (k < b && n >= OWN_SAMPLES) {
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
        // Arrivals while it waits: 2 known, 10 µs of wait at 0.1/µs is a mean of 1,
        // whose 99th percentile (4) fills the batch.
        assert_eq!(predict_us(&gpu, &gpu, 1.0, (1, 0), 1, 4, 0.1), 10.0 + 15.0);
        // At 0.005/µs a mean of 0.05: one more arrives in 4.9 % of waits.
        assert_eq!(predict_us(&gpu, &gpu, 1.0, (1, 0), 1, 4, 0.005), 10.0 + 13.0);
        // At 0.0005/µs one more comes in 0.5 % of waits: the two known alone.
        assert_eq!(predict_us(&gpu, &gpu, 1.0, (1, 0), 1, 4, 0.0005), 10.0 + 11.0);
    }

    /// Inception on one CPU thread (the same profile): pairs pay a little.
    fn inception() -> sdk::Model {
        sdk::Model { id: 1, name: "inception_v1".into(), accuracy: 0.67, latency: vec![81, 164, 231, 299] }
    }

    #[test]
    fn one_choice_is_predicted_as_by_itself() {
        let (cpu, inc, gpu) = (cpu(), inception(), gpu());
        for (m, b) in [(&cpu, 1), (&inc, 2), (&gpu, 4), (&gpu, 3)] {
            for running in [(0, 0), (1, 30), (2, 100), (4, 5)] {
                for queued in [0, 1, 2, 3, 5, 8, 70] {
                    for rate in [0.0, 0.0005, 0.005, FLOOD] {
                        let one = predict_us(&cpu, m, 1.5, running, queued, b, rate);
                        let worst = predict_worst_us(&cpu, &[(m, b)], 1.5, running, queued, rate);
                        assert_eq!(worst, one, "{} b {b} {running:?} {queued} {rate}", m.name);
                        // The same choice twice changes nothing.
                        let twice = predict_worst_us(&cpu, &[(m, b), (m, b)], 1.5, running, queued, rate);
                        assert_eq!(twice, one, "{} b {b} {running:?} {queued} {rate}", m.name);
                    }
                }
            }
        }
    }

    #[test]
    fn a_policy_that_changes_its_choice_is_predicted_at_its_latest() {
        let (cpu, inc) = (cpu(), inception());
        let choices = [(&cpu, 1), (&inc, 2)];
        // Behind a ResNet-50 batch just finishing, one queued, this one: ResNet-50
        // for the one ahead, then this one in an Inception pair (104 + 164), later
        // than ResNet-50 throughout (208) or Inception throughout (164).
        assert_eq!(predict_us(&cpu, &cpu, 1.0, (1, 104), 1, 1, FLOOD), 208.0);
        assert_eq!(predict_us(&cpu, &inc, 1.0, (1, 104), 1, 2, FLOOD), 164.0);
        assert_eq!(predict_worst_us(&cpu, &choices, 1.0, (1, 104), 1, FLOOD), 104.0 + 164.0);
        // Alone at an idle worker: the slower model at batch 1.
        assert_eq!(predict_worst_us(&cpu, &choices, 1.0, (0, 0), 0, FLOOD), 104.0);
        // Three ahead: two ResNet-50 singles, then this one paired (2 · 104 + 164),
        // behind what is left of the running batch (24).
        assert_eq!(predict_worst_us(&cpu, &choices, 1.0, (1, 80), 2, FLOOD), 24.0 + 208.0 + 164.0);
        // Without arrivals its own batch holds only what is known.
        assert_eq!(predict_worst_us(&cpu, &choices, 1.0, (1, 80), 2, 0.0), 24.0 + 208.0 + 104.0);
        // Past the depth followed batch by batch: each choice alone, the latest.
        let deep = predict_worst_us(&cpu, &choices, 1.0, (0, 0), MAX_DEPTH, FLOOD);
        assert_eq!(deep, predict_us(&cpu, &cpu, 1.0, (0, 0), MAX_DEPTH, 1, FLOOD));
        assert_eq!(predict_worst_us(&cpu, &[], 1.0, (0, 0), 3, FLOOD), 0.0);
    }

    #[test]
    fn a_waiting_batch_is_filled_to_the_99th_percentile_of_arrivals() {
        assert_eq!(arrivals_at_quantile(0.0, 4), 0);
        assert_eq!(arrivals_at_quantile(f64::NAN, 4), 0);
        assert_eq!(arrivals_at_quantile(-1.0, 4), 0);
        // P(N = 0) = 0.995 at a mean of 0.005; 0.98 at 0.02.
        assert_eq!(arrivals_at_quantile(0.005, 4), 0);
        assert_eq!(arrivals_at_quantile(0.02, 4), 1);
        // jellyfish's partner: 40 ms behind a pair at 12 req/s per worker (mean
        // 0.48) may well come: the pair is predicted, where the rounded mean said
        // alone.
        assert_eq!(arrivals_at_quantile(0.48, 1), 1);
        // A mean of 1: P(N ≤ 3) = 0.981, P(N ≤ 4) = 0.996.
        assert_eq!(arrivals_at_quantile(1.0, 10), 4);
        assert_eq!(arrivals_at_quantile(1.0, 2), 2, "capped");
        assert_eq!(arrivals_at_quantile(1e9, 31), 31);
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
        assert_eq!(nearby_buckets(17), 16..=18);
        assert_eq!(nearby_buckets(0), 0..=1);
        assert_eq!(nearby_buckets(LOAD_BUCKETS - 1), LOAD_BUCKETS - 2..=LOAD_BUCKETS - 1);
    }

    #[test]
    fn the_band_is_the_depth_then_its_bit_length() {
        let bands: Vec<usize> = [0, 1, 2, 3, 4, 7, 8, 15, 16, 1000, usize::MAX].into_iter().map(band).collect();
        assert_eq!(bands, [0, 1, 2, 3, 4, 4, 5, 5, 6, 6, 6]);
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
        assert_eq!(m[BANDS - 1], 1_000);
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
        // A deep band with errors of its own keeps to them: 40 answers on time four
        // deep, the shallower band often 60 ms late.
        let mut e = BandedErrors::default();
        for i in 0..200 {
            e.record(2, if i % 5 == 0 { 60_000 } else { 0 });
        }
        for _ in 0..40 {
            e.record(3, 2_000);
        }
        assert_eq!(e.margins()[3], 2_000);
        // With fewer than OWN_SAMPLES it borrows them.
        let mut e = BandedErrors::default();
        for i in 0..200 {
            e.record(2, if i % 5 == 0 { 60_000 } else { 0 });
        }
        for _ in 0..10 {
            e.record(3, 2_000);
        }
        assert_eq!(e.margins()[3], 60_000);
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
