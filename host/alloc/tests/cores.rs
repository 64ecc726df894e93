//! InfAdapter's world (`cores`, `planner`): variants on CPU cores from the measured
//! capacity table, planned by InfAdapter's ILP, Model-Switching+ and the VPA-like
//! rule; plans over the core devices; the reference's stabilisation.

use std::collections::BTreeMap;

use sluice_alloc::config::AllocatorConfig;
use sluice_alloc::config::Method;
use sluice_alloc::cores::{CapacityTable, CoreSettings};
use sluice_alloc::planner::Planner;
use sluice_alloc::proteus::{self, Plan};
use sluice_alloc::AnyPlan;

mod common;
use common::{capacity, root};

const NAMES: [&str; 5] = ["resnet18", "resnet34", "resnet50", "resnet101", "resnet152"];

/// One app of the five ResNets on 20 cores, at `demand` requests/s.
fn problem(demand: f64) -> proteus::Problem {
    common::cores_problem(20, demand, &NAMES)
}

fn planner(method: Method, tweak: impl FnOnce(&mut CoreSettings)) -> Planner {
    let mut c = AllocatorConfig { method, ..Default::default() };
    c.cores.capacity = Some(capacity());
    tweak(&mut c.cores);
    Planner::new(&c)
}

fn plan_of(a: &sluice_alloc::Allocation) -> Plan {
    match a.plan.as_ref().expect("a plan") {
        AnyPlan::Proteus(p) => p.clone(),
        other => panic!("not a device plan: {other:?}"),
    }
}

/// Cores per variant, from the devices.
fn cores(plan: &Plan) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for d in &plan.devices {
        if let Some(m) = &d.model {
            *out.entry(m.clone()).or_default() += 1;
        }
    }
    out
}

/// A plan over cores is consistent: each route's devices host its variant at the
/// replica's measured time, shares sum to one, the served demand fits capacity.
fn check(plan: &Plan, table: &CapacityTable, fits: bool) {
    let c = cores(plan);
    assert_eq!(plan.devices_used, c.values().sum::<u32>());
    assert!(plan.devices_used <= 20);
    for r in &plan.routes {
        assert_eq!(c[&r.model], r.devices, "{r:?}");
        assert!(!fits || r.qps <= r.capacity_qps + 1e-6, "{r:?}");
        for d in plan.devices.iter().filter(|d| d.model.as_ref() == Some(&r.model)) {
            assert_eq!(d.service_us, table.service_us(&r.model, r.devices), "{d:?}");
            assert!((d.share - r.share / r.devices as f64).abs() < 1e-9);
        }
    }
    let shares: f64 = plan.devices.iter().map(|d| d.share).sum();
    assert!((shares - 1.0).abs() < 1e-6, "{shares}");
}

#[test]
fn service_time_follows_the_replica_size() {
    let t = CapacityTable::load(&capacity()).unwrap();
    // ResNet-50: 10 req/s on one core, 174 on 20 (8.7 per core).
    assert_eq!(t.service_us("resnet50", 1), Some(100_000));
    assert_eq!(t.service_us("resnet50", 20), Some((20e6_f64 / 174.0).round() as u64));
    assert_eq!(t.service_us("resnet50", 64), None);
    assert_eq!(t.service_us("vgg", 1), None);
}

#[test]
fn infadapter_plans_a_set_ms_plus_one_variant_and_the_set_is_worth_more() {
    let table = CapacityTable::load(&capacity()).unwrap();
    for demand in [40.0, 75.0, 150.0, 300.0] {
        let a = planner(Method::Infadapter, |_| {}).plan(problem(demand));
        let m = planner(Method::ModelSwitchingPlus, |_| {}).plan(problem(demand));
        let (pa, pm) = (plan_of(&a), plan_of(&m));
        check(&pa, &table, true);
        check(&pm, &table, true);
        assert_eq!(cores(&pm).len(), 1, "{demand}: MS+ {:?}", cores(&pm));
        // The set's objective (the same function, a superset of plans) is at least
        // the single variant's.
        assert!(a.objective.unwrap() >= m.objective.unwrap() - 1e-9, "{demand}: {a:?} vs {m:?}");
        for p in [&pa, &pm] {
            assert!((p.apps[0].served_qps - demand).abs() < 1e-6, "{demand}: all served");
        }
    }
    // At the spike's load one variant must be ResNet-18 to fit 20 cores; the set
    // serves part of the load with ResNet-50 and is more accurate.
    let a = plan_of(&planner(Method::Infadapter, |_| {}).plan(problem(300.0)));
    let m = plan_of(&planner(Method::ModelSwitchingPlus, |_| {}).plan(problem(300.0)));
    assert_eq!(cores(&m).keys().collect::<Vec<_>>(), ["resnet18"]);
    assert!(cores(&a).len() > 1 && a.effective_accuracy > m.effective_accuracy, "{a:?}");
}

#[test]
fn vpa_sizes_cores_to_the_load_with_its_margin() {
    let table = CapacityTable::load(&capacity()).unwrap();
    let mut p = planner(Method::Vpa, |c| c.variant = Some("resnet50".into()));
    // 48 req/s at 10 req/s per core: 4.8 cores, + 15 %: 5.52, so 6 (which saturate
    // at 67 req/s, the capacity the plan reports).
    let plan = plan_of(&p.plan(problem(48.0)));
    check(&plan, &table, true);
    assert_eq!(cores(&plan), BTreeMap::from([("resnet50".to_string(), 6)]));
    // Beyond the budget: all 20 cores, everything routed there.
    let plan = plan_of(&p.plan(problem(1000.0)));
    check(&plan, &table, false);
    assert_eq!(cores(&plan), BTreeMap::from([("resnet50".to_string(), 20)]));
    // Without a variant it cannot plan, and says why.
    let a = planner(Method::Vpa, |_| {}).plan(problem(48.0));
    assert!(a.plan.is_none() && a.error.as_deref().unwrap_or("").contains("allocator.cores.variant"), "{a:?}");
}

#[test]
fn scale_down_waits_for_the_stabilisation_and_cores_stay_put() {
    let mut p = planner(Method::Infadapter, |c| c.stabilization = 2);
    let high = plan_of(&p.plan(problem(250.0)));
    // Lower demand: two decisions keep the plan, the third re-plans.
    for _ in 0..2 {
        let a = p.plan(problem(60.0));
        assert_eq!(a.status, "stabilized");
        assert!(!a.is_new_plan());
        assert_eq!(plan_of(&a), high);
    }
    let low = p.plan(problem(60.0));
    assert!(low.is_new_plan(), "{low:?}");
    let low = plan_of(&low);
    assert!(low.devices_used < high.devices_used, "{} vs {}", low.devices_used, high.devices_used);
    // More demand re-plans at once; a variant that stays keeps the cores it had.
    let up = p.plan(problem(200.0));
    assert!(up.is_new_plan());
    let up = plan_of(&up);
    for (i, d) in low.devices.iter().enumerate() {
        if let Some(m) = &d.model {
            if cores(&up).get(m).copied().unwrap_or(0) >= cores(&low)[m] {
                assert_eq!(up.devices[i].model.as_ref(), Some(m), "core {i} moved off {m}");
            }
        }
    }
}

#[test]
fn never_more_cores_than_the_most_accurate_alone_needs() {
    // The reference caps the cores at what ResNet-152 alone needs for λ.
    let table = CapacityTable::load(&capacity()).unwrap();
    let variants = table.variants(None, 750.0, &[1, 2, 4, 8, 16]).unwrap();
    let best = variants.iter().find(|v| v.name == "resnet152").unwrap();
    for demand in [10.0, 20.0, 40.0] {
        let need = (2..=20).find(|&n| best.throughput(n, 0.8) >= demand).unwrap();
        let plan = plan_of(&planner(Method::Infadapter, |_| {}).plan(problem(demand)));
        assert!(plan.devices_used <= need, "{demand}: {} cores, ResNet-152 needs {need}", plan.devices_used);
    }
}

#[test]
fn core_methods_refuse_configs_they_cannot_plan() {
    use sluice_alloc::config::{validate, DeviceConfig};
    use sluice_core::app_config::AppConfig;
    let app: AppConfig = toml::from_str(
        "name = \"image\"\nslo_ms = 750\nworkers = 20\nrouter = \"weighted\"\nprofile = \"p.toml\"\npolicy = \"fixed\"\n",
    )
    .unwrap();
    let device = DeviceConfig {
        kind: "core".into(),
        count: 20,
        profile: root().join("profiles/infadapter-resnet-cpu1.toml"),
        memory_mb: None,
    };
    let config = |f: &dyn Fn(&mut AllocatorConfig)| {
        let mut c = AllocatorConfig { method: Method::Infadapter, ..Default::default() };
        c.cores.capacity = Some(capacity());
        f(&mut c);
        c
    };
    let err = |apps: &[AppConfig], c: &AllocatorConfig| validate(apps, std::slice::from_ref(&device), c).unwrap_err();
    assert!(validate(std::slice::from_ref(&app), std::slice::from_ref(&device), &config(&|_| {})).is_ok());
    let mut second = app.clone();
    second.name = "other".into();
    assert_eq!(err(&[app.clone(), second], &config(&|_| {})).field, "allocator.method");
    let e = err(std::slice::from_ref(&app), &config(&|c| c.cores.capacity = None));
    assert_eq!(e.field, "allocator.cores.capacity");
    assert!(e.message.contains("required"), "{e:?}");
    let e = err(std::slice::from_ref(&app), &config(&|c| c.cores.capacity = Some("nope.toml".into())));
    assert!(e.message.contains("nope.toml") && e.message.contains("cannot read"), "{e:?}");
    let e = err(std::slice::from_ref(&app), &config(&|c| c.method = Method::Vpa));
    assert_eq!(e.field, "allocator.cores.variant");
    let e = err(
        std::slice::from_ref(&app),
        &config(&|c| {
            c.method = Method::Vpa;
            c.cores.variant = Some("vgg".into());
        }),
    );
    assert!(e.message.contains("`vgg`"), "{e:?}");
    let e = err(std::slice::from_ref(&app), &config(&|c| c.spare = sluice_alloc::config::Spare::Replicate));
    assert_eq!(e.field, "allocator.spare");
    assert!(e.message.contains("\"infadapter\""), "{e:?}");
}
