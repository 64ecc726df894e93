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
        "problem.toml: app.a.slo_ms: expected a positive number of milliseconds"
    );
    assert_eq!(
        error(&PROTEUS.replace("[\"m\"]", "[\"nope\"]")),
        "problem.toml: app.a.models: `nope` is in no device profile"
    );
    let e = error(&PROTEUS.replace("p.toml", "missing.toml"));
    assert!(e.starts_with("problem.toml: device.cpu.profile: ") && e.contains("missing.toml"), "{e}");
    assert_eq!(
        error(&format!("{PROTEUS}[solver]\ntime_limit_s = 0\n")),
        "problem.toml: solver: time_limit_s: expected a positive number of seconds"
    );
    let infadapter =
        "version = 1\nkind = \"infadapter\"\ncapacity = \"cap-capacity.toml\"\ndemand_rps = 10\ncores = 4\n";
    assert!(AnyProblem::parse(infadapter, "problem.toml", dir.path()).is_err(), "no capacity file in that dir");
    assert_eq!(
        error(&infadapter.replace("cores = 4", "cores = 0")),
        "problem.toml: cores: expected a budget of at least 1 core"
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
