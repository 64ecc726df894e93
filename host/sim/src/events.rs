//! The simulator's event queue, shared by the single-app engine
//! ([`crate::engine`]) and the simulated pipeline ([`crate::pipeline`]).
//!
//! Every event source of a run — a worker, the allocator's tick, a pipeline's next
//! arrival, re-plan or window — has at most one event that can still do something
//! at a time: a worker's batch completion while it is busy, else the timer its last
//! decision armed (a later decision re-arms or clears it); the one next arrival; the
//! one next tick. So the queue has one *slot* per source, each holding at most one
//! event, and the driver keeps what the event carries (a finished batch's requests)
//! in its own state for that source, not in the queue. Setting a slot replaces its
//! event; the replaced entry stays in the heap and is skipped when it comes up.
//!
//! This replaced, in both drivers, a heap of (time, sequence number) with a side
//! table of payloads keyed by sequence number, measured as a third of a single-app
//! run's wall time: every event paid a map insert and remove, and every re-armed
//! timer stayed queued until it fired and was found stale.
//!
//! Order: an event's [`key`] is `time << 64 | sequence number`, the sequence number
//! taken by the driver when it schedules (one counter per run), so events come out
//! by time and ties break by scheduling order — exactly the order the heap of
//! (time, sequence number) gave. The drivers rely on that for byte-identical results.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// A slot's key when it holds no event; greater than every real key, so
/// [`Events::peek`] returning it means the queue is empty.
pub(crate) const EMPTY: u128 = u128::MAX;

/// What a worker's one slot holds, kept by the driver beside the slot's key. A
/// worker has at most one event that can still do something: its batch's
/// completion while it is busy (nothing decides for a busy worker: an arrival only
/// queues, a timer is not armed), else the timer of its last decision (every
/// decision sets the slot again: re-armed, replaced by a batch's completion, or
/// cleared). So a timer that comes up is always the worker's current one, and the
/// batch's requests (`R`) stay with the worker instead of travelling through the
/// queue.
pub(crate) enum Pending<R> {
    /// Nothing scheduled.
    None,
    /// The batch that runs, and when it started.
    Done { model: u32, batch: Vec<R>, started: u64 },
    /// The timer the last decision armed.
    Timer,
}

/// An event's key: earlier times first, then lower sequence numbers (scheduling
/// order, so ties are deterministic).
pub(crate) fn key(at: u64, seq: u64) -> u128 {
    (u128::from(at) << 64) | u128::from(seq)
}

/// The time of an event whose key is `key` (not [`EMPTY`]).
pub(crate) fn time(key: u128) -> u64 {
    (key >> 64) as u64
}

/// The event queue: per slot at most one event, ordered by [`key`].
pub(crate) struct Events {
    /// (key, slot), earliest key on top. An entry whose slot now holds another key
    /// (its event was replaced or taken) is stale and skipped.
    heap: BinaryHeap<Reverse<(u128, u32)>>,
    /// Per slot, the key of its event ([`EMPTY`]: none).
    keys: Vec<u128>,
}

impl Events {
    /// A queue of `slots` empty slots.
    pub(crate) fn new(slots: usize) -> Events {
        Events { heap: BinaryHeap::with_capacity(slots), keys: vec![EMPTY; slots] }
    }

    /// Adds empty slots until there are `slots` (a pipeline's workers come and go
    /// with its plans; a slot is never removed, as a worker's index is kept).
    pub(crate) fn grow(&mut self, slots: usize) {
        if slots > self.keys.len() {
            self.keys.resize(slots, EMPTY);
        }
    }

    /// Sets slot `k`'s event to `key` ([`EMPTY`] for none), replacing what it held.
    pub(crate) fn set(&mut self, k: usize, key: u128) {
        self.keys[k] = key;
        if key != EMPTY {
            self.heap.push(Reverse((key, k as u32)));
        }
    }

    /// The earliest event's key and slot (its key [`EMPTY`] when there is none).
    /// Drops the stale entries it passes.
    pub(crate) fn peek(&mut self) -> (u128, usize) {
        while let Some(&Reverse((key, k))) = self.heap.peek() {
            if self.keys[k as usize] == key {
                return (key, k as usize);
            }
            self.heap.pop();
        }
        (EMPTY, 0)
    }

    /// Takes slot `k`'s event (the one [`Events::peek`] just gave) out of the queue.
    pub(crate) fn pop(&mut self, k: usize) {
        self.heap.pop();
        self.keys[k] = EMPTY;
    }

    /// Takes the earliest event out of the queue: its key and slot, or `None` when
    /// the queue is empty.
    pub(crate) fn next(&mut self) -> Option<(u128, usize)> {
        let (key, k) = self.peek();
        if key == EMPTY {
            return None;
        }
        self.pop(k);
        Some((key, k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn by_time_then_scheduling_order() {
        let mut q = Events::new(3);
        q.set(0, key(20, 1));
        q.set(1, key(10, 2));
        q.set(2, key(10, 3));
        assert_eq!(q.next(), Some((key(10, 2), 1)));
        assert_eq!(q.next(), Some((key(10, 3), 2)));
        assert_eq!(q.next(), Some((key(20, 1), 0)));
        assert_eq!(q.next(), None);
    }

    #[test]
    fn a_replaced_or_cleared_event_never_comes_up() {
        let mut q = Events::new(2);
        q.set(0, key(5, 1));
        q.set(1, key(7, 2));
        // Re-armed later: the entry at 5 is stale.
        q.set(0, key(9, 3));
        // Cleared: the entry at 7 is stale.
        q.set(1, EMPTY);
        assert_eq!(q.next(), Some((key(9, 3), 0)));
        assert_eq!(q.next(), None);
        assert_eq!(time(key(9, 3)), 9);
    }

    #[test]
    fn grows_without_disturbing_events() {
        let mut q = Events::new(1);
        q.set(0, key(4, 1));
        q.grow(3);
        q.set(2, key(3, 2));
        assert_eq!(q.next(), Some((key(3, 2), 2)));
        assert_eq!(q.next(), Some((key(4, 1), 0)));
        assert_eq!(q.next(), None);
    }
}
