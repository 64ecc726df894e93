//! The worker loop: at every decision point (an arrival, a finished batch, a timer
//! the policy asked for) ask the policy, validate its answer, and execute it.
//!
//! Every request that enters a worker's queue leaves it exactly once: taken into a
//! batch (and answered when the batch finishes), dropped by the policy, expired by
//! the host, or rejected at the end of a shutdown that could not drain it.
//!
//! Each worker runs on a thread of its own ([`spawn`]), so its policy's calls never
//! run on the runtime's async threads: a slow `decide` (up to its budget) holds
//! only its own worker, never the HTTP front or another worker. The queue's lock is
//! not held during the call either, so arrivals for a deciding worker are queued at
//! once.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crate::app::{App, WorkerControl, WorkerStart};
use sluice_core::clock::Clock as _;
use sluice_core::decision::Bound;
use sluice_core::decision::{self, Context, Next};
use sluice_core::executor::ModelSet;
use sluice_core::pipeline::late_at_batch;
use sluice_core::queue::{DropReason, Reply, Request, Served};
use sluice_core::runtime::PolicyFault;

/// What the worker does after a decision.
enum Step {
    /// Execute a batch; `left` requests stayed queued when the policy formed it, at
    /// the arrival rate `load_qps` its view gave it.
    Run { model: u32, batch: Vec<Request>, left: usize, load_qps: f64, policy: String, generation: u64 },
    /// Wait for an arrival or until this instant (µs).
    Wait(u64),
    /// Decide again at once (the policy only dropped).
    Again,
    /// Wait for an arrival (or until `expire_at`, when the queue is not empty).
    Idle { expire_at: Option<u64> },
}

/// Starts one worker on a thread of its own, driving [`run`] with the runtime's
/// handle (its timers and the executor's blocking pool stay the runtime's). The
/// receiver resolves when the worker has stopped.
pub fn spawn(app: Arc<App>, start: WorkerStart) -> std::io::Result<tokio::sync::oneshot::Receiver<()>> {
    let runtime = tokio::runtime::Handle::current();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let name = format!("sluice-w{}-{}", start.handle.index, app.name());
    // Thread names are capped at 15 bytes by the kernel; the rest is for humans.
    std::thread::Builder::new().name(name).spawn(move || {
        runtime.block_on(run(app, start));
        let _ = done_tx.send(());
    })?;
    Ok(done_rx)
}

/// Runs one worker until the app drains at shutdown (or is aborted when the grace
/// runs out).
pub async fn run(app: Arc<App>, start: WorkerStart) {
    let WorkerStart { handle, mut models, mut control } = start;
    let queue = handle.queue.clone();
    loop {
        if app.aborted.load(Ordering::Acquire) {
            return;
        }
        // Register interest in wake-ups *before* looking at the queue, so a push
        // between the look and the wait is not missed.
        let notified = queue.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();

        while let Ok(msg) = control.try_recv() {
            match msg {
                WorkerControl::Install(set, done) => install(&app, &handle, &mut models, set, done),
            }
        }

        let draining = app.draining.load(Ordering::Acquire);
        if app.config.drop_late_at_batch {
            for r in take_late_at_batch(&app, &handle, &models) {
                answer_dropped(&app, r, DropReason::EarlyAtBatch, "it would finish past its task deadline", "host");
            }
        }
        let (step, expired, dropped) = decide(&app, &handle, &models, draining);
        for r in expired {
            answer_dropped(&app, r, DropReason::Expired, "waited past its deadline beyond expire_after_ms", "host");
        }
        let (dropped, drop_policy) = dropped;
        for r in dropped {
            answer_dropped(&app, r, DropReason::Policy, "dropped by the policy", &drop_policy);
        }
        match step {
            Step::Run { model, batch, left, load_qps, policy, generation } => {
                execute(&app, &handle, &models, (model, left, load_qps), batch, &policy, generation).await;
            }
            Step::Again => {}
            Step::Wait(until) => {
                let at = tokio::time::Instant::from_std(app.clock.instant(until));
                tokio::select! {
                    _ = &mut notified => {}
                    _ = tokio::time::sleep_until(at) => {}
                    msg = control.recv() => if let Some(WorkerControl::Install(set, done)) = msg {
                        install(&app, &handle, &mut models, set, done);
                    },
                }
            }
            Step::Idle { expire_at } => {
                if draining && queue.is_empty() {
                    return;
                }
                let at = expire_at.map(|t| tokio::time::Instant::from_std(app.clock.instant(t)));
                tokio::select! {
                    _ = &mut notified => {}
                    _ = async { match at { Some(at) => tokio::time::sleep_until(at).await, None => std::future::pending().await } } => {}
                    msg = control.recv() => if let Some(WorkerControl::Install(set, done)) = msg {
                        install(&app, &handle, &mut models, set, done);
                    },
                }
            }
        }
    }
}

fn install(
    app: &App,
    handle: &crate::app::WorkerHandle,
    models: &mut ModelSet,
    set: ModelSet,
    done: tokio::sync::oneshot::Sender<()>,
) {
    // The new sessions were loaded and warmed before the message was sent; switching
    // is a move, and the old ones are dropped here, after the switch.
    let old = std::mem::replace(models, set);
    *handle.loaded.lock() = models.ids();
    let fastest = crate::app::fastest(app.models_of(handle.index), &models.ids());
    handle.fastest_model.store(fastest, Ordering::Relaxed);
    drop(old);
    tracing::info!(app = app.name(), worker = handle.index, models = ?models.ids(), "worker models switched");
    let _ = done.send(());
}

/// A pipeline's early dropping at batch formation (`early_drop_at = "batch"`, the
/// reference's `pop_while_first_expires`): while the head of the worker's queue would
/// finish past its deadline even if it ran now, in the batch the queue makes (its
/// length, at most the loaded variant's largest batch), it is taken out before the
/// policy forms a batch, so it costs the worker no time. Task apps' requests carry
/// their task budget as deadline and arrive in deadline order.
fn take_late_at_batch(app: &App, handle: &crate::app::WorkerHandle, models: &ModelSet) -> Vec<Request> {
    let Some(&loaded) = models.ids().first() else { return Vec::new() };
    let Some(latency) = app.models_of(handle.index).get(loaded as usize).map(|m| &m.latency) else {
        return Vec::new();
    };
    let now = app.clock.now();
    let mut late = Vec::new();
    {
        let mut items = handle.queue.items.lock();
        // The table the worker's policy has (`flow::batch_formation_table`; the task
        // app's table is not cut at the plan's batch live, see docs/simulator.md).
        let latency = sluice_core::pipeline::flow::batch_formation_table(latency, u32::MAX);
        while items.first().is_some_and(|head| late_at_batch(now, head.deadline, items.len(), latency)) {
            late.push(items.remove(0));
        }
        handle.queue.sync_len(&items);
    }
    app.queued.fetch_sub(late.len(), Ordering::AcqRel);
    late
}

type Dropped = (Vec<Request>, String);

/// One decision (see [`sluice_core::decision`]), made under the worker's slot lock
/// (see [`crate::app::Slot`]), so it is made entirely by one policy; the queue's
/// lock is taken to look and to remove, not while the policy runs.
fn decide(
    app: &App,
    handle: &crate::app::WorkerHandle,
    models: &ModelSet,
    draining: bool,
) -> (Step, Vec<Request>, Dropped) {
    let mut retired = None;
    let wait_started = Instant::now();
    let mut slot = handle.slot.lock();
    if let Some((bound, generation)) = slot.pending.take() {
        retired = Some(std::mem::replace(&mut slot.current, bound));
        slot.generation = generation;
        let waited = wait_started.elapsed();
        app.counters.swap_max_wait_ns.fetch_max(waited.as_nanos() as u64, Ordering::Relaxed);
    }
    let unbind = app.unbind_generation.load(Ordering::Acquire);
    if unbind != 0 && unbind == slot.generation && !matches!(slot.current, Bound::Safe) {
        slot.current = Bound::Safe;
    }
    let generation = slot.generation;
    let policy_name = slot.current.name().to_string();

    let now = app.clock.now();
    let loaded = models.ids();
    let cx = Context {
        now,
        worker: handle.index,
        workers: app.workers.len() as u32,
        load_qps: app.load.rate(now),
        loaded: &loaded,
        models: app.models_of(handle.index),
        expire_us: app.expire_us,
        draining,
        timed: true,
    };
    let (expired, view) = {
        let mut items = handle.queue.items.lock();
        let prepared = decision::prepare(&mut items, &cx);
        handle.queue.sync_len(&items);
        prepared
    };
    let asked = view.as_ref().map(|v| decision::ask(&mut slot.current, v, &cx));
    let (d, left) = {
        let mut items = handle.queue.items.lock();
        let d = decision::apply(&mut items, expired, view.as_ref().zip(asked), &mut slot.current, &cx);
        handle.queue.sync_len(&items);
        (d, items.len())
    };
    drop(slot);
    if let Some(old) = retired {
        // Dropping a store takes tens of microseconds: not on the worker's path.
        tokio::task::spawn_blocking(move || drop(old));
    }
    let removed =
        d.expired.len() + d.dropped.len() + if let Next::Run { batch, .. } = &d.next { batch.len() } else { 0 };
    app.queued.fetch_sub(removed, Ordering::AcqRel);
    if let Some(t) = d.decide_time {
        app.metrics.observe("sluice_policy_decide_seconds", &[("app", app.name())], t.as_secs_f64());
    }
    match &d.fault {
        // The fault that made the instance re-instantiate was counted when it happened.
        Some(PolicyFault::Reviving) => {
            app.counters.reviving_decisions.fetch_add(1, Ordering::Relaxed);
        }
        Some(fault) => {
            app.record_fault(&policy_name, fault.kind(), generation, &fault.to_string());
        }
        None => {}
    }
    let decided_by = if d.by_safe { "safe".to_string() } else { policy_name };
    let step = match d.next {
        Next::Run { model, batch } => {
            Step::Run { model, batch, left, load_qps: cx.load_qps, policy: decided_by.clone(), generation }
        }
        Next::Wait(t) => Step::Wait(t),
        Next::Again => Step::Again,
        Next::Idle { expire_at } => Step::Idle { expire_at },
    };
    (step, d.expired, (d.dropped, decided_by))
}

fn answer_dropped(app: &App, r: Request, reason: DropReason, detail: &str, policy: &str) {
    app.counters.dropped.fetch_add(1, Ordering::Relaxed);
    app.metrics.request(app.name(), "", &format!("dropped-{}", reason.as_str()));
    r.answer(Reply::Dropped { reason, detail: detail.to_string(), policy: policy.to_string() });
}

async fn execute(
    app: &App,
    handle: &crate::app::WorkerHandle,
    models: &ModelSet,
    (model, left, load_qps): (u32, usize, f64),
    batch: Vec<Request>,
    policy: &str,
    generation: u64,
) {
    let size = batch.len();
    let variant = app.models[model as usize].name.clone();
    let started = app.clock.now();
    handle.start_batch(model, size, left, started, load_qps);
    app.metrics.observe("sluice_batch_size", &[("app", app.name()), ("model", &variant)], size as f64);
    let (requests, samples): (Vec<_>, Vec<_>) = batch
        .into_iter()
        .map(|mut r| {
            let input = std::mem::replace(
                &mut r.input,
                sluice_core::tensor::Tensor {
                    name: String::new(),
                    shape: vec![],
                    data: sluice_core::tensor::TensorData::U8(vec![]),
                },
            );
            (r, input)
        })
        .unzip();
    let run = async {
        match models.get(model) {
            Ok(m) => m.run(model, samples).await,
            Err(e) => Err(e),
        }
    };
    // At the end of a shutdown's grace the batch is abandoned (the executor's thread
    // finishes on its own) and its requests get the documented 503, counted.
    let result = tokio::select! {
        r = run => r,
        _ = app.wait_aborted() => {
            handle.in_flight.store(0, Ordering::Relaxed);
            for r in requests {
                app.reject_at_shutdown(r);
            }
            return;
        }
    };
    let finished = app.clock.now();
    handle.in_flight.store(0, Ordering::Relaxed);
    let profiled = app.models_of(handle.index).get(model as usize).and_then(|m| m.latency(size as u32)).unwrap_or(0);
    handle.observe_batch(model, profiled, finished.saturating_sub(started));
    app.record_answers(finished, &requests);
    let outcome = decision::outcome(model, &requests, started, finished, result.is_err());
    match result {
        Ok(outputs) => {
            // Counted per batch, under one lock per family (not per answer), and
            // before any answer leaves, so a client that reads the metrics after its
            // answer finds itself counted.
            let on_time = requests.iter().filter(|r| decision::met(finished, r.deadline)).count() as u64;
            app.metrics.requests_n(app.name(), &variant, "served", on_time);
            app.metrics.requests_n(app.name(), &variant, "late", size as u64 - on_time);
            let queue_s = requests.iter().map(|r| (started - r.arrival.min(started)) as f64 / 1e6);
            app.metrics.observe_all("sluice_queue_seconds", &[("app", app.name())], queue_s);
            let latency_s = requests.iter().map(|r| finished.saturating_sub(r.arrival) as f64 / 1e6);
            app.metrics.observe_all("sluice_latency_seconds", &[("app", app.name())], latency_s);
            for (r, outputs) in requests.into_iter().zip(outputs) {
                let met = decision::met(finished, r.deadline);
                if !met {
                    app.counters.late.fetch_add(1, Ordering::Relaxed);
                }
                if r.audit && met {
                    // Admitted to check a refusal, and on time: the refusal was false.
                    app.counters.audited_met.fetch_add(1, Ordering::Relaxed);
                }
                app.counters.served.fetch_add(1, Ordering::Relaxed);
                let latency_us = finished.saturating_sub(r.arrival);
                let served = Served {
                    variant: variant.clone(),
                    policy: policy.to_string(),
                    outputs,
                    queue_us: started.saturating_sub(r.arrival),
                    latency_us,
                    deadline_us: r.deadline - r.arrival,
                    deadline_met: met,
                    batch_size: size,
                    worker: handle.index,
                };
                r.answer(Reply::Served(Box::new(served)));
            }
        }
        Err(e) => {
            tracing::error!(app = app.name(), worker = handle.index, model = %variant, "batch failed: {e}");
            for r in requests {
                answer_dropped(app, r, DropReason::ExecutorError, &format!("the executor failed: {e}"), policy);
            }
        }
    }
    // Feedback goes to the policy that decided, unless a swap replaced it meanwhile.
    let mut slot = handle.slot.lock();
    if slot.generation == generation && slot.pending.is_none() {
        let slot_generation = slot.generation;
        if let Bound::Wasm(instance) = &mut slot.current {
            if let Err(fault) = instance.observe(&outcome) {
                let name = instance.compiled().name.clone();
                drop(slot);
                app.record_fault(&name, fault.kind(), slot_generation, &fault.to_string());
            }
        }
    }
}
