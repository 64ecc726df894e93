//! `loki`: Loki's resource manager and load balancer on the traffic-analysis
//! pipeline (`examples/allocate/loki-traffic.toml`: 3 tasks, 16 variants, batch
//! sizes 1–64, 20 workers, SLO 250 ms) as the demand rises from hardware scaling
//! (step 1) into accuracy scaling (step 2): the MILP's wall time (both steps when
//! step 1 is infeasible) and the time to build MostAccurateFirst's routing tables
//! from its plan. Baselines measured in the same run: the MILP as written before
//! its reductions (`loki::solve_unreduced`: every batch size, integer workers per
//! batch size, HiGHS's default search) for the MILP, whose plan's accuracy must
//! match; the MILP itself for the routing tables (the paper's §6.5 point: the load
//! balancer runs between solves, orders of magnitude faster). The paper's own
//! figures, ~500 ms for the MILP with Gurobi and ~0.15 ms for the load balancer in
//! Python, are printed beside.
//!
//! Run: `cargo bench -p sluice-alloc --bench loki` (`-- quick`: one repetition).
//! Prints a table, then one JSON line. Asserts nothing.

use std::path::Path;
use std::time::Instant;

use sluice_alloc::loki::{self, routing, Problem};
use sluice_alloc::AnyProblem;

fn traffic() -> Problem {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/allocate/loki-traffic.toml");
    match AnyProblem::load(&path).expect("the traffic-analysis problem") {
        AnyProblem::Loki(p) => p,
        _ => unreachable!("a loki problem"),
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    let reps = if quick { 1 } else { 5 };
    let base = traffic();
    let mut rows = Vec::new();
    println!("loki: traffic-analysis MILP (HiGHS, 1 thread) and MostAccurateFirst tables; median of {reps}");
    println!(
        "{:>7} {:>9} {:>8} {:>9} {:>9} {:>10} {:>10} {:>10} {:>10} {:>11}",
        "demand",
        "step",
        "workers",
        "accuracy",
        "milp ms",
        "unreduced",
        "speed-up",
        "vs 500 ms",
        "tables ms",
        "milp/tables"
    );
    for demand in [50.0, 150.0, 250.0, 400.0, 600.0, 1000.0] {
        let p = Problem { demand_qps: demand, ..base.clone() };
        let mut milp = Vec::new();
        let mut plan = None;
        for _ in 0..reps {
            let started = Instant::now();
            let outcome = loki::solve(&p).expect("a solve");
            milp.push(started.elapsed().as_secs_f64() * 1e3);
            plan = outcome.plan;
        }
        let plan = plan.expect("a plan");
        let mut unreduced = Vec::new();
        let mut unreduced_accuracy = 0.0;
        for _ in 0..reps {
            let started = Instant::now();
            let outcome = loki::solve_unreduced(&p).expect("a solve");
            unreduced.push(started.elapsed().as_secs_f64() * 1e3);
            unreduced_accuracy = outcome.plan.expect("a plan").accuracy;
        }
        let workers = plan.routing_workers(&p.pipeline);
        let mut tables = Vec::new();
        let n = 2000;
        for _ in 0..reps {
            let started = Instant::now();
            for _ in 0..n {
                std::hint::black_box(routing::most_accurate_first(&p.pipeline, &workers, demand));
            }
            tables.push(started.elapsed().as_secs_f64() * 1e3 / n as f64);
        }
        let (m, u, t) = (median(&mut milp), median(&mut unreduced), median(&mut tables));
        println!(
            "{:>7} {:>9} {:>8} {:>9.4} {:>9.1} {:>10.1} {:>9.1}x {:>9.2}x {:>10.4} {:>10.0}x",
            demand,
            plan.step,
            plan.workers,
            plan.accuracy,
            m,
            u,
            u / m,
            m / 500.0,
            t,
            m / t
        );
        rows.push(format!(
            "{{\"demand_qps\":{demand},\"step\":\"{}\",\"workers\":{},\"accuracy\":{:.6},\"unreduced_accuracy\":{unreduced_accuracy:.6},\"milp_ms\":{m:.3},\"unreduced_ms\":{u:.3},\"tables_ms\":{t:.5}}}",
            plan.step, plan.workers, plan.accuracy
        ));
    }
    println!("{{\"bench\":\"loki\",\"rows\":[{}]}}", rows.join(","));
}
