//! States (RAMSIS §4.2) and actions (§4.3) of one worker's MDP.
//!
//! A state is `(n, T_j)`: `n ∈ [0, N_w]` queued requests and the slack `T_j` of
//! the earliest deadline, rounded *down* to the time grid `T_w` (§4.2: "every
//! continuous slack Δ is represented with T_j ≤ Δ < T_{j+1}"), plus the full-queue
//! state `(ϕ, ∅)` for `n > N_w` (§4.2.3). States are numbered `n·J + j`, the
//! full-queue state last.

use serde::{Deserialize, Serialize};

use super::{Batching, Discretization, Problem, ProblemError};
use crate::latency;

/// The prepared inputs of one MDP: Pareto models in latency order, their
/// latency tables, the time grid and the state numbering.
#[derive(Clone, Debug)]
pub struct Space {
    /// For each MDP model (increasing batch-1 latency), its index in
    /// [`Problem::models`].
    pub models: Vec<usize>,
    /// Accuracy of each MDP model.
    pub accuracy: Vec<f64>,
    /// `latency[m][b - 1]` in µs for `b ∈ 1..=N_w`; `+inf` where the model does
    /// not accept that batch size.
    pub latency: Vec<Vec<f64>>,
    /// The full-queue state's service time: the fastest model at batch
    /// `N_w + 1`, extrapolated by least squares when not in its table (§4.2.3;
    /// the artifact's `InfLatencySampler`).
    pub full_latency: f64,
    /// The slack grid `T_w`, increasing, `T_0 = 0`, last = SLO.
    pub grid: Vec<f64>,
    /// The SLO in µs.
    pub slo: f64,
    /// `N_w`, the largest modelled queue.
    pub max_queue: usize,
}

/// One action `(m, b)` (§4.3): serve the `b` earliest-deadline requests with
/// MDP model `m` (an index into [`Space::models`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Action {
    /// MDP model index (0 = fastest).
    pub model: u16,
    /// Batch size; 0 for the arrival action of an empty queue (§4.3.4).
    pub batch: u16,
}

impl Action {
    /// The arrival action `â` of an empty queue (§4.3.4): wait for the next request.
    pub const WAIT: Action = Action { model: 0, batch: 0 };
}

impl Space {
    /// Prepares a problem: Pareto pruning (§4.3.3) when asked, latency order,
    /// tables cut to `N_w`, and the time grid (§4.2.1 / §4.2.2).
    pub fn new(problem: &Problem) -> Result<Space, ProblemError> {
        problem.validate()?;
        let n_w = problem.max_queue as usize;
        let b1: Vec<f64> =
            problem.models.iter().map(|m| m.latency_us.first().copied().unwrap_or(f64::INFINITY)).collect();
        let accuracy: Vec<f64> = problem.models.iter().map(|m| m.accuracy).collect();
        let models = if problem.pareto_prune {
            latency::pareto_front(&accuracy, &b1)
        } else {
            let mut order: Vec<usize> = (0..problem.models.len()).filter(|&i| b1[i].is_finite()).collect();
            order.sort_by(|&a, &b| b1[a].total_cmp(&b1[b]));
            order
        };
        if models.is_empty() {
            return Err(ProblemError::NoModels);
        }
        let latency: Vec<Vec<f64>> = models
            .iter()
            .map(|&i| {
                let table = &problem.models[i].latency_us;
                (1..=n_w).map(|b| table.get(b - 1).copied().unwrap_or(f64::INFINITY)).collect()
            })
            .collect();
        let fastest = &problem.models[models[0]].latency_us;
        if fastest.len() < n_w {
            return Err(ProblemError::ShortTable {
                model: problem.models[models[0]].name.clone(),
                have: fastest.len(),
                need: n_w,
            });
        }
        let full_latency = latency::extrapolate(fastest, n_w + 1);
        let slo = problem.slo_us;
        let grid = match problem.discretization {
            // §4.2.2: T_w = 0, SLO/D, 2·SLO/D, …, SLO.
            Discretization::Fld(d) => (0..=d).map(|i| slo / f64::from(d) * f64::from(i)).collect(),
            // §4.2.1: every latency l(m, b) ≤ SLO, b ≤ N_w; plus 0 and SLO so
            // that every slack in [0, SLO] has a grid point at or below it.
            Discretization::Md => {
                let mut g: Vec<f64> =
                    latency.iter().flatten().copied().filter(|&l| l <= slo).chain([0.0, slo]).collect();
                g.sort_by(f64::total_cmp);
                g.dedup();
                g
            }
        };
        // The artifact builds the FLD grid as (SLO/D)·(i+1); the values agree
        // with `SLO/D·i` up to rounding, which only matters for a latency that
        // equals a grid point to the last bit.
        Ok(Space {
            accuracy: models.iter().map(|&i| accuracy[i]).collect(),
            models,
            latency,
            full_latency,
            grid,
            slo,
            max_queue: n_w,
        })
    }

    /// `J = |T_w|`.
    pub fn slack_levels(&self) -> usize {
        self.grid.len()
    }

    /// Number of states: `(N_w + 1)·J + 1`.
    pub fn state_count(&self) -> usize {
        (self.max_queue + 1) * self.grid.len() + 1
    }

    /// Index of state `(n, j)`, `n ≤ N_w`.
    pub fn state(&self, n: usize, j: usize) -> usize {
        n * self.grid.len() + j
    }

    /// Index of the full-queue state `(ϕ, ∅)`.
    pub fn full(&self) -> usize {
        (self.max_queue + 1) * self.grid.len()
    }

    /// `(n, j)` of a state index other than the full-queue state.
    pub fn split(&self, s: usize) -> (usize, usize) {
        (s / self.grid.len(), s % self.grid.len())
    }

    /// The grid index of a continuous slack: the largest `j` with `T_j ≤ slack`,
    /// 0 when the slack is negative (slack is rounded *down*, the artifact's
    /// `quantize_deadline`).
    pub fn quantize(&self, slack: f64) -> usize {
        self.grid.partition_point(|&t| t <= slack).saturating_sub(1)
    }

    /// Latency of model `m` at batch `b`.
    pub fn latency(&self, m: usize, b: usize) -> f64 {
        if b == self.max_queue + 1 && m == 0 {
            return self.full_latency;
        }
        self.latency[m][b - 1]
    }

    /// The actions of state `(n, j)`, `n ≥ 1`, in the artifact's order (which
    /// decides ties: the first best action wins): for each batch size (only `n`
    /// with maximal batching; `n` then `1..n` with variable batching, §4.3.2)
    /// the models meeting the slack (§4.3.1) in latency order; then, if it is
    /// not already there, the late-serving fallback `(m_min, n)` (§4.3.1: "better
    /// served late than never").
    pub fn actions(&self, n: usize, j: usize, batching: Batching) -> Vec<Action> {
        let slack = self.grid[j];
        let mut out = Vec::new();
        let batches: Vec<usize> = match batching {
            Batching::Maximal => vec![n],
            Batching::Variable => std::iter::once(n).chain(1..n).collect(),
        };
        for b in batches {
            for m in 0..self.latency.len() {
                if self.latency(m, b) <= slack {
                    out.push(Action { model: m as u16, batch: b as u16 });
                }
            }
        }
        let fallback = Action { model: 0, batch: n as u16 };
        if !out.contains(&fallback) {
            out.push(fallback);
        }
        out
    }

    /// Whether action `a` in state `(n, j)` misses the head's deadline:
    /// `l(m, b) > T_j` (`SLOSatisfied = 0`, §4.1). Always true in the full-queue
    /// state, whose slack is taken as 0 (§4.2.3).
    pub fn violates(&self, j: usize, a: Action) -> bool {
        self.latency(a.model as usize, a.batch as usize) > self.grid[j]
    }
}
