//! `model-switching`: ModelSwitching, the load-granular baseline of RAMSIS
//! (EuroSys'24, §7 "Baseline MS&S Policies"; ModelSwitching, SoCC'20 \[57\]).
//!
//! Start here: [`ModelSwitching`] (the policy), [`Params`] (its `params` JSON)
//! and [`Table`] (load buckets → model, with [`Table::lookup`]).
//!
//! Offline, each model is simulated at each load and, per load, the most
//! accurate model whose p99 *response* latency stays within the SLO (violation
//! rate under 1%) is kept. Until `sluice model-switching build` produces the
//! table, it comes in `params`, either as `{"table": [[load_qps, "model"], ...]}`
//! or in the reference format of RAMSIS's artifact (one `test_rate-<r>_pi.json`
//! file per load, `r` in requests per µs, content `{"-1": <model index>}`):
//! `{"reference": {"test_rate-0.0002_pi.json": {"-1": 7}, ...}, "index_models": [...]}`.
//!
//! Online, the host's load estimate (`view.load_qps`, or a fixed `load_qps`)
//! selects the bucket: the smallest table load at or above the estimate (the
//! highest one beyond the table), as RAMSIS picks the policy generated for the
//! smallest load ≥ the estimate. That model then serves work-conserving, with no
//! drops, at a batch chosen by `batching`: by default the largest batch from the
//! head that still meets the head's deadline; with `"reference"` as the RAMSIS
//! artifact's `StaticInstPi` does (see [`Batching::Reference`]).
//! A model the table names but this worker has not loaded falls back to the
//! most accurate loaded model that the table allows at a higher load (a less
//! accurate one), else the fastest loaded model.

use std::collections::BTreeMap;

use serde::Deserialize;
use sluice_sdk::{helpers, log, Config, Decision, Level, Policy, View};

/// The policy's parameters: exactly one of `table` and `reference`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Params {
    /// `[[load_qps, "model name"], ...]`, any order.
    pub table: Option<Vec<(f64, String)>>,
    /// RAMSIS's reference format: file name → file content.
    pub reference: Option<BTreeMap<String, BTreeMap<String, u32>>>,
    /// Model names for the indices of `reference`; default the app's model
    /// ids (`config.models` order).
    pub index_models: Option<Vec<String>>,
    /// The largest batch served; default each model's profile.
    pub max_batch: Option<u32>,
    /// A fixed app load in requests per second instead of the host's estimate.
    /// The RAMSIS artifact runs each constant-load experiment with the one
    /// policy made for that load (`run_sim.py`, `trace == "constant"`).
    pub load_qps: Option<f64>,
    /// How the batch is sized.
    pub batching: Batching,
}

/// How a ModelSwitching worker sizes its batch.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Batching {
    /// The largest batch from the head that still meets the head's deadline
    /// (at least 1).
    #[default]
    Deadline,
    /// The RAMSIS artifact's `StaticInstPi` (`model_selector.py`,
    /// `set_aggressive_max_batch_size`): with `r = λ_b / K` for the bucket's
    /// table load `λ_b`, each model's largest batch `b ≤ N` with `b / L(b) ≥ r`
    /// and `L(b) ≤ SLO/2`; the cap is that of the most accurate model that has
    /// one (`N`, the largest batch, when none has), whatever model the table
    /// names; a free worker then takes `min(queue, cap)` from the head without
    /// looking at deadlines. This is how the artifact both built its tables and
    /// ran ModelSwitching.
    Reference,
}

/// Load buckets: `(load_qps, model id)`, increasing load.
#[derive(Clone, Debug, PartialEq)]
pub struct Table(Vec<(f64, u32)>);

impl Table {
    /// Builds the table from the params, resolving names against `config`.
    pub fn from_params(params: &Params, config: &Config) -> Result<Self, String> {
        let id_of = |name: &str| {
            config
                .model_named(name)
                .map(|m| m.id)
                .ok_or_else(|| format!("unknown model `{name}` (valid models: {})", config.model_names()))
        };
        let mut rows: Vec<(f64, u32)> = match (&params.table, &params.reference) {
            (Some(_), Some(_)) => return Err("give one of `table` and `reference`, not both".into()),
            (None, None) => return Err("missing param `table` ([[load_qps, model], ...]) or `reference`".into()),
            (Some(table), None) => {
                table.iter().map(|(load, name)| Ok((*load, id_of(name)?))).collect::<Result<_, String>>()?
            }
            (None, Some(reference)) => reference
                .iter()
                .map(|(file, content)| {
                    let rate = file
                        .strip_prefix("test_rate-")
                        .and_then(|r| r.strip_suffix("_pi.json"))
                        .and_then(|r| r.parse::<f64>().ok())
                        .ok_or_else(|| format!("reference file `{file}` is not test_rate-<rate>_pi.json"))?;
                    let index =
                        *content.get("-1").ok_or_else(|| format!("reference file `{file}` has no \"-1\" entry"))?;
                    let id =
                        match &params.index_models {
                            Some(names) => id_of(names.get(index as usize).ok_or_else(|| {
                                format!("reference file `{file}`: index {index} beyond `index_models`")
                            })?)?,
                            None if config.model(index).is_some() => index,
                            None => return Err(format!("reference file `{file}`: no model with index {index}")),
                        };
                    // The artifact's rates are requests per µs.
                    Ok((rate * 1e6, id))
                })
                .collect::<Result<_, String>>()?,
        };
        if rows.is_empty() {
            return Err("the table is empty".into());
        }
        if let Some((load, _)) = rows.iter().find(|(load, _)| !(load.is_finite() && *load >= 0.0)) {
            return Err(format!("table load {load} is not a non-negative number"));
        }
        rows.sort_by(|a, b| a.0.total_cmp(&b.0));
        Ok(Table(rows))
    }

    /// The bucket for `load`: the first entry with load ≥ `load`, else the last.
    pub fn bucket(&self, load: f64) -> usize {
        self.0.iter().position(|&(l, _)| l >= load).unwrap_or(self.0.len() - 1)
    }

    /// The model for `load` among `loaded`: the bucket's model, or the first
    /// loaded model of a higher bucket (the table's choice for a heavier load),
    /// or `None`.
    pub fn lookup(&self, load: f64, loaded: &[u32]) -> Option<u32> {
        self.0[self.bucket(load)..].iter().map(|&(_, id)| id).find(|id| helpers::is_loaded(loaded, *id))
    }

    /// The rows, increasing load.
    pub fn rows(&self) -> &[(f64, u32)] {
        &self.0
    }
}

/// The ModelSwitching policy for one worker.
#[derive(Debug)]
pub struct ModelSwitching {
    config: Config,
    table: Table,
    max_batch: Option<u32>,
    load_qps: Option<f64>,
    /// Per table row, the reference batch cap (empty unless `batching` is
    /// [`Batching::Reference`]).
    reference_caps: Vec<u32>,
    /// The model chosen at the last decision, to log switches once.
    current: Option<u32>,
}

impl ModelSwitching {
    /// The table in force.
    pub fn table(&self) -> &Table {
        &self.table
    }

    /// The reference batch cap for table load `load` (requests/s): see
    /// [`Batching::Reference`]. `n` is the largest batch considered.
    pub fn reference_cap(config: &Config, load: f64, n: u32) -> u32 {
        let per_worker = load / f64::from(config.workers.max(1));
        let largest = |m: &sluice_sdk::Model| {
            (1..=n.min(m.max_batch()))
                .filter(|&b| {
                    let l = m.latency(b).unwrap_or(u64::MAX);
                    // b / L(b) >= r with L in µs and r in req/s; L(b) <= SLO/2.
                    f64::from(b) * 1e6 >= per_worker * l as f64 && l.saturating_mul(2) <= config.slo
                })
                .max()
        };
        // np.argmax over accuracy · mask: the first most accurate model that has a batch.
        let mut best: Option<(f64, u32)> = None;
        for m in &config.models {
            if let Some(b) = largest(m) {
                if best.is_none_or(|(acc, _)| m.accuracy > acc) {
                    best = Some((m.accuracy, b));
                }
            }
        }
        best.map_or(n, |(_, b)| b)
    }
}

impl Policy for ModelSwitching {
    // `observe` is the default no-op: the host need not call it after each batch.
    const OBSERVES: bool = false;

    fn init(config: Config) -> Result<Self, String> {
        let params: Params = config.params().map_err(|e| format!("model-switching: {e}"))?;
        if params.max_batch == Some(0) {
            return Err("model-switching: param `max_batch` must be at least 1".into());
        }
        if let Some(load) = params.load_qps {
            if !(load.is_finite() && load >= 0.0) {
                return Err(format!("model-switching: param `load_qps` must be a non-negative number, got {load}"));
            }
        }
        let table = Table::from_params(&params, &config).map_err(|e| format!("model-switching: {e}"))?;
        let reference_caps = match params.batching {
            Batching::Deadline => Vec::new(),
            Batching::Reference => {
                let n =
                    params.max_batch.unwrap_or_else(|| config.models.iter().map(|m| m.max_batch()).max().unwrap_or(1));
                table.rows().iter().map(|&(load, _)| Self::reference_cap(&config, load, n)).collect()
            }
        };
        Ok(ModelSwitching {
            config,
            table,
            max_batch: params.max_batch,
            load_qps: params.load_qps,
            reference_caps,
            current: None,
        })
    }

    fn decide(&mut self, view: &View) -> Decision {
        let load = self.load_qps.unwrap_or(view.load_qps);
        let load = if load >= 0.0 { load } else { 0.0 };
        let chosen = self
            .table
            .lookup(load, &view.loaded)
            .filter(|&id| self.config.model(id).is_some_and(|m| m.max_batch() > 0))
            .or_else(|| helpers::fastest_model(&self.config.models, &view.loaded).map(|m| m.id));
        if chosen != self.current {
            self.current = chosen;
            let name = chosen.and_then(|id| self.config.model(id)).map_or("none", |m| m.name.as_str());
            log(Level::Debug, &format!("model-switching: {name} at {load:.0} req/s"));
        }
        let Some(model) = chosen.and_then(|id| self.config.model(id)) else {
            return Decision::Idle;
        };
        if view.queue.is_empty() {
            return Decision::Idle;
        }
        let mut batch = match self.reference_caps.get(self.table.bucket(load)) {
            // The artifact's StaticInstPi: min(queue, cap), deadlines not looked at.
            Some(&cap) => cap.min(model.max_batch()).min(u32::try_from(view.queue.len()).unwrap_or(u32::MAX)).max(1),
            None => helpers::largest_feasible_batch(model, view),
        };
        if let Some(cap) = self.max_batch {
            batch = batch.min(cap);
        }
        Decision::serve_head(model.id, batch)
    }
}

#[cfg(feature = "export")]
sluice_sdk::export_policy!(ModelSwitching);

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sdk::testing::{config, linear_model, pending, Harness};
    use sluice_sdk::{Micros, Model, Pending};

    const SLO: Micros = 150_000;

    fn models() -> Vec<Model> {
        let m = |id: u32, name: &str, accuracy: f64, base: u64| {
            linear_model(id, name, accuracy, base * 1_000, base * 500, 8)
        };
        vec![m(0, "fast", 0.6, 10), m(1, "mid", 0.7, 20), m(2, "best", 0.8, 40)]
    }

    fn harness(params: &str) -> Harness<ModelSwitching> {
        Harness::new(config(SLO, models(), params)).expect("init")
    }

    fn queue(n: u64) -> Vec<Pending> {
        (0..n).map(|i| pending(i, 0, SLO)).collect()
    }

    const TABLE: &str = r#"{"table": [[400, "best"], [800, "mid"], [1200, "fast"]]}"#;

    #[test]
    fn buckets_pick_the_smallest_load_at_or_above_the_estimate() {
        let h = harness(TABLE);
        let t = h.policy().table();
        let all = [0, 1, 2];
        assert_eq!(t.lookup(0.0, &all), Some(2));
        assert_eq!(t.lookup(400.0, &all), Some(2));
        assert_eq!(t.lookup(401.0, &all), Some(1));
        assert_eq!(t.lookup(1000.0, &all), Some(0));
        assert_eq!(t.lookup(5000.0, &all), Some(0), "beyond the table: the heaviest bucket");
        // The bucket's model is not loaded: the next heavier bucket's.
        assert_eq!(t.lookup(100.0, &[0, 1]), Some(1));
        assert_eq!(t.lookup(100.0, &[]), None);
    }

    #[test]
    fn decide_serves_the_bucket_model_like_jellyfish() {
        let mut h = harness(TABLE);
        // 300 req/s: "best" (40 ms + 20 ms per extra); budget 150 ms → b = 6.
        let v = h.view(0, 300.0, queue(10));
        assert_eq!(h.decide_checked(&v), Ok(Decision::serve_head(2, 6)));
        let v = h.view(0, 1000.0, queue(3));
        assert_eq!(h.decide_checked(&v), Ok(Decision::serve_head(0, 3)));
        assert_eq!(h.decide(&h.view(0, 1000.0, vec![])), Decision::Idle);
        // Nothing the table names is loaded... all are here; drop "fast" and
        // "mid" and ask for 1000: the table has no heavier loaded entry, so
        // the fastest loaded model serves.
        h.set_loaded(vec![2]);
        assert_eq!(h.decide_checked(&h.view(0, 1000.0, queue(1))), Ok(Decision::serve_head(2, 1)));
    }

    #[test]
    fn reference_batching_caps_by_the_most_accurate_sustaining_model() {
        // One worker. SLO/2 = 75 ms: best (40 + 20(b−1) ms) up to b = 2 (28.6 req/s
        // at b = 2), mid (20 + 10(b−1)) up to 6 (60 req/s), fast (10 + 5(b−1))
        // up to 8 (profile's largest: 177.8 req/s).
        let c = config(SLO, models(), TABLE);
        assert_eq!(ModelSwitching::reference_cap(&c, 20.0, 8), 2, "best sustains 20 req/s with b = 2");
        assert_eq!(ModelSwitching::reference_cap(&c, 50.0, 8), 6, "mid: 5/60 ms = 83, 6/70 ms = 86 req/s");
        assert_eq!(ModelSwitching::reference_cap(&c, 150.0, 8), 8, "fast only");
        assert_eq!(ModelSwitching::reference_cap(&c, 1000.0, 8), 8, "none: N");
        // Served: min(queue, cap) from the head with the table's model, even when the
        // head cannot make its deadline any more.
        let params = r#"{"table": [[20, "best"], [1000, "fast"]], "batching": "reference", "load_qps": 20}"#;
        let mut h = harness(params);
        let v = h.view(1_000_000, 0.0, queue(10));
        assert_eq!(h.decide_checked(&v), Ok(Decision::serve_head(2, 2)));
        let params = r#"{"table": [[20, "best"], [1000, "mid"]], "batching": "reference", "load_qps": 900}"#;
        let mut h = harness(params);
        let v = h.view(0, 0.0, queue(3));
        assert_eq!(h.decide_checked(&v), Ok(Decision::serve_head(1, 3)), "a short queue is taken whole");
        let v = h.view(0, 0.0, queue(20));
        assert_eq!(h.decide_checked(&v), Ok(Decision::serve_head(1, 8)), "cap N = 8 at 1000 req/s");
    }

    #[test]
    fn reads_the_reference_format() {
        let params = r#"{"reference": {"test_rate-0.0002_pi.json": {"-1": 2},
                                        "test_rate-0.001_pi.json": {"-1": 1},
                                        "test_rate-0.004_pi.json": {"-1": 0}}}"#;
        let h = harness(params);
        assert_eq!(h.policy().table().rows(), &[(200.0, 2), (1000.0, 1), (4000.0, 0)]);
        let params = r#"{"reference": {"test_rate-0.0002_pi.json": {"-1": 0}}, "index_models": ["mid"]}"#;
        assert_eq!(harness(params).policy().table().rows(), &[(200.0, 1)]);
    }

    #[test]
    fn reads_the_shipped_reference_tables() {
        // The RAMSIS artifact's tables index 8 ImageNet models; map them onto
        // ours by index modulo 3 just to parse every file.
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(
            "../../../shared/data/ramsis/model_switching_tables/image_cloud_cpu_ModelSwitching_instances-60_150ms_0.01",
        );
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return; // the shared data is not part of every checkout
        };
        let mut reference = serde_json::Map::new();
        for e in entries.flatten() {
            let text = std::fs::read_to_string(e.path()).expect("readable");
            reference.insert(e.file_name().to_string_lossy().into_owned(), serde_json::from_str(&text).expect("json"));
        }
        let names: Vec<&str> = (0..8).map(|i| ["fast", "mid", "best"][i % 3]).collect();
        let params = serde_json::json!({ "reference": reference, "index_models": names }).to_string();
        let h = harness(&params);
        let rows = h.policy().table().rows();
        assert_eq!(rows.len(), 20);
        assert_eq!(rows[0].0, 200.0);
        assert_eq!(rows[19].0, 4000.0);
    }

    #[test]
    fn params_errors_name_the_problem() {
        let err = |p: &str| Harness::<ModelSwitching>::new(config(SLO, models(), p)).unwrap_err();
        assert!(err("{}").contains("missing param `table`"));
        assert!(err(r#"{"table": [[1, "nope"]]}"#).contains("unknown model `nope`"));
        assert!(err(r#"{"table": []}"#).contains("empty"));
        assert!(err(r#"{"table": [[-1, "fast"]]}"#).contains("-1"));
        assert!(err(r#"{"reference": {"x.json": {"-1": 0}}}"#).contains("x.json"));
        assert!(err(r#"{"reference": {"test_rate-1_pi.json": {"-1": 9}}}"#).contains("index 9"));
        assert!(err(&TABLE.replace('}', r#", "max_batch": 0}"#)).contains("max_batch"));
        assert!(err(&TABLE.replace('}', r#", "load_qps": -5}"#)).contains("load_qps"));
        assert!(err(&TABLE.replace('}', r#", "batching": "x"}"#)).contains("unknown variant `x`"));
    }

    #[test]
    fn replay_switches_with_the_load() {
        // 20 req/s: "best" keeps up (one 40 ms batch per 50 ms arrival).
        let arrivals: Vec<Micros> = (0..100).map(|i| i * 50_000).collect();
        let r = harness(TABLE).replay(&arrivals, 20.0);
        assert!(r.batches.iter().all(|&(m, _)| m == 2));
        assert_eq!((r.served, r.late, r.dropped), (100, 0, 0));
        let r = harness(TABLE).replay(&arrivals, 900.0);
        assert!(r.batches.iter().all(|&(m, _)| m == 0));
    }
}
