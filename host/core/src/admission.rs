//! Admission: whether a request can be served by its deadline, for the live host
//! and the simulator alike. The pure functions predict and judge; [`Admission`]
//! (one per app, with a [`WorkerAdmission`] per worker) is the state they read and
//! what learns it. Every method takes the time (µs on the app's clock: the wall
//! clock live, the virtual one in the simulator) and the worker's state (requests
//! queued and running) as arguments, so both drive the same code: the live app
//! (`sluice_server::app::App`) from its router and worker threads, the simulator's
//! engine (`sluice_sim::engine`) from its event loop. The state is atomics (and
//! two short locks for the error windows), so the live request path stays
//! lock-light; on the simulator's one thread they cost next to nothing.
//!
//! A request is admitted when the worker it is routed to is predicted to finish it
//! by its deadline: what is left of the running batch, then the requests ahead of
//! it and itself in batches of the size the worker's policy forms
//! ([`learned_batch`]), at the worker's measured slowdown over the profile
//! ([`predict_us`]), plus a margin: a high quantile of how late past answers
//! finished against their own prediction ([`PredictionErrors`]). The margin is what
//! the prediction cannot know: a policy that switches model or batch size with the
//! load (jellyfish), executor noise, scheduling.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use parking_lot::Mutex;
use sluice_sdk as sdk;

use crate::queue::Prediction;
use crate::router::LoadWindow;

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
pub fn predict_worst_us(
    running_model: &sdk::Model,
    choices: &[(&sdk::Model, u32)],
    slowdown: f64,
    running: (usize, u64),
    queued: usize,
    arrivals_per_us: f64,
) -> f64 {
    let each = |_: f64, visit: &mut dyn FnMut(&sdk::Model, u32)| {
        for &(m, b) in choices {
            visit(m, b);
        }
    };
    predict_worst_with(running_model, each, slowdown, running, queued, arrivals_per_us)
}

/// As [`predict_worst_us`], with the choices of each decision its own:
/// `choices_at(start, visit)` calls `visit` with every (model, batch size) the
/// policy may choose at a decision `start` µs from now ([`LoadForecast`]: the load
/// estimate it will read then). A decision soon after the arrival reads nearly the
/// estimate of now, one 300 ms later a window mostly of arrivals still to come.
///
/// The latest start of each decision is found once per depth (a decision that
/// starts later never finishes the request sooner), and its choices are those
/// at that start, so this costs the depth times the choices.
pub fn predict_worst_with(
    running_model: &sdk::Model,
    choices_at: impl Fn(f64, &mut dyn FnMut(&sdk::Model, u32)),
    slowdown: f64,
    (running, elapsed): (usize, u64),
    queued: usize,
    arrivals_per_us: f64,
) -> f64 {
    let left = running_left_us(running_model, slowdown, (running, elapsed));
    let mut worst: f64 = 0.0;
    if queued >= MAX_DEPTH {
        // Past the depth followed batch by batch: each choice alone, the latest.
        choices_at(left, &mut |m, b| {
            worst = worst.max(predict_us(running_model, m, slowdown, (running, elapsed), queued, b, arrivals_per_us));
        });
        return worst;
    }
    // starts[k]: the latest time a decision finds `k` of those ahead still queued.
    let mut starts = [f64::NEG_INFINITY; MAX_DEPTH];
    starts[queued] = left;
    for k in (0..=queued).rev() {
        let start = starts[k];
        if start == f64::NEG_INFINITY {
            continue;
        }
        choices_at(start, &mut |m, batch| {
            let b = m.max_batch().min(batch).max(1) as usize;
            if b > k {
                // Its own batch: the k ahead, itself, and what may arrive meanwhile.
                worst = worst.max(own_batch_end_us(m, b as u64, k as u64 + 1, start, arrivals_per_us, slowdown));
            } else {
                starts[k - b] = starts[k - b].max(start + scaled_latency(m, b as u64, slowdown));
            }
        });
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
pub const PREDICTORS: usize = crate::queue::PREDICTORS;

/// The predictor that serves the queue with the worker's last model: right for a
/// policy that keeps its model (`fixed`; jellyfish at a steady load).
pub const LAST: usize = 0;

/// The predictor that serves the queue with the model and batch size the policy
/// chose the last time it decided at each depth straight after a batch
/// ([`DEPTHS`]), its fastest loaded model (in the batches it formed with it)
/// at a depth where it has not: right for a policy that changes to a faster
/// model as its queue grows, or picks model and batch by queue length and
/// slack. RAMSIS does the second: alone at an idle worker with the whole SLO
/// it serves a slow, accurate model (EfficientNet-B4, 106 ms), and the request
/// that waited behind that batch with a fast one, so every other predictor
/// (the last model, the choice at this arrival rate, which is the last one
/// again at a steady rate) predicted a wait behind a running batch with the
/// slow model past the 150 ms SLO: a simulated RAMSIS at 2,000 req/s on 60
/// workers was refused 34 % of its arrivals, and with a tenth of the refusals
/// admitted anyway (`admission_audit = 0.1`) not one was late.
pub const FASTEST: usize = 1;

/// The depths of a queue (the requests it holds when the policy decides) whose
/// choice [`FASTEST`] remembers; deeper ones share the last.
pub const DEPTHS: usize = 33;

/// The most µs between a batch's end and the worker's next decision for that
/// decision to count as made straight after it ([`FASTEST`]): the head then
/// waited behind the batch. A decision at an idle worker is another kind (its
/// head just came, with the whole SLO ahead) and is not remembered.
pub const STRAIGHT_AFTER_US: u64 = 1_000;

/// The predictor that serves each batch ahead with the model and batch size the
/// policy chose the last times its load estimate was one that batch's decision
/// may read ([`LoadForecast`], [`load_bucket`]), the latest finish over them
/// counting ([`predict_worst_with`]): right for a policy that picks its model and
/// batch by load, as jellyfish does from the `load_qps` the host gives it. Under a
/// burst it changes from ResNet-50 one by one to Inception in pairs (164 ms a
/// pair, 60 ms more than the single ResNet-50 the last batch predicted), so the
/// last model's prediction for a request admitted in the burst was off by 60 ms
/// one answer in five, and its margin refused deep requests that then made their
/// deadline.
pub const BY_LOAD: usize = 2;

/// Buckets of [`load_bucket`] per doubling of the rate: steps of about 2 %, so
/// that each count of arrivals in the host's window (500 ms: steps of 2 req/s)
/// has a bucket of its own up to about 90 req/s, and a policy's switch from one
/// model to another falls between two buckets. With steps of 19 % (4 a doubling)
/// jellyfish's switch at 18.4 req/s sat in a bucket of 15–18 req/s beside one of
/// 18–22, and the ±1 bucket around admission's estimate missed choices the
/// policy made a few hundred ms later (BENCHMARKS §12).
pub const BUCKETS_PER_DOUBLING: f64 = 32.0;

/// How many buckets of arrival rate [`BY_LOAD`] remembers a choice for: 18
/// doublings, the last from about 260,000 req/s up.
pub const LOAD_BUCKETS: usize = 18 * BUCKETS_PER_DOUBLING as usize;

/// The bucket of an arrival rate (req/s): ⌊32 · log2(rate + 1)⌋
/// ([`BUCKETS_PER_DOUBLING`]), at most [`LOAD_BUCKETS`] − 1.
pub fn load_bucket(rate: f64) -> usize {
    let b = BUCKETS_PER_DOUBLING * (rate.max(0.0) + 1.0).log2();
    (b as usize).min(LOAD_BUCKETS - 1)
}

/// The load estimates a policy may read at a decision some time from now: the
/// host's estimate is the arrivals in a sliding window (`window_us`, 500 ms by
/// default) over its length, so at a decision `d` µs from now it counts the
/// arrivals known now that are still in the window then (exactly: their times are
/// known) and those still to come in the `d` µs (a Poisson count at the app's
/// rate). [`LoadForecast::range_at`] gives the estimates between that count's
/// 1st and 99th percentile ([`ARRIVAL_QUANTILE`]).
///
/// A decision soon after the arrival reads nearly today's estimate, while one
/// 300 ms on reads a window mostly of arrivals to come. Taking the bucket of the
/// estimate at admission and its two neighbours for every batch ahead was both
/// too narrow and too wide: at 70 % of jellyfish's capacity the estimate crosses
/// its switch (9 or 10 arrivals in 500 ms) batch to batch, requests two deep
/// predicted with ResNet-50 one by one finished 43–60 ms off when the policy, a
/// few hundred ms later, served Inception pairs, or the reverse, and those
/// errors, one answer in thirty, became the margin of every request that deep
/// (BENCHMARKS §12).
#[derive(Clone, Copy, Debug)]
pub struct LoadForecast<'a> {
    /// The arrival times in the window now, oldest first (µs on the app's clock).
    arrivals: &'a std::collections::VecDeque<u64>,
    /// The estimate's window, µs.
    window_us: u64,
    /// Now, µs on the app's clock.
    now: u64,
    /// The estimate now (req/s): the rate of arrivals to come.
    rate_qps: f64,
}

impl<'a> LoadForecast<'a> {
    /// A forecast from the `arrivals` in the estimate's window of `window_us`
    /// ending `now`, the estimate being `rate_qps`.
    pub fn new(
        arrivals: &'a std::collections::VecDeque<u64>,
        window_us: u64,
        now: u64,
        rate_qps: f64,
    ) -> LoadForecast<'a> {
        LoadForecast { arrivals, window_us: window_us.max(1), now, rate_qps }
    }

    /// The estimate now, req/s.
    pub fn rate_qps(&self) -> f64 {
        self.rate_qps
    }

    /// The lowest and highest estimate (req/s) a decision `after_us` µs from now
    /// may read: the arrivals known now still in the window then, plus the 1st and
    /// the 99th percentile of a Poisson count of those to come.
    pub fn range_at(&self, after_us: f64) -> (f64, f64) {
        let after = if after_us.is_finite() { after_us.max(0.0) as u64 } else { 0 };
        let at = self.now.saturating_add(after);
        // The host's rule (`LoadMonitor::rate`): an arrival at t counts while
        // t + window >= the time read.
        let known = self.arrivals.len() - self.arrivals.partition_point(|&t| t.saturating_add(self.window_us) < at);
        let mean = self.rate_qps.max(0.0) * after.min(self.window_us) as f64 / 1e6;
        let (low, high) = poisson_range(mean);
        let per = 1e6 / self.window_us as f64;
        ((known as u64 + low) as f64 * per, (known as u64 + high) as f64 * per)
    }
}

/// The 1st and 99th percentile ([`ARRIVAL_QUANTILE`]) of a Poisson count of mean
/// `mean`: the smallest k with at least 1 % (99 %) of the count at or below it.
/// Past a mean of 200 the normal approximation (the exact sum's terms underflow
/// long before they matter, and it costs a term per arrival).
pub fn poisson_range(mean: f64) -> (u64, u64) {
    if mean.is_nan() || mean <= 0.0 {
        return (0, 0);
    }
    if mean > 200.0 {
        // z of the 99th percentile.
        let spread = 2.326 * mean.sqrt();
        return ((mean - spread).floor().max(0.0) as u64, (mean + spread).ceil() as u64);
    }
    let (mut k, mut p) = (0u64, (-mean).exp());
    let mut below = p;
    let mut low = None;
    loop {
        if low.is_none() && below >= 1.0 - ARRIVAL_QUANTILE {
            low = Some(k);
        }
        // Bounded: rounding could leave the sum a hair below the quantile.
        if below >= ARRIVAL_QUANTILE || k > 1_000 {
            return (low.unwrap_or(k), k);
        }
        k += 1;
        p *= mean / k as f64;
        below += p;
    }
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
#[derive(Debug)]
pub struct BandedErrors {
    bands: [PredictionErrors; BANDS],
    /// The bands recorded into since [`BandedErrors::margins`] last worked them
    /// out (bit `b`: band `b`).
    dirty: u8,
    /// The margins last worked out, and per band the bands its margin pooled
    /// (bits): a margin none of whose pooled bands changed is the same, so only
    /// those are worked out again (the pooling stops at the same bands, whose
    /// sizes did not change). Per batch, for every predictor, this was most of a
    /// simulated replay's admission.
    margins: [u64; BANDS],
    pooled: [u8; BANDS],
}

impl Default for BandedErrors {
    fn default() -> BandedErrors {
        // Every band dirty: nothing was worked out yet.
        BandedErrors { bands: Default::default(), dirty: u8::MAX, margins: [0; BANDS], pooled: [0; BANDS] }
    }
}

impl BandedErrors {
    /// Records one answer's error in `band` at `now` (µs on the app's clock);
    /// [`BandedErrors::expire`] ages the bands.
    pub fn record(&mut self, band: usize, error: i64, now: u64) {
        let band = band.min(BANDS - 1);
        self.bands[band].insert(now, [error]);
        self.dirty |= 1 << band;
    }

    /// Lets the errors older than [`ERROR_AGE_US`] at `now` go, the oldest of
    /// every band first, while more than [`ERROR_AGE_FLOOR`] stay in the bands
    /// together, marking the bands that lost some for [`BandedErrors::margins`].
    ///
    /// The floor counts the bands together: a margin is taken from a band pooled
    /// with its neighbours until it has enough errors ([`MIN_SAMPLES`]), so a
    /// sparse band need not keep its own. Each band's own floor kept every error
    /// of a band that had fewer than 200 in all, however old: the deep bands below
    /// capacity (50–80 answers four deep in a 40 s phase at 90 % of jellyfish's
    /// capacity), where one answer 43 ms late, served alone as the load stepped
    /// up, set the largest error, and so the margin, of every request four deep
    /// for the rest of the run, and refused requests predicted to the millisecond
    /// to make their deadline (BENCHMARKS §12).
    pub fn expire(&mut self, now: u64) {
        let mut kept: usize = self.bands.iter().map(|b| b.ring.len()).sum();
        while kept > ERROR_AGE_FLOOR {
            let oldest =
                self.bands.iter().enumerate().filter_map(|(b, e)| Some((b, e.oldest()?))).min_by_key(|&(_, at)| at);
            match oldest {
                Some((b, at)) if now.saturating_sub(at) > ERROR_AGE_US => {
                    self.bands[b].pop_oldest();
                    self.dirty |= 1 << b;
                    kept -= 1;
                }
                _ => break,
            }
        }
    }

    /// Each band's margin: the [`ERROR_QUANTILE`] of its errors, pooled with the
    /// deeper bands' until [`MIN_SAMPLES`] are in, then with the shallower ones'
    /// while fewer than [`OWN_SAMPLES`] are (or every band is). Deeper first: a
    /// sparse band sits where the queue is rarely that deep, and the requests that
    /// matter there are those near their deadline, whose errors the deeper bands
    /// hold; shallower ones' only to have a few errors at all; with fewer than
    /// [`MIN_SAMPLES`] in all, it is their largest error, as in
    /// [`PredictionErrors`].
    pub fn margins(&mut self) -> [u64; BANDS] {
        for b in 0..BANDS {
            if self.pooled[b] & self.dirty == 0 && self.dirty != u8::MAX {
                continue;
            }
            // No allocation: this runs for every band and predictor per batch.
            let mut pooled: [&[i64]; BANDS] = [&[]; BANDS];
            let (mut n, mut which) = (0, 0u8);
            for (slot, k) in pooled.iter_mut().zip((b..BANDS).chain((0..b).rev())) {
                if n >= MIN_SAMPLES || (k < b && n >= OWN_SAMPLES) {
                    break;
                }
                *slot = &self.bands[k].sorted;
                n += slot.len();
                which |= 1 << k;
            }
            self.margins[b] = top_quantile(&pooled, n);
            self.pooled[b] = which;
        }
        self.dirty = 0;
        self.margins
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
    // One slice holding them all (a band with enough errors of its own, the
    // common case): the quantile is a lookup.
    let mut held = sorted.iter().filter(|s| !s.is_empty());
    if let (Some(one), None) = (held.next(), held.next()) {
        if one.len() == n {
            return u64::try_from(one[k]).unwrap_or(0);
        }
    }
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

/// The most recent answers [`PredictionErrors`] keeps, however young: a bound on
/// its memory and on the cost of a batch's errors at high rates.
pub const ERROR_WINDOW: usize = 512;

/// How long an error counts in a margin, µs on the app's clock (the wall clock
/// live, the virtual one in the simulator, so both age errors alike): an error
/// older than this leaves the window, as long as [`ERROR_AGE_FLOOR`] younger ones
/// stay.
///
/// With the window bounded by count alone, how long one stall held its margin
/// depended on the rate: after a 63 ms stall at 5× overload the margin of the
/// 429s rose to 64 ms and held for ~90 s, and at 1× a 500 ms stall kept goodput at
/// a third for ~60 s (BENCHMARKS §7), because the deep bands' 512 answers take
/// minutes to come. With 10 s a stall's margin is gone within 10 s wherever more
/// than [`ERROR_AGE_FLOOR`] answers came in them; at the simulator's and the
/// overload bench's higher rates [`ERROR_WINDOW`] binds first, as before.
pub const ERROR_AGE_US: u64 = 10_000_000;

/// The fewest errors a window keeps however old they are (a predictor's bands
/// together, [`BandedErrors::expire`]; the answering times' one window): ageing
/// never leaves a margin taken from fewer. Aged down to what 10 s held, a window
/// at the admission bench's low rates (9.7–24 req/s on two workers, BENCHMARKS §12) held
/// ~100–240 answers, fewer than 100 below ~10 req/s, and a margin became their
/// largest error: beside builds, `fixed` at 70 % was refused 14–19 times in 40 s
/// against 9 in every earlier run. With 200 the 99th percentile is the third
/// largest, so one late answer (a stall's) no longer sets the margin alone, and a
/// stall that made many late answers leaves with the next 200, not the next 512.
pub const ERROR_AGE_FLOOR: usize = 2 * MIN_SAMPLES;

/// The quantile of recent prediction errors admission adds as a margin: with it, at
/// most about 1 in 100 admitted requests finishes later than predicted by more than
/// the margin, which is the "p99 of accepted requests ≤ the SLO".
pub const ERROR_QUANTILE: f64 = 0.99;

/// The prediction errors (answer time less the finish time predicted at
/// admission, µs; negative when early) of at most the last [`ERROR_WINDOW`]
/// answers, those older than [`ERROR_AGE_US`] left out while more than
/// [`ERROR_AGE_FLOOR`] stay, and the margin they give.
/// Until 100 answers are in, the 99th percentile is their largest error: starting
/// from zeros instead (predictions assumed right) let jellyfish's first model
/// switches pass unnoticed and served late under overload (BENCHMARKS §7).
///
/// The window is kept twice: in arrival order with each error's time (to know
/// which error leaves, by count or by age) and sorted (so the quantile is a
/// lookup). A batch's answers cost a binary search and a move of at most
/// [`ERROR_WINDOW`] values each, where a selection over the whole window per
/// batch cost a copy and a partial sort under the app's lock, once per request
/// with zero-latency models (BENCHMARKS §3).
#[derive(Debug, Default)]
pub struct PredictionErrors {
    /// (time recorded, error), oldest first.
    ring: std::collections::VecDeque<(u64, i64)>,
    sorted: Vec<i64>,
}

impl PredictionErrors {
    /// Records the errors of one batch's answers at `now` (µs on the app's
    /// clock), then lets those older than [`ERROR_AGE_US`] go (down to
    /// [`ERROR_AGE_FLOOR`]), and returns
    /// the margin: the [`ERROR_QUANTILE`] of the window, at least 0 (a
    /// prediction that runs early does not earn a negative margin).
    pub fn record(&mut self, now: u64, errors: impl IntoIterator<Item = i64>) -> u64 {
        self.insert(now, errors);
        // After the new ones are in, so that the floor counts them.
        self.expire(now);
        self.margin()
    }

    /// Puts the errors of one batch's answers, recorded at `now`, in the window
    /// (the oldest leaving past [`ERROR_WINDOW`]), without ageing it: a
    /// predictor's bands age together ([`BandedErrors::expire`]).
    fn insert(&mut self, now: u64, errors: impl IntoIterator<Item = i64>) {
        for e in errors {
            let at = self.sorted.partition_point(|&x| x < e);
            if self.ring.len() < ERROR_WINDOW {
                self.ring.push_back((now, e));
                self.sorted.insert(at, e);
            } else {
                let (_, old) = self.ring.pop_front().unwrap_or((now, e));
                self.ring.push_back((now, e));
                // Present: every value in the ring is in the sorted copy. The old
                // value leaves and the new one comes in with one move of the values
                // between them (a removal then an insertion moved up to the whole
                // window twice: most of a simulated replay's admission).
                let gone = self.sorted.partition_point(|&x| x < old);
                if at <= gone {
                    // old >= e: the values in [at, gone) move up one.
                    self.sorted.copy_within(at..gone, at + 1);
                    self.sorted[at] = e;
                } else {
                    // old < e: those in (gone, at) move down one.
                    self.sorted.copy_within(gone + 1..at, gone);
                    self.sorted[at - 1] = e;
                }
            }
        }
    }

    /// Lets the errors recorded more than [`ERROR_AGE_US`] before `now` go, while
    /// more than [`ERROR_AGE_FLOOR`] are kept; whether any went.
    pub fn expire(&mut self, now: u64) -> bool {
        let mut any = false;
        while let Some(at) = self.oldest() {
            if now.saturating_sub(at) <= ERROR_AGE_US || self.ring.len() <= ERROR_AGE_FLOOR {
                break;
            }
            self.pop_oldest();
            any = true;
        }
        any
    }

    /// When its oldest error was recorded (None when it holds none).
    fn oldest(&self) -> Option<u64> {
        self.ring.front().map(|&(at, _)| at)
    }

    /// Lets its oldest error go.
    fn pop_oldest(&mut self) {
        if let Some((_, old)) = self.ring.pop_front() {
            let gone = self.sorted.partition_point(|&x| x < old);
            self.sorted.remove(gone);
        }
    }

    /// The current margin (µs).
    pub fn margin(&self) -> u64 {
        if self.sorted.is_empty() {
            return 0;
        }
        u64::try_from(self.sorted[quantile_index(self.sorted.len())]).unwrap_or(0)
    }
}

/// The loaded model with the shortest batch-1 latency (admission's first guess of
/// the model a worker serves its queue with).
pub fn fastest(models: &[sdk::Model], loaded: &[u32]) -> u32 {
    loaded
        .iter()
        .copied()
        .min_by_key(|&id| models.get(id as usize).and_then(|m| m.latency(1)).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// One worker's part of admission's state: what its policy showed it does (the
/// batch size per model, the choice per arrival rate), its last and fastest
/// model, its slowdown over the profile, and when its running batch started.
/// How many requests it runs is the worker's own state, passed in
/// ([`Place::in_flight`]).
#[derive(Debug)]
pub struct WorkerAdmission {
    /// When its running batch started (the app clock's µs); meaningful while it
    /// runs one.
    batch_started: AtomicU64,
    /// The batch size admission assumes the policy forms with each model (by the
    /// model's index): the size of the last batch it formed with that model while
    /// leaving requests queued (it chose that size), or, when it took the whole
    /// queue, the larger of that batch and the previous value (it might have taken
    /// more; [`learned_batch`]). Starts at 1: a policy that batches shows it with
    /// its first batch, while one assumed to batch more than it does would be
    /// refused the queue that would show it does not.
    ///
    /// Per model, because a policy that changes model changes batch with it:
    /// jellyfish serves ResNet-50 one by one at half of its capacity on a CPU, and
    /// Inception in pairs under overload; one size for both predicted ResNet-50 in
    /// pairs (279 ms instead of 104) after a burst, and refused requests one
    /// behind a running batch that then made their deadline (BENCHMARKS §12).
    batch_sizes: Box<[AtomicU32]>,
    /// Per bucket of the app's arrival rate ([`load_bucket`]), the model and batch
    /// size of the last batch the policy formed at that rate ([`pack_choice`]; 0:
    /// none yet), for [`BY_LOAD`].
    by_load: Box<[AtomicU64]>,
    /// Per depth of the queue at a decision made straight after a batch
    /// ([`DEPTHS`], [`STRAIGHT_AFTER_US`]), the model and batch size the policy
    /// chose there ([`pack_choice`]; 0: none yet), for [`FASTEST`].
    by_depth: Box<[AtomicU64]>,
    /// Whether `by_depth` holds a choice (a prediction per admission need not
    /// look through it when not).
    depth_known: AtomicBool,
    /// When its last batch ended (the app clock's µs; `u64::MAX` before one did).
    batch_ended: AtomicU64,
    /// The model of its running or last batch.
    last_model: AtomicU32,
    /// Its loaded model with the shortest batch-1 latency ([`fastest`]); set when
    /// its models change.
    fastest_model: AtomicU32,
    /// Measured over profiled batch time, an EWMA (f64 bits; 1.0 to start).
    slowdown: AtomicU64,
}

impl WorkerAdmission {
    /// A worker with `loaded` of the app's `models` that has formed no batch yet:
    /// predicted with its fastest loaded model until its first batch, batch size 1.
    pub fn new(models: &[sdk::Model], loaded: &[u32]) -> WorkerAdmission {
        let first = fastest(models, loaded);
        WorkerAdmission {
            batch_started: AtomicU64::new(0),
            batch_sizes: (0..models.len().max(1)).map(|_| AtomicU32::new(1)).collect(),
            by_load: (0..LOAD_BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            by_depth: (0..DEPTHS).map(|_| AtomicU64::new(0)).collect(),
            depth_known: AtomicBool::new(false),
            batch_ended: AtomicU64::new(u64::MAX),
            last_model: AtomicU32::new(first),
            fastest_model: AtomicU32::new(first),
            slowdown: AtomicU64::new(1f64.to_bits()),
        }
    }

    /// Its models changed: `fastest` ([`fastest`] of the new set) is the one
    /// [`FASTEST`] predicts with from now on.
    pub fn set_fastest(&self, fastest: u32) {
        self.fastest_model.store(fastest, Ordering::Relaxed);
    }

    /// The measured slowdown over the profile (1.0 until a batch finished).
    pub fn slowdown(&self) -> f64 {
        f64::from_bits(self.slowdown.load(Ordering::Relaxed))
    }

    /// How long from `now` until this worker has served `queued` requests and one
    /// more, each predictor's way ([`LAST`], [`FASTEST`], [`BY_LOAD`]), at the
    /// measured slowdown: what is left of the running batch (its profiled time
    /// less what has elapsed; `running` requests in it), then the `queued + 1` in
    /// batches of the size this worker's policy forms, its own batch filled by the
    /// arrivals that may come meanwhile (`arrivals_per_us`, per worker; see
    /// [`predict_us`] and [`WorkerAdmission::batch_sizes`]). That size, not the
    /// largest nor the cheapest: on a CPU a batch of four can cost more than four
    /// single requests (ResNet-50 here), so `fixed` serves them one by one, while
    /// jellyfish forms pairs there (its SLO/2 rule) and a request in a pair
    /// finishes with its partner. Predicting either policy's batching for the
    /// other refused requests at half of capacity, or admitted them to finish late
    /// (BENCHMARKS §7, §8).
    ///
    /// The queue is predicted three ways: with the last model, with the choices
    /// the policy made at each depth straight after a batch (the fastest loaded
    /// model where it made none; [`FASTEST`]), and with the models and batches the
    /// policy chose at the load estimates each batch's decision may read
    /// (`forecast`, [`LoadForecast::range_at`] at the decision's latest start),
    /// any of them for each batch, the latest finish counting
    /// ([`predict_worst_with`]; [`BY_LOAD`]); each is judged with its own
    /// margin ([`judge`]). A policy that picks its model by load (jellyfish serves
    /// its most accurate model while that keeps up, a faster one when the load
    /// grows) serves a longer queue faster than its last batch's model would.
    /// Predicting with the last model alone refused 14 % of requests at half of
    /// jellyfish's capacity, every one of which then made its deadline when
    /// admitted (`cargo bench -p sluice --bench admission`).
    ///
    /// None when the last model is not among `models`.
    pub fn predicted_us(
        &self,
        models: &[sdk::Model],
        (running, queued): (usize, usize),
        now: u64,
        arrivals_per_us: f64,
        forecast: &LoadForecast<'_>,
    ) -> Option<[f64; PREDICTORS]> {
        let last_index = self.last_model.load(Ordering::Relaxed);
        let last = models.get(last_index as usize)?;
        let fastest_index = self.fastest_model.load(Ordering::Relaxed);
        let (fastest_index, fastest) =
            models.get(fastest_index as usize).map_or((last_index, last), |m| (fastest_index, m));
        let elapsed = now.saturating_sub(self.batch_started.load(Ordering::Relaxed));
        let slowdown = self.slowdown();
        let with = |m: &sdk::Model, batch: u32| {
            predict_us(last, m, slowdown, (running, elapsed), queued, batch, arrivals_per_us)
        };
        let last_prediction = with(last, self.batch_of(last_index));
        // The choices made at the load estimates each decision ahead may read.
        let any = std::cell::Cell::new(false);
        let by_load = predict_worst_with(
            last,
            |start, visit| {
                let known = self.choices_at(models, forecast.range_at(start), visit);
                any.set(any.get() | known);
            },
            slowdown,
            (running, elapsed),
            queued,
            arrivals_per_us,
        );
        let by_load = if any.get() { by_load } else { last_prediction };
        let by_depth = self.by_depth_us(
            models,
            (fastest, self.batch_of(fastest_index)),
            slowdown,
            (running, elapsed),
            queued,
            arrivals_per_us,
        );
        Some([last_prediction, by_depth.unwrap_or_else(|| with(fastest, self.batch_of(fastest_index))), by_load])
    }

    /// Calls `visit` with each choice (model, batch size) the policy made at a load
    /// estimate between `low` and `high` (req/s; the buckets from one's to the
    /// other's), each once; where none is known in between, the nearest known
    /// below and above. Whether any was visited.
    fn choices_at(
        &self,
        models: &[sdk::Model],
        (low, high): (f64, f64),
        visit: &mut dyn FnMut(&sdk::Model, u32),
    ) -> bool {
        let (first, last) = (load_bucket(low), load_bucket(high).max(load_bucket(low)));
        // The distinct choices visited: a policy has few (jellyfish two), while
        // the buckets between may be dozens; past four, repeats are visited again
        // (the latest finish is the same).
        let mut seen = ([0u64; 4], 0);
        let mut emit = |packed: u64, (seen, n): &mut ([u64; 4], usize)| {
            if packed == 0 || seen[..*n].contains(&packed) {
                return;
            }
            let Some((index, batch)) = unpack_choice(packed) else { return };
            let Some(model) = models.get(index as usize) else { return };
            if *n < seen.len() {
                seen[*n] = packed;
                *n += 1;
            }
            visit(model, batch);
        };
        let at = |k: usize| self.by_load[k].load(Ordering::Relaxed);
        for k in first..=last {
            emit(at(k), &mut seen);
        }
        if seen.1 == 0 {
            if let Some(k) = (0..first).rev().find(|&k| at(k) != 0) {
                emit(at(k), &mut seen);
            }
            if let Some(k) = (last + 1..LOAD_BUCKETS).find(|&k| at(k) != 0) {
                emit(at(k), &mut seen);
            }
        }
        seen.1 > 0
    }

    /// [`FASTEST`]'s prediction: the queue of `queued` and one more served batch
    /// by batch with the choice the policy made at each depth straight after a
    /// batch (the depth falling by the batch each time), `fallback` (the fastest
    /// model and its batch) at a depth it has none for. None when no depth has a
    /// choice, or the request is alone at an idle worker (the policy then decides
    /// with its whole slack, as after no batch): [`predict_us`] with `fallback`.
    fn by_depth_us(
        &self,
        models: &[sdk::Model],
        fallback: (&sdk::Model, u32),
        slowdown: f64,
        (running, elapsed): (usize, u64),
        queued: usize,
        arrivals_per_us: f64,
    ) -> Option<f64> {
        if running == 0 && queued == 0 {
            return None;
        }
        let choice = |depth: usize| {
            let (index, batch) = unpack_choice(self.by_depth[depth.min(DEPTHS - 1)].load(Ordering::Relaxed))?;
            Some((models.get(index as usize)?, batch))
        };
        if !self.depth_known.load(Ordering::Relaxed) {
            return None;
        }
        let last = models.get(self.last_model.load(Ordering::Relaxed) as usize)?;
        let mut start = running_left_us(last, slowdown, (running, elapsed));
        // The requests queued at each decision, this one last among them.
        let mut depth = queued + 1;
        for _ in 0..MAX_DEPTH {
            let (m, batch) = choice(depth).unwrap_or(fallback);
            let b = u64::from(m.max_batch().min(batch).max(1));
            if depth as u64 <= b {
                return Some(own_batch_end_us(m, b, depth as u64, start, arrivals_per_us, slowdown));
            }
            start += scaled_latency(m, b, slowdown);
            depth -= b as usize;
        }
        // Deeper than MAX_DEPTH batches: the rest with the fallback, as predict_us.
        let (m, batch) = fallback;
        let b = u64::from(m.max_batch().min(batch).max(1));
        let before = (depth as u64 - 1) / b;
        start += before as f64 * scaled_latency(m, b, slowdown);
        Some(own_batch_end_us(m, b, depth as u64 - before * b, start, arrivals_per_us, slowdown))
    }

    /// The batch size admission assumes the policy forms with the model at `index`.
    fn batch_of(&self, index: u32) -> u32 {
        self.batch_sizes.get(index as usize).map_or(1, |b| b.load(Ordering::Relaxed))
    }

    /// Learns from a batch the policy formed at `now`: `size` requests with
    /// `model`, `left` staying queued, while the app's arrival rate was
    /// `load_qps` (the batch size per model and the choice per rate bucket, both
    /// by [`learned_batch`]). The caller marks the worker busy after this.
    pub fn start_batch(&self, model: u32, size: usize, left: usize, now: u64, load_qps: f64) {
        self.last_model.store(model, Ordering::Relaxed);
        self.batch_started.store(now, Ordering::Relaxed);
        let ended = self.batch_ended.load(Ordering::Relaxed);
        if ended <= now && now - ended <= STRAIGHT_AFTER_US {
            let choice = &self.by_depth[(size + left).min(DEPTHS - 1)];
            let previous =
                unpack_choice(choice.load(Ordering::Relaxed)).filter(|&(m, _)| m == model).map_or(1, |(_, b)| b);
            choice.store(pack_choice(model, learned_batch(previous, size, left)), Ordering::Relaxed);
            self.depth_known.store(true, Ordering::Relaxed);
        }
        if let Some(batch) = self.batch_sizes.get(model as usize) {
            batch.store(learned_batch(batch.load(Ordering::Relaxed), size, left), Ordering::Relaxed);
        }
        if let Some(choice) = self.by_load.get(load_bucket(load_qps)) {
            // A bucket new to this model starts from the batch the policy forms
            // with it elsewhere: with buckets of 2 %, most are first seen with one
            // request queued, and a pair then predicted alone finished late.
            let previous = unpack_choice(choice.load(Ordering::Relaxed))
                .filter(|&(m, _)| m == model)
                .map_or_else(|| self.batch_of(model), |(_, b)| b);
            choice.store(pack_choice(model, learned_batch(previous, size, left)), Ordering::Relaxed);
        }
    }

    /// Folds one finished batch into the slowdown estimate: `measured_us` against
    /// the `profiled_us` of its model and size (an EWMA, 0.3 to the new sample).
    pub fn finish_batch(&self, model: u32, profiled_us: u64, measured_us: u64) {
        self.last_model.store(model, Ordering::Relaxed);
        let started = self.batch_started.load(Ordering::Relaxed);
        self.batch_ended.store(started.saturating_add(measured_us), Ordering::Relaxed);
        if profiled_us == 0 {
            return;
        }
        // Clamped: one stalled batch (a page fault, a noisy neighbour) must not make
        // admission refuse everything, nor a lucky one admit everything.
        let sample = (measured_us as f64 / profiled_us as f64).clamp(0.25, 8.0);
        self.slowdown.store((0.7 * self.slowdown() + 0.3 * sample).to_bits(), Ordering::Relaxed);
    }
}

/// Where a request would join, as admission predicts it: the worker, the models
/// as that worker sees them, whether the app's workers share one queue, how many
/// requests each worker is running (`in_flight(w)`), the host's load estimate,
/// and the time.
pub struct Place<'a, F: Fn(usize) -> usize> {
    /// The worker the router picked.
    pub worker: usize,
    /// The app's variants with that worker's latencies.
    pub models: &'a [sdk::Model],
    /// `router = "shared"`: one queue for all workers.
    pub shared: bool,
    /// Requests in the batch worker `w` is running (0 when idle).
    pub in_flight: F,
    /// The host's load estimate, borrowed (live under `LoadMonitor`'s lock), with
    /// this arrival counted: how fast a waiting batch fills, and what the
    /// decisions ahead will read ([`LoadForecast`]).
    pub load: &'a LoadWindow,
    /// µs on the app's clock.
    pub now: u64,
}

/// What admission says of one request ([`Admission::verdict`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Verdict {
    /// Requests queued or running ahead of it on its worker.
    pub ahead: usize,
    /// Each predictor's µs from now until it is served, without margins.
    pub predicted: [f64; PREDICTORS],
    /// The wait admission counts, and the margin in it.
    pub judged: Judged,
    /// Whether it would itself be served by its deadline.
    pub on_time: bool,
    /// Whether it is admitted: on time, and so is every request queued behind
    /// its place that it would push back by one.
    pub admitted: bool,
}

impl Verdict {
    /// The prediction a request admitted by this verdict at `now` carries, for
    /// [`Admission::learn`] to compare its answer with.
    pub fn prediction(&self, now: u64) -> Prediction {
        Prediction {
            finish: self.predicted.map(|p| now + p as u64),
            ahead: u32::try_from(self.ahead).unwrap_or(u32::MAX),
        }
    }
}

/// One app's admission: the state the predictors and margins read, one
/// [`WorkerAdmission`] per worker, and what learns it. The live app and the
/// simulator's engine each hold one per (single) app and call the same methods.
#[derive(Debug)]
pub struct Admission {
    /// The app's SLO, µs: a request's deadline from its arrival.
    slo_us: u64,
    /// `admission_audit`: the share of refusals admitted anyway ([`Admission::audits`]).
    audit_share: f64,
    /// Refusals judged so far, for the audit's sampling.
    refusals_seen: AtomicU64,
    /// How late answers came against each of admission's predictions, recently.
    errors: Mutex<[BandedErrors; PREDICTORS]>,
    /// The margins those errors give, per predictor and band of depth.
    margins_us: [[AtomicU64; BANDS]; PREDICTORS],
    /// How long answers took, recently, from their batch's end to the front that
    /// sends them ([`Admission::record_edge`]).
    edges: Mutex<PredictionErrors>,
    /// The [`ERROR_QUANTILE`] of `edges` (µs), kept back by admission.
    edge_us: AtomicU64,
    /// The latest end of a batch [`Admission::learn`] saw (the app clock's µs):
    /// the time `edges` age by.
    last_finished: AtomicU64,
    /// Per worker.
    workers: Box<[WorkerAdmission]>,
}

impl Admission {
    /// An app's admission with an SLO of `slo_us`, auditing `audit_share` of its
    /// refusals (`admission_audit`), over `workers`.
    pub fn new(slo_us: u64, audit_share: f64, workers: Vec<WorkerAdmission>) -> Admission {
        Admission {
            slo_us,
            audit_share,
            refusals_seen: AtomicU64::new(0),
            errors: Mutex::new(Default::default()),
            margins_us: Default::default(),
            edges: Mutex::new(Default::default()),
            edge_us: AtomicU64::new(0),
            last_finished: AtomicU64::new(0),
            workers: workers.into_boxed_slice(),
        }
    }

    /// Worker `w`'s part.
    pub fn worker(&self, w: usize) -> &WorkerAdmission {
        &self.workers[w]
    }

    /// Requests ahead on `place`'s worker with `queued` in its queue, and each
    /// predictor's µs to serve them and one more (without margins).
    pub fn prediction<F: Fn(usize) -> usize>(&self, place: &Place<'_, F>, queued: usize) -> (usize, [f64; PREDICTORS]) {
        let k = self.workers.len().max(1);
        let (running, queued) = if place.shared {
            // One queue for all: each worker takes its share of it, running batches
            // counted as queued (which worker frees first is not known here).
            let running: usize = (0..k).map(&place.in_flight).sum();
            (0, (queued + running) / k)
        } else {
            ((place.in_flight)(place.worker), queued)
        };
        let app_rate = place.load.rate_at(place.now);
        let per_worker = app_rate / 1e6 / k as f64;
        let forecast = LoadForecast::new(place.load.arrivals(), place.load.window_us(), place.now, app_rate);
        let predicted =
            self.workers[place.worker].predicted_us(place.models, (running, queued), place.now, per_worker, &forecast);
        (running + queued, predicted.unwrap_or_default())
    }

    /// Each predictor's prediction (µs from now) with its own margin, as admission
    /// counts it ([`judge`], then [`keep_back_edge`]). A margin is capped at a
    /// quarter of the SLO: a margin near the SLO would refuse every request, so no
    /// answer would ever come to bring it down (one batch held 1 s by a frozen
    /// cluster agent did that before this bound). `ahead`: the requests before it
    /// on its worker (its band's margins count).
    pub fn judge(&self, predicted: [f64; PREDICTORS], ahead: usize) -> Judged {
        let band = band(ahead);
        let margins = std::array::from_fn(|i| self.margins_us[i][band].load(Ordering::Relaxed));
        let judged = judge(predicted, margins, self.slo_us / 4);
        keep_back_edge(judged, self.edge_us.load(Ordering::Relaxed), self.slo_us)
    }

    /// Whether a request due at `deadline`, joining `place`'s queue at index `at`
    /// ahead of requests due at `behind` (their deadlines, in queue order), is
    /// admitted: it must be predicted to make its deadline, and so must every
    /// request it would push back by one place. The waits are predicted from
    /// `place.now` and counted from `now`: the live app judges under its queue's
    /// lock ([`crate::queue::WorkQueue::push_if`]), predicting from the time it
    /// holds it and counting from the time the request came (its clock read
    /// before the lock); the simulator, on its one thread, gives one time for both.
    pub fn verdict<F: Fn(usize) -> usize>(
        &self,
        place: &Place<'_, F>,
        at: usize,
        (deadline, now): (u64, u64),
        behind: impl IntoIterator<Item = u64>,
    ) -> Verdict {
        let now = now as f64;
        let on_time = |judged: Judged, deadline: u64| now + judged.wait_us <= deadline as f64;
        let (ahead, predicted) = self.prediction(place, at);
        let judged = self.judge(predicted, ahead);
        let itself = on_time(judged, deadline);
        let admitted = itself
            && behind.into_iter().enumerate().all(|(k, d)| {
                let (ahead, predicted) = self.prediction(place, at + 1 + k);
                on_time(self.judge(predicted, ahead), d)
            });
        Verdict { ahead, predicted, judged, on_time: itself, admitted }
    }

    /// The margin admission adds now to a prediction for a request with nobody
    /// ahead (µs): that of the predictor it trusts, the smaller of the margins
    /// below the cap ([`judge`]), each the high quantile of its predictor's recent
    /// errors ([`BandedErrors`]).
    pub fn margin_us(&self) -> f64 {
        self.judge([0.0; PREDICTORS], 0).margin_us
    }

    /// Records that an answer reached its front `edge_us` after its batch ended (the
    /// front's task woken and run on a busy runtime): the client waits for that
    /// too, so admission keeps a high quantile of it back ([`Admission::judge`]).
    /// Without it, requests admitted to finish just by their deadline were answered
    /// a few ms late by the client's clock while on time by the server's
    /// (BENCHMARKS §7). Live only: the simulator answers at the batch's end.
    ///
    /// Aged as the prediction errors are ([`ERROR_AGE_US`]), on the time of the
    /// last batch [`Admission::learn`] saw end: an answer is sent just after its
    /// batch ends, and the callers (the fronts) hold no clock of the app's.
    pub fn record_edge(&self, edge_us: u64) {
        let now = self.last_finished.load(Ordering::Relaxed);
        let margin = self.edges.lock().record(now, [i64::try_from(edge_us).unwrap_or(i64::MAX)]);
        self.edge_us.store(margin, Ordering::Relaxed);
    }

    /// The time kept back for answering, µs ([`Admission::record_edge`]).
    pub fn edge_us(&self) -> u64 {
        self.edge_us.load(Ordering::Relaxed)
    }

    /// Folds the answers of a batch finished at `finished` (each request's
    /// [`Prediction`], all 0 for one admission did not predict) into each
    /// predictor's errors, and the margins they give.
    ///
    /// Errors older than [`ERROR_AGE_US`] at `finished` leave first: margins age
    /// with the answers that come, so after a stall the next answer past the
    /// window brings them back down.
    pub fn learn(&self, finished: u64, predictions: impl Iterator<Item = Prediction> + Clone) {
        self.last_finished.fetch_max(finished, Ordering::Relaxed);
        let mut errors = self.errors.lock();
        for (i, errors) in errors.iter_mut().enumerate() {
            for p in predictions.clone().filter(|p| p.finish[i] > 0) {
                errors.record(band(p.ahead as usize), finished as i64 - p.finish[i] as i64, finished);
            }
            // After the new ones are in, so that the floor counts them.
            errors.expire(finished);
            for (atomic, margin) in self.margins_us[i].iter().zip(errors.margins()) {
                atomic.store(margin, Ordering::Relaxed);
            }
        }
    }

    /// Empties the prediction errors and the margins they gave (a policy swap: how
    /// the old policy's answers strayed from the prediction says nothing about the
    /// new one's).
    pub fn forget_errors(&self) {
        *self.errors.lock() = Default::default();
        for m in self.margins_us.iter().flatten() {
            m.store(0, Ordering::Relaxed);
        }
    }

    /// Whether the refusal being judged is one `admission_audit` samples: admitted
    /// anyway, to see whether it would have made its deadline. Every k-th refusal
    /// for a share of 1/k (deterministic: a benchmark's figure, and a simulated
    /// run, does not depend on a random draw).
    pub fn audits(&self) -> bool {
        let share = self.audit_share;
        if share <= 0.0 {
            return false;
        }
        let n = self.refusals_seen.fetch_add(1, Ordering::Relaxed) as f64;
        (n * share).floor() != ((n + 1.0) * share).floor()
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
    fn load_buckets_are_steps_of_two_percent() {
        assert_eq!(load_bucket(0.0), 0);
        assert_eq!(load_bucket(-3.0), 0);
        assert_eq!(load_bucket(f64::NAN), 0);
        // jellyfish's switch to its faster model at 18.4 req/s on two workers: 9
        // and 10 arrivals in the 500 ms window are buckets apart.
        assert!(load_bucket(18.0) < load_bucket(20.0));
        // Every count of arrivals in a 500 ms window has its own bucket up to 90 req/s.
        for count in 1..45 {
            assert!(load_bucket(2.0 * count as f64) < load_bucket(2.0 * (count + 1) as f64), "{count}");
        }
        assert_eq!(load_bucket(1e12), LOAD_BUCKETS - 1);
        assert_eq!(unpack_choice(pack_choice(3, 4)), Some((3, 4)));
        assert_eq!(unpack_choice(pack_choice(0, 1)), Some((0, 1)));
        assert_eq!(unpack_choice(0), None);
    }

    #[test]
    fn a_poisson_count_lies_between_its_1st_and_99th_percentile() {
        assert_eq!(poisson_range(0.0), (0, 0));
        assert_eq!(poisson_range(f64::NAN), (0, 0));
        // A mean of 1: P(N = 0) = 0.37 (past 1 %), P(N <= 3) = 0.981, P(N <= 4) = 0.996.
        assert_eq!(poisson_range(1.0), (0, 4));
        // A mean of 9.35 (18.7 req/s over 500 ms): 3 to 17.
        assert_eq!(poisson_range(9.35), (3, 17));
        // Large means: the normal approximation, about the mean.
        let (low, high) = poisson_range(1_000.0);
        assert!((920..=930).contains(&low) && (1_070..=1_080).contains(&high), "{low} {high}");
    }

    #[test]
    fn the_forecast_keeps_the_arrivals_still_in_the_window_and_adds_those_to_come() {
        // Ten arrivals, at 10, 20, ..., 100 ms, in a 500 ms window; now is 100 ms,
        // the estimate 20 req/s.
        let times: std::collections::VecDeque<u64> = (1..=10).map(|k| k * 10_000).collect();
        let f = LoadForecast::new(&times, 500_000, 100_000, 20.0);
        // Now: exactly the ten.
        assert_eq!(f.range_at(0.0), (20.0, 20.0));
        // 450 ms on, the first four have left (10 + 500 < 550), and 9 arrivals are
        // expected meanwhile (0.45 s at 20 req/s): 1st percentile 3, 99th 17.
        let (low, high) = poisson_range(9.0);
        assert_eq!(f.range_at(450_000.0), ((6 + low) as f64 * 2.0, (6 + high) as f64 * 2.0));
        // A window later every known one has gone: only those to come.
        let (low, high) = poisson_range(10.0);
        assert_eq!(f.range_at(2_000_000.0), (low as f64 * 2.0, high as f64 * 2.0));
    }

    /// Issue 39: jellyfish at 70 % of its capacity switches between ResNet-50 one
    /// by one (9 arrivals or fewer in its 500 ms window) and Inception in pairs (10
    /// or more) batch to batch. Each batch ahead is predicted with the choices of
    /// the estimates its decision may read, on a virtual clock.
    #[test]
    fn each_decision_ahead_is_predicted_with_the_choices_of_the_load_it_may_read() {
        use crate::clock::{Clock as _, VirtualClock};
        // The test models' profiles in ms (104 ms for ResNet-50 alone): the
        // decisions ahead then come as far apart as the arrivals do.
        let ms = |m: sdk::Model| sdk::Model { latency: m.latency.iter().map(|l| l * 1_000).collect(), ..m };
        let models = [ms(cpu()), ms(inception())];
        let clock = VirtualClock::default();
        let w = WorkerAdmission::new(&models, &[0, 1]);
        // What the policy showed: ResNet-50 alone at 10 and 18 req/s, Inception
        // pairs at 20 and 40.
        clock.set(1_000_000);
        for (model, size, left, rate) in [(0, 1, 2, 10.0), (0, 1, 1, 18.0), (1, 2, 1, 20.0), (1, 2, 3, 40.0)] {
            w.start_batch(model, size, left, clock.now(), rate);
        }
        // A ResNet-50 batch starts now, one request queued behind it, this one
        // next; two workers share the arrivals.
        w.start_batch(0, 1, 1, clock.now(), 18.0);
        let by_load = |times: &std::collections::VecDeque<u64>| {
            let rate = times.len() as f64 * 2.0;
            let f = LoadForecast::new(times, 500_000, clock.now(), rate);
            w.predicted_us(&models, (1, 1), clock.now(), rate / 2.0 / 1e6, &f).unwrap()[BY_LOAD] / 1e3
        };
        // Ten arrivals in the last 18 ms: at the next decision (104 ms on) all ten
        // are still in the window, so the policy reads 20 req/s or more: Inception,
        // the one queued and this one as a pair. ResNet-50 cannot come then (it
        // would make this one finish at 312 ms or later).
        let recent: std::collections::VecDeque<u64> = (0..10).map(|k| clock.now() - 2_000 * k).rev().collect();
        assert_eq!(by_load(&recent), 104.0 + 164.0);
        // Nine just now: the tenth may come before either decision, so both
        // choices, the latest finish counting: ResNet-50 for the one ahead, then
        // this one in an Inception pair with a later arrival.
        let nine: std::collections::VecDeque<u64> = (0..9).map(|k| clock.now() - 1_000 * k).rev().collect();
        assert_eq!(by_load(&nine), 104.0 + 104.0 + 164.0);
        // Eight 400–470 ms ago have left the window by the next decision, and at
        // 16 req/s fewer than ten come in 208 ms (the 99th percentile is 8):
        // ResNet-50 one by one. The same eight just now may reach the switch.
        assert_eq!(poisson_range(16.0 * 0.208).1, 8);
        let old: std::collections::VecDeque<u64> = (0..8).map(|k| clock.now() - 400_000 - 10_000 * k).rev().collect();
        assert_eq!(by_load(&old), 3.0 * 104.0);
        let eight: std::collections::VecDeque<u64> = nine.iter().skip(1).copied().collect();
        assert_eq!(by_load(&eight), 104.0 + 104.0 + 164.0);
        // Two, long below any switch: the nearest choice known, ResNet-50.
        let two: std::collections::VecDeque<u64> = [clock.now() - 1_000, clock.now()].into();
        assert_eq!(by_load(&two), 3.0 * 104.0);
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
            e.record(0, if i % 5 == 0 { 60_000 } else { 0 }, 0);
            e.record(2, 1_000, 0);
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
            e.record(1, 5_000, 0);
        }
        for _ in 0..200 {
            e.record(2, 1_000, 0);
        }
        // 210 values, 10 at 5 ms: the 99th percentile (index 207) is one of them.
        assert_eq!(e.margins()[1], 5_000);
        // With no errors anywhere, no margin.
        assert_eq!(BandedErrors::default().margins(), [0; BANDS]);
        // A deep band with errors of its own keeps to them: 40 answers on time four
        // deep, the shallower band often 60 ms late.
        let mut e = BandedErrors::default();
        for i in 0..200 {
            e.record(2, if i % 5 == 0 { 60_000 } else { 0 }, 0);
        }
        for _ in 0..40 {
            e.record(3, 2_000, 0);
        }
        assert_eq!(e.margins()[3], 2_000);
        // With fewer than OWN_SAMPLES it borrows them.
        let mut e = BandedErrors::default();
        for i in 0..200 {
            e.record(2, if i % 5 == 0 { 60_000 } else { 0 }, 0);
        }
        for _ in 0..10 {
            e.record(3, 2_000, 0);
        }
        assert_eq!(e.margins()[3], 60_000);
    }

    /// The floor counts a predictor's bands together: a sparse band's old error
    /// leaves with the age once the bands hold more than the floor of younger
    /// ones, where its own floor kept it for as long as the band had fewer than
    /// 200 (the whole of a 40 s phase four deep below capacity).
    #[test]
    fn a_sparse_bands_old_error_ages_out_while_the_bands_hold_the_floor() {
        let mut e = BandedErrors::default();
        // Four deep: 40 answers on time and one 43 ms late, at 0 s.
        for _ in 0..40 {
            e.record(4, 1_000, 0);
        }
        e.record(4, 43_000, 0);
        assert_eq!(e.margins()[4], 43_000, "its largest error: fewer than MIN_SAMPLES");
        // Within the age it stays, however many come in the other bands.
        let young = ERROR_AGE_US;
        for _ in 0..300 {
            e.record(1, 0, young);
        }
        for _ in 0..40 {
            e.record(4, 1_000, young);
        }
        e.expire(young);
        assert_eq!(e.margins()[4], 43_000);
        // Past it, the bands together hold more than the floor of younger errors:
        // the old ones go, and band 4's margin is its 40 young errors' (more than
        // OWN_SAMPLES, so no shallower band's).
        e.expire(young + 1);
        assert_eq!(e.bands[4].ring.len(), 40);
        assert_eq!(e.margins()[4], 1_000);
        // Below the floor nothing ages: a band alone keeps its old errors.
        let mut e = BandedErrors::default();
        for _ in 0..ERROR_AGE_FLOOR {
            e.record(4, 1_000, 0);
        }
        e.record(4, 43_000, 0);
        for _ in 0..ERROR_AGE_FLOOR / 2 {
            e.record(1, 0, 3 * ERROR_AGE_US);
        }
        e.expire(3 * ERROR_AGE_US);
        let kept: usize = e.bands.iter().map(|b| b.ring.len()).sum();
        assert_eq!(kept, ERROR_AGE_FLOOR, "the oldest go down to the floor, no further");
        assert_eq!(e.bands[4].ring.len(), ERROR_AGE_FLOOR / 2);
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
        assert_eq!(e.record(0, [-5_000, -1_000]), 0);
        // 3 late by 30 ms among 200: the 99th percentile is one of them (2 would
        // be the 1 % allowed past it).
        let mut errors = vec![0; 195];
        errors.extend([30_000; 3]);
        assert_eq!(e.record(0, errors), 30_000);
        // One outlier in a full window of 512 is past the 99th percentile.
        let mut e = PredictionErrors::default();
        e.record(0, std::iter::repeat_n(1_000, ERROR_WINDOW - 1).chain([90_000]));
        assert_eq!(e.margin(), 1_000);
        // The window forgets: 512 on-time answers later, the margin is back to 0.
        let mut e = PredictionErrors::default();
        e.record(0, std::iter::repeat_n(30_000, 10));
        assert_eq!(e.record(0, std::iter::repeat_n(0, ERROR_WINDOW)), 0);
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
            let margin = e.record(0, errors);
            let mut last: Vec<i64> = all[all.len().saturating_sub(ERROR_WINDOW)..].to_vec();
            last.sort_unstable();
            let k = ((last.len() as f64 * ERROR_QUANTILE).ceil() as usize).clamp(1, last.len()) - 1;
            assert_eq!(margin, u64::try_from(last[k]).unwrap_or(0), "after batch {batch}");
        }
    }

    #[test]
    fn the_window_keeps_the_last_errors_within_its_age() {
        // Against a plain sort of the last ERROR_WINDOW values recorded within
        // ERROR_AGE_US, with gaps in time from none to past the age.
        let mut e = PredictionErrors::default();
        let mut all: Vec<(u64, i64)> = Vec::new();
        let (mut x, mut now): (u64, u64) = (3, 0);
        for batch in 0..2_000 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            now += [0, 1_000, 50_000, 400_000, ERROR_AGE_US / 3, ERROR_AGE_US + 1][(x >> 61) as usize % 6];
            let errors: Vec<i64> = (0..1 + batch % 4).map(|k| ((x >> (20 + k)) % 3_000) as i64 - 1_000).collect();
            all.extend(errors.iter().map(|&v| (now, v)));
            let margin = e.record(now, errors);
            // The last ERROR_WINDOW, less the aged ones (a prefix: times only
            // grow) while more than ERROR_AGE_FLOOR stay.
            let window = &all[all.len().saturating_sub(ERROR_WINDOW)..];
            let young = window.iter().filter(|&&(t, _)| now - t <= ERROR_AGE_US).count();
            let kept = young.max(window.len().min(ERROR_AGE_FLOOR));
            let mut last: Vec<i64> = window[window.len() - kept..].iter().map(|&(_, v)| v).collect();
            last.sort_unstable();
            let k = ((last.len() as f64 * ERROR_QUANTILE).ceil() as usize).clamp(1, last.len()) - 1;
            assert_eq!(margin, u64::try_from(last[k]).unwrap_or(0), "after batch {batch}");
        }
    }

    /// Issue 40: one stall held its margin for ~90 s at low rates, when the window
    /// was the last 512 answers. On a virtual clock, answers 2 ms late every 40 ms
    /// (250 in [`ERROR_AGE_US`], more than [`ERROR_AGE_FLOOR`]), a stall making
    /// five answers 63 ms late: that margin is gone once they are older than the
    /// age, where 512 answers would have taken 20 s; the steady 2 ms stays however
    /// long it runs, and an idle gap leaves the floor's answers in.
    #[test]
    fn a_stall_ages_out_of_the_margin_and_a_steady_error_stays() {
        use crate::clock::{Clock as _, VirtualClock};
        const EVERY: u64 = 40_000;
        let (a, _) = one_worker(400_000, 0.0);
        let clock = VirtualClock::default();
        let answer = |late_us: u64| {
            clock.set(clock.now() + EVERY);
            let p = Prediction { finish: [clock.now() - late_us; PREDICTORS], ahead: 0 };
            a.learn(clock.now(), [p].into_iter());
        };
        let window = ERROR_AGE_US / EVERY;
        for _ in 0..window {
            answer(2_000);
        }
        assert_eq!(a.margin_us(), 2_000.0);
        for _ in 0..5 {
            answer(63_000);
        }
        a.record_edge(30_000);
        assert_eq!(a.margin_us(), 63_000.0 + 30_000.0, "the stall, and its answering time");
        // Within the age the stall counts (five of 250: above the 99th percentile),
        // up to an answer exactly ERROR_AGE_US after the stall's last.
        for _ in 0..window - 4 {
            answer(2_000);
        }
        assert_eq!(a.margin_us(), 63_000.0 + 30_000.0);
        // Past it, the stall is gone; the edge's one sample stays (the floor).
        for _ in 0..5 {
            answer(2_000);
        }
        assert_eq!(a.margin_us(), 2_000.0 + 30_000.0);
        // A steady error stays however long it runs: ten windows on.
        for _ in 0..10 * window {
            answer(2_000);
        }
        assert_eq!(a.margin_us(), 2_000.0 + 30_000.0);
        // No answers for longer than the age: the floor's 200 stay, so one early
        // answer after the gap does not make the margin its own.
        clock.set(clock.now() + 3 * ERROR_AGE_US);
        answer(500);
        assert_eq!(a.margin_us(), 2_000.0 + 30_000.0);
    }

    /// The state machine on a virtual clock: what a worker's batches teach it.
    #[test]
    fn a_worker_learns_its_model_batch_and_slowdown_from_its_batches() {
        use crate::clock::{Clock as _, VirtualClock};
        let models = [cpu(), inception()];
        let clock = VirtualClock::default();
        let w = WorkerAdmission::new(&models, &[0, 1]);
        let none = std::collections::VecDeque::new();
        let at = |rate: f64| LoadForecast::new(&none, 500_000, clock.now(), rate);
        // Before any batch: the fastest loaded model (Inception, 81) alone.
        assert_eq!(w.predicted_us(&models, (0, 0), clock.now(), 0.0, &at(0.0)), Some([81.0, 81.0, 81.0]));
        // The policy forms a ResNet-50 batch of 1 with two left queued at 10 req/s:
        // it predicts with ResNet-50 one by one now, what is left of the batch first.
        clock.set(1_000);
        w.start_batch(0, 1, 2, clock.now(), 10.0);
        clock.set(1_060);
        let p = w.predicted_us(&models, (1, 2), clock.now(), 0.0, &at(10.0)).unwrap();
        assert_eq!(p[LAST], 44.0 + 3.0 * 104.0);
        // The fastest predicts Inception (one by one: it has not batched it).
        assert_eq!(p[FASTEST], 44.0 + 3.0 * 81.0);
        // By load: the choice at 10 req/s, ResNet-50 one by one.
        assert_eq!(p[BY_LOAD], p[LAST]);
        // The batch took twice its profile: the slowdown moves 30 % of the way.
        clock.set(1_208);
        w.finish_batch(0, 104, clock.now() - 1_000);
        assert!((w.slowdown() - 1.3).abs() < 1e-12, "{}", w.slowdown());
        // An Inception pair that took the whole queue at 40 req/s: pairs from now
        // on with Inception, and the by-load choice there.
        w.start_batch(1, 2, 0, clock.now(), 40.0);
        let p = w.predicted_us(&models, (2, 1), clock.now(), 0.0, &at(40.0)).unwrap();
        // The running pair, then the one queued and this one as a pair.
        assert!((p[LAST] - 2.0 * 1.3 * 164.0).abs() < 1e-9, "{}", p[LAST]);
        // Models changed: the fastest is the one set.
        w.set_fastest(0);
        let p = w.predicted_us(&models, (0, 0), clock.now(), 0.0, &at(0.0)).unwrap();
        assert!((p[FASTEST] - 1.3 * 104.0).abs() < 1e-9, "{}", p[FASTEST]);
        // A last model not among the models: no prediction.
        assert_eq!(w.predicted_us(&models[..1], (0, 0), 0, 0.0, &at(0.0)), None);
    }

    fn one_worker(slo_us: u64, audit: f64) -> (Admission, Vec<sdk::Model>) {
        let models = vec![cpu()];
        let a = Admission::new(slo_us, audit, vec![WorkerAdmission::new(&models, &[0])]);
        (a, models)
    }

    #[test]
    fn a_request_is_admitted_when_it_and_those_behind_make_their_deadlines() {
        let (a, models) = one_worker(400, 0.0);
        let load = LoadWindow::new(500_000);
        let place = |now, running| Place {
            worker: 0,
            models: &models,
            shared: false,
            in_flight: move |_| running,
            load: &load,
            now,
        };
        // Idle: 104 µs, well within 400.
        let v = a.verdict(&place(1_000, 0), 0, (1_400, 1_000), []);
        assert!(v.admitted && v.on_time);
        assert_eq!((v.ahead, v.predicted[LAST], v.judged.wait_us), (0, 104.0, 104.0));
        assert_eq!(v.prediction(1_000), Prediction { finish: [1_104; PREDICTORS], ahead: 0 });
        // Three queued behind a running one (its batch, started at 0, has overrun
        // its profile: nothing is left of it): 4 × 104 past 400.
        let v = a.verdict(&place(1_000, 1), 3, (1_400, 1_000), []);
        assert!(!v.admitted && !v.on_time);
        assert_eq!(v.ahead, 4);
        // On time itself at the head, but the one behind it, due at 1 200, is
        // pushed past its deadline (2 × 104 from now).
        let v = a.verdict(&place(1_000, 1), 0, (1_400, 1_000), [1_200]);
        assert!(v.on_time && !v.admitted);
        assert!(a.verdict(&place(1_000, 1), 0, (1_400, 1_000), [1_400]).admitted);
        // Shared queue: two workers' running batches counted as queued, halved.
        let two =
            Admission::new(400, 0.0, vec![WorkerAdmission::new(&models, &[0]), WorkerAdmission::new(&models, &[0])]);
        let shared = Place { worker: 0, models: &models, shared: true, in_flight: |_| 1, load: &load, now: 0 };
        assert_eq!(two.prediction(&shared, 2).0, 2);
    }

    #[test]
    fn answers_teach_each_predictor_its_margin_and_a_swap_forgets_them() {
        let (a, models) = one_worker(400_000, 0.0);
        assert_eq!(a.margin_us(), 0.0);
        // Answers 3 ms later than every predictor said, alone at the worker.
        let late = |finish: u64| Prediction { finish: [finish; PREDICTORS], ahead: 0 };
        a.learn(10_000, [late(7_000), late(7_000)].into_iter());
        assert_eq!(a.margin_us(), 3_000.0);
        // The margin counts in the wait of a request with nobody ahead.
        let load = LoadWindow::new(500_000);
        let place = Place { worker: 0, models: &models, shared: false, in_flight: |_| 0, load: &load, now: 0 };
        let v = a.verdict(&place, 0, (400_000, 0), []);
        assert_eq!(v.judged, Judged { wait_us: 104.0 + 3_000.0, margin_us: 3_000.0 });
        // Requests admission did not predict teach nothing.
        a.learn(90_000, [Prediction::default()].into_iter());
        assert_eq!(a.margin_us(), 3_000.0);
        // The answering time is kept back too (live only), up to an eighth of the SLO.
        a.record_edge(2_000);
        assert_eq!((a.edge_us(), a.margin_us()), (2_000, 5_000.0));
        a.forget_errors();
        assert_eq!(a.margin_us(), 2_000.0, "the edge is the front's, not the policy's");
    }

    #[test]
    fn the_audit_admits_every_kth_refusal() {
        let (a, _) = one_worker(400, 0.25);
        let sampled: Vec<bool> = (0..8).map(|_| a.audits()).collect();
        assert_eq!(sampled, [false, false, false, true, false, false, false, true]);
        let (none, _) = one_worker(400, 0.0);
        assert!(!(0..100).any(|_| none.audits()));
    }

    #[test]
    fn margins_worked_out_again_only_where_a_band_changed_are_the_same() {
        let (mut cached, mut afresh) = (BandedErrors::default(), BandedErrors::default());
        let mut x: u64 = 5;
        for step in 0..3_000 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            // Shallow bands often, deep ones rarely: pools that change and stop.
            let band = [0, 0, 0, 1, 1, 2, 3, 4, 6][(x >> 60) as usize % 9];
            let error = ((x >> 20) % 50_000) as i64 - 10_000;
            cached.record(band, error, 0);
            afresh.record(band, error, 0);
            if step % 3 == 0 {
                afresh.dirty = u8::MAX;
                assert_eq!(cached.margins(), afresh.margins(), "after {step} errors");
            }
        }
    }
}
