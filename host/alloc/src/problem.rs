//! Problem files: one allocation instance, strict and versioned, that `sluice
//! allocate` solves. `kind` says which formulation; every field is documented by
//! the TOML line that sets it; unknown fields, bad values and missing files are
//! errors naming the file and the field.
//!
//! ```toml
//! version = 1
//! kind = "proteus"                  # or "infadapter", "loki"
//! [solver]
//! time_limit_s = 10
//! mip_gap = 0.0001
//! threads = 1
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sluice_core::pipeline::{Pipeline, PipelineSpec};
use sluice_core::profile::{Percentile, Profile};

use crate::cores::CapacityTable;
use crate::infadapter::{self, check_weights, Weights};
use crate::limits::{
    self, check_batches, check_cores, check_count, check_demand, check_factor, check_fit_cpus, check_memory, check_slo,
    span, within,
};
use crate::loki::{self, Scaling, TieBreak};
use crate::proteus::{self, check_ladder, check_total, Formulation, Ladder, Objective};
use crate::solver::SolverSettings;

/// The problem file format this build reads.
pub const VERSION: u32 = 1;

/// A problem file could not be used (core's error for the files sluice reads).
pub type ProblemError = sluice_core::file_error::FileError;

/// A problem of either kind.
#[derive(Clone, Debug)]
pub enum AnyProblem {
    /// Proteus (and hardware-first).
    Proteus(proteus::Problem),
    /// InfAdapter.
    InfAdapter(infadapter::Problem),
    /// Loki (a pipeline).
    Loki(loki::Problem),
}

#[derive(Deserialize)]
struct Head {
    version: Option<toml::Value>,
    kind: Option<toml::Value>,
}

/// `kind = "proteus"`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProteusFile {
    #[allow(dead_code)]
    version: u32,
    #[allow(dead_code)]
    kind: String,
    /// `objective = "accuracy"` or `"hardware-first"`.
    #[serde(default)]
    objective: Objective,
    /// `formulation = "aggregated"` or `"per-device"`.
    #[serde(default)]
    formulation: Formulation,
    /// `batch_sizes = [1, 2, 4, 8]`: the batch sizes a variant may run.
    #[serde(default = "default_batches")]
    batch_sizes: Vec<u32>,
    /// `[ladder]`: demand lowering.
    #[serde(default)]
    ladder: Ladder,
    /// `[solver]`.
    #[serde(default)]
    solver: SolverSettings,
    /// `variants = "all"`, `"most-accurate"` or `"least-accurate"`.
    #[serde(default)]
    variants: proteus::Variants,
    /// `[[device]]`.
    #[serde(rename = "device")]
    devices: Vec<DeviceEntry>,
    /// `[[app]]`.
    #[serde(rename = "app")]
    apps: Vec<AppEntry>,
}

fn default_batches() -> Vec<u32> {
    vec![1, 2, 4, 8]
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeviceEntry {
    /// `type = "cpu"`.
    #[serde(rename = "type")]
    kind: String,
    /// `count = 10`.
    count: u32,
    /// `memory_mb = 16384` (optional).
    #[serde(default)]
    memory_mb: Option<f64>,
    /// `profile = "../../profiles/proteus-cpu.toml"`: the variants' latency on it.
    profile: PathBuf,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AppEntry {
    /// `name = "resnet"`.
    name: String,
    /// `slo_ms = 300`.
    slo_ms: f64,
    /// `demand_qps = 52.1`.
    demand_qps: f64,
    /// `models = ["resnet18_v1", ...]`: its variants.
    models: Vec<String>,
    /// `memory_mb = { resnet50_v1 = 98 }` (optional): footprints.
    #[serde(default)]
    memory_mb: BTreeMap<String, f64>,
}

/// `kind = "infadapter"`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InfAdapterFile {
    #[allow(dead_code)]
    version: u32,
    #[allow(dead_code)]
    kind: String,
    /// `capacity = "../../profiles/infadapter-resnet-capacity.toml"`.
    capacity: PathBuf,
    /// `sla_ms = 750`: the capacity points used.
    #[serde(default = "crate::cores::default_sla")]
    sla_ms: f64,
    /// `fit_cpus = [1, 2, 4, 8, 16]`: the core counts of the fit.
    #[serde(default = "crate::cores::default_fit_cpus")]
    fit_cpus: Vec<u32>,
    /// `models = ["resnet18", ...]` (default: every model of the table).
    #[serde(default)]
    models: Option<Vec<String>>,
    /// `demand_rps = 60`.
    demand_rps: f64,
    /// `cores = 20`: the budget B.
    cores: u32,
    /// `min_cores = 2`.
    #[serde(default = "crate::cores::default_min_cores")]
    min_cores: u32,
    /// `current = { resnet50 = 8 }`: what runs now.
    #[serde(default)]
    current: BTreeMap<String, u32>,
    /// `capacity_coef = 0.8` (default: the table's).
    #[serde(default)]
    capacity_coef: Option<f64>,
    /// `[weights]`.
    #[serde(default)]
    weights: Weights,
    /// `[ladder]` (default: from 1.0 down).
    #[serde(default = "ladder_from_one")]
    ladder: Ladder,
    /// `[solver]`.
    #[serde(default)]
    solver: SolverSettings,
}

/// `kind = "loki"`: one pipeline on a homogeneous cluster.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LokiFile {
    #[allow(dead_code)]
    version: u32,
    #[allow(dead_code)]
    kind: String,
    /// `profile = "../../profiles/loki-simulator.toml"`: every task's variants.
    profile: PathBuf,
    /// `percentile = "p50"`: the latency the MILP plans with (the reference's p50).
    #[serde(default = "p50")]
    percentile: Percentile,
    /// `batch_sizes = [1, 2, 4, 8, 16, 32, 64]`: the allowed batch sizes B.
    #[serde(default = "loki_batches")]
    batch_sizes: Vec<u32>,
    /// `slo_ms = 250`: the pipeline's end-to-end SLO L.
    slo_ms: f64,
    /// `comm_latency_ms = 0`: per worker on a path.
    #[serde(default)]
    comm_latency_ms: f64,
    /// `workers = 20`: the cluster S.
    workers: u32,
    /// `demand_qps = 100`: D.
    demand_qps: f64,
    /// `scaling = "loki"`, `"hardware-only"` or `"accuracy-only"`.
    #[serde(default)]
    scaling: Scaling,
    /// `tie_break = "solver"` or `"headroom"`: which fewest-worker plan step 1 returns.
    #[serde(default)]
    tie_break: TieBreak,
    /// `[pipeline]`: `[[pipeline.task]]` and `[[pipeline.edge]]`.
    pipeline: PipelineSpec,
    /// `[ladder]` (default: from 1.0 down).
    #[serde(default = "ladder_from_one")]
    ladder: Ladder,
    /// `[solver]`.
    #[serde(default)]
    solver: SolverSettings,
}

fn p50() -> Percentile {
    Percentile::P50
}

fn loki_batches() -> Vec<u32> {
    vec![1, 2, 4, 8, 16, 32, 64]
}

fn ladder_from_one() -> Ladder {
    Ladder { beta: 1.0, ..Ladder::default() }
}

impl AnyProblem {
    /// Reads a problem file; relative paths resolve against its directory.
    pub fn load(path: &Path) -> Result<AnyProblem, ProblemError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ProblemError::Read { file: file.clone(), source })?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        AnyProblem::parse(&text, &file, &base)
    }

    /// Parses problem text; `file` names it in errors, `base` anchors relative paths.
    pub fn parse(text: &str, file: &str, base: &Path) -> Result<AnyProblem, ProblemError> {
        let parse_err = |e| ProblemError::parse(file, e);
        let invalid = |field: &str, message: &str| ProblemError::invalid(file, field, message);
        let head: Head = toml::from_str(text).map_err(parse_err)?;
        match head.version {
            Some(toml::Value::Integer(v)) if v == VERSION as i64 => {}
            Some(other) => return Err(invalid("version", &format!("expected {VERSION}, got {other}"))),
            None => return Err(invalid("version", &format!("required (version = {VERSION})"))),
        }
        match head.kind.as_ref().and_then(|k| k.as_str()) {
            Some("proteus") => {
                let f: ProteusFile = toml::from_str(text).map_err(parse_err)?;
                proteus_problem(f, file, base).map(AnyProblem::Proteus)
            }
            Some("infadapter") => {
                let f: InfAdapterFile = toml::from_str(text).map_err(parse_err)?;
                infadapter_problem(f, file, base).map(AnyProblem::InfAdapter)
            }
            Some("loki") => {
                let f: LokiFile = toml::from_str(text).map_err(parse_err)?;
                loki_problem(f, file, base).map(AnyProblem::Loki)
            }
            Some(other) => {
                Err(invalid("kind", &format!("`{other}`: expected \"proteus\", \"infadapter\" or \"loki\"")))
            }
            None => Err(invalid("kind", "required: \"proteus\", \"infadapter\" or \"loki\"")),
        }
    }
}

/// What a live pipeline needs from its Loki problem file beyond the problem: the
/// profile its variants come from and the percentile planned with (the host's
/// workers and policies use the same).
#[derive(Clone, Debug)]
pub struct LokiSource {
    /// The profile, resolved against the problem file's directory.
    pub profile: PathBuf,
    /// The latency percentile.
    pub percentile: Percentile,
}

/// Reads a `kind = "loki"` problem file (another kind is an error naming `kind`).
pub fn load_loki(path: &Path) -> Result<(loki::Problem, LokiSource), ProblemError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ProblemError::Read { file: file.clone(), source })?;
    let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
    match AnyProblem::parse(&text, &file, &base)? {
        AnyProblem::Loki(problem) => {
            let f: LokiFile = toml::from_str(&text).map_err(|e| ProblemError::parse(&file, e))?;
            Ok((problem, LokiSource { profile: base.join(f.profile), percentile: f.percentile }))
        }
        _ => Err(ProblemError::invalid(&file, "kind", "expected \"loki\" (a pipeline's problem)")),
    }
}

fn proteus_problem(f: ProteusFile, file: &str, base: &Path) -> Result<proteus::Problem, ProblemError> {
    let invalid = |field: String, message: &str| ProblemError::invalid(file, field, message);
    f.solver.validate().map_err(|m| invalid("solver".into(), &m.to_string()))?;
    check_batches(&f.batch_sizes).map_err(|m| invalid("batch_sizes".into(), &m.to_string()))?;
    check_ladder(&f.ladder).map_err(|m| invalid("ladder".into(), &m.to_string()))?;
    if f.devices.is_empty() {
        return Err(invalid("device".into(), "at least one [[device]] is required"));
    }
    if f.apps.is_empty() {
        return Err(invalid("app".into(), "at least one [[app]] is required"));
    }
    let mut devices = Vec::new();
    let mut profiles: BTreeMap<PathBuf, Profile> = BTreeMap::new();
    for d in f.devices {
        let at = |k: &str| format!("device.{}.{k}", d.kind);
        if devices.iter().any(|x: &proteus::DeviceType| x.name == d.kind) {
            return Err(invalid(at("type"), "duplicate device type"));
        }
        check_count(d.count).map_err(|m| invalid(at("count"), &m.to_string()))?;
        if let Some(m) = d.memory_mb {
            check_memory(m).map_err(|m| invalid(at("memory_mb"), &m.to_string()))?;
        }
        let path = base.join(&d.profile);
        let profile = match profiles.get(&path) {
            Some(p) => p.clone(),
            None => {
                let p = Profile::load(&path).map_err(|e| invalid(at("profile"), &e.to_string()))?;
                profiles.insert(path, p.clone());
                p
            }
        };
        devices.push(proteus::DeviceType { name: d.kind, count: d.count, memory_mb: d.memory_mb, profile });
    }
    // Summed wide: thousands of types of 10,000 devices must not wrap around.
    let total = u32::try_from(devices.iter().map(|d| u64::from(d.count)).sum::<u64>()).unwrap_or(u32::MAX);
    check_total(total, f.formulation).map_err(|m| invalid("device".into(), &m.to_string()))?;
    let mut apps: Vec<proteus::App> = Vec::new();
    for a in f.apps {
        let at = |k: &str| format!("app.{}.{k}", a.name);
        if apps.iter().any(|x| x.name == a.name) {
            return Err(invalid(at("name"), "duplicate app name"));
        }
        check_slo(a.slo_ms).map_err(|m| invalid(at("slo_ms"), &m.to_string()))?;
        check_demand(a.demand_qps).map_err(|m| invalid(at("demand_qps"), &m.to_string()))?;
        if a.models.is_empty() {
            return Err(invalid(at("models"), "expected at least one variant"));
        }
        for m in &a.models {
            if !devices.iter().any(|d| d.profile.model(m).is_some()) {
                return Err(invalid(at("models"), &format!("`{m}` is in no device profile")));
            }
        }
        for (m, mb) in &a.memory_mb {
            if !a.models.contains(m) {
                return Err(invalid(at("memory_mb"), &format!("`{m}` is not one of the app's models")));
            }
            check_memory(*mb).map_err(|e| invalid(at("memory_mb"), &format!("{m}: {e}")))?;
        }
        apps.push(proteus::App {
            name: a.name,
            slo_ms: a.slo_ms,
            demand_qps: a.demand_qps,
            models: a.models,
            memory_mb: a.memory_mb,
        });
    }
    Ok(proteus::Problem {
        devices,
        apps,
        batch_sizes: f.batch_sizes,
        objective: f.objective,
        formulation: f.formulation,
        ladder: f.ladder,
        solver: f.solver,
        variants: f.variants,
        pinned: None,
    })
}

fn infadapter_problem(f: InfAdapterFile, file: &str, base: &Path) -> Result<infadapter::Problem, ProblemError> {
    let invalid = |field: &str, message: &str| ProblemError::invalid(file, field, message);
    f.solver.validate().map_err(|m| invalid("solver", &m.to_string()))?;
    check_ladder(&f.ladder).map_err(|m| invalid("ladder", &m.to_string()))?;
    check_demand(f.demand_rps).map_err(|m| invalid("demand_rps", &m.to_string()))?;
    if !limits::CORES.contains(&f.cores) {
        return Err(invalid("cores", &limits::RangeError::CoreBudget(f.cores).to_string()));
    }
    if f.min_cores > f.cores {
        return Err(invalid("min_cores", "exceeds the core budget"));
    }
    check_slo(f.sla_ms).map_err(|m| invalid("sla_ms", &m.to_string()))?;
    check_fit_cpus(&f.fit_cpus).map_err(|m| invalid("fit_cpus", &m.to_string()))?;
    check_weights(&f.weights).map_err(|m| invalid("weights", &m.to_string()))?;
    for (name, &n) in &f.current {
        check_cores(n, true).map_err(|m| invalid("current", &format!("{name}: {m}")))?;
    }
    let path = base.join(&f.capacity);
    let table = CapacityTable::load(&path).map_err(|e| invalid("capacity", &e.to_string()))?;
    let coef = f.capacity_coef.or(table.capacity_coef).unwrap_or(1.0);
    check_factor(coef).map_err(|m| invalid("capacity_coef", &m.to_string()))?;
    let variants = table
        .variants(f.models.as_deref(), f.sla_ms, &f.fit_cpus)
        .map_err(|e| invalid(e.field(), &format!("{e} ({})", path.display())))?;
    let names: Vec<String> = variants.iter().map(|v| v.name.clone()).collect();
    for name in f.current.keys() {
        if !names.contains(name) {
            return Err(invalid("current", &format!("`{name}` is not one of the models")));
        }
    }
    Ok(infadapter::Problem {
        variants,
        demand_rps: f.demand_rps,
        budget_cores: f.cores,
        usable_cores: None,
        single: false,
        min_cores: f.min_cores,
        current: f.current,
        capacity_coef: coef,
        weights: f.weights,
        ladder: f.ladder,
        solver: f.solver,
    })
}

fn loki_problem(f: LokiFile, file: &str, base: &Path) -> Result<loki::Problem, ProblemError> {
    let invalid = |field: &str, message: &str| ProblemError::invalid(file, field, message);
    f.solver.validate().map_err(|m| invalid("solver", &m.to_string()))?;
    check_ladder(&f.ladder).map_err(|m| invalid("ladder", &m.to_string()))?;
    check_batches(&f.batch_sizes).map_err(|m| invalid("batch_sizes", &m.to_string()))?;
    check_slo(f.slo_ms).map_err(|m| invalid("slo_ms", &m.to_string()))?;
    if !within(f.comm_latency_ms, limits::MAX_LATENCY_MS) {
        return Err(invalid(
            "comm_latency_ms",
            &format!("expected a number of milliseconds from 0 to {}", limits::MAX_LATENCY_MS),
        ));
    }
    check_demand(f.demand_qps).map_err(|m| invalid("demand_qps", &m.to_string()))?;
    if !limits::WORKERS.contains(&f.workers) {
        return Err(invalid("workers", &format!("expected {} workers", span(&limits::WORKERS))));
    }
    let pipeline = Pipeline::new(&f.pipeline).map_err(|e| invalid("pipeline", &e.to_string()))?;
    if let Some(t) = loki::passthrough_sink(&pipeline) {
        return Err(invalid(&format!("pipeline.task.{t}.models"), &loki::passthrough_sink_message(t)));
    }
    let path = base.join(&f.profile);
    let profile = Profile::load(&path).map_err(|e| invalid("profile", &e.to_string()))?;
    let variants = loki::variants(&pipeline, &profile, f.percentile, &f.batch_sizes)
        .map_err(|(field, m)| invalid(&field, &format!("{m} ({})", path.display())))?;
    Ok(loki::Problem {
        pipeline,
        variants,
        demand_qps: f.demand_qps,
        workers: f.workers,
        slo_ms: f.slo_ms,
        comm_latency_ms: f.comm_latency_ms,
        scaling: f.scaling,
        ladder: f.ladder,
        tie_break: f.tie_break,
        solver: f.solver,
    })
}
