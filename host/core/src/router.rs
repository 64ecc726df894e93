//! Routing inside one app: which worker's queue gets the next request, and the
//! arrival-rate estimate policies see. The live host (`App::submit` in
//! `sluice_server::app`) and the simulator's event loop both route with these.

use std::collections::VecDeque;

use parking_lot::Mutex;
use serde::Deserialize;

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
}

/// The router: which worker's queue gets the next request. `arrival` counts the
/// app's arrivals (round-robin sends arrival `i` to worker `i mod K`); `load_of(w)`
/// is what worker `w` has queued and in flight (shortest-queue picks the least
/// loaded, the lowest index on ties); in `shared` mode every worker pulls from one
/// queue, which is worker 0's. The live host and the simulator both route with it.
pub fn pick_worker(mode: RouterMode, arrival: usize, workers: usize, load_of: impl Fn(usize) -> usize) -> usize {
    match mode {
        RouterMode::RoundRobin => arrival % workers.max(1),
        RouterMode::Shared => 0,
        RouterMode::ShortestQueue => (0..workers).min_by_key(|&w| load_of(w)).unwrap_or(0),
    }
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
