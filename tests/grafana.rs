//! `deploy/grafana/sluice.json` against a real server's `/metrics`: every metric
//! and every label its queries name exists (with series, after traffic, a swap, a
//! policy fault and an allocator's re-plan; accuracy served, per-worker queues and
//! re-plans among them), and every family follows Prometheus'
//! naming conventions (counters end in `_total`, times are in `_seconds`, the app
//! label is `app` everywhere).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value};
use sluice_e2e::*;

/// Every `expr` in the dashboard: its panels' targets and its annotations.
fn queries(dashboard: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for p in dashboard["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            out.push(t["expr"].as_str().unwrap().to_string());
        }
    }
    for a in dashboard["annotations"]["list"].as_array().unwrap() {
        out.extend(a["expr"].as_str().map(str::to_string));
    }
    for v in dashboard["templating"]["list"].as_array().unwrap() {
        out.extend(v["definition"].as_str().map(str::to_string));
    }
    out
}

/// The metric names (`sluice_...`) and label names (in `{...}` matchers, `by (...)`
/// and `label_values(_, label)`) one PromQL expression uses.
fn names_in(expr: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut metrics = BTreeSet::new();
    let mut labels = BTreeSet::new();
    let ident = |s: &str| s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>();
    for (i, _) in expr.match_indices("sluice_") {
        if i == 0 || !expr.as_bytes()[i - 1].is_ascii_alphanumeric() {
            metrics.insert(ident(&expr[i..]));
        }
    }
    // Matchers: `{name=..., name=~...}`.
    for block in expr.split('{').skip(1) {
        let inner = block.split('}').next().unwrap_or("");
        for m in inner.split(',') {
            let name = ident(m.trim());
            if !name.is_empty() {
                labels.insert(name);
            }
        }
    }
    for key in ["by (", "label_values("] {
        for part in expr.split(key).skip(1) {
            let inner = part.split(')').next().unwrap_or("");
            let names: Vec<&str> = inner.split(',').map(str::trim).collect();
            // label_values(metric, label): only the last is a label.
            let names = if key == "label_values(" { &names[names.len() - 1..] } else { &names[..] };
            labels.extend(names.iter().map(|n| ident(n)).filter(|n| !n.is_empty()));
        }
    }
    (metrics, labels)
}

/// `/metrics` as family → (type, label names seen on its series).
fn families(text: &str) -> BTreeMap<String, (String, BTreeSet<String>)> {
    let mut out: BTreeMap<String, (String, BTreeSet<String>)> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split_whitespace();
            let (name, kind) = (it.next().unwrap().to_string(), it.next().unwrap().to_string());
            out.entry(name).or_default().0 = kind;
        } else if !line.starts_with('#') && !line.is_empty() {
            let name: String = line.chars().take_while(|c| *c != '{' && *c != ' ').collect();
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|f| out.get(*f).is_some_and(|(k, _)| k == "histogram")))
                .unwrap_or(&name)
                .to_string();
            let entry = out.entry(family).or_default();
            // The series exists even without labels: mark it with an empty name.
            entry.1.insert(String::new());
            if let Some(labels) = line.split_once('{').and_then(|(_, r)| r.rsplit_once('}')).map(|(l, _)| l) {
                for kv in labels.split("\",") {
                    if let Some((k, _)) = kv.split_once('=') {
                        entry.1.insert(k.trim().to_string());
                    }
                }
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_and_label_the_grafana_dashboard_queries_exists() {
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("deploy/grafana/sluice.json")).unwrap()).unwrap();
    let server = TestServer::start(&two_apps_on_four_devices()).await.unwrap();
    let mut c = server.client().await;
    // Traffic on both apps, a swap, and a policy fault (misbehave traps; the safe
    // policy answers), so that every family the dashboard reads has series.
    for i in 0..40 {
        for app in ["a", "b"] {
            let r = c.post_json(&format!("/v2/models/{app}/infer"), &small_infer(i)).await.unwrap();
            assert_eq!(r.status, 200, "{}", r.text());
        }
    }
    let wasm = std::fs::read(fixtures_dir().join("misbehave.wasm")).unwrap();
    assert_eq!(upload(&mut c, "misbehave", &wasm).await.status, 201);
    assert_eq!(swap(&mut c, "b", "misbehave", json!({ "mode": "trap" })).await.status, 200);
    for i in 0..5 {
        c.post_json("/v2/models/b/infer", &small_infer(i)).await.unwrap();
    }
    // A re-plan (the first plan, made at start-up, is not a timed solve).
    let r = admin(&mut c, "POST", "/admin/allocation/solve", b"").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let text = c.request("GET", "/metrics", &[], b"").await.unwrap().text();
    let fams = families(&text);

    let mut missing = Vec::new();
    for expr in queries(&dashboard) {
        let (metrics, labels) = names_in(&expr);
        assert!(!metrics.is_empty(), "no sluice metric in `{expr}`");
        let mut seen = BTreeSet::from(["le".to_string()]);
        for m in &metrics {
            // A histogram is queried through its `_bucket`, `_sum` and `_count`.
            let family = ["_bucket", "_sum", "_count"].iter().find_map(|s| m.strip_suffix(s)).unwrap_or(m);
            match fams.get(family).or_else(|| fams.get(m.as_str())) {
                Some((_, l)) if l.contains("") => seen.extend(l.iter().cloned()),
                _ => missing.push(format!("metric {m} (in `{expr}`)")),
            }
        }
        for l in labels.difference(&seen) {
            missing.push(format!("label {l} on {metrics:?} (in `{expr}`)"));
        }
    }
    assert!(missing.is_empty(), "the Grafana dashboard queries what /metrics lacks: {missing:#?}\n{text}");

    // Prometheus' naming conventions, on every family.
    for (name, (kind, labels)) in &fams {
        assert!(name.starts_with("sluice_"), "{name}: not under the sluice_ namespace");
        assert_eq!(
            kind == "counter",
            name.ends_with("_total"),
            "{name} ({kind}): counters, and only they, end in _total"
        );
        for bad in ["_ms", "_us", "milli", "micro", "_count_"] {
            assert!(!name.contains(bad), "{name}: base units only (seconds)");
        }
        for l in labels {
            assert!(
                !["application", "app_name", "model_name", "variant"].contains(&l.as_str()),
                "{name}: label {l}: use app/model"
            );
        }
    }
    assert!(text.contains("sluice_allocator_solve_seconds_count{status="), "no allocator solve series");
    // The dashboard's accuracy served, per-worker queues and re-plans: their series.
    assert!(text.contains("sluice_replans_total{scope=\"allocator\",reason=\"admin\"} 1"), "{text}");
    for app in ["a", "b"] {
        assert!(text.contains(&format!("sluice_worker_queued_requests{{app=\"{app}\",worker=\"0\"}} ")), "{text}");
        assert!(text.contains(&format!("sluice_model_accuracy_ratio{{app=\"{app}\",model=")), "{text}");
    }
    let panels: Vec<&str> =
        dashboard["panels"].as_array().unwrap().iter().filter_map(|p| p["title"].as_str()).collect();
    for title in ["Accuracy served", "Queue per worker", "Re-plans (5 min)"] {
        assert!(panels.contains(&title), "no panel {title}: {panels:?}");
    }
    server.stop().await.unwrap();
}
