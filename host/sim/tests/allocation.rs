//! The MILP allocator in virtual time: apps on `[[device]]`s start from the plan for
//! `[allocator] demand_qps` and re-plan from the simulated demand with the real
//! solver, deterministically.

// Not every test binary uses every fixture.
#[allow(dead_code)]
mod common;

use common::policies;
use sluice_sim::{run_experiment, Experiment};

const PROFILE: &str = r#"version = 1
name = "devices"
device = "virtual"
source = "hand-made"

[[model]]
name = "small"
accuracy = 0.6
accuracy_source = "test"
batch_sizes = [1, 2, 4, 8]
p50_us = [1000, 1250, 1750, 2750]
p95_us = [1000, 1250, 1750, 2750]
p99_us = [1000, 1250, 1750, 2750]

[[model]]
name = "large"
accuracy = 0.8
accuracy_source = "test"
batch_sizes = [1, 2, 4, 8]
p50_us = [4000, 5000, 7000, 11000]
p95_us = [4000, 5000, 7000, 11000]
p99_us = [4000, 5000, 7000, 11000]
"#;

fn experiment(dir: &std::path::Path) -> (Experiment, std::path::PathBuf) {
    std::fs::write(dir.join("p.toml"), PROFILE).unwrap();
    let app = |name: &str, rate: u32| {
        format!("[[app]]\nname = \"{name}\"\nslo_ms = 100\nworkers = 4\nrouter = \"weighted\"\nprofile = \"p.toml\"\nmax_batch = 8\npolicy = \"jellyfish\"\narrivals = {{ kind = \"poisson\", rate_qps = {rate} }}\n")
    };
    let text = format!(
        "version = 1\nname = \"alloc\"\nduration_s = 20\nbuiltin_policy_dir = \"{}\"\n[[device]]\ntype = \"cpu\"\ncount = 4\nprofile = \"p.toml\"\n[allocator]\nobjective = \"hardware-first\"\nperiod_s = 5\nthreshold = 0.5\n{}{}",
        policies().display(),
        app("a", 1500),
        app("b", 50)
    );
    let path = dir.join("e.toml");
    std::fs::write(&path, text).unwrap();
    Experiment::load(&path).unwrap()
}

#[test]
fn the_allocator_follows_the_simulated_demand() {
    let dir = tempfile::tempdir().unwrap();
    let (e, base) = experiment(dir.path());
    let out = run_experiment(&e, &base, false).unwrap();
    let a = out.results.iter().find(|r| r.app == "a").unwrap();
    let b = out.results.iter().find(|r| r.app == "b").unwrap();
    // The first plan was for 1 req/s each: the forecast's rise re-planned.
    assert!(a.replans.unwrap() >= 1, "{a:?}");
    // a's 1500 req/s need 3 devices of `large` (727 req/s each at batch 8): served,
    // most of it on time, by the most accurate variant (hardware scaling first).
    assert!(a.violation_rate < 0.1, "{a:?}");
    assert!(a.accuracy > 0.75, "{a:?}");
    assert!(b.violation_rate < 0.1, "{b:?}");
    // Deterministic: the same run again gives the same results.
    let again = run_experiment(&e, &base, false).unwrap();
    assert_eq!(serde_json::to_string(&out.results).unwrap(), serde_json::to_string(&again.results).unwrap());
}

#[test]
fn device_experiments_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    experiment(dir.path());
    let text = std::fs::read_to_string(dir.path().join("e.toml")).unwrap();
    let bad = text.replacen("workers = 4", "workers = 3", 1);
    let e = Experiment::parse(&bad, "e.toml", dir.path()).map(|_| ()).unwrap_err().to_string();
    assert_eq!(e, "e.toml: app.a.workers: with [[device]], one worker per device: expected 4");
}

#[test]
fn a_sweep_systems_allocator_keys_are_checked_and_named() {
    let dir = tempfile::tempdir().unwrap();
    experiment(dir.path());
    let text = std::fs::read_to_string(dir.path().join("e.toml")).unwrap();
    let with = |system: &str| format!("{text}\n[[sweep.systems]]\n{system}\n");
    let err =
        |system: &str| Experiment::parse(&with(system), "e.toml", dir.path()).map(|_| ()).unwrap_err().to_string();
    let e = err("label = \"X\"\nallocator = { replan = \"sometimes\" }");
    assert!(e.starts_with("e.toml: sweep.systems.X.allocator: unknown variant `sometimes`"), "{e}");
    let e = err("label = \"Y\"\nallocator = { period = 3 }");
    assert!(e.starts_with("e.toml: sweep.systems.Y.allocator: unknown field `period`"), "{e}");
    let e = err("label = \"Z\"\nmax_batch = 1\nallocator = { method = \"infaas-accuracy\", placement = \"fixed\" }");
    assert!(e.starts_with("e.toml: sweep.systems.Z: allocator.placement"), "{e}");
    // A good one runs under its label, with its keys over [allocator]'s.
    let e = Experiment::parse(&with("label = \"static\"\nallocator = { replan = \"never\" }"), "e.toml", dir.path())
        .unwrap();
    let runs = e.runs();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].policy_label, "static");
    assert_eq!(runs[0].allocator.replan, sluice_alloc::config::Replan::Never);
    assert_eq!(runs[0].allocator.objective, e.allocator.objective);
}
