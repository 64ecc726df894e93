//! The allocator's part of a config — `[[device]]` groups and `[allocator]` — shared
//! by the server config and the simulator's experiments, and the device pool both
//! build plans over: which device type each worker runs on, the latency every
//! worker sees, and the allocation problem for a demand.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sluice_core::app_config::{AppConfig, InvalidField};
use sluice_core::demand::{DecayingPercentile, Ewma, Forecaster, PeakAhead};
use sluice_core::profile::Profile;
use sluice_core::router::RouterMode;
use sluice_sdk as sdk;

use crate::limits;
use crate::limits::{check_batches, check_count, check_demand, check_memory};
use crate::proteus;
use crate::proteus::{check_ladder, check_total};

/// How plans are made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    /// Proteus's MILP (`proteus::solve`).
    #[default]
    Milp,
    /// INFaaS-Accuracy's greedy autoscaler (`infaas::step`).
    InfaasAccuracy,
    /// InfAdapter's ILP on CPU cores (`cores::plan`).
    Infadapter,
    /// Model-Switching+: InfAdapter's ILP with one variant.
    ModelSwitchingPlus,
    /// A VPA-like autoscaler: one variant, cores sized to the load.
    Vpa,
}

impl Method {
    /// Whether it plans CPU cores from a capacity table (`cores`).
    pub fn is_cores(self) -> bool {
        matches!(self, Method::Infadapter | Method::ModelSwitchingPlus | Method::Vpa)
    }

    /// Its name in a config.
    pub fn name(self) -> &'static str {
        match self {
            Method::Milp => "milp",
            Method::InfaasAccuracy => "infaas-accuracy",
            Method::Infadapter => "infadapter",
            Method::ModelSwitchingPlus => "model-switching-plus",
            Method::Vpa => "vpa",
        }
    }
}

/// Whether the plan follows demand.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Replan {
    /// Every `period_s`, and early on a demand shift.
    #[default]
    Periodic,
    /// Never: the first plan (for `demand_qps`) stays — a static deployment.
    Never,
}

/// Whether re-plans may move devices between apps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceMobility {
    /// Any device may serve any app.
    #[default]
    Dynamic,
    /// Every device keeps the app the first plan gave it.
    Fixed,
}

/// What a plan's idle devices do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Spare {
    /// Stay idle (Eq. 1 allows it; hardware scaling wants it).
    #[default]
    Idle,
    /// Host a copy of the most loaded variant of their type, for headroom
    /// (`Plan::replicate_into_idle`; the reference leaves no device idle).
    Replicate,
}

/// How an app's requests are split over its devices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SplitBy {
    /// By the plan's shares (query assignment, §4).
    #[default]
    Plan,
    /// Evenly over the devices hosting the app's variants.
    Uniform,
}

/// A group of identical devices.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceConfig {
    /// `type = "cpu"`: the device type, unique in the config.
    #[serde(rename = "type")]
    pub kind: String,
    /// `count = 2`: devices of this type.
    pub count: u32,
    /// `profile = "profiles/proteus-cpu.toml"`: each variant's latency on this type;
    /// the emulated executor runs it, and the workers' policies see it.
    pub profile: PathBuf,
    /// `memory_mb = 16384`: memory of one device (optional).
    #[serde(default)]
    pub memory_mb: Option<f64>,
}

/// `[allocator]`: the MILP allocator's settings (docs/allocator.md).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllocatorConfig {
    /// `objective = "accuracy"` or `"hardware-first"`.
    #[serde(default)]
    pub objective: crate::proteus::Objective,
    /// `formulation = "aggregated"` or `"per-device"`.
    #[serde(default)]
    pub formulation: crate::proteus::Formulation,
    /// `batch_sizes = [1, 2, 4, 8]`: batch sizes a capacity is computed for.
    #[serde(default = "default_batch_sizes")]
    pub batch_sizes: Vec<u32>,
    /// `demand_qps = { imagenet = 100 }`: the demand the first plan is made for, per
    /// app (default 1 request/s: every app gets a device).
    #[serde(default)]
    pub demand_qps: BTreeMap<String, f64>,
    /// `period_s = 10`: re-plan this often while serving (Loki's and Proteus's
    /// artifacts: every 10 s).
    #[serde(default = "default_period")]
    pub period_s: f64,
    /// `threshold = 0.2`: re-plan early when an app's forecast moves this far
    /// (relative) from the demand of the plan in force.
    #[serde(default = "default_threshold")]
    pub threshold: f64,
    /// `min_interval_s = 5`: the live host re-plans on a demand shift at most this
    /// often (a ramp re-planned 5 times in 6 s: each re-plan moves devices and
    /// reloads variants); `period_s` re-plans are not held back, so the interval is
    /// at most `period_s`. 0: every shift re-plans at once, as the simulator does
    /// (the papers' simulators re-plan on every shift).
    #[serde(default = "default_min_interval")]
    pub min_interval_s: f64,
    /// `warmup_s = 20`: the live host plans each app for at least its configured
    /// `demand_qps` until it has counted this many seconds of arrivals (default: the
    /// forecaster's window, 20 s for `ewma`, 60 s for the others), so the plan made
    /// at startup for the configured demand is not replaced by one made from a few
    /// milliseconds of counts (`sluice_core::demand::planned_demand`). 0: the
    /// forecast from the first tick.
    #[serde(default)]
    pub warmup_s: Option<f64>,
    /// `forecaster = "ewma"` (Proteus: EWMA over the last 20 s) or `"peak-ahead"`
    /// (InfAdapter: the last minute's peak + 10 %).
    #[serde(default)]
    pub forecaster: ForecasterKind,
    /// `min_demand_qps = 1`: each app is planned for at least this much, so it keeps
    /// a device when idle.
    #[serde(default = "default_min_demand")]
    pub min_demand_qps: f64,
    /// `[allocator.ladder]`: demand lowering when a plan is infeasible.
    #[serde(default)]
    pub ladder: crate::ladder::Ladder,
    /// `[allocator.solver]`: time limit, MIP gap, threads.
    #[serde(default)]
    pub solver: crate::SolverSettings,
    /// `method = "milp"` (Proteus's MILP, the default) or `"infaas-accuracy"` (the
    /// greedy autoscaler of Proteus's INFaaS-Accuracy baseline).
    #[serde(default)]
    pub method: Method,
    /// `replan = "periodic"` (the default) or `"never"`: the first plan stays (Clipper).
    #[serde(default)]
    pub replan: Replan,
    /// `placement = "dynamic"` (the default) or `"fixed"`: after the first plan every
    /// device keeps its app, re-plans choose variants and routing only (Sommelier).
    #[serde(default)]
    pub placement: DeviceMobility,
    /// `variants = "all"` (the default), `"most-accurate"` or `"least-accurate"`.
    #[serde(default)]
    pub variants: crate::proteus::Variants,
    /// `routing = "plan"` (the default: the plan's shares) or `"uniform"`: evenly over
    /// an app's devices (Proteus without query assignment).
    #[serde(default)]
    pub routing: SplitBy,
    /// `spare = "idle"` (the default) or `"replicate"`: what a plan's idle devices do
    /// ([`Spare`]).
    #[serde(default)]
    pub spare: Spare,
    /// `[allocator.infaas]`: the greedy autoscaler's thresholds.
    #[serde(default)]
    pub infaas: crate::infaas::Settings,
    /// `[allocator.cores]`: the core-scaling methods' capacity table and settings
    /// (`method = "infadapter" | "model-switching-plus" | "vpa"`).
    #[serde(default)]
    pub cores: crate::cores::CoreSettings,
}

fn default_batch_sizes() -> Vec<u32> {
    vec![1, 2, 4, 8]
}
fn default_min_interval() -> f64 {
    5.0
}
fn default_period() -> f64 {
    10.0
}
fn default_threshold() -> f64 {
    0.2
}
fn default_min_demand() -> f64 {
    1.0
}

/// How demand is forecast for a re-plan (`sluice_core::demand`).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum ForecasterKind {
    /// Proteus's EWMA (com 1.6) over the last 20 one-second counts.
    #[default]
    Ewma,
    /// InfAdapter's: the last minute's peak second, + 10 %.
    PeakAhead,
    /// The Vertical Pod Autoscaler recommender's: the 90th percentile of every second
    /// seen, weights halving every 24 h.
    VpaPercentile,
}

/// The one "re-plan early when demand moved" rule: the demand `now` is more than
/// `threshold` (relative) away from the demand `planned` for, measured against at
/// least `floor` req/s so an idle app's noise (0.3 against 0.1 req/s) does not
/// re-plan. Apps ([`AllocatorConfig::demand_shifted`]) and pipelines
/// (`replan_threshold`, their `min_demand_qps`) both use it.
pub fn demand_moved(planned: f64, now: f64, threshold: f64, floor: f64) -> bool {
    (now - planned).abs() > threshold * planned.max(floor)
}

impl AllocatorConfig {
    /// Whether an app's demand `now` moved from the demand `used` by the plan in
    /// force ([`demand_moved`], against at least `min_demand_qps`; an app absent
    /// there counts as `min_demand_qps`): the early re-plan rule of the live host,
    /// the cluster's allocator and the simulator.
    pub fn demand_shifted(&self, used: &BTreeMap<String, f64>, now: &BTreeMap<String, f64>) -> bool {
        now.iter().any(|(app, &d)| {
            let u = used.get(app).copied().unwrap_or(self.min_demand_qps);
            demand_moved(u, d, self.threshold, self.min_demand_qps)
        })
    }

    /// The forecaster `forecaster` names.
    pub fn forecaster(&self) -> Box<dyn Forecaster> {
        match self.forecaster {
            ForecasterKind::Ewma => Box::new(Ewma::default()),
            ForecasterKind::PeakAhead => Box::new(PeakAhead::default()),
            ForecasterKind::VpaPercentile => Box::new(DecayingPercentile::default()),
        }
    }

    /// Resolves the relative paths in it (the capacity table) against `base`, the
    /// directory of the file it was read from.
    pub fn rebase(&mut self, base: &Path) {
        if let Some(p) = self.cores.capacity.as_mut() {
            if p.is_relative() && !base.as_os_str().is_empty() {
                *p = base.join(&*p);
            }
        }
    }
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            objective: Default::default(),
            formulation: Default::default(),
            batch_sizes: default_batch_sizes(),
            demand_qps: BTreeMap::new(),
            period_s: default_period(),
            min_interval_s: default_min_interval(),
            warmup_s: None,
            threshold: default_threshold(),
            forecaster: ForecasterKind::default(),
            min_demand_qps: default_min_demand(),
            ladder: Default::default(),
            solver: Default::default(),
            method: Default::default(),
            replan: Default::default(),
            placement: Default::default(),
            variants: Default::default(),
            routing: Default::default(),
            spare: Default::default(),
            infaas: Default::default(),
            cores: Default::default(),
        }
    }
}

/// Checks `[[device]]`s and `[allocator]` against the apps (the server config and an
/// experiment both call it): device types unique and non-empty, every app with one
/// worker per device and the weighted router, the allocator's settings in range
/// (`crate::limits`; docs/allocator.md, "Ranges").
pub fn validate(apps: &[AppConfig], devices: &[DeviceConfig], allocator: &AllocatorConfig) -> Result<(), InvalidField> {
    let invalid = |field: String, message: &str| InvalidField { field, message: message.to_string() };
    let a = allocator;
    a.solver.validate().map_err(|m| invalid("allocator.solver".into(), &m.to_string()))?;
    a.infaas.validate().map_err(|m| invalid("allocator.infaas".into(), &m.to_string()))?;
    let heuristic = a.method != Method::Milp;
    if heuristic && a.placement == DeviceMobility::Fixed {
        return Err(invalid(
            "allocator.placement".into(),
            &format!("method = \"{}\" moves devices itself: placement must be \"dynamic\"", a.method.name()),
        ));
    }
    if heuristic && a.spare == Spare::Replicate {
        return Err(invalid(
            "allocator.spare".into(),
            &format!("method = \"{}\" releases devices itself: spare must be \"idle\"", a.method.name()),
        ));
    }
    if a.method.is_cores() {
        validate_cores(apps, devices, a)?;
    }
    for (name, &qps) in &a.demand_qps {
        if !apps.iter().any(|x| &x.name == name) {
            return Err(invalid(format!("allocator.demand_qps.{name}"), "no app of that name"));
        }
        check_demand(qps).map_err(|m| invalid(format!("allocator.demand_qps.{name}"), &m.to_string()))?;
    }
    if !(a.period_s.is_finite() && limits::PERIOD_S.contains(&a.period_s)) {
        return Err(invalid(
            "allocator.period_s".into(),
            &format!("expected {} to {} s", limits::PERIOD_S.start(), limits::PERIOD_S.end()),
        ));
    }
    for (key, v) in [("min_interval_s", Some(a.min_interval_s)), ("warmup_s", a.warmup_s)] {
        if v.is_some_and(|v| !(v.is_finite() && (0.0..=*limits::PERIOD_S.end()).contains(&v))) {
            return Err(invalid(format!("allocator.{key}"), &format!("expected 0 to {} s", limits::PERIOD_S.end())));
        }
    }
    if !limits::positive_within(a.threshold, limits::MAX_FACTOR) {
        return Err(invalid(
            "allocator.threshold".into(),
            &format!("expected a positive fraction, at most {:e}", limits::MAX_FACTOR),
        ));
    }
    if !limits::positive_within(a.min_demand_qps, limits::MAX_DEMAND_QPS) {
        return Err(invalid(
            "allocator.min_demand_qps".into(),
            &format!("expected a positive number of requests/s, at most {:e}", limits::MAX_DEMAND_QPS),
        ));
    }
    check_batches(&a.batch_sizes).map_err(|m| invalid("allocator.batch_sizes".into(), &m.to_string()))?;
    check_ladder(&a.ladder).map_err(|m| invalid("allocator.ladder".into(), &m.to_string()))?;
    if devices.is_empty() {
        return Ok(());
    }
    let mut types = BTreeMap::new();
    for d in devices {
        if types.insert(d.kind.clone(), ()).is_some() {
            return Err(invalid(format!("device.{}.type", d.kind), "duplicate device type"));
        }
        check_count(d.count).map_err(|m| invalid(format!("device.{}.count", d.kind), &m.to_string()))?;
        if let Some(mb) = d.memory_mb {
            check_memory(mb).map_err(|m| invalid(format!("device.{}.memory_mb", d.kind), &m.to_string()))?;
        }
    }
    // Summed wide: thousands of types of 10,000 devices must not wrap around.
    let total = u32::try_from(devices.iter().map(|d| u64::from(d.count)).sum::<u64>()).unwrap_or(u32::MAX);
    check_total(total, a.formulation).map_err(|m| invalid("device".into(), &m.to_string()))?;
    for app in apps {
        if app.workers != total {
            return Err(invalid(
                format!("app.{}.workers", app.name),
                &format!("with [[device]], one worker per device: expected {total}"),
            ));
        }
        if app.router != RouterMode::Weighted {
            return Err(invalid(
                format!("app.{}.router", app.name),
                "with [[device]], requests follow the allocator's shares: router = \"weighted\"",
            ));
        }
    }
    Ok(())
}

/// The core methods plan one app on one device type of cores, from a capacity table
/// that has the app's variants (and the VPA's one variant).
fn validate_cores(apps: &[AppConfig], devices: &[DeviceConfig], a: &AllocatorConfig) -> Result<(), InvalidField> {
    let invalid = |field: &str, message: String| InvalidField { field: field.to_string(), message };
    a.cores.validate().map_err(|m| invalid("allocator.cores", m.to_string()))?;
    if devices.len() != 1 || apps.len() != 1 {
        return Err(invalid(
            "allocator.method",
            "the core methods plan one [[app]] on one [[device]] group (its cores)".into(),
        ));
    }
    // The device count is the core budget, and the ILP has a binary per core count.
    if !limits::CORES.contains(&devices[0].count) {
        return Err(invalid(
            &format!("device.{}.count", devices[0].kind),
            format!("the core methods plan a budget of {} cores", limits::span(&limits::CORES)),
        ));
    }
    let model =
        crate::cores::CoreModel::load(&a.cores).map_err(|m| invalid("allocator.cores.capacity", m.to_string()))?;
    if let Some(models) = &apps[0].models {
        if !models.iter().any(|m| model.has(m)) {
            return Err(invalid(
                "allocator.cores.capacity",
                format!("none of app {}'s models is in the capacity table", apps[0].name),
            ));
        }
    }
    if a.method == Method::Vpa {
        match &a.cores.variant {
            None => return Err(invalid("allocator.cores.variant", "required by method = \"vpa\"".into())),
            Some(v) if !model.has(v) => {
                return Err(invalid("allocator.cores.variant", format!("`{v}` is not in the capacity table")))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// A `[[device]]` whose profile cannot be loaded.
#[derive(Debug, thiserror::Error)]
#[error("device {kind}: {source}")]
pub struct DeviceLoadError {
    /// The device type (`type`).
    pub kind: String,
    /// Why its profile cannot be used (the error names the file).
    pub source: sluice_core::profile::ProfileError,
}

/// The devices of a config, with their profiles: worker w of every app runs on
/// device w.
pub struct DevicePool {
    types: Vec<(DeviceConfig, Profile)>,
    /// The device type (index into `types`) of each worker.
    of_worker: Vec<usize>,
}

impl DevicePool {
    /// Loads the device profiles (None without devices).
    pub fn load(devices: &[DeviceConfig]) -> Result<Option<DevicePool>, DeviceLoadError> {
        if devices.is_empty() {
            return Ok(None);
        }
        let mut types = Vec::new();
        let mut of_worker = Vec::new();
        for (t, d) in devices.iter().enumerate() {
            let profile =
                Profile::load(&d.profile).map_err(|source| DeviceLoadError { kind: d.kind.clone(), source })?;
            types.push((d.clone(), profile));
            of_worker.extend(std::iter::repeat_n(t, d.count as usize));
        }
        Ok(Some(DevicePool { types, of_worker }))
    }

    /// Devices (= workers per app).
    pub fn len(&self) -> usize {
        self.of_worker.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.of_worker.is_empty()
    }

    /// The profile of worker `w`'s device type.
    pub fn profile_of(&self, w: usize) -> &Profile {
        &self.types[self.of_worker[w]].1
    }

    /// The app's variants as each worker sees them: the latency table of its device
    /// type (at the app's percentile, capped at its max batch); a variant its device
    /// has no profile for keeps the app's table (a plan never places it there).
    pub fn models_per_worker(&self, app: &AppConfig, models: &[sdk::Model]) -> Vec<Vec<sdk::Model>> {
        (0..self.len())
            .map(|w| {
                let profile = self.profile_of(w);
                models
                    .iter()
                    .map(|m| {
                        let mut m = m.clone();
                        if let Some(mp) = profile.model(&m.name) {
                            let mut table = mp.latency_table(app.latency_percentile);
                            if let Some(cap) = app.max_batch {
                                table.truncate(cap as usize);
                            }
                            if !table.is_empty() {
                                m.latency = table;
                            }
                        }
                        m
                    })
                    .collect()
            })
            .collect()
    }

    /// Proteus's problem for `demand` (requests/s per app, default 1): the apps with
    /// their variants (by name), over these devices.
    pub fn problem(
        &self,
        allocator: &AllocatorConfig,
        apps: &[(&AppConfig, Vec<String>)],
        demand: &BTreeMap<String, f64>,
    ) -> proteus::Problem {
        proteus::Problem {
            devices: self
                .types
                .iter()
                .map(|(d, p)| proteus::DeviceType {
                    name: d.kind.clone(),
                    count: d.count,
                    memory_mb: d.memory_mb,
                    profile: p.clone(),
                })
                .collect(),
            apps: apps
                .iter()
                .map(|(app, models)| proteus::App {
                    name: app.name.clone(),
                    slo_ms: app.slo_ms,
                    demand_qps: demand.get(&app.name).copied().unwrap_or(1.0),
                    models: models.clone(),
                    memory_mb: BTreeMap::new(),
                })
                .collect(),
            batch_sizes: allocator.batch_sizes.clone(),
            objective: allocator.objective,
            formulation: allocator.formulation,
            ladder: allocator.ladder.clone(),
            solver: allocator.solver.clone(),
            variants: allocator.variants,
            pinned: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demand_moved_is_relative_to_the_plan_with_a_floor() {
        // 20 % of 10 req/s is 2: 12.5 moved, 11.5 did not.
        assert!(demand_moved(10.0, 12.5, 0.2, 1.0));
        assert!(!demand_moved(10.0, 11.5, 0.2, 1.0));
        assert!(demand_moved(10.0, 7.9, 0.2, 1.0));
        // An idle app planned for 0.1 req/s: against the floor, 0.3 is noise.
        assert!(!demand_moved(0.1, 0.3, 0.2, 1.0));
        assert!(demand_moved(0.1, 1.5, 0.2, 1.0));
        // The floor is the configured minimum demand, not a constant.
        assert!(!demand_moved(0.0, 1.5, 0.2, 10.0));
    }

    #[test]
    fn an_app_absent_from_the_plan_counts_as_the_minimum_demand() {
        let c = AllocatorConfig { min_demand_qps: 5.0, ..AllocatorConfig::default() };
        let now = BTreeMap::from([("a".to_string(), 5.5)]);
        assert!(!c.demand_shifted(&BTreeMap::new(), &now));
        let now = BTreeMap::from([("a".to_string(), 7.0)]);
        assert!(c.demand_shifted(&BTreeMap::new(), &now));
    }
}
