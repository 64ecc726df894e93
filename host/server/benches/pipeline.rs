//! Per-hop overhead of a pipeline's intermediate requests in the live host.
//!
//! An in-process server serves, on the emulated executor with 1 µs models, a
//! single-task app `single` and a pipeline `chain` of three tasks in a line (fan-out
//! 1, so every client request makes exactly three hops). One client alternates
//! requests between the two, so both see the same machine state. The chain's extra
//! latency over the single app, divided by its two extra hops, is the cost of one
//! intermediate request: routing-table pick, early-drop check, queueing on the
//! task's worker, the policy's decision, the 1 µs execution (a blocking-thread
//! sleep: tens of µs, paid by the single app's one hop too), and the fan-out
//! bookkeeping.
//!
//! Run: `cargo bench -p sluice-server --bench pipeline`. Asserts nothing; prints a
//! table, then one JSON line.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::json;
use sluice_loadgen::{infer_body, Client};

/// Requests per target (after the warm-up).
const REQUESTS: usize = 3_000;
const WARMUP: usize = 300;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn profile() -> String {
    let mut s = String::from("version = 1\nname = \"hop-bench\"\ndevice = \"emulated\"\nsource = \"synthetic\"\n");
    for name in ["m0", "m1", "m2", "m3"] {
        s.push_str(&format!(
            "\n[[model]]\nname = \"{name}\"\naccuracy = 0.9\naccuracy_source = \"synthetic\"\nbatch_sizes = [1, 2]\np50_us = [1, 1]\np95_us = [1, 1]\np99_us = [1, 1]\n"
        ));
    }
    s
}

const PROBLEM: &str = r#"version = 1
kind = "loki"
profile = "profile.toml"
batch_sizes = [1, 2]
slo_ms = 1000
workers = 3
demand_qps = 10
[[pipeline.task]]
name = "a"
models = ["m1"]
[[pipeline.task]]
name = "b"
models = ["m2"]
[[pipeline.task]]
name = "c"
models = ["m3"]
[[pipeline.edge]]
from = "a"
to = "b"
[[pipeline.edge]]
from = "b"
to = "c"
"#;

fn pct(mut v: Vec<f64>, q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

async fn run() -> Result<()> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("profile.toml"), profile())?;
    std::fs::write(dir.path().join("problem.toml"), PROBLEM)?;
    let config = format!(
        r#"policy_dir = "{d}/policies"
builtin_policy_dir = "{p}"
[[app]]
name = "single"
slo_ms = 1000
workers = 1
executor = "emulated"
profile = "{d}/profile.toml"
models = ["m0"]
policy = "fixed"
params = {{ allocated = true }}
input = {{ name = "x", datatype = "FP32", shape = [4] }}
[[pipeline]]
name = "chain"
problem = "{d}/problem.toml"
executor = "emulated"
early_drop = "none"
replan_period_s = 0
input = {{ name = "x", datatype = "FP32", shape = [4] }}
"#,
        d = dir.path().display(),
        p = root().join("target/policies").display()
    );
    let config = sluice_server::config::Config::parse(&config, "bench config", dir.path())?;
    let state = sluice_server::state::State::build(config).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(sluice_server::server::run(listener, state, async {
        let _ = rx.await;
    }));
    let mut c = Client::connect(addr).await?;
    let body = infer_body("x", &[1, 4], &[1.0, 2.0, 3.0, 4.0]);
    let (mut single, mut chain) = (Vec::new(), Vec::new());
    for i in 0..WARMUP + REQUESTS {
        for (path, out) in [("/v2/models/single/infer", &mut single), ("/v2/models/chain/infer", &mut chain)] {
            let t = Instant::now();
            let r = c.post_json(path, &body).await?;
            let us = t.elapsed().as_secs_f64() * 1e6;
            anyhow::ensure!(r.status == 200, "{path}: {}", String::from_utf8_lossy(&r.body));
            if i >= WARMUP {
                out.push(us);
            }
        }
    }
    let _ = tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
    let (s50, s99, c50, c99) = (pct(single.clone(), 0.5), pct(single, 0.99), pct(chain.clone(), 0.5), pct(chain, 0.99));
    let (h50, h99) = ((c50 - s50) / 2.0, (c99 - s99) / 2.0);
    println!("| target | hops | p50 µs | p99 µs |");
    println!("|---|---|---|---|");
    println!("| single-task app (baseline) | 1 | {s50:.0} | {s99:.0} |");
    println!("| 3-task chain pipeline | 3 | {c50:.0} | {c99:.0} |");
    println!("| per extra hop: (chain − single) / 2 | | {h50:.0} | {h99:.0} |");
    println!(
        "{}",
        json!({ "bench": "pipeline-hop", "requests": REQUESTS, "single_p50_us": s50, "single_p99_us": s99,
                "chain_p50_us": c50, "chain_p99_us": c99, "hop_p50_us": h50, "hop_p99_us": h99,
                "ratio_chain_to_single_p50": c50 / s50 })
    );
    Ok(())
}

fn main() -> Result<()> {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?.block_on(run())
}
