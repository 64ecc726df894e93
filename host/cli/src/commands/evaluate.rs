//! `sluice evaluate --recorded arrivals.csv --config my.toml --policy cand.wasm`: the
//! what-if evaluation of `POST /admin/apps/{app}/evaluate`, offline — a recorded
//! arrival log (`sluice serve --record-arrivals`) replayed with a candidate and with
//! the app's configured policy ([`sluice_sim::whatif::offline`]).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context as _, Result};
use sluice_core::whatif::{Comparison, PromoteIf, ReplayResult};
use sluice_server::config::Config;
use sluice_sim::whatif::{offline, Offline};

/// `sluice evaluate` arguments.
#[derive(clap::Args, Debug)]
pub struct EvaluateArgs {
    /// The arrival log (`app,arrival_us[,refused]` lines, as `sluice serve --record-arrivals` writes).
    #[arg(long)]
    pub recorded: PathBuf,
    /// The server config the arrivals were served with (`sluice serve --config`).
    #[arg(long)]
    pub config: PathBuf,
    /// The candidate: a built-in policy name or a `.wasm` component.
    #[arg(long)]
    pub policy: String,
    /// The candidate's params: a JSON object, or `@file.json`.
    #[arg(long)]
    pub params: Option<String>,
    /// Which app of the config (default: the only one).
    #[arg(long)]
    pub app: Option<String>,
    /// Replay only the last this many seconds of the log (default: all of it).
    #[arg(long)]
    pub window_s: Option<f64>,
    /// Width of the time series' windows, seconds.
    #[arg(long, default_value_t = 60.0)]
    pub series_window_s: f64,
    /// Where built-in policies are, overriding the config's `builtin_policy_dir`.
    #[arg(long)]
    pub builtin_policy_dir: Option<PathBuf>,
    /// Use two threads: each replay split by worker where the app's router allows
    /// (round-robin, weighted), else the candidate and the current policy at once.
    #[arg(long)]
    pub parallel: bool,
    /// With --violation-max: succeed only when the candidate gains at least this
    /// much accuracy (what `promote_if` asks of a live promotion).
    #[arg(long, requires = "violation_max")]
    pub accuracy_gain_min: Option<f64>,
    /// With --accuracy-gain-min: succeed only when the candidate's violation rate is
    /// at most this.
    #[arg(long, requires = "accuracy_gain_min")]
    pub violation_max: Option<f64>,
    /// Print the whole comparison (both replays, per-window series, differences) as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs `sluice evaluate`.
pub fn run(args: EvaluateArgs) -> Result<()> {
    let config = Config::load(&args.config)?;
    let params = match &args.params {
        None => None,
        Some(p) => {
            let text = match p.strip_prefix('@') {
                Some(file) => {
                    std::fs::read_to_string(file).with_context(|| format!("--params @{file}: cannot read"))?
                }
                None => p.clone(),
            };
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("--params: invalid JSON: {e}"))?;
            if !v.is_object() {
                bail!("--params: expected a JSON object, got {v}");
            }
            Some(v.to_string())
        }
    };
    if let Some(w) = args.window_s {
        anyhow::ensure!(w.is_finite() && w > 0.0, "--window-s: expected a positive number of seconds");
    }
    anyhow::ensure!(
        args.series_window_s.is_finite() && args.series_window_s > 0.0,
        "--series-window-s: expected a positive number of seconds"
    );
    let rule = match (args.accuracy_gain_min, args.violation_max) {
        (Some(g), Some(v)) => {
            let r = PromoteIf { accuracy_gain_min: g, violation_max: v };
            r.validate().map_err(|e| {
                anyhow::anyhow!("--{}: expected {}, got {}", e.field.replace('_', "-"), e.expected, e.got)
            })?;
            Some(r)
        }
        _ => None,
    };
    let builtin_dir = args.builtin_policy_dir.clone().unwrap_or_else(|| config.builtin_policy_dir.clone());
    let started = Instant::now();
    let (app, c) = offline(&Offline {
        apps: &config.apps,
        app: args.app.as_deref(),
        recorded: &args.recorded,
        window_s: args.window_s,
        candidate: &args.policy,
        params,
        builtin_dir: &builtin_dir,
        series_window_s: args.series_window_s,
        parallel: args.parallel,
    })?;
    let wall = started.elapsed().as_secs_f64();
    if args.json {
        println!("{}", serde_json::json!({ "app": app, "wall_seconds": wall, "comparison": c }));
    } else {
        print_table(&app, &c, wall);
    }
    if let Some(rule) = rule {
        let (ok, reason) = c.verdict(&rule);
        if !ok {
            bail!("{reason}");
        }
        eprintln!("{reason}");
    }
    Ok(())
}

fn print_table(app: &str, c: &Comparison, wall: f64) {
    println!("app {app}: {} requests replayed in {wall:.3} s", c.candidate.requests);
    println!(
        "{:<10} {:<20} {:>10} {:>10} {:>9} {:>9} {:>9} {:>7}",
        "", "policy", "accuracy", "violation", "dropped", "p50 ms", "p99 ms", "faults"
    );
    let row = |label: &str, r: &ReplayResult| {
        println!(
            "{:<10} {:<20} {:>10.5} {:>10.5} {:>9} {:>9.2} {:>9.2} {:>7}",
            label, r.policy, r.accuracy, r.violation_rate, r.dropped, r.p50_ms, r.p99_ms, r.faults
        );
        if let Some(o) = &r.overloaded {
            println!("{label}: OVERLOADED: {o}");
        }
    };
    row("candidate", &c.candidate);
    row("current", &c.current);
    let d = &c.difference;
    println!(
        "{:<10} {:<20} {:>+10.5} {:>+10.5} {:>+9} {:>+9.2} {:>+9.2}",
        "difference", "", d.accuracy, d.violation_rate, d.dropped, d.p50_ms, d.p99_ms
    );
}
