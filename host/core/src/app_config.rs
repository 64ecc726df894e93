//! The app vocabulary shared by the live server and the simulator: one served
//! application — its SLO, workers, router, profile, models, policy and limits.
//!
//! `sluice serve` reads it as `[[app]]` of a server config (`sluice_server::config`),
//! `sluice sim` as `[[app]]` of an experiment or from the server config an experiment
//! names: the same type, parsed strictly (`deny_unknown_fields`) in both. Fields one
//! side does not use are documented as such (`executor` for the simulator,
//! `arrivals` for the server).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use sluice_sdk as sdk;
use thiserror::Error;

use crate::profile::Percentile;
use crate::router::RouterMode;
use crate::runtime::Limits;
use crate::tensor::DataType;
use crate::workload::ArrivalSpec;

/// One application: a named endpoint with an SLO served by a family of model variants.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppConfig {
    /// `name = "imagenet"`: the app name in `/v2/models/{name}` and `/infer`.
    pub name: String,
    /// `slo_ms = 300`: latency SLO; a request's deadline is its arrival + SLO.
    pub slo_ms: f64,
    /// `workers = 2`: number of workers, each with its own policy instance.
    pub workers: u32,
    /// `router = "round-robin"`: `round-robin`, `shortest-queue`, `shared` or
    /// `weighted`.
    #[serde(default)]
    pub router: RouterMode,
    /// `weights = [2, 1, 1]`: with `router = "weighted"`, each worker's share of the
    /// arrivals (default: equal); `PUT /admin/apps/{app}/weights` changes them live.
    #[serde(default)]
    pub weights: Option<Vec<f64>>,
    /// `executor = "onnx"`: `onnx` or `emulated`. Required by `sluice serve`; the
    /// simulator ignores it (batches take their profiled latency).
    #[serde(default)]
    pub executor: Option<ExecutorKind>,
    /// `profile = "profiles/imagenet-light-cpu.toml"`: latency and accuracy of the variants.
    pub profile: PathBuf,
    /// `latency_percentile = "p95"`: which profiled percentile policies see.
    #[serde(default = "default_percentile")]
    pub latency_percentile: Percentile,
    /// `models = ["squeezenet", "resnet50"]`: variants served (default: all in the profile).
    #[serde(default)]
    pub models: Option<Vec<String>>,
    /// `mixed_families = true`: the app's variants may come from unrelated model
    /// families (the server config refuses that by default: an app serves one task).
    #[serde(default)]
    pub mixed_families: bool,
    /// `model_dir = "models/imagenet"`: where the onnx executor finds `<name>.onnx`.
    #[serde(default)]
    pub model_dir: Option<PathBuf>,
    /// `max_batch = 8`: cap on the batch size policies may use (default: profiled maximum).
    #[serde(default)]
    pub max_batch: Option<u32>,
    /// `max_queue = 1024`: requests queued for the app beyond this are refused with 429.
    #[serde(default = "default_max_queue")]
    pub max_queue: usize,
    /// `expire_after_ms = 300`: the host drops a queued request this long after its
    /// deadline whatever the policy says, so no request waits forever. The live
    /// host's default is 0 (a request still queued at its deadline is dropped, not
    /// served late: under overload, serving late requests is what collapses
    /// goodput); the simulator's is one SLO, as the papers' simulators count late
    /// answers.
    #[serde(default)]
    pub expire_after_ms: Option<f64>,
    /// Not a config key: set for a pipeline's task app when its early-drop mode
    /// drops at batch formation there (`early_drop_at = "batch"`): before each
    /// decision, a worker drops the queue's head while it would finish past its
    /// deadline even if it ran now (`DropReason::EarlyAtBatch`).
    #[serde(skip)]
    pub drop_late_at_batch: bool,
    /// `max_batch_wait_ms = 5`: how long a policy may hold the head of the queue
    /// waiting for a batch to fill when batching pays (Triton's `max_queue_delay`);
    /// handed to policies that honour it (`sdk::HostSettings`, e.g. `fixed`).
    /// Default 0: never wait for a batch.
    #[serde(default)]
    pub max_batch_wait_ms: f64,
    /// `admission_audit = 0.01`: the share, in [0, 1], of requests admission would
    /// refuse as overloaded that are admitted anyway, to check the refusal: each is
    /// counted as a false refusal when it is then served by its deadline (the admin
    /// view's `admission_audit`: `audited` and `met`).
    /// Default 0 (off): an audited request that misses its deadline is a late answer
    /// a refusal would have spared; 1 admits everything and measures every refusal,
    /// for a benchmark below capacity. Below 1 it samples: every k-th refusal for a
    /// share of 1/k, drawn once per request (one audited before its body is read
    /// is admitted at the queue as that same audit), so the false refusals are
    /// estimated as `rejected-overload × met / audited` while the sample barely
    /// changes the load it measures.
    #[serde(default)]
    pub admission_audit: f64,
    /// `load_window_ms = 500`: window of the arrival-rate estimate given to policies.
    #[serde(default = "default_load_window")]
    pub load_window_ms: u64,
    /// `policy = "jellyfish"`: a built-in or uploaded policy name.
    pub policy: String,
    /// `params = { model = "resnet50" }`: policy parameters, handed over as JSON.
    #[serde(default)]
    pub params: Option<toml::Table>,
    /// `params_file = "ramsis-image-{workers}.json"`: a JSON object of policy
    /// parameters (e.g. `sluice ramsis gen --load-grid --out`), relative to the file
    /// that names it; `params` entries override its keys; `{workers}` is replaced by
    /// the app's worker count (RAMSIS tables depend on it).
    #[serde(default)]
    pub params_file: Option<PathBuf>,
    /// `fail_mode = "fallback"`: after a policy fault, `fallback` answers with the
    /// safe policy and keeps the component; `unbind` also unbinds it after
    /// `unbind_after` faults.
    #[serde(default)]
    pub fail_mode: FailMode,
    /// `unbind_after = 10`: faults before an `unbind` policy is replaced by the safe one.
    #[serde(default = "default_unbind_after")]
    pub unbind_after: u64,
    /// `decide_budget_ms = 10`: epoch deadline of one `decide`/`observe` call.
    #[serde(default = "default_decide_budget")]
    pub decide_budget_ms: u64,
    /// `init_budget_ms = 60000`: epoch deadline of `init` (a policy may build its
    /// tables there, RAMSIS its MDP, which may be slow).
    #[serde(default = "default_init_budget")]
    pub init_budget_ms: u64,
    /// `reinit_budget_ms = 1000`: epoch deadline of `init` when an instance is re-made
    /// after a fault, on a thread of its own while the safe policy decides.
    #[serde(default = "default_reinit_budget")]
    pub reinit_budget_ms: u64,
    /// `memory_limit_mb = 64`: linear-memory cap of one policy instance.
    #[serde(default = "default_memory_mb")]
    pub memory_limit_mb: u64,
    /// `intra_threads = 1`: ONNX Runtime intra-op threads per session.
    #[serde(default = "default_threads")]
    pub intra_threads: usize,
    /// `cuda = false`: ask for the CUDA execution provider (falls back to CPU, logged).
    #[serde(default)]
    pub cuda: bool,
    /// `[app.input]`: the input tensor a request carries (default: the first model's).
    #[serde(default)]
    pub input: Option<InputSpec>,
    /// `arrivals = { kind = "poisson", rate_qps = 400 }`: the load `sluice sim` offers
    /// this app when it runs the file; `sluice serve` ignores it.
    #[serde(default)]
    pub arrivals: Option<ArrivalSpec>,
}

/// The one input tensor of an app's requests, without the batch dimension.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct InputSpec {
    /// `name = "data_0"`.
    pub name: String,
    /// `datatype = "FP32"`.
    pub datatype: String,
    /// `shape = [3, 224, 224]` (no batch dimension).
    pub shape: Vec<usize>,
}

/// Which executor runs the batches.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum ExecutorKind {
    /// ONNX Runtime through `ort`.
    Onnx,
    /// Waits the profiled latency and returns a deterministic output.
    Emulated,
}

/// What happens after a policy faults.
#[derive(Clone, Copy, Debug, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum FailMode {
    /// Answer the faulting decision with the safe policy; keep the component.
    #[default]
    Fallback,
    /// As `fallback`, and after `unbind_after` faults bind the safe policy instead.
    Unbind,
}

/// `unbind_after` when a config leaves it out: what every app takes by default,
/// and the value a pipeline's task workers use in the simulator (its task apps
/// take the app defaults live).
pub const DEFAULT_UNBIND_AFTER: u64 = 10;

impl FailMode {
    /// Whether the policy that has just made its `faults`-th fault (counted per
    /// app) is replaced by the safe one: under `unbind` at `unbind_after` faults,
    /// under `fallback` never (each faulting decision is answered by the safe
    /// policy and the component kept). The one rule of the live host's apps and the
    /// simulator's pipeline task workers.
    pub fn unbinds(self, faults: u64, unbind_after: u64) -> bool {
        self == FailMode::Unbind && faults >= unbind_after
    }
}

fn default_percentile() -> Percentile {
    Percentile::P95
}
fn default_max_queue() -> usize {
    1024
}
fn default_load_window() -> u64 {
    500
}
fn default_unbind_after() -> u64 {
    DEFAULT_UNBIND_AFTER
}
fn default_decide_budget() -> u64 {
    10
}
fn default_reinit_budget() -> u64 {
    1000
}
fn default_init_budget() -> u64 {
    60_000
}
fn default_memory_mb() -> u64 {
    64
}
fn default_threads() -> usize {
    1
}

/// An app field with a value that cannot be used.
#[derive(Debug, Error, PartialEq)]
#[error("{field}: {message}")]
pub struct InvalidField {
    /// Dotted path of the offending field (`app.imagenet.workers`).
    pub field: String,
    /// What was expected.
    pub message: String,
}

/// `params_file` could not be used.
#[derive(Debug, Error)]
pub enum ParamsError {
    /// The file could not be read.
    #[error("params_file {path}: cannot read: {source}")]
    Read {
        /// The file, `{workers}` replaced.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not JSON.
    #[error("params_file {path}: not JSON: {source}")]
    NotJson {
        /// The file.
        path: String,
        /// serde_json's message, with line and column.
        source: serde_json::Error,
    },
    /// The file is JSON but not an object.
    #[error("params_file {path}: expected a JSON object")]
    NotObject {
        /// The file.
        path: String,
    },
}

impl AppConfig {
    /// An app with the fields a file must give, and every other at the default a
    /// file that leaves it out gets: what a pipeline's task apps are built from
    /// (`sluice_server::pipeline::task_app_config`), without a config file.
    pub fn new(name: String, slo_ms: f64, workers: u32, profile: PathBuf, policy: String) -> AppConfig {
        AppConfig {
            name,
            slo_ms,
            workers,
            router: RouterMode::default(),
            weights: None,
            executor: None,
            profile,
            latency_percentile: default_percentile(),
            models: None,
            mixed_families: false,
            model_dir: None,
            max_batch: None,
            max_queue: default_max_queue(),
            expire_after_ms: None,
            drop_late_at_batch: false,
            max_batch_wait_ms: 0.0,
            admission_audit: 0.0,
            load_window_ms: default_load_window(),
            policy,
            params: None,
            params_file: None,
            fail_mode: FailMode::default(),
            unbind_after: default_unbind_after(),
            decide_budget_ms: default_decide_budget(),
            init_budget_ms: default_init_budget(),
            reinit_budget_ms: default_reinit_budget(),
            memory_limit_mb: default_memory_mb(),
            intra_threads: default_threads(),
            cuda: false,
            input: None,
            arrivals: None,
        }
    }

    /// The SLO in µs.
    pub fn slo_us(&self) -> u64 {
        (self.slo_ms * 1000.0).round() as u64
    }

    /// How long past its deadline the live host keeps a queued request before
    /// dropping it, µs (default 0: at its deadline). A what-if replay of a live app
    /// uses this too, so it replays the rule the host ran.
    pub fn expire_us(&self) -> u64 {
        self.expire_us_or(0)
    }

    /// `expire_after_ms` in µs, rounded to the nearest (2.3 ms is 2,300 µs, not the
    /// 2,299 a truncation of 2.3 × 1000 gives), or `default_us` when it is not set:
    /// the one conversion the live host and the simulator share; only the default
    /// differs (0 live, one SLO in an experiment, see `expire_after_ms`).
    pub fn expire_us_or(&self, default_us: u64) -> u64 {
        self.expire_after_ms.map_or(default_us, |e| (e * 1000.0).round() as u64)
    }

    /// The policy parameters as a JSON object string: `params_file` (if any, read
    /// relative to `base`) overlaid with `params`; `{}` when neither is given.
    pub fn params_json(&self, base: &Path) -> Result<String, ParamsError> {
        let mut obj = match &self.params_file {
            Some(f) => {
                let path = base.join(f.to_string_lossy().replace("{workers}", &self.workers.to_string()));
                let shown = path.display().to_string();
                let text = std::fs::read_to_string(&path)
                    .map_err(|source| ParamsError::Read { path: shown.clone(), source })?;
                if self.params.is_none() {
                    // Nothing to overlay: hand the file over as it is (RAMSIS grids
                    // run to megabytes), once checked to be a JSON object.
                    if !text.trim_start().starts_with('{') {
                        return Err(ParamsError::NotObject { path: shown });
                    }
                    serde_json::from_str::<serde::de::IgnoredAny>(&text)
                        .map_err(|source| ParamsError::NotJson { path: shown, source })?;
                    return Ok(text);
                }
                match serde_json::from_str::<serde_json::Value>(&text)
                    .map_err(|source| ParamsError::NotJson { path: shown.clone(), source })?
                {
                    serde_json::Value::Object(m) => m,
                    _ => return Err(ParamsError::NotObject { path: shown }),
                }
            }
            None => serde_json::Map::new(),
        };
        if let Some(t) = &self.params {
            if let Ok(serde_json::Value::Object(m)) = serde_json::to_value(t) {
                obj.extend(m);
            }
        }
        Ok(serde_json::Value::Object(obj).to_string())
    }

    /// The limits of the app's policy instances.
    pub fn limits(&self) -> Limits {
        Limits {
            call_budget: Duration::from_millis(self.decide_budget_ms),
            init_budget: Duration::from_millis(self.init_budget_ms),
            reinit_budget: Duration::from_millis(self.reinit_budget_ms),
            // Only the live host asks for limits from a config; its workers must not
            // wait for a policy's `init` (the simulator sets its own limits).
            background_reinit: true,
            memory_bytes: (self.memory_limit_mb as usize) << 20,
            clock: crate::runtime::BudgetClock::Wall,
        }
    }

    /// The `config` record the app's policy instances are initialised with (`worker`
    /// is set per instance, see [`crate::runtime::Binding`]).
    ///
    /// The host's settings for policies that honour them (`sdk::HostSettings`) go
    /// into `params` under `sdk::HOST_PARAMS_KEY` when any differs from its default,
    /// so the contract stays as it is and params without them are passed untouched.
    pub fn policy_config(&self, models: &[sdk::Model], params: &str) -> sdk::Config {
        let host = sdk::HostSettings { max_batch_wait_us: (self.max_batch_wait_ms * 1000.0).round() as u64 };
        let mut params = params.to_string();
        if host != sdk::HostSettings::default() {
            if let Ok(serde_json::Value::Object(mut o)) = serde_json::from_str(&params) {
                o.insert(sdk::HOST_PARAMS_KEY.into(), serde_json::json!(host));
                params = serde_json::Value::Object(o).to_string();
            }
        }
        sdk::Config {
            app: self.name.clone(),
            slo: self.slo_us(),
            workers: self.workers,
            worker: 0,
            models: models.to_vec(),
            params,
        }
    }

    /// Checks the values serde cannot: ranges, names, and fields that only make
    /// sense together. The server and the simulator both call it.
    pub fn validate(&self) -> Result<(), InvalidField> {
        let invalid = |f: &str, message: &str| InvalidField {
            field: format!("app.{}.{f}", self.name),
            message: message.to_string(),
        };
        if !valid_name(&self.name) {
            return Err(InvalidField {
                field: "app.name".into(),
                message: format!("`{}`: expected 1-64 characters of a-z, A-Z, 0-9, '-', '_', '.'", self.name),
            });
        }
        if !(self.slo_ms.is_finite() && self.slo_ms > 0.0) {
            return Err(invalid("slo_ms", "expected a positive number of milliseconds"));
        }
        if self.workers == 0 || self.workers > 4096 {
            return Err(invalid("workers", "expected 1 to 4096 workers"));
        }
        if self.max_queue == 0 {
            return Err(invalid("max_queue", "expected at least 1"));
        }
        if self.max_batch == Some(0) {
            return Err(invalid("max_batch", "expected at least 1"));
        }
        for (field, ms) in [
            ("decide_budget_ms", self.decide_budget_ms),
            ("init_budget_ms", self.init_budget_ms),
            ("reinit_budget_ms", self.reinit_budget_ms),
        ] {
            if ms == 0 {
                return Err(invalid(field, "budgets must be at least 1 ms"));
            }
        }
        if self.memory_limit_mb == 0 {
            return Err(invalid("memory_limit_mb", "expected at least 1 MiB"));
        }
        if self.load_window_ms == 0 {
            return Err(invalid("load_window_ms", "expected at least 1 ms"));
        }
        if let Some(e) = self.expire_after_ms {
            if !(e.is_finite() && e >= 0.0) {
                return Err(invalid("expire_after_ms", "expected a non-negative number of milliseconds"));
            }
        }
        if !(self.max_batch_wait_ms.is_finite()
            && self.max_batch_wait_ms >= 0.0
            && self.max_batch_wait_ms < self.slo_ms)
        {
            return Err(invalid("max_batch_wait_ms", "expected a non-negative number of milliseconds below slo_ms"));
        }
        if !(self.admission_audit.is_finite() && (0.0..=1.0).contains(&self.admission_audit)) {
            return Err(invalid("admission_audit", "expected a share in [0, 1]"));
        }
        if let Some(w) = &self.weights {
            if self.router != RouterMode::Weighted {
                return Err(invalid("weights", "only with router = \"weighted\""));
            }
            crate::router::check_weights(w, self.workers as usize).map_err(|e| invalid("weights", &e.to_string()))?;
        }
        if self.executor == Some(ExecutorKind::Onnx) && self.model_dir.is_none() {
            return Err(invalid("model_dir", "required for executor = \"onnx\""));
        }
        if let Some(input) = &self.input {
            if DataType::from_oip(&input.datatype).is_none() {
                return Err(invalid("input.datatype", "expected FP32, FP64, INT32, INT64 or UINT8"));
            }
        }
        if let Some(models) = &self.models {
            if models.is_empty() {
                return Err(invalid("models", "expected at least one model name"));
            }
            if let Some((i, m)) = models.iter().enumerate().find(|(i, m)| models[..*i].contains(m)) {
                return Err(invalid(&format!("models[{i}]"), &format!("`{m}` is listed twice")));
            }
        }
        Ok(())
    }

    /// Resolves the app's relative paths against `base` (the directory of the file
    /// that describes it); `params_file` keeps its `{workers}` placeholder.
    pub fn rebase(&mut self, base: &Path) {
        if base.as_os_str().is_empty() {
            return;
        }
        let rebase = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        rebase(&mut self.profile);
        for p in [self.model_dir.as_mut(), self.params_file.as_mut()].into_iter().flatten() {
            rebase(p);
        }
        if let Some(a) = self.arrivals.as_mut() {
            a.rebase(base);
        }
    }
}

/// Whether `name` is acceptable for an app or a policy: it becomes part of URLs and
/// file names, so it is kept to a safe alphabet.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(extra: &str) -> AppConfig {
        toml::from_str(&format!(
            "name = \"a\"\nslo_ms = 100\nworkers = 3\nprofile = \"p.toml\"\npolicy = \"x\"\n{extra}"
        ))
        .unwrap()
    }

    #[test]
    fn new_gives_every_field_a_file_leaves_out_its_default() {
        let built = AppConfig::new("a".into(), 100.0, 3, "p.toml".into(), "x".into());
        assert_eq!(format!("{built:?}"), format!("{:?}", app("")));
    }

    #[test]
    fn the_batching_window_reaches_policies_in_params() {
        let a = app("max_batch_wait_ms = 4.5");
        a.validate().unwrap();
        let c = a.policy_config(&[], r#"{"model":"m"}"#);
        assert_eq!(c.host_settings().max_batch_wait_us, 4500);
        assert_eq!(c.params::<serde_json::Value>().unwrap(), serde_json::json!({"model": "m"}));
        // Unset: params pass untouched (not even re-serialised).
        assert_eq!(app("").policy_config(&[], r#"{ "model": "m" }"#).params, r#"{ "model": "m" }"#);
        let e = app("max_batch_wait_ms = 100").validate().unwrap_err().to_string();
        assert!(e.contains("max_batch_wait_ms") && e.contains("below slo_ms"), "{e}");
    }

    #[test]
    fn params_file_is_read_per_worker_count_and_overlaid() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("grid-3.json"), r#"{"table": [1, 2], "headroom": 1.0}"#).unwrap();
        let a = app("params_file = \"grid-{workers}.json\"");
        // Nothing to overlay: the file as it is.
        assert_eq!(a.params_json(dir.path()).unwrap(), r#"{"table": [1, 2], "headroom": 1.0}"#);
        let a = app("params_file = \"grid-{workers}.json\"\nparams = { headroom = 1.5 }");
        assert_eq!(a.params_json(dir.path()).unwrap(), r#"{"headroom":1.5,"table":[1,2]}"#);
        assert_eq!(app("").params_json(dir.path()).unwrap(), "{}");
    }

    #[test]
    fn params_file_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("list.json"), "[1]").unwrap();
        std::fs::write(dir.path().join("bad.json"), "{ nope").unwrap();
        let e = app("params_file = \"missing.json\"").params_json(dir.path()).unwrap_err().to_string();
        assert!(e.starts_with("params_file ") && e.contains("missing.json: cannot read"), "{e}");
        let e = app("params_file = \"list.json\"").params_json(dir.path()).unwrap_err().to_string();
        assert!(e.ends_with("list.json: expected a JSON object"), "{e}");
        let e = app("params_file = \"bad.json\"").params_json(dir.path()).unwrap_err().to_string();
        assert!(e.contains("bad.json: not JSON"), "{e}");
    }

    #[test]
    fn rebase_resolves_every_path_against_the_file() {
        let mut a =
            app("model_dir = \"m\"\nparams_file = \"g.json\"\narrivals = { kind = \"rate-trace\", file = \"t.txt\" }");
        a.rebase(Path::new("/etc/sluice"));
        assert_eq!(a.profile, PathBuf::from("/etc/sluice/p.toml"));
        assert_eq!(a.model_dir, Some(PathBuf::from("/etc/sluice/m")));
        assert_eq!(a.params_file, Some(PathBuf::from("/etc/sluice/g.json")));
        assert_eq!(a.arrivals.unwrap().file(), Some(Path::new("/etc/sluice/t.txt")));
    }

    #[test]
    fn validate_names_the_field() {
        let e = app("max_batch = 0").validate().unwrap_err();
        assert_eq!(e.to_string(), "app.a.max_batch: expected at least 1");
        let e = app("executor = \"onnx\"").validate().unwrap_err();
        assert_eq!(e.field, "app.a.model_dir");
        assert!(app("executor = \"emulated\"").validate().is_ok());
        let e = app("weights = [1, 1, 1]").validate().unwrap_err();
        assert_eq!(e.to_string(), "app.a.weights: only with router = \"weighted\"");
        let e = app("router = \"weighted\"\nweights = [1, 1]").validate().unwrap_err();
        assert_eq!(e.to_string(), "app.a.weights: expected 3 weights (one per worker), got 2");
        assert!(app("router = \"weighted\"\nweights = [0, 1, 2]").validate().is_ok());
    }

    #[test]
    fn a_policy_is_unbound_at_unbind_after_faults_only_under_unbind() {
        let a = app("");
        assert_eq!((a.fail_mode, a.unbind_after), (FailMode::Fallback, DEFAULT_UNBIND_AFTER));
        assert!(!FailMode::Fallback.unbinds(100, DEFAULT_UNBIND_AFTER));
        assert!(!FailMode::Unbind.unbinds(9, 10));
        assert!(FailMode::Unbind.unbinds(10, 10));
        assert!(FailMode::Unbind.unbinds(11, 10));
        let a = app("fail_mode = \"unbind\"\nunbind_after = 3");
        assert!(a.fail_mode.unbinds(3, a.unbind_after) && !a.fail_mode.unbinds(2, a.unbind_after));
    }
}
