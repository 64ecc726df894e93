//! `sluice serve`: builds the apps of a config and serves them until SIGINT or
//! SIGTERM ([`sluice_server::server::run_listeners`]: HTTP, and gRPC with
//! `--grpc-listen`), then drains.

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
    /// Serve `/admin` and `/metrics` on this address only, overriding `admin_listen`.
    #[arg(long)]
    pub admin_listen: Option<std::net::SocketAddr>,
    /// Also serve the KServe v2 gRPC protocol on this address, overriding `grpc_listen`.
    #[arg(long)]
    pub grpc_listen: Option<std::net::SocketAddr>,
    /// Log every arrival (`app,arrival_us`, `,refused` when refused) for `sluice sim` to replay.
    #[arg(long)]
    pub record_arrivals: Option<PathBuf>,
    /// Where uploaded policies are kept, overriding `policy_dir`.
    #[arg(long)]
    pub policy_dir: Option<PathBuf>,
    /// Where the built-in components are, overriding `builtin_policy_dir`.
    #[arg(long)]
    pub builtin_policy_dir: Option<PathBuf>,
    /// The ONNX Runtime library, overriding `onnxruntime`.
    #[arg(long)]
    pub onnxruntime: Option<PathBuf>,
    /// Graceful shutdown's grace, overriding `shutdown_grace_ms`.
    #[arg(long)]
    pub shutdown_grace_ms: Option<u64>,
    /// Open connections at most, overriding `max_connections`.
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// Largest request body, overriding `max_body_bytes`.
    #[arg(long)]
    pub max_body_bytes: Option<usize>,
    /// Cluster roles (docs/cluster.md); without `--role`, one process plays them all.
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// `sluice serve --role ...`: one role of a cluster coordinated through etcd.
#[derive(clap::Args, Debug)]
pub struct ClusterArgs {
    /// `agent` (runs batches on its devices), `frontend` (the apps' front, queues and
    /// policies) or `allocator` (plans placement and routing; one leads by election).
    #[arg(long, value_enum, requires = "etcd")]
    pub role: Option<sluice_cluster::roles::Role>,
    /// etcd endpoints, comma-separated (`http://10.0.0.1:2379,http://10.0.0.2:2379`).
    #[arg(long, value_delimiter = ',')]
    pub etcd: Vec<String>,
    /// This process's id in the cluster (default: the host name and the pid).
    #[arg(long)]
    pub id: Option<String>,
    /// An agent's devices: their `[[device]]` types, comma-separated (`cpu,cpu`).
    #[arg(long, value_delimiter = ',')]
    pub devices: Vec<String>,
    /// The address others reach this process at (default: the listen address).
    #[arg(long)]
    pub advertise: Option<String>,
    /// TTL of this process's lease in etcd, seconds: how soon its death is noticed.
    #[arg(long, default_value_t = 3)]
    pub lease_ttl: i64,
    /// A frontend's bound on one batch on an agent, ms.
    #[arg(long, default_value_t = 2000)]
    pub batch_timeout_ms: u64,
    /// The root of the cluster's keys in etcd.
    #[arg(long, default_value = "/sluice/v1")]
    pub etcd_prefix: String,
}

/// Runs `sluice serve`.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let ServeArgs {
        config,
        listen,
        admin_listen,
        grpc_listen,
        record_arrivals,
        policy_dir,
        builtin_policy_dir,
        onnxruntime,
        shutdown_grace_ms,
        max_connections,
        max_body_bytes,
        cluster,
    } = args;
    let mut config = match &config {
        Some(path) => Config::load(path)?,
        None => Config::embedded_default()?,
    };
    // Command-line values win over the file's (paths relative to the current
    // directory, as on any command line).
    if let Some(addr) = listen {
        config.listen = addr;
    }
    if let Some(addr) = admin_listen {
        config.admin_listen = Some(addr);
    }
    if let Some(addr) = grpc_listen {
        config.grpc_listen = Some(addr);
    }
    if let Some(d) = policy_dir {
        config.policy_dir = d;
    }
    if let Some(d) = builtin_policy_dir {
        config.builtin_policy_dir = d;
    }
    if let Some(p) = onnxruntime {
        config.onnxruntime = Some(p);
    }
    if let Some(ms) = shutdown_grace_ms {
        config.shutdown_grace_ms = ms;
    }
    if let Some(n) = max_connections {
        anyhow::ensure!(n > 0, "--max-connections: expected at least 1");
        config.max_connections = n;
    }
    if let Some(n) = max_body_bytes {
        anyhow::ensure!(
            n > 0 && n <= config.body_budget_bytes,
            "--max-body-bytes: expected 1 to body_budget_bytes ({})",
            config.body_budget_bytes
        );
        config.max_body_bytes = n;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    if let Some(role) = cluster.role {
        let options = sluice_cluster::roles::RoleOptions {
            role,
            etcd: cluster.etcd,
            id: cluster.id,
            devices: cluster.devices,
            advertise: cluster.advertise,
            lease_ttl_s: cluster.lease_ttl,
            batch_timeout: std::time::Duration::from_millis(cluster.batch_timeout_ms),
            prefix: cluster.etcd_prefix,
        };
        return runtime.block_on(sluice_cluster::roles::serve(config, options, shutdown_signal()));
    }
    runtime.block_on(async move {
        let addr = config.listen;
        let config_admin = config.admin_listen;
        let config_grpc = config.grpc_listen;
        let state = sluice_server::state::State::build(config).await?;
        // What-if evaluations replay through the simulator (the server does not
        // import it: this is where the two meet).
        state.set_replayer(std::sync::Arc::new(sluice_sim::whatif::SimReplayer));
        if let Some(path) = &record_arrivals {
            state.record_arrivals(path).with_context(|| format!("--record-arrivals {}", path.display()))?;
        }
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("cannot listen on {addr}"))?;
        let admin = match config_admin {
            Some(a) => Some(tokio::net::TcpListener::bind(a).await.with_context(|| format!("cannot listen on {a}"))?),
            None => None,
        };
        let grpc = match config_grpc {
            Some(a) => Some(tokio::net::TcpListener::bind(a).await.with_context(|| format!("cannot listen on {a}"))?),
            None => None,
        };
        // Printed on stdout (logs go to stderr) so scripts can find the ports.
        println!("sluice listening on http://{}", listener.local_addr()?);
        if let Some(a) = &admin {
            println!("sluice admin listening on http://{}", a.local_addr()?);
        }
        if let Some(g) = &grpc {
            println!("sluice gRPC listening on {}", g.local_addr()?);
        }
        let listeners = sluice_server::server::Listeners { main: listener, admin, grpc };
        sluice_server::server::run_listeners(listeners, state, shutdown_signal()).await
    })
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
