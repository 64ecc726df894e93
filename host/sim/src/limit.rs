//! The limit of the held rate (issue 36): how many requests of a known arrival
//! sequence *any* scheduler could finish within the SLO, and the highest rate at
//! which that is still ≥ 99 % of them.
//!
//! The setting is the one the live host and the simulator serve: `workers`
//! identical workers, batches of at most `latency_us.len()` requests whose
//! latency is `latency_us[b - 1]` (the profile's table at the app's percentile,
//! deterministic as in the emulated executor), one SLO for every request. The
//! scheduler here is clairvoyant: it knows every arrival and chooses the batches
//! offline, so no online policy does better on the same arrivals.
//!
//! 1. [`Setting`]: the workers, the latency table, the SLO.
//! 2. [`min_misses`]: the exact optimum on one arrival sequence, the fewest
//!    requests that cannot be finished on time, by a dynamic programme over
//!    (next request, the workers' free times) described there.
//! 3. [`on_time_fraction`]: the same over several sequences (seeds), pooled.
//! 4. [`highest_held`]: the coarse-then-fine search on the rate that the bench
//!    uses both for this bound and for the policies (simulated or live).
//!
//! # Why arrival-order batches suffice
//!
//! With one SLO for all, a request's deadline is its arrival plus the SLO, so
//! earliest-deadline-first is first-come-first-served. Take any schedule and two
//! batches X before Y in time (on one worker, or started in that order on two)
//! where some request of Y arrived before some request of X: swapping the two
//! requests keeps both batch sizes, does not move either batch's ready time
//! later (a batch is ready when its last request has arrived) and does not move
//! either batch's deadline earlier (the earliest arrival in it), so nothing that
//! was on time becomes late. Repeating the swap, the served requests go into
//! batches in arrival order: every batch is a contiguous run of the *served*
//! subsequence. A run that skips a dropped request is no better than dropping
//! the run's earliest requests instead (same count dropped, the same ready time,
//! a later deadline), so batches can be taken as contiguous runs of the whole
//! sequence, the requests between them dropped. A batch starts when both its
//! worker is free and its last request has arrived: starting later only makes
//! the worker free later. Which worker takes a batch is the one choice left, and
//! the programme tries each. So the figure [`min_misses`] returns is the exact
//! optimum over every non-preemptive schedule of the setting (the unit tests
//! check it against an enumeration of every schedule on small cases).

use thiserror::Error;

/// Why the bound cannot be computed.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum LimitError {
    /// No worker.
    #[error("limit: at least one worker is required")]
    NoWorkers,
    /// An empty latency table (no batch size).
    #[error("limit: the latency table is empty")]
    EmptyTable,
    /// Arrivals out of time order.
    #[error("limit: arrivals must be in time order (request {index} arrives before request {})", index - 1)]
    Unsorted {
        /// The first request that arrives before its predecessor.
        index: usize,
    },
    /// The programme's frontier outgrew [`MAX_LABELS`] at one request: the
    /// arrivals are too dense for an exact answer in bounded memory.
    #[error("limit: more than {MAX_LABELS} non-dominated states at request {index}")]
    TooLarge {
        /// The request at which it happened.
        index: usize,
    },
}

/// Most non-dominated states the programme keeps at one request before it gives
/// up ([`LimitError::TooLarge`]). Near the held rate the frontier holds tens of
/// states (it collapses whenever every worker falls idle); a million means the
/// arrivals are far past capacity, where the question is moot.
pub const MAX_LABELS: usize = 1_000_000;

/// The serving setting the bound is computed for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setting {
    /// Identical workers.
    pub workers: usize,
    /// Batch latency, µs: `latency_us[b - 1]` for a batch of `b`; its length is the
    /// largest batch. Any table is allowed (not necessarily increasing).
    pub latency_us: Vec<u64>,
    /// The SLO, µs: a request arriving at `t` is on time when its batch ends by `t + slo_us`.
    pub slo_us: u64,
}

impl Setting {
    fn check(&self) -> Result<(), LimitError> {
        if self.workers == 0 {
            return Err(LimitError::NoWorkers);
        }
        if self.latency_us.is_empty() {
            return Err(LimitError::EmptyTable);
        }
        Ok(())
    }
}

/// A state of the programme: requests dropped so far and the workers' free times,
/// sorted (the workers are identical, so only the multiset matters).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Label {
    drops: usize,
    free: Vec<u64>,
}

impl Label {
    /// Whether `self` is at least as good as `other` in every respect: no more
    /// drops and every worker (in sorted order) free no later. Sorted
    /// component-wise order is the right one for identical workers: the k-th
    /// earliest worker of `self` can do whatever the k-th of `other` does.
    fn dominates(&self, other: &Label) -> bool {
        self.drops <= other.drops && self.free.iter().zip(&other.free).all(|(a, b)| a <= b)
    }
}

/// The Pareto-minimal labels of `labels`. Sorted by drops then free times, a
/// label can only be dominated by one before it (or an equal one), so one pass
/// against those kept is enough.
fn pareto(mut labels: Vec<Label>) -> Vec<Label> {
    labels.sort_unstable();
    labels.dedup();
    let mut kept: Vec<Label> = Vec::with_capacity(labels.len());
    for l in labels {
        if !kept.iter().any(|k| k.dominates(&l)) {
            kept.push(l);
        }
    }
    kept
}

/// The fewest requests of `arrivals` (µs, in time order) that no schedule of
/// `setting` finishes within the SLO: the exact clairvoyant optimum (see the
/// module's comment for why arrival-order batches lose nothing). `Ok(None)` when
/// that number exceeds `cap`: states with more than `cap` drops are pruned, which
/// is what keeps a "does it hold 99 %?" question cheap.
///
/// The programme walks the requests in arrival order. Its states at request `i`
/// are (requests dropped so far, the workers' sorted free times), free times
/// raised to `arrivals[i]` (no batch from `i` on can start earlier, so states
/// that differ only before then are the same state, which is what collapses the
/// frontier whenever the workers fall idle). From each state: drop request `i`,
/// or serve `i..i + b` as one batch on any worker, ready at `arrivals[i + b - 1]`,
/// due by `arrivals[i] + slo_us`, when it ends in time. Dominated states are
/// pruned at every request ([`Label::dominates`]), which loses nothing: a
/// dominating state can copy every continuation of the one it dominates.
pub fn min_misses(setting: &Setting, arrivals: &[u64], cap: usize) -> Result<Option<usize>, LimitError> {
    setting.check()?;
    if let Some(index) = arrivals.windows(2).position(|w| w[1] < w[0]) {
        return Err(LimitError::Unsorted { index: index + 1 });
    }
    let n = arrivals.len();
    let max_batch = setting.latency_us.len();
    // States by the request they stand before; only the next `max_batch` are ever
    // filled, but one slot per request keeps the indexing plain.
    let mut buckets: Vec<Vec<Label>> = vec![Vec::new(); n + 1];
    buckets[0].push(Label { drops: 0, free: vec![0; setting.workers] });
    for i in 0..n {
        let now = arrivals[i];
        let mut labels = std::mem::take(&mut buckets[i]);
        for l in &mut labels {
            for f in &mut l.free {
                *f = (*f).max(now);
            }
            l.free.sort_unstable();
        }
        let labels = pareto(labels);
        if labels.len() > MAX_LABELS {
            return Err(LimitError::TooLarge { index: i });
        }
        let deadline = now + setting.slo_us;
        for l in &labels {
            if l.drops < cap {
                buckets[i + 1].push(Label { drops: l.drops + 1, free: l.free.clone() });
            }
            for b in 1..=max_batch.min(n - i) {
                let ready = arrivals[i + b - 1];
                let latency = setting.latency_us[b - 1];
                if ready.saturating_add(latency) > deadline {
                    // Not even an idle worker finishes this batch in time; a larger
                    // one is ready no earlier but may be faster (any table is
                    // allowed), so look on.
                    continue;
                }
                for k in 0..l.free.len() {
                    // Equal free times are the same choice.
                    if k > 0 && l.free[k] == l.free[k - 1] {
                        continue;
                    }
                    let end = l.free[k].max(ready) + latency;
                    if end <= deadline {
                        let mut free = l.free.clone();
                        free[k] = end;
                        buckets[i + b].push(Label { drops: l.drops, free });
                    }
                }
            }
        }
    }
    Ok(buckets[n].iter().map(|l| l.drops).min())
}

/// The on-time fraction the clairvoyant optimum reaches over several arrival
/// sequences pooled (on time / arrivals, all sequences together), or `None` when
/// it is below `target` (the search stops early then). With no arrivals at all
/// the fraction is 1.
pub fn on_time_fraction(setting: &Setting, traces: &[Vec<u64>], target: f64) -> Result<Option<f64>, LimitError> {
    let total: usize = traces.iter().map(Vec::len).sum();
    if total == 0 {
        return Ok(Some(1.0));
    }
    // Misses allowed over all traces together; each trace may use what is left.
    let allowed = ((1.0 - target) * total as f64 + 1e-9).floor().max(0.0) as usize;
    let mut missed = 0;
    for t in traces {
        match min_misses(setting, t, allowed - missed)? {
            Some(m) => missed += m,
            None => return Ok(None),
        }
    }
    Ok(Some(1.0 - missed as f64 / total as f64))
}

/// One rate tried by [`highest_held`].
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Probe {
    /// Offered rate, req/s.
    pub rate: f64,
    /// Whether it was held.
    pub held: bool,
}

/// What [`highest_held`] found.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Held {
    /// The highest rate held (0 when even `start` was not).
    pub rate: f64,
    /// The lowest rate found not held above it (`None` when `max` was held).
    pub failed: Option<f64>,
    /// Every rate tried, in order.
    pub probes: Vec<Probe>,
}

/// The highest rate `holds` accepts: up from `start` in steps of `coarse` until
/// a rate fails (or `max` is reached), or down in the same steps while `start`
/// and the rates below it fail, then bisection between the last held rate and
/// the first failed one until they are within `fine` (below the lowest step, from
/// 0). Starting near the answer (a live search from the simulator's figure) thus
/// costs a few probes whichever side it is on. This assumes holding is
/// monotone in the rate, which it is for the clairvoyant bound on time-scaled
/// arrivals and only roughly for a live server; the probes are returned so a
/// caller can show where it was not.
pub fn highest_held<E>(
    start: f64,
    coarse: f64,
    fine: f64,
    max: f64,
    mut holds: impl FnMut(f64) -> Result<bool, E>,
) -> Result<Held, E> {
    let mut probes = Vec::new();
    let mut probe = |rate: f64, probes: &mut Vec<Probe>| -> Result<bool, E> {
        let held = holds(rate)?;
        probes.push(Probe { rate, held });
        Ok(held)
    };
    let (mut lo, mut hi) = (0.0, None);
    let mut rate = start;
    if probe(rate, &mut probes)? {
        lo = rate;
        while rate < max {
            rate = (rate + coarse).min(max);
            if probe(rate, &mut probes)? {
                lo = rate;
            } else {
                hi = Some(rate);
                break;
            }
        }
    } else {
        hi = Some(rate);
        while rate - coarse > 0.0 {
            rate -= coarse;
            if probe(rate, &mut probes)? {
                lo = rate;
                break;
            }
            hi = Some(rate);
        }
    }
    if let Some(mut h) = hi {
        while h - lo > fine {
            let mid = (lo + h) / 2.0;
            if probe(mid, &mut probes)? {
                lo = mid;
            } else {
                h = mid;
            }
        }
        hi = Some(h);
    }
    Ok(Held { rate: lo, failed: hi, probes })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setting(workers: usize, latency_us: &[u64], slo_us: u64) -> Setting {
        Setting { workers, latency_us: latency_us.to_vec(), slo_us }
    }

    #[test]
    fn one_worker_constant_latency_by_hand() {
        // Service 100, SLO 150. Arrivals 0, 10, 20: the first ends at 100; the next
        // could start at 100 and end at 200 > 160, so one request is all there is:
        // whichever is served, the other two miss.
        let s = setting(1, &[100], 150);
        assert_eq!(min_misses(&s, &[0, 10, 20], 10), Ok(Some(2)));
        // Spaced 100 apart every request makes it.
        assert_eq!(min_misses(&s, &[0, 100, 200, 300], 10), Ok(Some(0)));
        // 0, 60, 120: FIFO ends them at 100, 200 (≤ 210) and 300 (> 270); three need
        // 300 µs on one worker, past the last deadline, so one misses at best.
        assert_eq!(min_misses(&s, &[0, 60, 120], 10), Ok(Some(1)));
        // Serving 0, 60 and 150: 100, 200 ≤ 210, 300 ≤ 300: none missed.
        assert_eq!(min_misses(&s, &[0, 60, 150], 10), Ok(Some(0)));
    }

    #[test]
    fn no_waiting_allowed_by_hand() {
        // Service 100, SLO 100: a request is on time only if it starts the moment
        // it arrives. 0, 50, 100: serving 0 blocks 50 and ends at 100, in time for
        // the request at 100; 50 misses whatever is chosen.
        let s = setting(1, &[100], 100);
        assert_eq!(min_misses(&s, &[0, 50, 100], 10), Ok(Some(1)));
        // SLO 110, 0, 10, 110, 120: three on one worker need 300 µs, past every
        // deadline (the last is 230), so two miss; 0 and 120 (or 10 and 110) make it.
        let s = setting(1, &[100], 110);
        assert_eq!(min_misses(&s, &[0, 10, 110, 120], 10), Ok(Some(2)));
    }

    #[test]
    fn batching_and_two_workers_by_hand() {
        // One worker, batch of 2 in 120: arrivals 0 and 10 as one batch end at 130 ≤ 150.
        let s = setting(1, &[100, 120], 150);
        assert_eq!(min_misses(&s, &[0, 10], 10), Ok(Some(0)));
        // Without the batch one of them misses.
        assert_eq!(min_misses(&setting(1, &[100], 150), &[0, 10], 10), Ok(Some(1)));
        // Two workers serve both alone.
        assert_eq!(min_misses(&setting(2, &[100], 150), &[0, 10], 10), Ok(Some(0)));
        // Two workers, three at once, SLO 150: two on time, the third waits 100.
        assert_eq!(min_misses(&setting(2, &[100], 150), &[0, 0, 0], 10), Ok(Some(1)));
    }

    #[test]
    fn the_cap_prunes_and_says_so() {
        let s = setting(1, &[100], 150);
        assert_eq!(min_misses(&s, &[0, 10, 20], 2), Ok(Some(2)));
        assert_eq!(min_misses(&s, &[0, 10, 20], 1), Ok(None));
        assert_eq!(min_misses(&s, &[], 0), Ok(Some(0)));
    }

    #[test]
    fn errors_name_the_problem() {
        assert_eq!(min_misses(&setting(0, &[1], 1), &[0], 1), Err(LimitError::NoWorkers));
        assert_eq!(min_misses(&setting(1, &[], 1), &[0], 1), Err(LimitError::EmptyTable));
        assert_eq!(min_misses(&setting(1, &[1], 1), &[5, 3], 1), Err(LimitError::Unsorted { index: 1 }));
    }

    #[test]
    fn pooled_fraction_stops_below_the_target() {
        let s = setting(1, &[100], 150);
        let traces = vec![vec![0, 100, 200, 300], vec![0, 10, 20]];
        // 7 requests, 2 missed: 5/7.
        assert_eq!(on_time_fraction(&s, &traces, 0.5), Ok(Some(5.0 / 7.0)));
        assert_eq!(on_time_fraction(&s, &traces, 0.99), Ok(None));
        assert_eq!(on_time_fraction(&s, &[], 0.99), Ok(Some(1.0)));
    }

    /// Every schedule, by enumeration: the next batch is any subset of the requests
    /// not yet decided (of at most the largest batch) on any worker, started as soon
    /// as its worker is free and its last request has arrived; requests never
    /// chosen miss. Listing batches by start time reaches every non-delay schedule,
    /// and delaying a start never helps.
    fn brute_force(s: &Setting, arrivals: &[u64]) -> usize {
        fn best(s: &Setting, arrivals: &[u64], left: u32, free: &mut Vec<u64>) -> usize {
            let mut most = 0; // on time from here
            let n = arrivals.len();
            let mut sub = left;
            while sub != 0 {
                let size = sub.count_ones() as usize;
                if size <= s.latency_us.len() {
                    let members = (0..n).filter(|i| sub & (1 << i) != 0);
                    let ready = members.clone().map(|i| arrivals[i]).max().unwrap_or(0);
                    let due = members.map(|i| arrivals[i]).min().unwrap_or(0) + s.slo_us;
                    for w in 0..free.len() {
                        let end = free[w].max(ready) + s.latency_us[size - 1];
                        if end <= due {
                            let was = free[w];
                            free[w] = end;
                            most = most.max(size + best(s, arrivals, left & !sub, free));
                            free[w] = was;
                        }
                    }
                }
                sub = (sub - 1) & left;
            }
            most
        }
        let all = (1u32 << arrivals.len()) - 1;
        arrivals.len() - best(s, arrivals, all, &mut vec![0; s.workers])
    }

    #[test]
    fn matches_every_schedule_on_small_random_cases() {
        // Small xorshift so the cases are the same every run.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        for case in 0..300 {
            let workers = 1 + (case % 2);
            let max_batch = 1 + next(3) as usize;
            // Tables of every shape, batching paying or not, even decreasing.
            let latency: Vec<u64> = (0..max_batch).map(|_| 20 + next(120)).collect();
            let slo = 50 + next(200);
            let n = 1 + next(5) as usize;
            let mut arrivals: Vec<u64> = (0..n).map(|_| next(200)).collect();
            arrivals.sort_unstable();
            let s = setting(workers, &latency, slo);
            let want = brute_force(&s, &arrivals);
            assert_eq!(min_misses(&s, &arrivals, n), Ok(Some(want)), "case {case}: {s:?} arrivals {arrivals:?}");
        }
    }

    #[test]
    fn search_finds_the_edge() {
        // Held below 7.3: coarse steps of 1 from 1 fail at 8, bisection to 0.1.
        let held = highest_held(1.0, 1.0, 0.1, 100.0, |r| Ok::<_, ()>(r < 7.3)).unwrap();
        assert!(held.rate < 7.3 && held.rate > 7.2, "{held:?}");
        assert!(held.failed.unwrap() >= 7.3 && held.failed.unwrap() - held.rate <= 0.1);
        // Everything held: the top.
        let held = highest_held(1.0, 5.0, 0.1, 12.0, |_| Ok::<_, ()>(true)).unwrap();
        assert_eq!((held.rate, held.failed), (12.0, None));
        // The start not held: down in coarse steps (4, 3, 2 fail, 1 holds), then
        // bisection between 1 and 2.
        let held = highest_held(4.0, 1.0, 0.25, 10.0, |r| Ok::<_, ()>(r < 1.6)).unwrap();
        assert!(held.rate < 1.6 && held.rate >= 1.25, "{held:?}");
        let rates: Vec<f64> = held.probes.iter().map(|p| p.rate).collect();
        assert_eq!(rates, [4.0, 3.0, 2.0, 1.0, 1.5, 1.75], "{held:?}");
        // Nothing held down to the lowest step: bisection towards 0 from it.
        let held = highest_held(2.0, 1.0, 0.1, 10.0, |r| Ok::<_, ()>(r < 0.3)).unwrap();
        assert!(held.rate < 0.3 && held.rate > 0.15, "{held:?}");
    }
}
