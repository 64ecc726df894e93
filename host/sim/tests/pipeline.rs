//! Pipelines in virtual time (`sluice_sim::pipeline`): fan-out accounting, early-drop
//! modes on a small hand-checkable pipeline, determinism by seed, and the relations
//! the Loki experiments reproduce, on shortened versions of their files.

#[allow(dead_code)] // the shared fixtures also serve the single-app tests
mod common;

use std::path::{Path, PathBuf};

use sluice_sim::pipeline::{run_pipeline_experiment, PipelineExperiment, PipelineResult};

/// detect {d (acc 1.0): 10 ms at batch 1, 12 ms at batch 2} → classify {fast (acc 0.5):
/// 5 ms, slow (acc 1.0): 20 ms at batch 1, 24 ms at batch 2}; every detection makes
/// exactly two classify requests.
const PROFILE: &str = r#"version = 1
name = "pipeline-test"
device = "virtual"
source = "hand-made"

[[model]]
name = "d"
accuracy = 1.0
accuracy_source = "test"
batch_sizes = [1, 2]
p50_us = [10000, 12000]
p95_us = [10000, 12000]
p99_us = [10000, 12000]

[[model]]
name = "fast"
accuracy = 0.5
accuracy_source = "test"
batch_sizes = [1, 2]
p50_us = [5000, 6000]
p95_us = [5000, 6000]
p99_us = [5000, 6000]

[[model]]
name = "slow"
accuracy = 1.0
accuracy_source = "test"
batch_sizes = [1, 2]
p50_us = [20000, 24000]
p95_us = [20000, 24000]
p99_us = [20000, 24000]
"#;

fn small(dir: &Path, system: &str, load_qps: f64, workers: u32, slo_ms: f64, seed: u64) -> PipelineExperiment {
    std::fs::write(dir.join("p.toml"), PROFILE).unwrap();
    let text = format!(
        r#"version = 1
name = "t"
seed = {seed}
duration_s = 10
builtin_policy_dir = "{policies}"
profile = "p.toml"

[pipeline]
slo_ms = {slo_ms}
workers = {workers}
arrivals = {{ kind = "poisson", rate_qps = {load_qps} }}
batch_sizes = [1, 2]
system = {system}

[[pipeline.task]]
name = "detect"
models = ["d"]
fanout.d = {{ factor = 2.0 }}

[[pipeline.task]]
name = "classify"
models = ["fast", "slow"]

[[pipeline.edge]]
from = "detect"
to = "classify"
"#,
        policies = common::policies().display()
    );
    let path = dir.join("e.toml");
    std::fs::write(&path, text).unwrap();
    PipelineExperiment::load(&path).unwrap().0
}

fn run(exp: &PipelineExperiment, base: &Path) -> Vec<PipelineResult> {
    run_pipeline_experiment(exp, base).unwrap().results
}

fn check_accounting(r: &PipelineResult) {
    assert_eq!(r.finished, r.requests, "every client request finishes exactly once: {r:?}");
    assert!(r.overloaded.is_none(), "{:?}", r.overloaded);
    for t in &r.tasks {
        assert_eq!(t.created, t.served + t.dropped_total(), "task {}: created = served + dropped: {t:?}", t.task);
    }
    // Every classify request came from a served detection, two each.
    let detect = &r.tasks[0];
    assert_eq!(r.tasks[1].created, 2 * detect.served);
    assert_eq!(r.fanout.len(), 1);
    assert_eq!((r.fanout[0].measured, r.fanout[0].expected), (2.0, 2.0));
    assert_eq!(r.on_time + r.clients_with_drops + r.clients_late, r.requests);
    // The fewest workers any plan used: never the 0 of the instant before the first plan.
    assert!(r.workers_min >= 1 && r.workers_min <= r.workers_max, "{} ..= {}", r.workers_min, r.workers_max);
}

#[test]
fn fanout_accounting_holds_under_light_and_heavy_load() {
    let dir = tempfile::tempdir().unwrap();
    for (load, workers) in [(20.0, 4), (400.0, 3)] {
        let sys = r#"{ allocator = "loki", params = { allocated = true } }"#;
        let exp = small(dir.path(), sys, load, workers, 100.0, 1);
        let r = &run(&exp, dir.path())[0];
        check_accounting(r);
        assert!(r.requests > 100);
        if load < 100.0 {
            // Light load: the MILP's most accurate plan (d → slow), every path 1.0.
            // (Bursts of two into one classify worker still make a few late.)
            assert!(r.violation_ratio < 0.1, "{r:?}");
            assert!((r.accuracy - 1.0).abs() < 1e-9, "{}", r.accuracy);
        } else {
            // Overload: something is dropped, and accuracy scaling used `fast`.
            assert!(r.drops.values().sum::<u64>() > 0, "{r:?}");
            assert!(r.accuracy < 1.0);
        }
    }
}

#[test]
fn early_drop_modes_drop_only_for_their_own_reasons() {
    let dir = tempfile::tempdir().unwrap();
    let mut violations = Vec::new();
    for mode in ["none", "last-task", "per-task", "rerouting"] {
        // Hardware scaling on 3 workers at 150 req/s: queues build at detect, so
        // requests leave it over budget.
        let sys =
            format!(r#"{{ allocator = "hardware-only", early_drop = "{mode}", params = {{ allocated = true }} }}"#);
        let exp = small(dir.path(), &sys, 150.0, 3, 100.0, 3);
        let r = run(&exp, dir.path()).remove(0);
        check_accounting(&r);
        let causes: Vec<&str> = r.drops.keys().map(String::as_str).collect();
        let allowed: &[&str] = match mode {
            "none" => &["expired", "policy"],
            "last-task" => &["expired", "policy", "early-drop-no-time-left"],
            "per-task" => &["expired", "policy", "early-drop-over-budget"],
            _ => &["expired", "policy", "early-drop-no-faster-worker"],
        };
        assert!(causes.iter().all(|c| allowed.contains(c)), "{mode}: {causes:?}");
        if mode != "none" {
            assert!(
                r.drops.keys().any(|c| !["expired", "policy"].contains(&c.as_str())),
                "{mode} dropped nothing early"
            );
        }
        // Early drops happen on the way into classify, never into the root.
        assert!(r.tasks[0].dropped.keys().all(|c| c == "expired" || c == "policy"), "{mode}: {:?}", r.tasks[0]);
        assert_eq!(r.tasks[1].rerouted, 0, "{mode}: hardware-only hosts one classify variant, no faster backup");
        violations.push((mode, r.violation_ratio));
    }
    let none = violations[0].1;
    let per_task = violations[2].1;
    // Dropping a request's descendants early frees the workers for others: dropping
    // on the way in never makes more clients late than serving everything late.
    assert!(per_task <= none + 1e-9, "{violations:?}");
}

/// `early_drop_at = "batch"` (the reference's `pop_while_first_expires`): a worker
/// forming a batch drops the queued requests that would finish past their task
/// deadline, before they run. Latencies here are the profile's, so a request that was
/// not dropped at formation is never late at its task; per-task and rerouting act at
/// both tasks, last-task only at `classify` (the last model task), none never.
#[test]
fn dropping_at_batch_formation_leaves_no_request_late_at_its_task() {
    let dir = tempfile::tempdir().unwrap();
    let mut at = Vec::new();
    for mode in ["none", "last-task", "per-task", "rerouting"] {
        let sys = format!(
            r#"{{ allocator = "hardware-only", early_drop = "{mode}", early_drop_at = "batch", params = {{ allocated = true }} }}"#
        );
        let exp = small(dir.path(), &sys, 150.0, 3, 100.0, 3);
        let r = run(&exp, dir.path()).remove(0);
        check_accounting(&r);
        assert!(r.system.ends_with("@batch"), "{}", r.system);
        assert_eq!(r.early_drop_at, "batch");
        let formation = |t: usize| r.tasks[t].dropped.get("early-drop-batch-formation").copied().unwrap_or(0);
        match mode {
            "none" => assert_eq!((formation(0), formation(1)), (0, 0), "{r:?}"),
            "last-task" => {
                assert_eq!(formation(0), 0, "last-task acts only at the last model task: {:?}", r.tasks[0]);
                assert!(formation(1) > 0, "{:?}", r.tasks[1]);
                assert_eq!(r.tasks[1].late, 0, "{:?}", r.tasks[1]);
            }
            _ => {
                assert!(formation(0) > 0, "{mode}: {:?}", r.tasks[0]);
                assert_eq!((r.tasks[0].late, r.tasks[1].late), (0, 0), "{mode}: {:?}", r.tasks);
            }
        }
        at.push((mode, r.violation_ratio, r.tasks[0].late));
    }
    // Without it, detect does serve requests late at this load (what the drops avoid).
    assert!(at[0].2 > 0, "{at:?}");
}

/// One run of the small pipeline per system at `load_qps` on `workers` (SLO
/// `slo_ms`, `seed`), every run's accounting checked.
fn checked_runs(systems: &[String], load_qps: f64, workers: u32, slo_ms: f64, seed: u64) -> Vec<PipelineResult> {
    let dir = tempfile::tempdir().unwrap();
    systems
        .iter()
        .map(|sys| {
            let r = run(&small(dir.path(), sys, load_qps, workers, slo_ms, seed), dir.path()).remove(0);
            check_accounting(&r);
            r
        })
        .collect()
}

/// The rerouting scenario below (150 req/s on 4 workers, accuracy scaling, SLO 100 ms,
/// seed 5) under each system.
fn rerouting_runs(systems: &[String]) -> Vec<PipelineResult> {
    checked_runs(systems, 150.0, 4, 100.0, 5)
}

/// Loki §5.2: a request over its budget by x is sent to a downstream worker with
/// capacity left that executes within y − x, and dropped only when there is none.
/// At 150 req/s on 4 workers accuracy scaling hosts one detect worker (≈ 90% busy, so
/// many detections leave it a little over their 24 ms budget), `slow` classifiers
/// (24 ms at batch 2) that MostAccurateFirst fills first and a `fast` one (6 ms) with
/// capacity left: a request up to 18 ms late is rerouted to `fast`. The experiment
/// files' routing headroom (80%) and β = 1.2 are used, under which the backup table
/// used to be empty (leftovers were measured against the cut capacities).
#[test]
fn rerouting_fires_where_a_faster_worker_has_capacity_left() {
    let runs = rerouting_runs(&["per-task", "rerouting"].map(|mode| {
        format!(
            r#"{{ allocator = "accuracy-only", early_drop = "{mode}", params = {{ allocated = true }}, beta = 1.2, routing_utilization = 0.8 }}"#
        )
    }));
    let (per_task, rerouting) = (&runs[0], &runs[1]);
    let early = |r: &PipelineResult, cause: &str| r.drops.get(cause).copied().unwrap_or(0);
    assert!(early(per_task, "early-drop-over-budget") > 0, "the setting must make requests late: {per_task:?}");
    assert!(rerouting.tasks[1].rerouted > 0, "nothing rerouted: {rerouting:?}");
    assert_eq!(per_task.tasks[1].rerouted, 0);
    // Every rerouted request is one per-task dropping would have dropped.
    assert!(
        early(rerouting, "early-drop-no-faster-worker") < early(per_task, "early-drop-over-budget"),
        "rerouting dropped {} early, per-task {}",
        early(rerouting, "early-drop-no-faster-worker"),
        early(per_task, "early-drop-over-budget")
    );
    // Rerouted requests run on the less accurate worker.
    assert!(rerouting.accuracy < 1.0);
}

#[test]
fn a_run_is_a_function_of_its_seed() {
    let dir = tempfile::tempdir().unwrap();
    let sys = r#"{ allocator = "loki", params = { allocated = true } }"#;
    let json = |seed| {
        let exp = small(dir.path(), sys, 200.0, 4, 100.0, seed);
        let out = run_pipeline_experiment(&exp, dir.path()).unwrap();
        let mut r = out.results;
        r.iter_mut().for_each(|r| r.solve_seconds = 0.0);
        (serde_json::to_string(&r).unwrap(), serde_json::to_string(&out.timeseries).unwrap())
    };
    let a = json(7);
    assert_eq!(a, json(7));
    assert_ne!(a.0, json(8).0);
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/experiments")
}

/// Experiment 1, shortened: past what the most accurate variants serve on 20 workers,
/// Loki's accuracy scaling keeps serving; hardware scaling alone does not.
#[test]
fn loki_serves_more_than_hardware_scaling_alone() {
    let (mut exp, base) = PipelineExperiment::load(&examples().join("loki-capacity.toml")).unwrap();
    exp.builtin_policy_dir = common::policies();
    exp.duration_s = 8.0;
    exp.sweep.load_qps = vec![300.0];
    let r = run(&exp, &base);
    let goodput = |r: &PipelineResult| r.on_time as f64 / r.requests as f64 * 300.0;
    let (loki, hw) = (&r[0], &r[1]);
    assert_eq!((loki.system.as_str(), hw.system.as_str()), ("Loki", "hardware-only"));
    assert!(goodput(loki) > 2.0 * goodput(hw), "Loki {} vs hardware-only {}", goodput(loki), goodput(hw));
    assert!(loki.accuracy < hw.accuracy, "Loki trades accuracy for capacity");
}

/// Experiment 1 on the social-media pipeline, shortened: at 400 req/s (over twice what
/// yolov5x and clip-vit-base-patch16 serve on 20 workers) Loki keeps serving with
/// faster variants; hardware scaling alone does not (Fig. 6, 2.7× effective capacity).
#[test]
fn loki_serves_more_than_hardware_scaling_alone_on_social_media() {
    let (mut exp, base) = PipelineExperiment::load(&examples().join("loki-social-capacity.toml")).unwrap();
    exp.builtin_policy_dir = common::policies();
    exp.duration_s = 8.0;
    exp.sweep.load_qps = vec![400.0];
    let r = run(&exp, &base);
    let goodput = |r: &PipelineResult| r.on_time as f64 / r.requests as f64 * 400.0;
    let (loki, hw) = (&r[0], &r[1]);
    assert_eq!((loki.system.as_str(), hw.system.as_str()), ("Loki", "hardware-only"));
    // Two sinks per image: the source's fan-out reaches both.
    assert_eq!(loki.tasks[1].created, loki.requests);
    assert_eq!(loki.tasks[2].created, loki.requests);
    assert!(goodput(loki) > 2.0 * goodput(hw), "Loki {} vs hardware-only {}", goodput(loki), goodput(hw));
    assert!(loki.accuracy < hw.accuracy, "Loki trades accuracy for capacity");
}

/// The Loki artifact's Proteus baseline: with `fill_cluster` every worker hosts a
/// variant from the first plan on (the idle ones upgraded to the most accurate), and
/// MostAccurateFirst routing fills the most accurate of them first.
#[test]
fn proteus_filling_the_cluster_uses_every_worker_and_routes_to_them() {
    let sys = |extra: &str| {
        format!(
            r#"{{ allocator = "proteus-per-task", policy = "proteus-batching", params = {{ margin_us = 0 }}{extra} }}"#
        )
    };
    let systems =
        ["", r#", fill_cluster = true"#, r#", fill_cluster = true, proteus_routing = "most-accurate-first""#].map(sys);
    let results = checked_runs(&systems, 20.0, 8, 100.0, 1);
    let (own, filled, maf) = (&results[0], &results[1], &results[2]);
    // 20 req/s needs one detect and one classify worker; Proteus's Eq. 1 leaves the rest idle.
    assert!(own.workers_max < 8, "{}", own.workers_max);
    for r in [filled, maf] {
        assert_eq!((r.workers_min, r.workers_max), (8, 8), "{}", r.system);
    }
    // MostAccurateFirst fills the most accurate classify workers: every result `slow`.
    assert!((maf.accuracy - 1.0).abs() < 1e-9, "{}", maf.accuracy);
}

#[test]
fn options_of_one_allocator_on_another_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.toml"), PROFILE).unwrap();
    // The refusal an experiment whose one system is `system` gets.
    let refusal = |system: &str| {
        let text = format!(
            "version = 1\nname = \"t\"\nduration_s = 1\nprofile = \"p.toml\"\n[pipeline]\nslo_ms = 100\nworkers = 2\n\
             arrivals = {{ kind = \"poisson\", rate_qps = 1 }}\nsystem = {system}\n\
             [[pipeline.task]]\nname = \"detect\"\nmodels = [\"d\"]\n"
        );
        PipelineExperiment::parse(&text, "e.toml").unwrap_err().to_string()
    };
    for (key, value) in [("fill_cluster", "true"), ("proteus_routing", r#""most-accurate-first""#)] {
        let err = refusal(&format!(r#"{{ allocator = "loki", {key} = {value} }}"#));
        assert!(err.contains(key) && err.contains("proteus-per-task"), "{err}");
    }
    // And the other way round: Loki's tie-break on Proteus.
    let err = refusal(r#"{ allocator = "proteus-per-task", tie_break = "headroom" }"#);
    assert!(err.contains("tie_break") && err.contains("Loki"), "{err}");
}

/// The artifact's rule moves requests that are ahead of their task deadline, at
/// batch formation, to a faster child worker with capacity left: every child of a
/// rerouted detection is counted as rerouted, accounting still holds, and the
/// rerouted children run on the less accurate worker.
#[test]
fn the_artifacts_rerouting_moves_requests_ahead_of_their_deadline() {
    let runs = rerouting_runs(&["paper", "artifact"].map(|rule| {
        format!(
            r#"{{ allocator = "accuracy-only", early_drop = "rerouting", early_drop_at = "batch", reroute_rule = "{rule}", params = {{ allocated = true }}, beta = 1.2, routing_utilization = 0.8 }}"#
        )
    }));
    let (paper, artifact) = (&runs[0], &runs[1]);
    // At batch formation nothing served is late, so §5.2's rule has nothing to move.
    assert_eq!(paper.tasks[1].rerouted, 0, "{paper:?}");
    assert!(artifact.tasks[1].rerouted > 0, "nothing rerouted: {artifact:?}");
    // Two children per detection, both rerouted together.
    assert_eq!(artifact.tasks[1].rerouted % 2, 0);
    assert!(artifact.accuracy < paper.accuracy, "{} vs {}", artifact.accuracy, paper.accuracy);
}

#[test]
fn the_artifacts_rerouting_rule_needs_rerouting_at_batch_formation() {
    let dir = tempfile::tempdir().unwrap();
    for sys in [
        r#"{ allocator = "loki", early_drop = "per-task", early_drop_at = "batch", reroute_rule = "artifact" }"#,
        r#"{ allocator = "loki", early_drop = "rerouting", reroute_rule = "artifact" }"#,
    ] {
        std::fs::write(dir.path().join("p.toml"), PROFILE).unwrap();
        let text = format!(
            "version = 1\nname = \"t\"\nduration_s = 1\nprofile = \"p.toml\"\n[pipeline]\nslo_ms = 100\nworkers = 2\n\
             arrivals = {{ kind = \"poisson\", rate_qps = 1 }}\nsystem = {sys}\n\
             [[pipeline.task]]\nname = \"detect\"\nmodels = [\"d\"]\n"
        );
        let err = PipelineExperiment::parse(&text, "e.toml").unwrap_err().to_string();
        assert!(err.contains("reroute_rule") && err.contains("early_drop_at"), "{err}");
    }
}

/// The Loki artifact's root: its executor sends each client request to the most
/// accurate root worker that keeps up with its queue (not by the client table), and
/// gives it SLO / depth (here 50 ms, against 2 × 12 ms at batch 2). Each cuts the
/// detections dropped at batch formation on a loaded root; accounting holds.
#[test]
fn the_artifacts_root_dispatch_and_budget_drop_fewer_detections() {
    let systems = ["", r#", root_dispatch = "queue-aware""#, r#", root_budget = "slo-per-stage""#].map(|root| {
        format!(
            r#"{{ allocator = "loki", early_drop = "per-task", early_drop_at = "batch", params = {{ allocated = true }}{root} }}"#
        )
    });
    let dropped: Vec<u64> =
        checked_runs(&systems, 300.0, 6, 100.0, 1).iter().map(|r| r.tasks[0].dropped_total()).collect();
    assert!(dropped[0] > 0, "the table-dispatched root drops nothing: the test shows nothing");
    assert!(dropped[1] < dropped[0], "queue-aware: {dropped:?}");
    assert!(dropped[2] < dropped[0], "SLO per stage: {dropped:?}");
}

/// The Loki artifact's tables: rebuilt only when a plan adds or removes a worker, and
/// sized by each worker's measured branching, 1 before it has measured any. On a
/// steady load the plan keeps its workers, so the tables are built fewer times than
/// plans are applied; the first build finds detect unmeasured and sizes classify's
/// tables for 1 request per detection where 2 come, so classify's most accurate
/// workers are fed past their capacity and more of its requests are dropped.
#[test]
fn the_artifacts_tables_are_built_on_worker_changes_for_measured_branching() {
    let systems = ["", r#", table_rebuild = "worker-change""#, r#", table_rebuild = "worker-change", branching = "measured""#]
        .map(|tables| {
            format!(
                r#"{{ allocator = "loki", early_drop = "per-task", early_drop_at = "batch", params = {{ allocated = true }}{tables} }}"#
            )
        });
    let runs = checked_runs(&systems, 300.0, 6, 100.0, 1);
    let builds: Vec<(u64, u64)> = runs.iter().map(|r| (r.table_builds, r.replans)).collect();
    assert_eq!(builds[0].0, builds[0].1, "every plan builds the tables by default: {builds:?}");
    for &(built, plans) in &builds[1..] {
        assert!(built >= 1 && built < plans, "worker-change: {builds:?}");
    }
    let dropped: Vec<u64> = runs.iter().map(|r| r.tasks[1].dropped_total()).collect();
    assert!(dropped[2] > dropped[1], "unmeasured branching taken as 1: {dropped:?}");
}

/// `children = "together"` (the live host's rule) lets an idle classify worker batch
/// a detection's two children; `one-by-one` (the Loki artifact's, the default) runs
/// the first alone and the second behind it. Same arrivals, same plans: the
/// together run serves classify in fewer, larger batches, so fewer of its requests
/// finish late at their task.
#[test]
fn children_queued_together_are_batched_together() {
    let dir = tempfile::tempdir().unwrap();
    let mut late = Vec::new();
    for children in ["one-by-one", "together"] {
        let sys = format!(r#"{{ allocator = "loki", params = {{ allocated = true }}, children = "{children}" }}"#);
        let exp = small(dir.path(), &sys, 20.0, 4, 100.0, 1);
        let r = run(&exp, dir.path()).remove(0);
        check_accounting(&r);
        late.push((children, r.tasks[1].late, r.tasks[1].served));
    }
    // 84 late of 370 one by one, 47 together (2026-11-27).
    assert_eq!(late[0].2, late[1].2, "the same classify requests served: {late:?}");
    assert!(late[1].1 < late[0].1, "classify late, one by one then together: {late:?}");
}
