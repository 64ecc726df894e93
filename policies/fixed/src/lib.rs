//! `fixed`: serve every batch with one model variant chosen by the operator.
//!
//! Start here: [`Fixed`] (the policy) and [`Params`] (its `params` JSON). A
//! baseline and a debugging aid: it shows what one variant alone achieves. The
//! batch is the largest that still meets the head's deadline
//! ([`helpers::largest_feasible_batch`]) when batching pays on the model, and one
//! request at a time when it does not ([`helpers::paying_batch`]: on a CPU a
//! ResNet-50 batch costs about its requests served one by one, so a batch only
//! adds latency); nothing is dropped. With the app's `max_batch_wait_ms` set it
//! holds a short queue up to that long for the batch to fill
//! ([`helpers::batch_window`]), as long as the head still meets its deadline. When the named
//! model is not loaded on this worker (the allocator moved it) the worker falls
//! back to [`helpers::safe_decision`] and logs one warning per such episode.
//!
//! With `{"allocated": true}` instead of a model, each worker serves with the
//! variant the allocator loaded on it (the most accurate one loaded), first come
//! first served, nothing dropped, in the largest feasible batch whether or not it
//! pays (the allocator sized the batch): a worker as TF Serving runs one, for
//! allocators that choose variants per device (InfAdapter's experiment, Loki's
//! per-task workers, docs/allocator.md).

use serde::Deserialize;
use sluice_sdk::{helpers, log, Config, Decision, Level, Micros, Model, Policy, View};

/// The policy's parameters: `{"model": "<variant name>"}` or `{"allocated": true}`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Params {
    /// The variant that serves every batch, by its name in the app's models.
    /// Required unless `allocated`.
    pub model: Option<String>,
    /// Serve with whatever the allocator loaded on this worker instead of one
    /// named variant.
    pub allocated: bool,
}

/// Always the configured model; batch sized to meet the head's deadline.
#[derive(Debug)]
pub struct Fixed {
    config: Config,
    /// None: the loaded variant (`allocated`).
    model: Option<u32>,
    /// Set while the model is not loaded here and the fallback was announced;
    /// cleared when it is loaded again, so each episode warns once.
    warned: bool,
    /// The app's batching window (`max_batch_wait_ms`), µs; 0: none.
    max_wait: Micros,
}

impl Fixed {
    /// The id of the model this policy serves with (None: the loaded one).
    pub fn model(&self) -> Option<u32> {
        self.model
    }

    /// Serves the head of the queue with `model`: after the batching window, in the
    /// largest feasible batch if batching pays, else one request. With `allocated`
    /// the allocator sized the batch (the latency table it gives the worker ends at
    /// the plan's batch size, as Loki's `pipeline_batch_size`, and its capacity
    /// counts on it), so the largest feasible batch is served as is.
    fn serve(&self, model: &Model, view: &View) -> Decision {
        let size = |batch: u32| if self.model.is_none() { batch } else { helpers::paying_batch(model, batch) };
        if let Some(head) = view.queue.first() {
            let budget = head.deadline.saturating_sub(view.now);
            let target = size(helpers::largest_batch_within(model, budget, model.max_batch()));
            if let Some(until) = helpers::batch_window(model, view, self.max_wait, target) {
                return Decision::WaitUntil(until);
            }
        }
        Decision::serve_head(model.id, size(helpers::largest_feasible_batch(model, view)))
    }
}

impl Policy for Fixed {
    // `observe` is the default no-op: the host need not call it after each batch.
    const OBSERVES: bool = false;

    fn init(config: Config) -> Result<Self, String> {
        let params: Params = config.params().map_err(|e| format!("fixed: {e}"))?;
        if params.allocated {
            if let Some(name) = params.model {
                return Err(format!("fixed: give `model` (`{name}`) or `allocated`, not both"));
            }
            let max_wait = config.host_settings().max_batch_wait_us;
            return Ok(Fixed { config, model: None, warned: false, max_wait });
        }
        let Some(name) = params.model else {
            return Err(format!("fixed: missing param `model` (one of: {})", config.model_names()));
        };
        let model = config
            .model_named(&name)
            .ok_or_else(|| format!("fixed: unknown model `{name}` (valid models: {})", config.model_names()))?;
        if model.max_batch() == 0 {
            return Err(format!("fixed: model `{name}` has an empty latency profile"));
        }
        let model = Some(model.id);
        let max_wait = config.host_settings().max_batch_wait_us;
        Ok(Fixed { config, model, warned: false, max_wait })
    }

    fn decide(&mut self, view: &View) -> Decision {
        let Some(id) = self.model else {
            let best = self
                .config
                .models
                .iter()
                .filter(|m| helpers::is_loaded(&view.loaded, m.id) && m.max_batch() > 0)
                .max_by(|a, b| a.accuracy.total_cmp(&b.accuracy));
            return match (best, view.queue.is_empty()) {
                (Some(m), false) => self.serve(m, view),
                _ => Decision::Idle,
            };
        };
        if !helpers::is_loaded(&view.loaded, id) {
            if !self.warned {
                self.warned = true;
                log(
                    Level::Warn,
                    &format!(
                        "fixed: model `{}` is not loaded on worker {}; using the safe decision",
                        self.config.models[id as usize].name, view.worker
                    ),
                );
            }
            return helpers::safe_decision(&self.config.models, view);
        }
        self.warned = false;
        self.serve(&self.config.models[id as usize], view)
    }
}

sluice_sdk::export_policy!(Fixed);

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sdk::testing::{config, pending, take_logs, Harness};
    use sluice_sdk::{Micros, Model, Pending};

    const SLO: Micros = 100_000;

    fn models() -> Vec<Model> {
        vec![
            Model { id: 0, name: "resnet18".into(), accuracy: 0.69, latency: vec![10_000, 14_000, 18_000, 22_000] },
            Model { id: 1, name: "resnet152".into(), accuracy: 0.78, latency: vec![40_000, 60_000, 80_000, 100_000] },
        ]
    }

    fn harness(params: &str) -> Harness<Fixed> {
        Harness::new(config(SLO, models(), params)).expect("init")
    }

    fn queue(now: Micros, n: u64) -> Vec<Pending> {
        (0..n).map(|i| pending(i, now, SLO)).collect()
    }

    #[test]
    fn init_names_the_problem() {
        let err = Harness::<Fixed>::new(config(SLO, models(), "{}")).unwrap_err();
        assert!(err.contains("missing param `model`"), "{err}");
        assert!(err.contains("resnet18, resnet152"), "{err}");
        let err = Harness::<Fixed>::new(config(SLO, models(), r#"{"model":"vgg"}"#)).unwrap_err();
        assert!(err.contains("unknown model `vgg`"), "{err}");
        assert!(err.contains("resnet18, resnet152"), "{err}");
        let err = Harness::<Fixed>::new(config(SLO, models(), r#"{"modle":"x"}"#)).unwrap_err();
        assert!(err.starts_with("fixed: invalid params"), "{err}");
        assert!(err.contains("modle"), "{err}");
    }

    #[test]
    fn always_the_named_model_with_the_largest_feasible_batch() {
        let mut h = harness(r#"{"model":"resnet152"}"#);
        assert_eq!(h.policy().model(), Some(1));
        // Budget 100 ms: b = 4 (100 ms) fits exactly.
        let v = h.view(0, 100.0, queue(0, 6));
        assert_eq!(h.decide(&v), Decision::serve(1, vec![0, 1, 2, 3]));
        // 35 ms later the budget is 65 ms: b = 2.
        let v = h.view(35_000, 100.0, queue(0, 6));
        assert_eq!(h.decide(&v), Decision::serve(1, vec![0, 1]));
        // Hopeless head: serve late, the largest batch, to catch up.
        let v = h.view(90_000, 100.0, queue(0, 6));
        assert_eq!(h.decide(&v), Decision::serve(1, vec![0, 1, 2, 3]));
        let v = h.view(0, 100.0, vec![]);
        assert_eq!(h.decide(&v), Decision::Idle);
    }

    #[test]
    fn one_request_at_a_time_where_batching_does_not_pay() {
        // ResNet-50 on this machine's CPU: a batch of b costs about b singles.
        let cpu = vec![Model {
            id: 0,
            name: "resnet50".into(),
            accuracy: 0.76,
            latency: vec![97_000, 216_000, 385_000, 786_000],
        }];
        let mut h = Harness::<Fixed>::new(config(2_000_000, cpu.clone(), r#"{"model":"resnet50"}"#)).expect("init");
        let v = h.view(0, 10.0, (0..6).map(|i| pending(i, 0, 2_000_000)).collect());
        assert_eq!(h.decide(&v), Decision::serve(0, vec![0]));
        // With `allocated` the allocator sized the batch (its table ends at the plan's
        // batch size): the largest feasible batch is served even where it does not pay.
        let mut h = Harness::<Fixed>::new(config(2_000_000, cpu, r#"{"allocated":true}"#)).expect("init");
        h.set_loaded(vec![0]);
        let v = h.view(0, 10.0, (0..6).map(|i| pending(i, 0, 2_000_000)).collect());
        assert_eq!(h.decide(&v), Decision::serve(0, vec![0, 1, 2, 3]));
    }

    #[test]
    fn the_apps_batching_window_holds_a_short_queue_while_the_head_can_wait() {
        // max_batch_wait_ms = 20, as the host passes it.
        let params = r#"{"model":"resnet18","sluice":{"max_batch_wait_us":20000}}"#;
        let mut h = harness(params);
        // One request arrived at 0, now 5 ms: wait until 20 ms for the batch of 4.
        assert_eq!(h.decide(&h.view(5_000, 100.0, queue(0, 1))), Decision::WaitUntil(20_000));
        // Four queued: the batch is full, serve now.
        assert_eq!(h.decide(&h.view(5_000, 100.0, queue(0, 4))), Decision::serve(0, vec![0, 1, 2, 3]));
        // The window is over: serve what there is.
        assert_eq!(h.decide(&h.view(20_000, 100.0, queue(0, 2))), Decision::serve(0, vec![0, 1]));
        // Without the host setting: never wait.
        let mut h = harness(r#"{"model":"resnet18"}"#);
        assert_eq!(h.decide(&h.view(5_000, 100.0, queue(0, 1))), Decision::serve(0, vec![0]));
    }

    #[test]
    fn allocated_serves_the_loaded_variant_first_come_first_served() {
        let err = Harness::<Fixed>::new(config(SLO, models(), r#"{"allocated":true,"model":"resnet18"}"#)).unwrap_err();
        assert!(err.contains("not both"), "{err}");
        let mut h = harness(r#"{"allocated":true}"#);
        assert_eq!(h.policy().model(), None);
        h.set_loaded(vec![1]);
        let v = h.view(0, 100.0, queue(0, 6));
        assert_eq!(h.decide(&v), Decision::serve(1, vec![0, 1, 2, 3]));
        // The allocator moved the worker to resnet18: it follows, warning nothing.
        let _ = take_logs();
        h.set_loaded(vec![0]);
        let v = h.view(0, 100.0, queue(0, 1));
        assert_eq!(h.decide(&v), Decision::serve(0, vec![0]));
        assert!(take_logs().is_empty());
        // Nothing loaded or nothing queued: idle; a hopeless head is still served.
        h.set_loaded(vec![]);
        assert_eq!(h.decide(&h.view(0, 100.0, queue(0, 3))), Decision::Idle);
        h.set_loaded(vec![0]);
        assert_eq!(h.decide(&h.view(0, 100.0, vec![])), Decision::Idle);
        assert_eq!(h.decide(&h.view(500_000, 100.0, queue(0, 1))), Decision::serve(0, vec![0]));
    }

    #[test]
    fn falls_back_when_not_loaded_and_warns_once() {
        let _ = take_logs();
        let mut h = harness(r#"{"model":"resnet152"}"#);
        h.set_loaded(vec![0]);
        for _ in 0..3 {
            let v = h.view(0, 100.0, queue(0, 6));
            // The safe decision: resnet18, b = 4 (22 ms).
            assert_eq!(h.decide(&v), Decision::serve(0, vec![0, 1, 2, 3]));
        }
        let logs = take_logs();
        assert_eq!(logs.len(), 1, "{logs:?}");
        assert_eq!(logs[0].0, Level::Warn);
        assert!(logs[0].1.contains("resnet152"), "{logs:?}");
        // Loaded again, then unloaded again: a new episode, a new warning.
        h.set_loaded(vec![0, 1]);
        let v = h.view(0, 100.0, queue(0, 1));
        assert_eq!(h.decide(&v), Decision::serve(1, vec![0]));
        h.set_loaded(vec![0]);
        let v = h.view(0, 100.0, queue(0, 1));
        assert_eq!(h.decide(&v), Decision::serve(0, vec![0]));
        assert_eq!(take_logs().len(), 1);
    }

    #[test]
    fn replay_with_the_slow_model_is_late_under_load() {
        // 40 ms per request alone; arrivals every 10 ms overwhelm resnet152 for a
        // while but batching catches up; resnet18 keeps up easily.
        let arrivals: Vec<Micros> = (0..50).map(|i| i * 10_000).collect();
        let fast = harness(r#"{"model":"resnet18"}"#).replay(&arrivals, 100.0);
        assert_eq!((fast.served, fast.late, fast.invalid), (50, 0, 0));
        assert!(fast.batches.iter().all(|&(m, _)| m == 0));
        let slow = harness(r#"{"model":"resnet152"}"#).replay(&arrivals, 100.0);
        assert_eq!(slow.served, 50);
        assert_eq!(slow.invalid, 0);
        assert!(slow.batches.iter().all(|&(m, _)| m == 1));
        assert!(slow.batches.iter().any(|&(_, b)| b > 1), "{:?}", slow.batches);
    }
}
