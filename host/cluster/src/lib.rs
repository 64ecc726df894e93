//! sluice-cluster: sluice as a cluster of processes coordinated through etcd v3
//! (docs/cluster.md). One binary plays one role (`sluice serve --role ...`): agents
//! own devices and run batches, frontends keep the apps' queues and policies and send
//! batches to agents, and one elected allocator plans placement and routing.
//!
//! Start here:
//! - [`store::Store`]: the slice of etcd v3 the roles use; [`store::EtcdStore`] is
//!   the real one, [`store::MemStore`] the unit tests' one.
//! - [`keys`]: the key layout and the records kept there.
//! - [`election`]: the allocator's election; [`lease::KeptLease`]: leases kept alive.
//! - [`etcd_process::EtcdCluster`]: a local etcd cluster for tests, the demo and benches.
//! - [`simulate`]: the same roles as a whole cluster in virtual time (leases,
//!   failures and plan publication at 100s of agents without 100s of processes).

pub mod agent;
pub mod allocator;
pub mod demo;
pub mod election;
pub mod etcd_process;
pub mod frontend;
pub mod harness;
pub mod keys;
pub mod lease;
pub mod mirror;
pub mod netns;
pub mod roles;
pub mod simulate;
pub mod store;
