//! `sluice allocate --problem <file> [--json]`: solves one allocation problem
//! ([`sluice_alloc::AnyProblem`]) and prints the plan; with `--json`, one object with
//! `status`, `objective`, `gap`, `solve_seconds` and the `plan`, and `origin` when no
//! MILP found a plan within the time limit and the plan is the greedy or the repaired
//! one (status `greedy` / `repaired`; docs/allocator.md).
//!
//! A file with a number out of its range (docs/allocator.md, "Ranges") is refused as
//! it is read, naming the field; a problem no plan can serve (no device, or an app
//! whose variants all miss its SLO) is refused by the allocator, naming the app. Both
//! exit 1 with one line, never a panic.

use std::path::PathBuf;

use anyhow::{bail, Result};
use sluice_alloc::{Allocator, AnyPlan, AnyProblem};

/// `sluice allocate` arguments.
#[derive(clap::Args, Debug)]
pub struct AllocateArgs {
    /// The problem file (TOML; `kind = "proteus"`, `"infadapter"` or `"loki"`, see docs/allocator.md).
    #[arg(long)]
    pub problem: PathBuf,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// Runs `sluice allocate`.
pub fn run(args: AllocateArgs) -> Result<()> {
    let problem = AnyProblem::load(&args.problem)?;
    let allocation = Allocator::default().allocate(&problem);
    if let (Some(e), None, false) = (&allocation.error, &allocation.plan, args.json) {
        // Nothing was solved and nothing is in force: the status line has nothing to say.
        bail!("{}: {e}", args.problem.display());
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&allocation)?);
    } else {
        println!(
            "status {}  objective {}  gap {}  solve {:.3} s over {} solve(s)",
            allocation.status,
            allocation.objective.map_or("-".into(), |o| format!("{o:.6}")),
            allocation.gap.map_or("-".into(), |g| format!("{g:.2e}")),
            allocation.solve_seconds,
            allocation.solves
        );
        if let Some(origin) = &allocation.origin {
            // No MILP found a plan in the time limit: say whose plan this is instead.
            println!("plan: {} (no solver), because {}", origin.name(), origin.reason().unwrap_or("-"));
        }
        match &allocation.plan {
            Some(AnyPlan::Proteus(p)) => {
                println!(
                    "step {:?}, demand factor {:.2}, effective accuracy {:.4}, {} devices used",
                    p.step, p.beta, p.effective_accuracy, p.devices_used
                );
                println!("{:<14} {:>9} {:>9} {:>8} {:>9}", "app", "demand", "served", "shed", "accuracy");
                for a in &p.apps {
                    println!(
                        "{:<14} {:>9.1} {:>9.1} {:>8.1} {:>9.4}",
                        a.name, a.demand_qps, a.served_qps, a.shed_qps, a.accuracy
                    );
                }
                println!(
                    "{:<14} {:<24} {:<8} {:>7} {:>6} {:>8} {:>9} {:>5}",
                    "app", "variant", "device", "devices", "share", "qps", "capacity", "batch"
                );
                for r in &p.routes {
                    println!(
                        "{:<14} {:<24} {:<8} {:>7} {:>6.3} {:>8.1} {:>9.1} {:>5}",
                        r.app, r.model, r.device_type, r.devices, r.share, r.qps, r.capacity_qps, r.batch
                    );
                }
            }
            Some(AnyPlan::Infadapter(p)) => {
                println!(
                    "demand factor {:.2}, {} cores, accuracy {:.4}, loading {:.2} s, served {:.1} req/s, shed {:.1}",
                    p.beta, p.cores, p.accuracy, p.loading_s, p.served_rps, p.shed_rps
                );
                println!("{:<12} {:>6} {:>9} {:>9} {:>6}", "variant", "cores", "quota", "capacity", "loads");
                for v in p.variants.iter().filter(|v| v.cores > 0) {
                    println!(
                        "{:<12} {:>6} {:>9.1} {:>9.1} {:>6}",
                        v.name, v.cores, v.quota_rps, v.capacity_rps, v.loads
                    );
                }
            }
            Some(AnyPlan::Loki(p)) => {
                println!(
                    "step {}, demand factor {:.2}, {} workers, accuracy {:.4}, served {:.1} req/s, shed {:.1}",
                    p.step, p.beta, p.workers, p.accuracy, p.served_qps, p.shed_qps
                );
                println!(
                    "{:<20} {:<28} {:>8} {:>5} {:>10} {:>9} {:>9}",
                    "task", "variant", "workers", "batch", "budget ms", "capacity", "load"
                );
                for v in &p.variants {
                    println!(
                        "{:<20} {:<28} {:>8} {:>5} {:>10.1} {:>9.1} {:>9.1}",
                        v.task,
                        v.variant,
                        v.replicas,
                        v.batch,
                        v.latency_us as f64 / 1000.0,
                        v.capacity_qps * v.replicas as f64,
                        v.load_qps
                    );
                }
                for chain in &p.chains {
                    println!("paths of {}:", chain.tasks.join(" -> "));
                    for path in &chain.paths {
                        println!(
                            "  {:<60} share {:.3}  accuracy {:.4}  {:.1} ms",
                            path.variants.join(" -> "),
                            path.share,
                            path.accuracy,
                            path.latency_us as f64 / 1000.0
                        );
                    }
                }
            }
            None => {}
        }
    }
    if let Some(e) = &allocation.error {
        bail!("{}: {e}", args.problem.display());
    }
    if allocation.plan.is_none() {
        bail!("{}: no feasible plan at any demand factor", args.problem.display());
    }
    Ok(())
}
