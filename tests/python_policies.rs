//! Python policies end to end (issue 37): the Python ports of Jellyfish+ and
//! spread-drop (`policies/python`, built by `cargo xtask policies` into
//! `target/policies/<name>-py.wasm`) decide exactly as the Rust crates do on the
//! same recorded trace in the simulator; a live swap to a Python policy under load
//! answers every request once; a misbehaving Python policy is contained while the
//! server keeps serving.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice_e2e::*;

/// A recorded arrival log (`app,arrival_us`): 4,000 arrivals over 8 s in bursts,
/// from a fixed LCG, so that the queue is sometimes empty and sometimes deep.
fn recorded_trace() -> String {
    let (mut state, mut t, mut out) = (0x2545_f491_4f6c_dd1du64, 0u64, String::new());
    for i in 0..4_000u64 {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let burst = (i / 500) % 2 == 0;
        t += (state >> 33) % if burst { 1_200 } else { 4_000 };
        out.push_str(&format!("emu,{t}\n"));
    }
    out
}

/// What `sluice sim` measures for `policy` on the recorded trace: the run's result
/// and its time series, without the policy's name.
fn simulate(dir: &std::path::Path, policy: &str, params: &str) -> (Value, Value) {
    let text = format!(
        "version = 1\nname = \"differential\"\nduration_s = 3600\nwindow_s = 0.5\nbuiltin_policy_dir = \"{}\"\n\
         [[app]]\nname = \"emu\"\nslo_ms = 40\nworkers = 3\nmax_queue = 10000\nprofile = \"{}/emulated.toml\"\n\
         policy = \"{policy}\"\nparams = {params}\narrivals = {{ kind = \"recorded\", file = \"{}/arrivals.csv\" }}\n",
        policies_dir().display(),
        dir.display(),
        dir.display()
    );
    let e = sluice_sim::Experiment::parse(&text, "differential.toml", std::path::Path::new("")).unwrap();
    let out = sluice_sim::run_experiment(&e, std::path::Path::new(""), false).unwrap();
    let strip = |mut v: Value| {
        v.as_object_mut().unwrap().remove("policy");
        v
    };
    let result = strip(serde_json::to_value(&out.results[0]).unwrap());
    let series = Value::Array(out.timeseries.iter().map(|w| strip(serde_json::to_value(w).unwrap())).collect());
    (result, series)
}

#[test]
fn python_and_rust_policies_decide_identically_on_a_recorded_trace() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("emulated.toml"), emulated_profile(1.0)).unwrap();
    std::fs::write(dir.path().join("arrivals.csv"), recorded_trace()).unwrap();
    let cases = [
        ("jellyfish", "{}"),
        ("jellyfish", "{ loads = [200, 600, 1200], overload_batch = \"max\" }"),
        ("spread-drop", "{}"),
        ("spread-drop", "{ weakly_hard = [1, 3] }"),
        ("spread-drop", "{ early_drop = true, margin_us = 1000 }"),
    ];
    for (policy, params) in cases {
        let (rust, rust_series) = simulate(dir.path(), policy, params);
        let (python, python_series) = simulate(dir.path(), &format!("{policy}-py"), params);
        assert_eq!(rust["faults"], json!(0), "{policy} {params}: {rust}");
        assert_eq!(python["faults"], json!(0), "{policy}-py {params} never faulted: {python}");
        assert!(rust["decide_calls"].as_u64().unwrap() > 1_000, "{policy} {params}: {rust}");
        assert_eq!(python, rust, "{policy} {params}: the Python port decides as the crate");
        assert_eq!(python_series, rust_series, "{policy} {params}: window by window");
    }
}

fn config() -> String {
    emu_app("emulated", "slo_ms = 100\nworkers = 3\nmax_queue = 10000\npolicy = \"jellyfish\"")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_swap_to_a_python_policy_under_load_answers_every_request_once() {
    let server = TestServer::start(&config()).await.unwrap();
    let addr = server.addr;
    let log: Arc<Mutex<Vec<(Instant, u16, String)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = tokio::task::JoinSet::new();
    for c in 0..4u64 {
        let (log, stop) = (log.clone(), stop.clone());
        clients.spawn(async move {
            let mut client = sluice_loadgen::Client::connect(addr).await.unwrap();
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let r = client.post_json("/v2/models/emu/infer", &small_infer(c * 1_000_000 + i)).await.unwrap();
                let policy = r.json()["parameters"]["policy"].as_str().unwrap_or("").to_string();
                log.lock().unwrap().push((Instant::now(), r.status, policy));
                i += 1;
            }
        });
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut admin_client = server.client().await;
    for (k, policy) in ["jellyfish-py", "jellyfish", "spread-drop-py", "jellyfish-py"].into_iter().enumerate() {
        let r = swap(&mut admin_client, "emu", policy, json!({})).await;
        assert_eq!(r.status, 200, "swap {k} to {policy}: {}", String::from_utf8_lossy(&r.body));
        let returned = Instant::now();
        let log2 = log.clone();
        let by = policy.to_string();
        assert!(
            eventually(Duration::from_secs(10), || log2
                .lock()
                .unwrap()
                .iter()
                .filter(|(at, _, p)| *at > returned && *p == by)
                .count()
                >= 50)
            .await,
            "{policy} decides after swap {k}"
        );
    }
    stop.store(true, Ordering::Relaxed);
    while let Some(r) = clients.join_next().await {
        r.unwrap();
    }
    let entries = log.lock().unwrap().clone();
    // Served, or dropped by a policy with its reason (spread-drop drops what it
    // predicts late, and a loaded machine makes some late): nothing else.
    let failed: Vec<(u16, &str)> =
        entries.iter().filter(|e| e.1 != 200 && e.1 != 504).map(|e| (e.1, e.2.as_str())).collect();
    assert!(failed.is_empty(), "no request failed across swaps to and from Python policies: {failed:?}");
    let dropped = entries.iter().filter(|e| e.1 == 504).count() as u64;
    assert!(dropped * 100 <= entries.len() as u64, "at most 1 % dropped: {dropped} of {}", entries.len());
    let c = &server.state.apps["emu"].counters;
    assert_eq!(c.accepted.load(Ordering::Relaxed), entries.len() as u64, "every request answered once");
    assert_eq!(c.served.load(Ordering::Relaxed), entries.len() as u64 - dropped);
    assert_eq!(c.dropped.load(Ordering::Relaxed), dropped);
    assert_eq!(c.faults.load(Ordering::Relaxed), 0);
    let status = app_status(&mut admin_client, "emu").await;
    assert_eq!(status["policy"], json!("jellyfish-py"));
    assert!(status["workers"][0]["policy_status"]["model"].is_u64(), "the Python status export: {status}");
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misbehaving_python_policy_is_contained_and_the_server_keeps_serving() {
    // A Python component is ~18 MB (CPython inside), past the default 16 MiB
    // `max_body_bytes` for inference bodies: uploads take up to the registry's
    // own limit (32 MiB), so the default config takes it.
    let server = TestServer::start(&config()).await.unwrap();
    let mut c = server.client().await;
    let bytes = std::fs::read(fixtures_dir().join("misbehave-py.wasm")).unwrap();
    let r = upload(&mut c, "mispy", &bytes).await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    for (mode, kind) in [("raise", "trap"), ("loop", "timeout")] {
        let r = swap(&mut c, "emu", "mispy", json!({ "mode": mode })).await;
        assert_eq!(r.status, 200, "{mode}: {}", String::from_utf8_lossy(&r.body));
        for i in 0..4 {
            let r = c.post_json("/v2/models/emu/infer", &small_infer(i)).await.unwrap();
            assert_eq!(r.status, 200, "{mode}: served by the fallback");
            assert_eq!(r.json()["parameters"]["policy"], json!("safe"), "{mode}");
        }
        // The fault is counted by the worker that met it, maybe just after the
        // answer: polled, with a deadline.
        let line = format!("sluice_policy_faults_total{{app=\"emu\",policy=\"mispy\",kind=\"{kind}\"}}");
        let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let metrics = String::from_utf8(c.get("/metrics").await.unwrap().body).unwrap();
            if metrics.contains(&line) {
                break;
            }
            assert!(
                std::time::Instant::now() < end,
                "{mode} is counted as {kind}: {}",
                metrics.lines().filter(|l| l.starts_with("sluice_policy_faults_total")).collect::<Vec<_>>().join("\n")
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
    // An exception in init refuses the swap with the exception's message.
    let r = swap(&mut c, "emu", "mispy", json!({ "mode": "init-raise" })).await;
    assert_eq!(r.status, 422);
    assert!(
        r.json()["error"].as_str().unwrap().contains("RuntimeError: misbehave: asked to raise in init"),
        "{}",
        r.json()
    );
    let r = swap(&mut c, "emu", "jellyfish", json!({})).await;
    assert_eq!(r.status, 200);
    // Every worker's policy is jellyfish once each has made its next decision (a
    // worker still re-making the looping instance answers with the safe policy
    // meanwhile): polled, with a deadline.
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let r = c.post_json("/v2/models/emu/infer", &small_infer(9)).await.unwrap();
        assert_eq!(r.status, 200);
        if r.json()["parameters"]["policy"] == json!("jellyfish") {
            break;
        }
        assert!(std::time::Instant::now() < end, "still not served by jellyfish: {}", r.json());
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    server.stop().await.unwrap();
}
