//! Transition probabilities (RAMSIS §4.4, Appendix I) in factored, sparse form.
//!
//! # Round-robin, maximal batching (§4.4.2)
//! With K workers behind a round-robin balancer, worker `w` gets every K-th
//! central arrival. In state `(n, T_j)` the head arrived `T_A = SLO − T_j` ago
//! (interval A) and `n − 1` worker arrivals followed, so the central count
//! `k_A ∈ [(n−1)K, nK−1]`; its *phase* `q = k_A mod K` (central arrivals since
//! the worker's last one) is all that matters afterwards. Following the
//! artifact, `q` is weighted `∝ PF((n−1)K + q; T_A)` ([`Phase`]).
//!
//! Given `q`, serving the batch takes `τ = l(m, n)`. The first new worker
//! arrival during `[0, τ]` becomes the next head; it lands in the window
//! `[b_{j'}, b_{j'+1})` exactly when the next state's slack rounds down to
//! `T_{j'}` (`b_k = max(0, τ − SLO + T_k)`, `b_0 = 0`, last = τ: interval B is
//! `[0, b_{j'})`, C the window, D the rest). With `U, V, W` the phase plus the
//! central counts up to the ends of B, C and D,
//!
//! `P(n', j' | q) = P(U ≤ K−1, V ≥ K, ⌊W/K⌋ = n')`                     (eq. 2)
//!
//! which is the artifact's convolution of the counts over B, C, D. Because
//! `{V ≤ K−1} ⊂ {U ≤ K−1}` it telescopes:
//! `P(n', j' | q) = F(b_{j'}, n' | q) − F(b_{j'+1}, n' | q)` with
//! `F(t, n' | q) = Σ_{u=q}^{K−1} PF(u − q; t) · P(⌊(u + c_{τ−t})/K⌋ = n')`,
//! so one `F` per window boundary serves two windows, and `F` itself is a
//! short correlation against a prefix-summed count pmf. `n' = 0` (no arrival
//! during τ) goes to `(1, SLO)`: the worker idles until the next arrival
//! (§4.4.1, folded into this transition as the artifact does); `n' > N_w`
//! goes to the full-queue state, as `1 − Σ` of the rest (eq. 3).
//!
//! The result for one `(n, m)` is a [`Block`]: a `K × columns` matrix whose
//! row `q` is the next-state distribution given phase `q`. A state's row is
//! its phase weights times the block, so value iteration needs `Block · V`
//! once per block and a `K`-long dot product per state–action pair, never a
//! dense `|S|` row.
//!
//! # Shortest-queue-first (Appendix I.1)
//! The worker sees a Poisson stream of rate `λ_w(n)` (eq. 4's approximation);
//! there is no phase, so the same code runs with `K = 1` and that rate: no
//! arrival in B, at least one in C, `n'` in total.
//!
//! # Variable batching (§4.3.2)
//! An action `(m, b)` with `b < n` leaves `n − b` requests whose head is the
//! `(b+1)`-th oldest; its slack is taken, conservatively, as the served head's
//! `T_j − τ` (it arrived later, so its real slack is at least that). This is
//! the artifact's own fallback for that case ([`Shift`]); the artifact's main
//! path conditions on the order statistics of the arrivals in A instead.

use super::arrivals::{ln_gamma, ArrivalCounts, CountPmf, NEGLIGIBLE};
use super::states::Space;

/// `ln` of the smallest positive `f64` (a subnormal): below it `exp` is 0.
const LN_MIN_POSITIVE: f64 = -744.440_072_1;

/// The distribution of the round-robin phase `q ∈ [0, K)` at a decision
/// (interval A), stored on the range where it is not negligible.
#[derive(Clone, Debug, PartialEq)]
pub struct Phase {
    /// First phase with a weight.
    pub lo: usize,
    /// Weights of phases `lo..lo + w.len()`, summing to 1.
    pub w: Vec<f64>,
}

impl Phase {
    /// The single phase 0 (shortest-queue-first, or `K = 1`).
    pub fn zero() -> Phase {
        Phase { lo: 0, w: vec![1.0] }
    }

    /// Phase weights of state `(n, T_j)` (`n ≥ 1`, or `N_w + 1` for the full
    /// state): `∝ PF((n−1)K + q; SLO − T_j)` for `q ∈ [0, K)`, the artifact's
    /// `init_p`. When every weight underflows `f64` (a state unreachable at
    /// this load, e.g. the full-queue state), the artifact ends up with
    /// uniform weights; so does this.
    pub fn of_state(counts: &dyn ArrivalCounts, rate: f64, k: usize, n: usize, t_a: f64) -> Phase {
        if k <= 1 {
            return Phase::zero();
        }
        let base = (n - 1) * k;
        let mut ln = vec![0.0; k];
        counts.ln_pmf_run(rate, t_a, base, &mut ln);
        let max = ln.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if max < LN_MIN_POSITIVE {
            return Phase { lo: 0, w: vec![1.0 / k as f64; k] };
        }
        let mut w: Vec<f64> = ln.iter().map(|&l| (l - max).exp()).collect();
        let total: f64 = w.iter().sum();
        w.iter_mut().for_each(|x| *x /= total);
        let lo = w.iter().position(|&x| x >= NEGLIGIBLE).unwrap_or(0);
        let hi = w.iter().rposition(|&x| x >= NEGLIGIBLE).unwrap_or(k - 1);
        let mut kept = w[lo..=hi].to_vec();
        let total: f64 = kept.iter().sum();
        kept.iter_mut().for_each(|x| *x /= total);
        Phase { lo, w: kept }
    }

    /// `Σ_q w_q · y[q]`.
    pub fn dot(&self, y: &[f64]) -> f64 {
        self.w.iter().zip(&y[self.lo..self.lo + self.w.len()]).map(|(a, b)| a * b).sum()
    }
}

/// Next-state distributions of one `(service time, arrival rate)` pair, one
/// row per phase: `P(next = cols[c] | q)`. Rows sum to 1.
///
/// Two layouts (issue 36): for the value iteration's `Block · V`, *packed*
/// columns, each stored only on its phases `lo..hi` outside which it is
/// exactly 0 (about a quarter of the fidelity case's values are: `Block · V`
/// streams the probabilities from memory every sweep, so fewer bytes is
/// faster); for the power iteration's `z · Block`, row-major
/// (`vals[q·C + c]`, after [`Block::make_row_major`]), so that the sums run
/// across columns. Both give the dense column-major computation's results
/// bit for bit: a skipped zero would only have added `+0.0`.
#[derive(Clone, Debug, Default)]
pub struct Block {
    /// Phases (K, or 1 for shortest-queue-first).
    pub k: usize,
    /// Destination state of each column.
    pub cols: Vec<u32>,
    /// The probabilities: packed columns (see `spans`) unless `row_major`.
    pub vals: Vec<f64>,
    /// Whether `vals` is row-major (`vals[q·C + c]`, all `C × K` values).
    pub row_major: bool,
    /// Packed layout: per column `(offset, lo, hi)`, its phases `lo..hi` at
    /// `vals[offset..offset + hi − lo]`, zeros elsewhere.
    pub spans: Vec<(u32, u32, u32)>,
}

impl Block {
    /// Packs dense column-major probabilities (`dense[c·K + q]`).
    fn packed(k: usize, cols: Vec<u32>, dense: &[f64]) -> Block {
        let mut vals = Vec::with_capacity(dense.len());
        let spans = dense
            .chunks_exact(k.max(1))
            .map(|col| {
                let lo = col.iter().position(|&p| p != 0.0).unwrap_or(0);
                let hi = col.iter().rposition(|&p| p != 0.0).map_or(lo, |h| h + 1);
                let offset = vals.len() as u32;
                vals.extend_from_slice(&col[lo..hi]);
                (offset, lo as u32, hi as u32)
            })
            .collect();
        vals.shrink_to_fit();
        Block { k, cols, vals, row_major: false, spans }
    }

    /// `P(next = cols[c] | q)`, in either layout.
    pub fn value(&self, c: usize, q: usize) -> f64 {
        if self.row_major {
            return self.vals[q * self.cols.len() + c];
        }
        let (offset, lo, hi) = self.spans[c];
        if (lo as usize..hi as usize).contains(&q) {
            self.vals[offset as usize + q - lo as usize]
        } else {
            0.0
        }
    }

    /// Switches to the row-major layout (once the value iteration, the only
    /// user of [`Block::times`], is over).
    pub fn make_row_major(&mut self) {
        if self.row_major {
            return;
        }
        let cols = self.cols.len();
        let mut rows = vec![0.0; cols * self.k];
        for (c, &(offset, lo, hi)) in self.spans.iter().enumerate() {
            let col = &self.vals[offset as usize..offset as usize + (hi - lo) as usize];
            for (q, &p) in (lo as usize..).zip(col) {
                rows[q * cols + c] = p;
            }
        }
        self.vals = rows;
        self.spans = Vec::new();
        self.row_major = true;
    }

    /// `y[q] = Σ_c vals[c][q] · v[cols[c]]` (the block times the value vector;
    /// packed layout). Each sum adds its terms in column order from `+0.0`;
    /// the zeros outside a column's span and columns with `v = 0` are
    /// skipped (they would add `+0.0`).
    pub fn times(&self, v: &[f64], y: &mut [f64]) {
        debug_assert!(!self.row_major, "Block::times needs the packed layout");
        let k = self.k;
        y[..k].iter_mut().for_each(|x| *x = 0.0);
        for (&s, &(offset, lo, hi)) in self.cols.iter().zip(&self.spans) {
            let vs = v[s as usize];
            if vs == 0.0 {
                continue;
            }
            let col = &self.vals[offset as usize..offset as usize + (hi - lo) as usize];
            for (yq, &p) in y[lo as usize..hi as usize].iter_mut().zip(col) {
                *yq += p * vs;
            }
        }
    }

    /// `out[cols[c]] += Σ_q z[q] · vals[c][q]` (a distribution over phases,
    /// pushed through the block). In the row-major layout the sums run over
    /// all columns at once (`mass += z[q] · row_q`, vectorised across
    /// columns), with `scratch` holding them: each column's sum still adds its
    /// terms in increasing `q`, so the result is the dense column-major one
    /// bit for bit (phases with `z[q] = 0` add `+0.0` there and are skipped
    /// here).
    pub fn spread(&self, z: &[f64], out: &mut [f64], scratch: &mut Vec<f64>) {
        let k = self.k;
        if self.row_major {
            let cols = self.cols.len();
            scratch.clear();
            scratch.resize(cols, 0.0);
            for (row, &zq) in self.vals.chunks_exact(cols.max(1)).zip(&z[..k]) {
                if zq == 0.0 {
                    continue;
                }
                for (m, &p) in scratch.iter_mut().zip(row) {
                    *m += p * zq;
                }
            }
            for (&s, &mass) in self.cols.iter().zip(scratch.iter()) {
                out[s as usize] += mass;
            }
            return;
        }
        for (c, &s) in self.cols.iter().enumerate() {
            let mass: f64 = (0..k).map(|q| self.value(c, q) * z[q]).sum();
            out[s as usize] += mass;
        }
    }

    /// Number of probabilities, `columns × K`, zeros included (the unit of
    /// the work accounting, whatever the layout stores).
    pub fn nnz(&self) -> usize {
        self.cols.len() * self.k
    }
}

/// Phases per vector of the block construction's correlation.
const CORRELATION_LANES: usize = 8;

/// Builds a [`Block`] one window boundary at a time, so that the work can be
/// sliced (the component builds policies between `decide` calls).
#[derive(Debug)]
pub struct BlockBuilder {
    k: usize,
    n_max: usize,
    tau: f64,
    rate: f64,
    /// Window boundaries `b_0 = 0 ≤ b_1 ≤ … ≤ b_J = τ`.
    bounds: Vec<f64>,
    /// The next boundary to evaluate.
    next: usize,
    /// `F` at the previous boundary: `(n_max + 1) × k`, `n'`-major
    /// (`prev[n'·k + q]`), zero outside `prev_range`.
    prev: Vec<f64>,
    /// `n'` range where `prev` may be non-zero.
    prev_range: (usize, usize),
    cur: Vec<f64>,
    cur_range: (usize, usize),
    /// `P(n' = 0 | q)`.
    p0: Vec<f64>,
    /// Scratch: the count differences `g` (padded with zeros) and one `F` or
    /// window column per phase.
    g: Vec<f64>,
    f: Vec<f64>,
    block: Block,
    /// Destination state of `(n', j')` is `n'·J + j'`.
    levels: usize,
}

impl BlockBuilder {
    /// Starts the block for service time `tau` µs, with `k` phases and central
    /// (or, for shortest-queue-first, worker) arrival rate `rate` per µs.
    pub fn new(space: &Space, tau: f64, rate: f64, k: usize) -> BlockBuilder {
        let j = space.slack_levels();
        let slo = space.slo;
        let mut bounds = Vec::with_capacity(j + 1);
        bounds.push(0.0);
        // §4.4.2: T_B = l + T_{j'} − SLO, clamped at 0; the artifact also clamps
        // the window's end at 0 and ends the last window at τ.
        for t in &space.grid[1..] {
            bounds.push((tau - slo + t).clamp(0.0, tau.max(0.0)));
        }
        bounds.push(tau.max(0.0));
        let n_max = space.max_queue;
        BlockBuilder {
            k,
            n_max,
            tau: tau.max(0.0),
            rate,
            bounds,
            next: 0,
            prev: vec![0.0; k * (n_max + 1)],
            prev_range: (1, 0),
            cur: vec![0.0; k * (n_max + 1)],
            cur_range: (1, 0),
            p0: vec![0.0; k],
            g: Vec::new(),
            f: Vec::new(),
            block: Block { k, ..Block::default() },
            levels: j,
        }
    }

    /// Whether every boundary has been evaluated.
    pub fn is_done(&self) -> bool {
        self.next >= self.bounds.len()
    }

    /// Evaluates the next boundary (and emits the window that ends there).
    /// Returns an estimate of the work done, in multiply–adds (unchanged by
    /// the cache and the vectorisation: it sizes a sliced generation's calls).
    pub fn step(&mut self, counts: &dyn ArrivalCounts, cache: &mut CountCache) -> u64 {
        let k = self.k;
        let i = self.next;
        self.next += 1;
        let t = self.bounds[i];
        if i > 0 && t == self.bounds[i - 1] {
            return 1; // empty window: F unchanged
        }
        let mut work = 0u64;
        // F(t, n' | q) for n' ≥ 1.
        // `cur` holds the boundary before last: clear what it wrote.
        let (stale_lo, stale_hi) = self.cur_range;
        if stale_lo <= stale_hi {
            self.cur[stale_lo * k..(stale_hi + 1) * k].iter_mut().for_each(|x| *x = 0.0);
        }
        self.cur_range = (1, 0);
        if t < self.tau {
            let a = counts.pmf(self.rate, t, k - 1);
            // The counts after `t` depend on τ − t, which is SLO − T_j up to
            // rounding for every block: the same few values recur.
            let rest = cache.get(counts, self.rate, self.tau - t, (self.n_max + 2) * k);
            let cdf = &rest.cdf;
            // Count pmfs: a few flops per stored entry, one `exp` per call.
            work += 8 * (a.p.len() + rest.pmf.p.len()) as u64 + 64;
            let lo = (rest.pmf.lo / k).max(1);
            let hi = rest.pmf.hi().div_ceil(k).min(self.n_max);
            self.cur_range = (lo, hi);
            // g[u] for u < k, then zeros: the correlation below runs every
            // phase q over every d, and the terms past q + d ≥ K add +0.0.
            self.g.clear();
            self.g.resize(2 * k + CORRELATION_LANES, 0.0);
            let d_top = a.hi().min(k - 1);
            // The scalar loop's count: Σ_q (min(K−1−q, a.hi) − a.lo + 1)⁺ per n'.
            let per_np: u64 = (0..k)
                .map(|q| {
                    let d_hi = (k - 1 - q).min(a.hi());
                    if a.lo <= d_hi {
                        (d_hi - a.lo + 1) as u64
                    } else {
                        0
                    }
                })
                .sum();
            for np in lo..=hi {
                for (u, gu) in self.g[..k].iter_mut().enumerate() {
                    let top = (np * k + k - 1) as i64 - u as i64;
                    let bottom = (np * k) as i64 - 1 - u as i64;
                    *gu = cdf.at(top) - cdf.at(bottom);
                }
                // F[q] = Σ_{d = a.lo}^{min(K−1−q, a.hi)} a[d] · g[q + d], each
                // sum in increasing d as the scalar loop did, vectorised across
                // q (one lane per phase, the lanes' sums kept in registers).
                let out = &mut self.cur[np * k..(np + 1) * k];
                for q0 in (0..k).step_by(CORRELATION_LANES) {
                    let mut acc = [0.0f64; CORRELATION_LANES];
                    if a.lo <= d_top {
                        for (d, &ad) in (a.lo..=d_top).zip(&a.p) {
                            let g: &[f64; CORRELATION_LANES] =
                                self.g[q0 + d..q0 + d + CORRELATION_LANES].try_into().expect("lanes");
                            for (x, &gu) in acc.iter_mut().zip(g) {
                                *x += ad * gu;
                            }
                        }
                    }
                    let n = CORRELATION_LANES.min(k - q0);
                    out[q0..q0 + n].copy_from_slice(&acc[..n]);
                }
                work += per_np;
            }
            if i == 0 {
                // P(n' = 0 | q) = P(c_τ ≤ K − 1 − q) (the artifact's n' = 0 case).
                for q in 0..k {
                    self.p0[q] = cdf.at((k - 1 - q) as i64);
                }
            }
        } else if i == 0 {
            // τ = 0: nothing can arrive.
            self.p0.iter_mut().for_each(|x| *x = 1.0);
        }
        if i > 0 {
            // Window i−1: [b_{i−1}, b_i), next slack index j' = i − 1.
            let lo = self.prev_range.0.min(self.cur_range.0);
            let hi = self.prev_range.1.max(self.cur_range.1);
            self.f.clear();
            self.f.resize(k, 0.0);
            for np in lo..=hi {
                let mut largest = 0.0f64;
                let (prev, cur) = (&self.prev[np * k..(np + 1) * k], &self.cur[np * k..(np + 1) * k]);
                for ((x, &before), &after) in self.f.iter_mut().zip(prev).zip(cur) {
                    let v = before - after;
                    *x = 0.0;
                    if v > 0.0 {
                        *x = v;
                        largest = largest.max(v);
                    }
                }
                if largest >= NEGLIGIBLE {
                    self.block.cols.push((np * self.levels + i - 1) as u32);
                    self.block.vals.extend_from_slice(&self.f);
                }
            }
            work += ((hi + 1).saturating_sub(lo) * k) as u64;
        }
        // `cur` becomes `prev`; the old `prev` (and its range, to clear) `cur`.
        std::mem::swap(&mut self.prev, &mut self.cur);
        std::mem::swap(&mut self.prev_range, &mut self.cur_range);
        work + (k * 4) as u64
    }

    /// Finishes the block: adds the `n' = 0` column (to `(1, SLO)`) and the
    /// full-queue column (`1 − Σ`, eq. 3), and renormalises any row that
    /// rounding pushed above 1.
    pub fn finish(mut self, full_state: usize) -> Block {
        let k = self.k;
        let idle_target = self.levels + self.levels - 1; // (1, J − 1): one request, slack SLO
        self.block.cols.push(idle_target as u32);
        self.block.vals.extend_from_slice(&self.p0);
        let cols = self.block.cols.len();
        let mut full = vec![0.0; k];
        for (q, f) in full.iter_mut().enumerate() {
            let s: f64 = (0..cols).map(|c| self.block.vals[c * k + q]).sum();
            *f = (1.0 - s).max(0.0);
            let total = s + *f;
            if total > 0.0 && total != 1.0 {
                for c in 0..cols {
                    self.block.vals[c * k + q] /= total;
                }
                *f /= total;
            }
        }
        self.block.cols.push(full_state as u32);
        self.block.vals.extend_from_slice(&full);
        Block::packed(k, self.block.cols, &self.block.vals)
    }
}

/// A count pmf with its prefix sums.
#[derive(Debug)]
pub struct CachedCounts {
    /// The pmf.
    pub pmf: CountPmf,
    cdf: Cdf,
}

/// Count pmfs already computed, by their exact arguments (rate, interval,
/// largest count): a hit returns the very values a new call would, so caching
/// changes no result. One per generation (or per thread building blocks).
#[derive(Debug, Default)]
pub struct CountCache {
    map: std::collections::HashMap<(u64, u64, usize), CachedCounts>,
}

impl CountCache {
    /// `counts.pmf(rate, t_us, k_max)` and its prefix sums, computed once.
    pub fn get(&mut self, counts: &dyn ArrivalCounts, rate: f64, t_us: f64, k_max: usize) -> &CachedCounts {
        self.map.entry((rate.to_bits(), t_us.to_bits(), k_max)).or_insert_with(|| {
            let pmf = counts.pmf(rate, t_us, k_max);
            let cdf = Cdf::new(&pmf);
            CachedCounts { pmf, cdf }
        })
    }

    /// Approximate heap bytes held.
    pub fn memory_bytes(&self) -> usize {
        self.map.values().map(|c| (c.pmf.p.len() + c.cdf.prefix.len()) * 8 + 64).sum()
    }
}

/// A prefix-summed count pmf: `at(x) = P(count ≤ x)`.
#[derive(Debug)]
struct Cdf {
    lo: usize,
    prefix: Vec<f64>,
}

impl Cdf {
    fn new(pmf: &CountPmf) -> Cdf {
        let mut acc = 0.0;
        let prefix = pmf
            .p
            .iter()
            .map(|p| {
                acc += p;
                acc
            })
            .collect();
        Cdf { lo: pmf.lo, prefix }
    }

    fn at(&self, x: i64) -> f64 {
        if x < self.lo as i64 {
            return 0.0;
        }
        let i = (x as usize - self.lo).min(self.prefix.len() - 1);
        self.prefix[i]
    }
}

/// The next-state distribution of a variable-batching action that leaves
/// requests behind (§4.3.2, see the module docs): `n − b + a` requests, `a`
/// the worker arrivals during τ; beyond `N_w`, the full-queue state.
#[derive(Clone, Debug, PartialEq)]
pub struct Shift {
    /// Destination states and probabilities.
    pub to: Vec<(u32, f64)>,
}

impl Shift {
    /// Builds the distribution for state `(n, j)` with phase weights `phase`
    /// and action `(·, b)` of latency `tau`, `b < n`.
    ///
    /// The new head is the worker's `b`-th arrival after the served head, i.e.
    /// the `bK`-th central arrival after it. With `order_statistics` (Poisson
    /// arrivals), given `k_A = (n−1)K + q` central arrivals in interval A they
    /// are uniform on it, so that arrival's time `t` (after the head) is
    /// `T_A · Beta(bK, k_A − bK + 1)`, i.e. `P(t ≤ y) = P(Bin(k_A, y/T_A) ≥ bK)`,
    /// and its slack after τ is `T_j + t − τ`, rounded down (the artifact's
    /// main path). Without it, the slack is taken as `T_j − τ` (the artifact's
    /// fallback, conservative).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        space: &Space,
        counts: &dyn ArrivalCounts,
        rate: f64,
        k: usize,
        phase: &Phase,
        n: usize,
        j: usize,
        b: usize,
        tau: f64,
        order_statistics: bool,
    ) -> (Shift, u64) {
        let levels = space.slack_levels();
        let base = n - b;
        let pmf = counts.pmf(rate, tau, (space.max_queue + 2) * k);
        let cdf = Cdf::new(&pmf);
        let a_max = space.max_queue.saturating_sub(base);
        let t_a = space.slo - space.grid[j];
        let exact = order_statistics && t_a > 0.0;
        // Boundaries of the next slack index: t ≥ y_i ⇔ slack ≥ T_i.
        let bounds: Vec<(usize, f64)> = if exact {
            (1..levels).map(|i| (i, space.grid[i] - space.grid[j] + tau)).filter(|&(_, y)| y > 0.0 && y < t_a).collect()
        } else {
            Vec::new()
        };
        let fixed = space.quantize(space.grid[j] - tau);
        let r = b * k; // the new head is the r-th central arrival after the old one
        let mut work = 0u64;
        // cdfs[c][i]: P(t ≤ y of bounds[c]) for phase lo + i.
        let cdfs: Vec<Vec<f64>> = bounds
            .iter()
            .map(|&(_, y)| {
                let p = y / t_a;
                let k0 = (n - 1) * k + phase.lo;
                let mut tail = binomial_tail(k0, r, p);
                let mut pmf = binomial_pmf(k0, r - 1, p);
                let mut out = Vec::with_capacity(phase.w.len());
                for i in 0..phase.w.len() {
                    out.push(tail.clamp(0.0, 1.0));
                    let kk = k0 + i;
                    // Bin(k+1) = Bin(k) + Bernoulli(p).
                    tail += p * pmf;
                    pmf *= (kk + 1) as f64 / (kk + 2 - r) as f64 * (1.0 - p);
                }
                work += 120 + 4 * phase.w.len() as u64;
                out
            })
            .collect();
        let mut dist = vec![0.0; (a_max + 1) * levels];
        for (i, w) in phase.w.iter().enumerate() {
            let q = phase.lo + i;
            // Slack distribution for this phase: P(j' = idx).
            let mut slack: Vec<(usize, f64)> = Vec::new();
            if exact {
                let mut below = 0.0; // P(t < current lower boundary)
                let mut current = space.quantize(space.grid[j] - tau);
                for (c, &(idx, _)) in bounds.iter().enumerate() {
                    let f = cdfs[c][i];
                    slack.push((current, (f - below).max(0.0)));
                    below = f;
                    current = idx;
                }
                slack.push((current, (1.0 - below).max(0.0)));
            } else {
                slack.push((fixed, 1.0));
            }
            for a in 0..=a_max {
                let top = (a * k + k - 1) as i64 - q as i64;
                let bottom = (a * k) as i64 - 1 - q as i64;
                let pa = w * (cdf.at(top) - cdf.at(bottom)).max(0.0);
                if pa == 0.0 {
                    continue;
                }
                for &(idx, ps) in &slack {
                    dist[a * levels + idx] += pa * ps;
                }
                work += slack.len() as u64;
            }
        }
        let mut to = Vec::new();
        let mut total = 0.0;
        for (cell, p) in dist.into_iter().enumerate() {
            if p >= NEGLIGIBLE {
                let (a, idx) = (cell / levels, cell % levels);
                to.push((((base + a) * levels + idx) as u32, p));
                total += p;
            }
        }
        to.push((space.full() as u32, (1.0 - total).max(0.0)));
        if total > 1.0 {
            to.iter_mut().for_each(|e| e.1 /= total);
        }
        (Shift { to }, work + (a_max * levels) as u64)
    }
}

/// `P(X = m)` for `X ~ Bin(k, p)`.
fn binomial_pmf(k: usize, m: usize, p: f64) -> f64 {
    if m > k {
        return 0.0;
    }
    if p <= 0.0 {
        return if m == 0 { 1.0 } else { 0.0 };
    }
    if p >= 1.0 {
        return if m == k { 1.0 } else { 0.0 };
    }
    let (k, m) = (k as f64, m as f64);
    (ln_gamma(k + 1.0) - ln_gamma(m + 1.0) - ln_gamma(k - m + 1.0) + m * p.ln() + (k - m) * (1.0 - p).ln()).exp()
}

/// `P(X ≥ r)` for `X ~ Bin(k, p)`: the regularized incomplete beta
/// `I_p(r, k − r + 1)` (continued fraction, Numerical Recipes §6.4).
pub fn binomial_tail(k: usize, r: usize, p: f64) -> f64 {
    if r == 0 {
        return 1.0;
    }
    if r > k || p <= 0.0 {
        return 0.0;
    }
    if p >= 1.0 {
        return 1.0;
    }
    let (a, b) = (r as f64, (k - r + 1) as f64);
    let front = (ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * p.ln() + b * (1.0 - p).ln()).exp();
    if p < (a + 1.0) / (a + b + 2.0) {
        front * beta_cf(a, b, p) / a
    } else {
        1.0 - front * beta_cf(b, a, 1.0 - p) / b
    }
}

/// Continued fraction of the incomplete beta function (modified Lentz).
fn beta_cf(a: f64, b: f64, x: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let (qab, qap, qam) = (a + b, a + 1.0, a - 1.0);
    let mut c = 1.0;
    let mut d = 1.0 - qab * x / qap;
    if d.abs() < TINY {
        d = TINY;
    }
    d = 1.0 / d;
    let mut h = d;
    for m in 1..10_000 {
        let m = f64::from(m);
        let m2 = 2.0 * m;
        let aa = m * (b - m) * x / ((qam + m2) * (a + m2));
        d = 1.0 + aa * d;
        if d.abs() < TINY {
            d = TINY;
        }
        c = 1.0 + aa / c;
        if c.abs() < TINY {
            c = TINY;
        }
        d = 1.0 / d;
        h *= d * c;
        let aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
        d = 1.0 + aa * d;
        if d.abs() < TINY {
            d = TINY;
        }
        c = 1.0 + aa / c;
        if c.abs() < TINY {
            c = TINY;
        }
        d = 1.0 / d;
        let del = d * c;
        h *= del;
        if (del - 1.0).abs() < 1e-15 {
            break;
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binomial_tail_matches_a_direct_sum() {
        for &(k, r, p) in &[(10usize, 3usize, 0.2f64), (60, 20, 0.4), (500, 240, 0.5), (1900, 600, 0.33)] {
            let direct: f64 = (r..=k).map(|m| binomial_pmf(k, m, p)).sum();
            let tail = binomial_tail(k, r, p);
            assert!((tail - direct).abs() < 1e-10, "k={k} r={r} p={p}: {tail} vs {direct}");
        }
        assert_eq!(binomial_tail(5, 0, 0.3), 1.0);
        assert_eq!(binomial_tail(5, 6, 0.3), 0.0);
    }
}
