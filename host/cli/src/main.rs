//! The `sluice` command: parses arguments, sets up logging, calls one subcommand
//! (`sluice::commands::*`, a file each).

use clap::{Parser, Subcommand};
use sluice::commands;

/// Inference serving with hot-swappable WebAssembly scheduling policies.
#[derive(Parser)]
#[command(name = "sluice", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the apps of a config (the embedded default without --config).
    Serve(commands::serve::ServeArgs),
    /// Measure model latency per batch size and write a profile.
    Profile(commands::profile::ProfileArgs),
    /// Send load to a running server (open or closed loop), optionally swapping policies.
    Loadgen(sluice_loadgen::LoadArgs),
    /// Simulate an experiment in virtual time with the real policy components.
    Sim(commands::sim::SimArgs),
    /// What-if: replay a recorded arrival log with a candidate policy and the current one.
    Evaluate(commands::evaluate::EvaluateArgs),
    /// ModelSwitching: build its load → model table by simulation.
    ModelSwitching(commands::model_switching::ModelSwitchingArgs),
    /// Solve an allocation problem (Proteus, InfAdapter) with the MILP allocator.
    Allocate(commands::allocate::AllocateArgs),
    /// RAMSIS: generate MDP model-selection policies, convert the artifact's profiles.
    Ramsis(commands::ramsis::RamsisArgs),
    /// Spread-drop guarantees: the maximum sustainable rates of Theorems 1 and 2.
    SpreadDrop(commands::spread_drop::SpreadDropArgs),
    /// Capacity planning: the fewest workers that meet an accuracy and a violation target.
    Plan(commands::plan::PlanArgs),
    /// A policy author's toolchain: new, build, check, bench, upload, swap.
    Policy(commands::policy::PolicyArgs),
}

/// jemalloc, not glibc's malloc: under a long run of large, varied request bodies
/// glibc's per-thread arenas kept what they had freed and resident memory only
/// grew; jemalloc's background threads give freed pages back once they have sat
/// unused for its decay time (10 s), so an idle server shrinks again
/// (`cargo bench -p sluice --bench memory`, BENCHMARKS §14).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,ort=warn".into()),
        )
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal, not in files and journals.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // Without background threads jemalloc purges only when a thread allocates, so
    // an idle server would keep its peak.
    if let Err(e) = tikv_jemalloc_ctl::background_thread::write(true) {
        tracing::warn!("jemalloc background threads not started ({e}): idle memory is returned only under load");
    }
    match Cli::parse().command {
        Command::Serve(args) => commands::serve::run(args),
        Command::Profile(args) => commands::profile::run(args),
        Command::Loadgen(args) => commands::loadgen::run(args),
        Command::Sim(args) => commands::sim::run(args),
        Command::Evaluate(args) => commands::evaluate::run(args),
        Command::ModelSwitching(args) => commands::model_switching::run(args),
        Command::Allocate(args) => commands::allocate::run(args),
        Command::Ramsis(args) => commands::ramsis::run(args),
        Command::SpreadDrop(args) => commands::spread_drop::run(args),
        Command::Plan(args) => commands::plan::run(args),
        Command::Policy(args) => commands::policy::run(args),
    }
}
