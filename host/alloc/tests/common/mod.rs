//! Fixtures the allocator's tests share.

// Each test binary compiles this module and uses a part of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sluice_alloc::proteus::{self, DeviceType};
use sluice_core::profile::{ModelProfile, Profile};

/// The workspace's root (profiles/ and examples/ are there).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// InfAdapter's measured capacity table of the ResNets on CPU cores.
pub fn capacity() -> PathBuf {
    root().join("profiles/infadapter-resnet-capacity.toml")
}

/// One app of the ResNets `models` on `count` CPU cores at `demand` requests/s
/// (InfAdapter's world: batch 1, a 750 ms SLO, no β headroom).
pub fn cores_problem(count: u32, demand: f64, models: &[&str]) -> proteus::Problem {
    let profile = Profile::load(&root().join("profiles/infadapter-resnet-cpu1.toml")).unwrap();
    proteus::Problem {
        devices: vec![DeviceType { name: "core".into(), count, memory_mb: None, profile }],
        apps: vec![proteus::App {
            name: "image".into(),
            slo_ms: 750.0,
            demand_qps: demand,
            models: models.iter().map(|s| s.to_string()).collect(),
            memory_mb: BTreeMap::new(),
        }],
        batch_sizes: vec![1],
        objective: Default::default(),
        formulation: Default::default(),
        ladder: proteus::Ladder { beta: 1.0, ..Default::default() },
        solver: Default::default(),
        variants: Default::default(),
        pinned: None,
    }
}

/// A variant measured at batch sizes 1, 2, 4, 8 with these latencies (µs, every
/// percentile alike).
pub fn model(name: &str, accuracy: f64, latencies_us: Vec<u64>) -> ModelProfile {
    ModelProfile {
        name: name.into(),
        accuracy,
        accuracy_source: "test".into(),
        file: None,
        batch_sizes: vec![1, 2, 4, 8],
        p50_us: latencies_us.clone(),
        p95_us: latencies_us.clone(),
        p99_us: latencies_us,
        runs: None,
    }
}

/// A small deterministic generator (no dependency for a test's dice).
pub struct Lcg(pub u64);

impl Lcg {
    /// The next draw, uniform in [0, 1).
    pub fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
    /// A draw uniform in [lo, hi).
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.next()
    }
}
