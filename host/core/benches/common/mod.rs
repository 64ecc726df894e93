//! What the `decide` and `swap` benchmarks share: where the workspace and the
//! built components are, and the four-variant app both run their policies on.

use std::path::{Path, PathBuf};

use sluice_sdk::testing::linear_model;
use sluice_sdk::{Config, Micros};

/// The app's SLO.
pub const SLO_US: Micros = 100_000;

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The bytes of `target/policies/<name>.wasm`.
pub fn component(name: &str) -> Vec<u8> {
    let path = root().join("target/policies").join(format!("{name}.wasm"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}: run `cargo xtask policies` first", path.display()))
}

/// Four ImageNet-like variants, fast/inaccurate to slow/accurate, each
/// `L(b) = base + step·(b-1)` µs profiled up to b = 32; 4 workers.
pub fn config(params: &str) -> Config {
    Config {
        app: "bench".into(),
        slo: SLO_US,
        workers: 4,
        worker: 0,
        models: vec![
            linear_model(0, "mobilenet", 0.70, 2_000, 300, 32),
            linear_model(1, "resnet18", 0.74, 4_000, 600, 32),
            linear_model(2, "resnet50", 0.78, 9_000, 1_400, 32),
            linear_model(3, "efficientnet", 0.82, 15_000, 2_500, 32),
        ],
        params: params.into(),
    }
}
