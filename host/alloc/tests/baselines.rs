//! The baselines of Proteus's evaluation built around the allocator (`planner`,
//! `infaas`): restricted variants, fixed placement, uniform routing, a static plan,
//! and INFaaS-Accuracy's greedy autoscaler.

mod common;

use std::collections::BTreeMap;

use sluice_alloc::config::AllocatorConfig;
use sluice_alloc::config::{DeviceMobility, Method, Replan, SplitBy};
use sluice_alloc::infaas::{self, Settings};
use sluice_alloc::planner::Planner;
use sluice_alloc::proteus::{self, DeviceType, Formulation, Ladder, Objective, Plan, Variants};
use sluice_alloc::SolverSettings;
use sluice_core::profile::{ModelProfile, Profile};

/// A variant whose batch b takes `per_item_us`·b: capacity ≈ 1e6 / per_item_us at
/// the largest batch under SLO/2.
fn model(name: &str, accuracy: f64, per_item_us: u64) -> ModelProfile {
    common::model(name, accuracy, [1, 2, 4, 8].iter().map(|b| per_item_us * b).collect())
}

/// Two apps with a fast inaccurate and a slow accurate variant each, on 3 slow and 3
/// fast devices (fast = half the latency). SLO 1 s: every batch fits, capacity at
/// batch 8 is 1e6 / per-item µs.
fn problem(demand_a: f64, demand_b: f64) -> proteus::Problem {
    let slow = vec![
        model("a-small", 0.7, 10_000),
        model("a-large", 0.9, 40_000),
        model("b-small", 0.6, 10_000),
        model("b-large", 0.8, 40_000),
    ];
    let fast: Vec<ModelProfile> = slow
        .iter()
        .map(|m| {
            let mut m = m.clone();
            m.p50_us.iter_mut().for_each(|l| *l /= 2);
            m.p95_us = m.p50_us.clone();
            m.p99_us = m.p50_us.clone();
            m
        })
        .collect();
    let profile =
        |name: &str, models| Profile { name: name.into(), device: name.into(), source: "test".into(), models };
    let app = |name: &str, demand| proteus::App {
        name: name.into(),
        slo_ms: 1000.0,
        demand_qps: demand,
        models: vec![format!("{name}-small"), format!("{name}-large")],
        memory_mb: BTreeMap::new(),
    };
    proteus::Problem {
        devices: vec![
            DeviceType { name: "slow".into(), count: 3, memory_mb: None, profile: profile("slow", slow) },
            DeviceType { name: "fast".into(), count: 3, memory_mb: None, profile: profile("fast", fast) },
        ],
        apps: vec![app("a", demand_a), app("b", demand_b)],
        batch_sizes: vec![1, 2, 4, 8],
        objective: Objective::Accuracy,
        formulation: Formulation::Aggregated,
        ladder: Ladder::default(),
        solver: SolverSettings { time_limit_s: 30.0, mip_gap: 0.0, soft_limit_s: 0.0, threads: 1 },
        variants: Variants::All,
        pinned: None,
    }
}

fn solve(p: &proteus::Problem) -> Plan {
    proteus::solve(p).unwrap().plan.expect("feasible")
}

fn models(plan: &Plan) -> Vec<String> {
    plan.devices.iter().filter_map(|d| d.model.clone()).collect()
}

fn capacity_of(plan: &Plan, app: &str) -> f64 {
    plan.routes.iter().filter(|r| r.app == app).map(|r| r.capacity_qps).sum()
}

#[test]
fn restricted_variants_use_only_the_most_or_least_accurate() {
    for formulation in [Formulation::Aggregated, Formulation::PerDevice] {
        let mut p = problem(40.0, 40.0);
        p.formulation = formulation;
        p.variants = Variants::MostAccurate;
        let plan = solve(&p);
        assert!(models(&plan).iter().all(|m| m.ends_with("-large")), "{formulation:?}: {:?}", models(&plan));
        p.variants = Variants::LeastAccurate;
        let plan = solve(&p);
        assert!(models(&plan).iter().all(|m| m.ends_with("-small")), "{formulation:?}: {:?}", models(&plan));
        assert!((plan.effective_accuracy - 0.65).abs() < 1e-9);
    }
}

#[test]
fn most_accurate_only_sheds_what_the_large_variants_cannot_serve() {
    // Large variants: 25 req/s on a slow device, 50 on a fast one: 225 in all.
    let mut p = problem(200.0, 200.0);
    p.variants = Variants::MostAccurate;
    let plan = solve(&p);
    assert!(plan.beta < 1.0, "{plan:?}");
    assert!(plan.apps.iter().all(|a| a.shed_qps > 0.0));
    assert!(models(&plan).iter().all(|m| m.ends_with("-large")));
    // With model selection the same demand is served in full.
    let plan = solve(&problem(200.0, 200.0));
    assert!(plan.beta >= 1.0, "{plan:?}");
}

#[test]
fn pinned_placement_keeps_every_device_on_its_app() {
    for formulation in [Formulation::Aggregated, Formulation::PerDevice] {
        // First plan: a needs most devices, b little.
        let mut p = problem(150.0, 10.0);
        p.formulation = formulation;
        let first = solve(&p);
        let pins = first.pins(&p);
        assert_eq!(pins.iter().flatten().sum::<u32>(), first.devices_used);
        // Demand flips. Free placement would move devices to b; pinned may not.
        let mut flipped = problem(10.0, 150.0);
        flipped.formulation = formulation;
        flipped.pinned = Some(pins.clone());
        let plan = proteus::solve(&flipped).unwrap().plan.expect("a plan, possibly shedding");
        assert_eq!(plan.pins(&flipped), pins, "{formulation:?}: placement moved");
        let free = solve(&{
            let mut f = problem(10.0, 150.0);
            f.formulation = formulation;
            f
        });
        assert!(
            free.effective_accuracy * (1.0 - free.apps.iter().map(|a| a.shed_qps).sum::<f64>() / 160.0)
                >= plan.effective_accuracy * (1.0 - plan.apps.iter().map(|a| a.shed_qps).sum::<f64>() / 160.0) - 1e-9,
            "fixed placement cannot beat free placement"
        );
    }
}

#[test]
fn uniform_routing_splits_evenly_over_an_apps_devices() {
    let mut plan = solve(&problem(150.0, 30.0));
    plan.route_uniformly();
    for app in ["a", "b"] {
        let mine: Vec<f64> = plan.devices.iter().filter(|d| d.app.as_deref() == Some(app)).map(|d| d.share).collect();
        assert!(!mine.is_empty());
        for s in &mine {
            assert!((s - 1.0 / mine.len() as f64).abs() < 1e-12, "{app}: {mine:?}");
        }
        let total: f64 = plan.routes.iter().filter(|r| r.app == app).map(|r| r.share).sum();
        assert!((total - 1.0).abs() < 1e-9);
    }
}

fn config(f: impl FnOnce(&mut AllocatorConfig)) -> AllocatorConfig {
    let mut c = AllocatorConfig::default();
    f(&mut c);
    c
}

#[test]
fn a_static_planner_never_replans_and_a_fixed_one_pins_its_first_placement() {
    let planner = Planner::new(&config(|c| c.replan = Replan::Never));
    assert!(!planner.replans());
    let mut fixed = Planner::new(&config(|c| c.placement = DeviceMobility::Fixed));
    assert!(fixed.replans());
    let first = fixed.plan(problem(150.0, 10.0));
    assert_eq!(first.status, "optimal");
    let p0 = fixed.current().unwrap().pins(&problem(0.0, 0.0));
    // Demand flips: the re-plans keep the first placement, its idle devices given out
    // (every device now serves an app), and never move a device between apps.
    fixed.plan(problem(10.0, 150.0));
    let p1 = fixed.current().unwrap().pins(&problem(0.0, 0.0));
    assert_eq!(p1.iter().flatten().sum::<u32>(), 6, "{p1:?}");
    for (r0, r1) in p0.iter().zip(&p1) {
        assert!(r0.iter().zip(r1).all(|(a, b)| b >= a), "{p0:?} → {p1:?}");
    }
    fixed.plan(problem(150.0, 150.0));
    assert_eq!(fixed.current().unwrap().pins(&problem(0.0, 0.0)), p1);
    // Uniform routing is what the planner puts in force.
    let mut uniform = Planner::new(&config(|c| c.routing = SplitBy::Uniform));
    uniform.plan(problem(150.0, 30.0));
    let plan = uniform.current().unwrap();
    let a: Vec<f64> = plan.devices.iter().filter(|d| d.app.as_deref() == Some("a")).map(|d| d.share).collect();
    assert!(a.windows(2).all(|w| (w[0] - w[1]).abs() < 1e-12), "{a:?}");
}

#[test]
fn infaas_scales_up_with_the_most_accurate_variant_while_devices_are_free() {
    let s = Settings::default();
    // From nothing: a at 40 req/s needs two large variants on fast devices (50 each
    // → one is enough: 50 · 0.95 ≥ 40).
    let plan = infaas::step(&problem(40.0, 10.0), None, &s).unwrap();
    assert!(models(&plan).iter().all(|m| m.ends_with("-large")), "{:?}", models(&plan));
    assert!(capacity_of(&plan, "a") * s.slack >= 40.0);
    assert!(capacity_of(&plan, "b") * s.slack >= 10.0);
    // Shares follow capacity and sum to one per app.
    for app in ["a", "b"] {
        let total: f64 = plan.devices.iter().filter(|d| d.app.as_deref() == Some(app)).map(|d| d.share).sum();
        assert!((total - 1.0).abs() < 1e-9);
    }
}

#[test]
fn infaas_downgrades_in_place_when_no_device_is_free_and_never_takes_anothers() {
    let s = Settings::default();
    // a takes the three fast devices, b one slow one; two slow devices are free.
    let mut plan = infaas::step(&problem(100.0, 1.0), None, &s).unwrap();
    let b_devices = |p: &Plan| p.devices.iter().filter(|d| d.app.as_deref() == Some("b")).count();
    let b_before = b_devices(&plan);
    assert_eq!(b_before, 1, "{:?}", plan.devices);
    // Both loads rise: a (first in order) takes the free devices and downgrades to
    // cope; b finds none free and downgrades its own in place.
    for _ in 0..3 {
        plan = infaas::step(&problem(200.0, 120.0), Some(&plan), &s).unwrap();
    }
    assert_eq!(plan.devices_used, 6);
    assert!(capacity_of(&plan, "a") * s.slack >= 200.0);
    assert_eq!(b_devices(&plan), b_before, "b took a device a holds");
    // b downgraded to its small variant to cope.
    assert!(
        plan.devices.iter().filter(|d| d.app.as_deref() == Some("b")).all(|d| d.model.as_deref() == Some("b-small")),
        "{:?}",
        plan.devices
    );
    // What b cannot carry (one slow device: 100 req/s) is reported as shed.
    let b = plan.apps.iter().find(|a| a.name == "b").unwrap();
    assert!((b.shed_qps - 20.0).abs() < 1e-9, "{b:?}");
}

#[test]
fn infaas_scales_down_when_capacity_is_ample_and_keeps_devices_in_place() {
    let s = Settings::default();
    let busy = infaas::step(&problem(150.0, 20.0), None, &s).unwrap();
    let quiet = infaas::step(&problem(5.0, 5.0), Some(&busy), &s).unwrap();
    assert!(quiet.devices_used < busy.devices_used, "{} → {}", busy.devices_used, quiet.devices_used);
    assert!(quiet.devices_used >= 2, "each app keeps a device");
    // Devices that stay keep their index and variant or upgrade; none moves app.
    for (b, q) in busy.devices.iter().zip(&quiet.devices) {
        if q.app.is_some() {
            assert_eq!(b.app, q.app, "{} moved", q.device);
        }
    }
    assert!(models(&quiet).iter().all(|m| m.ends_with("-large")));
    // Same inputs, same plan.
    assert_eq!(infaas::step(&problem(5.0, 5.0), Some(&busy), &s).unwrap(), quiet);
}

#[test]
fn the_planner_runs_infaas_as_a_heuristic() {
    let mut p = Planner::new(&config(|c| c.method = Method::InfaasAccuracy));
    let a = p.plan(problem(40.0, 10.0));
    assert_eq!(a.status, "heuristic");
    assert!(a.error.is_none());
    assert!(p.current().is_some());
}

#[test]
fn hardware_first_within_a_restriction_uses_the_allowed_variants() {
    // Least accurate only: hardware scaling places the small variants, not nothing.
    let mut p = problem(40.0, 40.0);
    p.objective = Objective::HardwareFirst;
    p.variants = Variants::LeastAccurate;
    let out = proteus::solve(&p).unwrap();
    let plan = out.plan.expect("feasible");
    assert_eq!(plan.step, proteus::Step::Hardware, "{:?}", out.attempts);
    assert!(models(&plan).iter().all(|m| m.ends_with("-small")), "{:?}", models(&plan));
}

#[test]
fn infaas_with_replicated_spares_is_refused() {
    let c = config(|c| {
        c.method = Method::InfaasAccuracy;
        c.spare = sluice_alloc::config::Spare::Replicate;
    });
    let err = sluice_alloc::config::validate(&[], &[], &c).unwrap_err();
    assert_eq!(err.field, "allocator.spare");
}

/// The Loki artifact's Proteus baseline: every idle device hosts the most accurate
/// variant of the most loaded app, with no share of the plan's routing.
#[test]
fn upgrading_idle_devices_fills_the_cluster_with_the_most_loaded_apps_best_variant() {
    // Low demand: the accuracy MILP needs two devices (a-large and b-large at 25/s
    // each on slow, 50/s on fast) and leaves the rest idle.
    let p = problem(20.0, 40.0);
    let mut plan = solve(&p);
    let before = plan.devices_used;
    assert!(before < 6, "the low-demand plan leaves devices idle: {before}");
    let routed: Vec<(String, f64)> = plan.routes.iter().map(|r| (r.model.clone(), r.share)).collect();
    let accuracy = plan.effective_accuracy;
    plan.upgrade_idle(&p).unwrap();
    assert_eq!(plan.devices_used, 6);
    assert!(plan.devices.iter().all(|d| d.app.is_some() && d.model.is_some()));
    // Every upgraded device hosts its app's most accurate variant.
    let larges = models(&plan).iter().filter(|m| m.ends_with("-large")).count();
    assert_eq!(larges, 6, "{:?}", models(&plan));
    // The routing is the plan's: what was routed keeps its share, per app the
    // shares still sum to 1, and the accuracy of what is served is unchanged.
    for (model, share) in routed {
        let total: f64 = plan.routes.iter().filter(|r| r.model == model).map(|r| r.share).sum();
        assert!((total - share).abs() < 1e-9, "{model}: {total} vs {share}");
    }
    for app in ["a", "b"] {
        let total: f64 = plan.routes.iter().filter(|r| r.app == app).map(|r| r.share).sum();
        assert!((total - 1.0).abs() < 1e-9, "{app}: {total}");
    }
    assert_eq!(plan.effective_accuracy, accuracy);
    // Per-device shares are the route's split evenly.
    for r in &plan.routes {
        let on: Vec<f64> = plan
            .devices
            .iter()
            .filter(|d| d.model.as_deref() == Some(r.model.as_str()) && d.device_type == r.device_type)
            .map(|d| d.share)
            .collect();
        assert_eq!(on.len() as u32, r.devices);
        assert!(on.iter().all(|s| (s - r.share / r.devices as f64).abs() < 1e-9), "{r:?}: {on:?}");
    }
    // b (40/s) is the more loaded app for its capacity, so it gets the first idle device;
    // both apps end with more capacity than before.
    assert!(capacity_of(&plan, "b") > 0.0 && capacity_of(&plan, "a") > 0.0);
    let b_devices: u32 = plan.routes.iter().filter(|r| r.app == "b").map(|r| r.devices).sum();
    let a_devices: u32 = plan.routes.iter().filter(|r| r.app == "a").map(|r| r.devices).sum();
    assert!(b_devices >= a_devices, "a {a_devices}, b {b_devices}");
    // A full plan has nothing to upgrade.
    let mut again = plan.clone();
    again.upgrade_idle(&p).unwrap();
    assert_eq!(again, plan);
}
