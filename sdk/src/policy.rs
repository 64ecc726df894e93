//! The trait every sluice policy implements.

use crate::types::{Config, Decision, Outcome, View};

/// A scheduling policy for one worker.
///
/// The host creates one instance per worker (one Wasm instance each), calls
/// [`Policy::init`] once, then [`Policy::decide`] at every decision point (a
/// request arrived, a batch finished, a timer the policy asked for fired) and
/// [`Policy::observe`] after each batch it dispatched completes. Instances
/// never share memory, so per-worker state simply lives in `self`.
///
/// A policy is a pure function of what it is given: no clock, no randomness
/// (seed it through [`Config::params`]), no I/O. The same policy therefore
/// decides identically in the live host, in the simulator and in
/// [`testing::Harness`](crate::testing::Harness).
pub trait Policy: Sized + 'static {
    /// Prepares the policy for one worker. An `Err` rejects the policy (a hot
    /// swap is refused and the old policy stays) and its message is shown to the
    /// operator, so name the problem: `"fixed: unknown model `x`; valid: a, b"`.
    fn init(config: Config) -> Result<Self, String>;

    /// Decides what the worker does next. The host validates the answer (model
    /// loaded, indices distinct and in range, batch within the model's profile)
    /// and replaces an invalid one with [`helpers::safe_decision`](crate::helpers::safe_decision).
    ///
    /// This runs on the serving path: keep it cheap (microseconds), and move
    /// anything that depends only on the config or the load into `init` or a cache.
    fn decide(&mut self, view: &View) -> Decision;

    /// Learns how a dispatched batch went. The default ignores it.
    fn observe(&mut self, outcome: &Outcome) {
        let _ = outcome;
    }

    /// Whether [`Policy::observe`] does anything. A policy that keeps the default
    /// `observe` may say `false`: the component then records it (the custom section
    /// `sluice:hints`) and the host skips the call after every batch, one Wasm call
    /// per batch saved (a sixth of a what-if replay's time with jellyfish). Leave it
    /// `true` when `observe` is overridden: with `false` it is never called.
    const OBSERVES: bool = true;

    /// Describes the policy's state for operators as a JSON object (shown per
    /// worker by `GET /admin/apps/{app}`). The default is `{}`.
    fn status(&self) -> String {
        "{}".to_string()
    }
}
