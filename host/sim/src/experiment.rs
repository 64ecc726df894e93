//! The experiment file: what `sluice sim` runs — apps (the server's [`AppConfig`],
//! inline or from a server config), their arrivals, the latency model, and a sweep.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};
use serde::{Deserialize, Serialize};
use sluice_alloc::config::{AllocatorConfig, DeviceConfig};
use sluice_core::app_config::AppConfig;
use sluice_core::workload::ArrivalSpec;

/// An experiment file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Experiment {
    /// `version = 1`.
    pub version: u32,
    /// `name = "ramsis-constant"`.
    pub name: String,
    /// `seed = 1`: arrivals and sampled latencies (a sweep's `seeds` override it).
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// `duration_s = 30`: simulated time.
    pub duration_s: f64,
    /// `builtin_policy_dir = "../../target/policies"`: where policies named without a
    /// `.wasm` path are found.
    #[serde(default = "default_builtin")]
    pub builtin_policy_dir: PathBuf,
    /// `latency = "deterministic"` (the app's percentile) or `"sampled"` (drawn from
    /// the profile's measured p50/p95/p99 per batch size).
    #[serde(default)]
    pub latency: LatencyModel,
    /// `max_queue = 100000`: a worker queue longer than this ends the run as overloaded.
    #[serde(default = "default_max_queue")]
    pub max_queue: usize,
    /// `window_s = 1.0`: width of the time-series windows.
    #[serde(default = "default_window")]
    pub window_s: f64,
    /// `weakly_hard = [m, K]`: check that no K consecutive requests have more than m misses.
    #[serde(default)]
    pub weakly_hard: Option<[usize; 2]>,
    /// `drain = false`: stop when the simulated time runs out instead of finishing
    /// the queued requests (the RAMSIS artifact's simulator stops at `eval_time`).
    /// The requests left then count as unfinished (misses) in sluice's accounting
    /// and not at all in the reference one.
    #[serde(default = "default_drain", rename = "drain")]
    pub finish_queues: bool,
    /// `admission = true`: the simulator admits as the live host does, with the
    /// host's own code (`sluice_core::admission`): an arrival predicted to miss
    /// its deadline, or to push a queued request past its own, is refused (so is
    /// one beyond the app's `max_queue`), counted as `refused` in results.json,
    /// never queued, and still counted in the load estimate policies see, as live;
    /// the app's `admission_audit` admits its share of refusals anyway. A recorded
    /// arrival log's `refused` marks are then ignored: every arrival goes through
    /// the simulated admission. Default false: the papers' simulators have no
    /// admission, and the results under docs/results reproduce them. What-if
    /// replays and `sluice evaluate` of a live app turn it on, as the host admits
    /// (docs/simulator.md, "Admission").
    #[serde(default)]
    pub admission: bool,
    /// `accounting = "reference"`: which accounting gives a result's `accuracy` and
    /// `violation_rate` (both are always in the results; see [`Accounting`]).
    #[serde(default)]
    pub accounting: Accounting,
    /// `config = "../ramsis-image-60.toml"`: simulate the apps of this server config
    /// (relative to the experiment), before any `[[app]]` of the experiment itself.
    #[serde(default)]
    pub config: Option<PathBuf>,
    /// `[arrivals]`, `image = { kind = "poisson", rate_qps = 400 }`: the load offered
    /// to an app by name, replacing the app's own `arrivals` (the way to give load to
    /// the apps of a server config).
    #[serde(default)]
    pub arrivals: BTreeMap<String, ArrivalSpec>,
    /// `[[app]]`: simulated apps, written as in a server config (the same
    /// [`AppConfig`]; `executor` and the server's limits are not used) with their
    /// `arrivals`.
    #[serde(rename = "app", default)]
    pub apps: Vec<AppConfig>,
    /// `[[device]]`: devices the MILP allocator places the apps' variants on, as in a
    /// server config; with them, the run re-plans from the simulated demand.
    #[serde(rename = "device", default)]
    pub devices: Vec<DeviceConfig>,
    /// `[allocator]`: as in a server config.
    #[serde(default)]
    pub allocator: AllocatorConfig,
    /// `[sweep]`: the runs, as a cartesian product (one run without it).
    #[serde(default)]
    pub sweep: Sweep,
    /// The `[allocator]` of each of the sweep's systems (filled by [`Experiment::parse`]).
    #[serde(skip)]
    pub system_allocators: Vec<AllocatorConfig>,
}

/// The runs of an experiment: every combination of the non-empty lists.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sweep {
    /// Constant rates replacing every app's arrival rate.
    #[serde(default)]
    pub load_qps: Vec<f64>,
    /// Worker counts replacing every app's.
    #[serde(default)]
    pub workers: Vec<u32>,
    /// Policies (with params) replacing every app's.
    #[serde(default)]
    pub policies: Vec<PolicyChoice>,
    /// Seeds.
    #[serde(default)]
    pub seeds: Vec<u64>,
    /// `[[sweep.systems]]`: whole serving systems to compare (Proteus and its
    /// baselines): each its allocator settings, and optionally the apps' policy and
    /// maximum batch.
    #[serde(default)]
    pub systems: Vec<SystemChoice>,
}

/// One system of a comparison.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SystemChoice {
    /// `label = "Clipper-HA"`: its name in results.
    pub label: String,
    /// `allocator = { replan = "never", variants = "most-accurate" }`: keys that
    /// replace the experiment's `[allocator]` ones for this system.
    #[serde(default)]
    pub allocator: toml::Table,
    /// `policy = "clipper-aimd"`: every app's policy (default: the app's own).
    #[serde(default)]
    pub policy: Option<String>,
    /// `params = {...}`: the policy's params.
    #[serde(default)]
    pub params: Option<toml::Table>,
    /// `max_batch = 1`: every app's maximum batch (default: the app's own).
    #[serde(default)]
    pub max_batch: Option<u32>,
}

impl SystemChoice {
    /// Sets this system's policy and maximum batch on an app, where it gives them.
    fn apply_to(&self, app: &mut AppConfig) {
        if let Some(policy) = &self.policy {
            app.policy = policy.clone();
            app.params = self.params.clone();
            app.params_file = None;
        }
        if self.max_batch.is_some() {
            app.max_batch = self.max_batch;
        }
    }
}

/// A policy and its params.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyChoice {
    /// Built-in name or `.wasm` path.
    pub policy: String,
    /// Params.
    #[serde(default)]
    pub params: Option<toml::Table>,
    /// A JSON file of params, as for an app.
    #[serde(default)]
    pub params_file: Option<PathBuf>,
    /// Label in results (default: the policy name).
    #[serde(default)]
    pub label: Option<String>,
    /// `router = "shared"`: every app's router for this policy (default: the app's
    /// own). The RAMSIS artifact runs Jellyfish+ and ModelSwitching from one shared
    /// FIFO (`FullInorderQueuePi`) and RAMSIS round-robin.
    #[serde(default)]
    pub router: Option<sluice_core::router::RouterMode>,
    /// `expire_after_ms = 1e9`: every app's host expiry for this policy (default:
    /// the app's own). The artifact's simulator never drops: a late request is
    /// served late.
    #[serde(default)]
    pub expire_after_ms: Option<f64>,
    /// `fixed_load = true`: pass the run's constant arrival rate to the policy as
    /// its `load_qps` param, so it plans for the offered load rather than for its
    /// estimate. The artifact's constant-load runs use the one policy made for the
    /// load (`run_sim.py`, `scheduler_rate_list = all_rate_list`).
    #[serde(default)]
    pub fixed_load: bool,
}

impl PolicyChoice {
    /// Sets this choice's policy, params and overrides on an app.
    fn apply_to(&self, app: &mut AppConfig) {
        app.policy = self.policy.clone();
        app.params = self.params.clone();
        app.params_file = self.params_file.clone();
        if let Some(router) = self.router {
            app.router = router;
        }
        if let Some(e) = self.expire_after_ms {
            app.expire_after_ms = Some(e);
        }
        if self.fixed_load {
            if let Some(rate) = app.arrivals.as_ref().and_then(ArrivalSpec::rate_qps) {
                app.params.get_or_insert_with(toml::Table::new).insert("load_qps".into(), toml::Value::Float(rate));
            }
        }
    }
}

/// How a run's requests are counted.
///
/// Both accountings count a request as a violation when it is not served by its
/// deadline and accuracy over the requests served on time; they differ in which
/// requests they count.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Accounting {
    /// Every request that arrived during the run; queued ones are finished after
    /// the arrivals end, and a request still unserved at the end counts as a miss.
    #[default]
    Sluice,
    /// The RAMSIS artifact's simulator (`simulator.py`, `run_sim` and
    /// `calc_violation_rate`): only requests a worker took (or the host dropped)
    /// before the simulated time ran out; those still queued then are not counted
    /// at all. Under overload this leaves out the backlog of the end of the run.
    Reference,
}

/// How batch latencies are drawn.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum LatencyModel {
    /// Always the app's percentile of the profile.
    #[default]
    Deterministic,
    /// Sampled from the profile's measured distribution (see [`engine::LatencySampler`]).
    Sampled,
}

fn default_seed() -> u64 {
    1
}
fn default_builtin() -> PathBuf {
    PathBuf::from("target/policies")
}
fn default_max_queue() -> usize {
    100_000
}
fn default_drain() -> bool {
    true
}
fn default_window() -> f64 {
    1.0
}
/// One run of an experiment: the experiment with the sweep's choices applied.
#[derive(Clone, Debug)]
pub struct RunSpec {
    /// Index in the sweep.
    pub index: usize,
    /// The label of the policy choice (for results).
    pub policy_label: String,
    /// Seed.
    pub seed: u64,
    /// Apps with overrides applied.
    pub apps: Vec<AppConfig>,
    /// The allocator's settings for this run.
    pub allocator: AllocatorConfig,
}

impl Experiment {
    /// Reads an experiment file; relative paths resolve against its directory.
    pub fn load(path: &Path) -> Result<(Experiment, PathBuf)> {
        let text = std::fs::read_to_string(path).with_context(|| format!("{}: cannot read", path.display()))?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let e = Experiment::parse(&text, &path.display().to_string(), &base)?;
        Ok((e, base))
    }

    /// Parses and checks experiment text; `origin` names it in errors, `base` is the
    /// directory relative paths (a server config, profiles, traces) start from.
    pub fn parse(text: &str, origin: &str, base: &Path) -> Result<Experiment> {
        let mut e: Experiment = toml::from_str(text).map_err(|e| anyhow::anyhow!("{origin}: {e}"))?;
        if e.version != 1 {
            bail!("{origin}: version: expected 1, got {}", e.version);
        }
        if !(e.duration_s.is_finite() && e.duration_s > 0.0) {
            bail!("{origin}: duration_s: expected a positive number of seconds");
        }
        if let Some(config) = &e.config {
            let mut apps =
                server_config_apps(&base.join(config)).map_err(|e| anyhow::anyhow!("{origin}: config: {e:#}"))?;
            apps.append(&mut e.apps);
            e.apps = apps;
        }
        if e.apps.is_empty() {
            bail!("{origin}: at least one [[app]] (or a server `config`) is required");
        }
        for name in e.arrivals.keys() {
            if !e.apps.iter().any(|a| &a.name == name) {
                bail!("{origin}: arrivals.{name}: no app of that name");
            }
        }
        for d in &mut e.devices {
            d.profile = base.join(&d.profile);
        }
        e.allocator.rebase(base);
        sluice_alloc::config::validate(&e.apps, &e.devices, &e.allocator)
            .map_err(|err| anyhow::anyhow!("{origin}: {err}"))?;
        e.system_allocators = system_allocators(text, &e, base).map_err(|err| anyhow::anyhow!("{origin}: {err}"))?;
        for a in &mut e.apps {
            if let Some(spec) = e.arrivals.get(&a.name) {
                a.arrivals = Some(spec.clone());
            }
            a.validate().map_err(|err| anyhow::anyhow!("{origin}: {err}"))?;
            if a.arrivals.is_none() {
                bail!("{origin}: app.{}.arrivals: required in an experiment (or give it in [arrivals])", a.name);
            }
        }
        Ok(e)
    }

    /// The runs: the cartesian product of the sweep's lists (in the order policies,
    /// workers, load, seeds), or the experiment as written.
    pub fn runs(&self) -> Vec<RunSpec> {
        let policies: Vec<Option<&PolicyChoice>> =
            if self.sweep.policies.is_empty() { vec![None] } else { self.sweep.policies.iter().map(Some).collect() };
        let workers: Vec<Option<u32>> = if self.sweep.workers.is_empty() {
            vec![None]
        } else {
            self.sweep.workers.iter().copied().map(Some).collect()
        };
        let loads: Vec<Option<f64>> = if self.sweep.load_qps.is_empty() {
            vec![None]
        } else {
            self.sweep.load_qps.iter().copied().map(Some).collect()
        };
        let seeds: Vec<u64> = if self.sweep.seeds.is_empty() { vec![self.seed] } else { self.sweep.seeds.clone() };
        let systems: Vec<Option<usize>> =
            if self.sweep.systems.is_empty() { vec![None] } else { (0..self.sweep.systems.len()).map(Some).collect() };
        let mut out = Vec::new();
        for sys in &systems {
            for p in &policies {
                for w in &workers {
                    for l in &loads {
                        for s in &seeds {
                            let apps = self
                                .apps
                                .iter()
                                .map(|a| {
                                    let mut a = a.clone();
                                    if let Some(w) = w {
                                        a.workers = *w;
                                    }
                                    if let Some(l) = l {
                                        a.arrivals = a.arrivals.as_ref().map(|s| s.with_rate(*l));
                                    }
                                    // After the load: `fixed_load` passes the run's rate.
                                    if let Some(p) = p {
                                        p.apply_to(&mut a);
                                    }
                                    if let Some(sys) = sys.map(|i| &self.sweep.systems[i]) {
                                        sys.apply_to(&mut a);
                                    }
                                    a
                                })
                                .collect();
                            let label = match sys {
                                Some(i) => self.sweep.systems[*i].label.clone(),
                                None => p
                                    .map(|p| p.label.clone().unwrap_or_else(|| p.policy.clone()))
                                    .unwrap_or_else(|| self.apps[0].policy.clone()),
                            };
                            let allocator = match sys {
                                Some(i) => self.system_allocators[*i].clone(),
                                None => self.allocator.clone(),
                            };
                            out.push(RunSpec { index: out.len(), policy_label: label, seed: *s, apps, allocator });
                        }
                    }
                }
            }
        }
        out
    }
}

/// Each system's `[allocator]`: the experiment's table with the system's keys
/// replacing its own, read (and checked) as any `[allocator]` is.
fn system_allocators(text: &str, e: &Experiment, base_dir: &Path) -> Result<Vec<AllocatorConfig>> {
    if e.sweep.systems.is_empty() {
        return Ok(Vec::new());
    }
    let table: toml::Table = toml::from_str(text)?;
    let base = match table.get("allocator") {
        Some(toml::Value::Table(t)) => t.clone(),
        _ => toml::Table::new(),
    };
    e.sweep
        .systems
        .iter()
        .map(|sys| {
            let mut merged = base.clone();
            for (k, v) in &sys.allocator {
                // A sub-table (`cores = { variant = "resnet18" }`) is merged key by
                // key over the experiment's, so a system names only what differs.
                match (merged.get_mut(k), v) {
                    (Some(toml::Value::Table(mine)), toml::Value::Table(theirs)) => {
                        mine.extend(theirs.iter().map(|(k, v)| (k.clone(), v.clone())))
                    }
                    _ => {
                        merged.insert(k.clone(), v.clone());
                    }
                }
            }
            let mut a: AllocatorConfig = toml::Value::Table(merged)
                .try_into()
                .map_err(|err| anyhow::anyhow!("sweep.systems.{}.allocator: {err}", sys.label))?;
            a.rebase(base_dir);
            let mut apps = e.apps.clone();
            apps.iter_mut().for_each(|app| sys.apply_to(app));
            sluice_alloc::config::validate(&apps, &e.devices, &a)
                .map_err(|err| anyhow::anyhow!("sweep.systems.{}: {err}", sys.label))?;
            Ok(a)
        })
        .collect()
}

/// The `[[app]]`s of a server config (`sluice serve --config`), read with the same
/// [`AppConfig`] the server reads them with and their paths resolved against the
/// config's directory. The rest of the file (listen address, admin token, …) is the
/// server's business and is not checked here.
pub fn server_config_apps(path: &Path) -> Result<Vec<AppConfig>> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).with_context(|| format!("{shown}: cannot read"))?;
    let table: toml::Table = toml::from_str(&text).map_err(|e| anyhow::anyhow!("{shown}: {e}"))?;
    // Absolute, so the app's paths stay right whatever directory the experiment is in.
    let dir = std::path::absolute(path)
        .with_context(|| format!("{shown}: cannot resolve"))?
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let Some(apps) = table.get("app") else { bail!("{shown}: no [[app]]") };
    let toml::Value::Array(apps) = apps else { bail!("{shown}: app: expected [[app]] tables") };
    apps.iter()
        .enumerate()
        .map(|(i, v)| {
            let mut app: AppConfig = v.clone().try_into().map_err(|e| anyhow::anyhow!("{shown}: app[{i}]: {e}"))?;
            app.rebase(&dir);
            Ok(app)
        })
        .collect()
}
