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

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use serde_json::{json, Value};
use sluice_loadgen::poisson::{run_poisson, PoissonArgs};
use sluice_loadgen::{infer_body, Client};

mod common;
#[path = "common/image_app.rs"]
mod image_app;

use image_app::{scenarios, Server, SLO_MS};

const SECONDS: f64 = 20.0;
const TOKEN: &str = "admission-bench";
const UTILISATIONS: [f64; 3] = [0.5, 0.7, 0.9];

/// The app's admin counters.
async fn counters(server: &Server) -> Result<Value> {
    let mut c = Client::connect(server.addr).await?;
    let auth = format!("Bearer {TOKEN}");
    let r = c.request("GET", "/admin/apps/img", &[("authorization", &auth)], b"").await?;
    anyhow::ensure!(r.status == 200, "admin view: {} {}", r.status, r.text());
    Ok(r.json())
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
    let before = counters(server).await?;
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
    let after = counters(server).await?;
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
    let scenarios = scenarios();
    let body = Arc::new(serde_json::to_vec(&infer_body("data_0", &[1, 3, 224, 224], &vec![0.0; 3 * 224 * 224]))?);
    let mut rows = Vec::new();
    for s in &scenarios {
        let server = Server::spawn(s, &format!("admin_token = \"{TOKEN}\"\n"), "admission_audit = 1.0\n")?;
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
