//! The worker loop: at every decision point (an arrival, a finished batch, a timer
//! the policy asked for) a turn of the worker's state machine
//! ([`sluice_core::worker::Machine`]: what leaves the queue and why, the policy's
//! decision, when to decide again), then the batch it forms executed and judged
//! ([`Finished`]). The rules are the machine's, the same in the simulator; this
//! file holds what is live: the slot lock and swaps, the wall clock and the
//! executor, answers, and what is counted (through the app's `record_*` methods,
//! which hold the metrics' names).
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
//!
//! **Inline turns.** Waking the thread for an arrival and waking the front for its
//! answer were a third of the host's CPU on the zero-latency bench (two futex
//! wake-ups and four context switches per request: BENCHMARKS.md §3). So when the
//! worker's thread is waiting, its models answer at once ([`Executor::instant`]:
//! the zero-latency emulated ones) and its policy's last decision was fast
//! ([`INLINE_DECIDE_MAX`], no fault, not a WASI component, no swap pending), the
//! arrival's own task takes the worker's turn ([`crate::turn::Inline::claim`], in
//! `App::admit`): it queues the request without waking the thread and runs the
//! same turns the thread would ([`run_inline`], which the thread registers with the
//! app: `App::register_inline`), at most [`MAX_INLINE_TURNS`],
//! handing the rest (a timer the policy asked for, a queue still full) back to the
//! thread. Whoever holds the turn holds the worker's [`Core`], so one worker never
//! runs two turns at once, and the rules are the same [`Machine`]'s. What a policy
//! can cost the runtime this way is one decision: the one that turns out slow or
//! faulty sends the worker back to its thread until a decision there is fast again.
//!
//! **Answers after the next start.** On the worker's thread a batch's answers
//! leave once the next batch has started ([`execute`] polls it once, then sends
//! them), or before the thread waits. An answer wakes the front's task on another
//! thread; on a busy machine that thread took the worker's core there and then, and
//! the next batch started ~0.2 ms late, every batch (BENCHMARKS.md §8.1: the
//! simulator starts it at once). The answers wait one decision for it. Instant
//! models' answers (inline turns too) leave at once: their batches take no time.
//!
//! [`Executor::instant`]: sluice_core::executor::Executor::instant

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crate::app::{App, WorkerControl, WorkerStart};
use crate::turn::{Core, Turn, INLINE_DECIDE_MAX, MAX_INLINE_TURNS};
use sluice_core::clock::Clock as _;
use sluice_core::decision::{Context, WorkerPolicy, SAFE_POLICY};
use sluice_core::executor::ModelSet;
use sluice_core::queue::{DropReason, Reply, Request, Served};
use sluice_core::runtime::PolicyFault;
use sluice_core::worker::{self, Action, Finished, Machine, Report};

/// Answers a turn made but has not sent yet (module doc, "Answers after the next
/// start"): counted already, sent by [`send`].
type Outbox = Vec<(Request, Reply)>;

/// Sends the answers held in `outbox`: one batch's (and the drops of the turn that
/// started the next), counted into a pipeline's handoff first
/// (`crate::handoff::send_answers`).
fn send(app: &App, outbox: &mut Outbox) {
    crate::handoff::send_answers(app.handoff.get().map(|h| &**h), outbox.drain(..));
}

/// How a turn formed its batch, for the batch's record and its answers.
struct Formed {
    /// Requests that stayed queued when the policy formed it.
    left: usize,
    /// The arrival rate the policy's view gave it.
    load_qps: f64,
    /// The policy whose decision formed it (`safe` for the fallback).
    policy: String,
    /// The generation of the slot's policy then (its feedback goes to it only).
    generation: u64,
}

/// Runs the turns of worker `handle` for the arrival that claimed them
/// ([`crate::turn::Inline::claim`]) after queueing its request, on the caller's thread: the
/// same decisions and batches as the worker's thread would make, answered before
/// this returns. Hands the worker back to its thread (waking it) when a turn
/// cannot be made here or leaves a timer or a queue behind.
pub fn run_inline(app: &App, handle: &crate::app::WorkerHandle, mut turn: Turn<'_>) {
    let core = turn.core();
    // Instant models: each turn's answers leave at its end, as its batch finished.
    let mut outbox = Outbox::new();
    let turns = async {
        for _ in 0..MAX_INLINE_TURNS {
            let decided = decide(app, handle, &core.models, false, &mut core.machine, true, &mut outbox);
            send(app, &mut outbox);
            let Some((action, formed)) = decided else {
                break;
            };
            app.record_inline_decision();
            match action {
                Action::Run { model, batch } => {
                    execute(app, handle, &core.models, model, batch, formed, &mut outbox).await;
                    send(app, &mut outbox);
                }
                // Nothing left to do and nothing to wake for: the thread, waiting
                // on the queue, wakes at the next push as it would have.
                Action::Idle { expire_at: None } => return,
                // A timer for the thread to keep (it decides again when woken).
                Action::Wait(_) | Action::Idle { expire_at: Some(_) } => break,
            }
        }
        handle.queue.notify.notify_waiters();
    };
    // The models are instant and a decision does not wait, so the turns finish at
    // their first poll; nothing registers a waker that matters. Were one to return
    // pending, it is polled again until it finishes: nothing here waits on a wake.
    let mut turns = std::pin::pin!(turns);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    while std::future::Future::poll(turns.as_mut(), &mut cx).is_pending() {
        std::thread::yield_now();
    }
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
// The turn's lock is held across the batch's await on purpose: whoever holds it
// is the worker (see the module doc), and this future runs on the worker's own
// thread (`block_on`), never as a runtime task.
#[allow(clippy::await_holding_lock)]
pub async fn run(app: Arc<App>, start: WorkerStart) {
    let WorkerStart { handle, models, mut control } = start;
    let queue = handle.queue.clone();
    {
        let mut core = handle.inline.core.lock();
        core.instant = models.instant();
        core.models = models;
    }
    app.register_inline(run_inline);
    // The last batch's answers, sent once the next batch has started or before the
    // thread waits (module doc).
    let mut outbox = Outbox::new();
    loop {
        if app.aborted.load(Ordering::Acquire) {
            send(&app, &mut outbox);
            return;
        }
        // Register interest in wake-ups *before* looking at the queue, so a push
        // between the look and the wait is not missed.
        let notified = queue.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();

        // A pipeline's task app decides once the children of the batches just
        // answered are queued, all of them (`crate::handoff`): at most
        // `HANDOFF_WAIT_MAX`, and nothing to wait for almost always.
        if let Some(handoff) = app.handoff.get() {
            if !handoff.settled(crate::handoff::HANDOFF_WAIT_MAX).await {
                tracing::debug!(app = app.name(), routing = handoff.routing(), "decided before the handoff settled");
            }
        }
        let draining = app.draining.load(Ordering::Acquire);
        let action = {
            // Waits for an inline turn in progress, if any (microseconds: its
            // models are instant).
            let mut core = handle.inline.core.lock();
            let core = &mut *core;
            while let Ok(msg) = control.try_recv() {
                match msg {
                    WorkerControl::Install(set, done) => install(&app, &handle, core, set, done),
                }
            }
            let (action, formed) = decide(&app, &handle, &core.models, draining, &mut core.machine, false, &mut outbox)
                .expect("a turn on the worker's thread always decides");
            if let Action::Run { model, batch } = action {
                execute(&app, &handle, &core.models, model, batch, formed, &mut outbox).await;
                if core.instant {
                    // Nothing to start ahead of them: the next batch would be done
                    // at its first poll too.
                    send(&app, &mut outbox);
                }
                continue;
            }
            action
        };
        // No batch to start: the answers leave before the thread waits.
        send(&app, &mut outbox);
        // The turn is free while the thread waits: an arrival may take it.
        match action {
            Action::Run { .. } => unreachable!("executed above"),
            Action::Wait(until) => {
                // To the µs the policy asked for, as the simulator waits (tokio's
                // timer alone rounds up to its next millisecond tick).
                let at = app.clock.instant(until);
                tokio::select! {
                    _ = &mut notified => {}
                    _ = crate::executor::sleep_until_precise(at) => {}
                    msg = control.recv() => if let Some(WorkerControl::Install(set, done)) = msg {
                        install(&app, &handle, &mut handle.inline.core.lock(), set, done);
                    },
                }
            }
            Action::Idle { expire_at } => {
                if draining && queue.is_empty() {
                    return;
                }
                let at = expire_at.map(|t| tokio::time::Instant::from_std(app.clock.instant(t)));
                tokio::select! {
                    _ = &mut notified => {}
                    _ = async { match at { Some(at) => tokio::time::sleep_until(at).await, None => std::future::pending().await } } => {}
                    msg = control.recv() => if let Some(WorkerControl::Install(set, done)) = msg {
                        install(&app, &handle, &mut handle.inline.core.lock(), set, done);
                    },
                }
            }
        }
    }
}

fn install(
    app: &App,
    handle: &crate::app::WorkerHandle,
    core: &mut Core,
    set: ModelSet,
    done: tokio::sync::oneshot::Sender<()>,
) {
    // The new sessions were loaded and warmed before the message was sent; switching
    // is a move, and the old ones are dropped here, after the switch.
    core.instant = set.instant();
    let old = std::mem::replace(&mut core.models, set);
    let models = &core.models;
    *handle.loaded.lock() = models.ids();
    app.models_changed(handle, &models.ids());
    drop(old);
    tracing::info!(app = app.name(), worker = handle.index, models = ?models.ids(), "worker models switched");
    let _ = done.send(());
}

/// What a turn hands the live worker ([`worker::Driver`]): the requests that leave
/// unserved, answered once the slot's lock is released; each decision's time (a
/// metric) and fault (recorded after the lock, too: recording may unbind).
struct Answers<'a> {
    app: &'a App,
    dropped: Vec<(Request, DropReason, bool)>,
    faults: Vec<PolicyFault>,
    /// Whether a decision of the turn was slower than [`INLINE_DECIDE_MAX`] or faulted.
    slow: bool,
    /// Whether the policy was called at all (an empty queue asks nobody).
    called: bool,
}

impl worker::Driver<Request> for Answers<'_> {
    fn dropped(&mut self, r: Request, reason: DropReason, by_safe: bool) {
        self.dropped.push((r, reason, by_safe));
    }

    fn decided(&mut self, _policy: &mut WorkerPolicy, report: Report) {
        if let Some(t) = report.decide_time {
            self.app.record_decide_time(t);
            self.called = true;
            self.slow |= t > INLINE_DECIDE_MAX;
        }
        self.slow |= report.fault.is_some();
        self.faults.extend(report.fault);
    }
}

/// One turn of the worker's state machine ([`sluice_core::worker`]), made under the
/// worker's slot lock (see [`crate::app::Slot`]), so it is made entirely by one
/// policy; the queue's lock is taken to look and to remove, not while the policy
/// runs. The models it decides with are the worker's own view where it has one (a
/// pipeline task worker: its variant's table cut at the plan's batch,
/// `flow::task_view`, set by `App::rebind_worker`), so a policy's batch is checked
/// against the plan's. Pipelines' task apps drop late at batch formation
/// (`drop_late_at_batch`): the head is judged by the loaded variant's table in that
/// view (`flow::batch_formation_table`, already cut at the plan's batch).
/// Counts what left unserved and puts its answers in `outbox`, and says what to do
/// next. An `inline` turn
/// ([`run_inline`]) decides nothing (None) where the worker's thread must: a swap
/// pending (the new policy proves itself fast there first) or a WASI component
/// (its calls leave the runtime's context: `outside_runtime` in sluice-core).
fn decide(
    app: &App,
    handle: &crate::app::WorkerHandle,
    models: &ModelSet,
    draining: bool,
    machine: &mut Machine,
    inline: bool,
    outbox: &mut Outbox,
) -> Option<(Action<Request>, Formed)> {
    let mut retired = None;
    let wait_started = Instant::now();
    let mut slot = handle.slot.lock();
    if inline && (slot.pending.is_some() || matches!(&slot.current, WorkerPolicy::Wasm(i) if i.compiled().wasi)) {
        return None;
    }
    if let Some((bound, generation)) = slot.pending.take() {
        handle.inline.fast.store(false, Ordering::Release);
        retired = Some(std::mem::replace(&mut slot.current, bound));
        slot.generation = generation;
        app.record_swap_wait(wait_started.elapsed());
    }
    let unbind = app.unbind_generation.load(Ordering::Acquire);
    if unbind != 0 && unbind == slot.generation && !matches!(slot.current, WorkerPolicy::Safe) {
        slot.current = WorkerPolicy::Safe;
    }
    let generation = slot.generation;
    let policy_name = slot.current.name().to_string();

    let view = slot.view.clone();
    let seen = view.as_deref().map_or_else(|| app.models_of(handle.index), |v| &v.models[..]);
    let now = app.clock.now();
    let loaded = models.ids();
    let cx = Context {
        now,
        worker: handle.index,
        workers: app.workers.len() as u32,
        load_qps: app.load.rate(now),
        loaded: &loaded,
        models: seen,
        expire_us: app.expire_us,
        draining,
        timed: true,
    };
    let at_batch = loaded
        .first()
        .filter(|_| app.config.drop_late_at_batch)
        .and_then(|&m| seen.get(m as usize))
        .map(|m| sluice_core::pipeline::flow::batch_formation_table(&m.latency, u32::MAX));
    let mut answers = Answers { app, dropped: Vec::new(), faults: Vec::new(), slow: false, called: false };
    let mut queue: &sluice_core::queue::WorkQueue = &handle.queue;
    let turn = machine.decide(&mut queue, &mut slot.current, &cx, at_batch, &mut answers);
    drop(slot);
    if answers.slow {
        handle.inline.fast.store(false, Ordering::Release);
    } else if answers.called {
        handle.inline.fast.store(true, Ordering::Release);
    }
    if let Some(old) = retired {
        // Dropping a store takes tens of microseconds: not on the worker's path.
        tokio::task::spawn_blocking(move || drop(old));
    }
    let taken = if let Action::Run { batch, .. } = &turn.action { batch.len() } else { 0 };
    app.queued.fetch_sub(answers.dropped.len() + taken, Ordering::AcqRel);
    for fault in answers.faults {
        match fault {
            // The fault that made the instance re-instantiate was counted when it happened.
            PolicyFault::Reviving => app.record_reviving_decision(),
            fault => {
                app.record_fault(&policy_name, fault.kind(), generation, &fault.to_string());
            }
        }
    }
    let decided_by = |by_safe: bool| if by_safe { SAFE_POLICY } else { policy_name.as_str() };
    for (r, reason, by_safe) in answers.dropped {
        let (detail, by) = match reason {
            DropReason::Expired => ("waited past its deadline beyond expire_after_ms", "host"),
            DropReason::EarlyAtBatch => ("it would finish past its task deadline", "host"),
            DropReason::Policy | DropReason::ExecutorError => ("dropped by the policy", decided_by(by_safe)),
        };
        outbox.push(answer_dropped(app, r, reason, detail, by));
    }
    let formed =
        Formed { left: turn.left, load_qps: cx.load_qps, policy: decided_by(turn.by_safe).to_string(), generation };
    Some((turn.action, formed))
}

/// Counts a request dropped and makes its answer (for an [`Outbox`]).
fn answer_dropped(app: &App, r: Request, reason: DropReason, detail: &str, policy: &str) -> (Request, Reply) {
    app.record_drop(reason);
    (r, Reply::Dropped { reason, detail: detail.to_string(), policy: policy.to_string() })
}

/// Runs a batch and judges it. Once the batch has started (its first poll), sends
/// what `outbox` holds (the last batch's answers, this turn's drops); the batch's
/// own answers go into `outbox` for the caller to send (module doc).
async fn execute(
    app: &App,
    handle: &crate::app::WorkerHandle,
    models: &ModelSet,
    model: u32,
    batch: Vec<Request>,
    Formed { left, load_qps, policy, generation }: Formed,
    outbox: &mut Outbox,
) {
    let policy = policy.as_str();
    let size = batch.len();
    let variant = app.models[model as usize].name.clone();
    let started = app.clock.now();
    app.start_batch(handle, model, size, left, started, load_qps);
    app.record_batch(&variant, size);
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
    let mut run = std::pin::pin!(run);
    // One poll starts the batch (the emulated executor fixes its end and yields; ONNX
    // hands it to a blocking thread); then the held answers leave.
    let first = std::future::poll_fn(|cx| std::task::Poll::Ready(std::future::Future::poll(run.as_mut(), cx))).await;
    send(app, outbox);
    // At the end of a shutdown's grace the batch is abandoned (the executor's thread
    // finishes on its own) and its requests get the documented 503, counted.
    let result = tokio::select! {
        r = async { match first { std::task::Poll::Ready(r) => r, std::task::Poll::Pending => run.await } } => r,
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
    app.finish_batch(handle, model, profiled, finished.saturating_sub(started));
    app.record_answers(finished, &requests);
    // The batch judged by the one rule ([`Finished`]); the policy's feedback worked
    // out before the requests are answered and moved.
    let done = Finished::of(model, &requests, started, finished, result.is_err());
    let feedback = done.feedback(&requests);
    match result {
        Ok(outputs) => {
            // Counted before any answer leaves (they wait in `outbox`).
            app.record_served(&variant, &requests, started, finished, |deadline| done.on_time(deadline));
            for (r, outputs) in requests.into_iter().zip(outputs) {
                let met = done.on_time(r.deadline);
                let latency_us = finished.saturating_sub(r.arrival);
                let served = Served {
                    variant: variant.clone(),
                    policy: policy.to_string(),
                    outputs,
                    queue_us: started.saturating_sub(r.arrival),
                    latency_us,
                    slo_us: r.deadline - r.arrival,
                    deadline_met: met,
                    batch_size: size,
                    worker: handle.index,
                    audited: r.audit,
                };
                outbox.push((r, Reply::Served(Box::new(served))));
            }
        }
        Err(e) => {
            tracing::error!(app = app.name(), worker = handle.index, model = %variant, "batch failed: {e}");
            for r in requests {
                outbox.push(answer_dropped(
                    app,
                    r,
                    DropReason::ExecutorError,
                    &format!("the executor failed: {e}"),
                    policy,
                ));
            }
        }
    }
    // Feedback goes to the policy that decided, unless a swap replaced it meanwhile
    // (then the slot's policy is not the one that formed the batch: none is told).
    let mut slot = handle.slot.lock();
    let formed_it = slot.generation == generation && slot.pending.is_none();
    if let Err(fault) = worker::observe(formed_it.then_some(&mut slot.current), &feedback) {
        let (name, slot_generation) = (slot.current.name().to_string(), slot.generation);
        drop(slot);
        app.record_fault(&name, fault.kind(), slot_generation, &fault.to_string());
    }
}
