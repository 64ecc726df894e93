//! What-if evaluation (issue 14).
//!
//! 1. Speed: 10 minutes of 2,000 req/s Poisson arrivals (~1.2 M requests) of the
//!    image app — 60 workers, SLO 150 ms, the 9 Pareto models of the RAMSIS
//!    profile — replayed with the RAMSIS component (its 60-worker load grid) as
//!    the candidate against jellyfish as the current policy, one after the other
//!    (`evaluation_threads = 1`) and at once (`= 2`); and each replay alone.
//!    Baseline: the same replay with the host's native safe policy (no Wasm),
//!    same run. Goal: the evaluation in <= 2 s.
//! 2. Cost to serving: an in-process host serving `zero` (4 workers, jellyfish,
//!    zero-latency emulated models) at 1,000 req/s open loop, p99 without an
//!    evaluation and while `POST /admin/apps/image/evaluate` replays 1.2 M arrivals
//!    (written into the image app's ring) on the same machine. Bound: the overhead
//!    bench's goal, p99 <= 1 ms; the ratio to the run without is printed too.
//!
//! `cargo bench -p sluice --bench whatif` (needs `cargo xtask policies`; the RAMSIS
//! grid is `examples/experiments/ramsis-image-60.json`). Every speed figure is the
//! best of 3. Prints a table, then one JSON line.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use serde_json::json;
use sluice_core::app_config::AppConfig;
use sluice_core::whatif::{compare, PolicyUnderTest, ReplayControl, ReplayJob, Replayer};
use sluice_core::workload::ArrivalSpec;
use sluice_loadgen::{self as loadgen, Client, LoadArgs};
use sluice_sim::whatif::SimReplayer;
use sluice_sim::{Experiment, PolicyCache};

const PARETO: &str = r#"["shufflenet_v2_x0_5", "mobilenet_v3_large", "efficientnet_b0", "efficientnet_b2", "efficientnet_b3", "efficientnet_b4", "efficientnet_v2_s", "efficientnet_v2_m", "efficientnet_v2_l"]"#;
const RATE: f64 = 2_000.0;
const SECONDS: u64 = 600;
const GOAL_S: f64 = 2.0;
const BOUND_P99_MS: f64 = 1.0;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The image app as a config names it (the `[[app]]` lines).
fn image_app_toml(root: &Path) -> String {
    format!(
        "name = \"image\"\nslo_ms = 150\nworkers = 60\nrouter = \"round-robin\"\nexecutor = \"emulated\"\nprofile = \"{}\"\nmodels = {PARETO}\nmax_batch = 32\nmax_queue = 100000\npolicy = \"ramsis\"\nparams_file = \"{}\"\ninput = {{ name = \"x\", datatype = \"FP32\", shape = [4] }}\n",
        root.join("profiles/ramsis-image-cpu.toml").display(),
        root.join("examples/experiments/ramsis-image-60.json").display()
    )
}

fn image_app(root: &Path) -> Result<AppConfig> {
    let text = format!(
        "version = 1\nname = \"bench\"\nduration_s = 1\n[[app]]\n{}arrivals = {{ kind = \"poisson\", rate_qps = {RATE} }}\n",
        image_app_toml(root)
    );
    let e = Experiment::parse(&text, "whatif-bench", Path::new(""))?;
    Ok(e.apps[0].clone())
}

fn arrivals() -> Result<Vec<u64>> {
    let mut rng = sluice_sim::rng::Rng::new(1);
    let a = sluice_sim::arrivals::draw(
        &ArrivalSpec::Poisson { rate_qps: RATE },
        "image",
        Path::new(""),
        SECONDS * 1_000_000,
        &mut rng,
    )?;
    Ok(a.into_iter().map(|a| a.at).collect())
}

fn best_of_3(mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t = Instant::now();
        f()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(best)
}

struct Speed {
    label: &'static str,
    seconds: f64,
}

fn speed(root: &Path, arrivals: Arc<Vec<u64>>) -> Result<(Vec<Speed>, serde_json::Value)> {
    let app = image_app(root)?;
    let mut cache = PolicyCache::new(root.join("target/policies"), root.to_path_buf())?;
    let grid = std::fs::read_to_string(root.join("examples/experiments/ramsis-image-60.json"))
        .context("the RAMSIS grid examples/experiments/ramsis-image-60.json")?;
    let ramsis = PolicyUnderTest { name: "ramsis".into(), compiled: Some(cache.get("ramsis")?), params: grid };
    let jellyfish =
        PolicyUnderTest { name: "jellyfish".into(), compiled: Some(cache.get("jellyfish")?), params: "{}".into() };
    let safe = PolicyUnderTest { name: "safe".into(), compiled: None, params: "{}".into() };
    let job = |policy: PolicyUnderTest| ReplayJob {
        app: app.clone(),
        loaded: None,
        duration_us: arrivals.last().copied().unwrap_or(0) + 1,
        arrivals_us: arrivals.clone(),
        series_window_us: 60_000_000,
        engine: cache.engine().clone(),
        policy,
    };
    let (candidate, current, native) = (job(ramsis), job(jellyfish), job(safe));
    let one = |j: &ReplayJob, threads: usize| -> Result<()> {
        SimReplayer.replay(j, &ReplayControl::default(), threads).map(|_| ()).map_err(|e| anyhow::anyhow!("{e}"))
    };
    let mut last = None;
    let mut both = |parallel: bool| -> Result<()> {
        let controls = [ReplayControl::default(), ReplayControl::default()];
        let c = compare(&SimReplayer, &candidate, &current, &controls, parallel).map_err(|e| anyhow::anyhow!("{e}"))?;
        last = Some(c);
        Ok(())
    };
    // A profiling hook: `SLUICE_WHATIF_ONLY=jellyfish` (or `ramsis`, `safe`) replays
    // only that policy, three times (on `SLUICE_WHATIF_THREADS`, default 1), for
    // `perf record`; `=evaluation` only the evaluation on that many threads.
    if let Ok(only) = std::env::var("SLUICE_WHATIF_ONLY") {
        let threads = std::env::var("SLUICE_WHATIF_THREADS").ok().and_then(|t| t.parse().ok()).unwrap_or(1);
        if only == "evaluation" {
            let s = best_of_3(|| both(threads > 1))?;
            println!("evaluation on {threads}: {s:.3} s");
            std::process::exit(0);
        }
        let j = match only.as_str() {
            "ramsis" => &candidate,
            "jellyfish" => &current,
            _ => &native,
        };
        let s = best_of_3(|| one(j, threads))?;
        println!("replay {only}: {s:.3} s");
        std::process::exit(0);
    }
    let rows = vec![
        Speed { label: "replay: safe (native)", seconds: best_of_3(|| one(&native, 1))? },
        Speed { label: "replay: ramsis (grid)", seconds: best_of_3(|| one(&candidate, 1))? },
        Speed { label: "replay: jellyfish", seconds: best_of_3(|| one(&current, 1))? },
        Speed { label: "ramsis, split on 2", seconds: best_of_3(|| one(&candidate, 2))? },
        Speed { label: "jellyfish, split on 2", seconds: best_of_3(|| one(&current, 2))? },
        Speed { label: "evaluation, 1 thread", seconds: best_of_3(|| both(false))? },
        Speed { label: "evaluation, 2 threads", seconds: best_of_3(|| both(true))? },
    ];
    let c = last.context("no comparison")?;
    let summary = json!({
        "candidate": { "policy": c.candidate.policy, "accuracy": c.candidate.accuracy, "violation_rate": c.candidate.violation_rate, "p99_ms": c.candidate.p99_ms },
        "current": { "policy": c.current.policy, "accuracy": c.current.accuracy, "violation_rate": c.current.violation_rate, "p99_ms": c.current.p99_ms },
    });
    Ok((rows, summary))
}

/// p99 (ms) of `zero` at 1,000 req/s for `seconds`.
async fn p99(addr: std::net::SocketAddr, seconds: f64) -> Result<(f64, u64)> {
    let s = loadgen::run(LoadArgs {
        addr,
        app: "zero".into(),
        rate: 1_000.0,
        concurrency: 64,
        duration: seconds,
        input: None,
        swaps: Vec::new(),
        admin_token: None,
        json: false,
    })
    .await?;
    let bad: u64 = s.by_status.iter().filter(|(k, _)| **k != 200).map(|(_, v)| v).sum();
    Ok((s.latency_ms.get("p99").copied().unwrap_or(f64::NAN), bad))
}

struct Live {
    p99_without: f64,
    p99_during: f64,
    non_200: u64,
    evaluation_wall_s: f64,
    replay_wall_ms: f64,
}

fn live(root: &Path, arrivals: &[u64]) -> Result<Live> {
    let dir = tempfile::tempdir()?;
    let text = format!(
        "admin_token = \"bench\"\nbuiltin_policy_dir = \"{}\"\npolicy_dir = \"{}\"\n[[app]]\nname = \"zero\"\nslo_ms = 100\nworkers = 4\nrouter = \"round-robin\"\nexecutor = \"emulated\"\nprofile = \"{}\"\nmax_queue = 10000\npolicy = \"jellyfish\"\ninput = {{ name = \"x\", datatype = \"FP32\", shape = [4] }}\n[[app]]\n{}",
        root.join("target/policies").display(),
        dir.path().display(),
        root.join("examples/profiles/zero-latency.toml").display(),
        image_app_toml(root)
    );
    let config = sluice_server::config::Config::parse(&text, "whatif-bench", dir.path())?;
    // The host on its own runtime, as `sluice serve` runs it; the client on another.
    let server_rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let state = server_rt.block_on(sluice_server::state::State::build(config))?;
    state.set_replayer(Arc::new(SimReplayer));
    let listener = server_rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = server_rt.spawn(sluice_server::server::run(listener, state.clone(), async {
        let _ = stopped.await;
    }));
    let ring = state.apps["image"].ring.get().context("the image app's ring")?;
    for &t in arrivals {
        ring.record(t);
    }
    let client_rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let out = client_rt.block_on(async {
        p99(addr, 1.0).await?; // warm-up
        let (p99_without, bad_a) = p99(addr, 4.0).await?;
        let mut admin = Client::connect(addr).await?;
        let auth = [("authorization", "Bearer bench"), ("content-type", "application/json")];
        let body = json!({ "policy": "jellyfish", "window_s": 3600 }).to_string();
        let t = Instant::now();
        let r = admin.request("POST", "/admin/apps/image/evaluate", &auth, body.as_bytes()).await?;
        if r.status != 202 {
            bail!("evaluate: {} {}", r.status, r.text());
        }
        let id = r.json()["id"].as_u64().unwrap_or(0);
        let load = tokio::spawn(p99(addr, 4.0));
        let view = loop {
            let v = admin.request("GET", &format!("/admin/evaluations/{id}"), &auth, b"").await?.json();
            if v["status"] != "running" {
                break v;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let evaluation_wall_s = t.elapsed().as_secs_f64();
        if view["status"] != "done" {
            bail!("evaluation: {view}");
        }
        let (p99_during, bad_b) = load.await??;
        Ok(Live {
            p99_without,
            p99_during,
            non_200: bad_a + bad_b,
            evaluation_wall_s,
            replay_wall_ms: view["wall_ms"].as_f64().unwrap_or(f64::NAN),
        })
    });
    let _ = stop.send(());
    let _ = server_rt.block_on(server);
    out
}

fn main() -> Result<()> {
    let root = root();
    for p in ["ramsis", "jellyfish"] {
        if !root.join(format!("target/policies/{p}.wasm")).exists() {
            bail!("target/policies/{p}.wasm is missing: run `cargo xtask policies` first");
        }
    }
    let arrivals = Arc::new(arrivals()?);
    let (rows, summary) = speed(&root, arrivals.clone())?;
    let live = live(&root, &arrivals)?;

    println!(
        "what-if: {} arrivals ({SECONDS} s at {RATE} req/s), image app, 60 workers, SLO 150 ms (best of 3)",
        arrivals.len()
    );
    let base = rows[0].seconds;
    println!("{:<24} {:>9} {:>12} {:>9}", "case", "wall s", "req/s", "vs safe");
    for r in &rows {
        let replays = if r.label.starts_with("evaluation") { 2.0 } else { 1.0 };
        println!(
            "{:<24} {:>9.3} {:>12.0} {:>8.2}x",
            r.label,
            r.seconds,
            replays * arrivals.len() as f64 / r.seconds,
            r.seconds / base
        );
    }
    let seq = rows[5].seconds;
    let par = rows[6].seconds;
    println!("evaluation (ramsis vs jellyfish): {seq:.3} s on 1 thread, {par:.3} s on 2 (goal <= {GOAL_S} s)");
    println!("replays: {summary}");
    println!(
        "live: zero at 1,000 req/s, p99 {:.3} ms without an evaluation, {:.3} ms during one (x{:.2}; bound {BOUND_P99_MS} ms); non-200: {}; the evaluation took {:.3} s from POST to done ({:.0} ms replaying)",
        live.p99_without,
        live.p99_during,
        live.p99_during / live.p99_without,
        live.non_200,
        live.evaluation_wall_s,
        live.replay_wall_ms
    );
    let json_rows: Vec<_> = rows.iter().map(|r| json!({ "case": r.label, "wall_seconds": r.seconds })).collect();
    println!(
        "{}",
        json!({
            "bench": "whatif",
            "requests": arrivals.len(),
            "rows": json_rows,
            "goal_seconds": GOAL_S,
            "live": {
                "p99_without_ms": live.p99_without,
                "p99_during_ms": live.p99_during,
                "ratio": live.p99_during / live.p99_without,
                "bound_ms": BOUND_P99_MS,
                "non_200": live.non_200,
                "evaluation_wall_seconds": live.evaluation_wall_s,
                "replay_wall_ms": live.replay_wall_ms,
            },
        })
    );
    Ok(())
}
