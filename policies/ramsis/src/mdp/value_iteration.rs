//! Value iteration (RAMSIS §4.1), as the artifact runs it: `V₀ = 0`, a fixed
//! number of undiscounted Jacobi sweeps `V_{i+1}(s) = max_a [R(s, a) +
//! Σ_{s'} P_a(s, s') V_i(s')]`, then the greedy policy with respect to the
//! last `V` (the first best action in [`Space::actions`](super::Space::actions)
//! order wins ties).
//!
//! Each sweep first multiplies every transition [`Block`](super::transitions::Block)
//! by `V` (`K` values per block), then evaluates each state–action pair as
//! `R + phase · y`: the cost per sweep is the number of stored block
//! probabilities plus `K` per state–action pair.
//!
//! # Layout for speed (issue 36)
//! The `phase · y` dot products are sequential sums (their order fixes the
//! rounding, and the policy must not change), so they are vectorised across
//! states instead of within one: right after block `i`'s `y` is computed, the
//! pairs it serves are evaluated [`LANES`] consecutive states at a time, one
//! SIMD lane per state, from a transposed copy of the phase weights in tiles
//! of [`LANES`] states (`phase_t`, zero outside each state's phase range). Each lane performs the
//! same multiplications and additions in the same order as the scalar dot
//! product; the zero weights outside the range add `+0.0`, which changes no
//! sum (every term is `≥ +0`: weights, probabilities and values are
//! non-negative). The per-state pass then only takes the maximum over
//! `R + future` in action order. The work reported per unit is unchanged, so
//! a sliced generation finishes on the same call as before.

use super::{Generator, Kind};

/// States evaluated together (one SIMD lane each): 8 `f64`, four SSE2 or two
/// AVX registers, enough independent additions to hide their latency.
pub const LANES: usize = 8;

/// The tile of `LANES` states `s0..s0 + LANES` (`s0` a multiple of `LANES`)
/// evaluated against one block:
/// `dest[l]` is the pair index of state `s0 + l`'s action through the block
/// (`u32::MAX`: the lane's result is not used), and `t_lo..t_hi` covers the
/// phase ranges of the used lanes.
#[derive(Clone, Debug)]
pub struct Window {
    pub(super) s0: u32,
    pub(super) t_lo: u32,
    pub(super) t_hi: u32,
    pub(super) dest: [u32; LANES],
}

/// Below this many stored transition probabilities, [`Generator::run_parallel`]
/// runs the sweeps on one thread (setup and block construction still use all
/// threads). At ~1 ns per value a sweep then takes under ~1 ms, and three
/// barrier waits per sweep cost more than the split saves on 2 cores.
pub const PARALLEL_SWEEP_MIN_VALUES: usize = 1_000_000;

impl Generator {
    /// Lays out the sweeps once setup is done (phases and block numbers
    /// known): the transposed phase weights, the pair numbering and every
    /// block's windows.
    pub(super) fn prepare_sweeps(&mut self) {
        let k = self.k;
        let states = self.space.state_count();
        let mut phase_t = vec![0.0; states.div_ceil(LANES) * k * LANES];
        for (s, phase) in self.phases.iter().enumerate() {
            if let Some(p) = phase {
                let (tile, lane) = (s / LANES, s % LANES);
                for (i, &w) in p.w.iter().enumerate() {
                    phase_t[(tile * k + p.lo + i) * LANES + lane] = w;
                }
            }
        }
        let mut pair_start = Vec::with_capacity(states + 1);
        let mut total = 0u32;
        for choices in &self.choices {
            pair_start.push(total);
            total += choices.len() as u32;
        }
        pair_start.push(total);
        // Per block, its (state, pair) users in state order.
        let mut users: Vec<Vec<(u32, u32)>> = vec![Vec::new(); self.block_specs.len()];
        for (s, choices) in self.choices.iter().enumerate() {
            for (c, choice) in choices.iter().enumerate() {
                if let Kind::Block(i) = choice.kind {
                    users[i].push((s as u32, pair_start[s] + c as u32));
                }
            }
        }
        let windows = users
            .iter()
            .map(|users| {
                let mut out = Vec::new();
                let mut next = 0;
                while next < users.len() {
                    let s0 = users[next].0 / LANES as u32 * LANES as u32;
                    let mut w = Window { s0, t_lo: u32::MAX, t_hi: 0, dest: [u32::MAX; LANES] };
                    while let Some(&(s, pair)) = users.get(next) {
                        let lane = (s - s0) as usize;
                        // Past the window, or a second action of the same state
                        // through the same block: next window.
                        if lane >= LANES || w.dest[lane] != u32::MAX {
                            break;
                        }
                        let phase = self.phases[s as usize].as_ref().expect("phase of a state with a block action");
                        w.dest[lane] = pair;
                        w.t_lo = w.t_lo.min(phase.lo as u32);
                        w.t_hi = w.t_hi.max((phase.lo + phase.w.len()) as u32);
                        next += 1;
                    }
                    out.push(w);
                }
                out
            })
            .collect();
        self.phase_t = phase_t;
        self.windows = windows;
        self.future = vec![0.0; total as usize];
        self.pair_start = pair_start;
        self.rewards = self.choices.iter().flatten().map(|c| c.reward).collect();
        self.block_work = self
            .choices
            .iter()
            .zip(&self.phases)
            .map(|(choices, phase)| match phase {
                Some(p) if choices.iter().all(|c| matches!(c.kind, Kind::Block(_))) => {
                    (choices.len() * p.w.len()) as u64
                }
                _ => u64::MAX,
            })
            .collect();
    }

    /// `phase · y_i` for every pair served through block `i`, [`LANES`] states
    /// at a time (same operations, same order as [`Phase::dot`](super::transitions::Phase::dot)).
    pub(super) fn block_futures(&mut self, i: usize) {
        let k = self.k;
        let y = &self.y[i * k..(i + 1) * k];
        for w in &self.windows[i] {
            let mut acc = [0.0f64; LANES];
            let tile = w.s0 as usize / LANES * k;
            for (t, &yt) in y.iter().enumerate().take(w.t_hi as usize).skip(w.t_lo as usize) {
                let at = (tile + t) * LANES;
                let row: &[f64; LANES] = self.phase_t[at..at + LANES].try_into().expect("LANES weights");
                for (a, &p) in acc.iter_mut().zip(row) {
                    *a += p * yt;
                }
            }
            for (&dest, &a) in w.dest.iter().zip(&acc) {
                if dest != u32::MAX {
                    self.future[dest as usize] = a;
                }
            }
        }
    }

    /// The best action of state `s` against this sweep's block futures (`phase · y`, see [`Generator::block_futures`]):
    /// `(value, action index, work)`.
    pub(super) fn evaluate(&self, s: usize) -> (f64, usize, u64) {
        let levels = self.space.slack_levels();
        if s < levels {
            // §4.4.1: an empty queue waits; the next state is (1, SLO).
            return (self.v[levels + levels - 1], 0, 1);
        }
        let pairs = self.pair_start[s] as usize..self.pair_start[s + 1] as usize;
        if self.block_work[s] != u64::MAX {
            // Every action through a block: `R + future`, first maximum wins.
            let mut best = f64::NEG_INFINITY;
            let mut best_index = 0;
            for (index, (&reward, &future)) in self.rewards[pairs.clone()].iter().zip(&self.future[pairs]).enumerate() {
                let q = reward + future;
                if q > best {
                    best = q;
                    best_index = index;
                }
            }
            return (best, best_index, self.block_work[s]);
        }
        let phase = self.phases[s].as_ref().expect("phase of a non-empty state");
        let futures = &self.future[pairs];
        let mut best = f64::NEG_INFINITY;
        let mut best_index = 0;
        let mut work = 0;
        for (index, (choice, &through_block)) in self.choices[s].iter().zip(futures).enumerate() {
            let future = match &choice.kind {
                Kind::Block(_) => {
                    work += phase.w.len() as u64;
                    through_block
                }
                Kind::Shift(shift) => {
                    work += shift.to.len() as u64;
                    shift.to.iter().map(|&(t, p)| p * self.v[t as usize]).sum()
                }
            };
            let q = choice.reward + future;
            if q > best {
                best = q;
                best_index = index;
            }
        }
        (best, best_index, work)
    }

    /// [`Generator::evaluate`] with `V` and the per-block `y` given explicitly
    /// (the parallel sweep keeps them outside `self`).
    fn evaluate_with<'a>(&self, s: usize, v: &[f64], y: &dyn Fn(usize) -> &'a [f64]) -> (f64, usize, u64) {
        let levels = self.space.slack_levels();
        if s < levels {
            // §4.4.1: an empty queue waits; the next state is (1, SLO).
            return (v[levels + levels - 1], 0, 1);
        }
        let phase = self.phases[s].as_ref().expect("phase of a non-empty state");
        let mut best = f64::NEG_INFINITY;
        let mut best_index = 0;
        let mut work = 0;
        for (index, choice) in self.choices[s].iter().enumerate() {
            let future = match &choice.kind {
                Kind::Block(i) => {
                    work += phase.w.len() as u64;
                    phase.dot(y(*i))
                }
                Kind::Shift(shift) => {
                    work += shift.to.len() as u64;
                    shift.to.iter().map(|&(t, p)| p * v[t as usize]).sum()
                }
            };
            let q = choice.reward + future;
            if q > best {
                best = q;
                best_index = index;
            }
        }
        (best, best_index, work)
    }

    /// Computes `V_next(s)` (and, on the recording pass, the policy) for state
    /// `s`. Returns the work done.
    pub(super) fn update_state(&mut self, s: usize, record: bool) -> u64 {
        let (value, index, work) = self.evaluate(s);
        self.v_next[s] = value;
        if record {
            self.policy[s] = index;
        }
        work
    }

    /// Runs setup and block construction on `threads` threads
    /// (`std::thread::scope`), then the sweeps too when the blocks hold at
    /// least [`PARALLEL_SWEEP_MIN_VALUES`] probabilities; the power iteration
    /// stays sequential. The result is bit-for-bit the single-threaded one:
    /// every state and block is computed by exactly one thread, in the same
    /// way, and blocks are numbered in state order either way.
    pub fn run_parallel(&mut self, threads: usize) {
        use super::Stage;
        let threads = threads.max(1);
        if threads == 1 {
            return self.run();
        }
        if let Stage::Setup(0) = self.stage {
            // Prepare states on all threads (contiguous ranges), then number
            // the blocks in state order as the sequential setup does.
            let states = self.space.state_count();
            let chunk = states.div_ceil(threads);
            let this = &*self;
            let prepared: Vec<Vec<super::Prepared>> = std::thread::scope(|scope| {
                let handles: Vec<_> = (0..threads)
                    .map(|t| {
                        scope.spawn(move || {
                            (t * chunk..((t + 1) * chunk).min(states))
                                .map(|s| this.prepare_state(s))
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().expect("setup thread")).collect()
            });
            for (s, p) in prepared.into_iter().flatten().enumerate() {
                self.commit_state(s, p);
            }
            self.y = vec![0.0; self.block_specs.len() * self.k];
            self.prepare_sweeps();
            self.stage = if self.block_specs.is_empty() { Stage::SweepBlocks(0, 0) } else { Stage::Build(0) };
        }
        while let Stage::Setup(_) = self.stage {
            self.unit();
        }
        if let Stage::Build(0) = self.stage {
            let space = &self.space;
            let counts = self.counts.as_ref();
            let k = self.k;
            let specs = &self.block_specs;
            let full = space.full();
            let mut built: Vec<Option<super::Block>> = vec![None; specs.len()];
            std::thread::scope(|scope| {
                let handles: Vec<_> = (0..threads)
                    .map(|t| {
                        scope.spawn(move || {
                            let mut out = Vec::new();
                            let mut cache = super::CountCache::default();
                            for (i, &(tau, rate)) in specs.iter().enumerate().skip(t).step_by(threads) {
                                let mut b = super::BlockBuilder::new(space, tau, rate, k);
                                while !b.is_done() {
                                    b.step(counts, &mut cache);
                                }
                                out.push((i, b.finish(full)));
                            }
                            out
                        })
                    })
                    .collect();
                for h in handles {
                    for (i, block) in h.join().expect("block builder thread") {
                        built[i] = Some(block);
                    }
                }
            });
            self.blocks = built.into_iter().map(|b| b.expect("every block built")).collect();
            self.stage = Stage::SweepBlocks(0, 0);
        }
        let stored: usize = self.blocks.iter().map(|b| b.nnz()).sum();
        if stored < PARALLEL_SWEEP_MIN_VALUES {
            // Sweeps this small (~0.25 ms for the fidelity case) lose more to
            // the barriers, and to a busy second core, than they gain.
            return self.run();
        }
        self.parallel_sweeps(threads);
        self.start_power();
        self.stage = Stage::PowerStates(0, 0);
        self.run();
    }

    /// All value-iteration passes on `threads` threads that live for the
    /// whole iteration (spawning per sweep costs more than a sweep here).
    /// Thread `t` owns blocks `t, t + T, …` (their `y`) and one contiguous
    /// range of states; three barriers per sweep separate "compute y",
    /// "evaluate states" and "publish V".
    fn parallel_sweeps(&mut self, threads: usize) {
        use std::sync::{Barrier, RwLock};
        let k = self.k;
        let states = self.space.state_count();
        let blocks = self.blocks.len();
        let sweeps = self.sweeps;
        let chunk = states.div_ceil(threads);
        let v = RwLock::new(std::mem::take(&mut self.v));
        let y_parts: Vec<RwLock<Vec<f64>>> = (0..threads)
            .map(|t| RwLock::new(vec![0.0; blocks.div_ceil(threads).max(1) * k * usize::from(t < blocks.max(1))]))
            .collect();
        let barrier = Barrier::new(threads);
        let this = &*self;
        let policies: Vec<Vec<usize>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let (v, y_parts, barrier) = (&v, &y_parts, &barrier);
                    scope.spawn(move || {
                        let range = t * chunk..((t + 1) * chunk).min(states);
                        let mut values = vec![0.0; range.len()];
                        let mut policy = vec![0; range.len()];
                        for it in 0..=sweeps {
                            {
                                let v = v.read().expect("v lock");
                                let mut y = y_parts[t].write().expect("y lock");
                                for (slot, i) in (t..blocks).step_by(threads).enumerate() {
                                    this.blocks[i].times(&v, &mut y[slot * k..(slot + 1) * k]);
                                }
                            }
                            barrier.wait();
                            {
                                let v = v.read().expect("v lock");
                                let guards: Vec<_> = y_parts.iter().map(|p| p.read().expect("y lock")).collect();
                                let y = |i: usize| {
                                    let slot = i / threads;
                                    &guards[i % threads][slot * k..(slot + 1) * k]
                                };
                                for (o, s) in range.clone().enumerate() {
                                    let (value, index, _) = this.evaluate_with(s, &v, &y);
                                    values[o] = value;
                                    if it == sweeps {
                                        policy[o] = index;
                                    }
                                }
                            }
                            barrier.wait();
                            if it < sweeps {
                                v.write().expect("v lock")[range.clone()].copy_from_slice(&values);
                            }
                            barrier.wait();
                        }
                        policy
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("sweep thread")).collect()
        });
        self.v = v.into_inner().expect("v lock");
        for (t, part) in policies.into_iter().enumerate() {
            self.policy[t * chunk..t * chunk + part.len()].copy_from_slice(&part);
        }
    }
}
