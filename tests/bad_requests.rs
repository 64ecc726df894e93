//! Bad requests get a clear 4xx naming what was wrong, and nothing else is disturbed.

use serde_json::json;
use sluice_e2e::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_client_errors() {
    let config =
        format!("max_body_bytes = 65536\n{}", emu_app("zero", "slo_ms = 100\nworkers = 2\npolicy = \"jellyfish\""));
    let server = TestServer::start(&config).await.unwrap();
    let mut c = server.client().await;
    let infer = "/v2/models/emu/infer";
    let tensor = |name: &str, datatype: &str, shape: serde_json::Value, data: serde_json::Value| json!({ "inputs": [{ "name": name, "datatype": datatype, "shape": shape, "data": data }] });
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("malformed JSON", "{\"inputs\": [".into(), 400, "invalid JSON body"),
        ("not an object", "[1,2]".into(), 400, "invalid JSON body"),
        ("missing inputs", "{}".into(), 400, "missing field `inputs`"),
        (
            "wrong datatype",
            tensor("x", "INT64", json!([1, 4]), json!([1, 2, 3, 4])).to_string(),
            400,
            "datatype INT64 but the app expects FP32",
        ),
        (
            "unknown datatype",
            tensor("x", "FP8", json!([1, 4]), json!([1, 2, 3, 4])).to_string(),
            400,
            "unknown datatype `FP8`",
        ),
        (
            "wrong shape",
            tensor("x", "FP32", json!([1, 5]), json!([1, 2, 3, 4, 5])).to_string(),
            400,
            "shape [1, 5] but the app expects [-1, 4]",
        ),
        (
            "a batch short of data",
            tensor("x", "FP32", json!([2, 4]), json!([1, 2, 3, 4, 5, 6, 7])).to_string(),
            400,
            "shape [2, 4] needs 8 elements, data has 7",
        ),
        (
            "data vs shape",
            tensor("x", "FP32", json!([1, 4]), json!([1, 2, 3])).to_string(),
            400,
            "needs 4 elements, data has 3",
        ),
        (
            "non-numeric data",
            tensor("x", "FP32", json!([1, 4]), json!(["a", 2, 3, 4])).to_string(),
            400,
            "input `x`: data element 0 is a string, not a number; FP32 data is JSON numbers",
        ),
        (
            "booleans",
            tensor("x", "FP32", json!([1, 4]), json!([1, 2, true, 4])).to_string(),
            400,
            "input `x`: data element 2 is a boolean (true), not a number",
        ),
        (
            "null",
            tensor("x", "FP32", json!([1, 4]), json!([1, null, 3, 4])).to_string(),
            400,
            "input `x`: data element 1 is null, not a number",
        ),
        (
            "a ragged array",
            tensor("x", "FP32", json!([2, 4]), json!([[1, 2, 3, 4], [5, 6, 7]])).to_string(),
            400,
            "input `x`: data is a ragged array: arrays of 4 and 3 elements at depth 2",
        ),
        (
            "numbers beside arrays",
            tensor("x", "FP32", json!([1, 4]), json!([[1, 2, 3], 4])).to_string(),
            400,
            "input `x`: data is a ragged array: numbers and arrays side by side at depth 2",
        ),
        (
            "nested unlike the shape",
            tensor("x", "FP32", json!([1, 4]), json!([[1, 2], [3, 4]])).to_string(),
            400,
            "input `x`: data nested as [2, 2] but the shape is [1, 4]",
        ),
        (
            "beyond the FP32 range",
            tensor("x", "FP32", json!([1, 4]), json!([1, 2, 1e39, 4])).to_string(),
            400,
            "input `x`: element 2: 1e39 is outside the FP32 range",
        ),
        (
            "unknown requested output",
            json!({ "inputs": [{ "name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4] }],
                    "outputs": [{ "name": "prob" }] })
            .to_string(),
            400,
            "unknown output `prob`; every variant answers with `output`",
        ),
        (
            "unknown input",
            tensor("y", "FP32", json!([1, 4]), json!([1, 2, 3, 4])).to_string(),
            400,
            "unknown input `y`; expected `x`",
        ),
        (
            "two inputs",
            json!({ "inputs": [
            { "name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4] },
            { "name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4] }] })
            .to_string(),
            400,
            "expected exactly 1 input tensor",
        ),
    ];
    for (what, body, status, needle) in &cases {
        let r = c.request("POST", infer, &[("content-type", "application/json")], body.as_bytes()).await.unwrap();
        assert_eq!(r.status, *status, "{what}: {}", String::from_utf8_lossy(&r.body));
        let err = r.json()["error"].as_str().unwrap_or_default().to_string();
        assert!(err.contains(needle), "{what}: error `{err}` should mention `{needle}`");
    }
    // Nested data is accepted (the protocol allows it) when it nests as the shape.
    let nested = tensor("x", "FP32", json!([1, 4]), json!([[1, 2, 3, 4]]));
    assert_eq!(c.post_json(infer, &nested).await.unwrap().status, 200);
    let nested = tensor("x", "FP32", json!([2, 4]), json!([[1, 2, 3, 4], [5, 6, 7, 8]]));
    assert_eq!(c.post_json(infer, &nested).await.unwrap().status, 200);
    let one = tensor("x", "FP32", json!([4]), json!([1, 2, 3, 4]));
    assert_eq!(c.post_json(infer, &one).await.unwrap().status, 200);

    // Unknown app, on both endpoints.
    let r = c.post_json("/v2/models/nope/infer", &small_infer(1)).await.unwrap();
    assert_eq!(r.status, 404);
    assert!(r.json()["error"].as_str().unwrap().contains("unknown app `nope` (served: emu)"));
    let mut simple = small_infer(1);
    simple["app"] = json!("nope");
    assert_eq!(c.post_json("/infer", &simple).await.unwrap().status, 404);
    assert_eq!(c.get("/v2/models/nope").await.unwrap().status, 404);
    // Oversized body: refused from its Content-Length, before it is read. (The
    // client sends only the headers: a server that refuses a body closes the
    // connection, and a client still writing would see a reset instead of the 413.)
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut raw = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        let head = format!(
            "POST {infer} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 70000\r\n\r\n"
        );
        raw.write_all(head.as_bytes()).await.unwrap();
        let mut buf = vec![0; 4096];
        let n = raw.read(&mut buf).await.unwrap();
        let text = String::from_utf8_lossy(&buf[..n]).to_string();
        assert!(text.starts_with("HTTP/1.1 413"), "{text}");
        assert!(text.contains("exceeds the limit of 65536"), "{text}");
    }
    // Admin without or with a wrong token.
    let r = c.get("/admin/apps/emu").await.unwrap();
    assert_eq!(r.status, 401);
    assert!(r.json()["error"].as_str().unwrap().contains("Authorization: Bearer"));
    let r = c.request("GET", "/admin/apps/emu", &[("authorization", "Bearer wrong")], b"").await.unwrap();
    assert_eq!(r.status, 401);
    let r = c
        .request("PUT", "/admin/apps/emu/policy", &[("authorization", "Bearer wrong")], br#"{"policy":"fixed"}"#)
        .await
        .unwrap();
    assert_eq!(r.status, 401);
    // Unknown routes are 404; a known route with another method is 405 with the
    // method it takes in `Allow`, unless it names an unknown app.
    assert_eq!(c.get("/nope").await.unwrap().status, 404);
    assert_eq!(c.get("/v2/models/emu/nope").await.unwrap().status, 404);
    assert_eq!(c.request("POST", "/v2/models/nope/ready", &[], b"").await.unwrap().status, 404);
    assert_eq!(c.get("/v2/models/nope/infer").await.unwrap().status, 404);
    let r = c.get(infer).await.unwrap();
    assert_eq!((r.status, r.header("allow")), (405, Some("POST")));
    let r = c.request("DELETE", "/v2/health/live", &[], b"").await.unwrap();
    assert_eq!((r.status, r.header("allow")), (405, Some("GET")));
    // The OIP `outputs` (naming the one output) and `parameters` are accepted, on
    // both endpoints.
    let mut full = small_infer(3);
    full["outputs"] = json!([{ "name": "output", "parameters": { "binary_data": false } }]);
    full["parameters"] = json!({ "priority": 1 });
    assert_eq!(c.post_json(infer, &full).await.unwrap().status, 200);
    full["app"] = json!("emu");
    assert_eq!(c.post_json("/infer", &full).await.unwrap().status, 200);

    // Nothing was disturbed: good requests are served, and no bad one was accepted.
    let mut c2 = server.client().await;
    for i in 0..5 {
        let r = c2.post_json(infer, &small_infer(i)).await.unwrap();
        assert_eq!(r.status, 200);
    }
    let mut s = small_infer(9);
    s["app"] = json!("emu");
    assert_eq!(c2.post_json("/infer", &s).await.unwrap().status, 200);
    let status = app_status(&mut c2, "emu").await;
    assert_eq!(status["counters"]["accepted"], json!(12), "bad requests never enter a queue");
    assert_eq!(status["policy"], json!("jellyfish"));
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_429_and_keeps_the_accepted_ones() {
    let config = emu_app(
        "emulated",
        "slo_ms = 10000\nworkers = 1\npolicy = \"fixed\"\nparams = { model = \"large\" }\nmax_batch = 1\nmax_queue = 5",
    );
    let server = TestServer::start(&config).await.unwrap();
    let (mut ok, mut full) = (0, 0);
    for r in burst(server.addr, 30).await {
        match r.status {
            200 => ok += 1,
            429 => {
                full += 1;
                assert!(r.json()["error"].as_str().unwrap().contains("queue full"));
            }
            s => panic!("unexpected status {s}"),
        }
    }
    assert_eq!(ok + full, 30);
    assert!(full > 0 && ok >= 5, "ok {ok}, full {full}");
    let c = &server.state.apps["emu"].counters;
    assert_eq!(c.served.load(std::sync::atomic::Ordering::Relaxed), ok);
    server.stop().await.unwrap();
}
