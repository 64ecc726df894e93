//! Model executors: what actually runs a batch.
//!
//! - [`onnx`]: real models through ONNX Runtime (the `ort` crate, CPU or CUDA).
//! - [`emulated`]: waits the profiled latency and returns a deterministic output.
//! - [`remote`]: batches sent to a cluster agent over the Open Inference Protocol,
//!   and the agent's side (`serve_agent`).
//!
//! Both implement [`sluice_core::executor::Executor`] through [`LoadedModel`].

pub mod emulated;
pub mod onnx;
pub mod remote;

use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;
use sluice_core::executor::{app_output, BatchFuture, ExecError, Executor};
use sluice_core::tensor::Tensor;

use onnx::{OnnxModel, OnnxOptions};

/// A model ready to run on one worker.
#[derive(Clone)]
pub enum LoadedModel {
    /// Waits the profiled latency (dense table, µs by batch size).
    Emulated(Arc<Vec<u64>>),
    /// An ONNX Runtime session. `run` needs `&mut`, and one worker runs one batch at
    /// a time, so the mutex is never contended on the hot path. A CUDA session runs
    /// every batch on a thread of its own ([`SessionThread`]); a CPU one on the
    /// runtime's blocking pool.
    Onnx(Arc<Mutex<OnnxModel>>, Option<Arc<SessionThread>>),
}

/// The one thread that runs a CUDA session's batches, its warm-up included.
///
/// ONNX Runtime's CUDA provider keeps its cuBLAS and cuDNN handles per thread,
/// made at a thread's first run. On the blocking pool each batch lands on any of
/// its threads (those parsing request bodies too), and each new one paid that
/// first run: on an H200 (BENCHMARKS §16) one client's requests to the light
/// ResNet-50 (1.4 ms a batch once warm) were answered in p50 7.9 ms at 124 req/s,
/// and on the session's own thread in 5.3 ms at 177 req/s. Triton gives each model
/// instance a thread too.
pub struct SessionThread {
    jobs: std::sync::mpsc::Sender<Box<dyn FnOnce() + Send>>,
}

impl SessionThread {
    /// Starts the thread; it ends once the last handle to it is dropped.
    fn start(label: &str) -> std::io::Result<SessionThread> {
        let (jobs, queue) = std::sync::mpsc::channel::<Box<dyn FnOnce() + Send>>();
        std::thread::Builder::new().name(format!("onnx-cuda {label}")).spawn(move || {
            while let Ok(job) = queue.recv() {
                job();
            }
        })?;
        Ok(SessionThread { jobs })
    }

    /// Runs `job` on the thread; its result, or None when the thread is gone.
    async fn run<T: Send + 'static>(&self, job: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.jobs.send(Box::new(move || drop(tx.send(job())))).ok()?;
        rx.await.ok()
    }

    /// As [`SessionThread::run`], blocking the caller (loading, on a blocking thread).
    fn run_blocking<T: Send + 'static>(&self, job: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.jobs.send(Box::new(move || drop(tx.send(job())))).ok()?;
        rx.recv().ok()
    }
}

/// How an app's models are (re)loaded.
#[derive(Clone)]
pub struct AppSources {
    /// The executor.
    pub executor: crate::config::ExecutorKind,
    /// Per model id: the onnx source (onnx executor) or latency table (emulated).
    pub models: Vec<ModelSource>,
}

/// How one model is loaded.
#[derive(Clone)]
pub enum ModelSource {
    /// Emulated: its dense latency table.
    Emulated(Arc<Vec<u64>>),
    /// ONNX: the file and options.
    Onnx(OnnxSource),
}

impl ModelSource {
    /// Loads (and for ONNX warms) the model; blocking.
    pub fn load(&self) -> anyhow::Result<LoadedModel> {
        Ok(match self {
            ModelSource::Emulated(t) => LoadedModel::Emulated(t.clone()),
            ModelSource::Onnx(src) => LoadedModel::load_onnx(src)?,
        })
    }
}

/// How to load one model for the onnx executor.
#[derive(Clone, Debug)]
pub struct OnnxSource {
    /// The `.onnx` file.
    pub path: PathBuf,
    /// Session options.
    pub options: OnnxOptions,
    /// The largest batch a policy may form with it: on CUDA every size up to it is
    /// run once after loading ([`LoadedModel::load_onnx`]).
    pub warm_up_to: usize,
}

impl LoadedModel {
    /// Loads and warms an ONNX model (blocking: call from a blocking thread): on
    /// CPU one run of batch 1 (a session's first run pays ONNX Runtime's lazy
    /// allocations); on CUDA one run of every batch size up to `warm_up_to`, on the
    /// session's own thread ([`SessionThread`]).
    ///
    /// cuDNN picks each convolution's algorithm the first time a session sees an
    /// input shape (ONNX Runtime's exhaustive search by default): on an H200 each
    /// size's first run took ~0.3–0.6 s (BENCHMARKS §16), where a warm batch of the
    /// light ResNet-50 took 1.4–2.5 ms, and a policy forms batches of any size up
    /// to its largest. Triton's answer is the same: model warm-up at load.
    pub fn load_onnx(src: &OnnxSource) -> Result<LoadedModel, ExecError> {
        let mut model = OnnxModel::load(&src.path, &src.options).map_err(|e| ExecError::Onnx(e.to_string()))?;
        if model.execution_provider() != "CUDA" {
            model.warm(1);
            return Ok(LoadedModel::Onnx(Arc::new(Mutex::new(model)), None));
        }
        let label = src.path.file_name().map_or_else(String::new, |f| f.to_string_lossy().into_owned());
        let thread = SessionThread::start(&label).map_err(|e| ExecError::Onnx(format!("{label}: its thread: {e}")))?;
        let session = Arc::new(Mutex::new(model));
        let (warmed, largest) = (session.clone(), src.warm_up_to.max(1));
        thread
            .run_blocking(move || (1..=largest).for_each(|batch| warmed.lock().warm(batch)))
            .ok_or_else(|| ExecError::Onnx(format!("{label}: its thread ended while warming up")))?;
        Ok(LoadedModel::Onnx(session, Some(Arc::new(thread))))
    }
}

/// The models of one worker as the worker loop sees them.
pub fn model_set(loaded: std::collections::BTreeMap<u32, LoadedModel>) -> sluice_core::executor::ModelSet {
    sluice_core::executor::ModelSet::new(
        loaded.into_iter().map(|(id, m)| (id, Arc::new(m) as Arc<dyn Executor>)).collect(),
    )
}

/// Why a worker's models could not be loaded ([`load_set`]).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A model failed to load or warm up (its file, its session, its warm-up run).
    #[error("model {id}: {cause:#}")]
    Model {
        /// The model's id (its index in the app's models).
        id: u32,
        /// Why, with its chain of causes (`ModelSource::load`'s).
        cause: anyhow::Error,
    },
    /// The loading task panicked or was cancelled.
    #[error("loading models: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Loads (and warms) `sources` off the async threads into one worker's model set,
/// for a worker to switch to at run time (`App::install_models`).
pub async fn load_set(sources: Vec<(u32, ModelSource)>) -> Result<sluice_core::executor::ModelSet, LoadError> {
    let loaded =
        tokio::task::spawn_blocking(move || -> Result<std::collections::BTreeMap<u32, LoadedModel>, LoadError> {
            sources
                .into_iter()
                .map(|(id, s)| Ok((id, s.load().map_err(|cause| LoadError::Model { id, cause })?)))
                .collect()
        })
        .await??;
    Ok(model_set(loaded))
}

impl Executor for LoadedModel {
    /// Runs one batch: the samples are concatenated along dimension 0 and the
    /// outputs split back, one `Vec<Tensor>` per sample in order. Whatever the
    /// model answers is the answer, NaN and infinities included, as in Triton: an
    /// image of random bytes (perf_analyzer's default data) holds NaNs and its
    /// output is NaN, which is the model's business, not a failed execution. The
    /// fronts carry such an output (HTTP in binary, since JSON has no NaN: see
    /// `crate::http`), so it is served and counted served, as its client's 200 says
    /// (issue 39; it was failed here, issue 40, which made every perf_analyzer
    /// request a 500).
    fn run(&self, model_id: u32, samples: Vec<Tensor>) -> BatchFuture<'_> {
        Box::pin(self.run_batch(model_id, samples))
    }

    /// An emulated model whose every batch takes 0 µs answers at the first poll
    /// (`run_batch` neither sleeps nor leaves the thread for it).
    fn instant(&self) -> bool {
        matches!(self, LoadedModel::Emulated(table) if table.iter().all(|&us| us == 0))
    }
}

impl LoadedModel {
    async fn run_batch(&self, model_id: u32, samples: Vec<Tensor>) -> Result<Vec<Vec<Tensor>>, ExecError> {
        match self {
            LoadedModel::Emulated(table) => {
                let latency = emulated::batch_latency(table, samples.len());
                let until = std::time::Instant::now() + latency;
                let size = samples.len();
                tracing::trace!(
                    target: "sluice_server::executor::emulated",
                    thread = std::thread::current().name().unwrap_or(""),
                    size,
                    "emulated batch start"
                );
                if !latency.is_zero() {
                    // The batch has started (its end is fixed): one yield, so a
                    // worker that polls a batch once to start it answers the last
                    // batch's requests now (`worker::execute`), before the outputs.
                    tokio::task::yield_now().await;
                }
                // The outputs within the batch's time, as a model computes them: after
                // the wait they cost ~160 µs a 602 KB image (a sum of 150,528
                // elements) between one batch's end and the next's start on the
                // 2-core VM, every batch (BENCHMARKS.md §8.1). A zero-latency batch
                // answers at its first poll all the same (`Executor::instant`).
                let outputs = samples.iter().map(|s| vec![emulated::output_for(model_id, s)]).collect();
                drop(samples);
                // tokio's timer wheel has millisecond ticks: a sleep to the end
                // would last up to a millisecond longer than profiled, every batch,
                // and a busy worker's batches would drift later and later from the
                // simulator's (tests/live_vs_sim.rs). So the end is a blocking
                // thread's sleep, accurate to tens of microseconds.
                sleep_until_exact(until, EMULATED_TIMER_ABOVE).await;
                tracing::trace!(
                    target: "sluice_server::executor::emulated",
                    thread = std::thread::current().name().unwrap_or(""),
                    size,
                    profiled_us = latency.as_micros() as u64,
                    over_us = std::time::Instant::now().saturating_duration_since(until).as_micros() as u64,
                    "emulated batch done"
                );
                Ok(outputs)
            }
            LoadedModel::Onnx(session, thread) => {
                let session = session.clone();
                let job = move || run_session(&session, samples);
                match thread {
                    Some(thread) => {
                        thread.run(job).await.ok_or_else(|| ExecError::Join("the session's thread ended".into()))?
                    }
                    None => tokio::task::spawn_blocking(job).await.map_err(|e| ExecError::Join(e.to_string()))?,
                }
            }
        }
    }
}

/// Runs one batch of `samples` through `session`: concatenated along dimension 0,
/// the first output split back per sample.
fn run_session(session: &Mutex<OnnxModel>, samples: Vec<Tensor>) -> Result<Vec<Vec<Tensor>>, ExecError> {
    let n = samples.len();
    let refs: Vec<&Tensor> = samples.iter().collect();
    let batch = Tensor::concat(&refs).map_err(|e| ExecError::Onnx(e.to_string()))?;
    let outputs = session.lock().run(&batch).map_err(|e| ExecError::Onnx(e.to_string()))?;
    let first = outputs.into_iter().next().ok_or_else(|| ExecError::Onnx("the model has no output".into()))?;
    let parts = app_output(first).split(n).map_err(|e| ExecError::Onnx(e.to_string()))?;
    Ok(parts.into_iter().map(|p| vec![p]).collect())
}

/// Emulated batches at least this long wait on tokio's timer for all but their last
/// [`TIMER_SLACK`], so a long batch holds a blocking thread only briefly; shorter
/// ones sleep on a blocking thread, and zero-latency ones do not wait at all.
const EMULATED_TIMER_ABOVE: std::time::Duration = std::time::Duration::from_millis(20);

/// Waits until `until` to within tens of microseconds, where `tokio::time::sleep_until`
/// alone ends on the timer wheel's next millisecond tick (up to 1 ms late, more when
/// the runtime's threads are busy): tokio's timer for all but the last
/// [`TIMER_SLACK`], holding no thread, then a blocking thread's sleep to the end.
/// For the worker's `wait` decisions (`worker::run`): a policy that waits to fill a
/// batch (nexus, proteus-batching) started every waited batch up to a millisecond
/// later than the simulator, and on a busy worker the delays added up batch after
/// batch (BENCHMARKS.md §8.1). Dropped early (an arrival woke the worker), the
/// blocking sleep ends on its own within [`TIMER_SLACK`].
pub async fn sleep_until_precise(until: std::time::Instant) {
    sleep_until_exact(until, TIMER_SLACK).await;
}

/// The one precise wait of this module (an emulated batch, a worker's `wait`): when
/// more than `timer_above` is left, tokio's timer until [`TIMER_SLACK`] before
/// `until`, then the rest on a blocking thread ([`sleep_exact`]).
async fn sleep_until_exact(until: std::time::Instant, timer_above: std::time::Duration) {
    let left = until.saturating_duration_since(std::time::Instant::now());
    if left.is_zero() {
        return;
    }
    if left >= timer_above {
        tokio::time::sleep_until((until - TIMER_SLACK).into()).await;
    }
    if std::time::Instant::now() < until {
        let _ = tokio::task::spawn_blocking(move || sleep_exact(until)).await;
    }
}

/// Blocks the calling (blocking-pool) thread until `until` with the kernel's sleep,
/// which ends some tens of µs late (102–127 µs median per emulated batch on the
/// 2-core VM, BENCHMARKS.md §8.1). A spin over the last 150 µs was tried: 20 µs
/// median, but the runs' tails (a thread losing its core for milliseconds on two
/// busy cores) were too noisy to show a net gain, so it is not here.
fn sleep_exact(until: std::time::Instant) {
    std::thread::sleep(until.saturating_duration_since(std::time::Instant::now()));
}

/// What a precise wait leaves to a blocking thread after tokio's timer: two of the
/// timer's millisecond ticks, as it may fire up to one late and a busy runtime
/// thread may add to that. Shorter, and a late timer would end the wait late;
/// longer holds a blocking thread longer per wait.
const TIMER_SLACK: std::time::Duration = std::time::Duration::from_millis(2);
