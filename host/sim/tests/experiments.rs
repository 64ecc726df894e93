//! Each checked-in experiment's headline relation, on a shortened run: the files in
//! `examples/experiments/` are loaded and their `Experiment` struct shortened in code
//! (duration, sweep), then run with the real policy components.
//!
//! Results and the comparison with the papers: `docs/results/README.md`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sluice_core::profile::{Percentile, Profile};
use sluice_sim::{run_experiment, stats::RunResult, Experiment};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn load(name: &str) -> (Experiment, PathBuf) {
    assert!(root().join("target/policies/spread-drop.wasm").exists(), "run `cargo xtask policies` first");
    Experiment::load(&root().join("examples/experiments").join(name)).unwrap()
}

fn run(e: &Experiment, base: &Path) -> Vec<RunResult> {
    let out = run_experiment(e, base, false).unwrap();
    for r in &out.results {
        assert!(r.overloaded.is_none(), "run {} overloaded", r.run);
        assert_eq!(r.faults, 0, "run {} ({}): policy faults", r.run, r.policy);
    }
    out.results
}

/// Mean of `f` per (app, policy, load) over the seeds.
fn mean(results: &[RunResult], f: impl Fn(&RunResult) -> f64) -> BTreeMap<(String, String, u64), f64> {
    let mut acc: BTreeMap<(String, String, u64), (f64, f64)> = BTreeMap::new();
    for r in results {
        let e = acc.entry((r.app.clone(), r.policy.clone(), r.load_qps.unwrap_or(0.0) as u64)).or_default();
        e.0 += f(r);
        e.1 += 1.0;
    }
    acc.into_iter().map(|(k, (s, n))| (k, s / n)).collect()
}

/// Experiment 1 (RAMSIS §7.2) on a shortened run, every system run as the RAMSIS
/// artifact runs it: RAMSIS more accurate than both baselines at 800 and 2000 QPS and
/// far above Jellyfish+ at 2800 QPS, where ModelSwitching's table (the artifact's)
/// still names mobilenet_v3_large and matches RAMSIS; everything under 1% violations.
#[test]
fn ramsis_is_above_both_baselines_at_constant_load() {
    let (mut e, base) = load("ramsis-constant.toml");
    e.duration_s = 10.0;
    e.sweep.load_qps = vec![800.0, 2000.0, 2800.0];
    let results = run(&e, &base);
    let acc = mean(&results, |r| r.accuracy);
    let viol = mean(&results, |r| r.violation_rate);
    let at =
        |m: &BTreeMap<(String, String, u64), f64>, p: &str, load: u64| m[&("image".to_string(), p.to_string(), load)];
    for load in [800, 2000, 2800] {
        for p in ["RAMSIS", "Jellyfish+", "ModelSwitching"] {
            assert!(at(&viol, p, load) < 0.01, "{load} QPS: {p} violations {}", at(&viol, p, load));
        }
        let others: &[&str] = if load == 2800 { &["Jellyfish+"] } else { &["Jellyfish+", "ModelSwitching"] };
        for other in others {
            assert!(
                at(&acc, "RAMSIS", load) > at(&acc, other, load),
                "{load} QPS: accuracy RAMSIS {} {other} {}",
                at(&acc, "RAMSIS", load),
                at(&acc, other, load)
            );
        }
    }
    assert!(at(&acc, "RAMSIS", 2800) > at(&acc, "Jellyfish+", 2800) + 0.1);
    assert!((at(&acc, "RAMSIS", 2800) - at(&acc, "ModelSwitching", 2800)).abs() < 0.005);
    // The table sluice built before names shufflenet at 2800: 15 points lower.
    assert!(at(&acc, "ModelSwitching", 2800) > at(&acc, "ModelSwitching (sluice table)", 2800) + 0.14);
}

/// Experiment 2 (RAMSIS §7.1, Fig. 5) on the first 100 s of the Twitter trace at 80
/// workers, image and text: RAMSIS the most accurate, with no more violations.
#[test]
fn ramsis_is_above_both_baselines_on_the_twitter_trace() {
    for file in ["ramsis-twitter.toml", "ramsis-twitter-text.toml"] {
        let (mut e, base) = load(file);
        e.duration_s = 100.0;
        e.sweep.workers = vec![80];
        let results = run(&e, &base);
        let by = |p: &str| results.iter().find(|r| r.policy == p).unwrap_or_else(|| panic!("{file}: no {p} run"));
        let ramsis = by("RAMSIS");
        for other in ["Jellyfish+", "ModelSwitching"] {
            let o = by(other);
            assert!(ramsis.accuracy > o.accuracy, "{file}: accuracy RAMSIS {} {other} {}", ramsis.accuracy, o.accuracy);
            assert!(
                ramsis.violation_rate <= o.violation_rate + 0.001,
                "{file}: violations RAMSIS {} {other} {}",
                ramsis.violation_rate,
                o.violation_rate
            );
        }
    }
}

/// B = 8 and P_B (µs) of the spread-drop experiments: shufflenet's p95 at batch 8.
fn spread_drop_batch() -> (u32, f64) {
    let p = Profile::load(&root().join("profiles/imagenet-light-cpu.toml")).unwrap();
    let table = p.model("shufflenet").unwrap().latency_table(Percentile::P95);
    (8, table[7] as f64)
}

#[test]
fn spread_drop_mcd_is_below_early_drop_at_equal_throughput() {
    let (mut e, base) = load("spread-drop.toml");
    e.duration_s = 10.0;
    e.sweep.load_qps = vec![150.0, 300.0, 500.0];
    e.sweep.seeds = vec![1, 2, 3];
    let results = run(&e, &base);
    let mcd = mean(&results, |r| r.max_consecutive_drops as f64);
    for load in [150, 300, 500] {
        let at = |p: &str| mcd[&("poisson".to_string(), p.to_string(), load)];
        let (spread, early, nexus) = (at("spread-drop"), at("early-drop"), at("nexus"));
        assert!(spread < early && spread < nexus, "{load} req/s: MCD spread {spread} early {early} nexus {nexus}");
        // The paper's Figure 3: the gap grows with the rate; at least 3× here.
        assert!(early >= 3.0 * spread, "{load} req/s: MCD spread {spread} early {early}");
    }
    // §3.3: the same candidate sets, so the same number served and dropped, run by run.
    let by = |p: &'static str| results.iter().filter(move |r| r.policy == p);
    for (s, d) in by("spread-drop").zip(by("early-drop")) {
        assert_eq!((s.load_qps, s.seed), (d.load_qps, d.seed));
        assert_eq!(
            (s.requests, s.on_time, s.dropped),
            (d.requests, d.on_time, d.dropped),
            "{:?} seed {}",
            s.load_qps,
            s.seed
        );
    }
}

#[test]
fn theorem_1_rates_keep_the_mcd() {
    let (mut e, base) = load("spread-drop-theorem1.toml");
    let (b, p_b) = spread_drop_batch();
    e.duration_s = 5.0;
    // Just under each threshold B·(1+M)/P_B, M = 0, 1, 2.
    let rate = |m: u32| (f64::from(b * (1 + m)) / (p_b / 1e6)).floor();
    e.sweep.load_qps = (0..3).map(rate).collect();
    let results = run(&e, &base);
    for m in 0..3u32 {
        let r = results.iter().find(|r| r.policy == "spread-drop" && r.load_qps == Some(rate(m))).unwrap();
        assert!(
            r.max_consecutive_drops <= u64::from(m),
            "M = {m}: at {} req/s the MCD is {}",
            rate(m),
            r.max_consecutive_drops
        );
    }
    // Early drop has no such bound: at M = 2's rate it drops far more in a row.
    let r = results.iter().find(|r| r.policy == "early-drop" && r.load_qps == Some(rate(2))).unwrap();
    assert!(r.max_consecutive_drops > 2 * 2, "early drop MCD {}", r.max_consecutive_drops);
}

#[test]
fn theorem_2_rates_keep_the_weakly_hard_constraint() {
    let (mut e, base) = load("spread-drop-theorem2.toml");
    let (b, p_b) = spread_drop_batch();
    let k = 10u32;
    let count = |m: u32| (b / (k - m)) * k + b % (k - m);
    let rate = |m: u32| (f64::from(count(m)) / (p_b / 1e6)).floor();
    e.duration_s = 5.0;
    e.sweep.load_qps = (1..=5).map(rate).collect();
    let results = run(&e, &base);
    let mut checked = 0;
    for r in &results {
        // The policy's own (m, K) from its params; the MCD-only variant has none.
        let Some(m) = e
            .sweep
            .policies
            .iter()
            .find(|p| p.label.as_deref() == Some(r.policy.as_str()))
            .and_then(|p| p.params.as_ref()?.get("weakly_hard")?.as_array()?.first()?.as_integer())
        else {
            continue;
        };
        let m = m as u32;
        if r.load_qps.unwrap() <= rate(m) {
            let worst = r.weakly_hard.as_ref().unwrap().worst_misses_in_window;
            assert!(worst <= m as usize, "({m}, {k}) at {:?} req/s: {worst} misses in {k}", r.load_qps);
            checked += 1;
        }
    }
    assert!(checked >= 15, "only {checked} runs under their threshold");
}

/// Proteus §6.4 on a shortened run: what holds in our reproduction.
#[test]
fn proteus_batching_beats_clipper_on_bursty_arrivals_and_all_do_well_on_uniform() {
    let (mut e, base) = load("proteus-batching.toml");
    e.duration_s = 60.0;
    e.sweep.seeds = vec![1, 2];
    let v = mean(&run(&e, &base), |r| r.violation_rate);
    let at = |app: &str, p: &str| v[&(app.to_string(), p.to_string(), 170)];
    for p in ["proteus", "clipper-aimd", "clipper-steps", "nexus"] {
        assert!(at("uniform", p) < 0.001, "uniform: {p} {}", at("uniform", p));
    }
    for c in ["clipper-aimd", "clipper-steps"] {
        assert!(
            at("gamma-0.05", "proteus") < at("gamma-0.05", c),
            "gamma: proteus {} {c} {}",
            at("gamma-0.05", "proteus"),
            at("gamma-0.05", c)
        );
    }
}

/// The paper's claim, asserted as written: Proteus batching has 2–4× fewer violations
/// than both Nexus and Clipper on Poisson and Gamma arrivals (the full 300 s, two
/// seeds). It does not hold in our reproduction: Nexus's early drop has fewer
/// violations than Proteus batching on both, and Clipper fewer on Poisson; see
/// docs/results/README.md, "Proteus batching vs Clipper AIMD vs Nexus".
#[test]
#[ignore = "does not hold in our reproduction: see docs/results/README.md"]
fn proteus_batching_has_2x_fewer_violations_than_nexus_and_clipper_on_poisson_and_gamma() {
    let (mut e, base) = load("proteus-batching.toml");
    e.sweep.seeds = vec![1, 2];
    let v = mean(&run(&e, &base), |r| r.violation_rate);
    let at = |app: &str, p: &str| v[&(app.to_string(), p.to_string(), 170)];
    let mut failed = Vec::new();
    for app in ["poisson", "gamma-0.05"] {
        for p in ["clipper-aimd", "nexus"] {
            if 2.0 * at(app, "proteus") > at(app, p) {
                failed.push(format!("{app}: proteus {:.5} vs {p} {:.5}", at(app, "proteus"), at(app, p)));
            }
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

/// Whole-system figures per system label: (violation ratio, effective accuracy).
fn systems(results: &[RunResult]) -> BTreeMap<String, (f64, f64)> {
    let mut acc: BTreeMap<String, (f64, f64, f64, f64)> = BTreeMap::new();
    for r in results {
        let e = acc.entry(r.policy.clone()).or_default();
        e.0 += r.requests as f64;
        e.1 += r.on_time as f64;
        e.2 += r.served as f64;
        e.3 += r.accuracy * r.served as f64;
    }
    acc.into_iter().map(|(k, (n, on_time, served, mass))| (k, (1.0 - on_time / n, mass / served))).collect()
}

/// Proteus end to end (§6.2) through the first peak (90 s): Proteus has the fewest
/// violations of the five systems and, among those that scale accuracy, the highest
/// effective accuracy; Clipper-HT serves the least accurate mix and Clipper-HA misses
/// the most.
#[test]
fn proteus_has_the_fewest_violations_and_the_best_accuracy_among_scaling_systems() {
    let (mut e, base) = load("proteus-e2e.toml");
    e.duration_s = 120.0;
    let s = systems(&run(&e, &base));
    assert_eq!(s.len(), 5, "{s:?}");
    let (v, a) = s["Proteus"];
    for (name, (v2, a2)) in &s {
        if name != "Proteus" {
            assert!(v < *v2, "{name}: violations {v2} vs Proteus {v}");
        }
        if name == "Sommelier" || name == "INFaaS-Accuracy" || name == "Clipper-HT" {
            assert!(a > *a2, "{name}: accuracy {a2} vs Proteus {a}");
        }
    }
    let worst_accuracy = s.values().map(|x| x.1).fold(f64::INFINITY, f64::min);
    assert_eq!(worst_accuracy, s["Clipper-HT"].1);
    let most_violations = s.values().map(|x| x.0).fold(0.0, f64::max);
    assert_eq!(most_violations, s["Clipper-HA"].0);
}

/// The ablation (§6.5): without any one of its parts Proteus misses more.
#[test]
fn proteus_misses_more_without_any_of_its_parts() {
    let (mut e, base) = load("proteus-ablation.toml");
    e.duration_s = 120.0;
    let s = systems(&run(&e, &base));
    let v = s["Proteus"].0;
    for name in ["w/o MP", "w/o MS", "w/o AB", "w/o QA"] {
        assert!(s[name].0 > v, "{name}: {:?} vs Proteus {v}", s[name]);
    }
    // Without model selection nothing below the most accurate variant is served.
    assert!(s["w/o MS"].1 >= s["Proteus"].1 - 1e-9);
}

/// Burst responsiveness (§6.3): the static plan and the fixed placement cannot follow
/// the bursts; Proteus can. Sommelier's margin is the smaller one since demand is
/// shed per app (issue 34): at a burst its fixed placement serves each app as much
/// as that app's devices allow instead of one β for all, 1.75× Proteus's
/// violations in the first 100 s where it was 13× (the paper: 2.8×, Fig. 5).
#[test]
fn proteus_follows_bursts_that_static_and_fixed_placements_cannot() {
    let (mut e, base) = load("proteus-burst.toml");
    e.duration_s = 100.0;
    let s = systems(&run(&e, &base));
    let v = s["Proteus"].0;
    assert!(s["Clipper-HA"].0 > 5.0 * v, "{s:?}");
    assert!(s["Sommelier"].0 > 1.5 * v, "{s:?}");
}

/// InfAdapter (§5, Fig. 5–6) through the spike of its Twitter sample: InfAdapter
/// misses far less than every single-variant VPA, as often as MS+ with less accuracy
/// lost, and never drops or exceeds the core budget.
#[test]
fn infadapter_misses_less_than_vpa_and_loses_less_accuracy_than_ms_plus() {
    let (mut e, base) = load("infadapter.toml");
    e.duration_s = 800.0;
    let results = run(&e, &base);
    let by = |p: &str| results.iter().find(|r| r.policy == p).unwrap_or_else(|| panic!("no {p} run"));
    let (ia, ms) = (by("InfAdapter"), by("MS+"));
    let loss = |r: &RunResult| r.accuracy_loss.expect("runs on devices report accuracy loss");
    for vpa in ["VPA-18", "VPA-50", "VPA-152"] {
        assert!(
            by(vpa).violation_rate > 3.0 * ia.violation_rate,
            "{vpa}: {} vs {}",
            by(vpa).violation_rate,
            ia.violation_rate
        );
    }
    assert!(loss(ia) < loss(ms), "accuracy loss: InfAdapter {} MS+ {}", loss(ia), loss(ms));
    assert!((ia.violation_rate - ms.violation_rate).abs() < 0.02, "{} vs {}", ia.violation_rate, ms.violation_rate);
    assert!(loss(by("VPA-152")).abs() < 1e-9);
    assert!((loss(by("VPA-18")) - (0.78312 - 0.69758)).abs() < 1e-9);
    for r in [ia, ms] {
        assert_eq!(r.dropped, 0, "{}", r.policy);
        let cores = r.mean_devices.expect("devices");
        assert!(cores > 2.0 && cores <= 20.0, "{}: {cores}", r.policy);
    }
}
