//! sluice as a cluster of real processes on loopback (sluice_cluster::harness): a
//! 3-member etcd cluster, an allocator, agents and a frontend, each the `sluice`
//! binary as users run it (`sluice serve --role ...`), under bounded load. Every request sent is answered exactly once
//! (`lost == 0`, answers == sent); non-2xx answers carry their reason.
//!
//! Scenarios:
//! - `replan_under_load_then_an_agent_killed`: a re-plan under load (demand moves, and
//!   one is asked for) with no error answers beyond explicit drops (429/504); then
//!   an agent is SIGKILLed: its lease lapses, the allocator re-plans without it,
//!   traffic moves, in-flight batches are retried or answered with a reason.
//! - `frozen_agent_etcd_leader_loss_and_allocator_failover`: an agent SIGSTOPped
//!   (lease lapses, traffic moves, batches stuck on it time out with a reason or are
//!   retried), the etcd leader SIGKILLed (quorum survives, serving goes on), then the
//!   leading allocator SIGKILLed (the standby is elected and plans), then every etcd
//!   member killed (the frontend serves on its last routing table).
//! - `a_partitioned_agent_loses_its_traffic_and_rejoins_when_healed`: an agent in a
//!   network namespace of the test's own (sluice_cluster::netns), cut off under load:
//!   its lease lapses, the allocator plans without it, in-flight batches time out and
//!   are retried or answered with a reason; healed, it registers again and is placed.
//! - `a_partitioned_frontend_resumes_its_watch_after_compaction`: a frontend in a
//!   namespace, cut off while a re-plan is published and etcd compacted past what it
//!   saw: healed, its watch resumes from a compacted revision, it lists again and
//!   serves on the new table.
//!
//! - `the_demo_answers_every_request_through_three_kills`: `cargo xtask
//!   cluster-demo` itself (sluice_cluster::demo: a re-plan, then SIGKILLs of the
//!   busiest agent, the leading allocator and an etcd member under load), held to
//!   its summary line: `5xx 0, lost 0`, one agent and one allocator failover.
//!
//! The namespace scenarios need `CAP_NET_ADMIN` (`ip netns add`); where the test
//! cannot create namespaces they say so on stderr and pass without running.

use std::path::PathBuf;
use std::time::Duration;

use sluice_cluster::harness::{config_text, drive, wait_for, workspace_root, Cluster, LoadReport};
use sluice_cluster::netns::NetNs;

/// The binary users run: each process is `sluice serve --role ...`.
fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_sluice"))
}

fn policies() -> PathBuf {
    workspace_root(env!("CARGO_MANIFEST_DIR")).join("target/policies")
}

/// The scenarios run one at a time: each starts a dozen processes with
/// second-scale leases and keep-alives, and on two cores several at once starve
/// each other past those timeouts (a test of the machine, not of sluice).
/// (tokio's lock: it is held across awaits, and a failed scenario does not poison it.)
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Every request answered exactly once, and every non-2xx with its reason.
fn assert_accounted(what: &str, r: &LoadReport) {
    assert_eq!(r.lost, 0, "{what}: requests without an answer: {r:?}");
    assert_eq!(r.answered(), r.sent, "{what}: answers vs requests: {r:?}");
    for e in &r.errors {
        assert!(e.contains("\"error\""), "{what}: an error answer without a reason: {e}");
    }
}

async fn start(
    dir: &std::path::Path,
    agents: &[(&str, usize)],
    allocators: &[&str],
) -> (Cluster, std::net::SocketAddr) {
    let config = config_text(dir, &policies(), 4, 200, 1.0);
    let mut c = Cluster::start(&bin(), dir, 3, &config).await.unwrap();
    for a in allocators {
        c.allocator(a).unwrap();
    }
    for (id, devices) in agents {
        c.agent(id, *devices).unwrap();
    }
    let fe = c.frontend("f1", 1000).unwrap();
    c.wait_ready(fe, Duration::from_secs(60)).await.unwrap();
    (c, fe)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replan_under_load_then_an_agent_killed() {
    let _one_at_a_time = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let (mut c, fe) = start(dir.path(), &[("a1", 2), ("a2", 2)], &["alloc1"]).await;
    let first = c.routing().await.unwrap();
    assert!(first.epoch >= 1);

    // Phase 1: load that moves demand far from the first plan's 1 req/s (the
    // allocator re-plans on it), plus an explicit re-plan, while serving.
    let load = tokio::spawn(drive(fe, "img", 60.0, Duration::from_secs(8), 6));
    tokio::time::sleep(Duration::from_secs(3)).await;
    c.ask_replan().await.unwrap();
    let phase1 = load.await.unwrap();
    assert_accounted("re-plan under load", &phase1);
    let errors = phase1.count(500) + phase1.count(502) + phase1.count(503);
    assert_eq!(errors, 0, "a re-plan must not fail requests: {phase1:?}");
    assert!(phase1.count(200) > 0, "{phase1:?}");
    let replanned = c.routing().await.unwrap();
    assert!(replanned.epoch > first.epoch, "no re-plan happened (epoch {} → {})", first.epoch, replanned.epoch);

    // Phase 2: kill an agent that serves traffic, under load.
    let victim = replanned.apps["img"].iter().max_by(|a, b| a.share.total_cmp(&b.share)).unwrap().agent.clone();
    // Anti-affinity: every variant on two devices or more is on two agents, so the
    // agent about to die leaves a copy of each (a variant on one device, with no
    // spare for a copy, is the one case no arrangement helps).
    let mut devices_of: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for r in &replanned.apps["img"] {
        devices_of.entry(r.variant.as_str()).or_default().push(r.agent.as_str());
    }
    for (variant, agents) in &devices_of {
        if agents.len() >= 2 {
            assert!(agents.iter().any(|a| *a != victim), "{variant} lives on {victim} only: {replanned:?}");
        }
    }
    let load = tokio::spawn(drive(fe, "img", 60.0, Duration::from_secs(10), 6));
    tokio::time::sleep(Duration::from_secs(2)).await;
    c.signal(&victim, "KILL").unwrap();
    let moved = c
        .wait_routing(Duration::from_secs(20), |t| t.apps.values().flatten().all(|r| r.agent != victim))
        .await
        .unwrap();
    assert!(moved.epoch > replanned.epoch);
    let phase2 = load.await.unwrap();
    assert_accounted("agent killed", &phase2);
    assert!(phase2.count(200) > phase2.sent / 2, "most requests still served: {phase2:?}");
    assert!(c.agents().await.iter().all(|a| a.id != victim), "the killed agent's lease lapsed");
    // After the move, everything is served again.
    let after = drive(fe, "img", 40.0, Duration::from_secs(3), 4).await;
    assert_accounted("after the failover", &after);
    assert_eq!(after.count(200), after.sent, "{after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn frozen_agent_etcd_leader_loss_and_allocator_failover() {
    let _one_at_a_time = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let (mut c, fe) = start(dir.path(), &[("a1", 2), ("a2", 2)], &["alloc1", "alloc2"]).await;
    let first = c.routing().await.unwrap();

    // A frozen agent: its lease lapses and traffic moves; batches sent to it time out
    // (1 s) and are retried elsewhere or answered with the reason.
    let victim = first.apps["img"][0].agent.clone();
    let load = tokio::spawn(drive(fe, "img", 40.0, Duration::from_secs(10), 4));
    tokio::time::sleep(Duration::from_secs(2)).await;
    c.signal(&victim, "STOP").unwrap();
    let moved = c
        .wait_routing(Duration::from_secs(20), |t| t.apps.values().flatten().all(|r| r.agent != victim))
        .await
        .unwrap();
    let frozen = load.await.unwrap();
    assert_accounted("frozen agent", &frozen);
    assert!(frozen.count(200) > frozen.sent / 2, "{frozen:?}");
    c.signal(&victim, "CONT").unwrap();

    // The etcd leader dies; two members keep quorum and the cluster keeps serving.
    let leader = c.etcd.leader().await.unwrap();
    let load = tokio::spawn(drive(fe, "img", 40.0, Duration::from_secs(6), 4));
    tokio::time::sleep(Duration::from_secs(1)).await;
    c.etcd.kill(leader);
    let during = load.await.unwrap();
    assert_accounted("etcd leader killed", &during);
    assert_eq!(during.count(500) + during.count(503), 0, "{during:?}");
    // The cluster still takes plans: ask for one.
    c.ask_replan().await.unwrap();
    let again = c.wait_routing(Duration::from_secs(30), |t| t.epoch > moved.epoch).await.unwrap();

    // The leading allocator dies; the standby takes over and plans.
    // (Right after the etcd leader's loss the leading allocator may be between
    // leases: wait for one to lead.)
    let leading = wait_for(Duration::from_secs(20), "no allocator leads after the etcd leader's loss", || async {
        c.leading_allocator().await.ok().flatten()
    })
    .await
    .unwrap();
    c.signal(&leading, "KILL").unwrap();
    // Its lease (2 s) lapses, the standby is elected; a re-plan request shows it leads.
    wait_for(Duration::from_secs(20), &format!("no allocator took over from {leading}"), || async {
        c.leading_allocator().await.ok().flatten().filter(|l| *l != leading)
    })
    .await
    .unwrap();
    c.ask_replan().await.unwrap();
    c.wait_routing(Duration::from_secs(30), |t| t.epoch > again.epoch).await.unwrap();
    let last = drive(fe, "img", 40.0, Duration::from_secs(3), 4).await;
    assert_accounted("after the allocator failover", &last);
    assert!(last.count(200) > 0, "{last:?}");

    // etcd gone entirely: the frontend serves on its last routing table, the agents
    // on what they have loaded.
    for i in 0..3 {
        c.etcd.kill(i);
    }
    let dark = drive(fe, "img", 40.0, Duration::from_secs(4), 4).await;
    assert_accounted("etcd down", &dark);
    assert_eq!(dark.count(200), dark.sent, "{dark:?}");
}

/// Namespace `index` of this test process, or None (said on stderr) where this
/// machine does not let the test create one.
fn netns(index: u8) -> Option<NetNs> {
    match NetNs::create(index) {
        Ok(ns) => Some(ns),
        Err(e) => {
            eprintln!(
                "SKIPPED: cannot create a network namespace here ({e}); the partition scenario needs CAP_NET_ADMIN"
            );
            None
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partitioned_agent_loses_its_traffic_and_rejoins_when_healed() {
    let _one_at_a_time = SERIAL.lock().await;
    // Declared before the cluster so that it is dropped after the processes in it.
    let Some(ns) = netns(0) else { return };
    let dir = tempfile::tempdir().unwrap();
    let config = config_text(dir.path(), &policies(), 4, 200, 1.0);
    let mut c = Cluster::start_on(&bin(), dir.path(), 3, &config, &[ns.host_ip.into()]).await.unwrap();
    c.allocator("alloc1").unwrap();
    c.agent("a1", 2).unwrap();
    c.agent_on("a2", 2, ns.ns_ip.into(), Some(&ns)).unwrap();
    let fe = c.frontend("f1", 1000).unwrap();
    c.wait_ready(fe, Duration::from_secs(60)).await.unwrap();
    // Idle devices get replicas (`spare = "replicate"`), so a2 is placed.
    let placed =
        c.wait_routing(Duration::from_secs(30), |t| t.apps.values().flatten().any(|r| r.agent == "a2")).await.unwrap();

    let load = tokio::spawn(drive(fe, "img", 40.0, Duration::from_secs(12), 4));
    tokio::time::sleep(Duration::from_secs(2)).await;
    ns.cut().unwrap();
    let moved = c
        .wait_routing(Duration::from_secs(20), |t| {
            t.epoch > placed.epoch && t.apps.values().flatten().all(|r| r.agent != "a2")
        })
        .await
        .unwrap();
    let during = load.await.unwrap();
    assert_accounted("agent partitioned", &during);
    assert!(during.count(200) > during.sent / 2, "most requests still served: {during:?}");
    assert!(c.agents().await.iter().all(|a| a.id != "a2"), "the partitioned agent's lease lapsed");

    // Healed: the agent finds its lease lost, registers under a new one, and the next
    // plan places it again.
    ns.heal().unwrap();
    wait_for(Duration::from_secs(30), "the healed agent did not register again", || async {
        c.agents().await.iter().any(|a| a.id == "a2").then_some(())
    })
    .await
    .unwrap();
    c.ask_replan().await.unwrap();
    c.wait_routing(Duration::from_secs(30), |t| {
        t.epoch > moved.epoch && t.apps.values().flatten().any(|r| r.agent == "a2")
    })
    .await
    .unwrap();
    let after = drive(fe, "img", 40.0, Duration::from_secs(3), 4).await;
    assert_accounted("after the partition healed", &after);
    assert_eq!(after.count(200), after.sent, "{after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partitioned_frontend_resumes_its_watch_after_compaction() {
    let _one_at_a_time = SERIAL.lock().await;
    let Some(ns) = netns(1) else { return };
    let dir = tempfile::tempdir().unwrap();
    let config = config_text(dir.path(), &policies(), 4, 200, 1.0);
    let mut c = Cluster::start_on(&bin(), dir.path(), 3, &config, &[ns.host_ip.into()]).await.unwrap();
    c.allocator("alloc1").unwrap();
    // The agents listen on our end of the pair, where the frontend reaches them.
    c.agent_on("a1", 2, ns.host_ip.into(), None).unwrap();
    c.agent_on("a2", 2, ns.host_ip.into(), None).unwrap();
    let fe = c.frontend_on("f1", 1000, ns.ns_ip.into(), Some(&ns)).unwrap();
    c.wait_ready(fe, Duration::from_secs(60)).await.unwrap();
    let before = drive(fe, "img", 20.0, Duration::from_secs(2), 2).await;
    assert_accounted("before the partition", &before);
    assert_eq!(before.count(200), before.sent, "{before:?}");
    let seen = c.routing().await.unwrap();

    // Cut off long enough for its etcd connection to be declared dead (keep-alive
    // pings every `ETCD_KEEP_ALIVE`, 2 s timeout), then a re-plan and a compaction past
    // everything it saw.
    ns.cut().unwrap();
    tokio::time::sleep(sluice_cluster::store::ETCD_KEEP_ALIVE + Duration::from_secs(4)).await;
    c.ask_replan().await.unwrap();
    let next = c.wait_routing(Duration::from_secs(30), |t| t.epoch > seen.epoch).await.unwrap();
    c.compact_now().await.unwrap();
    ns.heal().unwrap();

    // Its watch resumes from a compacted revision: it lists again and serves on the
    // new table (its record says which epoch it serves on).
    let caught_up = format!("the frontend did not catch up with table {}", next.epoch);
    wait_for(Duration::from_secs(30), &caught_up, || async {
        c.frontends().await.iter().find(|f| f.id == "f1").map(|f| f.routing_epoch).filter(|&e| e >= next.epoch)
    })
    .await
    .unwrap();
    let log = std::fs::read_to_string(&c.procs["f1"].log).unwrap();
    assert!(log.contains("watch compacted: listing again"), "the frontend's watch did not meet the compaction:\n{log}");
    let after = drive(fe, "img", 20.0, Duration::from_secs(2), 2).await;
    assert_accounted("after the partition healed", &after);
    assert_eq!(after.count(200), after.sent, "{after:?}");
}

/// The number after `key` in the demo's summary line (`cluster: sent N, answered N,
/// 200 N, ...`).
fn summary_count(line: &str, key: &str) -> u64 {
    let line = line.strip_prefix("cluster: ").unwrap_or(line);
    line.split(", ")
        .find_map(|part| part.strip_prefix(key)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no `{key}` in the summary line: {line}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_demo_answers_every_request_through_three_kills() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let line = sluice_cluster::demo::run(&bin(), &policies(), dir.path()).await.unwrap();
    eprintln!("{line}");
    assert!(summary_count(&line, "sent") > 0, "{line}");
    assert_eq!(summary_count(&line, "answered"), summary_count(&line, "sent"), "{line}");
    assert_eq!(summary_count(&line, "lost"), 0, "{line}");
    assert_eq!(summary_count(&line, "5xx"), 0, "{line}");
    assert!(summary_count(&line, "200") > summary_count(&line, "sent") / 2, "mostly served: {line}");
    assert!(summary_count(&line, "replans") >= 1, "{line}");
    assert_eq!(summary_count(&line, "agent failovers"), 1, "{line}");
    assert_eq!(summary_count(&line, "allocator failovers"), 1, "{line}");
}

/// The dashboard's cluster card (docs/host.md, "Dashboard"): a frontend's `GET
/// /admin/dashboard` names the roles, the leading allocator, the agents with their
/// devices and the routing table in force, as the store has them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_frontends_dashboard_shows_the_roles_the_leader_and_the_agents() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let token = "cluster-dashboard";
    let config = format!("admin_token = \"{token}\"\n{}", config_text(dir.path(), &policies(), 4, 200, 1.0));
    let mut c = Cluster::start(&bin(), dir.path(), 1, &config).await.unwrap();
    c.allocator("alloc1").unwrap();
    c.allocator("alloc2").unwrap();
    c.agent("a1", 2).unwrap();
    c.agent("a2", 1).unwrap();
    let fe = c.frontend("f1", 1000).unwrap();
    c.wait_ready(fe, Duration::from_secs(60)).await.unwrap();
    let auth = format!("Bearer {token}");
    let fetch = || async {
        let mut client = sluice_loadgen::Client::connect(fe).await.ok()?;
        let r = client.request("GET", "/admin/dashboard", &[("authorization", auth.as_str())], b"").await.ok()?;
        (r.status == 200).then(|| r.json()["cluster"].clone())
    };
    // Until both agents are ready on the table in force and this frontend has
    // published its record (once a second).
    let view = wait_for(Duration::from_secs(30), "the frontend's cluster view", || async {
        let v = fetch().await?;
        let agents = v["agents"].as_array()?;
        let ready = agents.len() == 2 && agents.iter().all(|a| a["health"] == "ready");
        (ready && v["frontends"].as_array()?.len() == 1 && v["leader"].is_string()).then_some(v)
    })
    .await
    .unwrap();
    assert_eq!(view["role"], "frontend", "{view:#}");
    assert_eq!(view["id"], "f1");
    assert_eq!(view["store"]["reachable"], true, "{view:#}");
    let leader = c.leading_allocator().await.unwrap().expect("an allocator leads");
    assert_eq!(view["leader"], leader.as_str(), "{view:#}");
    assert!(["alloc1", "alloc2"].contains(&leader.as_str()));
    let f = &view["frontends"][0];
    assert_eq!((f["id"].as_str(), f["this"].as_bool()), (Some("f1"), Some(true)), "{view:#}");
    // The agents, in id order, with their devices as they registered them.
    let records = c.agents().await;
    for (i, (id, devices)) in [("a1", 2), ("a2", 1)].into_iter().enumerate() {
        let a = &view["agents"][i];
        assert_eq!(a["id"], id, "{view:#}");
        let record = records.iter().find(|r| r.id == id).expect("the agent's record");
        assert_eq!(a["addr"], record.addr.as_str());
        assert_eq!(a["accepting"], true);
        let ds = a["devices"].as_array().unwrap();
        assert_eq!(ds.len(), devices, "{a:#}");
        for (d, dv) in ds.iter().enumerate() {
            assert_eq!((dv["index"].as_u64(), dv["kind"].as_str()), (Some(d as u64), Some("cpu")), "{a:#}");
        }
    }
    // The routing table in force: the store's, and every route on a listed device.
    let table = c.routing().await.unwrap();
    let epoch = view["routing_epoch"].as_u64().unwrap();
    assert!(epoch >= 1 && epoch <= table.epoch, "epoch {epoch} against the store's {}", table.epoch);
    let routes = view["routing"]["apps"]["img"].as_array().unwrap();
    assert!(!routes.is_empty(), "{view:#}");
    let on_devices: usize = view["agents"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|a| a["devices"].as_array().unwrap())
        .map(|d| d["routes"].as_array().unwrap().len())
        .sum();
    assert_eq!(on_devices, routes.len(), "every route shows on its device: {view:#}");
    let shares: f64 = routes.iter().map(|r| r["share"].as_f64().unwrap()).sum();
    assert!((shares - 1.0).abs() < 1e-6, "img's shares sum to 1: {view:#}");
    // Without the token: nothing.
    let mut client = sluice_loadgen::Client::connect(fe).await.unwrap();
    assert_eq!(client.request("GET", "/admin/dashboard", &[], b"").await.unwrap().status, 401);
}
