//! `nexus`: Nexus's early-drop batching with a fixed batch size, as the Proteus
//! code runs it as a baseline (Proteus, ASPLOS'24, §6.4; Nexus, SOSP'19).
//!
//! Start here: [`Nexus`] (the policy), [`Params`] (its `params` JSON) and
//! [`plan`] (the rule, a pure function).
//!
//! The batch size `B` is fixed. A window of `B` slides from the head of the
//! queue: while the head cannot meet its deadline in a batch of the window's
//! size (`now + L(min(B, q)) > deadline`), the head is dropped (early drop, so
//! that the requests behind it are served in time rather than late). Then the
//! worker fires as soon as `B` requests are queued, or when the timer set at
//! `head deadline − L(B)` expires, with whatever is queued. With
//! `{"work_conserving": true}` it fires whenever the queue is not empty, as
//! the Nexus paper describes (and as Proteus's evaluation characterises it).

use serde::Deserialize;
use sluice_sdk::{helpers, Config, Decision, Level, LogOnChange, Micros, Model, Policy, View};

/// The policy's parameters (all optional):
/// `{"model": "<name>", "batch": B, "work_conserving": false}`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Params {
    /// The variant that serves; default the most accurate loaded model whose
    /// batch-1 latency is within the SLO (else the fastest loaded one).
    pub model: Option<String>,
    /// The fixed batch size `B`; default the largest with `L(B) ≤ SLO/2`
    /// (Nexus's rule: a request may wait one batch, then be served by the next).
    pub batch: Option<u32>,
    /// Fire whenever the queue is not empty instead of waiting for `B` or the
    /// timer.
    pub work_conserving: bool,
    /// Fire this many µs before the last possible instant (default 5000). A live
    /// host's timers wake late (tokio's timer wheel has 1 ms resolution) and the
    /// executor adds overhead, so waiting to the exact microsecond turns that
    /// jitter into missed deadlines; 0 reproduces the simulator's behaviour.
    pub margin_us: Micros,
}

impl Default for Params {
    fn default() -> Self {
        Params { model: None, batch: None, work_conserving: false, margin_us: DEFAULT_MARGIN_US }
    }
}

/// The default [`Params::margin_us`].
pub const DEFAULT_MARGIN_US: Micros = 5_000;

/// What [`plan`] decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Leading queue entries to drop.
    pub drop: u32,
    /// Entries after them to serve now (0: do not fire).
    pub fire: u32,
    /// When not firing: the timer, `head deadline − L(B)`.
    pub wait_until: Option<Micros>,
}

/// Nexus's early drop and fixed-size batching on one model; the timer is set
/// `margin` µs early (see [`Params::margin_us`]).
pub fn plan(model: &Model, batch: u32, work_conserving: bool, margin: Micros, view: &View) -> Plan {
    let l = |b: u32| model.latency(b).unwrap_or(Micros::MAX);
    let len = u32::try_from(view.queue.len()).unwrap_or(u32::MAX);
    // Slide the window: drop heads that miss their deadline in a batch of
    // min(B, remaining).
    let mut drop = 0;
    while drop < len {
        let window = batch.min(len - drop);
        if view.now.saturating_add(l(window)) <= view.queue[drop as usize].deadline {
            break;
        }
        drop += 1;
    }
    let q = len - drop;
    if q == 0 {
        return Plan { drop, fire: 0, wait_until: None };
    }
    let head = &view.queue[drop as usize];
    let timer = head.deadline.saturating_sub(l(batch)).saturating_sub(margin);
    if q >= batch || work_conserving || view.now >= timer {
        Plan { drop, fire: q.min(batch), wait_until: None }
    } else {
        Plan { drop, fire: 0, wait_until: Some(timer) }
    }
}

/// The Nexus early-drop policy for one worker.
#[derive(Debug)]
pub struct Nexus {
    config: Config,
    params: Params,
    logged: LogOnChange,
}

impl Nexus {
    /// The model this worker serves with, given the loaded set.
    pub fn model<'a>(&'a self, loaded: &[u32]) -> Option<&'a Model> {
        helpers::named_or_most_accurate(&self.config, self.params.model.as_deref(), loaded)
    }

    /// The batch size `B` used with `model`.
    pub fn batch(&self, model: &Model) -> u32 {
        self.params
            .batch
            .unwrap_or_else(|| helpers::largest_batch_within(model, self.config.slo / 2, model.max_batch()))
            .clamp(1, model.max_batch().max(1))
    }
}

impl Policy for Nexus {
    // `observe` is the default no-op: the host need not call it after each batch.
    const OBSERVES: bool = false;

    fn init(config: Config) -> Result<Self, String> {
        let params: Params = config.params().map_err(|e| format!("nexus: {e}"))?;
        helpers::check_model_param(&config, "nexus", params.model.as_deref())?;
        if params.batch == Some(0) {
            return Err("nexus: param `batch` must be at least 1".into());
        }
        Ok(Nexus { config, params, logged: LogOnChange::default() })
    }

    fn decide(&mut self, view: &View) -> Decision {
        if view.queue.is_empty() {
            return Decision::Idle;
        }
        let Some(id) = self.model(&view.loaded).map(|m| m.id) else {
            return Decision::Idle;
        };
        let model = &self.config.models[id as usize];
        let batch = self.batch(model);
        self.logged.log(id, Level::Debug, || format!("nexus: model {} batch {batch}", model.name));
        let p = plan(model, batch, self.params.work_conserving, self.params.margin_us, view);
        helpers::head_plan(model.id, p.drop, p.fire, p.wait_until)
    }
}

#[cfg(feature = "export")]
sluice_sdk::export_policy!(Nexus);

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sdk::testing::{config, linear_model, pending, Harness};
    use sluice_sdk::Dispatch;
    use sluice_sdk::Pending;

    const SLO: Micros = 100_000;

    /// L(b) = 20 + 5(b − 1) ms: the default B is 7 (L(7) = 50 ms).
    fn models() -> Vec<Model> {
        vec![
            linear_model(0, "m", 0.8, 20_000, 5_000, 16),
            Model { id: 1, name: "tiny".into(), accuracy: 0.5, latency: vec![1_000; 4] },
        ]
    }

    /// The policy with `params`, and a zero timer margin unless they set one.
    fn harness(params: &str) -> Harness<Nexus> {
        let mut p: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(if params.is_empty() { "{}" } else { params }).expect("json");
        p.entry("margin_us").or_insert(0.into());
        Harness::new(config(SLO, models(), &serde_json::Value::Object(p).to_string())).expect("init")
    }

    fn queue(arrivals: &[Micros]) -> Vec<Pending> {
        arrivals.iter().enumerate().map(|(i, &a)| pending(i as u64, a, SLO)).collect()
    }

    fn serve(take: std::ops::Range<u32>, drop: std::ops::Range<u32>) -> Decision {
        Decision::Dispatch(Dispatch { model: 0, take: take.collect(), drop: drop.collect() })
    }

    #[test]
    fn fires_at_b_or_at_the_timer() {
        let mut h = harness(r#"{"batch": 4}"#);
        // Two queued: timer at 100 − L(4) = 65 ms.
        let v = h.view(10_000, 0.0, queue(&[0, 5_000]));
        assert_eq!(h.decide_checked(&v), Ok(Decision::WaitUntil(65_000)));
        let v = h.view(65_000, 0.0, queue(&[0, 5_000]));
        assert_eq!(h.decide_checked(&v), Ok(serve(0..2, 0..0)));
        // Four queued: fire at once with B.
        let v = h.view(10_000, 0.0, queue(&[0, 1, 2, 3, 4]));
        assert_eq!(h.decide_checked(&v), Ok(serve(0..4, 0..0)));
        // Work-conserving: fire at once with what is there.
        let mut h = harness(r#"{"batch": 4, "work_conserving": true}"#);
        let v = h.view(10_000, 0.0, queue(&[0]));
        assert_eq!(h.decide_checked(&v), Ok(serve(0..1, 0..0)));
    }

    #[test]
    fn slides_the_window_dropping_heads_that_cannot_make_it() {
        let mut h = harness(r#"{"batch": 4}"#);
        // now = 70 ms: a full batch (35 ms) ends at 105. Heads with deadline 100
        // and 104 are dropped; deadline 110 makes it.
        let v = h.view(70_000, 0.0, queue(&[0, 4_000, 10_000, 11_000, 12_000, 13_000]));
        assert_eq!(h.decide_checked(&v), Ok(serve(2..6, 0..2)));
        // Fewer than B left: the window shrinks to what is queued (L(1) = 20).
        let v = h.view(85_000, 0.0, queue(&[0, 6_000]));
        assert_eq!(h.decide_checked(&v), Ok(serve(1..2, 0..1)));
    }

    #[test]
    fn defaults_and_model_choice() {
        let h = harness("");
        assert_eq!(h.policy().batch(&models()[0]), 7);
        assert_eq!(h.policy().model(&[0, 1]).map(|m| m.id), Some(0));
        let h = harness(r#"{"model": "tiny"}"#);
        assert_eq!(h.policy().model(&[0, 1]).map(|m| m.id), Some(1));
        assert_eq!(h.policy().batch(&models()[1]), 4);
        assert_eq!(h.policy().model(&[0]).map(|m| m.id), Some(0), "named model not loaded");
        let err = |p: &str| Harness::<Nexus>::new(config(SLO, models(), p)).unwrap_err();
        assert!(err(r#"{"batch": 0}"#).contains("batch"));
        assert!(err(r#"{"model": "nope"}"#).contains("nope"));
    }

    #[test]
    fn replay_under_overload_drops_rather_than_serving_late() {
        let arrivals: Vec<Micros> = (0..500).map(|i| i * 2_000).collect(); // 500 req/s
        let r = harness("").replay(&arrivals, 500.0);
        assert_eq!(r.invalid, 0);
        assert_eq!(r.late, 0);
        assert!(r.dropped > 0);
        assert_eq!(r.served + r.dropped, 500);
        assert!(r.batches.iter().all(|&(m, b)| m == 0 && b <= 7));
    }
}
