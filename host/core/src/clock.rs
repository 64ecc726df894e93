//! The Clock seam: the time a policy sees, in µs. The live host reads a
//! [`WallClock`] (µs since the server started); the simulator sets a
//! [`VirtualClock`] to each event's time, so the same decision code runs in both.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A source of "now" in µs.
pub trait Clock: Send + Sync {
    /// Now, in µs since the clock's origin.
    fn now(&self) -> u64;
}

/// Microseconds since the server started: the host clock policies see.
#[derive(Clone, Copy, Debug)]
pub struct WallClock {
    origin: Instant,
}

impl Default for WallClock {
    fn default() -> Self {
        WallClock { origin: Instant::now() }
    }
}

impl WallClock {
    /// The instant `us` µs after the origin (to sleep until a policy's deadline).
    pub fn instant(&self, us: u64) -> Instant {
        self.origin + Duration::from_micros(us)
    }
}

impl Clock for WallClock {
    fn now(&self) -> u64 {
        self.origin.elapsed().as_micros() as u64
    }
}

/// Virtual time: whatever the simulator's event loop set last. It only moves
/// forward, as events are processed in time order.
#[derive(Debug, Default)]
pub struct VirtualClock {
    now: AtomicU64,
}

impl VirtualClock {
    /// Moves the clock to `us` (the time of the event being processed).
    pub fn set(&self, us: u64) {
        debug_assert!(us >= self.now.load(Ordering::Relaxed), "virtual time went backwards");
        self.now.store(us, Ordering::Relaxed);
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> u64 {
        self.now.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_time_is_what_was_set() {
        let c = VirtualClock::default();
        assert_eq!(c.now(), 0);
        c.set(1500);
        assert_eq!(c.now(), 1500);
    }

    #[test]
    fn wall_instants_are_offsets_from_the_origin() {
        let c = WallClock::default();
        assert_eq!(c.instant(0) + Duration::from_micros(5), c.instant(5));
        assert!(c.instant(c.now()) <= Instant::now());
    }
}
