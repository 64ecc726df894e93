//! Fixtures the allocator's tests share.

use sluice_core::profile::ModelProfile;

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
