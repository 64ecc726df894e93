//! Open Inference Protocol conformance: the `tritonclient` Python package (HTTP) can
//! check liveness and readiness, read metadata and run an inference against sluice,
//! with JSON tensors and with its defaults (the binary tensor data extension); and
//! the extension's framing errors are refused clearly.

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
    assert_eq!(seen["binary_sum"], json!(10.0), "binary tensors both ways: {seen}");

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

/// A binary request: `json` then the little-endian bytes of `data`.
fn binary_body(json: &Value, data: &[f32]) -> (Vec<u8>, String) {
    let head = json.to_string();
    let mut body = head.clone().into_bytes();
    for x in data {
        body.extend(x.to_le_bytes());
    }
    (body, head.len().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_tensors_in_and_out_and_their_errors() {
    let server =
        TestServer::start(&emu_app("zero", "slo_ms = 100\nworkers = 1\npolicy = \"jellyfish\"")).await.unwrap();
    let mut c = server.client().await;
    let infer = "/v2/models/emu/infer";
    let input = |size: usize| json!({ "name": "x", "datatype": "FP32", "shape": [1, 4], "parameters": { "binary_data_size": size } });
    // Binary in, binary out.
    let (body, len) = binary_body(
        &json!({ "inputs": [input(16)], "outputs": [{ "name": "output", "parameters": { "binary_data": true } }] }),
        &[1.0, 2.0, 3.0, 4.5],
    );
    let r = c.request("POST", infer, &[("inference-header-content-length", &len)], &body).await.unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let json_len: usize = r.header("inference-header-content-length").unwrap().parse().unwrap();
    let head: Value = serde_json::from_slice(&r.body[..json_len]).unwrap();
    assert_eq!(head["outputs"][0]["parameters"]["binary_data_size"], json!(8));
    assert!(head["outputs"][0].get("data").is_none());
    let out: Vec<f32> = r.body[json_len..].chunks(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    // The emulated output: the serving variant's id, then the sum of the input.
    assert_eq!(out.len(), 2);
    assert_eq!(out[1], 10.5);
    // Binary in, JSON out (nothing asked in binary).
    let (body, len) = binary_body(&json!({ "inputs": [input(16)] }), &[1.0, 1.0, 1.0, 1.0]);
    let r = c.request("POST", infer, &[("inference-header-content-length", &len)], &body).await.unwrap();
    assert_eq!(r.status, 200);
    assert!(r.header("inference-header-content-length").is_none());
    assert_eq!(r.json()["outputs"][0]["data"][1], json!(4.0));
    // Framing errors, each named.
    let cases: Vec<(Vec<u8>, String, &str)> = vec![
        {
            let (b, l) = binary_body(&json!({ "inputs": [input(12)] }), &[1.0, 2.0, 3.0]);
            (b, l, "needs 16 bytes; binary_data_size is 12")
        },
        {
            let (b, l) = binary_body(&json!({ "inputs": [input(16)] }), &[1.0, 2.0, 3.0]);
            (b, l, "binary_data_size is 16 and the body carries 12")
        },
        {
            let (b, _) = binary_body(&json!({ "inputs": [input(16)] }), &[1.0, 2.0, 3.0, 4.0]);
            (b, "100000".into(), "inference-header-content-length is 100000 but the body has only")
        },
        {
            let (b, l) = binary_body(&json!({ "inputs": [input(16)] }), &[1.0, f32::NAN, 3.0, 4.0]);
            (b, l, "element 1 is not a finite number")
        },
        {
            let j = json!({ "inputs": [{ "name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4] }] });
            let (b, l) = binary_body(&j, &[1.0]);
            (b, l, "4 bytes of binary data but no input has binary_data_size")
        },
        (b"{}".to_vec(), "x".into(), "inference-header-content-length: expected a byte count"),
    ];
    for (body, len, needle) in &cases {
        let r = c.request("POST", infer, &[("inference-header-content-length", len)], body).await.unwrap();
        assert_eq!(r.status, 400, "{needle}: {}", String::from_utf8_lossy(&r.body));
        let err = r.json()["error"].as_str().unwrap_or_default().to_string();
        assert!(err.contains(needle), "error `{err}` should mention `{needle}`");
    }
    server.stop().await.unwrap();
}
