//! The Executor seam: what a worker needs to run a batch, whatever runs it (ONNX
//! Runtime, the emulated executor, a remote agent later). Implementations live in
//! `sluice_server::executor`; the worker loop sees only [`Executor`] and the
//! [`ModelSet`] of one worker.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use thiserror::Error;

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
    /// Another backend failed (its name and message).
    #[error("{0}")]
    Backend(String),
    /// The blocking task running the batch panicked or was cancelled.
    #[error("executor task failed: {0}")]
    Join(String),
}

/// The future of one batch: one `Vec<Tensor>` of outputs per sample, in order.
pub type BatchFuture<'a> = Pin<Box<dyn Future<Output = Result<Vec<Vec<Tensor>>, ExecError>> + Send + 'a>>;

/// A model variant loaded and ready to run batches on one worker.
///
/// A worker runs one batch at a time, so an implementation may hold its session
/// behind a mutex that is never contended; blocking work belongs on a blocking
/// thread (`tokio::task::spawn_blocking`), never on the worker's task.
pub trait Executor: Send + Sync {
    /// Runs one batch of `model` (the app's model id): the samples have leading
    /// dimension 1 and are answered in order, each with the app's outputs.
    fn run(&self, model: u32, samples: Vec<Tensor>) -> BatchFuture<'_>;

    /// Whether every batch's future is ready at its first poll, neither waiting nor
    /// blocking (the zero-latency emulated models): the live host then lets an
    /// arrival's own task run the worker's turn instead of waking its thread
    /// (`sluice_server::worker`'s inline turns). False unless an implementation
    /// knows better.
    fn instant(&self) -> bool {
        false
    }
}

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
    models: BTreeMap<u32, Arc<dyn Executor>>,
}

impl ModelSet {
    /// A set from loaded models.
    pub fn new(models: BTreeMap<u32, Arc<dyn Executor>>) -> ModelSet {
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

    /// Whether at least one model is loaded and every one is
    /// [`Executor::instant`].
    pub fn instant(&self) -> bool {
        !self.models.is_empty() && self.models.values().all(|m| m.instant())
    }

    /// The loaded model `id`.
    pub fn get(&self, id: u32) -> Result<&Arc<dyn Executor>, ExecError> {
        self.models.get(&id).ok_or(ExecError::NotLoaded(id))
    }
}
