//! sluice-core: the engine the live server and the simulator share — no HTTP, no
//! networking, no simulator. A fix here is a fix in both.
//!
//! Start here:
//! - [`app_config::AppConfig`]: one app (SLO, workers, router, profile, policy), the
//!   same type in a server config and in an experiment.
//! - [`queue`]: an accepted [`queue::Request`], its one [`queue::Reply`], and the
//!   per-worker [`queue::WorkQueue`]; [`outcome::Outcome`]: how a request ended,
//!   the record live and simulated runs are compared by.
//! - [`decision::decide`]: one decision of one worker — expiry, the policy's
//!   `decide`, validation, the safe fallback — over any queue, at any clock.
//! - [`worker::Machine`]: the worker around it as an I/O-free state machine that
//!   the live worker thread and the simulator's event loops drive — what leaves
//!   the queue and why, when to decide again, what a finished batch means.
//! - [`admission::Admission`]: whether a request can be served by its deadline
//!   (predict, judge with margins, learn from batches and answers), one
//!   implementation the live app and the simulator both call with their clock.
//! - [`runtime`]: the Wasm policy runtime (compile cache, epoch deadlines, memory
//!   caps, faults, the binding's shared store); [`registry`]: built-in and uploaded
//!   policies.
//! - [`router`]: which worker's queue gets a request (round-robin, shortest-queue,
//!   shared, weighted with live weights), and the load estimate policies see.
//! - [`demand`]: per-second demand and the allocator's forecasters (EWMA, peaks).
//! - [`pipeline`]: apps whose requests flow through a rooted tree of tasks (Loki).
//! - [`profile`]: model latency/accuracy profiles.
//! - The seams: [`clock::Clock`] (wall or virtual time),
//!   [`executor::Executor`] (what runs a batch) and [`whatif::Replayer`] (a
//!   window of recorded arrivals replayed with another policy).

pub mod admission;
pub mod app_config;
pub mod clock;
pub mod decision;
pub mod demand;
pub mod executor;
pub mod file_error;
pub mod outcome;
pub mod pipeline;
pub mod profile;
pub mod queue;
pub mod registry;
pub mod router;
pub mod runtime;
pub mod tensor;
pub mod whatif;
pub mod worker;
pub mod workload;
