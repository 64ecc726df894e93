//! sluice-server: the live host — HTTP (the Open Inference Protocol and `/infer`),
//! the admin API, apps and their workers on tokio, the executors, metrics and the
//! server config. The engine it drives (queues, decisions, policies) is
//! `sluice_core`.
//!
//! Start here:
//! - [`config::Config`]: listen address, admin token, and the `[[app]]`s.
//! - [`state::State::build`] and [`server::run`]: build the apps and serve HTTP
//!   until a shutdown future resolves, then drain.
//! - [`http::handle`]: the request path's front door; [`admin`]: the control path
//!   ([`evaluate`]: what-if replays of recent arrivals with another policy);
//!   [`api`]: what both share at the edge (`ApiError`).
//! - [`app::App`]: admission, routing, hot swap; [`worker::run`]: the decision loop.
//! - [`executor`]: ONNX Runtime and the emulated executor behind
//!   `sluice_core::executor::Executor`; [`profiling`]: `sluice profile`.

pub(crate) mod admin;
pub mod allocation;
pub(crate) mod api;
pub mod app;
pub(crate) mod binary;
pub mod config;
pub(crate) mod conn;
pub mod dashboard;
pub(crate) mod evaluate;
pub mod executor;
pub mod grpc;
pub(crate) mod handoff;
pub(crate) mod http;
pub(crate) mod infer;
pub(crate) mod metrics;
pub mod pipeline;
pub mod profiling;
pub mod server;
pub mod state;
pub mod throttle;
pub(crate) mod turn;
pub(crate) mod worker;
