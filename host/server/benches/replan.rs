//! `replan`: what re-planning costs the requests in flight. Two apps share 4 emulated
//! devices; an open-loop load sends to both while the allocator re-plans every
//! second for demand that alternates between the apps (hardware scaling first, so
//! every re-plan moves devices from one app to the other: loads, switches weights,
//! drains and unloads). A request is "during a re-plan" when it is sent between the
//! re-plan's start and 100 ms after its end (so the requests routed by the new
//! weights to the newly loaded workers count too). The baseline, in the same run, is
//! the latency of the requests sent outside those windows; the goal is p99 during a
//! re-plan ≤ 1.2× p99 outside.
//!
//! Run: `cargo bench -p sluice-server --bench replan`. Prints a table, then one JSON
//! line. Asserts nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use parking_lot::Mutex;
use serde_json::json;
use sluice_loadgen::Client;

/// Requests per second, over both apps.
const RATE: f64 = 1000.0;
/// Seconds of load.
const SECONDS: f64 = 10.0;
/// Connections sending the load.
const CONNECTIONS: usize = 32;
/// A re-plan's window extends this long past its end.
const TAIL: Duration = Duration::from_millis(100);
/// Time between re-plans.
const EVERY: Duration = Duration::from_millis(500);

const PROFILE: &str = r#"version = 1
name = "bench-devices"
device = "emulated"
source = "synthetic, for the replan bench"

[[model]]
name = "small"
accuracy = 0.6
accuracy_source = "synthetic"
batch_sizes = [1, 2, 4, 8]
p50_us = [300, 350, 450, 650]
p95_us = [300, 350, 450, 650]
p99_us = [300, 350, 450, 650]

[[model]]
name = "large"
accuracy = 0.8
accuracy_source = "synthetic"
batch_sizes = [1, 2, 4, 8]
p50_us = [600, 700, 900, 1300]
p95_us = [600, 700, 900, 1300]
p99_us = [600, 700, 900, 1300]
"#;

fn config(dir: &std::path::Path) -> String {
    let app = |name: &str| {
        format!(
            "[[app]]\nname = \"{name}\"\nexecutor = \"emulated\"\nprofile = \"{}/p.toml\"\ninput = {{ name = \"x\", datatype = \"FP32\", shape = [4] }}\nslo_ms = 50\nworkers = 4\nrouter = \"weighted\"\npolicy = \"jellyfish\"\n",
            dir.display()
        )
    };
    format!(
        "admin_token = \"bench\"\nbuiltin_policy_dir = \"{}/target/policies\"\n[[device]]\ntype = \"cpu\"\ncount = 4\nprofile = \"{}/p.toml\"\n[allocator]\nobjective = \"hardware-first\"\nperiod_s = 3600\nthreshold = 1000\ndemand_qps = {{ a = 9000, b = 100 }}\n{}\n{}",
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").display(),
        dir.display(),
        app("a"),
        app("b")
    )
}

fn pct(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("p.toml"), PROFILE)?;
    let config = sluice_server::config::Config::parse(&config(dir.path()), "replan bench", dir.path())?;
    let state = sluice_server::state::State::build(config).await.context("build the bench server")?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(sluice_server::server::run(listener, state.clone(), async {
        let _ = stopped.await;
    }));

    // (sent at, latency, status) of every request, and the re-plan windows.
    let samples: Arc<Mutex<Vec<(Instant, f64, u16)>>> = Arc::default();
    let windows: Arc<Mutex<Vec<(Instant, Instant, usize)>>> = Arc::default();
    let start = Instant::now() + Duration::from_millis(200);
    let interval = Duration::from_secs_f64(CONNECTIONS as f64 / RATE);
    let total = (RATE * SECONDS) as usize / CONNECTIONS;
    let mut load = tokio::task::JoinSet::new();
    for k in 0..CONNECTIONS {
        let samples = samples.clone();
        load.spawn(async move {
            let mut c = Client::connect(addr).await.expect("connect");
            let app = if k % 2 == 0 { "a" } else { "b" };
            let offset = interval.mul_f64(k as f64 / CONNECTIONS as f64);
            for i in 0..total {
                let at = start + offset + interval * i as u32;
                tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await;
                let sent = Instant::now();
                let body =
                    json!({ "inputs": [{ "name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, i] }] });
                let r = c.post_json(&format!("/v2/models/{app}/infer"), &body).await.expect("request");
                samples.lock().push((sent, sent.elapsed().as_secs_f64() * 1e3, r.status));
            }
        });
    }
    // Re-plans every second, alternating the demand between the apps.
    let w = windows.clone();
    let planner = tokio::spawn(async move {
        let mut c = Client::connect(addr).await.expect("connect");
        tokio::time::sleep_until(tokio::time::Instant::from_std(start + Duration::from_millis(500))).await;
        let n = ((SECONDS - 1.0) / EVERY.as_secs_f64()) as usize;
        for k in 0..n {
            let demand = if k % 2 == 0 { json!({ "a": 100, "b": 9000 }) } else { json!({ "a": 9000, "b": 100 }) };
            let body = json!({ "demand_qps": demand }).to_string();
            let t0 = Instant::now();
            let r = c
                .request("POST", "/admin/allocation/solve", &[("authorization", "Bearer bench")], body.as_bytes())
                .await
                .expect("re-plan");
            assert_eq!(r.status, 200, "re-plan: {}", String::from_utf8_lossy(&r.body));
            let plans = r.json()["history"].as_array().map_or(0, |h| h.len());
            w.lock().push((t0, Instant::now(), plans));
            tokio::time::sleep(EVERY).await;
        }
    });
    while load.join_next().await.is_some() {}
    planner.await?;
    let _ = stop.send(());
    let _ = server.await;

    let samples = samples.lock().clone();
    let windows = windows.lock().clone();
    let during_of = |t: Instant| windows.iter().any(|(a, b, _)| t >= *a && t <= *b + TAIL);
    let (mut during, mut outside): (Vec<f64>, Vec<f64>) = (Vec::new(), Vec::new());
    let mut errors = 0;
    for (sent, ms, status) in &samples {
        if *status != 200 {
            errors += 1;
        }
        if during_of(*sent) {
            during.push(*ms);
        } else {
            outside.push(*ms);
        }
    }
    let replan_ms: Vec<f64> = windows.iter().map(|(a, b, _)| (*b - *a).as_secs_f64() * 1e3).collect();
    let (nd, no) = (during.len(), outside.len());
    let (d50, d99) = (pct(&mut during, 0.5), pct(&mut during, 0.99));
    let (o50, o99) = (pct(&mut outside, 0.5), pct(&mut outside, 0.99));
    let ratio = d99 / o99;
    println!(
        "replan: 2 apps on 4 emulated devices, {RATE} req/s open loop for {SECONDS} s, a re-plan every {} ms moving a device between the apps",
        EVERY.as_millis()
    );
    println!("{:<22} {:>9} {:>9} {:>9}", "requests sent", "count", "p50 ms", "p99 ms");
    println!("{:<22} {:>9} {:>9.3} {:>9.3}", "during a re-plan", nd, d50, d99);
    println!("{:<22} {:>9} {:>9.3} {:>9.3}", "outside (baseline)", no, o50, o99);
    println!(
        "re-plans: {} taking {:.1}-{:.1} ms (solve, load, switch, drain, unload); non-200 answers: {errors}",
        windows.len(),
        replan_ms.iter().copied().fold(f64::INFINITY, f64::min),
        replan_ms.iter().copied().fold(0.0, f64::max)
    );
    println!(
        "goal: p99 during a re-plan <= 1.2x p99 outside: {ratio:.2}x -> {}",
        if ratio <= 1.2 { "MET" } else { "NOT MET" }
    );
    println!(
        "{}",
        json!({ "bench": "replan", "rate": RATE, "seconds": SECONDS, "during": { "n": nd, "p50_ms": d50, "p99_ms": d99 },
                "outside": { "n": no, "p50_ms": o50, "p99_ms": o99 }, "ratio_p99": ratio, "errors": errors,
                "replan_ms": replan_ms, "goal_met": ratio <= 1.2 })
    );
    Ok(())
}
