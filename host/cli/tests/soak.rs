//! Soak (issue 13): the real `sluice serve` process under a steady open-loop load
//! with a hot swap every second, fault-injecting policies mixed in. Checks
//! exactly-once accounting between what the clients saw and the server's counters,
//! that the server's RSS stays flat, and that it leaks no descriptors.
//!
//! Bounded: `SLUICE_SOAK_SECONDS` (default 20, what `cargo xtask test` runs) at
//! `SLUICE_SOAK_RATE` req/s (default 400). The full soak is ten minutes:
//! `SLUICE_SOAK_SECONDS=600 cargo test --release -p sluice --test soak`.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use serde_json::Value;
use sluice_loadgen::{Client, LoadArgs};

mod common;

const TOKEN: &str = "soak-token";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("the workspace root")
}

fn env_or(name: &str, default: f64) -> f64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Server {
    /// Resident memory, KiB, and open descriptors.
    fn usage(&self) -> (u64, usize) {
        let pid = self.0.id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let rss = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0);
        (rss, fds)
    }
}

async fn admin(c: &mut Client, method: &str, path: &str, body: &[u8], content_type: &str) -> (u16, Value) {
    let auth = format!("Bearer {TOKEN}");
    let r = c.request(method, path, &[("authorization", &auth), ("content-type", content_type)], body).await.unwrap();
    (r.status, r.json())
}

#[test]
fn a_steady_load_with_a_swap_every_second_loses_nothing_and_leaks_nothing() {
    let seconds = env_or("SLUICE_SOAK_SECONDS", 20.0);
    let rate = env_or("SLUICE_SOAK_RATE", 400.0);
    let root = root();
    let misbehave = root.join("target/fixtures/misbehave.wasm");
    assert!(misbehave.exists(), "{} is missing: run `cargo xtask policies`", misbehave.display());
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "listen = \"127.0.0.1:0\"\nadmin_token = \"{TOKEN}\"\nbuiltin_policy_dir = \"{root}/target/policies\"\npolicy_dir = \"{dir}/policies\"\n\n\
         [[app]]\nname = \"emu\"\nslo_ms = 100\nworkers = 4\nrouter = \"round-robin\"\nexecutor = \"emulated\"\n\
         profile = \"{root}/tests/fixtures/soak-profile.toml\"\nmax_queue = 10000\npolicy = \"jellyfish\"\n\
         input = {{ name = \"x\", datatype = \"FP32\", shape = [4] }}\n",
        root = root.display(),
        dir = dir.path().display()
    );
    let (child, mut out) = common::serve(&config, dir.path());
    let server = Server(child);
    let addr = common::address(&mut out, "sluice listening on http://");

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let mut c = Client::connect(addr).await.unwrap();
        let bytes = std::fs::read(&misbehave).unwrap();
        let (status, body) = admin(&mut c, "POST", "/admin/policies?name=mis", &bytes, "application/wasm").await;
        assert_eq!(status, 201, "{body}");

        // A swap every second, cycling through good policies and faulting ones (a
        // trap, a decide that overruns its budget, out-of-range answers).
        let cycle = [
            "fixed:{\"model\":\"small\"}",
            "mis:{\"mode\":\"trap\",\"after\":20}",
            "jellyfish:{}",
            "mis:{\"mode\":\"loop\",\"after\":50}",
            "lazy-drop:{\"model\":\"medium\"}",
            "mis:{\"mode\":\"bad-index\",\"after\":10}",
        ];
        let swaps: Vec<String> =
            (1..seconds as usize).map(|s| format!("{s}:{}", cycle[s % cycle.len()])).collect();

        // Usage once warm (a quarter in), and at the end.
        let warm_at = Duration::from_secs_f64(seconds / 4.0);
        let sampler = tokio::spawn(async move {
            tokio::time::sleep(warm_at).await;
            (server.usage(), server)
        });
        let summary = sluice_loadgen::run(LoadArgs {
            addr,
            app: "emu".into(),
            rate,
            concurrency: 64,
            duration: seconds,
            input: None,
            swaps,
            admin_token: Some(TOKEN.into()),
            json: false,
        })
        .await
        .unwrap();
        let (warm, server) = sampler.await.unwrap();
        let end = server.usage();

        // Every swap was applied.
        assert!(summary.swaps.iter().all(|s| s["status"] == 200), "{:?}", summary.swaps);
        // Exactly once, seen from both sides (a new connection: the first one idled
        // past the server's header timeout while the load ran).
        let mut c = Client::connect(addr).await.unwrap();
        let (status, app) = admin(&mut c, "GET", "/admin/apps/emu", b"", "application/json").await;
        assert_eq!(status, 200);
        let n = |k: &str| app["counters"][k].as_u64().unwrap();
        let got = |s: u16| summary.by_status.get(&s).copied().unwrap_or(0);
        assert_eq!(got(0), 0, "no transport errors: {:?}", summary.by_status);
        assert_eq!(summary.by_status.values().sum::<u64>(), summary.sent, "one answer per request");
        assert_eq!(got(200), n("served"), "served: {:?} vs {app}", summary.by_status);
        assert_eq!(got(504), n("dropped"), "dropped: {:?} vs {app}", summary.by_status);
        assert_eq!(n("accepted"), n("served") + n("dropped"), "the server's books: {app}");
        assert_eq!(got(200) + got(504) + got(429), summary.sent, "{:?}", summary.by_status);
        assert!(n("faults") > 0, "the faulting policies faulted: {app}");
        assert!(got(200) as f64 > 0.5 * summary.sent as f64, "mostly served: {:?}", summary.by_status);
        // Flat memory and descriptors (the client's 64 connections are open at both points).
        let ((rss_warm, fds_warm), (rss_end, fds_end)) = (warm, end);
        assert!(rss_end <= rss_warm + rss_warm / 2 + 20 * 1024, "RSS grew from {rss_warm} KiB to {rss_end} KiB");
        assert!(fds_end <= fds_warm + 16, "descriptors grew from {fds_warm} to {fds_end}");
        eprintln!(
            "soak: {seconds} s at {rate} req/s: {:?}; faults {}; RSS {rss_warm} -> {rss_end} KiB; fds {fds_warm} -> {fds_end}",
            summary.by_status,
            n("faults")
        );
        drop(server);
    });
}
