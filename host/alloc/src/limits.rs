//! The ranges every number of a problem file and of a config's `[[device]]` and
//! `[allocator]` is checked against where it is parsed (docs/allocator.md, "Ranges").
//!
//! The bounds are far above any deployment the allocator is built for (the Proteus
//! paper's cluster has 40 devices, Loki's 20 workers, InfAdapter's 20 cores) and far
//! below what breaks it: each says what an input beyond it would do. A number out of
//! range is a one-line error naming the field, never a model HiGHS is handed: a
//! count of 1e8 devices or cores is a multi-gigabyte model (or `Vec`) before the
//! first solve, 1e300 requests/s is a coefficient HiGHS cannot scale, and 100,000
//! solver threads abort the process in HiGHS's scheduler.

use std::ops::RangeInclusive;

/// Devices of one `[[device]]` type: 1 to 10,000. A type with no devices is a
/// configuration mistake (remove the group instead); above 10,000, the models
/// and the plan's one entry per device grow past what a solve can use.
pub const DEVICE_COUNT: RangeInclusive<u32> = 1..=10_000;

/// Devices of all types together: at most 10,000 (the plan lists every device).
pub const MAX_DEVICES: u32 = 10_000;

/// Devices of all types together with `formulation = "per-device"`: at most 1,000.
/// That formulation has a binary per device and variant (the paper's model, kept
/// for comparison): 10,000 devices of the paper's 46 variants would be a
/// million-column model before the first solve.
pub const MAX_PER_DEVICE_DEVICES: u32 = 1_000;

/// An InfAdapter core budget (`cores`), and any core count (`min_cores`,
/// `fit_cpus`, `current`): 1 to 4,096. Each variant has one binary per core count
/// it may get, so the budget is the model's width.
pub const CORES: RangeInclusive<u32> = 1..=4_096;

/// Loki's cluster (`workers`): 1 to 10,000.
pub const WORKERS: RangeInclusive<u32> = 1..=10_000;

/// Demand (`demand_qps`, `demand_rps`, `min_demand_qps`), requests/s: finite, 0 to
/// 1e9. A coefficient of 1e300 reaches HiGHS as a number it cannot scale.
pub const MAX_DEMAND_QPS: f64 = 1e9;

/// An SLO or SLA (`slo_ms`, `sla_ms`) and `comm_latency_ms`, ms: at most an hour.
pub const MAX_LATENCY_MS: f64 = 3_600_000.0;

/// Memory of a device or a variant (`memory_mb`), MB: positive, at most 1e9 (an
/// exabyte).
pub const MAX_MEMORY_MB: f64 = 1e9;

/// One batch size (`batch_sizes`): 1 to 4,096 (the largest a profile or a worker's
/// queue takes).
pub const BATCH_SIZE: RangeInclusive<u32> = 1..=4_096;

/// How many batch sizes (`batch_sizes`, `fit_cpus`) a list may have: at most 64.
/// Loki has a vertex per variant and batch size.
pub const MAX_LIST: usize = 64;

/// HiGHS threads (`[solver] threads`): 1 to 256. HiGHS starts this many workers in
/// its scheduler whatever the machine has (100,000 aborts with `std::bad_alloc`);
/// more than the machine's cores only slows the solve.
pub const THREADS: RangeInclusive<u32> = 1..=256;

/// The limit of one solve (`time_limit_s`), s: positive, at most a day.
pub const MAX_TIME_LIMIT_S: f64 = 86_400.0;

/// The relative MIP gap (`mip_gap`): 0 to 1.
pub const MIP_GAP: RangeInclusive<f64> = 0.0..=1.0;

/// The ladder's first demand factor (`beta`): above `min_beta`, at most 10 (ten
/// times the demand as headroom).
pub const MAX_BETA: f64 = 10.0;

/// A weight (`[weights]`) or a factor (`capacity_coef`, `threshold`, `vpa_margin`):
/// finite, at most 1e6.
pub const MAX_FACTOR: f64 = 1e6;

/// The re-plan period (`period_s`), s: 0.1 to a day.
pub const PERIOD_S: RangeInclusive<f64> = 0.1..=86_400.0;

/// Re-plans skipped while demand stays (`stabilization`): at most 1,000,000.
pub const MAX_STABILIZATION: u32 = 1_000_000;

/// Whether `x` is finite and within `0..=max`.
pub fn within(x: f64, max: f64) -> bool {
    x.is_finite() && (0.0..=max).contains(&x)
}

/// Whether `x` is finite, above 0 and at most `max`.
pub fn positive_within(x: f64, max: f64) -> bool {
    x.is_finite() && x > 0.0 && x <= max
}

/// "1 to 10000" for a range's error message.
pub fn span(r: &RangeInclusive<u32>) -> String {
    format!("{} to {}", r.start(), r.end())
}

/// A number of a problem file, a config's `[[device]]` / `[allocator]` or a problem
/// built in code that is out of its range (the ranges above). The message says what
/// was expected; the caller names the field (`device.gpu.count: expected ...`),
/// since the same range serves several fields.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum RangeError {
    /// `count` of one device type outside [`DEVICE_COUNT`].
    #[error("expected {} devices (a type with none is a mistake: remove its [[device]])", span(&DEVICE_COUNT))]
    DeviceCount(u32),
    /// All device types together above [`MAX_DEVICES`] (or
    /// [`MAX_PER_DEVICE_DEVICES`] with `formulation = "per-device"`).
    #[error(
        "{total} devices in all: expected at most {max}{}",
        if *per_device { " with formulation = \"per-device\"" } else { "" }
    )]
    TotalDevices {
        /// The devices given.
        total: u32,
        /// The most the formulation takes.
        max: u32,
        /// Whether the per-device formulation set the (lower) bound.
        per_device: bool,
    },
    /// `memory_mb` not positive or above [`MAX_MEMORY_MB`].
    #[error("expected a positive number of MB, at most {:e}", MAX_MEMORY_MB)]
    Memory(f64),
    /// An SLO or SLA not positive or above [`MAX_LATENCY_MS`].
    #[error("expected a positive number of milliseconds, at most {}", MAX_LATENCY_MS)]
    Latency(f64),
    /// Demand outside 0 to [`MAX_DEMAND_QPS`] (or not finite).
    #[error("expected a number of requests/s from 0 to {:e}", MAX_DEMAND_QPS)]
    Demand(f64),
    /// `batch_sizes` empty, longer than [`MAX_LIST`] or with a size outside
    /// [`BATCH_SIZE`].
    #[error("expected 1 to {} batch sizes of {} each", MAX_LIST, span(&BATCH_SIZE))]
    BatchSizes(Vec<u32>),
    /// A core count outside [`CORES`] (`zero_ok`: 0 was allowed too).
    #[error("expected {} to {} cores", if *zero_ok { 0 } else { *CORES.start() }, CORES.end())]
    Cores {
        /// The count given.
        count: u32,
        /// Whether 0 is allowed.
        zero_ok: bool,
    },
    /// An InfAdapter core budget (`cores`) outside [`CORES`].
    #[error("expected a budget of {} cores", span(&CORES))]
    CoreBudget(u32),
    /// `fit_cpus` with fewer than 2 or more than [`MAX_LIST`] counts, or a count
    /// outside [`CORES`].
    #[error("expected 2 to {} core counts of {} each", MAX_LIST, span(&CORES))]
    FitCpus(Vec<u32>),
    /// A factor (`capacity_coef`) not positive or above [`MAX_FACTOR`].
    #[error("expected a positive factor, at most {:e}", MAX_FACTOR)]
    Factor(f64),
    /// A `[weights]` entry negative, not finite or above [`MAX_FACTOR`].
    #[error("expected weights from 0 to {:e}", MAX_FACTOR)]
    Weights,
    /// `[ladder]` with `beta`, `step` or `min_beta` out of range.
    #[error("expected beta in (0, {}], step in (0, 1] and min_beta from 0 to below beta", MAX_BETA)]
    Ladder,
    /// `[ladder]` with `beta` not above `min_beta`.
    #[error("beta must be above min_beta")]
    LadderOrder,
}

// The range checks every problem file and `[allocator]` config shares (the ranges
// above; docs/allocator.md, "Ranges"). Each returns what was expected; the caller
// names the field.

/// `count` of one device type: 1 to 10,000.
pub(crate) fn check_count(count: u32) -> Result<(), RangeError> {
    if !DEVICE_COUNT.contains(&count) {
        return Err(RangeError::DeviceCount(count));
    }
    Ok(())
}

/// `memory_mb`: positive, at most 1e9 MB.
pub(crate) fn check_memory(mb: f64) -> Result<(), RangeError> {
    if !positive_within(mb, MAX_MEMORY_MB) {
        return Err(RangeError::Memory(mb));
    }
    Ok(())
}

/// An SLO or SLA, ms: positive, at most an hour.
pub(crate) fn check_slo(ms: f64) -> Result<(), RangeError> {
    if !positive_within(ms, MAX_LATENCY_MS) {
        return Err(RangeError::Latency(ms));
    }
    Ok(())
}

/// Demand, requests/s: finite, 0 to 1e9.
pub(crate) fn check_demand(qps: f64) -> Result<(), RangeError> {
    if !within(qps, MAX_DEMAND_QPS) {
        return Err(RangeError::Demand(qps));
    }
    Ok(())
}

/// `batch_sizes`: 1 to 64 sizes of 1 to 4,096.
pub(crate) fn check_batches(sizes: &[u32]) -> Result<(), RangeError> {
    if sizes.is_empty() || sizes.len() > MAX_LIST || sizes.iter().any(|b| !BATCH_SIZE.contains(b)) {
        return Err(RangeError::BatchSizes(sizes.to_vec()));
    }
    Ok(())
}

/// A core count (`cores`, `min_cores`, `fit_cpus`, `current`): 1 to 4,096 (`zero_ok`:
/// 0 too).
pub(crate) fn check_cores(n: u32, zero_ok: bool) -> Result<(), RangeError> {
    if !(CORES.contains(&n) || zero_ok && n == 0) {
        return Err(RangeError::Cores { count: n, zero_ok });
    }
    Ok(())
}

/// `fit_cpus`: 2 to 64 core counts of 1 to 4,096.
pub(crate) fn check_fit_cpus(cpus: &[u32]) -> Result<(), RangeError> {
    if cpus.len() < 2 || cpus.len() > MAX_LIST || cpus.iter().any(|&n| check_cores(n, false).is_err()) {
        return Err(RangeError::FitCpus(cpus.to_vec()));
    }
    Ok(())
}

/// A factor (`capacity_coef`): positive, at most 1e6.
pub(crate) fn check_factor(x: f64) -> Result<(), RangeError> {
    if !positive_within(x, MAX_FACTOR) {
        return Err(RangeError::Factor(x));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_errors_say_what_was_expected_and_keep_the_bad_value() {
        let e = check_count(0).unwrap_err();
        assert_eq!(e, RangeError::DeviceCount(0));
        assert_eq!(e.to_string(), "expected 1 to 10000 devices (a type with none is a mistake: remove its [[device]])");
        assert_eq!(check_cores(0, false).unwrap_err().to_string(), "expected 1 to 4096 cores");
        assert_eq!(check_cores(5000, true).unwrap_err().to_string(), "expected 0 to 4096 cores");
        assert_eq!(check_demand(f64::NAN).unwrap_err().to_string(), "expected a number of requests/s from 0 to 1e9");
        assert_eq!(check_batches(&[0]).unwrap_err(), RangeError::BatchSizes(vec![0]));
        assert_eq!(check_fit_cpus(&[4]).unwrap_err(), RangeError::FitCpus(vec![4]));
        let total = RangeError::TotalDevices { total: 1001, max: 1000, per_device: true };
        assert_eq!(total.to_string(), "1001 devices in all: expected at most 1000 with formulation = \"per-device\"");
        assert!(check_slo(1.0).is_ok() && check_memory(1.0).is_ok() && check_factor(1.0).is_ok());
    }
}
