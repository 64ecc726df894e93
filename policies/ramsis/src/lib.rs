//! `ramsis`: RAMSIS (Mendoza et al., "Model Selection for Latency-Critical
//! Inference Serving", EuroSys'24) for sluice.
//!
//! Start here:
//! - [`Ramsis`]: the policy component. `init` prepares the worker's MDP from
//!   the app's models, SLO and K and generates (or receives) its first policy;
//!   `decide` maps the queue to `(n, slack)` and looks the action up (§3.2.2).
//! - [`Params`]: its `params` JSON.
//! - [`mdp`]: the policy generator — one worker's MDP (§4), value iteration
//!   (§4.1), expected accuracy and SLO violation (§5.1). A plain library, used
//!   natively by `sluice ramsis gen` and inside this component.
//! - [`grid`]: policies over a load grid (§3.2.2, §6).
//! - [`latency`]: latency-table preparation (regression fill, monotone fix,
//!   Pareto pruning, the synthetic models of §7.3.2).
//! - [`sim`]: a direct Monte-Carlo of one worker, to check the expectations.
//! - [`table`]: policy tables in JSON (the artifact-like map and the compact
//!   run-length form) and binary.
//! - [`sharing`]: how the workers of an app share the parsed tables and the
//!   generations through the binding's store, so the work is done once per
//!   app rather than once per worker.
//!
//! `docs/ramsis.md` describes the model as implemented and every place it
//! departs from the paper or the authors' artifact.

pub mod grid;
pub mod latency;
pub mod mdp;
pub mod runs;
pub mod sharing;
pub mod sim;
pub mod table;

use serde::{Deserialize, Serialize};
use sluice_sdk::{log, shared, Config, Decision, Level, Micros, Model, Policy, View};

use grid::{Entry, GridOptions, PolicySet};
use mdp::{Arrivals, Balancing, Batching, Discretization, Generator, ModelSpec, Problem, Space};
use sharing::{grid_load, load_index, Attempt, Published, INIT_KEY};
pub use table::{table_actions, table_of, table_rows, table_to_json, Table, TableKey};

/// The policy's parameters (all optional), e.g.
/// `{"discretization": "fld:100", "batching": "maximal", "threshold": 0.01}`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Params {
    /// Slack grid: `"fld:<D>"` (§4.2.2, default `fld:100`) or `"md"` (§4.2.1).
    pub discretization: String,
    /// `"maximal"` (default) or `"variable"` batching (§4.3.2).
    pub batching: Batching,
    /// Variable batching: derive the slack of a head left behind from the
    /// order statistics of the arrivals (default, Poisson only) rather than
    /// the conservative `T_j − τ`.
    pub variable_exact: bool,
    /// `"round_robin"` (default; what sluice's round-robin router does) or
    /// `"shortest_queue"` (Appendix I.1).
    pub balancing: Balancing,
    /// Arrival process: `{"kind": "poisson"}` (default) or
    /// `{"kind": "gamma_poisson", "dispersion": c}`.
    pub arrivals: Arrivals,
    /// `N_w` (§4.2.3), capped by the fastest model's largest batch.
    pub max_queue: u32,
    /// Grid threshold on adjacent expected accuracies (§6: 0.01).
    pub threshold: f64,
    /// Loads closer than this are not split further (requests/s).
    pub min_gap_qps: f64,
    /// Most policies kept.
    pub max_policies: usize,
    /// A fixed load λ (requests/s) instead of the host's estimate
    /// (`view.load_qps`), for experiments at a known load.
    pub load_qps: Option<f64>,
    /// Loads to generate in `init` (eagerly). Default: one policy, at
    /// `load_qps` if given, else at 90% of the fastest model's capacity (a
    /// conservative policy whose queue is still stable); the grid then grows
    /// lazily.
    pub grid: Option<Vec<f64>>,
    /// Lowest load the lazy grid goes down to (default: capacity / 64).
    pub min_load_qps: Option<f64>,
    /// A load above the grid gets a policy generated for `estimate · headroom`.
    pub headroom: f64,
    /// Work per `decide` spent on background generation, in the generator's
    /// work units (~multiply–adds; 50k ≈ 0.04 ms native, ≈ 0.2 ms in Wasm).
    /// Every worker generates for itself, so with many workers per core this
    /// is what background generation costs per decision. 0 disables it.
    pub slice_work: u64,
    /// Abandon a generation whose transition blocks exceed this many values
    /// (8 bytes each; the host caps a policy's memory, 64 MiB by default).
    pub max_block_values: usize,
    /// Value-iteration sweeps (artifact: 100).
    pub sweeps: u32,
    /// Most power iterations for the expectations (artifact: 1,000).
    pub power_iterations: u32,
    /// Precomputed policies (`sluice ramsis gen --out` tables), used instead
    /// of generating in `init`.
    pub policies: Vec<Precomputed>,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            discretization: "fld:100".into(),
            batching: Batching::Maximal,
            variable_exact: true,
            balancing: Balancing::RoundRobin,
            arrivals: Arrivals::Poisson,
            max_queue: 32,
            threshold: 0.01,
            min_gap_qps: 10.0,
            max_policies: 64,
            load_qps: None,
            grid: None,
            min_load_qps: None,
            headroom: 1.05,
            slice_work: 50_000,
            max_block_values: 4 << 20,
            sweeps: 100,
            power_iterations: 1000,
            policies: Vec::new(),
        }
    }
}

/// A policy generated elsewhere: its load and its table in the `--out` format
/// (`{"(n, j)": [model, batch], "full": [model, batch]}`, models 1-based in
/// increasing latency order of the Pareto models).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Precomputed {
    /// The load it was generated for.
    pub load_qps: f64,
    /// Its expected accuracy, if known (used by the lazy grid).
    #[serde(default)]
    pub expected_accuracy: f64,
    /// Its expected violation rate, if known.
    #[serde(default)]
    pub expected_violation: f64,
    /// The table.
    pub table: Table,
}

/// How long (host µs) the plan must keep asking for about the same load
/// before a background generation starts: two 500 ms load windows.
pub const STABLE_US: Micros = 1_000_000;

/// A generation running in the background, a slice per `decide`: attempt
/// `attempt` at grid load `index`, which this worker claimed.
struct Job {
    index: i64,
    attempt: u32,
    load_qps: f64,
    generator: Generator,
    /// Signs given so far, and when the next is due.
    beats: u32,
    next_beat: Micros,
    /// When the job next looks whether another attempt published first.
    next_check: Micros,
}

/// An attempt another worker claimed that this one waits on.
struct Target {
    index: i64,
    attempt: u32,
    /// The next sign expected from its claimer.
    beat: u32,
}

/// Waiting on generations other workers claimed.
struct Waiting {
    targets: Vec<Target>,
    /// When a claimer last signed (or the wait began).
    last_sign: Micros,
    next_poll: Micros,
}

impl Waiting {
    /// The highest load awaited.
    fn load_qps(&self) -> f64 {
        self.targets.iter().map(|t| grid_load(t.index)).fold(f64::NEG_INFINITY, f64::max)
    }
}

/// The RAMSIS policy for one worker.
pub struct Ramsis {
    params: Params,
    grid_options: GridOptions,
    /// The problem at some load (the load is set per generation).
    problem: Problem,
    space: Space,
    /// `Problem::models[i]` is `config.models[ids[i]]`.
    ids: Vec<u32>,
    models: Vec<Model>,
    set: PolicySet,
    job: Option<Job>,
    waiting: Option<Waiting>,
    min_load: f64,
    /// Whether background generation gave up (memory cap, error).
    stalled: bool,
    /// The load estimate of the last `decide`.
    last_estimate: Option<f64>,
    /// The load the plan has asked for, and since when (host µs).
    pending: Option<(f64, Micros)>,
}

impl std::fmt::Debug for Ramsis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ramsis")
            .field("params", &self.params)
            .field("policies", &self.set.entries.len())
            .finish_non_exhaustive()
    }
}

impl Ramsis {
    /// The policies generated so far, by load.
    pub fn policies(&self) -> &PolicySet {
        &self.set
    }

    /// The prepared state space (grid, models in latency order).
    pub fn space(&self) -> &Space {
        &self.space
    }

    /// Whether a background generation is running.
    pub fn generating(&self) -> Option<f64> {
        self.job.as_ref().map(|j| j.load_qps)
    }

    /// The load of another worker's generation this one waits on, if any.
    pub fn waiting_for(&self) -> Option<f64> {
        self.waiting.as_ref().map(Waiting::load_qps)
    }

    /// Builds the worker's MDP from the app's models, SLO and K; the policy
    /// set starts empty.
    fn prepare(config: &Config, params: Params) -> Result<Ramsis, String> {
        let discretization: Discretization = params.discretization.parse().map_err(|e| format!("ramsis: {e}"))?;
        let mut ids = Vec::new();
        let mut specs = Vec::new();
        for m in &config.models {
            if m.latency.is_empty() {
                continue;
            }
            let mut latency: Vec<f64> = m.latency.iter().map(|&l| l as f64).collect();
            latency::make_monotone(&mut latency);
            ids.push(m.id);
            specs.push(ModelSpec { name: m.name.clone(), accuracy: m.accuracy.clamp(0.0, 1.0), latency_us: latency });
        }
        if specs.is_empty() {
            return Err("ramsis: no model has a latency profile".into());
        }
        let mut problem = Problem::new(specs, config.slo as f64, config.workers.max(1), 1.0);
        problem.discretization = discretization;
        problem.batching = params.batching;
        problem.variable_exact = params.variable_exact;
        problem.balancing = params.balancing;
        problem.arrivals = params.arrivals;
        problem.sweeps = params.sweeps;
        problem.power_iterations = params.power_iterations;
        // N_w cannot exceed the fastest model's largest batch: maximal
        // batching serves the whole queue in one batch.
        let fastest = {
            let probe = Space::new(&Problem { max_queue: 1, ..problem.clone() }).map_err(|e| format!("ramsis: {e}"))?;
            problem.models[probe.models[0]].latency_us.len() as u32
        };
        problem.max_queue = params.max_queue.min(fastest).max(1);
        let space = Space::new(&problem).map_err(|e| format!("ramsis: {e}"))?;
        let capacity = grid::capacity_qps(&problem).map_err(|e| format!("ramsis: {e}"))?;
        let min_load = params.min_load_qps.unwrap_or(capacity / 64.0).max(1.0);
        let grid_options = GridOptions {
            threshold: params.threshold,
            min_gap_qps: params.min_gap_qps,
            max_policies: params.max_policies.max(1),
        };
        Ok(Ramsis {
            grid_options,
            problem,
            space,
            ids,
            models: config.models.clone(),
            set: PolicySet::default(),
            job: None,
            waiting: None,
            min_load,
            stalled: false,
            last_estimate: None,
            pending: None,
            params,
        })
    }

    /// The load the first policy is generated for when `params` names none:
    /// 90% of the fastest model's capacity (a conservative policy whose queue
    /// is still stable), not below the lowest load of the lazy grid.
    fn default_load(&self) -> Result<f64, String> {
        let capacity = grid::capacity_qps(&self.problem).map_err(|e| format!("ramsis: {e}"))?;
        Ok((0.9 * capacity).max(self.min_load))
    }

    /// Generates a policy for `load_qps` to completion (used by `init`).
    fn generate_now(&mut self, load_qps: f64) -> Result<(), String> {
        let mut problem = self.problem.clone();
        problem.load_qps = load_qps;
        let mut generator = Generator::new(&problem).map_err(|e| e.to_string())?;
        while !generator.step(1 << 20) {
            if generator.block_stats().1 > self.params.max_block_values {
                return Err(format!(
                    "the MDP needs more than {} transition values (max_block_values); \
                     use a coarser discretization or fewer models",
                    self.params.max_block_values
                ));
            }
        }
        let solution = generator.solution().ok_or("generation did not finish")?;
        self.set.insert(solution.into());
        Ok(())
    }

    /// Spends one slice of background work: advances the running generation,
    /// looks for the one this worker waits on, or starts what the grid needs
    /// at this load estimate.
    ///
    /// A generation starts only once the plan has asked for about the same
    /// load (within 10%) for [`STABLE_US`] of host time, so the ramp of the
    /// 500 ms load window after a start or a step does not start generations
    /// for loads that are gone a second later; and a running generation is
    /// abandoned when the estimate rises above its load (it could not serve it).
    ///
    /// The workers of an app share generations through the binding's store
    /// ([`sharing`]): the planned load is rounded up to the 1% grid; a policy
    /// another worker published near it is taken as it is; one another worker
    /// is generating is waited for; otherwise this worker claims the load,
    /// generates it a slice per call, signing as it goes, and publishes it.
    fn background(&mut self, estimate: f64, now: Micros) {
        if self.params.slice_work == 0 || self.stalled {
            return;
        }
        if let Some(job) = &self.job {
            if estimate > job.load_qps && self.set.covering(estimate).is_none() {
                log(
                    Level::Info,
                    &format!(
                        "ramsis: load {estimate:.0} QPS passed the policy being generated ({:.0} QPS)",
                        job.load_qps
                    ),
                );
                sharing::bury(job.index, job.attempt);
                self.job = None;
            }
        }
        if self.waiting.is_some() {
            self.poll(estimate, now);
            return;
        }
        if self.job.is_none() {
            self.start(estimate, now);
            return;
        }
        let Some(job) = self.job.as_mut() else {
            return;
        };
        if now >= job.next_beat {
            sharing::sign(job.index, job.attempt, job.beats);
            job.beats += 1;
            job.next_beat = now + sharing::BEAT_US;
        }
        if now >= job.next_check {
            // An earlier attempt's claimer may have finished after all.
            job.next_check = now + sharing::POLL_US;
            if let Published::Policy(entry) = sharing::fetch(job.index) {
                self.set.insert(entry);
                self.job = None;
                return;
            }
        }
        let done = job.generator.step(self.params.slice_work);
        if job.generator.block_stats().1 > self.params.max_block_values {
            log(Level::Warn, "ramsis: background generation exceeds max_block_values; the grid stays as it is");
            sharing::publish_failure(job.index);
            self.job = None;
            self.stalled = true;
            return;
        }
        if done {
            if let Some(job) = self.job.take() {
                if let Some(solution) = job.generator.solution() {
                    log(
                        Level::Info,
                        &format!(
                            "ramsis: policy for {:.0} QPS ready (E[acc] {:.4}, E[viol] {:.4})",
                            job.load_qps, solution.expected_accuracy, solution.expected_violation
                        ),
                    );
                    let entry: Entry = solution.into();
                    sharing::publish(job.index, &entry);
                    self.set.insert(entry);
                }
            }
        }
    }

    /// Plans the next load and takes it from the store, waits for it, or
    /// claims and starts generating it (see [`Ramsis::background`]).
    fn start(&mut self, estimate: f64, now: Micros) {
        // Below `min_load` the lowest policy serves; nothing is generated.
        if estimate < self.min_load {
            self.pending = None;
            return;
        }
        let Some(load) = self.set.plan(estimate, self.params.headroom, self.min_load, &self.grid_options) else {
            self.pending = None;
            return;
        };
        // Candidates: grid loads that still cover the estimate, up to a little
        // above the target. A policy of the set among them is close enough.
        let target = load_index(load);
        let candidates = load_index(estimate).max(target - 5)..=target + sharing::ACCEPT_ABOVE;
        let (lo, hi) = (grid_load(*candidates.start()) * (1.0 - 1e-12), grid_load(*candidates.end()) * (1.0 + 1e-12));
        if self.set.entries.iter().any(|e| e.load_qps >= lo && e.load_qps <= hi) {
            self.pending = None;
            return;
        }
        match self.pending {
            Some((wanted, since)) if (load - wanted).abs() <= 0.1 * wanted => {
                if now.saturating_sub(since) < STABLE_US {
                    return;
                }
            }
            _ => {
                self.pending = Some((load, now));
                return;
            }
        }
        self.pending = None;
        // Published by another worker?
        let (found, open) = self.take_published(candidates);
        if found || self.stalled {
            return;
        }
        // Being generated by another worker?
        let live: Vec<Target> = open
            .into_iter()
            .filter_map(|index| match sharing::attempt(index) {
                Attempt::Live(attempt) => Some(Target { index, attempt, beat: 0 }),
                _ => None,
            })
            .collect();
        if !live.is_empty() {
            self.wait(live, now);
            return;
        }
        // Claim the next attempt at the target (one worker gets it).
        match sharing::attempt(target) {
            Attempt::Free(attempt) if sharing::claim(target, attempt) => self.begin(target, attempt, now),
            Attempt::Free(attempt) | Attempt::Live(attempt) => {
                self.wait(vec![Target { index: target, attempt, beat: 0 }], now)
            }
            Attempt::Exhausted => {
                log(Level::Warn, "ramsis: too many abandoned generations of one load; the grid stays as it is");
                self.stalled = true;
            }
        }
    }

    fn wait(&mut self, targets: Vec<Target>, now: Micros) {
        self.waiting = Some(Waiting { targets, last_sign: now, next_poll: now });
    }

    /// Takes the policies other workers published for these grid loads into the
    /// set; whether there was one, and the loads with nothing published yet. A
    /// load another worker could not generate stalls this worker's background
    /// generation too (the same MDP would fail here).
    fn take_published(&mut self, indices: impl IntoIterator<Item = i64>) -> (bool, Vec<i64>) {
        let mut found = false;
        let mut open = Vec::new();
        for i in indices {
            match sharing::fetch(i) {
                Published::Policy(entry) => {
                    self.set.insert(entry);
                    found = true;
                }
                Published::Failed => {
                    if !self.stalled {
                        log(
                            Level::Warn,
                            "ramsis: another worker could not generate this load; the grid stays as it is",
                        );
                    }
                    self.stalled = true;
                }
                Published::None => open.push(i),
            }
        }
        (found, open)
    }

    /// Starts generating attempt `attempt` at grid load `index`, claimed.
    fn begin(&mut self, index: i64, attempt: u32, now: Micros) {
        let load_qps = grid_load(index);
        let mut problem = self.problem.clone();
        problem.load_qps = load_qps;
        match Generator::new(&problem) {
            Ok(generator) => {
                self.job = Some(Job {
                    index,
                    attempt,
                    load_qps,
                    generator,
                    beats: 0,
                    next_beat: now,
                    next_check: now + sharing::POLL_US,
                })
            }
            Err(e) => {
                log(Level::Warn, &format!("ramsis: cannot generate for {load_qps:.0} QPS: {e}"));
                sharing::publish_failure(index);
                self.stalled = true;
            }
        }
    }

    /// Looks for the generations this worker waits on (every [`sharing::POLL_US`]):
    /// takes a published policy; plans again when every awaited attempt died,
    /// or declares them dead after [`sharing::WAIT_TIMEOUT_US`] without a sign
    /// (then one worker claims the next attempt).
    fn poll(&mut self, estimate: f64, now: Micros) {
        let Some(w) = self.waiting.as_mut() else { return };
        if estimate > w.load_qps() && self.set.covering(estimate).is_none() {
            // The load passed what is being generated: plan again.
            self.waiting = None;
            return;
        }
        if now < w.next_poll {
            return;
        }
        w.next_poll = now + sharing::POLL_US;
        for t in &mut w.targets {
            while sharing::signed(t.index, t.attempt, t.beat) {
                t.beat += 1;
                w.last_sign = now;
            }
        }
        let indices: Vec<i64> = w.targets.iter().map(|t| t.index).collect();
        let (found, _) = self.take_published(indices);
        let Some(w) = self.waiting.as_mut() else { return };
        if found || self.stalled {
            self.waiting = None;
            return;
        }
        w.targets.retain(|t| !sharing::dead(t.index, t.attempt));
        if w.targets.is_empty() {
            self.waiting = None;
        } else if now.saturating_sub(w.last_sign) >= sharing::WAIT_TIMEOUT_US {
            for t in &w.targets {
                sharing::bury(t.index, t.attempt);
            }
            self.waiting = None;
        }
    }

    /// The decision for `view` under policy `entry`.
    fn lookup(&self, entry: &Entry, view: &View) -> Decision {
        let n = view.queue.len();
        let slack = view.queue[0].deadline as f64 - view.now as f64;
        let action = if n > self.space.max_queue {
            entry.policy[self.space.full()]
        } else {
            entry.policy[self.space.state(n, self.space.quantize(slack))]
        };
        let mdp_model = usize::from(action.model);
        let id = self.ids[self.space.models[mdp_model]];
        let loaded = view.loaded.is_empty() || view.loaded.contains(&id);
        let model = if loaded {
            &self.models[id as usize]
        } else {
            // The allocator unloaded the chosen model: the most accurate loaded
            // model that meets the head's slack at this batch, else the fastest.
            match self.fallback(view, n, slack) {
                Some(m) => m,
                None => return Decision::Idle,
            }
        };
        let batch = (n as u32).min(u32::from(action.batch).max(1)).min(model.max_batch()).max(1);
        Decision::serve_head(model.id, batch)
    }

    fn fallback(&self, view: &View, n: usize, slack: f64) -> Option<&Model> {
        let loaded: Vec<&Model> =
            self.models.iter().filter(|m| view.loaded.contains(&m.id) && !m.latency.is_empty()).collect();
        let fits = |m: &&&Model| {
            let b = (n as u32).min(m.max_batch());
            m.latency(b).is_some_and(|l| (l as f64) <= slack)
        };
        loaded
            .iter()
            .filter(fits)
            .max_by(|a, b| a.accuracy.total_cmp(&b.accuracy))
            .or_else(|| loaded.iter().min_by_key(|m| m.latency.first().copied().unwrap_or(Micros::MAX)))
            .copied()
    }
}

impl Policy for Ramsis {
    // `observe` is the default no-op: the host need not call it after each batch.
    const OBSERVES: bool = false;

    fn init(config: Config) -> Result<Self, String> {
        // Another worker of this binding did the work already: take its result
        // (the params without the tables, and the policy set).
        if let Some(blob) = shared::get(INIT_KEY) {
            match decode_init(&blob) {
                Some((params, set)) => {
                    let mut ramsis = Ramsis::prepare(&config, params)?;
                    ramsis.set = set;
                    return Ok(ramsis);
                }
                None => log(Level::Warn, "ramsis: the shared initial state is unreadable; initialising from params"),
            }
        }
        let mut params: Params = config.params().map_err(|e| format!("ramsis: {e}"))?;
        let precomputed = std::mem::take(&mut params.policies);
        let mut ramsis = Ramsis::prepare(&config, params)?;
        if !precomputed.is_empty() {
            for p in precomputed {
                let policy = table_actions(&ramsis.space, &p.table).map_err(|e| format!("ramsis: policies: {e}"))?;
                ramsis.set.insert(Entry {
                    load_qps: p.load_qps,
                    expected_accuracy: p.expected_accuracy,
                    expected_violation: p.expected_violation,
                    policy: policy.into(),
                });
            }
        } else {
            let loads = match (&ramsis.params.grid, ramsis.params.load_qps) {
                (Some(loads), _) if !loads.is_empty() => loads.clone(),
                (_, Some(load)) => vec![load],
                _ => vec![ramsis.default_load()?],
            };
            for load in loads {
                ramsis.generate_now(load).map_err(|e| format!("ramsis: {e}"))?;
            }
        }
        shared::put(INIT_KEY, &encode_init(&ramsis.params, &ramsis.set));
        Ok(ramsis)
    }

    fn decide(&mut self, view: &View) -> Decision {
        let estimate = self.params.load_qps.unwrap_or(view.load_qps);
        self.last_estimate = Some(estimate);
        let decision = if view.queue.is_empty() {
            Decision::Idle
        } else {
            match self.set.select(estimate) {
                Some(entry) => self.lookup(entry, view),
                None => Decision::Idle,
            }
        };
        self.background(estimate, view.now);
        decision
    }

    /// The load bucket in use (the policy serving the last estimate), its
    /// expectations, the grid and any background generation.
    fn status(&self) -> String {
        let estimate = self.last_estimate.or(self.params.load_qps);
        let selected = estimate.and_then(|e| self.set.select(e)).or(self.set.entries.last());
        serde_json::json!({
            "load_estimate_qps": estimate,
            "policy_load_qps": selected.map(|e| e.load_qps),
            "expected_accuracy": selected.map(|e| e.expected_accuracy),
            "expected_violation": selected.map(|e| e.expected_violation),
            "grid_qps": self.set.entries.iter().map(|e| e.load_qps).collect::<Vec<_>>(),
            "generating_qps": self.generating(),
            "waiting_for_qps": self.waiting_for(),
            "stalled": self.stalled,
        })
        .to_string()
    }
}

/// The binding's initial state for the shared store: the params (without
/// their tables: the set holds them) as JSON, then the set in binary.
fn encode_init(params: &Params, set: &PolicySet) -> Vec<u8> {
    let json = serde_json::to_vec(params).unwrap_or_default();
    let mut bytes = (json.len() as u32).to_le_bytes().to_vec();
    bytes.extend_from_slice(&json);
    table::encode_set(set, &mut bytes);
    bytes
}

fn decode_init(bytes: &[u8]) -> Option<(Params, PolicySet)> {
    let mut rest = bytes;
    let n = u32::from_le_bytes(table::take(&mut rest)?) as usize;
    let params = serde_json::from_slice(rest.get(..n)?).ok()?;
    rest = &rest[n..];
    let set = table::decode_set(&mut rest)?;
    Some((params, set))
}

sluice_sdk::export_policy!(Ramsis);

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sdk::testing::{config, linear_model, pending, Harness};

    fn models() -> Vec<Model> {
        vec![
            linear_model(0, "fast", 0.6, 5_000, 3_000, 16),
            linear_model(1, "slow", 0.8, 20_000, 10_000, 16),
            linear_model(2, "dominated", 0.5, 30_000, 10_000, 16),
        ]
    }

    fn cfg(params: &str) -> Config {
        let mut c = config(100_000, models(), params);
        c.workers = 4;
        c
    }

    #[test]
    fn init_generates_and_decide_looks_up() {
        let mut h =
            Harness::<Ramsis>::new(cfg(r#"{"load_qps": 200, "max_queue": 12, "discretization": "fld:50"}"#)).unwrap();
        let view = h.view(0, 200.0, vec![pending(0, 0, 100_000)]);
        let d = h.decide_checked(&view).unwrap();
        let dispatch = d.as_dispatch().expect("serves");
        // A lone request with the whole SLO ahead: the accurate model fits.
        assert_eq!(dispatch.model, 1);
        assert_eq!(dispatch.take, vec![0]);
        // Almost no slack left: only the fastest model (or late serving).
        let view = h.view(93_000, 200.0, vec![pending(0, 0, 100_000)]);
        let d = h.decide_checked(&view).unwrap();
        assert_eq!(d.as_dispatch().unwrap().model, 0);
    }

    #[test]
    fn bad_params_are_rejected() {
        assert!(Harness::<Ramsis>::new(cfg(r#"{"discretization": "fld:x"}"#)).is_err());
        assert!(Harness::<Ramsis>::new(cfg(r#"{"nope": 1}"#)).is_err());
    }

    #[test]
    fn grows_the_grid_in_the_background() {
        sluice_sdk::testing::clear_shared();
        let params = r#"{"load_qps": 200, "max_queue": 12, "discretization": "fld:50", "slice_work": 50000}"#;
        let mut policy = Ramsis::init(cfg(params)).unwrap();
        assert_eq!(policy.policies().entries.len(), 1);
        policy.params.load_qps = Some(400.0);
        let mut view = View {
            now: 0,
            worker: 0,
            workers: 4,
            load_qps: 400.0,
            loaded: vec![0, 1, 2],
            queue: vec![pending(0, 0, 100_000)],
        };
        let mut calls = 0;
        while policy.policies().entries.len() < 2 {
            // One decision every 10 ms of host time, the request always fresh.
            view.now = calls * 10_000;
            view.queue = vec![pending(0, view.now, 100_000)];
            let d = policy.decide(&view);
            assert!(d.as_dispatch().is_some(), "serves while generating");
            calls += 1;
            assert!(calls < 100_000, "background generation never finished");
        }
        assert!(calls > 100, "waits for a stable estimate, then slices the work ({calls})");
        let status: serde_json::Value = serde_json::from_str(&policy.status()).unwrap();
        assert_eq!(status["load_estimate_qps"], serde_json::json!(400.0));
        assert!(status["policy_load_qps"].as_f64().unwrap() > 400.0, "{status}");
        assert!(status["expected_accuracy"].as_f64().unwrap() > 0.6, "{status}");
        let loads: Vec<f64> = policy.policies().entries.iter().map(|e| e.load_qps).collect();
        // 400 · 1.05, rounded up to the 1% grid.
        assert!(loads.iter().any(|&l| (420.0..420.0 * 1.01).contains(&l)), "{loads:?}");
    }

    #[test]
    fn precomputed_tables_round_trip() {
        sluice_sdk::testing::clear_shared();
        let mut policy =
            Ramsis::init(cfg(r#"{"load_qps": 200, "max_queue": 12, "discretization": "fld:50"}"#)).unwrap();
        let entry = policy.set.entries[0].clone();
        let json = table_to_json(&policy.space, &entry.policy);
        let table: Table = serde_json::from_value(serde_json::Value::Object(json.clone())).unwrap();
        let back = table_actions(&policy.space, &table).unwrap();
        assert_eq!(back, entry.policy.to_vec());
        let compact: Table = serde_json::from_value(table_rows(&policy.space, &entry.policy)).unwrap();
        assert_eq!(table_actions(&policy.space, &compact).unwrap(), entry.policy.to_vec());
        let params = serde_json::json!({
            "max_queue": 12, "discretization": "fld:50",
            "policies": [{"load_qps": 200.0, "table": json}],
        });
        sluice_sdk::testing::clear_shared();
        let other = Ramsis::init(cfg(&params.to_string())).unwrap();
        assert_eq!(other.set.entries[0].policy, entry.policy);
        assert!(other.params.policies.is_empty(), "the tables live in the set only");
        // A malformed table is an init error naming the key, not a panic.
        for bad in [
            serde_json::json!({"policies": [{"load_qps": 1.0, "table": {"(99, 0)": [1, 1]}}]}),
            serde_json::json!({"policies": [{"load_qps": 1.0, "table": {"(1 0)": [1, 1]}}]}),
            serde_json::json!({"policies": [{"load_qps": 1.0, "table": {"(1, 0)": [7, 1]}}]}),
        ] {
            sluice_sdk::testing::clear_shared();
            let e = Ramsis::init(cfg(&bad.to_string())).unwrap_err();
            assert!(e.contains("(99, 0)") || e.contains("(1 0)") || e.contains("model 7"), "{e}");
        }
        policy.set.entries.clear();
    }

    #[test]
    fn workers_of_a_binding_share_init() {
        sluice_sdk::testing::clear_shared();
        let params = r#"{"load_qps": 200, "max_queue": 12, "discretization": "fld:50"}"#;
        let first = Ramsis::init(cfg(params)).unwrap();
        // The second worker finds the first one's state: same params, same
        // policies, and no generation of its own (a poisoned generator budget
        // would fail it otherwise).
        let mut c = cfg(r#"{"max_block_values": 1}"#);
        c.worker = 1;
        let second = Ramsis::init(c).unwrap();
        assert_eq!(second.params, first.params);
        assert_eq!(second.set, first.set);
        // A new binding (empty store) with those params must generate, and fails.
        sluice_sdk::testing::clear_shared();
        assert!(Ramsis::init(cfg(r#"{"max_block_values": 1}"#)).is_err());
    }

    /// A view at `now` with one fresh request and this load estimate.
    fn fresh(now: Micros, worker: u32, load: f64) -> View {
        View { now, worker, workers: 4, load_qps: load, loaded: vec![0, 1, 2], queue: vec![pending(0, now, 100_000)] }
    }

    /// `n` workers of one binding (the native store is per thread), the first
    /// generating ~420 QPS under its claim and the others waiting on it.
    fn claimer_and_waiters(n: u32) -> (Vec<Ramsis>, Micros) {
        let mut workers = binding(n, 1_000);
        let mut now = 0;
        while workers[1..].iter().any(|p| p.waiting_for().is_none()) {
            now += 10_000;
            step(&mut workers, now, 400.0);
            assert!(now < 10_000_000, "never waited");
        }
        assert!(workers[0].generating().is_some());
        (workers, now)
    }

    /// `n` workers of a new binding (an empty native store), their first
    /// policy generated for 200 QPS, then following the load estimate.
    fn binding(n: u32, slice_work: u64) -> Vec<Ramsis> {
        sluice_sdk::testing::clear_shared();
        let params =
            format!(r#"{{"load_qps": 200, "max_queue": 12, "discretization": "fld:50", "slice_work": {slice_work}}}"#);
        (0..n)
            .map(|w| {
                let mut c = cfg(&params);
                c.worker = w;
                let mut p = Ramsis::init(c).unwrap();
                p.params.load_qps = None;
                p
            })
            .collect()
    }

    /// One decision of each worker at `now`.
    fn step(workers: &mut [Ramsis], now: Micros, load: f64) {
        for (w, p) in workers.iter_mut().enumerate() {
            assert!(p.decide(&fresh(now, w as u32, load)).as_dispatch().is_some(), "serves while generating");
        }
    }

    #[test]
    fn after_an_abandonment_one_waiter_claims_the_next_attempt() {
        let (mut workers, mut now) = claimer_and_waiters(3);
        // The load jumps past the claimer's generation: it drops it and says so.
        workers[0].decide(&fresh(now, 0, 2_000.0));
        assert!(workers[0].generating().is_none());
        let mut waiters = workers.split_off(1);
        while waiters.iter().all(|p| p.generating().is_none()) {
            now += 10_000;
            step(&mut waiters, now, 400.0);
            assert!(now < 30_000_000, "no waiter took over");
        }
        for _ in 0..3 {
            now += sharing::POLL_US;
            step(&mut waiters, now, 400.0);
        }
        let generating = waiters.iter().filter(|p| p.generating().is_some()).count();
        let waiting = waiters.iter().filter(|p| p.waiting_for().is_some()).count();
        assert_eq!((generating, waiting), (1, 1), "one generates the next attempt, the other waits for it");
    }

    #[test]
    fn a_waiter_takes_over_when_the_claimer_stops_deciding() {
        let (mut workers, mut now) = claimer_and_waiters(2);
        let since = now;
        while workers[1].generating().is_none() {
            now += 100_000;
            workers[1].decide(&fresh(now, 1, 400.0));
            assert!(now < since + 2 * sharing::WAIT_TIMEOUT_US, "waited for ever");
        }
        assert!(now >= since + sharing::WAIT_TIMEOUT_US, "gave up after {} s", (now - since) / 1_000_000);
    }

    #[test]
    fn a_waiter_keeps_waiting_while_the_claimer_signs() {
        let (mut workers, mut now) = claimer_and_waiters(2);
        // One decision each per second of host time: the claimer's generation
        // runs far longer than the wait timeout, signing as it goes.
        let started = now;
        while workers[0].generating().is_some() {
            now += 1_000_000;
            step(&mut workers, now, 400.0);
            assert!(workers[1].generating().is_none(), "the waiter generated while the claimer signed");
        }
        let took = now - started;
        assert!(took > 2 * sharing::WAIT_TIMEOUT_US, "the generation took {} s", took / 1_000_000);
        now += sharing::POLL_US;
        workers[1].decide(&fresh(now, 1, 400.0));
        assert!(workers[1].waiting_for().is_none());
        assert_eq!(workers[1].policies(), workers[0].policies(), "the waiter took the claimer's policy");
    }

    #[test]
    fn a_later_attempt_takes_an_earlier_attempts_policy_when_it_comes() {
        let (mut workers, mut now) = claimer_and_waiters(2);
        // The waiter times out while the claimer is silent, and takes over.
        let since = now;
        while workers[1].generating().is_none() {
            now += 100_000;
            workers[1].decide(&fresh(now, 1, 400.0));
            assert!(now < since + 2 * sharing::WAIT_TIMEOUT_US, "waited for ever");
        }
        // The first claimer comes back and finishes; the second drops its work.
        while workers[0].generating().is_some() {
            now += 10_000;
            workers[0].decide(&fresh(now, 0, 400.0));
        }
        now += sharing::POLL_US;
        workers[1].decide(&fresh(now, 1, 400.0));
        assert!(workers[1].generating().is_none(), "took the published policy instead");
        assert_eq!(workers[1].policies(), workers[0].policies());
    }

    #[test]
    fn workers_share_background_generations() {
        let mut workers = binding(3, 50_000);
        // Each worker sees a slightly different estimate, as the host's moving
        // window gives them; all within the grid step of one another.
        let mut generated = [false; 3];
        let mut waited = [false; 3];
        let mut calls = 0u64;
        while workers.iter().any(|p| p.policies().entries.len() < 2) {
            for (w, p) in workers.iter_mut().enumerate() {
                let view = fresh(calls * 10_000 + w as u64 * 1_000, w as u32, 400.0 + w as f64);
                assert!(p.decide(&view).as_dispatch().is_some(), "serves while generating");
                generated[w] |= p.generating().is_some();
                waited[w] |= p.waiting_for().is_some();
            }
            calls += 1;
            assert!(calls < 100_000, "background generation never finished");
        }
        let loads: Vec<Vec<f64>> =
            workers.iter().map(|p| p.policies().entries.iter().map(|e| e.load_qps).collect()).collect();
        // One generation, published by its claimer and taken by the others.
        assert_eq!(loads[0], loads[1]);
        assert_eq!(loads[0], loads[2]);
        assert_eq!(generated, [true, false, false], "one worker generates");
        assert_eq!(waited, [false, true, true], "the others wait for it");
        assert!(workers.iter().all(|p| p.waiting_for().is_none()), "nobody still waits");
        let new = loads[0].iter().copied().find(|&l| l != 200.0).unwrap();
        assert!((400.0 * 1.05..400.0 * 1.05 * 1.03).contains(&new), "{new}");
        assert_eq!(load_index(new), load_index(new * (1.0 - 1e-12)), "a grid load");
    }
}
