//! The MILP allocator in the live host: the `[[device]]`s of the config, and the plan
//! that says which variant each device (worker) serves and how each app's requests
//! are shared over its workers (`sluice_alloc`, Proteus §4).
//!
//! With devices, every app has one worker per device (worker w of every app runs on
//! device w) and routes by weights; a device serves the one app the plan gives it,
//! and that app's worker w gets the plan's share while the other apps' worker w get
//! none and load nothing. Each worker sees its own device's latencies (the emulated
//! executor runs them; its policy instance is initialised with them).
//!
//! Today the plan is made once, at startup, for `[allocator] demand_qps`; re-planning
//! while serving (demand monitor, periodic and threshold re-solves, make-before-break
//! application) is the next step (docs/allocator.md, "What is left").

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context;
use serde_json::{json, Value};
use sluice_alloc::{proteus, Allocator, AnyPlan, AnyProblem};
use sluice_core::profile::Profile;
use sluice_sdk as sdk;

use crate::config::{AppConfig, Config, DeviceConfig, ExecutorKind};
use crate::state::{AppSources, ModelSource};

/// The devices of the config, with their profiles.
pub struct Devices {
    types: Vec<(DeviceConfig, Profile)>,
    /// The device type (index into `types`) of each worker.
    of_worker: Vec<usize>,
}

impl Devices {
    /// Loads the device profiles (None: the config has no `[[device]]`).
    pub fn load(config: &Config) -> anyhow::Result<Option<Devices>> {
        if config.devices.is_empty() {
            return Ok(None);
        }
        let mut types = Vec::new();
        let mut of_worker = Vec::new();
        for (t, d) in config.devices.iter().enumerate() {
            let profile = Profile::load(&d.profile).with_context(|| format!("device {}", d.kind))?;
            types.push((d.clone(), profile));
            of_worker.extend(std::iter::repeat_n(t, d.count as usize));
        }
        Ok(Some(Devices { types, of_worker }))
    }

    /// The app's variants as each worker sees them: the latency table of its device
    /// type (at the app's percentile, capped at its max batch); a variant its device
    /// has no profile for keeps the app's table (the plan never places it there).
    pub fn models_per_worker(&self, app: &AppConfig, models: &[sdk::Model]) -> Vec<Vec<sdk::Model>> {
        self.of_worker
            .iter()
            .map(|&t| {
                let profile = &self.types[t].1;
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

    /// The allocation problem for `demand` (requests/s per app).
    fn problem(
        &self,
        config: &Config,
        resolved: &[(Vec<sdk::Model>, AppSources)],
        demand: &BTreeMap<String, f64>,
    ) -> proteus::Problem {
        let a = &config.allocator;
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
            apps: config
                .apps
                .iter()
                .zip(resolved)
                .map(|(app, (models, _))| proteus::App {
                    name: app.name.clone(),
                    slo_ms: app.slo_ms,
                    demand_qps: demand.get(&app.name).copied().unwrap_or(1.0),
                    models: models.iter().map(|m| m.name.clone()).collect(),
                    memory_mb: BTreeMap::new(),
                })
                .collect(),
            batch_sizes: a.batch_sizes.clone(),
            objective: a.objective,
            formulation: a.formulation,
            ladder: a.ladder.clone(),
            solver: a.solver.clone(),
        }
    }
}

/// The allocator's state in the host: its last allocation and the demand it used.
pub struct Allocation {
    allocator: Allocator,
    last: sluice_alloc::Allocation,
    demand: BTreeMap<String, f64>,
    /// Per-worker variant tables, per app (what the emulated executor runs).
    tables: BTreeMap<String, Vec<Vec<sdk::Model>>>,
}

impl Allocation {
    /// Makes the first plan (None without devices). A config whose demand has no
    /// feasible plan, or that the solver fails on, does not start.
    pub async fn start(
        config: &Config,
        devices: &Option<Devices>,
        resolved: &[(Vec<sdk::Model>, AppSources)],
    ) -> anyhow::Result<Option<Allocation>> {
        let Some(devices) = devices else { return Ok(None) };
        let demand: BTreeMap<String, f64> = config
            .apps
            .iter()
            .map(|a| (a.name.clone(), config.allocator.demand_qps.get(&a.name).copied().unwrap_or(1.0)))
            .collect();
        let problem = AnyProblem::Proteus(devices.problem(config, resolved, &demand));
        let (allocator, last) = tokio::task::spawn_blocking(move || {
            let mut allocator = Allocator::default();
            let last = allocator.allocate(&problem);
            (allocator, last)
        })
        .await
        .context("allocator task")?;
        if let Some(e) = &last.error {
            anyhow::bail!("allocator: {e}");
        }
        if last.plan.is_none() {
            anyhow::bail!("allocator: no feasible plan for the demand {demand:?} on these devices");
        }
        let tables = config
            .apps
            .iter()
            .zip(resolved)
            .map(|(app, (models, _))| (app.name.clone(), devices.models_per_worker(app, models)))
            .collect();
        let a = Allocation { allocator, last, demand, tables };
        if let Some(plan) = a.plan() {
            tracing::info!(
                status = a.last.status,
                effective_accuracy = plan.effective_accuracy,
                devices_used = plan.devices_used,
                solve_s = a.last.solve_seconds,
                "allocator: first plan"
            );
        }
        Ok(Some(a))
    }

    /// The plan in force.
    pub fn plan(&self) -> Option<&proteus::Plan> {
        match self.allocator.current() {
            Some(AnyPlan::Proteus(p)) => Some(p),
            _ => None,
        }
    }

    /// What worker `w` of `app` loads under the plan: the variant its device serves
    /// for this app, or nothing.
    pub fn initial_models(
        &self,
        app: &AppConfig,
        models: &[sdk::Model],
        source: &AppSources,
        w: usize,
    ) -> Vec<(u32, ModelSource)> {
        let Some(d) = self.plan().and_then(|p| p.devices.get(w)) else { return Vec::new() };
        if d.app.as_deref() != Some(app.name.as_str()) {
            return Vec::new();
        }
        let Some(id) = d.model.as_ref().and_then(|m| models.iter().position(|x| &x.name == m)) else {
            return Vec::new();
        };
        let src = match source.executor {
            // The emulated executor runs the device's latency, not the app profile's.
            ExecutorKind::Emulated => ModelSource::Emulated(Arc::new(self.tables[&app.name][w][id].latency.clone())),
            ExecutorKind::Onnx => source.models[id].clone(),
        };
        vec![(id as u32, src)]
    }

    /// The app's routing weights under the plan: each worker's share of its requests.
    pub fn weights(&self, app: &AppConfig) -> Vec<f64> {
        let n = app.workers as usize;
        let Some(plan) = self.plan() else { return vec![0.0; n] };
        (0..n)
            .map(|w| match plan.devices.get(w) {
                Some(d) if d.app.as_deref() == Some(app.name.as_str()) => d.share,
                _ => 0.0,
            })
            .collect()
    }

    /// `GET /admin/allocation`.
    pub fn to_json(&self) -> Value {
        json!({ "demand_qps": self.demand, "allocation": self.last })
    }
}
