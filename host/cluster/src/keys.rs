//! The key layout in the store and the records kept there (JSON values).
//!
//! | key | value | written by | life |
//! |---|---|---|---|
//! | `/sluice/v1/agents/{agent}` | [`AgentRecord`]: address, devices, loaded variants, placement epoch ready | agent | its lease |
//! | `/sluice/v1/demand/{frontend}/{app}` | [`DemandRecord`]: requests/s over the last second | frontend, 1 Hz | its lease |
//! | `/sluice/v1/frontends/{frontend}` | [`FrontendRecord`]: address, routing epoch in force | frontend | its lease |
//! | `/sluice/v1/placement` | [`Placement`]: epoch N, which variant each device loads | allocator | kept |
//! | `/sluice/v1/routing` | [`RoutingTable`]: epoch N, each app's routes and shares | allocator, guarded txn | kept |
//! | `/sluice/v1/election/allocator` | the leader's id | allocator | its lease |
//!
//! Everything sits under a root (`/sluice/v1` by default) so two clusters can share
//! one etcd, and the `v1` lets a later layout live beside this one.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The keys of one cluster under its root.
#[derive(Clone, Debug)]
pub struct Keys {
    root: String,
}

impl Default for Keys {
    fn default() -> Keys {
        Keys::new("/sluice/v1")
    }
}

impl Keys {
    /// The layout under `root` (no trailing slash).
    pub fn new(root: &str) -> Keys {
        Keys { root: root.trim_end_matches('/').to_string() }
    }

    /// Prefix of every agent's record.
    pub fn agents(&self) -> String {
        format!("{}/agents/", self.root)
    }

    /// One agent's record.
    pub fn agent(&self, id: &str) -> String {
        format!("{}/agents/{id}", self.root)
    }

    /// Prefix of every demand record.
    pub fn demand(&self) -> String {
        format!("{}/demand/", self.root)
    }

    /// One frontend's demand for one app.
    pub fn demand_of(&self, frontend: &str, app: &str) -> String {
        format!("{}/demand/{frontend}/{app}", self.root)
    }

    /// Prefix of every frontend's record.
    pub fn frontends(&self) -> String {
        format!("{}/frontends/", self.root)
    }

    /// One frontend's record.
    pub fn frontend(&self, id: &str) -> String {
        format!("{}/frontends/{id}", self.root)
    }

    /// The placement.
    pub fn placement(&self) -> String {
        format!("{}/placement", self.root)
    }

    /// The routing table.
    pub fn routing(&self) -> String {
        format!("{}/routing", self.root)
    }

    /// A put here asks the leading allocator to re-plan now.
    pub fn replan(&self) -> String {
        format!("{}/control/replan", self.root)
    }

    /// The allocator's election.
    pub fn election(&self) -> String {
        format!("{}/election/allocator", self.root)
    }
}

/// One device of an agent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceInfo {
    /// Index on the agent (0, 1, ...).
    pub index: u32,
    /// Its type, as in the config's `[[device]] type` (the profile the allocator uses).
    pub kind: String,
}

/// A variant loaded on one device.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Loaded {
    /// The device's index on the agent.
    pub device: u32,
    /// The app.
    pub app: String,
    /// The variant (model name).
    pub variant: String,
}

/// What an agent reports under its lease.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentRecord {
    /// Its id (unique in the cluster; the pod name on Kubernetes).
    pub id: String,
    /// Where frontends send batches (`http://host:port`).
    pub addr: String,
    /// Its devices.
    pub devices: Vec<DeviceInfo>,
    /// What is loaded and warm now.
    pub loaded: Vec<Loaded>,
    /// The newest placement epoch whose assignments to this agent are all loaded
    /// (0: none yet).
    pub ready_epoch: u64,
    /// False while draining (PreStop): the allocator plans without it.
    pub accepting: bool,
}

/// A frontend's measured demand for one app.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DemandRecord {
    /// Requests/s arriving (accepted or not) over the last second.
    pub qps: f64,
    /// When it was measured, ms since the Unix epoch.
    pub at_ms: u64,
}

/// What a frontend reports under its lease.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FrontendRecord {
    /// Its id.
    pub id: String,
    /// Its client address.
    pub addr: String,
    /// The routing epoch it serves on (0: none yet).
    pub routing_epoch: u64,
}

/// One device's assignment in a placement.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Assignment {
    /// The agent.
    pub agent: String,
    /// The device's index on it.
    pub device: u32,
    /// The app it serves.
    pub app: String,
    /// The variant it loads.
    pub variant: String,
}

/// Which variant each device loads (make before break: placement N+1 adds to what
/// routing N uses; agents unload only what neither the newest placement nor the
/// routing table in force uses).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Placement {
    /// Epoch N (1, 2, ...).
    pub epoch: u64,
    /// The assignments.
    pub assignments: Vec<Assignment>,
}

impl Placement {
    /// The assignments of one agent.
    pub fn of_agent<'a>(&'a self, agent: &'a str) -> impl Iterator<Item = &'a Assignment> + 'a {
        self.assignments.iter().filter(move |a| a.agent == agent)
    }
}

/// One route: a device serving a variant of an app, and its share of the app.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    /// The routing key, `{agent}/{device}`: stable across plans, so a frontend keeps
    /// a device's queue (slot) when a new plan keeps the device.
    pub key: String,
    /// The agent.
    pub agent: String,
    /// Its address.
    pub addr: String,
    /// The device.
    pub device: u32,
    /// The variant it serves.
    pub variant: String,
    /// Its share of the app's requests (an app's shares sum to 1).
    pub share: f64,
}

/// The routing table: every app's routes (epoch N serves only what placement N has
/// loaded, and agents said so).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoutingTable {
    /// Epoch N (the placement epoch it goes with).
    pub epoch: u64,
    /// Per app, its routes.
    pub apps: BTreeMap<String, Vec<Route>>,
    /// Per app, the demand (requests/s) the plan was made for: a newly elected
    /// allocator plans for it until the frontends' reports say otherwise, instead
    /// of for the configured default (absent in tables written before it was kept).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub demand_qps: BTreeMap<String, f64>,
}

/// The routing key of a device.
pub fn route_key(agent: &str, device: u32) -> String {
    format!("{agent}/{device}")
}

/// Encodes a record as the value of a key.
pub fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("records serialize")
}

/// A key's value that is not a valid record ([`decode`]): the key, and serde's why.
#[derive(Debug, thiserror::Error)]
#[error("{key}: not a valid record: {cause}")]
pub struct DecodeError {
    /// The key.
    pub key: String,
    /// What serde found wrong (in the message, so not a `source` too: a chain
    /// printed with `{:#}` would say it twice).
    pub cause: serde_json::Error,
}

/// Decodes a key's value, naming the key when it is not a valid record.
pub fn decode<T: for<'de> Deserialize<'de>>(key: &str, value: &[u8]) -> Result<T, DecodeError> {
    serde_json::from_slice(value).map_err(|cause| DecodeError { key: key.to_string(), cause })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_record_names_its_key() {
        let e = decode::<Vec<u32>>("sluice/routing", b"{not json").unwrap_err();
        assert_eq!(e.key, "sluice/routing");
        assert!(e.to_string().starts_with("sluice/routing: not a valid record: "), "{e}");
        assert_eq!(decode::<Vec<u32>>("k", &encode(&vec![1u32, 2])).unwrap(), vec![1, 2]);
    }
}
