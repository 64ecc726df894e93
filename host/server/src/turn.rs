//! A worker's turn (issue 36, inline turns): what a turn needs (its state machine
//! and models, [`Core`]), held by whoever takes the turn, the worker's thread or an
//! arrival's task ([`Inline::claim`]). Apart from `worker` and `app` so that both
//! can name it without naming each other: the app claims a turn at admission and
//! runs it through the runner the worker's thread registered
//! (`App::register_inline`); the worker module holds the turns' rules.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sluice_core::executor::ModelSet;
use sluice_core::worker::Machine;

/// A decision slower than this sends the worker's turns back to its thread (see
/// `crate::worker`'s module doc): well above a Rust policy's p99 (≈ 1 µs, BENCHMARKS.md §1), so
/// only a policy that is slow or spinning toward its budget is kept off the
/// runtime's threads.
pub const INLINE_DECIDE_MAX: Duration = Duration::from_micros(200);

/// The most turns an arrival's task runs for a worker in one go; a worker still
/// busy after them is handed back to its thread, so one client's request does not
/// become the worker for everyone queued behind it.
pub const MAX_INLINE_TURNS: usize = 4;

/// What a worker's turn needs, held by whoever takes the turn: its thread while it
/// decides and executes, or an arrival's task for an inline turn. Free while the
/// thread waits.
pub struct Core {
    /// The worker's state machine.
    pub(crate) machine: Machine,
    /// The worker's models.
    pub(crate) models: ModelSet,
    /// `models.instant()`, kept with them.
    pub(crate) instant: bool,
}

/// A worker's turn, shared between its thread and the inline turns of arrivals
/// (`crate::worker`'s module doc). One per `crate::app::WorkerHandle`.
pub struct Inline {
    /// The turn itself: whoever holds the lock is the worker.
    pub(crate) core: parking_lot::Mutex<Core>,
    /// Whether inline turns may run at all: not on a `shared` queue, where several
    /// workers wait on one queue and every push must wake them.
    enabled: bool,
    /// Whether the slot's policy made its last decision within
    /// [`INLINE_DECIDE_MAX`] and without a fault (false until one has).
    pub(crate) fast: AtomicBool,
}

impl Inline {
    /// The turn of a worker with no models yet (its thread installs them); inline
    /// turns only if `enabled`.
    pub fn new(enabled: bool) -> Inline {
        Inline {
            core: parking_lot::Mutex::new(Core {
                machine: Machine::new(),
                models: ModelSet::default(),
                instant: false,
            }),
            enabled,
            fast: AtomicBool::new(false),
        }
    }

    /// Takes the worker's turn for an arrival's task if an inline turn may run now:
    /// the app is `open` (not draining nor aborted), the thread waits (the turn is
    /// free), the models answer at once and the policy's last decision was fast.
    /// The caller then queues its request without waking the thread and has the
    /// worker's turns run with it (`crate::worker::run_inline`).
    pub fn claim(&self, open: bool) -> Option<Turn<'_>> {
        if !self.enabled || !open || !self.fast.load(Ordering::Acquire) {
            return None;
        }
        let core = self.core.try_lock()?;
        core.instant.then_some(Turn(core))
    }
}

/// A worker's turn taken by [`Inline::claim`]; dropped unused, it is given back.
pub struct Turn<'a>(parking_lot::MutexGuard<'a, Core>);

impl Turn<'_> {
    /// The worker's state machine and models, held while the turn is.
    pub(crate) fn core(&mut self) -> &mut Core {
        &mut self.0
    }
}
