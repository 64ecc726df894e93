//! `sluice sim report <dir>`: renders the results of a `sluice sim --out <dir>` run
//! into `report.md` (a markdown table, one row per (app, policy, workers, load or
//! trace), averaged over seeds) and hand-written SVG plots in the same directory:
//!
//! - a load sweep (an app with several `load_qps`): accuracy, violation rate, maximum
//!   consecutive drops (MCD) and, when checked, the worst misses in any K consecutive
//!   requests vs load, one line per policy (RAMSIS Fig. 6, spread-drop Figs. 3–5);
//! - otherwise: grouped bars of the violation rate and accuracy, one group per app
//!   (an arrival pattern, Proteus Fig. 6);
//! - trace runs: the violation rate per time window from `timeseries.csv`;
//! - runs of one app on `[[device]]`s (`devices.csv`): devices in use and p99
//!   latency per window, and a table of accuracy loss, violations, p99 and devices
//!   used (InfAdapter Fig. 5 and 6).
//!
//! The SVG code is two generic functions: [`line_chart`] and [`bar_chart`].
//!
//! With `timeseries.csv`, `report.html` draws each run's apps with the live
//! dashboard's own charts (`sluice_dashboard`'s script, style and uPlot, written
//! beside it under `assets/`), so a simulated and a live run look alike: see
//! `write_html`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};
use serde_json::Value;

/// `sluice sim report` arguments.
#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// A directory written by `sluice sim <experiment> --out <dir>`.
    pub dir: PathBuf,
    /// Title of report.md (default: the directory name).
    #[arg(long)]
    pub title: Option<String>,
}

/// Runs `sluice sim report`.
pub fn run(args: ReportArgs) -> Result<()> {
    let written = render(&args.dir, args.title.as_deref())?;
    for f in written {
        println!("wrote {}", f.display());
    }
    Ok(())
}

/// One (run, app) of results.json, the fields the report uses.
#[derive(Clone, Debug)]
struct Row {
    run: u64,
    app: String,
    policy: String,
    workers: u64,
    load_qps: Option<f64>,
    trace: Option<String>,
    requests: f64,
    accuracy: f64,
    violation_rate: f64,
    dropped: f64,
    throughput_qps: f64,
    mcd: f64,
    max_misses: f64,
    weakly_hard: Option<(u64, f64)>,
    overloaded: bool,
    /// Runs on `[[device]]`s: (mean devices, p99 ms, served accuracy, accuracy loss).
    devices: Option<(f64, f64, f64, f64)>,
}

impl Row {
    fn parse(v: &Value) -> Result<Row> {
        let num = |k: &str| v.get(k).and_then(Value::as_f64).with_context(|| format!("results.json: no number `{k}`"));
        let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        Ok(Row {
            run: v.get("run").and_then(Value::as_u64).unwrap_or(0),
            app: text("app").unwrap_or_default(),
            policy: text("policy").unwrap_or_default(),
            workers: v.get("workers").and_then(Value::as_u64).unwrap_or(0),
            load_qps: v.get("load_qps").and_then(Value::as_f64),
            trace: text("trace"),
            requests: num("requests")?,
            accuracy: num("accuracy")?,
            violation_rate: num("violation_rate")?,
            dropped: num("dropped")?,
            throughput_qps: num("throughput_qps").unwrap_or(f64::NAN),
            mcd: num("max_consecutive_drops").unwrap_or(f64::NAN),
            max_misses: num("max_consecutive_misses").unwrap_or(f64::NAN),
            weakly_hard: v.get("weakly_hard").filter(|w| !w.is_null()).map(|w| {
                let k = w.get("k").and_then(Value::as_u64).unwrap_or(0);
                (k, w.get("worst_misses_in_window").and_then(Value::as_f64).unwrap_or(f64::NAN))
            }),
            overloaded: v.get("overloaded").is_some_and(|o| !o.is_null()),
            devices: num("mean_devices").ok().map(|d| {
                let opt = |k: &str| num(k).unwrap_or(f64::NAN);
                (d, opt("p99_latency_ms"), opt("served_accuracy"), opt("accuracy_loss"))
            }),
        })
    }

    /// Load or trace, as shown in tables.
    fn load_text(&self) -> String {
        match (&self.load_qps, &self.trace) {
            (Some(l), _) => fmt_num(*l),
            (None, Some(t)) => Path::new(t).file_name().map_or(t.clone(), |f| f.to_string_lossy().into_owned()),
            _ => String::new(),
        }
    }
}

/// Rows with the same (app, policy, workers, load or trace): the seeds of one point.
struct Group {
    app: String,
    policy: String,
    workers: u64,
    load: String,
    load_qps: Option<f64>,
    rows: Vec<Row>,
}

impl Group {
    fn mean(&self, f: impl Fn(&Row) -> f64) -> f64 {
        self.rows.iter().map(f).sum::<f64>() / self.rows.len() as f64
    }
    fn max(&self, f: impl Fn(&Row) -> f64) -> f64 {
        self.rows.iter().map(f).fold(f64::NAN, f64::max)
    }
}

/// Renders `dir/results.json` (and `dir/timeseries.csv` for trace runs) into
/// `dir/report.md` and SVG plots; returns the files written.
pub fn render(dir: &Path, title: Option<&str>) -> Result<Vec<PathBuf>> {
    let path = dir.join("results.json");
    let text = std::fs::read_to_string(&path).with_context(|| format!("{}: cannot read", path.display()))?;
    let json: Value = serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
    let rows = json
        .as_array()
        .with_context(|| format!("{}: expected a list of runs", path.display()))?
        .iter()
        .map(Row::parse)
        .collect::<Result<Vec<Row>>>()?;
    if rows.is_empty() {
        bail!("{}: no runs", path.display());
    }
    let title = title.map(str::to_string).unwrap_or_else(|| {
        dir.file_name().map_or_else(|| "sluice sim report".to_string(), |n| n.to_string_lossy().into_owned())
    });

    // Groups in order of first appearance (the sweep's order).
    let mut groups: Vec<Group> = Vec::new();
    for r in &rows {
        let load = r.load_text();
        match groups
            .iter_mut()
            .find(|g| g.app == r.app && g.policy == r.policy && g.workers == r.workers && g.load == load)
        {
            Some(g) => g.rows.push(r.clone()),
            None => groups.push(Group {
                app: r.app.clone(),
                policy: r.policy.clone(),
                workers: r.workers,
                load,
                load_qps: r.load_qps,
                rows: vec![r.clone()],
            }),
        }
    }
    let apps = unique(groups.iter().map(|g| g.app.clone()));
    let several_workers = unique(groups.iter().map(|g| g.workers)).len() > 1;
    let series_label = |g: &Group| {
        if several_workers {
            format!("{} · {} workers", g.policy, g.workers)
        } else {
            g.policy.clone()
        }
    };

    let mut written = Vec::new();
    let mut plots: Vec<(String, String)> = Vec::new(); // (file, caption)
    let mut write_svg = |name: String, caption: String, svg: String| -> Result<()> {
        let p = dir.join(&name);
        std::fs::write(&p, svg).with_context(|| format!("write {}", p.display()))?;
        written.push(p);
        plots.push((name, caption));
        Ok(())
    };

    // Load sweeps: line charts per app.
    let mut swept_apps = Vec::new();
    for app in &apps {
        let mine: Vec<&Group> = groups.iter().filter(|g| &g.app == app && g.load_qps.is_some()).collect();
        if unique(mine.iter().map(|g| fmt_num(g.load_qps.unwrap_or(0.0)))).len() < 2 {
            continue;
        }
        swept_apps.push(app.clone());
        let labels = unique(mine.iter().map(|g| series_label(g)));
        let series_of = |f: &dyn Fn(&Group) -> f64| -> Vec<Series> {
            labels
                .iter()
                .map(|label| {
                    let mut points: Vec<(f64, f64)> = mine
                        .iter()
                        .filter(|g| &series_label(g) == label)
                        .map(|g| (g.load_qps.unwrap_or(0.0), f(g)))
                        .filter(|(_, y)| y.is_finite())
                        .collect();
                    points.sort_by(|a, b| a.0.total_cmp(&b.0));
                    Series { label: label.clone(), points }
                })
                .collect()
        };
        let seeds = mine.iter().map(|g| g.rows.len()).max().unwrap_or(1);
        let avg = if seeds > 1 { format!(" (mean of {seeds} seeds)") } else { String::new() };
        let slug = slug(app);
        let mut charts: Vec<(&str, String, Vec<Series>)> = vec![
            ("accuracy", "Accuracy per satisfied query".to_string(), series_of(&|g: &Group| g.mean(|r| r.accuracy))),
            ("violation", "SLO-violation rate".to_string(), series_of(&|g: &Group| g.mean(|r| r.violation_rate))),
            ("mcd", "Maximum consecutive drops (MCD)".to_string(), series_of(&|g: &Group| g.mean(|r| r.mcd))),
        ];
        if let Some(k) = mine.iter().flat_map(|g| &g.rows).find_map(|r| r.weakly_hard.map(|w| w.0)) {
            charts.push((
                "weakly-hard",
                format!("Most misses in any {k} consecutive requests"),
                series_of(&|g: &Group| g.mean(|r| r.weakly_hard.map_or(f64::NAN, |w| w.1))),
            ));
        }
        for (name, y_label, series) in charts {
            let chart_title = format!("{app}: {y_label} vs load{avg}");
            let svg = line_chart(&chart_title, "load (requests/s)", &y_label, &series);
            write_svg(format!("{slug}-{name}.svg"), chart_title, svg)?;
        }
    }

    // Everything else at one load (or one trace) per app: grouped bars, one group per
    // (app, load or trace).
    let rest: Vec<&Group> = groups.iter().filter(|g| !swept_apps.contains(&g.app)).collect();
    if !rest.is_empty() {
        let group_label = |g: &Group| {
            if g.load.is_empty() {
                g.app.clone()
            } else if g.load_qps.is_some() {
                format!("{} @ {} req/s", g.app, g.load)
            } else {
                format!("{} ({})", g.app, g.load)
            }
        };
        let bar_groups = unique(rest.iter().map(|g| group_label(g)));
        let labels = unique(rest.iter().map(|g| series_label(g)));
        let bars = |f: &dyn Fn(&Group) -> f64| -> Vec<(String, Vec<f64>)> {
            labels
                .iter()
                .map(|label| {
                    let values = bar_groups
                        .iter()
                        .map(|bg| {
                            rest.iter()
                                .find(|g| &series_label(g) == label && &group_label(g) == bg)
                                .map_or(f64::NAN, |g| f(g))
                        })
                        .collect();
                    (label.clone(), values)
                })
                .collect()
        };
        for (name, y_label, f) in [
            ("violation", "SLO-violation rate", &(|g: &Group| g.mean(|r| r.violation_rate)) as &dyn Fn(&Group) -> f64),
            ("accuracy", "Accuracy per satisfied query", &|g: &Group| g.mean(|r| r.accuracy)),
        ] {
            let chart_title = format!("{title}: {y_label}");
            let svg = bar_chart(&chart_title, y_label, &bar_groups, &bars(f));
            write_svg(format!("bars-{name}.svg"), chart_title, svg)?;
        }
    }

    // Trace runs: violation rate per window, from timeseries.csv.
    let traced: Vec<&Group> = groups.iter().filter(|g| g.load_qps.is_none() && !g.load.is_empty()).collect();
    let ts_path = dir.join("timeseries.csv");
    if !traced.is_empty() && ts_path.exists() {
        let ts = read_timeseries(&ts_path)?;
        for app in unique(traced.iter().map(|g| g.app.clone())) {
            let mine: Vec<&&Group> = traced.iter().filter(|g| g.app == app).collect();
            let labels = unique(mine.iter().map(|g| series_label(g)));
            let series: Vec<Series> = labels
                .iter()
                .map(|label| {
                    // (window start) -> (arrivals, not on time), summed over the seeds.
                    let mut acc: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
                    for g in mine.iter().filter(|g| &series_label(g) == label) {
                        for r in &g.rows {
                            for w in ts.iter().filter(|w| w.run == r.run && w.app == app) {
                                let e = acc.entry((w.start * 1000.0).round() as u64).or_default();
                                e.0 += w.arrivals;
                                e.1 += w.arrivals - w.on_time;
                            }
                        }
                    }
                    let points = acc
                        .into_iter()
                        .filter(|(_, (n, _))| *n > 0.0)
                        .map(|(t, (n, miss))| (t as f64 / 1000.0, miss / n))
                        .collect();
                    Series { label: label.clone(), points }
                })
                .collect();
            let chart_title = format!("{app}: SLO-violation rate per window");
            let svg = line_chart(&chart_title, "time (s)", "SLO-violation rate", &series);
            write_svg(format!("{}-timeseries.svg", slug(&app)), chart_title, svg)?;
        }
    }

    // Runs on [[device]]s: what each used and its tail over time (devices.csv).
    let dev_path = dir.join("devices.csv");
    // One app only: with several (Proteus's nine), the whole-system figures below
    // say more than a line per app and system would.
    let mut on_devices: Vec<&Group> = groups.iter().filter(|g| g.rows.iter().all(|r| r.devices.is_some())).collect();
    if unique(on_devices.iter().map(|g| g.app.clone())).len() > 1 {
        on_devices.clear();
    }
    if !on_devices.is_empty() && dev_path.exists() {
        let dev = read_devices(&dev_path)?;
        for (name, y_label, col) in
            [("devices", "devices in use (cores)", 0usize), ("p99", "p99 latency of served requests (ms)", 1)]
        {
            let series: Vec<Series> = on_devices
                .iter()
                .map(|g| {
                    let run = g.rows[0].run;
                    Series {
                        label: format!("{} ({})", series_label(g), g.app),
                        points: dev
                            .iter()
                            .filter(|d| d.run == run && d.app == g.app)
                            .map(|d| (d.start, if col == 0 { d.devices } else { d.p99_ms }))
                            .collect(),
                    }
                })
                .collect();
            let chart_title = format!("{title}: {y_label} per window (first seed)");
            write_svg(
                format!("devices-{name}.svg"),
                chart_title.clone(),
                line_chart(&chart_title, "time (s)", y_label, &series),
            )?;
        }
    }

    // Whole systems (several policies or systems, several apps on traces): the
    // figures of Proteus's Fig. 4 summed over the apps.
    let systems = if unique(traced.iter().map(|g| g.app.clone())).len() > 1
        && unique(traced.iter().map(|g| series_label(g))).len() > 1
        && ts_path.exists()
    {
        Some(system_figures(&traced, &read_timeseries(&ts_path)?, &series_label))
    } else {
        None
    };
    if let Some(systems) = &systems {
        let window = systems.first().and_then(|s| s.windows.get(1).map(|w| w.0)).unwrap_or(1.0).max(1e-9);
        for (name, y_label, f) in [
            (
                "throughput",
                "on-time throughput (requests/s)",
                &(|w: &SysWindow| w.on_time / window) as &dyn Fn(&SysWindow) -> f64,
            ),
            ("accuracy", "effective accuracy", &|w: &SysWindow| w.accuracy),
            ("violation", "SLO-violation ratio", &|w: &SysWindow| w.violation),
        ] {
            let mut series: Vec<Series> = systems
                .iter()
                .map(|s| Series {
                    label: s.label.clone(),
                    points: s.windows.iter().map(|(t, w)| (*t, f(w))).filter(|p| p.1.is_finite()).collect(),
                })
                .collect();
            if name == "throughput" {
                if let Some(first) = systems.first() {
                    series.insert(
                        0,
                        Series {
                            label: "demand".into(),
                            points: first.windows.iter().map(|(t, w)| (*t, w.arrivals / window)).collect(),
                        },
                    );
                }
            }
            let chart_title = format!("{title}: {y_label} over time (all apps)");
            write_svg(
                format!("systems-{name}.svg"),
                chart_title.clone(),
                line_chart(&chart_title, "time (s)", y_label, &series),
            )?;
        }
    }

    // report.md
    let mut md = String::new();
    let _ = writeln!(md, "# {title}\n");
    let seeds = groups.iter().map(|g| g.rows.len()).max().unwrap_or(1);
    let _ = writeln!(
        md,
        "Rendered by `sluice sim report` from `results.json` ({} runs × apps). Figures are means over \
         {seeds} seed(s) per row; MCD = maximum consecutive drops (mean and max over seeds).\n",
        rows.len()
    );
    if let Some(systems) = &systems {
        let _ = writeln!(
            md,
            "Whole systems, over all apps: effective accuracy of what was served, the largest \
             accuracy drop below 1 in any window, SLO-violation ratio (late + dropped over \
             arrivals), on-time throughput.\n\n| system | effective accuracy | max accuracy drop | \
             violation ratio | on-time throughput (req/s) |\n|---|---|---|---|---|"
        );
        for s in systems {
            let _ = writeln!(
                md,
                "| {} | {:.4} | {:.2} % (at {} s) | {:.4} | {:.1} |",
                s.label,
                s.accuracy,
                100.0 * s.max_drop.0,
                fmt_num(s.max_drop.1),
                s.violation,
                s.throughput
            );
        }
        md.push('\n');
    }
    if !on_devices.is_empty() {
        let _ = writeln!(
            md,
            "Runs on devices: mean accuracy of everything served (late included), its loss \
             against the app's most accurate variant, the share of requests not served on \
             time, p99 latency of the served ones, devices in use (time-weighted mean).\n\n\
             | app | system | served accuracy | accuracy loss | violation rate | p99 (ms) | devices |\n\
             |---|---|---|---|---|---|---|"
        );
        for g in &on_devices {
            let d = |k: usize| {
                g.mean(|r| {
                    let v = r.devices.unwrap_or_default();
                    [v.0, v.1, v.2, v.3][k]
                })
            };
            let _ = writeln!(
                md,
                "| {} | {} | {:.4} | {:.2} % | {:.4} | {:.0} | {:.1} |",
                g.app,
                series_label(g),
                d(2),
                100.0 * d(3),
                g.mean(|r| r.violation_rate),
                d(1),
                d(0)
            );
        }
        md.push('\n');
    }
    for (file, caption) in &plots {
        let _ = writeln!(md, "![{caption}]({file})\n");
    }
    let with_wh = rows.iter().any(|r| r.weakly_hard.is_some());
    let _ = write!(
        md,
        "| app | policy | workers | load (req/s) or trace | seeds | requests | accuracy | violation rate | dropped | throughput (req/s) | MCD mean | MCD max | max consecutive misses |"
    );
    if with_wh {
        md.push_str(" worst misses in K |");
    }
    md.push_str(" overloaded |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    if with_wh {
        md.push_str("---|");
    }
    md.push_str("---|\n");
    for g in &groups {
        let _ = write!(
            md,
            "| {} | {} | {} | {} | {} | {:.0} | {:.4} | {:.4} | {:.0} | {:.1} | {:.2} | {} | {} |",
            g.app,
            g.policy,
            g.workers,
            g.load,
            g.rows.len(),
            g.mean(|r| r.requests),
            g.mean(|r| r.accuracy),
            g.mean(|r| r.violation_rate),
            g.mean(|r| r.dropped),
            g.mean(|r| r.throughput_qps),
            g.mean(|r| r.mcd),
            fmt_num(g.max(|r| r.mcd)),
            fmt_num(g.max(|r| r.max_misses)),
        );
        if with_wh {
            let w = g.max(|r| r.weakly_hard.map_or(f64::NAN, |w| w.1));
            let k = g.rows.iter().find_map(|r| r.weakly_hard.map(|w| w.0)).unwrap_or(0);
            let _ = write!(md, " {} |", if w.is_finite() { format!("{} in {k}", fmt_num(w)) } else { String::new() });
        }
        let over = g.rows.iter().filter(|r| r.overloaded).count();
        let _ = writeln!(md, " {} |", if over > 0 { format!("{over} of {}", g.rows.len()) } else { String::new() });
    }
    let md_path = dir.join("report.md");
    std::fs::write(&md_path, md).with_context(|| format!("write {}", md_path.display()))?;
    written.push(md_path);
    if ts_path.exists() {
        let dev = if dev_path.exists() { read_devices(&dev_path)? } else { Vec::new() };
        let windows = read_windows(&dir.join("windows.json"))?;
        written.extend(write_html(dir, &title, &rows, &read_timeseries(&ts_path)?, &dev, &windows)?);
    }
    Ok(written)
}

/// The drop reasons the simulator's windows count (the dashboard's drops chart).
const HTML_REASONS: &[&str] = &["dropped", "late"];

/// Writes `report.html` and its `assets/`: every (run, app) of `timeseries.csv` as
/// the dashboard's points (`charts.js`) (arrivals and answers per second,
/// on-time rate, accuracy served, p99 from `devices.csv` where the run has
/// devices; p50, the variant mix and each worker's mean queue length from
/// `windows.json`), drawn by the dashboard's `charts.js`. Results written before
/// `windows.json` existed have none: those three charts are empty for them.
/// The data is a JSON block (`type="application/json"`, never executed) read with
/// `textContent`, and every name is set as text, as on the live page.
fn write_html(
    dir: &Path,
    title: &str,
    rows: &[Row],
    ts: &[Window],
    dev: &[DeviceWindow],
    windows: &[AppWindows],
) -> Result<Vec<PathBuf>> {
    let mut runs = Vec::new();
    for run in unique(rows.iter().map(|r| r.run)) {
        let mut apps = Vec::new();
        for r in rows.iter().filter(|r| r.run == run) {
            let mine: Vec<&Window> = ts.iter().filter(|w| w.run == run && w.app == r.app).collect();
            let extra = windows.iter().find(|x| x.run == run && x.app == r.app);
            let points: Vec<Value> = mine
                .iter()
                .enumerate()
                .map(|(i, w)| {
                    // A window lasts until the next one starts (the last: as long as the one before).
                    let len = match (mine.get(i + 1), i.checked_sub(1).and_then(|j| mine.get(j))) {
                        (Some(n), _) => n.start - w.start,
                        (None, Some(p)) => w.start - p.start,
                        _ => 1.0,
                    }
                    .max(1e-9);
                    let p99 =
                        dev.iter().find(|d| d.run == run && d.app == r.app && d.start == w.start).map(|d| d.p99_ms);
                    let dropped = (w.arrivals - w.on_time - w.late).max(0.0);
                    // Windows of both files start at the same multiples of window_s.
                    let x = extra.and_then(|x| x.windows.iter().find(|x| (x.start - w.start).abs() < 1e-6));
                    let mix: Vec<f64> = x.map(|x| x.mix.iter().map(|n| n / len).collect()).unwrap_or_default();
                    serde_json::json!({
                        "t": w.start,
                        "arrivals": w.arrivals / len,
                        "served": (w.on_time + w.late) / len,
                        "on_time": (w.arrivals > 0.0).then(|| w.on_time / w.arrivals),
                        "accuracy": w.accuracy,
                        "p50_ms": x.and_then(|x| x.p50_ms),
                        "p99_ms": p99,
                        "mix": mix,
                        "queue": x.map(|x| x.queue.clone()).unwrap_or_default(),
                        "drops": [dropped / len, w.late / len],
                    })
                })
                .collect();
            if points.is_empty() {
                continue;
            }
            let models = extra.map(|x| x.models.clone()).unwrap_or_default();
            let queues = extra.and_then(|x| x.windows.iter().map(|w| w.queue.len()).max()).unwrap_or(0);
            apps.push(serde_json::json!({
                "app": r.app, "policy": r.policy, "models": models, "workers": (0..queues).collect::<Vec<usize>>(),
                "reasons": HTML_REASONS, "points": points, "markers": [],
            }));
        }
        if !apps.is_empty() {
            runs.push(serde_json::json!({ "name": format!("run {run}"), "apps": apps }));
        }
    }
    let data = serde_json::json!({ "title": title, "runs": runs }).to_string();
    let assets = dir.join("assets");
    std::fs::create_dir_all(&assets).with_context(|| format!("create {}", assets.display()))?;
    let mut written = Vec::new();
    for name in ["uPlot.iife.min.js", "uPlot.min.css", "uPlot.LICENSE", "charts.js", "report.js", "dashboard.css"] {
        let a = sluice_dashboard::asset(name).context("a dashboard asset is missing")?;
        let p = assets.join(name);
        std::fs::write(&p, a.bytes).with_context(|| format!("write {}", p.display()))?;
        written.push(p);
    }
    // `</` cannot close the data block early: JSON allows `<\/` for `</`.
    let data = data.replace("</", "<\\/");
    let html = format!(
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{t}</title>\n\
         <link rel=\"stylesheet\" href=\"assets/uPlot.min.css\">\n<link rel=\"stylesheet\" href=\"assets/dashboard.css\">\n\
         <script src=\"assets/uPlot.iife.min.js\" defer></script>\n<script src=\"assets/charts.js\" defer></script>\n\
         <script src=\"assets/report.js\" defer></script>\n</head>\n<body>\n<header><h1>{t}</h1></header>\n<main>\n\
         <section id=\"apps\"></section>\n</main>\n<script type=\"application/json\" id=\"sluice-data\">{data}</script>\n</body>\n</html>\n",
        t = esc(title),
    );
    let p = dir.join("report.html");
    std::fs::write(&p, html).with_context(|| format!("write {}", p.display()))?;
    written.push(p);
    Ok(written)
}

/// One window of a whole system.
#[derive(Default)]
struct SysWindow {
    arrivals: f64,
    on_time: f64,
    served: f64,
    accuracy: f64,
    violation: f64,
}

/// A whole system's figures.
struct SystemFigures {
    label: String,
    /// (window start s, window), in time order.
    windows: Vec<(f64, SysWindow)>,
    accuracy: f64,
    /// (largest drop below 1 of a window's accuracy, its start).
    max_drop: (f64, f64),
    violation: f64,
    throughput: f64,
}

/// Sums every app's windows per system (the first seed's runs).
fn system_figures(traced: &[&Group], ts: &[Window], label_of: &dyn Fn(&Group) -> String) -> Vec<SystemFigures> {
    let labels = unique(traced.iter().map(|g| label_of(g)));
    labels
        .into_iter()
        .map(|label| {
            let runs: Vec<u64> =
                traced.iter().filter(|g| label_of(g) == label).filter_map(|g| g.rows.first().map(|r| r.run)).collect();
            let mut acc: BTreeMap<u64, SysWindow> = BTreeMap::new();
            for w in ts.iter().filter(|w| runs.contains(&w.run)) {
                let e = acc.entry((w.start * 1000.0).round() as u64).or_default();
                e.arrivals += w.arrivals;
                e.on_time += w.on_time;
                let served = w.on_time + w.late;
                if served > 0.0 && w.accuracy.is_finite() {
                    e.accuracy += w.accuracy * served;
                    e.served += served;
                }
            }
            let (mut arrivals, mut on_time, mut served, mut mass) = (0.0, 0.0, 0.0, 0.0);
            let mut max_drop = (0.0, 0.0);
            let windows: Vec<(f64, SysWindow)> = acc
                .into_iter()
                .map(|(t, mut w)| {
                    arrivals += w.arrivals;
                    on_time += w.on_time;
                    served += w.served;
                    mass += w.accuracy;
                    w.accuracy = if w.served > 0.0 { w.accuracy / w.served } else { f64::NAN };
                    w.violation = if w.arrivals > 0.0 { 1.0 - w.on_time / w.arrivals } else { f64::NAN };
                    let start = t as f64 / 1000.0;
                    if w.accuracy.is_finite() && 1.0 - w.accuracy > max_drop.0 {
                        max_drop = (1.0 - w.accuracy, start);
                    }
                    (start, w)
                })
                .collect();
            let span =
                windows.last().map(|w| w.0).unwrap_or(0.0) + windows.get(1).map(|w| w.0 - windows[0].0).unwrap_or(1.0);
            SystemFigures {
                label,
                windows,
                accuracy: if served > 0.0 { mass / served } else { f64::NAN },
                max_drop,
                violation: if arrivals > 0.0 { 1.0 - on_time / arrivals } else { f64::NAN },
                throughput: on_time / span.max(1e-9),
            }
        })
        .collect()
}

struct Window {
    run: u64,
    app: String,
    start: f64,
    arrivals: f64,
    on_time: f64,
    late: f64,
    accuracy: f64,
}

/// One (run, app) of windows.json (`stats::write_outputs`).
struct AppWindows {
    run: u64,
    app: String,
    models: Vec<String>,
    windows: Vec<ExtraWindow>,
}

/// One window of windows.json: what timeseries.csv has no column for.
struct ExtraWindow {
    start: f64,
    p50_ms: Option<f64>,
    /// Served per variant (counts).
    mix: Vec<f64>,
    /// Mean length per queue.
    queue: Vec<f64>,
}

/// windows.json, if the run wrote one (none: an empty list).
fn read_windows(path: &Path) -> Result<Vec<AppWindows>> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("{}: cannot read", path.display()))?;
    let v: Value = serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
    let bad = || anyhow::anyhow!("{}: not a sluice windows.json", path.display());
    let nums = |v: &Value| -> Vec<f64> {
        v.as_array().map(|a| a.iter().filter_map(Value::as_f64).collect()).unwrap_or_default()
    };
    let mut out = Vec::new();
    for g in v.as_array().ok_or_else(bad)? {
        out.push(AppWindows {
            run: g["run"].as_u64().ok_or_else(bad)?,
            app: g["app"].as_str().ok_or_else(bad)?.to_string(),
            models: g["models"]
                .as_array()
                .ok_or_else(bad)?
                .iter()
                .filter_map(|m| m.as_str().map(str::to_string))
                .collect(),
            windows: g["windows"]
                .as_array()
                .ok_or_else(bad)?
                .iter()
                .map(|w| {
                    Ok(ExtraWindow {
                        start: w["start_s"].as_f64().ok_or_else(bad)?,
                        p50_ms: w["p50_ms"].as_f64(),
                        mix: nums(&w["mix"]),
                        queue: nums(&w["queue"]),
                    })
                })
                .collect::<Result<_>>()?,
        });
    }
    Ok(out)
}

/// One row of devices.csv.
struct DeviceWindow {
    run: u64,
    app: String,
    start: f64,
    devices: f64,
    p99_ms: f64,
}

/// devices.csv: `run,app,window_start_s,devices,p99_ms`.
fn read_devices(path: &Path) -> Result<Vec<DeviceWindow>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}: cannot read", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().skip(1) {
        let cols: Vec<&str> = line.split(',').collect();
        let bad = || anyhow::anyhow!("{}:{}: malformed row", path.display(), i + 1);
        if cols.len() != 5 {
            return Err(bad());
        }
        let f = |j: usize| cols[j].parse::<f64>().map_err(|_| bad());
        out.push(DeviceWindow {
            run: cols[0].parse().map_err(|_| bad())?,
            app: cols[1].to_string(),
            start: f(2)?,
            devices: f(3)?,
            p99_ms: f(4)?,
        });
    }
    Ok(out)
}

/// timeseries.csv: `run,app,policy,window_start_s,arrivals,on_time,late,dropped,accuracy`.
/// Policy labels are not quoted and may hold commas, so the columns are read from both ends.
fn read_timeseries(path: &Path) -> Result<Vec<Window>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}: cannot read", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().skip(1) {
        let cols: Vec<&str> = line.split(',').collect();
        let bad = || anyhow::anyhow!("{}:{}: malformed row", path.display(), i + 1);
        if cols.len() < 9 {
            return Err(bad());
        }
        let n = cols.len();
        let f = |j: usize| cols[j].parse::<f64>().map_err(|_| bad());
        out.push(Window {
            run: cols[0].parse().map_err(|_| bad())?,
            app: cols[1].to_string(),
            start: f(n - 6)?,
            arrivals: f(n - 5)?,
            on_time: f(n - 4)?,
            late: f(n - 3)?,
            accuracy: f(n - 1)?,
        });
    }
    Ok(out)
}

fn unique<T: PartialEq>(items: impl Iterator<Item = T>) -> Vec<T> {
    let mut out = Vec::new();
    for x in items {
        if !out.contains(&x) {
            out.push(x);
        }
    }
    out
}

fn slug(s: &str) -> String {
    let s: String =
        s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '_' }).collect();
    if s.is_empty() {
        "app".into()
    } else {
        s
    }
}

/// A number without trailing zeros (integers without a point).
fn fmt_num(x: f64) -> String {
    if !x.is_finite() {
        return String::new();
    }
    if x == x.round() && x.abs() < 1e15 {
        return format!("{}", x as i64);
    }
    let s = format!("{x:.4}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

// ---------------------------------------------------------------------------------
// SVG

/// One line of a [`line_chart`].
#[derive(Clone, Debug)]
pub struct Series {
    /// Legend label.
    pub label: String,
    /// (x, y) points, drawn in this order.
    pub points: Vec<(f64, f64)>,
}

const PALETTE: [&str; 10] =
    ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
const W: f64 = 760.0;
const H: f64 = 440.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 210.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 55.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// Ticks covering [lo, hi]: a step of 1, 2 or 5 × 10^k, about `n` of them.
fn ticks(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    let (lo, hi) = if hi > lo { (lo, hi) } else { (lo - 0.5 * lo.abs().max(1.0), hi + 0.5 * hi.abs().max(1.0)) };
    let raw = (hi - lo) / n.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag);
    let first = (lo / step).floor() as i64;
    let last = (hi / step).ceil() as i64;
    (first..=last).map(|i| i as f64 * step).collect()
}

fn tick_text(x: f64, step: f64) -> String {
    let decimals = if step >= 1.0 { 0 } else { (-step.log10()).ceil() as usize };
    format!("{x:.decimals$}")
}

/// The frame: title, axes with ticks and labels, the plot area's mapping.
struct Frame {
    x: Vec<f64>,
    y: Vec<f64>,
}

impl Frame {
    fn px(&self, x: f64) -> f64 {
        let (lo, hi) = (self.x[0], self.x[self.x.len() - 1]);
        LEFT + (x - lo) / (hi - lo) * (W - LEFT - RIGHT)
    }
    fn py(&self, y: f64) -> f64 {
        let (lo, hi) = (self.y[0], self.y[self.y.len() - 1]);
        H - BOTTOM - (y - lo) / (hi - lo) * (H - TOP - BOTTOM)
    }

    /// Opens the SVG and draws the title, grid, y ticks and axis labels; x ticks are
    /// drawn when `x_ticks` (line charts; bar charts label their groups instead).
    fn open(&self, title: &str, x_label: &str, y_label: &str, x_ticks: bool) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="22" text-anchor="middle" font-size="14" font-weight="bold">{}</text>"#,
            (LEFT + W - RIGHT) / 2.0,
            esc(title)
        );
        let ystep = self.y.get(1).map_or(1.0, |b| b - self.y[0]);
        for &t in &self.y {
            let y = self.py(t);
            let _ = writeln!(
                s,
                r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e0e0e0"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                W - RIGHT,
                LEFT - 6.0,
                y + 4.0,
                tick_text(t, ystep)
            );
        }
        if x_ticks {
            let xstep = self.x.get(1).map_or(1.0, |b| b - self.x[0]);
            for &t in &self.x {
                let x = self.px(t);
                let _ = writeln!(
                    s,
                    r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="#333"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                    H - BOTTOM,
                    H - BOTTOM + 5.0,
                    H - BOTTOM + 18.0,
                    tick_text(t, xstep)
                );
            }
        }
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{:.1}" stroke="#333"/><line x1="{LEFT}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#333"/>"##,
            H - BOTTOM,
            H - BOTTOM,
            W - RIGHT,
            H - BOTTOM
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            (LEFT + W - RIGHT) / 2.0,
            H - 12.0,
            esc(x_label)
        );
        let _ = writeln!(
            s,
            r#"<text transform="translate(18,{:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
            (TOP + H - BOTTOM) / 2.0,
            esc(y_label)
        );
        s
    }
}

fn legend(s: &mut String, labels: &[&str], marker: bool) {
    for (i, label) in labels.iter().enumerate() {
        let y = TOP + 10.0 + 20.0 * i as f64;
        let x = W - RIGHT + 15.0;
        let c = PALETTE[i % PALETTE.len()];
        if marker {
            let _ = writeln!(
                s,
                r#"<line x1="{x}" y1="{y}" x2="{}" y2="{y}" stroke="{c}" stroke-width="2"/><circle cx="{}" cy="{y}" r="3" fill="{c}"/>"#,
                x + 24.0,
                x + 12.0
            );
        } else {
            let _ = writeln!(s, r#"<rect x="{x}" y="{}" width="24" height="10" fill="{c}"/>"#, y - 5.0);
        }
        let _ = writeln!(s, r#"<text x="{}" y="{}">{}</text>"#, x + 30.0, y + 4.0, esc(label));
    }
}

/// A line chart of several series (one colour each, with markers), axes with ticks,
/// axis labels and a legend. The y axis starts at 0 when every value is ≥ 0.
pub fn line_chart(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let pts = || series.iter().flat_map(|s| s.points.iter()).filter(|(x, y)| x.is_finite() && y.is_finite());
    let (mut xlo, mut xhi, mut ylo, mut yhi) = (f64::INFINITY, f64::NEG_INFINITY, f64::INFINITY, f64::NEG_INFINITY);
    for &(x, y) in pts() {
        xlo = xlo.min(x);
        xhi = xhi.max(x);
        ylo = ylo.min(y);
        yhi = yhi.max(y);
    }
    if !xlo.is_finite() {
        (xlo, xhi, ylo, yhi) = (0.0, 1.0, 0.0, 1.0);
    }
    if ylo >= 0.0 {
        ylo = 0.0;
    }
    if yhi <= ylo {
        yhi = ylo + 1.0;
    }
    let frame = Frame { x: ticks(xlo, xhi, 8), y: ticks(ylo, yhi, 6) };
    let mut s = frame.open(title, x_label, y_label, true);
    for (i, ser) in series.iter().enumerate() {
        let c = PALETTE[i % PALETTE.len()];
        let p: Vec<(f64, f64)> = ser
            .points
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .map(|&(x, y)| (frame.px(x), frame.py(y)))
            .collect();
        if p.len() > 1 {
            let d: Vec<String> = p.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
            let _ = writeln!(s, r#"<polyline points="{}" fill="none" stroke="{c}" stroke-width="2"/>"#, d.join(" "));
        }
        if p.len() <= 60 {
            for (x, y) in &p {
                let _ = writeln!(s, r#"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="{c}"/>"#);
            }
        }
    }
    let labels: Vec<&str> = series.iter().map(|s| s.label.as_str()).collect();
    legend(&mut s, &labels, true);
    s.push_str("</svg>\n");
    s
}

/// Grouped bars: one group per entry of `groups`, one bar per series in each (NaN:
/// no bar), each bar labelled with its value.
pub fn bar_chart(title: &str, y_label: &str, groups: &[String], series: &[(String, Vec<f64>)]) -> String {
    let yhi = series.iter().flat_map(|(_, v)| v.iter()).copied().filter(|v| v.is_finite()).fold(0.0, f64::max);
    let frame = Frame { x: vec![0.0, groups.len().max(1) as f64], y: ticks(0.0, if yhi > 0.0 { yhi } else { 1.0 }, 6) };
    let mut s = frame.open(title, "", y_label, false);
    let slot = (W - LEFT - RIGHT) / groups.len().max(1) as f64;
    let bar = slot * 0.8 / series.len().max(1) as f64;
    for (g, name) in groups.iter().enumerate() {
        let x0 = LEFT + slot * g as f64 + slot * 0.1;
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            LEFT + slot * (g as f64 + 0.5),
            H - BOTTOM + 18.0,
            esc(name)
        );
        for (i, (_, values)) in series.iter().enumerate() {
            let Some(&v) = values.get(g) else { continue };
            if !v.is_finite() {
                continue;
            }
            let (x, y) = (x0 + bar * i as f64, frame.py(v));
            let c = PALETTE[i % PALETTE.len()];
            let _ = writeln!(
                s,
                r#"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{c}"/>"#,
                bar * 0.92,
                (H - BOTTOM - y).max(0.0)
            );
            // Narrow bars get their value written upwards.
            let (tx, ty) = (x + bar * 0.46, y - 3.0);
            let text = fmt_bar(v);
            if bar < 6.0 * text.len() as f64 {
                let _ = writeln!(
                    s,
                    r#"<text x="{:.1}" y="{ty:.1}" transform="rotate(-90 {:.1} {ty:.1})" font-size="9">{text}</text>"#,
                    tx + 3.0,
                    tx + 3.0
                );
            } else {
                let _ =
                    writeln!(s, r#"<text x="{tx:.1}" y="{ty:.1}" text-anchor="middle" font-size="9">{text}</text>"#);
            }
        }
    }
    let labels: Vec<&str> = series.iter().map(|(l, _)| l.as_str()).collect();
    legend(&mut s, &labels, false);
    s.push_str("</svg>\n");
    s
}

fn fmt_bar(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 0.01 {
        format!("{v:.3}")
    } else {
        format!("{v:.1e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_report_carries_the_dashboard_charts_and_its_data() {
        // A committed run (docs/results/infadapter) rendered again in a temp dir.
        let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/results/infadapter");
        let dir = tempfile::tempdir().unwrap();
        for f in ["results.json", "timeseries.csv", "devices.csv"] {
            std::fs::copy(from.join(f), dir.path().join(f)).unwrap();
        }
        let written = render(dir.path(), Some("<b>title</b>")).unwrap();
        assert!(written.contains(&dir.path().join("report.html")), "{written:?}");
        let html = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
        assert!(html.contains("<title>&lt;b&gt;title&lt;/b&gt;</title>"), "the title is escaped");
        for asset in ["charts.js", "report.js", "uPlot.iife.min.js", "dashboard.css"] {
            assert!(html.contains(&format!("assets/{asset}")), "{asset}");
            assert!(dir.path().join("assets").join(asset).exists(), "{asset}");
        }
        // The data block is JSON that no `</script>` inside can end early.
        let block = html.split("id=\"sluice-data\">").nth(1).unwrap().split("</script>").next().unwrap();
        let data: Value = serde_json::from_str(block).unwrap();
        let app = &data["runs"][0]["apps"][0];
        assert!(app["points"].as_array().unwrap().len() > 10, "{app}");
        assert!(app["points"][0]["arrivals"].as_f64().unwrap() > 0.0);
    }

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(ticks(0.0, 1.0, 5), vec![0.0, 0.2, 0.4, 0.6000000000000001, 0.8, 1.0]);
        let t = ticks(400.0, 4000.0, 8);
        assert_eq!((t[0], *t.last().unwrap(), t[1] - t[0]), (0.0, 4000.0, 500.0));
        assert!(ticks(3.0, 3.0, 5).len() >= 2, "a flat range still gets an axis");
    }

    #[test]
    fn charts_hold_their_labels() {
        let s = line_chart("t", "x", "y", &[Series { label: "a<b".into(), points: vec![(1.0, 2.0), (2.0, 3.0)] }]);
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert!(s.contains("a&lt;b") && s.contains("<polyline"));
        let b = bar_chart("t", "y", &["g1".into(), "g2".into()], &[("p".into(), vec![0.5, f64::NAN])]);
        assert_eq!(b.matches("<rect x=").count(), 2, "one bar and one legend swatch");
        assert!(b.contains("0.500") && b.contains("g2"));
    }
}
