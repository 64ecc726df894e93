//! The frontend role: the apps' HTTP front, deadline queues and policies as in the
//! single process, with every batch run on an agent.
//!
//! A frontend builds its apps from the config as `sluice serve` does, with each
//! app's workers as *routing slots*: one slot per device the routing table gives
//! the app (the app's `workers` is the most devices it can be spread over). A slot's
//! worker keeps its queue and policy; its executor is a
//! `sluice_server::executor::remote::RemoteExecutor` for the slot's (agent, device,
//! variant), and the app's weighted router sends each slot the device's share.
//!
//! - A new routing table is applied make before break: slots keep their routing keys
//!   (`{agent}/{device}`) across tables, new keys take free slots and get their
//!   executors installed first, then every app's weights switch at once. A slot that
//!   lost its route keeps its old executor and drains its queue with weight 0.
//! - An agent whose record vanishes (its lease lapsed) gets weight 0 at once, before
//!   the allocator re-plans; a batch that fails on an agent is retried once on
//!   another device serving the same variant.
//! - Every second the frontend publishes each app's arrival rate under its lease
//!   (`demand/{frontend}/{app}`) and the routing epoch it serves on.
//! - When the store is unreachable it keeps serving on the last table it saw.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use sluice_core::executor::{Executor, ModelSet};
use sluice_core::router::RouterMode;
use sluice_server::config::Config;
use sluice_server::executor::remote::{AgentPool, Fallback, RemoteExecutor, RemoteTarget};
use sluice_server::state::State;

use crate::agent::read_key;
use crate::keys::{decode, encode, AgentRecord, DemandRecord, FrontendRecord, Keys, Route, RoutingTable};
use crate::lease::KeptLease;
use crate::mirror::{Mirror, Snapshot};
use crate::store::Store;

/// How a frontend runs.
#[derive(Clone, Debug)]
pub struct FrontendOptions {
    /// Its id in the cluster.
    pub id: String,
    /// Its lease's TTL, seconds.
    pub ttl_s: i64,
    /// The key layout.
    pub keys: Keys,
    /// How long one batch may take on an agent before it counts as failed (a frozen
    /// agent answers nothing; this bounds what its requests wait).
    pub batch_timeout: Duration,
    /// How long to wait at startup for the first routing table.
    pub first_plan_timeout: Duration,
}

/// What a frontend's slot runs now.
#[derive(Clone, Debug, PartialEq)]
struct Installed {
    key: String,
    agent: String,
    addr: String,
    device: u32,
    variant: String,
}

/// A frontend (see the module docs).
pub struct Frontend {
    /// The apps, as in the single process.
    pub state: Arc<State>,
    options: FrontendOptions,
    pool: Arc<AgentPool>,
    table: ArcSwap<RoutingTable>,
    live: ArcSwap<BTreeSet<String>>,
    slots: tokio::sync::Mutex<BTreeMap<String, Vec<Option<Installed>>>>,
    weights: Mutex<BTreeMap<String, Vec<f64>>>,
    /// Routing tables applied.
    pub swaps: AtomicU64,
    /// Times an agent's disappearance moved traffic off it before a new plan.
    pub agent_removals: AtomicU64,
    /// Woken after each swap, so the frontend's record says at once which epoch it serves.
    swapped: tokio::sync::Notify,
}

/// Makes a server config a frontend's: every app routes by weights (the plan's
/// shares), and `[[device]]`s are the allocator's and agents' business, not planned
/// here.
pub fn frontend_config(mut config: Config) -> Config {
    for app in &mut config.apps {
        app.router = RouterMode::Weighted;
        app.weights = None;
    }
    config.devices.clear();
    config
}

impl Frontend {
    /// Builds the apps (their local models are replaced by remote executors when the
    /// first routing table is applied).
    pub async fn build(config: Config, options: FrontendOptions) -> anyhow::Result<Arc<Frontend>> {
        let state = State::build(frontend_config(config)).await?;
        let slots = state.apps.iter().map(|(n, a)| (n.clone(), vec![None; a.workers.len()])).collect();
        Ok(Arc::new(Frontend {
            state,
            options,
            pool: AgentPool::new(),
            table: ArcSwap::from_pointee(RoutingTable::default()),
            live: ArcSwap::from_pointee(BTreeSet::new()),
            slots: tokio::sync::Mutex::new(slots),
            weights: Mutex::new(BTreeMap::new()),
            swaps: AtomicU64::new(0),
            agent_removals: AtomicU64::new(0),
            swapped: tokio::sync::Notify::new(),
        }))
    }

    /// The routing epoch in force (0: none yet).
    pub fn epoch(&self) -> u64 {
        self.table.load().epoch
    }

    /// Batches retried on another agent.
    pub fn retried(&self) -> u64 {
        self.pool.retried.load(Ordering::Relaxed)
    }

    /// Another device serving `failed`'s app and variant on another live agent, the
    /// one with the largest share. Not the failed agent's other devices: a batch
    /// fails over on a transport failure, and a dead agent's lease outlives it by up
    /// to a TTL, so a retry there failed too (13–17 % of the demo's requests got 500
    /// after an agent was killed).
    fn fallback(self: &Arc<Self>) -> Fallback {
        let me = Arc::downgrade(self);
        Arc::new(move |failed: &RemoteTarget| {
            let fe = me.upgrade()?;
            let table = fe.table.load();
            let live = fe.live.load();
            table
                .apps
                .get(&failed.app)?
                .iter()
                .filter(|r| r.variant == failed.variant && live.contains(&r.agent))
                .filter(|r| r.addr != failed.addr)
                .max_by(|a, b| a.share.total_cmp(&b.share))
                .map(|r| RemoteTarget {
                    addr: r.addr.clone(),
                    device: r.device,
                    app: failed.app.clone(),
                    variant: r.variant.clone(),
                })
        })
    }

    /// Applies a routing table (make before break; see the module docs).
    pub async fn apply(self: &Arc<Self>, table: RoutingTable) {
        let mut slots = self.slots.lock().await;
        for (name, app) in &self.state.apps {
            let routes: Vec<&Route> = table.apps.get(name).map(|r| r.iter().collect()).unwrap_or_default();
            let current = slots.get_mut(name).expect("a slot list per app");
            let mut assigned: Vec<Option<&Route>> = vec![None; current.len()];
            let mut placed: BTreeSet<&str> = BTreeSet::new();
            // Keys keep their slots.
            for (i, s) in current.iter().enumerate() {
                if let Some(s) = s {
                    if let Some(r) = routes.iter().copied().find(|r| r.key == s.key) {
                        assigned[i] = Some(r);
                        placed.insert(r.key.as_str());
                    }
                }
            }
            // New keys take free slots: never used ones first, then ones whose key left.
            let mut free: Vec<usize> = (0..current.len()).filter(|&i| assigned[i].is_none()).collect();
            free.sort_by_key(|&i| current[i].is_some());
            let mut free = free.into_iter();
            for r in routes.iter().copied().filter(|r| !placed.contains(r.key.as_str())) {
                match free.next() {
                    Some(i) => assigned[i] = Some(r),
                    None => tracing::error!(
                        app = %name,
                        key = %r.key,
                        "the routing table gives the app more devices than it has workers ({}); raise `workers`",
                        current.len()
                    ),
                }
            }
            // Make: install the executors of slots whose route changed.
            for (i, r) in assigned.iter().enumerate() {
                let Some(r) = r else { continue };
                let want = Installed {
                    key: r.key.clone(),
                    agent: r.agent.clone(),
                    addr: r.addr.clone(),
                    device: r.device,
                    variant: r.variant.clone(),
                };
                if current[i].as_ref() == Some(&want) {
                    continue;
                }
                let Some(id) = app.models.iter().position(|m| m.name == r.variant) else {
                    tracing::error!(app = %name, variant = %r.variant, "the routing table names a variant the app does not have");
                    continue;
                };
                let target = RemoteTarget {
                    addr: r.addr.clone(),
                    device: r.device,
                    app: name.clone(),
                    variant: r.variant.clone(),
                };
                let exec: Arc<dyn Executor> = Arc::new(RemoteExecutor::new(
                    target,
                    self.pool.clone(),
                    self.options.batch_timeout,
                    Some(self.fallback()),
                ));
                let set = ModelSet::new(BTreeMap::from([(id as u32, exec)]));
                // The worker installs it on its own thread; waiting for that on a
                // blocking thread tells tokio that work is under way, so a paused clock
                // (`crate::simulate`) does not jump ahead meanwhile. The cost: one
                // blocking-pool handoff per changed slot, per plan.
                let (worker_app, handle) = (app.clone(), tokio::runtime::Handle::current());
                let installed =
                    tokio::task::spawn_blocking(move || handle.block_on(worker_app.install_models(i, set))).await;
                match installed {
                    Ok(Ok(())) => current[i] = Some(want),
                    Ok(Err(e)) => tracing::error!(app = %name, slot = i, "installing the remote executor: {e}"),
                    Err(e) => {
                        tracing::error!(app = %name, slot = i, "installing the remote executor: the install task failed: {e}")
                    }
                }
            }
            let shares: Vec<f64> = assigned.iter().map(|r| r.map_or(0.0, |r| r.share.max(0.0))).collect();
            self.weights.lock().insert(name.clone(), shares);
        }
        drop(slots);
        self.table.store(Arc::new(table));
        // Break: the weights switch, every app at once.
        self.reweight();
        self.swaps.fetch_add(1, Ordering::Relaxed);
        self.swapped.notify_one();
    }

    /// Sets every app's weights: the plan's shares, 0 for slots on agents that are
    /// gone. An app all of whose devices are gone keeps its weights (its batches fail
    /// with a reason, or find a fallback, until the allocator re-plans).
    fn reweight(&self) {
        let live = self.live.load();
        let slots = match self.slots.try_lock() {
            Ok(s) => s.clone(),
            Err(_) => return, // `apply` is running and reweights when done
        };
        let weights = self.weights.lock().clone();
        for (name, app) in &self.state.apps {
            let Some(shares) = weights.get(name) else { continue };
            let Some(installed) = slots.get(name) else { continue };
            let w: Vec<f64> = shares
                .iter()
                .zip(installed)
                .map(|(s, i)| if i.as_ref().is_some_and(|i| live.contains(&i.agent)) { *s } else { 0.0 })
                .collect();
            if w.iter().sum::<f64>() <= 0.0 {
                continue;
            }
            if let Err(e) = app.router.set_weights(&w) {
                tracing::error!(app = %name, "setting weights: {e}");
            }
        }
    }

    /// Takes note of the live agents; traffic leaves the ones that are gone.
    fn set_live(&self, agents: &Snapshot) {
        let live: BTreeSet<String> =
            agents.kvs.iter().filter_map(|(k, kv)| decode::<AgentRecord>(k, &kv.value).ok()).map(|r| r.id).collect();
        let before = self.live.load();
        // While the store is unreachable, nothing is known to have died.
        if !agents.live && !before.is_empty() {
            return;
        }
        if before.difference(&live).next().is_some() {
            self.agent_removals.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(gone = ?before.difference(&live).collect::<Vec<_>>(), "agents left: moving their traffic");
        }
        self.live.store(Arc::new(live));
        self.reweight();
    }
}

/// Runs a frontend: waits for the first routing table, serves on `listener` (and
/// `admin`) until `shutdown`, following the store (see the module docs).
pub async fn run(
    store: Arc<dyn Store>,
    config: Config,
    options: FrontendOptions,
    listener: tokio::net::TcpListener,
    admin: Option<tokio::net::TcpListener>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let fe = Frontend::build(config, options.clone()).await?;
    let routing = Mirror::start(store.clone(), options.keys.routing());
    let agents = Mirror::start(store.clone(), options.keys.agents());
    let key = options.keys.routing();
    let first = routing
        .wait_for(options.first_plan_timeout, |s| read_key::<RoutingTable>(s, &key).is_some())
        .await
        .ok_or_else(|| {
            anyhow::anyhow!(
                "frontend {}: no routing table within {:?} (is an allocator running?)",
                options.id,
                options.first_plan_timeout
            )
        })?;
    if let Some(a) = agents.wait_for(Duration::from_secs(5), |s| s.revision > 0).await {
        fe.set_live(&a);
    }
    // The dashboard's cluster card, from this frontend's mirrors (they live until `run` returns).
    let leader = Mirror::start(store.clone(), options.keys.election());
    let frontends = Mirror::start(store.clone(), options.keys.frontends());
    let _ = fe.state.cluster_view.set(cluster_view(&fe, &agents, &leader, &frontends));
    fe.apply(read_key::<RoutingTable>(&first, &key).expect("checked")).await;
    tracing::info!(frontend = %options.id, epoch = fe.epoch(), "serving on the first routing table");
    let follow = tokio::spawn(follow(fe.clone(), routing, agents));
    let addr = listener.local_addr()?.to_string();
    let report = tokio::spawn(report(store.clone(), fe.clone(), addr));
    let result = sluice_server::server::run_with_admin(listener, admin, fe.state.clone(), shutdown).await;
    follow.abort();
    report.abort();
    result
}

/// What `GET /admin/dashboard` shows of the cluster from this frontend: the roles
/// (the leading allocator, the frontends, the agents with their devices, what each
/// device has loaded and the routes to it), each agent's health as the frontend
/// judges it, and the routing table in force. Read from the mirrors the frontend
/// keeps anyway (agents) or keeps for this (the election key, the frontends), so a
/// poll costs no store round trip; while the store is unreachable it shows the
/// last state seen, and says so (`store.reachable`).
///
/// Allocators other than the leader are not in the store (a standby only watches
/// the election key), so only the leader is named.
fn cluster_view(
    fe: &Arc<Frontend>,
    agents: &Mirror,
    leader: &Mirror,
    frontends: &Mirror,
) -> sluice_server::state::ClusterView {
    let me = Arc::downgrade(fe);
    let (agents, leader, frontends) = (agents.subscribe(), leader.subscribe(), frontends.subscribe());
    Box::new(move || {
        let Some(fe) = me.upgrade() else { return serde_json::json!({ "role": "frontend" }) };
        let table = fe.table.load();
        let live = fe.live.load();
        let (agents, leader, frontends) =
            (agents.borrow().clone(), leader.borrow().clone(), frontends.borrow().clone());
        let election = fe.options.keys.election();
        let leader_id = leader.kvs.get(&election).map(|kv| String::from_utf8_lossy(&kv.value).into_owned());
        let records: Vec<AgentRecord> =
            agents.kvs.iter().filter_map(|(k, kv)| decode::<AgentRecord>(k, &kv.value).ok()).collect();
        let routes_to = |agent: &str, device: u32| -> Vec<serde_json::Value> {
            table
                .apps
                .iter()
                .flat_map(|(app, routes)| routes.iter().map(move |r| (app, r)))
                .filter(|(_, r)| r.agent == agent && r.device == device)
                .map(|(app, r)| serde_json::json!({ "app": app, "variant": r.variant, "share": r.share }))
                .collect()
        };
        let mut agent_views: Vec<serde_json::Value> = records
            .iter()
            .map(|a| {
                let health = if !live.contains(&a.id) {
                    "unrouted"
                } else if !a.accepting {
                    "draining"
                } else if a.ready_epoch < table.epoch {
                    "loading"
                } else {
                    "ready"
                };
                let devices: Vec<serde_json::Value> = a
                    .devices
                    .iter()
                    .map(|d| {
                        let loaded: Vec<serde_json::Value> = a
                            .loaded
                            .iter()
                            .filter(|l| l.device == d.index)
                            .map(|l| serde_json::json!({ "app": l.app, "variant": l.variant }))
                            .collect();
                        serde_json::json!({
                            "index": d.index, "kind": d.kind, "loaded": loaded, "routes": routes_to(&a.id, d.index),
                        })
                    })
                    .collect();
                serde_json::json!({
                    "id": a.id, "addr": a.addr, "health": health, "accepting": a.accepting,
                    "ready_epoch": a.ready_epoch, "devices": devices,
                })
            })
            .collect();
        // Agents the routing table still names whose record is gone: their lease lapsed.
        let named: BTreeSet<&str> = table.apps.values().flatten().map(|r| r.agent.as_str()).collect();
        for gone in named.into_iter().filter(|id| records.iter().all(|a| a.id != *id)) {
            agent_views.push(serde_json::json!({
                "id": gone, "addr": null, "health": "gone", "accepting": false, "ready_epoch": null, "devices": [],
            }));
        }
        let frontend_views: Vec<serde_json::Value> = frontends
            .kvs
            .iter()
            .filter_map(|(k, kv)| decode::<FrontendRecord>(k, &kv.value).ok())
            .map(|f| {
                serde_json::json!({
                    "id": f.id, "addr": f.addr, "routing_epoch": f.routing_epoch, "this": f.id == fe.options.id,
                })
            })
            .collect();
        serde_json::json!({
            "role": "frontend",
            "id": fe.options.id,
            "leader": leader_id,
            "routing_epoch": table.epoch,
            "store": { "reachable": agents.live && leader.live, "revision": agents.revision.max(leader.revision) },
            "frontends": frontend_views,
            "agents": agent_views,
            "routing": &**table,
            "swaps": fe.swaps.load(Ordering::Relaxed),
            "agent_removals": fe.agent_removals.load(Ordering::Relaxed),
            "retried": fe.retried(),
        })
    })
}

/// Applies every new routing table and agent membership.
async fn follow(fe: Arc<Frontend>, routing: Mirror, agents: Mirror) {
    let key = fe.options.keys.routing();
    let mut r = routing.subscribe();
    let mut a = agents.subscribe();
    loop {
        tokio::select! {
            c = r.changed() => {
                if c.is_err() { return; }
                let snap = r.borrow_and_update().clone();
                if let Some(t) = read_key::<RoutingTable>(&snap, &key) {
                    if t.epoch != fe.epoch() {
                        tracing::info!(from = fe.epoch(), to = t.epoch, "new routing table");
                        fe.apply(t).await;
                    }
                }
            }
            c = a.changed() => {
                if c.is_err() { return; }
                let snap = a.borrow_and_update().clone();
                fe.set_live(&snap);
            }
        }
    }
}

/// Every second: each app's arrival rate and this frontend's routing epoch, under
/// its lease (granted again when lost).
async fn report(store: Arc<dyn Store>, fe: Arc<Frontend>, addr: String) {
    let keys = fe.options.keys.clone();
    let id = fe.options.id.clone();
    let mut lease: Option<KeptLease> = None;
    let arrivals = |app: &sluice_server::app::App| {
        app.counters.accepted.load(Ordering::Relaxed) + app.counters.rejected.load(Ordering::Relaxed)
    };
    let mut last: BTreeMap<String, u64> =
        fe.state.apps.iter().map(|(n, a)| (n.clone(), arrivals(a.as_ref()))).collect();
    let mut at = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let swapped = tokio::select! {
            _ = tick.tick() => false,
            _ = fe.swapped.notified() => true,
        };
        if lease.as_ref().is_none_or(KeptLease::is_lost) {
            lease = KeptLease::grant(store.clone(), fe.options.ttl_s).await.ok();
        }
        let Some(l) = &lease else { continue };
        if swapped {
            let record = FrontendRecord { id: id.clone(), addr: addr.clone(), routing_epoch: fe.epoch() };
            if let Err(e) = store.put(&keys.frontend(&id), encode(&record), Some(l.id)).await {
                tracing::debug!("publishing the frontend's record: {e}");
            }
            continue;
        }
        let now = tokio::time::Instant::now();
        let secs = now.duration_since(at).as_secs_f64().max(1e-3);
        at = now;
        let at_ms =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        for (name, app) in &fe.state.apps {
            let n = arrivals(app.as_ref());
            let before = last.insert(name.clone(), n).unwrap_or(n);
            let record = DemandRecord { qps: n.saturating_sub(before) as f64 / secs, at_ms };
            if let Err(e) = store.put(&keys.demand_of(&id, name), encode(&record), Some(l.id)).await {
                tracing::debug!("publishing demand: {e}");
            }
        }
        let record = FrontendRecord { id: id.clone(), addr: addr.clone(), routing_epoch: fe.epoch() };
        if let Err(e) = store.put(&keys.frontend(&id), encode(&record), Some(l.id)).await {
            tracing::debug!("publishing the frontend's record: {e}");
        }
    }
}
