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
//!
//! `docs/ramsis.md` describes the model as implemented and every place it
//! departs from the paper or the authors' artifact.

pub mod grid;
pub mod latency;
pub mod mdp;
pub mod sim;

use serde::{Deserialize, Serialize};
use sluice_sdk::{log, Config, Decision, Level, Micros, Model, Policy, View};

use grid::{Entry, GridOptions, PolicySet};
use mdp::{Action, Arrivals, Balancing, Batching, Discretization, Generator, ModelSpec, Problem, Space};

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
    pub table: serde_json::Map<String, serde_json::Value>,
}

/// The policy table as JSON: `"(n, j)"` → `[model, batch]` (model 1-based in
/// latency order), the full-queue state as `"full"`; empty queues omitted.
pub fn table_to_json(space: &Space, policy: &[Action]) -> serde_json::Map<String, serde_json::Value> {
    let mut map = serde_json::Map::new();
    for (s, a) in policy.iter().enumerate() {
        let key = if s == space.full() {
            "full".to_string()
        } else {
            let (n, j) = space.split(s);
            if n == 0 {
                continue;
            }
            format!("({n}, {j})")
        };
        map.insert(key, serde_json::json!([a.model + 1, a.batch]));
    }
    map
}

/// Parses a table written by [`table_to_json`] for `space`.
pub fn table_from_json(
    space: &Space,
    table: &serde_json::Map<String, serde_json::Value>,
) -> Result<Vec<Action>, String> {
    let mut policy = vec![Action::WAIT; space.state_count()];
    let models = space.models.len();
    for (key, value) in table {
        let pair: Vec<u64> = serde_json::from_value(value.clone()).map_err(|e| format!("`{key}`: {e}"))?;
        let [model, batch] = pair[..] else {
            return Err(format!("`{key}`: expected [model, batch]"));
        };
        if model == 0 || model as usize > models {
            return Err(format!("`{key}`: model {model} out of 1..={models}"));
        }
        let action = Action { model: (model - 1) as u16, batch: batch as u16 };
        let s = if key == "full" {
            space.full()
        } else {
            let inner = key.trim().trim_start_matches('(').trim_end_matches(')');
            let mut it = inner.split(',').map(|x| x.trim().parse::<usize>());
            match (it.next(), it.next()) {
                (Some(Ok(n)), Some(Ok(j))) if n <= space.max_queue && j < space.slack_levels() => space.state(n, j),
                _ => return Err(format!("bad state key `{key}`")),
            }
        };
        policy[s] = action;
    }
    // Every non-empty state needs an action (the grid and N_w must match the
    // ones the table was generated with).
    for (s, a) in policy.iter().enumerate().skip(space.slack_levels()) {
        if a.batch == 0 {
            let key = if s == space.full() {
                "full".to_string()
            } else {
                let (n, j) = space.split(s);
                format!("({n}, {j})")
            };
            return Err(format!(
                "no action for state {key}: was the table generated with this discretization and max_queue?"
            ));
        }
    }
    Ok(policy)
}

/// How long (host µs) the plan must keep asking for about the same load
/// before a background generation starts: two 500 ms load windows.
pub const STABLE_US: Micros = 1_000_000;

/// A generation running in the background, a slice per `decide`.
struct Job {
    load_qps: f64,
    generator: Generator,
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

    /// Spends one slice of background work: advances the running generation
    /// or starts the next one the grid needs at this load estimate.
    ///
    /// A generation starts only once the plan has asked for about the same
    /// load (within 10%) for [`STABLE_US`] of host time, so the ramp of the
    /// 500 ms load window after a start or a step does not start generations
    /// for loads that are gone a second later; and a running generation is
    /// abandoned when the estimate rises above its load (it could not serve it).
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
                self.job = None;
            }
        }
        if self.job.is_none() {
            // Below `min_load` the lowest policy serves; nothing is generated.
            if estimate < self.min_load {
                self.pending = None;
                return;
            }
            let Some(load) = self.set.plan(estimate, self.params.headroom, self.min_load, &self.grid_options) else {
                self.pending = None;
                return;
            };
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
            let mut problem = self.problem.clone();
            problem.load_qps = load;
            match Generator::new(&problem) {
                Ok(generator) => self.job = Some(Job { load_qps: load, generator }),
                Err(e) => {
                    log(Level::Warn, &format!("ramsis: cannot generate for {load:.0} QPS: {e}"));
                    self.stalled = true;
                }
            }
            return; // starting is this call's slice
        }
        let Some(job) = self.job.as_mut() else {
            return;
        };
        let done = job.generator.step(self.params.slice_work);
        if job.generator.block_stats().1 > self.params.max_block_values {
            log(Level::Warn, "ramsis: background generation exceeds max_block_values; the grid stays as it is");
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
                    self.set.insert(solution.into());
                }
            }
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
    fn init(config: Config) -> Result<Self, String> {
        let params: Params = config.params().map_err(|e| format!("ramsis: {e}"))?;
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
        let mut ramsis = Ramsis {
            grid_options,
            problem,
            space,
            ids,
            models: config.models.clone(),
            set: PolicySet::default(),
            job: None,
            min_load,
            stalled: false,
            last_estimate: None,
            pending: None,
            params,
        };
        if !ramsis.params.policies.is_empty() {
            for p in ramsis.params.policies.clone() {
                let policy = table_from_json(&ramsis.space, &p.table).map_err(|e| format!("ramsis: policies: {e}"))?;
                ramsis.set.insert(Entry {
                    load_qps: p.load_qps,
                    expected_accuracy: p.expected_accuracy,
                    expected_violation: p.expected_violation,
                    policy,
                });
            }
        } else {
            let loads = match (&ramsis.params.grid, ramsis.params.load_qps) {
                (Some(loads), _) if !loads.is_empty() => loads.clone(),
                (_, Some(load)) => vec![load],
                _ => vec![(0.9 * capacity).max(min_load)],
            };
            for load in loads {
                ramsis.generate_now(load).map_err(|e| format!("ramsis: {e}"))?;
            }
        }
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
            "stalled": self.stalled,
        })
        .to_string()
    }
}

sluice_sdk::export_policy!(Ramsis);

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sdk::testing::{config, pending, Harness};

    fn models() -> Vec<Model> {
        let line = |a: u64, b: u64| (0..16).map(|i| a + b * i).collect::<Vec<_>>();
        vec![
            Model { id: 0, name: "fast".into(), accuracy: 0.6, latency: line(5_000, 3_000) },
            Model { id: 1, name: "slow".into(), accuracy: 0.8, latency: line(20_000, 10_000) },
            Model { id: 2, name: "dominated".into(), accuracy: 0.5, latency: line(30_000, 10_000) },
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
        assert!(loads.iter().any(|l| (l - 420.0).abs() < 1e-6), "{loads:?}");
    }

    #[test]
    fn precomputed_tables_round_trip() {
        let mut policy =
            Ramsis::init(cfg(r#"{"load_qps": 200, "max_queue": 12, "discretization": "fld:50"}"#)).unwrap();
        let entry = policy.set.entries[0].clone();
        let json = table_to_json(&policy.space, &entry.policy);
        let back = table_from_json(&policy.space, &json).unwrap();
        assert_eq!(back, entry.policy);
        let params = serde_json::json!({
            "max_queue": 12, "discretization": "fld:50",
            "policies": [{"load_qps": 200.0, "table": json}],
        });
        let other = Ramsis::init(cfg(&params.to_string())).unwrap();
        assert_eq!(other.set.entries[0].policy, entry.policy);
        // A malformed table is an init error, not a panic.
        let bad = serde_json::json!({"policies": [{"load_qps": 1.0, "table": {"(99, 0)": [1, 1]}}]});
        assert!(Ramsis::init(cfg(&bad.to_string())).is_err());
        policy.set.entries.clear();
    }
}
