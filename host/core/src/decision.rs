//! One decision of one worker, independent of the clock and the executor: the live
//! worker loop (wall time, real queues) and the simulator (virtual time) both call
//! [`decide`], so a policy sees the same views and its answers are validated and
//! applied the same way in both.

use std::time::{Duration, Instant};

use sluice_sdk as sdk;

use crate::runtime::{PolicyFault, PolicyInstance};

/// The name of the built-in safe policy ([`WorkerPolicy::Safe`]): what answers report as
/// `policy` for its decisions, what `policy = "safe"` selects in an experiment or a
/// what-if, and a name no component may take ([`crate::registry::RESERVED`]).
pub const SAFE_POLICY: &str = "safe";

/// The policy a worker runs.
pub enum WorkerPolicy {
    /// A Wasm component instance.
    Wasm(Box<PolicyInstance>),
    /// The built-in safe policy (after an unbind, or when none could be bound).
    Safe,
}

impl WorkerPolicy {
    /// Name for responses and metrics.
    pub fn name(&self) -> &str {
        match self {
            WorkerPolicy::Wasm(i) => &i.compiled().name,
            WorkerPolicy::Safe => SAFE_POLICY,
        }
    }
}

/// Requests a policy may let expire without dispatching or dropping anything before
/// it is counted as faulting ([`PolicyFault::Stalled`]). A policy that serves too
/// slowly still dispatches, and one that sheds load drops: only a policy that has
/// stopped acting on its queue reaches this. Sixteen is past the odd request a
/// deliberate wait loses, and low enough that a stuck policy is seen within about
/// one SLO of traffic on a busy worker.
pub const STALL_LIMIT: u64 = 16;

/// What the decision core needs to know about a queued request.
pub trait Queued {
    /// Its id, arrival and deadline as the policy sees them.
    fn pending(&self) -> sdk::Pending;
}

/// Everything about the worker a decision depends on, besides its queue and policy.
pub struct Context<'a> {
    /// Now (µs on the host or virtual clock).
    pub now: u64,
    /// The worker's index.
    pub worker: u32,
    /// Workers of the app.
    pub workers: u32,
    /// The app's arrival-rate estimate.
    pub load_qps: f64,
    /// Model ids loaded on the worker.
    pub loaded: &'a [u32],
    /// Every model of the app.
    pub models: &'a [sdk::Model],
    /// The host drops a request this long past its deadline.
    pub expire_us: u64,
    /// At shutdown an idle answer on a non-empty queue is replaced by the safe
    /// decision, so the queue drains.
    pub draining: bool,
    /// Whether to time the policy's `decide` ([`Decided::decide_time`]): the live
    /// host's histogram and `sluice sim`'s decide seconds want it; a what-if replay
    /// does not, and two clock reads are a measurable share of a native decision.
    pub timed: bool,
}

/// One decision's ruling: what the worker does next, or [`Ruling::Again`] (decide
/// again at once). A worker's turn ([`crate::worker::Machine::decide`]) resolves
/// `Again` and answers a [`crate::worker::Action`], which has no `Again`: the two
/// stay apart so that the drivers never match a case they cannot get.
#[derive(Debug)]
pub enum Ruling<Q> {
    /// Execute this batch on this model.
    Run {
        /// The model id.
        model: u32,
        /// The requests, in the policy's order.
        batch: Vec<Q>,
    },
    /// Wait for an arrival or until this instant (capped at the head's expiry).
    Wait(u64),
    /// Decide again at once: the policy only dropped (each such decision removes at
    /// least one request, so this ends), and what is left may be servable now.
    Again,
    /// Wait for an arrival, or until `expire_at` when the queue is not empty.
    Idle {
        /// When the head of the queue expires (None: the queue is empty).
        expire_at: Option<u64>,
    },
}

/// The result of one decision.
#[derive(Debug)]
pub struct Decided<Q> {
    /// What to do next (the decision's ruling).
    pub ruling: Ruling<Q>,
    /// Requests the host expired (waited past deadline + `expire_us`).
    pub expired: Vec<Q>,
    /// Requests the policy dropped.
    pub dropped: Vec<Q>,
    /// The fault, when the policy's answer was replaced by the safe decision.
    pub fault: Option<PolicyFault>,
    /// Whether the safe policy decided (a fault, the draining rule, or `WorkerPolicy::Safe`).
    pub by_safe: bool,
    /// Time spent in the policy's `decide` (None when the queue was empty and no
    /// decision was asked for; zero when the context is not [`Context::timed`]).
    pub decide_time: Option<Duration>,
}

/// Expires, asks the policy (when the queue is not empty), validates the answer
/// (`check_decision`; a fault or invalid answer becomes the safe decision) and
/// removes the taken and dropped requests from `items`, which must be in
/// earliest-deadline order: [`prepare`], [`ask`] and [`apply`] in one go, for a
/// caller that owns the queue (the simulator). The live host calls the three
/// itself, so the queue's lock is not held while the policy runs.
pub fn decide<Q: Queued>(policy: &mut WorkerPolicy, items: &mut Vec<Q>, cx: &Context) -> Decided<Q> {
    decide_with(policy, items, cx, &mut empty_view())
}

/// [`decide`] building the view in `scratch` (overwritten): a caller that decides
/// millions of times (the simulator) keeps one and allocates no view per decision.
pub fn decide_with<Q: Queued>(
    policy: &mut WorkerPolicy,
    items: &mut Vec<Q>,
    cx: &Context,
    scratch: &mut sdk::View,
) -> Decided<Q> {
    let (expired, any) = prepare_into(items, cx, scratch);
    let asked = any.then(|| ask(policy, scratch, cx));
    apply(items, expired, asked.map(|a| (&*scratch, a)), policy, cx)
}

/// A view with nothing in it, for [`decide_with`]'s scratch.
pub fn empty_view() -> sdk::View {
    sdk::View { now: 0, worker: 0, workers: 0, load_qps: 0.0, loaded: Vec::new(), queue: Vec::new() }
}

/// The first step of a decision, under the queue's lock: host expiry (whatever the
/// policy does, no request waits forever), then the view the policy will see (None
/// when nothing is left to decide on).
pub fn prepare<Q: Queued>(items: &mut Vec<Q>, cx: &Context) -> (Vec<Q>, Option<sdk::View>) {
    let mut view = empty_view();
    let (expired, any) = prepare_into(items, cx, &mut view);
    (expired, any.then_some(view))
}

/// [`prepare`] into `view` (its vectors reused); false when nothing is left to
/// decide on (`view` is then stale).
pub fn prepare_into<Q: Queued>(items: &mut Vec<Q>, cx: &Context, view: &mut sdk::View) -> (Vec<Q>, bool) {
    let cut = items.partition_point(|r| r.pending().deadline + cx.expire_us < cx.now);
    let expired: Vec<Q> = items.drain(..cut).collect();
    if items.is_empty() {
        return (expired, false);
    }
    view.now = cx.now;
    view.worker = cx.worker;
    view.workers = cx.workers;
    view.load_qps = cx.load_qps;
    view.loaded.clear();
    view.loaded.extend_from_slice(cx.loaded);
    view.queue.clear();
    view.queue.extend(items.iter().map(Queued::pending));
    (expired, true)
}

/// The policy's answer to a view, checked.
#[derive(Debug)]
pub struct Asked {
    /// The decision to apply (the safe one after a fault).
    pub decision: sdk::Decision,
    /// The fault, when the policy's answer was replaced by the safe decision.
    pub fault: Option<PolicyFault>,
    /// Whether the safe policy decided.
    pub by_safe: bool,
    /// Time spent in the policy's `decide` (zero when not [`Context::timed`]).
    pub decide_time: Duration,
}

/// The second step, without the queue's lock: asks the policy and validates its
/// answer; a fault or an invalid answer becomes the safe decision, and so does an
/// idle answer while draining (so the queue drains).
pub fn ask(policy: &mut WorkerPolicy, view: &sdk::View, cx: &Context) -> Asked {
    let started = cx.timed.then(Instant::now);
    let answer = match policy {
        WorkerPolicy::Wasm(instance) => instance.decide(view),
        WorkerPolicy::Safe => Ok(sdk::helpers::safe_decision(cx.models, view)),
    };
    let decide_time = started.map_or(Duration::ZERO, |t| t.elapsed());
    let checked = answer.and_then(|d| match sdk::helpers::check_decision(cx.models, view, &d) {
        Ok(()) => Ok(d),
        Err(e) => Err(PolicyFault::Invalid(e.to_string())),
    });
    let mut asked = match checked {
        Ok(decision) => Asked { decision, fault: None, by_safe: matches!(policy, WorkerPolicy::Safe), decide_time },
        Err(fault) => Asked {
            decision: sdk::helpers::safe_decision(cx.models, view),
            fault: Some(fault),
            by_safe: true,
            decide_time,
        },
    };
    if cx.draining && matches!(asked.decision, sdk::Decision::Idle) {
        asked.decision = sdk::helpers::safe_decision(cx.models, view);
        asked.by_safe = true;
    }
    asked
}

/// The last step, under the queue's lock again: removes the taken and dropped
/// requests from `items`. Indices refer to `view`; the queue may have changed since
/// (arrivals inserted in deadline order, or a request taken by another worker of a
/// shared queue, or rejected at the end of a shutdown), so requests are found by id,
/// and one that is gone is left out.
pub fn apply<Q: Queued>(
    items: &mut Vec<Q>,
    expired: Vec<Q>,
    asked: Option<(&sdk::View, Asked)>,
    policy: &mut WorkerPolicy,
    cx: &Context,
) -> Decided<Q> {
    let mut out = Decided {
        ruling: Ruling::Idle { expire_at: None },
        expired,
        dropped: Vec::new(),
        fault: None,
        by_safe: matches!(policy, WorkerPolicy::Safe),
        decide_time: None,
    };
    let Some((view, asked)) = asked else {
        out.fault = watch_stall(policy, &out);
        return out;
    };
    out.fault = asked.fault;
    out.by_safe = asked.by_safe;
    out.decide_time = Some(asked.decide_time);
    out.ruling = match asked.decision {
        sdk::Decision::Dispatch(d) => {
            let [batch, dropped] = take(items, view, [&d.take, &d.drop]);
            out.dropped = dropped;
            if batch.is_empty() {
                if items.is_empty() {
                    Ruling::Idle { expire_at: None }
                } else {
                    Ruling::Again
                }
            } else {
                Ruling::Run { model: d.model, batch }
            }
        }
        // A wait never outlasts the head's host expiry: that request must be answered.
        sdk::Decision::WaitUntil(t) => {
            let head_expiry = items.first().map(|r| r.pending().deadline + cx.expire_us + 1);
            Ruling::Wait(head_expiry.map_or(t, |e| t.min(e)))
        }
        sdk::Decision::Idle => {
            Ruling::Idle { expire_at: items.first().map(|r| r.pending().deadline + cx.expire_us + 1) }
        }
    };
    if out.fault.is_none() {
        out.fault = watch_stall(policy, &out);
    }
    out
}

/// Counts the requests that expired while the component policy neither dispatched nor
/// dropped; at [`STALL_LIMIT`] the decision carries a [`PolicyFault::Stalled`] (and
/// the count starts again). The safe policy and a decision that acted reset it.
fn watch_stall<Q>(policy: &mut WorkerPolicy, d: &Decided<Q>) -> Option<PolicyFault> {
    let WorkerPolicy::Wasm(instance) = policy else { return None };
    if d.by_safe || !d.dropped.is_empty() || matches!(d.ruling, Ruling::Run { .. } | Ruling::Again) {
        instance.expired_idle = 0;
        return None;
    }
    instance.expired_idle += d.expired.len() as u64;
    if instance.expired_idle < STALL_LIMIT {
        return None;
    }
    let n = std::mem::take(&mut instance.expired_idle);
    Some(PolicyFault::Stalled(n))
}

/// Removes the requests at each list of `indices` of `view` from `items`, in the
/// order of its list (the indices were checked to be in range and distinct).
fn take<Q: Queued, const N: usize>(items: &mut Vec<Q>, view: &sdk::View, indices: [&[u32]; N]) -> [Vec<Q>; N] {
    if indices.iter().all(|l| l.is_empty()) {
        return std::array::from_fn(|_| Vec::new());
    }
    let unchanged =
        items.len() == view.queue.len() && items.iter().zip(&view.queue).all(|(r, p)| r.pending().id == p.id);
    // The common answer (the safe policy's, RAMSIS's): the head of an unchanged
    // queue, nothing else. The same result as below without a slot per queued
    // request: a third of a native simulated decision's allocations.
    if unchanged
        && indices[1..].iter().all(|l| l.is_empty())
        && indices[0].iter().enumerate().all(|(k, &i)| i as usize == k)
    {
        let head = items.drain(..indices[0].len()).collect();
        let mut taken = std::array::from_fn(|_| Vec::new());
        taken[0] = head;
        return taken;
    }
    let at: std::collections::HashMap<u64, usize> = if unchanged {
        std::collections::HashMap::new()
    } else {
        items.iter().enumerate().map(|(k, r)| (r.pending().id, k)).collect()
    };
    let position = |i: u32| if unchanged { Some(i as usize) } else { at.get(&view.queue[i as usize].id).copied() };
    let mut slots: Vec<Option<Q>> = items.drain(..).map(Some).collect();
    let taken = indices.map(|list| list.iter().filter_map(|&i| position(i).and_then(|k| slots[k].take())).collect());
    items.extend(slots.into_iter().flatten());
    taken
}

/// Whether a request that finished at `finished` met its deadline (the one rule the
/// live host and the simulator count on-time and late requests by).
pub fn met(finished: u64, deadline: u64) -> bool {
    finished <= deadline
}

/// What a finished batch tells the policy that formed it (`observe`): a request is
/// missed when it finished past its deadline, and every request is missed when the
/// executor failed on the batch.
pub fn outcome<Q: Queued>(model: u32, batch: &[Q], started: u64, finished: u64, failed: bool) -> sdk::Outcome {
    let missed =
        if failed { batch.len() } else { batch.iter().filter(|r| !met(finished, r.pending().deadline)).count() };
    sdk::Outcome { model, size: batch.len() as u32, started, finished, missed: missed as u32 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct R(u64, u64);

    impl Queued for R {
        fn pending(&self) -> sdk::Pending {
            sdk::Pending { id: self.0, arrival: self.1, deadline: self.1 + 100 }
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
            timed: true,
        }
    }

    #[test]
    fn expires_then_serves_with_the_safe_policy() {
        let models = models();
        let mut q = vec![R(1, 0), R(2, 100), R(3, 110), R(4, 120), R(5, 130)];
        // At 160 request 1 (deadline 100) is 60 past its deadline > 50: expired.
        let d = decide(&mut WorkerPolicy::Safe, &mut q, &cx(160, &models, &[0]));
        assert_eq!(d.expired, vec![R(1, 0)]);
        assert!(d.by_safe && d.fault.is_none());
        match d.ruling {
            // Head deadline 200, now 160: L(3) = 20 fits, the largest batch is 3.
            Ruling::Run { model: 0, batch } => assert_eq!(batch, vec![R(2, 100), R(3, 110), R(4, 120)]),
            other => panic!("{other:?}"),
        }
        assert_eq!(q, vec![R(5, 130)]);
    }

    #[test]
    fn outcome_counts_what_finished_past_its_deadline() {
        // Deadlines 100, 110, 120; finished at 110: the first is missed.
        let batch = [R(1, 0), R(2, 10), R(3, 20)];
        let o = outcome(4, &batch, 50, 110, false);
        assert_eq!((o.model, o.size, o.started, o.finished, o.missed), (4, 3, 50, 110, 1));
        assert_eq!(outcome(4, &batch, 50, 60, true).missed, 3);
    }

    #[test]
    fn an_empty_queue_asks_nothing() {
        let models = models();
        let mut q: Vec<R> = vec![];
        let d = decide(&mut WorkerPolicy::Safe, &mut q, &cx(0, &models, &[0]));
        assert!(matches!(d.ruling, Ruling::Idle { expire_at: None }));
        assert!(d.decide_time.is_none());
    }

    #[test]
    fn nothing_loaded_idles_until_the_head_expires() {
        let models = models();
        let mut q = vec![R(1, 0)];
        let d = decide(&mut WorkerPolicy::Safe, &mut q, &cx(10, &models, &[]));
        assert!(matches!(d.ruling, Ruling::Idle { expire_at: Some(151) }), "{:?}", d.ruling);
        assert_eq!(q.len(), 1);
    }
}
