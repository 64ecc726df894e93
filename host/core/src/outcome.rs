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
    /// Every refusal, in the order the dashboard's drops chart draws them.
    pub const ALL: [Refusal; 3] = [Refusal::QueueFull, Refusal::Overload, Refusal::ShuttingDown];

    /// Its name in HTTP answers (the `reason` of a 429 or 503 body), logs and
    /// labels: `overload`, `queue-full`, `shutting-down`.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Overload => "overload",
            Refusal::QueueFull => "queue-full",
            Refusal::ShuttingDown => "shutting-down",
        }
    }

    /// Its value of `sluice_requests_total`'s `outcome` label: `rejected-overload`,
    /// `rejected-queue-full`, `rejected-shutdown`. Not `rejected-` + [`Refusal::as_str`]:
    /// the values are older than the type, and loadgen's `server_count`, the
    /// Grafana dashboard (`deploy/grafana`) and the benches select by them, so
    /// they stay as they were.
    pub fn metric_label(self) -> &'static str {
        match self {
            Refusal::Overload => "rejected-overload",
            Refusal::QueueFull => "rejected-queue-full",
            Refusal::ShuttingDown => "rejected-shutdown",
        }
    }
}

/// Every drop reason, in the order the dashboard's drops chart draws them
/// ([`Outcome::unserved_metric_labels`]).
pub const DROP_REASONS: [DropReason; 4] =
    [DropReason::Policy, DropReason::Expired, DropReason::ExecutorError, DropReason::EarlyAtBatch];

/// Fails to compile when [`DropReason`] gains a variant [`DROP_REASONS`] lacks.
const _: fn(DropReason) = |r| match r {
    DropReason::Policy | DropReason::Expired | DropReason::ExecutorError | DropReason::EarlyAtBatch => {}
};

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

    /// `sluice_requests_total`'s `outcome` value for a request served by its deadline.
    pub const METRIC_SERVED: &'static str = "served";
    /// `sluice_requests_total`'s `outcome` value for a request served past its deadline.
    pub const METRIC_LATE: &'static str = "late";

    /// Its value of `sluice_requests_total`'s `outcome` label, the status its
    /// client got: `served`, `late` (200), `dropped-<reason>` (504; 500 for
    /// `dropped-executor-error`), [`Refusal::metric_label`] (429, 503). A request
    /// rejected after it was accepted counts as a shutdown refusal,
    /// `rejected-shutdown`: its client gets the same 503.
    pub fn metric_label(&self) -> String {
        match self {
            Outcome::Served { on_time: true, .. } => Outcome::METRIC_SERVED.into(),
            Outcome::Served { on_time: false, .. } => Outcome::METRIC_LATE.into(),
            Outcome::Dropped(reason) => format!("dropped-{}", reason.as_str()),
            Outcome::Rejected => Refusal::ShuttingDown.metric_label().into(),
            Outcome::Refused(reason) => reason.metric_label().into(),
        }
    }

    /// The `outcome` values of `sluice_requests_total` for requests not served:
    /// every drop reason's ([`DROP_REASONS`]), then every refusal's
    /// ([`Refusal::ALL`]). The dashboard draws these (it reads them from
    /// `/admin/dashboard`, so it names no outcome itself).
    pub fn unserved_metric_labels() -> Vec<String> {
        let dropped = DROP_REASONS.iter().map(|&r| Outcome::Dropped(r).metric_label());
        dropped.chain(Refusal::ALL.iter().map(|r| r.metric_label().to_string())).collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The metric values are what loadgen, the benches, Grafana and the
    /// dashboard select by: they must not move.
    #[test]
    fn metric_labels_are_the_published_ones() {
        assert_eq!(
            Outcome::unserved_metric_labels(),
            [
                "dropped-policy",
                "dropped-expired",
                "dropped-executor-error",
                "dropped-early-drop-batch-formation",
                "rejected-queue-full",
                "rejected-overload",
                "rejected-shutdown",
            ]
        );
        let served = |on_time| Outcome::Served { variant: "v".into(), batch: 1, on_time };
        assert_eq!(served(true).metric_label(), "served");
        assert_eq!(served(false).metric_label(), "late");
        assert_eq!(Outcome::Rejected.metric_label(), "rejected-shutdown");
        assert_eq!(Outcome::Refused(Refusal::Overload).label(), "refused-overload");
        let names: Vec<&str> = Refusal::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(names, ["queue-full", "overload", "shutting-down"]);
    }
}
