//! Glue between the generated component bindings and the SDK's types.
//!
//! Not public API: [`export_policy!`](crate::export_policy) expands to code that
//! names items in here, so they must be `pub`, but they may change in any release.
//!
//! On `wasm32` this module holds the crate's one `wit_bindgen::generate!` for the
//! `policy` world of `wit/policy.wit`. wit-bindgen 0.63 names what it generates
//! after the WIT: the world's exports become the trait `Guest` (methods `init`,
//! `decide`, `observe`) at this module's root, the world's `use types.{...}`
//! re-exports `Config`, `View`, `Decision` and `Outcome` here (the records live in
//! `sluice::policy::types`), and the imports are the functions `log`, `shared_get`
//! and `shared_put`.

use std::cell::RefCell;

use crate::policy::Policy;
// Qualified (`sdk::View`), not imported: the generated bindings re-exported
// below define their own `Config`, `View`, `Decision` and `Outcome`.
use crate::types as sdk;

#[cfg(target_arch = "wasm32")]
// Generated code: the canonical-ABI entry points take one argument per flattened
// record field (`decide` gets 8).
#[allow(clippy::too_many_arguments)]
mod bindings {
    wit_bindgen::generate!({
        // Relative to this crate's manifest: the workspace's `wit/`, the single
        // source of truth shared with the host.
        path: "../wit",
        // The world with `status`: the host accepts it as well as plain `policy`.
        world: "policy-with-status",
        // Policy crates export through `export_policy!`, which expands in *their*
        // crate: the export macro must be `#[macro_export]`ed and every path it
        // generates must be absolute (`::sluice_sdk::wit::...`), so that policy
        // crates need no direct dependency on wit-bindgen.
        pub_export_macro: true,
        export_macro_name: "__export_policy_world",
        default_bindings_module: "::sluice_sdk::wit",
        runtime_path: "::sluice_sdk::wit::__rt",
    });
}

#[cfg(target_arch = "wasm32")]
pub use bindings::*;

/// The wit-bindgen runtime, re-exported for the generated code (see `runtime_path`).
#[cfg(target_arch = "wasm32")]
pub use wit_bindgen::rt as __rt;

/// The per-instance home of a policy: empty until `init` succeeds.
///
/// One component instance serves one worker and is single-threaded, so the
/// export macro keeps one `PolicyCell` in a `thread_local!` (on wasm32 without
/// threads that is a plain global).
pub struct PolicyCell<P>(RefCell<Option<P>>);

impl<P: Policy> PolicyCell<P> {
    /// An empty cell.
    #[allow(clippy::new_without_default)] // `const` for `thread_local!`'s const init.
    pub const fn new() -> Self {
        PolicyCell(RefCell::new(None))
    }

    /// Builds the policy; on failure the cell stays as it was (a second `init`
    /// of the same instance replaces the policy only when it succeeds).
    pub fn init(&self, config: sdk::Config) -> Result<(), String> {
        #[cfg(target_arch = "wasm32")]
        install_panic_hook();
        let policy = P::init(config)?;
        *self.0.borrow_mut() = Some(policy);
        Ok(())
    }

    /// Forwards to [`Policy::decide`]; [`sdk::Decision::Idle`] before a successful `init`.
    pub fn decide(&self, view: &sdk::View) -> sdk::Decision {
        match self.0.borrow_mut().as_mut() {
            Some(policy) => policy.decide(view),
            None => sdk::Decision::Idle,
        }
    }

    /// Forwards to [`Policy::status`]; `{}` before a successful `init`.
    pub fn status(&self) -> String {
        match self.0.borrow().as_ref() {
            Some(policy) => policy.status(),
            None => "{}".to_string(),
        }
    }

    /// Forwards to [`Policy::observe`]; ignored before a successful `init`.
    pub fn observe(&self, outcome: &sdk::Outcome) {
        if let Some(policy) = self.0.borrow_mut().as_mut() {
            policy.observe(outcome);
        }
    }
}

// Conversions between the generated records and the SDK's. They move the
// vectors' contents (the element types differ, so each list is rebuilt; at the
// queue depths policies see, 32 entries of 24 bytes, that is noise next to the
// canonical-ABI lift itself).
/// The first words of the log line a panicking policy writes just before it
/// traps (`panic = "abort"`): the host keeps that line as the fault's detail.
pub const PANIC_PREFIX: &str = "policy panicked: ";

/// Sends a panic's message to the host's log before the instance aborts, so the
/// fault the host records says why (a trap alone only says where).
#[cfg(target_arch = "wasm32")]
fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            // The import itself, not `crate::log`: that module calls this one, and
            // modules depend one way. Level 0 is WIT's error (`log::Level::Error`).
            log(0, &format!("{PANIC_PREFIX}{info}"));
        }));
    });
}

#[cfg(target_arch = "wasm32")]
mod convert {
    use super::bindings::sluice::policy::types as w;
    use crate::types as s;

    impl From<w::Model> for s::Model {
        fn from(m: w::Model) -> Self {
            s::Model { id: m.id, name: m.name, accuracy: m.accuracy, latency: m.latency }
        }
    }

    impl From<w::Pending> for s::Pending {
        fn from(p: w::Pending) -> Self {
            s::Pending { id: p.id, arrival: p.arrival, deadline: p.deadline }
        }
    }

    impl From<w::View> for s::View {
        fn from(v: w::View) -> Self {
            s::View {
                now: v.now,
                worker: v.worker,
                workers: v.workers,
                load_qps: v.load_qps,
                loaded: v.loaded,
                queue: v.queue.into_iter().map(Into::into).collect(),
            }
        }
    }

    impl From<w::Config> for s::Config {
        fn from(c: w::Config) -> Self {
            s::Config {
                app: c.app,
                slo: c.slo,
                workers: c.workers,
                worker: c.worker,
                models: c.models.into_iter().map(Into::into).collect(),
                params: c.params,
            }
        }
    }

    impl From<w::Outcome> for s::Outcome {
        fn from(o: w::Outcome) -> Self {
            s::Outcome { model: o.model, size: o.size, started: o.started, finished: o.finished, missed: o.missed }
        }
    }

    impl From<s::Decision> for w::Decision {
        fn from(d: s::Decision) -> Self {
            match d {
                s::Decision::Dispatch(d) => {
                    w::Decision::Dispatch(w::Dispatch { model: d.model, take: d.take, drop: d.drop })
                }
                s::Decision::WaitUntil(t) => w::Decision::WaitUntil(t),
                s::Decision::Idle => w::Decision::Idle,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Config, Decision, Outcome, View};

    struct Counter {
        decided: u32,
        observed: u32,
    }

    impl Policy for Counter {
        fn init(config: Config) -> Result<Self, String> {
            if config.params == "fail" {
                return Err("counter: asked to fail".into());
            }
            Ok(Counter { decided: 0, observed: 0 })
        }

        fn decide(&mut self, _view: &View) -> Decision {
            self.decided += 1;
            Decision::WaitUntil(u64::from(self.decided * 1000 + self.observed))
        }

        fn observe(&mut self, _outcome: &Outcome) {
            self.observed += 1;
        }
    }

    fn config(params: &str) -> Config {
        Config { app: "a".into(), slo: 1000, workers: 1, worker: 0, models: vec![], params: params.into() }
    }

    fn view() -> View {
        View { now: 0, worker: 0, workers: 1, load_qps: 0.0, loaded: vec![], queue: vec![] }
    }

    const OUTCOME: Outcome = Outcome { model: 0, size: 1, started: 0, finished: 1, missed: 0 };

    #[test]
    fn slot_is_idle_until_init_succeeds() {
        let slot: PolicyCell<Counter> = PolicyCell::new();
        slot.observe(&OUTCOME);
        assert_eq!(slot.decide(&view()), Decision::Idle);
        assert_eq!(slot.init(config("fail")), Err("counter: asked to fail".into()));
        assert_eq!(slot.decide(&view()), Decision::Idle);
        slot.init(config("")).expect("init");
        assert_eq!(slot.decide(&view()), Decision::WaitUntil(1000));
        slot.observe(&OUTCOME);
        assert_eq!(slot.decide(&view()), Decision::WaitUntil(2001));
        // A failed re-init keeps the running policy.
        assert!(slot.init(config("fail")).is_err());
        assert_eq!(slot.decide(&view()), Decision::WaitUntil(3001));
    }
}
