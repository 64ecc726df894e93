//! What a config's `[allocator]` runs: Proteus's MILP, or one of the baselines and
//! ablations of Proteus's evaluation (ASPLOS'24 §6.1.1, §6.5) built around the same
//! problem — so the live host and the simulator plan the same way for every one of
//! them.
//!
//! | system | method | replan | placement | variants | routing |
//! |---|---|---|---|---|---|
//! | Proteus | milp | periodic | dynamic | all | plan |
//! | Clipper-HA / -HT | milp | never | — | most- / least-accurate | plan |
//! | Sommelier (= Proteus w/o model placement) | milp | periodic | fixed | all | plan |
//! | Proteus w/o model selection | milp | periodic | dynamic | most-accurate | plan |
//! | Proteus w/o query assignment | milp | periodic | dynamic | all | uniform |
//! | INFaaS-Accuracy | infaas-accuracy | periodic | dynamic | all | (by capacity) |
//!
//! Proteus without adaptive batching is a config of the apps and the allocator's
//! batch sizes (`max_batch = 1`, `batch_sizes = [1]`), not a planner setting.

use std::time::Instant;

use crate::config::{AllocatorConfig, DeviceMobility, Method, Replan, Spare, SplitBy};
use crate::cores::{self, CoreMethod, CoreModel};
use crate::proteus::{self, Plan};
use crate::{infaas, Allocation, Allocator, AnyPlan, AnyProblem};

/// Makes plans the way a config says, remembering the plan in force (the fallback
/// when a solve fails) and, for a fixed placement, the first plan's placement.
pub struct Planner {
    allocator: Allocator,
    config: AllocatorConfig,
    pins: Option<Vec<Vec<u32>>>,
    /// The core methods' capacity table, loaded at the first plan.
    cores: Option<CoreModel>,
    /// Decisions skipped in a row while the forecast stayed within the plan's load.
    stable: u32,
}

impl Planner {
    /// A planner with no plan yet.
    pub fn new(config: &AllocatorConfig) -> Planner {
        Planner { allocator: Allocator::default(), config: config.clone(), pins: None, cores: None, stable: 0 }
    }

    /// Whether the control loop re-plans at all (not for a static plan).
    pub fn replans(&self) -> bool {
        self.config.replan == Replan::Periodic
    }

    /// The plan in force.
    pub fn current(&self) -> Option<&Plan> {
        match self.allocator.current() {
            Some(AnyPlan::Proteus(p)) => Some(p),
            _ => None,
        }
    }

    /// Puts `plan` back in force (a new plan that could not be applied).
    pub fn restore(&mut self, plan: Plan) {
        self.allocator = Allocator::with_plan(Some(AnyPlan::Proteus(plan)));
    }

    /// Plans for `problem` (its demand, devices and apps; the config's variants,
    /// pins and method apply). A plan that cannot be made leaves the last in force.
    pub fn plan(&mut self, mut problem: proteus::Problem) -> Allocation {
        problem.variants = self.config.variants;
        if self.config.method.is_cores() {
            return self.plan_cores(&problem);
        }
        let mut allocation = match self.config.method {
            Method::Milp => {
                if self.config.placement == DeviceMobility::Fixed {
                    problem.pinned = self.pins.clone();
                }
                self.allocator.allocate(&AnyProblem::Proteus(problem.clone()))
            }
            Method::Infadapter | Method::ModelSwitchingPlus | Method::Vpa => unreachable!("planned above"),
            Method::InfaasAccuracy => {
                let started = Instant::now();
                match infaas::step(&problem, self.current(), &self.config.infaas) {
                    Ok(plan) => {
                        let secs = started.elapsed().as_secs_f64();
                        self.allocator.adopt(AnyPlan::Proteus(plan), "heuristic", secs)
                    }
                    Err(e) => self.allocator.fail(e.to_string()),
                }
            }
        };
        if let (true, Some(AnyPlan::Proteus(plan))) = (allocation.is_new_plan(), allocation.plan.as_mut()) {
            let replicate = self.config.spare == Spare::Replicate && self.config.method == Method::Milp;
            if replicate || self.config.routing == SplitBy::Uniform {
                if replicate {
                    plan.replicate_into_idle();
                }
                if self.config.routing == SplitBy::Uniform {
                    plan.route_uniformly();
                }
                let (status, secs) = (allocation.status.clone(), allocation.solve_seconds);
                let adopted = self.allocator.adopt(AnyPlan::Proteus(plan.clone()), &status, secs);
                allocation.plan = adopted.plan;
            }
            if self.config.placement == DeviceMobility::Fixed && self.pins.is_none() {
                if let Some(AnyPlan::Proteus(plan)) = &allocation.plan {
                    self.pins = Some(fixed_placement(plan, &problem));
                }
            }
        }
        allocation
    }
}

impl Planner {
    /// InfAdapter, Model-Switching+ or the VPA-like rule on the core devices. The
    /// ILP methods keep the plan in force for up to `stabilization` decisions while
    /// the forecast stays at or below the load it was made for (the reference's
    /// stabilisation, which delays scaling down).
    fn plan_cores(&mut self, problem: &proteus::Problem) -> Allocation {
        let settings = &self.config.cores;
        if self.cores.is_none() {
            match CoreModel::load(settings) {
                Ok(m) => self.cores = Some(m),
                Err(e) => return self.allocator.fail(e),
            }
        }
        let model = self.cores.as_ref().expect("loaded above");
        let method = match self.config.method {
            Method::Infadapter => CoreMethod::InfAdapter,
            Method::ModelSwitchingPlus => CoreMethod::ModelSwitchingPlus,
            _ => CoreMethod::Vpa,
        };
        let current = self.current().cloned();
        if let (Some(plan), false) = (&current, method == CoreMethod::Vpa) {
            let planned: f64 = plan.apps.iter().map(|a| a.demand_qps).sum();
            let wanted: f64 = problem.apps.iter().map(|a| a.demand_qps).sum();
            if wanted <= planned && self.stable < settings.stabilization {
                self.stable += 1;
                return self.allocator.keep("stabilized");
            }
        }
        self.stable = 0;
        let started = Instant::now();
        match cores::plan(method, problem, settings, model, current.as_ref()) {
            Ok((Some(outcome), plan)) => {
                let solves_s = outcome.attempts.iter().map(|a| a.solve_seconds).sum();
                let secs = outcome.origin.seconds(solves_s, outcome.report.solve_seconds);
                let solves = outcome.attempts.len();
                self.allocator.solved_by(outcome.report, solves, secs, plan.map(AnyPlan::Proteus), outcome.origin)
            }
            Ok((None, Some(plan))) => {
                self.allocator.adopt(AnyPlan::Proteus(plan), "heuristic", started.elapsed().as_secs_f64())
            }
            Ok((None, None)) => self.allocator.fail("no plan"),
            Err(e) => self.allocator.fail(e),
        }
    }
}

/// The placement a fixed-placement planner keeps: the first plan's, with every device
/// it left idle given to an app (the reference makes every device host a variant):
/// one at a time, to the app whose routes on that device type are the most loaded
/// for their capacity, so the fixed cluster has room where demand was.
fn fixed_placement(plan: &Plan, problem: &proteus::Problem) -> Vec<Vec<u32>> {
    let mut pins = plan.pins(problem);
    for (t, dev) in problem.devices.iter().enumerate() {
        // (qps routed, capacity, capacity of one device) per app on this type.
        let mut load: Vec<(f64, f64, f64)> = problem
            .apps
            .iter()
            .map(|a| {
                let rs = plan.routes.iter().filter(|r| r.app == a.name && r.device_type == dev.name);
                let (qps, cap, n) =
                    rs.fold((0.0, 0.0, 0u32), |acc, r| (acc.0 + r.qps, acc.1 + r.capacity_qps, acc.2 + r.devices));
                (qps, cap, if n > 0 { cap / n as f64 } else { 0.0 })
            })
            .collect();
        let mut idle = dev.count.saturating_sub(pins[t].iter().sum());
        while idle > 0 {
            let best = (0..load.len())
                .filter(|&q| load[q].2 > 0.0)
                .max_by(|&a, &b| (load[a].0 / load[a].1).total_cmp(&(load[b].0 / load[b].1)).then(b.cmp(&a)));
            let Some(q) = best else { break };
            pins[t][q] += 1;
            load[q].1 += load[q].2;
            idle -= 1;
        }
    }
    pins
}
