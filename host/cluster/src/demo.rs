//! `cargo xtask cluster-demo`: a 3-member etcd cluster, an allocator, two agents
//! and a frontend on loopback; bounded load through a re-plan and an agent kill;
//! what happened, ending with one line
//! `cluster: sent N, answered N, lost 0, replans R, agent failovers F`.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::harness::{config_text, drive, Cluster};
use crate::keys::RoutingTable;

fn show(t: &RoutingTable) -> String {
    let mut parts = Vec::new();
    for (app, routes) in &t.apps {
        for r in routes {
            parts.push(format!("{app}@{}={} {:.0}%", r.key, r.variant, r.share * 100.0));
        }
    }
    format!("routing {}: {}", t.epoch, parts.join(", "))
}

/// Runs the demo with the `sluice` binary at `bin`, the built-in policies in
/// `policies`, working in `dir`; returns the summary line.
pub async fn run(bin: &Path, policies: &Path, dir: &Path) -> anyhow::Result<String> {
    let started = Instant::now();
    let config = config_text(dir, policies, 4, 200, 1.0);
    println!("cluster-demo: starting 3 etcd members, an allocator, 2 agents (2 cpu devices each), a frontend");
    let mut c = Cluster::start(bin, dir, 3, &config).await?;
    c.allocator("alloc1")?;
    c.agent("a1", 2)?;
    c.agent("a2", 2)?;
    let fe = c.frontend("f1", 1000)?;
    c.wait_ready(fe, Duration::from_secs(60)).await?;
    let first = c.routing().await.ok_or_else(|| anyhow::anyhow!("no routing table"))?;
    println!("  {}", show(&first));

    println!("load: 60 req/s for 14 s; a re-plan asked for at 3 s; the busiest agent SIGKILLed at 8 s");
    let load = tokio::spawn(drive(fe, "img", 60.0, Duration::from_secs(14), 6));
    tokio::time::sleep(Duration::from_secs(3)).await;
    c.ask_replan().await?;
    let replanned = c.wait_routing(Duration::from_secs(20), |t| t.epoch > first.epoch).await?;
    println!("  {}", show(&replanned));
    tokio::time::sleep(Duration::from_secs(5)).await;
    let current = c.routing().await.unwrap_or(replanned);
    let victim = current
        .apps
        .values()
        .flatten()
        .max_by(|a, b| a.share.total_cmp(&b.share))
        .map(|r| r.agent.clone())
        .ok_or_else(|| anyhow::anyhow!("nothing routed"))?;
    let killed_at = Instant::now();
    c.signal(&victim, "KILL")?;
    println!("  agent {victim} killed (SIGKILL)");
    let moved =
        c.wait_routing(Duration::from_secs(30), |t| t.apps.values().flatten().all(|r| r.agent != victim)).await?;
    println!("  {} ({:.1} s after the kill)", show(&moved), killed_at.elapsed().as_secs_f64());
    let failovers = u64::from(moved.epoch > current.epoch);
    let report = load.await?;
    let end = c.routing().await.unwrap_or(moved);
    let replans = end.epoch.saturating_sub(first.epoch);
    println!("answers: {}", report.statuses.iter().map(|(s, n)| format!("{n}× {s}")).collect::<Vec<_>>().join(", "));
    println!(
        "served by variant: {}",
        report.variants.iter().map(|(v, n)| format!("{v} {n}")).collect::<Vec<_>>().join(", ")
    );
    println!(
        "latency of 200s: p50 {:.1} ms, p99 {:.1} ms",
        report.quantile_us(0.5) as f64 / 1e3,
        report.quantile_us(0.99) as f64 / 1e3
    );
    for e in report.errors.iter().take(3) {
        println!("  e.g. {e}");
    }
    println!("({:.0} s in all; logs in {})", started.elapsed().as_secs_f64(), dir.display());
    Ok(format!(
        "cluster: sent {}, answered {}, lost {}, replans {replans}, agent failovers {failovers}",
        report.sent,
        report.answered(),
        report.lost
    ))
}
