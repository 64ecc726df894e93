//! `sluice profile`: measure each model's latency at each batch size with the
//! `onnx` executor and write a [`Profile`].
//!
//! The models and their input shapes come from the model directory's
//! `manifest.json` (written by `xtask/scripts/make_models.py`); accuracy and its
//! citation from an accuracy file (`profiles/imagenet-accuracy.toml`):
//!
//! ```toml
//! version = 1
//! [[model]]
//! name = "resnet50"
//! accuracy = 0.7613
//! source = "torchvision resnet50 IMAGENET1K_V1, acc@1 76.130"
//! ```
//!
//! Each (model, batch size) is warmed up, then timed `--runs` times through
//! [`OnnxModel::run`] — the same call the server makes, input conversion and
//! output copy included. With `--max-seconds-per-model`, a slow model stops adding
//! runs once its budget is spent (never below [`MIN_RUNS`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Deserialize;

use crate::executor::onnx::{self, OnnxModel, OnnxOptions};
use sluice_core::profile::{ModelProfile, Profile};
use sluice_core::tensor::{DataType, Tensor, TensorData};

/// The fewest timed runs behind a percentile, whatever the time budget: with
/// fewer, p95 and p99 are just the maximum of a handful of samples.
pub const MIN_RUNS: u32 = 5;

/// Options of `sluice profile`.
#[derive(Clone, Debug, clap::Args)]
pub struct ProfileArgs {
    /// Model directory holding `manifest.json` and the `.onnx` files.
    #[arg(long, default_value = "models/imagenet")]
    pub models: PathBuf,
    /// Profile only these models (comma-separated manifest names).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Batch sizes to measure (comma-separated, increasing).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    pub batch_sizes: Vec<u32>,
    /// Timed runs per (model, batch size).
    #[arg(long, default_value_t = 20)]
    pub runs: u32,
    /// Untimed warm-up runs per (model, batch size).
    #[arg(long, default_value_t = 3)]
    pub warmup: u32,
    /// ONNX Runtime intra-op threads per session.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Time budget per model in seconds: once spent, a batch size stops adding
    /// timed runs (keeping at least 5). Unused budget of a batch size passes on
    /// to the next.
    #[arg(long)]
    pub max_seconds_per_model: Option<f64>,
    /// Profile to write.
    #[arg(long, default_value = "profiles/imagenet-light-cpu.toml")]
    pub out: PathBuf,
    /// Published accuracy per model, with sources.
    #[arg(long, default_value = "profiles/imagenet-accuracy.toml")]
    pub accuracy: PathBuf,
    /// Free text appended to the profile's `source` (e.g. what else ran on the
    /// machine during the measurement).
    #[arg(long)]
    pub note: Option<String>,
    /// ONNX Runtime shared library (default: `ORT_DYLIB_PATH`, then the project's `.venv`).
    #[arg(long)]
    pub onnxruntime: Option<PathBuf>,
    /// Run the models on ONNX Runtime's CUDA execution provider (a sluice built
    /// with `--features cuda`, `onnxruntime-gpu`'s library and the CUDA libraries
    /// it loads). A model CUDA cannot take is an error, not a fallback to CPU as
    /// in `sluice serve`: a CPU profile labelled with a GPU would mislead the
    /// allocator.
    #[arg(long)]
    pub cuda: bool,
}

#[derive(Deserialize)]
struct Manifest {
    version: u32,
    models: Vec<ManifestModel>,
}

#[derive(Deserialize)]
struct ManifestModel {
    name: String,
    file: String,
    input: ManifestTensor,
}

#[derive(Deserialize)]
struct ManifestTensor {
    name: String,
    shape: Vec<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AccuracyFile {
    version: u32,
    #[serde(rename = "model")]
    models: Vec<AccuracyEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AccuracyEntry {
    name: String,
    accuracy: f64,
    source: String,
}

/// Runs `sluice profile`: measures, prints a summary and writes `args.out`.
pub fn run(args: ProfileArgs) -> anyhow::Result<()> {
    ensure!(!args.batch_sizes.is_empty(), "--batch-sizes is empty");
    ensure!(
        args.batch_sizes[0] >= 1 && args.batch_sizes.windows(2).all(|w| w[0] < w[1]),
        "--batch-sizes must be >= 1 and strictly increasing, got {:?}",
        args.batch_sizes
    );
    ensure!(args.runs >= 1, "--runs must be >= 1");
    if let Some(budget) = args.max_seconds_per_model {
        ensure!(budget.is_finite() && budget > 0.0, "--max-seconds-per-model must be a positive number of seconds");
    }
    // Other work on the machine inflates every percentile (a ResNet-50 p95 of
    // 104 ms measured beside a build, ~85 ms quiet): say so before, and record it.
    let load_before = load_average();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    if let Some(l) = load_before.filter(|l| *l > BUSY_LOAD_PER_CORE * cores) {
        tracing::warn!(
            "the machine is busy (1-minute load average {l:.2} on {cores} cores): the profile will be \
             pessimistic; profile on a quiet machine for figures policies can rely on"
        );
    }

    let manifest_path = args.models.join("manifest.json");
    let manifest: Manifest = serde_json::from_str(&std::fs::read_to_string(&manifest_path).with_context(|| {
        format!("{}: cannot read (run `cargo xtask setup` to make the models)", manifest_path.display())
    })?)
    .with_context(|| format!("{}: not a model manifest", manifest_path.display()))?;
    ensure!(
        manifest.version == 1,
        "{}: manifest version {} is not supported",
        manifest_path.display(),
        manifest.version
    );

    let accuracy = read_accuracy(&args.accuracy)?;

    let known: BTreeSet<&str> = manifest.models.iter().map(|m| m.name.as_str()).collect();
    for name in &args.only {
        ensure!(
            known.contains(name.as_str()),
            "--only {name}: no such model in {} (known: {})",
            manifest_path.display(),
            known.iter().copied().collect::<Vec<_>>().join(", ")
        );
    }
    let selected: Vec<&ManifestModel> =
        manifest.models.iter().filter(|m| args.only.is_empty() || args.only.contains(&m.name)).collect();
    for m in &selected {
        ensure!(
            accuracy.iter().any(|a| a.name == m.name),
            "{}: no accuracy for model `{}`",
            args.accuracy.display(),
            m.name
        );
    }

    let lib = onnx::init_runtime(args.onnxruntime.as_deref())?;
    let options = OnnxOptions { intra_threads: args.threads.max(1), cuda: args.cuda };

    let per_step = u64::from(args.warmup + args.runs);
    let bar = ProgressBar::new(selected.len() as u64 * args.batch_sizes.len() as u64 * per_step);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:32}] {pos}/{len} runs  {msg}")
            .expect("valid progress template")
            .progress_chars("=> "),
    );

    let started = Instant::now();
    let mut profiles = Vec::with_capacity(selected.len());
    for m in &selected {
        let path = args.models.join(&m.file);
        let mut model = OnnxModel::load(&path, &options).with_context(|| format!("model `{}`", m.name))?;
        ensure!(
            !args.cuda || model.execution_provider() == "CUDA",
            "model `{}`: --cuda, but its session runs on {} (the warning above says why)",
            m.name,
            model.execution_provider()
        );
        if model.input_shape() != m.input.shape.as_slice() || model.input_name() != m.input.name {
            bail!(
                "model `{}`: manifest says input {}{:?} but the model has {}{:?}",
                m.name,
                m.input.name,
                m.input.shape,
                model.input_name(),
                model.input_shape()
            );
        }
        let model_started = Instant::now();
        let budget = args.max_seconds_per_model.map(Duration::from_secs_f64);
        let n = args.batch_sizes.len() as u32;
        let (mut p50, mut p95, mut p99) = (Vec::new(), Vec::new(), Vec::new());
        let mut fewest_runs = u32::MAX;
        for (i, &b) in args.batch_sizes.iter().enumerate() {
            // Cumulative deadline: what a fast batch size leaves unused passes on.
            let deadline = budget.map(|t| model_started + t * (i as u32 + 1) / n);
            let input = random_batch(&model, b as usize, i as u64 + 1);
            bar.set_message(format!("{} batch {b}: warm-up", m.name));
            for _ in 0..args.warmup {
                model.run(&input).with_context(|| format!("model `{}` at batch {b}", m.name))?;
                bar.inc(1);
            }
            let first = model.run(&input)?;
            ensure!(
                first.first().and_then(|t| t.shape.first()) == Some(&(b as usize)),
                "model `{}`: batch {b} gave outputs of shape {:?}; is dimension 0 dynamic (make_models.py)?",
                m.name,
                first.first().map(|t| &t.shape)
            );
            let mut samples_us = Vec::with_capacity(args.runs as usize);
            for r in 0..args.runs {
                if let Some(d) = deadline {
                    if r >= MIN_RUNS && Instant::now() >= d {
                        break;
                    }
                }
                bar.set_message(format!("{} batch {b}: run {}/{}", m.name, r + 1, args.runs));
                let t = Instant::now();
                let out = model.run(&input)?;
                samples_us.push(t.elapsed().as_secs_f64() * 1e6);
                drop(out);
                bar.inc(1);
            }
            let done = samples_us.len() as u32;
            bar.inc(u64::from(args.runs - done));
            fewest_runs = fewest_runs.min(done);
            samples_us.sort_by(f64::total_cmp);
            p50.push(percentile_linear(&samples_us, 0.50).round() as u64);
            p95.push(percentile_linear(&samples_us, 0.95).round() as u64);
            p99.push(percentile_linear(&samples_us, 0.99).round() as u64);
        }
        let acc = accuracy.iter().find(|a| a.name == m.name).expect("checked above");
        let line = format!(
            "{:<13} p50 {} ms  ({} runs min, {:.1} s)",
            m.name,
            args.batch_sizes
                .iter()
                .zip(&p50)
                .map(|(b, us)| format!("b{b}={:.1}", *us as f64 / 1000.0))
                .collect::<Vec<_>>()
                .join(" "),
            fewest_runs,
            model_started.elapsed().as_secs_f64()
        );
        bar.suspend(|| println!("{line}"));
        profiles.push(ModelProfile {
            name: m.name.clone(),
            accuracy: acc.accuracy,
            accuracy_source: acc.source.clone(),
            file: Some(m.file.clone()),
            batch_sizes: args.batch_sizes.clone(),
            p50_us: p50,
            p95_us: p95,
            p99_us: p99,
            runs: Some(fewest_runs),
        });
    }
    bar.finish_and_clear();

    let threads = args.threads.max(1);
    let mut source = format!(
        "measured by `sluice profile` on {} (UTC) with ONNX Runtime {}: per model and batch size, \
         {} untimed warm-up run(s), then up to {} timed runs of OnnxModel::run on a fixed random input",
        utc_date(SystemTime::now()),
        ort_version(&lib),
        args.warmup,
        args.runs,
    );
    if let Some(budget) = args.max_seconds_per_model {
        source.push_str(&format!(" (fewer, at least {MIN_RUNS}, once a model had used its {budget} s budget)"));
    }
    source.push_str("; percentiles use numpy's 'linear' definition");
    if let (Some(before), Some(after)) = (load_before, load_average()) {
        source.push_str(&format!(
            "; 1-minute load average {before:.2} before and {after:.2} after, on {cores} cores{}",
            if before.max(after) > BUSY_LOAD_PER_CORE * cores { " (busy: figures are pessimistic)" } else { "" }
        ));
    }
    if let Some(note) = &args.note {
        source.push_str("; ");
        source.push_str(note);
    }
    let profile = Profile {
        name: args.out.file_stem().map_or_else(|| "profile".into(), |s| s.to_string_lossy().into_owned()),
        device: if args.cuda {
            format!("cuda: {} (ONNX Runtime's CUDA execution provider; host CPU {})", gpu_model(), cpu_model())
        } else {
            format!(
                "cpu: {} ({} cores visible), {threads} intra-op thread{}",
                cpu_model(),
                std::thread::available_parallelism().map_or(0, |n| n.get()),
                if threads == 1 { "" } else { "s" }
            )
        },
        source,
        models: profiles,
    };
    let text = profile.to_toml_string();
    // The writer and the reader must agree; check before touching the file.
    Profile::parse(&text, &args.out.display().to_string()).context("the measured profile does not validate")?;
    if let Some(dir) = args.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&args.out, text).with_context(|| format!("writing {}", args.out.display()))?;
    println!(
        "wrote {} ({} models, {:.0} s)",
        args.out.display(),
        profile.models.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn read_accuracy(path: &Path) -> anyhow::Result<Vec<AccuracyEntry>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}: cannot read", path.display()))?;
    let file: AccuracyFile =
        toml::from_str(&text).with_context(|| format!("{}: invalid accuracy file", path.display()))?;
    ensure!(file.version == 1, "{}: version {} is not supported (expected 1)", path.display(), file.version);
    for (i, a) in file.models.iter().enumerate() {
        ensure!(
            (0.0..=1.0).contains(&a.accuracy),
            "{}: model `{}`: accuracy {} is outside [0, 1]",
            path.display(),
            a.name,
            a.accuracy
        );
        ensure!(
            !file.models[..i].iter().any(|b| b.name == a.name),
            "{}: model `{}` appears twice",
            path.display(),
            a.name
        );
    }
    Ok(file.models)
}

/// Percentile `q` in [0, 1] of ascending `sorted` samples with numpy's default
/// `'linear'` method: the value at fractional rank `(n - 1) * q`, interpolated
/// between its neighbours. NaN for no samples.
pub fn percentile_linear(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        1 => sorted[0],
        n => {
            let h = (n - 1) as f64 * q.clamp(0.0, 1.0);
            let lo = h.floor() as usize;
            let hi = (lo + 1).min(n - 1);
            sorted[lo] + (h - lo as f64) * (sorted[hi] - sorted[lo])
        }
    }
}

/// A batch of `batch` samples of uniform pseudo-random values in [0, 1) (zeros
/// for non-float inputs); fixed by `seed` so that runs are comparable.
fn random_batch(model: &OnnxModel, batch: usize, seed: u64) -> Tensor {
    let zeros = model.zero_batch(batch);
    if model.input_datatype() != DataType::F32 {
        return zeros;
    }
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let data = (0..zeros.data.len())
        .map(|_| {
            // xorshift64*: cheap and good enough for input pixels.
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32
        })
        .collect();
    Tensor { data: TensorData::F32(data), ..zeros }
}

/// The CPU's model name from `/proc/cpuinfo`, or `unknown CPU`.
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.split_whitespace().collect::<Vec<_>>().join(" "))
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// The first NVIDIA GPU's model as its driver reports it (`NVIDIA H200`), from
/// `/proc/driver/nvidia/gpus/*/information`.
fn gpu_model() -> String {
    // One folder per GPU, named by its PCI address: the first in bus order.
    let mut gpus: Vec<PathBuf> =
        std::fs::read_dir("/proc/driver/nvidia/gpus").into_iter().flatten().flatten().map(|g| g.path()).collect();
    gpus.sort();
    gpus.iter()
        .find_map(|gpu| {
            let info = std::fs::read_to_string(gpu.join("information")).ok()?;
            let line = info.lines().find(|l| l.starts_with("Model:"))?;
            Some(line.trim_start_matches("Model:").trim().to_string())
        })
        .unwrap_or_else(|| "unknown NVIDIA GPU".into())
}

/// `1.31.1` from `.../libonnxruntime.so.1.31.1`, else the file name.
fn ort_version(lib: &Path) -> String {
    let name = lib.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    match name.split_once(".so.") {
        Some((_, version)) if !version.is_empty() => version.to_string(),
        _ => name,
    }
}

/// `YYYY-MM-DD` of `t` in UTC (no date crate needed for one line of text).
fn utc_date(t: SystemTime) -> String {
    let days = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() / 86_400) as i64;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

/// Load average per core above which the machine counts as busy for profiling.
const BUSY_LOAD_PER_CORE: f64 = 0.25;

/// The 1-minute load average (`/proc/loadavg`; None where it does not exist).
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_matches_numpy_linear() {
        // numpy.percentile([1, 2, 3, 4], [50, 95, 99]) == [2.5, 3.85, 3.97]
        let s = [1.0, 2.0, 3.0, 4.0];
        assert!((percentile_linear(&s, 0.50) - 2.5).abs() < 1e-12);
        assert!((percentile_linear(&s, 0.95) - 3.85).abs() < 1e-12);
        assert!((percentile_linear(&s, 0.99) - 3.97).abs() < 1e-12);
        assert_eq!(percentile_linear(&[7.0], 0.99), 7.0);
        assert!(percentile_linear(&[], 0.5).is_nan());
    }

    #[test]
    fn dates_and_versions() {
        assert_eq!(utc_date(UNIX_EPOCH), "1970-01-01");
        assert_eq!(utc_date(UNIX_EPOCH + Duration::from_secs(951_782_400)), "2000-02-29");
        assert_eq!(ort_version(Path::new("/x/libonnxruntime.so.1.31.1")), "1.31.1");
        assert_eq!(ort_version(Path::new("/x/libonnxruntime.so")), "libonnxruntime.so");
    }

    #[test]
    fn accuracy_file_in_the_repository_covers_the_manifest_models() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let acc = read_accuracy(&root.join("profiles/imagenet-accuracy.toml")).unwrap();
        let names: Vec<&str> = acc.iter().map(|a| a.name.as_str()).collect();
        for want in [
            "alexnet",
            "densenet121",
            "inception_v1",
            "inception_v2",
            "resnet50",
            "shufflenet",
            "squeezenet",
            "vgg19",
            "zfnet512",
        ] {
            assert!(names.contains(&want), "no accuracy for {want}");
        }
        assert!(acc.iter().all(|a| !a.source.trim().is_empty()));
    }

    /// Measures the real profile. Run from anywhere with
    /// `SLUICE_PROFILE_ARGS="--max-seconds-per-model 60" SLUICE_PROFILE_NOTE="..." cargo test --release -p sluice-server --lib profiling::tests::measure -- --ignored --nocapture`
    /// (a stand-in until `sluice profile` is wired in main.rs).
    #[test]
    #[ignore = "measures real models for minutes; run explicitly"]
    fn measure() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: ProfileArgs,
        }
        let extra = std::env::var("SLUICE_PROFILE_ARGS").unwrap_or_default();
        let argv = std::iter::once("profile".to_string()).chain(extra.split_whitespace().map(str::to_string));
        let mut cli = Cli::parse_from(argv);
        // A note has spaces: it comes in its own variable.
        if let Ok(note) = std::env::var("SLUICE_PROFILE_NOTE") {
            cli.args.note = Some(note);
        }
        // Default paths are relative to the repository root.
        std::env::set_current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")).unwrap();
        run(cli.args).unwrap();
    }
}
