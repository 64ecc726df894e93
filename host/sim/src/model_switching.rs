//! `sluice model-switching build`: the ModelSwitching baseline's table (RAMSIS §7,
//! "Baseline MS&S Policies"), built as the artifact builds it: simulate each model
//! alone at each load (Poisson, 300 s by default) and keep, per load, the most
//! accurate model whose SLO-violation rate stays under 1% (its p99 response latency
//! within the SLO). The simulation is `sluice sim`'s, with the `fixed` component.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result};
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
    /// Simulated seconds per (model, load).
    #[arg(long, default_value_t = 300.0)]
    pub duration: f64,
    /// Largest acceptable violation rate.
    #[arg(long, default_value_t = 0.01)]
    pub threshold: f64,
    /// Largest batch.
    #[arg(long, default_value_t = 32)]
    pub max_batch: u32,
    /// Seed of the Poisson arrivals.
    #[arg(long, default_value_t = 1)]
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
}

/// The models in increasing batch-1 latency order (the reference's 1-based indices).
pub fn model_order(b: &BuildArgs) -> Result<Vec<String>> {
    let profile = Profile::load(&b.profile)?;
    let names = if b.models.is_empty() { None } else { Some(b.models.as_slice()) };
    let mut models = profile
        .policy_models(names, sluice_core::profile::Percentile::P95, Some(b.max_batch))
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
    let abs = |p: &PathBuf| if p.is_absolute() { p.clone() } else { cwd.join(p) };
    let mut table = Vec::new();
    for &load in &b.loads {
        let mut chosen = None;
        for (name, _, _) in &models {
            let text = format!(
                "version = 1\nname = \"model-switching-build\"\nseed = {}\nduration_s = {}\nbuiltin_policy_dir = \"{}\"\n[[app]]\nname = \"app\"\nslo_ms = {}\nworkers = {}\nrouter = \"round-robin\"\nprofile = \"{}\"\nmodels = [{model_list}]\nmax_batch = {}\npolicy = \"fixed\"\nparams = {{ model = \"{name}\" }}\narrivals = {{ kind = \"poisson\", rate_qps = {load} }}\n",
                b.seed,
                b.duration,
                abs(&b.policies).display(),
                b.slo_ms,
                b.workers,
                abs(&b.profile).display(),
                b.max_batch
            );
            let exp = Experiment::parse(&text, "model-switching build", &cwd)?;
            let out = run_experiment(&exp, &cwd, false)?;
            let r = &out.results[0];
            if r.overloaded.is_none() && r.violation_rate < b.threshold {
                chosen = Some(name.clone());
                break;
            }
        }
        table.push((load, chosen.unwrap_or_else(|| fastest.clone())));
    }
    Ok(table)
}
