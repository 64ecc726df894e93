//! The server configuration: apps, their models, workers, router, policy and executor.
//!
//! Parsing is strict (`deny_unknown_fields`) and every error names the file, the
//! field and what was expected. Relative paths are resolved against the directory
//! of the config file (the current directory for the embedded default).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use thiserror::Error;

use crate::profile::Percentile;

/// The embedded default: app `imagenet`, the light ImageNet family on the onnx
/// executor, served on 127.0.0.1:8080.
pub const DEFAULT_CONFIG: &str = include_str!("default.toml");

/// Why a configuration could not be used.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{file}: cannot read: {source}")]
    Read {
        /// The config file.
        file: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// TOML syntax, a missing field, a wrong type or an unknown field.
    #[error("{file}: {message}")]
    Parse {
        /// The config file.
        file: String,
        /// toml's message, which names the line and the field.
        message: String,
    },
    /// A semantically invalid value.
    #[error("{file}: {field}: {message}")]
    Invalid {
        /// The config file.
        file: String,
        /// Dotted path of the offending field (`app.imagenet.workers`).
        field: String,
        /// What was expected.
        message: String,
    },
}

/// The whole server configuration.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `listen = "127.0.0.1:8080"`: address of the HTTP server (`--listen` overrides).
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// `admin_token = "..."`: bearer token for `/admin`; `SLUICE_ADMIN_TOKEN` overrides.
    /// Without either, the admin API answers 403 to everything.
    #[serde(default)]
    pub admin_token: Option<String>,
    /// `policy_dir = "var/policies"`: where uploaded policies are kept across restarts.
    #[serde(default = "default_policy_dir")]
    pub policy_dir: PathBuf,
    /// `builtin_policy_dir = "target/policies"`: where `cargo xtask policies` puts the
    /// built-in components, loaded by name (`policy = "jellyfish"`).
    #[serde(default = "default_builtin_dir")]
    pub builtin_policy_dir: PathBuf,
    /// `onnxruntime = "/path/libonnxruntime.so.1.31.1"`: overrides the search for ONNX Runtime.
    #[serde(default)]
    pub onnxruntime: Option<PathBuf>,
    /// `max_body_bytes = 16777216`: larger request bodies get 413.
    #[serde(default = "default_max_body")]
    pub max_body_bytes: usize,
    /// `shutdown_grace_ms = 10000`: how long graceful shutdown waits for queues to drain.
    #[serde(default = "default_grace")]
    pub shutdown_grace_ms: u64,
    /// `[[app]]`: the served applications.
    #[serde(rename = "app")]
    pub apps: Vec<AppConfig>,
}

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
    /// `router = "round-robin"`: `round-robin`, `shortest-queue` or `shared`.
    #[serde(default)]
    pub router: RouterMode,
    /// `executor = "onnx"`: `onnx` or `emulated`.
    pub executor: ExecutorKind,
    /// `profile = "profiles/imagenet-light-cpu.toml"`: latency and accuracy of the variants.
    pub profile: PathBuf,
    /// `latency_percentile = "p95"`: which profiled percentile policies see.
    #[serde(default = "default_percentile")]
    pub latency_percentile: Percentile,
    /// `models = ["squeezenet", "resnet50"]`: variants served (default: all in the profile).
    #[serde(default)]
    pub models: Option<Vec<String>>,
    /// `model_dir = "models/imagenet"`: where the onnx executor finds `<name>.onnx`.
    #[serde(default)]
    pub model_dir: Option<PathBuf>,
    /// `max_batch = 8`: cap on the batch size policies may use (default: profiled maximum).
    #[serde(default)]
    pub max_batch: Option<u32>,
    /// `max_queue = 1024`: requests queued for the app beyond this are refused with 429.
    #[serde(default = "default_max_queue")]
    pub max_queue: usize,
    /// `expire_after_ms = 300`: the host drops a request this long after its deadline
    /// whatever the policy says (default: one SLO), so no request waits forever.
    #[serde(default)]
    pub expire_after_ms: Option<f64>,
    /// `load_window_ms = 500`: window of the arrival-rate estimate given to policies.
    #[serde(default = "default_load_window")]
    pub load_window_ms: u64,
    /// `policy = "jellyfish"`: a built-in or uploaded policy name.
    pub policy: String,
    /// `params = { model = "resnet50" }`: policy parameters, handed over as JSON.
    #[serde(default)]
    pub params: Option<toml::Table>,
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
    /// `init_budget_ms = 60000`: epoch deadline of `init` (policy generation may be slow).
    #[serde(default = "default_init_budget")]
    pub init_budget_ms: u64,
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

/// How an app's arrivals are spread over its workers.
#[derive(Clone, Copy, Debug, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum RouterMode {
    /// Worker `i mod K` gets the i-th request (RAMSIS's load balancer).
    #[default]
    RoundRobin,
    /// The worker with the fewest queued requests (RAMSIS Appendix I).
    ShortestQueue,
    /// One FIFO shared by all workers; idle workers pull (Jellyfish+).
    Shared,
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

fn default_listen() -> SocketAddr {
    "127.0.0.1:8080".parse().expect("valid literal")
}
fn default_policy_dir() -> PathBuf {
    PathBuf::from("var/policies")
}
fn default_builtin_dir() -> PathBuf {
    PathBuf::from("target/policies")
}
fn default_max_body() -> usize {
    16 << 20
}
fn default_grace() -> u64 {
    10_000
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
    10
}
fn default_decide_budget() -> u64 {
    10
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

impl Config {
    /// Reads and validates a config file; relative paths are resolved against its directory.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { file: file.clone(), source })?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Config::parse(&text, &file, &base)
    }

    /// The embedded default configuration, paths relative to the current directory.
    pub fn embedded_default() -> Result<Config, ConfigError> {
        Config::parse(DEFAULT_CONFIG, "<embedded default config>", Path::new(""))
    }

    /// Parses and validates config text; `file` names it in errors, `base` anchors relative paths.
    pub fn parse(text: &str, file: &str, base: &Path) -> Result<Config, ConfigError> {
        let mut config: Config =
            toml::from_str(text).map_err(|e| ConfigError::Parse { file: file.to_string(), message: e.to_string() })?;
        let rebase = |p: &mut PathBuf| {
            if p.is_relative() && !base.as_os_str().is_empty() {
                *p = base.join(&*p);
            }
        };
        rebase(&mut config.policy_dir);
        rebase(&mut config.builtin_policy_dir);
        if let Some(p) = config.onnxruntime.as_mut() {
            rebase(p);
        }
        for app in &mut config.apps {
            rebase(&mut app.profile);
            if let Some(d) = app.model_dir.as_mut() {
                rebase(d);
            }
        }
        config.validate(file)?;
        Ok(config)
    }

    fn validate(&self, file: &str) -> Result<(), ConfigError> {
        let invalid = |field: String, message: &str| ConfigError::Invalid {
            file: file.to_string(),
            field,
            message: message.to_string(),
        };
        if self.apps.is_empty() {
            return Err(invalid("app".into(), "at least one [[app]] is required"));
        }
        let mut seen = BTreeMap::new();
        for app in &self.apps {
            let at = |f: &str| format!("app.{}.{f}", app.name);
            if !valid_name(&app.name) {
                return Err(invalid(
                    "app.name".into(),
                    &format!("`{}`: expected 1-64 characters of a-z, A-Z, 0-9, '-', '_', '.'", app.name),
                ));
            }
            if seen.insert(app.name.clone(), ()).is_some() {
                return Err(invalid(at("name"), "duplicate app name"));
            }
            if !(app.slo_ms.is_finite() && app.slo_ms > 0.0) {
                return Err(invalid(at("slo_ms"), "expected a positive number of milliseconds"));
            }
            if app.workers == 0 || app.workers > 4096 {
                return Err(invalid(at("workers"), "expected 1 to 4096 workers"));
            }
            if app.max_queue == 0 {
                return Err(invalid(at("max_queue"), "expected at least 1"));
            }
            if app.max_batch == Some(0) {
                return Err(invalid(at("max_batch"), "expected at least 1"));
            }
            if app.decide_budget_ms == 0 || app.init_budget_ms == 0 {
                return Err(invalid(at("decide_budget_ms"), "budgets must be at least 1 ms"));
            }
            if app.memory_limit_mb == 0 {
                return Err(invalid(at("memory_limit_mb"), "expected at least 1 MiB"));
            }
            if app.load_window_ms == 0 {
                return Err(invalid(at("load_window_ms"), "expected at least 1 ms"));
            }
            if let Some(e) = app.expire_after_ms {
                if !(e.is_finite() && e >= 0.0) {
                    return Err(invalid(at("expire_after_ms"), "expected a non-negative number of milliseconds"));
                }
            }
            if app.executor == ExecutorKind::Onnx && app.model_dir.is_none() {
                return Err(invalid(at("model_dir"), "required for executor = \"onnx\""));
            }
            if let Some(input) = &app.input {
                if crate::tensor::DataType::from_oip(&input.datatype).is_none() {
                    return Err(invalid(at("input.datatype"), "expected FP32, FP64, INT32, INT64 or UINT8"));
                }
            }
            if let Some(models) = &app.models {
                if models.is_empty() {
                    return Err(invalid(at("models"), "expected at least one model name"));
                }
            }
        }
        Ok(())
    }
}

impl AppConfig {
    /// The policy parameters as a JSON object string (`{}` when none).
    pub fn params_json(&self) -> String {
        match &self.params {
            Some(table) => serde_json::to_string(table).unwrap_or_else(|_| "{}".into()),
            None => "{}".into(),
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

    const MINIMAL: &str = r#"
[[app]]
name = "a"
slo_ms = 100
workers = 2
executor = "emulated"
profile = "p.toml"
policy = "fixed"
params = { model = "m" }
"#;

    #[test]
    fn minimal_config_gets_defaults() {
        let c = Config::parse(MINIMAL, "t.toml", Path::new("/etc/sluice")).unwrap();
        assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
        let app = &c.apps[0];
        assert_eq!(app.router, RouterMode::RoundRobin);
        assert_eq!(app.profile, PathBuf::from("/etc/sluice/p.toml"));
        assert_eq!(app.params_json(), r#"{"model":"m"}"#);
    }

    #[test]
    fn errors_name_file_and_field() {
        let bad = MINIMAL.replace("workers = 2", "workers = 0");
        let e = Config::parse(&bad, "t.toml", Path::new("")).unwrap_err().to_string();
        assert_eq!(e, "t.toml: app.a.workers: expected 1 to 4096 workers");
        let unknown = MINIMAL.replace("workers = 2", "workers = 2\nwokers = 3");
        let e = Config::parse(&unknown, "t.toml", Path::new("")).unwrap_err().to_string();
        assert!(e.starts_with("t.toml: ") && e.contains("wokers"), "{e}");
        let missing = MINIMAL.replace("policy = \"fixed\"", "");
        let e = Config::parse(&missing, "t.toml", Path::new("")).unwrap_err().to_string();
        assert!(e.contains("missing field `policy`"), "{e}");
        let onnx = MINIMAL.replace("\"emulated\"", "\"onnx\"");
        let e = Config::parse(&onnx, "t.toml", Path::new("")).unwrap_err().to_string();
        assert!(e.contains("app.a.model_dir"), "{e}");
    }

    #[test]
    fn embedded_default_parses() {
        let c = Config::embedded_default().unwrap();
        assert_eq!(c.apps[0].name, "imagenet");
        assert_eq!(c.apps[0].executor, ExecutorKind::Onnx);
    }
}
