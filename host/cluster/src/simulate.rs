//! A whole cluster in virtual time: the real roles — [`crate::allocator::run`] (two
//! of them, one elected), [`crate::agent::run`] for every agent and
//! [`crate::frontend::run`] for every frontend — on one [`MemStore`] behind a
//! modelled network ([`SimNet`]: a round trip per call, writes one after another at
//! the server, watch events half a round trip late, links that can be cut), all on a
//! tokio runtime whose clock is paused. Time advances only when every task waits, so
//! leases, TTLs, timeouts and round trips are the model's and cost no wall time;
//! what the machine spends (the solve, encoding, the roles' own work) shows only in
//! the wall time reported next to them.
//!
//! [`simulate`] runs one scenario, with the failures of the process tests:
//! 1. start: every agent registers, the allocator plans, every frontend serves;
//! 2. a re-plan asked for (make before break: placement, agents ready, routing);
//! 3. a tenth of the agents killed at once (their leases lapse);
//! 4. one agent partitioned for two TTLs, then healed (it registers again);
//! 5. the leading allocator killed (the standby is elected and plans).
//!
//! Each step reports, in virtual time, how long until the routing table the step
//! calls for is published and until every frontend serves on it, and how many
//! writes and watch events it took. This is how plan publication scales to 100 and
//! 1,000 agents without 1,000 processes (BENCHMARKS.md §11).
//!
//! The agents run emulated variants: loading is instant and no request is sent; the
//! data path is measured by the process benchmark, not here.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use anyhow::Context;
use tokio::task::JoinHandle;
use tokio::time::{Duration, Instant};

use crate::agent::{read_key, AgentOptions};
use crate::allocator::{AllocatorOptions, AllocatorStats};
use crate::frontend::FrontendOptions;
use crate::keys::{decode, FrontendRecord, Keys, RoutingTable};
use crate::mirror::{Mirror, Snapshot};
use crate::store::{Link, MemStore, NetModel, SimNet, Store};

/// What to simulate.
#[derive(Clone, Debug)]
pub struct SimSpec {
    /// Agents (one cpu device each).
    pub agents: usize,
    /// Frontends.
    pub frontends: usize,
    /// The network and the store's server.
    pub net: NetModel,
    /// Every role's lease TTL, seconds.
    pub ttl_s: i64,
    /// The built-in policies (the frontends run their apps' policies).
    pub policies: std::path::PathBuf,
}

impl SimSpec {
    /// `agents` agents and 2 frontends: 2 ms round trips (the shortest the
    /// millisecond timers model exactly; a data-centre network is faster, so this
    /// errs slow), 0.1 ms per write at the server (10,000 small writes a second;
    /// etcd commits a few thousand to tens of thousands, depending on its disk), 3 s
    /// timeouts (the etcd store's), 3 s TTLs (`--lease-ttl`'s default).
    pub fn lan(agents: usize, policies: &Path) -> SimSpec {
        SimSpec {
            agents,
            frontends: 2,
            net: NetModel {
                rtt: Duration::from_millis(2),
                write: Duration::from_micros(100),
                timeout: Duration::from_secs(3),
            },
            ttl_s: 3,
            policies: policies.to_path_buf(),
        }
    }
}

/// One step of the cluster scenario (the start, an asked re-plan, agents killed, a
/// partition, a failover), its times in virtual time from the step's start. Not a
/// decision's or a plan's step.
#[derive(Clone, Debug, Default)]
pub struct ScenarioStep {
    /// What happened.
    pub what: String,
    /// Until the routing table it calls for was published.
    pub published: Duration,
    /// Until every frontend served on it.
    pub serving: Duration,
    /// Writes at the store meanwhile.
    pub writes: u64,
    /// Watch events delivered meanwhile.
    pub events: u64,
    /// Wall time the step took on this machine.
    pub wall: std::time::Duration,
}

/// What a simulation measured.
#[derive(Clone, Debug, Default)]
pub struct SimReport {
    /// The spec's agents.
    pub agents: usize,
    /// The steps, in order.
    pub steps: Vec<ScenarioStep>,
    /// Virtual time simulated.
    pub simulated: Duration,
    /// Wall time it took.
    pub wall: std::time::Duration,
    /// The allocator's last solve (wall time: it is CPU work).
    pub last_solve: std::time::Duration,
    /// Routing tables published in all.
    pub replans: u64,
    /// Agent failovers the allocators counted.
    pub failovers: u64,
    /// The demand of app `img` the standby's first plan was made for (the frontends
    /// report none, and one more reports [`LEADER_DEMAND_QPS`] before the leader dies).
    pub standby_planned_for: Option<f64>,
}

/// The demand reported before the leader is killed.
pub const LEADER_DEMAND_QPS: f64 = 37.0;

impl std::fmt::Display for SimReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{} agents: {:.1} s simulated in {:.2} s wall; {} routing tables published, {} agent failovers, last solve {:.1} ms",
            self.agents,
            self.simulated.as_secs_f64(),
            self.wall.as_secs_f64(),
            self.replans,
            self.failovers,
            self.last_solve.as_secs_f64() * 1e3
        )?;
        for s in &self.steps {
            writeln!(
                f,
                "  {:<44} published {:>9.1} ms, every frontend serving {:>9.1} ms; {:>6} writes, {:>7} events; wall {:>6.2} s",
                s.what,
                s.published.as_secs_f64() * 1e3,
                s.serving.as_secs_f64() * 1e3,
                s.writes,
                s.events,
                s.wall.as_secs_f64()
            )?;
        }
        Ok(())
    }
}

/// Runs the scenario of the module docs on its own paused-clock runtime, with its
/// config and profile written under `dir`.
pub fn simulate(spec: &SimSpec, dir: &Path) -> anyhow::Result<SimReport> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .context("building the simulation's runtime")?;
    rt.block_on(run(spec, dir))
}

/// A role's task and its link.
struct Node {
    id: String,
    link: Arc<Link>,
    task: JoinHandle<anyhow::Result<()>>,
}

async fn run(spec: &SimSpec, dir: &Path) -> anyhow::Result<SimReport> {
    anyhow::ensure!(spec.agents >= 2, "a simulated cluster needs at least 2 agents");
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join("emulated.toml"), crate::harness::emulated_profile(1.0))?;
    let n = spec.agents;
    let text = crate::harness::config_text(dir, &spec.policies, n as u32, 200, 10.0 * n as f64);
    let config = sluice_server::config::Config::parse(&text, "simulated cluster config", dir)?;
    let keys = Keys::default();
    let mem = MemStore::new();
    let sweeper = mem.expire_leases_on_time();
    let store: Arc<dyn Store> = Arc::new(mem);
    let net = SimNet::new(store.clone(), spec.net);
    // The observer reads the store directly: what it sees is the store's state at
    // that instant, not a node's.
    let routing = Mirror::start(store.clone(), keys.routing());
    let frontends_seen = Mirror::start(store.clone(), keys.frontends());
    let (wall0, t0) = (std::time::Instant::now(), Instant::now());

    let stats: Vec<Arc<AllocatorStats>> = (0..2).map(|_| Arc::default()).collect();
    let mut allocators: Vec<Node> = Vec::new();
    for (i, id) in ["alloc-a", "alloc-b"].into_iter().enumerate() {
        let link = net.link();
        let options = AllocatorOptions {
            id: id.into(),
            ttl_s: spec.ttl_s,
            keys: keys.clone(),
            ready_timeout: Duration::from_secs(30),
        };
        let task = tokio::spawn(crate::allocator::run(
            link.clone() as Arc<dyn Store>,
            config.clone(),
            options,
            stats[i].clone(),
            std::future::pending(),
        ));
        allocators.push(Node { id: id.into(), link, task });
        // The standby starts a moment later, so the first is the leader.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut agents: Vec<Node> = Vec::new();
    for i in 0..n {
        let id = format!("agent{i:04}");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let advertise = format!("http://{}", listener.local_addr()?);
        let link = net.link();
        let options = AgentOptions {
            id: id.clone(),
            devices: vec!["cpu".into()],
            advertise,
            ttl_s: spec.ttl_s,
            keys: keys.clone(),
            drain: Duration::from_secs(5),
        };
        let task = tokio::spawn(crate::agent::run(
            link.clone() as Arc<dyn Store>,
            config.clone(),
            options,
            listener,
            std::future::pending(),
        ));
        agents.push(Node { id, link, task });
    }
    let mut frontends: Vec<Node> = Vec::new();
    for i in 0..spec.frontends {
        let id = format!("fe{i}");
        let link = net.link();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let options = FrontendOptions {
            id: id.clone(),
            ttl_s: spec.ttl_s,
            keys: keys.clone(),
            batch_timeout: Duration::from_secs(2),
            first_plan_timeout: Duration::from_secs(60),
        };
        let task = tokio::spawn(crate::frontend::run(
            link.clone() as Arc<dyn Store>,
            config.clone(),
            options,
            listener,
            None,
            std::future::pending(),
        ));
        frontends.push(Node { id, link, task });
    }
    let fe_ids: Vec<String> = frontends.iter().map(|f| f.id.clone()).collect();
    let watch = Observer { routing: &routing, frontends: &frontends_seen, keys: &keys, fe_ids: &fe_ids, net: &net };
    let mut steps = Vec::new();
    let all: BTreeSet<String> = agents.iter().map(|a| a.id.clone()).collect();

    // 1. Start.
    let step = watch.begin("start: all agents placed, frontends serving");
    let s = watch.until(step, |agents| agents == &all).await.context("the first plan over every agent")?;
    steps.push(s);

    // 2. A re-plan asked for.
    let step = watch.begin("re-plan asked (make before break)");
    let before = watch.epoch();
    let operator = net.link();
    operator.put(&keys.replan(), b"simulated".to_vec(), None).await?;
    steps.push(watch.until_epoch(step, before, |agents| agents == &all).await.context("the asked re-plan")?);

    // 3. A tenth of the agents killed.
    let killed: Vec<Node> = agents.drain(..(n / 10).max(1)).collect();
    let plural = if killed.len() == 1 { "agent" } else { "agents" };
    let step = watch.begin(&format!("{} {plural} killed (lease TTL {} s)", killed.len(), spec.ttl_s));
    let before = watch.epoch();
    for k in &killed {
        k.task.abort();
    }
    let alive: BTreeSet<String> = agents.iter().map(|a| a.id.clone()).collect();
    steps.push(
        watch
            .until_epoch(step, before, |agents| agents == &alive)
            .await
            .context("routing without the killed agents")?,
    );

    // 4. One agent partitioned for two TTLs, then healed.
    let cut = agents.last().expect("at least one agent left");
    let step = watch.begin("1 agent partitioned: routed around");
    let before = watch.epoch();
    cut.link.set_cut(true);
    let without: BTreeSet<String> = alive.iter().filter(|a| **a != cut.id).cloned().collect();
    steps.push(
        watch.until_epoch(step, before, |agents| agents == &without).await.context("routing around the cut agent")?,
    );
    tokio::time::sleep(Duration::from_secs(2 * spec.ttl_s as u64)).await;
    let step = watch.begin("the partition healed: placed again");
    let before = watch.epoch();
    cut.link.set_cut(false);
    steps.push(
        watch.until_epoch(step, before, |agents| agents == &alive).await.context("the healed agent placed again")?,
    );

    // 5. The leading allocator killed, with demand reported: the standby's first plan
    // must be made for it (it once planned on an empty snapshot, for the default).
    let demand_record = crate::keys::DemandRecord { qps: LEADER_DEMAND_QPS, at_ms: 0 };
    operator.put(&keys.demand_of("fe-load", "img"), crate::keys::encode(&demand_record), None).await?;
    let leader = crate::election::leader(store.as_ref(), &keys.election()).await?.context("no allocator leads")?;
    let (dead, standby) = match allocators.iter().position(|a| a.id == leader) {
        Some(i) => (allocators.remove(i), allocators.pop().context("the standby")?),
        None => anyhow::bail!("the leader `{leader}` is not one of the simulated allocators"),
    };
    dead.task.abort();
    let step = watch.begin("leader killed: the standby elected, plans");
    let before = watch.epoch();
    // The standby leads once the dead one's lease lapses; it plans on taking over.
    steps.push(watch.until_epoch(step, before, |agents| agents == &alive).await.context("the standby's plan")?);
    anyhow::ensure!(
        crate::election::leader(store.as_ref(), &keys.election()).await?.as_deref() == Some(standby.id.as_str()),
        "the standby does not lead"
    );
    let table = routing.current();
    let table = table.kvs.get(&keys.routing()).context("no routing table")?;
    let table: crate::keys::RoutingTable =
        crate::keys::decode(&keys.routing(), &table.value).map_err(anyhow::Error::msg)?;
    let standby_planned_for = table.demand_qps.get("img").copied();

    let report = SimReport {
        agents: n,
        steps,
        simulated: t0.elapsed(),
        wall: wall0.elapsed(),
        last_solve: stats
            .iter()
            .map(|s| std::time::Duration::from_micros(s.last_solve_us.load(Ordering::Relaxed)))
            .max()
            .unwrap_or_default(),
        replans: stats.iter().map(|s| s.replans.load(Ordering::Relaxed)).sum(),
        failovers: stats.iter().map(|s| s.failovers.load(Ordering::Relaxed)).sum(),
        standby_planned_for,
    };
    for node in agents.iter().chain(&frontends).chain(std::iter::once(&standby)) {
        node.task.abort();
    }
    sweeper.abort();
    Ok(report)
}

/// Reads the store directly to time the steps.
struct Observer<'a> {
    routing: &'a Mirror,
    frontends: &'a Mirror,
    keys: &'a Keys,
    fe_ids: &'a [String],
    net: &'a SimNet,
}

/// A step under way: its start and the counters then.
struct Begun {
    what: String,
    at: Instant,
    wall: std::time::Instant,
    writes: u64,
    events: u64,
}

/// At most this long (virtual) for any step.
const STEP_LIMIT: Duration = Duration::from_secs(120);

impl Observer<'_> {
    fn begin(&self, what: &str) -> Begun {
        Begun {
            what: what.to_string(),
            at: Instant::now(),
            wall: std::time::Instant::now(),
            writes: self.net.stats.writes.load(Ordering::Relaxed),
            events: self.net.stats.events.load(Ordering::Relaxed),
        }
    }

    fn table(&self, s: &Snapshot) -> Option<RoutingTable> {
        read_key::<RoutingTable>(s, &self.keys.routing())
    }

    fn epoch(&self) -> u64 {
        self.table(&self.routing.current()).map_or(0, |t| t.epoch)
    }

    /// Waits for a routing table newer than `before` whose agents satisfy `want`,
    /// then for every frontend to serve on it (or a later one).
    async fn until_epoch(
        &self,
        step: Begun,
        before: u64,
        want: impl Fn(&BTreeSet<String>) -> bool,
    ) -> anyhow::Result<ScenarioStep> {
        let agents_of =
            |t: &RoutingTable| -> BTreeSet<String> { t.apps.values().flatten().map(|r| r.agent.clone()).collect() };
        let snap = self
            .routing
            .wait_for(STEP_LIMIT, |s| self.table(s).is_some_and(|t| t.epoch > before && want(&agents_of(&t))))
            .await
            .with_context(|| format!("{}: no such routing table within {STEP_LIMIT:?}", step.what))?;
        let published = step.at.elapsed();
        let epoch = self.table(&snap).map_or(0, |t| t.epoch);
        self.frontends
            .wait_for(STEP_LIMIT, |s| {
                self.fe_ids.iter().all(|id| {
                    s.kvs
                        .get(&self.keys.frontend(id))
                        .and_then(|kv| decode::<FrontendRecord>(&kv.key, &kv.value).ok())
                        .is_some_and(|r| r.routing_epoch >= epoch)
                })
            })
            .await
            .with_context(|| format!("{}: frontends not serving epoch {epoch} within {STEP_LIMIT:?}", step.what))?;
        Ok(ScenarioStep {
            what: step.what,
            published,
            serving: step.at.elapsed(),
            writes: self.net.stats.writes.load(Ordering::Relaxed) - step.writes,
            events: self.net.stats.events.load(Ordering::Relaxed) - step.events,
            wall: step.wall.elapsed(),
        })
    }

    async fn until(&self, step: Begun, want: impl Fn(&BTreeSet<String>) -> bool) -> anyhow::Result<ScenarioStep> {
        self.until_epoch(step, 0, want).await
    }
}
