//! The models loaded on one worker, and how a batch runs on them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;
use thiserror::Error;

use super::emulated;
use super::onnx::{OnnxModel, OnnxOptions};
use crate::tensor::Tensor;

/// A batch could not be executed.
#[derive(Debug, Error)]
pub enum ExecError {
    /// The model is not loaded on this worker.
    #[error("model {0} is not loaded on this worker")]
    NotLoaded(u32),
    /// ONNX Runtime failed.
    #[error("onnx: {0}")]
    Onnx(String),
    /// The blocking task running the batch panicked or was cancelled.
    #[error("executor task failed: {0}")]
    Join(String),
}

/// A model ready to run on one worker.
#[derive(Clone)]
pub enum LoadedModel {
    /// Waits the profiled latency (dense table, µs by batch size).
    Emulated(Arc<Vec<u64>>),
    /// An ONNX Runtime session. `run` needs `&mut`, and one worker runs one batch at
    /// a time, so the mutex is never contended on the hot path.
    Onnx(Arc<Mutex<OnnxModel>>),
}

/// How to load one model for the onnx executor.
#[derive(Clone, Debug)]
pub struct OnnxSource {
    /// The `.onnx` file.
    pub path: PathBuf,
    /// Session options.
    pub options: OnnxOptions,
    /// Batch size to warm the session with after loading.
    pub warm_batch: usize,
}

impl LoadedModel {
    /// Loads and warms an ONNX model (blocking: call from a blocking thread).
    pub fn load_onnx(src: &OnnxSource) -> Result<LoadedModel, ExecError> {
        let mut model = OnnxModel::load(&src.path, &src.options).map_err(|e| ExecError::Onnx(e.to_string()))?;
        model.warm(src.warm_batch.max(1));
        Ok(LoadedModel::Onnx(Arc::new(Mutex::new(model))))
    }

    /// Runs one batch: the samples are concatenated along dimension 0 and the
    /// outputs split back, one `Vec<Tensor>` per sample in order.
    pub async fn run(&self, model_id: u32, samples: Vec<Tensor>) -> Result<Vec<Vec<Tensor>>, ExecError> {
        match self {
            LoadedModel::Emulated(table) => {
                let latency = emulated::batch_latency(table, samples.len());
                if latency >= EMULATED_TIMER_ABOVE {
                    tokio::time::sleep(latency).await;
                } else if !latency.is_zero() {
                    // tokio's timer wheel has millisecond ticks: a short sleep would
                    // last up to a millisecond longer than profiled. A blocking
                    // thread's sleep is accurate to tens of microseconds.
                    let _ = tokio::task::spawn_blocking(move || std::thread::sleep(latency)).await;
                }
                Ok(samples.iter().map(|s| vec![emulated::output_for(model_id, s)]).collect())
            }
            LoadedModel::Onnx(session) => {
                let session = session.clone();
                let n = samples.len();
                tokio::task::spawn_blocking(move || -> Result<Vec<Vec<Tensor>>, ExecError> {
                    let refs: Vec<&Tensor> = samples.iter().collect();
                    let batch = Tensor::concat(&refs).map_err(|e| ExecError::Onnx(e.to_string()))?;
                    let outputs = session.lock().run(&batch).map_err(|e| ExecError::Onnx(e.to_string()))?;
                    let first =
                        outputs.into_iter().next().ok_or_else(|| ExecError::Onnx("the model has no output".into()))?;
                    let parts = app_output(first).split(n).map_err(|e| ExecError::Onnx(e.to_string()))?;
                    Ok(parts.into_iter().map(|p| vec![p]).collect())
                })
                .await
                .map_err(|e| ExecError::Join(e.to_string()))?
            }
        }
    }
}

/// Emulated batches at least this long wait on tokio's timer (millisecond
/// resolution, at most a few percent off); shorter ones sleep on a blocking
/// thread, and zero-latency ones do not wait at all.
const EMULATED_TIMER_ABOVE: std::time::Duration = std::time::Duration::from_millis(20);

/// Name of the one output every variant of an app answers with.
pub const OUTPUT_NAME: &str = "output";

/// Variants of one app name and shape their outputs differently (SqueezeNet's
/// `softmaxout_1` is `[b, 1000, 1, 1]`, ResNet-50's `gpu_0/softmax_1` is `[b, 1000]`);
/// clients of the app must not care which variant served them, so the first output
/// is renamed [`OUTPUT_NAME`] and flattened to `[b, n]`.
pub fn app_output(mut t: Tensor) -> Tensor {
    let rows = t.shape.first().copied().unwrap_or(1);
    let n = t.data.len().checked_div(rows).unwrap_or(0);
    t.name = OUTPUT_NAME.to_string();
    t.shape = vec![rows, n];
    t
}

/// The models loaded on one worker, by model id.
#[derive(Clone, Default)]
pub struct ModelSet {
    models: BTreeMap<u32, LoadedModel>,
}

impl ModelSet {
    /// A set from loaded models.
    pub fn new(models: BTreeMap<u32, LoadedModel>) -> ModelSet {
        ModelSet { models }
    }

    /// Ids of the loaded models, ascending.
    pub fn ids(&self) -> Vec<u32> {
        self.models.keys().copied().collect()
    }

    /// Whether `id` is loaded.
    pub fn contains(&self, id: u32) -> bool {
        self.models.contains_key(&id)
    }

    /// The loaded model `id`.
    pub fn get(&self, id: u32) -> Result<&LoadedModel, ExecError> {
        self.models.get(&id).ok_or(ExecError::NotLoaded(id))
    }
}
