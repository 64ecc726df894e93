//! The operator's dashboard in a real browser (headless Chromium through
//! chromedriver, `webdriver.rs`): the page against a server under load and a hot
//! swap (charts hold data, the swap marker within 2 s, the page's numbers equal
//! the admin JSON's, no console error, a screenshot kept under
//! `target/test-artifacts/`), a policy whose `status` is markup (shown as text,
//! nothing runs), the allocator's devices × variants, what-if evaluations started
//! and promoted from the page's form and button (the page's verdict is the API's),
//! the cluster card (a frontend's view, shown as text, only in a cluster), and the
//! page's headers, token and weight without a browser.

mod webdriver;

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice_e2e::*;
use webdriver::Browser;

/// What the XSS test's policy answers from `status` (the issue's own string).
const XSS: &str = "<img src=x onerror=alert(1)>";

fn config() -> String {
    emu_app("emulated", "slo_ms = 100\nworkers = 2\nmax_queue = 10000\npolicy = \"jellyfish\"")
}

/// Clients sending back to back to `emu` until `stop`.
fn load(addr: std::net::SocketAddr, clients: u64, stop: Arc<AtomicBool>) -> tokio::task::JoinSet<()> {
    let mut set = tokio::task::JoinSet::new();
    for c in 0..clients {
        let stop = stop.clone();
        set.spawn(async move {
            let mut client = sluice_loadgen::Client::connect(addr).await.unwrap();
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                client.post_json("/v2/models/emu/infer", &small_infer(c * 1_000_000 + i)).await.unwrap();
                i += 1;
            }
        });
    }
    set
}

/// Opens the page and signs in through its form.
async fn sign_in(b: &mut Browser, server: &TestServer) {
    b.goto(&format!("http://{}/dashboard", server.addr)).await.unwrap();
    b.type_into("#token", TOKEN).await.unwrap();
    b.click("#login button[type=submit]").await.unwrap();
    assert!(
        b.until(Duration::from_secs(10), "return document.body.dataset.polls >= 2").await.unwrap(),
        "the page never showed the host's data"
    );
}

/// Console entries at warning level or above (none is expected: a CSP refusal,
/// a failed request or a script error all land there).
async fn console_errors(b: &mut Browser) -> Vec<Value> {
    b.console().await.unwrap().into_iter().filter(|e| e["level"] == "SEVERE" || e["level"] == "WARNING").collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_under_load_and_swap_matches_the_admin_api() {
    let server = TestServer::start(&config()).await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = load(server.addr, 4, stop.clone());
    let mut b = Browser::start().await.unwrap();
    sign_in(&mut b, &server).await;

    // 1. The charts hold data: every chart of the app has points.
    let charts = "[...document.querySelectorAll('[data-app=\"emu\"] [data-chart]')]";
    assert!(
        b.until(
            Duration::from_secs(10),
            &format!("return {charts}.length === 6 && {charts}.every(c => +c.dataset.points >= 3)")
        )
        .await
        .unwrap(),
        "charts without data: {}",
        b.exec(&format!("return {charts}.map(c => [c.dataset.chart, c.dataset.points])")).await.unwrap()
    );
    let served = b.exec("return +document.querySelector('[data-app=\"emu\"] [data-field=served]').textContent").await;
    assert!(served.unwrap().as_u64().unwrap_or(0) > 0, "the page shows no served request under load");

    // 2. A swap's marker is on every chart within 2 s of the swap's answer.
    let mut admin_client = server.client().await;
    let r = swap(&mut admin_client, "emu", "fixed", json!({ "model": "large" })).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let swapped = Instant::now();
    let marked = b
        .until(
            Duration::from_secs(2),
            &format!(
                "return {charts}.every(c => +c.dataset.markers >= 1) && !!document.querySelector('[data-app=\"emu\"] li[data-kind=swap]')"
            ),
        )
        .await
        .unwrap();
    let after = swapped.elapsed();
    assert!(marked && after <= Duration::from_secs(2), "no swap marker {after:?} after the swap");

    // Post-swap traffic on the charts, then the screenshot (kept for the README too).
    let points = b.exec(&format!("return +{charts}[0].dataset.points")).await.unwrap().as_u64().unwrap();
    assert!(b
        .until(Duration::from_secs(5), &format!("return +{charts}[0].dataset.points >= {}", points + 4))
        .await
        .unwrap());
    let shot = root().join("target/test-artifacts/dashboard.png");
    b.screenshot(&shot).await.unwrap();
    assert!(std::fs::metadata(&shot).unwrap().len() > 10_000, "screenshot {} is too small", shot.display());

    // 3. Once the load stops, the page's numbers are the admin JSON's.
    stop.store(true, Ordering::Relaxed);
    while let Some(r) = clients.join_next().await {
        r.unwrap();
    }
    // Quiet: nothing queued and the counters unchanged between two reads.
    let mut quiet = Value::Null;
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let now = app_status(&mut admin_client, "emu").await;
        let done = now["queued"] == 0 && now["counters"] == quiet["counters"];
        quiet = now;
        if done {
            break;
        }
        assert!(Instant::now() < end, "the app never went quiet: {quiet}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let fields = ["accepted", "served", "late", "dropped", "rejected", "faults", "swaps"];
    let page_numbers = format!(
        "const q = k => document.querySelector('[data-app=\"emu\"] [data-field=' + k + ']').textContent; return {{ {} , policy: q('policy'), digest: q('digest'), generation: q('generation') }}",
        fields.iter().map(|k| format!("{k}: q('{k}')")).collect::<Vec<_>>().join(", ")
    );
    let expected: Value = {
        let mut m = serde_json::Map::new();
        for k in fields {
            m.insert(k.into(), json!(quiet["counters"][k].to_string()));
        }
        m.insert("policy".into(), json!(quiet["policy"].as_str().unwrap()));
        m.insert("digest".into(), json!(quiet["digest"].as_str().unwrap()));
        m.insert("generation".into(), json!(quiet["generation"].to_string()));
        Value::Object(m)
    };
    let mut shown = Value::Null;
    let end = Instant::now() + Duration::from_secs(3);
    while Instant::now() < end {
        shown = b.exec(&page_numbers).await.unwrap();
        if shown == expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(shown, expected, "the page's numbers against GET /admin/apps/emu");
    assert_eq!(expected["policy"], "fixed");

    // 4. Nothing left the host, and the console is clean.
    let foreign = b
        .exec(&format!(
            "return performance.getEntriesByType('resource').map(e => e.name).filter(n => !n.startsWith('http://{}/'))",
            server.addr
        ))
        .await
        .unwrap();
    assert_eq!(foreign, json!([]), "requests to another origin");
    let errors = console_errors(&mut b).await;
    assert!(errors.is_empty(), "console: {errors:?}");
    b.close().await.unwrap();
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_status_of_markup_is_shown_as_text_and_nothing_runs() {
    let server = TestServer::start(&config()).await.unwrap();
    let mut c = server.client().await;
    let wasm = std::fs::read(fixtures_dir().join("misbehave.wasm")).unwrap();
    assert_eq!(upload(&mut c, "misbehave", &wasm).await.status, 201);
    // The markup in the policy's status and in its params.
    let r = swap(&mut c, "emu", "misbehave", json!({ "status": XSS })).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // A worker's instance starts on its first decision: send some traffic.
    for r in burst(server.addr, 8).await {
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert_eq!(app_status(&mut c, "emu").await["workers"][0]["policy_status"], json!(XSS));

    let mut b = Browser::start().await.unwrap();
    sign_in(&mut b, &server).await;
    let status = "document.querySelector('[data-app=\"emu\"] [data-field=policy_status]').textContent";
    assert!(
        b.until(Duration::from_secs(5), &format!("return {status}.includes({})", json!(XSS))).await.unwrap(),
        "the status is not shown as its text: {}",
        b.exec(&format!("return {status}")).await.unwrap()
    );
    // A few more polls re-render it; still no element was made from it.
    let polls = b.exec("return +document.body.dataset.polls").await.unwrap().as_u64().unwrap();
    assert!(b
        .until(Duration::from_secs(5), &format!("return +document.body.dataset.polls >= {}", polls + 3))
        .await
        .unwrap());
    assert_eq!(b.alert().await.unwrap(), None, "an alert ran");
    assert_eq!(b.exec("return document.querySelectorAll('img').length").await.unwrap(), json!(0));
    let params = "document.querySelector('[data-app=\"emu\"] [data-field=params]').textContent";
    assert_eq!(b.exec(&format!("return {params}.includes({})", json!(XSS))).await.unwrap(), json!(true));
    let errors = console_errors(&mut b).await;
    assert!(errors.is_empty(), "console: {errors:?}");
    b.close().await.unwrap();
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn page_headers_token_and_weight() {
    let server = TestServer::start(&config()).await.unwrap();
    let mut c = server.client().await;
    // The page and its files: a strict CSP, no outside origin, no inline script.
    let page = c.request("GET", "/dashboard", &[], b"").await.unwrap();
    assert_eq!(page.status, 200);
    let csp = page.header("content-security-policy").unwrap().to_string();
    assert!(csp.contains("script-src 'self'") && !csp.contains("unsafe-inline") && !csp.contains("http"), "{csp}");
    assert!(!page.text().contains("<script>"), "inline script in the page");
    assert_eq!(c.request("GET", "/dashboard/nope.js", &[], b"").await.unwrap().status, 404);
    // The data is behind the token.
    let anonymous = c.request("GET", "/admin/dashboard", &[], b"").await.unwrap();
    assert_eq!(anonymous.status, 401);
    let snap = admin(&mut c, "GET", "/admin/dashboard", b"").await;
    assert_eq!(snap.status, 200);
    let snap = snap.json();
    assert_eq!(snap["apps"][0]["app"], "emu");
    assert!(snap["apps"][0]["latency_buckets"]["counts"].is_array());
    // Page weight, gzip-compressed as a browser would take it: at most 300 KB.
    let mut total = 0;
    for asset in ["", "/uPlot.min.css", "/dashboard.css", "/uPlot.iife.min.js", "/charts.js", "/dashboard.js"] {
        let r = c.request("GET", &format!("/dashboard{asset}"), &[], b"").await.unwrap();
        assert_eq!(r.status, 200, "{asset}");
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&r.body).unwrap();
        total += gz.finish().unwrap().len();
    }
    println!("dashboard page weight: {total} bytes gzip-compressed");
    assert!(total <= 300 * 1024, "page weight {total} bytes compressed");
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocator_panel_and_evaluations_started_and_promoted_from_the_page() {
    let server = TestServer::start(&two_apps_on_four_devices()).await.unwrap();
    let mut c = server.client().await;
    let mut b = Browser::start().await.unwrap();
    sign_in(&mut b, &server).await;

    // The allocator: one row per device, as GET /admin/allocation plans them.
    let alloc = admin(&mut c, "GET", "/admin/allocation", b"").await.json();
    let devices = alloc["allocation"]["plan"]["devices"].as_array().unwrap().len();
    let rows = "document.querySelectorAll('#allocation table')[1].querySelectorAll('tr').length - 1";
    assert_eq!(b.exec(&format!("return {rows}")).await.unwrap(), json!(devices), "devices × variants table");

    // A replay does not model devices (the API refuses, the page says why): the
    // evaluations run on a plain app, on a second server.
    // Leave the page first: its next poll would find the server gone.
    b.goto("about:blank").await.unwrap();
    let errors = console_errors(&mut b).await;
    assert!(errors.is_empty(), "console: {errors:?}");
    server.stop().await.unwrap();
    let server = TestServer::start(&config()).await.unwrap();
    server.state.set_replayer(Arc::new(sluice_sim::whatif::SimReplayer));
    let mut c = server.client().await;
    for i in 0..200 {
        let r = c.post_json("/v2/models/emu/infer", &small_infer(i)).await.unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    sign_in(&mut b, &server).await;

    // Start an evaluation from the form, then promote it with the button.
    b.type_into("#eval-policy", "fixed").await.unwrap();
    b.exec("document.getElementById('eval-params').value = '{\"model\": \"small\"}'").await.unwrap();
    b.click("#evaluate button[type=submit]").await.unwrap();
    let done = |id: u64| {
        format!("return !!document.querySelector('[data-evaluation=\"{id}\"]') && document.querySelector('[data-evaluation=\"{id}\"] h3').textContent.includes(': done')")
    };
    if !b.until(Duration::from_secs(60), &done(1)).await.unwrap() {
        let error = b.exec("return document.getElementById('eval-error').textContent").await.unwrap();
        let cards = b.exec("return document.getElementById('evaluations').textContent").await.unwrap();
        let list = admin(&mut c, "GET", "/admin/evaluations", b"").await.text();
        panic!("evaluation 1 never showed as done: form {error}, page {cards}, API {list}");
    }
    let first = admin(&mut c, "GET", "/admin/evaluations/1", b"").await.json();
    assert_eq!(first["request"]["policy"], "fixed");
    assert_eq!(first["app"], "emu");
    b.click("[data-evaluation=\"1\"] button").await.unwrap();
    assert!(b.until(Duration::from_secs(60), &done(2)).await.unwrap(), "evaluation 2 (promotion) never showed as done");
    let second = admin(&mut c, "GET", "/admin/evaluations/2", b"").await.json();
    assert!(second["request"]["promote_if"].is_object(), "the button asks the API's rule: {second}");
    let reason = second["promotion"]["reason"].as_str().unwrap().to_string();
    let shown = b.exec("return document.querySelector('[data-evaluation=\"2\"] .verdict-promote, [data-evaluation=\"2\"] .verdict-keep').textContent").await.unwrap();
    assert_eq!(shown, json!(reason), "the page's verdict is the API's");
    // Promoted or not, the app's policy is what the API says it is.
    let promoted = second["promotion"]["promoted"].as_bool().unwrap();
    assert_eq!(app_status(&mut c, "emu").await["policy"] == "fixed", promoted);
    let errors = console_errors(&mut b).await;
    assert!(errors.is_empty(), "console: {errors:?}");
    b.close().await.unwrap();
    server.stop().await.unwrap();
}

/// A frontend's view as `sluice_cluster::frontend` builds it (its shape; the
/// values checked against a real cluster in host/cli/tests/cluster.rs), with
/// markup where a config or an agent names something.
fn cluster_view() -> Value {
    json!({
        "role": "frontend", "id": "f1", "leader": "alloc1", "routing_epoch": 3,
        "store": { "reachable": true, "revision": 42 },
        "frontends": [{ "id": "f1", "addr": "127.0.0.1:8000", "routing_epoch": 3, "this": true }],
        "agents": [
            { "id": "a1", "addr": "http://127.0.0.1:9001", "health": "ready", "accepting": true, "ready_epoch": 3,
              "devices": [
                { "index": 0, "kind": "cpu", "loaded": [{ "app": "img", "variant": "small" }],
                  "routes": [{ "app": "img", "variant": "small", "share": 0.75 }] },
                { "index": 1, "kind": "cpu", "loaded": [], "routes": [] }] },
            { "id": XSS, "addr": "http://127.0.0.1:9002", "health": "draining", "accepting": false, "ready_epoch": 2,
              "devices": [{ "index": 0, "kind": "cpu", "loaded": [], "routes": [] }] },
            { "id": "a3", "addr": null, "health": "gone", "accepting": false, "ready_epoch": null, "devices": [] }],
        "routing": { "epoch": 3, "apps": {} },
        "swaps": 3, "agent_removals": 1, "retried": 0,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_card_shows_a_frontends_view_as_text_and_only_in_a_cluster() {
    // Standalone: no cluster card, the host's role in the host table.
    let server = TestServer::start(&config()).await.unwrap();
    let mut b = Browser::start().await.unwrap();
    sign_in(&mut b, &server).await;
    assert_eq!(b.exec("return document.getElementById('cluster-section').hidden").await.unwrap(), json!(true));
    let host = b.exec("return document.getElementById('host').textContent").await.unwrap();
    assert!(host.as_str().unwrap().contains("standalone"), "{host}");
    b.goto("about:blank").await.unwrap();
    server.stop().await.unwrap();

    // A frontend's view: the card, its roles and devices, as text.
    let server = TestServer::start(&config()).await.unwrap();
    assert!(server.state.cluster_view.set(Box::new(cluster_view)).is_ok());
    let mut c = server.client().await;
    assert_eq!(admin(&mut c, "GET", "/admin/dashboard", b"").await.json()["cluster"], cluster_view());
    sign_in(&mut b, &server).await;
    assert!(
        b.until(Duration::from_secs(5), "return !document.getElementById('cluster-section').hidden").await.unwrap(),
        "no cluster card"
    );
    let field = |k: &str| format!("return document.querySelector('[data-cluster={k}]').textContent");
    assert_eq!(b.exec(&field("leader")).await.unwrap(), json!("alloc1"));
    assert_eq!(b.exec(&field("epoch")).await.unwrap(), json!("3"));
    assert_eq!(b.exec(&field("self")).await.unwrap(), json!("frontend f1"));
    let rows = |t: &str| {
        format!(
            "return [...document.querySelectorAll('table[data-cluster={t}] tr')].slice(1).map(r => [...r.children].map(td => td.textContent))"
        )
    };
    let roles = b.exec(&rows("roles")).await.unwrap();
    assert_eq!(roles[0], json!(["allocator", "alloc1", "-", "leader"]), "{roles}");
    assert_eq!(roles[1], json!(["frontend", "f1", "127.0.0.1:8000", "routing epoch 3 (this one)"]), "{roles}");
    assert_eq!(roles[2], json!(["agent", "a1", "http://127.0.0.1:9001", "ready, ready epoch 3"]), "{roles}");
    assert_eq!(roles[3][1], json!(XSS), "an agent's id is shown as its text: {roles}");
    assert_eq!(roles[4], json!(["agent", "a3", "-", "gone, not accepting, ready epoch -"]), "{roles}");
    let devices = b.exec(&rows("devices")).await.unwrap();
    assert_eq!(devices[0], json!(["a1", "0", "cpu", "img small", "img small 75 %"]), "{devices}");
    assert_eq!(devices[1], json!(["a1", "1", "cpu", "-", "-"]), "{devices}");
    assert_eq!(devices.as_array().unwrap().len(), 4, "{devices}");
    // The markup made no element and ran nothing.
    assert_eq!(b.alert().await.unwrap(), None, "an alert ran");
    assert_eq!(b.exec("return document.querySelectorAll('img').length").await.unwrap(), json!(0));
    let errors = console_errors(&mut b).await;
    assert!(errors.is_empty(), "console: {errors:?}");
    b.close().await.unwrap();
    server.stop().await.unwrap();
}
