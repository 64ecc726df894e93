//! `solve`: how long the Proteus MILP takes as devices, variants and apps grow (the
//! axes of Proteus Fig. 10), from the paper's setup (`examples/allocate/
//! proteus-paper.toml`: 40 devices of 4 types, 46 variants, 9 apps, demand at the
//! trace's peak). Each row solves the whole allocation (down the ladder when
//! needed) with the default aggregated formulation; the baseline, measured in the
//! same run, is the paper's per-device formulation on the same instance (where it
//! finishes within its limit) and the paper's own figure, 4.2 s with Gurobi.
//!
//! Then the surge (issue 34): the paper's setup at 2×, 3× and 4× its demand, and 4×
//! its size at 3× its demand, each allocation with the previous ladder (`search =
//! "descend"`, the artifact's, `mip_gap = 1e-4`) and with the defaults (`search =
//! "lexicographic"` and the default `mip_gap`) in the same run, under the same
//! whole-allocation time limit (10 s), against a reference (the best HiGHS finds
//! in 60 s): time per allocation, the ratio, solves, β, objective and the gap to
//! the reference. Goals: ≤ 0.5 s at the paper's size, ≤ 1 s at 4× its size, every
//! run, within 1 % of the reference. Beside them, the default search without its
//! local search (`[ladder] local_search = false`, the search before 2026-11-26): its
//! objective's gap and the time ratio, same run.
//!
//! Run: `cargo bench -p sluice-alloc --bench solve` (`-- quick`: one repetition;
//! `-- surge`: only the surge). Prints tables, then one JSON line. Asserts nothing.

use std::path::Path;
use std::time::Instant;

use sluice_alloc::ladder::Search;
use sluice_alloc::proteus::{self, Formulation};
use sluice_alloc::AnyProblem;
use sluice_alloc::SolverSettings;

fn root() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn paper() -> proteus::Problem {
    match AnyProblem::load(&root().join("examples/allocate/proteus-paper.toml")).expect("the paper's problem") {
        AnyProblem::Proteus(p) => p,
        _ => unreachable!("a proteus problem"),
    }
}

/// `factor` times the devices of every type.
fn more_devices(mut p: proteus::Problem, factor: u32) -> proteus::Problem {
    for d in &mut p.devices {
        d.count *= factor;
    }
    for a in &mut p.apps {
        a.demand_qps *= factor as f64;
    }
    p
}

/// About `target` variants: every variant gets copies with 1 % slower latency and
/// 0.1 point lower accuracy per copy (distinct, plausible variants of the family).
fn more_variants(mut p: proteus::Problem, target: usize) -> proteus::Problem {
    let now: usize = p.apps.iter().map(|a| a.models.len()).sum();
    let copies = target.div_ceil(now) - 1;
    for d in &mut p.devices {
        let originals = d.profile.models.clone();
        for k in 1..=copies {
            for m in &originals {
                let mut c = m.clone();
                c.name = format!("{}#{k}", m.name);
                c.accuracy = (m.accuracy - 0.001 * k as f64).max(0.0);
                let slow = |v: &Vec<u64>| v.iter().map(|x| (*x as f64 * (1.0 + 0.01 * k as f64)) as u64).collect();
                c.p50_us = slow(&m.p50_us);
                c.p95_us = slow(&m.p95_us);
                c.p99_us = slow(&m.p99_us);
                d.profile.models.push(c);
            }
        }
    }
    for a in &mut p.apps {
        let originals = a.models.clone();
        for k in 1..=copies {
            a.models.extend(originals.iter().map(|m| format!("{m}#{k}")));
        }
    }
    p
}

/// `apps` apps: the paper's 9 cycled, total demand kept.
fn more_apps(mut p: proteus::Problem, apps: usize) -> proteus::Problem {
    let base = p.apps.clone();
    let scale = base.len() as f64 / apps as f64;
    p.apps = (0..apps)
        .map(|i| {
            let mut a = base[i % base.len()].clone();
            a.name = format!("{}-{}", a.name, i / base.len());
            a.demand_qps *= scale;
            a
        })
        .collect();
    p
}

struct Row {
    case: String,
    devices: u32,
    variants: usize,
    apps: usize,
    seconds: Vec<f64>,
    gap: Option<f64>,
    solves: usize,
    status: String,
    beta: Option<f64>,
    accuracy: Option<f64>,
}

fn run(case: &str, p: &proteus::Problem, reps: usize) -> Row {
    let mut seconds = Vec::new();
    let mut last = None;
    for _ in 0..reps {
        let t = Instant::now();
        let out = proteus::solve(p).expect("solve");
        seconds.push(t.elapsed().as_secs_f64());
        last = Some(out);
    }
    let out = last.expect("at least one repetition");
    seconds.sort_by(f64::total_cmp);
    Row {
        case: case.into(),
        devices: p.devices.iter().map(|d| d.count).sum(),
        variants: p.apps.iter().map(|a| a.models.len()).sum(),
        apps: p.apps.len(),
        seconds,
        gap: out.report.gap,
        solves: out.attempts.len(),
        status: format!("{:?}", out.report.status),
        beta: out.plan.as_ref().map(|p| p.beta),
        accuracy: out.plan.as_ref().map(|p| p.effective_accuracy),
    }
}

fn median(v: &[f64]) -> f64 {
    v[v.len() / 2]
}

/// One configuration on a surge case: seconds per allocation (sorted), and the
/// last run's solves, β, objective and whether it timed out (None: no plan; `error`
/// says why).
struct SurgeRun {
    seconds: Vec<f64>,
    solves: usize,
    beta: Option<f64>,
    objective: Option<f64>,
    timed_out: bool,
    error: Option<String>,
    /// The last run's solves: step, β, status, seconds.
    attempts: String,
}

fn surge_run(p: &proteus::Problem, reps: usize) -> SurgeRun {
    let mut out = SurgeRun {
        seconds: Vec::new(),
        solves: 0,
        beta: None,
        objective: None,
        timed_out: false,
        error: None,
        attempts: String::new(),
    };
    for _ in 0..reps {
        let t = Instant::now();
        let got = proteus::solve(p);
        out.seconds.push(t.elapsed().as_secs_f64());
        match got {
            Ok(o) => {
                out.solves = o.attempts.len();
                out.beta = o.plan.as_ref().map(|p| p.beta);
                out.objective = o.plan.as_ref().map(proteus::accuracy_objective);
                out.timed_out = o.timed_out;
                out.error = None;
                out.attempts = o
                    .attempts
                    .iter()
                    .map(|a| format!("{:?} {:.2} {:?} {:.3} s", a.step, a.beta, a.status, a.solve_seconds))
                    .collect::<Vec<_>>()
                    .join("; ");
            }
            Err(e) => {
                (out.solves, out.beta, out.objective) = (0, None, None);
                out.error = Some(e.to_string());
            }
        }
    }
    out.seconds.sort_by(f64::total_cmp);
    out
}

/// The surge table; returns its JSON rows and whether the goals were met.
///
/// Per case, in the same run: the reference (the default search with `mip_gap = 0`,
/// no soft limit and 60 s for the whole allocation: the best HiGHS finds in 60 s,
/// once), the
/// previous ladder (`search = "descend"` with the previous `mip_gap = 1e-4`, as the
/// paper's problem file sets it; `reps_old` runs, each up to the 10 s limit), and
/// the default (`search = "lexicographic"`, the default `mip_gap` and
/// `soft_limit_s`; `reps` runs). The
/// goal: every run of the default within its time, with a plan whose objective is
/// within 1 % of the reference's.
fn surge(base: &proteus::Problem, reps: usize, reps_old: usize) -> (Vec<serde_json::Value>, bool) {
    let mut cases = Vec::new();
    for k in [2.0, 3.0, 4.0] {
        let mut p = base.clone();
        p.apps.iter_mut().for_each(|a| a.demand_qps *= k);
        cases.push((format!("paper, {k}x demand"), p, 0.5));
    }
    let mut big = more_devices(base.clone(), 4);
    big.apps.iter_mut().for_each(|a| a.demand_qps *= 3.0);
    cases.push(("4x size, 3x demand".to_string(), big, 1.0));
    println!();
    println!(
        "surge: whole allocation (limit 10 s); previous = descend, mip_gap 1e-4, {reps_old} runs; \
         new = default search, mip_gap and soft limit ({:?}, {}, {} s), {reps} runs; reference = new with mip_gap 0 \
         and no soft limit in 60 s",
        Search::default(),
        SolverSettings::default().mip_gap,
        SolverSettings::default().soft_limit_s
    );
    println!(
        "{:<20} {:>8} {:>8} {:>3} {:>5} {:>8} | {:>8} {:>8} {:>3} {:>5} {:>8} | {:>5} {:>8} {:>6} | {:>6} {:>4}",
        "case",
        "prev med",
        "prev max",
        "n",
        "beta",
        "obj",
        "new med",
        "new max",
        "n",
        "beta",
        "obj",
        "beta",
        "ref obj",
        "gap %",
        "ratio",
        "goal"
    );
    let mut rows = Vec::new();
    let mut all_met = true;
    for (name, p, goal) in &cases {
        let mut reference = p.clone();
        reference.ladder.search = Search::default();
        reference.solver = SolverSettings { time_limit_s: 60.0, mip_gap: 0.0, soft_limit_s: 0.0, ..p.solver.clone() };
        let reference = surge_run(&reference, 1);
        let mut previous = p.clone();
        previous.ladder.search = Search::Descend;
        previous.solver.mip_gap = 1e-4;
        let old = surge_run(&previous, reps_old);
        let mut default = p.clone();
        default.ladder.search = Search::default();
        default.solver.mip_gap = SolverSettings::default().mip_gap;
        default.solver.soft_limit_s = SolverSettings::default().soft_limit_s;
        let new = surge_run(&default, reps);
        // The same search without its local search (before 2026-11-26): the
        // objective the local search adds, and what it costs in time.
        let mut plain = default.clone();
        plain.ladder.local_search = false;
        let before = surge_run(&plain, reps);
        let ratio = median(&old.seconds) / median(&new.seconds).max(1e-9);
        let ratio_before = median(&before.seconds) / median(&new.seconds).max(1e-9);
        let worst = new.seconds.last().copied().unwrap_or(f64::INFINITY);
        // Relative gap to the reference, positive when the default's plan is worse.
        let gap_of = |run: &SurgeRun| match (run.objective, reference.objective) {
            (Some(o), Some(r)) if r > 0.0 => Some((r - o) / r),
            _ => None,
        };
        let gap = gap_of(&new);
        let gap_before = gap_of(&before);
        let met = worst <= *goal && gap.is_some_and(|g| g <= 0.01);
        all_met &= met;
        let f = |v: Option<f64>, d: usize| v.map_or("-".to_string(), |x| format!("{x:.d$}"));
        println!(
            "{:<20} {:>8.3} {:>8.3} {:>3} {:>5} {:>8} | {:>8.3} {:>8.3} {:>3} {:>5} {:>8} | {:>5} {:>8} {:>6} | {:>5.1}x {:>4}",
            name,
            median(&old.seconds),
            old.seconds.last().copied().unwrap_or(0.0),
            old.solves,
            f(old.beta, 2),
            f(old.objective, 5),
            median(&new.seconds),
            worst,
            new.solves,
            f(new.beta, 2),
            f(new.objective, 5),
            f(reference.beta, 2),
            f(reference.objective, 5),
            f(gap.map(|g| g * 100.0), 3),
            ratio,
            if met { "MET" } else { "NOT" },
        );
        println!(
            "  without the local search: median {:.3} s, max {:.3} s, objective {}, gap {} %; new / without: time x{:.2}",
            median(&before.seconds),
            before.seconds.last().copied().unwrap_or(0.0),
            f(before.objective, 5),
            f(gap_before.map(|g| g * 100.0), 3),
            1.0 / ratio_before.max(1e-9),
        );
        for (label, r) in [("previous", &old), ("new", &new), ("without", &before), ("reference", &reference)] {
            if label != "previous" {
                println!("  {label} solves: {}", r.attempts);
            }
            if let Some(e) = &r.error {
                println!("  {label}: {e}");
            } else if r.timed_out {
                println!("  {label}: stopped by the time limit (the step may not be the highest)");
            }
        }
        rows.push(serde_json::json!({
            "case": name, "goal_s": goal, "ratio": ratio, "goal_met": met, "gap_to_reference": gap,
            "reference": { "seconds": reference.seconds.first(), "beta": reference.beta,
                           "objective": reference.objective, "timed_out": reference.timed_out },
            "previous": { "median_s": median(&old.seconds), "max_s": old.seconds.last(), "solves": old.solves,
                          "beta": old.beta, "objective": old.objective, "error": old.error },
            "new": { "median_s": median(&new.seconds), "max_s": new.seconds.last(), "solves": new.solves,
                     "beta": new.beta, "objective": new.objective, "error": new.error },
            "without_local_search": { "median_s": median(&before.seconds), "max_s": before.seconds.last(),
                     "beta": before.beta, "objective": before.objective, "gap_to_reference": gap_before },
        }));
    }
    (rows, all_met)
}

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    let reps = if quick { 1 } else { 5 };
    let base = paper();
    let reps_old = if quick { 1 } else { 3 };
    if std::env::args().any(|a| a == "surge") {
        let (rows, met) = surge(&base, reps, reps_old);
        println!("{}", serde_json::json!({ "bench": "solve", "surge": rows, "surge_goal_met": met }));
        return;
    }
    let mut rows = vec![run("paper (aggregated)", &base, reps)];
    let mut per_device = base.clone();
    per_device.formulation = Formulation::PerDevice;
    // The paper's formulation finds the optimum quickly but cannot prove it (identical
    // devices are symmetric): one run, stopped at 20 s with the gap it reached.
    per_device.solver.time_limit_s = 20.0;
    rows.push(run("paper (per-device, the paper's MILP)", &per_device, 1));
    for f in [2, 4] {
        rows.push(run(&format!("devices x{f}"), &more_devices(base.clone(), f), reps));
    }
    for v in [150, 450] {
        rows.push(run(&format!("variants ~{v}"), &more_variants(base.clone(), v), reps));
    }
    for a in [13, 17] {
        rows.push(run(&format!("apps {a}"), &more_apps(base.clone(), a), reps));
    }
    println!("solve: Proteus MILP (HiGHS, 1 thread), whole allocation down the ladder; median of {reps}");
    println!(
        "{:<38} {:>7} {:>8} {:>5} {:>9} {:>9} {:>6} {:>10} {:>8} {:>5} {:>8}",
        "case", "devices", "variants", "apps", "median s", "max s", "solves", "status", "gap", "beta", "accuracy"
    );
    for r in &rows {
        println!(
            "{:<38} {:>7} {:>8} {:>5} {:>9.3} {:>9.3} {:>6} {:>10} {:>8} {:>5} {:>8}",
            r.case,
            r.devices,
            r.variants,
            r.apps,
            median(&r.seconds),
            r.seconds.last().copied().unwrap_or(0.0),
            r.solves,
            r.status,
            r.gap.map_or("-".into(), |g| format!("{g:.1e}")),
            r.beta.map_or("-".into(), |b| format!("{b:.2}")),
            r.accuracy.map_or("-".into(), |a| format!("{a:.4}")),
        );
    }
    let paper_s = median(&rows[0].seconds);
    let per_device_s = median(&rows[1].seconds);
    println!(
        "paper setup: {paper_s:.3} s aggregated vs {per_device_s:.3} s per-device ({:.1}x) and the paper's 4.2 s with Gurobi ({:.0}x); goal <= 0.5 s: {}",
        per_device_s / paper_s.max(1e-9),
        4.2 / paper_s.max(1e-9),
        if paper_s <= 0.5 { "MET" } else { "NOT MET" }
    );
    let big: Vec<&Row> = rows.iter().filter(|r| r.devices >= 160 || r.variants >= 450 || r.apps >= 17).collect();
    let worst = big.iter().map(|r| median(&r.seconds)).fold(0.0, f64::max);
    println!(
        "160 devices / 450 variants / 17 apps: worst {worst:.3} s (goal <= 10 s, the paper: under 60 s): {}",
        if worst <= 10.0 { "MET" } else { "NOT MET" }
    );
    let (surge_rows, surge_met) = surge(&base, reps, reps_old);
    let json: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            serde_json::json!({
                "case": r.case, "devices": r.devices, "variants": r.variants, "apps": r.apps,
                "median_s": median(&r.seconds), "max_s": r.seconds.last(), "gap": r.gap, "solves": r.solves,
                "status": r.status, "beta": r.beta, "effective_accuracy": r.accuracy,
            })
        })
        .collect();
    println!(
        "{}",
        serde_json::json!({
            "bench": "solve", "rows": json, "paper_goal_met": paper_s <= 0.5, "scale_goal_met": worst <= 10.0,
            "surge": surge_rows, "surge_goal_met": surge_met,
        })
    );
}
