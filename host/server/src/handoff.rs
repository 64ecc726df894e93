//! A pipeline's handoff (issue 35): the children of one finished batch enter
//! their queues together, before the next task's worker decides
//! (`sluice_core::pipeline::flow::LIVE_CHILD_ARRIVAL`; the simulator's
//! `children = "together"`).
//!
//! Live, a batch's answers leave its worker together ([`crate::worker`]'s `send`),
//! and each intermediate request's own task routes its children
//! (`PipelineApp::at_task`), on the runtime's threads. An idle worker of the next
//! task wakes at the first child pushed; without the handoff it decided then, with
//! whichever siblings happened to be queued (a race the live-vs-sim test measured:
//! 85.9 % agreement at batch formation). So the sending worker counts its batch's
//! served answers into the pipeline's [`Handoff`] before the first leaves, each
//! request's task leaves it once its children are queued ([`Hold`]), and a task
//! app's worker waits for the handoff to settle before it decides
//! ([`Handoff::settled`]). The tasks also take turns in the batch's order
//! ([`Awaited::reply`]), so that the children are queued in the order the
//! simulator queues them: the batch's first request's children first. (Each task
//! ran when the runtime got to it: among children due at the same time, the ones a
//! worker took first and the ones it dropped were the runtime's choice.)
//!
//! Routing a child takes microseconds; the wait is bounded by [`HANDOFF_WAIT_MAX`], so
//! that a runtime starved of threads (or a count a bug left behind) delays a
//! decision by at most that, never stalls it. Apart from `worker` and `pipeline` so
//! that both can name it without naming each other.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use sluice_core::queue::{Reply, Request};
use tokio::sync::{oneshot, Notify};

/// The longest a task app's worker waits for a handoff to settle before it decides
/// all the same: well above the microseconds a child's routing takes, well below
/// any task's budget.
pub const HANDOFF_WAIT_MAX: Duration = Duration::from_millis(5);

/// The served answers of a pipeline's task apps whose children are not queued yet.
/// One per pipeline, shared by its task apps (`App::handoff`).
#[derive(Default)]
pub struct Handoff {
    routing: AtomicUsize,
    settled: Notify,
    /// Served answers sent and not taken yet, by request id: their place in their
    /// batch's order.
    places: Mutex<HashMap<u64, Place>>,
}

/// A served answer's place in the order its batch's children are queued in.
struct Place {
    order: Arc<Order>,
    at: usize,
}

/// One batch's served answers, routed in the batch's order: each waits until every
/// one before it is routed (or gone).
struct Order {
    /// The first place not routed yet, and which places are.
    state: Mutex<(usize, Vec<bool>)>,
    turn: Notify,
}

impl Order {
    fn new(n: usize) -> Arc<Order> {
        Arc::new(Order { state: Mutex::new((0, vec![false; n])), turn: Notify::new() })
    }

    /// Place `at` is routed (or gone): the turn passes every routed place.
    fn done(&self, at: usize) {
        let mut state = self.state.lock();
        let (next, done) = &mut *state;
        done[at] = true;
        while *next < done.len() && done[*next] {
            *next += 1;
        }
        drop(state);
        self.turn.notify_waiters();
    }

    /// Waits until every place before `at` is routed.
    async fn turn(&self, at: usize) {
        loop {
            let notified = self.turn.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.state.lock().0 >= at {
                return;
            }
            notified.await;
        }
    }
}

impl Handoff {
    /// A handoff with nothing being routed.
    pub fn new() -> Arc<Handoff> {
        Arc::new(Handoff::default())
    }

    /// The served answers to requests `ids`, one batch's in its order, are about
    /// to leave their worker: counted before the first leaves, so that no child of
    /// theirs is decided on alone, and given their places.
    fn enter(&self, ids: &[u64]) {
        if ids.is_empty() {
            return;
        }
        let order = Order::new(ids.len());
        let mut places = self.places.lock();
        for (at, &id) in ids.iter().enumerate() {
            places.insert(id, Place { order: order.clone(), at });
        }
        self.routing.fetch_add(ids.len(), Ordering::AcqRel);
    }

    /// The place of request `id`'s served answer, taken once.
    fn take(&self, id: u64) -> Option<Place> {
        self.places.lock().remove(&id)
    }

    /// A served answer's children are queued (or it has none, or nobody took it).
    fn leave(&self, place: Option<Place>) {
        if let Some(p) = place {
            p.order.done(p.at);
        }
        if self.routing.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.settled.notify_waiters();
        }
    }

    /// Served answers whose children are not queued yet.
    pub fn routing(&self) -> usize {
        self.routing.load(Ordering::Acquire)
    }

    /// Waits until no served answer is being routed, at most `max`; false when it
    /// gave up.
    pub async fn settled(&self, max: Duration) -> bool {
        let until = tokio::time::Instant::now() + max;
        loop {
            // Interest first, then the look, so a leave between them is not missed.
            let notified = self.settled.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.routing() == 0 {
                return true;
            }
            if tokio::time::timeout_at(until, notified).await.is_err() {
                return self.routing() == 0;
            }
        }
    }
}

/// The answer of intermediate request `id` bound for a task app with a [`Handoff`]. A
/// served answer comes with its [`Hold`], which leaves the handoff when dropped; one
/// that arrives after this is dropped (its task ended, at the runtime's shutdown)
/// leaves it here, so the count never keeps an answer nobody routes.
pub struct Awaited {
    rx: oneshot::Receiver<Reply>,
    id: u64,
    handoff: Option<Arc<Handoff>>,
    taken: bool,
}

/// A served answer in the handoff, its turn come: dropped once its children are
/// queued.
#[must_use = "dropping it leaves the handoff: hold it until the children are queued"]
pub struct Hold {
    handoff: Option<Arc<Handoff>>,
    place: Option<Place>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Some(handoff) = self.handoff.take() {
            handoff.leave(self.place.take());
        }
    }
}

impl Awaited {
    /// The answer on `rx` of request `id`, queued at a task app whose served answers
    /// are counted in `handoff` (None: not counted).
    pub fn new(rx: oneshot::Receiver<Reply>, id: u64, handoff: Option<Arc<Handoff>>) -> Awaited {
        Awaited { rx, id, handoff, taken: false }
    }

    /// The answer, with the handoff's hold for a served one once its turn in the
    /// batch's order has come; Err when the worker went away without answering
    /// (stopped at the end of a shutdown).
    pub async fn reply(mut self) -> Result<(Reply, Hold), oneshot::error::RecvError> {
        let reply = (&mut self.rx).await;
        self.taken = true;
        let reply = reply?;
        let hold = match (&reply, &self.handoff) {
            (Reply::Served(_), Some(handoff)) => Hold { handoff: Some(handoff.clone()), place: handoff.take(self.id) },
            _ => Hold { handoff: None, place: None },
        };
        // Held while waiting: a task that ends here passes its turn on.
        if let Some(p) = &hold.place {
            p.order.turn(p.at).await;
        }
        Ok((reply, hold))
    }
}

impl Drop for Awaited {
    fn drop(&mut self) {
        let Some(handoff) = self.handoff.as_ref().filter(|_| !self.taken) else { return };
        // Closed first: a send after this fails (and the sender leaves the handoff);
        // one before it is taken here.
        self.rx.close();
        if let Ok(Reply::Served(_)) = self.rx.try_recv() {
            handoff.leave(handoff.take(self.id));
        }
    }
}

/// Sends `answers`, one batch's in its order (and the drops of the turn that
/// started the next); for a pipeline's task app (`handoff`), the served ones counted
/// into its handoff and given their places first. A served answer whose
/// receiver had gone leaves the handoff again.
pub fn send_answers(handoff: Option<&Handoff>, answers: impl Iterator<Item = (Request, Reply)>) {
    let Some(handoff) = handoff else {
        for (r, reply) in answers {
            r.answer(reply);
        }
        return;
    };
    let answers: Vec<_> = answers.collect();
    let served: Vec<u64> =
        answers.iter().filter(|(_, reply)| matches!(reply, Reply::Served(_))).map(|(r, _)| r.id).collect();
    handoff.enter(&served);
    for (r, reply) in answers {
        let (id, served) = (r.id, matches!(reply, Reply::Served(_)));
        if !r.answer(reply) && served {
            handoff.leave(handoff.take(id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::queue::{DropReason, Prediction, Served};
    use sluice_core::tensor::{Tensor, TensorData};

    fn served() -> Reply {
        Reply::Served(Box::new(Served {
            variant: "v".into(),
            policy: "p".into(),
            outputs: Vec::new(),
            queue_us: 0,
            latency_us: 0,
            slo_us: 0,
            deadline_met: true,
            batch_size: 1,
            worker: 0,
            audited: false,
        }))
    }

    fn request(id: u64) -> (Request, oneshot::Receiver<Reply>) {
        let (tx, rx) = oneshot::channel();
        let r = Request {
            id,
            arrival: 0,
            deadline: 0,
            predicted: Prediction::default(),
            audit: false,
            input: Tensor::new("x", vec![1, 1], TensorData::F32(vec![0.0])).unwrap(),
            reply: tx,
        };
        (r, rx)
    }

    #[tokio::test(start_paused = true)]
    async fn the_handoff_settles_when_every_served_answer_is_routed_or_gone() {
        let handoff = Handoff::new();
        let (a, rx_a) = request(1);
        let (b, rx_b) = request(2);
        let (c, rx_c) = request(3);
        let (d, rx_d) = request(4);
        // `d`'s task went away before the answer: it leaves at once.
        drop(rx_d);
        let dropped = Reply::Dropped { reason: DropReason::Expired, detail: String::new(), policy: "p".into() };
        send_answers(Some(&handoff), vec![(a, served()), (b, served()), (c, dropped), (d, served())].into_iter());
        assert_eq!(handoff.routing(), 2, "two served answers with a receiver");
        // Not settled while `a` and `b` are being routed: the wait gives up at its bound.
        assert!(!handoff.settled(Duration::from_millis(1)).await);
        let (reply, hold) = Awaited::new(rx_a, 1, Some(handoff.clone())).reply().await.unwrap();
        assert!(matches!(reply, Reply::Served(_)));
        assert_eq!(handoff.routing(), 2, "held until its children are queued");
        drop(hold);
        assert_eq!(handoff.routing(), 1);
        // `b`'s task ends without taking its answer: the answer leaves on its drop.
        drop(Awaited::new(rx_b, 2, Some(handoff.clone())));
        assert_eq!(handoff.routing(), 0);
        assert!(handoff.settled(Duration::from_millis(1)).await);
        assert!(handoff.places.lock().is_empty(), "every place taken");
        // A dropped answer carries no hold.
        let (reply, _hold) = Awaited::new(rx_c, 3, Some(handoff.clone())).reply().await.unwrap();
        assert!(matches!(reply, Reply::Dropped { .. }));
        assert_eq!(handoff.routing(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_is_routed_in_its_order_whichever_task_runs_first() {
        let handoff = Handoff::new();
        let (reqs, rxs): (Vec<_>, Vec<_>) = (1..=3).map(request).unzip();
        send_answers(Some(&handoff), reqs.into_iter().map(|r| (r, served())));
        let routed = Arc::new(Mutex::new(Vec::new()));
        // The tasks start last first; each records its id when its turn comes.
        let mut tasks = Vec::new();
        for (i, rx) in rxs.into_iter().enumerate().rev() {
            let (handoff, routed) = (handoff.clone(), routed.clone());
            tasks.push(tokio::spawn(async move {
                let (_, hold) = Awaited::new(rx, i as u64 + 1, Some(handoff)).reply().await.unwrap();
                routed.lock().push(i + 1);
                drop(hold);
            }));
            tokio::task::yield_now().await;
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*routed.lock(), [1, 2, 3]);
        assert_eq!(handoff.routing(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_gone_place_passes_its_turn_on() {
        let handoff = Handoff::new();
        let (reqs, mut rxs): (Vec<_>, Vec<_>) = (1..=2).map(request).unzip();
        send_answers(Some(&handoff), reqs.into_iter().map(|r| (r, served())));
        let second = rxs.pop().unwrap();
        let waiting = tokio::spawn({
            let handoff = handoff.clone();
            async move { Awaited::new(second, 2, Some(handoff)).reply().await.map(|_| ()) }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "the first is not routed yet");
        // The first's task ends without taking its answer.
        drop(Awaited::new(rxs.pop().unwrap(), 1, Some(handoff.clone())));
        waiting.await.unwrap().unwrap();
        assert_eq!(handoff.routing(), 0, "the second's hold dropped with its task's result");
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_worker_wakes_at_the_last_leave() {
        let handoff = Handoff::new();
        let (reqs, rxs): (Vec<_>, Vec<_>) = (1..=2).map(request).unzip();
        send_answers(Some(&handoff), reqs.into_iter().map(|r| (r, served())));
        let waiter = {
            let handoff = handoff.clone();
            tokio::spawn(async move { handoff.settled(HANDOFF_WAIT_MAX).await })
        };
        tokio::task::yield_now().await;
        let mut rxs = rxs.into_iter().enumerate();
        let (i, rx) = rxs.next().unwrap();
        drop(Awaited::new(rx, i as u64 + 1, Some(handoff.clone())).reply().await.unwrap());
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "one answer still being routed");
        let (i, rx) = rxs.next().unwrap();
        drop(Awaited::new(rx, i as u64 + 1, Some(handoff.clone())).reply().await.unwrap());
        assert!(waiter.await.unwrap(), "settled, not given up");
    }
}
