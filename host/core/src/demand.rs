//! Demand for an allocator: arrivals counted per second, and forecasters that turn
//! the recent counts into the requests/s a plan should be made for. The live host
//! and the simulator feed the same [`DemandMonitor`] (from the wall or the virtual
//! clock), so a re-plan sees the same demand in both.
//!
//! Forecasters, each as its reference computes it:
//! - [`Ewma`]: Proteus's (and Loki's) — pandas `ewm(com).mean()` (adjust = True)
//!   over the last 20 one-second counts, com = 1.6 in their configs
//!   (`core/simulator.py` of the Proteus artifact).
//! - [`PeakAhead`]: InfAdapter's margin over a peak — the highest per-second count
//!   of the last minute, raised by 10 % (the artifact raises its LSTM's forecast of
//!   the next minute's peak by 10 %; without the trained LSTM, the last minute's peak
//!   is the forecast, documented in docs/allocator.md).
//! - [`WindowPeak`]: the highest per-second count over a window, no margin.
//! - [`DecayingPercentile`]: the Kubernetes Vertical Pod Autoscaler's recommender —
//!   a percentile of every sample seen, older ones weighing less (half-life 24 h),
//!   for InfAdapter's VPA baseline.

use std::collections::VecDeque;

use parking_lot::Mutex;

/// Arrivals counted per whole second of the clock.
pub struct DemandMonitor {
    history: usize,
    state: Mutex<Counts>,
}

struct Counts {
    /// The second being counted (µs / 1e6).
    second: u64,
    /// Arrivals in it so far.
    current: u64,
    /// Completed seconds, oldest first, at most `history` of them.
    done: VecDeque<u64>,
}

impl DemandMonitor {
    /// A monitor keeping the last `history` completed seconds.
    pub fn new(history: usize) -> DemandMonitor {
        DemandMonitor {
            history: history.max(1),
            state: Mutex::new(Counts { second: 0, current: 0, done: VecDeque::new() }),
        }
    }

    /// Records an arrival at `now` (µs).
    pub fn record(&self, now: u64) {
        let mut s = self.state.lock();
        self.advance(&mut s, now);
        s.current += 1;
    }

    /// The completed seconds' counts up to `now`, oldest first (seconds with no
    /// arrival count as 0).
    pub fn per_second(&self, now: u64) -> Vec<f64> {
        let mut s = self.state.lock();
        self.advance(&mut s, now);
        s.done.iter().map(|c| *c as f64).collect()
    }

    fn advance(&self, s: &mut Counts, now: u64) {
        let second = now / 1_000_000;
        if second <= s.second {
            return;
        }
        // Close the second being counted, then any empty ones up to now.
        let gap = (second - s.second).min(self.history as u64 + 1);
        for k in 0..gap {
            let c = if k == 0 { s.current } else { 0 };
            s.done.push_back(c);
            if s.done.len() > self.history {
                s.done.pop_front();
            }
        }
        s.second = second;
        s.current = 0;
    }
}

/// Turns recent per-second counts (oldest first) into the demand to plan for.
pub trait Forecaster: Send + Sync {
    /// The forecast, requests/s (0 without history).
    fn forecast(&self, per_second: &[f64]) -> f64;

    /// Seconds of counts the forecast needs before it stands on its own: until the
    /// counts cover them, [`planned_demand`] keeps the demand that was planned for.
    fn window(&self) -> usize;
}

/// Seconds [`DecayingPercentile`] waits for: its percentile of fewer counts says
/// little (it reads every count it is given, weighing old ones less).
pub const PERCENTILE_WARMUP_S: usize = 60;

/// The demand to plan an app for, from its per-second counts since it started
/// (oldest first), floored at `min_demand`: the forecast once the counts cover
/// `warmup` seconds (None: the forecaster's window), and before that at least
/// `standing` (the configured `demand_qps`). Without it, a plan made at startup for
/// the configured demand was replaced within milliseconds by one for `min_demand`
/// (no counts yet), and the first seconds of load found the app under-provisioned.
pub fn planned_demand(
    f: &dyn Forecaster,
    per_second: &[f64],
    standing: f64,
    min_demand: f64,
    warmup: Option<usize>,
) -> f64 {
    let forecast = f.forecast(per_second);
    let d = if per_second.len() < warmup.unwrap_or_else(|| f.window()) { forecast.max(standing) } else { forecast };
    d.max(min_demand)
}

/// An exponentially weighted mean over the last `window` counts, as pandas
/// `Series.ewm(com=com).mean()` with `adjust=True` computes its last value: weights
/// (1 − α)^i for the i-th most recent count, α = 1 / (1 + com).
#[derive(Clone, Debug)]
pub struct Ewma {
    /// Centre of mass (Proteus's configs: 1.6).
    pub com: f64,
    /// Counts used (Proteus: 20).
    pub window: usize,
}

impl Default for Ewma {
    fn default() -> Self {
        Ewma { com: 1.6, window: 20 }
    }
}

impl Forecaster for Ewma {
    fn forecast(&self, per_second: &[f64]) -> f64 {
        let alpha = 1.0 / (1.0 + self.com.max(0.0));
        let recent = &per_second[per_second.len().saturating_sub(self.window)..];
        let (mut num, mut den, mut w) = (0.0, 0.0, 1.0);
        for x in recent.iter().rev() {
            num += w * x;
            den += w;
            w *= 1.0 - alpha;
        }
        if den > 0.0 {
            num / den
        } else {
            0.0
        }
    }

    fn window(&self) -> usize {
        self.window
    }
}

/// The highest count over the last `window` seconds.
#[derive(Clone, Debug)]
pub struct WindowPeak {
    /// Seconds looked at.
    pub window: usize,
}

impl Forecaster for WindowPeak {
    fn forecast(&self, per_second: &[f64]) -> f64 {
        per_second[per_second.len().saturating_sub(self.window)..].iter().copied().fold(0.0, f64::max)
    }

    fn window(&self) -> usize {
        self.window
    }
}

/// The last minute's peak raised by a margin (InfAdapter: 10 %).
#[derive(Clone, Debug)]
pub struct PeakAhead {
    /// Seconds looked at (60).
    pub window: usize,
    /// Fraction added (0.1).
    pub margin: f64,
}

impl Default for PeakAhead {
    fn default() -> Self {
        PeakAhead { window: 60, margin: 0.1 }
    }
}

impl Forecaster for PeakAhead {
    fn forecast(&self, per_second: &[f64]) -> f64 {
        WindowPeak { window: self.window }.forecast(per_second) * (1.0 + self.margin)
    }

    fn window(&self) -> usize {
        self.window
    }
}

/// A percentile of the per-second counts, each weighted 2^(−age / half-life), as
/// the Vertical Pod Autoscaler's recommender reads its decaying usage histogram
/// (target = the 90th percentile, half-life 24 h: `pkg/recommender/logic` of
/// kubernetes/autoscaler). Its safety margin is the planner's, not the forecast's.
#[derive(Clone, Debug)]
pub struct DecayingPercentile {
    /// The percentile, in (0, 1] (VPA's target: 0.9).
    pub percentile: f64,
    /// Seconds for a sample's weight to halve (VPA: 86,400).
    pub half_life_s: f64,
}

impl Default for DecayingPercentile {
    fn default() -> Self {
        DecayingPercentile { percentile: 0.9, half_life_s: 86_400.0 }
    }
}

impl Forecaster for DecayingPercentile {
    fn forecast(&self, per_second: &[f64]) -> f64 {
        let n = per_second.len();
        let mut weighted: Vec<(f64, f64)> = per_second
            .iter()
            .enumerate()
            .map(|(i, &x)| (x, (-((n - 1 - i) as f64) / self.half_life_s.max(1e-9)).exp2()))
            .collect();
        weighted.sort_by(|a, b| a.0.total_cmp(&b.0));
        let total: f64 = weighted.iter().map(|w| w.1).sum();
        let mut seen = 0.0;
        for (x, w) in &weighted {
            seen += w;
            // A relative tolerance: weights that differ in the last bits must not
            // move an exact percentile boundary.
            if seen >= self.percentile * total * (1.0 - 1e-9) {
                return *x;
            }
        }
        weighted.last().map_or(0.0, |w| w.0)
    }

    fn window(&self) -> usize {
        PERCENTILE_WARMUP_S
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_planned_demand_stands_until_the_counts_cover_the_window() {
        let f = WindowPeak { window: 3 };
        // No counts yet: the configured demand stands, not the floor.
        assert_eq!(planned_demand(&f, &[], 50.0, 1.0, None), 50.0);
        // Two seconds of 10 req/s: still the configured 50; a surge past it counts.
        assert_eq!(planned_demand(&f, &[10.0, 10.0], 50.0, 1.0, None), 50.0);
        assert_eq!(planned_demand(&f, &[10.0, 80.0], 50.0, 1.0, None), 80.0);
        // A full window: the forecast alone, floored.
        assert_eq!(planned_demand(&f, &[10.0, 10.0, 10.0], 50.0, 1.0, None), 10.0);
        assert_eq!(planned_demand(&f, &[0.0, 0.0, 0.0], 50.0, 1.0, None), 1.0);
        // A warm-up of its own: 0 forecasts from the first tick.
        assert_eq!(planned_demand(&f, &[], 50.0, 1.0, Some(0)), 1.0);
        assert_eq!(planned_demand(&f, &[10.0], 50.0, 1.0, Some(1)), 10.0);
        assert_eq!(Ewma::default().window(), 20);
        assert_eq!(PeakAhead::default().window(), 60);
        assert_eq!(DecayingPercentile::default().window(), PERCENTILE_WARMUP_S);
    }

    #[test]
    fn counts_whole_seconds_including_empty_ones() {
        let m = DemandMonitor::new(5);
        for t in [100_000, 200_000, 900_000, 1_500_000, 3_200_000] {
            m.record(t);
        }
        // Seconds 0, 1 and 2 are complete at 3.5 s: 3, 1, 0 arrivals.
        assert_eq!(m.per_second(3_500_000), vec![3.0, 1.0, 0.0]);
        // A long silence keeps only `history` zeros.
        assert_eq!(m.per_second(100_000_000), vec![0.0; 5]);
    }

    #[test]
    fn decaying_percentile_weighs_recent_seconds_more() {
        // Ten seconds: nine at 10, the last at 100. Equal weights: p90 is 10 (the
        // ninth of ten samples); a half-life of 1 s gives the last sample half the
        // total weight, so p90 is 100.
        let counts: Vec<f64> = std::iter::repeat_n(10.0, 9).chain([100.0]).collect();
        let flat = DecayingPercentile { percentile: 0.9, half_life_s: 1e12 };
        assert_eq!(flat.forecast(&counts), 10.0);
        let fast = DecayingPercentile { percentile: 0.9, half_life_s: 1.0 };
        assert_eq!(fast.forecast(&counts), 100.0);
        assert_eq!(DecayingPercentile::default().forecast(&[]), 0.0);
    }

    #[test]
    fn ewma_is_pandas_adjusted_mean() {
        // pandas: pd.Series([10, 20, 30]).ewm(com=1.6).mean().iloc[-1]
        // α = 1/2.6; weights 1, 0.615385, 0.378698 on 30, 20, 10.
        let a = 1.0 / 2.6;
        let w = [1.0, 1.0 - a, (1.0 - a) * (1.0 - a)];
        let expected = (30.0 * w[0] + 20.0 * w[1] + 10.0 * w[2]) / (w[0] + w[1] + w[2]);
        let got = Ewma::default().forecast(&[10.0, 20.0, 30.0]);
        assert!((got - expected).abs() < 1e-12, "{got} vs {expected}");
        assert!((got - 23.115727).abs() < 1e-5, "{got}");
        // Only the last `window` counts matter.
        let e = Ewma { com: 1.6, window: 2 };
        assert_eq!(e.forecast(&[1000.0, 20.0, 30.0]), e.forecast(&[20.0, 30.0]));
        assert_eq!(Ewma::default().forecast(&[]), 0.0);
    }

    #[test]
    fn peaks() {
        let counts: Vec<f64> = (0..120).map(|i| if i == 30 { 500.0 } else { 100.0 }).collect();
        assert_eq!(WindowPeak { window: 60 }.forecast(&counts), 100.0);
        assert_eq!(WindowPeak { window: 100 }.forecast(&counts), 500.0);
        assert!((PeakAhead::default().forecast(&counts) - 110.0).abs() < 1e-9);
    }
}
