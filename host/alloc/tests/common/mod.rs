//! Fixtures the allocator's tests share.

// Each test binary compiles this module and uses a part of it.
#![allow(dead_code)]

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
