//! Proteus placements judged without a solver: for devices counted per (device type,
//! variant), the best routing is known in closed form, so a placement can be scored
//! in microseconds. Two uses (issue 34):
//!
//! - **Local search** around the lexicographic search's full accuracy solve: moving
//!   one device of a type from one variant (or idleness) to another, or two such
//!   moves together, while that raises the objective. HiGHS, stopped at the soft
//!   limit, left surges up to 2 % below its 60 s optimum; the moves it had not tried
//!   were devices moved between apps (docs/allocator.md, "Proteus").
//! - **The greedy plan** when no MILP finds a plan in the allocation's time limit:
//!   each app's fastest variant, devices given one at a time to the app whose demand
//!   is least covered, then the same local search.
//!
//! The routing of a fixed placement: every app is independent (its shares touch only
//! its own variants' devices), and the accuracy objective (Proteus §4, Eq. 7) credits
//! each request with its variant's accuracy, so an app's routing fills its variants
//! most accurate first up to their capacity (capacity over the headroom β ≥ 1) and
//! its demand. That is the LP's optimum for the fixed placement (a fractional
//! knapsack). It is feasible when the capacity covers the least the app must be
//! served: all of its demand at β ≥ 1, β of it below (per-app shedding, as the
//! aggregated model).

use std::time::Instant;

use super::{make_plan, Cand, Plan, Problem, Step};

/// Scores placements of one problem at one demand factor.
pub(crate) struct Scorer<'a> {
    problem: &'a Problem,
    cands: &'a [Cand],
    /// Which candidates a placement may use.
    keep: &'a [bool],
    beta: f64,
    /// Per app, its usable candidates, most accurate first (ties: the faster first).
    by_app: Vec<Vec<usize>>,
    /// Per type, its usable candidates.
    by_type: Vec<Vec<usize>>,
    /// Requests/s one device of the candidate may be routed: P over the headroom.
    each: Vec<f64>,
    /// The least each app must be served (0 for an app planned as absent).
    least: Vec<f64>,
    /// The most each app can be served: its demand (0 when absent).
    most: Vec<f64>,
    /// Total demand, the objective's denominator.
    total: f64,
}

/// Relative slack on capacity checks: a MILP's plan meets its rows to HiGHS's
/// feasibility tolerance, not exactly.
const SLACK: f64 = 1e-6;

impl<'a> Scorer<'a> {
    /// A scorer for `problem` at factor `beta` over the candidates marked in `keep`;
    /// the apps marked `absent` are served nothing.
    pub(crate) fn new(problem: &'a Problem, cands: &'a [Cand], keep: &'a [bool], absent: &[bool], beta: f64) -> Self {
        let apps = problem.apps.len();
        let usable = |i: usize| keep[i] && problem.devices[cands[i].t].count > 0 && !absent[cands[i].q];
        let mut by_app: Vec<Vec<usize>> = vec![Vec::new(); apps];
        let mut by_type: Vec<Vec<usize>> = vec![Vec::new(); problem.devices.len()];
        for (i, c) in cands.iter().enumerate() {
            if usable(i) {
                by_app[c.q].push(i);
                by_type[c.t].push(i);
            }
        }
        for list in &mut by_app {
            list.sort_by(|&a, &b| {
                cands[b].accuracy.total_cmp(&cands[a].accuracy).then(cands[b].cap.qps.total_cmp(&cands[a].cap.qps))
            });
        }
        let headroom = beta.max(1.0);
        let demand: Vec<f64> =
            problem.apps.iter().zip(absent).map(|(a, &gone)| if gone { 0.0 } else { a.demand_qps }).collect();
        Scorer {
            problem,
            cands,
            keep,
            beta,
            by_app,
            by_type,
            each: cands.iter().map(|c| c.cap.qps / headroom).collect(),
            least: demand.iter().map(|s| s * beta.min(1.0)).collect(),
            most: demand,
            total: problem.apps.iter().map(|a| a.demand_qps).sum::<f64>().max(1e-12),
        }
    }

    /// App `q`'s accuracy mass (Σ accuracy × requests/s routed) under the placement
    /// `n` (devices per candidate), or None when its capacity does not cover the least
    /// it must be served.
    fn app(&self, q: usize, n: &[u32]) -> Option<f64> {
        let mut left = self.most[q];
        let mut capacity = 0.0;
        let mut mass = 0.0;
        for &i in &self.by_app[q] {
            if n[i] == 0 {
                continue;
            }
            let cap = self.each[i] * n[i] as f64;
            capacity += cap;
            let load = cap.min(left);
            mass += load * self.cands[i].accuracy;
            left -= load;
        }
        (capacity >= self.least[q] * (1.0 - SLACK)).then_some(mass)
    }

    /// The objective of placement `n` (Eq. 7: accuracy mass over total demand), or
    /// None when an app is not covered or a type has more devices placed than it has.
    pub(crate) fn objective(&self, n: &[u32]) -> Option<f64> {
        for (t, list) in self.by_type.iter().enumerate() {
            if list.iter().map(|&i| n[i]).sum::<u32>() > self.problem.devices[t].count {
                return None;
            }
        }
        let mut sum = 0.0;
        for q in 0..self.by_app.len() {
            sum += self.app(q, n)?;
        }
        Some(sum / self.total)
    }

    /// A placement read off a plan: its devices per candidate (0 where a route is not
    /// a usable candidate, which the caller's `objective` then judges).
    pub(crate) fn counts(&self, plan: &Plan) -> Vec<u32> {
        let mut n = vec![0u32; self.cands.len()];
        for r in &plan.routes {
            let found = self.cands.iter().enumerate().position(|(i, c)| {
                self.keep[i]
                    && c.model == r.model
                    && self.problem.apps[c.q].name == r.app
                    && self.problem.devices[c.t].name == r.device_type
            });
            if let Some(i) = found {
                n[i] += r.devices;
            }
        }
        n
    }

    /// Raises the objective of placement `n` by moving devices: one device of a type
    /// from a variant (or from idle) to another variant of any app (or to idle),
    /// taking the best such move each round; when none improves, the best pair of
    /// moves (e.g. an app gives up a device of one type for a more accurate variant
    /// and takes one of another type from a second app: neither helps alone). Stops
    /// when no pair improves or at `deadline`; with none, only at a local optimum
    /// (each round gains more than a rounding error, so it ends), which makes the
    /// result independent of the machine's speed, as the simulator needs. `n` must
    /// be feasible (`objective` is Some); returns the moves made.
    pub(crate) fn improve(&self, n: &mut [u32], deadline: Option<Instant>) -> usize {
        let apps = self.by_app.len();
        let mut value: Vec<f64> = match (0..apps).map(|q| self.app(q, n)).collect::<Option<Vec<f64>>>() {
            Some(v) => v,
            None => return 0,
        };
        let mut free: Vec<u32> = self
            .by_type
            .iter()
            .enumerate()
            .map(|(t, list)| self.problem.devices[t].count.saturating_sub(list.iter().map(|&i| n[i]).sum()))
            .collect();
        let mut made = 0;
        // Gains below this are rounding, not improvement.
        let eps = 1e-9 * self.total;
        loop {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
            let moves = self.moves(n, &free);
            let mut best: Option<(f64, [Option<Move>; 2])> = None;
            for &m in &moves {
                if let Some(gain) = self.gain(n, &mut free, &value, &[m]) {
                    if gain > eps && best.is_none_or(|b| gain > b.0) {
                        best = Some((gain, [Some(m), None]));
                    }
                }
            }
            if best.is_none() {
                // Pairs: the second move after the first, from the state it leaves.
                'pairs: for &m1 in &moves {
                    m1.apply(n, &mut free, 1);
                    let second = self.moves(n, &free);
                    m1.apply(n, &mut free, -1);
                    for &m2 in &second {
                        if m2.undoes(m1) {
                            continue;
                        }
                        if let Some(gain) = self.gain(n, &mut free, &value, &[m1, m2]) {
                            if gain > eps && best.is_none_or(|b| gain > b.0) {
                                best = Some((gain, [Some(m1), Some(m2)]));
                            }
                        }
                    }
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        break 'pairs;
                    }
                }
            }
            let Some((_, chosen)) = best else { break };
            for m in chosen.into_iter().flatten() {
                m.apply(n, &mut free, 1);
                made += 1;
            }
            for q in chosen.into_iter().flatten().flat_map(|m| m.apps(self.cands)).flatten() {
                value[q] = self.app(q, n).unwrap_or(value[q]);
            }
        }
        made
    }

    /// Every single-device move from the placement `n` with `free` idle devices.
    fn moves(&self, n: &[u32], free: &[u32]) -> Vec<Move> {
        let mut out = Vec::new();
        for (t, list) in self.by_type.iter().enumerate() {
            let sources = list.iter().copied().filter(|&i| n[i] > 0).map(Some).chain((free[t] > 0).then_some(None));
            for from in sources {
                for &j in list {
                    if Some(j) != from {
                        out.push(Move { t, from, to: Some(j) });
                    }
                }
                if from.is_some() {
                    out.push(Move { t, from, to: None });
                }
            }
        }
        out
    }

    /// The objective's gain (in accuracy mass) of making `moves` in turn, or None
    /// when an app they touch is left uncovered. Leaves `n` and `free` as they were.
    fn gain(&self, n: &mut [u32], free: &mut [u32], value: &[f64], moves: &[Move]) -> Option<f64> {
        for m in moves {
            m.apply(n, free, 1);
        }
        let mut touched = [usize::MAX; 4];
        let mut k = 0;
        for q in moves.iter().flat_map(|m| m.apps(self.cands)).flatten() {
            if !touched[..k].contains(&q) {
                touched[k] = q;
                k += 1;
            }
        }
        let mut gain = Some(0.0);
        for &q in &touched[..k] {
            match self.app(q, n) {
                Some(v) => gain = gain.map(|g| g + v - value[q]),
                None => {
                    gain = None;
                    break;
                }
            }
        }
        for m in moves.iter().rev() {
            m.apply(n, free, -1);
        }
        gain
    }

    /// The plan of placement `n`: each app routed most accurate first (the module's
    /// routing), served as much of its demand as its capacity allows. None when `n`
    /// is not feasible.
    pub(crate) fn plan(&self, n: &[u32]) -> Option<Plan> {
        self.objective(n)?;
        let mut routes = Vec::new();
        let mut served = vec![0.0; self.by_app.len()];
        for (q, list) in self.by_app.iter().enumerate() {
            let mut left = self.most[q];
            let mut loads = Vec::new();
            for &i in list {
                if n[i] == 0 {
                    continue;
                }
                let load = (self.each[i] * n[i] as f64).min(left);
                left -= load;
                loads.push((i, n[i], load));
            }
            served[q] = self.most[q] - left;
            for (i, k, load) in loads {
                let share = if served[q] > 0.0 { load / served[q] } else { 0.0 };
                routes.push((i, k, share));
            }
        }
        Some(make_plan(self.problem, self.cands, &routes, self.beta, &served, Step::Accuracy))
    }
}

/// One device of type `t` moved from a candidate's variant (None: idle) to another's
/// (None: idle).
#[derive(Clone, Copy, PartialEq)]
struct Move {
    t: usize,
    from: Option<usize>,
    to: Option<usize>,
}

impl Move {
    /// Makes the move (`sign` 1) or takes it back (-1).
    fn apply(self, n: &mut [u32], free: &mut [u32], sign: i32) {
        let add = |x: &mut u32, d: i32| *x = x.wrapping_add_signed(d);
        match self.from {
            Some(i) => add(&mut n[i], -sign),
            None => add(&mut free[self.t], -sign),
        }
        match self.to {
            Some(j) => add(&mut n[j], sign),
            None => add(&mut free[self.t], sign),
        }
    }

    /// Whether this move takes `other` back.
    fn undoes(self, other: Move) -> bool {
        self.t == other.t && self.from == other.to && self.to == other.from
    }

    /// The apps whose devices it changes.
    fn apps(self, cands: &[Cand]) -> [Option<usize>; 2] {
        [self.from.map(|i| cands[i].q), self.to.map(|j| cands[j].q)]
    }
}

/// The greedy placement (no solver): each app's fastest variant on each device type
/// (the most requests/s per device), devices given one at a time to the app whose
/// capacity covers the least of its demand, on the type where that variant is
/// fastest, until every app has the ladder's first factor of headroom or no device is
/// left. A fixed placement ([`Problem::pinned`]) keeps its devices per (type, app),
/// each with the app's fastest variant there. None when no app has a usable variant.
pub(crate) fn greedy(problem: &Problem, cands: &[Cand], allowed: &[bool], absent: &[bool]) -> Option<Vec<u32>> {
    let (types, apps) = (problem.devices.len(), problem.apps.len());
    // fastest[t][q]: the candidate.
    let mut fastest: Vec<Vec<Option<usize>>> = vec![vec![None; apps]; types];
    for (i, c) in cands.iter().enumerate() {
        if !allowed[i] || absent[c.q] || problem.devices[c.t].count == 0 {
            continue;
        }
        let slot = &mut fastest[c.t][c.q];
        if slot.is_none_or(|j| c.cap.qps > cands[j].cap.qps) {
            *slot = Some(i);
        }
    }
    if fastest.iter().flatten().all(Option::is_none) {
        return None;
    }
    let mut n = vec![0u32; cands.len()];
    if let Some(pins) = &problem.pinned {
        for (t, row) in pins.iter().enumerate().take(types) {
            for (q, &k) in row.iter().enumerate().take(apps) {
                if let Some(i) = fastest[t][q] {
                    n[i] = k;
                }
            }
        }
        return Some(n);
    }
    let mut free: Vec<u32> = problem.devices.iter().map(|d| d.count).collect();
    let mut capacity = vec![0.0; apps];
    let demand: Vec<f64> = problem.apps.iter().map(|a| a.demand_qps).collect();
    let top = problem.ladder.beta;
    loop {
        let pick = (0..apps)
            .filter(|&q| !absent[q] && demand[q] > 0.0 && capacity[q] < top * demand[q])
            .filter_map(|q| {
                let i = (0..types)
                    .filter(|&t| free[t] > 0)
                    .filter_map(|t| fastest[t][q])
                    .max_by(|&a, &b| cands[a].cap.qps.total_cmp(&cands[b].cap.qps))?;
                Some((q, i))
            })
            .min_by(|&(a, _), &(b, _)| (capacity[a] / demand[a]).total_cmp(&(capacity[b] / demand[b])));
        let Some((q, i)) = pick else { break };
        n[i] += 1;
        free[cands[i].t] -= 1;
        capacity[q] += cands[i].cap.qps;
    }
    Some(n)
}

/// The previous plan's placement over this problem's candidates (its devices per
/// type, app and variant), for re-routing at the new demand; None when it names a
/// device type, app or variant the problem does not have as a usable candidate, or
/// places more devices of a type than the problem has.
pub(crate) fn repaired(
    problem: &Problem,
    cands: &[Cand],
    allowed: &[bool],
    absent: &[bool],
    previous: &Plan,
) -> Option<Vec<u32>> {
    let mut n = vec![0u32; cands.len()];
    for r in previous.routes.iter().filter(|r| r.devices > 0) {
        let i = cands.iter().enumerate().position(|(i, c)| {
            allowed[i]
                && !absent[c.q]
                && c.model == r.model
                && problem.apps[c.q].name == r.app
                && problem.devices[c.t].name == r.device_type
        })?;
        n[i] += r.devices;
    }
    for (t, d) in problem.devices.iter().enumerate() {
        if cands.iter().zip(&n).filter(|(c, _)| c.t == t).map(|(_, k)| *k).sum::<u32>() > d.count {
            return None;
        }
    }
    Some(n)
}

/// The plan of placement `n` made without a solver: at the highest step of the ladder
/// its capacity covers for every app (below the ladder's floor, the fraction it
/// covers: every app is still served as much as its devices allow), improved by
/// the local search until `by` (not for a fixed placement), routed most accurate
/// first.
pub(crate) fn finish(
    problem: &Problem,
    cands: &[Cand],
    allowed: &[bool],
    absent: &[bool],
    mut n: Vec<u32>,
    by: Instant,
) -> Option<Plan> {
    let mut covered = f64::INFINITY;
    for (q, a) in problem.apps.iter().enumerate() {
        if absent[q] || a.demand_qps <= 0.0 {
            continue;
        }
        let cap: f64 = cands.iter().zip(&n).filter(|(c, _)| c.q == q).map(|(c, k)| c.cap.qps * *k as f64).sum();
        covered = covered.min(cap / a.demand_qps);
    }
    let steps = problem.ladder.steps();
    let top = steps.first().copied().unwrap_or(1.0);
    let covered = covered.min(top);
    // Coverage c means capacity ≥ c·demand: a step β ≤ c has its headroom (β ≥ 1)
    // or its floor (β < 1).
    let beta = steps.iter().copied().find(|&b| b <= covered + 1e-9).unwrap_or(covered * (1.0 - 1e-9)).max(0.0);
    let scorer = Scorer::new(problem, cands, allowed, absent, beta);
    scorer.objective(&n)?;
    if problem.pinned.is_none() {
        scorer.improve(&mut n, Some(by));
    }
    scorer.plan(&n)
}
