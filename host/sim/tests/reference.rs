//! The baselines as the RAMSIS artifact runs them (docs/results/README.md, "The
//! baselines as the reference runs them"), on shortened runs: ModelSwitching's table
//! rebuilt as `MS_gen.py` builds it, the reference accounting, and what the artifact's
//! setting does to the baselines' violations under overload.

use std::path::{Path, PathBuf};

use sluice_sim::model_switching::{build, BuildArgs, Setup};
use sluice_sim::{run_experiment, stats::RunResult, Accounting, Experiment};

#[allow(dead_code)] // the shared fixtures also serve the other simulator tests
mod common;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn load(name: &str) -> (Experiment, PathBuf) {
    assert!(root().join("target/policies/model-switching.wasm").exists(), "run `cargo xtask policies` first");
    Experiment::load(&root().join("examples/experiments").join(name)).unwrap()
}

fn build_args(setup: Setup, loads: Vec<f64>, seed: u64) -> BuildArgs {
    BuildArgs {
        profile: root().join("profiles/ramsis-image-cpu.toml"),
        models: common::PARETO_MODELS.iter().map(|m| m.to_string()).collect(),
        slo_ms: 150.0,
        workers: 60,
        loads,
        // Shortened from the artifact's 300 s; these loads are far from a boundary.
        duration: 30.0,
        threshold: 0.01,
        max_batch: 32,
        seed,
        policies: root().join("target/policies"),
        out: None,
        compare: None,
        setup,
    }
}

/// The artifact's table for 60 workers, as `sluice model-switching convert` wrote it.
fn reference_table() -> Vec<(f64, String)> {
    let text = std::fs::read_to_string(root().join("examples/experiments/model-switching-image-60.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["table"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| (row[0].as_f64().unwrap(), row[1].as_str().unwrap().to_string()))
        .collect()
}

fn reference_at(load: f64) -> String {
    reference_table().into_iter().find(|(l, _)| *l == load).unwrap().1
}

#[test]
fn model_switching_build_reproduces_the_reference_table_where_the_old_setup_did_not() {
    // The artifact's setting: shared FIFO, its batch cap, no expiry, counted to the end.
    let table = build(&build_args(Setup::Reference, vec![400.0, 1200.0], 0)).unwrap();
    for (load, model) in &table {
        assert_eq!(model, &reference_at(*load), "{load} req/s");
    }
    // sluice's old setting (round-robin, deadline-sized batches) admits efficientnet_b0
    // at 1200 req/s, where the artifact's shared FIFO at its batch cap does not.
    let old = build(&build_args(Setup::Sluice, vec![1200.0], 1)).unwrap();
    assert_eq!(old[0].1, "efficientnet_b0");
    assert_eq!(reference_at(1200.0), "mobilenet_v3_large");
}

#[test]
fn the_reference_accounting_counts_what_was_taken_before_the_end() {
    // ModelSwitching's efficientnet_b0 at 1500 req/s on 60 workers overloads: with no
    // expiry a backlog is left when the arrivals end.
    let (mut e, base) = load("ramsis-constant.toml");
    e.duration_s = 10.0;
    e.sweep.load_qps = vec![1500.0];
    e.sweep.policies.retain(|p| p.label.as_deref() == Some("ModelSwitching"));
    // Planned for 1000 req/s (efficientnet_b0 in the table), offered 1500.
    e.sweep.policies[0].fixed_load = false;
    e.sweep.policies[0].params.as_mut().unwrap().insert("load_qps".into(), toml::Value::Float(1000.0));
    let r: RunResult = run_experiment(&e, &base, false).unwrap().results.remove(0);
    assert_eq!(r.accounting, Accounting::Reference);
    assert_eq!(r.dropped, 0, "nothing expires");
    assert!(r.reference_requests < r.requests, "{} of {} counted", r.reference_requests, r.requests);
    assert!(
        r.reference_violation_rate < r.sluice_violation_rate,
        "reference {} sluice {}",
        r.reference_violation_rate,
        r.sluice_violation_rate
    );
    assert_eq!((r.accuracy, r.violation_rate), (r.reference_accuracy, r.reference_violation_rate));
}

/// Issue 15 §2: on the Twitter trace at 60 workers (peaks above capacity) the
/// artifact's setting leaves Jellyfish+ and ModelSwitching with about half the
/// violations of sluice's old setting.
#[test]
fn the_artifacts_setting_halves_the_baselines_overload_violations_on_twitter() {
    let violations = |file: &str| {
        let (mut e, base) = load(file);
        e.sweep.workers = vec![60];
        e.sweep.policies.retain(|p| p.label.as_deref() != Some("RAMSIS"));
        let results = run_experiment(&e, &base, false).unwrap().results;
        let by = |p: &str| results.iter().find(|r| r.policy == p).unwrap().violation_rate;
        (by("Jellyfish+"), by("ModelSwitching"))
    };
    let (jf_ref, ms_ref) = violations("ramsis-twitter.toml");
    let (jf_old, ms_old) = violations("ramsis-twitter-sluice.toml");
    assert!(jf_ref < 0.6 * jf_old, "Jellyfish+: artifact's setting {jf_ref}, sluice's {jf_old}");
    assert!(ms_ref < 0.6 * ms_old, "ModelSwitching: artifact's setting {ms_ref}, sluice's {ms_old}");
    // Still well above 5%: the peak exceeds what 60 workers sustain.
    assert!(jf_ref > 0.05 && ms_ref > 0.05, "{jf_ref} {ms_ref}");
}

/// Proteus §6.4, Fig. 6, as a whole system (the MILP on the artifact's 40 devices)
/// on a shortened run: every batching does well on uniform arrivals, and on Poisson
/// arrivals Proteus's batching misses less than both Nexus variants and Clipper.
#[test]
fn proteus_batching_beats_nexus_on_poisson_arrivals_in_the_whole_system() {
    let violations = |file: &str| {
        let (mut e, base) = load(file);
        e.duration_s = 60.0;
        let results = run_experiment(&e, &base, false).unwrap().results;
        let mut by: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
        for r in &results {
            let x = by.entry(r.policy.clone()).or_default();
            x.0 += r.requests - r.on_time;
            x.1 += r.requests;
        }
        by.into_iter().map(|(p, (miss, n))| (p, miss as f64 / n as f64)).collect::<std::collections::BTreeMap<_, _>>()
    };
    let uniform = violations("proteus-fig6-uniform.toml");
    assert!(uniform.values().all(|v| *v < 0.001), "{uniform:?}");
    let poisson = violations("proteus-fig6-poisson.toml");
    for other in ["Nexus", "Nexus-WC", "Clipper"] {
        assert!(poisson["Proteus"] < poisson[other], "{poisson:?}");
    }
}
