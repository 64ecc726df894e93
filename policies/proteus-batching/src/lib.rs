//! `proteus-batching`: Proteus's proactive, non-work-conserving adaptive
//! batching (Proteus, ASPLOS'24, §5).
//!
//! Start here: [`ProteusBatching`] (the policy), [`Params`] (its `params` JSON)
//! and [`plan`] (the batching rule on one model, a pure function).
//!
//! With `q` requests queued and the head expiring at `T_exp`, a batch of
//! `q + 1` would have to start by `T_max_wait(q+1) = T_exp − T_process(q+1)`.
//! Before that instant the worker waits (it may stay idle: non-work-conserving)
//! for the `q+1`-st request. Case 1: nothing arrives by `T_max_wait(q+1)`, so it
//! fires with `q`. Case 2: the `q+1`-st arrives in time; it then checks
//! `T_max_wait(q+2)` and fires with `q + 1` if that is already past, or waits
//! again. A queue of at least `B` (the maximum batch) fires at once. Requests
//! that cannot meet their deadline even in a batch of one are dropped from the
//! head first; the head is never left to expire while it could still be served.

use serde::Deserialize;
use sluice_sdk::{helpers, Config, Decision, Level, LogOnChange, Micros, Model, Policy, View};

/// The policy's parameters (all optional):
/// `{"model": "<name>", "max_batch": B, "latency_set": [1, 2, 4, 8]}`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Params {
    /// The variant that serves; default the most accurate loaded model whose
    /// batch-1 latency is within the SLO (else the fastest loaded one).
    pub model: Option<String>,
    /// The maximum batch `B`; default the largest with `L(B) ≤ SLO/2` (Proteus
    /// §4, "maximum allowed batch size": a request arriving just after a batch
    /// starts waits one batch, then is served in the next).
    pub max_batch: Option<u32>,
    /// The only batch sizes used, e.g. `[1, 2, 4, 8]` to reproduce the Proteus
    /// simulator; default every size up to `B`.
    pub latency_set: Option<Vec<u32>>,
    /// Fire this many µs before the last possible instant (default 5000). A live
    /// host's timers wake late (tokio's timer wheel has 1 ms resolution) and the
    /// executor adds overhead, so waiting to the exact microsecond turns that
    /// jitter into missed deadlines; 0 reproduces the simulator's behaviour.
    pub margin_us: Micros,
    /// Which heads are dropped: `"batch"` (default, the Proteus code: drop the head
    /// while the batch the queue would fire, `L(min(q, B))`, ends after its
    /// deadline — throughput is kept and the queue cannot spiral into single late
    /// requests under load) or `"alone"` (drop only heads that even a batch of one
    /// cannot save, then shrink the batch to fit the head; fewer drops at low load,
    /// but under load small batches cut throughput and the queue collapses: 0.28
    /// violations at 87% load in `docs/results/proteus-batching-load`).
    pub head_drop: HeadDrop,
}

/// See [`Params::head_drop`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HeadDrop {
    /// Drop while the full batch would make the head late (the Proteus code).
    #[default]
    Batch,
    /// Drop only heads a batch of one cannot save.
    Alone,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            model: None,
            max_batch: None,
            latency_set: None,
            margin_us: DEFAULT_MARGIN_US,
            head_drop: HeadDrop::Batch,
        }
    }
}

/// The default [`Params::margin_us`].
pub const DEFAULT_MARGIN_US: Micros = 5_000;

/// What [`plan`] decided for one model and queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Leading queue entries to drop (they cannot meet their deadline).
    pub drop: u32,
    /// Serve this many entries after the dropped ones now (0: do not fire).
    pub fire: u32,
    /// When not firing: wait until this instant (`T_max_wait` of the next size).
    pub wait_until: Option<Micros>,
}

/// The batching rule of Proteus §5 on one model. `sizes` are the allowed batch
/// sizes, increasing, each within the model's profile and at most `B`; the
/// timer is set `margin` µs early (see [`Params::margin_us`]).
pub fn plan(model: &Model, sizes: &[u32], margin: Micros, head_drop: HeadDrop, view: &View) -> Plan {
    let l = |b: u32| model.latency(b).unwrap_or(Micros::MAX);
    let smallest = sizes.first().copied().unwrap_or(1);
    let largest_within = |q: usize| {
        let q = u32::try_from(q).unwrap_or(u32::MAX);
        sizes.iter().rev().copied().find(|&b| b <= q).unwrap_or(smallest)
    };
    let drop = match head_drop {
        // Drop from the head while even the smallest batch would finish late.
        HeadDrop::Alone => view.queue.iter().take_while(|p| view.now.saturating_add(l(smallest)) > p.deadline).count(),
        // The Proteus code: drop from the head while the batch the remaining queue
        // would fire (the largest allowed size ≤ q) finishes after the head's deadline.
        HeadDrop::Batch => (0..view.queue.len())
            .find(|&i| view.now.saturating_add(l(largest_within(view.queue.len() - i))) <= view.queue[i].deadline)
            .unwrap_or(view.queue.len()),
    };
    let rest = &view.queue[drop..];
    let drop = drop as u32;
    let Some(head) = rest.first() else {
        return Plan { drop, fire: 0, wait_until: None };
    };
    let q = u32::try_from(rest.len()).unwrap_or(u32::MAX);
    let slack = head.deadline.saturating_sub(view.now);
    // The largest allowed size ≤ q that still meets the head's deadline.
    let fireable = sizes.iter().rev().copied().find(|&b| b <= q && l(b) <= slack).unwrap_or(smallest.min(q));
    let max = sizes.last().copied().unwrap_or(1);
    if q >= max {
        // The queue fills the maximum batch: fire at once.
        return Plan { drop, fire: fireable, wait_until: None };
    }
    // T_max_wait for the next size the batch could grow to.
    let next = sizes.iter().copied().find(|&b| b > q).unwrap_or(max);
    let max_wait = head.deadline.saturating_sub(l(next)).saturating_sub(margin);
    if view.now < max_wait && fireable > 0 {
        // Case 2 (or still waiting): more requests may join without risk.
        Plan { drop, fire: 0, wait_until: Some(max_wait) }
    } else {
        // Case 1, or past T_max_wait(q+1): fire with what we have.
        Plan { drop, fire: fireable.max(1), wait_until: None }
    }
}

/// The Proteus batching policy for one worker.
#[derive(Debug)]
pub struct ProteusBatching {
    config: Config,
    params: Params,
    logged: LogOnChange,
}

impl ProteusBatching {
    /// The model this worker serves with, given the loaded set.
    pub fn model<'a>(&'a self, loaded: &[u32]) -> Option<&'a Model> {
        helpers::named_or_most_accurate(&self.config, self.params.model.as_deref(), loaded)
    }

    /// The batch sizes used with `model`, increasing.
    pub fn sizes(&self, model: &Model) -> Vec<u32> {
        let cap = self
            .params
            .max_batch
            .unwrap_or_else(|| helpers::largest_batch_within(model, self.config.slo / 2, model.max_batch()).max(1))
            .min(model.max_batch());
        match &self.params.latency_set {
            Some(set) => {
                let mut s: Vec<u32> = set.iter().copied().filter(|&b| b >= 1 && b <= cap).collect();
                s.sort_unstable();
                s.dedup();
                if s.is_empty() {
                    vec![1]
                } else {
                    s
                }
            }
            None => (1..=cap.max(1)).collect(),
        }
    }
}

impl Policy for ProteusBatching {
    // `observe` is the default no-op: the host need not call it after each batch.
    const OBSERVES: bool = false;

    fn init(config: Config) -> Result<Self, String> {
        let params: Params = config.params().map_err(|e| format!("proteus-batching: {e}"))?;
        if let Some(name) = &params.model {
            match config.model_named(name) {
                None => {
                    return Err(format!(
                        "proteus-batching: unknown model `{name}` (valid models: {})",
                        config.model_names()
                    ))
                }
                Some(m) if m.max_batch() == 0 => {
                    return Err(format!("proteus-batching: model `{name}` has an empty latency profile"))
                }
                Some(_) => {}
            }
        }
        if params.max_batch == Some(0) {
            return Err("proteus-batching: param `max_batch` must be at least 1".into());
        }
        if let Some(set) = &params.latency_set {
            if set.is_empty() || set.contains(&0) {
                return Err(format!("proteus-batching: param `latency_set` must list sizes ≥ 1, got {set:?}"));
            }
        }
        Ok(ProteusBatching { config, params, logged: LogOnChange::default() })
    }

    fn decide(&mut self, view: &View) -> Decision {
        if view.queue.is_empty() {
            return Decision::Idle;
        }
        let Some(id) = self.model(&view.loaded).map(|m| m.id) else {
            return Decision::Idle;
        };
        let model = &self.config.models[id as usize];
        let sizes = self.sizes(model);
        self.logged.log(id, Level::Debug, || format!("proteus-batching: model {} sizes {sizes:?}", model.name));
        let p = plan(model, &sizes, self.params.margin_us, self.params.head_drop, view);
        helpers::head_plan(model.id, p.drop, p.fire, p.wait_until)
    }
}

#[cfg(feature = "export")]
sluice_sdk::export_policy!(ProteusBatching);

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sdk::testing::{config, linear_model, pending, Harness};
    use sluice_sdk::Dispatch;
    use sluice_sdk::Pending;

    const SLO: Micros = 100_000;

    /// "big": L(b) = 20 + 5(b−1) ms, b ≤ 16 (L(b) ≤ 50 up to b = 7);
    /// "huge": L(1) = 120 ms, more accurate but never within the SLO.
    fn models() -> Vec<Model> {
        vec![
            linear_model(0, "big", 0.8, 20_000, 5_000, 16),
            Model { id: 1, name: "huge".into(), accuracy: 0.9, latency: vec![120_000, 130_000] },
            linear_model(2, "small", 0.6, 5_000, 1_000, 16),
        ]
    }

    /// The policy with `params`, and a zero timer margin unless they set one,
    /// so that the timings below are the paper's.
    fn harness(params: &str) -> Harness<ProteusBatching> {
        let mut p: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(if params.is_empty() { "{}" } else { params }).expect("json");
        p.entry("margin_us").or_insert(0.into());
        Harness::new(config(SLO, models(), &serde_json::Value::Object(p).to_string())).expect("init")
    }

    fn queue(arrivals: &[Micros]) -> Vec<Pending> {
        arrivals.iter().enumerate().map(|(i, &a)| pending(i as u64, a, SLO)).collect()
    }

    fn serve(model: u32, take: std::ops::Range<u32>, drop: std::ops::Range<u32>) -> Decision {
        Decision::Dispatch(Dispatch { model, take: take.collect(), drop: drop.collect() })
    }

    #[test]
    fn model_and_sizes_default_from_the_slo() {
        let h = harness("");
        let p = h.policy();
        assert_eq!(p.model(&[0, 1, 2]).map(|m| m.id), Some(0));
        assert_eq!(p.model(&[1, 2]).map(|m| m.id), Some(2));
        assert_eq!(p.model(&[1]).map(|m| m.id), Some(1), "nothing fits: the fastest");
        assert_eq!(p.sizes(&models()[0]), (1..=7).collect::<Vec<_>>());
        let h = harness(r#"{"model": "small", "latency_set": [8, 1, 4, 2, 64]}"#);
        assert_eq!(h.policy().model(&[0, 2]).map(|m| m.id), Some(2));
        assert_eq!(h.policy().sizes(&models()[2]), vec![1, 2, 4, 8]);
    }

    #[test]
    fn waits_until_t_max_wait_of_the_next_size() {
        let mut h = harness("");
        // One queued, head expires at 100 ms: T_max_wait(2) = 100 − 25 = 75 ms.
        let v = h.view(10_000, 0.0, queue(&[0]));
        assert_eq!(h.decide_checked(&v), Ok(Decision::WaitUntil(75_000)));
        // Case 2: a second arrives at 30 ms: T_max_wait(3) = 70 ms, wait again.
        let v = h.view(30_000, 0.0, queue(&[0, 30_000]));
        assert_eq!(h.decide_checked(&v), Ok(Decision::WaitUntil(70_000)));
        // Case 2, already past T_max_wait(q+2): fire with q+1 = 3 now.
        let v = h.view(66_000, 0.0, queue(&[0, 30_000, 66_000]));
        assert_eq!(h.decide_checked(&v), Ok(serve(0, 0..3, 0..0)));
    }

    #[test]
    fn case_1_fires_with_what_is_queued() {
        let mut h = harness("");
        // The timer for T_max_wait(3) = 70 ms fired with two queued.
        let v = h.view(70_000, 0.0, queue(&[0, 30_000]));
        assert_eq!(h.decide_checked(&v), Ok(serve(0, 0..2, 0..0)));
        // A full queue (≥ B = 7) fires at once with B.
        let v = h.view(0, 0.0, queue(&[0; 9]));
        assert_eq!(h.decide_checked(&v), Ok(serve(0, 0..7, 0..0)));
    }

    #[test]
    fn past_the_deadline_of_a_full_batch_fires_one_fewer() {
        let mut h = harness(r#"{"head_drop": "alone"}"#);
        // now = 75 ms, 5 queued (head due at 100 ms), past T_max_wait(6) = 55 ms:
        // L(5) = 40 would end at 115, L(3) = 30 at 105, L(2) = 25 at 100 ≤ 100:
        // fire 2, keep 3 queued.
        let v = h.view(75_000, 0.0, queue(&[0, 10_000, 20_000, 30_000, 40_000]));
        assert_eq!(h.decide_checked(&v), Ok(serve(0, 0..2, 0..0)));
        // The default (the Proteus code) drops the head instead: L(5) = 40 ends at
        // 115 > 100, so the head goes; L(4) = 35 ends at 110 ≤ 110 (the new head's
        // deadline), and the queue of 4 fires as one batch.
        let mut h = harness("");
        let v = h.view(75_000, 0.0, queue(&[0, 10_000, 20_000, 30_000, 40_000]));
        assert_eq!(h.decide_checked(&v), Ok(serve(0, 1..5, 0..1)));
    }

    #[test]
    fn drops_only_hopeless_heads() {
        let mut h = harness(r#"{"head_drop": "alone"}"#);
        // now = 85 ms: the head (deadline 100) cannot finish by 100 even alone
        // (L(1) = 20 → 105). The next (deadline 150) can wait until
        // T_max_wait(2) = 125 ms, so the hopeless head stays queued until then
        // (the host does not decide again after a drop-only dispatch)...
        let v = h.view(85_000, 0.0, queue(&[0, 50_000]));
        assert_eq!(h.decide_checked(&v), Ok(Decision::WaitUntil(125_000)));
        // ... and is dropped with that batch.
        let v = h.view(125_000, 0.0, queue(&[0, 50_000]));
        assert_eq!(h.decide_checked(&v), Ok(serve(0, 1..2, 0..1)));
        // Only hopeless requests: drop them.
        let v = h.view(95_000, 0.0, queue(&[0, 1_000]));
        assert_eq!(h.decide_checked(&v), Ok(Decision::drop_only(0, vec![0, 1])));
        // The default margin fires 5 ms before T_max_wait.
        let mut h = Harness::<ProteusBatching>::new(config(SLO, models(), r#"{"head_drop": "alone"}"#)).expect("init");
        let v = h.view(10_000, 0.0, queue(&[0]));
        assert_eq!(h.decide_checked(&v), Ok(Decision::WaitUntil(70_000)));
        // A head that can still make it alone is never dropped.
        let v = h.view(79_000, 0.0, queue(&[0, 50_000]));
        let d = h.decide_checked(&v).expect("valid");
        assert_eq!(d, serve(0, 0..1, 0..0));
    }

    #[test]
    fn latency_set_restricts_the_batch_sizes() {
        let mut h = harness(r#"{"latency_set": [1, 2, 4]}"#);
        // 3 queued: the next size is 4, T_max_wait(4) = 100 − 35 = 65 ms.
        let v = h.view(10_000, 0.0, queue(&[0, 1_000, 2_000]));
        assert_eq!(h.decide_checked(&v), Ok(Decision::WaitUntil(65_000)));
        // At 65 ms: fire with 2 (the largest allowed size ≤ 3).
        let v = h.view(65_000, 0.0, queue(&[0, 1_000, 2_000]));
        assert_eq!(h.decide_checked(&v), Ok(serve(0, 0..2, 0..0)));
    }

    #[test]
    fn params_errors_name_the_parameter() {
        let err = |p: &str| Harness::<ProteusBatching>::new(config(SLO, models(), p)).unwrap_err();
        assert!(err(r#"{"model": "x"}"#).contains("unknown model"));
        assert!(err(r#"{"max_batch": 0}"#).contains("max_batch"));
        assert!(err(r#"{"latency_set": []}"#).contains("latency_set"));
        assert!(err(r#"{"batch": 3}"#).contains("batch"));
    }

    #[test]
    fn replay_never_lets_a_head_expire_needlessly() {
        // Poisson-like irregular arrivals at ~120 req/s: nothing served late.
        let mut t = 0;
        let arrivals: Vec<Micros> = (0..400u64)
            .map(|i| {
                t += (i * 7919 % 13 + 1) * 1_300;
                t
            })
            .collect();
        let r = harness("").replay(&arrivals, 120.0);
        assert_eq!(r.invalid, 0);
        assert_eq!(r.late, 0, "{:?}", r.batches);
        assert_eq!(r.served + r.dropped, 400);
        // It batches (non-work-conserving) rather than serving one at a time.
        assert!(r.batches.iter().any(|&(_, b)| b > 1));
    }
}
