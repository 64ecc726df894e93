//! Expected accuracy and SLO-violation rate of a policy (RAMSIS §5.1).
//!
//! The stationary distribution of the policy's Markov chain comes from power
//! iteration started in the empty state (the artifact: 1,000 iterations; here
//! at most [`Problem::power_iterations`](super::Problem::power_iterations), stopping early
//! once one step changes the distribution by less than
//! [`Problem::stationary_tolerance`](super::Problem::stationary_tolerance) in L1).
//! Each state's probability is then re-weighted by the batch it serves (so
//! the rates are per request, not per decision):
//!
//! - `E[violation] = Σ_{s ∉ S*} π(s)·b(s) / Σ_s π(s)·b(s)`, where `S*` are the
//!   states whose action meets the (rounded-down) slack; the full-queue state
//!   counts `N_w + 1` requests, all late (§4.2.3);
//! - `E[accuracy] = Σ_{s ∈ S*} π(s)·b(s)·Accuracy(a(s)) / Σ_{s ∈ S*} π(s)·b(s)`:
//!   accuracy per satisfied request, the paper's metric (§7).

use super::{Action, Generator, Kind, Solution};

impl Generator {
    /// Resets the power iteration to the empty state `(0, 0)`.
    pub(super) fn start_power(&mut self) {
        let states = self.space.state_count();
        self.dist = vec![0.0; states];
        self.dist[0] = 1.0;
        self.dist_next = vec![0.0; states];
        self.z = vec![0.0; self.blocks.len() * self.k];
    }

    /// Pushes state `s`'s probability through its policy action: directly for
    /// empty states and shifts, into the block's phase aggregate otherwise.
    pub(super) fn aggregate_state(&mut self, s: usize) -> u64 {
        let p = self.dist[s];
        if p == 0.0 {
            return 1;
        }
        let levels = self.space.slack_levels();
        if s < levels {
            self.dist_next[levels + levels - 1] += p;
            return 1;
        }
        let k = self.k;
        let choice = &self.choices[s][self.policy[s]];
        match &choice.kind {
            Kind::Block(i) => {
                let phase = self.phases[s].as_ref().expect("phase of a non-empty state");
                let z = &mut self.z[i * k + phase.lo..i * k + phase.lo + phase.w.len()];
                for (zq, w) in z.iter_mut().zip(&phase.w) {
                    *zq += p * w;
                }
                phase.w.len() as u64
            }
            Kind::Shift(shift) => {
                for &(t, prob) in &shift.to {
                    self.dist_next[t as usize] += p * prob;
                }
                shift.to.len() as u64
            }
        }
    }

    /// Builds the [`Solution`] from the policy and the stationary distribution.
    pub(super) fn assemble(&self) -> Solution {
        let space = &self.space;
        let levels = space.slack_levels();
        let full = space.full();
        let mut policy = Vec::with_capacity(space.state_count());
        let (mut total, mut late, mut met, mut acc) = (0.0, 0.0, 0.0, 0.0);
        for s in 0..space.state_count() {
            if s < levels {
                policy.push(Action::WAIT);
                continue;
            }
            let action = self.choices[s][self.policy[s]].action;
            policy.push(action);
            let j = if s == full { 0 } else { s % levels };
            let weight = self.dist[s] * f64::from(action.batch);
            total += weight;
            if s == full || space.violates(j, action) {
                late += weight;
            } else {
                met += weight;
                acc += weight * space.accuracy[action.model as usize];
            }
        }
        let actions = levels + self.choices.iter().map(Vec::len).sum::<usize>();
        Solution {
            load_qps: self.problem_load,
            models: space.models.clone(),
            grid: space.grid.clone(),
            max_queue: space.max_queue,
            policy,
            expected_accuracy: if met > 0.0 { acc / met } else { 0.0 },
            expected_violation: if total > 0.0 { late / total } else { 0.0 },
            full_probability: self.dist[full],
            states: space.state_count(),
            actions,
            sweeps: self.sweeps,
            power_iterations: self.power_done,
        }
    }
}
