//! The `onnx` executor: real models through ONNX Runtime (the `ort` crate).
//!
//! 1. [`init_runtime`] finds `libonnxruntime.so` (config key, `ORT_DYLIB_PATH`, or
//!    the project's `.venv`, where `cargo xtask setup` installs the `onnxruntime`
//!    wheel) and creates the process-wide ONNX Runtime environment, once.
//! 2. [`OnnxModel::load`] opens one session per (worker, model), on CPU or, when
//!    asked and available, CUDA.
//! 3. [`OnnxModel::run`] runs one batch, already concatenated along dimension 0,
//!    and returns every output with the same leading dimension.
//!
//! `ort` is built with `load-dynamic`: nothing links against ONNX Runtime at build
//! time, so a missing library is a clear error at start-up rather than a link
//! failure (DESIGN.md, "Toolchain facts").

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ort::environment::Environment;
use ort::session::builder::GraphOptimizationLevel;
use ort::session::Session;
use ort::value::{TensorElementType, TensorRef, ValueType};
use thiserror::Error;

use sluice_core::tensor::{DataType, Tensor, TensorData};

/// Environment variable naming the ONNX Runtime shared library (the same one `ort`
/// itself reads).
pub const ORT_DYLIB_PATH: &str = "ORT_DYLIB_PATH";

/// Where `cargo xtask setup` puts the library, relative to the repository root.
/// The `onnxruntime` wheel ships only the versioned name (`...so.1.31.1`).
const VENV_PATTERN: &str = ".venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so*";

/// How to fix a missing library; every "not found" error ends with it.
const HOW_TO_FIX: &str = "run `cargo xtask setup` (it installs the onnxruntime wheel into .venv) \
                          or set ORT_DYLIB_PATH to the path of libonnxruntime.so";

/// The ONNX Runtime shared library could not be found or loaded.
#[derive(Debug, Error)]
pub enum OrtLoadError {
    /// A path was given explicitly (configuration or `ORT_DYLIB_PATH`) but is not a file.
    #[error("ONNX Runtime library {} (from {origin}) does not exist; {HOW_TO_FIX}", path.display())]
    Missing {
        /// The path given.
        path: PathBuf,
        /// Who gave it: `the configuration` or `ORT_DYLIB_PATH`.
        origin: &'static str,
    },
    /// Nothing was given and the search found nothing.
    #[error("ONNX Runtime library not found; looked for ORT_DYLIB_PATH (not set) and in:\n{}\n{HOW_TO_FIX}",
            .searched.iter().map(|p| format!("  {p}")).collect::<Vec<_>>().join("\n"))]
    NotFound {
        /// Every pattern that was tried, in order.
        searched: Vec<String>,
    },
    /// The file exists but ONNX Runtime refused to load from it (wrong file, too old).
    #[error("cannot load ONNX Runtime from {}: {message}", path.display())]
    Load {
        /// The library file.
        path: PathBuf,
        /// What the loader said.
        message: String,
    },
    /// The library loaded but the environment could not be created.
    #[error("cannot create the ONNX Runtime environment: {0}")]
    Environment(String),
}

/// A model could not be loaded or run.
#[derive(Debug, Error)]
pub enum OnnxError {
    /// ONNX Runtime itself is unavailable.
    #[error(transparent)]
    Runtime(#[from] OrtLoadError),
    /// ONNX Runtime rejected the model file or the session options.
    #[error("model {}: cannot load: {source}", path.display())]
    Load {
        /// The model file.
        path: PathBuf,
        /// ONNX Runtime's error.
        #[source]
        source: ort::Error,
    },
    /// The model loads but is outside what this executor supports.
    #[error("model {}: {reason}", path.display())]
    Unsupported {
        /// The model file.
        path: PathBuf,
        /// What is not supported.
        reason: String,
    },
    /// The batch given to [`OnnxModel::run`] does not fit the model's input.
    #[error("model {model}: {reason}")]
    Input {
        /// The model's file name.
        model: String,
        /// What is wrong with the batch.
        reason: String,
    },
    /// ONNX Runtime failed while running a batch.
    #[error("model {model}: run failed: {source}")]
    Run {
        /// The model's file name.
        model: String,
        /// ONNX Runtime's error.
        #[source]
        source: ort::Error,
    },
    /// An output has an element type this executor does not convert.
    #[error("model {model}: output {output} has unsupported element type {ty}")]
    Output {
        /// The model's file name.
        model: String,
        /// The output's name.
        output: String,
        /// ONNX Runtime's name for the element type.
        ty: String,
    },
}

/// The process-wide ONNX Runtime: the library it came from and the environment
/// every session is built in. `ort` allows one environment per process, and
/// holds only a weak reference to it, so this keeps it alive for good.
struct Runtime {
    path: PathBuf,
    env: Environment,
}

/// A mutex rather than a `OnceLock`, so that a failed attempt (library not
/// installed yet) is not remembered and a later call can succeed.
static RUNTIME: Mutex<Option<Runtime>> = Mutex::new(None);

/// Finds the ONNX Runtime shared library, loads it and creates the environment.
///
/// Search order: `explicit` (the `onnxruntime` configuration key), then the
/// `ORT_DYLIB_PATH` environment variable, then
/// `.venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so*` under the
/// current directory, each of its ancestors, and each ancestor of the running
/// executable (so `target/release/sluice serve` finds the project's `.venv`).
/// An explicit path that does not exist is an error, not a reason to search.
///
/// Idempotent: later calls return the path loaded first (with a warning when
/// they asked for a different one: a process can load ONNX Runtime only once).
pub fn init_runtime(explicit: Option<&Path>) -> Result<PathBuf, OrtLoadError> {
    let mut runtime = RUNTIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(rt) = runtime.as_ref() {
        if let Some(wanted) = explicit {
            if wanted != rt.path {
                tracing::warn!(
                    loaded = %rt.path.display(),
                    requested = %wanted.display(),
                    "ONNX Runtime is already loaded; keeping the first library"
                );
            }
        }
        return Ok(rt.path.clone());
    }
    let path = locate_library(explicit)?;
    let builder =
        ort::init_from(&path).map_err(|e| OrtLoadError::Load { path: path.clone(), message: e.to_string() })?;
    let env = builder
        .with_name("sluice")
        .with_telemetry(false)
        .build()
        .map_err(|e| OrtLoadError::Environment(e.to_string()))?;
    tracing::info!(library = %path.display(), "ONNX Runtime loaded");
    *runtime = Some(Runtime { path: path.clone(), env });
    Ok(path)
}

/// The environment, initialising the runtime with the default search if needed.
fn environment() -> Result<Environment, OrtLoadError> {
    init_runtime(None)?;
    let runtime = RUNTIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    // `init_runtime` just succeeded, so the runtime is there.
    Ok(runtime.as_ref().map(|rt| rt.env.clone()).expect("runtime initialised above"))
}

fn locate_library(explicit: Option<&Path>) -> Result<PathBuf, OrtLoadError> {
    if let Some(path) = explicit {
        return existing(path, "the configuration");
    }
    if let Some(path) = std::env::var_os(ORT_DYLIB_PATH).filter(|v| !v.is_empty()) {
        return existing(Path::new(&path), ORT_DYLIB_PATH);
    }
    let mut bases: Vec<PathBuf> = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        bases.extend(cwd.ancestors().map(Path::to_path_buf));
    }
    if let Ok(exe) = std::env::current_exe() {
        bases.extend(exe.ancestors().skip(1).map(Path::to_path_buf));
    }
    let mut searched = Vec::new();
    for base in bases {
        let pattern = base.join(VENV_PATTERN).display().to_string();
        if searched.contains(&pattern) {
            continue;
        }
        searched.push(pattern);
        if let Some(found) = search_venv(&base) {
            return Ok(found);
        }
    }
    Err(OrtLoadError::NotFound { searched })
}

fn existing(path: &Path, origin: &'static str) -> Result<PathBuf, OrtLoadError> {
    if path.is_file() {
        Ok(path.to_path_buf())
    } else {
        Err(OrtLoadError::Missing { path: path.to_path_buf(), origin })
    }
}

/// `<base>/.venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so*`,
/// the last match in name order when there are several.
fn search_venv(base: &Path) -> Option<PathBuf> {
    let lib = base.join(".venv").join("lib");
    let mut found: Vec<PathBuf> = Vec::new();
    for python in std::fs::read_dir(&lib).ok()?.flatten() {
        if !python.file_name().to_string_lossy().starts_with("python3") {
            continue;
        }
        let capi = python.path().join("site-packages").join("onnxruntime").join("capi");
        let Ok(entries) = std::fs::read_dir(&capi) else { continue };
        found.extend(
            entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("libonnxruntime.so"))
                .map(|e| e.path())
                .filter(|p| p.is_file()),
        );
    }
    found.sort();
    found.pop()
}

/// Session options for [`OnnxModel::load`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OnnxOptions {
    /// Threads ONNX Runtime may use inside one operator. Default 1: one worker per
    /// core is how sluice scales, and more intra-op threads per worker make the
    /// workers fight for cores and their latency unpredictable.
    pub intra_threads: usize,
    /// Try the CUDA execution provider; fall back to CPU, with a warning, when it is
    /// not available.
    pub cuda: bool,
}

impl Default for OnnxOptions {
    fn default() -> Self {
        OnnxOptions { intra_threads: 1, cuda: false }
    }
}

/// One ONNX Runtime session for one model: a single input whose dimension 0 is the
/// batch, any number of outputs.
pub struct OnnxModel {
    session: Session,
    /// File name, used in errors and logs.
    label: String,
    input_name: String,
    input_type: DataType,
    input_shape: Vec<usize>,
    output_names: Vec<String>,
    provider: &'static str,
}

impl std::fmt::Debug for OnnxModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnnxModel")
            .field("model", &self.label)
            .field("input", &self.input_name)
            .field("input_shape", &self.input_shape)
            .field("outputs", &self.output_names)
            .field("provider", &self.provider)
            .finish()
    }
}

impl OnnxModel {
    /// Loads `path` into a new session (initialising the runtime with the default
    /// search if [`init_runtime`] was not called).
    ///
    /// The model must have exactly one input, of a type [`DataType`] covers, whose
    /// dimensions other than the first are fixed.
    pub fn load(path: &Path, opts: &OnnxOptions) -> Result<OnnxModel, OnnxError> {
        let env = environment()?;
        let load_err = |source: ort::Error| OnnxError::Load { path: path.to_path_buf(), source };
        let mut builder = Session::builder(&env)
            .map_err(load_err)?
            .with_optimization_level(GraphOptimizationLevel::All)
            .map_err(|e| load_err(e.into()))?
            .with_intra_threads(opts.intra_threads.max(1))
            .map_err(|e| load_err(e.into()))?;
        let mut provider = "CPU";
        if opts.cuda {
            let (b, outcome) = cuda::register(builder);
            builder = b;
            match outcome {
                Ok(()) => provider = "CUDA",
                Err(why) => {
                    tracing::warn!(model = %path.display(), "CUDA requested but unavailable ({why}); running on CPU")
                }
            }
        }
        let session = builder.commit_from_file(path).map_err(load_err)?;
        let unsupported = |reason: String| OnnxError::Unsupported { path: path.to_path_buf(), reason };

        let [input] = session.inputs() else {
            return Err(unsupported(format!(
                "has {} inputs; the onnx executor runs single-input models",
                session.inputs().len()
            )));
        };
        let (input_type, dims) = match input.dtype() {
            ValueType::Tensor { ty, shape, .. } => (*ty, shape.iter().copied().collect::<Vec<i64>>()),
            other => return Err(unsupported(format!("input {} is not a tensor but {other:?}", input.name()))),
        };
        let input_type = datatype(input_type).ok_or_else(|| {
            unsupported(format!("input {} has unsupported element type {input_type:?}", input.name()))
        })?;
        if dims.is_empty() {
            return Err(unsupported(format!("input {} is a scalar; dimension 0 must be the batch", input.name())));
        }
        if dims[0] > 0 {
            tracing::warn!(
                model = %path.display(),
                "input dimension 0 is fixed at {}: batches of another size will fail \
                 (xtask/scripts/make_models.py makes it dynamic)",
                dims[0]
            );
        }
        let mut input_shape = Vec::with_capacity(dims.len() - 1);
        for (i, &d) in dims.iter().enumerate().skip(1) {
            if d <= 0 {
                return Err(unsupported(format!(
                    "input {} dimension {i} is dynamic; only dimension 0 (the batch) may be",
                    input.name()
                )));
            }
            input_shape.push(d as usize);
        }
        let model = OnnxModel {
            label: path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned()),
            input_name: input.name().to_string(),
            input_type,
            input_shape,
            output_names: session.outputs().iter().map(|o| o.name().to_string()).collect(),
            provider,
            session,
        };
        tracing::info!(
            model = %path.display(),
            provider,
            intra_threads = opts.intra_threads.max(1),
            "loaded onnx model"
        );
        Ok(model)
    }

    /// The name of the model's input.
    pub fn input_name(&self) -> &str {
        &self.input_name
    }

    /// The element type of the model's input.
    pub fn input_datatype(&self) -> DataType {
        self.input_type
    }

    /// The input's dimensions without the batch dimension, as declared by the model
    /// (`[3, 224, 224]` for the ImageNet models).
    pub fn input_shape(&self) -> &[usize] {
        &self.input_shape
    }

    /// The names of the model's outputs, in the order [`OnnxModel::run`] returns them.
    pub fn output_names(&self) -> &[String] {
        &self.output_names
    }

    /// The execution provider the session runs on: `"CPU"` or `"CUDA"`.
    pub fn execution_provider(&self) -> &'static str {
        self.provider
    }

    /// Runs one batch (samples concatenated along dimension 0) and returns all
    /// outputs, each with the batch's leading dimension.
    pub fn run(&mut self, batch: &Tensor) -> Result<Vec<Tensor>, OnnxError> {
        let input_err = |reason: String| OnnxError::Input { model: self.label.clone(), reason };
        if batch.datatype() != self.input_type {
            return Err(input_err(format!(
                "input {} is {} but the batch is {}",
                self.input_name,
                self.input_type.oip_name(),
                batch.datatype().oip_name()
            )));
        }
        if batch.shape.len() != self.input_shape.len() + 1 || batch.shape[1..] != self.input_shape[..] {
            return Err(input_err(format!(
                "input {} has shape [batch, {}] but the batch has shape {:?}",
                self.input_name,
                self.input_shape.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
                batch.shape
            )));
        }
        let expected: usize = batch.shape.iter().product();
        if expected != batch.data.len() {
            return Err(input_err(format!(
                "shape {:?} needs {expected} elements, got {}",
                batch.shape,
                batch.data.len()
            )));
        }
        if batch.shape[0] == 0 {
            return Err(input_err("empty batch".into()));
        }

        let run_err = |source: ort::Error| OnnxError::Run { model: self.label.clone(), source };
        let shape = batch.shape.clone();
        // Borrow the batch's elements: no copy on the way in.
        let input = match &batch.data {
            TensorData::F32(v) => TensorRef::from_array_view((shape, v.as_slice())).map(|t| t.into_dyn()),
            TensorData::F64(v) => TensorRef::from_array_view((shape, v.as_slice())).map(|t| t.into_dyn()),
            TensorData::I32(v) => TensorRef::from_array_view((shape, v.as_slice())).map(|t| t.into_dyn()),
            TensorData::I64(v) => TensorRef::from_array_view((shape, v.as_slice())).map(|t| t.into_dyn()),
            TensorData::U8(v) => TensorRef::from_array_view((shape, v.as_slice())).map(|t| t.into_dyn()),
        }
        .map_err(run_err)?;
        let label = self.label.clone();
        let outputs =
            self.session.run(ort::inputs![input]).map_err(|source| OnnxError::Run { model: label.clone(), source })?;

        let mut result = Vec::with_capacity(outputs.len());
        for (name, value) in outputs.iter() {
            let unsupported = |ty: String| OnnxError::Output { model: label.clone(), output: name.to_string(), ty };
            let ty = value.dtype().tensor_type().ok_or_else(|| unsupported(format!("{:?}", value.dtype())))?;
            let run_err = |source: ort::Error| OnnxError::Run { model: label.clone(), source };
            let (shape, data) = match ty {
                TensorElementType::Float32 => {
                    let (s, d) = value.try_extract_tensor::<f32>().map_err(run_err)?;
                    (s.clone(), TensorData::F32(d.to_vec()))
                }
                TensorElementType::Float64 => {
                    let (s, d) = value.try_extract_tensor::<f64>().map_err(run_err)?;
                    (s.clone(), TensorData::F64(d.to_vec()))
                }
                TensorElementType::Int32 => {
                    let (s, d) = value.try_extract_tensor::<i32>().map_err(run_err)?;
                    (s.clone(), TensorData::I32(d.to_vec()))
                }
                TensorElementType::Int64 => {
                    let (s, d) = value.try_extract_tensor::<i64>().map_err(run_err)?;
                    (s.clone(), TensorData::I64(d.to_vec()))
                }
                TensorElementType::Uint8 => {
                    let (s, d) = value.try_extract_tensor::<u8>().map_err(run_err)?;
                    (s.clone(), TensorData::U8(d.to_vec()))
                }
                other => return Err(unsupported(format!("{other:?}"))),
            };
            // Output dimensions are actual sizes here, never negative.
            let shape = shape.iter().map(|&d| d.max(0) as usize).collect();
            result.push(Tensor { name: name.to_string(), shape, data });
        }
        Ok(result)
    }

    /// An all-zero batch of `batch` samples for this model's input.
    pub fn zero_batch(&self, batch: usize) -> Tensor {
        let mut shape = Vec::with_capacity(self.input_shape.len() + 1);
        shape.push(batch);
        shape.extend_from_slice(&self.input_shape);
        let n: usize = shape.iter().product();
        let data = match self.input_type {
            DataType::F32 => TensorData::F32(vec![0.0; n]),
            DataType::F64 => TensorData::F64(vec![0.0; n]),
            DataType::I32 => TensorData::I32(vec![0; n]),
            DataType::I64 => TensorData::I64(vec![0; n]),
            DataType::U8 => TensorData::U8(vec![0; n]),
        };
        Tensor { name: self.input_name.clone(), shape, data }
    }

    /// Runs an all-zero batch of `batch` samples once, so that the first real
    /// request does not pay for ONNX Runtime's lazy allocations (the first run of
    /// a session is several times slower than the next). A failure is logged, not
    /// returned: the same failure will surface, with its request, on the first run.
    pub fn warm(&mut self, batch: usize) {
        let zeros = self.zero_batch(batch.max(1));
        if let Err(e) = self.run(&zeros) {
            tracing::warn!(model = %self.label, batch, "warm-up run failed: {e}");
        }
    }
}

/// ONNX Runtime element type to sluice's, for the types [`DataType`] covers.
fn datatype(ty: TensorElementType) -> Option<DataType> {
    Some(match ty {
        TensorElementType::Float32 => DataType::F32,
        TensorElementType::Float64 => DataType::F64,
        TensorElementType::Int32 => DataType::I32,
        TensorElementType::Int64 => DataType::I64,
        TensorElementType::Uint8 => DataType::U8,
        _ => return None,
    })
}

/// The CUDA execution provider.
///
/// `ort` compiles its CUDA support only with its `cuda` feature, which this crate
/// forwards as its own `cuda` feature (`cuda = ["ort/cuda"]` in `host/Cargo.toml`;
/// with `load-dynamic` the feature downloads and links nothing). Without it, or
/// when the loaded library has no CUDA provider (the `onnxruntime` wheel from PyPI
/// is CPU-only; CUDA needs `onnxruntime-gpu` and the CUDA libraries), asking for
/// CUDA falls back to CPU with a warning.
mod cuda {
    use ort::session::builder::SessionBuilder;

    /// Why CUDA could not be registered: the session runs on CPU, and the warning
    /// says why.
    #[derive(Debug, thiserror::Error)]
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(super) enum Unavailable {
        /// The library loaded has no CUDA provider.
        #[error(
            "the loaded ONNX Runtime library has no CUDA execution provider \
             (the `onnxruntime` wheel is CPU-only; use `onnxruntime-gpu`)"
        )]
        NoProvider,
        /// ONNX Runtime refused the provider (its message: the builder's error is
        /// consumed to get the builder back).
        #[error("{0}")]
        Ort(String),
        /// sluice was built without the `cuda` feature.
        #[error("this build of sluice has no CUDA support (build with `--features cuda`)")]
        #[cfg_attr(feature = "cuda", allow(dead_code))]
        NotBuilt,
    }

    /// Registers CUDA on `builder`; hands the builder back either way, with the
    /// reason when CUDA could not be registered.
    #[cfg(feature = "cuda")]
    pub(super) fn register(builder: SessionBuilder) -> (SessionBuilder, Result<(), Unavailable>) {
        use ort::ep::{ExecutionProvider, CUDA};
        match <CUDA as ExecutionProvider>::is_available() {
            Ok(true) => {}
            Ok(false) => return (builder, Err(Unavailable::NoProvider)),
            Err(e) => return (builder, Err(Unavailable::Ort(e.to_string()))),
        }
        // `error_on_failure`: without it ort logs the failure and silently goes on
        // with CPU, and the log line saying CUDA would be a lie.
        match builder.with_execution_providers([CUDA::default().build().error_on_failure()]) {
            Ok(builder) => (builder, Ok(())),
            Err(e) => {
                let why = Unavailable::Ort(e.to_string());
                (e.recover(), Err(why))
            }
        }
    }

    /// Registers CUDA on `builder`; hands the builder back either way, with the
    /// reason when CUDA could not be registered.
    #[cfg(not(feature = "cuda"))]
    pub(super) fn register(builder: SessionBuilder) -> (SessionBuilder, Result<(), Unavailable>) {
        (builder, Err(Unavailable::NotBuilt))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn models_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/imagenet")
    }

    /// Loads a model that `cargo xtask setup` must have produced; the test suite
    /// always runs after setup, so a missing file is a failure, not a skip.
    fn load_or_explain(name: &str) -> OnnxModel {
        let path = models_dir().join(name);
        assert!(
            path.is_file(),
            "{} is missing: run `cargo xtask setup` (it runs xtask/scripts/make_models.py)",
            path.display()
        );
        if let Err(e) = init_runtime(None) {
            panic!("{e}");
        }
        OnnxModel::load(&path, &OnnxOptions::default()).unwrap_or_else(|e| panic!("{e}"))
    }

    fn sample(seed: u32, shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        let mut x = seed.wrapping_mul(2_654_435_761).max(1);
        let data = (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x >> 8) as f32 / (1u32 << 24) as f32
            })
            .collect();
        let mut full = vec![1];
        full.extend_from_slice(shape);
        Tensor::new("data_0", full, TensorData::F32(data)).unwrap()
    }

    #[test]
    fn squeezenet_batches_match_single_runs() {
        let mut model = load_or_explain("squeezenet.onnx");
        assert_eq!(model.input_shape(), &[3, 224, 224]);
        assert_eq!(model.input_datatype(), DataType::F32);
        assert_eq!(model.output_names(), &["softmaxout_1".to_string()]);
        model.warm(2);

        let a = sample(1, model.input_shape());
        let b = sample(2, model.input_shape());
        let single_a = model.run(&a).unwrap();
        let single_b = model.run(&b).unwrap();
        // SqueezeNet's output keeps its 1x1 spatial dimensions: [batch, 1000, 1, 1].
        assert_eq!(single_a[0].shape, vec![1, 1000, 1, 1]);

        let batch = Tensor::concat(&[&a, &b]).unwrap();
        let both = model.run(&batch).unwrap();
        assert_eq!(both.len(), 1);
        assert_eq!(both[0].shape, vec![2, 1000, 1, 1]);
        let rows = both[0].split(2).unwrap();
        for (row, single) in rows.iter().zip([&single_a[0], &single_b[0]]) {
            let (TensorData::F32(x), TensorData::F32(y)) = (&row.data, &single.data) else {
                panic!("FP32 output expected");
            };
            let worst = x.iter().zip(y).map(|(p, q)| (p - q).abs()).fold(0.0f32, f32::max);
            assert!(worst <= 1e-6, "batch row differs from its single run by {worst}");
        }
    }

    #[test]
    fn wrong_input_shape_is_refused_with_the_model_name() {
        let mut model = load_or_explain("squeezenet.onnx");
        let bad = Tensor::new("data_0", vec![1, 3, 2], TensorData::F32(vec![0.0; 6])).unwrap();
        let err = model.run(&bad).unwrap_err().to_string();
        assert_eq!(
            err,
            "model squeezenet.onnx: input data_0 has shape [batch, 3, 224, 224] but the batch has shape [1, 3, 2]"
        );
        let ints = Tensor::new("data_0", vec![1, 3, 224, 224], TensorData::I64(vec![0; 3 * 224 * 224])).unwrap();
        assert!(model.run(&ints).unwrap_err().to_string().contains("is FP32 but the batch is INT64"));
    }

    #[test]
    fn missing_explicit_library_names_the_path_and_the_fix() {
        let err = locate_library(Some(Path::new("/nonexistent/libonnxruntime.so"))).unwrap_err().to_string();
        assert!(err.starts_with(
            "ONNX Runtime library /nonexistent/libonnxruntime.so (from the configuration) does not exist"
        ));
        assert!(err.contains("cargo xtask setup"), "{err}");
    }

    #[test]
    fn venv_search_finds_the_versioned_library() {
        let root = std::env::temp_dir().join(format!("sluice-ort-search-{}", std::process::id()));
        let capi = root.join(".venv/lib/python3.11/site-packages/onnxruntime/capi");
        std::fs::create_dir_all(&capi).unwrap();
        assert_eq!(search_venv(&root), None);
        std::fs::write(capi.join("libonnxruntime.so.1.31.1"), b"").unwrap();
        assert_eq!(search_venv(&root), Some(capi.join("libonnxruntime.so.1.31.1")));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn cuda_unavailable_says_why_and_what_to_do() {
        assert!(cuda::Unavailable::NotBuilt.to_string().contains("--features cuda"));
        assert!(cuda::Unavailable::NoProvider.to_string().contains("onnxruntime-gpu"));
        assert_eq!(cuda::Unavailable::Ort("no libcudart".into()).to_string(), "no libcudart");
    }
}
