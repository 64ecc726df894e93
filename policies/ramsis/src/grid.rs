//! Policies over a load grid (RAMSIS §3.2.2, §6).
//!
//! A RAMSIS policy is specific to one load λ. RAMSIS therefore keeps a set of
//! policies, ordered by load, such that the expected accuracies of adjacent
//! policies differ by less than a threshold (1% in §6), and serves each
//! decision with the *lowest-load policy whose load is at least the current
//! estimate* (the 500 ms moving-window estimate of §6). [`PolicySet`] is that
//! set; [`build`] fills it by bisection; [`PolicySet::plan`] says which load
//! to generate next when the set is grown lazily (the component does that
//! between decisions).

use serde::{Deserialize, Serialize};

use crate::mdp::{self, Problem, ProblemError, Solution};
use crate::runs::Runs;

/// One generated policy of a set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// The load it was generated for, requests per second.
    pub load_qps: f64,
    /// Its expected accuracy (§5.1).
    pub expected_accuracy: f64,
    /// Its expected SLO-violation rate (§5.1).
    pub expected_violation: f64,
    /// Action per state, as in [`Solution::policy`], run-length encoded.
    pub policy: Runs,
}

impl From<Solution> for Entry {
    fn from(s: Solution) -> Entry {
        Entry {
            load_qps: s.load_qps,
            expected_accuracy: s.expected_accuracy,
            expected_violation: s.expected_violation,
            policy: Runs::new(&s.policy),
        }
    }
}

/// How a grid is grown.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GridOptions {
    /// Adjacent policies' expected accuracies must differ by less than this
    /// (§6: 1%, read as an absolute difference of 0.01 in accuracy).
    pub threshold: f64,
    /// Loads closer than this (requests/s) are not split further, whatever
    /// their accuracies: it bounds the grid where accuracy jumps (e.g. at the
    /// capacity of the fastest model).
    pub min_gap_qps: f64,
    /// Most policies kept.
    pub max_policies: usize,
}

impl Default for GridOptions {
    fn default() -> Self {
        GridOptions { threshold: 0.01, min_gap_qps: 10.0, max_policies: 64 }
    }
}

/// Policies ordered by increasing load.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PolicySet {
    /// The policies, by increasing `load_qps` (no two with the same load).
    pub entries: Vec<Entry>,
}

impl PolicySet {
    /// Adds a policy, keeping the order (replacing one at the same load).
    pub fn insert(&mut self, entry: Entry) {
        match self.entries.binary_search_by(|e| e.load_qps.total_cmp(&entry.load_qps)) {
            Ok(i) => self.entries[i] = entry,
            Err(i) => self.entries.insert(i, entry),
        }
    }

    /// Index of the lowest-load policy with load ≥ `load_qps` (§3.2.2), or
    /// `None` when the estimate is above every policy's load.
    pub fn covering(&self, load_qps: f64) -> Option<usize> {
        let i = self.entries.partition_point(|e| e.load_qps < load_qps);
        (i < self.entries.len()).then_some(i)
    }

    /// The policy to serve with at this load: the covering one, or the
    /// highest-load one when the load exceeds the grid.
    pub fn select(&self, load_qps: f64) -> Option<&Entry> {
        match self.covering(load_qps) {
            Some(i) => self.entries.get(i),
            None => self.entries.last(),
        }
    }

    /// Which load to generate next, given the current estimate, when the set
    /// is grown lazily (online): a policy at `estimate · headroom` when the
    /// estimate is above the grid, or when the policy that would serve it
    /// (the covering one) is further than `min_gap_qps` above that target and
    /// its expected accuracy differs from the next lower policy's by at least
    /// the threshold (so a finer policy would choose differently); below the
    /// grid, the same with the lowest policy, not below `min_load`. `None`
    /// when the set already serves this load well (or is full).
    ///
    /// Offline, [`build`] bisects instead; online, generating at the observed
    /// load reaches a good policy in one generation rather than log₂ of them.
    pub fn plan(&self, estimate: f64, headroom: f64, min_load: f64, options: &GridOptions) -> Option<f64> {
        if self.entries.len() >= options.max_policies || !(estimate.is_finite() && estimate >= 0.0) {
            return None;
        }
        let target = (estimate * headroom).max(min_load);
        let Some(i) = self.covering(estimate) else {
            return Some(target);
        };
        let covering = &self.entries[i];
        if covering.load_qps - target <= options.min_gap_qps {
            return None;
        }
        if i == 0 {
            return Some(target);
        }
        let lower = &self.entries[i - 1];
        let differs = (lower.expected_accuracy - covering.expected_accuracy).abs() >= options.threshold;
        (differs && target > lower.load_qps + options.min_gap_qps).then_some(target)
    }
}

/// The load above which the fastest model cannot keep up even with its best
/// batch within the SLO: `K · max_b b / l(m_min, b)` (requests/s). A natural
/// top for a grid.
pub fn capacity_qps(problem: &Problem) -> Result<f64, ProblemError> {
    let space = mdp::Space::new(problem)?;
    let best = (1..=space.max_queue)
        .filter(|&b| space.latency(0, b) <= space.slo)
        .map(|b| b as f64 / space.latency(0, b))
        .fold(0.0, f64::max);
    Ok(best * 1e6 * f64::from(problem.workers))
}

/// Builds a grid over `[lo, hi]` by bisection: the two ends, then the
/// midpoint of every interval whose ends' expected accuracies differ by at
/// least `options.threshold` (and are more than `2·min_gap_qps` apart).
/// `progress(done, queued)` is called after each policy.
pub fn build(
    problem: &Problem,
    lo: f64,
    hi: f64,
    options: &GridOptions,
    threads: usize,
    mut progress: impl FnMut(usize, usize),
) -> Result<PolicySet, ProblemError> {
    let solve = |load: f64| -> Result<Entry, ProblemError> {
        let mut p = problem.clone();
        p.load_qps = load;
        Ok(mdp::generate_with_threads(&p, threads)?.into())
    };
    let mut set = PolicySet::default();
    set.insert(solve(lo)?);
    progress(1, 1);
    if hi > lo {
        set.insert(solve(hi)?);
    }
    progress(set.entries.len(), 0);
    // Intervals to examine, as (lo load, hi load).
    let mut queue: Vec<(f64, f64)> = vec![(lo, hi)];
    while let Some((a, b)) = queue.pop() {
        if set.entries.len() >= options.max_policies {
            break;
        }
        let acc =
            |load: f64| set.entries.iter().find(|e| e.load_qps == load).map(|e| e.expected_accuracy).unwrap_or(0.0);
        if (acc(a) - acc(b)).abs() < options.threshold || b - a <= 2.0 * options.min_gap_qps {
            continue;
        }
        let mid = 0.5 * (a + b);
        set.insert(solve(mid)?);
        queue.push((mid, b));
        queue.push((a, mid));
        progress(set.entries.len(), queue.len());
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(load: f64, acc: f64) -> Entry {
        Entry { load_qps: load, expected_accuracy: acc, expected_violation: 0.0, policy: Runs::default() }
    }

    #[test]
    fn selects_the_lowest_load_at_or_above_the_estimate() {
        let mut set = PolicySet::default();
        for (l, a) in [(1000.0, 0.8), (2000.0, 0.75), (3000.0, 0.7)] {
            set.insert(entry(l, a));
        }
        assert_eq!(set.select(10.0).unwrap().load_qps, 1000.0);
        assert_eq!(set.select(1000.0).unwrap().load_qps, 1000.0);
        assert_eq!(set.select(1000.5).unwrap().load_qps, 2000.0);
        assert_eq!(set.select(9000.0).unwrap().load_qps, 3000.0);
        assert_eq!(set.covering(9000.0), None);
    }

    #[test]
    fn plans_beyond_below_and_between() {
        let options = GridOptions::default();
        let mut set = PolicySet::default();
        assert_eq!(set.plan(500.0, 1.1, 100.0, &options), Some(550.0));
        set.insert(entry(1000.0, 0.8));
        set.insert(entry(3000.0, 0.7));
        // Above the grid, below it, and inside a gap whose accuracies differ.
        assert_eq!(set.plan(4000.0, 1.1, 100.0, &options), Some(4400.0));
        assert_eq!(set.plan(50.0, 1.1, 100.0, &options), Some(100.0));
        assert_eq!(set.plan(2000.0, 1.1, 100.0, &options), Some(2200.0));
        // Served closely enough already.
        assert_eq!(set.plan(2995.0, 1.0, 100.0, &options), None);
        assert_eq!(set.plan(995.0, 1.0, 100.0, &options), None);
        // Adjacent accuracies within the threshold: no finer policy needed.
        set.insert(entry(2000.0, 0.795));
        assert_eq!(set.plan(1500.0, 1.1, 100.0, &options), None);
    }
}
