//! Pipelines (Loki) on the live host: a request goes through a tree of tasks, each
//! task's workers placed by the MILP and fed by MostAccurateFirst; the client is
//! answered once with every task's variants and the path accuracy, and every
//! intermediate request is served or dropped with a reason — also under load
//! across re-plans.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice_e2e::*;

/// Variants of a three-task tree, µs at batch 1..=8 (base + per extra sample).
fn profile() -> String {
    let models = [
        ("d-fast", 0.70, 2000.0, 400.0),
        ("d-good", 0.90, 4000.0, 800.0),
        ("c-small", 0.60, 1000.0, 200.0),
        ("c-big", 0.85, 3000.0, 500.0),
        ("f-one", 0.80, 1000.0, 200.0),
    ];
    let mut s = String::from("version = 1\nname = \"pipeline-test\"\ndevice = \"emulated\"\nsource = \"synthetic\"\n");
    for (name, acc, base, per) in models {
        let lat: Vec<String> = (1..=8).map(|b| format!("{}", (base + per * (b - 1) as f64) as u64)).collect();
        let l = lat.join(", ");
        s.push_str(&format!(
            "\n[[model]]\nname = \"{name}\"\naccuracy = {acc}\naccuracy_source = \"synthetic\"\nbatch_sizes = [1, 2, 3, 4, 5, 6, 7, 8]\np50_us = [{l}]\np95_us = [{l}]\np99_us = [{l}]\n"
        ));
    }
    s
}

/// detect → classify, detect → face: `d-fast` makes 2 requests (3/4 to classify),
/// `d-good` 3 (4/5 to classify).
const GRAPH: &str = r#"
[[pipeline.task]]
name = "detect"
models = ["d-fast", "d-good"]
fanout.d-fast = { factor = 2.0, branch = { classify = 0.75, face = 0.25 } }
fanout.d-good = { factor = 3.0, branch = { classify = 0.8, face = 0.2 } }
[[pipeline.task]]
name = "classify"
models = ["c-small", "c-big"]
[[pipeline.task]]
name = "face"
models = ["f-one"]
[[pipeline.edge]]
from = "detect"
to = "classify"
[[pipeline.edge]]
from = "detect"
to = "face"
"#;

/// A server with pipeline `p` (`extra`: more `[[pipeline]]` lines) on a problem
/// with `workers` workers planned for `demand` req/s; `graph` replaces the tree.
async fn start(workers: u32, demand: f64, extra: &str, graph: &str) -> anyhow::Result<TestServer> {
    start_with_batches(workers, demand, extra, graph, "[1, 2, 4, 8]").await
}

/// As [`start`], the MILP choosing each worker's batch among `batches` (the
/// profile's tables go to batch 8 whatever it says).
async fn start_with_batches(
    workers: u32,
    demand: f64,
    extra: &str,
    graph: &str,
    batches: &str,
) -> anyhow::Result<TestServer> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("profile.toml"), profile())?;
    let problem = format!(
        "version = 1\nkind = \"loki\"\nprofile = \"profile.toml\"\nbatch_sizes = {batches}\nslo_ms = 100\nworkers = {workers}\ndemand_qps = {demand}\n{graph}"
    );
    let path = dir.path().join("problem.toml");
    std::fs::write(&path, problem)?;
    let config = format!(
        "[[pipeline]]\nname = \"p\"\nproblem = \"{}\"\nexecutor = \"emulated\"\ninput = {{ name = \"x\", datatype = \"FP32\", shape = [4] }}\n{extra}\n",
        path.display()
    );
    let server = TestServer::start(&config).await;
    // The problem's directory must outlive the server's start only.
    drop(dir);
    server
}

async fn status(c: &mut sluice_loadgen::Client) -> Value {
    admin(c, "GET", "/admin/pipelines/p", b"").await.json()
}

/// Every intermediate request created at a task ended served, dropped or rejected;
/// every accepted client request was answered once.
fn assert_accounted(s: &Value) {
    for t in s["tasks"].as_array().unwrap() {
        let n = |k: &str| t[k].as_u64().unwrap();
        assert_eq!(n("created"), n("served") + n("dropped") + n("rejected"), "task books do not balance: {t}");
    }
    let c = &s["counters"];
    let n = |k: &str| c[k].as_u64().unwrap();
    assert_eq!(n("accepted"), n("on_time") + n("partial") + n("dropped"), "client books do not balance: {c}");
    assert_eq!(s["in_flight"], json!(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_answered_once_with_every_task_variant_and_its_path_accuracy() {
    // No early dropping: on a busy test machine a request may overrun a few-ms
    // budget, and this test is about the answer's shape.
    let server = start(6, 20.0, "early_drop = \"none\"\nreplan_period_s = 0\n", GRAPH).await.unwrap();
    let mut c = server.client().await;
    let r = c.post_json("/v2/models/p/infer", &small_infer(1)).await.unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let body = r.json();
    let p = &body["parameters"];
    assert_eq!(p["pipeline"], json!(true));
    assert_eq!(p["deadline_met"], json!(true), "{body}");
    // Light load: the plan serves the most accurate variants (hardware scaling).
    assert_eq!(p["variants"]["detect"], json!({ "d-good": 1 }), "{body}");
    let classify: u64 = p["variants"]["classify"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    let face: u64 = p["variants"]["face"].as_object().map_or(0, |m| m.values().map(|v| v.as_u64().unwrap()).sum());
    // d-good: 3 requests, 2.4 expected to classify and 0.6 to face.
    assert!((2..=3).contains(&classify) && face <= 1 && classify + face >= 2, "{body}");
    assert_eq!(p["paths"].as_u64().unwrap(), classify + face);
    let acc = p["accuracy"].as_f64().unwrap();
    assert!(acc > 0.9 * 0.8 - 1e-9 && acc <= 0.9 * 0.85 + 1e-9, "path accuracy {acc}: {body}");
    // One output per sink that answered, its rows the intermediate requests.
    let outputs = body["outputs"].as_array().unwrap();
    assert_eq!(outputs[0]["name"], json!("classify"));
    assert_eq!(outputs[0]["shape"][0].as_u64().unwrap(), classify);
    // The simple endpoint, metadata, readiness.
    let mut simple = small_infer(2);
    simple["app"] = json!("p");
    let r = c.post_json("/infer", &simple).await.unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let meta = c.get("/v2/models/p").await.unwrap().json();
    assert_eq!(meta["outputs"].as_array().unwrap().len(), 2, "{meta}");
    assert_eq!(c.get("/v2/models/p/ready").await.unwrap().status, 200);
    // A task is not an endpoint of its own; an output must be a last task.
    let r = c.post_json("/v2/models/p.classify/infer", &small_infer(3)).await.unwrap();
    assert_eq!(r.status, 404);
    assert!(String::from_utf8_lossy(&r.body).contains("a task of pipeline `p`"));
    let mut bad = small_infer(4);
    bad["outputs"] = json!([{ "name": "detect" }]);
    let r = c.post_json("/v2/models/p/infer", &bad).await.unwrap();
    assert_eq!(r.status, 400);
    assert!(String::from_utf8_lossy(&r.body).contains("its outputs are its last tasks: classify, face"));
    // The admin view: the plan, a device per replica, the tables, the counters.
    let s = status(&mut c).await;
    assert_eq!(s["allocation"]["plan"]["step"], json!("hardware"), "{s}");
    assert_eq!(s["devices"].as_array().unwrap().len(), 6);
    assert!(!s["routing"]["tables"]["frontend"].as_array().unwrap().is_empty());
    assert_accounted(&s);
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_load_across_replans_every_intermediate_request_is_accounted_for() {
    let server = start(6, 20.0, "early_drop = \"rerouting\"\nreplan_period_s = 0\n", GRAPH).await.unwrap();
    let addr = server.addr;
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..8u64 {
        tasks.spawn(async move {
            let mut c = sluice_loadgen::Client::connect(addr).await.unwrap();
            let end = Instant::now() + Duration::from_secs(4);
            let mut out = Vec::new();
            let mut i = 0;
            while Instant::now() < end {
                let r = c.post_json("/v2/models/p/infer", &small_infer(t * 100_000 + i)).await.unwrap();
                out.push((r.status, r.json()));
                i += 1;
            }
            out
        });
    }
    // Re-plans while the clients run: for a heavy demand (accuracy scaling moves
    // devices between tasks and variants), then back to a light one.
    let mut c = server.client().await;
    let mut plans = Vec::new();
    // (A demand the workers meet with the best variants plans the same devices at
    // any batch size, so the heavy demands are well past that.)
    for demand in [2000.0, 20.0, 1500.0] {
        tokio::time::sleep(Duration::from_millis(900)).await;
        let r =
            admin(&mut c, "POST", "/admin/pipelines/p/solve", json!({ "demand_qps": demand }).to_string().as_bytes())
                .await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        plans.push(r.json()["devices"].clone());
    }
    assert_ne!(plans[0], plans[1], "the re-plans did not move any device: {plans:?}");
    let mut answered = 0;
    let mut drops = 0;
    while let Some(r) = tasks.join_next().await {
        for (status, body) in r.unwrap() {
            answered += 1;
            match status {
                200 => {
                    let p = &body["parameters"];
                    assert!(p["accuracy"].as_f64().unwrap() > 0.0, "{body}");
                    for (task, reasons) in p["dropped"].as_object().unwrap() {
                        assert!(["detect", "classify", "face"].contains(&task.as_str()), "{body}");
                        drops += reasons.as_object().unwrap().len();
                    }
                }
                // Nothing served: dropped, naming the task and the reason.
                504 => {
                    assert_eq!(body["dropped"], json!(true), "{body}");
                    assert!(body["task"].is_string() && body["reason"].is_string(), "{body}");
                    drops += 1;
                }
                s => panic!("status {s} during re-planning: {body}"),
            }
        }
    }
    assert!(answered > 100, "only {answered} requests answered");
    // Every client has its answer, so nothing is in flight: the books balance.
    let s = status(&mut c).await;
    assert_accounted(&s);
    assert_eq!(s["counters"]["accepted"].as_u64().unwrap(), answered, "{s}");
    assert!(drops as u64 <= s["counters"]["accepted"].as_u64().unwrap() * 10);
    // Measured fan-outs are reported next to the expected ones and match them.
    let mut checked = 0;
    for f in s["fanout"].as_array().unwrap() {
        if f["requests"].as_u64().unwrap() >= 200 {
            let (m, e) = (f["measured"].as_f64().unwrap(), f["expected"].as_f64().unwrap());
            assert!((m - e).abs() <= 0.1 * e, "fan-out measured {m} vs expected {e}: {f}");
            checked += 1;
        }
    }
    assert!(checked >= 2, "no fan-out measured on enough requests: {s}");
    let history = s["allocation"]["history"].as_array().unwrap();
    assert_eq!(history.len(), 4, "{s}");
    // Each plan names how it was made (a MILP's here: nothing ran out of time).
    assert!(history.iter().all(|h| h["origin"] == "milp" && h["origin_reason"].is_null()), "{s}");
    server.stop().await.unwrap();
}

/// Per task app of pipeline `p`, from `/metrics`: its batches in all and those of at
/// most `most` requests (`sluice_batch_size`, buckets 1, 2, 4, 8, ...).
fn batches_at_most(metrics: &str, most: u32) -> BTreeMap<String, (u64, u64)> {
    let mut out: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for line in metrics.lines().filter(|l| l.starts_with("sluice_batch_size")) {
        let Some(app) = line.split("app=\"").nth(1).and_then(|r| r.split('"').next()) else { continue };
        if !app.starts_with("p.") {
            continue;
        }
        let n: u64 = line.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64;
        let entry = out.entry(app.to_string()).or_default();
        if line.starts_with("sluice_batch_size_count") {
            entry.0 += n;
        } else if line.starts_with("sluice_batch_size_bucket") && line.contains(&format!("le=\"{most}\"")) {
            entry.1 += n;
        }
    }
    out
}

/// Live task policies see what the simulator's do (`flow::task_view`, issue 35):
/// the plans here batch at most 2 while every variant's table goes to 8, and a task
/// budget (2 × the batch latency, a few ms) is far below the 100 ms SLO. So each
/// task worker's policy is bound with its variant's table cut at the plan's batch
/// and the task budget as its SLO, and `fixed` with `allocated` (which serves the
/// largest batch the table allows within the head's deadline: up to 8 on a full
/// table under this load) never runs a batch past the plan's. Re-plans under load
/// re-bind the workers whose slot changed, each between two of its decisions,
/// without losing a request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_policies_see_the_plans_batch_and_the_task_budget_across_rebinds() {
    let extra = "early_drop = \"none\"\nreplan_period_s = 0\nrouting_period_ms = 60000\n";
    let server = start_with_batches(3, 20.0, extra, GRAPH, "[1, 2]").await.unwrap();
    let mut c = server.client().await;
    let first = status(&mut c).await;
    let bound_at_start = first["rebinds"].as_u64().unwrap();
    let placed = first["devices"].as_array().unwrap().iter().filter(|d| !d.is_null()).count() as u64;
    // At start, every placed device's task worker took its plan slot's view.
    assert_eq!(bound_at_start, placed, "{first}");
    let load = tokio::spawn(overload(server.addr));
    // Re-plans while the clients wait on their answers: heavy (accuracy scaling
    // moves devices between variants and tasks), then light again.
    let mut plans = Vec::new();
    for demand in [2000.0, 20.0] {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let body = json!({ "demand_qps": demand }).to_string();
        let r = admin(&mut c, "POST", "/admin/pipelines/p/solve", body.as_bytes()).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        plans.push(r.json()["devices"].clone());
    }
    load.await.unwrap();
    let s = status(&mut c).await;
    assert_ne!(plans[0], plans[1], "the re-plans did not move any device: {plans:?}");
    assert!(s["rebinds"].as_u64().unwrap() > bound_at_start, "no worker was re-bound: {s}");
    // Every request answered once (`overload` checks each answer), every
    // intermediate one served or dropped.
    assert_accounted(&s);
    assert_eq!(s["counters"]["accepted"].as_u64().unwrap(), 16 * 25, "{s}");
    // No batch past the plan's, and the load made batches (so a full table would
    // have let `fixed` run larger ones).
    let metrics = c.get("/metrics").await.unwrap().text();
    let (upto_two, singles) = (batches_at_most(&metrics, 2), batches_at_most(&metrics, 1));
    assert!(!upto_two.is_empty(), "no task batch in the metrics");
    for (app, (all, small)) in &upto_two {
        assert_eq!(all, small, "{app}: {} of {all} batches past the plan's batch of at most 2", all - small);
    }
    let batched: u64 = upto_two.iter().map(|(app, (all, _))| all - singles[app].1).sum();
    assert!(batched > 0, "no batch of 2 formed under overload: {upto_two:?}");
    // What each placed worker's policy is bound with now: its plan slot's view.
    for (d, dev) in s["devices"].as_array().unwrap().iter().enumerate() {
        if dev.is_null() {
            continue;
        }
        let app = &server.state.apps[&format!("p.{}", dev["task"].as_str().unwrap())];
        let (batch, budget) = (dev["batch"].as_u64().unwrap() as usize, dev["budget_us"].as_u64().unwrap());
        assert!(batch <= 2 && budget < 100_000, "{dev}");
        let variant = app.models.iter().position(|m| m.name == dev["variant"].as_str().unwrap()).unwrap();
        assert_eq!(app.models[variant].latency.len(), 8, "the app keeps the profile's table");
        let slot = app.workers[d].slot.lock();
        let view = slot.view.as_ref().expect("a placed task worker has a view");
        assert_eq!((view.models[variant].latency.len(), view.slo), (batch, budget), "device {d}: {dev}");
        let policy = slot.pending.as_ref().map_or(&slot.current, |(p, _)| p);
        let sluice_core::decision::WorkerPolicy::Wasm(p) = policy else { panic!("device {d}: no policy instance") };
        let bound = p.binding();
        assert_eq!(bound.models_of(d as u32)[variant].latency.len(), batch, "device {d}");
        assert_eq!(bound.slo_of(d as u32), budget, "device {d}");
    }
    server.stop().await.unwrap();
}

/// 16 clients × 25 requests, each sent when the last is answered (far more than the
/// test configs' workers serve within the budgets): every answer is 200 or 504, and
/// the drops the answers report, as `task:reason` → count.
async fn overload(addr: std::net::SocketAddr) -> BTreeMap<String, u64> {
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..16u64 {
        tasks.spawn(async move {
            let mut c = sluice_loadgen::Client::connect(addr).await.unwrap();
            let mut out = Vec::new();
            for i in 0..25 {
                let r = c.post_json("/v2/models/p/infer", &small_infer(t * 1000 + i)).await.unwrap();
                out.push((r.status, r.json()));
            }
            out
        });
    }
    let mut reasons: BTreeMap<String, u64> = BTreeMap::new();
    while let Some(r) = tasks.join_next().await {
        for (status, body) in r.unwrap() {
            assert!(status == 200 || status == 504, "{status}: {body}");
            for (task, rs) in body["parameters"]["dropped"].as_object().unwrap() {
                for (reason, n) in rs.as_object().unwrap() {
                    *reasons.entry(format!("{task}:{reason}")).or_default() += n.as_u64().unwrap();
                }
            }
        }
    }
    reasons
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_task_early_dropping_names_the_task_and_the_reason() {
    // Two workers for 300 req/s of offered load: queues build up past the budgets.
    let server = start(3, 20.0, "early_drop = \"per-task\"\nreplan_period_s = 0\n", GRAPH).await.unwrap();
    let reasons = overload(server.addr).await;
    assert!(reasons.keys().any(|k| k.ends_with(":early-drop-over-budget")), "no request overran a budget: {reasons:?}");
    let mut c = server.client().await;
    assert_accounted(&status(&mut c).await);
    server.stop().await.unwrap();
}

/// `early_drop_at = "batch"`: a task's workers drop, before forming a batch, the
/// queued requests that would finish past their task budget even if run at once; the
/// client's answer names the task and the reason, and every request is accounted for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_dropping_at_batch_formation_names_the_task_and_the_reason() {
    let server = start(3, 20.0, "early_drop = \"per-task\"\nearly_drop_at = \"batch\"\nreplan_period_s = 0\n", GRAPH)
        .await
        .unwrap();
    let reasons = overload(server.addr).await;
    assert!(
        reasons.keys().any(|k| k.ends_with(":early-drop-batch-formation")),
        "nothing was dropped at batch formation: {reasons:?}"
    );
    let mut c = server.client().await;
    let s = status(&mut c).await;
    assert_eq!(s["early_drop_at"], "batch", "{s}");
    assert_accounted(&s);
    server.stop().await.unwrap();
}

/// The artifact's root, with the plan and the tables kept for the test's length.
const QUEUE_AWARE: &str =
    "root_dispatch = \"queue-aware\"\nroot_budget = \"slo-per-stage\"\nreplan_period_s = 0\nrouting_period_ms = 60000\n";

/// The (device, accuracy) of every root worker of the plan in `s`, and the device
/// of the most accurate (the lowest among equals); at least two.
fn root_workers(s: &Value) -> (Vec<(usize, f64)>, usize) {
    let accuracy = |v: &Value| match v.as_str().unwrap() {
        "d-good" => 0.9,
        "d-fast" => 0.7,
        other => panic!("not a root variant: {other}"),
    };
    let roots: Vec<(usize, f64)> = s["devices"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .filter(|(_, d)| d["task"] == "detect")
        .map(|(i, d)| (i, accuracy(&d["variant"])))
        .collect();
    assert!(roots.len() >= 2, "the plan has fewer than two root workers: {s}");
    let best = roots.iter().fold(roots[0], |b, &r| if r.1 > b.1 { r } else { b }).0;
    (roots, best)
}

/// The client requests sent to device `d` (admin view `s`).
fn requests(s: &Value, d: usize) -> u64 {
    s["devices"][d]["requests"].as_u64().unwrap()
}

/// `root_dispatch = "queue-aware"` and `root_budget = "slo-per-stage"` (the Loki
/// artifact's root): a client request goes to the most accurate root worker whose
/// queue keeps up, with the SLO over the tree's depth as its root budget. One
/// client at a time finds every queue empty, so the most accurate root worker (the
/// lowest device among equals) takes every request; under overload its queue falls
/// behind and others take some; every request is accounted for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_aware_root_dispatch_fills_the_most_accurate_root_worker_first() {
    let server = start(6, 1500.0, QUEUE_AWARE, GRAPH).await.unwrap();
    let mut c = server.client().await;
    let s = status(&mut c).await;
    assert_eq!((&s["root_dispatch"], &s["root_budget"]), (&json!("queue-aware"), &json!("slo-per-stage")), "{s}");
    let (roots, best) = root_workers(&s);
    for &(d, _) in &roots {
        // 100 ms over two stages.
        assert_eq!(s["devices"][d]["budget_us"], json!(50_000), "{s}");
    }
    // The table would spread these over the root workers by their planned shares.
    let table = s["routing"]["tables"]["frontend"].as_array().unwrap().len();
    for i in 0..30 {
        let r = c.post_json("/v2/models/p/infer", &small_infer(i)).await.unwrap();
        assert!(r.status == 200 || r.status == 504, "{}", String::from_utf8_lossy(&r.body));
    }
    let s = status(&mut c).await;
    for &(d, _) in &roots {
        assert_eq!(requests(&s, d), if d == best { 30 } else { 0 }, "device {d} (table of {table} entries): {s}");
    }
    overload(server.addr).await;
    let s = status(&mut c).await;
    let others: u64 = roots.iter().filter(|r| r.0 != best).map(|r| requests(&s, r.0)).sum();
    assert!(requests(&s, best) > others, "the most accurate root worker is not filled first: {s}");
    assert!(others > 0, "no request overflowed past a busy root worker: {s}");
    assert_accounted(&s);
    assert_eq!(s["counters"]["accepted"], json!(30 + 16 * 25), "{s}");
    server.stop().await.unwrap();
}

/// A stuck root worker under queue-aware dispatch: the most accurate root worker's
/// policy never dispatches (the `misbehave` fixture on that worker only). Its queue
/// grows only as fast as requests come, 100 req/s against the hundreds it could
/// serve, so by the artifact's rate test alone it would take every request. Once its
/// head is late the other root workers take them, until its queue has expired;
/// every request is still answered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_aware_root_dispatch_passes_over_a_stuck_root_worker() {
    let server = start(6, 1500.0, QUEUE_AWARE, GRAPH).await.unwrap();
    let mut c = server.client().await;
    let (roots, best) = root_workers(&status(&mut c).await);
    let bytes = std::fs::read(fixtures_dir().join("misbehave.wasm")).unwrap();
    assert_eq!(upload(&mut c, "misbehave", &bytes).await.status, 201);
    let r = swap(&mut c, "p.detect", "misbehave", json!({ "mode": "never", "worker": best })).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let sent = 60u64;
    let mut tasks = tokio::task::JoinSet::new();
    let start = Instant::now();
    for i in 0..sent {
        let addr = server.addr;
        tasks.spawn(async move {
            tokio::time::sleep_until((start + Duration::from_millis(10 * i)).into()).await;
            let mut c = sluice_loadgen::Client::connect(addr).await.unwrap();
            c.post_json("/v2/models/p/infer", &small_infer(i)).await.unwrap().status
        });
    }
    while let Some(status) = tasks.join_next().await {
        let status = status.unwrap();
        assert!(status == 200 || status == 504, "{status}");
    }
    let s = status(&mut c).await;
    let others: u64 = roots.iter().filter(|r| r.0 != best).map(|r| requests(&s, r.0)).sum();
    assert_eq!(requests(&s, best) + others, sent, "{s}");
    // Without the guard the stuck worker takes all 60 and none is on time (checked);
    // with it, 15 / 45 here. Its head is late 40 ms after it came (50 ms budget, a
    // 9.6 ms batch) and expires at 50 ms, behind it those taken meanwhile.
    assert!(others >= sent / 4, "the stuck root worker took {} of {sent}: {s}", requests(&s, best));
    assert!(s["counters"]["on_time"].as_u64().unwrap() >= others / 2, "the other root workers served: {s}");
    assert_accounted(&s);
    server.stop().await.unwrap();
}

/// `routing_utilization`: the tables fill each worker to that share of its capacity.
/// Planned for 1500 req/s, two `d-good` root workers of 833 req/s each: filled to
/// the full capacity, the first takes 833/1500 of the clients; filled to half, each
/// takes 417, and the 667 left over are spread by capacity, so each takes half. The
/// backup tables still count the full capacity (833 − 750 left on each, where filling
/// to the full capacity leaves 833 − 667 on the second only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_utilization_leaves_headroom_in_the_tables() {
    for (utilization, first) in [(1.0, 833.3333333333334 / 1500.0), (0.5, 0.5)] {
        let extra = format!("routing_utilization = {utilization}\nreplan_period_s = 0\nrouting_period_ms = 60000\n");
        let server = start(6, 1500.0, &extra, GRAPH).await.unwrap();
        let mut c = server.client().await;
        let s = status(&mut c).await;
        assert_eq!(s["routing_utilization"], json!(utilization), "{s}");
        let frontend = s["routing"]["tables"]["frontend"].as_array().unwrap();
        assert_eq!(frontend.len(), 2, "{s}");
        let p = frontend[0]["probability"].as_f64().unwrap();
        assert!((p - first).abs() < 1e-9, "utilization {utilization}: the first root worker takes {p}: {s}");
        // Leftover per root worker: at full filling only the second has any (833 − 667).
        let backup: Vec<f64> = s["routing"]["tables"]["backup"][0]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["leftover_qps"].as_f64().unwrap())
            .collect();
        let expected: &[f64] = if utilization < 1.0 { &[83.33333333333337; 2] } else { &[166.66666666666674] };
        assert_eq!(backup.len(), expected.len(), "utilization {utilization}: {s}");
        assert!(
            backup.iter().zip(expected).all(|(b, e)| (b - e).abs() < 1e-6),
            "utilization {utilization}: {backup:?}"
        );
        server.stop().await.unwrap();
    }
}

/// `beta` replaces the problem file's demand factor: the plans are made for β × the
/// demand (1 when neither says), and the admin view says which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beta_replaces_the_problems_demand_factor() {
    for (extra, beta) in [("", 1.0), ("beta = 1.5\n", 1.5)] {
        let server = start(6, 20.0, &format!("{extra}replan_period_s = 0\n"), GRAPH).await.unwrap();
        let mut c = server.client().await;
        let s = status(&mut c).await;
        assert_eq!(s["beta"], json!(beta), "{s}");
        assert_eq!(s["allocation"]["plan"]["beta"], json!(beta), "{s}");
        server.stop().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graph_that_is_not_a_rooted_tree_is_refused_naming_the_edge() {
    let cycle = GRAPH.to_string() + "[[pipeline.edge]]\nfrom = \"face\"\nto = \"detect\"\n";
    let e = format!("{:#}", start(6, 20.0, "", &cycle).await.err().expect("a cycle must be refused"));
    assert!(e.contains("pipeline p") && e.contains("edge face -> detect"), "{e}");
    let two_parents = GRAPH.to_string() + "[[pipeline.edge]]\nfrom = \"classify\"\nto = \"face\"\n";
    let e = format!("{:#}", start(6, 20.0, "", &two_parents).await.err().expect("two parents must be refused"));
    assert!(e.contains("edge classify -> face") && e.contains("already has the parent `detect`"), "{e}");
    let e = format!("{:#}", start(6, 20.0, "early_drop = \"sometimes\"", GRAPH).await.err().unwrap());
    assert!(e.contains("sometimes") && e.contains("per-task"), "{e}");
}

/// Serves an example config as is (its policy directory moved to a temp dir).
async fn serve_example(name: &str) -> (TestServerHandle, std::net::SocketAddr) {
    serve_example_with(name, |_| {}).await
}

/// Example `name` as `sluice serve` loads it, changed by `change` before it starts.
async fn serve_example_with(
    name: &str,
    change: impl FnOnce(&mut sluice_server::config::Config),
) -> (TestServerHandle, std::net::SocketAddr) {
    let mut config = sluice_server::config::Config::load(&root().join("examples").join(name)).unwrap();
    change(&mut config);
    let dir = tempfile::tempdir().unwrap();
    config.policy_dir = dir.path().join("policies");
    let state = sluice_server::state::State::build(config).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(sluice_server::server::run(listener, state, async {
        let _ = rx.await;
    }));
    (TestServerHandle { tx, task, _dir: dir }, addr)
}

struct TestServerHandle {
    tx: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    _dir: tempfile::TempDir,
}

impl TestServerHandle {
    async fn stop(self) {
        let _ = self.tx.send(());
        self.task.await.unwrap().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_traffic_analysis_example_serves_as_is_naming_every_task_variant() {
    let (server, addr) = serve_example("loki-traffic.toml").await;
    let mut c = sluice_loadgen::Client::connect(addr).await.unwrap();
    let body = sluice_loadgen::infer_body("frame", &[1, 4], &[0.0, 0.0, 0.0, 0.0]);
    let r = c.post_json("/v2/models/traffic/infer", &body).await.unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    let variants = v["parameters"]["variants"].as_object().unwrap();
    // yolov5* make ≥ 1 request for each classifier (factor × branch ≥ 1).
    for task in ["object_detection", "car_classification", "facial_recognition"] {
        assert!(variants.contains_key(task), "{task} missing: {v}");
    }
    assert!(v["parameters"]["accuracy"].as_f64().unwrap() > 0.5, "{v}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_pipeline_runs_on_real_onnx_models() {
    let (server, addr) = serve_example("imagenet-pipeline.toml").await;
    let mut c = sluice_loadgen::Client::connect(addr).await.unwrap();
    let image = vec![0.5f32; 3 * 224 * 224];
    let body = sluice_loadgen::infer_body("data_0", &[1, 3, 224, 224], &image);
    let r = c.post_json("/v2/models/images/infer", &body).await.unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    let p = &v["parameters"];
    assert_eq!(p["variants"]["detect"].as_object().unwrap().len(), 1, "{v}");
    assert_eq!(p["variants"]["classify"].as_object().unwrap().values().map(|n| n.as_u64().unwrap()).sum::<u64>(), 2);
    // The classifier's two answers, stacked: 2 × 1000 ImageNet scores.
    assert_eq!(v["outputs"][0]["name"], json!("classify"));
    assert_eq!(v["outputs"][0]["shape"], json!([2, 1000]), "{}", v["outputs"][0]["shape"]);
    server.stop().await;
}

/// The traffic example with a compressed timeline (tables every 250 ms, a re-plan
/// at least every second) and `scale_down_window_s` = `window`.
async fn serve_traffic(window: f64) -> (TestServerHandle, std::net::SocketAddr) {
    serve_example_with("loki-traffic.toml", |config| {
        let p = &mut config.pipelines[0];
        p.routing_period_ms = 250;
        p.replan_period_s = 1.0;
        p.scale_down_window_s = window;
        config.admin_token = Some(TOKEN.into());
    })
    .await
}

/// 40 req/s for `seconds` from 8 clients, each sending every 200 ms (open loop as
/// far as the pipeline keeps up); the statuses and 504 reasons, as `status` or
/// `504 reason` → count.
async fn paced(addr: std::net::SocketAddr, seconds: u64) -> BTreeMap<String, u64> {
    let mut tasks = tokio::task::JoinSet::new();
    for k in 0..8u64 {
        tasks.spawn(async move {
            let mut c = sluice_loadgen::Client::connect(addr).await.unwrap();
            let body = sluice_loadgen::infer_body("frame", &[1, 4], &[0.0, 0.0, 0.0, 0.0]);
            tokio::time::sleep(Duration::from_millis(25 * k)).await;
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            let mut out = Vec::new();
            for _ in 0..seconds * 5 {
                tick.tick().await;
                let r = c.post_json("/v2/models/traffic/infer", &body).await.unwrap();
                out.push(match r.status {
                    504 => format!("504 {}", r.json()["reason"].as_str().unwrap_or("?")),
                    s => s.to_string(),
                });
            }
            out
        });
    }
    let mut seen = BTreeMap::new();
    while let Some(r) = tasks.join_next().await {
        for s in r.unwrap() {
            *seen.entry(s).or_insert(0) += 1;
        }
    }
    seen
}

/// The demand the traffic pipeline's plan in force was made for.
async fn planned(addr: std::net::SocketAddr) -> f64 {
    let mut c = sluice_loadgen::Client::connect(addr).await.unwrap();
    let v = admin(&mut c, "GET", "/admin/pipelines/traffic", b"").await.json();
    v["allocation"]["plan"]["demand_qps"].as_f64().unwrap_or_else(|| panic!("no plan demand: {v}"))
}

/// Issue 40, item 3: after a pause, traffic that resumes finds the pipeline planned
/// for the demand before the pause (the peak of `scale_down_window_s`), not for an
/// idle stream. Following each measurement (window 0, the paper's rule) re-plans it
/// for `min_demand_qps` while idle: when 40 req/s resumed after 30 s, 64 of the
/// first 120 requests got 504 `early-drop-no-faster-worker`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_does_not_leave_the_pipeline_planned_for_idle() {
    for window in [0.0, 60.0] {
        let (server, addr) = serve_traffic(window).await;
        let before = paced(addr, 3).await;
        assert!(before.get("200").copied().unwrap_or(0) > 0, "{before:?}");
        // Idle: several table rebuilds and re-plans pass.
        tokio::time::sleep(Duration::from_secs(4)).await;
        let idle = planned(addr).await;
        if window == 0.0 {
            // The cause: each measurement, so the idle pipeline is planned for 1 req/s.
            assert!(idle <= 2.0, "window 0: planned for {idle} req/s while idle");
            server.stop().await;
            continue;
        }
        assert!(idle >= 30.0, "planned for {idle} req/s after the pause, before it 40");
        let after = paced(addr, 3).await;
        let sent: u64 = after.values().sum();
        let no_faster = after.get("504 early-drop-no-faster-worker").copied().unwrap_or(0);
        let ok = after.get("200").copied().unwrap_or(0);
        assert!(no_faster * 10 <= sent && ok * 10 >= sent * 8, "after the pause: {after:?} (before it: {before:?})");
        server.stop().await;
    }
}

/// `GET /admin/pipelines/{name}` (the status, its plan view and the plan summaries
/// in it), byte for byte as the views built by hand with `json!` answered it before
/// they became `Serialize` structs (`tests/fixtures/pipeline_status.json`, recorded
/// from that code): key order, `null`s and number formats included. The state is
/// fixed: the startup plan (its solve time 0) and one request on a 60 s demand
/// window, with an SLO no stall of a busy machine reaches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_status_is_the_json_the_hand_built_view_answered() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("profile.toml"), profile()).unwrap();
    let problem = format!(
        "version = 1\nkind = \"loki\"\nprofile = \"profile.toml\"\nbatch_sizes = [1, 2, 4]\nslo_ms = 5000\nworkers = 6\ndemand_qps = 20\n{GRAPH}"
    );
    let path = dir.path().join("problem.toml");
    std::fs::write(&path, problem).unwrap();
    let config = format!(
        "[[pipeline]]\nname = \"p\"\nproblem = \"{}\"\nexecutor = \"emulated\"\ninput = {{ name = \"x\", datatype = \"FP32\", shape = [4] }}\nearly_drop = \"none\"\nreplan_period_s = 0\nrouting_period_ms = 60000\n",
        path.display()
    );
    let server = TestServer::start(&config).await.unwrap();
    let mut c = server.client().await;
    let r = c.post_json("/v2/models/p/infer", &small_infer(1)).await.unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let r = admin(&mut c, "GET", "/admin/pipelines/p", b"").await;
    assert_eq!(r.status, 200);
    let body = String::from_utf8(r.body.to_vec()).unwrap();
    // A task's `late` is against its task budget (a share of the SLO by the plan's
    // latencies, milliseconds here), which a loaded suite can overrun: CI saw the
    // `face` task's one request late. It is checked apart and set to the golden's
    // 0; the rest is compared byte for byte, re-serialised (checked to give the
    // same bytes first).
    let mut view: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(serde_json::to_string(&view).unwrap(), body, "re-serialising keeps the bytes");
    for task in view["tasks"].as_array_mut().expect("tasks") {
        let (late, served) = (task["late"].as_u64().unwrap(), task["served"].as_u64().unwrap());
        assert!(late <= served, "{task}");
        task["late"] = json!(0);
    }
    let golden = include_str!("fixtures/pipeline_status.json").trim_end();
    assert_eq!(serde_json::to_string(&view).unwrap(), golden, "the status view's JSON moved");
    server.stop().await.unwrap();
}
