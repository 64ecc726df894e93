//! Requests waiting for a worker, and the answers they get.
//!
//! Every accepted request owns a one-shot reply channel; the type system makes sure
//! it is answered at most once (the sender is consumed), and the worker's loop makes
//! sure it is answered at least once: served, dropped with a reason, or rejected.

use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;
use tokio::sync::{oneshot, Notify};

use crate::tensor::Tensor;

/// Why a request was dropped instead of served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DropReason {
    /// The policy dropped it (it could not make its deadline, by the policy's judgement).
    Policy,
    /// It waited `expire_after_ms` past its deadline and the host gave up on it.
    Expired,
    /// The executor failed on its batch.
    ExecutorError,
    /// A pipeline's early dropping at batch formation: it would have finished past
    /// its task deadline even if run at once (`early_drop_at = "batch"`).
    EarlyAtBatch,
}

impl DropReason {
    /// Label used in responses and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::Policy => "policy",
            DropReason::Expired => "expired",
            DropReason::ExecutorError => "executor-error",
            DropReason::EarlyAtBatch => "early-drop-batch-formation",
        }
    }
}

/// A served request's result and its timing.
#[derive(Clone, Debug)]
pub struct Served {
    /// The variant that served it.
    pub variant: String,
    /// The policy whose decision formed the batch (`safe` for the fallback).
    pub policy: String,
    /// Output tensors for this request (leading dimension 1).
    pub outputs: Vec<Tensor>,
    /// µs from arrival to the start of the batch.
    pub queue_us: u64,
    /// µs from arrival to completion.
    pub latency_us: u64,
    /// The SLO, i.e. deadline − arrival, in µs.
    pub slo_us: u64,
    /// Whether it completed by its deadline.
    pub deadline_met: bool,
    /// Size of the batch it was served in.
    pub batch_size: usize,
    /// The worker that served it.
    pub worker: u32,
    /// Admitted as an audit of a refusal (`admission_audit`): admission predicted
    /// it would miss its deadline.
    pub audited: bool,
}

/// The one answer an accepted request gets.
#[derive(Debug)]
pub enum Reply {
    /// Served by a model.
    Served(Box<Served>),
    /// Dropped, with the reason and a detail for the client.
    Dropped {
        /// Why.
        reason: DropReason,
        /// Human-readable detail.
        detail: String,
        /// The policy in charge when it was dropped.
        policy: String,
    },
    /// Refused after acceptance (server shutting down before it could be served).
    Rejected {
        /// Why.
        message: String,
    },
}

/// How many predictions admission makes for each request ([`Prediction`]).
pub const PREDICTORS: usize = 3;

/// What admission predicted for a request when it admitted it, kept so that its
/// answer can tell how far off the prediction was ([`crate::admission::Admission::learn`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Prediction {
    /// When each of admission's predictors expected it answered (host clock, µs;
    /// 0 when none did).
    pub finish: [u64; PREDICTORS],
    /// Requests queued or running ahead of it on its worker at admission.
    pub ahead: u32,
}

/// An accepted request.
#[derive(Debug)]
pub struct Request {
    /// Host-wide unique id.
    pub id: u64,
    /// Host-clock arrival (µs).
    pub arrival: u64,
    /// `arrival + slo` (µs).
    pub deadline: u64,
    /// What admission predicted for it ([`crate::admission`]; all 0 when it
    /// made no prediction, as for a pipeline's intermediate requests).
    pub predicted: Prediction,
    /// Admitted although admission predicted it would miss its deadline, to check
    /// that prediction (`admission_audit`): its answer says whether the refusal
    /// would have been false.
    pub audit: bool,
    /// The request's one input tensor (leading dimension 1).
    pub input: Tensor,
    /// Where the answer goes.
    pub reply: oneshot::Sender<Reply>,
}

impl Request {
    /// Sends the answer; a client that went away is not an error. True when the
    /// answer reached its receiver (false: it had gone away, and the answer was
    /// dropped with the channel), for an answer whose receiver must act on it
    /// (a pipeline's handoff, `sluice_server`'s `handoff` module).
    pub fn answer(self, reply: Reply) -> bool {
        self.reply.send(reply).is_ok()
    }
}

/// A queue's length and its head request, as [`WorkQueue::head`] reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    /// Requests in the queue.
    pub len: usize,
    /// The head's arrival, host clock µs.
    pub arrival: u64,
    /// The head's deadline, host clock µs.
    pub deadline: u64,
}

/// A queue of requests for one worker (or for all workers of a `shared` app),
/// earliest deadline first.
#[derive(Default)]
pub struct WorkQueue {
    /// The requests, earliest deadline first. Every request of an app has the same
    /// SLO, so arrival order is deadline order and a push lands at the back; a
    /// pipeline's intermediate requests carry their task's budget, which changes
    /// with a re-plan, so a push finds its place from the back.
    pub items: Mutex<Vec<Request>>,
    /// Woken on every push, and on swaps and shutdown, so waiting workers re-decide.
    pub notify: Notify,
    len: AtomicUsize,
}

impl WorkQueue {
    /// Appends a request and wakes the workers waiting on this queue.
    pub fn push(&self, request: Request) {
        // Always admitted, so never handed back.
        let _ = self.push_if(request, |_, _, _| true);
    }

    /// Inserts a request in deadline order if `admit(at, request, behind)` agrees,
    /// judged under the queue's lock (so concurrent arrivals cannot all pass a check
    /// meant for one of them): `at` requests would be ahead of it, and `behind` are
    /// the queued ones it would delay (an earlier deadline admitted later: its body
    /// took longer to read). `admit` may note its prediction on the request.
    /// Otherwise hands the request back.
    // The refused request is handed back by value: boxing it would allocate on the
    // refusal path, which is the hot path under overload.
    #[allow(clippy::result_large_err)]
    pub fn push_if(
        &self,
        request: Request,
        admit: impl FnOnce(usize, &mut Request, &[Request]) -> bool,
    ) -> Result<(), Request> {
        self.push_if_then(request, true, admit)
    }

    /// As [`WorkQueue::push_if`], waking the waiting workers only if `notify`: a
    /// caller that holds the worker's turn and decides for it at once (the live
    /// host's inline turns) has nobody to wake.
    #[allow(clippy::result_large_err)]
    pub fn push_if_then(
        &self,
        mut request: Request,
        notify: bool,
        admit: impl FnOnce(usize, &mut Request, &[Request]) -> bool,
    ) -> Result<(), Request> {
        let mut items = self.items.lock();
        let at = deadline_position(&items, request.deadline);
        if !admit(at, &mut request, &items[at..]) {
            return Err(request);
        }
        items.insert(at, request);
        self.len.store(items.len(), Ordering::Relaxed);
        drop(items);
        if notify {
            self.notify.notify_waiters();
        }
        Ok(())
    }

    /// Number of queued requests (may lag by one concurrent operation).
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Whether the queue is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The length and the request at the head, read together under the lock; None
    /// when the queue is empty.
    pub fn head(&self) -> Option<Head> {
        let items = self.items.lock();
        items.first().map(|r| Head { len: items.len(), arrival: r.arrival, deadline: r.deadline })
    }

    /// Records the length after the caller changed `items` under its lock.
    pub fn sync_len(&self, items: &[Request]) {
        self.len.store(items.len(), Ordering::Relaxed);
    }
}

/// Where a request due at `deadline` goes in `items` (earliest deadline first): after
/// every request due at or before it, so requests with equal deadlines keep their
/// arrival order. Found from the back, because a new request's deadline is almost
/// always the latest (every request of an app has the same SLO). The one
/// deadline-ordered insert of the live queues ([`WorkQueue::push_if`]) and the
/// simulator's, which [`crate::decision::prepare_into`] relies on: it expires a
/// prefix of the queue, so a request out of deadline order would outlive its expiry.
pub fn deadline_position<Q: crate::decision::Queued>(items: &[Q], deadline: u64) -> usize {
    items.len() - items.iter().rev().take_while(|r| r.pending().deadline > deadline).count()
}

/// Inserts `request` into `items` in deadline order ([`deadline_position`]).
pub fn insert_by_deadline<Q: crate::decision::Queued>(items: &mut Vec<Q>, request: Q) {
    let at = deadline_position(items, request.pending().deadline);
    items.insert(at, request);
}

impl crate::decision::Queued for Request {
    fn pending(&self) -> sluice_sdk::Pending {
        sluice_sdk::Pending { id: self.id, arrival: self.arrival, deadline: self.deadline }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct R(u64, u64);

    impl crate::decision::Queued for R {
        fn pending(&self) -> sluice_sdk::Pending {
            sluice_sdk::Pending { id: self.0, arrival: 0, deadline: self.1 }
        }
    }

    #[test]
    fn an_insert_keeps_deadline_order_and_arrival_order_among_equals() {
        let mut q = vec![R(1, 100), R(2, 200), R(3, 200)];
        insert_by_deadline(&mut q, R(4, 300));
        insert_by_deadline(&mut q, R(5, 150));
        insert_by_deadline(&mut q, R(6, 200));
        insert_by_deadline(&mut q, R(7, 50));
        let ids: Vec<u64> = q.iter().map(|r| r.0).collect();
        assert_eq!(ids, [7, 1, 5, 2, 3, 6, 4]);
    }
}
