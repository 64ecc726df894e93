//! sluice as a cluster of real processes on loopback (sluice_cluster::harness): a
//! 3-member etcd cluster, an allocator, agents and a frontend, each `cluster-node serve
//! --role ...` (the roles `sluice serve --role` runs), under bounded load. Every request sent is answered exactly once
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

use std::path::PathBuf;
use std::time::Duration;

use sluice_cluster::harness::{config_text, drive, workspace_root, Cluster, LoadReport};

/// The crate's own role runner (`serve --role ...`, as `sluice serve --role`), so the
/// test builds with this crate alone.
fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_cluster-node"))
}

fn policies() -> PathBuf {
    workspace_root(env!("CARGO_MANIFEST_DIR")).join("target/policies")
}

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
    let leading =
        String::from_utf8(c.store.get(&c.keys.election()).await.unwrap().expect("an allocator leads").value).unwrap();
    c.signal(&leading, "KILL").unwrap();
    // Its lease (2 s) lapses, the standby is elected; a re-plan request shows it leads.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let now = c
            .store
            .get(&c.keys.election())
            .await
            .ok()
            .flatten()
            .map(|kv| String::from_utf8_lossy(&kv.value).into_owned());
        if now.as_deref().is_some_and(|l| l != leading) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no allocator took over from {leading}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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
