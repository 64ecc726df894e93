//! One served application: its queues, router, workers and policy binding.
//!
//! Start here: [`App::submit`] (the router: admission and queue choice),
//! [`App::swap_policy`] (hot swap), and the worker loop in [`crate::worker`].

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::Serialize;
use thiserror::Error;
use tokio::sync::{mpsc, oneshot};

use sluice_sdk as sdk;

use crate::metrics::Metrics;
use sluice_core::admission::{self, Admission, Place, WorkerAdmission};
use sluice_core::app_config::{AppConfig, InputSpec};
use sluice_core::clock::{Clock as _, WallClock};
use sluice_core::decision::{WorkerPolicy, SAFE_POLICY};
use sluice_core::demand::DemandMonitor;
use sluice_core::executor::ModelSet;
use sluice_core::outcome::{Outcome, Refusal};
use sluice_core::queue::{DropReason, Head, Prediction, Reply, Request, WorkQueue};
use sluice_core::router::{LoadMonitor, LoadWindow, Router, RouterMode};
use sluice_core::runtime::{
    Binding, CompiledPolicy, PolicyEngine, PolicyError, PolicyInstance, SharedStore, WorkerView,
};
use sluice_core::tensor::Tensor;

/// Why a request was not accepted.
#[derive(Debug, Error, PartialEq)]
pub enum AdmitError {
    /// The app's bounded queue is full.
    #[error("app {app}: queue full ({limit} requests waiting); retry later")]
    QueueFull {
        /// The app.
        app: String,
        /// Its `max_queue`.
        limit: usize,
    },
    /// The server is shutting down.
    #[error("app {0}: shutting down, not accepting requests")]
    ShuttingDown(String),
    /// The queue ahead could not be served by the request's deadline: refused at
    /// once rather than served late (Triton's queue policy rejects on timeout; this
    /// rejects what would time out, before it costs anything).
    #[error("app {app}: overloaded: {}; retry later", overload_reason(*.ahead, *.wait_ms, *.margin_ms, *.slo_ms, *.pushes_back))]
    WouldMissDeadline {
        /// The app.
        app: String,
        /// Requests queued or running ahead on the chosen worker.
        ahead: usize,
        /// The predicted time to serve them and this one, the margin included.
        wait_ms: f64,
        /// The margin in it (a high quantile of recent prediction errors, and the
        /// time kept back for answering).
        margin_ms: f64,
        /// The app's SLO: the request's deadline from its arrival.
        slo_ms: f64,
        /// It would itself be on time, but would push a request queued behind its
        /// place past that request's deadline.
        pushes_back: bool,
    },
}

impl AdmitError {
    /// Its typed reason, as a request's outcome records it
    /// ([`sluice_core::outcome::Outcome::Refused`]; the simulator's refusals too).
    pub fn refusal(&self) -> Refusal {
        match self {
            AdmitError::QueueFull { .. } => Refusal::QueueFull,
            AdmitError::ShuttingDown(_) => Refusal::ShuttingDown,
            AdmitError::WouldMissDeadline { .. } => Refusal::Overload,
        }
    }
}

/// Why a request was refused as overloaded, in words: which deadline would be
/// missed, and how the prediction was made up (a refusal that quotes a wait below
/// the SLO, or an SLO for a deadline, reads as a bug).
fn overload_reason(ahead: usize, wait_ms: f64, margin_ms: f64, slo_ms: f64, pushes_back: bool) -> String {
    let requests = if ahead == 1 { "request" } else { "requests" };
    if pushes_back {
        return format!(
            "admitting it behind {ahead} {requests} would push a request queued after it past its deadline"
        );
    }
    format!(
        "behind {ahead} {requests} it would be answered in about {wait_ms:.0} ms ({:.0} ms predicted + {margin_ms:.0} ms margin for prediction errors and answering), past its {slo_ms} ms deadline",
        (wait_ms - margin_ms).max(0.0)
    )
}

/// A worker's policy slot. The worker holds the lock for the whole of a decision
/// (view, `decide`, removal of the chosen requests), and a swap installs `pending`
/// under the same lock, so a decision is made entirely by the old policy or entirely
/// by the new one, and any request enqueued after a swap returns is decided by the
/// new policy.
pub struct Slot {
    /// The policy deciding now.
    pub current: WorkerPolicy,
    /// Swap generation `current` belongs to.
    pub generation: u64,
    /// A policy installed by a swap, taken at the next decision.
    pub pending: Option<(WorkerPolicy, u64)>,
    /// The worker's own view (a pipeline task worker's plan slot,
    /// `flow::task_view`): the models its decisions see in place of
    /// [`App::models_of`], and what its policy is bound with. Set with its policy by
    /// [`App::rebind_worker`]; None: none of its own.
    pub view: Option<Arc<WorkerView>>,
}

/// Messages to a worker about its models.
pub enum WorkerControl {
    /// Replace the loaded models with this set (already loaded and warmed).
    Install(ModelSet, oneshot::Sender<()>),
}

/// What a worker shares with the rest of the app.
pub struct WorkerHandle {
    /// Index in the app.
    pub index: u32,
    /// Its policy slot.
    pub slot: Mutex<Slot>,
    /// Its queue (the app's single queue in `shared` mode).
    pub queue: Arc<WorkQueue>,
    /// Model changes.
    pub control: mpsc::UnboundedSender<WorkerControl>,
    /// Ids of the models it has loaded (for admin views and routing).
    pub loaded: Mutex<Vec<u32>>,
    /// Requests in the batch it is executing.
    pub in_flight: AtomicUsize,
    /// Its turn, which an arrival may take while its thread waits
    /// ([`crate::turn::Inline`]).
    pub inline: crate::turn::Inline,
}

/// The most not-yet-queued requests [`App::precheck`] places on workers before it
/// predicts (bounds its cost when many bodies are being read at once).
const MAX_PLACED: usize = 64;

/// A request that passed [`App::precheck`] and is being read and parsed: counted
/// ahead of later arrivals until dropped. It may have passed only as an audit
/// ([`Incoming::audited`]).
#[must_use = "the request counts as incoming only while this is held"]
pub struct Incoming(Arc<AtomicUsize>, bool);

impl Incoming {
    /// Whether the precheck would have refused it and `admission_audit` let it in
    /// to check that refusal: pass it to [`App::submit_arrived`], which then admits
    /// it as an audit too, instead of judging (and drawing) it a second time.
    pub fn audited(&self) -> bool {
        self.1
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The app's current binding, as reported by the admin API.
#[derive(Clone, Debug, Serialize)]
pub struct BindingInfo {
    /// Policy name (`safe` when unbound).
    pub policy: String,
    /// Digest of the component (none for `safe`).
    pub digest: Option<String>,
    /// Parameters as JSON.
    pub params: String,
    /// Incremented by every swap.
    pub generation: u64,
    /// Why the policy was unbound, if it was.
    pub unbound_reason: Option<String>,
    /// The binding's shared store (none for `safe`).
    #[serde(skip)]
    pub shared: Option<Arc<SharedStore>>,
}

/// Counters reported by the admin API.
#[derive(Default)]
pub struct AppCounters {
    /// Requests accepted.
    pub accepted: AtomicU64,
    /// Served (on time or late).
    pub served: AtomicU64,
    /// Served after their deadline.
    pub late: AtomicU64,
    /// Dropped (policy, expired or executor error).
    pub dropped: AtomicU64,
    /// Refused at admission or at shutdown.
    pub rejected: AtomicU64,
    /// Policy faults answered by the fallback.
    pub faults: AtomicU64,
    /// Faults since the last swap (drives `unbind`).
    pub faults_since_bind: AtomicU64,
    /// Completed swaps.
    pub swaps: AtomicU64,
    /// Longest time a worker waited on a swap, ns.
    pub swap_max_wait_ns: AtomicU64,
    /// Decisions the safe policy made while a faulted instance was re-instantiated.
    pub reviving_decisions: AtomicU64,
    /// Decisions made in an inline turn, on an arrival's task instead of the
    /// worker's thread (`crate::worker`'s module doc, "Inline turns"): how often the
    /// hand-off was skipped, and a check that a slow or faulting policy is not.
    pub inline_decisions: AtomicU64,
    /// Refused at admission because the queue ahead could not be served in time
    /// (also counted in `rejected`).
    pub rejected_overload: AtomicU64,
    /// Admitted although admission would have refused them, to check the refusal
    /// (`admission_audit`; not counted in `rejected`).
    pub audited: AtomicU64,
    /// Audited requests served by their deadline: false refusals.
    pub audited_met: AtomicU64,
}

pub use sluice_core::admission::fastest;

/// Runs worker `handle`'s turns for the arrival that claimed them
/// ([`crate::turn::Inline::claim`]); `crate::worker::run_inline`.
pub type InlineRunner = for<'a> fn(&App, &WorkerHandle, crate::turn::Turn<'a>);

/// One served application.
pub struct App {
    /// The app's configuration.
    pub config: AppConfig,
    /// Every variant of the app, as policies see them (`id` = index).
    pub models: Vec<sdk::Model>,
    /// Per worker, the variants with the latency of the worker's device type (apps
    /// on `[[device]]`s); None: every worker sees `models`.
    pub device_models: Option<Arc<Vec<Vec<sdk::Model>>>>,
    /// The input a request must carry.
    pub input: InputSpec,
    /// SLO in µs.
    pub slo_us: u64,
    /// How long past its deadline the host keeps a request before dropping it.
    pub expire_us: u64,
    /// Workers, by index.
    pub workers: Vec<Arc<WorkerHandle>>,
    /// Arrival-rate estimate.
    pub load: LoadMonitor,
    /// Arrivals per second for the allocator's forecasts (fed only on devices).
    pub demand: DemandMonitor,
    /// Counters.
    pub counters: AppCounters,
    /// Metrics registry.
    pub metrics: Arc<Metrics>,
    /// Host clock.
    pub clock: WallClock,
    /// The current binding.
    pub binding: Mutex<BindingInfo>,
    /// Serialises swaps of this app.
    swap_lock: tokio::sync::Mutex<()>,
    /// Unbind requested for this generation (0: none).
    pub unbind_generation: AtomicU64,
    /// Requests queued across the app (bounded by `max_queue`).
    pub queued: AtomicUsize,
    /// Requests past [`App::precheck`] whose bodies are being read and parsed.
    incoming: Arc<AtomicUsize>,
    /// Admission's state: its predictors, margins and audit, one part per worker
    /// ([`sluice_core::admission`], the simulator's too).
    pub admission: Admission,
    /// Whether new requests are accepted.
    pub accepting: AtomicBool,
    /// Set at shutdown: workers serve what is queued, then exit.
    pub draining: AtomicBool,
    /// Set when a shutdown's grace has run out: workers abandon their batches
    /// (answered 503) and exit; see [`App::abort`].
    pub aborted: AtomicBool,
    abort_notify: tokio::sync::Notify,
    /// How an arrival runs the worker's turn it claimed (`crate::worker::run_inline`),
    /// registered by the workers' threads when they start ([`App::register_inline`]):
    /// until then no turn is claimed. Held as a function so that this module does
    /// not name the worker's (which names this one).
    inline_runner: std::sync::OnceLock<InlineRunner>,
    /// Fault lines in the log: at most one a second.
    fault_log: crate::throttle::RateLimitedLog,
    /// Which worker gets the next request.
    pub router: Router,
    next_id: Arc<AtomicU64>,
    engine: Arc<PolicyEngine>,
    /// Where arrivals are logged (`sluice serve --record-arrivals`): accepted ones,
    /// and those refused at admission marked `refused` ([`ArrivalLog::record`]).
    pub recorder: std::sync::OnceLock<Arc<ArrivalLog>>,
    /// The recent arrivals what-if evaluations replay (`arrival_ring`; set by
    /// [`crate::state::State::build`] for the config's apps).
    pub ring: std::sync::OnceLock<ArrivalRing>,
    /// A pipeline's task app: the pipeline's handoff, which its workers count
    /// their served answers into and wait on before deciding (`crate::handoff`; set
    /// by `PipelineApp::new`).
    pub(crate) handoff: std::sync::OnceLock<Arc<crate::handoff::Handoff>>,
}

/// Entries of one lazily allocated chunk of an [`ArrivalRing`] (512 KiB): the ring
/// costs memory as it fills, not at start-up, and one allocation per 64 Ki arrivals.
const RING_CHUNK: usize = 1 << 16;

/// A bounded ring of an app's most recent arrival times (µs on the host clock),
/// which what-if evaluations replay (`POST /admin/apps/{app}/evaluate`).
///
/// Lock-free on the request path: an arrival takes a slot with one `fetch_add` and
/// stores its time into it. Memory is bounded by the capacity (8 bytes an entry),
/// allocated a chunk at a time as the ring first fills. A snapshot taken while
/// arrivals are written may miss the last few (a slot taken but not yet stored) or
/// see a slot about to be overwritten; it sorts and filters by time, so neither
/// matters to a window of minutes.
pub struct ArrivalRing {
    /// Arrivals recorded so far (the next slot is `head % capacity`).
    head: AtomicU64,
    capacity: usize,
    /// Stored times are µs + 1, so 0 marks a slot never written.
    chunks: Box<[std::sync::OnceLock<Box<[AtomicU64]>>]>,
}

impl ArrivalRing {
    /// A ring of `capacity` entries (0: recording off).
    pub fn new(capacity: usize) -> ArrivalRing {
        let chunks = (0..capacity.div_ceil(RING_CHUNK)).map(|_| std::sync::OnceLock::new()).collect();
        ArrivalRing { head: AtomicU64::new(0), capacity, chunks }
    }

    /// Records an arrival at `at` µs.
    pub fn record(&self, at: u64) {
        if self.capacity == 0 {
            return;
        }
        let slot = (self.head.fetch_add(1, Ordering::Relaxed) % self.capacity as u64) as usize;
        let chunk = self.chunks[slot / RING_CHUNK]
            .get_or_init(|| (0..RING_CHUNK).map(|_| AtomicU64::new(0)).collect::<Vec<_>>().into_boxed_slice());
        chunk[slot % RING_CHUNK].store(at + 1, Ordering::Release);
    }

    /// The recorded arrival times at or after `from` µs, in order.
    pub fn since(&self, from: u64) -> Vec<u64> {
        let mut out: Vec<u64> = self
            .chunks
            .iter()
            .filter_map(|c| c.get())
            .flat_map(|c| c.iter())
            .map(|t| t.load(Ordering::Acquire))
            .filter(|&t| t > from)
            .map(|t| t - 1)
            .collect();
        out.sort_unstable();
        out
    }

    /// Arrivals recorded since start-up (those beyond the capacity were overwritten).
    pub fn recorded(&self) -> u64 {
        self.head.load(Ordering::Relaxed)
    }

    /// Its capacity, in arrivals.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// What it holds and costs, for the admin view.
    pub fn view(&self) -> RingView {
        let allocated = self.chunks.iter().filter(|c| c.get().is_some()).count() * RING_CHUNK;
        RingView {
            capacity: self.capacity,
            held: self.recorded().min(self.capacity as u64),
            recorded: self.recorded(),
            bytes_max: self.capacity * 8,
            bytes: allocated * 8,
        }
    }
}

/// An arrival ring as the admin view shows it ([`ArrivalRing::view`]; the
/// dashboard's `arrival_ring`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct RingView {
    /// How many arrivals it can hold.
    pub capacity: usize,
    /// How many it holds (at most `capacity`).
    pub held: u64,
    /// How many were recorded since start-up.
    pub recorded: u64,
    /// Bytes it would take full (8 per arrival).
    pub bytes_max: usize,
    /// Bytes allocated so far (it allocates a chunk at a time).
    pub bytes: usize,
}

/// A log of arrivals, `app,arrival_us` per line for an admitted one and
/// `app,arrival_us,refused` for one refused at admission, that `sluice sim` replays
/// (arrivals `kind = "recorded"`).
pub struct ArrivalLog {
    out: Mutex<std::io::BufWriter<std::fs::File>>,
}

impl ArrivalLog {
    /// Creates (truncates) the log file.
    pub fn create(path: &std::path::Path) -> std::io::Result<ArrivalLog> {
        let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
        std::io::Write::write_all(&mut out, b"# app,arrival_us[,refused] (sluice serve --record-arrivals)\n")?;
        Ok(ArrivalLog { out: Mutex::new(out) })
    }

    /// Logs an arrival at `at`, the time its deadline runs from; `refused` marks
    /// one refused at admission (`app,arrival_us,refused`).
    fn record(&self, app: &str, at: u64, refused: bool) {
        // Buffered: a line costs a memcpy; the file is flushed at shutdown.
        let mark = if refused { ",refused" } else { "" };
        let _ = writeln!(self.out.lock(), "{app},{at}{mark}");
    }

    /// Writes out what is buffered.
    pub fn flush(&self) -> std::io::Result<()> {
        std::io::Write::flush(&mut *self.out.lock())
    }
}

/// A worker's starting state, handed to [`crate::worker::run`].
pub struct WorkerStart {
    /// Its handle.
    pub handle: Arc<WorkerHandle>,
    /// Its initial models.
    pub models: ModelSet,
    /// Its control receiver.
    pub control: mpsc::UnboundedReceiver<WorkerControl>,
}

impl App {
    /// Registers how arrivals run a worker's turns inline (`crate::worker`'s
    /// module doc, "Inline turns"); the workers' threads call it as they start.
    /// Until one has, every turn stays on its thread.
    pub fn register_inline(&self, run: InlineRunner) {
        let _ = self.inline_runner.set(run);
    }

    /// Builds an app with its workers' policy instances already initialised. The
    /// caller spawns [`crate::worker::run`] for each returned [`WorkerStart`].
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        config: AppConfig,
        models: Vec<sdk::Model>,
        device_models: Option<Arc<Vec<Vec<sdk::Model>>>>,
        input: InputSpec,
        params: String,
        worker_models: Vec<ModelSet>,
        engine: Arc<PolicyEngine>,
        compiled: Option<Arc<CompiledPolicy>>,
        metrics: Arc<Metrics>,
        clock: WallClock,
        next_id: Arc<AtomicU64>,
    ) -> Result<(Arc<App>, Vec<WorkerStart>), PolicyError> {
        let k = config.workers;
        let slo_us = (config.slo_ms * 1000.0).round() as u64;
        let expire_us = config.expire_us();
        let shared = Arc::new(WorkQueue::default());
        let mut workers = Vec::new();
        let mut starts = Vec::new();
        let mut admissions = Vec::new();
        let binding = compiled.as_ref().map(|c| {
            Binding::per_worker(
                c.clone(),
                config.policy_config(&models, &params),
                config.limits(),
                device_models.clone(),
            )
        });
        for (w, loaded) in (0..k).zip(worker_models) {
            let current = match &binding {
                Some(b) => WorkerPolicy::Wasm(Box::new(PolicyInstance::new(&engine, b, w)?)),
                None => WorkerPolicy::Safe,
            };
            let (tx, rx) = mpsc::unbounded_channel();
            let queue =
                if config.router == RouterMode::Shared { shared.clone() } else { Arc::new(WorkQueue::default()) };
            let set = loaded;
            let handle = Arc::new(WorkerHandle {
                index: w,
                slot: Mutex::new(Slot { current, generation: 1, pending: None, view: None }),
                queue,
                control: tx,
                loaded: Mutex::new(set.ids()),
                in_flight: AtomicUsize::new(0),
                inline: crate::turn::Inline::new(config.router != RouterMode::Shared),
            });
            // Until the first batch, predicted with the fastest loaded model.
            admissions.push(WorkerAdmission::new(&models, &set.ids()));
            workers.push(handle.clone());
            starts.push(WorkerStart { handle, models: set, control: rx });
        }
        let binding = BindingInfo {
            policy: compiled.as_ref().map(|c| c.name.clone()).unwrap_or_else(|| SAFE_POLICY.into()),
            digest: compiled.as_ref().map(|c| c.digest.clone()),
            params,
            generation: 1,
            unbound_reason: None,
            shared: binding.as_ref().map(|b| b.shared.clone()),
        };
        let router = Router::equal(config.router, workers.len());
        if let Some(w) = &config.weights {
            // AppConfig::validate has checked them against the router and the workers.
            if let Err(e) = router.set_weights(w) {
                tracing::warn!(app = %config.name, "weights ignored: {e}");
            }
        }
        let admission = Admission::new(slo_us, config.admission_audit, admissions);
        let app = Arc::new(App {
            load: LoadMonitor::new(config.load_window_ms * 1000),
            // An hour of seconds: enough for any forecaster's window.
            demand: DemandMonitor::new(3600),
            config,
            models,
            device_models,
            input,
            slo_us,
            expire_us,
            workers,
            counters: AppCounters::default(),
            metrics,
            clock,
            binding: Mutex::new(binding),
            swap_lock: tokio::sync::Mutex::new(()),
            unbind_generation: AtomicU64::new(0),
            queued: AtomicUsize::new(0),
            incoming: Arc::new(AtomicUsize::new(0)),
            admission,
            accepting: AtomicBool::new(true),
            draining: AtomicBool::new(false),
            aborted: AtomicBool::new(false),
            inline_runner: std::sync::OnceLock::new(),
            abort_notify: tokio::sync::Notify::new(),
            fault_log: crate::throttle::RateLimitedLog::default(),
            router,
            next_id,
            engine,
            recorder: std::sync::OnceLock::new(),
            ring: std::sync::OnceLock::new(),
            handoff: std::sync::OnceLock::new(),
        });
        Ok((app, starts))
    }

    /// The variants as worker `w` sees them (its device's latencies).
    pub fn models_of(&self, w: u32) -> &[sdk::Model] {
        match &self.device_models {
            Some(m) => m.get(w as usize).map_or(&self.models[..], |v| &v[..]),
            None => &self.models,
        }
    }

    /// The app's name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Admits a request and routes it to a worker queue; the receiver yields its one answer.
    pub fn submit(&self, input: Tensor) -> Result<oneshot::Receiver<Reply>, AdmitError> {
        self.admit(input, None, None, None, false).map(|(_, rx)| rx)
    }

    /// As [`App::submit`], for a request whose head arrived at `arrived`: its
    /// deadline runs from then, so time spent reading and parsing its body counts.
    /// `audited`: its precheck was an audit ([`Incoming::audited`]).
    pub fn submit_arrived(
        &self,
        input: Tensor,
        arrived: Instant,
        audited: bool,
    ) -> Result<oneshot::Receiver<Reply>, AdmitError> {
        self.admit(input, None, None, Some(arrived), audited).map(|(_, rx)| rx)
    }

    /// Whether a request arriving now would be admitted, asked before its body is
    /// read (so an overloaded app refuses before the body costs memory and time).
    /// The requests that passed this check earlier and are still being read and
    /// parsed count as ahead of it: under overload a burst would otherwise all pass,
    /// be parsed (a 1.7 MB JSON image costs ~10 ms of CPU the model needs) and then
    /// mostly be refused at [`App::submit_arrived`]. Hold the returned
    /// [`Incoming`] until the request is submitted or refused.
    pub fn precheck(&self) -> Result<Incoming, AdmitError> {
        if !self.accepting.load(Ordering::Acquire) {
            return Err(self.shutting_down());
        }
        let incoming = self.incoming.load(Ordering::Acquire);
        if self.queued.load(Ordering::Acquire) + incoming >= self.config.max_queue {
            return Err(self.queue_full());
        }
        let best = self.best_prediction(incoming);
        tracing::trace!(
            app = self.name(),
            incoming,
            ahead = best.map(|b| b.0),
            wait_ms = best.map(|b| b.1.wait_us / 1e3),
            "precheck"
        );
        let audited = match best {
            Some((ahead, judged)) if judged.wait_us > self.slo_us as f64 => {
                if !self.admission.audits() {
                    // An arrival all the same: counted in the load the policies
                    // and admission read, as a refusal once parsed is and as the
                    // simulator counts every arrival its admission judges. Left
                    // out, 5x overload read as the ~1x that passed, and jellyfish
                    // switched to its slow model while the queue it had been
                    // admitted for was still full (BENCHMARKS.md §7).
                    let now = self.clock.now();
                    self.count_arrival(now);
                    self.record_refused(now);
                    return Err(self.would_miss(ahead, judged, false));
                }
                true
            }
            _ => false,
        };
        self.incoming.fetch_add(1, Ordering::AcqRel);
        Ok(Incoming(self.incoming.clone(), audited))
    }

    /// The best worker's prediction for one more request after `extra` requests
    /// not yet queued were placed where the router will queue them
    /// ([`Router::place_unrouted`]; at most [`MAX_PLACED`] are placed).
    fn best_prediction(&self, extra: usize) -> Option<(usize, admission::Judged)> {
        let now = self.clock.now();
        let load = self.load.window();
        let judged = |w: usize, queued: usize| {
            let (ahead, predicted) = self.admission.prediction(&self.place(w, &load, now), queued);
            (ahead, self.admission.judge(predicted, ahead))
        };
        let best = |queued: &[usize]| {
            (0..queued.len())
                .map(|w| (w, judged(w, queued[w])))
                .min_by(|a, b| a.1 .1.wait_us.total_cmp(&b.1 .1.wait_us))
        };
        if extra == 0 {
            // The common case, without an allocation.
            let by_worker = (0..self.workers.len()).map(|w| judged(w, self.workers[w].queue.len()));
            return by_worker.min_by(|a, b| a.1.wait_us.total_cmp(&b.1.wait_us));
        }
        let mut queued: Vec<usize> = self.workers.iter().map(|w| w.queue.len()).collect();
        let in_flight = |w: usize| self.workers[w].in_flight.load(Ordering::Acquire);
        let takes = |w: usize, ahead: usize| judged(w, ahead).1.wait_us <= self.slo_us as f64;
        self.router.place_unrouted(extra.min(MAX_PLACED), &mut queued, in_flight, takes);
        best(&queued).map(|(_, p)| p)
    }

    /// Worker `w` as admission predicts it at `now`: its models, the router's
    /// queue sharing, each worker's running batch, and the `load` estimate.
    fn place<'a>(&'a self, w: usize, load: &'a LoadWindow, now: u64) -> Place<'a, impl Fn(usize) -> usize + 'a> {
        Place {
            worker: w,
            models: self.models_of(w as u32),
            shared: self.config.router == RouterMode::Shared,
            in_flight: move |i: usize| self.workers[i].in_flight.load(Ordering::Acquire),
            load,
            now,
        }
    }

    /// The margin admission adds now to a prediction for a request with nobody
    /// ahead (µs; [`Admission::margin_us`]).
    pub fn margin_us(&self) -> f64 {
        self.admission.margin_us()
    }

    /// Records that an answer reached its front `edge_us` after its batch ended
    /// ([`Admission::record_edge`]).
    pub fn record_edge(&self, edge_us: u64) {
        self.admission.record_edge(edge_us);
    }

    /// The time kept back for answering, µs ([`App::record_edge`]).
    pub fn edge_us(&self) -> u64 {
        self.admission.edge_us()
    }

    /// Worker `handle` formed a batch of `size` requests with `model` at `now`,
    /// `left` staying queued, while the app's arrival rate was `load_qps`:
    /// admission learns from it ([`WorkerAdmission::start_batch`]), then the
    /// worker counts as running it.
    pub fn start_batch(&self, handle: &WorkerHandle, model: u32, size: usize, left: usize, now: u64, load_qps: f64) {
        self.admission.worker(handle.index as usize).start_batch(model, size, left, now, load_qps);
        handle.in_flight.store(size, Ordering::Release);
    }

    /// Worker `handle` finished a batch of `model` in `measured_us`, profiled at
    /// `profiled_us` ([`WorkerAdmission::finish_batch`]).
    pub fn finish_batch(&self, handle: &WorkerHandle, model: u32, profiled_us: u64, measured_us: u64) {
        self.admission.worker(handle.index as usize).finish_batch(model, profiled_us, measured_us);
    }

    /// Worker `handle`'s models changed to `loaded` ([`WorkerAdmission::set_fastest`]).
    pub fn models_changed(&self, handle: &WorkerHandle, loaded: &[u32]) {
        let fastest = fastest(self.models_of(handle.index), loaded);
        self.admission.worker(handle.index as usize).set_fastest(fastest);
    }

    /// Folds the answers of a batch finished at `finished` into each predictor's
    /// errors behind [`App::margin_us`] ([`Admission::learn`]).
    pub fn record_answers(&self, finished: u64, requests: &[Request]) {
        for r in requests.iter().filter(|r| r.predicted.finish[0] > 0) {
            let p = r.predicted;
            tracing::trace!(
                app = self.name(),
                id = r.id,
                batch = requests.len(),
                ahead = p.ahead,
                late_ms = ?p.finish.map(|f| (finished as i64 - f as i64) / 1000),
                audit = r.audit,
                met = finished <= r.deadline,
                "answered against its prediction"
            );
        }
        self.admission.learn(finished, requests.iter().map(|r| r.predicted));
    }

    /// A refusal at admission while the app shuts down (503), counted as the
    /// rejections after acceptance are (`rejected-shutdown`): the client got a 503
    /// either way, and `sluice_requests_total` counts answers by their status.
    fn shutting_down(&self) -> AdmitError {
        self.record_refusal(Refusal::ShuttingDown);
        AdmitError::ShuttingDown(self.name().to_string())
    }

    /// Counts a client's arrival at `now` in the host's load estimates: the rate
    /// the policies read and admission forecasts from, and the allocator's demand.
    /// Every arrival admission judges, admitted or refused, at its precheck or once
    /// parsed; not one refused by the queue's bound, which the simulator does not
    /// count either (`sluice_sim::engine`).
    fn count_arrival(&self, now: u64) {
        self.load.record(now);
        if self.device_models.is_some() {
            self.demand.record(now);
        }
    }

    /// Records an arrival at `arrival` that admission refused, for replays: marked
    /// in the arrival log, so a replay without admission counts it in the load its
    /// policies see (it was in the host's) and queues it not, and one with
    /// admission judges it again; in the what-if window too, where a replay judges
    /// every arrival with its own admission (docs/simulator.md).
    fn record_refused(&self, arrival: u64) {
        if let Some(log) = self.recorder.get() {
            log.record(self.name(), arrival, true);
        }
        if let Some(ring) = self.ring.get() {
            ring.record(arrival);
        }
    }

    fn queue_full(&self) -> AdmitError {
        self.record_refusal(Refusal::QueueFull);
        AdmitError::QueueFull { app: self.name().to_string(), limit: self.config.max_queue }
    }

    fn would_miss(&self, ahead: usize, judged: admission::Judged, pushes_back: bool) -> AdmitError {
        // Debug level: under overload this is once per refused request.
        tracing::debug!(
            app = self.name(),
            ahead,
            wait_ms = judged.wait_us / 1e3,
            margin_ms = judged.margin_us / 1e3,
            reason = Refusal::Overload.as_str(),
            "refused: would miss its deadline"
        );
        self.record_refusal(Refusal::Overload);
        AdmitError::WouldMissDeadline {
            app: self.name().to_string(),
            ahead,
            wait_ms: judged.wait_us / 1e3,
            margin_ms: judged.margin_us / 1e3,
            slo_ms: self.slo_us as f64 / 1e3,
            pushes_back,
        }
    }

    /// Admits an intermediate request of a pipeline onto worker `worker`'s queue with
    /// its own `deadline` (the task's budget), bypassing the app's router (the
    /// pipeline's routing tables chose the worker). Returns the request's id with
    /// its receiver: the pipeline's handoff finds its place in its batch by it
    /// (`crate::handoff`).
    pub fn submit_to(
        &self,
        worker: usize,
        input: Tensor,
        deadline: u64,
    ) -> Result<(u64, oneshot::Receiver<Reply>), AdmitError> {
        self.admit(input, Some(worker.min(self.workers.len() - 1)), Some(deadline), None, false)
    }

    /// Admits a request onto a queue (a client request judged by admission first);
    /// its id and the receiver of its one answer.
    // A refused request travels back by value to be offered to the next worker, as
    // `WorkQueue::push_if_then` hands it back (a box per refusal would allocate
    // under overload, where most arrivals are refused).
    #[allow(clippy::result_large_err)]
    fn admit(
        &self,
        input: Tensor,
        worker: Option<usize>,
        deadline: Option<u64>,
        arrived: Option<Instant>,
        audited: bool,
    ) -> Result<(u64, oneshot::Receiver<Reply>), AdmitError> {
        if !self.accepting.load(Ordering::Acquire) {
            return Err(self.shutting_down());
        }
        // Reserve a place first so concurrent submits cannot overshoot the bound.
        if self.queued.fetch_add(1, Ordering::AcqRel) >= self.config.max_queue {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(self.queue_full());
        }
        let now = self.clock.now();
        let arrival = arrived.map_or(now, |t| now.saturating_sub(t.elapsed().as_micros() as u64));

        self.count_arrival(now);
        let (tx, rx) = oneshot::channel();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let request = Request {
            id,
            arrival,
            deadline: deadline.unwrap_or(arrival + self.slo_us),
            predicted: Prediction::default(),
            audit: audited,
            input,
            reply: tx,
        };
        // The worker's turn, when this arrival's task may decide for it
        // (`crate::turn::Inline::claim`): taken before the push, which then
        // wakes nobody, and used once the request is counted, below.
        let mut inline = None;
        match worker {
            // A pipeline's intermediate request: routed by its tables, judged by its
            // early dropping.
            Some(w) => self.workers[w].queue.push(request),
            // A client request goes to the worker the router picks, and only if that
            // worker can serve it by its deadline, judged under the queue's lock;
            // refused there, to the first the router falls back to that can.
            None => {
                let load_of = |i: usize| {
                    let w = &self.workers[i];
                    w.queue.len() + w.in_flight.load(Ordering::Relaxed)
                };
                let picked = self.router.pick(load_of);
                let deadline = arrival + self.slo_us;
                let open = !self.draining.load(Ordering::Acquire) && !self.aborted.load(Ordering::Acquire);
                // The picked worker, then the others the router falls back to
                // (`Router::offer`): a request is refused only if none of them can
                // serve it by its deadline.
                let offered = self.router.offer(
                    picked,
                    load_of,
                    request,
                    |w, request| {
                        let turn = match self.inline_runner.get() {
                            Some(_) => self.workers[w].inline.claim(open),
                            None => None,
                        };
                        let mut verdict = None;
                        let pushed =
                            self.workers[w].queue.push_if_then(request, turn.is_none(), |at, request, behind| {
                                // It must make its deadline, and so must every request it
                                // would push back by one place (`Admission::verdict`).
                                let load = self.load.window();
                                let place = self.place(w, &load, self.clock.now());
                                let v = self.admission.verdict(
                                    &place,
                                    at,
                                    (deadline, now),
                                    behind.iter().map(|r| r.deadline),
                                );
                                request.predicted = v.prediction(now);
                                tracing::trace!(
                                    app = self.name(),
                                    id = request.id,
                                    precheck_audit = audited,
                                    worker = w,
                                    ahead = v.ahead,
                                    last_ms = v.predicted[admission::LAST] / 1e3,
                                    fastest_ms = v.predicted[admission::FASTEST] / 1e3,
                                    by_load_ms = v.predicted[admission::BY_LOAD] / 1e3,
                                    margin_ms = v.judged.margin_us / 1e3,
                                    wait_ms = v.judged.wait_us / 1e3,
                                    slack_ms = (deadline as f64 - now as f64) / 1e3,
                                    rate = load.rate_at(place.now),
                                    admitted = v.admitted,
                                    "admission"
                                );
                                verdict = Some(v);
                                v.admitted
                            });
                        // A refused push gives its turn back (dropped here).
                        pushed.map(|()| turn).map_err(|request| (request, verdict.expect("push_if judged it")))
                    },
                    |v: &admission::Verdict| v.judged.wait_us,
                );
                let audit = match offered {
                    Ok((w, turn)) => {
                        inline = turn.map(|t| (w, t));
                        audited
                    }
                    // Refused at every worker, the soonest's verdict in hand.
                    // Audited at its precheck: admitted as that audit, not drawn again.
                    Err((mut request, w, v)) => {
                        if !audited && !self.admission.audits() {
                            self.queued.fetch_sub(1, Ordering::AcqRel);
                            self.record_refused(arrival);
                            return Err(self.would_miss(v.ahead, v.judged, v.on_time));
                        }
                        // Where it would have had its best chance, with the
                        // prediction made there: an audit asks whether the server
                        // could have served it by its deadline.
                        request.predicted = v.prediction(now);
                        request.audit = true;
                        self.workers[w].queue.push(request);
                        true
                    }
                };
                if audit {
                    self.counters.audited.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        // Recorded once judged, at the time its deadline runs from, and marked
        // when refused (above): a replay with the simulator's admission judges
        // every arrival again; one without queues the admitted ones and counts the
        // refused ones only in the load (docs/simulator.md, "Admission").
        if let Some(log) = self.recorder.get() {
            log.record(self.name(), arrival, false);
        }
        // Client requests only: a pipeline's intermediate ones are not the app's load.
        if let (Some(ring), None) = (self.ring.get(), worker) {
            ring.record(arrival);
        }
        self.counters.accepted.fetch_add(1, Ordering::Relaxed);
        if let (Some((w, turn)), Some(run)) = (inline, self.inline_runner.get()) {
            run(self, &self.workers[w], turn);
        }
        Ok((id, rx))
    }

    /// Worker `worker`'s own queue as a queue-aware dispatcher sees it: its length
    /// and head (None when empty), and the host clock's now, µs.
    pub fn queue_head(&self, worker: usize) -> (Option<Head>, u64) {
        (self.workers.get(worker).and_then(|w| w.queue.head()), self.clock.now())
    }

    /// Queue lengths per worker (one entry in `shared` mode).
    pub fn queue_lengths(&self) -> Vec<usize> {
        if self.config.router == RouterMode::Shared {
            vec![self.workers[0].queue.len()]
        } else {
            self.workers.iter().map(|w| w.queue.len()).collect()
        }
    }

    /// The end of a shutdown's grace: every worker abandons its batch, answering its
    /// requests 503, and stops; what is left in the queues is then rejected by the
    /// caller ([`crate::state::State::drain`]).
    pub fn abort(&self) {
        self.aborted.store(true, Ordering::Release);
        self.abort_notify.notify_waiters();
        self.wake_all();
    }

    /// Resolves once [`App::abort`] was called.
    pub async fn wait_aborted(&self) {
        loop {
            let notified = self.abort_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.aborted.load(Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }

    /// Answers an accepted request that shutdown left unserved: 503, counted as
    /// rejected.
    pub fn reject_at_shutdown(&self, r: Request) {
        self.record_refusal(Refusal::ShuttingDown);
        r.answer(Reply::Rejected { message: "server shut down before the request could be served".into() });
    }

    /// Counts an accepted request whose worker stopped without answering it (the edge
    /// answers it with the shutdown's 503): rejected, as at shutdown.
    pub fn count_unanswered(&self) {
        tracing::error!(app = self.name(), "a worker stopped without answering a request");
        self.record_refusal(Refusal::ShuttingDown);
    }

    // What the app counts. Every counter and metric an app's requests and its
    // workers move is moved here, so each metric's name and each outcome's label
    // are written once (the labels from the types: [`Outcome::metric_label`]).

    /// Counts a refused request: in `rejected` (and `rejected_overload` for an
    /// overload) and in `sluice_requests_total` under [`Refusal::metric_label`].
    /// A request rejected after it was accepted (at shutdown) counts as a
    /// shutdown refusal: its client gets the same 503 ([`Outcome::metric_label`]).
    fn record_refusal(&self, refusal: Refusal) {
        self.counters.rejected.fetch_add(1, Ordering::Relaxed);
        if refusal == Refusal::Overload {
            self.counters.rejected_overload.fetch_add(1, Ordering::Relaxed);
        }
        self.metrics.request(self.name(), "", refusal.metric_label());
    }

    /// Counts a request dropped for `reason`: in `dropped` and in
    /// `sluice_requests_total` as `dropped-<reason>`.
    pub fn record_drop(&self, reason: DropReason) {
        self.counters.dropped.fetch_add(1, Ordering::Relaxed);
        self.metrics.request(self.name(), "", &Outcome::Dropped(reason).metric_label());
    }

    /// Records a batch of `size` requests formed for `variant` (`sluice_batch_size`).
    pub fn record_batch(&self, variant: &str, size: usize) {
        self.metrics.record("sluice_batch_size", &[("app", self.name()), ("model", variant)], size as f64);
    }

    /// Counts the `requests` of a batch of `variant` that started at `started`
    /// and finished at `finished`, all served; `on_time(deadline)` says whether a
    /// request with that deadline made it. `sluice_requests_total` (`served`,
    /// `late`) is counted once per batch, one lock per family rather than per
    /// answer; then the queueing and latency histograms and the admin counters.
    /// Call it before any of the answers leaves, so a client that reads the
    /// metrics after its answer finds itself counted.
    pub fn record_served(
        &self,
        variant: &str,
        requests: &[Request],
        started: u64,
        finished: u64,
        on_time: impl Fn(u64) -> bool,
    ) {
        let size = requests.len() as u64;
        let (mut met, mut audited_met) = (0, 0);
        for r in requests.iter().filter(|r| on_time(r.deadline)) {
            met += 1;
            // Admitted to check a refusal, and on time: the refusal was false.
            audited_met += u64::from(r.audit);
        }
        self.metrics.requests_n(self.name(), variant, Outcome::METRIC_SERVED, met);
        self.metrics.requests_n(self.name(), variant, Outcome::METRIC_LATE, size - met);
        let queue_s = requests.iter().map(|r| (started - r.arrival.min(started)) as f64 / 1e6);
        self.metrics.record_all("sluice_queue_seconds", &[("app", self.name())], queue_s);
        let latency_s = requests.iter().map(|r| finished.saturating_sub(r.arrival) as f64 / 1e6);
        self.metrics.record_all("sluice_latency_seconds", &[("app", self.name())], latency_s);
        if size > met {
            self.counters.late.fetch_add(size - met, Ordering::Relaxed);
        }
        if audited_met > 0 {
            self.counters.audited_met.fetch_add(audited_met, Ordering::Relaxed);
        }
        self.counters.served.fetch_add(size, Ordering::Relaxed);
    }

    /// Records the time of one policy `decide` call (`sluice_policy_decide_seconds`).
    pub fn record_decide_time(&self, t: Duration) {
        self.metrics.record("sluice_policy_decide_seconds", &[("app", self.name())], t.as_secs_f64());
    }

    /// Counts a decision made in an inline turn ([`AppCounters::inline_decisions`]).
    pub fn record_inline_decision(&self) {
        self.counters.inline_decisions.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a decision the safe policy made while a faulted instance was
    /// re-instantiated ([`AppCounters::reviving_decisions`]).
    pub fn record_reviving_decision(&self) {
        self.counters.reviving_decisions.fetch_add(1, Ordering::Relaxed);
    }

    /// A worker waited `waited` for its slot to install a swap's policy: keeps the
    /// longest ([`AppCounters::swap_max_wait_ns`]).
    pub fn record_swap_wait(&self, waited: Duration) {
        self.counters.swap_max_wait_ns.fetch_max(waited.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Wakes every worker so it re-decides (after a swap, a model change or at shutdown).
    pub fn wake_all(&self) {
        for w in &self.workers {
            w.queue.notify.notify_waiters();
        }
    }

    /// Hot swap: instantiates and initialises `compiled` for every worker first (on a
    /// blocking thread, while the old policy keeps serving), then installs all the
    /// instances between two decisions of each worker. If any instance fails, nothing
    /// changes and the error is returned.
    pub async fn swap_policy(
        self: &Arc<App>,
        compiled: Arc<CompiledPolicy>,
        params: String,
    ) -> Result<SwapReport, PolicyError> {
        let _serial = self.swap_lock.lock().await;
        let started = Instant::now();
        let this = self.clone();
        let c = compiled.clone();
        let p = params.clone();
        let instances = tokio::task::spawn_blocking(move || -> Result<Vec<PolicyInstance>, PolicyError> {
            // A swap is a new binding: its instances share a fresh store. Workers
            // with a view of their own (`rebind_worker`) keep it.
            let views: Vec<(u32, Arc<WorkerView>)> =
                this.workers.iter().filter_map(|w| Some((w.index, w.slot.lock().view.clone()?))).collect();
            let binding = Binding::per_worker(
                c,
                this.config.policy_config(&this.models, &p),
                this.config.limits(),
                this.device_models.clone(),
            )
            .with_views(views.iter().map(|(w, v)| (*w, &**v)));
            (0..this.workers.len() as u32).map(|w| PolicyInstance::new(&this.engine, &binding, w)).collect()
        })
        .await
        .map_err(|e| PolicyError::Init { name: compiled.name.clone(), reason: format!("init task failed: {e}") })??;
        let init_time = started.elapsed();
        let max_init = instances.iter().map(|i| i.init_time).max().unwrap_or_default();
        let install_started = Instant::now();
        let generation = {
            let mut b = self.binding.lock();
            b.generation += 1;
            b.policy = compiled.name.clone();
            b.digest = Some(compiled.digest.clone());
            b.params = params;
            b.unbound_reason = None;
            b.shared = instances.first().map(|i| i.binding().shared.clone());
            b.generation
        };
        // Off the async threads: a slot is locked by its worker for up to one policy
        // call's budget.
        let this = self.clone();
        let max_hold = tokio::task::spawn_blocking(move || {
            let mut max_hold = Duration::ZERO;
            for (w, instance) in this.workers.iter().zip(instances) {
                let t = Instant::now();
                let old = w.slot.lock().pending.replace((WorkerPolicy::Wasm(Box::new(instance)), generation));
                max_hold = max_hold.max(t.elapsed());
                drop(old);
            }
            max_hold
        })
        .await
        .map_err(|e| PolicyError::Init { name: compiled.name.clone(), reason: format!("install task failed: {e}") })?;
        // How the old policy's answers strayed from admission's prediction says
        // nothing about the new one's: a policy that waits on purpose, as
        // spread-drop does, would leave the next one its margin for 512 answers.
        // The batch size each worker learned is kept: the new policy's first
        // batches correct it, and starting over at 1 would refuse a batching
        // policy's first burst (learning from a swapped-out policy is wrong for one
        // batch; from nothing, for a whole burst).
        self.admission.forget_errors();
        self.counters.faults_since_bind.store(0, Ordering::Relaxed);
        self.counters.swaps.fetch_add(1, Ordering::Relaxed);
        self.metrics.swap(self.name(), &compiled.name);
        self.wake_all();
        Ok(SwapReport {
            policy: compiled.name.clone(),
            digest: compiled.digest.clone(),
            generation,
            // The caller knows whether it compiled or hit the cache; this is the cost
            // of the original compilation.
            compile_ms: compiled.compile_time.as_secs_f64() * 1e3,
            init_ms: init_time.as_secs_f64() * 1e3,
            max_instance_init_ms: max_init.as_secs_f64() * 1e3,
            install_us: install_started.elapsed().as_secs_f64() * 1e6,
            max_slot_hold_us: max_hold.as_secs_f64() * 1e6,
        })
    }

    /// Re-binds worker `w` to `view` (a pipeline task worker whose plan slot
    /// changed: its variant's table cut at the plan's batch, the task budget as its
    /// SLO, `flow::task_view`): a one-worker swap. A new instance of the policy the
    /// worker runs is made off the async threads from its binding with `w`'s view
    /// replaced (the store stays the one the app's other instances share, and the
    /// generation the same), then installed with the view in its slot between two of
    /// its decisions. Its queue is not touched: every queued request is decided by
    /// the old instance or the new one. A worker on the safe policy takes the view.
    pub async fn rebind_worker(self: &Arc<App>, w: usize, view: WorkerView) -> Result<(), PolicyError> {
        let _serial = self.swap_lock.lock().await;
        let this = self.clone();
        let name = self.binding.lock().policy.clone();
        let failed = |e: tokio::task::JoinError| PolicyError::Init { name: name.clone(), reason: format!("{e}") };
        tokio::task::spawn_blocking(move || -> Result<(), PolicyError> {
            let Some(worker) = this.workers.get(w) else {
                let reason = format!("app {}: no worker {w}", this.name());
                return Err(PolicyError::Instantiate { name: this.binding.lock().policy.clone(), reason });
            };
            // The binding it runs, or a swap's it has not taken yet (swaps wait on
            // `swap_lock`, so none starts meanwhile).
            let (bound, generation) = {
                let slot = worker.slot.lock();
                let (policy, generation) =
                    slot.pending.as_ref().map_or((&slot.current, slot.generation), |(p, g)| (p, *g));
                let bound = match policy {
                    WorkerPolicy::Wasm(p) => Some(p.binding().clone()),
                    WorkerPolicy::Safe => None,
                };
                (bound, generation)
            };
            let view = Arc::new(view);
            let instance = match bound {
                Some(b) => Some(PolicyInstance::new(&this.engine, &b.with_views([(w as u32, &*view)]), w as u32)?),
                None => None,
            };
            let mut slot = worker.slot.lock();
            slot.view = Some(view);
            let old = instance.and_then(|i| slot.pending.replace((WorkerPolicy::Wasm(Box::new(i)), generation)));
            drop(slot);
            drop(old);
            Ok(())
        })
        .await
        .map_err(failed)??;
        self.workers[w].queue.notify.notify_waiters();
        Ok(())
    }

    /// Records a policy fault and applies the app's fail mode. Returns true when the
    /// policy of `generation` must now be unbound.
    pub fn record_fault(&self, policy: &str, kind: &str, generation: u64, detail: &str) -> bool {
        self.counters.faults.fetch_add(1, Ordering::Relaxed);
        self.metrics.fault(self.name(), policy, kind);
        let n = self.counters.faults_since_bind.fetch_add(1, Ordering::Relaxed) + 1;
        // Counted always, logged at most once a second per app: a policy that
        // faults on every decision must not fill the log.
        self.fault_log.warn(|suppressed| {
            tracing::warn!(
                app = self.name(),
                policy,
                kind,
                faults = n,
                "policy fault answered by the safe policy: {detail} ({suppressed} more faults since the last line)"
            )
        });
        if self.config.fail_mode.unbinds(n, self.config.unbind_after) {
            let mut b = self.binding.lock();
            if b.generation == generation && b.unbound_reason.is_none() {
                b.unbound_reason = Some(format!("{n} faults (last: {kind}: {detail})"));
                b.policy = SAFE_POLICY.into();
                b.digest = None;
                self.unbind_generation.store(generation, Ordering::Release);
                tracing::error!(
                    app = self.name(),
                    policy,
                    "policy unbound after {n} faults; serving with the safe policy"
                );
            }
            return true;
        }
        false
    }

    /// Has worker `w` switch to `set` (loaded and warmed by the caller, off the
    /// worker): the worker installs it between two decisions, then drops the old
    /// sessions.
    pub async fn install_models(&self, w: usize, set: ModelSet) -> Result<(), InstallError> {
        let app = || self.name().to_string();
        let worker = self.workers.get(w).ok_or_else(|| InstallError::NoWorker { app: app(), worker: w })?;
        let (tx, rx) = oneshot::channel();
        worker
            .control
            .send(WorkerControl::Install(set, tx))
            .map_err(|_| InstallError::Stopped { app: app(), worker: w })?;
        worker.queue.notify.notify_waiters();
        rx.await.map_err(|_| InstallError::StoppedBeforeInstalling { app: app(), worker: w })
    }
}

/// Why a worker did not take its new models ([`App::install_models`]).
#[derive(Debug, Error)]
pub enum InstallError {
    /// The app has no worker of that index.
    #[error("app {app}: no worker {worker}")]
    NoWorker {
        /// The app.
        app: String,
        /// The index asked for.
        worker: usize,
    },
    /// The worker's thread has ended: nothing reads its control channel.
    #[error("app {app}: worker {worker} has stopped")]
    Stopped {
        /// The app.
        app: String,
        /// The worker.
        worker: usize,
    },
    /// The worker ended after the models were sent, before it installed them.
    #[error("app {app}: worker {worker} stopped before installing the models")]
    StoppedBeforeInstalling {
        /// The app.
        app: String,
        /// The worker.
        worker: usize,
    },
}

/// What a swap did and how long each part took.
#[derive(Clone, Debug, Serialize)]
pub struct SwapReport {
    /// The new policy.
    pub policy: String,
    /// Its digest.
    pub digest: String,
    /// The new binding generation.
    pub generation: u64,
    /// Time spent compiling (or looking up the cached compilation) for this swap.
    pub compile_ms: f64,
    /// Instantiating and initialising every worker's instance.
    pub init_ms: f64,
    /// The slowest single instance init.
    pub max_instance_init_ms: f64,
    /// Installing the instances into all slots.
    pub install_us: f64,
    /// Longest time the swap held one worker's slot (what a worker may wait).
    pub max_slot_hold_us: f64,
}
