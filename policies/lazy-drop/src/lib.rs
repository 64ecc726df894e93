//! `lazy-drop`: drop only requests that have already missed their deadline, and
//! size each batch to the earliest deadline that can still be met (the
//! "lazy dropping" of Clipper that Nexus and the spread-drop paper compare
//! early dropping with; spread-drop paper §2, Proteus §6.4).
//!
//! Start here: [`LazyDrop`] (the policy), [`Params`] (its `params` JSON) and
//! [`plan`] (the rule, a pure function).
//!
//! At each decision the requests whose deadline has passed (`deadline ≤ now`:
//! no positive latency can meet it) are dropped — and only those: a request
//! that will be late but is not yet is still served. The batch is then taken
//! from the head of the queue (EDF), as large as possible while the earliest
//! deadline that is still *meetable* (`now + L(1) ≤ deadline`) is met. When no
//! queued deadline is meetable any more, the largest batch is served to clear
//! the backlog. Service is work-conserving: it never waits.

use serde::Deserialize;
use sluice_sdk::{helpers, Config, Decision, Dispatch, Level, LogOnChange, Micros, Model, Policy, View};

/// The policy's parameters (all optional): `{"model": "<name>", "max_batch": B}`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Params {
    /// The variant that serves; default the most accurate loaded model whose
    /// batch-1 latency is within the SLO (else the fastest loaded one).
    pub model: Option<String>,
    /// The largest batch; default the model's profile.
    pub max_batch: Option<u32>,
}

/// What [`plan`] decided: drop the first `drop` entries, serve the next `fire`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Leading entries that already missed their deadline.
    pub drop: u32,
    /// Entries after them to serve now.
    pub fire: u32,
}

/// Lazy drop and batching to the earliest meetable deadline on one model.
pub fn plan(model: &Model, cap: u32, view: &View) -> Plan {
    let l = |b: u32| model.latency(b).unwrap_or(Micros::MAX);
    // The queue is EDF, so the requests already late form a prefix.
    let drop = view.queue.iter().take_while(|p| p.deadline <= view.now).count();
    let rest = &view.queue[drop..];
    let len = u32::try_from(rest.len()).unwrap_or(u32::MAX);
    let cap = cap.min(len).min(model.max_batch());
    let fire = match rest.iter().find(|p| view.now.saturating_add(l(1)) <= p.deadline) {
        // The batch must finish by the earliest meetable deadline; the entries
        // before it are served (late) in the same batch.
        Some(target) => {
            let budget = target.deadline - view.now;
            helpers::largest_batch_within(model, budget, cap).max(1)
        }
        None => cap,
    };
    Plan { drop: drop as u32, fire: if len == 0 { 0 } else { fire } }
}

/// The lazy-drop policy for one worker.
#[derive(Debug)]
pub struct LazyDrop {
    config: Config,
    params: Params,
    logged: LogOnChange,
}

impl LazyDrop {
    /// The model this worker serves with, given the loaded set.
    pub fn model<'a>(&'a self, loaded: &[u32]) -> Option<&'a Model> {
        helpers::named_or_most_accurate(&self.config, self.params.model.as_deref(), loaded)
    }
}

impl Policy for LazyDrop {
    // `observe` is the default no-op: the host need not call it after each batch.
    const OBSERVES: bool = false;

    fn init(config: Config) -> Result<Self, String> {
        let params: Params = config.params().map_err(|e| format!("lazy-drop: {e}"))?;
        helpers::check_model_param(&config, "lazy-drop", params.model.as_deref())?;
        if params.max_batch == Some(0) {
            return Err("lazy-drop: param `max_batch` must be at least 1".into());
        }
        Ok(LazyDrop { config, params, logged: LogOnChange::default() })
    }

    fn decide(&mut self, view: &View) -> Decision {
        if view.queue.is_empty() {
            return Decision::Idle;
        }
        let Some(id) = self.model(&view.loaded).map(|m| m.id) else {
            return Decision::Idle;
        };
        let model = &self.config.models[id as usize];
        self.logged.log(id, Level::Debug, || format!("lazy-drop: model {}", model.name));
        let p = plan(model, self.params.max_batch.unwrap_or(u32::MAX), view);
        // An empty `take` with a non-empty `drop` is a valid dispatch: the host
        // answers the dropped requests and asks again at once.
        Decision::Dispatch(Dispatch {
            model: model.id,
            take: (p.drop..p.drop + p.fire).collect(),
            drop: (0..p.drop).collect(),
        })
    }
}

#[cfg(feature = "export")]
sluice_sdk::export_policy!(LazyDrop);

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sdk::testing::{config, linear_model, pending, Harness};
    use sluice_sdk::Pending;

    const SLO: Micros = 100_000;

    /// L(b) = 10 + 5(b − 1) ms, b ≤ 8.
    fn models() -> Vec<Model> {
        vec![linear_model(0, "m", 0.8, 10_000, 5_000, 8)]
    }

    fn harness(params: &str) -> Harness<LazyDrop> {
        Harness::new(config(SLO, models(), params)).expect("init")
    }

    fn queue(arrivals: &[Micros]) -> Vec<Pending> {
        arrivals.iter().enumerate().map(|(i, &a)| pending(i as u64, a, SLO)).collect()
    }

    fn serve(take: std::ops::Range<u32>, drop: std::ops::Range<u32>) -> Decision {
        Decision::Dispatch(Dispatch { model: 0, take: take.collect(), drop: drop.collect() })
    }

    #[test]
    fn batches_to_the_head_deadline_when_it_is_meetable() {
        let mut h = harness("");
        // now = 70: head due at 100, budget 30 → L(5) = 30: 5 of 6.
        let v = h.view(70_000, 0.0, queue(&[0, 1, 2, 3, 4, 5]));
        assert_eq!(h.decide_checked(&v), Ok(serve(0..5, 0..0)));
        assert_eq!(h.decide(&h.view(0, 0.0, vec![])), Decision::Idle);
    }

    #[test]
    fn drops_only_what_already_missed() {
        let mut h = harness("");
        // now = 100.5 ms: the head (due 100) missed: dropped. The next (due
        // 100.6) cannot be met but has not missed: served, late, in a batch sized
        // to the earliest meetable deadline (due 150, budget 49.5 ms: all 4 fit).
        let v = h.view(100_500, 0.0, queue(&[0, 600, 50_000, 50_001, 50_002]));
        assert_eq!(h.decide_checked(&v), Ok(serve(1..5, 0..1)));
        // Everything missed: a drop-only dispatch.
        let v = h.view(200_000, 0.0, queue(&[0, 1_000]));
        assert_eq!(h.decide_checked(&v), Ok(Decision::drop_only(0, vec![0, 1])));
    }

    #[test]
    fn nothing_meetable_serves_the_largest_batch() {
        let mut h = harness(r#"{"max_batch": 3}"#);
        let v = h.view(95_000, 0.0, queue(&[0, 1, 2, 3, 4]));
        assert_eq!(h.decide_checked(&v), Ok(serve(0..3, 0..0)));
    }

    #[test]
    fn params_errors_name_the_parameter() {
        let err = |p: &str| Harness::<LazyDrop>::new(config(SLO, models(), p)).unwrap_err();
        assert!(err(r#"{"max_batch": 0}"#).contains("max_batch"));
        assert!(err(r#"{"model": "q"}"#).contains("`q`"));
        assert!(err(r#"{"drop": true}"#).contains("drop"));
    }

    #[test]
    fn replay_serves_everything_it_can_and_drops_only_the_missed() {
        // 250 req/s for 2 s against a worker that peaks at 8 / 45 ms = 178 req/s.
        let arrivals: Vec<Micros> = (0..500).map(|i| i * 4_000).collect();
        let r = harness("").replay(&arrivals, 250.0);
        assert_eq!(r.invalid, 0);
        assert_eq!(r.served + r.dropped + r.left, 500);
        assert!(r.dropped > 0 && r.late > 0, "lazy drop serves some late: {r:?}");
    }
}
