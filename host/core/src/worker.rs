//! One worker as an I/O-free state machine, driven by the live worker thread
//! (`sluice_server::worker`, wall time) and by the simulator's event loops
//! (`sluice_sim::engine`, `sluice_sim::pipeline`, virtual time), in the shape of
//! vLLM's `schedule()` / `update_from_output()`:
//!
//! 1. At a decision point (an arrival, a finished batch, a timer the worker set) the
//!    driver calls [`Machine::decide`] with the worker's queue, its policy and the
//!    [`Context`] of the decision (the clock's value among it). The machine drops
//!    what is late at batch formation, expires, asks the policy (through
//!    [`decision`]'s prepare, ask and apply), decides again at once after a
//!    decision that only dropped, and answers with an [`Action`]: run this batch on
//!    this model, wait until an instant, or idle until an arrival (or the head's
//!    expiry). Every request that leaves the queue unserved is handed to the
//!    [`Driver`] with its [`DropReason`], in the order it left.
//! 2. When the batch is over the driver describes it as a [`Finished`], which says
//!    each request's [`Outcome`] (served on time or late by the one rule
//!    [`decision::met`], or dropped when the executor failed) and gives the policy
//!    that formed the batch its feedback ([`Finished::observe`]).
//!
//! The driver owns everything with a side effect: the clock, the executor or the
//! latency sampler, the locks, counters, metrics and answers. The rules — which
//! requests leave and why, what counts as on time, when to decide again, what the
//! policy is told — are here, once.

use std::time::Duration;

use sluice_sdk as sdk;

use crate::decision::{self, Context, Decided, Queued, Ruling, WorkerPolicy};
use crate::outcome::Outcome;
use crate::pipeline::finish_at_batch;
use crate::queue::{DropReason, Request, WorkQueue};
use crate::runtime::PolicyFault;

/// What the worker does after a turn ([`Machine::decide`]).
#[derive(Debug, PartialEq)]
pub enum Action<Q> {
    /// Execute this batch on this model; call [`Machine::decide`] again when it is
    /// over ([`Finished`]).
    Run {
        /// The model id.
        model: u32,
        /// The requests, in the policy's order.
        batch: Vec<Q>,
    },
    /// Decide again at an arrival or at this instant (µs), whichever is first (the
    /// policy's `wait-until`, capped at the head's expiry).
    Wait(u64),
    /// Decide again at an arrival, or at `expire_at` when the queue is not empty
    /// (its head then expires).
    Idle {
        /// When the head of the queue expires (None: the queue is empty).
        expire_at: Option<u64>,
    },
}

/// The result of one turn: what to do next, and how the last decision was made.
#[derive(Debug)]
pub struct Turn<Q> {
    /// What the worker does next.
    pub action: Action<Q>,
    /// Requests still queued when the last decision was applied (the live worker's
    /// batch record shows it beside the batch).
    pub left: usize,
    /// Whether the safe policy made the last decision (a fault, the draining rule, or
    /// [`WorkerPolicy::Safe`]).
    pub by_safe: bool,
}

/// What one decision of a turn reports to the driver ([`Driver::decided`]), once per
/// decision: a turn makes more than one when the policy only dropped.
#[derive(Debug)]
pub struct Report {
    /// The fault, when the policy's answer was replaced by the safe decision.
    pub fault: Option<PolicyFault>,
    /// Whether the safe policy decided.
    pub by_safe: bool,
    /// Time spent in the policy's `decide` (None: the queue was empty and nothing was
    /// asked; zero when the context is not [`Context::timed`]).
    pub decide_time: Option<Duration>,
}

/// What the machine needs from whoever drives it, besides the queue, the policy and
/// the context: somewhere to hand the requests that leave unserved, and an ear for
/// each decision.
pub trait Driver<Q> {
    /// `request` left the queue unserved for `reason`; `by_safe`: the safe policy
    /// made the decision that dropped it (meaningful for [`DropReason::Policy`]).
    /// Called in the order requests leave: late at batch formation, expired, then
    /// dropped by the policy, decision by decision.
    fn dropped(&mut self, request: Q, reason: DropReason, by_safe: bool);

    /// One decision was made (after its requests were handed to
    /// [`Driver::dropped`]). A driver counts faults and decide time here, and may
    /// replace `policy` (a pipeline unbinds a task's policies after its
    /// `unbind_after`-th fault), so the next decision of the turn is the new one's.
    fn decided(&mut self, policy: &mut WorkerPolicy, report: Report) {
        let _ = (policy, report);
    }

    /// Early dropping at batch formation, with the Loki artifact's reroute rule: the
    /// request at `head` (the first one not walked past yet) would finish at `finish`
    /// in the batch the queue makes, `late` when past its deadline. True: leave it
    /// queued and judge the next one (the artifact rerouted its children); false:
    /// drop it when late, else stop. By default every driver stops at the first
    /// request that is not late (§5.2 looks only at the head).
    fn walk_past(&mut self, head: &sdk::Pending, finish: u64, late: bool) -> bool {
        let _ = (head, finish, late);
        false
    }
}

/// A worker's queue as the machine reaches it: a vector the driver owns (the
/// simulator), or the live [`WorkQueue`] behind its lock. The machine takes the
/// lock to look and to remove, never while the policy runs, so arrivals for a
/// deciding worker are queued at once.
pub trait Items<Q> {
    /// Runs `f` on the requests, earliest deadline first.
    fn with<R>(&mut self, f: impl FnOnce(&mut Vec<Q>) -> R) -> R;

    /// One decision over the requests ([`decision::prepare_into`] into `view`,
    /// [`decision::ask`] without the lock, [`decision::apply`]), and how many are
    /// left queued after it.
    fn decide(&mut self, policy: &mut WorkerPolicy, cx: &Context, view: &mut sdk::View) -> (Decided<Q>, usize)
    where
        Q: Queued,
    {
        let (expired, any) = self.with(|v| decision::prepare_into(v, cx, view));
        let asked = any.then(|| decision::ask(policy, view, cx));
        let mut left = 0;
        let d = self.with(|v| {
            let d = decision::apply(v, expired, asked.map(|a| (&*view, a)), policy, cx);
            left = v.len();
            d
        });
        (d, left)
    }
}

impl<Q> Items<Q> for Vec<Q> {
    #[inline]
    fn with<R>(&mut self, f: impl FnOnce(&mut Vec<Q>) -> R) -> R {
        f(self)
    }

    /// The three steps in one ([`decision::decide_with`]), which the compiler
    /// inlines into one function: split, they cost a native simulated decision a
    /// twentieth more instructions.
    #[inline]
    fn decide(&mut self, policy: &mut WorkerPolicy, cx: &Context, view: &mut sdk::View) -> (Decided<Q>, usize)
    where
        Q: Queued,
    {
        let d = decision::decide_with(policy, self, cx, view);
        (d, self.len())
    }
}

impl Items<Request> for &WorkQueue {
    fn with<R>(&mut self, f: impl FnOnce(&mut Vec<Request>) -> R) -> R {
        let mut items = self.items.lock();
        let r = f(&mut items);
        // The length readers see without the lock (the router, admission).
        self.sync_len(&items);
        r
    }
}

/// One worker's decision state: the view a policy is shown, reused from one
/// decision to the next (one allocation per worker, not per decision).
pub struct Machine {
    view: sdk::View,
}

impl Default for Machine {
    fn default() -> Machine {
        Machine::new()
    }
}

impl Machine {
    /// A machine with an empty view.
    pub fn new() -> Machine {
        Machine { view: decision::empty_view() }
    }

    /// One turn at a decision point: early dropping at batch formation (when
    /// `at_batch` gives the latency table the head is judged by, see
    /// [`crate::pipeline::late_at_batch`]), then a decision ([`decision::prepare`],
    /// [`decision::ask`], [`decision::apply`]: expiry, the policy, validation, the
    /// safe fallback), again at once while a decision only dropped (each such
    /// decision removes at least one request, so this ends). The requests that leave
    /// unserved go to `driver` ([`Driver::dropped`]); each decision is reported
    /// ([`Driver::decided`]).
    ///
    /// Every decision of a turn is made at `cx.now`: a decision that only dropped
    /// and the one after it are one instant, live as in virtual time.
    // Inlined into each driver's turn: the simulator makes millions of them.
    #[inline]
    pub fn decide<Q, I, D>(
        &mut self,
        items: &mut I,
        policy: &mut WorkerPolicy,
        cx: &Context,
        at_batch: Option<&[u64]>,
        driver: &mut D,
    ) -> Turn<Q>
    where
        Q: Queued,
        I: Items<Q> + ?Sized,
        D: Driver<Q> + ?Sized,
    {
        loop {
            if let Some(table) = at_batch {
                drop_late_at_batch(items, table, cx.now, driver);
            }
            let (d, left) = items.decide(policy, cx, &mut self.view);
            let by_safe = d.by_safe;
            for r in d.expired {
                driver.dropped(r, DropReason::Expired, by_safe);
            }
            for r in d.dropped {
                driver.dropped(r, DropReason::Policy, by_safe);
            }
            driver.decided(policy, Report { fault: d.fault, by_safe, decide_time: d.decide_time });
            let action = match d.ruling {
                Ruling::Again => continue,
                Ruling::Run { model, batch } => Action::Run { model, batch },
                Ruling::Wait(t) => Action::Wait(t),
                Ruling::Idle { expire_at } => Action::Idle { expire_at },
            };
            return Turn { action, left, by_safe };
        }
    }
}

/// Early dropping at batch formation (`early_drop_at = "batch"`, the reference's
/// `pop_while_first_expires`): while the head of the queue would finish past its
/// deadline even if it ran now, in the batch the queue makes (its length, at most
/// the table's largest batch: [`finish_at_batch`]), it is taken out before the
/// policy forms a batch, so it costs the worker no time. The driver may walk past a
/// request instead ([`Driver::walk_past`]). The reference advances its pointer past
/// a dropped request and so skips the next one; this judges every head. Judged
/// under one hold of the queue's lock, so the request judged is the one removed.
fn drop_late_at_batch<Q, I, D>(items: &mut I, table: &[u64], now: u64, driver: &mut D)
where
    Q: Queued,
    I: Items<Q> + ?Sized,
    D: Driver<Q> + ?Sized,
{
    items.with(|v| {
        let mut at = 0;
        while let Some(r) = v.get(at) {
            let Some(finish) = finish_at_batch(now, v.len(), table) else { return };
            let head = r.pending();
            let late = finish > head.deadline;
            if driver.walk_past(&head, finish, late) {
                at += 1;
            } else if late {
                driver.dropped(v.remove(at), DropReason::EarlyAtBatch, false);
            } else {
                return;
            }
        }
    });
}

/// A batch that is over: the model it ran on, its size, when it started and
/// finished (µs on the driver's clock), and whether the executor failed on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Finished {
    /// The model id.
    pub model: u32,
    /// The number of requests in the batch.
    pub size: u32,
    /// When it started.
    pub started: u64,
    /// When it finished (or failed).
    pub finished: u64,
    /// Whether the executor failed on it: its requests are dropped
    /// ([`DropReason::ExecutorError`]) and all count as missed for the policy.
    pub failed: bool,
}

impl Finished {
    /// A batch of `batch` that ran on `model` from `started` to `finished`.
    pub fn of<Q>(model: u32, batch: &[Q], started: u64, finished: u64, failed: bool) -> Finished {
        Finished { model, size: batch.len() as u32, started, finished, failed }
    }

    /// Whether a request of the batch due at `deadline` was served on time
    /// ([`decision::met`]; never when the batch failed).
    pub fn on_time(&self, deadline: u64) -> bool {
        !self.failed && decision::met(self.finished, deadline)
    }

    /// How request `r` of the batch ended, `variant` being the model's name: served
    /// on time or late, or dropped for the executor's error.
    pub fn outcome<Q: Queued>(&self, r: &Q, variant: &str) -> Outcome {
        if self.failed {
            return Outcome::Dropped(DropReason::ExecutorError);
        }
        Outcome::Served { variant: variant.to_string(), batch: self.size, on_time: self.on_time(r.pending().deadline) }
    }

    /// What the batch tells the policy that formed it (`observe`): a request is
    /// missed when it finished past its deadline, and every request is missed when
    /// the executor failed.
    pub fn feedback<Q: Queued>(&self, batch: &[Q]) -> sdk::Outcome {
        decision::outcome(self.model, batch, self.started, self.finished, self.failed)
    }

    /// Gives the policy that formed the batch its feedback ([`Finished::feedback`],
    /// worked out only for a component that observes: RAMSIS does not, and the
    /// simulator's Twitter run worked out 216k feedbacks for it to throw away).
    /// `policy` is None when the driver says that policy is gone (a swap replaced it
    /// while the batch ran): the new one is told nothing about a batch it did not
    /// form. True when a component was told; its fault when `observe` failed.
    pub fn observe<Q: Queued>(&self, batch: &[Q], policy: Option<&mut WorkerPolicy>) -> Result<bool, PolicyFault> {
        match policy {
            Some(WorkerPolicy::Wasm(instance)) if instance.observes() => {
                instance.observe(&self.feedback(batch)).map(|()| true)
            }
            Some(WorkerPolicy::Wasm(_) | WorkerPolicy::Safe) | None => Ok(false),
        }
    }
}

/// Gives `feedback` ([`Finished::feedback`], worked out before the batch's requests
/// were answered and moved) to the policy that formed the batch, as
/// [`Finished::observe`] does.
pub fn observe(policy: Option<&mut WorkerPolicy>, feedback: &sdk::Outcome) -> Result<bool, PolicyFault> {
    match policy {
        Some(WorkerPolicy::Wasm(instance)) => instance.observe(feedback).map(|()| true),
        Some(WorkerPolicy::Safe) | None => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A queued request: (id, arrival); its deadline is arrival + 100.
    #[derive(Debug, PartialEq)]
    struct R(u64, u64);

    impl Queued for R {
        fn pending(&self) -> sdk::Pending {
            sdk::Pending { id: self.0, arrival: self.1, deadline: self.1 + 100 }
        }
    }

    /// Records what the machine hands over.
    #[derive(Default)]
    struct Log {
        dropped: Vec<(u64, DropReason)>,
        reports: Vec<Report>,
        /// Request ids to walk past at batch formation.
        walk_past: Vec<u64>,
    }

    impl Driver<R> for Log {
        fn dropped(&mut self, request: R, reason: DropReason, _by_safe: bool) {
            self.dropped.push((request.0, reason));
        }
        fn decided(&mut self, _policy: &mut WorkerPolicy, report: Report) {
            self.reports.push(report);
        }
        fn walk_past(&mut self, head: &sdk::Pending, _finish: u64, _late: bool) -> bool {
            self.walk_past.contains(&head.id)
        }
    }

    fn models() -> Vec<sdk::Model> {
        vec![sdk::Model { id: 0, name: "m".into(), accuracy: 0.5, latency: vec![10, 15, 20] }]
    }

    fn cx<'a>(now: u64, models: &'a [sdk::Model], loaded: &'a [u32]) -> Context<'a> {
        Context {
            now,
            worker: 0,
            workers: 1,
            load_qps: 0.0,
            loaded,
            models,
            expire_us: 50,
            draining: false,
            timed: false,
        }
    }

    fn turn(q: &mut Vec<R>, now: u64, loaded: &[u32], at_batch: Option<&[u64]>, log: &mut Log) -> Turn<R> {
        let models = models();
        Machine::new().decide(q, &mut WorkerPolicy::Safe, &cx(now, &models, loaded), at_batch, log)
    }

    #[test]
    fn expires_then_runs_the_largest_batch_that_fits() {
        let mut q = vec![R(1, 0), R(2, 100), R(3, 110), R(4, 120), R(5, 130)];
        let mut log = Log::default();
        // At 160 request 1 (deadline 100) is 60 past its deadline > expire_us 50.
        let t = turn(&mut q, 160, &[0], None, &mut log);
        assert_eq!(log.dropped, vec![(1, DropReason::Expired)]);
        // Head deadline 200 at 160: L(3) = 20 fits, so the largest batch is 3.
        assert_eq!(t.action, Action::Run { model: 0, batch: vec![R(2, 100), R(3, 110), R(4, 120)] });
        assert_eq!((t.left, t.by_safe), (1, true));
        assert_eq!(log.reports.len(), 1);
        assert!(log.reports[0].fault.is_none() && log.reports[0].decide_time == Some(Duration::ZERO));
    }

    #[test]
    fn an_empty_queue_idles_and_asks_nothing() {
        let mut log = Log::default();
        let t = turn(&mut Vec::new(), 0, &[0], Some(&[10]), &mut log);
        assert_eq!(t.action, Action::Idle { expire_at: None });
        assert!(log.dropped.is_empty() && log.reports[0].decide_time.is_none());
    }

    #[test]
    fn nothing_loaded_idles_until_the_head_expires() {
        let mut q = vec![R(1, 0)];
        let mut log = Log::default();
        let t = turn(&mut q, 10, &[], None, &mut log);
        // Deadline 100 + expire_us 50 + 1.
        assert_eq!(t.action, Action::Idle { expire_at: Some(151) });
        assert_eq!(q, vec![R(1, 0)]);
    }

    #[test]
    fn late_at_batch_formation_leaves_before_the_policy_decides() {
        // At 85 a queue of three makes a batch of 3 (20 µs): request 1 (deadline 100)
        // would finish at 105, late: dropped. Then two make a batch of 2 (15 µs),
        // 100 ≤ 110: request 2 stays, and the policy serves both.
        let mut q = vec![R(1, 0), R(2, 10), R(3, 20)];
        let mut log = Log::default();
        let t = turn(&mut q, 85, &[0], Some(&[10, 15, 20]), &mut log);
        assert_eq!(log.dropped, vec![(1, DropReason::EarlyAtBatch)]);
        assert_eq!(t.action, Action::Run { model: 0, batch: vec![R(2, 10), R(3, 20)] });
        // Without the table nothing is judged at batch formation.
        let mut q = vec![R(1, 0), R(2, 10), R(3, 20)];
        let mut log = Log::default();
        turn(&mut q, 85, &[0], None, &mut log);
        assert!(log.dropped.is_empty());
    }

    #[test]
    fn a_driver_may_walk_past_a_request_at_batch_formation() {
        // At 95 a batch of 3 finishes at 115: 1 and 2 are late. Walking past 1 keeps
        // it queued; 2 is dropped; 3 (deadline 120) then finishes in a batch of two at
        // 110: on time, the walk stops.
        let mut q = vec![R(1, 0), R(2, 10), R(3, 20)];
        let mut log = Log { walk_past: vec![1], ..Log::default() };
        let models = models();
        let cx = cx(95, &models, &[]);
        Machine::new().decide(&mut q, &mut WorkerPolicy::Safe, &cx, Some(&[10, 15, 20]), &mut log);
        assert_eq!(log.dropped, vec![(2, DropReason::EarlyAtBatch)]);
        assert_eq!(q, vec![R(1, 0), R(3, 20)]);
    }

    /// A shared queue: another worker takes the head, and a request arrives, while
    /// this worker's policy decides (the live host's queue lock is not held then).
    struct Shared {
        queue: Vec<R>,
        looks: u32,
    }

    impl Items<R> for Shared {
        fn with<T>(&mut self, f: impl FnOnce(&mut Vec<R>) -> T) -> T {
            self.looks += 1;
            if self.looks == 2 {
                self.queue.remove(0);
                self.queue.push(R(9, 60));
            }
            f(&mut self.queue)
        }
    }

    #[test]
    fn a_decision_that_removed_nothing_of_a_changed_queue_decides_again_at_once() {
        let models = models();
        let mut q = Shared { queue: vec![R(1, 50)], looks: 0 };
        let mut log = Log::default();
        let cx = cx(70, &models, &[0]);
        let t = Machine::new().decide(&mut q, &mut WorkerPolicy::Safe, &cx, None, &mut log);
        // The first decision took request 1, gone by then: nothing to run, a request
        // left, so the machine decided again (two reports) and runs request 9.
        assert_eq!(log.reports.len(), 2);
        assert_eq!(t.action, Action::Run { model: 0, batch: vec![R(9, 60)] });
        assert!(log.dropped.is_empty() && q.queue.is_empty());
    }

    #[test]
    fn a_finished_batch_says_each_outcome_by_the_one_rule() {
        // Deadlines 100 and 110; finished at 105: the first late, the second on time.
        let batch = [R(1, 0), R(2, 10)];
        let done = Finished::of(3, &batch, 80, 105, false);
        assert!(!done.on_time(100) && done.on_time(110) && done.on_time(105));
        assert_eq!(done.outcome(&batch[1], "v"), Outcome::Served { variant: "v".into(), batch: 2, on_time: true });
        assert_eq!(done.outcome(&batch[0], "v"), Outcome::Served { variant: "v".into(), batch: 2, on_time: false });
        let o = done.feedback(&batch);
        assert_eq!((o.model, o.size, o.started, o.finished, o.missed), (3, 2, 80, 105, 1));
        // A failed batch: every request dropped for the executor, all missed.
        let failed = Finished::of(3, &batch, 80, 90, true);
        assert!(!failed.on_time(110));
        assert_eq!(failed.outcome(&batch[1], "v"), Outcome::Dropped(DropReason::ExecutorError));
        assert_eq!(failed.feedback(&batch).missed, 2);
    }

    #[test]
    fn feedback_goes_only_to_the_policy_that_formed_the_batch() {
        let batch = [R(1, 0)];
        let done = Finished::of(0, &batch, 0, 10, false);
        // The safe policy has no use for it, and a policy the driver says is gone is
        // told nothing (a component's case: tests/worker.rs).
        assert_eq!(done.observe(&batch, Some(&mut WorkerPolicy::Safe)), Ok(false));
        assert_eq!(done.observe(&batch, None), Ok(false));
        assert_eq!(observe(None, &done.feedback(&batch)), Ok(false));
    }
}
