//! The simulator on small scenarios with hand-computed outcomes, determinism, and
//! overload detection. Policies are the real components (`cargo xtask policies`).

use std::path::Path;

mod common;

use common::{experiment, policies};
use sluice_sim::{run_experiment, stats::write_outputs};

#[test]
fn one_worker_fixed_latency_hand_computed() {
    let dir = tempfile::tempdir().unwrap();
    // Arrivals at 0, 1, 2 ms; batch 1 only; SLO 15 ms; expiry right at the deadline.
    // r0 runs 0–10 (on time), r1 runs 10–20 (deadline 16: late), r2's deadline 17 has
    // passed when the worker is free at 20: expired.
    let (e, base) = experiment(
        dir.path(),
        r#"duration_s = 0.003
weakly_hard = [1, 3]
[[app]]
name = "a"
slo_ms = 15
workers = 1
profile = "p.toml"
max_batch = 1
expire_after_ms = 0
policy = "fixed"
params = { model = "m" }
arrivals = { kind = "uniform", rate_qps = 1000 }
"#,
    );
    let out = run_experiment(&e, &base, false).unwrap();
    let r = &out.results[0];
    assert_eq!((r.requests, r.on_time, r.late, r.dropped), (3, 1, 1, 1), "{r:?}");
    assert_eq!(r.dropped_by_reason[&sluice_core::queue::DropReason::Expired], 1);
    assert!((r.accuracy - 0.7).abs() < 1e-12);
    assert!((r.violation_rate - 2.0 / 3.0).abs() < 1e-12);
    assert_eq!(r.max_consecutive_misses, 2);
    assert_eq!(r.max_consecutive_drops, 1);
    assert_eq!(r.batch_sizes.get(&1), Some(&2));
    let wh = r.weakly_hard.as_ref().unwrap();
    assert_eq!((wh.worst_misses_in_window, wh.held), (2, false));
}

#[test]
fn batching_follows_the_policy_and_the_profile() {
    let dir = tempfile::tempdir().unwrap();
    // Every 5 ms for 20 ms (4 requests), SLO 30 ms, batches up to 2 at 12 ms:
    // r0 alone at 0 (done 12); r1, r2 queued (5, 10) go together 12–24; r3 (15) runs
    // 24–36 (deadline 45). All on time; batches {1: 2, 2: 1}.
    let (e, base) = experiment(
        dir.path(),
        r#"duration_s = 0.02
[[app]]
name = "a"
slo_ms = 30
workers = 1
profile = "p.toml"
policy = "fixed"
params = { model = "m" }
arrivals = { kind = "uniform", rate_qps = 200 }
"#,
    );
    let r = &run_experiment(&e, &base, false).unwrap().results[0];
    assert_eq!((r.requests, r.on_time), (4, 4), "{r:?}");
    assert_eq!(r.batch_sizes, [(1, 2), (2, 1)].into_iter().collect());
    assert_eq!(r.model_mix["m"], 4);
}

#[test]
fn same_seed_same_bytes_and_sweeps_expand() {
    let dir = tempfile::tempdir().unwrap();
    let body = r#"duration_s = 2
latency = "sampled"
seed = 7
[[app]]
name = "a"
slo_ms = 40
workers = 4
router = "shortest-queue"
profile = "p.toml"
policy = "jellyfish"
arrivals = { kind = "poisson", rate_qps = 200 }
[sweep]
load_qps = [100, 300]
policies = [{ policy = "jellyfish" }, { policy = "fixed", params = { model = "m" }, label = "fixed-m" }]
"#;
    let (e, base) = experiment(dir.path(), body);
    assert_eq!(e.runs().len(), 4);
    let a = run_experiment(&e, &base, false).unwrap();
    let b = run_experiment(&e, &base, false).unwrap();
    write_outputs(&dir.path().join("a"), &a).unwrap();
    write_outputs(&dir.path().join("b"), &b).unwrap();
    for f in ["results.json", "results.csv", "timeseries.csv", "windows.json"] {
        let x = std::fs::read(dir.path().join("a").join(f)).unwrap();
        let y = std::fs::read(dir.path().join("b").join(f)).unwrap();
        assert!(x == y, "{f} differs between two runs of the same experiment");
    }
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("a/summary.json")).unwrap()).unwrap();
    let first = &summary[0];
    for key in ["policy", "workers", "load_qps", "requests", "accuracy", "violation_rate", "dropped", "wall_seconds"] {
        assert!(first.get(key).is_some(), "summary.json lacks {key}");
    }
    assert_eq!(a.results[3].policy, "fixed-m");
    assert!(a.results[1].requests > a.results[0].requests * 2, "the sweep changes the load");
    // Another seed gives other arrivals.
    let (mut e2, base2) = experiment(dir.path(), body);
    e2.seed = 8;
    let c = run_experiment(&e2, &base2, false).unwrap();
    assert_ne!(c.results[0].requests, 0);
    assert!(a.results.iter().zip(&c.results).any(|(x, y)| x.requests != y.requests));
}

#[test]
fn an_overloaded_run_says_so() {
    let dir = tempfile::tempdir().unwrap();
    // 1000 req/s into one worker that serves 100/s, requests never expire.
    let (e, base) = experiment(
        dir.path(),
        r#"duration_s = 10
max_queue = 50
[[app]]
name = "a"
slo_ms = 20
workers = 1
profile = "p.toml"
max_batch = 1
expire_after_ms = 1e9
policy = "fixed"
params = { model = "m" }
arrivals = { kind = "uniform", rate_qps = 1000 }
"#,
    );
    let r = &run_experiment(&e, &base, false).unwrap().results[0];
    let why = r.overloaded.as_deref().expect("overload reported");
    assert!(why.contains("max_queue = 50"), "{why}");
    assert!(r.requests > 0);
}

#[test]
fn model_switching_table_matches_the_reference_away_from_boundaries() {
    use sluice_sim::model_switching::{build, read_reference, BuildArgs, Setup};
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let reference =
        read_reference(&root.join(
            "../shared/data/ramsis/model_switching_tables/image_cloud_cpu_ModelSwitching_instances-60_150ms_0.01",
        ))
        .unwrap();
    let pareto = common::PARETO_MODELS;
    let args = BuildArgs {
        profile: root.join("profiles/ramsis-image-cpu.toml"),
        models: pareto.iter().map(|s| s.to_string()).collect(),
        slo_ms: 150.0,
        workers: 60,
        // Loads whose reference choice is not at a boundary between two models.
        loads: vec![200.0, 600.0, 1600.0, 2200.0, 3400.0],
        duration: 20.0,
        threshold: 0.01,
        max_batch: 32,
        seed: 1,
        policies: policies(),
        out: None,
        compare: None,
        // sluice's own setting; the artifact's is tested in tests/reference.rs.
        setup: Setup::Sluice,
    };
    let table = build(&args).unwrap();
    for (load, model) in table {
        // Reference indices are 1-based in increasing latency order, which is `pareto`'s.
        let expected = pareto[reference[&(load as u64)] - 1];
        assert_eq!(model, expected, "at {load} req/s");
    }
}

/// RAMSIS generating its own policies in the loop (in `init` and in the
/// background, shared by the workers through the binding's store) gives
/// byte-identical results run after run, and the background generation changes
/// what it decides.
#[test]
fn ramsis_generating_in_the_loop_is_deterministic() {
    let dir = tempfile::tempdir().unwrap();
    let profile = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../profiles/ramsis-image-cpu.toml");
    let body = |slice_work: u32| {
        format!(
            r#"duration_s = 20
seed = 3
[[app]]
name = "image"
slo_ms = 150
workers = 8
profile = "{}"
models = ["shufflenet_v2_x0_5", "mobilenet_v3_large", "efficientnet_b0", "efficientnet_b2", "efficientnet_b3"]
max_batch = 12
policy = "ramsis"
params = {{ discretization = "fld:20", max_queue = 12, slice_work = {slice_work} }}
arrivals = {{ kind = "poisson", rate_qps = 300 }}
"#,
            profile.display()
        )
    };
    let (e, base) = experiment(dir.path(), &body(50_000));
    let a = run_experiment(&e, &base, false).unwrap();
    let b = run_experiment(&e, &base, false).unwrap();
    write_outputs(&dir.path().join("a"), &a).unwrap();
    write_outputs(&dir.path().join("b"), &b).unwrap();
    for f in ["results.json", "timeseries.csv"] {
        let x = std::fs::read(dir.path().join("a").join(f)).unwrap();
        let y = std::fs::read(dir.path().join("b").join(f)).unwrap();
        assert!(x == y, "{f} differs between two runs");
    }
    assert_eq!(a.results[0].faults, 0);
    let (e0, base0) = experiment(dir.path(), &body(0));
    let frozen = run_experiment(&e0, &base0, false).unwrap();
    assert_ne!(
        a.results[0].accuracy, frozen.results[0].accuracy,
        "the policy generated in the background for ~315 QPS decides differently from the 90%-capacity one"
    );
}
