//! `sluice sim report`: a tiny experiment is run, written and rendered; the report
//! and the plots exist and name their series.

use std::path::{Path, PathBuf};

#[allow(dead_code)] // the shared fixtures also serve the other simulator tests
mod common;

use sluice_sim::{report, run_experiment, stats::write_outputs};

/// Runs `body` (after the common header) and writes its outputs to `dir/out`.
fn run(dir: &Path, body: &str) -> PathBuf {
    let (e, base) = common::experiment(dir, body);
    let out = run_experiment(&e, &base, false).unwrap();
    let dir = dir.join("out");
    write_outputs(&dir, &out).unwrap();
    dir
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn a_load_sweep_renders_line_charts_and_a_table() {
    let tmp = tempfile::tempdir().unwrap();
    let out = run(
        tmp.path(),
        r#"duration_s = 1
weakly_hard = [1, 5]
[[app]]
name = "img"
slo_ms = 30
workers = 2
profile = "p.toml"
policy = "fixed"
params = { model = "m" }
arrivals = { kind = "poisson", rate_qps = 100 }
[sweep]
load_qps = [50, 150, 300]
seeds = [1, 2]
policies = [{ policy = "fixed", params = { model = "m" }, label = "fixed-m" }, { policy = "jellyfish", label = "jelly, fish" }]
"#,
    );
    let written = report::render(&out, Some("Tiny sweep")).unwrap();
    assert!(written.iter().all(|p| p.exists()));
    for f in ["img-accuracy.svg", "img-violation.svg", "img-mcd.svg", "img-weakly-hard.svg"] {
        let svg = read(&out.join(f));
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{f}");
        assert!(svg.contains("fixed-m") && svg.contains("jelly, fish"), "{f} names both series");
        assert_eq!(svg.matches("<polyline").count(), 2, "{f}: one line per policy");
        assert!(svg.contains(">300<"), "{f}: the x axis reaches the highest load");
    }
    let md = read(&out.join("report.md"));
    assert!(md.starts_with("# Tiny sweep"));
    assert!(md.contains("![") && md.contains("(img-violation.svg)"));
    // Two policies × three loads, two seeds each: six rows.
    assert_eq!(md.lines().filter(|l| l.starts_with("| img |")).count(), 6, "{md}");
    assert!(md.contains("| img | jelly, fish | 2 | 300 | 2 |"), "{md}");
    assert!(md.contains("worst misses in K"));
}

#[test]
fn one_load_per_app_renders_grouped_bars_and_traces_a_timeseries() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("rate.txt"), "0 50\n1 200\n").unwrap();
    let out = run(
        tmp.path(),
        r#"duration_s = 2
window_s = 0.5
[[app]]
name = "uniform"
slo_ms = 30
workers = 1
profile = "p.toml"
policy = "fixed"
params = { model = "m" }
arrivals = { kind = "uniform", rate_qps = 120 }
[[app]]
name = "gamma"
slo_ms = 30
workers = 1
profile = "p.toml"
policy = "fixed"
params = { model = "m" }
arrivals = { kind = "gamma", rate_qps = 120, shape = 0.05 }
[[app]]
name = "trace"
slo_ms = 30
workers = 1
profile = "p.toml"
policy = "fixed"
params = { model = "m" }
arrivals = { kind = "rate-trace", file = "rate.txt" }
[sweep]
policies = [{ policy = "fixed", params = { model = "m" }, label = "A" }, { policy = "jellyfish", label = "B" }]
"#,
    );
    report::render(&out, None).unwrap();
    let bars = read(&out.join("bars-violation.svg"));
    for label in ["uniform @ 120 req/s", "gamma @ 120 req/s", "trace (rate.txt)", ">A<", ">B<"] {
        assert!(bars.contains(label), "bars lack {label}");
    }
    assert!(out.join("bars-accuracy.svg").exists());
    let ts = read(&out.join("trace-timeseries.svg"));
    assert!(ts.contains(">A<") && ts.contains(">B<") && ts.contains("time (s)"));
    let md = read(&out.join("report.md"));
    assert!(md.starts_with("# out"), "the title defaults to the directory name");
    assert_eq!(md.lines().filter(|l| l.starts_with("| ") && !l.starts_with("| app")).count(), 6);
}

#[test]
fn a_missing_directory_is_an_error() {
    let e = report::render(Path::new("/nonexistent/sluice-report"), None).unwrap_err();
    assert!(e.to_string().contains("results.json"), "{e}");
}

/// The HTML report's p50, variant-mix and queue charts hold the simulator's own
/// per-window series (`windows.json`), as the live page's hold the host's.
#[test]
fn the_html_report_carries_p50_the_variant_mix_and_queues_per_window() {
    let tmp = tempfile::tempdir().unwrap();
    // Two variants, so that the mix has two series; slow enough that queues form.
    let two = common::PROFILE.to_string()
        + "\n[[model]]\nname = \"big\"\naccuracy = 0.9\naccuracy_source = \"test\"\nbatch_sizes = [1, 2]\n\
           p50_us = [20000, 24000]\np95_us = [20000, 24000]\np99_us = [20000, 24000]\n";
    std::fs::write(tmp.path().join("two.toml"), two).unwrap();
    let out = run(
        tmp.path(),
        r#"duration_s = 3
window_s = 0.5
[[app]]
name = "img"
slo_ms = 60
workers = 2
profile = "two.toml"
policy = "jellyfish"
arrivals = { kind = "poisson", rate_qps = 150 }
"#,
    );
    let windows: serde_json::Value = serde_json::from_str(&read(&out.join("windows.json"))).unwrap();
    assert_eq!(windows[0]["models"], serde_json::json!(["m", "big"]), "{windows}");
    report::render(&out, None).unwrap();
    let html = read(&out.join("report.html"));
    let block = html.split("id=\"sluice-data\">").nth(1).unwrap().split("</script>").next().unwrap();
    let data: serde_json::Value = serde_json::from_str(block).unwrap();
    let app = &data["runs"][0]["apps"][0];
    assert_eq!(app["models"], serde_json::json!(["m", "big"]), "{app}");
    assert_eq!(app["workers"], serde_json::json!([0, 1]), "one queue per worker: {app}");
    let points = app["points"].as_array().unwrap();
    assert_eq!(points.len(), 6, "six half-second windows: {app}");
    for p in points {
        assert!(p["p50_ms"].as_f64().is_some_and(|x| x >= 10.0), "p50 in every window: {p}");
        let mix: Vec<f64> = p["mix"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        assert_eq!(mix.len(), 2, "{p}");
        // The mix is the served rate split by variant.
        let served = p["served"].as_f64().unwrap();
        assert!((mix.iter().sum::<f64>() - served).abs() < 1e-6, "mix {mix:?} against served {served}");
        assert_eq!(p["queue"].as_array().unwrap().len(), 2, "{p}");
    }
    let queued: f64 = points.iter().flat_map(|p| p["queue"].as_array().unwrap()).map(|q| q.as_f64().unwrap()).sum();
    assert!(queued > 0.0, "requests waited in the queues: {app}");
}
