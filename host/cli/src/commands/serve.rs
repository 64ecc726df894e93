//! `sluice serve`: builds the apps of a config and serves them until SIGINT or
//! SIGTERM ([`sluice_server::server::run`]), then drains.

use std::path::PathBuf;

use anyhow::Context;
use sluice_server::config::Config;

/// `sluice serve` arguments.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Config file (TOML); see README "Config reference".
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Listen address, overriding the config (`127.0.0.1:0` picks a free port).
    #[arg(long)]
    pub listen: Option<std::net::SocketAddr>,
    /// Log every accepted arrival (`app,arrival_us`) for `sluice sim` to replay.
    #[arg(long)]
    pub record_arrivals: Option<PathBuf>,
}

/// Runs `sluice serve`.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let ServeArgs { config, listen, record_arrivals } = args;
    let mut config = match &config {
        Some(path) => Config::load(path)?,
        None => Config::embedded_default()?,
    };
    if let Some(addr) = listen {
        config.listen = addr;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let addr = config.listen;
        let state = sluice_server::state::State::build(config).await?;
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
        sluice_server::server::run(listener, state, shutdown).await
    })
}
