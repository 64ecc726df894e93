//! `cargo xtask cluster-demo`: builds `sluice` and the demo runner, then runs the
//! cluster demo (`sluice_cluster::demo`): a 3-member etcd cluster, two allocators,
//! two agents and a frontend on loopback, bounded load through a re-plan and the
//! kills of an agent, the leading allocator and an etcd member. The runner is a binary of sluice-cluster so that xtask itself stays light
//! (it must build before `setup` has installed what the host crates need).

use std::path::Path;
use std::process::Command;

use anyhow::Result;

/// Runs the demo; its last line is `cluster: sent N, answered N, 200 N, 429 N, 504 N,
/// 5xx N, lost N, replans N, agent failovers N, allocator failovers N`.
pub fn run(root: &Path) -> Result<()> {
    crate::run(Command::new("cargo").current_dir(root).args([
        "build",
        "--release",
        "-p",
        "sluice",
        "-p",
        "sluice-cluster",
        "--bin",
        "sluice",
        "--bin",
        "cluster-demo",
    ]))?;
    let dir = root.join("target/cluster-demo");
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    crate::run(
        Command::new(root.join("target/release/cluster-demo"))
            .arg(root.join("target/release/sluice"))
            .arg(root.join("target/policies"))
            .arg(&dir),
    )
}
