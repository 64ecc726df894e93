//! The standard setting `check` and `bench` measure a policy in: the RAMSIS
//! experiments' image task (the artifact's CPU profile, its 9 Pareto models, SLO
//! 150 ms, 60 workers; RAMSIS §7), compiled into the binary so that it works
//! outside a sluice checkout.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use sluice_core::profile::{Percentile, Profile};

/// `profiles/ramsis-image-cpu.toml`.
pub const PROFILE_TOML: &str = include_str!("../../../../../profiles/ramsis-image-cpu.toml");

/// The Twitter-shaped rate trace the RAMSIS experiments replay
/// (`examples/experiments/twitter-ramsis-300s.txt`: 1617–3905 requests/s over 300 s).
pub const TWITTER_TRACE: &str = include_str!("../../../../../examples/experiments/twitter-ramsis-300s.txt");

/// The 9 models on the accuracy–latency Pareto front, in increasing latency.
pub const MODELS: [&str; 9] = [
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

/// SLO, ms.
pub const SLO_MS: u64 = 150;

/// Workers.
pub const WORKERS: u32 = 60;

/// Largest batch.
pub const MAX_BATCH: u32 = 32;

/// The busiest rate of the standard scenarios at `--scale 1`, requests/s: the
/// Twitter trace's peak (the constant loads are 1000–3000, the bursts 3600).
pub const PEAK_QPS: f64 = 3905.0;

/// The models as a policy sees them (`config.models`): `--profile`'s, or the
/// standard profile's 9 (`models` picks others of the profile).
pub fn models(profile: Option<&Path>, names: &[String]) -> Result<Vec<sluice_sdk::Model>> {
    let profile = match profile {
        Some(p) => Profile::load(p)?,
        None => Profile::parse(PROFILE_TOML, "the standard profile (ramsis-image-cpu)")?,
    };
    let standard: Vec<String> = MODELS.iter().map(|s| s.to_string()).collect();
    let names: Option<&[String]> = match (names.is_empty(), profile.name == "ramsis-image-cpu") {
        (false, _) => Some(names),
        (true, true) => Some(&standard),
        (true, false) => None,
    };
    let models = profile.policy_models(names, Percentile::P95, Some(MAX_BATCH)).map_err(anyhow::Error::msg)?;
    Ok(models.into_iter().map(|(m, _)| m).collect())
}

/// Writes the standard profile and the Twitter trace into `dir`; their paths.
pub fn write_files(dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let profile = dir.join("ramsis-image-cpu.toml");
    let trace = dir.join("twitter-ramsis-300s.txt");
    std::fs::write(&profile, PROFILE_TOML).with_context(|| format!("writing {}", profile.display()))?;
    std::fs::write(&trace, TWITTER_TRACE).with_context(|| format!("writing {}", trace.display()))?;
    Ok((profile, trace))
}

/// Where built-in components are when no directory is given: `target/policies` under
/// the working directory, else under the checkout this binary was built from.
pub fn builtin_dir(given: Option<&Path>) -> PathBuf {
    if let Some(dir) = given {
        return dir.to_path_buf();
    }
    let here = PathBuf::from("target/policies");
    if here.is_dir() {
        return here;
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/policies")
}
