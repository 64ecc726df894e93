//! Building blocks shared by policies, and the host's built-in safe decision.
//!
//! Everything here is allocation-light and dependency-free: the host calls
//! [`safe_decision`] and [`check_decision`] natively on the serving path.

use std::fmt;

use crate::types::{Config, Decision, Dispatch, Micros, Model, Pending, View};

impl Pending {
    /// Time left until this request's deadline at `now`, in microseconds;
    /// negative once the deadline has passed.
    pub fn slack(&self, now: Micros) -> i64 {
        signed(self.deadline).saturating_sub(signed(now))
    }
}

fn signed(t: Micros) -> i64 {
    i64::try_from(t).unwrap_or(i64::MAX)
}

/// Slack of the queue entry at `index`: its deadline minus `view.now`, signed
/// (negative once the deadline has passed).
///
/// # Panics
///
/// If `index >= view.queue.len()`, like slice indexing (in a component a panic
/// is a trap, which the host answers with [`safe_decision`]). Use
/// [`Pending::slack`] on an entry you already hold to avoid the check.
pub fn slack(view: &View, index: usize) -> i64 {
    view.queue[index].slack(view.now)
}

/// Whether the model `id` is in `loaded` (a [`View::loaded`] list).
pub fn is_loaded(loaded: &[u32], id: u32) -> bool {
    loaded.contains(&id)
}

/// The loaded models of `models` that can serve at least a batch of one, in
/// `loaded` order. Ids in `loaded` that name no model are skipped.
pub fn loaded_models<'m, 'l>(models: &'m [Model], loaded: &'l [u32]) -> impl Iterator<Item = &'m Model> + use<'m, 'l> {
    loaded.iter().filter_map(move |&id| models.get(usize::try_from(id).ok()?)).filter(|m| m.max_batch() > 0)
}

/// The loaded model with the lowest batch-1 latency (ties: the lowest id), or
/// `None` when no loaded model can serve.
pub fn fastest_model<'a>(models: &'a [Model], loaded: &[u32]) -> Option<&'a Model> {
    loaded_models(models, loaded).min_by_key(|m| (m.latency[0], m.id))
}

/// The loaded model with the highest accuracy (ties: the lower batch-1 latency,
/// then the lower id), or `None` when no loaded model can serve.
pub fn most_accurate<'a>(models: &'a [Model], loaded: &[u32]) -> Option<&'a Model> {
    loaded_models(models, loaded).max_by(|a, b| {
        a.accuracy.total_cmp(&b.accuracy).then_with(|| b.latency[0].cmp(&a.latency[0])).then_with(|| b.id.cmp(&a.id))
    })
}

/// The most accurate loaded model whose batch-1 latency is at most `budget`
/// (ties: the lower batch-1 latency, then the lower id), or `None` when no
/// loaded model serves even one request within it.
///
/// The usual default model choice of a policy that batches on one model: pass
/// the SLO as `budget` so that a model which cannot serve a lone request in time
/// is never chosen (Proteus §5 and the Clipper/Nexus baselines use one model per
/// worker). Callers typically fall back to [`fastest_model`] on `None`.
pub fn most_accurate_within<'a>(models: &'a [Model], loaded: &[u32], budget: Micros) -> Option<&'a Model> {
    loaded_models(models, loaded).filter(|m| m.latency[0] <= budget).max_by(|a, b| {
        a.accuracy.total_cmp(&b.accuracy).then_with(|| b.latency[0].cmp(&a.latency[0])).then_with(|| b.id.cmp(&a.id))
    })
}

/// The largest batch `b <= cap` (and within the profile) whose latency is at
/// most `budget`; 0 when not even a batch of one fits. Latency profiles need not
/// be monotone: every size up to the cap is considered.
pub fn largest_batch_within(model: &Model, budget: Micros, cap: u32) -> u32 {
    let cap = cap.min(model.max_batch());
    (1..=cap).rev().find(|&b| model.latency(b).is_some_and(|l| l <= budget)).unwrap_or(0)
}

/// How much a larger batch must cut the cost per request, against a batch of one,
/// to be worth its added latency ([`paying_batch`]): 5 %, past the noise of a
/// profile measured over a few dozen runs.
pub const BATCH_GAIN_MIN: f64 = 0.05;

/// The batch size to serve when up to `max` requests could go together: 1 when
/// batching does not pay on `model` (no size up to `max` serves a request for
/// [`BATCH_GAIN_MIN`] less than a batch of one: on a CPU a ResNet-50 batch costs
/// about as much as its requests served one by one, so a batch there only adds
/// latency), otherwise the smallest size whose cost per request is within
/// [`BATCH_GAIN_MIN`] of the cheapest (on a GPU, usually the largest). Returns
/// `max` unchanged when it is 0 or 1 or the profile has gaps.
pub fn paying_batch(model: &Model, max: u32) -> u32 {
    let max = max.min(model.max_batch());
    let per_request = |b: u32| model.latency(b).map(|l| l as f64 / f64::from(b));
    let Some(one) = per_request(1) else { return max };
    let costs: Option<Vec<f64>> = (1..=max).map(per_request).collect();
    let Some(costs) = costs else { return max };
    let best = costs.iter().copied().fold(one, f64::min);
    if max <= 1 || best > one * (1.0 - BATCH_GAIN_MIN) {
        return max.min(1);
    }
    (1..=max).find(|&b| costs[b as usize - 1] <= best * (1.0 + BATCH_GAIN_MIN)).unwrap_or(max)
}

/// When a policy honouring the host's batching window
/// ([`HostSettings::max_batch_wait_us`](crate::HostSettings)) should look again
/// instead of serving now: the queue holds fewer than `target` requests, the head
/// has waited less than `max_wait` since its arrival, and serving a batch of
/// `target` after the wait still meets the head's deadline. Returns the instant to
/// wait until (the arrival of another request wakes the policy sooner), or `None`
/// to serve now.
pub fn batch_window(model: &Model, view: &View, max_wait: Micros, target: u32) -> Option<Micros> {
    let head = view.queue.first()?;
    if max_wait == 0 || view.queue.len() as u64 >= u64::from(target) {
        return None;
    }
    let latest_start = head.deadline.checked_sub(model.latency(target)?)?;
    let until = head.arrival.saturating_add(max_wait).min(latest_start);
    (until > view.now).then_some(until)
}

/// Checks a single-model policy's `model` param at `init`: it must name a model of
/// the app with a latency profile. The error names the policy, the model and the
/// valid names.
pub fn check_model_param(config: &Config, policy: &str, named: Option<&str>) -> Result<(), String> {
    match named {
        Some(name) if config.model_named(name).is_none_or(|m| m.max_batch() == 0) => {
            Err(format!("{policy}: unknown model `{name}` or empty profile (valid models: {})", config.model_names()))
        }
        _ => Ok(()),
    }
}

/// The model a single-model policy serves with: the one its params name, when that
/// model is loaded and profiled; otherwise the most accurate loaded model whose
/// batch-1 latency fits the SLO ([`most_accurate_within`]); otherwise the fastest
/// loaded one. `None` when nothing usable is loaded.
pub fn named_or_most_accurate<'a>(config: &'a Config, named: Option<&str>, loaded: &[u32]) -> Option<&'a Model> {
    let models = &config.models;
    match named.and_then(|n| config.model_named(n)) {
        Some(m) if is_loaded(loaded, m.id) && m.max_batch() > 0 => Some(m),
        _ => most_accurate_within(models, loaded, config.slo).or_else(|| fastest_model(models, loaded)),
    }
}

/// The decision for a plan over the head of the queue, as proactive batching
/// policies (Proteus, Nexus) make them: drop the first `drop` entries and serve the
/// next `fire` on `model`; when firing nothing, wait until `wait_until` (hopeless
/// heads then stay queued and leave with the next batch, so a plan that waits never
/// needs two decisions), else drop only, else idle.
pub fn head_plan(model: u32, drop: u32, fire: u32, wait_until: Option<Micros>) -> Decision {
    if fire == 0 {
        if let Some(t) = wait_until {
            return Decision::WaitUntil(t);
        }
        if drop == 0 {
            return Decision::Idle;
        }
    }
    Decision::Dispatch(Dispatch { model, take: (drop..drop + fire).collect(), drop: (0..drop).collect() })
}

/// The largest batch that `model` can serve from the head of the queue and still
/// meet the head's deadline: the largest `b <= min(queue.len(), max_batch)` with
/// `now + L(b) <= deadline of queue[0]`.
///
/// Returns 0 when the queue is empty (or the model has no profile). When even a
/// batch of one would be late, the head is lost anyway and the largest batch the
/// queue and the profile allow is served: serving late beats starving the queue,
/// and a full batch catches up fastest (RAMSIS §4.3.1's late-serving action
/// serves the whole queue, too). Answering such a backlog one request at a time
/// would keep every later head late as well, a spiral the simulator shows at
/// 2000 QPS. The head has the earliest deadline (the queue is EDF), so the whole
/// batch meets its deadlines when the head does.
pub fn largest_feasible_batch(model: &Model, view: &View) -> u32 {
    let Some(head) = view.queue.first() else {
        return 0;
    };
    if model.max_batch() == 0 {
        return 0;
    }
    let cap = u32::try_from(view.queue.len()).unwrap_or(u32::MAX);
    let budget = head.deadline.saturating_sub(view.now);
    match largest_batch_within(model, budget, cap) {
        0 => cap.min(model.max_batch()),
        b => b,
    }
}

/// The host's built-in safe decision, used whenever a policy faults (trap,
/// invalid decision, budget overrun) and as a sane default for policies.
///
/// The fastest loaded model ([`fastest_model`]) serves the earliest deadlines
/// (the head of the queue) in the largest batch that still meets the head's
/// deadline ([`largest_feasible_batch`]; the largest batch when the head is already
/// lost). [`Decision::Idle`] when the
/// queue is empty or no loaded model can serve. Nothing is dropped: whether to
/// drop is a policy's choice, not the fallback's.
pub fn safe_decision(models: &[Model], view: &View) -> Decision {
    if view.queue.is_empty() {
        return Decision::Idle;
    }
    match fastest_model(models, &view.loaded) {
        Some(model) => Decision::serve_head(model.id, largest_feasible_batch(model, view)),
        None => Decision::Idle,
    }
}

/// Why a decision is invalid for a view; see [`check_decision`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Invalid {
    /// The dispatch names a model id that is not in the config.
    UnknownModel(u32),
    /// The dispatch names a model that is not loaded on this worker.
    NotLoaded(u32),
    /// An index in `take` or `drop` is not below the queue length.
    OutOfRange {
        /// The offending index.
        index: u32,
        /// The queue length.
        len: usize,
    },
    /// An index appears twice in `take`, twice in `drop`, or in both.
    Duplicate(u32),
    /// The batch is larger than the model's profile allows.
    BatchTooLarge {
        /// The number of requests in `take`.
        size: usize,
        /// The model's [`Model::max_batch`].
        max: u32,
    },
    /// The dispatch neither serves nor drops anything, so nothing would change
    /// and the host would ask again at once.
    EmptyDispatch,
    /// A `wait-until` at or before `now`, which would make the host ask again at
    /// once.
    WaitInPast {
        /// The requested instant.
        until: Micros,
        /// The view's `now`.
        now: Micros,
    },
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Invalid::UnknownModel(id) => write!(f, "dispatch names unknown model {id}"),
            Invalid::NotLoaded(id) => write!(f, "dispatch names model {id}, not loaded here"),
            Invalid::OutOfRange { index, len } => {
                write!(f, "queue index {index} out of range (queue length {len})")
            }
            Invalid::Duplicate(index) => write!(f, "queue index {index} used twice"),
            Invalid::BatchTooLarge { size, max } => {
                write!(f, "batch of {size} exceeds the model's maximum of {max}")
            }
            Invalid::EmptyDispatch => write!(f, "dispatch takes and drops nothing"),
            Invalid::WaitInPast { until, now } => {
                write!(f, "wait-until {until} is not after now ({now})")
            }
        }
    }
}

impl std::error::Error for Invalid {}

/// Checks a decision against the rules in `wit/policy.wit`: the dispatched model
/// exists and is loaded, `take` and `drop` are in range and pairwise distinct,
/// and the batch is within the model's profile. It also rejects the two answers
/// that would make the host ask again at once without anything changing: a
/// dispatch that takes and drops nothing, and a `wait-until` not after `now`.
pub fn check_decision(models: &[Model], view: &View, decision: &Decision) -> Result<(), Invalid> {
    let dispatch = match decision {
        Decision::Idle => return Ok(()),
        Decision::WaitUntil(until) if *until <= view.now => {
            return Err(Invalid::WaitInPast { until: *until, now: view.now })
        }
        Decision::WaitUntil(_) => return Ok(()),
        Decision::Dispatch(dispatch) => dispatch,
    };
    let model = usize::try_from(dispatch.model)
        .ok()
        .and_then(|i| models.get(i))
        .ok_or(Invalid::UnknownModel(dispatch.model))?;
    if !is_loaded(&view.loaded, dispatch.model) {
        return Err(Invalid::NotLoaded(dispatch.model));
    }
    if dispatch.take.is_empty() && dispatch.drop.is_empty() {
        return Err(Invalid::EmptyDispatch);
    }
    if dispatch.take.len() > model.latency.len() {
        return Err(Invalid::BatchTooLarge { size: dispatch.take.len(), max: model.max_batch() });
    }
    let len = view.queue.len();
    let mut seen = vec![false; len];
    for &index in dispatch.take.iter().chain(&dispatch.drop) {
        let slot =
            usize::try_from(index).ok().and_then(|i| seen.get_mut(i)).ok_or(Invalid::OutOfRange { index, len })?;
        if std::mem::replace(slot, true) {
            return Err(Invalid::Duplicate(index));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Dispatch;

    fn model(id: u32, accuracy: f64, latency: &[Micros]) -> Model {
        Model { id, name: format!("m{id}"), accuracy, latency: latency.to_vec() }
    }

    /// m0: slow and accurate; m1: fast; m2: fastest but not loaded in `view`.
    fn models() -> Vec<Model> {
        vec![model(0, 0.80, &[50, 80, 110, 140]), model(1, 0.70, &[10, 15, 20, 25]), model(2, 0.60, &[5, 6, 7, 8])]
    }

    fn view(now: Micros, deadlines: &[Micros]) -> View {
        View {
            now,
            worker: 0,
            workers: 1,
            load_qps: 100.0,
            loaded: vec![0, 1],
            queue: deadlines
                .iter()
                .enumerate()
                .map(|(i, &deadline)| Pending { id: i as u64, arrival: 0, deadline })
                .collect(),
        }
    }

    #[test]
    fn batches_only_when_batching_pays() {
        // A GPU-like profile: per request 10, 7.5, 6.7, 6.25 → the cheapest (6.25) is
        // only reached at 4, and 3 is not within 5 % of it.
        let gpu = model(0, 0.7, &[10, 15, 20, 25]);
        assert_eq!(paying_batch(&gpu, 4), 4);
        assert_eq!(paying_batch(&gpu, 2), 2);
        assert_eq!(paying_batch(&gpu, 9), 4, "capped by the profile");
        // ResNet-50 on this machine's CPU (profiles/imagenet-light-cpu.toml p50):
        // 97, 108, 96, 98 ms per request: a batch saves nothing.
        let cpu = model(1, 0.76, &[96_749, 216_466, 385_146, 786_373]);
        assert_eq!(paying_batch(&cpu, 4), 1);
        // Saturating: 10, 6, 5.67, 5.5 per request → 2 is not within 5 % of 5.5, 3 is.
        let flat = model(2, 0.7, &[10, 12, 17, 22]);
        assert_eq!(paying_batch(&flat, 4), 3);
        assert_eq!(paying_batch(&flat, 1), 1);
        assert_eq!(paying_batch(&flat, 0), 0);
    }

    #[test]
    fn the_batch_window_waits_only_while_the_head_can_still_make_it() {
        let m = model(0, 0.7, &[10, 15, 20, 25]);
        // Head arrived at 0, deadline 100; now 2, one request queued, window 30.
        let mut v = view(2, &[100]);
        assert_eq!(batch_window(&m, &v, 30, 4), Some(30), "until arrival + window");
        assert_eq!(batch_window(&m, &v, 0, 4), None, "no window: serve now");
        assert_eq!(batch_window(&m, &v, 500, 4), Some(75), "capped so a batch of 4 still meets 100");
        v.now = 30;
        assert_eq!(batch_window(&m, &v, 30, 4), None, "the window is over");
        let full = view(2, &[100, 100, 100, 100]);
        assert_eq!(batch_window(&m, &full, 30, 4), None, "the batch is full");
        assert_eq!(batch_window(&m, &view(2, &[]), 30, 4), None);
    }

    #[test]
    fn slack_is_signed() {
        let v = view(100, &[150, 90]);
        assert_eq!(slack(&v, 0), 50);
        assert_eq!(slack(&v, 1), -10);
        assert_eq!(v.queue[1].slack(u64::MAX), -(i64::MAX - 90));
    }

    #[test]
    fn fastest_and_most_accurate_consider_only_loaded_models() {
        let ms = models();
        assert_eq!(fastest_model(&ms, &[0, 1]).map(|m| m.id), Some(1));
        assert_eq!(fastest_model(&ms, &[0, 1, 2]).map(|m| m.id), Some(2));
        assert_eq!(most_accurate(&ms, &[1, 2]).map(|m| m.id), Some(1));
        assert_eq!(most_accurate(&ms, &[2, 0]).map(|m| m.id), Some(0));
        assert!(fastest_model(&ms, &[]).is_none());
        // Unknown ids and empty profiles are ignored.
        let mut ms = ms;
        ms.push(model(3, 0.99, &[]));
        assert_eq!(most_accurate(&ms, &[1, 3, 9]).map(|m| m.id), Some(1));
    }

    #[test]
    fn most_accurate_within_respects_the_budget() {
        let ms = models();
        assert_eq!(most_accurate_within(&ms, &[0, 1, 2], 100).map(|m| m.id), Some(0));
        assert_eq!(most_accurate_within(&ms, &[0, 1, 2], 49).map(|m| m.id), Some(1));
        assert_eq!(most_accurate_within(&ms, &[0, 2], 9).map(|m| m.id), Some(2));
        assert!(most_accurate_within(&ms, &[0, 1], 9).is_none());
        assert!(most_accurate_within(&ms, &[], 1000).is_none());
    }

    #[test]
    fn feasible_batch_meets_the_head_deadline() {
        let ms = models();
        // Budget 22 at now = 100: m1 fits b = 3 (20), not 4 (25).
        let v = view(100, &[122, 130, 140, 150, 160]);
        assert_eq!(largest_feasible_batch(&ms[1], &v), 3);
        // Capped by the queue length.
        let v = view(100, &[200, 210]);
        assert_eq!(largest_feasible_batch(&ms[1], &v), 2);
        // Capped by the profile.
        let v = view(0, &[1000; 9]);
        assert_eq!(largest_feasible_batch(&ms[1], &v), 4);
        // Hopeless head: serve late, the whole queue up to the profile, to catch up.
        let v = view(100, &[105, 300]);
        assert_eq!(largest_feasible_batch(&ms[1], &v), 2);
        let v = view(100, &[105; 9]);
        assert_eq!(largest_feasible_batch(&ms[1], &v), 4);
        // Empty queue.
        assert_eq!(largest_feasible_batch(&ms[1], &view(0, &[])), 0);
    }

    #[test]
    fn batch_within_handles_non_monotone_profiles() {
        let m = model(0, 0.5, &[10, 40, 30, 50]);
        assert_eq!(largest_batch_within(&m, 35, 4), 3);
        assert_eq!(largest_batch_within(&m, 35, 2), 1);
        assert_eq!(largest_batch_within(&m, 5, 4), 0);
    }

    #[test]
    fn safe_decision_uses_the_fastest_loaded_model() {
        let ms = models();
        let v = view(100, &[122, 130, 140, 150, 160]);
        assert_eq!(safe_decision(&ms, &v), Decision::serve(1, vec![0, 1, 2]));
        assert_eq!(safe_decision(&ms, &view(0, &[])), Decision::Idle);
        let mut v = v;
        v.loaded.clear();
        assert_eq!(safe_decision(&ms, &v), Decision::Idle);
        assert_eq!(check_decision(&ms, &v, &safe_decision(&ms, &v)), Ok(()));
    }

    #[test]
    fn check_decision_catches_every_rule() {
        let ms = models();
        let v = view(100, &[200, 210, 220]);
        let dispatch = |model, take: &[u32], drop: &[u32]| {
            Decision::Dispatch(Dispatch { model, take: take.to_vec(), drop: drop.to_vec() })
        };
        let check = |d: &Decision| check_decision(&ms, &v, d);
        assert_eq!(check(&dispatch(1, &[0, 2], &[1])), Ok(()));
        assert_eq!(check(&dispatch(0, &[], &[0])), Ok(()));
        assert_eq!(check(&Decision::Idle), Ok(()));
        assert_eq!(check(&Decision::WaitUntil(101)), Ok(()));
        assert_eq!(check(&Decision::WaitUntil(100)), Err(Invalid::WaitInPast { until: 100, now: 100 }));
        assert_eq!(check(&dispatch(7, &[0], &[])), Err(Invalid::UnknownModel(7)));
        assert_eq!(check(&dispatch(2, &[0], &[])), Err(Invalid::NotLoaded(2)));
        assert_eq!(check(&dispatch(1, &[], &[])), Err(Invalid::EmptyDispatch));
        assert_eq!(check(&dispatch(1, &[3], &[])), Err(Invalid::OutOfRange { index: 3, len: 3 }));
        assert_eq!(check(&dispatch(1, &[0, 0], &[])), Err(Invalid::Duplicate(0)));
        assert_eq!(check(&dispatch(1, &[0], &[0])), Err(Invalid::Duplicate(0)));
        let big = view(0, &[500; 6]);
        assert_eq!(
            check_decision(&ms, &big, &dispatch(1, &[0, 1, 2, 3, 4], &[])),
            Err(Invalid::BatchTooLarge { size: 5, max: 4 })
        );
        assert!(Invalid::Duplicate(3).to_string().contains('3'));
    }
}

/// Property-based fuzzing of decision validation: whatever a policy answers,
/// `check_decision` does not panic, and what it accepts is safe for the host to
/// apply (the model exists and is loaded, indices in range and distinct, the batch
/// within the model's profile).
#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    fn decision() -> impl Strategy<Value = Decision> {
        let index = prop_oneof![0u32..12, any::<u32>()];
        prop_oneof![
            Just(Decision::Idle),
            any::<u64>().prop_map(Decision::WaitUntil),
            (
                prop_oneof![0u32..4, any::<u32>()],
                prop::collection::vec(index.clone(), 0..12),
                prop::collection::vec(index, 0..6)
            )
                .prop_map(|(model, take, drop)| Decision::Dispatch(Dispatch { model, take, drop })),
        ]
    }

    proptest! {
        #[test]
        fn accepted_decisions_are_safe_to_apply(
            latencies in prop::collection::vec(prop::collection::vec(1u64..100_000, 0..5), 0..4),
            loaded in prop::collection::vec(0u32..5, 0..4),
            queue_len in 0usize..10,
            now in any::<u64>(),
            d in decision(),
        ) {
            let models: Vec<Model> = latencies
                .into_iter()
                .enumerate()
                .map(|(i, latency)| Model { id: i as u32, name: format!("m{i}"), accuracy: 0.5, latency })
                .collect();
            let queue = (0..queue_len as u64).map(|id| Pending { id, arrival: 0, deadline: 1 }).collect();
            let view = View { now, worker: 0, workers: 1, load_qps: 0.0, loaded, queue };
            if check_decision(&models, &view, &d).is_ok() {
                if let Decision::Dispatch(x) = &d {
                    let model = &models[x.model as usize];
                    prop_assert!(view.loaded.contains(&x.model));
                    prop_assert!(x.take.len() <= model.latency.len());
                    let mut all: Vec<u32> = x.take.iter().chain(&x.drop).copied().collect();
                    prop_assert!(all.iter().all(|&i| (i as usize) < view.queue.len()));
                    all.sort_unstable();
                    all.dedup();
                    prop_assert_eq!(all.len(), x.take.len() + x.drop.len());
                    prop_assert!(!all.is_empty());
                }
                if let Decision::WaitUntil(t) = d {
                    prop_assert!(t > view.now);
                }
            }
        }
    }
}
