//! A combined policy: ModelSwitching's load-bucket table chooses the model
//! (RAMSIS §7, `policies/model-switching`), and spread-drop's Algorithm 3
//! decides which requests to drop when more are about to miss their deadline
//! than the batch can hold (`policies/spread-drop`).
//!
//! Both are used as plain Rust libraries: policy crates are `rlib`s as well as
//! components, and depending on them with `default-features = false` leaves out
//! their `export` feature, so only this crate's policy is exported.
//!
//! Each decision serves from the head (work-conserving) with the table's model
//! for the current load and the largest batch `b` with `2·L(b) ≤ SLO`
//! (spread-drop §4.3). First it drops the requests that no batch can save
//! (`now + L(1) > deadline`); then, when the requests that must go in this batch
//! to meet their deadline (due before `now + 2·L(b)`: spread-drop's candidate
//! set) outnumber `b`, it keeps `b` of them spread out, so that no more than
//! `⌈|C|/b⌉ − 1` are dropped in a row.

use policy_model_switching::{Params, Table};
use policy_spread_drop::{largest_batch_for, select, Objective};
use sluice_sdk::{helpers, Config, Decision, Dispatch, Policy, View};

/// ModelSwitching's model choice with spread-drop's drop rule.
pub struct Combined {
    config: Config,
    table: Table,
}

impl Policy for Combined {
    /// Params are ModelSwitching's: `{"table": [[load_qps, "model"], ...]}`.
    fn init(config: Config) -> Result<Self, String> {
        let params: Params = config.params().map_err(|e| format!("combined: {e}"))?;
        let table = Table::from_params(&params, &config).map_err(|e| format!("combined: {e}"))?;
        Ok(Combined { config, table })
    }

    fn decide(&mut self, view: &View) -> Decision {
        let models = &self.config.models;
        let id = self.table.lookup(view.load_qps.max(0.0), &view.loaded);
        let Some(model) =
            id.and_then(|id| self.config.model(id)).or_else(|| helpers::fastest_model(models, &view.loaded))
        else {
            return Decision::Idle;
        };
        if view.queue.is_empty() || model.max_batch() == 0 {
            return Decision::Idle;
        }
        let l = |b: usize| model.latency(b as u32).unwrap_or(u64::MAX);
        // Hopeless heads: not even a batch of one makes it.
        let late = view.queue.iter().take_while(|p| view.now.saturating_add(l(1)) > p.deadline).count();
        let rest = view.queue.len() - late;
        let b = largest_batch_for(model, self.config.slo).unwrap_or(1) as usize;
        let batch = b.min(rest).max(1);
        // Spread-drop's candidate set: due before two batch times from now.
        let horizon = view.now.saturating_add(2 * l(batch));
        let candidates = view.queue[late..].iter().take_while(|p| p.deadline <= horizon).count();
        let mut keep = vec![false; candidates];
        let mut take: Vec<u32> = Vec::with_capacity(batch);
        for c in select(candidates, batch, Objective::Mcd, &[]) {
            keep[c] = true;
            take.push((late + c) as u32);
        }
        let room = batch.saturating_sub(take.len()).min(rest - candidates);
        take.extend((late + candidates..late + candidates + room).map(|i| i as u32));
        let mut drop: Vec<u32> = (0..late as u32).collect();
        drop.extend((0..candidates).filter(|&c| !keep[c]).map(|c| (late + c) as u32));
        if take.is_empty() && drop.is_empty() {
            return Decision::Idle;
        }
        Decision::Dispatch(Dispatch { model: model.id, take, drop })
    }
}

sluice_sdk::export_policy!(Combined);

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sdk::testing::{config, linear_model, pending, Harness};
    use sluice_sdk::Model;

    const SLO: u64 = 100_000;

    /// "m": L(b) = 10 + 5(b − 1) ms; "tiny": 20 ms for any batch up to 2.
    fn models() -> Vec<Model> {
        vec![
            linear_model(0, "m", 0.8, 10_000, 5_000, 16),
            Model { id: 1, name: "tiny".into(), accuracy: 0.5, latency: vec![20_000, 20_000] },
        ]
    }

    const TABLE: &str = r#"{"table": [[100, "m"], [1000, "tiny"]]}"#;

    #[test]
    fn spreads_drops_when_the_candidates_overflow_the_batch() {
        let mut h = Harness::<Combined>::new(config(SLO, models(), TABLE)).unwrap();
        // 500 req/s: "tiny", b = 2 (2·20 ms ≤ 100 ms). now = 70 ms: the 5
        // requests due by 110 ms are candidates; 2 are kept, spread out.
        let queue: Vec<_> = (0..5).map(|i| pending(i, i * 2_000, SLO)).collect();
        let d = h.decide_checked(&h.view(70_000, 500.0, queue)).unwrap();
        assert_eq!(d, Decision::Dispatch(Dispatch { model: 1, take: vec![1, 4], drop: vec![0, 2, 3] }));
    }

    #[test]
    fn serves_from_the_head_when_nothing_is_at_risk() {
        let mut h = Harness::<Combined>::new(config(SLO, models(), TABLE)).unwrap();
        let queue: Vec<_> = (0..3).map(|i| pending(i, 0, SLO)).collect();
        assert_eq!(h.decide_checked(&h.view(0, 10.0, queue)), Ok(Decision::serve(0, vec![0, 1, 2])));
    }
}
