//! Loki's plans made without a solver, and the check every plan meets.
//!
//! When no MILP finds a plan within the allocation's time limit ([`super::solve_from`]),
//! the answer is still a plan valid under §4.1's constraints:
//! - [`greedy`]: one variant and batch size per task (so every chain has one path,
//!   share 1, and the chains agree on shared tasks trivially), every chain within its
//!   latency budget (6)–(7), workers per task the fewest that carry its load (2) at
//!   the highest step of the ladder the cluster (3) allows. Which variant and batch:
//!   a hill climb from each task's fastest option and from its most accurate one,
//!   one task's (variant, batch) changed at a time while that raises the step, then
//!   the accuracy, then lowers the workers — Loki's "most accurate variants, scaled
//!   until the workers run out, then faster variants" — two tasks at once when no
//!   single change helps; then the workers left spare split one task's traffic with a
//!   more accurate variant (`with_split`). Milliseconds on traffic analysis;
//! - [`repaired`]: the previous plan's variants, batch sizes and path shares, its
//!   workers rescaled to the new demand at the highest step they fit in.
//!
//! [`Plan::check`] states the constraints as the MILP's plans meet them, and both
//! kinds of plan are checked with it before they are returned.

use crate::violation::Violation;
use std::collections::BTreeMap;

use super::{ChainPlan, PathShare};
use super::{Plan, Problem, Scaling, Step, VariantPlan};

/// Tolerance of [`Plan::check`] on shares and on loads relative to capacity: HiGHS's
/// feasibility tolerance is 1e-7 on rows of coefficients about 1, and the MILP drops
/// paths with a share under 1e-9.
const TOLERANCE: f64 = 1e-6;

/// Paths are within their budget up to this, ms (as the MILP's path enumeration).
const LATENCY_TOLERANCE_MS: f64 = 1e-9;

/// Hill-climbing rounds at most; each strictly improves the key, so this only bounds
/// a pathological instance.
const MAX_ROUNDS: usize = 10_000;

/// A hosted (task, variant): its batch size and workers.
#[derive(Clone, Debug)]
struct Hosted {
    task: usize,
    variant: usize,
    batch: u32,
    replicas: u32,
}

/// Per chain, its paths: the variant index at each position (0 for a pass-through
/// task, as the MILP indexes them) and the share.
type Paths = Vec<Vec<(Vec<usize>, f64)>>;

/// Per task, None for a pass-through task, else (variant, batch size).
type Selection = Vec<Option<(usize, u32)>>;

/// The chains, their budgets and each task's first chain, computed once.
struct Shape {
    chains: Vec<Vec<usize>>,
    budgets: Vec<f64>,
    first: Vec<(usize, usize)>,
}

impl Shape {
    fn new(p: &Problem) -> Shape {
        let chains = p.pipeline.task_paths();
        let budgets = p.budgets(&chains);
        let first = p.first_chains(&chains);
        Shape { chains, budgets, first }
    }
}

/// Requests reaching each (task, variant) per request served: Σ over the paths of
/// the task's first chain through the variant of m(p, i, k)·c(p) (the left side of
/// (2) over D·β).
fn unit_loads(p: &Problem, shape: &Shape, paths: &Paths) -> BTreeMap<(usize, usize), f64> {
    let mut loads = BTreeMap::new();
    for (t, vs) in p.variants.iter().enumerate() {
        if vs.is_empty() {
            continue;
        }
        let (ci, pos) = shape.first[t];
        for (ks, share) in &paths[ci] {
            *loads.entry((t, ks[pos])).or_insert(0.0) += p.multiplier(&shape.chains[ci], ks, pos) * share;
        }
    }
    loads
}

/// The plan of `hosted` and `paths` at factor `beta`, its loads, accuracy and
/// shares as the MILP reports them.
fn build(p: &Problem, shape: &Shape, step: Step, beta: f64, hosted: &[Hosted], paths: &Paths) -> Plan {
    let served = p.demand_qps * beta.min(1.0);
    let loads = unit_loads(p, shape, paths);
    let mut hosted: Vec<&Hosted> = hosted.iter().filter(|h| h.replicas > 0).collect();
    hosted.sort_by_key(|h| (h.task, h.variant));
    let variants: Vec<VariantPlan> = hosted
        .iter()
        .map(|h| {
            let v = &p.variants[h.task][h.variant];
            VariantPlan {
                task: p.pipeline.tasks[h.task].name.clone(),
                variant: v.name.clone(),
                replicas: h.replicas,
                batch: h.batch,
                latency_us: v.latency(h.batch).unwrap_or(0),
                capacity_qps: v.throughput(h.batch),
                load_qps: served * loads.get(&(h.task, h.variant)).copied().unwrap_or(0.0),
                accuracy: v.accuracy,
            }
        })
        .collect();
    let batch = |t: usize, k: usize| hosted.iter().find(|h| h.task == t && h.variant == k).map(|h| h.batch);
    let weight = 1.0 / shape.chains.len().max(1) as f64;
    let mut accuracy = 0.0;
    let chains = shape
        .chains
        .iter()
        .zip(paths)
        .map(|(chain, ps)| ChainPlan {
            tasks: chain.iter().map(|&t| p.pipeline.tasks[t].name.clone()).collect(),
            paths: ps
                .iter()
                .filter(|(_, share)| *share > 1e-9)
                .map(|(ks, share)| {
                    let acc = p.path_accuracy(chain, ks);
                    accuracy += weight * share * acc;
                    PathShare {
                        variants: chain
                            .iter()
                            .zip(ks)
                            .map(|(&t, &k)| match p.variants[t].get(k) {
                                Some(v) => v.name.clone(),
                                None => p.pipeline.tasks[t].name.clone(),
                            })
                            .collect(),
                        share: *share,
                        accuracy: acc,
                        latency_us: chain
                            .iter()
                            .zip(ks)
                            .filter_map(|(&t, &k)| p.variants[t].get(k).and_then(|v| v.latency(batch(t, k)?)))
                            .sum(),
                    }
                })
                .collect(),
        })
        .collect();
    Plan {
        step: step.name(),
        beta,
        demand_qps: p.demand_qps,
        served_qps: served,
        shed_qps: p.demand_qps - served,
        workers: hosted.iter().map(|h| h.replicas).sum(),
        accuracy,
        variants,
        chains,
    }
}

/// The plan's hosted variants and paths in indices; an error naming what does not
/// match the problem.
fn parse(p: &Problem, shape: &Shape, plan: &Plan) -> Result<(Vec<Hosted>, Paths), Violation> {
    let mut hosted: Vec<Hosted> = Vec::new();
    for v in &plan.variants {
        let t = p
            .pipeline
            .tasks
            .iter()
            .position(|t| t.name == v.task)
            .ok_or_else(|| Violation::Shape(format!("task `{}` is not in the pipeline", v.task)))?;
        let k = p.variants[t]
            .iter()
            .position(|x| x.name == v.variant)
            .ok_or_else(|| Violation::Shape(format!("variant `{}` is not a model of task `{}`", v.variant, v.task)))?;
        if hosted.iter().any(|h| h.task == t && h.variant == k) {
            return Err(Violation::Constraint(format!(
                "variant `{}` of `{}` hosted twice (one batch size per variant, (4))",
                v.variant, v.task
            )));
        }
        hosted.push(Hosted { task: t, variant: k, batch: v.batch, replicas: v.replicas });
    }
    if plan.chains.len() != shape.chains.len() {
        return Err(Violation::Shape(format!("{} chains, the pipeline has {}", plan.chains.len(), shape.chains.len())));
    }
    let mut paths: Paths = Vec::new();
    for (cp, chain) in plan.chains.iter().zip(&shape.chains) {
        let names: Vec<&str> = chain.iter().map(|&t| p.pipeline.tasks[t].name.as_str()).collect();
        if cp.tasks.iter().map(String::as_str).ne(names.iter().copied()) {
            return Err(Violation::Shape(format!("chain {:?}: expected the tasks {names:?}", cp.tasks)));
        }
        let mut ps = Vec::new();
        for path in &cp.paths {
            if path.variants.len() != chain.len() {
                return Err(Violation::Shape(format!(
                    "path {:?}: one entry per task of its chain expected",
                    path.variants
                )));
            }
            let ks = chain
                .iter()
                .zip(&path.variants)
                .map(|(&t, name)| {
                    if p.variants[t].is_empty() {
                        (name == &p.pipeline.tasks[t].name).then_some(0)
                    } else {
                        p.variants[t].iter().position(|v| &v.name == name)
                    }
                })
                .collect::<Option<Vec<usize>>>()
                .ok_or_else(|| {
                    Violation::Shape(format!("path {:?}: not variants of its chain's tasks", path.variants))
                })?;
            ps.push((ks, path.share));
        }
        paths.push(ps);
    }
    Ok((hosted, paths))
}

impl Plan {
    /// Checks the plan against §4.1's constraints as the MILP writes them: hosted
    /// variants of their tasks, one batch size each from the allowed ones, with its
    /// latency and throughput (4)–(5); Σ workers ≤ S (3); per chain, shares ≥ 0 summing
    /// to 1 over paths of hosted variants, each path within the chain's budget (L −
    /// n_p·comm)/2 (6)–(7); chains that share a task agree on the share through every
    /// prefix up to it; every variant's workers carry β·D·Σ c(p)·m(p, i, k) (2); β a
    /// step of the ladder, served D·min(β, 1) and the rest shed; a `hardware` plan uses
    /// each task's most accurate variants only (10) (and, under `scaling = "loki"`, is
    /// at the ladder's first step), `hardware-only` plans are `hardware` and
    /// `accuracy-only` ones `accuracy`; the reported loads, accuracy and path latencies
    /// as computed from the shares. Every plan [`super::solve_from`] returns meets it, a
    /// solver's or not. The error names the task, variant, chain or row.
    pub fn check(&self, problem: &Problem) -> Result<(), Violation> {
        let p = problem;
        let shape = Shape::new(p);
        let (hosted, paths) = parse(p, &shape, self)?;
        let best = p.most_accurate();
        // (4)–(5), and the step's variants.
        for (h, v) in hosted.iter().zip(&self.variants) {
            let variant = &p.variants[h.task][h.variant];
            let Some(latency) = variant.latency(h.batch) else {
                return Err(Violation::Constraint(format!(
                    "variant `{}`: batch {} is not an allowed, measured size",
                    v.variant, h.batch
                )));
            };
            if v.latency_us != latency || (v.capacity_qps - variant.throughput(h.batch)).abs() > 1e-9 {
                return Err(Violation::Reported(format!(
                    "variant `{}`: latency or capacity is not its batch {}'s",
                    v.variant, h.batch
                )));
            }
            if h.replicas == 0 {
                return Err(Violation::Constraint(format!("variant `{}`: hosted with no workers", v.variant)));
            }
            if self.step == "hardware" && !best[h.task][h.variant] {
                return Err(Violation::Constraint(format!(
                    "variant `{}`: a hardware-scaling plan hosts only the most accurate",
                    v.variant
                )));
            }
        }
        match (self.step.as_str(), p.scaling) {
            ("hardware", Scaling::AccuracyOnly) | ("accuracy", Scaling::HardwareOnly) => {
                return Err(Violation::Constraint(format!("step `{}` under scaling {:?}", self.step, p.scaling)));
            }
            ("hardware" | "accuracy", _) => {}
            (other, _) => return Err(Violation::Shape(format!("step `{other}`: expected `hardware` or `accuracy`"))),
        }
        // (3).
        let workers: u32 = hosted.iter().map(|h| h.replicas).sum();
        if workers != self.workers || workers > p.workers {
            return Err(Violation::Constraint(format!(
                "{} workers (hosted: {workers}), at most {}",
                self.workers, p.workers
            )));
        }
        // β, served and shed.
        let steps = p.ladder.steps();
        if !steps.iter().any(|&b| (b - self.beta).abs() < 1e-9) {
            return Err(Violation::Constraint(format!("beta {}: not a step of the ladder", self.beta)));
        }
        if p.scaling == Scaling::Loki
            && self.step == "hardware"
            && steps.first().is_some_and(|&b| (b - self.beta).abs() > 1e-9)
        {
            return Err(Violation::Constraint(format!(
                "a hardware-scaling plan at beta {}, not the ladder's first step",
                self.beta
            )));
        }
        let served = p.demand_qps * self.beta.min(1.0);
        let near = |a: f64, b: f64| (a - b).abs() <= TOLERANCE * a.abs().max(b.abs()).max(1.0);
        if !near(self.served_qps, served) || !near(self.shed_qps, p.demand_qps - served) {
            return Err(Violation::Reported(format!(
                "served {} and shed {} req/s, expected {served}",
                self.served_qps, self.shed_qps
            )));
        }
        // (6)–(7) and the shares.
        let batch = |t: usize, k: usize| hosted.iter().find(|h| h.task == t && h.variant == k).map(|h| h.batch);
        for ((ps, chain), (&budget, cp)) in paths.iter().zip(&shape.chains).zip(shape.budgets.iter().zip(&self.chains))
        {
            let total: f64 = ps.iter().map(|(_, c)| c).sum();
            if !near(total, 1.0) || ps.iter().any(|(_, c)| *c < -TOLERANCE) {
                return Err(Violation::Constraint(format!("chain {:?}: shares sum to {total}, expected 1", cp.tasks)));
            }
            for ((ks, _), path) in ps.iter().zip(&cp.paths) {
                let mut latency_us = 0;
                for (&t, &k) in chain.iter().zip(ks) {
                    if p.variants[t].is_empty() {
                        continue;
                    }
                    let Some(b) = batch(t, k) else {
                        return Err(Violation::Constraint(format!(
                            "path {:?}: `{}` carries traffic but is not hosted",
                            path.variants, p.variants[t][k].name
                        )));
                    };
                    latency_us += p.variants[t][k].latency(b).unwrap_or(u64::MAX / 64);
                }
                if latency_us as f64 / 1000.0 > budget + LATENCY_TOLERANCE_MS || path.latency_us != latency_us {
                    return Err(Violation::Constraint(format!(
                        "path {:?}: {} ms (reported {} ms), over the chain's budget of {budget} ms",
                        path.variants,
                        latency_us as f64 / 1000.0,
                        path.latency_us as f64 / 1000.0
                    )));
                }
                if (path.accuracy - p.path_accuracy(chain, ks)).abs() > 1e-9 {
                    return Err(Violation::Reported(format!(
                        "path {:?}: accuracy is not the product of its variants'",
                        path.variants
                    )));
                }
            }
        }
        // The chains agree where they share a task.
        for (t, task) in p.pipeline.tasks.iter().enumerate() {
            if task.children.len() < 2 {
                continue;
            }
            let through: Vec<usize> = task.children.iter().map(|&c| shape.first[c].0).collect();
            let depth = shape.chains[through[0]].iter().position(|&x| x == t).expect("task on its chain") + 1;
            let mut prefixes: Vec<&[usize]> =
                through.iter().flat_map(|&ci| paths[ci].iter().map(move |(ks, _)| &ks[..depth])).collect();
            prefixes.sort();
            prefixes.dedup();
            for prefix in prefixes {
                let sum = |ci: usize| -> f64 {
                    paths[ci].iter().filter(|(ks, _)| &ks[..depth] == prefix).map(|(_, c)| c).sum()
                };
                if through.iter().any(|&ci| !near(sum(ci), sum(through[0]))) {
                    return Err(Violation::Constraint(format!(
                        "task `{}`: its children's chains disagree on the share through it",
                        task.name
                    )));
                }
            }
        }
        // (2), and the reported loads.
        let loads = unit_loads(p, &shape, &paths);
        for (h, v) in hosted.iter().zip(&self.variants) {
            let unit = loads.get(&(h.task, h.variant)).copied().unwrap_or(0.0);
            let need = self.beta.max(0.0) * p.demand_qps * unit;
            let capacity = h.replicas as f64 * p.variants[h.task][h.variant].throughput(h.batch);
            if need > capacity * (1.0 + TOLERANCE) + TOLERANCE {
                return Err(Violation::Constraint(format!(
                    "variant `{}`: {need} req/s at beta {} over its capacity {capacity}",
                    v.variant, self.beta
                )));
            }
            if !near(v.load_qps, served * unit) {
                return Err(Violation::Reported(format!(
                    "variant `{}`: load {} req/s, the shares give {}",
                    v.variant,
                    v.load_qps,
                    served * unit
                )));
            }
        }
        let weight = 1.0 / shape.chains.len().max(1) as f64;
        let accuracy: f64 = paths
            .iter()
            .zip(&shape.chains)
            .flat_map(|(ps, chain)| ps.iter().map(move |(ks, c)| weight * c * p.path_accuracy(chain, ks)))
            .sum();
        if (accuracy - self.accuracy).abs() > TOLERANCE {
            return Err(Violation::Reported(format!("accuracy {}, the shares give {accuracy}", self.accuracy)));
        }
        Ok(())
    }
}

/// The step a plan made without a solver is labelled with: `scaling`'s only step, or
/// under Loki's, `hardware` for the most accurate variants at the first step.
fn step_of(p: &Problem, beta: f64, most_accurate_only: bool) -> Step {
    match p.scaling {
        Scaling::HardwareOnly => Step::Hardware,
        Scaling::AccuracyOnly => Step::Accuracy,
        Scaling::Loki => {
            let first = p.ladder.steps().first().copied().unwrap_or(1.0);
            if most_accurate_only && (beta - first).abs() < 1e-9 {
                Step::Hardware
            } else {
                Step::Accuracy
            }
        }
    }
}

/// The previous plan repaired for `problem`: its variants, batch sizes and path
/// shares kept, each variant's workers the fewest that carry its load at the
/// highest step of the ladder whose total fits the cluster. None when the plan does
/// not fit the problem (other tasks or variants), serves nothing to scale from, or
/// no step fits.
pub fn repaired(problem: &Problem, previous: &Plan) -> Option<Plan> {
    let p = problem;
    let shape = Shape::new(p);
    let (hosted, paths) = parse(p, &shape, previous).ok()?;
    let loads = unit_loads(p, &shape, &paths);
    // A variant on a path with traffic keeps a worker even where its load is 0.
    let carrying: Vec<bool> = hosted
        .iter()
        .map(|h| {
            let (ci, pos) = shape.first[h.task];
            paths[ci].iter().any(|(ks, c)| ks[pos] == h.variant && *c > 1e-9)
        })
        .collect();
    let best = p.most_accurate();
    let most_accurate_only = hosted.iter().all(|h| best[h.task][h.variant]);
    for beta in p.ladder.steps() {
        let mut scaled = hosted.clone();
        for (h, &carries) in scaled.iter_mut().zip(&carrying) {
            let unit = loads.get(&(h.task, h.variant)).copied().unwrap_or(0.0);
            let q = p.variants[h.task][h.variant].throughput(h.batch);
            let need = (beta.max(0.0) * p.demand_qps * unit / q.max(1e-12) - 1e-9).ceil().max(0.0);
            h.replicas = if carries { (need as u32).max(1) } else { 0 };
        }
        if scaled.iter().map(|h| u64::from(h.replicas)).sum::<u64>() <= u64::from(p.workers) {
            let step = step_of(p, beta, most_accurate_only);
            return Some(build(p, &shape, step, beta, &scaled, &paths));
        }
    }
    None
}

/// Each task's fastest allowed (variant, batch size) (ties to the higher
/// throughput), if every chain then fits its budget: otherwise no path of these
/// variants fits it, and no plan exists at any demand.
fn fastest(p: &Problem, allowed: &[Vec<bool>], shape: &Shape) -> Option<Selection> {
    let sel: Selection = p
        .variants
        .iter()
        .enumerate()
        .map(|(t, vs)| {
            options(vs, &allowed[t]).min_by(|&(k, b), &(k2, b2)| {
                let (l, l2) = (vs[k].latency(b).unwrap_or(u64::MAX), vs[k2].latency(b2).unwrap_or(u64::MAX));
                l.cmp(&l2).then(vs[k2].throughput(b2).total_cmp(&vs[k].throughput(b)))
            })
        })
        .collect();
    if sel.iter().zip(&p.variants).any(|(s, vs)| s.is_none() && !vs.is_empty()) {
        return None;
    }
    fits(p, shape, &sel).then_some(sel)
}

/// Whether every chain has a path within its budget with the variants the scaling
/// allows (the fastest of each task; `hardware-only`: the most accurate): when not,
/// the problem has no plan at any demand.
pub(super) fn has_paths(p: &Problem) -> bool {
    let allowed: Vec<Vec<bool>> = match p.scaling {
        Scaling::HardwareOnly => p.most_accurate(),
        _ => p.variants.iter().map(|vs| vec![true; vs.len()]).collect(),
    };
    fastest(p, &allowed, &Shape::new(p)).is_some()
}

/// A task's allowed (variant, batch size) options.
fn options<'a>(vs: &'a [super::Variant], allowed: &'a [bool]) -> impl Iterator<Item = (usize, u32)> + 'a {
    vs.iter().enumerate().filter(|(k, _)| allowed[*k]).flat_map(|(k, v)| v.latency_us.iter().map(move |&(b, _)| (k, b)))
}

/// Whether every chain of the selection is within its latency budget.
fn fits(p: &Problem, shape: &Shape, sel: &Selection) -> bool {
    shape.chains.iter().zip(&shape.budgets).all(|(chain, &budget)| {
        let ms: f64 = chain
            .iter()
            .filter_map(|&t| sel[t].and_then(|(k, b)| p.variants[t][k].latency(b)))
            .map(|us| us as f64 / 1000.0)
            .sum();
        ms <= budget + LATENCY_TOLERANCE_MS
    })
}

/// The selection's single path per chain: its variant indices (0 for a pass-through).
fn selection_paths(shape: &Shape, sel: &Selection) -> Paths {
    shape
        .chains
        .iter()
        .map(|chain| vec![(chain.iter().map(|&t| sel[t].map_or(0, |(k, _)| k)).collect(), 1.0)])
        .collect()
}

/// What a hill climb on selections compares, larger first.
#[derive(Clone, Copy, PartialEq, PartialOrd)]
struct Key(f64, f64, f64);

/// The selection's workers per task at `beta`, the fewest that carry its load (one
/// at least: a task on the path has a worker).
fn workers_at(p: &Problem, per_beta: &[(usize, f64)], beta: f64) -> u64 {
    per_beta.iter().map(|&(_, w)| ((beta.max(0.0) * p.demand_qps * w - 1e-9).ceil().max(1.0)) as u64).sum()
}

/// Per hosted task: (task, workers per request/s entering, D·β = 1).
fn per_request(p: &Problem, shape: &Shape, sel: &Selection) -> Vec<(usize, f64)> {
    let paths = selection_paths(shape, sel);
    let loads = unit_loads(p, shape, &paths);
    sel.iter()
        .enumerate()
        .filter_map(|(t, s)| {
            let (k, b) = (*s)?;
            let unit = loads.get(&(t, k)).copied().unwrap_or(0.0);
            Some((t, unit / p.variants[t][k].throughput(b).max(1e-12)))
        })
        .collect()
}

/// The first step (index into `steps`) at which the selection's workers fit the
/// cluster, and those workers.
fn highest_step(p: &Problem, steps: &[f64], per: &[(usize, f64)]) -> Option<(usize, u64)> {
    steps.iter().enumerate().find_map(|(i, &b)| {
        let w = workers_at(p, per, b);
        (w <= u64::from(p.workers)).then_some((i, w))
    })
}

/// The key of a selection: the step reached (earlier is higher), then the accuracy
/// (Step::Accuracy) and fewer workers; a selection that fits no step is ordered by
/// its workers per request, so the climb heads for one that fits.
fn key(p: &Problem, shape: &Shape, steps: &[f64], sel: &Selection, step: Step) -> Key {
    let per = per_request(p, shape, sel);
    let accuracy = || {
        let chains = &shape.chains;
        chains
            .iter()
            .map(|chain| {
                p.path_accuracy(chain, &chain.iter().map(|&t| sel[t].map_or(0, |(k, _)| k)).collect::<Vec<_>>())
            })
            .sum::<f64>()
            / chains.len().max(1) as f64
    };
    match (highest_step(p, steps, &per), step) {
        (Some((i, w)), Step::Accuracy) => Key(-(i as f64), accuracy(), -(w as f64)),
        (Some((i, w)), Step::Hardware) => Key(-(i as f64), -(w as f64), 0.0),
        (None, _) => Key(-(steps.len() as f64), -per.iter().map(|(_, w)| w).sum::<f64>(), 0.0),
    }
}

/// Hill climb from `start`: the best single task's change to one of `moves(t)`
/// that keeps every chain within budget and raises `key`; when none does, the best
/// change of two tasks at once (a more accurate detector fans out more requests, so
/// it often pays only with a faster variant downstream: neither move helps alone);
/// until neither raises it.
fn climb(
    p: &Problem,
    shape: &Shape,
    start: Selection,
    moves: impl Fn(usize) -> Vec<(usize, u32)>,
    key: impl Fn(&Selection) -> Key,
) -> (Selection, Key) {
    let tasks = p.variants.len();
    let moves: Vec<Vec<(usize, u32)>> = (0..tasks).map(moves).collect();
    let mut sel = start;
    let mut current = key(&sel);
    for _ in 0..MAX_ROUNDS {
        let mut best: Option<(Selection, Key)> = None;
        let consider = |next: Selection, changed: &[usize], best: &mut Option<(Selection, Key)>| {
            let Some(next) = refit(p, shape, next, changed) else { return };
            let k = key(&next);
            if improves(k, best.as_ref().map_or(current, |b| b.1)) {
                *best = Some((next, k));
            }
        };
        for t in 0..tasks {
            for &option in moves[t].iter().filter(|&&o| sel[t] != Some(o)) {
                let mut next = sel.clone();
                next[t] = Some(option);
                consider(next, &[t], &mut best);
            }
        }
        if best.is_none() {
            for t in 0..tasks {
                for u in t + 1..tasks {
                    for &a in moves[t].iter().filter(|&&o| sel[t] != Some(o)) {
                        for &b in moves[u].iter().filter(|&&o| sel[u] != Some(o)) {
                            let mut next = sel.clone();
                            (next[t], next[u]) = (Some(a), Some(b));
                            consider(next, &[t, u], &mut best);
                        }
                    }
                }
            }
        }
        match best {
            Some((next, k)) => (sel, current) = (next, k),
            None => break,
        }
    }
    (sel, current)
}

/// `sel` with every chain within its budget: where the tasks in `changed` took
/// time from a chain, the other tasks on it keep their variant and take the batch
/// size of most throughput that fits (a slower detector leaves less time to the
/// classifier after it); None when some chain cannot fit.
fn refit(p: &Problem, shape: &Shape, mut sel: Selection, changed: &[usize]) -> Option<Selection> {
    if fits(p, shape, &sel) {
        return Some(sel);
    }
    let over = |sel: &Selection, t: usize| {
        shape.chains.iter().zip(&shape.budgets).filter(|(chain, _)| chain.contains(&t)).any(|(chain, &budget)| {
            let ms: f64 = chain
                .iter()
                .filter_map(|&u| sel[u].and_then(|(k, b)| p.variants[u][k].latency(b)))
                .map(|us| us as f64 / 1000.0)
                .sum();
            ms > budget + LATENCY_TOLERANCE_MS
        })
    };
    for u in (0..sel.len()).filter(|u| !changed.contains(u)) {
        let Some((k, _)) = sel[u] else { continue };
        if !over(&sel, u) {
            continue;
        }
        let variant = &p.variants[u][k];
        let mut best: Option<(u32, f64)> = None;
        for &(b, _) in &variant.latency_us {
            let mut trial = sel.clone();
            trial[u] = Some((k, b));
            if !over(&trial, u) && best.is_none_or(|(_, q)| variant.throughput(b) > q) {
                best = Some((b, variant.throughput(b)));
            }
        }
        sel[u] = Some((k, best?.0));
    }
    fits(p, shape, &sel).then_some(sel)
}

/// Whether `a` is above `b` by more than rounding, first component first.
fn improves(a: Key, b: Key) -> bool {
    for (x, y) in [(a.0, b.0), (a.1, b.1), (a.2, b.2)] {
        if x > y + 1e-12 {
            return true;
        }
        if x < y - 1e-12 {
            return false;
        }
    }
    false
}

/// The best selection with `allowed` variants over `steps`: climbs from each task's
/// fastest option, and from its most accurate variant with the batch sizes that need
/// the fewest workers within the budgets (a climb over batch sizes alone first) —
/// "the most accurate variants, scaled until the workers run out, then faster ones".
fn best_selection(
    p: &Problem,
    allowed: &[Vec<bool>],
    shape: &Shape,
    steps: &[f64],
    step: Step,
) -> Option<(Selection, Key)> {
    let fast = fastest(p, allowed, shape)?;
    let moves = |t: usize| options(&p.variants[t], &allowed[t]).collect::<Vec<_>>();
    let key_of = |sel: &Selection| key(p, shape, steps, sel, step);
    let mut starts = vec![fast.clone()];
    // The most accurate variant of each task (its fastest batch size), where every
    // chain fits its budget with them; else the fastest option stays.
    let accurate: Selection = p
        .variants
        .iter()
        .enumerate()
        .map(|(t, vs)| {
            let top = options(vs, &allowed[t]).map(|(k, _)| vs[k].accuracy).fold(f64::NEG_INFINITY, f64::max);
            options(vs, &allowed[t])
                .filter(|&(k, _)| vs[k].accuracy >= top)
                .min_by_key(|&(k, b)| vs[k].latency(b).unwrap_or(u64::MAX))
        })
        .collect();
    if fits(p, shape, &accurate) {
        // Its batch sizes raised while that lowers the workers per request.
        let variants: Vec<Option<usize>> = accurate.iter().map(|s| s.map(|(k, _)| k)).collect();
        let batches = |t: usize| match variants[t] {
            Some(k) => p.variants[t][k].latency_us.iter().map(|&(b, _)| (k, b)).collect(),
            None => Vec::new(),
        };
        let fewest = |sel: &Selection| Key(-per_request(p, shape, sel).iter().map(|(_, w)| w).sum::<f64>(), 0.0, 0.0);
        starts.push(climb(p, shape, accurate, batches, fewest).0);
    }
    starts.into_iter().map(|s| climb(p, shape, s, moves, key_of)).reduce(|a, b| if improves(b.1, a.1) { b } else { a })
}

/// The plan of a selection at the highest step it fits, or None.
fn plan_of(p: &Problem, shape: &Shape, steps: &[f64], sel: &Selection, most_accurate_only: bool) -> Option<Plan> {
    let per = per_request(p, shape, sel);
    let (i, _) = highest_step(p, steps, &per)?;
    let beta = steps[i];
    let hosted: Vec<Hosted> = per
        .iter()
        .map(|&(t, w)| {
            let (k, b) = sel[t].expect("a hosted task");
            let replicas = (beta.max(0.0) * p.demand_qps * w - 1e-9).ceil().max(1.0) as u32;
            Hosted { task: t, variant: k, batch: b, replicas }
        })
        .collect();
    let step = step_of(p, beta, most_accurate_only);
    Some(build(p, shape, step, beta, &hosted, &selection_paths(shape, sel)))
}

/// Loki's greedy plan, as [`super::solve`] would order its steps: under `scaling =
/// "loki"`, each task's most accurate variants if they carry the ladder's first
/// step (the fewest workers: hardware scaling), else every variant down the ladder
/// (the most accurate selection at the highest step: accuracy scaling);
/// `hardware-only` and `accuracy-only` take only their step. None when no selection
/// fits any step (the cluster has fewer workers than tasks, or the demand is beyond
/// the ladder's floor) or no chain fits its budget.
pub fn greedy(problem: &Problem) -> Option<Plan> {
    let p = problem;
    let shape = Shape::new(p);
    let steps = p.ladder.steps();
    let best = p.most_accurate();
    let all: Vec<Vec<bool>> = p.variants.iter().map(|vs| vec![true; vs.len()]).collect();
    match p.scaling {
        Scaling::HardwareOnly => {
            let (sel, _) = best_selection(p, &best, &shape, &steps, Step::Hardware)?;
            plan_of(p, &shape, &steps, &sel, true)
        }
        Scaling::AccuracyOnly => {
            let (sel, _) = best_selection(p, &all, &shape, &steps, Step::Accuracy)?;
            with_split(p, &shape, &sel, plan_of(p, &shape, &steps, &sel, false)?)
        }
        Scaling::Loki => {
            let first = &steps[..steps.len().min(1)];
            if let Some((sel, _)) = best_selection(p, &best, &shape, first, Step::Hardware) {
                if let Some(plan) = plan_of(p, &shape, first, &sel, true) {
                    return Some(plan);
                }
            }
            let (sel, _) = best_selection(p, &all, &shape, &steps, Step::Accuracy)?;
            with_split(p, &shape, &sel, plan_of(p, &shape, &steps, &sel, false)?)
        }
    }
}

/// Share steps [`with_split`] tries, from 1/SPLIT_GRID to all of a task's traffic.
const SPLIT_GRID: u32 = 100;

/// The accuracy plan of `sel` with the workers it leaves spare put to use: one task's
/// traffic split between its variant and a more accurate one (each chain through the
/// task gets two paths that differ there, with shares 1 − x and x, so chains still
/// agree), x the largest on a grid of [`SPLIT_GRID`] whose workers fit at the plan's
/// factor; the split that raises the accuracy most, checked, else `plan` as it is.
/// The MILP's plans under load split tasks this way; one path per chain cannot.
fn with_split(p: &Problem, shape: &Shape, sel: &Selection, plan: Plan) -> Option<Plan> {
    let beta = plan.beta;
    let base: Vec<Hosted> = sel
        .iter()
        .enumerate()
        .filter_map(|(t, s)| s.map(|(k, b)| Hosted { task: t, variant: k, batch: b, replicas: 0 }))
        .collect();
    let mut best: Option<Plan> = None;
    for (t, vs) in p.variants.iter().enumerate() {
        let Some((k, _)) = sel[t] else { continue };
        for (k2, b2) in options(vs, &vec![true; vs.len()]).filter(|&(k2, _)| vs[k2].accuracy > vs[k].accuracy) {
            let mut other = sel.clone();
            other[t] = Some((k2, b2));
            if !fits(p, shape, &other) {
                continue;
            }
            let (one, two) = (selection_paths(shape, sel), selection_paths(shape, &other));
            let mut hosted = base.clone();
            hosted.push(Hosted { task: t, variant: k2, batch: b2, replicas: 0 });
            for i in (1..=SPLIT_GRID).rev() {
                let x = f64::from(i) / f64::from(SPLIT_GRID);
                let paths: Paths = shape
                    .chains
                    .iter()
                    .zip(one.iter().zip(&two))
                    .map(|(chain, (a, b))| {
                        if chain.contains(&t) {
                            vec![(a[0].0.clone(), 1.0 - x), (b[0].0.clone(), x)]
                        } else {
                            a.clone()
                        }
                    })
                    .collect();
                let loads = unit_loads(p, shape, &paths);
                let mut total = 0u64;
                for h in &mut hosted {
                    let unit = loads.get(&(h.task, h.variant)).copied().unwrap_or(0.0);
                    let q = p.variants[h.task][h.variant].throughput(h.batch);
                    let carries = !(h.task == t && h.variant == k && i == SPLIT_GRID);
                    let need = (beta.max(0.0) * p.demand_qps * unit / q.max(1e-12) - 1e-9).ceil().max(0.0) as u32;
                    h.replicas = if carries { need.max(1) } else { 0 };
                    total += u64::from(h.replicas);
                }
                if total > u64::from(p.workers) {
                    continue;
                }
                let split = build(p, shape, Step::Accuracy, beta, &hosted, &paths);
                if split.accuracy > best.as_ref().map_or(plan.accuracy, |b| b.accuracy) + 1e-12
                    && split.check(p).is_ok()
                {
                    best = Some(split);
                }
                break;
            }
        }
    }
    Some(best.unwrap_or(plan))
}
