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
#[derive(Clone)]
struct Smooth {
    weights: Vec<f64>,
    credit: Vec<f64>,
}

/// The picks a [`Router`] will make, taken here without taking them there
/// ([`Router::upcoming`]): what the live precheck reads to place the requests it
/// has let in but not yet routed ([`Router::place_unrouted`]).
pub struct Upcoming {
    mode: RouterMode,
    workers: usize,
    /// Round-robin's next turn.
    next: usize,
    /// Weighted's weights and credits (weighted mode only).
    smooth: Option<Smooth>,
}

impl Upcoming {
    /// The worker the next arrival would be routed to, as [`Router::pick`] would
    /// give it; shortest-queue reads `load_of` as it is by then (the caller counts
    /// the arrivals placed before it).
    pub fn pick(&mut self, load_of: impl Fn(usize) -> usize) -> usize {
        match (self.mode, &mut self.smooth) {
            (RouterMode::Weighted, Some(Smooth { weights, credit })) => smooth_pick(weights, credit),
            (RouterMode::RoundRobin, _) => {
                let w = self.next % self.workers;
                self.next = self.next.wrapping_add(1);
                w
            }
            (RouterMode::ShortestQueue, _) => shortest(self.workers, load_of),
            _ => 0,
        }
    }
}

/// The worker with the least `load_of` among `workers`, the lowest index on ties.
fn shortest(workers: usize, load_of: impl Fn(usize) -> usize) -> usize {
    (0..workers).min_by_key(|&w| load_of(w)).unwrap_or(0)
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
            RouterMode::ShortestQueue => shortest(self.workers, load_of),
            RouterMode::Weighted => {
                let mut s = self.weighted.lock();
                let Smooth { weights, credit } = &mut *s;
                smooth_pick(weights, credit)
            }
        }
    }

    /// The picks to come, in order, without taking any: round-robin's and
    /// weighted's turns here stay where they are (weighted's credits are copied
    /// once, so the lock is held for the copy only).
    pub fn upcoming(&self) -> Upcoming {
        let smooth = (self.mode == RouterMode::Weighted).then(|| self.weighted.lock().clone());
        Upcoming { mode: self.mode, workers: self.workers, next: self.next.load(Ordering::Relaxed), smooth }
    }

    /// Counts in `queued` (per worker) where `n` arrivals not yet routed will be
    /// queued when they are, in the order they came: each at the worker the router
    /// will pick for it ([`Router::upcoming`], shortest-queue reading `queued` plus
    /// `in_flight`), or the first fallback that takes it ([`Router::offer`]);
    /// `takes(w, ahead)` says whether worker `w` would take one with `ahead`
    /// queued before it. One no worker takes is refused and counts nowhere.
    ///
    /// The live host's precheck places the requests whose bodies are still being
    /// read with it. It placed each on the worker that would finish it first,
    /// which shortest-queue routing (by count, the lowest index on ties) often
    /// does not: at 90 % of jellyfish's capacity a request behind one still being
    /// parsed was predicted third in line at both workers, and refused before its
    /// body was read, while the router then sent the other to worker 0 and this
    /// one, two deep at worker 1, would have been admitted (BENCHMARKS §12).
    pub fn place_unrouted(
        &self,
        n: usize,
        queued: &mut [usize],
        in_flight: impl Fn(usize) -> usize,
        takes: impl Fn(usize, usize) -> bool,
    ) {
        let mut upcoming = self.upcoming();
        for _ in 0..n {
            let taker = {
                let queued = &*queued;
                let load_of = |w: usize| queued[w] + in_flight(w);
                let picked = upcoming.pick(load_of);
                let offer = |w: usize, ()| if takes(w, queued[w]) { Ok(()) } else { Err(((), ())) };
                self.offer(picked, load_of, (), offer, |_| 0.0)
            };
            if let Ok((w, ())) = taker {
                queued[w] += 1;
            }
        }
    }

    /// The workers to ask, in turn, after `picked` would refuse a request (admission
    /// by deadline): in `shortest-queue` mode the others, least queued and in flight
    /// first (`load_of`), the lowest index on ties; none in the other modes.
    ///
    /// Shortest-queue routing counts requests, and two workers with as many ahead
    /// can be a batch apart: one whose pair just started, one whose pair is about
    /// to end. Judged at the first alone, a request was refused while the other
    /// would have served it by its deadline (BENCHMARKS §12). Round-robin and
    /// weighted routing keep their assignment: a worker's share of the arrivals is
    /// what RAMSIS's policy was solved for and what the allocator placed, and a
    /// simulated run split by worker relies on it ([`RouterMode`]); `shared` has
    /// one queue.
    pub fn fallbacks(&self, picked: usize, load_of: impl Fn(usize) -> usize) -> Vec<usize> {
        if self.mode != RouterMode::ShortestQueue {
            return Vec::new();
        }
        let mut others: Vec<usize> = (0..self.workers).filter(|&w| w != picked).collect();
        // Stable: ties keep the lowest index first.
        others.sort_by_key(|&w| load_of(w));
        others
    }

    /// Offers an arrival to worker `picked`, then to each of [`Router::fallbacks`]
    /// in turn (worked out only after `picked` refused it, with `load_of`), until
    /// one takes it. `offer(w, item)` takes the item (`Ok`, with what taking it
    /// gave) or hands it back with its refusal (`Err`). The worker that took it,
    /// or the item back with the worker whose refusal had the least `wait` (the
    /// first on ties) and that refusal. The live host (under each queue's lock)
    /// and the simulator place a client request with it.
    pub fn offer<I, T, R>(
        &self,
        picked: usize,
        load_of: impl Fn(usize) -> usize,
        item: I,
        mut offer: impl FnMut(usize, I) -> Result<T, (I, R)>,
        wait: impl Fn(&R) -> f64,
    ) -> Result<(usize, T), (I, usize, R)> {
        let (mut item, mut soonest) = match offer(picked, item) {
            Ok(taken) => return Ok((picked, taken)),
            Err((item, refusal)) => (item, (picked, refusal)),
        };
        for w in self.fallbacks(picked, load_of) {
            match offer(w, item) {
                Ok(taken) => return Ok((w, taken)),
                Err((back, refusal)) => {
                    item = back;
                    if wait(&refusal) < wait(&soonest.1) {
                        soonest = (w, refusal);
                    }
                }
            }
        }
        Err((item, soonest.0, soonest.1))
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

/// The arrivals in a sliding window and the rate they give: the host's load
/// estimate (RAMSIS §6: 500 ms by default). One value, read by the policies (the
/// rate), by admission (the arrival times, which say what the policies will read
/// next: `crate::admission::LoadForecast`), live behind [`LoadMonitor`]'s lock
/// and in the simulator on its one thread.
#[derive(Clone, Debug)]
pub struct LoadWindow {
    window_us: u64,
    /// Arrival times, oldest first (µs on the app's clock); those older than the
    /// window leave at the next record or [`LoadWindow::rate`].
    arrivals: VecDeque<u64>,
}

impl LoadWindow {
    /// An empty window of `window_us`.
    pub fn new(window_us: u64) -> LoadWindow {
        LoadWindow { window_us, arrivals: VecDeque::new() }
    }

    /// Records an arrival at `now`.
    pub fn record(&mut self, now: u64) {
        self.arrivals.push_back(now);
        self.expire(now);
    }

    /// Requests per second over the window ending at `now`, dropping the arrivals
    /// that left it.
    pub fn rate(&mut self, now: u64) -> f64 {
        self.expire(now);
        self.arrivals.len() as f64 * 1e6 / self.window_us as f64
    }

    /// As [`LoadWindow::rate`], for a reader that only borrows the window: the
    /// arrivals at `t` with `t + window >= now`.
    pub fn rate_at(&self, now: u64) -> f64 {
        let gone = self.arrivals.partition_point(|&t| t.saturating_add(self.window_us) < now);
        (self.arrivals.len() - gone) as f64 * 1e6 / self.window_us as f64
    }

    /// The arrival times still kept, oldest first (µs on the app's clock).
    pub fn arrivals(&self) -> &VecDeque<u64> {
        &self.arrivals
    }

    /// The window's length, µs.
    pub fn window_us(&self) -> u64 {
        self.window_us
    }

    fn expire(&mut self, now: u64) {
        while self.arrivals.front().is_some_and(|t| t.saturating_add(self.window_us) < now) {
            self.arrivals.pop_front();
        }
    }
}

/// The live host's [`LoadWindow`], shared by the threads that record arrivals
/// and those that read the rate or, for admission, the window itself.
pub struct LoadMonitor {
    window: Mutex<LoadWindow>,
}

impl LoadMonitor {
    /// A monitor over `window_us`.
    pub fn new(window_us: u64) -> LoadMonitor {
        LoadMonitor { window: Mutex::new(LoadWindow::new(window_us)) }
    }

    /// Records an arrival at `now`.
    pub fn record(&self, now: u64) {
        self.window.lock().record(now);
    }

    /// Requests per second over the window ending at `now`.
    pub fn rate(&self, now: u64) -> f64 {
        self.window.lock().rate(now)
    }

    /// The window, held until the guard drops: admission reads it while it
    /// judges a request (under the worker queue's lock, which is always taken
    /// first: nothing takes a queue's lock while holding this one).
    pub fn window(&self) -> parking_lot::MutexGuard<'_, LoadWindow> {
        self.window.lock()
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
    fn the_window_keeps_what_the_estimate_counts_and_both_rates_agree() {
        let mut load = LoadWindow::new(500_000);
        load.record(0);
        assert_eq!((load.rate_at(0), load.clone().rate(0)), (2.0, 2.0));
        // An arrival at t counts while t + window >= now.
        load.record(400_000);
        load.record(500_000);
        assert_eq!(load.arrivals(), &[0, 400_000, 500_000]);
        load.record(500_001);
        assert_eq!(load.arrivals(), &[400_000, 500_000, 500_001]);
        // Borrowed, the rate counts as the expiring one does, and expires nothing.
        for now in [500_001, 900_000, 900_001, 1_000_002] {
            assert_eq!(load.rate_at(now), load.clone().rate(now), "at {now}");
        }
        assert_eq!((load.rate_at(900_000), load.rate_at(900_001)), (6.0, 4.0));
        assert_eq!(load.arrivals().len(), 3);
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
    fn upcoming_sees_the_picks_to_come_without_taking_them() {
        let r = Router::new(RouterMode::RoundRobin, 3, None).unwrap();
        r.pick(|_| 0);
        let mut up = r.upcoming();
        assert_eq!((0..4).map(|_| up.pick(|_| 0)).collect::<Vec<_>>(), vec![1, 2, 0, 1]);
        assert_eq!(r.pick(|_| 0), 1, "peeking took no turn");
        let r = Router::new(RouterMode::Weighted, 3, Some(&[5.0, 1.0, 1.0])).unwrap();
        let mut up = r.upcoming();
        let peeked: Vec<usize> = (0..7).map(|_| up.pick(|_| 0)).collect();
        assert_eq!(peeked, (0..7).map(|_| r.pick(|_| 0)).collect::<Vec<_>>());
        let r = Router::new(RouterMode::ShortestQueue, 3, None).unwrap();
        assert_eq!(r.upcoming().pick(|w| [2, 1, 1][w]), 1);
        let mut up = Router::new(RouterMode::Shared, 3, None).unwrap().upcoming();
        assert_eq!((0..3).map(|_| up.pick(|_| 0)).collect::<Vec<_>>(), vec![0, 0, 0]);
    }

    #[test]
    fn unrouted_arrivals_count_where_the_router_will_queue_them() {
        // Shortest-queue by count, the lowest index on ties: two arrivals on two
        // idle-queued workers go one to each, whatever either would finish first.
        let r = Router::new(RouterMode::ShortestQueue, 2, None).unwrap();
        let mut queued = [1, 1];
        r.place_unrouted(2, &mut queued, |_| 2, |_, _| true);
        assert_eq!(queued, [2, 2]);
        // Worker 0 picked but full (two ahead refuse): the fallback takes it; one
        // nobody takes counts nowhere.
        let mut queued = [2, 3];
        r.place_unrouted(1, &mut queued, |_| 0, |w, ahead| w == 1 || ahead < 2);
        assert_eq!(queued, [2, 4]);
        let mut queued = [2, 3];
        r.place_unrouted(3, &mut queued, |_| 0, |_, ahead| ahead < 4);
        assert_eq!(queued, [4, 4]);
        // Round-robin: the turns to come, no fallback.
        let r = Router::new(RouterMode::RoundRobin, 3, None).unwrap();
        r.pick(|_| 0);
        let mut queued = [0, 0, 0];
        r.place_unrouted(4, &mut queued, |_| 0, |w, _| w != 2);
        assert_eq!(queued, [1, 2, 0]);
    }

    #[test]
    fn only_shortest_queue_falls_back_to_the_others_least_loaded_first() {
        let r = Router::new(RouterMode::ShortestQueue, 4, None).unwrap();
        assert_eq!(r.fallbacks(1, |w| [3, 1, 0, 3][w]), vec![2, 0, 3]);
        assert_eq!(Router::new(RouterMode::ShortestQueue, 1, None).unwrap().fallbacks(0, |_| 0), Vec::<usize>::new());
        for mode in [RouterMode::RoundRobin, RouterMode::Shared, RouterMode::Weighted] {
            assert!(Router::new(mode, 4, None).unwrap().fallbacks(0, |_| 0).is_empty(), "{mode:?}");
        }
    }

    #[test]
    fn an_arrival_goes_to_the_first_that_takes_it_else_back_with_the_soonest_refusal() {
        let r = Router::new(RouterMode::ShortestQueue, 3, None).unwrap();
        let load = |w: usize| [1, 2, 0][w];
        // Worker 0 picked and refusing: worker 2 (least loaded) is asked next.
        let mut asked = Vec::new();
        let taken = r.offer(
            0,
            load,
            "req",
            |w, i| {
                asked.push(w);
                if w == 1 {
                    Ok(w * 10)
                } else {
                    Err((i, 5.0))
                }
            },
            |&x| x,
        );
        assert_eq!((taken, asked), (Ok((1, 10)), vec![0, 2, 1]));
        // Nobody takes it: back with the least wait, the first on ties.
        let waits = [3.0, 1.0, 1.0];
        let back = r.offer(0, load, "req", |w, i| Err::<(), _>((i, waits[w])), |&x| x);
        assert_eq!(back, Err(("req", 2, 1.0)));
        // Taken by the pick: the fallbacks are not worked out.
        let taken = r.offer(0, |_| unreachable!("no fallback needed"), (), |w, ()| Ok::<_, ((), f64)>(w), |&x| x);
        assert_eq!(taken, Ok((0, 0)));
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
