//! Fixtures shared by the simulator tests: the built components and a one-model
//! profile with hand-checkable latencies.

use std::path::{Path, PathBuf};

use sluice_sim::Experiment;

/// `target/policies`, which `cargo xtask policies` fills.
pub fn policies() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/policies");
    assert!(dir.join("fixed.wasm").exists(), "run `cargo xtask policies` first");
    dir
}

/// One model `m` (accuracy 0.7): 10 ms at batch 1, 12 ms at batch 2 (p50 = p95 = p99).
pub const PROFILE: &str = r#"version = 1
name = "sim-test"
device = "virtual"
source = "hand-made"

[[model]]
name = "m"
accuracy = 0.7
accuracy_source = "test"
batch_sizes = [1, 2]
p50_us = [10000, 12000]
p95_us = [10000, 12000]
p99_us = [10000, 12000]
"#;

/// Writes `p.toml` (the profile) and an experiment of `body` after the common header
/// into `dir`, and loads it.
pub fn experiment(dir: &Path, body: &str) -> (Experiment, PathBuf) {
    std::fs::write(dir.join("p.toml"), PROFILE).unwrap();
    let text = format!("version = 1\nname = \"t\"\nbuiltin_policy_dir = \"{}\"\n{body}", policies().display());
    let path = dir.join("e.toml");
    std::fs::write(&path, text).unwrap();
    Experiment::load(&path).unwrap()
}

/// The Pareto-optimal image models of the RAMSIS artifact's ModelSwitching tables,
/// in increasing latency (its 1-based table indices follow this order).
pub const PARETO_MODELS: [&str; 9] = [
    "shufflenet_v2_x0_5",
    "mobilenet_v3_large",
    "efficientnet_b0",
    "efficientnet_b2",
    "efficientnet_b3",
    "efficientnet_b4",
    "efficientnet_v2_s",
    "efficientnet_v2_m",
    "efficientnet_v2_l",
];
