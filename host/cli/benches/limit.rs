//! The limit of the held rate (issue 36, part 2): how far the rate sluice holds on
//! the peers setting is from what any scheduler could hold.
//!
//! The setting of `cargo xtask peers` (BENCHMARKS.md §8): ResNet-50 on the light
//! ImageNet CPU profile (`profiles/imagenet-light-cpu.toml`, its p95 table, the
//! app's default percentile: 104 / 279 / 385 / 492 ms at batch 1–4), 2 workers,
//! batches ≤ 4, a 400 ms SLO, `shortest-queue` routing, Poisson arrivals. A rate is
//! *held* when ≥ 99 % of the requests (all seeds pooled) are answered within the
//! SLO. Three figures per rate, on the same arrivals (`sluice_loadgen::poisson`'s
//! schedule for each seed, in µs):
//! 1. **The bound**: the clairvoyant optimum (`sluice_sim::limit::min_misses`,
//!    exact: it knows every arrival and chooses the batches offline), so no policy
//!    can hold more on these arrivals.
//! 2. **The simulator**: every built-in policy that runs without generated tables
//!    (the components in `target/policies`) through the simulator's normal path
//!    (`Simulation::with_inputs`, the arrivals given) with the same app config as
//!    the live host, each with a small sweep of its params.
//! 3. **The live host**: `sluice serve` (the binary cargo builds for the bench) on
//!    the *emulated* executor, which waits the same table, so the machine's cores do
//!    not decide the answer; a fresh server per seed and rate, driven open loop by
//!    `sluice_loadgen::poisson` with the same seeds; each policy with the params the
//!    simulator held best with. On time is measured at the client. Bodies are the
//!    binary tensor extension (one FP32 [1, 3, 224, 224] image, 602 KB).
//!
//! The held rate comes from `sluice_sim::limit::highest_held`: up in coarse steps
//! until a rate fails, then bisection. The bound and the simulator search from 1
//! req/s in steps of 1 to 0.1 req/s; the live search starts one step below the
//! simulator's figure, steps of 0.5, to 0.25 req/s (each live probe costs its
//! seconds of arrivals per seed, so 3–4 probes per policy, ~2 minutes).
//!
//! Run: `cargo bench -p sluice --bench limit` (needs `cargo xtask policies`).
//! Environment: `LIMIT_SECONDS` (arrivals per seed, default 12, as the peers run),
//! `LIMIT_SEEDS` (default `13,14`; 13 is the peers run's), `LIMIT_POLICIES`
//! (comma-separated policies to run, default all), `LIMIT_PROFILE` (another
//! profile with a `resnet50`, relative to the repository root), `LIMIT_LIVE=0` (the simulator
//! only), `LIMIT_ADMIT_ALL=1` (the live host with `admission_audit = 1`: every
//! request admitted, as in the simulator, which has no admission; the default is
//! the peers run's config, whose admission refuses requests it predicts late),
//! `LIMIT_SERVER_LOG` (the live server's `RUST_LOG`, its log on this stderr; e.g.
//! `sluice_server::executor::emulated=trace` for each batch's start and overrun),
//! `SLUICE_BENCH_EXE` (another build of `sluice` to serve: an A/B of two builds). Prints a table, a line
//! `limit: bound X req/s (exact), best sim P at Y, best live P at Z (Z/X %)`, then
//! one JSON line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use serde_json::json;
use sluice_core::profile::{Percentile, Profile};
use sluice_loadgen::poisson::{arrival_times, run_poisson, PoissonArgs};
use sluice_sim::arrivals::Arrival;
use sluice_sim::engine::{RunInputs, Simulation};
use sluice_sim::limit::{highest_held, min_misses, Held, Setting};
use sluice_sim::{Experiment, PolicyCache};

mod common;

const SLO_MS: f64 = 400.0;
const WORKERS: u32 = 2;
const MAX_BATCH: usize = 4;
const MODEL: &str = "resnet50";
const PROFILE: &str = "profiles/imagenet-light-cpu.toml";
/// On-time fraction (pooled over the seeds) at which a rate is held.
const HELD: f64 = 0.99;
/// The search: the simulator's and the bound's.
const SIM_SEARCH: (f64, f64, f64, f64) = (1.0, 1.0, 0.1, 40.0);
/// The live search's steps (its start is one coarse step below the simulator's figure).
const LIVE_COARSE: f64 = 0.5;
const LIVE_FINE: f64 = 0.25;
/// Seconds per seed of the long traces the bound is also computed on.
const LONG_SECONDS: f64 = 600.0;
/// A request unanswered after this counts as not on time and is abandoned.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Every policy of the peers run and the params swept for it; the first is the
/// peers run's own.
const POLICIES: &[(&str, &[&str])] = &[
    ("fixed", &["{ model = \"resnet50\" }"]),
    ("jellyfish", &["{}", "{ max_batch = 1 }", "{ headroom = 1.0 }"]),
    ("lazy-drop", &["{}", "{ max_batch = 1 }", "{ max_batch = 2 }"]),
    ("nexus", &["{}", "{ work_conserving = true }", "{ batch = 1, work_conserving = true }"]),
    ("clipper-aimd", &["{}", "{ max_batch = 1 }", "{ drop_late = true }", "{ backoff = 0.5 }"]),
    ("proteus-batching", &["{}", "{ max_batch = 1 }"]),
    ("spread-drop", &["{}", "{ early_drop = true }"]),
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repository root")
}

/// The `[[app]]` lines the live server and the simulator both read.
/// `expire_after_ms = 0` is the live host's default, written out because the
/// simulator's own default is one SLO (the papers' simulators serve late
/// requests late, spending a worker on them).
fn app_config(profile: &Path, policy: &str, params: &str) -> String {
    format!(
        "name = \"img\"\nslo_ms = {SLO_MS}\nworkers = {WORKERS}\nrouter = \"shortest-queue\"\nexecutor = \"emulated\"\n\
         expire_after_ms = 0\n\
         profile = \"{profile}\"\nmodels = [\"{MODEL}\"]\nmax_batch = {MAX_BATCH}\n\
         policy = \"{policy}\"\nparams = {params}\ninput = {{ name = \"data_0\", datatype = \"FP32\", shape = [3, 224, 224] }}\n",
        profile = profile.display()
    )
}

/// The arrivals of one seed at `rate`, µs: the load generator's own schedule.
fn trace(rate: f64, seconds: f64, seed: u64) -> Vec<u64> {
    arrival_times(rate, Duration::from_secs_f64(seconds), seed).iter().map(|t| (t * 1e6).round() as u64).collect()
}

/// What the bench's environment asks for.
struct Options {
    seconds: f64,
    seeds: Vec<u64>,
    policies: Vec<String>,
    live: bool,
    admit_all: bool,
}

impl Options {
    fn from_env() -> Result<Options> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let seconds = var("LIMIT_SECONDS").map_or(Ok(12.0), |v| v.parse()).context("LIMIT_SECONDS")?;
        let seeds = match var("LIMIT_SEEDS") {
            Some(v) => v.split(',').map(|s| s.trim().parse()).collect::<Result<_, _>>().context("LIMIT_SEEDS")?,
            None => vec![13, 14],
        };
        let policies = var("LIMIT_POLICIES").map_or_else(
            || POLICIES.iter().map(|(p, _)| p.to_string()).collect(),
            |v| v.split(',').map(|s| s.trim().to_string()).collect(),
        );
        Ok(Options {
            seconds,
            seeds,
            policies,
            live: var("LIMIT_LIVE").as_deref() != Some("0"),
            admit_all: var("LIMIT_ADMIT_ALL").as_deref() == Some("1"),
        })
    }
}

/// The simulator's side: one experiment per (policy, params), run on given arrivals.
struct Sim {
    root: PathBuf,
    profile: PathBuf,
    cache: PolicyCache,
    profiles: BTreeMap<PathBuf, Profile>,
}

impl Sim {
    /// Requests on time and requests, of one run of `seconds` on `arrivals`.
    fn run(&mut self, policy: &str, params: &str, seconds: f64, arrivals: &[u64]) -> Result<(u64, u64)> {
        let text = format!(
            "version = 1\nname = \"limit\"\nduration_s = {}\nbuiltin_policy_dir = \"{}/target/policies\"\n\n[[app]]\n{}\
             arrivals = {{ kind = \"poisson\", rate_qps = 1.0 }}\n",
            seconds,
            self.root.display(),
            app_config(&self.profile, policy, params)
        );
        let exp = Experiment::parse(&text, "limit", &self.root)?;
        let run = exp.runs().remove(0);
        let given = RunInputs {
            arrivals: vec![Some(arrivals.iter().map(|&at| Arrival { at, budget: None }).collect())],
            ..RunInputs::default()
        };
        let sim = Simulation::with_inputs(&exp, &self.root, &run, &self.profiles, &mut self.cache, given)?;
        let (r, _, _) = sim.run().remove(0);
        Ok((r.on_time, r.requests))
    }

    /// The pooled on-time fraction over the seeds' traces of `seconds` at `rate`.
    fn fraction(&mut self, policy: &str, params: &str, rate: f64, seeds: &[u64], seconds: f64) -> Result<f64> {
        let (mut on_time, mut total) = (0, 0);
        for &seed in seeds {
            let (o, n) = self.run(policy, params, seconds, &trace(rate, seconds, seed))?;
            on_time += o;
            total += n;
        }
        Ok(if total == 0 { 1.0 } else { on_time as f64 / total as f64 })
    }
}

/// A request's body and its header lines.
type Request = (Arc<Vec<u8>>, Arc<Vec<(String, String)>>);

/// The request body: the binary tensor extension, a JSON header then the raw FP32 bytes.
fn body() -> Request {
    let elements = 3 * 224 * 224;
    let head = json!({ "inputs": [{ "name": "data_0", "datatype": "FP32", "shape": [1, 3, 224, 224],
        "parameters": { "binary_data_size": elements * 4 } }] })
    .to_string();
    let mut bytes = head.clone().into_bytes();
    for i in 0..elements {
        bytes.extend((((i * 7919) % 1000) as f32 / 1000.0 - 0.5).to_le_bytes());
    }
    let headers = vec![
        ("content-type".to_string(), "application/octet-stream".to_string()),
        ("inference-header-content-length".to_string(), head.len().to_string()),
    ];
    (Arc::new(bytes), Arc::new(headers))
}

/// The live side: a fresh `sluice serve` per seed and rate.
struct Live {
    root: PathBuf,
    profile: PathBuf,
    dir: tempfile::TempDir,
    runtime: tokio::runtime::Runtime,
    body: Request,
    seconds: f64,
    /// Answers the server counted late (its own clock), over every probe.
    server_late: u64,
    /// `admission_audit = 1` in the app: every request admitted.
    admit_all: bool,
    /// `LIMIT_SERVER_LOG`: the live server's `RUST_LOG` (its log on this stderr).
    server_log: Option<String>,
    /// What the requests of the last probe got: `on-time`, `late` (200 past the
    /// SLO), or the status (`429`, `504`, …; `timeout` past [`TIMEOUT`]).
    outcomes: BTreeMap<String, u64>,
}

impl Live {
    /// On time (200 within the SLO at the client) and sent, of one seed at `rate`.
    fn run(&mut self, policy: &str, params: &str, rate: f64, seed: u64) -> Result<(u64, u64)> {
        let config = format!(
            "builtin_policy_dir = \"{root}/target/policies\"\npolicy_dir = \"{dir}/policies\"\n\n[[app]]\n{app}",
            root = self.root.display(),
            dir = self.dir.path().display(),
            app = app_config(&self.profile, policy, params)
        ) + if self.admit_all { "admission_audit = 1.0\n" } else { "" };
        let path = self.dir.path().join("limit.toml");
        std::fs::write(&path, config)?;
        let server = match &self.server_log {
            // The server's own log filter (the default start silences it to `warn`):
            // a trace of its batches to set against the table.
            Some(filter) => {
                // `SLUICE_BENCH_EXE`, as `common::start_server`: another build (an A/B).
                let exe = std::env::var_os("SLUICE_BENCH_EXE").unwrap_or_else(|| env!("CARGO_BIN_EXE_sluice").into());
                let mut command = std::process::Command::new(exe);
                command.arg("serve").arg("--config").arg(&path).args(["--listen", "127.0.0.1:0"]);
                command.env("RUST_LOG", filter);
                common::start_process(command)?
            }
            None => common::start_server(&path)?,
        };
        let (bytes, headers) = self.body.clone();
        let seconds = self.seconds;
        let (records, late) = self.runtime.block_on(async {
            // One request first: the server answers (its policy is instantiated),
            // then a pause longer than the load monitor's 500 ms window so the
            // warm-up is out of its estimate when the arrivals start.
            let mut client = sluice_loadgen::Client::connect(server.addr).await?;
            let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let r = client.request("POST", "/v2/models/img/infer", &h, &bytes).await?;
            anyhow::ensure!(r.status == 200, "warm-up: status {}", r.status);
            tokio::time::sleep(Duration::from_millis(700)).await;
            let records = run_poisson(PoissonArgs {
                addr: server.addr,
                path: "/v2/models/img/infer".into(),
                body: bytes,
                headers,
                rate,
                duration: Duration::from_secs_f64(seconds),
                seed,
                timeout: TIMEOUT,
                max_connections: 512,
            })
            .await?;
            let late = sluice_loadgen::server_count(server.addr, "late").await.unwrap_or(0);
            Ok::<_, anyhow::Error>((records, late))
        })?;
        self.server_late += late;
        for r in &records {
            let key = match r.status {
                200 if r.latency_ms <= SLO_MS => "on-time".to_string(),
                200 => "late".to_string(),
                sluice_loadgen::poisson::STATUS_TIMEOUT => "timeout".to_string(),
                s => s.to_string(),
            };
            *self.outcomes.entry(key).or_default() += 1;
        }
        let on_time = records.iter().filter(|r| r.status == 200 && r.latency_ms <= SLO_MS).count() as u64;
        Ok((on_time, records.len() as u64))
    }

    fn fraction(&mut self, policy: &str, params: &str, rate: f64, seeds: &[u64]) -> Result<f64> {
        self.outcomes.clear();
        let (mut on_time, mut total) = (0, 0);
        for &seed in seeds {
            let (o, n) = self.run(policy, params, rate, seed)?;
            on_time += o;
            total += n;
        }
        Ok(if total == 0 { 1.0 } else { on_time as f64 / total as f64 })
    }
}

fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// One policy's row.
#[derive(serde::Serialize)]
struct Row {
    policy: String,
    /// The params the simulator held best with (the live run's).
    params: String,
    /// Per params: the simulator's held rate.
    sweep: Vec<(String, f64)>,
    sim: Held,
    /// The simulator's held rate on the long traces (the best params).
    sim_long: f64,
    live: Option<Held>,
    live_seconds: f64,
}

fn main() -> Result<()> {
    let opts = Options::from_env()?;
    let root = root();
    let started = Instant::now();
    let load_start = loadavg();
    // `LIMIT_PROFILE`: another profile (one measured on the machine at hand, or
    // this one with an overhead added to every batch), relative to the root.
    let profile_path = std::env::var("LIMIT_PROFILE").map_or_else(|_| root.join(PROFILE), |p| root.join(p));
    let profile = Profile::load(&profile_path)?;
    let table = profile.model(MODEL).context("resnet50 in the profile")?.latency_table(Percentile::P95);
    let setting = Setting {
        workers: WORKERS as usize,
        latency_us: table[..MAX_BATCH.min(table.len())].to_vec(),
        slo_us: (SLO_MS * 1000.0) as u64,
    };

    // 1. The bound, on the same traces.
    let t = Instant::now();
    let (start, coarse, fine, max) = SIM_SEARCH;
    let bound = highest_held(start, coarse, fine, max, |rate| {
        let traces: Vec<Vec<u64>> = opts.seeds.iter().map(|&s| trace(rate, opts.seconds, s)).collect();
        sluice_sim::limit::on_time_fraction(&setting, &traces, HELD).map(|f| f.is_some())
    })?;
    let bound_seconds = t.elapsed().as_secs_f64();
    // The same bound on long traces (10 seeds × 600 s, ~1.5 M requests over the
    // search, under 2 s): the steady state, without the short traces' luck.
    let t = Instant::now();
    let long_seeds: Vec<u64> = (13..23).collect();
    let bound_long = highest_held(start, coarse, fine, max, |rate| {
        let traces: Vec<Vec<u64>> = long_seeds.iter().map(|&s| trace(rate, LONG_SECONDS, s)).collect();
        sluice_sim::limit::on_time_fraction(&setting, &traces, HELD).map(|f| f.is_some())
    })?;
    let bound_long_seconds = t.elapsed().as_secs_f64();
    // Fewest misses at the bound's held rate, for the record.
    eprintln!(
        "limit: bound {:.2} req/s on {} × {} s ({bound_seconds:.2} s), {:.2} req/s on 10 × {LONG_SECONDS} s ({bound_long_seconds:.2} s); table {:?} µs",
        bound.rate,
        opts.seeds.len(),
        opts.seconds,
        bound_long.rate,
        setting.latency_us
    );
    let at_bound: usize = opts
        .seeds
        .iter()
        .map(|&s| min_misses(&setting, &trace(bound.rate, opts.seconds, s), usize::MAX).map(|m| m.unwrap_or(0)))
        .sum::<Result<usize, _>>()?;

    // 2. The simulator, every policy and params.
    let mut sim = Sim {
        cache: PolicyCache::new(root.join("target/policies"), root.clone())?,
        profiles: BTreeMap::from([(profile_path.clone(), profile.clone())]),
        profile: profile_path.clone(),
        root: root.clone(),
    };
    let mut live = Live {
        root: root.clone(),
        profile: profile_path.clone(),
        dir: tempfile::tempdir()?,
        runtime: tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?,
        body: body(),
        seconds: opts.seconds,
        server_late: 0,
        outcomes: BTreeMap::new(),
        admit_all: opts.admit_all,
        server_log: std::env::var("LIMIT_SERVER_LOG").ok().filter(|v| !v.is_empty()),
    };
    let mut rows = Vec::new();
    for (policy, sweep) in POLICIES.iter().filter(|(p, _)| opts.policies.iter().any(|o| o == p)) {
        let mut best: Option<(String, Held)> = None;
        let mut swept = Vec::new();
        for params in *sweep {
            let held = highest_held(start, coarse, fine, max, |rate| {
                sim.fraction(policy, params, rate, &opts.seeds, opts.seconds).map(|f| f >= HELD)
            })?;
            eprintln!("limit: sim {policy} {params}: held {:.2} req/s", held.rate);
            swept.push((params.to_string(), held.rate));
            if best.as_ref().is_none_or(|(_, b)| held.rate > b.rate) {
                best = Some((params.to_string(), held));
            }
        }
        let (params, sim_held) = best.context("a policy without params to run")?;
        // The best params on the long traces too: the steady state, beside the
        // bound's (a few seconds per policy).
        let sim_long = highest_held(start, coarse, fine, max, |rate| {
            sim.fraction(policy, &params, rate, &long_seeds, LONG_SECONDS).map(|f| f >= HELD)
        })?;
        eprintln!("limit: sim {policy} {params} on 10 × {LONG_SECONDS} s: held {:.2} req/s", sim_long.rate);
        // 3. The live host, the best params, searched from one step below the
        // simulator's figure.
        let t = Instant::now();
        let live_held = if opts.live && sim_held.rate > 0.0 {
            let from = (sim_held.rate - LIVE_COARSE).max(LIVE_FINE);
            let held = highest_held(from, LIVE_COARSE, LIVE_FINE, max, |rate| {
                let f = live.fraction(policy, &params, rate, &opts.seeds)?;
                eprintln!(
                    "limit: live {policy} {params} at {rate:.2} req/s: {:.2} % on time {:?} (load {:.1})",
                    100.0 * f,
                    live.outcomes,
                    loadavg()
                );
                Ok::<_, anyhow::Error>(f >= HELD)
            })?;
            Some(held)
        } else {
            None
        };
        rows.push(Row {
            policy: policy.to_string(),
            params,
            sweep: swept,
            sim: sim_held,
            sim_long: sim_long.rate,
            live: live_held,
            live_seconds: t.elapsed().as_secs_f64(),
        });
    }

    println!(
        "\n| policy | params (best in the simulator) | sim held req/s | live held req/s | live / sim (goal ≥ 0.95) | live / bound (goal ≥ 0.90) | sim / bound | sim, 10 × {LONG_SECONDS} s / bound there | params swept: held |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---|");
    let ratio = |a: f64, b: f64| if b > 0.0 { format!("{:.2}", a / b) } else { "–".into() };
    for r in &rows {
        let live = r.live.as_ref().map(|h| h.rate);
        println!(
            "| {} | `{}` | {:.2} | {} | {} | {} | {} | {:.2} / {} | {} |",
            r.policy,
            r.params,
            r.sim.rate,
            live.map_or("–".into(), |l| format!("{l:.2}")),
            live.map_or("–".into(), |l| ratio(l, r.sim.rate)),
            live.map_or("–".into(), |l| ratio(l, bound.rate)),
            ratio(r.sim.rate, bound.rate),
            r.sim_long,
            ratio(r.sim_long, bound_long.rate),
            r.sweep.iter().map(|(p, h)| format!("`{p}` {h:.2}")).collect::<Vec<_>>().join(", ")
        );
    }
    println!(
        "| clairvoyant bound (exact on these arrivals) | – | {:.2} | – | – | – | 1.00 | {:.2} / 1.00 | – |",
        bound.rate, bound_long.rate
    );
    let best_sim = rows.iter().max_by(|a, b| a.sim.rate.total_cmp(&b.sim.rate));
    let best_live = rows.iter().filter(|r| r.live.is_some()).max_by(|a, b| {
        let l = |r: &Row| r.live.as_ref().map_or(0.0, |h| h.rate);
        l(a).total_cmp(&l(b))
    });
    let load_end = loadavg();
    if opts.admit_all {
        println!("(live with `admission_audit = 1`: every request admitted)");
    }
    println!(
        "limit: bound {:.2} req/s (exact), best sim {} at {:.2}, best live {} at {:.2} ({:.0} %)",
        bound.rate,
        best_sim.map_or("–", |r| r.policy.as_str()),
        best_sim.map_or(0.0, |r| r.sim.rate),
        best_live.map_or("–", |r| r.policy.as_str()),
        best_live.and_then(|r| r.live.as_ref()).map_or(0.0, |h| h.rate),
        100.0 * best_live.and_then(|r| r.live.as_ref()).map_or(0.0, |h| h.rate) / bound.rate.max(f64::MIN_POSITIVE)
    );
    println!(
        "{}",
        json!({
            "bench": "limit", "slo_ms": SLO_MS, "workers": WORKERS, "max_batch": MAX_BATCH, "model": MODEL,
            "latency_us": setting.latency_us, "held": HELD, "admit_all": opts.admit_all, "seconds": opts.seconds, "seeds": opts.seeds,
            "bound": { "kind": "exact", "held": bound, "misses_at_held": at_bound, "seconds": bound_seconds },
            "bound_long": { "seeds": long_seeds, "seconds_per_seed": LONG_SECONDS, "held": bound_long, "wall_seconds": bound_long_seconds },
            "rows": rows, "server_late": live.server_late,
            "loadavg": [load_start, load_end], "wall_seconds": started.elapsed().as_secs_f64(),
        })
    );
    Ok(())
}
