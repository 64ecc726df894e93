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
            let moved = self.apps.iter().any(|(a, _)| {
                let (was, is) = (planned_demand.get(&a.name).copied().unwrap_or(0.0), demand_now[&a.name]);
                (is - was).abs() > self.config.allocator.threshold * was.max(self.config.allocator.min_demand_qps)
            });
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
        if self.config.allocator.spare == sluice_alloc::planner::Spare::Replicate {
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

/// Maps the plan's devices onto live devices of the same type, keeping a device's
/// (app, variant) where the plan still has one like it; returns each assignment with
/// its share of its app.
fn assign(plan: &proteus::Plan, members: &[LiveDevice], previous: &Placement) -> Vec<(Assignment, f64)> {
    let before: BTreeMap<(&str, u32), (&str, &str)> = previous
        .assignments
        .iter()
        .map(|a| ((a.agent.as_str(), a.device), (a.app.as_str(), a.variant.as_str())))
        .collect();
    let mut used: BTreeSet<usize> = BTreeSet::new();
    let mut out: Vec<Option<(Assignment, f64)>> = vec![None; plan.devices.len()];
    let wanted: Vec<(usize, &str, &str, &str, f64)> = plan
        .devices
        .iter()
        .enumerate()
        .filter_map(|(i, d)| Some((i, d.device_type.as_str(), d.app.as_deref()?, d.model.as_deref()?, d.share)))
        .collect();
    // Pass 1: devices that keep what they had.
    for &(i, kind, app, variant, share) in &wanted {
        let hit = members.iter().enumerate().find(|(j, m)| {
            !used.contains(j) && m.kind == kind && before.get(&(m.agent.as_str(), m.device)) == Some(&(app, variant))
        });
        if let Some((j, m)) = hit {
            used.insert(j);
            out[i] = Some((
                Assignment { agent: m.agent.clone(), device: m.device, app: app.into(), variant: variant.into() },
                share,
            ));
        }
    }
    // Pass 2: the rest, on free devices of their type.
    for &(i, kind, app, variant, share) in &wanted {
        if out[i].is_some() {
            continue;
        }
        let free = members.iter().enumerate().find(|(j, m)| !used.contains(j) && m.kind == kind);
        match free {
            Some((j, m)) => {
                used.insert(j);
                out[i] = Some((
                    Assignment { agent: m.agent.clone(), device: m.device, app: app.into(), variant: variant.into() },
                    share,
                ));
            }
            None => tracing::warn!(device = %plan.devices[i].device, "the plan has more {kind} devices than are live"),
        }
    }
    out.into_iter().flatten().collect()
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

    #[test]
    fn spare_devices_host_copies_of_planned_variants_on_other_agents() {
        let members = vec![dev("a1", 0), dev("a1", 1), dev("a2", 0), dev("a2", 1)];
        let a = |agent: &str, device: u32, variant: &str| Assignment {
            agent: agent.into(),
            device,
            app: "img".into(),
            variant: variant.into(),
        };
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
