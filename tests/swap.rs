//! Hot swap under load: 20 swaps between `jellyfish` and `fixed` while clients send
//! continuously. No request fails or is lost, and every request sent after a swap
//! returned is decided by the new policy.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot_free::Log;
use serde_json::json;
use sluice_e2e::*;

mod parking_lot_free {
    //! A tiny append-only log behind a std mutex (the test needs nothing more).
    use std::sync::Mutex;
    use std::time::Instant;

    /// (sent, received, status, policy, variant)
    pub type Entry = (Instant, Instant, u16, String, String);

    /// Shared log of responses.
    #[derive(Default)]
    pub struct Log(pub Mutex<Vec<Entry>>);
}

fn config() -> String {
    emu_app("emulated", "slo_ms = 100\nworkers = 3\nmax_queue = 10000\npolicy = \"jellyfish\"")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_swaps_under_load_lose_nothing() {
    let server = TestServer::start(&config()).await.unwrap();
    let addr = server.addr;
    let log = Arc::new(Log::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = tokio::task::JoinSet::new();
    for c in 0..6u64 {
        let log = log.clone();
        let stop = stop.clone();
        clients.spawn(async move {
            let mut client = sluice_loadgen::Client::connect(addr).await.unwrap();
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let sent = Instant::now();
                let r = client.post_json("/v2/models/emu/infer", &small_infer(c * 1_000_000 + i)).await.unwrap();
                let body = r.json();
                let policy = body["parameters"]["policy"].as_str().unwrap_or("").to_string();
                let variant = body["model_version"].as_str().unwrap_or("").to_string();
                log.0.lock().unwrap().push((sent, Instant::now(), r.status, policy, variant));
                i += 1;
            }
        });
    }

    // Let traffic flow, then swap 20 times, alternating.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut admin_client = server.client().await;
    let mut swaps = Vec::new();
    for k in 0..20 {
        let (policy, params) =
            if k % 2 == 0 { ("fixed", json!({ "model": "large" })) } else { ("jellyfish", json!({})) };
        let started = Instant::now();
        let r = swap(&mut admin_client, "emu", policy, params).await;
        let returned = Instant::now();
        assert_eq!(r.status, 200, "swap {k}: {}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.json()["policy"], json!(policy));
        swaps.push((started, returned, policy));
        // Let some requests through under this policy.
        let before = log.0.lock().unwrap().len();
        let log2 = log.clone();
        assert!(eventually(Duration::from_secs(5), || log2.0.lock().unwrap().len() >= before + 30).await);
    }
    stop.store(true, Ordering::Relaxed);
    while let Some(r) = clients.join_next().await {
        r.unwrap();
    }

    let entries = log.0.lock().unwrap().clone();
    assert!(entries.len() > 600, "continuous traffic: {} requests", entries.len());
    let failed: Vec<_> = entries.iter().filter(|e| e.2 != 200).collect();
    assert!(failed.is_empty(), "{} requests failed, e.g. {:?}", failed.len(), failed.first().map(|e| e.2));

    // Requests sent after swap k returned (and before swap k+1 began) are decided by
    // swap k's policy; `fixed` always serves `large`.
    let mut checked = 0;
    for (k, (_, returned, policy)) in swaps.iter().enumerate() {
        let next_start = swaps.get(k + 1).map(|s| s.0);
        for e in entries.iter().filter(|e| e.0 > *returned && next_start.is_none_or(|n| e.1 < n)) {
            assert_eq!(&e.3, policy, "request sent after swap {k} was decided by {}", e.3);
            if *policy == "fixed" {
                assert_eq!(e.4, "large");
            }
            checked += 1;
        }
    }
    assert!(checked > 300, "enough requests fell between swaps: {checked}");

    // The server agrees: nothing lost, 20 swaps, no faults.
    let app = &server.state.apps["emu"];
    let c = &app.counters;
    assert_eq!(c.accepted.load(Ordering::Relaxed), entries.len() as u64);
    assert_eq!(c.served.load(Ordering::Relaxed), entries.len() as u64);
    assert_eq!(c.swaps.load(Ordering::Relaxed), 20);
    assert_eq!(c.faults.load(Ordering::Relaxed), 0);
    let status = app_status(&mut admin_client, "emu").await;
    assert_eq!(status["generation"], json!(21));
    assert!(
        status["swap_max_wait_us"].as_f64().unwrap() < 1000.0,
        "a worker waited {} µs on a swap",
        status["swap_max_wait_us"]
    );
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_init_keeps_the_old_policy() {
    let server = TestServer::start(&config()).await.unwrap();
    let mut c = server.client().await;
    // `fixed` without its required param refuses to init: the swap is refused.
    let r = swap(&mut c, "emu", "fixed", json!({ "model": "no-such-model" })).await;
    assert_eq!(r.status, 422, "{}", String::from_utf8_lossy(&r.body));
    assert!(r.json()["error"].as_str().unwrap().contains("init failed"), "{}", r.json());
    let status = app_status(&mut c, "emu").await;
    assert_eq!(status["policy"], json!("jellyfish"));
    assert_eq!(status["generation"], json!(1));
    let r = c.post_json("/v2/models/emu/infer", &small_infer(1)).await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["parameters"]["policy"], json!("jellyfish"));
    let r = swap(&mut c, "emu", "nonexistent", json!({})).await;
    assert_eq!(r.status, 404);
    let r = swap(&mut c, "emu", "fixed", json!([1, 2])).await;
    assert_eq!(r.status, 400);
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swapping_to_ramsis_under_load_reports_its_expectations() {
    // The emulated app waits 1-4 ms per batch; RAMSIS generates its policy in `init`,
    // before the swap, while jellyfish keeps serving.
    let server = TestServer::start(&config()).await.unwrap();
    let addr = server.addr;
    let stop = Arc::new(AtomicBool::new(false));
    let by_ramsis = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (s2, r2) = (stop.clone(), by_ramsis.clone());
    let client = tokio::spawn(async move {
        let mut c = sluice_loadgen::Client::connect(addr).await.unwrap();
        let mut out = Vec::new();
        let mut i = 0;
        while !s2.load(Ordering::Relaxed) {
            let r = c.post_json("/v2/models/emu/infer", &small_infer(i)).await.unwrap();
            let policy = r.json()["parameters"]["policy"].as_str().unwrap_or("").to_string();
            if policy == "ramsis" {
                r2.fetch_add(1, Ordering::Relaxed);
            }
            out.push((r.status, policy));
            i += 1;
        }
        out
    });
    let mut c = server.client().await;
    let r = swap(&mut c, "emu", "ramsis", json!({ "load_qps": 300.0 })).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert!(eventually(Duration::from_secs(10), || by_ramsis.load(Ordering::Relaxed) >= 50).await);
    stop.store(true, Ordering::Relaxed);
    let seen = client.await.unwrap();
    assert!(seen.iter().all(|(s, _)| *s == 200), "no request failed across the swap");
    assert!(seen.iter().any(|(_, p)| p == "ramsis"), "RAMSIS decides after the swap");
    let status = app_status(&mut c, "emu").await;
    assert_eq!(status["policy"], json!("ramsis"));
    let ps = &status["workers"][0]["policy_status"];
    let acc = ps["expected_accuracy"].as_f64().unwrap_or(-1.0);
    assert!((0.0..=1.0).contains(&acc), "RAMSIS reports its expected accuracy: {ps}");
    assert!(ps["expected_violation"].as_f64().is_some(), "{ps}");
    assert_eq!(ps["policy_load_qps"].as_f64(), Some(300.0), "the policy in use is the one for the fixed load: {ps}");
    // The workers share one generated policy through the binding's store.
    let w1 = &status["workers"][1]["policy_status"];
    assert_eq!(w1["grid_qps"], ps["grid_qps"], "{w1} vs {ps}");
    assert!(status["shared_store_bytes"].as_u64().unwrap_or(0) > 0, "RAMSIS stored its initial state: {status}");
    server.stop().await.unwrap();
}
