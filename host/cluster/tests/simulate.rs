//! A whole cluster in virtual time (`sluice_cluster::simulate`): the real allocator,
//! agent and frontend roles on a modelled network, through starts, a re-plan, killed
//! agents, a partition and the leader's loss. The bounds below are the protocol's
//! (lease TTLs, keep-alive periods, timeouts), which virtual time makes exact enough
//! to assert.

use std::time::Duration;

use sluice_cluster::harness::workspace_root;
use sluice_cluster::simulate::{simulate, SimSpec};

#[test]
fn a_simulated_cluster_routes_around_dead_and_partitioned_agents_and_a_dead_leader() {
    let dir = tempfile::tempdir().unwrap();
    let policies = workspace_root(env!("CARGO_MANIFEST_DIR")).join("target/policies");
    let spec = SimSpec::lan(20, &policies);
    let ttl = Duration::from_secs(spec.ttl_s as u64);
    let report = simulate(&spec, dir.path()).unwrap();
    println!("{report}");
    let step = |what: &str| report.steps.iter().find(|s| s.what.starts_with(what)).unwrap_or_else(|| panic!("{what}"));

    // Round trips, not seconds, when nothing has to time out.
    assert!(step("start").serving < Duration::from_secs(1), "{report}");
    let asked = step("re-plan asked");
    assert!(asked.published < Duration::from_millis(100), "{report}");
    assert!(asked.serving >= asked.published);
    // A killed agent's lease lapses one TTL after its last keep-alive (sent every
    // third of the TTL), and not before.
    let killed = step("2 agents killed");
    assert!(killed.published >= ttl * 2 / 3 && killed.published <= ttl + Duration::from_millis(500), "{report}");
    let cut = step("1 agent partitioned");
    assert!(cut.published >= ttl * 2 / 3 && cut.published <= ttl + Duration::from_millis(500), "{report}");
    // Healed, it registers on its next tick (within the store timeout of a call
    // begun while cut) and is placed again.
    let healed = step("the partition healed");
    assert!(healed.published <= Duration::from_secs(4), "{report}");
    // The standby is elected when the dead leader's lease lapses, then plans.
    let leader = step("leader killed");
    assert!(leader.published >= ttl * 2 / 3 && leader.published <= ttl + Duration::from_secs(2), "{report}");
    assert!(report.failovers >= 2, "the kill and the partition are failovers: {report}");
    // The standby planned for the demand reported, not the configured default.
    assert_eq!(report.standby_planned_for, Some(sluice_cluster::simulate::LEADER_DEMAND_QPS), "{report}");
}
