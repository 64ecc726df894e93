//! `sluice serve --role ...`: one process playing one role, connected to etcd.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sluice_server::config::Config;

use crate::keys::Keys;
use crate::store::{EtcdCredentials, EtcdStore, Store, StoreError};

/// A cluster role.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    /// Runs batches on its devices ([`crate::agent`]).
    Agent,
    /// The apps' front, queues and policies ([`crate::frontend`]).
    Frontend,
    /// Plans placement and routing; one leads by election ([`crate::allocator`]).
    Allocator,
}

/// What `sluice serve --role ...` was given.
#[derive(Clone, Debug)]
pub struct RoleOptions {
    /// The role.
    pub role: Role,
    /// etcd endpoints.
    pub etcd: Vec<String>,
    /// This process's id (None: `{HOSTNAME}-{pid}`).
    pub id: Option<String>,
    /// An agent's device types.
    pub devices: Vec<String>,
    /// The address others reach this process at (None: the listen address).
    pub advertise: Option<String>,
    /// Lease TTL, seconds.
    pub lease_ttl_s: i64,
    /// A frontend's bound on one batch.
    pub batch_timeout: Duration,
    /// The keys' root.
    pub prefix: String,
}

/// The role's store: etcd at `options.etcd` as `credentials`, read once under the
/// keys' root so that a refusal by etcd's authentication (no credentials where it is
/// on, wrong ones, a role without the prefix) ends the role at once with etcd's
/// reason, instead of a role that retries forever and never says why. An
/// unreachable store is not checked here: roles wait for it.
pub async fn connect(options: &RoleOptions, credentials: Option<&EtcdCredentials>) -> anyhow::Result<Arc<dyn Store>> {
    let at = || format!("etcd at {}", options.etcd.join(","));
    let store = EtcdStore::connect_as(&options.etcd, credentials).await.with_context(at)?;
    match store.get(&Keys::new(&options.prefix).routing()).await {
        Err(e @ StoreError::Auth(_)) => Err(anyhow::Error::new(e).context(at())),
        _ => Ok(Arc::new(store)),
    }
}

/// How long a frontend waits at startup for the allocator's first routing table.
const FIRST_PLAN_TIMEOUT: Duration = Duration::from_secs(120);

/// How long agents get to load a placement.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long an agent drains at shutdown at most (Kubernetes' default grace is 30 s).
const AGENT_DRAIN: Duration = Duration::from_secs(20);

/// Runs one role until `shutdown` (then drains as the role does).
///
/// etcd credentials come from the environment ([`EtcdCredentials::from_env`]:
/// `SLUICE_ETCD_USER` and `SLUICE_ETCD_PASSWORD_FILE`, or `SLUICE_ETCD_PASSWORD`),
/// so that no password is on a command line.
pub async fn serve(config: Config, options: RoleOptions, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    anyhow::ensure!(options.lease_ttl_s >= 1, "--lease-ttl: expected at least 1 s");
    let credentials = EtcdCredentials::from_env().map_err(anyhow::Error::msg)?;
    let store = connect(&options, credentials.as_ref()).await?;
    let id = options.id.clone().unwrap_or_else(|| {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "sluice".into());
        format!("{host}-{}", std::process::id())
    });
    let keys = Keys::new(&options.prefix);
    match options.role {
        Role::Agent => {
            let listener = tokio::net::TcpListener::bind(config.listen)
                .await
                .with_context(|| format!("cannot listen on {}", config.listen))?;
            let local = listener.local_addr()?;
            let advertise = options.advertise.clone().unwrap_or_else(|| format!("http://{local}"));
            println!("sluice agent {id} listening on http://{local}");
            let agent = crate::agent::AgentOptions {
                id,
                devices: options.devices.clone(),
                advertise,
                ttl_s: options.lease_ttl_s,
                keys,
                drain: AGENT_DRAIN,
            };
            crate::agent::run(store, config, agent, listener, shutdown).await
        }
        Role::Frontend => {
            let listener = tokio::net::TcpListener::bind(config.listen)
                .await
                .with_context(|| format!("cannot listen on {}", config.listen))?;
            let admin = match config.admin_listen {
                Some(a) => {
                    Some(tokio::net::TcpListener::bind(a).await.with_context(|| format!("cannot listen on {a}"))?)
                }
                None => None,
            };
            let local = listener.local_addr()?;
            let frontend = crate::frontend::FrontendOptions {
                id: id.clone(),
                ttl_s: options.lease_ttl_s,
                keys,
                batch_timeout: options.batch_timeout,
                first_plan_timeout: FIRST_PLAN_TIMEOUT,
            };
            println!("sluice frontend {id} listening on http://{local}");
            crate::frontend::run(store, config, frontend, listener, admin, shutdown).await
        }
        Role::Allocator => {
            println!("sluice allocator {id} campaigning");
            let allocator = crate::allocator::AllocatorOptions {
                id,
                ttl_s: options.lease_ttl_s,
                keys,
                ready_timeout: READY_TIMEOUT,
            };
            crate::allocator::run(store, config, allocator, Default::default(), shutdown).await
        }
    }
}
