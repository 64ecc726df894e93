//! What-if evaluation (issue 14): the live host's recorded arrivals replayed with a
//! candidate policy through the simulator (`POST /admin/apps/{app}/evaluate`),
//! wired the way `sluice serve` wires it (`State::set_replayer` with the
//! simulator's `SimReplayer`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice_e2e::*;
use sluice_loadgen::Client;
use sluice_sim::whatif::SimReplayer;

/// One emulated app: 2 workers, SLO 100 ms, `policy` with `params`.
fn config(policy: &str, params: &str) -> String {
    emu_app(
        "emulated",
        &format!("slo_ms = 100\nworkers = 2\nmax_queue = 10000\npolicy = \"{policy}\"\nparams = {params}"),
    )
}

async fn start(config: &str) -> TestServer {
    let server = TestServer::start(config).await.unwrap();
    server.state.set_replayer(Arc::new(SimReplayer));
    server
}

/// Sends `n` requests from `clients` connections; every one must succeed.
async fn load(server: &TestServer, clients: u64, n: u64) {
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..clients {
        let addr = server.addr;
        tasks.spawn(async move {
            let mut client = Client::connect(addr).await.unwrap();
            for i in 0..n / clients {
                let r = client.post_json("/v2/models/emu/infer", &small_infer(c * 1_000_000 + i)).await.unwrap();
                assert_eq!(r.status, 200, "{}", r.text());
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
}

async fn evaluate(c: &mut Client, body: Value) -> sluice_loadgen::HttpResponse {
    admin(c, "POST", "/admin/apps/emu/evaluate", body.to_string().as_bytes()).await
}

/// Polls an evaluation until it is no longer running; its view.
async fn finished(c: &mut Client, id: u64) -> Value {
    let end = Instant::now() + Duration::from_secs(120);
    loop {
        let v = admin(c, "GET", &format!("/admin/evaluations/{id}"), b"").await.json();
        if v["status"] != "running" || Instant::now() > end {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The experiment `sluice sim` runs on the arrival log, with `policy` and `params`
/// (the profile is `dir/emulated.toml`).
fn experiment(dir: &std::path::Path, log: &std::path::Path, policy: &str, params: &str) -> String {
    format!(
        "version = 1\nname = \"replay\"\nduration_s = 3600\nbuiltin_policy_dir = \"{}\"\n[[app]]\nname = \"emu\"\nslo_ms = 100\nworkers = 2\nmax_queue = 10000\nprofile = \"{}/emulated.toml\"\npolicy = \"{policy}\"\nparams = {params}\narrivals = {{ kind = \"recorded\", file = \"{}\" }}\n",
        policies_dir().display(),
        dir.display(),
        log.display()
    )
}

fn sim(text: &str) -> sluice_sim::stats::RunResult {
    let e = sluice_sim::Experiment::parse(text, "replay.toml", std::path::Path::new("")).unwrap();
    let out = sluice_sim::run_experiment(&e, std::path::Path::new(""), false).unwrap();
    out.results.into_iter().next().unwrap()
}

fn assert_same(side: &Value, r: &sluice_sim::stats::RunResult) {
    assert_eq!(side["requests"], r.requests, "{side}");
    assert_eq!(side["served"], r.served, "{side}");
    assert_eq!(side["on_time"], r.on_time, "{side}");
    assert_eq!(side["dropped"], r.dropped, "{side}");
    assert_eq!(side["accuracy"].as_f64().unwrap(), r.accuracy, "{side}");
    assert_eq!(side["violation_rate"].as_f64().unwrap(), r.violation_rate, "{side}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_window_gives_what_sluice_sim_gives_on_the_recorded_file() {
    let server = start(&config("jellyfish", "{}")).await;
    // Outlives the server: the log, and the profile the offline runs read.
    let mine = tempfile::tempdir().unwrap();
    std::fs::write(mine.path().join("emulated.toml"), emulated_profile(1.0)).unwrap();
    let log = mine.path().join("arrivals.csv");
    server.state.record_arrivals(&log).unwrap();
    load(&server, 4, 400).await;
    let mut c = server.client().await;

    // The admin view shows the ring and what it holds.
    let status = app_status(&mut c, "emu").await;
    assert_eq!(status["arrival_ring"]["held"], 400, "{status}");
    assert_eq!(status["arrival_ring"]["capacity"], 2_000_000, "{status}");
    assert!(status["arrival_ring"]["bytes"].as_u64().unwrap() >= 400 * 8, "{status}");

    let candidate = r#"{ model = "small" }"#;
    let r = evaluate(&mut c, json!({ "policy": "fixed", "params": { "model": "small" }, "window_s": 600 })).await;
    assert_eq!(r.status, 202, "{}", r.text());
    let id = r.json()["id"].as_u64().unwrap();
    let v = finished(&mut c, id).await;
    assert_eq!(v["status"], "done", "{v}");
    assert_eq!(v["requests"], 400, "{v}");
    assert_eq!(v["progress"], 1.0, "{v}");
    let result = &v["result"];
    assert_eq!(result["current"]["policy"], "jellyfish", "{v}");
    assert!(result["candidate"]["series"].as_array().is_some_and(|s| !s.is_empty()), "{v}");
    let gain = result["candidate"]["accuracy"].as_f64().unwrap() - result["current"]["accuracy"].as_f64().unwrap();
    assert!((result["difference"]["accuracy"].as_f64().unwrap() - gain).abs() < 1e-12, "{v}");
    let live = v.clone();

    // The log is flushed when the server drains.
    server.stop().await.unwrap();
    let jelly = sim(&experiment(mine.path(), &log, "jellyfish", "{}"));
    let fixed = sim(&experiment(mine.path(), &log, "fixed", candidate));
    assert_eq!(jelly.requests, 400);
    assert_same(&live["result"]["current"], &jelly);
    assert_same(&live["result"]["candidate"], &fixed);

    // `sluice evaluate` offline on the same log and config gives the same comparison.
    let config_text = format!(
        "admin_token = \"t\"\nbuiltin_policy_dir = \"{}\"\n{}",
        policies_dir().display(),
        config("jellyfish", "{}").replace("{dir}", &mine.path().display().to_string())
    );
    let cfg = sluice_server::config::Config::parse(&config_text, "offline.toml", mine.path()).unwrap();
    let (app, offline) = sluice_sim::whatif::offline(&sluice_sim::whatif::Offline {
        apps: &cfg.apps,
        app: None,
        recorded: &log,
        window_s: None,
        candidate: "fixed",
        params: Some(r#"{"model":"small"}"#.into()),
        builtin_dir: &policies_dir(),
        series_window_s: 60.0,
        parallel: true,
    })
    .unwrap();
    assert_eq!(app, "emu");
    // Through JSON text as the live result came: serde_json's default float parsing
    // may land one ULP off, the same way for the same text.
    let offline: Value = serde_json::from_str(&serde_json::to_string(&offline).unwrap()).unwrap();
    assert_eq!(offline, live["result"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worse_candidate_is_not_promoted_and_a_better_one_is() {
    let server = start(&config("fixed", r#"{ model = "medium" }"#)).await;
    load(&server, 2, 200).await;
    let mut c = server.client().await;
    let rule = json!({ "accuracy_gain_min": 0.01, "violation_max": 0.5 });

    let r = evaluate(&mut c, json!({ "policy": "fixed", "params": { "model": "small" }, "promote_if": rule })).await;
    assert_eq!(r.status, 202, "{}", r.text());
    let v = finished(&mut c, r.json()["id"].as_u64().unwrap()).await;
    assert_eq!(v["status"], "done", "{v}");
    assert_eq!(v["promotion"]["promoted"], false, "{v}");
    assert!(v["promotion"]["reason"].as_str().unwrap().contains("accuracy gain too small"), "{v}");
    assert!(v["result"]["difference"]["accuracy"].as_f64().unwrap() < 0.0, "{v}");
    let status = app_status(&mut c, "emu").await;
    assert_eq!(status["params"]["model"], "medium", "the worse candidate must not serve: {status}");
    assert_eq!(status["generation"], 1, "{status}");

    let r = evaluate(&mut c, json!({ "policy": "fixed", "params": { "model": "large" }, "promote_if": rule })).await;
    assert_eq!(r.status, 202, "{}", r.text());
    let v = finished(&mut c, r.json()["id"].as_u64().unwrap()).await;
    assert_eq!(v["promotion"]["promoted"], true, "{v}");
    assert!(v["promotion"]["reason"].as_str().unwrap().starts_with("promoted"), "{v}");
    assert_eq!(v["promotion"]["swap"]["generation"], 2, "{v}");
    let status = app_status(&mut c, "emu").await;
    assert_eq!(status["params"]["model"], "large", "{status}");
    // Requests after the promotion are served by the candidate.
    let r = c.post_json("/v2/models/emu/infer", &small_infer(7)).await.unwrap();
    assert_eq!(r.json()["model_version"], "large", "{}", r.text());

    let list = admin(&mut c, "GET", "/admin/evaluations", b"").await.json();
    assert_eq!(list["evaluations"].as_array().unwrap().len(), 2, "{list}");
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_evaluation_at_a_time_per_app_and_a_cancel_stops_it() {
    let server = start(&config("jellyfish", "{}")).await;
    // Ten minutes at 2,000 req/s, written straight into the ring: a replay of
    // seconds, long enough to be running when the next calls arrive.
    let ring = server.state.apps["emu"].ring.get().unwrap();
    for i in 0..1_200_000u64 {
        ring.record(i * 500);
    }
    let mut c = server.client().await;
    let r = evaluate(&mut c, json!({ "policy": "fixed", "params": { "model": "small" } })).await;
    assert_eq!(r.status, 202, "{}", r.text());
    let id = r.json()["id"].as_u64().unwrap();
    assert_eq!(r.json()["requests"], 1_200_000);

    let second = evaluate(&mut c, json!({ "policy": "fixed", "params": { "model": "large" } })).await;
    assert_eq!(second.status, 409, "{}", second.text());
    assert_eq!(second.json()["running"], id, "{}", second.text());

    let d = admin(&mut c, "DELETE", &format!("/admin/evaluations/{id}"), b"").await;
    assert_eq!(d.status, 202, "{}", d.text());
    let v = finished(&mut c, id).await;
    assert_eq!(v["status"], "cancelled", "{v}");
    assert!(v["result"].is_null(), "{v}");

    // The app's slot is free again; a finished evaluation can be forgotten.
    let r = evaluate(&mut c, json!({ "policy": "fixed", "params": { "model": "small" }, "window_s": 1 })).await;
    assert_eq!(r.status, 202, "{}", r.text());
    let id2 = r.json()["id"].as_u64().unwrap();
    assert_eq!(finished(&mut c, id2).await["status"], "done");
    assert_eq!(admin(&mut c, "DELETE", &format!("/admin/evaluations/{id2}"), b"").await.status, 200);
    assert_eq!(admin(&mut c, "GET", &format!("/admin/evaluations/{id2}"), b"").await.status, 404);
    server.stop().await.unwrap();
}

/// Issue 40, item 1: a candidate that loops in every `decide` is cancelled at once.
/// Each call used to have a one-second budget and the cancel was looked at every
/// 4,096 events, so a cancel took about 68 minutes and the app's slot stayed taken
/// (409) until a restart. Now each call has the live budget (10 ms, on the thread's
/// CPU clock), the cancel is looked at before every event and stops a call in
/// progress.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_looping_candidate_is_cancelled_at_once() {
    let server = start(&config("jellyfish", "{}")).await;
    let ring = server.state.apps["emu"].ring.get().unwrap();
    for i in 0..200_000u64 {
        ring.record(i * 500);
    }
    let mut c = server.client().await;
    let bytes = std::fs::read(fixtures_dir().join("misbehave.wasm")).unwrap();
    assert_eq!(upload(&mut c, "looper", &bytes).await.status, 201);
    let r = evaluate(&mut c, json!({ "policy": "looper", "params": { "mode": "loop" } })).await;
    assert_eq!(r.status, 202, "{}", r.text());
    let id = r.json()["id"].as_u64().unwrap();
    // Into its looping decisions.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(admin(&mut c, "GET", &format!("/admin/evaluations/{id}"), b"").await.json()["status"], "running");
    let cancelled = Instant::now();
    let d = admin(&mut c, "DELETE", &format!("/admin/evaluations/{id}"), b"").await;
    assert_eq!(d.status, 202, "{}", d.text());
    let v = finished(&mut c, id).await;
    assert_eq!(v["status"], "cancelled", "{v}");
    // Seconds at most on a loaded machine (a tick without load), against an hour.
    assert!(cancelled.elapsed() < Duration::from_secs(30), "{:?}", cancelled.elapsed());
    let r = evaluate(&mut c, json!({ "policy": "fixed", "params": { "model": "small" }, "window_s": 1 })).await;
    assert_eq!(r.status, 202, "the app's slot is free again: {}", r.text());
    assert_eq!(finished(&mut c, r.json()["id"].as_u64().unwrap()).await["status"], "done");
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_evaluations_are_refused_with_the_reason() {
    let server = TestServer::start(&config("jellyfish", "{}")).await.unwrap();
    let mut c = server.client().await;
    // No replayer given: the host cannot evaluate.
    let r = evaluate(&mut c, json!({ "policy": "fixed" })).await;
    assert_eq!(r.status, 501, "{}", r.text());
    server.state.set_replayer(Arc::new(SimReplayer));
    // Nothing recorded yet.
    let r = evaluate(&mut c, json!({ "policy": "fixed", "params": { "model": "small" } })).await;
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(r.text().contains("no arrivals recorded"), "{}", r.text());
    for (body, status, says) in [
        (json!({ "policy": "fixed", "window_s": 0 }), 400, "window_s"),
        (json!({ "policy": "fixed", "params": [1] }), 400, "params must be a JSON object"),
        (json!({ "policy": "nope" }), 404, "nope"),
        (json!({ "policy": "fixed", "against": "yesterday" }), 400, "against"),
        (
            json!({ "policy": "fixed", "promote_if": { "accuracy_gain_min": 0.01, "violation_max": 3 } }),
            400,
            "violation_max",
        ),
        (
            json!({ "policy": "fixed", "against": { "policy": "jellyfish" }, "promote_if": { "accuracy_gain_min": 0, "violation_max": 0.1 } }),
            400,
            "promote_if",
        ),
        (json!({ "policy": "fixed", "colour": "blue" }), 400, "colour"),
    ] {
        let r = evaluate(&mut c, body.clone()).await;
        assert_eq!(r.status, status, "{body}: {}", r.text());
        assert!(r.text().contains(says), "{body}: {}", r.text());
    }
    let r = admin(&mut c, "POST", "/admin/apps/nope/evaluate", br#"{"policy": "fixed"}"#).await;
    assert_eq!(r.status, 404, "{}", r.text());
    let r = admin(&mut c, "GET", "/admin/evaluations/99", b"").await;
    assert_eq!(r.status, 404, "{}", r.text());
    server.stop().await.unwrap();
}

/// Evaluation while serving: every request is still answered, once and 200. The
/// latency cost is measured by the `whatif` bench (timings are not asserted here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serving_goes_on_while_an_evaluation_runs() {
    let server = start(&config("jellyfish", "{}")).await;
    let ring = server.state.apps["emu"].ring.get().unwrap();
    for i in 0..300_000u64 {
        ring.record(i * 2_000);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = tokio::task::JoinSet::new();
    for k in 0..3u64 {
        let (addr, stop) = (server.addr, stop.clone());
        clients.spawn(async move {
            let mut client = Client::connect(addr).await.unwrap();
            let mut answered = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let r = client.post_json("/v2/models/emu/infer", &small_infer(k * 1_000_000 + answered)).await.unwrap();
                assert_eq!(r.status, 200, "{}", r.text());
                answered += 1;
            }
            answered
        });
    }
    let mut c = server.client().await;
    let r = evaluate(&mut c, json!({ "policy": "fixed", "params": { "model": "small" } })).await;
    assert_eq!(r.status, 202, "{}", r.text());
    let v = finished(&mut c, r.json()["id"].as_u64().unwrap()).await;
    assert_eq!(v["status"], "done", "{v}");
    stop.store(true, Ordering::Relaxed);
    let mut answered = 0;
    while let Some(n) = clients.join_next().await {
        answered += n.unwrap();
    }
    assert!(answered > 0);
    let status = app_status(&mut c, "emu").await;
    assert_eq!(status["counters"]["served"], status["counters"]["accepted"], "{status}");
    server.stop().await.unwrap();
}

/// A replay split by worker across threads gives exactly what one thread gives: with
/// round-robin and weighted routing (split), with shortest-queue routing (never
/// split: the router looks at the queues), and with a policy whose instances share
/// work through the store while deciding (RAMSIS growing its grid online: the split
/// run is detected and replayed again on one thread). A replay admits as the host
/// does, and admission's margins are the app's (learned from every worker), so only
/// an app whose admission refuses nothing splits: `admission_audit = 1` here.
#[test]
fn a_split_replay_gives_the_results_of_one_thread() {
    use sluice_core::whatif::{PolicyUnderTest, ReplayControl, ReplayJob, Replayer};
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("emulated.toml"), emulated_profile(1.0)).unwrap();
    let mut cache = sluice_sim::PolicyCache::new(policies_dir(), dir.path().to_path_buf()).unwrap();
    // 20 s of Poisson arrivals near the 6 workers' capacity, so queues form.
    let mut rng = sluice_sim::rng::Rng::new(3);
    let spec = sluice_core::workload::ArrivalSpec::Poisson { rate_qps: 400.0 };
    let arrivals: Vec<u64> = sluice_sim::arrivals::draw(&spec, "emu", dir.path(), 20_000_000, &mut rng)
        .unwrap()
        .into_iter()
        .map(|a| a.at)
        .collect();
    let arrivals = Arc::new(arrivals);
    let cases = [
        ("router = \"round-robin\"", "jellyfish", "{}", true),
        ("router = \"weighted\"\nweights = [3, 1, 1, 2, 1, 1]", "jellyfish", "{}", true),
        ("router = \"shortest-queue\"", "jellyfish", "{}", false),
        ("router = \"round-robin\"", "ramsis", r#"{"max_queue": 8, "discretization": "fld:20", "sweeps": 20}"#, true),
    ];
    for (router, policy, params, splits) in cases {
        let text = format!(
            "version = 1\nname = \"split\"\nduration_s = 20\n[[app]]\nname = \"emu\"\nslo_ms = 100\nworkers = 6\nmax_queue = 10000\nprofile = \"{}/emulated.toml\"\nadmission_audit = 1\npolicy = \"{policy}\"\n{router}\narrivals = {{ kind = \"poisson\", rate_qps = 400 }}\n",
            dir.path().display()
        );
        let e = sluice_sim::Experiment::parse(&text, "split.toml", dir.path()).unwrap();
        let job = ReplayJob {
            app: e.apps[0].clone(),
            loaded: None,
            duration_us: arrivals.last().copied().unwrap() + 1,
            arrivals_us: arrivals.clone(),
            series_window_us: 5_000_000,
            engine: cache.engine().clone(),
            policy: PolicyUnderTest {
                name: policy.into(),
                compiled: Some(cache.get(policy).unwrap()),
                params: params.into(),
            },
        };
        let replayer = SimReplayer;
        assert_eq!(replayer.splits(&job), splits, "{router}");
        let run = |threads| {
            let r = replayer.replay(&job, &ReplayControl::default(), threads).unwrap();
            serde_json::to_value(r).unwrap()
        };
        let one = run(1);
        assert!(one["served"].as_u64().unwrap() > 7_000, "{one}");
        for threads in [2, 3, 6] {
            assert_eq!(run(threads), one, "{router}, {policy}: {threads} threads");
        }
    }
}
