//! The policy runtime: compiles policy components once (cached by digest), runs one
//! instance per worker under an epoch deadline and a memory cap, and turns traps,
//! overruns and invalid answers into counted faults the worker answers with the
//! built-in safe policy.
//!
//! Start here: [`PolicyEngine`] (one per process), [`CompiledPolicy`] (a validated,
//! pre-instantiated component), [`PolicyInstance`] (one per worker).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use thiserror::Error;
use wasmtime::component::{Component, HasSelf, Linker, TypedFunc};
use wasmtime::{Engine, Store, StoreContextMut, Trap, UpdateDeadline};

use sluice_sdk as sdk;

mod lower;
pub mod wasi;

/// Host bindings generated from `wit/`, the single source of truth of the contract.
#[allow(missing_docs)]
mod bindings {
    wasmtime::component::bindgen!({
        world: "policy",
        path: "../../wit",
    });
}

use bindings::sluice::policy::types as wit;
use bindings::{Policy, PolicyImports, PolicyPre};

/// How often the epoch ticker advances ("epoch" is wasmtime's word for this
/// interruption counter: the **epoch tick**, not a cluster placement epoch). A call's
/// budget is a whole number of ticks, so this is the resolution of every policy
/// deadline: too coarse and a runaway `decide` holds its worker longer than its
/// budget; too fine and the ticker thread costs CPU for nothing.
pub const EPOCH_TICK: Duration = Duration::from_millis(1);

/// Longest log line a policy may write; longer ones are cut so a chatty or hostile
/// policy cannot flood the host log.
const MAX_LOG_LINE: usize = 1024;

/// Longest `status` a policy may report (the rest is cut and marked).
pub const MAX_STATUS: usize = 64 << 10;

/// Longest Python traceback kept in a fault's detail (the rest is cut).
const MAX_TRACEBACK: usize = 4096;

/// Log lines a policy instance may write per second before the rest are dropped.
const LOG_LINES_PER_SECOND: u32 = 20;

/// Why a policy component was refused.
#[derive(Debug, Error)]
pub enum PolicyError {
    /// Not a valid component, or it does not implement `sluice:policy/policy@0.1.0`.
    #[error("policy {name}: not a valid sluice:policy@0.1.0 component: {reason}")]
    Invalid {
        /// Policy name.
        name: String,
        /// wasmtime's explanation.
        reason: String,
    },
    /// Instantiation failed (e.g. its start function trapped or exceeded the memory cap).
    #[error("policy {name}: instantiation failed: {reason}")]
    Instantiate {
        /// Policy name.
        name: String,
        /// The cause.
        reason: String,
    },
    /// `init` returned an error or trapped.
    #[error("policy {name}: init failed: {reason}")]
    Init {
        /// Policy name.
        name: String,
        /// The policy's message or the trap.
        reason: String,
    },
}

/// A policy call that did not produce a usable answer.
#[derive(Clone, Debug, Error, PartialEq)]
pub enum PolicyFault {
    /// The call trapped (panic, unreachable, out-of-bounds access...).
    #[error("trap: {0}")]
    Trap(String),
    /// The call ran past its epoch deadline.
    #[error("overran its budget of {0:?}")]
    Timeout(Duration),
    /// The instance asked for more memory than its cap.
    #[error("exceeded its memory cap of {0} bytes")]
    Memory(usize),
    /// The decision broke a rule of the contract.
    #[error("invalid decision: {0}")]
    Invalid(String),
    /// Re-instantiating the instance after a fault failed (its `init` trapped,
    /// returned an error or overran the re-instantiation budget).
    #[error("re-instantiation after a fault failed: {0}")]
    Reinit(String),
    /// The instance is being re-instantiated after a fault, off the worker's thread;
    /// the safe policy decides meanwhile. Not a fault of its own: the fault that
    /// caused it was counted when it happened.
    #[error("re-instantiating after a fault; the safe policy decides meanwhile")]
    Reviving,
    /// The policy let this many requests expire in its queue without dispatching or
    /// dropping anything meanwhile: every answer was valid, but a policy that never
    /// serves is broken all the same, and counting it lets `fail_mode = "unbind"` act.
    #[error("let {0} requests expire without dispatching or dropping any")]
    Stalled(u64),
}

impl PolicyFault {
    /// Short label for metrics (`trap`, `timeout`, `memory`, `invalid`, `reinit`,
    /// `reviving`, `stalled`).
    pub fn kind(&self) -> &'static str {
        match self {
            PolicyFault::Trap(_) => "trap",
            PolicyFault::Timeout(_) => "timeout",
            PolicyFault::Memory(_) => "memory",
            PolicyFault::Invalid(_) => "invalid",
            PolicyFault::Reinit(_) => "reinit",
            PolicyFault::Reviving => "reviving",
            PolicyFault::Stalled(_) => "stalled",
        }
    }
}

/// Per-instance limits.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Budget of one `decide` or `observe` call.
    pub call_budget: Duration,
    /// Budget of `init` when an instance is first made (a bind or a swap, off the
    /// request path: policy generation may be slow).
    pub init_budget: Duration,
    /// Budget of `init` when an instance is re-made after a fault. Short, because a
    /// policy that faulted once is suspect, and a re-init that spins must not hold
    /// a core for as long as a first init may.
    pub reinit_budget: Duration,
    /// Re-instantiate after a fault on a thread of its own, answering with
    /// [`PolicyFault::Reviving`] (the safe policy decides) until it is done (the live
    /// host); otherwise re-instantiate inline before the next call (the simulator,
    /// whose virtual time must not depend on a thread's timing).
    pub background_reinit: bool,
    /// Cap on the instance's linear memory, in bytes.
    pub memory_bytes: usize,
    /// The clock the budgets are measured on.
    pub clock: BudgetClock,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            call_budget: Duration::from_millis(10),
            init_budget: Duration::from_secs(60),
            reinit_budget: Duration::from_secs(1),
            background_reinit: false,
            memory_bytes: 64 << 20,
            clock: BudgetClock::Wall,
        }
    }
}

impl Limits {
    /// The limits the simulator runs a policy under whose live limits are `self`: the
    /// same budgets and memory cap, so a policy that overruns live overruns in a
    /// replay too, measured on the thread's CPU clock so results do not depend on
    /// the machine's load, and re-instantiation inline (virtual time must not depend
    /// on a thread's timing).
    pub fn simulated(self) -> Limits {
        Limits { clock: BudgetClock::ThreadCpu, background_reinit: false, ..self }
    }
}

/// The clock a policy call's budget is measured on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BudgetClock {
    /// Wall time (the live host: a worker waits for its policy in real time). The
    /// epoch deadline traps when it passes; no clock is read.
    #[default]
    Wall,
    /// The calling thread's CPU time (the simulator). A call is stopped after as
    /// much work as the live budget allows, but a thread descheduled on a busy
    /// machine does not run out its budget, so results do not depend on the
    /// machine's load. Counted from the call's first epoch tick: the work before it
    /// (at most one [`EPOCH_TICK`]) is free, which only matters to a call that runs
    /// out its budget anyway.
    ThreadCpu,
}

/// Longest pause between two re-instantiation attempts of an instance whose
/// re-instantiations keep failing (the pause doubles from one second).
pub const MAX_REINIT_BACKOFF: Duration = Duration::from_secs(60);

fn ticks(budget: Duration) -> u64 {
    (budget.as_micros() / EPOCH_TICK.as_micros()).max(1) as u64 + 1
}

/// Longest key of the shared store (`shared-put` refuses longer ones).
pub const MAX_SHARED_KEY: usize = 1024;

/// What one entry of the shared store costs the host beyond its key and value
/// (map slot, `String` and `Arc` headers), charged to the budget so that a policy
/// storing millions of empty values cannot grow the host's memory past it.
pub const SHARED_ENTRY_OVERHEAD: usize = 64;

/// The store the instances of one binding share (`shared-get` / `shared-put` in
/// `wit/policy.wit`): write-once values under string keys, within a byte budget.
///
/// One is made per binding: an app's policy at startup, each hot swap, each
/// simulator run. Values are kept as `Arc<[u8]>` so a `get` copies only into the
/// guest.
#[derive(Debug)]
pub struct SharedStore {
    budget: usize,
    inner: Mutex<SharedInner>,
    /// Whether an instance read or wrote the store after its `init` returned.
    used_after_init: std::sync::atomic::AtomicBool,
}

#[derive(Debug, Default)]
struct SharedInner {
    values: HashMap<String, Arc<[u8]>>,
    bytes: usize,
}

impl SharedStore {
    /// An empty store holding at most `budget` bytes of keys and values.
    pub fn new(budget: usize) -> Arc<SharedStore> {
        Arc::new(SharedStore {
            budget,
            inner: Mutex::new(SharedInner::default()),
            used_after_init: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Whether any instance used the store after its `init`: then what an instance
    /// decides may depend on when another instance stored a value (RAMSIS generating
    /// a policy in slices), and a replay split by worker is not exact.
    pub fn used_after_init(&self) -> bool {
        self.used_after_init.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The value under `key`.
    pub fn get(&self, key: &str) -> Option<Arc<[u8]>> {
        self.inner.lock().values.get(key).cloned()
    }

    /// Stores `value` under `key` unless the key is taken, longer than
    /// [`MAX_SHARED_KEY`], or the budget would be exceeded (each entry costs its
    /// key, its value and [`SHARED_ENTRY_OVERHEAD`]); returns whether it did.
    pub fn put(&self, key: String, value: Vec<u8>) -> bool {
        if key.len() > MAX_SHARED_KEY {
            return false;
        }
        let mut inner = self.inner.lock();
        let size = key.len() + value.len() + SHARED_ENTRY_OVERHEAD;
        if inner.values.contains_key(&key) || inner.bytes + size > self.budget {
            return false;
        }
        inner.bytes += size;
        inner.values.insert(key, value.into());
        true
    }

    /// Bytes charged to the budget: keys, values and the per-entry overhead.
    pub fn bytes(&self) -> usize {
        self.inner.lock().bytes
    }
}

/// The store data of one policy instance.
pub struct HostState {
    tag: Arc<str>,
    shared: Arc<SharedStore>,
    memory_cap: usize,
    memory_denied: bool,
    log_window: Instant,
    log_lines: u32,
    /// The panic message the SDK's hook logged just before a trap (kept even when
    /// the log itself is rate-limited), taken into the fault's detail.
    panic: Option<String>,
    /// True until `init` returns ([`SharedStore::used_after_init`]).
    initialising: bool,
    /// Where a call's deadline is judged by [`on_tick`]: the call in progress.
    deadline: TickDeadline,
    /// WASI state, only for components that import WASI ([`CompiledPolicy::wasi`]);
    /// boxed so that a Rust policy's store stays as small as before.
    wasi: Option<Box<wasi::WasiState>>,
}

/// A call's deadline as [`on_tick`] judges it, for bindings whose budget is CPU time
/// or that can be aborted ([`Binding::ticks_checked`]).
struct TickDeadline {
    clock: BudgetClock,
    abort: Option<Arc<AtomicBool>>,
    /// The budget of the call in progress.
    budget: Duration,
    /// Calls started so far: tells [`on_tick`] that a new call began.
    call: u64,
    /// The call [`TickDeadline::since`] belongs to.
    seen: u64,
    /// Epoch ticks since the call's first (wall clock), or the thread's CPU time at
    /// its first tick (CPU clock).
    ticks: u64,
    since: Duration,
}

impl TickDeadline {
    /// A call with `budget` starts.
    fn start(&mut self, budget: Duration) {
        self.budget = budget;
        self.call += 1;
    }
}

/// Called at each epoch tick while a ticks-checked instance runs: stops the call
/// when the binding is aborted or the call's budget is spent on its clock, and
/// otherwise looks again at the next tick.
fn on_tick(mut ctx: StoreContextMut<'_, HostState>) -> wasmtime::Result<UpdateDeadline> {
    let d = &mut ctx.data_mut().deadline;
    if d.abort.as_ref().is_some_and(|a| a.load(Ordering::Acquire)) {
        return Ok(UpdateDeadline::Interrupt);
    }
    let first = d.seen != d.call;
    if first {
        d.seen = d.call;
        d.ticks = 0;
    }
    let spent = match d.clock {
        BudgetClock::Wall => {
            d.ticks += 1;
            d.ticks >= ticks(d.budget)
        }
        BudgetClock::ThreadCpu => {
            let ts = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
            let now = Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32);
            if first {
                d.since = now;
            }
            now.saturating_sub(d.since) >= d.budget
        }
    };
    Ok(if spent { UpdateDeadline::Interrupt } else { UpdateDeadline::Continue(1) })
}

impl wasmtime::ResourceLimiter for HostState {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.memory_cap {
            // Denying (rather than trapping here) lets a careful guest handle the
            // failure; a Rust guest aborts, which traps and is reported as `Memory`.
            self.memory_denied = true;
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }
}

impl PolicyImports for HostState {
    fn log(&mut self, level: u8, message: String) {
        if let Some(m) = message.strip_prefix(sluice_sdk::wit::PANIC_PREFIX) {
            let mut m = m.to_string();
            truncate_at_char(&mut m, MAX_LOG_LINE);
            self.panic = Some(m);
        }
        self.write_log(level, message);
    }

    fn shared_get(&mut self, key: String) -> Option<Vec<u8>> {
        self.note_shared_use();
        self.shared.get(&key).map(|v| v.to_vec())
    }

    fn shared_put(&mut self, key: String, value: Vec<u8>) -> bool {
        self.note_shared_use();
        self.shared.put(key, value)
    }
}

impl HostState {
    /// Writes a policy's log line, within the instance's rate limit.
    fn write_log(&mut self, level: u8, message: String) {
        let now = Instant::now();
        if now.duration_since(self.log_window) >= Duration::from_secs(1) {
            self.log_window = now;
            self.log_lines = 0;
        }
        self.log_lines += 1;
        if self.log_lines > LOG_LINES_PER_SECOND {
            return;
        }
        let mut message = message;
        truncate_at_char(&mut message, MAX_LOG_LINE);
        let tag = &*self.tag;
        match level {
            0 => tracing::error!(target: "sluice::policy", policy = tag, "{message}"),
            1 => tracing::warn!(target: "sluice::policy", policy = tag, "{message}"),
            2 => tracing::info!(target: "sluice::policy", policy = tag, "{message}"),
            3 => tracing::debug!(target: "sluice::policy", policy = tag, "{message}"),
            _ => tracing::trace!(target: "sluice::policy", policy = tag, "{message}"),
        }
    }

    /// Moves what a WASI guest wrote to stdout (info) and stderr (warn) since the
    /// last call into the policy log, a line per entry within the rate limit; returns
    /// the stderr text (a Python exception's traceback when the call trapped). Costs
    /// a Rust policy one branch.
    fn drain_output(&mut self) -> Option<String> {
        let wasi = self.wasi.as_ref()?;
        let (out, err) = (wasi.stdout.take(), wasi.stderr.take());
        for (level, text) in [(2, &out), (1, &err)] {
            for line in text.iter().flat_map(|t| t.lines()).filter(|l| !l.trim().is_empty()) {
                self.write_log(level, line.to_string());
            }
        }
        err
    }
}

impl wit::Host for HostState {}

impl HostState {
    fn note_shared_use(&self) {
        if !self.initialising {
            self.shared.used_after_init.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// A compiled, validated policy component ready to be instantiated.
pub struct CompiledPolicy {
    /// Policy name it was compiled under.
    pub name: String,
    /// Hex SHA-256 of the component bytes.
    pub digest: String,
    /// Size of the component in bytes.
    pub size: usize,
    /// How long compilation and validation took.
    pub compile_time: Duration,
    /// Whether the host calls `observe` after each batch: false when the component
    /// declares that its `observe` does nothing ([`HINTS_SECTION`]).
    pub observes: bool,
    /// Whether the component imports WASI 0.2 (a Python policy): it is linked with
    /// [`wasi`] and each of its stores carries a WASI context that grants nothing.
    pub wasi: bool,
    pre: PolicyPre<HostState>,
}

impl std::fmt::Debug for CompiledPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledPolicy").field("name", &self.name).field("digest", &self.digest).finish()
    }
}

/// The process-wide Wasm engine: compiler, linker, digest cache and epoch ticker.
pub struct PolicyEngine {
    engine: Engine,
    /// The contract's imports only: components without WASI imports.
    linker: Linker<HostState>,
    /// The contract's imports and WASI 0.2 ([`wasi`]): components that import WASI.
    wasi_linker: Linker<HostState>,
    cache: Mutex<HashMap<String, Arc<CompiledPolicy>>>,
}

/// Hex SHA-256 of `bytes`.
pub fn digest(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

impl PolicyEngine {
    /// Creates the engine and starts its epoch ticker thread, which stops when the
    /// engine is dropped.
    ///
    /// Compiled code is cached on disk (wasmtime's cache, keyed by the component's
    /// bytes and the compiler's settings), so a restart, a second `sluice sim` or a
    /// re-upload of a known policy loads machine code instead of compiling it again.
    /// `SLUICE_COMPILE_CACHE` picks the directory (default: the user's cache
    /// directory, e.g. `~/.cache/wasmtime`) or turns the cache `off`. A cache that
    /// cannot be opened is logged and skipped.
    pub fn new() -> anyhow::Result<Arc<PolicyEngine>> {
        let cache = match std::env::var("SLUICE_COMPILE_CACHE") {
            Ok(v) if v == "off" => None,
            Ok(dir) => Some(std::path::PathBuf::from(dir)),
            Err(_) => Some(std::path::PathBuf::new()),
        };
        Self::with_cache(cache.as_deref())
    }

    /// Creates the engine with the compile cache in `dir` (the default directory
    /// when `dir` is empty) or without one (`None`).
    pub fn with_cache(dir: Option<&std::path::Path>) -> anyhow::Result<Arc<PolicyEngine>> {
        let mut config = wasmtime::Config::new();
        config.epoch_interruption(true);
        config.wasm_component_model(true);
        // For `perf`: `SLUICE_WASM_PERFMAP=1` writes /tmp/perf-<pid>.map, naming the
        // policies' compiled functions (with `SLUICE_COMPILE_CACHE=off`, so that
        // every policy is compiled, and reported, in this process).
        if std::env::var_os("SLUICE_WASM_PERFMAP").is_some() {
            config.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        if let Some(dir) = dir {
            let mut cache = wasmtime::CacheConfig::new();
            if !dir.as_os_str().is_empty() {
                cache.with_directory(std::path::absolute(dir)?);
            }
            match wasmtime::Cache::new(cache) {
                Ok(cache) => {
                    config.cache(Some(cache));
                }
                Err(e) => tracing::warn!("policy compile cache disabled: {e:#}"),
            }
        }
        let engine = Engine::new(&config)?;
        let mut linker = Linker::new(&engine);
        Policy::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)?;
        // A second linker with WASI for the components that import it: linking it
        // for every component would hand a Rust policy interfaces it never asked for
        // and cost its store a WASI context.
        let mut wasi_linker = linker.clone();
        wasi::add_to_linker(&mut wasi_linker)?;
        let this = Arc::new(PolicyEngine { engine, linker, wasi_linker, cache: Mutex::new(HashMap::new()) });
        let weak: Weak<PolicyEngine> = Arc::downgrade(&this);
        std::thread::Builder::new().name("sluice-epoch".into()).spawn(move || loop {
            std::thread::sleep(EPOCH_TICK);
            match weak.upgrade() {
                Some(e) => e.engine.increment_epoch(),
                None => return,
            }
        })?;
        Ok(this)
    }

    /// Compiles and validates a component against the `policy` world, or returns the
    /// cached compilation of identical bytes.
    pub fn compile(&self, name: &str, bytes: &[u8]) -> Result<Arc<CompiledPolicy>, PolicyError> {
        let digest = digest(bytes);
        if let Some(c) = self.cache.lock().get(&digest) {
            if c.name == name {
                return Ok(c.clone());
            }
            // Same bytes under another name: share the compiled code.
            let c = Arc::new(CompiledPolicy {
                name: name.to_string(),
                digest: c.digest.clone(),
                size: c.size,
                compile_time: Duration::ZERO,
                observes: c.observes,
                wasi: c.wasi,
                pre: c.pre.clone(),
            });
            return Ok(c);
        }
        let started = Instant::now();
        let invalid = |reason: String| PolicyError::Invalid { name: name.to_string(), reason };
        // The world and its version are read first: a wrong upload is refused in
        // microseconds, not after a compilation of tens of milliseconds. (Text
        // format, for tests and experiments, is left to the compiler.)
        let (mut observes, mut wasi) = (true, false);
        if bytes.starts_with(b"\0asm") {
            let interface = check_world(bytes).map_err(|e| invalid(e.to_string()))?;
            observes = !interface.observe_unused;
            wasi = interface.wasi;
        }
        let component = Component::new(&self.engine, bytes).map_err(|e| invalid(format!("{e:#}")))?;
        let linker = if wasi { &self.wasi_linker } else { &self.linker };
        let instance_pre = linker.instantiate_pre(&component).map_err(|e| invalid(format!("{e:#}")))?;
        let pre = PolicyPre::new(instance_pre).map_err(|e| invalid(format!("{e:#}")))?;
        let compiled = Arc::new(CompiledPolicy {
            name: name.to_string(),
            digest: digest.clone(),
            size: bytes.len(),
            compile_time: started.elapsed(),
            observes,
            wasi,
            pre,
        });
        self.cache.lock().insert(digest, compiled.clone());
        Ok(compiled)
    }
}

/// The optional `status: func() -> string` export.
type StatusFunc = TypedFunc<(), (String,)>;

/// A freshly instantiated and initialised instance: its store, bindings, `status`
/// and `decide` (lowering the view straight from the host's: [`lower`]).
type Live = (Store<HostState>, Policy, Option<StatusFunc>, lower::DecideFunc);

/// What the instances of one binding share: the compiled policy, the `config`
/// record (the same for every worker but for its index, and its models and SLO
/// where [`Binding::worker_models`] and [`Binding::worker_slo`] give a worker its
/// own), the limits and the binding's [`SharedStore`]. An app's policy at startup, each hot swap and each
/// simulator run make one; its instances are made with [`PolicyInstance::new`].
///
/// Keeping one `config` per binding rather than per instance matters when the
/// params are large (a RAMSIS load grid is megabytes): each instance receives a
/// copy in its own memory, but the host keeps one.
#[derive(Debug)]
pub struct Binding {
    /// The compiled component.
    pub compiled: Arc<CompiledPolicy>,
    /// The `config` record; `worker` is set per instance.
    pub config: sdk::Config,
    /// The instances' limits.
    pub limits: Limits,
    /// The store the instances share, with a budget of `limits.memory_bytes`.
    pub shared: Arc<SharedStore>,
    /// Per worker, the `models` its instance sees in place of `config.models`: when
    /// workers run on different device types, each sees its own device's latency
    /// of every variant (None: every worker sees `config.models`).
    pub worker_models: Option<Arc<Vec<Vec<sdk::Model>>>>,
    /// Per worker, the SLO (µs) its instance's `config.slo` carries in place of
    /// `config.slo` (None: every worker `config.slo`): a pipeline task worker gets
    /// its task budget ([`WorkerView`], [`Binding::with_views`]).
    pub worker_slo: Option<Arc<Vec<u64>>>,
    /// Once set, every running and later call of the binding's instances stops
    /// within an [`EPOCH_TICK`] as a timeout: a cancelled replay must not wait for a
    /// looping policy to run out its budget, call after call (None: never).
    pub abort: Option<Arc<AtomicBool>>,
}

impl Binding {
    /// A binding with an empty shared store.
    pub fn new(compiled: Arc<CompiledPolicy>, config: sdk::Config, limits: Limits) -> Arc<Binding> {
        Binding::per_worker(compiled, config, limits, None)
    }

    /// A binding whose workers each see their own model tables (`worker_models[w]`).
    pub fn per_worker(
        compiled: Arc<CompiledPolicy>,
        config: sdk::Config,
        limits: Limits,
        worker_models: Option<Arc<Vec<Vec<sdk::Model>>>>,
    ) -> Arc<Binding> {
        Binding::abortable(compiled, config, limits, worker_models, None)
    }

    /// A binding like [`Binding::per_worker`] whose calls stop once `abort` is set
    /// ([`Binding::abort`]).
    pub fn abortable(
        compiled: Arc<CompiledPolicy>,
        config: sdk::Config,
        limits: Limits,
        worker_models: Option<Arc<Vec<Vec<sdk::Model>>>>,
        abort: Option<Arc<AtomicBool>>,
    ) -> Arc<Binding> {
        let shared = SharedStore::new(limits.memory_bytes);
        Arc::new(Binding { compiled, config, limits, shared, worker_models, worker_slo: None, abort })
    }

    /// This binding with each listed worker seeing its own [`WorkerView`] (models and
    /// SLO) in place of what it saw; the compiled policy, limits, abort flag and the
    /// shared store stay the same. A one-worker re-bind (a pipeline task worker whose
    /// plan slot changed) makes its worker's new instance from it while the other
    /// workers' instances keep theirs, all on one store; a hot swap applies the views
    /// its workers had to its fresh binding.
    pub fn with_views<'a>(&self, views: impl IntoIterator<Item = (u32, &'a WorkerView)>) -> Arc<Binding> {
        let mut models = self.worker_models.as_deref().cloned().unwrap_or_default();
        let mut slo = self.worker_slo.as_deref().cloned().unwrap_or_default();
        let mut changed = false;
        for (w, view) in views {
            let w = w as usize;
            // Workers not listed keep what they saw: the config's, unless set already.
            let n = (w + 1).max(self.config.workers as usize);
            if models.len() < n {
                models.extend((models.len()..n).map(|i| self.models_of(i as u32).to_vec()));
            }
            if slo.len() < n {
                slo.extend((slo.len()..n).map(|i| self.slo_of(i as u32)));
            }
            models[w] = view.models.clone();
            slo[w] = view.slo;
            changed = true;
        }
        Arc::new(Binding {
            compiled: self.compiled.clone(),
            config: self.config.clone(),
            limits: self.limits,
            shared: self.shared.clone(),
            worker_models: if changed { Some(Arc::new(models)) } else { self.worker_models.clone() },
            worker_slo: if changed { Some(Arc::new(slo)) } else { self.worker_slo.clone() },
            abort: self.abort.clone(),
        })
    }

    /// Whether the instances' deadlines need the tick callback ([`on_tick`]) rather
    /// than the plain epoch trap.
    fn ticks_checked(&self) -> bool {
        self.limits.clock != BudgetClock::Wall || self.abort.is_some()
    }

    /// The models worker `w`'s instance sees.
    pub fn models_of(&self, worker: u32) -> &[sdk::Model] {
        match &self.worker_models {
            Some(m) => m.get(worker as usize).map_or(&self.config.models[..], |v| &v[..]),
            None => &self.config.models,
        }
    }

    /// The SLO worker `w`'s instance sees, µs.
    pub fn slo_of(&self, worker: u32) -> u64 {
        self.worker_slo.as_ref().and_then(|s| s.get(worker as usize).copied()).unwrap_or(self.config.slo)
    }
}

/// What one worker's instance is given in place of its binding's `config.models` and
/// `config.slo` ([`Binding::with_views`]): for a pipeline task worker, its plan slot's
/// view (`pipeline::flow::task_view`: its variant's latency table cut at the plan's
/// batch, the task budget as its SLO, Loki §4.2).
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerView {
    /// The variants as the worker's policy (and its decisions) see them.
    pub models: Vec<sdk::Model>,
    /// The SLO its `config.slo` carries, µs.
    pub slo: u64,
}

/// One policy instance bound to one worker.
pub struct PolicyInstance {
    engine: Arc<PolicyEngine>,
    binding: Arc<Binding>,
    worker: u32,
    store: Store<HostState>,
    bindings: Policy,
    /// The optional `status` export (world `policy-with-status`).
    status: Option<StatusFunc>,
    /// `decide`, called with the host's view borrowed ([`lower`]).
    decide: lower::DecideFunc,
    /// After a trap the store cannot be entered again; the next call re-instantiates.
    poisoned: bool,
    /// A re-instantiation running on its own thread, or the pause after failed ones.
    revival: Revival,
    /// Successful re-instantiations after faults.
    revivals: u64,
    /// How long the last instantiation + init took.
    pub init_time: Duration,
    /// Requests expired in this worker's queue since the policy last dispatched or
    /// dropped ([`crate::decision::STALL_LIMIT`]).
    pub(crate) expired_idle: u64,
    /// The contract's view, rebuilt in place for each [`PolicyInstance::decide_via_bindings`]
    /// (no allocation per call).
    wit_view: wit::View,
}

/// Where a poisoned instance's re-instantiation stands ([`Limits::background_reinit`]).
enum Revival {
    /// None running (the next call starts one).
    Idle { failures: u32, retry_at: Option<Instant> },
    /// One runs on its own thread; its result arrives here.
    Running { result: std::sync::mpsc::Receiver<Result<Live, PolicyError>>, failures: u32 },
}

impl std::fmt::Debug for PolicyInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyInstance").field("policy", &self.binding.compiled.name).finish()
    }
}

impl PolicyInstance {
    /// Instantiates the binding's policy for `worker` in a fresh store and calls
    /// `init`.
    pub fn new(engine: &Arc<PolicyEngine>, binding: &Arc<Binding>, worker: u32) -> Result<PolicyInstance, PolicyError> {
        let started = Instant::now();
        let (store, bindings, status, decide) = outside_runtime(binding.compiled.wasi, || {
            Self::instantiate(engine, binding, worker, binding.limits.init_budget)
        })?;
        Ok(PolicyInstance {
            engine: engine.clone(),
            binding: binding.clone(),
            worker,
            store,
            bindings,
            status,
            decide,
            poisoned: false,
            revival: Revival::Idle { failures: 0, retry_at: None },
            revivals: 0,
            init_time: started.elapsed(),
            expired_idle: 0,
            wit_view: wit::View { now: 0, worker: 0, workers: 0, load_qps: 0.0, loaded: Vec::new(), queue: Vec::new() },
        })
    }

    fn instantiate(
        engine: &Arc<PolicyEngine>,
        binding: &Binding,
        worker: u32,
        init_budget: Duration,
    ) -> Result<Live, PolicyError> {
        let (compiled, limits) = (&binding.compiled, binding.limits);
        let tag: Arc<str> = format!("{}/{}#{}", binding.config.app, compiled.name, worker).into();
        let state = HostState {
            tag,
            shared: binding.shared.clone(),
            memory_cap: limits.memory_bytes,
            memory_denied: false,
            log_window: Instant::now(),
            log_lines: 0,
            panic: None,
            initialising: true,
            deadline: TickDeadline {
                clock: limits.clock,
                abort: binding.abort.clone(),
                budget: init_budget,
                call: 1,
                seen: 0,
                ticks: 0,
                since: Duration::ZERO,
            },
            wasi: compiled.wasi.then(Box::default),
        };
        let mut store = Store::new(&engine.engine, state);
        store.limiter(|s| s);
        if binding.ticks_checked() {
            store.epoch_deadline_callback(on_tick);
            store.set_epoch_deadline(1);
        } else {
            store.epoch_deadline_trap();
            store.set_epoch_deadline(ticks(init_budget));
        }
        let name = compiled.name.clone();
        let instance = match compiled.pre.instance_pre().instantiate(&mut store) {
            Ok(i) => i,
            Err(e) => {
                let reason = classify(&mut store, e, init_budget).to_string();
                return Err(PolicyError::Instantiate { name, reason });
            }
        };
        let bindings = Policy::new(&mut store, &instance)
            .map_err(|e| PolicyError::Instantiate { name: name.clone(), reason: format!("{e:#}") })?;
        // `status` is optional: components of the plain `policy` world lack it.
        let status = instance.get_typed_func::<(), (String,)>(&mut store, "status").ok();
        // Type-checked here against the component's own `decide` (as `Policy::new`
        // just did for the generated types): a mismatch refuses the component.
        let decide = instance
            .get_typed_func::<(lower::ViewArg<'static>,), (wit::Decision,)>(&mut store, "decide")
            .map_err(|e| PolicyError::Instantiate { name: name.clone(), reason: format!("{e:#}") })?;
        // A transient copy: the record is lowered into the instance's memory.
        match bindings.call_init(
            &mut store,
            &to_wit_config(&binding.config, binding.models_of(worker), binding.slo_of(worker), worker),
        ) {
            Ok(Ok(())) => {
                store.data_mut().drain_output();
                store.data_mut().initialising = false;
                Ok((store, bindings, status, decide))
            }
            Ok(Err(message)) => {
                store.data_mut().drain_output();
                Err(PolicyError::Init { name, reason: message })
            }
            Err(e) => {
                let fault = classify(&mut store, e, init_budget);
                Err(PolicyError::Init { name, reason: fault.to_string() })
            }
        }
    }

    /// The compiled policy this instance runs.
    pub fn compiled(&self) -> &Arc<CompiledPolicy> {
        &self.binding.compiled
    }

    /// The binding this instance belongs to.
    pub fn binding(&self) -> &Arc<Binding> {
        &self.binding
    }

    /// Re-instantiations after faults that succeeded.
    pub fn revivals(&self) -> u64 {
        self.revivals
    }

    /// Whether the instance is waiting for a re-instantiation (the safe policy
    /// decides meanwhile).
    pub fn reviving(&self) -> bool {
        self.poisoned
    }

    fn ensure_live(&mut self) -> Result<(), PolicyFault> {
        if self.poisoned {
            let live = if self.binding.limits.background_reinit {
                self.revive_in_background()?
            } else {
                let (engine, binding, worker) = (&self.engine, &self.binding, self.worker);
                outside_runtime(binding.compiled.wasi, || {
                    Self::instantiate(engine, binding, worker, binding.limits.reinit_budget)
                })
                .map_err(|e| PolicyFault::Reinit(e.to_string()))?
            };
            (self.store, self.bindings, self.status, self.decide) = live;
            self.poisoned = false;
            self.revivals += 1;
        }
        if self.binding.ticks_checked() {
            self.store.data_mut().deadline.start(self.binding.limits.call_budget);
            self.store.set_epoch_deadline(1);
        } else {
            self.store.set_epoch_deadline(ticks(self.binding.limits.call_budget));
        }
        Ok(())
    }

    /// Starts or polls the re-instantiation on its own thread: the caller (a worker)
    /// never waits for a policy's `init`. A failed one is a fault; the next is tried
    /// after a pause that doubles, so a policy whose `init` always spins costs a core
    /// for at most one budget per pause.
    fn revive_in_background(&mut self) -> Result<Live, PolicyFault> {
        let now = Instant::now();
        match &mut self.revival {
            Revival::Idle { retry_at: Some(at), .. } if now < *at => Err(PolicyFault::Reviving),
            Revival::Idle { failures, .. } => {
                let failures = *failures;
                let (tx, rx) = std::sync::mpsc::channel();
                let (engine, binding, worker) = (self.engine.clone(), self.binding.clone(), self.worker);
                let spawned = std::thread::Builder::new().name(format!("sluice-reinit-{worker}")).spawn(move || {
                    let _ = tx.send(Self::instantiate(&engine, &binding, worker, binding.limits.reinit_budget));
                });
                if let Err(e) = spawned {
                    return Err(PolicyFault::Reinit(format!("could not start a thread: {e}")));
                }
                self.revival = Revival::Running { result: rx, failures };
                Err(PolicyFault::Reviving)
            }
            Revival::Running { result, failures } => match result.try_recv() {
                Err(std::sync::mpsc::TryRecvError::Empty) => Err(PolicyFault::Reviving),
                Ok(Ok(live)) => {
                    self.revival = Revival::Idle { failures: 0, retry_at: None };
                    Ok(live)
                }
                Ok(Err(e)) => {
                    let failures = *failures + 1;
                    let pause = Duration::from_secs(1u64 << failures.min(6)).min(MAX_REINIT_BACKOFF);
                    self.revival = Revival::Idle { failures, retry_at: Some(now + pause) };
                    Err(PolicyFault::Reinit(e.to_string()))
                }
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    self.revival = Revival::Idle { failures: *failures + 1, retry_at: None };
                    Err(PolicyFault::Reinit("the re-instantiation thread died".into()))
                }
            },
        }
    }

    /// Asks the policy for a decision. The answer is not validated here (see
    /// the live worker loop); a trap, overrun or memory fault is returned as a fault and
    /// the instance is re-created before its next call.
    pub fn decide(&mut self, view: &sdk::View) -> Result<sdk::Decision, PolicyFault> {
        self.ensure_live()?;
        let (decide, store) = (lower::decide_func(&self.decide), &mut self.store);
        let called = outside_runtime(self.binding.compiled.wasi, || {
            decide.call(store, (lower::ViewArg::new(view),)).map(|(d,)| d)
        });
        self.decided(called)
    }

    /// [`PolicyInstance::decide`] through the generated bindings: the view copied into
    /// a `wit::View`, then lowered field by field. The same answers and faults,
    /// slower; kept as the `decide` benchmark's baseline (BENCHMARKS.md §1).
    #[doc(hidden)]
    pub fn decide_via_bindings(&mut self, view: &sdk::View) -> Result<sdk::Decision, PolicyFault> {
        self.ensure_live()?;
        to_wit_view(view, &mut self.wit_view);
        let (bindings, store, view) = (&self.bindings, &mut self.store, &self.wit_view);
        let called = outside_runtime(self.binding.compiled.wasi, || bindings.call_decide(store, view));
        if self.wit_view.queue.capacity() > KEPT_VIEW_CAPACITY {
            // A burst's deep queue is not kept for the worker's lifetime.
            self.wit_view.queue = Vec::new();
        }
        self.decided(called)
    }

    /// The decision of a `decide` call, or its fault (the instance is then
    /// re-created before its next call).
    fn decided(&mut self, called: wasmtime::Result<wit::Decision>) -> Result<sdk::Decision, PolicyFault> {
        match called {
            Ok(d) => {
                self.store.data_mut().drain_output();
                Ok(from_wit_decision(d))
            }
            Err(e) => {
                self.poisoned = true;
                Err(classify(&mut self.store, e, self.binding.limits.call_budget))
            }
        }
    }

    /// The policy's own description of its state (world `policy-with-status`), or
    /// `None` when the component does not export `status`.
    pub fn status(&mut self) -> Result<Option<String>, PolicyFault> {
        self.ensure_live()?;
        let Some(f) = self.status else { return Ok(None) };
        let store = &mut self.store;
        match outside_runtime(self.binding.compiled.wasi, || f.call(store, ())) {
            Ok((mut s,)) => {
                self.store.data_mut().drain_output();
                // A policy's status goes into admin answers: capped like its logs.
                if truncate_at_char(&mut s, MAX_STATUS) {
                    s.push_str("…(truncated)");
                }
                Ok(Some(s))
            }
            Err(e) => {
                self.poisoned = true;
                Err(classify(&mut self.store, e, self.binding.limits.call_budget))
            }
        }
    }

    /// Whether the component uses `observe` ([`CompiledPolicy::observes`]): a driver
    /// need not work out a batch's feedback for one that does not.
    pub fn observes(&self) -> bool {
        self.binding.compiled.observes
    }

    /// Tells the policy how a batch went (unless it declared that it does not use
    /// it: [`CompiledPolicy::observes`]).
    pub fn observe(&mut self, outcome: &sdk::Outcome) -> Result<(), PolicyFault> {
        if !self.observes() {
            return Ok(());
        }
        match self.ensure_live() {
            // The outcome of a batch the safe policy formed: nobody to tell.
            Err(PolicyFault::Reviving) => return Ok(()),
            r => r?,
        }
        let o = wit::Outcome {
            model: outcome.model,
            size: outcome.size,
            started: outcome.started,
            finished: outcome.finished,
            missed: outcome.missed,
        };
        let (bindings, store) = (&self.bindings, &mut self.store);
        match outside_runtime(self.binding.compiled.wasi, || bindings.call_observe(store, o)) {
            Ok(()) => {
                self.store.data_mut().drain_output();
                Ok(())
            }
            Err(e) => {
                self.poisoned = true;
                Err(classify(&mut self.store, e, self.binding.limits.call_budget))
            }
        }
    }
}

/// Cuts `s` to at most `max` bytes at a character boundary; whether it was cut.
fn truncate_at_char(s: &mut String, max: usize) -> bool {
    if s.len() <= max {
        return false;
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    s.truncate(cut);
    true
}

/// The contract's package and the version this host implements (`wit/policy.wit`).
pub const CONTRACT: &str = "sluice:policy";
/// See [`CONTRACT`].
pub const CONTRACT_VERSION: &str = "0.1.0";

/// What a policy component may import besides the contract's own interfaces.
const WORLD_IMPORTS: &[&str] = &["log", "shared-get", "shared-put"];

/// What a policy component must export (`status` is optional).
const WORLD_EXPORTS: &[&str] = &["init", "decide", "observe"];

/// A component's top-level imports (functions and instances; type imports are
/// left out) and exports, read without compiling it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ComponentInterface {
    /// Import names, in the binary's order.
    pub imports: Vec<String>,
    /// Export names, in the binary's order.
    pub exports: Vec<String>,
    /// The component declares (in [`HINTS_SECTION`]) that its `observe` does
    /// nothing, so the host need not call it.
    pub observe_unused: bool,
    /// The component imports WASI interfaces (set by [`check_world`] once they are
    /// all ones this host provides: [`wasi::PROVIDED`]).
    pub wasi: bool,
}

/// The custom section in which the SDK records hints about a policy (its core
/// module's, inside the component): byte 0 the format (1), byte 1 whether
/// `observe` is used (0: it does nothing; `Policy::OBSERVES` in the SDK). Outside
/// the WIT, which cannot say it; a component without the section is observed. A
/// hint is only ever a promise about the component's own behaviour: a false one
/// costs that policy its feedback, nothing else.
pub const HINTS_SECTION: &str = "sluice:hints";

/// `component` with a [`HINTS_SECTION`] appended (at its top level, where
/// [`component_interface`] reads it too) saying whether `observe` does anything:
/// for builds whose toolchain cannot write the section itself (`componentize-py`;
/// the Rust SDK writes it from `Policy::OBSERVES`). A custom section may follow
/// any other, so appending keeps the component valid.
pub fn with_hints(component: &[u8], observes: bool) -> Vec<u8> {
    fn leb128(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            out.push(if n == 0 { byte } else { byte | 0x80 });
            if n == 0 {
                return;
            }
        }
    }
    let mut payload = Vec::new();
    leb128(HINTS_SECTION.len(), &mut payload);
    payload.extend_from_slice(HINTS_SECTION.as_bytes());
    payload.extend_from_slice(&[1, u8::from(observes)]);
    let mut out = component.to_vec();
    out.push(0); // custom section id
    leb128(payload.len(), &mut out);
    out.extend_from_slice(&payload);
    out
}

/// Why a component is refused before compiling ([`component_interface`],
/// [`check_world`]): what an upload is answered and `sluice policy check` prints.
#[derive(Debug, Error)]
pub enum ComponentError {
    /// The bytes do not parse as WebAssembly.
    #[error("not a WebAssembly binary: {0}")]
    NotWasm(wasmparser::BinaryReaderError),
    /// A core module, not a component.
    #[error(
        "a core WebAssembly module, not a component: build it with the sluice SDK \
         (`cargo build --target wasm32-unknown-unknown` linked by wasm-component-ld)"
    )]
    CoreModule,
    /// An entry of the import section does not parse.
    #[error("unreadable import: {0}")]
    UnreadableImport(wasmparser::BinaryReaderError),
    /// An entry of the export section does not parse.
    #[error("unreadable export: {0}")]
    UnreadableExport(wasmparser::BinaryReaderError),
    /// It imports the contract at another version than this host's.
    #[error(
        "built against {CONTRACT}@{version} (it imports `{import}`); this host implements \
         {CONTRACT}@{CONTRACT_VERSION}"
    )]
    ContractVersion {
        /// The version it was built against (`(none)` for an unversioned import).
        version: String,
        /// The import that says so.
        import: String,
    },
    /// It imports what this host does not provide.
    #[error(
        "imports {}, which this host does not provide (a policy may import only {} and the WASI 0.2 \
         interfaces of wasmtime-wasi, which grant nothing: {}; a Rust policy is built for \
         wasm32-unknown-unknown and imports no WASI at all)",
        backticked(.0), WORLD_IMPORTS.join(", "), wasi::PROVIDED.join(", ")
    )]
    UnknownImports(
        /// The imports, by name.
        Vec<String>,
    ),
    /// It lacks an export of the policy world.
    #[error(
        "does not export `{missing}` of the policy world {CONTRACT}@{CONTRACT_VERSION} (exports: {})",
        if .exports.is_empty() { "none".to_string() } else { .exports.join(", ") }
    )]
    MissingExport {
        /// The export it lacks.
        missing: &'static str,
        /// What it exports.
        exports: Vec<String>,
    },
}

/// `` `a`, `b` ``: names as [`ComponentError::UnknownImports`] lists them.
fn backticked(names: &[String]) -> String {
    names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
}

/// Reads a component's top-level imports and exports (without compiling it): what
/// [`check_world`] checks, and what `sluice policy check` reports.
pub fn component_interface(bytes: &[u8]) -> Result<ComponentInterface, ComponentError> {
    use wasmparser::{Encoding, Parser, Payload};
    let (mut depth, mut imports, mut exports) = (0usize, Vec::new(), Vec::new());
    let mut observe_unused = false;
    for payload in Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(ComponentError::NotWasm)?;
        match payload {
            Payload::Version { encoding: Encoding::Module, .. } if depth == 0 => {
                return Err(ComponentError::CoreModule);
            }
            Payload::ModuleSection { .. } | Payload::ComponentSection { .. } => depth += 1,
            Payload::CustomSection(c) if c.name() == HINTS_SECTION => {
                if let [1, observe, ..] = c.data() {
                    observe_unused = *observe == 0;
                }
            }
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(r) if depth == 0 => {
                for i in r {
                    let i = i.map_err(ComponentError::UnreadableImport)?;
                    // Type imports (the contract's records, named after them) are
                    // checked structurally by the linker; functions and instances
                    // are what a component needs the host to provide.
                    if !matches!(i.ty, wasmparser::ComponentTypeRef::Type(_)) {
                        imports.push(i.name.name.to_string());
                    }
                }
            }
            Payload::ComponentExportSection(r) if depth == 0 => {
                for e in r {
                    exports.push(e.map_err(ComponentError::UnreadableExport)?.name.name.to_string());
                }
            }
            _ => {}
        }
    }
    Ok(ComponentInterface { imports, exports, observe_unused, wasi: false })
}

/// Checks a component's imports and exports against the `policy` world of this
/// host's contract version (what an upload is refused for, before compiling);
/// returns what it read.
pub fn check_world(bytes: &[u8]) -> Result<ComponentInterface, ComponentError> {
    let mut interface = component_interface(bytes)?;
    let ComponentInterface { imports, exports, .. } = &interface;
    let ours = format!("{CONTRACT}/");
    let mut unknown = Vec::new();
    let mut uses_wasi = false;
    for name in imports {
        if let Some(rest) = name.strip_prefix(&ours) {
            let version = rest.split_once('@').map_or("(none)", |(_, v)| v);
            if version != CONTRACT_VERSION {
                return Err(ComponentError::ContractVersion { version: version.to_string(), import: name.clone() });
            }
        } else if wasi::provides(name) {
            uses_wasi = true;
        } else if !WORLD_IMPORTS.contains(&name.as_str()) {
            unknown.push(name.clone());
        }
    }
    if !unknown.is_empty() {
        return Err(ComponentError::UnknownImports(unknown));
    }
    for want in WORLD_EXPORTS {
        if !exports.iter().any(|e| e == want) {
            return Err(ComponentError::MissingExport { missing: want, exports: exports.clone() });
        }
    }
    interface.wasi = uses_wasi;
    Ok(interface)
}

/// Runs `f` (a call into a WASI-importing instance) where wasmtime-wasi's
/// synchronous bindings can block: they drive their host calls with a tokio
/// `block_on`, which panics on a thread already inside one (the live host's worker
/// threads run their loop in `Handle::block_on`). On a multi-threaded runtime the
/// call leaves the runtime's context with `block_in_place`; on a current-thread
/// one it moves to a scoped thread of its own (a thread start per call); outside
/// a runtime (the simulator, `policy check`) it runs as it is. Rust policies never
/// come here.
fn outside_runtime<R: Send>(wasi: bool, f: impl FnOnce() -> R + Send) -> R {
    if !wasi {
        return f();
    }
    match tokio::runtime::Handle::try_current() {
        Err(_) => f(),
        // On a multi-threaded runtime `block_in_place` leaves the runtime's context
        // for the call (the worker thread is not one of the runtime's own, so
        // nothing is handed over): wasmtime-wasi's `block_on` is then legal, and
        // the call stays on this thread.
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        Ok(_) => std::thread::scope(|s| match s.spawn(f).join() {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        }),
    }
}

/// The line that starts a Python traceback on stderr.
const TRACEBACK: &str = "Traceback (most recent call last):";

/// The exception (`KeyError: 'x'`) and its traceback, read from what an uncaught
/// Python exception wrote to stderr: the last traceback's header, its indented
/// frame lines, and the first unindented line after them, which is the exception.
/// What follows (componentize-py's own panic message) is left out.
fn python_exception(stderr: &str) -> (String, String) {
    let from = stderr.rfind(TRACEBACK).unwrap_or(0);
    let mut lines = stderr[from..].lines();
    let mut traceback: Vec<&str> = lines.next().into_iter().collect();
    let mut message = String::new();
    for line in lines {
        traceback.push(line);
        if !line.starts_with(char::is_whitespace) && !line.is_empty() {
            message = line.trim().to_string();
            break;
        }
    }
    (message, traceback.join("\n"))
}

fn classify(store: &mut Store<HostState>, e: wasmtime::Error, budget: Duration) -> PolicyFault {
    let stderr = store.data_mut().drain_output();
    if store.data().memory_denied {
        return PolicyFault::Memory(store.data().memory_cap);
    }
    match e.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => PolicyFault::Timeout(budget),
        // An uncaught Python exception: componentize-py printed its traceback to
        // stderr, then trapped. The exception is the fault's message (the traceback's
        // last line), the traceback its detail; the Wasm backtrace of the
        // interpreter would say nothing to the policy's author.
        _ if stderr.as_deref().is_some_and(|t| t.contains(TRACEBACK)) => {
            let (message, mut traceback) = python_exception(stderr.as_deref().unwrap_or_default());
            truncate_at_char(&mut traceback, MAX_TRACEBACK);
            PolicyFault::Trap(format!("Python exception {message}\n{traceback}"))
        }
        // A panic's own message says why; the trap (and its Wasm backtrace) where.
        _ => match store.data_mut().panic.take() {
            Some(why) => PolicyFault::Trap(format!("{why} ({e:#})")),
            None => PolicyFault::Trap(format!("{e:#}")),
        },
    }
}

fn to_wit_model(m: &sdk::Model) -> wit::Model {
    wit::Model { id: m.id, name: m.name.clone(), accuracy: m.accuracy, latency: m.latency.clone() }
}

fn to_wit_config(c: &sdk::Config, models: &[sdk::Model], slo: u64, worker: u32) -> wit::Config {
    wit::Config {
        app: c.app.clone(),
        slo,
        workers: c.workers,
        worker,
        models: models.iter().map(to_wit_model).collect(),
        params: c.params.clone(),
    }
}

/// The largest view queue an instance keeps allocated between calls (24 bytes each).
const KEPT_VIEW_CAPACITY: usize = 4096;

/// Writes `v` into `out`, reusing its vectors.
fn to_wit_view(v: &sdk::View, out: &mut wit::View) {
    out.now = v.now;
    out.worker = v.worker;
    out.workers = v.workers;
    out.load_qps = v.load_qps;
    out.loaded.clear();
    out.loaded.extend_from_slice(&v.loaded);
    out.queue.clear();
    out.queue.extend(v.queue.iter().map(|p| wit::Pending { id: p.id, arrival: p.arrival, deadline: p.deadline }));
}

fn from_wit_decision(d: wit::Decision) -> sdk::Decision {
    match d {
        wit::Decision::Dispatch(d) => {
            sdk::Decision::Dispatch(sdk::Dispatch { model: d.model, take: d.take, drop: d.drop })
        }
        wit::Decision::WaitUntil(t) => sdk::Decision::WaitUntil(t),
        wit::Decision::Idle => sdk::Decision::Idle,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_store_is_write_once_within_its_budget() {
        let store = SharedStore::new(2 * SHARED_ENTRY_OVERHEAD + 16);
        assert!(store.get("a").is_none());
        assert!(store.put("a".into(), vec![1, 2]));
        assert!(!store.put("a".into(), vec![3]), "first value wins");
        assert_eq!(store.get("a").as_deref(), Some(&[1u8, 2][..]));
        assert_eq!(store.bytes(), SHARED_ENTRY_OVERHEAD + 3);
        assert!(!store.put("b".into(), vec![0; 13]), "over the budget");
        assert!(store.put("b".into(), vec![0; 12]));
        assert!(!store.put("x".repeat(MAX_SHARED_KEY + 1), vec![]));
        assert_eq!(store.bytes(), 2 * SHARED_ENTRY_OVERHEAD + 16);
        // Empty values still cost their entry: no third one fits.
        assert!(!store.put("c".into(), vec![]));
    }

    /// Each refusal before compiling names what it refuses: the import, the version,
    /// the missing export.
    #[test]
    fn component_errors_name_the_bad_input() {
        let e = check_world(b"\0asm\x01\0\0\0").unwrap_err();
        assert!(matches!(e, ComponentError::CoreModule), "{e}");
        let e = check_world(b"not wasm").unwrap_err();
        assert!(e.to_string().starts_with("not a WebAssembly binary: "), "{e}");
        let old = wat::parse_str(r#"(component (import "sluice:policy/host@0.0.1" (instance)))"#).unwrap();
        let e = check_world(&old).unwrap_err().to_string();
        assert!(e.contains("built against sluice:policy@0.0.1 (it imports `sluice:policy/host@0.0.1`)"), "{e}");
        let alien = wat::parse_str(r#"(component (import "my-own-thing" (func)))"#).unwrap();
        let e = check_world(&alien).unwrap_err();
        assert!(e.to_string().starts_with("imports `my-own-thing`, which this host does not provide"), "{e}");
        let empty = wat::parse_str("(component)").unwrap();
        let e = check_world(&empty).unwrap_err().to_string();
        assert!(e.starts_with("does not export `init` of the policy world"), "{e}");
        assert!(e.ends_with("(exports: none)"), "{e}");
    }
}
