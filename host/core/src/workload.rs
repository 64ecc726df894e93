//! What an app's workload looks like: the arrival processes `sluice sim` draws
//! from and replays. The type is part of the app vocabulary ([`crate::app_config`]),
//! so a server config can carry the load it is meant for; generating the arrivals
//! is the simulator's (`sluice_sim::arrivals`).

use std::path::PathBuf;

use serde::Deserialize;

/// How an app's requests arrive.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum ArrivalSpec {
    /// Poisson arrivals at a constant rate.
    Poisson {
        /// Requests per second.
        rate_qps: f64,
    },
    /// Gamma inter-arrival times at a constant mean rate; `shape` < 1 is burstier
    /// than Poisson (Proteus §6.4 uses 0.05).
    Gamma {
        /// Requests per second.
        rate_qps: f64,
        /// Gamma shape k (coefficient of variation 1/√k).
        shape: f64,
    },
    /// Evenly spaced arrivals (fixed interval 1 / rate).
    Uniform {
        /// Requests per second.
        rate_qps: f64,
    },
    /// A rate trace (`t_sec qps` lines, piecewise constant) expanded to arrivals,
    /// Poisson by default.
    RateTrace {
        /// The trace file (relative to the experiment file).
        file: PathBuf,
        /// Multiplies every rate.
        #[serde(default = "one")]
        scale: f64,
        /// How arrivals are placed within each step of the trace.
        #[serde(default)]
        spacing: Spacing,
    },
    /// One line per request, `arrival_ms,qos,deadline_ms` (Proteus's traces); the
    /// deadline column is the request's own latency budget in ms.
    Requests {
        /// The trace file.
        file: PathBuf,
    },
    /// A log recorded by `sluice serve --record-arrivals`: `app,arrival_us` lines
    /// for admitted arrivals and `app,arrival_us,refused` for refused ones (this
    /// app's lines are used; times are relative to its first line; the refused ones
    /// only count in the load estimate).
    Recorded {
        /// The log file.
        file: PathBuf,
    },
}

/// How a [`ArrivalSpec::RateTrace`] places arrivals within a step of constant rate.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Spacing {
    /// A Poisson process at the step's rate (what a trace of many independent
    /// clients looks like).
    #[default]
    Poisson,
    /// Evenly spaced at the step's rate, the first at the step's start: the least
    /// queueing a trace of per-second counts allows. Loki's reference simulator reads
    /// per-request files its artifact does not include, so how it spread a second's
    /// requests is not known; the two spacings bound it (docs/results/loki).
    Even,
}

fn one() -> f64 {
    1.0
}

impl ArrivalSpec {
    /// The mean rate, when the spec has one (for reports).
    pub fn rate_qps(&self) -> Option<f64> {
        match self {
            ArrivalSpec::Poisson { rate_qps }
            | ArrivalSpec::Gamma { rate_qps, .. }
            | ArrivalSpec::Uniform { rate_qps } => Some(*rate_qps),
            _ => None,
        }
    }

    /// The same spec at another constant rate (for load sweeps); traces are unchanged.
    pub fn with_rate(&self, rate: f64) -> ArrivalSpec {
        match self.clone() {
            ArrivalSpec::Poisson { .. } => ArrivalSpec::Poisson { rate_qps: rate },
            ArrivalSpec::Gamma { shape, .. } => ArrivalSpec::Gamma { rate_qps: rate, shape },
            ArrivalSpec::Uniform { .. } => ArrivalSpec::Uniform { rate_qps: rate },
            other => other,
        }
    }

    /// Resolves a trace file's relative path against `base` (the directory of the
    /// file that names it).
    pub fn rebase(&mut self, base: &std::path::Path) {
        match self {
            ArrivalSpec::RateTrace { file, .. } | ArrivalSpec::Requests { file } | ArrivalSpec::Recorded { file }
                if file.is_relative() && !base.as_os_str().is_empty() =>
            {
                *file = base.join(&*file);
            }
            _ => {}
        }
    }

    /// The trace file, for specs that read one.
    pub fn file(&self) -> Option<&std::path::Path> {
        match self {
            ArrivalSpec::RateTrace { file, .. } | ArrivalSpec::Requests { file } | ArrivalSpec::Recorded { file } => {
                Some(file)
            }
            _ => None,
        }
    }
}
