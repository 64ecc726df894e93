//! How the workers of an app share RAMSIS's work through the binding's store
//! (`sluice_sdk::shared`): keys, values and the claim protocol.
//!
//! Every worker runs its own instance, but what RAMSIS computes depends only on
//! the binding (models, SLO, K, params) and a load, so one worker computes and
//! the others take the result. Keys:
//!
//! - [`INIT_KEY`]: the initial state (params without their tables, then the
//!   policy set in binary), stored by the first `init`.
//! - `ramsis/policy/<i>`: the policy for grid load `i` ([`grid_load`]), or a
//!   mark that it cannot be generated (the MDP exceeds `max_block_values`).
//! - `ramsis/claim/<i>/<a>`: attempt `a` at generating load `i` is taken. The
//!   store's first-put-wins makes exactly one worker the claimer of an attempt.
//! - `ramsis/alive/<i>/<a>/<n>`: the `n`-th sign of life of that attempt's
//!   claimer, one every [`BEAT_US`] of host time while it generates.
//! - `ramsis/dead/<i>/<a>`: the attempt ended without a policy — its claimer
//!   dropped it (the load passed it), or a waiter heard nothing from it for
//!   [`WAIT_TIMEOUT_US`]. The next attempt may then be claimed, again by
//!   exactly one worker: after an abandonment the others still wait rather
//!   than each generating the same load.
//!
//! Values depend only on their keys (a policy for a load is the same whoever
//! generates it), as the contract asks, so decisions do not depend on which
//! worker did the work.

use sluice_sdk::{shared, Micros};

use crate::grid::Entry;
use crate::table;

/// The initial state: the first worker's `init` does the work, the others
/// read it.
pub const INIT_KEY: &str = "ramsis/init";

/// Loads planned online are rounded up to this geometric grid (1% steps), so
/// that the workers of an app, whose estimates differ slightly from call to
/// call, plan the same loads and can share each generation.
pub const LOAD_STEP: f64 = 1.01;

/// A published policy within this many grid steps above the plan's target is
/// close enough (§6's grid is coarser than that anyway).
pub const ACCEPT_ABOVE: i64 = 2;

/// How often (host µs) a worker waiting on another worker's generation looks
/// for the result, and a generating worker for a policy another attempt
/// published first.
pub const POLL_US: Micros = 10_000;

/// How often (host µs) a claimer signs that it is still generating.
pub const BEAT_US: Micros = 2_000_000;

/// How long (host µs) a waiter goes without a sign from the claimer before it
/// declares the attempt dead (the claimer may have stopped deciding). A
/// generation takes as long as it takes (a minute at 2000 QPS over 60 workers);
/// the signs, not a fixed deadline, say whether it is still running.
pub const WAIT_TIMEOUT_US: Micros = 10_000_000;

/// Attempts at one load before a worker gives up growing its grid.
pub const MAX_ATTEMPTS: u32 = 1024;

const TAG_FAILED: u8 = 0;
const TAG_POLICY: u8 = 1;

/// The grid index of the smallest grid load ≥ `load`.
pub fn load_index(load: f64) -> i64 {
    let i = (load.ln() / LOAD_STEP.ln() - 1e-9).ceil();
    if i.is_finite() {
        i as i64
    } else if i > 0.0 {
        i64::MAX / 2
    } else {
        i64::MIN / 2
    }
}

/// The load of grid index `i`.
pub fn grid_load(i: i64) -> f64 {
    LOAD_STEP.powi(i.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32)
}

fn policy_key(i: i64) -> String {
    format!("ramsis/policy/{i}")
}

fn claim_key(i: i64, a: u32) -> String {
    format!("ramsis/claim/{i}/{a}")
}

fn alive_key(i: i64, a: u32, n: u32) -> String {
    format!("ramsis/alive/{i}/{a}/{n}")
}

fn dead_key(i: i64, a: u32) -> String {
    format!("ramsis/dead/{i}/{a}")
}

/// What `ramsis/policy/<i>` holds.
pub enum Published {
    /// Nothing yet.
    None,
    /// The policy.
    Policy(Entry),
    /// Its generation cannot be done (the MDP exceeds `max_block_values`).
    Failed,
}

/// What `ramsis/policy/<i>` holds.
pub fn fetch(i: i64) -> Published {
    let Some(bytes) = shared::get(&policy_key(i)) else { return Published::None };
    match bytes.split_first() {
        Some((&TAG_POLICY, mut rest)) => match table::decode_entry(&mut rest) {
            Some(entry) => Published::Policy(entry),
            None => Published::None,
        },
        Some((&TAG_FAILED, _)) => Published::Failed,
        _ => Published::None,
    }
}

/// Publishes the policy for grid load `i`.
pub fn publish(i: i64, entry: &Entry) {
    let mut bytes = vec![TAG_POLICY];
    table::encode_entry(entry, &mut bytes);
    shared::put(&policy_key(i), &bytes);
}

/// Publishes that grid load `i` cannot be generated.
pub fn publish_failure(i: i64) {
    shared::put(&policy_key(i), &[TAG_FAILED]);
}

/// Where the attempts at a load stand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// No live attempt: attempt `a` may be claimed.
    Free(u32),
    /// Attempt `a` is claimed and not dead.
    Live(u32),
    /// [`MAX_ATTEMPTS`] attempts died.
    Exhausted,
}

/// Where the attempts at grid load `i` stand.
pub fn attempt(i: i64) -> Attempt {
    for a in 0..MAX_ATTEMPTS {
        if shared::get(&claim_key(i, a)).is_none() {
            return Attempt::Free(a);
        }
        if shared::get(&dead_key(i, a)).is_none() {
            return Attempt::Live(a);
        }
    }
    Attempt::Exhausted
}

/// Claims attempt `a` at grid load `i`; whether this worker got it.
pub fn claim(i: i64, a: u32) -> bool {
    shared::put(&claim_key(i, a), &[])
}

/// Gives sign `n` of life of attempt `a` at grid load `i`.
pub fn sign(i: i64, a: u32, n: u32) {
    shared::put(&alive_key(i, a, n), &[]);
}

/// Whether sign `n` of attempt `a` at grid load `i` was given.
pub fn signed(i: i64, a: u32, n: u32) -> bool {
    shared::get(&alive_key(i, a, n)).is_some()
}

/// Declares attempt `a` at grid load `i` dead.
pub fn bury(i: i64, a: u32) {
    shared::put(&dead_key(i, a), &[]);
}

/// Whether attempt `a` at grid load `i` is dead.
pub fn dead(i: i64, a: u32) -> bool {
    shared::get(&dead_key(i, a)).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planned_loads_round_up_to_the_grid() {
        for i in [-300, -1, 0, 1, 500, 1_000, 2_000] {
            assert_eq!(load_index(grid_load(i)), i, "grid load {i} maps back to itself");
            assert_eq!(load_index(grid_load(i) * 1.0001), i + 1, "just above grid load {i}");
        }
        let l = 2_100.0;
        assert!((l..l * LOAD_STEP).contains(&grid_load(load_index(l))));
        // Degenerate estimates give far-away indices, not a panic.
        assert!(load_index(0.0) < -1_000_000 && load_index(f64::INFINITY) > 1_000_000);
        assert!(grid_load(load_index(0.0)) >= 0.0);
    }

    #[test]
    fn attempts_follow_claims_and_burials() {
        sluice_sdk::testing::clear_shared();
        assert_eq!(attempt(7), Attempt::Free(0));
        assert!(claim(7, 0));
        assert!(!claim(7, 0), "one claimer per attempt");
        assert_eq!(attempt(7), Attempt::Live(0));
        bury(7, 0);
        assert!(dead(7, 0));
        assert_eq!(attempt(7), Attempt::Free(1));
        assert!(claim(7, 1));
        assert_eq!(attempt(7), Attempt::Live(1));
        assert!(!signed(7, 1, 0));
        sign(7, 1, 0);
        assert!(signed(7, 1, 0));
        assert!(matches!(fetch(7), Published::None));
        publish_failure(7);
        assert!(matches!(fetch(7), Published::Failed));
    }
}
