//! Proteus's resource manager (ASPLOS'24 §4): model selection, placement and query
//! assignment as one MILP that maximises effective accuracy while serving the
//! demand, lowering the served demand step by step when it cannot; and Loki's
//! hardware scaling (HPDC'24 §4.1, step 1) for single-model apps as an alternative
//! objective.
//!
//! Two formulations of the same problem, both exact:
//! - [`Formulation::PerDevice`] is the paper's: a binary x(d,m) per device and
//!   variant (Eq. 1: at most one variant per device), a routing share y(d,q) per
//!   device and app (Eq. 2), and the products x(d,m)·y(d,q) of Eqs. 3 and 7
//!   linearised exactly with u(d,m) ≤ x(d,m), u(d,m) ≤ y(d,q), u(d,m) ≥ y(d,q) −
//!   (1 − x(d,m)) (a big-M of 1, the bound of y), never dropped.
//! - [`Formulation::Aggregated`] (the default) counts devices per (device type,
//!   variant) instead, n(t,m) ∈ ℕ with Σ_m n(t,m) ≤ count(t), and routes a share
//!   r(t,m) of app q's demand to them with β·s_q·r(t,m) ≤ P(t,m)·n(t,m). Devices of
//!   one type are interchangeable, so any per-device plan sums to an aggregated one
//!   with the same accuracy, and an aggregated plan splits its share evenly over its
//!   n(t,m) devices into a per-device plan that meets every per-device constraint:
//!   the optima are equal (tested against each other and against brute force). What
//!   it removes is the symmetry between identical devices that makes the per-device
//!   model slow to prove optimal (BENCHMARKS.md §6).
//!
//! Capacity P(t,m) follows §4 and the reference (`algorithms/ilp.py`,
//! `core/simulator.py` of the artifact): the largest allowed batch size whose p50
//! latency on the device type is below SLO/2 (strictly; the worst case waits one
//! batch and runs the next) and whose variant fits the device's memory where both
//! are known, at throughput ⌊b / latency⌋.
//!
//! Demand that cannot be served: §4 lowers s_q; the reference steps a factor β
//! from 1.05 down by 0.05 (0.1 above 1.5) while β > 0.2. Here β ≥ 1 is headroom
//! (capacity ≥ β × routed demand on every device, as the reference's constraints
//! work out to) and β < 1 serves every app at least β·s_q — with the aggregated
//! formulation as much more as capacity allows (per-app shedding) — and reports
//! the rest as shed. The highest feasible step is found by one MILP over
//! placements (`Search::Lexicographic`, the default) or by solving steps in turn
//! (docs/allocator.md, "Proteus").

/// The local search over placements and the plans made without a solver.
mod placement;

use crate::violation::Violation;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use good_lp::{constraint, variable, Expression, Solution as _, Variable};
use serde::{Deserialize, Serialize};
use sluice_core::profile::{ModelProfile, Percentile, Profile};
use thiserror::Error;

pub use crate::ladder::{Ladder, Search};
use crate::limits::RangeError;
/// Where a plan came from (shared by every formulation: [`crate::origin`]).
pub use crate::origin::Origin;
use crate::solver::{Milp, Sense, SolveError, SolveReport, SolveStatus, SolverSettings};
use placement::Scorer;

/// One type of device and how many of them there are.
#[derive(Clone, Debug)]
pub struct DeviceType {
    /// Its name (`cpu`, `ampere`, …), unique in the problem.
    pub name: String,
    /// How many devices of this type.
    pub count: u32,
    /// Memory of one device, MB (None: unknown, not checked).
    pub memory_mb: Option<f64>,
    /// Latency of every variant on this type.
    pub profile: Profile,
}

/// One app (Proteus's query type) and the variants that can serve it.
#[derive(Clone, Debug)]
pub struct App {
    /// Its name.
    pub name: String,
    /// Latency SLO, ms.
    pub slo_ms: f64,
    /// Demand to serve, requests/s.
    pub demand_qps: f64,
    /// Its variants, by name in the device profiles.
    pub models: Vec<String>,
    /// Memory footprint of a variant, MB, where known.
    pub memory_mb: BTreeMap<String, f64>,
}

/// Which objective.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Objective {
    /// Maximise effective accuracy (Proteus §4).
    #[default]
    Accuracy,
    /// Serve every app with its most accurate variant on the fewest devices; only
    /// when that is infeasible, maximise accuracy (Loki §4.1, steps 1 and 2).
    HardwareFirst,
}

/// Which MILP (see the module documentation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Formulation {
    /// Counts per (device type, variant): exact, symmetry-free.
    #[default]
    Aggregated,
    /// The paper's binaries per device with the linearised products.
    PerDevice,
}

/// Which variants of each app a plan may use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Variants {
    /// Any (model selection, §4).
    #[default]
    All,
    /// Only the app's most accurate variant among those that fit some device type
    /// (Clipper-HA, §6.1.1; Proteus without model selection, §6.5).
    MostAccurate,
    /// Only the least accurate one (Clipper-HT, §6.1.1).
    LeastAccurate,
}

/// A Proteus problem: devices, apps, and how to solve.
#[derive(Clone, Debug)]
pub struct Problem {
    /// Device types.
    pub devices: Vec<DeviceType>,
    /// Apps.
    pub apps: Vec<App>,
    /// Batch sizes a variant may run (the reference's [1, 2, 4, 8]).
    pub batch_sizes: Vec<u32>,
    /// Objective.
    pub objective: Objective,
    /// Formulation.
    pub formulation: Formulation,
    /// Demand lowering.
    pub ladder: Ladder,
    /// Solver limits.
    pub solver: SolverSettings,
    /// Which variants a plan may use.
    pub variants: Variants,
    /// Fixed placement (Sommelier, §6.1.1; Proteus without model placement, §6.5):
    /// `pinned[t][q]` devices of type t serve app q, exactly — the solver still picks
    /// their variants and the routing, but no device changes app. None: free.
    pub pinned: Option<Vec<Vec<u32>>>,
}

/// Why a problem cannot be solved at all.
#[derive(Debug, Error)]
pub enum ProteusError {
    /// An app names a variant no device profile has.
    #[error("app {app}: model `{model}` is in no device profile")]
    UnknownModel {
        /// The app.
        app: String,
        /// The variant.
        model: String,
    },
    /// No device to plan on: every device type has a count of 0 (a problem file or
    /// config refuses that where it is parsed; a problem built in code may not).
    #[error("no device: every device type has count 0")]
    NoDevices,
    /// No device can serve the app at any demand: none of its variants runs a batch
    /// within half its SLO (or fits the memory) on a device type that has devices.
    /// Said before any solve: no demand factor changes it, and the solver would only
    /// report the whole problem infeasible.
    #[error("app {app}: no device can serve it: {reason}")]
    Unservable {
        /// The app.
        app: String,
        /// Why: the fastest of its variants and what it misses.
        reason: String,
    },
    /// The allocation's time limit ([`SolverSettings::time_limit_s`], for the whole
    /// allocation) passed before any solve found a plan.
    #[error(
        "no plan found within the allocation's time limit of {limit_s} s ({solves} solves; \
         the plan in force, if any, stays)"
    )]
    NoPlanInTime {
        /// The limit, s.
        limit_s: f64,
        /// Solves made by then.
        solves: usize,
    },
    /// The solver failed (not an infeasible model: that lowers β).
    #[error(transparent)]
    Solve(#[from] SolveError),
}

/// The capacity of one variant on one device type.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Capacity {
    /// The batch size it runs at.
    pub batch: u32,
    /// Its p50 latency at that batch, µs.
    pub latency_us: u64,
    /// Requests/s one device sustains: ⌊batch / latency⌋.
    pub qps: f64,
}

/// P(t,m): the largest batch in `batch_sizes` (among those measured) whose p50
/// latency is below half the SLO, and the throughput at it; None when no batch
/// size qualifies or the variant does not fit the device's memory.
pub fn capacity(
    model: &ModelProfile,
    slo_ms: f64,
    batch_sizes: &[u32],
    device_memory_mb: Option<f64>,
    model_memory_mb: Option<f64>,
) -> Option<Capacity> {
    if let (Some(d), Some(m)) = (device_memory_mb, model_memory_mb) {
        if m > d {
            return None;
        }
    }
    let half_slo_us = slo_ms * 1000.0 / 2.0;
    model
        .batch_sizes
        .iter()
        .zip(model.measured_us(Percentile::P50))
        .filter(|(b, l)| batch_sizes.contains(b) && (**l as f64) < half_slo_us && **l > 0)
        .max_by_key(|(b, _)| **b)
        .map(|(&batch, &latency_us)| Capacity {
            batch,
            latency_us,
            qps: (batch as f64 * 1e6 / latency_us as f64).floor(),
        })
}

/// Which step produced a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Step {
    /// Hardware scaling: the most accurate variants on the fewest devices.
    Hardware,
    /// Accuracy scaling: the most accurate mix that serves the (possibly lowered) demand.
    Accuracy,
    /// A baseline's heuristic (INFaaS-Accuracy's greedy autoscaler), no MILP.
    Heuristic,
    /// The lexicographic search's first solve: the highest step of the ladder at
    /// which every app can be served ([`crate::ladder::Search::Lexicographic`]). It
    /// makes no plan of its own; only an [`Attempt`] says it.
    Demand,
}

/// Variant `model` of app `app` on `devices` devices of type `device_type`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Route {
    /// The app.
    pub app: String,
    /// The variant.
    pub model: String,
    /// Its accuracy.
    pub accuracy: f64,
    /// The device type.
    pub device_type: String,
    /// How many devices of that type host it.
    pub devices: u32,
    /// Share of the app's demand routed to them (together).
    pub share: f64,
    /// Requests/s routed to them.
    pub qps: f64,
    /// Their capacity, requests/s (all of them together).
    pub capacity_qps: f64,
    /// The batch size they run at.
    pub batch: u32,
}

/// One app in a plan.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AppPlan {
    /// The app.
    pub name: String,
    /// Its demand, requests/s.
    pub demand_qps: f64,
    /// Served (routed) requests/s: the demand at β ≥ 1; below, at least β × demand
    /// and as much more as capacity allows (per-app shedding, aggregated
    /// formulation; exactly β × demand with the per-device one).
    pub served_qps: f64,
    /// Shed requests/s: demand − served.
    pub shed_qps: f64,
    /// Demand-weighted accuracy of what it serves.
    pub accuracy: f64,
    /// Why no device can serve it, when none can: it is planned as absent (served 0,
    /// all its demand shed) and the other apps are planned as usual.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unservable: Option<String>,
}

/// One device's assignment.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DevicePlan {
    /// `cpu-3`: the type and the index within it.
    pub device: String,
    /// The type.
    pub device_type: String,
    /// The app it serves (None: idle).
    pub app: Option<String>,
    /// The variant it hosts (None: idle).
    pub model: Option<String>,
    /// Share of the app's demand routed to it.
    pub share: f64,
    /// Per-request time of this device under the plan where it is not its
    /// profile's: a core of an n-core replica runs at n / saturation(n)
    /// (`cores::CapacityTable::service_us`). The simulator runs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_us: Option<u64>,
}

/// A plan: what every device hosts and how each app's demand is split.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    /// Which step produced it.
    pub step: Step,
    /// The demand factor it was solved at.
    pub beta: f64,
    /// Demand-weighted accuracy over everything served.
    pub effective_accuracy: f64,
    /// Devices hosting a variant.
    pub devices_used: u32,
    /// Per app.
    pub apps: Vec<AppPlan>,
    /// Per (app, variant, device type) with devices.
    pub routes: Vec<Route>,
    /// Per device.
    pub devices: Vec<DevicePlan>,
}

impl Plan {
    /// The placement as pins for [`Problem::pinned`]: how many devices of each type
    /// (in `problem`'s order) serve each app.
    pub fn pins(&self, problem: &Problem) -> Vec<Vec<u32>> {
        let mut pins = vec![vec![0u32; problem.apps.len()]; problem.devices.len()];
        for d in &self.devices {
            let t = problem.devices.iter().position(|x| x.name == d.device_type);
            let q = d.app.as_ref().and_then(|a| problem.apps.iter().position(|x| &x.name == a));
            if let (Some(t), Some(q)) = (t, q) {
                pins[t][q] += 1;
            }
        }
        pins
    }

    /// Gives every idle device a copy of a variant its type already hosts — the one
    /// whose devices carry the most load for their capacity — and splits that
    /// route's share over one more device: the same accuracy with more headroom. The
    /// reference does the like (every device hosts a variant; idle ones are upgraded
    /// to their family's most accurate); Eq. 1 itself allows idle devices.
    pub fn replicate_into_idle(&mut self) {
        for i in 0..self.devices.len() {
            if self.devices[i].app.is_some() {
                continue;
            }
            let t = self.devices[i].device_type.clone();
            let best = self
                .routes
                .iter()
                .enumerate()
                .filter(|(_, r)| r.device_type == t && r.devices > 0 && r.capacity_qps > 0.0)
                .max_by(|(_, a), (_, b)| (a.qps / a.capacity_qps).total_cmp(&(b.qps / b.capacity_qps)))
                .map(|(k, _)| k);
            let Some(k) = best else { continue };
            let r = &mut self.routes[k];
            r.capacity_qps += r.capacity_qps / r.devices as f64;
            r.devices += 1;
            self.devices[i].app = Some(r.app.clone());
            self.devices[i].model = Some(r.model.clone());
            self.devices_used += 1;
            self.spread_share(k);
        }
    }

    /// Frees the devices a route does not need for its load (capacity with the
    /// plan's headroom), and drops routes left with no device and no load. The
    /// accuracy objective is indifferent to a device placed without load, and a
    /// start that places every device (the lexicographic search's) leaves such
    /// devices placed; idle, they stay free for `replicate_into_idle` and the live
    /// host's spares instead of hosting a variant nothing is routed to.
    fn free_unloaded(&mut self) {
        let headroom = self.beta.max(1.0);
        for k in 0..self.routes.len() {
            let r = &self.routes[k];
            if r.devices == 0 {
                continue;
            }
            let each = r.capacity_qps / r.devices as f64;
            let needed = if r.qps <= 1e-9 || each <= 0.0 {
                0
            } else {
                ((r.qps * headroom / each) - 1e-9).ceil().max(1.0) as u32
            };
            if needed >= r.devices {
                continue;
            }
            let (t, app, model) = (r.device_type.clone(), r.app.clone(), r.model.clone());
            let mut kept = 0;
            for d in &mut self.devices {
                if d.device_type == t && d.app.as_ref() == Some(&app) && d.model.as_ref() == Some(&model) {
                    if kept < needed {
                        kept += 1;
                    } else {
                        (d.app, d.model, d.share, d.service_us) = (None, None, 0.0, None);
                    }
                }
            }
            let r = &mut self.routes[k];
            r.devices = needed;
            r.capacity_qps = each * needed as f64;
            self.spread_share(k);
        }
        self.routes.retain(|r| r.devices > 0 || r.share > 1e-9);
        self.devices_used = self.routes.iter().map(|r| r.devices).sum();
    }

    /// Checks the plan against `problem` as a MILP's plan must hold (to a relative
    /// 1e-6, HiGHS's rows hold to its tolerance): one entry per device; per type no
    /// more devices placed than it has; every route an allowed variant of its app
    /// that runs on its device type (capacity P as [`capacity`] computes it, times its
    /// devices), hosted by exactly that many device entries, with no load unless it
    /// has devices and no more load than its capacity over the headroom max(β, 1);
    /// every app served between β (at most 1) of its demand — 0 for an app no device
    /// can serve — and its demand, its shed the rest, its shares summing to 1 and its
    /// routes' requests/s to what it is served. The plans the allocator returns
    /// without a solver are checked with it before they are returned.
    pub fn check(&self, problem: &Problem) -> Result<(), Violation> {
        const TOL: f64 = 1e-6;
        let close = |a: f64, b: f64| (a - b).abs() <= TOL * (1.0 + a.abs().max(b.abs()));
        let headroom = self.beta.max(1.0);
        let expected: usize = problem.devices.iter().map(|d| d.count as usize).sum();
        if self.devices.len() != expected {
            return Err(Violation::Shape(format!("{} device entries for {expected} devices", self.devices.len())));
        }
        for dev in &problem.devices {
            let used: u32 = self.routes.iter().filter(|r| r.device_type == dev.name).map(|r| r.devices).sum();
            if used > dev.count {
                return Err(Violation::Constraint(format!(
                    "{used} devices of type {} placed, it has {}",
                    dev.name, dev.count
                )));
            }
        }
        for r in &self.routes {
            let at = format!("route {} / {} on {}", r.app, r.model, r.device_type);
            let app =
                problem.apps.iter().find(|a| a.name == r.app).ok_or(Violation::Shape(format!("{at}: no such app")))?;
            if !app.models.contains(&r.model) {
                return Err(Violation::Shape(format!("{at}: not a variant of the app")));
            }
            let dev = problem
                .devices
                .iter()
                .find(|d| d.name == r.device_type)
                .ok_or(Violation::Shape(format!("{at}: no such device type")))?;
            let mp =
                dev.profile.model(&r.model).ok_or(Violation::Shape(format!("{at}: not in the device's profile")))?;
            let cap =
                capacity(mp, app.slo_ms, &problem.batch_sizes, dev.memory_mb, app.memory_mb.get(&r.model).copied())
                    .ok_or(Violation::Constraint(format!(
                        "{at}: runs no batch within half the SLO, or does not fit"
                    )))?;
            if !close(r.capacity_qps, cap.qps * r.devices as f64) {
                return Err(Violation::Reported(format!(
                    "{at}: capacity {} for {} devices of {} req/s",
                    r.capacity_qps, r.devices, cap.qps
                )));
            }
            if r.qps * headroom > r.capacity_qps * (1.0 + TOL) + TOL {
                return Err(Violation::Constraint(format!(
                    "{at}: {} req/s over capacity {} (headroom {headroom})",
                    r.qps, r.capacity_qps
                )));
            }
            let hosting = self
                .devices
                .iter()
                .filter(|d| {
                    d.device_type == r.device_type
                        && d.app.as_ref() == Some(&r.app)
                        && d.model.as_ref() == Some(&r.model)
                })
                .count();
            if hosting != r.devices as usize {
                return Err(Violation::Reported(format!(
                    "{at}: {} devices in the route, {hosting} device entries host it",
                    r.devices
                )));
            }
        }
        let placed = self.devices.iter().filter(|d| d.app.is_some()).count();
        let routed: u32 = self.routes.iter().map(|r| r.devices).sum();
        if placed != routed as usize {
            return Err(Violation::Reported(format!("{placed} devices host a variant, the routes count {routed}")));
        }
        for a in &self.apps {
            let app = problem
                .apps
                .iter()
                .find(|x| x.name == a.name)
                .ok_or(Violation::Shape(format!("app {}: not in the problem", a.name)))?;
            let s = app.demand_qps;
            let least = if a.unservable.is_some() { 0.0 } else { s * self.beta.min(1.0) };
            if a.served_qps < least * (1.0 - TOL) - TOL || a.served_qps > s * (1.0 + TOL) + TOL {
                return Err(Violation::Constraint(format!(
                    "app {}: served {} req/s, not between {least} and its demand {s}",
                    a.name, a.served_qps
                )));
            }
            if !close(a.shed_qps, s - a.served_qps) {
                return Err(Violation::Reported(format!(
                    "app {}: shed {} of {s}, served {}",
                    a.name, a.shed_qps, a.served_qps
                )));
            }
            let shares: f64 = self.routes.iter().filter(|r| r.app == a.name).map(|r| r.share).sum();
            let qps: f64 = self.routes.iter().filter(|r| r.app == a.name).map(|r| r.qps).sum();
            if a.served_qps > TOL && !close(shares, 1.0) {
                return Err(Violation::Constraint(format!("app {}: shares sum to {shares}", a.name)));
            }
            if !close(qps, a.served_qps) {
                return Err(Violation::Constraint(format!(
                    "app {}: routes carry {qps} req/s, it is served {}",
                    a.name, a.served_qps
                )));
            }
        }
        Ok(())
    }

    /// Splits route `k`'s share evenly over the devices that host it.
    fn spread_share(&mut self, k: usize) {
        let r = &self.routes[k];
        let each = r.share / r.devices.max(1) as f64;
        for d in &mut self.devices {
            if d.device_type == r.device_type && d.app.as_ref() == Some(&r.app) && d.model.as_ref() == Some(&r.model) {
                d.share = each;
            }
        }
    }

    /// Gives every idle device its app's most accurate variant that fits the
    /// device's type, as the Loki artifact's Proteus baseline does: its MILP makes
    /// every device host a variant (`algorithms/ilp.py`, `c2_`: Σ_j x(i,j) = 1) and
    /// its simulator then upgrades each device the routing leaves idle to its
    /// family's most accurate feasible variant (`postprocess_predictor_dict`, "to
    /// ensure the cluster does not go under utilized"). Which family an idle device
    /// gets is the solver's arbitrary pick there; here it goes to the app whose
    /// capacity is most loaded (served requests/s over the capacity hosted for it,
    /// updated after every device), ties to the first app. The upgraded devices get
    /// no share of the plan's routing: they serve only under a router that fills by
    /// accuracy (Loki's MostAccurateFirst, which the artifact runs for this baseline).
    pub fn upgrade_idle(&mut self, problem: &Problem) -> Result<(), ProteusError> {
        let (cands, _) = candidates_shedding(problem)?;
        let mut capacity: Vec<f64> = self
            .apps
            .iter()
            .map(|a| self.routes.iter().filter(|r| r.app == a.name).map(|r| r.capacity_qps).sum())
            .collect();
        for i in 0..self.devices.len() {
            if self.devices[i].app.is_some() {
                continue;
            }
            let Some(t) = problem.devices.iter().position(|d| d.name == self.devices[i].device_type) else {
                continue;
            };
            let load = |q: usize| {
                let served = self.apps[q].served_qps;
                if capacity[q] > 0.0 {
                    served / capacity[q]
                } else if served > 0.0 {
                    f64::INFINITY
                } else {
                    0.0
                }
            };
            // The most loaded app with a variant that fits this type, and that
            // variant: the most accurate (ties: the faster).
            let pick = (0..self.apps.len())
                .filter_map(|q| {
                    let app = problem.apps.iter().position(|a| a.name == self.apps[q].name)?;
                    let best = cands
                        .iter()
                        .filter(|c| c.t == t && c.q == app)
                        .max_by(|a, b| a.accuracy.total_cmp(&b.accuracy).then(a.cap.qps.total_cmp(&b.cap.qps)))?;
                    Some((q, best))
                })
                .max_by(|(a, _), (b, _)| load(*a).total_cmp(&load(*b)).then(b.cmp(a)));
            let Some((q, c)) = pick else { continue };
            capacity[q] += c.cap.qps;
            let app = self.apps[q].name.clone();
            let type_name = problem.devices[t].name.clone();
            let at = self.routes.iter().position(|r| r.app == app && r.model == c.model && r.device_type == type_name);
            let k = match at {
                Some(k) => {
                    let r = &mut self.routes[k];
                    r.devices += 1;
                    r.capacity_qps += c.cap.qps;
                    k
                }
                None => {
                    self.routes.push(Route {
                        app: app.clone(),
                        model: c.model.clone(),
                        accuracy: c.accuracy,
                        device_type: type_name,
                        devices: 1,
                        share: 0.0,
                        qps: 0.0,
                        capacity_qps: c.cap.qps,
                        batch: c.cap.batch,
                    });
                    self.routes.len() - 1
                }
            };
            self.devices[i].app = Some(app);
            self.devices[i].model = Some(c.model.clone());
            self.devices_used += 1;
            self.spread_share(k);
        }
        Ok(())
    }

    /// Routes every app's demand evenly over the devices that host its variants,
    /// whatever their capacity (Proteus without query assignment, §6.5).
    pub fn route_uniformly(&mut self) {
        for app in &self.apps {
            let k = self.devices.iter().filter(|d| d.app.as_ref() == Some(&app.name)).count();
            for d in self.devices.iter_mut().filter(|d| d.app.as_ref() == Some(&app.name)) {
                d.share = 1.0 / k as f64;
            }
            for r in self.routes.iter_mut().filter(|r| r.app == app.name) {
                r.share = r.devices as f64 / k as f64;
                r.qps = r.share * app.served_qps;
            }
        }
        self.summarise_accuracy();
    }

    /// Every app's accuracy from its routes' shares (0 when it serves nothing) and
    /// the demand-weighted effective accuracy over what is served.
    fn summarise_accuracy(&mut self) {
        for app in &mut self.apps {
            let acc: f64 = self.routes.iter().filter(|r| r.app == app.name).map(|r| r.share * r.accuracy).sum();
            app.accuracy = if app.served_qps > 0.0 { acc } else { 0.0 };
        }
        let served: f64 = self.apps.iter().map(|a| a.served_qps).sum();
        let weighted: f64 = self.apps.iter().map(|a| a.accuracy * a.served_qps).sum();
        self.effective_accuracy = if served > 0.0 { weighted / served } else { 0.0 };
    }
}

/// One solve of the ladder.
#[derive(Clone, Debug, Serialize)]
pub struct Attempt {
    /// Which step.
    pub step: Step,
    /// The factor.
    pub beta: f64,
    /// How it ended.
    pub status: SolveStatus,
    /// Its wall time, s.
    pub solve_seconds: f64,
}

/// What [`solve`] returns: the plan, if any, and how it was found. Named for the
/// solve, so that `Outcome` stays a request's (`sluice_core::outcome::Outcome`).
#[derive(Clone, Debug, Serialize)]
pub struct Solved {
    /// The report of the solve that produced the plan (of the last attempt when none did).
    pub report: SolveReport,
    /// Every solve, in order.
    pub attempts: Vec<Attempt>,
    /// The plan (None: infeasible at every β down to the ladder's minimum).
    pub plan: Option<Plan>,
    /// The apps no device can serve, planned as absent (all their demand shed).
    pub shed: Vec<ShedApp>,
    /// Whether the allocation's time limit stopped the ladder: the plan is the best
    /// found by then (the highest β that had one).
    pub timed_out: bool,
    /// Where the plan came from: a MILP's, or, when none found one in the time limit,
    /// the greedy or the previous plan repaired.
    pub origin: Origin,
}

/// An app planned as absent because no device can serve it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ShedApp {
    /// The app.
    pub app: String,
    /// Why (as [`ProteusError::Unservable`] says it).
    pub reason: String,
}

/// A candidate: variant `model` of app `q` on device type `t`.
pub(crate) struct Cand {
    pub(crate) t: usize,
    pub(crate) q: usize,
    pub(crate) model: String,
    pub(crate) accuracy: f64,
    pub(crate) cap: Capacity,
}

/// Index of the feasible (type, variant) pairs.
pub(crate) fn candidates(problem: &Problem) -> Result<Vec<Cand>, ProteusError> {
    let (cands, unservable) = all_candidates(problem)?;
    match unservable.into_iter().next() {
        Some(ShedApp { app, reason }) => Err(ProteusError::Unservable { app, reason }),
        None => Ok(cands),
    }
}

/// The candidates, and the apps no device can serve (to plan as absent); an error
/// when no app at all can be served.
pub(crate) fn candidates_shedding(problem: &Problem) -> Result<(Vec<Cand>, Vec<ShedApp>), ProteusError> {
    let (cands, unservable) = all_candidates(problem)?;
    match unservable.first() {
        Some(ShedApp { app, reason }) if unservable.len() == problem.apps.len() => {
            Err(ProteusError::Unservable { app: app.clone(), reason: reason.clone() })
        }
        _ => Ok((cands, unservable)),
    }
}

fn all_candidates(problem: &Problem) -> Result<(Vec<Cand>, Vec<ShedApp>), ProteusError> {
    let mut out = Vec::new();
    for (q, app) in problem.apps.iter().enumerate() {
        for name in &app.models {
            let mut known = false;
            for (t, dev) in problem.devices.iter().enumerate() {
                let Some(mp) = dev.profile.model(name) else { continue };
                known = true;
                let mem = app.memory_mb.get(name).copied();
                if let Some(cap) = capacity(mp, app.slo_ms, &problem.batch_sizes, dev.memory_mb, mem) {
                    out.push(Cand { t, q, model: name.clone(), accuracy: mp.accuracy, cap });
                }
            }
            if !known {
                return Err(ProteusError::UnknownModel { app: app.name.clone(), model: name.clone() });
            }
        }
    }
    let unservable = servable(problem, &out)?;
    Ok((out, unservable))
}

/// Refuses a problem no plan can serve (no device at all, sizes out of range) and
/// lists, with the cause, every app with no variant that runs within half its SLO
/// (and fits the memory) on a device type that has devices — whatever its demand: no
/// demand factor changes it.
fn servable(problem: &Problem, cands: &[Cand]) -> Result<Vec<ShedApp>, ProteusError> {
    if problem.devices.iter().all(|d| d.count == 0) {
        return Err(ProteusError::NoDevices);
    }
    // Sizes a problem file or config refuses as it is read, for a problem built in
    // code: the plan lists every device, and 1e300 requests/s is not a coefficient.
    let total: u64 = problem.devices.iter().map(|d| u64::from(d.count)).sum();
    let total = u32::try_from(total).unwrap_or(u32::MAX);
    check_total(total, problem.formulation)
        .map_err(|range| SolveError::OutOfRange { field: "device".into(), range })?;
    for app in &problem.apps {
        crate::limits::check_demand(app.demand_qps)
            .map_err(|range| SolveError::OutOfRange { field: format!("app {}: demand_qps", app.name), range })?;
    }
    let mut unservable = Vec::new();
    for (q, app) in problem.apps.iter().enumerate() {
        if cands.iter().any(|c| c.q == q && problem.devices[c.t].count > 0) {
            continue;
        }
        // The fastest (variant, device type) at its smallest allowed batch size.
        let fastest = problem
            .devices
            .iter()
            .filter(|d| d.count > 0)
            .flat_map(|d| app.models.iter().filter_map(move |m| Some((d, m, d.profile.model(m)?))))
            .filter_map(|(d, m, mp)| {
                let measured = mp.batch_sizes.iter().zip(mp.measured_us(Percentile::P50));
                let (b, us) = measured.filter(|(b, _)| problem.batch_sizes.contains(b)).min_by_key(|(b, _)| **b)?;
                Some((d, m, *b, *us))
            })
            .min_by_key(|&(_, _, _, us)| us);
        let reason = match fastest {
            None => "none of its variants is measured at an allowed batch size on a device type with devices".into(),
            Some((d, m, b, 0)) => format!("its fastest variant, `{m}` on `{}`, has no latency at batch {b}", d.name),
            Some((d, m, b, us)) if us as f64 >= app.slo_ms * 1000.0 / 2.0 => format!(
                "its fastest variant, `{m}` on `{}`, takes {:.1} ms at batch {b}, not under half its SLO of {} ms",
                d.name,
                us as f64 / 1000.0,
                app.slo_ms
            ),
            Some(_) => "none of its variants fits the memory of a device type with devices".into(),
        };
        unservable.push(ShedApp { app: app.name.clone(), reason });
    }
    Ok(unservable)
}

/// Solves the problem: the configured objective, then (when hardware scaling is
/// infeasible, or for the accuracy objective) accuracy scaling down the ladder.
///
/// Apps no device can serve are planned as absent and listed in
/// [`Solved::shed`]; only when no app can be served is it an error
/// ([`ProteusError::Unservable`]). `problem.solver.time_limit_s` bounds the whole
/// allocation: each solve gets the time left, and when it runs out the best plan
/// found so far is returned ([`Solved::timed_out`]), or, with none,
/// a plan made without a solver ([`solve_from`] with no previous plan: the greedy
/// one, [`Solved::origin`]).
pub fn solve(problem: &Problem) -> Result<Solved, ProteusError> {
    solve_from(problem, None)
}

/// [`solve`], with the plan in force: when no MILP finds a plan within the
/// allocation's time limit ([`ProteusError::NoPlanInTime`]), the answer is still a
/// plan — `previous` repaired (its placement re-routed for the new demand) or the
/// greedy plan, whichever serves the higher demand factor (then accuracy; the
/// repaired one on a tie: it moves no device), each improved by the local search
/// and checked as a MILP's plan is ([`Plan::check`]). Its [`Solved::origin`] says
/// which, and why. The error remains only when neither is a valid plan.
pub fn solve_from(problem: &Problem, previous: Option<&Plan>) -> Result<Solved, ProteusError> {
    match solve_milp(problem) {
        Err(e @ ProteusError::NoPlanInTime { .. }) => without_solver(problem, previous, e),
        other => other,
    }
}

/// The plan when no MILP found one in time ([`solve_from`]).
fn without_solver(problem: &Problem, previous: Option<&Plan>, error: ProteusError) -> Result<Solved, ProteusError> {
    let started = Instant::now();
    let Ok((cands, shed)) = candidates_shedding(problem) else { return Err(error) };
    let absent: Vec<bool> = problem.apps.iter().map(|a| shed.iter().any(|s| s.app == a.name)).collect();
    let allowed = allowed_variants(problem, &cands);
    let reason = match &error {
        ProteusError::NoPlanInTime { limit_s, solves } => crate::origin::no_plan_in_time(*limit_s, *solves),
        other => other.to_string(),
    };
    // A few milliseconds: the allocation's time is already spent.
    let by = Instant::now() + Duration::from_secs_f64(FALLBACK_SEARCH_S);
    let greedy = placement::greedy(problem, &cands, &allowed, &absent).map(|n| (n, false));
    let repaired = previous.and_then(|p| placement::repaired(problem, &cands, &allowed, &absent, p)).map(|n| (n, true));
    let mut best: Option<(Plan, bool)> = None;
    for (n, is_repair) in [repaired, greedy].into_iter().flatten() {
        let Some(plan) = placement::finish(problem, &cands, &allowed, &absent, n, by) else { continue };
        let mut plan = plan;
        if problem.pinned.is_none() {
            plan.free_unloaded();
        }
        let Some(plan) = name_shed(Some(plan), &shed) else { continue };
        if plan.check(problem).is_err() {
            continue;
        }
        let better = match &best {
            None => true,
            Some((b, _)) => {
                plan.beta > b.beta + 1e-9
                    || ((plan.beta - b.beta).abs() <= 1e-9 && accuracy_objective(&plan) > accuracy_objective(b) + 1e-12)
            }
        };
        if better {
            best = Some((plan, is_repair));
        }
    }
    let Some((plan, is_repair)) = best else { return Err(error) };
    let origin = Origin::without_solver(is_repair, reason);
    let report = SolveReport {
        status: SolveStatus::TimeLimit,
        objective: Some(accuracy_objective(&plan)),
        gap: None,
        solve_seconds: started.elapsed().as_secs_f64(),
        variables: 0,
        constraints: 0,
    };
    Ok(Solved { report, attempts: Vec::new(), plan: Some(plan), shed, timed_out: true, origin })
}

/// How long the local search of a plan made without a solver may run, s.
const FALLBACK_SEARCH_S: f64 = 0.01;

fn solve_milp(problem: &Problem) -> Result<Solved, ProteusError> {
    let deadline = Instant::now() + Duration::from_secs_f64(problem.solver.time_limit_s.clamp(0.0, 1e7));
    let (cands, shed) = candidates_shedding(problem)?;
    let absent: Vec<bool> = problem.apps.iter().map(|a| shed.iter().any(|s| s.app == a.name)).collect();
    let allowed = allowed_variants(problem, &cands);
    let mut attempts = Vec::new();
    let mut no_plan_in_time = false;
    // One solve within the time left: running out of it without a plan is not an
    // error here but a step without a plan (a lower β may still have one).
    let mut within = |keep: &[bool], beta: f64, left: f64, step: Step| match solve_at(
        problem, &cands, keep, &absent, beta, step, left,
    ) {
        Err(ProteusError::Solve(SolveError::NoPlanInTime(s))) => {
            no_plan_in_time = true;
            Ok((SolveReport { status: SolveStatus::TimeLimit, solve_seconds: s, ..SolveReport::none() }, None))
        }
        other => other,
    };
    if problem.objective == Objective::HardwareFirst {
        // Loki step 1: only each app's most accurate variant among those that fit
        // somewhere; minimise the devices used, at the ladder's first factor.
        let beta = problem.ladder.beta;
        // Among the variants the problem allows.
        let best: Vec<Option<f64>> = (0..problem.apps.len())
            .map(|q| {
                cands.iter().zip(&allowed).filter(|(c, ok)| **ok && c.q == q).map(|(c, _)| c.accuracy).reduce(f64::max)
            })
            .collect();
        let keep: Vec<bool> = cands
            .iter()
            .zip(&allowed)
            .map(|(c, ok)| *ok && best[c.q].is_some_and(|b| (c.accuracy - b).abs() < 1e-12))
            .collect();
        let left = deadline.saturating_duration_since(Instant::now()).as_secs_f64().max(1e-3);
        let (report, plan) = within(&keep, beta, left, Step::Hardware)?;
        attempts.push(Attempt {
            step: Step::Hardware,
            beta,
            status: report.status,
            solve_seconds: report.solve_seconds,
        });
        if plan.is_some() {
            let plan = name_shed(plan, &shed);
            return Ok(Solved { report, attempts, plan, shed, timed_out: false, origin: Origin::Milp });
        }
    }
    let allowed = undominated(&cands, &allowed);
    if problem.ladder.search == Search::Lexicographic {
        return lexicographic(problem, &cands, &allowed, &absent, shed, attempts, deadline);
    }
    let d = problem.ladder.search(deadline, |beta, left| within(&allowed, beta, left, Step::Accuracy))?;
    attempts.extend(d.tried.into_iter().map(|t| Attempt {
        step: Step::Accuracy,
        beta: t.beta,
        status: t.status,
        solve_seconds: t.solve_seconds,
    }));
    if d.plan.is_none() && (d.timed_out || no_plan_in_time) {
        return Err(ProteusError::NoPlanInTime { limit_s: problem.solver.time_limit_s, solves: attempts.len() });
    }
    let plan = name_shed(d.plan, &shed);
    Ok(Solved { report: d.report, attempts, plan, shed, timed_out: d.timed_out, origin: Origin::Milp })
}

/// The lexicographic search ([`Search::Lexicographic`]): first the highest step of
/// the ladder at which every app can be served (one MILP over placements with each
/// app's fastest variants only, [`highest_step`]), then the most accurate plan at
/// that step: the accuracy model with that placement's device counts per (type,
/// app) fixed (fast: it splits per type and app), then the full accuracy model
/// started from that plan, stopped at [`SolverSettings::soft_limit_s`] with the
/// best plan by then. Three solves where the ladder made up to 17, and none proves
/// a step infeasible by branch and bound: the first solve's bound does that for
/// every step above at once.
///
/// The first solve gets at most half the time left: when it cannot prove its step
/// the highest in that time, its incumbent's step is used (feasible, maybe not the
/// highest: [`Solved::timed_out`]), so the accuracy solves always have time.
#[allow(clippy::too_many_arguments)]
fn lexicographic(
    problem: &Problem,
    cands: &[Cand],
    allowed: &[bool],
    absent: &[bool],
    shed: Vec<ShedApp>,
    mut attempts: Vec<Attempt>,
    deadline: Instant,
) -> Result<Solved, ProteusError> {
    let steps = problem.ladder.steps();
    let left = || deadline.saturating_duration_since(Instant::now()).as_secs_f64();
    let in_time = |limit_s: f64, solves: usize| ProteusError::NoPlanInTime { limit_s, solves };
    let limit_s = problem.solver.time_limit_s;
    if steps.is_empty() {
        return Ok(Solved {
            report: SolveReport::none(),
            attempts,
            plan: None,
            shed,
            timed_out: false,
            origin: Origin::Milp,
        });
    }
    if left() < 1e-3 {
        return Err(in_time(limit_s, attempts.len()));
    }
    let (report, found) = match highest_step(problem, cands, allowed, absent, &steps, left() / 2.0) {
        Err(ProteusError::Solve(SolveError::NoPlanInTime(_))) => {
            return Err(in_time(limit_s, attempts.len() + 1));
        }
        other => other?,
    };
    let Some((k, start)) = found else {
        attempts.push(Attempt {
            step: Step::Demand,
            beta: steps[steps.len() - 1],
            status: report.status,
            solve_seconds: report.solve_seconds,
        });
        return Ok(Solved { report, attempts, plan: None, shed, timed_out: false, origin: Origin::Milp });
    };
    let beta = steps[k];
    // Not proven the highest: a step above may have had a plan.
    let timed_out = report.status == SolveStatus::TimeLimit && k > 0;
    attempts.push(Attempt { step: Step::Demand, beta, status: report.status, solve_seconds: report.solve_seconds });
    // The accuracy solve stops at the soft limit with HiGHS's best plan by then
    // (started from the placement above, it has one from the first node); only
    // with none does it go on to the deadline.
    let soft = problem.solver.soft_limit_s;
    // The soft limit bounds both accuracy solves and the local searches together.
    let soft_deadline = Instant::now() + Duration::from_secs_f64(soft.clamp(0.0, 1e7));
    let soft_left = || soft_deadline.saturating_duration_since(Instant::now()).as_secs_f64();
    // The local search after the full solve is kept this share of the soft limit.
    let reserve = if problem.ladder.local_search { (soft / 6.0).min(MAX_SEARCH_S) } else { 0.0 };
    // A better start first, where the placement is fixed: the same devices per
    // (type, app) as the first solve's, each with its most accurate mix of variants
    // (Sommelier's fixed placement, `Problem::pinned`) — a model that splits into one
    // small problem per (type, app) and is solved in a fraction of the full one's time.
    let mut first = None;
    if problem.pinned.is_none() && problem.formulation == Formulation::Aggregated {
        let mut pins = vec![vec![0u32; problem.apps.len()]; problem.devices.len()];
        for (c, n) in cands.iter().zip(&start.devices) {
            pins[c.t][c.q] += n.round() as u32;
        }
        let fixed = Problem { pinned: Some(pins), ..problem.clone() };
        let budget = if soft > 0.0 { (soft / 2.0).min(left()) } else { left() / 2.0 };
        if let Ok((r, Some(plan))) =
            solve_at_from(&fixed, cands, allowed, absent, beta, Step::Accuracy, budget.max(1e-3), Some(&start))
        {
            attempts.push(Attempt { step: Step::Accuracy, beta, status: r.status, solve_seconds: r.solve_seconds });
            first = Some((r, plan));
        }
    }
    // Then the local search (`placement`) from that plan, or from the first solve's
    // placement: the pinned plan keeps the first solve's split of devices between
    // apps, which ignores accuracy; moving devices between apps is what it lacks. Its
    // plan starts the full solve and is the answer if that finds none in time.
    let scorer = Scorer::new(problem, cands, allowed, absent, beta);
    let mut fallback: Option<(SolveReport, Plan)> = None;
    if problem.pinned.is_none() && problem.ladder.local_search {
        let mut n = match &first {
            Some((_, plan)) => scorer.counts(plan),
            None => start.devices.iter().map(|d| d.round() as u32).collect(),
        };
        if scorer.objective(&n).is_some() {
            let by = Instant::now() + Duration::from_secs_f64(MAX_SEARCH_S.min((soft_left() - reserve).max(0.0)));
            // Without a soft limit (the simulator) the search runs to its local
            // optimum: a wall-clock stop would make results depend on the load.
            scorer.improve(&mut n, (soft > 0.0).then_some(by));
            if let Some(plan) = scorer.plan(&n) {
                let report = first.as_ref().map_or_else(SolveReport::none, |(r, _)| r.clone());
                fallback = Some((SolveReport { status: SolveStatus::TimeLimit, ..report }, plan));
            }
        }
    }
    if fallback.is_none() {
        fallback = first.map(|(r, mut plan)| {
            if problem.pinned.is_none() {
                plan.free_unloaded();
            }
            (r, plan)
        });
    }
    let start = fallback.as_ref().map_or(start, |(_, plan)| start_of(problem, cands, plan));
    let budget = if soft > 0.0 { (soft_left() - reserve).max(1e-3).min(left()) } else { left() };
    let mut solved =
        solve_at_from(problem, cands, allowed, absent, beta, Step::Accuracy, budget.max(1e-3), Some(&start));
    if matches!(solved, Err(ProteusError::Solve(SolveError::NoPlanInTime(_)))) && left() > 1e-3 && fallback.is_none() {
        solved = solve_at_from(problem, cands, allowed, absent, beta, Step::Accuracy, left(), Some(&start));
    }
    let (report, plan) = match (solved, fallback.clone()) {
        (Err(ProteusError::Solve(SolveError::NoPlanInTime(_))), Some((report, mut plan))) => {
            plan.free_unloaded();
            let plan = name_shed(Some(plan), &shed);
            return Ok(Solved { report, attempts, plan, shed, timed_out: true, origin: Origin::Milp });
        }
        (Err(ProteusError::Solve(SolveError::NoPlanInTime(_))), None) => {
            return Err(in_time(limit_s, attempts.len() + 1));
        }
        (other, _) => other?,
    };
    attempts.push(Attempt { step: Step::Accuracy, beta, status: report.status, solve_seconds: report.solve_seconds });
    let mut plan = plan;
    if problem.pinned.is_none() && problem.ladder.local_search {
        if let Some(p) = plan.as_mut() {
            // The full solve stopped at the soft limit: single and paired device moves
            // from its plan, then the better of it and the start's.
            let mut n = scorer.counts(p);
            if scorer.objective(&n).is_some() {
                let by = soft_left().max(0.005).min(reserve.max(0.005));
                scorer.improve(&mut n, (soft > 0.0).then(|| Instant::now() + Duration::from_secs_f64(by)));
                if let Some(q) = scorer.plan(&n) {
                    if accuracy_objective(&q) > accuracy_objective(p) {
                        *p = q;
                    }
                }
            }
            if let Some((_, f)) = &fallback {
                if accuracy_objective(f) > accuracy_objective(p) {
                    *p = f.clone();
                }
            }
        }
    }
    // The report's objective is the plan's (the local search may have raised it);
    // its gap stays what HiGHS reached, an upper bound on the plan's.
    let mut report = report;
    if let (Some(p), Some(o)) = (&plan, report.objective) {
        report.objective = Some(o.max(accuracy_objective(p)));
    }
    let mut plan = name_shed(plan, &shed);
    if problem.pinned.is_none() {
        // A fixed placement keeps its devices, loaded or not.
        plan.iter_mut().for_each(Plan::free_unloaded);
    }
    Ok(Solved { report, attempts, plan, shed, timed_out, origin: Origin::Milp })
}

/// The longest a local search of the lexicographic search runs, s (each of the two).
/// A round of paired moves at 4× the paper's demand takes ~10 ms; from the pinned
/// plan the search converges in 50–90 ms there.
const MAX_SEARCH_S: f64 = 0.1;

/// A plan as a [`Start`]: its devices and capacity needed per candidate.
fn start_of(problem: &Problem, cands: &[Cand], plan: &Plan) -> Start {
    let mut start = Start { devices: vec![0.0; cands.len()], load: vec![0.0; cands.len()] };
    for r in &plan.routes {
        let i = cands.iter().position(|c| {
            problem.apps[c.q].name == r.app && c.model == r.model && problem.devices[c.t].name == r.device_type
        });
        if let Some(i) = i {
            start.devices[i] = r.devices as f64;
            start.load[i] = r.qps * plan.beta.max(1.0);
        }
    }
    start
}

/// A placement that serves every app at one step: devices per candidate, and the
/// capacity each candidate must have for its share (requests/s, headroom included).
struct Start {
    devices: Vec<f64>,
    load: Vec<f64>,
}

/// The first solve of [`lexicographic`]: the highest step β_k of `steps` at which
/// every app q can be served β_k·s_q (with headroom β_k ≥ 1 above 1), over
/// placements only. Feasibility at a step is that of the accuracy model there:
/// n(c) ∈ ℕ devices with Σ_m n(t,m) ≤ count(t), and a load w(c) ≥ 0 with
/// Σ_{c∈q} w(c) = β_k and s_q·w(c) ≤ P(c)·n(c) (w is β·r, the share with its
/// headroom). One binary z_k per step, Σ z_k = 1, and β_k = Σ_k β_k·z_k; the
/// objective, Σ_k k·z_k to minimise, has integer coefficients, so HiGHS's bound
/// proves every step above the answer infeasible together, with no solve of its
/// own. Returns the step's index and the placement, or None when no step has one.
fn highest_step(
    problem: &Problem,
    cands: &[Cand],
    keep: &[bool],
    absent: &[bool],
    steps: &[f64],
    time_limit_s: f64,
) -> Result<(SolveReport, Option<(usize, Start)>), ProteusError> {
    // The step is an integer: no gap, it is proven or the time is up.
    let settings = SolverSettings { time_limit_s, mip_gap: 0.0, ..problem.solver.clone() };
    let mut m = Milp::default();
    let demand: Vec<f64> =
        problem.apps.iter().zip(absent).map(|(a, &gone)| if gone { 0.0 } else { a.demand_qps }).collect();
    let top = steps.iter().copied().fold(0.0, f64::max);
    // Whether a step has a plan depends only on capacity: a plan that serves it with
    // any variant on n devices of a type serves it with the app's fastest variant
    // there, on the same devices. So only the fastest of each (type, app) is a
    // column here: one integer per (type, app) instead of one per (type, variant).
    let fastest: Vec<bool> = cands
        .iter()
        .enumerate()
        .map(|(i, c)| {
            keep[i]
                && !cands.iter().enumerate().any(|(j, d)| {
                    keep[j] && d.t == c.t && d.q == c.q && (d.cap.qps > c.cap.qps || (d.cap.qps == c.cap.qps && j < i))
                })
        })
        .collect();
    let mut n: Vec<Option<Variable>> = Vec::with_capacity(cands.len());
    let mut w: Vec<Option<Variable>> = Vec::with_capacity(cands.len());
    for (i, c) in cands.iter().enumerate() {
        if fastest[i] && problem.devices[c.t].count > 0 {
            n.push(Some(m.add(variable().integer().min(0).max(problem.devices[c.t].count as f64))));
            w.push(Some(m.add(variable().min(0).max(top))));
        } else {
            n.push(None);
            w.push(None);
        }
    }
    let z: Vec<Variable> = steps.iter().map(|_| m.add(variable().binary())).collect();
    let one: Expression = z.iter().copied().sum();
    m.constrain(constraint!(one == 1));
    device_counts(&mut m, problem, cands, &n);
    for (q, &s) in demand.iter().enumerate() {
        let e: Expression = cands.iter().zip(&w).filter(|(c, _)| c.q == q).filter_map(|(_, v)| *v).sum();
        if s > 0.0 {
            let beta: Expression = steps.iter().zip(&z).map(|(&b, &zk)| b * zk).sum();
            m.constrain(constraint!(e == beta));
        } else {
            m.constrain(constraint!(e == 0));
        }
    }
    for (i, c) in cands.iter().enumerate() {
        if let (Some(nv), Some(wv)) = (n[i], w[i]) {
            m.constrain(constraint!(demand[c.q] * wv <= c.cap.qps * nv));
        }
    }
    // Second, every device placed (weight below one step in all): the accuracy
    // solve's first start keeps these devices per (type, app), and a device left idle
    // here would stay idle there. Placing a device is always possible (with no load),
    // so this costs the bound nothing.
    let devices: f64 = problem.devices.iter().map(|d| f64::from(d.count)).sum();
    let eps = 0.5 / (devices + 1.0);
    let objective: Expression = z.iter().enumerate().map(|(k, &zk)| (k as f64) * zk).sum::<Expression>()
        - n.iter().flatten().map(|&v| eps * v).sum::<Expression>();
    let (report, values) = m.solve(Sense::Minimise, objective, &settings)?;
    let Some(values) = values else { return Ok((report, None)) };
    let k = z.iter().position(|&zk| values.is_set(zk)).unwrap_or(steps.len() - 1);
    let start = Start {
        devices: n.iter().map(|v| v.map_or(0.0, |v| values.value(v).round())).collect(),
        load: cands.iter().zip(&w).map(|(c, v)| v.map_or(0.0, |v| values.value(v).max(0.0) * demand[c.q])).collect(),
    };
    Ok((report, Some((k, start))))
}

/// Names in the plan the apps planned as absent, with why.
fn name_shed(mut plan: Option<Plan>, shed: &[ShedApp]) -> Option<Plan> {
    for a in plan.iter_mut().flat_map(|p| p.apps.iter_mut()) {
        a.unservable = shed.iter().find(|s| s.app == a.name).map(|s| s.reason.clone());
    }
    plan
}

/// `allowed` without the candidates another allowed one dominates: a variant of the
/// same app on the same device type at least as accurate and at least as fast
/// (capacity P), one of them strictly (or the earlier of two equal ones). Any plan
/// that hosts the dominated one can host the other on the same devices instead:
/// the same routing fits (P is no lower) and accuracy is no lower. So the optimum
/// is unchanged, and the accuracy model has fewer columns.
pub(crate) fn undominated(cands: &[Cand], allowed: &[bool]) -> Vec<bool> {
    let beats = |(j, d): (usize, &Cand), (i, c): (usize, &Cand)| {
        d.t == c.t
            && d.q == c.q
            && d.accuracy >= c.accuracy
            && d.cap.qps >= c.cap.qps
            && (d.accuracy > c.accuracy || d.cap.qps > c.cap.qps || j < i)
    };
    cands
        .iter()
        .enumerate()
        .map(|(i, c)| {
            allowed[i] && !cands.iter().enumerate().any(|(j, d)| j != i && allowed[j] && beats((j, d), (i, c)))
        })
        .collect()
}

/// Which candidates [`Problem::variants`] allows: all, or per app only those of its
/// most (least) accurate variant among the ones that fit some device type.
pub(crate) fn allowed_variants(problem: &Problem, cands: &[Cand]) -> Vec<bool> {
    let pick = |q: usize| {
        let accs = cands.iter().filter(|c| c.q == q).map(|c| c.accuracy);
        match problem.variants {
            Variants::All => None,
            Variants::MostAccurate => accs.reduce(f64::max),
            Variants::LeastAccurate => accs.reduce(f64::min),
        }
    };
    let picked: Vec<Option<f64>> = (0..problem.apps.len()).map(pick).collect();
    cands.iter().map(|c| picked[c.q].is_none_or(|a| (c.accuracy - a).abs() < 1e-12)).collect()
}

/// One solve at factor `beta` over the candidates marked in `keep`, within
/// `time_limit_s`; the apps marked `absent` are served nothing.
fn solve_at(
    problem: &Problem,
    cands: &[Cand],
    keep: &[bool],
    absent: &[bool],
    beta: f64,
    step: Step,
    time_limit_s: f64,
) -> Result<(SolveReport, Option<Plan>), ProteusError> {
    solve_at_from(problem, cands, keep, absent, beta, step, time_limit_s, None)
}

/// [`solve_at`] from a starting placement (the aggregated formulation uses it).
#[allow(clippy::too_many_arguments)]
fn solve_at_from(
    problem: &Problem,
    cands: &[Cand],
    keep: &[bool],
    absent: &[bool],
    beta: f64,
    step: Step,
    time_limit_s: f64,
    start: Option<&Start>,
) -> Result<(SolveReport, Option<Plan>), ProteusError> {
    let settings = SolverSettings { time_limit_s, ..problem.solver.clone() };
    let at = At {
        problem,
        settings: &settings,
        cands,
        keep,
        beta,
        // Headroom above 1; below it, every app is served at β.
        headroom: beta.max(1.0),
        served: problem
            .apps
            .iter()
            .zip(absent)
            .map(|(a, &gone)| if gone { 0.0 } else { a.demand_qps * beta.min(1.0) })
            .collect(),
        demand: problem.apps.iter().zip(absent).map(|(a, &gone)| if gone { 0.0 } else { a.demand_qps }).collect(),
        total: problem.apps.iter().map(|a| a.demand_qps).sum(),
        step,
        start,
    };
    match problem.formulation {
        Formulation::Aggregated => aggregated(&at),
        Formulation::PerDevice => per_device(&at),
    }
}

/// One solve's inputs.
struct At<'a> {
    problem: &'a Problem,
    /// The solver settings of this solve (its time limit: what is left).
    settings: &'a SolverSettings,
    cands: &'a [Cand],
    /// Which candidates may be used.
    keep: &'a [bool],
    beta: f64,
    /// Capacity must exceed routed demand by this factor.
    headroom: f64,
    /// Served demand per app (below β = 1, the least each app is served).
    served: Vec<f64>,
    /// Demand per app (0 for an app planned as absent).
    demand: Vec<f64>,
    /// Total demand (the objective's denominator).
    total: f64,
    step: Step,
    /// A placement to start from.
    start: Option<&'a Start>,
}

/// Every app's served demand is routed (Eqs. 2 and 6): its shares sum to 1 (to 0
/// for an app with no demand).
fn route_all(m: &mut Milp, served: &[f64], shares: impl Fn(usize) -> Expression) {
    for (q, s) in served.iter().enumerate() {
        let e = shares(q);
        let all = if *s > 0.0 { 1.0 } else { 0.0 };
        m.constrain(constraint!(e == all));
    }
}

/// Per-app shedding below β = 1, as both formulations model it (Proteus §4, Eq. 7
/// with a served fraction): at the accuracy step below β = 1 app q is served a
/// fraction ρ(q) ∈ [β, 1] of its whole demand, as much as capacity allows, and its
/// shares sum to ρ(q); otherwise every app's served demand is routed whole
/// ([`route_all`]).
struct Shedding<'a> {
    /// Whether demand is shed per app in this solve.
    partial: bool,
    /// The demand the shares are of: the whole demand when shedding, else the
    /// served demand.
    served: &'a [f64],
    /// ρ(q) per app with demand, when shedding.
    rho: Vec<Option<Variable>>,
}

impl<'a> Shedding<'a> {
    fn new(at: &'a At, m: &mut Milp) -> Shedding<'a> {
        let partial = at.beta < 1.0 && at.step == Step::Accuracy;
        let served: &[f64] = if partial { &at.demand } else { &at.served };
        let rho = served.iter().map(|&s| (partial && s > 0.0).then(|| m.add(variable().min(at.beta).max(1)))).collect();
        Shedding { partial, served, rho }
    }

    /// Constrains each app's shares (`shares(q)`): to ρ(q) when shedding (to 0 for an
    /// app with no demand), else routed whole.
    fn constrain_shares(&self, m: &mut Milp, shares: impl Fn(usize) -> Expression) {
        if !self.partial {
            return route_all(m, self.served, shares);
        }
        for (q, p) in self.rho.iter().enumerate() {
            let e = shares(q);
            match p {
                Some(p) => m.constrain(constraint!(e == *p)),
                None => m.constrain(constraint!(e == 0)),
            }
        }
    }

    /// The plan of a solved model from its `routes` (candidate, devices, share of the
    /// demand the shares are of): when shedding, each app's served demand is what its
    /// shares add up to, and the shares become fractions of it.
    fn plan(&self, at: &At, values: &crate::solver::Values, routes: Vec<(usize, u32, f64)>) -> Plan {
        let (problem, cands, beta, step) = (at.problem, at.cands, at.beta, at.step);
        if !self.partial {
            return make_plan(problem, cands, &routes, beta, self.served, step);
        }
        let fraction: Vec<f64> = self.rho.iter().map(|p| p.map_or(0.0, |p| values.value(p).clamp(beta, 1.0))).collect();
        let served: Vec<f64> = self.served.iter().zip(&fraction).map(|(s, f)| s * f).collect();
        let routes: Vec<(usize, u32, f64)> = routes
            .into_iter()
            .map(|(i, n, share)| (i, n, if fraction[cands[i].q] > 0.0 { share / fraction[cands[i].q] } else { 0.0 }))
            .collect();
        make_plan(problem, cands, &routes, beta, &served, step)
    }
}

/// The device constraints both aggregated models share, over `n`, the devices of
/// each candidate's type hosting its variant (None: not offered): Σ_m n(t,m) ≤
/// count(t), a device hosts at most one variant (Eq. 1); with a fixed placement,
/// exactly `pinned[t][q]` devices of type t serve app q.
fn device_counts(m: &mut Milp, problem: &Problem, cands: &[Cand], n: &[Option<Variable>]) {
    for (t, dev) in problem.devices.iter().enumerate() {
        let e: Expression = cands.iter().zip(n).filter(|(c, _)| c.t == t).filter_map(|(_, v)| *v).sum();
        m.constrain(constraint!(e <= dev.count as f64));
    }
    if let Some(pins) = &problem.pinned {
        for (t, row) in pins.iter().enumerate() {
            for (q, &k) in row.iter().enumerate() {
                let e: Expression =
                    cands.iter().zip(n).filter(|(c, _)| c.t == t && c.q == q).filter_map(|(_, v)| *v).sum();
                m.constrain(constraint!(e == k as f64));
            }
        }
    }
}

fn aggregated(at: &At) -> Result<(SolveReport, Option<Plan>), ProteusError> {
    let At { problem, cands, keep, beta, headroom, total, step, .. } = *at;
    // Below β = 1, demand is shed per app ([`Shedding`]): the objective, accuracy
    // over total demand (Proteus §4, Eq. 7), counts shed requests as 0, so an app is
    // served more wherever a device has room. β is the floor the ladder found,
    // every app's share of the surge; the shares r below are then of the whole
    // demand s_q, and sum to ρ(q).
    let mut m = Milp::default();
    let shedding = Shedding::new(at, &mut m);
    let served = shedding.served;
    // n(c): devices of the candidate's type hosting its variant; r(c): share of its
    // app's demand routed to them.
    let mut n: Vec<Option<Variable>> = Vec::with_capacity(cands.len());
    let mut r: Vec<Option<Variable>> = Vec::with_capacity(cands.len());
    for (i, c) in cands.iter().enumerate() {
        if keep[i] && problem.devices[c.t].count > 0 {
            n.push(Some(m.add(variable().integer().min(0).max(problem.devices[c.t].count as f64))));
            r.push(Some(m.add(variable().min(0).max(1))));
        } else {
            n.push(None);
            r.push(None);
        }
    }
    device_counts(&mut m, problem, cands, &n);
    let shares =
        |q: usize| -> Expression { cands.iter().zip(&r).filter(|(c, _)| c.q == q).filter_map(|(_, v)| *v).sum() };
    shedding.constrain_shares(&mut m, shares);
    // Capacity with headroom (Eqs. 4-5): β·s·r ≤ P·n.
    for (i, c) in cands.iter().enumerate() {
        if let (Some(nv), Some(rv)) = (n[i], r[i]) {
            let s = served[c.q];
            m.constrain(constraint!(headroom * s * rv <= c.cap.qps * nv));
        }
    }
    if let Some(start) = at.start {
        for (i, c) in cands.iter().enumerate() {
            if let (Some(nv), Some(rv)) = (n[i], r[i]) {
                m.start(nv, start.devices[i]);
                let s = served[c.q];
                if s > 0.0 {
                    m.start(rv, start.load[i] / (headroom * s));
                }
            }
        }
        for (q, p) in shedding.rho.iter().enumerate() {
            if let Some(p) = p {
                let routed: f64 = cands.iter().zip(&start.load).filter(|(c, _)| c.q == q).map(|(_, l)| l).sum();
                m.start(*p, (routed / served[q].max(1e-12)).clamp(beta, 1.0));
            }
        }
    }
    let (sense, objective): (Sense, Expression) = match step {
        Step::Hardware => (Sense::Minimise, n.iter().filter_map(|v| *v).sum()),
        Step::Accuracy | Step::Heuristic | Step::Demand => (
            Sense::Maximise,
            cands
                .iter()
                .zip(&r)
                .filter_map(|(c, v)| v.map(|v| (served[c.q] * c.accuracy / total.max(1e-12)) * v))
                .sum(),
        ),
    };
    let (report, values) = m.solve(sense, objective, at.settings)?;
    let Some(values) = values else { return Ok((report, None)) };
    let routes: Vec<(usize, u32, f64)> = cands
        .iter()
        .enumerate()
        .filter_map(|(i, _)| {
            let (nv, rv) = (n[i]?, r[i]?);
            let devices = values.value(nv).round() as u32;
            let share = values.value(rv).max(0.0);
            (devices > 0 || share > 1e-9).then_some((i, devices, share))
        })
        .collect();
    Ok((report, Some(shedding.plan(at, &values, routes))))
}

fn per_device(at: &At) -> Result<(SolveReport, Option<Plan>), ProteusError> {
    let At { problem, cands, keep, headroom, total, step, .. } = *at;
    // Below β = 1, demand is shed per app, as in the aggregated model ([`Shedding`]):
    // Σ_d y(d,q) = ρ(q), and y is a share of the whole demand.
    let mut m = Milp::default();
    let shedding = Shedding::new(at, &mut m);
    let served = shedding.served;
    // Devices: (type, index within type).
    let devices: Vec<usize> =
        problem.devices.iter().enumerate().flat_map(|(t, d)| std::iter::repeat_n(t, d.count as usize)).collect();
    let apps = problem.apps.len();
    // y(d,q) ∈ [0,1] for every device and app.
    let y: Vec<Vec<Variable>> =
        devices.iter().map(|_| (0..apps).map(|_| m.add(variable().min(0).max(1))).collect()).collect();
    // x(d,c) binary and u(d,c) = x(d,c)·y(d,q(c)) for the candidates of the device's type.
    let mut x: Vec<Vec<(usize, Variable, Variable)>> = Vec::with_capacity(devices.len());
    // Fixed placement: the first pinned[t][0] devices of type t serve app 0, the
    // next pinned[t][1] app 1, and so on; the rest stay idle (the reference's
    // `add_spec_acc_constraints` forbids the other families' variants the same way).
    let pinned_app: Vec<Option<Option<usize>>> = devices
        .iter()
        .enumerate()
        .map(|(d, &t)| {
            let pins = problem.pinned.as_ref()?;
            let k = d - devices.iter().position(|&x| x == t).unwrap_or(0);
            let mut start = 0usize;
            for (q, &n) in pins.get(t).map(|r| &r[..]).unwrap_or(&[]).iter().enumerate() {
                if k < start + n as usize {
                    return Some(Some(q));
                }
                start += n as usize;
            }
            Some(None)
        })
        .collect();
    for (d, &t) in devices.iter().enumerate() {
        let mut row = Vec::new();
        for (i, c) in cands.iter().enumerate() {
            let pinned_ok = match pinned_app[d] {
                None => true,
                Some(app) => app == Some(c.q),
            };
            if c.t == t && keep[i] && pinned_ok {
                let xv = m.add(variable().binary());
                let uv = m.add(variable().min(0).max(1));
                row.push((i, xv, uv));
            }
        }
        x.push(row);
    }
    for (d, row) in x.iter().enumerate() {
        // Eq. 1: at most one variant per device (exactly one on a pinned device).
        let e: Expression = row.iter().map(|(_, xv, _)| *xv).sum();
        if matches!(pinned_app[d], Some(Some(_))) {
            m.constrain(constraint!(e == 1));
        } else {
            m.constrain(constraint!(e <= 1));
        }
        for &(i, xv, uv) in row {
            let yv = y[d][cands[i].q];
            // u = x·y, exactly: x binary, y ∈ [0,1].
            m.constrain(constraint!(uv <= xv));
            m.constrain(constraint!(uv <= yv));
            m.constrain(constraint!(uv >= yv - 1 + xv));
        }
        // Eq. 3: an app's share goes only to a device hosting one of its variants.
        for (q, yv) in y[d].iter().enumerate() {
            let e: Expression = row.iter().filter(|(i, _, _)| cands[*i].q == q).map(|(_, _, uv)| *uv).sum();
            m.constrain(constraint!(e == *yv));
        }
        // Eqs. 4-5 with headroom: β·Σ_q s_q·y(d,q) ≤ Σ_m P(d,m)·x(d,m).
        let load: Expression = y[d].iter().enumerate().map(|(q, yv)| headroom * served[q] * *yv).sum();
        let cap: Expression = row.iter().map(|&(i, xv, _)| cands[i].cap.qps * xv).sum();
        m.constrain(constraint!(load <= cap));
    }
    shedding.constrain_shares(&mut m, |q| y.iter().map(|row| row[q]).sum());
    let (sense, objective): (Sense, Expression) = match step {
        Step::Hardware => (Sense::Minimise, x.iter().flatten().map(|(_, xv, _)| *xv).sum()),
        // Eq. 7: Σ_q a_q with a_q = Σ_m A_m Σ_d x(d,m)·y(d,q)·s_q, over total demand.
        Step::Accuracy | Step::Heuristic | Step::Demand => (
            Sense::Maximise,
            x.iter()
                .flatten()
                .map(|&(i, _, uv)| (served[cands[i].q] * cands[i].accuracy / total.max(1e-12)) * uv)
                .sum(),
        ),
    };
    let (report, values) = m.solve(sense, objective, at.settings)?;
    let Some(values) = values else { return Ok((report, None)) };
    // Sum the devices back into routes (the per-device detail is rebuilt evenly).
    let mut routes: BTreeMap<usize, (u32, f64)> = BTreeMap::new();
    for (d, row) in x.iter().enumerate() {
        for &(i, xv, _) in row {
            if values.is_set(xv) {
                let e = routes.entry(i).or_default();
                e.0 += 1;
                e.1 += values.value(y[d][cands[i].q]).max(0.0);
            }
        }
    }
    let routes: Vec<(usize, u32, f64)> = routes.into_iter().map(|(i, (n, s))| (i, n, s)).collect();
    Ok((report, Some(shedding.plan(at, &values, routes))))
}

/// Builds the plan from (candidate, devices, share) triples.
pub(crate) fn make_plan(
    problem: &Problem,
    cands: &[Cand],
    routes: &[(usize, u32, f64)],
    beta: f64,
    served: &[f64],
    step: Step,
) -> Plan {
    let mut out_routes = Vec::new();
    let mut next_free: Vec<u32> = vec![0; problem.devices.len()];
    let mut devices: Vec<DevicePlan> = problem
        .devices
        .iter()
        .flat_map(|d| {
            (0..d.count).map(move |k| DevicePlan {
                device: format!("{}-{k}", d.name),
                device_type: d.name.clone(),
                app: None,
                model: None,
                share: 0.0,
                service_us: None,
            })
        })
        .collect();
    let offsets: Vec<usize> = problem
        .devices
        .iter()
        .scan(0usize, |acc, d| {
            let o = *acc;
            *acc += d.count as usize;
            Some(o)
        })
        .collect();
    for &(i, n, share) in routes {
        let c = &cands[i];
        let app = &problem.apps[c.q];
        out_routes.push(Route {
            app: app.name.clone(),
            model: c.model.clone(),
            accuracy: c.accuracy,
            device_type: problem.devices[c.t].name.clone(),
            devices: n,
            share,
            qps: share * served[c.q],
            capacity_qps: c.cap.qps * n as f64,
            batch: c.cap.batch,
        });
        for _ in 0..n {
            let k = next_free[c.t];
            next_free[c.t] += 1;
            let d = &mut devices[offsets[c.t] + k as usize];
            d.app = Some(app.name.clone());
            d.model = Some(c.model.clone());
            d.share = share / n as f64;
        }
    }
    let apps: Vec<AppPlan> = problem
        .apps
        .iter()
        .enumerate()
        .map(|(q, a)| AppPlan {
            name: a.name.clone(),
            demand_qps: a.demand_qps,
            served_qps: served[q],
            shed_qps: a.demand_qps - served[q],
            accuracy: 0.0,
            unservable: None,
        })
        .collect();
    let mut plan = Plan {
        step,
        beta,
        effective_accuracy: 0.0,
        devices_used: out_routes.iter().map(|r| r.devices).sum(),
        apps,
        routes: out_routes,
        devices,
    };
    plan.summarise_accuracy();
    plan
}

/// The plan's values for a brute-force check: every app's served accuracy mass
/// over total demand (the MILP's accuracy objective).
pub fn accuracy_objective(plan: &Plan) -> f64 {
    let total: f64 = plan.apps.iter().map(|a| a.demand_qps).sum();
    plan.apps.iter().map(|a| a.accuracy * a.served_qps).sum::<f64>() / total.max(1e-12)
}

/// The devices of all types together: at most 10,000, or 1,000 per-device.
pub(crate) fn check_total(total: u32, formulation: Formulation) -> Result<(), RangeError> {
    let (max, per_device) = match formulation {
        Formulation::Aggregated => (crate::limits::MAX_DEVICES, false),
        Formulation::PerDevice => (crate::limits::MAX_PER_DEVICE_DEVICES, true),
    };
    if total > max {
        return Err(RangeError::TotalDevices { total, max, per_device });
    }
    Ok(())
}

/// `[ladder]`: 0 ≤ min_beta < beta ≤ 10, 0 < step ≤ 1.
pub(crate) fn check_ladder(l: &Ladder) -> Result<(), RangeError> {
    if !(crate::limits::positive_within(l.beta, crate::limits::MAX_BETA)
        && crate::limits::positive_within(l.step, 1.0)
        && crate::limits::within(l.min_beta, l.beta))
    {
        return Err(RangeError::Ladder);
    }
    if l.beta <= l.min_beta {
        return Err(RangeError::LadderOrder);
    }
    Ok(())
}
