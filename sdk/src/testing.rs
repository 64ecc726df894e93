//! Test a policy natively: hand-made views, and a small virtual-time replay.
//!
//! [`Harness`] holds one policy instance as the host would (one per worker).
//! [`Harness::decide`] and [`Harness::observe`] call it directly;
//! [`Harness::replay`] runs a single worker over a list of arrival times with a
//! deterministic executor (each batch takes exactly its profiled latency) and
//! reports what was served, dropped and late. It is a unit-test tool, not the
//! simulator: one worker, a fixed load estimate, no routing.
//!
//! ```
//! use sluice_sdk::testing::{config, Harness};
//! use sluice_sdk::{helpers, Config, Decision, Model, Policy, View};
//!
//! struct Safe(Vec<Model>);
//! impl Policy for Safe {
//!     fn init(config: Config) -> Result<Self, String> {
//!         Ok(Safe(config.models))
//!     }
//!     fn decide(&mut self, view: &View) -> Decision {
//!         helpers::safe_decision(&self.0, view)
//!     }
//! }
//!
//! let models = vec![Model { id: 0, name: "m".into(), accuracy: 0.7, latency: vec![10_000, 12_000] }];
//! let mut harness = Harness::<Safe>::new(config(100_000, models, "{}")).unwrap();
//! let replay = harness.replay(&[0, 1_000, 2_000], 30.0);
//! assert_eq!((replay.served, replay.late, replay.dropped), (3, 0, 0));
//! ```

use crate::helpers::{check_decision, safe_decision, Invalid};
use crate::policy::Policy;
use crate::types::{Config, Decision, Micros, Model, Outcome, Pending, View};
use crate::Level;

/// A [`Config`] for one worker of one (`"test"`) app with these models and params.
pub fn config(slo: Micros, models: Vec<Model>, params: &str) -> Config {
    Config { app: "test".into(), slo, workers: 1, worker: 0, models, params: params.into() }
}

/// A model whose batch of `b` takes `first + step · (b − 1)` µs, for `b` up to
/// `max_batch`: the linear latency profile most policy tests start from.
pub fn linear_model(id: u32, name: &str, accuracy: f64, first: Micros, step: Micros, max_batch: u32) -> Model {
    Model { id, name: name.into(), accuracy, latency: (0..Micros::from(max_batch)).map(|i| first + step * i).collect() }
}

/// A queue entry arriving at `arrival` with deadline `arrival + slo`; its id is
/// its position in the arrival order.
pub fn pending(id: u64, arrival: Micros, slo: Micros) -> Pending {
    Pending { id, arrival, deadline: arrival + slo }
}

/// Empties this thread's [`crate::shared`] store (natively, the policies a test
/// creates on one thread share it, as the instances of one binding do).
pub fn clear_shared() {
    crate::shared::imp::clear();
}

/// Drains the lines this thread's policies logged with [`crate::log`] natively.
pub fn take_logs() -> Vec<(Level, String)> {
    crate::log::imp::take()
}

/// One policy instance for one worker, driven by hand or by [`Harness::replay`].
pub struct Harness<P: Policy> {
    policy: P,
    config: Config,
    loaded: Vec<u32>,
    max_decisions: usize,
}

impl<P: Policy> std::fmt::Debug for Harness<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Harness").field("config", &self.config).field("loaded", &self.loaded).finish_non_exhaustive()
    }
}

/// One decision taken during a [`Harness::replay`].
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayedDecision {
    /// When the decision was taken (virtual time).
    pub at: Micros,
    /// The queue length the policy saw.
    pub queue_len: usize,
    /// What the policy answered.
    pub decision: Decision,
    /// Why the answer was invalid, if it was; the safe decision ran instead.
    pub invalid: Option<Invalid>,
}

/// What a [`Harness::replay`] did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Replay {
    /// Requests served, late ones included (as Proteus counts them).
    pub served: u64,
    /// Served requests that finished after their deadline.
    pub late: u64,
    /// Requests the policy dropped.
    pub dropped: u64,
    /// Requests still queued when the replay ended (the policy went idle after
    /// the last arrival, or the decision limit was hit).
    pub left: u64,
    /// Decisions the harness rejected (see [`check_decision`]) and replaced
    /// with [`safe_decision`].
    pub invalid: u64,
    /// Whether the replay stopped at the decision limit
    /// ([`Harness::set_max_decisions`]) rather than running out of work.
    pub truncated: bool,
    /// Every decision, in order.
    pub decisions: Vec<ReplayedDecision>,
    /// Every batch served: `(model, size)`, in order.
    pub batches: Vec<(u32, u32)>,
}

impl Replay {
    /// The fraction of served requests that were late (0 when none was served).
    pub fn late_ratio(&self) -> f64 {
        if self.served == 0 {
            0.0
        } else {
            self.late as f64 / self.served as f64
        }
    }
}

impl<P: Policy> Harness<P> {
    /// Builds the policy with [`Policy::init`]; every model in the config starts
    /// loaded. The error is `init`'s.
    pub fn new(config: Config) -> Result<Self, String> {
        let loaded = (0..config.models.len()).filter_map(|i| u32::try_from(i).ok()).collect();
        let policy = P::init(config.clone())?;
        Ok(Harness { policy, config, loaded, max_decisions: 1_000_000 })
    }

    /// The policy, to inspect its state.
    pub fn policy(&self) -> &P {
        &self.policy
    }

    /// The config the policy was built with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Sets the models [`Harness::view`] and [`Harness::replay`] report as loaded.
    pub fn set_loaded(&mut self, loaded: Vec<u32>) {
        self.loaded = loaded;
    }

    /// Caps the decisions one replay may take (default 1,000,000), so a policy
    /// that keeps waiting cannot hang a test.
    pub fn set_max_decisions(&mut self, max: usize) {
        self.max_decisions = max;
    }

    /// A view at `now` with this queue, the harness's loaded models and worker
    /// position from the config.
    pub fn view(&self, now: Micros, load_qps: f64, queue: Vec<Pending>) -> View {
        View {
            now,
            worker: self.config.worker,
            workers: self.config.workers,
            load_qps,
            loaded: self.loaded.clone(),
            queue,
        }
    }

    /// Asks the policy to decide.
    pub fn decide(&mut self, view: &View) -> Decision {
        self.policy.decide(view)
    }

    /// Asks the policy to decide and checks the answer as the host would.
    pub fn decide_checked(&mut self, view: &View) -> Result<Decision, Invalid> {
        let decision = self.policy.decide(view);
        check_decision(&self.config.models, view, &decision).map(|()| decision)
    }

    /// Tells the policy how a batch went (unless it says it does not observe,
    /// [`Policy::OBSERVES`], as the host does).
    pub fn observe(&mut self, outcome: &Outcome) {
        if P::OBSERVES {
            self.policy.observe(outcome);
        }
    }

    /// Replays `arrivals` (microseconds, non-decreasing) on one worker in virtual
    /// time, with `load_qps` as the host's load estimate throughout.
    ///
    /// The worker decides whenever it is free and something happened: a request
    /// arrived, a batch finished, or the time it asked to wait for came. A batch
    /// of `b` on model `m` takes exactly `m.latency(b)`; arrivals during it queue
    /// up (earliest deadline first, deadline = arrival + SLO). Every batch is
    /// [`observe`](Policy::observe)d when it finishes. Invalid decisions are
    /// counted and replaced by [`safe_decision`], as the host does. The replay
    /// ends when the trace is exhausted and the policy goes idle.
    pub fn replay(&mut self, arrivals: &[Micros], load_qps: f64) -> Replay {
        let slo = self.config.slo;
        let mut out = Replay::default();
        let mut queue: Vec<Pending> = Vec::new();
        let mut next = 0usize; // index of the next arrival not yet queued
        let Some(&first) = arrivals.first() else {
            return out;
        };
        let mut now = first;
        loop {
            while next < arrivals.len() && arrivals[next] <= now {
                let p = pending(next as u64, arrivals[next], slo);
                // Keep EDF order, arrival order for equal deadlines.
                let at = queue.partition_point(|q| q.deadline <= p.deadline);
                queue.insert(at, p);
                next += 1;
            }
            if out.decisions.len() >= self.max_decisions {
                out.truncated = true;
                break;
            }
            let view = self.view(now, load_qps, std::mem::take(&mut queue));
            let asked = self.policy.decide(&view);
            let invalid = check_decision(&self.config.models, &view, &asked).err();
            let decision = if invalid.is_some() {
                out.invalid += 1;
                safe_decision(&self.config.models, &view)
            } else {
                asked.clone()
            };
            out.decisions.push(ReplayedDecision { at: now, queue_len: view.queue.len(), decision: asked, invalid });
            queue = view.queue;
            let next_arrival = arrivals.get(next).copied();
            match decision {
                Decision::Dispatch(d) => {
                    out.dropped += d.drop.len() as u64;
                    let batch: Vec<Pending> = d.take.iter().map(|&i| queue[i as usize].clone()).collect();
                    let mut gone: Vec<usize> = d.take.iter().chain(&d.drop).map(|&i| i as usize).collect();
                    gone.sort_unstable();
                    for i in gone.into_iter().rev() {
                        queue.remove(i);
                    }
                    if batch.is_empty() {
                        continue; // only dropped: decide again at once
                    }
                    let model = &self.config.models[d.model as usize];
                    let size = batch.len() as u32;
                    let latency = model.latency(size).unwrap_or(0);
                    let finished = now + latency;
                    let missed = batch.iter().filter(|p| finished > p.deadline).count() as u32;
                    out.served += u64::from(size);
                    out.late += u64::from(missed);
                    out.batches.push((d.model, size));
                    self.observe(&Outcome { model: d.model, size, started: now, finished, missed });
                    now = finished;
                }
                // A timer: wake at `t` or at the next arrival, whichever is first.
                Decision::WaitUntil(t) => now = next_arrival.map_or(t, |a| a.min(t)),
                Decision::Idle => match next_arrival {
                    Some(a) => now = a,
                    None => break,
                },
            }
        }
        out.left = queue.len() as u64;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::helpers;

    fn models() -> Vec<Model> {
        vec![
            Model { id: 0, name: "slow".into(), accuracy: 0.9, latency: vec![40_000, 60_000, 80_000, 100_000] },
            Model { id: 1, name: "fast".into(), accuracy: 0.6, latency: vec![10_000, 12_000, 14_000, 16_000] },
        ]
    }

    /// Serves with the model named in params, always one request at a time, and
    /// counts what it observes.
    struct OneByOne {
        model: u32,
        observed: u64,
    }

    impl Policy for OneByOne {
        fn init(config: Config) -> Result<Self, String> {
            let model = config.params.parse().map_err(|_| "bad model".to_string())?;
            crate::log(Level::Info, "one-by-one ready");
            Ok(OneByOne { model, observed: 0 })
        }
        fn decide(&mut self, view: &View) -> Decision {
            Decision::serve_head(self.model, u32::from(!view.queue.is_empty()))
        }
        fn observe(&mut self, outcome: &Outcome) {
            self.observed += u64::from(outcome.size);
        }
    }

    /// Drops every request whose deadline cannot be met, waits for a second
    /// request up to 5 ms before serving, and once answers garbage.
    struct Picky {
        models: Vec<Model>,
        lied: bool,
    }

    impl Policy for Picky {
        fn init(config: Config) -> Result<Self, String> {
            Ok(Picky { models: config.models, lied: false })
        }
        fn decide(&mut self, view: &View) -> Decision {
            if !self.lied && !view.queue.is_empty() {
                self.lied = true;
                return Decision::serve(9, vec![0]);
            }
            let fast = &self.models[1];
            let expired: Vec<u32> = (0..view.queue.len() as u32)
                .filter(|&i| helpers::slack(view, i as usize) < fast.latency[0] as i64)
                .collect();
            if !expired.is_empty() {
                return Decision::drop_only(1, expired);
            }
            match view.queue.len() {
                0 => Decision::Idle,
                1 if view.now < view.queue[0].arrival + 5_000 => Decision::WaitUntil(view.queue[0].arrival + 5_000),
                _ => Decision::serve_head(1, helpers::largest_feasible_batch(fast, view)),
            }
        }
    }

    #[test]
    fn harness_checks_decisions_and_collects_logs() {
        let _ = take_logs();
        let mut h = Harness::<OneByOne>::new(config(50_000, models(), "0")).expect("init");
        assert_eq!(take_logs(), vec![(Level::Info, "one-by-one ready".into())]);
        let view = h.view(0, 10.0, vec![pending(0, 0, 50_000)]);
        assert_eq!(h.decide_checked(&view), Ok(Decision::serve(0, vec![0])));
        h.set_loaded(vec![1]);
        let view = h.view(0, 10.0, vec![pending(0, 0, 50_000)]);
        assert_eq!(h.decide_checked(&view), Err(Invalid::NotLoaded(0)));
        assert!(Harness::<OneByOne>::new(config(50_000, models(), "x")).is_err());
    }

    #[test]
    fn replay_serves_in_virtual_time() {
        // The slow model one at a time: 40 ms each, arrivals every 20 ms, SLO 100 ms.
        // Request i starts at 40i, finishes at 40(i+1); it is late when
        // 40(i+1) > 20i + 100, i.e. from i = 4 on.
        let mut h = Harness::<OneByOne>::new(config(100_000, models(), "0")).expect("init");
        let arrivals: Vec<Micros> = (0..8).map(|i| i * 20_000).collect();
        let r = h.replay(&arrivals, 50.0);
        assert_eq!(r.served, 8);
        assert_eq!(r.late, 4);
        assert_eq!((r.dropped, r.left, r.invalid), (0, 0, 0));
        assert_eq!(r.batches, vec![(0, 1); 8]);
        assert_eq!(h.policy().observed, 8);
        assert_eq!(r.late_ratio(), 0.5);
        assert!(!r.truncated);
    }

    #[test]
    fn replay_handles_drops_waits_and_invalid_answers() {
        let mut h = Harness::<Picky>::new(config(30_000, models(), "")).expect("init");
        // 0: served alone by the safe fallback (the lie). 100 ms: waits 5 ms, none
        // comes, served alone. 200 ms and 201 ms: batched together at 201 ms.
        let r = h.replay(&[0, 100_000, 200_000, 201_000], 10.0);
        assert_eq!(r.invalid, 1);
        assert_eq!(r.decisions[0].invalid, Some(Invalid::UnknownModel(9)));
        assert_eq!(r.served, 4);
        assert_eq!(r.late, 0);
        assert_eq!(r.batches, vec![(1, 1), (1, 1), (1, 2)]);
        assert!(r.decisions.iter().any(|s| s.decision == Decision::WaitUntil(105_000)));

        // A burst the fast model cannot serve in time: the policy drops.
        let mut h = Harness::<Picky>::new(config(30_000, models(), "")).expect("init");
        let r = h.replay(&[0; 12], 10.0);
        assert!(r.dropped > 0, "{r:?}");
        assert_eq!(r.served + r.dropped + r.left, 12);
        assert_eq!(r.late, 0);
    }

    #[test]
    fn replay_stops_at_the_decision_limit() {
        struct Sleeper;
        impl Policy for Sleeper {
            fn init(_: Config) -> Result<Self, String> {
                Ok(Sleeper)
            }
            fn decide(&mut self, view: &View) -> Decision {
                Decision::WaitUntil(view.now + 1)
            }
        }
        let mut h = Harness::<Sleeper>::new(config(1_000, models(), "")).expect("init");
        h.set_max_decisions(50);
        let r = h.replay(&[0, 10], 1.0);
        assert!(r.truncated);
        assert_eq!(r.decisions.len(), 50);
        assert_eq!(r.left, 2);
    }
}
