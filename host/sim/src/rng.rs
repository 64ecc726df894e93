//! A small deterministic random source for the simulator (xoshiro256**, seeded
//! through SplitMix64), with the samplers experiments need. Kept in-tree so a
//! seed means the same stream on every machine and in every version.

/// xoshiro256** (Blackman & Vigna), 2^256 − 1 period; not cryptographic.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// A generator seeded from `seed` (any value, 0 included).
    pub fn new(seed: u64) -> Rng {
        let mut x = seed;
        let mut next = || {
            // SplitMix64: spreads any seed over the whole state.
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng { s: [next(), next(), next(), next()] }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1) with 53 bits.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in (0, 1]: safe to take a logarithm of.
    fn open_uniform(&mut self) -> f64 {
        1.0 - self.uniform()
    }

    /// Exponential with the given mean.
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -mean * self.open_uniform().ln()
    }

    /// Standard normal (Box–Muller; one of the pair is discarded for simplicity).
    pub fn normal(&mut self) -> f64 {
        let (u1, u2) = (self.open_uniform(), self.uniform());
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    /// Gamma(shape, scale) by Marsaglia & Tsang (2000); for shape < 1 the
    /// boost `Gamma(k) = Gamma(k + 1) · U^(1/k)`.
    pub fn gamma(&mut self, shape: f64, scale: f64) -> f64 {
        if shape < 1.0 {
            let u = self.open_uniform();
            return self.gamma(shape + 1.0, scale) * u.powf(1.0 / shape);
        }
        let d = shape - 1.0 / 3.0;
        let c = 1.0 / (9.0 * d).sqrt();
        loop {
            let x = self.normal();
            let v = (1.0 + c * x).powi(3);
            if v <= 0.0 {
                continue;
            }
            let u = self.open_uniform();
            if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
                return d * v * scale;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mean_var(xs: &[f64]) -> (f64, f64) {
        let m = xs.iter().sum::<f64>() / xs.len() as f64;
        (m, xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / xs.len() as f64)
    }

    #[test]
    fn same_seed_same_stream() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        assert!((0..100).all(|_| a.next_u64() == b.next_u64()));
        assert_ne!(Rng::new(1).next_u64(), Rng::new(2).next_u64());
    }

    #[test]
    fn samplers_have_their_moments() {
        let mut r = Rng::new(42);
        let e: Vec<f64> = (0..200_000).map(|_| r.exponential(2.0)).collect();
        let (m, v) = mean_var(&e);
        assert!((m - 2.0).abs() < 0.03 && (v - 4.0).abs() < 0.15, "exp mean {m} var {v}");
        for shape in [0.05, 0.5, 3.0] {
            let g: Vec<f64> = (0..200_000).map(|_| r.gamma(shape, 1.0 / shape)).collect();
            let (m, v) = mean_var(&g);
            // Mean 1, variance 1/shape.
            assert!((m - 1.0).abs() < 0.05 * (1.0 / shape).sqrt(), "gamma({shape}) mean {m}");
            assert!((v * shape - 1.0).abs() < 0.25, "gamma({shape}) var {v}");
        }
    }
}
