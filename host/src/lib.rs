//! sluice: an inference-serving host whose scheduling policies are WebAssembly
//! components, swapped while traffic flows.
//!
//! Start here:
//! - [`config::Config`]: apps, models, workers, router, policy, executor.
//! - [`server::State::build`] and [`server::run`]: build the apps and serve HTTP
//!   until a shutdown future resolves, then drain.
//! - [`app::App`]: admission, routing, hot swap; [`worker::run`]: the decision loop.
//! - [`runtime`]: the Wasm policy runtime (compile cache, epoch deadlines, memory
//!   caps, faults); [`registry`]: built-in and uploaded policies.
//! - [`executor`]: ONNX Runtime and the emulated executor; [`profile`]: model
//!   latency/accuracy profiles; [`profiling`]: `sluice profile`.

pub mod admin;
pub mod app;
pub mod config;
pub mod decision;
pub mod executor;
pub mod http;
pub mod loadgen;
pub mod metrics;
pub mod model_switching_cli;
pub mod profile;
pub mod profiling;
pub mod queue;
pub mod ramsis_cli;
pub mod registry;
pub mod runtime;
pub mod server;
pub mod sim;
pub mod spread_drop_cli;
pub mod tensor;
pub mod worker;
