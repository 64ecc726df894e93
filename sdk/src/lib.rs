//! Write sluice scheduling policies in plain Rust and export them as WebAssembly
//! components that implement the `sluice:policy@0.1.0` contract (`wit/policy.wit`).
//!
//! Start here:
//! 1. [`Policy`]: the trait a policy implements (`init`, `decide`, `observe`).
//! 2. [`types`]: what a policy sees ([`Config`], [`View`], [`Pending`], [`Model`],
//!    [`Outcome`]) and what it answers ([`Decision`], [`Dispatch`]).
//! 3. [`helpers`]: slack, batch sizing, model choice, and [`helpers::safe_decision`],
//!    the built-in fallback the host uses when a policy faults.
//! 4. [`export_policy!`]: one line that turns the policy into a component.
//! 5. [`shared`]: a store the instances of one binding (every worker of the app)
//!    share, for work that depends only on `params` and the app.
//! 6. [`testing`] (native only): drive a policy on hand-made views and replay an
//!    arrival trace in virtual time, without building Wasm.
//!
//! A complete policy, serving every batch with the fastest loaded model:
//!
//! ```
//! use sluice_sdk::{helpers, Config, Decision, Policy, View};
//!
//! pub struct Fastest {
//!     config: Config,
//! }
//!
//! impl Policy for Fastest {
//!     fn init(config: Config) -> Result<Self, String> {
//!         Ok(Self { config })
//!     }
//!
//!     fn decide(&mut self, view: &View) -> Decision {
//!         match helpers::fastest_model(&self.config.models, &view.loaded) {
//!             Some(model) if !view.queue.is_empty() => {
//!                 let batch = helpers::largest_feasible_batch(model, view);
//!                 Decision::serve_head(model.id, batch)
//!             }
//!             _ => Decision::Idle,
//!         }
//!     }
//! }
//!
//! // In the policy crate's lib.rs (crate-type = ["cdylib", "rlib"]); it expands to
//! // nothing on the native target, so `cargo test` of the crate still works.
//! sluice_sdk::export_policy!(Fastest);
//! ```
//!
//! Build the component with
//! `cargo build --target wasm32-unknown-unknown --profile policy -p <crate>`
//! (the workspace links wasm32 guests with `wasm-component-ld`, so the output
//! `.wasm` already is a component whose only imports are the sluice contract).

// Lets the paths the generated bindings use (`::sluice_sdk::wit::...`) resolve
// inside this crate as well as in the policy crates that expand the export macro.
extern crate self as sluice_sdk;

pub mod helpers;
mod log;
mod policy;
pub mod shared;
#[cfg(not(target_arch = "wasm32"))]
pub mod testing;
pub mod types;
#[doc(hidden)]
pub mod wit;

pub use log::{log, Level, LogOnChange};
pub use policy::Policy;
pub use types::{Config, Decision, Dispatch, HostSettings, Micros, Model, Outcome, Pending, View, HOST_PARAMS_KEY};

/// Exports a [`Policy`] implementation as the sluice policy component.
///
/// Invoke it once, at the root of the policy crate, with the policy type:
///
/// ```ignore
/// sluice_sdk::export_policy!(MyPolicy);
/// ```
///
/// On `wasm32` it defines the component's `init`, `decide` and `observe` exports:
/// `init` builds the policy with [`Policy::init`] and keeps it for the life of
/// the instance (one instance serves one worker); `decide` and `observe`
/// forward to it. A `decide` before a successful `init` answers
/// [`Decision::Idle`] and an `observe` before it is ignored, so a host that
/// ignored a failed `init` still gets a valid answer. On every other target it
/// expands to nothing, which keeps native unit tests of the policy crate building.
#[macro_export]
macro_rules! export_policy {
    ($policy:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            // The generated export macro takes an identifier, so the policy type is
            // wrapped in a local unit struct whose `Guest` impl forwards to it.
            struct __SluicePolicyComponent;

            ::std::thread_local! {
                // A component instance is single-threaded, so this is a plain
                // global; `thread_local!` only spares us an `unsafe impl Sync`.
                static __SLUICE_SLOT: $crate::wit::PolicyCell<$policy> =
                    const { $crate::wit::PolicyCell::new() };
            }

            impl $crate::wit::Guest for __SluicePolicyComponent {
                fn init(config: $crate::wit::Config) -> ::core::result::Result<(), ::std::string::String> {
                    __SLUICE_SLOT.with(|slot| slot.init(config.into()))
                }

                fn decide(view: $crate::wit::View) -> $crate::wit::Decision {
                    __SLUICE_SLOT.with(|slot| slot.decide(&view.into())).into()
                }

                fn observe(outcome: $crate::wit::Outcome) {
                    __SLUICE_SLOT.with(|slot| slot.observe(&outcome.into()))
                }

                fn status() -> ::std::string::String {
                    __SLUICE_SLOT.with(|slot| slot.status())
                }
            }

            $crate::wit::__export_policy_world!(
                __SluicePolicyComponent with_types_in $crate::wit
            );

            // The host's hints (format 1; whether `observe` is used): see
            // `sluice_core::runtime::HINTS_SECTION`.
            #[link_section = "sluice:hints"]
            #[used]
            static __SLUICE_HINTS: [u8; 2] = [1, <$policy as $crate::Policy>::OBSERVES as u8];
        };
    };
}
