//! The allocator role: exactly one active, by election; it plans placement and
//! routing for the whole cluster with the same planner as the single process
//! (`sluice_alloc::planner::Planner`, Proteus §4 by default).
//!
//! While it leads, it mirrors the agents (membership: live, accepting agents and
//! their devices) and the frontends' demand, and re-plans when membership changes
//! (an agent joined, left, or lost its lease: an *agent failover* when the routing in
//! force used it), when a re-plan is asked for (a put on `control/replan`), and every
//! `[allocator] period_s` when an app's demand moved more than `threshold`.
//!
//! Each plan is published make before break:
//! 1. placement N+1 (every device's variant) is put, guarded by the election;
//! 2. agents load what it assigns them and report `ready_epoch = N+1`;
//! 3. one transaction, guarded by the election *and* the placement's revision,
//!    publishes routing table N+1; frontends swap to it atomically;
//! 4. agents unload what neither placement N+1 nor routing N+1 uses.
//!
//! The plan's devices (`cpu-0`, `cpu-1`, ... per type) are mapped onto the live
//! agents' devices stably: a device keeps its (app, variant) when the new plan still
//! has one like it, so routing keys (`{agent}/{device}`) survive re-plans.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sluice_alloc::config::{DeviceConfig, DevicePool};
use sluice_alloc::planner::Planner;
use sluice_alloc::{proteus, AnyPlan};
use sluice_server::config::Config;
use sluice_server::state::resolve_models;

use crate::election;
use crate::keys::{
    decode, encode, route_key, AgentRecord, Assignment, DemandRecord, Keys, Placement, Route, RoutingTable,
};
use crate::lease::KeptLease;
use crate::mirror::{Mirror, Snapshot};
use crate::store::{Compare, Op, Store, Txn};

/// How the allocator runs.
#[derive(Clone, Debug)]
pub struct AllocatorOptions {
    /// Its id (what the election key holds while it leads).
    pub id: String,
    /// Its lease's TTL, seconds: a crashed leader is replaced within about this long.
    pub ttl_s: i64,
    /// The key layout.
    pub keys: Keys,
    /// How long agents get to load a placement before it is given up (and planned
    /// again without the agents that did not report).
    pub ready_timeout: Duration,
}

/// What an allocator did (tests, the demo and logs).
#[derive(Debug, Default)]
pub struct AllocatorStats {
    /// Times it was elected.
    pub elected: AtomicU64,
    /// Routing tables it published.
    pub replans: AtomicU64,
    /// Re-plans because an agent the routing in force used was gone.
    pub failovers: AtomicU64,
    /// The routing epoch it last published.
    pub epoch: AtomicU64,
    /// The last re-plan's solve, µs.
    pub last_solve_us: AtomicU64,
    /// The last re-plan's wait for agents to load placement N+1, µs.
    pub last_ready_us: AtomicU64,
    /// The last re-plan from its start to routing N+1 published, µs.
    pub last_total_us: AtomicU64,
}

/// Campaigns, leads while elected, and campaigns again after losing the lease, until
/// `shutdown` (then it resigns so a standby takes over at once).
pub async fn run(
    store: Arc<dyn Store>,
    config: Config,
    options: AllocatorOptions,
    stats: Arc<AllocatorStats>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    anyhow::ensure!(!config.devices.is_empty(), "the allocator needs the config's [[device]] types and their profiles");
    let apps: Vec<(sluice_core::app_config::AppConfig, Vec<String>)> = config
        .apps
        .iter()
        .map(|a| Ok((a.clone(), resolve_models(a)?.0.into_iter().map(|m| m.name).collect())))
        .collect::<anyhow::Result<_>>()?;
    tokio::pin!(shutdown);
    loop {
        let lease = match KeptLease::grant(store.clone(), options.ttl_s).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(allocator = %options.id, "cannot get a lease: {e}");
                tokio::select! {
                    _ = &mut shutdown => return Ok(()),
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                }
            }
        };
        let key = options.keys.election();
        let elected = tokio::select! {
            _ = &mut shutdown => { lease.revoke(store.as_ref()).await; return Ok(()); }
            _ = lease.lost() => continue,
            r = election::campaign(store.as_ref(), &key, &options.id, lease.id) => r,
        };
        if let Err(e) = elected {
            tracing::warn!(allocator = %options.id, "campaign: {e}");
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        stats.elected.fetch_add(1, Ordering::Relaxed);
        tracing::info!(allocator = %options.id, "elected");
        let mut leader = Leader::new(store.clone(), &config, &apps, &options, stats.clone()).await;
        tokio::select! {
            _ = &mut shutdown => {
                let _ = election::resign(store.as_ref(), &key, &options.id).await;
                lease.revoke(store.as_ref()).await;
                return Ok(());
            }
            _ = lease.lost() => tracing::warn!(allocator = %options.id, "lease lost: no longer leading"),
            r = leader.lead() => if let Err(e) = r { tracing::warn!(allocator = %options.id, "stopped leading: {e:#}") },
        }
        let _ = election::resign(store.as_ref(), &key, &options.id).await;
        lease.revoke(store.as_ref()).await;
    }
}

/// A live agent's device.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct LiveDevice {
    agent: String,
    device: u32,
    kind: String,
}

struct Leader<'a> {
    store: Arc<dyn Store>,
    config: &'a Config,
    apps: &'a [(sluice_core::app_config::AppConfig, Vec<String>)],
    options: &'a AllocatorOptions,
    stats: Arc<AllocatorStats>,
    planner: Planner,
    epoch: u64,
    placement: Placement,
    routing: RoutingTable,
}

impl<'a> Leader<'a> {
    async fn new(
        store: Arc<dyn Store>,
        config: &'a Config,
        apps: &'a [(sluice_core::app_config::AppConfig, Vec<String>)],
        options: &'a AllocatorOptions,
        stats: Arc<AllocatorStats>,
    ) -> Leader<'a> {
        Leader {
            store,
            config,
            apps,
            options,
            stats,
            planner: Planner::new(&config.allocator),
            epoch: 0,
            placement: Placement::default(),
            routing: RoutingTable::default(),
        }
    }

    /// Plans and publishes while leading; returns on a lost election (a guarded
    /// write that failed) or a store error.
    async fn lead(&mut self) -> anyhow::Result<()> {
        let options = self.options;
        let keys = &options.keys;
        // Continue from what a previous leader published.
        if let Some(kv) = self.store.get(&keys.placement()).await? {
            self.placement = decode(&keys.placement(), &kv.value).map_err(anyhow::Error::msg)?;
        }
        if let Some(kv) = self.store.get(&keys.routing()).await? {
            self.routing = decode(&keys.routing(), &kv.value).map_err(anyhow::Error::msg)?;
        }
        self.epoch = self.placement.epoch.max(self.routing.epoch);
        let agents = Mirror::start(self.store.clone(), keys.agents());
        let demand = Mirror::start(self.store.clone(), keys.demand());
        let replan = Mirror::start(self.store.clone(), keys.replan());
        agents.wait_for(Duration::from_secs(10), |s| s.revision > 0).await;
        // The frontends' demand before the first plan: a new leader that planned on an
        // empty snapshot planned for the configured default (1 req/s) until its next
        // re-plan.
        demand.wait_for(Duration::from_secs(10), |s| s.revision > 0).await;
        let mut agents_rx = agents.subscribe();
        let mut replan_rx = replan.subscribe();
        let mut asked = replan.current().kvs.values().map(|kv| kv.mod_revision).max().unwrap_or(0);
        let mut last_members: Option<Vec<LiveDevice>> = None;
        let mut planned_demand: BTreeMap<String, f64> = BTreeMap::new();
        let mut planned_at = tokio::time::Instant::now();
        let period = Duration::from_secs_f64(self.config.allocator.period_s);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = agents_rx.changed() => {}
                _ = replan_rx.changed() => {}
                _ = tick.tick() => {}
            }
            let snapshot = agents.current();
            if !snapshot.live {
                continue; // the store is unreachable: nothing to decide on
            }
            let members = live_devices(&snapshot);
            let live_agents: BTreeSet<&str> = members.iter().map(|d| d.agent.as_str()).collect();
            let lost: Vec<String> = self
                .routing
                .apps
                .values()
                .flatten()
                .filter(|r| !live_agents.contains(r.agent.as_str()))
                .map(|r| r.agent.clone())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            let now_asked = replan.current().kvs.values().map(|kv| kv.mod_revision).max().unwrap_or(0);
            let demand_now = self.demand(&demand.current());
            let moved = self.config.allocator.demand_shifted(&planned_demand, &demand_now);
            let why = if self.routing.epoch == 0 {
                Some("first plan")
            } else if !lost.is_empty() {
                Some("agent lost")
            } else if last_members.as_ref() != Some(&members) {
                Some("membership changed")
            } else if now_asked > asked {
                Some("asked")
            } else if moved && planned_at.elapsed() >= period {
                Some("demand moved")
            } else {
                None
            };
            let Some(why) = why else { continue };
            if members.is_empty() {
                continue;
            }
            asked = now_asked;
            tracing::info!(why, lost = ?lost, demand = ?demand_now, devices = members.len(), "re-planning");
            match self.plan_and_publish(&members, &demand_now, &agents).await {
                Ok(true) => {
                    if !lost.is_empty() {
                        self.stats.failovers.fetch_add(1, Ordering::Relaxed);
                    }
                    last_members = Some(members);
                    planned_demand = demand_now;
                    planned_at = tokio::time::Instant::now();
                }
                Ok(false) => {
                    // Not published (agents did not get ready): membership will have
                    // changed, or the next tick tries again.
                    last_members = None;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Each app's demand: the sum over frontends, at least `min_demand_qps`; before
    /// any frontend reports, the demand the plan in force was made for (kept with the
    /// routing table, for a newly elected allocator), else `[allocator] demand_qps`
    /// (default 1).
    fn demand(&self, snapshot: &Snapshot) -> BTreeMap<String, f64> {
        let mut sum: BTreeMap<String, f64> = BTreeMap::new();
        let mut reported = false;
        for (k, kv) in &snapshot.kvs {
            let Some(app) = k.rsplit('/').next() else { continue };
            if let Ok(d) = decode::<DemandRecord>(k, &kv.value) {
                reported = true;
                *sum.entry(app.to_string()).or_default() += d.qps;
            }
        }
        let a = &self.config.allocator;
        self.apps
            .iter()
            .map(|(app, _)| {
                let d = if reported {
                    sum.get(&app.name).copied().unwrap_or(0.0)
                } else {
                    self.routing
                        .demand_qps
                        .get(&app.name)
                        .or_else(|| a.demand_qps.get(&app.name))
                        .copied()
                        .unwrap_or(1.0)
                };
                (app.name.clone(), d.max(a.min_demand_qps))
            })
            .collect()
    }

    /// Solves for `members` and `demand`, publishes placement N+1, waits for its
    /// agents, publishes routing N+1. Ok(false): not published (agents not ready in
    /// time); Err: no longer the leader, or the store failed.
    async fn plan_and_publish(
        &mut self,
        members: &[LiveDevice],
        demand: &BTreeMap<String, f64>,
        agents: &Mirror,
    ) -> anyhow::Result<bool> {
        // The solve is CPU time (the wall clock); waits are on tokio's clock, which is
        // the wall clock too except in a simulated cluster, where it is virtual.
        let started = std::time::Instant::now();
        let begun = tokio::time::Instant::now();
        let Some(plan) = self.solve(members, demand).await? else { return Ok(false) };
        self.stats.last_solve_us.store(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        let options = self.options;
        let keys = &options.keys;
        let mut assignments = assign(&plan, members, &self.placement);
        if self.config.allocator.spare == sluice_alloc::config::Spare::Replicate {
            standby_copies(&mut assignments, members);
        }
        if assignments.is_empty() {
            tracing::warn!("the plan places nothing on the live devices");
            return Ok(false);
        }
        let epoch = self.epoch + 1;
        let placement = Placement { epoch, assignments: assignments.iter().map(|(a, _)| a.clone()).collect() };
        // 1. Placement N+1, while still leading.
        let put = self
            .store
            .txn(Txn {
                when: vec![election::still_leader(&keys.election(), &self.options.id)],
                then: vec![Op::Put { key: keys.placement(), value: encode(&placement), lease: None }],
                otherwise: vec![],
            })
            .await?;
        anyhow::ensure!(put.succeeded, "no longer the leader (placement {epoch} not published)");
        self.epoch = epoch;
        self.placement = placement.clone();
        // 2. Wait for its agents to load it.
        let waiting = tokio::time::Instant::now();
        let needed: BTreeSet<String> = placement.assignments.iter().map(|a| a.agent.clone()).collect();
        // Each needed agent's ready epoch (None: its record is gone or invalid). A
        // record is decoded once per change (by its mod revision), not once per
        // snapshot: N agents reporting ready one by one cost N decodes, not N².
        let needed_keys: Vec<String> = needed.iter().map(|a| keys.agent(a)).collect();
        let decoded: parking_lot::Mutex<BTreeMap<String, (i64, Option<u64>)>> = Default::default();
        let ready_epochs = |s: &Snapshot| -> Vec<Option<u64>> {
            let mut decoded = decoded.lock();
            needed_keys
                .iter()
                .map(|key| {
                    let kv = s.kvs.get(key)?;
                    match decoded.get(key) {
                        Some((rev, e)) if *rev == kv.mod_revision => *e,
                        _ => {
                            let e = decode::<AgentRecord>(key, &kv.value).ok().map(|r| r.ready_epoch);
                            decoded.insert(key.clone(), (kv.mod_revision, e));
                            e
                        }
                    }
                })
                .collect()
        };
        let all_at = |epochs: &[Option<u64>]| epochs.iter().all(|e| e.is_some_and(|e| e >= epoch));
        let ready = agents
            .wait_for(self.options.ready_timeout, |s| {
                let epochs = ready_epochs(s);
                // Every needed agent ready, or one gone (then stop waiting).
                all_at(&epochs) || epochs.iter().any(Option::is_none)
            })
            .await;
        let all_ready = ready.as_ref().is_some_and(|s| all_at(&ready_epochs(s)));
        if !all_ready {
            tracing::warn!(epoch, "placement not loaded by every agent in time (or one left): not routing to it");
            return Ok(false);
        }
        self.stats.last_ready_us.store(waiting.elapsed().as_micros() as u64, Ordering::Relaxed);
        // 3. Routing N+1, guarded by the election and the placement it goes with.
        let addrs: BTreeMap<String, String> = agents
            .current()
            .kvs
            .iter()
            .filter_map(|(k, kv)| decode::<AgentRecord>(k, &kv.value).ok())
            .map(|r| (r.id, r.addr))
            .collect();
        let mut table = RoutingTable { epoch, apps: BTreeMap::new(), demand_qps: demand.clone() };
        for (a, share) in &assignments {
            table.apps.entry(a.app.clone()).or_default().push(Route {
                key: route_key(&a.agent, a.device),
                agent: a.agent.clone(),
                addr: addrs.get(&a.agent).cloned().unwrap_or_default(),
                device: a.device,
                variant: a.variant.clone(),
                share: *share,
            });
        }
        for routes in table.apps.values_mut() {
            let total: f64 = routes.iter().map(|r| r.share).sum();
            let n = routes.len() as f64;
            for r in routes.iter_mut() {
                r.share = if total > 0.0 { r.share / total } else { 1.0 / n };
            }
        }
        let placement_rev = put.revision;
        let published = self
            .store
            .txn(Txn {
                when: vec![
                    election::still_leader(&keys.election(), &self.options.id),
                    Compare::ModRevision(keys.placement(), placement_rev),
                ],
                then: vec![Op::Put { key: keys.routing(), value: encode(&table), lease: None }],
                otherwise: vec![],
            })
            .await?;
        anyhow::ensure!(
            published.succeeded,
            "no longer the leader, or the placement changed (routing {epoch} not published)"
        );
        tracing::info!(epoch, routes = table.apps.values().map(Vec::len).sum::<usize>(), "published routing");
        self.routing = table;
        self.stats.replans.fetch_add(1, Ordering::Relaxed);
        self.stats.epoch.store(epoch, Ordering::Relaxed);
        self.stats.last_total_us.store(begun.elapsed().as_micros() as u64, Ordering::Relaxed);
        Ok(true)
    }

    /// One solve over the live devices (None: no plan).
    async fn solve(
        &mut self,
        members: &[LiveDevice],
        demand: &BTreeMap<String, f64>,
    ) -> anyhow::Result<Option<proteus::Plan>> {
        let mut counts: BTreeMap<&str, u32> = BTreeMap::new();
        for d in members {
            *counts.entry(d.kind.as_str()).or_default() += 1;
        }
        let devices: Vec<DeviceConfig> = self
            .config
            .devices
            .iter()
            .filter_map(|d| counts.get(d.kind.as_str()).map(|&count| DeviceConfig { count, ..d.clone() }))
            .collect();
        let Some(pool) = DevicePool::load(&devices).map_err(anyhow::Error::msg)? else { return Ok(None) };
        let apps: Vec<(&sluice_core::app_config::AppConfig, Vec<String>)> =
            self.apps.iter().map(|(a, m)| (a, m.clone())).collect();
        let problem = pool.problem(&self.config.allocator, &apps, demand);
        let mut planner = std::mem::replace(&mut self.planner, Planner::new(&self.config.allocator));
        let (planner, allocation) = tokio::task::spawn_blocking(move || {
            let a = planner.plan(problem);
            (planner, a)
        })
        .await?;
        self.planner = planner;
        if let Some(e) = &allocation.error {
            tracing::warn!("allocator: {e}");
        }
        Ok(match allocation.plan {
            Some(AnyPlan::Proteus(p)) => Some(p),
            _ => None,
        })
    }
}

/// The live, accepting agents' devices, sorted (agent, device).
fn live_devices(s: &Snapshot) -> Vec<LiveDevice> {
    let mut out = Vec::new();
    for (k, kv) in &s.kvs {
        let Ok(r) = decode::<AgentRecord>(k, &kv.value) else { continue };
        if !r.accepting {
            continue;
        }
        for d in r.devices {
            out.push(LiveDevice { agent: r.id.clone(), device: d.index, kind: d.kind });
        }
    }
    out.sort();
    out
}

/// Maps the plan's devices onto live devices of the same type; returns each
/// assignment with its share of its app.
///
/// Two aims, in this order:
/// 1. **Anti-affinity:** the devices of one planned variant (a share > 0) are spread
///    over agents, so that losing one agent leaves a copy of every variant the plan
///    gives two devices or more. A variant is left on one agent only where no
///    arrangement of the same plan on the live devices avoids it (one agent, or the
///    others full). Spares get their copies from [`standby_copies`].
/// 2. **Stability:** a device keeps its (app, variant) where the plan still has one
///    like it, so routing keys (`{agent}/{device}`) survive re-plans and nothing is
///    loaded again; except where keeping it would hold every device of a variant on
///    one agent (a plan made while one agent was alone, or before this rule).
///
/// Passes: (1) devices keep what they had, at most `n - 1` of a variant's `n` on one
/// agent while another agent has devices of that type; (2) the rest go, planned
/// variants first, to the free device of the agent that hosts the fewest of that
/// variant yet (ties: the agent with the most free devices of the type, then
/// the first); (3) a variant still on one agent trades one device with another
/// agent's device whose variant does not lose its own spread by the trade (or
/// moves to a free device there).
fn assign(plan: &proteus::Plan, members: &[LiveDevice], previous: &Placement) -> Vec<(Assignment, f64)> {
    let before: BTreeMap<(&str, u32), (&str, &str)> = previous
        .assignments
        .iter()
        .map(|a| ((a.agent.as_str(), a.device), (a.app.as_str(), a.variant.as_str())))
        .collect();
    // The plan's devices that host something, planned ones (a share > 0) first.
    let mut wanted: Vec<(usize, &str, &str, &str, f64)> = plan
        .devices
        .iter()
        .enumerate()
        .filter_map(|(i, d)| Some((i, d.device_type.as_str(), d.app.as_deref()?, d.model.as_deref()?, d.share)))
        .collect();
    wanted.sort_by_key(|&(i, .., share)| (share <= 0.0, i));
    // Each planned variant's device count, and the agents with devices of each type.
    let mut planned: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for &(_, _, app, variant, share) in &wanted {
        if share > 0.0 {
            *planned.entry((app, variant)).or_default() += 1;
        }
    }
    let mut agents_of: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for m in members {
        agents_of.entry(m.kind.as_str()).or_default().insert(m.agent.as_str());
    }
    let mut used = vec![false; members.len()];
    // Where each planned variant's devices are so far: agent → count.
    let mut hosts: BTreeMap<(&str, &str), BTreeMap<&str, usize>> = BTreeMap::new();
    let mut out: Vec<Option<(usize, f64)>> = vec![None; plan.devices.len()];
    // Pass 1: devices that keep what they had.
    for &(i, kind, app, variant, share) in &wanted {
        let n = planned.get(&(app, variant)).copied().unwrap_or(0);
        let spreadable = n >= 2 && agents_of.get(kind).is_some_and(|a| a.len() >= 2);
        let hit = members.iter().enumerate().find(|&(j, m)| {
            !used[j]
                && m.kind == kind
                && before.get(&(m.agent.as_str(), m.device)) == Some(&(app, variant))
                && !(share > 0.0
                    && spreadable
                    && hosts.get(&(app, variant)).and_then(|h| h.get(m.agent.as_str())).copied().unwrap_or(0) + 1 >= n)
        });
        if let Some((j, m)) = hit {
            used[j] = true;
            out[i] = Some((j, share));
            if share > 0.0 {
                *hosts.entry((app, variant)).or_default().entry(m.agent.as_str()).or_default() += 1;
            }
        }
    }
    // Pass 2: the rest, spread. Free devices per (agent, type), kept as devices are
    // taken (counting them per candidate made this cubic in the devices: 1,000s of
    // agents in the simulated cluster).
    let mut free: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for (m, _) in members.iter().zip(&used).filter(|(_, u)| !**u) {
        *free.entry((m.agent.as_str(), m.kind.as_str())).or_default() += 1;
    }
    for &(i, kind, app, variant, share) in &wanted {
        if out[i].is_some() {
            continue;
        }
        let free_on = |agent: &str| free.get(&(agent, kind)).copied().unwrap_or(0);
        let on_agent = |agent: &str| match share > 0.0 {
            true => hosts.get(&(app, variant)).and_then(|h| h.get(agent)).copied().unwrap_or(0),
            false => 0,
        };
        let pick = members
            .iter()
            .enumerate()
            .filter(|&(j, m)| !used[j] && m.kind == kind)
            .min_by_key(|&(j, m)| (on_agent(&m.agent), std::cmp::Reverse(free_on(&m.agent)), j))
            .map(|(j, _)| j);
        match pick {
            Some(j) => {
                used[j] = true;
                if let Some(n) = free.get_mut(&(members[j].agent.as_str(), kind)) {
                    *n -= 1;
                }
                out[i] = Some((j, share));
                if share > 0.0 {
                    *hosts.entry((app, variant)).or_default().entry(members[j].agent.as_str()).or_default() += 1;
                }
            }
            None => tracing::warn!(device = %plan.devices[i].device, "the plan has more {kind} devices than are live"),
        }
    }
    // Pass 3: a planned variant still on one agent trades a device with another agent.
    let variant_of = |i: usize| {
        let d = &plan.devices[i];
        (d.app.as_deref().unwrap_or_default(), d.model.as_deref().unwrap_or_default())
    };
    let spread = |v: (&str, &str), out: &[Option<(usize, f64)>]| -> BTreeMap<String, usize> {
        let mut agents = BTreeMap::new();
        for (i, o) in out.iter().enumerate() {
            if let Some((j, share)) = o {
                if *share > 0.0 && variant_of(i) == v {
                    *agents.entry(members[*j].agent.clone()).or_default() += 1;
                }
            }
        }
        agents
    };
    for (&v, &n) in &planned {
        if n < 2 {
            continue;
        }
        let agents = spread(v, &out);
        if agents.len() != 1 {
            continue;
        }
        // One of its devices (a planned one) on the agent it is stuck on.
        let Some(mine) =
            out.iter().enumerate().position(|(i, o)| o.is_some_and(|(_, s)| s > 0.0) && variant_of(i) == v)
        else {
            continue;
        };
        let (j_mine, _) = out[mine].expect("placed");
        let kind = members[j_mine].kind.as_str();
        let stuck = members[j_mine].agent.as_str();
        // A free device of its type on another agent: move there.
        if let Some(j) = (0..members.len()).find(|&j| !used[j] && members[j].kind == kind && members[j].agent != stuck)
        {
            used[j_mine] = false;
            used[j] = true;
            out[mine] = out[mine].map(|(_, s)| (j, s));
            continue;
        }
        // Else trade with another agent's device whose variant keeps its spread.
        let partner = out.iter().enumerate().find(|&(i, o)| {
            let Some((j, share)) = *o else { return false };
            if members[j].kind != kind || members[j].agent == stuck || variant_of(i) == v {
                return false;
            }
            let w = variant_of(i);
            if share <= 0.0 || planned.get(&w).copied().unwrap_or(0) < 2 {
                return true; // a spare, or a variant with one device: no spread to lose
            }
            let mut after = spread(w, &out);
            let there = after.get_mut(&members[j].agent).expect("hosts w");
            *there -= 1;
            if *there == 0 {
                after.remove(&members[j].agent);
            }
            *after.entry(stuck.to_string()).or_default() += 1;
            after.len() >= 2
        });
        if let Some((other, _)) = partner {
            let (j_other, s_other) = out[other].expect("placed");
            let (_, s_mine) = out[mine].expect("placed");
            out[mine] = Some((j_other, s_mine));
            out[other] = Some((j_mine, s_other));
        }
    }
    out.iter()
        .enumerate()
        .filter_map(|(i, o)| {
            let (j, share) = (*o)?;
            let (app, variant) = variant_of(i);
            let m = &members[j];
            Some((
                Assignment { agent: m.agent.clone(), device: m.device, app: app.into(), variant: variant.into() },
                share,
            ))
        })
        .collect()
}

/// Gives every device the plan leaves without a share (a spare: the MILP may place a
/// variant there that it routes nothing to) a copy of a variant that has a share,
/// on devices of the same kind: the one hosted on the fewest other agents, so that
/// a batch whose agent dies has a copy on another agent to fail over to. A copy
/// keeps a 0 % share: it takes traffic only as a fallback, until the next plan. A
/// plan that put every share on one agent and left the other with unrelated
/// variants at 0 % sent 101 of 1,326 of the cluster demo's requests to 500 when
/// that agent was killed (issue 34).
fn standby_copies(assignments: &mut [(Assignment, f64)], members: &[LiveDevice]) {
    let kinds: BTreeMap<(&str, u32), &str> =
        members.iter().map(|m| ((m.agent.as_str(), m.device), m.kind.as_str())).collect();
    let kind_of = |a: &Assignment| kinds.get(&(a.agent.as_str(), a.device)).map(|k| k.to_string());
    // Per kind, the planned variants (a share > 0) and the agents that host them:
    // copies keep a 0 % share, so this does not change as spares are filled.
    let mut hosts: BTreeMap<String, BTreeMap<(String, String), BTreeSet<String>>> = BTreeMap::new();
    for (a, share) in assignments.iter() {
        if let (true, Some(kind)) = (*share > 0.0, kind_of(a)) {
            hosts
                .entry(kind)
                .or_default()
                .entry((a.app.clone(), a.variant.clone()))
                .or_default()
                .insert(a.agent.clone());
        }
    }
    for (a, share) in assignments.iter_mut() {
        if *share > 0.0 {
            continue;
        }
        let Some(planned) = kind_of(a).and_then(|k| hosts.get(&k)) else { continue };
        // The variant with the fewest copies elsewhere, if it has none here yet.
        let pick = planned
            .iter()
            .filter(|(_, agents)| !agents.contains(&a.agent))
            .min_by_key(|(_, agents)| agents.len())
            .map(|((app, variant), _)| (app.clone(), variant.clone()));
        if let Some((app, variant)) = pick {
            a.app = app;
            a.variant = variant;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::Assignment;

    /// `variant` of app `img` on `agent`'s `device`.
    fn a(agent: &str, device: u32, variant: &str) -> Assignment {
        Assignment { agent: agent.into(), device, app: "img".into(), variant: variant.into() }
    }

    #[test]
    fn spare_devices_host_copies_of_planned_variants_on_other_agents() {
        let members = vec![dev("a1", 0), dev("a1", 1), dev("a2", 0), dev("a2", 1)];
        // Every share on a2; a1 hosts unrelated variants at 0 %.
        let mut got = vec![
            (a("a1", 0, "small"), 0.0),
            (a("a1", 1, "medium"), 0.0),
            (a("a2", 0, "large"), 0.5),
            (a("a2", 1, "large"), 0.5),
        ];
        standby_copies(&mut got, &members);
        assert_eq!(got[0].0.variant, "large", "{got:?}");
        assert_eq!(got[1].0.variant, "large", "{got:?}");
        assert_eq!((got[0].1, got[2].1), (0.0, 0.5), "copies take no share");
        // A spare on the agent that already hosts the only planned variant keeps
        // what it has: a copy there would not survive that agent.
        let mut got = vec![(a("a2", 0, "large"), 1.0), (a("a2", 1, "small"), 0.0)];
        standby_copies(&mut got, &members);
        assert_eq!(got[1].0.variant, "small");
    }

    fn dev(agent: &str, device: u32) -> LiveDevice {
        LiveDevice { agent: agent.into(), device, kind: "cpu".into() }
    }

    fn plan(devices: &[(&str, &str, f64)]) -> proteus::Plan {
        proteus::Plan {
            step: proteus::Step::Hardware,
            beta: 1.0,
            effective_accuracy: 0.0,
            devices_used: devices.len() as u32,
            apps: vec![],
            routes: vec![],
            devices: devices
                .iter()
                .enumerate()
                .map(|(i, (app, model, share))| proteus::DevicePlan {
                    device: format!("cpu-{i}"),
                    device_type: "cpu".into(),
                    app: Some(app.to_string()),
                    model: Some(model.to_string()),
                    share: *share,
                    service_us: None,
                })
                .collect(),
        }
    }

    /// Each planned variant's agents, from an assignment.
    fn agents_of(got: &[(Assignment, f64)], variant: &str) -> BTreeSet<String> {
        got.iter().filter(|(a, s)| a.variant == variant && *s > 0.0).map(|(a, _)| a.agent.clone()).collect()
    }

    #[test]
    fn a_variant_on_two_devices_gets_one_on_each_of_two_agents() {
        // The worked example: 2 agents x 2 devices, one variant needing 2 devices.
        // Before, both went to a1 (the first free devices) and a1's loss lost it.
        let members = vec![dev("a1", 0), dev("a1", 1), dev("a2", 0), dev("a2", 1)];
        let got = assign(&plan(&[("img", "big", 0.5), ("img", "big", 0.5)]), &members, &Placement::default());
        assert_eq!(agents_of(&got, "big").len(), 2, "{got:?}");
        // Two variants on two devices each: each on both agents.
        let p = plan(&[("img", "big", 0.3), ("img", "big", 0.3), ("img", "small", 0.2), ("img", "small", 0.2)]);
        let got = assign(&p, &members, &Placement::default());
        assert_eq!(got.len(), 4);
        assert_eq!(agents_of(&got, "big").len(), 2, "{got:?}");
        assert_eq!(agents_of(&got, "small").len(), 2, "{got:?}");
        // Three of one and one of another: the three span both agents.
        let p = plan(&[("img", "big", 0.3), ("img", "big", 0.3), ("img", "big", 0.3), ("img", "small", 0.1)]);
        let got = assign(&p, &members, &Placement::default());
        assert_eq!(agents_of(&got, "big").len(), 2, "{got:?}");
        // One agent only: everything on it, nothing lost.
        let alone = vec![dev("a1", 0), dev("a1", 1)];
        let got = assign(&plan(&[("img", "big", 0.5), ("img", "big", 0.5)]), &alone, &Placement::default());
        assert_eq!(got.len(), 2);
    }

    #[test]
    fn a_previous_placement_on_one_agent_is_spread_with_one_move() {
        let members = vec![dev("a1", 0), dev("a1", 1), dev("a2", 0), dev("a2", 1)];
        // Made while a2 was away: big on both of a1's devices, small on both of a2's.
        let previous = Placement {
            epoch: 3,
            assignments: vec![a("a1", 0, "big"), a("a1", 1, "big"), a("a2", 0, "small"), a("a2", 1, "small")],
        };
        let p = plan(&[("img", "big", 0.3), ("img", "big", 0.3), ("img", "small", 0.2), ("img", "small", 0.2)]);
        let got = assign(&p, &members, &previous);
        assert_eq!(agents_of(&got, "big").len(), 2, "{got:?}");
        assert_eq!(agents_of(&got, "small").len(), 2, "{got:?}");
        // Half the devices keep what they had: one load per variant, not four.
        let kept = got.iter().filter(|(x, _)| previous.assignments.contains(x)).count();
        assert_eq!(kept, 2, "{got:?}");
    }

    #[test]
    fn a_variant_held_on_one_agent_by_kept_devices_trades_a_device() {
        // a1 has three devices, a2 one, which kept `small` from the last plan. Passes 1
        // and 2 put both of big's devices on a1 (a2 is full); the trade moves small
        // to a1 and one big to a2: small (one device) loses no spread by it.
        let members = vec![dev("a1", 0), dev("a1", 1), dev("a1", 2), dev("a2", 0)];
        let previous = Placement {
            epoch: 1,
            assignments: vec![Assignment { agent: "a2".into(), device: 0, app: "img".into(), variant: "small".into() }],
        };
        let p = plan(&[("img", "small", 0.2), ("img", "big", 0.4), ("img", "big", 0.4)]);
        let got = assign(&p, &members, &previous);
        assert_eq!(got.len(), 3);
        assert_eq!(agents_of(&got, "big").len(), 2, "{got:?}");
        // Where no arrangement spreads both (a2 has one device), one stays on one agent.
        let p = plan(&[("img", "small", 0.1), ("img", "small", 0.1), ("img", "big", 0.4), ("img", "big", 0.4)]);
        let got = assign(&p, &members, &Placement::default());
        assert_eq!(got.len(), 4);
        assert_eq!(agents_of(&got, "big").len() + agents_of(&got, "small").len(), 3, "{got:?}");
    }

    #[test]
    fn after_any_one_agent_is_lost_every_planned_variant_still_has_a_copy() {
        // 3 agents x 2 devices, a plan of 2 + 2 + 1 devices and a spare: with
        // standby copies (spare = "replicate") every variant survives any one agent.
        let members: Vec<LiveDevice> = ["a1", "a2", "a3"].iter().flat_map(|a| [dev(a, 0), dev(a, 1)]).collect();
        let p = plan(&[
            ("img", "big", 0.3),
            ("img", "big", 0.3),
            ("img", "mid", 0.15),
            ("img", "mid", 0.15),
            ("img", "small", 0.1),
            ("img", "tiny", 0.0),
        ]);
        let mut got = assign(&p, &members, &Placement::default());
        standby_copies(&mut got, &members);
        for lost in ["a1", "a2", "a3"] {
            for v in ["big", "mid", "small"] {
                assert!(
                    got.iter().any(|(a, _)| a.agent != lost && a.variant == v),
                    "{v} has no copy once {lost} is lost: {got:?}"
                );
            }
        }
    }

    #[test]
    fn devices_keep_their_variant_across_plans_and_new_ones_take_free_devices() {
        let members = vec![dev("a1", 0), dev("a1", 1), dev("a2", 0)];
        let previous = Placement {
            epoch: 1,
            assignments: vec![Assignment { agent: "a2".into(), device: 0, app: "img".into(), variant: "big".into() }],
        };
        let p = plan(&[("img", "small", 0.3), ("img", "big", 0.7)]);
        let got = assign(&p, &members, &previous);
        // `big` stays on a2/0 though it is the plan's second device; `small` takes the first free one.
        assert_eq!(got.len(), 2);
        assert!(got.iter().any(|(a, s)| a.agent == "a2" && a.device == 0 && a.variant == "big" && *s == 0.7));
        assert!(got.iter().any(|(a, _)| a.agent == "a1" && a.device == 0 && a.variant == "small"));
        // A plan for more devices than are live places what fits.
        let p = plan(&[("img", "small", 0.25), ("img", "small", 0.25), ("img", "big", 0.25), ("img", "big", 0.25)]);
        assert_eq!(assign(&p, &members, &previous).len(), 3);
    }
}
