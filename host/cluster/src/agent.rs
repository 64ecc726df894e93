//! The agent role: owns devices and runs batches on them.
//!
//! An agent serves `POST /v2/models/{app}/versions/{variant}/infer` batches on its
//! devices (`sluice_server::executor::remote::serve_agent`), registers itself under
//! a lease at `agents/{id}` (address, devices, what is loaded, the placement epoch it
//! is ready for), and follows the placement and routing table:
//!
//! - it loads (and warms) every variant placement N assigns to it, then reports
//!   `ready_epoch = N` — the allocator publishes routing N only after that;
//! - it unloads a variant only when neither the newest placement nor the routing
//!   table in force uses it, and only [`UNLOAD_AFTER`] later, so batches a frontend
//!   sent under the old table still find it (make before break);
//! - when its lease is lost (a long pause, a partition), it registers again under a
//!   new one; when the store is unreachable it keeps serving what it has;
//! - on shutdown (SIGTERM, a Kubernetes PreStop) it reports `accepting = false`, waits
//!   until no routing table in force sends it traffic (at most the drain timeout),
//!   then revokes its lease and stops.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sluice_core::profile::Profile;
use sluice_server::config::{Config, ExecutorKind};
use sluice_server::executor::remote::{serve_agent, AgentModels};
use sluice_server::executor::LoadedModel;
use sluice_server::executor::ModelSource;
use sluice_server::state::resolve_models;

use crate::keys::{decode, encode, AgentRecord, DeviceInfo, Keys, Loaded, Placement, RoutingTable};
use crate::lease::KeptLease;
use crate::mirror::Mirror;
use crate::store::Store;

/// How long a variant no plan uses stays loaded: batches a frontend sent under the
/// previous routing table (at most its batch timeout in flight) still find it.
pub const UNLOAD_AFTER: Duration = Duration::from_secs(2);

/// How an agent runs.
#[derive(Clone, Debug)]
pub struct AgentOptions {
    /// Its id in the cluster.
    pub id: String,
    /// Its devices' types, in index order (each a `[[device]] type` of the config).
    pub devices: Vec<String>,
    /// The address frontends reach it at (`http://host:port`).
    pub advertise: String,
    /// Its lease's TTL, seconds.
    pub ttl_s: i64,
    /// The key layout.
    pub keys: Keys,
    /// At most this long draining at shutdown.
    pub drain: Duration,
}

/// How to load each (app, variant) on each device type.
struct Catalog {
    /// Per app: variant name → (model id, source on each device type).
    apps: BTreeMap<String, BTreeMap<String, (u32, ModelSource)>>,
    /// Per (device type, app, variant): the emulated latency table on that type.
    tables: BTreeMap<(String, String, String), Arc<Vec<u64>>>,
}

impl Catalog {
    fn build(config: &Config) -> anyhow::Result<Catalog> {
        let mut apps = BTreeMap::new();
        let mut tables = BTreeMap::new();
        let profiles: Vec<(String, Profile)> = config
            .devices
            .iter()
            .map(|d| Ok((d.kind.clone(), Profile::load(&d.profile).with_context(|| format!("device {}", d.kind))?)))
            .collect::<anyhow::Result<_>>()?;
        for app in &config.apps {
            let (models, sources) = resolve_models(app)?;
            let mut variants = BTreeMap::new();
            for (id, (m, s)) in models.iter().zip(sources.models).enumerate() {
                variants.insert(m.name.clone(), (id as u32, s));
                // An emulated variant runs its device type's profiled latency (as the
                // single process does with [[device]]s); a type without a profile for
                // it keeps the app's.
                if app.executor.unwrap_or(ExecutorKind::Emulated) == ExecutorKind::Emulated {
                    for (kind, p) in &profiles {
                        if let Some(mp) = p.model(&m.name) {
                            let mut t = mp.latency_table(app.latency_percentile);
                            if let Some(cap) = app.max_batch {
                                t.truncate(cap as usize);
                            }
                            if !t.is_empty() {
                                tables.insert((kind.clone(), app.name.clone(), m.name.clone()), Arc::new(t));
                            }
                        }
                    }
                }
            }
            apps.insert(app.name.clone(), variants);
        }
        Ok(Catalog { apps, tables })
    }

    /// Loads (blocking) `variant` of `app` for a device of type `kind`.
    fn load(&self, kind: &str, app: &str, variant: &str) -> anyhow::Result<(u32, LoadedModel)> {
        let (id, source) = self
            .apps
            .get(app)
            .and_then(|v| v.get(variant))
            .ok_or_else(|| anyhow::anyhow!("app `{app}` has no variant `{variant}` in this agent's config"))?;
        let model = match (source, self.tables.get(&(kind.to_string(), app.to_string(), variant.to_string()))) {
            (ModelSource::Emulated(_), Some(t)) => LoadedModel::Emulated(t.clone()),
            (s, _) => s.load()?,
        };
        Ok((*id, model))
    }
}

/// Runs an agent: serves batches on `listener` and follows the store until
/// `shutdown` resolves, then drains (see the module docs).
pub async fn run(
    store: Arc<dyn Store>,
    config: Config,
    options: AgentOptions,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    anyhow::ensure!(!options.devices.is_empty(), "agent {}: no devices (--devices cpu,cpu)", options.id);
    for kind in &options.devices {
        anyhow::ensure!(
            config.devices.iter().any(|d| &d.kind == kind),
            "agent {}: device type `{kind}` is not a [[device]] type of the config (known: {})",
            options.id,
            config.devices.iter().map(|d| d.kind.as_str()).collect::<Vec<_>>().join(", ")
        );
    }
    let catalog = Arc::new(Catalog::build(&config)?);
    let models = AgentModels::new(options.devices.len());
    models.ready.store(true, Ordering::Release);
    let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_agent(
        listener,
        models.clone(),
        async move {
            let _ = server_stopped.await;
        },
        Duration::from_secs(2),
    ));
    let mut agent = Agent {
        store: store.clone(),
        options: options.clone(),
        catalog,
        models: models.clone(),
        ready_epoch: 0,
        unwanted_since: BTreeMap::new(),
        accepting: true,
        published: None,
    };
    let placement = Mirror::start(store.clone(), options.keys.placement());
    let routing = Mirror::start(store.clone(), options.keys.routing());
    let mut lease = register(&store, &agent).await;
    let mut placement_rx = placement.subscribe();
    let mut routing_rx = routing.subscribe();
    tokio::pin!(shutdown);
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            _ = placement_rx.changed() => {}
            _ = routing_rx.changed() => {}
            _ = tick.tick() => {}
        }
        let p = read_key::<Placement>(&placement.current(), &options.keys.placement());
        let r = read_key::<RoutingTable>(&routing.current(), &options.keys.routing());
        agent.reconcile(p.as_ref(), r.as_ref()).await;
        // A lost lease (a pause longer than the TTL, a partition): register again.
        lease = match lease {
            Some(l) if !l.is_lost() => Some(l),
            _ => {
                agent.published = None;
                register(&store, &agent).await
            }
        };
        if let Some(l) = &lease {
            agent.publish(l.id).await;
        }
    }
    // Drain: stop taking new plans, say so, and wait until no routing table sends
    // this agent traffic (or the drain timeout).
    tracing::info!(agent = %options.id, "draining");
    agent.accepting = false;
    if let Some(l) = &lease {
        agent.published = None;
        agent.publish(l.id).await;
    }
    let me = options.id.clone();
    let routes_me = |s: &crate::mirror::Snapshot| {
        read_key::<RoutingTable>(s, &options.keys.routing())
            .is_some_and(|r| r.apps.values().flatten().any(|route| route.agent == me))
    };
    if routing.wait_for(options.drain, |s| !routes_me(s)).await.is_none() {
        tracing::warn!(agent = %options.id, "drain: still routed to after {:?}; stopping", options.drain);
    } else {
        // Batches sent under the previous table are still arriving for a moment.
        tokio::time::sleep(UNLOAD_AFTER.min(options.drain)).await;
    }
    models.ready.store(false, Ordering::Release);
    if let Some(l) = lease {
        l.revoke(store.as_ref()).await;
    }
    let _ = stop_server.send(());
    let _ = server.await;
    Ok(())
}

/// The record at `key` in a snapshot, if valid (an invalid one is logged and ignored).
pub(crate) fn read_key<T: for<'de> serde::Deserialize<'de>>(s: &crate::mirror::Snapshot, key: &str) -> Option<T> {
    let kv = s.kvs.get(key)?;
    match decode(key, &kv.value) {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::error!("{e}");
            None
        }
    }
}

/// Grants a lease and puts the agent's record under it (None: the store is
/// unreachable; the caller tries again on its next tick).
async fn register(store: &Arc<dyn Store>, agent: &Agent) -> Option<KeptLease> {
    let lease = match KeptLease::grant(store.clone(), agent.options.ttl_s).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(agent = %agent.options.id, "cannot register: {e}");
            return None;
        }
    };
    let key = agent.options.keys.agent(&agent.options.id);
    match store.put(&key, encode(&agent.record()), Some(lease.id)).await {
        Ok(_) => {
            tracing::info!(agent = %agent.options.id, lease = lease.id, "registered");
            Some(lease)
        }
        Err(e) => {
            tracing::warn!(agent = %agent.options.id, "cannot register: {e}");
            None
        }
    }
}

struct Agent {
    store: Arc<dyn Store>,
    options: AgentOptions,
    catalog: Arc<Catalog>,
    models: Arc<AgentModels>,
    ready_epoch: u64,
    /// Loaded variants no plan uses any more, and since when.
    unwanted_since: BTreeMap<Loaded, tokio::time::Instant>,
    accepting: bool,
    /// The record last put (None: put it again).
    published: Option<AgentRecord>,
}

impl Agent {
    fn record(&self) -> AgentRecord {
        let mut loaded: Vec<Loaded> =
            self.models.loaded().into_iter().map(|(device, app, variant)| Loaded { device, app, variant }).collect();
        loaded.sort();
        AgentRecord {
            id: self.options.id.clone(),
            addr: self.options.advertise.clone(),
            devices: self
                .options
                .devices
                .iter()
                .enumerate()
                .map(|(i, k)| DeviceInfo { index: i as u32, kind: k.clone() })
                .collect(),
            loaded,
            ready_epoch: self.ready_epoch,
            accepting: self.accepting,
        }
    }

    /// Puts the record if it changed.
    async fn publish(&mut self, lease: i64) {
        let record = self.record();
        if self.published.as_ref() == Some(&record) {
            return;
        }
        let key = self.options.keys.agent(&self.options.id);
        match self.store.put(&key, encode(&record), Some(lease)).await {
            Ok(_) => self.published = Some(record),
            Err(e) => tracing::warn!(agent = %self.options.id, "reporting to the store: {e}"),
        }
    }

    /// Loads what the placement assigns here, unloads (late) what nothing uses.
    async fn reconcile(&mut self, placement: Option<&Placement>, routing: Option<&RoutingTable>) {
        let me = self.options.id.as_str();
        let mut wanted: BTreeSet<Loaded> = BTreeSet::new();
        if let Some(p) = placement {
            wanted.extend(p.of_agent(me).map(|a| Loaded {
                device: a.device,
                app: a.app.clone(),
                variant: a.variant.clone(),
            }));
        }
        if let Some(r) = routing {
            for (app, routes) in &r.apps {
                wanted.extend(routes.iter().filter(|x| x.agent == me).map(|x| Loaded {
                    device: x.device,
                    app: app.clone(),
                    variant: x.variant.clone(),
                }));
            }
        }
        let loaded: BTreeSet<Loaded> =
            self.models.loaded().into_iter().map(|(device, app, variant)| Loaded { device, app, variant }).collect();
        for w in wanted.difference(&loaded) {
            let Some(kind) = self.options.devices.get(w.device as usize).cloned() else {
                tracing::error!(
                    agent = me,
                    "the placement names device {} but this agent has {}",
                    w.device,
                    self.options.devices.len()
                );
                continue;
            };
            let catalog = self.catalog.clone();
            let (app, variant) = (w.app.clone(), w.variant.clone());
            let started = std::time::Instant::now();
            let loaded = tokio::task::spawn_blocking(move || catalog.load(&kind, &app, &variant)).await;
            match loaded {
                Ok(Ok((id, model))) => {
                    if let Err(e) = self.models.install(w.device, &w.app, &w.variant, id, model) {
                        tracing::error!(agent = me, "installing {}/{}: {e}", w.app, w.variant);
                    } else {
                        tracing::info!(agent = me, device = w.device, app = %w.app, variant = %w.variant,
                            ms = started.elapsed().as_millis() as u64, "loaded");
                    }
                }
                Ok(Err(e)) => tracing::error!(agent = me, "loading {}/{}: {e:#}", w.app, w.variant),
                Err(e) => tracing::error!(agent = me, "loading {}/{}: {e}", w.app, w.variant),
            }
        }
        let now = tokio::time::Instant::now();
        for l in loaded.difference(&wanted) {
            let since = *self.unwanted_since.entry(l.clone()).or_insert(now);
            if now.duration_since(since) >= UNLOAD_AFTER {
                self.models.unload(l.device, &l.app, &l.variant);
                self.unwanted_since.remove(l);
                tracing::info!(agent = me, device = l.device, app = %l.app, variant = %l.variant, "unloaded");
            }
        }
        self.unwanted_since.retain(|l, _| !wanted.contains(l));
        // Ready for placement N once everything it assigns here is loaded.
        if let Some(p) = placement {
            let now_loaded: BTreeSet<Loaded> = self
                .models
                .loaded()
                .into_iter()
                .map(|(device, app, variant)| Loaded { device, app, variant })
                .collect();
            let all = p.of_agent(me).all(|a| {
                now_loaded.contains(&Loaded { device: a.device, app: a.app.clone(), variant: a.variant.clone() })
            });
            if all && p.epoch > self.ready_epoch {
                self.ready_epoch = p.epoch;
            }
        }
    }
}
