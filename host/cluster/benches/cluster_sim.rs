//! Plan publication at scale, in virtual time (`cargo bench --workspace --bench
//! cluster_sim`; `SLUICE_SIM_AGENTS=10,100` picks the sizes). The real roles on the
//! simulated network of `sluice_cluster::simulate` (2 ms round trips, 0.1 ms per
//! write at the store, 3 s TTLs), through a start, an asked re-plan, a tenth of the
//! agents killed, a partition healed and the leader's loss. Each size prints the
//! virtual time of each step, the writes and watch events it took, and the wall time
//! this machine spent; the baseline is the 10-agent run of the same bench.

use sluice_cluster::harness::workspace_root;
use sluice_cluster::simulate::{simulate, SimReport, SimSpec};

fn main() -> anyhow::Result<()> {
    let sizes: Vec<usize> = std::env::var("SLUICE_SIM_AGENTS")
        .ok()
        .map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![10, 100, 1000]);
    let policies = workspace_root(env!("CARGO_MANIFEST_DIR")).join("target/policies");
    let dir = tempfile::tempdir()?;
    let mut reports: Vec<SimReport> = Vec::new();
    for n in sizes {
        let report = simulate(&SimSpec::lan(n, &policies), &dir.path().join(format!("n{n}")))?;
        print!("{report}");
        reports.push(report);
    }
    if let Some(base) = reports.first() {
        println!("against {} agents (asked re-plan: published, every frontend serving; wall of the run):", base.agents);
        let asked = |r: &SimReport| r.steps.iter().find(|s| s.what.starts_with("re-plan")).cloned().unwrap_or_default();
        let b = asked(base);
        for r in &reports {
            let a = asked(r);
            println!(
                "  {:>5} agents: {:.1} ms ({:.2}×), {:.1} ms ({:.2}×); wall {:.2} s ({:.2}×)",
                r.agents,
                a.published.as_secs_f64() * 1e3,
                a.published.as_secs_f64() / b.published.as_secs_f64(),
                a.serving.as_secs_f64() * 1e3,
                a.serving.as_secs_f64() / b.serving.as_secs_f64(),
                r.wall.as_secs_f64(),
                r.wall.as_secs_f64() / base.wall.as_secs_f64()
            );
        }
    }
    Ok(())
}
