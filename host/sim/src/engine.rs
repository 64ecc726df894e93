//! The event loop: arrivals, batch completions and policy timers in virtual time
//! (a [`VirtualClock`]), over the host's [`Router`], worker state machine
//! ([`worker::Machine`], around the decision core) and policy runtime (the same
//! `.wasm` instances), all from `sluice_core`. The loop owns the clock, the
//! latency sampler and the stats; the machine says what each worker does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use sluice_sdk as sdk;

use super::arrivals::{draw, recorded, Arrival};
use super::events::{key, Events, Pending, EMPTY};
use super::rng::Rng;
use super::stats::{Fate, RunResult, Stats, WindowRow};
use super::{Accounting, Experiment, LatencyModel, PolicyCache, RunSpec};
use sluice_alloc::config::{AllocatorConfig, DevicePool};
use sluice_alloc::planner::Planner;
use sluice_alloc::proteus;
use sluice_alloc::SolverSettings;
use sluice_core::admission::{Admission, Place, Verdict, WorkerAdmission};
use sluice_core::app_config::AppConfig as SimApp;
use sluice_core::clock::{Clock as _, VirtualClock};
use sluice_core::decision::WorkerPolicy;
use sluice_core::decision::{Context, Queued};
use sluice_core::demand::DemandMonitor;
use sluice_core::outcome::{Outcome, Refusal};
use sluice_core::profile::{Percentile, Profile};
use sluice_core::queue::{deadline_position, DropReason, Prediction};
use sluice_core::router::{LoadWindow, Router, RouterMode};
use sluice_core::runtime::{Binding, PolicyInstance};
use sluice_core::whatif::ReplayControl;
use sluice_core::worker::{self, Action, Finished, Report};
use sluice_core::workload::ArrivalSpec;

/// A simulated request.
#[derive(Clone, Copy, Debug)]
struct SimRequest {
    id: u64,
    arrival: u64,
    deadline: u64,
}

impl Queued for SimRequest {
    fn pending(&self) -> sdk::Pending {
        sdk::Pending { id: self.id, arrival: self.arrival, deadline: self.deadline }
    }
}

/// Batch latency: the app's percentile, or a draw from the measured distribution.
///
/// Sampling inverts a piecewise-linear CDF through the profile's quantiles at the
/// batch size: (0.5, p50), (0.95, p95), (0.99, p99), closed by (0, lo) and (1, hi)
/// with lo = max(p50 − (p95 − p50), p50 / 2) and hi = p99 + (p99 − p95). Profiles
/// keep three percentiles, not the raw runs, so the ends are an assumption.
pub struct LatencySampler {
    model: LatencyModel,
    /// Per model: dense p50, p95, p99 tables.
    tables: Vec<[Vec<u64>; 3]>,
    /// Per model: the table policies see (the app's percentile).
    policy_tables: Vec<Vec<u64>>,
}

impl LatencySampler {
    fn latency(&self, model: usize, size: usize, rng: &mut Rng) -> u64 {
        let at = |t: &Vec<u64>| t[(size.max(1) - 1).min(t.len().saturating_sub(1))] as f64;
        match self.model {
            LatencyModel::Deterministic => at(&self.policy_tables[model]) as u64,
            LatencyModel::Sampled => {
                let [p50, p95, p99] =
                    [at(&self.tables[model][0]), at(&self.tables[model][1]), at(&self.tables[model][2])];
                let lo = (p50 - (p95 - p50)).max(p50 / 2.0);
                let hi = p99 + (p99 - p95);
                let points = [(0.0, lo), (0.5, p50), (0.95, p95), (0.99, p99), (1.0, hi)];
                let u = rng.uniform();
                let i = points.windows(2).position(|w| u < w[1].0).unwrap_or(3);
                let ((q0, v0), (q1, v1)) = (points[i], points[i + 1]);
                (v0 + (v1 - v0) * (u - q0) / (q1 - q0)).max(0.0) as u64
            }
        }
    }
}

/// One simulated worker of an app: its policy, loaded models, the size of the batch it
/// runs (0: idle) and its one event.
struct SimWorker {
    policy: WorkerPolicy,
    loaded: Vec<u32>,
    busy: usize,
    /// What the worker's one event slot ([`Events`]) holds: the batch it runs, or
    /// the timer its last decision armed.
    pending: Pending<SimRequest>,
}

struct AppState {
    spec: SimApp,
    arrival_spec: ArrivalSpec,
    models: Vec<sdk::Model>,
    /// Per worker on `[[device]]`s: the variants with the device's latency.
    device_models: Option<Vec<Vec<sdk::Model>>>,
    /// One sampler, or one per worker on `[[device]]`s.
    latency: Vec<LatencySampler>,
    /// Arrivals per second, for the allocator's forecasts.
    demand: DemandMonitor,
    arrivals: Vec<Arrival>,
    next_arrival: usize,
    /// Arrivals the live host refused at admission (a recorded log's marked lines,
    /// µs): not queued, but counted in the load estimate as the host counted them;
    /// `next_refused` is the first not yet counted.
    refused: Vec<u64>,
    next_refused: usize,
    queues: Vec<Vec<SimRequest>>,
    workers: Vec<SimWorker>,
    load: LoadWindow,
    router: Router,
    slo_us: u64,
    expire_us: u64,
    stats: Stats,
    /// Per request, how it ended (None: not yet), when kept
    /// ([`Simulation::record_outcomes`]).
    outcomes: Option<Vec<Option<Outcome>>>,
    overloaded: Option<String>,
    /// The host's admission, when the experiment turns it on
    /// ([`Experiment::admission`]), and what it predicted for each admitted
    /// request (by id), which its answer teaches it.
    admission: Option<(Admission, Vec<Prediction>)>,
}

impl AppState {
    /// Admission, as the live host's (`sluice_server::app::App::submit`), for
    /// `request` arriving at `now`, which the router sent to worker `picked`: the
    /// worker whose queue it joins and its index there (deadline order, as live: a
    /// trace's own budgets make a later arrival due earlier), or the reason it is
    /// refused. Judged at `picked`, then at each worker the router falls back to
    /// ([`Router::offer`], as live), the first that can serve it by its deadline
    /// taking it; at `picked` always without admission. A refusal
    /// `admission_audit` samples joins the worker judged to serve it soonest. An
    /// admitted request keeps its prediction for its answer.
    fn admit(&mut self, picked: usize, request: &SimRequest, now: u64) -> Result<(usize, usize), Refusal> {
        let (queues, workers) = (&self.queues, &self.workers);
        let Some((admission, predicted)) = self.admission.as_mut() else {
            return Ok((picked, deadline_position(&queues[picked], request.deadline)));
        };
        let offered = self.router.offer(
            picked,
            |w| queues[w].len() + workers[w].busy,
            (),
            |w, ()| {
                let place = Place {
                    worker: w,
                    models: self.device_models.as_ref().map_or(&self.models[..], |d| &d[w][..]),
                    shared: self.spec.router == RouterMode::Shared,
                    in_flight: |i: usize| workers[i].busy,
                    // The load estimate with this arrival counted, as the host's.
                    load: &self.load,
                    now,
                };
                let at = deadline_position(&queues[w], request.deadline);
                let v =
                    admission.verdict(&place, at, (request.deadline, now), queues[w][at..].iter().map(|r| r.deadline));
                if v.admitted {
                    Ok((at, v))
                } else {
                    Err(((), (at, v)))
                }
            },
            |(_, v): &(usize, Verdict)| v.judged.wait_us,
        );
        let (w, (at, v)) = match offered {
            Ok(taken) => taken,
            // A refusal `admission_audit` samples is admitted anyway, as live, and
            // counted: whether it makes its deadline says whether the refusal
            // would have been false.
            Err(((), w, refused)) if admission.audits() => {
                self.stats.audited(request.id);
                (w, refused)
            }
            Err(_) => return Err(Refusal::Overload),
        };
        predicted[request.id as usize] = v.prediction(now);
        Ok((w, at))
    }

    /// Whether the app's bounded queue (`max_queue`, over all its workers) is
    /// full, with admission on: an arrival is then refused, as live.
    fn queue_full(&self) -> bool {
        self.admission.is_some() && self.queues.iter().map(Vec::len).sum::<usize>() >= self.spec.max_queue
    }

    /// Counts the refused arrivals up to `now` in the load estimate, before it is
    /// read or another arrival is counted (so the monitor sees times in order).
    fn count_refused(&mut self, now: u64) {
        while let Some(&t) = self.refused.get(self.next_refused).filter(|&&t| t <= now) {
            self.load.record(t);
            self.next_refused += 1;
        }
    }
}

/// What a caller gives a run instead of drawing it from the experiment (what-if
/// replays: the live host's recorded arrivals, its workers' models, the params of
/// the policy under test). Per app, in the run's app order; `None` keeps the
/// experiment's.
#[derive(Clone, Debug, Default)]
pub struct RunInputs {
    /// Arrivals, replacing the app's arrival process.
    pub arrivals: Vec<Option<Vec<Arrival>>>,
    /// Per worker, the model ids it has loaded (default: every model).
    pub loaded: Vec<Option<Vec<Vec<u32>>>>,
    /// The policy's params as a JSON object, replacing `params`/`params_file`.
    pub params: Vec<Option<String>>,
    /// Simulate only the workers `w` with `w % count == index` (`Some((index, count))`)
    /// of every app; see [`Simulation::shardable`]. Shards together give the same
    /// results as the whole run ([`Simulation::absorb`]).
    pub shard: Option<(usize, usize)>,
    /// Set when the run is cancelled ([`sluice_core::whatif::ReplayControl::abort_flag`]):
    /// a policy call in progress then stops at the next epoch tick.
    pub abort: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

/// What an event is for: an app's next arrival (kept beside [`Events`]), or what
/// one of its slots stands for.
#[derive(Clone, Copy)]
enum EventKind {
    /// The app's next arrival.
    Arrival { app: usize },
    /// The allocator looks at the demand (every second of virtual time).
    AllocTick,
    /// The worker's [`Pending`] event.
    Worker { app: usize, worker: usize },
}

/// One run: its apps and the event queue.
pub struct Simulation {
    /// The allocator, for runs on `[[device]]`s.
    alloc: Option<AllocState>,
    apps: Vec<AppState>,
    rng: Rng,
    events: Events,
    /// What each slot of `events` stands for: the allocator's tick, then every
    /// app's workers in order.
    slots: Vec<EventKind>,
    /// Per app, its next arrival's key ([`key`]; `EMPTY`: none), kept beside
    /// `events`: one arrival at a time is due per app, and an arrival is most of
    /// the events, so comparing it with the queue's earliest saves a path replay.
    next_arrivals: Vec<u128>,
    /// Per app, the slot of its worker 0.
    first_worker_slot: Vec<usize>,
    /// Virtual time: the time of the event being processed.
    clock: VirtualClock,
    seq: u64,
    duration_us: u64,
    window_us: u64,
    max_queue: usize,
    weakly_hard: Option<[usize; 2]>,
    accounting: Accounting,
    finish_queues: bool,
    run: usize,
    policy_label: String,
    seed: u64,
    /// Whether a component's `decide` is timed (the results' decide seconds; the native
    /// policy's never is); see [`Simulation::untimed`].
    timed: bool,
    /// The workers' decision state: the view every decision is built in (one
    /// allocation per run, not per decision).
    machine: worker::Machine,
    /// Which workers this simulation runs ([`RunInputs::shard`]); all when `None`.
    shard: Option<(usize, usize)>,
}

impl Simulation {
    /// Prepares a run: arrivals drawn, policy instances created and initialised.
    pub fn new(
        exp: &Experiment,
        base: &Path,
        run: &RunSpec,
        profiles: &BTreeMap<PathBuf, Profile>,
        cache: &mut PolicyCache,
    ) -> Result<Simulation> {
        Simulation::with_inputs(exp, base, run, profiles, cache, RunInputs::default())
    }

    /// As [`Simulation::new`], with the arrivals, loaded models or params of some apps
    /// given rather than drawn from the experiment.
    pub fn with_inputs(
        exp: &Experiment,
        base: &Path,
        run: &RunSpec,
        profiles: &BTreeMap<PathBuf, Profile>,
        cache: &mut PolicyCache,
        mut inputs: RunInputs,
    ) -> Result<Simulation> {
        let duration_us = (exp.duration_s * 1e6) as u64;
        if let Some((index, count)) = inputs.shard {
            if index >= count {
                anyhow::bail!("shard {index} of {count}: no such shard");
            }
            if !Simulation::shardable(exp, run) {
                anyhow::bail!(
                    "this run cannot be split by worker: it needs deterministic latencies, no devices, \
                     and routers that do not look at the queues (round-robin, weighted)"
                );
            }
        }
        let mut rng = Rng::new(run.seed);
        let mut apps = Vec::new();
        let pool = DevicePool::load(&exp.devices).map_err(|e| anyhow::anyhow!(e))?;
        for (index, spec) in run.apps.iter().enumerate() {
            let profile = &profiles[&base.join(&spec.profile)];
            let selected = profile
                .policy_models(spec.models.as_deref(), spec.latency_percentile, spec.max_batch)
                .map_err(|e| anyhow::anyhow!("app {}: models: {e}", spec.name))?;
            let cap = |mut t: Vec<u64>| {
                if let Some(c) = spec.max_batch {
                    t.truncate(c as usize);
                }
                t
            };
            let tables: Vec<[Vec<u64>; 3]> = selected
                .iter()
                .map(|(_, m)| [Percentile::P50, Percentile::P95, Percentile::P99].map(|p| cap(m.latency_table(p))))
                .collect();
            let models: Vec<sdk::Model> = selected.into_iter().map(|(m, _)| m).collect();
            let device_models = pool.as_ref().map(|p| p.models_per_worker(spec, &models));
            let latency = match (&pool, &device_models) {
                // On devices, each worker runs its device type's latencies.
                (Some(p), Some(dm)) => (0..p.len())
                    .map(|w| LatencySampler {
                        model: exp.latency,
                        tables: models
                            .iter()
                            .enumerate()
                            .map(|(i, m)| match p.profile_of(w).model(&m.name) {
                                Some(mp) => [Percentile::P50, Percentile::P95, Percentile::P99]
                                    .map(|q| cap(mp.latency_table(q))),
                                None => tables_of(&tables, i),
                            })
                            .collect(),
                        policy_tables: dm[w].iter().map(|m| m.latency.clone()).collect(),
                    })
                    .collect(),
                _ => vec![LatencySampler {
                    model: exp.latency,
                    tables,
                    policy_tables: models.iter().map(|m| m.latency.clone()).collect(),
                }],
            };
            let arrival_spec =
                spec.arrivals.clone().with_context(|| format!("app {}: arrivals: required", spec.name))?;
            // Taken, not copied: a replay's million arrivals are its largest input.
            let (arrivals, refused) = match inputs.arrivals.get_mut(index).and_then(Option::take) {
                Some(a) => (a, Vec::new()),
                None => {
                    let a = draw(&arrival_spec, &spec.name, base, duration_us, &mut rng)
                        .with_context(|| format!("app {}", spec.name))?;
                    let refused = match &arrival_spec {
                        ArrivalSpec::Recorded { file } => recorded(&base.join(file), &spec.name, duration_us)?.1,
                        _ => Vec::new(),
                    };
                    if exp.admission && !refused.is_empty() {
                        // Every arrival the host judged is judged again here, those
                        // it refused included.
                        let mut all = a;
                        all.extend(refused.into_iter().map(|at| Arrival { at, budget: None }));
                        all.sort_by_key(|x| x.at);
                        (all, Vec::new())
                    } else {
                        (a, refused)
                    }
                }
            };
            // `safe` is the host's built-in fallback, run natively (no component).
            let compiled = match spec.policy.as_str() {
                sluice_core::decision::SAFE_POLICY => None,
                name => Some(cache.get(name).with_context(|| format!("app {}", spec.name))?),
            };
            let slo_us = spec.slo_us();
            let params = match inputs.params.get(index).and_then(Option::as_ref) {
                Some(p) => p.clone(),
                None => spec.params_json(base).with_context(|| format!("app {}", spec.name))?,
            };
            let inputs_loaded = inputs.loaded.get(index).and_then(Option::as_ref);
            // The app's live budgets, on the thread's CPU clock: a policy that overruns
            // live overruns here, and a busy machine (a descheduled thread) cannot turn
            // into a fault that changes the results (`Limits::simulated`).
            let limits = spec.limits().simulated();
            let all: Vec<u32> = (0..models.len() as u32).collect();
            let mut workers = Vec::new();
            // One binding per app and run: its instances share one config and store.
            let binding = compiled.as_ref().map(|c| {
                let config = spec.policy_config(&models, &params);
                Binding::abortable(
                    c.clone(),
                    config,
                    limits,
                    device_models.clone().map(std::sync::Arc::new),
                    inputs.abort.clone(),
                )
            });
            for w in 0..spec.workers {
                let policy = match &binding {
                    // Another shard's worker is never asked: no instance for it.
                    Some(_) if !owns(inputs.shard, w as usize) => WorkerPolicy::Safe,
                    Some(b) => WorkerPolicy::Wasm(Box::new(
                        PolicyInstance::new(cache.engine(), b, w)
                            .with_context(|| format!("app {}: worker {w}", spec.name))?,
                    )),
                    None => WorkerPolicy::Safe,
                };
                // On devices a worker loads what the allocator's plan puts on it.
                let loaded = match inputs_loaded.and_then(|l| l.get(w as usize)) {
                    Some(ids) => ids.iter().copied().filter(|&id| (id as usize) < models.len()).collect(),
                    None if pool.is_some() => Vec::new(),
                    None => all.clone(),
                };
                workers.push(SimWorker { policy, loaded, busy: 0, pending: Pending::None });
            }
            let queues = if spec.router == RouterMode::Shared { 1 } else { spec.workers as usize };
            // As live: each worker predicted with its fastest loaded model until its
            // first batch (`sluice_server::app::App::new`).
            let admission = exp.admission.then(|| {
                let parts = workers.iter().map(|w| WorkerAdmission::new(&models, &w.loaded)).collect();
                (Admission::new(slo_us, spec.admission_audit, parts), vec![Prediction::default(); arrivals.len()])
            });
            apps.push(AppState {
                stats: {
                    let stats = Stats::new(arrivals.iter().map(|a| a.at).collect())
                        .with_models(models.iter().map(|m| m.name.clone()).collect(), queues);
                    if exp.admission && spec.admission_audit > 0.0 {
                        stats.admitting().auditing()
                    } else if exp.admission {
                        stats.admitting()
                    } else {
                        stats
                    }
                },
                // An experiment's default is one SLO (the papers' simulators count
                // late answers); the conversion is the host's (`AppConfig::expire_us_or`).
                expire_us: spec.expire_us_or(slo_us),
                load: LoadWindow::new(spec.load_window_ms * 1000),
                router: Router::new(spec.router, spec.workers as usize, spec.weights.as_deref())
                    .with_context(|| format!("app {}: weights", spec.name))?,
                spec: spec.clone(),
                arrival_spec,
                models,
                device_models,
                latency,
                demand: DemandMonitor::new(3600),
                arrivals,
                next_arrival: 0,
                refused,
                next_refused: 0,
                queues: (0..queues).map(|_| Vec::new()).collect(),
                workers,
                slo_us,
                outcomes: None,
                overloaded: None,
                admission,
            });
        }
        let alloc = match pool {
            Some(pool) => Some(AllocState::start(pool, &run.allocator, &apps)?),
            None => None,
        };
        let mut slots: Vec<EventKind> = vec![EventKind::AllocTick];
        let mut first_worker_slot = Vec::new();
        for (app, a) in apps.iter().enumerate() {
            first_worker_slot.push(slots.len());
            slots.extend((0..a.workers.len()).map(|worker| EventKind::Worker { app, worker }));
        }
        let mut sim = Simulation {
            alloc,
            apps,
            rng,
            events: Events::new(slots.len()),
            slots,
            next_arrivals: vec![EMPTY; first_worker_slot.len()],
            first_worker_slot,
            clock: VirtualClock::default(),
            seq: 0,
            duration_us,
            window_us: (exp.window_s * 1e6).max(1.0) as u64,
            max_queue: exp.max_queue,
            weakly_hard: exp.weakly_hard,
            accounting: exp.accounting,
            finish_queues: exp.finish_queues,
            run: run.index,
            policy_label: run.policy_label.clone(),
            seed: run.seed,
            timed: true,
            machine: worker::Machine::new(),
            shard: inputs.shard,
        };
        if let Some(alloc) = sim.alloc.take() {
            let plan = alloc.plan().cloned();
            if let Some(plan) = plan {
                sim.apply(&plan);
            }
            sim.alloc = Some(alloc);
            sim.schedule_tick(TICK_US);
        }
        for a in 0..sim.apps.len() {
            if let Some(first) = sim.apps[a].arrivals.first() {
                let at = first.at;
                sim.schedule_arrival(a, at);
            }
        }
        Ok(sim)
    }

    /// Puts an event at `at` in `slot`, replacing what it held.
    fn schedule_slot(&mut self, slot: usize, at: u64) {
        // Ties break by insertion order, which keeps runs deterministic.
        self.seq += 1;
        self.events.set(slot, key(at, self.seq));
    }

    fn schedule_arrival(&mut self, app: usize, at: u64) {
        self.seq += 1;
        self.next_arrivals[app] = key(at, self.seq);
    }

    fn schedule_tick(&mut self, at: u64) {
        self.schedule_slot(0, at);
    }

    /// Sets worker `w` of app `a`'s event: `pending` at `at`, or none.
    fn schedule_worker(&mut self, a: usize, w: usize, at: u64, pending: Pending<SimRequest>) {
        let slot = self.first_worker_slot[a] + w;
        match pending {
            Pending::None => self.events.set(slot, EMPTY),
            _ => self.schedule_slot(slot, at),
        }
        self.apps[a].workers[w].pending = pending;
    }

    /// The next event: the earliest by (time, sequence number) of the queue's and
    /// the apps' next arrivals, taken out of the queue.
    fn next_event(&mut self) -> Option<(u64, EventKind)> {
        let (first, slot) = self.events.peek();
        let (arrival, app) = self.next_arrivals.iter().enumerate().map(|(a, &k)| (k, a)).min().unwrap_or((EMPTY, 0));
        if arrival < first {
            self.next_arrivals[app] = EMPTY;
            return Some(((arrival >> 64) as u64, EventKind::Arrival { app }));
        }
        if first == EMPTY {
            return None;
        }
        self.events.pop(slot);
        Some(((first >> 64) as u64, self.slots[slot]))
    }

    /// Runs to completion: every arrival, then every queued request is served,
    /// dropped or expired (no new arrivals after the duration). Returns, per app, its
    /// result, time series, and the wall seconds spent inside `decide`.
    pub fn run(mut self) -> Vec<(RunResult, Vec<WindowRow>, f64)> {
        self.run_events(None);
        self.results()
    }

    /// Whether `run` can be split into shards of workers ([`RunInputs::shard`]) that
    /// together give exactly the whole run's results: its workers never share state
    /// the simulation models. That holds when latencies are deterministic (no random
    /// draws whose order the shards would change), no allocator moves models (no
    /// `[[device]]`s), and every app's router picks a worker without looking at the
    /// queues (round-robin, weighted): each worker then sees the same arrivals, the
    /// same load estimate (every shard still records every arrival) and the same
    /// order of its own events as in the whole run. Policy instances share only the
    /// binding's store, whose values depend on their keys alone (the contract).
    /// Admission ([`Experiment::admission`]) rules it out, as its margins are the
    /// app's, learned from every worker's answers, unless it refuses nothing
    /// (`admission_audit = 1` admits every refusal as an audit; its bounded queue,
    /// `max_queue`, is then counted over the shard's workers, so a replay whose
    /// queues reach it may refuse fewer split than whole).
    pub fn shardable(exp: &Experiment, run: &RunSpec) -> bool {
        exp.latency == LatencyModel::Deterministic
            && exp.devices.is_empty()
            && (!exp.admission || run.apps.iter().all(|a| a.admission_audit >= 1.0))
            && run.apps.iter().all(|a| matches!(a.router, RouterMode::RoundRobin | RouterMode::Weighted))
    }

    /// Folds the results of another shard of the same run into this one's: per
    /// request, the shard whose worker took it says how it ended.
    pub fn absorb(&mut self, other: &Simulation) {
        for (mine, theirs) in self.apps.iter_mut().zip(&other.apps) {
            mine.stats.absorb(&theirs.stats);
            if mine.overloaded.is_none() {
                mine.overloaded.clone_from(&theirs.overloaded);
            }
        }
    }

    /// Whether a policy instance used its binding's shared store after `init`: a
    /// shard's results are then not guaranteed to be the whole run's (see
    /// [`sluice_core::runtime::SharedStore::used_after_init`]).
    pub fn shared_store_used_after_init(&self) -> bool {
        self.apps.iter().flat_map(|a| &a.workers).any(|w| match &w.policy {
            WorkerPolicy::Wasm(instance) => instance.binding().shared.used_after_init(),
            WorkerPolicy::Safe => false,
        })
    }

    /// Stops timing the policy's `decide` calls (the results' decide seconds are then
    /// zero; the calls are still counted): a what-if replay does not report them, and
    /// at millions of decisions the clock reads are a measurable share of the run.
    pub fn untimed(&mut self) {
        self.timed = false;
    }

    /// Processes events until none is left, the run overloads, or `control` is
    /// cancelled (looked at before every event); reports the share of arrivals
    /// processed into it every [`POLL_EVENTS`] events. False when cancelled.
    pub fn run_events(&mut self, control: Option<&ReplayControl>) -> bool {
        let total: u64 = self.apps.iter().map(|a| a.arrivals.len() as u64).sum();
        let mut polled = 0u32;
        while let Some((now, event)) = self.next_event() {
            if !self.finish_queues && now >= self.duration_us {
                break;
            }
            if let Some(c) = control {
                // Every event: one event costs at most a policy call's budget, so a
                // cancel is seen within that much time whatever the policy does.
                if c.cancelled() {
                    return false;
                }
                polled += 1;
                if polled == POLL_EVENTS {
                    polled = 0;
                    c.report(self.apps.iter().map(|a| a.next_arrival as u64).sum(), total);
                }
            }
            // Every handler reads the time from the clock, as the live worker does.
            self.clock.set(now);
            match event {
                EventKind::Arrival { app } => self.arrive(app),
                EventKind::AllocTick => {
                    self.alloc_tick(now);
                    if now + TICK_US < self.duration_us {
                        self.schedule_tick(now + TICK_US);
                    }
                }
                EventKind::Worker { app, worker } => {
                    match std::mem::replace(&mut self.apps[app].workers[worker].pending, Pending::None) {
                        Pending::Done { model, batch, started } => {
                            self.finish(app, worker, model, batch, started);
                            self.decide(app, worker);
                        }
                        Pending::Timer => {
                            // Every turn sets the worker's slot again, so this is
                            // its last decision's timer, on an idle worker.
                            debug_assert_eq!(self.apps[app].workers[worker].busy, 0);
                            self.decide(app, worker);
                        }
                        Pending::None => {}
                    }
                }
            }
            if self.apps.iter().any(|a| a.overloaded.is_some()) {
                break;
            }
        }
        if let Some(c) = control {
            c.report(total, total);
        }
        true
    }

    /// Keeps how each request ends ([`Simulation::outcomes`]), to compare a run with
    /// the live host's answers request by request (the differential test); off by
    /// default, as a million-request run has no use for it.
    pub fn record_outcomes(&mut self) {
        for app in &mut self.apps {
            app.outcomes = Some(vec![None; app.arrivals.len()]);
        }
    }

    /// App `a`'s outcome per request, in arrival order (None: unfinished), when kept.
    pub fn outcomes(&self, a: usize) -> Option<&[Option<Outcome>]> {
        self.apps[a].outcomes.as_deref()
    }

    /// App `a`'s statistics so far.
    pub fn stats(&self, a: usize) -> &Stats {
        &self.apps[a].stats
    }

    /// Per app: its result, time series, and the wall seconds spent inside `decide`.
    pub fn results(&self) -> Vec<(RunResult, Vec<WindowRow>, f64)> {
        let duration_us = self.duration_us;
        let window_us = self.window_us;
        let weakly_hard = self.weakly_hard;
        let accounting = self.accounting;
        self.apps
            .iter()
            .map(|a| {
                let trace = a.arrival_spec.file().map(|f| f.display().to_string());
                let load = a.arrival_spec.rate_qps();
                let (r, ts) = a.stats.result(
                    self.run,
                    &a.spec.name,
                    &self.policy_label,
                    a.spec.workers,
                    load,
                    trace,
                    self.seed,
                    duration_us,
                    window_us,
                    weakly_hard,
                    a.overloaded.clone(),
                    accounting,
                );
                let mut r = r;
                r.replans = self.alloc.as_ref().map(|al| al.replans);
                let best = a.models.iter().map(|m| m.accuracy).fold(0.0, f64::max);
                r.accuracy_loss = r.served_accuracy.map(|s| best - s);
                (r, ts, a.stats.decide_seconds)
            })
            .collect()
    }

    fn arrive(&mut self, a: usize) {
        let now = self.clock.now();
        let app = &mut self.apps[a];
        let i = app.next_arrival;
        let arrival = app.arrivals[i];
        app.next_arrival += 1;
        let next = app.arrivals.get(i + 1).map(|x| x.at);
        if app.queue_full() {
            // Refused before the host counts it anywhere, as live (its bounded
            // queue is checked first).
            app.stats.finish(i as u64, Fate::Refused, 0.0);
            note(&mut app.outcomes, i as u64, || Outcome::Refused(Refusal::QueueFull));
            if let Some(next) = next {
                self.schedule_arrival(a, next);
            }
            return;
        }
        app.count_refused(now);
        app.load.record(now);
        if self.alloc.is_some() {
            app.demand.record(now);
        }
        let request = SimRequest { id: i as u64, arrival: now, deadline: now + arrival.budget.unwrap_or(app.slo_us) };
        let k = app.workers.len();
        let target = app.router.pick(|w| app.queues[w].len() + app.workers[w].busy);
        if !owns(self.shard, target) {
            // Another shard serves it; this one only counted it for the load estimate.
            if let Some(next) = next {
                self.schedule_arrival(a, next);
            }
            return;
        }
        let app = &mut self.apps[a];
        let shared = app.spec.router == RouterMode::Shared;
        // In deadline order, as live: a trace's own budgets make a later arrival due
        // earlier, and the decision core expires a prefix of the queue.
        let (target, at) = match app.admit(target, &request, now) {
            Ok(placed) => placed,
            Err(refusal) => {
                app.stats.finish(request.id, Fate::Refused, 0.0);
                note(&mut app.outcomes, request.id, || Outcome::Refused(refusal));
                if let Some(next) = next {
                    self.schedule_arrival(a, next);
                }
                return;
            }
        };
        app.stats.queued(request.id, target);
        app.queues[target].insert(at, request);
        if app.queues[target].len() > self.max_queue {
            app.overloaded = Some(format!(
                "at {:.3} s a worker queue exceeded max_queue = {} (the load exceeds what the workers sustain)",
                now as f64 / 1e6,
                self.max_queue
            ));
            return;
        }
        if let Some(next) = next {
            self.schedule_arrival(a, next);
        }
        if shared {
            // Idle workers pull from the one queue, lowest index first.
            for w in 0..k {
                if self.apps[a].workers[w].busy == 0 && !self.apps[a].queues[0].is_empty() {
                    self.decide(a, w);
                }
            }
        } else if self.apps[a].workers[target].busy == 0 {
            self.decide(a, target);
        }
    }

    /// A turn of worker `w` of app `a` ([`worker::Machine::decide`]): what leaves its
    /// queue is finished in the stats, and its next event is set (a batch's
    /// completion, a timer, or none).
    fn decide(&mut self, a: usize, w: usize) {
        let now = self.clock.now();
        let app = &mut self.apps[a];
        let q = if app.spec.router == RouterMode::Shared { 0 } else { w };
        if app.queues[q].is_empty() {
            // What the machine answers on an empty queue (`Action::Idle` with no
            // expiry: nothing expires, the policy is not asked, its stall count does
            // not move), without building a context: half of a lightly loaded run's
            // decisions come after a batch that emptied the queue. The load estimate
            // is brought up to date at the next one that reads it, with the same
            // result.
            self.schedule_worker(a, w, 0, Pending::None);
            return;
        }
        app.count_refused(now);
        let load_qps = app.load.rate(now);
        let worker = &mut app.workers[w];
        // The native policy's decisions are not timed: two clock reads cost more
        // than its decision (a tenth of a native run), and its decide seconds
        // are a wall-clock figure, not part of the results.
        let timed = self.timed && matches!(worker.policy, WorkerPolicy::Wasm(_));
        let cx = Context {
            now,
            worker: w as u32,
            workers: app.spec.workers,
            load_qps,
            loaded: &worker.loaded,
            models: app.device_models.as_ref().map_or(&app.models[..], |d| &d[w][..]),
            expire_us: app.expire_us,
            draining: false,
            timed,
        };
        let mut tally = Tally { stats: &mut app.stats, outcomes: &mut app.outcomes, now };
        let turn = self.machine.decide(&mut app.queues[q], &mut worker.policy, &cx, None, &mut tally);
        match turn.action {
            Action::Run { model, batch } => {
                if let Some((admission, _)) = &app.admission {
                    admission.worker(w).start_batch(model, batch.len(), turn.left, now, load_qps);
                }
                worker.busy = batch.len();
                for r in &batch {
                    app.stats.taken(r.id, now);
                }
                let sampler = &app.latency[w.min(app.latency.len() - 1)];
                let latency = sampler.latency(model as usize, batch.len(), &mut self.rng);
                app.stats.batch(model, batch.len());
                self.schedule_worker(a, w, now + latency, Pending::Done { model, batch, started: now });
            }
            Action::Wait(t) | Action::Idle { expire_at: Some(t) } => self.schedule_worker(a, w, t, Pending::Timer),
            Action::Idle { expire_at: None } => self.schedule_worker(a, w, 0, Pending::None),
        }
    }

    /// Worker `w` of app `a` finished its batch: each request's outcome, and the
    /// policy's feedback ([`Finished`]).
    fn finish(&mut self, a: usize, w: usize, model: u32, batch: Vec<SimRequest>, started: u64) {
        let now = self.clock.now();
        let app = &mut self.apps[a];
        let done = Finished::of(model, &batch, started, now, false);
        let accuracy = app.models[model as usize].accuracy;
        for r in &batch {
            let on_time = done.on_time(r.deadline);
            let fate = if on_time { Fate::OnTime } else { Fate::Late };
            app.stats.finish(r.id, fate, accuracy);
            app.stats.latency(r.id, now - r.arrival);
            app.stats.served_by(r.id, model);
            note(&mut app.outcomes, r.id, || done.outcome(r, &app.models[model as usize].name));
        }
        if let Some((admission, predicted)) = &app.admission {
            // What the batch teaches admission, as live (`sluice_server::worker`):
            // the worker's slowdown over the profile, and each answer's error.
            let models = app.device_models.as_ref().map_or(&app.models[..], |d| &d[w][..]);
            let profiled = models.get(model as usize).and_then(|m| m.latency(batch.len() as u32)).unwrap_or(0);
            admission.worker(w).finish_batch(model, profiled, now - started);
            admission.learn(now, batch.iter().map(|r| predicted[r.id as usize]));
        }
        let worker = &mut app.workers[w];
        worker.busy = 0;
        // The simulated policy is never swapped while its batch runs.
        if done.observe(&batch, Some(&mut worker.policy)).is_err() {
            app.stats.faults += 1;
        }
    }
}

/// What a turn of a worker hands the engine ([`worker::Driver`]): each request that
/// leaves unserved is finished in the stats (and its outcome noted), each decision
/// counted.
struct Tally<'s> {
    stats: &'s mut Stats,
    outcomes: &'s mut Option<Vec<Option<Outcome>>>,
    now: u64,
}

impl worker::Driver<SimRequest> for Tally<'_> {
    fn dropped(&mut self, r: SimRequest, reason: DropReason, _by_safe: bool) {
        let fate = if reason == DropReason::Expired { Fate::Expired } else { Fate::Dropped };
        self.stats.finish(r.id, fate, 0.0);
        self.stats.taken(r.id, self.now);
        note(self.outcomes, r.id, || Outcome::Dropped(reason));
    }

    fn decided(&mut self, _policy: &mut WorkerPolicy, report: Report) {
        if let Some(t) = report.decide_time {
            self.stats.decide_calls += 1;
            self.stats.decide_seconds += t.as_secs_f64();
        }
        if report.fault.is_some() {
            self.stats.faults += 1;
        }
    }
}

/// Notes request `id`'s outcome when outcomes are kept (built only then: a served
/// outcome holds the variant's name).
fn note(outcomes: &mut Option<Vec<Option<Outcome>>>, id: u64, outcome: impl FnOnce() -> Outcome) {
    if let Some(o) = outcomes.as_mut().and_then(|o| o.get_mut(id as usize)) {
        *o = Some(outcome());
    }
}

/// Whether worker `w` is in `shard` ([`RunInputs::shard`]; every worker without one).
fn owns(shard: Option<(usize, usize)>, w: usize) -> bool {
    shard.is_none_or(|(index, count)| w % count == index)
}

/// Events between two progress reports to a [`ReplayControl`]: often enough for a
/// progress bar, rarely enough to cost nothing measurable.
const POLL_EVENTS: u32 = 4096;

/// The allocator looks at the demand this often (virtual µs).
const TICK_US: u64 = 1_000_000;

fn tables_of(tables: &[[Vec<u64>; 3]], i: usize) -> [Vec<u64>; 3] {
    tables[i].clone()
}

/// The MILP allocator in virtual time: the same problem, solver and forecasters as
/// the live host's (`sluice_server::allocation`), re-planning from the simulated
/// demand. Applying a plan takes no virtual time (loading is instant here); workers
/// that lose their app drain their queues before they unload, as live.
struct AllocState {
    pool: DevicePool,
    planner: Planner,
    config: AllocatorConfig,
    /// (app, its variants by name), in app order.
    apps: Vec<(SimApp, Vec<String>)>,
    demand_used: BTreeMap<String, f64>,
    last_solve: u64,
    replans: usize,
}

impl AllocState {
    fn start(pool: DevicePool, config: &AllocatorConfig, apps: &[AppState]) -> Result<AllocState> {
        let apps: Vec<(SimApp, Vec<String>)> =
            apps.iter().map(|a| (a.spec.clone(), a.models.iter().map(|m| m.name.clone()).collect())).collect();
        let demand: BTreeMap<String, f64> = apps
            .iter()
            .map(|(a, _)| (a.name.clone(), config.demand_qps.get(&a.name).copied().unwrap_or(1.0)))
            .collect();
        // No soft limit in virtual time: it stops the accuracy solve at a wall-clock
        // instant, so a plan (and every result after it) would depend on how busy
        // the machine running the simulation is. The solve runs to its gap instead.
        let config = &AllocatorConfig {
            solver: SolverSettings { soft_limit_s: 0.0, ..config.solver.clone() },
            ..config.clone()
        };
        let mut s = AllocState {
            pool,
            planner: Planner::new(config),
            config: config.clone(),
            apps,
            demand_used: BTreeMap::new(),
            last_solve: 0,
            replans: 0,
        };
        if s.solve(&demand).is_none() {
            anyhow::bail!("allocator: no feasible plan for the demand {demand:?} on these devices");
        }
        s.replans = 0;
        Ok(s)
    }

    fn plan(&self) -> Option<&proteus::Plan> {
        self.planner.current()
    }

    /// Solves for `demand`; the new plan when there is one.
    fn solve(&mut self, demand: &BTreeMap<String, f64>) -> Option<proteus::Plan> {
        let apps: Vec<(&SimApp, Vec<String>)> = self.apps.iter().map(|(a, m)| (a, m.clone())).collect();
        let a = self.planner.plan(self.pool.problem(&self.config, &apps, demand));
        if !a.is_new_plan() {
            return None;
        }
        self.demand_used = demand.clone();
        self.replans += 1;
        self.planner.current().cloned()
    }
}

impl Simulation {
    /// Loads each planned variant on its worker and sets every app's weights.
    fn apply(&mut self, plan: &proteus::Plan) {
        let now = self.clock.now();
        for app in &mut self.apps {
            let mut weights = vec![0.0; app.workers.len()];
            for (w, d) in plan.devices.iter().enumerate().take(app.workers.len()) {
                if d.app.as_deref() == Some(app.spec.name.as_str()) {
                    weights[w] = d.share;
                    if let Some(id) = d.model.as_ref().and_then(|m| app.models.iter().position(|x| &x.name == m)) {
                        app.workers[w].loaded = vec![id as u32];
                        if let Some((admission, _)) = &app.admission {
                            // As live when a worker's models change.
                            admission.worker(w).set_fastest(id as u32);
                        }
                        if let Some(us) = d.service_us {
                            // A core of a replica: every batch size at the replica's time.
                            let last = app.latency.len() - 1;
                            let sampler = &mut app.latency[w.min(last)];
                            sampler.tables[id] = std::array::from_fn(|_| vec![us]);
                            sampler.policy_tables[id] = vec![us];
                            if let Some(dm) = app.device_models.as_mut() {
                                dm[w][id].latency = vec![us];
                            }
                        }
                    }
                }
            }
            let used = plan.devices.iter().filter(|d| d.app.as_deref() == Some(app.spec.name.as_str())).count();
            app.stats.devices_in_use(now, used as u32);
            if weights.iter().sum::<f64>() > 0.0 {
                let _ = app.router.set_weights(&weights);
            }
        }
        self.retire();
    }

    /// Workers that get no share and have drained unload.
    fn retire(&mut self) {
        for app in &mut self.apps {
            let weights = app.router.weights();
            for (w, worker) in app.workers.iter_mut().enumerate() {
                if weights.get(w).copied().unwrap_or(0.0) == 0.0
                    && worker.busy == 0
                    && app.queues.get(w).is_some_and(|q| q.is_empty())
                {
                    worker.loaded.clear();
                }
            }
        }
    }

    /// Every second: forecast, and re-plan when the period is over or a forecast moved.
    fn alloc_tick(&mut self, now: u64) {
        let Some(mut alloc) = self.alloc.take() else { return };
        let f = alloc.config.forecaster();
        let demand: BTreeMap<String, f64> = self
            .apps
            .iter()
            .map(|a| (a.spec.name.clone(), f.forecast(&a.demand.per_second(now)).max(alloc.config.min_demand_qps)))
            .collect();
        let due = now.saturating_sub(alloc.last_solve) as f64 >= alloc.config.period_s * 1e6;
        let shifted = alloc.config.demand_shifted(&alloc.demand_used, &demand);
        if (due || shifted) && alloc.planner.replans() {
            alloc.last_solve = now;
            if let Some(plan) = alloc.solve(&demand) {
                self.apply(&plan);
            }
        }
        self.retire();
        self.alloc = Some(alloc);
    }
}
