//! Overload at admission (issue 13): on-time goodput, latency and memory when the
//! offered load is five times what the workers can serve.
//!
//! Starts the real binary (`sluice serve`, cargo builds it for the bench) as a
//! separate process with one emulated app of real image-sized inputs (FP32
//! [3, 224, 224], ~600 KB of JSON per request, parsed for real) on the light
//! ImageNet CPU profile: 2 workers, batches of at most 4, a 400 ms SLO (the
//! setting of the independent comparison quoted in issue 13). For each policy it
//! drives the server open loop for 10 s at the capacity the profile gives, then
//! 10 s at five times that, and reports:
//! - on-time goodput (answers within the SLO per second) at 5× against the goodput
//!   at 1× in the same run (goal ≥ 0.9);
//! - the p99 latency of the requests answered 200 at 5× (goal ≤ the SLO);
//! - the server's RSS after start, after 1× and after 5× (goal: flat);
//! - every status the clients got.
//!
//! Run: `cargo bench -p sluice --bench overload` (needs `cargo xtask policies`).
//! Prints a table, then one JSON line.

use std::collections::BTreeMap;
use std::io::BufReader;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout};

use anyhow::Result;
use serde_json::json;
use sluice_loadgen::{self as loadgen, LoadArgs};

mod common;

const SECONDS: f64 = 10.0;
const SLO_MS: f64 = 400.0;
const WORKERS: f64 = 2.0;
const POOL: usize = 512;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One scenario: a policy, its params, the variants, and the capacity the profile
/// gives for what it serves (req/s).
struct Scenario {
    policy: &'static str,
    params: &'static str,
    models: &'static [&'static str],
    capacity: f64,
}

/// Requests/s one worker serves with `p95` (µs at batch 1, 2, 4, 8) at batches ≤ 4.
fn per_worker(p95: [f64; 4]) -> f64 {
    [(1.0, p95[0]), (2.0, p95[1]), (4.0, p95[2])].iter().map(|(b, us)| b / us * 1e6).fold(0.0, f64::max)
}

/// The server process; killed when dropped.
struct Server {
    child: Child,
    addr: SocketAddr,
    _stdout: BufReader<ChildStdout>,
    _dir: tempfile::TempDir,
}

impl Server {
    fn spawn(s: &Scenario) -> Result<Server> {
        let root = root().canonicalize()?;
        let dir = tempfile::tempdir()?;
        let models: Vec<String> = s.models.iter().map(|m| format!("\"{m}\"")).collect();
        let config = format!(
            "builtin_policy_dir = \"{root}/target/policies\"\npolicy_dir = \"{dir}/policies\"\n\n\
             [[app]]\nname = \"img\"\nslo_ms = {SLO_MS}\nworkers = {WORKERS}\nrouter = \"shortest-queue\"\nexecutor = \"emulated\"\n\
             profile = \"{root}/profiles/imagenet-light-cpu.toml\"\nmodels = [{}]\nmax_batch = 4\nmax_queue = 1024\n\
             policy = \"{}\"\nparams = {}\ninput = {{ name = \"data_0\", datatype = \"FP32\", shape = [3, 224, 224] }}\n",
            models.join(", "),
            s.policy,
            s.params,
            root = root.display(),
            dir = dir.path().display(),
        );
        let path = dir.path().join("overload.toml");
        std::fs::write(&path, config)?;
        let (child, addr, stdout) = common::start_server(&path)?;
        Ok(Server { child, addr, _stdout: stdout, _dir: dir })
    }

    /// Resident memory of the server process, MiB.
    fn rss_mib(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or(f64::NAN, |kb| kb / 1024.0)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What one phase saw.
#[derive(Debug, serde::Serialize)]
struct Phase {
    rate: f64,
    sent: u64,
    skipped: u64,
    by_status: BTreeMap<u16, u64>,
    goodput: f64,
    late: u64,
    /// Answers the server counted late (its clock: arrival to answer), this phase.
    server_late: Option<u64>,
    p50_ms: f64,
    p99_ms: f64,
    rss_mib: f64,
}

async fn phase(server: &Server, rate: f64) -> Result<Phase> {
    let late_before = loadgen::server_count(server.addr, "late").await;
    let s = loadgen::run(LoadArgs {
        addr: server.addr,
        app: "img".into(),
        rate,
        concurrency: POOL,
        duration: SECONDS,
        input: None,
        swaps: vec![],
        admin_token: None,
        json: false,
    })
    .await?;
    let ok = s.by_status.get(&200).copied().unwrap_or(0);
    let late_after = loadgen::server_count(server.addr, "late").await;
    Ok(Phase {
        server_late: late_before.zip(late_after).map(|(b, a)| a.saturating_sub(b)),
        rate,
        sent: s.sent,
        skipped: s.skipped,
        goodput: (ok - s.late) as f64 / s.seconds,
        late: s.late,
        p50_ms: s.latency_ms.get("p50").copied().unwrap_or(f64::NAN),
        p99_ms: s.latency_ms.get("p99").copied().unwrap_or(f64::NAN),
        by_status: s.by_status,
        rss_mib: server.rss_mib(),
    })
}

fn main() -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let resnet = per_worker([103605.0, 279099.0, 491613.0, 872197.0]);
    let inception = per_worker([80840.0, 163788.0, 298797.0, 597055.0]);
    let scenarios = [
        Scenario {
            policy: "fixed",
            params: "{ model = \"resnet50\" }",
            models: &["resnet50"],
            capacity: WORKERS * resnet,
        },
        // Jellyfish picks between the two by load; at overload it serves the faster.
        Scenario {
            policy: "jellyfish",
            params: "{}",
            models: &["inception_v1", "resnet50"],
            capacity: WORKERS * inception,
        },
    ];
    let mut rows = Vec::new();
    for s in &scenarios {
        let server = Server::spawn(s)?;
        let start_rss = server.rss_mib();
        let (at, over) = runtime.block_on(async {
            Ok::<_, anyhow::Error>((phase(&server, s.capacity).await?, phase(&server, 5.0 * s.capacity).await?))
        })?;
        rows.push((s, start_rss, at, over));
    }
    println!(
        "| policy | capacity req/s | goodput at 1× | goodput at 5× | 5× / 1× (goal ≥ 0.9) | p99 200s at 5× ms (SLO {SLO_MS}) | late at 5× (server's clock) | statuses at 5× | RSS start / 1× / 5× MiB |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---|---|");
    let mut out = Vec::new();
    for (s, start_rss, at, over) in &rows {
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.2} | {:.0} | {} ({}) | {:?} | {:.0} / {:.0} / {:.0} |",
            s.policy,
            s.capacity,
            at.goodput,
            over.goodput,
            over.goodput / at.goodput,
            over.p99_ms,
            over.late,
            over.server_late.map_or("-".to_string(), |n| n.to_string()),
            over.by_status,
            start_rss,
            at.rss_mib,
            over.rss_mib
        );
        out.push(json!({ "policy": s.policy, "capacity": s.capacity, "start_rss_mib": start_rss, "at_capacity": at, "at_5x": over }));
    }
    println!("{}", json!({ "bench": "overload", "slo_ms": SLO_MS, "seconds": SECONDS, "scenarios": out }));
    Ok(())
}
