//! Plain Rust mirrors of the records in `wit/policy.wit` (`sluice:policy/types`).
//!
//! Field names and meanings are the WIT ones (kebab-case becomes snake_case);
//! the doc comments here summarise, the WIT file is authoritative.

use serde::{Deserialize, Serialize};

/// Microseconds on the host clock: wall time when serving, virtual time in the
/// simulator. Policies never read a clock of their own.
pub type Micros = u64;

/// One model variant of the app.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Model {
    /// Index of this model in [`Config::models`]; [`Dispatch::model`] refers to it.
    pub id: u32,
    /// The variant's name, as in the host configuration (e.g. `resnet50`).
    pub name: String,
    /// Profiled accuracy in `[0, 1]`.
    pub accuracy: f64,
    /// Profiled latency of one batch by batch size: `latency[b - 1]` serves `b`
    /// requests. Its length is the largest batch the host accepts for this model.
    pub latency: Vec<Micros>,
}

impl Model {
    /// The largest batch the host accepts for this model (`latency.len()`).
    pub fn max_batch(&self) -> u32 {
        u32::try_from(self.latency.len()).unwrap_or(u32::MAX)
    }

    /// The profiled latency of a batch of `batch` requests, or `None` when the
    /// model does not accept that size (`batch == 0` or above [`Model::max_batch`]).
    pub fn latency(&self, batch: u32) -> Option<Micros> {
        let index = usize::try_from(batch).ok()?.checked_sub(1)?;
        self.latency.get(index).copied()
    }
}

/// A request waiting in the worker's queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    /// Host-wide unique request id, stable across decisions.
    pub id: u64,
    /// When the host accepted the request.
    pub arrival: Micros,
    /// `arrival + slo`: the response is late after this instant.
    pub deadline: Micros,
}

/// What the worker sees at a decision point.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct View {
    /// The current time.
    pub now: Micros,
    /// Index of this worker within the app, in `[0, workers)`.
    pub worker: u32,
    /// Number of workers serving the app (K in RAMSIS).
    pub workers: u32,
    /// The host's estimate of the app's total arrival rate, requests per second.
    pub load_qps: f64,
    /// Ids of the models loaded on this worker now; a dispatch must name one.
    pub loaded: Vec<u32>,
    /// The queue, earliest deadline first (arrival order for equal deadlines).
    pub queue: Vec<Pending>,
}

/// Serve a batch and/or drop requests.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dispatch {
    /// The model that serves the batch (an id from [`View::loaded`]).
    pub model: u32,
    /// Indices into [`View::queue`] of the batch, in batching order: distinct,
    /// in range and at most the model's [`Model::max_batch`]. May be empty when
    /// only dropping.
    pub take: Vec<u32>,
    /// Indices into [`View::queue`] to drop now; disjoint from `take`.
    pub drop: Vec<u32>,
}

/// The answer to `decide`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Decision {
    /// Serve (and/or drop) now.
    Dispatch(Dispatch),
    /// Do nothing until this instant, or until the next arrival if sooner; then
    /// `decide` is called again.
    WaitUntil(Micros),
    /// Do nothing until the next arrival.
    Idle,
}

impl Decision {
    /// Serve the queue entries at `take` with `model`, dropping nothing.
    pub fn serve(model: u32, take: Vec<u32>) -> Self {
        Decision::Dispatch(Dispatch { model, take, drop: Vec::new() })
    }

    /// Serve the first `batch` entries of the queue (the earliest deadlines)
    /// with `model`, dropping nothing. `batch == 0` gives [`Decision::Idle`].
    pub fn serve_head(model: u32, batch: u32) -> Self {
        if batch == 0 {
            Decision::Idle
        } else {
            Decision::serve(model, (0..batch).collect())
        }
    }

    /// Drop the queue entries at `drop` without serving anything. `model` must
    /// still be a loaded model (the host validates it like any dispatch).
    pub fn drop_only(model: u32, drop: Vec<u32>) -> Self {
        Decision::Dispatch(Dispatch { model, take: Vec::new(), drop })
    }

    /// The dispatch, if this decision is one.
    pub fn as_dispatch(&self) -> Option<&Dispatch> {
        match self {
            Decision::Dispatch(dispatch) => Some(dispatch),
            _ => None,
        }
    }
}

/// Feedback after a batch completed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// The model that served the batch.
    pub model: u32,
    /// The number of requests in the batch.
    pub size: u32,
    /// When the batch started executing.
    pub started: Micros,
    /// When it finished.
    pub finished: Micros,
    /// How many of its requests finished after their deadline.
    pub missed: u32,
}

/// Everything a policy learns once, when it is bound to a worker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// The app this worker serves.
    pub app: String,
    /// The app's latency SLO.
    pub slo: Micros,
    /// Number of workers serving the app.
    pub workers: u32,
    /// This worker's index.
    pub worker: u32,
    /// Every model variant of the app, loaded on this worker or not; indexed by
    /// [`Model::id`].
    pub models: Vec<Model>,
    /// Policy-specific parameters as a JSON object (`{}` when none were given).
    pub params: String,
}

/// The key of [`Config::params`] under which the host passes its own settings for
/// the app's policies ([`HostSettings`]); a policy's own parameters never use it.
pub const HOST_PARAMS_KEY: &str = "sluice";

/// The app settings the host hands to its policies, for those that honour them
/// (from the app's config; see docs/writing-a-policy.md).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HostSettings {
    /// `max_batch_wait_ms`: how long a policy may hold the head of the queue waiting
    /// for a batch to fill when batching pays (Triton's `max_queue_delay`, MLServer's
    /// `max_batch_time`), µs; 0 (the default): never wait for a batch.
    pub max_batch_wait_us: Micros,
}

impl Config {
    /// Parses [`Config::params`] into the policy's parameter type.
    ///
    /// An empty or blank string is read as `{}`, so a parameter struct marked
    /// `#[serde(default)]` gets its defaults when the operator gave none. The
    /// error names the offending parameter as `serde_json` reports it (unknown
    /// field, missing field, wrong type) and is meant to be returned from
    /// [`Policy::init`](crate::Policy::init), prefixed with the policy's name.
    ///
    /// The host's own settings under the reserved key [`HOST_PARAMS_KEY`] are
    /// removed first (read them with [`Config::host_settings`]), so a parameter
    /// struct with `deny_unknown_fields` does not refuse them.
    pub fn params<T: serde::de::DeserializeOwned>(&self) -> Result<T, String> {
        let text = self.params.trim();
        let text = if text.is_empty() { "{}" } else { text };
        // Only a params object that may hold the reserved key pays for a second parse
        // (RAMSIS's tables run to megabytes and never hold it).
        let parsed = if text.contains(HOST_PARAMS_KEY) {
            serde_json::from_str::<serde_json::Value>(text).and_then(|mut v| {
                if let Some(o) = v.as_object_mut() {
                    o.remove(HOST_PARAMS_KEY);
                }
                serde_json::from_value(v)
            })
        } else {
            serde_json::from_str(text)
        };
        parsed.map_err(|e| {
            // Params can carry large tables (RAMSIS's run to megabytes): quote
            // only their start; serde_json's message gives the position.
            const QUOTE: usize = 200;
            if text.len() <= QUOTE {
                format!("invalid params {text}: {e}")
            } else {
                let mut cut = QUOTE;
                while !text.is_char_boundary(cut) {
                    cut -= 1;
                }
                format!("invalid params {}…: {e}", &text[..cut])
            }
        })
    }

    /// The settings the host passes to every policy of the app (the app's config
    /// keys, such as `max_batch_wait_ms`), read from [`HOST_PARAMS_KEY`] in
    /// [`Config::params`]; the defaults when the host set none.
    pub fn host_settings(&self) -> HostSettings {
        #[derive(Deserialize)]
        struct Outer {
            #[serde(default, rename = "sluice")]
            host: HostSettings,
        }
        if !self.params.contains(HOST_PARAMS_KEY) {
            return HostSettings::default();
        }
        serde_json::from_str::<Outer>(&self.params).map(|o| o.host).unwrap_or_default()
    }

    /// The model with this id, if there is one.
    pub fn model(&self, id: u32) -> Option<&Model> {
        self.models.get(usize::try_from(id).ok()?)
    }

    /// The model with this name, if there is one.
    pub fn model_named(&self, name: &str) -> Option<&Model> {
        self.models.iter().find(|m| m.name == name)
    }

    /// The model names, comma-separated, for error messages listing valid choices.
    pub fn model_names(&self) -> String {
        let names: Vec<&str> = self.models.iter().map(|m| m.name.as_str()).collect();
        names.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> Model {
        Model { id: 0, name: "m".into(), accuracy: 0.7, latency: vec![10, 15, 18] }
    }

    #[test]
    fn latency_is_indexed_by_batch_size() {
        let m = model();
        assert_eq!(m.max_batch(), 3);
        assert_eq!(m.latency(0), None);
        assert_eq!(m.latency(1), Some(10));
        assert_eq!(m.latency(3), Some(18));
        assert_eq!(m.latency(4), None);
    }

    #[test]
    fn serve_head_takes_the_first_entries() {
        assert_eq!(Decision::serve_head(2, 0), Decision::Idle);
        let d = Decision::serve_head(2, 3);
        let dispatch = d.as_dispatch().expect("a dispatch");
        assert_eq!(dispatch.model, 2);
        assert_eq!(dispatch.take, vec![0, 1, 2]);
        assert!(dispatch.drop.is_empty());
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(default, deny_unknown_fields)]
    struct Params {
        headroom: f64,
        model: Option<String>,
    }

    impl Default for Params {
        fn default() -> Self {
            Params { headroom: 1.05, model: None }
        }
    }

    fn config(params: &str) -> Config {
        Config { app: "a".into(), slo: 100, workers: 1, worker: 0, models: vec![model()], params: params.into() }
    }

    #[test]
    fn empty_params_give_defaults() {
        for text in ["", "  ", "{}"] {
            let p: Params = config(text).params().expect("defaults");
            assert_eq!(p, Params::default(), "params {text:?}");
        }
        let p: Params = config(r#"{"model":"m"}"#).params().expect("parsed");
        assert_eq!(p.model.as_deref(), Some("m"));
        assert_eq!(p.headroom, 1.05);
    }

    #[test]
    fn host_settings_ride_in_params_without_bothering_the_policys_own() {
        #[derive(serde::Deserialize, Debug, PartialEq)]
        #[serde(deny_unknown_fields)]
        struct Own {
            model: String,
        }
        let mut c = Config {
            app: "a".into(),
            slo: 1,
            workers: 1,
            worker: 0,
            models: Vec::new(),
            params: r#"{"model":"m","sluice":{"max_batch_wait_us":5000}}"#.into(),
        };
        assert_eq!(c.params::<Own>().unwrap(), Own { model: "m".into() });
        assert_eq!(c.host_settings(), HostSettings { max_batch_wait_us: 5000 });
        c.params = r#"{"model":"m"}"#.into();
        assert_eq!(c.params::<Own>().unwrap(), Own { model: "m".into() });
        assert_eq!(c.host_settings(), HostSettings::default());
        // The policy's own errors are still reported.
        c.params = r#"{"modle":"m","sluice":{}}"#.into();
        assert!(c.params::<Own>().unwrap_err().contains("modle"));
    }

    #[test]
    fn params_errors_name_the_problem() {
        let err = config(r#"{"hedroom": 2}"#).params::<Params>().unwrap_err();
        assert!(err.contains("hedroom"), "{err}");
        let err = config(r#"{"headroom": "x"}"#).params::<Params>().unwrap_err();
        assert!(err.contains("invalid type"), "{err}");
    }

    #[test]
    fn models_are_found_by_id_and_name() {
        let c = config("");
        assert_eq!(c.model(0).map(|m| m.name.as_str()), Some("m"));
        assert!(c.model(1).is_none());
        assert_eq!(c.model_named("m").map(|m| m.id), Some(0));
        assert!(c.model_named("x").is_none());
        assert_eq!(c.model_names(), "m");
    }
}
