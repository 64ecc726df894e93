//! The RAMSIS policy generator: one worker's MDP (§4), solved by value
//! iteration (§4.1), with its expected accuracy and SLO-violation rate (§5.1).
//!
//! Start here: describe the problem as a [`Problem`], then either call
//! [`generate`] (native, optionally multi-threaded) or drive a [`Generator`]
//! with a work budget per call (inside a Wasm component, so that generation
//! never stalls serving). Both give a [`Solution`]: the action per state and
//! the expectations.
//!
//! Defaults follow the authors' artifact (DESIGN.md, "Notes on the reference
//! implementations"; `docs/ramsis.md` lists every interpretation): slack is
//! rounded down to the grid, the reward is the model's accuracy per decision
//! that meets the head's deadline, value iteration runs 100 undiscounted
//! Jacobi sweeps from `V = 0`, and the expectations weight the stationary
//! distribution (power iteration from the empty state) by batch size.

pub mod arrivals;
pub mod expectations;
#[doc(hidden)]
pub mod reference;
pub mod states;
pub mod transitions;
pub mod value_iteration;

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

pub use arrivals::{ArrivalCounts, Arrivals};
pub use states::{Action, Space};
use transitions::{Block, BlockBuilder, CountCache, Phase, Shift};

/// Slack discretization (§4.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Discretization {
    /// Fixed-length discretization with `D` intervals (§4.2.2): `T_j = j·SLO/D`.
    Fld(u32),
    /// Model-based discretization (§4.2.1): every distinct latency `l(m, b) ≤ SLO`.
    Md,
}

impl std::str::FromStr for Discretization {
    type Err = String;
    /// `fld:100`, `fld` (= `fld:100`) or `md`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim().to_ascii_lowercase();
        if s == "md" {
            return Ok(Discretization::Md);
        }
        if s == "fld" {
            return Ok(Discretization::Fld(100));
        }
        if let Some(d) = s.strip_prefix("fld:") {
            let d: u32 = d.parse().map_err(|_| format!("`{s}`: D must be a positive integer"))?;
            if d == 0 {
                return Err(format!("`{s}`: D must be positive"));
            }
            return Ok(Discretization::Fld(d));
        }
        Err(format!("unknown discretization `{s}` (expected fld:<D> or md)"))
    }
}

/// Batching strategy (§4.3.2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Batching {
    /// Serve the whole queue at every decision (the paper's default).
    #[default]
    Maximal,
    /// Any batch size `1..=n`.
    Variable,
}

impl std::str::FromStr for Batching {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "maximal" | "max" => Ok(Batching::Maximal),
            "variable" | "var" => Ok(Batching::Variable),
            other => Err(format!("unknown batching `{other}` (expected maximal or variable)")),
        }
    }
}

/// How the central queue spreads requests over the K workers (§3.2.1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Balancing {
    /// Round-robin (§4.4.2; the paper's and the artifact's choice).
    #[default]
    RoundRobin,
    /// Shortest-queue-first, with Appendix I.1's Poisson approximation of the
    /// worker's arrival rate.
    ShortestQueue,
}

/// One model as the generator sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelSpec {
    /// Name, for reports.
    pub name: String,
    /// Accuracy in `[0, 1]`.
    pub accuracy: f64,
    /// `latency_us[b - 1]`: latency of a batch of `b`, µs (the p95 by default).
    pub latency_us: Vec<f64>,
}

/// Everything that defines one worker's MDP.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Problem {
    /// The models (pruned to the Pareto front when [`Problem::pareto_prune`]).
    pub models: Vec<ModelSpec>,
    /// Latency SLO, µs.
    pub slo_us: f64,
    /// K: workers sharing the balancer.
    pub workers: u32,
    /// λ: the app's total load, requests per second.
    pub load_qps: f64,
    /// `N_w`: the largest modelled queue (32 in the paper, §6).
    pub max_queue: u32,
    /// Slack grid.
    pub discretization: Discretization,
    /// Batching strategy.
    pub batching: Batching,
    /// Load balancing.
    pub balancing: Balancing,
    /// Arrival process.
    pub arrivals: Arrivals,
    /// Value-iteration sweeps (100 in the artifact).
    pub sweeps: u32,
    /// Upper bound on power iterations for the stationary distribution (1,000
    /// in the artifact).
    pub power_iterations: u32,
    /// Stop the power iteration once the L1 change of one step is below this
    /// (`0` runs all [`Problem::power_iterations`], as the artifact does).
    pub stationary_tolerance: f64,
    /// Keep only the accuracy–latency Pareto front (§4.3.3).
    pub pareto_prune: bool,
    /// Variable batching: the head left behind gets its slack from the order
    /// statistics of the arrivals in interval A (the artifact's main path;
    /// Poisson arrivals only). `false`: the conservative `T_j − τ` (the
    /// artifact's fallback). Default `true`.
    #[serde(default = "yes")]
    pub variable_exact: bool,
}

fn yes() -> bool {
    true
}

impl Problem {
    /// A problem with the artifact's defaults: FLD D = 100, maximal batching,
    /// round-robin, Poisson, `N_w = 32`, 100 sweeps, up to 1,000 power
    /// iterations (stopping once stationary to 1e-13), Pareto pruning on.
    pub fn new(models: Vec<ModelSpec>, slo_us: f64, workers: u32, load_qps: f64) -> Problem {
        Problem {
            models,
            slo_us,
            workers,
            load_qps,
            max_queue: 32,
            discretization: Discretization::Fld(100),
            batching: Batching::Maximal,
            balancing: Balancing::RoundRobin,
            arrivals: Arrivals::Poisson,
            sweeps: 100,
            power_iterations: 1000,
            stationary_tolerance: 1e-13,
            pareto_prune: true,
            variable_exact: true,
        }
    }

    /// Checks the inputs.
    pub fn validate(&self) -> Result<(), ProblemError> {
        let bad = |what: &str| Err(ProblemError::Invalid(what.to_string()));
        if self.models.is_empty() {
            return Err(ProblemError::NoModels);
        }
        if !(self.slo_us.is_finite() && self.slo_us > 0.0) {
            return bad("slo must be positive");
        }
        if self.workers == 0 {
            return bad("workers must be at least 1");
        }
        if !(self.load_qps.is_finite() && self.load_qps > 0.0) {
            return bad("load must be positive");
        }
        if self.max_queue == 0 || self.max_queue > 4096 {
            return bad("max_queue must be in 1..=4096");
        }
        if let Discretization::Fld(0) = self.discretization {
            return bad("FLD needs D ≥ 1");
        }
        for m in &self.models {
            if !(0.0..=1.0).contains(&m.accuracy) {
                return Err(ProblemError::Invalid(format!("model `{}`: accuracy must be in [0, 1]", m.name)));
            }
            if m.latency_us.iter().any(|l| !(l.is_finite() && *l >= 0.0)) {
                return Err(ProblemError::Invalid(format!("model `{}`: latencies must be finite and ≥ 0", m.name)));
            }
        }
        Ok(())
    }

    /// λ in requests per µs.
    pub fn rate_per_us(&self) -> f64 {
        self.load_qps / 1e6
    }
}

/// Why a [`Problem`] cannot be generated.
#[derive(Clone, Debug, PartialEq)]
pub enum ProblemError {
    /// No model with a latency profile.
    NoModels,
    /// The fastest model's table does not cover `N_w` batch sizes.
    ShortTable {
        /// The model.
        model: String,
        /// Its table length.
        have: usize,
        /// `N_w`.
        need: usize,
    },
    /// An input out of range.
    Invalid(String),
}

impl std::fmt::Display for ProblemError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProblemError::NoModels => f.write_str("no model with a latency profile"),
            ProblemError::ShortTable { model, have, need } => write!(
                f,
                "the fastest model `{model}` has latencies for {have} batch sizes; \
                 maximal batching over a queue of up to {need} needs {need} (lower max_queue)"
            ),
            ProblemError::Invalid(what) => f.write_str(what),
        }
    }
}

impl std::error::Error for ProblemError {}

/// A generated policy and its expectations.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Solution {
    /// The load λ it was generated for, requests per second.
    pub load_qps: f64,
    /// MDP models (indices into [`Problem::models`]) in increasing latency order.
    pub models: Vec<usize>,
    /// The slack grid `T_w`, µs.
    pub grid: Vec<f64>,
    /// `N_w`.
    pub max_queue: usize,
    /// The action of every state `n·J + j`, the full-queue state last
    /// ([`Action::WAIT`] for empty queues).
    pub policy: Vec<Action>,
    /// `E[accuracy]` per satisfied request (§5.1).
    pub expected_accuracy: f64,
    /// `E[SLO violation rate]` per served request (§5.1).
    pub expected_violation: f64,
    /// Stationary probability of the full-queue state (per decision).
    pub full_probability: f64,
    /// Number of states.
    pub states: usize,
    /// Number of state–action pairs.
    pub actions: usize,
    /// Value-iteration sweeps run.
    pub sweeps: u32,
    /// Power iterations run.
    pub power_iterations: u32,
}

impl Solution {
    /// The action for a queue of `n` requests whose earliest deadline is
    /// `slack_us` away: `n = 0` waits, `n > N_w` is the full-queue state,
    /// otherwise the state's action with the slack rounded down to the grid.
    pub fn action(&self, n: usize, slack_us: f64) -> Action {
        if n == 0 {
            return Action::WAIT;
        }
        if n > self.max_queue {
            return self.policy[self.policy.len() - 1];
        }
        let j = self.grid.partition_point(|&t| t <= slack_us).saturating_sub(1);
        self.policy[n * self.grid.len() + j]
    }
}

/// How an action's transitions are represented.
#[derive(Clone, Debug)]
enum Kind {
    /// Through phase weights and a shared [`Block`].
    Block(usize),
    /// A direct distribution (variable batching, requests left behind).
    Shift(Shift),
}

#[derive(Clone, Debug)]
struct Choice {
    action: Action,
    reward: f64,
    kind: Kind,
}

/// Where a [`Generator`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Enumerating actions and phase weights, state by state.
    Setup(usize),
    /// Building transition block `i`.
    Build(usize),
    /// Value-iteration pass `iter` (the last one records the policy):
    /// `y` for block `i`, or `Q` for state `i`.
    SweepBlocks(u32, usize),
    SweepStates(u32, usize),
    /// Power iteration `iter`: aggregating state `i`, or spreading block `i`.
    PowerStates(u32, usize),
    PowerBlocks(u32, usize),
    Done,
}

/// A policy generation that can be advanced with a work budget per call.
///
/// [`Generator::step`] does at most about `budget` multiply–adds (one unit of
/// work is never larger than a few thousand) and returns `true` when the
/// [`Solution`] is ready ([`Generator::solution`]). [`generate`] runs it to
/// completion.
pub struct Generator {
    space: Space,
    problem_load: f64,
    counts: Box<dyn ArrivalCounts>,
    rate: f64,
    k: usize,
    /// K (the phase count `k` is 1 under shortest-queue-first).
    workers_total: usize,
    /// Variable batching: condition the next head's slack on the order
    /// statistics of the arrivals in interval A (Poisson only).
    order_statistics: bool,
    batching: Batching,
    balancing: Balancing,
    sweeps: u32,
    power_iterations: u32,
    tolerance: f64,
    /// Per state: phase weights (states with `n ≥ 1` and the full state).
    phases: Vec<Option<Phase>>,
    /// Per state: its actions.
    choices: Vec<Vec<Choice>>,
    /// Keys of the blocks, `(batch, model)`, and their service times/rates.
    block_specs: Vec<(f64, f64)>,
    block_index: HashMap<(usize, usize), usize>,
    blocks: Vec<Block>,
    builder: Option<BlockBuilder>,
    /// Count pmfs shared by the blocks while they are built.
    count_cache: CountCache,
    /// `Block · V` per block, `k` each.
    y: Vec<f64>,
    /// The sweeps' layout of the phase weights (see `value_iteration`), in
    /// tiles of [`value_iteration::LANES`] states: `phase_t[(a·K + t)·LANES + l]`
    /// is state `a·LANES + l`'s weight of phase `t`, 0 outside its range, so
    /// that a window reads one contiguous tile.
    phase_t: Vec<f64>,
    /// Per block, the windows of consecutive states whose pairs it serves.
    windows: Vec<Vec<value_iteration::Window>>,
    /// `phase · y` of every state–action pair served through a block, indexed
    /// `pair_start[s] + choice`, refreshed block by block each sweep.
    future: Vec<f64>,
    pair_start: Vec<u32>,
    /// `R(s, a)` per pair, and per state the work of its evaluation when all
    /// its actions go through blocks (`u64::MAX` otherwise): the per-state
    /// pass then reads two contiguous slices.
    rewards: Vec<f64>,
    block_work: Vec<u64>,
    v: Vec<f64>,
    v_next: Vec<f64>,
    policy: Vec<usize>,
    dist: Vec<f64>,
    dist_next: Vec<f64>,
    z: Vec<f64>,
    /// Per-column sums of [`Block::spread`].
    scratch: Vec<f64>,
    power_done: u32,
    stage: Stage,
    work: u64,
}

impl std::fmt::Debug for Generator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generator")
            .field("load_qps", &self.problem_load)
            .field("stage", &self.stage)
            .field("work", &self.work)
            .finish_non_exhaustive()
    }
}

impl Generator {
    /// Prepares a generation (cheap: no transition is computed yet).
    pub fn new(problem: &Problem) -> Result<Generator, ProblemError> {
        let space = Space::new(problem)?;
        let states = space.state_count();
        let k = match problem.balancing {
            Balancing::RoundRobin => problem.workers as usize,
            Balancing::ShortestQueue => 1,
        };
        Ok(Generator {
            counts: problem.arrivals.counts(),
            rate: problem.rate_per_us(),
            k,
            workers_total: problem.workers as usize,
            order_statistics: problem.arrivals == Arrivals::Poisson && problem.variable_exact,
            batching: problem.batching,
            balancing: problem.balancing,
            sweeps: problem.sweeps,
            power_iterations: problem.power_iterations,
            tolerance: problem.stationary_tolerance,
            phases: vec![None; states],
            choices: vec![Vec::new(); states],
            block_specs: Vec::new(),
            block_index: HashMap::new(),
            blocks: Vec::new(),
            builder: None,
            count_cache: CountCache::default(),
            y: Vec::new(),
            phase_t: Vec::new(),
            windows: Vec::new(),
            future: Vec::new(),
            pair_start: Vec::new(),
            rewards: Vec::new(),
            block_work: Vec::new(),
            v: vec![0.0; states],
            v_next: vec![0.0; states],
            policy: vec![0; states],
            dist: Vec::new(),
            dist_next: Vec::new(),
            z: Vec::new(),
            scratch: Vec::new(),
            power_done: 0,
            stage: Stage::Setup(0),
            work: 0,
            problem_load: problem.load_qps,
            space,
        })
    }

    /// The prepared state space.
    pub fn space(&self) -> &Space {
        &self.space
    }

    /// Total work done so far (multiply–adds, roughly).
    pub fn work(&self) -> u64 {
        self.work
    }

    /// Multiply–adds of one value-iteration sweep, counted analytically (for
    /// flop/s figures): one per stored block probability (`Block · V`), one
    /// per phase weight of every state–action pair served through a block,
    /// one per destination of every left-behind distribution. Complete once
    /// the blocks are built ([`Generator::build_transitions`]).
    pub fn sweep_madds(&self) -> u64 {
        let blocks: usize = self.blocks.iter().map(Block::nnz).sum();
        let pairs: usize = self
            .choices
            .iter()
            .zip(&self.phases)
            .flat_map(|(choices, phase)| {
                choices.iter().map(move |c| match &c.kind {
                    Kind::Block(_) => phase.as_ref().map_or(0, |p| p.w.len()),
                    Kind::Shift(shift) => shift.to.len(),
                })
            })
            .sum();
        (blocks + pairs) as u64
    }

    /// Whether the solution is ready.
    pub fn is_done(&self) -> bool {
        self.stage == Stage::Done
    }

    /// A rough progress fraction in `[0, 1]` (for progress bars).
    pub fn progress(&self) -> f64 {
        let sweeps = f64::from(self.sweeps + 1);
        match self.stage {
            Stage::Setup(_) => 0.0,
            Stage::Build(i) => 0.2 * i as f64 / self.block_specs.len().max(1) as f64,
            Stage::SweepBlocks(it, _) | Stage::SweepStates(it, _) => 0.2 + 0.6 * f64::from(it) / sweeps,
            Stage::PowerStates(it, _) | Stage::PowerBlocks(it, _) => {
                0.8 + 0.2 * f64::from(it) / f64::from(self.power_iterations.max(1))
            }
            Stage::Done => 1.0,
        }
    }

    /// The arrival rate (per µs) that drives the transitions out of a state
    /// with `n` requests: λ for round-robin; Appendix I.1's `λ_w(n)` for
    /// shortest-queue-first: `λ/K` for `n ≤ 2`, `(λ/(Kμ))^K·μ` above, with μ
    /// the worker's service rate, taken as the fastest model's throughput at
    /// the largest batch within the SLO ("the maximum inference latency of
    /// the model that meets the query load").
    fn rate_for(&self, n: usize, workers: usize) -> f64 {
        match self.balancing {
            Balancing::RoundRobin => self.rate,
            Balancing::ShortestQueue => {
                let per_worker = self.rate / workers as f64;
                if n <= 2 {
                    return per_worker;
                }
                let mu = (1..=self.space.max_queue)
                    .filter(|&b| self.space.latency(0, b) <= self.space.slo)
                    .map(|b| b as f64 / self.space.latency(0, b))
                    .fold(0.0, f64::max);
                if mu <= 0.0 {
                    return per_worker;
                }
                (per_worker / mu).powi(workers as i32) * mu
            }
        }
    }

    /// Advances by about `budget` multiply–adds; `true` when done.
    pub fn step(&mut self, budget: u64) -> bool {
        let start = self.work;
        while self.stage != Stage::Done && self.work - start < budget {
            self.unit();
        }
        self.stage == Stage::Done
    }

    /// Runs to completion.
    pub fn run(&mut self) {
        while !self.step(u64::MAX) {}
    }

    /// The solution, once [`Generator::is_done`].
    pub fn solution(&self) -> Option<Solution> {
        if !self.is_done() {
            return None;
        }
        Some(self.assemble())
    }

    /// The actions of state `s` (after setup), in tie-breaking order.
    pub fn actions_of(&self, s: usize) -> Vec<Action> {
        self.choices[s].iter().map(|c| c.action).collect()
    }

    /// The transition row `P_a(s, ·)` of state `s` and its `index`-th action,
    /// as `(state, probability)` pairs (duplicates summed), once the blocks are
    /// built (from the first value-iteration sweep on). For checks and tests:
    /// generation itself never materialises rows.
    pub fn transition_row(&self, s: usize, index: usize) -> Option<Vec<(usize, f64)>> {
        if matches!(self.stage, Stage::Setup(_) | Stage::Build(_)) {
            return None;
        }
        let levels = self.space.slack_levels();
        let mut row: HashMap<usize, f64> = HashMap::new();
        if s < levels {
            row.insert(levels + levels - 1, 1.0);
        } else {
            let phase = self.phases[s].as_ref()?;
            match &self.choices[s].get(index)?.kind {
                Kind::Block(i) => {
                    let block = &self.blocks[*i];
                    let k = block.k;
                    for (c, &to) in block.cols.iter().enumerate() {
                        let col: Vec<f64> = (0..k).map(|q| block.value(c, q)).collect();
                        let p = phase.dot(&col);
                        *row.entry(to as usize).or_default() += p;
                    }
                }
                Kind::Shift(shift) => {
                    for &(to, p) in &shift.to {
                        *row.entry(to as usize).or_default() += p;
                    }
                }
            }
        }
        let mut row: Vec<(usize, f64)> = row.into_iter().collect();
        row.sort_by_key(|e| e.0);
        Some(row)
    }

    /// Builds everything up to the first value-iteration sweep (for
    /// [`Generator::transition_row`]).
    pub fn build_transitions(&mut self) {
        while matches!(self.stage, Stage::Setup(_) | Stage::Build(_)) {
            self.unit();
        }
    }

    /// Runs setup, block construction and value iteration (not the power
    /// iteration): the policy is then fixed (for benchmarks of each phase).
    pub fn solve_values(&mut self) {
        while !matches!(self.stage, Stage::PowerStates(..) | Stage::PowerBlocks(..) | Stage::Done) {
            self.unit();
        }
    }

    /// Approximate heap bytes held: transition blocks, phase weights, action
    /// lists and the value/distribution vectors.
    pub fn memory_bytes(&self) -> usize {
        let blocks: usize = self.blocks.iter().map(|b| b.vals.len() * 8 + b.cols.len() * 16).sum();
        let phases: usize = self.phases.iter().flatten().map(|p| p.w.len() * 8 + 32).sum();
        let choices: usize = self
            .choices
            .iter()
            .flatten()
            .map(|c| {
                std::mem::size_of::<Choice>()
                    + match &c.kind {
                        Kind::Shift(s) => s.to.len() * 16,
                        Kind::Block(_) => 0,
                    }
            })
            .sum();
        let vectors = (self.v.len() * 3 + self.dist.len() * 2 + self.y.len() + self.z.len()) * 8;
        let sweeps = (self.phase_t.len() + self.future.len() + self.rewards.len() + self.block_work.len()) * 8
            + self.pair_start.len() * 4
            + self.windows.iter().map(|w| w.len() * std::mem::size_of::<value_iteration::Window>()).sum::<usize>()
            + self.count_cache.memory_bytes()
            + self.scratch.len() * 8;
        blocks + phases + choices + vectors + sweeps
    }

    /// Storage of the transition blocks: (blocks, stored probabilities).
    pub fn block_stats(&self) -> (usize, usize) {
        (self.blocks.len(), self.blocks.iter().map(Block::nnz).sum())
    }

    /// One small unit of work.
    fn unit(&mut self) {
        match self.stage {
            Stage::Setup(s) => {
                self.setup_state(s);
                self.stage = if s + 1 < self.space.state_count() {
                    Stage::Setup(s + 1)
                } else {
                    self.y = vec![0.0; self.block_specs.len() * self.k];
                    self.prepare_sweeps();
                    if self.block_specs.is_empty() {
                        Stage::SweepBlocks(0, 0)
                    } else {
                        Stage::Build(0)
                    }
                };
            }
            Stage::Build(i) => {
                let builder = match self.builder.as_mut() {
                    Some(b) => b,
                    None => {
                        let (tau, rate) = self.block_specs[i];
                        self.builder = Some(BlockBuilder::new(&self.space, tau, rate, self.k));
                        self.builder.as_mut().expect("just set")
                    }
                };
                self.work += builder.step(self.counts.as_ref(), &mut self.count_cache);
                if builder.is_done() {
                    let done = self.builder.take().expect("builder present");
                    let block = done.finish(self.space.full());
                    self.work += block.nnz() as u64;
                    self.blocks.push(block);
                    self.stage = if i + 1 < self.block_specs.len() {
                        Stage::Build(i + 1)
                    } else {
                        self.count_cache = CountCache::default();
                        Stage::SweepBlocks(0, 0)
                    };
                }
            }
            Stage::SweepBlocks(it, i) => {
                if i < self.blocks.len() {
                    let k = self.k;
                    self.blocks[i].times(&self.v, &mut self.y[i * k..(i + 1) * k]);
                    self.block_futures(i);
                    self.work += self.blocks[i].nnz() as u64;
                }
                self.stage =
                    if i + 1 < self.blocks.len() { Stage::SweepBlocks(it, i + 1) } else { Stage::SweepStates(it, 0) };
            }
            Stage::SweepStates(it, s0) => {
                let end = (s0 + 64).min(self.space.state_count());
                let record = it == self.sweeps;
                for s in s0..end {
                    self.work += self.update_state(s, record);
                }
                self.stage = if end < self.space.state_count() {
                    Stage::SweepStates(it, end)
                } else if it < self.sweeps {
                    std::mem::swap(&mut self.v, &mut self.v_next);
                    Stage::SweepBlocks(it + 1, 0)
                } else {
                    self.start_power();
                    Stage::PowerStates(0, 0)
                };
            }
            Stage::PowerStates(it, s0) => {
                let end = (s0 + 256).min(self.space.state_count());
                for s in s0..end {
                    self.work += self.aggregate_state(s);
                }
                self.stage = if end < self.space.state_count() {
                    Stage::PowerStates(it, end)
                } else {
                    Stage::PowerBlocks(it, 0)
                };
            }
            Stage::PowerBlocks(it, i) => {
                if i < self.blocks.len() {
                    let k = self.k;
                    let z = &self.z[i * k..(i + 1) * k];
                    if it == 0 {
                        // The value iteration is over: the layout for `z · Block`.
                        self.blocks[i].make_row_major();
                    }
                    if z.iter().any(|&x| x != 0.0) {
                        self.blocks[i].spread(z, &mut self.dist_next, &mut self.scratch);
                        self.work += self.blocks[i].nnz() as u64;
                    }
                }
                if i + 1 < self.blocks.len() {
                    self.stage = Stage::PowerBlocks(it, i + 1);
                } else {
                    let change: f64 = self.dist.iter().zip(&self.dist_next).map(|(a, b)| (a - b).abs()).sum();
                    std::mem::swap(&mut self.dist, &mut self.dist_next);
                    self.dist_next.iter_mut().for_each(|x| *x = 0.0);
                    self.z.iter_mut().for_each(|x| *x = 0.0);
                    self.power_done = it + 1;
                    self.work += self.dist.len() as u64;
                    self.stage = if it + 1 >= self.power_iterations || change < self.tolerance {
                        Stage::Done
                    } else {
                        Stage::PowerStates(it + 1, 0)
                    };
                }
            }
            Stage::Done => {}
        }
    }

    /// Enumerates the actions of state `s` (§4.3) with their rewards (§4.1)
    /// and transition representations, and its phase weights.
    fn setup_state(&mut self, s: usize) {
        let prepared = self.prepare_state(s);
        self.commit_state(s, prepared);
    }

    /// The part of a state's setup that depends on nothing but the problem
    /// (so threads can run it): phase weights, actions, rewards, and the
    /// left-behind distributions of variable batching.
    pub(super) fn prepare_state(&self, s: usize) -> Prepared {
        let space = &self.space;
        let full = s == space.full();
        let (n, j) = if full { (space.max_queue + 1, 0) } else { space.split(s) };
        // Mostly K evaluations of ln Γ (~50 flops each) for the phase weights.
        let mut work = self.k as u64 * 48;
        if n == 0 {
            // The arrival action: deterministic, handled inline.
            return Prepared { phase: None, choices: Vec::new(), work };
        }
        let t_a = space.slo - space.grid[j];
        let phase = Phase::of_state(self.counts.as_ref(), self.rate, self.k, n, t_a);
        let actions = if full {
            vec![Action { model: 0, batch: (space.max_queue + 1) as u16 }]
        } else {
            space.actions(n, j, self.batching)
        };
        let rate = self.rate_for(n, self.workers_total);
        let mut choices = Vec::with_capacity(actions.len());
        for a in actions {
            let (m, b) = (a.model as usize, a.batch as usize);
            let tau = space.latency(m, b);
            // §4.1: R = Accuracy(a)·SLOSatisfied(s, a). The artifact scales it by
            // b/n, which is 1 under maximal batching; the full state earns 0.
            let reward = if full || space.violates(j, a) { 0.0 } else { space.accuracy[m] * b as f64 / n as f64 };
            let kind = if b >= n {
                PreparedKind::Block { tau, rate }
            } else {
                // Uniform order statistics hold for Poisson arrivals only.
                let exact = self.order_statistics;
                let (shift, w) = Shift::new(space, self.counts.as_ref(), rate, self.k, &phase, n, j, b, tau, exact);
                work += w;
                PreparedKind::Shift(shift)
            };
            work += 16;
            choices.push((a, reward, kind));
        }
        Prepared { phase: Some(phase), choices, work }
    }

    /// Registers a prepared state: its blocks get indices in first-use order
    /// (state order), so sequential and parallel setup number them alike.
    pub(super) fn commit_state(&mut self, s: usize, prepared: Prepared) {
        self.work += prepared.work;
        let mut choices = Vec::with_capacity(prepared.choices.len());
        for (action, reward, kind) in prepared.choices {
            let kind = match kind {
                PreparedKind::Block { tau, rate } => {
                    // Maximal batching: b = n, so (b, m) fixes both τ and, for
                    // shortest-queue-first, the rate λ_w(n).
                    let key = (usize::from(action.batch), usize::from(action.model));
                    let index = match self.block_index.get(&key) {
                        Some(&i) => i,
                        None => {
                            let i = self.block_specs.len();
                            self.block_specs.push((tau, rate));
                            self.block_index.insert(key, i);
                            i
                        }
                    };
                    Kind::Block(index)
                }
                PreparedKind::Shift(shift) => Kind::Shift(shift),
            };
            choices.push(Choice { action, reward, kind });
        }
        self.phases[s] = prepared.phase;
        self.choices[s] = choices;
    }
}

/// A state's setup, computed before its blocks are numbered.
pub(super) struct Prepared {
    phase: Option<Phase>,
    choices: Vec<(Action, f64, PreparedKind)>,
    work: u64,
}

pub(super) enum PreparedKind {
    Block { tau: f64, rate: f64 },
    Shift(Shift),
}

/// Generates the policy for `problem` in one go (single-threaded).
pub fn generate(problem: &Problem) -> Result<Solution, ProblemError> {
    generate_with_threads(problem, 1)
}

/// Generates the policy for `problem` using `threads` threads for the block
/// construction and the value-iteration sweeps (same result as [`generate`]).
pub fn generate_with_threads(problem: &Problem, threads: usize) -> Result<Solution, ProblemError> {
    let mut generator = Generator::new(problem)?;
    generator.run_parallel(threads);
    Ok(generator.solution().expect("a finished generation has a solution"))
}
