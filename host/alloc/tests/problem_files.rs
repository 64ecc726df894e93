//! Problem files: the checked-in examples load and solve; bad files are refused with
//! an error naming the file and the field.

use std::path::{Path, PathBuf};

use sluice_alloc::{Allocator, AnyPlan, AnyProblem};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn the_paper_setup_is_solved_at_full_demand() {
    let p = AnyProblem::load(&root().join("examples/allocate/proteus-paper.toml")).unwrap();
    let AnyProblem::Proteus(problem) = &p else { panic!("a proteus problem") };
    assert_eq!(problem.devices.iter().map(|d| d.count).sum::<u32>(), 40);
    assert_eq!(problem.apps.iter().map(|a| a.models.len()).sum::<usize>(), 46);
    assert_eq!(problem.apps.len(), 9);
    let a = Allocator::default().allocate(&p);
    assert!(a.status == "optimal" || a.status == "time-limit", "{}", a.status);
    let Some(AnyPlan::Proteus(plan)) = a.plan else { panic!("a plan") };
    assert!(plan.devices_used <= 40);
    assert!(plan.effective_accuracy > 0.5 && plan.effective_accuracy <= 1.0);
    // Everything the plan serves is routed to placed variants.
    for r in &plan.routes {
        assert!(r.share < 1e-7 || r.devices > 0, "{r:?}");
    }
    let json = serde_json::to_value(Allocator::default().allocate(&p)).unwrap();
    for key in ["status", "objective", "gap", "solve_seconds", "plan"] {
        assert!(json.get(key).is_some(), "--json lacks {key}");
    }
}

#[test]
fn the_infadapter_example_is_solved() {
    let p = AnyProblem::load(&root().join("examples/allocate/infadapter.toml")).unwrap();
    let a = Allocator::default().allocate(&p);
    let Some(AnyPlan::Infadapter(plan)) = a.plan else { panic!("a plan: {}", a.status) };
    assert!(plan.cores <= 20);
    assert!((plan.served_rps - 301.0).abs() < 1e-6, "{plan:?}");
    assert!(plan.variants.iter().all(|v| v.cores == 0 || v.cores >= 2));
}

fn error(text: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cap-capacity.toml"), CAPACITY).unwrap();
    std::fs::write(dir.path().join("p.toml"), PROFILE).unwrap();
    match AnyProblem::parse(text, "problem.toml", dir.path()) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e.to_string(),
    }
}

const PROFILE: &str = r#"version = 1
name = "t"
device = "t"
source = "t"

[[model]]
name = "m"
accuracy = 0.7
accuracy_source = "t"
batch_sizes = [1, 2]
p50_us = [10000, 12000]
p95_us = [10000, 12000]
p99_us = [10000, 12000]
"#;

const CAPACITY: &str = r#"kind = "capacity"
point = [
  { model = "r", cpus = 1, sla_us = 750000, capacity_rps = 10 },
  { model = "r", cpus = 2, sla_us = 750000, capacity_rps = 20 },
]
[[model]]
name = "r"
accuracy = 0.7
load_time_s = 5.0
"#;

const PROTEUS: &str = r#"version = 1
kind = "proteus"
[[device]]
type = "cpu"
count = 2
profile = "p.toml"
[[app]]
name = "a"
slo_ms = 100
demand_qps = 10
models = ["m"]
"#;

#[test]
fn bad_problem_files_name_file_and_field() {
    // A good file first: the errors below come from the one change each makes.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.toml"), PROFILE).unwrap();
    assert!(AnyProblem::parse(PROTEUS, "problem.toml", dir.path()).is_ok());

    assert_eq!(error("kind = \"proteus\""), "problem.toml: version: required (version = 1)");
    assert_eq!(error(&PROTEUS.replace("version = 1", "version = 2")), "problem.toml: version: expected 1, got 2");
    assert_eq!(
        error(&PROTEUS.replace("\"proteus\"", "\"nexus\"")),
        "problem.toml: kind: `nexus`: expected \"proteus\", \"infadapter\" or \"loki\""
    );
    let e = error(&PROTEUS.replace("count = 2", "count = 2\ncores = 3"));
    assert!(e.starts_with("problem.toml: TOML parse error") && e.contains("unknown field `cores`"), "{e}");
    assert_eq!(
        error(&PROTEUS.replace("slo_ms = 100", "slo_ms = -1")),
        "problem.toml: app.a.slo_ms: expected a positive number of milliseconds, at most 3600000"
    );
    assert_eq!(
        error(&PROTEUS.replace("[\"m\"]", "[\"nope\"]")),
        "problem.toml: app.a.models: `nope` is in no device profile"
    );
    let e = error(&PROTEUS.replace("p.toml", "missing.toml"));
    assert!(e.starts_with("problem.toml: device.cpu.profile: ") && e.contains("missing.toml"), "{e}");
    assert_eq!(
        error(&format!("{PROTEUS}[solver]\ntime_limit_s = 0\n")),
        "problem.toml: solver: time_limit_s: expected a positive number of seconds, at most 86400"
    );
    let infadapter =
        "version = 1\nkind = \"infadapter\"\ncapacity = \"cap-capacity.toml\"\ndemand_rps = 10\ncores = 4\n";
    assert!(AnyProblem::parse(infadapter, "problem.toml", dir.path()).is_err(), "no capacity file in that dir");
    assert_eq!(
        error(&infadapter.replace("cores = 4", "cores = 0")),
        "problem.toml: cores: expected a budget of 1 to 4096 cores"
    );
    assert_eq!(
        error(&format!("{infadapter}current = {{ x = 2 }}\n")),
        "problem.toml: current: `x` is not one of the models"
    );
    let e = error(&format!("{infadapter}models = [\"q\"]\n"));
    assert!(
        e.starts_with("problem.toml: models: `q` is not in the capacity table (") && e.ends_with("cap-capacity.toml)"),
        "{e}"
    );
}

/// A problem file's text in a directory with the test profile and capacity table.
fn allocate(text: &str) -> sluice_alloc::Allocation {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.toml"), PROFILE).unwrap();
    let p = AnyProblem::parse(text, "problem.toml", dir.path()).unwrap();
    Allocator::default().allocate(&p)
}

#[test]
fn every_number_has_a_range_checked_where_it_is_parsed() {
    // Each was a panic, an abort or a multi-gigabyte allocation (issue 40, item 4):
    // count = 0 panicked inside the HiGHS bindings, 1e8 devices or 4e9 cores were
    // models of gigabytes, 100,000 threads aborted with std::bad_alloc, and 1e300
    // requests/s reached HiGHS.
    let proteus = |from: &str, to: &str| error(&PROTEUS.replace(from, to));
    let remove = "(a type with none is a mistake: remove its [[device]])";
    assert_eq!(
        proteus("count = 2", "count = 0"),
        format!("problem.toml: device.cpu.count: expected 1 to 10000 devices {remove}")
    );
    assert_eq!(
        proteus("count = 2", "count = 100000000"),
        format!("problem.toml: device.cpu.count: expected 1 to 10000 devices {remove}")
    );
    let e = proteus("count = 2", "count = 1e8");
    assert!(e.starts_with("problem.toml: TOML parse error") && e.contains("count"), "{e}");
    // 10,000 of one type and 1 of another: too many together.
    let two = format!("{}[[device]]\ntype = \"gpu\"\ncount = 1\nprofile = \"p.toml\"\n", PROTEUS)
        .replace("count = 2", "count = 10000");
    assert_eq!(error(&two), "problem.toml: device: 10001 devices in all: expected at most 10000");
    assert_eq!(
        error(&format!("formulation = \"per-device\"\n{}", PROTEUS.replace("count = 2", "count = 1001")))
            .replace("problem.toml: ", ""),
        "device: 1001 devices in all: expected at most 1000 with formulation = \"per-device\""
    );
    assert_eq!(
        proteus("demand_qps = 10", "demand_qps = 1e300"),
        "problem.toml: app.a.demand_qps: expected a number of requests/s from 0 to 1e9"
    );
    assert_eq!(
        proteus("demand_qps = 10", "demand_qps = nan"),
        "problem.toml: app.a.demand_qps: expected a number of requests/s from 0 to 1e9"
    );
    assert_eq!(
        proteus("slo_ms = 100", "slo_ms = 1e300"),
        "problem.toml: app.a.slo_ms: expected a positive number of milliseconds, at most 3600000"
    );
    assert_eq!(
        proteus("count = 2", "count = 2\nmemory_mb = 1e300"),
        "problem.toml: device.cpu.memory_mb: expected a positive number of MB, at most 1e9"
    );
    assert_eq!(
        proteus("models = [\"m\"]", "models = [\"m\"]\nmemory_mb = { m = inf }"),
        "problem.toml: app.a.memory_mb: m: expected a positive number of MB, at most 1e9"
    );
    assert_eq!(
        error(&format!("batch_sizes = [1, 100000]\n{PROTEUS}")),
        "problem.toml: batch_sizes: expected 1 to 64 batch sizes of 1 to 4096 each"
    );
    assert_eq!(
        error(&format!("{PROTEUS}[ladder]\nbeta = 1e9\n")),
        "problem.toml: ladder: expected beta in (0, 10], step in (0, 1] and min_beta from 0 to below beta"
    );
    let solver = |line: &str| error(&format!("{PROTEUS}[solver]\n{line}\n"));
    assert_eq!(solver("threads = 100000"), "problem.toml: solver: threads: expected 1 to 256 threads");
    assert_eq!(solver("threads = 0"), "problem.toml: solver: threads: expected 1 to 256 threads");
    assert_eq!(
        solver("time_limit_s = 1e12"),
        "problem.toml: solver: time_limit_s: expected a positive number of seconds, at most 86400"
    );
    assert_eq!(solver("mip_gap = 2"), "problem.toml: solver: mip_gap: expected a fraction from 0 to 1");

    let infadapter =
        "version = 1\nkind = \"infadapter\"\ncapacity = \"cap-capacity.toml\"\ndemand_rps = 10\ncores = 4\n";
    let inf = |from: &str, to: &str| error(&infadapter.replace(from, to));
    assert_eq!(inf("cores = 4", "cores = 4000000000"), "problem.toml: cores: expected a budget of 1 to 4096 cores");
    assert_eq!(
        inf("demand_rps = 10", "demand_rps = 1e300"),
        "problem.toml: demand_rps: expected a number of requests/s from 0 to 1e9"
    );
    assert_eq!(
        inf("cores = 4", "cores = 4\nfit_cpus = [1, 100000]"),
        "problem.toml: fit_cpus: expected 2 to 64 core counts of 1 to 4096 each"
    );
    assert_eq!(
        inf("cores = 4", "cores = 4\ncurrent = { r = 100000 }"),
        "problem.toml: current: r: expected 0 to 4096 cores"
    );
    assert_eq!(
        inf("cores = 4", "cores = 4\n[weights]\nloading = 1e300"),
        "problem.toml: weights: expected weights from 0 to 1e6"
    );
    assert_eq!(
        inf("cores = 4", "cores = 4\ncapacity_coef = 1e300"),
        "problem.toml: capacity_coef: expected a positive factor, at most 1e6"
    );
}

#[test]
fn a_problem_no_device_can_serve_is_a_typed_error_naming_the_app() {
    // An SLO below every latency: no variant on any device. This panicked inside the
    // HiGHS bindings (a model with no columns) and `sluice allocate` exited 101.
    let a = allocate(&PROTEUS.replace("slo_ms = 100", "slo_ms = 5"));
    assert!(a.plan.is_none(), "{a:?}");
    assert_eq!(
        a.error.as_deref(),
        Some("app a: no device can serve it: its fastest variant, `m` on `cpu`, takes 10.0 ms at batch 1, not under half its SLO of 5 ms")
    );
    // One app that fits nowhere beside one that fits: the feasible one is planned as
    // usual, the other planned as absent (all its demand shed) and named, with why.
    let two = format!("{PROTEUS}[[app]]\nname = \"tight\"\nslo_ms = 15\ndemand_qps = 7\nmodels = [\"m\"]\n");
    let a = allocate(&two);
    assert_eq!(a.error, None, "{a:?}");
    let Some(sluice_alloc::AnyPlan::Proteus(plan)) = &a.plan else { panic!("a plan: {a:?}") };
    let alone = allocate(PROTEUS);
    let Some(sluice_alloc::AnyPlan::Proteus(alone)) = &alone.plan else { panic!("a plan: {alone:?}") };
    assert_eq!(plan.routes, alone.routes, "the feasible app is planned as if alone");
    let (served, tight) = (&plan.apps[0], &plan.apps[1]);
    assert_eq!((served.served_qps, served.shed_qps, served.unservable.as_deref()), (10.0, 0.0, None));
    assert_eq!((tight.served_qps, tight.shed_qps), (0.0, 7.0));
    assert_eq!(
        tight.unservable.as_deref(),
        Some("its fastest variant, `m` on `cpu`, takes 10.0 ms at batch 1, not under half its SLO of 15 ms")
    );
    assert!(plan.routes.iter().all(|r| r.app == "a") && plan.devices.iter().all(|d| d.app.as_deref() != Some("tight")));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.toml"), PROFILE).unwrap();
    let AnyProblem::Proteus(p) = AnyProblem::parse(&two, "problem.toml", dir.path()).unwrap() else { unreachable!() };
    for formulation in [sluice_alloc::proteus::Formulation::Aggregated, sluice_alloc::proteus::Formulation::PerDevice] {
        let out = sluice_alloc::proteus::solve(&sluice_alloc::proteus::Problem { formulation, ..p.clone() }).unwrap();
        assert_eq!(out.shed.iter().map(|s| s.app.as_str()).collect::<Vec<_>>(), ["tight"]);
        // The same served demand and accuracy (the per-device MILP may leave another
        // device busy: idle devices cost nothing).
        assert_eq!(out.plan.expect("planned").apps, plan.apps, "{formulation:?}");
    }
    // Every app unservable: the error names the first.
    let both = two.replace("slo_ms = 100", "slo_ms = 5");
    assert!(allocate(&both).error.as_deref().is_some_and(|e| e.starts_with("app a: no device can serve it")));
    // Memory: the variant runs fast enough but fits no device.
    let big = PROTEUS
        .replace("count = 2", "count = 2\nmemory_mb = 100")
        .replace("models = [\"m\"]", "models = [\"m\"]\nmemory_mb = { m = 200 }");
    assert_eq!(
        allocate(&big).error.as_deref(),
        Some("app a: no device can serve it: none of its variants fits the memory of a device type with devices")
    );

    // A problem built in code, where nothing checked the counts: every count 0.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.toml"), PROFILE).unwrap();
    let AnyProblem::Proteus(mut p) = AnyProblem::parse(PROTEUS, "problem.toml", dir.path()).unwrap() else {
        unreachable!()
    };
    p.devices[0].count = 0;
    for formulation in [sluice_alloc::proteus::Formulation::Aggregated, sluice_alloc::proteus::Formulation::PerDevice] {
        p.formulation = formulation;
        let e = sluice_alloc::proteus::solve(&p).expect_err("refused");
        assert_eq!(e.to_string(), "no device: every device type has count 0");
    }
    let e = sluice_alloc::infaas::step(&p, None, &Default::default()).expect_err("refused");
    assert_eq!(e.to_string(), "no device: every device type has count 0");
}

#[test]
fn problems_built_in_code_are_checked_before_a_model_is_built() {
    // Past the file's checks (the simulator and the live host build problems), the
    // solves refuse the sizes that would be multi-gigabyte models or plans.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.toml"), PROFILE).unwrap();
    std::fs::write(dir.path().join("cap-capacity.toml"), CAPACITY).unwrap();
    let AnyProblem::Proteus(good) = AnyProblem::parse(PROTEUS, "problem.toml", dir.path()).unwrap() else {
        unreachable!()
    };
    let mut p = good.clone();
    p.devices[0].count = 100_000_000;
    let e = sluice_alloc::proteus::solve(&p).expect_err("refused").to_string();
    assert_eq!(e, "device: 100000000 devices in all: expected at most 10000");
    let mut p = good;
    p.apps[0].demand_qps = 1e300;
    let e = sluice_alloc::proteus::solve(&p).expect_err("refused").to_string();
    assert_eq!(e, "app a: demand_qps: expected a number of requests/s from 0 to 1e9");

    let text = "version = 1\nkind = \"infadapter\"\ncapacity = \"cap-capacity.toml\"\ndemand_rps = 10\ncores = 4\n";
    let AnyProblem::InfAdapter(good) = AnyProblem::parse(text, "problem.toml", dir.path()).unwrap() else {
        unreachable!()
    };
    let p = sluice_alloc::infadapter::Problem { budget_cores: 4_000_000_000, ..good.clone() };
    let e = sluice_alloc::infadapter::solve(&p).expect_err("refused").to_string();
    assert_eq!(e, "cores 4000000000 (min_cores 2): expected a budget of 1 to 4096 cores");
    let p = sluice_alloc::infadapter::Problem { demand_rps: f64::INFINITY, ..good };
    assert!(sluice_alloc::infadapter::solve(&p).is_err());
}

/// The paper's setup at 4× its size and 3× its demand (the issue's surge).
fn surge() -> sluice_alloc::proteus::Problem {
    let AnyProblem::Proteus(mut p) = AnyProblem::load(&root().join("examples/allocate/proteus-paper.toml")).unwrap()
    else {
        unreachable!()
    };
    for d in &mut p.devices {
        d.count *= 4;
    }
    for a in &mut p.apps {
        a.demand_qps *= 12.0;
    }
    p
}

#[test]
fn the_time_limit_bounds_the_whole_allocation() {
    use sluice_alloc::proteus::Origin;
    // Tiny limits: each allocation returns within about its limit (plus building
    // one model), always with a plan: a MILP's, or, when none found one in time, the
    // greedy plan, valid and marked as such (issue 34: never nothing).
    let mut greedy_seen = false;
    for limit in [1e-4, 0.02, 0.2] {
        let mut p = surge();
        p.solver.time_limit_s = limit;
        for search in [
            sluice_alloc::ladder::Search::Lexicographic,
            sluice_alloc::ladder::Search::Bisect,
            sluice_alloc::ladder::Search::Descend,
        ] {
            p.ladder.search = search;
            let t = std::time::Instant::now();
            let out = sluice_alloc::proteus::solve(&p).unwrap_or_else(|e| panic!("{limit} s {search:?}: {e}"));
            let secs = t.elapsed().as_secs_f64();
            assert!(secs < limit + 1.0, "{limit} s {search:?}: took {secs} s");
            let plan = out.plan.expect("a plan, never nothing");
            plan.check(&p).unwrap_or_else(|e| panic!("{limit} s {search:?}: {e}"));
            match &out.origin {
                Origin::Milp => {
                    assert!(out.timed_out || out.attempts.iter().all(|a| a.solve_seconds <= limit + 0.1));
                }
                Origin::Greedy { reason } => {
                    greedy_seen = true;
                    assert!(out.timed_out);
                    assert!(
                        reason.starts_with(&format!(
                            "no MILP found a plan within the allocation's time limit of {limit} s"
                        )),
                        "{reason}"
                    );
                }
                Origin::Repaired { .. } => panic!("no previous plan to repair"),
            }
        }
    }
    assert!(greedy_seen, "a limit of 0.1 ms left no MILP a plan: the greedy plan went untested");
    // The allocator repairs the plan in force when the time runs out with none.
    let mut p = surge();
    p.solver.time_limit_s = 1e-4;
    let mut allocator = Allocator::default();
    let first = allocator.allocate(&AnyProblem::Proteus(surge()));
    assert!(first.plan.is_some() && first.origin.is_none(), "{first:?}");
    for a in &mut p.apps {
        a.demand_qps *= 1.3;
    }
    let next = allocator.allocate(&AnyProblem::Proteus(p.clone()));
    assert!(next.status == "repaired" || next.status == "greedy", "{next:?}");
    assert!(next.is_new_plan() && next.error.is_none(), "{next:?}");
    let origin = next.origin.as_ref().expect("the origin is reported");
    assert_eq!(origin.name(), next.status);
    assert!(origin.reason().is_some_and(|r| r.contains("time limit")), "{origin:?}");
    let Some(sluice_alloc::AnyPlan::Proteus(plan)) = &next.plan else { panic!("a Proteus plan") };
    plan.check(&p).unwrap();
    assert!(plan.apps.iter().zip(&p.apps).all(|(a, b)| a.demand_qps == b.demand_qps), "planned for the new demand");
    let json = serde_json::to_value(&next).unwrap();
    assert_eq!(json["origin"]["kind"], next.status.as_str(), "{json}");
}

#[test]
fn a_greedy_plan_sheds_per_app() {
    use sluice_alloc::proteus::Origin;
    // The paper's setup with one app far beyond what every device could serve and a
    // limit no MILP meets: the greedy plan serves every app at least the plan's β
    // (the fraction the surging app's devices cover) and each as much more as its
    // devices allow, not every app the same fraction.
    let AnyProblem::Proteus(mut p) = AnyProblem::load(&root().join("examples/allocate/proteus-paper.toml")).unwrap()
    else {
        unreachable!()
    };
    p.solver.time_limit_s = 1e-6;
    p.apps[0].demand_qps = 1e8;
    let out = sluice_alloc::proteus::solve(&p).expect("a plan, never an error");
    assert!(matches!(out.origin, Origin::Greedy { .. }), "{:?}", out.origin);
    let plan = out.plan.expect("a plan");
    plan.check(&p).unwrap();
    let surging = &plan.apps[0];
    assert!(surging.shed_qps > 0.0 && surging.served_qps > 0.0, "{surging:?}");
    assert!(surging.served_qps >= surging.demand_qps * plan.beta - 1e-6, "{surging:?}");
    assert!(plan.beta < 0.01, "β {}", plan.beta);
    for a in &plan.apps {
        assert!(a.served_qps >= a.demand_qps * plan.beta - 1e-6, "{a:?} below β {}", plan.beta);
    }
    let full = plan.apps[1..].iter().filter(|a| a.shed_qps.abs() < 1e-6).count();
    assert!(full >= plan.apps.len() / 2, "{} of the other apps served in full: {:?}", full, plan.apps);
    // The per-device formulation gets the same answer.
    p.formulation = sluice_alloc::proteus::Formulation::PerDevice;
    let out = sluice_alloc::proteus::solve(&p).expect("a plan");
    assert!(matches!(out.origin, Origin::Greedy { .. }));
    out.plan.expect("a plan").check(&p).unwrap();
    // A fixed placement keeps its devices per (type, app) in the greedy plan.
    let mut pinned = p.clone();
    pinned.formulation = sluice_alloc::proteus::Formulation::Aggregated;
    let pins: Vec<Vec<u32>> = pinned
        .devices
        .iter()
        .map(|d| (0..pinned.apps.len()).map(|q| u32::from((q as u32) < d.count.min(9))).collect())
        .collect();
    pinned.pinned = Some(pins.clone());
    let out = sluice_alloc::proteus::solve(&pinned).expect("a plan");
    let plan = out.plan.expect("a plan");
    plan.check(&pinned).unwrap();
    // (A pin of an app with no variant on that type stays idle.)
    let got = plan.pins(&pinned);
    assert!(got.iter().flatten().zip(pins.iter().flatten()).all(|(g, p)| g <= p), "{got:?}");
    assert!(got.iter().flatten().sum::<u32>() >= 30, "{got:?}");
}
