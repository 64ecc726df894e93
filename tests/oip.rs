//! Open Inference Protocol conformance: the `tritonclient` Python package (HTTP) can
//! check liveness and readiness, read metadata and run an inference against sluice.

use serde_json::{json, Value};
use sluice_e2e::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tritonclient_checks_health_and_infers() {
    let server =
        TestServer::start(&emu_app("zero", "slo_ms = 100\nworkers = 2\npolicy = \"jellyfish\"")).await.unwrap();
    let python = root().join(".venv/bin/python");
    assert!(python.exists(), "{} is missing: run `cargo xtask setup`", python.display());
    let addr = server.addr.to_string();
    let out = tokio::process::Command::new(&python)
        .arg(root().join("tests/oip_client.py"))
        .args([addr.as_str(), "emu", "x"])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "tritonclient failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let seen: Value = serde_json::from_slice(out.stdout.trim_ascii()).unwrap();
    assert_eq!(seen["shape"], json!([1, 2]));
    assert_eq!(seen["sum"], json!(10.0));
    assert_eq!(seen["model_name"], json!("emu"));
    assert_eq!(seen["id"], json!("oip-1"));
    assert!(seen["versions"].as_array().unwrap().contains(&seen["model_version"]), "{seen}");

    // Readiness turns off while draining; liveness stays.
    let mut c = server.client().await;
    assert_eq!(c.get("/v2/health/ready").await.unwrap().status, 200);
    for app in server.state.apps.values() {
        app.accepting.store(false, std::sync::atomic::Ordering::Release);
    }
    assert_eq!(c.get("/v2/health/ready").await.unwrap().status, 503);
    assert_eq!(c.get("/v2/health/live").await.unwrap().status, 200);
    assert_eq!(c.post_json("/v2/models/emu/infer", &small_infer(1)).await.unwrap().status, 503);
    server.stop().await.unwrap();
}
