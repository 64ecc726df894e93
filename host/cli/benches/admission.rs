//! False refusals at admission (issue 39): requests refused with 429 that would have
//! made their deadline, below capacity.
//!
//! Starts the real binary (`sluice serve`) with the overload bench's app (one
//! emulated app of image-sized JSON inputs on the light ImageNet CPU profile, 2
//! workers, batches of at most 4, a 400 ms SLO) and `admission_audit = 0.1`: one
//! in ten of the requests admission would refuse as overloaded is admitted anyway
//! and marked, and the server counts how many of those were then served by their
//! deadline (the admin view's `admission_audit`). The sample is small so that the
//! load it measures is nearly the one admission sees (auditing every refusal, as
//! this bench did at first, let the queues grow and made later refusals of its
//! own). The false refusals are estimated as the would-be refusals (refused, plus
//! audited) times the share of the audited that met their deadline. Poisson
//! arrivals (the peers benchmark's schedule) at 50 %, 70 % and 90 % of the
//! capacity the profile gives for what the policy serves (`fixed`: ResNet-50 one
//! by one; jellyfish: Inception pairs, its SLO/2 rule; `common/image_app.rs`),
//! `SECONDS` each, for `fixed` and `jellyfish`.
//!
//! The figure: false refusals / requests sent (goal ≤ 1 % below 90 % utilisation),
//! against the baseline of the same run: every refusal admission would make, true
//! and false.
//!
//! Run: `cargo bench -p sluice --bench admission` (needs `cargo xtask policies`).
//! `ADMISSION_BENCH_ONLY=<policy>` runs one policy's phases only, and
//! `ADMISSION_BENCH_AUDIT=<share>` audits another share of would-be refusals
//! (larger samples for a diagnosis; the load then differs more from the one
//! admission alone would leave). `ADMISSION_BENCH_SEED=<n>` draws the arrivals
//! from seeds n, n + 1, n + 2 for the three utilisations (default 7): one seed
//! gives the same arrivals, the same refusals and the same audited requests in
//! every run, so runs pooled over one seed re-measure a handful of requests
//! (six audited at 70 %), while runs over different seeds sample new ones.
//! Audited answers carry `parameters.admission_audit`, so the bench also counts
//! those answered within the SLO from the actual send by its own clock ("met
//! (client)"): the server judges an audit met at its batch's end, before the
//! answer is sent and read, where the client waits for both.
//! Prints a table, then one JSON line, then the summary line
//! `admission: false refusals X % at 90 % utilisation (Z % by the client's clock;
//! refusals Y %)`.

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

const SECONDS: f64 = 40.0;
/// The share of would-be refusals admitted to check them.
const AUDIT: f64 = 0.1;
/// The arrivals' first seed (`ADMISSION_BENCH_SEED`); the utilisations take it and
/// the next two.
const SEED: u64 = 7;
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
    /// Every answer by status (the loadgen's codes below 100 for a transport
    /// error or a timeout), so a 5xx never hides among the refusals.
    statuses: std::collections::BTreeMap<u16, u64>,
    /// Answers 200 after the SLO by the client's clock, audited ones included.
    late: u64,
    /// Served after their deadline by the server's clock among the requests
    /// admission admitted itself (the server's late count less the audited ones
    /// that missed): what admitting more may cost.
    late_admitted: u64,
    /// Refused as overloaded (429).
    refused: u64,
    /// Would-be refusals admitted to check them.
    audited: u64,
    /// Of those, served by their deadline (by the server's clock, at their batch's
    /// end).
    met: u64,
    /// Of those, answered 200 within the SLO from the actual send by the client's
    /// clock (the answer marked `admission_audit`): met where the client waits.
    met_client: u64,
    /// Requests admission would refuse: refused and audited.
    would_refuse: u64,
    /// Estimated false refusals: `would_refuse × met / audited`.
    false_refusals: f64,
    /// The same by the client's clock: `would_refuse × met_client / audited`.
    false_refusals_client: f64,
}

impl Phase {
    fn share(&self, n: f64) -> f64 {
        n / self.sent.max(1) as f64
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
    let late = records.iter().filter(|r| r.status == 200 && r.latency_ms > SLO_MS).count() as u64;
    let (refused, audited) = (delta(&["counters", "rejected_overload"]), delta(&["admission_audit", "audited"]));
    let met = delta(&["admission_audit", "met"]);
    let met_client = records
        .iter()
        .filter(|r| r.status == 200 && r.audited && r.latency_from_send_ms().is_some_and(|ms| ms <= SLO_MS))
        .count() as u64;
    let would_refuse = refused + audited;
    let estimate = |met: u64| if audited == 0 { 0.0 } else { would_refuse as f64 * met as f64 / audited as f64 };
    let late_admitted = delta(&["counters", "late"]).saturating_sub(audited.saturating_sub(met));
    Ok(Phase {
        utilisation,
        rate,
        sent: records.len() as u64,
        ok,
        statuses: records.iter().fold(Default::default(), |mut by, r| {
            *by.entry(r.status).or_default() += 1;
            by
        }),
        late,
        late_admitted,
        refused,
        audited,
        met,
        met_client,
        would_refuse,
        false_refusals: estimate(met),
        false_refusals_client: estimate(met_client),
    })
}

/// The environment variable `name` parsed, or `default` when it is not set.
fn env_or<T: std::str::FromStr>(name: &str, default: T) -> Result<T>
where
    T::Err: std::error::Error + Send + Sync + 'static,
{
    match std::env::var(name) {
        Ok(v) => v.parse().context(name.to_string()),
        Err(_) => Ok(default),
    }
}

fn main() -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let scenarios = scenarios();
    let body = Arc::new(serde_json::to_vec(&infer_body("data_0", &[1, 3, 224, 224], &vec![0.0; 3 * 224 * 224]))?);
    let only = std::env::var("ADMISSION_BENCH_ONLY").ok();
    let audit: f64 = env_or("ADMISSION_BENCH_AUDIT", AUDIT)?;
    let seed: u64 = env_or("ADMISSION_BENCH_SEED", SEED)?;
    let mut rows = Vec::new();
    for s in scenarios.iter().filter(|s| only.as_deref().is_none_or(|p| p == s.policy)) {
        let server =
            Server::spawn(s, &format!("admin_token = \"{TOKEN}\"\n"), &format!("admission_audit = {audit}\n"))?;
        for (k, u) in UTILISATIONS.iter().enumerate() {
            let p = runtime.block_on(phase(&server, &body, s.capacity, *u, seed + k as u64)).context(s.policy)?;
            rows.push((s.policy, p));
        }
    }
    println!(
        "| policy | utilisation | rate req/s | sent | 200 | late 200s (client) | late admitted (server) | statuses | would refuse | audited | met (server) | met (client) | false refusals (est.) | false / sent (goal ≤ 1 %) | false / sent, client's clock |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (policy, p) in &rows {
        println!(
            "| {policy} | {:.0} % | {:.1} | {} | {} | {} | {} | {:?} | {} ({:.2} %) | {} | {} | {} | {:.1} | {:.2} % | {:.2} % |",
            p.utilisation * 100.0,
            p.rate,
            p.sent,
            p.ok,
            p.late,
            p.late_admitted,
            p.statuses,
            p.would_refuse,
            p.share(p.would_refuse as f64) * 100.0,
            p.audited,
            p.met,
            p.met_client,
            p.false_refusals,
            p.share(p.false_refusals) * 100.0,
            p.share(p.false_refusals_client) * 100.0
        );
    }
    let phases: Vec<Value> = rows.iter().map(|(policy, p)| json!({ "policy": policy, "phase": p })).collect();
    println!(
        "{}",
        json!({ "bench": "admission", "slo_ms": SLO_MS, "seconds": SECONDS, "audit": audit, "seed": seed, "phases": phases })
    );
    // The worst policy at the highest utilisation below capacity.
    let at90: Vec<&Phase> = rows.iter().map(|(_, p)| p).filter(|p| p.utilisation == 0.9).collect();
    let worst = at90.iter().copied().max_by(|a, b| a.share(a.false_refusals).total_cmp(&b.share(b.false_refusals)));
    if let Some(w) = worst {
        println!(
            "admission: false refusals {:.2} % at 90 % utilisation ({:.2} % by the client's clock; refusals {:.2} %)",
            w.share(w.false_refusals) * 100.0,
            w.share(w.false_refusals_client) * 100.0,
            w.share(w.would_refuse as f64) * 100.0
        );
    }
    Ok(())
}
