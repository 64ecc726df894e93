//! `cargo xtask cluster-demo`: a 3-member etcd cluster, two allocators (one leads,
//! one stands by), two agents and a frontend on loopback; bounded load through a
//! re-plan, then the busiest agent, the leading allocator and one etcd member
//! killed (SIGKILL); what happened, ending with one line that counts every
//! outcome apart:
//! `cluster: sent N, answered N, 200 N, 429 N, 504 N, 5xx N, lost N, replans N, agent failovers N, allocator failovers N`
//! (the goal: `5xx 0, lost 0`).

use std::path::Path;
use std::time::{Duration, Instant};

use crate::harness::{config_text, drive, Cluster, LoadReport};
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
    println!("cluster-demo: starting 3 etcd members, 2 allocators, 2 agents (2 cpu devices each), a frontend");
    let mut c = Cluster::start(bin, dir, 3, &config).await?;
    c.allocator("alloc1")?;
    c.agent("a1", 2)?;
    c.agent("a2", 2)?;
    let fe = c.frontend("f1", 1000)?;
    c.wait_ready(fe, Duration::from_secs(60)).await?;
    // The standby, once the first leads.
    c.allocator("alloc2")?;
    let first = c.routing().await.ok_or_else(|| anyhow::anyhow!("no routing table"))?;
    println!("  {}", show(&first));

    println!(
        "load: 60 req/s for 22 s; a re-plan asked for at 3 s; SIGKILL: the busiest agent at 7 s, \
         the leading allocator at 12 s, an etcd member at 16 s"
    );
    let load = tokio::spawn(drive(fe, "img", 60.0, Duration::from_secs(22), 6));
    let t0 = Instant::now();
    let at = |s: u64| tokio::time::sleep_until(tokio::time::Instant::from_std(t0 + Duration::from_secs(s)));
    at(3).await;
    c.ask_replan().await?;
    let replanned = c.wait_routing(Duration::from_secs(20), |t| t.epoch > first.epoch).await?;
    println!("  {}", show(&replanned));

    at(7).await;
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
    let agent_failovers = u64::from(moved.epoch > current.epoch);

    at(12).await;
    let leader = c.leading_allocator().await?.ok_or_else(|| anyhow::anyhow!("no allocator leads"))?;
    c.signal(&leader, "KILL")?;
    println!("  allocator {leader} killed (SIGKILL)");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut allocator_failovers = 0;
    while Instant::now() < deadline {
        if let Ok(Some(now)) = c.leading_allocator().await {
            if now != leader {
                println!(
                    "  allocator {now} leads ({:.1} s after the kill)",
                    (Instant::now() - t0).as_secs_f64() - 12.0
                );
                allocator_failovers = 1;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    at(16).await;
    // A member that is not etcd's leader: the cluster keeps its quorum.
    let etcd_leader = c.etcd.leader().await.unwrap_or(0);
    let member = (etcd_leader + 1) % 3;
    c.etcd.kill(member);
    println!("  etcd member {member} killed (SIGKILL; member {etcd_leader} leads)");

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
    Ok(summary(&report, replans, agent_failovers, allocator_failovers))
}

/// The demo's last line: every outcome counted apart (an answer is not a success).
pub fn summary(report: &LoadReport, replans: u64, agent_failovers: u64, allocator_failovers: u64) -> String {
    let server_errors: u64 = report.statuses.iter().filter(|(s, _)| (500..600).contains(*s)).map(|(_, n)| n).sum();
    format!(
        "cluster: sent {}, answered {}, 200 {}, 429 {}, 504 {}, 5xx {server_errors}, lost {}, replans {replans}, \
         agent failovers {agent_failovers}, allocator failovers {allocator_failovers}",
        report.sent,
        report.answered(),
        report.count(200),
        report.count(429),
        report.count(504),
        report.lost
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_counts_every_outcome_apart() {
        let report = LoadReport {
            sent: 10,
            statuses: [(200, 5), (429, 1), (500, 2), (503, 1)].into_iter().collect(),
            lost: 1,
            ..Default::default()
        };
        assert_eq!(
            summary(&report, 3, 1, 1),
            "cluster: sent 10, answered 9, 200 5, 429 1, 504 0, 5xx 3, lost 1, replans 3, agent failovers 1, allocator failovers 1"
        );
    }
}
