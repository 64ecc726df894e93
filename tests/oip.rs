//! Open Inference Protocol conformance: the `tritonclient` Python package (HTTP) can
//! check liveness and readiness, read metadata and run an inference against sluice,
//! with JSON tensors and with its defaults (the binary tensor data extension), ask
//! for classes, send and accept compressed bodies, and is refused clearly what sluice
//! does not serve; the extension's framing errors are refused clearly; statistics
//! read as Triton's (a pipeline's are its task apps').

use std::time::Duration;

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
    let sums: Vec<f64> = seen["rows"].as_array().unwrap().iter().map(|r| r[1].as_f64().unwrap()).collect();
    assert_eq!(sums, vec![4.0, 8.0, 12.0], "a batch of three samples: {seen}");
    assert_eq!(seen["config"]["max_batch_size"], json!(1024));
    assert_eq!(seen["config"]["input"][0], json!({ "name": "x", "data_type": "TYPE_FP32", "dims": [4] }));
    assert_eq!(seen["index"].as_array().unwrap().len(), 3, "one entry per variant: {}", seen["index"]);
    // 1 JSON + 2 binary + 3 batched samples served.
    assert_eq!(seen["stats"]["inference_count"], json!(6), "{}", seen["stats"]);
    assert_eq!(seen["stats"]["inference_stats"]["success"]["count"], json!(6));
    // As Triton reports them: a version that parses as an integer, and the three
    // compute phases counted alike (perf_analyzer aborts otherwise).
    assert_eq!(seen["stats"]["version"], json!("1"), "{}", seen["stats"]);
    for phase in ["compute_input", "compute_infer", "compute_output", "queue"] {
        assert_eq!(seen["stats"]["inference_stats"][phase]["count"], json!(6), "{phase}: {}", seen["stats"]);
    }
    assert_eq!(seen["no_id"], json!("absent"), "no id sent: none answered, not null");
    // Classes: the emulated output is [variant id, sum of the input] = [0..2, 10].
    assert_eq!(seen["top"], json!(["10.000000:1"]), "{seen}");
    assert_eq!(seen["top_shape"], json!([1, 1]));
    let top_json = seen["top_json"].as_array().unwrap();
    assert_eq!(top_json.len(), 2, "class_count 5 clamped to the 2 elements: {top_json:?}");
    assert_eq!(top_json[0], json!("10.000000:1"));
    assert!(top_json[1].as_str().unwrap().ends_with(":0"), "{top_json:?}");
    for algorithm in ["gzip", "deflate"] {
        assert_eq!(seen["compressed"][algorithm][0][1], json!(10.0), "{algorithm}: {}", seen["compressed"]);
    }
    for (call, needle) in [
        ("shm_register", "system shared memory is not supported"),
        ("shm_status", "system shared memory is not supported"),
        ("cuda_unregister", "CUDA shared memory is not supported"),
        ("load", "model repository control is not supported"),
        ("trace", "trace settings are not supported"),
        ("log", "log settings are not supported"),
    ] {
        let e = &seen["refused"][call];
        assert!(e["message"].as_str().is_some_and(|m| m.contains(needle)), "{call}: {e}");
    }

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
    // Binary tensors are taken as bytes, as Triton takes them: a NaN in an FP32
    // input is the model's business (perf_analyzer's random data holds them). The
    // emulated model's sum is then NaN, which JSON cannot carry: though JSON was
    // asked, that output comes back in binary, never as `null`.
    let (body, len) = binary_body(&json!({ "inputs": [input(16)] }), &[1.0, f32::NAN, 3.0, f32::INFINITY]);
    let r = c.request("POST", infer, &[("inference-header-content-length", &len)], &body).await.unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let json_len: usize = r.header("inference-header-content-length").expect("a binary answer").parse().unwrap();
    let head: Value = serde_json::from_slice(&r.body[..json_len]).unwrap();
    assert_eq!(head["outputs"][0]["parameters"]["binary_data_size"], json!(8), "{head}");
    assert!(head.get("id").is_none(), "no id sent, none answered (not null): {head}");
    let sum = f32::from_le_bytes(r.body[json_len + 4..json_len + 8].try_into().unwrap());
    assert!(sum.is_nan(), "{sum}");
    // A JSON body keeps its range check (JSON numbers past FP32 would become inf).
    let j = json!({ "inputs": [{ "name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 1e39, 4] }] });
    let r = c.post_json(infer, &j).await.unwrap();
    assert_eq!(r.status, 400);
    assert!(r.text().contains("element 2: 1e39 is outside the FP32 range"), "{}", r.text());
    // With an id, the id is echoed.
    let r = c.post_json(infer, &small_infer(7)).await.unwrap();
    assert_eq!(r.json()["id"], json!("7"));
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_index_config_stats_and_batches() {
    let server =
        TestServer::start(&emu_app("zero", "slo_ms = 100\nworkers = 1\nmax_queue = 8\npolicy = \"jellyfish\""))
            .await
            .unwrap();
    let mut c = server.client().await;
    // A version is a variant: metadata and readiness per variant.
    let r = c.get("/v2/models/emu/versions/medium").await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["versions"], json!(["medium"]));
    assert_eq!(r.json()["inputs"][0]["shape"], json!([-1, 4]));
    assert_eq!(c.get("/v2/models/emu/versions/medium/ready").await.unwrap().status, 200);
    let r = c.get("/v2/models/emu/versions/huge").await.unwrap();
    assert_eq!(r.status, 404);
    assert!(r.json()["error"]
        .as_str()
        .unwrap()
        .contains("emu has no version `huge` (its versions: small, medium, large)"));
    // Inference pinned to a variant is refused, naming why and what to do.
    let r = c.post_json("/v2/models/emu/versions/small/infer", &small_infer(1)).await.unwrap();
    assert_eq!(r.status, 400);
    assert!(r.json()["error"].as_str().unwrap().contains("sluice's policy picks the variant"), "{}", r.json());
    assert_eq!(c.post_json("/v2/models/emu/versions/huge/infer", &small_infer(1)).await.unwrap().status, 404);
    // Model repository control is not sluice's: 501 naming the admin API.
    let r = c.request("POST", "/v2/repository/models/emu/load", &[], b"").await.unwrap();
    assert_eq!(r.status, 501);
    assert!(r.json()["error"].as_str().unwrap().contains("/admin/apps/"));

    // The repository index: every variant, READY when a worker has it loaded.
    let r = c.request("POST", "/v2/repository/index", &[], b"{\"ready\": true}").await.unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let index = r.json();
    assert!(!index.as_array().unwrap().is_empty());
    for m in index.as_array().unwrap() {
        assert_eq!((m["name"].as_str(), m["state"].as_str()), (Some("emu"), Some("READY")), "{m}");
    }
    let r = c.request("POST", "/v2/repository/index", &[], b"{\"ready\": 3}").await.unwrap();
    assert_eq!(r.status, 400);

    // A batch: B samples queued as B requests, one answer stacked in order.
    let batch = |b: usize| {
        let data: Vec<f64> = (0..b).flat_map(|i| [i as f64; 4]).collect();
        json!({ "id": "b", "inputs": [{ "name": "x", "datatype": "FP32", "shape": [b, 4], "data": data }] })
    };
    let r = c.post_json("/v2/models/emu/infer", &batch(5)).await.unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let body = r.json();
    assert_eq!(body["outputs"][0]["shape"], json!([5, 2]));
    let data = body["outputs"][0]["data"].as_array().unwrap();
    let sums: Vec<f64> = data.chunks(2).map(|row| row[1].as_f64().unwrap()).collect();
    assert_eq!(sums, vec![0.0, 4.0, 8.0, 12.0, 16.0]);
    assert_eq!(body["parameters"]["samples"], json!(5));
    assert_eq!(body["parameters"]["variants"].as_array().unwrap().len(), 5);
    // More samples than the queue can ever hold: refused, naming the limit.
    let r = c.post_json("/v2/models/emu/infer", &batch(9)).await.unwrap();
    assert_eq!(r.status, 400);
    assert!(r.json()["error"]
        .as_str()
        .unwrap()
        .contains("a batch of 9 samples; emu takes 1 to 8 per request (its max_queue)"));

    // The configuration and statistics, from the config and the counters.
    let config = c.get("/v2/models/emu/config").await.unwrap().json();
    assert_eq!(config["max_batch_size"], json!(8));
    assert_eq!(config["parameters"]["policy"]["string_value"], json!("jellyfish"));
    let stats = c.get("/v2/models/emu/stats").await.unwrap().json();
    let s = &stats["model_stats"][0];
    assert_eq!(s["inference_count"], json!(5));
    assert_eq!(s["inference_stats"]["success"]["count"], json!(5));
    assert!(s["execution_count"].as_u64().unwrap() >= 1, "{s}");
    assert!(s["inference_stats"]["success"]["ns"].as_u64().unwrap() > 0, "{s}");
    let all = c.get("/v2/models/stats").await.unwrap().json();
    assert_eq!(all["model_stats"].as_array().unwrap().len(), 1);
    assert_eq!(c.get("/v2/models/nope/stats").await.unwrap().status, 404);
    let counters = &server.state.apps["emu"].counters;
    assert_eq!(counters.accepted.load(std::sync::atomic::Ordering::Relaxed), 5);
    server.stop().await.unwrap();
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

fn zlib(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

fn raw_deflate(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes).read_to_end(&mut out).unwrap();
    out
}

/// The classification extension (labels from the model directory's labels.txt),
/// compressed bodies both ways (a decompression bomb refused with 413 while it
/// inflates), the statistics as Triton reports them, the endpoints sluice does not
/// serve (501 naming what), and the Keep-Alive hint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classes_compression_statistics_and_refusals() {
    let config = format!(
        "max_body_bytes = 65536\n{}",
        emu_app("zero", "slo_ms = 100\nworkers = 1\npolicy = \"jellyfish\"\nmodel_dir = \"{dir}/models\"")
    );
    let server = TestServer::start(&config).await.unwrap();
    std::fs::create_dir_all(server.dir.path().join("models")).unwrap();
    std::fs::write(server.dir.path().join("models/labels.txt"), "variant\nsum\n").unwrap();
    let mut c = server.client().await;
    let infer = "/v2/models/emu/infer";
    let body = |outputs: Value| {
        json!({ "inputs": [{ "name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4] }],
                "outputs": outputs })
    };

    // Classes: the emulated output is [variant id (0-2), sum of the input = 10].
    let r =
        c.post_json(infer, &body(json!([{ "name": "output", "parameters": { "classification": 1 } }]))).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let out = &r.json()["outputs"][0];
    assert_eq!((out["datatype"].clone(), out["shape"].clone()), (json!("BYTES"), json!([1, 1])), "{out}");
    assert_eq!(out["data"], json!(["10.000000:1:sum"]), "labels from model_dir/labels.txt");
    let r = c
        .post_json(
            infer,
            &body(json!([{ "name": "output", "parameters": { "classification": 2, "binary_data": true } }])),
        )
        .await
        .unwrap();
    let json_len: usize = r.header("inference-header-content-length").unwrap().parse().unwrap();
    let tail = &r.body[json_len..];
    // BYTES in binary: each element its u32 length, then its bytes.
    let first = u32::from_le_bytes(tail[..4].try_into().unwrap()) as usize;
    assert_eq!(&tail[4..4 + first], b"10.000000:1:sum");
    let second = std::str::from_utf8(&tail[8 + first..]).unwrap();
    assert!(second.ends_with(":0:variant"), "{second}");
    let r =
        c.post_json(infer, &body(json!([{ "name": "output", "parameters": { "classification": -1 } }]))).await.unwrap();
    assert_eq!(r.status, 400);
    assert!(r.text().contains("output `output`: parameters.classification"), "{}", r.text());
    let config = c.get("/v2/models/emu/config").await.unwrap().json();
    assert_eq!(config["output"][0]["label_filename"], json!("labels.txt"), "{config}");

    // Compressed request bodies: gzip, zlib deflate, raw deflate.
    let plain = small_infer(5).to_string().into_bytes();
    for (coding, bytes) in [("gzip", gzip(&plain)), ("deflate", zlib(&plain)), ("deflate", raw_deflate(&plain))] {
        let r = c.request("POST", infer, &[("content-encoding", coding)], &bytes).await.unwrap();
        assert_eq!(r.status, 200, "{coding}: {}", r.text());
        assert_eq!(r.json()["outputs"][0]["data"][1], json!(11.0), "{coding}");
    }
    // A bomb: a few hundred bytes that inflate past max_body_bytes: 413, found while
    // inflating (the inflated body is never held).
    let bomb = gzip(&vec![b' '; 10 << 20]);
    assert!(bomb.len() < 65536);
    let r = c.request("POST", infer, &[("content-encoding", "gzip")], &bomb).await.unwrap();
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(r.text().contains("decompresses (gzip) past the limit of 65536 bytes"), "{}", r.text());
    let r = c.request("POST", infer, &[("content-encoding", "gzip")], b"not gzip").await.unwrap();
    assert_eq!(r.status, 400);
    assert!(r.text().contains("does not decompress"), "{}", r.text());
    let r = c.request("POST", infer, &[("content-encoding", "br")], &plain).await.unwrap();
    assert_eq!(r.status, 415);
    assert!(r.text().contains("content-encoding `br` is not supported"), "{}", r.text());
    let budget = server.state.body_budget.clone();
    assert!(eventually(Duration::from_secs(5), || budget.available_permits() == 256 * 1024).await, "budget given back");

    // Compressed answers for a client that accepts them (when worth it: 1 KiB up).
    let r = c.request("GET", "/metrics", &[("accept-encoding", "br;q=1, gzip;q=0.5")], b"").await.unwrap();
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    let text = String::from_utf8(gunzip(&r.body)).unwrap();
    assert!(text.contains("sluice_requests_total"), "{text}");
    let r = c.request("GET", "/v2/health/live", &[("accept-encoding", "gzip")], b"").await.unwrap();
    assert_eq!((r.header("content-encoding"), r.json()), (None, json!({ "live": true })), "small: as is");
    let r = c.request("GET", "/metrics", &[("accept-encoding", "gzip;q=0")], b"").await.unwrap();
    assert_eq!(r.header("content-encoding"), None);

    // An idle keep-alive connection is closed after header_read_timeout_ms (10 s):
    // the answer says so.
    assert_eq!(r.header("keep-alive"), Some("timeout=10"));

    // Statistics as Triton reports them: version "1", every phase counted alike.
    let stats = c.get("/v2/models/emu/stats").await.unwrap().json();
    let s = &stats["model_stats"][0];
    assert_eq!(s["version"], json!("1"), "{s}");
    let served = s["inference_count"].clone();
    assert_eq!(served, json!(5), "{s}");
    for phase in ["success", "queue", "compute_input", "compute_infer", "compute_output"] {
        assert_eq!(s["inference_stats"][phase]["count"], served, "{phase}: {s}");
    }
    assert_eq!(c.get("/v2/models/emu/versions/1/stats").await.unwrap().json()["model_stats"][0], *s);

    // What sluice does not serve: 501 naming it, on any method.
    for (method, path, needle) in [
        ("GET", "/v2/systemsharedmemory/status", "system shared memory is not supported"),
        ("POST", "/v2/systemsharedmemory/region/r/register", "nothing was registered"),
        ("POST", "/v2/systemsharedmemory/unregister", "system shared memory is not supported"),
        ("GET", "/v2/cudasharedmemory/region/r/status", "CUDA shared memory is not supported"),
        ("POST", "/v2/cudasharedmemory/register", "CUDA shared memory is not supported"),
        ("GET", "/v2/trace/setting", "trace settings are not supported"),
        ("POST", "/v2/models/emu/trace/setting", "trace settings are not supported"),
        ("POST", "/v2/logging", "log settings are not supported"),
        ("POST", "/v2/models/emu/generate", "the generate extension is not supported"),
        ("POST", "/v2/models/emu/generate_stream", "the generate extension is not supported"),
        ("POST", "/v2/repository/models/emu/unload", "model repository control is not supported"),
    ] {
        let r = c.request(method, path, &[], b"{}").await.unwrap();
        assert_eq!(r.status, 501, "{method} {path}: {}", r.text());
        assert!(r.text().contains(needle), "{method} {path}: {}", r.text());
    }
    server.stop().await.unwrap();
}

/// A pipeline's statistics are its task apps': the statistics route answers them
/// (it answered 400 while the docs said so, issue 40).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelines_statistics_are_its_task_apps() {
    let dir = tempfile::tempdir().unwrap();
    let mut profile = String::from("version = 1\nname = \"p\"\ndevice = \"emulated\"\nsource = \"synthetic\"\n");
    for (name, acc) in [("d-one", 0.8), ("c-one", 0.7)] {
        profile.push_str(&format!(
            "\n[[model]]\nname = \"{name}\"\naccuracy = {acc}\naccuracy_source = \"synthetic\"\nbatch_sizes = [1, 2]\n\
             p50_us = [100, 150]\np95_us = [100, 150]\np99_us = [100, 150]\n"
        ));
    }
    std::fs::write(dir.path().join("profile.toml"), profile).unwrap();
    let problem = "version = 1\nkind = \"loki\"\nprofile = \"profile.toml\"\nbatch_sizes = [1, 2]\nslo_ms = 100\n\
                   workers = 2\ndemand_qps = 10\n\
                   [[pipeline.task]]\nname = \"detect\"\nmodels = [\"d-one\"]\n\
                   fanout.d-one = { factor = 1.0, branch = { classify = 1.0 } }\n\
                   [[pipeline.task]]\nname = \"classify\"\nmodels = [\"c-one\"]\n\
                   [[pipeline.edge]]\nfrom = \"detect\"\nto = \"classify\"\n";
    std::fs::write(dir.path().join("problem.toml"), problem).unwrap();
    let config = format!(
        "[[pipeline]]\nname = \"p\"\nproblem = \"{}\"\nexecutor = \"emulated\"\n\
         input = {{ name = \"x\", datatype = \"FP32\", shape = [4] }}\n",
        dir.path().join("problem.toml").display()
    );
    let server = TestServer::start(&config).await.unwrap();
    let mut c = server.client().await;
    // Served at `detect` at least (whether `classify` keeps it is the pipeline's
    // early dropping: this test is about the statistics).
    let r = c.post_json("/v2/models/p/infer", &small_infer(1)).await.unwrap();
    assert!(r.status == 200 || r.status == 504, "{}", r.text());
    let r = c.get("/v2/models/p/stats").await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let stats = r.json();
    let names: Vec<&str> =
        stats["model_stats"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["p.detect", "p.classify"], "{stats}");
    assert_eq!(stats["model_stats"][0]["inference_count"], json!(1), "{stats}");
    for s in stats["model_stats"].as_array().unwrap() {
        assert_eq!(s["version"], json!("1"));
        let i = &s["inference_stats"];
        assert_eq!(i["compute_input"]["count"], i["compute_infer"]["count"], "{s}");
    }
    assert_eq!(c.get("/v2/models/p/versions/pipeline/stats").await.unwrap().status, 200);
    server.stop().await.unwrap();
}

/// Every call of docs/host.md's compatibility table through every flavour of
/// tritonclient (HTTP and gRPC; sync, the sync clients' async_infer, and aio):
/// what the table says is supported answers as Triton would, what it says is
/// refused is refused with a status and a message naming what is not supported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_tritonclient_flavour_makes_every_call_of_the_table() {
    let server = TestServer::start_with_grpc(&emu_app(
        "zero",
        "slo_ms = 1000\nworkers = 2\npolicy = \"fixed\"\nparams = { model = \"small\" }",
    ))
    .await
    .unwrap();
    let python = root().join(".venv/bin/python");
    assert!(python.exists(), "{} is missing: run `cargo xtask setup`", python.display());
    let (http, grpc) = (server.addr.to_string(), server.grpc.unwrap().to_string());
    let out = tokio::process::Command::new(&python)
        .arg(root().join("tests/tritonclient_calls.py"))
        .args([http.as_str(), grpc.as_str(), "emu", "x"])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "tritonclient failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let seen: Value = serde_json::from_slice(out.stdout.trim_ascii()).unwrap();
    let flavours = ["http-sync", "http-async", "http-aio", "grpc-sync", "grpc-async", "grpc-aio"];
    assert_eq!(seen.as_object().unwrap().len(), flavours.len(), "{seen}");
    // The emulated output for [1, 2, 3, 4]: the variant's id (0, `small`), the sum.
    let served = json!([0.0, 10.0]);
    for flavour in flavours {
        let calls = seen[flavour].as_object().unwrap_or_else(|| panic!("{flavour} missing: {seen}"));
        let grpc = flavour.starts_with("grpc");
        let ok = |call: &str| -> &Value {
            let got = &calls[call];
            assert!(got.get("ok").is_some(), "{flavour} {call}: {got}");
            &got["ok"]
        };
        let refused = |call: &str, needle: &str| {
            let got = &calls[call];
            let (status, message) = (got["error"].as_str(), got["message"].as_str().unwrap_or(""));
            let expected = if grpc { "StatusCode.UNIMPLEMENTED" } else { "501" };
            assert_eq!(status, Some(expected), "{flavour} {call}: {got}");
            assert!(message.contains(needle), "{flavour} {call}: {got}");
        };
        // Inference, in every flavour.
        assert_eq!(ok("infer")["output"], served, "{flavour}");
        assert_eq!(ok("infer")["id"], json!("call-1"), "{flavour}: the id is echoed");
        assert_eq!(ok("infer_json")["output"], served, "{flavour}");
        assert_eq!(ok("infer_no_id")["id"], json!("absent"), "{flavour}: none sent, none answered");
        assert_eq!(ok("infer_parameters")["output"], served, "{flavour}: parameters, priority, timeout accepted");
        assert_eq!(ok("infer_sequence")["output"], served, "{flavour}: sequence ids accepted");
        assert_eq!(ok("classification")["output"], json!(["10.000000:1"]), "{flavour}: BYTES score:index");
        for algorithm in ["gzip", "deflate"] {
            assert_eq!(ok(&format!("compression_{algorithm}"))["output"], served, "{flavour} {algorithm}");
        }
        let pinned = &calls["infer_pinned"];
        let expected = if grpc { "StatusCode.INVALID_ARGUMENT" } else { "400" };
        assert_eq!(pinned["error"], json!(expected), "{flavour}: a pinned version is refused: {pinned}");
        let unknown = &calls["infer_unknown_model"];
        let expected = if grpc { "StatusCode.NOT_FOUND" } else { "404" };
        assert_eq!(unknown["error"], json!(expected), "{flavour}: {unknown}");
        if flavour.ends_with("async") {
            // The sync clients' async_infer covers inference only.
            continue;
        }
        // Health, metadata and the extensions.
        for call in ["server_live", "server_ready", "model_ready", "variant_ready"] {
            assert_eq!(ok(call), &json!(true), "{flavour} {call}");
        }
        assert_eq!(ok("server_metadata")["name"], json!("sluice"), "{flavour}");
        assert_eq!(ok("model_metadata")["name"], json!("emu"), "{flavour}");
        assert_eq!(ok("model_metadata")["versions"].as_array().unwrap().len(), 3, "{flavour}: the variants");
        assert_eq!(ok("variant_metadata")["versions"].as_array().unwrap().len(), 1, "{flavour}");
        assert_eq!(ok("model_config")["name"], json!("emu"), "{flavour}");
        assert_eq!(ok("repository_index"), &json!(3), "{flavour}: one entry per variant");
        assert_eq!(ok("statistics")["version"], json!("1"), "{flavour}");
        // Refused, named.
        refused("load", "model repository control is not supported");
        refused("unload", "model repository control is not supported");
        for call in ["shm_register", "shm_status", "shm_unregister"] {
            refused(call, "system shared memory is not supported");
        }
        for call in ["cuda_status", "cuda_unregister"] {
            refused(call, "CUDA shared memory is not supported");
        }
        refused("trace_get", "trace settings are not supported");
        refused("trace_update", "trace settings are not supported");
        refused("log_get", "log settings are not supported");
        refused("log_update", "log settings are not supported");
        if grpc {
            refused("stream", "streaming");
        }
    }
    server.stop().await.unwrap();
}
