//! `sluice policy check <file.wasm>`: what an upload would say, before uploading —
//! the world and its version (`sluice_core::runtime::check_world`, then the same
//! compilation an upload runs), the imports and exports, the size — and the cost of
//! `decide` on a standard view (the standard setting's worker 0 with 8 queued
//! requests), as time per call over N calls.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;
use sluice_core::runtime::{self, Binding, Limits, PolicyEngine, PolicyInstance};
use sluice_sdk::{helpers, Config, Pending, View};

use super::standard;

/// `sluice policy check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The component.
    pub file: PathBuf,
    /// `decide` calls to time.
    #[arg(long, default_value_t = 10_000)]
    pub calls: u32,
    /// Requests queued in the standard view.
    #[arg(long, default_value_t = 8)]
    pub queue: u32,
    /// The policy's params (a JSON object) for `init`.
    #[arg(long, default_value = "{}")]
    pub params: String,
    /// A profile for the models instead of the standard one (ramsis-image-cpu).
    #[arg(long)]
    pub profile: Option<PathBuf>,
    /// Models of the profile (comma-separated; default: the standard 9, or all of `--profile`).
    #[arg(long, value_delimiter = ',')]
    pub models: Vec<String>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The standard view: worker 0 of the standard setting at t = 10 s, the load
/// 2000 requests/s, every model loaded, `queue` requests that arrived 2 ms apart,
/// the oldest 30 ms ago.
pub fn standard_view(models: &[sluice_sdk::Model], queue: u32) -> View {
    let now = 10_000_000;
    let slo = standard::SLO_MS * 1000;
    let queue = (0..queue as u64)
        .map(|i| {
            let arrival = now - 30_000 + 2_000 * i;
            Pending { id: i, arrival, deadline: arrival + slo }
        })
        .collect();
    View {
        now,
        worker: 0,
        workers: standard::WORKERS,
        load_qps: 2000.0,
        loaded: models.iter().map(|m| m.id).collect(),
        queue,
    }
}

/// Runs `sluice policy check`.
pub fn run(args: CheckArgs) -> Result<()> {
    let bytes = std::fs::read(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    let interface =
        runtime::component_interface(&bytes).map_err(|e| anyhow::anyhow!("{}: {e}", args.file.display()))?;
    let world = format!("{}@{}", runtime::CONTRACT, runtime::CONTRACT_VERSION);
    if let Err(why) = runtime::check_world(&bytes) {
        bail!(
            "{}: refused, as an upload would be: {why}\n  imports: {}\n  exports: {}",
            args.file.display(),
            interface.imports.join(", "),
            interface.exports.join(", ")
        );
    }
    let name = args.file.file_stem().and_then(|s| s.to_str()).unwrap_or("policy").to_string();
    let engine = PolicyEngine::new()?;
    let compiled = engine.compile(&name, &bytes).map_err(|e| anyhow::anyhow!("{}: {e}", args.file.display()))?;
    let models = standard::models(args.profile.as_deref(), &args.models)?;
    let params: serde_json::Value = serde_json::from_str(&args.params).context("--params is not JSON")?;
    if !params.is_object() {
        bail!("--params must be a JSON object, got {params}");
    }
    let config = Config {
        app: "check".into(),
        slo: standard::SLO_MS * 1000,
        workers: standard::WORKERS,
        worker: 0,
        models: models.clone(),
        params: params.to_string(),
    };
    let limits = Limits::default();
    let binding = Binding::new(compiled.clone(), config, limits);
    let mut instance = PolicyInstance::new(&engine, &binding, 0).map_err(|e| anyhow::anyhow!("{e}"))?;
    let view = standard_view(&models, args.queue);
    let first = instance.decide(&view).map_err(|e| anyhow::anyhow!("{name}: decide failed: {e}"))?;
    let valid = helpers::check_decision(&models, &view, &first).map_err(|e| e.to_string());
    // Warm up (caches, the allocator), then time each call.
    for _ in 0..args.calls.min(100) {
        instance.decide(&view).map_err(|e| anyhow::anyhow!("{name}: decide failed: {e}"))?;
    }
    let mut times: Vec<Duration> = Vec::with_capacity(args.calls as usize);
    for _ in 0..args.calls.max(1) {
        let t = Instant::now();
        instance.decide(&view).map_err(|e| anyhow::anyhow!("{name}: decide failed: {e}"))?;
        times.push(t.elapsed());
    }
    let total: Duration = times.iter().sum();
    times.sort_unstable();
    let pct = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    let mean_us = total.as_secs_f64() * 1e6 / times.len() as f64;
    let budget_us = limits.call_budget.as_secs_f64() * 1e6;
    if args.json {
        let out = json!({
            "file": args.file,
            "world": world,
            "valid": true,
            "size_bytes": bytes.len(),
            "digest": compiled.digest,
            "imports": interface.imports,
            "exports": interface.exports,
            "observed": !interface.observe_unused,
            "compile_ms": compiled.compile_time.as_secs_f64() * 1e3,
            "init_ms": instance.init_time.as_secs_f64() * 1e3,
            "decision": format!("{first:?}"),
            "decision_valid": valid.is_ok(),
            "decision_error": valid.as_ref().err(),
            "decide": {
                "calls": times.len(),
                "queue": args.queue,
                "mean_us": mean_us,
                "p50_us": pct(0.5).as_secs_f64() * 1e6,
                "p99_us": pct(0.99).as_secs_f64() * 1e6,
                "max_us": pct(1.0).as_secs_f64() * 1e6,
                "budget_us": budget_us,
            },
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!("{}: a valid {world} component", args.file.display());
    println!("  size: {:.1} KiB (sha256 {})", bytes.len() as f64 / 1024.0, &compiled.digest[..16]);
    println!("  imports: {}", if interface.imports.is_empty() { "none".into() } else { interface.imports.join(", ") });
    println!("  exports: {}", interface.exports.join(", "));
    println!(
        "  observe: {}",
        if interface.observe_unused {
            "not called (the component says its `observe` does nothing: `Policy::OBSERVES = false`)"
        } else {
            "called after every batch"
        }
    );
    println!(
        "  compile: {:.1} ms, init: {:.2} ms ({} models, SLO {} ms, {} workers)",
        compiled.compile_time.as_secs_f64() * 1e3,
        instance.init_time.as_secs_f64() * 1e3,
        models.len(),
        standard::SLO_MS,
        standard::WORKERS
    );
    match &valid {
        Ok(()) => println!("  decision on the standard view ({} queued): {first:?}", args.queue),
        Err(e) => println!("  decision on the standard view: {first:?} — INVALID, the host would fall back: {e}"),
    }
    println!(
        "  decide: {mean_us:.2} µs per call over {} calls (p50 {:.2} µs, p99 {:.2} µs, max {:.1} µs; budget {:.0} µs)",
        times.len(),
        pct(0.5).as_secs_f64() * 1e6,
        pct(0.99).as_secs_f64() * 1e6,
        pct(1.0).as_secs_f64() * 1e6,
        budget_us
    );
    Ok(())
}
