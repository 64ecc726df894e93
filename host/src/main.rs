//! The `sluice` command: parses arguments, sets up logging, calls into the library.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

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
    Serve {
        /// Config file (TOML); see README "Config reference".
        #[arg(long)]
        config: Option<PathBuf>,
        /// Listen address, overriding the config (`127.0.0.1:0` picks a free port).
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
        /// Log every accepted arrival (`app,arrival_us`) for `sluice sim` to replay.
        #[arg(long)]
        record_arrivals: Option<PathBuf>,
    },
    /// Measure model latency per batch size and write a profile.
    Profile(sluice::profiling::ProfileArgs),
    /// Send load to a running server (open or closed loop), optionally swapping policies.
    Loadgen(sluice::loadgen::LoadArgs),
    /// Simulate an experiment in virtual time with the real policy components.
    Sim(sluice::sim::SimArgs),
    /// ModelSwitching: build its load → model table by simulation.
    ModelSwitching(sluice::model_switching_cli::ModelSwitchingArgs),
    /// RAMSIS: generate MDP model-selection policies, convert the artifact's profiles.
    Ramsis(sluice::ramsis_cli::RamsisArgs),
    /// Spread-drop guarantees: the maximum sustainable rates of Theorems 1 and 2.
    SpreadDrop(sluice::spread_drop_cli::SpreadDropArgs),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,ort=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Serve { config, listen, record_arrivals } => serve(config, listen, record_arrivals),
        Command::Profile(args) => sluice::profiling::run(args),
        Command::Sim(args) => sluice::sim::run(args),
        Command::ModelSwitching(args) => sluice::model_switching_cli::run(args),
        Command::Ramsis(args) => sluice::ramsis_cli::run(args),
        Command::SpreadDrop(args) => sluice::spread_drop_cli::run(args),
        Command::Loadgen(args) => {
            let json = args.json;
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            let summary = runtime.block_on(sluice::loadgen::run(args))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&summary)?);
            } else {
                sluice::loadgen::print_summary(&summary);
            }
            Ok(())
        }
    }
}

fn serve(
    config: Option<PathBuf>,
    listen: Option<std::net::SocketAddr>,
    record_arrivals: Option<PathBuf>,
) -> anyhow::Result<()> {
    let mut config = match &config {
        Some(path) => sluice::config::Config::load(path)?,
        None => sluice::config::Config::embedded_default()?,
    };
    if let Some(addr) = listen {
        config.listen = addr;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let addr = config.listen;
        let state = sluice::server::State::build(config).await?;
        if let Some(path) = &record_arrivals {
            state.record_arrivals(path).with_context(|| format!("--record-arrivals {}", path.display()))?;
        }
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("cannot listen on {addr}"))?;
        // Printed on stdout (logs go to stderr) so scripts can find the port.
        println!("sluice listening on http://{}", listener.local_addr()?);
        let shutdown = async {
            let ctrl_c = tokio::signal::ctrl_c();
            #[cfg(unix)]
            {
                let mut term =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
                tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
            }
            #[cfg(not(unix))]
            let _ = ctrl_c.await;
        };
        sluice::server::run(listener, state, shutdown).await
    })
}
