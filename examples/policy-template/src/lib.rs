//! A first sluice policy: serve with the most accurate loaded model that still
//! meets the head request's deadline, in the largest batch that does; fall back
//! to the fastest model when none can. Start here, then see
//! `docs/writing-a-policy.md`.

use serde::Deserialize;
use sluice_sdk::{helpers, Config, Decision, Policy, View};

/// `params`: `{"max_batch": 8}` (optional).
#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Params {
    /// Largest batch to form; default the model's profile.
    pub max_batch: Option<u32>,
}

/// The policy for one worker.
pub struct Template {
    config: Config,
    params: Params,
}

impl Policy for Template {
    fn init(config: Config) -> Result<Self, String> {
        let params = config.params().map_err(|e| format!("template: {e}"))?;
        Ok(Template { config, params })
    }

    fn decide(&mut self, view: &View) -> Decision {
        let Some(head) = view.queue.first() else { return Decision::Idle };
        let budget = head.deadline.saturating_sub(view.now);
        let models = &self.config.models;
        let Some(model) = helpers::most_accurate_within(models, &view.loaded, budget)
            .or_else(|| helpers::fastest_model(models, &view.loaded))
        else {
            return Decision::Idle;
        };
        let batch = helpers::largest_feasible_batch(model, view).min(self.params.max_batch.unwrap_or(u32::MAX));
        Decision::serve_head(model.id, batch.max(1))
    }
}

sluice_sdk::export_policy!(Template);

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sdk::testing::{config, pending, Harness};
    use sluice_sdk::Model;

    fn models() -> Vec<Model> {
        vec![
            Model { id: 0, name: "fast".into(), accuracy: 0.6, latency: vec![10_000, 12_000, 14_000] },
            Model { id: 1, name: "accurate".into(), accuracy: 0.9, latency: vec![40_000, 60_000, 80_000] },
        ]
    }

    #[test]
    fn picks_the_most_accurate_model_that_meets_the_head() {
        let mut h = Harness::<Template>::new(config(100_000, models(), "{}")).unwrap();
        let queue = vec![pending(0, 0, 100_000), pending(1, 0, 100_000)];
        // 100 ms of slack: "accurate" serves both (60 ms).
        assert_eq!(h.decide_checked(&h.view(0, 0.0, queue.clone())), Ok(Decision::serve(1, vec![0, 1])));
        // 30 ms left: only "fast" makes it.
        assert_eq!(h.decide_checked(&h.view(70_000, 0.0, queue)), Ok(Decision::serve(0, vec![0, 1])));
    }
}
