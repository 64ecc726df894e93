//! Memory over a long soak (issue 40): does the server give memory back after a
//! long run of varied traffic, once it idles?
//!
//! Starts the real binary (`sluice serve`, cargo builds it for the bench) in a
//! process of its own on the embedded default (the trained EfficientNet-Lite family
//! on ONNX Runtime, `[3, 260, 260]` FP32 inputs, jellyfish) — what an operator runs
//! first, and where the second probe saw RSS grow from 308 MB to 1.2 GB and stay
//! there. The load mixes, at Poisson arrivals, image requests as JSON (~1.2 MB),
//! as binary tensors (811 KB), gzip-compressed JSON, and bad bodies (truncated
//! JSON, a wrong shape, a non-finite number in JSON, a binary size that does not
//! match), in rounds that alternate 30 s at `SLUICE_MEMORY_RATE` (default 40
//! req/s) with 30 s at three times that (overload: most of it refused at
//! admission), for `SLUICE_MEMORY_SECONDS` (default 1800: the 30-minute
//! soak). It reads the server's RSS:
//! - at start, idle;
//! - warm: after one 60 s round of the same load and `IDLE_S` of idling (the first
//!   figure a soak can be held to: ONNX Runtime's arenas and the policy instances
//!   are sized by then);
//! - at its peak during the soak;
//! - after the soak and `IDLE_S` of idling (goal: within 10 % of warm).
//!
//! Every answer is counted by status; a transport error or a 5xx fails the run.
//!
//! Run: `cargo bench -p sluice --bench memory` (needs `cargo xtask setup` for the
//! models and ONNX Runtime, and `cargo xtask policies`). A short run:
//! `SLUICE_MEMORY_SECONDS=180 cargo bench -p sluice --bench memory`. Ends with the
//! line `memory: RSS start X MiB, warm Y MiB, peak P MiB, after soak and idle Z MiB (Z/Y = R)`.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde_json::json;
use sluice_loadgen::poisson::{run_poisson, PoissonArgs, Record, STATUS_NO_CONNECTION};
use sluice_loadgen::{self as loadgen};

mod common;

/// Idle time before RSS is read "after idling", s: a few times any decay period
/// an allocator might use.
const IDLE_S: u64 = 30;
/// One round of load, s (half at the base rate, half at three times it).
const ROUND_S: f64 = 60.0;
/// The load generator's connections per request kind.
const CONNECTIONS: usize = 128;
const SHAPE: [usize; 4] = [1, 3, 260, 260];
const ELEMENTS: usize = 3 * 260 * 260;

fn env_or(name: &str, default: f64) -> f64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A request kind: its body, header lines, and weight in the mix.
struct Kind {
    name: &'static str,
    body: Arc<Vec<u8>>,
    headers: Arc<Vec<(String, String)>>,
    weight: f64,
}

fn kinds() -> Vec<Kind> {
    let data: Vec<f32> = (0..ELEMENTS).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
    let json_body = serde_json::to_vec(&loadgen::infer_body("image", &SHAPE, &data)).expect("JSON");
    let head = json!({ "inputs": [{ "name": "image", "datatype": "FP32", "shape": SHAPE,
        "parameters": { "binary_data_size": ELEMENTS * 4 } }] })
    .to_string();
    let mut binary = head.clone().into_bytes();
    for x in &data {
        binary.extend(x.to_le_bytes());
    }
    let binary_headers = vec![
        ("content-type".to_string(), "application/octet-stream".to_string()),
        ("inference-header-content-length".to_string(), head.len().to_string()),
    ];
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&json_body).expect("gzip");
    let gzip = gz.finish().expect("gzip");
    let small: Vec<f32> = vec![0.25; 3 * 10 * 10];
    let wrong_shape = serde_json::to_vec(&loadgen::infer_body("image", &[1, 3, 10, 10], &small)).expect("JSON");
    let mut non_finite = json_body.clone();
    // The first element becomes 1e39, past f32's range: refused with its index.
    let at = non_finite.windows(7).position(|w| w == b"\"data\":").expect("data") + 8;
    let end = at + non_finite[at..].iter().position(|&b| b == b',').expect("comma");
    non_finite.splice(at..end, b"1e39".iter().copied());
    let mut short = binary.clone();
    short.truncate(binary.len() - 4096);
    let h = |v: Vec<(&str, String)>| Arc::new(v.into_iter().map(|(k, v)| (k.to_string(), v)).collect::<Vec<_>>());
    vec![
        Kind { name: "json", body: Arc::new(json_body.clone()), headers: h(vec![]), weight: 0.4 },
        Kind { name: "binary", body: Arc::new(binary), headers: Arc::new(binary_headers.clone()), weight: 0.3 },
        Kind {
            name: "gzip-json",
            body: Arc::new(gzip),
            headers: h(vec![("content-encoding", "gzip".into())]),
            weight: 0.1,
        },
        Kind {
            name: "truncated-json",
            body: Arc::new(json_body[..json_body.len() / 2].to_vec()),
            headers: h(vec![]),
            weight: 0.05,
        },
        Kind { name: "wrong-shape", body: Arc::new(wrong_shape), headers: h(vec![]), weight: 0.05 },
        Kind { name: "non-finite", body: Arc::new(non_finite), headers: h(vec![]), weight: 0.05 },
        Kind { name: "short-binary", body: Arc::new(short), headers: Arc::new(binary_headers), weight: 0.05 },
    ]
}

/// One round: `seconds / 2` at `rate`, then `seconds / 2` at three times it, every
/// kind at its share; counts by kind and status.
async fn round(
    addr: std::net::SocketAddr,
    kinds: &[Kind],
    rate: f64,
    seconds: f64,
    seed: u64,
    counts: &mut BTreeMap<(&'static str, u16), u64>,
) -> Result<()> {
    for (phase, factor) in [(0, 1.0), (1, 3.0)] {
        let mut runs = tokio::task::JoinSet::new();
        for (i, k) in kinds.iter().enumerate() {
            let args = PoissonArgs {
                addr,
                path: "/v2/models/imagenet/infer".into(),
                body: k.body.clone(),
                headers: k.headers.clone(),
                rate: rate * factor * k.weight,
                duration: Duration::from_secs_f64(seconds / 2.0),
                seed: seed * 100 + phase * 10 + i as u64,
                timeout: Duration::from_secs(10),
                max_connections: CONNECTIONS,
            };
            let name = k.name;
            runs.spawn(async move { run_poisson(args).await.map(|r| (name, r)) });
        }
        while let Some(done) = runs.join_next().await {
            let (name, records): (&'static str, Vec<Record>) = done??;
            for r in records {
                *counts.entry((name, r.status)).or_insert(0) += 1;
            }
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    let seconds = env_or("SLUICE_MEMORY_SECONDS", 1800.0);
    let rate = env_or("SLUICE_MEMORY_RATE", 40.0);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize()?;
    // The embedded default (no --config), from the repository root, as `cargo xtask demo` runs it.
    let server = common::start_server_with(&root, &[])?;
    let addr = server.addr;
    std::thread::sleep(Duration::from_secs(5));
    let start = server.rss_mib();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let kinds = kinds();
    let mut warm_counts = BTreeMap::new();
    runtime.block_on(round(addr, &kinds, rate, ROUND_S, 1, &mut warm_counts))?;
    std::thread::sleep(Duration::from_secs(IDLE_S));
    let warm = server.rss_mib();

    let mut counts = BTreeMap::new();
    let began = Instant::now();
    let (mut peak, mut seed) = (warm, 2);
    while began.elapsed().as_secs_f64() < seconds {
        runtime.block_on(round(addr, &kinds, rate, ROUND_S, seed, &mut counts))?;
        seed += 1;
        peak = peak.max(server.rss_mib());
        eprintln!("memory: {:.0} s, RSS {:.0} MiB", began.elapsed().as_secs_f64(), server.rss_mib());
    }
    std::thread::sleep(Duration::from_secs(IDLE_S));
    let after = server.rss_mib();

    let mut by_kind: BTreeMap<&str, BTreeMap<u16, u64>> = BTreeMap::new();
    for ((kind, status), n) in counts.iter().chain(warm_counts.iter()) {
        *by_kind.entry(kind).or_default().entry(*status).or_insert(0) += n;
    }
    println!("| kind | statuses |");
    println!("|---|---|");
    for (kind, statuses) in &by_kind {
        println!("| {kind} | {statuses:?} |");
    }
    let ratio = after / warm;
    println!(
        "{}",
        json!({ "bench": "memory", "seconds": seconds, "rate": rate, "idle_s": IDLE_S, "rss_mib":
            { "start": start, "warm": warm, "peak": peak, "after_idle": after }, "statuses": by_kind })
    );
    println!(
        "memory: RSS start {start:.0} MiB, warm {warm:.0} MiB, peak {peak:.0} MiB, after soak and idle {after:.0} MiB (after/warm = {ratio:.2}, goal <= 1.10)"
    );
    // Every answer is one the clients expect: served, refused at admission or as bad
    // input, dropped at its deadline. A transport error, a timeout or a 5xx other
    // than 503/504 is a failure of the run. An arrival the load generator did not
    // send because all its connections were busy (its own limit, on a machine
    // where the server's CPU is the client's too) is counted apart.
    let unsent: u64 =
        counts.iter().chain(warm_counts.iter()).filter(|((_, s), _)| *s == STATUS_NO_CONNECTION).map(|(_, n)| n).sum();
    println!("memory: {unsent} arrivals not sent (all {CONNECTIONS} client connections busy)");
    let bad: Vec<_> = counts
        .iter()
        .chain(warm_counts.iter())
        .filter(|((_, s), _)| *s != STATUS_NO_CONNECTION && (*s < 100 || (*s >= 500 && *s != 503 && *s != 504)))
        .collect();
    if !bad.is_empty() {
        bail!("answers that should not happen: {bad:?}");
    }
    Ok(())
}
