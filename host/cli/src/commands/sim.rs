//! `sluice sim <experiment> [--out dir]` and `sluice sim report <dir>`: runs an
//! experiment with [`sluice_sim::run_experiment`] and prints a table per run.

use std::path::PathBuf;

use anyhow::{bail, Result};
use sluice_sim::{run_experiment, Experiment};

/// `sluice sim` arguments: an experiment file, or `report <dir>`.
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct SimArgs {
    /// `report <dir>`: render report.md and SVG plots from a `--out` directory.
    #[command(subcommand)]
    pub command: Option<SimCommand>,
    /// The experiment file.
    #[arg(required = true)]
    pub experiment: Option<PathBuf>,
    /// Write results.json, results.csv, timeseries.csv, windows.json and summary.json here.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// `sluice sim` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum SimCommand {
    /// Render report.md and SVG plots from the results of `sluice sim <experiment> --out <dir>`.
    Report(sluice_sim::report::ReportArgs),
}

/// Runs `sluice sim`.
pub fn run(args: SimArgs) -> Result<()> {
    if let Some(SimCommand::Report(r)) = args.command {
        return sluice_sim::report::run(r);
    }
    let Some(experiment) = &args.experiment else { bail!("sluice sim: an experiment file is required") };
    // A `[pipeline]` section makes it a pipeline experiment (Loki's pipelines run by
    // `sluice_sim::pipeline`, with their own runs and results).
    let text = std::fs::read_to_string(experiment)
        .map_err(|e| anyhow::anyhow!("{}: cannot read: {e}", experiment.display()))?;
    if sluice_sim::pipeline::is_pipeline_experiment(&text) {
        return run_pipeline(experiment, args.out.as_deref());
    }
    let (exp, base) = Experiment::load(experiment)?;
    let out = run_experiment(&exp, &base, true)?;
    println!(
        "{:<4} {:<16} {:<10} {:>7} {:>10} {:>9} {:>9} {:>9} {:>8} {:>9}",
        "run", "policy", "app", "workers", "load/trace", "requests", "accuracy", "violation", "dropped", "wall s"
    );
    for t in &out.timing {
        let load = t.load_qps.map(|l| format!("{l:.0}")).unwrap_or_else(|| t.trace.clone().unwrap_or_default());
        println!(
            "{:<4} {:<16} {:<10} {:>7} {:>10} {:>9} {:>9.5} {:>9.5} {:>8} {:>9.3}",
            t.run,
            t.policy,
            t.app,
            t.workers,
            load,
            t.requests,
            t.accuracy,
            t.violation_rate,
            t.dropped,
            t.wall_seconds
        );
    }
    for r in &out.results {
        if let Some(o) = &r.overloaded {
            println!("run {} app {}: OVERLOADED: {o}", r.run, r.app);
        }
    }
    if let Some(dir) = &args.out {
        sluice_sim::stats::write_outputs(dir, &out)?;
        let devices = if out.timeseries.iter().any(|w| w.devices.is_some()) { ",devices.csv" } else { "" };
        println!(
            "wrote {}/{{results.json,results.csv,timeseries.csv{devices},windows.json,summary.json}}",
            dir.display()
        );
    }
    Ok(())
}

/// Runs a pipeline experiment and prints a row per run.
fn run_pipeline(path: &std::path::Path, out_dir: Option<&std::path::Path>) -> Result<()> {
    use sluice_sim::pipeline::{run_pipeline_experiment, write_outputs, PipelineExperiment};
    let (exp, base) = PipelineExperiment::load(path)?;
    let out = run_pipeline_experiment(&exp, &base)?;
    println!(
        "{:<4} {:<26} {:>6} {:>4} {:>16} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>6} {:>7}",
        "run",
        "system",
        "slo",
        "S",
        "load",
        "requests",
        "violate",
        "v/req",
        "accuracy",
        "acc/req",
        "workers",
        "solves",
        "wall s"
    );
    for (r, wall) in out.results.iter().zip(&out.wall_seconds) {
        let load: String = r.load.chars().rev().take(16).collect::<Vec<_>>().into_iter().rev().collect();
        println!(
            "{:<4} {:<26} {:>6} {:>4} {:>16} {:>8} {:>8.4} {:>8.4} {:>8.4} {:>8.4} {:>7.2} {:>6} {:>7.2}",
            r.run,
            r.system,
            r.slo_ms,
            r.workers,
            load,
            r.requests,
            r.violation_ratio,
            r.violation_ratio_per_request,
            r.accuracy,
            r.accuracy_per_request,
            r.workers_mean,
            r.solves,
            wall
        );
        if let Some(o) = &r.overloaded {
            println!("run {}: OVERLOADED: {o}", r.run);
        }
    }
    if let Some(dir) = out_dir {
        write_outputs(dir, &out)?;
        println!("wrote {}/{{results.json,timeseries.csv}}", dir.display());
    }
    Ok(())
}
