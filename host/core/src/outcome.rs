//! How one request ended, in one type for the live host and the simulator: the
//! record the differential test (`tests/live_vs_sim.rs`) compares request by request.
//! The live host reads it off a request's [`Reply`] ([`Outcome::of_reply`]), or
//! off its refusal (`sluice_server::app::AdmitError::refusal`); the simulator
//! writes it when asked to keep per-request outcomes
//! (`sluice_sim::engine::Simulation::record_outcomes`).

use crate::queue::{DropReason, Reply};

/// How a request ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Served.
    Served {
        /// The variant that served it.
        variant: String,
        /// The size of its batch.
        batch: u32,
        /// Whether it finished by its deadline ([`crate::decision::met`]).
        on_time: bool,
    },
    /// Dropped instead of served, for this reason.
    Dropped(DropReason),
    /// Refused after it was accepted (a shutdown that could not serve it).
    Rejected,
    /// Refused when it arrived, never queued, for this reason.
    Refused(Refusal),
}

/// Why a request was refused when it arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// Admission predicted it would miss its deadline, or push a request queued
    /// behind it past its own (`crate::admission::Admission::verdict`).
    Overload,
    /// The app's bounded queue was full (`max_queue`).
    QueueFull,
    /// The host was shutting down.
    ShuttingDown,
}

impl Refusal {
    /// Its name in labels and metrics: `overload`, `queue-full`, `shutting-down`.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Overload => "overload",
            Refusal::QueueFull => "queue-full",
            Refusal::ShuttingDown => "shutting-down",
        }
    }
}

impl Outcome {
    /// The outcome a live answer stands for.
    pub fn of_reply(reply: &Reply) -> Outcome {
        match reply {
            Reply::Served(s) => {
                Outcome::Served { variant: s.variant.clone(), batch: s.batch_size as u32, on_time: s.deadline_met }
            }
            Reply::Dropped { reason, .. } => Outcome::Dropped(*reason),
            Reply::Rejected { .. } => Outcome::Rejected,
        }
    }

    /// One word for a summary: `on-time`, `late`, `dropped-<reason>`, `rejected`
    /// or `refused-<reason>`.
    pub fn label(&self) -> String {
        match self {
            Outcome::Served { on_time: true, .. } => "on-time".into(),
            Outcome::Served { on_time: false, .. } => "late".into(),
            Outcome::Dropped(reason) => format!("dropped-{}", reason.as_str()),
            Outcome::Rejected => "rejected".into(),
            Outcome::Refused(reason) => format!("refused-{}", reason.as_str()),
        }
    }
}
