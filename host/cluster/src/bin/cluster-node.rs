//! One cluster role in a process, built with the cluster crate alone: the same
//! `serve --config FILE --role ROLE ...` arguments as `sluice serve --role`, for
//! working on this crate without building the whole CLI (the harness accepts
//! either binary). Deployments use `sluice serve --role`.

use std::path::PathBuf;
use std::time::Duration;

use sluice_cluster::roles::{Role, RoleOptions};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    anyhow::ensure!(args.next().as_deref() == Some("serve"), "usage: cluster-node serve --config FILE --role ROLE ...");
    let (mut config, mut role, mut etcd, mut id, mut devices, mut listen, mut ttl, mut timeout) =
        (None, None, Vec::new(), None, Vec::new(), None, 3, 2000u64);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| anyhow::anyhow!("{flag}: a value is missing"))?;
        match flag.as_str() {
            "--config" => config = Some(PathBuf::from(value)),
            "--role" => {
                role = Some(match value.as_str() {
                    "agent" => Role::Agent,
                    "frontend" => Role::Frontend,
                    "allocator" => Role::Allocator,
                    other => anyhow::bail!("--role: unknown role `{other}`"),
                })
            }
            "--etcd" => etcd = value.split(',').map(str::to_string).collect(),
            "--id" => id = Some(value),
            "--devices" => devices = value.split(',').map(str::to_string).collect(),
            "--listen" => listen = Some(value.parse()?),
            "--lease-ttl" => ttl = value.parse()?,
            "--batch-timeout-ms" => timeout = value.parse()?,
            other => anyhow::bail!("unknown flag {other}"),
        }
    }
    let path = config.ok_or_else(|| anyhow::anyhow!("--config is required"))?;
    let mut config = sluice_server::config::Config::load(&path)?;
    if let Some(l) = listen {
        config.listen = l;
    }
    let options = RoleOptions {
        role: role.ok_or_else(|| anyhow::anyhow!("--role is required"))?,
        etcd,
        id,
        devices,
        advertise: None,
        lease_ttl_s: ttl,
        batch_timeout: Duration::from_millis(timeout),
        prefix: "/sluice/v1".into(),
    };
    tracing_init();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(sluice_cluster::roles::serve(config, options, async {
        let _ = tokio::signal::ctrl_c().await;
    }))
}

/// Logs to stderr (the harness keeps each process's in its log file), at `RUST_LOG`.
fn tracing_init() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
}
