//! Arrival-count distributions `PF(k, T)` (RAMSIS §3.1.1, §4.4.2).
//!
//! The MDP only ever asks one question of the arrival process: how many
//! arrivals fall into an interval of length `T`. Its transition probabilities
//! multiply such counts over non-overlapping intervals, which is exact only
//! for processes with *independent and stationary increments* (§4.4.2): a
//! count over `[a, b)` must not depend on what happened before `a`, and its
//! law must depend only on `b - a`. [`ArrivalCounts`] is that interface;
//! [`Poisson`] and [`GammaPoisson`] implement it.

use serde::{Deserialize, Serialize};

/// Probabilities below this are treated as zero when a count distribution is
/// truncated to its support, and transition columns whose largest entry is
/// below it are not stored. Dropped mass ends up in the full-queue state
/// (which takes `1 - Σ` of every row, so rows still sum to 1), and is bounded
/// by this value times the number of dropped entries (a few thousand): ~1e-15
/// of probability, invisible in the expectations. Lowering it to 1e-22 grows
/// the §7.3.2 case's blocks by about a third and changes no digit of the
/// fidelity case.
pub const NEGLIGIBLE: f64 = 1e-18;

/// The pmf of the number of arrivals in an interval, restricted to the counts
/// where it is not negligible.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CountPmf {
    /// The smallest count with a stored probability.
    pub lo: usize,
    /// `p[i]` is `P(count = lo + i)`.
    pub p: Vec<f64>,
}

impl CountPmf {
    /// `P(count = k)`.
    pub fn at(&self, k: usize) -> f64 {
        k.checked_sub(self.lo).and_then(|i| self.p.get(i)).copied().unwrap_or(0.0)
    }

    /// The largest count with a stored probability (`lo - 1` when empty).
    pub fn hi(&self) -> usize {
        (self.lo + self.p.len()).saturating_sub(1)
    }
}

/// A distribution of arrival counts over intervals, for an arrival process
/// with independent stationary increments (RAMSIS §4.4.2: "it holds for a
/// general class of processes called Lévy processes").
pub trait ArrivalCounts: Send + Sync {
    /// `ln P(k arrivals in an interval of `t_us` µs)` at mean rate `rate` per µs.
    /// May be `-inf`. Used where the artifact's semantics depend on `f64`
    /// underflow (the phase weights of interval A, see `transitions`).
    fn ln_pmf(&self, rate: f64, t_us: f64, k: usize) -> f64;

    /// `out[i] = ln_pmf(rate, t_us, first + i)`: the same values bit for bit,
    /// for a run of counts at once (the phase weights need `K` of them per
    /// state). Implementations may share work between the counts.
    fn ln_pmf_run(&self, rate: f64, t_us: f64, first: usize, out: &mut [f64]) {
        for (i, o) in out.iter_mut().enumerate() {
            *o = self.ln_pmf(rate, t_us, first + i);
        }
    }

    /// The pmf over counts `0..=k_max` for an interval of `t_us` µs, truncated
    /// to the entries of at least [`NEGLIGIBLE`].
    fn pmf(&self, rate: f64, t_us: f64, k_max: usize) -> CountPmf;
}

/// Which arrival process the MDP assumes (the `arrivals` option).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Arrivals {
    /// A Poisson process (the paper's and the artifact's assumption, §7).
    #[default]
    Poisson,
    /// A Poisson process run on a Gamma-subordinator clock: negative-binomial
    /// counts with variance `mean · (1 + dispersion)` over every interval.
    /// See [`GammaPoisson`].
    GammaPoisson {
        /// Extra dispersion `c ≥ 0`: the index of dispersion (variance/mean) of
        /// every count is `1 + c`. `c = 0` is Poisson.
        dispersion: f64,
    },
}

impl Arrivals {
    /// The count distribution for this process.
    pub fn counts(&self) -> Box<dyn ArrivalCounts> {
        match *self {
            Arrivals::Poisson => Box::new(Poisson),
            Arrivals::GammaPoisson { dispersion } if dispersion <= 0.0 => Box::new(Poisson),
            Arrivals::GammaPoisson { dispersion } => Box::new(GammaPoisson { dispersion }),
        }
    }
}

/// Poisson counts: `PF(k, T) = e^{-λT} (λT)^k / k!`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Poisson;

impl ArrivalCounts for Poisson {
    fn ln_pmf(&self, rate: f64, t_us: f64, k: usize) -> f64 {
        let mu = (rate * t_us).max(0.0);
        if mu == 0.0 {
            return if k == 0 { 0.0 } else { f64::NEG_INFINITY };
        }
        let k = k as f64;
        // scipy.stats.poisson.pmf computes exp(xlogy(k, mu) - gammaln(k+1) - mu).
        k * mu.ln() - ln_gamma(k + 1.0) - mu
    }

    /// `ln μ` once per run instead of once per count, and `ln Γ(k + 1)` from
    /// a table of the same function's values: the same expression, operand
    /// for operand, as [`Poisson::ln_pmf`].
    fn ln_pmf_run(&self, rate: f64, t_us: f64, first: usize, out: &mut [f64]) {
        let mu = (rate * t_us).max(0.0);
        if mu == 0.0 {
            for (i, o) in out.iter_mut().enumerate() {
                *o = self.ln_pmf(rate, t_us, first + i);
            }
            return;
        }
        let ln_mu = mu.ln();
        for (i, o) in out.iter_mut().enumerate() {
            let k = first + i;
            *o = k as f64 * ln_mu - ln_factorial(k) - mu;
        }
    }

    fn pmf(&self, rate: f64, t_us: f64, k_max: usize) -> CountPmf {
        let mu = (rate * t_us).max(0.0);
        if mu == 0.0 {
            return CountPmf { lo: 0, p: vec![1.0] };
        }
        // Walk out from the mode with the ratio recurrence; exact enough (each
        // step one rounding) and one `exp` per call instead of one per count.
        let mode = (mu.floor() as usize).min(k_max);
        let at_mode = self.ln_pmf(rate, t_us, mode).exp();
        let mut down = Vec::new();
        let mut value = at_mode;
        let mut k = mode;
        while k > 0 {
            value *= k as f64 / mu;
            if value < NEGLIGIBLE {
                break;
            }
            down.push(value);
            k -= 1;
        }
        let lo = mode - down.len();
        let mut p: Vec<f64> = down.into_iter().rev().collect();
        p.push(at_mode);
        let mut value = at_mode;
        let mut k = mode;
        while k < k_max {
            value *= mu / (k + 1) as f64;
            if value < NEGLIGIBLE && (k as f64) > mu {
                break;
            }
            p.push(value);
            k += 1;
        }
        // The mode's value carries lnΓ's absolute rounding (~1e-12 relative at
        // λT ~ 2000); the truncated tails weigh < 1e-20. Normalising removes the
        // former when the whole support is inside `0..=k_max`.
        if k < k_max {
            let total: f64 = p.iter().sum();
            p.iter_mut().for_each(|x| *x /= total);
        }
        CountPmf { lo, p }
    }
}

/// Counts of a Poisson process of rate `λ` observed on a Gamma-process clock
/// (a Lévy process: independent, stationary increments). Over an interval `T`
/// the count is negative binomial with shape `r = λT / c` and success
/// probability `1 / (1 + c)`: mean `λT`, variance `λT (1 + c)`.
///
/// This is how "Gamma arrivals" fit RAMSIS's interface. A *renewal* process
/// with Gamma inter-arrival times (the artifact simulator's `gamma` option)
/// does not have independent increments unless its shape is 1, so no MDP of
/// the paper's form models it exactly; this process is its natural
/// independent-increment counterpart with the same burstiness knob.
#[derive(Clone, Copy, Debug)]
pub struct GammaPoisson {
    /// Extra dispersion `c > 0` (index of dispersion `1 + c`).
    pub dispersion: f64,
}

impl ArrivalCounts for GammaPoisson {
    fn ln_pmf(&self, rate: f64, t_us: f64, k: usize) -> f64 {
        let mean = (rate * t_us).max(0.0);
        if mean == 0.0 {
            return if k == 0 { 0.0 } else { f64::NEG_INFINITY };
        }
        let c = self.dispersion;
        let r = mean / c;
        let k = k as f64;
        ln_gamma(k + r) - ln_gamma(k + 1.0) - ln_gamma(r) + k * (c / (1.0 + c)).ln() - r * (1.0 + c).ln()
    }

    fn pmf(&self, rate: f64, t_us: f64, k_max: usize) -> CountPmf {
        let mean = (rate * t_us).max(0.0);
        if mean == 0.0 {
            return CountPmf { lo: 0, p: vec![1.0] };
        }
        let mut lo = None;
        let mut p = Vec::new();
        for k in 0..=k_max {
            let v = self.ln_pmf(rate, t_us, k).exp();
            if v >= NEGLIGIBLE {
                if lo.is_none() {
                    lo = Some(k);
                }
                p.push(v);
            } else if lo.is_some() && (k as f64) > mean {
                break;
            } else if lo.is_some() {
                p.push(v);
            }
        }
        match lo {
            Some(lo) => CountPmf { lo, p },
            // All of `0..=k_max` is negligible: one explicit zero keeps the
            // support non-empty for the callers.
            None => CountPmf { lo: k_max, p: vec![0.0] },
        }
    }
}

/// Counts below this have `ln k!` tabulated ([`ln_factorial`]): `(N_w + 2)·K`
/// for the paper's `N_w = 32` and up to ~120 workers.
const LN_FACTORIAL_TABLE: usize = 4096;

/// `ln k! = ln_gamma(k + 1)`, from a table filled once per process by that
/// very function (so the values are the same bit for bit).
pub fn ln_factorial(k: usize) -> f64 {
    static TABLE: std::sync::OnceLock<Vec<f64>> = std::sync::OnceLock::new();
    if k >= LN_FACTORIAL_TABLE {
        return ln_gamma(k as f64 + 1.0);
    }
    TABLE.get_or_init(|| (0..LN_FACTORIAL_TABLE).map(|k| ln_gamma(k as f64 + 1.0)).collect())[k]
}

/// `ln Γ(x)` for `x > 0` (Lanczos, g = 7, 9 terms; relative error ~1e-15).
pub fn ln_gamma(x: f64) -> f64 {
    const G: f64 = 7.0;
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x) Γ(1-x) = π / sin(πx).
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).abs().ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = C[0];
    let t = x + G + 0.5;
    for (i, c) in C.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ln_gamma_matches_factorials() {
        let mut f = 0.0f64;
        for n in 1..60u32 {
            f += f64::from(n).ln();
            let got = ln_gamma(f64::from(n) + 1.0);
            assert!((got - f).abs() <= 1e-12 * f.max(1.0), "n={n}: {got} vs {f}");
        }
        assert!((ln_gamma(0.5) - std::f64::consts::PI.sqrt().ln()).abs() < 1e-13);
    }

    #[test]
    fn poisson_pmf_sums_to_one_and_has_the_mean() {
        for mu in [0.0, 0.3, 4.0, 44.0, 300.0, 1900.0] {
            let pmf = Poisson.pmf(1.0, mu, 100_000);
            let total: f64 = pmf.p.iter().sum();
            let mean: f64 = pmf.p.iter().enumerate().map(|(i, p)| (pmf.lo + i) as f64 * p).sum();
            assert!((total - 1.0).abs() < 1e-12, "mu={mu}: {total}");
            assert!((mean - mu).abs() < 1e-9 * mu.max(1.0), "mu={mu}: {mean}");
        }
    }

    #[test]
    fn gamma_poisson_is_overdispersed() {
        let g = GammaPoisson { dispersion: 2.0 };
        let pmf = g.pmf(1.0, 50.0, 100_000);
        let total: f64 = pmf.p.iter().sum();
        let mean: f64 = pmf.p.iter().enumerate().map(|(i, p)| (pmf.lo + i) as f64 * p).sum();
        let var: f64 = pmf.p.iter().enumerate().map(|(i, p)| ((pmf.lo + i) as f64 - mean).powi(2) * p).sum();
        assert!((total - 1.0).abs() < 1e-10);
        assert!((mean - 50.0).abs() < 1e-6);
        assert!((var - 150.0).abs() < 1e-4, "{var}");
    }
}
