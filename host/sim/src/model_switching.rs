//! `sluice model-switching build`: the ModelSwitching baseline's table (RAMSIS §7,
//! "Baseline MS&S Policies"), built as the artifact builds it (`MS_gen.py`):
//! simulate each model alone at each load (Poisson, 300 s) and keep, per load, the
//! most accurate model whose SLO-violation rate stays strictly under 1% — its p99
//! response latency within the SLO —, the fastest model when none does.
//!
//! The simulation is `sluice sim`'s with the artifact's setting ([`Setup::Reference`],
//! the default): one shared FIFO that idle workers take from
//! (`FullInorderQueuePi`), the `model-switching` component serving the one model at
//! the artifact's batch cap for that load (`StaticInstPi`,
//! `policy_model_switching::Batching::Reference`), no host expiry (late requests
//! are served late), the violation rate over the requests taken before the 300 s
//! end ([`crate::Accounting::Reference`]; the run stops there), and a run whose queue reaches 10,000
//! requests rejected (the artifact's "queue size exploded!" assertion, which fails
//! the run and leaves its violation rate at 1). [`Setup::Sluice`] is the setting
//! sluice used before: round-robin workers, the `fixed` component with
//! deadline-sized batches, host expiry, every request counted.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result};
use serde::Deserialize;
use sluice_core::profile::Profile;

use crate::{run_experiment, Experiment};

/// `sluice model-switching build` arguments.
#[derive(clap::Args, Debug)]
pub struct BuildArgs {
    /// Profile of the models.
    #[arg(long)]
    pub profile: PathBuf,
    /// Models to choose from (default: all in the profile).
    #[arg(long, value_delimiter = ',')]
    pub models: Vec<String>,
    /// SLO in ms.
    #[arg(long, default_value_t = 150.0)]
    pub slo_ms: f64,
    /// Workers (K).
    #[arg(long, default_value_t = 60)]
    pub workers: u32,
    /// Loads to tabulate, requests/s.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "200,400,600,800,1000,1200,1400,1600,1800,2000,2200,2400,2600,2800,3000,3200,3400,3600,3800,4000"
    )]
    pub loads: Vec<f64>,
    /// Simulated seconds per (model, load): the artifact's `eval_seconds = 5*60`.
    #[arg(long, default_value_t = 300.0)]
    pub duration: f64,
    /// A model qualifies when its violation rate is strictly below this (the
    /// artifact's `target_violation_rate = 1e-2`: p99 response latency within the SLO).
    #[arg(long, default_value_t = 0.01)]
    pub threshold: f64,
    /// Largest batch.
    #[arg(long, default_value_t = 32)]
    pub max_batch: u32,
    /// Seed of the Poisson arrivals. The artifact seeds numpy with 0
    /// (`run_sim(seed=0)`); sluice's generator is another one, so the same number
    /// gives other arrivals, and a load at which a model sits on the 1% boundary can
    /// be decided either way by the seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Where the built-in components are.
    #[arg(long, default_value = "target/policies")]
    pub policies: PathBuf,
    /// Write the table here (JSON: `{"table": [[load, model], ...]}`, the policy's params).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Compare with a reference table directory (`test_rate-<r>_pi.json` files).
    #[arg(long)]
    pub compare: Option<PathBuf>,
    /// How each (model, load) is simulated: as the RAMSIS artifact does, or as
    /// sluice did before.
    #[arg(long, value_enum, default_value_t = Setup::Reference)]
    pub setup: Setup,
}

/// How `build` simulates one model at one load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Setup {
    /// The artifact's `MS_gen.py`: shared FIFO, its batch cap, no expiry, the
    /// requests taken before the end counted, 10,000 queued fails the run.
    #[default]
    Reference,
    /// Round-robin, deadline-sized batches (`fixed`), expiry one SLO after the
    /// deadline, every request counted, 100,000 queued fails the run.
    Sluice,
}

/// The queue length at which the artifact's simulator gives up on a run
/// (`simulator.py`: `assert len(cur_resp_times) < 10000`).
const REFERENCE_MAX_QUEUE: usize = 10_000;

/// Converts a reference table directory into the policy's params table, naming
/// each 1-based index by `names` (the models in increasing batch-1 latency, as
/// [`model_order`] gives them).
pub fn convert_reference(dir: &std::path::Path, names: &[String]) -> Result<Vec<(f64, String)>> {
    read_reference(dir)?
        .into_iter()
        .map(|(load, index)| {
            let name = index.checked_sub(1).and_then(|i| names.get(i)).with_context(|| {
                format!("{}: load {load}: model index {index} beyond the {} models", dir.display(), names.len())
            })?;
            Ok((load as f64, name.clone()))
        })
        .collect()
}

/// The models in increasing batch-1 latency order (the reference's 1-based indices).
pub fn model_order(b: &BuildArgs) -> Result<Vec<String>> {
    models_by_latency(&b.profile, &b.models, b.max_batch)
}

/// The `models` of `profile` (all when empty) in increasing batch-1 latency order,
/// the order the artifact numbers them in.
pub fn models_by_latency(profile: &std::path::Path, models: &[String], max_batch: u32) -> Result<Vec<String>> {
    let profile = Profile::load(profile)?;
    let names = if models.is_empty() { None } else { Some(models) };
    let mut models = profile
        .policy_models(names, sluice_core::profile::Percentile::P95, Some(max_batch))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    models.sort_by_key(|(m, _)| m.latency.first().copied().unwrap_or(u64::MAX));
    Ok(models.into_iter().map(|(m, _)| m.name).collect())
}

/// Reads a reference table directory: load (requests/s) → 1-based model index.
pub fn read_reference(dir: &std::path::Path) -> Result<BTreeMap<u64, usize>> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("read {}", dir.display()))? {
        let path = e?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        let Some(rate) = name.strip_prefix("test_rate-").and_then(|r| r.strip_suffix("_pi.json")) else { continue };
        let per_us: f64 = rate.parse().with_context(|| format!("{name}: bad rate"))?;
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path)?)?;
        let index = v["-1"].as_u64().with_context(|| format!("{name}: no \"-1\" entry"))? as usize;
        out.insert((per_us * 1e6).round() as u64, index);
    }
    Ok(out)
}

/// Builds the table: per load, models tried from the most accurate down; the first
/// whose violation rate is under the threshold wins (the fastest model when none is).
pub fn build(b: &BuildArgs) -> Result<Vec<(f64, String)>> {
    let profile = Profile::load(&b.profile)?;
    let names = if b.models.is_empty() { None } else { Some(b.models.as_slice()) };
    let mut models: Vec<(String, f64, u64)> = profile
        .policy_models(names, sluice_core::profile::Percentile::P95, Some(b.max_batch))
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .into_iter()
        .map(|(m, _)| (m.name.clone(), m.accuracy, m.latency.first().copied().unwrap_or(u64::MAX)))
        .collect();
    models.sort_by(|a, b| b.1.total_cmp(&a.1));
    let fastest = models.iter().min_by_key(|m| m.2).map(|m| m.0.clone()).context("no models")?;
    let model_list = models.iter().map(|m| format!("\"{}\"", m.0)).collect::<Vec<_>>().join(", ");
    let cwd = std::env::current_dir()?;
    let mut table = Vec::new();
    for &load in &b.loads {
        let mut chosen = None;
        for (name, _, _) in &models {
            let (r, _) = simulate(b, &model_list, name, load, &cwd)?;
            if r.overloaded.is_none() && r.violation_rate < b.threshold {
                chosen = Some(name.clone());
                break;
            }
        }
        table.push((load, chosen.unwrap_or_else(|| fastest.clone())));
    }
    Ok(table)
}

/// Simulates `model` alone at `load` as `b.setup` says; the run's result (its
/// `violation_rate` in that setup's accounting) and the experiment text.
pub fn simulate(
    b: &BuildArgs,
    model_list: &str,
    model: &str,
    load: f64,
    cwd: &std::path::Path,
) -> Result<(crate::stats::RunResult, String)> {
    let abs = |p: &PathBuf| if p.is_absolute() { p.clone() } else { cwd.join(p) };
    let (policy, params, router, extra) = match b.setup {
        Setup::Reference => (
            "model-switching",
            format!("{{ table = [[{load:?}, \"{model}\"]], load_qps = {load:?}, batching = \"reference\" }}"),
            "shared",
            // Never expire: the artifact serves every request, late ones late.
            "expire_after_ms = 1e9\n",
        ),
        Setup::Sluice => ("fixed", format!("{{ model = \"{model}\" }}"), "round-robin", ""),
    };
    // The artifact's loop ends at `eval_time`; what is queued then is not counted.
    let (accounting, max_queue, drain) = match b.setup {
        Setup::Reference => ("reference", REFERENCE_MAX_QUEUE, false),
        Setup::Sluice => ("sluice", 100_000, true),
    };
    let text = format!(
        "version = 1\nname = \"model-switching-build\"\nseed = {}\nduration_s = {}\nbuiltin_policy_dir = \"{}\"\naccounting = \"{accounting}\"\nmax_queue = {max_queue}\ndrain = {drain}\n[[app]]\nname = \"app\"\nslo_ms = {}\nworkers = {}\nrouter = \"{router}\"\n{extra}profile = \"{}\"\nmodels = [{model_list}]\nmax_batch = {}\npolicy = \"{policy}\"\nparams = {params}\narrivals = {{ kind = \"poisson\", rate_qps = {load} }}\n",
        b.seed,
        b.duration,
        abs(&b.policies).display(),
        b.slo_ms,
        b.workers,
        abs(&b.profile).display(),
        b.max_batch
    );
    let exp = Experiment::parse(&text, "model-switching build", cwd)?;
    let out = run_experiment(&exp, cwd, false)?;
    Ok((out.results[0].clone(), text))
}
