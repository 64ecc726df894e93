//! False refusals at admission (issue 39): requests refused with 429 that would have
//! made their deadline, below capacity.
//!
//! Starts the real binary (`sluice serve`) with the overload bench's app (one
//! emulated app of image-sized JSON inputs on the light ImageNet CPU profile, 2
//! workers, batches of at most 4, a 400 ms SLO) and `admission_audit = 1`: every
//! request admission would refuse as overloaded is admitted anyway and marked, and
//! the server counts how many of those were then served by their deadline (the
//! admin view's `admission_audit`). Below capacity, admitting them changes little,
//! so each audited request that met its deadline is a refusal that would have been
//! false. Poisson arrivals (the peers benchmark's schedule) at 50 %, 70 % and 90 %
//! of the capacity the profile gives, 20 s each, for `fixed` and `jellyfish`.
//!
//! The figure: false refusals / requests sent (goal ≤ 1 % below 90 % utilisation),
//! against the baseline of the same run: every refusal admission would make
//! (audited / sent), true and false.
//!
//! Run: `cargo bench -p sluice --bench admission` (needs `cargo xtask policies`).
//! Prints a table, then one JSON line, then the summary line
//! `admission: false refusals X % at 90 % utilisation (refusals Y %)`.

use std::io::BufReader;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use serde_json::{json, Value};
use sluice_loadgen::poisson::{run_poisson, PoissonArgs};
use sluice_loadgen::{infer_body, Client};

mod common;

const SECONDS: f64 = 20.0;
const SLO_MS: f64 = 400.0;
const WORKERS: f64 = 2.0;
const TOKEN: &str = "admission-bench";
const UTILISATIONS: [f64; 3] = [0.5, 0.7, 0.9];

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
            "admin_token = \"{TOKEN}\"\nbuiltin_policy_dir = \"{root}/target/policies\"\npolicy_dir = \"{dir}/policies\"\n\n\
             [[app]]\nname = \"img\"\nslo_ms = {SLO_MS}\nworkers = {WORKERS}\nrouter = \"shortest-queue\"\nexecutor = \"emulated\"\n\
             profile = \"{root}/profiles/imagenet-light-cpu.toml\"\nmodels = [{}]\nmax_batch = 4\nmax_queue = 1024\n\
             admission_audit = 1.0\npolicy = \"{}\"\nparams = {}\ninput = {{ name = \"data_0\", datatype = \"FP32\", shape = [3, 224, 224] }}\n",
            models.join(", "),
            s.policy,
            s.params,
            root = root.display(),
            dir = dir.path().display(),
        );
        let path = dir.path().join("admission.toml");
        std::fs::write(&path, config)?;
        let (child, addr, stdout) = common::start_server(&path)?;
        Ok(Server { child, addr, _stdout: stdout, _dir: dir })
    }

    /// The app's admin counters.
    async fn counters(&self) -> Result<Value> {
        let mut c = Client::connect(self.addr).await?;
        let auth = format!("Bearer {TOKEN}");
        let r = c.request("GET", "/admin/apps/img", &[("authorization", &auth)], b"").await?;
        anyhow::ensure!(r.status == 200, "admin view: {} {}", r.status, r.text());
        Ok(r.json())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What one utilisation saw.
#[derive(Debug, serde::Serialize)]
struct Phase {
    utilisation: f64,
    rate: f64,
    sent: u64,
    ok: u64,
    /// Answers other than 200 (a 429 here is a full queue: refusals are audited).
    other: u64,
    /// Requests admission would have refused (admitted to check).
    would_refuse: u64,
    /// Of those, served by their deadline: false refusals.
    false_refusals: u64,
}

impl Phase {
    fn share(&self, n: u64) -> f64 {
        n as f64 / self.sent.max(1) as f64
    }
}

fn count(v: &Value, path: &[&str]) -> u64 {
    path.iter().fold(v, |v, k| &v[k]).as_u64().unwrap_or(0)
}

async fn phase(server: &Server, body: &Arc<Vec<u8>>, capacity: f64, utilisation: f64, seed: u64) -> Result<Phase> {
    let before = server.counters().await?;
    let rate = capacity * utilisation;
    let records = run_poisson(PoissonArgs {
        addr: server.addr,
        path: "/v2/models/img/infer".into(),
        body: body.clone(),
        headers: Arc::default(),
        rate,
        duration: Duration::from_secs_f64(SECONDS),
        seed,
        timeout: Duration::from_secs(10),
        max_connections: 512,
    })
    .await?;
    let after = server.counters().await?;
    let delta = |path: &[&str]| count(&after, path).saturating_sub(count(&before, path));
    let ok = records.iter().filter(|r| r.status == 200).count() as u64;
    Ok(Phase {
        utilisation,
        rate,
        sent: records.len() as u64,
        ok,
        other: records.len() as u64 - ok,
        would_refuse: delta(&["admission_audit", "audited"]),
        false_refusals: delta(&["admission_audit", "met"]),
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
        Scenario {
            policy: "jellyfish",
            params: "{}",
            models: &["inception_v1", "resnet50"],
            capacity: WORKERS * inception,
        },
    ];
    let body = Arc::new(serde_json::to_vec(&infer_body("data_0", &[1, 3, 224, 224], &vec![0.0; 3 * 224 * 224]))?);
    let mut rows = Vec::new();
    for s in &scenarios {
        let server = Server::spawn(s)?;
        for (k, u) in UTILISATIONS.iter().enumerate() {
            let p = runtime.block_on(phase(&server, &body, s.capacity, *u, 7 + k as u64)).context(s.policy)?;
            rows.push((s.policy, p));
        }
    }
    println!("| policy | utilisation | rate req/s | sent | 200 | other | would refuse | false refusals | false / sent (goal ≤ 1 %) |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (policy, p) in &rows {
        println!(
            "| {policy} | {:.0} % | {:.1} | {} | {} | {} | {} ({:.2} %) | {} | {:.2} % |",
            p.utilisation * 100.0,
            p.rate,
            p.sent,
            p.ok,
            p.other,
            p.would_refuse,
            p.share(p.would_refuse) * 100.0,
            p.false_refusals,
            p.share(p.false_refusals) * 100.0
        );
    }
    let phases: Vec<Value> = rows.iter().map(|(policy, p)| json!({ "policy": policy, "phase": p })).collect();
    println!("{}", json!({ "bench": "admission", "slo_ms": SLO_MS, "seconds": SECONDS, "phases": phases }));
    // The worst policy at the highest utilisation below capacity.
    let at90: Vec<&Phase> = rows.iter().map(|(_, p)| p).filter(|p| p.utilisation == 0.9).collect();
    let worst = at90.iter().copied().max_by(|a, b| a.share(a.false_refusals).total_cmp(&b.share(b.false_refusals)));
    if let Some(w) = worst {
        println!(
            "admission: false refusals {:.2} % at 90 % utilisation (refusals {:.2} %)",
            w.share(w.false_refusals) * 100.0,
            w.share(w.would_refuse) * 100.0
        );
    }
    Ok(())
}
