//! Serving on CPU cores, as InfAdapter does (§3, §5): a device pool of single cores
//! (`[[device]] type = "core"`, count = the budget B), where a variant given n cores
//! is an n-core replica. TF Serving as InfAdapter runs it (inter-op threads = cores,
//! intra-op 1, batch 1) serves n requests at once, one per core, so each core of the
//! replica is one of sluice's devices serving batch 1 — at the per-request time the
//! replica sustains at that size, n / saturation(n), from the measured capacity
//! table (per-core throughput falls as replicas grow: ResNet-50 serves 10 req/s on
//! one core, 8.7 per core on 20).
//!
//! Three planners over it, one app each ([`plan`]):
//! - InfAdapter: the ILP of [`crate::infadapter`] (a set of variants with cores and
//!   quotas), re-solved on the forecast.
//! - Model-Switching+ (InfAdapter §5's MS+): the same ILP and objective, one variant.
//! - A VPA-like autoscaler (§5's "VPA+"): one fixed variant, its cores sized to the
//!   CPU the load needs (the VPA recommender's decaying 90th percentile of usage,
//!   + 15 %), applied make-before-break as InfAdapter's modified VPA does.
//!
//! Plans come back as [`proteus::Plan`]s over the core devices, so the live host and
//! the simulator apply them as they apply any other (make-before-break, weighted
//! routing); [`proteus::DevicePlan::service_us`] carries each core's time.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::infadapter::{self, Weights};
use crate::limits::RangeError;
use crate::proteus::{self, AppPlan, DevicePlan, Route, Step};
use crate::solver::SolveError;

/// A capacity table that cannot be used; the message starts with its path.
#[derive(Debug, Error)]
pub enum CapacityError {
    /// The file cannot be read.
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        /// The table's path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a capacity table.
    #[error("{}: {source}", path.display())]
    Parse {
        /// The table's path.
        path: PathBuf,
        /// Where and why (TOML's line and column).
        source: toml::de::Error,
    },
}

/// The capacity table lacks what the planner asks of it ([`CapacityTable::variants`]);
/// [`VariantsError::field`] is the setting to correct.
#[derive(Clone, Debug, PartialEq, Error)]
pub enum VariantsError {
    /// `models = []`.
    #[error("expected at least one model")]
    NoModels,
    /// A model the table does not have.
    #[error("`{0}` is not in the capacity table")]
    UnknownModel(String),
    /// A model with fewer than two points at the SLA among `fit_cpus`: no line to fit.
    #[error("{model}: fewer than two capacity points at sla_ms = {sla_ms}")]
    TooFewPoints {
        /// The model.
        model: String,
        /// The SLA asked for, ms.
        sla_ms: f64,
    },
}

impl VariantsError {
    /// The field to correct: `models` or `fit_cpus`.
    pub fn field(&self) -> &'static str {
        match self {
            VariantsError::NoModels | VariantsError::UnknownModel(_) => "models",
            VariantsError::TooFewPoints { .. } => "fit_cpus",
        }
    }
}

/// `[allocator.cores]` with a value out of its range; the message starts with the
/// field.
#[derive(Clone, Debug, PartialEq, Error)]
pub enum CoreSettingsError {
    /// `sla_ms`, `fit_cpus`, `min_cores`, `capacity_coef` or `weights` out of its
    /// range ([`crate::limits`]).
    #[error("{field}: {range}")]
    Range {
        /// The field.
        field: &'static str,
        /// Its range.
        range: RangeError,
    },
    /// `stabilization` above [`crate::limits::MAX_STABILIZATION`].
    #[error("stabilization: expected 0 to {} decisions", crate::limits::MAX_STABILIZATION)]
    Stabilization(u32),
    /// `vpa_margin` negative, not finite or above [`crate::limits::MAX_FACTOR`].
    #[error("vpa_margin: expected a non-negative fraction, at most {:e}", crate::limits::MAX_FACTOR)]
    VpaMargin(f64),
}

/// The core planners' model cannot be loaded ([`CoreModel::load`]); the message
/// starts with the `allocator.cores` field to correct.
#[derive(Debug, Error)]
pub enum CoreModelError {
    /// `capacity` is not set.
    #[error("allocator.cores.capacity: required by this method")]
    NoCapacity,
    /// The table cannot be read.
    #[error("allocator.cores.capacity: {0}")]
    Table(#[from] CapacityError),
    /// The table lacks what the settings ask of it.
    #[error("allocator.cores.{}: {}: {source}", source.field(), path.display())]
    Variants {
        /// The table's path.
        path: PathBuf,
        /// What it lacks.
        source: VariantsError,
    },
}

/// Why a core planner made no plan ([`plan`]).
#[derive(Debug, Error)]
pub enum CorePlanError {
    /// The problem has other than one app and one device type.
    #[error("the core methods plan one app on one device type (its cores): got {apps} apps on {device_types} types")]
    Shape {
        /// Apps in the problem.
        apps: usize,
        /// Device types in the problem.
        device_types: usize,
    },
    /// None of the app's variants is in the table.
    #[error("app {0}: none of its variants is in the capacity table")]
    NoVariant(String),
    /// `method = "vpa"` without `allocator.cores.variant`.
    #[error("allocator.cores.variant: required by method = \"vpa\"")]
    NoVpaVariant,
    /// `allocator.cores.variant` names no variant of the app in the table.
    #[error("allocator.cores.variant: `{variant}` is not a variant of app {app} in the capacity table")]
    UnknownVpaVariant {
        /// The variant named.
        variant: String,
        /// The app.
        app: String,
    },
    /// The ILP could not be solved.
    #[error(transparent)]
    Solve(#[from] SolveError),
}

/// The capacity table (`profiles/*-capacity.toml`, kind = "capacity"; schema in
/// profiles/README.md): requests/s each variant sustains per core count and SLA.
#[derive(Clone, Debug, Deserialize)]
pub struct CapacityTable {
    /// The factor the reference plans capacities with (InfAdapter: 0.8).
    #[serde(default)]
    pub capacity_coef: Option<f64>,
    /// The measured points.
    pub point: Vec<CapacityPoint>,
    /// The variants.
    pub model: Vec<CapacityModel>,
}

/// One load test: a variant on some cores at one SLA.
#[derive(Clone, Debug, Deserialize)]
pub struct CapacityPoint {
    /// The variant.
    pub model: String,
    /// Cores of the replica.
    pub cpus: u32,
    /// The p99 latency target, µs.
    pub sla_us: u64,
    /// Requests/s sustained within the SLA.
    pub capacity_rps: f64,
    /// Requests/s at saturation (the same for every SLA of a variant and core count).
    #[serde(default)]
    pub saturation_rps: Option<f64>,
}

/// A variant of the table.
#[derive(Clone, Debug, Deserialize)]
pub struct CapacityModel {
    /// Its name.
    pub name: String,
    /// Accuracy in [0, 1].
    pub accuracy: f64,
    /// Seconds to load it.
    pub load_time_s: f64,
}

impl CapacityTable {
    /// Reads a table; errors name the file.
    pub fn load(path: &Path) -> Result<CapacityTable, CapacityError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| CapacityError::Read { path: path.to_owned(), source })?;
        toml::from_str(&text).map_err(|source| CapacityError::Parse { path: path.to_owned(), source })
    }

    /// The planner's view of `names` (every variant of the table when None): a
    /// capacity line fitted through the points at `sla_ms` for the core counts
    /// `fit_cpus` ([`infadapter::fit`]). Errors say which field is wrong.
    pub fn variants(
        &self,
        names: Option<&[String]>,
        sla_ms: f64,
        fit_cpus: &[u32],
    ) -> Result<Vec<infadapter::Variant>, VariantsError> {
        let sla_us = (sla_ms * 1000.0).round() as u64;
        let names: Vec<String> = match names {
            Some([]) => return Err(VariantsError::NoModels),
            Some(m) => m.to_vec(),
            None => self.model.iter().map(|m| m.name.clone()).collect(),
        };
        let mut variants = Vec::new();
        for name in &names {
            let Some(model) = self.model.iter().find(|m| &m.name == name) else {
                return Err(VariantsError::UnknownModel(name.clone()));
            };
            let points: Vec<(f64, f64)> = self
                .point
                .iter()
                .filter(|p| &p.model == name && p.sla_us == sla_us && fit_cpus.contains(&p.cpus))
                .map(|p| (p.cpus as f64, p.capacity_rps))
                .collect();
            let Some((slope, intercept)) = infadapter::fit(&points) else {
                return Err(VariantsError::TooFewPoints { model: name.clone(), sla_ms });
            };
            variants.push(infadapter::Variant {
                name: name.clone(),
                accuracy: model.accuracy,
                load_time_s: model.load_time_s,
                slope,
                intercept,
            });
        }
        Ok(variants)
    }

    /// Requests/s `model` serves at saturation on `cores` cores (None: not measured).
    pub fn saturation(&self, model: &str, cores: u32) -> Option<f64> {
        self.point.iter().find(|p| p.model == model && p.cpus == cores).and_then(|p| p.saturation_rps)
    }

    /// The time one core of an n-core replica of `model` spends on a request, µs:
    /// n / saturation(n); None where the table has no saturation for n cores.
    pub fn service_us(&self, model: &str, cores: u32) -> Option<u64> {
        self.saturation(model, cores).filter(|s| *s > 0.0).map(|s| (cores as f64 * 1e6 / s).round() as u64)
    }
}

/// `[allocator.cores]`: the core-scaling planners' settings (docs/allocator.md).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CoreSettings {
    /// `capacity = "profiles/infadapter-resnet-capacity.toml"`: the capacity table
    /// (relative to the config or experiment file). Required by the core methods.
    #[serde(default)]
    pub capacity: Option<PathBuf>,
    /// `sla_ms = 750`: the SLA whose capacities the planner fits.
    #[serde(default = "default_sla")]
    pub sla_ms: f64,
    /// `fit_cpus = [1, 2, 4, 8, 16]`: the core counts of the fit (the reference's).
    #[serde(default = "default_fit_cpus")]
    pub fit_cpus: Vec<u32>,
    /// `min_cores = 2`: cores of a variant in use, at least (the reference's).
    #[serde(default = "default_min_cores")]
    pub min_cores: u32,
    /// `capacity_coef = 0.8` (default: the table's).
    #[serde(default)]
    pub capacity_coef: Option<f64>,
    /// `[allocator.cores.weights]`: α, β, γ (default the reference's 1, 0.05, 0.001).
    #[serde(default)]
    pub weights: Weights,
    /// `stabilization = 4`: decisions skipped while the forecast stays at or below
    /// the load the plan in force was made for (the reference's
    /// `STABILIZATION_INTERVAL`), so a dip does not scale down at once.
    #[serde(default = "default_stabilization")]
    pub stabilization: u32,
    /// `variant = "resnet50"`: the one variant of `method = "vpa"`.
    #[serde(default)]
    pub variant: Option<String>,
    /// `vpa_margin = 0.15`: the VPA recommender's safety margin over its target.
    #[serde(default = "default_vpa_margin")]
    pub vpa_margin: f64,
}

// The reference's values; problem files (`problem.rs`) default to them too.
pub(crate) fn default_sla() -> f64 {
    750.0
}
pub(crate) fn default_fit_cpus() -> Vec<u32> {
    vec![1, 2, 4, 8, 16]
}
pub(crate) fn default_min_cores() -> u32 {
    2
}
fn default_stabilization() -> u32 {
    4
}
fn default_vpa_margin() -> f64 {
    0.15
}

impl Default for CoreSettings {
    fn default() -> Self {
        CoreSettings {
            capacity: None,
            sla_ms: default_sla(),
            fit_cpus: default_fit_cpus(),
            min_cores: default_min_cores(),
            capacity_coef: None,
            weights: Weights::default(),
            stabilization: default_stabilization(),
            variant: None,
            vpa_margin: default_vpa_margin(),
        }
    }
}

impl CoreSettings {
    /// Checks the values (not the table: [`CoreModel::load`] reads it).
    pub fn validate(&self) -> Result<(), CoreSettingsError> {
        use crate::infadapter::check_weights;
        use crate::limits::{check_cores, check_factor, check_fit_cpus, check_slo};
        let at = |field: &'static str| move |range| CoreSettingsError::Range { field, range };
        check_slo(self.sla_ms).map_err(at("sla_ms"))?;
        check_fit_cpus(&self.fit_cpus).map_err(at("fit_cpus"))?;
        check_cores(self.min_cores, true).map_err(at("min_cores"))?;
        if let Some(c) = self.capacity_coef {
            check_factor(c).map_err(at("capacity_coef"))?;
        }
        check_weights(&self.weights).map_err(at("weights"))?;
        if self.stabilization > crate::limits::MAX_STABILIZATION {
            return Err(CoreSettingsError::Stabilization(self.stabilization));
        }
        if !crate::limits::within(self.vpa_margin, crate::limits::MAX_FACTOR) {
            return Err(CoreSettingsError::VpaMargin(self.vpa_margin));
        }
        Ok(())
    }
}

/// Which core planner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoreMethod {
    /// InfAdapter's ILP: a set of variants.
    InfAdapter,
    /// Model-Switching+: the same ILP, one variant.
    ModelSwitchingPlus,
    /// The VPA-like autoscaler: one fixed variant, cores sized to the load.
    Vpa,
}

/// The capacity table and the planner's fitted variants, loaded once.
#[derive(Clone, Debug)]
pub struct CoreModel {
    table: CapacityTable,
    variants: Vec<infadapter::Variant>,
    capacity_coef: f64,
}

impl CoreModel {
    /// Loads `settings.capacity` (resolved by the caller) and fits every variant.
    pub fn load(settings: &CoreSettings) -> Result<CoreModel, CoreModelError> {
        let path = settings.capacity.as_ref().ok_or(CoreModelError::NoCapacity)?;
        let table = CapacityTable::load(path)?;
        let variants = table
            .variants(None, settings.sla_ms, &settings.fit_cpus)
            .map_err(|source| CoreModelError::Variants { path: path.clone(), source })?;
        let capacity_coef = settings.capacity_coef.or(table.capacity_coef).unwrap_or(1.0);
        Ok(CoreModel { table, variants, capacity_coef })
    }

    /// Whether the table has variant `name`.
    pub fn has(&self, name: &str) -> bool {
        self.variants.iter().any(|v| v.name == name)
    }
}

/// Plans `problem`'s one app on its one type of core devices with `method`, from
/// the plan in force (what is loaded, for InfAdapter's loading cost and to keep
/// cores where they are). Returns the solve's outcome for the ILP methods (None for
/// the VPA's rule) and the plan (None: infeasible down the ladder).
pub fn plan(
    method: CoreMethod,
    problem: &proteus::Problem,
    settings: &CoreSettings,
    model: &CoreModel,
    current: Option<&proteus::Plan>,
) -> Result<(Option<infadapter::Solved>, Option<proteus::Plan>), CorePlanError> {
    let ([dev], [app]) = (&problem.devices[..], &problem.apps[..]) else {
        return Err(CorePlanError::Shape { apps: problem.apps.len(), device_types: problem.devices.len() });
    };
    let variants: Vec<infadapter::Variant> =
        model.variants.iter().filter(|v| app.models.contains(&v.name)).cloned().collect();
    if variants.is_empty() {
        return Err(CorePlanError::NoVariant(app.name.clone()));
    }
    let loaded: BTreeMap<String, u32> = current
        .map(|p| p.routes.iter().filter(|r| r.devices > 0).map(|r| (r.model.clone(), r.devices)).collect())
        .unwrap_or_default();
    let budget = dev.count;
    let ia = match method {
        CoreMethod::Vpa => {
            let name = settings.variant.as_deref().ok_or(CorePlanError::NoVpaVariant)?;
            let v = variants
                .iter()
                .find(|v| v.name == name)
                .ok_or_else(|| CorePlanError::UnknownVpaVariant { variant: name.to_string(), app: app.name.clone() })?;
            return Ok((None, Some(vpa(v, app, dev, budget, settings, model))));
        }
        CoreMethod::InfAdapter | CoreMethod::ModelSwitchingPlus => {
            // The reference never plans more cores than the most accurate variant
            // needs for the load on its own (`reconfig.py`: max_cpu is lowered to
            // that count); cores are still costed against the whole budget.
            let best = variants.iter().max_by(|a, b| a.accuracy.total_cmp(&b.accuracy)).expect("non-empty");
            let enough = (settings.min_cores.max(1)..=budget)
                .find(|&n| best.throughput(n, model.capacity_coef) >= app.demand_qps)
                .unwrap_or(budget);
            infadapter::Problem {
                variants,
                demand_rps: app.demand_qps,
                budget_cores: budget,
                usable_cores: Some(enough),
                single: method == CoreMethod::ModelSwitchingPlus,
                min_cores: settings.min_cores,
                current: loaded,
                capacity_coef: model.capacity_coef,
                weights: settings.weights.clone(),
                ladder: problem.ladder.clone(),
                solver: problem.solver.clone(),
            }
        }
    };
    let outcome = infadapter::solve(&ia)?;
    let plan = outcome.plan.as_ref().map(|p| {
        let cores: Vec<(String, u32, f64, f64)> = p
            .variants
            .iter()
            .filter(|v| v.cores > 0)
            .map(|v| {
                let acc = ia.variants.iter().find(|x| x.name == v.name).map_or(0.0, |x| x.accuracy);
                (v.name.clone(), v.cores, v.quota_rps, acc)
            })
            .collect();
        let capacity: Vec<f64> = p.variants.iter().filter(|v| v.cores > 0).map(|v| v.capacity_rps).collect();
        to_devices(app, dev, &cores, &capacity, p.beta, Step::Accuracy, current, &model.table)
    });
    Ok((Some(outcome), plan))
}

/// The VPA-like rule: the forecast (the recommender's decaying 90th percentile of
/// load) in cores of CPU — each request costs one core for 1 / saturation(1) s —
/// raised by the safety margin, rounded up, within [1, budget].
fn vpa(
    v: &infadapter::Variant,
    app: &proteus::App,
    dev: &proteus::DeviceType,
    budget: u32,
    settings: &CoreSettings,
    model: &CoreModel,
) -> proteus::Plan {
    let per_core = model.table.saturation(&v.name, 1).unwrap_or(v.slope + v.intercept).max(1e-9);
    let usage = app.demand_qps / per_core;
    let cores = ((usage * (1.0 + settings.vpa_margin)).ceil() as u32).clamp(1, budget);
    // What the replica sustains as measured (the VPA knows no capacity model).
    let capacity = model.table.saturation(&v.name, cores).unwrap_or_else(|| v.throughput(cores, 1.0));
    let routes = [(v.name.clone(), cores, app.demand_qps, v.accuracy)];
    to_devices(app, dev, &routes, &[capacity], 1.0, Step::Heuristic, None, &model.table)
}

/// A plan over the core devices: each (variant, cores, quota, accuracy) on that
/// many cores — the cores that hosted the variant before first, then free ones —,
/// the app's demand split by quota, each core at its replica's service time.
#[allow(clippy::too_many_arguments)]
fn to_devices(
    app: &proteus::App,
    dev: &proteus::DeviceType,
    variants: &[(String, u32, f64, f64)],
    capacity: &[f64],
    beta: f64,
    step: Step,
    current: Option<&proteus::Plan>,
    table: &CapacityTable,
) -> proteus::Plan {
    let n = dev.count as usize;
    let before: Vec<Option<String>> =
        (0..n).map(|i| current.and_then(|p| p.devices.get(i)).and_then(|d| d.model.clone())).collect();
    let mut host: Vec<Option<usize>> = vec![None; n];
    let mut want: Vec<usize> = variants.iter().map(|v| v.1 as usize).collect();
    // A variant keeps the cores it is on; then cores idle before are taken, then
    // cores whose variant this plan drops or shrinks.
    for (k, (name, ..)) in variants.iter().enumerate() {
        for i in 0..n {
            if want[k] > 0 && host[i].is_none() && before[i].as_deref() == Some(name.as_str()) {
                host[i] = Some(k);
                want[k] -= 1;
            }
        }
    }
    for idle_first in [true, false] {
        for (k, left) in want.iter_mut().enumerate() {
            for i in 0..n {
                if *left > 0 && host[i].is_none() && (!idle_first || before[i].is_none()) {
                    host[i] = Some(k);
                    *left -= 1;
                }
            }
        }
    }
    let served: f64 = variants.iter().map(|v| v.2).sum();
    let share_of = |q: f64| if served > 0.0 { q / served } else { 0.0 };
    let devices = (0..n)
        .map(|i| {
            let base = DevicePlan {
                device: format!("{}-{i}", dev.name),
                device_type: dev.name.clone(),
                app: None,
                model: None,
                share: 0.0,
                service_us: None,
            };
            match host[i] {
                Some(k) => {
                    let (name, cores, quota, _) = &variants[k];
                    DevicePlan {
                        app: Some(app.name.clone()),
                        model: Some(name.clone()),
                        share: share_of(*quota) / *cores as f64,
                        service_us: table.service_us(name, *cores),
                        ..base
                    }
                }
                None => base,
            }
        })
        .collect();
    let routes: Vec<Route> = variants
        .iter()
        .zip(capacity)
        .map(|((name, cores, quota, accuracy), cap)| Route {
            app: app.name.clone(),
            model: name.clone(),
            accuracy: *accuracy,
            device_type: dev.name.clone(),
            devices: *cores,
            share: share_of(*quota),
            qps: *quota,
            capacity_qps: *cap,
            batch: 1,
        })
        .collect();
    let accuracy: f64 = routes.iter().map(|r| r.share * r.accuracy).sum();
    proteus::Plan {
        step,
        beta,
        effective_accuracy: accuracy,
        devices_used: variants.iter().map(|v| v.1).sum(),
        apps: vec![AppPlan {
            name: app.name.clone(),
            demand_qps: app.demand_qps,
            served_qps: served,
            shed_qps: (app.demand_qps - served).max(0.0),
            accuracy,
            unservable: None,
        }],
        routes,
        devices,
    }
}
