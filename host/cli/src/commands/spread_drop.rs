//! `sluice spread-drop max-rate`: the maximum sustainable request rates of the
//! spread-drop paper's Theorems 1 and 2 (§4.1, §4.2).
//!
//! With batch size `B` and processing time `P_B`, the scheduler forms a batch at
//! most every `P_B`, so the guarantees hold while no more than
//! - `B·(1 + M)` requests arrive in any window of `P_B` (Theorem 1: at most `M`
//!   consecutive drops, Algorithm 3), or
//! - `⌊B/(K−m)⌋·K + (B mod (K−m))` requests (Theorem 2: at most `m` drops in
//!   any `K` consecutive requests, Algorithm 4).
//!
//! The math lives in the `policy-spread-drop` crate, next to the selection it
//! bounds; this file only parses arguments and prints.

use std::fmt;
use std::str::FromStr;

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use serde::Serialize;

/// `sluice spread-drop ...`
#[derive(Debug, Args)]
pub struct SpreadDropArgs {
    /// What to compute.
    #[command(subcommand)]
    pub command: SpreadDropCommand,
}

/// The spread-drop subcommands.
#[derive(Debug, Subcommand)]
pub enum SpreadDropCommand {
    /// Print the maximum request rate that keeps an MCD or weakly-hard SLO
    /// (Theorems 1 and 2).
    MaxRate(MaxRateArgs),
}

/// `sluice spread-drop max-rate --batch B --latency P_B (--mcd M | --weakly-hard m,K)`
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("objective").required(true).args(["mcd", "weakly_hard"])))]
pub struct MaxRateArgs {
    /// The batch size B.
    #[arg(long)]
    pub batch: u32,
    /// The processing time P_B of a batch of B: a number with a unit (`40ms`,
    /// `40000us`, `0.04s`); a bare number is milliseconds.
    #[arg(long, value_parser = parse_duration_us)]
    pub latency: u64,
    /// The MCD SLO M: at most M consecutive drops (Theorem 1).
    #[arg(long)]
    pub mcd: Option<u32>,
    /// The weakly-hard SLO `m,K`: at most m drops in any K consecutive requests
    /// (Theorem 2).
    #[arg(long)]
    pub weakly_hard: Option<WeaklyHard>,
    /// The latency SLO L, to check the paper's assumption 2·P_B ≤ L (same units
    /// as --latency).
    #[arg(long, value_parser = parse_duration_us)]
    pub slo: Option<u64>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// A weakly-hard constraint `(m, K)`, written `m,K`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct WeaklyHard {
    /// Drops allowed per window.
    pub m: u32,
    /// The window, in requests.
    pub k: u32,
}

impl FromStr for WeaklyHard {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (m, k) = s.split_once(',').ok_or_else(|| format!("expected m,K (e.g. 3,5), got `{s}`"))?;
        let m: u32 = m.trim().parse().map_err(|e| format!("m in `{s}`: {e}"))?;
        let k: u32 = k.trim().parse().map_err(|e| format!("K in `{s}`: {e}"))?;
        if m >= k {
            return Err(format!("weakly-hard ({m}, {k}) needs m < K"));
        }
        Ok(WeaklyHard { m, k })
    }
}

/// Parses `40ms`, `40000us`, `40000µs`, `0.04s` or a bare number of
/// milliseconds into microseconds.
pub fn parse_duration_us(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (number, scale) = if let Some(n) = s.strip_suffix("us").or_else(|| s.strip_suffix("µs")) {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1e6)
    } else {
        (s, 1e3)
    };
    let value: f64 = number.trim().parse().map_err(|e| format!("duration `{s}`: {e}"))?;
    let us = (value * scale).round();
    if !(us.is_finite() && us >= 1.0) {
        return Err(format!("duration `{s}` must be at least 1 µs"));
    }
    Ok(us as u64)
}

/// The answer of `max-rate`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MaxRate {
    /// Which theorem: 1 (MCD) or 2 (weakly hard).
    pub theorem: u8,
    /// The batch size B.
    pub batch: u32,
    /// P_B in microseconds.
    pub processing_us: u64,
    /// The MCD SLO, for Theorem 1.
    pub mcd: Option<u32>,
    /// The weakly-hard SLO, for Theorem 2.
    pub weakly_hard: Option<WeaklyHard>,
    /// The most requests that may arrive in any window of P_B.
    pub max_per_interval: u64,
    /// The same as a rate, requests per second.
    pub max_rate_per_s: f64,
    /// Whether 2·P_B ≤ L holds, when --slo was given.
    pub assumption_holds: Option<bool>,
}

impl fmt::Display for MaxRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let slo = match (self.mcd, self.weakly_hard) {
            (Some(m), _) => format!("MCD ≤ {m}"),
            (_, Some(w)) => format!("weakly-hard ({}, {})", w.m, w.k),
            _ => String::new(),
        };
        writeln!(
            f,
            "Theorem {} ({slo}, B = {}, P_B = {} µs): at most {} requests in any {} µs window",
            self.theorem, self.batch, self.processing_us, self.max_per_interval, self.processing_us
        )?;
        write!(f, "maximum sustainable rate: {:.3} requests/s", self.max_rate_per_s)?;
        if self.assumption_holds == Some(false) {
            write!(f, "\nwarning: 2·P_B exceeds the latency SLO L; the guarantee assumes 2·P_B ≤ L (§3.1)")?;
        }
        Ok(())
    }
}

/// Computes the maximum rate for `args`.
pub fn max_rate(args: &MaxRateArgs) -> Result<MaxRate> {
    if args.batch == 0 {
        bail!("--batch must be at least 1");
    }
    let (theorem, max_per_interval) = match (args.mcd, args.weakly_hard) {
        (Some(m), None) => (1, policy_spread_drop::max_per_interval_mcd(args.batch, m)),
        (None, Some(w)) => match policy_spread_drop::max_per_interval_weakly_hard(args.batch, w.m, w.k) {
            Some(n) => (2, n),
            None => bail!("weakly-hard ({}, {}) needs m < K", w.m, w.k),
        },
        _ => bail!("give exactly one of --mcd and --weakly-hard"),
    };
    Ok(MaxRate {
        theorem,
        batch: args.batch,
        processing_us: args.latency,
        mcd: args.mcd,
        weakly_hard: args.weakly_hard,
        max_per_interval,
        max_rate_per_s: max_per_interval as f64 * 1e6 / args.latency as f64,
        assumption_holds: args.slo.map(|l| args.latency.saturating_mul(2) <= l),
    })
}

/// Runs `sluice spread-drop ...`, printing to stdout.
pub fn run(args: SpreadDropArgs) -> Result<()> {
    match args.command {
        SpreadDropCommand::MaxRate(args) => {
            let answer = max_rate(&args)?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&answer)?);
            } else {
                println!("{answer}");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: SpreadDropArgs,
    }

    fn parse(line: &str) -> Result<MaxRateArgs, clap::Error> {
        let words = std::iter::once("sluice").chain(line.split_whitespace());
        Cli::try_parse_from(words).map(|cli| match cli.args.command {
            SpreadDropCommand::MaxRate(a) => a,
        })
    }

    #[test]
    fn durations_take_units() {
        assert_eq!(parse_duration_us("40ms"), Ok(40_000));
        assert_eq!(parse_duration_us("40"), Ok(40_000));
        assert_eq!(parse_duration_us("2500us"), Ok(2_500));
        assert_eq!(parse_duration_us("0.04s"), Ok(40_000));
        assert!(parse_duration_us("0us").is_err());
        assert!(parse_duration_us("fast").is_err());
    }

    #[test]
    fn theorem_1_rate() {
        let a = parse("max-rate --batch 8 --latency 40ms --mcd 2").unwrap();
        let r = max_rate(&a).unwrap();
        assert_eq!((r.theorem, r.max_per_interval), (1, 24));
        assert_eq!(r.max_rate_per_s, 600.0);
        assert!(r.to_string().contains("600.000 requests/s"), "{r}");
    }

    #[test]
    fn theorem_2_rate() {
        let a = parse("max-rate --batch 8 --latency 20ms --weakly-hard 3,5 --slo 100ms").unwrap();
        let r = max_rate(&a).unwrap();
        assert_eq!((r.theorem, r.max_per_interval), (2, 20));
        assert_eq!(r.max_rate_per_s, 1000.0);
        assert_eq!(r.assumption_holds, Some(true));
        let a = parse("max-rate --batch 8 --latency 60ms --weakly-hard 3,5 --slo 100ms").unwrap();
        assert!(max_rate(&a).unwrap().to_string().contains("warning"));
    }

    #[test]
    fn bad_arguments_are_refused() {
        assert!(parse("max-rate --batch 8 --latency 40ms").is_err(), "one SLO is required");
        assert!(parse("max-rate --batch 8 --latency 40ms --mcd 1 --weakly-hard 1,2").is_err());
        assert!(parse("max-rate --batch 8 --latency 40ms --weakly-hard 5,5").is_err());
        assert!(parse("max-rate --batch 8 --latency 40ms --weakly-hard 5").is_err());
        let a = parse("max-rate --batch 0 --latency 40ms --mcd 1").unwrap();
        assert!(max_rate(&a).is_err());
    }
}
