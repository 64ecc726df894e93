//! Routing inside one app: which worker's queue gets the next request, and the
//! arrival-rate estimate policies see. The live host (`App::submit` in
//! `sluice_server::app`) and the simulator's event loop both route with these.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;
use serde::Deserialize;
use thiserror::Error;

/// How an app's arrivals are spread over its workers.
#[derive(Clone, Copy, Debug, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum RouterMode {
    /// Worker `i mod K` gets the i-th request (RAMSIS's load balancer).
    #[default]
    RoundRobin,
    /// The worker with the fewest queued requests (RAMSIS Appendix I).
    ShortestQueue,
    /// One FIFO shared by all workers; idle workers pull (Jellyfish+).
    Shared,
    /// Worker w gets a share weights[w] / Σ weights of the arrivals, spread evenly
    /// (smooth weighted round-robin); the weights change at run time — how an
    /// allocator's routing shares reach the workers.
    Weighted,
}

/// An app's router: which worker's queue gets the next request. Round-robin sends
/// the app's i-th arrival to worker `i mod K`; shortest-queue picks the worker with
/// the least queued and in flight (`load_of`), the lowest index on ties; in
/// `shared` mode every worker pulls from one queue, which is worker 0's; weighted
/// spreads arrivals in proportion to the weights, evenly in time. The live host and
/// the simulator both route with it.
pub struct Router {
    mode: RouterMode,
    workers: usize,
    next: AtomicUsize,
    weighted: Mutex<Smooth>,
}

/// Smooth weighted round-robin (nginx's): every pick adds each worker's weight to
/// its credit, takes the worker with the most credit and charges it the total. Over
/// any run of picks a worker's count stays within one of its exact share, so a
/// worker given a share is never starved and one given none never receives any.
struct Smooth {
    weights: Vec<f64>,
    credit: Vec<f64>,
}

/// One pick of a smooth weighted round-robin (nginx's): adds each entry's weight to
/// its credit, takes the entry with the most credit and charges it the total. The
/// live router's weighted mode and the simulator's smooth pipeline routing
/// (`routing = "smooth"`) both pick with it. Ties go to the lowest index, and an
/// entry with weight 0 only ties when every credit is equal (never picked while
/// another has weight, since its credit only falls). `credit` starts at zeros, one
/// per weight.
pub fn smooth_pick(weights: &[f64], credit: &mut [f64]) -> usize {
    let total: f64 = weights.iter().sum();
    for (c, w) in credit.iter_mut().zip(weights) {
        *c += w;
    }
    let mut best = 0;
    for w in 1..credit.len() {
        if credit[w] > credit[best] || (weights[best] == 0.0 && weights[w] > 0.0 && credit[w] == credit[best]) {
            best = w;
        }
    }
    credit[best] -= total;
    best
}

/// Weights that cannot be used.
#[derive(Debug, Error, PartialEq)]
pub enum WeightsError {
    /// Not one weight per worker.
    #[error("expected {expected} weights (one per worker), got {got}")]
    Count {
        /// Workers.
        expected: usize,
        /// Weights given.
        got: usize,
    },
    /// A negative or non-finite weight, or all zero.
    #[error("weights must be finite, non-negative, and not all zero")]
    Values,
    /// Weights for a router that does not use them.
    #[error("weights apply to router = \"weighted\", not {0:?}")]
    NotWeighted(RouterMode),
}

impl Router {
    /// A router over `workers` workers with equal weights.
    pub fn equal(mode: RouterMode, workers: usize) -> Router {
        Router {
            mode,
            workers: workers.max(1),
            next: AtomicUsize::new(0),
            weighted: Mutex::new(Smooth { weights: vec![1.0; workers.max(1)], credit: vec![0.0; workers.max(1)] }),
        }
    }

    /// A router over `workers` workers; `weights` (weighted mode only; default: equal).
    pub fn new(mode: RouterMode, workers: usize, weights: Option<&[f64]>) -> Result<Router, WeightsError> {
        let router = Router::equal(mode, workers);
        if let Some(w) = weights {
            router.set_weights(w)?;
        }
        Ok(router)
    }

    /// The mode.
    pub fn mode(&self) -> RouterMode {
        self.mode
    }

    /// The worker whose queue gets the next arrival.
    pub fn pick(&self, load_of: impl Fn(usize) -> usize) -> usize {
        match self.mode {
            RouterMode::RoundRobin => self.next.fetch_add(1, Ordering::Relaxed) % self.workers,
            RouterMode::Shared => 0,
            RouterMode::ShortestQueue => (0..self.workers).min_by_key(|&w| load_of(w)).unwrap_or(0),
            RouterMode::Weighted => {
                let mut s = self.weighted.lock();
                let Smooth { weights, credit } = &mut *s;
                smooth_pick(weights, credit)
            }
        }
    }

    /// Replaces the weights (weighted mode): takes effect from the next arrival.
    /// Credits restart, so a new plan's shares hold from its first request.
    pub fn set_weights(&self, weights: &[f64]) -> Result<(), WeightsError> {
        if self.mode != RouterMode::Weighted {
            return Err(WeightsError::NotWeighted(self.mode));
        }
        check_weights(weights, self.workers)?;
        let mut s = self.weighted.lock();
        s.weights = weights.to_vec();
        s.credit = vec![0.0; weights.len()];
        Ok(())
    }

    /// The weights in force (equal ones outside weighted mode).
    pub fn weights(&self) -> Vec<f64> {
        self.weighted.lock().weights.clone()
    }
}

/// Checks a weight vector for `workers` workers.
pub fn check_weights(weights: &[f64], workers: usize) -> Result<(), WeightsError> {
    if weights.len() != workers {
        return Err(WeightsError::Count { expected: workers, got: weights.len() });
    }
    if weights.iter().any(|w| !w.is_finite() || *w < 0.0) || weights.iter().sum::<f64>() <= 0.0 {
        return Err(WeightsError::Values);
    }
    Ok(())
}

/// Arrival-rate estimate over a sliding window (RAMSIS §6: 500 ms by default).
pub struct LoadMonitor {
    window_us: u64,
    arrivals: Mutex<VecDeque<u64>>,
}

impl LoadMonitor {
    /// A monitor over `window_us`.
    pub fn new(window_us: u64) -> LoadMonitor {
        LoadMonitor { window_us, arrivals: Mutex::new(VecDeque::new()) }
    }

    /// Records an arrival at `now`.
    pub fn record(&self, now: u64) {
        let mut a = self.arrivals.lock();
        a.push_back(now);
        while a.front().is_some_and(|t| *t + self.window_us < now) {
            a.pop_front();
        }
    }

    /// Requests per second over the window ending at `now`.
    pub fn rate(&self, now: u64) -> f64 {
        let mut a = self.arrivals.lock();
        while a.front().is_some_and(|t| *t + self.window_us < now) {
            a.pop_front();
        }
        a.len() as f64 * 1e6 / self.window_us as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(r: &Router, n: usize, workers: usize) -> Vec<usize> {
        let mut c = vec![0; workers];
        for _ in 0..n {
            c[r.pick(|_| 0)] += 1;
        }
        c
    }

    #[test]
    fn smooth_pick_spreads_shares_exactly_and_never_picks_a_zero_weight() {
        let weights = [0.5, 0.0, 0.25, 0.25];
        let mut credit = [0.0; 4];
        let picks: Vec<usize> = (0..8).map(|_| smooth_pick(&weights, &mut credit)).collect();
        assert_eq!(picks, [0, 2, 3, 0, 0, 2, 3, 0]);
    }

    #[test]
    fn round_robin_and_shortest_queue() {
        let r = Router::new(RouterMode::RoundRobin, 3, None).unwrap();
        assert_eq!((0..5).map(|_| r.pick(|_| 0)).collect::<Vec<_>>(), vec![0, 1, 2, 0, 1]);
        let r = Router::new(RouterMode::ShortestQueue, 3, None).unwrap();
        assert_eq!(r.pick(|w| [4, 1, 1][w]), 1);
        assert_eq!(Router::new(RouterMode::Shared, 3, None).unwrap().pick(|_| 0), 0);
    }

    #[test]
    fn weighted_follows_the_weights_evenly() {
        let r = Router::new(RouterMode::Weighted, 3, Some(&[5.0, 1.0, 1.0])).unwrap();
        // 5:1:1 and spread out: a, a, b, a, c, a, a (nginx's sequence).
        let seq: Vec<usize> = (0..7).map(|_| r.pick(|_| 0)).collect();
        assert_eq!(seq, vec![0, 0, 1, 0, 2, 0, 0]);
        assert_eq!(counts(&r, 700, 3), vec![500, 100, 100]);
        // Prefix counts stay within one of the exact share.
        let r = Router::new(RouterMode::Weighted, 3, Some(&[0.5, 0.3, 0.2])).unwrap();
        let mut c = [0usize; 3];
        for i in 1..=1000 {
            c[r.pick(|_| 0)] += 1;
            for (w, share) in [0.5, 0.3, 0.2].iter().enumerate() {
                assert!((c[w] as f64 - share * i as f64).abs() <= 1.0 + 1e-9, "pick {i}: {c:?}");
            }
        }
    }

    #[test]
    fn a_zero_weight_gets_nothing_and_new_weights_apply_at_once() {
        let r = Router::new(RouterMode::Weighted, 3, Some(&[0.0, 1.0, 1.0])).unwrap();
        assert_eq!(counts(&r, 100, 3), vec![0, 50, 50]);
        r.set_weights(&[1.0, 0.0, 0.0]).unwrap();
        assert_eq!(counts(&r, 10, 3), vec![10, 0, 0]);
        assert_eq!(r.weights(), vec![1.0, 0.0, 0.0]);
    }

    #[test]
    fn bad_weights_are_refused() {
        let r = Router::new(RouterMode::Weighted, 2, None).unwrap();
        assert_eq!(r.set_weights(&[1.0]), Err(WeightsError::Count { expected: 2, got: 1 }));
        assert_eq!(r.set_weights(&[0.0, 0.0]), Err(WeightsError::Values));
        assert_eq!(r.set_weights(&[-1.0, 2.0]), Err(WeightsError::Values));
        assert_eq!(r.set_weights(&[f64::NAN, 2.0]), Err(WeightsError::Values));
        let rr = Router::new(RouterMode::RoundRobin, 2, None).unwrap();
        assert_eq!(rr.set_weights(&[1.0, 1.0]), Err(WeightsError::NotWeighted(RouterMode::RoundRobin)));
    }
}
