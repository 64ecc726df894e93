//! The allocator's typed errors: each names the bad input (the field, the file, the
//! variant or the number) in its message, and says which kind of mistake it is in
//! its variant.

use std::path::Path;

use sluice_alloc::config::{DeviceConfig, DevicePool};
use sluice_alloc::cores::{
    self, CapacityError, CapacityTable, CoreMethod, CoreModel, CoreModelError, CorePlanError, CoreSettings,
    CoreSettingsError, VariantsError,
};
use sluice_alloc::infaas;
use sluice_alloc::limits::RangeError;
use sluice_alloc::loki::{self, LokiError};
use sluice_alloc::proteus;
use sluice_alloc::solver::SettingsError;
use sluice_alloc::{AnyProblem, SolveError, SolverSettings, Violation};

mod common;
use common::{capacity, root};

/// One app of two ResNets on `count` cores at `demand` requests/s.
fn cores_problem(count: u32, demand: f64) -> proteus::Problem {
    common::cores_problem(count, demand, &["resnet18", "resnet50"])
}

#[test]
fn capacity_table_errors_name_the_file_and_the_model() {
    let e = CapacityTable::load(Path::new("no/such/table.toml")).unwrap_err();
    assert!(matches!(e, CapacityError::Read { .. }), "{e:?}");
    assert!(e.to_string().starts_with("no/such/table.toml: cannot read: "), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "point = 3\n").unwrap();
    let e = CapacityTable::load(&bad).unwrap_err();
    assert!(matches!(e, CapacityError::Parse { .. }) && e.to_string().contains("bad.toml"), "{e}");

    let table = CapacityTable::load(&capacity()).unwrap();
    let e = table.variants(Some(&["resnet9000".to_string()]), 750.0, &[1, 2]).unwrap_err();
    assert_eq!(e, VariantsError::UnknownModel("resnet9000".into()));
    assert_eq!((e.field(), e.to_string().as_str()), ("models", "`resnet9000` is not in the capacity table"));
    let e = table.variants(Some(&[]), 750.0, &[1, 2]).unwrap_err();
    assert_eq!((e.field(), e), ("models", VariantsError::NoModels));
    let e = table.variants(None, 1.5, &[1, 2]).unwrap_err();
    assert_eq!(e.field(), "fit_cpus");
    assert!(e.to_string().ends_with("fewer than two capacity points at sla_ms = 1.5"), "{e}");
}

#[test]
fn core_settings_and_model_errors_name_the_field() {
    let bad = CoreSettings { sla_ms: -1.0, ..CoreSettings::default() };
    let e = bad.validate().unwrap_err();
    assert_eq!(e, CoreSettingsError::Range { field: "sla_ms", range: RangeError::Latency(-1.0) });
    assert_eq!(e.to_string(), "sla_ms: expected a positive number of milliseconds, at most 3600000");
    let bad = CoreSettings { min_cores: 5000, ..CoreSettings::default() };
    assert_eq!(bad.validate().unwrap_err().to_string(), "min_cores: expected 0 to 4096 cores");
    let bad = CoreSettings { vpa_margin: f64::INFINITY, ..CoreSettings::default() };
    assert!(bad.validate().unwrap_err().to_string().starts_with("vpa_margin: "));

    let e = CoreModel::load(&CoreSettings::default()).unwrap_err();
    assert!(matches!(e, CoreModelError::NoCapacity));
    assert_eq!(e.to_string(), "allocator.cores.capacity: required by this method");
    let missing = CoreSettings { capacity: Some("nope.toml".into()), ..CoreSettings::default() };
    let e = CoreModel::load(&missing).unwrap_err();
    assert!(e.to_string().starts_with("allocator.cores.capacity: nope.toml: cannot read"), "{e}");
    let unfit = CoreSettings { capacity: Some(capacity()), sla_ms: 1.5, ..CoreSettings::default() };
    let e = CoreModel::load(&unfit).unwrap_err();
    assert!(matches!(e, CoreModelError::Variants { .. }));
    assert!(e.to_string().starts_with("allocator.cores.fit_cpus: "), "{e}");
}

#[test]
fn core_plan_errors_name_the_app_and_the_variant() {
    let settings = CoreSettings { capacity: Some(capacity()), ..CoreSettings::default() };
    let model = CoreModel::load(&settings).unwrap();
    let e = cores::plan(CoreMethod::Vpa, &cores_problem(8, 10.0), &settings, &model, None).unwrap_err();
    assert!(matches!(e, CorePlanError::NoVpaVariant));
    assert_eq!(e.to_string(), "allocator.cores.variant: required by method = \"vpa\"");
    let vpa = CoreSettings { variant: Some("resnet152".into()), ..settings.clone() };
    let e = cores::plan(CoreMethod::Vpa, &cores_problem(8, 10.0), &vpa, &model, None).unwrap_err();
    assert_eq!(
        e.to_string(),
        "allocator.cores.variant: `resnet152` is not a variant of app image in the capacity table"
    );
    let mut unknown = cores_problem(8, 10.0);
    unknown.apps[0].models = vec!["vgg".into()];
    let e = cores::plan(CoreMethod::InfAdapter, &unknown, &settings, &model, None).unwrap_err();
    assert_eq!(e.to_string(), "app image: none of its variants is in the capacity table");
    let mut two = cores_problem(8, 10.0);
    two.apps.push(two.apps[0].clone());
    let e = cores::plan(CoreMethod::InfAdapter, &two, &settings, &model, None).unwrap_err();
    assert!(matches!(e, CorePlanError::Shape { apps: 2, device_types: 1 }), "{e:?}");
}

#[test]
fn solver_and_infaas_settings_errors_name_the_field() {
    let e = SolverSettings { mip_gap: 2.0, ..SolverSettings::default() }.validate().unwrap_err();
    assert_eq!(e, SettingsError::MipGap(2.0));
    assert!(e.to_string().starts_with("mip_gap: "));
    let e = infaas::Settings { slack: 0.0, downscale: 0.5 }.validate().unwrap_err();
    assert_eq!(e.to_string(), "slack and downscale must be in (0, 1] (slack = 0, downscale = 0.5)");
}

#[test]
fn out_of_range_problems_built_in_code_name_the_field() {
    let mut p = cores_problem(8, 1e300);
    p.apps[0].name = "flood".into();
    let e = proteus::solve(&p).unwrap_err();
    assert_eq!(e.to_string(), "app flood: demand_qps: expected a number of requests/s from 0 to 1e9");
    match e {
        proteus::ProteusError::Solve(SolveError::OutOfRange { field, range }) => {
            assert_eq!((field.as_str(), range), ("app flood: demand_qps", RangeError::Demand(1e300)));
        }
        other => panic!("{other:?}"),
    }
}

fn traffic() -> loki::Problem {
    match AnyProblem::load(&root().join("examples/allocate/loki-traffic.toml")).unwrap() {
        AnyProblem::Loki(p) => p,
        _ => unreachable!("a loki problem"),
    }
}

#[test]
fn loki_problem_errors_name_the_number() {
    let e = loki::solve(&loki::Problem { workers: 0, ..traffic() }).unwrap_err();
    assert!(matches!(e, LokiError::Workers(0)));
    assert_eq!(e.to_string(), "workers 0: expected 1 to 10000");
    let e = loki::solve(&loki::Problem { slo_ms: -3.0, ..traffic() }).unwrap_err();
    assert!(e.to_string().contains("slo_ms = -3"), "{e}");
    let e = loki::solve(&loki::Problem { demand_qps: f64::NAN, ..traffic() }).unwrap_err();
    assert!(e.to_string().starts_with("demand_qps: expected"), "{e}");
    let mut short = traffic();
    short.variants.pop();
    let e = loki::solve(&short).unwrap_err();
    assert!(matches!(e, LokiError::VariantLists { .. }), "{e:?}");
    let threads = SolverSettings { threads: 0, ..SolverSettings::default() };
    let e = loki::solve(&loki::Problem { solver: threads, ..traffic() }).unwrap_err();
    assert!(matches!(e, LokiError::Settings(SettingsError::Threads(0))), "{e:?}");
}

#[test]
fn plan_checks_say_which_rule_and_name_the_part_of_the_plan() {
    let p = traffic();
    let plan = loki::solve(&p).unwrap().plan.unwrap();
    plan.check(&p).unwrap();
    let mut renamed = plan.clone();
    renamed.variants[0].task = "nowhere".into();
    let e = renamed.check(&p).unwrap_err();
    assert_eq!(e, Violation::Shape("task `nowhere` is not in the pipeline".into()));
    let mut unhosted = plan.clone();
    unhosted.variants[0].replicas = 0;
    let e = unhosted.check(&p).unwrap_err();
    assert!(matches!(e, Violation::Constraint(_)) && e.message().contains(&plan.variants[0].variant), "{e:?}");

    let p = cores_problem(8, 10.0);
    let plan = proteus::solve(&p).unwrap().plan.unwrap();
    plan.check(&p).unwrap();
    let mut shed = plan.clone();
    shed.apps[0].shed_qps += 1.0;
    let e = shed.check(&p).unwrap_err();
    assert!(matches!(e, Violation::Reported(_)) && e.to_string().starts_with("app image: shed"), "{e:?}");
}

#[test]
fn a_device_whose_profile_cannot_be_loaded_is_named() {
    let device = DeviceConfig { kind: "gpu".into(), count: 1, profile: "missing.toml".into(), memory_mb: None };
    let e = DevicePool::load(&[device]).err().expect("an error");
    assert_eq!(e.kind, "gpu");
    assert!(e.to_string().starts_with("device gpu: ") && e.to_string().contains("missing.toml"), "{e}");
}
