//! End to end: a real server on 127.0.0.1:0 with two apps, one on ONNX Runtime
//! (real ImageNet architectures) and one emulated; thousands of requests, each
//! answered exactly once, by a variant the worker had loaded.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{json, Value};
use sluice_e2e::*;

const CONFIG: &str = r#"
[[app]]
name = "imagenet"
slo_ms = 2000
workers = 2
executor = "onnx"
profile = "{root}/profiles/imagenet-light-cpu.toml"
model_dir = "{root}/models/imagenet"
models = ["shufflenet", "squeezenet"]
max_batch = 4
policy = "jellyfish"
input = { name = "data_0", datatype = "FP32", shape = [3, 224, 224] }

[[app]]
name = "emu"
slo_ms = 50
workers = 4
router = "shortest-queue"
executor = "emulated"
profile = "{dir}/emulated.toml"
max_queue = 4096
policy = "jellyfish"
input = { name = "x", datatype = "FP32", shape = [4] }
"#;

fn image(i: usize) -> Vec<f32> {
    let bytes = std::fs::read(root().join("models/imagenet/images.f32"))
        .expect("models/imagenet/images.f32: run `cargo xtask setup`");
    let per = 3 * 224 * 224;
    let n = bytes.len() / 4 / per;
    let start = (i % n) * per * 4;
    bytes[start..start + per * 4].chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_apps_every_request_answered_once_by_a_loaded_variant() {
    let server = TestServer::start(CONFIG).await.expect("server starts");
    let addr = server.addr;

    // Emulated app: 3,000 requests from 12 concurrent clients.
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..12u64 {
        tasks.spawn(async move {
            let mut client = sluice_loadgen::Client::connect(addr).await.unwrap();
            let mut out = Vec::new();
            for i in 0..250u64 {
                let id = c * 1000 + i;
                let r = client.post_json("/v2/models/emu/infer", &small_infer(id)).await.unwrap();
                out.push((id, r.status, r.json()));
            }
            out
        });
    }
    // ONNX app: 120 real image tensors from 3 clients.
    let mut onnx_tasks = tokio::task::JoinSet::new();
    for c in 0..3usize {
        onnx_tasks.spawn(async move {
            let mut client = sluice_loadgen::Client::connect(addr).await.unwrap();
            let mut out = Vec::new();
            for i in 0..40usize {
                let body = json!({ "id": format!("img-{c}-{i}"), "inputs": [{ "name": "data_0", "datatype": "FP32", "shape": [1, 3, 224, 224], "data": image(c * 40 + i) }] });
                let r = client.request("POST", "/infer", &[("content-type", "application/json")], {
                    let mut b = body.clone();
                    b["app"] = json!("imagenet");
                    b.to_string()
                }.as_bytes()).await.unwrap();
                out.push((format!("img-{c}-{i}"), r.status, r.json()));
            }
            out
        });
    }

    let mut ids = HashSet::new();
    let mut by_status: BTreeMap<u16, u64> = BTreeMap::new();
    while let Some(r) = tasks.join_next().await {
        for (id, status, body) in r.unwrap() {
            assert!(ids.insert(id), "request {id} answered twice");
            *by_status.entry(status).or_default() += 1;
            if status == 200 {
                assert_eq!(body["id"], json!(id.to_string()), "the response echoes the request id");
                let variant = body["model_version"].as_str().unwrap();
                assert!(["small", "medium", "large"].contains(&variant), "unknown variant {variant}");
                assert_eq!(body["parameters"]["variant"], json!(variant));
                // The emulated output names the model id and sums the input.
                assert_eq!(body["outputs"][0]["data"][1].as_f64().unwrap(), 6.0 + id as f64);
                assert!(body["parameters"]["deadline_us"].as_u64() == Some(50_000));
            } else {
                assert_eq!(status, 504, "only policy/expiry drops are acceptable: {body}");
                assert_eq!(body["dropped"], json!(true));
            }
        }
    }
    assert_eq!(ids.len(), 3000);
    assert!(by_status.get(&200).copied().unwrap_or(0) > 2500, "most requests are served: {by_status:?}");

    let mut img_ids = HashSet::new();
    while let Some(r) = onnx_tasks.join_next().await {
        for (id, status, body) in r.unwrap() {
            assert!(img_ids.insert(id.clone()), "request {id} answered twice");
            assert_eq!(status, 200, "{body}");
            let variant = body["model_version"].as_str().unwrap();
            assert!(["shufflenet", "squeezenet"].contains(&variant), "unknown variant {variant}");
            let out = &body["outputs"][0];
            assert_eq!(out["name"], json!("output"), "every variant answers under the app's output name");
            assert_eq!(out["shape"], json!([1, 1000]), "an ImageNet classifier answers 1000 classes");
            let probs: Vec<f64> = out["data"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
            assert!(probs.iter().all(|p| p.is_finite()));
        }
    }
    assert_eq!(img_ids.len(), 120);

    // Server-side accounting agrees: every accepted request got exactly one answer.
    for app in server.state.apps.values() {
        let c = &app.counters;
        let accepted = c.accepted.load(Ordering::Relaxed);
        let answered = c.served.load(Ordering::Relaxed) + c.dropped.load(Ordering::Relaxed);
        assert_eq!(accepted, answered, "app {}: accepted {accepted}, answered {answered}", app.name());
    }
    assert_eq!(server.state.apps["emu"].counters.accepted.load(Ordering::Relaxed), 3000);
    assert_eq!(server.state.apps["imagenet"].counters.accepted.load(Ordering::Relaxed), 120);

    // Metrics reflect the traffic.
    let mut c = server.client().await;
    let metrics = String::from_utf8(c.get("/metrics").await.unwrap().body).unwrap();
    assert!(metrics.contains("sluice_requests_total{app=\"imagenet\""), "{metrics}");
    assert!(metrics.contains("sluice_policy_decide_seconds_count{app=\"emu\"}"));
    // The metrics and the admin view count the same answers (docs/host.md, Metrics).
    for app in server.state.apps.values() {
        let sum = |prefix: &str| -> u64 {
            metrics
                .lines()
                .filter(|l| l.starts_with("sluice_requests_total{") && l.contains(&format!("app=\"{}\"", app.name())))
                .filter(|l| l.split("outcome=\"").nth(1).is_some_and(|o| o.starts_with(prefix)))
                .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
                .sum()
        };
        let c = &app.counters;
        assert_eq!(sum("served") + sum("late"), c.served.load(Ordering::Relaxed), "{}: {metrics}", app.name());
        assert_eq!(sum("late"), c.late.load(Ordering::Relaxed), "{}", app.name());
        assert_eq!(sum("dropped-"), c.dropped.load(Ordering::Relaxed), "{}", app.name());
        assert_eq!(sum("rejected"), c.rejected.load(Ordering::Relaxed), "{}", app.name());
    }
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_answers_everything_queued() {
    let config = emu_app(
        "emulated",
        "slo_ms = 5000\nworkers = 1\npolicy = \"fixed\"\nparams = { model = \"large\" }\nmax_batch = 1",
    );
    let server = TestServer::start(&config).await.unwrap();
    let sent = tokio::spawn(burst(server.addr, 40));
    // Wait until all 40 are accepted (batch 1 at 4 ms each: most are still queued).
    let state = server.state.clone();
    assert!(
        eventually(Duration::from_secs(5), || state.apps["emu"].counters.accepted.load(Ordering::Relaxed) == 40).await
    );
    assert!(state.apps["emu"].queued.load(Ordering::Relaxed) > 10, "requests are still queued at shutdown");
    server.stop().await.unwrap();
    let statuses: Vec<u16> = sent.await.unwrap().iter().map(|r| r.status).collect();
    assert_eq!(statuses.len(), 40);
    assert!(statuses.iter().all(|s| *s == 200), "every queued request was served during the drain: {statuses:?}");
    let c = &state.apps["emu"].counters;
    assert_eq!(c.served.load(Ordering::Relaxed), 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_models_change_at_run_time() {
    let server =
        TestServer::start(&emu_app("emulated", "slo_ms = 100\nworkers = 1\npolicy = \"jellyfish\"")).await.unwrap();
    let mut c = server.client().await;
    let r = admin(&mut c, "PUT", "/admin/apps/emu/workers/0/models", br#"{"models": ["medium"]}"#).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let status = app_status(&mut c, "emu").await;
    assert_eq!(status["workers"][0]["loaded"], json!(["medium"]));
    for i in 0..20 {
        let r = c.post_json("/v2/models/emu/infer", &small_infer(i)).await.unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.json()["model_version"], json!("medium"), "only the loaded model serves");
    }
    // The policy describes its state through the optional `status` export.
    let status = app_status(&mut c, "emu").await;
    assert_eq!(status["workers"][0]["policy_status"]["model"], json!(1), "jellyfish reports its choice: {status}");
    let bad = admin(&mut c, "PUT", "/admin/apps/emu/workers/0/models", br#"{"models": ["huge"]}"#).await;
    assert_eq!(bad.status, 400);
    assert!(String::from_utf8_lossy(&bad.body).contains("no model `huge`"));
    // A model named twice is a mistake in the request (issue 40), not merged silently.
    let twice = admin(&mut c, "PUT", "/admin/apps/emu/workers/0/models", br#"{"models": ["small", "small"]}"#).await;
    assert_eq!(twice.status, 400, "{}", twice.text());
    assert!(twice.text().contains("model `small` is listed twice"), "{}", twice.text());
    let r = admin(&mut c, "PUT", "/admin/apps/emu/workers/0/models", br#"{"models": ["small", "large"]}"#).await;
    assert_eq!(r.status, 200);
    let served: Vec<Value> = {
        let mut v = Vec::new();
        for i in 0..10 {
            v.push(c.post_json("/v2/models/emu/infer", &small_infer(i)).await.unwrap().json());
        }
        v
    };
    assert!(served.iter().all(|b| b["model_version"] != json!("medium")));
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_arrivals_replay_in_the_simulator() {
    let server =
        TestServer::start(&emu_app("zero", "slo_ms = 100\nworkers = 2\npolicy = \"jellyfish\"")).await.unwrap();
    // The server's temp dir goes away with it: keep the log and the replay elsewhere.
    let keep = tempfile::tempdir().unwrap();
    let dir = keep.path().to_path_buf();
    std::fs::copy(server.dir.path().join("zero.toml"), dir.join("zero.toml")).unwrap();
    let log = dir.join("arrivals.csv");
    server.state.record_arrivals(&log).unwrap();
    let mut c = server.client().await;
    for i in 0..50 {
        assert_eq!(c.post_json("/v2/models/emu/infer", &small_infer(i)).await.unwrap().status, 200);
    }
    server.stop().await.unwrap();
    let experiment = format!(
        "version = 1\nname = \"replay\"\nduration_s = 60\nbuiltin_policy_dir = \"{}\"\n[[app]]\nname = \"emu\"\nslo_ms = 100\nworkers = 2\nprofile = \"zero.toml\"\npolicy = \"jellyfish\"\narrivals = {{ kind = \"recorded\", file = \"arrivals.csv\" }}\n",
        policies_dir().display()
    );
    std::fs::write(dir.join("replay.toml"), experiment).unwrap();
    let (e, base) = sluice_sim::Experiment::load(&dir.join("replay.toml")).unwrap();
    let out = sluice_sim::run_experiment(&e, &base, false).unwrap();
    assert_eq!(out.results[0].requests, 50, "every recorded arrival is replayed");
    assert_eq!(out.results[0].on_time, 50);
}

/// Sends `n` requests one after another on one connection; returns the serving
/// worker of each.
async fn workers_of(c: &mut sluice_loadgen::Client, n: u64) -> Vec<u64> {
    let mut out = Vec::new();
    for i in 0..n {
        let r = c.post_json("/v2/models/emu/infer", &small_infer(i)).await.unwrap();
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        out.push(r.json()["parameters"]["worker"].as_u64().unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_routing_follows_the_weights_and_changes_live() {
    let server = TestServer::start(&emu_app(
        "zero",
        "slo_ms = 100\nworkers = 3\npolicy = \"jellyfish\"\nrouter = \"weighted\"\nweights = [1, 0, 3]",
    ))
    .await
    .unwrap();
    let mut c = server.client().await;
    let count = |ws: &[u64], w: u64| ws.iter().filter(|x| **x == w).count();
    let ws = workers_of(&mut c, 40).await;
    assert_eq!((count(&ws, 0), count(&ws, 1), count(&ws, 2)), (10, 0, 30), "{ws:?}");
    let status = app_status(&mut c, "emu").await;
    assert_eq!(status["weights"], json!([1.0, 0.0, 3.0]));
    // A new plan's shares apply from the next request on.
    let r = admin(&mut c, "PUT", "/admin/apps/emu/weights", br#"{"weights": [0, 1, 0]}"#).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(workers_of(&mut c, 10).await, vec![1; 10]);
    // Bad weights are refused, naming what is wrong, and the old ones stay.
    let r = admin(&mut c, "PUT", "/admin/apps/emu/weights", br#"{"weights": [1, 1]}"#).await;
    assert_eq!(r.status, 400);
    assert!(
        String::from_utf8_lossy(&r.body).contains("expected 3 weights (one per worker), got 2"),
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    let r = admin(&mut c, "PUT", "/admin/apps/emu/weights", br#"{"weights": [0, 0, 0]}"#).await;
    assert_eq!(r.status, 400);
    assert_eq!(workers_of(&mut c, 3).await, vec![1; 3]);
    server.stop().await.unwrap();

    // Weights belong to the weighted router only.
    let server =
        TestServer::start(&emu_app("zero", "slo_ms = 100\nworkers = 2\npolicy = \"jellyfish\"")).await.unwrap();
    let mut c = server.client().await;
    let r = admin(&mut c, "PUT", "/admin/apps/emu/weights", br#"{"weights": [1, 1]}"#).await;
    assert_eq!(r.status, 400);
    assert!(
        String::from_utf8_lossy(&r.body).contains("weights apply to router = \\\"weighted\\\""),
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    server.stop().await.unwrap();
}
